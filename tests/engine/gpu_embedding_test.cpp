// Embeddings on the CUDA backend (skipped without a GPU): the final hidden states of rows that ask for
// them (Backend::output_hidden) match the CPU engine's, for full and partial offload, prefill chunks and
// decode-sized (graph-bucketed) steps, attention and recurrent models; in a step that also wants logits
// and greedy tokens, each output is what a step asking only for it gives (to rounding). Run on the GPU machine:
// roofline_tests --gtest_filter='Gpu*'.
#include <gtest/gtest.h>

#include "backend/gpu.h"
#include "engine/engine.h"
#include "model/model_file.h"
#include "engine/engine_test_util.h"
#include "test_util.h"

using namespace roofline;
using test::tiny;
using test::some_tokens;

namespace {

bool have_gpu() { return !gpu_devices().empty(); }

// Hidden rows of `tokens`: a prefill chunk of 16, then steps of 3 rows, then single rows.
std::vector<float> hidden_of(std::shared_ptr<const Model> model, EngineOptions o, const std::vector<int32_t>& tokens) {
  o.n_batch = 16;
  auto engine = Engine::create(model, o);
  const int seq = engine->memory().create_sequence();
  std::vector<float> out;
  size_t i = 0;
  for (size_t step : {16, 3, 3, 1, 1, 1}) {
    const size_t end = std::min(tokens.size(), i + step);
    const auto h = engine->eval_hidden(seq, std::span<const int32_t>(tokens.data() + i, end - i));
    out.insert(out.end(), h.begin(), h.end());
    i = end;
  }
  const auto rest = engine->eval_hidden(seq, std::span<const int32_t>(tokens.data() + i, tokens.size() - i));
  out.insert(out.end(), rest.begin(), rest.end());
  return out;
}

}  // namespace

TEST(GpuEmbeddingTest, HiddenRowsMatchTheCpu) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU in this build or machine";
  for (const char* spec : {"tiny-qwen3:F32", "tiny-llama:Q8_0", "tiny-qwen3:Q4_K_M", "tiny-qwen35:F32", "tiny-qwen35:Q4_K_M"}) {
    auto model = tiny(spec);
    const auto tokens = some_tokens(32, model->hparams().n_vocab);
    EngineOptions cpu, full, output_only;
    full.n_gpu_layers = EngineOptions::kGpuLayersAll;
    output_only.n_gpu_layers = 1;  // only the output unit on the GPU: the hidden state crosses from the CPU
    const auto want = hidden_of(model, cpu, tokens);
    for (const EngineOptions& o : {full, output_only}) {
      const auto got = hidden_of(model, o, tokens);
      ASSERT_EQ(got.size(), want.size()) << spec;
      const double e = test::nmse(got.data(), want.data(), want.size());
      std::printf("%-20s -ngl %d: GPU vs CPU hidden NMSE %.3g\n", spec, o.n_gpu_layers, e);
      EXPECT_LT(e, 2e-3) << spec << " -ngl " << o.n_gpu_layers;
    }
  }
}

// One step with a sequence wanting logits (one row greedy only), one wanting hidden rows, and a row
// wanting both: the same logits, greedy tokens and hidden states as steps asking for each alone.
TEST(GpuEmbeddingTest, HiddenLogitAndGreedyRowsInOneStep) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU in this build or machine";
  auto model = tiny("tiny-qwen3:Q4_K_M");
  const int n_vocab = model->hparams().n_vocab, n_embd = model->hparams().n_embd;
  const auto a = some_tokens(5, n_vocab, 1), b = some_tokens(6, n_vocab, 2);
  EngineOptions o;
  o.n_gpu_layers = EngineOptions::kGpuLayersAll;

  auto alone = Engine::create(model, o);
  const int sa = alone->memory().create_sequence(), sb = alone->memory().create_sequence();
  std::vector<Engine::BatchRow> rows_a, rows_b;
  for (size_t i = 0; i < a.size(); ++i) rows_a.push_back({sa, a[i], true, i + 1 == a.size(), false});
  for (size_t i = 0; i < b.size(); ++i) rows_b.push_back({sb, b[i], false, false, true});
  const Engine::StepOutput out_a = alone->step(rows_a);
  std::vector<std::vector<float>> logits_a;
  for (const float* l : out_a.logits) logits_a.push_back(l ? std::vector<float>(l, l + n_vocab) : std::vector<float>());
  const Engine::StepOutput out_b = alone->step(rows_b);
  std::vector<float> hidden_b(out_b.hidden_buffer.begin(), out_b.hidden_buffer.begin() + b.size() * n_embd);

  auto mixed = Engine::create(model, o);
  const int ma = mixed->memory().create_sequence(), mb = mixed->memory().create_sequence();
  std::vector<Engine::BatchRow> rows;
  for (const auto& r : rows_a) rows.push_back({ma, r.token, r.want_logits, r.argmax_only, false});
  for (size_t i = 0; i < b.size(); ++i) rows.push_back({mb, b[i], i + 1 == b.size(), false, true});
  const Engine::StepOutput& out = mixed->step(rows);
  ASSERT_EQ(out.logits.size(), a.size() + 1);
  ASSERT_EQ(out.hidden.size(), b.size());
  EXPECT_EQ(out.argmax[a.size() - 1], out_a.argmax[a.size() - 1]);
  // Steps of other sizes take other kernels (decode buckets, GEMM): equal to rounding, and a row mixed
  // up with another would be far off.
  for (size_t i = 0; i + 1 < a.size(); ++i) EXPECT_LT(test::nmse(out.logits[i], logits_a[i].data(), n_vocab), 2e-3) << i;
  for (size_t i = 0; i < b.size(); ++i) EXPECT_LT(test::nmse(out.hidden[i], hidden_b.data() + i * n_embd, n_embd), 2e-3) << i;
}
