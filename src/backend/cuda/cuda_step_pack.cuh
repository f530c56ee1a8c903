// A step's descriptor on the device (cuda_backend.cu's begin_step): the engine's StepDesc packed into the
// step buffer (StepLayout: header, rows, DeltaNet sequence records, block tables, sliding-window ring
// tables), the attention plan for it (plan_attention: splits, query-head parts, prefill runs), copied to
// the device in one transfer, and the device-side views every kernel of the step reads.
#pragma once

#include <cuda_runtime.h>

#include <vector>

#include "backend/cuda/cuda_delta_net.cuh"
#include "backend/cuda/cuda_kernels.cuh"
#include "backend/cuda/step_layout.h"

namespace roofline::cuda {

// The rows a step runs as: a decode-sized step (up to 8 rows) padded to its bucket (1, 2, 4, 8), so that
// one captured graph per bucket replays every such step; larger steps as they are (but see batched_bucket).
inline int decode_bucket(int n) { return n <= 1 ? 1 : n <= 2 ? 2 : n <= 4 ? 4 : n <= 8 ? 8 : n; }
// A batched decode step (9-64 rows, one row per sequence) where the backend buckets them (StepPackConfig::
// batched_buckets): padded to a multiple of 16, the token tiles its products already compute (the warpgroup
// kernel's N, the mma.sync kernel's n8 pairs), so steps of 9-64 rows take 4 captured graphs a depth, not 56.
inline int batched_bucket(int n) { return (n + 15) / 16 * 16; }

// What packing needs of the backend: its capacities, attention tunables and memory shape.
struct StepPackConfig {
  int max_tokens = 1;
  StepLayout layout;  // the step buffer's layout (the backend sizes its buffers by the same one)
  int max_splits = 1;
  AttentionSpans spans;
  int prefill_min_keys = 0;  // prompt runs reaching this many keys go through prefill_attention (0: none do)
  bool rings = false;       // some layer on this backend keeps a sliding-window ring
  int swa_ring = 0, kv_block_size = 16, sliding_window = 0;
  int n_state_cells = 0;
  bool delta_net = false;     // DeltaNet layers on this backend: their sequence records are packed
  bool delta_net_chunked = false;  // the chunked DeltaNet form is available
  int delta_net_chunked_min_rows = 64;  // a sequence's rows from which the chunked form runs
  // Batched decode steps (9-64 rows, one row per sequence, no MoE or -sm row) run padded to batched_bucket, with
  // an attention grid of a power of two splits (plan_attention's bucket_rows), as decode-sized steps do.
  bool batched_buckets = false;
};

struct PackedStep {
  int n_real = 0;  // the step's rows
  int n_tok = 0;   // rows the kernels run: a decode step padded to its bucket (1, 2, 4, 8; batched: 16, 32, 48, 64)
  // Attention: the split kernel's splits per row and rows, whether its CTAs split query-head groups,
  // the prompt runs that go through prefill_attention and, with runs, the rows the split kernel takes.
  int splits = 1, grid_splits = 1, n_attn_rows = 0;
  bool split_heads = false;
  std::vector<PrefillRun> prefill_runs;
  const int* attn_rows_dev = nullptr;
  DeviceStep dstep;      // the step as kernels read it
  DeviceStep dstep_swa;  // dstep with the ring tables as block tables (sliding-window ring layers)
  // DeltaNet layers: the sequence records, how many are real, the most rows of one sequence, the form.
  DeltaNetSeqs dn_seqs;
  int dn_real_seqs = 0, dn_max_seq_rows = 1;
  DeltaNetForm dn_form = DeltaNetForm::Recurrent;
};

// Packs `step` into host (pinned, StepLayout::capacity ints) and copies it to dev (the device buffer of the
// same size) on stream. Fails with an internal error where the step does not fit the backend (rows past
// max_tokens, a sequence without its state cell, a step overrunning a sliding-window ring).
PackedStep pack_step(const StepDesc& step, const StepPackConfig& config, int* host, int* dev, cudaStream_t stream);

}  // namespace roofline::cuda
