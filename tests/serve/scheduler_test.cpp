// The scheduler on a fake backend (scripted logits, a real KV cache): greedy output alone equals
// output under load, chunked prefill interleaves with decode rows, decode fairness, admission by KV
// blocks, queue full -> 503, never fits -> 400, cancel, KV accounting, prefix reuse, n > 1 forks,
// stop strings across tokens, logprobs, step failures; seeded sampling alone equals sampling under load.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <functional>
#include <set>
#include <thread>

#include "fake_runner.h"
#include "scheduler_runs.h"
#include "serve/grammar.h"
#include "serve/scheduler.h"

using namespace roofline;
using namespace roofline::serve;
using roofline::serve::test::FakeRunner;
using roofline::serve::test::FakeText;
using roofline::serve::test::greedy_request;

namespace {

struct Outcome {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::string> text;
  std::vector<Finish> finish;
  std::vector<std::string> stop_word;
  std::vector<std::vector<TokenLogprob>> logprobs;
  std::string error;  // of a choice that ended with Finish::Error
  bool done = false;
  Timings timings;
};

void drain_into(Request& r, Outcome& o, int n) {
  if ((int)o.tokens.size() < n) {
    o.tokens.resize(n);
    o.text.resize(n);
    o.finish.resize(n, Finish::None);
    o.stop_word.resize(n);
    o.logprobs.resize(n);
  }
  std::vector<Event> events;
  o.done = r.poll(events, std::chrono::milliseconds(0));
  for (Event& e : events) {
    o.tokens[e.choice].insert(o.tokens[e.choice].end(), e.tokens.begin(), e.tokens.end());
    o.text[e.choice] += e.text;
    o.logprobs[e.choice].insert(o.logprobs[e.choice].end(), e.logprobs.begin(), e.logprobs.end());
    if (e.finish != Finish::None) {
      o.finish[e.choice] = e.finish;
      o.stop_word[e.choice] = e.stop_word;
      if (e.finish == Finish::Error) o.error = e.error;
    }
  }
  if (o.done) o.timings = r.timings();
}

// Steps until every request is done; returns the outcomes in order.
std::vector<Outcome> run_all(Scheduler& s, const std::vector<std::shared_ptr<Request>>& reqs, const std::vector<int>& n_choices,
                             int max_steps = 5000) {
  std::vector<Outcome> out(reqs.size());
  for (int i = 0; i < max_steps; ++i) {
    bool all = true;
    for (size_t k = 0; k < reqs.size(); ++k) {
      drain_into(*reqs[k], out[k], n_choices[k]);
      all = all && out[k].done;
    }
    if (all) return out;
    s.step();
  }
  ADD_FAILURE() << "requests did not finish";
  return out;
}

std::vector<int32_t> prompt_of(int n, int salt) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back((int32_t)(1 + (i * 7 + salt * 13) % 60));
  return t;
}

// The tokens of request i (params(i)) run alone on a fresh scheduler, for i < n.
std::vector<std::vector<int32_t>> tokens_alone(const std::function<GenParams(int)>& params, int n) {
  std::vector<std::vector<int32_t>> alone;
  for (int i = 0; i < n; ++i) {
    FakeRunner runner;
    FakeText text;
    Scheduler s(runner, text, {});
    auto r = s.submit(params(i));
    alone.push_back(run_all(s, {r}, {1})[0].tokens[0]);
  }
  return alone;
}

// The n requests submitted at once to a scheduler of `slots` slots on `runner`; their outcomes.
std::vector<Outcome> run_together(FakeRunner& runner, int slots, const std::function<GenParams(int)>& params, int n) {
  FakeText text;
  SchedulerOptions o;
  o.n_slots = slots;
  o.queue_size = 16;
  Scheduler s(runner, text, o);
  std::vector<std::shared_ptr<Request>> reqs;
  for (int i = 0; i < n; ++i) reqs.push_back(s.submit(params(i)));
  return run_all(s, reqs, std::vector<int>(n, 1));
}

}  // namespace

TEST(SchedulerTest, GreedyRequestRunsToMaxTokensAndFreesItsBlocks) {
  FakeRunner runner;
  FakeText text;
  Scheduler s(runner, text, {});
  auto r = s.submit(greedy_request(prompt_of(10, 1), 6));
  auto out = run_all(s, {r}, {1});
  ASSERT_EQ(out[0].tokens[0].size(), 6u);
  EXPECT_EQ(out[0].finish[0], Finish::Length);
  std::string pieces;
  for (int32_t t : out[0].tokens[0]) pieces += text.piece(t);
  EXPECT_EQ(out[0].text[0], pieces);
  EXPECT_EQ(out[0].timings.n_prompt, 10);
  EXPECT_EQ(out[0].timings.n_generated, 6);
  EXPECT_EQ(runner.memory().used_blocks(), 0);
  EXPECT_GT(runner.memory().cached_blocks(), 0);  // the prompt (and output) blocks stay cached
}

TEST(SchedulerTest, GreedyOutputAloneEqualsOutputUnderLoad) {
  const int n = 9;
  auto params = [](int i) { return greedy_request(prompt_of(3 + i * 5, i), 12); };
  const auto alone = tokens_alone(params, n);
  // All together: 4 slots, small batch so prompts are chunked and requests queue.
  FakeRunner runner(64, 128, 4, 8);
  const auto out = run_together(runner, 4, params, n);
  for (int i = 0; i < n; ++i) EXPECT_EQ(out[i].tokens[0], alone[i]) << "request " << i;
  EXPECT_EQ(runner.memory().used_blocks(), 0);
  // Steps mixed prefill chunks with decode rows of other sequences.
  bool mixed = false;
  for (const auto& step : runner.steps) {
    int want = 0;
    for (const auto& row : step) want += row.want_logits;
    if (want >= 1 && step.size() > (size_t)want + 1) mixed = true;
  }
  EXPECT_TRUE(mixed);
}

// Seeded sampling (top-k, top-p, min-p, a repeat penalty on some): a request's tokens under load, where the
// step's sampled rows are drawn together on the sampling pool (presample_rows), are its tokens alone.
TEST(SchedulerTest, SeededSamplingAloneEqualsSamplingUnderLoad) {
  auto sampled = [](int i) {
    GenParams p = greedy_request(prompt_of(3 + i * 5, i), 12, "s" + std::to_string(i));
    p.sampling.temperature = 0.7f + 0.1f * (float)(i % 3);
    p.sampling.top_k = i % 2 ? 40 : 0;
    p.sampling.top_p = 0.95f;
    p.sampling.min_p = i % 3 ? 0.05f : 0.0f;
    if (i % 4 == 1) p.sampling.repeat_penalty = 1.2f;
    p.sampling.seed = 100 + (uint64_t)i;
    return p;
  };
  const int n = 9;
  const auto alone = tokens_alone(sampled, n);
  FakeRunner runner(64, 128, 8, 16);
  const auto out = run_together(runner, 8, sampled, n);
  for (int i = 0; i < n; ++i) EXPECT_EQ(out[i].tokens[0], alone[i]) << "request " << i;
  std::set<std::vector<int32_t>> distinct(alone.begin(), alone.end());
  EXPECT_GT(distinct.size(), 1u);
}

// Log-probabilities under load, where a step's sampled rows take them with their draws on the sampling pool
// (presample_rows), are a request's log-probabilities alone, bit for bit.
TEST(SchedulerTest, LogprobsAloneEqualLogprobsUnderLoad) {
  auto params = [](int i) {
    GenParams p = greedy_request(prompt_of(3 + i * 5, i), 8, "l" + std::to_string(i));
    if (i % 2) {
      p.sampling.temperature = 0.8f;
      p.sampling.seed = 50 + (uint64_t)i;
    }
    p.logprobs = i % 3 == 0 ? 0 : 3;
    return p;
  };
  const int n = 7;
  FakeRunner runner(64, 128, 8, 16);
  const auto together = run_together(runner, 8, params, n);
  for (int i = 0; i < n; ++i) {
    FakeRunner solo;
    const auto alone = run_together(solo, 1, [&](int) { return params(i); }, 1);
    ASSERT_EQ(alone[0].tokens[0], together[(size_t)i].tokens[0]) << "request " << i;
    const auto &a = alone[0].logprobs[0], &t = together[(size_t)i].logprobs[0];
    ASSERT_EQ(a.size(), t.size()) << "request " << i;
    ASSERT_EQ(a.size(), alone[0].tokens[0].size()) << "request " << i;
    for (size_t j = 0; j < a.size(); ++j) {
      EXPECT_EQ(a[j].token, t[j].token);
      EXPECT_EQ(a[j].logprob, t[j].logprob) << "request " << i << ", token " << j;
      ASSERT_EQ(a[j].top.size(), t[j].top.size());
      ASSERT_EQ(a[j].top.size(), (size_t)params(i).logprobs);
      for (size_t k = 0; k < a[j].top.size(); ++k) {
        EXPECT_EQ(a[j].top[k].token, t[j].top[k].token);
        EXPECT_EQ(a[j].top[k].logprob, t[j].top[k].logprob);
      }
    }
  }
}

TEST(SchedulerTest, LongPromptIsChunkedWhileOthersKeepDecoding) {
  FakeRunner runner(64, 128, 4, 16);
  FakeText text;
  SchedulerOptions o;
  o.max_prefill_per_step = 8;
  Scheduler s(runner, text, o);
  auto a = s.submit(greedy_request(prompt_of(4, 1), 40, "a"));
  for (int i = 0; i < 3; ++i) s.step();  // a is decoding
  const size_t before = runner.steps.size();
  auto b = s.submit(greedy_request(prompt_of(100, 2), 4, "b"));
  auto out = run_all(s, {a, b}, {1, 1});
  // While b's 100-token prompt was prefilled (8 per step), every step also carried a's decode row.
  int prefill_steps = 0;
  for (size_t k = before; k < runner.steps.size(); ++k) {
    const auto& step = runner.steps[k];
    if (step.size() <= 2) continue;
    ++prefill_steps;
    EXPECT_LE(step.size(), 9u);  // 1 decode row + at most 8 prompt tokens
    EXPECT_TRUE(step.front().want_logits);
    EXPECT_NE(step.front().seq, step.back().seq);
  }
  EXPECT_GE(prefill_steps, 12);
  EXPECT_EQ(out[0].tokens[0].size(), 40u);
  EXPECT_EQ(out[1].tokens[0].size(), 4u);
}

TEST(SchedulerTest, DecodeRowsRotateWhenTheBatchIsSmallerThanTheSlots) {
  FakeRunner runner(64, 128, 4, 2);  // 2 rows per step, 4 sequences
  FakeText text;
  SchedulerOptions o;
  o.n_slots = 4;
  Scheduler s(runner, text, o);
  std::vector<std::shared_ptr<Request>> reqs;
  for (int i = 0; i < 4; ++i) reqs.push_back(s.submit(greedy_request(prompt_of(2, i), 30)));
  std::vector<Outcome> out(4);
  auto counts = [&] {
    std::vector<int> c;
    for (int i = 0; i < 4; ++i) {
      drain_into(*reqs[i], out[i], 1);
      c.push_back((int)out[i].tokens[0].size());
    }
    return c;
  };
  // Prompts are not starved by decode rows: all four start within a few steps.
  int steps = 0;
  for (std::vector<int> c = counts(); *std::min_element(c.begin(), c.end()) == 0 && steps < 20; c = counts()) {
    s.step();
    ++steps;
  }
  EXPECT_LT(steps, 20);
  const std::vector<int> before = counts();
  for (int step = 0; step < 20; ++step) s.step();
  const std::vector<int> after = counts();
  int lo = 1 << 30, hi = 0;
  for (int i = 0; i < 4; ++i) {
    lo = std::min(lo, after[i] - before[i]);
    hi = std::max(hi, after[i] - before[i]);
  }
  EXPECT_GE(lo, 9);  // 2 rows per step over 4 sequences for 20 steps
  EXPECT_LE(hi - lo, 1);
}

TEST(SchedulerTest, AdmissionWaitsForKvBlocks) {
  FakeRunner runner(64, 8, 4, 32);  // 32 positions
  FakeText text;
  SchedulerOptions o;
  o.n_slots = 4;
  o.prompt_cache = false;
  Scheduler s(runner, text, o);
  // Each needs (8 + 8) / 4 = 4 blocks: two fit, the third waits.
  auto a = s.submit(greedy_request(prompt_of(8, 1), 8));
  auto b = s.submit(greedy_request(prompt_of(8, 2), 8));
  auto c = s.submit(greedy_request(prompt_of(8, 3), 8));
  s.step();
  SchedulerStatus st = s.status();
  EXPECT_EQ(st.requests_processing, 2);
  EXPECT_EQ(st.queue_depth, 1);
  EXPECT_LE(st.kv_blocks_used, st.kv_blocks_total);
  auto out = run_all(s, {a, b, c}, {1, 1, 1});
  for (auto& x : out) EXPECT_EQ(x.tokens[0].size(), 8u);
  EXPECT_GT(out[2].timings.queue_ms, 0.0);
  EXPECT_EQ(runner.memory().used_blocks(), 0);
}

TEST(SchedulerTest, QueueFullIs503AndNeverFitsIs400) {
  FakeRunner runner(64, 8, 4, 32);
  FakeText text;
  SchedulerOptions o;
  o.n_slots = 1;
  o.queue_size = 1;
  Scheduler s(runner, text, o);
  auto a = s.submit(greedy_request(prompt_of(4, 1), 4));
  auto b = s.submit(greedy_request(prompt_of(4, 2), 4));
  try {
    s.submit(greedy_request(prompt_of(4, 3), 4));
    FAIL() << "expected queue full";
  } catch (const SubmitError& e) {
    EXPECT_EQ(e.status, 503);
    EXPECT_EQ(e.code, "queue_full");
  }
  auto expect_400 = [&](GenParams p, const char* what) {
    try {
      s.submit(std::move(p));
      ADD_FAILURE() << what;
    } catch (const SubmitError& e) {
      EXPECT_EQ(e.status, 400) << what;
    }
  };
  expect_400(greedy_request(prompt_of(32, 1), 4), "prompt as long as the context");
  {
    FakeRunner big_ctx(64, 8, 4, 32, 64);  // a sequence may reach 64 positions, the pool holds 32
    Scheduler s2(big_ctx, text, o);
    EXPECT_THROW(s2.submit(greedy_request(prompt_of(20, 1), 100)), SubmitError);
    try {
      s2.submit(greedy_request(prompt_of(20, 1), 100));
    } catch (const SubmitError& e) {
      EXPECT_EQ(e.status, 400);
      EXPECT_EQ(e.code, "context_length_exceeded");
    }
  }
  GenParams many = greedy_request(prompt_of(4, 1), 4);
  many.n = 2;
  expect_400(many, "n beyond the slots");
  expect_400(greedy_request({}, 4), "empty prompt");
  expect_400(greedy_request({1, 2, 999}, 4), "token out of range");
  auto out = run_all(s, {a, b}, {1, 1});
  EXPECT_EQ(out[1].tokens[0].size(), 4u);
}

TEST(SchedulerTest, CancelFreesTheSlotAtTheNextStep) {
  FakeRunner runner;
  FakeText text;
  SchedulerOptions o;
  o.n_slots = 1;
  Scheduler s(runner, text, o);
  auto a = s.submit(greedy_request(prompt_of(6, 1), 1000));
  auto b = s.submit(greedy_request(prompt_of(6, 2), 3));
  for (int i = 0; i < 5; ++i) s.step();
  EXPECT_EQ(s.status().queue_depth, 1);
  EXPECT_GT(runner.memory().used_blocks(), 0);
  a->cancel();
  auto out = run_all(s, {a, b}, {1, 1});
  EXPECT_EQ(out[0].finish[0], Finish::Cancelled);
  EXPECT_LT(out[0].tokens[0].size(), 10u);
  EXPECT_EQ(out[1].tokens[0].size(), 3u);
  EXPECT_EQ(runner.memory().used_blocks(), 0);
  // A queued request cancelled before admission never runs.
  auto c = s.submit(greedy_request(prompt_of(6, 3), 3));
  c->cancel();
  auto out2 = run_all(s, {c}, {1});
  EXPECT_EQ(out2[0].finish[0], Finish::Cancelled);
  EXPECT_TRUE(out2[0].tokens[0].empty());
}

TEST(SchedulerTest, PrefixReuseGivesTheSameOutputWithFewerPromptTokens) {
  std::vector<int32_t> first = prompt_of(37, 1);
  std::vector<int32_t> second(first.begin(), first.begin() + 30);
  for (int i = 0; i < 9; ++i) second.push_back((int32_t)(5 + i));
  std::vector<int32_t> expected;
  {
    FakeRunner runner;
    FakeText text;
    SchedulerOptions o;
    o.prompt_cache = false;
    Scheduler s(runner, text, o);
    expected = run_all(s, {s.submit(greedy_request(second, 10))}, {1})[0].tokens[0];
  }
  FakeRunner runner;
  FakeText text;
  Scheduler s(runner, text, {});
  run_all(s, {s.submit(greedy_request(first, 5))}, {1});
  const size_t rows_before = [&] {
    size_t n = 0;
    for (auto& st : runner.steps) n += st.size();
    return n;
  }();
  auto out = run_all(s, {s.submit(greedy_request(second, 10))}, {1});
  EXPECT_EQ(out[0].tokens[0], expected);
  EXPECT_EQ(out[0].timings.n_cached, 28);  // 7 full blocks of 4 shared with the first prompt
  size_t rows_after = 0;
  for (auto& st : runner.steps) rows_after += st.size();
  EXPECT_EQ(rows_after - rows_before, (size_t)(39 - 28 + 9));  // prompt tail + 9 decode rows
  EXPECT_EQ(runner.memory().used_blocks(), 0);
  // The same prompt again: everything but the last block's worth comes from the cache.
  auto again = run_all(s, {s.submit(greedy_request(second, 10))}, {1});
  EXPECT_EQ(again[0].tokens[0], expected);
  EXPECT_EQ(again[0].timings.n_cached, 36);
}

TEST(SchedulerTest, ConcurrentRequestsShareACommonPrefix) {
  FakeRunner runner(64, 64, 4, 64);
  FakeText text;
  Scheduler s(runner, text, {});
  std::vector<int32_t> system = prompt_of(24, 3);
  auto with_suffix = [&](int k) {
    auto p = system;
    p.push_back((int32_t)(10 + k));
    p.push_back((int32_t)(20 + k));
    return p;
  };
  auto first = s.submit(greedy_request(with_suffix(0), 30));
  s.step();  // the first prompt is prefilled and its blocks indexed
  auto second = s.submit(greedy_request(with_suffix(1), 30));
  auto out = run_all(s, {first, second}, {1, 1});
  EXPECT_EQ(out[1].timings.n_cached, 24);
  EXPECT_EQ(runner.memory().used_blocks(), 0);
}

TEST(SchedulerTest, ForkedChoicesShareThePromptAndFinishIndependently) {
  FakeRunner runner;
  FakeText text;
  SchedulerOptions o;
  o.n_slots = 4;
  Scheduler s(runner, text, o);
  GenParams p = greedy_request(prompt_of(10, 4), 7);
  p.n = 3;
  auto r = s.submit(p);
  auto out = run_all(s, {r}, {3});
  ASSERT_EQ(out[0].tokens.size(), 3u);
  EXPECT_EQ(out[0].tokens[0].size(), 7u);
  EXPECT_EQ(out[0].tokens[0], out[0].tokens[1]);  // greedy: identical choices
  EXPECT_EQ(out[0].tokens[0], out[0].tokens[2]);
  EXPECT_EQ(out[0].timings.n_generated, 21);
  EXPECT_EQ(runner.memory().used_blocks(), 0);
  // Sampled with a seed: reproducible, and the choices differ from each other.
  auto sampled = [&] {
    FakeRunner rr;
    Scheduler ss(rr, text, o);
    GenParams q = greedy_request(prompt_of(10, 4), 12);
    q.n = 3;
    q.sampling.temperature = 5.0f;
    q.sampling.seed = 42;
    return run_all(ss, {ss.submit(q)}, {3})[0].tokens;
  };
  auto t1 = sampled(), t2 = sampled();
  EXPECT_EQ(t1, t2);
  EXPECT_NE(t1[0], t1[1]);
}

TEST(SchedulerTest, StopStringsMatchAcrossTokenBoundaries) {
  FakeRunner runner;
  FakeText text;
  // Tokens 1, 2, 3, 4, ... print "he", "ll", "o ", "wor", "ld", ...
  text.pieces = {{1, "he"}, {2, "ll"}, {3, "o "}, {4, "wor"}, {5, "ld"}, {6, "!"}};
  int next = 0;
  runner.next_token = [&next](const std::vector<int32_t>&) { return (int32_t)(1 + (next++ % 6)); };
  Scheduler s(runner, text, {});
  GenParams p = greedy_request({7, 8}, 20);
  p.stop = {"lo w", "xyz"};
  auto out = run_all(s, {s.submit(p)}, {1});
  EXPECT_EQ(out[0].text[0], "hel");
  EXPECT_EQ(out[0].finish[0], Finish::StopWord);
  EXPECT_EQ(out[0].stop_word[0], "lo w");
  EXPECT_EQ(out[0].tokens[0].size(), 4u);
  // End of generation stops without printing the token; ignore_eos keeps going.
  next = 0;
  text.eog = 3;
  auto eos = run_all(s, {s.submit(greedy_request({7, 9}, 20))}, {1});
  EXPECT_EQ(eos[0].text[0], "hell");
  EXPECT_EQ(eos[0].finish[0], Finish::Eos);
  next = 0;
  GenParams ig = greedy_request({7, 10}, 5);
  ig.ignore_eos = true;
  auto ign = run_all(s, {s.submit(ig)}, {1});
  EXPECT_EQ(ign[0].tokens[0].size(), 5u);
  EXPECT_EQ(ign[0].finish[0], Finish::Length);
}

TEST(SchedulerTest, LogprobsAreTheLogSoftmaxOfTheRawLogits) {
  FakeRunner runner(16);
  FakeText text;
  Scheduler s(runner, text, {});
  GenParams p = greedy_request({3, 4, 5}, 3);
  p.logprobs = 4;
  auto out = run_all(s, {s.submit(p)}, {1});
  ASSERT_EQ(out[0].logprobs[0].size(), 3u);
  std::vector<int32_t> content = {3, 4, 5};
  std::vector<float> logits;
  runner.append_logits(content, logits);
  double mx = -1e30, sum = 0;
  for (float l : logits) mx = std::max(mx, (double)l);
  for (float l : logits) sum += std::exp(l - mx);
  const TokenLogprob& lp = out[0].logprobs[0][0];
  EXPECT_EQ(lp.token, out[0].tokens[0][0]);
  EXPECT_NEAR(lp.logprob, logits[lp.token] - mx - std::log(sum), 1e-5);
  ASSERT_EQ(lp.top.size(), 4u);
  EXPECT_EQ(lp.top[0].token, lp.token);  // greedy picks the best
  for (size_t i = 1; i < lp.top.size(); ++i) EXPECT_GE(lp.top[i - 1].logprob, lp.top[i].logprob);
}

TEST(SchedulerTest, UnlimitedRequestsStopWithLengthWhenThePoolRunsOut) {
  FakeRunner runner(64, 8, 4, 32);  // 32 positions in all
  FakeText text;
  SchedulerOptions o;
  o.n_slots = 2;
  o.prompt_cache = false;
  Scheduler s(runner, text, o);
  auto a = s.submit(greedy_request(prompt_of(4, 1), -1));
  auto b = s.submit(greedy_request(prompt_of(4, 2), -1));
  auto out = run_all(s, {a, b}, {1, 1});
  EXPECT_EQ(out[0].finish[0], Finish::Length);
  EXPECT_EQ(out[1].finish[0], Finish::Length);
  // Each reserved 16 positions; one stops at its 16th (the pool is full), the other then grows into
  // the blocks it left.
  const size_t lo = std::min(out[0].tokens[0].size(), out[1].tokens[0].size());
  const size_t hi = std::max(out[0].tokens[0].size(), out[1].tokens[0].size());
  EXPECT_EQ(lo, 13u);
  EXPECT_GT(hi, 13u);
  EXPECT_LE(hi, 29u);
  EXPECT_EQ(runner.memory().used_blocks(), 0);
}

TEST(SchedulerTest, AStepFailureFailsItsRequestsAndTheSchedulerGoesOn) {
  FakeRunner runner;
  FakeText text;
  Scheduler s(runner, text, {});
  auto a = s.submit(greedy_request(prompt_of(5, 1), 5));
  runner.fail_next_step = true;
  auto out = run_all(s, {a}, {1});
  EXPECT_EQ(out[0].finish[0], Finish::Error);
  EXPECT_EQ(runner.memory().used_blocks(), 0);
  auto b = run_all(s, {s.submit(greedy_request(prompt_of(5, 1), 5))}, {1});
  EXPECT_EQ(b[0].tokens[0].size(), 5u);
  EXPECT_EQ(s.device_fault(), "");  // an ordinary failure is not sticky
}

// A failed internal check while stepping (the step's output does not match its rows) fails the
// requests in the step with an internal-error message, frees their KV, and the scheduler goes on:
// the process does not end.
TEST(SchedulerTest, AFailedInternalCheckFailsItsRequestsAndTheSchedulerGoesOn) {
  FakeRunner runner;
  FakeText text;
  Scheduler s(runner, text, {});
  auto a = s.submit(greedy_request(prompt_of(5, 1), 5));
  runner.bad_output_next_step = true;
  auto out = run_all(s, {a}, {1});
  EXPECT_EQ(out[0].finish[0], Finish::Error);
  EXPECT_NE(out[0].error.find("internal error"), std::string::npos) << out[0].error;
  EXPECT_EQ(runner.memory().used_blocks(), 0);
  EXPECT_EQ(s.device_fault(), "");
  auto b = run_all(s, {s.submit(greedy_request(prompt_of(5, 1), 5))}, {1});
  EXPECT_EQ(b[0].finish[0], Finish::Length);
  EXPECT_EQ(b[0].tokens[0].size(), 5u);
}

// A sticky device fault (DeviceFault from the step): the running request and the one waiting behind it
// fail, and the scheduler refuses new requests with 503 device_fault instead of failing them one by one.
TEST(SchedulerTest, AStickyDeviceFaultFailsEverythingAndRefusesNewRequests) {
  FakeRunner runner;
  FakeText text;
  SchedulerOptions o;
  o.n_slots = 1;
  Scheduler s(runner, text, o);
  auto a = s.submit(greedy_request(prompt_of(5, 1), 5));
  auto waiting = s.submit(greedy_request(prompt_of(5, 2), 5));
  runner.device_fault_next_step = true;
  auto out = run_all(s, {a, waiting}, {1, 1});
  EXPECT_EQ(out[0].finish[0], Finish::Error);
  EXPECT_EQ(out[1].finish[0], Finish::Error);
  EXPECT_NE(s.device_fault().find("cudaErrorIllegalAddress"), std::string::npos);
  try {
    s.submit(greedy_request(prompt_of(5, 3), 5));
    ADD_FAILURE() << "submit after a device fault was accepted";
  } catch (const SubmitError& e) {
    EXPECT_EQ(e.status, 503);
    EXPECT_EQ(e.code, "device_fault");
  }
  EXPECT_EQ(runner.memory().used_blocks(), 0);
}

// A runner that picks greedy tokens "on the device": argmax_only rows come back with their token and
// no logits, as from a backend with output_argmax. It also runs a hook at every launch.
class DeviceArgmaxRunner : public FakeRunner {
 public:
  using FakeRunner::FakeRunner;
  std::function<void(const std::vector<BatchRow>&)> on_launch;
  int argmax_rows = 0, logit_rows = 0;
  void launch(const std::vector<BatchRow>& rows) override {
    if (on_launch) on_launch(rows);
    StepRunner::launch(rows);
    out_ = StepRunner::finish();
    for (size_t i = 0, k = 0; i < rows.size(); ++i) {
      if (!rows[i].want_logits) continue;
      if (rows[i].argmax_only) {
        out_.logits[k] = nullptr;
        ++argmax_rows;
      } else {
        ++logit_rows;
      }
      ++k;
    }
  }
  const StepOutput& finish() override { return out_; }

 private:
  StepOutput out_;
};

TEST(SchedulerTest, GreedyRowsUseTheStepsArgmaxAndOthersTheirLogits) {
  auto run = [](bool device, GenParams p, int* argmax_rows = nullptr, int* logit_rows = nullptr) {
    DeviceArgmaxRunner runner;
    FakeRunner plain;
    FakeText text;
    StepRunner& r = device ? (StepRunner&)runner : (StepRunner&)plain;
    Scheduler s(r, text, {});
    auto out = run_all(s, {s.submit(std::move(p))}, {1})[0];
    if (argmax_rows) *argmax_rows = runner.argmax_rows;
    if (logit_rows) *logit_rows = runner.logit_rows;
    return out;
  };
  int argmax_rows = 0, logit_rows = 0;
  // Greedy: every token (the first one after the prompt too) is the step's pick, no logits needed.
  const Outcome greedy_out = run(true, greedy_request(prompt_of(9, 2), 8), &argmax_rows, &logit_rows);
  EXPECT_EQ(greedy_out.tokens[0], run(false, greedy_request(prompt_of(9, 2), 8)).tokens[0]);
  EXPECT_EQ(greedy_out.tokens[0].size(), 8u);
  EXPECT_EQ(argmax_rows, 8);
  EXPECT_EQ(logit_rows, 0);
  // Sampled, penalized or with logprobs: the logits come back and the host picks.
  GenParams sampled = greedy_request(prompt_of(9, 2), 6);
  sampled.sampling.temperature = 0.9f;
  sampled.sampling.seed = 7;
  GenParams penalized = greedy_request(prompt_of(9, 2), 6);
  penalized.sampling.repeat_penalty = 1.3f;
  GenParams with_logprobs = greedy_request(prompt_of(9, 2), 6);
  with_logprobs.logprobs = 2;
  for (const GenParams& p : {sampled, penalized, with_logprobs}) {
    const Outcome o = run(true, p, &argmax_rows, &logit_rows);
    EXPECT_EQ(o.tokens[0], run(false, p).tokens[0]);
    EXPECT_EQ(argmax_rows, 0);
    EXPECT_EQ(logit_rows, 6);
  }
  // Greedy under a grammar (vowels only): after the first token (picked on the host from the prompt's
  // logits), each step picks the best token the grammar's mask allows where the logits are; the same
  // tokens as the host's constrained sampling, all of them allowed.
  GenParams vowels = greedy_request(prompt_of(9, 2), 7);
  vowels.grammar = Grammar::parse("root ::= [aeiou]+");
  const Outcome v_dev = run(true, vowels, &argmax_rows, &logit_rows);
  EXPECT_EQ(v_dev.tokens[0], run(false, vowels).tokens[0]);
  ASSERT_EQ(v_dev.tokens[0].size(), 7u);
  for (int32_t t : v_dev.tokens[0]) EXPECT_NE(std::string("aeiou").find((char)('a' + t % 26)), std::string::npos) << t;
  EXPECT_EQ(argmax_rows, 6);
  EXPECT_EQ(logit_rows, 1);
}

// Host work overlaps the device: when step k + 1 is launched, the events of step k's tokens are not
// out yet (they are made while it runs), unless stop strings need that text to decide whether the
// choice goes on. Either way no row is spent beyond the stop.
TEST(SchedulerTest, EventsOfAStepAreMadeWhileTheNextRuns) {
  for (bool with_stop : {false, true}) {
    DeviceArgmaxRunner runner;
    FakeText text;
    Scheduler s(runner, text, {});
    GenParams p = greedy_request(prompt_of(6, 3), 10);
    if (with_stop) p.stop = {"no such text"};
    auto r = s.submit(p);
    Outcome seen;
    std::vector<size_t> at_launch;  // tokens the client had when each decode step was launched
    runner.on_launch = [&](const std::vector<BatchRow>& rows) {
      drain_into(*r, seen, 1);
      if (rows.size() == 1) at_launch.push_back(seen.tokens[0].size());
    };
    for (int i = 0; i < 100 && !seen.done; ++i) {
      s.step();
      drain_into(*r, seen, 1);
    }
    ASSERT_TRUE(seen.done);
    ASSERT_EQ(seen.tokens[0].size(), 10u);
    ASSERT_EQ(at_launch.size(), 9u);  // tokens 2..10 are decode steps
    for (size_t k = 0; k < at_launch.size(); ++k)
      EXPECT_EQ(at_launch[k], with_stop ? k + 1 : k) << "decode step " << k << (with_stop ? " (stop strings)" : "");
  }
  // A stop string ends the choice without an extra row.
  FakeRunner runner;
  FakeText text;
  text.pieces = {{1, "a"}, {2, "b"}, {3, "c"}};
  int next = 0;
  runner.next_token = [&next](const std::vector<int32_t>&) { return (int32_t)(1 + (next++ % 3)); };
  Scheduler s(runner, text, {});
  GenParams p = greedy_request({7, 8}, 20);
  p.stop = {"bc"};
  auto out = run_all(s, {s.submit(p)}, {1});
  EXPECT_EQ(out[0].text[0], "a");
  EXPECT_EQ(out[0].finish[0], Finish::StopWord);
  EXPECT_EQ(next, 3);  // three tokens asked of the model: a, b, c
  size_t rows = 0;
  for (auto& st : runner.steps) rows += st.size();
  EXPECT_EQ(rows, 2u + 2u);  // the prompt, then b's and c's inputs (a, b)
}

TEST(SchedulerTest, ThreadedLoopServesConcurrentSubmitters) {
  FakeRunner runner(64, 256, 4, 16);
  // A rule whose outputs can be worked out here: 1 + (sum of the sequence's tokens + its length) % 63.
  auto rule = [](const std::vector<int32_t>& content) {
    int64_t sum = 0;
    for (int32_t t : content) sum += t;
    return (int32_t)(1 + (sum + (int64_t)content.size()) % 63);
  };
  runner.next_token = rule;
  FakeText text;
  SchedulerOptions o;
  o.n_slots = 4;
  o.queue_size = 64;
  Scheduler s(runner, text, o);
  s.start();
  std::vector<std::thread> threads;
  std::vector<std::vector<int32_t>> got(16);
  for (int i = 0; i < 16; ++i) {
    threads.emplace_back([&, i] {
      auto r = s.submit(greedy_request(prompt_of(5 + i, i), 10));
      std::vector<Event> ev;
      while (!r->poll(ev, std::chrono::milliseconds(50))) {
      }
      for (auto& e : ev) got[i].insert(got[i].end(), e.tokens.begin(), e.tokens.end());
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < 16; ++i) {
    std::vector<int32_t> content = prompt_of(5 + i, i), want;
    for (int k = 0; k < 10; ++k) {
      want.push_back(rule(content));
      content.push_back(want.back());
    }
    EXPECT_EQ(got[i], want) << i;
  }
  s.stop(false);
  s.join();
  EXPECT_EQ(runner.memory().used_blocks(), 0);
  EXPECT_THROW(s.submit(greedy_request(prompt_of(5, 1), 5)), SubmitError);
}

// cancel() from another thread while the loop runs (as the HTTP threads do): the request ends with
// Finish::Cancelled within a few steps, long before its 5000 tokens (1 ms a step: >= 5 s uncancelled),
// its blocks are freed, and the request queued behind it on the single slot then runs to the end.
TEST(SchedulerTest, CancelFromAnotherThreadWhileTheLoopRuns) {
  FakeRunner runner(64, 2048, 4, 16);
  runner.step_delay_ms = 1;
  FakeText text;
  SchedulerOptions o;
  o.n_slots = 1;
  o.queue_size = 4;
  Scheduler s(runner, text, o);
  s.start();
  auto a = s.submit(greedy_request(prompt_of(6, 1), 5000));
  auto b = s.submit(greedy_request(prompt_of(6, 2), 3));
  std::vector<int32_t> a_tokens;
  Finish a_finish = Finish::None;
  std::atomic<uint64_t> steps_at_cancel{0};
  std::thread canceller([&] {
    // Wait until a has produced 20 tokens, then cancel it from this thread.
    while (s.status().slots.empty() || s.status().slots[0].n_generated < 20) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    steps_at_cancel = s.status().steps;
    a->cancel();
  });
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<Event> ev;
  bool done = false;
  while (!(done = a->poll(ev, std::chrono::milliseconds(50))) && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(4)) {
  }
  canceller.join();
  EXPECT_TRUE(done) << "the cancelled request still runs 4 s later";
  for (const Event& e : ev) {
    a_tokens.insert(a_tokens.end(), e.tokens.begin(), e.tokens.end());
    if (e.finish != Finish::None) a_finish = e.finish;
  }
  const uint64_t steps_after = s.status().steps - steps_at_cancel;
  std::printf("  cancelled after %zu tokens, %llu steps after cancel()\n", a_tokens.size(), (unsigned long long)steps_after);
  EXPECT_EQ(a_finish, Finish::Cancelled);
  EXPECT_GE(a_tokens.size(), 20u);
  EXPECT_LT(a_tokens.size(), 200u);
  EXPECT_LT(steps_after, 20u);
  std::vector<Event> evb;
  while (!b->poll(evb, std::chrono::milliseconds(50))) {
  }
  size_t nb = 0;
  for (const Event& e : evb) nb += e.tokens.size();
  EXPECT_EQ(nb, 3u);
  s.stop(false);
  s.join();
  EXPECT_EQ(runner.memory().used_blocks(), 0);
}

// Models with recurrent layers (the fake's state cells hold every token fed, and logits come from
// them): the same greedy output alone and under load with forks, prompt chunks that end on block
// boundaries so the state there is kept, and prefix reuse only up to a kept state.
TEST(SchedulerTest, RecurrentStatesUnderLoadWithForks) {
  const FakeRunner::Recurrent rec{4, 4};
  std::vector<std::vector<int32_t>> alone;
  const int n = 6;
  for (int i = 0; i < n; ++i) {
    FakeRunner runner(64, 64, 4, 32, 0, rec);
    FakeText text;
    Scheduler s(runner, text, {});
    alone.push_back(run_all(s, {s.submit(greedy_request(prompt_of(3 + i * 7, i), 10))}, {1})[0].tokens[0]);
  }
  FakeRunner runner(64, 128, 4, 8, 0, rec);
  FakeText text;
  SchedulerOptions o;
  o.n_slots = 4;
  Scheduler s(runner, text, o);
  std::vector<std::shared_ptr<Request>> reqs;
  std::vector<int> choices;
  for (int i = 0; i < n; ++i) {
    GenParams p = greedy_request(prompt_of(3 + i * 7, i), 10);
    p.n = i == 2 ? 2 : 1;  // one request forks its sequence (and its state)
    choices.push_back(p.n);
    reqs.push_back(s.submit(p));
  }
  auto out = run_all(s, reqs, choices);
  for (int i = 0; i < n; ++i)
    for (int c = 0; c < choices[i]; ++c) EXPECT_EQ(out[i].tokens[c], alone[i]) << "request " << i << " choice " << c;
  EXPECT_EQ(runner.memory().used_blocks(), 0);
  EXPECT_EQ(runner.memory().free_sequences(), 4);
}

TEST(SchedulerTest, RecurrentPrefixReuseResumesOnlyFromKeptStates) {
  const FakeRunner::Recurrent rec{4, 4};
  std::vector<int32_t> first = prompt_of(37, 1);
  std::vector<int32_t> second(first.begin(), first.begin() + 30);
  for (int i = 0; i < 9; ++i) second.push_back((int32_t)(5 + i));
  std::vector<int32_t> expected;
  {
    FakeRunner runner(64, 64, 4, 32, 0, rec);
    FakeText text;
    SchedulerOptions o;
    o.prompt_cache = false;
    Scheduler s(runner, text, o);
    expected = run_all(s, {s.submit(greedy_request(second, 10))}, {1})[0].tokens[0];
    EXPECT_EQ(runner.state_copies, 0) << "no snapshots without prompt caching";
  }
  FakeRunner runner(64, 64, 4, 32, 0, rec);
  FakeText text;
  Scheduler s(runner, text, {});
  run_all(s, {s.submit(greedy_request(first, 5))}, {1});
  // The 37-token prompt ran as chunks ending at 32 and 36 (block boundaries), then its last token.
  std::vector<size_t> chunk_rows;
  for (const auto& st : runner.steps) chunk_rows.push_back(st.size());
  ASSERT_GE(chunk_rows.size(), 3u);
  EXPECT_EQ(chunk_rows[0], 32u);
  EXPECT_EQ(chunk_rows[1], 4u);
  EXPECT_EQ(chunk_rows[2], 1u);
  // The second prompt shares 30 tokens (7 full blocks) but no state was kept inside them: no reuse.
  auto out = run_all(s, {s.submit(greedy_request(second, 10))}, {1});
  EXPECT_EQ(out[0].tokens[0], expected);
  EXPECT_EQ(out[0].timings.n_cached, 0);
  // The same prompt again resumes from the state kept at 36.
  auto again = run_all(s, {s.submit(greedy_request(second, 10))}, {1});
  EXPECT_EQ(again[0].tokens[0], expected);
  EXPECT_EQ(again[0].timings.n_cached, 36);
  EXPECT_EQ(runner.memory().used_blocks(), 0);
  EXPECT_LE(runner.memory().n_state_snapshots(), 4);
}
