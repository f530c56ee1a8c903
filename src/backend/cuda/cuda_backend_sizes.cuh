// What the CUDA backend's memory holds, in bytes, and the float form of small tensors it uploads: the
// helpers behind CudaBackend's weight_bytes / kv_block_bytes / swa_cell_bytes (cuda_backend.cu), which the
// engine's placement and `roofline plan` bill.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_kernels.cuh"
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

}  // namespace roofline::cuda
