// The engine's placement for -sm row (tensor parallelism): the model cut into a slice per GPU
// (engine/tensor_parallel.h), the units every GPU can hold its slice of, and the backend that runs them.
#include <algorithm>

#include "backend/gpu.h"
#include "core/error.h"
#include "engine/engine.h"
#include "engine/placement.h"
#include "engine/tensor_parallel.h"

namespace roofline {

int Engine::place_row_split(std::vector<std::unique_ptr<Backend>>& gpus, const std::vector<int>& gpu_list,
                            const std::vector<double>& weights, const std::vector<double>& budgets, const KvConfig& kv, int n_cells,
                            double work_bytes) {
  const EngineOptions& o = options_;
  const HParams& hp = model_->hparams();
  const int n_units = hp.n_layer + 1;
  ModelSplit split = split_model(model_, weights);
  // Bytes GPU i needs for its slice of units [first, n_units): every GPU holds the same layers (and the
  // embedding with the first), only the first GPU the output layer.
  auto need = [&](size_t i, int first) {
    const LayerSet set{std::min(first, hp.n_layer), hp.n_layer, first == 0, i == 0};
    const Model& m = *split.slices[i];
    return (double)gpus[i]->weight_bytes(m, set) + (double)gpus[i]->kv_block_bytes(m, set, kv) * kv.n_blocks +
           ((double)gpus[i]->state_cell_bytes(m, set) + (double)gpus[i]->swa_cell_bytes(m, set, kv)) * n_cells;
  };
  // The placement rules see one device whose cost is the largest excess of any GPU over its budget.
  auto excess = [&](int, int first, int) {
    double worst = -1e300;
    for (size_t i = 0; i < gpus.size(); ++i) worst = std::max(worst, need(i, first) - budgets[i]);
    return worst;
  };
  const int units = choose_gpu_units(o.n_gpu_layers, n_units, {1.0}, {0.0}, excess);
  const int first = n_units - units;
  for (size_t i = 0; i < gpus.size(); ++i) {
    const TensorShard& s = split.shards[i];
    report_.push_back(fmt::format("GPU {} (-sm row): KV heads {}-{} of {}, FFN features {}-{} of {}{}; needs {:.2f} GiB for {} units, "
                                  "budget {:.2f} GiB (after {:.2f} GiB of work buffers and {:.2f} GiB of margin)",
                                  gpu_list[i], s.kv_head_begin, s.kv_head_end - 1, hp.n_head_kv, s.ff_begin, s.ff_end - 1, hp.n_ff,
                                  i == 0 ? ", the output layer" : "", units > 0 ? need(i, first) / 1073741824.0 : 0.0, units,
                                  std::max(0.0, budgets[i]) / 1073741824.0, work_bytes / 1073741824.0, o.gpu_margin_gib));
    // With a memory limit, an explicit -ngl that does not fit is refused (as for -sm layer).
    if (!o.vram_limit_gib.empty() && units > 0 && need(i, first) > budgets[i])
      fail("GPU {} needs {:.2f} GiB for its slice of {} units, more than the {:.2f} GiB --vram-limit leaves; lower -ngl, -c or the KV "
           "types, use a smaller quant, or add a GPU",
           gpu_list[i], need(i, first) / 1073741824.0, units, std::max(0.0, budgets[i]) / 1073741824.0);
  }
  if (units == 0) return 0;
  // The partial sums of a step: at most n_batch rows (decode steps pad to a bucket of at most 16).
  const size_t max_floats = (size_t)std::max(o.n_batch, 16) * (size_t)hp.n_embd;
  auto reducer = make_gpu_reducer(gpu_list, max_floats);
  row_split_ = std::make_unique<TensorParallelBackend>(std::move(gpus), std::move(split.slices), std::move(reducer));
  return units;
}

}  // namespace roofline
