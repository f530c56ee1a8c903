// Attention on the paged KV cache: the per-row prologue (Q/K RMSNorm, RoPE, K/V store), a split-KV
// flash-decoding kernel, and prefill attention for runs of prompt rows (one tensor-core launch per run
// for f16 caches, cuda_flash_prefill.cu; otherwise cuBLAS over tiles of keys). Each decode CTA
// takes one row, one KV head (the group's query heads share every K/V read; at short depth two of them,
// attention_head_parts) and one span of keys (32-128 by the row's depth, or up to ROOFLINE_ATTN_MAX_SPAN),
// with an online softmax over tiles of 128 keys; the spans are merged by a second kernel in a fixed order, so results are
// deterministic; that kernel can also write the int8 form of the output that the attention output
// matrix reads.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "backend/cuda/cuda_dequant.cuh"
#include "backend/cuda/cuda_attention_splits.cuh"
#include "backend/cuda/cuda_kernels.cuh"

namespace roofline::cuda {

namespace {

constexpr int kThreads = 128;
constexpr int kTile = 128;    // keys per tile (one per thread)
constexpr int kMaxDims = 2;    // output dimensions per thread: head_dim_v <= 256
constexpr int kMaxGroup = 16;  // query heads per KV head
static_assert(kMaxGroup <= kMergeMaxGroup, "the split kernel's combine holds kMergeMaxGroup heads");
constexpr int kKeysInFlight = 8;  // value loads issued together in the value sums
constexpr int kHeadsPerPart = 2;  // query heads per CTA where a group is split (attention_head_parts)
// Steps whose rows have at most this many keys split the groups (AttentionPlan::split_heads). Each part
// reads its KV head's keys and values again (from the L2): on an H200, tg128 at depth 0-128 +2.5-3%
// (qwen3-8b, qwen3-32b), at depth 8192 -9 to -10%.
constexpr int kHeadSplitMaxKeys = 1024;

__device__ __forceinline__ int64_t slot_of(const DeviceStep& step, int r, int pos, int block_size) {
  const int seq = step.row_seq[r];
  return (int64_t)step.block_tables[(int64_t)seq * step.table_stride + pos / block_size] * block_size + pos % block_size;
}

// Element i of a KV plane as float.
__device__ __forceinline__ float kv_get(const uint8_t* vals, const uint8_t* scales, DType type, int64_t i) {
  switch (type) {
    case DType::F32: return reinterpret_cast<const float*>(vals)[i];
    case DType::F16: return ld_half(vals + 2 * i);
    case DType::BF16: return ld_bf16(vals + 2 * i);
    case DType::Q8_0: return ld_half(scales + 2 * (i / 32)) * (float)reinterpret_cast<const int8_t*>(vals)[i];
    default: {  // Q4_0: element j of a group in the low nibble of byte j (j < 16), high nibble of byte j-16
      const int64_t g = i / 32;
      const int j = (int)(i % 32);
      const uint8_t b = vals[g * 16 + (j % 16)];
      return ld_half(scales + 2 * g) * (float)((j < 16 ? (b & 0xF) : (b >> 4)) - 8);
    }
  }
}

// Stores kv_dim values of one position (float types elementwise; q8_0/q4_0 one thread per 32-group).
__device__ void kv_put_row(uint8_t* vals, uint8_t* scales, DType type, int64_t slot, int kv_dim, const float* src) {
  const int64_t base = slot * kv_dim;
  if (type == DType::F32 || type == DType::F16 || type == DType::BF16) {
    for (int i = threadIdx.x; i < kv_dim; i += blockDim.x) {
      if (type == DType::F32) reinterpret_cast<float*>(vals)[base + i] = src[i];
      else if (type == DType::F16) reinterpret_cast<__half*>(vals)[base + i] = __float2half(src[i]);
      else reinterpret_cast<__nv_bfloat16*>(vals)[base + i] = __float2bfloat16(src[i]);
    }
    return;
  }
  for (int g = threadIdx.x; g < kv_dim / 32; g += blockDim.x) {
    float amax = 0, vmax = 0;
    for (int k = 0; k < 32; ++k) {
      const float v = src[g * 32 + k];
      if (fabsf(v) > amax) {
        amax = fabsf(v);
        vmax = v;
      }
    }
    const int64_t gi = base / 32 + g;
    if (type == DType::Q8_0) {
      const float d = amax / 127.0f, inv = d > 0 ? 1.0f / d : 0.0f;
      reinterpret_cast<__half*>(scales)[gi] = __float2half(d);
      for (int k = 0; k < 32; ++k) reinterpret_cast<int8_t*>(vals)[base + g * 32 + k] = (int8_t)__float2int_rn(src[g * 32 + k] * inv);
    } else {  // Q4_0 as the reference quantizer: d = max / -8
      const float d = vmax / -8.0f, inv = d != 0 ? 1.0f / d : 0.0f;
      reinterpret_cast<__half*>(scales)[gi] = __float2half(d);
      for (int j = 0; j < 16; ++j) {
        const int q0 = min(15, (int)(src[g * 32 + j] * inv + 8.5f));
        const int q1 = min(15, (int)(src[g * 32 + j + 16] * inv + 8.5f));
        vals[gi * 16 + j] = (uint8_t)(q0 | (q1 << 4));
      }
    }
  }
}

// Stores one head's `hd` values (lane-strided in the warp) at element `base` of a KV plane; q8_0/q4_0
// need hd % 32 == 0 (whole groups; lane k holds element k of each group, as the reference quantizer).
__device__ void kv_put_head_warp(uint8_t* vals, uint8_t* scales, DType type, int64_t base, int hd, const float* src, int lane) {
  if (type == DType::F32 || type == DType::F16 || type == DType::BF16) {
    for (int i = lane; i < hd; i += 32) {
      if (type == DType::F32) reinterpret_cast<float*>(vals)[base + i] = src[i];
      else if (type == DType::F16) reinterpret_cast<__half*>(vals)[base + i] = __float2half(src[i]);
      else reinterpret_cast<__nv_bfloat16*>(vals)[base + i] = __float2bfloat16(src[i]);
    }
    return;
  }
  for (int g = 0; g < hd / 32; ++g) {
    const float v = src[g * 32 + lane];
    const float amax = warp_max(fabsf(v));
    const int64_t gi = (base + g * 32) / 32;
    if (type == DType::Q8_0) {
      const float d = amax / 127.0f, inv = d > 0 ? 1.0f / d : 0.0f;
      if (lane == 0) reinterpret_cast<__half*>(scales)[gi] = __float2half(d);
      reinterpret_cast<int8_t*>(vals)[base + g * 32 + lane] = (int8_t)__float2int_rn(v * inv);
    } else {  // Q4_0 as the reference quantizer: d = (first value of largest magnitude) / -8
      const unsigned first = __ffs(__ballot_sync(0xffffffffu, fabsf(v) == amax)) - 1;
      const float vmax = __shfl_sync(0xffffffffu, v, first);
      const float d = vmax / -8.0f, inv = d != 0 ? 1.0f / d : 0.0f;
      if (lane == 0) reinterpret_cast<__half*>(scales)[gi] = __float2half(d);
      const int q = min(15, (int)(v * inv + 8.5f));
      const int q_hi = __shfl_down_sync(0xffffffffu, q, 16);
      if (lane < 16) vals[gi * 16 + lane] = (uint8_t)(q | (q_hi << 4));
    }
  }
}

// The cos and sin of rotation pair i at position pos (double precision, for large positions).
__device__ __forceinline__ void rope_cos_sin(int pos, int i, int n_rot, const float* factors, float freq_base, float freq_scale, float& c,
                                             float& s) {
  double freq = (double)freq_scale * pow((double)freq_base, -2.0 * i / n_rot);
  if (factors) freq /= (double)factors[i];
  double sn, cd;
  sincos((double)pos * freq, &sn, &cd);
  c = (float)cd;
  s = (float)sn;
}

// Each row's rotation for a step's layers of one frequency base: table[r * n_rot + i] = cos, + n_rot/2 = sin.
__global__ void rope_table_kernel(DeviceStep step, const float* factors, int n_rot, float freq_base, float freq_scale, float* table) {
  const int r = blockIdx.x, half = n_rot / 2;
  const int pos = r < step.header[kStepRealRows] ? step.positions[r] : 0;
  wait_for_previous_kernel();
  for (int i = threadIdx.x; i < half; i += blockDim.x)
    rope_cos_sin(pos, i, n_rot, factors, freq_base, freq_scale, table[(int64_t)r * n_rot + i], table[(int64_t)r * n_rot + half + i]);
}

// Q/K RMSNorm, RoPE and the K/V store of one step. grid = (rows, groups of 8 heads): warp w of CTA y
// takes "head" 8y + w of [query heads | key heads | value heads]; key and value heads are stored into
// the paged cache by the warp that holds them (store_whole_rows: by the separate row kernel instead).
// table: the step's rotations from rope_table_kernel (read after the wait), else each CTA computes its row's.
__global__ void rope_store_kernel(DeviceStep step, float* q, float* k, const float* v, const float* q_norm, const float* k_norm,
                                  const float* factors, int n_head, int n_head_kv, int hd_k, int hd_v, int n_rot, bool neox,
                                  float freq_base, float freq_scale, float eps, KvLayer kv, bool store_whole_rows, const float* table) {
  extern __shared__ float row_cs[];  // cos then sin of this row's position, n_rot/2 each
  const int r = blockIdx.x;
  const bool live = r < step.header[kStepRealRows];
  const int pos = live ? step.positions[r] : 0;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int h = blockIdx.y * (blockDim.x / 32) + warp;
  const int half = n_rot / 2;
  const bool needs_rope = blockIdx.y * (blockDim.x / 32) < n_head + n_head_kv;
  // The rotation and the cache slot depend only on the step (written before its first kernel), not on
  // the previous kernel: computed before waiting for it.
  if (live && needs_rope && !table)
    for (int i = threadIdx.x; i < half; i += blockDim.x) rope_cos_sin(pos, i, n_rot, factors, freq_base, freq_scale, row_cs[i], row_cs[half + i]);
  const float* cs = table ? table + (int64_t)r * n_rot : row_cs;
  const int64_t slot = live && h < n_head + 2 * n_head_kv ? slot_of(step, r, pos, kv.block_size) : 0;
  // This warp's q or k norm weights (no kernel writes them): loaded before the wait, off the chain of the
  // head's sum of squares. Lane l holds element l + 32 j in nwv[j] (heads of up to 32 * kNormChunks).
  constexpr int kNormChunks = 8;
  const float* nw = h < n_head ? q_norm : h < n_head + n_head_kv ? k_norm : nullptr;
  float nwv[kNormChunks];
#pragma unroll
  for (int j = 0; j < kNormChunks; ++j) nwv[j] = live && nw && lane + 32 * j < hd_k ? nw[lane + 32 * j] : 0.0f;
  wait_for_previous_kernel();
  if (!live) return;
  if (needs_rope && !table) __syncthreads();
  if (h >= n_head + 2 * n_head_kv) return;
  if (h >= n_head + n_head_kv) {  // a value head: store only
    if (store_whole_rows) return;
    const int hv = h - n_head - n_head_kv;
    kv_put_head_warp(kv.v, kv.v_scales, kv.type_v, slot * (int64_t)(n_head_kv * hd_v) + (int64_t)hv * hd_v, hd_v,
                     v + ((int64_t)r * n_head_kv + hv) * hd_v, lane);
    return;
  }
  const bool is_q = h < n_head;
  float* x = is_q ? q + ((int64_t)r * n_head + h) * hd_k : k + ((int64_t)r * n_head_kv + (h - n_head)) * hd_k;
  if (nw) {
    float ss = 0;
    for (int i = lane; i < hd_k; i += 32) ss += x[i] * x[i];
    const float scale = rsqrtf(warp_sum(ss) / (float)hd_k + eps);
    if (hd_k <= 32 * kNormChunks) {
#pragma unroll
      for (int j = 0; j < kNormChunks; ++j)
        if (lane + 32 * j < hd_k) x[lane + 32 * j] = x[lane + 32 * j] * scale * nwv[j];
    } else {
      for (int i = lane; i < hd_k; i += 32) x[i] = x[i] * scale * nw[i];
    }
    __syncwarp();
  }
  for (int i = lane; i < half; i += 32) {
    const int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
    const float x0 = x[a], x1 = x[b];
    x[a] = x0 * cs[i] - x1 * cs[half + i];
    x[b] = x0 * cs[half + i] + x1 * cs[i];
  }
  __syncwarp();
  if (!is_q && !store_whole_rows) {
    const int hk = h - n_head;
    kv_put_head_warp(kv.k, kv.k_scales, kv.type_k, slot * (int64_t)(n_head_kv * hd_k) + (int64_t)hk * hd_k, hd_k, x, lane);
  }
}

// The K/V store one CTA per row, for quantized cache types whose head size is not whole 32-groups.
__global__ void kv_store_rows_kernel(DeviceStep step, const float* k, const float* v, int n_head_kv, int hd_k, int hd_v, KvLayer kv) {
  wait_for_previous_kernel();
  const int r = blockIdx.x;
  if (r >= step.header[kStepRealRows]) return;
  const int64_t slot = slot_of(step, r, step.positions[r], kv.block_size);
  kv_put_row(kv.k, kv.k_scales, kv.type_k, slot, n_head_kv * hd_k, k + (int64_t)r * n_head_kv * hd_k);
  kv_put_row(kv.v, kv.v_scales, kv.type_v, slot, n_head_kv * hd_v, v + (int64_t)r * n_head_kv * hd_v);
}

// Eight consecutive values (index i, a multiple of 8) of a KV plane of type T.
// T == DType::I8 marks the run-time-typed fallback (mixed K/V pairs without ROOFLINE_CUDA_ALL_KV_PAIRS).
constexpr DType kRuntimeType = DType::I8;

template <DType T>
__device__ __forceinline__ void kv_load8(const uint8_t* vals, const uint8_t* scales, int64_t i, float* out, DType rt) {
  if constexpr (T == kRuntimeType) {
#pragma unroll
    for (int k = 0; k < 8; ++k) out[k] = kv_get(vals, scales, rt, i + k);
  } else if constexpr (T == DType::F16) {
    const int4 raw = __ldg(reinterpret_cast<const int4*>(vals + 2 * i));
    const __half2* h = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float2 f = __half22float2(h[k]);
      out[2 * k] = f.x;
      out[2 * k + 1] = f.y;
    }
  } else if constexpr (T == DType::BF16) {
    const int4 raw = __ldg(reinterpret_cast<const int4*>(vals + 2 * i));
    const uint32_t u[4] = {(uint32_t)raw.x, (uint32_t)raw.y, (uint32_t)raw.z, (uint32_t)raw.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      out[2 * k] = __uint_as_float(u[k] << 16);
      out[2 * k + 1] = __uint_as_float(u[k] & 0xFFFF0000u);
    }
  } else if constexpr (T == DType::F32) {
    const float4 a = __ldg(reinterpret_cast<const float4*>(vals) + i / 4), b = __ldg(reinterpret_cast<const float4*>(vals) + i / 4 + 1);
    out[0] = a.x; out[1] = a.y; out[2] = a.z; out[3] = a.w; out[4] = b.x; out[5] = b.y; out[6] = b.z; out[7] = b.w;
  } else if constexpr (T == DType::Q8_0) {
    const int2 raw = __ldg(reinterpret_cast<const int2*>(vals + i));
    const int8_t* b = reinterpret_cast<const int8_t*>(&raw);
    const float d = ld_half(scales + 2 * (i / 32));
#pragma unroll
    for (int k = 0; k < 8; ++k) out[k] = d * (float)b[k];
  } else {  // Q4_0
    const int64_t g = i / 32;
    const int j = (int)(i % 32);
    const int2 raw = __ldg(reinterpret_cast<const int2*>(vals + g * 16 + (j % 16)));
    const uint8_t* b = reinterpret_cast<const uint8_t*>(&raw);
    const float d = ld_half(scales + 2 * g);
#pragma unroll
    for (int k = 0; k < 8; ++k) out[k] = d * (float)((j < 16 ? (b[k] & 0xF) : (b[k] >> 4)) - 8);
  }
}

template <DType T>
__device__ __forceinline__ float kv_load1(const uint8_t* vals, const uint8_t* scales, int64_t i, DType rt) {
  if constexpr (T == kRuntimeType) return kv_get(vals, scales, rt, i);
  else if constexpr (T == DType::F16) return __half2float(reinterpret_cast<const __half*>(vals)[i]);
  else if constexpr (T == DType::BF16) return ld_bf16(vals + 2 * i);
  else if constexpr (T == DType::F32) return reinterpret_cast<const float*>(vals)[i];
  else return kv_get(vals, scales, T, i);
}

// The key of a tile of n_tile keys that thread tid scores (tpk threads per key).
__device__ __forceinline__ int tile_threads_per_key(int n_tile, int hd_k) {
  return hd_k % 8 != 0 ? 1 : n_tile <= kTile / 4 ? 4 : n_tile <= kTile / 2 ? 2 : 1;
}
__device__ __forceinline__ int tile_key(int n_tile, int hd_k) { return min((int)threadIdx.x / tile_threads_per_key(n_tile, hd_k), n_tile - 1); }

// Scores of one tile of keys [t0, t0 + n_tile) of a split into p_s ([gqa x kTile]), their slots into
// slot_s, then the online-softmax update: p_s becomes the probabilities, m_s/l_s the running max and
// sum, a_s the factor by which each query head's earlier output must be rescaled. One key per thread,
// its K row read with 16-byte loads for all query heads of the group at once; a short tile gives each
// key several threads (tpk, adjacent lanes), each a share of the 8-value chunks, summed over the lanes in
// a fixed order. Threads past the tile repeat its last key (the shuffles need every lane) and store
// nothing. Ends with a barrier.
// first_slot >= 0: the cache slot of this thread's key (tile_key), found before the kernel's wait.
template <DType KT>
__device__ __forceinline__ void score_tile(const DeviceStep& step, const KvLayer& kv, int r, int kvh, int n_head_kv, int gqa, int hd_k,
                                           int t0, int n_tile, const float* q_s, float* p_s, float* m_s, float* l_s,
                                           float* a_s, int64_t* slot_s, int64_t first_slot = -1) {
  const int tid = threadIdx.x;
  const int kv_dim_k = n_head_kv * hd_k;
  const bool vec_k = hd_k % 8 == 0;
  const int tpk = tile_threads_per_key(n_tile, hd_k);
  const int key = tile_key(n_tile, hd_k), part = tid % tpk;
  const bool stores = tid / tpk < n_tile && part == 0;
  if (tid / tpk < n_tile || tpk > 1) {
    const int64_t slot = first_slot >= 0 ? first_slot : slot_of(step, r, t0 + key, kv.block_size);
    if (stores) slot_s[key] = slot;
    const int64_t base = slot * kv_dim_k + (int64_t)kvh * hd_k;
    for (int g0 = 0; g0 < gqa; g0 += 8) {
      const int ng = min(8, gqa - g0);
      float s[8] = {};
      if (vec_k) {
#pragma unroll 4
        for (int d = 8 * part; d < hd_k; d += 8 * tpk) {
          float kd[8];
          kv_load8<KT>(kv.k, kv.k_scales, base + d, kd, kv.type_k);
#pragma unroll
          for (int g = 0; g < 8; ++g)
            if (g < ng) {
              const float* qv = q_s + (g0 + g) * hd_k + d;
#pragma unroll
              for (int e = 0; e < 8; ++e) s[g] += qv[e] * kd[e];
            }
        }
      } else {
        for (int d = 0; d < hd_k; ++d) {
          const float kd = kv_load1<KT>(kv.k, kv.k_scales, base + d, kv.type_k);
#pragma unroll
          for (int g = 0; g < 8; ++g)
            if (g < ng) s[g] += q_s[(g0 + g) * hd_k + d] * kd;
        }
      }
      for (int off = 1; off < tpk; off <<= 1)
#pragma unroll
        for (int g = 0; g < 8; ++g) s[g] += __shfl_xor_sync(0xffffffffu, s[g], off);
      if (stores)
        for (int g = 0; g < ng; ++g) p_s[(g0 + g) * kTile + key] = s[g];
    }
  }
  __syncthreads();
  const int warp = tid / 32, lane = tid % 32;
  for (int g = warp; g < gqa; g += kThreads / 32) {
    float mx = -INFINITY;
    for (int i = lane; i < n_tile; i += 32) mx = fmaxf(mx, p_s[g * kTile + i]);
    mx = warp_max(mx);
    const float m_new = fmaxf(m_s[g], mx);
    float sum = 0;
    for (int i = lane; i < n_tile; i += 32) {
      const float p = __expf(p_s[g * kTile + i] - m_new);
      p_s[g * kTile + i] = p;
      sum += p;
    }
    sum = warp_sum(sum);
    if (lane == 0) {
      const float alpha = __expf(m_s[g] - m_new);
      a_s[g] = alpha;
      l_s[g] = l_s[g] * alpha + sum;
      m_s[g] = m_new;
    }
  }
  __syncthreads();
}

// Shared memory of the split kernels: m_s, l_s, a_s ([gqa] each, padded to 4 floats), then q_s
// ([gqa x hd_k], pre-scaled queries) and p_s ([gqa x kTile]); the vectorized kernel reuses the region
// after the padding for its cross-warp sums ([2 x gqa x hd_v]) once the keys are done.
__host__ __device__ inline int split_state_floats(int gqa) { return (3 * gqa + 3) & ~3; }
size_t split_smem_bytes(int gqa, int hd_k, int hd_v, bool vec) {
  const int tiles = gqa * (hd_k + kTile), sums = vec ? 2 * gqa * hd_v : 0;
  return (size_t)(split_state_floats(gqa) + (tiles > sums ? tiles : sums)) * sizeof(float);
}

// The split kernels' shared memory (split_smem_bytes): the online-softmax state reset, and the group's
// queries loaded pre-scaled. The caller synchronizes before reading it.
struct SplitSmem {
  float *m, *l, *a, *q, *p;  // running max, sum, rescale factors [gqa]; queries [gqa x hd_k]; scores [gqa x kTile]
};
__device__ __forceinline__ SplitSmem split_smem_init(float* smem, const float* q, int r, int head0, int n_head, int gqa, int hd_k,
                                                     float scale) {
  SplitSmem sm;
  sm.m = smem;
  sm.l = sm.m + gqa;
  sm.a = sm.l + gqa;
  sm.q = smem + split_state_floats(gqa);
  sm.p = sm.q + gqa * hd_k;
  for (int i = threadIdx.x; i < gqa * hd_k; i += kThreads) sm.q[i] = q[((int64_t)r * n_head + head0) * hd_k + i] * scale;
  for (int g = threadIdx.x; g < gqa; g += kThreads) {
    sm.m[g] = -INFINITY;
    sm.l[g] = 0.0f;
  }
  return sm;
}

// Both split kernels' start: the CTA's work and its first key slot from the step alone, then the wait for
// the kernel before; false when the CTA has no keys (a padding row's first split writes its zeros when
// the kernel combines, C).
template <bool C>
__device__ __forceinline__ bool split_start(const DeviceStep& step, const int* row_list, const KvLayer& kv, int n_head, int n_head_kv,
                                            int hd_k, int hd_v, const SplitCombine& fuse, SplitWork& work, int64_t& first_slot,
                                            int head_parts = 1) {
  const bool has_work = split_work(step, row_list, kv.window, work, head_parts);  // the step only: before the wait
  first_slot = has_work ? slot_of(step, work.r, work.k_begin + tile_key(min(kTile, work.k_end - work.k_begin), hd_k), kv.block_size) : -1;
  wait_for_previous_kernel();
  if (!has_work) {
    if constexpr (C)
      if (work.dead_row && blockIdx.z == 0) zero_group(fuse, work, n_head, n_head / n_head_kv, hd_v);
  }
  return has_work;
}

// Split-KV attention for one (row, KV head, span of keys), any head size: scores by score_tile, values
// one output dimension per thread (two when head_dim_v > 128), each V element loaded once for every
// query head of the group. The fallback of attention_split_vec_kernel (head sizes it does not take).
template <DType KT, DType VT, bool C>
__global__ void __launch_bounds__(kThreads) attention_split_kernel(DeviceStep step, const float* q, KvLayer kv, int n_head,
                                                                  int n_head_kv, int hd_k, int hd_v, float scale,
                                                                  int max_splits, float* partial, const int* row_list,
                                                                  SplitCombine fuse, int /*head_parts: always 1 here*/) {
  extern __shared__ float smem[];
  __shared__ int64_t slot_s[kTile];
  SplitWork work;
  int64_t first_slot = -1;
  if (!split_start<C>(step, row_list, kv, n_head, n_head_kv, hd_k, hd_v, fuse, work, first_slot)) return;
  const int r = work.r, kvh = work.kvh, split = work.split, k_begin = work.k_begin, k_end = work.k_end;
  const int gqa = n_head / n_head_kv;
  const SplitSmem sm = split_smem_init(smem, q, r, kvh * gqa, n_head, gqa, hd_k, scale);
  float *m_s = sm.m, *l_s = sm.l, *a_s = sm.a, *q_s = sm.q, *p_s = sm.p;
  const int tid = threadIdx.x;
  // Accumulators acc[dd][g]: output dimension tid + dd * kThreads of query head g of the group. Every
  // index is a compile-time constant (unrolled loops, predicated on the real sizes), so they stay in
  // registers.
  float acc[kMaxDims][kMaxGroup];
#pragma unroll
  for (int dd = 0; dd < kMaxDims; ++dd)
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) acc[dd][g] = 0.0f;
  const int kv_dim_v = n_head_kv * hd_v;
  __syncthreads();

  for (int t0 = k_begin; t0 < k_end; t0 += kTile) {
    const int n_tile = min(kTile, k_end - t0);
    score_tile<KT>(step, kv, r, kvh, n_head_kv, gqa, hd_k, t0, n_tile, q_s, p_s, m_s, l_s, a_s, slot_s,
                   t0 == k_begin ? first_slot : -1);
#pragma unroll
    for (int dd = 0; dd < kMaxDims; ++dd) {
      const int d = tid + dd * kThreads;
      if (d < hd_v) {
#pragma unroll
        for (int g = 0; g < kMaxGroup; ++g)
          if (g < gqa) acc[dd][g] *= a_s[g];
        const int64_t col = (int64_t)kvh * hd_v + d;
        // Eight keys' loads in flight before their sums (keys in order, as one at a time would add them).
        int j = 0;
        for (; j + kKeysInFlight <= n_tile; j += kKeysInFlight) {
          float vj[kKeysInFlight];
#pragma unroll
          for (int u = 0; u < kKeysInFlight; ++u) vj[u] = kv_load1<VT>(kv.v, kv.v_scales, slot_s[j + u] * kv_dim_v + col, kv.type_v);
#pragma unroll
          for (int u = 0; u < kKeysInFlight; ++u)
#pragma unroll
            for (int g = 0; g < kMaxGroup; ++g)
              if (g < gqa) acc[dd][g] += p_s[g * kTile + j + u] * vj[u];
        }
        for (; j < n_tile; ++j) {
          const float vj = kv_load1<VT>(kv.v, kv.v_scales, slot_s[j] * kv_dim_v + col, kv.type_v);
#pragma unroll
          for (int g = 0; g < kMaxGroup; ++g)
            if (g < gqa) acc[dd][g] += p_s[g * kTile + j] * vj;
        }
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int dd = 0; dd < kMaxDims; ++dd) {
    const int d = tid + dd * kThreads;
    if (d < hd_v) {
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g) {
        if (g >= gqa) break;
        const int64_t idx = (((int64_t)r * n_head + kvh * gqa + g) * max_splits + split);
        partial[idx * (hd_v + 2) + 2 + d] = acc[dd][g];
        if (d == 0) {
          partial[idx * (hd_v + 2)] = m_s[g];
          partial[idx * (hd_v + 2) + 1] = l_s[g];
        }
      }
    }
  }
  if constexpr (C) combine_if_last(fuse, partial, work, n_head, n_head_kv, gqa, hd_v, max_splits, smem + split_state_floats(gqa));
}

// Whether attention_split_vec_kernel takes value heads of this size: rows of 8-value chunks whose
// thread count (hd_v / 8) divides a warp, so each warp holds whole key lanes.
__host__ __device__ inline bool vec_values_fit(int hd_v) { return hd_v % 8 == 0 && hd_v / 8 <= 32 && 32 % (hd_v / 8) == 0; }

// Split-KV attention with the value sums laid out for bandwidth: each thread owns one 8-value chunk of
// the value head (a 16-byte load for f16) for every query head of the group (G >= gqa accumulators
// each), and the CTA's threads cover kThreads / (hd_v / 8) keys at once, each thread four of its keys'
// loads in flight. At the end the key lanes' sums are added in a fixed order (within the warp by
// shuffles, then across warps through shared memory), so results stay deterministic and do not depend
// on the row's batch-mates. Scores as attention_split_kernel (score_tile).
template <DType KT, DType VT, int G, bool C>
__global__ void __launch_bounds__(kThreads) attention_split_vec_kernel(DeviceStep step, const float* q, KvLayer kv,
                                                                      int n_head, int n_head_kv, int hd_k, int hd_v,
                                                                      float scale, int max_splits, float* partial,
                                                                      const int* row_list, SplitCombine fuse, int head_parts) {
  extern __shared__ float smem[];
  __shared__ int64_t slot_s[kTile];
  SplitWork work;
  int64_t first_slot = -1;
  if (!split_start<C>(step, row_list, kv, n_head, n_head_kv, hd_k, hd_v, fuse, work, first_slot, head_parts)) return;
  const int r = work.r, kvh = work.kvh, split = work.split, k_begin = work.k_begin, k_end = work.k_end;
  // This CTA's query heads: part (blockIdx.y % head_parts) of the KV head's group, gqa of them from head0.
  const int gqa = n_head / n_head_kv / head_parts;
  const int head0 = kvh * (n_head / n_head_kv) + (int)(blockIdx.y % head_parts) * gqa;
  const SplitSmem sm = split_smem_init(smem, q, r, head0, n_head, gqa, hd_k, scale);
  float *m_s = sm.m, *l_s = sm.l, *a_s = sm.a, *q_s = sm.q, *p_s = sm.p;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int cols = hd_v / 8;                            // threads per value row
  const int chunk = tid % cols, key_lane = tid / cols;  // dims 8*chunk.., keys key_lane + k*lanes
  const int lanes = kThreads / cols;
  float acc[8][G];
#pragma unroll
  for (int e = 0; e < 8; ++e)
#pragma unroll
    for (int g = 0; g < G; ++g) acc[e][g] = 0.0f;
  const int kv_dim_v = n_head_kv * hd_v;
  const int64_t col = (int64_t)kvh * hd_v + 8 * chunk;
  __syncthreads();

  for (int t0 = k_begin; t0 < k_end; t0 += kTile) {
    const int n_tile = min(kTile, k_end - t0);
    score_tile<KT>(step, kv, r, kvh, n_head_kv, gqa, hd_k, t0, n_tile, q_s, p_s, m_s, l_s, a_s, slot_s,
                   t0 == k_begin ? first_slot : -1);
#pragma unroll
    for (int g = 0; g < G; ++g)
      if (g < gqa) {
        const float a = a_s[g];
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[e][g] *= a;
      }
    constexpr int kInFlight = 4;
    int j = key_lane;
    for (; j + (kInFlight - 1) * lanes < n_tile; j += kInFlight * lanes) {
      float v[kInFlight][8];
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) kv_load8<VT>(kv.v, kv.v_scales, slot_s[j + u * lanes] * kv_dim_v + col, v[u], kv.type_v);
#pragma unroll
      for (int u = 0; u < kInFlight; ++u)
#pragma unroll
        for (int g = 0; g < G; ++g)
          if (g < gqa) {
            const float p = p_s[g * kTile + j + u * lanes];
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[e][g] += p * v[u][e];
          }
    }
    for (; j < n_tile; j += lanes) {
      float v[8];
      kv_load8<VT>(kv.v, kv.v_scales, slot_s[j] * kv_dim_v + col, v, kv.type_v);
#pragma unroll
      for (int g = 0; g < G; ++g)
        if (g < gqa) {
          const float p = p_s[g * kTile + j];
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[e][g] += p * v[e];
        }
    }
    __syncthreads();
  }
  // Key lanes of one warp (lanes cols apart), then the warps' sums, pairwise down to warp 0.
  for (int off = cols; off < 32; off <<= 1)
#pragma unroll
    for (int e = 0; e < 8; ++e)
#pragma unroll
      for (int g = 0; g < G; ++g) acc[e][g] += __shfl_xor_sync(0xffffffffu, acc[e][g], off);
  float* sums = smem + split_state_floats(gqa);  // [2 x gqa x hd_v]; q_s and p_s are no longer read
  for (int half = kThreads / 64; half >= 1; half /= 2) {
    if (warp >= half && warp < 2 * half && lane < cols)
#pragma unroll
      for (int g = 0; g < G; ++g)
        if (g < gqa)
#pragma unroll
          for (int e = 0; e < 8; ++e) sums[((warp - half) * gqa + g) * hd_v + 8 * chunk + e] = acc[e][g];
    __syncthreads();
    if (warp < half && lane < cols)
#pragma unroll
      for (int g = 0; g < G; ++g)
        if (g < gqa)
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[e][g] += sums[(warp * gqa + g) * hd_v + 8 * chunk + e];
    __syncthreads();
  }
  if (warp == 0 && lane < cols) {
#pragma unroll
    for (int g = 0; g < G; ++g)
      if (g < gqa) {
        const int64_t idx = (((int64_t)r * n_head + head0 + g) * max_splits + split);
        float* out = partial + idx * (hd_v + 2);
#pragma unroll
        for (int e = 0; e < 8; ++e) out[2 + 8 * chunk + e] = acc[e][g];
        if (chunk == 0) {
          out[0] = m_s[g];
          out[1] = l_s[g];
        }
      }
  }
  if constexpr (C) combine_if_last(fuse, partial, work, n_head, n_head_kv, gqa, hd_v, max_splits, smem + split_state_floats(gqa));
}

using AttentionKernel = void (*)(DeviceStep, const float*, KvLayer, int, int, int, int, float, int, float*, const int*, SplitCombine, int);

// G: the accumulators per value chunk, the group size rounded up to 8 or 16.
template <DType KT, int G, bool C>
AttentionKernel pick_v(DType vt) {
  switch (vt) {
    case DType::F32: return attention_split_vec_kernel<KT, DType::F32, G, C>;
    case DType::F16: return attention_split_vec_kernel<KT, DType::F16, G, C>;
    case DType::BF16: return attention_split_vec_kernel<KT, DType::BF16, G, C>;
    case DType::Q8_0: return attention_split_vec_kernel<KT, DType::Q8_0, G, C>;
    default: return attention_split_vec_kernel<KT, DType::Q4_0, G, C>;
  }
}

template <int G, bool C>
AttentionKernel pick_vec(DType kt, DType vt) {
#ifdef ROOFLINE_CUDA_ALL_KV_PAIRS
  switch (kt) {
    case DType::F32: return pick_v<DType::F32, G, C>(vt);
    case DType::F16: return pick_v<DType::F16, G, C>(vt);
    case DType::BF16: return pick_v<DType::BF16, G, C>(vt);
    case DType::Q8_0: return pick_v<DType::Q8_0, G, C>(vt);
    default: return pick_v<DType::Q4_0, G, C>(vt);
  }
#else
  if (kt == vt) {
    switch (kt) {
      case DType::F32: return attention_split_vec_kernel<DType::F32, DType::F32, G, C>;
      case DType::F16: return attention_split_vec_kernel<DType::F16, DType::F16, G, C>;
      case DType::BF16: return attention_split_vec_kernel<DType::BF16, DType::BF16, G, C>;
      case DType::Q8_0: return attention_split_vec_kernel<DType::Q8_0, DType::Q8_0, G, C>;
      default: return attention_split_vec_kernel<DType::Q4_0, DType::Q4_0, G, C>;
    }
  }
  return attention_split_vec_kernel<kRuntimeType, kRuntimeType, G, C>;
#endif
}

// Equal K and V types get kernels compiled for them; mixed pairs run the run-time-typed kernel unless
// the build sets ROOFLINE_CUDA_ALL_KV_PAIRS (every pair compiled: slower builds, faster mixed caches).
// Value heads the vectorized kernel does not take run the run-time-typed per-dimension kernel. C: the
// kernels that merge their splits themselves (SplitCombine), compiled apart so that the others keep their
// registers.
// heads: the query heads one CTA takes (the group, or kHeadsPerPart when the group is split).
template <bool C>
AttentionKernel pick_attention(DType kt, DType vt, int heads, int hd_v) {
  if (!vec_values_fit(hd_v)) return attention_split_kernel<kRuntimeType, kRuntimeType, C>;
  if constexpr (!C)
    if (heads <= kHeadsPerPart) return pick_vec<kHeadsPerPart, C>(kt, vt);
  return heads <= 8 ? pick_vec<8, C>(kt, vt) : pick_vec<16, C>(kt, vt);
}

// How many CTAs share one KV head's query heads in the split kernel (kHeadsPerPart each). A decode CTA is
// one warp per scheduler running a long dependent chain: with all 8 query heads of a group, ~1650
// instructions per warp at ~10 cycles each, 11-14 us at short depth whatever its keys (H200, ncu; spans of
// 16 keys instead of 32 changed nothing). Parts of two heads cut the chain and quadruple the CTAs of such a
// group; each part reads the KV head's keys and values (from the L2 after the first). Not with the split
// kernel's own combine (it merges the whole group), nor for groups of one or two heads, nor with
// ROOFLINE_ATTN_HEAD_SPLIT=0.
int attention_head_parts(int gqa, int hd_v, bool combine_in_split) {
  static const bool enabled = env_switch("ROOFLINE_ATTN_HEAD_SPLIT", true);
  if (!enabled || combine_in_split || !vec_values_fit(hd_v) || gqa <= kHeadsPerPart || gqa % kHeadsPerPart != 0) return 1;
  return gqa / kHeadsPerPart;
}

// --- Prefill attention for runs of consecutive rows of one sequence (prefill_attention) ---
// Query rows as f16, pre-scaled, laid out [KV head][row][query head of the group][dim] so that each KV
// head's queries of a run of rows form one matrix. Eight values a thread (16-byte stores; one a thread
// took 2.2% of a qwen3-32b pp512 step); head dims are multiples of 8 wherever prompt runs are planned
// (every supported architecture), the scalar tail covers the rest.
__global__ void queries_f16_kernel(const float* q, int n_rows, int n_head, int n_head_kv, int hd, float scale, __half* out) {
  wait_for_previous_kernel();
  const int64_t i = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;  // index in q: (row, head, dim)
  if (i >= (int64_t)n_rows * n_head * hd) return;
  const int gqa = n_head / n_head_kv;
  auto dst = [&](int64_t e) {
    const int d = (int)(e % hd), h = (int)(e / hd % n_head);
    const int64_t r = e / ((int64_t)hd * n_head);
    return (((int64_t)(h / gqa) * n_rows + r) * gqa + h % gqa) * hd + d;
  };
  if (hd % 8 == 0) {
    *reinterpret_cast<int4*>(out + dst(i)) = f16x8_saturated(reinterpret_cast<const float4*>(q + i)[0], reinterpret_cast<const float4*>(q + i)[1], scale);
  } else {
    for (int64_t e = i; e < i + 8 && e < (int64_t)n_rows * n_head * hd; ++e) out[dst(e)] = saturated_half(q[e] * scale);
  }
}

// Keys [key0, key0 + n_keys) of sequence `seq` from the paged cache to f16 rows [n_keys x kv_dim].
__global__ void gather_kv_f16_kernel(DeviceStep step, KvLayer kv, int seq, int key0, int kv_dim_k, int kv_dim_v, __half* k_out,
                                     __half* v_out) {
  wait_for_previous_kernel();
  const int j = blockIdx.x;
  const int pos = key0 + j;
  const int64_t slot = (int64_t)step.block_tables[(int64_t)seq * step.table_stride + pos / kv.block_size] * kv.block_size +
                       pos % kv.block_size;
  for (int e = threadIdx.x; e < kv_dim_k; e += blockDim.x)
    k_out[(int64_t)j * kv_dim_k + e] = __float2half(kv_get(kv.k, kv.k_scales, kv.type_k, slot * kv_dim_k + e));
  for (int e = threadIdx.x; e < kv_dim_v; e += blockDim.x)
    v_out[(int64_t)j * kv_dim_v + e] = __float2half(kv_get(kv.v, kv.v_scales, kv.type_v, slot * kv_dim_v + e));
}

constexpr int kSoftmaxThreads = 256;
constexpr int kMaxKeyTile = 1024;
constexpr int kSoftmaxPerThread = kMaxKeyTile / kSoftmaxThreads;

// One score row (a query head of one row, against one tile of n_keys keys starting at key0) per CTA:
// online-softmax update of its running max m and sum l, the probabilities written as f16 over the
// row's own f32 scores (all read first), and the row's output accumulated so far rescaled to the new
// max (on every tile but the first, which the P.V product then overwrites). Keys past the row's
// position get probability 0. Rows are (row i of the chunk, query head g): column i * gqa + g.
__global__ void prefill_softmax_kernel(float* scores, int ld, int n_keys, int key0, int first_pos, int gqa, int n_cols,
                                       float* m_state, float* l_state, float* o_acc, int hd_v, bool first, int window) {
  wait_for_previous_kernel();
  __shared__ float red[kSoftmaxThreads / 32];
  const int c = blockIdx.x, kvh = blockIdx.y;
  const int64_t col = (int64_t)kvh * n_cols + c;
  float* row = scores + col * ld;
  const int pos = first_pos + c / gqa;
  const int n_valid = max(0, min(n_keys, pos - key0 + 1));
  const int j_first = attention_first_key(pos, window) - key0;  // sliding layers: keys before the window are masked
  float v[kSoftmaxPerThread];
  float mx = -INFINITY;
#pragma unroll
  for (int k = 0; k < kSoftmaxPerThread; ++k) {
    const int j = threadIdx.x + k * kSoftmaxThreads;
    v[k] = j < n_valid && j >= j_first ? row[j] : -INFINITY;
    mx = fmaxf(mx, v[k]);
  }
  mx = block_reduce(mx, true, red);
  const float m_old = first ? -INFINITY : m_state[col];
  // Without a window the first tile holds key 0, so m_new is finite; a sliding row may see no key of a
  // tile yet (m_new = -inf): its probabilities and sums stay 0 until a tile holds its window.
  const float m_new = fmaxf(m_old, mx);
  float sum = 0;
#pragma unroll
  for (int k = 0; k < kSoftmaxPerThread; ++k) {
    v[k] = m_new == -INFINITY ? 0.0f : __expf(v[k] - m_new);  // exp(-inf) = 0 for masked keys
    sum += v[k];
  }
  sum = block_reduce(sum, false, red);  // also: every thread has read its scores
  __half* p = reinterpret_cast<__half*>(row);
#pragma unroll
  for (int k = 0; k < kSoftmaxPerThread; ++k) {
    const int j = threadIdx.x + k * kSoftmaxThreads;
    if (j < n_keys) p[j] = __float2half(v[k]);
  }
  const float alpha = first || m_old == -INFINITY ? 0.0f : __expf(m_old - m_new);
  if (!first)
    for (int d = threadIdx.x; d < hd_v; d += blockDim.x) o_acc[col * hd_v + d] *= alpha;
  if (threadIdx.x == 0) {
    m_state[col] = m_new;
    l_state[col] = first ? sum : l_state[col] * alpha + sum;
  }
}

// out[row][h][:] = o_acc / l for the chunk's rows (o_acc and l in the [KV head][column] order).
__global__ void prefill_finalize_kernel(const float* o_acc, const float* l_state, int gqa, int n_cols, int hd_v, int n_head,
                                        float* out) {
  wait_for_previous_kernel();
  const int c = blockIdx.x, kvh = blockIdx.y;
  const int64_t col = (int64_t)kvh * n_cols + c;
  const float inv = 1.0f / l_state[col];
  float* dst = out + ((int64_t)(c / gqa) * n_head + kvh * gqa + c % gqa) * hd_v;
  for (int d = threadIdx.x; d < hd_v; d += blockDim.x) dst[d] = o_acc[col * hd_v + d] * inv;
}

void check_cublas(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS) fail("cuBLAS {} failed with status {}", what, (int)st);
}

}  // namespace

int prefill_key_tile() {
  const char* env = std::getenv("ROOFLINE_ATTN_KEY_TILE");
  const int v = env ? std::atoi(env) : kMaxKeyTile;
  return std::max(32, std::min(kMaxKeyTile, v / 32 * 32));
}

bool prefill_attention(cublasHandle_t cublas, const DeviceStep& step, const std::vector<PrefillRun>& runs, const float* q,
                       int n_rows, const KvLayer& kv, int n_head, int n_head_kv, int head_dim_k, int head_dim_v, float scale,
                       const PrefillScratch& scratch, float* out, cudaStream_t stream, __half* out16) {
  if (runs.empty()) return false;
  const int gqa = n_head / n_head_kv;
  const int kv_dim_k = n_head_kv * head_dim_k, kv_dim_v = n_head_kv * head_dim_v;
  if (flash_prefill_fits(kv, head_dim_k, head_dim_v)) {  // (converts its own queries)
    for (const PrefillRun& run : runs) flash_prefill_run(step, run, q, scale, kv, n_head, n_head_kv, head_dim_k, out, stream, out16);
    return out16 != nullptr;
  }
  const int64_t n_q = (int64_t)n_rows * n_head * head_dim_k;
  launch(queries_f16_kernel, dim3((unsigned)((n_q + 8 * 256 - 1) / (8 * 256))), dim3(256), 0, stream, pdl_enabled(), q, n_rows, n_head,
         n_head_kv, head_dim_k, scale, scratch.q16);
  __half* k16 = scratch.kv16;
  __half* v16 = scratch.kv16 + (size_t)scratch.key_tile * kv_dim_k;
  for (const PrefillRun& run : runs) {
    const int total_keys = run.first_pos + run.n_rows;
    const int key_tile = std::min(scratch.key_tile, (total_keys + 31) / 32 * 32);
    const int ld = key_tile;  // floats per score row
    const int chunk = (int)std::min<int64_t>(run.n_rows, (int64_t)(scratch.score_floats / ((size_t)n_head * ld)));
    if (chunk < 1) fail("internal error: the attention score scratch holds no row of {} keys", key_tile);
    for (int c0 = 0; c0 < run.n_rows; c0 += chunk) {
      const int rc = std::min(chunk, run.n_rows - c0);
      const int n_cols = rc * gqa;
      const int row0 = run.first_row + c0, pos0 = run.first_pos + c0;
      const int chunk_keys = pos0 + rc;  // keys the chunk's last row sees
      const int key_start = attention_first_key(pos0, kv.window);  // the first key the chunk's first row sees
      for (int key0 = key_start; key0 < chunk_keys; key0 += key_tile) {
        const int nk = std::min(key_tile, chunk_keys - key0);
        const bool first = key0 == key_start;
        launch(gather_kv_f16_kernel, dim3(nk), dim3(128), 0, stream, pdl_enabled(), step, kv, run.seq, key0, kv_dim_k, kv_dim_v,
               k16, v16);
        // Scores of every KV head's group: S[kvh][col][key] = K[key] . Q[kvh][row0 + col / gqa][col % gqa].
        const float one = 1.0f, zero = 0.0f;
        check_cublas(cublasGemmStridedBatchedEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, nk, n_cols, head_dim_k, &one, k16, CUDA_R_16F,
                                                kv_dim_k, head_dim_k, scratch.q16 + (int64_t)row0 * gqa * head_dim_k, CUDA_R_16F,
                                                head_dim_k, (int64_t)n_rows * gqa * head_dim_k, &zero, scratch.scores, CUDA_R_32F,
                                                ld, (int64_t)n_cols * ld, n_head_kv, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                     "attention scores");
        launch(prefill_softmax_kernel, dim3(n_cols, n_head_kv), dim3(kSoftmaxThreads), 0, stream, pdl_enabled(), scratch.scores,
               ld, nk, key0, pos0, gqa, n_cols, scratch.m_state, scratch.l_state, scratch.o_acc, head_dim_v, first, kv.window);
        // O[kvh][col][:] (+)= P[kvh][col][:] . V: P is f16 over the scores' rows (2 * ld halves apart).
        const float beta = first ? 0.0f : 1.0f;
        check_cublas(cublasGemmStridedBatchedEx(cublas, CUBLAS_OP_N, CUBLAS_OP_N, head_dim_v, n_cols, nk, &one, v16, CUDA_R_16F,
                                                kv_dim_v, head_dim_v, reinterpret_cast<const __half*>(scratch.scores), CUDA_R_16F,
                                                2 * ld, (int64_t)n_cols * ld * 2, &beta, scratch.o_acc, CUDA_R_32F, head_dim_v,
                                                (int64_t)n_cols * head_dim_v, n_head_kv, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                     "attention values");
      }
      launch(prefill_finalize_kernel, dim3(n_cols, n_head_kv), dim3(128), 0, stream, pdl_enabled(), scratch.o_acc,
             scratch.l_state, gqa, n_cols, head_dim_v, n_head, out + (int64_t)row0 * n_head * head_dim_v);
    }
  }
  return false;
}

AttentionPlan plan_attention(const StepDesc& step, int max_splits, const AttentionSpans& spans, int prefill_min_keys, int bucket_rows) {
  // Decode-sized steps (the bucketed ones, up to 8 rows): each row takes the span attention_span gives
  // its depth, so a row's result does not depend on its batch-mates. Larger steps take spans of at
  // least 128 keys from 33 rows on (enough CTAs without the short spans: measured on an H200,
  // qwen3-32b -npl 64 1636 -> 1666 tok/s, while -npl 16 needs the short ones, 844 vs 755), and widen
  // them when the partial buffer (8 rows x max_splits) cannot hold every row's splits. A batched step run
  // as its bucket (bucket_rows > 8) is planned for the bucket's rows, with a power of two splits where they fit,
  // so that the grid changes at a few depths (one captured graph each) instead of every 32 or 128 keys.
  AttentionPlan plan;
  const int n = bucket_rows > 8 ? bucket_rows : step.n_tokens();
  int max_keys = 1;
  for (int p : step.positions) max_keys = std::max(max_keys, p + 1);
  AttentionSpans row_spans = spans;
  plan.splits = max_splits;
  plan.split_heads = max_keys <= kHeadSplitMaxKeys;
  if (n > 8) {
    if (n > 32) row_spans.min_span = kAttnLongSpan;
    int need = 1;
    for (int p : step.positions) need = std::max(need, attention_splits(p + 1, row_spans));
    int grid = need;  // a bucket's: the power of two at or above need (else the fixed length below, not need)
    if (bucket_rows > 8)
      for (grid = 1; grid < need;) grid *= 2;
    if ((int64_t)n * grid <= 8 * (int64_t)max_splits) {
      plan.splits = grid;
    } else {
      plan.splits = std::max(1, std::min(max_splits, 8 * max_splits / n));
      const int per = (max_keys + plan.splits - 1) / plan.splits;
      plan.split_len = std::max(128, (per + 127) / 128 * 128);
    }
  }
  plan.min_span = row_spans.min_span;
  plan.grid_splits = plan.splits;
  if (n <= 8) {
    int need = 1;
    for (int p : step.positions) need = std::max(need, attention_splits(p + 1, row_spans));
    while (plan.grid_splits / 2 >= need) plan.grid_splits /= 2;
  }
  // Runs of at least kMinPrefillRun consecutive rows of one sequence that reach prefill_min_keys keys go
  // through prefill_attention. With the cuBLAS tiles (five launches per run) short prompts are as fast in
  // the split kernel's single pass (on an H200, 16 prompts of 128 tokens in one step took 480 ms against
  // 400); the flash kernel takes every run (qwen3-32b: four 128-token prompts in a step of 512 rows 6587
  // -> 8021 tok/s, pp128 4719 -> 5712).
  const int n_real = step.n_tokens();
  if (n > 8 && prefill_min_keys > 0) {
    for (int i = 0; i < n_real;) {
      int j = i + 1;
      while (j < n_real && step.row_seq[j] == step.row_seq[i] && step.positions[j] == step.positions[j - 1] + 1) ++j;
      if (j - i >= kMinPrefillRun && step.positions[j - 1] + 1 >= prefill_min_keys) {
        plan.runs.push_back({i, j - i, step.row_seq[i], step.positions[i]});
      } else {
        for (int r = i; r < j; ++r) plan.split_rows.push_back(r);
      }
      i = j;
    }
  }
  return plan;
}

size_t attention_partial_floats(int n_rows, int n_head, int head_dim_v, int max_splits) {
  return (size_t)n_rows * n_head * max_splits * (head_dim_v + 2);
}

void rope_and_store(const DeviceStep& step, float* q, float* k, const float* v, const float* q_norm, const float* k_norm,
                    const float* rope_factors, int n_rows, int n_head, int n_head_kv, int head_dim_k, int head_dim_v,
                    int n_rot, bool neox, float freq_base, float freq_scale, float eps, const KvLayer& kv,
                    cudaStream_t stream, const float* table) {
  auto quantized = [](DType t) { return t == DType::Q8_0 || t == DType::Q4_0; };
  const bool whole_rows = (quantized(kv.type_k) && head_dim_k % 32 != 0) || (quantized(kv.type_v) && head_dim_v % 32 != 0);
  constexpr int kWarpsPerCta = 8;
  const dim3 grid((unsigned)n_rows, (unsigned)((n_head + 2 * n_head_kv + kWarpsPerCta - 1) / kWarpsPerCta));
  launch(rope_store_kernel, grid, dim3(32 * kWarpsPerCta), table ? 0 : (size_t)n_rot * sizeof(float), stream, pdl_enabled(), step, q,
         k, v, q_norm, k_norm, rope_factors, n_head, n_head_kv, head_dim_k, head_dim_v, n_rot, neox, freq_base, freq_scale, eps,
         kv, whole_rows, table);
  if (whole_rows) {
    launch(kv_store_rows_kernel, dim3(n_rows), dim3(256), 0, stream, pdl_enabled(), step, k, v, n_head_kv, head_dim_k, head_dim_v, kv);
  }
}

void rope_table(const DeviceStep& step, int n_rows, const float* rope_factors, int n_rot, float freq_base, float freq_scale, float* table,
                cudaStream_t stream) {
  launch(rope_table_kernel, dim3((unsigned)n_rows), dim3(64), 0, stream, pdl_enabled(), step, rope_factors, n_rot, freq_base, freq_scale, table);
}

bool attention(const DeviceStep& step, const float* q, const KvLayer& kv, int n_rows, int n_head, int n_head_kv,
               int head_dim_k, int head_dim_v, float scale, int max_splits, float* partial, float* out, ActQ8 out_act,
               const int* row_list, cudaStream_t stream, int* combine_counters, bool split_heads, int grid_splits, const WgTiles& tiles,
               bool* tiles_written) {
  if (tiles_written) *tiles_written = false;
  if (head_dim_v % 32 != 0) out_act = ActQ8{};
  const int gqa = n_head / n_head_kv;
  if (gqa > kMaxGroup || head_dim_v > kMaxDims * kThreads)
    fail("attention with {} query heads per KV head of dimension {} is not supported on the GPU", gqa, head_dim_v);
  if (max_splits > 8192) fail("attention over {} splits per row is more than the GPU kernels take (8192)", max_splits);
  size_t smem = split_smem_bytes(gqa, head_dim_k, head_dim_v, vec_values_fit(head_dim_v));
  if (n_rows == 0) return false;
  // Decode rows (no row list, at most 8: the counters' rows) combine in the split kernel when the group's
  // split weights fit in its shared memory.
  SplitCombine fuse;
  if (combine_counters && !row_list && n_rows <= 8 && (size_t)gqa * max_splits <= smem / sizeof(float) - split_state_floats(gqa))
    fuse = SplitCombine{combine_counters, out, out_act};
  if (grid_splits <= 0 || grid_splits > max_splits) grid_splits = max_splits;
  if (!fuse.counters && flash_decode_fits(kv, n_head, n_head_kv, head_dim_k, head_dim_v)) {
    if (flash_decode_finalizes(grid_splits)) {
      flash_decode(step, q, scale, kv, n_rows, n_head, n_head_kv, head_dim_k, max_splits, 1, partial, row_list, out, out_act, stream);
      return out_act.q != nullptr;
    }
    flash_decode(step, q, scale, kv, n_rows, n_head, n_head_kv, head_dim_k, max_splits, grid_splits, partial, row_list, nullptr, ActQ8{}, stream);
  } else {
    const int parts = split_heads ? attention_head_parts(gqa, head_dim_v, fuse.counters != nullptr) : 1;
    if (parts > 1) smem = split_smem_bytes(gqa / parts, head_dim_k, head_dim_v, true);
    const AttentionKernel kernel = fuse.counters ? pick_attention<true>(kv.type_k, kv.type_v, gqa, head_dim_v)
                                                : pick_attention<false>(kv.type_k, kv.type_v, gqa / parts, head_dim_v);
    launch(kernel, dim3(n_rows, n_head_kv * parts, grid_splits), dim3(kThreads), smem, stream, pdl_enabled(), step, q, kv, n_head,
           n_head_kv, head_dim_k, head_dim_v, scale, max_splits, partial, row_list, fuse, parts);
    if (fuse.counters) return out_act.q != nullptr;
  }
  const bool with_tiles = tiles.out && !row_list && tiles.n_pad >= n_rows && tiles_written && head_dim_v % 32 == 0;
  launch(attention_combine_kernel, dim3(with_tiles ? tiles.n_pad : n_rows, n_head), dim3(kCombineThreads), (size_t)max_splits * sizeof(float), stream,
         pdl_enabled(), step, n_head, head_dim_v, max_splits, partial, out, out_act, row_list, kv.window, with_tiles ? tiles : WgTiles{},
         n_rows);
  if (with_tiles) *tiles_written = true;
  return out_act.q != nullptr;
}

}  // namespace roofline::cuda
