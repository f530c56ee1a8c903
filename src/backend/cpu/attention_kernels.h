// The inner loops of the CPU paged attention (cpu_ops.cpp) for one tile: up to kAttentionRowTile
// consecutive rows of one sequence against one kv head, for the SIMD paths (attention_avx512.cpp).
#pragma once

#include <cstddef>

#include "backend/cpu/cpu_ops.h"

namespace roofline::cpu {

constexpr int kAttentionRowTile = 16;

// Softmax of n scores in place: max, exp(x - max), sum in index order, times 1 / sum. The one sequence
// of operations every attention path uses.
void softmax_row(float* scores, int n);

struct AttentionTile {
  const KvLayerView* kv = nullptr;
  const StepSequence* seq = nullptr;
  int kvh = 0;                    // the kv head
  int nr = 0;                     // rows in the tile
  int n_gqa = 0;                  // query heads per kv head
  int head_dim_k = 0, head_dim_v = 0;
  const float* q = nullptr;       // row i's n_gqa query vectors (this kv head's group) at q + i * q_row_stride
  size_t q_row_stride = 0;
  float* out = nullptr;           // row i's n_gqa output vectors at out + i * out_row_stride
  size_t out_row_stride = 0;
  const int* first = nullptr;     // row i sees the positions [first[i], last[i]]
  const int* last = nullptr;
  float scale = 1.0f;
};

namespace detail {
// Runs the tile and returns true when this CPU and the tile's head dimensions have the AVX-512 loops.
bool attention_tile_avx512(const AttentionTile& tile);
}  // namespace detail

}  // namespace roofline::cpu
