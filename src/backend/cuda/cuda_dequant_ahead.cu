// Prompt GEMM weights dequantized ahead on a side stream: see cuda_dequant_ahead.cuh.
#include "backend/cuda/cuda_dequant_ahead.cuh"

#include <cstdlib>

namespace roofline::cuda {

int DequantAhead::slots_wanted(int option_slots) {
  const char* env = std::getenv("ROOFLINE_DEQUANT_AHEAD");
  return env ? std::max(0, std::atoi(env)) : option_slots;
}

// Set once for the handle: setting and resetting it around each staged product made prompt steps erratic
// (qwen3-8b pp512 repetitions of 25k and 17k t/s); 16 measured best on an H200 against 0, 8, 24 and 32.
void DequantAhead::leave_sms(cublasHandle_t cublas, int device) {
  const char* env = std::getenv("ROOFLINE_DEQUANT_AHEAD_SMS");
  const int keep = env ? std::atoi(env) : 16;
  int sms = 0;
  ROOFLINE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  if (keep > 0 && keep < sms) cublasSetSmCountTarget(cublas, sms - keep);
}

DequantAhead::DequantAhead(int n_slots, size_t slot_elems, cudaStream_t main) : main_(main), slot_elems_(slot_elems) {
  int least = 0, greatest = 0;
  ROOFLINE_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  ROOFLINE_CUDA_CHECK(cudaStreamCreateWithPriority(&side_, cudaStreamNonBlocking, least));
  for (int i = 0; i < n_slots; ++i) {
    __half* p = nullptr;
    ROOFLINE_CUDA_CHECK(cudaMalloc(&p, slot_elems * sizeof(__half)));
    slots_.push_back(p);
    cudaEvent_t r, f;
    ROOFLINE_CUDA_CHECK(cudaEventCreateWithFlags(&r, cudaEventDisableTiming));
    ROOFLINE_CUDA_CHECK(cudaEventCreateWithFlags(&f, cudaEventDisableTiming));
    ready_.push_back(r);
    free_.push_back(f);
  }
}

DequantAhead::~DequantAhead() {
  cudaStreamSynchronize(side_);
  for (size_t i = 0; i < slots_.size(); ++i) {
    cudaFree(slots_[i]);
    cudaEventDestroy(ready_[i]);
    cudaEventDestroy(free_[i]);
  }
  cudaStreamDestroy(side_);
}

void DequantAhead::stage(size_t index) {
  const size_t s = index % slots_.size();
  const Chunk& c = order_[index];
  // Rewritten only after the product that last read the slot (its free event; never recorded: no wait).
  ROOFLINE_CUDA_CHECK(cudaStreamWaitEvent(side_, free_[s], 0));
  dequant_rows_f16(c.w, c.r0, c.n_rows, slots_[s], side_);
  ROOFLINE_CUDA_CHECK(cudaEventRecord(ready_[s], side_));
}

void DequantAhead::begin_step() {
  in_step_ = true;
  seen_.clear();
  next_ = 0;
  taken_ = false;
  on_ = !order_.empty();
  for (size_t i = 0; on_ && i < std::min(slots_.size(), order_.size()); ++i) stage(i);
}

void DequantAhead::end_step() {
  in_step_ = false;
  // Staged chunks that were never asked for are left to finish on the side stream; the slots' events
  // keep the next step's use of them in order.
  if (!seen_.empty() && (!on_ || next_ != order_.size())) order_ = seen_;
  on_ = false;
}

const __half* DequantAhead::take(const DeviceWeight& w, int64_t r0, int64_t n_rows) {
  if (!in_step_) return nullptr;
  if ((size_t)n_rows * (size_t)w.cols > slot_elems_) return nullptr;
  Chunk c;
  c.w = w, c.r0 = r0, c.n_rows = n_rows;
  seen_.push_back(c);
  if (!on_ || next_ >= order_.size() || !order_[next_].same(w, r0, n_rows)) {
    on_ = false;  // the order changed: the rest of the step dequantizes on the main stream
    return nullptr;
  }
  const size_t s = next_ % slots_.size();
  ROOFLINE_CUDA_CHECK(cudaStreamWaitEvent(main_, ready_[s], 0));
  taken_ = true;
  return slots_[s];
}

void DequantAhead::release() {
  if (!taken_) return;
  taken_ = false;
  const size_t s = next_ % slots_.size();
  ROOFLINE_CUDA_CHECK(cudaEventRecord(free_[s], main_));
  ++next_;
  if (next_ + slots_.size() - 1 < order_.size()) stage(next_ + slots_.size() - 1);
}

}  // namespace roofline::cuda
