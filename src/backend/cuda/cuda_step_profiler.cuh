// The CUDA backend's per-op profile of decode steps (ROOFLINE_PROFILE=1, CUDA graphs off): an event
// before each op; the time between consecutive events is the op's. Printed to stderr as one table per
// step size (rows in the step) when the backend is destroyed: average time per step of each op and, for
// weight ops, the bytes read and the bandwidth reached (ROOFLINE_PROFILE_BW: the GB/s to compare with).
#pragma once

#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "core/op_profile.h"

namespace roofline::cuda {

class StepProfiler {
 public:
  // Enabled when ROOFLINE_PROFILE is set to something other than 0.
  StepProfiler();
  ~StepProfiler();
  StepProfiler(const StepProfiler&) = delete;
  StepProfiler& operator=(const StepProfiler&) = delete;

  bool enabled() const { return enabled_; }
  // An event on `stream` before op `op` (reading `bytes` of weights) of a step of `rows` rows.
  void mark(cudaStream_t stream, const char* op, double bytes, int rows);
  // After a step: waits for it and adds its ops' times to the totals.
  void collect(cudaStream_t stream);
  void print() const;  // the tables (core/op_profile.h)

 private:
  struct Mark {
    std::string op;
    double bytes;
    cudaEvent_t event;
    int rows;
  };
  bool enabled_ = false;
  std::vector<Mark> marks_;
  OpProfile profile_;
};

}  // namespace roofline::cuda
