// Where a model's units go: n_layer transformer layers plus the output unit (output norm and matrix)
// are ordered 0..n_layer; the last N units are offloaded (-ngl N) and spread over the GPUs as
// contiguous ranges in GPU order (layer split, -sm layer), in proportion to -ts or to each GPU's
// usable memory. Pure functions, so the split logic is tested without a GPU.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace roofline {

// Splits `units` over GPUs in proportion to `weights` (non-negative, at least one positive): GPU i gets
// the i-th contiguous range; boundaries are rounded cumulative shares, so the counts add up to `units`.
std::vector<int> split_units(int units, const std::vector<double>& weights);

// cost(gpu, first_unit, end_unit): bytes GPU `gpu` needs to hold model units [first_unit, end_unit).
using UnitCost = std::function<double(int gpu, int first_unit, int end_unit)>;

// The most units (at most n_units, taken from the back) whose split fits every GPU's budget in bytes.
int fit_units(int n_units, const std::vector<double>& weights, const std::vector<double>& budgets, const UnitCost& cost);

// For a chosen number of offloaded units: the first model unit of each GPU's range and its end.
struct GpuRange {
  int gpu = 0;  // index into the GPU list
  int first_unit = 0, end_unit = 0;
};
std::vector<GpuRange> gpu_ranges(int n_units, int offloaded, const std::vector<double>& weights);

// The prompt GEMMs' f16 weight scratch on a GPU of `gpu_total_bytes`: 128 MiB, and 320 MiB on GPUs of
// 64 GiB and more, where whole matrices of the 27-32B models fit it (one cuBLAS product each: pp512 +1.5-3%
// on an H200, docs/performance.md) for memory that costs such a GPU nothing it would miss.
size_t gemm_scratch_bytes(double gpu_total_bytes);
// Slots of that size the prompt GEMMs' weights are dequantized into ahead, on a side stream, while cuBLAS
// multiplies the previous ones (backend/cuda/cuda_dequant_ahead.cuh): 2 on GPUs of 64 GiB and more (qwen3-32b
// pp512 +4.5% on an H200, docs/performance.md), none below.
int dequant_ahead_slots(double gpu_total_bytes);
// Bytes a GPU keeps for work buffers besides weights, KV and state: logits and FFN activations of an
// n_batch-row step plus 256 MiB for scratch, what gemm_scratch_bytes takes beyond 128 MiB, and the
// dequant-ahead slots (the allowance -ngl auto and `roofline plan` use).
double gpu_work_bytes(int n_batch, int n_vocab, int n_ff, double gpu_total_bytes);
// What placement may fill on a GPU: usable memory less the margin (-ngl auto keeps margin_gib free)
// and the work buffers.
double gpu_budget_bytes(double usable_bytes, double margin_gib, double work_bytes);

// The units offloaded for an -ngl request (EngineOptions: kGpuLayersAuto = -1 fits as many as the
// budgets allow, kGpuLayersAll = -2 or N >= n_units all, else N): one rule for the engine and the planner.
int choose_gpu_units(int requested, int n_units, const std::vector<double>& weights, const std::vector<double>& budgets,
                     const UnitCost& cost);

// "3,1" -> {3, 1}; "" -> {}. Error on a negative, non-numeric or all-zero list.
std::vector<double> parse_proportions(const std::string& text, const char* flag);

}  // namespace roofline
