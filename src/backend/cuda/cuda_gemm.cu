// Prefill and large-batch products: the weight is dequantized to f16 in row chunks that fit the
// scratch buffer and multiplied with cuBLAS (f16 inputs, f32 accumulation and output). cuBLAS runs
// without atomics (its default), so results are reproducible.
#include "backend/cuda/cuda_dequant.cuh"
#include "backend/cuda/cuda_kernels.cuh"

namespace roofline::cuda {

namespace {

// Float weights of any row length: one thread per element.
__global__ void float_rows_f16_kernel(DeviceWeight w, int64_t row0, int64_t n_rows, __half* out) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n_rows * w.cols) return;
  const int64_t r = i / w.cols, c = i % w.cols;
  const uint8_t* row = w.data + (row0 + r) * w.row_bytes;
  const float v = w.type == DType::F32 ? reinterpret_cast<const float*>(row)[c]
                  : w.type == DType::F16 ? ld_half(row + 2 * c) : ld_bf16(row + 2 * c);
  out[i] = __float2half(v);
}

// One thread per 32-element chunk of rows [row0, row0 + n_rows).
__global__ void dequant_rows_f16_kernel(DeviceWeight w, int64_t row0, int64_t n_rows, __half* out) {
  const int64_t chunks_per_row = w.cols / 32;
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n_rows * chunks_per_row) return;
  const int64_t r = i / chunks_per_row, c = i % chunks_per_row;
  float v[32];
  dequant_chunk32(w, row0 + r, c, v);
  union {
    int4 v4[4];
    __half h[32];
  } o;
#pragma unroll
  for (int k = 0; k < 32; ++k) o.h[k] = __float2half(v[k]);
  int4* dst = reinterpret_cast<int4*>(out + r * w.cols + c * 32);  // 64-byte aligned: cols % 32 == 0
#pragma unroll
  for (int k = 0; k < 4; ++k) dst[k] = o.v4[k];
}

// f32 -> f16, saturating at the f16 range (an activation beyond it would otherwise become inf).
__global__ void to_f16_kernel(const float* x, int64_t n, __half* out) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = __float2half(fminf(fmaxf(x[i], -65504.0f), 65504.0f));
}

}  // namespace

void gemm(cublasHandle_t cublas, const DeviceWeight& w, const float* x, int n_tokens, float* y, int ldy, bool accumulate,
          __half* scratch, size_t scratch_elems, __half* x_f16, cudaStream_t stream) {
  const int64_t n_x = (int64_t)n_tokens * w.cols;
  to_f16_kernel<<<(unsigned)((n_x + 255) / 256), 256, 0, stream>>>(x, n_x, x_f16);
  ROOFLINE_CUDA_CHECK(cudaGetLastError());
  int64_t rows_per_chunk = (int64_t)(scratch_elems / (size_t)w.cols);
  if (rows_per_chunk < 1) fail("internal error: GEMM scratch smaller than one row");
  rows_per_chunk = std::min<int64_t>(rows_per_chunk, w.rows);
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  ROOFLINE_CHECK(cublasSetStream(cublas, stream) == CUBLAS_STATUS_SUCCESS);
  for (int64_t r0 = 0; r0 < w.rows; r0 += rows_per_chunk) {
    const int64_t n_rows = std::min(rows_per_chunk, w.rows - r0);
    if (w.type == DType::F32 || w.type == DType::F16 || w.type == DType::BF16) {
      const int64_t n = n_rows * w.cols;
      float_rows_f16_kernel<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(w, r0, n_rows, scratch);
    } else {
      const int64_t n_chunks = n_rows * (w.cols / 32);
      dequant_rows_f16_kernel<<<(unsigned)((n_chunks + 127) / 128), 128, 0, stream>>>(w, r0, n_rows, scratch);
    }
    ROOFLINE_CUDA_CHECK(cudaGetLastError());
    // Column-major view: Y^T[n_rows x n_tokens] = W[n_rows x K] * X^T[K x n_tokens].
    const cublasStatus_t st = cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)n_rows, n_tokens, (int)w.cols, &alpha,
                                           scratch, CUDA_R_16F, (int)w.cols, x_f16, CUDA_R_16F, (int)w.cols, &beta,
                                           y + r0, CUDA_R_32F, ldy, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS) fail("cuBLAS GEMM failed with status {}", (int)st);
  }
}

}  // namespace roofline::cuda
