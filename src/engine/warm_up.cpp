// The serve warm-up's steps (warm_up.h).
#include "engine/warm_up.h"

#include <algorithm>
#include <span>
#include <vector>

#include "core/error.h"
#include "core/log.h"

namespace roofline {

bool warm_up(Engine& engine, const WarmUpOptions& options) {
  SequenceMemory& mem = engine.memory();
  const int n_prompt = std::max(1, std::min(engine.options().n_batch, engine.options().n_ctx / 4));
  const int n_vocab = engine.n_vocab();
  std::vector<int32_t> tokens((size_t)n_prompt + 1);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = (int32_t)((7 + 131 * i) % (size_t)n_vocab);
  std::vector<int> seqs;  // the sequences alive now, freed at the end whatever happens
  bool complete = true;
  try {
    for (int rows = n_prompt / 4; options.shorter_prompts && rows >= 16; rows /= 4) {
      seqs.push_back(mem.create_sequence(false));
      engine.eval(seqs.back(), std::span<const int32_t>(tokens.data(), (size_t)rows), false);
      mem.free_sequence(seqs.back());
      seqs.pop_back();
    }
    seqs.push_back(mem.create_sequence(false));
    engine.eval(seqs[0], std::span<const int32_t>(tokens.data(), (size_t)n_prompt), false);
    for (int rows = 1; rows <= std::min(64, std::max(1, options.n_parallel)); rows *= 2) {
      while ((int)seqs.size() < rows) {
        seqs.push_back(mem.create_sequence(false));
        engine.eval(seqs.back(), std::span<const int32_t>(tokens.data(), 1), false);
      }
      std::vector<Engine::BatchRow> batch;
      for (int i = 0; i < rows; ++i) batch.push_back({seqs[(size_t)i], tokens[(size_t)(i + 1) % tokens.size()], true, true});
      engine.step(batch);
    }
  } catch (const Error& e) {
    log_debug("warm-up stopped early: {}", e.what());
    complete = false;
  }
  for (int s : seqs) mem.free_sequence(s);
  return complete;
}

}  // namespace roofline
