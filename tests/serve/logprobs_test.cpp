// compute_logprobs (serve/logprobs.cpp) against a plainly written double-precision log-softmax and top-k:
// vocabularies from 1 to 151936 logits (the vectorized passes and their tails), -inf logits, coarse values
// with many ties (the lower id first), k from 0 to past the vocabulary.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "serve/scheduler.h"

namespace roofline::serve {
namespace {

struct Reference {
  double lse = 0;
  std::vector<int32_t> top;  // best first, ties by id
};

Reference reference(const std::vector<float>& l, int k) {
  Reference r;
  double mx = -INFINITY;
  for (float v : l) mx = std::max(mx, (double)v);
  double sum = 0;
  for (float v : l) sum += std::exp((double)v - mx);
  r.lse = mx + std::log(sum);
  std::vector<int32_t> ids(l.size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = (int32_t)i;
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return l[(size_t)a] > l[(size_t)b]; });
  ids.resize(std::min<size_t>(ids.size(), (size_t)std::max(k, 0)));
  r.top = ids;
  return r;
}

TEST(LogprobsTest, MatchesADoubleLogSoftmaxAndTopK) {
  std::mt19937 g(11);
  const int sizes[] = {1, 7, 16, 17, 33, 1000, 4099, 151936};
  for (int trial = 0; trial < 48; ++trial) {
    const int n = sizes[trial % 8];
    std::vector<float> l((size_t)n);
    const bool coarse = trial % 3 == 0;  // many ties
    std::normal_distribution<float> normal(0.0f, 4.0f);
    for (float& v : l) v = coarse ? (float)(g() % 32) / 4.0f - 4.0f : normal(g);
    if (n > 4)
      for (int i = 0; i < n / 20 + 1; ++i) l[g() % (uint32_t)n] = -std::numeric_limits<float>::infinity();
    if (trial % 5 == 0) l[g() % (uint32_t)n] = 60.0f;  // one far above: most terms tiny
    const int ks[] = {0, 1, 5, 20, n + 3};
    const int k = ks[trial % 5];
    const int32_t token = (int32_t)(g() % (uint32_t)n);
    const TokenLogprob got = compute_logprobs(l.data(), n, token, k);
    const Reference want = reference(l, k);
    SCOPED_TRACE(testing::Message() << "trial " << trial << ", n " << n << ", k " << k);
    ASSERT_EQ(got.token, token);
    const double want_lp = (double)l[(size_t)token] - want.lse;
    if (std::isinf(want_lp)) EXPECT_TRUE(std::isinf(got.logprob) && got.logprob < 0);
    else EXPECT_NEAR(got.logprob, want_lp, 2e-6 * std::max(1.0, std::fabs(want_lp)));
    ASSERT_EQ(got.top.size(), want.top.size());
    for (size_t i = 0; i < want.top.size(); ++i) {
      EXPECT_EQ(got.top[i].token, want.top[i]) << "rank " << i;
      const double w = (double)l[(size_t)want.top[i]] - want.lse;
      if (!std::isinf(w)) EXPECT_NEAR(got.top[i].logprob, w, 2e-6 * std::max(1.0, std::fabs(w))) << "rank " << i;
    }
  }
}

}  // namespace
}  // namespace roofline::serve
