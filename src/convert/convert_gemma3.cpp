// Gemma3ForCausalLM / Gemma3ForConditionalGeneration (text tower) -> GGUF `gemma3`, what llama.cpp's
// converter writes (conversion/gemma.py Gemma3Model and conversion/base.py TextModel): text_config merged
// over the top level, the vision tower and projector left out, "language_model." dropped from names,
// tensors in llama.cpp's order (shards sorted, names sorted within a shard), every *norm.weight + 1
// (HF's Gemma3RMSNorm computes x * (1 + w)), the embedding's rows trimmed to the tokenizer's tokens,
// the same hyperparameter keys. Checked here because llama.cpp's GGUF cannot carry them: the attention
// scale (query_pre_attn_scalar must be what llama.cpp derives from the shape), GELU-tanh, causal attention.
#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "convert/convert.h"
#include "convert/convert_hf_util.h"
#include "core/error.h"
#include "core/fp16.h"
#include "formats/hf_tokenizer.h"
#include "formats/safetensors.h"

namespace roofline::convert {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* kArch = "gemma3";

struct Hparams {
  int64_t n_embd, n_layer, n_ff, n_head, n_head_kv, head_dim, n_ctx;
  bool head_dim_given = false;
  double rms_eps, rope_theta;
  std::optional<double> rope_theta_swa;
  std::string rope_type;  // "" or "linear"
  double rope_factor = 1;
  std::optional<int64_t> sliding_window;  // written unless sliding_window_pattern == 1
  std::optional<double> final_logit_softcap;
  // The sliding pattern when it is not llama.cpp's default (every 6th layer global): a period, or flags.
  std::optional<int64_t> pattern_period;
  std::vector<int32_t> pattern_flags;
  bool tied = true;
};

// llama.cpp's attention scale for gemma3 (src/models/gemma3.cpp): 1/sqrt(n_embd / n_head) for the
// 62-layer model, 1/sqrt(head_dim) otherwise; as query_pre_attn_scalar^-0.5 that scalar is:
int64_t llama_cpp_query_scalar(const Hparams& hp) { return hp.n_layer == 62 ? hp.n_embd / hp.n_head : hp.head_dim; }

Hparams read_hparams(const json& config, const std::string& where_file) {
  const HfConfig c = text_model_config(config, where_file);  // text_config's keys over the top level's
  const std::string& where = c.where;
  const json& merged = c.j;
  Hparams hp;
  // Gemma3Model.set_gguf_parameters' defaults where the config may leave a key out.
  hp.n_embd = c.integer("hidden_size");
  hp.n_layer = c.integer("num_hidden_layers");
  hp.n_ff = c.integer("intermediate_size");
  hp.n_head = c.integer_or("num_attention_heads", 8);
  hp.n_head_kv = c.integer_or("num_key_value_heads", 4);
  hp.head_dim_given = c.has("head_dim");
  hp.head_dim = c.integer_or("head_dim", 256);
  hp.n_ctx = c.integer_or("max_position_embeddings", 131072);
  hp.rms_eps = c.number_or(c.j, "rms_norm_eps", 1e-6);
  hp.tied = c.boolean_or("tie_word_embeddings", true);
  if (hp.n_head % hp.n_head_kv != 0)
    fail("{}: num_attention_heads {} is not a multiple of num_key_value_heads {}", where, hp.n_head, hp.n_head_kv);
  if (hp.head_dim % 2) fail("{}: head_dim {} is odd", where, hp.head_dim);
  for (const char* k : {"hidden_activation", "hidden_act"})
    if (c.has(k) && c.j[k] != "gelu_pytorch_tanh")
      fail("{}: {} {} is not supported (Gemma 3 uses gelu_pytorch_tanh)", where, k, c.j[k].dump());
  if (c.has("attn_logit_softcapping")) fail("{}: attn_logit_softcapping is set, which Gemma 3 does not use", where);
  if (c.boolean_or("use_bidirectional_attention", false))
    fail("{}: use_bidirectional_attention is not supported (causal language models only)", where);
  if (c.boolean_or("attention_bias", false)) fail("{}: attention_bias true is not supported for Gemma 3", where);
  if (c.has("final_logit_softcapping")) {
    const double cap = c.number("final_logit_softcapping");
    if (cap != 0) hp.final_logit_softcap = cap;
  }
  // The attention scale: llama.cpp's GGUF has no key for it and derives it from the shape.
  const double qpas = c.number_or(c.j, "query_pre_attn_scalar", (double)hp.head_dim);
  if (qpas != (double)llama_cpp_query_scalar(hp))
    fail("{}: query_pre_attn_scalar {} is not what a gemma3 GGUF implies for this shape ({}: head_dim, or "
         "hidden_size / num_attention_heads at 62 layers), so the converted model would attend differently",
         where, qpas, llama_cpp_query_scalar(hp));

  // RoPE (TextModel.__init__): rope_parameters (per layer type in transformers 5), else rope_scaling with
  // rope_theta and rope_local_base_freq beside it.
  json rp = json::object();
  const char* rope_key = merged.contains("rope_parameters") ? "rope_parameters" : "rope_scaling";
  if (merged.contains(rope_key) && !merged[rope_key].is_null()) {
    if (!merged[rope_key].is_object()) fail("{}: \"{}\" is not an object", where, rope_key);
    rp = merged[rope_key];
  }
  if (!rp.contains("full_attention") && !rp.contains("sliding_attention")) {
    for (const char* k : {"local_rope_theta", "rope_local_base_freq", "rope_theta_local", "swa_rope_theta", "rope_local_theta"})
      if (c.has(k)) {
        rp["sliding_attention"] = json{{"rope_theta", merged[k]}};
        break;
      }
    if (!rp.contains("rope_theta"))
      for (const char* k : {"global_rope_theta", "rope_global_theta", "rope_theta_global", "rope_theta", "rotary_emb_base"})
        if (c.has(k)) {
          rp["rope_theta"] = merged[k];
          break;
        }
    if (!rp.contains("rope_type") && rp.contains("type")) rp["rope_type"] = rp["type"];
  }
  const json global = rp.contains("full_attention") && rp["full_attention"].is_object() ? rp["full_attention"] : rp;
  hp.rope_theta = c.number_or(global, "rope_theta", 1000000.0);
  if (global.contains("rope_type") && global["rope_type"].is_string()) {
    const std::string t = global["rope_type"].get<std::string>();
    const bool has_factor = global.contains("factor") && !global["factor"].is_null();
    if (t == "linear" && has_factor) {
      hp.rope_type = t;
      hp.rope_factor = c.number_or(global, "factor", 1.0);
      if (!(hp.rope_factor > 0)) fail("{}: rope scaling factor {} must be positive", where, hp.rope_factor);
    } else if (t != "default" && t != "none" && t != "linear") {
      fail("{}: rope type '{}' is not supported for Gemma 3 (default or linear)", where, t);
    }
  }
  if (rp.contains("sliding_attention") && rp["sliding_attention"].is_object()) {
    const json& local = rp["sliding_attention"];
    if (local.contains("rope_theta") && !local["rope_theta"].is_null()) hp.rope_theta_swa = c.number_or(local, "rope_theta", 10000.0);
    const std::string t = local.contains("rope_type") && local["rope_type"].is_string() ? local["rope_type"].get<std::string>() : "default";
    if (t != "default" && t != "none") fail("{}: rope type '{}' on sliding layers is not supported (llama.cpp scales them not)", where, t);
  }

  // Sliding window: written unless sliding_window_pattern == 1 (Gemma3Model). Which layers slide: llama.cpp
  // reads only the window and assumes every 6th layer global; layer_types (transformers 5) or
  // sliding_window_pattern (4.x) that say otherwise are written as the pattern key llama.cpp reads.
  const bool pattern_one = c.has("sliding_window_pattern") && c.integer("sliding_window_pattern") == 1;
  if (!pattern_one) {
    if (!c.has("sliding_window")) fail("{}: \"sliding_window\" is missing", where);
    hp.sliding_window = c.integer("sliding_window");
  }
  std::vector<int32_t> flags((size_t)hp.n_layer);
  if (c.has("layer_types")) {
    const json& lt = c.j["layer_types"];
    if (!lt.is_array() || (int64_t)lt.size() != hp.n_layer) fail("{}: \"layer_types\" is not a list of {} layer types", where, hp.n_layer);
    for (int64_t i = 0; i < hp.n_layer; ++i) {
      const std::string t = lt[i].is_string() ? lt[i].get<std::string>() : "";
      if (t != "sliding_attention" && t != "full_attention")
        fail("{}: layer_types[{}] is {} (expected sliding_attention or full_attention)", where, i, lt[i].dump());
      flags[(size_t)i] = t == "sliding_attention";
    }
  } else {
    const int64_t period = c.has("sliding_window_pattern") ? c.integer("sliding_window_pattern") : 6;
    for (int64_t i = 0; i < hp.n_layer; ++i) flags[(size_t)i] = i % period < period - 1;
  }
  if (hp.sliding_window) {
    auto pattern_of = [&](int64_t p) {
      for (int64_t i = 0; i < hp.n_layer; ++i)
        if ((bool)flags[(size_t)i] != (p == 0 || i % p < p - 1)) return false;
      return true;
    };
    if (!pattern_of(6)) {
      for (int64_t p = 0; p <= hp.n_layer && !hp.pattern_period; ++p)
        if (pattern_of(p)) hp.pattern_period = p;
      if (!hp.pattern_period) hp.pattern_flags = flags;
    }
  } else if (std::find(flags.begin(), flags.end(), 1) != flags.end() && !pattern_one) {
    fail("{}: sliding layers without a sliding_window", where);
  }
  return hp;
}

enum class Op { Copy, PlusOne };
struct Expected {
  std::string gguf_name;
  std::vector<int64_t> shape;  // PyTorch order; the embedding's rows are checked separately
  Op op = Op::Copy;
  bool required = true;
};

// HF name (after "language_model." removal) -> what it becomes (conversion/gemma.py, gguf-py's tensor map).
std::map<std::string, Expected> expected_tensors(const Hparams& hp, int64_t n_rows) {
  std::map<std::string, Expected> e;
  const int64_t H = hp.n_embd, q = hp.n_head * hp.head_dim, kv = hp.n_head_kv * hp.head_dim;
  e["model.embed_tokens.weight"] = {"token_embd.weight", {n_rows, H}};
  e["model.norm.weight"] = {"output_norm.weight", {H}, Op::PlusOne};
  e["lm_head.weight"] = {"output.weight", {n_rows, H}, Op::Copy, false};
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    const std::string p = "model.layers." + std::to_string(il) + ".", b = "blk." + std::to_string(il) + ".";
    e[p + "input_layernorm.weight"] = {b + "attn_norm.weight", {H}, Op::PlusOne};
    e[p + "self_attn.q_proj.weight"] = {b + "attn_q.weight", {q, H}};
    e[p + "self_attn.k_proj.weight"] = {b + "attn_k.weight", {kv, H}};
    e[p + "self_attn.v_proj.weight"] = {b + "attn_v.weight", {kv, H}};
    e[p + "self_attn.o_proj.weight"] = {b + "attn_output.weight", {H, q}};
    e[p + "self_attn.q_norm.weight"] = {b + "attn_q_norm.weight", {hp.head_dim}, Op::PlusOne};
    e[p + "self_attn.k_norm.weight"] = {b + "attn_k_norm.weight", {hp.head_dim}, Op::PlusOne};
    e[p + "post_attention_layernorm.weight"] = {b + "post_attention_norm.weight", {H}, Op::PlusOne};
    e[p + "pre_feedforward_layernorm.weight"] = {b + "ffn_norm.weight", {H}, Op::PlusOne};
    e[p + "post_feedforward_layernorm.weight"] = {b + "post_ffw_norm.weight", {H}, Op::PlusOne};
    e[p + "mlp.gate_proj.weight"] = {b + "ffn_gate.weight", {hp.n_ff, H}};
    e[p + "mlp.up_proj.weight"] = {b + "ffn_up.weight", {hp.n_ff, H}};
    e[p + "mlp.down_proj.weight"] = {b + "ffn_down.weight", {H, hp.n_ff}};
  }
  return e;
}

// Gemma3Model.modify_tensors without tokenizer.model: the tokens are tokenizer.json's vocabulary plus its
// added tokens (counted as llama.cpp counts them, overlaps included).
int64_t tokenizer_token_count(const std::string& tokenizer_json) {
  const json tj = read_json_file(tokenizer_json);
  if (!tj.is_object() || !tj.contains("model") || !tj["model"].is_object() || !tj["model"].contains("vocab"))
    fail("{}: no model.vocab", tokenizer_json);
  const int64_t added = tj.contains("added_tokens") && tj["added_tokens"].is_array() ? (int64_t)tj["added_tokens"].size() : 0;
  return (int64_t)tj["model"]["vocab"].size() + added;
}

}  // namespace

ConvertResult convert_gemma3(const ConvertOptions& options, const json& config, const std::string& hf_arch) {
  const fs::path dir(options.source);
  const Hparams hp = read_hparams(config, (dir / "config.json").string());
  const std::optional<DType> requested = parse_outtype(options.outtype);
  const safetensors::SafetensorsModel st = safetensors::SafetensorsModel::open_folder(options.source);
  const std::string tokenizer_json = options.tokenizer.empty() ? (dir / "tokenizer.json").string() : options.tokenizer;
  if (!fs::exists(tokenizer_json)) fail("{}: no tokenizer.json (SentencePiece tokenizer.model folders are not supported)", options.source);

  ConvertResult result;
  result.arch = kArch;

  // llama.cpp's order and names (text_model_tensors).
  using Item = HfTensor;
  size_t n_multimodal = 0;
  const std::vector<Item> items = text_model_tensors(st, &n_multimodal);
  if (n_multimodal)
    result.notes.push_back(fmt::format("skipped {} vision tensors: the GGUF holds the text model only", n_multimodal));

  // The embedding's rows: the checkpoint's, trimmed to the tokenizer's tokens when it has fewer.
  int64_t n_rows = 0;
  for (const Item& it : items)
    if (it.name == "model.embed_tokens.weight" && it.t->shape.size() == 2) n_rows = it.t->shape[0];
  if (n_rows == 0) fail("{}: missing model.embed_tokens.weight (a 2-D tensor)", options.source);
  const int64_t n_vocab = std::min(n_rows, tokenizer_token_count(tokenizer_json));
  if (n_vocab < n_rows)
    result.notes.push_back(fmt::format("token_embd trimmed from {} to the tokenizer's {} rows", n_rows, n_vocab));

  const std::map<std::string, Expected> expected = expected_tensors(hp, n_rows);
  std::vector<std::string> problems;
  std::map<std::string, std::pair<const safetensors::Tensor*, const Expected*>> bound;
  for (const Item& it : items) {
    auto e = expected.find(it.name);
    if (e == expected.end()) {
      problems.push_back("unexpected " + it.t->name);
      continue;
    }
    if (!bound.emplace(it.name, std::make_pair(it.t, &e->second)).second) {
      problems.push_back(fmt::format("{} is given twice", it.name));
      continue;
    }
    if (it.t->shape != e->second.shape)
      problems.push_back(fmt::format("{} has shape {}, expected {}", it.t->name, it.t->shape_string(), shape_string(e->second.shape)));
  }
  for (const auto& [name, e] : expected)
    if (e.required && !bound.count(name)) problems.push_back("missing " + name);
  if (!problems.empty())
    fail_with_problems(fmt::format("{}: the tensors do not match a {} model with this config.json", options.source, hf_arch),
                       problems);
  const bool write_output = bound.count("lm_head.weight") && !hp.tied;
  if (!hp.tied && !write_output)
    result.notes.push_back("lm_head.weight is absent: the output layer reuses the token embedding (tied)");

  const DType outtype = requested_or_auto_outtype(requested, items, [](const Item& it) { return it.t; });
  result.outtype = dtype_name(outtype);

  std::vector<PlannedTensor> planned;
  int64_t total_params = 0;
  for (const Item& it : items) {
    const auto& [t, e] = bound.at(it.name);
    if (e->gguf_name == "output.weight" && !write_output) continue;
    std::vector<int64_t> shape(e->shape.rbegin(), e->shape.rend());
    if (e->gguf_name == "token_embd.weight" || e->gguf_name == "output.weight") shape[1] = n_vocab;
    std::string note;
    const DType type = tensor_type_for(e->gguf_name, (int)shape.size(), shape[0], outtype, &note);
    if (!note.empty()) result.notes.push_back(note);
    const int64_t row = shape[0];
    const bool plus_one = e->op == Op::PlusOne;
    // llama.cpp adds the 1 in torch: an f16 source stays f16 (the sum rounded to f16), others in f32.
    const bool f16_math = t->type == DType::F16;
    const safetensors::Tensor* src = t;  // Clang before 16 cannot capture a structured binding
    planned.push_back({e->gguf_name, shape, type, [src, row, plus_one, f16_math](float* dst, int64_t r0, int64_t nr) {
                         safetensors::tensor_to_f32(*src, r0 * row, nr * row, dst);
                         if (!plus_one) return;
                         for (int64_t i = 0; i < nr * row; ++i) dst[i] = f16_math ? round_to_fp16(dst[i] + 1.0f) : dst[i] + 1.0f;
                       }});
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    total_params += n;
  }

  // Metadata in llama.cpp's order: general, TextModel.set_gguf_parameters, then Gemma3Model's keys (those
  // it sets again keep their first place with the later value), the tokenizer.
  gguf::Metadata md;
  const std::string a = kArch;
  md.set("general.architecture", gguf::Value::string(a));
  md.set("general.type", gguf::Value::string("model"));
  add_general_metadata(md, dir, config, total_params);
  md.set(a + ".block_count", gguf::Value::u32((uint32_t)hp.n_layer));
  md.set(a + ".context_length", gguf::Value::u32((uint32_t)hp.n_ctx));
  md.set(a + ".embedding_length", gguf::Value::u32((uint32_t)hp.n_embd));
  md.set(a + ".feed_forward_length", gguf::Value::u32((uint32_t)hp.n_ff));
  md.set(a + ".attention.head_count", gguf::Value::u32((uint32_t)hp.n_head));
  md.set(a + ".attention.head_count_kv", gguf::Value::u32((uint32_t)hp.n_head_kv));
  if (hp.rope_type == "linear") {
    md.set(a + ".rope.scaling.type", gguf::Value::string("linear"));
    md.set(a + ".rope.scaling.factor", gguf::Value::f32((float)hp.rope_factor));
  }
  md.set(a + ".rope.freq_base", gguf::Value::f32((float)hp.rope_theta));
  if (hp.rope_theta_swa) md.set(a + ".rope.freq_base_swa", gguf::Value::f32((float)*hp.rope_theta_swa));
  md.set(a + ".attention.layer_norm_rms_epsilon", gguf::Value::f32((float)hp.rms_eps));
  auto head_lengths = [&] {
    md.set(a + ".attention.key_length", gguf::Value::u32((uint32_t)hp.head_dim));
    md.set(a + ".attention.value_length", gguf::Value::u32((uint32_t)hp.head_dim));
  };
  if (hp.head_dim_given) head_lengths();  // TextModel writes them when config.json has head_dim
  md.set("general.file_type", gguf::Value::u32(file_type_for(outtype)));
  if (!hp.head_dim_given) head_lengths();  // Gemma3Model always, with its default 256
  if (hp.final_logit_softcap) md.set(a + ".final_logit_softcapping", gguf::Value::f32((float)*hp.final_logit_softcap));
  if (hp.sliding_window) md.set(a + ".attention.sliding_window", gguf::Value::u32((uint32_t)*hp.sliding_window));
  if (hp.pattern_period) {
    md.set(a + ".attention.sliding_window_pattern", gguf::Value::u32((uint32_t)*hp.pattern_period));
    result.notes.push_back(fmt::format("sliding layers every {}: attention.sliding_window_pattern written (llama.cpp's "
                                       "converter assumes 6)", *hp.pattern_period));
  } else if (!hp.pattern_flags.empty()) {
    md.set(a + ".attention.sliding_window_pattern", gguf::Value::i32_array(hp.pattern_flags));
    result.notes.push_back("irregular sliding layers: attention.sliding_window_pattern written per layer (llama.cpp "
                           "reads only a period and would assume every 6th layer global)");
  }
  md.set("general.quantization_version", gguf::Value::u32(2));
  add_hf_tokenizer_metadata(md, tokenizer_json, (int)n_vocab, options.pre);

  write_converted(options, md, planned, result);
  return result;
}

}  // namespace roofline::convert
