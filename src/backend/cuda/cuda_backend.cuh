// The CUDA backend's class: weights uploaded once (repacked where the kernels want it), the KV blocks of its
// layers in device memory, per-step values in a device step descriptor uploaded once per step (pack_step,
// cuda_step_pack.cuh). Its lifecycle (load, KV and state memory, steps, logits, graphs) is in cuda_backend.cu,
// a layer's forward (norm+quantize -> Q/K/V -> rope+store -> attention -> O (+residual) -> norm+quantize ->
// gate/up -> SwiGLU+quantize -> down (+residual), and the Gated DeltaNet mixer) in cuda_backend_layers.cu.
// Decode steps (<= 8 rows) use the matvec kernels, larger steps the GEMMs. Included by those two files only.
#pragma once

#include <cublas_v2.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>

#include "backend/cuda/cuda_argmax_masks.cuh"
#include "backend/cuda/cuda_backend_sizes.cuh"
#include "backend/cuda/cuda_batched_products.cuh"
#include "backend/cuda/cuda_delta_net.cuh"
#include "backend/cuda/cuda_dequant_ahead.cuh"
#include "backend/cuda/cuda_f16_copies.cuh"
#include "backend/cuda/cuda_graph_cache.cuh"
#include "backend/cuda/cuda_kernels.cuh"
#include "backend/cuda/cuda_moe.cuh"
#include "backend/cuda/cuda_product_inputs.cuh"
#include "backend/cuda/cuda_rope_tables.cuh"
#include "backend/cuda/cuda_step_pack.cuh"
#include "backend/cuda/cuda_step_profiler.cuh"
#include "backend/cuda/step_layout.h"
#include "backend/cpu/host_experts.h"
#include "backend/cuda/cuda_weights.cuh"
#include "backend/cuda/cuda_window_snapshots.cuh"
#include "backend/gpu.h"
#include "core/log.h"
#include "formats/quant_ref.h"

namespace roofline::cuda {

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const GpuBackendOptions& options);
  ~CudaBackend() override;

  std::string name() const override { return fmt::format("CUDA{}", options_.device); }

  uint64_t weight_bytes(const Model& model, const LayerSet& layers) const override;

  uint64_t kv_block_bytes(const Model& model, const LayerSet& layers, const KvConfig& kv) const override;
  uint64_t swa_cell_bytes(const Model& model, const LayerSet& layers, const KvConfig& kv) const override;
  uint64_t swa_snapshot_bytes(const Model& model, const LayerSet& layers, const KvConfig& kv) const override;
  uint64_t state_cell_bytes(const Model& model, const LayerSet& layers) const override;

  void load(std::shared_ptr<const Model> model, const LayerSet& layers) override;

  void init_kv(const KvConfig& kv) override;

  void init_state(int n_cells) override;

  void begin_step(const StepDesc& step) override;

  void embed() override;
  void set_hidden(const float* hidden) override;
  void get_hidden(float* hidden) override;

  void forward(int layer_begin, int layer_end) override;

  // Final norm and output matrix into logits_ (device); false when no row wants logits.
  bool compute_logits();

  void output(float* logits) override;

  // Greedy rows get their argmax picked here (only the token comes back); the other rows' logits are
  // copied back packed in row order.
  bool supports_output_argmax() const override { return true; }
  void output_argmax(float* logits, int32_t* tokens) override;
  bool keeps_host_logits() const override { return logits_host_ != nullptr && pinned_logits_on(); }
  const float* host_logits() const override { return logits_host_; }

  // Embeddings: the output norm of the step's hidden rows (gathered), copied back; no output matrix.
  void output_hidden(float* hidden) override;

  void copy_kv_block(int src, int dst) override;

  void copy_state(int src, int dst) override;

  // The sliding layers' ring planes (K and V values and scales), block by block.
  std::vector<WindowSnapshots::Plane> ring_planes() const;

  void init_snapshots(int n) override;
  std::string keep_f16_copies() override;  // of the layers' matrices, not the stacked experts (their own kernels)
  void save_window(int cell, int first, int n, int snapshot) override { window_snapshots_.save(stream_, cell, first, n, snapshot); }
  void load_window(int snapshot, int cell, int first, int n) override { window_snapshots_.load(stream_, snapshot, cell, first, n); }

  bool supports_partial_sum() const override { return true; }
  void set_partial_sum(PartialSum hook) override;
  void finish_step() override;
  void set_matmul_observer(MatmulObserver observer) override;
  std::vector<int> decode_graph_depths(int max_keys) const override;
  std::vector<int> decode_graph_rows() const override;
  size_t captured_graphs() const override { return graphs_.size(); }

 private:
  // A layer on the device: its matrices (uploaded in the kernels' layout) and f32 vectors by role.
  struct LayerDev {
    MixerKind mixer = MixerKind::Attention;
    std::array<DeviceWeight, kLayerTensorCount> mats{};
    std::array<size_t, kLayerTensorCount> mat_bytes{};  // bytes in the file (what a product reads)
    std::array<float*, kLayerTensorCount> vecs{};
    KvLayer kv;
    float* state = nullptr;  // DeltaNet layers: n_cells x state_floats
    int il = 0;              // the model's layer index (per-layer RoPE base on sliding-window layers)
    bool ring = false;       // a sliding layer kept in rings per state cell (KvConfig::swa_ring), not paged
    const DeviceWeight& m(LayerTensor t) const { return mats[(size_t)t]; }
    double bytes(LayerTensor t) const { return (double)mat_bytes[(size_t)t]; }
    float* v(LayerTensor t) const { return vecs[(size_t)t]; }
  };

  // MoE hook: whether a layer's tensor stays in host memory (its stacked experts, --cpu-moe and the like).
  bool expert_on_host(int il, LayerTensor role) const;

  int table_capacity_blocks() const;
  StepLayout step_layout() const;
  size_t step_capacity_ints() const { return (size_t)step_layout().capacity; }

  // Profiling (ROOFLINE_PROFILE=1, CUDA graphs off; cuda_step_profiler.cuh): an event before each op.
  void mark(const char* op, double bytes) { profiler_.mark(stream_, op, bytes, n_tok_); }
  static std::string op_name(const char* what, const DeviceWeight& w) { return fmt::format("{} {}", what, dtype_name(w.type)); }

  // Decode epilogues (ProductInputs): whether a product of this step can write the normed input of
  // `consumers` (each reads int8 activations of the n_embd columns; nulls are skipped).
  using Consumers = std::array<const DeviceWeight*, 4>;
  bool fuses_input(const Consumers& consumers) const;
  Consumers ffn_inputs(const LayerDev& L) const { return {&L.m(LayerTensor::FfnGate), &L.m(LayerTensor::FfnUp), nullptr, nullptr}; }
  Consumers mixer_inputs(const LayerDev& L) const;
  // The layer after L when this forward() runs it too (a layer may prepare only such a layer's input).
  LayerDev* next_layer_here(LayerDev& L);
  void take_input(const MatvecEpilogue& ep, int cols);

  // The int8 form of x for a decode matvec over w, unless the current input already holds it.
  void quantize_input(const DeviceWeight& w, const float* x, int n);

  // y (+)= W x for the step's rows: matvec for decode-sized steps, GEMM beyond. With an epilogue (decode
  // only), its output is the next product's input (`next_cols` wide) after the launch.
  // x_ready: x_f16_ already holds x; x16: x as f16 rows is there instead (prompt GEMMs only: gemm_takes_f16).
  void project(const DeviceWeight& w, const float* x, int n, float* y, int ldy, bool accumulate, const MatvecEpilogue& ep = {},
               int next_cols = -1, bool x_ready = false, __half* x16 = nullptr);

  // Whether a product of n rows goes through cuBLAS with its input converted to f16 rows in x_f16_ (so
  // products of one input convert it once, and SwiGLU can write down's input as f16 directly).
  // ROOFLINE_F16_INPUT_REUSE=0 converts for every product.
  static bool gemm_takes_f16(const DeviceWeight& w, int n);
  // A block's pre-norm, xn_ = rmsnorm(x_) * w (and its int8 form when q8) for the products of `consumers` (the first
  // decides the form); on prompt steps where the first takes an f16 input, x_f16_ too. Returns the columns x_f16_ then
  // holds (project_group's f16_cols), or -1.
  int64_t pre_norm(const char* what, const float* w, bool q8, const Consumers& consumers);

  // Products of one input (q/k/v, gate/up): for decode-sized steps, those matvec_can_join joins go out
  // as one launch; for batched decode (9-64 rows), those gemm_can_join joins; otherwise
  // one project() each. ROOFLINE_GEMM_JOIN=0 keeps the batched products apart.
  struct Product {
    const char* what;
    const DeviceWeight* w;
    double bytes;
    float* y;
    int ldy;
  };
  // f16_cols: x_f16_ holds x already, as rows of this many values (a prompt norm wrote it).
  void project_group(std::initializer_list<Product> products, const float* x, int n, int64_t f16_cols = -1);

  // Batched steps (9-64 rows) on Hopper: the kernel that computes a product's input (the pre-norm, the gated FFN
  // step) writes it as the warpgroup kernel's activation tiles in x_f16_ too, so the product converts nothing
  // (ROOFLINE_PRODUCER_TILES, on by default). producer_tiles: the tiles for the products of `first`, or {} where
  // off or where that product takes another kernel, in Q6_K's layout too where a member of `joined` of that kind
  // joins `first`'s launch; tiles_written: they hold x, for the next product of x (of `first`'s type and width);
  // take_ready_tiles: whether they hold x for w (and need_q6: in both layouts); every product takes or drops them.
  WgTiles producer_tiles(const DeviceWeight& first, const Consumers& joined) const;
  void tiles_written(const float* x, const DeviceWeight& first, bool with_q6 = false);
  bool take_ready_tiles(const DeviceWeight& w, const float* x, bool need_q6 = false);

  // A layer: norm -> mixer (attention or Gated DeltaNet) -> residual, then the FFN block.
  void forward_layer(LayerDev& L);

  bool needs_q8(std::initializer_list<const DeviceWeight*> ws) const;

  void attention_block(LayerDev& L);

  // -sm row: tp_sum_ (this slice's part of a block's output) becomes the sum over the slices.
  void sum_partials();

  // x += rmsnorm(y) * w over the step's rows, through `tmp` ([rows x n_embd]). With next_norm, decode
  // steps also write xn_ = rmsnorm(x) * next_norm (and the int8 input when q8) in the same kernel; returns whether
  // it did (the caller then skips that norm).
  bool post_norm_add(const float* y, const float* w, float* tmp, const float* next_norm = nullptr, bool q8 = false);

  bool attn_takes_q8(LayerDev& L) const;
  bool ffn_takes_q8(LayerDev& L) const;

  // A one-row step's dense SwiGLU block as one persistent launch (cuda_decode_ffn.cu) where it fits.
  bool persistent_ffn(LayerDev& L);
  // Feed-forward block: norm -> gate/up -> SwiGLU -> down (+ residual).
  void ffn_block(LayerDev& L);

  // Gated DeltaNet: norm -> qkv/z/alpha/beta projections -> the mixer (cuda_delta_net.cuh; the
  // sequences' states in their cells) -> ssm_out (+ residual).
  void delta_net_block(LayerDev& L);

  GpuBackendOptions options_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  std::shared_ptr<const Model> model_;
  LayerSet layers_;
  KvConfig kv_;
  DeviceArena weights_, work_, kv_arena_, state_arena_, f16_copies_;
  int n_state_cells_ = 0;
  WindowSnapshots window_snapshots_;  // prompt-cache snapshots of the rings, in pinned host memory
  std::vector<LayerDev> layer_dev_;
  DeviceWeight embd_, out_;
  float* out_norm_ = nullptr;
  float* rope_factors_ = nullptr;
  float *x_ = nullptr, *xn_ = nullptr, *q_ = nullptr, *k_ = nullptr, *v_ = nullptr, *attn_ = nullptr, *gate_ = nullptr,
        *up_ = nullptr, *partial_ = nullptr, *logits_ = nullptr;
  float* tp_sum_ = nullptr;  // -sm row: a block's partial output, summed over the slices by partial_sum_
  PartialSum partial_sum_;
  float *q_full_ = nullptr, *attn_gate_ = nullptr;  // gated attention: the Q projection, the gate split from it
  // DeltaNet layers: in-projections, the mixer's output and scratch, the step's sequence records.
  float *dn_qkv_ = nullptr, *dn_z_ = nullptr, *dn_alpha_ = nullptr, *dn_beta_ = nullptr, *dn_out_ = nullptr;
  DeltaNetScratch dn_scratch_;
  DeltaNetSeqs dn_seqs_;
  bool dn_chunked_ = false;
  DeltaNetForm dn_form_ = DeltaNetForm::Recurrent;
  int dn_max_seq_rows_ = 1, dn_real_seqs_ = 0;
  int64_t cell_stride_ = 0;  // floats between state cells (16-byte aligned)
  // Runs of at least this many rows of one sequence take the chunked (tensor-core) form.
  static constexpr int kDeltaNetChunkedMinRows = 64;
  ProductInputs inputs_;        // the int8 inputs of the products (two buffers: decode epilogues)
  int n_quantized_cols_ = -1;  // inputs_.current() holds the current input quantized (row length), or -1
  __half* gemm_scratch_ = nullptr;
  __half* x_f16_ = nullptr;
  // Prompt norms and prompt attention write the next products' f16 inputs themselves (instead of an f32
  // output that gemm converts); ROOFLINE_F16_OUTPUTS=0, read when the backend is created, converts.
  const bool f16_outputs_ = env_switch("ROOFLINE_F16_OUTPUTS", true);
  const float* ready_tiles_x_ = nullptr;  // x_f16_ holds this input's tiles (tiles_written), for products of:
  DType ready_tiles_type_ = DType::F32;
  int64_t ready_tiles_cols_ = 0;
  bool ready_tiles_q6_ = false;  // ... and in Q6_K's layout after them (wg_q6_tiles), for a joined launch of both kinds
  size_t gemm_scratch_elems_ = 0;
  int* step_dev_ = nullptr;
  int* step_host_ = nullptr;
  float* logits_host_ = nullptr;
  int32_t* argmax_dev_ = nullptr;   // per logit row: its greedy token (output_argmax)
  int32_t* argmax_host_ = nullptr;
  ArgmaxScratch argmax_scratch_;  // the argmax kernel's chunk results and counters
  std::vector<uint8_t> argmax_only_;  // the step's per-logit-row flags
  std::vector<const uint64_t*> argmax_allowed_;  // and masks (constrained greedy rows; host memory)
  ArgmaxMasks argmax_masks_;                     // their device copy
  std::vector<int32_t> hidden_rows_;  // the step's rows wanting their final hidden state (output_hidden)
  int* hidden_rows_dev_ = nullptr;    // their device copy (allocated on first use)
  DeviceStep dstep_;
  DeviceStep dstep_swa_;  // dstep_ with the swa tables as block tables (ring layers)
  int n_tok_ = 0, n_real_ = 0, n_logit_ = 0, max_splits_ = 1, splits_ = 1, grid_splits_ = 1;
  AttentionSpans spans_;  // decode attention's span rule (attention_spans)
  // Prefill attention: runs of this step, the other rows (device list) and their count.
  bool prefill_ok_ = false;
  cuda::PrefillScratch prefill_;
  std::vector<cuda::PrefillRun> prefill_runs_;
  const int* attn_rows_dev_ = nullptr;
  bool ffn_input_ready_ = false;   // xn_ (and the int8 input) already hold the FFN's normalized input (post_norm_add)
  bool attn_input_ready_ = false;  // ... the next attention block's (post_norm_add at the end of a gemma layer)
  int forward_end_ = 0;            // the layer range's end of the running forward()
  int n_attn_rows_ = 0;
  bool split_combine_ = false;         // decode attention merges its splits in the split kernel
  bool split_heads_ = false;           // the step's attention splits query-head groups (AttentionPlan::split_heads)
  int* combine_counters_ = nullptr;    // ... with these counters (attention())
  unsigned long long* ffn_sync_ = nullptr;  // persistent_ffn's barrier counter, and its CTAs (0: not on this GPU)
  const int ffn_ctas_ = cuda::decode_ffn_ctas(options_.device);
  bool graphs_enabled_ = true;
  // Batched decode steps (9-64 rows, every row a decode row) are captured and replayed as graphs too, where nothing
  // in them leaves the device or depends on more than the bucket (no MoE, no -sm row; one row per sequence in
  // DeltaNet layers, whose kernel form follows a sequence's rows). On since measured (-npl 16 / 64 +1-9%,
  // docs/performance.md); ROOFLINE_BATCHED_GRAPHS=0 launches them kernel by kernel.
  bool batched_graphs_ = true;
  // Batched decode steps run padded to 16, 32, 48 or 64 rows with a power-of-two attention grid (StepPackConfig::
  // batched_buckets), so that a few graphs a depth serve them and the serve warm-up can capture them all;
  // ROOFLINE_BATCHED_BUCKETS=0 runs them at their own row counts. Not with MoE (padded rows would route to experts)
  // or -sm row (not captured).
  bool batched_buckets_ = true;
  bool buckets_batched_steps() const { return batched_buckets_ && graphs_enabled_ && !moe_ && !partial_sum_; }
  static constexpr size_t kMaxGraphs = 256;  // graphs a backend keeps before batched steps stop capturing new ones
  bool batched_graph() const {
    return batched_graphs_ && n_tok_ <= 64 && prefill_runs_.empty() && !moe_ && !partial_sum_ && dn_max_seq_rows_ <= 1;
  }
  int ahead_slots_ = 0;
  RopeTables rope_tables_;  // prompt steps' rotations
  std::unique_ptr<DequantAhead> ahead_;  // ROOFLINE_DEQUANT_AHEAD
  static constexpr size_t kCublasWorkspaceBytes = (size_t)32 << 20;
  void* cublas_workspace_ = nullptr;
  StepProfiler profiler_;
  StepGaps gaps_;  // ROOFLINE_STEP_GAPS
  size_t out_bytes_ = 0;
  GraphCache graphs_;  // decode graphs (destroyed after ~CudaBackend's body, which makes this device current)
  std::unique_ptr<MoeFfn> moe_;  // MoE hook: mixture-of-experts models only
  std::unique_ptr<HostExperts> host_experts_;  // MoE hook: experts kept in host memory, run on the CPU
  float* host_rows_ = nullptr;                 // pinned: the normed rows out, the experts' output back
};

}  // namespace roofline::cuda
