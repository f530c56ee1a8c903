// The speculative-decoding driver the engine tests share (CPU and GPU): a prompt, then greedy rounds of
// SpeculativeDecoder with an optional drafter until n tokens are out, checking each round's progress.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "engine/engine.h"
#include "engine/sampler.h"
#include "engine/speculative.h"

namespace roofline::test {

// The n greedy tokens after `prompt` (drafter may be nullptr); each round emits at least one token, never
// past n, and leaves the target holding every token but the pending one (or fewer, to feed again).
inline std::vector<int32_t> greedy_speculative(Engine& target, Drafter* drafter, const std::vector<int32_t>& prompt, int n,
                                               DraftStats* stats = nullptr) {
  const int seq = target.memory().create_sequence(false);
  SpeculativeDecoder decoder(target, drafter);
  std::vector<float> logits = decoder.prefill(seq, prompt);
  std::vector<int32_t> history = prompt;
  history.push_back(argmax_logits(logits.data(), target.n_vocab()));
  std::vector<int32_t> out{history.back()};
  SamplingParams sp;
  sp.temperature = 0;
  Sampler sampler(sp, target.n_vocab());
  while ((int)out.size() < n) {
    const size_t before = out.size();
    decoder.round(seq, history, n - (int)out.size(), sampler, true, out);
    EXPECT_GT(out.size(), before);
    EXPECT_LE((int)out.size(), n);
    EXPECT_LE(target.memory().length(seq) + 1, (int)history.size());
  }
  if (stats) *stats = decoder.stats();
  decoder.release(seq);
  target.memory().free_sequence(seq);
  return out;
}

}  // namespace roofline::test
