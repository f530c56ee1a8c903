// The server's continuous batching with drafts on a Qwen3.5-shaped target (DeltaNet states) and a Gemma
// 3-shaped one (sliding-window rings) on the CPU engine: several concurrent greedy streams, with prompt
// caching (state snapshots) on, verify a scripted drafter's tokens (the streams' own continuations,
// wrong here and there), or the MTP head's drafts (a Qwen3.5 file with an MTP block); each stream's
// tokens are those of the same request alone without drafts, and no step holds more than --draft-max + 1
// rows of one generating sequence (accepted tokens fed again count: the bound of batch invariance).
#include <gtest/gtest.h>

#include <map>

#include "engine/engine.h"
#include "engine/mtp_drafter.h"
#include "engine/speculative.h"
#include "model/model_file.h"
#include "serve/scheduler.h"
#include "scheduler_runs.h"

using namespace roofline;
using namespace roofline::serve;
using roofline::serve::test::NoText;
using roofline::serve::test::greedy_request;
using roofline::serve::test::tokens_of;

namespace {

std::unique_ptr<Engine> engine_for(std::shared_ptr<const Model> model, int n_slots, bool rollback) {
  EngineOptions o;
  o.n_ctx = 1024;
  o.kv_block_size = 16;
  o.n_batch = 32;
  o.n_threads = 2;
  o.n_seq_max = n_slots;
  o.n_state_snapshots = 2 * n_slots;
  o.draft_rollback = rollback;
  return Engine::create(std::move(model), o);
}

// The engine, counting the most rows of one sequence in a step where it verifies drafts (more than one
// row wants logits; tokens fed again in front of them count too).
class CountingRunner final : public StepRunner {
 public:
  explicit CountingRunner(Engine& e) : inner_(e) {}
  int n_vocab() const override { return inner_.n_vocab(); }
  int n_batch() const override { return inner_.n_batch(); }
  int n_ctx() const override { return inner_.n_ctx(); }
  int n_embd() const override { return inner_.n_embd(); }
  SequenceMemory& memory() override { return inner_.memory(); }
  std::vector<float> decode(const std::vector<BatchRow>& rows) override { return inner_.decode(rows); }
  void launch(const std::vector<BatchRow>& rows) override {
    std::map<int, int> n, logits;
    for (const BatchRow& r : rows) {
      n[r.seq]++;
      logits[r.seq] += r.want_logits ? 1 : 0;
    }
    for (auto& [seq, k] : n) {
      if (logits[seq] > 1) most = std::max(most, k);
      if (logits[seq] > 1 && k > logits[seq]) ++with_replay;
    }
    inner_.launch(rows);
  }
  const StepOutput& finish() override { return inner_.finish(); }
  int most = 0;         // rows of one sequence in a verification step, at most
  int with_replay = 0;  // verification steps that also fed accepted tokens again

 private:
  EngineRunner inner_;
};

// Drafts the continuation of whichever known text (prompt + plain output) the history is a prefix of,
// every third drafted token (counted over all jobs) wrong.
class ScriptedDrafter final : public Drafter {
 public:
  ScriptedDrafter(std::vector<std::vector<int32_t>> texts, int n_max, int n_vocab) : texts_(std::move(texts)), n_vocab_(n_vocab) {
    params_.n_max = n_max;
  }
  void draft(std::vector<Job>& jobs) override {
    for (Job& j : jobs) {
      j.draft.clear();
      const std::vector<int32_t>& h = *j.history;
      for (const auto& t : texts_) {
        if (t.size() <= h.size() || !std::equal(h.begin(), h.end(), t.begin())) continue;
        for (int k = 0; k < j.n_max && h.size() + (size_t)k < t.size(); ++k) {
          int32_t tok = t[h.size() + (size_t)k];
          if (++count_ % 3 == 0) tok = (tok + 1) % n_vocab_;
          j.draft.push_back(tok);
        }
        break;
      }
    }
  }
  void release(int) override {}
  const DraftParams& params() const override { return params_; }

 private:
  std::vector<std::vector<int32_t>> texts_;
  int n_vocab_;
  long count_ = 0;
  DraftParams params_;
};

void concurrent_streams_keep_their_tokens(const std::string& spec, bool mtp = false) {
  SCOPED_TRACE(spec);
  auto model = Model::load(open_model_file("synthetic:" + spec));
  const int n_vocab = model->hparams().n_vocab;
  std::vector<GenParams> params;
  for (int k = 0; k < 4; ++k) {
    std::vector<int32_t> prompt;
    for (int i = 0; i < 40 + 9 * k; ++i) prompt.push_back((int32_t)((i < 35 ? i * 37 + 5 : i * 53 + k * 11) % n_vocab));  // a shared prefix
    params.push_back(greedy_request(prompt, 24 + 3 * k));
  }
  NoText text;
  std::vector<std::vector<int32_t>> want, texts;
  for (const GenParams& p : params) {
    auto engine = engine_for(model, 1, false);
    EngineRunner runner(*engine);
    Scheduler s(runner, text, SchedulerOptions{});
    want.push_back(tokens_of(s, {s.submit(p)})[0]);
    std::vector<int32_t> t = p.prompt;
    t.insert(t.end(), want.back().begin(), want.back().end());
    texts.push_back(t);
  }
  auto engine = engine_for(model, 3, true);
  CountingRunner runner(*engine);
  ScriptedDrafter scripted(texts, 4, n_vocab);
  std::unique_ptr<MtpDrafter> head;
  if (mtp) {
    DraftParams dp;
    dp.n_max = 3;
    head = std::make_unique<MtpDrafter>(model, engine->options(), dp);
  }
  SchedulerOptions o;
  o.n_slots = 3;
  o.drafter = mtp ? (Drafter*)head.get() : &scripted;
  o.max_prefill_per_step = 16;
  Scheduler s(runner, text, o);
  std::vector<std::shared_ptr<Request>> reqs;
  for (const GenParams& p : params) reqs.push_back(s.submit(p));
  std::vector<Timings> t;
  EXPECT_EQ(tokens_of(s, reqs, &t), want);
  int drafted = 0, accepted = 0;
  for (const Timings& x : t) {
    drafted += x.draft_n;
    accepted += x.draft_n_accepted;
  }
  EXPECT_GT(drafted, 0);
  if (!mtp) {
    EXPECT_GT(accepted, 0);
  }
  EXPECT_LT(accepted, drafted) << "some drafts should have been rejected";
  // A repeated prompt after the others: resumes from a snapshot, drafts, same tokens.
  EXPECT_EQ(tokens_of(s, {s.submit(params[2])})[0], want[2]);
  EXPECT_LE(runner.most, (mtp ? 3 : 4) + 1) << "a sequence's rows in a step stay within --draft-max + 1";
  EXPECT_GT(runner.with_replay, 0) << "no step fed accepted tokens again beside new drafts";
}

}  // namespace

TEST(SpeculativeRecurrentSchedulerTest, Qwen35StreamsKeepTheirTokens) { concurrent_streams_keep_their_tokens("tiny-qwen35:Q8_0"); }

TEST(SpeculativeRecurrentSchedulerTest, Gemma3StreamsKeepTheirTokens) { concurrent_streams_keep_their_tokens("tiny-gemma3:Q8_0"); }

TEST(SpeculativeRecurrentSchedulerTest, MtpHeadStreamsKeepTheirTokens) { concurrent_streams_keep_their_tokens("tiny-qwen35-mtp:Q8_0", true); }
