// The MTP head as a drafter (engine/mtp_drafter.h) on the CPU: its logits and chained hidden states
// against a plain double-precision oracle of the head (the input fc over the normed embedding and hidden
// state, then the reference forward's attention layer, norm and output), its drafts against the
// oracle's greedy chain, greedy output with MTP drafts token for token the output without them (dense
// and MoE Qwen3.5, several --draft-max), and a file without an MTP block refused in one line.
#include <gtest/gtest.h>

#include <algorithm>

#include "core/error.h"
#include "engine/engine_test_util.h"
#include "engine/mtp_drafter.h"
#include "engine/reference_forward.h"
#include "engine/speculative.h"
#include "engine/speculative_test_util.h"

using namespace roofline;
using namespace roofline::test;

namespace {

EngineOptions options_for(bool rollback) {
  EngineOptions o;
  o.n_ctx = 512;
  o.n_threads = 2;
  o.n_batch = 64;
  o.kv_block_size = 16;
  o.n_seq_max = 2;
  o.draft_rollback = rollback;
  return o;
}

double nmse(const float* got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return num / den;
}

// The head in double: rows (x_{t+1}, h_t) at positions 0, 1, ...; chains on its own hidden state.
class ReferenceMtp {
 public:
  explicit ReferenceMtp(const std::shared_ptr<const Model>& target)
      : target_(target), block_(Model::mtp_block(target)), ref_(*block_),
        eh_proj_(target->nextn_tensor("nextn.eh_proj.weight")),
        enorm_(ref_.weight_vector(target->nextn_tensor("nextn.enorm.weight"))),
        hnorm_(ref_.weight_vector(target->nextn_tensor("nextn.hnorm.weight"))) {}
  std::vector<double> step(int32_t next_token, const std::vector<double>& hidden) {
    std::vector<double> cat = ref_.rms_norm(ref_.weight_row(target_->token_embd(), next_token), enorm_);
    const std::vector<double> h = ref_.rms_norm(hidden, hnorm_);
    cat.insert(cat.end(), h.begin(), h.end());  // [embedding ; hidden]
    return ref_.step_input(ref_.product(eh_proj_, cat));
  }
  const std::vector<double>& hidden() const { return ref_.last_hidden(); }

 private:
  std::shared_ptr<const Model> target_, block_;
  ReferenceForward ref_;
  Weight eh_proj_;
  std::vector<double> enorm_, hnorm_;
};


}  // namespace

// The head's logits and output hidden states row for row (catch-up rows from the target's hidden
// states, then rows chained on the head's own), f32 KV: as the oracle's (f32 weights: to rounding).
TEST(MtpDrafterTest, HeadMatchesTheReference) {
  for (const char* spec : {"tiny-qwen35-mtp:F32", "tiny-qwen35moe-mtp:F32", "tiny-qwen35-mtp:Q8_0"}) {
    SCOPED_TRACE(spec);
    auto model = tiny(spec);
    const int n_vocab = model->hparams().n_vocab, n_embd = model->hparams().n_embd;
    const bool f32 = std::string(spec).find("F32") != std::string::npos;
    EngineOptions o = options_for(false);
    o.type_k = o.type_v = DType::F32;
    auto target = Engine::create(model, o);
    const auto tokens = some_tokens(23, n_vocab, 5);
    const std::vector<float> hidden = target->eval_hidden(target->memory().create_sequence(false), tokens);
    MtpDrafter mtp(model, o, DraftParams{});
    Engine& head = mtp.engine();
    const int seq = head.memory().create_sequence(false);
    ReferenceMtp ref(model);
    // 22 rows (x_{t+1}, h_t) in two steps, then 3 chained rows (token, the head's last hidden state).
    std::vector<int32_t> next(tokens.begin() + 1, tokens.end());
    std::vector<float> h(hidden.begin(), hidden.end() - n_embd);
    double worst = 0, worst_hidden = 0;
    for (auto [first, n] : {std::pair{0, 15}, std::pair{15, 7}}) {
      std::vector<float> input((size_t)n * n_embd);
      mtp.input_rows(next.data() + first, h.data() + (size_t)first * n_embd, n, input.data());
      std::vector<Engine::BatchRow> rows;
      for (int i = 0; i < n; ++i) rows.push_back({seq, next[(size_t)(first + i)], true, false, true});
      const Engine::StepOutput& out = head.step(rows, input.data());
      for (int i = 0; i < n; ++i) {
        const int t = first + i;
        const std::vector<double> want = ref.step(next[(size_t)t], std::vector<double>(h.begin() + (size_t)t * n_embd, h.begin() + (size_t)(t + 1) * n_embd));
        worst = std::max(worst, nmse(out.logits[(size_t)i], want));
        worst_hidden = std::max(worst_hidden, nmse(out.hidden[(size_t)i], ref.hidden()));
      }
    }
    std::vector<float> last(ref.hidden().begin(), ref.hidden().end());
    for (int32_t tok : {7, 300, 41}) {
      std::vector<float> input((size_t)n_embd);
      std::vector<double> hd(last.begin(), last.end());
      mtp.input_rows(&tok, last.data(), 1, input.data());
      const Engine::StepOutput& out = head.step({{seq, tok, true, false, true}}, input.data());
      worst = std::max(worst, nmse(out.logits[0], ref.step(tok, hd)));
      worst_hidden = std::max(worst_hidden, nmse(out.hidden[0], ref.hidden()));
      last.assign(ref.hidden().begin(), ref.hidden().end());
    }
    std::printf("%-24s MTP head NMSE: logits %.3g, hidden %.3g\n", spec, worst, worst_hidden);
    // F32: rounding only. Q8_0: the quantized kernels' int8 activations (measured 6.4e-5 / 3.1e-5, x ~3).
    EXPECT_LT(worst, f32 ? 1e-9 : 2e-4);
    EXPECT_LT(worst_hidden, f32 ? 1e-9 : 1e-4);
  }
}

// A job's drafts are the oracle's greedy chain from the prompt's hidden states (where the oracle's best
// token leads its second clearly; random weights make near ties possible).
TEST(MtpDrafterTest, DraftsAreTheHeadsGreedyChain) {
  auto model = tiny("tiny-qwen35-mtp:F32");
  const int n_vocab = model->hparams().n_vocab, n_embd = model->hparams().n_embd;
  EngineOptions o = options_for(true);
  o.type_k = o.type_v = DType::F32;
  auto target = Engine::create(model, o);
  DraftParams p;
  p.n_max = 4;
  MtpDrafter mtp(model, o, p);
  const auto prompt = some_tokens(30, n_vocab, 9);
  const int seq = target->memory().create_sequence(false);
  SpeculativeDecoder decoder(*target, &mtp);
  std::vector<float> logits = decoder.prefill(seq, prompt);
  std::vector<int32_t> history = prompt;
  history.push_back(argmax_logits(logits.data(), n_vocab));
  std::vector<Drafter::Job> jobs(1);
  jobs[0].key = seq;
  jobs[0].history = &history;
  jobs[0].n_max = 4;
  mtp.draft(jobs);
  ASSERT_EQ(jobs[0].draft.size(), 4u);

  auto plain = Engine::create(model, o);
  const std::vector<float> hidden = plain->eval_hidden(plain->memory().create_sequence(false), prompt);
  ReferenceMtp ref(model);
  std::vector<double> l;
  for (size_t t = 0; t < prompt.size(); ++t)
    l = ref.step(history[t + 1], std::vector<double>(hidden.begin() + t * n_embd, hidden.begin() + (t + 1) * n_embd));
  int checked = 0;
  for (size_t k = 0; k < 4; ++k) {
    std::vector<double> sorted = l;
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<>());
    const int32_t best = (int32_t)(std::max_element(l.begin(), l.end()) - l.begin());
    if (sorted[0] - sorted[1] < 1e-4 * std::abs(sorted[0])) break;  // a near tie: the float path may pick either
    EXPECT_EQ(jobs[0].draft[k], best) << "draft token " << k;
    ++checked;
    l = ref.step(best, ref.hidden());
  }
  EXPECT_GE(checked, 1);
  decoder.release(seq);
}

// Greedy output with the MTP head's drafts is the output without them (random weights: few drafts
// accepted; the recurrent target goes back after each rejection).
TEST(MtpDrafterTest, GreedyOutputIsThePlainOutput) {
  for (const char* spec : {"tiny-qwen35-mtp:Q8_0", "tiny-qwen35moe-mtp:Q4_K_M"}) {
    SCOPED_TRACE(spec);
    auto model = tiny(spec);
    const auto prompt = some_tokens(27, model->hparams().n_vocab, 2);
    auto plain_engine = Engine::create(model, options_for(false));
    const auto plain = greedy_speculative(*plain_engine, nullptr, prompt, 36);
    for (int n_max : {1, 3}) {
      auto target = Engine::create(model, options_for(true));
      DraftParams p;
      p.n_max = n_max;
      MtpDrafter mtp(model, target->options(), p);
      DraftStats st;
      EXPECT_EQ(greedy_speculative(*target, &mtp, prompt, 36, &st), plain) << "n_max " << n_max;
      EXPECT_GT(st.drafted, 0) << "the head drafted nothing";
      EXPECT_EQ(target->memory().used_blocks(), 0);
      EXPECT_EQ(mtp.engine().memory().used_blocks(), 0) << "released sequences keep no blocks";
    }
  }
}

TEST(MtpDrafterTest, FileWithoutMtpBlockIsRefused) {
  auto model = tiny("tiny-qwen35:Q8_0");
  try {
    MtpDrafter mtp(model, options_for(true), DraftParams{});
    FAIL() << "a file without an MTP block was accepted";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("no MTP block"), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
}
