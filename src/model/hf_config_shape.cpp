// config.json -> ModelShape: the keys `roofline convert` reads (convert_hf.cpp, convert_qwen35.cpp)
// that decide tensor shapes and memory; the rest (tokenizer, chat template) does not matter for a plan.
#include "model/hf_config_shape.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"

namespace roofline {

namespace {

using json = nlohmann::json;

struct Config {
  const json& j;
  const std::string& where;
  bool has(const char* k) const { return j.contains(k) && !j[k].is_null(); }
  int integer(const char* k) const {
    if (!has(k)) fail("{}: \"{}\" is missing", where, k);
    if (!j[k].is_number_integer() || j[k].get<int64_t>() <= 0 || j[k].get<int64_t>() > (1 << 30))
      fail("{}: \"{}\" is not a positive count", where, k);
    return (int)j[k].get<int64_t>();
  }
  int integer_or(const char* k, int fallback) const { return has(k) ? integer(k) : fallback; }
  double number_or(const json& obj, const char* k, double fallback) const {
    if (!obj.contains(k) || obj[k].is_null()) return fallback;
    if (!obj[k].is_number()) fail("{}: \"{}\" is not a number", where, k);
    return obj[k].get<double>();
  }
  bool boolean_or(const char* k, bool fallback) const {
    if (!has(k)) return fallback;
    if (!j[k].is_boolean()) fail("{}: \"{}\" is not true or false", where, k);
    return j[k].get<bool>();
  }
};

}  // namespace

ModelShape shape_from_hf_config(const std::string& path_in) {
  std::string path = path_in;
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) path = (std::filesystem::path(path) / "config.json").string();
  std::ifstream in(path);
  if (!in) fail("cannot read {}", path);
  std::stringstream text;
  text << in.rdbuf();
  json root = json::parse(text.str(), nullptr, false);
  if (root.is_discarded() || !root.is_object()) fail("{}: not a JSON object", path);
  std::string model_type = root.value("model_type", std::string());
  json merged = root;  // Qwen3.5: text_config's keys override the top level (as the converter reads it)
  std::string where = path;
  if (root.contains("text_config") && root["text_config"].is_object()) {
    for (auto it = root["text_config"].begin(); it != root["text_config"].end(); ++it) merged[it.key()] = it.value();
    where += " (text_config)";
  }
  const Config c{merged, where};
  ModelShape s;
  if (model_type == "llama") s.arch = "llama";
  else if (model_type == "qwen2") s.arch = "qwen2";
  else if (model_type == "qwen3") s.arch = "qwen3";
  else if (model_type == "qwen3_5" || model_type == "qwen3_5_text") s.arch = "qwen35";
  else fail("{}: model_type '{}' is not supported (supported: llama, qwen2, qwen3, qwen3_5)", path, model_type);
  s.name = std::filesystem::path(path).parent_path().filename().string();
  if (s.name.empty()) s.name = "hf-config";
  s.display_name = s.name;
  s.n_embd = c.integer("hidden_size");
  s.n_layer = c.integer("num_hidden_layers");
  s.n_head = c.integer("num_attention_heads");
  s.n_head_kv = c.integer_or("num_key_value_heads", s.n_head);
  if (s.n_head % s.n_head_kv != 0)
    fail("{}: num_attention_heads {} is not a multiple of num_key_value_heads {}", where, s.n_head, s.n_head_kv);
  s.head_dim = c.integer_or("head_dim", s.n_embd / s.n_head);
  s.n_ff = c.integer("intermediate_size");
  s.n_vocab = c.integer("vocab_size");
  s.n_ctx_train = c.integer_or("max_position_embeddings", 4096);
  s.tied_embeddings = c.boolean_or("tie_word_embeddings", false);
  s.rms_eps = (float)c.number_or(merged, "rms_norm_eps", 1e-6);
  json rope = json::object();
  for (const char* k : {"rope_scaling", "rope_parameters"})
    if (c.has(k) && merged[k].is_object()) {
      rope = merged[k];
      break;
    }
  s.rope_freq_base = (float)c.number_or(merged, "rope_theta", c.number_or(rope, "rope_theta", 10000.0));
  s.qkv_bias = s.arch == "qwen2";
  s.qk_norm = s.arch == "qwen3" || s.arch == "qwen35";
  if (s.arch == "llama" && rope.value("rope_type", rope.value("type", std::string())) == "llama3") {
    s.rope_scaling_factor = (float)c.number_or(rope, "factor", 8.0);
    s.rope_low_freq_factor = (float)c.number_or(rope, "low_freq_factor", 1.0);
    s.rope_high_freq_factor = (float)c.number_or(rope, "high_freq_factor", 4.0);
    s.rope_original_context = (int)c.number_or(rope, "original_max_position_embeddings", 8192);
  }
  if (s.arch == "qwen35") {
    s.full_attention_interval = c.integer_or("full_attention_interval", 4);
    s.ssm_conv_kernel = c.integer("linear_conv_kernel_dim");
    s.ssm_n_k_heads = c.integer("linear_num_key_heads");
    s.ssm_n_v_heads = c.integer("linear_num_value_heads");
    s.ssm_head_dim = c.integer("linear_key_head_dim");
    if (c.integer("linear_value_head_dim") != s.ssm_head_dim)
      fail("{}: linear_value_head_dim differs from linear_key_head_dim (not supported)", where);
    if (s.ssm_n_v_heads % s.ssm_n_k_heads != 0)
      fail("{}: linear_num_value_heads {} is not a multiple of linear_num_key_heads {}", where, s.ssm_n_v_heads, s.ssm_n_k_heads);
    const double partial = c.number_or(rope, "partial_rotary_factor", c.number_or(merged, "partial_rotary_factor", 0.25));
    s.n_rot = (int)(s.head_dim * partial);
  }
  return s;
}

}  // namespace roofline
