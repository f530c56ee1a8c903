// The routing of one token row (cuda_moe.cu's route kernel and the router kernel's last CTA,
// cuda_moe_decode.cu): softmax over the row's n_expert logits, then k rounds of a warp argmax over the
// experts not yet taken (the larger logit wins, the lower index on ties), weights p / sum(top p)
// (normalize) or p, times scale. One warp; the logits are read through the L2 (__ldcg), since the last
// CTA of the router kernel reads what other CTAs wrote.
#pragma once

#include <cfloat>
#include <climits>

#include "backend/cuda/cuda_common.cuh"

namespace roofline::cuda {

constexpr int kMaxExpertsUsed = 32;  // experts per token the routing keeps
constexpr int kRoutePerLane = 8;     // routers of up to 256 experts keep their logits in registers

// Writes ids[0, k) and weights[0, k) (lane 0).
__device__ __forceinline__ void route_row(const float* l, int n_expert, int k, bool normalize, float scale, int32_t* ids, float* weights,
                                          int lane) {
  // Up to 32 * kRoutePerLane logits are read once into registers (lane: experts lane, lane + 32, ..; the
  // loops over them unrolled so they stay there) and the picked ones marked in a per-lane bit mask; wider
  // routers read them again for every pick. The comparisons and sums are the same either way.
  const bool in_regs = n_expert <= 32 * kRoutePerLane;
  float lv[kRoutePerLane];
#pragma unroll
  for (int j = 0; j < kRoutePerLane; ++j) {
    const int e = lane + 32 * j;
    lv[j] = in_regs && e < n_expert ? __ldcg(l + e) : -FLT_MAX;
  }
  float mx = -FLT_MAX;
  if (in_regs) {
#pragma unroll
    for (int j = 0; j < kRoutePerLane; ++j)
      if (lane + 32 * j < n_expert) mx = fmaxf(mx, lv[j]);
  } else {
    for (int e = lane; e < n_expert; e += 32) mx = fmaxf(mx, __ldcg(l + e));
  }
  mx = warp_max(mx);
  float sum = 0;
  if (in_regs) {
#pragma unroll
    for (int j = 0; j < kRoutePerLane; ++j)
      if (lane + 32 * j < n_expert) sum += expf(lv[j] - mx);
  } else {
    for (int e = lane; e < n_expert; e += 32) sum += expf(__ldcg(l + e) - mx);
  }
  sum = warp_sum(sum);
  int picked[kMaxExpertsUsed];
  float p[kMaxExpertsUsed];
  float top = 0;
  uint32_t taken_mask = 0;  // in_regs: bit j = expert lane + 32 j already picked
  for (int i = 0; i < k; ++i) {
    float best = -FLT_MAX;
    int best_e = INT_MAX;
    auto consider = [&](float v, int e) {
      if (v > best || (v == best && e < best_e)) {
        best = v;
        best_e = e;
      }
    };
    if (in_regs) {
#pragma unroll
      for (int j = 0; j < kRoutePerLane; ++j)
        if (lane + 32 * j < n_expert && !((taken_mask >> j) & 1)) consider(lv[j], lane + 32 * j);
    } else {
      for (int e = lane; e < n_expert; e += 32) {
        bool taken = false;
        for (int t = 0; t < i; ++t) taken |= picked[t] == e;
        if (!taken) consider(__ldcg(l + e), e);
      }
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, offset);
      const int oe = __shfl_xor_sync(0xffffffffu, best_e, offset);
      if (ob > best || (ob == best && oe < best_e)) {
        best = ob;
        best_e = oe;
      }
    }
    picked[i] = best_e;
    if (in_regs && best_e % 32 == lane) taken_mask |= 1u << (best_e / 32);
    p[i] = expf(best - mx) / sum;
    top += p[i];
  }
  if (lane == 0)
    for (int i = 0; i < k; ++i) {
      ids[i] = picked[i];
      weights[i] = (normalize ? p[i] / top : p[i]) * scale;
    }
}

// The same routing of one row by a whole CTA of nthreads threads (blockDim.x, a multiple of 32; every
// thread calls it), with the same bits as route_row: each thread ranks its experts among all (larger
// logit first, the lower index on ties) in one pass instead of k rounds of a warp argmax, while warp 0
// forms the softmax's max and sum in route_row's order. lv: shared memory for n_expert floats; sel_e,
// sel_v: for k ints and floats.
__device__ __forceinline__ void route_row_block(const float* l, int n_expert, int k, bool normalize, float scale, int32_t* ids, float* weights,
                                                float* lv, int* sel_e, float* sel_v) {
  const int tid = threadIdx.x, lane = tid % 32, nthreads = blockDim.x;
  for (int e = tid; e < n_expert; e += nthreads) lv[e] = __ldcg(l + e);
  __syncthreads();
  for (int e = tid; e < n_expert; e += nthreads) {
    const float v = lv[e];
    int rank = 0;
    for (int j = 0; j < n_expert; ++j) {
      const float o = lv[j];
      rank += o > v || (o == v && j < e);
    }
    if (rank < k) {
      sel_e[rank] = e;
      sel_v[rank] = v;
    }
  }
  float mx = -FLT_MAX, sum = 0;
  if (tid < 32) {
    for (int e = lane; e < n_expert; e += 32) mx = fmaxf(mx, lv[e]);
    mx = warp_max(mx);
    for (int e = lane; e < n_expert; e += 32) sum += expf(lv[e] - mx);
    sum = warp_sum(sum);
  }
  __syncthreads();
  if (tid >= 32) return;
  // Lane i < k holds pick i; lane 0 sums the picks in order, as route_row's loop does.
  const float p = lane < k ? expf(sel_v[lane] - mx) / sum : 0.0f;
  float top = 0;
  for (int i = 0; i < k; ++i) top += __shfl_sync(0xffffffffu, p, i);
  if (lane < k) {
    ids[lane] = sel_e[lane];
    weights[lane] = (normalize ? p / top : p) * scale;
  }
}

// The shared expert's gate before its sigmoid, gate . xr over n values, by one warp in the order moe_shared_add_kernel
// (cuda_moe.cu) sums it with 256 threads: each lane takes the strides i = 32 w + lane, + 256, .. for w = 0..7 (the
// expression of that kernel's loop, so the compiler contracts it alike), each set of 32 is summed by a butterfly, and
// the 8 sums by one more with zeros in the other lanes: the same bits.
__device__ __forceinline__ float shared_gate_dot(const float* gate, const float* xr, int n, int lane) {
  constexpr int kStrideWarps = 8;  // moe_shared_add_kernel's 256 threads
  float mine = 0.0f;
#pragma unroll
  for (int w = 0; w < kStrideWarps; ++w) {
    float dot = 0;
    for (int i = 32 * w + lane; i < n; i += 32 * kStrideWarps) dot += gate[i] * xr[i];
    dot = warp_sum(dot);
    if (lane == w) mine = dot;
  }
  return warp_sum(mine);
}

}  // namespace roofline::cuda
