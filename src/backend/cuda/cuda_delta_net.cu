// The Gated DeltaNet mixer's kernels (see cuda_delta_net.cuh): prepare (conv + SiLU + L2 norm + gates),
// the recurrent form of the gated delta rule (decode), the output norm x SiLU(z) with int8
// quantization, the scratch layout, the host entry point, and the test hook gpu_delta_net_for_test.
//
// Time per layer for Qwen3.5-27B (n_k 16, n_v 48, dk = dv = 128, K 4, conv_dim 10240) on an H200
// (~4.8 TB/s peak, ~4.3 TB/s for a copy), expected -> measured (GpuDeltaNet.Qwen35_27B, CUDA graphs):
//   decode, per sequence: the state is 48 x 128 x 128 x 4 B = 3 MiB, read once and written once, plus
//     the conv window (3 x 10240 x 4 B = 120 KB, read and written): ~6.5 MB -> ~1.5 us at a copy's
//     bandwidth; 64 sequences ~95 us. Measured: the rule 127 us for 64 sequences (3.2 TB/s), 17 us
//     for 8, 3.6 us for 1 (one sequence cannot fill the memory pipes); with prepare and output
//     (2-7 us and 3-4 us, mostly launch and two dependent round trips each) 140 / 24 / 8.8 us.
//   prefill, 512 tokens of one sequence: the recurrent form does ~7 dk dv flops per token and head
//     (2.4 GFLOP) as 512 dependent steps whose shared-memory traffic bounds it: 246 us. The chunked
//     form (cuda_delta_net_chunked.cu) does ~2.2 G multiply-adds, nearly all on tensor cores (tf32
//     mma.sync), which would take ~15-30 us at a fair fraction of the tensor rate; measured 92 us
//     (chunk_prep, latency-bound: ~8k instructions per warp in 15 barrier-separated phases at 2 CTAs
//     per SM) + 65 us (chunk_scan: 96 CTAs, one per SM). prepare 27 us and output 21 us at 512 rows
//     (instruction-bound: one row per warp). Layer total 206 us (recurrent: 449 us).
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cuda/cuda_delta_net_impl.cuh"
#include "backend/cuda/cuda_weights.cuh"
#include "backend/gpu.h"

namespace roofline::cuda {

using dn::Shape;

namespace {

// ---------------------------------------------------------------------------------------------------
// 1. prepare: one warp per (row, head unit); units are the n_k q heads, the n_k k heads, then the n_v
// v heads (whose warp also computes the head's gates). Lane l holds channels l, l + 32, ... of its head.
// The taps are loaded from the step's rows before the row's record is known (a row at least K-1 deep
// in its run needs nothing else); only the first K-1 rows of a run then load window values.
constexpr int kPrepWarps = 4;

template <int MAXDK, int KMAX>  // MAXDK >= dk, a multiple of 32; KMAX >= K
__global__ void __launch_bounds__(kPrepWarps * 32) prepare_kernel(Shape sh, DeltaNetLayerDev L, DeltaNetSeqs seqs,
                                                                  const float* __restrict__ qkv, const float* __restrict__ alpha,
                                                                  const float* __restrict__ beta, float* __restrict__ xc,
                                                                  float* __restrict__ gb) {
  constexpr int CPL = MAXDK / 32;  // channels per lane of a q/k unit (v units loop in groups of 4)
  constexpr int NCH = CPL > 4 ? CPL : 4;
  const int row = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int unit = blockIdx.x * kPrepWarps + warp;
  const bool unit_ok = unit < 2 * sh.n_k + sh.n_v;  // whole warps
  const int K = sh.K;
  const bool qk = unit < 2 * sh.n_k, is_q = unit < sh.n_k;
  const int h = unit - 2 * sh.n_k;
  const int ch0 = is_q ? unit * sh.dk : qk ? sh.key_dim + (unit - sh.n_k) * sh.dk : 2 * sh.key_dim + h * sh.dv;
  const int width = qk ? sh.dk : sh.dv;
  float* __restrict__ out = xc + (int64_t)row * sh.C;
  const float* __restrict__ wts = L.conv + (int64_t)ch0 * K;
  // Before the wait for the products (the weights and the step do not depend on them): the first
  // pass's conv weights, the gates' parameters and the row's record.
  float w0[NCH][KMAX];
#pragma unroll
  for (int m = 0; m < NCH; ++m)
#pragma unroll
    for (int k = 0; k < KMAX; ++k) w0[m][k] = unit_ok && k < K && lane + 32 * m < width ? wts[(lane + 32 * m) * K + k] : 0.0f;
  float a_in = 0.0f, b_in = 0.0f, a_h = 0.0f;
  if (unit_ok && !qk && lane == 0) {
    a_in = L.dt_bias[h];
    a_h = L.a[h];
  }
  DeltaNetSeqDev rec{};
  const int si = unit_ok ? dn::find_seq(seqs, row, &rec) : -1;
  wait_for_previous_kernel();
  if (si < 0) return;
  if (!qk && lane == 0) {  // gates (v units), issued early too
    a_in += alpha[(int64_t)row * sh.n_v + h];
    b_in = beta[(int64_t)row * sh.n_v + h];
  }
  float ss = 0.0f, v[NCH];
  const float* __restrict__ taps = qkv + (int64_t)(row - (K - 1)) * sh.C + ch0;  // tap k of channel c: taps[k C + c]
  for (int c0 = 0; c0 < width; c0 += 32 * NCH) {
    float x[NCH][KMAX], w[NCH][KMAX];
#pragma unroll
    for (int m = 0; m < NCH; ++m)
#pragma unroll
      for (int k = 0; k < KMAX; ++k) {
        const int c = c0 + lane + 32 * m;
        const bool ok = k < K && c < width;
        x[m][k] = ok && row - (K - 1) + k >= 0 ? taps[k * sh.C + c] : 0.0f;
        w[m][k] = c0 == 0 ? w0[m][k] : ok ? wts[c * K + k] : 0.0f;
      }
    const int t = row - rec.first_row;
    if (t < K - 1) {  // taps before the run: the window (zero when fresh)
      const float* win = L.state + (int64_t)rec.cell * L.cell_stride;
#pragma unroll
      for (int m = 0; m < NCH; ++m)
#pragma unroll
        for (int k = 0; k < KMAX; ++k) {
          const int c = c0 + lane + 32 * m, tau = t - (K - 1) + k;
          if (k < K && tau < 0) x[m][k] = (rec.fresh || c >= width) ? 0.0f : win[(int64_t)(tau + K - 1) * sh.C + ch0 + c];
        }
    }
#pragma unroll
    for (int m = 0; m < NCH; ++m) {
      float acc = 0.0f;
#pragma unroll
      for (int k = 0; k < KMAX; ++k) acc += w[m][k] * x[m][k];
      const int c = c0 + lane + 32 * m;
      v[m] = c < width ? dn::silu(acc) : 0.0f;
      ss += v[m] * v[m];
      if (!qk && c < width) out[ch0 + c] = v[m];
    }
  }
  if (qk) {  // one pass covers the head (NCH * 32 >= MAXDK >= dk)
    ss = warp_sum(ss);
    // transformers' l2norm: x / sqrt(sum x^2 + 1e-6); q also carries the 1/sqrt(dk) of o = S^T q / sqrt(dk).
    const float inv = (is_q ? 1.0f / sqrtf((float)sh.dk) : 1.0f) / sqrtf(ss + 1e-6f);
#pragma unroll
    for (int m = 0; m < NCH; ++m) {
      const int c = lane + 32 * m;
      if (c < sh.dk) out[ch0 + c] = v[m] * inv;
    }
  } else if (lane == 0) {
    const float sp = a_in > 20.0f ? a_in : log1pf(expf(a_in));
    gb[(int64_t)row * 2 * sh.n_v + h] = sp * a_h;
    gb[(int64_t)row * 2 * sh.n_v + sh.n_v + h] = 1.0f / (1.0f + expf(-b_in));
  }
}

// ---------------------------------------------------------------------------------------------------
// 2a. The recurrent form. A CTA owns RPC rows (value indices j) of one v-head of one sequence; LPR lanes
// share a row, each holding 4*F4 of its dk elements (float4 f = ll + LPR*m, so a row's lanes read
// consecutive 16-byte pieces and every access to the state is a coalesced 16-byte one). The rows'
// state stays in registers for the whole run: read once (unless fresh), written once. For dk = 128 a
// thread holds 32 state floats (a CTA 32 KB), so an SM keeps ~100 KB of state loads in flight.
// Per token:  a = S_j.k, b = S_j.q, c = k.q (one pass, reduced over the row's lanes together)
//             delta = beta (v_j - gamma a);  o_j = gamma b + delta c;  S_j = gamma S_j + delta k
// (o_j = S'_j.q expanded, so the reductions are independent). Tokens are staged in shared memory TB at a
// time by cp.async (k, q of the k-head, v of the CTA's rows, g, beta): no registers, and with PREFETCH
// (long runs) the next block lands in a second buffer while the current one is computed. Without it
// (decode) the CTA's share of the conv window is also fetched up front, so a decode CTA's life is two
// dependent round trips: its record, then the state, the token and the window together.
template <int MAXDK>
struct Rec {
  static constexpr int LPR = MAXDK / 32 < 4 ? 4 : MAXDK / 32;  // lanes per row
  static constexpr int F4 = MAXDK / (4 * LPR);                  // float4 per lane
  static constexpr int RPW = 32 / LPR;                          // rows per warp
  static constexpr int WARPS = 8;
  static constexpr int RPC = WARPS * RPW;  // rows per CTA
  static constexpr int TB = MAXDK >= 256 ? 8 : 16;  // tokens per staged block
  static constexpr int KV4 = MAXDK / 4;
  static constexpr int WCH = WARPS * 32;  // window channels per CTA fetched up front (one per thread)
};

template <int MAXDK>
struct RecBlock {  // one staged block of tokens
  float4 k[Rec<MAXDK>::TB][Rec<MAXDK>::KV4], q[Rec<MAXDK>::TB][Rec<MAXDK>::KV4];
  float v[Rec<MAXDK>::TB][Rec<MAXDK>::RPC];
  float g[Rec<MAXDK>::TB], beta[Rec<MAXDK>::TB];
};

template <int MAXDK, bool PREFETCH>
__global__ void __launch_bounds__(Rec<MAXDK>::WARPS * 32) recurrent_kernel(Shape sh, DeltaNetLayerDev L, DeltaNetSeqs seqs,
                                                                           const float* __restrict__ qkv,
                                                                           const float* __restrict__ xc,
                                                                           const float* __restrict__ gb, float* __restrict__ o) {
  using R = Rec<MAXDK>;
  constexpr int LPR = R::LPR, F4 = R::F4, RPC = R::RPC, TB = R::TB, KV4 = R::KV4, NT = R::WARPS * 32;
  constexpr int NBUF = PREFETCH ? 2 : 1, WCH = PREFETCH ? 1 : R::WCH;
  __shared__ RecBlock<MAXDK> blk[NBUF];
  __shared__ float so[TB][RPC];
  __shared__ float swin[dn::kMaxConv - 1][WCH];
  // The record (the step's) and the state (the previous step's) do not depend on the kernel before
  // (prepare): both are loaded before waiting for it.
  const DeltaNetSeqDev rec = seqs.seqs[blockIdx.y];  // (loaded together with the count; grid.y <= max_seqs)
  const bool seq_ok = (int)blockIdx.y < *seqs.count;
  float* cell = L.state + (int64_t)rec.cell * L.cell_stride;
  const int cph = (sh.dv + RPC - 1) / RPC;  // CTAs per head
  const int h = blockIdx.x / cph, j0 = (blockIdx.x % cph) * RPC, hk = h % sh.n_k;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int r = warp * R::RPW + lane / LPR, ll = lane % LPR;
  const int j = j0 + r, dk4 = sh.dk / 4;
  const bool row_ok = j < sh.dv;
  float4* srow = reinterpret_cast<float4*>(cell + sh.conv_floats + ((int64_t)h * sh.dv + (row_ok ? j : 0)) * sh.dk);
  float4 s[F4];
#pragma unroll
  for (int m = 0; m < F4; ++m) {
    const int f = ll + LPR * m;
    s[m] = (seq_ok && !rec.fresh && row_ok && f < dk4) ? srow[f] : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  wait_for_previous_kernel();
  if (!seq_ok) return;
  // This CTA's window channels [w_begin, w_end); the first WCH of them are fetched now (decode).
  const int w_per = (sh.C + (int)gridDim.x - 1) / (int)gridDim.x;
  const int w_begin = blockIdx.x * w_per, w_end = min(sh.C, w_begin + w_per);
  const int w_ch = w_begin + tid;
  if (!PREFETCH && w_ch < w_end && tid < WCH) {
    for (int k = 0; k < sh.K - 1; ++k) {
      const int p = rec.n_rows + k;  // index into [old window, the run's rows]
      const float* src = p < sh.K - 1 ? cell + (int64_t)p * sh.C + w_ch
                                      : qkv + (int64_t)(rec.first_row + p - (sh.K - 1)) * sh.C + w_ch;
      dn::copy4(&swin[k][tid], src, p >= sh.K - 1 || !rec.fresh);
    }
  }
  copy_async_commit();
  auto stage = [&](RecBlock<MAXDK>& b, int t0) {  // tokens [t0, t0 + TB) of the run (zeros past its end)
    const int nt = min(TB, rec.n_rows - t0);
    const float* x0 = xc + (int64_t)(rec.first_row + t0) * sh.C;
    for (int idx = tid; idx < TB * KV4; idx += NT) {
      const int tt = idx / KV4, f = idx % KV4;
      const bool ok = tt < nt && f < dk4;
      const float* x = x0 + (ok ? (int64_t)tt * sh.C + hk * sh.dk + 4 * f : 0);
      dn::copy16(&b.k[tt][f], x + sh.key_dim, ok);
      dn::copy16(&b.q[tt][f], x, ok);
    }
    for (int idx = tid; idx < TB * RPC; idx += NT) {
      const int tt = idx / RPC, rr = idx % RPC;
      const bool ok = tt < nt && j0 + rr < sh.dv;
      dn::copy4(&b.v[tt][rr], x0 + (ok ? (int64_t)tt * sh.C + 2 * sh.key_dim + h * sh.dv + j0 + rr : 0), ok);
    }
    if (tid < TB) {
      const bool ok = tid < nt;
      const float* gr = gb + (int64_t)(rec.first_row + t0 + (ok ? tid : 0)) * 2 * sh.n_v + h;
      dn::copy4(&b.g[tid], gr, ok);
      dn::copy4(&b.beta[tid], gr + sh.n_v, ok);
    }
    copy_async_commit();
  };

  if (rec.n_rows > 0) stage(blk[0], 0);
  int cur = 0;
  for (int t0 = 0; t0 < rec.n_rows; t0 += TB) {
    const int nt = min(TB, rec.n_rows - t0);
    copy_async_wait<0>();
    __syncthreads();
    if (PREFETCH && t0 + TB < rec.n_rows) stage(blk[cur ^ 1], t0 + TB);  // lands while this block is computed
    const RecBlock<MAXDK>& b = blk[cur];
    for (int tt = 0; tt < nt; ++tt) {
      const float gam = expf(b.g[tt]);
      float a = 0.0f, bq = 0.0f, kq = 0.0f;
#pragma unroll
      for (int m = 0; m < F4; ++m) {
        const int f = ll + LPR * m;
        const float4 kk = b.k[tt][f], qq = b.q[tt][f];
        a += (s[m].x * kk.x + s[m].y * kk.y) + (s[m].z * kk.z + s[m].w * kk.w);
        bq += (s[m].x * qq.x + s[m].y * qq.y) + (s[m].z * qq.z + s[m].w * qq.w);
        kq += (kk.x * qq.x + kk.y * qq.y) + (kk.z * qq.z + kk.w * qq.w);
      }
#pragma unroll
      for (int off = LPR / 2; off > 0; off >>= 1) {
        a += __shfl_xor_sync(0xffffffffu, a, off);
        bq += __shfl_xor_sync(0xffffffffu, bq, off);
        kq += __shfl_xor_sync(0xffffffffu, kq, off);
      }
      const float delta = b.beta[tt] * (b.v[tt][r] - gam * a);
#pragma unroll
      for (int m = 0; m < F4; ++m) {
        const float4 kk = b.k[tt][ll + LPR * m];
        s[m].x = s[m].x * gam + kk.x * delta;
        s[m].y = s[m].y * gam + kk.y * delta;
        s[m].z = s[m].z * gam + kk.z * delta;
        s[m].w = s[m].w * gam + kk.w * delta;
      }
      if (ll == 0) so[tt][r] = gam * bq + delta * kq;
    }
    __syncthreads();
    const int64_t row0 = rec.first_row + t0;
    for (int idx = tid; idx < nt * RPC; idx += NT) {
      const int tt = idx / RPC, rr = idx % RPC;
      if (j0 + rr < sh.dv) o[(row0 + tt) * sh.value_dim + h * sh.dv + j0 + rr] = so[tt][rr];
    }
    if (PREFETCH) cur ^= 1;
    else if (t0 + TB < rec.n_rows) stage(blk[0], t0 + TB);  // every read of blk[0] is before the barrier
    // so is rewritten only after the next block's barrier, which follows every read of it above.
  }
  if (row_ok) {
#pragma unroll
    for (int m = 0; m < F4; ++m) {
      const int f = ll + LPR * m;
      if (f < dk4) srow[f] = s[m];
    }
  }
  // The window: the fetched channels (this thread's own copies, complete after the wait), then the rest.
  copy_async_wait<0>();
  if (!PREFETCH && w_ch < w_end && tid < WCH)
    for (int k = 0; k < sh.K - 1; ++k) cell[(int64_t)k * sh.C + w_ch] = swin[k][tid];
  if (sh.K > 1) {
    float v[dn::kMaxConv - 1];
    for (int ch = w_begin + (PREFETCH ? 0 : WCH) + tid; ch < w_end; ch += NT) {
      dn::window_load(sh, rec, cell, qkv, ch, v);
      dn::window_store(sh, cell, ch, v);
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// 3. output: a CTA per (row, group of heads); a warp per head: sum of squares over dv, then
// y = o * rsqrt(mean + eps) * norm * SiLU(z), kept in shared memory for the int8 pass (whole 32-blocks
// of the row inside the CTA's channels: the host makes the groups start at multiples of 32). A lane
// holds VPL values of its head (dv <= 32 VPL), loaded before the row's record is known.
template <int VPL>
__global__ void __launch_bounds__(256) output_kernel(Shape sh, const float* __restrict__ norm, float eps, DeltaNetSeqs seqs,
                                                     int heads_per_cta, const float* __restrict__ o,
                                                     const float* __restrict__ z, float* __restrict__ out, ActQ8 act) {
  extern __shared__ float sy[];
  wait_for_previous_kernel();
  const int row = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, n_warps = blockDim.x / 32;
  const int h0 = blockIdx.x * heads_per_cta, h1 = min(sh.n_v, h0 + heads_per_cta);
  const int64_t base = (int64_t)row * sh.value_dim;
  float ov[VPL], zv[VPL], nw[VPL];
  auto load = [&](int h) {
#pragma unroll
    for (int m = 0; m < VPL; ++m) {
      const int jj = lane + 32 * m;
      const bool ok = jj < sh.dv;
      ov[m] = ok ? o[base + (int64_t)h * sh.dv + jj] : 0.0f;
      zv[m] = ok ? z[base + (int64_t)h * sh.dv + jj] : 0.0f;
      nw[m] = ok ? norm[jj] : 0.0f;
    }
  };
  if (h0 + warp < h1) load(h0 + warp);
  const bool valid = dn::find_seq(seqs, row) >= 0;
  for (int h = h0 + warp; h < h1; h += n_warps) {
    if (h != h0 + warp) load(h);
    float ss = 0.0f;
#pragma unroll
    for (int m = 0; m < VPL; ++m) ss += ov[m] * ov[m];
    ss = warp_sum(ss);
    const float inv = 1.0f / sqrtf(ss / (float)sh.dv + eps);
#pragma unroll
    for (int m = 0; m < VPL; ++m) {
      const int jj = lane + 32 * m;
      if (jj >= sh.dv) break;
      const float y = valid ? ov[m] * inv * nw[m] * dn::silu(zv[m]) : 0.0f;
      if (out) out[base + (int64_t)h * sh.dv + jj] = y;
      sy[(h - h0) * sh.dv + jj] = y;
    }
  }
  if (act.q) {
    __syncthreads();
    const int groups = sh.value_dim / 32, c0 = h0 * sh.dv, c1 = h1 * sh.dv;
    for (int g = c0 / 32 + warp; g < groups && (g + 1) * 32 <= c1; g += n_warps) {
      const int64_t gi = (int64_t)row * groups + g;
      warp_quantize32(sy[g * 32 + lane - c0], lane, const_cast<int8_t*>(act.q) + gi * 32, const_cast<float*>(act.d) + gi,
                      const_cast<float*>(act.s) + gi);
    }
  }
}

int pad_dk(int dk) { return dk <= 16 ? 16 : dk <= 32 ? 32 : dk <= 64 ? 64 : dk <= 128 ? 128 : 256; }

}  // namespace

// ---------------------------------------------------------------------------------------------------
// Host side.

std::string delta_net_unsupported(const DeltaNetDims& d) {
  if (d.n_k_heads <= 0 || d.n_v_heads <= 0 || d.head_k <= 0 || d.head_v <= 0 || d.conv_kernel < 1)
    return fmt::format("DeltaNet shape n_k {} n_v {} dk {} dv {} K {} is empty", d.n_k_heads, d.n_v_heads, d.head_k, d.head_v,
                       d.conv_kernel);
  if (d.n_v_heads % d.n_k_heads) return fmt::format("DeltaNet v heads ({}) are not a multiple of k heads ({})", d.n_v_heads, d.n_k_heads);
  if (d.head_k % 4 || d.head_k > 256) return fmt::format("the GPU DeltaNet kernels need dk % 4 == 0 and dk <= 256 (dk = {})", d.head_k);
  if (d.head_v > 256) return fmt::format("the GPU DeltaNet kernels need dv <= 256 (dv = {})", d.head_v);
  if (d.conv_kernel > dn::kMaxConv) return fmt::format("the GPU DeltaNet kernels take conv kernels up to {} (K = {})", dn::kMaxConv, d.conv_kernel);
  if (d.conv_state_floats() % 4)
    return fmt::format("the GPU DeltaNet kernels need a conv window of whole 16-byte groups (n_v * dv = {} % 4 != 0)", d.value_dim());
  return "";
}

size_t delta_net_scratch_floats(const DeltaNetDims& d, int max_rows, bool chunked) {
  auto up = [](size_t n) { return (n + 63) / 64 * 64; };
  const size_t rows = (size_t)std::max(1, max_rows);
  size_t n = up(rows * d.conv_dim()) + up(rows * 2 * d.n_v_heads) + up(rows * d.value_dim());
  if (chunked) n += 3 * up(rows * d.n_v_heads * d.head_k) + 2 * up(rows * d.n_v_heads * d.head_v) + up(rows * d.n_v_heads);
  return n;
}

DeltaNetScratch delta_net_scratch(const DeltaNetDims& d, int max_rows, bool chunked, float* base) {
  auto up = [](size_t n) { return (n + 63) / 64 * 64; };
  const size_t rows = (size_t)std::max(1, max_rows);
  DeltaNetScratch s;
  float* p = base;
  auto take = [&](size_t n) {
    float* r = p;
    p += up(n);
    return r;
  };
  s.xc = take(rows * d.conv_dim());
  s.gb = take(rows * 2 * d.n_v_heads);
  s.o = take(rows * d.value_dim());
  if (chunked) {
    s.w = take(rows * d.n_v_heads * d.head_k);
    s.qp = take(rows * d.n_v_heads * d.head_k);
    s.kp = take(rows * d.n_v_heads * d.head_k);
    s.u = take(rows * d.n_v_heads * d.head_v);
    s.oi = take(rows * d.n_v_heads * d.head_v);
    s.g = take(rows * d.n_v_heads);
  }
  return s;
}

template <int MAXDK>
void launch_prepare(const Shape& sh, dim3 grid, const DeltaNetLayerDev& layer, const DeltaNetSeqs& seqs, const float* qkv,
                    const float* alpha, const float* beta, const DeltaNetScratch& s, cudaStream_t stream) {
  const dim3 block(kPrepWarps * 32);
  if (sh.K <= 4)
    launch(prepare_kernel<MAXDK, 4>, grid, block, 0, stream, pdl_enabled(), sh, layer, seqs, qkv, alpha, beta, s.xc, s.gb);
  else
    launch(prepare_kernel<MAXDK, dn::kMaxConv>, grid, block, 0, stream, pdl_enabled(), sh, layer, seqs, qkv, alpha, beta, s.xc, s.gb);
}

void delta_net_prepare(const DeltaNetDims& d, const DeltaNetLayerDev& layer, const DeltaNetSeqs& seqs, int n_rows,
                       const float* qkv, const float* alpha, const float* beta, const DeltaNetScratch& s, cudaStream_t stream) {
  if (n_rows <= 0) return;
  const Shape sh = dn::shape_of(d);
  const dim3 grid((unsigned)((2 * sh.n_k + sh.n_v + kPrepWarps - 1) / kPrepWarps), (unsigned)n_rows);
  switch (std::max(32, pad_dk(d.head_k))) {
    case 32: launch_prepare<32>(sh, grid, layer, seqs, qkv, alpha, beta, s, stream); break;
    case 64: launch_prepare<64>(sh, grid, layer, seqs, qkv, alpha, beta, s, stream); break;
    case 128: launch_prepare<128>(sh, grid, layer, seqs, qkv, alpha, beta, s, stream); break;
    default: launch_prepare<256>(sh, grid, layer, seqs, qkv, alpha, beta, s, stream); break;
  }
}

template <int MAXDK>
void launch_recurrent(const Shape& sh, const DeltaNetLayerDev& layer, const DeltaNetSeqs& seqs, int max_seq_rows,
                      const float* qkv, const DeltaNetScratch& s, cudaStream_t stream) {
  constexpr int rpc = Rec<MAXDK>::RPC;
  const dim3 grid((unsigned)(sh.n_v * ((sh.dv + rpc - 1) / rpc)), (unsigned)seqs.max_seqs), block(Rec<MAXDK>::WARPS * 32);
  if (max_seq_rows > Rec<MAXDK>::TB)
    launch(recurrent_kernel<MAXDK, true>, grid, block, 0, stream, pdl_enabled(), sh, layer, seqs, qkv, s.xc, s.gb, s.o);
  else
    launch(recurrent_kernel<MAXDK, false>, grid, block, 0, stream, pdl_enabled(), sh, layer, seqs, qkv, s.xc, s.gb, s.o);
}

void delta_net_recurrent(const DeltaNetDims& d, const DeltaNetLayerDev& layer, const DeltaNetSeqs& seqs, int max_seq_rows,
                         const float* qkv, const DeltaNetScratch& s, cudaStream_t stream) {
  if (seqs.max_seqs <= 0) return;
  const Shape sh = dn::shape_of(d);
  switch (pad_dk(d.head_k)) {
    case 16: launch_recurrent<16>(sh, layer, seqs, max_seq_rows, qkv, s, stream); break;
    case 32: launch_recurrent<32>(sh, layer, seqs, max_seq_rows, qkv, s, stream); break;
    case 64: launch_recurrent<64>(sh, layer, seqs, max_seq_rows, qkv, s, stream); break;
    case 128: launch_recurrent<128>(sh, layer, seqs, max_seq_rows, qkv, s, stream); break;
    default: launch_recurrent<256>(sh, layer, seqs, max_seq_rows, qkv, s, stream); break;
  }
}

void delta_net_output(const DeltaNetDims& d, const DeltaNetLayerDev& layer, float eps, const DeltaNetSeqs& seqs, int n_rows,
                      const float* z, const DeltaNetScratch& s, float* out, ActQ8 out_act, cudaStream_t stream) {
  if (n_rows <= 0) return;
  const Shape sh = dn::shape_of(d);
  if (out_act.q && sh.value_dim % 32) fail("DeltaNet int8 output needs value_dim % 32 == 0 (value_dim {})", sh.value_dim);
  // Heads per CTA: 4 (one warp each) unless int8 blocks straddle heads; then whole rows.
  const bool whole_row = out_act.q && sh.dv % 32 != 0;
  const int hpc = whole_row ? sh.n_v : 4;
  const size_t smem = (size_t)hpc * sh.dv * 4;  // <= 48 KB: no attribute to set (none during graph capture)
  if (smem > 48 * 1024)
    fail("DeltaNet int8 output with dv % 32 != 0 needs value_dim <= 12288 (value_dim {})", sh.value_dim);
  const dim3 grid((unsigned)((sh.n_v + hpc - 1) / hpc), (unsigned)n_rows), block(whole_row ? 256 : 128);
  auto go = [&](auto kernel) {
    launch(kernel, grid, block, smem, stream, pdl_enabled(), sh, layer.norm, eps, seqs, hpc, s.o, z, out, out_act);
  };
  if (sh.dv <= 32) go(output_kernel<1>);
  else if (sh.dv <= 64) go(output_kernel<2>);
  else if (sh.dv <= 128) go(output_kernel<4>);
  else go(output_kernel<8>);
}

void delta_net_forward(const DeltaNetDims& d, const DeltaNetLayerDev& layer, float eps, const DeltaNetSeqs& seqs, int n_rows,
                       DeltaNetForm form, int max_seq_rows, const float* qkv, const float* z, const float* alpha,
                       const float* beta, const DeltaNetScratch& s, float* out, ActQ8 out_act, cudaStream_t stream) {
  delta_net_prepare(d, layer, seqs, n_rows, qkv, alpha, beta, s, stream);
  if (form == DeltaNetForm::Chunked && s.w && delta_net_chunked_supported(d))
    delta_net_chunked(d, layer, seqs, max_seq_rows, qkv, s, false, stream);
  else
    delta_net_recurrent(d, layer, seqs, max_seq_rows, qkv, s, stream);
  delta_net_output(d, layer, eps, seqs, n_rows, z, s, out, out_act, stream);
}

}  // namespace roofline::cuda
