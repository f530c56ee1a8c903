// The scheduler on the real engine (CPU) with a Qwen3.5-shaped model: recurrent states per slot,
// prompt chunks, forks and prefix reuse from state snapshots. Many concurrent greedy requests that
// share prefixes give the same tokens as each request run alone on a fresh engine.
#include <gtest/gtest.h>

#include "engine/engine.h"
#include "model/model_file.h"
#include "serve/scheduler.h"

using namespace roofline;
using namespace roofline::serve;

namespace {

class NoText final : public TokenText {
 public:
  std::string piece(int32_t) const override { return "x"; }
  bool is_eog(int32_t) const override { return false; }
};

std::unique_ptr<Engine> engine_for(std::shared_ptr<const Model> model, int n_slots, bool cache) {
  EngineOptions o;
  o.n_ctx = 2048;
  o.kv_block_size = 16;
  o.n_batch = 64;
  o.n_threads = 2;
  o.n_seq_max = n_slots;
  o.n_state_snapshots = cache ? 2 * n_slots : 0;
  return Engine::create(std::move(model), o);
}

GenParams greedy(std::vector<int32_t> prompt, int max_tokens, int n = 1) {
  GenParams p;
  p.id = "t";
  p.prompt = std::move(prompt);
  p.max_tokens = max_tokens;
  p.n = n;
  p.sampling.temperature = 0;
  p.sampling.top_k = 0;
  p.sampling.top_p = 1;
  p.sampling.min_p = 0;
  return p;
}

// Runs the scheduler until every request ends; the tokens of each request's choices.
std::vector<std::vector<std::vector<int32_t>>> run(Scheduler& s, const std::vector<std::shared_ptr<Request>>& reqs) {
  std::vector<std::vector<std::vector<int32_t>>> out(reqs.size());
  std::vector<bool> done(reqs.size(), false);
  for (int step = 0; step < 20000; ++step) {
    bool all = true;
    for (size_t k = 0; k < reqs.size(); ++k) {
      if (done[k]) continue;
      std::vector<Event> events;
      done[k] = reqs[k]->poll(events, std::chrono::milliseconds(0));
      for (Event& e : events) {
        if ((int)out[k].size() <= e.choice) out[k].resize(e.choice + 1);
        out[k][e.choice].insert(out[k][e.choice].end(), e.tokens.begin(), e.tokens.end());
        EXPECT_NE(e.finish, Finish::Error) << e.error;
      }
      all = all && done[k];
    }
    if (all) return out;
    s.step();
  }
  ADD_FAILURE() << "requests did not finish";
  return out;
}

}  // namespace

// Models whose sequences carry a state that cannot be cut back (Qwen3.5's DeltaNet states, Gemma 3's
// sliding-window rings): prompt caching resumes from state snapshots.
void state_models_share_prefixes_like_each_request_alone(const std::string& spec) {
  SCOPED_TRACE(spec);
  auto model = Model::load(open_model_file("synthetic:" + spec));
  const int n_vocab = model->hparams().n_vocab;
  // A shared "system prompt" of 70 tokens, then per request a different question; one request asks
  // for two choices (a fork), one repeats an earlier prompt (reuse from a snapshot).
  std::vector<int32_t> system;
  for (int i = 0; i < 70; ++i) system.push_back((i * 37 + 11) % n_vocab);
  std::vector<GenParams> params;
  for (int k = 0; k < 7; ++k) {
    std::vector<int32_t> p = system;
    for (int i = 0; i < 5 + 9 * k; ++i) p.push_back((i * 53 + 7 * k + 3) % n_vocab);
    params.push_back(greedy(p, 12, k == 3 ? 2 : 1));
  }
  params.push_back(params[1]);

  std::vector<std::vector<int32_t>> alone;
  for (const GenParams& p : params) {
    auto engine = engine_for(model, 4, false);
    EngineRunner runner(*engine);
    NoText text;
    SchedulerOptions o;
    o.prompt_cache = false;
    Scheduler s(runner, text, o);
    alone.push_back(run(s, {s.submit(greedy(p.prompt, p.max_tokens))})[0][0]);
  }

  auto engine = engine_for(model, 4, true);
  EngineRunner runner(*engine);
  NoText text;
  SchedulerOptions o;
  o.n_slots = 4;
  o.queue_size = 16;
  Scheduler s(runner, text, o);
  // The first request runs alone first, so its prompt's states are kept for the others.
  run(s, {s.submit(params[0])});
  std::vector<std::shared_ptr<Request>> reqs;
  for (const GenParams& p : params) reqs.push_back(s.submit(p));
  const auto out = run(s, reqs);
  for (size_t k = 0; k < params.size(); ++k) {
    ASSERT_EQ((int)out[k].size(), params[k].n) << "request " << k;
    for (int c = 0; c < params[k].n; ++c) EXPECT_EQ(out[k][c], alone[k]) << "request " << k << " choice " << c;
  }
  int cached = 0;
  for (const auto& r : reqs) cached += r->timings().n_cached;
  EXPECT_GE(cached, 7 * 64) << "the shared 70-token prefix is reused up to its last kept state (64)";
  EXPECT_EQ(engine->memory().used_blocks(), 0);
  EXPECT_EQ(engine->memory().free_sequences(), 4);
}

TEST(EngineSchedulerTest, Qwen35ConcurrentSharedPrefixesMatchEachRequestAlone) {
  state_models_share_prefixes_like_each_request_alone("tiny-qwen35:Q8_0");
}
TEST(EngineSchedulerTest, Gemma3ConcurrentSharedPrefixesMatchEachRequestAlone) {
  state_models_share_prefixes_like_each_request_alone("tiny-gemma3:Q8_0");
}

// The same on an attention-only model (tiny-qwen3): prompts adopt every cached full block they match
// (the shared 70-token prefix diverges inside the fifth block of 16, so 64 positions at least; a
// repeated prompt adopts more), and each request's greedy tokens are those it gets alone on a fresh
// engine without prompt caching.
TEST(EngineSchedulerTest, Qwen3ConcurrentSharedPrefixesMatchEachRequestAlone) {
  auto model = Model::load(open_model_file("synthetic:tiny-qwen3:Q8_0"));
  const int n_vocab = model->hparams().n_vocab;
  std::vector<int32_t> system;
  for (int i = 0; i < 70; ++i) system.push_back((i * 37 + 11) % n_vocab);
  std::vector<GenParams> params;
  for (int k = 0; k < 7; ++k) {
    std::vector<int32_t> p = system;
    for (int i = 0; i < 5 + 9 * k; ++i) p.push_back((i * 53 + 7 * k + 3) % n_vocab);
    params.push_back(greedy(p, 12, k == 3 ? 2 : 1));
  }
  params.push_back(params[1]);
  params.push_back(greedy(std::vector<int32_t>(system.begin(), system.begin() + 40), 6));  // a prefix of the prefix

  std::vector<std::vector<int32_t>> alone;
  for (const GenParams& p : params) {
    auto engine = engine_for(model, 4, false);
    EngineRunner runner(*engine);
    NoText text;
    SchedulerOptions o;
    o.prompt_cache = false;
    Scheduler s(runner, text, o);
    alone.push_back(run(s, {s.submit(greedy(p.prompt, p.max_tokens))})[0][0]);
  }

  auto engine = engine_for(model, 4, true);
  EngineRunner runner(*engine);
  NoText text;
  SchedulerOptions o;
  o.n_slots = 4;
  o.queue_size = 16;
  Scheduler s(runner, text, o);
  run(s, {s.submit(params[0])});
  std::vector<std::shared_ptr<Request>> reqs;
  for (const GenParams& p : params) reqs.push_back(s.submit(p));
  const auto out = run(s, reqs);
  for (size_t k = 0; k < params.size(); ++k) {
    ASSERT_EQ((int)out[k].size(), params[k].n) << "request " << k;
    for (int c = 0; c < params[k].n; ++c) EXPECT_EQ(out[k][c], alone[k]) << "request " << k << " choice " << c;
    const int n_cached = reqs[k]->timings().n_cached;
    std::printf("  request %zu: prompt %zu, cached %d\n", k, params[k].prompt.size(), n_cached);
    EXPECT_GE(n_cached, k + 1 == params.size() ? 32 : 64) << "request " << k;
    EXPECT_EQ(n_cached % 16, 0) << "request " << k;
  }
  EXPECT_EQ(engine->memory().used_blocks(), 0);
}
