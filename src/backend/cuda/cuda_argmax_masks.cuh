// Constrained greedy rows (StepDesc::argmax_allowed) on the device: each such row's mask of allowed
// tokens, then one byte per row saying which rows have one, staged in pinned memory and copied for
// argmax_rows_allowed (cuda_kernels.cuh). The buffers grow on first use, outside any graph (the output
// is read after the step's graph ran).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "backend/cuda/cuda_common.cuh"

namespace roofline::cuda {

class ArgmaxMasks {
 public:
  ArgmaxMasks() = default;
  ArgmaxMasks(const ArgmaxMasks&) = delete;
  ArgmaxMasks& operator=(const ArgmaxMasks&) = delete;
  ~ArgmaxMasks() {
    if (dev_) cudaFree(dev_);
    if (host_) cudaFreeHost(host_);
  }

  // Rows i < n_rows with only[i] and a mask allowed[i] (n_vocab bits); false when no row has one.
  bool upload(const std::vector<uint8_t>& only, const std::vector<const uint64_t*>& allowed, int n_rows, int n_vocab, cudaStream_t stream) {
    bool any = false;
    for (int i = 0; i < n_rows; ++i) any = any || (only[i] && allowed[i]);
    if (!any) return false;
    const size_t words = ((size_t)n_vocab + 63) / 64;
    mask_words_ = (size_t)n_rows * words;
    const size_t bytes = mask_words_ * 8 + (size_t)n_rows;
    if (bytes > bytes_) {
      ROOFLINE_CUDA_CHECK(cudaStreamSynchronize(stream));
      if (dev_) ROOFLINE_CUDA_CHECK(cudaFree(dev_));
      if (host_) ROOFLINE_CUDA_CHECK(cudaFreeHost(host_));
      dev_ = nullptr, host_ = nullptr;
      ROOFLINE_CUDA_CHECK(cudaMalloc(&dev_, bytes));
      ROOFLINE_CUDA_CHECK(cudaMallocHost(&host_, bytes));
      bytes_ = bytes;
    }
    uint8_t* has = reinterpret_cast<uint8_t*>(host_ + mask_words_);
    for (int i = 0; i < n_rows; ++i) {
      has[i] = only[i] && allowed[i] ? 1 : 0;
      if (has[i]) std::memcpy(host_ + (size_t)i * words, allowed[i], words * 8);
    }
    ROOFLINE_CUDA_CHECK(cudaMemcpyAsync(dev_, host_, bytes, cudaMemcpyHostToDevice, stream));
    return true;
  }
  const uint64_t* masks() const { return dev_; }
  const uint8_t* has_mask() const { return reinterpret_cast<const uint8_t*>(dev_ + mask_words_); }

 private:
  uint64_t* dev_ = nullptr;   // the masks, then a byte per row: has a mask
  uint64_t* host_ = nullptr;  // pinned staging of the same
  size_t bytes_ = 0, mask_words_ = 0;
};

}  // namespace roofline::cuda
