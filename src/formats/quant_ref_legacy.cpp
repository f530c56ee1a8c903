// Reference codecs of the 32-element block types: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and IQ4_NL.
// Without importance the quantizers are the GGUF reference rounding (bit-identical with llama.cpp's
// quantize_row_*_ref); with importance they search the scale (and min) under the weighted error.
// Dequantizers evaluate exactly the spec's float expressions (llama-cpp-facts.md §2.3).
#include <cmath>
#include <cstring>
#include <limits>

#include "core/fp16.h"
#include "formats/quant_blocks.h"
#include "formats/quant_ref_impl.h"

namespace roofline::quant_detail {
namespace {

inline int clamp_int(int v, int lo, int hi) { return v < lo ? lo : (v > hi ? hi : v); }

// Sum of squares of a whole row over its length: the variance term of the importance weights.
float row_mean_square(const float* x, int64_t n) {
  float s = 0;
  for (int64_t j = 0; j < n; ++j) s += x[j] * x[j];
  return s / (float)n;
}

// Importance weights of one 32-element block: imp * sqrt(sigma2 + x^2).
void block_weights(const float* x, const float* imp, float sigma2, float* w) {
  for (int j = 0; j < kQK; ++j) w[j] = imp[j] * std::sqrt(sigma2 + x[j] * x[j]);
}

// The 5th bits of a Q5 block's 32 quants, packed as the little-endian u32 `qh`.
void pack_q5(const uint8_t* L, uint8_t* qs, uint8_t* qh_out) {
  uint32_t qh = 0;
  for (int j = 0; j < kQK / 2; ++j) {
    const uint8_t lo = L[j], hi = L[j + kQK / 2];
    qs[j] = (uint8_t)((lo & 0x0F) | ((hi & 0x0F) << 4));
    qh |= ((uint32_t)(lo >> 4) & 1u) << j;
    qh |= ((uint32_t)(hi >> 4) & 1u) << (j + kQK / 2);
  }
  std::memcpy(qh_out, &qh, 4);
}

// The value of the element with the largest magnitude (the first one on ties), and that magnitude.
float signed_absmax(const float* x, int n, float* amax_out) {
  float amax = 0, max = 0;
  for (int j = 0; j < n; ++j) {
    const float a = std::fabs(x[j]);
    if (amax < a) {
      amax = a;
      max = x[j];
    }
  }
  if (amax_out) *amax_out = amax;
  return max;
}

// ---------------------------------------------------------------------------------------------------
// Symmetric types (Q4_0, Q5_0): scale = signed max / -2^(bits-1); q = trunc(x/scale + offset + 0.5).

template <int kBits>
void quant_symmetric_ref_block(const float* x, uint16_t* d_out, uint8_t* L) {
  constexpr int kHalf = 1 << (kBits - 1);
  constexpr int kTop = (1 << kBits) - 1;
  const float max = signed_absmax(x, kQK, nullptr);
  const float d = max / -(float)kHalf;
  const float id = d != 0.f ? 1.0f / d : 0.0f;
  *d_out = f32_to_fp16(d);
  for (int j = 0; j < kQK; ++j) {
    // The reference truncates to int8 and caps at the top level; finite input never goes below 0.
    L[j] = (uint8_t)clamp_int(truncate_to_int(x[j] * id + ((float)kHalf + 0.5f)), 0, kTop);
  }
}

// Affine types (Q4_1, Q5_1): min and (max-min)/(2^bits - 1); q = trunc((x - min)/d + 0.5).
template <int kBits>
void quant_affine_ref_block(const float* x, uint16_t* d_out, uint16_t* m_out, uint8_t* L) {
  constexpr int kTop = (1 << kBits) - 1;
  float min = std::numeric_limits<float>::max();
  float max = -std::numeric_limits<float>::max();
  for (int j = 0; j < kQK; ++j) {
    if (x[j] < min) min = x[j];
    if (x[j] > max) max = x[j];
  }
  const float d = (max - min) / (float)kTop;
  const float id = d != 0.f ? 1.0f / d : 0.0f;
  *d_out = f32_to_fp16(d);
  *m_out = f32_to_fp16(min);
  for (int j = 0; j < kQK; ++j) {
    L[j] = (uint8_t)clamp_int(truncate_to_int((x[j] - min) * id + 0.5f), 0, kTop);
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// Q4_0

void dequant_q4_0(const void* src, float* y, int64_t n) {
  const auto* b = static_cast<const BlockQ4_0*>(src);
  for (int64_t i = 0; i < n / kQK; ++i, y += kQK) {
    const float d = fp16_to_f32(b[i].d);
    for (int j = 0; j < kQK / 2; ++j) {
      y[j] = (float)((b[i].qs[j] & 0x0F) - 8) * d;
      y[j + kQK / 2] = (float)((b[i].qs[j] >> 4) - 8) * d;
    }
  }
}

void quant_q4_0(const float* x, void* dst, int64_t n, const float* imp) {
  auto* b = static_cast<BlockQ4_0*>(dst);
  uint8_t L[kQK];
  if (!imp) {
    for (int64_t i = 0; i < n / kQK; ++i) {
      quant_symmetric_ref_block<4>(x + i * kQK, &b[i].d, L);
      for (int j = 0; j < kQK / 2; ++j) b[i].qs[j] = (uint8_t)(L[j] | (L[j + kQK / 2] << 4));
    }
    return;
  }
  const float sigma2 = row_mean_square(x, n);
  float w[kQK];
  int8_t Ls[kQK];
  for (int64_t i = 0; i < n / kQK; ++i) {
    block_weights(x + i * kQK, imp + i * kQK, sigma2, w);
    const float d = fit_symmetric(kQK, 8, x + i * kQK, Ls, w);
    b[i].d = f32_to_fp16(d);
    for (int j = 0; j < kQK / 2; ++j) b[i].qs[j] = (uint8_t)(Ls[j] | (Ls[j + kQK / 2] << 4));
  }
}

// ---------------------------------------------------------------------------------------------------
// Q4_1

void dequant_q4_1(const void* src, float* y, int64_t n) {
  const auto* b = static_cast<const BlockQ4_1*>(src);
  for (int64_t i = 0; i < n / kQK; ++i, y += kQK) {
    const float d = fp16_to_f32(b[i].d);
    const float m = fp16_to_f32(b[i].m);
    for (int j = 0; j < kQK / 2; ++j) {
      y[j] = (float)(b[i].qs[j] & 0x0F) * d + m;
      y[j + kQK / 2] = (float)(b[i].qs[j] >> 4) * d + m;
    }
  }
}

void quant_q4_1(const float* x, void* dst, int64_t n, const float* imp) {
  auto* b = static_cast<BlockQ4_1*>(dst);
  uint8_t L[kQK];
  if (!imp) {
    for (int64_t i = 0; i < n / kQK; ++i) {
      quant_affine_ref_block<4>(x + i * kQK, &b[i].d, &b[i].m, L);
      for (int j = 0; j < kQK / 2; ++j) b[i].qs[j] = (uint8_t)(L[j] | (L[j + kQK / 2] << 4));
    }
    return;
  }
  const float sigma2 = row_mean_square(x, n);
  float w[kQK];
  uint8_t Laux[kQK];
  for (int64_t i = 0; i < n / kQK; ++i) {
    block_weights(x + i * kQK, imp + i * kQK, sigma2, w);
    float neg_min = 0;
    const float d = fit_affine_weighted(kQK, 15, x + i * kQK, w, L, &neg_min, Laux, -0.9f, 0.05f, 36, false);
    b[i].d = f32_to_fp16(d);
    b[i].m = f32_to_fp16(-neg_min);
    for (int j = 0; j < kQK / 2; ++j) b[i].qs[j] = (uint8_t)(L[j] | (L[j + kQK / 2] << 4));
  }
}

// ---------------------------------------------------------------------------------------------------
// Q5_0

void dequant_q5_0(const void* src, float* y, int64_t n) {
  const auto* b = static_cast<const BlockQ5_0*>(src);
  for (int64_t i = 0; i < n / kQK; ++i, y += kQK) {
    const float d = fp16_to_f32(b[i].d);
    uint32_t qh;
    std::memcpy(&qh, b[i].qh, 4);
    for (int j = 0; j < kQK / 2; ++j) {
      const int hi0 = (int)((qh >> j) & 1u) << 4;
      const int hi1 = (int)((qh >> (j + kQK / 2)) & 1u) << 4;
      y[j] = (float)(((b[i].qs[j] & 0x0F) | hi0) - 16) * d;
      y[j + kQK / 2] = (float)(((b[i].qs[j] >> 4) | hi1) - 16) * d;
    }
  }
}

void quant_q5_0(const float* x, void* dst, int64_t n, const float* imp) {
  auto* b = static_cast<BlockQ5_0*>(dst);
  uint8_t L[kQK];
  if (!imp) {
    for (int64_t i = 0; i < n / kQK; ++i) {
      quant_symmetric_ref_block<5>(x + i * kQK, &b[i].d, L);
      pack_q5(L, b[i].qs, b[i].qh);
    }
    return;
  }
  const float sigma2 = row_mean_square(x, n);
  float w[kQK];
  int8_t Ls[kQK];
  for (int64_t i = 0; i < n / kQK; ++i) {
    block_weights(x + i * kQK, imp + i * kQK, sigma2, w);
    const float d = fit_symmetric(kQK, 16, x + i * kQK, Ls, w);
    b[i].d = f32_to_fp16(d);
    for (int j = 0; j < kQK; ++j) L[j] = (uint8_t)Ls[j];
    pack_q5(L, b[i].qs, b[i].qh);
  }
}

// ---------------------------------------------------------------------------------------------------
// Q5_1

void dequant_q5_1(const void* src, float* y, int64_t n) {
  const auto* b = static_cast<const BlockQ5_1*>(src);
  for (int64_t i = 0; i < n / kQK; ++i, y += kQK) {
    const float d = fp16_to_f32(b[i].d);
    const float m = fp16_to_f32(b[i].m);
    uint32_t qh;
    std::memcpy(&qh, b[i].qh, 4);
    for (int j = 0; j < kQK / 2; ++j) {
      const int hi0 = (int)((qh >> j) & 1u) << 4;
      const int hi1 = (int)((qh >> (j + kQK / 2)) & 1u) << 4;
      y[j] = (float)((b[i].qs[j] & 0x0F) | hi0) * d + m;
      y[j + kQK / 2] = (float)((b[i].qs[j] >> 4) | hi1) * d + m;
    }
  }
}

void quant_q5_1(const float* x, void* dst, int64_t n, const float* imp) {
  auto* b = static_cast<BlockQ5_1*>(dst);
  uint8_t L[kQK];
  if (!imp) {
    for (int64_t i = 0; i < n / kQK; ++i) {
      quant_affine_ref_block<5>(x + i * kQK, &b[i].d, &b[i].m, L);
      pack_q5(L, b[i].qs, b[i].qh);
    }
    return;
  }
  const float sigma2 = row_mean_square(x, n);
  float w[kQK];
  uint8_t Laux[kQK];
  for (int64_t i = 0; i < n / kQK; ++i) {
    block_weights(x + i * kQK, imp + i * kQK, sigma2, w);
    float neg_min = 0;
    const float d = fit_affine_weighted(kQK, 31, x + i * kQK, w, L, &neg_min, Laux, -0.9f, 0.05f, 36, false);
    b[i].d = f32_to_fp16(d);
    b[i].m = f32_to_fp16(-neg_min);
    pack_q5(L, b[i].qs, b[i].qh);
  }
}

// ---------------------------------------------------------------------------------------------------
// Q8_0 (importance does not change the reference rounding: it is already the nearest grid point)

void dequant_q8_0(const void* src, float* y, int64_t n) {
  const auto* b = static_cast<const BlockQ8_0*>(src);
  for (int64_t i = 0; i < n / kQK; ++i, y += kQK) {
    const float d = fp16_to_f32(b[i].d);
    for (int j = 0; j < kQK; ++j) y[j] = (float)b[i].qs[j] * d;
  }
}

void quant_q8_0(const float* x, void* dst, int64_t n, const float* /*imp*/) {
  auto* b = static_cast<BlockQ8_0*>(dst);
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK) {
    float amax = 0;
    for (int j = 0; j < kQK; ++j) {
      const float a = std::fabs(x[j]);
      amax = amax > a ? amax : a;
    }
    const float d = amax / 127.f;
    const float id = d != 0.f ? 1.0f / d : 0.0f;
    b[i].d = f32_to_fp16(d);
    for (int j = 0; j < kQK; ++j) {
      const float r = std::round(x[j] * id);  // half away from zero, as roundf
      b[i].qs[j] = (int8_t)clamp_int(truncate_to_int(r), -128, 127);
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// IQ4_NL: one fp16 scale per 32 elements over the non-linear codebook.

void dequant_iq4_nl(const void* src, float* y, int64_t n) {
  const auto* b = static_cast<const BlockIQ4_NL*>(src);
  for (int64_t i = 0; i < n / kQK; ++i, y += kQK) {
    const float d = fp16_to_f32(b[i].d);
    for (int j = 0; j < kQK / 2; ++j) {
      y[j] = d * (float)kIQ4NLValues[b[i].qs[j] & 0x0F];
      y[j + kQK / 2] = d * (float)kIQ4NLValues[b[i].qs[j] >> 4];
    }
  }
}

void quant_iq4_nl(const float* x, void* dst, int64_t n, const float* imp) {
  auto* b = static_cast<BlockIQ4_NL*>(dst);
  for (int64_t i = 0; i < n / kQK; ++i) {
    iq4_quantize_superblock(kQK, x + i * kQK, &b[i].d, b[i].qs, nullptr, nullptr, imp ? imp + i * kQK : nullptr, 7);
  }
}

}  // namespace roofline::quant_detail
