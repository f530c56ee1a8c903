// Opens a region of a .cpp file whose functions are compiled for AVX-512 F/BW/VL/DQ/VNNI (plus AVX2, FMA,
// F16C) through a target pragma, not global flags, so the rest of the program runs on any x86-64; close it
// with avx512_region_end.h. Include it after every other header: functions declared before it (the
// standard library's templates, other headers' inline functions) keep the default target, so no
// AVX-512 copy of a shared inline function can end up the one the linker keeps. The functions inside
// may run only after detail::avx512_supported(). Only on x86-64 GCC/Clang (check __x86_64__ and
// __GNUC__ around the region).
// No include guard: a file may open one region.
#include <immintrin.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c"))), \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")
// GCC 12's insert and reduce intrinsics pass a self-initialized "undefined" vector that its own warnings flag.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
