// Helpers shared by the engine tests (CPU and GPU): tiny synthetic models, deterministic token runs,
// a prompt-then-decode driver, and the skip for builds or machines without a CUDA GPU.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/gpu.h"
#include "engine/engine.h"
#include "model/model.h"
#include "model/model_file.h"

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

}  // namespace roofline::test
