// AVX-512 VNNI dot kernels and their prefill tile (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K .. Q6_K, IQ4_NL, IQ4_XS).
// Compiled for AVX-512 F/BW/VL/DQ/VNNI through per-function target attributes (a pragma over this
// file, not global flags), called only after avx512_supported(). Each kernel is one template over NA
// activation rows (1..8): a weight block is decoded once per tile and multiplied with NA activation
// rows, and every output's operation sequence is the same for any NA, so prefill and decode give
// identical bits (batch invariance) on this path. Integer work is exact; only the float steps order.
//  - K-quants: 64 levels per 512-bit step; maddubs (u8 x s8 pairs) then vpdpwssd with the int16 scale
//    of each 32- or 16-element sub-block, one int32 vector per super-block and activation row.
//  - 32-element types: two blocks per 512-bit step; the tile first writes its activation rows once as
//    a panel of unsigned bytes (a + 128) and per-lane float scales, so each activation row costs one
//    vpdpbusd per 64 levels, whose accumulator starts at -128 * (sum of the 4 weights of the lane).
//  - Q4_1 / Q5_1: two blocks per step through a panel of the Q8_1 rows as they are (unsigned levels,
//    signed activations: vpdpbusd needs no correction), the offsets summed in the lanes by one more FMA.
// No shared inline helpers from other headers (core/fp16.h, <algorithm>): an AVX-512-compiled copy
// of an inline function could be the one the linker keeps for the other paths.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "backend/cpu/vec_dot.h"
#include "formats/quant_blocks.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include "backend/cpu/avx512_region_begin.h"

namespace roofline::cpu {
namespace {

constexpr int kMaxNA = 8;

inline float f16(uint16_t h) { return _cvtsh_ss(h); }
inline __m128i load128(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }
inline __m256i load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
inline __m512i load512(const void* p) { return _mm512_loadu_si512(p); }
inline __m512i bytes(int v) { return _mm512_set1_epi8((char)v); }
// 32 bytes in both 256-bit halves.
inline __m512i dup256(const void* p) { return _mm512_broadcast_i64x4(load256(p)); }
// int16 shift counts: `lo` for the lower 256 bits, `hi` for the upper.
inline __m512i halves16(int lo, int hi) {
  return _mm512_inserti64x4(_mm512_set1_epi16((short)lo), _mm256_set1_epi16((short)hi), 1);
}
// Index vector for vpermw that lines up sub-block scales with two vpdpbusd results packed to int16
// (vpackssdw): in 128-bit lane L, words 0-3 come from the first result's lanes 4L..4L+3 and words
// 4-7 from the second's. `sub(L, second)` is the sub-block (scale word) of those four lanes.
template <typename Sub>
inline __m512i packed_scale_index(Sub sub) {
  alignas(64) int16_t idx[32];
  for (int w = 0; w < 32; ++w) idx[w] = (int16_t)sub(w / 8, (w % 8) >= 4);
  return _mm512_load_si512(idx);
}

// ---- K-quants, Q8_K activations ----

template <int NA>
struct KActs {
  const BlockQ8_K* a[NA];
  __m512 acc[NA];
  explicit KActs(const void* const* av) {
    for (int j = 0; j < NA; ++j) {
      a[j] = static_cast<const BlockQ8_K*>(av[j]);
      acc[j] = _mm512_setzero_ps();
    }
  }
  void finish(float* out) const {
    for (int j = 0; j < NA; ++j) out[j] = _mm512_reduce_add_ps(acc[j]);
  }
};

// The 8 scales and 8 mins (6 bits each) of a Q4_K/Q5_K block as bytes [scales 0..7, mins 0..7], from
// the block's first 16 bytes (d, dmin, 12 scale bytes s0..s11): scale j < 4 is s[j] & 63, min j < 4
// is s[j+4] & 63; for j >= 4 the low 4 bits come from s[j+4] (scale: low nibble, min: high nibble)
// and the top 2 bits from bits 6-7 of s[j-4] (scale) or s[j] (min).
inline __m128i k4_scales_mins(__m128i hdr) {
  const __m128i a = _mm_shuffle_epi8(hdr, _mm_setr_epi8(4, 5, 6, 7, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15));
  const __m128i b = _mm_shuffle_epi8(hdr, _mm_setr_epi8(-1, -1, -1, -1, 4, 5, 6, 7, -1, -1, -1, -1, 8, 9, 10, 11));
  const __m128i low = _mm_and_si128(a, _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 0, 0, 0, 0));
  const __m128i nib = _mm_and_si128(_mm_srli_epi16(a, 4), _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 15, 15, 15));
  const __m128i top = _mm_and_si128(_mm_srli_epi16(b, 2), _mm_setr_epi8(0, 0, 0, 0, 48, 48, 48, 48, 0, 0, 0, 0, 48, 48, 48, 48));
  return _mm_or_si128(_mm_or_si128(low, nib), top);
}

// Q4_K and Q5_K: 8 sub-blocks of 32, one scale and one min each; `High` adds Q5_K's fifth bit.
// Step c covers sub-blocks 2c (low nibbles of qs[32c..32c+31]) and 2c+1 (their high nibbles). Per
// activation row a step is one vpdpbusd (int32 sums of 4 products, |sum| <= 4 * 31 * 127, so int16
// holds them); steps 2q and 2q+1 are packed to int16 and weighted by their scales in one vpdpwssd.
// The mins term, dmin * d_a * sum_k m_k * (bsum_2k + bsum_2k+1), is taken in floats: per activation row
// the tile first writes mins_act[i][k] = d_a * (bsum_2k + bsum_2k+1) (write_k4_mins_row), per weight
// super-block the kernel forms dmin * m_k, and each super-block and activation row adds their product
// with one 256-bit FMA (the int16 dot, conversion and FMA it replaces were two 512-bit-port uops).
template <int NA, bool High, typename Block>
void dot_k4(const void* wv, const void* const* av, const float* const* mins_act, int64_t n, float* out) {
  const auto* w = static_cast<const Block*>(wv);
  KActs<NA> A(av);
  __m256 accm[NA];
  for (int j = 0; j < NA; ++j) accm[j] = _mm256_setzero_ps();
  const __m512i nib_shift = halves16(0, 4);
  __m512i high_bit[4], scale_idx[2];
  for (int c = 0; c < 4; ++c)
    high_bit[c] = _mm512_inserti64x4(bytes(1 << (2 * c)), _mm256_set1_epi8((char)(1 << (2 * c + 1))), 1);
  // Step c's lanes 0-7 are sub-block 2c, lanes 8-15 sub-block 2c+1 (128-bit lanes 0-1 and 2-3).
  for (int q = 0; q < 2; ++q)
    scale_idx[q] = packed_scale_index([q](int L, bool second) { return 2 * (2 * q + (int)second) + (L >= 2); });
  for (int64_t i = 0; i < n / kQKK; ++i) {
    const Block& b = w[i];
    static_assert(offsetof(Block, scales) == 4 && sizeof(b.scales) == 12);
    const __m128i hdr = load128(&b);
    const __m128i sm8 = k4_scales_mins(hdr);
    const __m512i sm16 = _mm512_zextsi256_si512(_mm256_cvtepu8_epi16(sm8));  // words 0-7 scales, 8-15 mins
    const __m128 dd = _mm_cvtph_ps(hdr);  // d, dmin (lanes 2-3: scale bytes, unused)
    const float dw = _mm_cvtss_f32(dd);
    // dmin * m_k, k = 0..7
    const __m256 mins_w = _mm256_mul_ps(_mm256_broadcastss_ps(_mm_movehdup_ps(dd)),
                                        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(sm8, 8))));
    __m512i qh = _mm512_setzero_si512();
    if constexpr (High) qh = dup256(b.qh);
    __m512i u[4];
    for (int c = 0; c < 4; ++c) {
      u[c] = _mm512_and_si512(_mm512_srlv_epi16(dup256(b.qs + 32 * c), nib_shift), bytes(0x0F));
      if constexpr (High) u[c] = _mm512_mask_add_epi8(u[c], _mm512_test_epi8_mask(qh, high_bit[c]), u[c], bytes(16));
    }
    const __m512i sc[2] = {_mm512_permutexvar_epi16(scale_idx[0], sm16), _mm512_permutexvar_epi16(scale_idx[1], sm16)};
    for (int j = 0; j < NA; ++j) {
      const int8_t* y = A.a[j][i].qs;
      __m512i sumi = _mm512_setzero_si512();
      for (int q = 0; q < 2; ++q) {
        const __m512i p0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u[2 * q], load512(y + 128 * q));
        const __m512i p1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u[2 * q + 1], load512(y + 128 * q + 64));
        sumi = _mm512_dpwssd_epi32(sumi, _mm512_packs_epi32(p0, p1), sc[q]);
      }
      A.acc[j] = _mm512_fmadd_ps(_mm512_set1_ps(dw * A.a[j][i].d), _mm512_cvtepi32_ps(sumi), A.acc[j]);
      accm[j] = _mm256_fmadd_ps(mins_w, _mm256_loadu_ps(mins_act[j] + 8 * i), accm[j]);
    }
  }
  for (int j = 0; j < NA; ++j) {
    __m128 m = _mm_add_ps(_mm256_castps256_ps128(accm[j]), _mm256_extractf128_ps(accm[j], 1));
    m = _mm_add_ps(m, _mm_movehl_ps(m, m));
    m = _mm_add_ss(m, _mm_movehdup_ps(m));
    out[j] = _mm512_reduce_add_ps(A.acc[j]) - _mm_cvtss_f32(m);
  }
}

// d_a * (bsum_2k + bsum_2k+1) for k = 0..7 of every super-block of one Q8_K activation row.
void write_k4_mins_row(const BlockQ8_K* a, int64_t nsb, float* dst) {
  for (int64_t i = 0; i < nsb; ++i) {
    const __m256i pair_sums = _mm256_madd_epi16(load256(a[i].bsums), _mm256_set1_epi16(1));
    _mm256_storeu_ps(dst + 8 * i, _mm256_mul_ps(_mm256_set1_ps(a[i].d), _mm256_cvtepi32_ps(pair_sums)));
  }
}

// A thread-local buffer of n floats, 64-byte aligned; valid until this thread's next call.
float* float_scratch(size_t n) {
  thread_local std::vector<float> buf;
  if (buf.size() < n + 16) buf.resize(n + 16);
  return buf.data() + ((64 - (reinterpret_cast<uintptr_t>(buf.data()) & 63)) & 63) / sizeof(float);
}

// Q4_K and Q5_K tiles: the activation rows' mins factors first, then weight row by weight row with
// activation rows in groups of up to 8.
template <bool High, typename Block>
struct TileK4 {
  template <int NA>
  static void run(const void* w, const void* const* a, const float* const* m, int64_t n, float* out) {
    dot_k4<NA, High, Block>(w, a, m, n, out);
  }
  static void tile(const void* w, size_t w_stride, int n_w, const void* a, size_t a_stride, int n_a, int64_t n,
                   float* y, size_t ldy) {
    using Fn = void (*)(const void*, const void* const*, const float* const*, int64_t, float*);
    static constexpr Fn kFns[kMaxNA + 1] = {nullptr, run<1>, run<2>, run<3>, run<4>, run<5>, run<6>, run<7>, run<8>};
    const int64_t nsb = n / kQKK;
    float* mins = float_scratch((size_t)(8 * nsb * n_a));
    const auto* ab = static_cast<const uint8_t*>(a);
    for (int c = 0; c < n_a; ++c)
      write_k4_mins_row(reinterpret_cast<const BlockQ8_K*>(ab + (size_t)c * a_stride), nsb, mins + (size_t)c * 8 * nsb);
    for (int c = 0; c < n_a; c += kMaxNA) {
      const int na = n_a - c < kMaxNA ? n_a - c : kMaxNA;
      const void* p[kMaxNA];
      const float* pm[kMaxNA];
      for (int j = 0; j < na; ++j) {
        p[j] = ab + (size_t)(c + j) * a_stride;
        pm[j] = mins + (size_t)(c + j) * 8 * nsb;
      }
      for (int r = 0; r < n_w; ++r) {
        float out[kMaxNA];
        kFns[na](static_cast<const uint8_t*>(w) + (size_t)r * w_stride, p, pm, n, out);
        for (int j = 0; j < na; ++j) y[(size_t)(c + j) * ldy + r] = out[j];
      }
    }
  }
  static float single(const void* w, const void* a, int64_t n) {
    float out;
    tile(w, 0, 1, a, 0, 1, n, &out, 1);
    return out;
  }
};


// The K-quants of 16 sub-blocks of 16 (Q2_K, Q3_K, Q6_K) take 64 levels a step: step s's 128-bit lane L is
// sub-block 4s + L. sub16_scale_index(h) lines the scale words up with the int16-packed sums of steps 2h and
// 2h + 1 (vpermw); sub16_scaled_sums gives, for one Q8_K activation row, the sum over the super-block of each
// sub-block's scale times its levels . activations: per step one vpdpbusd (|sum of 4| must fit int16), the two
// steps of each h packed and weighted by their scales in one vpdpwssd.
inline __m512i sub16_scale_index(int h) {
  return packed_scale_index([h](int L, bool second) { return 4 * (2 * h + (int)second) + L; });
}
inline __m512i sub16_scaled_sums(const __m512i (&u)[4], const __m512i (&sc)[2], const int8_t* qs) {
  __m512i sumi = _mm512_setzero_si512();
  for (int h = 0; h < 2; ++h) {
    const __m512i p0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u[2 * h], load512(qs + 128 * h));
    const __m512i p1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u[2 * h + 1], load512(qs + 128 * h + 64));
    sumi = _mm512_dpwssd_epi32(sumi, _mm512_packs_epi32(p0, p1), sc[h]);
  }
  return sumi;
}

// Q6_K: 16 sub-blocks of 16 with signed 8-bit scales; levels unsigned 0..63, the "- 32" of every
// element taken out through the activation block sums (one vpdpwssd with -32 * scale).
// Step 2h covers elements 128h..128h+63 (low nibbles of ql[64h..64h+63], qh bits 0-1 / 2-3 of
// qh[32h..32h+31] for the two halves), step 2h+1 elements 128h+64..128h+127 (high nibbles, bits 4-5 /
// 6-7); |sum of 4| <= 4 * 63 * 127 < 32768.
template <int NA>
void k_q6_k(const void* wv, const void* const* av, int64_t n, float* out) {
  const auto* w = static_cast<const BlockQ6_K*>(wv);
  KActs<NA> A(av);
  const __m512i qh_shift_lo = halves16(4, 2);   // bits 0-1 / 2-3 to bits 4-5
  const __m512i qh_shift_hi = halves16(0, 2);   // bits 4-5 / 6-7 to bits 4-5
  const __m512i scale_idx[2] = {sub16_scale_index(0), sub16_scale_index(1)};
  for (int64_t i = 0; i < n / kQKK; ++i) {
    const BlockQ6_K& b = w[i];
    const __m256i sc16 = _mm256_cvtepi8_epi16(load128(b.scales));
    const __m512i scz = _mm512_zextsi256_si512(sc16);
    const __m512i corr = _mm512_zextsi256_si512(_mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(sc16, 5)));
    const float dw = f16(b.d);
    __m512i u[4], sc[2];
    for (int h = 0; h < 2; ++h) {
      const __m512i ql = load512(b.ql + 64 * h);
      const __m512i qh = dup256(b.qh + 32 * h);
      u[2 * h] = _mm512_or_si512(_mm512_and_si512(ql, bytes(0x0F)),
                                 _mm512_and_si512(_mm512_sllv_epi16(qh, qh_shift_lo), bytes(0x30)));
      u[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), bytes(0x0F)),
                                     _mm512_and_si512(_mm512_srlv_epi16(qh, qh_shift_hi), bytes(0x30)));
      sc[h] = _mm512_permutexvar_epi16(scale_idx[h], scz);
    }
    for (int j = 0; j < NA; ++j) {
      const BlockQ8_K& ya = A.a[j][i];
      __m512i sumi = sub16_scaled_sums(u, sc, ya.qs);
      sumi = _mm512_dpwssd_epi32(sumi, _mm512_zextsi256_si512(load256(ya.bsums)), corr);
      A.acc[j] = _mm512_fmadd_ps(_mm512_set1_ps(dw * ya.d), _mm512_cvtepi32_ps(sumi), A.acc[j]);
    }
  }
  A.finish(out);
}

// Q2_K and Q3_K, in Q6_K's steps: a step's two 256-bit halves are two bit positions of the same 32 level
// bytes, so one dup256 and per-half shift counts give it; the activations of a step are 64 consecutive bytes.
// Q2_K: levels 0..3 (|sum of 4| <= 4 * 3 * 127) with 4-bit scales; the mins term, dmin * m_k * bsum_k, is an
// int16 dot of its own taken in floats after the scaled sums (as the AVX2 kernel does: two FMAs a super-block).
template <int NA>
void k_q2_k(const void* wv, const void* const* av, int64_t n, float* out) {
  const auto* w = static_cast<const BlockQ2_K*>(wv);
  KActs<NA> A(av);
  const __m512i shift_lo = halves16(0, 2);  // step 2h: bits 0-1 / 2-3 of qs[32h..32h+31]
  const __m512i shift_hi = halves16(4, 6);  // step 2h + 1: bits 4-5 / 6-7
  const __m512i scale_idx[2] = {sub16_scale_index(0), sub16_scale_index(1)};
  for (int64_t i = 0; i < n / kQKK; ++i) {
    const BlockQ2_K& b = w[i];
    const __m128i sm = load128(b.scales);
    const __m512i scz = _mm512_zextsi256_si512(_mm256_cvtepu8_epi16(_mm_and_si128(sm, _mm_set1_epi8(0x0F))));
    const __m256i mins16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sm, 4), _mm_set1_epi8(0x0F)));
    __m512i u[4], sc[2];
    for (int h = 0; h < 2; ++h) {
      const __m512i q = dup256(b.qs + 32 * h);
      u[2 * h] = _mm512_and_si512(_mm512_srlv_epi16(q, shift_lo), bytes(3));
      u[2 * h + 1] = _mm512_and_si512(_mm512_srlv_epi16(q, shift_hi), bytes(3));
      sc[h] = _mm512_permutexvar_epi16(scale_idx[h], scz);
    }
    const float dw = f16(b.d), dm = f16(b.dmin);
    for (int j = 0; j < NA; ++j) {
      const BlockQ8_K& ya = A.a[j][i];
      __m512i sumi = sub16_scaled_sums(u, sc, ya.qs);
      const __m512i msum = _mm512_zextsi256_si512(_mm256_madd_epi16(mins16, load256(ya.bsums)));
      A.acc[j] = _mm512_fmadd_ps(_mm512_set1_ps(dw * ya.d), _mm512_cvtepi32_ps(sumi), A.acc[j]);
      A.acc[j] = _mm512_fnmadd_ps(_mm512_set1_ps(dm * ya.d), _mm512_cvtepi32_ps(msum), A.acc[j]);
    }
  }
  A.finish(out);
}

// The 16 signed 6-bit scales of a Q3_K block (-32..31) as bytes, from its 12 scale bytes: scale k < 8 has
// its low 4 bits in byte k % 8 (low nibble for k < 8, high for k >= 8) and its top 2 bits in byte 8 + k % 4,
// bits 2 * (k / 4) .. + 1.
inline __m128i q3k_scales(const uint8_t* s) {
  uint32_t v[3];
  std::memcpy(v, s, 12);
  const uint32_t lo4 = 0x0F0F0F0Fu, lo2 = 0x03030303u;
  const __m128i sc = _mm_setr_epi32((int)((v[0] & lo4) | ((v[2] & lo2) << 4)), (int)((v[1] & lo4) | (((v[2] >> 2) & lo2) << 4)),
                                    (int)(((v[0] >> 4) & lo4) | (((v[2] >> 4) & lo2) << 4)),
                                    (int)(((v[1] >> 4) & lo4) | (((v[2] >> 6) & lo2) << 4)));
  return _mm_sub_epi8(sc, _mm_set1_epi8(32));
}

// Q3_K: levels q2 + 4 * hbit (0..7, |sum of 4| <= 4 * 7 * 127; hbit of element 128h + 32k + l: bit 4h + k of
// hmask[l]) with signed scales; the "- 4" of every element is taken out through the activation block sums
// (one vpdpwssd with -4 * scale, as Q6_K's "- 32").
template <int NA>
void k_q3_k(const void* wv, const void* const* av, int64_t n, float* out) {
  const auto* w = static_cast<const BlockQ3_K*>(wv);
  KActs<NA> A(av);
  const __m512i shift_lo = halves16(0, 2), shift_hi = halves16(4, 6);
  const __m512i scale_idx[2] = {sub16_scale_index(0), sub16_scale_index(1)};
  __m512i hbit_shift[4];  // step 2h + v: hmask bits 4h + 2v and 4h + 2v + 1 to bit 0
  for (int h = 0; h < 2; ++h)
    for (int v = 0; v < 2; ++v) hbit_shift[2 * h + v] = halves16(4 * h + 2 * v, 4 * h + 2 * v + 1);
  for (int64_t i = 0; i < n / kQKK; ++i) {
    const BlockQ3_K& b = w[i];
    const __m256i sc16 = _mm256_cvtepi8_epi16(q3k_scales(b.scales));
    const __m512i scz = _mm512_zextsi256_si512(sc16);
    const __m512i corr = _mm512_zextsi256_si512(_mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(sc16, 2)));
    const __m512i hm = dup256(b.hmask);
    const float dw = f16(b.d);
    __m512i u[4], sc[2];
    for (int h = 0; h < 2; ++h) {
      const __m512i q = dup256(b.qs + 32 * h);
      for (int v = 0; v < 2; ++v) {
        const __m512i q2 = _mm512_and_si512(_mm512_srlv_epi16(q, v ? shift_hi : shift_lo), bytes(3));
        const __m512i hb = _mm512_and_si512(_mm512_srlv_epi16(hm, hbit_shift[2 * h + v]), bytes(1));
        u[2 * h + v] = _mm512_or_si512(q2, _mm512_slli_epi16(hb, 2));
      }
      sc[h] = _mm512_permutexvar_epi16(scale_idx[h], scz);
    }
    for (int j = 0; j < NA; ++j) {
      const BlockQ8_K& ya = A.a[j][i];
      __m512i sumi = sub16_scaled_sums(u, sc, ya.qs);
      sumi = _mm512_dpwssd_epi32(sumi, _mm512_zextsi256_si512(load256(ya.bsums)), corr);
      A.acc[j] = _mm512_fmadd_ps(_mm512_set1_ps(dw * ya.d), _mm512_cvtepi32_ps(sumi), A.acc[j]);
    }
  }
  A.finish(out);
}

// ---- 32-element signed blocks, Q8_0 activations, through an activation panel ----
// Panel row of one activation row of nb blocks: np = ceil(nb / 2) steps, each 64 bytes of a + 128
// (two blocks; a missing second block as a = 0) and 16 floats [da0 x 8, da1 x 8] (da1 = 0 if missing).
struct PanelLayout {
  int64_t nb, np;
  size_t bytes_per_row() const { return (size_t)np * 128; }
};

void write_panel_row(const BlockQ8_0* a, const PanelLayout& L, uint8_t* dst) {
  uint8_t* q = dst;
  float* s = reinterpret_cast<float*>(dst + L.np * 64);
  for (int64_t p = 0; p < L.np; ++p) {
    const int64_t b0 = 2 * p, b1 = 2 * p + 1;
    const __m256i lo = _mm256_xor_si256(load256(a[b0].qs), _mm256_set1_epi8((char)0x80));
    const __m256i hi = b1 < L.nb ? _mm256_xor_si256(load256(a[b1].qs), _mm256_set1_epi8((char)0x80))
                                 : _mm256_set1_epi8((char)0x80);
    _mm512_storeu_si512(q + 64 * p, _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1));
    const __m512 sv = _mm512_insertf32x8(_mm512_set1_ps(f16(a[b0].d)), _mm256_set1_ps(b1 < L.nb ? f16(a[b1].d) : 0.f), 1);
    _mm512_storeu_ps(s + 16 * p, sv);
  }
}

// Two weight blocks decoded to 64 signed bytes (a missing second block as zeros) and their scales.
template <typename Block, typename Decode>
inline void weight_pair(const Block* w, int64_t b0, int64_t nb, Decode decode, __m512i* q, __m512* dw) {
  const bool two = b0 + 1 < nb;
  *q = decode(w[b0], two ? &w[b0 + 1] : nullptr);
  *dw = _mm512_insertf32x8(_mm512_set1_ps(f16(w[b0].d)), _mm256_set1_ps(two ? f16(w[b0 + 1].d) : 0.f), 1);
}

template <int NA, typename Block, typename Decode>
void dot_signed32(const void* wv, const uint8_t* const* panel, const PanelLayout& L, float* out, Decode decode) {
  const auto* w = static_cast<const Block*>(wv);
  __m512 acc[NA];
  for (int j = 0; j < NA; ++j) acc[j] = _mm512_setzero_ps();
  for (int64_t p = 0; p < L.np; ++p) {
    __m512i q;
    __m512 dw;
    weight_pair(w, 2 * p, L.nb, decode, &q, &dw);
    // -128 * (sum of the lane's 4 weights): with activations stored as a + 128 the products sum to a . w.
    const __m512i init = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), bytes(0x80), q));
    for (int j = 0; j < NA; ++j) {
      const __m512i s = _mm512_dpbusd_epi32(init, load512(panel[j] + 64 * p), q);
      const __m512 scale = _mm512_mul_ps(dw, _mm512_loadu_ps(reinterpret_cast<const float*>(panel[j] + L.np * 64) + 16 * p));
      acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), scale, acc[j]);
    }
  }
  for (int j = 0; j < NA; ++j) out[j] = _mm512_reduce_add_ps(acc[j]);
}

// Q4_1 and Q5_1 (Q8_1 activations), through a panel of their own: per step of two blocks, 64 activation bytes
// as they are (the levels are unsigned and the activations signed, so vpdpbusd needs no correction), 16 floats
// [da0 x 8, da1 x 8] and 16 floats of the offsets' activation term [da0 * sum0 / 8 x 8, da1 * sum1 / 8 x 8]
// (an eighth on each of a block's 8 lanes: exact, a power of two), so a step and activation row is one
// vpdpbusd and two FMAs, the offset m * da * sum summed in the lanes with the products.
struct OffsetPanelLayout {
  int64_t nb, np;
  size_t bytes_per_row() const { return (size_t)np * 192; }
};

void write_offset_panel_row(const ActBlockQ8_1* a, const OffsetPanelLayout& L, uint8_t* dst) {
  float* s = reinterpret_cast<float*>(dst + L.np * 64);
  float* o = s + L.np * 16;
  for (int64_t p = 0; p < L.np; ++p) {
    const int64_t b0 = 2 * p, b1 = 2 * p + 1;
    const bool two = b1 < L.nb;  // a missing second block: zero activations and scales
    const __m256i hi = two ? load256(a[b1].qs) : _mm256_setzero_si256();
    _mm512_storeu_si512(dst + 64 * p, _mm512_inserti64x4(_mm512_castsi256_si512(load256(a[b0].qs)), hi, 1));
    const float d0 = f16(a[b0].d), d1 = two ? f16(a[b1].d) : 0.0f;
    _mm512_storeu_ps(s + 16 * p, _mm512_insertf32x8(_mm512_set1_ps(d0), _mm256_set1_ps(d1), 1));
    const float t0 = d0 * (float)a[b0].sum * 0.125f, t1 = two ? d1 * (float)a[b1].sum * 0.125f : 0.0f;
    _mm512_storeu_ps(o + 16 * p, _mm512_insertf32x8(_mm512_set1_ps(t0), _mm256_set1_ps(t1), 1));
  }
}

template <int NA, typename Block, typename Decode>
void dot_offset32(const void* wv, const uint8_t* const* panel, const OffsetPanelLayout& L, float* out, Decode decode) {
  const auto* w = static_cast<const Block*>(wv);
  __m512 acc[NA];
  for (int j = 0; j < NA; ++j) acc[j] = _mm512_setzero_ps();
  for (int64_t p = 0; p < L.np; ++p) {
    const int64_t b0 = 2 * p, b1 = 2 * p + 1;
    const bool two = b1 < L.nb;
    const __m512i u = decode(w[b0], two ? &w[b1] : nullptr);
    const __m512 dw = _mm512_insertf32x8(_mm512_set1_ps(f16(w[b0].d)), _mm256_set1_ps(two ? f16(w[b1].d) : 0.0f), 1);
    const __m512 m = _mm512_insertf32x8(_mm512_set1_ps(f16(w[b0].m)), _mm256_set1_ps(two ? f16(w[b1].m) : 0.0f), 1);
    for (int j = 0; j < NA; ++j) {
      const float* s = reinterpret_cast<const float*>(panel[j] + L.np * 64) + 16 * p;
      const __m512i sum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, load512(panel[j] + 64 * p));
      acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(dw, _mm512_loadu_ps(s)), acc[j]);
      acc[j] = _mm512_fmadd_ps(m, _mm512_loadu_ps(s + L.np * 16), acc[j]);
    }
  }
  for (int j = 0; j < NA; ++j) out[j] = _mm512_reduce_add_ps(acc[j]);
}

constexpr long long kNib = 0x0004000400040004ll;  // four int16 shift counts of 4

// 16 bytes of nibbles of each of two blocks as 64 levels in element order: [b0 low nibbles (elements
// 0-15), b0 high (16-31), b1 low, b1 high].
inline __m512i nibbles64(const uint8_t* q0, const uint8_t* q1) {
  const __m256i both = _mm256_inserti128_si256(_mm256_castsi128_si256(load128(q0)), q1 ? load128(q1) : _mm_setzero_si128(), 1);
  const __m512i dup = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 1, 0, 1, 2, 3, 2, 3), _mm512_zextsi256_si512(both));
  return _mm512_and_si512(_mm512_srlv_epi16(dup, _mm512_setr_epi64(0, 0, kNib, kNib, 0, 0, kNib, kNib)), bytes(0x0F));
}

struct DecodeQ8_0 {
  __m512i operator()(const BlockQ8_0& b0, const BlockQ8_0* b1) const {
    return _mm512_inserti64x4(_mm512_castsi256_si512(load256(b0.qs)), b1 ? load256(b1->qs) : _mm256_setzero_si256(), 1);
  }
};
struct DecodeQ4_0 {
  __m512i operator()(const BlockQ4_0& b0, const BlockQ4_0* b1) const {
    const __m512i u = nibbles64(b0.qs, b1 ? b1->qs : nullptr);
    // a missing second block decodes as 0 - 8 here; its scale is 0, so it adds nothing.
    return _mm512_sub_epi8(u, bytes(8));
  }
};
struct DecodeQ5_0 {
  __m512i operator()(const BlockQ5_0& b0, const BlockQ5_0* b1) const {
    uint32_t h0, h1 = 0;
    std::memcpy(&h0, b0.qh, 4);
    if (b1) std::memcpy(&h1, b1->qh, 4);
    const __m512i u = nibbles64(b0.qs, b1 ? b1->qs : nullptr);
    // value - 16: bit e of qh is element e's fifth bit.
    return _mm512_mask_sub_epi8(u, (__mmask64)~((uint64_t)h0 | ((uint64_t)h1 << 32)), u, bytes(16));
  }
};
struct DecodeQ4_1 {
  __m512i operator()(const BlockQ4_1& b0, const BlockQ4_1* b1) const { return nibbles64(b0.qs, b1 ? b1->qs : nullptr); }
};
struct DecodeQ5_1 {
  __m512i operator()(const BlockQ5_1& b0, const BlockQ5_1* b1) const {
    uint32_t h0, h1 = 0;
    std::memcpy(&h0, b0.qh, 4);
    if (b1) std::memcpy(&h1, b1->qh, 4);
    const __m512i u = nibbles64(b0.qs, b1 ? b1->qs : nullptr);
    // + 16: bit e of qh is element e's fifth bit.
    return _mm512_mask_add_epi8(u, (__mmask64)((uint64_t)h0 | ((uint64_t)h1 << 32)), u, bytes(16));
  }
};
struct DecodeIQ4_NL {
  __m512i operator()(const BlockIQ4_NL& b0, const BlockIQ4_NL* b1) const {
    const __m512i lut = _mm512_broadcast_i32x4(load128(kIQ4NLValues));
    return _mm512_shuffle_epi8(lut, nibbles64(b0.qs, b1 ? b1->qs : nullptr));
  }
};

// IQ4_XS (Q8_K activations): 8 sub-blocks of 32 with signed 6-bit scales and IQ4_NL's table of levels. Step p
// (64 elements) is sub-blocks 2p and 2p + 1 as nibbles64 lays them out; as in the AVX2 kernel each product
// takes |w| (unsigned) times the activation with w's sign (a masked negation: AVX-512 has no vpsignb),
// maddubs gives exact int16 pairs (|pair| <= 2 * 127 * 128) and one vpdpwssd weights them by the scales.
template <int NA>
void k_iq4_xs(const void* wv, const void* const* av, int64_t n, float* out) {
  const auto* w = static_cast<const BlockIQ4_XS*>(wv);
  KActs<NA> A(av);
  const __m512i lut = _mm512_broadcast_i32x4(load128(kIQ4NLValues));
  for (int64_t i = 0; i < n / kQKK; ++i) {
    const BlockIQ4_XS& b = w[i];
    __m512i sumi[NA];
    for (int j = 0; j < NA; ++j) sumi[j] = _mm512_setzero_si512();
    for (int p = 0; p < 4; ++p) {
      const __m512i v = _mm512_shuffle_epi8(lut, nibbles64(b.qs + 32 * p, b.qs + 32 * p + 16));
      const __m512i av_abs = _mm512_abs_epi8(v);
      const __mmask64 neg = _mm512_movepi8_mask(v);
      const int ls0 = ((b.scales_l[p] & 0xF) | (((b.scales_h >> (4 * p)) & 3) << 4)) - 32;
      const int ls1 = ((b.scales_l[p] >> 4) | (((b.scales_h >> (4 * p + 2)) & 3) << 4)) - 32;
      const __m512i sc = _mm512_inserti64x4(_mm512_set1_epi16((short)ls0), _mm256_set1_epi16((short)ls1), 1);
      for (int j = 0; j < NA; ++j) {
        const __m512i y = load512(A.a[j][i].qs + 64 * p);
        const __m512i ys = _mm512_mask_sub_epi8(y, neg, _mm512_setzero_si512(), y);
        sumi[j] = _mm512_dpwssd_epi32(sumi[j], _mm512_maddubs_epi16(av_abs, ys), sc);
      }
    }
    const float dw = f16(b.d);
    for (int j = 0; j < NA; ++j)
      A.acc[j] = _mm512_fmadd_ps(_mm512_set1_ps(dw * A.a[j][i].d), _mm512_cvtepi32_ps(sumi[j]), A.acc[j]);
  }
  A.finish(out);
}

// ---- tile drivers ----

using KFn = void (*)(const void* w, const void* const* a, int64_t n, float* out);

// K-quants: weight row by weight row, activation rows in groups of up to 8.
template <KFn K1, KFn K2, KFn K3, KFn K4, KFn K5, KFn K6, KFn K7, KFn K8>
void tile_k(const void* w, size_t w_stride, int n_w, const void* a, size_t a_stride, int n_a, int64_t n, float* y,
            size_t ldy) {
  static constexpr KFn kFns[kMaxNA + 1] = {nullptr, K1, K2, K3, K4, K5, K6, K7, K8};
  const auto* ab = static_cast<const uint8_t*>(a);
  for (int c = 0; c < n_a; c += kMaxNA) {
    const int na = n_a - c < kMaxNA ? n_a - c : kMaxNA;
    const void* p[kMaxNA];
    for (int j = 0; j < na; ++j) p[j] = ab + (size_t)(c + j) * a_stride;
    for (int r = 0; r < n_w; ++r) {
      float out[kMaxNA];
      kFns[na](static_cast<const uint8_t*>(w) + (size_t)r * w_stride, p, n, out);
      for (int j = 0; j < na; ++j) y[(size_t)(c + j) * ldy + r] = out[j];
    }
  }
}

template <KFn K1>
float single(const void* w, const void* a, int64_t n) {
  const void* p[1] = {a};
  float out;
  K1(w, p, n, &out);
  return out;
}

// 32-element types: the activation rows of this call as a panel (thread-local scratch), then weight
// row by weight row with activation rows in groups of up to 8. A family gives the panel's layout and row
// writer (ActBlock: its activation block type) and the kernel over NA panel rows.
template <typename Family>
struct PanelTile {
  using Layout = typename Family::Layout;
  static void tile(const void* w, size_t w_stride, int n_w, const void* a, size_t a_stride, int n_a, int64_t n,
                   float* y, size_t ldy) {
    using PFn = void (*)(const void*, const uint8_t* const*, const Layout&, float*);
    static constexpr PFn kFns[kMaxNA + 1] = {nullptr, Family::template run<1>, Family::template run<2>, Family::template run<3>,
                                             Family::template run<4>, Family::template run<5>, Family::template run<6>,
                                             Family::template run<7>, Family::template run<8>};
    const Layout L{n / kQK, (n / kQK + 1) / 2};
    thread_local std::vector<uint8_t> scratch;
    const size_t row_bytes = L.bytes_per_row();
    if (scratch.size() < row_bytes * (size_t)n_a + 64) scratch.resize(row_bytes * (size_t)n_a + 64);
    uint8_t* base = scratch.data() + ((64 - (reinterpret_cast<uintptr_t>(scratch.data()) & 63)) & 63);
    const auto* ab = static_cast<const uint8_t*>(a);
    for (int c = 0; c < n_a; ++c)
      Family::write_row(reinterpret_cast<const typename Family::ActBlock*>(ab + (size_t)c * a_stride), L, base + (size_t)c * row_bytes);
    for (int c = 0; c < n_a; c += kMaxNA) {
      const int na = n_a - c < kMaxNA ? n_a - c : kMaxNA;
      const uint8_t* p[kMaxNA];
      for (int j = 0; j < na; ++j) p[j] = base + (size_t)(c + j) * row_bytes;
      for (int r = 0; r < n_w; ++r) {
        float out[kMaxNA];
        kFns[na](static_cast<const uint8_t*>(w) + (size_t)r * w_stride, p, L, out);
        for (int j = 0; j < na; ++j) y[(size_t)(c + j) * ldy + r] = out[j];
      }
    }
  }
  static float single(const void* w, const void* a, int64_t n) {
    float out;
    tile(w, 0, 1, a, 0, 1, n, &out, 1);
    return out;
  }
};

// Signed levels (Q4_0, Q5_0, Q8_0, IQ4_NL) with Q8_0 activations.
template <typename Block, typename Decode>
struct Signed32 {
  using Layout = PanelLayout;
  using ActBlock = BlockQ8_0;
  static void write_row(const BlockQ8_0* a, const PanelLayout& L, uint8_t* dst) { write_panel_row(a, L, dst); }
  template <int NA>
  static void run(const void* w, const uint8_t* const* panel, const PanelLayout& L, float* out) {
    dot_signed32<NA, Block>(w, panel, L, out, Decode{});
  }
};

// Unsigned levels with an offset (Q4_1, Q5_1) with Q8_1 activations.
template <typename Block, typename Decode>
struct Offset32 {
  using Layout = OffsetPanelLayout;
  using ActBlock = ActBlockQ8_1;
  static void write_row(const ActBlockQ8_1* a, const OffsetPanelLayout& L, uint8_t* dst) { write_offset_panel_row(a, L, dst); }
  template <int NA>
  static void run(const void* w, const uint8_t* const* panel, const OffsetPanelLayout& L, float* out) {
    dot_offset32<NA, Block>(w, panel, L, out, Decode{});
  }
};

}  // namespace

namespace detail {

#define ROOFLINE_AVX512_K_KERNELS(X) \
  X(Q2_K, k_q2_k)                    \
  X(Q3_K, k_q3_k)                    \
  X(Q6_K, k_q6_k)                    \
  X(IQ4_XS, k_iq4_xs)
#define ROOFLINE_AVX512_K4_KERNELS(X) \
  X(Q4_K, false, BlockQ4_K)           \
  X(Q5_K, true, BlockQ5_K)
using PanelQ4_0 = PanelTile<Signed32<BlockQ4_0, DecodeQ4_0>>;
using PanelQ5_0 = PanelTile<Signed32<BlockQ5_0, DecodeQ5_0>>;
using PanelQ8_0 = PanelTile<Signed32<BlockQ8_0, DecodeQ8_0>>;
using PanelIQ4_NL = PanelTile<Signed32<BlockIQ4_NL, DecodeIQ4_NL>>;
using PanelQ4_1 = PanelTile<Offset32<BlockQ4_1, DecodeQ4_1>>;
using PanelQ5_1 = PanelTile<Offset32<BlockQ5_1, DecodeQ5_1>>;
#define ROOFLINE_AVX512_PANEL_KERNELS(X) \
  X(Q4_0, PanelQ4_0)                     \
  X(Q5_0, PanelQ5_0)                     \
  X(Q8_0, PanelQ8_0)                     \
  X(IQ4_NL, PanelIQ4_NL)                 \
  X(Q4_1, PanelQ4_1)                     \
  X(Q5_1, PanelQ5_1)

VecDotFn avx512_dot(DType t) {
  switch (t) {
#define X(type, fn) \
  case DType::type: return single<fn<1>>;
    ROOFLINE_AVX512_K_KERNELS(X)
#undef X
#define X(type, high, block) \
  case DType::type: return TileK4<high, block>::single;
    ROOFLINE_AVX512_K4_KERNELS(X)
#undef X
#define X(type, panel) \
  case DType::type: return panel::single;
    ROOFLINE_AVX512_PANEL_KERNELS(X)
#undef X
    default: return nullptr;
  }
}

VecDotTileFn avx512_tile(DType t) {
  switch (t) {
#define X(type, fn) \
  case DType::type: return tile_k<fn<1>, fn<2>, fn<3>, fn<4>, fn<5>, fn<6>, fn<7>, fn<8>>;
    ROOFLINE_AVX512_K_KERNELS(X)
#undef X
#define X(type, high, block) \
  case DType::type: return TileK4<high, block>::tile;
    ROOFLINE_AVX512_K4_KERNELS(X)
#undef X
#define X(type, panel) \
  case DType::type: return panel::tile;
    ROOFLINE_AVX512_PANEL_KERNELS(X)
#undef X
    default: return avx512_float_tile(t);
  }
}

#undef ROOFLINE_AVX512_K_KERNELS
#undef ROOFLINE_AVX512_K4_KERNELS
#undef ROOFLINE_AVX512_PANEL_KERNELS

}  // namespace detail
}  // namespace roofline::cpu

#include "backend/cpu/avx512_region_end.h"

namespace roofline::cpu::detail {
// F16C is not asked separately (Clang's builtin does not know the name): every CPU with AVX-512F has it.
bool avx512_supported() {
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                         __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx2") &&
                         __builtin_cpu_supports("fma");
  return ok;
}
}  // namespace roofline::cpu::detail

#else  // not x86-64 GCC/Clang: no AVX-512 kernels, the dispatcher takes the AVX2 or scalar ones

namespace roofline::cpu::detail {
bool avx512_supported() { return false; }
VecDotFn avx512_dot(DType) { return nullptr; }
VecDotTileFn avx512_tile(DType) { return nullptr; }
}  // namespace roofline::cpu::detail

#endif
