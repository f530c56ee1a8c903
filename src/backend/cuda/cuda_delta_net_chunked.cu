// The chunked form of the gated delta rule (see cuda_delta_net.cuh), for prefill runs: the rows of a
// sequence in chunks of C = 64 with the intra-chunk products on tensor cores (mma.sync m16n8k8 tf32,
// fp32 accumulation; sm_80+). Per head, with S (dk x dv) the state at the chunk's start, G_t the
// cumulative log decay inside the chunk (G_t = g_0 + ... + g_t <= 0), Gamma_t = exp(G_t):
//   A[t][s] = beta_t exp(G_t - G_s) k_t.k_s  (s < t),   T = (I + A)^-1  (unit lower triangular)
//   W = T diag(beta Gamma) K,   U = T diag(beta) V,   P[t][s] = exp(G_t - G_s) q_t.k_s  (s <= t)
//   Delta = U - W S   (the rows delta_t of the token-by-token rule, unrolled over the chunk)
//   O = diag(Gamma) Q S + P Delta,   S <- Gamma_last S + sum_t exp(G_last - G_t) k_t delta_t^T
// Every exponent is <= 0, so nothing overflows. Two kernels: chunk_prep (one CTA per chunk and v-head,
// all chunks at once: A, T, W, U, P, G into scratch) and chunk_scan (one CTA per v-head and 64 value
// columns of a sequence, the chunks in order with its state block in shared memory: the state
// columns are independent given W, K, U, P). T is solved in fp32 on the CUDA cores (16 x 16 diagonal
// blocks, then the blocks below them); everything else is mma.
//
// 27B shape (48 v-heads, dk = dv = 128), 512 tokens: chunk_prep 384 CTAs x ~2k mma, chunk_scan 96 CTAs
// x 8 chunks x ~1.7k mma and ~130 KB of L2 reads per chunk: ~15-30 us for both on an H200, against
// ~60-100 us for the recurrent kernel's 512 dependent steps.
#include "backend/cuda/cuda_delta_net_impl.cuh"

namespace roofline::cuda {

using dn::Shape;

namespace {

constexpr int CH = dn::kChunk;  // 64
constexpr int kMaxD = 128;      // dk, dv bound of this form
constexpr int kThreads = 256;   // 8 warps in both kernels

__device__ __forceinline__ uint32_t tf32_bits(float x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
#else
  return __float_as_uint(x);
#endif
}

__device__ __forceinline__ void mma_tf32(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
  __trap();  // the host never launches this form before sm_80
#endif
}

// c += a b for fp32 fragments (A 16x8: a0 (g, t), a1 (g+8, t), a2 (g, t+4), a3 (g+8, t+4); B 8x8: b0 (t, g),
// b1 (t+4, g); C: c0 (g, 2t), c1 (g, 2t+1), c2 (g+8, 2t), c3 (g+8, 2t+1); g = lane / 4, t = lane % 4).
// PRECISE: x = hi + lo in tf32 each and a b = al bh + ah bl + ah bh (the lo lo term dropped).
template <bool PRECISE>
__device__ __forceinline__ void mma(float (&c)[4], const float (&a)[4], const float (&b)[2]) {
  uint32_t ah[4], bh[2];
#pragma unroll
  for (int i = 0; i < 4; ++i) ah[i] = tf32_bits(a[i]);
#pragma unroll
  for (int i = 0; i < 2; ++i) bh[i] = tf32_bits(b[i]);
  if constexpr (PRECISE) {
    uint32_t al[4], bl[2];
#pragma unroll
    for (int i = 0; i < 4; ++i) al[i] = tf32_bits(a[i] - __uint_as_float(ah[i]));
#pragma unroll
    for (int i = 0; i < 2; ++i) bl[i] = tf32_bits(b[i] - __uint_as_float(bh[i]));
    mma_tf32(c, al, bh);
    mma_tf32(c, ah, bl);
  }
  mma_tf32(c, ah, bh);
}

// ---------------------------------------------------------------------------------------------------
// chunk_prep: one CTA per (chunk, v-head, sequence). Shared memory (floats):
//   ks [64][LDK]  k rows (zero past the chunk / past dk), later diag(beta Gamma) K
//   qv [64][LDK]  q rows, later diag(beta) V
//   as [64][LDA]  A;  ts [64][LDA]  T;  xs [3][16][16] block products;  gs [64] G;  bs [64] beta
// LDK = 132 and LDA = 68 are 4 mod 32: the A-operand reads (row g, column t) hit 32 distinct banks.
constexpr int LDK = kMaxD + 4, LDA = CH + 4;
constexpr size_t kPrepSmemFloats = 2 * CH * LDK + 2 * CH * LDA + 3 * 256 + 2 * CH;

template <bool PRECISE>
__global__ void __launch_bounds__(kThreads) chunk_prep_kernel(Shape sh, DeltaNetSeqs seqs, const float* xc, const float* gb,
                                                              float* w_out, float* u_out, float* p_out, float* g_out) {
  extern __shared__ float4 smem4[];
  float* smem = reinterpret_cast<float*>(smem4);
  float* ks = smem;
  float* qv = ks + CH * LDK;
  float* as = qv + CH * LDK;
  float* ts = as + CH * LDA;
  float* xs = ts + CH * LDA;
  float* gs = xs + 3 * 256;
  float* bs = gs + CH;
  wait_for_previous_kernel();
  if ((int)blockIdx.z >= *seqs.count) return;
  const DeltaNetSeqDev rec = seqs.seqs[blockIdx.z];
  const int c0 = blockIdx.x * CH;
  if (c0 >= rec.n_rows) return;
  const int cn = min(CH, rec.n_rows - c0);
  const int64_t r0 = rec.first_row + c0;
  const int h = blockIdx.y, hk = h % sh.n_k;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, tl = lane % 4;
  const int dk4 = sh.dk / 4, dkp = (sh.dk + 7) / 8 * 8, dvp = (sh.dv + 7) / 8 * 8;

  // k, q rows (float4; zero-padded to 128 columns and 64 rows).
  for (int idx = tid; idx < CH * (kMaxD / 4); idx += kThreads) {
    const int t = idx / (kMaxD / 4), f = idx % (kMaxD / 4);
    float4 kk = make_float4(0.f, 0.f, 0.f, 0.f), qq = kk;
    if (t < cn && f < dk4) {
      const float* x = xc + (r0 + t) * sh.C;
      kk = reinterpret_cast<const float4*>(x + sh.key_dim + hk * sh.dk)[f];
      qq = reinterpret_cast<const float4*>(x + hk * sh.dk)[f];
    }
    *reinterpret_cast<float4*>(ks + t * LDK + 4 * f) = kk;
    *reinterpret_cast<float4*>(qv + t * LDK + 4 * f) = qq;
  }
  // G: inclusive prefix sum of g over the chunk (warp 0: two values per lane, then a shuffle scan).
  if (warp == 0) {
    const int64_t stride = 2 * sh.n_v;
    const float ga = 2 * lane < cn ? gb[(r0 + 2 * lane) * stride + h] : 0.0f;
    const float gc = 2 * lane + 1 < cn ? gb[(r0 + 2 * lane + 1) * stride + h] : 0.0f;
    float sum = ga + gc;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const float o = __shfl_up_sync(0xffffffffu, sum, off);
      if (lane >= off) sum += o;
    }
    const float before = sum - (ga + gc);
    gs[2 * lane] = before + ga;
    gs[2 * lane + 1] = sum;
    bs[2 * lane] = 2 * lane < cn ? gb[(r0 + 2 * lane) * stride + sh.n_v + h] : 0.0f;
    bs[2 * lane + 1] = 2 * lane + 1 < cn ? gb[(r0 + 2 * lane + 1) * stride + sh.n_v + h] : 0.0f;
  }
  __syncthreads();

  // K K^T and Q K^T: warp w owns rows 16 (w / 2) .. +15 and columns 32 (w % 2) .. +31 of both.
  {
    const int mt = warp / 2, nb = (warp % 2) * 4;
    float ck[4][4] = {}, cq[4][4] = {};
    for (int kk = 0; kk < dkp; kk += 8) {
      const float* kr = ks + (16 * mt + g) * LDK + kk + tl;
      const float* qr = qv + (16 * mt + g) * LDK + kk + tl;
      const float ak[4] = {kr[0], kr[8 * LDK], kr[4], kr[8 * LDK + 4]};
      const float aq[4] = {qr[0], qr[8 * LDK], qr[4], qr[8 * LDK + 4]};
#pragma unroll
      for (int n = 0; n < 4; ++n) {
        const float* br = ks + (8 * (nb + n) + g) * LDK + kk + tl;
        const float b[2] = {br[0], br[4]};
        mma<PRECISE>(ck[n], ak, b);
        mma<PRECISE>(cq[n], aq, b);
      }
    }
#pragma unroll
    for (int n = 0; n < 4; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int t = 16 * mt + g + 8 * (e / 2), s = 8 * (nb + n) + 2 * tl + (e % 2);
        const float decay = s <= t ? expf(gs[t] - gs[s]) : 0.0f;
        as[t * LDA + s] = s < t ? bs[t] * decay * ck[n][e] : 0.0f;
        if (t < cn) p_out[((r0 + t) * sh.n_v + h) * CH + s] = decay * cq[n][e];
      }
  }
  __syncthreads();

  // diag(beta Gamma) K in place, diag(beta) V over the q rows; threads 0-63 invert the four 16 x 16
  // diagonal blocks of I + A (thread = one column of one block, by substitution down the column), the
  // others zero T's blocks above the diagonal.
  for (int idx = tid; idx < CH * (kMaxD / 4); idx += kThreads) {
    const int t = idx / (kMaxD / 4), f = idx % (kMaxD / 4);
    float4* kp = reinterpret_cast<float4*>(ks + t * LDK + 4 * f);
    const float sk = bs[t] * expf(gs[t]);
    float4 kk = *kp;
    kk.x *= sk, kk.y *= sk, kk.z *= sk, kk.w *= sk;
    *kp = kk;
    float4 vv = make_float4(0.f, 0.f, 0.f, 0.f);
    if (t < cn && 4 * f < sh.dv) {
      const float* x = xc + (r0 + t) * sh.C + 2 * sh.key_dim + h * sh.dv + 4 * f;
      vv = make_float4(x[0], 4 * f + 1 < sh.dv ? x[1] : 0.f, 4 * f + 2 < sh.dv ? x[2] : 0.f, 4 * f + 3 < sh.dv ? x[3] : 0.f);
      const float b = bs[t];
      vv.x *= b, vv.y *= b, vv.z *= b, vv.w *= b;
    }
    *reinterpret_cast<float4*>(qv + t * LDK + 4 * f) = vv;
  }
  if (tid < CH) {
    const int b0 = (tid / 16) * 16, u = tid % 16, col = b0 + u;
    for (int r = 0; r < 16; ++r) {
      const int row = b0 + r;
      float v;
      if (r < u) v = 0.0f;
      else if (r == u) v = 1.0f;
      else {
        float acc = 0.0f;
        for (int q = u; q < r; ++q) acc += as[row * LDA + b0 + q] * ts[(b0 + q) * LDA + col];
        v = -acc;
      }
      ts[row * LDA + col] = v;
    }
  } else {
    for (int idx = tid - CH; idx < 6 * 256; idx += kThreads - CH) {
      const int blk = idx / 256, e = idx % 256;  // blocks (0,1) (0,2) (0,3) (1,2) (1,3) (2,3)
      const int bi = blk < 3 ? 0 : blk < 5 ? 1 : 2;
      const int bj = blk < 3 ? blk + 1 : blk < 5 ? blk - 1 : 3;
      ts[(16 * bi + e / 16) * LDA + 16 * bj + e % 16] = 0.0f;
    }
  }
  __syncthreads();
  // Blocks below the diagonal, block row by block row: T_ij = -T_ii sum_{m=j}^{i-1} A_im T_mj.
  for (int i = 1; i < 4; ++i) {
    const int r = tid / 16, c = tid % 16;
    for (int j = 0; j < i; ++j) {
      float acc = 0.0f;
      for (int m = j; m < i; ++m)
        for (int q = 0; q < 16; ++q) acc += as[(16 * i + r) * LDA + 16 * m + q] * ts[(16 * m + q) * LDA + 16 * j + c];
      xs[j * 256 + r * 16 + c] = acc;
    }
    __syncthreads();
    for (int j = 0; j < i; ++j) {
      float acc = 0.0f;
      for (int q = 0; q <= r; ++q) acc += ts[(16 * i + r) * LDA + 16 * i + q] * xs[j * 256 + q * 16 + c];
      ts[(16 * i + r) * LDA + 16 * j + c] = -acc;
    }
    __syncthreads();
  }

  // W = T (diag(beta Gamma) K) and U = T (diag(beta) V): warp w owns rows 16 (w / 2) .. +15 and column
  // tiles 8 (w % 2) .. +7 (of 8 columns each); T is lower triangular, so k stops at the rows' end.
  {
    const int mt = warp / 2, nb = (warp % 2) * 8;
    for (int which = 0; which < 2; ++which) {
      const float* xsrc = which == 0 ? ks : qv;
      const int width = which == 0 ? dkp : dvp, real = which == 0 ? sh.dk : sh.dv;
      float acc[8][4] = {};
      for (int kk = 0; kk < 16 * mt + 16; kk += 8) {
        const float* tr = ts + (16 * mt + g) * LDA + kk + tl;
        const float a[4] = {tr[0], tr[8 * LDA], tr[4], tr[8 * LDA + 4]};
#pragma unroll
        for (int n = 0; n < 8; ++n) {
          if (8 * (nb + n) >= width) break;
          const float* br = xsrc + (kk + tl) * LDK + 8 * (nb + n) + g;
          const float b[2] = {br[0], br[4 * LDK]};
          mma<PRECISE>(acc[n], a, b);
        }
      }
      float* dst = which == 0 ? w_out : u_out;
#pragma unroll
      for (int n = 0; n < 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int t = 16 * mt + g + 8 * (e / 2), col = 8 * (nb + n) + 2 * tl + (e % 2);
          if (t < cn && col < real) dst[((r0 + t) * sh.n_v + h) * real + col] = acc[n][e];
        }
    }
  }
  if (tid < cn) g_out[(r0 + tid) * sh.n_v + h] = gs[tid];
}

// ---------------------------------------------------------------------------------------------------
// chunk_scan: one CTA per (v-head, block of BV value columns, sequence). Shared memory: the state block
// ss [128][LDS] (row = key index i, column = value index j - j0) and delta ds [64][LDS]; LDS = BV + 8
// is 8 mod 32, so the B-operand reads (row t, column g) hit 32 distinct banks. Per chunk:
//   1. warp w: X = W S and Y = Q S for rows 16 (w % 4) .. +15, column tiles (w / 4) NT/2 .. +NT/2-1
//   2. Delta = U - X -> ds                                                   | barrier
//   3. the same warp: O = diag(Gamma) Y + P Delta -> o (global)
//   4. warp w: S rows 16 w .. +15 <- Gamma_last S + K'^T Delta, K'_t = exp(G_last - G_t) k_t  | barrier
// A operands (W, Q, P, K) come straight from global memory (L2; each element read once per CTA).
template <int BV>
constexpr int scan_lds() {
  return BV + 8;
}
template <int BV>
constexpr size_t scan_smem_floats() {
  return (size_t)(kMaxD + CH) * scan_lds<BV>();
}

template <bool PRECISE, int BV>
__global__ void __launch_bounds__(kThreads) chunk_scan_kernel(Shape sh, DeltaNetLayerDev L, DeltaNetSeqs seqs, const float* qkv,
                                                              const float* xc, const float* w_in, const float* u_in,
                                                              const float* p_in, const float* g_in, float* o) {
  constexpr int LDS = scan_lds<BV>(), NT = BV / 8, NTW = NT / 2;
  extern __shared__ float4 smem4[];
  float* ss = reinterpret_cast<float*>(smem4);
  float* ds = ss + kMaxD * LDS;
  wait_for_previous_kernel();
  if ((int)blockIdx.y >= *seqs.count) return;
  const DeltaNetSeqDev rec = seqs.seqs[blockIdx.y];
  float* cell = L.state + (int64_t)rec.cell * L.cell_stride;
  const int bph = (sh.dv + BV - 1) / BV;
  const int h = blockIdx.x / bph, j0 = (blockIdx.x % bph) * BV, hk = h % sh.n_k;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, tl = lane % 4;
  const int dkp = (sh.dk + 7) / 8 * 8;
  dn::slide_window(sh, rec, cell, qkv, blockIdx.x, gridDim.x);

  // The state block, transposed into ss: thread (j, i8) moves S[h][j][8 i8 .. 8 i8 + 7] (two float4).
  float* srec = cell + sh.conv_floats + (int64_t)h * sh.dv * sh.dk;
  for (int idx = tid; idx < BV * (kMaxD / 8); idx += kThreads) {
    const int jl = idx % BV, i8 = idx / BV, j = j0 + jl;
    float v[8] = {};
    if (!rec.fresh && j < sh.dv && 8 * i8 < sh.dk) {
      const float4* src = reinterpret_cast<const float4*>(srec + (int64_t)j * sh.dk + 8 * i8);
      const float4 a = src[0];
      v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
      if (8 * i8 + 4 < sh.dk) {
        const float4 b = src[1];
        v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
      }
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) ss[(8 * i8 + e) * LDS + jl] = v[e];
  }
  __syncthreads();

  const int64_t nv = sh.n_v;
  for (int c0 = 0; c0 < rec.n_rows; c0 += CH) {
    const int cn = min(CH, rec.n_rows - c0);
    const int64_t r0 = rec.first_row + c0;
    const int mt = warp % 4, nb = (warp / 4) * NTW;
    const int ta = 16 * mt + g, tb = ta + 8;  // this lane's rows in steps 1-3
    const bool oka = ta < cn, okb = tb < cn;
    float cx[NTW][4] = {}, cy[NTW][4] = {};
    {
      const float* wa = w_in + ((r0 + ta) * nv + h) * sh.dk;
      const float* wb = w_in + ((r0 + tb) * nv + h) * sh.dk;
      const float* qa = xc + (r0 + ta) * sh.C + hk * sh.dk;
      const float* qb = xc + (r0 + tb) * sh.C + hk * sh.dk;
#pragma unroll 2
      for (int kk = 0; kk < dkp; kk += 8) {
        const int i0 = kk + tl, i1 = i0 + 4;
        const bool k0 = i0 < sh.dk, k1 = i1 < sh.dk;
        const float aw[4] = {oka && k0 ? wa[i0] : 0.f, okb && k0 ? wb[i0] : 0.f, oka && k1 ? wa[i1] : 0.f, okb && k1 ? wb[i1] : 0.f};
        const float aq[4] = {oka && k0 ? qa[i0] : 0.f, okb && k0 ? qb[i0] : 0.f, oka && k1 ? qa[i1] : 0.f, okb && k1 ? qb[i1] : 0.f};
#pragma unroll
        for (int n = 0; n < NTW; ++n) {
          const float* br = ss + i0 * LDS + 8 * (nb + n) + g;
          const float b[2] = {br[0], br[4 * LDS]};
          mma<PRECISE>(cx[n], aw, b);
          mma<PRECISE>(cy[n], aq, b);
        }
      }
    }
    // 2. Delta = U - X (zero past the chunk and past dv).
#pragma unroll
    for (int n = 0; n < NTW; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int t = e < 2 ? ta : tb, cl = 8 * (nb + n) + 2 * tl + (e % 2), j = j0 + cl;
        float d = 0.0f;
        if (t < cn && j < sh.dv) d = u_in[((r0 + t) * nv + h) * sh.dv + j] - cx[n][e];
        ds[t * LDS + cl] = d;
      }
    __syncthreads();
    // 3. O = diag(Gamma) Y + P Delta for the same tiles (P is zero above the diagonal: k stops there).
    {
      float cp[NTW][4] = {};
      const float* pa = p_in + ((r0 + ta) * nv + h) * CH;
      const float* pb = p_in + ((r0 + tb) * nv + h) * CH;
      for (int kk = 0; kk < 16 * mt + 16; kk += 8) {
        const int s0 = kk + tl, s1 = s0 + 4;
        const float a[4] = {oka ? pa[s0] : 0.f, okb ? pb[s0] : 0.f, oka ? pa[s1] : 0.f, okb ? pb[s1] : 0.f};
#pragma unroll
        for (int n = 0; n < NTW; ++n) {
          const float* br = ds + s0 * LDS + 8 * (nb + n) + g;
          const float b[2] = {br[0], br[4 * LDS]};
          mma<PRECISE>(cp[n], a, b);
        }
      }
      const float gam_a = oka ? expf(g_in[(r0 + ta) * nv + h]) : 0.f, gam_b = okb ? expf(g_in[(r0 + tb) * nv + h]) : 0.f;
#pragma unroll
      for (int n = 0; n < NTW; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int t = e < 2 ? ta : tb, j = j0 + 8 * (nb + n) + 2 * tl + (e % 2);
          if (t < cn && j < sh.dv) o[(r0 + t) * sh.value_dim + (int64_t)h * sh.dv + j] = (e < 2 ? gam_a : gam_b) * cy[n][e] + cp[n][e];
        }
    }
    // 4. S rows 16 w .. 16 w + 15 <- Gamma_last S + K'^T Delta.
    if (16 * warp < dkp) {
      const float g_last = g_in[(r0 + cn - 1) * nv + h];
      const float gam_last = expf(g_last);
      const int ia = 16 * warp + g, ib = ia + 8;
      float acc[NT][4];
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[n][e] = gam_last * ss[(e < 2 ? ia : ib) * LDS + 8 * n + 2 * tl + (e % 2)];
      for (int kk = 0; kk < cn; kk += 8) {
        const int t0 = kk + tl, t1 = t0 + 4;
        const float f0 = t0 < cn ? expf(g_last - g_in[(r0 + t0) * nv + h]) : 0.f;
        const float f1 = t1 < cn ? expf(g_last - g_in[(r0 + t1) * nv + h]) : 0.f;
        const float* k0 = xc + (r0 + t0) * sh.C + sh.key_dim + hk * sh.dk;
        const float* k1 = xc + (r0 + t1) * sh.C + sh.key_dim + hk * sh.dk;
        const bool i_a = ia < sh.dk, i_b = ib < sh.dk;
        const float a[4] = {f0 != 0.f && i_a ? f0 * k0[ia] : 0.f, f0 != 0.f && i_b ? f0 * k0[ib] : 0.f,
                            f1 != 0.f && i_a ? f1 * k1[ia] : 0.f, f1 != 0.f && i_b ? f1 * k1[ib] : 0.f};
#pragma unroll
        for (int n = 0; n < NT; ++n) {
          const float* br = ds + t0 * LDS + 8 * n + g;
          const float b[2] = {br[0], br[4 * LDS]};
          mma<PRECISE>(acc[n], a, b);
        }
      }
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) ss[(e < 2 ? ia : ib) * LDS + 8 * n + 2 * tl + (e % 2)] = acc[n][e];
    }
    __syncthreads();
  }

  for (int idx = tid; idx < BV * (kMaxD / 8); idx += kThreads) {
    const int jl = idx % BV, i8 = idx / BV, j = j0 + jl;
    if (j >= sh.dv || 8 * i8 >= sh.dk) continue;
    float v[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = ss[(8 * i8 + e) * LDS + jl];
    float4* dst = reinterpret_cast<float4*>(srec + (int64_t)j * sh.dk + 8 * i8);
    dst[0] = make_float4(v[0], v[1], v[2], v[3]);
    if (8 * i8 + 4 < sh.dk) dst[1] = make_float4(v[4], v[5], v[6], v[7]);
  }
}

template <typename Kernel>
void set_smem(Kernel kernel, size_t bytes) {
  ROOFLINE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

template <bool PRECISE>
void run_chunked(const Shape& sh, const DeltaNetLayerDev& layer, const DeltaNetSeqs& seqs, int max_seq_rows, const float* qkv,
                 const DeltaNetScratch& s, cudaStream_t stream) {
  constexpr int BV = 64;
  const size_t prep_bytes = kPrepSmemFloats * 4, scan_bytes = scan_smem_floats<BV>() * 4;
  set_smem(chunk_prep_kernel<PRECISE>, prep_bytes);
  set_smem(chunk_scan_kernel<PRECISE, BV>, scan_bytes);
  const int chunks = (max_seq_rows + CH - 1) / CH;
  launch(chunk_prep_kernel<PRECISE>, dim3((unsigned)chunks, (unsigned)sh.n_v, (unsigned)seqs.max_seqs), dim3(kThreads), prep_bytes,
         stream, pdl_enabled(), sh, seqs, s.xc, s.gb, s.w, s.u, s.p, s.g);
  const int bph = (sh.dv + BV - 1) / BV;
  launch(chunk_scan_kernel<PRECISE, BV>, dim3((unsigned)(sh.n_v * bph), (unsigned)seqs.max_seqs), dim3(kThreads), scan_bytes,
         stream, pdl_enabled(), sh, layer, seqs, qkv, s.xc, s.w, s.u, s.p, s.g, s.o);
}

}  // namespace

bool delta_net_chunked_supported(const DeltaNetDims& d) {
  if (d.head_k > kMaxD || d.head_v > kMaxD) return false;
  int device = 0, major = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) return false;
  return major >= 8;
}

void delta_net_chunked(const DeltaNetDims& d, const DeltaNetLayerDev& layer, const DeltaNetSeqs& seqs, int max_seq_rows,
                       const float* qkv, const DeltaNetScratch& s, bool precise, cudaStream_t stream) {
  if (seqs.max_seqs <= 0 || max_seq_rows <= 0) return;
  ROOFLINE_CHECK(s.w && s.u && s.p && s.g, "the chunked DeltaNet form needs the chunked scratch");
  ROOFLINE_CHECK(delta_net_chunked_supported(d), "the chunked DeltaNet form needs sm_80+ and dk, dv <= 128");
  const Shape sh = dn::shape_of(d);
  if (precise) run_chunked<true>(sh, layer, seqs, max_seq_rows, qkv, s, stream);
  else run_chunked<false>(sh, layer, seqs, max_seq_rows, qkv, s, stream);
}

}  // namespace roofline::cuda
