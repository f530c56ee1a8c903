// Portable scalar dot kernels for every weight type against its activation format (vec_dot.h):
// integer sums per block (exact), then one float multiply-add per block in element order. The
// reference the SIMD kernels are tested beside, and the path on CPUs without AVX2.
#include <cstring>

#include "backend/cpu/vec_dot.h"
#include "core/fp16.h"
#include "formats/quant_blocks.h"

namespace roofline::cpu {
namespace {

// ---- plain float weights (activations F32) ----

template <typename Load>
float dot_float(const void* wv, const void* av, int64_t n, Load load) {
  const auto* a = static_cast<const float*>(av);
  float s[4] = {0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    for (int k = 0; k < 4; ++k) s[k] += load(wv, i + k) * a[i + k];
  }
  for (; i < n; ++i) s[0] += load(wv, i) * a[i];
  return (s[0] + s[1]) + (s[2] + s[3]);
}

float dot_f32(const void* w, const void* a, int64_t n) {
  return dot_float(w, a, n, [](const void* p, int64_t i) { return static_cast<const float*>(p)[i]; });
}
float dot_f16(const void* w, const void* a, int64_t n) {
  return dot_float(w, a, n, [](const void* p, int64_t i) { return fp16_to_f32(static_cast<const uint16_t*>(p)[i]); });
}
float dot_bf16(const void* w, const void* a, int64_t n) {
  return dot_float(w, a, n, [](const void* p, int64_t i) { return bf16_to_f32(static_cast<const uint16_t*>(p)[i]); });
}

// ---- 32-element blocks (activations Q8_0 / Q8_1) ----

inline uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

float dot_q4_0(const void* wv, const void* av, int64_t n) {
  const auto* w = static_cast<const BlockQ4_0*>(wv);
  const auto* a = static_cast<const BlockQ8_0*>(av);
  float acc = 0;
  for (int64_t i = 0; i < n / kQK; ++i) {
    int s = 0;
    for (int j = 0; j < 16; ++j) {
      s += ((w[i].qs[j] & 0xF) - 8) * a[i].qs[j] + ((w[i].qs[j] >> 4) - 8) * a[i].qs[j + 16];
    }
    acc += fp16_to_f32(w[i].d) * fp16_to_f32(a[i].d) * (float)s;
  }
  return acc;
}

float dot_q4_1(const void* wv, const void* av, int64_t n) {
  const auto* w = static_cast<const BlockQ4_1*>(wv);
  const auto* a = static_cast<const ActBlockQ8_1*>(av);
  float acc = 0;
  for (int64_t i = 0; i < n / kQK; ++i) {
    int s = 0;
    for (int j = 0; j < 16; ++j) s += (w[i].qs[j] & 0xF) * a[i].qs[j] + (w[i].qs[j] >> 4) * a[i].qs[j + 16];
    const float da = fp16_to_f32(a[i].d);
    acc += fp16_to_f32(w[i].d) * da * (float)s + fp16_to_f32(w[i].m) * (da * (float)a[i].sum);
  }
  return acc;
}

float dot_q5_0(const void* wv, const void* av, int64_t n) {
  const auto* w = static_cast<const BlockQ5_0*>(wv);
  const auto* a = static_cast<const BlockQ8_0*>(av);
  float acc = 0;
  for (int64_t i = 0; i < n / kQK; ++i) {
    const uint32_t qh = load_u32(w[i].qh);
    int s = 0;
    for (int j = 0; j < 16; ++j) {
      const int lo = (int)((w[i].qs[j] & 0xF) | (((qh >> j) & 1u) << 4)) - 16;
      const int hi = (int)((w[i].qs[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4)) - 16;
      s += lo * a[i].qs[j] + hi * a[i].qs[j + 16];
    }
    acc += fp16_to_f32(w[i].d) * fp16_to_f32(a[i].d) * (float)s;
  }
  return acc;
}

float dot_q5_1(const void* wv, const void* av, int64_t n) {
  const auto* w = static_cast<const BlockQ5_1*>(wv);
  const auto* a = static_cast<const ActBlockQ8_1*>(av);
  float acc = 0;
  for (int64_t i = 0; i < n / kQK; ++i) {
    const uint32_t qh = load_u32(w[i].qh);
    int s = 0;
    for (int j = 0; j < 16; ++j) {
      const int lo = (int)((w[i].qs[j] & 0xF) | (((qh >> j) & 1u) << 4));
      const int hi = (int)((w[i].qs[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4));
      s += lo * a[i].qs[j] + hi * a[i].qs[j + 16];
    }
    const float da = fp16_to_f32(a[i].d);
    acc += fp16_to_f32(w[i].d) * da * (float)s + fp16_to_f32(w[i].m) * (da * (float)a[i].sum);
  }
  return acc;
}

float dot_q8_0(const void* wv, const void* av, int64_t n) {
  const auto* w = static_cast<const BlockQ8_0*>(wv);
  const auto* a = static_cast<const BlockQ8_0*>(av);
  float acc = 0;
  for (int64_t i = 0; i < n / kQK; ++i) {
    int s = 0;
    for (int j = 0; j < kQK; ++j) s += w[i].qs[j] * a[i].qs[j];
    acc += fp16_to_f32(w[i].d) * fp16_to_f32(a[i].d) * (float)s;
  }
  return acc;
}

float dot_iq4_nl(const void* wv, const void* av, int64_t n) {
  const auto* w = static_cast<const BlockIQ4_NL*>(wv);
  const auto* a = static_cast<const BlockQ8_0*>(av);
  float acc = 0;
  for (int64_t i = 0; i < n / kQK; ++i) {
    int s = 0;
    for (int j = 0; j < 16; ++j) {
      s += kIQ4NLValues[w[i].qs[j] & 0xF] * a[i].qs[j] + kIQ4NLValues[w[i].qs[j] >> 4] * a[i].qs[j + 16];
    }
    acc += fp16_to_f32(w[i].d) * fp16_to_f32(a[i].d) * (float)s;
  }
  return acc;
}

// ---- 256-element super-blocks (activations Q8_K) ----

// sum over 16 elements of a 16-element sub-block: w levels (0..63 or signed) times activations.
inline int dot16(const int8_t* lv, const int8_t* q) {
  int s = 0;
  for (int l = 0; l < 16; ++l) s += lv[l] * q[l];
  return s;
}

float dot_q2_k(const void* wv, const void* av, int64_t n) {
  const auto* w = static_cast<const BlockQ2_K*>(wv);
  const auto* a = static_cast<const BlockQ8_K*>(av);
  float acc = 0;
  int8_t lv[kQKK];
  for (int64_t i = 0; i < n / kQKK; ++i) {
    // Element 128*h + 32*k + m holds bits 2k..2k+1 of qs[32*h + m]; sub-block = element / 16.
    for (int h = 0; h < 2; ++h) {
      for (int k = 0; k < 4; ++k) {
        for (int m = 0; m < 32; ++m) lv[128 * h + 32 * k + m] = (int8_t)((w[i].qs[32 * h + m] >> (2 * k)) & 3);
      }
    }
    int isum = 0, msum = 0;
    for (int sb = 0; sb < 16; ++sb) {
      isum += (w[i].scales[sb] & 0xF) * dot16(lv + 16 * sb, a[i].qs + 16 * sb);
      msum += (w[i].scales[sb] >> 4) * a[i].bsums[sb];
    }
    acc += fp16_to_f32(w[i].d) * a[i].d * (float)isum - fp16_to_f32(w[i].dmin) * a[i].d * (float)msum;
  }
  return acc;
}

// The 16 signed 6-bit scales of a Q3_K block (-32..31), from its 12 scale bytes.
void q3k_scales(const uint8_t* s, int8_t* out) {
  for (int j = 0; j < 16; ++j) {
    const int low = j < 8 ? (s[j] & 0xF) : (s[j - 8] >> 4);
    const int high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
    out[j] = (int8_t)((low | (high << 4)) - 32);
  }
}

float dot_q3_k(const void* wv, const void* av, int64_t n) {
  const auto* w = static_cast<const BlockQ3_K*>(wv);
  const auto* a = static_cast<const BlockQ8_K*>(av);
  float acc = 0;
  int8_t lv[kQKK], sc[16];
  for (int64_t i = 0; i < n / kQKK; ++i) {
    // Element 128*h + 32*k + m: bits 2k..2k+1 of qs[32*h + m], minus 4 unless bit 4h+k of hmask[m].
    for (int h = 0; h < 2; ++h) {
      for (int k = 0; k < 4; ++k) {
        for (int m = 0; m < 32; ++m) {
          const int q2 = (w[i].qs[32 * h + m] >> (2 * k)) & 3;
          const int hb = (w[i].hmask[m] >> (4 * h + k)) & 1;
          lv[128 * h + 32 * k + m] = (int8_t)(q2 - (hb ? 0 : 4));
        }
      }
    }
    q3k_scales(w[i].scales, sc);
    int isum = 0;
    for (int sb = 0; sb < 16; ++sb) isum += sc[sb] * dot16(lv + 16 * sb, a[i].qs + 16 * sb);
    acc += fp16_to_f32(w[i].d) * a[i].d * (float)isum;
  }
  return acc;
}

// Shared by Q4_K and Q5_K: 8 sub-blocks of 32 with 6-bit scale and min; `lv` holds the levels.
inline float k4_block(uint16_t d, uint16_t dmin, const uint8_t* scales, const int8_t* lv, const BlockQ8_K& a) {
  int isum = 0, msum = 0;
  for (int sb = 0; sb < 8; ++sb) {
    uint8_t sc, mn;
    unpack_k4_scale_min(sb, scales, &sc, &mn);
    isum += sc * (dot16(lv + 32 * sb, a.qs + 32 * sb) + dot16(lv + 32 * sb + 16, a.qs + 32 * sb + 16));
    msum += mn * (a.bsums[2 * sb] + a.bsums[2 * sb + 1]);
  }
  return fp16_to_f32(d) * a.d * (float)isum - fp16_to_f32(dmin) * a.d * (float)msum;
}

float dot_q4_k(const void* wv, const void* av, int64_t n) {
  const auto* w = static_cast<const BlockQ4_K*>(wv);
  const auto* a = static_cast<const BlockQ8_K*>(av);
  float acc = 0;
  int8_t lv[kQKK];
  for (int64_t i = 0; i < n / kQKK; ++i) {
    // Element 64*c + m (m < 32): low nibble of qs[32*c + m]; element 64*c + 32 + m: its high nibble.
    for (int c = 0; c < 4; ++c) {
      for (int m = 0; m < 32; ++m) {
        lv[64 * c + m] = (int8_t)(w[i].qs[32 * c + m] & 0xF);
        lv[64 * c + 32 + m] = (int8_t)(w[i].qs[32 * c + m] >> 4);
      }
    }
    acc += k4_block(w[i].d, w[i].dmin, w[i].scales, lv, a[i]);
  }
  return acc;
}

float dot_q5_k(const void* wv, const void* av, int64_t n) {
  const auto* w = static_cast<const BlockQ5_K*>(wv);
  const auto* a = static_cast<const BlockQ8_K*>(av);
  float acc = 0;
  int8_t lv[kQKK];
  for (int64_t i = 0; i < n / kQKK; ++i) {
    // As Q4_K, plus bit 2c (low nibbles) or 2c+1 (high nibbles) of qh[m] as the fifth bit.
    for (int c = 0; c < 4; ++c) {
      for (int m = 0; m < 32; ++m) {
        const int qh = w[i].qh[m];
        lv[64 * c + m] = (int8_t)((w[i].qs[32 * c + m] & 0xF) | (((qh >> (2 * c)) & 1) << 4));
        lv[64 * c + 32 + m] = (int8_t)((w[i].qs[32 * c + m] >> 4) | (((qh >> (2 * c + 1)) & 1) << 4));
      }
    }
    acc += k4_block(w[i].d, w[i].dmin, w[i].scales, lv, a[i]);
  }
  return acc;
}

float dot_q6_k(const void* wv, const void* av, int64_t n) {
  const auto* w = static_cast<const BlockQ6_K*>(wv);
  const auto* a = static_cast<const BlockQ8_K*>(av);
  float acc = 0;
  int8_t lv[kQKK];
  for (int64_t i = 0; i < n / kQKK; ++i) {
    // Half h, m < 32: elements 128h+m, +32, +64, +96 take the low/low/high/high nibbles of
    // ql[64h+m], ql[64h+32+m], ql[64h+m], ql[64h+32+m] and bit pairs 0,2,4,6 of qh[32h+m]; minus 32.
    for (int h = 0; h < 2; ++h) {
      const uint8_t* ql = w[i].ql + 64 * h;
      const uint8_t* qh = w[i].qh + 32 * h;
      int8_t* y = lv + 128 * h;
      for (int m = 0; m < 32; ++m) {
        y[m] = (int8_t)(((ql[m] & 0xF) | ((qh[m] & 3) << 4)) - 32);
        y[m + 32] = (int8_t)(((ql[m + 32] & 0xF) | (((qh[m] >> 2) & 3) << 4)) - 32);
        y[m + 64] = (int8_t)(((ql[m] >> 4) | (((qh[m] >> 4) & 3) << 4)) - 32);
        y[m + 96] = (int8_t)(((ql[m + 32] >> 4) | (((qh[m] >> 6) & 3) << 4)) - 32);
      }
    }
    int isum = 0;
    for (int sb = 0; sb < 16; ++sb) isum += w[i].scales[sb] * dot16(lv + 16 * sb, a[i].qs + 16 * sb);
    acc += fp16_to_f32(w[i].d) * a[i].d * (float)isum;
  }
  return acc;
}

float dot_iq4_xs(const void* wv, const void* av, int64_t n) {
  const auto* w = static_cast<const BlockIQ4_XS*>(wv);
  const auto* a = static_cast<const BlockQ8_K*>(av);
  float acc = 0;
  for (int64_t i = 0; i < n / kQKK; ++i) {
    int isum = 0;
    for (int sb = 0; sb < 8; ++sb) {
      const int ls = ((w[i].scales_l[sb / 2] >> (4 * (sb % 2))) & 0xF) | (((w[i].scales_h >> (2 * sb)) & 3) << 4);
      const uint8_t* qs = w[i].qs + 16 * sb;
      const int8_t* q = a[i].qs + 32 * sb;
      int s = 0;
      for (int j = 0; j < 16; ++j) s += kIQ4NLValues[qs[j] & 0xF] * q[j] + kIQ4NLValues[qs[j] >> 4] * q[j + 16];
      isum += (ls - 32) * s;
    }
    acc += fp16_to_f32(w[i].d) * a[i].d * (float)isum;
  }
  return acc;
}

// The scalar tile is the single dot per output: identical results by construction.
template <VecDotFn Dot>
void tile(const void* w, size_t w_stride, int n_w, const void* a, size_t a_stride, int n_a, int64_t n, float* y,
          size_t ldy) {
  for (int r = 0; r < n_w; ++r) {
    const void* wr = static_cast<const uint8_t*>(w) + (size_t)r * w_stride;
    for (int c = 0; c < n_a; ++c) y[(size_t)c * ldy + r] = Dot(wr, static_cast<const uint8_t*>(a) + (size_t)c * a_stride, n);
  }
}

}  // namespace

namespace detail {

#define ROOFLINE_SCALAR_KERNELS(X) \
  X(F32, dot_f32)                  \
  X(F16, dot_f16)                  \
  X(BF16, dot_bf16)                \
  X(Q4_0, dot_q4_0)                \
  X(Q4_1, dot_q4_1)                \
  X(Q5_0, dot_q5_0)                \
  X(Q5_1, dot_q5_1)                \
  X(Q8_0, dot_q8_0)                \
  X(Q2_K, dot_q2_k)                \
  X(Q3_K, dot_q3_k)                \
  X(Q4_K, dot_q4_k)                \
  X(Q5_K, dot_q5_k)                \
  X(Q6_K, dot_q6_k)                \
  X(IQ4_NL, dot_iq4_nl)            \
  X(IQ4_XS, dot_iq4_xs)

VecDotFn scalar_dot(DType t) {
  switch (t) {
#define X(type, fn) \
  case DType::type: return fn;
    ROOFLINE_SCALAR_KERNELS(X)
#undef X
    default: return nullptr;
  }
}

VecDotTileFn scalar_tile(DType t) {
  switch (t) {
#define X(type, fn) \
  case DType::type: return tile<fn>;
    ROOFLINE_SCALAR_KERNELS(X)
#undef X
    default: return nullptr;
  }
}

#undef ROOFLINE_SCALAR_KERNELS

}  // namespace detail
}  // namespace roofline::cpu
