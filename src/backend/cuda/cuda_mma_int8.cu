// Batched-decode products (9-64 rows) of Q4_K weights on int8 tensor cores: the alternative to the
// f16 kernel of cuda_gemm.cu, on sm_80 and newer: ROOFLINE_INT8_MMA=32 for steps of 9-32 rows, =1 for 9-64.
// Off by default: measured on an H200 (docs/performance.md) -npl 16 / 32 +6-11%, -npl 64 -3% on qwen3-32b,
// but its activations (int8, one step per 256 values) are coarser than the f16 kernel's, and with it on a
// tiny model's self-draft no longer accepts every drafted token (SpeculativeTest.GpuDraftKeepsTheGreedyOutput).
//
// A Q4_K weight is w = d * sc_j * q - dmin * m_j (q: 4 bits, sc_j and m_j: 6-bit scale and min of
// sub-block j of 32, d and dmin per super-block of 256). The activations of each token and super-block
// are quantized to int8 with one step dx (x ~ dx * xq, as llama.cpp's CPU path does for K-quants), so
//   sum_k w_k x_k ~ d * dx * sum_j sc_j * (sum_{k in j} q_k xq_k) - dmin * dx * sum_j m_j * (sum_{k in j} xq_k):
// the product of the dequantized weights with the quantized activations. (The true sums of x in the
// second term would leave the error on d * sc * q, not on w: measured NMSE 2.5e-4 against ~5e-5.)
// The inner sums of the first term are one u8 x s8 mma (m16n8k32) per sub-block, exact in int32; the
// lanes scale them by sc_j in integers and convert once per super-block. The second term is one tf32
// mma (m16n8k8: the 8 mins of a row against the 8 sub-block sums of x) per super-block, accumulated
// straight into the float sums. Against the f16 kernel the weights need one mask (and a shift) per four
// values instead of a conversion per value, and each mma covers twice the k.
//
// Each warp owns 32 weight rows (two m16 tiles) and every token (NT n8 tiles), like the f16 kernel;
// each lane copies one row's 144-byte super-block into shared memory (cp.async, kStages in flight).
#include "backend/cuda/cuda_batched_products.cuh"
#include "backend/cuda/cuda_mma.cuh"
#include "backend/gpu.h"

#include <cstdlib>
#include <cstring>

namespace roofline::cuda {

namespace {

constexpr int kQ4KBlockBytes = 144;
constexpr int kWarpRows = 32;
// A stage: SBS consecutive super-blocks of each of a warp's 32 rows (SBS * 144 consecutive bytes of each
// row); one stage in flight beyond the one computed with SBS = 2, two with SBS = 1.
template <int SBS>
constexpr int warp_stage_bytes() { return kWarpRows * kQ4KBlockBytes * SBS; }
template <int SBS>
constexpr int stage_bytes() { return kMmaWarps * warp_stage_bytes<SBS>(); }
template <int SBS>
constexpr int stage_count() { return SBS == 1 ? 3 : 2; }

// The activations in the layout the kernel reads, for nt n8 tiles of tokens (padded with zeros):
struct Q8Frags {
  int4* frag;    // [n_sb][nt][4][32]: lane 4g + t of pair p: b0, b1 of sub-block 2p, then of 2p + 1, token 8f + g
  float* scale;  // [n_sb][8 nt]: dx of each token
  float2* sums;  // [n_sb][nt][32]: lane 4g + t: dx * the sums of xq over sub-blocks t and t + 4 of token 8f + g (tf32)
};
size_t q8_frags_bytes(int64_t n_sb, int nt) { return (size_t)n_sb * nt * (4 * 32 * 16 + 8 * 4 + 32 * 8); }
Q8Frags q8_frags_at(void* base, int64_t n_sb, int nt) {
  uint8_t* p = static_cast<uint8_t*>(base);
  Q8Frags f;
  f.frag = reinterpret_cast<int4*>(p);
  p += (size_t)n_sb * nt * 4 * 32 * 16;
  f.scale = reinterpret_cast<float*>(p);
  p += (size_t)n_sb * nt * 8 * 4;
  f.sums = reinterpret_cast<float2*>(p);
  return f;
}

// One warp per (token, super-block); lane l holds elements 8l..8l+7, which are words of sub-block l / 4.
__global__ void to_q8_fragments_kernel(const float* x, int n_tok, int64_t cols, int nt, Q8Frags out) {
  wait_for_previous_kernel();
  const int lane = threadIdx.x % 32, n_pad = 8 * nt;
  const int64_t warp = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32, n_sb = cols / 256;
  if (warp >= n_sb * n_pad) return;
  const int tok = (int)(warp % n_pad);
  const int64_t sb = warp / n_pad;
  float v[8] = {};
  if (tok < n_tok) {
    const float4* src = reinterpret_cast<const float4*>(x + (int64_t)tok * cols + sb * 256 + 8 * lane);
    const float4 a = src[0], b = src[1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  }
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(v[i]));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, o));
  const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
  int qsum = 0;  // of the quantized values: the mins then multiply the same x as the scales (see below)
  const int f = tok / 8, g = tok % 8, j = lane / 4;
  int* frag = reinterpret_cast<int*>(out.frag + ((sb * nt + f) * 4 + j / 2) * 32 + 4 * g);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    uint32_t packed = 0;
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const int q = max(-127, min(127, __float2int_rn(v[4 * h + b] * inv)));
      packed |= (uint32_t)(q & 0xFF) << (8 * b);
      qsum += q;
    }
    // Elements k0..k0+3 of the sub-block: b0 (k < 16) or b1 of lane t = (k0 % 16) / 4.
    const int k0 = 8 * (lane % 4) + 4 * h;
    frag[4 * ((k0 % 16) / 4) + 2 * (j % 2) + (k0 >= 16 ? 1 : 0)] = (int)packed;
  }
  qsum += __shfl_xor_sync(0xFFFFFFFFu, qsum, 1);
  qsum += __shfl_xor_sync(0xFFFFFFFFu, qsum, 2);
  const float dx = amax / 127.0f;
  if (lane == 0) out.scale[sb * n_pad + tok] = dx;
  if (lane % 4 == 0) reinterpret_cast<float*>(out.sums + (sb * nt + f) * 32 + 4 * g + j % 4)[j / 4] = __uint_as_float(to_tf32(dx * (float)qsum));
}

template <int NT, int SBS>
constexpr int int8_min_ctas() { return SBS == 1 ? (NT <= 2 ? 4 : NT <= 4 ? 3 : 2) : (NT <= 4 ? 3 : 2); }

// The body of one CTA: row tile `row_tile`, K split `split` of `n_splits` (as mma_rows in cuda_gemm.cu).
template <int NT, int SBS>
__device__ __forceinline__ void int8_rows(const DeviceWeight& w, const Q8Frags& x, float* y, int ldy, int n_tok, bool accumulate, float* part,
                                          int64_t row_tile, int split, int n_splits) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4, warp = threadIdx.x / 32;
  const int64_t row_base = row_tile * (kMmaWarps * kWarpRows) + warp * kWarpRows;
  const int64_t n_sb = w.cols / 256;
  const int64_t sb_begin = n_sb * split / n_splits, sb_end = n_sb * (split + 1) / n_splits;
  extern __shared__ int4 int8_smem[];
  constexpr int kStages = stage_count<SBS>(), kStageBytes = stage_bytes<SBS>(), kRowStride = SBS * kQ4KBlockBytes;
  uint8_t* slots = reinterpret_cast<uint8_t*>(int8_smem) + warp * warp_stage_bytes<SBS>();
  // A stage holds super-blocks sb0..sb0+SBS-1 of the warp's 32 rows, row r at r * kRowStride (rows past the
  // last repeat it): 9 * SBS pieces of 16 bytes a row, piece c = 9 * SBS * r + k; lane l copies pieces l,
  // l + 32, ..., so that each copy instruction of the warp reads whole runs of consecutive bytes of a few
  // rows. (32-bit offsets: int8_products_take holds the weight under 4 GiB.)
  constexpr int kPieces = kWarpRows * kRowStride / 16 / 32;
  uint32_t piece_at[kPieces];
  uint32_t piece_sb = 0;  // bit i: piece i is of the stage's second super-block (SBS = 2)
#pragma unroll
  for (int i = 0; i < kPieces; ++i) {
    const int c = lane + 32 * i, k = c % (9 * SBS);
    piece_at[i] = (uint32_t)(min(row_base + c / (9 * SBS), w.rows - 1) * w.row_bytes) + 16 * k;
    if (k >= 9) piece_sb |= 1u << i;
  }
  auto stage_copy = [&](int64_t sb0, int stage) {
    uint8_t* dst = slots + stage * kStageBytes + 16 * lane;
    const uint8_t* src = w.data + sb0 * kQ4KBlockBytes;
#pragma unroll
    for (int i = 0; i < kPieces; ++i)
      if (sb0 + ((piece_sb >> i) & 1) < sb_end) copy_async<16>(dst + 512 * i, src + piece_at[i]);
    copy_async_commit();
  };
  // Weights are no kernel's output: the first stages are fetched before the wait for the previous kernel.
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) stage_copy(sb_begin + SBS * s, s);
  wait_for_previous_kernel();
  float acc[2][NT][4] = {};
  int stage = 0;
  for (int64_t sb0 = sb_begin; sb0 < sb_end; sb0 += SBS) {
    copy_async_wait<kStages - 2>();
    __syncwarp();  // every lane's copies of this stage landed; every lane is done with the one refilled next
    stage_copy(sb0 + SBS * (kStages - 1), stage == 0 ? kStages - 1 : stage - 1);
    const uint8_t* stage_base = slots + stage * kStageBytes;
    stage = stage == kStages - 1 ? 0 : stage + 1;
#pragma unroll
    for (int u = 0; u < SBS; ++u) {
    const int64_t sb = sb0 + u;
    if (sb >= sb_end) break;
    const uint8_t* blk = stage_base + u * kQ4KBlockBytes;
    // Row slot i (0-3) is row g + 8i: m tile i / 2, fragment row g (i even) or g + 8.
    uint32_t sc_lo[4], sc_hi[4], mins[4][2];
    float d[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int4 h = *reinterpret_cast<const int4*>(blk + (g + 8 * i) * kRowStride);
      __half2 dm_h;
      memcpy(&dm_h, &h.x, 4);
      const float2 dm = __half22float2(dm_h);
      const uint32_t q0 = h.y, q1 = h.z, q2 = h.w;
      d[i] = dm.x;
      sc_lo[i] = q0 & 0x3F3F3F3Fu;
      sc_hi[i] = (q2 & 0x0F0F0F0Fu) | ((q0 >> 2) & 0x30303030u);
      const uint32_t m_lo = q1 & 0x3F3F3F3Fu, m_hi = ((q2 >> 4) & 0x0F0F0F0Fu) | ((q1 >> 2) & 0x30303030u);
      mins[i][0] = to_tf32(-dm.y * (float)((m_lo >> (8 * t)) & 0xFF));  // sub-block t
      mins[i][1] = to_tf32(-dm.y * (float)((m_hi >> (8 * t)) & 0xFF));  // sub-block t + 4
    }
    // Token tiles in chunks of up to four, so that the int32 sums of one chunk are live at a time (the
    // weights' words are read from shared memory again for each chunk).
    constexpr int FC = NT <= 4 ? NT : NT / 2;
    const int4* xf = x.frag + sb * NT * 4 * 32 + lane;
#pragma unroll
    for (int fc = 0; fc < NT; fc += FC) {
      int isum[2][FC][4] = {};
#pragma unroll
      for (int p = 0; p < 4; ++p) {  // sub-blocks 2p (low nibbles of bytes 32p..32p+31) and 2p + 1 (high)
        int4 b[FC];
#pragma unroll
        for (int f = 0; f < FC; ++f) b[f] = __ldg(xf + ((fc + f) * 4 + p) * 32);
        uint32_t w0[4], w1[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const uint8_t* q = blk + (g + 8 * i) * kRowStride + 16 + 32 * p + 4 * t;
          w0[i] = *reinterpret_cast<const uint32_t*>(q);
          w1[i] = *reinterpret_cast<const uint32_t*>(q + 16);
        }
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int j = 2 * p + hh;
#pragma unroll
          for (int m = 0; m < 2; ++m) {
            const uint32_t a0 = (w0[2 * m] >> (4 * hh)) & 0x0F0F0F0Fu, a1 = (w0[2 * m + 1] >> (4 * hh)) & 0x0F0F0F0Fu;
            const uint32_t a2 = (w1[2 * m] >> (4 * hh)) & 0x0F0F0F0Fu, a3 = (w1[2 * m + 1] >> (4 * hh)) & 0x0F0F0F0Fu;
            const int s0 = (int)(((j < 4 ? sc_lo[2 * m] : sc_hi[2 * m]) >> (8 * (j % 4))) & 0xFF);
            const int s1 = (int)(((j < 4 ? sc_lo[2 * m + 1] : sc_hi[2 * m + 1]) >> (8 * (j % 4))) & 0xFF);
#pragma unroll
            for (int f = 0; f < FC; ++f) {
              int c[4];
              mma_u8s8_16832(c, a0, a1, a2, a3, hh ? b[f].z : b[f].x, hh ? b[f].w : b[f].y);
              isum[m][f][0] += s0 * c[0];
              isum[m][f][1] += s0 * c[1];
              isum[m][f][2] += s1 * c[2];
              isum[m][f][3] += s1 * c[3];
            }
          }
        }
      }
#pragma unroll
      for (int f = 0; f < FC; ++f) {
        const int ft = fc + f;
        const float2 dx = __ldg(reinterpret_cast<const float2*>(x.scale + sb * 8 * NT + 8 * ft + 2 * t));
        const float2 sums = __ldg(x.sums + (sb * NT + ft) * 32 + lane);
#pragma unroll
        for (int m = 0; m < 2; ++m) {
          acc[m][ft][0] += (float)isum[m][f][0] * (d[2 * m] * dx.x);
          acc[m][ft][1] += (float)isum[m][f][1] * (d[2 * m] * dx.y);
          acc[m][ft][2] += (float)isum[m][f][2] * (d[2 * m + 1] * dx.x);
          acc[m][ft][3] += (float)isum[m][f][3] * (d[2 * m + 1] * dx.y);
          mma_tf32_1688(acc[m][ft], mins[2 * m][0], mins[2 * m + 1][0], mins[2 * m][1], mins[2 * m + 1][1], __float_as_uint(sums.x),
                        __float_as_uint(sums.y));
        }
      }
    }
    }
  }
  store_mma_tiles<2, NT>(acc, row_base, w.rows, n_tok, g, t, y, ldy, accumulate, part, split, n_splits);
}

template <int NT, int SBS>
__global__ void __launch_bounds__(kMmaThreads, (int8_min_ctas<NT, SBS>())) int8_rows_kernel(MmaMembers m, Q8Frags x, int n_tok,
                                                                                            bool accumulate, float* part) {
  const MmaMember k = mma_member(m, blockIdx.x);
  int8_rows<NT, SBS>(k.w, x, k.y, k.ldy, n_tok, accumulate, part + k.part_off, blockIdx.x - k.tile0, blockIdx.y, gridDim.y);
}

template <int NT, int SBS>
void launch_int8_rows_sbs(const DeviceWeight* const* ws, float* const* ys, const int* ldys, int count, const Q8Frags& x, int n_tok,
                          bool accumulate, float* part, size_t part_floats, cudaStream_t stream) {
  constexpr int smem = stage_count<SBS>() * stage_bytes<SBS>();
  const int slots = smem_set_once<int8_rows_kernel<NT, SBS>>(smem, kMmaThreads);
  const MmaPlan plan = plan_mma_launch(ws, ys, ldys, count, n_tok, kMmaWarps * kWarpRows, slots, part_floats);
  launch(int8_rows_kernel<NT, SBS>, dim3((unsigned)plan.tiles, (unsigned)plan.splits), dim3(kMmaThreads), smem, stream, pdl_enabled(), plan.m, x,
         n_tok, accumulate, part);
  reduce_k_splits(plan, n_tok, accumulate, part, stream);
}

// Super-blocks per stage: 1, or 2 with ROOFLINE_INT8_STAGE_SBS=2 (an experiment: longer runs of each row).
template <int NT>
void launch_int8_rows(const DeviceWeight* const* ws, float* const* ys, const int* ldys, int count, const Q8Frags& x, int n_tok,
                      bool accumulate, float* part, size_t part_floats, cudaStream_t stream) {
  static const bool two = [] {
    const char* e = std::getenv("ROOFLINE_INT8_STAGE_SBS");
    return e && std::atoi(e) == 2;
  }();
  if (two) launch_int8_rows_sbs<NT, 2>(ws, ys, ldys, count, x, n_tok, accumulate, part, part_floats, stream);
  else launch_int8_rows_sbs<NT, 1>(ws, ys, ldys, count, x, n_tok, accumulate, part, part_floats, stream);
}

int int8_mode_for_test = -1;  // -1: the environment decides

// The most rows a step may have for the int8 kernel: 0 by default, 32 with ROOFLINE_INT8_MMA=32, 64 with =1.
int int8_products_max_rows() {
  static const int env = [] {
    const char* e = std::getenv("ROOFLINE_INT8_MMA");
    const int v = e ? std::atoi(e) : 0;
    return v == 1 ? kMaxFusedRows : v == 32 ? 32 : 0;
  }();
  return int8_mode_for_test < 0 ? env : int8_mode_for_test == 1 ? kMaxFusedRows : 0;
}

}  // namespace

bool int8_products_take(const DeviceWeight& w, int n_tokens) {
  return n_tokens > 8 && n_tokens <= int8_products_max_rows() && w.type == DType::Q4_K && w.layout == WeightLayout::Raw && w.cols % 256 == 0 &&
         w.row_bytes == w.cols / 256 * kQ4KBlockBytes && (double)w.rows * (double)w.row_bytes < 4294967296.0 && code_arch() >= 80;
}

void int8_products(const DeviceWeight* const* ws, float* const* ys, const int* ldys, int count, const float* x, int n_tokens,
                   bool accumulate, float* part, size_t part_floats, void* x_scratch, cudaStream_t stream) {
  const int nt = 2 * ((n_tokens + 15) / 16);  // n8 tiles, an even count (as the f16 kernel pads its input)
  const int64_t cols = ws[0]->cols, n_sb = cols / 256;
  if (q8_frags_bytes(n_sb, nt) > (size_t)(8 * nt) * (size_t)cols * 2) fail("internal error: int8 activations larger than their scratch");
  const Q8Frags frags = q8_frags_at(x_scratch, n_sb, nt);
  const int64_t threads = n_sb * 8 * nt * 32;
  launch(to_q8_fragments_kernel, dim3((unsigned)((threads + 255) / 256)), dim3(256), 0, stream, pdl_enabled(), x, n_tokens, cols, nt, frags);
  switch (nt / 2) {
    case 1: return launch_int8_rows<2>(ws, ys, ldys, count, frags, n_tokens, accumulate, part, part_floats, stream);
    case 2: return launch_int8_rows<4>(ws, ys, ldys, count, frags, n_tokens, accumulate, part, part_floats, stream);
    case 3: return launch_int8_rows<6>(ws, ys, ldys, count, frags, n_tokens, accumulate, part, part_floats, stream);
    default: return launch_int8_rows<8>(ws, ys, ldys, count, frags, n_tokens, accumulate, part, part_floats, stream);
  }
}

}  // namespace roofline::cuda

namespace roofline {

void gpu_use_int8_products_for_test(int mode) { cuda::int8_mode_for_test = mode; }

}  // namespace roofline
