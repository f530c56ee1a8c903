// AVX2/FMA/F16C dot kernels (compiled with -mavx2 -mfma -mf16c; called only after avx2_supported()).
// Each kernel is one template over NA activation rows: a weight block is decoded once and multiplied
// with NA activation rows, and every output's operation sequence is the same for any NA, so the
// prefill tile and the single dot give identical bits. int8 products use maddubs (u8 x s8 pairs).
// No shared inline helpers (core/fp16.h, <algorithm>) here: an AVX2-compiled copy of an inline
// function could be the one the linker keeps for the scalar path too.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "backend/cpu/vec_dot.h"
#include "formats/quant_blocks.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <cpuid.h>
#include <immintrin.h>

#include <cmath>

#include "backend/cpu/fetch_ahead.h"
#include "backend/cpu/float_dot_common.h"

namespace roofline::cpu {
namespace {

using MultiFn = void (*)(const void* w, const void* const* a, int64_t n, float* out);
constexpr int kMaxNA = 4;

// ---- helpers ----

// f16, bf16 and hsum: float_dot_common.h.
// Round to nearest even, as core/fp16.h's f32_to_fp16 (equal for every finite input).
inline uint16_t to_f16(float f) { return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT); }

inline __m256i load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
inline __m128i load128(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }
inline __m256i bytes(int v) { return _mm256_set1_epi8((char)v); }

// 32 unsigned bytes times 32 signed bytes: 8 int32 sums of 4 adjacent products. No int16
// saturation while |u| * |s| <= 128 * 127 (every activation value is in [-127, 127]).
inline __m256i dot_us(__m256i u, __m256i s) { return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)); }

// 32 nibbles of a 16-byte block in element order: low nibbles (elements 0..15), then high ones.
inline __m256i nibbles32(const uint8_t* qs) {
  const __m128i q = load128(qs);
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), bytes(0x0F));
}

// 0xFF in byte e where bit e of `bits` is set.
inline __m256i spread_bits(uint32_t bits) {
  const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3,
                                        3, 3, 3, 3);
  const __m256i sel = _mm256_set1_epi64x((long long)0x8040201008040201ull);
  const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), shuf);
  return _mm256_cmpeq_epi8(_mm256_and_si256(v, sel), sel);
}

// Moves bit From of every byte to bit To (others cleared); shifts in 16-bit lanes never cross a byte.
template <int From, int To>
inline __m256i move_bit(__m256i v) {
  const __m256i b = _mm256_and_si256(v, bytes(1 << From));
  if constexpr (From < To) return _mm256_slli_epi16(b, To - From);
  else if constexpr (From > To) return _mm256_srli_epi16(b, From - To);
  else return b;
}

// Pins v in a register at this point. GCC otherwise re-associates a chain of integer adds into a tree
// over all of a super-block's products, keeping them all live and spilling them to the stack.
inline void pin(__m256i& v) { asm("" : "+x"(v)); }

inline __m256i iq4_lut() { return _mm256_broadcastsi128_si256(load128(kIQ4NLValues)); }

// Broadcast of int16 word k of a 16-byte group to all 16 lanes, from a register holding 8 words
// in each 128-bit lane.
template <int K>
inline __m256i word_bcast(__m256i v) {
  return _mm256_shuffle_epi8(v, _mm256_set1_epi16((short)((2 * K) | ((2 * K + 1) << 8))));
}

// The 16 scales of a 16-element-sub-block type as int16, each 128-bit half of the super-block
// duplicated: half[0] = [s0..s7 | s0..s7], half[1] = [s8..s15 | s8..s15].
struct Scales16 {
  __m256i all;      // [s0..s7 | s8..s15]
  __m256i half[2];
  explicit Scales16(__m128i sc8) {
    all = _mm256_cvtepi8_epi16(sc8);
    half[0] = _mm256_permute4x64_epi64(all, 0x44);
    half[1] = _mm256_permute4x64_epi64(all, 0xEE);
  }
  // int16 lanes 0..7 = scale 2G, lanes 8..15 = scale 2G+1: the two 16-element sub-blocks of
  // 32-element group G.
  template <int G>
  __m256i pair() const {
    constexpr int k = 2 * (G % 4);
    return _mm256_shuffle_epi8(half[G / 4], _mm256_setr_m128i(_mm_set1_epi16((short)((2 * k) | ((2 * k + 1) << 8))),
                                                              _mm_set1_epi16((short)((2 * k + 2) | ((2 * k + 3) << 8)))));
  }
};

template <int... I, typename F>
inline void unroll(std::integer_sequence<int, I...>, F&& f) {
  (f(std::integral_constant<int, I>{}), ...);
}
template <int N, typename F>
inline void unroll(F&& f) {
  unroll(std::make_integer_sequence<int, N>{}, f);
}

// ---- plain float weights, F32 activations: 32 elements a step in four accumulators ----
// (four independent FMA chains per output hide the FMA latency; the tile uses at most 2 rows here).
// EB: bytes per weight. Where the CPU's rule says so (fetch_ahead.h), each step asks for the weights a few
// KiB ahead.

template <int NA, int EB, typename Load8, typename Load1>
void dot_float(const void* w, const void* const* av, int64_t n, float* out, Load8 load8, Load1 load1) {
  const FetchConfig& fetch = fetch_config();
  const uint8_t* ahead = fetch.other ? static_cast<const uint8_t*>(w) + fetch.ahead : nullptr;
  const float* a[NA];
  __m256 acc[4][NA];
  for (int j = 0; j < NA; ++j) {
    a[j] = static_cast<const float*>(av[j]);
    for (int k = 0; k < 4; ++k) acc[k][j] = _mm256_setzero_ps();
  }
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    if (ahead) prefetch_entry<32 * EB>(ahead + i * EB, fetch.to_l2);
    for (int k = 0; k < 4; ++k) {
      const __m256 wk = load8(w, i + 8 * k);
      for (int j = 0; j < NA; ++j) acc[k][j] = _mm256_fmadd_ps(wk, _mm256_loadu_ps(a[j] + i + 8 * k), acc[k][j]);
    }
  }
  for (; i + 8 <= n; i += 8) {
    const __m256 w0 = load8(w, i);
    for (int j = 0; j < NA; ++j) acc[0][j] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(a[j] + i), acc[0][j]);
  }
  for (int j = 0; j < NA; ++j) {
    float s = hsum(_mm256_add_ps(_mm256_add_ps(acc[0][j], acc[1][j]), _mm256_add_ps(acc[2][j], acc[3][j])));
    for (int64_t k = i; k < n; ++k) s = std::fma(load1(w, k), a[j][k], s);
    out[j] = s;
  }
}

template <int NA>
void k_f32(const void* w, const void* const* a, int64_t n, float* out) {
  dot_float<NA, 4>(
      w, a, n, out, [](const void* p, int64_t i) { return _mm256_loadu_ps(static_cast<const float*>(p) + i); },
      [](const void* p, int64_t i) { return static_cast<const float*>(p)[i]; });
}

template <int NA>
void k_f16(const void* w, const void* const* a, int64_t n, float* out) {
  dot_float<NA, 2>(
      w, a, n, out,
      [](const void* p, int64_t i) { return _mm256_cvtph_ps(load128(static_cast<const uint16_t*>(p) + i)); },
      [](const void* p, int64_t i) { return f16(static_cast<const uint16_t*>(p)[i]); });
}

template <int NA>
void k_bf16(const void* w, const void* const* a, int64_t n, float* out) {
  dot_float<NA, 2>(
      w, a, n, out,
      [](const void* p, int64_t i) {
        const __m256i v = _mm256_cvtepu16_epi32(load128(static_cast<const uint16_t*>(p) + i));
        return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
      },
      [](const void* p, int64_t i) { return bf16(static_cast<const uint16_t*>(p)[i]); });
}

// ---- 32-element blocks with signed weights, Q8_0 activations (Q4_0, Q5_0, Q8_0, IQ4_NL) ----
// Sign trick: |w| (unsigned) times a * sign(w). Even and odd blocks go to two accumulators.

template <int NA, typename Block, typename Decode>
void dot_signed32(const void* wv, const void* const* av, int64_t n, float* out, Decode decode) {
  const auto* w = static_cast<const Block*>(wv);
  const BlockQ8_0* a[NA];
  __m256 acc[2][NA];
  for (int j = 0; j < NA; ++j) {
    a[j] = static_cast<const BlockQ8_0*>(av[j]);
    acc[0][j] = acc[1][j] = _mm256_setzero_ps();
  }
  const int64_t nb = n / kQK;
  auto block = [&](int64_t ib, __m256* acc_k) {
    const __m256i x = decode(w[ib]);
    const __m256i ax = _mm256_abs_epi8(x);
    const float dw = f16(w[ib].d);
    for (int j = 0; j < NA; ++j) {
      const __m256i p = dot_us(ax, _mm256_sign_epi8(load256(a[j][ib].qs), x));
      acc_k[j] = _mm256_fmadd_ps(_mm256_set1_ps(dw * f16(a[j][ib].d)), _mm256_cvtepi32_ps(p), acc_k[j]);
    }
  };
  int64_t ib = 0;
  for (; ib + 2 <= nb; ib += 2) {
    block(ib, acc[0]);
    block(ib + 1, acc[1]);
  }
  if (ib < nb) block(ib, acc[0]);
  for (int j = 0; j < NA; ++j) out[j] = hsum(_mm256_add_ps(acc[0][j], acc[1][j]));
}

template <int NA>
void k_q4_0(const void* w, const void* const* a, int64_t n, float* out) {
  dot_signed32<NA, BlockQ4_0>(w, a, n, out,
                              [](const BlockQ4_0& b) { return _mm256_sub_epi8(nibbles32(b.qs), bytes(8)); });
}

template <int NA>
void k_q5_0(const void* w, const void* const* a, int64_t n, float* out) {
  dot_signed32<NA, BlockQ5_0>(w, a, n, out, [](const BlockQ5_0& b) {
    uint32_t qh;
    std::memcpy(&qh, b.qh, 4);
    // value - 16: the nibble when the fifth bit is set, else the nibble with 0xF0 (nibble - 16).
    return _mm256_or_si256(nibbles32(b.qs), _mm256_andnot_si256(spread_bits(qh), bytes(0xF0)));
  });
}

template <int NA>
void k_q8_0(const void* w, const void* const* a, int64_t n, float* out) {
  dot_signed32<NA, BlockQ8_0>(w, a, n, out, [](const BlockQ8_0& b) { return load256(b.qs); });
}

template <int NA>
void k_iq4_nl(const void* w, const void* const* a, int64_t n, float* out) {
  const __m256i lut = iq4_lut();
  dot_signed32<NA, BlockIQ4_NL>(w, a, n, out,
                                [lut](const BlockIQ4_NL& b) { return _mm256_shuffle_epi8(lut, nibbles32(b.qs)); });
}

// ---- 32-element blocks with unsigned weights and an offset, Q8_1 activations (Q4_1, Q5_1) ----

template <int NA, typename Block, typename Decode>
void dot_offset32(const void* wv, const void* const* av, int64_t n, float* out, Decode decode) {
  const auto* w = static_cast<const Block*>(wv);
  const ActBlockQ8_1* a[NA];
  __m256 acc[2][NA];
  float offs[NA];
  for (int j = 0; j < NA; ++j) {
    a[j] = static_cast<const ActBlockQ8_1*>(av[j]);
    acc[0][j] = acc[1][j] = _mm256_setzero_ps();
    offs[j] = 0;
  }
  const int64_t nb = n / kQK;
  auto block = [&](int64_t ib, __m256* acc_k) {
    const __m256i u = decode(w[ib]);
    const float dw = f16(w[ib].d), m = f16(w[ib].m);
    for (int j = 0; j < NA; ++j) {
      const float da = f16(a[j][ib].d);
      const __m256i p = dot_us(u, load256(a[j][ib].qs));
      acc_k[j] = _mm256_fmadd_ps(_mm256_set1_ps(dw * da), _mm256_cvtepi32_ps(p), acc_k[j]);
      offs[j] = std::fma(m, da * (float)a[j][ib].sum, offs[j]);
    }
  };
  int64_t ib = 0;
  for (; ib + 2 <= nb; ib += 2) {
    block(ib, acc[0]);
    block(ib + 1, acc[1]);
  }
  if (ib < nb) block(ib, acc[0]);
  for (int j = 0; j < NA; ++j) out[j] = hsum(_mm256_add_ps(acc[0][j], acc[1][j])) + offs[j];
}

template <int NA>
void k_q4_1(const void* w, const void* const* a, int64_t n, float* out) {
  dot_offset32<NA, BlockQ4_1>(w, a, n, out, [](const BlockQ4_1& b) { return nibbles32(b.qs); });
}

template <int NA>
void k_q5_1(const void* w, const void* const* a, int64_t n, float* out) {
  dot_offset32<NA, BlockQ5_1>(w, a, n, out, [](const BlockQ5_1& b) {
    uint32_t qh;
    std::memcpy(&qh, b.qh, 4);
    return _mm256_or_si256(nibbles32(b.qs), _mm256_and_si256(spread_bits(qh), bytes(0x10)));
  });
}

// ---- K-quants and IQ4_XS, Q8_K activations ----
// Per super-block and activation row: an 8-lane int32 sum of scale * (levels . activations), then
// one fused multiply-add by d_w * d_a (and one by dmin * d_a for the types with mins).

template <int NA>
struct KActs {
  const BlockQ8_K* a[NA];
  __m256 acc[NA];
  explicit KActs(const void* const* av) {
    for (int j = 0; j < NA; ++j) {
      a[j] = static_cast<const BlockQ8_K*>(av[j]);
      acc[j] = _mm256_setzero_ps();
    }
  }
  void finish(float* out) const {
    for (int j = 0; j < NA; ++j) out[j] = hsum(acc[j]);
  }
};

// 32 levels (unsigned) of group G times the activations, weighted by the pair of 16-element scales.
template <int NA>
inline void group_pair(__m256i u, __m256i scales, const KActs<NA>& A, int64_t i, int g, __m256i* sumi) {
  for (int j = 0; j < NA; ++j) {
    const __m256i p = _mm256_maddubs_epi16(u, load256(A.a[j][i].qs + 32 * g));
    sumi[j] = _mm256_add_epi32(sumi[j], _mm256_madd_epi16(p, scales));
    pin(sumi[j]);
  }
}

template <int NA>
void k_q2_k(const void* wv, const void* const* av, int64_t n, float* out) {
  const auto* w = static_cast<const BlockQ2_K*>(wv);
  KActs<NA> A(av);
  for (int64_t i = 0; i < n / kQKK; ++i) {
    const BlockQ2_K& b = w[i];
    const __m128i sm = load128(b.scales);
    const Scales16 sc(_mm_and_si128(sm, _mm_set1_epi8(0x0F)));
    const __m256i mins16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sm, 4), _mm_set1_epi8(0x0F)));
    __m256i sumi[NA];
    for (int j = 0; j < NA; ++j) sumi[j] = _mm256_setzero_si256();
    unroll<2>([&](auto h) {
      const __m256i q = load256(b.qs + 32 * h);
      unroll<4>([&](auto k) {
        const __m256i u = _mm256_and_si256(_mm256_srli_epi16(q, 2 * k), bytes(3));
        group_pair<NA>(u, sc.pair<4 * h + k>(), A, i, 4 * h + k, sumi);
      });
    });
    const float dw = f16(b.d), dm = f16(b.dmin);
    for (int j = 0; j < NA; ++j) {
      const BlockQ8_K& y = A.a[j][i];
      const __m256i msum = _mm256_madd_epi16(mins16, load256(y.bsums));
      A.acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(dw * y.d), _mm256_cvtepi32_ps(sumi[j]), A.acc[j]);
      A.acc[j] = _mm256_fnmadd_ps(_mm256_set1_ps(dm * y.d), _mm256_cvtepi32_ps(msum), A.acc[j]);
    }
  }
  A.finish(out);
}

// The 16 signed 6-bit scales of a Q3_K block (-32..31) as bytes.
inline __m128i q3k_scales(const uint8_t* s) {
  uint32_t v[3];
  std::memcpy(v, s, 12);
  const uint32_t lo4 = 0x0F0F0F0Fu, lo2 = 0x03030303u;
  const __m128i sc = _mm_setr_epi32((int)((v[0] & lo4) | ((v[2] & lo2) << 4)),
                                    (int)((v[1] & lo4) | (((v[2] >> 2) & lo2) << 4)),
                                    (int)(((v[0] >> 4) & lo4) | (((v[2] >> 4) & lo2) << 4)),
                                    (int)(((v[1] >> 4) & lo4) | (((v[2] >> 6) & lo2) << 4)));
  return _mm_sub_epi8(sc, _mm_set1_epi8(32));
}

template <int NA>
void k_q3_k(const void* wv, const void* const* av, int64_t n, float* out) {
  const auto* w = static_cast<const BlockQ3_K*>(wv);
  KActs<NA> A(av);
  for (int64_t i = 0; i < n / kQKK; ++i) {
    const BlockQ3_K& b = w[i];
    const Scales16 sc(q3k_scales(b.scales));
    const __m256i hm = load256(b.hmask);
    __m256i sumi[NA];
    for (int j = 0; j < NA; ++j) sumi[j] = _mm256_setzero_si256();
    // Levels as q2 + 4 * hbit (0..7); the "- 4" of every element is taken out below through bsums.
    unroll<2>([&](auto h) {
      const __m256i q = load256(b.qs + 32 * h);
      unroll<4>([&](auto k) {
        const __m256i q2 = _mm256_and_si256(_mm256_srli_epi16(q, 2 * k), bytes(3));
        const __m256i u = _mm256_or_si256(q2, move_bit<4 * h + k, 2>(hm));
        group_pair<NA>(u, sc.pair<4 * h + k>(), A, i, 4 * h + k, sumi);
      });
    });
    const __m256i sc16 = sc.all;
    const float dw = f16(b.d);
    for (int j = 0; j < NA; ++j) {
      const BlockQ8_K& y = A.a[j][i];
      const __m256i corr = _mm256_slli_epi32(_mm256_madd_epi16(sc16, load256(y.bsums)), 2);
      const __m256i s = _mm256_sub_epi32(sumi[j], corr);
      A.acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(dw * y.d), _mm256_cvtepi32_ps(s), A.acc[j]);
    }
  }
  A.finish(out);
}

// The 8 scales and 8 mins (6 bits each) of a Q4_K/Q5_K block, as bytes [scales 0..7, mins 0..7], from
// the block's first 16 bytes (d, dmin, then the 12 scale bytes s0..s11): scale j < 4 is s[j] & 63,
// min j < 4 is s[j+4] & 63; for j >= 4 the low 4 bits come from s[j+4] (scale: low nibble, min: high
// nibble) and the top 2 bits from bits 6-7 of s[j-4] (scale) or s[j] (min).
inline __m128i k4_scales_mins(__m128i hdr) {
  const __m128i a = _mm_shuffle_epi8(hdr, _mm_setr_epi8(4, 5, 6, 7, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15));
  const __m128i b = _mm_shuffle_epi8(hdr, _mm_setr_epi8(-1, -1, -1, -1, 4, 5, 6, 7, -1, -1, -1, -1, 8, 9, 10, 11));
  const __m128i low = _mm_and_si128(a, _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 0, 0, 0, 0));
  const __m128i nib = _mm_and_si128(_mm_srli_epi16(a, 4), _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 15, 15, 15));
  const __m128i top = _mm_and_si128(_mm_srli_epi16(b, 2), _mm_setr_epi8(0, 0, 0, 0, 48, 48, 48, 48, 0, 0, 0, 0, 48, 48, 48, 48));
  return _mm_or_si128(_mm_or_si128(low, nib), top);
}

// Q4_K and Q5_K: 8 sub-blocks of 32 with one scale and one min each. `High` adds the fifth bit.
template <int NA, bool High, typename Block>
void dot_k4(const void* wv, const void* const* av, int64_t n, float* out) {
  const auto* w = static_cast<const Block*>(wv);
  KActs<NA> A(av);
  for (int64_t i = 0; i < n / kQKK; ++i) {
    const Block& b = w[i];
    static_assert(offsetof(Block, scales) == 4 && sizeof(b.scales) == 12);
    const __m128i hdr = load128(&b);
    const __m128i sm8 = k4_scales_mins(hdr);
    const __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sm8));
    // Each min twice (words 2k, 2k+1 = min k), to pair with the 16 bsums.
    const __m256i mins16 = _mm256_cvtepu8_epi16(
        _mm_shuffle_epi8(sm8, _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15)));
    const __m128 dd = _mm_cvtph_ps(hdr);  // d, dmin (lanes 2-3: scale bytes, unused)
    __m256i qh = _mm256_setzero_si256();
    if constexpr (High) qh = load256(b.qh);
    __m256i sumi[NA];
    for (int j = 0; j < NA; ++j) sumi[j] = _mm256_setzero_si256();
    unroll<4>([&](auto c) {
      const __m256i q = load256(b.qs + 32 * c);
      __m256i lo = _mm256_and_si256(q, bytes(0x0F));
      __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), bytes(0x0F));
      if constexpr (High) {
        lo = _mm256_or_si256(lo, move_bit<2 * c, 4>(qh));
        hi = _mm256_or_si256(hi, move_bit<2 * c + 1, 4>(qh));
      }
      const __m256i s_lo = word_bcast<2 * c>(sc16), s_hi = word_bcast<2 * c + 1>(sc16);
      for (int j = 0; j < NA; ++j) {
        const int8_t* y = A.a[j][i].qs + 64 * c;
        const __m256i p_lo = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, load256(y)), s_lo);
        const __m256i p_hi = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, load256(y + 32)), s_hi);
        sumi[j] = _mm256_add_epi32(sumi[j], _mm256_add_epi32(p_lo, p_hi));
        pin(sumi[j]);
      }
    });
    for (int j = 0; j < NA; ++j) {
      const BlockQ8_K& y = A.a[j][i];
      const __m256i msum = _mm256_madd_epi16(mins16, load256(y.bsums));
      const __m128 f = _mm_mul_ps(dd, _mm_set1_ps(y.d));  // d * d_a, dmin * d_a
      A.acc[j] = _mm256_fmadd_ps(_mm256_broadcastss_ps(f), _mm256_cvtepi32_ps(sumi[j]), A.acc[j]);
      A.acc[j] = _mm256_fnmadd_ps(_mm256_broadcastss_ps(_mm_movehdup_ps(f)), _mm256_cvtepi32_ps(msum), A.acc[j]);
    }
  }
  A.finish(out);
}

template <int NA>
void k_q4_k(const void* w, const void* const* a, int64_t n, float* out) {
  dot_k4<NA, false, BlockQ4_K>(w, a, n, out);
}
template <int NA>
void k_q5_k(const void* w, const void* const* a, int64_t n, float* out) {
  dot_k4<NA, true, BlockQ5_K>(w, a, n, out);
}

template <int NA>
void k_q6_k(const void* wv, const void* const* av, int64_t n, float* out) {
  const auto* w = static_cast<const BlockQ6_K*>(wv);
  KActs<NA> A(av);
  const __m256i m4 = bytes(0x0F);
  for (int64_t i = 0; i < n / kQKK; ++i) {
    const BlockQ6_K& b = w[i];
    const Scales16 sc(load128(b.scales));
    __m256i sumi[NA];
    for (int j = 0; j < NA; ++j) sumi[j] = _mm256_setzero_si256();
    // Levels unsigned (0..63); the "- 32" of every element is taken out below through bsums.
    unroll<2>([&](auto h) {
      const __m256i ql0 = load256(b.ql + 64 * h), ql1 = load256(b.ql + 64 * h + 32);
      const __m256i qh = load256(b.qh + 32 * h);
      const __m256i u0 = _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_slli_epi16(_mm256_and_si256(qh, bytes(0x03)), 4));
      const __m256i u1 = _mm256_or_si256(_mm256_and_si256(ql1, m4), _mm256_slli_epi16(_mm256_and_si256(qh, bytes(0x0C)), 2));
      const __m256i u2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), _mm256_and_si256(qh, bytes(0x30)));
      const __m256i u3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                                         _mm256_srli_epi16(_mm256_and_si256(qh, bytes(0xC0)), 2));
      group_pair<NA>(u0, sc.pair<4 * h + 0>(), A, i, 4 * h + 0, sumi);
      group_pair<NA>(u1, sc.pair<4 * h + 1>(), A, i, 4 * h + 1, sumi);
      group_pair<NA>(u2, sc.pair<4 * h + 2>(), A, i, 4 * h + 2, sumi);
      group_pair<NA>(u3, sc.pair<4 * h + 3>(), A, i, 4 * h + 3, sumi);
    });
    const __m256i sc16 = sc.all;
    const float dw = f16(b.d);
    for (int j = 0; j < NA; ++j) {
      const BlockQ8_K& y = A.a[j][i];
      const __m256i corr = _mm256_slli_epi32(_mm256_madd_epi16(sc16, load256(y.bsums)), 5);
      const __m256i s = _mm256_sub_epi32(sumi[j], corr);
      A.acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(dw * y.d), _mm256_cvtepi32_ps(s), A.acc[j]);
    }
  }
  A.finish(out);
}

template <int NA>
void k_iq4_xs(const void* wv, const void* const* av, int64_t n, float* out) {
  const auto* w = static_cast<const BlockIQ4_XS*>(wv);
  KActs<NA> A(av);
  const __m256i lut = iq4_lut();
  for (int64_t i = 0; i < n / kQKK; ++i) {
    const BlockIQ4_XS& b = w[i];
    __m256i sumi[NA];
    for (int j = 0; j < NA; ++j) sumi[j] = _mm256_setzero_si256();
    unroll<4>([&](auto p) {  // sub-blocks 2p and 2p+1
      const __m256i q = load256(b.qs + 32 * p);
      const __m256i lo = _mm256_shuffle_epi8(lut, _mm256_and_si256(q, bytes(0x0F)));
      const __m256i hi = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(q, 4), bytes(0x0F)));
      const __m256i w0 = _mm256_permute2x128_si256(lo, hi, 0x20), w1 = _mm256_permute2x128_si256(lo, hi, 0x31);
      const __m256i aw0 = _mm256_abs_epi8(w0), aw1 = _mm256_abs_epi8(w1);
      const int ls0 = ((b.scales_l[p] & 0xF) | (((b.scales_h >> (4 * p)) & 3) << 4)) - 32;
      const int ls1 = ((b.scales_l[p] >> 4) | (((b.scales_h >> (4 * p + 2)) & 3) << 4)) - 32;
      const __m256i s0 = _mm256_set1_epi16((short)ls0), s1 = _mm256_set1_epi16((short)ls1);
      for (int j = 0; j < NA; ++j) {
        const int8_t* y = A.a[j][i].qs + 64 * p;
        const __m256i p0 = _mm256_maddubs_epi16(aw0, _mm256_sign_epi8(load256(y), w0));
        const __m256i p1 = _mm256_maddubs_epi16(aw1, _mm256_sign_epi8(load256(y + 32), w1));
        sumi[j] = _mm256_add_epi32(sumi[j], _mm256_add_epi32(_mm256_madd_epi16(p0, s0), _mm256_madd_epi16(p1, s1)));
        pin(sumi[j]);
      }
    });
    const float dw = f16(b.d);
    for (int j = 0; j < NA; ++j) {
      A.acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(dw * A.a[j][i].d), _mm256_cvtepi32_ps(sumi[j]), A.acc[j]);
    }
  }
  A.finish(out);
}

// ---- single dot and tile drivers ----

template <MultiFn K1>
float single(const void* w, const void* a, int64_t n) {
  const void* p[1] = {a};
  float out;
  K1(w, p, n, &out);
  return out;
}

// Weight row by weight row; activation rows in groups of up to 4 (2 when K3/K4 are null).
template <MultiFn K1, MultiFn K2, MultiFn K3, MultiFn K4>
void tile(const void* w, size_t w_stride, int n_w, const void* a, size_t a_stride, int n_a, int64_t n, float* y,
          size_t ldy) {
  constexpr int kGroup = K4 != nullptr ? 4 : 2;
  const auto* ab = static_cast<const uint8_t*>(a);
  for (int r = 0; r < n_w; ++r) {
    const void* wr = static_cast<const uint8_t*>(w) + (size_t)r * w_stride;
    for (int c = 0; c < n_a; c += kGroup) {
      const int na = n_a - c < kGroup ? n_a - c : kGroup;
      const void* p[kMaxNA];
      float out[kMaxNA];
      for (int j = 0; j < na; ++j) p[j] = ab + (size_t)(c + j) * a_stride;
      if constexpr (kGroup == 4) {
        if (na == 4) K4(wr, p, n, out);
        else if (na == 3) K3(wr, p, n, out);
        else if (na == 2) K2(wr, p, n, out);
        else K1(wr, p, n, out);
      } else {
        if (na == 2) K2(wr, p, n, out);
        else K1(wr, p, n, out);
      }
      for (int j = 0; j < na; ++j) y[(size_t)(c + j) * ldy + r] = out[j];
    }
  }
}

}  // namespace

namespace detail {

#define ROOFLINE_AVX2_FLOAT_KERNELS(X) \
  X(F32, k_f32)                        \
  X(F16, k_f16)                        \
  X(BF16, k_bf16)
#define ROOFLINE_AVX2_KERNELS(X) \
  X(Q4_0, k_q4_0)                \
  X(Q4_1, k_q4_1)                \
  X(Q5_0, k_q5_0)                \
  X(Q5_1, k_q5_1)                \
  X(Q8_0, k_q8_0)                \
  X(Q2_K, k_q2_k)                \
  X(Q3_K, k_q3_k)                \
  X(Q4_K, k_q4_k)                \
  X(Q5_K, k_q5_k)                \
  X(Q6_K, k_q6_k)                \
  X(IQ4_NL, k_iq4_nl)            \
  X(IQ4_XS, k_iq4_xs)

// F16C from CPUID leaf 1 (ECX bit 29): Clang before 16 does not know "f16c" in __builtin_cpu_supports.
bool f16c_supported() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
}

bool avx2_supported() {
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c_supported();
  return ok;
}

VecDotFn avx2_dot(DType t) {
  switch (t) {
#define X(type, fn) \
  case DType::type: return single<fn<1>>;
    ROOFLINE_AVX2_FLOAT_KERNELS(X)
    ROOFLINE_AVX2_KERNELS(X)
#undef X
    default: return nullptr;
  }
}

VecDotTileFn avx2_tile(DType t) {
  switch (t) {
#define X(type, fn) \
  case DType::type: return tile<fn<1>, fn<2>, fn<3>, fn<4>>;
    ROOFLINE_AVX2_KERNELS(X)
#undef X
#define X(type, fn) \
  case DType::type: return tile<fn<1>, fn<2>, nullptr, nullptr>;
    ROOFLINE_AVX2_FLOAT_KERNELS(X)
#undef X
    default: return nullptr;
  }
}

#undef ROOFLINE_AVX2_KERNELS
#undef ROOFLINE_AVX2_FLOAT_KERNELS

// ---- activation quantizer (bit-identical with quantize_act_row_scalar) ----

namespace {

inline float hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

inline __m256 abs_ps(__m256 v) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v); }

float amax_of(const float* x, int n) {
  __m256 m = _mm256_setzero_ps();
  for (int k = 0; k < n; k += 8) m = _mm256_max_ps(m, abs_ps(_mm256_loadu_ps(x + k)));
  return hmax(m);
}

// 32 floats times id, rounded to nearest even, clamped to [-127, 127], stored as bytes in order.
// Returns the bytes for callers that sum them.
__m256i quantize32(const float* x, float id, int8_t* q) {
  const __m256 vid = _mm256_set1_ps(id);
  const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
  __m256i v[4];
  for (int k = 0; k < 4; ++k) {
    const __m256i r = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * k), vid));
    v[k] = _mm256_min_epi32(_mm256_max_epi32(r, lo), hi);
  }
  const __m256i p16a = _mm256_packs_epi32(v[0], v[1]), p16b = _mm256_packs_epi32(v[2], v[3]);
  const __m256i p8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p16a, p16b), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), p8);
  return p8;
}

// Sums of the two 16-byte halves of 32 signed bytes.
inline void sum16x2(__m256i p8, int* s0, int* s1) {
  const __m256i sad = _mm256_sad_epu8(_mm256_xor_si256(p8, bytes(0x80)), _mm256_setzero_si256());
  alignas(32) uint64_t l[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(l), sad);
  *s0 = (int)(l[0] + l[1]) - 16 * 128;
  *s1 = (int)(l[2] + l[3]) - 16 * 128;
}

}  // namespace

void f16_row_to_f32_avx2(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(load128(src + i)));
  for (; i < n; ++i) dst[i] = f16(src[i]);
}

void f32_row_to_f16_avx2(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  for (; i < n; ++i) dst[i] = (uint16_t)_mm_extract_epi16(_mm_cvtps_ph(_mm_set_ss(src[i]), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), 0);
}

void quantize_act_row_avx2(ActFormat format, const float* x, void* dst, int64_t n) {
  switch (format) {
    case ActFormat::F32: std::memcpy(dst, x, (size_t)n * sizeof(float)); return;
    case ActFormat::Q8_0:
    case ActFormat::Q8_1: {
      const bool with_sum = format == ActFormat::Q8_1;
      const size_t bb = with_sum ? sizeof(ActBlockQ8_1) : sizeof(BlockQ8_0);
      auto* out = static_cast<uint8_t*>(dst);
      for (int64_t i = 0; i < n / kQK; ++i, x += kQK, out += bb) {
        const uint16_t d16 = to_f16(amax_of(x, kQK) / 127.f);
        const float d = f16(d16);
        const float id = d != 0.f ? 1.f / d : 0.f;
        if (with_sum) {
          auto* b = reinterpret_cast<ActBlockQ8_1*>(out);
          b->d = d16;
          int s0, s1;
          sum16x2(quantize32(x, id, b->qs), &s0, &s1);
          b->sum = (int16_t)(s0 + s1);
        } else {
          auto* b = reinterpret_cast<BlockQ8_0*>(out);
          b->d = d16;
          quantize32(x, id, b->qs);
        }
      }
      return;
    }
    case ActFormat::Q8_K: {
      auto* b = static_cast<BlockQ8_K*>(dst);
      for (int64_t i = 0; i < n / kQKK; ++i, x += kQKK) {
        const float d = amax_of(x, kQKK) / 127.f;
        const float id = d != 0.f ? 1.f / d : 0.f;
        b[i].d = d;
        for (int g = 0; g < kQKK / 32; ++g) {
          int s0, s1;
          sum16x2(quantize32(x + 32 * g, id, b[i].qs + 32 * g), &s0, &s1);
          b[i].bsums[2 * g] = (int16_t)s0;
          b[i].bsums[2 * g + 1] = (int16_t)s1;
        }
      }
      return;
    }
  }
}

}  // namespace detail
}  // namespace roofline::cpu

#else  // no AVX2 in this build: the dispatcher always takes the scalar kernels

#include "formats/quant_ref.h"

namespace roofline::cpu::detail {
bool avx2_supported() { return false; }
VecDotFn avx2_dot(DType) { return nullptr; }
VecDotTileFn avx2_tile(DType) { return nullptr; }
void quantize_act_row_avx2(ActFormat format, const float* x, void* dst, int64_t n) {
  quantize_act_row_scalar(format, x, dst, n);
}
void f16_row_to_f32_avx2(const uint16_t* src, float* dst, int64_t n) { dequantize_row_ref(DType::F16, src, dst, n); }
void f32_row_to_f16_avx2(const float* src, uint16_t* dst, int64_t n) { quantize_row_ref(DType::F16, src, dst, n); }
}  // namespace roofline::cpu::detail

#endif
