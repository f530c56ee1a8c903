// CpuStepProfiler (cpu_step_profiler.h): wall-clock marks between the ops of forward steps, summed per op.
#include "backend/cpu/cpu_step_profiler.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace roofline::cpu {

CpuStepProfiler::CpuStepProfiler() {
  const char* profile = std::getenv("ROOFLINE_PROFILE");
  enabled_ = profile && *profile && *profile != '0';
}

CpuStepProfiler::~CpuStepProfiler() { print(); }

void CpuStepProfiler::end_ops_now() {
  if (marks_.empty()) return;
  const Clock::time_point end = Clock::now();
  for (size_t i = 0; i < marks_.size(); ++i) {
    const Clock::time_point next = i + 1 < marks_.size() ? marks_[i + 1].t : end;
    Row& row = totals_[rows_][marks_[i].op];
    row.calls += 1;
    row.us += std::chrono::duration<double, std::micro>(next - marks_[i].t).count();
    row.bytes += marks_[i].bytes;
  }
  marks_.clear();
}

void CpuStepProfiler::print() const {
  const char* bw_env = std::getenv("ROOFLINE_PROFILE_HOST_BW");
  const double bw = bw_env ? std::atof(bw_env) : 0.0;
  for (const auto& [rows, ops] : totals_) {
    const auto it = steps_.find(rows);
    if (it == steps_.end() || it->second == 0) continue;
    const double steps = (double)it->second;
    double total_us = 0, total_bytes = 0;
    for (const auto& [op, row] : ops) {
      total_us += row.us;
      total_bytes += row.bytes;
    }
    std::fprintf(stderr, "\nCPU per-op time of one step of %d rows (average over %d steps):\n", rows, it->second);
    std::fprintf(stderr, "| op | calls | us | %% of step | MB read | GB/s | %% of %.0f GB/s |\n|---|---:|---:|---:|---:|---:|---:|\n", bw);
    std::vector<std::pair<std::string, Row>> sorted(ops.begin(), ops.end());
    std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.second.us > b.second.us; });
    for (const auto& [op, row] : sorted) {
      const double us = row.us / steps, mb = row.bytes / steps / 1e6, gbps = row.us > 0 ? row.bytes / (row.us * 1e-6) / 1e9 : 0;
      std::fprintf(stderr, "| %s | %.0f | %.1f | %.1f%% | %.1f | %.1f | %.0f%% |\n", op.c_str(), row.calls / steps, us,
                   100.0 * row.us / total_us, mb, gbps, bw > 0 ? 100.0 * gbps / bw : 0.0);
    }
    const double total_gbps = total_us > 0 ? total_bytes / (total_us * 1e-6) / 1e9 : 0;
    std::fprintf(stderr, "| total | | %.1f | 100%% | %.1f | %.1f | %.0f%% |\n", total_us / steps, total_bytes / steps / 1e6, total_gbps,
                 bw > 0 ? 100.0 * total_gbps / bw : 0.0);
  }
}

}  // namespace roofline::cpu
