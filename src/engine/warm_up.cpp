// The serve warm-up's steps (warm_up.h).
#include "engine/warm_up.h"

#include <algorithm>
#include <span>
#include <vector>

#include "core/error.h"
#include "core/log.h"

namespace roofline {
namespace {

// Token ids spread over the vocabulary (the values do not matter, only the steps' shapes).
int32_t warm_up_token(size_t i, int n_vocab) { return (int32_t)((7 + 131 * i) % (size_t)n_vocab); }

// One sequence (the deepest row) grown through `depths`; at each, decode steps of each row count, the other rows
// short sequences of their own. Every sequence it makes is in `seqs` (freed by the caller).
void walk_graph_depths(Engine& engine, const WarmUpOptions& options, std::vector<int>& seqs) {
  SequenceMemory& mem = engine.memory();
  const int n_vocab = engine.n_vocab();
  const int max_rows = std::min(8, std::max(1, options.n_parallel));
  std::vector<int> row_counts;  // 1, 2, 4 below max_rows, then max_rows (the bucket of any count up to it)
  for (int r = 1; r < max_rows; r *= 2) row_counts.push_back(r);
  row_counts.push_back(max_rows);
  seqs.push_back(mem.create_sequence(false));
  const int deep = seqs.back();
  std::vector<int32_t> one(1);
  for (int r = 1; r < max_rows; ++r) {
    seqs.push_back(mem.create_sequence(false));
    one[0] = warm_up_token((size_t)r, n_vocab);
    engine.eval(seqs.back(), one, false);
  }
  // The deep sequence's blocks: what the context leaves beside the short ones' (one block each, a few more
  // after the steps) and the row steps' tokens at each depth.
  const int room = mem.n_blocks() * mem.block_size() - 2 * max_rows * mem.block_size() - (int)row_counts.size();
  int len = 0;  // the deep sequence's tokens
  std::vector<int32_t> tokens;
  for (int keys : options.graph_depths) {
    if (keys - 1 < len) continue;  // the row steps at an earlier depth reached past it
    if (keys - 1 > room || keys > options.max_walk_keys) break;
    tokens.resize((size_t)(keys - 1 - len));
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = warm_up_token((size_t)len + i, n_vocab);
    if (!tokens.empty()) engine.eval(deep, tokens, false);
    len = keys - 1;
    for (int rows : row_counts) {
      std::vector<Engine::BatchRow> batch;
      for (int i = 0; i < rows; ++i) batch.push_back({seqs[(size_t)i], warm_up_token((size_t)(len + i), n_vocab), true, true});
      engine.step(batch);
      ++len;
      if (options.on_decode_step) options.on_decode_step(rows, len);
    }
  }
}

}  // namespace

bool warm_up(Engine& engine, const WarmUpOptions& options) {
  SequenceMemory& mem = engine.memory();
  const int n_prompt = std::max(1, std::min(engine.options().n_batch, engine.options().n_ctx / 4));
  const int n_vocab = engine.n_vocab();
  std::vector<int32_t> tokens((size_t)n_prompt + 1);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = warm_up_token(i, n_vocab);
  std::vector<int> seqs;  // the sequences alive now, freed at the end whatever happens
  const auto free_all = [&] {
    for (int s : seqs) mem.free_sequence(s);
    seqs.clear();
  };
  bool complete = true;
  try {
    for (int rows = n_prompt / 4; options.shorter_prompts && rows >= 16; rows /= 4) {
      seqs.push_back(mem.create_sequence(false));
      engine.eval(seqs.back(), std::span<const int32_t>(tokens.data(), (size_t)rows), false);
      free_all();
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
      if (options.on_decode_step) options.on_decode_step(rows, mem.length(seqs[0]));
    }
    free_all();
    if (!options.graph_depths.empty()) walk_graph_depths(engine, options, seqs);
  } catch (const Error& e) {
    log_debug("warm-up stopped early: {}", e.what());
    complete = false;
  }
  free_all();
  return complete;
}

}  // namespace roofline
