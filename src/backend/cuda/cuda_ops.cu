// Elementwise kernels of the CUDA backend: embedding lookup, RMSNorm fused with the int8 activation
// quantization of the next matrix product, SwiGLU (same fusion), gated attention's Q/gate split and
// output gate (same fusion), bias add, and the greedy argmax of logit rows. Reductions go thread -> warp -> CTA in a fixed order.
#include <algorithm>
#include <cstdlib>

#include "backend/cuda/cuda_dequant.cuh"
#include "backend/cuda/cuda_kernels.cuh"

namespace roofline::cuda {

namespace {

__global__ void embed_kernel(DeviceWeight table, DeviceStep step, float* x, int n_embd) {
  wait_for_previous_kernel();
  const int r = blockIdx.x;
  float* xr = x + (int64_t)r * n_embd;
  if (r >= step.header[kStepRealRows]) {
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

// One CTA per row: the sum of squares, then one warp per 32-element group (lane = element, so every
// access is coalesced) writing the normalized row and/or its int8 form.
__global__ void rms_norm_kernel(const float* x, const float* w, float eps, int n, const int* gather, float* out, ActQ8 act) {
  wait_for_previous_kernel();
  __shared__ float smem[32];
  const int r = blockIdx.x;
  const float* xr = x + (int64_t)(gather ? gather[r] : r) * n;
  float ss = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
  const float scale = rsqrtf(block_sum(ss, smem) / (float)n + eps);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, n_warps = blockDim.x / 32;
  for (int g = warp; g < (n + 31) / 32; g += n_warps) {
    const int i = g * 32 + lane;
    const float v = i < n ? xr[i] * scale * w[i] : 0.0f;
    if (out && i < n) out[(int64_t)r * n + i] = v;
    if (act.q && g < n / 32) {
      const int64_t gi = (int64_t)r * (n / 32) + g;
      warp_quantize32(v, lane, const_cast<int8_t*>(act.q) + gi * 32, const_cast<float*>(act.d) + gi, const_cast<float*>(act.s) + gi);
    }
  }
}

// Prompt-sized steps without int8 output: a CTA per row, 16-byte loads, the row held in registers between
// its sum of squares and the scaled write (the one-element-a-thread kernel above moved ~1.7 TB/s). out16:
// the same values as f16 (saturated, as the GEMMs' input conversion makes them), for the prompt GEMMs; tiles: the
// same f16 values as the warpgroup kernel's activation tiles (grid: tiles.n_pad rows, those past n_rows write zeros).
// Wide launches (grid.y > 1: ROOFLINE_NORM_WIDE_ROWS, decode batches of 9-64 rows): CTA (r, c) sums the whole row as
// the one CTA of the row does (the same loads, the same order: the same scale) and writes only the row's c-th run of
// 256 float4, so a row's writes are spread over its runs' CTAs.
constexpr int kNormRowThreads = 256, kNormRowVec = 8;  // rows of up to 8192 values
__global__ void __launch_bounds__(kNormRowThreads) rms_norm_rows_kernel(const float* x, const float* w, float eps, int n, const int* gather,
                                                                       float* out, __half* out16, WgTiles tiles, int n_rows) {
  wait_for_previous_kernel();
  __shared__ float smem[32];
  const int r = blockIdx.x, n4 = n / 4;
  const int only = gridDim.y > 1 ? (int)blockIdx.y : -1;  // the one run k this CTA writes, or every run
  if (r >= n_rows) {  // a padded token of the tiles
    for (int i = threadIdx.x; i < n4; i += kNormRowThreads)
      if (only < 0 || i / kNormRowThreads == only) wg_tiles_store4(tiles, 4 * (int64_t)i, r, make_float4(0.0f, 0.0f, 0.0f, 0.0f));
    return;
  }
  const float4* x4 = reinterpret_cast<const float4*>(x + (int64_t)(gather ? gather[r] : r) * n);
  float4 v[kNormRowVec];
  float ss = 0;
#pragma unroll
  for (int k = 0; k < kNormRowVec; ++k) {
    const int i = threadIdx.x + k * kNormRowThreads;
    v[k] = i < n4 ? x4[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    ss += v[k].x * v[k].x + v[k].y * v[k].y + v[k].z * v[k].z + v[k].w * v[k].w;
  }
  const float scale = rsqrtf(block_sum(ss, smem) / (float)n + eps);
  const float4* w4 = reinterpret_cast<const float4*>(w);
  float4* o4 = out ? reinterpret_cast<float4*>(out + (int64_t)r * n) : nullptr;
  uint2* h4 = out16 ? reinterpret_cast<uint2*>(out16 + (int64_t)r * n) : nullptr;
#pragma unroll
  for (int k = 0; k < kNormRowVec; ++k) {
    const int i = threadIdx.x + k * kNormRowThreads;
    if (i < n4 && (only < 0 || k == only)) {
      const float4 wi = w4[i];
      const float4 y = make_float4(v[k].x * scale * wi.x, v[k].y * scale * wi.y, v[k].z * scale * wi.z, v[k].w * scale * wi.w);
      if (o4) o4[i] = y;
      if (h4) h4[i] = f16x4_saturated(y);
      if (tiles.out) wg_tiles_store4(tiles, 4 * (int64_t)i, r, y);
    }
  }
}

// Decode-sized steps (a few rows): grid (groups / 8, rows) of 256 threads, each CTA summing the whole
// row's squares (from the L2, 16 B per load, all of a thread's loads in flight at once) and writing
// eight of its 32-element groups, one per warp: one round trip instead of the single CTA's chain of
// loop iterations (~9 us for a 5120-wide row on an H200, measured with ncu).
__global__ void rms_norm_wide_kernel(const float* x, const float* w, float eps, int n, const int* gather, float* out, ActQ8 act) {
  const int lane = threadIdx.x % 32;
  const int g = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int col = g * 32 + lane;
  // The norm weight is no kernel's output: loaded before the wait (from memory, while the kernel before
  // still runs), off the chain of the row's sum.
  const float wi = col < n ? w[col] : 0.0f;
  wait_for_previous_kernel();
  __shared__ float smem[32];
  const int r = blockIdx.y;
  const float* xr = x + (int64_t)(gather ? gather[r] : r) * n;
  float ss = 0;
  if (n % 4 == 0) {
    const float4* x4 = reinterpret_cast<const float4*>(xr);
#pragma unroll 8
    for (int i = threadIdx.x; i < n / 4; i += blockDim.x) {
      ss = add_squares(ss, x4[i]);
    }
  } else {
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
  }
  const float scale = rsqrtf(block_sum(ss, smem) / (float)n + eps);
  if (g >= (n + 31) / 32) return;
  const float v = col < n ? xr[col] * scale * wi : 0.0f;
  if (out && col < n) out[(int64_t)r * n + col] = v;
  if (act.q && g < n / 32) {
    const int64_t gi = (int64_t)r * (n / 32) + g;
    warp_quantize32(v, lane, const_cast<int8_t*>(act.q) + gi * 32, const_cast<float*>(act.d) + gi, const_cast<float*>(act.s) + gi);
  }
}

// Gemma 3's post-norm and residual, optionally with the next pre-norm, for decode-sized steps: one CTA of
// kPostNormThreads per row holds the row's y, x and weights in registers (kPostNormVec float4 each per
// thread), so the three steps take one round trip of loads: x += rmsnorm(y) * w; then, with w2,
// out2 = rmsnorm(x) * w2 and its int8 form (a group of 32 spans 8 lanes: each lane quantizes its 4 values
// with the group's amax, as warp_quantize32). Products are rounded as the separate kernels round them.
constexpr int kPostNormThreads = 1024, kPostNormVec = 2;

__global__ void __launch_bounds__(kPostNormThreads) post_norm_add_kernel(const float* y, const float* w, float eps, int n, float* x,
                                                                       const float* w2, float* out2, ActQ8 act2) {
  __shared__ float smem[32];
  const int r = blockIdx.x, n4 = n / 4;
  const float4* y4 = reinterpret_cast<const float4*>(y + (int64_t)r * n);
  float4* x4 = reinterpret_cast<float4*>(x + (int64_t)r * n);
  const float4* w4 = reinterpret_cast<const float4*>(w);
  const float4* v4 = reinterpret_cast<const float4*>(w2);
  float4 yv[kPostNormVec], xv[kPostNormVec], wv[kPostNormVec], w2v[kPostNormVec];
  const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int k = 0; k < kPostNormVec; ++k) {  // the norm weights before the wait: no kernel writes them
    const int i = threadIdx.x + k * kPostNormThreads;
    wv[k] = i < n4 ? w4[i] : zero;
    w2v[k] = i < n4 && w2 ? v4[i] : zero;
  }
  wait_for_previous_kernel();
  float ss = 0;
#pragma unroll
  for (int k = 0; k < kPostNormVec; ++k) {
    const int i = threadIdx.x + k * kPostNormThreads;
    const bool ok = i < n4;
    yv[k] = ok ? y4[i] : zero;
    xv[k] = ok ? x4[i] : zero;
    ss += yv[k].x * yv[k].x + yv[k].y * yv[k].y + yv[k].z * yv[k].z + yv[k].w * yv[k].w;
  }
  const float scale = rsqrtf(block_sum(ss, smem) / (float)n + eps);
  auto add = [&](float xo, float yo, float wo) { return __fadd_rn(xo, __fmul_rn(__fmul_rn(yo, scale), wo)); };
  float ss2 = 0;
#pragma unroll
  for (int k = 0; k < kPostNormVec; ++k) {
    xv[k] = make_float4(add(xv[k].x, yv[k].x, wv[k].x), add(xv[k].y, yv[k].y, wv[k].y), add(xv[k].z, yv[k].z, wv[k].z),
                        add(xv[k].w, yv[k].w, wv[k].w));
    const int i = threadIdx.x + k * kPostNormThreads;
    if (i < n4) x4[i] = xv[k];
    ss2 += xv[k].x * xv[k].x + xv[k].y * xv[k].y + xv[k].z * xv[k].z + xv[k].w * xv[k].w;
  }
  if (!w2) return;
  const float scale2 = rsqrtf(block_sum(ss2, smem) / (float)n + eps);
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int k = 0; k < kPostNormVec; ++k) {
    const int i = threadIdx.x + k * kPostNormThreads;  // values 4i..4i+3; lanes 8j..8j+7 hold group 4k+j of the warp's 128
    const float o[4] = {xv[k].x * scale2 * w2v[k].x, xv[k].y * scale2 * w2v[k].y, xv[k].z * scale2 * w2v[k].z, xv[k].w * scale2 * w2v[k].w};
    if (i < n4 && out2) reinterpret_cast<float4*>(out2 + (int64_t)r * n)[i] = make_float4(o[0], o[1], o[2], o[3]);
    if (!act2.q) continue;
    const bool whole = 32 * (i / 8) < n / 32 * 32;  // (every lane shuffles; only whole groups are written)
    float amax = fmaxf(fmaxf(fabsf(o[0]), fabsf(o[1])), fmaxf(fabsf(o[2]), fabsf(o[3])));
#pragma unroll
    for (int off = 1; off < 8; off <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
    const float d = amax / 127.0f, inv = d > 0 ? 1.0f / d : 0.0f;
    int q[4], sum = 0;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      q[e] = __float2int_rn(o[e] * inv);
      sum += q[e];
    }
#pragma unroll
    for (int off = 1; off < 8; off <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    if (!whole) continue;
    const int64_t gi = (int64_t)r * (n / 32) + i / 8;
    const char4 packed = make_char4((signed char)q[0], (signed char)q[1], (signed char)q[2], (signed char)q[3]);
    reinterpret_cast<char4*>(const_cast<int8_t*>(act2.q) + (int64_t)r * n)[i] = packed;
    if (lane % 8 == 0) {
      const_cast<float*>(act2.d)[gi] = d;
      const_cast<float*>(act2.s)[gi] = d * (float)sum;
    }
  }
}

// One warp per 32-element group of a row (grid.y = rows).
// Row r reads x's row gather[r] (r without gather).
__global__ void quantize_rows_kernel(const float* x, int n, const int32_t* gather, ActQ8 act) {
  wait_for_previous_kernel();
  const int r = blockIdx.y;
  const int g = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (g >= n / 32) return;
  const int64_t src = gather ? gather[r] : r;
  const float v = x[src * n + g * 32 + lane];
  const int64_t gi = (int64_t)r * (n / 32) + g;
  warp_quantize32(v, lane, const_cast<int8_t*>(act.q) + gi * 32, const_cast<float*>(act.d) + gi, const_cast<float*>(act.s) + gi);
}

// act(gate) * up (gated_value), one warp per 32-element group (grid.y = rows), with the int8 form of whole groups.
template <GateAct kAct>
__global__ void gated_product_kernel(const float* gate, const float* up, int n, float* out, ActQ8 act, __half* out16) {
  wait_for_previous_kernel();
  const int r = blockIdx.y;
  const int g = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (g >= (n + 31) / 32) return;
  const int i = g * 32 + lane;
  const int64_t at = (int64_t)r * n + i;
  float v = 0.0f;
  if (i < n) v = gated_value<kAct>(gate[at], up[at]);
  if (out && i < n) out[at] = v;
  if (out16 && i < n) out16[at] = saturated_half(v);
  if (act.q && g < n / 32) {  // int8 activations only exist for rows that are whole 32-blocks
    const int64_t gi = (int64_t)r * (n / 32) + g;
    warp_quantize32(v, lane, const_cast<int8_t*>(act.q) + gi * 32, const_cast<float*>(act.d) + gi, const_cast<float*>(act.s) + gi);
  }
}

// The f16 output alone (prompt steps: down's input), eight values a thread with 16-byte accesses (the
// warp-per-group kernel above moved ~1.8 TB/s for a qwen3-8b pp512 step). n_total % 8 == 0.
template <GateAct kAct>
__global__ void gated_f16_kernel(const float* gate, const float* up, int64_t n_total, __half* out16) {
  wait_for_previous_kernel();
  const int64_t i = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
  if (i >= n_total) return;
  const float4 g0 = reinterpret_cast<const float4*>(gate + i)[0], g1 = reinterpret_cast<const float4*>(gate + i)[1];
  const float4 u0 = reinterpret_cast<const float4*>(up + i)[0], u1 = reinterpret_cast<const float4*>(up + i)[1];
  const float4 a = make_float4(gated_value<kAct>(g0.x, u0.x), gated_value<kAct>(g0.y, u0.y), gated_value<kAct>(g0.z, u0.z),
                               gated_value<kAct>(g0.w, u0.w));
  const float4 b = make_float4(gated_value<kAct>(g1.x, u1.x), gated_value<kAct>(g1.y, u1.y), gated_value<kAct>(g1.z, u1.z),
                               gated_value<kAct>(g1.w, u1.w));
  *reinterpret_cast<int4*>(out16 + i) = f16x8_saturated(a, b);
}

// Gated attention's Q projection holds [q_h | gate_h] per head: split into q and gate rows
// [n_head x hd] each (grid: rows x heads).
__global__ void split_q_gate_kernel(const float* q_full, int n_head, int hd, float* q, float* gate) {
  wait_for_previous_kernel();
  const int r = blockIdx.x, h = blockIdx.y;
  const float* src = q_full + ((int64_t)r * n_head + h) * 2 * hd;
  const int64_t dst = ((int64_t)r * n_head + h) * hd;
  for (int i = threadIdx.x; i < hd; i += blockDim.x) {
    q[dst + i] = src[i];
    gate[dst + i] = src[hd + i];
  }
}

__global__ void add_values_kernel(float* y, const float* x, int64_t n) {
  wait_for_previous_kernel();
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] += x[i];
}

__global__ void scale_values_kernel(float* x, int64_t n, float s) {
  wait_for_previous_kernel();
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= s;
}

__global__ void softcap_kernel(float* x, int64_t n, float cap) {
  wait_for_previous_kernel();
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = cap * tanhf(x[i] / cap);
}

__global__ void add_bias_kernel(float* y, const float* b, int n) {
  wait_for_previous_kernel();
  const int r = blockIdx.y;
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[(int64_t)r * n + i] += b[i];
}

// A row's argmax in chunks (argmax_rows): CTA (c, r) takes chunk c of row r, each thread the best (value,
// index) of its strided elements, then the CTA's best through `argmax_better`; the last CTA of a row to arrive
// (a counter per row, left at zero again) takes the chunks' bests. A larger value wins, an equal one the lower
// index; NaNs are never picked (e > v is false for them), so the order of the merges does not change the result.
// Rows with a mask (allowed != nullptr and has_mask[row]: bits allowed[row * words ..]) consider only the allowed
// tokens and give -1 when none has a value above -inf (argmax_allowed on the host); the others are
// argmax_logits: 0 where the first value is NaN (the CPU's scan never moves off it) or where every value is -inf.
__device__ __forceinline__ bool argmax_better(float av, int ai, float bv, int bi) {
  return bi >= 0 && (ai < 0 || bv > av || (bv == av && bi < ai));
}

__device__ __forceinline__ void argmax_warp(float& v, int& idx) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, offset);
    const int oi = __shfl_xor_sync(0xffffffffu, idx, offset);
    if (argmax_better(v, idx, ov, oi)) v = ov, idx = oi;
  }
}

__global__ void __launch_bounds__(kArgmaxThreads) argmax_rows_kernel(const float* x, int n, int chunk, const uint64_t* allowed,
                                                                     const uint8_t* has_mask, int words, ArgmaxScratch scratch,
                                                                     int32_t* out) {
  wait_for_previous_kernel();
  __shared__ float best_v[kArgmaxThreads / 32];
  __shared__ int best_i[kArgmaxThreads / 32];
  const int r = blockIdx.y, c = blockIdx.x, n_chunks = gridDim.x;
  const float* row = x + (int64_t)r * n;
  const bool masked = allowed && has_mask[r] != 0;
  const uint64_t* m = masked ? allowed + (int64_t)r * words : nullptr;
  float v = -INFINITY;
  int idx = -1;
  const int end = min(n, (c + 1) * chunk);
#pragma unroll 4
  for (int i = c * chunk + (int)threadIdx.x; i < end; i += kArgmaxThreads) {
    const float e = row[i];
    if (e > v && (!masked || ((m[i >> 6] >> (i & 63)) & 1))) v = e, idx = i;  // strided ascending: the first of equals
  }
  argmax_warp(v, idx);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) best_v[warp] = v, best_i[warp] = idx;
  __syncthreads();
  if (warp != 0) return;
  v = lane < kArgmaxThreads / 32 ? best_v[lane] : -INFINITY;
  idx = lane < kArgmaxThreads / 32 ? best_i[lane] : -1;
  argmax_warp(v, idx);
  if (n_chunks > 1) {
    int last = 0;
    if (lane == 0) {
      scratch.v[(int64_t)r * kArgmaxMaxChunks + c] = v;
      scratch.i[(int64_t)r * kArgmaxMaxChunks + c] = idx;
      __threadfence();
      last = atomicAdd(scratch.counters + r, 1) == n_chunks - 1;
    }
    if (!__shfl_sync(0xffffffffu, last, 0)) return;
    __threadfence();
    v = -INFINITY, idx = -1;
    for (int k = lane; k < n_chunks; k += 32) {
      const float kv = __ldcg(scratch.v + (int64_t)r * kArgmaxMaxChunks + k);
      const int ki = __ldcg(scratch.i + (int64_t)r * kArgmaxMaxChunks + k);
      if (argmax_better(v, idx, kv, ki)) v = kv, idx = ki;
    }
    argmax_warp(v, idx);
  }
  if (lane == 0) {
    if (!masked && (idx < 0 || row[0] != row[0])) idx = 0;
    out[r] = idx;
    if (n_chunks > 1) scratch.counters[r] = 0;
  }
}

}  // namespace

// Chunks of at least kArgmaxMinChunk values, at most kArgmaxMaxChunks a row: a row of 152k logits is read by 64
// CTAs at once instead of one CTA's 1024 threads walking it (~35 us a step on an H100 from the L2).
// ROOFLINE_ARGMAX_CHUNKS=N caps the chunks a row at N (1: one CTA a row), to measure them.
int argmax_max_chunks() {
  static const int v = [] {
    const char* e = std::getenv("ROOFLINE_ARGMAX_CHUNKS");
    return e ? std::max(1, std::min(kArgmaxMaxChunks, std::atoi(e))) : kArgmaxMaxChunks;
  }();
  return v;
}

void argmax_rows(const float* x, int n_rows, int n, ArgmaxScratch scratch, int32_t* out, cudaStream_t stream) {
  argmax_rows_allowed(x, n_rows, n, nullptr, nullptr, scratch, out, stream);
}

void argmax_rows_allowed(const float* x, int n_rows, int n, const uint64_t* allowed, const uint8_t* has_mask, ArgmaxScratch scratch,
                         int32_t* out, cudaStream_t stream) {
  if (n_rows == 0) return;
  const int n_chunks = std::max(1, std::min(argmax_max_chunks(), (n + kArgmaxMinChunk - 1) / kArgmaxMinChunk));
  const int chunk = (n + n_chunks - 1) / n_chunks;
  launch(argmax_rows_kernel, dim3(n_chunks, n_rows), dim3(kArgmaxThreads), 0, stream, pdl_enabled(), x, n, chunk, allowed, has_mask,
         (n + 63) / 64, scratch, out);
}

size_t argmax_scratch_bytes(int max_rows) { return (size_t)max_rows * (kArgmaxMaxChunks * 8 + 4); }

ArgmaxScratch argmax_scratch_at(void* base, int max_rows, cudaStream_t stream) {
  ArgmaxScratch s;
  s.v = static_cast<float*>(base);
  s.i = reinterpret_cast<int*>(s.v + (size_t)max_rows * kArgmaxMaxChunks);
  s.counters = s.i + (size_t)max_rows * kArgmaxMaxChunks;
  ROOFLINE_CUDA_CHECK(cudaMemsetAsync(s.counters, 0, (size_t)max_rows * 4, stream));
  return s;
}

void embed(const DeviceWeight& table, const DeviceStep& step, float* x, int n_rows, int n_embd, cudaStream_t stream) {
  launch(embed_kernel, dim3(n_rows), dim3(128), 0, stream, pdl_enabled(), table, step, x, n_embd);
}

int wide_norm_rows_for_test = -1;  // (gpu_use_wide_norm_rows_for_test; -1: the environment's)

// Decode batches of 9-64 rows normed by a CTA per run of 1024 values of each row instead of one per row (on by
// default, measured +0.6-1.6% at 16 and 64 rows on an H100; ROOFLINE_NORM_WIDE_ROWS=0 for one CTA a row).
bool wide_norm_rows() {
  static const bool env = env_switch("ROOFLINE_NORM_WIDE_ROWS", true);
  return wide_norm_rows_for_test >= 0 ? wide_norm_rows_for_test > 0 : env;
}

bool rms_norm(const float* x, const float* w, float eps, int n_rows, int n, const int* gather, float* out, ActQ8 act,
              cudaStream_t stream, __half* out16, const WgTiles& tiles) {
  if (n_rows == 0) return false;
  if (n_rows <= 8) {
    const dim3 grid((unsigned)(((n + 31) / 32 + 7) / 8), (unsigned)n_rows);
    launch(rms_norm_wide_kernel, grid, dim3(256), 0, stream, pdl_enabled(), x, w, eps, n, gather, out, act);
    return false;
  }
  const bool aligned = ((reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(w) | reinterpret_cast<uintptr_t>(out) |
                         reinterpret_cast<uintptr_t>(out16) | reinterpret_cast<uintptr_t>(tiles.out)) & 15) == 0;
  const bool tiles_fit = !tiles.out || (n % 256 == 0 && tiles.n_pad >= n_rows);
  if (!act.q && (out || out16 || tiles.out) && aligned && tiles_fit && n % 4 == 0 && n <= 4 * kNormRowThreads * kNormRowVec) {
    // Decode batches (the batched products' 9-64 rows) may spread each row over its runs' CTAs.
    const unsigned runs = n_rows <= 64 && wide_norm_rows() ? (unsigned)((n / 4 + kNormRowThreads - 1) / kNormRowThreads) : 1u;
    launch(rms_norm_rows_kernel, dim3(tiles.out ? tiles.n_pad : n_rows, runs), dim3(kNormRowThreads), 0, stream, pdl_enabled(), x, w, eps, n,
           gather, out, out16, tiles, n_rows);
    return out16 != nullptr || tiles.out != nullptr;
  }
  launch(rms_norm_kernel, dim3(n_rows), dim3(1024), 0, stream, pdl_enabled(), x, w, eps, n, gather, out, act);
  return false;
}

bool post_norm_add_fits(int n_rows, int n) { return n_rows <= 8 && n % 32 == 0 && n <= 4 * kPostNormThreads * kPostNormVec; }

void post_norm_add(const float* y, const float* w, float eps, int n_rows, int n, float* x, const float* w2, float* out2, ActQ8 act2,
                   cudaStream_t stream) {
  if (n_rows == 0) return;
  if (!post_norm_add_fits(n_rows, n)) fail("internal error: the fused post-norm takes at most 8 rows of a multiple of 32 up to {}", 4 * kPostNormThreads * kPostNormVec);
  launch(post_norm_add_kernel, dim3(n_rows), dim3(kPostNormThreads), 0, stream, pdl_enabled(), y, w, eps, n, x, w2, out2, act2);
}

void quantize_rows(const float* x, int n_rows, int n, ActQ8 act, cudaStream_t stream, const int32_t* gather) {
  if (n_rows == 0) return;
  const dim3 grid((unsigned)((n / 32 + 7) / 8), (unsigned)n_rows);
  launch(quantize_rows_kernel, grid, dim3(256), 0, stream, pdl_enabled(), x, n, gather, act);
}

// The f16-only form through gated_f16_kernel where it applies; true when it was launched.
template <GateAct kAct>
bool launch_gated_f16(const float* gate, const float* up, int n_rows, int n, float* out, ActQ8 act, cudaStream_t stream, __half* out16) {
  const bool aligned = ((reinterpret_cast<uintptr_t>(gate) | reinterpret_cast<uintptr_t>(up) | reinterpret_cast<uintptr_t>(out16)) & 15) == 0;
  if (out || act.q || !out16 || n % 8 != 0 || !aligned) return false;
  const int64_t total = (int64_t)n_rows * n;
  launch(gated_f16_kernel<kAct>, dim3((unsigned)((total / 8 + 255) / 256)), dim3(256), 0, stream, pdl_enabled(), gate, up, total, out16);
  return true;
}

void swiglu(const float* gate, const float* up, int n_rows, int n, float* out, ActQ8 act, cudaStream_t stream, __half* out16) {
  if (n_rows == 0 || launch_gated_f16<GateAct::Silu>(gate, up, n_rows, n, out, act, stream, out16)) return;
  const dim3 grid((unsigned)(((n + 31) / 32 + 7) / 8), (unsigned)n_rows);
  launch(gated_product_kernel<GateAct::Silu>, grid, dim3(256), 0, stream, pdl_enabled(), gate, up, n, out, act, out16);
}

void geglu(const float* gate, const float* up, int n_rows, int n, float* out, ActQ8 act, cudaStream_t stream, __half* out16) {
  if (n_rows == 0 || launch_gated_f16<GateAct::GeluTanh>(gate, up, n_rows, n, out, act, stream, out16)) return;
  const dim3 grid((unsigned)(((n + 31) / 32 + 7) / 8), (unsigned)n_rows);
  launch(gated_product_kernel<GateAct::GeluTanh>, grid, dim3(256), 0, stream, pdl_enabled(), gate, up, n, out, act, out16);
}

void add_values(float* y, const float* x, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  launch(add_values_kernel, dim3((unsigned)((n + 255) / 256)), dim3(256), 0, stream, pdl_enabled(), y, x, n);
}

void scale_values(float* x, int64_t n, float s, cudaStream_t stream) {
  if (n == 0) return;
  launch(scale_values_kernel, dim3((unsigned)((n + 255) / 256)), dim3(256), 0, stream, pdl_enabled(), x, n, s);
}

void softcap(float* x, int64_t n, float cap, cudaStream_t stream) {
  if (n == 0) return;
  launch(softcap_kernel, dim3((unsigned)((n + 255) / 256)), dim3(256), 0, stream, pdl_enabled(), x, n, cap);
}

void output_gate(const float* gate, float* x, int n_rows, int n, ActQ8 act, cudaStream_t stream) {
  if (n_rows == 0) return;
  const dim3 grid((unsigned)(((n + 31) / 32 + 7) / 8), (unsigned)n_rows);
  launch(gated_product_kernel<GateAct::Sigmoid>, grid, dim3(256), 0, stream, pdl_enabled(), gate, (const float*)x, n, x, act, (__half*)nullptr);
}

void split_q_gate(const float* q_full, int n_rows, int n_head, int hd, float* q, float* gate, cudaStream_t stream) {
  if (n_rows == 0) return;
  launch(split_q_gate_kernel, dim3((unsigned)n_rows, (unsigned)n_head), dim3(128), 0, stream, pdl_enabled(), q_full, n_head, hd, q,
         gate);
}

void add_bias(float* y, const float* bias, int n_rows, int n, cudaStream_t stream) {
  if (!bias || n_rows == 0) return;
  const dim3 grid((unsigned)((n + 255) / 256), (unsigned)n_rows);
  launch(add_bias_kernel, grid, dim3(256), 0, stream, pdl_enabled(), y, bias, n);
}

}  // namespace roofline::cuda

namespace roofline {

void gpu_use_wide_norm_rows_for_test(int on) { cuda::wide_norm_rows_for_test = on; }

}  // namespace roofline
