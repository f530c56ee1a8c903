// The GPU's mixture-of-experts FFN (cuda_moe.cuh): routing, expert products by id over the stacked
// tensors, SwiGLU, the weighted combine into the residual, and the gated shared expert.
#include "backend/cuda/cuda_moe.cuh"

#include <algorithm>
#include <cfloat>
#include <climits>

#include "backend/cuda/cuda_dequant.cuh"
#include "backend/cuda/cuda_kernels.cuh"

namespace roofline::cuda {
namespace {

constexpr int kMaxUsed = 32;      // experts per token the routing kernel keeps
constexpr int kWarpsPerBlock = 8;

// One warp per row: softmax over the n_expert logits, then k rounds of a warp argmax over the experts
// not yet taken (the larger logit wins, the lower index on ties), weights p / sum(top p) (normalize) or p.
__global__ void moe_route_kernel(const float* logits, int n_rows, int n_expert, int k, bool normalize, float scale,
                                 int32_t* ids, float* weights) {
  wait_for_previous_kernel();
  const int lane = threadIdx.x % 32;
  const int row = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= n_rows) return;
  const float* l = logits + (int64_t)row * n_expert;
  float mx = -FLT_MAX;
  for (int e = lane; e < n_expert; e += 32) mx = fmaxf(mx, l[e]);
  mx = warp_max(mx);
  float sum = 0;
  for (int e = lane; e < n_expert; e += 32) sum += expf(l[e] - mx);
  sum = warp_sum(sum);
  int picked[kMaxUsed];
  float p[kMaxUsed];
  float top = 0;
  for (int i = 0; i < k; ++i) {
    float best = -FLT_MAX;
    int best_e = INT_MAX;
    for (int e = lane; e < n_expert; e += 32) {
      bool taken = false;
      for (int j = 0; j < i; ++j) taken |= picked[j] == e;
      if (!taken && (l[e] > best || (l[e] == best && e < best_e))) {
        best = l[e];
        best_e = e;
      }
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, offset);
      const int oe = __shfl_xor_sync(0xffffffffu, best_e, offset);
      if (ob > best || (ob == best && oe < best_e)) {
        best = ob;
        best_e = oe;
      }
    }
    picked[i] = best_e;
    p[i] = expf(best - mx) / sum;
    top += p[i];
  }
  if (lane == 0)
    for (int i = 0; i < k; ++i) {
      ids[(int64_t)row * k + i] = picked[i];
      weights[(int64_t)row * k + i] = (normalize ? p[i] / top : p[i]) * scale;
    }
}

// y[p * R + r] = sum_c W[e_p * R + r, c] x_p[c] for pairs p < n_pairs, where e_p = ids[p] (expert 0
// without ids) and x_p the input row p (x_per_pair) or p / k (the pair's token). One warp per output
// row; each lane dequantizes whole 32-column chunks and the warp sums in a fixed order.
__global__ void moe_rows_kernel(DeviceWeight w, int64_t R, int C, const int32_t* ids, int k, const float* x, bool x_per_pair,
                                int n_pairs, float* y) {
  wait_for_previous_kernel();
  const int lane = threadIdx.x % 32;
  const int64_t r = (int64_t)blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  const int p = blockIdx.y;
  if (r >= R || p >= n_pairs) return;
  const int64_t e = ids ? ids[p] : 0;
  const float* xr = x + (int64_t)(x_per_pair ? p : p / k) * C;
  float acc = 0;
  float buf[32];
  for (int64_t chunk = lane; chunk < C / 32; chunk += 32) {
    dequant_chunk32(w, e * R + r, chunk, buf);
    const float* xc = xr + chunk * 32;
#pragma unroll
    for (int i = 0; i < 32; ++i) acc += buf[i] * xc[i];
  }
  // The columns past the last whole chunk: only float weights have rows that are not whole chunks of
  // 32 (every quantized type's block is 32 or 256 wide), read one value per lane.
  for (int64_t c = (int64_t)(C / 32) * 32 + lane; c < C; c += 32) {
    const uint8_t* rowp = w.data + (e * R + r) * w.row_bytes;
    const float v = w.type == DType::F32 ? reinterpret_cast<const float*>(rowp)[c]
                    : w.type == DType::F16 ? ld_half(rowp + 2 * c)
                                           : ld_bf16(rowp + 2 * c);
    acc += v * xr[c];
  }
  acc = warp_sum(acc);
  if (lane == 0) y[(int64_t)p * R + r] = acc;
}

// x[t, i] += sum_s weights[t, s] * y[t * k + s, i], slots in routing order.
__global__ void moe_combine_kernel(const float* y, const float* weights, int k, int n, float* x) {
  wait_for_previous_kernel();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  const int t = blockIdx.y;
  if (i >= n) return;
  float acc = 0;
  for (int s = 0; s < k; ++s) acc += weights[t * k + s] * y[((int64_t)t * k + s) * n + i];
  x[(int64_t)t * n + i] += acc;
}

// x[t] += sigmoid(gate . xn[t]) * y[t]: one block per row, the dot reduced in a fixed order.
__global__ void moe_shared_add_kernel(const float* gate, const float* xn, const float* y, int n, float* x) {
  wait_for_previous_kernel();
  __shared__ float partial[32];
  const int t = blockIdx.x;
  const float* xr = xn + (int64_t)t * n;
  float dot = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) dot += gate[i] * xr[i];
  dot = warp_sum(dot);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = dot;
  __syncthreads();
  if (threadIdx.x < 32) {
    float v = threadIdx.x < blockDim.x / 32 ? partial[threadIdx.x] : 0.0f;
    v = warp_sum(v);
    if (threadIdx.x == 0) partial[0] = v;
  }
  __syncthreads();
  const float s = 1.0f / (1.0f + expf(-partial[0]));
  for (int i = threadIdx.x; i < n; i += blockDim.x) x[(int64_t)t * n + i] += s * y[(int64_t)t * n + i];
}

// x[i] += y[i] for i < n.
__global__ void moe_add_kernel(const float* y, int64_t n, float* x) {
  wait_for_previous_kernel();
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] += y[i];
}

void rows(const DeviceWeight& w, int64_t R, int C, const int32_t* ids, int k, const float* x, bool x_per_pair, int n_pairs,
          float* y, cudaStream_t stream) {
  if (n_pairs == 0) return;
  const dim3 grid((unsigned)((R + kWarpsPerBlock - 1) / kWarpsPerBlock), (unsigned)n_pairs);
  launch(moe_rows_kernel, grid, dim3(32 * kWarpsPerBlock), 0, stream, pdl_enabled(), w, R, C, ids, k, x, x_per_pair, n_pairs, y);
}

}  // namespace

MoeFfn::MoeFfn(const HParams& hp, int max_rows, cudaStream_t stream) : hp_(hp), max_rows_(std::max(1, max_rows)) {
  (void)stream;
  if (hp.n_expert_used > kMaxUsed)
    fail("the GPU's MoE routing keeps at most {} experts per token, the model uses {}", kMaxUsed, hp.n_expert_used);
  if (hp.n_expert >= 65536 || (int64_t)max_rows_ * hp.n_expert_used >= 65536)
    fail("internal error: {} rows x {} experts per token exceed the MoE kernels' grid", max_rows_, hp.n_expert_used);
  const size_t T = (size_t)max_rows_, K = (size_t)hp.n_expert_used, H = (size_t)hp.n_embd, F = (size_t)hp.n_ff_exp,
               S = (size_t)hp.n_ff_shexp;
  auto bytes = [](size_t floats) { return (floats * 4 + 255) / 256 * 256; };
  arena_.reserve(bytes(T * hp.n_expert) + 2 * bytes(T * K) + 2 * bytes(T * K * F) + bytes(T * K * H) +
                 (S ? 2 * bytes(T * S) + bytes(T * H) : 0) + 256);
  auto take = [&](size_t floats) { return reinterpret_cast<float*>(arena_.take(floats * 4)); };
  logits_ = take(T * hp.n_expert);
  weights_ = take(T * K);
  ids_ = reinterpret_cast<int32_t*>(arena_.take(T * K * 4));
  gate_ = take(T * K * F);
  up_ = take(T * K * F);
  y_ = take(T * K * H);
  if (S) {
    shexp_gate_ = take(T * S);
    shexp_up_ = take(T * S);
    shexp_y_ = take(T * H);
  }
}

void MoeFfn::forward(const MoeLayerDev& L, const float* xn, int n, float* x, cudaStream_t stream) {
  if (n == 0) return;
  ROOFLINE_CHECK(n <= max_rows_, "internal error: {} rows exceed the MoE buffers ({})", n, max_rows_);
  const int H = hp_.n_embd, E = hp_.n_expert, k = hp_.n_expert_used, F = hp_.n_ff_exp;
  rows(*L.router, E, H, nullptr, 1, xn, true, n, logits_, stream);
  launch(moe_route_kernel, dim3((unsigned)((n + kWarpsPerBlock - 1) / kWarpsPerBlock)), dim3(32 * kWarpsPerBlock), 0, stream,
         pdl_enabled(), (const float*)logits_, n, E, k, hp_.expert_weights_norm, hp_.expert_weights_scale, ids_, weights_);
  const int pairs = n * k;
  rows(*L.gate_exps, F, H, ids_, k, xn, false, pairs, gate_, stream);
  rows(*L.up_exps, F, H, ids_, k, xn, false, pairs, up_, stream);
  swiglu(gate_, up_, pairs, F, gate_, ActQ8{}, stream);
  rows(*L.down_exps, H, F, ids_, k, gate_, true, pairs, y_, stream);
  launch(moe_combine_kernel, dim3((unsigned)((H + 255) / 256), (unsigned)n), dim3(256), 0, stream, pdl_enabled(),
         (const float*)y_, (const float*)weights_, k, H, x);
  forward_shared(L, xn, n, x, stream);
}

void MoeFfn::add_host_rows(const float* host_rows, int n, float* x, cudaStream_t stream) {
  if (n == 0) return;
  ROOFLINE_CHECK(n <= max_rows_, "internal error: {} rows exceed the MoE buffers ({})", n, max_rows_);
  const int64_t count = (int64_t)n * hp_.n_embd;
  ROOFLINE_CUDA_CHECK(cudaMemcpyAsync(y_, host_rows, (size_t)count * 4, cudaMemcpyHostToDevice, stream));
  launch(moe_add_kernel, dim3((unsigned)((count + 255) / 256)), dim3(256), 0, stream, pdl_enabled(), (const float*)y_, count, x);
}

void MoeFfn::forward_shared(const MoeLayerDev& L, const float* xn, int n, float* x, cudaStream_t stream) {
  const int H = hp_.n_embd;
  if (n == 0 || hp_.n_ff_shexp == 0 || !L.gate_shexp) return;
  const int S = hp_.n_ff_shexp;
  rows(*L.gate_shexp, S, H, nullptr, 1, xn, true, n, shexp_gate_, stream);
  rows(*L.up_shexp, S, H, nullptr, 1, xn, true, n, shexp_up_, stream);
  swiglu(shexp_gate_, shexp_up_, n, S, shexp_gate_, ActQ8{}, stream);
  rows(*L.down_shexp, H, S, nullptr, 1, shexp_gate_, true, n, shexp_y_, stream);
  launch(moe_shared_add_kernel, dim3((unsigned)n), dim3(256), 0, stream, pdl_enabled(), L.shexp_gate, xn,
         (const float*)shexp_y_, H, x);
}

}  // namespace roofline::cuda
