// Speculative decoding on targets whose memory cannot simply be cut back (engine/speculative.h): Qwen3.5's
// DeltaNet states and Gemma 3's sliding-window rings. A scripted drafter proposes the target's own
// continuation, wrong at chosen places, so rounds accept all, some or none of their drafts; greedy output
// is token for token the output without a draft, the state cells include the kept ones, and an engine
// created without them is refused.
#include <gtest/gtest.h>

#include "core/error.h"
#include "engine/engine_test_util.h"
#include "engine/speculative.h"
#include "engine/speculative_test_util.h"
#include "model/synthetic.h"

using namespace roofline;
using namespace roofline::test;

namespace {

std::unique_ptr<Engine> engine_of(std::shared_ptr<const Model> model, bool rollback, int n_batch = 64) {
  EngineOptions o;
  o.n_ctx = 512;
  o.n_threads = 2;
  o.n_batch = n_batch;
  o.kv_block_size = 16;
  o.n_seq_max = 2;
  o.draft_rollback = rollback;
  return Engine::create(std::move(model), o);
}

// Drafts the continuation `truth` (prompt + the plain output) from where the history is, the k-th token
// of a draft made wrong when pattern[(call + k) % size] is set.
class ScriptedDrafter final : public Drafter {
 public:
  ScriptedDrafter(std::vector<int32_t> truth, int n_max, std::vector<bool> wrong, int n_vocab)
      : truth_(std::move(truth)), wrong_(std::move(wrong)), n_vocab_(n_vocab) {
    params_.n_max = n_max;
  }
  void draft(std::vector<Job>& jobs) override {
    for (Job& j : jobs) {
      j.draft.clear();
      const size_t h = j.history->size();
      for (size_t i = 0; i < h && i < truth_.size(); ++i) EXPECT_EQ((*j.history)[i], truth_[i]) << "the history left the plain output at " << i;
      for (int k = 0; k < j.n_max && h + (size_t)k < truth_.size(); ++k) {
        int32_t t = truth_[h + (size_t)k];
        if (wrong_[(calls_ + (size_t)k) % wrong_.size()]) t = (t + 1) % n_vocab_;
        j.draft.push_back(t);
      }
      ++calls_;
    }
  }
  void release(int) override {}
  const DraftParams& params() const override { return params_; }

 private:
  std::vector<int32_t> truth_;
  std::vector<bool> wrong_;
  int n_vocab_;
  size_t calls_ = 0;
  DraftParams params_;
};


}  // namespace

TEST(SpeculativeRecurrentTest, GreedyOutputIsThePlainOutput) {
  for (const char* spec : {"tiny-qwen35:Q8_0", "tiny-qwen35moe:Q4_K_M", "tiny-gemma3:Q8_0"}) {
    SCOPED_TRACE(spec);
    auto model = tiny(spec);
    const int n_vocab = model->hparams().n_vocab;
    const auto prompt = some_tokens(29, n_vocab, 3);
    auto plain_engine = engine_of(model, false);
    const auto plain = greedy_speculative(*plain_engine, nullptr, prompt, 40);
    std::vector<int32_t> truth = prompt;
    truth.insert(truth.end(), plain.begin(), plain.end());
    // Every draft right; every first token wrong; wrong now and then (partial acceptance).
    const std::vector<std::vector<bool>> patterns = {{false}, {true}, {false, false, true, false, true, false, false}};
    for (size_t p = 0; p < patterns.size(); ++p) {
      for (int n_max : {1, 4}) {
        SCOPED_TRACE(std::to_string(p) + " " + std::to_string(n_max));
        auto target = engine_of(model, true);
        ScriptedDrafter drafter(truth, n_max, patterns[p], n_vocab);
        DraftStats st;
        EXPECT_EQ(greedy_speculative(*target, &drafter, prompt, 40, &st), plain);
        EXPECT_GT(st.drafted, 0);
        if (p == 0) { EXPECT_EQ(st.accepted, st.drafted); }
        if (p == 1) { EXPECT_EQ(st.accepted, 0); }
        if (p == 2) { EXPECT_TRUE(st.accepted > 0 && st.accepted < st.drafted) << st.accepted << "/" << st.drafted; }
        EXPECT_EQ(target->memory().used_blocks(), 0);
      }
    }
  }
}

// A kept state per sequence: the cells the backends hold, and the memory report, count it.
TEST(SpeculativeRecurrentTest, KeptStatesAreCountedAndRequired) {
  SequenceMemory::Options o;
  o.recurrent = true;
  o.n_seq_max = 3;
  o.n_snapshots = 6;
  EXPECT_EQ(SequenceMemory::state_cells(o), 9);
  o.rollback = true;
  EXPECT_EQ(SequenceMemory::state_cells(o), 12);
  o.windowed = true;
  EXPECT_EQ(SequenceMemory::state_cells(o), 6);

  auto model = tiny("tiny-qwen35:Q8_0");
  auto without = engine_of(model, false);
  EXPECT_FALSE(without->memory().can_roll_back());
}

TEST(SpeculativeRecurrentTest, TargetWithoutKeptStatesIsRefused) {
  auto model = tiny("tiny-qwen35:Q8_0");
  auto without = engine_of(model, false);
  ScriptedDrafter drafter({1, 2, 3}, 2, {false}, model->hparams().n_vocab);
  try {
    SpeculativeDecoder d(*without, &drafter);
    FAIL() << "a target without kept states was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("recurrent"), std::string::npos) << e.what();
  }
  auto with = engine_of(model, true);
  EXPECT_TRUE(with->memory().can_roll_back());
  bool found = false;
  for (const std::string& line : with->report()) found = found || line.find("+ 2 kept for rejected drafts") != std::string::npos;
  EXPECT_TRUE(found) << "the memory report counts the kept states";
}
