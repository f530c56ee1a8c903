// What the two batched-decode product kernels share (the f16 one in cuda_gemm.cu, the int8 one in
// cuda_mma_int8.cu): the CTA shape, the members of one launch (products of one input: q/k/v, gate/up),
// the choice of how many CTAs split each row's K, and the launch of the reduction of their partial sums.
#pragma once

#include <algorithm>
#include <climits>
#include <cstdlib>

#include "backend/cuda/cuda_kernels.cuh"

namespace roofline::cuda {

constexpr int kMmaWarps = 4;
constexpr int kMmaThreads = kMmaWarps * 32;
constexpr int kMaxFusedRows = 64;

// Products of one input in one launch: CTA column x takes row tile x - tile_end[k - 1] of member k;
// with K split over CTAs, member k's partial sums start part_off[k] floats into part.
struct MmaMembers {
  DeviceWeight w[kMatvecGroupMax];
  float* y[kMatvecGroupMax];
  int64_t part_off[kMatvecGroupMax];
  int ldy[kMatvecGroupMax];
  int tile_end[kMatvecGroupMax];  // row tiles of members 0..k together
  int count;
};

// CTA column bx's member and its row tile, by register selects (a run-time index into the parameter
// arrays would copy them to local memory).
struct MmaMember {
  DeviceWeight w;
  float* y;
  int64_t part_off;
  int ldy, tile0;
};
__device__ __forceinline__ MmaMember mma_member(const MmaMembers& m, int bx) {
  MmaMember r{m.w[0], m.y[0], m.part_off[0], m.ldy[0], 0};
#pragma unroll
  for (int k = 1; k < kMatvecGroupMax; ++k)
    if (k < m.count && bx >= m.tile_end[k - 1]) r = MmaMember{m.w[k], m.y[k], m.part_off[k], m.ldy[k], m.tile_end[k - 1]};
  return r;
}

// The members of a launch of `rows_per_cta`-row tiles, and how many CTAs split K: the split count with
// the fewest (waves of CTAs x super-blocks per CTA), where a wave is every CTA the GPU holds at once
// (`slots`), among those whose partial sums, written and read back, move no more bytes than the
// weights (or 32 MB, which the L2 absorbs) and fit the scratch. Measured on an H200 (qwen3-32b):
// -npl 16 844 -> 904 tok/s against a fixed target of three CTAs per SM. Sets m.part_off.
// Stores a warp's m16n8 accumulators of MT 16-row m tiles from row_base and NT 8-token tiles (the mma
// fragment layout: lane 4g + t holds rows g and g + 8, tokens 2t and 2t + 1): into y (accumulating or
// not), or with K split over CTAs as split `split`'s partial sums for the reduction.
template <int MT, int NT>
__device__ __forceinline__ void store_mma_tiles(const float (&acc)[MT][NT][4], int64_t row_base, int64_t rows, int n_tok, int g, int t,
                                                float* y, int ldy, bool accumulate, float* part, int split, int n_splits) {
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int f = 0; f < NT; ++f)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int64_t r = row_base + 16 * m + g + 8 * (i / 2);
        const int tok = 8 * f + 2 * t + i % 2;
        if (r >= rows || tok >= n_tok) continue;
        const float v = acc[m][f][i];
        if (n_splits > 1) {
          part[((int64_t)split * n_tok + tok) * rows + r] = v;
        } else {
          float* dst = y + (int64_t)tok * ldy + r;
          *dst = accumulate ? *dst + v : v;
        }
      }
}

struct MmaPlan {
  MmaMembers m{};
  int64_t tiles = 0, splits = 1;
};
// fill_sb: what a CTA's first super-block costs beyond the others, in super-blocks (its weights' first memory latency
// before anything overlaps it; 0 for the mma.sync kernel, whose split choice was measured so).
inline MmaPlan plan_mma_launch(const DeviceWeight* const* ws, float* const* ys, const int* ldys, int count, int n_tok, int rows_per_cta,
                               int slots, size_t part_floats, int fill_sb = 0) {
  MmaPlan p;
  p.m.count = count;
  int64_t rows = 0;
  double weight_bytes = 0;
  for (int k = 0; k < count; ++k) {
    p.m.w[k] = *ws[k];
    p.m.y[k] = ys[k];
    p.m.ldy[k] = ldys[k];
    p.tiles += (ws[k]->rows + rows_per_cta - 1) / rows_per_cta;
    p.m.tile_end[k] = (int)p.tiles;
    rows += ws[k]->rows;
    weight_bytes += (double)ws[k]->rows * (double)ws[k]->row_bytes;
  }
  const int64_t n_sb = ws[0]->cols / 256;
  // ROOFLINE_MMA_MAX_SPLITS (1-32, default 32) caps the splits: an A/B of the reductions' cost, which the count
  // below leaves out.
  static const int64_t cap = [] {
    const char* e = std::getenv("ROOFLINE_MMA_MAX_SPLITS");
    return e ? std::clamp<int64_t>(std::atoi(e), 1, 32) : 32;
  }();
  const int64_t max_splits = std::min<int64_t>({n_sb, cap, (int64_t)(part_floats / ((size_t)n_tok * (size_t)rows))});
  int64_t best_cost = INT64_MAX;
  for (int64_t sp = 1; sp <= max_splits; ++sp) {
    if (sp > 1 && 8.0 * n_tok * (double)rows * (double)sp > std::max(weight_bytes, 32e6)) break;
    const int64_t cost = (p.tiles * sp + slots - 1) / slots * ((n_sb + sp - 1) / sp + fill_sb);
    if (cost < best_cost) p.splits = sp, best_cost = cost;
  }
  int64_t off = 0;
  for (int k = 0; k < count; ++k) {
    p.m.part_off[k] = off;
    off += p.splits * n_tok * ws[k]->rows;
  }
  return p;
}

// With more than one split: y (+)= the sum of each member's partial sums, in split order (cuda_gemm.cu).
void reduce_k_splits(const MmaPlan& plan, int n_tok, bool accumulate, const float* part, cudaStream_t stream);

// Kernel attributes belong to a device: the opt-in shared memory of `Kernel` is set once on each device
// that launches it (outside graph captures: a form's first launch is in a prefill step, which is not
// captured), and its CTAs per wave there (SMs x CTAs per SM at `smem`) are kept for the split choice.
template <auto Kernel>
int smem_set_once(int smem, int threads) {
  static int slots[64] = {};
  int dev = 0;
  ROOFLINE_CUDA_CHECK(cudaGetDevice(&dev));
  int& s = slots[dev & 63];
  if (s == 0) {
    int sms = 0, occ = 0;
    ROOFLINE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    ROOFLINE_CUDA_CHECK(cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    ROOFLINE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, Kernel, threads, smem));
    s = std::max(1, sms * occ);
  }
  return s;
}

// Products of 9-64 rows of Q4_K weights on int8 tensor cores (cuda_mma_int8.cu), for sm_80 and newer, with
// ROOFLINE_INT8_MMA=1 (9-64 rows) or =32 (9-32 rows); off by default (gpu_use_int8_products_for_test for tests). x_scratch: the f16 fragment buffer of the
// f16 kernel (n_tokens rounded up to 16, times cols, halves), which the int8 activations fit.
bool int8_products_take(const DeviceWeight& w, int n_tokens);
void int8_products(const DeviceWeight* const* ws, float* const* ys, const int* ldys, int count, const float* x, int n_tokens,
                   bool accumulate, float* part, size_t part_floats, void* x_scratch, cudaStream_t stream);

// Products of 9-64 rows of Q4_K and Q6_K weights on Hopper's warpgroup tensor cores (cuda_wgmma_rows.cu), by default
// for steps of 9-64 rows (ROOFLINE_WGMMA=N: N-64, =0: never; wgmma_products_min_rows, 0 when off), where the device
// is sm_90 and the build has sm_90a code (wgmma_products_available). x_scratch: the f16 fragment buffer of the f16
// kernel (n_tokens rounded up to 16, times cols, halves), which the activation tiles fill exactly.
// x_ready: x_scratch already holds x's tiles (WgTiles of wgmma_n_pad(n_tokens) tokens in the weights' layout, written
// by the kernel that computed x), so x is not read.
int wgmma_products_min_rows();
bool wgmma_products_available();
bool wgmma_products_take(const DeviceWeight& w, int n_tokens);
inline int wgmma_n_pad(int n_tokens) { return 16 * ((n_tokens + 15) / 16); }
// Whether Q4_K tiles are written for products that fold the mins (WgTiles::folded; ROOFLINE_WGMMA_FOLD, on).
bool wg_tiles_folded();
// Whether products of Q4_K and Q6_K weights of one input join in one warpgroup launch (Q4_K first: q and k with a Q6_K
// v; ROOFLINE_WGMMA_MIXED, on, with one m64 tile a warpgroup). Their Q6_K tiles follow the Q4_K ones (wg_q6_tiles), so
// x_f16 holds wg_tiles_both_halves.
bool wgmma_mixed_joins();
inline __half* wg_q6_tiles(__half* x_f16, int64_t cols, int n_pad) { return x_f16 + wg_tiles_halves(cols, n_pad, false); }
inline int64_t wg_tiles_both_halves(int64_t cols, int n_pad) { return wg_tiles_halves(cols, n_pad, false) + wg_tiles_halves(cols, n_pad, true); }
void wgmma_products(const DeviceWeight* const* ws, float* const* ys, const int* ldys, int count, const float* x, int n_tokens,
                    bool accumulate, float* part, size_t part_floats, __half* x_scratch, bool x_ready, cudaStream_t stream);
// For tests: f32 rows [n_rows x n] -> tiles, by the products' own conversion (in the values' order, through
// wg_tile_index), or with run_order by the kernel that builds each 16-byte run from RowBlock<T>::x_offset (the
// expert products' conversion): the reference for every kernel that writes tiles.
void wgmma_convert_for_test(const float* x, int n_rows, int n, const WgTiles& tiles, bool run_order, cudaStream_t stream);
// The grouped expert products (mma_experts' arguments) on the same kernel, with ROOFLINE_WGMMA_EXPERTS=1 (off).
bool wgmma_experts_take(const DeviceWeight& stacked);
void wgmma_experts(const DeviceWeight& stacked, int64_t rows_per_expert, const ExpertTiles& tiles, const float* x_grouped, __half* scratch,
                   float* y, int ldy, cudaStream_t stream);

}  // namespace roofline::cuda
