// Mixture-of-experts feed-forward on the CPU (qwen3moe, qwen35moe): routing per row (softmax over
// the router's logits, top-k, renormalised top-k weights) and the routed experts' SwiGLU products
// grouped by expert within a step, so rows that picked expert e are multiplied together and each
// expert a step uses is read once, however many rows chose it. The products of all the experts a step
// uses go to the thread pool together (gate and up in one dispatch, down in another), so a decode token
// costs a few waits per layer, not a few per expert.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/matmul.h"
#include "core/thread_pool.h"
#include "model/hparams.h"
#include "model/model.h"

namespace roofline::cpu {

// One row's routing: softmax over n_expert logits, the k most probable experts (ties: the lower index
// first), their probabilities renormalised to sum 1 when `normalize`, then times `scale`.
// ids and weights receive k values each, most probable first.
void route_row(const float* logits, int n_expert, int k, bool normalize, float scale, int32_t* ids, float* weights);

// Expert e of a stacked [in, out, n_expert] tensor, as a 2-D tensor view of the same data.
gguf::TensorInfo expert_slice(const gguf::TensorInfo& stacked, int expert);

// A layer's experts as 2-D views (built once at load; Weights point into them).
struct ExpertViews {
  std::vector<gguf::TensorInfo> gate, up, down;
  const gguf::TensorInfo *gate_stacked = nullptr, *up_stacked = nullptr, *down_stacked = nullptr;
  void build(const Weight& gate_exps, const Weight& up_exps, const Weight& down_exps);
};

// The routed part of a MoE FFN: out[r] = sum over r's chosen experts of weight * down(silu(gate x) * up x).
class MoeExperts {
 public:
  // x: [n x n_embd] (the FFN's normed input), out: [n x n_embd] (overwritten). An observer (importance
  // matrices) sees each expert's input rows with the stacked tensor and the expert's index. Experts found
  // in `packed` are read from their packed copies.
  void forward(const Weight& router, const ExpertViews& experts, const HParams& hp, const float* x, int n, float* out,
               ThreadPool& pool, const Backend::MatmulObserver* observer = nullptr, const PackedWeights* packed = nullptr);

  // The routing of the last forward: [n x n_expert_used] expert ids and weights.
  const std::vector<int32_t>& ids() const { return ids_; }
  const std::vector<float>& weights() const { return weights_; }
  // Bytes of weights the last forward read: the router's, and each expert any row chose (gate, up and
  // down) once. `bench --profile` reports the experts' bandwidth from it.
  double weight_bytes_read() const { return weight_bytes_read_; }

 private:
  std::vector<float> logits_, weights_, xe_, gate_, up_, ye_;
  std::vector<int32_t> ids_;
  double weight_bytes_read_ = 0;
  ActRows x_gate_, x_up_;                 // the step's rows for the gate and up products
  std::vector<ActRows> in_gate_, in_up_;  // per used expert: its rows of x_gate_ / x_up_
  std::vector<ActRows> hidden_;           // per used expert: silu(gate) * up, for the down product
  ThreadPool serial_{1};                  // to prepare rows inside a pool task
};

}  // namespace roofline::cpu
