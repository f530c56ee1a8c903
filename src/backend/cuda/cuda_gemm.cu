// Products of more than 8 rows. Up to 64 rows (batched decode) with Q4_K or Q6_K weights: one kernel
// dequantizes the weights in registers straight into f16 tensor-core fragments (mma.sync, f32
// accumulation), so each weight byte is read once per step and nothing is written back (on Hopper the same
// fragments go to warpgroup instructions instead: cuda_wgmma_rows.cu); products of one
// input (q/k/v, gate/up) share one launch and one activation conversion (gemm_multi). Otherwise
// (prefill, other types) the weight is dequantized to f16 in row chunks that fit the scratch buffer and
// multiplied with cuBLAS (f16 inputs, f32 accumulation); with a DequantAhead (cuda_dequant_ahead.cuh) the
// chunks come dequantized from a side stream. Both are free of atomics, so results are reproducible.
#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/cuda_batched_products.cuh"
#include "backend/cuda/cuda_dequant.cuh"
#include "backend/cuda/cuda_dequant_ahead.cuh"
#include "backend/cuda/cuda_kernels.cuh"
#include "backend/cuda/cuda_mma.cuh"
#include "backend/cuda/cuda_row_blocks.cuh"
#include "backend/gpu.h"

namespace roofline::cuda {

namespace {

// Float weights of any row length: one thread per element.
__global__ void float_rows_f16_kernel(DeviceWeight w, int64_t row0, int64_t n_rows, __half* out) {
  wait_for_previous_kernel();
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
  wait_for_previous_kernel();
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

// Q4_K (blocks as in the file) and Q6_K (planes) to f16 with whole-warp accesses: a warp per run of
// kDequantBlocks 256-value super-blocks, each lane 8 consecutive values of each, so a warp's loads are
// contiguous runs per plane and its stores 512-byte pieces; every load of the run is issued before the
// first value is formed (one super-block a warp: 2.7 TB/s; four: 2.9). Quants become floats by an add
// (small_int_float) and values go to f16 two per instruction, as the int->float and float->f16
// conversions, one each per value, run at a quarter of the ALU rate. The generic kernel above (one
// thread per 32 values, byte loads, 64-byte strided stores) moved ~50% of the bandwidth and took 30% of
// a qwen3-32b pp512 step. The arithmetic is dequant_chunk32's, so the f16 values are the same.
constexpr int kDequantBlocks = 4;

// Small non-negative ints to float with a full-rate add instead of the quarter-rate conversion (exact below
// 2^23): the float with mantissa bits q and exponent 2^23, minus 2^23 (+ bias).
__device__ __forceinline__ float small_int_float(uint32_t q, float bias = 0.0f) { return __int_as_float(0x4B000000 | q) - (8388608.0f + bias); }

__device__ __forceinline__ int byte_of(const uint4& v, int k) {  // byte k (0..15) of a 16-byte load
  const uint32_t word = k < 4 ? v.x : k < 8 ? v.y : k < 12 ? v.z : v.w;
  return (int)((word >> (8 * (k % 4))) & 0xFF);
}

// The super-blocks [g0, g0 + kDequantBlocks) of the chunk, by one warp.
__device__ __forceinline__ void dequant_q4k_run(const DeviceWeight& w, int64_t row0, int64_t n_sb, int64_t total, int64_t g0, int lane,
                                                __half* out) {
  const int j = lane / 4;  // the lane's 32-value sub-block
  uint4 head[kDequantBlocks];  // d, dmin, 12 scale bytes
  uint2 q[kDequantBlocks];
#pragma unroll
  for (int k = 0; k < kDequantBlocks; ++k) {
    const int64_t g = min(g0 + k, total - 1);
    const uint8_t* b = w.data + (row0 + g / n_sb) * w.row_bytes + (g % n_sb) * 144;
    head[k] = *reinterpret_cast<const uint4*>(b);
    q[k] = *reinterpret_cast<const uint2*>(b + 16 + 32 * (lane / 8) + 8 * (lane % 4));
  }
  const int shift = lane & 4;  // lanes 4-7 of each 8 take the high nibbles
#pragma unroll
  for (int k = 0; k < kDequantBlocks; ++k) {
    if (g0 + k >= total) break;
    int sc, m;  // from the scale bytes, bytes 4-15 of the block
    k4_scale_min_of(j, [&](int b) { return byte_of(head[k], 4 + b); }, sc, m);
    const __half2 dm = *reinterpret_cast<const __half2*>(&head[k].x);
    const float d1 = __low2float(dm) * sc, m1 = __high2float(dm) * m;
    union {
      int4 v;
      __half2 h[4];
    } o;
    auto value = [&](int i) { return d1 * small_int_float(((i < 4 ? q[k].x >> (8 * i) : q[k].y >> (8 * (i - 4))) >> shift) & 0xF) - m1; };
#pragma unroll
    for (int i = 0; i < 8; i += 2) o.h[i / 2] = __floats2half2_rn(value(i), value(i + 1));  // one paired conversion
    reinterpret_cast<int4*>(out + (g0 + k) * 256)[lane] = o.v;
  }
}

__device__ __forceinline__ void dequant_q6k_run(const DeviceWeight& w, int64_t row0, int64_t n_sb, int64_t total, int64_t g0, int lane,
                                                __half* out) {
  const int j = lane / 4, half = (lane % 4) / 2, t0 = 8 * (lane % 2);  // 32-value chunk, its half, first of 16
  uint2 lo[kDequantBlocks];
  uint32_t hi[kDequantBlocks];
  int sc[kDequantBlocks];
  float d[kDequantBlocks];
#pragma unroll
  for (int k = 0; k < kDequantBlocks; ++k) {
    const int64_t g = min(g0 + k, total - 1);
    const int64_t row = row0 + g / n_sb, sb = g % n_sb;
    lo[k] = *reinterpret_cast<const uint2*>(w.data + row * (w.cols / 2) + sb * 128 + 16 * j + t0);
    hi[k] = *reinterpret_cast<const uint32_t*>(w.plane1 + row * (w.cols / 4) + sb * 64 + 8 * j + 4 * half);
    sc[k] = reinterpret_cast<const int8_t*>(w.plane2)[row * (w.cols / 16) + sb * 16 + 2 * j + half];
    d[k] = ld_half(w.plane3 + (row * n_sb + sb) * 2);
  }
#pragma unroll
  for (int k = 0; k < kDequantBlocks; ++k) {
    if (g0 + k >= total) break;
    union {
      int4 v;
      __half2 h[4];
    } o;
    const float ds = d[k] * (float)sc[k];
    auto value = [&](int i) {
      const uint32_t byte = (i < 4 ? lo[k].x >> (8 * i) : lo[k].y >> (8 * (i - 4))) & 0xFF;
      const uint32_t nib = half ? byte >> 4 : byte & 0xF;
      const uint32_t h = (hi[k] >> (8 * (i % 4) + 2 * ((t0 + i) / 4))) & 3;
      return ds * small_int_float(nib | (h << 4), 32.0f);
    };
#pragma unroll
    for (int i = 0; i < 8; i += 2) o.h[i / 2] = __floats2half2_rn(value(i), value(i + 1));
    reinterpret_cast<int4*>(out + (g0 + k) * 256)[lane] = o.v;
  }
}

// A warp per run of kDequantBlocks super-blocks (a grid of fewer warps striding over the runs measured
// level).
template <bool Q6>
__global__ void dequant_kquant_f16_kernel(DeviceWeight w, int64_t row0, int64_t n_rows, __half* out) {
  wait_for_previous_kernel();
  const int64_t n_sb = w.cols / 256, total = n_rows * n_sb;
  const int64_t g0 = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32 * kDequantBlocks;
  if (g0 >= total) return;
  if constexpr (Q6) dequant_q6k_run(w, row0, n_sb, total, g0, threadIdx.x % 32, out);
  else dequant_q4k_run(w, row0, n_sb, total, g0, threadIdx.x % 32, out);
}

// f32 -> f16, saturating at the f16 range (an activation beyond it would otherwise become inf): eight
// elements a thread with 16-byte accesses where x and out allow them (one element a thread, the prompt
// activations of a qwen3-32b pp512 step took 8.6% of it; eight: pp512 +4%, qwen3-8b +9%).
__global__ void to_f16_kernel(const float* x, int64_t n, __half* out) {
  wait_for_previous_kernel();
  const int64_t i = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
  if (i >= n) return;
  const bool vec = i + 8 <= n && ((reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(out)) & 15) == 0;
  if (vec) {
    *reinterpret_cast<int4*>(out + i) = f16x8_saturated(reinterpret_cast<const float4*>(x + i)[0], reinterpret_cast<const float4*>(x + i)[1]);
  } else {
    for (int64_t k = i; k < n && k < i + 8; ++k) out[k] = saturated_half(x[k]);
  }
}

// y[t * ldy + r] (+)= W[r, :] . x[t, :] for t < n_tok <= 8 * NT. x: f16 activations from
// to_f16_fragments_kernel. grid.x: 128-row tiles; grid.y splits K (for parallelism on small matrices): with
// more than one split each CTA writes partial sums to part[(split * n_tok + t) * rows + r] and
// split_k_reduce_kernel adds them in split order.
// CTAs per SM the register budget aims for: fewer tokens need fewer accumulators (Q6_K holds more
// weight bytes per lane, so one step less).
template <DType T, int NT, int MT>
constexpr int mma_min_ctas() { return (MT == 1 ? 1 : 0) + (T == DType::Q4_K ? (NT <= 2 ? 4 : NT <= 4 ? 3 : 2) : (NT <= 2 ? 3 : 2)); }
// Bytes of one super-block's activation fragments (8 x NT x 32 int4s), staged in shared memory once per
// CTA when SX (below) and read by every warp of it.
template <int NT>
constexpr int mma_x_stage_bytes() { return 8 * NT * 32 * 16; }
// Bytes of one stage: every warp's weight slots, plus with SX the activations of that super-block.
template <DType T, int NT, int MT, bool SX>
constexpr int mma_stage_bytes() { return kMmaWarps * 2 * MT * RowBlock<T>::kSlotBytes + (SX ? mma_x_stage_bytes<NT>() : 0); }
// Super-blocks staged in shared memory at once (copies of the next ones in flight while the CTA computes
// one): up to 3, as many as the CTAs per SM above leave room for (227 KB per SM, 1 KB per CTA reserved),
// at least 2.
template <DType T, int NT, int MT, bool SX>
constexpr int mma_stages() {
  constexpr int fit = (227 * 1024 / mma_min_ctas<T, NT, MT>() - 1024) / mma_stage_bytes<T, NT, MT, SX>();
  return fit < 2 ? 2 : fit > 3 ? 3 : fit;
}
template <DType T, int NT, int MT, bool SX>
constexpr int mma_smem_bytes() { return mma_stages<T, NT, MT, SX>() * mma_stage_bytes<T, NT, MT, SX>(); }
// Shared activations pay where the CTAs per SM the registers allow still fit with them.
template <DType T, int NT, int MT>
constexpr bool mma_shared_x_fits() { return mma_min_ctas<T, NT, MT>() * (mma_smem_bytes<T, NT, MT, true>() + 1024) <= 227 * 1024; }

// The body of one CTA: row tile `row_tile`, K split `split` of `n_splits`. SX: the activation fragments
// of each super-block are copied into shared memory once per CTA (cp.async, with the weights of the same
// stage) and every warp reads them there; otherwise each warp reads them through L1 (at 64 tokens the
// CTA's four warps then pull ~4x the weight bytes in activations from the L2).
template <DType T, int NT, int MT, bool SX>
__device__ __forceinline__ void mma_rows(const DeviceWeight& w, const __half* x, int n_tok, float* y, int ldy, bool accumulate, float* part,
                                         int64_t row_tile, int split, int n_splits) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4, warp = threadIdx.x / 32;
  const int64_t row_base = row_tile * (kMmaWarps * 16 * MT) + warp * (16 * MT);
  const int64_t n_sb = w.cols / 256;
  const int64_t sb_begin = n_sb * split / n_splits, sb_end = n_sb * (split + 1) / n_splits;
  // Rows g, g + 8 (m tile 0) and g + 16, g + 24 (m tile 1); loads past the last row repeat it.
  int64_t rows[2 * MT];
#pragma unroll
  for (int i = 0; i < 2 * MT; ++i) rows[i] = min(row_base + g + 8 * i, w.rows - 1);
  const int4* xf = reinterpret_cast<const int4*>(x) + lane;  // fragment-ordered activations
  constexpr int S = mma_stages<T, NT, MT, SX>(), kWarpStage = 2 * MT * RowBlock<T>::kSlotBytes;
  constexpr int kXBytes = SX ? mma_x_stage_bytes<NT>() : 0, kStage = mma_stage_bytes<T, NT, MT, SX>();
  extern __shared__ int4 mma_smem[];
  uint8_t* smem = reinterpret_cast<uint8_t*>(mma_smem);
  // Stage s: [activations (SX)][warp 0's slots][warp 1's] ...
  auto warp_slots = [&](int stage) { return smem + stage * kStage + kXBytes + warp * kWarpStage; };
  // Stage s holds super-block sb_begin + s (mod S). One commit per super-block (empty past the end),
  // so "all but the newest S - 2 groups done" always means the oldest one staged has landed.
  auto stage_copy = [&](int64_t sb, int stage) {
    if (sb < sb_end) {
#pragma unroll
      for (int i = 0; i < 2 * MT; ++i)
        RowBlock<T>::copy(w, rows[i], sb, lane, t == i % 4, warp_slots(stage) + i * RowBlock<T>::kSlotBytes);
      if constexpr (SX) {
        const int4* src = reinterpret_cast<const int4*>(x) + sb * (8 * NT * 32);
        int4* dst = reinterpret_cast<int4*>(smem + stage * kStage);
#pragma unroll
        for (int k = threadIdx.x; k < 8 * NT * 32; k += kMmaThreads) copy_async<16>(dst + k, src + k);
      }
    }
    copy_async_commit();
  };
  // Weights are no kernel's output: without shared activations the first stages are fetched before the
  // wait for the previous kernel (with them, a stage holds activations too).
  if constexpr (!SX) {
#pragma unroll
    for (int s = 0; s < S - 1; ++s) stage_copy(sb_begin + s, s);
  }
  wait_for_previous_kernel();
  if constexpr (SX) {
#pragma unroll
    for (int s = 0; s < S - 1; ++s) stage_copy(sb_begin + s, s);
  }
  float acc[MT][NT][4] = {};
  const uint32_t scale_sel[2] = {RowBlock<T>::lane_scale_selector(t, 0), RowBlock<T>::lane_scale_selector(t, 1)};
  int stage = 0;
  for (int64_t sb = sb_begin; sb < sb_end; ++sb) {
    copy_async_wait<S - 2>();
    // Every thread's copies of this stage have landed, and every thread is done reading the last one
    // (which the copy below overwrites): the whole CTA's when the activations are shared.
    if constexpr (SX) __syncthreads();
    else __syncwarp();
    stage_copy(sb + S - 1, stage == 0 ? S - 1 : stage - 1);
    RowBlock<T> blk[2 * MT];
#pragma unroll
    for (int i = 0; i < 2 * MT; ++i)
      blk[i].from_smem(warp_slots(stage) + i * RowBlock<T>::kSlotBytes, lane, ((rows[i] * n_sb + sb) & 1) != 0);
    const int4* xs_stage = SX ? reinterpret_cast<const int4*>(smem + stage * kStage) + lane : xf + sb * (8 * NT * 32);
    stage = stage == S - 1 ? 0 : stage + 1;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int p = 0; p < 2; ++p) {
        __half2 scale[2 * MT], offset[2 * MT];
#pragma unroll
        for (int i = 0; i < 2 * MT; ++i) blk[i].scales(h, scale_sel[p], scale[i], offset[i]);
#pragma unroll
        for (int u2 = 0; u2 < 4; u2 += 2) {
          int4 b[NT];  // B fragments of words u2 (x, y) and u2 + 1 (z, w)
          const int4* xs = xs_stage + ((4 * h + 2 * p + u2 / 2) * NT) * 32;
#pragma unroll
          for (int f = 0; f < NT; ++f) b[f] = SX ? xs[32 * f] : __ldg(xs + 32 * f);
#pragma unroll
          for (int du = 0; du < 2; ++du) {
            uint32_t a_lo[2 * MT], a_hi[2 * MT];
#pragma unroll
            for (int i = 0; i < 2 * MT; ++i) blk[i].group(h, p, u2 + du, scale[i], offset[i], a_lo[i], a_hi[i]);
#pragma unroll
            for (int f = 0; f < NT; ++f) {
              const uint32_t b0 = du ? b[f].z : b[f].x, b1 = du ? b[f].w : b[f].y;
#pragma unroll
              for (int m = 0; m < MT; ++m) mma_16816(acc[m][f], a_lo[2 * m], a_lo[2 * m + 1], a_hi[2 * m], a_hi[2 * m + 1], b0, b1);
            }
          }
        }
      }
    }
  }
  store_mma_tiles<MT, NT>(acc, row_base, w.rows, n_tok, g, t, y, ldy, accumulate, part, split, n_splits);
}

template <DType T, int NT, int MT, bool SX>
__global__ void __launch_bounds__(kMmaThreads, (mma_min_ctas<T, NT, MT>())) mma_rows_kernel(MmaMembers m, const __half* x, int n_tok,
                                                                                          bool accumulate, float* part) {
  const MmaMember k = mma_member(m, blockIdx.x);
  mma_rows<T, NT, MT, SX>(k.w, x, n_tok, k.y, k.ldy, accumulate, part + k.part_off, blockIdx.x - k.tile0, blockIdx.y, gridDim.y);
}

// Expert products grouped by expert (mma_experts): CTA (x, y) takes row tile x of the expert of token
// tile y, whose fragments (to_f16_fragments_tiles_kernel) start at x + y * tile_slots int4s.
template <DType T, int NT, int MT, bool SX>
__global__ void __launch_bounds__(kMmaThreads, (mma_min_ctas<T, NT, MT>())) mma_experts_kernel(DeviceWeight w, int64_t rows_per_expert,
                                                                                             ExpertTiles tiles, const __half* x,
                                                                                             int64_t tile_halves, float* y, int ldy) {
  wait_for_previous_kernel();
  const int i = blockIdx.y;
  if (i >= *tiles.n_tiles) return;
  const DeviceWeight we = expert_view(w, tiles.expert[i], rows_per_expert);
  const int64_t row0 = tiles.row0[i];
  mma_rows<T, NT, MT, SX>(we, x + i * tile_halves, tiles.rows[i], y + row0 * ldy, ldy, false, nullptr, blockIdx.x, 0, 1);
}

// f32 activations [n_tok x cols] -> f16 (saturated) B fragments for mma_rows_kernel<T, nt>: 16-byte
// slot ((sb * 8 + 4h + 2p + u2 / 2) * nt + f) * 32 + lane holds the 8 activations of token 8f + lane / 4
// (past n_tok: the last token) that the lane's words u2, u2 + 1 of load h, nibble p multiply in
// super-block sb, each group of 4 as (x0, x2, x1, x3).
template <DType T>
__global__ void to_f16_fragments_kernel(const float* x, int n_tok, int64_t cols, int nt, int4* out) {
  wait_for_previous_kernel();
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= cols / 256 * 8 * nt * 32) return;
  const int lane = (int)(i % 32), f = (int)(i / 32 % nt), c = (int)(i / (32 * nt) % 8);
  const int64_t sb = i / (32 * nt * 8);
  const int tok = min(8 * f + lane / 4, n_tok - 1);
  const float* src = x + (int64_t)tok * cols + sb * 256 + RowBlock<T>::x_offset(c / 4, (c / 2) % 2, 2 * (c % 2), lane % 4);
  const float4 a = *reinterpret_cast<const float4*>(src), b = *reinterpret_cast<const float4*>(src + 4);
  union {
    int4 v;
    __half2 h2[4];
  } o;
  o.h2[0] = __halves2half2(saturated_half(a.x), saturated_half(a.z));
  o.h2[1] = __halves2half2(saturated_half(a.y), saturated_half(a.w));
  o.h2[2] = __halves2half2(saturated_half(b.x), saturated_half(b.z));
  o.h2[3] = __halves2half2(saturated_half(b.y), saturated_half(b.w));
  out[i] = o.v;
}

// The partial sums of every member of a launch, reduced in one launch: element i of member k (k's
// elements start at end[k - 1]: n_tok x rows of it, token-major) adds its splits in split order.
struct SplitSums {
  float* y[kMatvecGroupMax];
  int64_t part_off[kMatvecGroupMax], rows[kMatvecGroupMax], end[kMatvecGroupMax];
  int ldy[kMatvecGroupMax];
  int count;
};
__global__ void split_k_reduce_kernel(const float* part, SplitSums m, int splits, int n_tok, bool accumulate) {
  wait_for_previous_kernel();
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= m.end[m.count - 1]) return;
  // i's member by register selects (a run-time index into the parameter arrays would copy them to local memory)
  float* y = m.y[0];
  int64_t off = m.part_off[0], rows = m.rows[0], first = 0;
  int ldy = m.ldy[0];
#pragma unroll
  for (int k = 1; k < kMatvecGroupMax; ++k)
    if (k < m.count && i >= m.end[k - 1]) y = m.y[k], off = m.part_off[k], rows = m.rows[k], first = m.end[k - 1], ldy = m.ldy[k];
  const int64_t n = (i - first) / rows, r = (i - first) % rows;
  const float* p = part + off;
  float sum = 0;
  for (int s = 0; s < splits; ++s) sum += p[((int64_t)s * n_tok + n) * rows + r];
  float* dst = y + n * ldy + r;
  *dst = accumulate ? *dst + sum : sum;
}

// Activations shared by the CTA's warps (mma_rows' SX) where they fit beside its CTAs per SM, with
// ROOFLINE_MMA_SHARED_X=1. Off by default: measured level on an H200 (qwen3-32b -npl 16 / 64, with the
// joined launches: 878-904 / 1685-1724 tok/s against 894 / 1743 without; docs/performance.md, fourteenth
// session): the batched kernel is not held back by its activations' L2 traffic.
bool mma_shared_x_on() {
  static const bool on = env_switch("ROOFLINE_MMA_SHARED_X", false);
  return on;
}

template <DType T, int NT, int MT, bool SX>
void launch_mma_rows_nt(const DeviceWeight* const* ws, float* const* ys, const int* ldys, int count, const __half* x, int n_tok,
                        bool accumulate, float* part, size_t part_floats, cudaStream_t stream) {
  constexpr int smem = mma_smem_bytes<T, NT, MT, SX>();
  const int slots = smem_set_once<mma_rows_kernel<T, NT, MT, SX>>(smem, kMmaThreads);
  const MmaPlan plan = plan_mma_launch(ws, ys, ldys, count, n_tok, kMmaWarps * 16 * MT, slots, part_floats);
  launch(mma_rows_kernel<T, NT, MT, SX>, dim3((unsigned)plan.tiles, (unsigned)plan.splits), dim3(kMmaThreads), smem, stream, pdl_enabled(),
         plan.m, x, n_tok, accumulate, part);
  reduce_k_splits(plan, n_tok, accumulate, part, stream);
}

// Two m16 tiles (32 weight rows) per warp: measured on an H200 (qwen3-32b, -npl 16/64), 636/852 tok/s
// against 618/655 with one tile (fewer registers, but each activation fragment feeds half the mma);
// again with the fragment-ordered activations, 1639 against 1488 at 64 tokens. Four tiles for Q4_K at up to 32 tokens
// (182-248 registers, 2 CTAs a SM): qwen3-8b -npl 16 / 32 +3-7%, qwen3-32b -npl 16 -7-9%, 32 level (docs/performance.md).
constexpr int kMmaTiles = 2;
constexpr int kMmaTilesExperts = 2;  // the same for the expert products

template <DType T, int NT>
void launch_mma_rows_pick(const DeviceWeight* const* ws, float* const* ys, const int* ldys, int count, const __half* x, int n_tok,
                          bool accumulate, float* part, size_t part_floats, cudaStream_t stream) {
  if (mma_shared_x_fits<T, NT, kMmaTiles>() && mma_shared_x_on())
    launch_mma_rows_nt<T, NT, kMmaTiles, true>(ws, ys, ldys, count, x, n_tok, accumulate, part, part_floats, stream);
  else
    launch_mma_rows_nt<T, NT, kMmaTiles, false>(ws, ys, ldys, count, x, n_tok, accumulate, part, part_floats, stream);
}

// The products of `count` weights of one kind and row length with one input, in one launch.
template <DType T>
void launch_mma_rows(const DeviceWeight* const* ws, float* const* ys, const int* ldys, int count, const float* x_f32, __half* x, int n_tok,
                     bool accumulate, float* part, size_t part_floats, cudaStream_t stream) {
  const int nt = 2 * ((n_tok + 15) / 16);  // n8 tiles rounded up to an even count
  const int64_t cols = ws[0]->cols, slots = cols / 256 * 8 * nt * 32;
  launch(to_f16_fragments_kernel<T>, dim3((unsigned)((slots + 255) / 256)), dim3(256), 0, stream, pdl_enabled(), x_f32, n_tok,
         cols, nt, reinterpret_cast<int4*>(x));
  switch (nt / 2) {
    case 1: launch_mma_rows_pick<T, 2>(ws, ys, ldys, count, x, n_tok, accumulate, part, part_floats, stream); break;
    case 2: launch_mma_rows_pick<T, 4>(ws, ys, ldys, count, x, n_tok, accumulate, part, part_floats, stream); break;
    case 3: launch_mma_rows_pick<T, 6>(ws, ys, ldys, count, x, n_tok, accumulate, part, part_floats, stream); break;
    default: launch_mma_rows_pick<T, 8>(ws, ys, ldys, count, x, n_tok, accumulate, part, part_floats, stream); break;  // <= 64
  }
}

// The fused kernel over `count` weights of one type (Q4_K or Q6_K planes) and row length; the
// dequantization scratch is free in this path: it holds the split-K partial sums.
// x_ready: x_f16 holds x's warpgroup tiles (gemm_input_tiles).
void fused_products(const DeviceWeight* const* ws, float* const* ys, const int* ldys, int count, const float* x, int n_tokens, bool accumulate,
                    __half* scratch, size_t scratch_elems, __half* x_f16, cudaStream_t stream, bool x_ready = false) {
  float* part = reinterpret_cast<float*>(scratch);
  const size_t part_floats = scratch_elems / 2;
  const bool wgmma = !int8_products_take(*ws[0], n_tokens) && wgmma_products_take(*ws[0], n_tokens);
  if (x_ready && !wgmma) fail("internal error: warpgroup tiles given to another kernel's {}-row product", n_tokens);
  if (int8_products_take(*ws[0], n_tokens))  // only where asked for (ROOFLINE_INT8_MMA)
    return int8_products(ws, ys, ldys, count, x, n_tokens, accumulate, part, part_floats, x_f16, stream);
  if (wgmma) return wgmma_products(ws, ys, ldys, count, x, n_tokens, accumulate, part, part_floats, x_f16, x_ready, stream);
  if (ws[0]->type == DType::Q4_K) launch_mma_rows<DType::Q4_K>(ws, ys, ldys, count, x, x_f16, n_tokens, accumulate, part, part_floats, stream);
  else launch_mma_rows<DType::Q6_K>(ws, ys, ldys, count, x, x_f16, n_tokens, accumulate, part, part_floats, stream);
}

// f32 grouped rows -> the B fragments of each token tile (as to_f16_fragments_kernel for its rows:
// past a tile's last row, its last row again). grid.y: tile slots.
template <DType T>
__global__ void to_f16_fragments_tiles_kernel(const float* x, ExpertTiles tiles, int64_t cols, int nt, int4* out) {
  wait_for_previous_kernel();
  const int tile = blockIdx.y;
  if (tile >= *tiles.n_tiles) return;
  const int64_t per_tile = cols / 256 * 8 * nt * 32;
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= per_tile) return;
  const int lane = (int)(i % 32), f = (int)(i / 32 % nt), c = (int)(i / (32 * nt) % 8);
  const int64_t sb = i / (32 * nt * 8);
  const int tok = min(8 * f + lane / 4, tiles.rows[tile] - 1);
  const float* src = x + (int64_t)(tiles.row0[tile] + tok) * cols + sb * 256 + RowBlock<T>::x_offset(c / 4, (c / 2) % 2, 2 * (c % 2), lane % 4);
  const float4 a = *reinterpret_cast<const float4*>(src), b = *reinterpret_cast<const float4*>(src + 4);
  union {
    int4 v;
    __half2 h2[4];
  } o;
  o.h2[0] = __halves2half2(saturated_half(a.x), saturated_half(a.z));
  o.h2[1] = __halves2half2(saturated_half(a.y), saturated_half(a.w));
  o.h2[2] = __halves2half2(saturated_half(b.x), saturated_half(b.z));
  o.h2[3] = __halves2half2(saturated_half(b.y), saturated_half(b.w));
  out[tile * per_tile + i] = o.v;
}

template <DType T, int NT>
void launch_mma_experts_nt(const DeviceWeight& w, int64_t rows_per_expert, const ExpertTiles& tiles, const float* x, __half* scratch,
                           float* y, int ldy, cudaStream_t stream) {
  const int64_t per_tile = w.cols / 256 * 8 * NT * 32;  // int4s
  launch(to_f16_fragments_tiles_kernel<T>, dim3((unsigned)((per_tile + 255) / 256), (unsigned)tiles.max_tiles), dim3(256), 0, stream,
         pdl_enabled(), x, tiles, w.cols, NT, reinterpret_cast<int4*>(scratch));
  // Activations through L1 (the shared-activation form measured level for dense products and is off).
  constexpr int kRowsPerCta = kMmaWarps * 16 * kMmaTilesExperts;
  constexpr int smem = mma_smem_bytes<T, NT, kMmaTilesExperts, false>();
  smem_set_once<mma_experts_kernel<T, NT, kMmaTilesExperts, false>>(smem, kMmaThreads);
  launch(mma_experts_kernel<T, NT, kMmaTilesExperts, false>, dim3((unsigned)((rows_per_expert + kRowsPerCta - 1) / kRowsPerCta),
         (unsigned)tiles.max_tiles), dim3(kMmaThreads), smem, stream, pdl_enabled(), w, rows_per_expert, tiles, (const __half*)scratch,
         per_tile * 8, y, ldy);
}

template <DType T>
void launch_mma_experts(const DeviceWeight& w, int64_t rows_per_expert, const ExpertTiles& tiles, const float* x, __half* scratch, float* y,
                        int ldy, cudaStream_t stream) {
  switch (tiles.nt) {
    case 2: return launch_mma_experts_nt<T, 2>(w, rows_per_expert, tiles, x, scratch, y, ldy, stream);
    case 4: return launch_mma_experts_nt<T, 4>(w, rows_per_expert, tiles, x, scratch, y, ldy, stream);
    case 6: return launch_mma_experts_nt<T, 6>(w, rows_per_expert, tiles, x, scratch, y, ldy, stream);
    case 8: return launch_mma_experts_nt<T, 8>(w, rows_per_expert, tiles, x, scratch, y, ldy, stream);
    default: fail("internal error: expert token tiles of {} n8 tiles", tiles.nt);
  }
}

}  // namespace

void reduce_k_splits(const MmaPlan& plan, int n_tok, bool accumulate, const float* part, cudaStream_t stream) {
  if (plan.splits < 2) return;
  SplitSums m{};
  m.count = plan.m.count;
  int64_t n = 0;
  for (int k = 0; k < m.count; ++k) {
    m.y[k] = plan.m.y[k];
    m.ldy[k] = plan.m.ldy[k];
    m.part_off[k] = plan.m.part_off[k];
    m.rows[k] = plan.m.w[k].rows;
    n += (int64_t)n_tok * m.rows[k];
    m.end[k] = n;
  }
  launch(split_k_reduce_kernel, dim3((unsigned)((n + 255) / 256)), dim3(256), 0, stream, pdl_enabled(), part, m, (int)plan.splits, n_tok,
         accumulate);
}

std::atomic<int64_t> f16_copy_gemm_calls{0};  // (gpu_f16_copy_gemm_calls_for_test)

int f16_copy_min_rows_for_test = 0;  // (gpu_set_f16_copy_min_rows_for_test; 0: the environment's or the default)

// Steps of this many rows and more multiply weights that have an f16 copy on the copy (cuBLAS): from 33 rows, where
// the copies beat the mma.sync kernel, or beyond the fused kernels' 64 where the warpgroup kernel takes 9-64 rows
// (it beat the copies at 33-64 rows on an H100: docs/performance.md); ROOFLINE_F16_COPY_MIN_ROWS sets it.
int f16_copy_min_rows() {
  static const int env = [] {
    const char* e = std::getenv("ROOFLINE_F16_COPY_MIN_ROWS");
    return e ? std::max(9, std::atoi(e)) : 0;
  }();
  if (f16_copy_min_rows_for_test > 0) return f16_copy_min_rows_for_test;
  if (env > 0) return env;
  const int wgmma_from = wgmma_products_min_rows();
  return wgmma_from > 0 && wgmma_from <= 33 && wgmma_products_available() ? kMaxFusedRows + 1 : 33;
}

// Steps of up to 64 rows take the fused kernels for weights of fewer output rows than ROOFLINE_F16_COPY_MIN_OUT_ROWS
// (default 0: every weight with a copy takes it from f16_copy_min_rows on): an A/B of the short products (q/k/v, o)
// against cuBLAS on their copies.
int64_t f16_copy_min_out_rows() {
  static const int64_t rows = [] {
    const char* env = std::getenv("ROOFLINE_F16_COPY_MIN_OUT_ROWS");
    return env ? std::max<int64_t>(0, std::atoll(env)) : 0;
  }();
  return rows;
}

bool gemm_uses_f16_copy(const DeviceWeight& w, int n_tokens) {
  if (!w.f16 || n_tokens <= 8 || n_tokens < f16_copy_min_rows()) return false;
  return n_tokens > kMaxFusedRows || w.rows >= f16_copy_min_out_rows();
}

bool gemm_fuses_dequant(const DeviceWeight& w, int n_tokens) {
  if (gemm_uses_f16_copy(w, n_tokens)) return false;
  if (n_tokens < 1 || n_tokens > kMaxFusedRows || w.cols % 256 != 0) return false;
  if (code_arch() < 75) return false;  // the m16n8k8 f16 mma needs sm_75 (sm_70: dequantize + cuBLAS)
  return (w.type == DType::Q4_K && w.layout == WeightLayout::Raw) || (w.type == DType::Q6_K && w.layout == WeightLayout::Q6KPlanes);
}

void dequant_rows_f16(const DeviceWeight& w, int64_t r0, int64_t n_rows, __half* out, cudaStream_t stream) {
  static const bool warp_dequant = env_switch("ROOFLINE_WARP_DEQUANT", true);
  const bool whole_blocks = warp_dequant && w.cols % 256 == 0;
  const bool fast_q4k = whole_blocks && w.type == DType::Q4_K && w.layout == WeightLayout::Raw;
  const bool fast_q6k = whole_blocks && w.type == DType::Q6_K && w.layout == WeightLayout::Q6KPlanes;
  if (w.type == DType::F32 || w.type == DType::F16 || w.type == DType::BF16) {
    const int64_t n = n_rows * w.cols;
    launch(float_rows_f16_kernel, dim3((unsigned)((n + 255) / 256)), dim3(256), 0, stream, pdl_enabled(), w, r0, n_rows, out);
  } else if (fast_q4k || fast_q6k) {
    const int64_t threads = (n_rows * (w.cols / 256) + kDequantBlocks - 1) / kDequantBlocks * 32;
    launch(fast_q4k ? dequant_kquant_f16_kernel<false> : dequant_kquant_f16_kernel<true>, dim3((unsigned)((threads + 255) / 256)),
           dim3(256), 0, stream, pdl_enabled(), w, r0, n_rows, out);
  } else {
    const int64_t n_chunks = n_rows * (w.cols / 32);
    launch(dequant_rows_f16_kernel, dim3((unsigned)((n_chunks + 127) / 128)), dim3(128), 0, stream, pdl_enabled(), w, r0, n_rows, out);
  }
}

void gemm(cublasHandle_t cublas, const DeviceWeight& w, const float* x, int n_tokens, float* y, int ldy, bool accumulate,
          __half* scratch, size_t scratch_elems, __half* x_f16, cudaStream_t stream, bool x_ready, DequantAhead* ahead) {
  const int64_t n_x = (int64_t)n_tokens * w.cols;
  if (gemm_fuses_dequant(w, n_tokens)) {  // (x_ready: x_f16 holds its warpgroup tiles)
    const DeviceWeight* ws[1] = {&w};
    float* ys[1] = {y};
    const int ldys[1] = {ldy};
    return fused_products(ws, ys, ldys, 1, x, n_tokens, accumulate, scratch, scratch_elems, x_f16, stream, x_ready);
  }
  if (!x_ready) launch(to_f16_kernel, dim3((unsigned)((n_x + 8 * 256 - 1) / (8 * 256))), dim3(256), 0, stream, pdl_enabled(), x, n_x, x_f16);
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  if (gemm_uses_f16_copy(w, n_tokens)) {  // the whole matrix's f16 copy, in one product
    const cublasStatus_t st = cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)w.rows, n_tokens, (int)w.cols, &alpha, w.f16, CUDA_R_16F,
                                           (int)w.cols, x_f16, CUDA_R_16F, (int)w.cols, &beta, y, CUDA_R_32F, ldy, CUBLAS_COMPUTE_32F,
                                           CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS) fail("cuBLAS GEMM failed with status {}", (int)st);
    f16_copy_gemm_calls.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  if (q4k_tile_gemm_fits(w, n_tokens)) return q4k_tile_gemm(w, x_f16, n_tokens, y, ldy, accumulate, stream);
  int64_t rows_per_chunk = (int64_t)(scratch_elems / (size_t)w.cols);
  if (rows_per_chunk < 1) fail("internal error: GEMM scratch smaller than one row");
  // Whole multiples of 256 rows per chunk: an odd chunk misaligns the output columns and cuBLAS then
  // falls back to slow pre-Hopper kernels (measured 10x slower on an H200).
  if (rows_per_chunk >= 512) rows_per_chunk = rows_per_chunk / 256 * 256;
  rows_per_chunk = std::min<int64_t>(rows_per_chunk, w.rows);
  for (int64_t r0 = 0; r0 < w.rows; r0 += rows_per_chunk) {
    const int64_t n_rows = std::min(rows_per_chunk, w.rows - r0);
    const __half* wf16 = ahead ? ahead->take(w, r0, n_rows) : nullptr;
    if (!wf16) {
      dequant_rows_f16(w, r0, n_rows, scratch, stream);
      wf16 = scratch;
    }
    const bool staged = wf16 != scratch;
    // Column-major view: Y^T[n_rows x n_tokens] = W[n_rows x K] * X^T[K x n_tokens].
    const cublasStatus_t st = cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)n_rows, n_tokens, (int)w.cols, &alpha,
                                           wf16, CUDA_R_16F, (int)w.cols, x_f16, CUDA_R_16F, (int)w.cols, &beta,
                                           y + r0, CUDA_R_32F, ldy, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS) fail("cuBLAS GEMM failed with status {}", (int)st);
    if (staged) ahead->release();
  }
}

bool gemm_can_join(const DeviceWeight& a, const DeviceWeight& b, int n_tokens) {
  static const bool on = env_switch("ROOFLINE_GEMM_JOIN", true);
  if (!on || !gemm_fuses_dequant(a, n_tokens) || !gemm_fuses_dequant(b, n_tokens) || a.cols != b.cols) return false;
  if (a.type == b.type) return true;
  // Q4_K first with a Q6_K member (q and k with a Q6_K v), both on the warpgroup kernel: one launch of both kinds.
  return a.type == DType::Q4_K && b.type == DType::Q6_K && wgmma_mixed_joins() && !int8_products_take(a, n_tokens) &&
         wgmma_products_take(a, n_tokens) && wgmma_products_take(b, n_tokens);
}

WgTiles gemm_input_tiles(const DeviceWeight& w, int n_tokens, __half* x_f16) {
  if (!gemm_fuses_dequant(w, n_tokens) || int8_products_take(w, n_tokens) || !wgmma_products_take(w, n_tokens)) return {};
  return WgTiles{x_f16, wgmma_n_pad(n_tokens), w.type == DType::Q6_K, wg_tiles_folded()};
}

void gemm_multi(const DeviceWeight* const* ws, float* const* ys, const int* ldys, int count, const float* x, int n_tokens, __half* scratch,
                size_t scratch_elems, __half* x_f16, cudaStream_t stream, bool x_ready) {
  if (count < 1 || count > kMatvecGroupMax) fail("internal error: {} products in one launch", count);
  for (int k = 1; k < count; ++k)
    if (!gemm_can_join(*ws[0], *ws[k], n_tokens)) fail("internal error: products of {} and {} weights joined", dtype_name(ws[0]->type), dtype_name(ws[k]->type));
  if (!gemm_fuses_dequant(*ws[0], n_tokens)) fail("internal error: a joined product of {} rows", n_tokens);
  fused_products(ws, ys, ldys, count, x, n_tokens, false, scratch, scratch_elems, x_f16, stream, x_ready);
}

}  // namespace roofline::cuda

namespace roofline::cuda {

// (The warpgroup kernel's tiles take up to 18 k16 steps a super-block, the 16 of values and their sums: wg_tiles_halves.)
size_t mma_experts_scratch_halves(int64_t cols, const ExpertTiles& tiles) {
  return ((size_t)tiles.max_tiles * 8 * tiles.nt * (size_t)cols + 15) / 16 * kWgMaxSbSteps;
}

void mma_experts(const DeviceWeight& stacked, int64_t rows_per_expert, const ExpertTiles& tiles, const float* x_grouped, __half* scratch,
                 float* y, int ldy, cudaStream_t stream) {
  if (tiles.max_tiles < 1) return;
  if (tiles.max_tiles > 65535) fail("internal error: {} expert token tiles", tiles.max_tiles);
  if (!gemm_fuses_dequant(stacked, 64)) fail("internal error: tensor-core expert products of a {} weight", dtype_name(stacked.type));
  if (wgmma_experts_take(stacked)) return wgmma_experts(stacked, rows_per_expert, tiles, x_grouped, scratch, y, ldy, stream);
  if (stacked.type == DType::Q4_K) launch_mma_experts<DType::Q4_K>(stacked, rows_per_expert, tiles, x_grouped, scratch, y, ldy, stream);
  else launch_mma_experts<DType::Q6_K>(stacked, rows_per_expert, tiles, x_grouped, scratch, y, ldy, stream);
}

}  // namespace roofline::cuda

namespace roofline {

int64_t gpu_f16_copy_gemm_calls_for_test() { return cuda::f16_copy_gemm_calls.load(); }
void gpu_set_f16_copy_min_rows_for_test(int rows) { cuda::f16_copy_min_rows_for_test = rows > 0 ? std::max(9, rows) : 0; }

}  // namespace roofline
