// The Gated DeltaNet mixer on the CPU (the contract and the double-precision oracle are in
// backend/delta_net.h): float32, multithreaded, batch invariant. Two forms of the delta rule:
//   recurrent: token by token, each state row kept hot in L1 across a block of tokens;
//   chunked:   64-token chunks in the WY/UT form (a triangular solve and small matrix products per
//              chunk, as transformers' torch_chunk_gated_delta_rule).
// On the 2-core AVX2 machine the chunked form was never reliably faster (see delta_net_cpu.cpp), so
// Auto takes the recurrent form for every run; the chunked one stays selectable and tested.
// A sequence's outputs and state never depend on the other sequences of the call nor on the thread
// count (the form is picked from the sequence's own row count). With the recurrent form they do not
// depend on how a sequence's rows are split into calls either.
#pragma once

#include <cstddef>
#include <span>

#include "backend/delta_net.h"

namespace roofline {
class ThreadPool;
}

namespace roofline::cpu {

// Rows per chunk of the chunked form, and the shortest run of one sequence for which Auto takes it:
// never, from the measurements (bench/delta_net_bench.cpp; table in delta_net_cpu.cpp).
inline constexpr int kDeltaNetChunk = 64;
inline constexpr int kDeltaNetChunkedMinRows = 1 << 30;

enum class DeltaNetForm { Auto, Recurrent, Chunked };

struct DeltaNetOptions {
  DeltaNetForm form = DeltaNetForm::Auto;  // Auto: chunked for runs of >= kDeltaNetChunkedMinRows rows
  bool simd = true;                        // false: the portable kernels even where AVX2 is present
};

// Same inputs, outputs and state updates as delta_net_reference (backend/delta_net.h), in float32.
// qkv is scratch: the rows of the sequences are overwritten (on return they hold the conv+SiLU
// outputs with q and k L2-normalised and q scaled by 1/sqrt(dk)); other rows are left alone.
// out gets the rows of the sequences only. Work is split over (sequence, channel block) for the
// conv and over (sequence, v-head) for the delta rule and the gated norm.
void delta_net_forward(const DeltaNetDims& dims, const DeltaNetWeights& w, float eps, std::span<const DeltaNetSeq> seqs,
                       float* qkv, const float* z, const float* alpha, const float* beta, float* out, ThreadPool& pool);
void delta_net_forward(const DeltaNetDims& dims, const DeltaNetWeights& w, float eps, std::span<const DeltaNetSeq> seqs,
                       float* qkv, const float* z, const float* alpha, const float* beta, float* out, ThreadPool& pool,
                       const DeltaNetOptions& options);

namespace detail {

// The inner kernels, portable or AVX2 (delta_net_cpu_avx2.cpp). Plain pointers and ints only, so the
// AVX2 file instantiates no inline function that the portable code could end up sharing.
struct DeltaNetRecurrentArgs {
  int dk = 0, dv = 0, n_tokens = 0;
  float* state = nullptr;  // [dv x dk], row j = column j of S (the contract's layout), in/out
  const float* q = nullptr;  // token t: q + t * qk_stride (dk floats, already scaled by 1/sqrt(dk))
  const float* k = nullptr;
  size_t qk_stride = 0;
  const float* v = nullptr;  // token t: v + t * v_stride (dv floats)
  size_t v_stride = 0;
  const float* decay = nullptr;  // [n_tokens] exp(g)
  const float* beta = nullptr;   // [n_tokens] sigmoid(beta)
  const float* kq = nullptr;     // [n_tokens] k . q
  float* o = nullptr;            // token t: o + t * o_stride (dv floats), S^T q before the norm
  size_t o_stride = 0;
};

struct DeltaNetKernels {
  // out[c] = SiLU(sum_k wt[k * n + c] * taps[k][c]) for c < n, k ascending; out may be taps[K-1].
  void (*conv_silu)(const float* const* taps, const float* wt, int K, int n, float* out);
  // x *= scale / sqrt(sum x^2 + 1e-6)
  void (*l2_normalize)(float* x, int n, float scale);
  // The recurrent delta rule over n_tokens tokens of one head (updates the state in place).
  using RecurrentFn = void (*)(const DeltaNetRecurrentArgs& a);
  RecurrentFn recurrent;
  // C[r*ldc + n] = (accumulate ? C : 0) + alpha * sum_k A[r*rsa + k*ksa] * B[k*ldb + n] for r < M,
  // n < N, the sum in ascending k.
  void (*gemm)(int M, int N, int K, const float* A, size_t rsa, size_t ksa, const float* B, size_t ldb, float* C,
               size_t ldc, float alpha, bool accumulate);
  // o = o / rms(o) * w * SiLU(z) over n values (rms with eps).
  void (*gated_rms_norm)(float* o, const float* z, const float* w, int n, float eps);
};

const DeltaNetKernels& delta_net_kernels_portable();
// nullptr when the AVX2 file is not compiled in or the CPU lacks AVX2/FMA.
const DeltaNetKernels* delta_net_kernels_avx2();

}  // namespace detail

}  // namespace roofline::cpu
