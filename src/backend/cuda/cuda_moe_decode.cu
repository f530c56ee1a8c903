// Fewer launches for the MoE block of decode steps (cuda_moe.cuh): the router's product with the routing
// done by its last CTA, and the experts' down products summed straight into the residual. Both give the
// bits of the separate kernels they replace (the same row functions, the same order of sums), so a
// sequence decodes the same alone and in a batch that takes the separate kernels.
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/cuda_matvec_rows.cuh"
#include "backend/gpu.h"
#include "backend/cuda/cuda_moe.cuh"
#include "backend/cuda/cuda_moe_route.cuh"

namespace roofline::cuda {
namespace {

constexpr int kRouterThreads = 256;
constexpr int kRouterWarps = kRouterThreads / 32;
constexpr int kRouterVec = 4;  // float4s of the router row per thread, held in registers
constexpr int kDownWarps = 8;  // output rows per CTA of the down + combine kernel

// logits[t, e] = router[e] . xn[t] for t < n_rows, one CTA per expert e. The router row is loaded before
// the dependency wait (weights are no kernel's output), so its read overlaps the norm before it. Each
// thread sums its float4s in order, each warp its threads (butterfly), then the warps in order: the
// same bits for a row whatever n_rows is. With a tail (ids), the CTA that finishes last routes every row
// (route_row; a warp per row, n_rows <= kRouterWarps) and resets the counter for the next launch.
__global__ void __launch_bounds__(kRouterThreads) moe_router_kernel(const float* router, int cols, const float* xn, int n_rows, float* logits,
                                                                    int n_expert, MoeRouteTail tail) {
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, e = blockIdx.x;
  const int n4 = cols / 4;
  float4 w[kRouterVec];
#pragma unroll
  for (int v = 0; v < kRouterVec; ++v) {
    const int i = tid + v * kRouterThreads;
    w[v] = i < n4 ? __ldg(reinterpret_cast<const float4*>(router + (int64_t)e * cols) + i) : make_float4(0, 0, 0, 0);
  }
  wait_for_previous_kernel();
  __shared__ float part[kRouterWarps][kMoeRouterMaxRows];
  __shared__ bool last;
  for (int t = 0; t < n_rows; ++t) {
    const float4* x = reinterpret_cast<const float4*>(xn + (int64_t)t * cols);
    float acc = 0;
#pragma unroll
    for (int v = 0; v < kRouterVec; ++v) {
      const int i = tid + v * kRouterThreads;
      if (i < n4) {
        const float4 xv = x[i];
        acc = fmaf(w[v].x, xv.x, acc);
        acc = fmaf(w[v].y, xv.y, acc);
        acc = fmaf(w[v].z, xv.z, acc);
        acc = fmaf(w[v].w, xv.w, acc);
      }
    }
    acc = warp_sum(acc);
    if (lane == 0) part[warp][t] = acc;
  }
  __syncthreads();
  for (int t = tid; t < n_rows; t += kRouterThreads) {
    float sum = 0;
#pragma unroll
    for (int k = 0; k < kRouterWarps; ++k) sum += part[k][t];
    logits[(int64_t)t * n_expert + e] = sum;
  }
  if (!tail.ids) return;
  __threadfence();  // each writer's logits before the CTA's arrival
  __syncthreads();
  if (tid == 0) last = atomicAdd(tail.counter, 1) == (int)gridDim.x - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();  // after the count that says every CTA's logits are in
  if (tid == 0) *tail.counter = 0;
  if (warp < n_rows)
    route_row(logits + (int64_t)warp * n_expert, n_expert, tail.k, tail.normalize, tail.scale, tail.ids + (int64_t)warp * tail.k,
              tail.weights + (int64_t)warp * tail.k, lane);
}

// The expert product of one row, as the grouped expert kernels reduce it (cuda_matvec.cu, product_rows).
template <DType T>
__device__ __forceinline__ float expert_row(const DeviceWeight& w, const ActQ8& act, int64_t row, int lane) {
  float acc[1][1] = {};
  if constexpr (T == DType::Q4_K) matvec_q4_k_partials<1, 1>(w, act, row, lane, acc);
  else if constexpr (T == DType::Q6_K) matvec_q6_k_partials<1, 1, 1>(w, act, row, lane, acc);
  else matvec_q8_0_partials<1, 1, 1>(w, act, row, lane, acc);
  return warp_sum(acc[0][0]);
}

// Asks for the 128-byte lines of [p, p + bytes) to be brought into the L1 (lane `slot` of n_slots takes
// every n_slots-th line), without waiting for them.
__device__ __forceinline__ void prefetch_lines(const void* p, int64_t bytes, int slot, int n_slots, int level) {
  const uintptr_t first = reinterpret_cast<uintptr_t>(p) & ~(uintptr_t)127, last = (reinterpret_cast<uintptr_t>(p) + bytes - 1) & ~(uintptr_t)127;
  for (uintptr_t line = first + (uintptr_t)slot * 128; line <= last; line += (uintptr_t)n_slots * 128) {
    if (level == 1) asm volatile("prefetch.global.L1 [%0];" ::"l"(line));
    else asm volatile("prefetch.global.L2 [%0];" ::"l"(line));
  }
}

// Row `row` of a weight (every plane of its layout) and the int8 activation row a of `cols` values.
__device__ __forceinline__ void prefetch_row(const DeviceWeight& w, int64_t row, const ActQ8& a, int lane, int level) {
  const int64_t c = w.cols;
  switch (w.layout) {
    case WeightLayout::Raw: prefetch_lines(w.data + row * (int64_t)w.row_bytes, (int64_t)w.row_bytes, lane, 32, level); break;
    case WeightLayout::Q6KPlanes:
      prefetch_lines(w.data + row * (c / 2), c / 2, lane, 32, level);
      prefetch_lines(w.plane1 + row * (c / 4), c / 4, lane, 32, level);
      prefetch_lines(w.plane2 + row * (c / 16), c / 16, lane, 32, level);
      prefetch_lines(w.plane3 + row * (c / 256) * 2, (c / 256) * 2, lane, 32, level);
      break;
    case WeightLayout::Q8_0Planes:
      prefetch_lines(w.data + row * c, c, lane, 32, level);
      prefetch_lines(w.plane1 + row * (c / 32) * 2, (c / 32) * 2, lane, 32, level);
      break;
  }
  prefetch_lines(a.q, c, lane, 32, level);
  prefetch_lines(a.d, c / 32 * 4, lane, 32, level);
  if (w.type == DType::Q4_K) prefetch_lines(a.s, c / 32 * 4, lane, 32, level);
}

// x[t, row] += sum_s weights[t * k + s] * (down of expert ids[t * k + s] . h[t * k + s])[row]: one warp per
// output row of a token (blockIdx.y), its k experts in routing order, the sum in moe_combine_kernel's order.
template <DType T>
__global__ void __launch_bounds__(kDownWarps * 32) moe_down_combine_kernel(DeviceWeight down, int64_t rows_per_expert, ActQ8 act,
                                                                           const int32_t* ids, const float* weights, int k, float* x,
                                                                           int prefetch) {
  const int lane = threadIdx.x % 32;
  const int64_t row = (int64_t)blockIdx.x * kDownWarps + threadIdx.x / 32;
  const int t = blockIdx.y;
  wait_for_previous_kernel();
  if (row >= rows_per_expert) return;
  const int64_t groups = down.cols / 32;
  // Each expert's product below waits for its loads before the next one starts (its loop and the warp's
  // sum are in the way), so every expert's row and activations are requested first, at once.
  if (prefetch)
    for (int s = 0; s < k; ++s) {
      const int64_t p = (int64_t)t * k + s;
      prefetch_row(expert_view(down, ids[p], rows_per_expert), row, ActQ8{act.q + p * down.cols, act.d + p * groups, act.s + p * groups}, lane,
                   prefetch);
    }
  float sum = 0;
#pragma unroll 4
  for (int s = 0; s < k; ++s) {
    const int64_t p = (int64_t)t * k + s;
    const DeviceWeight we = expert_view(down, ids[p], rows_per_expert);
    const ActQ8 a{act.q + p * down.cols, act.d + p * groups, act.s + p * groups};
    sum = fmaf(weights[p], expert_row<T>(we, a, row, lane), sum);
  }
  if (lane == 0) x[(int64_t)t * rows_per_expert + row] += sum;
}

bool enabled(const char* name) {
  const char* v = std::getenv(name);
  return !(v && std::strcmp(v, "0") == 0);
}

}  // namespace

bool moe_router_fits(const DeviceWeight& router, int n_rows) {
  static const bool on = enabled("ROOFLINE_MOE_FUSED_ROUTER");
  return on && router.type == DType::F32 && router.layout == WeightLayout::Raw && router.cols % 4 == 0 &&
         router.cols <= 4 * kRouterThreads * kRouterVec && n_rows >= 1 && n_rows <= kMoeRouterMaxRows;
}

int moe_route_tail_rows() { return kRouterWarps; }

void moe_router(const DeviceWeight& router, int n_expert, const float* xn, int n_rows, float* logits, const MoeRouteTail& tail,
                cudaStream_t stream) {
  if (!moe_router_fits(router, n_rows) || router.rows != n_expert || (tail.ids && (n_rows > kRouterWarps || !tail.counter)))
    fail("internal error: the fused MoE router over {} rows of a {} x {} {} router", n_rows, router.rows, router.cols, dtype_name(router.type));
  launch(moe_router_kernel, dim3((unsigned)n_expert), dim3(kRouterThreads), 0, stream, pdl_enabled(),
         reinterpret_cast<const float*>(router.data), (int)router.cols, xn, n_rows, logits, n_expert, tail);
}

bool moe_down_combine_fits(const DeviceWeight& down) {
  static const bool on = enabled("ROOFLINE_MOE_DOWN_COMBINE");
  if (!on || down.cols % 256 != 0) return false;
  return (down.type == DType::Q4_K && down.layout == WeightLayout::Raw) || (down.type == DType::Q6_K && down.layout == WeightLayout::Q6KPlanes) ||
         (down.type == DType::Q8_0 && down.layout == WeightLayout::Q8_0Planes);
}

void moe_down_combine(const DeviceWeight& down, int64_t rows_per_expert, const ActQ8& act, const int32_t* ids, const float* weights, int n_rows,
                      int k, float* x, cudaStream_t stream) {
  if (n_rows == 0) return;
  if (!moe_down_combine_fits(down) || !act.q || act.row_factor)
    fail("internal error: the fused MoE down + combine over a {} down tensor", dtype_name(down.type));
  // Where the rows are requested ahead: 1 the L1 (default), 2 the L2, 0 not at all (ROOFLINE_MOE_DOWN_PREFETCH).
  static const int prefetch = [] {
    const char* v = std::getenv("ROOFLINE_MOE_DOWN_PREFETCH");
    return v ? std::clamp(std::atoi(v), 0, 2) : 1;
  }();
  const dim3 grid((unsigned)((rows_per_expert + kDownWarps - 1) / kDownWarps), (unsigned)n_rows), block(kDownWarps * 32);
  switch (down.type) {
    case DType::Q4_K:
      return launch(moe_down_combine_kernel<DType::Q4_K>, grid, block, 0, stream, pdl_enabled(), down, rows_per_expert, act, ids, weights, k, x,
                    prefetch);
    case DType::Q6_K:
      return launch(moe_down_combine_kernel<DType::Q6_K>, grid, block, 0, stream, pdl_enabled(), down, rows_per_expert, act, ids, weights, k, x,
                    prefetch);
    default:
      return launch(moe_down_combine_kernel<DType::Q8_0>, grid, block, 0, stream, pdl_enabled(), down, rows_per_expert, act, ids, weights, k, x,
                    prefetch);
  }
}

}  // namespace roofline::cuda

namespace roofline {

std::vector<int32_t> gpu_moe_route_for_test(const std::vector<float>& router, int n_expert, int cols, const std::vector<float>& xn, int n_rows,
                                            int k, bool normalize, float scale, std::vector<float>* weights, int device) {
  using namespace cuda;
  if (router.size() != (size_t)n_expert * cols || xn.size() != (size_t)n_rows * cols || k < 1 || k > std::min(n_expert, kMaxExpertsUsed))
    fail("gpu_moe_route_for_test: a {} x {} router, {} rows of input, k {}", n_expert, cols, n_rows, k);
  ROOFLINE_CUDA_CHECK(cudaSetDevice(device));
  cudaStream_t stream;
  ROOFLINE_CUDA_CHECK(cudaStreamCreate(&stream));
  DeviceArena arena;
  const size_t pairs = (size_t)n_rows * k;
  arena.reserve((router.size() + xn.size() + (size_t)n_rows * n_expert + 2 * pairs + 1) * 4 + 8 * 256);
  float* dr = reinterpret_cast<float*>(arena.take(router.size() * 4));
  float* dx = reinterpret_cast<float*>(arena.take(xn.size() * 4));
  float* logits = reinterpret_cast<float*>(arena.take((size_t)n_rows * n_expert * 4));
  int32_t* ids = reinterpret_cast<int32_t*>(arena.take(pairs * 4));
  float* wts = reinterpret_cast<float*>(arena.take(pairs * 4));
  int* counter = reinterpret_cast<int*>(arena.take(4));
  ROOFLINE_CUDA_CHECK(cudaMemcpy(dr, router.data(), router.size() * 4, cudaMemcpyHostToDevice));
  ROOFLINE_CUDA_CHECK(cudaMemcpy(dx, xn.data(), xn.size() * 4, cudaMemcpyHostToDevice));
  ROOFLINE_CUDA_CHECK(cudaMemset(counter, 0, 4));
  DeviceWeight w;
  w.type = DType::F32;
  w.rows = n_expert;
  w.cols = cols;
  w.row_bytes = (size_t)cols * 4;
  w.data = reinterpret_cast<const uint8_t*>(dr);
  if (!moe_router_fits(w, n_rows)) fail("gpu_moe_route_for_test: the fused router does not take {} rows of {}", n_rows, cols);
  // Twice, the outputs cleared in between: the second launch routes only if the first left the counter at 0.
  std::vector<int32_t> first, out(pairs);
  for (int run = 0; run < 2; ++run) {
    ROOFLINE_CUDA_CHECK(cudaMemsetAsync(ids, 0xFF, pairs * 4, stream));
    MoeRouteTail tail;
    if (n_rows <= moe_route_tail_rows()) tail = MoeRouteTail{k, normalize, scale, ids, wts, counter};
    moe_router(w, n_expert, dx, n_rows, logits, tail, stream);
    if (!tail.ids) route_rows(logits, n_rows, n_expert, k, normalize, scale, ids, wts, stream);
    ROOFLINE_CUDA_CHECK(cudaStreamSynchronize(stream));
    ROOFLINE_CUDA_CHECK(cudaMemcpy(out.data(), ids, pairs * 4, cudaMemcpyDeviceToHost));
    if (run == 0) first = out;
    else if (out != first) fail("gpu_moe_route_for_test: the second launch routed differently (the counter was not reset)");
  }
  if (weights) {
    weights->resize(pairs);
    ROOFLINE_CUDA_CHECK(cudaMemcpy(weights->data(), wts, pairs * 4, cudaMemcpyDeviceToHost));
  }
  ROOFLINE_CUDA_CHECK(cudaStreamDestroy(stream));
  return out;
}

}  // namespace roofline
