// The server's cap on glibc malloc arenas (see malloc_arenas.h).
#include "serve/malloc_arenas.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace roofline::serve {

std::string limit_malloc_arenas(int max_arenas) {
#if defined(__GLIBC__)
  if (std::getenv("MALLOC_ARENA_MAX")) return "";
  if (const char* t = std::getenv("GLIBC_TUNABLES"); t && std::strstr(t, "arena_max")) return "";
  if (max_arenas <= 0 || mallopt(M_ARENA_MAX, max_arenas) != 1) return "";
  return fmt::format("malloc: at most {} arenas (MALLOC_ARENA_MAX overrides)", max_arenas);
#else
  (void)max_arenas;
  return "";
#endif
}

int count_malloc_arenas() {
#if defined(__GLIBC__)
  char* buf = nullptr;
  size_t len = 0;
  FILE* f = open_memstream(&buf, &len);
  if (!f) return -1;
  const bool ok = malloc_info(0, f) == 0;
  std::fclose(f);
  int n = 0;
  for (const char* p = buf; ok && p && (p = std::strstr(p, "<heap nr=")); ++p) ++n;
  std::free(buf);
  return ok ? n : -1;
#else
  return -1;
#endif
}

}  // namespace roofline::serve
