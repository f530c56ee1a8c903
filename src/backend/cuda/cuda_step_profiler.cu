// StepProfiler (cuda_step_profiler.cuh): CUDA events around the ops of decode steps, summed per op.
#include "backend/cuda/cuda_step_profiler.cuh"

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
    profile_.add(marks_[i].rows, marks_[i].op, ms * 1000.0, marks_[i].bytes);
  }
  profile_.steps[marks_.front().rows] += 1;
  for (auto& m : marks_) cudaEventDestroy(m.event);
  marks_.clear();
}

void StepProfiler::print() const {
  const char* bw_env = std::getenv("ROOFLINE_PROFILE_BW");
  profile_.print("GPU (CUDA graphs off)", bw_env ? std::atof(bw_env) : 0.0);
}

}  // namespace roofline::cuda
