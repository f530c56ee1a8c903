// Helpers shared by the engine tests (CPU and GPU): tiny synthetic models, deterministic token runs,
// a prompt-then-decode driver, and the skip for builds or machines without a CUDA GPU.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/gpu.h"
#include "engine/engine.h"
#include "model/model.h"
#include "model/model_file.h"
#include "test_util.h"

#define SKIP_WITHOUT_GPU() \
  if (::roofline::gpu_devices().empty()) GTEST_SKIP() << "no CUDA GPU in this build or machine"

namespace roofline::test {

// `synthetic:SPEC` loaded (e.g. "tiny-qwen3:Q4_K_M").
inline std::shared_ptr<const Model> tiny(const std::string& spec) { return Model::load(open_model_file("synthetic:" + spec)); }

// n token ids below n_vocab, a fixed pattern per salt.
inline std::vector<int32_t> some_tokens(int n, int n_vocab, int salt = 0) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back((int32_t)((i * 131 + 7 + salt * 29) % n_vocab));
  return t;
}

// The first `prompt` tokens as one eval (logits of every position), then the rest one token per step;
// the logits of every position, in order. The sequence is freed afterwards.
inline std::vector<float> prompt_then_decode(Engine& engine, const std::vector<int32_t>& tokens, size_t prompt) {
  const int seq = engine.memory().create_sequence();
  auto out = engine.eval(seq, std::span<const int32_t>(tokens.data(), prompt), true);
  for (size_t i = prompt; i < tokens.size(); ++i) {
    auto l = engine.eval(seq, std::span<const int32_t>(&tokens[i], 1), false);
    out.insert(out.end(), l.begin(), l.end());
  }
  engine.memory().free_sequence(seq);
  return out;
}

// prompt_then_decode on an engine with `units` on the GPU (options otherwise `o`), scored as the NMSE
// against `want` (the same run on the CPU); infinity, with a failure, if the engine places other units.
inline double offload_nmse(const std::shared_ptr<const Model>& model, EngineOptions o, int units,
                           const std::vector<int32_t>& tokens, size_t prompt, const std::vector<float>& want) {
  o.n_gpu_layers = units;
  auto gpu = Engine::create(model, o);
  EXPECT_EQ(gpu->gpu_units(), units);
  const auto got = prompt_then_decode(*gpu, tokens, prompt);
  EXPECT_EQ(got.size(), want.size());
  if (gpu->gpu_units() != units || got.size() != want.size()) return INFINITY;
  return nmse(got.data(), want.data(), got.size());
}

// Five sequences (prompts of 9, 16, .. 37 tokens, then `n_gen` tokens each): the logits of each decoded
// alone, one engine per sequence, and of all five decoded together, one row each a step, must be the
// same bits.
inline void expect_decode_batches_match_each_alone(const std::shared_ptr<const Model>& model, const EngineOptions& o,
                                                   int n_gen, const std::string& label) {
  const int n_vocab = model->hparams().n_vocab, n_seq = 5;
  std::vector<std::vector<int32_t>> prompts, gens;
  for (int k = 0; k < n_seq; ++k) {
    prompts.push_back(some_tokens(9 + 7 * k, n_vocab, k));
    gens.push_back(some_tokens(n_gen, n_vocab, 40 + k));
  }
  std::vector<std::vector<float>> alone;
  for (int k = 0; k < n_seq; ++k) {
    auto e = Engine::create(model, o);
    const int s = e->memory().create_sequence();
    e->eval(s, prompts[k], false);
    std::vector<float> l;
    for (int32_t t : gens[k]) {
      const int32_t one[1] = {t};
      auto r = e->eval(s, one, false);
      l.insert(l.end(), r.begin(), r.end());
    }
    alone.push_back(l);
  }
  auto e = Engine::create(model, o);
  std::vector<int> seqs;
  for (int k = 0; k < n_seq; ++k) {
    seqs.push_back(e->memory().create_sequence());
    e->eval(seqs[k], prompts[k], false);
  }
  for (int i = 0; i < n_gen; ++i) {
    std::vector<Engine::BatchRow> rows;
    for (int k = 0; k < n_seq; ++k) rows.push_back({seqs[k], gens[k][i], true});
    const auto l = e->decode(rows);
    ASSERT_EQ(l.size(), (size_t)n_seq * n_vocab) << label;
    for (int k = 0; k < n_seq; ++k)
      EXPECT_EQ(0, std::memcmp(l.data() + (size_t)k * n_vocab, alone[k].data() + (size_t)i * n_vocab, n_vocab * sizeof(float)))
          << label << " sequence " << k << " step " << i;
  }
}

}  // namespace roofline::test
