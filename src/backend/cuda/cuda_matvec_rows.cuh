// The per-warp row products behind every decode matvec (cuda_matvec.cu) and the fused MoE decode
// kernels (cuda_moe_decode.cu): one warp reduces R rows for B token rows with 16-byte loads, int8
// activations and dp4a for the quantized types, float activations otherwise. The *_partials functions
// leave each lane's share in acc (a warp_sum gives the row); the matvec_* wrappers sum and store.
// Whoever reduces a row through these functions gets the same bits as every other caller. Here: Q4_K, Q5_K,
// Q6_K, the float types and the generic kernel; the other types a lane reads 32 values at a time of:
// cuda_matvec_blocks.cuh.
#pragma once

#include "backend/cuda/cuda_dequant.cuh"
#include "backend/cuda/cuda_kernels.cuh"

namespace roofline::cuda {
namespace {
__device__ __forceinline__ int4 ld16(const void* p) { return __ldg(reinterpret_cast<const int4*>(p)); }

__device__ __forceinline__ int dot16(const int4 w, const int4 a, int acc) {
  acc = __dp4a(w.x, a.x, acc);
  acc = __dp4a(w.y, a.y, acc);
  acc = __dp4a(w.z, a.z, acc);
  return __dp4a(w.w, a.w, acc);
}

// Scale and min of sub-block j of a Q4_K/Q5_K super-block from its 12 packed scale bytes, held in
// registers as three words (bytes 0-3, 4-7, 8-11): shifts instead of byte indexing, which with a
// run-time j would put the header in local memory (and its traffic in the L1, this kernel's limit).
__device__ __forceinline__ void k4_scale_min_words(int j, uint32_t lo, uint32_t mid, uint32_t hi, float& sc, float& m) {
  if (j < 4) {
    sc = (float)((lo >> (8 * j)) & 63);
    m = (float)((mid >> (8 * j)) & 63);
  } else {
    const int k = 8 * (j - 4);
    sc = (float)(((hi >> k) & 0xF) | (((lo >> k) >> 6 & 3) << 4));
    m = (float)(((hi >> k) >> 4 & 0xF) | (((mid >> k) >> 6 & 3) << 4));
  }
}

__device__ __forceinline__ void half2_floats(uint32_t bits, float& a, float& b) {
  __half2 h;
  memcpy(&h, &bits, 4);
  a = __low2float(h);
  b = __high2float(h);
}

// The products of one launch (q/k/v, gate/up: one input), their rows laid end to end over the grid's units
// (a warp's rows: cuda_matvec.cu's row shapes, or cuda_matvec_mma.cu's 16-row tiles).
struct MatvecGroup {
  static constexpr int kMax = kMatvecGroupMax;
  DeviceWeight w[kMax];
  float* y[kMax];
  int ldy[kMax];
  int64_t first_unit[kMax + 1];  // member m holds the units [first_unit[m], first_unit[m + 1]) of the grid
  int n = 0;
};
struct MatvecMember {
  DeviceWeight w;
  float* y;
  int ldy;
  int64_t first;  // its first unit
};
// The member holding `unit`, picked with selects (a run-time index into the parameter arrays would copy them
// to local memory).
__device__ __forceinline__ MatvecMember matvec_member(const MatvecGroup& g, int64_t unit) {
  MatvecMember mb;
  mb.w = g.w[0];
  mb.y = g.y[0];
  mb.ldy = g.ldy[0];
  mb.first = 0;
#pragma unroll
  for (int m = 1; m < MatvecGroup::kMax; ++m)
    if (m < g.n && unit >= g.first_unit[m]) {
      mb.w = g.w[m];
      mb.y = g.y[m];
      mb.ldy = g.ldy[m];
      mb.first = g.first_unit[m];
    }
  return mb;
}

// Row `row` of the B token rows; act (int8 activations, or null for float ones) for the row factor.
template <int B>
__device__ __forceinline__ void store_rows(const float (&acc)[B], float* y, int ldy, int64_t row, bool accumulate, int lane,
                                           const ActQ8* act = nullptr) {
#pragma unroll
  for (int t = 0; t < B; ++t) {
    float v = warp_sum(acc[t]);
    if (act && act->row_factor) v *= __ldg(act->row_factor + t);  // 1/rms of a norm's input (ActQ8::row_factor)
    if (lane == 0) {
      float* dst = y + (int64_t)t * ldy + row;
      *dst = accumulate ? *dst + v : v;
    }
  }
}

// The R rows row0.. of a multi-row warp (those below n_rows), int8 activations `act`; F: the activations
// may carry a norm's factor (ActQ8::row_factor; only the kernels compiled for it look).
template <int B, int R, bool F>
__device__ __forceinline__ void store_row_set(const float (&acc)[R][B], float* y, int ldy, int64_t row0, int64_t n_rows,
                                              bool accumulate, int lane, const ActQ8& act) {
#pragma unroll
  for (int r = 0; r < R; ++r)
    if (row0 + r < n_rows) store_rows<B>(acc[r], y, ldy, row0 + r, accumulate, lane, F ? &act : nullptr);
}

// Scale and min of sub-block j (0-7) of a Q4_K super-block without branches (lanes of one warp take
// different j; k4_scale_min_words branches on j < 4).
__device__ __forceinline__ void k4_scale_min_select(int j, uint32_t lo, uint32_t mid, uint32_t hi, float& sc, float& m) {
  const int k = 8 * (j & 3);
  const uint32_t a = lo >> k, b = mid >> k, c = hi >> k;
  const uint32_t sc_lo = a & 63, m_lo = b & 63;
  const uint32_t sc_hi = (c & 0xF) | ((a >> 6 & 3) << 4), m_hi = (c >> 4 & 0xF) | ((b >> 6 & 3) << 4);
  sc = (float)(j < 4 ? sc_lo : sc_hi);
  m = (float)(j < 4 ? m_lo : m_hi);
}

// One super-block's share of a Q4_K row's sum for one token as lane c of its group adds it: sub-blocks 2c and
// 2c + 1 (d, dmin, their 6-bit scales and mins as floats), the activations' steps and step-weighted sums of
// those sub-blocks (ad, as), and the exact integer dot products of their quants with the int8 activations
// (dlo, dhi). Every rounding is spelled out (no contraction left to the compiler), so that a kernel that gets
// the same integer sums another way (matvec_mma's tensor cores, cuda_matvec_mma.cu) gets the same bits.
__device__ __forceinline__ float q4k_lane_term(float acc, float d, float dmin, float sc0, float m0, float sc1, float m1, float2 ad, float2 as,
                                               int dlo, int dhi) {
  const float both = __fmaf_rn(__fmul_rn(sc1, ad.y), (float)dhi, __fmul_rn(__fmul_rn(sc0, ad.x), (float)dlo));
  acc = __fmaf_rn(d, both, acc);
  return __fmaf_rn(-dmin, __fmaf_rn(m1, as.y, __fmul_rn(m0, as.x)), acc);
}

// Q4_K, one token, 4 lanes per super-block: lane c of a group reads the 32 B of quants of chunk c
// (low nibbles: sub-block 2c, high: 2c+1), so the per-lane work that does not scale with the bytes
// (scales, activation scales, the float sums) is spread over twice the bytes of matvec_q4_k. A warp
// takes 8 super-blocks of each of its R rows per round; the activations are loaded once for the R rows.
// P = 2: the next round's weight loads are issued before this round's arithmetic (its registers a
// second set), so a warp's rounds do not each wait a full memory latency in turn; the same arithmetic
// in the same order, so the same bits as P = 1.
template <int R>
struct Q4KRound {
  int4 hdr[R], q0[R], q1[R];
  __device__ __forceinline__ void load(const uint8_t* const (&rowp)[R], int64_t i, int c) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const uint8_t* blk = rowp[r] + i * 144;
      hdr[r] = ld16(blk);
      q0[r] = ld16(blk + 16 + 32 * c);
      q1[r] = ld16(blk + 32 + 32 * c);
    }
  }
};
// A round's weights as lane c uses them: d, dmin, the scales and mins of sub-blocks 2c and 2c + 1 as floats,
// and the quants' low nibbles (sub-block 2c) and high nibbles (2c + 1) as bytes, for each of R rows.
template <int R>
struct Q4KUnpacked {
  float d[R], dmin[R], sc0[R], m0[R], sc1[R], m1[R];
  int4 lo0[R], lo1[R], hi0[R], hi1[R];
  __device__ __forceinline__ Q4KUnpacked(const int4 (&hdr)[R], const int4 (&q0)[R], const int4 (&q1)[R], int c) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      half2_floats((uint32_t)hdr[r].x, d[r], dmin[r]);
      k4_scale_min_select(2 * c, (uint32_t)hdr[r].y, (uint32_t)hdr[r].z, (uint32_t)hdr[r].w, sc0[r], m0[r]);
      k4_scale_min_select(2 * c + 1, (uint32_t)hdr[r].y, (uint32_t)hdr[r].z, (uint32_t)hdr[r].w, sc1[r], m1[r]);
      const int4 a = q0[r], b = q1[r];
      lo0[r] = make_int4(a.x & 0x0F0F0F0F, a.y & 0x0F0F0F0F, a.z & 0x0F0F0F0F, a.w & 0x0F0F0F0F);
      lo1[r] = make_int4(b.x & 0x0F0F0F0F, b.y & 0x0F0F0F0F, b.z & 0x0F0F0F0F, b.w & 0x0F0F0F0F);
      hi0[r] = make_int4((a.x >> 4) & 0x0F0F0F0F, (a.y >> 4) & 0x0F0F0F0F, (a.z >> 4) & 0x0F0F0F0F, (a.w >> 4) & 0x0F0F0F0F);
      hi1[r] = make_int4((b.x >> 4) & 0x0F0F0F0F, (b.y >> 4) & 0x0F0F0F0F, (b.z >> 4) & 0x0F0F0F0F, (b.w >> 4) & 0x0F0F0F0F);
    }
  }
  // Row r's term for one token: the activations x0-x3 (sub-block 2c, then 2c + 1) with their steps and sums.
  __device__ __forceinline__ float term(int r, float acc, int4 x0, int4 x1, int4 x2, int4 x3, float2 ad, float2 as) const {
    const int dlo = dot16(lo1[r], x1, dot16(lo0[r], x0, 0));
    const int dhi = dot16(hi1[r], x3, dot16(hi0[r], x2, 0));
    return q4k_lane_term(acc, d[r], dmin[r], sc0[r], m0[r], sc1[r], m1[r], ad, as, dlo, dhi);
  }
};
template <int B, int R>
__device__ __forceinline__ void q4_k_round(const Q4KRound<R>& in, const DeviceWeight& w, const ActQ8& act, int64_t i, int c, float (&acc)[R][B]) {
  const Q4KUnpacked<R> u(in.hdr, in.q0, in.q1, c);
#pragma unroll
  for (int t = 0; t < B; ++t) {
    const int8_t* x = act.q + (int64_t)t * w.cols + i * 256 + 64 * c;
    const int4 x0 = ld16(x), x1 = ld16(x + 16), x2 = ld16(x + 32), x3 = ld16(x + 48);
    const int64_t s = (int64_t)t * (w.cols / 32) + 8 * i + 2 * c;
    const float2 ad = __ldg(reinterpret_cast<const float2*>(act.d + s));
    const float2 as = __ldg(reinterpret_cast<const float2*>(act.s + s));
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r][t] = u.term(r, acc[r][t], x0, x1, x2, x3, ad, as);
  }
}
template <int B, int R, int P = 1>
__device__ __forceinline__ void matvec_q4_k_partials(const DeviceWeight& w, const ActQ8& act, int64_t row0, int lane, float (&acc)[R][B]) {
  const int g = lane / 4, c = lane % 4;
  const int64_t n_sb = w.cols / 256;
  const uint8_t* rowp[R];
#pragma unroll
  for (int r = 0; r < R; ++r) rowp[r] = w.data + min(row0 + r, w.rows - 1) * w.row_bytes;  // past the end: a repeat, not stored
  if constexpr (P == 1) {
    for (int64_t i = g; i < n_sb; i += 8) {
      Q4KRound<R> cur;
      cur.load(rowp, i, c);
      q4_k_round<B, R>(cur, w, act, i, c, acc);
    }
  } else {
    if (g >= n_sb) return;
    Q4KRound<R> cur;
    cur.load(rowp, g, c);
    for (int64_t i = g; i < n_sb; i += 8) {
      Q4KRound<R> next;
      const bool more = i + 8 < n_sb;
      if (more) next.load(rowp, i + 8, c);
      q4_k_round<B, R>(cur, w, act, i, c, acc);
      if (more) cur = next;
    }
  }
}
template <int B, int R, bool F = false, int P = 1>
__device__ __forceinline__ void matvec_q4_k(const DeviceWeight& w, const ActQ8& act, float* y, int ldy, bool accumulate, int64_t row0, int lane) {
  float acc[R][B] = {};
  matvec_q4_k_partials<B, R, P>(w, act, row0, lane, acc);
  store_row_set<B, R, F>(acc, y, ldy, row0, w.rows, accumulate, lane, act);
}

// Q5_K (176 B): as Q4_K, plus the fifth bit of each quant from qh (bit 2c for low, 2c+1 for high nibbles).
template <int B, bool F = false>
__device__ __forceinline__ void matvec_q5_k(const DeviceWeight& w, const ActQ8& act, float* y, int ldy, bool accumulate, int64_t row, int lane) {
  const int j = lane % 8, c = j / 2, h = j % 2;
  const int64_t n_sb = w.cols / 256;
  const uint8_t* rowp = w.data + row * w.row_bytes;
  float acc[B] = {};
  for (int64_t i = lane / 8; i < n_sb; i += 4) {
    const uint8_t* blk = rowp + i * 176;
    const int4 hdr = ld16(blk);
    const int4 qh = ld16(blk + 16 + 16 * h);
    const int4 qv = ld16(blk + 48 + 16 * j);
    float d, dmin, fsc0, fm0, fsc1, fm1;
    half2_floats((uint32_t)hdr.x, d, dmin);
    k4_scale_min_words(2 * c, (uint32_t)hdr.y, (uint32_t)hdr.z, (uint32_t)hdr.w, fsc0, fm0);
    k4_scale_min_words(2 * c + 1, (uint32_t)hdr.y, (uint32_t)hdr.z, (uint32_t)hdr.w, fsc1, fm1);
    const int s0 = 2 * c, s1 = 2 * c + 1;
    const int4 lo = make_int4((qv.x & 0x0F0F0F0F) | (((qh.x >> s0) & 0x01010101) << 4),
                              (qv.y & 0x0F0F0F0F) | (((qh.y >> s0) & 0x01010101) << 4),
                              (qv.z & 0x0F0F0F0F) | (((qh.z >> s0) & 0x01010101) << 4),
                              (qv.w & 0x0F0F0F0F) | (((qh.w >> s0) & 0x01010101) << 4));
    const int4 hi = make_int4(((qv.x >> 4) & 0x0F0F0F0F) | (((qh.x >> s1) & 0x01010101) << 4),
                              ((qv.y >> 4) & 0x0F0F0F0F) | (((qh.y >> s1) & 0x01010101) << 4),
                              ((qv.z >> 4) & 0x0F0F0F0F) | (((qh.z >> s1) & 0x01010101) << 4),
                              ((qv.w >> 4) & 0x0F0F0F0F) | (((qh.w >> s1) & 0x01010101) << 4));
#pragma unroll
    for (int t = 0; t < B; ++t) {
      const int8_t* a = act.q + (int64_t)t * w.cols + i * 256 + 64 * c + 16 * h;
      const int dlo = dot16(lo, ld16(a), 0), dhi = dot16(hi, ld16(a + 32), 0);
      const int64_t s = (int64_t)t * (w.cols / 32) + 8 * i + 2 * c;
      acc[t] += d * (fsc0 * act.d[s] * (float)dlo + fsc1 * act.d[s + 1] * (float)dhi);
      if (h == 0) acc[t] -= dmin * (fm0 * act.s[s] + fm1 * act.s[s + 1]);
    }
  }
  store_rows<B>(acc, y, ldy, row, accumulate, lane, F ? &act : nullptr);
}

// Q6_K planes (backend/device_planes.h): lane j of a super-block reads 16 B of low nibbles and 8 B of 2-bit highs for elements
// 32j..32j+31 (sub-blocks 2j and 2j+1), 6-bit values q that mean q - 32, for dp4a. The activations
// of each super-block are loaded once for the R rows.
template <int B, int R, int S>
__device__ __forceinline__ void matvec_q6_k_partials(const DeviceWeight& w, const ActQ8& act, int64_t row0, int lane, float (&acc)[R][B]) {
  const int j = lane % 8;
  const int64_t n_sb = w.cols / 256;
  const uint8_t* lo_row[R];
  const uint8_t* hi_row[R];
  const int8_t* sc_row[R];
  const __half* d_row[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t row = min(row0 + r, w.rows - 1);  // past the end: a repeat, not stored
    lo_row[r] = w.data + row * (w.cols / 2);
    hi_row[r] = w.plane1 + row * (w.cols / 4);
    sc_row[r] = reinterpret_cast<const int8_t*>(w.plane2) + row * (w.cols / 16);
    d_row[r] = reinterpret_cast<const __half*>(w.plane3) + row * n_sb;
  }
  // The values are stored q (0-63) and mean q - 32. Up to 4 tokens: dot(q - 32, a) = dot(q, a) - 32 * sum(a), the
  // same integers, with the sums of the activations (per token, shared by the R rows) in place of a byte-wise
  // subtraction per word of each row (three instructions: an OR, an add, an XOR; measured on the H200, tg32: qwen3-8b
  // Q4_K_M 427 against 419, qwen3-32b 131-133 against 129, Q6_K 372 against 360-365); at 8 tokens the sums cost more
  // than the subtractions (qwen3-8b x8 1434-1469 against 1481-1516), so 5-8 tokens subtract.
  constexpr bool kOffsetBySums = B <= 4;
  // One super-block's 32 elements for lane j of each row (low nibbles lo, 2-bit highs hi).
  auto superblock = [&](int64_t i, const int4 (&lo)[R], const int2 (&hi)[R]) {
    float d[R], sc0[R], sc1[R];
    int4 w0[R], w1[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      d[r] = __half2float(d_row[r][i]);
      const short sc = __ldg(reinterpret_cast<const short*>(sc_row[r] + i * 16 + 2 * j));  // the lane's two int8 scales
      sc0[r] = (float)(int8_t)(sc & 0xFF);
      sc1[r] = (float)(int8_t)(sc >> 8);
      const int l[4] = {lo[r].x, lo[r].y, lo[r].z, lo[r].w};
      int* p0 = &w0[r].x;
      int* p1 = &w1[r].x;
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        p0[k] = (l[k] & 0x0F0F0F0F) | (((hi[r].x >> (2 * k)) & 0x03030303) << 4);
        p1[k] = ((l[k] >> 4) & 0x0F0F0F0F) | (((hi[r].y >> (2 * k)) & 0x03030303) << 4);
        if constexpr (!kOffsetBySums) {
          p0[k] = (int)__vsub4((unsigned)p0[k], 0x20202020u);
          p1[k] = (int)__vsub4((unsigned)p1[k], 0x20202020u);
        }
      }
    }
#pragma unroll
    for (int t = 0; t < B; ++t) {
      const int8_t* a = act.q + (int64_t)t * w.cols + i * 256 + 32 * j;
      const int4 a0 = ld16(a), a1 = ld16(a + 16);
      const float ad = act.d[(int64_t)t * (w.cols / 32) + 8 * i + j];
      const int4 ones = make_int4(0x01010101, 0x01010101, 0x01010101, 0x01010101);
      const int off0 = kOffsetBySums ? -32 * dot16(ones, a0, 0) : 0, off1 = kOffsetBySums ? -32 * dot16(ones, a1, 0) : 0;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const int d0 = dot16(w0[r], a0, off0), d1 = dot16(w1[r], a1, off1);
        acc[r][t] += d[r] * ad * (sc0[r] * (float)d0 + sc1[r] * (float)d1);
      }
    }
  };
  // S super-blocks (i, i + 4, ..) per iteration, all loaded before any is used.
  for (int64_t i = lane / 8; i < n_sb; i += 4 * S) {
    int4 lo[S][R];
    int2 hi[S][R];
#pragma unroll
    for (int u = 0; u < S; ++u)
#pragma unroll
      for (int r = 0; r < R; ++r) {
        lo[u][r] = make_int4(0, 0, 0, 0);
        hi[u][r] = make_int2(0, 0);
        if (u == 0 || i + 4 * u < n_sb) {
          lo[u][r] = ld16(lo_row[r] + (i + 4 * u) * 128 + 16 * j);
          hi[u][r] = __ldg(reinterpret_cast<const int2*>(hi_row[r] + (i + 4 * u) * 64 + 8 * j));
        }
      }
#pragma unroll
    for (int u = 0; u < S; ++u)
      if (u == 0 || i + 4 * u < n_sb) superblock(i + 4 * u, lo[u], hi[u]);
  }
}
template <int B, int R, int S, bool F = false>
__device__ __forceinline__ void matvec_q6_k(const DeviceWeight& w, const ActQ8& act, float* y, int ldy, bool accumulate, int64_t row0, int lane) {
  float acc[R][B] = {};
  matvec_q6_k_partials<B, R, S>(w, act, row0, lane, acc);
  store_row_set<B, R, F>(acc, y, ldy, row0, w.rows, accumulate, lane, act);
}

// F16 / BF16 / F32 weights with float activations: each lane reads 16 B of the row per step.
template <int B, DType T>
__device__ __forceinline__ void matvec_float(const DeviceWeight& w, const float* x, float* y, int ldy, bool accumulate, int64_t row, int lane) {
  constexpr int kPer = T == DType::F32 ? 4 : 8;  // elements per 16-byte load
  const uint8_t* rowp = w.data + row * w.row_bytes;
  float acc[B] = {};
  const bool vec = w.cols % kPer == 0;
  if (vec) {
    for (int64_t e = (int64_t)lane * kPer; e < w.cols; e += 32 * kPer) {
      float wv[kPer];
      const int4 raw = ld16(rowp + e * (T == DType::F32 ? 4 : 2));
      if constexpr (T == DType::F32) {
        wv[0] = __int_as_float(raw.x); wv[1] = __int_as_float(raw.y); wv[2] = __int_as_float(raw.z); wv[3] = __int_as_float(raw.w);
      } else {
        const uint32_t u[4] = {(uint32_t)raw.x, (uint32_t)raw.y, (uint32_t)raw.z, (uint32_t)raw.w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          if constexpr (T == DType::F16) {
            __half2 h2;
            memcpy(&h2, &u[k], 4);
            const float2 f = __half22float2(h2);
            wv[2 * k] = f.x;
            wv[2 * k + 1] = f.y;
          } else {
            wv[2 * k] = __uint_as_float(u[k] << 16);
            wv[2 * k + 1] = __uint_as_float(u[k] & 0xFFFF0000u);
          }
        }
      }
#pragma unroll
      for (int t = 0; t < B; ++t) {
        const float* xr = x + (int64_t)t * w.cols + e;
#pragma unroll
        for (int k = 0; k < kPer; ++k) acc[t] += wv[k] * xr[k];
      }
    }
  } else {
    for (int64_t e = lane; e < w.cols; e += 32) {
      float v;
      if constexpr (T == DType::F32) v = reinterpret_cast<const float*>(rowp)[e];
      else if constexpr (T == DType::F16) v = ld_half(rowp + 2 * e);
      else v = ld_bf16(rowp + 2 * e);
#pragma unroll
      for (int t = 0; t < B; ++t) acc[t] += v * x[(int64_t)t * w.cols + e];
    }
  }
  store_rows<B>(acc, y, ldy, row, accumulate, lane);
}

// Any type: each lane dequantizes whole 32-element chunks and multiplies with float activations.
template <int B>
__device__ __forceinline__ void matvec_generic(const DeviceWeight& w, const float* x, float* y, int ldy, bool accumulate, int64_t row, int lane) {
  float acc[B] = {};
  float v[32];
  for (int64_t c = lane; c < w.cols / 32; c += 32) {
    dequant_chunk32(w, row, c, v);
#pragma unroll
    for (int t = 0; t < B; ++t) {
      const float* xr = x + (int64_t)t * w.cols + c * 32;
      float s = 0;
#pragma unroll
      for (int k = 0; k < 32; ++k) s += v[k] * xr[k];
      acc[t] += s;
    }
  }
  store_rows<B>(acc, y, ldy, row, accumulate, lane);
}

}  // namespace
}  // namespace roofline::cuda
