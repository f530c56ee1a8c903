// The Gated DeltaNet mixer of Qwen3.5's linear-attention layers, between its input projections and
// its output projection (ssm_out), as every backend computes it. This header is the contract: the
// shapes, the state layout a sequence carries from step to step, and a plain double-precision
// reference (delta_net_reference) that the CPU and CUDA kernels are tested against.
//
// Per token t of a sequence (v-head h reads k/q head h % n_k_heads, the "tiled" order llama.cpp's
// converter writes):
//   c_t      = SiLU(causal depthwise conv1d over the raw qkv channels, kernel K, no bias)
//   q, k, v  = c_t split as [q: n_k*dk | k: n_k*dk | v: n_v*dv]; q and k L2-normalised per head:
//              x / sqrt(sum x^2 + 1e-6) (transformers' l2norm)
//   g        = softplus(alpha_t + dt_bias) * a        (a = ssm_a = -exp(A_log), so g <= 0)
//   beta     = sigmoid(beta_t)
//   S_h     <- exp(g_h) S_h;  delta = beta_h (v_h - S_h^T k);  S_h <- S_h + k delta^T
//   o_h      = S_h^T q / sqrt(dk)
//   out_h    = RMSNorm(o_h) * norm_w * SiLU(z_h)      (plain weight, eps = the model's rms eps)
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "model/hparams.h"

namespace roofline {

// DeltaNetDims (model/hparams.h): head counts and sizes, conv kernel, and the state size per layer.

// State layout of one sequence in one layer (state_floats() floats):
//   conv window [(K-1) x conv_dim]: the raw (pre-conv) qkv rows of the last K-1 tokens, oldest first
//   recurrent   [n_v_heads x dv x dk]: for head h, row j (a value index) holds column j of S_h, so
//               element (h, j, i) = S_h[i][j] (i: key index). Zero for a new sequence.
struct DeltaNetSeq {
  int first_row = 0;    // the sequence's rows in the step are [first_row, first_row + n_rows)
  int n_rows = 0;
  bool fresh = false;   // no earlier tokens: the state is taken as zero (whatever `state` holds)
  float* state = nullptr;  // state_floats() floats, read and updated in place
};

// The weights the mixer reads besides its projections, as f32.
struct DeltaNetWeights {
  const float* conv = nullptr;     // ssm_conv1d [conv_dim x K]: row c holds channel c's taps, oldest first
  const float* dt_bias = nullptr;  // ssm_dt.bias [n_v_heads]
  const float* a = nullptr;        // ssm_a [n_v_heads]
  const float* norm = nullptr;     // ssm_norm [dv]
};

// Inputs per step row (row-major, one row per token of the step):
//   qkv   [n_rows x conv_dim]   raw in-projection (attn_qkv)
//   z     [n_rows x value_dim]  the gate projection (attn_gate)
//   alpha [n_rows x n_v_heads]  ssm_alpha projection;  beta [n_rows x n_v_heads] ssm_beta projection
// Output: out [n_rows x value_dim], the input of ssm_out. Every sequence's state is updated.
// The reference computes in double and keeps the state in double between tokens of a call.
void delta_net_reference(const DeltaNetDims& dims, const DeltaNetWeights& w, float eps, std::span<const DeltaNetSeq> seqs,
                         const float* qkv, const float* z, const float* alpha, const float* beta, float* out);

}  // namespace roofline
