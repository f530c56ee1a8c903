// The scheduler's per-request state (a request's choices and what each carries from step to step),
// shared by the scheduler's source files (scheduler.cpp, scheduler_drafts.cpp). Private to them.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <vector>

#include "serve/grammar_matcher.h"
#include "serve/scheduler.h"
#include "serve/text_stream.h"

namespace roofline::serve {

using Clock = std::chrono::steady_clock;
inline constexpr int32_t kNotSampled = -2;  // Choice::presampled: no token picked ahead

struct Scheduler::Choice {
  int index = 0;
  int seq = -1;
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<GrammarMatcher> grammar;  // constrained decoding: where the output is in the grammar
  int32_t presampled = kNotSampled;  // its next token, when the step's sampled rows were drawn together
  std::optional<TokenLogprob> prelogprobs;  // with presampled, its log-probabilities (where the request asks)
  std::vector<uint64_t> allowed;  // the grammar's mask for the row in flight (a greedy constrained choice)
  std::vector<int32_t> history;  // prompt + generated (the last one not yet in the KV cache)
  int32_t pending = -1;
  int n_generated = 0;
  int promised = 0;  // KV blocks it may still allocate from the request's reservation
  TextStream text;
  bool finished = false;
  Clock::time_point t_last;
  // Speculative decoding: the drafts riding the step in flight after `pending`, the blocks its rows took
  // beyond the reservation, and while they are verified the positions known to hold accepted tokens
  // (-1: all), so a choice ending half-way caches no rejected draft.
  std::vector<int32_t> drafts;
  int step_extra = 0;
  int kv_valid = -1;
};

struct Scheduler::Active {
  std::shared_ptr<Request> request;
  GenParams params;
  std::vector<Choice> choices;  // choice 0 from admission, the others forked after the prompt
  std::vector<int> slots;
  int n_prompt_done = 0;  // prompt positions in choice 0's KV (adopted + evaluated)
  int n_cached = 0;
  int max_gen = 0;
  int fork_promise = 0;   // blocks each not-yet-forked choice may allocate
  std::unique_ptr<PromptPooler> pooler;  // embedding requests
  bool greedy = false;    // its tokens are the argmax of the raw logits (the step may pick them)
  bool grammar_greedy = false;  // constrained and greedy: the step picks the argmax its grammar allows
  bool prefilling = true;
  bool failed = false;
  int draft_n = 0, draft_accepted = 0;  // speculative decoding, over all choices
  Clock::time_point t_submit, t_admit, t_first, t_last;
};

}  // namespace roofline::serve
