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
  const int slots = std::max(1, options.n_parallel);
  // Each count of graph_rows, those above the slots as the slots' count (the bucket of every count up to it).
  std::vector<int> row_counts;
  for (int r : options.graph_rows.empty() ? std::vector<int>{1, 2, 4, 8} : options.graph_rows)
    if (r >= 1) row_counts.push_back(std::min(r, slots));
  std::sort(row_counts.begin(), row_counts.end());
  row_counts.erase(std::unique(row_counts.begin(), row_counts.end()), row_counts.end());
  if (row_counts.empty()) return;
  const int max_rows = row_counts.back();
  seqs.push_back(mem.create_sequence(false));
  const int deep = seqs.back();
  // The other rows: sequences of one token each, fed in steps of up to n_batch rows.
  const int n_batch = std::max(1, engine.options().n_batch);
  for (int r = 1; r < max_rows;) {
    std::vector<Engine::BatchRow> batch;
    for (; r < max_rows && (int)batch.size() < n_batch; ++r) {
      seqs.push_back(mem.create_sequence(false));
      batch.push_back({seqs.back(), warm_up_token((size_t)r, n_vocab), false});
    }
    batch.back().want_logits = true;  // as eval() asks for a prompt's last row
    engine.step(batch);
  }
  // The deep sequence's blocks: what the context leaves beside the short ones' (a token, then one more in each
  // step at each depth, and a block for the rounding) and the row steps' tokens at each depth.
  const int steps = (int)(row_counts.size() * options.graph_depths.size());
  const int short_blocks = (1 + steps + mem.block_size() - 1) / mem.block_size() + 1;
  const int room = (mem.n_blocks() - (max_rows - 1) * short_blocks) * mem.block_size() - (int)row_counts.size();
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
