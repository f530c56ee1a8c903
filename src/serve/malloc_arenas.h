// glibc malloc gives every thread that allocates an arena of its own, up to 8 per core. The server has
// a thread per open connection (64 streams: ~70 threads), and each arena keeps the memory its thread
// freed, so on a 16-core host RSS crept up for minutes under a steady load (a soak at 64 streams on the
// CPU with glibc's 128 arenas of a 16-core host: 74 arenas holding 65 MiB for 14 MiB in use, still
// growing; docs/performance.md). The server caps the arenas once at start.
#pragma once

#include <string>

namespace roofline::serve {

constexpr int kServerMallocArenas = 8;

// Caps glibc's malloc arenas at `max_arenas` unless MALLOC_ARENA_MAX or a GLIBC_TUNABLES arena_max is set
// (those win). Call before the threads start. Returns what was done, for the log ("" when nothing).
std::string limit_malloc_arenas(int max_arenas = kServerMallocArenas);

// The malloc arenas in use now (glibc's malloc_info heaps; -1 when it cannot tell).
int count_malloc_arenas();

}  // namespace roofline::serve
