// Reference codec of IQ4_XS and the search shared with IQ4_NL: elements map to the non-linear 16-value
// codebook kIQ4NLValues; each 32-element sub-block's scale is chosen from a grid of trial scales by
// weighted least squares (weights x^2, or importance * sqrt(sigma2 + x^2)); IQ4_XS then stores the
// sub-block scales as 6-bit multiples of one fp16 super-block scale. Matches llama.cpp's quantize_iq4_*.
#include <cmath>
#include <cstring>

#include "core/fp16.h"
#include "formats/quant_blocks.h"
#include "formats/quant_ref_impl.h"

namespace roofline::quant_detail {
namespace {

constexpr int kSub = 32;  // sub-block size of both IQ4 types

// Index of the codebook entry nearest to v (ties go to the larger entry): the table is sorted, so this
// is a branch-free binary search over the midpoints, compared in doubled form so the sums stay exact.
int nearest_codebook_index(float v) {
  const float v2 = v + v;
  int idx = 0;
  for (int step = 8; step > 0; step >>= 1) {
    const int j = idx + step;
    if (v2 >= (float)(kIQ4NLValues[j - 1] + kIQ4NLValues[j])) idx = j;
  }
  return idx;
}

}  // namespace

void iq4_quantize_superblock(int super_size, const float* x, uint16_t* d_out, uint8_t* qs, uint16_t* scales_h,
                             uint8_t* scales_l, const float* qw, int ntry) {
  const int n_sub = super_size / kSub;
  uint8_t L[kQKK];
  float scales[kQKK / kSub];
  float weight[kSub];

  float sigma2 = 0;
  for (int j = 0; j < super_size; ++j) sigma2 += x[j] * x[j];
  sigma2 *= 2.f / (float)super_size;

  std::memset(qs, 0, (size_t)super_size / 2);
  *d_out = f32_to_fp16(0.f);

  const float v0 = (float)kIQ4NLValues[0];
  float max_scale = 0, amax_scale = 0;
  for (int ib = 0; ib < n_sub; ++ib) {
    const float* xb = x + ib * kSub;
    uint8_t* Lb = L + ib * kSub;
    if (qw) {
      for (int j = 0; j < kSub; ++j) weight[j] = qw[ib * kSub + j] * std::sqrt(sigma2 + xb[j] * xb[j]);
    } else {
      for (int j = 0; j < kSub; ++j) weight[j] = xb[j] * xb[j];
    }
    float amax = 0, max = 0;
    for (int j = 0; j < kSub; ++j) {
      const float ax = std::fabs(xb[j]);
      if (ax > amax) {
        amax = ax;
        max = xb[j];
      }
    }
    if (amax < kGroupEpsilon) {
      scales[ib] = 0;
      std::memset(Lb, 0, kSub);
      continue;
    }
    // Start from the scale that maps the max-magnitude element onto the codebook's end, then try
    // 2*ntry+1 inverse scales around it, keeping the best weighted least-squares scale.
    float d = ntry > 0 ? -max / v0 : max / v0;
    float id = 1 / d;
    float sumqx = 0, sumq2 = 0;
    for (int j = 0; j < kSub; ++j) {
      const int l = nearest_codebook_index(id * xb[j]);
      Lb[j] = (uint8_t)l;
      const float q = (float)kIQ4NLValues[l];
      sumqx += weight[j] * q * xb[j];
      sumq2 += weight[j] * q * q;
    }
    d = sumq2 > 0 ? sumqx / sumq2 : 0.f;
    float best = d * sumqx;
    for (int itry = -ntry; itry <= ntry; ++itry) {
      id = (float)(itry + kIQ4NLValues[0]) / max;
      sumqx = sumq2 = 0;
      for (int j = 0; j < kSub; ++j) {
        const float q = (float)kIQ4NLValues[nearest_codebook_index(id * xb[j])];
        sumqx += weight[j] * q * xb[j];
        sumq2 += weight[j] * q * q;
      }
      if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
        d = sumqx / sumq2;
        best = d * sumqx;
      }
    }
    scales[ib] = d;
    const float abs_d = std::fabs(d);
    if (abs_d > amax_scale) {
      amax_scale = abs_d;
      max_scale = d;
    }
  }

  if (n_sub > 1) {
    // IQ4_XS: sub-block scales become levels -32..31 of d = -max_scale/32 (the largest maps to -32);
    // elements are requantized against the level's scale (from the unrounded d).
    *scales_h = 0;
    const float d = -max_scale / 32.f;
    *d_out = f32_to_fp16(d);
    const float id = d != 0.f ? 1 / d : 0.f;
    for (int ib = 0; ib < n_sub; ++ib) {
      int l = round_nearest(id * scales[ib]);
      l = l < -32 ? -32 : (l > 31 ? 31 : l);
      const float dl = d * (float)l;
      const float idl = dl != 0.f ? 1 / dl : 0.f;
      for (int j = 0; j < kSub; ++j) L[ib * kSub + j] = (uint8_t)nearest_codebook_index(idl * x[ib * kSub + j]);
      l += 32;
      const uint8_t lo = (uint8_t)(l & 0xF), hi = (uint8_t)(l >> 4);
      if (ib % 2 == 0) scales_l[ib / 2] = lo;
      else scales_l[ib / 2] |= (uint8_t)(lo << 4);
      *scales_h = (uint16_t)(*scales_h | (hi << (2 * (ib % 8))));
    }
  } else {
    // IQ4_NL: the scale is stored as is; with a search (ntry > 0) the elements are requantized against it.
    *d_out = f32_to_fp16(scales[0]);
    if (ntry > 0) {
      const float id = scales[0] != 0.f ? 1 / scales[0] : 0.f;
      for (int j = 0; j < super_size; ++j) L[j] = (uint8_t)nearest_codebook_index(id * x[j]);
    }
  }

  for (int i = 0; i < super_size / kSub; ++i) {
    for (int j = 0; j < 16; ++j) qs[16 * i + j] = (uint8_t)(L[kSub * i + j] | (L[kSub * i + 16 + j] << 4));
  }
}

// ---------------------------------------------------------------------------------------------------
// IQ4_XS

void dequant_iq4_xs(const void* src, float* y, int64_t n) {
  const auto* b = static_cast<const BlockIQ4_XS*>(src);
  for (int64_t i = 0; i < n / kQKK; ++i) {
    const float d = fp16_to_f32(b[i].d);
    const uint8_t* qs = b[i].qs;
    for (int ib = 0; ib < kQKK / kSub; ++ib, y += kSub, qs += 16) {
      const int ls = ((b[i].scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF) | (((b[i].scales_h >> (2 * ib)) & 3) << 4);
      const float dl = d * (float)(ls - 32);
      for (int j = 0; j < 16; ++j) {
        y[j] = dl * (float)kIQ4NLValues[qs[j] & 0xF];
        y[j + 16] = dl * (float)kIQ4NLValues[qs[j] >> 4];
      }
    }
  }
}

void quant_iq4_xs(const float* x, void* dst, int64_t n, const float* imp) {
  auto* b = static_cast<BlockIQ4_XS*>(dst);
  for (int64_t i = 0; i < n / kQKK; ++i) {
    iq4_quantize_superblock(kQKK, x + i * kQKK, &b[i].d, b[i].qs, &b[i].scales_h, b[i].scales_l,
                            imp ? imp + i * kQKK : nullptr, 7);
  }
}

}  // namespace roofline::quant_detail
