// What the two flash attention kernels share (cuda_flash_prefill.cu for prompt runs, cuda_flash_decode.cu for
// decode splits): staging K/V pieces, f16 pairs for the A fragments of P V, and one online-softmax step over the
// two rows a lane holds of a warp's m16 score tile.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cuda/cuda_mma.cuh"

namespace roofline::cuda {

// Keys [from, to) of a block of n_keys keys from key0, into shared K and V rows of HD + pad halves (kd, vd), by
// the CTA's n_threads threads, 16 bytes a cp.async: key positions before key_end from the cache slot slot_of(pos)
// gives (kcache, vcache: the KV head's first value; kv_dim: values per slot), the rest zero, so that their
// probability 0 never meets a NaN. The caller commits and waits. (A range of the block: the flash decode kernel
// stages its first block's older keys before the dependency wait, the rest after it.)
template <int HD, int pad, typename SlotOf>
__device__ __forceinline__ void stage_kv_keys(__half* kd, __half* vd, int n_keys, int key0, int from, int to, int key_end, const __half* kcache,
                                              const __half* vcache, int kv_dim, int n_threads, SlotOf slot_of) {
  constexpr int kChunks = HD / 8, kRow = HD + pad;
  for (int i = threadIdx.x; i < n_keys * kChunks; i += n_threads) {
    const int j = i / kChunks, p = i % kChunks;
    const int pos = key0 + j;
    if (pos < from || pos >= to) continue;
    if (pos < key_end) {
      const int64_t at = slot_of(pos) * kv_dim + p * 8;
      copy_async<16>(kd + j * kRow + p * 8, kcache + at);
      copy_async<16>(vd + j * kRow + p * 8, vcache + at);
    } else {
      *reinterpret_cast<int4*>(kd + j * kRow + p * 8) = make_int4(0, 0, 0, 0);
      *reinterpret_cast<int4*>(vd + j * kRow + p * 8) = make_int4(0, 0, 0, 0);
    }
  }
}

// The whole block.
template <int HD, int pad, typename SlotOf>
__device__ __forceinline__ void stage_kv_block(__half* kd, __half* vd, int n_keys, int key0, int key_end, const __half* kcache,
                                               const __half* vcache, int kv_dim, int n_threads, SlotOf slot_of) {
  stage_kv_keys<HD, pad>(kd, vd, n_keys, key0, key0, key0 + n_keys, key_end, kcache, vcache, kv_dim, n_threads, slot_of);
}

__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// The online softmax over a block's scores s (N n-tiles of 8 keys of the m16 tile; masked keys -inf; base 2: the
// scores times log2 e) for the lane's rows lo (lane / 4) and hi (lane / 4 + 8), whose maxima over this lane's own
// scores are mx_lo and mx_hi: the rows' maxima over the 4 lanes that hold them, the new running maxima m, the
// scores turned into probabilities exp2(s - m), the running sums l rescaled and added to; alpha_lo and alpha_hi
// are the factors the running outputs take. A row that has seen no key keeps m = -inf and probabilities 0.
template <int N>
__device__ __forceinline__ void online_softmax_step(float (&s)[N][4], float mx_lo, float mx_hi, float& m_lo, float& m_hi, float& l_lo,
                                                    float& l_hi, float& alpha_lo, float& alpha_hi) {
#pragma unroll
  for (int off = 1; off <= 2; off <<= 1) {
    mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, off));
    mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, off));
  }
  const float mn_lo = fmaxf(m_lo, mx_lo), mn_hi = fmaxf(m_hi, mx_hi);
  alpha_lo = mn_lo == -INFINITY ? 1.0f : exp2f(m_lo - mn_lo);
  alpha_hi = mn_hi == -INFINITY ? 1.0f : exp2f(m_hi - mn_hi);
  const float sub_lo = mn_lo == -INFINITY ? 0.0f : mn_lo, sub_hi = mn_hi == -INFINITY ? 0.0f : mn_hi;
  m_lo = mn_lo;
  m_hi = mn_hi;
  float sum_lo = 0.0f, sum_hi = 0.0f;
#pragma unroll
  for (int n = 0; n < N; ++n) {
    s[n][0] = exp2f(s[n][0] - sub_lo);
    s[n][1] = exp2f(s[n][1] - sub_lo);
    s[n][2] = exp2f(s[n][2] - sub_hi);
    s[n][3] = exp2f(s[n][3] - sub_hi);
    sum_lo += s[n][0] + s[n][1];
    sum_hi += s[n][2] + s[n][3];
  }
  l_lo = l_lo * alpha_lo + sum_lo;
  l_hi = l_hi * alpha_hi + sum_hi;
}

}  // namespace roofline::cuda
