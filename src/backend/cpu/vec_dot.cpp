// Dispatch of the CPU dot-product kernels (AVX-512 VNNI, AVX2 or scalar: the highest the CPU has) and the activation
// formats: which one each weight type pairs with, and the scalar quantizer that defines their bytes
// (the AVX2 quantizer in vec_dot_avx2.cpp must produce the same bytes).
#include "backend/cpu/vec_dot.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "core/fp16.h"
#include "formats/quant_blocks.h"
#include "formats/quant_ref.h"

namespace roofline::cpu {

ActFormat act_format_for(DType t) {
  switch (t) {
    case DType::F32:
    case DType::F16:
    case DType::BF16: return ActFormat::F32;
    case DType::Q4_0:
    case DType::Q5_0:
    case DType::Q8_0:
    case DType::IQ4_NL: return ActFormat::Q8_0;
    case DType::Q4_1:
    case DType::Q5_1: return ActFormat::Q8_1;
    case DType::Q2_K:
    case DType::Q3_K:
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
    case DType::IQ4_XS: return ActFormat::Q8_K;
    default: fail("no CPU kernel for tensor type {}", dtype_name(t));
  }
}

namespace {

int64_t act_block(ActFormat f) {
  switch (f) {
    case ActFormat::F32: return 1;
    case ActFormat::Q8_0:
    case ActFormat::Q8_1: return kQK;
    case ActFormat::Q8_K: return kQKK;
  }
  return 1;
}

size_t act_block_bytes(ActFormat f) {
  switch (f) {
    case ActFormat::F32: return sizeof(float);
    case ActFormat::Q8_0: return sizeof(BlockQ8_0);
    case ActFormat::Q8_1: return sizeof(ActBlockQ8_1);
    case ActFormat::Q8_K: return sizeof(BlockQ8_K);
  }
  return 0;
}

// Round to nearest, ties to even (what cvtps_epi32 does in the default rounding mode); exact for
// |v| < 2^22, and callers clamp the result, so other inputs (inf, NaN) only give some clamped value.
inline int round_even(float v) {
  const float biased = v + 12582912.f;
  int32_t bits;
  std::memcpy(&bits, &biased, sizeof(bits));
  return (bits & 0x007fffff) - 0x00400000;
}

inline int8_t clamp_q(int v) { return (int8_t)std::clamp(v, -127, 127); }

inline float block_amax(const float* x, int n) {
  float amax = 0;
  for (int j = 0; j < n; ++j) amax = std::max(amax, std::fabs(x[j]));
  return amax;
}

// One 32-element block with an f16 scale: returns the sum of the quantized values.
int quantize_block_f16_scale(const float* x, uint16_t* d_out, int8_t* q) {
  const float amax = block_amax(x, kQK);
  const uint16_t d16 = f32_to_fp16(amax / 127.f);
  const float d = fp16_to_f32(d16);
  const float id = d != 0.f ? 1.f / d : 0.f;
  *d_out = d16;
  int sum = 0;
  for (int j = 0; j < kQK; ++j) {
    q[j] = clamp_q(round_even(x[j] * id));
    sum += q[j];
  }
  return sum;
}

}  // namespace

size_t act_row_bytes(ActFormat format, int64_t n) {
  const int64_t bs = act_block(format);
  ROOFLINE_CHECK(n >= 0 && n % bs == 0, "row of {} elements is not a multiple of {}", n, bs);
  return (size_t)(n / bs) * act_block_bytes(format);
}

namespace detail {

void quantize_act_row_scalar(ActFormat format, const float* x, void* dst, int64_t n) {
  ROOFLINE_CHECK(n % act_block(format) == 0);
  switch (format) {
    case ActFormat::F32: std::memcpy(dst, x, (size_t)n * sizeof(float)); return;
    case ActFormat::Q8_0: {
      auto* b = static_cast<BlockQ8_0*>(dst);
      for (int64_t i = 0; i < n / kQK; ++i) quantize_block_f16_scale(x + i * kQK, &b[i].d, b[i].qs);
      return;
    }
    case ActFormat::Q8_1: {
      auto* b = static_cast<ActBlockQ8_1*>(dst);
      for (int64_t i = 0; i < n / kQK; ++i) b[i].sum = (int16_t)quantize_block_f16_scale(x + i * kQK, &b[i].d, b[i].qs);
      return;
    }
    case ActFormat::Q8_K: {
      auto* b = static_cast<BlockQ8_K*>(dst);
      for (int64_t i = 0; i < n / kQKK; ++i) {
        const float* xb = x + i * kQKK;
        const float amax = block_amax(xb, kQKK);
        const float d = amax / 127.f;
        const float id = d != 0.f ? 1.f / d : 0.f;
        b[i].d = d;
        for (int j = 0; j < kQKK; ++j) b[i].qs[j] = clamp_q(round_even(xb[j] * id));
        for (int g = 0; g < kQKK / 16; ++g) {
          int s = 0;
          for (int j = 0; j < 16; ++j) s += b[i].qs[16 * g + j];
          b[i].bsums[g] = (int16_t)s;
        }
      }
      return;
    }
  }
}

}  // namespace detail

void quantize_act_row(ActFormat format, const float* x, void* dst, int64_t n) {
  ROOFLINE_CHECK(n % act_block(format) == 0, "row of {} elements is not a multiple of {}", n, act_block(format));
  if (format != ActFormat::F32 && cpu_isa() >= CpuIsa::Avx2) return detail::quantize_act_row_avx2(format, x, dst, n);
  detail::quantize_act_row_scalar(format, x, dst, n);
}

VecDotFn vec_dot_scalar_fn(DType t) {
  if (VecDotFn f = detail::scalar_dot(t)) return f;
  fail("no CPU kernel for tensor type {}", dtype_name(t));
}

VecDotTileFn vec_dot_tile_scalar_fn(DType t) {
  if (VecDotTileFn f = detail::scalar_tile(t)) return f;
  fail("no CPU kernel for tensor type {}", dtype_name(t));
}

CpuIsa cpu_isa_detected() {
  static const CpuIsa isa = detail::avx512_supported() ? CpuIsa::Avx512
                            : detail::avx2_supported() ? CpuIsa::Avx2
                                                       : CpuIsa::Scalar;
  return isa;
}

CpuIsa cpu_isa_capped(const char* cap_name, CpuIsa detected) {
  if (!cap_name || !*cap_name) return detected;
  CpuIsa cap;
  if (std::strcmp(cap_name, "scalar") == 0) cap = CpuIsa::Scalar;
  else if (std::strcmp(cap_name, "avx2") == 0) cap = CpuIsa::Avx2;
  else if (std::strcmp(cap_name, "avx512") == 0) cap = CpuIsa::Avx512;
  else fail("ROOFLINE_CPU_ISA={} is not one of scalar, avx2, avx512", cap_name);
  return std::min(cap, detected);
}

CpuIsa cpu_isa() {
  static const CpuIsa isa = cpu_isa_capped(std::getenv("ROOFLINE_CPU_ISA"), cpu_isa_detected());
  return isa;
}

VecDotFn vec_dot_fn_at(CpuIsa level, DType t) {
  ROOFLINE_CHECK(level <= cpu_isa_detected(), "kernel level above what this CPU supports");
  if (level >= CpuIsa::Avx512) {
    if (VecDotFn f = detail::avx512_dot(t)) return f;
  }
  if (level >= CpuIsa::Avx2) {
    if (VecDotFn f = detail::avx2_dot(t)) return f;
  }
  return vec_dot_scalar_fn(t);
}

VecDotTileFn vec_dot_tile_fn_at(CpuIsa level, DType t) {
  ROOFLINE_CHECK(level <= cpu_isa_detected(), "kernel level above what this CPU supports");
  if (level >= CpuIsa::Avx512) {
    if (VecDotTileFn f = detail::avx512_tile(t)) return f;
  }
  if (level >= CpuIsa::Avx2) {
    if (VecDotTileFn f = detail::avx2_tile(t)) return f;
  }
  return vec_dot_tile_scalar_fn(t);
}

VecDotFn vec_dot_fn(DType t) { return vec_dot_fn_at(cpu_isa(), t); }
VecDotTileFn vec_dot_tile_fn(DType t) { return vec_dot_tile_fn_at(cpu_isa(), t); }

const char* cpu_simd_name() {
  switch (cpu_isa()) {
    case CpuIsa::Avx512: return "AVX-512 VNNI";
    case CpuIsa::Avx2: return "AVX2";
    case CpuIsa::Scalar: break;
  }
  return "scalar";
}

void kv_row_from_f32(DType type, const float* src, void* dst, int64_t n) {
  if (type == DType::F16 && cpu_isa() >= CpuIsa::Avx2)
    return detail::f32_row_to_f16_avx2(src, static_cast<uint16_t*>(dst), n);
  quantize_row_ref(type, src, dst, n);
}

void kv_row_to_f32(DType type, const void* src, float* dst, int64_t n) {
  if (type == DType::F16 && cpu_isa() >= CpuIsa::Avx2)
    return detail::f16_row_to_f32_avx2(static_cast<const uint16_t*>(src), dst, n);
  dequantize_row_ref(type, src, dst, n);
}

}  // namespace roofline::cpu
