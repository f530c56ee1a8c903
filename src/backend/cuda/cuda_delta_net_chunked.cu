// The chunked form of the gated delta rule (see cuda_delta_net.cuh), for prefill runs: the rows of a
// sequence in chunks of C = 64 with the intra-chunk products on tensor cores (mma.sync m16n8k8 tf32,
// fp32 accumulation; sm_80+). Per head, with S (dk x dv) the state at the chunk's start, G_t the
// cumulative log decay inside the chunk (G_t = g_0 + ... + g_t <= 0), Gamma_t = exp(G_t):
//   A[t][s] = beta_t exp(G_t - G_s) k_t.k_s  (s < t),   T = (I + A)^-1  (unit lower triangular)
//   W = T diag(beta Gamma) K,   U = T diag(beta) V,   P[t][s] = exp(G_t - G_s) q_t.k_s  (s <= t)
//   Delta = U - W S   (the rows delta_t of the token-by-token rule, unrolled over the chunk)
//   O = diag(Gamma) Q S + P Delta = Q' S + P U,   Q' = diag(Gamma) Q - P W
//   S <- Gamma_last S + K'^T Delta,   K'_t = exp(G_last - G_t) k_t
// Every exponent is <= 0, so nothing overflows. Two kernels: chunk_prep (one CTA per chunk and v-head,
// all chunks at once: A, T, then W, U, Q', K', P U and G into scratch) and chunk_scan (one CTA per
// v-head and 64 value columns of a sequence, the chunks in order with its state block in shared
// memory; the state columns are independent given W, Q', K'). chunk_scan copies each chunk's tiles to
// shared memory with cp.async while it computes on the previous ones. T is solved in fp32 on the CUDA
// cores (16 x 16 diagonal blocks, then the blocks below them); everything else is mma.
//
// 27B shape (48 v-heads, dk = dv = 128), 512 tokens: chunk_prep 384 CTAs x ~3k mma; chunk_scan 96 CTAs
// x 8 chunks x ~1.5k mma and ~130 KB of tiles per chunk. Expected ~15-30 us for both on an H200;
// measured 92 + 65 us (the recurrent kernel: 246 us). chunk_prep is latency-bound (T's substitution
// keeps 2 of 8 warps busy, 15 barrier phases, 2 CTAs per SM); chunk_scan has one CTA per SM on 96 SMs.
// Next steps: the T solve and the three ratio v-heads of a k-head in one CTA (K K^T, Q K^T shared),
// ldmatrix for the tf32 fragments, and BV = 32 scan CTAs with two per SM.
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
//   ks [64][LDK]  k rows (zero past the chunk / past dk), then diag(beta Gamma) K, then W
//   qv [64][LDK]  q rows, then diag(beta) V, then U
//   as [64][LDA]  A, then P;  ts [64][LDA]  T;  xs [3][16][16] block products;  gs [64] G;  bs [64] beta
// LDK = 132 and LDA = 68 are 4 mod 32: the A-operand reads (row g, column t) hit 32 distinct banks.
constexpr int LDK = kMaxD + 4, LDA = CH + 4;
constexpr size_t kPrepSmemFloats = 2 * CH * LDK + 2 * CH * LDA + 3 * 256 + 2 * CH;

// Per row and v-head of the step, what chunk_scan reads (DeltaNetScratch's chunked buffers).
struct ChunkTiles {
  float* w;   // [rows][n_v][dk]  W
  float* qp;  // [rows][n_v][dk]  Q' = diag(Gamma) Q - P W
  float* kp;  // [rows][n_v][dk]  K' = diag(exp(G_last - G)) K
  float* u;   // [rows][n_v][dv]  U
  float* oi;  // [rows][n_v][dv]  P U
  float* g;   // [rows][n_v]      G
};

// acc (warp tile: rows 16 mt .. +15, column tiles nb .. nb+7) = A[64 x 64] (lower triangular, rows
// and k up to 16 mt + 15) times B[64 x width]; A and B in shared memory (row-major, lda / ldb).
template <bool PRECISE>
__device__ __forceinline__ void tri_product(float (&acc)[8][4], const float* a_sm, int lda, const float* b_sm, int ldb, int mt,
                                            int nb, int width, int g, int tl) {
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[n][e] = 0.0f;
  for (int kk = 0; kk < 16 * mt + 16; kk += 8) {
    const float* ar = a_sm + (16 * mt + g) * lda + kk + tl;
    const float a[4] = {ar[0], ar[8 * lda], ar[4], ar[8 * lda + 4]};
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      if (8 * (nb + n) >= width) break;
      const float* br = b_sm + (kk + tl) * ldb + 8 * (nb + n) + g;
      const float b[2] = {br[0], br[4 * ldb]};
      mma<PRECISE>(acc[n], a, b);
    }
  }
}

template <bool PRECISE>
__global__ void __launch_bounds__(kThreads) chunk_prep_kernel(Shape sh, DeltaNetSeqs seqs, const float* __restrict__ xc,
                                                              const float* __restrict__ gb, ChunkTiles out) {
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
  const DeltaNetSeqDev rec = seqs.seqs[blockIdx.z];  // (loaded together with the count)
  if ((int)blockIdx.z >= *seqs.count) return;
  const int c0 = blockIdx.x * CH;
  if (c0 >= rec.n_rows) return;
  const int cn = min(CH, rec.n_rows - c0);
  const int64_t r0 = rec.first_row + c0, nv = sh.n_v;
  const int h = blockIdx.y, hk = h % sh.n_k;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, tl = lane % 4;
  const int dk4 = sh.dk / 4, dkp = (sh.dk + 7) / 8 * 8, dvp = (sh.dv + 7) / 8 * 8;
  const int mt = warp / 2;  // the warp's 16 rows in every product below

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
    const int64_t stride = 2 * nv;
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
    bs[2 * lane] = 2 * lane < cn ? gb[(r0 + 2 * lane) * stride + nv + h] : 0.0f;
    bs[2 * lane + 1] = 2 * lane + 1 < cn ? gb[(r0 + 2 * lane + 1) * stride + nv + h] : 0.0f;
  }
  __syncthreads();

  // K K^T and Q K^T: warp w owns rows 16 (w / 2) .. +15 and columns 32 (w % 2) .. +31 of both. A goes
  // to shared memory; P stays in registers (cq) until A's buffer is free.
  float cq[4][4] = {};
  {
    const int nb = (warp % 2) * 4;
    float ck[4][4] = {};
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
        cq[n][e] *= decay;
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
    if (t < cn && 4 * f < sh.dv) {  // dv % 4 == 0 in this form
      vv = *reinterpret_cast<const float4*>(xc + (r0 + t) * sh.C + 2 * sh.key_dim + h * sh.dv + 4 * f);
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

  // W = T (diag(beta Gamma) K) and U = T (diag(beta) V), each over its operand (after a barrier: every
  // warp reads all of it), P then into A's buffer; then P W and P U. Warp w: rows 16 (w / 2) .. +15,
  // column tiles 8 (w % 2) .. +7. Results leave through shared memory as whole 16-byte rows.
  const int nb = (warp % 2) * 8;
  float acc[8][4], acc2[8][4];
  auto put = [&](float* sm, const float (&v)[8][4], float sign) {
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) sm[(16 * mt + g + 8 * (e / 2)) * LDK + 8 * (nb + n) + 2 * tl + (e % 2)] = sign * v[n][e];
  };
  auto rows_out = [&](const float* sm, float* dst, int real) {  // rows < cn, columns < real (% 4 == 0)
    const int r4 = real / 4;
    for (int idx = tid; idx < cn * r4; idx += kThreads) {
      const int t = idx / r4, f = idx % r4;
      *reinterpret_cast<float4*>(dst + ((r0 + t) * nv + h) * real + 4 * f) = *reinterpret_cast<const float4*>(sm + t * LDK + 4 * f);
    }
  };
  tri_product<PRECISE>(acc, ts, LDA, ks, LDK, mt, nb, dkp, g, tl);
  __syncthreads();
  put(ks, acc, 1.0f);
  tri_product<PRECISE>(acc, ts, LDA, qv, LDK, mt, nb, dvp, g, tl);
  __syncthreads();
  put(qv, acc, 1.0f);
#pragma unroll
  for (int n = 0; n < 4; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) as[(16 * mt + g + 8 * (e / 2)) * LDA + 8 * ((warp % 2) * 4 + n) + 2 * tl + (e % 2)] = cq[n][e];
  __syncthreads();
  rows_out(ks, out.w, sh.dk);
  rows_out(qv, out.u, sh.dv);
  tri_product<PRECISE>(acc, as, LDA, ks, LDK, mt, nb, dkp, g, tl);   // P W
  tri_product<PRECISE>(acc2, as, LDA, qv, LDK, mt, nb, dvp, g, tl);  // P U
  __syncthreads();
  put(ks, acc, -1.0f);
  put(qv, acc2, 1.0f);
  __syncthreads();
  // Q' = diag(Gamma) Q - P W, P U, and K' = diag(exp(G_last - G)) K (q and k rows from xc again).
  const float g_last = gs[cn - 1];
  for (int idx = tid; idx < cn * dk4; idx += kThreads) {
    const int t = idx / dk4, f = idx % dk4;
    const float* x = xc + (r0 + t) * sh.C + hk * sh.dk + 4 * f;
    const float4 qq = *reinterpret_cast<const float4*>(x);
    float4 kk = *reinterpret_cast<const float4*>(x + sh.key_dim);
    const float4 pw = *reinterpret_cast<const float4*>(ks + t * LDK + 4 * f);
    const float gam = expf(gs[t]), sc = expf(g_last - gs[t]);
    kk.x *= sc, kk.y *= sc, kk.z *= sc, kk.w *= sc;
    const int64_t at = ((r0 + t) * nv + h) * sh.dk + 4 * f;
    *reinterpret_cast<float4*>(out.qp + at) = make_float4(gam * qq.x + pw.x, gam * qq.y + pw.y, gam * qq.z + pw.z, gam * qq.w + pw.w);
    *reinterpret_cast<float4*>(out.kp + at) = kk;
  }
  rows_out(qv, out.oi, sh.dv);
  if (tid < cn) out.g[(r0 + tid) * nv + h] = gs[tid];
}

// ---------------------------------------------------------------------------------------------------
// chunk_scan: one CTA per (v-head, block of BV value columns, sequence). Shared memory: the state block
// ss [128][LDS] (row = key index i, column = value index j - j0), delta ds [64][LDS], and the chunk's
// tiles: W and Q' [64][LDW], K' [64][LDKT], U and P U [64][LDU]. LDS = BV + 8 and LDKT = 136 are 8 mod
// 32 and LDW = 132 is 4 mod 32, so every operand read hits 32 distinct banks. Per chunk:
//   wait for W, Q', U, P U (copied during the previous chunk's step 3)
//   1. warp w: X = W S and Y = Q' S for rows 16 (w % 4) .. +15, column tiles (w / 4) NT/2 .. +NT/2-1
//   2. Delta = U - X -> ds;  O = Y + P U -> obuf                   | barrier; O out; copy the next W, Q', U, P U
//   wait for K' (copied during steps 1-2)
//   3. warp w: S rows 16 w .. +15 <- Gamma_last S + K'^T Delta      | barrier; copy the next K'
template <int BV>
struct Scan {
  static constexpr int LDS = BV + 8, LDW = kMaxD + 4, LDKT = kMaxD + 8, LDU = BV + 4;
  static constexpr size_t kFloats = (size_t)kMaxD * LDS + CH * LDS + 2 * CH * LDW + CH * LDKT + 3 * CH * LDU;
};

template <bool PRECISE, int BV>
__global__ void __launch_bounds__(kThreads) chunk_scan_kernel(Shape sh, DeltaNetLayerDev L, DeltaNetSeqs seqs,
                                                              const float* __restrict__ qkv, ChunkTiles in, float* __restrict__ o) {
  using SC = Scan<BV>;
  constexpr int LDS = SC::LDS, LDW = SC::LDW, LDKT = SC::LDKT, LDU = SC::LDU, NT = BV / 8, NTW = NT / 2;
  extern __shared__ float4 smem4[];
  float* ss = reinterpret_cast<float*>(smem4);
  float* ds = ss + kMaxD * LDS;
  float* wsm = ds + CH * LDS;
  float* qsm = wsm + CH * LDW;
  float* ksm = qsm + CH * LDW;
  float* usm = ksm + CH * LDKT;
  float* osm = usm + CH * LDU;
  float* obuf = osm + CH * LDU;  // O of the chunk, written out as whole 16-byte rows
  wait_for_previous_kernel();
  const DeltaNetSeqDev rec = seqs.seqs[blockIdx.y];  // (loaded together with the count)
  if ((int)blockIdx.y >= *seqs.count) return;
  float* cell = L.state + (int64_t)rec.cell * L.cell_stride;
  const int bph = (sh.dv + BV - 1) / BV;
  const int h = blockIdx.x / bph, j0 = (blockIdx.x % bph) * BV;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, tl = lane % 4;
  const int dk4 = sh.dk / 4, dkp = (sh.dk + 7) / 8 * 8;
  const int64_t nv = sh.n_v;

  // The tiles of the chunk at c0 (rows past the run and columns past dk / dv are zero-filled).
  auto copy_wquo = [&](int c0) {
    const int cn = min(CH, rec.n_rows - c0);
    const int64_t r0 = rec.first_row + c0;
    for (int idx = tid; idx < CH * (kMaxD / 4); idx += kThreads) {
      const int t = idx / (kMaxD / 4), f = idx % (kMaxD / 4);
      const bool ok = t < cn && f < dk4;
      const int64_t at = ((r0 + (ok ? t : 0)) * nv + h) * sh.dk + (ok ? 4 * f : 0);
      dn::copy16(wsm + t * LDW + 4 * f, in.w + at, ok);
      dn::copy16(qsm + t * LDW + 4 * f, in.qp + at, ok);
    }
    for (int idx = tid; idx < CH * (BV / 4); idx += kThreads) {
      const int t = idx / (BV / 4), f = idx % (BV / 4);
      const bool ok = t < cn && j0 + 4 * f < sh.dv;
      const int64_t at = ((r0 + (ok ? t : 0)) * nv + h) * sh.dv + (ok ? j0 + 4 * f : 0);
      dn::copy16(usm + t * LDU + 4 * f, in.u + at, ok);
      dn::copy16(osm + t * LDU + 4 * f, in.oi + at, ok);
    }
  };
  auto copy_k = [&](int c0) {
    const int cn = min(CH, rec.n_rows - c0);
    const int64_t r0 = rec.first_row + c0;
    for (int idx = tid; idx < CH * (kMaxD / 4); idx += kThreads) {
      const int t = idx / (kMaxD / 4), f = idx % (kMaxD / 4);
      const bool ok = t < cn && f < dk4;
      dn::copy16(ksm + t * LDKT + 4 * f, in.kp + ((r0 + (ok ? t : 0)) * nv + h) * sh.dk + (ok ? 4 * f : 0), ok);
    }
  };
  if (rec.n_rows > 0) {
    copy_wquo(0);
    copy_async_commit();
    copy_k(0);
  } else {
    copy_async_commit();
  }
  copy_async_commit();

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

  const int mt = warp % 4, nb = (warp / 4) * NTW;
  for (int c0 = 0; c0 < rec.n_rows; c0 += CH) {
    const int cn = min(CH, rec.n_rows - c0);
    const int64_t r0 = rec.first_row + c0;
    const float g_last = in.g[(r0 + cn - 1) * nv + h];  // used in step 3: its load overlaps steps 1-2
    copy_async_wait<1>();
    __syncthreads();
    // 1. X = W S, Y = Q' S.
    float cx[NTW][4] = {}, cy[NTW][4] = {};
    for (int kk = 0; kk < dkp; kk += 8) {
      const float* wr = wsm + (16 * mt + g) * LDW + kk + tl;
      const float* qr = qsm + (16 * mt + g) * LDW + kk + tl;
      const float aw[4] = {wr[0], wr[8 * LDW], wr[4], wr[8 * LDW + 4]};
      const float aq[4] = {qr[0], qr[8 * LDW], qr[4], qr[8 * LDW + 4]};
#pragma unroll
      for (int n = 0; n < NTW; ++n) {
        const float* br = ss + (kk + tl) * LDS + 8 * (nb + n) + g;
        const float b[2] = {br[0], br[4 * LDS]};
        mma<PRECISE>(cx[n], aw, b);
        mma<PRECISE>(cy[n], aq, b);
      }
    }
    // 2. Delta = U - X (zero past the chunk: U and W are zero-filled there) and O = Y + P U.
#pragma unroll
    for (int n = 0; n < NTW; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int t = 16 * mt + g + 8 * (e / 2), cl = 8 * (nb + n) + 2 * tl + (e % 2);
        ds[t * LDS + cl] = usm[t * LDU + cl] - cx[n][e];
        obuf[t * LDU + cl] = cy[n][e] + osm[t * LDU + cl];
      }
    __syncthreads();
    for (int idx = tid; idx < cn * (BV / 4); idx += kThreads) {
      const int t = idx / (BV / 4), f = idx % (BV / 4);
      if (j0 + 4 * f < sh.dv)  // dv % 4 == 0 in this form
        *reinterpret_cast<float4*>(o + (r0 + t) * sh.value_dim + (int64_t)h * sh.dv + j0 + 4 * f) =
            *reinterpret_cast<const float4*>(obuf + t * LDU + 4 * f);
    }
    if (c0 + CH < rec.n_rows) copy_wquo(c0 + CH);
    copy_async_commit();
    copy_async_wait<1>();
    __syncthreads();
    // 3. S rows 16 w .. 16 w + 15 <- Gamma_last S + K'^T Delta (rows past dk stay zero).
    if (16 * warp < dkp) {
      const float gam_last = expf(g_last);
      const int ia = 16 * warp + g, ib = ia + 8;
      float acc[NT][4];
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[n][e] = gam_last * ss[(e < 2 ? ia : ib) * LDS + 8 * n + 2 * tl + (e % 2)];
      for (int kk = 0; kk < cn; kk += 8) {
        const float* kr = ksm + (kk + tl) * LDKT + ia;
        const float a[4] = {kr[0], kr[8], kr[4 * LDKT], kr[4 * LDKT + 8]};
#pragma unroll
        for (int n = 0; n < NT; ++n) {
          const float* br = ds + (kk + tl) * LDS + 8 * n + g;
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
    if (c0 + CH < rec.n_rows) copy_k(c0 + CH);
    copy_async_commit();
  }

  __syncthreads();  // (with no rows, the loop above had no barrier after ss was filled)
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
  dn::WindowSlide slide;
  slide.begin(sh, rec, cell, qkv, blockIdx.x, gridDim.x);
  slide.finish(sh, rec, cell, qkv);
}

// The opt-in shared-memory size, once per kernel and device (outside graph captures: the first call
// of a form is a prefill step, which the backend does not capture).
template <auto Kernel>
void set_smem_once(size_t bytes) {
  static uint64_t done = 0;
  int device = 0;
  ROOFLINE_CUDA_CHECK(cudaGetDevice(&device));
  if (done >> (device & 63) & 1) return;
  ROOFLINE_CUDA_CHECK(cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
  done |= 1ull << (device & 63);
}

template <bool PRECISE>
void run_chunked(const Shape& sh, const DeltaNetLayerDev& layer, const DeltaNetSeqs& seqs, int max_seq_rows, const float* qkv,
                 const DeltaNetScratch& s, cudaStream_t stream, int kernels) {
  constexpr int BV = 64;
  const size_t prep_bytes = kPrepSmemFloats * 4, scan_bytes = Scan<BV>::kFloats * 4;
  set_smem_once<chunk_prep_kernel<PRECISE>>(prep_bytes);
  set_smem_once<chunk_scan_kernel<PRECISE, BV>>(scan_bytes);
  const ChunkTiles tiles{s.w, s.qp, s.kp, s.u, s.oi, s.g};
  const int chunks = (max_seq_rows + CH - 1) / CH;
  if (kernels & 1)
    launch(chunk_prep_kernel<PRECISE>, dim3((unsigned)chunks, (unsigned)sh.n_v, (unsigned)seqs.max_seqs), dim3(kThreads),
           prep_bytes, stream, pdl_enabled(), sh, seqs, s.xc, s.gb, tiles);
  const int bph = (sh.dv + BV - 1) / BV;
  if (kernels & 2)
    launch(chunk_scan_kernel<PRECISE, BV>, dim3((unsigned)(sh.n_v * bph), (unsigned)seqs.max_seqs), dim3(kThreads), scan_bytes,
           stream, pdl_enabled(), sh, layer, seqs, qkv, tiles, s.o);
}

}  // namespace

bool delta_net_chunked_supported(const DeltaNetDims& d) {
  if (d.head_k > kMaxD || d.head_v > kMaxD || d.head_v % 4) return false;
  return code_arch() >= 80;  // tf32 tensor cores and cp.async
}

void delta_net_chunked(const DeltaNetDims& d, const DeltaNetLayerDev& layer, const DeltaNetSeqs& seqs, int max_seq_rows,
                       const float* qkv, const DeltaNetScratch& s, bool precise, cudaStream_t stream, int kernels) {
  if (seqs.max_seqs <= 0 || max_seq_rows <= 0) return;
  ROOFLINE_CHECK(s.w && s.u && s.qp && s.kp && s.oi && s.g, "the chunked DeltaNet form needs the chunked scratch");
  ROOFLINE_CHECK(delta_net_chunked_supported(d), "the chunked DeltaNet form needs sm_80+, dk <= 128, dv <= 128, dv % 4 == 0");
  const Shape sh = dn::shape_of(d);
  if (precise) run_chunked<true>(sh, layer, seqs, max_seq_rows, qkv, s, stream, kernels);
  else run_chunked<false>(sh, layer, seqs, max_seq_rows, qkv, s, stream, kernels);
}

}  // namespace roofline::cuda
