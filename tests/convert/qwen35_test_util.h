// Tiny Qwen3.5 Hugging Face folders for the converter tests: Qwen3_5ForConditionalGeneration (text_config,
// model.language_model.*, a vision tower) or Qwen3_5ForCausalLM (flat config, model.*), an MTP block,
// f32/bf16/f16 sources, one or several shards (headers deliberately unsorted), and a byte-level tokenizer
// with Qwen3.5's pre-tokenizer regex.
#pragma once

#include <algorithm>
#include <filesystem>
#include <fmt/format.h>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "convert_test_util.h"

namespace roofline::test {

// Qwen3.5's tokenizer.json Split regex (llama.cpp's qwen35 before its (?i:) expansion).
inline const char* kQwen35Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

struct SynthQ35 {
  bool conditional = true;  // Qwen3_5ForConditionalGeneration, else Qwen3_5ForCausalLM
  std::string dtype = "F32";
  int hidden = 64, layers = 4, interval = 2, heads = 4, kv_heads = 2, head_dim = 16, ffn = 96, vocab = 300;
  int n_k = 2, n_v = 6, k_dim = 8, v_dim = 8, conv = 4;
  int mtp_layers = 1;  // 0: no MTP block
  bool vision = true;  // a few model.visual.* tensors (ConditionalGeneration only)
  bool tied = false;
  int shards = 1;
  bool mrope_section = true;                                              // rope_parameters.mrope_section [11, 11, 10]
  nlohmann::ordered_json extra_text_config = nlohmann::ordered_json::object();  // merged into the text config
};

inline std::vector<StTensor> q35_tensors(const SynthQ35& s) {
  std::vector<StTensor> t;
  uint32_t seed = 100;
  const std::string lm = s.conditional ? "model.language_model." : "model.";
  auto add = [&](const std::string& name, std::vector<int64_t> shape, float scale = 0.5f, float offset = 0.0f) {
    size_t n = 1;
    for (int64_t d : shape) n *= (size_t)d;
    std::vector<float> v = test_values(n, seed++, scale);
    for (float& x : v) x += offset;
    t.push_back({name, s.dtype, shape, v});
  };
  const int64_t H = s.hidden, q = (int64_t)s.heads * s.head_dim, kv = (int64_t)s.kv_heads * s.head_dim;
  const int64_t key_dim = (int64_t)s.k_dim * s.n_k, value_dim = (int64_t)s.v_dim * s.n_v;
  auto full_layer = [&](const std::string& p) {
    add(p + "self_attn.q_proj.weight", {2 * q, H});
    add(p + "self_attn.k_proj.weight", {kv, H});
    add(p + "self_attn.v_proj.weight", {kv, H});
    add(p + "self_attn.o_proj.weight", {H, q});
    add(p + "self_attn.q_norm.weight", {s.head_dim}, 0.1f);
    add(p + "self_attn.k_norm.weight", {s.head_dim}, 0.1f);
  };
  auto common = [&](const std::string& p) {
    add(p + "input_layernorm.weight", {H}, 0.1f);
    add(p + "post_attention_layernorm.weight", {H}, 0.1f);
    add(p + "mlp.gate_proj.weight", {s.ffn, H});
    add(p + "mlp.up_proj.weight", {s.ffn, H});
    add(p + "mlp.down_proj.weight", {H, s.ffn});
  };
  add(lm + "embed_tokens.weight", {s.vocab, H});
  for (int il = 0; il < s.layers; ++il) {
    const std::string p = lm + "layers." + std::to_string(il) + ".";
    common(p);
    if ((il + 1) % s.interval == 0) {
      full_layer(p);
    } else {
      const std::string la = p + "linear_attn.";
      add(la + "in_proj_qkv.weight", {2 * key_dim + value_dim, H});
      add(la + "in_proj_z.weight", {value_dim, H});
      add(la + "in_proj_b.weight", {s.n_v, H});
      add(la + "in_proj_a.weight", {s.n_v, H});
      add(la + "conv1d.weight", {2 * key_dim + value_dim, 1, s.conv});
      add(la + "dt_bias", {s.n_v}, 1.0f, 0.5f);
      add(la + "A_log", {s.n_v}, 1.5f, 0.5f);
      add(la + "norm.weight", {s.v_dim}, 0.1f, 1.0f);
      add(la + "out_proj.weight", {H, value_dim});
    }
  }
  add(lm + "norm.weight", {H}, 0.1f);
  if (!s.tied) add("lm_head.weight", {s.vocab, H});
  if (s.mtp_layers > 0) {
    add("mtp.fc.weight", {H, 2 * H});
    add("mtp.pre_fc_norm_embedding.weight", {H}, 0.1f);
    add("mtp.pre_fc_norm_hidden.weight", {H}, 0.1f);
    add("mtp.norm.weight", {H}, 0.1f);
    for (int i = 0; i < s.mtp_layers; ++i) {
      const std::string p = "mtp.layers." + std::to_string(i) + ".";
      common(p);
      full_layer(p);
    }
  }
  if (s.conditional && s.vision) {
    add("model.visual.patch_embed.proj.weight", {32, 3, 2, 4, 4});
    add("model.visual.blocks.0.attn.qkv.weight", {96, 32});
    add("model.visual.blocks.0.norm1.weight", {32});
    add("model.visual.merger.linear_fc1.weight", {128, 128});
  }
  return t;
}

inline nlohmann::ordered_json q35_config(const SynthQ35& s) {
  nlohmann::ordered_json layer_types = nlohmann::ordered_json::array();
  for (int i = 0; i < s.layers; ++i) layer_types.push_back((i + 1) % s.interval ? "linear_attention" : "full_attention");
  nlohmann::ordered_json rope = {{"rope_type", "default"}, {"rope_theta", 10000000}, {"partial_rotary_factor", 0.25}};
  if (s.mrope_section) rope["mrope_section"] = {11, 11, 10}, rope["mrope_interleaved"] = true;
  nlohmann::ordered_json text = {{"attention_bias", false},
                                 {"full_attention_interval", s.interval},
                                 {"head_dim", s.head_dim},
                                 {"hidden_act", "silu"},
                                 {"hidden_size", s.hidden},
                                 {"intermediate_size", s.ffn},
                                 {"layer_types", layer_types},
                                 {"linear_conv_kernel_dim", s.conv},
                                 {"linear_key_head_dim", s.k_dim},
                                 {"linear_num_key_heads", s.n_k},
                                 {"linear_num_value_heads", s.n_v},
                                 {"linear_value_head_dim", s.v_dim},
                                 {"max_position_embeddings", 4096},
                                 {"model_type", "qwen3_5_text"},
                                 {"mtp_num_hidden_layers", s.mtp_layers},
                                 {"num_attention_heads", s.heads},
                                 {"num_hidden_layers", s.layers},
                                 {"num_key_value_heads", s.kv_heads},
                                 {"partial_rotary_factor", 0.25},
                                 {"rms_norm_eps", 1e-6},
                                 {"rope_parameters", rope},
                                 {"tie_word_embeddings", s.tied},
                                 {"vocab_size", s.vocab}};
  for (auto it = s.extra_text_config.begin(); it != s.extra_text_config.end(); ++it) text[it.key()] = it.value();
  if (!s.conditional) {
    text["architectures"] = {"Qwen3_5ForCausalLM"};
    text["model_type"] = "qwen3_5_text";
    return text;
  }
  return {{"architectures", {"Qwen3_5ForConditionalGeneration"}},
          {"image_token_id", 248056},
          {"model_type", "qwen3_5"},
          {"text_config", text},
          {"tie_word_embeddings", s.tied},
          {"vision_config", {{"depth", 1}, {"hidden_size", 32}, {"model_type", "qwen3_5_vision"}}}};
}

// The shard each tensor goes to, in the order its header lists them (reversed: not sorted).
inline std::map<std::string, std::vector<StTensor>> q35_shards(const SynthQ35& s, const std::vector<StTensor>& tensors) {
  std::map<std::string, std::vector<StTensor>> shards;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const int k = (int)(i % (size_t)s.shards);
    const std::string file = s.shards == 1 ? "model.safetensors"
                                           : fmt::format("model-{:05d}-of-{:05d}.safetensors", k + 1, s.shards);
    shards[file].insert(shards[file].begin(), tensors[i]);
  }
  return shards;
}

inline void write_q35(const std::string& dir, const SynthQ35& s, const std::vector<StTensor>& tensors) {
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << q35_config(s).dump(2);
  const auto shards = q35_shards(s, tensors);
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  for (const auto& [file, ts] : shards) {
    write_safetensors(dir + "/" + file, ts);
    for (const auto& t : ts) weight_map[t.name] = file;
  }
  if (s.shards > 1)
    std::ofstream(dir + "/model.safetensors.index.json") << nlohmann::ordered_json{{"metadata", {{"total_size", 0}}},
                                                                                   {"weight_map", weight_map}}
                                                                                      .dump(2);
  write_byte_level_tokenizer(dir, kQwen35Regex);
}
inline void write_q35(const std::string& dir, const SynthQ35& s) { write_q35(dir, s, q35_tensors(s)); }

}  // namespace roofline::test
