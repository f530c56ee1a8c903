// Speculative decoding in the server's scheduler, on the real CPU engine with a draft model: every
// generating slot carries drafts inside the continuous-batching steps, and each request's events
// (tokens, text, stop strings, max_tokens, finish reasons) are exactly those without a draft, alone
// or with other slots running; the acceptance shows in the timings and the metrics.
#include <gtest/gtest.h>

#include "engine/engine.h"
#include "engine/speculative.h"
#include "model/model_file.h"
#include "serve/grammar.h"
#include "serve/metrics.h"
#include "serve/scheduler.h"
#include "scheduler_runs.h"

using namespace roofline;
using namespace roofline::serve;
using roofline::serve::test::greedy_request;
using roofline::serve::test::step_until_done;

namespace {

// Each token prints as two letters, so stop strings can end inside a token.
class LetterText final : public TokenText {
 public:
  std::string piece(int32_t t) const override { return {(char)('a' + t % 26), (char)('a' + (t / 26) % 26)}; }
  bool is_eog(int32_t) const override { return false; }
};

std::unique_ptr<Engine> engine_for(std::shared_ptr<const Model> model) {
  EngineOptions o;
  o.n_ctx = 1024;
  o.kv_block_size = 16;
  o.n_batch = 64;
  o.n_threads = 2;
  return Engine::create(std::move(model), o);
}

std::shared_ptr<const Model> load(const std::string& spec) { return Model::load(open_model_file("synthetic:" + spec)); }

GenParams request(int salt, int max_tokens, int n_vocab) {
  std::vector<int32_t> prompt;
  for (int i = 0; i < 20 + 7 * salt; ++i) prompt.push_back((i * 53 + 11 * salt + 3) % n_vocab);
  return greedy_request(std::move(prompt), max_tokens, "r" + std::to_string(salt));
}

struct Outcome {
  std::vector<int32_t> tokens;  // choice 0
  std::vector<std::vector<int32_t>> other_choices;
  std::vector<size_t> tokens_per_event;
  std::string text;
  Finish finish = Finish::None;
  std::string stop_word;
  Timings timings;
};

std::vector<Outcome> run(Scheduler& s, const std::vector<std::shared_ptr<Request>>& reqs) {
  std::vector<Outcome> out(reqs.size());
  auto on_event = [&](size_t k, Event& e) {
    EXPECT_NE(e.finish, Finish::Error) << e.error;
    if (e.choice > 0) {
      auto& o = out[k].other_choices;
      if ((int)o.size() < e.choice) o.resize(e.choice);
      o[e.choice - 1].insert(o[e.choice - 1].end(), e.tokens.begin(), e.tokens.end());
      return;
    }
    out[k].tokens.insert(out[k].tokens.end(), e.tokens.begin(), e.tokens.end());
    out[k].tokens_per_event.push_back(e.tokens.size());
    out[k].text += e.text;
    if (e.finish != Finish::None) {
      EXPECT_EQ(out[k].finish, Finish::None) << "a second finish event";
      out[k].finish = e.finish;
      out[k].stop_word = e.stop_word;
    }
  };
  step_until_done(s, reqs, on_event, 20000, [&](size_t k) { out[k].timings = reqs[k]->timings(); });
  return out;
}

// Each request alone on a fresh engine without a draft.
std::vector<Outcome> alone(std::shared_ptr<const Model> model, const std::vector<GenParams>& params) {
  std::vector<Outcome> out;
  LetterText text;
  for (const GenParams& p : params) {
    auto engine = engine_for(model);
    EngineRunner runner(*engine);
    Scheduler s(runner, text, SchedulerOptions{});
    out.push_back(run(s, {s.submit(p)})[0]);
  }
  return out;
}

// The requests all at once on a fresh target engine, `draft_model` drafting up to n_max tokens per
// step; every target sequence is freed at the end.
std::vector<Outcome> with_draft(std::shared_ptr<const Model> model, std::shared_ptr<const Model> draft_model, int n_max, int n_slots,
                                const std::vector<GenParams>& params, Metrics* metrics = nullptr) {
  auto engine = engine_for(std::move(model));
  DraftParams dp;
  dp.n_max = n_max;
  DraftModel draft(engine_for(std::move(draft_model)), dp);
  EngineRunner runner(*engine);
  LetterText text;
  SchedulerOptions o;
  o.n_slots = n_slots;
  o.drafter = &draft;
  Scheduler s(runner, text, o, metrics);
  std::vector<std::shared_ptr<Request>> reqs;
  for (const GenParams& p : params) reqs.push_back(s.submit(p));
  const auto got = run(s, reqs);
  EXPECT_EQ(engine->memory().used_blocks(), 0) << "every sequence freed";
  return got;
}

void expect_same(const Outcome& got, const Outcome& want, const std::string& what) {
  EXPECT_EQ(got.tokens, want.tokens) << what;
  EXPECT_EQ(got.other_choices, want.other_choices) << what;
  EXPECT_EQ(got.text, want.text) << what;
  EXPECT_EQ(got.finish, want.finish) << what;
  EXPECT_EQ(got.stop_word, want.stop_word) << what;
  for (size_t n : got.tokens_per_event) EXPECT_LE(n, 1u) << what << ": tokens go out one event each";
}

}  // namespace

// Four slots at once, with a draft that is the target itself (everything accepted) or an unrelated
// model (little accepted): the same events as each request alone without a draft.
TEST(SpeculativeSchedulerTest, ConcurrentSlotsWithDraftsMatchEachAlone) {
  auto model = load("tiny-qwen3:Q4_K_M");
  const int n_vocab = model->hparams().n_vocab;
  std::vector<GenParams> params;
  for (int k = 0; k < 6; ++k) params.push_back(request(k, 17 + 5 * k, n_vocab));
  params[2].n = 2;  // two choices: a fork, each choice its own draft sequence
  const auto want = alone(model, params);

  for (const char* draft_spec : {"tiny-qwen3:Q4_K_M", "tiny-llama:Q8_0:5"}) {
    SCOPED_TRACE(draft_spec);
    Metrics metrics;
    const auto got = with_draft(model, load(draft_spec), 4, 4, params, &metrics);
    int drafted = 0, accepted = 0;
    for (size_t k = 0; k < params.size(); ++k) {
      expect_same(got[k], want[k], "request " + std::to_string(k));
      drafted += got[k].timings.draft_n;
      accepted += got[k].timings.draft_n_accepted;
    }
    EXPECT_GT(drafted, 0);
    if (std::string(draft_spec) == "tiny-qwen3:Q4_K_M") {
      EXPECT_EQ(accepted, drafted) << "the target as its own draft";
    } else {
      EXPECT_LT(accepted, drafted);
    }
    const std::string m = metrics.render(LiveGauges{});
    EXPECT_NE(m.find("llamacpp:spec_decode_num_draft_tokens_total " + std::to_string(drafted)), std::string::npos) << m;
    EXPECT_NE(m.find("llamacpp:spec_decode_num_accepted_tokens_total " + std::to_string(accepted)), std::string::npos) << m;
    EXPECT_NE(m.find("llamacpp:spec_decode_num_drafts_total"), std::string::npos);
    if (accepted > 0) {
      EXPECT_NE(m.find("llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position=\"0\"} "), std::string::npos) << m;
    }
  }
}

// max_tokens and stop strings that land inside a run of accepted drafts end the request exactly where
// they end it without a draft; a second identical request then reuses the cached prefix and still
// gives the same text (no rejected draft's KV was cached).
TEST(SpeculativeSchedulerTest, StopsAndLimitsInsideAcceptedRuns) {
  auto model = load("tiny-qwen3:Q4_K_M");
  const int n_vocab = model->hparams().n_vocab;
  LetterText text;
  // The plain continuation, to pick stop strings from.
  const auto plain = alone(model, {request(1, 30, n_vocab)})[0];
  ASSERT_EQ(plain.tokens.size(), 30u);
  std::vector<GenParams> params;
  for (int max_tokens : {1, 2, 6, 7, 11}) params.push_back(request(1, max_tokens, n_vocab));
  for (size_t at : {3u, 7u, 12u}) {
    GenParams p = request(1, 30, n_vocab);
    // The text of token `at`'s second letter and the next token: a stop string ending inside a token.
    p.stop.push_back(plain.text.substr(2 * at + 1, 3));
    params.push_back(p);
  }
  const auto want = alone(model, params);
  for (size_t k = 5; k < params.size(); ++k) ASSERT_EQ(want[k].finish, Finish::StopWord) << k;

  for (const char* draft_spec : {"tiny-qwen3:Q4_K_M", "tiny-qwen3:Q8_0:11"}) {
    for (int n_max : {3, 5}) {
      SCOPED_TRACE(std::string(draft_spec) + " draft-max " + std::to_string(n_max));
      auto engine = engine_for(model);
      DraftParams dp;
      dp.n_max = n_max;
      DraftModel draft(engine_for(load(draft_spec)), dp);
      EngineRunner runner(*engine);
      SchedulerOptions o;
      o.n_slots = 2;
      o.drafter = &draft;
      Scheduler s(runner, text, o);
      for (size_t k = 0; k < params.size(); ++k) {
        const auto got = run(s, {s.submit(params[k])});
        expect_same(got[0], want[k], "request " + std::to_string(k));
        if (params[k].max_tokens > 1 && params[k].stop.empty()) {
          EXPECT_EQ((int)got[0].tokens.size(), params[k].max_tokens);
          EXPECT_EQ(got[0].finish, Finish::Length);
        }
      }
      // Once more: the prompts now come from the prefix cache.
      for (size_t k = 0; k < params.size(); ++k) expect_same(run(s, {s.submit(params[k])})[0], want[k], "again " + std::to_string(k));
    }
  }
}

// Seeded sampling at temperature > 0 through the scheduler: the same tokens with a draft, and
// max_tokens holds.
TEST(SpeculativeSchedulerTest, SeededSamplingWithDraftsMatches) {
  auto model = load("tiny-qwen3:Q4_K_M");
  const int n_vocab = model->hparams().n_vocab;
  std::vector<GenParams> params;
  for (int k = 0; k < 3; ++k) {
    GenParams p = request(k + 2, 21, n_vocab);
    p.sampling.temperature = 1.3f;
    p.sampling.top_k = 40;
    p.sampling.seed = 77 + (uint64_t)k;
    params.push_back(p);
  }
  const auto want = alone(model, params);
  const auto got = with_draft(model, model, 3, 3, params);
  for (size_t k = 0; k < params.size(); ++k) {
    expect_same(got[k], want[k], "request " + std::to_string(k));
    EXPECT_EQ(got[k].tokens.size(), 21u);
    EXPECT_GT(got[k].timings.draft_n, 0);
  }
}

// A target whose memory cannot be cut back (Qwen3.5's DeltaNet layers) refuses a drafter at once.
TEST(SpeculativeSchedulerTest, RefusesARecurrentTarget) {
  auto engine = engine_for(load("tiny-qwen35:Q8_0"));
  DraftModel draft(engine_for(load("tiny-qwen3:F32")), DraftParams{});
  EngineRunner runner(*engine);
  LetterText text;
  SchedulerOptions o;
  o.drafter = &draft;
  EXPECT_THROW((void)Scheduler(runner, text, o), Error);
}

// A stop string met on a row whose draft was rejected ends the request while the KV cache still holds
// the rejected drafts' positions: what it leaves in the prompt cache must be only accepted text. A
// follow-up prompt that continues the conversation (prompt + reply + more) adopts those blocks and
// must give what it gives on a fresh engine.
TEST(SpeculativeSchedulerTest, RejectedDraftsNeverReachThePromptCache) {
  auto model = load("tiny-qwen3:Q4_K_M");
  const int n_vocab = model->hparams().n_vocab;
  const auto plain = alone(model, {request(1, 40, n_vocab)})[0];
  const int P = (int)request(1, 40, n_vocab).prompt.size();
  int checked = 0;
  // Stops whose token fills a KV block exactly (prompt + reply a multiple of the block size, 16).
  for (int k = 1; k <= 40; ++k) {
    if ((P + k) % 16 != 0) continue;
    const std::string stop = plain.text.substr(2 * (k - 1), 2);
    if (plain.text.find(stop) != (size_t)(2 * (k - 1))) continue;  // met earlier
    GenParams first = request(1, 40, n_vocab);
    first.stop = {stop};
    GenParams follow = request(1, 10, n_vocab);
    follow.prompt.insert(follow.prompt.end(), plain.tokens.begin(), plain.tokens.begin() + k);
    for (int i = 0; i < 5; ++i) follow.prompt.push_back((i * 97 + 5) % n_vocab);
    const auto want = alone(model, {first, follow});
    ASSERT_EQ((int)want[0].tokens.size(), k);

    auto engine = engine_for(model);
    DraftParams dp;
    dp.n_max = 3;
    DraftModel draft(engine_for(load("tiny-llama:Q8_0:13")), dp);  // unrelated: its drafts are rejected
    EngineRunner runner(*engine);
    LetterText text;
    SchedulerOptions o;
    o.drafter = &draft;
    Scheduler s(runner, text, o);
    const auto got_first = run(s, {s.submit(first)})[0];
    expect_same(got_first, want[0], "first");
    EXPECT_LT(got_first.timings.draft_n_accepted, got_first.timings.draft_n);
    const auto got_follow = run(s, {s.submit(follow)})[0];
    EXPECT_GE(got_follow.timings.n_cached, 16) << "the follow-up adopts the first request's blocks";
    expect_same(got_follow, want[1], "follow-up");
    ++checked;
  }
  EXPECT_GT(checked, 0) << "no stop string filled a block exactly";
}

// Constrained decoding: the grammar picks each token of a verification step in turn (drafts outside the
// grammar are rejected by the pick), and the output ends where the grammar does, as without a draft.
TEST(SpeculativeSchedulerTest, GrammarConstrainedRequestsMatch) {
  auto model = load("tiny-qwen3:Q4_K_M");
  const int n_vocab = model->hparams().n_vocab;
  std::string rule = "root ::=";
  for (int i = 0; i < 9; ++i) rule += " [a-h] [a-z]";  // nine tokens whose first letter is a..h
  const auto grammar = Grammar::parse(rule);
  std::vector<GenParams> params;
  for (int k = 0; k < 3; ++k) {
    GenParams p = request(k, 30, n_vocab);
    p.grammar = grammar;
    params.push_back(p);
  }
  const auto want = alone(model, params);
  for (const Outcome& w : want) ASSERT_EQ(w.tokens.size(), 9u) << w.text;
  for (const char* draft_spec : {"tiny-qwen3:Q4_K_M", "tiny-qwen3:Q8_0:21"}) {
    SCOPED_TRACE(draft_spec);
    const auto got = with_draft(model, load(draft_spec), 4, 3, params);
    for (size_t k = 0; k < params.size(); ++k) {
      expect_same(got[k], want[k], "request " + std::to_string(k));
      EXPECT_GT(got[k].timings.draft_n, 0);
    }
  }
}

// A draft whose KV pool is too small for every slot's text drafts nothing where it runs out (its
// sequences start over) and the output stays the target's.
TEST(SpeculativeSchedulerTest, DraftPoolTooSmallOnlyCostsDrafts) {
  auto model = load("tiny-qwen3:Q4_K_M");
  const int n_vocab = model->hparams().n_vocab;
  std::vector<GenParams> params;
  for (int k = 0; k < 4; ++k) params.push_back(request(k, 20, n_vocab));
  const auto want = alone(model, params);
  auto engine = engine_for(model);
  EngineOptions small;
  small.n_ctx = 64;  // 4 blocks of 16 for 4 slots of 20..41 prompt tokens
  small.kv_block_size = 16;
  small.n_batch = 64;
  small.n_threads = 2;
  DraftParams dp;
  dp.n_max = 3;
  DraftModel draft(Engine::create(model, small), dp);
  EngineRunner runner(*engine);
  LetterText text;
  SchedulerOptions o;
  o.n_slots = 4;
  o.drafter = &draft;
  Scheduler s(runner, text, o);
  std::vector<std::shared_ptr<Request>> reqs;
  for (const GenParams& p : params) reqs.push_back(s.submit(p));
  const auto got = run(s, reqs);
  int drafted = 0;
  for (size_t k = 0; k < params.size(); ++k) {
    expect_same(got[k], want[k], "request " + std::to_string(k));
    drafted += got[k].timings.draft_n;
  }
  EXPECT_GT(drafted, 0) << "the first request's text fits the draft's pool";
  EXPECT_EQ(draft.engine().memory().used_blocks(), 0) << "every draft sequence released";
}

// A request cancelled while its drafts are in flight ends with "cancelled"; its target and draft
// sequences are freed, and the next request is unaffected.
TEST(SpeculativeSchedulerTest, CancellingADraftingRequestFreesItsSequences) {
  auto model = load("tiny-qwen3:Q4_K_M");
  const int n_vocab = model->hparams().n_vocab;
  const auto want = alone(model, {request(3, 25, n_vocab)})[0];
  auto engine = engine_for(model);
  DraftParams dp;
  dp.n_max = 4;
  DraftModel draft(engine_for(model), dp);
  EngineRunner runner(*engine);
  LetterText text;
  SchedulerOptions o;
  o.drafter = &draft;
  o.prompt_cache = false;
  Scheduler s(runner, text, o);
  auto r = s.submit(request(1, 200, n_vocab));
  for (int i = 0; i < 4; ++i) s.step();  // prompt, then drafting steps
  EXPECT_GT(draft.engine().memory().used_blocks(), 0) << "the draft holds the request's text";
  r->cancel();
  const auto got = run(s, {r});
  EXPECT_EQ(got[0].finish, Finish::Cancelled);
  EXPECT_EQ(engine->memory().used_blocks(), 0);
  EXPECT_EQ(draft.engine().memory().used_blocks(), 0);
  expect_same(run(s, {s.submit(request(3, 25, n_vocab))})[0], want, "after the cancel");
}
