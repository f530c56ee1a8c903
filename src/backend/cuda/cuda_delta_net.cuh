// The Gated DeltaNet mixer on the GPU (kernels in cuda_delta_net.cu and cuda_delta_net_chunked.cu):
// what delta_net_reference (backend/delta_net.h) computes, from the step's projected rows to the input
// of ssm_out, with the per-sequence states in a device arena.
//
// A layer's step runs as three launches (delta_net_forward does all three):
//   1. prepare:  causal conv1d + SiLU over the raw qkv rows (the conv window of each sequence for the
//                rows before its first one), q/k L2-normalised (q also times 1/sqrt(dk)), and the gates
//                g = softplus(alpha + dt_bias) * a, beta = sigmoid(beta)       -> scratch xc, gb
//   2. the gated delta rule, one of two forms, each also sliding the sequence's conv window:
//      recurrent: token by token with the state in registers (decode; any run length)  -> scratch o
//      chunked:   runs in chunks of 64 tokens, the intra-chunk products on tensor cores (tf32, fp32
//                 accumulation; sm_80+, dk and dv <= 128, dv % 4 == 0), two kernels    -> scratch o
//   3. output:   RMSNorm(o) * norm * SiLU(z) per head, written as f32 and/or int8 activations (ActQ8)
//
// Per-step values come from device memory (the sequence records and their count), so the launches of
// a decode bucket can be captured in a CUDA graph: grids are sized for the bucket's maxima (rows,
// sequences) and the kernels skip rows and records beyond the real ones. Rows no sequence owns get
// zero outputs. A record with `fresh` set never reads its cell (it may hold garbage).
//
// Shape constraints (delta_net_unsupported says which one fails): dk % 4 == 0 and dk <= 256 (16-byte
// state rows), dv <= 256, conv kernel <= 8, n_v % n_k == 0, conv_state_floats() % 4 == 0 (n_v dv % 4
// == 0: the recurrent part of a cell starts 16-byte aligned); the cell stride a multiple of 4 floats
// and the arena 16-byte aligned.
//
// How the backend runs a DeltaNet layer's step (after the qkv, z, alpha, beta projections):
//   - once (load/init): DeltaNetLayerDev per layer: the f32 vectors (ssm_conv1d as [conv_dim x K],
//     ssm_dt.bias, ssm_a, ssm_norm), state = the layer's cell arena, cell_stride = state_floats()
//     (already a multiple of 4 when delta_net_unsupported is empty); a scratch of
//     delta_net_scratch_floats(d, max_tokens, chunked) floats (shared by all layers); check
//     delta_net_unsupported(d) and fail with its line.
//   - per step, in device memory (uploaded with the step descriptor): an array of DeltaNetSeqDev, one
//     per sequence of the step in row order, {first_row, n_rows, fresh = (n_past == 0), cell =
//     state_cell}, with room for max_seqs records (the kernels read all max_seqs entries, so the
//     array must hold that many, whatever the ones past the count contain), and the count.
//   - per layer: delta_net_forward(d, layer, rms_eps, seqs, n_rows = the step's (bucket's) rows,
//     form, max_seq_rows, qkv, z, alpha, beta, scratch, out, out_act, stream). Decode buckets:
//     Recurrent, max_seqs = the bucket size, max_seq_rows = 1 (graph-capturable: nothing per step on
//     the host side; for the recurrent form max_seq_rows only picks a variant, any run length works).
//     Larger steps: Chunked when a sequence has a long run (falls back to recurrent where not
//     supported), max_seq_rows = the longest run (for the chunked form it must bound every record's
//     n_rows: it sizes the grid of the chunk kernel). out/out_act as rms_norm's (out_act needs
//     value_dim % 32 == 0).
//   The qkv rows must stay unchanged until the rule kernel has run (it slides the windows from them);
//   records of one launch must name distinct cells.
#pragma once

#include <string>

#include "backend/cuda/cuda_common.cuh"
#include "model/hparams.h"

namespace roofline::cuda {

// One sequence of the step in a DeltaNet layer, in device memory (an array, plus the count in device
// memory). Every record's rows are disjoint; records of one launch name distinct cells.
struct DeltaNetSeqDev {
  int first_row = 0;  // the sequence's rows are [first_row, first_row + n_rows) of the step's buffers
  int n_rows = 0;
  int fresh = 0;      // nonzero: no earlier tokens; the state is taken as zero and the cell not read
  int cell = 0;       // its state is at state + cell * cell_stride (layout: delta_net.h)
};

// The sequences one launch covers: records [0, *count) of `seqs`, at most max_seqs (the grid bound).
struct DeltaNetSeqs {
  const DeltaNetSeqDev* seqs = nullptr;  // device [max_seqs]
  const int* count = nullptr;            // device, <= max_seqs
  int max_seqs = 0;                      // host: grid bound
};

// One layer's mixer weights (f32, device) and its state arena.
struct DeltaNetLayerDev {
  const float* conv = nullptr;     // [conv_dim x K]
  const float* dt_bias = nullptr;  // [n_v]
  const float* a = nullptr;        // [n_v]
  const float* norm = nullptr;     // [dv]
  float* state = nullptr;          // cell c at state + c * cell_stride (16-byte aligned)
  int64_t cell_stride = 0;         // floats, a multiple of 4, >= state_floats()
};

// Work buffers of one step (device floats), for up to max_rows rows.
struct DeltaNetScratch {
  float* xc = nullptr;  // [rows x conv_dim]: conv + SiLU, q (normalised, scaled) | k (normalised) | v
  float* gb = nullptr;  // [rows x 2 n_v]: g (log decay) then beta (after the sigmoid)
  float* o = nullptr;   // [rows x value_dim]: the rule's output before the norm
  // Chunked form only (null otherwise), per row and v-head: W, Q', K' (dk each), U, P U (dv each), G.
  float* w = nullptr;
  float* qp = nullptr;
  float* kp = nullptr;
  float* u = nullptr;
  float* oi = nullptr;
  float* g = nullptr;
};
size_t delta_net_scratch_floats(const DeltaNetDims& d, int max_rows, bool chunked);
// Carves the buffers out of `base` (delta_net_scratch_floats floats, 16-byte aligned).
DeltaNetScratch delta_net_scratch(const DeltaNetDims& d, int max_rows, bool chunked, float* base);

// Empty when the kernels take this shape; else why not (one line, for the backend's error).
std::string delta_net_unsupported(const DeltaNetDims& d);
// Whether the chunked form runs here (current device sm_80+, dk <= 128, dv <= 128, dv % 4 == 0).
bool delta_net_chunked_supported(const DeltaNetDims& d);

enum class DeltaNetForm { Recurrent, Chunked };

// 1. Rows [0, n_rows) of the buffers (n_rows: the grid bound; rows outside every record are skipped).
void delta_net_prepare(const DeltaNetDims& d, const DeltaNetLayerDev& layer, const DeltaNetSeqs& seqs, int n_rows,
                       const float* qkv, const float* alpha, const float* beta, const DeltaNetScratch& s,
                       cudaStream_t stream);
// 2a. Token by token; each record's state read once (unless fresh) and written once, its window slid.
// max_seq_rows (host): a bound on the records' n_rows that picks the variant (any run length works with
// either; decode buckets pass 1).
void delta_net_recurrent(const DeltaNetDims& d, const DeltaNetLayerDev& layer, const DeltaNetSeqs& seqs, int max_seq_rows,
                         const float* qkv, const DeltaNetScratch& s, cudaStream_t stream);
// 2b. Chunks of 64; max_seq_rows (host) bounds every record's n_rows (the grid of the first kernel).
// precise: each tf32 product as three (error-compensated split), for accuracy checks. kernels: which of
// its two kernels to launch (bit 0 the chunk products, bit 1 the scan over chunks; timing only).
void delta_net_chunked(const DeltaNetDims& d, const DeltaNetLayerDev& layer, const DeltaNetSeqs& seqs, int max_seq_rows,
                       const float* qkv, const DeltaNetScratch& s, bool precise, cudaStream_t stream, int kernels = 3);
// 3. out [n_rows x value_dim] (if out) and its int8 form (if out_act.q; whole 32-blocks of the row, as
// rms_norm writes them); rows outside every record are written as zeros.
void delta_net_output(const DeltaNetDims& d, const DeltaNetLayerDev& layer, float eps, const DeltaNetSeqs& seqs, int n_rows,
                      const float* z, const DeltaNetScratch& s, float* out, ActQ8 out_act, cudaStream_t stream);

// All three. Chunked falls back to recurrent where delta_net_chunked_supported is false. max_seq_rows:
// a host bound on the records' n_rows (grid of the chunked form; variant of the recurrent one).
void delta_net_forward(const DeltaNetDims& d, const DeltaNetLayerDev& layer, float eps, const DeltaNetSeqs& seqs, int n_rows,
                       DeltaNetForm form, int max_seq_rows, const float* qkv, const float* z, const float* alpha,
                       const float* beta, const DeltaNetScratch& s, float* out, ActQ8 out_act, cudaStream_t stream);

}  // namespace roofline::cuda
