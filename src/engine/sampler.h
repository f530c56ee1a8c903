// Token sampling: repetition/presence/frequency penalties, logit bias, then greedy (temperature <= 0)
// or top-k -> typical -> top-p -> min-p -> temperature -> a seeded draw (llama.cpp's default order). The same
// seed, logits and history always give the same token.
#pragma once

#include <cstdint>
#include <random>
#include <utility>
#include <vector>

namespace roofline {

struct SamplingParams {
  float temperature = 0.8f;
  int top_k = 40;            // <= 0: off
  float typical_p = 1.0f;    // >= 1: off (locally typical sampling, llama.cpp's --typical)
  float top_p = 0.95f;       // >= 1: off
  float min_p = 0.05f;       // <= 0: off
  float repeat_penalty = 1.0f;  // 1: off (llama.cpp: divide positive logits, multiply negative ones)
  int repeat_last_n = 64;       // history window for the penalties (-1: all, 0: off)
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  uint64_t seed = 0xFFFFFFFFu;  // 0xFFFFFFFF: a random seed
  std::vector<std::pair<int32_t, float>> logit_bias;  // added to the logit; -inf bans the token
};

// One candidate after sampling: token, its probability after the chain (1 for greedy's pick).
struct SampledToken {
  int32_t token = -1;
  float probability = 0;
};

class Sampler {
 public:
  Sampler(const SamplingParams& params, int n_vocab);

  // Picks the next token from raw logits (n_vocab floats) given the tokens so far in the sequence
  // (prompt and generated; penalties look at the last repeat_last_n of them).
  SampledToken sample(const float* logits, const std::vector<int32_t>& history);

  const SamplingParams& params() const { return params_; }
  uint64_t seed() const { return seed_; }

 private:
  SamplingParams params_;
  int n_vocab_;
  uint64_t seed_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> candidates_;
  std::vector<float> adjusted_;
};

// Applies the penalties and bias to a copy of the logits (exposed for tests and logprobs).
void apply_penalties(std::vector<float>& logits, const SamplingParams& params, const std::vector<int32_t>& history);
// Whether apply_penalties would change any logit for this history.
bool penalties_apply(const SamplingParams& params, const std::vector<int32_t>& history);

// Greedy pick: the lowest id among the largest of n logits (n > 0), exactly as the scalar scan
// `best = 0; for i: if (x[i] > x[best]) best = i` (NaNs are never picked unless x[0] is one).
// Vectorizable, no copy: what the sampler and the engine's host-side argmax use.
int32_t argmax_logits(const float* logits, int n);
// Whether any of the 16 values at p is greater than t (NaN never is): how the top-k scans (the sampler's,
// the log-probabilities') pass over blocks of logits that cannot enter.
bool any_above16(const float* p, float t);
// The greedy token among the allowed ones (bit t of allowed[t / 64]): the largest finite logit, the
// lowest id on ties; -1 when no allowed token has a logit above -infinity (NaNs never win).
int32_t argmax_allowed(const float* logits, int n, const uint64_t* allowed);
// Whether a request with these parameters samples greedily from the raw logits, so that the argmax
// alone (which a backend may compute on the device) decides its tokens: temperature <= 0 and no
// logit bias or penalties.
bool greedy_from_raw_logits(const SamplingParams& params);

}  // namespace roofline
