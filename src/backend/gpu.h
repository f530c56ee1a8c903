// GPUs as the rest of the program sees them, without CUDA headers: what devices exist, and a
// factory for the CUDA backend. In a build without -DROOFLINE_CUDA=ON there are no devices.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace roofline {

struct GpuInfo {
  int index = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;
  uint64_t total_bytes = 0, free_bytes = 0;
  int sm_count = 0;
  bool has_kernel_image = true;  // the binary was compiled for this compute capability
};

bool gpu_support_compiled();                // built with -DROOFLINE_CUDA=ON
std::vector<GpuInfo> gpu_devices();          // empty without CUDA or without a device
std::string gpu_build_info();                // "CUDA runtime 13.0, driver 13.0, archs 75;80;86;89;90" or "no CUDA"

struct GpuBackendOptions {
  int device = 0;
  int max_tokens = 512;  // most rows in one step (n_batch)
  int n_ctx = 4096;      // for the attention's split-KV scratch
};
std::unique_ptr<Backend> make_gpu_backend(const GpuBackendOptions& options);

// For tests: y[t][r] = sum_c W[r][c] x[t][c] computed by the GPU's kernels (matvec for n_tokens <= 8,
// GEMM beyond), with W uploaded in its device layout. x: [n_tokens x cols], returns [n_tokens x rows].
std::vector<float> gpu_matmul_for_test(const Weight& w, const std::vector<float>& x, int n_tokens, int device = 0);

// For tests: one row-wise op of the GPU over host rows a [n_rows x n]; b is the norm weight or the
// bias [n], or up [n_rows x n] for the SwiGLU ops. The Int8 variants return the int8 activations the
// op writes for the next product, times their block scales (n % 32 == 0); Argmax each row's index.
enum class GpuOpForTest { RmsNorm, RmsNormInt8, Swiglu, SwigluInt8, AddBias, Argmax };
std::vector<float> gpu_op_for_test(GpuOpForTest op, const std::vector<float>& a, const std::vector<float>& b, int n_rows, int n,
                                   float eps = 1e-6f, int device = 0);

// Read bandwidth of device memory in GB/s, measured with a streaming kernel (bench's roofline).
double measure_gpu_read_bandwidth(int device);

}  // namespace roofline
