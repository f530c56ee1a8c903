// Locally typical sampling (--typical / typical_p), as llama.cpp's typical sampler: the tokens whose
// surprise is closest to the distribution's entropy are kept until their mass exceeds p, so the most
// probable token can be left out; p = 1 keeps everything.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "engine/sampler.h"

namespace roofline {
namespace {

TEST(SamplerTypical, KeepsTheTokensNearTheEntropy) {
  // p = 0.5, 0.2, 0.2, 0.1: entropy 1.22 nats; surprises 0.69, 1.61, 1.61, 2.30. Closest first: 1 and 2
  // (0.4 of the mass), then 0, then 3. With typical_p 0.3 only tokens 1 and 2 remain.
  const float logits[4] = {std::log(0.5f), std::log(0.2f), std::log(0.2f), std::log(0.1f)};
  auto draws = [&](float typical_p) {
    std::set<int32_t> seen;
    for (uint64_t seed = 1; seed <= 400; ++seed) {
      SamplingParams sp;
      sp.temperature = 1;
      sp.top_k = 0;
      sp.top_p = 1;
      sp.min_p = 0;
      sp.typical_p = typical_p;
      sp.seed = seed;
      Sampler s(sp, 4);
      seen.insert(s.sample(logits, {}).token);
    }
    return seen;
  };
  EXPECT_EQ(draws(0.3f), (std::set<int32_t>{1, 2}));
  EXPECT_EQ(draws(0.45f), (std::set<int32_t>{0, 1, 2}));  // 0.4 < 0.45: token 0 joins
  EXPECT_EQ(draws(1.0f), (std::set<int32_t>{0, 1, 2, 3}));
}

}  // namespace
}  // namespace roofline
