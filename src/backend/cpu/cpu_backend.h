// The CPU backend: reads weights in place from the model file's mapping (no copy), keeps its
// layers' KV blocks in host memory, and runs layers with multithreaded kernels (matmul.h, cpu_ops.h).
#pragma once

#include <initializer_list>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/matmul.h"
#include "core/thread_pool.h"

namespace roofline::cpu {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int n_threads = 0);
  ~CpuBackend() override;

  std::string name() const override { return "CPU"; }
  uint64_t weight_bytes(const Model& model, const LayerSet& layers) const override;
  uint64_t kv_block_bytes(const Model& model, const LayerSet& layers, const KvConfig& kv) const override;
  void load(std::shared_ptr<const Model> model, const LayerSet& layers) override;
  void init_kv(const KvConfig& kv) override;
  void begin_step(const StepDesc& step) override;
  void embed() override;
  void set_hidden(const float* hidden) override;
  void get_hidden(float* hidden) override;
  void forward(int layer_begin, int layer_end) override;
  void output(float* logits) override;
  void copy_kv_block(int src, int dst) override;
  void set_matmul_observer(MatmulObserver observer) override { observer_ = std::move(observer); }

  int n_threads() const { return pool_.size(); }

 private:
  struct LayerData {
    std::vector<float> attn_norm, ffn_norm, q_norm, k_norm, bq, bk, bv;
    std::vector<uint8_t> k_cache, v_cache;
  };
  void forward_layer(int il);
  void products_of_one_input(std::initializer_list<MatmulOut> outs, const float* x, int n, int64_t n_cols);
  void observe(const Weight& w, const float* x, int n_rows) const {
    if (observer_) observer_(*w.tensor, x, n_rows, w.cols());
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
  RopeTable rope_;
  // Work buffers, sized per step.
  std::vector<float> x_, xn_, q_, k_, v_, attn_, gate_, up_;
  ActRows act_;
  MatmulObserver observer_;
};

}  // namespace roofline::cpu
