// CPU dot-product kernels: one weight row (any tensor type) times one activation row. Activations
// are converted once per matrix product into the format the weight type pairs with (int8 blocks
// for quantized weights, so the inner loop is integer multiply-adds), then every output element is
// one call here: a fixed reduction order that does not depend on the batch (batch invariance).
#pragma once

#include <cstddef>
#include <cstdint>

#include "formats/dtype.h"

namespace roofline::cpu {

enum class ActFormat {
  F32,   // plain floats (F32/F16/BF16 weights)
  Q8_0,  // 32-element blocks: f16 scale + 32 int8 (pairs with Q4_0, Q5_0, Q8_0, IQ4_NL)
  Q8_1,  // 32-element blocks: f16 scale, int16 sum of the 32 int8, 32 int8 (pairs with Q4_1, Q5_1)
  Q8_K,  // 256-element blocks: f32 scale, 256 int8, 16 block sums (pairs with the K-quants, IQ4_XS)
};

// Activation block layouts. Every int8 value is in [-127, 127] (never -128), which the SIMD kernels
// rely on: |w| <= 128 times |a| <= 127 in pairs stays inside int16 (maddubs does not saturate).
//  Q8_0: formats/quant_blocks.h BlockQ8_0. d = amax/127 rounded to f16; q = round(x / d) (ties to
//        even, clamped), using the rounded d, so the error of an element is at most d/2.
//  Q8_1: like Q8_0 plus the exact sum of the 32 quantized values. (ggml's block_q8_1 stores d*sum as
//        f16 instead; an exact integer sum in the same 36 bytes makes the Q4_1/Q5_1 offset term exact.)
//  Q8_K: BlockQ8_K. d = amax/127 as f32 (positive: we use the largest magnitude, where ggml's
//        quantize_row_q8_K maps the signed extreme to -127; both keep q in [-127, 127]);
//        bsums[j] = sum of q[16j .. 16j+15].
struct ActBlockQ8_1 {
  uint16_t d;
  int16_t sum;
  int8_t qs[32];
};
static_assert(sizeof(ActBlockQ8_1) == 36);

ActFormat act_format_for(DType weight_type);
size_t act_row_bytes(ActFormat format, int64_t n);
// n a multiple of the format's block (32 or 256; any n for F32). Same bytes on every CPU (the SIMD
// quantizer is bit-identical to the scalar one).
void quantize_act_row(ActFormat format, const float* x, void* dst, int64_t n);

// sum_i w[i] * a[i] over n elements (n a multiple of the weight type's block size).
using VecDotFn = float (*)(const void* weight_row, const void* act_row, int64_t n);

// Instruction-set levels of the kernels, each a superset of the one before. The level used is the
// highest the CPU reports (checked once at run time), capped by the environment variable
// ROOFLINE_CPU_ISA=scalar|avx2|avx512 when set (to compare paths in one binary; a value that is not
// one of these is an error). A type without a kernel at the level falls back to the next lower one.
enum class CpuIsa { Scalar = 0, Avx2 = 1, Avx512 = 2 };
CpuIsa cpu_isa();
CpuIsa cpu_isa_detected();  // ignoring the environment cap
// The level for a cap name (ROOFLINE_CPU_ISA's value; null or empty: no cap) on a CPU that supports
// `detected`; throws Error for a name that is not scalar, avx2 or avx512.
CpuIsa cpu_isa_capped(const char* cap_name, CpuIsa detected);

// The fastest kernel at cpu_isa() for a weight type.
VecDotFn vec_dot_fn(DType weight_type);
// The portable scalar kernel (tests compare the SIMD kernels against it).
VecDotFn vec_dot_scalar_fn(DType weight_type);
// The kernels at one level (with the same fallback), for tests: level <= cpu_isa_detected().
VecDotFn vec_dot_fn_at(CpuIsa level, DType weight_type);
const char* cpu_simd_name();  // "AVX-512 VNNI", "AVX2" or "scalar": cpu_isa()'s name

// n values of a KV cache row (or any tensor row of that type) as floats: F16 with the CPU's F16C
// conversion where present (exact, so the same bits as the reference codec), every other type
// through the reference codec (formats/quant_ref.h).
void kv_row_to_f32(DType type, const void* src, float* dst, int64_t n);
// The other way, for the KV store: F16 with F16C (round to nearest even, the same bits as the reference
// codec), every other type through quantize_row_ref.
void kv_row_from_f32(DType type, const float* src, void* dst, int64_t n);

// A tile of dots for prefill: y[c * ldy + r] = dot(weight row r, activation row c) for r < n_w,
// c < n_a. Weight row r starts at w + r * w_stride bytes, activation row c at a + c * a_stride.
// The SIMD tile decodes each weight block once and multiplies it with up to 4 (AVX2) or 8 (AVX-512)
// activation rows, but every output is bit-identical to what vec_dot_fn's kernel returns for the same
// two rows (the same operations per output in the same order), so results never depend on the batch
// or the tiling.
// Keep the activation rows of one call cache-resident (e.g. n_a <= 16-32 for n of a few thousand).
using VecDotTileFn = void (*)(const void* w, size_t w_stride, int n_w, const void* a, size_t a_stride, int n_a,
                              int64_t n, float* y, size_t ldy);
VecDotTileFn vec_dot_tile_fn(DType weight_type);          // pairs with vec_dot_fn
VecDotTileFn vec_dot_tile_scalar_fn(DType weight_type);   // pairs with vec_dot_scalar_fn
VecDotTileFn vec_dot_tile_fn_at(CpuIsa level, DType weight_type);  // pairs with vec_dot_fn_at

namespace detail {
// Internal to the kernel files (and their tests): per-ISA tables. The SIMD tables return nullptr
// for a type they have no kernel for (the dispatcher then uses the scalar one).
VecDotFn scalar_dot(DType t);
VecDotTileFn scalar_tile(DType t);
bool avx2_supported();  // compiled in and the CPU has AVX2, FMA and F16C
VecDotFn avx2_dot(DType t);
VecDotTileFn avx2_tile(DType t);
bool avx512_supported();  // compiled in and the CPU has AVX-512 F/BW/VL/DQ/VNNI (and AVX2, FMA, F16C)
VecDotFn avx512_dot(DType t);
VecDotTileFn avx512_tile(DType t);
VecDotTileFn avx512_float_tile(DType t);  // F32 / F16 / BF16 prompt tiles (float_kernels_avx512.cpp)
void quantize_act_row_scalar(ActFormat format, const float* x, void* dst, int64_t n);
void quantize_act_row_avx2(ActFormat format, const float* x, void* dst, int64_t n);
void f16_row_to_f32_avx2(const uint16_t* src, float* dst, int64_t n);
void f32_row_to_f16_avx2(const float* src, uint16_t* dst, int64_t n);
}  // namespace detail

}  // namespace roofline::cpu
