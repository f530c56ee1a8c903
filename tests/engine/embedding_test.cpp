// Embeddings on the engine: rows asking for their final hidden state (after the output norm) get it,
// on every architecture, matching the double-precision reference's; such rows mix with logit rows in
// one step without changing either; pooling (none, mean, cls, last) and llama-server's normalisations
// match a plain double computation from the reference's hidden states.
#include <gtest/gtest.h>

#include <cmath>

#include "engine/engine.h"
#include "engine/pooling.h"
#include "core/error.h"
#include "formats/gguf.h"
#include "model/arch.h"
#include "model/model_file.h"
#include "model/model_shapes.h"
#include "reference_forward.h"
#include "engine/engine_test_util.h"

using namespace roofline;
using test::tiny;
using test::some_tokens;

namespace {

double nmse(const float* got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return num / den;
}

EngineOptions f32_options(int n_batch) {
  EngineOptions o;
  o.type_k = o.type_v = DType::F32;
  o.n_batch = n_batch;
  o.n_threads = 2;
  return o;
}

// The reference's final hidden state of every position of `tokens`, in double.
std::vector<std::vector<double>> reference_hidden(const Model& model, const std::vector<int32_t>& tokens) {
  test::ReferenceForward ref(model);
  std::vector<std::vector<double>> out;
  for (int32_t t : tokens) {
    ref.step(t);
    out.push_back(ref.last_hidden());
  }
  return out;
}

// Pooling and normalisation done plainly in double: what PromptPooler must give.
std::vector<double> pooled_reference(const std::vector<std::vector<double>>& h, Pooling p, int norm) {
  std::vector<double> v(h[0].size(), 0.0);
  if (p == Pooling::Mean) {
    for (const auto& row : h)
      for (size_t k = 0; k < v.size(); ++k) v[k] += row[k] / (double)h.size();
  } else {
    v = p == Pooling::Cls ? h.front() : h.back();
  }
  double s = 0;
  if (norm == 2) {
    for (double x : v) s += x * x;
    s = std::sqrt(s);
  } else if (norm == 1) {
    for (double x : v) s += std::fabs(x);
  } else if (norm == 0) {
    for (double x : v) s = std::max(s, std::fabs(x));
    s /= 32760.0;
  } else if (norm == -1) {
    s = 1;
  } else {
    for (double x : v) s += std::pow(std::fabs(x), norm);
    s = std::pow(s, 1.0 / norm);
  }
  for (double& x : v) x /= s;
  return v;
}

}  // namespace

// Every architecture's tiny shape: the engine's hidden rows (fed in ragged chunks, so KV and recurrent
// state cross steps) are the reference's final hidden states.
TEST(EmbeddingTest, HiddenRowsMatchTheReferenceOnEveryArchitecture) {
  for (const ArchInfo& arch : supported_archs()) {
    std::string spec;
    for (const ModelShape& s : model_shapes())
      if (s.arch == arch.name && s.name.rfind("tiny-", 0) == 0) spec = s.name + ":F32";
    ASSERT_FALSE(spec.empty()) << arch.name;
    auto model = tiny(spec);
    auto engine = Engine::create(model, f32_options(7));
    const int seq = engine->memory().create_sequence();
    const auto tokens = some_tokens(19, model->hparams().n_vocab);
    const std::vector<float> hidden = engine->eval_hidden(seq, tokens);
    const int n_embd = model->hparams().n_embd;
    ASSERT_EQ(hidden.size(), tokens.size() * (size_t)n_embd) << spec;
    const auto want = reference_hidden(*model, tokens);
    double worst = 0;
    for (size_t i = 0; i < tokens.size(); ++i) worst = std::max(worst, nmse(hidden.data() + i * n_embd, want[i]));
    std::printf("%-20s hidden NMSE %.3g\n", spec.c_str(), worst);
    EXPECT_LT(worst, 1e-10) << spec;
    EXPECT_EQ(engine->memory().length(seq), (int)tokens.size()) << "hidden rows are committed like any other";
  }
}

// Quantized weights and an F16 KV cache stay close to the reference (as logits do).
TEST(EmbeddingTest, QuantizedHiddenRowsWithinBounds) {
  for (const char* spec : {"tiny-llama:Q8_0", "tiny-qwen35:Q4_K_M"}) {
    auto model = tiny(spec);
    EngineOptions o = f32_options(16);
    o.type_k = o.type_v = DType::F16;
    auto engine = Engine::create(model, o);
    const int seq = engine->memory().create_sequence();
    const auto tokens = some_tokens(24, model->hparams().n_vocab, 3);
    const std::vector<float> hidden = engine->eval_hidden(seq, tokens);
    const auto want = reference_hidden(*model, tokens);
    const int n_embd = model->hparams().n_embd;
    double worst = 0;
    for (size_t i = 0; i < tokens.size(); ++i) worst = std::max(worst, nmse(hidden.data() + i * n_embd, want[i]));
    std::printf("%-20s hidden NMSE %.3g\n", spec, worst);
    EXPECT_LT(worst, 5e-3) << spec;
  }
}

// One step mixing a sequence that wants logits, one that wants hidden rows, and a row wanting both:
// each output is what a step asking only for it gives.
TEST(EmbeddingTest, HiddenAndLogitRowsMixInOneStep) {
  auto model = tiny("tiny-qwen3:F32");
  const int n_vocab = model->hparams().n_vocab, n_embd = model->hparams().n_embd;
  const auto a = some_tokens(5, n_vocab, 1), b = some_tokens(6, n_vocab, 2);

  auto alone = Engine::create(model, f32_options(32));
  const int sa = alone->memory().create_sequence(), sb = alone->memory().create_sequence();
  const std::vector<float> logits_a = alone->eval(sa, a, true);
  const std::vector<float> hidden_b = alone->eval_hidden(sb, b);

  auto mixed = Engine::create(model, f32_options(32));
  const int ma = mixed->memory().create_sequence(), mb = mixed->memory().create_sequence();
  std::vector<Engine::BatchRow> rows;
  for (int32_t t : a) rows.push_back({ma, t, true, false, false});
  for (size_t i = 0; i < b.size(); ++i) rows.push_back({mb, b[i], i + 1 == b.size(), false, true});
  const Engine::StepOutput& out = mixed->step(rows);
  ASSERT_EQ(out.logits.size(), a.size() + 1);
  ASSERT_EQ(out.hidden.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    for (int v = 0; v < n_vocab; ++v) ASSERT_FLOAT_EQ(out.logits[i][v], logits_a[i * n_vocab + v]) << i;
  for (size_t i = 0; i < b.size(); ++i)
    for (int k = 0; k < n_embd; ++k) ASSERT_FLOAT_EQ(out.hidden[i][k], hidden_b[i * n_embd + k]) << i;
  // The last row of b wanted both: its logits are the output matrix applied to its hidden state.
  test::ReferenceForward ref(*model);
  std::vector<double> want;
  for (int32_t t : b) want = ref.step(t);
  EXPECT_LT(nmse(out.logits[a.size()], want), 1e-10);
}

// Pooling as llama.cpp defines it, then normalised as llama-server's embd_normalize, against the same
// done in double from the reference's hidden states; pooling none keeps every token's vector as is.
TEST(EmbeddingTest, PoolingAndNormalisationMatchTheReference) {
  for (const char* spec : {"tiny-qwen3:F32", "tiny-qwen35:F32"}) {
    auto model = tiny(spec);
    const int n_embd = model->hparams().n_embd;
    const auto tokens = some_tokens(13, model->hparams().n_vocab, 5);
    auto engine = Engine::create(model, f32_options(5));
    const std::vector<float> hidden = engine->eval_hidden(engine->memory().create_sequence(), tokens);
    const auto ref = reference_hidden(*model, tokens);
    const int n = (int)tokens.size();
    for (Pooling p : {Pooling::Mean, Pooling::Cls, Pooling::Last}) {
      for (int norm : {2, -1, 0, 1, 3}) {
        PromptPooler pooler(p, n, n_embd);
        for (int i = n - 1; i >= 0; --i)  // any order
          if (pooler.wants(i)) pooler.add(i, hidden.data() + (size_t)i * n_embd);
        ASSERT_TRUE(pooler.complete());
        const auto got = pooler.result(norm);
        ASSERT_EQ(got.size(), 1u);
        const std::vector<double> want = pooled_reference(ref, p, norm);
        EXPECT_LT(nmse(got[0].data(), want), 1e-10) << spec << " " << pooling_name(p) << " norm " << norm;
        if (norm == 2) {
          double s = 0;
          for (float x : got[0]) s += (double)x * x;
          EXPECT_NEAR(std::sqrt(s), 1.0, 1e-5);
        }
      }
    }
    PromptPooler none(Pooling::None, n, n_embd);
    for (int i = 0; i < n; ++i) {
      EXPECT_TRUE(none.wants(i));
      none.add(i, hidden.data() + (size_t)i * n_embd);
    }
    const auto rows = none.result(2);
    ASSERT_EQ(rows.size(), (size_t)n);
    for (int i = 0; i < n; ++i) EXPECT_LT(nmse(rows[i].data(), ref[i]), 1e-10) << "pooling none is not normalised";
  }
}

TEST(EmbeddingTest, PoolerWantsOnlyWhatItPools) {
  PromptPooler cls(Pooling::Cls, 4, 3), last(Pooling::Last, 4, 3);
  EXPECT_TRUE(cls.wants(0));
  EXPECT_FALSE(cls.wants(3));
  EXPECT_FALSE(last.wants(0));
  EXPECT_TRUE(last.wants(3));
  EXPECT_FALSE(last.complete());
  const float row[3] = {3, 0, 4};
  last.add(3, row);
  EXPECT_TRUE(last.complete());
  EXPECT_EQ(last.result(2)[0], (std::vector<float>{0.6f, 0.0f, 0.8f}));
  std::vector<float> zero(3, 0.0f);
  normalize_embedding(zero, 2);
  EXPECT_EQ(zero, std::vector<float>(3, 0.0f)) << "a zero vector stays zero";
}

TEST(EmbeddingTest, PoolingNamesAndDefaults) {
  EXPECT_EQ(parse_pooling("mean"), Pooling::Mean);
  EXPECT_EQ(parse_pooling("cls"), Pooling::Cls);
  EXPECT_EQ(parse_pooling("last"), Pooling::Last);
  EXPECT_EQ(parse_pooling("none"), Pooling::None);
  EXPECT_THROW(parse_pooling("rank"), Error);
  EXPECT_THROW(parse_pooling("max"), Error);
  for (Pooling p : {Pooling::None, Pooling::Mean, Pooling::Cls, Pooling::Last}) EXPECT_EQ(parse_pooling(pooling_name(p)), p);
  // A generative model without a pooling key: none, as llama.cpp defaults.
  EXPECT_EQ(model_default_pooling(*tiny("tiny-qwen3:F32")), Pooling::None);
  // With `<arch>.pooling_type` (llama.cpp's numbering), that one.
  auto file = open_model_file("synthetic:tiny-qwen3:F32");
  const std::pair<int, Pooling> keyed[] = {{0, Pooling::None}, {1, Pooling::Mean}, {2, Pooling::Cls}, {3, Pooling::Last}};
  for (const auto& [value, want] : keyed) {
    gguf::Metadata md = file->metadata();
    md.set("qwen3.pooling_type", gguf::Value::u32((uint32_t)value));
    auto keyed_file = gguf::GgufFile::from_parts("keyed", md, file->tensors(), file);
    EXPECT_EQ(model_default_pooling(*Model::load(keyed_file)), want) << value;
  }
}
