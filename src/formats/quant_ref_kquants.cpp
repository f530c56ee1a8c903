// Reference codecs of the K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K): 256-element super-blocks with
// quantized sub-block scales. Quantizers search sub-block scales/mins by weighted least squares the way
// llama.cpp's reference quantizers do (bit-identical without importance), and use the importance-
// weighted search when an importance vector is given. Also the scale searches the other files share.
#include <cmath>
#include <cstring>

#include "core/fp16.h"
#include "formats/quant_blocks.h"
#include "formats/quant_ref_impl.h"

namespace roofline::quant_detail {
namespace {

inline int clamp_int(int v, int lo, int hi) { return v < lo ? lo : (v > hi ? hi : v); }

// Packs four 2-bit planes: byte l of each 32-byte half holds elements l, l+32, l+64, l+96 of that half.
void pack_2bit_planes(const uint8_t* L, uint8_t* qs) {
  for (int half = 0; half < kQKK; half += 128) {
    for (int l = 0; l < 32; ++l) {
      qs[half / 4 + l] = (uint8_t)(L[half + l] | (L[half + l + 32] << 2) | (L[half + l + 64] << 4) |
                                   (L[half + l + 96] << 6));
    }
  }
}

// Stores 6-bit scale j and min j of a Q4_K/Q5_K block into its 12 scale bytes (see unpack_k4_scale_min).
void pack_k4_scale_min(int j, uint8_t ls, uint8_t lm, uint8_t* q) {
  if (j < 4) {
    q[j] = ls;
    q[j + 4] = lm;
  } else {
    q[j + 4] = (uint8_t)((ls & 0xF) | ((lm & 0xF) << 4));
    q[j - 4] |= (uint8_t)((ls >> 4) << 6);
    q[j] |= (uint8_t)((lm >> 4) << 6);
  }
}

// 6-bit signed scale j (-32..31) of a Q3_K block from its 12 scale bytes.
int q3k_scale(const uint8_t* s, int j) {
  const int low = j < 8 ? (s[j] & 0xF) : (s[j - 8] >> 4);
  const int high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
  return (low | (high << 4)) - 32;
}

// Error-weighted refinement of a non-negative grid (the sub-block scales or mins of a super-block):
// x ~ scale * L with L in [0, nmax]; a few trial inverse scales, then coordinate descent on L.
float fit_positive_grid(int n, int nmax, const float* x, uint8_t* L, const float* w) {
  float max = 0;
  for (int i = 0; i < n; ++i) max = max > x[i] ? max : x[i];
  if (max < kGroupEpsilon) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.f;
  }
  float iscale = (float)nmax / max;
  for (int i = 0; i < n; ++i) L[i] = (uint8_t)round_nearest(iscale * x[i]);
  const float scale0 = 1 / iscale;
  float best_mse = 0;
  for (int i = 0; i < n; ++i) {
    const float diff = x[i] - scale0 * (float)L[i];
    best_mse += w[i] * diff * diff;
  }
  for (int is = -4; is <= 4; ++is) {
    if (is == 0) continue;
    const float trial_iscale = (0.1f * (float)is + (float)nmax) / max;
    const float trial_scale = 1 / trial_iscale;
    float mse = 0;
    for (int i = 0; i < n; ++i) {
      int l = round_nearest(trial_iscale * x[i]);
      l = l < nmax ? l : nmax;
      const float diff = x[i] - trial_scale * (float)l;
      mse += w[i] * diff * diff;
    }
    if (mse < best_mse) {
      best_mse = mse;
      iscale = trial_iscale;
    }
  }
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    int l = round_nearest(iscale * x[i]);
    l = l < nmax ? l : nmax;
    L[i] = (uint8_t)l;
    sumlx += w[i] * x[i] * (float)l;
    suml2 += w[i] * (float)l * (float)l;
  }
  for (int pass = 0; pass < 5; ++pass) {
    int changed = 0;
    for (int i = 0; i < n; ++i) {
      const float wi = w[i];
      float slx = sumlx - wi * x[i] * (float)L[i];
      float sl2 = suml2 - wi * (float)L[i] * (float)L[i];
      if (slx > 0 && sl2 > 0) {
        int nl = round_nearest(x[i] * sl2 / slx);
        nl = nl < nmax ? nl : nmax;
        if (nl != L[i]) {
          slx += wi * x[i] * (float)nl;
          sl2 += wi * (float)nl * (float)nl;
          if (slx * slx * suml2 > sumlx * sumlx * sl2) {
            L[i] = (uint8_t)nl;
            sumlx = slx;
            suml2 = sl2;
            ++changed;
          }
        }
      }
    }
    if (!changed) break;
  }
  return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

// Q3_K's unweighted sub-block fit: x ~ scale * l, l in [-nmax, nmax), weights x^2, starting from the
// max-magnitude scale and improved element by element (coordinate descent on the weighted error).
float fit_q3_subblock(int n, int nmax, const float* x, int8_t* L) {
  float max = 0, amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < kGroupEpsilon) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.f;
  }
  const float iscale = (float)(-nmax) / max;
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = clamp_int(round_nearest(iscale * x[i]), -nmax, nmax - 1);
    L[i] = (int8_t)l;
    const float w = x[i] * x[i];
    sumlx += w * x[i] * (float)l;
    suml2 += w * (float)l * (float)l;
  }
  for (int pass = 0; pass < 5; ++pass) {
    int changed = 0;
    for (int i = 0; i < n; ++i) {
      const float w = x[i] * x[i];
      float slx = sumlx - w * x[i] * (float)L[i];
      if (slx > 0) {
        float sl2 = suml2 - w * (float)L[i] * (float)L[i];
        const int nl = clamp_int(round_nearest(x[i] * sl2 / slx), -nmax, nmax - 1);
        if (nl != L[i]) {
          slx += w * x[i] * (float)nl;
          sl2 += w * (float)nl * (float)nl;
          if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
            L[i] = (int8_t)nl;
            sumlx = slx;
            suml2 = sl2;
            ++changed;
          }
        }
      }
    }
    if (!changed) break;
  }
  for (int i = 0; i < n; ++i) L[i] = (int8_t)(L[i] + nmax);
  return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// Shared scale searches

float fit_symmetric(int n, int nmax, const float* x, int8_t* L, const float* w) {
  float max = 0, amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < kGroupEpsilon) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.f;
  }
  auto weight = [&](int i) { return w ? w[i] : x[i] * x[i]; };
  float iscale = (float)(-nmax) / max;
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = clamp_int(round_nearest(iscale * x[i]), -nmax, nmax - 1);
    L[i] = (int8_t)(l + nmax);
    const float wi = weight(i);
    sumlx += wi * x[i] * (float)l;
    suml2 += wi * (float)l * (float)l;
  }
  float scale = suml2 != 0.f ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -((float)nmax + 0.1f * (float)is) / max;
    sumlx = suml2 = 0;
    for (int i = 0; i < n; ++i) {
      const int l = clamp_int(round_nearest(iscale * x[i]), -nmax, nmax - 1);
      const float wi = weight(i);
      sumlx += wi * x[i] * (float)l;
      suml2 += wi * (float)l * (float)l;
    }
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i) L[i] = (int8_t)(nmax + clamp_int(round_nearest(iscale * x[i]), -nmax, nmax - 1));
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

float fit_affine_weighted(int n, int nmax, const float* x, const float* w, uint8_t* L, float* neg_min, uint8_t* Laux,
                          float rmin, float rdelta, int nstep, bool use_mad) {
  auto weight = [&](int i) { return w ? w[i] : x[i] * x[i]; };
  // Grid level of v = iscale*(x-min): 0 for v <= 0 (and NaN), nmax above the top.
  auto level = [nmax](float v) { return v > 0 ? round_nearest(v < (float)nmax ? v : (float)nmax) : 0; };
  float min = x[0], max = x[0];
  float sum_w = weight(0);
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    const float wi = weight(i);
    sum_w += wi;
    sum_x += wi * x[i];
  }
  if (min > 0) min = 0;
  if (max <= min) {
    std::memset(L, 0, (size_t)n);
    *neg_min = -min;
    return 0.f;
  }
  float iscale = (float)nmax / (max - min);
  float scale = 1 / iscale;
  float best_err = 0;
  for (int i = 0; i < n; ++i) {
    L[i] = (uint8_t)level(iscale * (x[i] - min));
    float diff = scale * (float)L[i] + min - x[i];
    diff = use_mad ? std::fabs(diff) : diff * diff;
    best_err += weight(i) * diff;
  }
  if (nstep < 1) {
    *neg_min = -min;
    return scale;
  }
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * (float)is + (float)nmax) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = level(iscale * (x[i] - min));
      Laux[i] = (uint8_t)l;
      const float wi = weight(i);
      sum_l += wi * (float)l;
      sum_l2 += wi * (float)l * (float)l;
      sum_xl += wi * (float)l * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float err = 0;
      for (int i = 0; i < n; ++i) {
        float diff = this_scale * (float)Laux[i] + this_min - x[i];
        diff = use_mad ? std::fabs(diff) : diff * diff;
        err += weight(i) * diff;
      }
      if (err < best_err) {
        std::memcpy(L, Laux, (size_t)n);
        best_err = err;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *neg_min = -min;
  return scale;
}

// ---------------------------------------------------------------------------------------------------
// Q2_K: 16 sub-blocks of 16, 4-bit scale and 4-bit min each; value = d*sc*q - dmin*m, q in 0..3.

void dequant_q2_k(const void* src, float* y, int64_t n) {
  const auto* b = static_cast<const BlockQ2_K*>(src);
  for (int64_t i = 0; i < n / kQKK; ++i) {
    const float d = fp16_to_f32(b[i].d);
    const float dmin = fp16_to_f32(b[i].dmin);
    const uint8_t* q = b[i].qs;
    int is = 0;
    for (int half = 0; half < 2; ++half, q += 32) {
      for (int shift = 0; shift < 8; shift += 2) {
        for (int part = 0; part < 2; ++part) {
          const uint8_t sc = b[i].scales[is++];
          const float dl = d * (float)(sc & 0xF);
          const float ml = dmin * (float)(sc >> 4);
          for (int l = 0; l < 16; ++l) *y++ = dl * (float)((q[l + 16 * part] >> shift) & 3) - ml;
        }
      }
    }
  }
}

namespace {

void quant_q2_k_ref(const float* x, BlockQ2_K* y) {
  uint8_t L[kQKK], Laux[16];
  float w[16], mins[16], scales[16];
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < 16; ++j) {
    for (int l = 0; l < 16; ++l) w[l] = std::fabs(x[16 * j + l]);
    scales[j] = fit_affine_weighted(16, 3, x + 16 * j, w, L + 16 * j, &mins[j], Laux, -0.5f, 0.1f, 15, true);
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }
  if (max_scale > 0) {
    const float iscale = 15.f / max_scale;
    for (int j = 0; j < 16; ++j) y->scales[j] = (uint8_t)round_nearest(iscale * scales[j]);
    y->d = f32_to_fp16(max_scale / 15.f);
  } else {
    for (int j = 0; j < 16; ++j) y->scales[j] = 0;
    y->d = f32_to_fp16(0.f);
  }
  if (max_min > 0) {
    const float iscale = 15.f / max_min;
    for (int j = 0; j < 16; ++j) y->scales[j] |= (uint8_t)(round_nearest(iscale * mins[j]) << 4);
    y->dmin = f32_to_fp16(max_min / 15.f);
  } else {
    y->dmin = f32_to_fp16(0.f);
  }
  const float dd = fp16_to_f32(y->d), dm = fp16_to_f32(y->dmin);
  for (int j = 0; j < 16; ++j) {
    const float d = dd * (float)(y->scales[j] & 0xF);
    if (d == 0.f) continue;  // keep the fit's levels
    const float m = dm * (float)(y->scales[j] >> 4);
    for (int l = 0; l < 16; ++l) L[16 * j + l] = (uint8_t)clamp_int(round_nearest((x[16 * j + l] + m) / d), 0, 3);
  }
  pack_2bit_planes(L, y->qs);
}

void quant_q2_k_weighted(const float* x, BlockQ2_K* y, const float* qw) {
  uint8_t L[kQKK], Laux[16], Ls[16], Lm[16];
  float w[16], mins[16], scales[16], sw[16];
  float sumx2 = 0;
  for (int j = 0; j < kQKK; ++j) sumx2 += x[j] * x[j];
  const float sigma2 = sumx2 / (float)kQKK;
  for (int j = 0; j < 16; ++j) {
    for (int l = 0; l < 16; ++l) w[l] = qw[16 * j + l] * std::sqrt(sigma2 + x[16 * j + l] * x[16 * j + l]);
    sw[j] = 0;
    for (int l = 0; l < 16; ++l) sw[j] += w[l];
    scales[j] = fit_affine_weighted(16, 3, x + 16 * j, w, L + 16 * j, &mins[j], Laux, -0.9f, 0.05f, 36, false);
  }
  const float dm0 = fit_positive_grid(16, 15, scales, Ls, sw);
  const float mm0 = fit_positive_grid(16, 15, mins, Lm, sw);
  y->d = f32_to_fp16(dm0);
  y->dmin = f32_to_fp16(mm0);
  const float dm = fp16_to_f32(y->d), mm = fp16_to_f32(y->dmin);
  for (int j = 0; j < 16; ++j) y->scales[j] = (uint8_t)(Ls[j] | (Lm[j] << 4));
  for (int j = 0; j < 16; ++j) {
    const float d = dm * (float)(y->scales[j] & 0xF);
    if (d == 0.f) continue;
    const float m = mm * (float)(y->scales[j] >> 4);
    for (int l = 0; l < 16; ++l) L[16 * j + l] = (uint8_t)clamp_int(round_nearest((x[16 * j + l] + m) / d), 0, 3);
  }
  pack_2bit_planes(L, y->qs);
}

}  // namespace

void quant_q2_k(const float* x, void* dst, int64_t n, const float* imp) {
  auto* b = static_cast<BlockQ2_K*>(dst);
  for (int64_t i = 0; i < n / kQKK; ++i) {
    if (imp) quant_q2_k_weighted(x + i * kQKK, &b[i], imp + i * kQKK);
    else quant_q2_k_ref(x + i * kQKK, &b[i]);
  }
}

// ---------------------------------------------------------------------------------------------------
// Q3_K: 16 sub-blocks of 16, signed 6-bit scales; value = d*(sc-32)*(q2 - (hmask bit ? 0 : 4)).

void dequant_q3_k(const void* src, float* y, int64_t n) {
  const auto* b = static_cast<const BlockQ3_K*>(src);
  for (int64_t i = 0; i < n / kQKK; ++i) {
    const float d_all = fp16_to_f32(b[i].d);
    const uint8_t* q = b[i].qs;
    const uint8_t* hm = b[i].hmask;
    uint8_t mask = 1;
    int is = 0;
    for (int half = 0; half < 2; ++half, q += 32) {
      for (int shift = 0; shift < 8; shift += 2, mask = (uint8_t)(mask << 1)) {
        for (int part = 0; part < 2; ++part) {
          const float dl = d_all * (float)q3k_scale(b[i].scales, is++);
          for (int l = 0; l < 16; ++l) {
            const int k = l + 16 * part;
            const int v = ((q[k] >> shift) & 3) - ((hm[k] & mask) ? 0 : 4);
            *y++ = dl * (float)v;
          }
        }
      }
    }
  }
}

namespace {

// Requantizes every element against the stored scales, then writes hmask and the 2-bit planes.
// L holds the fit's levels 0..7 (kept for sub-blocks whose stored scale is zero).
void finish_q3_k(const float* x, BlockQ3_K* y, int8_t* L) {
  const float dd = fp16_to_f32(y->d);
  for (int j = 0; j < 16; ++j) {
    const float d = dd * (float)q3k_scale(y->scales, j);
    if (d == 0.f) continue;
    for (int l = 0; l < 16; ++l) L[16 * j + l] = (int8_t)(clamp_int(round_nearest(x[16 * j + l] / d), -4, 3) + 4);
  }
  std::memset(y->hmask, 0, sizeof(y->hmask));
  for (int j = 0; j < kQKK; ++j) {
    if (L[j] > 3) {
      y->hmask[j % 32] |= (uint8_t)(1u << (j / 32));
      L[j] = (int8_t)(L[j] - 4);
    }
  }
  uint8_t U[kQKK];
  for (int j = 0; j < kQKK; ++j) U[j] = (uint8_t)L[j];
  pack_2bit_planes(U, y->qs);
}

// Stores the 6-bit level l (0..63) of scale j.
void put_q3k_scale(uint8_t* s, int j, int l) {
  if (j < 8) s[j] = (uint8_t)(l & 0xF);
  else s[j - 8] |= (uint8_t)((l & 0xF) << 4);
  s[j % 4 + 8] |= (uint8_t)((l >> 4) << (2 * (j / 4)));
}

void quant_q3_k_ref(const float* x, BlockQ3_K* y) {
  int8_t L[kQKK];
  float scales[16];
  float max_scale = 0, amax = 0;
  for (int j = 0; j < 16; ++j) {
    scales[j] = fit_q3_subblock(16, 4, x + 16 * j, L + 16 * j);
    const float a = std::fabs(scales[j]);
    if (a > amax) {
      amax = a;
      max_scale = scales[j];
    }
  }
  std::memset(y->scales, 0, sizeof(y->scales));
  if (max_scale != 0.f) {
    const float iscale = -32.f / max_scale;
    for (int j = 0; j < 16; ++j) {
      const int8_t l8 = (int8_t)round_nearest(iscale * scales[j]);
      put_q3k_scale(y->scales, j, clamp_int(l8, -32, 31) + 32);
    }
    y->d = f32_to_fp16(1 / iscale);
  } else {
    y->d = f32_to_fp16(0.f);
  }
  finish_q3_k(x, y, L);
}

void quant_q3_k_weighted(const float* x, BlockQ3_K* y, const float* qw) {
  int8_t L[kQKK], Ls[16];
  float scales[16], w[16], sw[16];
  float sumx2 = 0;
  for (int j = 0; j < kQKK; ++j) sumx2 += x[j] * x[j];
  const float sigma2 = 2 * sumx2 / (float)kQKK;
  for (int j = 0; j < 16; ++j) {
    for (int l = 0; l < 16; ++l) w[l] = qw[16 * j + l] * std::sqrt(sigma2 + x[16 * j + l] * x[16 * j + l]);
    float sumw = 0;
    for (int l = 0; l < 16; ++l) sumw += w[l];
    sw[j] = sumw;
    scales[j] = fit_symmetric(16, 4, x + 16 * j, L + 16 * j, w);
  }
  std::memset(y->scales, 0, sizeof(y->scales));
  const float d_block = fit_symmetric(16, 32, scales, Ls, sw);
  for (int j = 0; j < 16; ++j) put_q3k_scale(y->scales, j, Ls[j]);
  y->d = f32_to_fp16(d_block);
  finish_q3_k(x, y, L);
}

}  // namespace

void quant_q3_k(const float* x, void* dst, int64_t n, const float* imp) {
  auto* b = static_cast<BlockQ3_K*>(dst);
  for (int64_t i = 0; i < n / kQKK; ++i) {
    if (imp) quant_q3_k_weighted(x + i * kQKK, &b[i], imp + i * kQKK);
    else quant_q3_k_ref(x + i * kQKK, &b[i]);
  }
}

// ---------------------------------------------------------------------------------------------------
// Q4_K / Q5_K: 8 sub-blocks of 32 with 6-bit scale and min; value = d*sc*q - dmin*m.

void dequant_q4_k(const void* src, float* y, int64_t n) {
  const auto* b = static_cast<const BlockQ4_K*>(src);
  for (int64_t i = 0; i < n / kQKK; ++i) {
    const float d = fp16_to_f32(b[i].d);
    const float dmin = fp16_to_f32(b[i].dmin);
    const uint8_t* q = b[i].qs;
    for (int c = 0; c < 4; ++c, q += 32) {
      uint8_t sc, m;
      unpack_k4_scale_min(2 * c, b[i].scales, &sc, &m);
      const float d1 = d * (float)sc, m1 = dmin * (float)m;
      unpack_k4_scale_min(2 * c + 1, b[i].scales, &sc, &m);
      const float d2 = d * (float)sc, m2 = dmin * (float)m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * (float)(q[l] & 0xF) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * (float)(q[l] >> 4) - m2;
    }
  }
}

void dequant_q5_k(const void* src, float* y, int64_t n) {
  const auto* b = static_cast<const BlockQ5_K*>(src);
  for (int64_t i = 0; i < n / kQKK; ++i) {
    const float d = fp16_to_f32(b[i].d);
    const float dmin = fp16_to_f32(b[i].dmin);
    const uint8_t* ql = b[i].qs;
    const uint8_t* qh = b[i].qh;
    for (int c = 0; c < 4; ++c, ql += 32) {
      uint8_t sc, m;
      unpack_k4_scale_min(2 * c, b[i].scales, &sc, &m);
      const float d1 = d * (float)sc, m1 = dmin * (float)m;
      unpack_k4_scale_min(2 * c + 1, b[i].scales, &sc, &m);
      const float d2 = d * (float)sc, m2 = dmin * (float)m;
      const uint8_t u1 = (uint8_t)(1u << (2 * c)), u2 = (uint8_t)(2u << (2 * c));
      for (int l = 0; l < 32; ++l) *y++ = d1 * (float)((ql[l] & 0xF) + ((qh[l] & u1) ? 16 : 0)) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * (float)((ql[l] >> 4) + ((qh[l] & u2) ? 16 : 0)) - m2;
    }
  }
}

namespace {

// Shared by Q4_K (nmax 15) and Q5_K (nmax 31): fills d, dmin, the 12 scale bytes and the levels L.
template <int kNmax>
void quant_k4_levels(const float* x, uint16_t* d_out, uint16_t* dmin_out, uint8_t* scale_bytes, uint8_t* L,
                     const float* qw) {
  uint8_t Laux[32];
  float w[32], mins[8], scales[8];
  if (!qw) {
    // Reference: per sub-block search with weights rms + |x|, then scales and mins quantized to 6 bits
    // against their maxima.
    constexpr float kRmin = kNmax == 15 ? -1.f : -0.5f;
    constexpr int kSteps = kNmax == 15 ? 20 : 15;
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; ++j) {
      float sum_x2 = 0;
      for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
      const float av_x = std::sqrt(sum_x2 / 32.f);
      for (int l = 0; l < 32; ++l) w[l] = av_x + std::fabs(x[32 * j + l]);
      scales[j] = fit_affine_weighted(32, kNmax, x + 32 * j, w, L + 32 * j, &mins[j], Laux, kRmin, 0.1f, kSteps, false);
      if (scales[j] > max_scale) max_scale = scales[j];
      if (mins[j] > max_min) max_min = mins[j];
    }
    const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    for (int j = 0; j < 8; ++j) {
      uint8_t ls = (uint8_t)round_nearest(inv_scale * scales[j]);
      uint8_t lm = (uint8_t)round_nearest(inv_min * mins[j]);
      ls = ls < 63 ? ls : 63;
      lm = lm < 63 ? lm : 63;
      pack_k4_scale_min(j, ls, lm, scale_bytes);
    }
    *d_out = f32_to_fp16(max_scale / 63.f);
    *dmin_out = f32_to_fp16(max_min / 63.f);
  } else {
    // Importance-weighted: weights imp*sqrt(sigma2 + x^2), a finer scale/min grid, and the 6-bit
    // scales and mins fitted to the sub-block weight sums.
    uint8_t Ls[8], Lm[8];
    float sw[8];
    float sum_x2 = 0;
    for (int l = 0; l < kQKK; ++l) sum_x2 += x[l] * x[l];
    const float sigma2 = 2 * sum_x2 / (float)kQKK;
    for (int j = 0; j < 8; ++j) {
      for (int l = 0; l < 32; ++l) w[l] = qw[32 * j + l] * std::sqrt(sigma2 + x[32 * j + l] * x[32 * j + l]);
      float sumw = 0;
      for (int l = 0; l < 32; ++l) sumw += w[l];
      sw[j] = sumw;
      scales[j] = fit_affine_weighted(32, kNmax, x + 32 * j, w, L + 32 * j, &mins[j], Laux, -0.9f, 0.05f, 36, false);
    }
    const float d_block = fit_positive_grid(8, 63, scales, Ls, sw);
    const float m_block = fit_positive_grid(8, 63, mins, Lm, sw);
    for (int j = 0; j < 8; ++j) {
      const uint8_t ls = Ls[j] < 63 ? Ls[j] : 63;
      const uint8_t lm = Lm[j] < 63 ? Lm[j] : 63;
      pack_k4_scale_min(j, ls, lm, scale_bytes);
    }
    *d_out = f32_to_fp16(d_block);
    *dmin_out = f32_to_fp16(m_block);
  }
  const float dd = fp16_to_f32(*d_out), dm = fp16_to_f32(*dmin_out);
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    unpack_k4_scale_min(j, scale_bytes, &sc, &m);
    const float d = dd * (float)sc;
    if (d == 0.f) continue;
    const float dmj = dm * (float)m;
    for (int l = 0; l < 32; ++l) L[32 * j + l] = (uint8_t)clamp_int(round_nearest((x[32 * j + l] + dmj) / d), 0, kNmax);
  }
}

}  // namespace

void quant_q4_k(const float* x, void* dst, int64_t n, const float* imp) {
  auto* b = static_cast<BlockQ4_K*>(dst);
  uint8_t L[kQKK];
  for (int64_t i = 0; i < n / kQKK; ++i) {
    std::memset(b[i].scales, 0, sizeof(b[i].scales));
    quant_k4_levels<15>(x + i * kQKK, &b[i].d, &b[i].dmin, b[i].scales, L, imp ? imp + i * kQKK : nullptr);
    for (int c = 0; c < 4; ++c) {
      for (int l = 0; l < 32; ++l) b[i].qs[32 * c + l] = (uint8_t)(L[64 * c + l] | (L[64 * c + l + 32] << 4));
    }
  }
}

void quant_q5_k(const float* x, void* dst, int64_t n, const float* imp) {
  auto* b = static_cast<BlockQ5_K*>(dst);
  uint8_t L[kQKK];
  for (int64_t i = 0; i < n / kQKK; ++i) {
    std::memset(b[i].scales, 0, sizeof(b[i].scales));
    quant_k4_levels<31>(x + i * kQKK, &b[i].d, &b[i].dmin, b[i].scales, L, imp ? imp + i * kQKK : nullptr);
    std::memset(b[i].qh, 0, sizeof(b[i].qh));
    for (int c = 0; c < 4; ++c) {
      const uint8_t m1 = (uint8_t)(1u << (2 * c)), m2 = (uint8_t)(2u << (2 * c));
      for (int l = 0; l < 32; ++l) {
        int lo = L[64 * c + l], hi = L[64 * c + l + 32];
        if (lo > 15) {
          lo -= 16;
          b[i].qh[l] |= m1;
        }
        if (hi > 15) {
          hi -= 16;
          b[i].qh[l] |= m2;
        }
        b[i].qs[32 * c + l] = (uint8_t)(lo | (hi << 4));
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// Q6_K: 16 sub-blocks of 16 with int8 scales; value = d*sc*(q6-32).

void dequant_q6_k(const void* src, float* y, int64_t n) {
  const auto* b = static_cast<const BlockQ6_K*>(src);
  for (int64_t i = 0; i < n / kQKK; ++i) {
    const float d = fp16_to_f32(b[i].d);
    const uint8_t* ql = b[i].ql;
    const uint8_t* qh = b[i].qh;
    const int8_t* sc = b[i].scales;
    for (int half = 0; half < 2; ++half, y += 128, ql += 64, qh += 32, sc += 8) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = d * (float)sc[is + 0] * (float)q1;
        y[l + 32] = d * (float)sc[is + 2] * (float)q2;
        y[l + 64] = d * (float)sc[is + 4] * (float)q3;
        y[l + 96] = d * (float)sc[is + 6] * (float)q4;
      }
    }
  }
}

void quant_q6_k(const float* x, void* dst, int64_t n, const float* imp) {
  auto* b = static_cast<BlockQ6_K*>(dst);
  int8_t L[kQKK];
  float scales[16];
  for (int64_t i = 0; i < n / kQKK; ++i, x += kQKK) {
    BlockQ6_K* y = &b[i];
    const float* qw = imp ? imp + i * kQKK : nullptr;
    float max_scale = 0, max_abs_scale = 0;
    for (int ib = 0; ib < 16; ++ib) {
      // Without importance the search weights are x^2; with it, the importance itself.
      scales[ib] = fit_symmetric(16, 32, x + 16 * ib, L + 16 * ib, qw ? qw + 16 * ib : nullptr);
      const float a = std::fabs(scales[ib]);
      if (a > max_abs_scale) {
        max_abs_scale = a;
        max_scale = scales[ib];
      }
    }
    if (max_abs_scale < kGroupEpsilon) {
      std::memset(y, 0, sizeof(*y));
      continue;
    }
    const float iscale = -128.f / max_scale;
    y->d = f32_to_fp16(1 / iscale);
    for (int ib = 0; ib < 16; ++ib) {
      const int s = round_nearest(iscale * scales[ib]);
      y->scales[ib] = (int8_t)(s < 127 ? s : 127);
    }
    const float dd = fp16_to_f32(y->d);
    for (int j = 0; j < 16; ++j) {
      const float d = dd * (float)y->scales[j];
      if (d == 0.f) continue;
      for (int l = 0; l < 16; ++l) L[16 * j + l] = (int8_t)(clamp_int(round_nearest(x[16 * j + l] / d), -32, 31) + 32);
    }
    uint8_t* ql = y->ql;
    uint8_t* qh = y->qh;
    for (int half = 0; half < kQKK; half += 128, ql += 64, qh += 32) {
      for (int l = 0; l < 32; ++l) {
        const int a = L[half + l], bq = L[half + l + 32], c = L[half + l + 64], e = L[half + l + 96];
        ql[l] = (uint8_t)((a & 0xF) | ((c & 0xF) << 4));
        ql[l + 32] = (uint8_t)((bq & 0xF) | ((e & 0xF) << 4));
        qh[l] = (uint8_t)((a >> 4) | ((bq >> 4) << 2) | ((c >> 4) << 4) | ((e >> 4) << 6));
      }
    }
  }
}

}  // namespace roofline::quant_detail
