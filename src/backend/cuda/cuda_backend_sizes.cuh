// What the CUDA backend's memory holds, in bytes, and the float form of small tensors it uploads: the
// helpers behind CudaBackend's weight_bytes / kv_block_bytes / swa_cell_bytes (cuda_backend.cu), which the
// engine's placement and `roofline plan` bill.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_kernels.cuh"
#include "backend/cuda/cuda_weights.cuh"
#include "core/error.h"
#include "formats/quant_ref.h"
#include "model/model.h"

namespace roofline::cuda {

// A small tensor (norm weights, biases, rope factors) as floats for upload.
inline std::vector<float> to_floats(const Weight& w) {
  if (!w) return {};
  if (!w.data()) fail("tensor {} has no data (a layout-only model cannot run)", w.tensor->name);
  std::vector<float> out((size_t)w.tensor->n_elements());
  dequantize_rows_ref(w.type(), w.data(), out.data(), w.tensor->n_rows(), w.tensor->row_length());
  return out;
}

// Device bytes of such a tensor as floats (256-byte aligned).
inline size_t floats_bytes(const Weight& w) { return w ? ((size_t)w.tensor->n_elements() * 4 + 255) / 256 * 256 : 0; }

// Bytes of the K/V planes of `positions` slots of one layer (with the arena's alignment slack).
inline uint64_t kv_plane_bytes(const HParams& hp, const KvConfig& kv, int64_t positions) {
  const int64_t nk = positions * hp.kv_dim_k(), nv = positions * hp.kv_dim_v();
  return kv_values_bytes(kv.type_k, nk) + kv_scales_bytes(kv.type_k, nk) + kv_values_bytes(kv.type_v, nv) + kv_scales_bytes(kv.type_v, nv) +
         4 * 256;
}

// Sliding layers among [begin, end) kept in rings (KvConfig::swa_ring) rather than paged.
inline int ring_layers(const HParams& hp, const LayerSet& layers, const KvConfig& kv) {
  return kv.swa_ring > 0 ? hp.count_sliding_layers(layers.begin, layers.end) : 0;
}

// Device bytes of the weights of `layers` (CudaBackend::weight_bytes): matrices in their device layout, small
// tensors as floats; on_host(il, role) says which stacked experts stay in host memory (--cpu-moe and the like).
template <typename OnHost>
uint64_t device_weights_bytes(const Model& model, const LayerSet& layers, OnHost&& on_host) {
  uint64_t n = 0;
  for (int il = layers.begin; il < layers.end; ++il) {
    const LayerWeights& L = model.layer(il);
    for (const PlannedTensor& t : layer_tensor_plan(model.arch(), model.hparams(), il)) {
      if (on_host(il, t.rule->role)) continue;
      const Weight& w = L[t.rule->role];
      n += t.rule->use == TensorUse::Matrix ? device_weight_bytes(w) : floats_bytes(w);
    }
  }
  if (layers.embedding) n += device_weight_bytes(model.token_embd());
  if (layers.output) {
    if (!(layers.embedding && model.tied_embeddings())) n += device_weight_bytes(model.output());
    n += floats_bytes(model.output_norm());
  }
  return n + floats_bytes(model.rope_freqs());
}

}  // namespace roofline::cuda
