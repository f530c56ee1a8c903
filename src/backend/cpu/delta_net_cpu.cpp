// The CPU Gated DeltaNet mixer (delta_net_cpu.h): the split into tasks, the two forms of the delta
// rule, and the portable kernels (delta_net_cpu_avx2.cpp has the AVX2 ones).
//
// Two phases, each a parallel_for over independent tasks (so results never depend on the split):
//  1. (sequence, channel block) — a q or k head, or a v head's channels: causal conv + SiLU in place
//     in qkv, rows processed last to first so every row still reads raw rows before it; then the L2
//     norm of q/k heads (q also takes the 1/sqrt(dk) scale); the conv window is saved first.
//  2. (sequence, v-head): g and beta, the delta rule (recurrent or chunked, from the sequence's own
//     row count), then the gated RMSNorm of the head's outputs.
//
// Chunked form (as transformers' torch_chunk_gated_delta_rule, derived for S[i][j], i: key index):
// for a chunk of c tokens with D[t][s] = prod_{s<m<=t} decay_m (= exp(G_t - G_s), G the cumulative
// log decay inside the chunk) and e_t = D[t][-1] = exp(G_t):
//   N  = strictly lower (beta_t k_t.k_s D[t][s]);   T = (I + N)^-1 (forward substitution)
//   U  = T (beta v);   W = T (beta e k);   V' = U - W S
//   O  = (e q) S + lower_incl_diag(q_t.k_s D[t][s]) V'
//   S <- e_last S + (D[last][t] k_t)^T V'
// Its cost per token is the recurrent form's (three dk x dv products per token either way) plus the
// chunk-local terms (~35% more multiply-adds at dk = dv = 128), so it only pays where its matrix
// products run much faster than the recurrence.
//
// Measured (bench/delta_net_bench.cpp and an interleaved A/B, min of repeats, Xeon 2-core VM shared
// with other jobs, AVX2), microseconds per call for one sequence of T rows, recurrent / chunked:
//   27B shape (n_k 16, n_v 48, 128/128, K 4), 1 thread:
//     T=1 208/926  T=8 1014/1547  T=16 2102/2358  T=32 4200/4343  T=64 7595/9880
//     T=128 15810/16765  T=512 71485/66187  (A/B: chunked/recurrent 1.09-1.13 for T = 32..512)
//   27B shape, 2 threads (A/B, quiet machine): T=1 185/551  T=8 647/867  T=32 2293/2155
//     T=64 4566/4587  T=128 8967/8878  T=256 16317/18300  T=512 35652/38191  T=1024 79231/77533
//   small shape (n_k 4, n_v 8, 64/64), 1 thread: chunked 1.15-1.45x slower at every T.
// The chunked form wins nowhere by more than the noise (about 10%), and the recurrent one gives the
// same bits however a sequence's rows are split into calls, so Auto never takes the chunked form.
#include "backend/cpu/delta_net_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#if defined(__SSE__) || defined(__x86_64__)
#include <xmmintrin.h>
#endif

#include "backend/cpu/vec_dot.h"
#include "core/error.h"
#include "core/thread_pool.h"

namespace roofline::cpu {

namespace detail {
namespace {

float silu_portable(float x) { return x / (1.0f + std::exp(-x)); }

void conv_silu_portable(const float* const* taps, const float* wt, int K, int n, float* out) {
  for (int c = 0; c < n; ++c) {
    float acc = 0;
    for (int k = 0; k < K; ++k) acc += wt[(size_t)k * n + c] * taps[k][c];
    out[c] = silu_portable(acc);
  }
}

void l2_normalize_portable(float* x, int n, float scale) {
  float sum = 0;
  for (int i = 0; i < n; ++i) sum += x[i] * x[i];
  const float inv = scale / std::sqrt(sum + 1e-6f);
  for (int i = 0; i < n; ++i) x[i] *= inv;
}

void recurrent_portable(const DeltaNetRecurrentArgs& a) {
  const int dk = a.dk;
  for (int j = 0; j < a.dv; ++j) {
    float* row = a.state + (size_t)j * dk;  // column j of S, kept hot across the tokens
    for (int t = 0; t < a.n_tokens; ++t) {
      const float* q = a.q + (size_t)t * a.qk_stride;
      const float* k = a.k + (size_t)t * a.qk_stride;
      float kv = 0, sq = 0;
      for (int i = 0; i < dk; ++i) {
        kv += row[i] * k[i];
        sq += row[i] * q[i];
      }
      const float d = a.decay[t];
      const float delta = a.beta[t] * (a.v[(size_t)t * a.v_stride + j] - d * kv);
      // (d S + k delta)^T q = d S^T q + delta (k . q)
      a.o[(size_t)t * a.o_stride + j] = d * sq + delta * a.kq[t];
      for (int i = 0; i < dk; ++i) row[i] = d * row[i] + k[i] * delta;
    }
  }
}

void gemm_portable(int M, int N, int K, const float* A, size_t rsa, size_t ksa, const float* B, size_t ldb, float* C,
                   size_t ldc, float alpha, bool accumulate) {
  constexpr int kCols = 64;
  float acc[kCols];
  for (int r = 0; r < M; ++r) {
    for (int n0 = 0; n0 < N; n0 += kCols) {
      const int nb = std::min(kCols, N - n0);
      std::fill(acc, acc + nb, 0.0f);
      for (int k = 0; k < K; ++k) {
        const float av = A[(size_t)r * rsa + (size_t)k * ksa];
        const float* b = B + (size_t)k * ldb + n0;
        for (int n = 0; n < nb; ++n) acc[n] += av * b[n];
      }
      float* c = C + (size_t)r * ldc + n0;
      for (int n = 0; n < nb; ++n) c[n] = accumulate ? c[n] + alpha * acc[n] : alpha * acc[n];
    }
  }
}

void gated_rms_norm_portable(float* o, const float* z, const float* w, int n, float eps) {
  float ss = 0;
  for (int j = 0; j < n; ++j) ss += o[j] * o[j];
  const float inv = 1.0f / std::sqrt(ss / (float)n + eps);
  for (int j = 0; j < n; ++j) o[j] = o[j] * inv * w[j] * silu_portable(z[j]);
}

}  // namespace

const DeltaNetKernels& delta_net_kernels_portable() {
  static const DeltaNetKernels k{conv_silu_portable, l2_normalize_portable, recurrent_portable, gemm_portable,
                                 gated_rms_norm_portable};
  return k;
}

}  // namespace detail

namespace {

using detail::DeltaNetKernels;

// Per-thread scratch, 64-byte aligned, reused across calls (one user at a time per thread).
float* thread_scratch(size_t n) {
  struct Buffer {
    float* p = nullptr;
    size_t n = 0;
    ~Buffer() { std::free(p); }
  };
  thread_local Buffer buf;
  if (buf.n < n) {
    std::free(buf.p);
    buf.n = 0;
    buf.p = static_cast<float*>(std::aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64));
    if (!buf.p) throw std::bad_alloc();
    buf.n = n;
  }
  return buf.p;
}

// Leading dimension of a local matrix with rows of n floats: whole cache lines, an odd number of
// them, so the rows of a column panel spread over all the L1 sets instead of a few.
int padded_ld(int n) {
  int ld = (n + 15) / 16 * 16;
  if ((ld / 16) % 2 == 0) ld += 16;
  return ld;
}

float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }
float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// Sets flush-to-zero and denormals-are-zero for its scope (x86; elsewhere nothing), restoring the
// caller's mode after. The chunked form multiplies small decay factors together (exp(G_t) by
// exp(G_s - G_t) and so on), and a denormal operand costs ~100 cycles on x86: without this the
// chunked form ran 3.5x slower on the 27B shape. Only values below 1.2e-38 change, far below the
// precision of any output, and every task runs in the same mode, so results stay deterministic.
class FlushDenormals {
 public:
#if defined(__SSE__) || defined(__x86_64__)
  FlushDenormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | 0x8040); }
  ~FlushDenormals() { _mm_setcsr(saved_); }

 private:
  unsigned saved_;
#endif
};

// Rows of one sequence are a whole qkv/z/out row apart (tens of KB): too far for the hardware
// prefetchers, so the loops that walk a head's slice down the rows prefetch a few rows ahead.
constexpr int kPrefetchRows = 4;
inline void prefetch(const float* p, int n) {
  for (int i = 0; i < n; i += 16) __builtin_prefetch(p + i);
}

// Products below this are flushed to zero (no denormals in the decay products; their share of any
// output is far below float precision).
constexpr float kTinyDecay = 1e-30f;

// One block of conv channels [c0, c0 + width) of one sequence: a q head, a k head or a v head.
struct ConvSegment {
  int c0 = 0, width = 0;
  bool normalize = false;  // q/k heads: L2 norm after the conv
  float scale = 1.0f;      // q: 1/sqrt(dk)
};

void conv_segment(const DeltaNetKernels& kr, const DeltaNetDims& d, const DeltaNetWeights& w, const DeltaNetSeq& s,
                  const ConvSegment& seg, float* qkv) {
  const int K = d.conv_kernel, C = d.conv_dim(), T = s.n_rows, width = seg.width;
  float* wt = thread_scratch((size_t)(2 * K) * width);  // [K x width] taps, transposed
  float* zeros = wt + (size_t)K * width;                 // [width]
  float* new_window = zeros + width;                     // [(K-1) x width]
  std::vector<const float*> tap_rows(K);
  for (int c = 0; c < width; ++c)
    for (int k = 0; k < K; ++k) wt[(size_t)k * width + c] = w.conv[(size_t)(seg.c0 + c) * K + k];
  std::fill(zeros, zeros + width, 0.0f);
  float* window = s.state;  // [(K-1) x C], oldest first
  // Raw row r of the run extended to the left: r < 0 reads the window (zero for a fresh sequence).
  auto raw_row = [&](int r) -> const float* {
    if (r >= 0) return qkv + (size_t)(s.first_row + r) * C + seg.c0;
    if (s.fresh) return zeros;
    return window + (size_t)(K - 1 + r) * C + seg.c0;
  };
  for (int m = 0; m < K - 1; ++m) std::memcpy(new_window + (size_t)m * width, raw_row(T - (K - 1) + m), width * sizeof(float));
  for (int r = T - 1; r >= 0; --r) {
    if (r - (K - 1) - kPrefetchRows >= 0) prefetch(raw_row(r - (K - 1) - kPrefetchRows), width);
    for (int k = 0; k < K; ++k) tap_rows[k] = raw_row(r - (K - 1) + k);
    float* row = qkv + (size_t)(s.first_row + r) * C + seg.c0;
    kr.conv_silu(tap_rows.data(), wt, K, width, row);
    if (seg.normalize) kr.l2_normalize(row, width, seg.scale);
  }
  for (int m = 0; m < K - 1; ++m)
    std::memcpy(window + (size_t)m * C + seg.c0, new_window + (size_t)m * width, width * sizeof(float));
}

// The chunked form over one head's run (see the top of the file). state: the head's [dv x dk].
void chunked_head(const DeltaNetKernels& kr, int dk, int dv, int T, float* state, const float* q0, const float* k0,
                  const float* v0, size_t in_stride, const float* decay, const float* beta, float* o0,
                  size_t o_stride) {
  constexpr int CH = kDeltaNetChunk;
  constexpr int kStrip = 16;  // row strips for the triangular products
  const int uw = dv + dk;     // [U | W] row
  const int ld_S = padded_ld(dv), ld_k = padded_ld(dk), ld_c = padded_ld(CH), ld_uw = padded_ld(uw);
  const size_t n_S = (size_t)dk * ld_S, n_qk = (size_t)CH * ld_k, n_kt = (size_t)dk * ld_c, n_cc = (size_t)CH * ld_c,
               n_uw = (size_t)CH * ld_uw, n_o = (size_t)CH * ld_S;
  float* S = thread_scratch(n_S + 2 * n_qk + n_kt + 4 * n_cc + 2 * n_uw + n_o);  // S[i][j], i: key index
  float* Q = S + n_S;      // [CH x dk]
  float* Kc = Q + n_qk;    // [CH x dk]
  float* Kt = Kc + n_qk;   // [dk x CH]
  float* D = Kt + n_kt;    // [CH x CH] decay products, lower triangle with the diagonal
  float* Nm = D + n_cc;    // [CH x CH] strictly lower N
  float* Tm = Nm + n_cc;   // [CH x CH] (I + N)^-1
  float* P = Tm + n_cc;    // [CH x CH] q.k D, lower with the diagonal
  float* RHS = P + n_cc;   // [CH x uw] [beta v | beta e k]
  float* UW = RHS + n_uw;  // [CH x uw] [U | W], then [V' | W]
  float* O = UW + n_uw;    // [CH x dv] the chunk's outputs (out's rows are far apart in memory)
  float e[CH];

  for (int j = 0; j < dv; ++j)
    for (int i = 0; i < dk; ++i) S[(size_t)i * ld_S + j] = state[(size_t)j * dk + i];

  for (int c0 = 0; c0 < T; c0 += CH) {
    const int c = std::min(CH, T - c0);
    for (int t = 0; t < c; ++t) {
      const float* q = q0 + (size_t)(c0 + t) * in_stride;
      const float* k = k0 + (size_t)(c0 + t) * in_stride;
      if (t + kPrefetchRows < c) {
        prefetch(q + kPrefetchRows * in_stride, dk);
        prefetch(k + kPrefetchRows * in_stride, dk);
        prefetch(v0 + (size_t)(c0 + t + kPrefetchRows) * in_stride, dv);
      }
      std::memcpy(Q + (size_t)t * ld_k, q, dk * sizeof(float));
      std::memcpy(Kc + (size_t)t * ld_k, k, dk * sizeof(float));
      for (int i = 0; i < dk; ++i) Kt[(size_t)i * ld_c + t] = k[i];
      // D[t][s] = D[t-1][s] decay_t (s < t), D[t][t] = 1; e_t = e_{t-1} decay_t.
      const float dt = decay[c0 + t];
      float* drow = D + (size_t)t * ld_c;
      if (t > 0) {
        const float* prev = drow - ld_c;
        for (int s = 0; s < t; ++s) {
          const float x = prev[s] * dt;
          drow[s] = x < kTinyDecay ? 0.0f : x;
        }
      }
      drow[t] = 1.0f;
      const float et = (t > 0 ? e[t - 1] : 1.0f) * dt;
      e[t] = et < kTinyDecay ? 0.0f : et;
    }
    // N = strictly lower beta_t (k_t . k_s) D[t][s]; P = lower (q_t . k_s) D[t][s].
    for (int r0 = 0; r0 < c; r0 += kStrip) {
      const int rn = std::min(kStrip, c - r0), cols = std::min(c, r0 + rn);
      kr.gemm(rn, cols, dk, Kc + (size_t)r0 * ld_k, ld_k, 1, Kt, ld_c, Nm + (size_t)r0 * ld_c, ld_c, 1.0f, false);
      kr.gemm(rn, cols, dk, Q + (size_t)r0 * ld_k, ld_k, 1, Kt, ld_c, P + (size_t)r0 * ld_c, ld_c, 1.0f, false);
    }
    for (int t = 0; t < c; ++t) {
      const float b = beta[c0 + t];
      float* nrow = Nm + (size_t)t * ld_c;
      float* prow = P + (size_t)t * ld_c;
      const float* drow = D + (size_t)t * ld_c;
      for (int s = 0; s < t; ++s) nrow[s] *= b * drow[s];
      for (int s = 0; s <= t; ++s) prow[s] *= drow[s];
      for (int s = t + 1; s < c; ++s) prow[s] = 0.0f;
    }
    // T = (I + N)^-1: row t = e_t - sum_{m<t} N[t][m] T[m] (T[m][s] = 0 for s > m).
    for (int t = 0; t < c; ++t) {
      float* trow = Tm + (size_t)t * ld_c;
      kr.gemm(1, t, t, Nm + (size_t)t * ld_c, 0, 1, Tm, ld_c, trow, ld_c, -1.0f, false);
      trow[t] = 1.0f;
      std::fill(trow + t + 1, trow + c, 0.0f);
    }
    for (int t = 0; t < c; ++t) {
      const float b = beta[c0 + t], be = b * e[t];
      const float* v = v0 + (size_t)(c0 + t) * in_stride;
      const float* k = Kc + (size_t)t * ld_k;
      float* row = RHS + (size_t)t * ld_uw;
      for (int j = 0; j < dv; ++j) row[j] = b * v[j];
      for (int i = 0; i < dk; ++i) row[dv + i] = be * k[i];
    }
    // [U | W] = T [beta v | beta e k] (T lower: a strip needs rows of RHS up to its last row).
    for (int r0 = 0; r0 < c; r0 += kStrip) {
      const int rn = std::min(kStrip, c - r0);
      kr.gemm(rn, uw, std::min(c, r0 + rn), Tm + (size_t)r0 * ld_c, ld_c, 1, RHS, ld_uw, UW + (size_t)r0 * ld_uw, ld_uw,
              1.0f, false);
    }
    for (int t = 0; t < c; ++t) {
      float* q = Q + (size_t)t * ld_k;
      for (int i = 0; i < dk; ++i) q[i] *= e[t];
    }
    kr.gemm(c, dv, dk, Q, ld_k, 1, S, ld_S, O, ld_S, 1.0f, false);                // O = (e q) S
    kr.gemm(c, dv, dk, UW + dv, ld_uw, 1, S, ld_S, UW, ld_uw, -1.0f, true);       // V' = U - W S
    for (int r0 = 0; r0 < c; r0 += kStrip) {                                       // O += P V'
      const int rn = std::min(kStrip, c - r0);
      kr.gemm(rn, dv, std::min(c, r0 + rn), P + (size_t)r0 * ld_c, ld_c, 1, UW, ld_uw, O + (size_t)r0 * ld_S, ld_S,
              1.0f, true);
    }
    for (int t = 0; t < c; ++t)
      std::memcpy(o0 + (size_t)(c0 + t) * o_stride, O + (size_t)t * ld_S, dv * sizeof(float));
    // S <- e_last S + (D[last][t] k_t)^T V'
    const float* dlast = D + (size_t)(c - 1) * ld_c;
    for (int t = 0; t < c; ++t) {
      float* k = Kc + (size_t)t * ld_k;
      for (int i = 0; i < dk; ++i) k[i] *= dlast[t];
    }
    const float elast = e[c - 1];
    for (int i = 0; i < dk; ++i)
      for (int j = 0; j < dv; ++j) S[(size_t)i * ld_S + j] *= elast;
    kr.gemm(dk, dv, c, Kc, 1, ld_k, UW, ld_uw, S, ld_S, 1.0f, true);
  }

  for (int j = 0; j < dv; ++j)
    for (int i = 0; i < dk; ++i) state[(size_t)j * dk + i] = S[(size_t)i * ld_S + j];
}

// The recurrent form over one head's run, in blocks of tokens whose q, k and v are first copied next
// to each other and whose outputs go out after the block: rows of qkv and out are a multiple of 4 KB
// apart, so a head's slices of successive rows would all fall in the same few L1 sets.
void recurrent_head(DeltaNetKernels::RecurrentFn recurrent, int dk, int dv, int T, float* state, const float* q0,
                    const float* k0, const float* v0, size_t in_stride, const float* decay, const float* beta,
                    float* o0, size_t o_stride) {
  constexpr int kTokenBlock = 32;
  const int ld_k = padded_ld(dk), ld_v = padded_ld(dv);
  float* qb = thread_scratch((size_t)kTokenBlock * (2 * ld_k + 2 * ld_v + 1));
  float* kb = qb + (size_t)kTokenBlock * ld_k;
  float* vb = kb + (size_t)kTokenBlock * ld_k;
  float* ob = vb + (size_t)kTokenBlock * ld_v;
  float* kq = ob + (size_t)kTokenBlock * ld_v;
  for (int t0 = 0; t0 < T; t0 += kTokenBlock) {
    const int tb = std::min(kTokenBlock, T - t0);
    for (int t = 0; t < tb; ++t) {
      const float* q = q0 + (size_t)(t0 + t) * in_stride;
      const float* k = k0 + (size_t)(t0 + t) * in_stride;
      const float* v = v0 + (size_t)(t0 + t) * in_stride;
      if (t0 + t + kPrefetchRows < T) {
        prefetch(q + kPrefetchRows * in_stride, dk);
        prefetch(k + kPrefetchRows * in_stride, dk);
        prefetch(v + kPrefetchRows * in_stride, dv);
      }
      std::memcpy(qb + (size_t)t * ld_k, q, dk * sizeof(float));
      std::memcpy(kb + (size_t)t * ld_k, k, dk * sizeof(float));
      std::memcpy(vb + (size_t)t * ld_v, v, dv * sizeof(float));
      float acc = 0;
      for (int i = 0; i < dk; ++i) acc += k[i] * q[i];
      kq[t] = acc;
    }
    detail::DeltaNetRecurrentArgs a;
    a.dk = dk;
    a.dv = dv;
    a.n_tokens = tb;
    a.state = state;
    a.q = qb;
    a.k = kb;
    a.qk_stride = ld_k;
    a.v = vb;
    a.v_stride = ld_v;
    a.decay = decay + t0;
    a.beta = beta + t0;
    a.kq = kq;
    a.o = ob;
    a.o_stride = ld_v;
    recurrent(a);
    for (int t = 0; t < tb; ++t) std::memcpy(o0 + (size_t)(t0 + t) * o_stride, ob + (size_t)t * ld_v, dv * sizeof(float));
  }
}

}  // namespace

void delta_net_forward(const DeltaNetDims& d, const DeltaNetWeights& w, float eps, std::span<const DeltaNetSeq> seqs,
                       float* qkv, const float* z, const float* alpha, const float* beta, float* out, ThreadPool& pool) {
  delta_net_forward(d, w, eps, seqs, qkv, z, alpha, beta, out, pool, DeltaNetOptions{});
}

void delta_net_forward(const DeltaNetDims& d, const DeltaNetWeights& w, float eps, std::span<const DeltaNetSeq> seqs,
                       float* qkv, const float* z, const float* alpha, const float* beta, float* out, ThreadPool& pool,
                       const DeltaNetOptions& options) {
  ROOFLINE_CHECK(d.n_k_heads > 0 && d.n_v_heads % d.n_k_heads == 0 && d.conv_kernel >= 1 && d.head_k > 0 &&
                 d.head_v > 0);
  const DeltaNetKernels* simd = options.simd && cpu::detail::avx2_supported() ? detail::delta_net_kernels_avx2() : nullptr;
  const DeltaNetKernels& kr = simd ? *simd : detail::delta_net_kernels_portable();
  const int dk = d.head_k, dv = d.head_v, nk = d.n_k_heads, nv = d.n_v_heads, C = d.conv_dim();
  const int key_dim = d.key_dim(), value_dim = d.value_dim();
  const size_t n_seqs = seqs.size();

  // Phase 1: conv + SiLU (+ L2 norm), per (sequence, q head | k head | v head).
  std::vector<ConvSegment> segments;
  const float q_scale = 1.0f / std::sqrt((float)dk);
  for (int h = 0; h < nk; ++h) segments.push_back({h * dk, dk, true, q_scale});
  for (int h = 0; h < nk; ++h) segments.push_back({key_dim + h * dk, dk, true, 1.0f});
  for (int h = 0; h < nv; ++h) segments.push_back({2 * key_dim + h * dv, dv, false, 1.0f});
  pool.parallel_for(n_seqs * segments.size(), [&](size_t task) {
    conv_segment(kr, d, w, seqs[task / segments.size()], segments[task % segments.size()], qkv);
  });

  // Phase 2: the delta rule and the gated norm, per (sequence, v-head).
  const size_t conv_floats = d.conv_state_floats();
  // The AVX2 recurrence reads keys 8 at a time; other head sizes take the portable one.
  const auto recurrent = dk % 8 == 0 ? kr.recurrent : detail::delta_net_kernels_portable().recurrent;
  pool.parallel_for(n_seqs * nv, [&](size_t task) {
    const FlushDenormals flush;
    const DeltaNetSeq& s = seqs[task / nv];
    const int h = (int)(task % nv), hk = h % nk, T = s.n_rows;
    float* S = s.state + conv_floats + (size_t)h * dv * dk;
    if (s.fresh) std::fill(S, S + (size_t)dv * dk, 0.0f);
    if (T == 0) return;
    const bool chunked = options.form == DeltaNetForm::Chunked ||
                         (options.form == DeltaNetForm::Auto && T >= kDeltaNetChunkedMinRows);
    std::vector<float> per_token(2 * (size_t)T);  // decay, beta
    float* dec = per_token.data();
    float* bet = dec + T;
    const float* q0 = qkv + (size_t)s.first_row * C + (size_t)hk * dk;
    const float* k0 = q0 + key_dim;
    const float* v0 = qkv + (size_t)s.first_row * C + 2 * (size_t)key_dim + (size_t)h * dv;
    float* o0 = out + (size_t)s.first_row * value_dim + (size_t)h * dv;
    for (int t = 0; t < T; ++t) {
      const size_t row = (size_t)(s.first_row + t);
      const float g = softplus(alpha[row * nv + h] + w.dt_bias[h]) * w.a[h];
      dec[t] = std::exp(g);
      bet[t] = sigmoid(beta[row * nv + h]);
    }
    if (chunked) chunked_head(kr, dk, dv, T, S, q0, k0, v0, C, dec, bet, o0, value_dim);
    else recurrent_head(recurrent, dk, dv, T, S, q0, k0, v0, C, dec, bet, o0, value_dim);
    for (int t = 0; t < T; ++t) {
      const size_t row = (size_t)(s.first_row + t);
      if (t + kPrefetchRows < T) {
        prefetch(out + (row + kPrefetchRows) * value_dim + (size_t)h * dv, dv);
        prefetch(z + (row + kPrefetchRows) * value_dim + (size_t)h * dv, dv);
      }
      kr.gated_rms_norm(out + row * value_dim + (size_t)h * dv, z + row * value_dim + (size_t)h * dv, w.norm, dv, eps);
    }
  });
}

}  // namespace roofline::cpu
