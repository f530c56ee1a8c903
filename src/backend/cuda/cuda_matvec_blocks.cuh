// The decode row products of the weight types a lane reads 32 values at a time: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
// IQ4_NL and the chunks of Q3_K and Q2_K as planes (backend/device_planes.h), IQ4_XS as in the file. One walker
// (block_partials) moves a warp's lanes over the 32-value blocks of R rows (lane l takes blocks l, l + 32, ..; S
// blocks in flight, every load of a round issued before its arithmetic), loading each token's 32 int8 activations
// once for the R rows. A type's policy says the rest:
//   T::at(w, row)        the row's plane pointers;
//   load(b)              block b's loads (a T::Loads, zero where the walker has no block);
//   words(loads, b)      the block's values as eight words of four int8 (values 0-15, then 16-31) and its
//                        scales (these may load more: small per-block scales);
//   T::add(acc, v, a0, a1, ad, as)   acc += the block's sum for one token (activations a0, a1 with step ad
//                        and step-weighted sum as = ad * sum(q)).
// Every float operation of a block's term is written out in add (with explicit roundings where a sum of two
// products would leave the compiler a choice of which to fuse: the choice differed between kernels for Q4_1), so
// every caller of these functions gets the same bits for a row whatever shares its warp (cuda_matvec.cu,
// cuda_moe_decode.cu). Q6_K keeps its own loop (matvec_q6_k_partials, cuda_matvec_rows.cuh): through this walker
// (the same PTX but for the index arithmetic) ptxas allocated its 5-8-token kernels otherwise, and steps of 8
// tokens lost 4-8% on the H200 (qwen3-8b / 32b Q4_K_M, -npl 8: 1372-1387 / 392 tok/s against 1499-1510 / 408).
#pragma once

#include "backend/cuda/cuda_matvec_rows.cuh"

namespace roofline::cuda {
namespace {

template <class T, int B, int R, int S>
__device__ __forceinline__ void block_partials(const DeviceWeight& w, const ActQ8& act, int64_t row0, int lane, float (&acc)[R][B]) {
  const int64_t n_blocks = w.cols / 32;
  T rows[R];
#pragma unroll
  for (int r = 0; r < R; ++r) rows[r] = T::at(w, min(row0 + r, w.rows - 1));  // past the end: a repeat, not stored
  for (int64_t b0 = lane; b0 < n_blocks; b0 += 32 * S) {
    typename T::Loads in[S][R];
#pragma unroll
    for (int u = 0; u < S; ++u)
#pragma unroll
      for (int r = 0; r < R; ++r) {
        in[u][r] = typename T::Loads{};
        const int64_t b = b0 + 32 * u;
        if (u == 0 || b < n_blocks) in[u][r] = rows[r].load(b);
      }
#pragma unroll
    for (int u = 0; u < S; ++u) {
      const int64_t b = b0 + 32 * u;
      if (u > 0 && b >= n_blocks) break;
      typename T::Words v[R];
#pragma unroll
      for (int r = 0; r < R; ++r) v[r] = rows[r].words(in[u][r], b);
#pragma unroll
      for (int t = 0; t < B; ++t) {
        const int8_t* a = act.q + (int64_t)t * w.cols + b * 32;
        const int4 a0 = ld16(a), a1 = ld16(a + 16);
        const int64_t s = (int64_t)t * n_blocks + b;
        const float ad = act.d[s], as = T::kUsesSums ? act.s[s] : 0.0f;
#pragma unroll
        for (int r = 0; r < R; ++r) T::add(acc[r][t], v[r], a0, a1, ad, as);
      }
    }
  }
}
// The R rows row0.. of a type T, summed and stored (F: the activations may carry a norm's factor).
template <class T, int B, int R, int S, bool F = false>
__device__ __forceinline__ void matvec_blocks(const DeviceWeight& w, const ActQ8& act, float* y, int ldy, bool accumulate, int64_t row0, int lane) {
  float acc[R][B] = {};
  block_partials<T, B, R, S>(w, act, row0, lane, acc);
  store_row_set<B, R, F>(acc, y, ldy, row0, w.rows, accumulate, lane, act);
}

__device__ __forceinline__ int ld4(const void* p) { return __ldg(reinterpret_cast<const int*>(p)); }
__device__ __forceinline__ int2 ld8(const void* p) { return __ldg(reinterpret_cast<const int2*>(p)); }
__device__ __forceinline__ int4 nibbles(int4 v, int shift) {
  return make_int4((v.x >> shift) & 0x0F0F0F0F, (v.y >> shift) & 0x0F0F0F0F, (v.z >> shift) & 0x0F0F0F0F, (v.w >> shift) & 0x0F0F0F0F);
}

// The term of a block whose values are w0 (0-15), w1 (16-31) times one scale: scale * ad * dot (Q8_0, IQ4_XS, IQ4_NL).
__device__ __forceinline__ void add_scaled_dot(float& acc, float scale, int4 w0, int4 w1, int4 a0, int4 a1, float ad) {
  acc += scale * ad * (float)dot16(w1, a1, dot16(w0, a0, 0));
}

// Q8_0 planes: a block's 32 int8 values and its f16 scale.
struct Q8_0Blocks {
  static constexpr bool kUsesSums = false;
  const int8_t* q;
  const __half* d;
  struct Loads {
    int4 q0, q1;
    float d;
  };
  using Words = Loads;
  static __device__ Q8_0Blocks at(const DeviceWeight& w, int64_t row) {
    return {reinterpret_cast<const int8_t*>(w.data) + row * w.cols, reinterpret_cast<const __half*>(w.plane1) + row * (w.cols / 32)};
  }
  __device__ Loads load(int64_t b) const { return {ld16(q + b * 32), ld16(q + b * 32 + 16), __half2float(d[b])}; }
  __device__ Words words(const Loads& in, int64_t) const { return in; }
  static __device__ void add(float& acc, const Words& v, int4 a0, int4 a1, float ad, float) { add_scaled_dot(acc, v.d, v.q0, v.q1, a0, a1, ad); }
};

// Q4_0 planes: a block's 16 quant bytes as in the file (value j in the low nibble of byte j, j + 16 in the high
// one) and its f16 scale. sum((q - 8) * ad * qa) = ad * dot - 8 * as.
struct Q4_0Blocks {
  static constexpr bool kUsesSums = true;
  const uint8_t* q;
  const __half* d;
  struct Loads {
    int4 q;
    float d;
  };
  struct Words {
    int4 lo, hi;
    float d;
  };
  static __device__ Q4_0Blocks at(const DeviceWeight& w, int64_t row) {
    return {w.data + row * (w.cols / 2), reinterpret_cast<const __half*>(w.plane1) + row * (w.cols / 32)};
  }
  __device__ Loads load(int64_t b) const { return {ld16(q + b * 16), __half2float(d[b])}; }
  __device__ Words words(const Loads& in, int64_t) const { return {nibbles(in.q, 0), nibbles(in.q, 4), in.d}; }
  static __device__ void add(float& acc, const Words& v, int4 a0, int4 a1, float ad, float as) {
    const float dot = (float)dot16(v.hi, a1, dot16(v.lo, a0, 0));
    acc = __fmaf_rn(v.d, __fmaf_rn(ad, dot, __fmul_rn(-8.0f, as)), acc);
  }
};

// The 4- and 5-bit types with a min (Q4_1, Q5_1: value d * q + m) and Q5_0 (d * (q - 16)), in planes: the file's 16
// quant bytes as Q4_0's, f16 d (and m), and for the 5-bit types a word of fifth bits (value e at byte e % 4, bit
// e / 4, so that bits k and 4 + k of each byte are the fifth bits of the words k of values 0-15 and 16-31).
// sum((d q + m) ad qa) = d * ad * dot + m * as; sum(d (q - 16) ad qa) = d * (ad * dot - 16 * as).
template <bool kFifth, bool kMin>
struct LegacyBlocks {
  static constexpr bool kUsesSums = true;
  const uint8_t* q;
  const uint8_t* scale;  // f16 d, or d and m
  const uint8_t* fifth;
  struct Loads {
    int4 q;
    uint32_t scale;
    uint32_t fifth;
  };
  struct Words {
    int4 lo, hi;
    float d, m;
  };
  static __device__ LegacyBlocks at(const DeviceWeight& w, int64_t row) {
    const int64_t blocks = row * (w.cols / 32);
    return {w.data + blocks * 16, w.plane1 + blocks * (kMin ? 4 : 2), kFifth ? w.plane2 + blocks * 4 : nullptr};
  }
  __device__ Loads load(int64_t b) const {
    Loads in;
    in.q = ld16(q + b * 16);
    in.scale = kMin ? (uint32_t)ld4(scale + b * 4) : (uint32_t)__ldg(reinterpret_cast<const unsigned short*>(scale) + b);
    in.fifth = kFifth ? (uint32_t)ld4(fifth + b * 4) : 0u;
    return in;
  }
  __device__ Words words(const Loads& in, int64_t) const {
    Words v;
    v.lo = nibbles(in.q, 0);
    v.hi = nibbles(in.q, 4);
    if constexpr (kFifth) {
      int* lo = &v.lo.x;
      int* hi = &v.hi.x;
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        lo[k] |= (int)(((in.fifth >> k) & 0x01010101u) << 4);
        hi[k] |= (int)(((in.fifth >> (4 + k)) & 0x01010101u) << 4);
      }
    }
    v.m = 0.0f;
    if constexpr (kMin) half2_floats(in.scale, v.d, v.m);
    else v.d = __half2float(__ushort_as_half((unsigned short)in.scale));
    return v;
  }
  static __device__ void add(float& acc, const Words& v, int4 a0, int4 a1, float ad, float as) {
    const float dot = (float)dot16(v.hi, a1, dot16(v.lo, a0, 0));
    if constexpr (kMin) acc = __fmaf_rn(v.m, as, __fmaf_rn(__fmul_rn(v.d, ad), dot, acc));
    else acc = __fmaf_rn(v.d, __fmaf_rn(ad, dot, __fmul_rn(-16.0f, as)), acc);
  }
};
using Q4_1Blocks = LegacyBlocks<false, true>;
using Q5_0Blocks = LegacyBlocks<true, false>;
using Q5_1Blocks = LegacyBlocks<true, true>;

// Four 4-bit indices (the bytes of idx, each 0-15) looked up in the 16 int8 values of IQ4_NL's table, as the
// four bytes of a word (dp4a's operand): the table's halves by byte permutes, the half chosen by each index's bit 3.
constexpr uint32_t pack_int8x4(int a, int b, int c, int d) {
  return (uint32_t)(uint8_t)a | (uint32_t)(uint8_t)b << 8 | (uint32_t)(uint8_t)c << 16 | (uint32_t)(uint8_t)d << 24;
}
__device__ __forceinline__ int iq4_lookup4(uint32_t idx) {
  constexpr uint32_t t0 = pack_int8x4(-127, -104, -83, -65), t1 = pack_int8x4(-49, -35, -22, -10), t2 = pack_int8x4(1, 13, 25, 38),
                     t3 = pack_int8x4(53, 69, 89, 113);  // IQ4_NL's table (kIQ4NLDevice)
  const uint32_t v = idx & 0x07070707u;
  const uint32_t sel = (v & 0xFu) | ((v >> 4) & 0xF0u) | ((v >> 8) & 0xF00u) | ((v >> 12) & 0xF000u);
  const uint32_t lo = __byte_perm(t0, t1, sel), hi = __byte_perm(t2, t3, sel);
  const uint32_t high = ((idx >> 3) & 0x01010101u) * 0xFFu;
  return (int)((lo & ~high) | (hi & high));
}
// Four words of four indices each (the nibbles of a block, 0-15 per byte) looked up in the table.
__device__ __forceinline__ int4 iq4_lookup16(int4 idx) {
  return make_int4(iq4_lookup4(idx.x), iq4_lookup4(idx.y), iq4_lookup4(idx.z), iq4_lookup4(idx.w));
}

// IQ4_XS as in the file (136-byte super-blocks: f16 d, 2 bytes of the scales' high bits, 4 of their low nibbles,
// 128 of indices; 8-byte aligned, so a block's 16 index bytes are two 8-byte loads): value d * (ls - 32) * table[index].
struct IQ4XSBlocks {
  static constexpr bool kUsesSums = false;
  const uint8_t* p;
  struct Loads {
    int2 hdr, qa, qb;
  };
  struct Words {
    int4 lo, hi;
    float dl;
  };
  static __device__ IQ4XSBlocks at(const DeviceWeight& w, int64_t row) { return {w.data + row * w.row_bytes}; }
  __device__ Loads load(int64_t b) const {
    const uint8_t* blk = p + (b / 8) * 136;
    return {ld8(blk), ld8(blk + 8 + 16 * (b % 8)), ld8(blk + 16 + 16 * (b % 8))};
  }
  __device__ Words words(const Loads& in, int64_t b) const {
    const int s = (int)(b % 8);
    const uint32_t h = (uint32_t)in.hdr.x, l = (uint32_t)in.hdr.y;
    const int ls = (int)(((l >> (4 * s)) & 0xF) | (((h >> (16 + 2 * s)) & 3) << 4));
    Words v;
    v.dl = __half2float(__ushort_as_half((unsigned short)(h & 0xFFFF))) * (float)(ls - 32);
    const int4 q = make_int4(in.qa.x, in.qa.y, in.qb.x, in.qb.y);
    v.lo = iq4_lookup16(nibbles(q, 0));
    v.hi = iq4_lookup16(nibbles(q, 4));
    return v;
  }
  static __device__ void add(float& acc, const Words& v, int4 a0, int4 a1, float ad, float) { add_scaled_dot(acc, v.dl, v.lo, v.hi, a0, a1, ad); }
};

// IQ4_NL in Q4_0's planes: the quant bytes are indices into the IQ4_NL table; value d * table[index].
struct IQ4NLBlocks : Q4_0Blocks {
  static constexpr bool kUsesSums = false;
  static __device__ IQ4NLBlocks at(const DeviceWeight& w, int64_t row) { return {Q4_0Blocks::at(w, row)}; }
  __device__ Words words(const Loads& in, int64_t) const { return {iq4_lookup16(nibbles(in.q, 0)), iq4_lookup16(nibbles(in.q, 4)), in.d}; }
  static __device__ void add(float& acc, const Words& v, int4 a0, int4 a1, float ad, float) { add_scaled_dot(acc, v.d, v.lo, v.hi, a0, a1, ad); }
};

// Q3_K planes: 8 B of low 2 bits per chunk (Q6_K's 2-bit word layout: values 0-15, then 16-31), 4 B of sign bits
// (the file's hmask bits inverted: value e at byte e % 4, bit e / 4), two int8 scales (s - 32) per chunk and an f16 d
// per super-block; values low - 4 * sign, -4..3 as in the file, as int8 bytes low | sign * 0xFC (a multiply and an OR
// where (low | high << 2) - 4 took a shift, an OR and a three-instruction byte-wise subtraction). A chunk's sum:
// d * ad * (sc0 * dot(values 0-15) + sc1 * dot(values 16-31)), as Q6_K's (here with explicit roundings).
struct Q3KBlocks {
  static constexpr bool kUsesSums = false;
  const uint8_t* lo;
  const uint8_t* hi;
  const int8_t* sc;
  const __half* d;
  struct Loads {
    int2 lo;
    int hi;
  };
  struct Words {
    int4 w0, w1;
    float d, sc0, sc1;
  };
  static __device__ Q3KBlocks at(const DeviceWeight& w, int64_t row) {
    return {w.data + row * (w.cols / 4), w.plane1 + row * (w.cols / 8), reinterpret_cast<const int8_t*>(w.plane2) + row * (w.cols / 16),
            reinterpret_cast<const __half*>(w.plane3) + row * (w.cols / 256)};
  }
  __device__ Loads load(int64_t b) const { return {ld8(lo + b * 8), ld4(hi + b * 4)}; }
  __device__ Words words(const Loads& in, int64_t b) const {
    Words v;
    v.d = __half2float(d[b >> 3]);
    const short s = __ldg(reinterpret_cast<const short*>(sc + b * 2));
    v.sc0 = (float)(int8_t)(s & 0xFF);
    v.sc1 = (float)(int8_t)(s >> 8);
    int* p0 = &v.w0.x;
    int* p1 = &v.w1.x;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      p0[k] = ((in.lo.x >> (2 * k)) & 0x03030303) | (((in.hi >> k) & 0x01010101) * 0xFC);
      p1[k] = ((in.lo.y >> (2 * k)) & 0x03030303) | (((in.hi >> (4 + k)) & 0x01010101) * 0xFC);
    }
    return v;
  }
  static __device__ void add(float& acc, const Words& v, int4 a0, int4 a1, float ad, float) {
    const int d0 = dot16(v.w0, a0, 0), d1 = dot16(v.w1, a1, 0);
    acc = __fmaf_rn(__fmul_rn(v.d, ad), __fmaf_rn(v.sc0, (float)d0, __fmul_rn(v.sc1, (float)d1)), acc);
  }
};

// Q2_K planes: 8 B of 2-bit values per chunk (as Q3_K's low bits), the file's two scale bytes of the chunk (4-bit
// scale, 4-bit min) and the super-block's f16 d and dmin: value d * sc * q - dmin * m. Per 16 values
// ad * (d * sc * dot - dmin * m * sum(qa)), the sums of the int8 activations by dp4a with ones.
struct Q2KBlocks {
  static constexpr bool kUsesSums = false;
  const uint8_t* q;
  const uint8_t* sc;
  const uint32_t* dm;
  struct Loads {
    int2 q;
  };
  struct Words {
    int4 w0, w1;
    int sc0, sc1, m0, m1;
    float d, dmin;
  };
  static __device__ Q2KBlocks at(const DeviceWeight& w, int64_t row) {
    return {w.data + row * (w.cols / 4), w.plane1 + row * (w.cols / 16), reinterpret_cast<const uint32_t*>(w.plane2) + row * (w.cols / 256)};
  }
  __device__ Loads load(int64_t b) const { return {ld8(q + b * 8)}; }
  __device__ Words words(const Loads& in, int64_t b) const {
    Words v;
    const int s = (int)(unsigned short)__ldg(reinterpret_cast<const short*>(sc + b * 2));
    v.sc0 = s & 0xF, v.m0 = (s >> 4) & 0xF, v.sc1 = (s >> 8) & 0xF, v.m1 = (s >> 12) & 0xF;
    half2_floats(__ldg(dm + (b >> 3)), v.d, v.dmin);
    int* p0 = &v.w0.x;
    int* p1 = &v.w1.x;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      p0[k] = (in.q.x >> (2 * k)) & 0x03030303;
      p1[k] = (in.q.y >> (2 * k)) & 0x03030303;
    }
    return v;
  }
  static __device__ void add(float& acc, const Words& v, int4 a0, int4 a1, float ad, float) {
    const int4 ones = make_int4(0x01010101, 0x01010101, 0x01010101, 0x01010101);
    const int isum = v.sc0 * dot16(v.w0, a0, 0) + v.sc1 * dot16(v.w1, a1, 0);
    const int imin = v.m0 * dot16(ones, a0, 0) + v.m1 * dot16(ones, a1, 0);
    acc = __fmaf_rn(ad, __fmaf_rn(v.d, (float)isum, -__fmul_rn(v.dmin, (float)imin)), acc);
  }
};

}  // namespace
}  // namespace roofline::cuda
