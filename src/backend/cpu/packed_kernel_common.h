// What the packed kernels of every instruction set share (packed_avx512.cpp, packed_kernels_avx2.cpp): the
// activation rows of a tile as they read them, the ROOFLINE_CPU_STREAMS setting, an unaligned 4-byte load, the
// fetch-ahead of the few-row K-quant loops, and the 6-bit scales and mins of the 16 rows of a packed Q4_K / Q5_K
// entry. Include it inside a kernel file's target region, after its other headers: everything here has internal linkage, so each file compiles its own copy for its own
// instruction set (no AVX2 or AVX-512 copy of a shared inline function can be the one the linker keeps).
// No include guard and no includes but fetch_ahead.h (the fetch-ahead rule): one inclusion per kernel file,
// which has <immintrin.h>, <cpuid.h>, <cstdint>, <cstdlib>, <cstring>, packed_weights.h and quant_blocks.h
// already.
#include "backend/cpu/fetch_ahead.h"

namespace roofline::cpu {
namespace {

// The one-row decode loops' stream count set by ROOFLINE_CPU_STREAMS (1, 2, 4 or 8; 0 when unset or anything else),
// read once per kernel file.
inline int streams_from_env() {
  static const int env = [] {
    const char* v = std::getenv("ROOFLINE_CPU_STREAMS");
    const int n = v ? std::atoi(v) : 0;
    return n == 1 || n == 2 || n == 4 || n == 8 ? n : 0;
  }();
  return env;
}

inline int32_t load32(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// The activation rows c0 .. c0 + NA - 1 of a tile (Q8_0): their blocks, float scales and level sums.
template <int NA>
struct Rows {
  const BlockQ8_0* q[NA];
  const float* d[NA];
  const int32_t* sum[NA];
  Rows(const PackedActs& a, int c0) {
    for (int j = 0; j < NA; ++j) {
      q[j] = reinterpret_cast<const BlockQ8_0*>(a.rows + (size_t)(c0 + j) * a.row_stride);
      d[j] = a.scales + (size_t)(c0 + j) * a.blocks_per_row;
      sum[j] = a.sums + (size_t)(c0 + j) * a.blocks_per_row;
    }
  }
};

// The activation rows c0 .. c0 + NA - 1 of a K-quant tile (Q8_K): blocks and sub-block sums.
template <int NA>
struct RowsK {
  const BlockQ8_K* q[NA];
  const KSums* sums[NA];
  RowsK(const PackedActs& a, int c0) {
    for (int j = 0; j < NA; ++j) {
      q[j] = reinterpret_cast<const BlockQ8_K*>(a.rows + (size_t)(c0 + j) * a.row_stride);
      sums[j] = a.k_sums + (size_t)(c0 + j) * a.blocks_per_row;
    }
  }
};

// The 6-bit scales and mins of a packed Q4_K / Q5_K entry's 16 rows (the transposed scale bytes of
// packed_weights.h: byte k of row i at 16k + i), decoded as unpack_k4_scale_min does per row, with 128-bit
// integer ops: sc[k] and mn[k] hold sub-block k's scale and min of row i in byte i.
inline void decode_k4_scales(const uint8_t* scale_bytes, __m128i sc[8], __m128i mn[8]) {
  const __m128i m63 = _mm_set1_epi8(63), m15 = _mm_set1_epi8(15), m3 = _mm_set1_epi8(3);
  __m128i B[12];
  for (int k = 0; k < 12; ++k) B[k] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(scale_bytes + 16 * k));
  for (int k = 0; k < 4; ++k) {
    sc[k] = _mm_and_si128(B[k], m63);
    mn[k] = _mm_and_si128(B[k + 4], m63);
  }
  for (int k = 4; k < 8; ++k) {
    sc[k] = _mm_or_si128(_mm_and_si128(B[k + 4], m15), _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(B[k - 4], 6), m3), 4));
    mn[k] = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(B[k + 4], 4), m15), _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(B[k], 6), m3), 4));
  }
}

}  // namespace
}  // namespace roofline::cpu
