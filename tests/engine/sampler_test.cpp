// The sampler: greedy, the truncations (top-k, top-p, min-p), temperature, penalties and bias, and
// determinism for a seed; the draw's frequencies follow the softmax.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "core/error.h"
#include "engine/sampler.h"

using namespace roofline;

namespace {
std::vector<float> logits_of(std::initializer_list<float> l) { return std::vector<float>(l); }

// The chain written plainly (no penalties, no typical-p): every finite logit a candidate, the whole list
// sorted (logit descending, then id), cut to top-k, then top-p and min-p on the softmax of what is left,
// and the draw at the temperature with the sampler's generator and seed.
SampledToken reference_sample(const std::vector<float>& l, const SamplingParams& p) {
  std::vector<std::pair<float, int32_t>> c;
  for (int32_t i = 0; i < (int32_t)l.size(); ++i)
    if (l[i] > -std::numeric_limits<float>::infinity()) c.push_back({l[i], i});
  if (c.empty()) return {0, 0.0f};
  std::sort(c.begin(), c.end(), [](const auto& a, const auto& b) { return a.first != b.first ? a.first > b.first : a.second < b.second; });
  if (p.top_k > 0 && (size_t)p.top_k < c.size()) c.resize((size_t)p.top_k);
  const double mx = c[0].first;
  std::vector<double> prob;
  double sum = 0;
  for (const auto& x : c) sum += prob.emplace_back(std::exp((double)x.first - mx));
  for (double& v : prob) v /= sum;
  size_t n = c.size();
  if (p.top_p < 1.0f) {
    double cum = 0;
    for (size_t i = 0; i < n; ++i)
      if ((cum += prob[i]) >= p.top_p) {
        n = i + 1;
        break;
      }
  }
  if (p.min_p > 0.0f) {
    size_t keep = 1;
    while (keep < n && prob[keep] >= prob[0] * p.min_p) ++keep;
    n = keep;
  }
  std::vector<double> w(n);
  double wsum = 0;
  for (size_t i = 0; i < n; ++i) wsum += w[i] = std::exp(((double)c[i].first - mx) / p.temperature);
  std::mt19937_64 rng(p.seed);
  const double u = std::uniform_real_distribution<double>(0.0, wsum)(rng);
  double cum = 0;
  for (size_t i = 0; i < n; ++i)
    if (u < (cum += w[i])) return {c[i].second, (float)(w[i] / wsum)};
  return {c[n - 1].second, (float)(w[n - 1] / wsum)};
}
}  // namespace

TEST(SamplerTest, GreedyAndTies) {
  SamplingParams p;
  p.temperature = 0;
  Sampler s(p, 5);
  auto l = logits_of({0.1f, 2.0f, -1.0f, 2.0f, 0.5f});
  EXPECT_EQ(s.sample(l.data(), {}).token, 1) << "ties go to the lower id";
  p.temperature = -1;  // negative means greedy
  Sampler g(p, 5);
  EXPECT_EQ(g.sample(l.data(), {}).token, 1);
}

// argmax_allowed (constrained greedy decoding) against a plain scan over the allowed tokens: the first of
// the largest finite values among them, -1 if there is none; masks sparse, dense, whole words, empty.
TEST(SamplerTest, ArgmaxAllowedPicksTheBestAllowedToken) {
  uint64_t r = 987;
  auto next = [&] { return r = r * 6364136223846793005ull + 1442695040888963407ull; };
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  int none = 0, whole_words = 0;
  for (int trial = 0; trial < 600; ++trial) {
    const int n = 1 + (int)(next() >> 33) % 400;
    std::vector<float> x((size_t)n);
    for (float& v : x) v = (float)((next() >> 40) % 7) - 3.0f;  // many ties
    for (int k = 0; k < trial % 5; ++k) x[(next() >> 33) % n] = k % 2 ? nan : -inf;
    std::vector<uint64_t> m(((size_t)n + 63) / 64, 0);
    const int kind = trial % 4;
    for (int t = 0; t < n; ++t) {
      const bool ok = kind == 0 ? (next() >> 40) % 9 == 0 : kind == 1 ? (next() >> 40) % 5 != 0 : kind == 2 ? t < 128 : false;
      if (ok) m[(size_t)t / 64] |= 1ull << (t % 64);
    }
    int32_t want = -1;
    for (int t = 0; t < n; ++t)
      if ((m[(size_t)t / 64] >> (t % 64) & 1) && x[(size_t)t] > (want < 0 ? -inf : x[(size_t)want])) want = t;
    none += want < 0;
    whole_words += kind == 2 && n >= 64;
    EXPECT_EQ(argmax_allowed(x.data(), n, m.data()), want) << "trial " << trial;
  }
  EXPECT_GT(none, 100);
  EXPECT_GT(whole_words, 50);
}

// The vectorized argmax picks exactly what the scalar scan picks: the first of the largest values,
// NaNs skipped unless the first value is one, -0 equal to +0, any length (not only whole lanes).
TEST(SamplerTest, ArgmaxEqualsTheScalarScan) {
  auto scalar = [](const std::vector<float>& x) {
    int32_t best = 0;
    for (int32_t i = 1; i < (int32_t)x.size(); ++i)
      if (x[i] > x[best]) best = i;
    return best;
  };
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const std::vector<std::vector<float>> fixed = {
      {1.0f},
      {nan, 5.0f, 7.0f},
      {1.0f, nan, 7.0f, nan},
      {-0.0f, 0.0f},
      {-1.0f, -0.0f, 0.0f, -0.0f},
      {-inf, -inf, -inf},
      {-inf, inf, inf},
      {nan, nan},
  };
  for (const auto& x : fixed) EXPECT_EQ(argmax_logits(x.data(), (int)x.size()), scalar(x));
  uint64_t r = 12345;
  auto next = [&] { return r = r * 6364136223846793005ull + 1442695040888963407ull; };
  for (int trial = 0; trial < 400; ++trial) {
    const int n = 1 + (int)(next() >> 33) % 300;
    std::vector<float> x((size_t)n);
    for (float& v : x) v = (float)((next() >> 40) % 7) - 3.0f;  // few distinct values: many ties
    for (int k = 0; k < trial % 4; ++k) x[(next() >> 33) % n] = k % 2 ? nan : -0.0f;
    ASSERT_EQ(argmax_logits(x.data(), n), scalar(x)) << "trial " << trial;
  }
}

TEST(SamplerTest, GreedyFromRawLogits) {
  SamplingParams p;
  p.temperature = 0;
  EXPECT_TRUE(greedy_from_raw_logits(p));
  p.logit_bias = {{1, 1.0f}};
  EXPECT_FALSE(greedy_from_raw_logits(p));
  p.logit_bias.clear();
  p.repeat_penalty = 1.1f;
  EXPECT_FALSE(greedy_from_raw_logits(p));
  p.repeat_last_n = 0;  // the penalty looks at no history
  EXPECT_TRUE(greedy_from_raw_logits(p));
  p.temperature = 0.7f;
  EXPECT_FALSE(greedy_from_raw_logits(p));
}

TEST(SamplerTest, TruncationsLeaveOnlyTheTop) {
  auto l = logits_of({1.0f, 5.0f, 4.9f, 0.0f, 3.0f});
  for (int seed = 0; seed < 50; ++seed) {
    SamplingParams p;
    p.temperature = 1.0f;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.seed = (uint64_t)seed;
    p.top_k = 1;
    EXPECT_EQ(Sampler(p, 5).sample(l.data(), {}).token, 1);
    p.top_k = 2;
    const int t = Sampler(p, 5).sample(l.data(), {}).token;
    EXPECT_TRUE(t == 1 || t == 2);
    p.top_k = 0;
    p.top_p = 0.3f;  // the top token alone has p ~0.5
    EXPECT_EQ(Sampler(p, 5).sample(l.data(), {}).token, 1);
    p.top_p = 1.0f;
    p.min_p = 0.5f;  // keeps tokens with p >= 0.5 * p_max: ids 1 and 2
    const int m = Sampler(p, 5).sample(l.data(), {}).token;
    EXPECT_TRUE(m == 1 || m == 2);
  }
}

// The sampler's one-pass top-k gives the plain chain's token and probability: rows with ties, -inf and NaN
// logits, k below, at and above the finite count, with and without top-p and min-p, many seeds.
TEST(SamplerTest, TopKInOnePassMatchesTheSortedChain) {
  std::mt19937 g(7);
  for (int trial = 0; trial < 400; ++trial) {
    const int n_vocab = 1 + (int)(g() % 3000);
    std::vector<float> l((size_t)n_vocab);
    for (float& v : l) v = (float)(g() % 64) / 8.0f - 4.0f;  // coarse values: many ties
    for (int i = 0; i < n_vocab / 10; ++i) l[g() % (uint32_t)n_vocab] = -std::numeric_limits<float>::infinity();
    if (trial % 7 == 0) l[g() % (uint32_t)n_vocab] = std::nanf("");
    SamplingParams p;
    const int ks[] = {1, 2, 40, n_vocab - 1, n_vocab, n_vocab + 5};
    p.top_k = ks[trial % 6];
    p.top_p = trial % 3 == 0 ? 1.0f : 0.9f;
    p.min_p = trial % 4 == 0 ? 0.0f : 0.05f;
    p.temperature = 0.5f + (float)(trial % 5) * 0.3f;
    p.seed = 1000 + (uint64_t)trial;
    Sampler s(p, n_vocab);
    const SampledToken got = s.sample(l.data(), {}), want = reference_sample(l, p);
    ASSERT_EQ(got.token, want.token) << "trial " << trial << ", vocab " << n_vocab << ", top_k " << p.top_k;
    ASSERT_EQ(got.probability, want.probability) << "trial " << trial;
  }
}

TEST(SamplerTest, DeterministicPerSeed) {
  std::vector<float> l(1000);
  for (size_t i = 0; i < l.size(); ++i) l[i] = std::sin((float)i) * 3;
  SamplingParams p;
  p.seed = 1234;
  Sampler a(p, 1000), b(p, 1000);
  std::vector<int32_t> ta, tb;
  for (int i = 0; i < 100; ++i) {
    ta.push_back(a.sample(l.data(), ta).token);
    tb.push_back(b.sample(l.data(), tb).token);
  }
  EXPECT_EQ(ta, tb);
  p.seed = 1235;
  Sampler c(p, 1000);
  std::vector<int32_t> tc;
  for (int i = 0; i < 100; ++i) tc.push_back(c.sample(l.data(), tc).token);
  EXPECT_NE(ta, tc);
}

TEST(SamplerTest, FrequenciesFollowTheSoftmaxAtTemperature) {
  auto l = logits_of({0.0f, 1.0f, 2.0f});
  SamplingParams p;
  p.top_k = 0;
  p.top_p = 1;
  p.min_p = 0;
  p.temperature = 2.0f;
  p.seed = 7;
  Sampler s(p, 3);
  int counts[3] = {};
  const int n = 30000;
  for (int i = 0; i < n; ++i) counts[s.sample(l.data(), {}).token]++;
  double z = 0;
  for (float x : l) z += std::exp(x / 2.0);
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(counts[i] / (double)n, std::exp(l[i] / 2.0) / z, 0.015) << i;
}

TEST(SamplerTest, PenaltiesAndBias) {
  SamplingParams p;
  p.repeat_penalty = 2.0f;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  p.repeat_last_n = 3;
  std::vector<float> l = {4.0f, -2.0f, 1.0f, 1.0f};
  apply_penalties(l, p, {3, 0, 1, 1});  // window: 0, 1, 1
  EXPECT_FLOAT_EQ(l[0], 4.0f / 2 - 0.25f - 0.5f);
  EXPECT_FLOAT_EQ(l[1], -2.0f * 2 - 2 * 0.25f - 0.5f);
  EXPECT_FLOAT_EQ(l[2], 1.0f);
  EXPECT_FLOAT_EQ(l[3], 1.0f) << "outside the window";
  SamplingParams b;
  b.temperature = 0;
  b.logit_bias = {{1, -std::numeric_limits<float>::infinity()}, {2, 10.0f}};
  auto x = logits_of({0.0f, 9.0f, 0.5f});
  EXPECT_EQ(Sampler(b, 3).sample(x.data(), {}).token, 2);
}

TEST(SamplerTest, BadParameters) {
  SamplingParams p;
  p.temperature = std::nanf("");
  EXPECT_THROW(Sampler(p, 3), Error);
  p = {};
  p.repeat_penalty = 0;
  EXPECT_THROW(Sampler(p, 3), Error);
  EXPECT_THROW(Sampler({}, 0), Error);
}
