// StepProfiler (cuda_step_profiler.cuh): CUDA events around the ops of decode steps, summed per op.
#include "backend/cuda/cuda_step_profiler.cuh"

#include <cstdio>
#include <cstdlib>
#include <utility>

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

StepGaps::StepGaps() {
  const char* on = std::getenv("ROOFLINE_STEP_GAPS");
  enabled_ = on && *on && *on != '0';
  if (!enabled_) return;
  for (cudaEvent_t* e : {&prev_end_, &start_, &layers_, &end_}) ROOFLINE_CUDA_CHECK(cudaEventCreate(e));
}

StepGaps::~StepGaps() {
  if (!enabled_) return;
  for (const auto& [rows, s] : sums_) {
    if (s.captures > 0)
      std::fprintf(stderr, "graph captures, %d-row steps: %d, %.1f us each on the host\n", rows, s.captures, s.capture_us / s.captures);
    if (s.steps == 0) continue;
    std::fprintf(stderr,
                 "step gaps, %d-row steps (%d): GPU idle before a step %.1f us, start (header, embedding) %.1f us, layers + "
                 "output %.1f us; the layers' launch call %.1f us on the host\n",
                 rows, s.steps, s.gap_us / s.steps, s.start_us / s.steps, s.body_us / s.steps, s.launch_us / s.steps);
  }
  for (cudaEvent_t e : {prev_end_, start_, layers_, end_}) cudaEventDestroy(e);
}

void StepGaps::step_start(cudaStream_t stream, int rows) {
  if (!enabled_) return;
  if (in_step_) have_prev_ = false;  // the step before was not collected: no gap to measure
  rows_ = rows;
  in_step_ = true;
  have_layers_ = false;
  launch_us_ = 0;
  ROOFLINE_CUDA_CHECK(cudaEventRecord(start_, stream));
}

void StepGaps::layers_start(cudaStream_t stream) {
  if (!enabled_ || !in_step_) return;
  if (!have_layers_) ROOFLINE_CUDA_CHECK(cudaEventRecord(layers_, stream));  // a step's first layer range
  have_layers_ = true;
  launch_t0_ = std::chrono::steady_clock::now();
}

void StepGaps::launched(bool captured) {
  if (!enabled_ || !in_step_) return;
  const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - launch_t0_).count();
  if (!captured) {
    launch_us_ += us;
    return;
  }
  Sums& s = sums_[rows_];
  s.capture_us += us;
  ++s.captures;
  have_prev_ = false;  // the GPU waits for the capture inside this step: it is left out of the gaps
}

void StepGaps::step_end(cudaStream_t stream) {
  if (!enabled_ || !in_step_) return;
  ROOFLINE_CUDA_CHECK(cudaEventRecord(end_, stream));
}

void StepGaps::collect() {
  if (!enabled_ || !in_step_) return;
  in_step_ = false;
  ROOFLINE_CUDA_CHECK(cudaEventSynchronize(end_));
  if (have_layers_) {
    float gap = 0, start = 0, body = 0;
    if (have_prev_) cudaEventElapsedTime(&gap, prev_end_, start_);
    cudaEventElapsedTime(&start, start_, layers_);
    cudaEventElapsedTime(&body, layers_, end_);
    Sums& s = sums_[rows_];
    if (have_prev_) {  // the first step of a run has no gap before it; the sums count steps that have one
      s.gap_us += gap * 1000.0, s.start_us += start * 1000.0, s.body_us += body * 1000.0, s.launch_us += launch_us_;
      ++s.steps;
    }
  }
  std::swap(prev_end_, end_);
  have_prev_ = true;
}

}  // namespace roofline::cuda
