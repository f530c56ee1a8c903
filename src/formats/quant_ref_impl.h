// Internal to the reference codecs (quant_ref*.cpp): the per-type row functions the dispatcher calls
// and the scale-search helpers several types share. Not part of the public API (use quant_ref.h).
// Every float expression in these files keeps llama.cpp's operation order, so outputs match bit for bit.
#pragma once

#include <cstdint>
#include <cstring>

namespace roofline::quant_detail {

// A row function pair for one type: n elements (a multiple of the block size), `imp` n floats or null.
using DequantRowFn = void (*)(const void* src, float* dst, int64_t n);
using QuantRowFn = void (*)(const float* src, void* dst, int64_t n, const float* imp);

// Round to nearest, ties to even, through the float adder (exact for |v| < 2^22, which every caller
// guarantees for finite input; other values give some integer, which callers clamp).
inline int round_nearest(float v) {
  const float biased = v + 12582912.f;  // 1.5 * 2^23: the integer part lands in the low mantissa bits
  int32_t bits;
  std::memcpy(&bits, &biased, sizeof(bits));
  return (bits & 0x007fffff) - 0x00400000;
}

// Float to int by truncation toward zero, defined for every input (out-of-range and NaN saturate).
inline int truncate_to_int(float v) {
  if (!(v > -2147483520.f)) return v != v ? 0 : -2147483647 - 1;
  if (!(v < 2147483520.f)) return 2147483647;
  return (int)v;
}

// Groups whose largest magnitude is below this are stored as zeros.
inline constexpr float kGroupEpsilon = 1e-15f;

// ---- shared scale searches (quant_ref_kquants.cpp) ----

// Symmetric fit x ~ scale * (L - nmax), L in [0, 2*nmax): a weighted least-squares scale refined over
// 19 trial inverse scales. `w` null weights each element by x^2.
float fit_symmetric(int n, int nmax, const float* x, int8_t* L, const float* w);

// Asymmetric fit x ~ scale * L - min, L in [0, nmax], min >= 0 returned through *neg_min: a grid of
// nstep+1 inverse scales starting at nmax + rmin, each solved for the weighted least-squares scale and
// offset; `w` null weights by x^2 (the importance-weighted variant of the search).
float fit_affine_weighted(int n, int nmax, const float* x, const float* w, uint8_t* L, float* neg_min, uint8_t* Laux,
                          float rmin, float rdelta, int nstep, bool use_mad);

// ---- IQ4 search shared by IQ4_NL and IQ4_XS (quant_ref_iq4.cpp) ----

// Quantizes one super-block of `super_size` elements in sub-blocks of 32 onto the IQ4 codebook.
// super_size == 32 is IQ4_NL (one fp16 scale), 256 is IQ4_XS (6-bit sub-block scales).
// `qw` (super_size importances or null), ntry: half-width of the trial scale grid.
void iq4_quantize_superblock(int super_size, const float* x, uint16_t* d_out, uint8_t* qs, uint16_t* scales_h,
                             uint8_t* scales_l, const float* qw, int ntry);

// ---- per-type row functions ----
void dequant_q4_0(const void*, float*, int64_t);
void dequant_q4_1(const void*, float*, int64_t);
void dequant_q5_0(const void*, float*, int64_t);
void dequant_q5_1(const void*, float*, int64_t);
void dequant_q8_0(const void*, float*, int64_t);
void dequant_iq4_nl(const void*, float*, int64_t);
void quant_q4_0(const float*, void*, int64_t, const float*);
void quant_q4_1(const float*, void*, int64_t, const float*);
void quant_q5_0(const float*, void*, int64_t, const float*);
void quant_q5_1(const float*, void*, int64_t, const float*);
void quant_q8_0(const float*, void*, int64_t, const float*);
void quant_iq4_nl(const float*, void*, int64_t, const float*);

void dequant_q2_k(const void*, float*, int64_t);
void dequant_q3_k(const void*, float*, int64_t);
void dequant_q4_k(const void*, float*, int64_t);
void dequant_q5_k(const void*, float*, int64_t);
void dequant_q6_k(const void*, float*, int64_t);
void quant_q2_k(const float*, void*, int64_t, const float*);
void quant_q3_k(const float*, void*, int64_t, const float*);
void quant_q4_k(const float*, void*, int64_t, const float*);
void quant_q5_k(const float*, void*, int64_t, const float*);
void quant_q6_k(const float*, void*, int64_t, const float*);

void dequant_iq4_xs(const void*, float*, int64_t);
void quant_iq4_xs(const float*, void*, int64_t, const float*);

}  // namespace roofline::quant_detail

// The codecs must round exactly as written: no fused multiply-add contraction in these files.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif
