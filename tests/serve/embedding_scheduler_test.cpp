// Embedding requests in the scheduler, on the real engine (CPU): each input runs as a sequence of its
// own beside generation, its pooled vector is what the engine gives the input alone, generation's
// tokens do not change, nothing stays in the KV cache or the prompt cache afterwards (attention and
// recurrent models), and an input longer than the context is refused with a clear 400.
#include <gtest/gtest.h>

#include "engine/engine.h"
#include "engine/pooling.h"
#include "model/model_file.h"
#include "serve/scheduler.h"
#include "scheduler_runs.h"

using namespace roofline;
using namespace roofline::serve;
using roofline::serve::test::NoText;
using roofline::serve::test::greedy_request;
using roofline::serve::test::step_until_done;

namespace {

std::unique_ptr<Engine> engine_for(std::shared_ptr<const Model> model, int n_ctx = 256) {
  EngineOptions o;
  o.n_ctx = n_ctx;
  o.kv_block_size = 16;
  o.n_batch = 16;
  o.n_threads = 2;
  o.type_k = o.type_v = DType::F32;
  o.n_seq_max = 4;
  o.n_state_snapshots = 8;
  return Engine::create(std::move(model), o);
}

std::vector<int32_t> tokens(int n, int n_vocab, int salt) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back((int32_t)((i * 97 + 5 + salt * 31) % n_vocab));
  return t;
}

GenParams embedding(std::vector<int32_t> prompt, Pooling pooling) {
  GenParams p;
  p.id = "e";
  p.prompt = std::move(prompt);
  p.embedding = true;
  p.pooling = pooling;
  return p;
}

struct Outcome {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> embedding;
  std::vector<Finish> finishes;
};

std::vector<Outcome> run(Scheduler& s, const std::vector<std::shared_ptr<Request>>& reqs) {
  std::vector<Outcome> out(reqs.size());
  step_until_done(s, reqs, [&](size_t k, Event& e) {
    EXPECT_NE(e.finish, Finish::Error) << e.error;
    out[k].tokens.insert(out[k].tokens.end(), e.tokens.begin(), e.tokens.end());
    if (!e.embedding.empty()) out[k].embedding = e.embedding;
    if (e.finish != Finish::None) out[k].finishes.push_back(e.finish);
  }, 5000);
  return out;
}

// The input alone on a fresh engine, pooled and normalised.
std::vector<std::vector<float>> alone(std::shared_ptr<const Model> model, const std::vector<int32_t>& input, Pooling p) {
  auto engine = engine_for(model);
  const std::vector<float> h = engine->eval_hidden(engine->memory().create_sequence(), input);
  const int n_embd = model->hparams().n_embd;
  PromptPooler pooler(p, (int)input.size(), n_embd);
  for (int i = 0; i < (int)input.size(); ++i)
    if (pooler.wants(i)) pooler.add(i, h.data() + (size_t)i * n_embd);
  return pooler.result(2);
}

double nmse(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += ((double)got[i] - want[i]) * ((double)got[i] - want[i]);
    den += (double)want[i] * want[i];
  }
  return num / den;
}

}  // namespace

TEST(EmbeddingSchedulerTest, EmbeddingsBesideGenerationMatchEachAloneAndKeepNothing) {
  for (const char* spec : {"synthetic:tiny-qwen3:F32", "synthetic:tiny-qwen35:F32"}) {
    SCOPED_TRACE(spec);
    auto model = Model::load(open_model_file(spec));
    const int n_vocab = model->hparams().n_vocab;
    const std::vector<int32_t> prompt = tokens(20, n_vocab, 0);

    // Generation alone, for its tokens.
    std::vector<int32_t> want_tokens;
    {
      auto engine = engine_for(model);
      EngineRunner runner(*engine);
      NoText text;
      Scheduler s(runner, text, SchedulerOptions{});
      want_tokens = run(s, {s.submit(greedy_request(prompt, 12))})[0].tokens;
      ASSERT_EQ(want_tokens.size(), 12u);
    }

    auto engine = engine_for(model);
    EngineRunner runner(*engine);
    NoText text;
    Scheduler s(runner, text, SchedulerOptions{});
    // The embedding inputs share the generation's prefix (the prompt cache must not hand them blocks:
    // every position is evaluated) and are longer than a step, so they span several.
    std::vector<int32_t> long_input = prompt;
    for (int32_t t : tokens(30, n_vocab, 7)) long_input.push_back(t);
    const std::vector<std::pair<std::vector<int32_t>, Pooling>> inputs = {
        {long_input, Pooling::Mean}, {long_input, Pooling::Last}, {tokens(9, n_vocab, 3), Pooling::Cls},
        {tokens(5, n_vocab, 4), Pooling::None}, {long_input, Pooling::Mean}};
    std::vector<std::shared_ptr<Request>> reqs = {s.submit(greedy_request(prompt, 12))};
    for (const auto& [in, p] : inputs) reqs.push_back(s.submit(embedding(in, p)));
    const std::vector<Outcome> out = run(s, reqs);

    EXPECT_EQ(out[0].tokens, want_tokens) << "embedding traffic changed generation";
    for (size_t k = 0; k < inputs.size(); ++k) {
      const auto& [in, p] = inputs[k];
      const Outcome& o = out[k + 1];
      EXPECT_TRUE(o.tokens.empty());
      ASSERT_EQ(o.finishes.size(), 1u);
      const auto want = alone(model, in, p);
      ASSERT_EQ(o.embedding.size(), want.size()) << pooling_name(p);
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_EQ(o.embedding[i].size(), (size_t)model->hparams().n_embd);
        EXPECT_LT(nmse(o.embedding[i], want[i]), 1e-10) << pooling_name(p) << " vector " << i;
      }
    }
    EXPECT_EQ(out[1].embedding, out[5].embedding) << "the same input twice gives the same vector";
    const SequenceMemory& mem = engine->memory();
    EXPECT_EQ(mem.used_blocks(), 0) << "a sequence was left behind";
    // Only generation's 32 positions (two blocks of 16) may sit in the prompt cache: the embedding
    // inputs (50 tokens, three blocks, two of them their own) left nothing there.
    EXPECT_LE(mem.cached_blocks(), 2);
  }
}

TEST(EmbeddingSchedulerTest, InputsUpToTheContextRunLongerOnesAreRefused) {
  auto model = Model::load(open_model_file("synthetic:tiny-qwen3:F32"));
  auto engine = engine_for(model, 64);
  EngineRunner runner(*engine);
  NoText text;
  Scheduler s(runner, text, SchedulerOptions{});
  const int n_vocab = model->hparams().n_vocab;
  try {
    s.submit(embedding(tokens(65, n_vocab, 1), Pooling::Mean));
    ADD_FAILURE() << "an input longer than the context was accepted";
  } catch (const SubmitError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.code, "context_length_exceeded");
    EXPECT_NE(std::string(e.what()).find("65 tokens, more than the context size of 64"), std::string::npos) << e.what();
  }
  try {
    s.submit(embedding({}, Pooling::Mean));
    ADD_FAILURE() << "an empty input was accepted";
  } catch (const SubmitError& e) {
    EXPECT_EQ(e.status, 400);
  }
  // Exactly the context: fine (nothing is generated after it).
  const auto out = run(s, {s.submit(embedding(tokens(64, n_vocab, 1), Pooling::Last))});
  ASSERT_EQ(out[0].embedding.size(), 1u);
  EXPECT_EQ(engine->memory().used_blocks(), 0);
}
