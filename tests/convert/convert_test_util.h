// Test helpers for the converters: a safetensors writer, a minimal byte-level tokenizer.json, and small
// synthetic Hugging Face folders (llama / qwen2 / qwen3) with deterministic random weights.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/fp16.h"

namespace roofline::test {

struct StTensor {
  std::string name;
  std::string dtype;  // F32, F16, BF16 (or anything, written as 4-byte elements for error tests)
  std::vector<int64_t> shape;
  std::vector<float> values;
};

inline size_t st_elem_size(const std::string& dtype) { return dtype == "F16" || dtype == "BF16" ? 2 : 4; }

// Writes a .safetensors file; drop_tail_bytes cuts the end off (a truncated file).
inline void write_safetensors(const std::string& path, const std::vector<StTensor>& tensors, size_t drop_tail_bytes = 0) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  header["__metadata__"] = {{"format", "pt"}};
  std::vector<uint8_t> data;
  for (const auto& t : tensors) {
    const size_t begin = data.size();
    for (float v : t.values) {
      if (t.dtype == "F16") {
        const uint16_t h = f32_to_fp16(v);
        data.push_back((uint8_t)(h & 0xff));
        data.push_back((uint8_t)(h >> 8));
      } else if (t.dtype == "BF16") {
        const uint16_t h = f32_to_bf16(v);
        data.push_back((uint8_t)(h & 0xff));
        data.push_back((uint8_t)(h >> 8));
      } else {
        uint8_t b[4];
        std::memcpy(b, &v, 4);
        data.insert(data.end(), b, b + 4);
      }
    }
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {begin, data.size()}}};
  }
  std::string h = header.dump();
  while ((8 + h.size()) % 8) h += ' ';
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  const uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) out.put((char)((n >> (8 * i)) & 0xff));
  out << h;
  out.write(reinterpret_cast<const char*>(data.data()), (std::streamsize)(data.size() - std::min(drop_tail_bytes, data.size())));
}

// GPT-2's byte -> printable code point mapping, as UTF-8.
inline std::string gpt2_byte_token(int b) {
  auto printable = [](int x) { return (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255); };
  int cp = b;
  if (!printable(b)) {
    int n = 0;
    for (int x = 0; x < b; ++x)
      if (!printable(x)) ++n;
    cp = 256 + n;
  }
  std::string s;
  if (cp < 0x80) {
    s += (char)cp;
  } else {
    s += (char)(0xC0 | (cp >> 6));
    s += (char)(0x80 | (cp & 0x3F));
  }
  return s;
}

// A byte-level BPE tokenizer.json (256 byte tokens, no merges, 3 specials = 259 tokens). pre_regex empty:
// ByteLevel's own regex (detected as "gpt2"); else a Split with that regex.
inline void write_byte_level_tokenizer(const std::string& dir, const std::string& pre_regex = "") {
  nlohmann::ordered_json vocab = nlohmann::ordered_json::object();
  for (int b = 0; b < 256; ++b) vocab[gpt2_byte_token(b)] = b;
  nlohmann::ordered_json added = nlohmann::ordered_json::array();
  const char* specials[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  for (int i = 0; i < 3; ++i)
    added.push_back({{"id", 256 + i}, {"content", specials[i]}, {"single_word", false}, {"lstrip", false},
                     {"rstrip", false}, {"normalized", false}, {"special", true}});
  nlohmann::ordered_json pre;
  if (pre_regex.empty()) {
    pre = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  } else {
    pre = {{"type", "Sequence"},
           {"pretokenizers",
            {{{"type", "Split"}, {"pattern", {{"Regex", pre_regex}}}, {"behavior", "Isolated"}, {"invert", false}},
             {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}}}};
  }
  nlohmann::ordered_json tj = {{"version", "1.0"},
                               {"truncation", nullptr},
                               {"padding", nullptr},
                               {"added_tokens", added},
                               {"normalizer", nullptr},
                               {"pre_tokenizer", pre},
                               {"post_processor", nullptr},
                               {"decoder", {{"type", "ByteLevel"}}},
                               {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::ordered_json::array()}}}};
  std::ofstream(dir + "/tokenizer.json") << tj.dump();
  nlohmann::ordered_json cfg = {{"eos_token", "<|im_end|>"},
                                {"chat_template", "{% for m in messages %}{{ m['content'] }}{% endfor %}"}};
  std::ofstream(dir + "/tokenizer_config.json") << cfg.dump();
}

// Deterministic values in about [-scale, scale].
inline std::vector<float> test_values(size_t n, uint32_t seed, float scale = 0.5f) {
  std::vector<float> v(n);
  uint32_t s = seed * 2654435761u + 12345u;
  for (size_t i = 0; i < n; ++i) {
    s = s * 1664525u + 1013904223u;
    v[i] = scale * ((float)(s >> 8) / (float)(1u << 24) * 2.0f - 1.0f);
  }
  return v;
}

struct SynthHf {
  std::string hf_class = "LlamaForCausalLM";
  int hidden = 64, heads = 4, kv_heads = 2, head_dim = 16, ffn = 80, layers = 2, vocab = 300;
  bool tied = false;
  std::string dtype = "F32";
  nlohmann::ordered_json extra_config = nlohmann::ordered_json::object();  // merged into config.json
};

// The tensors of a synthetic folder (PyTorch names and shapes).
inline std::vector<StTensor> synth_tensors(const SynthHf& s) {
  std::vector<StTensor> t;
  uint32_t seed = 1;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, bool norm = false) {
    size_t n = 1;
    for (int64_t d : shape) n *= (size_t)d;
    std::vector<float> v = test_values(n, seed++, norm ? 0.1f : 0.5f);
    if (norm)
      for (float& x : v) x += 1.0f;
    t.push_back({name, s.dtype, shape, v});
  };
  const int64_t q = (int64_t)s.heads * s.head_dim, kv = (int64_t)s.kv_heads * s.head_dim;
  add("model.embed_tokens.weight", {s.vocab, s.hidden});
  for (int il = 0; il < s.layers; ++il) {
    const std::string p = "model.layers." + std::to_string(il) + ".";
    add(p + "input_layernorm.weight", {s.hidden}, true);
    add(p + "self_attn.q_proj.weight", {q, s.hidden});
    add(p + "self_attn.k_proj.weight", {kv, s.hidden});
    add(p + "self_attn.v_proj.weight", {kv, s.hidden});
    if (s.hf_class == "Qwen2ForCausalLM") {
      add(p + "self_attn.q_proj.bias", {q});
      add(p + "self_attn.k_proj.bias", {kv});
      add(p + "self_attn.v_proj.bias", {kv});
    }
    add(p + "self_attn.o_proj.weight", {s.hidden, q});
    if (s.hf_class == "Qwen3ForCausalLM") {
      add(p + "self_attn.q_norm.weight", {s.head_dim}, true);
      add(p + "self_attn.k_norm.weight", {s.head_dim}, true);
    }
    add(p + "post_attention_layernorm.weight", {s.hidden}, true);
    add(p + "mlp.gate_proj.weight", {s.ffn, s.hidden});
    add(p + "mlp.up_proj.weight", {s.ffn, s.hidden});
    add(p + "mlp.down_proj.weight", {s.hidden, s.ffn});
  }
  add("model.norm.weight", {s.hidden}, true);
  if (!s.tied) add("lm_head.weight", {s.vocab, s.hidden});
  return t;
}

inline nlohmann::ordered_json synth_config(const SynthHf& s) {
  nlohmann::ordered_json c = {{"architectures", {s.hf_class}},
                              {"hidden_size", s.hidden},
                              {"intermediate_size", s.ffn},
                              {"num_hidden_layers", s.layers},
                              {"num_attention_heads", s.heads},
                              {"num_key_value_heads", s.kv_heads},
                              {"head_dim", s.head_dim},
                              {"vocab_size", s.vocab},
                              {"max_position_embeddings", 1024},
                              {"rms_norm_eps", 1e-5},
                              {"rope_theta", 10000.0},
                              {"hidden_act", "silu"},
                              {"tie_word_embeddings", s.tied}};
  for (auto it = s.extra_config.begin(); it != s.extra_config.end(); ++it) c[it.key()] = it.value();
  return c;
}

// Writes dir/{config.json, model.safetensors, tokenizer.json, tokenizer_config.json}.
inline void write_synth_hf(const std::string& dir, const SynthHf& s, const std::vector<StTensor>& tensors) {
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << synth_config(s).dump(2);
  write_safetensors(dir + "/model.safetensors", tensors);
  write_byte_level_tokenizer(dir);
}
inline void write_synth_hf(const std::string& dir, const SynthHf& s) { write_synth_hf(dir, s, synth_tensors(s)); }

}  // namespace roofline::test
