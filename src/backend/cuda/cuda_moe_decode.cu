// Fewer launches for the MoE block of decode steps (cuda_moe.cuh): the router's product with the routing
// done by its last CTA, the experts' gate/up products with the SwiGLU and its int8 quantization, and
// their down products summed straight into the residual. Each gives the bits of the separate kernels it
// replaces (the same row functions, the same order of sums), so a
// sequence decodes the same alone and in a batch that takes the separate kernels.
#include <algorithm>
#include <type_traits>

#include "backend/cuda/cuda_matvec_blocks.cuh"
#include "backend/gpu.h"
#include "backend/cuda/cuda_moe.cuh"
#include "backend/cuda/cuda_moe_route.cuh"

namespace roofline::cuda {
namespace {

constexpr int kRouterThreads = 256;
constexpr int kRouterWarps = kRouterThreads / 32;
constexpr int kRouterVec = 4;  // float4s of the router row per thread, held in registers
constexpr int kRouterBlockExperts = 1024;  // one row's routing by the whole last CTA (route_row_block) up to this many experts
constexpr int kDownRows = 4;       // output rows per CTA of the down + combine kernel (per warp, of each expert)
constexpr int kDownMaxWarps = 16;  // warps per CTA of it: one per expert, up to this many

// logits[t, e] = router[e] . xn[t] for t < n_rows, one CTA per expert e. The router row is loaded before
// the dependency wait (weights are no kernel's output), so its read overlaps the kernel before it. Each
// thread sums its float4s in order, each warp its threads (butterfly), then the warps in order: the
// same bits for a row whatever n_rows is. With a tail (ids), the CTA that finishes last routes every row
// (a step of one row with the whole CTA, route_row_block; else a warp per row, route_row; n_rows <=
// kRouterWarps) and resets the counter for the next launch.
// NORM: the block's rms norm too (n_rows <= kMoeRouterNormRows): xn[t] = x[t] * rsqrt(mean(x[t]^2) + eps) * norm.w,
// summed and rounded as rms_norm_wide_kernel does (256 threads, float4 i = thread, thread + 256, .., add_squares,
// block_sum), each CTA for itself; CTAs c < the row's groups / 8 also write eight of its 32-element groups of xn and
// their int8 form, as that kernel's CTA c does. So the separate norm kernel and its boundary go.
template <bool NORM>
__global__ void __launch_bounds__(kRouterThreads) moe_router_kernel(const float* router, int cols, const float* xn, int n_rows, float* logits,
                                                                    int n_expert, MoeRouteTail tail, bool whole_cta, MoeRouterNorm norm) {
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, e = blockIdx.x;
  const int n4 = cols / 4;
  float4 w[kRouterVec], nw[kRouterVec];
#pragma unroll
  for (int v = 0; v < kRouterVec; ++v) {
    const int i = tid + v * kRouterThreads;
    w[v] = i < n4 ? __ldg(reinterpret_cast<const float4*>(router + (int64_t)e * cols) + i) : make_float4(0, 0, 0, 0);
    if constexpr (NORM) nw[v] = i < n4 ? __ldg(reinterpret_cast<const float4*>(norm.w) + i) : make_float4(0, 0, 0, 0);
  }
  wait_for_previous_kernel();
  __shared__ float part[kRouterWarps][kMoeRouterMaxRows];
  __shared__ float red[32];
  __shared__ bool last;
  for (int t = 0; t < n_rows; ++t) {
    const float4* x = reinterpret_cast<const float4*>((NORM ? norm.x : xn) + (int64_t)t * cols);
    float4 xv[kRouterVec];
    float scale = 1.0f;
#pragma unroll
    for (int v = 0; v < kRouterVec; ++v) {
      const int i = tid + v * kRouterThreads;
      xv[v] = i < n4 ? x[i] : make_float4(0, 0, 0, 0);
    }
    if constexpr (NORM) {
      float ss = 0;
#pragma unroll
      for (int v = 0; v < kRouterVec; ++v)
        if (tid + v * kRouterThreads < n4) ss = add_squares(ss, xv[v]);
      scale = rsqrtf(block_sum(ss, red) / (float)cols + norm.eps);
#pragma unroll
      for (int v = 0; v < kRouterVec; ++v)
        xv[v] = make_float4(xv[v].x * scale * nw[v].x, xv[v].y * scale * nw[v].y, xv[v].z * scale * nw[v].z, xv[v].w * scale * nw[v].w);
    }
    float acc = 0;
#pragma unroll
    for (int v = 0; v < kRouterVec; ++v) {
      const int i = tid + v * kRouterThreads;
      if (i < n4) {
        acc = fmaf(w[v].x, xv[v].x, acc);
        acc = fmaf(w[v].y, xv[v].y, acc);
        acc = fmaf(w[v].z, xv[v].z, acc);
        acc = fmaf(w[v].w, xv[v].w, acc);
      }
    }
    acc = warp_sum(acc);
    if (lane == 0) part[warp][t] = acc;
    if constexpr (NORM) {  // xn's groups g = 8c + warp of CTAs c, one lane an element
      const float* xr = norm.x + (int64_t)t * cols;
      for (int g = e * kRouterWarps + warp; g < (cols + 31) / 32; g += n_expert * kRouterWarps) {
        const int col = g * 32 + lane;
        const float v = col < cols ? xr[col] * scale * norm.w[col] : 0.0f;
        if (col < cols) norm.out[(int64_t)t * cols + col] = v;
        if (norm.act.q && g < cols / 32) {
          const int64_t gi = (int64_t)t * (cols / 32) + g;
          warp_quantize32(v, lane, const_cast<int8_t*>(norm.act.q) + gi * 32, const_cast<float*>(norm.act.d) + gi,
                          const_cast<float*>(norm.act.s) + gi);
        }
      }
    }
  }
  __syncthreads();
  for (int t = tid; t < n_rows; t += kRouterThreads) {
    float sum = 0;
#pragma unroll
    for (int k = 0; k < kRouterWarps; ++k) sum += part[k][t];
    logits[(int64_t)t * n_expert + e] = sum;
  }
  if (!tail.ids) return;
  // The last CTA to arrive routes (one thread fences and counts for the CTA, as a grid barrier does).
  __syncthreads();
  if (tid == 0) {
    __threadfence();
    last = atomicAdd(tail.counter, 1) == (int)gridDim.x - 1;
    if (last) {
      *tail.counter = 0;
      __threadfence();
    }
  }
  __syncthreads();
  if (!last) return;
  if (whole_cta && n_rows == 1 && n_expert <= kRouterBlockExperts) {
    __shared__ float lv[kRouterBlockExperts], sel_v[kMaxExpertsUsed];
    __shared__ int sel_e[kMaxExpertsUsed];
    route_row_block(logits, n_expert, tail.k, tail.normalize, tail.scale, tail.ids, tail.weights, lv, sel_e, sel_v);
  } else if (warp < n_rows) {
    route_row(logits + (int64_t)warp * n_expert, n_expert, tail.k, tail.normalize, tail.scale, tail.ids + (int64_t)warp * tail.k,
              tail.weights + (int64_t)warp * tail.k, lane);
  }
}

// The experts' products of R rows, as the grouped expert kernels reduce them (cuda_matvec.cu, product_rows).
template <DType T, int R = kDownRows>
__device__ __forceinline__ void expert_rows(const DeviceWeight& w, const ActQ8& act, int64_t row0, int lane, float (&acc)[R][1]) {
  if constexpr (T == DType::Q4_K) matvec_q4_k_partials<1, R>(w, act, row0, lane, acc);
  else if constexpr (T == DType::Q6_K) matvec_q6_k_partials<1, R, 1>(w, act, row0, lane, acc);
  else block_partials<Q8_0Blocks, 1, R, 1>(w, act, row0, lane, acc);
}

// The routed experts' weighted sum of output row r of token t: weights in routing order, as moe_combine_kernel adds them.
template <int N>
__device__ __forceinline__ float routed_sum(const float* weights, const float (&y)[kMaxExpertsUsed][N], int t, int k, int r) {
  float sum = 0;
  for (int s = 0; s < k; ++s) sum = fmaf(weights[(int64_t)t * k + s], y[s][r], sum);
  return sum;
}

// x[t, r] += sum_s weights[t * k + s] * (down of expert ids[t * k + s] . h[t * k + s])[r] for the kDownRows
// rows r of a CTA and token t = blockIdx.y: warp w takes the experts s = w, w + warps, .. (so every
// expert's loads are in flight at once, one round each, as in the grouped kernels), puts its rows'
// sums in shared memory, and the first lanes add them up in routing order, as moe_combine_kernel does.
// Shared: the last warp computes the shared expert's rows and its gate (shared_gate_dot), added after the
// routed sum as moe_shared_add_kernel adds them.
template <DType T, bool Shared>
__global__ void __launch_bounds__(kDownMaxWarps * 32) moe_down_combine_kernel(DeviceWeight down, int64_t rows_per_expert, ActQ8 act,
                                                                              const int32_t* ids, const float* weights, int k, float* x,
                                                                              DeviceWeight sdown, ActQ8 sact, const float* sgate, const float* xn) {
  __shared__ float y[kMaxExpertsUsed][kDownRows];
  __shared__ float ysh[kDownRows];
  __shared__ float gate_sh;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32 - (Shared ? 1 : 0);
  const int64_t row0 = (int64_t)blockIdx.x * kDownRows;
  const int t = blockIdx.y;
  const int64_t groups = down.cols / 32;
  wait_for_previous_kernel();
  if (Shared && warp == warps) {
    const int64_t sgroups = sdown.cols / 32;
    float acc[kDownRows][1] = {};
    expert_rows<T>(expert_view_of<T>(sdown, 0, rows_per_expert),
                   ActQ8{sact.q + (int64_t)t * sdown.cols, sact.d + t * sgroups, sact.s + t * sgroups}, row0, lane, acc);
#pragma unroll
    for (int r = 0; r < kDownRows; ++r) {
      const float v = warp_sum(acc[r][0]);
      if (lane == 0) ysh[r] = v;
    }
    const float dot = shared_gate_dot(sgate, xn + (int64_t)t * rows_per_expert, (int)rows_per_expert, lane);
    if (lane == 0) gate_sh = 1.0f / (1.0f + expf(-dot));
  }
  for (int s = warp; s < k && warp < warps; s += warps) {
    const int64_t p = (int64_t)t * k + s;
    float acc[kDownRows][1] = {};
    expert_rows<T>(expert_view_of<T>(down, ids[p], rows_per_expert), ActQ8{act.q + p * down.cols, act.d + p * groups, act.s + p * groups}, row0,
                   lane, acc);
#pragma unroll
    for (int r = 0; r < kDownRows; ++r) {
      const float v = warp_sum(acc[r][0]);
      if (lane == 0) y[s][r] = v;
    }
  }
  __syncthreads();
  if (threadIdx.x < kDownRows && row0 + threadIdx.x < rows_per_expert) {
    const float sum = routed_sum(weights, y, t, k, threadIdx.x);
    float* xr = x + (int64_t)t * rows_per_expert + row0 + threadIdx.x;
    if constexpr (Shared) {
      float v = *xr + sum;       // what the routed launch stores
      v += gate_sh * ysh[threadIdx.x];  // moe_shared_add_kernel's expression, contracted alike
      *xr = v;
    } else {
      *xr += sum;
    }
  }
}

// Q4_K expert rows of NSB <= 4 super-blocks (experts of 512-1024 values; matvec_q4_k_partials leaves 8 - NSB of a
// warp's 8 lane groups idle on them) with one row per 4-lane group: lane c of group r takes every super-block g of row
// r, each term summed from zero as the lane of super-block g would (q4_k_round), then the terms are added in
// warp_sum's tree over the groups (g with g ^ 4, then g ^ 2, then g ^ 1; the idle groups' zeros included) and the
// group's 4 lanes by the rest of it: the bits of matvec_q4_k_partials + warp_sum, eight rows a warp.
template <int NSB>
__device__ __forceinline__ float q4k_short_row(const DeviceWeight& w, const ActQ8& act, int64_t row, int c) {
  const uint8_t* rowp[1] = {w.data + min(row, w.rows - 1) * w.row_bytes};  // past the end: a repeat, not stored
  Q4KRound<1> in[NSB];
#pragma unroll
  for (int g = 0; g < NSB; ++g) in[g].load(rowp, g, c);
  float t[8] = {};
#pragma unroll
  for (int g = 0; g < NSB; ++g) {
    float acc[1][1] = {{0.0f}};
    q4_k_round<1, 1>(in[g], w, act, g, c, acc);
    t[g] = acc[0][0];
  }
  float v = ((t[0] + t[4]) + (t[2] + t[6])) + ((t[1] + t[5]) + (t[3] + t[7]));
  v += __shfl_xor_sync(0xffffffffu, v, 2);
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v;
}

// moe_down_combine_kernel for Q4_K experts of NSB <= 4 super-blocks a row: kShortRows output rows a CTA (one per lane
// group of each warp), the same sums and combine, half the CTAs of the four-row kernel (qwen3-30b-a3b: 256 for a
// token's 8 experts, one wave at two CTAs a SM, where the four-row kernel's 512 take 1.94).
constexpr int kShortRows = 8;
template <int NSB>
__global__ void __launch_bounds__(kDownMaxWarps * 32) moe_down_combine_short_kernel(DeviceWeight down, int64_t rows_per_expert, ActQ8 act,
                                                                                    const int32_t* ids, const float* weights, int k, float* x) {
  __shared__ float y[kMaxExpertsUsed][kShortRows];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  const int64_t row0 = (int64_t)blockIdx.x * kShortRows;
  const int t = blockIdx.y;
  const int64_t groups = down.cols / 32;
  wait_for_previous_kernel();
  for (int s = warp; s < k; s += warps) {
    const int64_t p = (int64_t)t * k + s;
    const float v = q4k_short_row<NSB>(expert_view_of<DType::Q4_K>(down, ids[p], rows_per_expert),
                                       ActQ8{act.q + p * down.cols, act.d + p * groups, act.s + p * groups}, row0 + lane / 4, lane % 4);
    if (lane % 4 == 0) y[s][lane / 4] = v;
  }
  __syncthreads();
  if (threadIdx.x < kShortRows && row0 + threadIdx.x < rows_per_expert) {
    x[(int64_t)t * rows_per_expert + row0 + threadIdx.x] += routed_sum(weights, y, t, k, threadIdx.x);
  }
}

// h[p, 32 b + i] = silu(gate_e . x) * (up_e . x) for the 32 rows of block b = blockIdx.x of pair p =
// blockIdx.y (expert e = ids[p], input row x = p / k of xn), quantized to int8 as gated_product_kernel
// does (its formula, warp_quantize32): with R rows a warp, warps 0 to 32 / R - 1 take R gate rows each, the
// others the same rows of up, one round of loads each, as the grouped kernels reduce them.
template <DType T, int R>
__global__ void __launch_bounds__(64 / R * 32, R == 8 ? 2 : 0) moe_gate_up_swiglu_kernel(DeviceWeight gate, DeviceWeight up, int64_t rows_per_expert,
                                                                                  ActQ8 xn, const int32_t* ids, int k, ActQ8 h) {
  constexpr int kHalf = 32 / R;  // warps on gate rows
  __shared__ float g[32], u[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t blk = blockIdx.x, p = blockIdx.y, row0 = blk * 32 + (warp % kHalf) * R;
  const int64_t in = p / k, groups = gate.cols / 32;
  wait_for_previous_kernel();
  const DeviceWeight w = expert_view_of<T>(warp < kHalf ? gate : up, ids[p], rows_per_expert);
  float acc[R][1] = {};
  expert_rows<T, R>(w, ActQ8{xn.q + in * gate.cols, xn.d + in * groups, xn.s + in * groups}, row0, lane, acc);
  float* dst = warp < kHalf ? g : u;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const float v = warp_sum(acc[r][0]);
    if (lane == 0) dst[(warp % kHalf) * R + r] = v;
  }
  __syncthreads();
  if (warp != 0) return;
  const float a = g[lane];
  const float v = a / (1.0f + __expf(-a)) * u[lane];
  const int64_t gi = p * (rows_per_expert / 32) + blk;
  warp_quantize32(v, lane, const_cast<int8_t*>(h.q) + gi * 32, const_cast<float*>(h.d) + gi, const_cast<float*>(h.s) + gi);
}

// Calls f with std::integral_constant<DType, T> for a weight type T among those decode_kind takes.
template <typename F>
void with_decode_kind(DType type, F&& f) {
  switch (type) {
    case DType::Q4_K: return f(std::integral_constant<DType, DType::Q4_K>{});
    case DType::Q6_K: return f(std::integral_constant<DType, DType::Q6_K>{});
    default: return f(std::integral_constant<DType, DType::Q8_0>{});
  }
}

// The weights the fused decode kernels read: Q4_K, Q6_K or Q8_0 in the layout the matvec kernels take.
bool decode_kind(const DeviceWeight& w) {
  return w.cols % 256 == 0 && ((w.type == DType::Q4_K && w.layout == WeightLayout::Raw) || (w.type == DType::Q6_K && w.layout == WeightLayout::Q6KPlanes) ||
                               (w.type == DType::Q8_0 && w.layout == WeightLayout::Q8_0Planes));
}

}  // namespace

bool moe_router_fits(const DeviceWeight& router, int n_rows) {
  static const bool on = env_switch("ROOFLINE_MOE_FUSED_ROUTER", true);
  return on && router.type == DType::F32 && router.layout == WeightLayout::Raw && router.cols % 4 == 0 &&
         router.cols <= 4 * kRouterThreads * kRouterVec && n_rows >= 1 && n_rows <= kMoeRouterMaxRows;
}

int moe_route_tail_rows() { return kRouterWarps; }

bool moe_router_norms(const DeviceWeight& router, int n_rows) {
  static const bool on = env_switch("ROOFLINE_MOE_ROUTER_NORM", true);
  return on && n_rows <= kMoeRouterNormRows && moe_router_fits(router, n_rows);
}

void moe_router(const DeviceWeight& router, int n_expert, const float* xn, int n_rows, float* logits, const MoeRouteTail& tail,
                cudaStream_t stream, const MoeRouterNorm* norm) {
  if (!moe_router_fits(router, n_rows) || router.rows != n_expert || (tail.ids && (n_rows > kRouterWarps || !tail.counter)) ||
      (norm && (n_rows > kMoeRouterNormRows || !norm->x || !norm->w || !norm->out || norm->out != xn)))
    fail("internal error: the fused MoE router over {} rows of a {} x {} {} router", n_rows, router.rows, router.cols, dtype_name(router.type));
  // A step of one row is routed by the whole last CTA (route_row_block); ROOFLINE_MOE_ROUTE_CTA=0 leaves it
  // to one warp. Measured on the H200 (tg128, qwen3-30b-a3b, two rounds): 387.8 / 388.9 against 385.0 / 384.0.
  static const bool whole_cta = env_switch("ROOFLINE_MOE_ROUTE_CTA", true);
  const float* r = reinterpret_cast<const float*>(router.data);
  if (norm)
    launch(moe_router_kernel<true>, dim3((unsigned)n_expert), dim3(kRouterThreads), 0, stream, pdl_enabled(), r, (int)router.cols, xn, n_rows,
           logits, n_expert, tail, whole_cta, *norm);
  else
    launch(moe_router_kernel<false>, dim3((unsigned)n_expert), dim3(kRouterThreads), 0, stream, pdl_enabled(), r, (int)router.cols, xn, n_rows,
           logits, n_expert, tail, whole_cta, MoeRouterNorm{});
}

bool moe_down_combine_fits(const DeviceWeight& down) {
  static const bool on = env_switch("ROOFLINE_MOE_DOWN_COMBINE", true);
  return on && decode_kind(down);
}

bool moe_gate_up_swiglu_fits(const DeviceWeight& gate, const DeviceWeight& up, int64_t rows_per_expert) {
  static const bool on = env_switch("ROOFLINE_MOE_GATE_UP_SWIGLU", true);
  return on && decode_kind(gate) && gate.type == up.type && gate.layout == up.layout && gate.cols == up.cols && rows_per_expert % 32 == 0;
}

void moe_gate_up_swiglu(const DeviceWeight& gate, const DeviceWeight& up, int64_t rows_per_expert, const ActQ8& xn, const int32_t* ids, int n_pairs,
                        int k, const ActQ8& h, cudaStream_t stream) {
  if (n_pairs == 0) return;
  if (!moe_gate_up_swiglu_fits(gate, up, rows_per_expert) || !xn.q || xn.row_factor || !h.q || n_pairs > 65535)
    fail("internal error: the fused MoE gate/up + SwiGLU over {} pairs of {} gate and up tensors", n_pairs, dtype_name(gate.type));
  // Eight rows a warp (CTAs of 8 warps, 126 registers: two a SM) where the weights allow it without spills: a
  // token's 8 experts of qwen3-30b-a3b (768 rows each) are 192 CTAs, one wave of these where the four-row CTAs (16
  // warps at 90-97 registers: one a SM) took two. Measured on the H200 (tg64, three rounds, docs/performance.md,
  // twenty-eighth session): qwen3-30b-a3b 444.6 / 445.6 / 454.2 -> 476.5 / 469.8 / 484.5, qwen3.5-35b-a3b (512-row
  // experts: 128 CTAs, one wave either way) level. ROOFLINE_MOE_GATE_UP_ROWS=4 keeps four.
  static const bool eight = [] {
    const char* e = std::getenv("ROOFLINE_MOE_GATE_UP_ROWS");
    return !(e && std::atoi(e) == 4);
  }();
  const dim3 grid((unsigned)(rows_per_expert / 32), (unsigned)n_pairs);
  with_decode_kind(gate.type, [&](auto kind) {
    constexpr DType T = decltype(kind)::value;
    if constexpr (T != DType::Q6_K) {  // Q6_K spills at eight rows
      if (eight) return launch(moe_gate_up_swiglu_kernel<T, 8>, grid, dim3(256), 0, stream, pdl_enabled(), gate, up, rows_per_expert, xn, ids, k, h);
    }
    launch(moe_gate_up_swiglu_kernel<T, 4>, grid, dim3(512), 0, stream, pdl_enabled(), gate, up, rows_per_expert, xn, ids, k, h);
  });
}

int moe_down_short_for_test = -1;

bool moe_down_combine_takes_shared(const DeviceWeight& down, const DeviceWeight& shared_down, int k) {
  // Q6_K: its 128 registers over the k + 1 warps of a CTA would leave one CTA a SM (two at k warps).
  return moe_down_combine_fits(down) && down.type != DType::Q6_K && shared_down.type == down.type && shared_down.layout == down.layout &&
         decode_kind(shared_down) && k + 1 <= kDownMaxWarps;
}

void moe_down_combine(const DeviceWeight& down, int64_t rows_per_expert, const ActQ8& act, const int32_t* ids, const float* weights, int n_rows,
                      int k, float* x, cudaStream_t stream, const MoeSharedDown* shared) {
  if (n_rows == 0) return;
  if (!moe_down_combine_fits(down) || !act.q || act.row_factor)
    fail("internal error: the fused MoE down + combine over a {} down tensor", dtype_name(down.type));
  if (shared && (!shared->down || !moe_down_combine_takes_shared(down, *shared->down, k) || !shared->act.q || !shared->gate || !shared->xn ||
                 shared->down->rows != rows_per_expert))
    fail("internal error: a shared expert the fused MoE down + combine does not take");
  // Q4_K experts of 1-4 super-blocks a row: eight rows a CTA, every lane busy (on since the thirtieth session: tg64
  // +1% on qwen3-30b-a3b, +2-3% on qwen3.5-35b-a3b; ROOFLINE_MOE_DOWN_SHORT=0 takes the four-row kernel).
  static const bool short_env = env_switch("ROOFLINE_MOE_DOWN_SHORT", true);
  const bool short_rows = moe_down_short_for_test >= 0 ? moe_down_short_for_test == 1 : short_env;
  const int64_t n_sb = down.cols / 256;
  if (short_rows && !shared && down.type == DType::Q4_K && n_sb >= 1 && n_sb <= 4) {
    const dim3 grid8((unsigned)((rows_per_expert + kShortRows - 1) / kShortRows), (unsigned)n_rows), block8(32 * std::min(k, kDownMaxWarps));
    switch (n_sb) {
      case 1: return launch(moe_down_combine_short_kernel<1>, grid8, block8, 0, stream, pdl_enabled(), down, rows_per_expert, act, ids, weights, k, x);
      case 2: return launch(moe_down_combine_short_kernel<2>, grid8, block8, 0, stream, pdl_enabled(), down, rows_per_expert, act, ids, weights, k, x);
      case 3: return launch(moe_down_combine_short_kernel<3>, grid8, block8, 0, stream, pdl_enabled(), down, rows_per_expert, act, ids, weights, k, x);
      default: return launch(moe_down_combine_short_kernel<4>, grid8, block8, 0, stream, pdl_enabled(), down, rows_per_expert, act, ids, weights, k, x);
    }
  }
  const dim3 grid((unsigned)((rows_per_expert + kDownRows - 1) / kDownRows), (unsigned)n_rows);
  const DeviceWeight sdown = shared ? *shared->down : down;
  const ActQ8 sact = shared ? shared->act : ActQ8{};
  const float* sgate = shared ? shared->gate : nullptr;
  const float* xn = shared ? shared->xn : nullptr;
  with_decode_kind(down.type, [&](auto kind) {
    constexpr DType T = decltype(kind)::value;
    if constexpr (T != DType::Q6_K) {
      if (shared)
        return launch(moe_down_combine_kernel<T, true>, grid, dim3(32 * (k + 1)), 0, stream, pdl_enabled(), down, rows_per_expert, act, ids, weights,
                      k, x, sdown, sact, sgate, xn);
    }
    launch(moe_down_combine_kernel<T, false>, grid, dim3(32 * std::min(k, kDownMaxWarps)), 0, stream, pdl_enabled(), down, rows_per_expert, act, ids,
           weights, k, x, sdown, sact, sgate, xn);
  });
}

}  // namespace roofline::cuda

namespace roofline {

namespace {

// The test hooks' f32 router of n_expert rows on the device.
cuda::DeviceWeight f32_router(const float* data, int n_expert, int cols) {
  cuda::DeviceWeight w;
  w.type = DType::F32;
  w.rows = n_expert;
  w.cols = cols;
  w.row_bytes = (size_t)cols * 4;
  w.data = reinterpret_cast<const uint8_t*>(data);
  return w;
}

}  // namespace

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
  const DeviceWeight w = f32_router(dr, n_expert, cols);
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

std::vector<float> gpu_moe_router_norm_for_test(const std::vector<float>& router, int n_expert, int cols, const std::vector<float>& x,
                                                const std::vector<float>& norm_w, float eps, int n_rows, bool router_norms, int device) {
  using namespace cuda;
  if (router.size() != (size_t)n_expert * cols || x.size() != (size_t)n_rows * cols || norm_w.size() != (size_t)cols || n_rows < 1 ||
      n_rows > kMoeRouterNormRows)
    fail("gpu_moe_router_norm_for_test: a {} x {} router, {} rows of input", n_expert, cols, n_rows);
  ROOFLINE_CUDA_CHECK(cudaSetDevice(device));
  cudaStream_t stream;
  ROOFLINE_CUDA_CHECK(cudaStreamCreate(&stream));
  DeviceArena arena;
  const size_t values = (size_t)n_rows * cols, groups = (size_t)n_rows * (cols / 32);
  arena.reserve((router.size() + 2 * values + cols + (size_t)n_rows * n_expert + 2 * groups) * 4 + values + 8 * 256);
  auto up = [&](const std::vector<float>& v) {
    float* d = reinterpret_cast<float*>(arena.take(v.size() * 4));
    ROOFLINE_CUDA_CHECK(cudaMemcpy(d, v.data(), v.size() * 4, cudaMemcpyHostToDevice));
    return d;
  };
  const float *dr = up(router), *dx = up(x), *dw = up(norm_w);
  float* xn = reinterpret_cast<float*>(arena.take(values * 4));
  float* logits = reinterpret_cast<float*>(arena.take((size_t)n_rows * n_expert * 4));
  ActQ8 act;
  act.q = reinterpret_cast<int8_t*>(arena.take(values));
  act.d = reinterpret_cast<float*>(arena.take(groups * 4));
  act.s = reinterpret_cast<float*>(arena.take(groups * 4));
  const DeviceWeight w = f32_router(dr, n_expert, cols);
  if (!moe_router_fits(w, n_rows)) fail("gpu_moe_router_norm_for_test: the fused router does not take {} rows of {}", n_rows, cols);
  const ActQ8 act_out = cols % 32 == 0 ? act : ActQ8{};
  if (router_norms) {
    const MoeRouterNorm norm{dx, dw, eps, xn, act_out};
    moe_router(w, n_expert, xn, n_rows, logits, MoeRouteTail{}, stream, &norm);
  } else {
    rms_norm(dx, dw, eps, n_rows, cols, nullptr, xn, act_out, stream);
    moe_router(w, n_expert, xn, n_rows, logits, MoeRouteTail{}, stream);
  }
  ROOFLINE_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<float> out((size_t)n_rows * n_expert + values);
  ROOFLINE_CUDA_CHECK(cudaMemcpy(out.data(), logits, (size_t)n_rows * n_expert * 4, cudaMemcpyDeviceToHost));
  ROOFLINE_CUDA_CHECK(cudaMemcpy(out.data() + (size_t)n_rows * n_expert, xn, values * 4, cudaMemcpyDeviceToHost));
  if (act_out.q) {
    std::vector<int8_t> q(values);
    std::vector<float> d(groups), sums(groups);
    ROOFLINE_CUDA_CHECK(cudaMemcpy(q.data(), act.q, values, cudaMemcpyDeviceToHost));
    ROOFLINE_CUDA_CHECK(cudaMemcpy(d.data(), act.d, groups * 4, cudaMemcpyDeviceToHost));
    ROOFLINE_CUDA_CHECK(cudaMemcpy(sums.data(), act.s, groups * 4, cudaMemcpyDeviceToHost));
    for (int8_t v : q) out.push_back((float)v);
    out.insert(out.end(), d.begin(), d.end());
    out.insert(out.end(), sums.begin(), sums.end());
  }
  ROOFLINE_CUDA_CHECK(cudaStreamDestroy(stream));
  return out;
}

}  // namespace roofline
