// Prompt products of Q4_K weights without an f16 copy of the weights: a tiled tensor-core GEMM that
// dequantizes each tile of weights in shared memory (sm_80+). gemm() (cuda_gemm.cu) otherwise
// dequantizes whole row chunks to f16 in global memory and hands them to cuBLAS: a fixed cost of ~2.6
// bytes moved per weight whatever the prompt's length, which dominates short prompts (a 128-token step
// of qwen3-32b spends more time dequantizing than multiplying).
//
// A CTA computes a tile of kTileRows weight rows x kTileToks tokens, walking K in steps of 64 values (one
// 32-byte quant chunk of a super-block: low nibbles are sub-block 2j, high nibbles 2j + 1). Each step's
// raw weight bytes (the super-block's 16-byte header and the chunk) and its f16 activations come into
// shared memory by cp.async, kStages steps in flight; the CTA's threads then dequantize the weights into
// an f16 tile (each thread 32 values of one row's sub-block, with the same arithmetic as the f16 copy
// of cuda_gemm.cu, so the products multiply the same f16 weights as the cuBLAS path) and 8 warps
// multiply it (mma.sync m16n8k16, ldmatrix fragments, f32 accumulation): warp (wm, wn) owns 64 rows x
// 32 tokens. Y[token][row] is written (or added to) straight from the accumulators.
#include "backend/cuda/cuda_batched_products.cuh"
#include "backend/cuda/cuda_dequant.cuh"
#include "backend/cuda/cuda_kernels.cuh"
#include "backend/cuda/cuda_mma.cuh"
#include "backend/gpu.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace roofline::cuda {

namespace {

constexpr int kTileRows = 128, kTileToks = 128, kStepK = 64, kThreads = 256, kStages = 3;
constexpr int kRow = kStepK + 8;           // halves per shared row of the A and X tiles (ldmatrix without conflicts)
constexpr int kRawRow = 48;                // bytes per row of a raw stage: the 16-byte header, then the 32-byte chunk
constexpr int kXStage = kTileToks * kRow;  // halves
constexpr int kRawStage = kTileRows * kRawRow;
constexpr size_t kSmemBytes = (size_t)kStages * (kXStage * 2 + kRawStage) + (size_t)kTileRows * kRow * 2;

__global__ void __launch_bounds__(kThreads, 2) q4k_tile_gemm_kernel(DeviceWeight w, const __half* x, int n_tok, float* y, int ldy,
                                                                   bool accumulate) {
  extern __shared__ __align__(16) uint8_t tile_smem[];
  __half* xs = reinterpret_cast<__half*>(tile_smem);                                    // [kStages][kTileToks][kRow]
  uint8_t* raw = tile_smem + (size_t)kStages * kXStage * 2;                              // [kStages][kTileRows][kRawRow]
  __half* as = reinterpret_cast<__half*>(raw + (size_t)kStages * kRawStage);            // [kTileRows][kRow]
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int wm = warp % 2, wn = warp / 2;
  const int64_t row0 = (int64_t)blockIdx.y * kTileRows;
  const int tok0 = blockIdx.x * kTileToks;
  const int64_t cols = w.cols, n_steps = cols / kStepK;

  // Step s: K values [64 s, 64 s + 64), chunk s % 4 of super-block s / 4. Rows and tokens past the ends
  // repeat the last (read, never stored).
  auto load_stage = [&](int64_t s, int buf) {
    if (s < n_steps) {
      const int64_t k0 = s * kStepK, sb = s / 4;
      const int chunk = (int)(s % 4);
      __half* xd = xs + buf * kXStage;
      for (int i = tid; i < kTileToks * (kStepK / 8); i += kThreads) {
        const int t = i / (kStepK / 8), p = i % (kStepK / 8);
        const int tok = min(tok0 + t, n_tok - 1);
        copy_async<16>(xd + t * kRow + p * 8, x + (int64_t)tok * cols + k0 + p * 8);
      }
      uint8_t* rd = raw + buf * kRawStage;
      for (int i = tid; i < kTileRows * 3; i += kThreads) {
        const int r = i / 3, p = i % 3;
        const uint8_t* src = w.data + min(row0 + r, w.rows - 1) * w.row_bytes + sb * 144;
        copy_async<16>(rd + r * kRawRow + 16 * p, p == 0 ? src : src + 16 + 32 * chunk + 16 * (p - 1));
      }
    }
    copy_async_commit();  // (an empty group past the end keeps the wait counts uniform)
  };

  wait_for_previous_kernel();
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) load_stage(s, s);

  float acc[4][4][4] = {};
  // The dequantizing thread's row and sub-block half (0: low nibbles, values 0-31 of the step; 1: high).
  const int dq_row = tid / 2, dq_half = tid % 2;
  for (int64_t s = 0; s < n_steps; ++s) {
    const int buf = (int)(s % kStages);
    copy_async_wait<kStages - 2>();
    __syncthreads();  // stage s landed for every thread; every warp is done with step s - 1's tiles
    load_stage(s + kStages - 1, (int)((s + kStages - 1) % kStages));
    {  // dequantize: value = d * sc * q - dmin * m, rounded to f16 as the f16 copy does
      const uint8_t* r = raw + buf * kRawStage + dq_row * kRawRow;
      const uint4 head = *reinterpret_cast<const uint4*>(r);
      const uint4 qa = *reinterpret_cast<const uint4*>(r + 16), qb = *reinterpret_cast<const uint4*>(r + 32);
      // Scale and min of sub-block j from the 12 scale bytes (head.y, .z, .w) by shifts: a run-time byte
      // index into a register would put the header in local memory.
      const int j = 2 * (int)(s % 4) + dq_half, k = 8 * (j & 3);
      const uint32_t lo = head.y >> k, mid = head.z >> k, hi = head.w >> k;
      const int sc = j < 4 ? (int)(lo & 63) : (int)((hi & 0xF) | ((lo >> 6 & 3) << 4));
      const int m = j < 4 ? (int)(mid & 63) : (int)((hi >> 4 & 0xF) | ((mid >> 6 & 3) << 4));
      __half2 dm;
      memcpy(&dm, &head.x, 4);
      const float d1 = __low2float(dm) * sc, m1 = __high2float(dm) * m;
      const uint32_t words[8] = {qa.x, qa.y, qa.z, qa.w, qb.x, qb.y, qb.z, qb.w};
      __half* dst = as + dq_row * kRow + 32 * dq_half;
#pragma unroll
      for (int wd = 0; wd < 8; wd += 2) {
        union {
          int4 v;
          __half2 h[4];
        } o;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const uint32_t word = words[wd + e / 2];
          const int b = 2 * (e % 2);
          const float v0 = d1 * (float)((word >> (8 * b + 4 * dq_half)) & 0xF) - m1;
          const float v1 = d1 * (float)((word >> (8 * (b + 1) + 4 * dq_half)) & 0xF) - m1;
          o.h[e] = __floats2half2_rn(v0, v1);
        }
        *reinterpret_cast<int4*>(dst + 4 * wd) = o.v;
      }
    }
    __syncthreads();  // the f16 tile is whole
    const __half* xt = xs + buf * kXStage;
#pragma unroll
    for (int kk = 0; kk < kStepK; kk += 16) {
      uint32_t b[4][2];
#pragma unroll
      for (int np = 0; np < 2; ++np) {
        uint32_t r[4];
        ldmatrix_x4(r, xt + (wn * 32 + np * 16 + (lane / 16) * 8 + lane % 8) * kRow + kk + ((lane / 8) % 2) * 8);
        b[2 * np][0] = r[0], b[2 * np][1] = r[1], b[2 * np + 1][0] = r[2], b[2 * np + 1][1] = r[3];
      }
#pragma unroll
      for (int mi = 0; mi < 4; ++mi) {
        uint32_t a[4];
        ldmatrix_x4(a, as + (wm * 64 + mi * 16 + lane % 16) * kRow + kk + (lane / 16) * 8);
#pragma unroll
        for (int ni = 0; ni < 4; ++ni) mma_16816(acc[mi][ni], a[0], a[1], a[2], a[3], b[ni][0], b[ni][1]);
      }
    }
  }
  copy_async_wait<0>();
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int mi = 0; mi < 4; ++mi)
#pragma unroll
    for (int ni = 0; ni < 4; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t row = row0 + wm * 64 + mi * 16 + g + (e >= 2 ? 8 : 0);
        const int tok = tok0 + wn * 32 + ni * 8 + 2 * t + (e & 1);
        if (row < w.rows && tok < n_tok) {
          float* dst = y + (int64_t)tok * ldy + row;
          *dst = accumulate ? *dst + acc[mi][ni][e] : acc[mi][ni][e];
        }
      }
}

}  // namespace

int q4k_tile_gemm_max_tokens() {
  const char* env = std::getenv("ROOFLINE_Q4K_TILE_GEMM");
  return env ? std::atoi(env) : 0;
}

bool q4k_tile_gemm_fits(const DeviceWeight& w, int n_tokens) {
  // Read per call (a few hundred host calls a prompt step), so that tests can switch them.
  if (n_tokens <= kMaxFusedRows || n_tokens > q4k_tile_gemm_max_tokens() || code_arch() < 80) return false;
  if (w.type != DType::Q4_K || w.layout != WeightLayout::Raw || w.cols % 256 != 0) return false;
  // Enough CTAs for most of a wave of the GPU (2 a SM); smaller products keep the cuBLAS path, unless
  // ROOFLINE_Q4K_TILE_GEMM_ANY=1 (tests on small matrices).
  const int64_t ctas = (w.rows + kTileRows - 1) / kTileRows * ((n_tokens + kTileToks - 1) / kTileToks);
  const char* any = std::getenv("ROOFLINE_Q4K_TILE_GEMM_ANY");
  return ctas >= 2 * sm_count() * 3 / 4 || (any && std::atoi(any) == 1);
}

std::atomic<int64_t> tile_gemm_calls{0};  // (gpu_q4k_tile_gemm_calls_for_test)

void q4k_tile_gemm(const DeviceWeight& w, const __half* x16, int n_tokens, float* y, int ldy, bool accumulate, cudaStream_t stream) {
  tile_gemm_calls.fetch_add(1, std::memory_order_relaxed);
  static const bool configured = [] {
    ROOFLINE_CUDA_CHECK(cudaFuncSetAttribute(q4k_tile_gemm_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kSmemBytes));
    return true;
  }();
  (void)configured;
  const dim3 grid((unsigned)((n_tokens + kTileToks - 1) / kTileToks), (unsigned)((w.rows + kTileRows - 1) / kTileRows));
  launch(q4k_tile_gemm_kernel, grid, dim3(kThreads), kSmemBytes, stream, pdl_enabled(), w, x16, n_tokens, y, ldy, accumulate);
}

}  // namespace roofline::cuda

namespace roofline {

int64_t gpu_q4k_tile_gemm_calls_for_test() { return cuda::tile_gemm_calls.load(); }

}  // namespace roofline
