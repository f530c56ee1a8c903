// Mixture-of-experts FFN on the GPU (qwen3moe, qwen35moe): device routing (softmax over the router's
// logits, top-k with the lower index first on ties, renormalised weights) and the products of each row's
// chosen experts read straight from the stacked expert tensors by expert id, so the whole block stays on
// the device (no host round trip: decode steps keep their CUDA graphs). The products dequantize in
// registers with f32 activations (dequant_chunk32, every type and device layout): a simple, correct
// path for decode and prefill alike; faster grouped kernels are future work.
#pragma once

#include <cstdint>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_weights.cuh"
#include "model/hparams.h"

namespace roofline::cuda {

// A layer's MoE weights on the device.
struct MoeLayerDev {
  const DeviceWeight* router = nullptr;                                         // [n_embd] -> n_expert
  const DeviceWeight *gate_exps = nullptr, *up_exps = nullptr, *down_exps = nullptr;  // stacked over experts
  const DeviceWeight *gate_shexp = nullptr, *up_shexp = nullptr, *down_shexp = nullptr;  // the shared expert, or null
  const float* shexp_gate = nullptr;                                            // [n_embd]
};

// Work buffers for up to max_rows rows, and the block's launches.
class MoeFfn {
 public:
  // Throws a one-line Error for shapes the kernels do not take (rows not multiples of 32, k > 32).
  MoeFfn(const HParams& hp, int max_rows, cudaStream_t stream);

  // x[r] += FFN(xn[r]) for r < n_rows: the routed experts weighted by their routing weights, plus the
  // shared expert times sigmoid(shexp_gate . xn[r]) where the layer has one.
  void forward(const MoeLayerDev& layer, const float* xn, int n_rows, float* x, cudaStream_t stream);
  // The shared expert alone (x[r] += sigmoid(gate . xn[r]) * shared(xn[r])), for layers whose routed
  // experts run elsewhere; nothing for a layer without one.
  void forward_shared(const MoeLayerDev& layer, const float* xn, int n_rows, float* x, cudaStream_t stream);
  // x[r] += rows[r] for host rows [n_rows x n_embd] (the routed experts' output computed on the CPU).
  void add_host_rows(const float* rows, int n_rows, float* x, cudaStream_t stream);

  // The last forward's routing ([n_rows x n_expert_used] ids and weights, device pointers).
  const int32_t* ids() const { return ids_; }
  const float* weights() const { return weights_; }

 private:
  HParams hp_;
  int max_rows_ = 0;
  DeviceArena arena_;
  float *logits_ = nullptr, *weights_ = nullptr, *gate_ = nullptr, *up_ = nullptr, *y_ = nullptr;
  float *shexp_gate_ = nullptr, *shexp_up_ = nullptr, *shexp_y_ = nullptr;
  int32_t* ids_ = nullptr;
};

}  // namespace roofline::cuda
