// What the mma.sync kernels share (the batched-decode products, the expert products, prompt
// attention, the tiled Q4_K prompt GEMM): the tensor-core products in the PTX fragment layouts (f16
// m16n8k16 and tf32 m16n8k8 with f32 accumulation, u8 x s8 m16n8k32 with int32 sums), fragment loads
// from shared memory (ldmatrix) and asynchronous global-to-shared copies.
#pragma once

#include <cstdint>

namespace roofline::cuda {

__device__ __forceinline__ void mma_16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                          uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 750
  __trap();  // sm_70 has no m16n8k8 either: the host never takes this path there (gemm_fuses_dequant)
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  // sm_75 has no m16n8k16: the same product as two m16n8k8 (k 0-7: a0, a1, b0; k 8-15: a2, a3, b1).
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a0), "r"(a1), "r"(b0));
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a2), "r"(a3), "r"(b1));
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}

// c = A . B for a 16 x 32 tile of unsigned bytes (A, row-major fragments: a0 row g, k 4t..4t+3; a1 row
// g + 8; a2, a3 the same at k + 16) and 32 x 8 signed bytes (b0 k 4t..4t+3 of column g, b1 k + 16),
// exact int32 sums (the int8 batched products; sm_80+).
__device__ __forceinline__ void mma_u8s8_16832(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};\n"
      : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(0));
#else
  __trap();  // the host takes this path on sm_80+ only (int8_products_take)
#endif
}

// c += A . B for 16 x 8 and 8 x 8 tf32 tiles (a0 row g, k t; a1 row g + 8; a2, a3 at k + 4; b0 k t of
// column g, b1 k t + 4), f32 accumulation; operands rounded to tf32 by the caller (to_tf32).
__device__ __forceinline__ void mma_tf32_1688(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
  __trap();
#endif
}
__device__ __forceinline__ uint32_t to_tf32(float v) {
  uint32_t r;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(v));
#else
  r = __float_as_uint(v);
#endif
  return r;
}

// Four 8 x 8 matrices of 16-bit values from shared memory into mma fragments (ldmatrix .x4; Trans: each
// matrix transposed); lane l gives the address of row l % 8 of matrix l / 8, and r[i] is matrix i (sm_80+).
template <bool Trans = false>
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned addr = (unsigned)__cvta_generic_to_shared(p);
  if constexpr (Trans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
#else
  __trap();  // the callers run on sm_80+ only (flash_prefill_fits, q4k_tile_gemm_fits)
#endif
}

// Asynchronous global -> shared copies (cp.async, sm_80+; a plain copy before that). Each thread's copies
// form groups (commit); wait<N> returns when at most N of its newest groups are still in flight.
template <int BYTES>
__device__ __forceinline__ void copy_async(void* dst, const void* src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
  if constexpr (BYTES == 16) asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src));
  else asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(d), "l"(src), "n"(BYTES));
#else
  if constexpr (BYTES == 16) *reinterpret_cast<int4*>(dst) = *reinterpret_cast<const int4*>(src);
  else if constexpr (BYTES == 8) *reinterpret_cast<int2*>(dst) = *reinterpret_cast<const int2*>(src);
  else *reinterpret_cast<int*>(dst) = *reinterpret_cast<const int*>(src);
#endif
}
__device__ __forceinline__ void copy_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}
template <int N>
__device__ __forceinline__ void copy_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

}  // namespace roofline::cuda
