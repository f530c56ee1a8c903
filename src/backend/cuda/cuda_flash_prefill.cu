// Prompt attention in one launch per run: tensor-core products (mma.sync m16n8k16, f16 in, f32
// accumulation) with the online softmax held in registers, reading keys and values straight from the
// paged f16 cache. It replaces, for f16 caches on sm_80 and newer, prefill_attention's chain of a key
// gather, two cuBLAS products and a softmax kernel per tile of keys (13% of a qwen3-32b pp512 step).
//
// Columns are (prompt row, query head of the group) pairs of one KV head: column c is row c / gqa, head
// c % gqa; each CTA reads its columns' f32 queries and converts them (times the scale) to f16 itself. A CTA takes kColGroups m16 tiles of columns, each
// tile two warps that split every block of keys between them (half the chain of dependent steps per
// warp; their results merge at the end). For each block of kKeys keys the CTA stages K and V in shared
// memory (cp.async, double-buffered: the next block loads while this one is multiplied); each warp
// forms its 16 x kKeys scores, masks keys past each row's position (and outside a sliding window),
// rescales its running output to the new row maxima, and adds P.V with P reused from the score
// accumulators as the A operand. Everything the warp needs of a row stays in the 4 lanes that
// share it in the fragment layout, so the row max and sum are two shuffles.
#include <cuda_fp16.h>

#include <climits>

#include "backend/cuda/cuda_flash_common.cuh"
#include "backend/cuda/cuda_kernels.cuh"
#include "backend/cuda/cuda_mma.cuh"

namespace roofline::cuda {

namespace {

constexpr int kColGroups = 4;           // m16 tiles of query columns per CTA
constexpr int kCols = 16 * kColGroups;  // query columns per CTA
constexpr int kPad = 8;             // halves of padding per shared row (conflict-free fragment loads)

// The KV cache slot of key position pos of the run's sequence.
__device__ __forceinline__ int64_t key_slot(const DeviceStep& step, int seq, int block_size, int pos) {
  return (int64_t)step.block_tables[(int64_t)seq * step.table_stride + pos / block_size] * block_size + pos % block_size;
}

// Part 0's state merged with part 1's (left in shared memory by the other warp of the column tile):
// both rescaled to the common row maxima.
template <int HD>
__device__ __forceinline__ void merge_part(float (&o)[HD / 8][4], float m_lo, float m_hi, float& l_lo, float& l_hi, const float* o_x,
                                           const float* ml_x, int lane) {
  const float mb_lo = ml_x[lane], mb_hi = ml_x[32 + lane];
  const float m_all_lo = fmaxf(m_lo, mb_lo), m_all_hi = fmaxf(m_hi, mb_hi);
  auto factor = [](float m, float m_all) { return m == -INFINITY ? 0.0f : exp2f(m - m_all); };
  const float fa_lo = factor(m_lo, m_all_lo), fb_lo = factor(mb_lo, m_all_lo);
  const float fa_hi = factor(m_hi, m_all_hi), fb_hi = factor(mb_hi, m_all_hi);
  l_lo = l_lo * fa_lo + ml_x[64 + lane] * fb_lo;
  l_hi = l_hi * fa_hi + ml_x[96 + lane] * fb_hi;
#pragma unroll
  for (int n = 0; n < HD / 8; ++n) {
    o[n][0] = o[n][0] * fa_lo + o_x[(n * 4 + 0) * 32 + lane] * fb_lo;
    o[n][1] = o[n][1] * fa_lo + o_x[(n * 4 + 1) * 32 + lane] * fb_lo;
    o[n][2] = o[n][2] * fa_hi + o_x[(n * 4 + 2) * 32 + lane] * fb_hi;
    o[n][3] = o[n][3] * fa_hi + o_x[(n * 4 + 3) * 32 + lane] * fb_hi;
  }
}

// Keys per staged block: 64, or 32 for heads of 256 (the output fragments already take 128 registers);
// each of a column tile's KS warps takes its share of them.
template <int HD>
constexpr int kKeysOf = HD >= 256 ? 32 : 64;

// KS: warps per column tile, each on its part of every key block (1 or 2).
template <int HD, int KS>
__global__ void __launch_bounds__(32 * kColGroups * KS) flash_prefill_kernel(DeviceStep step, PrefillRun run, const float* q, float scale,
                                                                     KvLayer kv, int n_head, int n_head_kv, float* out, __half* out16) {
  constexpr int kRow = HD + kPad;  // halves per shared row
  constexpr int kKeys = kKeysOf<HD>;
  extern __shared__ __align__(16) __half smem[];
  __half* qs = smem;               // [kCols][kRow]
  __half* ks = qs + kCols * kRow;  // two buffers, each K [kKeys][kRow] then V [kKeys][kRow]
  const int gqa = n_head / n_head_kv;
  const int kvh = blockIdx.y;
  const int n_cols = run.n_rows * gqa;
  const int tile = gridDim.x - 1 - blockIdx.x;  // the longest tiles (most keys) first
  const int col0 = tile * kCols;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int cg = warp % kColGroups, part = warp / kColGroups;  // the warp's column tile and key part
  constexpr int kWarps = kColGroups * KS, kPartKeys = kKeys / KS;
  const int last_col = min(col0 + kCols, n_cols) - 1;
  const int pos_first = run.first_pos + col0 / gqa, pos_last = run.first_pos + last_col / gqa;
  const int key_begin = attention_first_key(pos_first, kv.window) / kKeys * kKeys, key_end = pos_last + 1;
  const int kv_dim = n_head_kv * HD;
  const __half* kcache = reinterpret_cast<const __half*>(kv.k) + (int64_t)kvh * HD;
  const __half* vcache = reinterpret_cast<const __half*>(kv.v) + (int64_t)kvh * HD;
  wait_for_previous_kernel();

  // The CTA's queries, scaled and converted to f16 (saturated), zero past the run's last column: column
  // c is query head kvh * gqa + c % gqa of the run's row c / gqa.
  constexpr int kChunks = HD / 8;  // 8-value pieces per row
  for (int i = threadIdx.x; i < kCols * kChunks; i += 32 * kWarps) {
    const int c = i / kChunks, p = i % kChunks;
    int4 v = make_int4(0, 0, 0, 0);
    if (col0 + c < n_cols) {
      const int col = col0 + c;
      const float4* src = reinterpret_cast<const float4*>(q + ((int64_t)(run.first_row + col / gqa) * n_head + kvh * gqa + col % gqa) * HD + p * 8);
      v = f16x8_saturated(src[0], src[1], scale);
    }
    *reinterpret_cast<int4*>(qs + c * kRow + p * 8) = v;
  }

  // This lane's two rows of the warp's m16 tile: columns r0 and r0 + 8.
  const int r_lo = col0 + cg * 16 + lane / 4, r_hi = r_lo + 8;
  const int pos_lo = run.first_pos + min(r_lo, n_cols - 1) / gqa, pos_hi = run.first_pos + min(r_hi, n_cols - 1) / gqa;
  const int first_lo = attention_first_key(pos_lo, kv.window), first_hi = attention_first_key(pos_hi, kv.window);
  constexpr float kLog2e = 1.4426950408889634f;
  float o[HD / 8][4];
#pragma unroll
  for (int n = 0; n < HD / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.0f, l_hi = 0.0f;

  // K and V of a block of keys into buffer `buf` (cp.async; keys past the CTA's last are zero, so that
  // their probability 0 never meets a NaN).
  auto stage = [&](int key0, int buf) {
    __half* kd = ks + buf * 2 * kKeys * kRow;
    __half* vd = kd + kKeys * kRow;
    stage_kv_block<HD, kPad>(kd, vd, kKeys, key0, key_end, kcache, vcache, kv_dim, 32 * kWarps,
                             [&](int pos) { return key_slot(step, run.seq, kv.block_size, pos); });
    copy_async_commit();
  };
  stage(key_begin, 0);
  for (int key0 = key_begin, buf = 0; key0 < key_end; key0 += kKeys, buf ^= 1) {
    // The next block loads while this one is multiplied (its buffer was last read before the barrier
    // that ended the previous iteration).
    if (key0 + kKeys < key_end) {
      stage(key0 + kKeys, buf ^ 1);
      copy_async_wait<1>();
    } else {
      copy_async_wait<0>();
    }
    __syncthreads();  // this block's K/V (and, the first time, the queries) are in
    const __half* ks_b = ks + buf * 2 * kKeys * kRow + part * kPartKeys * kRow;  // this warp's part of the block
    const __half* vs_b = ks_b + kKeys * kRow;

    // S = Q K^T for the warp's 16 columns and the block's keys.
    float s[kPartKeys / 8][4];
#pragma unroll
    for (int n = 0; n < kPartKeys / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
    const __half* qw = qs + (cg * 16 + lane / 4) * kRow + (lane % 4) * 2;
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
      uint32_t a[4];
      a[0] = *reinterpret_cast<const uint32_t*>(qw + kk * 16);
      a[1] = *reinterpret_cast<const uint32_t*>(qw + 8 * kRow + kk * 16);
      a[2] = *reinterpret_cast<const uint32_t*>(qw + kk * 16 + 8);
      a[3] = *reinterpret_cast<const uint32_t*>(qw + 8 * kRow + kk * 16 + 8);
#pragma unroll
      for (int n = 0; n < kPartKeys / 8; ++n) {
        const __half* kp = ks_b + (n * 8 + lane / 4) * kRow + kk * 16 + (lane % 4) * 2;
        mma_16816(s[n], a[0], a[1], a[2], a[3], *reinterpret_cast<const uint32_t*>(kp), *reinterpret_cast<const uint32_t*>(kp + 8));
      }
    }

    // Mask, then the online softmax update of both rows (base 2: exp(x) = exp2(x * log2 e)).
    float mx_lo = -INFINITY, mx_hi = -INFINITY;
#pragma unroll
    for (int n = 0; n < kPartKeys / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = key0 + part * kPartKeys + n * 8 + (lane % 4) * 2 + (e & 1);
        const bool hi = e >= 2;
        const bool ok = hi ? (key <= pos_hi && key >= first_hi) : (key <= pos_lo && key >= first_lo);
        s[n][e] = ok ? s[n][e] * kLog2e : -INFINITY;
        if (hi) mx_hi = fmaxf(mx_hi, s[n][e]);
        else mx_lo = fmaxf(mx_lo, s[n][e]);
      }
    float alpha_lo, alpha_hi;
    online_softmax_step(s, mx_lo, mx_hi, m_lo, m_hi, l_lo, l_hi, alpha_lo, alpha_hi);
#pragma unroll
    for (int n = 0; n < HD / 8; ++n) {
      o[n][0] *= alpha_lo;
      o[n][1] *= alpha_lo;
      o[n][2] *= alpha_hi;
      o[n][3] *= alpha_hi;
    }

    // O += P V: P's A fragments are the score accumulators of n-tiles 2t and 2t + 1.
#pragma unroll
    for (int t = 0; t < kPartKeys / 16; ++t) {
      uint32_t a[4];
      a[0] = pack_half2(s[2 * t][0], s[2 * t][1]);
      a[1] = pack_half2(s[2 * t][2], s[2 * t][3]);
      a[2] = pack_half2(s[2 * t + 1][0], s[2 * t + 1][1]);
      a[3] = pack_half2(s[2 * t + 1][2], s[2 * t + 1][3]);
      // Lanes 0-15 address keys 16t..16t+15 of n-tile n, lanes 16-31 the same keys of n-tile n + 1.
      const __half* vp = vs_b + (t * 16 + (lane & 15)) * kRow + (lane >> 4) * 8;
#pragma unroll
      for (int n = 0; n < HD / 8; n += 2) {
        uint32_t b[4];
        ldmatrix_x4<true>(b, vp + n * 8);  // two B fragments (n-tiles n, n + 1) of the [key][dim] tile
        mma_16816(o[n], a[0], a[1], a[2], a[3], b[0], b[1]);
        mma_16816(o[n + 1], a[0], a[1], a[2], a[3], b[2], b[3]);
      }
    }
    __syncthreads();  // every warp is done with this buffer before the next iteration refills it
  }

  // Row sums over the 4 lanes of each row; then the warps of a column tile merge their parts of the keys
  // (in the K/V buffers and the queries' space, free after the loop's last barrier): part 1 leaves its
  // maxima, sums and output fragments, part 0 rescales both to the common maxima and writes O / l.
#pragma unroll
  for (int off = 1; off <= 2; off <<= 1) {
    l_lo += __shfl_xor_sync(0xffffffffu, l_lo, off);
    l_hi += __shfl_xor_sync(0xffffffffu, l_hi, off);
  }
  static_assert(KS == 1 || KS == 2, "the merge below takes two parts");
  float* o_x = reinterpret_cast<float*>(ks) + (cg * (HD / 8) * 4) * 32;  // [n][e][lane] of the column tile
  float* ml_x = reinterpret_cast<float*>(qs) + cg * 4 * 32;            // m_lo, m_hi, l_lo, l_hi [lane]
  if (KS == 2 && part == 1) {
#pragma unroll
    for (int n = 0; n < HD / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) o_x[(n * 4 + e) * 32 + lane] = o[n][e];
    ml_x[lane] = m_lo, ml_x[32 + lane] = m_hi, ml_x[64 + lane] = l_lo, ml_x[96 + lane] = l_hi;
  }
  if (KS == 2) {
    __syncthreads();
    if (part == 1) return;
    merge_part<HD>(o, m_lo, m_hi, l_lo, l_hi, o_x, ml_x, lane);
  }
  const float inv_lo = l_lo > 0 ? 1.0f / l_lo : 0.0f, inv_hi = l_hi > 0 ? 1.0f / l_hi : 0.0f;
  auto at = [&](int col) { return ((int64_t)(run.first_row + col / gqa) * n_head + kvh * gqa + col % gqa) * HD + (lane % 4) * 2; };
  // out16: f16 pairs (saturated, as gemm converts the output product's input), else f32 pairs.
  auto store = [&](int64_t i, float a, float b) {
    if (out16) *reinterpret_cast<__half2*>(out16 + i) = __halves2half2(saturated_half(a), saturated_half(b));
    else *reinterpret_cast<float2*>(out + i) = make_float2(a, b);
  };
  if (r_lo < n_cols) {
    const int64_t i = at(r_lo);
#pragma unroll
    for (int n = 0; n < HD / 8; ++n) store(i + n * 8, o[n][0] * inv_lo, o[n][1] * inv_lo);
  }
  if (r_hi < n_cols) {
    const int64_t i = at(r_hi);
#pragma unroll
    for (int n = 0; n < HD / 8; ++n) store(i + n * 8, o[n][2] * inv_hi, o[n][3] * inv_hi);
  }
}

template <int HD, int KS>
void launch_flash(const DeviceStep& step, const PrefillRun& run, const float* q, float scale, const KvLayer& kv, int n_head,
                  int n_head_kv, float* out, __half* out16, cudaStream_t stream) {
  constexpr size_t smem = (size_t)(kCols + 4 * kKeysOf<HD>) * (HD + kPad) * sizeof(__half);
  static const bool configured = [] {
    ROOFLINE_CUDA_CHECK(cudaFuncSetAttribute(flash_prefill_kernel<HD, KS>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    return true;
  }();
  (void)configured;
  const int n_cols = run.n_rows * (n_head / n_head_kv);
  const dim3 grid((unsigned)((n_cols + kCols - 1) / kCols), (unsigned)n_head_kv);
  launch(flash_prefill_kernel<HD, KS>, grid, dim3(32 * kColGroups * KS), smem, stream, pdl_enabled(), step, run, q, scale, kv, n_head,
         n_head_kv, out, out16);
}

}  // namespace

bool flash_prefill_fits(DType type_k, DType type_v, int head_dim_k, int head_dim_v) {
  static const bool on = env_switch("ROOFLINE_FLASH_PREFILL", true);
  if (!on || code_arch() < 80 || type_k != DType::F16 || type_v != DType::F16 || head_dim_k != head_dim_v) return false;
  return head_dim_k == 64 || head_dim_k == 96 || head_dim_k == 128 || head_dim_k == 256;
}

bool flash_prefill_fits(const KvLayer& kv, int head_dim_k, int head_dim_v) {
  return flash_prefill_fits(kv.type_k, kv.type_v, head_dim_k, head_dim_v);
}

void flash_prefill_run(const DeviceStep& step, const PrefillRun& run, const float* q, float scale, const KvLayer& kv, int n_head,
                       int n_head_kv, int head_dim, float* out, cudaStream_t stream, __half* out16) {
  if (run.n_rows < 1) return;
  // Two warps per column tile unless ROOFLINE_FLASH_KEY_SPLIT=0.
  static const bool split = env_switch("ROOFLINE_FLASH_KEY_SPLIT", true);
  auto go = [&]<int HD>() {
    if (split) launch_flash<HD, 2>(step, run, q, scale, kv, n_head, n_head_kv, out, out16, stream);
    else launch_flash<HD, 1>(step, run, q, scale, kv, n_head, n_head_kv, out, out16, stream);
  };
  switch (head_dim) {
    case 64: return go.template operator()<64>();
    case 96: return go.template operator()<96>();
    case 128: return go.template operator()<128>();
    case 256: return go.template operator()<256>();
    default: fail("internal error: flash prefill attention with heads of {}", head_dim);
  }
}

}  // namespace roofline::cuda
