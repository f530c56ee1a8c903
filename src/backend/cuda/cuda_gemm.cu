// Products of more than 8 rows. Up to 48 rows (batched decode) with Q4_K or Q6_K weights: one fused
// kernel dequantizes a 64-row x 256-column weight tile into shared memory as f16 and multiplies it with
// the f16 activations on tensor cores (WMMA, f32 accumulation), so each weight byte is read once per
// step and nothing is written back. Otherwise (prefill, other types) the weight is dequantized to f16 in
// row chunks that fit the scratch buffer and multiplied with cuBLAS (f16 inputs, f32 accumulation). Both
// are free of atomics, so results are reproducible.
#include <mma.h>

#include <algorithm>

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

// --- Fused dequantize + tensor-core product for 9..64 rows ---
constexpr int kTileRows = 64;             // weight rows per CTA (16 per warp)
constexpr int kTileK = 256;               // columns per step: one K-quant super-block per row
constexpr int kLd = kTileK + 8;           // shared-memory row stride in halves (padding against bank conflicts)
constexpr int kMmaThreads = 128;
constexpr size_t kMmaSmem = 2 * (size_t)kTileRows * kLd * sizeof(__half);
constexpr int kMaxFusedRows = 48;

// 32 weights (sub-block j of super-block sb of `row`) as f16 into dst.
__device__ __forceinline__ void dequant_q4_k_32(const DeviceWeight& w, int64_t row, int64_t sb, int j, __half* dst) {
  const uint8_t* blk = w.data + row * w.row_bytes + sb * 144;
  union {
    int4 v;
    uint8_t b[16];
  } hdr;
  hdr.v = __ldg(reinterpret_cast<const int4*>(blk));
  union {
    int4 v[2];
    uint8_t b[32];
  } qs;
  qs.v[0] = __ldg(reinterpret_cast<const int4*>(blk + 16 + 32 * (j / 2)));
  qs.v[1] = __ldg(reinterpret_cast<const int4*>(blk + 32 + 32 * (j / 2)));
  __half2 dm;
  memcpy(&dm, hdr.b, 4);
  int sc, m;
  k4_scale_min(j, hdr.b + 4, sc, m);
  const float d = __low2float(dm) * (float)sc, mn = __high2float(dm) * (float)m;
  const int shift = (j % 2) * 4;
  union {
    int4 v[4];
    __half h[32];
  } out;
#pragma unroll
  for (int e = 0; e < 32; ++e) out.h[e] = __float2half(d * (float)((qs.b[e] >> shift) & 0xF) - mn);
  int4* o = reinterpret_cast<int4*>(dst);
#pragma unroll
  for (int k = 0; k < 4; ++k) o[k] = out.v[k];
}

// The same for Q6_K in planes (see cuda_weights.cu): lane layout as the matvec kernel.
__device__ __forceinline__ void dequant_q6_k_32(const DeviceWeight& w, int64_t row, int64_t sb, int j, __half* dst) {
  const int64_t n_sb = w.cols / 256;
  union {
    int4 v;
    uint8_t b[16];
  } lo;
  lo.v = __ldg(reinterpret_cast<const int4*>(w.data + row * (w.cols / 2) + sb * 128 + 16 * j));
  union {
    int2 v;
    uint8_t b[8];
  } hi;
  hi.v = __ldg(reinterpret_cast<const int2*>(w.plane1 + row * (w.cols / 4) + sb * 64 + 8 * j));
  const int8_t* sc = reinterpret_cast<const int8_t*>(w.plane2) + row * (w.cols / 16) + sb * 16 + 2 * j;
  const float d = ld_half(w.plane3 + (row * n_sb + sb) * 2);
  const float d0 = d * (float)sc[0], d1 = d * (float)sc[1];
  union {
    int4 v[4];
    __half h[32];
  } out;
#pragma unroll
  for (int t = 0; t < 16; ++t) {
    const int h0 = (hi.b[t % 4] >> (2 * (t / 4))) & 3, h1 = (hi.b[4 + t % 4] >> (2 * (t / 4))) & 3;
    out.h[t] = __float2half(d0 * (float)(((lo.b[t] & 0xF) | (h0 << 4)) - 32));
    out.h[16 + t] = __float2half(d1 * (float)(((lo.b[t] >> 4) | (h1 << 4)) - 32));
  }
  int4* o = reinterpret_cast<int4*>(dst);
#pragma unroll
  for (int k = 0; k < 4; ++k) o[k] = out.v[k];
}

// y[t * ldy + r] (+)= W[r, :] . x[t, :] for t < n_tok (NT = ceil(n_tok / 16) <= 4 token fragments).
// CTA: 64 weight rows (warp w: rows 16w..16w+15) x all tokens; per K step the weight tile is dequantized
// into shared memory and the activation tile copied next to it; then 16 WMMA k-steps.
// grid.y splits the columns (split-K, for parallelism on small matrices): with more than one split each
// CTA writes its partial sums to part[(split * n_tok + t) * rows + r] and split_k_reduce_kernel adds
// them in split order.
template <DType T, int NT>
__global__ void __launch_bounds__(kMmaThreads) dequant_mma_kernel(DeviceWeight w, const __half* x, int n_tok, float* y, int ldy,
                                                                 bool accumulate, float* part) {
  using namespace nvcuda;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __half* w_s = reinterpret_cast<__half*>(smem_raw);
  __half* x_s = w_s + kTileRows * kLd;
  const int tid = threadIdx.x, warp = tid / 32;
  const int64_t row0 = (int64_t)blockIdx.x * kTileRows;
  const int64_t n_sb = w.cols / kTileK;
  const int64_t sb_begin = n_sb * blockIdx.y / gridDim.y, sb_end = n_sb * (blockIdx.y + 1) / gridDim.y;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[NT];
#pragma unroll
  for (int f = 0; f < NT; ++f) wmma::fill_fragment(acc[f], 0.0f);
  for (int64_t sb = sb_begin; sb < sb_end; ++sb) {
    __syncthreads();
    // Weight tile: 64 rows x 8 sub-blocks of 32.
    for (int u = tid; u < kTileRows * 8; u += kMmaThreads) {
      const int r = u / 8, j = u % 8;
      __half* dst = w_s + r * kLd + 32 * j;
      if (row0 + r < w.rows) {
        if constexpr (T == DType::Q4_K) dequant_q4_k_32(w, row0 + r, sb, j, dst);
        else dequant_q6_k_32(w, row0 + r, sb, j, dst);
      } else {
        int4* o = reinterpret_cast<int4*>(dst);
#pragma unroll
        for (int k = 0; k < 4; ++k) o[k] = make_int4(0, 0, 0, 0);
      }
    }
    // Activation tile: NT*16 tokens x 256 columns (16 halves per int4), zero past n_tok.
    for (int u = tid; u < NT * 16 * (kTileK / 8); u += kMmaThreads) {
      const int t = u / (kTileK / 8), c = u % (kTileK / 8);
      int4 v = make_int4(0, 0, 0, 0);
      if (t < n_tok) v = __ldg(reinterpret_cast<const int4*>(x + (int64_t)t * w.cols + sb * kTileK) + c);
      reinterpret_cast<int4*>(x_s + t * kLd)[c] = v;
    }
    __syncthreads();
#pragma unroll 4
    for (int k = 0; k < kTileK; k += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a;
      wmma::load_matrix_sync(a, w_s + (warp * 16) * kLd + k, kLd);
#pragma unroll
      for (int f = 0; f < NT; ++f) {
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> b;
        wmma::load_matrix_sync(b, x_s + (f * 16) * kLd + k, kLd);
        wmma::mma_sync(acc[f], a, b, acc[f]);
      }
    }
  }
  __syncthreads();
  // Stage each warp's 16 x (NT*16) results (column-major: element (m, n) at n*16 + m) in the weight tile's
  // space, then write them out.
  float* stage = reinterpret_cast<float*>(smem_raw) + warp * (NT * 256);
#pragma unroll
  for (int f = 0; f < NT; ++f) wmma::store_matrix_sync(stage + f * 256, acc[f], 16, wmma::mem_col_major);
  __syncwarp();
  const int lane = tid % 32;
  for (int e = lane; e < NT * 256; e += 32) {
    const int n = e / 16, m = e % 16;
    const int64_t r = row0 + warp * 16 + m;
    if (n < n_tok && r < w.rows) {
      if (gridDim.y > 1) {
        part[((int64_t)blockIdx.y * n_tok + n) * w.rows + r] = stage[e];
      } else {
        float* dst = y + (int64_t)n * ldy + r;
        *dst = accumulate ? *dst + stage[e] : stage[e];
      }
    }
  }
}

__global__ void split_k_reduce_kernel(const float* part, int splits, int n_tok, int64_t rows, float* y, int ldy, bool accumulate) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n_tok * rows) return;
  const int64_t n = i / rows, r = i % rows;
  float sum = 0;
  for (int s = 0; s < splits; ++s) sum += part[((int64_t)s * n_tok + n) * rows + r];
  float* dst = y + n * ldy + r;
  *dst = accumulate ? *dst + sum : sum;
}

template <DType T, int NT>
void launch_dequant_mma_nt(const DeviceWeight& w, const __half* x, int n_tok, float* y, int ldy, bool accumulate, float* part,
                           size_t part_floats, cudaStream_t stream) {
  static bool configured = false;  // one per kernel instantiation (the attribute belongs to the function)
  if (!configured) {
    ROOFLINE_CUDA_CHECK(cudaFuncSetAttribute(dequant_mma_kernel<T, NT>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kMmaSmem));
    configured = true;
  }
  // Enough CTAs for every SM to hold a few (about 4 x 132 on an H200), at least 2 super-blocks per split,
  // and partial sums that fit the scratch.
  const int64_t tiles = (w.rows + kTileRows - 1) / kTileRows, n_sb = w.cols / kTileK;
  int64_t splits = std::max<int64_t>(1, (528 + tiles - 1) / tiles);
  splits = std::min<int64_t>({splits, std::max<int64_t>(1, n_sb / 2), 16,
                              (int64_t)(part_floats / ((size_t)n_tok * (size_t)w.rows))});
  splits = std::max<int64_t>(splits, 1);
  dequant_mma_kernel<T, NT><<<dim3((unsigned)tiles, (unsigned)splits), kMmaThreads, kMmaSmem, stream>>>(w, x, n_tok, y, ldy,
                                                                                                      accumulate, part);
  ROOFLINE_CUDA_CHECK(cudaGetLastError());
  if (splits > 1) {
    const int64_t n = (int64_t)n_tok * w.rows;
    split_k_reduce_kernel<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(part, (int)splits, n_tok, w.rows, y, ldy, accumulate);
    ROOFLINE_CUDA_CHECK(cudaGetLastError());
  }
}

template <DType T>
void launch_dequant_mma(const DeviceWeight& w, const __half* x, int n_tok, float* y, int ldy, bool accumulate, float* part,
                        size_t part_floats, cudaStream_t stream) {
  switch ((n_tok + 15) / 16) {
    case 1: launch_dequant_mma_nt<T, 1>(w, x, n_tok, y, ldy, accumulate, part, part_floats, stream); break;
    case 2: launch_dequant_mma_nt<T, 2>(w, x, n_tok, y, ldy, accumulate, part, part_floats, stream); break;
    default: launch_dequant_mma_nt<T, 3>(w, x, n_tok, y, ldy, accumulate, part, part_floats, stream); break;  // <= 48 rows
  }
}

}  // namespace

bool gemm_fuses_dequant(const DeviceWeight& w, int n_tokens) {
  // Measured on an H200 (qwen3-32b Q4_K_M, batched decode): 301 vs 244 tok/s at 16 rows, 658 vs 684 at
  // 64, so the fused kernel takes up to 48 rows and cuBLAS the rest.
  if (n_tokens < 1 || n_tokens > kMaxFusedRows || w.cols % kTileK != 0) return false;
  return (w.type == DType::Q4_K && w.layout == WeightLayout::Raw) || (w.type == DType::Q6_K && w.layout == WeightLayout::Q6KPlanes);
}

void gemm(cublasHandle_t cublas, const DeviceWeight& w, const float* x, int n_tokens, float* y, int ldy, bool accumulate,
          __half* scratch, size_t scratch_elems, __half* x_f16, cudaStream_t stream) {
  const int64_t n_x = (int64_t)n_tokens * w.cols;
  to_f16_kernel<<<(unsigned)((n_x + 255) / 256), 256, 0, stream>>>(x, n_x, x_f16);
  ROOFLINE_CUDA_CHECK(cudaGetLastError());
  if (gemm_fuses_dequant(w, n_tokens)) {
    // The dequantization scratch is free in this path: it holds the split-K partial sums.
    float* part = reinterpret_cast<float*>(scratch);
    const size_t part_floats = scratch_elems / 2;
    if (w.type == DType::Q4_K) launch_dequant_mma<DType::Q4_K>(w, x_f16, n_tokens, y, ldy, accumulate, part, part_floats, stream);
    else launch_dequant_mma<DType::Q6_K>(w, x_f16, n_tokens, y, ldy, accumulate, part, part_floats, stream);
    return;
  }
  int64_t rows_per_chunk = (int64_t)(scratch_elems / (size_t)w.cols);
  if (rows_per_chunk < 1) fail("internal error: GEMM scratch smaller than one row");
  // Whole multiples of 256 rows per chunk: an odd chunk misaligns the output columns and cuBLAS then
  // falls back to slow pre-Hopper kernels (measured 10x slower on an H200).
  if (rows_per_chunk >= 512) rows_per_chunk = rows_per_chunk / 256 * 256;
  rows_per_chunk = std::min<int64_t>(rows_per_chunk, w.rows);
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
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
