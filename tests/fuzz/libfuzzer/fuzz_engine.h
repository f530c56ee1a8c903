// Shared by the fuzz targets that load a model (fuzz_model_file, fuzz_convert): a model that loaded must
// run. A CPU engine of 64 positions on one thread takes a prompt of five tokens (ids spread over the
// vocabulary, all logits) and then one decode step; throws whatever the engine throws.
#pragma once

#include <algorithm>
#include <memory>
#include <vector>

#include "engine/engine.h"
#include "engine/sequence_memory.h"
#include "model/model.h"

namespace roofline::fuzz {

inline void run_a_few_tokens(std::shared_ptr<const Model> model) {
  EngineOptions o;
  o.n_ctx = 64;
  o.n_threads = 1;
  o.n_batch = 8;
  o.kv_block_size = 16;
  o.n_seq_max = 2;
  auto engine = Engine::create(std::move(model), o);
  const int seq = engine->memory().create_sequence();
  const int n_vocab = std::max(1, engine->n_vocab());
  std::vector<int32_t> prompt;
  for (int i = 0; i < 5; ++i) prompt.push_back((i * 7 + 1) % n_vocab);
  engine->eval(seq, prompt, true);
  engine->eval(seq, std::vector<int32_t>{3 % n_vocab});
}

}  // namespace roofline::fuzz
