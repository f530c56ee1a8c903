// The GPU's mixture-of-experts FFN (cuda_moe.cuh): routing, expert products by id over the stacked
// tensors, SwiGLU, the weighted combine into the residual, and the gated shared expert.
#include "backend/cuda/cuda_moe.cuh"

#include <algorithm>
#include <cfloat>
#include <climits>

#include "backend/cpu/host_experts.h"
#include "backend/cuda/cuda_dequant.cuh"
#include "backend/cuda/cuda_kernels.cuh"
#include "backend/cuda/cuda_moe_route.cuh"

namespace roofline::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kDirectPairRows = 2;  // steps of up to this many tokens run their pairs unsorted (forward_pairs)

// One warp per row (route_row).
__global__ void moe_route_kernel(const float* logits, int n_rows, int n_expert, int k, bool normalize, float scale,
                                 int32_t* ids, float* weights) {
  wait_for_previous_kernel();
  const int lane = threadIdx.x % 32;
  const int row = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= n_rows) return;
  route_row(logits + (int64_t)row * n_expert, n_expert, k, normalize, scale, ids + (int64_t)row * k, weights + (int64_t)row * k, lane);
}

// x[t, i] += sum_s weights[t, s] * y[slot_of_pair[t * k + s], i], slots in routing order (the sum's order
// does not depend on where the sort put the rows).
__global__ void moe_combine_kernel(const float* y, const int32_t* slot_of_pair, const float* weights, int k, int n, float* x) {
  wait_for_previous_kernel();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  const int t = blockIdx.y;
  if (i >= n) return;
  float acc = 0;
  for (int s = 0; s < k; ++s) acc = fmaf(weights[t * k + s], y[(int64_t)(slot_of_pair ? slot_of_pair[t * k + s] : t * k + s) * n + i], acc);
  x[(int64_t)t * n + i] += acc;
}

// The step's (token, expert) pairs grouped by expert, in one block: counts per expert (shared atomics),
// offsets by a warp scan, the active experts in expert order (then -1 up to max_active), and each pair's
// row in the grouped order. Within an expert the order of rows follows the atomics; nothing computed
// depends on it (each row's product is its own, and the combine reads rows by pair).
__global__ void moe_sort_kernel(const int32_t* ids, int n_pairs, int k, int n_expert, int max_active, int32_t* offsets, int32_t* active,
                                int32_t* row_token, int32_t* slot_of_pair, int tile_rows, int32_t* tile_expert, int32_t* tile_row0,
                                int32_t* tile_n, int32_t* n_tiles) {
  wait_for_previous_kernel();
  extern __shared__ int32_t sort_smem[];
  int32_t* count = sort_smem;              // [n_expert]
  int32_t* cursor = sort_smem + n_expert;  // [n_expert]
  for (int e = threadIdx.x; e < n_expert; e += blockDim.x) count[e] = 0;
  __syncthreads();
  for (int p = threadIdx.x; p < n_pairs; p += blockDim.x) atomicAdd(&count[ids[p]], 1);
  __syncthreads();
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    int running = 0, running_active = 0, running_tiles = 0;
    for (int base = 0; base < n_expert; base += 32) {
      const int e = base + lane;
      const int c = e < n_expert ? count[e] : 0;
      const int nt = tile_rows > 0 ? (c + tile_rows - 1) / tile_rows : 0;  // token tiles of this expert
      int incl = c, incl_t = nt;
#pragma unroll
      for (int d = 1; d < 32; d <<= 1) {
        const int v = __shfl_up_sync(0xffffffffu, incl, d), vt = __shfl_up_sync(0xffffffffu, incl_t, d);
        if (lane >= d) incl += v, incl_t += vt;
      }
      for (int j = 0; j < nt; ++j) {
        const int tile = running_tiles + incl_t - nt + j;
        tile_expert[tile] = e;
        tile_row0[tile] = running + incl - c + j * tile_rows;
        tile_n[tile] = min(tile_rows, c - j * tile_rows);
      }
      running_tiles += __shfl_sync(0xffffffffu, incl_t, 31);
      const unsigned has = __ballot_sync(0xffffffffu, c > 0);
      if (e < n_expert) {
        offsets[e] = running + incl - c;
        cursor[e] = running + incl - c;
        if (c > 0) {
          const int a = running_active + __popc(has & ((1u << lane) - 1));
          if (a < max_active) active[a] = e;
        }
      }
      running += __shfl_sync(0xffffffffu, incl, 31);
      running_active += __popc(has);
    }
    if (lane == 0) {
      offsets[n_expert] = running;
      if (n_tiles) *n_tiles = running_tiles;
    }
    for (int a = running_active + lane; a < max_active; a += 32) active[a] = -1;
  }
  __syncthreads();
  for (int p = threadIdx.x; p < n_pairs; p += blockDim.x) {
    const int pos = atomicAdd(&cursor[ids[p]], 1);
    row_token[pos] = p / k;
    slot_of_pair[p] = pos;
  }
}

// out[j] = x[row_token[j]] for j < n_rows (rows of n floats).
__global__ void moe_gather_kernel(const float* x, const int32_t* row_token, int n, float* out) {
  wait_for_previous_kernel();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  const int j = blockIdx.y;
  if (i < n) out[(int64_t)j * n + i] = x[(int64_t)row_token[j] * n + i];
}

// x[t] += sigmoid(gate . xn[t]) * y[t]: one block per row (256 threads), the dot reduced in a fixed order
// (shared_gate_dot, cuda_moe_route.cuh, repeats it in one warp for the fused decode launches).
__global__ void moe_shared_add_kernel(const float* gate, const float* xn, const float* y, int n, float* x) {
  wait_for_previous_kernel();
  __shared__ float partial[32];
  const int t = blockIdx.x;
  const float* xr = xn + (int64_t)t * n;
  float dot = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) dot += gate[i] * xr[i];
  dot = warp_sum(dot);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = dot;
  __syncthreads();
  if (threadIdx.x < 32) {
    float v = threadIdx.x < blockDim.x / 32 ? partial[threadIdx.x] : 0.0f;
    v = warp_sum(v);
    if (threadIdx.x == 0) partial[0] = v;
  }
  __syncthreads();
  const float s = 1.0f / (1.0f + expf(-partial[0]));
  for (int i = threadIdx.x; i < n; i += blockDim.x) x[(int64_t)t * n + i] += s * y[(int64_t)t * n + i];
}

// x[i] += y[i] for i < n.
__global__ void moe_add_kernel(const float* y, int64_t n, float* x) {
  wait_for_previous_kernel();
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] += y[i];
}

// Activations for a product over w: int8 rows when its kernel takes them, else the floats.
bool takes_q8(const DeviceWeight& w) { return matvec_uses_q8(w.type); }

// CTAs sharing one expert's rows: enough 8-row chunks per CTA pass for the average expert to spread.
int chunk_splits_for(int rows_per_group) { return std::clamp((rows_per_group + 7) / 8, 1, 64); }

}  // namespace

void group_pairs_by_expert(const int32_t* ids, int n_pairs, int k, int n_expert, int max_active, int32_t* offsets, int32_t* active,
                           int32_t* row_token, int32_t* slot_of_pair, const ExpertTileBuffers* tiles, cudaStream_t stream) {
  if (n_pairs == 0) return;
  launch(moe_sort_kernel, dim3(1), dim3(1024), (size_t)n_expert * 8, stream, pdl_enabled(), ids, n_pairs, k, n_expert, max_active,
         offsets, active, row_token, slot_of_pair, tiles ? tiles->tile_rows : 0, tiles ? tiles->expert : nullptr,
         tiles ? tiles->row0 : nullptr, tiles ? tiles->rows : nullptr, tiles ? tiles->n_tiles : nullptr);
}

void route_rows(const float* logits, int n_rows, int n_expert, int k, bool normalize, float scale, int32_t* ids, float* weights,
                cudaStream_t stream) {
  if (n_rows == 0) return;
  launch(moe_route_kernel, dim3((unsigned)((n_rows + kWarpsPerBlock - 1) / kWarpsPerBlock)), dim3(32 * kWarpsPerBlock), 0, stream,
         pdl_enabled(), logits, n_rows, n_expert, k, normalize, scale, ids, weights);
}

int expert_tile_nt(int n_pairs, int n_expert) {
  const int avg = n_pairs / std::max(1, std::min(n_pairs, n_expert));
  return avg <= 16 ? 2 : avg <= 32 ? 4 : avg <= 48 ? 6 : 8;
}

int expert_max_tiles(int n_pairs, int n_expert, int nt) { return n_pairs / (8 * nt) + std::min(n_pairs, n_expert); }

// (Even rows per expert: a Q6_K expert's slice then starts on a whole word of its f16 scales plane.)
bool moe_uses_mma(const DeviceWeight& w, int64_t rows_per_expert, int n_rows) {
  return n_rows > 64 && rows_per_expert % 2 == 0 && gemm_fuses_dequant(w, 64);
}

void gather_rows(const float* x, const int32_t* row_token, int n_rows, int n, float* out, cudaStream_t stream) {
  if (n_rows == 0) return;
  launch(moe_gather_kernel, dim3((unsigned)((n + 255) / 256), (unsigned)n_rows), dim3(256), 0, stream, pdl_enabled(), x, row_token, n, out);
}

MoeFfn::MoeFfn(const HParams& hp, int max_rows, cudaStream_t stream) : hp_(hp), max_rows_(std::max(1, max_rows)) {
  if (hp.n_expert_used > kMaxExpertsUsed)
    fail("the GPU's MoE routing keeps at most {} experts per token, the model uses {}", kMaxExpertsUsed, hp.n_expert_used);
  if (hp.n_expert >= 65536 || (int64_t)max_rows_ * hp.n_expert_used >= 65536)
    fail("internal error: {} rows x {} experts per token exceed the MoE kernels' grid", max_rows_, hp.n_expert_used);
  if ((size_t)hp.n_expert * 8 > 48 * 1024) fail("the GPU's MoE sort takes at most 6144 experts, the model has {}", hp.n_expert);
  const size_t T = (size_t)max_rows_, K = (size_t)hp.n_expert_used, H = (size_t)hp.n_embd, F = (size_t)hp.n_ff_exp,
               S = (size_t)hp.n_ff_shexp, E = (size_t)hp.n_expert;
  auto bytes = [](size_t n4) { return (n4 * 4 + 255) / 256 * 256; };
  // int8 activations of rows x cols: the values, and a scale and a sum per 32.
  auto act_bytes = [&](size_t rows, size_t cols) { return (rows * cols + 255) / 256 * 256 + 2 * bytes(rows * (cols / 32 + 1)); };
  const size_t P = T * K;
  const int nt = expert_tile_nt((int)P, (int)E);
  max_tiles_ = max_rows_ > 64 ? expert_max_tiles((int)P, (int)E, nt) : 0;  // tensor cores for prompts only
  frag_halves_ = ((size_t)max_tiles_ * 8 * nt * std::max(H, F) + 15) / 16 * kWgMaxSbSteps;  // (the warpgroup tiles: up to 18 k16 steps a super-block)
  arena_.reserve(bytes(T * E) + 2 * bytes(P) + 2 * bytes(P * F) + 2 * bytes(P * H) + 3 * bytes(P) + 2 * bytes(E + 1) +
                 3 * bytes(max_tiles_) + bytes(1) + (frag_halves_ * 2 + 255) / 256 * 256 +
                 act_bytes(P, H) + act_bytes(P, F) + act_bytes(T, H) +
                 (S ? 2 * bytes(T * S) + bytes(T * H) + act_bytes(T, S) + bytes(kDirectPairRows) : 0) + bytes(1) + 32 * 256);
  auto take = [&](size_t floats) { return reinterpret_cast<float*>(arena_.take(floats * 4)); };
  auto take_i = [&](size_t n) { return reinterpret_cast<int32_t*>(arena_.take(n * 4)); };
  auto take_act = [&](size_t rows, size_t cols) {
    ActQ8 a;
    a.q = reinterpret_cast<int8_t*>(arena_.take(rows * cols));
    a.d = take(rows * (cols / 32 + 1));
    a.s = take(rows * (cols / 32 + 1));
    return a;
  };
  logits_ = take(T * E);
  weights_ = take(P);
  ids_ = take_i(P);
  offsets_ = take_i(E + 1);
  active_ = take_i(E + 1);
  row_token_ = take_i(P);
  slot_of_pair_ = take_i(P);
  xs_ = take(P * H);
  gate_ = take(P * F);
  up_ = take(P * F);
  y_ = take(P * H);
  tile_expert_ = take_i(max_tiles_);
  tile_row0_ = take_i(max_tiles_);
  tile_rows_ = take_i(max_tiles_);
  n_tiles_ = take_i(1);
  frag_ = reinterpret_cast<__half*>(arena_.take(frag_halves_ * 2));
  act_xs_ = take_act(P, H);
  act_h_ = take_act(P, F);
  act_xn_ = take_act(T, H);
  if (S) {
    shexp_gate_ = take(T * S);
    shexp_up_ = take(T * S);
    shexp_y_ = take(T * H);
    act_sh_ = take_act(T, S);
    shexp_ids_ = take_i(kDirectPairRows);
    ROOFLINE_CUDA_CHECK(cudaMemsetAsync(shexp_ids_, 0, kDirectPairRows * sizeof(int32_t), stream));
  }
  route_counter_ = take_i(1);
  ROOFLINE_CUDA_CHECK(cudaMemsetAsync(route_counter_, 0, sizeof(int), stream));
}

void MoeFfn::forward(const MoeLayerDev& L, const float* norm_w, float eps, float* xn, int n, float* x, cudaStream_t stream) {
  if (n == 0) return;
  ROOFLINE_CHECK(n <= max_rows_, "internal error: {} rows exceed the MoE buffers ({})", n, max_rows_);
  const int H = hp_.n_embd, E = hp_.n_expert, k = hp_.n_expert_used, F = hp_.n_ff_exp;
  const ActQ8 xn_act = input_act();  // written by the norm (or the router kernel) before the products
  const bool router_norms = moe_router_norms(*L.router, n);
  if (!router_norms) rms_norm(x, norm_w, eps, n, H, nullptr, xn, xn_act, stream);
  ExpertGroups all{};
  all.single_count = n;
  all.chunk_splits = chunk_splits_for(n);
  // Decode batches: the router's own kernel (its last CTA routes steps of a few rows); prompts: the
  // expert matvec and the route kernel. The logits and the picks are the same bits either way.
  bool routed = false;
  if (moe_router_fits(*L.router, n)) {
    MoeRouteTail tail;
    if (n <= moe_route_tail_rows()) tail = MoeRouteTail{k, hp_.expert_weights_norm, hp_.expert_weights_scale, ids_, weights_, route_counter_};
    const MoeRouterNorm norm{x, norm_w, eps, xn, xn_act};
    moe_router(*L.router, E, xn, n, logits_, tail, stream, router_norms ? &norm : nullptr);
    routed = tail.ids != nullptr;
  } else {
    matvec_experts(*L.router, E, all, takes_q8(*L.router) ? xn_act : ActQ8{}, xn, logits_, E, stream);
  }
  if (!routed) route_rows(logits_, n, E, k, hp_.expert_weights_norm, hp_.expert_weights_scale, ids_, weights_, stream);
  const int pairs = n * k, max_active = std::min(pairs, E);
  if (n <= kDirectPairRows && takes_q8(*L.gate_exps) && matvec_can_group(*L.gate_exps, *L.up_exps) && H % 32 == 0) {
    if (folds_shared(L, xn_act, n)) {
      shared_swiglu(L, xn, xn_act, n, true, stream);
      if (!forward_pairs(L, xn_act, n, x, stream, xn)) shared_down_add(L, xn, n, x, stream);
      return;
    }
    forward_pairs(L, xn_act, n, x, stream);
    forward_shared_quantized(L, xn, xn_act, n, x, stream);
    return;
  }
  // Group the (token, expert) pairs by expert: each expert's weights are read once per 8 of its rows
  // (int8 kernels) or per token tile (tensor cores, prompts).
  const bool mma_gate_up = moe_uses_mma(*L.gate_exps, F, n) && moe_uses_mma(*L.up_exps, F, n);
  const bool mma_down = moe_uses_mma(*L.down_exps, H, n);
  const int nt = expert_tile_nt(pairs, E);
  const ExpertTileBuffers tile_buffers{8 * nt, tile_expert_, tile_row0_, tile_rows_, n_tiles_};
  ExpertTiles tiles;
  tiles.expert = tile_expert_;
  tiles.row0 = tile_row0_;
  tiles.rows = tile_rows_;
  tiles.n_tiles = n_tiles_;
  tiles.max_tiles = expert_max_tiles(pairs, E, nt);
  tiles.nt = nt;
  // The tile buffers exist only where prompts of more than 64 rows may take the tensor cores.
  ROOFLINE_CHECK(!(mma_gate_up || mma_down) || tiles.max_tiles <= max_tiles_, "internal error: {} expert token tiles exceed the buffers ({})",
                 tiles.max_tiles, max_tiles_);
  group_pairs_by_expert(ids_, pairs, k, E, max_active, offsets_, active_, row_token_, slot_of_pair_,
                        mma_gate_up || mma_down ? &tile_buffers : nullptr, stream);
  // The grouped inputs: int8 rows quantized straight from xn's rows for the int8 kernels, else floats.
  const bool q8_gate_up = !mma_gate_up && takes_q8(*L.gate_exps) && matvec_can_group(*L.gate_exps, *L.up_exps);
  if (q8_gate_up) quantize_rows(xn, pairs, H, act_xs_, stream, row_token_);
  else gather_rows(xn, row_token_, pairs, H, xs_, stream);
  ExpertGroups grouped{};
  grouped.offsets = offsets_;
  grouped.active = active_;
  grouped.max_active = max_active;
  grouped.chunk_splits = chunk_splits_for(std::max(1, pairs / max_active));
  if (mma_gate_up) {
    mma_experts(*L.gate_exps, F, tiles, xs_, frag_, gate_, F, stream);
    mma_experts(*L.up_exps, F, tiles, xs_, frag_, up_, F, stream);
  } else if (q8_gate_up) {
    matvec_experts_pair(*L.gate_exps, *L.up_exps, F, grouped, act_xs_, nullptr, gate_, up_, F, stream);
  } else {
    const bool q8 = takes_q8(*L.gate_exps) || takes_q8(*L.up_exps);
    if (q8) quantize_rows(xs_, pairs, H, act_xs_, stream);
    matvec_experts(*L.gate_exps, F, grouped, takes_q8(*L.gate_exps) ? act_xs_ : ActQ8{}, xs_, gate_, F, stream);
    matvec_experts(*L.up_exps, F, grouped, takes_q8(*L.up_exps) ? act_xs_ : ActQ8{}, xs_, up_, F, stream);
  }
  const bool q8_down = takes_q8(*L.down_exps) && !mma_down;
  swiglu(gate_, up_, pairs, F, gate_, q8_down ? act_h_ : ActQ8{}, stream);
  if (mma_down) mma_experts(*L.down_exps, H, tiles, gate_, frag_, y_, H, stream);
  else matvec_experts(*L.down_exps, H, grouped, q8_down ? act_h_ : ActQ8{}, gate_, y_, H, stream);
  launch(moe_combine_kernel, dim3((unsigned)((H + 255) / 256), (unsigned)n), dim3(256), 0, stream, pdl_enabled(),
         (const float*)y_, (const int32_t*)slot_of_pair_, (const float*)weights_, k, H, x);
  forward_shared_quantized(L, xn, xn_act, n, x, stream);
}

// A step of a few tokens: each (token, expert) pair is its own row (no sort, no gather; an expert two
// tokens share is read twice, from the L2 the second time).
bool MoeFfn::forward_pairs(const MoeLayerDev& L, const ActQ8& xn_act, int n, float* x, cudaStream_t stream, const float* shared_xn) {
  const int H = hp_.n_embd, k = hp_.n_expert_used, F = hp_.n_ff_exp, pairs = n * k;
  ExpertGroups direct{};
  direct.pair_ids = ids_;
  direct.max_active = pairs;
  direct.input_div = k;
  const bool q8_down = takes_q8(*L.down_exps);
  if (q8_down && !xn_act.row_factor && moe_gate_up_swiglu_fits(*L.gate_exps, *L.up_exps, F)) {
    moe_gate_up_swiglu(*L.gate_exps, *L.up_exps, F, xn_act, ids_, pairs, k, act_h_, stream);
  } else {
    matvec_experts_pair(*L.gate_exps, *L.up_exps, F, direct, xn_act, nullptr, gate_, up_, F, stream);
    swiglu(gate_, up_, pairs, F, gate_, q8_down ? act_h_ : ActQ8{}, stream);
  }
  if (q8_down && moe_down_combine_fits(*L.down_exps)) {
    if (shared_xn && moe_down_combine_takes_shared(*L.down_exps, *L.down_shexp, k)) {
      const MoeSharedDown shared{L.down_shexp, act_sh_, L.shexp_gate, shared_xn};
      moe_down_combine(*L.down_exps, H, act_h_, ids_, weights_, n, k, x, stream, &shared);
      return true;
    }
    moe_down_combine(*L.down_exps, H, act_h_, ids_, weights_, n, k, x, stream);
    return false;
  }
  direct.input_div = 1;
  matvec_experts(*L.down_exps, H, direct, q8_down ? act_h_ : ActQ8{}, gate_, y_, H, stream);
  launch(moe_combine_kernel, dim3((unsigned)((H + 255) / 256), (unsigned)n), dim3(256), 0, stream, pdl_enabled(),
         (const float*)y_, (const int32_t*)nullptr, (const float*)weights_, k, H, x);
  return false;
}

ActQ8 MoeFfn::input_act() const { return hp_.n_embd % 32 == 0 ? act_xn_ : ActQ8{}; }

void MoeFfn::add_host_rows(const float* host_rows, int n, float* x, cudaStream_t stream) {
  if (n == 0) return;
  ROOFLINE_CHECK(n <= max_rows_, "internal error: {} rows exceed the MoE buffers ({})", n, max_rows_);
  const int64_t count = (int64_t)n * hp_.n_embd;
  ROOFLINE_CUDA_CHECK(cudaMemcpyAsync(y_, host_rows, (size_t)count * 4, cudaMemcpyHostToDevice, stream));
  launch(moe_add_kernel, dim3((unsigned)((count + 255) / 256)), dim3(256), 0, stream, pdl_enabled(), (const float*)y_, count, x);
}

void MoeFfn::forward_on_host(const MoeLayerDev& layer, HostExperts& experts, int il, const float* xn, int n, float* x, float* host_rows,
                             cudaStream_t stream) {
  const size_t row = (size_t)hp_.n_embd;
  float* host_out = host_rows + (size_t)max_rows_ * row;
  ROOFLINE_CUDA_CHECK(cudaMemcpyAsync(host_rows, xn, (size_t)n * row * 4, cudaMemcpyDeviceToHost, stream));
  ROOFLINE_CUDA_CHECK(cudaStreamSynchronize(stream));
  experts.forward(il, host_rows, n, host_out);
  add_host_rows(host_out, n, x, stream);
  forward_shared(layer, xn, n, x, stream);
}

void MoeFfn::forward_shared(const MoeLayerDev& L, const float* xn, int n, float* x, cudaStream_t stream) {
  if (n == 0 || hp_.n_ff_shexp == 0 || !L.gate_shexp) return;
  forward_shared_quantized(L, xn, input_act(), n, x, stream);
}

void MoeFfn::forward_shared_quantized(const MoeLayerDev& L, const float* xn, const ActQ8& xn_act, int n, float* x, cudaStream_t stream) {
  if (n == 0 || hp_.n_ff_shexp == 0 || !L.gate_shexp) return;
  shared_swiglu(L, xn, xn_act, n, folds_shared(L, xn_act, n), stream);
  shared_down_add(L, xn, n, x, stream);
}

// The shared expert folded into the routed experts' fused launches (ROOFLINE_MOE_SHARED_FUSED=1), for steps of up to
// kDirectPairRows tokens: its gate, up and SwiGLU through moe_gate_up_swiglu as expert 0 of its own tensors (each token
// its own pair), and its down and gated add in the routed down + combine launch (moe_down_combine_takes_shared). The
// same row functions, SwiGLU and gate arithmetic as its four separate launches, so the same bits: two launches a
// layer instead of four (plus the routed two). Written in the twenty-eighth session after its device time was spent:
// not yet run on a GPU, hence off.
bool MoeFfn::folds_shared(const MoeLayerDev& L, const ActQ8& xn_act, int n) const {
  static const bool on = env_switch("ROOFLINE_MOE_SHARED_FUSED", false);
  if (!on || n > kDirectPairRows || hp_.n_ff_shexp == 0 || !L.gate_shexp || !takes_q8(*L.gate_shexp) || !takes_q8(*L.down_shexp)) return false;
  return xn_act.q && !xn_act.row_factor && moe_gate_up_swiglu_fits(*L.gate_shexp, *L.up_shexp, hp_.n_ff_shexp);
}

void MoeFfn::shared_swiglu(const MoeLayerDev& L, const float* xn, const ActQ8& xn_act, int n, bool fused, cudaStream_t stream) {
  const int S = hp_.n_ff_shexp;
  if (fused) return moe_gate_up_swiglu(*L.gate_shexp, *L.up_shexp, S, xn_act, shexp_ids_, n, 1, act_sh_, stream);
  ExpertGroups all{};
  all.single_count = n;
  all.chunk_splits = chunk_splits_for(n);
  const ActQ8 in = takes_q8(*L.gate_shexp) ? xn_act : ActQ8{};
  if (matvec_can_group(*L.gate_shexp, *L.up_shexp)) {
    matvec_experts_pair(*L.gate_shexp, *L.up_shexp, S, all, in, xn, shexp_gate_, shexp_up_, S, stream);
  } else {
    matvec_experts(*L.gate_shexp, S, all, in, xn, shexp_gate_, S, stream);
    matvec_experts(*L.up_shexp, S, all, takes_q8(*L.up_shexp) ? xn_act : ActQ8{}, xn, shexp_up_, S, stream);
  }
  swiglu(shexp_gate_, shexp_up_, n, S, shexp_gate_, takes_q8(*L.down_shexp) ? act_sh_ : ActQ8{}, stream);
}

void MoeFfn::shared_down_add(const MoeLayerDev& L, const float* xn, int n, float* x, cudaStream_t stream) {
  const int H = hp_.n_embd;
  ExpertGroups all{};
  all.single_count = n;
  all.chunk_splits = chunk_splits_for(n);
  matvec_experts(*L.down_shexp, H, all, takes_q8(*L.down_shexp) ? act_sh_ : ActQ8{}, shexp_gate_, shexp_y_, H, stream);
  launch(moe_shared_add_kernel, dim3((unsigned)n), dim3(256), 0, stream, pdl_enabled(), L.shexp_gate, xn,
         (const float*)shexp_y_, H, x);
}

}  // namespace roofline::cuda
