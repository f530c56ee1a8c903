// Products of more than 8 rows. Up to 64 rows (batched decode) with Q4_K or Q6_K weights: one kernel
// dequantizes the weights in registers straight into f16 tensor-core fragments (mma.sync, f32
// accumulation), so each weight byte is read once per step and nothing is written back. Otherwise
// (prefill, other types) the weight is dequantized to f16 in row chunks that fit the scratch buffer and
// multiplied with cuBLAS (f16 inputs, f32 accumulation). Both are free of atomics, so results are
// reproducible.
#include <algorithm>

#include "backend/cuda/cuda_dequant.cuh"
#include "backend/cuda/cuda_kernels.cuh"

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

// f32 -> f16, saturating at the f16 range (an activation beyond it would otherwise become inf).
__global__ void to_f16_kernel(const float* x, int64_t n, __half* out) {
  wait_for_previous_kernel();
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = __float2half(fminf(fmaxf(x[i], -65504.0f), 65504.0f));
}

// --- Batched decode (9..64 rows): weights dequantized in registers, f16 tensor-core mma ---
// Each warp owns 16 x MT weight rows (MT m16 tiles) and every token (NT n8 tiles). The four lanes that
// share a row in the mma fragment layout (lane = 4 * row_in_tile + t) read that row's super-block
// with 16-byte loads, dequantize their 64 weights straight into A fragments (f16), and multiply them
// with activations prepared by to_f16_mma_kernel. The order of the 16 weights of one k16 step inside a
// fragment does not matter as long as A and B agree, so each lane takes groups of 4 consecutive
// weights in the order its loads deliver them, and the activations are stored with each group of 4
// as (x0, x2, x1, x3): then one 8-byte load is exactly a lane's B fragment (k-slots 2t, 2t+1 hold
// x0, x2 and 2t+8, 2t+9 hold x1, x3; the weight nibbles of bytes 0 and 2 land in one half2 with one
// mask). Weights go from DRAM to registers once per step; activations come through L1.
constexpr int kMmaWarps = 4;
constexpr int kMmaThreads = kMmaWarps * 32;
constexpr int kMaxFusedRows = 64;

__device__ __forceinline__ void mma_16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                          uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t h2_bits(__half2 h) {
  uint32_t u;
  memcpy(&u, &h, 4);
  return u;
}
__device__ __forceinline__ __half2 bits_h2(uint32_t u) {
  __half2 h;
  memcpy(&h, &u, 4);
  return h;
}

// Unsigned integers in the low bits of each half of `v` (< 1024) -> half2 of their values.
__device__ __forceinline__ __half2 small_uints_h2(uint32_t v) {
  return __hsub2(bits_h2(v | 0x64006400u), bits_h2(0x64006400u));  // (1024 + q) - 1024, exact
}

// One row's super-block as lane t holds it. Q4_K (GGUF blocks): header + quant bytes [16t, 16t+16) and
// [64+16t, 64+16t+16); load h, word u, nibble p hold elements 4u..4u+3 of sub-block 2(2h + t/2) + p at
// byte offset 16(t%2) of that sub-block. Q6_K (planes): low nibbles of chunk c = t + 4h (elements
// 32c..32c+31) and its 2-bit highs; word u, part p -> elements 32c + 16p + 4u.
template <DType T>
struct RowBlock;

template <>
struct RowBlock<DType::Q4_K> {
  uint32_t dm, sc[3];  // d and dmin (f16 pair), 12 bytes of packed 6-bit scales and mins
  uint32_t q[8];
  __device__ __forceinline__ void load(const DeviceWeight& w, int64_t row, int64_t sb, int t) {
    const uint8_t* blk = w.data + row * w.row_bytes + sb * 144;
    const int4 hdr = __ldg(reinterpret_cast<const int4*>(blk));
    const int4 q0 = __ldg(reinterpret_cast<const int4*>(blk + 16 + 16 * t));
    const int4 q1 = __ldg(reinterpret_cast<const int4*>(blk + 80 + 16 * t));
    dm = hdr.x; sc[0] = hdr.y; sc[1] = hdr.z; sc[2] = hdr.w;
    q[0] = q0.x; q[1] = q0.y; q[2] = q0.z; q[3] = q0.w;
    q[4] = q1.x; q[5] = q1.y; q[6] = q1.z; q[7] = q1.w;
  }
  // Scale and offset (as half2 broadcasts) of the sub-block of load h, nibble p: w = q * scale - offset.
  // (Register selects only: a run-time index into these arrays would put them in local memory.) The
  // 6-bit scale and min become halves exactly through the 1024 + n trick and are multiplied by d and
  // dmin in one half2 product (d * sc rounds to half once, as a float product converted would), which
  // keeps this off the slow int/float conversion pipe.
  __device__ __forceinline__ void scales(int h, int p, int t, __half2& scale, __half2& offset) const {
    const int sh = 8 * (2 * (t / 2) + p);  // byte of sub-block 4h + 2(t/2) + p within its 4-byte group
    uint32_t s, m;
    if (h == 0) {
      s = (sc[0] >> sh) & 63;
      m = (sc[1] >> sh) & 63;
    } else {
      s = ((sc[2] >> sh) & 0xF) | (((sc[0] >> (sh + 6)) & 3) << 4);
      m = ((sc[2] >> (sh + 4)) & 0xF) | (((sc[1] >> (sh + 6)) & 3) << 4);
    }
    const __half2 sm = __hmul2(small_uints_h2(s | (m << 16)), bits_h2(dm));  // (d * sc, dmin * m)
    scale = __low2half2(sm);
    offset = __high2half2(sm);
  }
  // A-fragment halves for word u of load h, nibble p: (e0, e2) and (e1, e3).
  __device__ __forceinline__ void group(int h, int p, int u, __half2 scale, __half2 offset, uint32_t& lo, uint32_t& hi) const {
    const uint32_t v = q[4 * h + u] >> (4 * p);
    lo = h2_bits(__hfma2(small_uints_h2(v & 0x000F000Fu), scale, __hneg2(offset)));
    hi = h2_bits(__hfma2(small_uints_h2((v >> 8) & 0x000F000Fu), scale, __hneg2(offset)));
  }
  // Offset in halves, inside the super-block, of the activations of word u of load h, nibble p.
  static __device__ __forceinline__ int x_offset(int h, int p, int u, int t) { return 64 * (t / 2) + 16 * (t % 2) + 128 * h + 32 * p + 4 * u; }
};

template <>
struct RowBlock<DType::Q6_K> {
  uint32_t lo[8], hi[4];
  uint32_t sc[4];  // 16 int8 sub-block scales
  __half d;
  __device__ __forceinline__ void load(const DeviceWeight& w, int64_t row, int64_t sb, int t) {
    const int64_t n_sb = w.cols / 256;
    const uint8_t* lo_p = w.data + row * (w.cols / 2) + sb * 128;
    const uint8_t* hi_p = w.plane1 + row * (w.cols / 4) + sb * 64;
    const int4 l0 = __ldg(reinterpret_cast<const int4*>(lo_p + 16 * t));
    const int4 l1 = __ldg(reinterpret_cast<const int4*>(lo_p + 64 + 16 * t));
    const int2 h0 = __ldg(reinterpret_cast<const int2*>(hi_p + 8 * t));
    const int2 h1 = __ldg(reinterpret_cast<const int2*>(hi_p + 32 + 8 * t));
    const int4 s = __ldg(reinterpret_cast<const int4*>(w.plane2 + row * (w.cols / 16) + sb * 16));
    d = __ldg(reinterpret_cast<const __half*>(w.plane3) + row * n_sb + sb);
    lo[0] = l0.x; lo[1] = l0.y; lo[2] = l0.z; lo[3] = l0.w;
    lo[4] = l1.x; lo[5] = l1.y; lo[6] = l1.z; lo[7] = l1.w;
    hi[0] = h0.x; hi[1] = h0.y; hi[2] = h1.x; hi[3] = h1.y;
    sc[0] = s.x; sc[1] = s.y; sc[2] = s.z; sc[3] = s.w;
  }
  __device__ __forceinline__ void scales(int h, int p, int t, __half2& scale, __half2& offset) const {
    // Sub-block 2(t + 4h) + p: word 2h + t/2, byte 2(t%2) + p.
    const uint32_t word = (t / 2) ? sc[2 * h + 1] : sc[2 * h];
    // The signed scale biased by 128 becomes a half exactly (1024 + 128 + sc), then times d.
    const uint32_t biased = ((word >> (8 * (2 * (t % 2) + p))) & 0xFF) ^ 0x80;
    const __half sv = __hsub(__ushort_as_half((unsigned short)(0x6400 | biased)), __ushort_as_half((unsigned short)0x6480));
    scale = __half2half2(__hmul(sv, d));
    offset = __half2half2(__ushort_as_half((unsigned short)0));
  }
  __device__ __forceinline__ void group(int h, int p, int u, __half2 scale, __half2, uint32_t& lo_out, uint32_t& hi_out) const {
    const uint32_t q = ((lo[4 * h + u] >> (4 * p)) & 0x0F0F0F0Fu) | (((hi[2 * h + p] >> (2 * u)) & 0x03030303u) << 4);
    const __half2 bias = __float2half2_rn(32.0f);
    lo_out = h2_bits(__hmul2(__hsub2(small_uints_h2(q & 0x00FF00FFu), bias), scale));
    hi_out = h2_bits(__hmul2(__hsub2(small_uints_h2((q >> 8) & 0x00FF00FFu), bias), scale));
  }
  static __device__ __forceinline__ int x_offset(int h, int p, int u, int t) { return 32 * t + 128 * h + 16 * p + 4 * u; }
};

// y[t * ldy + r] (+)= W[r, :] . x[t, :] for t < n_tok <= 8 * NT. x: f16 activations from
// to_f16_mma_kernel. grid.x: 128-row tiles; grid.y splits K (for parallelism on small matrices): with
// more than one split each CTA writes partial sums to part[(split * n_tok + t) * rows + r] and
// split_k_reduce_kernel adds them in split order.
// CTAs per SM the register budget aims for: fewer tokens need fewer accumulators (Q6_K holds more
// weight bytes per lane, so one step less).
template <DType T, int NT>
constexpr int mma_min_ctas() { return T == DType::Q4_K ? (NT <= 2 ? 4 : NT <= 4 ? 3 : 2) : (NT <= 2 ? 3 : 2); }

template <DType T, int NT, int MT>
__global__ void __launch_bounds__(kMmaThreads, (mma_min_ctas<T, NT>())) mma_rows_kernel(DeviceWeight w, const __half* x, int n_tok, float* y, int ldy,
                                                              bool accumulate, float* part) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t row_base = (int64_t)blockIdx.x * (kMmaWarps * 16 * MT) + (threadIdx.x / 32) * (16 * MT);
  const int64_t n_sb = w.cols / 256;
  const int64_t sb_begin = n_sb * blockIdx.y / gridDim.y, sb_end = n_sb * (blockIdx.y + 1) / gridDim.y;
  // Rows g, g + 8 (m tile 0) and g + 16, g + 24 (m tile 1); loads past the last row repeat it.
  int64_t rows[2 * MT];
#pragma unroll
  for (int i = 0; i < 2 * MT; ++i) rows[i] = min(row_base + g + 8 * i, w.rows - 1);
  wait_for_previous_kernel();
  const __half* xt[NT];  // this lane's token (g) of each n tile; tokens past n_tok repeat the last
#pragma unroll
  for (int f = 0; f < NT; ++f) xt[f] = x + (int64_t)min(8 * f + g, n_tok - 1) * w.cols;
  float acc[MT][NT][4] = {};
  for (int64_t sb = sb_begin; sb < sb_end; ++sb) {
    RowBlock<T> blk[2 * MT];
#pragma unroll
    for (int i = 0; i < 2 * MT; ++i) blk[i].load(w, rows[i], sb, t);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int p = 0; p < 2; ++p) {
        __half2 scale[2 * MT], offset[2 * MT];
#pragma unroll
        for (int i = 0; i < 2 * MT; ++i) blk[i].scales(h, p, t, scale[i], offset[i]);
#pragma unroll
        for (int u2 = 0; u2 < 4; u2 += 2) {
          int4 b[NT];  // B fragments of words u2 (x, y) and u2 + 1 (z, w)
#pragma unroll
          for (int f = 0; f < NT; ++f)
            b[f] = __ldg(reinterpret_cast<const int4*>(xt[f] + sb * 256 + RowBlock<T>::x_offset(h, p, u2, t)));
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
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int f = 0; f < NT; ++f)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int64_t r = row_base + 16 * m + g + 8 * (i / 2);
        const int tok = 8 * f + 2 * t + i % 2;
        if (r >= w.rows || tok >= n_tok) continue;
        const float v = acc[m][f][i];
        if (gridDim.y > 1) {
          part[((int64_t)blockIdx.y * n_tok + tok) * w.rows + r] = v;
        } else {
          float* dst = y + (int64_t)tok * ldy + r;
          *dst = accumulate ? *dst + v : v;
        }
      }
}

// f32 activations -> f16 (saturated) with each group of 4 stored as (x0, x2, x1, x3) for mma_rows_kernel.
__global__ void to_f16_mma_kernel(const float* x, int64_t n, __half* out) {
  wait_for_previous_kernel();
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int64_t src = (i & ~(int64_t)3) | ((i & 1) << 1) | ((i >> 1) & 1);  // swaps positions 1 and 2
  out[i] = __float2half(fminf(fmaxf(x[src], -65504.0f), 65504.0f));
}

__global__ void split_k_reduce_kernel(const float* part, int splits, int n_tok, int64_t rows, float* y, int ldy, bool accumulate) {
  wait_for_previous_kernel();
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n_tok * rows) return;
  const int64_t n = i / rows, r = i % rows;
  float sum = 0;
  for (int s = 0; s < splits; ++s) sum += part[((int64_t)s * n_tok + n) * rows + r];
  float* dst = y + n * ldy + r;
  *dst = accumulate ? *dst + sum : sum;
}

template <DType T, int NT, int MT>
void launch_mma_rows_nt(const DeviceWeight& w, const __half* x, int n_tok, float* y, int ldy, bool accumulate, float* part,
                        size_t part_floats, cudaStream_t stream) {
  // About three CTAs per SM of an H200 (132 SMs): split K when the row tiles alone are fewer, with at
  // least one super-block per split and partial sums that fit the scratch.
  constexpr int kRowsPerCta = kMmaWarps * 16 * MT;
  const int64_t tiles = (w.rows + kRowsPerCta - 1) / kRowsPerCta, n_sb = w.cols / 256;
  int64_t splits = (396 + tiles / 2) / tiles;
  splits = std::min<int64_t>({splits, n_sb, 32, (int64_t)(part_floats / ((size_t)n_tok * (size_t)w.rows))});
  splits = std::max<int64_t>(splits, 1);
  launch(mma_rows_kernel<T, NT, MT>, dim3((unsigned)tiles, (unsigned)splits), dim3(kMmaThreads), 0, stream, pdl_enabled(), w, x, n_tok,
         y, ldy, accumulate, part);
  if (splits > 1) {
    const int64_t n = (int64_t)n_tok * w.rows;
    launch(split_k_reduce_kernel, dim3((unsigned)((n + 255) / 256)), dim3(256), 0, stream, pdl_enabled(), part, (int)splits,
           n_tok, w.rows, y, ldy, accumulate);
  }
}

// Two m16 tiles (32 weight rows) per warp: measured on an H200 (qwen3-32b, -npl 16/64), 636/852 tok/s
// against 618/655 with one tile (fewer registers, but each activation fragment feeds half the mma).
constexpr int kMmaTiles = 2;

template <DType T>
void launch_mma_rows(const DeviceWeight& w, const __half* x, int n_tok, float* y, int ldy, bool accumulate, float* part,
                     size_t part_floats, cudaStream_t stream) {
  switch ((n_tok + 15) / 16) {  // n8 tiles rounded up to an even count
    case 1: launch_mma_rows_nt<T, 2, kMmaTiles>(w, x, n_tok, y, ldy, accumulate, part, part_floats, stream); break;
    case 2: launch_mma_rows_nt<T, 4, kMmaTiles>(w, x, n_tok, y, ldy, accumulate, part, part_floats, stream); break;
    case 3: launch_mma_rows_nt<T, 6, kMmaTiles>(w, x, n_tok, y, ldy, accumulate, part, part_floats, stream); break;
    default: launch_mma_rows_nt<T, 8, kMmaTiles>(w, x, n_tok, y, ldy, accumulate, part, part_floats, stream); break;  // <= 64
  }
}

}  // namespace

bool gemm_fuses_dequant(const DeviceWeight& w, int n_tokens) {
  if (n_tokens < 1 || n_tokens > kMaxFusedRows || w.cols % 256 != 0) return false;
  return (w.type == DType::Q4_K && w.layout == WeightLayout::Raw) || (w.type == DType::Q6_K && w.layout == WeightLayout::Q6KPlanes);
}

void gemm(cublasHandle_t cublas, const DeviceWeight& w, const float* x, int n_tokens, float* y, int ldy, bool accumulate,
          __half* scratch, size_t scratch_elems, __half* x_f16, cudaStream_t stream) {
  const int64_t n_x = (int64_t)n_tokens * w.cols;
  if (gemm_fuses_dequant(w, n_tokens)) {
    launch(to_f16_mma_kernel, dim3((unsigned)((n_x + 255) / 256)), dim3(256), 0, stream, pdl_enabled(), x, n_x, x_f16);
    // The dequantization scratch is free in this path: it holds the split-K partial sums.
    float* part = reinterpret_cast<float*>(scratch);
    const size_t part_floats = scratch_elems / 2;
    if (w.type == DType::Q4_K) launch_mma_rows<DType::Q4_K>(w, x_f16, n_tokens, y, ldy, accumulate, part, part_floats, stream);
    else launch_mma_rows<DType::Q6_K>(w, x_f16, n_tokens, y, ldy, accumulate, part, part_floats, stream);
    return;
  }
  launch(to_f16_kernel, dim3((unsigned)((n_x + 255) / 256)), dim3(256), 0, stream, pdl_enabled(), x, n_x, x_f16);
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
      launch(float_rows_f16_kernel, dim3((unsigned)((n + 255) / 256)), dim3(256), 0, stream, pdl_enabled(), w, r0, n_rows, scratch);
    } else {
      const int64_t n_chunks = n_rows * (w.cols / 32);
      launch(dequant_rows_f16_kernel, dim3((unsigned)((n_chunks + 127) / 128)), dim3(128), 0, stream, pdl_enabled(), w, r0, n_rows, scratch);
    }
    // Column-major view: Y^T[n_rows x n_tokens] = W[n_rows x K] * X^T[K x n_tokens].
    const cublasStatus_t st = cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)n_rows, n_tokens, (int)w.cols, &alpha,
                                           scratch, CUDA_R_16F, (int)w.cols, x_f16, CUDA_R_16F, (int)w.cols, &beta,
                                           y + r0, CUDA_R_32F, ldy, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS) fail("cuBLAS GEMM failed with status {}", (int)st);
  }
}

}  // namespace roofline::cuda
