// AVX-512 VNNI kernels over packed weights (layout in packed_weights.h): Q4_0, Q8_0, Q4_K, Q5_K and Q6_K
// in groups of 16 interleaved rows. Per block, group and activation row: 8 vpdpbusd (unsigned weight levels x the same 4
// signed activation values broadcast to all lanes, 16 rows x 4 values each), one int32 add, one
// conversion, one scale product and one FMA, for 16 outputs; the weight levels of a block are loaded
// (and for Q4_0 split into nibbles) once and used for up to 8 activation rows. The level offset (8 for
// Q4_0, 128 for Q8_0) comes out through the activation block sum: sum (u - C) a = sum u a - C sum a, so
// the int32 accumulator starts at -C * sum a. Q4_K: the same 8 vpdpbusd per sub-block of 32 (no offset),
// times the sub-block's integer scale (vpmulld) into one exact int32 sum per super-block, which is converted
// once and scaled by d x the activation's scale (as llama.cpp's Q4_K dot does); the 16 rows' 6-bit scales
// and mins are decoded per super-block
// with 128-bit ops on the transposed scale bytes, and the mins term is 4 vpdpwssd of (min pair) x
// (activation sub-block sum pair) per activation row; Q5_K adds each level's fifth bit from its qh chunk. Q6_K: 6-bit levels assembled from the ql and qh
// chunks (4 sub-block rows of 4 values per chunk triple), 4 vpdpbusd per sub-block of 16 starting at
// -32 * (activation sum of the 16), times d * scale as floats. Integer work is exact; the float steps per output are the
// same for any number of activation rows (batch invariance). One-row products (decode) walk several groups side
// by side (groups_dot). Compiled through a target pragma, called only after avx512_supported().
#include <cpuid.h>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "backend/cpu/packed_weights.h"
#include "formats/quant_blocks.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include "backend/cpu/avx512_region_begin.h"
#include "backend/cpu/packed_kernel_common.h"

namespace roofline::cpu {
namespace {

constexpr int kMaxNA = 8;

enum class Kind { Q4_0, Q8_0, Q4_K, Q5_K, Q6_K };

// Bytes of one packed entry (a block of 32 values, or a super-block of 256, of a group's 16 rows; packed_weights.h).
template <Kind K>
constexpr size_t entry_bytes() {
  if constexpr (K == Kind::Q4_0) return 2 * kPackRows + 4 * 64;
  else if constexpr (K == Kind::Q8_0) return 2 * kPackRows + 8 * 64;
  else if constexpr (K == Kind::Q6_K) return 2 * kPackRows + 16 * kPackRows + (32 + 16) * 64;
  else return 4 * kPackRows + kKScaleBytes * kPackRows + (K == Kind::Q5_K ? 8 * 64 : 0) + 32 * 64;
}
// The activation rows as each kind's kernel reads them.
template <Kind K, int NA>
using ActsOf = std::conditional_t<K == Kind::Q4_0 || K == Kind::Q8_0, Rows<NA>, RowsK<NA>>;

// Q4_0 / Q8_0: block b of a group (its entry e) times NA activation rows, added to acc[j] (the 16 outputs of
// activation row j).
template <int NA, bool Q4>
[[gnu::always_inline]] inline void entry_dot(const uint8_t* e, int64_t b, const Rows<NA>& A, __m512* acc) {
  constexpr int32_t kOffset = Q4 ? 8 : 128;
  const __m512i low4 = _mm512_set1_epi8(0x0F);
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

// Q4_K, or Q5_K (kFive: 8 qh chunks before the qs chunks; sub-block k's fifth bits are bit k of each qh byte): one
// super-block entry.
template <int NA, bool kFive>
[[gnu::always_inline]] inline void entry_dot_q4_k(const uint8_t* e, int64_t b, const RowsK<NA>& A, __m512* acc) {
  constexpr size_t kScales = 4 * kPackRows, kHigh = kScales + kKScaleBytes * kPackRows;
  constexpr size_t kLevels = kHigh + (kFive ? 8 * 64 : 0);
  const __m512i bit4 = _mm512_set1_epi8(0x10);
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(e)));
  const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(e + 2 * kPackRows)));
  __m128i sc[8], mn[8];  // sub-block k's 6-bit scale and min of row i in byte i
  decode_k4_scales(e + kScales, sc, mn);
  __m512i isum[NA];  // the super-block's sum over sub-blocks of scale x level sum, exact (< 2^26)
  for (int j = 0; j < NA; ++j) isum[j] = _mm512_setzero_si512();
  const uint8_t* lv = e + kLevels;
  for (int k = 0; k < 8; ++k) {  // sub-block k: chunks 8 (k / 2) + t, low nibbles for even k
    const __m512i sc32 = _mm512_cvtepu8_epi32(sc[k]);
    __m512i w[8];
    for (int t = 0; t < 8; ++t) {
      const __m512i v = _mm512_loadu_si512(lv + 64 * (8 * (k / 2) + t));
      w[t] = _mm512_and_si512(k % 2 ? _mm512_srli_epi16(v, 4) : v, low4);
      if constexpr (kFive) {  // bit k of each qh byte to bit 4 (16-bit shifts: the mask keeps each byte's own bit)
        const __m512i h = _mm512_loadu_si512(e + kHigh + 64 * t);
        const __m512i moved = k < 4 ? _mm512_slli_epi16(h, 4 - k) : _mm512_srli_epi16(h, k - 4);
        w[t] = _mm512_or_si512(w[t], _mm512_and_si512(moved, bit4));
      }
    }
    for (int j = 0; j < NA; ++j) {
      const int8_t* q = A.q[j][b].qs + 32 * k;
      __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
      for (int t = 0; t < 8; t += 2) {
        s0 = _mm512_dpbusd_epi32(s0, w[t], _mm512_set1_epi32(load32(q + 4 * t)));
        s1 = _mm512_dpbusd_epi32(s1, w[t + 1], _mm512_set1_epi32(load32(q + 4 * t + 4)));
      }
      isum[j] = _mm512_add_epi32(isum[j], _mm512_mullo_epi32(_mm512_add_epi32(s0, s1), sc32));
    }
  }
  // Mins as int16 pairs (m of sub-blocks 2p and 2p + 1 of each row) against the activation's pairs of sums.
  __m512i mpair[4];
  for (int p = 0; p < 4; ++p)
    mpair[p] = _mm512_cvtepu8_epi16(
        _mm256_set_m128i(_mm_unpackhi_epi8(mn[2 * p], mn[2 * p + 1]), _mm_unpacklo_epi8(mn[2 * p], mn[2 * p + 1])));
  for (int j = 0; j < NA; ++j) {
    const int16_t* ss = A.sums[j][b].sub;
    __m512i mins = _mm512_setzero_si512();
    for (int p = 0; p < 4; ++p) mins = _mm512_dpwssd_epi32(mins, mpair[p], _mm512_set1_epi32(load32(ss + 2 * p)));
    const __m512 da = _mm512_set1_ps(A.q[j][b].d);
    acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[j]), _mm512_mul_ps(d, da), acc[j]);
    acc[j] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(mins), _mm512_mul_ps(dmin, da), acc[j]);
  }
}

// Q6_K. For half h and chunk u (elements 4u .. 4u + 3 of each 32-element quarter), the ql chunks A =
// 16h + u and B = 16h + 8 + u and the qh chunk C = 8h + u hold quarter 0: A low | C bits 0-1, quarter 1:
// B low | C bits 2-3, quarter 2: A high | C bits 4-5, quarter 3: B high | C bits 6-7. Quarter g of half
// h, chunks u = 4v .. 4v + 3, is sub-block 8h + 2g + v. The packed entry holds the chunks of each (h, v)
// together, in reading order (q6_packed_chunk).
// The 6-bit levels of quarter g from chunk triple (A, B, C) of (h, v, t), in bits 0-5 of each byte.
inline __m512i q6_levels(const uint8_t* lv, int h, int v, int g, int t) {
  const __m512i low4 = _mm512_set1_epi8(0x0F), bits45 = _mm512_set1_epi8(0x30);
  const __m512i ql = _mm512_loadu_si512(lv + 64 * q6_packed_chunk(h, v, g & 1, t));
  const __m512i qh = _mm512_loadu_si512(lv + 64 * q6_packed_chunk(h, v, 2, t));
  const __m512i lo = _mm512_and_si512(g < 2 ? ql : _mm512_srli_epi16(ql, 4), low4);
  __m512i hi;  // the two high bits of quarter g moved to bits 4-5
  switch (g) {
    case 0: hi = _mm512_slli_epi16(qh, 4); break;
    case 1: hi = _mm512_slli_epi16(qh, 2); break;
    case 2: hi = qh; break;
    default: hi = _mm512_srli_epi16(qh, 2); break;
  }
  return _mm512_or_si512(lo, _mm512_and_si512(hi, bits45));
}

// The 6-bit levels of the four quarters from one chunk triple (fewer loads and shifts, more registers).
inline void q6_quarters(const uint8_t* lv, int h, int v, int t, __m512i* w0, __m512i* w1, __m512i* w2, __m512i* w3) {
  const __m512i low4 = _mm512_set1_epi8(0x0F), bits45 = _mm512_set1_epi8(0x30);
  const __m512i a = _mm512_loadu_si512(lv + 64 * q6_packed_chunk(h, v, 0, t));
  const __m512i b = _mm512_loadu_si512(lv + 64 * q6_packed_chunk(h, v, 1, t));
  const __m512i c = _mm512_loadu_si512(lv + 64 * q6_packed_chunk(h, v, 2, t));
  *w0 = _mm512_or_si512(_mm512_and_si512(a, low4), _mm512_and_si512(_mm512_slli_epi16(c, 4), bits45));
  *w1 = _mm512_or_si512(_mm512_and_si512(b, low4), _mm512_and_si512(_mm512_slli_epi16(c, 2), bits45));
  *w2 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(a, 4), low4), _mm512_and_si512(c, bits45));
  *w3 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(b, 4), low4), _mm512_and_si512(_mm512_srli_epi16(c, 2), bits45));
}


template <int NA>
[[gnu::always_inline]] inline void entry_dot_q6_k(const uint8_t* e, int64_t b, const RowsK<NA>& A, __m512* acc) {
  constexpr size_t kScales = 2 * kPackRows, kLevels = kScales + 16 * kPackRows;
  const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(e)));
  const uint8_t* lv = e + kLevels;
  __m512 sub_acc[NA];
  for (int j = 0; j < NA; ++j) sub_acc[j] = _mm512_setzero_ps();
  for (int h = 0; h < 2; ++h) {
    for (int v = 0; v < 2; ++v) {
      // [quarter g][chunk t]: sub-block 8h + 2g + v. One or two activation rows (decode): all four
      // quarters from each triple at once; more rows: a quarter at a time, which keeps the
      // accumulators of 8 rows in registers. The same operations per output either way.
      __m512i w[4][4];
      if constexpr (NA <= 2)
        for (int t = 0; t < 4; ++t) q6_quarters(lv, h, v, t, &w[0][t], &w[1][t], &w[2][t], &w[3][t]);
      for (int g = 0; g < 4; ++g) {
        const int sb = 8 * h + 2 * g + v;
        if constexpr (NA > 2)
          for (int t = 0; t < 4; ++t) w[g][t] = q6_levels(lv, h, v, g, t);
        const __m512 dsc = _mm512_mul_ps(
            d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(e + kScales + 16 * sb)))));
        for (int j = 0; j < NA; ++j) {
          const int8_t* q = A.q[j][b].qs + 16 * sb;
          __m512i s0 = _mm512_set1_epi32(A.sums[j][b].minus32[sb]);
          __m512i s1 = _mm512_setzero_si512();
          s0 = _mm512_dpbusd_epi32(s0, w[g][0], _mm512_set1_epi32(load32(q)));
          s1 = _mm512_dpbusd_epi32(s1, w[g][1], _mm512_set1_epi32(load32(q + 4)));
          s0 = _mm512_dpbusd_epi32(s0, w[g][2], _mm512_set1_epi32(load32(q + 8)));
          s1 = _mm512_dpbusd_epi32(s1, w[g][3], _mm512_set1_epi32(load32(q + 12)));
          sub_acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1)), dsc, sub_acc[j]);
        }
      }
    }
  }
  for (int j = 0; j < NA; ++j) acc[j] = _mm512_fmadd_ps(sub_acc[j], _mm512_set1_ps(A.q[j][b].d), acc[j]);
}

// S groups of 16 rows times NA activation rows over nb entries; acc[NA s + j] holds the 16 outputs of group s and
// activation row j. With S > 1 (one activation row: decode) the groups are walked side by side, entry b of each in
// turn: S memory streams a thread instead of one, which the hardware prefetchers follow further ahead (decode_streams
// says where that pays). Each group's arithmetic is that of
// S = 1 in the same order: the same bits whatever S. F: each entry is fetched fetch_config().ahead bytes ahead.
template <Kind K, int NA, int S, bool F>
void groups_dot(const uint8_t* const* groups, int64_t nb, const ActsOf<K, NA>& A, __m512* acc) {
  constexpr size_t kEntry = entry_bytes<K>();
  for (int i = 0; i < S * NA; ++i) acc[i] = _mm512_setzero_ps();
  [[maybe_unused]] const FetchConfig& fc = fetch_config();  // read once, not per entry
  for (int64_t b = 0; b < nb; ++b) {
#pragma GCC unroll 8  // unrolled, so that the accumulators stay in registers (rolled, the compiler kept them on the stack)
    for (int s = 0; s < S; ++s) {
      const uint8_t* e = groups[s] + (size_t)b * kEntry;
      if constexpr (F) prefetch_entry<kEntry>(e + fc.ahead, fc.to_l2);
      if constexpr (K == Kind::Q4_K || K == Kind::Q5_K) entry_dot_q4_k<NA, K == Kind::Q5_K>(e, b, A, acc + NA * s);
      else if constexpr (K == Kind::Q6_K) entry_dot_q6_k<NA>(e, b, A, acc + NA * s);
      else entry_dot<NA, K == Kind::Q4_0>(e, b, A, acc + NA * s);
    }
  }
}

// Streams a thread's one-row decode loop walks side by side: 4 for Q4_0 and Q8_0 (against one, +15-25% on the GPU
// machine's Intel host at 4 threads, where 2 gave +5-10% and 8 about what 4 does, and +25-30% on a Zen 5 core pair,
// where 2 and 4 were level and 8 slower; docs/performance.md), 1 for the K-quants (on the Zen 5 pair, whose Q4_K loop
// already reads at the pair's bandwidth with one, 2 streams are level and 4 slower since the loop over the streams is
// unrolled, and were 20-55% slower before, with the accumulators on the stack; not measured on Intel).
// ROOFLINE_CPU_STREAMS=1, 2, 4 or 8 sets it for every type.
template <Kind K>
int decode_streams() {
  if (detail::decode_streams_for_test > 0) return detail::decode_streams_for_test;
  if (const int env = streams_from_env(); env > 0) return env;
  return K == Kind::Q4_0 || K == Kind::Q8_0 ? 4 : 1;
}

// One group of 16 rows times NA activation rows, stored (the rows `keep` holds) at y, ldy apart.
template <int NA, Kind K, bool F>
void group_rows(const uint8_t* group, int64_t nb, const PackedActs& a, int c0, float* y, size_t ldy, __mmask16 keep) {
  __m512 acc[NA];
  const uint8_t* const groups[1] = {group};
  groups_dot<K, NA, 1, F>(groups, nb, ActsOf<K, NA>(a, c0), acc);
  for (int j = 0; j < NA; ++j) _mm512_mask_storeu_ps(y + (size_t)j * ldy, keep, acc[j]);
}

// Groups [0, n_groups) against one activation row, cut in S contiguous parts walked side by side; the remainder
// (fewer than S groups) one at a time.
template <int S, Kind K, bool F>
void packed_rows_streams(const uint8_t* packed, size_t group_bytes, int n_w, const PackedActs& a, int c0, int64_t nb, float* y) {
  const int n_groups = (n_w + kPackRows - 1) / kPackRows, len = n_groups / S;
  const auto keep_of = [&](int g) {
    const int rows = n_w - g * kPackRows < kPackRows ? n_w - g * kPackRows : kPackRows;
    return (__mmask16)((1u << rows) - 1);
  };
  const ActsOf<K, 1> A(a, c0);
  for (int i = 0; i < len; ++i) {
    const uint8_t* groups[S];
    for (int s = 0; s < S; ++s) groups[s] = packed + (size_t)(s * len + i) * group_bytes;
    __m512 acc[S];
    groups_dot<K, 1, S, F>(groups, nb, A, acc);
    for (int s = 0; s < S; ++s) _mm512_mask_storeu_ps(y + (size_t)(s * len + i) * kPackRows, keep_of(s * len + i), acc[s]);
  }
  for (int g = S * len; g < n_groups; ++g) group_rows<1, K, F>(packed + (size_t)g * group_bytes, nb, a, c0, y + (size_t)g * kPackRows, 0, keep_of(g));
}

template <Kind K>
void packed_tile(const uint8_t* packed, size_t group_bytes, int n_w, const PackedActs& a, int c0, int n_a, int64_t n,
                 float* y, size_t ldy) {
  using Fn = void (*)(const uint8_t*, int64_t, const PackedActs&, int, float*, size_t, __mmask16);
  static constexpr Fn kFns[kMaxNA + 1] = {nullptr,          group_rows<1, K, false>, group_rows<2, K, false>,
                                          group_rows<3, K, false>, group_rows<4, K, false>, group_rows<5, K, false>,
                                          group_rows<6, K, false>, group_rows<7, K, false>, group_rows<8, K, false>};
  static constexpr Fn kFetchFns[3] = {nullptr, group_rows<1, K, true>, group_rows<2, K, true>};
  const bool fetch = fetches(K == Kind::Q4_K || K == Kind::Q5_K ? FetchKind::KQuant4 : FetchKind::Other);
  const int64_t nb = n / (K == Kind::Q4_0 || K == Kind::Q8_0 ? kQK : kQKK);
  if (n_a == 1) {  // decode: the range's groups in up to decode_streams() streams (fewer where it has fewer groups)
    int streams = decode_streams<K>();
    while (streams > 1 && (n_w + kPackRows - 1) / kPackRows < streams) streams /= 2;
    using StreamsFn = void (*)(const uint8_t*, size_t, int, const PackedActs&, int, int64_t, float*);
    static constexpr StreamsFn kStreams[2][4] = {
        {packed_rows_streams<1, K, false>, packed_rows_streams<2, K, false>, packed_rows_streams<4, K, false>, packed_rows_streams<8, K, false>},
        {packed_rows_streams<1, K, true>, packed_rows_streams<2, K, true>, packed_rows_streams<4, K, true>, packed_rows_streams<8, K, true>}};
    const int which = streams == 1 ? 0 : streams == 2 ? 1 : streams == 4 ? 2 : 3;
    kStreams[fetch ? 1 : 0][which](packed, group_bytes, n_w, a, c0, nb, y);
    return;
  }
  for (int g = 0; g * kPackRows < n_w; ++g) {
    const int rows = n_w - g * kPackRows < kPackRows ? n_w - g * kPackRows : kPackRows;
    const __mmask16 keep = (__mmask16)((1u << rows) - 1);
    const uint8_t* group = packed + (size_t)g * group_bytes;
    for (int c = 0; c < n_a; c += kMaxNA) {
      const int na = n_a - c < kMaxNA ? n_a - c : kMaxNA;
      (fetch && na <= 2 ? kFetchFns[na] : kFns[na])(group, nb, a, c0 + c, y + (size_t)c * ldy + (size_t)g * kPackRows, ldy, keep);
    }
  }
}

}  // namespace

namespace detail {
int decode_streams_for_test = 0;
PackedTileFn avx512_packed_tile(DType type) {
  if (!avx512_supported()) return nullptr;
  switch (type) {
    case DType::Q4_0: return packed_tile<Kind::Q4_0>;
    case DType::Q8_0: return packed_tile<Kind::Q8_0>;
    case DType::Q4_K: return packed_tile<Kind::Q4_K>;
    case DType::Q5_K: return packed_tile<Kind::Q5_K>;
    case DType::Q6_K: return packed_tile<Kind::Q6_K>;
    default: return nullptr;
  }
}
}  // namespace detail
}  // namespace roofline::cpu

#include "backend/cpu/avx512_region_end.h"

#else  // not x86-64 GCC/Clang

namespace roofline::cpu::detail {
int decode_streams_for_test = 0;
PackedTileFn avx512_packed_tile(DType) { return nullptr; }
}  // namespace roofline::cpu::detail

#endif
