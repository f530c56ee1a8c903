// How -sm row (tensor parallelism) splits a dense attention model's layers over n GPUs. Each GPU takes
// whole groups of KV heads with their query heads (rows of q, k and v; its KV cache holds only those
// heads) and the matching columns of the attention output matrix, and a range of the FFN's intermediate
// features (rows of gate and up, columns of down). Attention output and down then give each GPU a
// partial sum of the full result: one all-reduce after attention and one after the FFN per layer make
// every GPU's residual stream the same. Column ranges start and end on the weight type's block
// boundaries, so a GPU's slice of a quantized row is a byte range of it; Model::tensor_slice builds the
// model one GPU runs from a shard. Pure functions, tested without a GPU.
#pragma once

#include <cstdint>
#include <vector>

#include "model/hparams.h"

namespace roofline {

struct TensorShard {
  int kv_head_begin = 0, kv_head_end = 0;  // the KV heads of this GPU, with their n_gqa() query heads each
  int64_t ff_begin = 0, ff_end = 0;        // the FFN's intermediate features [ff_begin, ff_end)
  int n_kv_heads() const { return kv_head_end - kv_head_begin; }
  int64_t n_ff() const { return ff_end - ff_begin; }
};

// The shards of `weights.size()` GPUs in proportion to `weights` (-ts; non-negative, at least one
// positive). KV heads go in units of the fewest whole groups whose output-matrix columns
// (heads x head_dim_v) are a multiple of o_block, FFN features in units of down_block (the block sizes of
// the attention output and down weights' types: 256 for the K-quants, 32 for Q8_0/Q4_0, 1 for floats).
// Fails with one line when the model cannot be split that way: require_tensor_splittable (model.h),
// fewer units than GPUs, an FFN width that is not a multiple of down_block, a GPU given nothing.
std::vector<TensorShard> plan_tensor_split(const HParams& hp, const std::vector<double>& weights, int64_t o_block, int64_t down_block);

}  // namespace roofline
