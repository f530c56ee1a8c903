// AVX-512 VNNI kernels over packed weights (layout in packed_weights.h): Q4_0 and Q8_0 in groups of 16
// interleaved rows. Per block, group and activation row: 8 vpdpbusd (unsigned weight levels x the same 4
// signed activation values broadcast to all lanes, 16 rows x 4 values each), one int32 add, one
// conversion, one scale product and one FMA, for 16 outputs; the weight levels of a block are loaded
// (and for Q4_0 split into nibbles) once and used for up to 8 activation rows. The level offset (8 for
// Q4_0, 128 for Q8_0) comes out through the activation block sum: sum (u - C) a = sum u a - C sum a, so
// the int32 accumulator starts at -C * sum a. Integer work is exact; the float steps per output are the
// same for any number of activation rows (batch invariance). Compiled through a target pragma, called
// only after avx512_supported().
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "backend/cpu/packed_weights.h"
#include "formats/quant_blocks.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c"))), \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")
// GCC 12's reduce/insert intrinsics pass a self-initialized "undefined" vector that its own warnings flag.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace roofline::cpu {
namespace {

constexpr int kMaxNA = 8;

inline int32_t load32(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// The activation rows c0 .. c0 + NA - 1 of a tile: their Q8_0 blocks, float scales and level sums.
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

// One group of 16 weight rows times NA activation rows over nb blocks; acc[j] holds the 16 outputs of
// activation row j.
template <int NA, bool Q4>
void group_dot(const uint8_t* group, int64_t nb, const Rows<NA>& A, __m512* acc) {
  constexpr size_t kEntry = Q4 ? 2 * kPackRows + 4 * 64 : 2 * kPackRows + 8 * 64;
  constexpr int32_t kOffset = Q4 ? 8 : 128;
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  for (int j = 0; j < NA; ++j) acc[j] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* e = group + (size_t)b * kEntry;
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(e)));
    const uint8_t* lv = e + 2 * kPackRows;
    __m512i w[8];  // w[k]: the levels of elements 4k .. 4k + 3 of each row
    if constexpr (Q4) {
      for (int k = 0; k < 4; ++k) {
        const __m512i v = _mm512_loadu_si512(lv + 64 * k);
        w[k] = _mm512_and_si512(v, low4);
        w[k + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
      }
    } else {
      for (int k = 0; k < 8; ++k) w[k] = _mm512_loadu_si512(lv + 64 * k);
    }
    for (int j = 0; j < NA; ++j) {
      const int8_t* q = A.q[j][b].qs;
      __m512i s0 = _mm512_set1_epi32(-kOffset * A.sum[j][b]);
      __m512i s1 = _mm512_setzero_si512();
      for (int k = 0; k < 8; k += 2) {
        s0 = _mm512_dpbusd_epi32(s0, w[k], _mm512_set1_epi32(load32(q + 4 * k)));
        s1 = _mm512_dpbusd_epi32(s1, w[k + 1], _mm512_set1_epi32(load32(q + 4 * k + 4)));
      }
      const __m512 scale = _mm512_mul_ps(dw, _mm512_set1_ps(A.d[j][b]));
      acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1)), scale, acc[j]);
    }
  }
}

template <int NA, bool Q4>
void group_rows(const uint8_t* group, int64_t nb, const PackedActs& a, int c0, float* y, size_t ldy, __mmask16 keep) {
  const Rows<NA> A(a, c0);
  __m512 acc[NA];
  group_dot<NA, Q4>(group, nb, A, acc);
  for (int j = 0; j < NA; ++j) _mm512_mask_storeu_ps(y + (size_t)j * ldy, keep, acc[j]);
}

template <bool Q4>
void packed_tile(const uint8_t* packed, size_t group_bytes, int n_w, const PackedActs& a, int c0, int n_a, int64_t n,
                 float* y, size_t ldy) {
  using Fn = void (*)(const uint8_t*, int64_t, const PackedActs&, int, float*, size_t, __mmask16);
  static constexpr Fn kFns[kMaxNA + 1] = {nullptr,           group_rows<1, Q4>, group_rows<2, Q4>,
                                          group_rows<3, Q4>, group_rows<4, Q4>, group_rows<5, Q4>,
                                          group_rows<6, Q4>, group_rows<7, Q4>, group_rows<8, Q4>};
  const int64_t nb = n / kQK;
  for (int g = 0; g * kPackRows < n_w; ++g) {
    const int rows = n_w - g * kPackRows < kPackRows ? n_w - g * kPackRows : kPackRows;
    const __mmask16 keep = (__mmask16)((1u << rows) - 1);
    const uint8_t* group = packed + (size_t)g * group_bytes;
    for (int c = 0; c < n_a; c += kMaxNA) {
      const int na = n_a - c < kMaxNA ? n_a - c : kMaxNA;
      kFns[na](group, nb, a, c0 + c, y + (size_t)c * ldy + (size_t)g * kPackRows, ldy, keep);
    }
  }
}

}  // namespace

namespace detail {
PackedTileFn avx512_packed_tile(DType type) {
  if (!avx512_supported()) return nullptr;
  switch (type) {
    case DType::Q4_0: return packed_tile<true>;
    case DType::Q8_0: return packed_tile<false>;
    default: return nullptr;
  }
}
}  // namespace detail
}  // namespace roofline::cpu

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC diagnostic pop
#pragma GCC pop_options
#endif

#else  // not x86-64 GCC/Clang

namespace roofline::cpu::detail {
PackedTileFn avx512_packed_tile(DType) { return nullptr; }
}  // namespace roofline::cpu::detail

#endif
