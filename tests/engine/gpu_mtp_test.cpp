// The MTP drafter and speculative decoding on a recurrent target on the CUDA backend (skipped without a
// GPU): the head's logits and hidden states on the GPU against the CPU's for the same input rows, and
// greedy output with MTP drafts (and with a scripted, partly wrong draft) token for token the GPU's
// output without drafts, the target's DeltaNet states kept and restored on the device.
#include <gtest/gtest.h>

#include "backend/gpu.h"
#include "engine/engine.h"
#include "engine/engine_test_util.h"
#include "engine/mtp_drafter.h"
#include "engine/speculative.h"
#include "engine/speculative_test_util.h"
#include "test_util.h"

using namespace roofline;
using test::some_tokens;
using test::tiny;
using test::greedy_speculative;

namespace {

EngineOptions gpu_options(bool rollback) {
  EngineOptions o;
  o.n_ctx = 1024;
  o.n_batch = 64;
  o.n_seq_max = 2;
  o.n_gpu_layers = EngineOptions::kGpuLayersAll;
  o.draft_rollback = rollback;
  return o;
}


// Drafts `truth` from the history on, every third drafted token wrong.
class ScriptedDrafter final : public Drafter {
 public:
  ScriptedDrafter(std::vector<int32_t> truth, int n_vocab) : truth_(std::move(truth)), n_vocab_(n_vocab) { params_.n_max = 4; }
  void draft(std::vector<Job>& jobs) override {
    for (Job& j : jobs) {
      j.draft.clear();
      for (size_t k = j.history->size(); (int)j.draft.size() < j.n_max && k < truth_.size(); ++k)
        j.draft.push_back(++count_ % 3 == 0 ? (truth_[k] + 1) % n_vocab_ : truth_[k]);
    }
  }
  void release(int) override {}
  const DraftParams& params() const override { return params_; }

 private:
  std::vector<int32_t> truth_;
  int n_vocab_;
  long count_ = 0;
  DraftParams params_;
};

}  // namespace

TEST(GpuMtpTest, HeadLogitsMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  for (const char* spec : {"tiny-qwen35-mtp:F32", "tiny-qwen35-mtp:Q8_0"}) {
    SCOPED_TRACE(spec);
    auto model = tiny(spec);
    const int n_vocab = model->hparams().n_vocab, n_embd = model->hparams().n_embd;
    EngineOptions co = gpu_options(false);
    co.n_gpu_layers = 0;
    co.type_k = co.type_v = DType::F32;
    EngineOptions go = gpu_options(false);
    go.type_k = go.type_v = DType::F32;
    MtpDrafter cpu(model, co, DraftParams{}), gpu(model, go, DraftParams{});
    ASSERT_EQ(gpu.engine().gpu_units(), 2);
    auto target = Engine::create(model, co);
    const auto tokens = some_tokens(40, n_vocab, 3);
    const std::vector<float> hidden = target->eval_hidden(target->memory().create_sequence(false), tokens);
    std::vector<int32_t> next(tokens.begin() + 1, tokens.end());
    const int n = (int)next.size();
    std::vector<float> input((size_t)n * n_embd);
    cpu.input_rows(next.data(), hidden.data(), n, input.data());
    std::vector<float> got_logits, want_logits, got_hidden, want_hidden;
    for (MtpDrafter* d : {&cpu, &gpu}) {
      std::vector<Engine::BatchRow> rows;
      const int seq = d->engine().memory().create_sequence(false);
      for (int i = 0; i < n; ++i) rows.push_back({seq, next[(size_t)i], true, false, true});
      const Engine::StepOutput& out = d->engine().step(rows, input.data());
      auto& logits = d == &cpu ? want_logits : got_logits;
      auto& hid = d == &cpu ? want_hidden : got_hidden;
      for (int i = 0; i < n; ++i) {
        logits.insert(logits.end(), out.logits[(size_t)i], out.logits[(size_t)i] + n_vocab);
        hid.insert(hid.end(), out.hidden[(size_t)i], out.hidden[(size_t)i] + n_embd);
      }
    }
    const double e = test::nmse(got_logits.data(), want_logits.data(), got_logits.size());
    const double eh = test::nmse(got_hidden.data(), want_hidden.data(), got_hidden.size());
    std::printf("%-22s MTP head GPU vs CPU NMSE: logits %.3g, hidden %.3g\n", spec, e, eh);
    EXPECT_LT(e, 5e-3);
    EXPECT_LT(eh, 5e-3);
  }
}

TEST(GpuMtpTest, GreedyOutputIsThePlainOutput) {
  SKIP_WITHOUT_GPU();
  for (const char* spec : {"tiny-qwen35-mtp:Q8_0", "tiny-qwen35moe-mtp:Q4_K_M"}) {
    SCOPED_TRACE(spec);
    auto model = tiny(spec);
    const int n_vocab = model->hparams().n_vocab;
    const auto prompt = some_tokens(45, n_vocab, 4);
    auto plain_engine = Engine::create(model, gpu_options(false));
    const auto plain = greedy_speculative(*plain_engine, nullptr, prompt, 60);
    std::vector<int32_t> truth = prompt;
    truth.insert(truth.end(), plain.begin(), plain.end());
    {
      auto target = Engine::create(model, gpu_options(true));
      ScriptedDrafter scripted(truth, n_vocab);
      DraftStats st;
      EXPECT_EQ(greedy_speculative(*target, &scripted, prompt, 60, &st), plain) << "scripted drafts";
      EXPECT_TRUE(st.accepted > 0 && st.accepted < st.drafted) << st.accepted << "/" << st.drafted;
    }
    for (int n_max : {1, 3}) {
      auto target = Engine::create(model, gpu_options(true));
      DraftParams p;
      p.n_max = n_max;
      MtpDrafter mtp(model, target->options(), p);
      DraftStats st;
      EXPECT_EQ(greedy_speculative(*target, &mtp, prompt, 60, &st), plain) << "MTP n_max " << n_max;
      EXPECT_GT(st.drafted, 0);
    }
  }
}
