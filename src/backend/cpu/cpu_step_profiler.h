// The CPU backend's per-op profile of forward steps (ROOFLINE_PROFILE=1, which `bench --profile` sets):
// the wall time from one op's mark to the next, thread-pool dispatch and wait included, summed per op and
// step size. Printed to stderr as one table per step size (rows in the step) when the backend is
// destroyed: average time per step of each op and, for weight ops, the bytes read and the bandwidth
// reached (ROOFLINE_PROFILE_HOST_BW: the host's GB/s to compare with). Off, a mark is one branch.
#pragma once

#include <chrono>
#include <vector>

#include "core/op_profile.h"

namespace roofline::cpu {

class CpuStepProfiler {
 public:
  // Enabled when ROOFLINE_PROFILE is set to something other than 0.
  CpuStepProfiler();
  ~CpuStepProfiler();
  CpuStepProfiler(const CpuStepProfiler&) = delete;
  CpuStepProfiler& operator=(const CpuStepProfiler&) = delete;

  bool enabled() const { return enabled_; }
  // A step of `rows` rows begins (its ops are averaged over the steps of that size).
  void begin_step(int rows) {
    if (enabled_) {
      rows_ = rows;
      ++profile_.steps[rows];
    }
  }
  // Op `op` (reading `bytes` of weights) starts now; the previous op ends.
  void mark(const char* op, double bytes = 0) {
    if (enabled_) marks_.push_back({op, bytes, Clock::now()});
  }
  // The op marked last read `bytes` more than its mark said (an op that learns its bytes as it runs).
  void add_bytes(double bytes) {
    if (enabled_ && !marks_.empty()) marks_.back().bytes += bytes;
  }
  // The last op marked ends now: the ops' times join the totals of the step.
  void end_ops() {
    if (enabled_) end_ops_now();
  }
  void print() const;  // the tables (core/op_profile.h)

 private:
  using Clock = std::chrono::steady_clock;
  struct Mark {
    const char* op;
    double bytes;
    Clock::time_point t;
  };
  void end_ops_now();

  bool enabled_ = false;
  int rows_ = 0;
  std::vector<Mark> marks_;
  OpProfile profile_;
};

}  // namespace roofline::cpu
