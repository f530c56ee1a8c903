// Known model shapes (published config.json values) for synthetic models: exact tensor names,
// shapes and hyperparameters of real models without their weights. Facts: ../shared/reference/model-configs.md.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace roofline {

struct ModelShape {
  std::string name;          // "qwen3-32b"
  std::string arch;          // GGUF general.architecture: llama, qwen2, qwen3, qwen35, qwen3moe, qwen35moe
  std::string display_name;  // "Qwen3-32B"
  int n_embd = 0;
  int n_layer = 0;
  int n_head = 0;
  int n_head_kv = 0;
  int head_dim = 0;
  int n_ff = 0;
  int n_vocab = 0;
  int n_ctx_train = 0;
  float rope_freq_base = 10000.0f;
  float rms_eps = 1e-6f;
  bool tied_embeddings = false;
  bool qkv_bias = false;  // qwen2
  bool qk_norm = false;   // qwen3
  // llama3 rope scaling (factor 0 = none)
  float rope_scaling_factor = 0;
  float rope_low_freq_factor = 1;
  float rope_high_freq_factor = 4;
  int rope_original_context = 8192;
  // Qwen3.5 (hybrid): every full_attention_interval-th layer is attention, the others Gated DeltaNet.
  int n_rot = 0;                    // rotary dims (0: head_dim)
  int full_attention_interval = 0;  // 0: every layer is attention
  int n_mtp = 0;                    // qwen35: MTP blocks after the layers (blk.<n_layer>, nextn_predict_layers)
  int ssm_conv_kernel = 0, ssm_n_k_heads = 0, ssm_n_v_heads = 0, ssm_head_dim = 0;
  // Mixture of experts (qwen3moe, qwen35moe): 0 experts = a dense FFN.
  int n_expert = 0, n_expert_used = 0, n_ff_exp = 0, n_ff_shexp = 0;
  // Gemma 3: sliding window on 5 of every 6 layers (local RoPE base), linear RoPE scaling of the global layers.
  int sliding_window = 0;            // 0: none
  float rope_freq_base_swa = 10000.0f;
  float rope_linear_factor = 0;      // 0: none
};

const std::vector<ModelShape>& model_shapes();
const ModelShape* find_model_shape(std::string_view name);  // case-insensitive

}  // namespace roofline
