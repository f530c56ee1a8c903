// The table of known shapes. Small "tiny-*" shapes are for tests and the demo.
#include "model/model_shapes.h"

#include <cctype>

namespace roofline {

static ModelShape qwen3(const char* name, const char* display, int n_embd, int n_layer, int n_head, int n_ff, bool tied,
                        int n_ctx = 40960) {
  ModelShape s;
  s.name = name;
  s.arch = "qwen3";
  s.display_name = display;
  s.n_embd = n_embd;
  s.n_layer = n_layer;
  s.n_head = n_head;
  s.n_head_kv = 8;
  s.head_dim = 128;
  s.n_ff = n_ff;
  s.n_vocab = 151936;
  s.n_ctx_train = n_ctx;
  s.rope_freq_base = 1000000.0f;
  s.rms_eps = 1e-6f;
  s.tied_embeddings = tied;
  s.qk_norm = true;
  return s;
}

// Qwen3.5: gated attention every 4th layer (head 256, rotary 64 of it, theta 1e7), Gated DeltaNet
// layers between (conv kernel 4, head dims 128), vocabulary 248320.
static ModelShape qwen35(const char* name, const char* display, int n_embd, int n_layer, int n_head, int n_head_kv, int n_ff,
                        int n_k_heads, int n_v_heads, bool tied) {
  ModelShape s;
  s.name = name;
  s.arch = "qwen35";
  s.display_name = display;
  s.n_embd = n_embd;
  s.n_layer = n_layer;
  s.n_head = n_head;
  s.n_head_kv = n_head_kv;
  s.head_dim = 256;
  s.n_rot = 64;
  s.n_ff = n_ff;
  s.n_vocab = 248320;
  s.n_ctx_train = 262144;
  s.rope_freq_base = 10000000.0f;
  s.rms_eps = 1e-6f;
  s.tied_embeddings = tied;
  s.qk_norm = true;
  s.full_attention_interval = 4;
  s.ssm_conv_kernel = 4;
  s.ssm_n_k_heads = n_k_heads;
  s.ssm_n_v_heads = n_v_heads;
  s.ssm_head_dim = 128;
  return s;
}

// Gemma 3: GeGLU FFN, pre and post norms, q/k norms, tied embeddings, vocabulary 262208 (the
// checkpoint's rows: llama.cpp's converter keeps them all, 262145 tokens and [PAD] entries), sliding
// window on 5 of every 6 layers (local base 1e4), global layers base 1e6 with linear scaling x8.
static ModelShape gemma3(const char* name, const char* display, int n_embd, int n_layer, int n_head, int n_head_kv,
                         int head_dim, int n_ff, int window) {
  ModelShape s;
  s.name = name;
  s.arch = "gemma3";
  s.display_name = display;
  s.n_embd = n_embd;
  s.n_layer = n_layer;
  s.n_head = n_head;
  s.n_head_kv = n_head_kv;
  s.head_dim = head_dim;
  s.n_ff = n_ff;
  s.n_vocab = 262208;
  s.n_ctx_train = 131072;
  s.rope_freq_base = 1000000.0f;
  s.rope_freq_base_swa = 10000.0f;
  s.rope_linear_factor = 8.0f;
  s.rms_eps = 1e-6f;
  s.tied_embeddings = true;
  s.qk_norm = true;
  s.sliding_window = window;
  return s;
}

const std::vector<ModelShape>& model_shapes() {
  static const std::vector<ModelShape> shapes = [] {
    std::vector<ModelShape> v;
    v.push_back(qwen3("qwen3-0.6b", "Qwen3-0.6B", 1024, 28, 16, 3072, true));
    v.push_back(qwen3("qwen3-1.7b", "Qwen3-1.7B", 2048, 28, 16, 6144, true));
    v.push_back(qwen3("qwen3-4b", "Qwen3-4B", 2560, 36, 32, 9728, true));
    v.push_back(qwen3("qwen3-8b", "Qwen3-8B", 4096, 36, 32, 12288, false));
    v.push_back(qwen3("qwen3-14b", "Qwen3-14B", 5120, 40, 40, 17408, false));
    v.push_back(qwen3("qwen3-32b", "Qwen3-32B", 5120, 64, 64, 25600, false));
    {
      ModelShape s;
      s.name = "qwen2.5-32b";
      s.arch = "qwen2";
      s.display_name = "Qwen2.5-32B";
      s.n_embd = 5120; s.n_layer = 64; s.n_head = 40; s.n_head_kv = 8; s.head_dim = 128; s.n_ff = 27648;
      s.n_vocab = 152064; s.n_ctx_train = 131072; s.rope_freq_base = 1000000.0f; s.rms_eps = 1e-5f;
      s.qkv_bias = true;
      v.push_back(s);
    }
    {
      ModelShape s;
      s.name = "qwen2.5-7b";
      s.arch = "qwen2";
      s.display_name = "Qwen2.5-7B";
      s.n_embd = 3584; s.n_layer = 28; s.n_head = 28; s.n_head_kv = 4; s.head_dim = 128; s.n_ff = 18944;
      s.n_vocab = 152064; s.n_ctx_train = 131072; s.rope_freq_base = 1000000.0f; s.rms_eps = 1e-6f;
      s.qkv_bias = true;
      v.push_back(s);
    }
    {
      ModelShape s;
      s.name = "llama3-8b";
      s.arch = "llama";
      s.display_name = "Llama-3.1-8B";
      s.n_embd = 4096; s.n_layer = 32; s.n_head = 32; s.n_head_kv = 8; s.head_dim = 128; s.n_ff = 14336;
      s.n_vocab = 128256; s.n_ctx_train = 131072; s.rope_freq_base = 500000.0f; s.rms_eps = 1e-5f;
      s.rope_scaling_factor = 8; s.rope_low_freq_factor = 1; s.rope_high_freq_factor = 4; s.rope_original_context = 8192;
      v.push_back(s);
    }
    {
      ModelShape s;
      s.name = "llama3-70b";
      s.arch = "llama";
      s.display_name = "Llama-3.1-70B";
      s.n_embd = 8192; s.n_layer = 80; s.n_head = 64; s.n_head_kv = 8; s.head_dim = 128; s.n_ff = 28672;
      s.n_vocab = 128256; s.n_ctx_train = 131072; s.rope_freq_base = 500000.0f; s.rms_eps = 1e-5f;
      s.rope_scaling_factor = 8; s.rope_low_freq_factor = 1; s.rope_high_freq_factor = 4; s.rope_original_context = 8192;
      v.push_back(s);
    }
    v.push_back(qwen35("qwen3.5-27b", "Qwen3.5-27B", 5120, 64, 24, 4, 17408, 16, 48, false));
    {
      // The same with the checkpoint's MTP block (blk.64), as llama.cpp's conversion keeps it: the MTP drafter's target.
      ModelShape mtp = qwen35("qwen3.5-27b-mtp", "Qwen3.5-27B with its MTP block", 5120, 64, 24, 4, 17408, 16, 48, false);
      mtp.n_mtp = 1;
      v.push_back(mtp);
    }
    {
      // Qwen3-30B-A3B: 128 experts of 768, 8 per token, no shared expert.
      ModelShape s = qwen3("qwen3-30b-a3b", "Qwen3-30B-A3B", 2048, 48, 32, 6144, false);
      s.arch = "qwen3moe";
      s.n_head_kv = 4;
      s.n_expert = 128; s.n_expert_used = 8; s.n_ff_exp = 768;
      v.push_back(s);
    }
    {
      // Qwen3.5-35B-A3B: 40 hybrid layers (attention 16 / 2 heads of 256 every 4th), 256 experts of
      // 512, 8 per token, plus a shared expert of 512.
      ModelShape s = qwen35("qwen3.5-35b-a3b", "Qwen3.5-35B-A3B", 2048, 40, 16, 2, 512, 16, 32, false);
      s.arch = "qwen35moe";
      s.n_expert = 256; s.n_expert_used = 8; s.n_ff_exp = 512; s.n_ff_shexp = 512;
      v.push_back(s);
    }
    v.push_back(gemma3("gemma3-27b", "Gemma-3-27B", 5376, 62, 32, 16, 128, 21504, 1024));
    // Tiny shapes for tests and the demo (rows are multiples of 256 so every K-quant applies).
    {
      ModelShape s = qwen3("tiny-qwen3", "tiny Qwen3-shaped model", 256, 2, 4, 768, false, 2048);
      s.n_head_kv = 2; s.head_dim = 64; s.n_vocab = 512;
      v.push_back(s);
    }
    {
      ModelShape s;
      s.name = "tiny-llama";
      s.arch = "llama";
      s.display_name = "tiny Llama-shaped model";
      s.n_embd = 256; s.n_layer = 2; s.n_head = 4; s.n_head_kv = 2; s.head_dim = 64; s.n_ff = 768;
      s.n_vocab = 512; s.n_ctx_train = 2048; s.rope_freq_base = 10000.0f; s.rms_eps = 1e-5f;
      v.push_back(s);
    }
    {
      ModelShape s;
      s.name = "tiny-qwen2";
      s.arch = "qwen2";
      s.display_name = "tiny Qwen2-shaped model";
      s.n_embd = 256; s.n_layer = 2; s.n_head = 4; s.n_head_kv = 2; s.head_dim = 64; s.n_ff = 768;
      s.n_vocab = 512; s.n_ctx_train = 2048; s.rope_freq_base = 1000000.0f; s.rms_eps = 1e-6f; s.qkv_bias = true;
      v.push_back(s);
    }
    {
      // Layers [DeltaNet, attention] x 2; 2 key heads / 4 value heads of 64 (the tiled head order
      // matters), attention 4 / 2 heads of 64 with 16 rotary dims.
      ModelShape s = qwen35("tiny-qwen35", "tiny Qwen3.5-shaped model", 256, 4, 4, 2, 768, 2, 4, false);
      s.head_dim = 64; s.n_rot = 16; s.n_vocab = 512; s.n_ctx_train = 4096; s.full_attention_interval = 2;
      s.ssm_head_dim = 64;
      // The same with an MTP block (blk.4: a full-attention layer and the nextn tensors), listed first so
      // that the plain shape stays the last tiny one of its architecture (tests pick that one).
      ModelShape mtp = s;
      mtp.name = "tiny-qwen35-mtp";
      mtp.display_name = "tiny Qwen3.5-shaped, MTP block";
      mtp.n_mtp = 1;
      v.push_back(mtp);
      v.push_back(s);
    }
    {
      // 6 experts of 256, 2 per token (not 8 experts: llama.cpp's 8-expert mix rules are a special case).
      ModelShape s = qwen3("tiny-qwen3moe", "tiny Qwen3-MoE-shaped model", 256, 2, 4, 768, false, 2048);
      s.arch = "qwen3moe";
      s.n_head_kv = 2; s.head_dim = 64; s.n_vocab = 512;
      s.n_expert = 6; s.n_expert_used = 2; s.n_ff_exp = 256;
      v.push_back(s);
    }
    {
      // tiny-qwen35's layers with 6 experts of 256 (2 per token) and a shared expert of 256.
      ModelShape s = qwen35("tiny-qwen35moe", "tiny Qwen3.5-MoE-shaped model", 256, 4, 4, 2, 768, 2, 4, false);
      s.arch = "qwen35moe";
      s.head_dim = 64; s.n_rot = 16; s.n_vocab = 512; s.n_ctx_train = 4096; s.full_attention_interval = 2;
      s.ssm_head_dim = 64;
      s.n_expert = 6; s.n_expert_used = 2; s.n_ff_exp = 256; s.n_ff_shexp = 256;
      ModelShape mtp = s;
      mtp.name = "tiny-qwen35moe-mtp";
      mtp.display_name = "tiny Qwen3.5-MoE-shaped, MTP block";
      mtp.n_mtp = 1;
      v.push_back(mtp);
      v.push_back(s);
    }
    {
      // 8 layers: sliding 0-4 and 6-7, global 5; a window of 8 positions, shorter than the tests'
      // sequences, so both kinds of layer and the window's edge are exercised.
      ModelShape s = gemma3("tiny-gemma3", "tiny Gemma3-shaped model", 256, 8, 4, 2, 64, 768, 8);
      s.n_vocab = 512; s.n_ctx_train = 4096;
      v.push_back(s);
    }
    return v;
  }();
  return shapes;
}

const ModelShape* find_model_shape(std::string_view name) {
  for (const ModelShape& s : model_shapes()) {
    if (s.name.size() != name.size()) continue;
    bool same = true;
    for (size_t i = 0; i < name.size() && same; ++i)
      same = std::tolower((unsigned char)s.name[i]) == std::tolower((unsigned char)name[i]);
    if (same) return &s;
  }
  return nullptr;
}

}  // namespace roofline
