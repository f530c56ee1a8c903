// The CPU backend: reads weights in place from the model file's mapping (no copy), keeps its
// layers' KV blocks and recurrent-state cells in host memory, and runs layers with multithreaded
// kernels (matmul.h, cpu_ops.h, the DeltaNet mixer).
#pragma once

#include <array>
#include <initializer_list>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/cpu_step_profiler.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/moe_cpu.h"
#include "core/thread_pool.h"

namespace roofline::cpu {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int n_threads = 0);
  ~CpuBackend() override;

  std::string name() const override { return "CPU"; }
  uint64_t weight_bytes(const Model& model, const LayerSet& layers) const override;
  uint64_t kv_block_bytes(const Model& model, const LayerSet& layers, const KvConfig& kv) const override;
  uint64_t state_cell_bytes(const Model& model, const LayerSet& layers) const override;
  uint64_t swa_cell_bytes(const Model& model, const LayerSet& layers, const KvConfig& kv) const override;
  uint64_t swa_snapshot_bytes(const Model& model, const LayerSet& layers, const KvConfig& kv) const override;
  void load(std::shared_ptr<const Model> model, const LayerSet& layers) override;
  void init_kv(const KvConfig& kv) override;
  void init_state(int n_cells) override;
  void begin_step(const StepDesc& step) override;
  void embed() override;
  void set_hidden(const float* hidden) override;
  void get_hidden(float* hidden) override;
  void forward(int layer_begin, int layer_end) override;
  void output(float* logits) override;
  void output_hidden(float* hidden) override;
  void copy_kv_block(int src, int dst) override;
  void copy_state(int src, int dst) override;
  void init_snapshots(int n) override;
  void save_window(int cell, int first_block, int n_blocks, int snapshot) override;
  void load_window(int snapshot, int cell, int first_block, int n_blocks) override;
  void set_matmul_observer(MatmulObserver observer) override { observer_ = std::move(observer); }
  bool supports_partial_sum() const override { return true; }
  void set_partial_sum(PartialSum hook) override { partial_sum_ = std::move(hook); }

  int n_threads() const { return pool_.size(); }
  // Bytes of the weights repacked for the CPU's packed kernels (packed_weights.h), and how many matrices.
  uint64_t packed_bytes() const { return packed_.bytes(); }
  size_t packed_count() const { return packed_.count(); }
  // Bytes it holds for the KV cache, rings, window snapshots and recurrent states (what the bill counts).
  uint64_t kv_bytes_allocated() const;

 private:
  struct LayerData {
    std::array<std::vector<float>, kLayerTensorCount> floats;  // the tensors read as f32 (TensorUse::Floats)
    const std::vector<float>& operator[](LayerTensor t) const { return floats[(size_t)t]; }
    std::vector<uint8_t> k_cache, v_cache;  // attention layers: paged blocks, or rings per state cell (sliding layers)
    bool ring = false;                      // a sliding layer kept in rings (KvConfig::swa_ring)
    std::vector<uint8_t> k_snap, v_snap;    // its window snapshots: n x swa_snapshot_blocks blocks
    std::vector<float> state;               // DeltaNet layers: n_cells x state_floats
    ExpertViews experts;                    // MoE layers: each expert of the stacked tensors as a 2-D view
  };
  void pack(const Weight& w);
  void forward_layer(int il);
  void attention_block(int il, const LayerWeights& L, const LayerData& d);  // xn_ -> xn_ (the block's output)
  void delta_net_block(const LayerWeights& L, LayerData& d);               // xn_ -> xn_
  void dense_ffn_block(const LayerWeights& L);                               // xn_ -> xn_
  void moe_ffn_block(const LayerWeights& L, const LayerData& d);             // xn_ -> xn_
  void post_norm(const std::vector<float>& w);
  void sum_partials();  // -sm row: xn_ (a block's partial output) becomes the sum over the slices
  void add_residual();  // x_ += xn_  // xn_ = rms_norm(xn_) * w (gemma's post norms; none when w is empty)
  // op: the profile's name for the products.
  void products_of_one_input(const char* op, std::initializer_list<MatmulOut> outs, const float* x, int n, int64_t n_cols);
  void product(const char* op, const Weight& w, const float* x, float* y);  // y = w . x over the step's rows
  void observe(const Weight& w, const float* x, int n_rows) const {
    if (observer_) observer_(*w.tensor, x, n_rows, w.cols(), -1);
  }
  KvLayerView kv_view(int il);

  ThreadPool pool_;
  std::shared_ptr<const Model> model_;
  LayerSet layers_;
  KvConfig kv_;
  size_t k_row_bytes_ = 0, v_row_bytes_ = 0;
  std::vector<LayerData> layer_data_;  // indexed by il - layers_.begin
  std::vector<float> output_norm_, rope_factors_;

  StepDesc step_;
  RopeTable rope_, rope_swa_;  // rope_swa_: sliding-window layers' base and scale (gemma3)
  int n_state_cells_ = 0;
  int n_snapshots_ = 0;
  // Copies the blocks [first_block, first_block + n_blocks) of cell `cell`'s ring to or from snapshot `snapshot`.
  void copy_window(int cell, int first_block, int n_blocks, int snapshot, bool to_snapshot);
  // Work buffers, sized per step.
  std::vector<float> x_, xn_, q_, k_, v_, attn_, gate_, up_;
  std::vector<float> q_full_, attn_gate_;  // gated attention: the Q projection, and the gate split from it
  std::vector<float> dn_qkv_, dn_z_, dn_alpha_, dn_beta_, dn_out_;  // DeltaNet layers
  std::vector<float> moe_out_, shexp_gate_, shexp_up_;  // MoE layers
  MoeExperts moe_;
  ActRows act_;
  PackedWeights packed_;  // copies of the weights the packed kernels read (packed_weights.h)
  MatmulObserver observer_;
  PartialSum partial_sum_;
  CpuStepProfiler profiler_;  // ROOFLINE_PROFILE: per-op times (cpu_step_profiler.h)
};

}  // namespace roofline::cpu
