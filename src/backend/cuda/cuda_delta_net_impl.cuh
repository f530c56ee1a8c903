// Device pieces shared by the DeltaNet mixer's kernels (cuda_delta_net.cu, cuda_delta_net_chunked.cu):
// the shape as kernels take it, finding a row's sequence record, and sliding a sequence's conv window.
#pragma once

#include "backend/cuda/cuda_delta_net.cuh"

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

// Rows of one chunk of the chunked form (and the P row length of its scratch).
constexpr int kChunk = 64;

// The record owning `row`, or -1 (padding rows of a bucket). Every lane of the warp must call it (the
// lanes test records lane, lane + 32, ... and the lowest match wins; records' rows are disjoint).
__device__ __forceinline__ int find_seq(const DeltaNetSeqs& seqs, int row) {
  const int lane = threadIdx.x % 32;
  const int count = *seqs.count;
  for (int base = 0; base < count; base += 32) {
    const int i = base + lane;
    bool hit = false;
    if (i < count) {
      const DeltaNetSeqDev r = seqs.seqs[i];
      hit = row >= r.first_row && row < r.first_row + r.n_rows;
    }
    const unsigned mask = __ballot_sync(0xffffffffu, hit);
    if (mask) return base + __ffs(mask) - 1;
  }
  return -1;
}

// The window after the record's rows: window'[k] = the raw row of (sequence) time n + k - (K-1), from
// the old window (zero when fresh) or the step's qkv rows. Channels [part * per, ...) of conv_dim, per
// = ceil(C / n_parts), by the calling CTA's threads. In place: window'[k] reads window[k + n] with n >= 1
// before any later k writes, and each channel is one thread's. Must run after every read of the old
// window (the prepare kernel's), i.e. in a later kernel.
__device__ __forceinline__ void slide_window(const Shape& sh, const DeltaNetSeqDev& rec, float* cell, const float* qkv,
                                             int part, int n_parts) {
  if (sh.K <= 1) return;
  const int per = (sh.C + n_parts - 1) / n_parts;
  const int c_end = min(sh.C, (part + 1) * per);
  const int n = rec.n_rows;
  for (int ch = part * per + (int)threadIdx.x; ch < c_end; ch += (int)blockDim.x) {
    for (int k = 0; k < sh.K - 1; ++k) {
      const int p = n + k;  // index into [old window (K-1 rows), the run's rows]
      float v;
      if (p < sh.K - 1) v = rec.fresh ? 0.0f : cell[(int64_t)p * sh.C + ch];
      else v = qkv[(int64_t)(rec.first_row + p - (sh.K - 1)) * sh.C + ch];
      cell[(int64_t)k * sh.C + ch] = v;
    }
  }
}

__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }

}  // namespace roofline::cuda::dn
