// -sm row (tensor parallelism): one Backend made of several, each running a slice of every layer
// (Model::tensor_slice: some KV heads with their query heads, some FFN features) on its own device. A
// rank's attention output and down products are partial sums; a PartialSumReducer adds them up over the
// ranks twice per layer (Backend::set_partial_sum), so every rank's residual stream stays the whole one.
// Each rank runs in its own thread, so the ranks' steps overlap; rank 0 also holds the output layer and
// gives the logits. The engine places it like one backend holding a range of layers (engine.cpp).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/partial_sum.h"
#include "engine/tensor_split.h"

namespace roofline {

// For ranks that hand over host memory (CPU backends), one thread each: the ranks meet, each adds the
// partials in rank order (the same bits on every rank) and they meet again before writing the sum.
std::unique_ptr<PartialSumReducer> make_host_reducer(int n_ranks);

class TensorParallelBackend final : public Backend {
 public:
  // ranks[i] runs slices[i]; both lists in rank order. Sets every rank's partial-sum hook.
  TensorParallelBackend(std::vector<std::unique_ptr<Backend>> ranks, std::vector<std::shared_ptr<const Model>> slices,
                        std::unique_ptr<PartialSumReducer> reducer);
  ~TensorParallelBackend() override;

  std::string name() const override;
  int n_ranks() const { return (int)ranks_.size(); }
  Backend& rank(int i) { return *ranks_[(size_t)i]; }

  // The memory queries answer for every rank together (each rank for its own slice; only rank 0 holds
  // the output layer); `model` is the model being split.
  uint64_t weight_bytes(const Model& model, const LayerSet& layers) const override;
  uint64_t kv_block_bytes(const Model& model, const LayerSet& layers, const KvConfig& kv) const override;
  uint64_t state_cell_bytes(const Model& model, const LayerSet& layers) const override;
  uint64_t swa_cell_bytes(const Model& model, const LayerSet& layers, const KvConfig& kv) const override;
  uint64_t swa_snapshot_bytes(const Model& model, const LayerSet& layers, const KvConfig& kv) const override;
  // Rank i's part of those: its slice over `layers` (the output layer only on rank 0).
  LayerSet rank_layers(int i, const LayerSet& layers) const;

  void load(std::shared_ptr<const Model> model, const LayerSet& layers) override;
  void init_kv(const KvConfig& kv) override;
  void init_state(int n_cells) override;
  void begin_step(const StepDesc& step) override;
  void embed() override;
  void set_hidden(const float* hidden) override;
  void get_hidden(float* hidden) override;
  void forward(int layer_begin, int layer_end) override;
  void finish_step() override;
  void output(float* logits) override;
  void output_hidden(float* hidden) override;
  bool supports_output_argmax() const override;
  void output_argmax(float* logits, int32_t* tokens) override;
  void set_matmul_observer(MatmulObserver observer) override;
  void copy_kv_block(int src, int dst) override;
  void copy_state(int src, int dst) override;
  void init_snapshots(int n) override;
  std::string keep_f16_copies() override;  // each rank its own slices' copies
  void save_window(int cell, int first_block, int n_blocks, int snapshot) override;
  void load_window(int snapshot, int cell, int first_block, int n_blocks) override;

 private:
  class Workers;
  // f(rank's backend, its slice, its part of `layers`) summed over the ranks.
  template <typename F>
  uint64_t sum_over_ranks(const LayerSet& layers, F&& f) const {
    uint64_t n = 0;
    for (size_t i = 0; i < ranks_.size(); ++i) n += f(*ranks_[i], *slices_[i], rank_layers((int)i, layers));
    return n;
  }
  // Runs f(rank, backend) on every rank's thread; returns at once (work of one rank stays in order).
  void post(std::function<void(int, Backend&)> f);
  // Waits until every rank has run what was posted; rethrows the first failure.
  void wait();
  // Runs rank 0's part (after what was posted), the other ranks' finish_step, and waits.
  void on_rank0(std::function<void(Backend&)> f);

  std::vector<std::unique_ptr<Backend>> ranks_;
  std::vector<std::shared_ptr<const Model>> slices_;
  std::unique_ptr<PartialSumReducer> reducer_;
  std::unique_ptr<Workers> workers_;
  size_t n_tokens_ = 0;  // rows of the step begun last
};

// The slices of `model` for -sm row over weights.size() ranks in proportion to `weights` (-ts): the
// shards of plan_tensor_split with the block sizes of the model's own output and down weights (the
// largest over its layers), and the sliced models.
struct ModelSplit {
  std::vector<TensorShard> shards;
  std::vector<std::shared_ptr<const Model>> slices;
};
ModelSplit split_model(const std::shared_ptr<const Model>& model, const std::vector<double>& weights);

}  // namespace roofline
