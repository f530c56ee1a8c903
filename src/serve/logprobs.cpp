// Token log-probabilities for `logprobs` / `n_probs`: the log-softmax of the raw logits at the sampled
// token and the most likely tokens (declared in scheduler.h beside TokenLogprob).
//
// A full vocabulary a row (152k for Qwen), for every row that asks, on the scheduler's thread: so the three
// passes are written for the vector units: the maximum, exp(l - max) in float by a polynomial (relative error
// ~1e-7; blocks of 16 summed in float, the blocks in double), and the top k with blocks of 16 that cannot
// enter passed over (any_above16).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "engine/sampler.h"
#include "serve/scheduler.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace roofline::serve {
namespace {

// exp(x) for x <= 0 (and NaN: NaN), branch-free so that loops of it vectorize: x = n ln2 + r with
// |r| <= ln2 / 2, e^r by its Taylor polynomial to r^7 / 7! (relative error ~1e-7 there), times 2^n built in
// the exponent bits; 0 below -87 (where float's normal range ends).
inline float exp_nonpositive(float x) {
  const float xc = x < -87.0f ? -87.0f : x;  // (NaN stays NaN: the comparison is false)
  const float kRound = 12582912.0f;          // 1.5 * 2^23: adding it rounds to an integer
  const float n = (xc * 1.44269504088896341f + kRound) - kRound;
  const float r = (xc - n * 0.693145751953125f) - n * 1.42860682030941723212e-6f;  // ln2 in two parts
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t bits = ((int32_t)n + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return x < -87.0f ? 0.0f : p * scale;
}

#if defined(__SSE2__)
// exp_nonpositive on four lanes (the same steps; SSE2 is every x86-64's, and GCC left the scalar loops
// unvectorized).
inline __m128 exp4_nonpositive(__m128 x) {
  const __m128 lo = _mm_set1_ps(-87.0f), round = _mm_set1_ps(12582912.0f);
  const __m128 under = _mm_cmplt_ps(x, lo);
  const __m128 xc = _mm_max_ps(lo, x);  // NaN stays NaN (max_ps returns its second operand then)
  const __m128 n = _mm_sub_ps(_mm_add_ps(_mm_mul_ps(xc, _mm_set1_ps(1.44269504088896341f)), round), round);
  const __m128 r = _mm_sub_ps(_mm_sub_ps(xc, _mm_mul_ps(n, _mm_set1_ps(0.693145751953125f))),
                              _mm_mul_ps(n, _mm_set1_ps(1.42860682030941723212e-6f)));
  __m128 p = _mm_set1_ps(1.0f / 5040.0f);
  p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(1.0f / 720.0f));
  p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(1.0f / 120.0f));
  p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(1.0f / 24.0f));
  p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(1.0f / 6.0f));
  p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(0.5f));
  p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(1.0f));
  p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(1.0f));
  const __m128i bits = _mm_slli_epi32(_mm_add_epi32(_mm_cvtps_epi32(n), _mm_set1_epi32(127)), 23);
  return _mm_andnot_ps(under, _mm_mul_ps(p, _mm_castsi128_ps(bits)));
}
#endif

// The largest logit (NaNs skipped; -inf when all are -inf or NaN).
float max_logit(const float* x, int n) {
  float mx = -std::numeric_limits<float>::infinity();
  int i = 0;
#if defined(__SSE2__)
  __m128 m0 = _mm_set1_ps(mx), m1 = m0, m2 = m0, m3 = m0;  // max_ps(v, m) keeps m where v is NaN
  for (; i + 16 <= n; i += 16) {
    m0 = _mm_max_ps(_mm_loadu_ps(x + i), m0);
    m1 = _mm_max_ps(_mm_loadu_ps(x + i + 4), m1);
    m2 = _mm_max_ps(_mm_loadu_ps(x + i + 8), m2);
    m3 = _mm_max_ps(_mm_loadu_ps(x + i + 12), m3);
  }
  float lanes[4];
  _mm_storeu_ps(lanes, _mm_max_ps(_mm_max_ps(m0, m1), _mm_max_ps(m2, m3)));
  for (float v : lanes) mx = v > mx ? v : mx;
#endif
  for (; i < n; ++i) mx = x[i] > mx ? x[i] : mx;
  return mx;
}

// sum of exp(x[i] - mx): blocks of 16 summed in float, the blocks in double.
double sum_exp(const float* x, int n, float mx) {
  double sum = 0;
  int i = 0;
#if defined(__SSE2__)
  const __m128 m = _mm_set1_ps(mx);
  __m128d acc = _mm_setzero_pd();
  for (; i + 16 <= n; i += 16) {
    const __m128 a = _mm_add_ps(exp4_nonpositive(_mm_sub_ps(_mm_loadu_ps(x + i), m)),
                                exp4_nonpositive(_mm_sub_ps(_mm_loadu_ps(x + i + 4), m)));
    const __m128 b = _mm_add_ps(exp4_nonpositive(_mm_sub_ps(_mm_loadu_ps(x + i + 8), m)),
                                exp4_nonpositive(_mm_sub_ps(_mm_loadu_ps(x + i + 12), m)));
    const __m128 s = _mm_add_ps(a, b);
    acc = _mm_add_pd(acc, _mm_add_pd(_mm_cvtps_pd(s), _mm_cvtps_pd(_mm_movehl_ps(s, s))));
  }
  double lanes[2];
  _mm_storeu_pd(lanes, acc);
  sum = lanes[0] + lanes[1];
#endif
  for (; i < n; ++i) sum += (double)exp_nonpositive(x[i] - mx);
  return sum;
}

}  // namespace

TokenLogprob compute_logprobs(const float* logits, int n_vocab, int32_t token, int k) {
  const float mx = max_logit(logits, n_vocab);
  const double lse = (double)mx + std::log(sum_exp(logits, n_vocab, mx));
  TokenLogprob out;
  out.token = token;
  out.logprob = (float)((double)logits[token] - lse);
  k = std::min(k, n_vocab);
  if (k > 0) {
    std::vector<std::pair<float, int32_t>> top;  // kept sorted, best first
    top.reserve(k + 1);
    const auto offer = [&](int i) {
      const float l = logits[i];
      if ((int)top.size() == k && !(l > top.back().first)) return;
      auto pos = std::upper_bound(top.begin(), top.end(), std::make_pair(l, (int32_t)i),
                                  [](const auto& a, const auto& b) { return a.first != b.first ? a.first > b.first : a.second < b.second; });
      top.insert(pos, {l, (int32_t)i});
      if ((int)top.size() > k) top.pop_back();
    };
    int i = 0;
    for (; i < n_vocab && (int)top.size() < k; ++i) offer(i);
    // Full: only a logit above the worst kept one enters (ids ascend, so an equal one never does).
    for (; i + 16 <= n_vocab; i += 16)
      if (any_above16(logits + i, top.back().first))
        for (int j = i; j < i + 16; ++j) offer(j);
    for (; i < n_vocab; ++i) offer(i);
    for (const auto& [l, id] : top) out.top.push_back({id, (float)((double)l - lse)});
  }
  return out;
}

}  // namespace roofline::serve
