// StepProfiler (cuda_step_profiler.cuh): CUDA events around the ops of decode steps, summed per op.
#include "backend/cuda/cuda_step_profiler.cuh"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "backend/cuda/cuda_common.cuh"

namespace roofline::cuda {

StepProfiler::StepProfiler() {
  const char* profile = std::getenv("ROOFLINE_PROFILE");
  enabled_ = profile && *profile && *profile != '0';
}

StepProfiler::~StepProfiler() {
  print();
  for (auto& m : marks_) cudaEventDestroy(m.event);
}

void StepProfiler::mark(cudaStream_t stream, const char* op, double bytes, int rows) {
  if (!enabled_) return;
  cudaEvent_t e;
  ROOFLINE_CUDA_CHECK(cudaEventCreate(&e));
  ROOFLINE_CUDA_CHECK(cudaEventRecord(e, stream));
  marks_.push_back({op, bytes, e, rows});
}

void StepProfiler::collect(cudaStream_t stream) {
  if (marks_.empty()) return;
  mark(stream, "", 0, marks_.back().rows);  // end of the last op
  ROOFLINE_CUDA_CHECK(cudaStreamSynchronize(stream));
  for (size_t i = 0; i + 1 < marks_.size(); ++i) {
    float ms = 0;
    cudaEventElapsedTime(&ms, marks_[i].event, marks_[i + 1].event);
    Row& row = totals_[marks_[i].rows][marks_[i].op];
    row.calls += 1;
    row.us += ms * 1000.0;
    row.bytes += marks_[i].bytes;
  }
  steps_[marks_.front().rows] += 1;
  for (auto& m : marks_) cudaEventDestroy(m.event);
  marks_.clear();
}

void StepProfiler::print() const {
  const char* bw_env = std::getenv("ROOFLINE_PROFILE_BW");
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
    std::fprintf(stderr, "\nper-op time of one step of %d rows (average over %d steps, CUDA graphs off):\n", rows, it->second);
    std::fprintf(stderr, "| op | calls | us | %% of step | MB read | GB/s | %% of %.0f GB/s |\n|---|---:|---:|---:|---:|---:|---:|\n", bw);
    std::vector<std::pair<std::string, Row>> sorted(ops.begin(), ops.end());
    std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.second.us > b.second.us; });
    for (const auto& [op, row] : sorted) {
      const double us = row.us / steps, mb = row.bytes / steps / 1e6, gbps = row.us > 0 ? row.bytes / (row.us * 1e-6) / 1e9 : 0;
      std::fprintf(stderr, "| %s | %.0f | %.1f | %.1f%% | %.1f | %.0f | %.0f%% |\n", op.c_str(), row.calls / steps, us,
                   100.0 * row.us / total_us, mb, gbps, bw > 0 ? 100.0 * gbps / bw : 0.0);
    }
    const double total_gbps = total_bytes / (total_us * 1e-6) / 1e9;
    std::fprintf(stderr, "| total | | %.1f | 100%% | %.1f | %.0f | %.0f%% |\n", total_us / steps, total_bytes / steps / 1e6, total_gbps,
                 bw > 0 ? 100.0 * total_gbps / bw : 0.0);
  }
}

}  // namespace roofline::cuda
