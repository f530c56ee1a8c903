// A model's hyperparameters as read from GGUF metadata (read_hparams in arch.cpp), including what
// kind of block each layer is: the one description every other part (loading, synthetic models,
// memory plans, backends) works from.
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <vector>

namespace roofline {

// What mixes a layer's tokens.
enum class MixerKind : unsigned char {
  Attention,  // softmax attention over a paged KV cache (qwen35: with an output gate)
  DeltaNet,   // Gated DeltaNet linear attention: a fixed-size recurrent state per sequence
};
const char* mixer_kind_name(MixerKind kind);

// The Gated DeltaNet layers' dimensions (GGUF ssm.* keys; backend/delta_net.h has the maths).
struct DeltaNetDims {
  int n_k_heads = 0;    // ssm.group_count
  int n_v_heads = 0;    // ssm.time_step_rank
  int head_k = 0;       // ssm.state_size (dk)
  int head_v = 0;       // ssm.inner_size / n_v_heads (dv)
  int conv_kernel = 0;  // ssm.conv_kernel (K)

  int key_dim() const { return n_k_heads * head_k; }
  int value_dim() const { return n_v_heads * head_v; }
  int conv_dim() const { return 2 * key_dim() + value_dim(); }
  // A sequence's state in one layer, f32: the conv window, then the recurrent matrices.
  size_t conv_state_floats() const { return (size_t)(conv_kernel - 1) * conv_dim(); }
  size_t ssm_state_floats() const { return (size_t)n_v_heads * head_v * head_k; }
  size_t state_floats() const { return conv_state_floats() + ssm_state_floats(); }
};

struct HParams {
  std::string arch;
  int n_embd = 0;
  int n_layer = 0;        // layers the forward pass runs
  int n_layer_nextn = 0;  // MTP (next-token prediction) blocks stored after them: loaded, not run
  int n_head = 0;
  int n_head_kv = 0;
  int head_dim_k = 0;  // attention.key_length
  int head_dim_v = 0;  // attention.value_length
  int n_ff = 0;
  int n_vocab = 0;
  int n_ctx_train = 0;
  int n_rot = 0;       // rotary dims (rope.dimension_count), <= head_dim_k
  float rope_freq_base = 10000.0f;
  float rope_freq_scale = 1.0f;  // linear scaling: positions multiplied by this
  float rms_eps = 1e-5f;
  float attn_scale = 0;          // 0: 1/sqrt(head_dim_k)
  // Sliding-window attention (gemma3): a sliding layer's query at position p attends to keys at
  // positions (p - sliding_window, p] only, and rotates with its own RoPE base and scale.
  int sliding_window = 0;              // 0: every layer attends to the whole context
  std::vector<unsigned char> layer_sliding;  // per layer (n_layer): 1 for a sliding-window layer
  float rope_freq_base_swa = 10000.0f;
  float rope_freq_scale_swa = 1.0f;
  float embd_scale = 0;                // gemma: token embeddings multiplied by this (0: not scaled)
  float final_logit_softcap = 0;       // logits = c * tanh(logits / c) when > 0
  bool attn_output_gate = false; // the Q projection emits [q_h | gate_h] per head; output *= sigmoid(gate)
  std::vector<MixerKind> layer_mixer;  // per layer (n_layer)
  DeltaNetDims delta_net;              // set when some layer is a DeltaNet layer
  // Mixture of experts (qwen3moe, qwen35moe): the FFN is n_expert SwiGLU experts of n_ff_exp, each
  // token routed to n_expert_used of them (softmax over the router's logits, top-k, the k weights
  // renormalised to sum 1 when expert_weights_norm), plus a shared expert of n_ff_shexp (0: none)
  // scaled by sigmoid of its own gate.
  int n_expert = 0;                   // expert_count (0: a dense FFN)
  int n_expert_used = 0;              // expert_used_count
  int n_ff_exp = 0;                   // expert_feed_forward_length
  int n_ff_shexp = 0;                 // expert_shared_feed_forward_length
  bool expert_weights_norm = true;    // expert_weights_norm (transformers' norm_topk_prob)
  float expert_weights_scale = 1.0f;  // expert_weights_scale: routed weights multiplied by it

  bool is_moe() const { return n_expert > 0; }
  int n_gqa() const { return n_head / n_head_kv; }
  int q_dim() const { return n_head * head_dim_k; }
  int kv_dim_k() const { return n_head_kv * head_dim_k; }
  int kv_dim_v() const { return n_head_kv * head_dim_v; }
  MixerKind mixer(int il) const { return layer_mixer[(size_t)il]; }
  bool has_kv(int il) const { return layer_mixer[(size_t)il] == MixerKind::Attention; }
  bool is_sliding(int il) const { return !layer_sliding.empty() && layer_sliding[(size_t)il] != 0; }
  // The number of newest positions layer il attends to (0: all of them).
  int attention_window(int il) const { return is_sliding(il) ? sliding_window : 0; }
  float rope_base(int il) const { return is_sliding(il) ? rope_freq_base_swa : rope_freq_base; }
  float rope_scale(int il) const { return is_sliding(il) ? rope_freq_scale_swa : rope_freq_scale; }
  bool has_sliding_layers() const { return sliding_window > 0 && count_sliding_layers(0, n_layer) > 0; }
  int count_sliding_layers(int begin, int end) const;
  // Layers of one kind among [begin, end).
  int count_layers(MixerKind kind, int begin, int end) const;
  int count_layers(MixerKind kind) const { return count_layers(kind, 0, n_layer); }
};

}  // namespace roofline
