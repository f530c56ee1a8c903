// OpProfile::print (op_profile.h).
#include "core/op_profile.h"

#include <algorithm>
#include <cstdio>
#include <utility>
#include <vector>

namespace roofline {

void OpProfile::print(const char* title, double bw, std::FILE* out) const {
  for (const auto& [rows, ops] : totals) {
    const auto it = steps.find(rows);
    if (it == steps.end() || it->second == 0) continue;
    const double n_steps = (double)it->second;
    double total_us = 0, total_bytes = 0;
    for (const auto& [op, row] : ops) {
      total_us += row.us;
      total_bytes += row.bytes;
    }
    std::fprintf(out, "\n%s per-op time of one step of %d rows (average over %d steps):\n", title, rows, it->second);
    std::fprintf(out, "| op | calls | us | %% of step | MB read | GB/s | %% of %.0f GB/s |\n|---|---:|---:|---:|---:|---:|---:|\n", bw);
    std::vector<std::pair<std::string, OpTotals>> sorted(ops.begin(), ops.end());
    std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.second.us > b.second.us; });
    for (const auto& [op, row] : sorted) {
      const double us = row.us / n_steps, mb = row.bytes / n_steps / 1e6, gbps = row.us > 0 ? row.bytes / (row.us * 1e-6) / 1e9 : 0;
      std::fprintf(out, "| %s | %.0f | %.1f | %.1f%% | %.1f | %.1f | %.0f%% |\n", op.c_str(), row.calls / n_steps, us,
                   total_us > 0 ? 100.0 * row.us / total_us : 0.0, mb, gbps, bw > 0 ? 100.0 * gbps / bw : 0.0);
    }
    const double total_gbps = total_us > 0 ? total_bytes / (total_us * 1e-6) / 1e9 : 0;
    std::fprintf(out, "| total | | %.1f | 100%% | %.1f | %.1f | %.0f%% |\n", total_us / n_steps, total_bytes / n_steps / 1e6, total_gbps,
                 bw > 0 ? 100.0 * total_gbps / bw : 0.0);
  }
}

}  // namespace roofline
