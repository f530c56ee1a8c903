// The GPU entry points in a build without CUDA: no devices, and a clear error when one is asked for.
// With -DROOFLINE_CUDA=ON the CUDA library (src/backend/cuda) defines them instead.
#ifndef ROOFLINE_WITH_CUDA
#include "backend/gpu.h"
#include "core/error.h"

namespace roofline {

bool gpu_support_compiled() { return false; }
std::vector<GpuInfo> gpu_devices() { return {}; }
std::string gpu_build_info() { return "no CUDA (build with -DROOFLINE_CUDA=ON)"; }
std::unique_ptr<Backend> make_gpu_backend(const GpuBackendOptions&) {
  fail("this build has no GPU backend: rebuild with -DROOFLINE_CUDA=ON");
}
std::vector<float> gpu_matmul_for_test(const Weight&, const std::vector<float>&, int, int) {
  fail("this build has no GPU backend: rebuild with -DROOFLINE_CUDA=ON");
}
std::vector<float> gpu_op_for_test(GpuOpForTest, const std::vector<float>&, const std::vector<float>&, int, int, float, int) {
  fail("this build has no GPU backend: rebuild with -DROOFLINE_CUDA=ON");
}
double measure_gpu_read_bandwidth(int) { fail("this build has no GPU backend: rebuild with -DROOFLINE_CUDA=ON"); }

}  // namespace roofline
#endif
