// The non-matmul operations of a transformer layer on the CPU, written plainly (float math, fixed
// per-row reduction order so results never depend on the batch). Tests compare them with double
// references; the attention reads the paged KV cache through block tables.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "backend/step.h"
#include "core/thread_pool.h"
#include "formats/dtype.h"
#include "model/arch.h"

namespace roofline::cpu {

// y = x / rms(x) * w, per row of n (y may alias x).
void rms_norm(const float* x, const float* w, float* y, int n, float eps);

// Rotation angles for every row of a step: cos/sin tables [n_rows x n_rot/2].
// theta_i = pos * freq_scale * base^(-2i/n_rot) / factor_i (factors: llama3 rope_freqs, may be null).
struct RopeTable {
  int half = 0;
  std::vector<float> cos, sin;
};
RopeTable rope_table(const std::vector<int32_t>& positions, int n_rot, float freq_base, float freq_scale,
                     const float* factors);
// Rotates the first n_rot dims of each head of one row in place.
void rope_row(float* x, int n_heads, int head_dim, int n_rot, RopeStyle style, const float* cos, const float* sin);

inline float silu(float x) { return x / (1.0f + std::exp(-x)); }

// Paged KV cache of one layer in one backend: rows of kv_dim elements of `type` per position.
struct KvLayerView {
  uint8_t* k = nullptr;
  uint8_t* v = nullptr;
  DType type_k = DType::F16, type_v = DType::F16;
  size_t k_row_bytes = 0, v_row_bytes = 0;  // bytes per position
  int block_size = 0;
  // > 0: a sliding layer's rings instead of blocks: position p of a sequence in row
  // state_cell * ring + p % ring (KvConfig::swa_ring).
  int ring = 0;
};

// The row of the cache (in the layer's K and V arrays) that holds position `pos` of a sequence.
inline size_t kv_slot(const KvLayerView& kv, const StepSequence& s, int pos) {
  if (kv.ring > 0) return (size_t)s.state_cell * kv.ring + pos % kv.ring;
  return (size_t)s.block_table[pos / kv.block_size] * kv.block_size + pos % kv.block_size;
}

// Writes the step's new K and V rows ([n_rows x kv_dim]) into the cache slots of their positions.
void kv_store(const KvLayerView& kv, const StepDesc& step, const float* k, const float* v, int kv_dim_k, int kv_dim_v,
              ThreadPool& pool);

// Causal attention of every row of the step over its sequence's cached positions [0, pos], or with a
// window > 0 over the last `window` of them, (pos - window, pos] (sliding-window layers; the blocks
// before that range are never read). q: [n_rows x n_head*head_dim_k], out: [n_rows x n_head*head_dim_v].
void attention(const KvLayerView& kv, const StepDesc& step, const float* q, float* out, int n_head, int n_head_kv,
               int head_dim_k, int head_dim_v, float scale, ThreadPool& pool, int window = 0);

// GELU with the tanh approximation (gemma's GeGLU).
inline float gelu_tanh(float x) {
  return 0.5f * x * (1.0f + std::tanh(0.7978845608f * (x + 0.044715f * x * x * x)));
}

// g[i] = silu(g[i]) * u[i] (or gelu_tanh with geglu) for i < n: the AVX-512 form where cpu_isa() has it
// (activations_avx512.cpp; within a few ulps of these scalar functions), else the scalar ones. Elementwise:
// callers may split rows and columns any way.
void gated_activation(float* g, const float* u, size_t n, bool geglu);
namespace detail {
void gated_activation_avx512(float* g, const float* u, size_t n, bool geglu);
}  // namespace detail

}  // namespace roofline::cpu
