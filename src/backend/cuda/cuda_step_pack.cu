// Packing a step's descriptor into the step buffer and onto the device (cuda_step_pack.cuh).
#include "backend/cuda/cuda_step_pack.cuh"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace roofline::cuda {

PackedStep pack_step(const StepDesc& step, const StepPackConfig& c, int* h, int* dev, cudaStream_t stream) {
  const int n = step.n_tokens();
  if (n > c.max_tokens) fail("internal error: step of {} rows exceeds the GPU buffers ({})", n, c.max_tokens);
  PackedStep p;
  // Decode-sized steps run padded to a bucket (1, 2, 4, 8) so one captured graph per bucket replays
  // every step, and so do batched decode steps where the backend buckets them (batched_bucket); kernels read
  // the real row count from the descriptor and skip the padding.
  p.n_real = n;
  p.n_tok = decode_bucket(n);
  bool one_row_each = (int)step.sequences.size() == n;
  for (const StepSequence& sq : step.sequences) one_row_each = one_row_each && sq.n_new == 1;
  const bool batched = c.batched_buckets && n > 8 && n <= 64 && one_row_each;
  if (batched) p.n_tok = batched_bucket(n);
  if (p.n_tok > c.max_tokens) p.n_tok = n;
  const bool bucketed = p.n_tok <= 8 || (batched && p.n_tok == batched_bucket(n));  // one graph replays all its steps
  const int n_logit = (int)step.logit_rows.size();
  int stride = 1;
  for (const auto& s : step.sequences) stride = std::max(stride, (int)s.block_table.size());
  // Attention splits and prefill runs (plan_attention; measured choices in its comments).
  AttentionPlan plan = plan_attention(step, c.max_splits, c.spans, c.prefill_min_keys, p.n_tok > 8 && bucketed ? p.n_tok : 0);
  p.splits = plan.splits;
  p.grid_splits = plan.grid_splits;
  p.split_heads = plan.split_heads;
  const StepLayout& lay = c.layout;
  h[kStepRealRows] = n;
  h[kStepLogitRows] = n_logit;
  h[kStepSplitLen] = plan.split_len;
  h[kStepMinSpan] = plan.min_span;
  h[kStepSpanSplits] = c.spans.splits;
  h[kStepLongSplits] = c.spans.long_splits;
  h[kStepMaxSpan] = c.spans.max_span;
  int *tokens = h + lay.tokens, *positions = h + lay.positions, *row_seq = h + lay.row_seq, *logit_rows = h + lay.logit_rows;
  int *attn_rows = h + lay.attn_rows, *tables = h + lay.tables;
  p.prefill_runs = std::move(plan.runs);
  p.n_attn_rows = p.n_tok;  // decode buckets: every row of the bucket (the captured graph replays this grid)
  if (!p.prefill_runs.empty()) {
    p.n_attn_rows = (int)plan.split_rows.size();
    std::copy(plan.split_rows.begin(), plan.split_rows.end(), attn_rows);
  }
  for (int i = 0; i < p.n_tok; ++i) {
    tokens[i] = i < n ? step.tokens[i] : 0;
    positions[i] = i < n ? step.positions[i] : 0;
    row_seq[i] = i < n ? step.row_seq[i] : 0;
  }
  for (int i = 0; i < n_logit; ++i) logit_rows[i] = step.logit_rows[i];
  for (size_t s = 0; s < step.sequences.size(); ++s) {
    const auto& bt = step.sequences[s].block_table;
    std::memcpy(tables + s * stride, bt.data(), bt.size() * 4);
  }
  const size_t used = (size_t)lay.tables + step.sequences.size() * stride;
  // Ring layers: per sequence, block b of its positions is ring block b % (ring / block size) of its
  // state cell, so position p lands in slot p % ring of the cell.
  int* swa_tables = h + lay.swa_tables;
  if (c.rings) {
    const int per_cell = c.swa_ring / c.kv_block_size;
    for (size_t s = 0; s < step.sequences.size(); ++s) {
      const StepSequence& sq = step.sequences[s];
      if (sq.state_cell < 0 || sq.state_cell >= c.n_state_cells)
        fail("internal error: sequence {} has no state cell for its sliding-window rings (cell {} of {})", sq.seq_id, sq.state_cell,
             c.n_state_cells);
      if (sq.n_new > c.swa_ring - c.sliding_window + 1 && sq.n_past + sq.n_new > c.swa_ring)
        fail("internal error: {} new positions of sequence {} in one step overrun its sliding-window ring of {}", sq.n_new, sq.seq_id,
             c.swa_ring);
      for (size_t b = 0; b < sq.block_table.size(); ++b) swa_tables[s * stride + b] = sq.state_cell * per_cell + (int)(b % per_cell);
    }
  }
  if (c.delta_net) {  // DeltaNet layers: the sequence count, then one record {first_row, n_rows, fresh, cell} each
    int* count = h + lay.dn_count;
    int* recs = h + lay.dn_records;
    int n_seqs = 0, max_rows = 1;
    for (const StepSequence& sq : step.sequences) {
      if (sq.state_cell < 0 || sq.state_cell >= c.n_state_cells)
        fail("internal error: sequence {} has no recurrent-state cell (cell {} of {})", sq.seq_id, sq.state_cell, c.n_state_cells);
      recs[4 * n_seqs + 0] = sq.first_token;
      recs[4 * n_seqs + 1] = sq.n_new;
      recs[4 * n_seqs + 2] = sq.n_past == 0 ? 1 : 0;
      recs[4 * n_seqs + 3] = sq.state_cell;
      max_rows = std::max(max_rows, sq.n_new);
      ++n_seqs;
    }
    count[0] = n_seqs;
    p.dn_real_seqs = n_seqs;
    p.dn_seqs.count = dev + lay.dn_count;
    p.dn_seqs.seqs = reinterpret_cast<const DeltaNetSeqDev*>(dev + lay.dn_records);
    // A decode bucket's grid covers as many sequences as the bucket has rows (graphs replay it).
    p.dn_seqs.max_seqs = bucketed ? std::max(n_seqs, p.n_tok) : n_seqs;
    p.dn_max_seq_rows = max_rows;
    p.dn_form = c.delta_net_chunked && max_rows >= c.delta_net_chunked_min_rows ? DeltaNetForm::Chunked : DeltaNetForm::Recurrent;
  }
  ROOFLINE_CUDA_CHECK(cudaMemcpyAsync(dev, h, used * 4, cudaMemcpyHostToDevice, stream));
  if (c.rings)
    ROOFLINE_CUDA_CHECK(cudaMemcpyAsync(dev + lay.swa_tables, swa_tables, step.sequences.size() * stride * 4, cudaMemcpyHostToDevice, stream));
  p.dstep.header = dev;
  p.dstep.tokens = dev + lay.tokens;
  p.dstep.positions = dev + lay.positions;
  p.dstep.row_seq = dev + lay.row_seq;
  p.dstep.logit_rows = dev + lay.logit_rows;
  p.attn_rows_dev = p.prefill_runs.empty() ? nullptr : dev + lay.attn_rows;
  p.dstep.block_tables = dev + lay.tables;
  p.dstep.table_stride = stride;
  p.dstep_swa = p.dstep;
  p.dstep_swa.block_tables = dev + lay.swa_tables;
  return p;
}

}  // namespace roofline::cuda
