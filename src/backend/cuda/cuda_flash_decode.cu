// Decode attention on tensor cores for f16 caches (flash-decoding): the split kernel's grid and spans, one CTA
// per (row, KV head, split of the row's keys), writing the same partials (running max, sum and unnormalised
// output per query head and split) for attention_combine_kernel to merge. The split kernel walks its span on
// CUDA cores, a few 16-byte loads in flight per thread, and reached ~780 GB/s at depth 8192 (qwen3-32b: 43 us
// a layer for 33.7 MB of keys and values); here the CTA stages blocks of 64 keys' K and V by cp.async (the
// block after it loading once this one is multiplied) and multiplies with mma.sync m16n8k16.
//
// The m16 tile's rows are the query heads of the KV head's group (up to 16; the rest padded with zero
// queries, never written); each of the 4 warps takes 16 keys of every block: S = Q K^T, masked past the
// span, the online softmax in base 2 on the accumulators (each row's max and sum over the 4 lanes that
// hold it), P reused as the A operand of P V. The warps' states merge in warp order at the end, so a row's
// result depends only on the row, its keys and the split boundaries (attention_span: the row's own).
// Queries and probabilities are rounded to f16, as in the prefill kernel (cuda_flash_prefill.cu).
//
// With ROOFLINE_FLASH_FINALIZE=1 (off: measured level), steps whose every row has one split (the grid's split count
// is 1: rows of up to the shortest span of keys) finalize in the kernel (F): the output o / l and its int8 form for
// the o product, written as the combine kernel writes them from one split's partials (its weight exp(0) = 1 and its
// 1 / l, the same bits), and the combine kernel is not launched: one kernel boundary fewer per attention layer.
#include <cuda_fp16.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/cuda_attention_splits.cuh"
#include "backend/cuda/cuda_flash_common.cuh"
#include "backend/cuda/cuda_kernels.cuh"
#include "backend/gpu.h"
#include "backend/cuda/cuda_mma.cuh"

namespace roofline::cuda {

extern std::atomic<int64_t> flash_finalize_launches;
bool flash_early_kv();

namespace {

constexpr int kWarps = 4;
constexpr int kWarpKeys = 16;              // keys per warp per staged block (one k16 step of P V)
constexpr int kBlock = kWarps * kWarpKeys;  // keys per staged block
constexpr int kPad = 8;                    // halves of padding per shared row (conflict-free fragment loads)
// Staging buffers: 1 (a span of up to 128 keys is two blocks; with half the shared memory a SM holds twice the
// CTAs: H200, tg64 at depth 8192 qwen3-32b 109.4 -> 111.5, qwen3-8b 306.7 -> 320.2 against 2), or with
// ROOFLINE_FLASH_DECODE_BUFFERS=2 for heads up to 128, 2 (the next block loads while this one is multiplied).
// Heads of 256 always take 1 (their output fragments take 128 registers and a block 68 KB).
template <int HD>
constexpr int kMaxBuffers = HD <= 128 ? 2 : 1;

template <int HD, int B>
constexpr size_t flash_decode_smem() {
  return (size_t)(16 + B * 2 * kBlock) * (HD + kPad) * sizeof(__half);
}

template <int HD, int B, bool F, bool E = false>
__global__ void __launch_bounds__(32 * kWarps) flash_decode_kernel(DeviceStep step, const float* q, KvLayer kv, int n_head, int n_head_kv,
                                                                   float scale, int max_splits, float* partial, const int* row_list,
                                                                   float* out, ActQ8 act) {
  constexpr int kRow = HD + kPad;  // halves per shared row
  constexpr int kChunks = HD / 8;  // 16-byte pieces per row
  extern __shared__ __align__(16) __half smem[];
  __half* qs = smem;               // [16][kRow]
  __half* kvs = qs + 16 * kRow;    // B x (K [kBlock][kRow], V [kBlock][kRow])
  const int gqa = n_head / n_head_kv;
  const int r = row_list ? row_list[blockIdx.x] : (int)blockIdx.x;
  const int kvh = blockIdx.y, split = blockIdx.z;
  // The span, from the step alone (before the wait): as split_work and the combine kernel count it.
  bool has_work = r < step.header[kStepRealRows];
  int k_begin = 0, k_end = 0, seq = 0;
  if (has_work) {
    const int pos = step.positions[r];
    const int first = attention_first_key(pos, kv.window);
    const int n_keys = pos + 1 - first;
    const int split_len = row_split_len(step, n_keys);
    has_work = split * split_len < n_keys;
    k_begin = first + split * split_len;
    k_end = min(pos + 1, k_begin + split_len);
    seq = step.row_seq[r];
  }
  // E: the first block's keys that no kernel of this step writes (positions before pos - real rows + 1: a
  // sequence's new rows in a step are consecutive, and this row attends only to those at or before it) are
  // staged before the wait, state left by earlier steps; the rest of the block after it.
  const int kv_dim = n_head_kv * HD;
  const __half* kcache = reinterpret_cast<const __half*>(kv.k) + (int64_t)kvh * HD;
  const __half* vcache = reinterpret_cast<const __half*>(kv.v) + (int64_t)kvh * HD;
  auto slot_of = [&](int pos) {
    return (int64_t)step.block_tables[(int64_t)seq * step.table_stride + pos / kv.block_size] * kv.block_size + pos % kv.block_size;
  };
  int early_end = k_begin;
  if constexpr (E) {
    if (has_work) {
      early_end = max(k_begin, min(min(k_end, k_begin + kBlock), step.positions[r] - step.header[kStepRealRows] + 1));
      stage_kv_keys<HD, kPad>(kvs, kvs + kBlock * kRow, kBlock, k_begin, k_begin, early_end, k_end, kcache, vcache, kv_dim, 32 * kWarps, slot_of);
      copy_async_commit();
    }
  }
  wait_for_previous_kernel();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (!has_work) {  // padding rows: the combine kernel writes their zeros, or here the finalizing kernel
    if constexpr (F)
      if (r >= step.header[kStepRealRows])
        for (int i = warp; i < gqa * (HD / 32); i += kWarps)
          store_output(out, act, r, kvh * gqa + i / (HD / 32), n_head, HD, i % (HD / 32) * 32 + lane, 0.0f);
    return;
  }
  // K and V of the block of keys from key0 into buffer buf (keys past the span are zero, so that their
  // probability 0 never meets a NaN).
  auto stage = [&](int key0, int buf) {
    __half* kd = kvs + buf * 2 * kBlock * kRow;
    __half* vd = kd + kBlock * kRow;
    stage_kv_block<HD, kPad>(kd, vd, kBlock, key0, k_end, kcache, vcache, kv_dim, 32 * kWarps, slot_of);
    copy_async_commit();
  };
  if constexpr (E) {  // the rest of the first block (this step's keys, and zeros past the span)
    stage_kv_keys<HD, kPad>(kvs, kvs + kBlock * kRow, kBlock, k_begin, early_end, k_begin + kBlock, k_end, kcache, vcache, kv_dim, 32 * kWarps,
                            slot_of);
    copy_async_commit();
  } else {
    stage(k_begin, 0);
  }
  // The group's queries, scaled and converted to f16 (saturated); rows past the group are zero.
  for (int i = threadIdx.x; i < 16 * kChunks; i += 32 * kWarps) {
    const int c = i / kChunks, p = i % kChunks;
    int4 v = make_int4(0, 0, 0, 0);
    if (c < gqa) {
      const float4* src = reinterpret_cast<const float4*>(q + ((int64_t)r * n_head + kvh * gqa + c) * HD + p * 8);
      v = f16x8_saturated(src[0], src[1], scale);
    }
    *reinterpret_cast<int4*>(qs + c * kRow + p * 8) = v;
  }

  constexpr float kLog2e = 1.4426950408889634f;
  float o[HD / 8][4];
#pragma unroll
  for (int n = 0; n < HD / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.0f, l_hi = 0.0f;
  for (int key0 = k_begin, buf = 0; key0 < k_end; key0 += kBlock) {
    const bool more = key0 + kBlock < k_end;
    if (B == 2 && more) {
      stage(key0 + kBlock, buf ^ 1);
      copy_async_wait<1>();
    } else {
      copy_async_wait<0>();
    }
    __syncthreads();  // this block's K/V (and, the first time, the queries) are in
    const __half* ks_b = kvs + buf * 2 * kBlock * kRow + warp * kWarpKeys * kRow;
    const __half* vs_b = ks_b + kBlock * kRow;

    // S = Q K^T: 16 query rows x this warp's 16 keys (two n-tiles of 8).
    float s[2][4] = {};
    const __half* qw = qs + (lane / 4) * kRow + (lane % 4) * 2;
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
      const uint32_t a0 = *reinterpret_cast<const uint32_t*>(qw + kk * 16);
      const uint32_t a1 = *reinterpret_cast<const uint32_t*>(qw + 8 * kRow + kk * 16);
      const uint32_t a2 = *reinterpret_cast<const uint32_t*>(qw + kk * 16 + 8);
      const uint32_t a3 = *reinterpret_cast<const uint32_t*>(qw + 8 * kRow + kk * 16 + 8);
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        const __half* kp = ks_b + (n * 8 + lane / 4) * kRow + kk * 16 + (lane % 4) * 2;
        mma_16816(s[n], a0, a1, a2, a3, *reinterpret_cast<const uint32_t*>(kp), *reinterpret_cast<const uint32_t*>(kp + 8));
      }
    }
    // Keys past the span masked; the online softmax of both rows (base 2).
    float mx_lo = -INFINITY, mx_hi = -INFINITY;
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = key0 + warp * kWarpKeys + n * 8 + (lane % 4) * 2 + (e & 1);
        s[n][e] = key < k_end ? s[n][e] * kLog2e : -INFINITY;
        if (e >= 2) mx_hi = fmaxf(mx_hi, s[n][e]);
        else mx_lo = fmaxf(mx_lo, s[n][e]);
      }
    // A warp whose keys are all past the span keeps m = -inf and adds nothing.
    float alpha_lo, alpha_hi;
    online_softmax_step(s, mx_lo, mx_hi, m_lo, m_hi, l_lo, l_hi, alpha_lo, alpha_hi);
    // O = O * alpha + P V, P's A fragment from the two score n-tiles.
    const uint32_t a0 = pack_half2(s[0][0], s[0][1]), a1 = pack_half2(s[0][2], s[0][3]);
    const uint32_t a2 = pack_half2(s[1][0], s[1][1]), a3 = pack_half2(s[1][2], s[1][3]);
    const __half* vp = vs_b + (lane & 15) * kRow + (lane >> 4) * 8;
#pragma unroll
    for (int n = 0; n < HD / 8; n += 2) {
      o[n][0] *= alpha_lo, o[n][1] *= alpha_lo, o[n][2] *= alpha_hi, o[n][3] *= alpha_hi;
      o[n + 1][0] *= alpha_lo, o[n + 1][1] *= alpha_lo, o[n + 1][2] *= alpha_hi, o[n + 1][3] *= alpha_hi;
      uint32_t b[4];
      ldmatrix_x4<true>(b, vp + n * 8);  // n-tiles n and n + 1 of the [key][dim] tile
      mma_16816(o[n], a0, a1, a2, a3, b[0], b[1]);
      mma_16816(o[n + 1], a0, a1, a2, a3, b[2], b[3]);
    }
    __syncthreads();  // every warp is done with this buffer before it is refilled
    if (B == 1 && more) stage(key0 + kBlock, 0);
    if (B == 2) buf ^= 1;
  }
#pragma unroll
  for (int off = 1; off <= 2; off <<= 1) {
    l_lo += __shfl_xor_sync(0xffffffffu, l_lo, off);
    l_hi += __shfl_xor_sync(0xffffffffu, l_hi, off);
  }
  // The warps' states (in the K/V and query space, free after the loop's last barrier), merged by warp 0 in
  // warp order.
  float* o_x = reinterpret_cast<float*>(kvs);  // [warp][n][e][lane]
  float* ml_x = reinterpret_cast<float*>(qs);  // [warp][m_lo, m_hi, l_lo, l_hi][lane]
  if (warp > 0) {
#pragma unroll
    for (int n = 0; n < HD / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) o_x[((warp * (HD / 8) + n) * 4 + e) * 32 + lane] = o[n][e];
    float* ml = ml_x + warp * 4 * 32;
    ml[lane] = m_lo, ml[32 + lane] = m_hi, ml[64 + lane] = l_lo, ml[96 + lane] = l_hi;
  }
  __syncthreads();
  if (warp == 0) {
  float M_lo = m_lo, M_hi = m_hi;
  for (int w = 1; w < kWarps; ++w) {
    M_lo = fmaxf(M_lo, ml_x[w * 128 + lane]);
    M_hi = fmaxf(M_hi, ml_x[w * 128 + 32 + lane]);
  }
  auto factor = [](float m, float m_all) { return m == -INFINITY ? 0.0f : exp2f(m - m_all); };
  float f_lo = factor(m_lo, M_lo), f_hi = factor(m_hi, M_hi);
  float L_lo = l_lo * f_lo, L_hi = l_hi * f_hi;
#pragma unroll
  for (int n = 0; n < HD / 8; ++n) o[n][0] *= f_lo, o[n][1] *= f_lo, o[n][2] *= f_hi, o[n][3] *= f_hi;
  for (int w = 1; w < kWarps; ++w) {
    const float* ml = ml_x + w * 128;
    f_lo = factor(ml[lane], M_lo);
    f_hi = factor(ml[32 + lane], M_hi);
    L_lo += ml[64 + lane] * f_lo;
    L_hi += ml[96 + lane] * f_hi;
#pragma unroll
    for (int n = 0; n < HD / 8; ++n) {
      const float* x = o_x + ((w * (HD / 8) + n) * 4) * 32 + lane;
      o[n][0] += x[0] * f_lo, o[n][1] += x[32] * f_lo, o[n][2] += x[64] * f_hi, o[n][3] += x[96] * f_hi;
    }
  }
  // Partials as the split kernel writes them: max (natural units), sum, then the output over the dims.
  constexpr float kLn2 = 0.6931471805599453f;
  const int64_t stride = HD + 2;
  auto write = [&](int c, float m, float l, int half) {
    float* out = partial + (((int64_t)r * n_head + kvh * gqa + c) * max_splits + split) * stride;
    if (lane % 4 == 0) out[0] = m * kLn2, out[1] = l;
#pragma unroll
    for (int n = 0; n < HD / 8; ++n) {
      out[2 + n * 8 + (lane % 4) * 2] = o[n][2 * half];
      out[2 + n * 8 + (lane % 4) * 2 + 1] = o[n][2 * half + 1];
    }
  };
  if constexpr (F) {
    // The combine kernel's value from one split: (0 + o * exp(0)) * (1 / l), laid out [query head][dim] in the
    // staging space (warp 0's reads of it above are done) for the four warps' stores in groups of 32.
    __syncwarp();
    float* fin = reinterpret_cast<float*>(kvs);
    const float inv_lo = 1.0f / L_lo, inv_hi = 1.0f / L_hi;
#pragma unroll
    for (int n = 0; n < HD / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int c = lane / 4 + (e >= 2 ? 8 : 0);
        if (c < gqa) fin[c * HD + n * 8 + (lane % 4) * 2 + (e & 1)] = (0.0f + o[n][e]) * (e >= 2 ? inv_hi : inv_lo);
      }
  } else {
    if (lane / 4 < gqa) write(lane / 4, M_lo, L_lo, 0);
    if (lane / 4 + 8 < gqa) write(lane / 4 + 8, M_hi, L_hi, 1);
  }
  }
  if constexpr (F) {
    __syncthreads();
    const float* fin = reinterpret_cast<const float*>(kvs);
    for (int i = warp; i < gqa * (HD / 32); i += kWarps) {
      const int c = i / (HD / 32), d = i % (HD / 32) * 32 + lane;
      store_output(out, act, r, kvh * gqa + c, n_head, HD, d, fin[c * HD + d]);
    }
  }
}

template <int HD, int B, bool F, bool E = false>
void launch_flash_decode_f(const DeviceStep& step, const float* q, float scale, const KvLayer& kv, int n_rows, int n_head, int n_head_kv,
                           int max_splits, int grid_splits, float* partial, const int* row_list, float* out, ActQ8 act, cudaStream_t stream) {
  constexpr size_t smem = flash_decode_smem<HD, B>();
  static const bool configured = [] {
    ROOFLINE_CUDA_CHECK(cudaFuncSetAttribute(flash_decode_kernel<HD, B, F, E>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    return true;
  }();
  (void)configured;
  launch(flash_decode_kernel<HD, B, F, E>, dim3((unsigned)n_rows, (unsigned)n_head_kv, (unsigned)grid_splits), dim3(32 * kWarps), smem, stream,
         pdl_enabled(), step, q, kv, n_head, n_head_kv, scale, max_splits, partial, row_list, out, act);
}

template <int HD, int B>
void launch_flash_decode_b(const DeviceStep& step, const float* q, float scale, const KvLayer& kv, int n_rows, int n_head, int n_head_kv,
                           int max_splits, int grid_splits, float* partial, const int* row_list, float* out, ActQ8 act, cudaStream_t stream) {
  if (out) {
    flash_finalize_launches.fetch_add(1, std::memory_order_relaxed);
    launch_flash_decode_f<HD, B, true>(step, q, scale, kv, n_rows, n_head, n_head_kv, max_splits, 1, partial, row_list, out, act, stream);
  } else if (B == 1 && flash_early_kv())
    launch_flash_decode_f<HD, 1, false, true>(step, q, scale, kv, n_rows, n_head, n_head_kv, max_splits, grid_splits, partial, row_list, out, act,
                                              stream);
  else launch_flash_decode_f<HD, B, false>(step, q, scale, kv, n_rows, n_head, n_head_kv, max_splits, grid_splits, partial, row_list, out, act, stream);
}

int flash_decode_mode_for_test = -1;  // gpu_use_flash_decode_for_test: -1 the environment's (default on)

template <int HD>
void launch_flash_decode(const DeviceStep& step, const float* q, float scale, const KvLayer& kv, int n_rows, int n_head, int n_head_kv,
                         int max_splits, int grid_splits, float* partial, const int* row_list, float* out, ActQ8 act, cudaStream_t stream) {
  static const bool env_double = [] {
    const char* env = std::getenv("ROOFLINE_FLASH_DECODE_BUFFERS");
    return env && std::strcmp(env, "2") == 0;
  }();
  const bool two = flash_decode_mode_for_test > 0 ? flash_decode_mode_for_test == 2 : env_double;
  if (two && kMaxBuffers<HD> == 2)
    launch_flash_decode_b<HD, 2>(step, q, scale, kv, n_rows, n_head, n_head_kv, max_splits, grid_splits, partial, row_list, out, act, stream);
  else
    launch_flash_decode_b<HD, 1>(step, q, scale, kv, n_rows, n_head, n_head_kv, max_splits, grid_splits, partial, row_list, out, act, stream);
}


}  // namespace

bool flash_decode_fits(const KvLayer& kv, int n_head, int n_head_kv, int head_dim_k, int head_dim_v) {
  static const bool env_on = env_switch("ROOFLINE_FLASH_DECODE", true);
  const bool on = flash_decode_mode_for_test >= 0 ? flash_decode_mode_for_test > 0 : env_on;
  return on && n_head_kv > 0 && n_head % n_head_kv == 0 && n_head / n_head_kv <= 16 && flash_prefill_fits(kv, head_dim_k, head_dim_v);
}

int flash_finalize_mode_for_test = -1;  // gpu_use_flash_finalize_for_test: -1 the environment's (default off)
int flash_early_kv_mode_for_test = -1;  // gpu_use_flash_early_kv_for_test: -1 the environment's (default on)

// Whether the one-buffer flash decode kernel stages its first block's older keys before the dependency wait
// (ROOFLINE_FLASH_EARLY_KV=0 turns it off): the same keys and arithmetic, the same bits; the first block's memory
// latency off the chain after rope. Measured on an H200 (docs/performance.md): qwen3-32b tg64 at depth 8192 111.3 /
// 111.4 against 110.3 / 110.7 (+0.7%), tg128 of qwen3-8b, qwen3-32b and qwen3.5-27b level.
bool flash_early_kv() {
  static const bool env_on = env_switch("ROOFLINE_FLASH_EARLY_KV", true);
  return flash_early_kv_mode_for_test >= 0 ? flash_early_kv_mode_for_test > 0 : env_on;
}
std::atomic<int64_t> flash_finalize_launches{0};  // (gpu_flash_finalize_launches_for_test)

bool flash_decode_finalizes(int grid_splits) {
  // Off by default: measured level on an H200 (tg128 with every row one split, ROOFLINE_ATTN_MIN_SPAN=128: qwen3-8b
  // 397.3 / 397.9 against 390.7 / 392.1, qwen3-32b 127.2 / 126.7 against 127.8 / 127.4, qwen3.5-27b 146.5 / 145.3
  // against 146.4 / 146.7; docs/performance.md): the finalizing tail costs what the combine kernel did.
  static const bool env_on = env_switch("ROOFLINE_FLASH_FINALIZE", false);
  return grid_splits == 1 && (flash_finalize_mode_for_test >= 0 ? flash_finalize_mode_for_test > 0 : env_on);
}

void flash_decode(const DeviceStep& step, const float* q, float scale, const KvLayer& kv, int n_rows, int n_head, int n_head_kv,
                  int head_dim, int max_splits, int grid_splits, float* partial, const int* row_list, float* out, ActQ8 act,
                  cudaStream_t stream) {
  if (n_rows < 1) return;
  switch (head_dim) {
    case 64:
      return launch_flash_decode<64>(step, q, scale, kv, n_rows, n_head, n_head_kv, max_splits, grid_splits, partial, row_list, out, act, stream);
    case 96:
      return launch_flash_decode<96>(step, q, scale, kv, n_rows, n_head, n_head_kv, max_splits, grid_splits, partial, row_list, out, act, stream);
    case 128:
      return launch_flash_decode<128>(step, q, scale, kv, n_rows, n_head, n_head_kv, max_splits, grid_splits, partial, row_list, out, act, stream);
    case 256:
      return launch_flash_decode<256>(step, q, scale, kv, n_rows, n_head, n_head_kv, max_splits, grid_splits, partial, row_list, out, act, stream);
    default: fail("internal error: flash decode attention with heads of {}", head_dim);
  }
}

}  // namespace roofline::cuda

namespace roofline {
void gpu_use_flash_decode_for_test(int mode) { cuda::flash_decode_mode_for_test = mode < 0 ? -1 : mode > 2 ? 2 : mode; }
void gpu_use_flash_finalize_for_test(int mode) { cuda::flash_finalize_mode_for_test = mode < 0 ? -1 : mode > 0 ? 1 : 0; }
int64_t gpu_flash_finalize_launches_for_test() { return cuda::flash_finalize_launches.load(); }
void gpu_use_flash_early_kv_for_test(int mode) { cuda::flash_early_kv_mode_for_test = mode < 0 ? -1 : mode > 0 ? 1 : 0; }
}  // namespace roofline
