// Mixture-of-experts FFN on the GPU (qwen3moe, qwen35moe): device routing (softmax over the router's
// logits, top-k with the lower index first on ties, renormalised weights) and the products of each row's
// chosen experts read straight from the stacked expert tensors by expert id, so the whole block stays on
// the device (no host round trip: decode steps keep their CUDA graphs). The step's (token, expert) pairs
// are sorted by expert on the device and each expert's rows go through the dense matvec kernels
// (matvec_experts: int8 activations and dp4a for the quantized types), so an expert's weights are read
// once per 8 of its rows, not once per token.
#pragma once

#include <cstdint>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_weights.cuh"
#include "model/hparams.h"

namespace roofline {
class HostExperts;
}

namespace roofline::cuda {

// A layer's MoE weights on the device.
struct MoeLayerDev {
  const DeviceWeight* router = nullptr;                                         // [n_embd] -> n_expert
  const DeviceWeight *gate_exps = nullptr, *up_exps = nullptr, *down_exps = nullptr;  // stacked over experts
  const DeviceWeight *gate_shexp = nullptr, *up_shexp = nullptr, *down_shexp = nullptr;  // the shared expert, or null
  const float* shexp_gate = nullptr;                                            // [n_embd]
};

// The step's (token, expert) pairs (ids: [n_pairs] expert ids, pair p = token p / k) grouped by expert on
// the device: offsets[e], offsets[e + 1] bound expert e's rows; active[0, max_active): the experts with
// rows in expert order, then -1; row_token[j]: grouped row j's token; slot_of_pair[p]: pair p's row.
// With `tiles`, also the token tiles of the tensor-core products (cuda_kernels.cuh, ExpertTiles): each
// expert's rows cut into tiles of tile_rows.
struct ExpertTileBuffers {
  int tile_rows = 0;
  int32_t *expert = nullptr, *row0 = nullptr, *rows = nullptr, *n_tiles = nullptr;
};
void group_pairs_by_expert(const int32_t* ids, int n_pairs, int k, int n_expert, int max_active, int32_t* offsets, int32_t* active,
                           int32_t* row_token, int32_t* slot_of_pair, const ExpertTileBuffers* tiles, cudaStream_t stream);
// ids[t * k, +k) and weights[t * k, +k) of each row t < n_rows of logits [n_rows x n_expert]: softmax,
// top-k (the lower index first on ties), weights renormalised over the k (normalize), times scale.
void route_rows(const float* logits, int n_rows, int n_expert, int k, bool normalize, float scale, int32_t* ids, float* weights,
                cudaStream_t stream);
// n8 tiles per token tile for n_pairs pairs over n_expert experts (rows per active expert on average:
// up to 16 -> 2, 32 -> 4, 48 -> 6, else 8), and the most token tiles the sort can write with it.
int expert_tile_nt(int n_pairs, int n_expert);
int expert_max_tiles(int n_pairs, int n_expert, int nt);
// Whether the MoE block runs an expert product of n_rows tokens on tensor cores: prompts (more than 64
// rows, so decode batches keep the int8 kernels and their batch invariance) of Q4_K / Q6_K weights.
bool moe_uses_mma(const DeviceWeight& w, int64_t rows_per_expert, int n_rows);
// out[j] = x[row_token[j]] for j < n_rows (rows of n floats).
void gather_rows(const float* x, const int32_t* row_token, int n_rows, int n, float* out, cudaStream_t stream);

// Decode steps' MoE launches (cuda_moe_decode.cu), each giving the bits of the separate kernels it
// replaces. moe_router: logits[t * n_expert + e] = router[e] . xn[t] for an f32 router and up to
// kMoeRouterMaxRows rows; with a tail (ids set; at most moe_route_tail_rows() rows) the last CTA to
// finish also routes every row into ids and weights (counter: a device int that starts at 0 and is left
// at 0). ROOFLINE_MOE_FUSED_ROUTER=0 keeps the router in the expert matvec and the route kernel.
constexpr int kMoeRouterMaxRows = 64;
struct MoeRouteTail {
  int k = 0;
  bool normalize = false;
  float scale = 1.0f;
  int32_t* ids = nullptr;
  float* weights = nullptr;
  int* counter = nullptr;
};
// With `norm`, the router kernel also computes the block's rms norm from the residual x (xn = out, its int8 form in
// act), with rms_norm's bits for steps of up to kMoeRouterNormRows rows (the decode norm, rms_norm_wide_kernel), so
// the norm's own launch goes (moe_router_norms says where; ROOFLINE_MOE_ROUTER_NORM=0 keeps it).
constexpr int kMoeRouterNormRows = 8;
struct MoeRouterNorm {
  const float* x = nullptr;  // [n_rows x cols] the residual rows
  const float* w = nullptr;  // [cols] the norm's weight
  float eps = 0.0f;
  float* out = nullptr;  // xn, [n_rows x cols]
  ActQ8 act{};           // xn's int8 rows, or empty
};
bool moe_router_fits(const DeviceWeight& router, int n_rows);
bool moe_router_norms(const DeviceWeight& router, int n_rows);
int moe_route_tail_rows();
void moe_router(const DeviceWeight& router, int n_expert, const float* xn, int n_rows, float* logits, const MoeRouteTail& tail,
                cudaStream_t stream, const MoeRouterNorm* norm = nullptr);
// x[t] += sum_s weights[t * k + s] * down_{ids[t * k + s]} h[t * k + s] for t < n_rows: the experts' down
// products and their weighted sum in one launch (int8 rows h in act; Q4_K, Q6_K or Q8_0 down tensors).
// ROOFLINE_MOE_DOWN_COMBINE=0 keeps the down product and the combine kernel apart.
// With `shared`, the layer's shared expert too, after the routed sum: x[t] += sigmoid(gate . xn[t]) * down h_shared[t], the
// arithmetic of moe_shared_add_kernel (cuda_moe.cu) and the down product's row functions (ROOFLINE_MOE_SHARED_FUSED=1; where
// moe_down_combine_takes_shared says: the shared down of the routed one's kind, k + 1 warps a CTA, rows of 256 floats x 8 at most).
struct MoeSharedDown {
  const DeviceWeight* down = nullptr;  // [n_embd rows x n_ff_shexp]
  ActQ8 act{};                         // its int8 SwiGLU rows [n_rows x n_ff_shexp]
  const float* gate = nullptr;         // [n_embd]
  const float* xn = nullptr;           // the block's normed rows [n_rows x n_embd]
};
bool moe_down_combine_fits(const DeviceWeight& down);
// Q4_K experts of 1-4 super-blocks a row take the eight-row kernel (ROOFLINE_MOE_DOWN_SHORT=0: not): 1 or 0 here for
// tests (gpu_moe_down_combine_for_test), -1 the environment's.
extern int moe_down_short_for_test;
bool moe_down_combine_takes_shared(const DeviceWeight& down, const DeviceWeight& shared_down, int k);
void moe_down_combine(const DeviceWeight& down, int64_t rows_per_expert, const ActQ8& act, const int32_t* ids, const float* weights, int n_rows,
                      int k, float* x, cudaStream_t stream, const MoeSharedDown* shared = nullptr);
// h[p] = int8(silu(gate_{ids[p]} x[p / k]) * (up_{ids[p]} x[p / k])) for pairs p < n_pairs, the products
// and the SwiGLU in one launch (int8 rows x in xn; gate and up of one kind among Q4_K, Q6_K, Q8_0; rows
// per expert a multiple of 32). ROOFLINE_MOE_GATE_UP_SWIGLU=0 keeps the SwiGLU kernel apart.
bool moe_gate_up_swiglu_fits(const DeviceWeight& gate, const DeviceWeight& up, int64_t rows_per_expert);
void moe_gate_up_swiglu(const DeviceWeight& gate, const DeviceWeight& up, int64_t rows_per_expert, const ActQ8& xn, const int32_t* ids, int n_pairs,
                        int k, const ActQ8& h, cudaStream_t stream);

// Work buffers for up to max_rows rows, and the block's launches.
class MoeFfn {
 public:
  // Throws a one-line Error for shapes the kernels do not take (rows not multiples of 32, k > 32).
  MoeFfn(const HParams& hp, int max_rows, cudaStream_t stream);

  // Where forward and forward_shared read xn's int8 rows: the norm before the block writes them there
  // (empty when n_embd is not a multiple of 32; the products then take xn's floats).
  ActQ8 input_act() const;
  // x[r] += FFN(xn[r]) for r < n_rows: the routed experts weighted by their routing weights, plus the
  // shared expert times sigmoid(shexp_gate . xn[r]) where the layer has one. xn = rmsnorm(x) * norm_w is
  // written first (with its int8 rows, input_act): by the router kernel where moe_router_norms allows, else
  // by the norm kernel.
  void forward(const MoeLayerDev& layer, const float* norm_w, float eps, float* xn, int n_rows, float* x, cudaStream_t stream);
  // The shared expert alone (x[r] += sigmoid(gate . xn[r]) * shared(xn[r])), for layers whose routed
  // experts run elsewhere; nothing for a layer without one.
  void forward_shared(const MoeLayerDev& layer, const float* xn, int n_rows, float* x, cudaStream_t stream);
  // x[r] += rows[r] for host rows [n_rows x n_embd] (the routed experts' output computed on the CPU).
  void add_host_rows(const float* rows, int n_rows, float* x, cudaStream_t stream);
  // Layer il's routed experts on the CPU (xn through host_rows, [2 x max_rows x n_embd] of pinned memory;
  // the stream is synchronized), then the shared expert here.
  void forward_on_host(const MoeLayerDev& layer, HostExperts& experts, int il, const float* xn, int n_rows, float* x, float* host_rows,
                       cudaStream_t stream);

  // The last forward's routing ([n_rows x n_expert_used] ids and weights, device pointers).
  const int32_t* ids() const { return ids_; }
  const float* weights() const { return weights_; }

 private:
  // The routed experts of a step of a few tokens, pair by pair (xn_act: xn's int8 rows if already made).
  // With shared_xn (the block's normed rows, the shared expert's SwiGLU already in act_sh_), the shared expert's down
  // and gated add are folded into the down + combine launch where it takes them; returns whether they were.
  bool forward_pairs(const MoeLayerDev& layer, const ActQ8& xn_act, int n_rows, float* x, cudaStream_t stream, const float* shared_xn = nullptr);
  // The shared expert with xn's int8 rows already made (xn_act; empty where its type takes floats): its SwiGLU
  // (shared_swiglu: into act_sh_ where its down takes int8 rows, else shexp_gate_; fused: through moe_gate_up_swiglu, as
  // folds_shared allows), then its down and gated add.
  void forward_shared_quantized(const MoeLayerDev& layer, const float* xn, const ActQ8& xn_act, int n_rows, float* x,
                                cudaStream_t stream);
  void shared_swiglu(const MoeLayerDev& layer, const float* xn, const ActQ8& xn_act, int n_rows, bool fused, cudaStream_t stream);
  void shared_down_add(const MoeLayerDev& layer, const float* xn, int n_rows, float* x, cudaStream_t stream);
  // Whether a step of n_rows folds the shared expert into the routed down + combine launch (ROOFLINE_MOE_SHARED_FUSED=1).
  bool folds_shared(const MoeLayerDev& layer, const ActQ8& xn_act, int n_rows) const;

  HParams hp_;
  int max_rows_ = 0;
  DeviceArena arena_;
  float *logits_ = nullptr, *weights_ = nullptr, *gate_ = nullptr, *up_ = nullptr, *y_ = nullptr, *xs_ = nullptr;
  float *shexp_gate_ = nullptr, *shexp_up_ = nullptr, *shexp_y_ = nullptr;
  int32_t* shexp_ids_ = nullptr;  // zeros: the shared expert as expert 0 of its own tensors, for the fused gate/up kernel
  int32_t* ids_ = nullptr;
  int* route_counter_ = nullptr;  // the fused router's count of finished CTAs (MoeRouteTail)
  // The pairs grouped by expert (moe_sort_kernel): offsets per expert, active experts, each grouped row's
  // token, each pair's grouped row.
  int32_t *offsets_ = nullptr, *active_ = nullptr, *row_token_ = nullptr, *slot_of_pair_ = nullptr;
  // Token tiles of the tensor-core products and their activation fragments.
  int max_tiles_ = 0;
  size_t frag_halves_ = 0;
  int32_t *tile_expert_ = nullptr, *tile_row0_ = nullptr, *tile_rows_ = nullptr, *n_tiles_ = nullptr;
  __half* frag_ = nullptr;
  ActQ8 act_xs_{}, act_h_{}, act_xn_{}, act_sh_{};  // int8 rows: grouped inputs, grouped SwiGLU, xn, shared SwiGLU
};

}  // namespace roofline::cuda
