// Speculative decoding on the CPU engine (engine/speculative.h): a row's logits are the same whether it
// is evaluated alone or as one of the N+1 rows of a verification step (batch invariance, which the
// exactness rests on); greedy output with a draft is token for token the output without one, whether
// the draft is the target itself (every draft accepted) or another model (few accepted); a seeded
// sampler gives the same text too; the draft's vocabulary and the target's memory are checked.
#include <gtest/gtest.h>

#include <cstring>

#include "core/error.h"
#include "engine/engine_test_util.h"
#include "engine/speculative.h"
#include "model/synthetic.h"

using namespace roofline;
using namespace roofline::test;

namespace {

std::unique_ptr<Engine> cpu_engine(std::shared_ptr<const Model> model, int n_ctx = 512) {
  EngineOptions o;
  o.n_ctx = n_ctx;
  o.n_threads = 2;
  o.n_batch = 64;
  o.kv_block_size = 16;
  return Engine::create(std::move(model), o);
}

std::unique_ptr<DraftModel> draft_of(std::shared_ptr<const Model> model, int n_max, float p_min = 0) {
  DraftParams p;
  p.n_max = n_max;
  p.p_min = p_min;
  return std::make_unique<DraftModel>(cpu_engine(std::move(model)), p);
}

SamplingParams greedy_params() {
  SamplingParams sp;
  sp.temperature = 0;
  return sp;
}

// Generates n tokens after `prompt` with the target (and the drafter, when given); the tokens.
std::vector<int32_t> generate(Engine& target, Drafter* drafter, const std::vector<int32_t>& prompt, int n, const SamplingParams& sp,
                              DraftStats* stats = nullptr) {
  const int seq = target.memory().create_sequence(false);
  std::vector<float> logits = target.eval(seq, prompt);
  Sampler sampler(sp, target.n_vocab());
  std::vector<int32_t> history = prompt;
  history.push_back(sampler.sample(logits.data(), history).token);
  std::vector<int32_t> out{history.back()};
  SpeculativeDecoder decoder(target, drafter);
  const bool greedy = greedy_from_raw_logits(sp);
  while ((int)out.size() < n) {
    const size_t before = out.size();
    decoder.round(seq, history, n - (int)out.size(), sampler, greedy, out);
    EXPECT_GT(out.size(), before);
    EXPECT_LE((int)out.size(), n) << "a round emitted past max_new";
    EXPECT_EQ(target.memory().length(seq) + 1, (int)history.size()) << "the target holds every token but the pending one";
  }
  if (stats) *stats = decoder.stats();
  decoder.release(seq);
  target.memory().free_sequence(seq);
  return out;
}

}  // namespace

// The logits of rows verified together (pending token + drafts, next to another sequence's rows) are
// bit for bit those of the same rows evaluated one step each.
// Every weight type's kernels (the mixes cover F32, F16, BF16, Q8_0, Q6_K, Q5_K, Q4_K, Q3_K, Q2_K, the
// legacy quants and IQ4_XS), a dense and a MoE FFN, and steps of 9 and 17 verification rows.
TEST(SpeculativeTest, VerificationRowsAreBatchInvariant) {
  for (const char* spec : {"tiny-qwen3:Q4_K_M", "tiny-llama:Q8_0", "tiny-qwen2:F16", "tiny-qwen3moe:Q4_K_M", "tiny-qwen3:F32",
                           "tiny-qwen3:BF16", "tiny-qwen3:Q6_K", "tiny-qwen3:Q5_K_M", "tiny-qwen3:Q3_K_M", "tiny-qwen3:Q2_K",
                           "tiny-llama:Q4_0", "tiny-llama:Q4_1", "tiny-llama:Q5_0", "tiny-llama:Q5_1", "tiny-qwen3:IQ4_XS"})
  for (int n_rows : {9, 17}) {
    SCOPED_TRACE(std::string(spec) + ", " + std::to_string(n_rows) + " rows");
    auto model = tiny(spec);
    const int n_vocab = model->hparams().n_vocab;
    const auto prompt = some_tokens(37, n_vocab, 1), rows = some_tokens(n_rows, n_vocab, 2), other = some_tokens(21, n_vocab, 3);
    auto one = cpu_engine(model), many = cpu_engine(model);
    const int a = one->memory().create_sequence(false), b = many->memory().create_sequence(false);
    one->eval(a, prompt);
    many->eval(b, prompt);
    std::vector<std::vector<float>> alone;
    for (int32_t t : rows) alone.push_back(one->eval(a, std::span<const int32_t>(&t, 1)));
    // Another sequence's prompt chunk shares the step.
    const int c = many->memory().create_sequence(false);
    std::vector<Engine::BatchRow> batch;
    for (int32_t t : other) batch.push_back({c, t, false});
    for (int32_t t : rows) batch.push_back({b, t, true});
    const std::vector<float> together = many->decode(batch);
    ASSERT_EQ(together.size(), rows.size() * (size_t)n_vocab);
    for (size_t i = 0; i < rows.size(); ++i)
      EXPECT_EQ(0, std::memcmp(alone[i].data(), together.data() + i * n_vocab, (size_t)n_vocab * sizeof(float)))
          << "row " << i << " of the verification step differs from the same row alone";
  }
}

// Draft = the target itself: every draft is accepted; the output is the plain output.
TEST(SpeculativeTest, SelfDraftAcceptsEverythingAndKeepsTheOutput) {
  auto model = tiny("tiny-qwen3:Q4_K_M");
  const auto prompt = some_tokens(23, model->hparams().n_vocab, 4);
  auto plain_engine = cpu_engine(model);
  const auto plain = generate(*plain_engine, nullptr, prompt, 40, greedy_params());
  for (int n_max : {1, 3, 8}) {
    SCOPED_TRACE(n_max);
    auto target = cpu_engine(model);
    auto draft = draft_of(model, n_max);
    DraftStats st;
    EXPECT_EQ(generate(*target, draft.get(), prompt, 40, greedy_params(), &st), plain);
    EXPECT_GT(st.drafted, 0);
    EXPECT_EQ(st.accepted, st.drafted) << "a draft identical to the target must be accepted every time";
    // 39 tokens after the first; each round emits its drafts and the bonus token.
    EXPECT_LE(st.drafts, (39 + n_max) / (n_max + 1) + 1);
    EXPECT_EQ(target->memory().used_blocks(), 0);
  }
}

// Another model as the draft (another seed: unrelated weights): few drafts accepted, same output, and
// the draft's p-min and n-min settings change only the speed.
TEST(SpeculativeTest, OtherDraftModelKeepsTheOutput) {
  auto model = tiny("tiny-qwen3:Q4_K_M");
  auto other = tiny("tiny-llama:Q8_0:7");
  for (int salt : {5, 6}) {
    const auto prompt = some_tokens(19 + salt, model->hparams().n_vocab, salt);
    auto plain_engine = cpu_engine(model);
    const auto plain = generate(*plain_engine, nullptr, prompt, 48, greedy_params());
    DraftStats st[2];
    const float p_mins[2] = {0.0f, 0.01f};  // a random model's top probability is about 1/512: 0.01 stops it
    for (int i = 0; i < 2; ++i) {
      auto target = cpu_engine(model);
      auto draft = draft_of(other, 4, p_mins[i]);
      EXPECT_EQ(generate(*target, draft.get(), prompt, 48, greedy_params(), &st[i]), plain) << "p_min " << p_mins[i];
    }
    EXPECT_GT(st[0].drafted, 0);
    EXPECT_LT(st[0].accepted, st[0].drafted) << "an unrelated draft should miss sometimes";
    EXPECT_LT(st[1].drafted, st[0].drafted) << "--draft-p-min stops drafting where the draft is unsure";
  }
}

// A seeded sampler draws once per emitted token with or without drafts: the same tokens, and never
// more than asked for.
TEST(SpeculativeTest, SeededSamplingGivesTheSameTokens) {
  auto model = tiny("tiny-qwen3:Q4_K_M");
  const auto prompt = some_tokens(17, model->hparams().n_vocab, 8);
  SamplingParams sp;
  sp.temperature = 1.5f;
  sp.top_k = 0;
  sp.top_p = 1;
  sp.min_p = 0;
  sp.seed = 1234;
  auto plain_engine = cpu_engine(model);
  const auto plain = generate(*plain_engine, nullptr, prompt, 33, sp);
  ASSERT_EQ(plain.size(), 33u);
  for (const char* draft_spec : {"tiny-qwen3:Q4_K_M", "tiny-qwen3:Q8_0:3"}) {
    auto target = cpu_engine(model);
    auto draft = draft_of(tiny(draft_spec), 5);
    DraftStats st;
    const auto out = generate(*target, draft.get(), prompt, 33, sp, &st);
    EXPECT_EQ(out, plain) << draft_spec;
    EXPECT_GT(st.drafted, 0);
  }
}

TEST(SpeculativeTest, RefusesADraftWithAnotherVocabulary) {
  auto target = tiny("tiny-qwen3:F32");
  SyntheticSpec spec = parse_synthetic_spec("synthetic:tiny-qwen3:F32");
  spec.shape.n_vocab = 640;
  auto bigger = Model::load(build_synthetic_model(spec));
  try {
    check_draft_compatible(*target, *bigger);
    FAIL() << "a draft with 640 tokens was taken for a target with 512";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("640"), std::string::npos) << m;
    EXPECT_NE(m.find("512"), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << "one line";
  }
  EXPECT_NO_THROW(check_draft_compatible(*target, *tiny("tiny-llama:Q8_0:9")));
}

// Models whose memory cannot be cut back are refused as drafts, and as targets of an engine without kept
// states (EngineOptions::draft_rollback; speculative_recurrent_test.cpp has them with), with one line.
TEST(SpeculativeTest, RefusesMemoryThatCannotBeCutBack) {
  auto hybrid = cpu_engine(tiny("tiny-qwen35:Q8_0"));
  auto draft = draft_of(tiny("tiny-qwen3:F32"), 2);
  EXPECT_THROW((void)SpeculativeDecoder(*hybrid, draft.get()), Error);
  EXPECT_NO_THROW((void)SpeculativeDecoder(*hybrid, nullptr));
  DraftParams p;
  EXPECT_THROW((void)DraftModel(cpu_engine(tiny("tiny-gemma3:Q8_0")), p), Error);
  p.n_max = 0;
  EXPECT_THROW((void)DraftModel(cpu_engine(tiny("tiny-qwen3:F32")), p), Error);
}

// On the GPU (every unit offloaded, target and draft): verification steps of up to 8 rows take the
// batch-invariant decode kernels, so the greedy output with a draft is the plain GPU output.
TEST(SpeculativeTest, GpuDraftKeepsTheGreedyOutput) {
  SKIP_WITHOUT_GPU();
  auto gpu_engine = [](std::shared_ptr<const Model> model) {
    EngineOptions o;
    o.n_ctx = 512;
    o.n_batch = 64;
    o.kv_block_size = 16;
    o.n_gpu_layers = EngineOptions::kGpuLayersAll;
    return Engine::create(std::move(model), o);
  };
  for (const char* spec : {"tiny-qwen3:Q4_K_M", "tiny-llama:Q8_0"}) {
    SCOPED_TRACE(spec);
    auto model = tiny(spec);
    const auto prompt = some_tokens(29, model->hparams().n_vocab, 12);
    auto plain_engine = gpu_engine(model);
    const auto plain = generate(*plain_engine, nullptr, prompt, 48, greedy_params());
    for (int n_max : {3, 7}) {
      for (const char* draft_spec : {spec, "tiny-qwen3:Q8_0:5"}) {
        auto target = gpu_engine(model);
        DraftParams p;
        p.n_max = n_max;
        DraftModel draft(gpu_engine(tiny(draft_spec)), p);
        DraftStats st;
        EXPECT_EQ(generate(*target, &draft, prompt, 48, greedy_params(), &st), plain) << "draft " << draft_spec << ", draft-max " << n_max;
        if (std::string(draft_spec) == spec) { EXPECT_EQ(st.accepted, st.drafted); }
      }
    }
  }
}

// A job's own n_min and p_min override the draft's settings; a draft shorter than n_min is dropped.
TEST(SpeculativeTest, DraftJobSettings) {
  auto model = tiny("tiny-qwen3:Q4_K_M");
  auto draft = draft_of(model, 4);
  const auto history = some_tokens(30, model->hparams().n_vocab, 13);
  auto one = [&](int n_max, int n_min, float p_min) {
    std::vector<Drafter::Job> jobs(1);
    jobs[0].key = 7;
    jobs[0].history = &history;
    jobs[0].n_max = n_max;
    jobs[0].n_min = n_min;
    jobs[0].p_min = p_min;
    draft->draft(jobs);
    return jobs[0].draft;
  };
  const auto four = one(4, -1, -1);
  ASSERT_EQ(four.size(), 4u);
  EXPECT_EQ(one(2, -1, -1), std::vector<int32_t>(four.begin(), four.begin() + 2)) << "the same text, cut back and drafted again";
  EXPECT_EQ(one(2, 2, -1).size(), 2u);
  EXPECT_TRUE(one(2, 3, -1).empty()) << "shorter than n_min";
  EXPECT_TRUE(one(4, -1, 0.5f).empty()) << "a random model is never that sure";
  EXPECT_EQ(one(9, -1, 0.0f), four) << "at most the draft's n_max";
  draft->release(7);
  EXPECT_EQ(draft->engine().memory().used_blocks(), 0);
}
