// The steps `roofline serve` runs before it listens, so that the first requests do not pay for loading
// kernels, cuBLAS's algorithm choices or the decode steps' CUDA graph captures (milliseconds each, which
// would land on a request's time to its first token), as llama-server warms up before serving.
#pragma once

#include <functional>
#include <vector>

#include "engine/engine.h"

namespace roofline {

struct WarmUpOptions {
  int n_parallel = 1;            // the server's slots: decode steps of 1, 2, 4, ... rows up to these (64 at most)
  bool shorter_prompts = false;  // also prompt steps of a quarter, a sixteenth, ... of the longest (down to 16 rows)
  // Key counts (Engine::decode_graph_depths) at which to run decode steps of each of graph_rows' counts (those
  // above the slots as the slots' own count), one sequence grown through them as the deepest row: every captured
  // form a decode step meets at those depths.
  std::vector<int> graph_depths;
  // The row counts whose decode steps take forms of their own (Engine::decode_graph_rows); empty: 1, 2, 4 and 8.
  std::vector<int> graph_rows;
  // The walk stops before depths past this many keys: a request that reaches them has spent seconds on its prompt,
  // beside which one capture (~5 ms) is small, while the walk would evaluate that many tokens at every start.
  int max_walk_keys = 8192;
  // Told of every decode step the warm-up runs (not its prompts): its rows and its deepest row's key count.
  std::function<void(int rows, int keys)> on_decode_step;
};

// Prompt steps (the longest: a batch of rows, at most a quarter of the context), then the decode steps, then
// the walk through graph_depths, on sequences freed after; a shorter prompt's sequence is freed before the
// next is made, so a model that keeps a recurrent state per sequence needs no more states than the slots.
// Returns false where a step could not run (a context or state count too small for it): warming up is never
// a reason not to serve.
bool warm_up(Engine& engine, const WarmUpOptions& options);

}  // namespace roofline
