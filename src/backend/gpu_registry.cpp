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
std::unique_ptr<PartialSumReducer> make_gpu_reducer(const std::vector<int>&, size_t) {
  fail("this build has no GPU backend: rebuild with -DROOFLINE_CUDA=ON");
}
std::vector<float> gpu_nccl_sum_for_test(const std::vector<float>&, int, bool) {
  fail("this build has no GPU backend: rebuild with -DROOFLINE_CUDA=ON");
}
std::vector<float> gpu_matmul_for_test(const Weight&, const std::vector<float>&, int, int, bool) {
  fail("this build has no GPU backend: rebuild with -DROOFLINE_CUDA=ON");
}
std::vector<float> gpu_joined_products_for_test(const std::vector<const Weight*>&, const std::vector<float>&, int, int) {
  fail("this build has no GPU backend: rebuild with -DROOFLINE_CUDA=ON");
}
void gpu_use_int8_products_for_test(int) { fail("this build has no GPU backend: rebuild with -DROOFLINE_CUDA=ON"); }
void gpu_use_wgmma_products_for_test(int, int) { fail("this build has no GPU backend: rebuild with -DROOFLINE_CUDA=ON"); }
bool gpu_wgmma_products_available_for_test() { return false; }
void gpu_use_wgmma_experts_for_test(int) { fail("this build has no GPU backend: rebuild with -DROOFLINE_CUDA=ON"); }
void gpu_use_wgmma_bulk_for_test(int) { fail("this build has no GPU backend: rebuild with -DROOFLINE_CUDA=ON"); }
void gpu_use_wgmma_fold_for_test(int) { fail("this build has no GPU backend: rebuild with -DROOFLINE_CUDA=ON"); }
void gpu_use_wgmma_fold_q6_for_test(int) { fail("this build has no GPU backend: rebuild with -DROOFLINE_CUDA=ON"); }
void gpu_use_wgmma_mixed_for_test(int) { fail("this build has no GPU backend: rebuild with -DROOFLINE_CUDA=ON"); }
int64_t gpu_q4k_tile_gemm_calls_for_test() { fail("this build has no GPU backend: rebuild with -DROOFLINE_CUDA=ON"); }
int64_t gpu_weight_tensor_maps_for_test() { fail("this build has no GPU backend: rebuild with -DROOFLINE_CUDA=ON"); }
int64_t gpu_f16_copy_gemm_calls_for_test() { fail("this build has no GPU backend: rebuild with -DROOFLINE_CUDA=ON"); }
void gpu_set_f16_copy_min_rows_for_test(int) { fail("this build has no GPU backend: rebuild with -DROOFLINE_CUDA=ON"); }
std::vector<float> gpu_decode_ffn_for_test(const Weight&, const Weight&, const Weight&, const std::vector<float>&, const std::vector<float>&,
                                           bool, int, int, float, int) {
  fail("this build has no GPU backend: rebuild with -DROOFLINE_CUDA=ON");
}
void gpu_use_persistent_ffn_for_test(int) { fail("this build has no GPU backend: rebuild with -DROOFLINE_CUDA=ON"); }
void gpu_use_flash_decode_for_test(int) { fail("this build has no GPU backend: rebuild with -DROOFLINE_CUDA=ON"); }
void gpu_use_flash_finalize_for_test(int) { fail("this build has no GPU backend: rebuild with -DROOFLINE_CUDA=ON"); }
void gpu_use_flash_early_kv_for_test(int) { fail("this build has no GPU backend: rebuild with -DROOFLINE_CUDA=ON"); }
void gpu_use_mma_matvec_for_test(int) { fail("this build has no GPU backend: rebuild with -DROOFLINE_CUDA=ON"); }
void gpu_set_matvec_pipe_for_test(int64_t) { fail("this build has no GPU backend: rebuild with -DROOFLINE_CUDA=ON"); }
void gpu_set_matvec_q4k_rows_for_test(int) { fail("this build has no GPU backend: rebuild with -DROOFLINE_CUDA=ON"); }
void gpu_set_matvec_one_token_rows_for_test(int, int) { fail("this build has no GPU backend: rebuild with -DROOFLINE_CUDA=ON"); }
std::vector<float> gpu_moe_down_combine_for_test(const Weight&, int, const std::vector<float>&, const std::vector<int32_t>&, const std::vector<float>&,
                                                 int, int, bool, int) {
  fail("this build has no GPU backend: rebuild with -DROOFLINE_CUDA=ON");
}
int64_t gpu_flash_finalize_launches_for_test() { fail("this build has no GPU backend: rebuild with -DROOFLINE_CUDA=ON"); }
std::vector<float> gpu_expert_products_for_test(const Weight&, int, const std::vector<int32_t>&, int, const std::vector<float>&, int,
                                                int) {
  fail("this build has no GPU backend: rebuild with -DROOFLINE_CUDA=ON");
}
std::vector<int32_t> gpu_moe_route_for_test(const std::vector<float>&, int, int, const std::vector<float>&, int, int, bool, float,
                                            std::vector<float>*, int) {
  fail("this build has no GPU backend: rebuild with -DROOFLINE_CUDA=ON");
}
std::vector<float> gpu_moe_router_norm_for_test(const std::vector<float>&, int, int, const std::vector<float>&, const std::vector<float>&, float,
                                                int, bool, int) {
  fail("this build has no GPU backend: rebuild with -DROOFLINE_CUDA=ON");
}
std::vector<float> gpu_op_for_test(GpuOpForTest, const std::vector<float>&, const std::vector<float>&, int, int, float, int) {
  fail("this build has no GPU backend: rebuild with -DROOFLINE_CUDA=ON");
}
std::vector<uint16_t> gpu_producer_tiles_for_test(GpuOpForTest, bool, bool, const std::vector<float>&, const std::vector<float>&, int, int, float,
                                                  int) {
  fail("this build has no GPU backend: rebuild with -DROOFLINE_CUDA=ON");
}
void gpu_use_producer_tiles_for_test(int) { fail("this build has no GPU backend: rebuild with -DROOFLINE_CUDA=ON"); }
void gpu_use_wide_norm_rows_for_test(int) { fail("this build has no GPU backend: rebuild with -DROOFLINE_CUDA=ON"); }
int64_t gpu_producer_tiles_taken_for_test() { fail("this build has no GPU backend: rebuild with -DROOFLINE_CUDA=ON"); }
std::vector<float> gpu_chained_products_for_test(GpuChainForTest, bool, const Weight&, const Weight*, const Weight&, const std::vector<float>&,
                                                 const std::vector<float>&, const std::vector<float>&, int, float, int) {
  fail("this build has no GPU backend: rebuild with -DROOFLINE_CUDA=ON");
}
std::vector<float> gpu_delta_net_for_test(const DeltaNetDims&, const float*, const float*, const float*, const float*, float,
                                          const std::vector<GpuDeltaNetSeq>&, const float*, const float*, const float*,
                                          const float*, int, GpuDeltaNetForm, bool, std::vector<float>*, int) {
  fail("this build has no GPU backend: rebuild with -DROOFLINE_CUDA=ON");
}
bool gpu_delta_net_chunked_supported(const DeltaNetDims&, int) { return false; }
std::vector<double> gpu_delta_net_time_for_test(const DeltaNetDims&, int, int, GpuDeltaNetForm, int, int) {
  fail("this build has no GPU backend: rebuild with -DROOFLINE_CUDA=ON");
}
std::vector<float> gpu_attention_for_test(const GpuAttentionShape&, const GpuKvCacheForTest&, int, float, const StepDesc&,
                                          const std::vector<float>&, int, bool, int, std::vector<uint8_t>*) {
  fail("this build has no GPU backend: rebuild with -DROOFLINE_CUDA=ON");
}
void gpu_rope_store_for_test(const GpuAttentionShape&, const GpuRopeForTest&, const StepDesc&, std::vector<float>&, std::vector<float>&,
                             const std::vector<float>&, GpuKvCacheForTest&, int) {
  fail("this build has no GPU backend: rebuild with -DROOFLINE_CUDA=ON");
}
double gpu_attention_decode_time_for_test(const GpuAttentionShape&, DType, DType, int, int, int, int) {
  fail("this build has no GPU backend: rebuild with -DROOFLINE_CUDA=ON");
}
double measure_gpu_read_bandwidth(int) { fail("this build has no GPU backend: rebuild with -DROOFLINE_CUDA=ON"); }

}  // namespace roofline
#endif
