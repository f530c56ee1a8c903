// The feed-forward block of a one-row decode step as one persistent launch: rms norm and its int8 form,
// gate and up, SwiGLU, down and the residual add, which otherwise take four launches. One CTA per SM
// takes a fixed share of the rows of every matrix (gate/up row pairs, then down rows); each warp streams
// its own rows into its own ring of shared-memory stages with asynchronous copies and reads them there,
// so the DRAM keeps reading the next rows while a warp computes, while the CTA waits on the one grid-wide
// barrier (all of h written) and while the launches around it run. Every value is computed with the
// arithmetic of the separate kernels (rms_norm_wide_kernel, the Q4_K / Q6_K row functions of
// cuda_matvec_rows.cuh, gated_product_kernel, warp_quantize32) and each row is reduced by one warp in the
// same order, so the output has the same bits as the four launches.
// Off by default (ROOFLINE_PERSISTENT_FFN=1 turns it on): on the H200 it is slower than the four launches
// (qwen3-32b tg128 106 against 127 tok/s), and as slow with the products' arithmetic left out, so what
// limits it is how the weights stream (per-warp rings of cp.async stages, static row shares), not the
// arithmetic: docs/performance.md. ROOFLINE_FFN_WARPS / ROOFLINE_FFN_STAGES are compile-time settings
// for those experiments (16 x 4, 20 x 4, 24 x 3 and 32 x 2 measured; 24 x 3 the best).
#include <algorithm>
#include <atomic>

#include "backend/cuda/cuda_kernels.cuh"
#include "backend/cuda/cuda_matvec_rows.cuh"
#include "backend/cuda/cuda_mma.cuh"
#include "backend/gpu.h"

#ifndef ROOFLINE_FFN_WARPS
#define ROOFLINE_FFN_WARPS 24
#endif
#ifndef ROOFLINE_FFN_STAGES
#define ROOFLINE_FFN_STAGES 3
#endif

namespace roofline::cuda {

namespace {

constexpr int kWarps = ROOFLINE_FFN_WARPS, kThreads = 32 * kWarps;
constexpr int kStages = ROOFLINE_FFN_STAGES;  // stages of a warp in shared memory at once (the others in flight while one is read)
// One stage: gate/up (Q4_K) two rows x 8 super-blocks; down one row x 16 (Q4_K) or 8 (Q6_K: low nibbles,
// 2-bit highs, int8 scales, f16 d).
constexpr int kStageBytes = 2 * 8 * 144;
constexpr int kQ6kHi = 8 * 128, kQ6kSc = kQ6kHi + 8 * 64, kQ6kD = kQ6kSc + 8 * 16;
constexpr int kMaxEmbd = 8192, kMaxFf = 32768;
constexpr int kMaxDevices = 64;
constexpr int kBatch = 8;  // 32-blocks a warp loads at once before quantizing them

struct Params {
  DeviceWeight gate, up, down;
  const float* norm_w;
  float eps;
  float* x;
  float* h;
  unsigned long long* sync;
  int n_embd, n_ff;
  int act_bytes;  // the int8 activations' region (either input, in its product's load order)
};

// Shared memory: [kWarps x kStages stages][int8 activations][d][s][8 partial sums].
struct Smem {
  uint8_t* slots;
  int8_t* aq;
  float *ad, *as, *red;
};
__host__ __device__ inline int max_blocks(int n_embd, int n_ff) { return (n_embd > n_ff ? n_embd : n_ff) / 32; }
__host__ __device__ inline size_t smem_bytes(int act_bytes, int n_embd, int n_ff) {
  return (size_t)kWarps * kStages * kStageBytes + act_bytes + 2 * 4 * (size_t)max_blocks(n_embd, n_ff) + 4 * 8;
}
__device__ inline Smem carve(uint8_t* base, const Params& p) {
  Smem s;
  s.slots = base;
  s.aq = reinterpret_cast<int8_t*>(base + (size_t)kWarps * kStages * kStageBytes);
  s.ad = reinterpret_cast<float*>(s.aq + p.act_bytes);
  s.as = s.ad + max_blocks(p.n_embd, p.n_ff);
  s.red = s.as + max_blocks(p.n_embd, p.n_ff);
  return s;
}

// Where element e of an activation row goes in shared memory: in the order a product's lanes load it, so
// that each load instruction of a warp reads 512 consecutive bytes (no bank conflicts). Q4_K (lane 4g + c
// takes chunk c of super-block 8k + g, its k-th 16 bytes 512 bytes after the previous): groups of 8
// super-blocks; Q6_K (lane 8ii + j takes elements 32j.. of super-block 4k + ii): groups of 4.
__device__ __forceinline__ int act_offset(bool q6, int e) {
  const int i = e >> 8, o = e & 255;
  if (q6) return (i >> 2) * 1024 + ((o >> 4) & 1) * 512 + (i & 3) * 128 + (o >> 5) * 16 + (o & 15);
  return (i >> 3) * 2048 + ((o >> 4) & 3) * 512 + (i & 7) * 64 + (o >> 6) * 16 + (o & 15);
}

// warp_quantize32 (cuda_common.cuh), block gb of the row, stored in the product's load order.
__device__ __forceinline__ void quantize32_to_smem(float v, int lane, int gb, bool q6, const Smem& s) {
  const float amax = warp_max(fabsf(v));
  const float d = amax / 127.0f, inv = d > 0 ? 1.0f / d : 0.0f;
  const int qi = __float2int_rn(v * inv);
  s.aq[act_offset(q6, gb * 32 + lane)] = (int8_t)qi;
  int sum = qi;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (lane == 0) {
    s.ad[gb] = d;
    s.as[gb] = d * (float)sum;
  }
}

// One stage of a warp: super-blocks [sb0, sb0 + n_sbs) of rows row, row + 1 (two: gate/up) of one matrix.
struct Stage {
  int mat = 0;  // 0 gate, 1 up, 2 down
  int row = 0;
  bool two = false, first = false, last = false;  // a second row; the first / last stage of its rows
  int sb0 = 0, n_sbs = 0;
};

// The CTA's rows of an output of `total` rows.
__device__ __forceinline__ void share(int total, int& begin, int& end) {
  begin = (int)((int64_t)total * blockIdx.x / gridDim.x);
  end = (int)((int64_t)total * (blockIdx.x + 1) / gridDim.x);
}

// A warp's work: pairs warp, warp + kWarps, .. of the CTA's gate/up rows (each gate, then up), then rows
// warp, warp + kWarps, .. of its down rows.
struct Plan {
  int h0, h1, d0, d1;
  int st_a, st_b, sbs_b;  // stages per row (pair), super-blocks per down stage
  int stages_a, n_stages;
  bool down_q6;
};
__device__ inline Plan plan_stages(const Params& p, int warp) {
  Plan pl;
  share(p.n_ff, pl.h0, pl.h1);
  share(p.n_embd, pl.d0, pl.d1);
  pl.down_q6 = p.down.type == DType::Q6_K;
  pl.st_a = (p.n_embd / 256 + 7) / 8;
  pl.sbs_b = pl.down_q6 ? 8 : 16;
  pl.st_b = (p.n_ff / 256 + pl.sbs_b - 1) / pl.sbs_b;
  const int pairs = (pl.h1 - pl.h0 + 1) / 2, rows_b = pl.d1 - pl.d0;
  const int my_pairs = pairs > warp ? (pairs - warp + kWarps - 1) / kWarps : 0;
  const int my_rows = rows_b > warp ? (rows_b - warp + kWarps - 1) / kWarps : 0;
  pl.stages_a = my_pairs * 2 * pl.st_a;
  pl.n_stages = pl.stages_a + my_rows * pl.st_b;
  return pl;
}
// Where a warp is in its list of stages, stepped without divisions: pair or row j, matrix, stage of the row.
struct Cursor {
  int k = 0, j = 0, mat = 0, step = 0;
};
__device__ __forceinline__ Cursor first_stage(const Plan& pl) {
  Cursor c;
  c.mat = pl.stages_a == 0 ? 2 : 0;
  return c;
}
__device__ __forceinline__ void advance(Cursor& c, const Plan& pl) {
  if (++c.k == pl.stages_a) {
    c.j = c.step = 0;
    c.mat = 2;
  } else if (c.mat < 2) {
    if (++c.step == pl.st_a) {
      c.step = 0;
      if (++c.mat == 2) c.mat = 0, ++c.j;
    }
  } else if (++c.step == pl.st_b) {
    c.step = 0;
    ++c.j;
  }
}
__device__ __forceinline__ Stage stage_of(const Params& p, const Plan& pl, int warp, const Cursor& c) {
  Stage st;
  st.mat = c.mat;
  int n_sb, sbs;
  if (c.mat < 2) {
    st.row = pl.h0 + 2 * (warp + kWarps * c.j);
    st.two = st.row + 1 < pl.h1;
    n_sb = p.n_embd / 256;
    sbs = 8;
  } else {
    st.row = pl.d0 + warp + kWarps * c.j;
    n_sb = p.n_ff / 256;
    sbs = pl.sbs_b;
  }
  st.sb0 = c.step * sbs;
  st.n_sbs = min(sbs, n_sb - st.sb0);
  st.first = c.step == 0;
  st.last = st.sb0 + st.n_sbs == n_sb;
  return st;
}

// The warp's copies of one stage into `slot` (16-byte pieces; Q6_K's d in 4-byte words).
__device__ inline void copy_stage(const Params& p, const Stage& st, uint8_t* slot, int lane) {
  const DeviceWeight& w = st.mat == 0 ? p.gate : st.mat == 1 ? p.up : p.down;
  if (w.type == DType::Q4_K) {
    const int pieces = st.n_sbs * 9;  // 144-byte super-blocks, a row's run contiguous
    for (int r = 0; r < 1 + (int)st.two; ++r) {
      const uint8_t* src = w.data + (int64_t)(st.row + r) * w.row_bytes + (int64_t)st.sb0 * 144;
      for (int o = lane; o < pieces; o += 32) copy_async<16>(slot + r * (8 * 144) + 16 * o, src + 16 * o);
    }
    return;
  }
  const int64_t row = st.row, n_sb = w.cols / 256;
  for (int o = lane; o < 8 * st.n_sbs; o += 32) copy_async<16>(slot + 16 * o, w.data + row * (w.cols / 2) + (int64_t)st.sb0 * 128 + 16 * o);
  for (int o = lane; o < 4 * st.n_sbs; o += 32) copy_async<16>(slot + kQ6kHi + 16 * o, w.plane1 + row * (w.cols / 4) + (int64_t)st.sb0 * 64 + 16 * o);
  if (lane < st.n_sbs) copy_async<16>(slot + kQ6kSc + 16 * lane, w.plane2 + row * (w.cols / 16) + (int64_t)st.sb0 * 16 + 16 * lane);
  else if (lane - 16 < st.n_sbs / 2 && lane >= 16) copy_async<4>(slot + kQ6kD + 4 * (lane - 16), w.plane3 + 2 * (row * n_sb + st.sb0) + 4 * (lane - 16));
}

// matvec_q4_k_partials (one token) for R rows (row r's super-blocks at rows[r], 144 bytes apart): lane
// group g's share of local super-block l, global index i.
template <int R>
__device__ __forceinline__ void q4k_rows(const uint8_t* const (&rows)[R], int l, int i, const Smem& s, int lane, float (&acc)[2]) {
  const int c = lane % 4;
  int4 hdr[R], q0[R], q1[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const uint8_t* blk = rows[r] + l * 144;
    hdr[r] = *reinterpret_cast<const int4*>(blk);
    q0[r] = *reinterpret_cast<const int4*>(blk + 16 + 32 * c);
    q1[r] = *reinterpret_cast<const int4*>(blk + 32 + 32 * c);
  }
  const Q4KUnpacked<R> u(hdr, q0, q1, c);
  const int8_t* x = s.aq + (i >> 3) * 2048 + 16 * (4 * (i & 7) + c);  // act_offset's Q4_K order: piece k 512 bytes on
  const int4 x0 = *reinterpret_cast<const int4*>(x), x1 = *reinterpret_cast<const int4*>(x + 512);
  const int4 x2 = *reinterpret_cast<const int4*>(x + 1024), x3 = *reinterpret_cast<const int4*>(x + 1536);
  const int sidx = 8 * i + 2 * c;
  const float2 ad = *reinterpret_cast<const float2*>(s.ad + sidx);
  const float2 as = *reinterpret_cast<const float2*>(s.as + sidx);
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = u.term(r, acc[r], x0, x1, x2, x3, ad, as);
}

// matvec_q6_k_partials (one token, one row): lane group ii's share of local super-block l, global index i.
__device__ __forceinline__ void q6k_row(const uint8_t* slot, int l, int i, const Smem& s, int lane, float& acc) {
  const int j = lane % 8;
  const int8_t* a = s.aq + (i >> 2) * 1024 + 16 * (8 * (i & 3) + j);  // act_offset's Q6_K order
  const int4 a0 = *reinterpret_cast<const int4*>(a), a1 = *reinterpret_cast<const int4*>(a + 512);
  const float ad = s.ad[8 * i + j];
  const int4 lo = *reinterpret_cast<const int4*>(slot + l * 128 + 16 * j);
  const int2 hi = *reinterpret_cast<const int2*>(slot + kQ6kHi + l * 64 + 8 * j);
  const short sc = *reinterpret_cast<const short*>(slot + kQ6kSc + l * 16 + 2 * j);
  const float d = __half2float(*reinterpret_cast<const __half*>(slot + kQ6kD + 2 * l));
  const float sc0 = (float)(int8_t)(sc & 0xFF), sc1 = (float)(int8_t)(sc >> 8);
  const int lw[4] = {lo.x, lo.y, lo.z, lo.w};
  int4 w0, w1;
  int* p0 = &w0.x;
  int* p1 = &w1.x;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    p0[k] = (int)__vsub4((unsigned)((lw[k] & 0x0F0F0F0F) | (((hi.x >> (2 * k)) & 0x03030303) << 4)), 0x20202020u);
    p1[k] = (int)__vsub4((unsigned)(((lw[k] >> 4) & 0x0F0F0F0F) | (((hi.y >> (2 * k)) & 0x03030303) << 4)), 0x20202020u);
  }
  const int d0 = dot16(w0, a0, 0), d1 = dot16(w1, a1, 0);
  acc += d * ad * (sc0 * (float)d0 + sc1 * (float)d1);
}

// Every CTA of the grid has arrived (and its writes before are visible) when this returns. The counter
// only grows: arrival number a belongs to barrier a / gridDim.x of the counter's life.
__device__ void grid_barrier(unsigned long long* counter) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    const unsigned long long before = atomicAdd(counter, 1ull);
    const unsigned long long target = (before / gridDim.x + 1) * gridDim.x;
    for (long long spins = 0;; ++spins) {
      unsigned long long now;
      asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(now) : "l"(counter) : "memory");
      if (now >= target) break;
      if (spins > (1ll << 28)) __trap();  // a CTA that never came: fail loudly rather than hang
      __nanosleep(32);
    }
    __threadfence();
  }
  __syncthreads();
}

// Blocks warp, warp + kWarps, .. of n/32 values value(col) quantized into shared memory, kBatch loads in
// flight at once.
template <typename Value>
__device__ __forceinline__ void quantize_row(int n, bool q6, const Smem& s, int warp, int lane, Value value) {
  const int nb = n / 32;
  for (int base = warp; base < nb; base += kBatch * kWarps) {
    float v[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int gb = base + u * kWarps;
      v[u] = gb < nb ? value(gb * 32 + lane) : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u)
      if (base + u * kWarps < nb) quantize32_to_smem(v[u], lane, base + u * kWarps, q6, s);
  }
}

__global__ void __launch_bounds__(kThreads, 1) decode_ffn_kernel(Params p) {
  extern __shared__ int4 ffn_smem[];
  const Smem s = carve(reinterpret_cast<uint8_t*>(ffn_smem), p);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const Plan pl = plan_stages(p, warp);
  uint8_t* slots = s.slots + (size_t)warp * kStages * kStageBytes;
  // Weights are no kernel's output: the first stages are on their way before the wait.
  Cursor ahead = first_stage(pl), cur = ahead;
#pragma unroll
  for (int k = 0; k < kStages - 1; ++k) {
    if (k < pl.n_stages) {
      copy_stage(p, stage_of(p, pl, warp, ahead), slots + k * kStageBytes, lane);
      advance(ahead, pl);
    }
    copy_async_commit();
  }
  wait_for_previous_kernel();

  // rms norm as rms_norm_wide_kernel computes it (256 threads sum the squares), int8 for gate/up.
  if (threadIdx.x < 256) {
    float ss = 0;
    const float4* x4 = reinterpret_cast<const float4*>(p.x);
#pragma unroll 8
    for (int i = threadIdx.x; i < p.n_embd / 4; i += 256) ss = add_squares(ss, x4[i]);
    ss = warp_sum(ss);
    if (lane == 0) s.red[warp] = ss;
  }
  __syncthreads();
  float total = 0;
  for (int i = 0; i < 8; ++i) total += s.red[i];
  const float scale = rsqrtf(total / (float)p.n_embd + p.eps);
  quantize_row(p.n_embd, false, s, warp, lane, [&](int col) { return p.x[col] * scale * p.norm_w[col]; });
  __syncthreads();

  // Every CTA has written its rows of h: down's int8 input from all of h (CTA-wide, once).
  auto gated = [&]() {
    grid_barrier(p.sync);
    quantize_row(p.n_ff, pl.down_q6, s, warp, lane, [&](int col) { return __ldcg(p.h + col); });
    __syncthreads();
  };

  bool crossed = false;
  float acc[2] = {0.0f, 0.0f}, gate_out[2] = {0.0f, 0.0f};  // a warp's gate rows wait for the same rows of up
  for (int k = 0; k < pl.n_stages; ++k) {
    copy_async_wait<kStages - 2>();
    __syncwarp();  // stage k is in for every lane; every lane is done with stage k - 1's slot
    if (k + kStages - 1 < pl.n_stages) {
      copy_stage(p, stage_of(p, pl, warp, ahead), slots + ((k + kStages - 1) % kStages) * kStageBytes, lane);
      advance(ahead, pl);
    }
    copy_async_commit();
    if (k == pl.stages_a && !crossed) {
      gated();
      crossed = true;
    }
    const Stage st = stage_of(p, pl, warp, cur);
    advance(cur, pl);
    const uint8_t* slot = slots + (k % kStages) * kStageBytes;
    if (st.first) acc[0] = acc[1] = 0.0f;
    if (st.mat < 2) {  // Q4_K, two rows (the second a repeat when past the CTA's rows), one round of 8
      const uint8_t* const rows[2] = {slot, st.two ? slot + 8 * 144 : slot};
      const int g = lane / 4;
      if (g < st.n_sbs) q4k_rows<2>(rows, g, st.sb0 + g, s, lane, acc);
    } else if (!pl.down_q6) {  // Q4_K down, one row, two rounds of 8
      const uint8_t* const rows[1] = {slot};
#pragma unroll
      for (int l = lane / 4; l < 16; l += 8)
        if (l < st.n_sbs) q4k_rows<1>(rows, l, st.sb0 + l, s, lane, acc);
    } else {  // Q6_K down, one row, two rounds of 4
#pragma unroll
      for (int l = lane / 8; l < 8; l += 4)
        if (l < st.n_sbs) q6k_row(slot, l, st.sb0 + l, s, lane, acc[0]);
    }
    if (!st.last) continue;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      if (r == 1 && (st.mat == 2 || !st.two)) break;
      const float v = warp_sum(acc[r]);
      const int row = st.row + r;
      if (st.mat == 0) gate_out[r] = v;  // every lane holds the sum
      if (lane != 0 || st.mat == 0) continue;
      if (st.mat == 2) p.x[row] = p.x[row] + v;
      else p.h[row] = gate_out[r] / (1.0f + __expf(-gate_out[r])) * v;  // gated_product_kernel's SwiGLU
    }
  }
  if (!crossed) gated();  // a warp without down rows still meets the barrier
}

int act_bytes_for(int n_embd, int n_ff) {
  auto round = [](int n) { return (n + 2047) / 2048 * 2048; };
  return std::max(round(n_embd), round(n_ff));
}

}  // namespace

int persistent_ffn_mode_for_test = -1;  // gpu_use_persistent_ffn_for_test: -1 the environment's

bool persistent_ffn_on() {
  static const bool env_on = env_switch("ROOFLINE_PERSISTENT_FFN", false);
  return persistent_ffn_mode_for_test >= 0 ? persistent_ffn_mode_for_test > 0 : env_on;
}

bool decode_ffn_fits(const DeviceWeight& gate, const DeviceWeight& up, const DeviceWeight& down, int n_ctas) {
  const int64_t n_embd = gate.cols, n_ff = gate.rows;
  if (gate.type != DType::Q4_K || up.type != DType::Q4_K || gate.layout != WeightLayout::Raw || up.layout != WeightLayout::Raw) return false;
  if (up.rows != n_ff || up.cols != n_embd || down.rows != n_embd || down.cols != n_ff) return false;
  if (n_embd % 256 || n_ff % 256 || n_embd > kMaxEmbd || n_ff > kMaxFf || n_ctas < 1 || n_ctas > n_embd) return false;
  if (down.type == DType::Q4_K) return down.layout == WeightLayout::Raw;
  return down.type == DType::Q6_K && down.layout == WeightLayout::Q6KPlanes && (n_ff / 256) % 2 == 0;  // d copied in words
}

int decode_ffn_ctas(int device) {
  int sms = 0;
  ROOFLINE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const size_t need = smem_bytes(act_bytes_for(kMaxEmbd, kMaxFf), kMaxEmbd, kMaxFf);
  int optin = 0;
  ROOFLINE_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  int major = 0;
  ROOFLINE_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  return (size_t)optin >= need && major >= 8 ? sms : 0;
}

void decode_ffn(const DecodeFfn& f, int n_ctas, cudaStream_t stream) {
  if (!decode_ffn_fits(f.gate, f.up, f.down, n_ctas)) fail("internal error: the persistent decode FFN does not take these weights");
  Params p{f.gate, f.up, f.down, f.norm_w, f.eps, f.x, f.h, f.sync, (int)f.gate.cols, (int)f.gate.rows, 0};
  p.act_bytes = act_bytes_for(p.n_embd, p.n_ff);
  const size_t smem = smem_bytes(p.act_bytes, p.n_embd, p.n_ff);
  static std::atomic<bool> attr_set[kMaxDevices] = {};  // the shared-memory limit is set per device
  int device = 0;
  ROOFLINE_CUDA_CHECK(cudaGetDevice(&device));
  if (device >= kMaxDevices) fail("internal error: device {} beyond the persistent FFN's table", device);
  if (!attr_set[device].load()) {
    ROOFLINE_CUDA_CHECK(cudaFuncSetAttribute(decode_ffn_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)smem_bytes(act_bytes_for(kMaxEmbd, kMaxFf), kMaxEmbd, kMaxFf)));
    attr_set[device].store(true);
  }
  launch(decode_ffn_kernel, dim3((unsigned)n_ctas), dim3(kThreads), smem, stream, pdl_enabled(), p);
}

}  // namespace roofline::cuda

void roofline::gpu_use_persistent_ffn_for_test(int mode) { cuda::persistent_ffn_mode_for_test = mode < 0 ? -1 : mode > 0 ? 1 : 0; }
