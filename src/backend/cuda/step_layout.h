// The GPU step descriptor's layout: where each part of a step (header, token ids, positions, row
// sequences, logit rows, attention's split rows, DeltaNet sequence records, block tables, sliding-window
// tables) lives in the one int buffer the backend fills on the host and copies to the device each step
// (cuda_backend.cu's begin_step; DeviceStep in cuda_kernels.cuh points into the device copy). Offsets are
// in ints and fixed for a backend's life: a decode bucket's captured CUDA graph keeps the addresses.
// Plain C++ (no CUDA): the CPU tests check it (tests/engine/step_layout_test.cpp).
#pragma once

#include <cstdint>

namespace roofline::cuda {

// The header's ints (DeviceStep::header).
enum StepHeader : int {
  kStepRealRows = 0,    // the step's real rows (a decode bucket runs padded)
  kStepLogitRows = 1,   // rows that want logits
  kStepSplitLen = 2,    // decode attention's keys per split (0: each row's own, attention_span)
  kStepMinSpan = 3,     // the shortest span attention_span gives
  kStepSpanSplits = 4,  // splits per row before attention_span's spans double
  kStepMaxSpan = 5,     // the longest span attention_span gives
  kStepLongSplits = 6,  // splits per row before attention_span's long spans (kAttnLongSpan and more) double
  kStepHeaderInts = 8,
};

struct StepLayout {
  // Offsets in ints from the buffer's start.
  int64_t tokens = 0, positions = 0, row_seq = 0, logit_rows = 0;
  int64_t attn_rows = 0;   // the rows the split-KV attention kernel takes when prefill runs exist
  int64_t dn_count = 0;    // DeltaNet: the step's sequence count (16-byte aligned) ...
  int64_t dn_records = 0;  // ... then one record {first_row, n_rows, fresh, cell} per sequence
  int64_t tables = 0;      // block tables, [sequences x table_stride]
  int64_t swa_tables = 0;  // sliding-window ring tables, the same shape, after the block tables' capacity
  int64_t capacity = 0;    // ints the buffer needs

  // max_tokens rows per step, table_blocks blocks per sequence's table at most; swa: the model has
  // sliding-window layers (a second table region).
  static StepLayout make(int max_tokens, int table_blocks, bool swa) {
    const int64_t T = max_tokens < 1 ? 1 : max_tokens;
    StepLayout l;
    l.tokens = kStepHeaderInts;
    l.positions = l.tokens + T;
    l.row_seq = l.positions + T;
    l.logit_rows = l.row_seq + T;
    l.attn_rows = l.logit_rows + T;
    l.dn_count = (l.attn_rows + T + 3) / 4 * 4;
    l.dn_records = l.dn_count + 4;
    l.tables = l.dn_records + 4 * T;
    l.swa_tables = l.tables + T * table_blocks;
    l.capacity = (swa ? l.swa_tables : l.tables) + T * table_blocks;
    return l;
  }
};

}  // namespace roofline::cuda
