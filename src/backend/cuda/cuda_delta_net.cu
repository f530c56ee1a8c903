// The Gated DeltaNet mixer's kernels (see cuda_delta_net.cuh): prepare (conv + SiLU + L2 norm + gates),
// the recurrent form of the gated delta rule (decode), the output norm x SiLU(z) with int8
// quantization, the scratch layout, the host entry point, and the test hook gpu_delta_net_for_test.
//
// Expected time per layer for Qwen3.5-27B (n_k 16, n_v 48, dk = dv = 128, K 4, conv_dim 10240) on an
// H200 (~4.5 TB/s):
//   decode, per sequence: the state is 48 x 128 x 128 x 4 B = 3 MiB, read once and written once, plus
//     the conv window (3 x 10240 x 4 B = 120 KB, read twice, written once): ~6.5 MB -> ~1.45 us at the
//     roofline; 64 sequences ~93 us. One sequence cannot fill the memory pipes (3 MiB in flight is about
//     the bandwidth-latency product), so expect ~3-5 us for the three launches there.
//   prefill, 512 tokens of one sequence: the recurrent form does ~7 dk dv flops per token and head,
//     2.4 GFLOP, but its 512 steps are a dependent chain (two 8-lane reductions each): ~60-100 us. The
//     chunked form (cuda_delta_net_chunked.cu) does ~2.2 G multiply-adds, nearly all on tensor cores
//     (tf32 mma.sync, ~250-400 TFLOP/s on Hopper): ~15-30 us, bounded by the chunk scan's L2 traffic.
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
constexpr int kPrepWarps = 4;

template <int MAXDK>  // >= dk, multiple of 32
__global__ void __launch_bounds__(kPrepWarps * 32) prepare_kernel(Shape sh, DeltaNetLayerDev L, DeltaNetSeqs seqs,
                                                                  const float* qkv, const float* alpha, const float* beta,
                                                                  float* xc, float* gb) {
  wait_for_previous_kernel();
  const int row = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int unit = blockIdx.x * kPrepWarps + warp;
  if (unit >= 2 * sh.n_k + sh.n_v) return;  // whole warps
  const int si = dn::find_seq(seqs, row);
  if (si < 0) return;
  const DeltaNetSeqDev rec = seqs.seqs[si];
  const int t = row - rec.first_row;
  const float* win = rec.fresh ? nullptr : L.state + (int64_t)rec.cell * L.cell_stride;
  const int K = sh.K;
  // conv + SiLU of channel ch at this row: taps over times t-K+1 .. t, oldest first.
  auto conv = [&](int ch) {
    float acc = 0.0f;
    for (int k = 0; k < K; ++k) {
      const int tau = t - (K - 1) + k;
      float x;
      if (tau >= 0) x = qkv[(int64_t)(rec.first_row + tau) * sh.C + ch];
      else x = win ? win[(int64_t)(tau + K - 1) * sh.C + ch] : 0.0f;
      acc += L.conv[(int64_t)ch * K + k] * x;
    }
    return dn::silu(acc);
  };
  float* out = xc + (int64_t)row * sh.C;
  if (unit < 2 * sh.n_k) {
    const bool is_q = unit < sh.n_k;
    const int ch0 = is_q ? unit * sh.dk : sh.key_dim + (unit - sh.n_k) * sh.dk;
    float v[MAXDK / 32];
    float ss = 0.0f;
#pragma unroll
    for (int m = 0; m < MAXDK / 32; ++m) {
      const int c = lane + 32 * m;
      v[m] = c < sh.dk ? conv(ch0 + c) : 0.0f;
      ss += v[m] * v[m];
    }
    ss = warp_sum(ss);
    // transformers' l2norm: x / sqrt(sum x^2 + 1e-6); q also carries the 1/sqrt(dk) of o = S^T q / sqrt(dk).
    const float inv = (is_q ? 1.0f / sqrtf((float)sh.dk) : 1.0f) / sqrtf(ss + 1e-6f);
#pragma unroll
    for (int m = 0; m < MAXDK / 32; ++m) {
      const int c = lane + 32 * m;
      if (c < sh.dk) out[ch0 + c] = v[m] * inv;
    }
  } else {
    const int h = unit - 2 * sh.n_k;
    const int ch0 = 2 * sh.key_dim + h * sh.dv;
    for (int c = lane; c < sh.dv; c += 32) out[ch0 + c] = conv(ch0 + c);
    if (lane == 0) {
      const float x = alpha[(int64_t)row * sh.n_v + h] + L.dt_bias[h];
      const float sp = x > 20.0f ? x : log1pf(expf(x));
      gb[(int64_t)row * 2 * sh.n_v + h] = sp * L.a[h];
      gb[(int64_t)row * 2 * sh.n_v + sh.n_v + h] = 1.0f / (1.0f + expf(-beta[(int64_t)row * sh.n_v + h]));
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// 2a. The recurrent form. A CTA owns RPC rows (value indices j) of one v-head of one sequence; LPR lanes
// share a row, each holding 4*F4 of its dk elements (float4 f = ll + LPR*m, so a row's lanes read
// consecutive 16-byte pieces and every access to the state is a coalesced 16-byte one). The rows'
// state stays in registers for the whole run: read once (unless fresh), written once.
// Per token:  a = S_j.k, b = S_j.q (one pass, reduced over the row's lanes together)
//             delta = beta (v_j - gamma a);  o_j = gamma b + delta (k.q);  S_j = gamma S_j + delta k
// (o_j = S'_j.q expanded, so both reductions are independent). Tokens are staged in shared memory
// TB at a time (k, q of the k-head, v of the CTA's rows, gamma, beta, k.q).
template <int MAXDK>
struct Rec {
  static constexpr int LPR = MAXDK <= 32 ? 4 : MAXDK <= 128 ? 8 : 16;  // lanes per row
  static constexpr int F4 = MAXDK / (4 * LPR);                         // float4 per lane
  static constexpr int RPW = 32 / LPR;                                 // rows per warp
  static constexpr int WARPS = 8;
  static constexpr int RPC = WARPS * RPW;  // rows per CTA
  static constexpr int TB = 16;            // tokens per staged block
};

template <int MAXDK>
__global__ void __launch_bounds__(Rec<MAXDK>::WARPS * 32) recurrent_kernel(Shape sh, DeltaNetLayerDev L, DeltaNetSeqs seqs,
                                                                           const float* qkv, const float* xc, const float* gb,
                                                                           float* o) {
  using R = Rec<MAXDK>;
  constexpr int LPR = R::LPR, F4 = R::F4, RPC = R::RPC, TB = R::TB, KV4 = MAXDK / 4;
  __shared__ float4 sk[TB][KV4], sq[TB][KV4];
  __shared__ float sv[TB][RPC], so[TB][RPC];
  __shared__ float sgam[TB], sbeta[TB], skq[TB];
  wait_for_previous_kernel();
  if ((int)blockIdx.y >= *seqs.count) return;
  const DeltaNetSeqDev rec = seqs.seqs[blockIdx.y];
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
    s[m] = (!rec.fresh && row_ok && f < dk4) ? srow[f] : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  dn::slide_window(sh, rec, cell, qkv, blockIdx.x, gridDim.x);

  const int64_t ldx = sh.C, ldg = 2 * sh.n_v;
  for (int t0 = 0; t0 < rec.n_rows; t0 += TB) {
    const int nt = min(TB, rec.n_rows - t0);
    const int64_t row0 = rec.first_row + t0;
    for (int idx = tid; idx < TB * KV4; idx += blockDim.x) {
      const int tt = idx / KV4, f = idx % KV4;
      float4 kk = make_float4(0.f, 0.f, 0.f, 0.f), qq = kk;
      if (tt < nt && f < dk4) {
        const float* x = xc + (row0 + tt) * ldx;
        kk = reinterpret_cast<const float4*>(x + sh.key_dim + hk * sh.dk)[f];
        qq = reinterpret_cast<const float4*>(x + hk * sh.dk)[f];
      }
      sk[tt][f] = kk;
      sq[tt][f] = qq;
    }
    for (int idx = tid; idx < TB * RPC; idx += blockDim.x) {
      const int tt = idx / RPC, rr = idx % RPC;
      sv[tt][rr] = (tt < nt && j0 + rr < sh.dv) ? xc[(row0 + tt) * ldx + 2 * sh.key_dim + h * sh.dv + j0 + rr] : 0.0f;
    }
    if (tid < TB) {
      const bool ok = tid < nt;
      sgam[tid] = ok ? expf(gb[(row0 + tid) * ldg + h]) : 1.0f;
      sbeta[tid] = ok ? gb[(row0 + tid) * ldg + sh.n_v + h] : 0.0f;
    }
    __syncthreads();
    for (int tt = warp; tt < TB; tt += R::WARPS) {
      float acc = 0.0f;
      for (int f = lane; f < KV4; f += 32) {
        const float4 a = sk[tt][f], b = sq[tt][f];
        acc += a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
      }
      acc = warp_sum(acc);
      if (lane == 0) skq[tt] = acc;
    }
    __syncthreads();
    for (int tt = 0; tt < nt; ++tt) {
      float4 kk[F4];
      float a = 0.0f, b = 0.0f;
#pragma unroll
      for (int m = 0; m < F4; ++m) {
        const int f = ll + LPR * m;
        kk[m] = sk[tt][f];
        const float4 qq = sq[tt][f];
        a += s[m].x * kk[m].x + s[m].y * kk[m].y + s[m].z * kk[m].z + s[m].w * kk[m].w;
        b += s[m].x * qq.x + s[m].y * qq.y + s[m].z * qq.z + s[m].w * qq.w;
      }
#pragma unroll
      for (int off = LPR / 2; off > 0; off >>= 1) {
        a += __shfl_xor_sync(0xffffffffu, a, off);
        b += __shfl_xor_sync(0xffffffffu, b, off);
      }
      const float gam = sgam[tt];
      const float delta = sbeta[tt] * (sv[tt][r] - gam * a);
#pragma unroll
      for (int m = 0; m < F4; ++m) {
        s[m].x = s[m].x * gam + kk[m].x * delta;
        s[m].y = s[m].y * gam + kk[m].y * delta;
        s[m].z = s[m].z * gam + kk[m].z * delta;
        s[m].w = s[m].w * gam + kk[m].w * delta;
      }
      if (ll == 0) so[tt][r] = gam * b + delta * skq[tt];
    }
    __syncthreads();
    for (int idx = tid; idx < nt * RPC; idx += blockDim.x) {
      const int tt = idx / RPC, rr = idx % RPC;
      if (j0 + rr < sh.dv) o[(row0 + tt) * sh.value_dim + h * sh.dv + j0 + rr] = so[tt][rr];
    }
    // The next block's staging writes sk..sbeta, read above before the barrier; so is rewritten only
    // after the next block's two barriers.
  }
  if (row_ok) {
#pragma unroll
    for (int m = 0; m < F4; ++m) {
      const int f = ll + LPR * m;
      if (f < dk4) srow[f] = s[m];
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// 3. output: a CTA per (row, group of heads); a warp per head: sum of squares over dv, then
// y = o * rsqrt(mean + eps) * norm * SiLU(z), kept in shared memory for the int8 pass (whole 32-blocks
// of the row inside the CTA's channels: the host makes the groups start at multiples of 32).
__global__ void __launch_bounds__(256) output_kernel(Shape sh, const float* norm, float eps, DeltaNetSeqs seqs,
                                                     int heads_per_cta, const float* o, const float* z, float* out,
                                                     ActQ8 act) {
  extern __shared__ float sy[];
  wait_for_previous_kernel();
  const int row = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, n_warps = blockDim.x / 32;
  const int h0 = blockIdx.x * heads_per_cta, h1 = min(sh.n_v, h0 + heads_per_cta);
  const int c0 = h0 * sh.dv, c1 = h1 * sh.dv;
  const int64_t base = (int64_t)row * sh.value_dim;
  const bool valid = dn::find_seq(seqs, row) >= 0;
  if (!valid) {
    for (int c = c0 + threadIdx.x; c < c1; c += blockDim.x) {
      if (out) out[base + c] = 0.0f;
      sy[c - c0] = 0.0f;
    }
  } else {
    for (int h = h0 + warp; h < h1; h += n_warps) {
      const float* oh = o + base + (int64_t)h * sh.dv;
      float ss = 0.0f;
      for (int jj = lane; jj < sh.dv; jj += 32) ss += oh[jj] * oh[jj];
      ss = warp_sum(ss);
      const float inv = 1.0f / sqrtf(ss / (float)sh.dv + eps);
      for (int jj = lane; jj < sh.dv; jj += 32) {
        const float y = oh[jj] * inv * norm[jj] * dn::silu(z[base + (int64_t)h * sh.dv + jj]);
        if (out) out[base + (int64_t)h * sh.dv + jj] = y;
        sy[(h - h0) * sh.dv + jj] = y;
      }
    }
  }
  if (act.q) {
    __syncthreads();
    const int groups = sh.value_dim / 32;
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
  if (d.conv_state_floats() % 4)
    return fmt::format("the GPU DeltaNet kernels need a conv window of whole 16-byte groups (n_v * dv = {} % 4 != 0)", d.value_dim());
  return "";
}

size_t delta_net_scratch_floats(const DeltaNetDims& d, int max_rows, bool chunked) {
  auto up = [](size_t n) { return (n + 63) / 64 * 64; };
  const size_t rows = (size_t)std::max(1, max_rows);
  size_t n = up(rows * d.conv_dim()) + up(rows * 2 * d.n_v_heads) + up(rows * d.value_dim());
  if (chunked)
    n += up(rows * d.n_v_heads * d.head_k) + up(rows * d.n_v_heads * d.head_v) + up(rows * d.n_v_heads * dn::kChunk) +
         up(rows * d.n_v_heads);
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
    s.u = take(rows * d.n_v_heads * d.head_v);
    s.p = take(rows * d.n_v_heads * dn::kChunk);
    s.g = take(rows * d.n_v_heads);
  }
  return s;
}

void delta_net_prepare(const DeltaNetDims& d, const DeltaNetLayerDev& layer, const DeltaNetSeqs& seqs, int n_rows,
                       const float* qkv, const float* alpha, const float* beta, const DeltaNetScratch& s, cudaStream_t stream) {
  if (n_rows <= 0) return;
  const Shape sh = dn::shape_of(d);
  const dim3 grid((unsigned)((2 * sh.n_k + sh.n_v + kPrepWarps - 1) / kPrepWarps), (unsigned)n_rows);
  const dim3 block(kPrepWarps * 32);
  switch (std::max(32, pad_dk(d.head_k))) {
    case 32: launch(prepare_kernel<32>, grid, block, 0, stream, pdl_enabled(), sh, layer, seqs, qkv, alpha, beta, s.xc, s.gb); break;
    case 64: launch(prepare_kernel<64>, grid, block, 0, stream, pdl_enabled(), sh, layer, seqs, qkv, alpha, beta, s.xc, s.gb); break;
    case 128: launch(prepare_kernel<128>, grid, block, 0, stream, pdl_enabled(), sh, layer, seqs, qkv, alpha, beta, s.xc, s.gb); break;
    default: launch(prepare_kernel<256>, grid, block, 0, stream, pdl_enabled(), sh, layer, seqs, qkv, alpha, beta, s.xc, s.gb); break;
  }
}

void delta_net_recurrent(const DeltaNetDims& d, const DeltaNetLayerDev& layer, const DeltaNetSeqs& seqs, const float* qkv,
                         const DeltaNetScratch& s, cudaStream_t stream) {
  if (seqs.max_seqs <= 0) return;
  const Shape sh = dn::shape_of(d);
  auto go = [&](auto kernel, int rpc) {
    const dim3 grid((unsigned)(sh.n_v * ((sh.dv + rpc - 1) / rpc)), (unsigned)seqs.max_seqs);
    launch(kernel, grid, dim3(Rec<16>::WARPS * 32), 0, stream, pdl_enabled(), sh, layer, seqs, qkv, s.xc, s.gb, s.o);
  };
  switch (pad_dk(d.head_k)) {
    case 16: go(recurrent_kernel<16>, Rec<16>::RPC); break;
    case 32: go(recurrent_kernel<32>, Rec<32>::RPC); break;
    case 64: go(recurrent_kernel<64>, Rec<64>::RPC); break;
    case 128: go(recurrent_kernel<128>, Rec<128>::RPC); break;
    default: go(recurrent_kernel<256>, Rec<256>::RPC); break;
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
  const dim3 grid((unsigned)((sh.n_v + hpc - 1) / hpc), (unsigned)n_rows);
  launch(output_kernel, grid, dim3(whole_row ? 256 : 128), smem, stream, pdl_enabled(), sh, layer.norm, eps, seqs, hpc, s.o,
         z, out, out_act);
}

void delta_net_forward(const DeltaNetDims& d, const DeltaNetLayerDev& layer, float eps, const DeltaNetSeqs& seqs, int n_rows,
                       DeltaNetForm form, int max_seq_rows, const float* qkv, const float* z, const float* alpha,
                       const float* beta, const DeltaNetScratch& s, float* out, ActQ8 out_act, cudaStream_t stream) {
  delta_net_prepare(d, layer, seqs, n_rows, qkv, alpha, beta, s, stream);
  if (form == DeltaNetForm::Chunked && s.w && delta_net_chunked_supported(d))
    delta_net_chunked(d, layer, seqs, max_seq_rows, qkv, s, false, stream);
  else
    delta_net_recurrent(d, layer, seqs, qkv, s, stream);
  delta_net_output(d, layer, eps, seqs, n_rows, z, s, out, out_act, stream);
}

}  // namespace roofline::cuda
