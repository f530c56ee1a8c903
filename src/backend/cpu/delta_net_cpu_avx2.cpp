// AVX2/FMA kernels of the CPU Gated DeltaNet mixer (delta_net_cpu.h's DeltaNetKernels), compiled with
// -mavx2 -mfma -mf16c and used only after the CPU check. Every output's operations run in a fixed
// order that depends only on the sizes, never on which thread or call computes it. Partial vectors
// are masked loads/stores, so tails take the same arithmetic as full vectors.
// No shared inline helpers (<algorithm>, std::span, DeltaNetDims' members) here: an AVX2-compiled copy
// of an inline function could be the one the linker keeps for the portable path too.
#include "backend/cpu/delta_net_cpu.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

namespace roofline::cpu::detail {
namespace {

inline __m256i tail_mask(int m) {  // lanes [0, m) set
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(m), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Lane l of the result = the sum of the 8 lanes of a[l].
inline __m256 hsum8(const __m256* a) {
  const __m256 t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
  const __m256 t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
  const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

// exp(x) for float lanes: 2^n * p(r), r = x - n ln2 in [-ln2/2, ln2/2], Cephes' expf polynomial
// (about 1 ulp); x is clamped to [-87, 88], so the result is a normal float, never inf or 0.
inline __m256 exp256(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

inline __m256 silu256(__m256 x) {
  const __m256 one = _mm256_set1_ps(1.0f);
  return _mm256_div_ps(x, _mm256_add_ps(one, exp256(_mm256_sub_ps(_mm256_setzero_ps(), x))));
}

void conv_silu(const float* const* taps, const float* wt, int K, int n, float* out) {
  for (int c = 0; c < n; c += 8) {
    const int m = n - c;
    if (m >= 8) {
      __m256 acc = _mm256_setzero_ps();
      for (int k = 0; k < K; ++k)
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(wt + (size_t)k * n + c), _mm256_loadu_ps(taps[k] + c), acc);
      _mm256_storeu_ps(out + c, silu256(acc));
    } else {
      const __m256i mask = tail_mask(m);
      __m256 acc = _mm256_setzero_ps();
      for (int k = 0; k < K; ++k)
        acc = _mm256_fmadd_ps(_mm256_maskload_ps(wt + (size_t)k * n + c, mask), _mm256_maskload_ps(taps[k] + c, mask),
                              acc);
      _mm256_maskstore_ps(out + c, mask, silu256(acc));
    }
  }
}

inline __m256 load_part(const float* p, int m) {
  return m >= 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, tail_mask(m));
}
inline void store_part(float* p, __m256 v, int m) {
  if (m >= 8) _mm256_storeu_ps(p, v);
  else _mm256_maskstore_ps(p, tail_mask(m), v);
}

// sum x^2 over n values: two accumulators (even and odd vectors), a fixed order for a given n.
inline float sum_squares(const float* x, int n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  int c = 0;
  for (; c + 16 <= n; c += 16) {
    const __m256 x0 = _mm256_loadu_ps(x + c), x1 = _mm256_loadu_ps(x + c + 8);
    a0 = _mm256_fmadd_ps(x0, x0, a0);
    a1 = _mm256_fmadd_ps(x1, x1, a1);
  }
  for (; c < n; c += 8) {
    const __m256 x0 = load_part(x + c, n - c);
    a0 = _mm256_fmadd_ps(x0, x0, a0);
  }
  return hsum(_mm256_add_ps(a0, a1));
}

void l2_normalize(float* x, int n, float scale) {
  const float inv = scale / __builtin_sqrtf(sum_squares(x, n) + 1e-6f);
  const __m256 vinv = _mm256_set1_ps(inv);
  for (int c = 0; c < n; c += 8) store_part(x + c, _mm256_mul_ps(load_part(x + c, n - c), vinv), n - c);
}

void gated_rms_norm(float* o, const float* z, const float* w, int n, float eps) {
  const float inv = 1.0f / __builtin_sqrtf(sum_squares(o, n) / (float)n + eps);
  const __m256 vinv = _mm256_set1_ps(inv);
  for (int c = 0; c < n; c += 8) {
    const int m = n - c;
    const __m256 y = _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(load_part(o + c, m), vinv), load_part(w + c, m)),
                                   silu256(load_part(z + c, m)));
    store_part(o + c, y, m);
  }
}

// The recurrence works on groups of R (<= 4) state rows (columns j0.. of S), kept in L1 across the
// tokens. Per token and group: two dots per row (S^T k, S^T q: one accumulator each, keys ascending
// in 8-lane steps, then one fixed reduction tree), the scalar delta step, then the rank-1 update.
// dk % 8 == 0.
template <int R>
struct RowGroup {
  float* rows[R];
  float delta[4];

  RowGroup(const DeltaNetRecurrentArgs& a, int j0) {
    for (int r = 0; r < R; ++r) rows[r] = a.state + (size_t)(j0 + r) * a.dk;
  }

  // Dots with k and q, then delta_r = beta (v_r - d S_r.k) and o_r = d S_r.q + delta_r (k.q).
  void dots_and_delta(const DeltaNetRecurrentArgs& a, int t, int j0) {
    const int dk = a.dk;
    const float* q = a.q + (size_t)t * a.qk_stride;
    const float* k = a.k + (size_t)t * a.qk_stride;
    __m256 acc[8];
    for (int x = 0; x < 8; ++x) acc[x] = _mm256_setzero_ps();
    for (int i = 0; i < dk; i += 8) {
      const __m256 kv = _mm256_loadu_ps(k + i), qv = _mm256_loadu_ps(q + i);
      for (int r = 0; r < R; ++r) {
        const __m256 sv = _mm256_loadu_ps(rows[r] + i);
        acc[r] = _mm256_fmadd_ps(sv, kv, acc[r]);
        acc[4 + r] = _mm256_fmadd_ps(sv, qv, acc[4 + r]);
      }
    }
    const __m256 sums = hsum8(acc);  // lanes 0-3: S^T k, lanes 4-7: S^T q
    const __m128 kvs = _mm256_castps256_ps128(sums), sqs = _mm256_extractf128_ps(sums, 1);
    const float* v = a.v + (size_t)t * a.v_stride + j0;
    float vbuf[4] = {0, 0, 0, 0};
    for (int r = 0; r < R; ++r) vbuf[r] = v[r];
    const __m128 d = _mm_set1_ps(a.decay[t]);
    const __m128 del = _mm_mul_ps(_mm_set1_ps(a.beta[t]), _mm_sub_ps(_mm_loadu_ps(vbuf), _mm_mul_ps(d, kvs)));
    const __m128 o = _mm_add_ps(_mm_mul_ps(d, sqs), _mm_mul_ps(del, _mm_set1_ps(a.kq[t])));
    float obuf[4];
    _mm_storeu_ps(delta, del);
    _mm_storeu_ps(obuf, o);
    float* out = a.o + (size_t)t * a.o_stride + j0;
    for (int r = 0; r < R; ++r) out[r] = obuf[r];
  }

  // S_r <- d S_r + delta_r k
  void update(const DeltaNetRecurrentArgs& a, int t) {
    const float* k = a.k + (size_t)t * a.qk_stride;
    const __m256 dd = _mm256_set1_ps(a.decay[t]);
    __m256 del[R];
    for (int r = 0; r < R; ++r) del[r] = _mm256_set1_ps(delta[r]);
    for (int i = 0; i < a.dk; i += 8) {
      const __m256 kv = _mm256_loadu_ps(k + i);
      for (int r = 0; r < R; ++r) {
        float* p = rows[r] + i;
        _mm256_storeu_ps(p, _mm256_fmadd_ps(kv, del[r], _mm256_mul_ps(_mm256_loadu_ps(p), dd)));
      }
    }
  }
};

// Two groups of rows in step, so the scalar part of one (a chain of dependent operations) overlaps
// the dots of the other. The groups are independent: the order changes no result.
template <int RA, int RB>
void recurrent_groups(const DeltaNetRecurrentArgs& a, int j0) {
  RowGroup<RA> ga(a, j0);
  if constexpr (RB == 0) {
    for (int t = 0; t < a.n_tokens; ++t) {
      ga.dots_and_delta(a, t, j0);
      ga.update(a, t);
    }
  } else {
    RowGroup<RB> gb(a, j0 + RA);
    for (int t = 0; t < a.n_tokens; ++t) {
      ga.dots_and_delta(a, t, j0);
      gb.dots_and_delta(a, t, j0 + RA);
      ga.update(a, t);
      gb.update(a, t);
    }
  }
}

void recurrent(const DeltaNetRecurrentArgs& a) {
  int j0 = 0;
  for (; j0 + 8 <= a.dv; j0 += 8) recurrent_groups<4, 4>(a, j0);
  switch (a.dv - j0) {
    case 7: recurrent_groups<4, 3>(a, j0); break;
    case 6: recurrent_groups<4, 2>(a, j0); break;
    case 5: recurrent_groups<4, 1>(a, j0); break;
    case 4: recurrent_groups<4, 0>(a, j0); break;
    case 3: recurrent_groups<3, 0>(a, j0); break;
    case 2: recurrent_groups<2, 0>(a, j0); break;
    case 1: recurrent_groups<1, 0>(a, j0); break;
    default: break;
  }
}

// R rows x 16 columns of C; kMasked: only the first `cols` (< 16) columns are in range. Each output is
// one FMA chain over k ascending, then * alpha (+ C).
template <int R, bool kMasked>
void gemm_tile(int K, const float* A, size_t rsa, size_t ksa, const float* B, size_t ldb, float* C, size_t ldc,
               float alpha, bool accumulate, int cols) {
  __m256 acc0[R], acc1[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc0[r] = acc1[r] = _mm256_setzero_ps();
  const __m256i m0 = tail_mask(cols), m1 = tail_mask(cols - 8);
  for (int k = 0; k < K; ++k) {
    const float* b = B + (size_t)k * ldb;
    const __m256 b0 = kMasked ? _mm256_maskload_ps(b, m0) : _mm256_loadu_ps(b);
    const __m256 b1 = kMasked ? _mm256_maskload_ps(b + 8, m1) : _mm256_loadu_ps(b + 8);
    const float* ak = A + (size_t)k * ksa;
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256 av = _mm256_broadcast_ss(ak + (size_t)r * rsa);
      acc0[r] = _mm256_fmadd_ps(av, b0, acc0[r]);
      acc1[r] = _mm256_fmadd_ps(av, b1, acc1[r]);
    }
  }
  const __m256 va = _mm256_set1_ps(alpha);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    float* c = C + (size_t)r * ldc;
    if (kMasked) {
      __m256 y0 = _mm256_mul_ps(acc0[r], va), y1 = _mm256_mul_ps(acc1[r], va);
      if (accumulate) {
        y0 = _mm256_fmadd_ps(acc0[r], va, _mm256_maskload_ps(c, m0));
        y1 = _mm256_fmadd_ps(acc1[r], va, _mm256_maskload_ps(c + 8, m1));
      }
      _mm256_maskstore_ps(c, m0, y0);
      _mm256_maskstore_ps(c + 8, m1, y1);
    } else {
      __m256 y0 = _mm256_mul_ps(acc0[r], va), y1 = _mm256_mul_ps(acc1[r], va);
      if (accumulate) {
        y0 = _mm256_fmadd_ps(acc0[r], va, _mm256_loadu_ps(c));
        y1 = _mm256_fmadd_ps(acc1[r], va, _mm256_loadu_ps(c + 8));
      }
      _mm256_storeu_ps(c, y0);
      _mm256_storeu_ps(c + 8, y1);
    }
  }
}

template <int R>
void gemm_rows(int K, const float* A, size_t rsa, size_t ksa, const float* B, size_t ldb, float* C, size_t ldc,
               float alpha, bool accumulate, int cols) {
  if (cols >= 16) gemm_tile<R, false>(K, A, rsa, ksa, B, ldb, C, ldc, alpha, accumulate, cols);
  else gemm_tile<R, true>(K, A, rsa, ksa, B, ldb, C, ldc, alpha, accumulate, cols);
}

void gemm(int M, int N, int K, const float* A, size_t rsa, size_t ksa, const float* B, size_t ldb, float* C, size_t ldc,
          float alpha, bool accumulate) {
  for (int n0 = 0; n0 < N; n0 += 16) {
    const int cols = N - n0 < 16 ? N - n0 : 16;
    for (int r0 = 0; r0 < M; r0 += 6) {
      const float* a = A + (size_t)r0 * rsa;
      float* c = C + (size_t)r0 * ldc + n0;
      switch (M - r0 < 6 ? M - r0 : 6) {
        case 6: gemm_rows<6>(K, a, rsa, ksa, B + n0, ldb, c, ldc, alpha, accumulate, cols); break;
        case 5: gemm_rows<5>(K, a, rsa, ksa, B + n0, ldb, c, ldc, alpha, accumulate, cols); break;
        case 4: gemm_rows<4>(K, a, rsa, ksa, B + n0, ldb, c, ldc, alpha, accumulate, cols); break;
        case 3: gemm_rows<3>(K, a, rsa, ksa, B + n0, ldb, c, ldc, alpha, accumulate, cols); break;
        case 2: gemm_rows<2>(K, a, rsa, ksa, B + n0, ldb, c, ldc, alpha, accumulate, cols); break;
        default: gemm_rows<1>(K, a, rsa, ksa, B + n0, ldb, c, ldc, alpha, accumulate, cols); break;
      }
    }
  }
}

}  // namespace

const DeltaNetKernels* delta_net_kernels_avx2() {
  static const DeltaNetKernels k{conv_silu, l2_normalize, recurrent, gemm, gated_rms_norm};
  return &k;
}

}  // namespace roofline::cpu::detail

#else

namespace roofline::cpu::detail {
const DeltaNetKernels* delta_net_kernels_avx2() { return nullptr; }
}  // namespace roofline::cpu::detail

#endif
