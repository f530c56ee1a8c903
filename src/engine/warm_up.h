// The steps `roofline serve` runs before it listens, so that the first requests do not pay for loading
// kernels, cuBLAS's algorithm choices or the decode buckets' CUDA graph captures (tens of milliseconds
// that would land on their time to the first token), as llama-server warms up before serving.
#pragma once

#include "engine/engine.h"

namespace roofline {

struct WarmUpOptions {
  int n_parallel = 1;           // the server's slots: decode steps of 1, 2, 4, ... rows up to these (64 at most)
  bool shorter_prompts = false;  // also prompt steps of a quarter, a sixteenth, ... of the longest (down to 16 rows)
};

// Prompt steps (the longest: a batch of rows, at most a quarter of the context), then the decode steps, on
// sequences freed after; a shorter prompt's sequence is freed before the next is made, so a model that
// keeps a recurrent state per sequence needs no more states than the slots. Returns false where a step
// could not run (a context or state count too small for it): warming up is never a reason not to serve.
bool warm_up(Engine& engine, const WarmUpOptions& options);

}  // namespace roofline
