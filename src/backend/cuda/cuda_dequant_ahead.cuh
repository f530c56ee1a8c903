// Prompt GEMMs with their weights dequantized ahead, on a side stream (ROOFLINE_DEQUANT_AHEAD). A prompt
// step's products each dequantize their weight (row chunks) to f16, then multiply it with cuBLAS; the two
// kernels alternate on one stream, and the dequantization (memory-bound) took a third of a qwen3-32b
// pp512 step that cuBLAS (compute-bound) could have overlapped. Here a low-priority side stream
// dequantizes the step's next weight chunks into a ring of slots while the main stream multiplies the
// current one, and the backend holds cuBLAS to fewer SMs (cublasSetSmCountTarget, once for its handle) so
// that the dequantization has SMs of its own.
//
// Which chunk comes next is learned: a step records the (weight, rows) chunks it asks for, in order, and
// the next step with prompt GEMMs stages that order ahead. A chunk that is not the one staged (another
// model path, another step shape) turns staging off for the rest of the step (its products dequantize on
// the main stream as before) and the step's order replaces the recorded one. Weights are no kernel's
// output, so dequantizing them early is always safe; each slot has a "ready" event (side -> main) and a
// "free" event (main -> side) so a slot is rewritten only after the GEMM that read it.
#pragma once

#include <cuda_fp16.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "backend/cuda/cuda_kernels.cuh"

namespace roofline::cuda {

class DequantAhead {
 public:
  // The slots a backend takes: its option (placement.h dequant_ahead_slots), or ROOFLINE_DEQUANT_AHEAD (0: off).
  static int slots_wanted(int option_slots);
  // n_slots chunks of up to slot_elems halves each, staged for products on `main`.
  DequantAhead(int n_slots, size_t slot_elems, cudaStream_t main);
  // Holds the backend's cuBLAS handle to all but 16 SMs of `device` (ROOFLINE_DEQUANT_AHEAD_SMS), which the
  // side stream's dequantization then has to itself.
  static void leave_sms(cublasHandle_t cublas, int device);
  ~DequantAhead();
  DequantAhead(const DequantAhead&) = delete;
  DequantAhead& operator=(const DequantAhead&) = delete;

  // Around one forward pass over the layers (steps without prompt GEMMs record nothing).
  void begin_step();
  void end_step();
  // The chunk's f16 rows for a product about to be enqueued on the main stream: a staged slot (the main
  // stream then waits for it; call release() after enqueueing the product), or null: the caller
  // dequantizes it itself.
  const __half* take(const DeviceWeight& w, int64_t r0, int64_t n_rows);
  // The product that read the slot take() gave is enqueued: the slot is free once it has run, and the
  // chunk the recorded order has next goes into it.
  void release();

 private:
  struct Chunk {
    DeviceWeight w;
    int64_t r0 = 0, n_rows = 0;
    bool same(const DeviceWeight& o, int64_t r, int64_t n) const { return w.data == o.data && r0 == r && n_rows == n; }
  };
  void stage(size_t index);  // order_[index] into slot index % slots

  cudaStream_t main_ = nullptr, side_ = nullptr;
  size_t slot_elems_ = 0;
  std::vector<__half*> slots_;
  std::vector<cudaEvent_t> ready_, free_;
  std::vector<Chunk> order_, seen_;
  size_t next_ = 0;        // the index in order_ the next take() should ask for
  bool in_step_ = false, on_ = false, taken_ = false;
};

}  // namespace roofline::cuda
