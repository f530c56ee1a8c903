// Run-time loading of NCCL (nccl.h): dlopen the first library that binds, from ROOFLINE_NCCL_LIB, the
// loader's path or the Python wheel's folder.
#include "backend/nccl.h"

#include <dlfcn.h>
#include <glob.h>

#include <cstdlib>
#include <mutex>

#include "core/error.h"

namespace roofline::nccl {
namespace {

template <typename F>
void bind(void* handle, const char* name, F& out, const std::string& path) {
  void* sym = dlsym(handle, name);
  if (!sym) fail("{} is not a usable NCCL library: it has no {}", path, name);
  out = reinterpret_cast<F>(sym);
}

std::vector<std::string> glob_paths(const std::string& pattern) {
  std::vector<std::string> out;
  glob_t g{};
  if (glob(pattern.c_str(), 0, nullptr, &g) == 0)
    for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  globfree(&g);
  return out;
}

}  // namespace

std::vector<std::string> candidate_paths() {
  if (const char* lib = std::getenv("ROOFLINE_NCCL_LIB"); lib && *lib) return {lib};
  std::vector<std::string> out = {"libnccl.so.2", "libnccl.so"};
  std::vector<std::string> roots = {"/usr/local/lib/python3*/dist-packages", "/usr/lib/python3*/dist-packages",
                                    "/usr/local/lib/python3*/site-packages", "/usr/lib/python3*/site-packages"};
  if (const char* home = std::getenv("HOME"); home && *home) roots.push_back(std::string(home) + "/.local/lib/python3*/site-packages");
  if (const char* venv = std::getenv("VIRTUAL_ENV"); venv && *venv) roots.insert(roots.begin(), std::string(venv) + "/lib/python3*/site-packages");
  for (const std::string& root : roots)
    for (const std::string& p : glob_paths(root + "/nvidia/nccl/lib/libnccl.so*")) out.push_back(p);
  return out;
}

Api load(const std::string& path) {
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* why = dlerror();
    fail("cannot load NCCL from {}: {}", path, why ? why : "unknown error");
  }
  Api a;
  a.path = path;
  try {
    bind(handle, "ncclGetVersion", a.get_version, path);
    bind(handle, "ncclGetUniqueId", a.get_unique_id, path);
    bind(handle, "ncclCommInitAll", a.comm_init_all, path);
    bind(handle, "ncclCommDestroy", a.comm_destroy, path);
    bind(handle, "ncclAllReduce", a.all_reduce, path);
    bind(handle, "ncclGroupStart", a.group_start, path);
    bind(handle, "ncclGroupEnd", a.group_end, path);
    bind(handle, "ncclGetErrorString", a.error_string, path);
    check(a, a.get_version(&a.version), "ncclGetVersion");
  } catch (...) {
    dlclose(handle);
    throw;
  }
  // A library that bound stays loaded for the process: communicators may outlive any one caller.
  return a;
}

const Api& api() {
  static std::once_flag once;
  static Api loaded;
  static std::string error;
  std::call_once(once, [] {
    const std::vector<std::string> paths = candidate_paths();
    std::string first_error;
    for (const std::string& p : paths) {
      try {
        loaded = load(p);
        return;
      } catch (const Error& e) {
        if (first_error.empty()) first_error = e.what();
      }
    }
    std::string tried;
    for (const std::string& p : paths) tried += (tried.empty() ? "" : ", ") + p;
    error = fmt::format("NCCL is needed for -sm row and was not found (tried {}; first error: {}); set ROOFLINE_NCCL_LIB to libnccl.so.2",
                        tried, first_error);
  });
  if (!error.empty()) throw Error(error);
  return loaded;
}

void check(const Api& nccl, int result, const char* what) {
  if (result == kSuccess) return;
  const char* text = nccl.error_string ? nccl.error_string(result) : nullptr;
  fail("{} failed: NCCL error {} ({})", what, result, text ? text : "no description");
}

}  // namespace roofline::nccl
