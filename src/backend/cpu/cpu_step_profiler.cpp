// CpuStepProfiler (cpu_step_profiler.h): wall-clock marks between the ops of forward steps, summed per op.
#include "backend/cpu/cpu_step_profiler.h"

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
    profile_.add(rows_, marks_[i].op, std::chrono::duration<double, std::micro>(next - marks_[i].t).count(), marks_[i].bytes);
  }
  marks_.clear();
}

void CpuStepProfiler::print() const {
  const char* bw_env = std::getenv("ROOFLINE_PROFILE_HOST_BW");
  profile_.print("CPU (wall time, pool waits included)", bw_env ? std::atof(bw_env) : 0.0);
}

}  // namespace roofline::cpu
