// The scheduler on the real engine (CPU) with Qwen3.5- and Gemma 3-shaped models: recurrent states or
// sliding-window rings per slot, prompt chunks, forks and prefix reuse from state snapshots (Gemma 3:
// window snapshots in host memory, also across a conversation's turns). Many concurrent greedy requests
// that share prefixes give the same tokens as each request run alone on a fresh engine.
#include <gtest/gtest.h>

#include "engine/engine.h"
#include "engine/memory_plan.h"
#include "model/model_file.h"
#include "serve/scheduler.h"
#include "scheduler_runs.h"

using namespace roofline;
using namespace roofline::serve;
using roofline::serve::test::NoText;
using roofline::serve::test::greedy_request;
using roofline::serve::test::step_until_done;

namespace {

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
  GenParams p = greedy_request(std::move(prompt), max_tokens);
  p.n = n;
  return p;
}

// Runs the scheduler until every request ends; the tokens of each request's choices.
std::vector<std::vector<std::vector<int32_t>>> run(Scheduler& s, const std::vector<std::shared_ptr<Request>>& reqs) {
  std::vector<std::vector<std::vector<int32_t>>> out(reqs.size());
  step_until_done(s, reqs, [&](size_t k, Event& e) {
    if ((int)out[k].size() <= e.choice) out[k].resize(e.choice + 1);
    out[k][e.choice].insert(out[k][e.choice].end(), e.tokens.begin(), e.tokens.end());
    EXPECT_NE(e.finish, Finish::Error) << e.error;
  });
  return out;
}

// A shared "system prompt" of 70 tokens, then per request a different question; one request asks for
// two choices (a fork), one repeats an earlier prompt (reuse from a snapshot or cached blocks).
std::vector<GenParams> shared_prefix_requests(const std::vector<int32_t>& system, int n_vocab) {
  std::vector<GenParams> params;
  for (int k = 0; k < 7; ++k) {
    std::vector<int32_t> p = system;
    for (int i = 0; i < 5 + 9 * k; ++i) p.push_back((i * 53 + 7 * k + 3) % n_vocab);
    params.push_back(greedy(p, 12, k == 3 ? 2 : 1));
  }
  params.push_back(params[1]);
  return params;
}

std::vector<int32_t> system_prompt(int n_vocab) {
  std::vector<int32_t> system;
  for (int i = 0; i < 70; ++i) system.push_back((i * 37 + 11) % n_vocab);
  return system;
}

// Each request's greedy tokens alone on a fresh engine without prompt caching.
std::vector<std::vector<int32_t>> each_alone(const std::shared_ptr<const Model>& model, const std::vector<GenParams>& params) {
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
  return alone;
}

// The requests together on 4 slots with prompt caching, after the first one ran alone (so its
// prompt's states or blocks are kept for the others); every choice must be that request's tokens alone.
// The scheduler stays alive with the engine, so what it still holds can be checked after.
struct TogetherRun {
  std::unique_ptr<Engine> engine;
  std::unique_ptr<EngineRunner> runner;
  NoText text;
  std::unique_ptr<Scheduler> scheduler;
  std::vector<std::shared_ptr<Request>> reqs;
};

std::unique_ptr<TogetherRun> run_together(const std::shared_ptr<const Model>& model, const std::vector<GenParams>& params,
                                          const std::vector<std::vector<int32_t>>& alone) {
  auto together = std::make_unique<TogetherRun>();
  together->engine = engine_for(model, 4, true);
  together->runner = std::make_unique<EngineRunner>(*together->engine);
  SchedulerOptions o;
  o.n_slots = 4;
  o.queue_size = 16;
  together->scheduler = std::make_unique<Scheduler>(*together->runner, together->text, o);
  Scheduler& s = *together->scheduler;
  run(s, {s.submit(params[0])});
  for (const GenParams& p : params) together->reqs.push_back(s.submit(p));
  const auto out = run(s, together->reqs);
  for (size_t k = 0; k < params.size(); ++k) {
    EXPECT_EQ((int)out[k].size(), params[k].n) << "request " << k;
    for (int c = 0; c < params[k].n && c < (int)out[k].size(); ++c)
      EXPECT_EQ(out[k][c], alone[k]) << "request " << k << " choice " << c;
  }
  return together;
}

}  // namespace

// Models whose sequences carry a state that cannot be cut back (Qwen3.5's DeltaNet states, Gemma 3's
// sliding-window rings): prompt caching resumes from state snapshots.
void state_models_share_prefixes_like_each_request_alone(const std::string& spec) {
  SCOPED_TRACE(spec);
  auto model = Model::load(open_model_file("synthetic:" + spec));
  const int n_vocab = model->hparams().n_vocab;
  const std::vector<GenParams> params = shared_prefix_requests(system_prompt(n_vocab), n_vocab);
  const auto together = run_together(model, params, each_alone(model, params));
  const auto& reqs = together->reqs;
  Engine* engine = together->engine.get();
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

// Gemma 3 as serve sets it up (a ring per slot on the device; window snapshots in host memory, two per slot
// within --cache-ram, taken where a prompt ends and where a reply ends): a conversation whose every turn
// extends the last resumes from the end of the previous reply (the window of 8 is far shorter than the
// prompts), and each reply is the greedy text of its whole prompt on a fresh engine without caching.
TEST(EngineSchedulerTest, Gemma3ConversationResumesFromWindowSnapshots) {
  auto model = Model::load(open_model_file("synthetic:tiny-gemma3:Q8_0"));
  const int n_vocab = model->hparams().n_vocab;
  auto engine_with = [&](int n_snapshots) {
    EngineOptions o;
    o.n_ctx = 2048;
    o.kv_block_size = 16;
    o.n_batch = 64;
    o.n_threads = 2;
    o.n_seq_max = 2;
    o.n_state_snapshots = n_snapshots;
    return Engine::create(model, o);
  };
  const KvConfig kv = planned_kv_config(model->hparams(), 2048, 64, 16, DType::F16, DType::F16);
  const int n_snapshots = window_snapshot_count(*model, kv, 2, 8192);
  ASSERT_EQ(n_snapshots, 4);
  auto engine = engine_with(n_snapshots);
  ASSERT_TRUE(engine->memory().windowed());
  EngineRunner runner(*engine);
  NoText text;
  SchedulerOptions so;
  so.n_slots = 2;
  Scheduler s(runner, text, so);
  auto alone = [&](const std::vector<int32_t>& prompt, int max_tokens) {
    auto fresh = engine_with(0);
    EngineRunner r(*fresh);
    SchedulerOptions o;
    o.prompt_cache = false;
    Scheduler sa(r, text, o);
    return run(sa, {sa.submit(greedy(prompt, max_tokens))})[0][0];
  };
  std::vector<int32_t> history;
  for (int i = 0; i < 40; ++i) history.push_back((i * 41 + 5) % n_vocab);
  int previous_fed = 0;  // positions the previous turn's sequence held when it ended
  for (int turn = 0; turn < 4; ++turn) {
    SCOPED_TRACE(turn);
    for (int i = 0; i < 7 + 5 * turn; ++i) history.push_back((i * 29 + 13 * turn + 1) % n_vocab);
    auto req = s.submit(greedy(history, 10));
    const auto reply = run(s, {req})[0][0];
    ASSERT_EQ(reply.size(), 10u);
    EXPECT_EQ(reply, alone(history, 10));
    if (turn > 0) {
      EXPECT_EQ(req->timings().n_cached, previous_fed / 16 * 16) << "resumed at the last boundary of the previous reply";
    }
    previous_fed = (int)history.size() + 9;  // the prompt and the reply but its last token
    history.insert(history.end(), reply.begin(), reply.end());
    // Another request in between takes the freed state cell and fills its ring (80 positions) with other
    // text: the next turn resumes from the snapshot, not from what the cell happens to hold.
    std::vector<int32_t> other;
    for (int i = 0; i < 90; ++i) other.push_back((i * 17 + 3 * turn + 2) % n_vocab);
    run(s, {s.submit(greedy(other, 2))});
  }
  EXPECT_LE(engine->memory().n_state_snapshots(), n_snapshots);
  // The same prompt again: resumes where the prompt's last boundary before its final token is.
  history.push_back(1);
  auto again = s.submit(greedy(history, 4));
  const auto first = run(s, {again})[0][0];
  auto repeat = s.submit(greedy(history, 4));
  EXPECT_EQ(run(s, {repeat})[0][0], first);
  EXPECT_EQ(repeat->timings().n_cached, ((int)history.size() - 1) / 16 * 16);
  EXPECT_EQ(first, alone(history, 4));
  // Without snapshots (--cache-ram 0) nothing is reused, and the text is the same.
  auto bare = engine_with(0);
  EngineRunner rb(*bare);
  Scheduler sb(rb, text, so);
  run(sb, {sb.submit(greedy(history, 4))});
  auto none = sb.submit(greedy(history, 4));
  EXPECT_EQ(run(sb, {none})[0][0], first);
  EXPECT_EQ(none->timings().n_cached, 0);
}

// The same on an attention-only model (tiny-qwen3): prompts adopt every cached full block they match
// (the shared 70-token prefix diverges inside the fifth block of 16, so 64 positions at least; a
// repeated prompt adopts more), and each request's greedy tokens are those it gets alone on a fresh
// engine without prompt caching.
TEST(EngineSchedulerTest, Qwen3ConcurrentSharedPrefixesMatchEachRequestAlone) {
  auto model = Model::load(open_model_file("synthetic:tiny-qwen3:Q8_0"));
  const int n_vocab = model->hparams().n_vocab;
  const std::vector<int32_t> system = system_prompt(n_vocab);
  std::vector<GenParams> params = shared_prefix_requests(system, n_vocab);
  params.push_back(greedy(std::vector<int32_t>(system.begin(), system.begin() + 40), 6));  // a prefix of the prefix
  const auto together = run_together(model, params, each_alone(model, params));
  const auto& reqs = together->reqs;
  Engine* engine = together->engine.get();
  for (size_t k = 0; k < params.size(); ++k) {
    const int n_cached = reqs[k]->timings().n_cached;
    std::printf("  request %zu: prompt %zu, cached %d\n", k, params[k].prompt.size(), n_cached);
    EXPECT_GE(n_cached, k + 1 == params.size() ? 32 : 64) << "request " << k;
    EXPECT_EQ(n_cached % 16, 0) << "request " << k;
  }
  EXPECT_EQ(engine->memory().used_blocks(), 0);
}
