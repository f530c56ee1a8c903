// Decode products of 2-8 tokens of Q4_K weights on int8 tensor cores, with the bits of the warp kernels
// (matvec_q4_k, cuda_matvec_rows.cuh), so that a step's results do not depend on how many tokens it holds.
//
// The warp kernels are bound by their arithmetic at 2-8 tokens (dp4a and the float sums once per token: on an
// H200 a qwen3-32b step of 8 tokens took ~25 ms where one of 1 token takes ~8 and the tensor-core kernel of
// 16 tokens ~16). Here one u8 x s8 mma (m16n8k32) gives the exact integer sums of one sub-block for 16 weight
// rows and 8 tokens. Integer sums are the same in any order, so what must match is the float part:
// matvec_q4_k's lane 4g + c adds, for its super-blocks i = g, g + 8, g + 16, .. in turn, the term of
// sub-blocks 2c and 2c + 1 (q4k_lane_term), and the warp's butterfly (warp_sum: lanes xor 16, 8, 4, 2, 1)
// then adds the 32 lanes' sums. A lane here holds the mma sums of 2 rows x 2 tokens and keeps, for each,
// the sums of the 32 virtual lanes the way the butterfly combines them: it walks the super-blocks by
// residue g in the order 0, 4, 2, 6, 1, 5, 3, 7 (lanes xor 16 are g and g ^ 4, xor 8 g ^ 2, xor 4 g ^ 1),
// so at most one pending partial sum per tree level is live, then adds the four c in the butterfly's order
// ((c0 + c2) + (c1 + c3)). Float addition is commutative, so every sum is the warp kernel's, bit for bit.
//
// The mma's k order inside a sub-block is free as long as both operands agree: lane t of a row group takes
// the 8 consecutive quant bytes 8t..8t+7 of each 32-byte chunk (a0/a1: bytes 0-3, a2/a3: 4-7) and the same
// 8 activation bytes of its token. Tokens past the step's are zero in the B operand and never stored.
#include <cstdlib>

#include "backend/cuda/cuda_kernels.cuh"
#include "backend/cuda/cuda_matvec_rows.cuh"
#include "backend/cuda/cuda_mma.cuh"
#include "backend/gpu.h"

namespace roofline::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kTileRows = 16;  // rows of a warp: one m16 tile

__device__ __forceinline__ uint2 ld8(const void* p) { return __ldg(reinterpret_cast<const uint2*>(p)); }

// A lane's butterfly partial sums waiting for their partner, in shared memory (registers would spill):
// [warp][level 0-2][pair * 4 + c][lane]. Phase `ph` of the residue order 0, 4, 2, 6, 1, 5, 3, 7 has summed `cur`
// (one pair and c): fold it into the tree; after phase 7 level 2 holds the sum over g of lane c's sums.
constexpr int kPendingFloats = 3 * 16 * 32;
__device__ __forceinline__ void fold_phase(float cur, int ph, float* pending, int slot) {
  float* level = pending + slot * 32;  // level k at + k * 16 * 32
  if (ph % 2 == 0) {
    level[0] = cur;
    return;
  }
  const float s1 = __fadd_rn(level[0], cur);  // g + (g ^ 4)
  if (ph % 4 == 1) {
    level[16 * 32] = s1;
    return;
  }
  const float s2 = __fadd_rn(level[16 * 32], s1);  // + the pair g ^ 2
  level[2 * 16 * 32] = ph == 3 ? s2 : __fadd_rn(level[2 * 16 * 32], s2);  // ph 7: + the quad g ^ 1
}

template <int B>
__global__ void __launch_bounds__(kWarps * 32) q4k_mma_matvec_kernel(MatvecGroup grp, ActQ8 act, bool accumulate) {
  const int lane = threadIdx.x % 32, gq = lane / 4, tq = lane % 4;
  const int64_t tile = (int64_t)blockIdx.x * kWarps + threadIdx.x / 32;  // the grid's units are 16-row tiles
  const bool live = tile < grp.first_unit[grp.n];
  const MatvecMember mb = matvec_member(grp, tile);
  const DeviceWeight& w = mb.w;
  float* y = mb.y;
  const int ldy = mb.ldy;
  const int64_t first = mb.first;
  wait_for_previous_kernel();
  if (!live) return;
  const int64_t row_a = (tile - first) * kTileRows + gq, row_b = row_a + 8;
  const uint8_t* ra = w.data + min(row_a, w.rows - 1) * (int64_t)w.row_bytes;  // past the end: a repeat, not stored
  const uint8_t* rb = w.data + min(row_b, w.rows - 1) * (int64_t)w.row_bytes;
  const int64_t cols = w.cols, n_sb = cols / 256, n_groups = cols / 32;
  const int tok0 = 2 * tq, tok1 = 2 * tq + 1;
  const bool has_b = gq < B;  // this lane's B-operand token (gq) is one of the step's
  const int8_t* xb = act.q + (int64_t)(has_b ? gq : 0) * cols;
  const float* d0 = act.d + (int64_t)min(tok0, B - 1) * n_groups;
  const float* s0 = act.s + (int64_t)min(tok0, B - 1) * n_groups;
  const float* d1 = act.d + (int64_t)min(tok1, B - 1) * n_groups;
  const float* s1 = act.s + (int64_t)min(tok1, B - 1) * n_groups;
  // Pairs: 0 (row a, tok0), 1 (row a, tok1), 2 (row b, tok0), 3 (row b, tok1): the mma's c0..c3.
  __shared__ float pending_all[kWarps * kPendingFloats];
  float* pending = pending_all + (threadIdx.x / 32) * kPendingFloats + lane;
  float cur[4][4];
#pragma unroll
  for (int ph = 0; ph < 8; ++ph) {
    const int residue = ((ph & 1) << 2) | (ph & 2) | ((ph >> 2) & 1);  // 0, 4, 2, 6, 1, 5, 3, 7: ph's bits reversed
#pragma unroll
    for (int p = 0; p < 4; ++p)
#pragma unroll
      for (int c = 0; c < 4; ++c) cur[p][c] = 0.0f;
    for (int64_t i = residue; i < n_sb; i += 8) {
      const uint8_t* ba = ra + i * 144;
      const uint8_t* bb = rb + i * 144;
      const int4 ha = ld16(ba), hb = ld16(bb);
      uint2 qa[4], qb[4], xq[8];
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        qa[c] = ld8(ba + 16 + 32 * c + 8 * tq);
        qb[c] = ld8(bb + 16 + 32 * c + 8 * tq);
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) xq[j] = has_b ? ld8(xb + i * 256 + 32 * j + 8 * tq) : make_uint2(0, 0);
      float da, dmina, db, dminb;
      half2_floats((uint32_t)ha.x, da, dmina);
      half2_floats((uint32_t)hb.x, db, dminb);
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        int lo[4], hi[4];
        mma_u8s8_16832(lo, qa[c].x & 0x0F0F0F0Fu, qb[c].x & 0x0F0F0F0Fu, qa[c].y & 0x0F0F0F0Fu, qb[c].y & 0x0F0F0F0Fu, xq[2 * c].x,
                       xq[2 * c].y);
        mma_u8s8_16832(hi, (qa[c].x >> 4) & 0x0F0F0F0Fu, (qb[c].x >> 4) & 0x0F0F0F0Fu, (qa[c].y >> 4) & 0x0F0F0F0Fu,
                       (qb[c].y >> 4) & 0x0F0F0F0Fu, xq[2 * c + 1].x, xq[2 * c + 1].y);
        float sc0a, m0a, sc1a, m1a, sc0b, m0b, sc1b, m1b;
        k4_scale_min_select(2 * c, (uint32_t)ha.y, (uint32_t)ha.z, (uint32_t)ha.w, sc0a, m0a);
        k4_scale_min_select(2 * c + 1, (uint32_t)ha.y, (uint32_t)ha.z, (uint32_t)ha.w, sc1a, m1a);
        k4_scale_min_select(2 * c, (uint32_t)hb.y, (uint32_t)hb.z, (uint32_t)hb.w, sc0b, m0b);
        k4_scale_min_select(2 * c + 1, (uint32_t)hb.y, (uint32_t)hb.z, (uint32_t)hb.w, sc1b, m1b);
        const int64_t s = 8 * i + 2 * c;
        if (tok0 < B) {
          const float2 ad = __ldg(reinterpret_cast<const float2*>(d0 + s)), as = __ldg(reinterpret_cast<const float2*>(s0 + s));
          cur[0][c] = q4k_lane_term(cur[0][c], da, dmina, sc0a, m0a, sc1a, m1a, ad, as, lo[0], hi[0]);
          cur[2][c] = q4k_lane_term(cur[2][c], db, dminb, sc0b, m0b, sc1b, m1b, ad, as, lo[2], hi[2]);
        }
        if (tok1 < B) {
          const float2 ad = __ldg(reinterpret_cast<const float2*>(d1 + s)), as = __ldg(reinterpret_cast<const float2*>(s1 + s));
          cur[1][c] = q4k_lane_term(cur[1][c], da, dmina, sc0a, m0a, sc1a, m1a, ad, as, lo[1], hi[1]);
          cur[3][c] = q4k_lane_term(cur[3][c], db, dminb, sc0b, m0b, sc1b, m1b, ad, as, lo[3], hi[3]);
        }
      }
    }
#pragma unroll
    for (int p = 0; p < 4; ++p)
#pragma unroll
      for (int c = 0; c < 4; ++c) fold_phase(cur[p][c], ph, pending, 4 * p + c);
  }
  // The butterfly's last two levels over c (lanes xor 2, then xor 1), then store_rows' factor and store.
#pragma unroll
  for (int p = 0; p < 4; ++p) {
    const int tok = p % 2 == 0 ? tok0 : tok1;
    const int64_t row = p < 2 ? row_a : row_b;
    if (tok >= B || row >= w.rows) continue;
    const float* l3 = pending + (2 * 16 + 4 * p) * 32;  // level 2, slots 4p + c
    float v = __fadd_rn(__fadd_rn(l3[0], l3[2 * 32]), __fadd_rn(l3[32], l3[3 * 32]));
    if (act.row_factor) v *= __ldg(act.row_factor + tok);
    float* dst = y + (int64_t)tok * ldy + row;
    *dst = accumulate ? *dst + v : v;
  }
}

int mma_matvec_mode_for_test = -1;  // gpu_use_mma_matvec_for_test: -1 the environment's

template <int B>
void launch_q4k_mma(const MatvecGroup& g, const ActQ8& act, bool accumulate, cudaStream_t stream) {
  const dim3 grid((unsigned)((g.first_unit[g.n] + kWarps - 1) / kWarps)), block(kWarps * 32);
  launch(q4k_mma_matvec_kernel<B>, grid, block, 0, stream, pdl_enabled(), g, act, accumulate);
}

}  // namespace

// Off unless ROOFLINE_MATVEC_MMA=1: the bits are the warp kernels' (GpuMatmulTest.TensorCoreProductsOfFewTokensGiveTheWarpKernelsBits),
// but this form is slower on an H200 (docs/performance.md): qwen3-32b -npl 2 / 4 / 8 113.6 / 171.5 / 263.4 generated tok/s
// against 202.8 / 260.1 / 318.2. It is latency-bound (8-byte loads in residue order, nothing in flight across
// super-blocks, 116-128 registers) where the warp kernels are bound by their arithmetic.
bool matvec_mma_takes(const DeviceWeight& w, int n_tokens) {
  static const bool env_on = env_switch("ROOFLINE_MATVEC_MMA", false);
  const bool on = mma_matvec_mode_for_test >= 0 ? mma_matvec_mode_for_test > 0 : env_on;
  return on && n_tokens >= 2 && n_tokens <= 8 && w.type == DType::Q4_K && w.layout == WeightLayout::Raw && w.cols % 256 == 0 &&
         w.row_bytes == (size_t)(w.cols / 256 * 144) && code_arch() >= 80;
}

void matvec_mma_q4k(const DeviceWeight* const* ws, float* const* ys, const int* ldys, int count, const ActQ8& act, int n_tokens,
                    bool accumulate, cudaStream_t stream) {
  if (count < 1 || count > kMatvecGroupMax) fail("internal error: a tensor-core matvec group of {} products", count);
  MatvecGroup g;
  g.n = count;
  g.first_unit[0] = 0;
  for (int m = 0; m < count; ++m) {
    if (!matvec_mma_takes(*ws[m], n_tokens) || ws[m]->cols != ws[0]->cols) fail("internal error: a tensor-core matvec over other weights");
    g.w[m] = *ws[m];
    g.y[m] = ys[m];
    g.ldy[m] = ldys[m];
    g.first_unit[m + 1] = g.first_unit[m] + (ws[m]->rows + kTileRows - 1) / kTileRows;
  }
  switch (n_tokens) {
    case 2: return launch_q4k_mma<2>(g, act, accumulate, stream);
    case 3: return launch_q4k_mma<3>(g, act, accumulate, stream);
    case 4: return launch_q4k_mma<4>(g, act, accumulate, stream);
    case 5: return launch_q4k_mma<5>(g, act, accumulate, stream);
    case 6: return launch_q4k_mma<6>(g, act, accumulate, stream);
    case 7: return launch_q4k_mma<7>(g, act, accumulate, stream);
    default: return launch_q4k_mma<8>(g, act, accumulate, stream);
  }
}

}  // namespace roofline::cuda

namespace roofline {

void gpu_use_mma_matvec_for_test(int mode) { cuda::mma_matvec_mode_for_test = mode; }

}  // namespace roofline
