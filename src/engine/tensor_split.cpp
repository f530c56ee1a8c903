// The -sm row split of a layer's heads and FFN features over GPUs (tensor_split.h).
#include "engine/tensor_split.h"

#include <numeric>

#include "core/error.h"
#include "engine/placement.h"
#include "model/model.h"

namespace roofline {

std::vector<TensorShard> plan_tensor_split(const HParams& hp, const std::vector<double>& weights, int64_t o_block, int64_t down_block) {
  const int n = (int)weights.size();
  if (n < 1) fail("-sm row needs at least one GPU");
  require_tensor_splittable(hp);
  if (hp.n_head_kv < 1 || hp.n_head % hp.n_head_kv != 0) fail("-sm row: {} query heads over {} KV heads", hp.n_head, hp.n_head_kv);
  if (o_block < 1 || down_block < 1) fail("internal error: block sizes {} and {} for -sm row", o_block, down_block);
  // KV heads per unit: the fewest whole groups whose output-matrix columns end on a block boundary.
  const int64_t group_cols = (int64_t)hp.n_gqa() * hp.head_dim_v;
  const int64_t heads_per_unit = o_block / std::gcd(o_block, group_cols);
  if (hp.n_head_kv % heads_per_unit != 0)
    fail("-sm row: {} KV heads do not split into groups of {} (the attention output weight's blocks are {} columns, a group {})",
         hp.n_head_kv, heads_per_unit, o_block, group_cols);
  const int head_units = (int)(hp.n_head_kv / heads_per_unit);
  if (hp.n_ff % down_block != 0) fail("-sm row: the FFN width {} is not a multiple of the down weight's blocks ({})", hp.n_ff, down_block);
  const int ff_units = (int)(hp.n_ff / down_block);
  if (head_units < n || ff_units < n)
    fail("-sm row over {} GPUs: the model has {} splittable groups of KV heads and {} of FFN features; use fewer GPUs or -sm layer", n,
         head_units, ff_units);
  const std::vector<int> heads = split_units(head_units, weights), ff = split_units(ff_units, weights);
  std::vector<TensorShard> shards((size_t)n);
  int head = 0;
  int64_t feature = 0;
  for (int g = 0; g < n; ++g) {
    if (heads[(size_t)g] == 0 || ff[(size_t)g] == 0)
      fail("-sm row: GPU {} of {} gets no heads or no FFN features at these split proportions (-ts)", g, n);
    TensorShard& s = shards[(size_t)g];
    s.kv_head_begin = head;
    s.kv_head_end = head + heads[(size_t)g] * (int)heads_per_unit;
    s.ff_begin = feature;
    s.ff_end = feature + ff[(size_t)g] * down_block;
    head = s.kv_head_end;
    feature = s.ff_end;
  }
  return shards;
}

}  // namespace roofline
