// Elementwise kernels of the CUDA backend: embedding lookup, RMSNorm fused with the int8 activation
// quantization of the next matrix product, SwiGLU (same fusion), bias add. Reductions go thread ->
// warp -> CTA in a fixed order.
#include "backend/cuda/cuda_dequant.cuh"
#include "backend/cuda/cuda_kernels.cuh"

namespace roofline::cuda {

namespace {

constexpr int kThreads = 256;

// Sum over the CTA in a fixed order (result valid in every thread).
__device__ float block_sum(float v, float* smem) {
  v = warp_sum(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  float total = 0;
  for (int i = 0; i < (int)(blockDim.x / 32); ++i) total += smem[i];
  __syncthreads();
  return total;
}

// Quantizes 32 values to int8 with d = amax/127 and writes q, d, s = d * sum(q).
__device__ __forceinline__ void quantize32(const float* v, int8_t* q, float* d_out, float* s_out) {
  float amax = 0;
#pragma unroll
  for (int k = 0; k < 32; ++k) amax = fmaxf(amax, fabsf(v[k]));
  const float d = amax / 127.0f, inv = d > 0 ? 1.0f / d : 0.0f;
  int sum = 0;
  union {
    int4 v4[2];
    int8_t b[32];
  } out;
#pragma unroll
  for (int k = 0; k < 32; ++k) {
    const int qi = __float2int_rn(v[k] * inv);
    out.b[k] = (int8_t)qi;
    sum += qi;
  }
  reinterpret_cast<int4*>(q)[0] = out.v4[0];
  reinterpret_cast<int4*>(q)[1] = out.v4[1];
  *d_out = d;
  *s_out = d * (float)sum;
}

__global__ void embed_kernel(DeviceWeight table, DeviceStep step, float* x, int n_embd) {
  const int r = blockIdx.x;
  float* xr = x + (int64_t)r * n_embd;
  if (r >= step.header[0]) {
    for (int i = threadIdx.x; i < n_embd; i += blockDim.x) xr[i] = 0.0f;
    return;
  }
  const int token = step.tokens[r];
  if (table.layout == WeightLayout::Raw && (table.type == DType::F32 || table.type == DType::F16 || table.type == DType::BF16)) {
    const uint8_t* row = table.data + (int64_t)token * table.row_bytes;
    for (int i = threadIdx.x; i < n_embd; i += blockDim.x)
      xr[i] = table.type == DType::F32 ? reinterpret_cast<const float*>(row)[i]
              : table.type == DType::F16 ? ld_half(row + 2 * i) : ld_bf16(row + 2 * i);
    return;
  }
  float v[32];
  for (int c = threadIdx.x; c < n_embd / 32; c += blockDim.x) {
    dequant_chunk32(table, token, c, v);
#pragma unroll
    for (int k = 0; k < 32; ++k) xr[c * 32 + k] = v[k];
  }
}

__global__ void rms_norm_kernel(const float* x, const float* w, float eps, int n, const int* gather, float* out, ActQ8 act) {
  __shared__ float smem[32];
  const int r = blockIdx.x;
  const float* xr = x + (int64_t)(gather ? gather[r] : r) * n;
  float ss = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
  const float scale = rsqrtf(block_sum(ss, smem) / (float)n + eps);
  for (int g = threadIdx.x; g < n / 32; g += blockDim.x) {
    float v[32];
#pragma unroll
    for (int k = 0; k < 32; ++k) v[k] = xr[g * 32 + k] * scale * w[g * 32 + k];
    if (out) {
#pragma unroll
      for (int k = 0; k < 32; ++k) out[(int64_t)r * n + g * 32 + k] = v[k];
    }
    if (act.q) {
      const int64_t gi = (int64_t)r * (n / 32) + g;
      quantize32(v, const_cast<int8_t*>(act.q) + gi * 32, const_cast<float*>(act.d) + gi, const_cast<float*>(act.s) + gi);
    }
  }
  // Tail when n is not a multiple of 32 (float output only).
  if (out)
    for (int i = (n / 32) * 32 + threadIdx.x; i < n; i += blockDim.x) out[(int64_t)r * n + i] = xr[i] * scale * w[i];
}

__global__ void quantize_rows_kernel(const float* x, int n, ActQ8 act) {
  const int r = blockIdx.x;
  for (int g = threadIdx.x; g < n / 32; g += blockDim.x) {
    float v[32];
#pragma unroll
    for (int k = 0; k < 32; ++k) v[k] = x[(int64_t)r * n + g * 32 + k];
    const int64_t gi = (int64_t)r * (n / 32) + g;
    quantize32(v, const_cast<int8_t*>(act.q) + gi * 32, const_cast<float*>(act.d) + gi, const_cast<float*>(act.s) + gi);
  }
}

__global__ void swiglu_kernel(const float* gate, const float* up, int n, float* out, ActQ8 act) {
  const int r = blockIdx.y;
  const int g = blockIdx.x * blockDim.x + threadIdx.x;
  if (g >= (n + 31) / 32) return;
  float v[32];
  const int64_t base = (int64_t)r * n + g * 32;
  const int len = min(32, n - g * 32);
  for (int k = 0; k < 32; ++k) {
    const float a = k < len ? gate[base + k] : 0.0f;
    v[k] = k < len ? a / (1.0f + __expf(-a)) * up[base + k] : 0.0f;
  }
  if (out)
    for (int k = 0; k < len; ++k) out[base + k] = v[k];
  if (act.q && len == 32) {  // int8 activations only exist for rows that are whole 32-blocks
    const int64_t gi = (int64_t)r * (n / 32) + g;
    quantize32(v, const_cast<int8_t*>(act.q) + gi * 32, const_cast<float*>(act.d) + gi, const_cast<float*>(act.s) + gi);
  }
}

__global__ void add_bias_kernel(float* y, const float* b, int n) {
  const int r = blockIdx.y;
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[(int64_t)r * n + i] += b[i];
}

}  // namespace

void embed(const DeviceWeight& table, const DeviceStep& step, float* x, int n_rows, int n_embd, cudaStream_t stream) {
  embed_kernel<<<n_rows, 128, 0, stream>>>(table, step, x, n_embd);
  ROOFLINE_CUDA_CHECK(cudaGetLastError());
}

void rms_norm(const float* x, const float* w, float eps, int n_rows, int n, const int* gather, float* out, ActQ8 act,
              cudaStream_t stream) {
  if (n_rows == 0) return;
  rms_norm_kernel<<<n_rows, kThreads, 0, stream>>>(x, w, eps, n, gather, out, act);
  ROOFLINE_CUDA_CHECK(cudaGetLastError());
}

void quantize_rows(const float* x, int n_rows, int n, ActQ8 act, cudaStream_t stream) {
  if (n_rows == 0) return;
  quantize_rows_kernel<<<n_rows, kThreads, 0, stream>>>(x, n, act);
  ROOFLINE_CUDA_CHECK(cudaGetLastError());
}

void swiglu(const float* gate, const float* up, int n_rows, int n, float* out, ActQ8 act, cudaStream_t stream) {
  if (n_rows == 0) return;
  const dim3 grid((unsigned)(((n + 31) / 32 + 127) / 128), (unsigned)n_rows);
  swiglu_kernel<<<grid, 128, 0, stream>>>(gate, up, n, out, act);
  ROOFLINE_CUDA_CHECK(cudaGetLastError());
}

void add_bias(float* y, const float* bias, int n_rows, int n, cudaStream_t stream) {
  if (!bias || n_rows == 0) return;
  const dim3 grid((unsigned)((n + 255) / 256), (unsigned)n_rows);
  add_bias_kernel<<<grid, 256, 0, stream>>>(y, bias, n);
  ROOFLINE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace roofline::cuda
