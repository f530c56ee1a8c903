// Device pieces shared by the DeltaNet mixer's kernels (cuda_delta_net.cu, cuda_delta_net_chunked.cu):
// the shape as kernels take it, finding a row's sequence record, and sliding a sequence's conv window.
#pragma once

#include "backend/cuda/cuda_delta_net.cuh"
#include "backend/cuda/cuda_mma.cuh"

namespace roofline::cuda::dn {

// The shape as kernel arguments (DeltaNetDims has host-only members).
struct Shape {
  int n_k = 0, n_v = 0, dk = 0, dv = 0, K = 0;
  int key_dim = 0, value_dim = 0, C = 0;  // C: conv_dim
  int64_t conv_floats = 0;                // (K - 1) * C: the window; the recurrent part follows
};

inline Shape shape_of(const DeltaNetDims& d) {
  Shape s;
  s.n_k = d.n_k_heads;
  s.n_v = d.n_v_heads;
  s.dk = d.head_k;
  s.dv = d.head_v;
  s.K = d.conv_kernel;
  s.key_dim = d.key_dim();
  s.value_dim = d.value_dim();
  s.C = d.conv_dim();
  s.conv_floats = (int64_t)d.conv_state_floats();
  return s;
}

// Rows of one chunk of the chunked form.
constexpr int kChunk = 64;

// The record owning `row` (its index, and the record in *out), or -1 (padding rows of a bucket). Every
// lane of the warp must call it (the lanes test records lane, lane + 32, ... and the lowest match wins;
// records' rows are disjoint). The records are read together with the count (one round trip).
__device__ __forceinline__ int find_seq(const DeltaNetSeqs& seqs, int row, DeltaNetSeqDev* out = nullptr) {
  const int lane = threadIdx.x % 32;
  const int count = *seqs.count;
  for (int base = 0; base < seqs.max_seqs; base += 32) {
    const int i = base + lane;
    DeltaNetSeqDev r{0, 0, 0, 0};
    if (i < seqs.max_seqs) r = seqs.seqs[i];
    const bool hit = i < count && row >= r.first_row && row < r.first_row + r.n_rows;
    const unsigned mask = __ballot_sync(0xffffffffu, hit);
    if (mask) {
      const int src = __ffs(mask) - 1;
      if (out) {
        out->first_row = __shfl_sync(0xffffffffu, r.first_row, src);
        out->n_rows = __shfl_sync(0xffffffffu, r.n_rows, src);
        out->fresh = __shfl_sync(0xffffffffu, r.fresh, src);
        out->cell = __shfl_sync(0xffffffffu, r.cell, src);
      }
      return base + src;
    }
    if (base + 32 >= count) break;
  }
  return -1;
}

// Conv kernels up to this size (the loads of a channel's taps are unrolled).
constexpr int kMaxConv = 8;

// The window after the record's rows: window'[k] = the raw row of (sequence) time n + k - (K-1), from
// the old window (zero when fresh) or the step's qkv rows. A channel's K-1 new values are loaded (into
// v) before any is stored, so sliding in place is safe channel by channel. Must run after every read
// of the old window (the prepare kernel's), i.e. in a later kernel.
__device__ __forceinline__ void window_load(const Shape& sh, const DeltaNetSeqDev& rec, const float* cell, const float* qkv,
                                            int ch, float (&v)[kMaxConv - 1]) {
#pragma unroll
  for (int k = 0; k < kMaxConv - 1; ++k) {
    if (k >= sh.K - 1) break;
    const int p = rec.n_rows + k;  // index into [old window (K-1 rows), the run's rows]
    if (p < sh.K - 1) v[k] = rec.fresh ? 0.0f : cell[(int64_t)p * sh.C + ch];
    else v[k] = qkv[(int64_t)(rec.first_row + p - (sh.K - 1)) * sh.C + ch];
  }
}
__device__ __forceinline__ void window_store(const Shape& sh, float* cell, int ch, const float (&v)[kMaxConv - 1]) {
#pragma unroll
  for (int k = 0; k < kMaxConv - 1; ++k) {
    if (k >= sh.K - 1) break;
    cell[(int64_t)k * sh.C + ch] = v[k];
  }
}

// The calling CTA's share of a record's window: channels [part * per, ...), per = ceil(C / n_parts).
// begin() loads the thread's first channel early (its loads overlap the kernel's main work), finish()
// stores it and slides the rest.
struct WindowSlide {
  int ch = 0, end = 0;
  float v[kMaxConv - 1];
  __device__ __forceinline__ void begin(const Shape& sh, const DeltaNetSeqDev& rec, const float* cell, const float* qkv,
                                        int part, int n_parts) {
    const int per = (sh.C + n_parts - 1) / n_parts;
    ch = part * per + (int)threadIdx.x;
    end = min(sh.C, (part + 1) * per);
    if (sh.K > 1 && ch < end) window_load(sh, rec, cell, qkv, ch, v);
  }
  __device__ __forceinline__ void finish(const Shape& sh, const DeltaNetSeqDev& rec, float* cell, const float* qkv) {
    if (sh.K <= 1) return;
    if (ch < end) window_store(sh, cell, ch, v);
    for (int c = ch + (int)blockDim.x; c < end; c += (int)blockDim.x) {
      window_load(sh, rec, cell, qkv, c, v);
      window_store(sh, cell, c, v);
    }
  }
};

// Asynchronous global -> shared copies of 16 or 4 bytes, zero-filled when !ok (cp.async, sm_80+; a plain
// copy before). Each thread's copies form groups (copy_async_commit, cuda_mma.cuh); copy_async_wait<N> returns
// when at most N of its newest groups are still in flight, and a thread sees its own copies after it.
__device__ __forceinline__ void copy16(void* dst, const void* src, bool ok) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(ok ? 16 : 0));
#else
  *reinterpret_cast<float4*>(dst) = ok ? *reinterpret_cast<const float4*>(src) : make_float4(0.f, 0.f, 0.f, 0.f);
#endif
}
__device__ __forceinline__ void copy4(void* dst, const void* src, bool ok) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(d), "l"(src), "r"(ok ? 4 : 0));
#else
  *reinterpret_cast<float*>(dst) = ok ? *reinterpret_cast<const float*>(src) : 0.0f;
#endif
}
// x * sigmoid(x) with the fast exponential and division (relative error ~1e-6 where |x| < 10; 0 for
// x below -88, where the exponential overflows).
__device__ __forceinline__ float silu(float x) { return __fdividef(x, 1.0f + __expf(-x)); }

}  // namespace roofline::cuda::dn
