// Layer split over GPUs: proportional contiguous ranges and the largest offload that fits.
#include "engine/placement.h"

#include <cmath>
#include <cstdlib>

#include "core/error.h"

namespace roofline {

std::vector<int> split_units(int units, const std::vector<double>& weights) {
  double total = 0;
  for (double w : weights) {
    if (!(w >= 0) || !std::isfinite(w)) fail("split proportions must be finite and non-negative");
    total += w;
  }
  if (weights.empty() || total <= 0) fail("split proportions need at least one positive entry");
  std::vector<int> counts(weights.size(), 0);
  double cum = 0;
  int prev = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    cum += weights[i];
    const int boundary = i + 1 == weights.size() ? units : (int)std::lround(units * (cum / total));
    counts[i] = std::max(0, boundary - prev);
    prev = std::max(prev, boundary);
  }
  return counts;
}

std::vector<GpuRange> gpu_ranges(int n_units, int offloaded, const std::vector<double>& weights) {
  std::vector<GpuRange> ranges;
  const std::vector<int> counts = split_units(offloaded, weights);
  int unit = n_units - offloaded;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (counts[i] == 0) continue;
    ranges.push_back({(int)i, unit, unit + counts[i]});
    unit += counts[i];
  }
  return ranges;
}

int fit_units(int n_units, const std::vector<double>& weights, const std::vector<double>& budgets, const UnitCost& cost) {
  if (budgets.size() != weights.size()) fail("internal error: {} GPU budgets for {} split proportions", budgets.size(), weights.size());
  // More units never need less memory on any GPU, so the largest fitting count is found from the top.
  for (int units = n_units; units > 0; --units) {
    bool fits = true;
    for (const GpuRange& r : gpu_ranges(n_units, units, weights))
      if (cost(r.gpu, r.first_unit, r.end_unit) > budgets[r.gpu]) {
        fits = false;
        break;
      }
    if (fits) return units;
  }
  return 0;
}

size_t gemm_scratch_bytes(double gpu_total_bytes) { return (gpu_total_bytes >= 64.0 * 1073741824.0 ? 320 : 128) * (size_t)1048576; }

int dequant_ahead_slots(double gpu_total_bytes) { return gpu_total_bytes >= 64.0 * 1073741824.0 ? 2 : 0; }

double gpu_work_bytes(int n_batch, int n_vocab, int n_ff, double gpu_total_bytes) {
  const double scratch = (double)gemm_scratch_bytes(gpu_total_bytes);
  return (double)n_batch * (4.0 * n_vocab + 64.0 * n_ff) + 256.0 * 1048576 + (scratch - 128.0 * 1048576) +
         dequant_ahead_slots(gpu_total_bytes) * scratch;
}

double gpu_budget_bytes(double usable_bytes, double margin_gib, double work_bytes) {
  return usable_bytes - margin_gib * 1073741824.0 - work_bytes;
}

int choose_gpu_units(int requested, int n_units, const std::vector<double>& weights, const std::vector<double>& budgets,
                     const UnitCost& cost) {
  if (requested == -2 || requested >= n_units) return n_units;  // all
  if (requested >= 0) return requested;
  return fit_units(n_units, weights, budgets, cost);  // auto
}

std::vector<double> parse_proportions(const std::string& text, const char* flag) {
  std::vector<double> out;
  if (text.empty()) return out;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = text.find_first_of(",/", start);
    const std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    char* end = nullptr;
    const double v = std::strtod(item.c_str(), &end);
    if (item.empty() || *end || !(v >= 0) || !std::isfinite(v)) fail("{} '{}': expected non-negative numbers separated by commas", flag, text);
    out.push_back(v);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  double total = 0;
  for (double v : out) total += v;
  if (total <= 0) fail("{} '{}': at least one entry must be positive", flag, text);
  return out;
}

}  // namespace roofline
