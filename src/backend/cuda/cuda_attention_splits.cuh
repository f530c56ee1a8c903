// Split-KV decode attention's bookkeeping and merging, for cuda_attention.cu (its only includer: the
// definitions are internal to it): what one split CTA works on (SplitWork), the merge of a row's splits
// with the combine kernel's arithmetic (split_weights, merged_value), the split kernel's own combine
// by the last split CTA of a (row, KV head) (SplitCombine, combine_if_last), and the combine kernel (a CTA a query
// head: attention_combine_kernel).
#pragma once

#include "backend/cuda/cuda_kernels.cuh"

namespace roofline::cuda {
namespace {

constexpr int kMergeMaxGroup = 16;  // query heads per KV head the split kernel's combine takes
constexpr int kCombineThreads = 128;  // the combine kernel's CTA

// What one split CTA (blockIdx: row or row_list entry, KV head, split) works on: false when the row is
// past the step's real rows or the split past the row's keys.
struct SplitWork {
  int r, kvh, split, k_begin, k_end;
  int n_splits;    // the row's splits with keys (at most gridDim.z)
  bool dead_row;   // a padding row of the step (no keys)
};
// head_parts: blockIdx.y = KV head x head_parts + part (attention_split_vec_kernel's query-head parts).
__device__ __forceinline__ bool split_work(const DeviceStep& step, const int* row_list, int window, SplitWork& w, int head_parts = 1) {
  w.r = row_list ? row_list[blockIdx.x] : (int)blockIdx.x;
  w.kvh = blockIdx.y / head_parts;
  w.split = blockIdx.z;
  w.n_splits = 0;
  w.dead_row = w.r >= step.header[kStepRealRows];
  if (w.dead_row) return false;
  const int pos = step.positions[w.r];
  const int first = attention_first_key(pos, window);  // sliding layers: keys (pos - window, pos]
  const int n_keys = pos + 1 - first;
  const int split_len = row_split_len(step, n_keys);
  w.n_splits = min((int)gridDim.z, (n_keys + split_len - 1) / split_len);
  if (w.split * split_len >= n_keys) return false;
  w.k_begin = first + w.split * split_len;
  w.k_end = min(pos + 1, w.k_begin + split_len);
  return true;
}

// Max (is_max) or sum of one value per thread over the CTA, in a fixed order (warps by shuffles, then
// the warps' results in order); every thread gets the result. red: blockDim.x / 32 floats.
__device__ __forceinline__ float block_reduce(float v, bool is_max, float* red) {
  v = is_max ? warp_max(v) : warp_sum(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float r = is_max ? -INFINITY : 0.0f;
  for (int w = 0; w < (int)(blockDim.x / 32); ++w) r = is_max ? fmaxf(r, red[w]) : r + red[w];
  __syncthreads();
  return r;
}

// Merging the splits of one (row, query head) with a whole CTA (128 threads): its partials start at base
// (per split: max, sum, then hd_v values; stride floats apart). split_weights reads the splits' maxima and
// sums with all threads at once (thread s takes splits s, s + blockDim.x, ...), puts each split's weight
// exp(m_s - m) in weight_s and returns 1 / sum; merged_value sums one output dimension over the splits in
// split order, eight splits' loads in flight. Fixed orders throughout, so the result depends only on the
// row, and the combine kernel and a split kernel's combine (combine_if_last) give the same bits.
__device__ __forceinline__ float split_weights(const float* base, int64_t stride, int n_splits, float* weight_s, float* red) {
  float m = -INFINITY;
  for (int s = threadIdx.x; s < n_splits; s += blockDim.x) m = fmaxf(m, __ldcg(base + s * stride));
  m = block_reduce(m, true, red);
  float l = 0;
  for (int s = threadIdx.x; s < n_splits; s += blockDim.x) {
    const float w = __expf(__ldcg(base + s * stride) - m);
    weight_s[s] = w;
    l += __ldcg(base + s * stride + 1) * w;
  }
  l = block_reduce(l, false, red);  // its barrier also publishes weight_s
  return 1.0f / l;
}
__device__ __forceinline__ float merged_value(const float* col, int64_t stride, int n_splits, const float* weight_s) {
  constexpr int kSplitsInFlight = 8;
  float a = 0;
  int s = 0;
  for (; s + kSplitsInFlight <= n_splits; s += kSplitsInFlight) {
    float v[kSplitsInFlight];
#pragma unroll
    for (int u = 0; u < kSplitsInFlight; ++u) v[u] = __ldcg(col + (s + u) * stride);
#pragma unroll
    for (int u = 0; u < kSplitsInFlight; ++u) a += v[u] * weight_s[s + u];
  }
  for (; s < n_splits; ++s) a += __ldcg(col + s * stride) * weight_s[s];
  return a;
}

// Output value d of query head h of row r, and (act.q) its int8 form: the warp holds the whole
// 32-block (head_dim_v % 32 == 0).
__device__ __forceinline__ void store_output(float* out, const ActQ8& act, int r, int h, int n_head, int hd_v, int d, float v) {
  const int64_t i = ((int64_t)r * n_head + h) * hd_v + d;
  out[i] = v;
  if (act.q)
    warp_quantize32(v, threadIdx.x % 32, const_cast<int8_t*>(act.q) + i / 32 * 32, const_cast<float*>(act.d) + i / 32,
                    const_cast<float*>(act.s) + i / 32);
}

// Decode steps: the combine in the split kernel. Each split CTA of a (row, KV head) counts itself in
// when its partials are stored (fenced); the last one merges the group's query heads (its shared memory
// past the softmax state is free by then: gqa x n_splits weights) and writes the output. counters:
// [rows x n_head_kv], zero between launches (the last CTA sets its own back). Padding rows: split 0
// writes zeros.
struct SplitCombine {
  int* counters = nullptr;
  float* out = nullptr;
  ActQ8 act;
};
// Not inlined (arguments by value): inlined, it took the split kernel from 127 to 141 registers.
__device__ __noinline__ void combine_if_last(SplitCombine c, const float* partial, SplitWork w, int n_head, int n_head_kv, int gqa, int hd_v,
                                             int max_splits, float* free_smem) {
  __shared__ int last_s;
  __shared__ float red[32];
  __shared__ float inv_s[kMergeMaxGroup];
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    const int slot = w.r * n_head_kv + w.kvh;
    last_s = atomicAdd(c.counters + slot, 1) == w.n_splits - 1;
    if (last_s) c.counters[slot] = 0;  // every split of this launch is in
  }
  __syncthreads();
  if (!last_s) return;
  __threadfence();
  const int64_t stride = hd_v + 2;
  auto head_partials = [&](int g) { return partial + ((int64_t)w.r * n_head + w.kvh * gqa + g) * max_splits * stride; };
  for (int g = 0; g < gqa; ++g) {
    const float inv = split_weights(head_partials(g), stride, w.n_splits, free_smem + g * w.n_splits, red);
    if (threadIdx.x == 0) inv_s[g] = inv;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < gqa * hd_v; i += blockDim.x) {
    const int g = i / hd_v, d = i % hd_v;
    const float a = merged_value(head_partials(g) + 2 + d, stride, w.n_splits, free_smem + g * w.n_splits);
    store_output(c.out, c.act, w.r, w.kvh * gqa + g, n_head, hd_v, d, a * inv_s[g]);
  }
}
__device__ __noinline__ void zero_group(SplitCombine c, SplitWork w, int n_head, int gqa, int hd_v) {
  for (int i = threadIdx.x; i < gqa * hd_v; i += blockDim.x) store_output(c.out, c.act, w.r, w.kvh * gqa + i / hd_v, n_head, hd_v, i % hd_v, 0.0f);
}

// Merges the splits of one (row, query head) with split_weights and merged_value (kCombineThreads threads).
// With act.q (head_dim_v % 32 == 0: each warp holds whole groups of 32), the output rows are also
// written in the int8 form the next product (the attention output matrix) reads; with tiles (no row list), as that
// product's warpgroup tiles (the grid then covers tiles.n_pad rows: those from n_rows on write the tiles' zeros
// alone; tiles need head_dim_v % 32 == 0, a warp's values a Q4_K sub-block or two Q6_K ones: wg_tiles_store1). Steps whose split
// kernel combines (SplitCombine) do not run it.
__global__ void __launch_bounds__(kCombineThreads) attention_combine_kernel(DeviceStep step, int n_head, int hd_v, int max_splits,
                                                                           const float* partial, float* out, ActQ8 act, const int* row_list,
                                                                           int window, WgTiles tiles, int n_rows) {
  extern __shared__ float weight_s[];  // [max_splits]
  __shared__ float red[32];
  const int r = row_list ? row_list[blockIdx.x] : (int)blockIdx.x, h = blockIdx.y;
  if ((int)blockIdx.x >= n_rows) {  // a padded token of the tiles
    wait_for_previous_kernel();
    for (int d = threadIdx.x; d < hd_v; d += blockDim.x) wg_tiles_store1(tiles, (int64_t)h * hd_v + d, r, 0.0f);
    return;
  }
  const auto store = [&](int d, float v) {
    store_output(out, act, r, h, n_head, hd_v, d, v);
    if (tiles.out) wg_tiles_store1(tiles, (int64_t)h * hd_v + d, r, v);
  };
  // The row's splits depend only on the step: counted before waiting for the split kernel.
  const bool live = r < step.header[kStepRealRows];
  int n_splits = 0;
  if (live) {
    const int n_keys = step.positions[r] + 1 - attention_first_key(step.positions[r], window);
    const int split_len = row_split_len(step, n_keys);
    n_splits = min(max_splits, (n_keys + split_len - 1) / split_len);
  }
  wait_for_previous_kernel();
  if (!live) {
    for (int d = threadIdx.x; d < hd_v; d += blockDim.x) store(d, 0.0f);
    return;
  }
  const int64_t stride = hd_v + 2;
  const float* base = partial + ((int64_t)r * n_head + h) * max_splits * stride;
  const float inv = split_weights(base, stride, n_splits, weight_s, red);
  for (int d = threadIdx.x; d < hd_v; d += blockDim.x) store(d, merged_value(base + 2 + d, stride, n_splits, weight_s) * inv);
}

}  // namespace
}  // namespace roofline::cuda
