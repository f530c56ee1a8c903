// Weights on the device: one allocation per backend, sub-allocated with 256-byte alignment; each
// tensor uploaded in the layout its kernels read (cuda_common.cuh WeightLayout): Q8_0 and Q6_K are
// split into 16-byte-aligned planes at load, the other types keep their GGUF blocks (Q4_K's with a tensor map for the
// warpgroup kernel's bulk copies).
#pragma once

#include <vector>

#include "backend/cuda/cuda_common.cuh"
#include "model/model.h"

namespace roofline::cuda {

// Device bytes a weight takes in its device layout (rows padded to 256-byte alignment per plane).
size_t device_weight_bytes(const Weight& w);
WeightLayout device_layout_for(DType type);
bool device_supports(DType type);

class DeviceArena {
 public:
  DeviceArena() = default;
  ~DeviceArena();
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;
  void reserve(size_t bytes);  // one cudaMalloc; throws Error naming what was asked and what is free
  uint8_t* take(size_t bytes);
  size_t capacity() const { return capacity_; }
  size_t used() const { return used_; }

 private:
  uint8_t* base_ = nullptr;
  size_t capacity_ = 0, used_ = 0;
};

// Uploads (repacking on the host where the layout needs it) and returns the device view.
DeviceWeight upload_weight(const Weight& w, DeviceArena& arena, cudaStream_t stream);
// A 2-D tensor map (TMA descriptor) of `rows` Q4_K rows of row_bytes bytes at `data` on the current device: boxes of 16
// rows x 144 bytes (one super-block), in device memory where kernels read it (chunks of maps kept for the process,
// 128 bytes a map); null where the driver cannot make one (the kernels then copy the weights themselves).
const void* q4k_rows_map(const uint8_t* data, int64_t rows, size_t row_bytes);
// Q6_K's three maps (low nibbles, high bits, scales: boxes of 16 rows x 128, 64, 16 bytes), side by side; null as above.
const void* q6k_plane_maps(const DeviceWeight& w);
// Small vectors (norms, biases) as device floats.
float* upload_floats(const std::vector<float>& v, DeviceArena& arena, cudaStream_t stream);

}  // namespace roofline::cuda
