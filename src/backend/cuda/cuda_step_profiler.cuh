// The CUDA backend's per-op profile of decode steps (ROOFLINE_PROFILE=1, CUDA graphs off): an event
// before each op; the time between consecutive events is the op's. Printed to stderr as one table per
// step size (rows in the step) when the backend is destroyed: average time per step of each op and, for
// weight ops, the bytes read and the bandwidth reached (ROOFLINE_PROFILE_BW: the GB/s to compare with).
// And StepGaps (ROOFLINE_STEP_GAPS=1, graphs on): where the time between one decode step's output and the next
// step's layers goes, GPU idle time included.
#pragma once

#include <cuda_runtime.h>

#include <chrono>
#include <map>
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

// ROOFLINE_STEP_GAPS=1: three events a step (the step's start, before its layers, after its output's copies) and
// the host's clock around the launch of the layers, summed per step size (rows) and printed to stderr when the
// backend is destroyed: the GPU's idle gap since the step before ended, the start (header upload, embedding),
// the layers with the output, and how long the host took to launch the layers; launch calls that captured a new
// graph are counted apart (how many, the host's time in them). Timing only; the step is the same.
class StepGaps {
 public:
  StepGaps();
  ~StepGaps();
  StepGaps(const StepGaps&) = delete;
  StepGaps& operator=(const StepGaps&) = delete;

  bool enabled() const { return enabled_; }
  void step_start(cudaStream_t stream, int rows);
  void layers_start(cudaStream_t stream);
  void launched(bool captured = false);  // the layers' launch call returned (captured: it captured a new graph)
  void step_end(cudaStream_t stream);  // after the output's copies, before the wait for them
  void collect();                      // after that wait

 private:
  struct Sums {
    double gap_us = 0, start_us = 0, body_us = 0, launch_us = 0;
    int steps = 0;
    double capture_us = 0;  // launch calls that captured a graph, every step (the first has no gap)
    int captures = 0;
  };
  bool enabled_ = false;
  int rows_ = 0;
  bool have_prev_ = false, in_step_ = false, have_layers_ = false;
  cudaEvent_t prev_end_ = nullptr, start_ = nullptr, layers_ = nullptr, end_ = nullptr;
  std::chrono::steady_clock::time_point launch_t0_;
  double launch_us_ = 0;
  std::map<int, Sums> sums_;
};

}  // namespace roofline::cuda
