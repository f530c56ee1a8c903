// AVX2 kernels over packed weights (layout in packed_weights.h) for Q4_0, Q8_0 and Q4_K, on CPUs without
// AVX-512 VNNI (Q5_K and Q6_K stay in their GGUF layout there: written this way, their one-row products
// streamed 25-30% slower than the in-place kernels, for 8-15% on prompts); one-row Q4_0 / Q8_0 products walk
// four groups side by side (groups_dot, rows_streams). The same
// groups of 16 interleaved rows, read as two halves of 8 rows (the 32 bytes of a 64-byte chunk that hold
// rows 8h .. 8h + 7), so one 256-bit register holds 4 values of each of 8 rows. Without VNNI the 4-value
// products are vpmaddubsw (unsigned weight levels x the same 4 signed activation values broadcast to every
// lane, int16 pairs) and vpmaddwd by ones (the pairs summed into int32); the int16 pair sums of several
// chunks are added first where they cannot overflow (a Q4 sub-block's 8 chunks). Q8_0's levels
// (stored as q + 128) become q again and multiply as |q| x (a with q's sign), which stays within int16 for
// every q, -128 included. Level offsets, scales and mins are those of the AVX-512 kernels
// (packed_avx512.cpp): the same integer sums, so both give the same values; the float steps per output
// are the same for any number of activation rows (batch invariance). Compiled through a target pragma
// after every include (no AVX2 copy of a shared inline function), called only after avx2_supported().
#include <cpuid.h>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "backend/cpu/packed_weights.h"
#include "formats/quant_blocks.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif
#include "backend/cpu/packed_kernel_common.h"

namespace roofline::cpu {
namespace {

constexpr int kMaxNA = 4;  // activation rows per pass (16 ymm registers)
// Streams of the one-row Q4_0 / Q8_0 decode loop by default (avx2_decode_streams): four, as the AVX-512 loop. With the
// AVX2 kernels (ROOFLINE_CPU_ISA=avx2), qwen3-1.7b tg32 against one stream: on the GPU machine's Intel host +30-36% at 4
// threads and +7% at 16 (two: +28-29% and +5-12%); on a Zen 5 core pair two gave Q4_0 +20% and Q8_0 +9% and four was level
// with two; eight is uneven (docs/performance.md).
constexpr int kDefaultDecodeStreams = 4;

// 8 rows' f16 values at p as floats.
inline __m256 f16x8(const uint8_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
// The 32 bytes of 64-byte chunk `chunk` that hold rows 8h .. 8h + 7.
inline __m256i half_chunk(const uint8_t* lv, int chunk, int h) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(lv + 64 * chunk + 32 * h));
}
inline __m256i bcast(const int8_t* q) { return _mm256_set1_epi32(load32(q)); }
inline __m256i pairs_to_i32(__m256i p16) { return _mm256_madd_epi16(p16, _mm256_set1_epi16(1)); }

// Bytes of one packed Q4_0 / Q8_0 entry (a block of each of the group's 16 rows).
template <bool Q4>
constexpr size_t entry_bytes() { return Q4 ? 2 * kPackRows + 4 * 64 : 2 * kPackRows + 8 * 64; }

// Q4_0 / Q8_0: entry b (at e) of rows 8h .. 8h + 7 of a group times NA activation rows, added to acc.
template <int NA, bool Q4>
inline void entry_half(const uint8_t* e, int64_t b, int h, const Rows<NA>& A, __m256* acc) {
  const __m256i low4 = _mm256_set1_epi8(0x0F), flip = _mm256_set1_epi8((char)0x80);
  const __m256 dw = f16x8(e + 16 * h);
  const uint8_t* lv = e + 2 * kPackRows;
  if constexpr (Q4) {
    __m256i w[8];  // w[k]: levels of elements 4k .. 4k + 3 of each row (0..15)
    for (int k = 0; k < 4; ++k) {
      const __m256i v = half_chunk(lv, k, h);
      w[k] = _mm256_and_si256(v, low4);
      w[k + 4] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
    }
    for (int j = 0; j < NA; ++j) {
      const int8_t* q = A.q[j][b].qs;
      __m256i p = _mm256_maddubs_epi16(w[0], bcast(q));  // 8 pair sums of at most 2 x 15 x 128 each
      for (int k = 1; k < 8; ++k) p = _mm256_add_epi16(p, _mm256_maddubs_epi16(w[k], bcast(q + 4 * k)));
      const __m256i s = _mm256_add_epi32(pairs_to_i32(p), _mm256_set1_epi32(-8 * A.sum[j][b]));
      acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dw, _mm256_set1_ps(A.d[j][b])), acc[j]);
    }
  } else {
    __m256i s[NA];
    for (int j = 0; j < NA; ++j) s[j] = _mm256_setzero_si256();
    for (int k = 0; k < 8; ++k) {
      const __m256i w = _mm256_xor_si256(half_chunk(lv, k, h), flip);  // q as int8
      const __m256i aw = _mm256_abs_epi8(w);                              // |q| as uint8 (128 for -128)
      for (int j = 0; j < NA; ++j) {
        const __m256i signed_a = _mm256_sign_epi8(bcast(A.q[j][b].qs + 4 * k), w);  // a with q's sign (|a| <= 127)
        s[j] = _mm256_add_epi32(s[j], pairs_to_i32(_mm256_maddubs_epi16(aw, signed_a)));
      }
    }
    for (int j = 0; j < NA; ++j)
      acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[j]), _mm256_mul_ps(dw, _mm256_set1_ps(A.d[j][b])), acc[j]);
  }
}

// Q4_0 / Q8_0: rows 8h .. 8h + 7 of a group times NA activation rows over nb blocks.
template <int NA, bool Q4>
void half_dot(const uint8_t* group, int64_t nb, int h, const Rows<NA>& A, __m256* acc) {
  for (int j = 0; j < NA; ++j) acc[j] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) entry_half<NA, Q4>(group + (size_t)b * entry_bytes<Q4>(), b, h, A, acc);
}

// Decode (one activation row): S whole groups walked side by side, entry b of each (both halves) in turn, so a
// thread keeps S memory streams going (as the AVX-512 loop does, packed_avx512.cpp). acc[2s + h] gets rows
// 8h .. 8h + 7 of group s, each by half_dot's arithmetic in its order: the same bits whatever S.
template <int S, bool Q4>
void groups_dot(const uint8_t* const* groups, int64_t nb, const Rows<1>& A, __m256* acc) {
  for (int i = 0; i < 2 * S; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b)
#pragma GCC unroll 8  // unrolled, so that the accumulators stay in registers (a rolled loop kept them on the stack: 25-35% slower at S = 4)
    for (int s = 0; s < S; ++s) {
      const uint8_t* e = groups[s] + (size_t)b * entry_bytes<Q4>();
      entry_half<1, Q4>(e, b, 0, A, acc + 2 * s);
      entry_half<1, Q4>(e, b, 1, A, acc + 2 * s + 1);
    }
}

// Q4_K. One or two activation rows: the first half's pass fetches ahead (kPrefetchAhead,
// packed_kernel_common.h); the second half's pass finds the group in the L2.
template <int NA>
void half_dot_q4_k(const uint8_t* group, int64_t nb, int h, const RowsK<NA>& A, __m256* acc) {
  constexpr size_t kScales = 4 * kPackRows, kLevels = kScales + kKScaleBytes * kPackRows;
  constexpr size_t kEntry = kLevels + 32 * 64;
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  for (int j = 0; j < NA; ++j) acc[j] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* e = group + (size_t)b * kEntry;
    if (NA <= 2 && h == 0) prefetch_entry<kEntry>(e + kPrefetchAhead, false);
    const __m256 d = f16x8(e + 16 * h);
    const __m256 dmin = f16x8(e + 2 * kPackRows + 16 * h);
    __m128i sc[8], mn[8];  // sub-block k's 6-bit scale and min of row i in byte i
    decode_k4_scales(e + kScales, sc, mn);
    __m256i isum[NA];  // the super-block's sum over sub-blocks of scale x level sum, exact (< 2^25)
    for (int j = 0; j < NA; ++j) isum[j] = _mm256_setzero_si256();
    const uint8_t* lv = e + kLevels;
    for (int k = 0; k < 8; ++k) {  // sub-block k: chunks 8 (k / 2) + t, low nibbles for even k
      const __m256i sc32 = _mm256_cvtepu8_epi32(h ? _mm_srli_si128(sc[k], 8) : sc[k]);
      __m256i p[NA];  // the 8 chunks' int16 pair sums (at most 8 x 2 x 15 x 128), then widened
      for (int t = 0; t < 8; ++t) {
        const __m256i v = half_chunk(lv, 8 * (k / 2) + t, h);
        const __m256i w = _mm256_and_si256(k % 2 ? _mm256_srli_epi16(v, 4) : v, low4);
        for (int j = 0; j < NA; ++j) {
          const __m256i m = _mm256_maddubs_epi16(w, bcast(A.q[j][b].qs + 32 * k + 4 * t));
          p[j] = t == 0 ? m : _mm256_add_epi16(p[j], m);
        }
      }
      __m256i s[NA];
      for (int j = 0; j < NA; ++j) s[j] = pairs_to_i32(p[j]);
      for (int j = 0; j < NA; ++j) isum[j] = _mm256_add_epi32(isum[j], _mm256_mullo_epi32(s[j], sc32));
    }
    // Mins as int16 pairs (m of sub-blocks 2p and 2p + 1 of each of this half's rows) against the activation's pairs of sums.
    __m256i mpair[4];
    for (int p = 0; p < 4; ++p) {
      const __m128i inter = h == 0 ? _mm_unpacklo_epi8(mn[2 * p], mn[2 * p + 1]) : _mm_unpackhi_epi8(mn[2 * p], mn[2 * p + 1]);
      mpair[p] = _mm256_cvtepu8_epi16(inter);
    }
    for (int j = 0; j < NA; ++j) {
      const int16_t* ss = A.sums[j][b].sub;
      __m256i mins = _mm256_setzero_si256();
      for (int p = 0; p < 4; ++p) mins = _mm256_add_epi32(mins, _mm256_madd_epi16(mpair[p], _mm256_set1_epi32(load32(ss + 2 * p))));
      const __m256 da = _mm256_set1_ps(A.q[j][b].d);
      acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[j]), _mm256_mul_ps(d, da), acc[j]);
      acc[j] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(mins), _mm256_mul_ps(dmin, da), acc[j]);
    }
  }
}

enum class Kind { Q4_0, Q8_0, Q4_K };

// Rows 8h .. min(8h + 8, rows) of a group (rows counted in the group) into y.
template <int NA, Kind K>
void half_rows(const uint8_t* group, int64_t nb, int h, int rows, const PackedActs& a, int c0, float* y, size_t ldy) {
  __m256 acc[NA];
  if constexpr (K == Kind::Q4_K) {
    half_dot_q4_k<NA>(group, nb, h, RowsK<NA>(a, c0), acc);
  } else {
    half_dot<NA, K == Kind::Q4_0>(group, nb, h, Rows<NA>(a, c0), acc);
  }
  const int n = rows - 8 * h < 8 ? rows - 8 * h : 8;
  for (int j = 0; j < NA; ++j) {
    if (n == 8) {
      _mm256_storeu_ps(y + (size_t)j * ldy + 8 * h, acc[j]);
    } else {
      alignas(32) float tmp[8];
      _mm256_store_ps(tmp, acc[j]);
      for (int r = 0; r < n; ++r) y[(size_t)j * ldy + 8 * h + r] = tmp[r];
    }
  }
}

// Streams of the one-row Q4_0 / Q8_0 decode loop: decode_streams_for_test, else ROOFLINE_CPU_STREAMS (1, 2, 4, 8), else
// kDefaultDecodeStreams. Q4_K keeps its two passes of one group (its first half's pass fetches ahead).
int avx2_decode_streams() {
  if (detail::decode_streams_for_test > 0) return detail::decode_streams_for_test;
  const int env = streams_from_env();
  return env > 0 ? env : kDefaultDecodeStreams;
}

// The range's whole groups against one activation row, cut in S contiguous parts walked side by side; the rest (fewer
// than S whole groups, a partial last group) a group at a time as the prompt path does.
template <int S, Kind K>
void rows_streams(const uint8_t* packed, size_t group_bytes, int n_w, const PackedActs& a, int c0, int64_t nb, float* y) {
  const int whole = n_w / kPackRows, len = whole / S;
  const Rows<1> A(a, c0);
  for (int i = 0; i < len; ++i) {
    const uint8_t* groups[S];
    for (int s = 0; s < S; ++s) groups[s] = packed + (size_t)(s * len + i) * group_bytes;
    __m256 acc[2 * S];
    groups_dot<S, K == Kind::Q4_0>(groups, nb, A, acc);
    for (int s = 0; s < S; ++s) {
      float* out = y + (size_t)(s * len + i) * kPackRows;
      _mm256_storeu_ps(out, acc[2 * s]);
      _mm256_storeu_ps(out + 8, acc[2 * s + 1]);
    }
  }
  for (int g = S * len; g * kPackRows < n_w; ++g) {
    const int rows = n_w - g * kPackRows < kPackRows ? n_w - g * kPackRows : kPackRows;
    for (int h = 0; 8 * h < rows; ++h) half_rows<1, K>(packed + (size_t)g * group_bytes, nb, h, rows, a, c0, y + (size_t)g * kPackRows, 0);
  }
}

template <Kind K>
void packed_tile(const uint8_t* packed, size_t group_bytes, int n_w, const PackedActs& a, int c0, int n_a, int64_t n,
                 float* y, size_t ldy) {
  using Fn = void (*)(const uint8_t*, int64_t, int, int, const PackedActs&, int, float*, size_t);
  static constexpr Fn kFns[kMaxNA + 1] = {nullptr, half_rows<1, K>, half_rows<2, K>, half_rows<3, K>, half_rows<4, K>};
  const int64_t nb = n / (K == Kind::Q4_0 || K == Kind::Q8_0 ? kQK : kQKK);
  if constexpr (K != Kind::Q4_K) {
    if (n_a == 1) {
      int streams = avx2_decode_streams();
      while (streams > 1 && n_w / kPackRows < streams) streams /= 2;
      if (streams > 1) {
        using StreamsFn = void (*)(const uint8_t*, size_t, int, const PackedActs&, int, int64_t, float*);
        static constexpr StreamsFn kStreams[3] = {rows_streams<2, K>, rows_streams<4, K>, rows_streams<8, K>};
        kStreams[streams == 2 ? 0 : streams == 4 ? 1 : 2](packed, group_bytes, n_w, a, c0, nb, y);
        return;
      }
    }
  }
  for (int g = 0; g * kPackRows < n_w; ++g) {
    const int rows = n_w - g * kPackRows < kPackRows ? n_w - g * kPackRows : kPackRows;
    const uint8_t* group = packed + (size_t)g * group_bytes;
    for (int h = 0; 8 * h < rows; ++h)
      for (int c = 0; c < n_a; c += kMaxNA) {
        const int na = n_a - c < kMaxNA ? n_a - c : kMaxNA;
        kFns[na](group, nb, h, rows, a, c0 + c, y + (size_t)c * ldy + (size_t)g * kPackRows, ldy);
      }
  }
}

}  // namespace

namespace detail {
PackedTileFn avx2_packed_tile(DType type) {
  if (!avx2_supported()) return nullptr;
  switch (type) {
    case DType::Q4_0: return packed_tile<Kind::Q4_0>;
    case DType::Q8_0: return packed_tile<Kind::Q8_0>;
    case DType::Q4_K: return packed_tile<Kind::Q4_K>;
    default: return nullptr;
  }
}
}  // namespace detail
}  // namespace roofline::cpu

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#else  // not x86-64 GCC/Clang

namespace roofline::cpu::detail {
PackedTileFn avx2_packed_tile(DType) { return nullptr; }
}  // namespace roofline::cpu::detail

#endif
