// The step descriptor: everything a forward step needs, in one value the backend copies to its
// device once. A step is a batch of tokens from one or more sequences; each sequence's tokens are
// contiguous in the batch and continue its cached positions (prefill chunks and decode tokens mix).
#pragma once

#include <cstdint>
#include <vector>

#include "formats/dtype.h"

namespace roofline {

struct StepSequence {
  int32_t seq_id = 0;       // the engine's id (for diagnostics)
  int32_t n_past = 0;       // positions already in the KV cache before this step
  int32_t n_new = 0;        // tokens of this sequence in the step
  int32_t first_token = 0;  // index of its first token in the step
  std::vector<int32_t> block_table;  // KV blocks holding positions [0, n_past + n_new), in order
  // The recurrent-state cell of the sequence (models with DeltaNet layers; -1 otherwise): read at the
  // start of the step unless n_past == 0 (a new sequence starts from zero), written at its end.
  int32_t state_cell = -1;
};

struct StepDesc {
  std::vector<int32_t> tokens;      // token id per batch row
  std::vector<int32_t> positions;   // RoPE position per row (n_past + offset within the sequence)
  std::vector<int32_t> row_seq;     // index into `sequences` per row
  std::vector<int32_t> logit_rows;  // rows whose logits are wanted, ascending
  // Per logit row (empty: all 0): 1 when only its greedy token is wanted, the row's argmax, so a
  // backend that picks it where the logits are (Backend::output_argmax) need not copy them back.
  std::vector<uint8_t> argmax_only;
  // Per logit row with argmax_only (empty, or nullptr: every token): the tokens its argmax may pick, bit
  // t of word t / 64 (argmax_allowed in engine/sampler.h): constrained decoding's mask. Host memory,
  // valid until the step's output is read.
  std::vector<const uint64_t*> argmax_allowed;
  // Rows whose final hidden state (after the output norm, what the output matrix would read) is
  // wanted instead of, or besides, logits: embeddings. Ascending.
  std::vector<int32_t> hidden_rows;
  std::vector<StepSequence> sequences;

  int n_tokens() const { return (int)tokens.size(); }
};

// The paged KV cache's geometry, chosen by the engine; each backend lays out its own layers' blocks.
struct KvConfig {
  int n_blocks = 0;
  int block_size = 32;  // token positions per block
  DType type_k = DType::F16;
  DType type_v = DType::F16;
  // Sliding-window layers (gemma3), when > 0: instead of paged blocks, each sequence's state cell holds a
  // ring of this many positions per sliding layer (position p in slot p % swa_ring): the window plus the
  // most tokens a step adds, in whole blocks, so a sliding layer's memory is bounded by the window
  // whatever the context.
  int swa_ring = 0;
  // Prompt-cache snapshots of the rings (SequenceMemory's windowed mode): blocks of positions each holds
  // per sliding layer, the window before a block boundary (kept in host memory, as llama.cpp's checkpoints).
  int swa_snapshot_blocks = 0;
};

}  // namespace roofline
