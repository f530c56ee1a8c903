// Hugging Face folder -> GGUF for LlamaForCausalLM (and Mistral), Qwen2ForCausalLM, Qwen3ForCausalLM and
// Qwen3MoeForCausalLM (experts stacked into llama.cpp's 3-D tensors, convert_moe.h):
// config.json to llama.cpp's metadata keys, tensor names mapped and checked (missing, unexpected and
// mis-shaped tensors are listed in one error), Q/K permuted for llama, llama3 rope factors generated.
// Qwen3.5 folders are handed to convert_qwen35.cpp, Gemma 3 folders to convert_gemma3.cpp.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "convert/convert.h"
#include "convert/convert_hf_util.h"
#include "convert/convert_moe.h"
#include "core/error.h"
#include "formats/hf_tokenizer.h"
#include "formats/safetensors.h"
#include "model/arch.h"
#include "model/synthetic.h"

namespace roofline::convert {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

struct HfArch {
  const char* hf_name;
  const char* arch;
};
constexpr HfArch kArchs[] = {
    {"LlamaForCausalLM", "llama"},
    {"MistralForCausalLM", "llama"},
    {"Qwen2ForCausalLM", "qwen2"},
    {"Qwen3ForCausalLM", "qwen3"},
    {"Qwen3MoeForCausalLM", "qwen3moe"},
};

using Config = HfConfig;

struct Hparams {
  std::string arch;
  int64_t n_embd, n_layer, n_ff, n_head, n_head_kv, head_dim, n_vocab, n_ctx;
  bool head_dim_given;
  double rms_eps, rope_theta;
  bool tied;
  std::string rope_type;  // "", "linear", "llama3"
  double rope_factor = 1, low_freq_factor = 1, high_freq_factor = 4;
  int64_t original_context = 8192;
  bool moe = false;  // qwen3moe: n_ff is 0 when intermediate_size is absent (then not written)
  MoeHparams experts;
};

Hparams read_hparams(const Config& c, const std::string& arch) {
  Hparams hp;
  hp.arch = arch;
  hp.n_embd = c.integer("hidden_size");
  hp.n_layer = c.integer("num_hidden_layers");
  hp.moe = arch == "qwen3moe";
  hp.n_ff = hp.moe ? c.integer_or("intermediate_size", 0) : c.integer("intermediate_size");
  if (hp.moe) hp.experts = read_moe_hparams(c, false);
  hp.n_head = c.integer("num_attention_heads");
  hp.n_head_kv = c.integer_or("num_key_value_heads", hp.n_head);
  hp.head_dim_given = c.has("head_dim");
  hp.head_dim = c.integer_or("head_dim", hp.n_embd / hp.n_head);
  hp.n_vocab = c.integer("vocab_size");
  hp.n_ctx = c.integer_or("max_position_embeddings", 0);
  if (hp.n_head % hp.n_head_kv != 0)
    fail("{}: num_attention_heads {} is not a multiple of num_key_value_heads {}", c.where, hp.n_head, hp.n_head_kv);
  if (hp.head_dim % 2 != 0) fail("{}: head dimension {} is odd", c.where, hp.head_dim);
  hp.rms_eps = c.number_or(c.j, "rms_norm_eps", 1e-6);
  hp.tied = c.boolean_or("tie_word_embeddings", false);
  if (c.has("hidden_act") && c.j["hidden_act"] != "silu")
    fail("{}: hidden_act {} is not supported (only silu)", c.where, c.j["hidden_act"].dump());
  if (c.has("partial_rotary_factor") && c.number_or(c.j, "partial_rotary_factor", 1.0) != 1.0)
    fail("{}: partial_rotary_factor is not supported", c.where);

  // RoPE: transformers 4.x writes rope_theta and rope_scaling, 5.x one rope_parameters object.
  json rope = json::object();
  if (c.has("rope_scaling")) {
    if (!c.j["rope_scaling"].is_object()) fail("{}: \"rope_scaling\" is not an object", c.where);
    rope = c.j["rope_scaling"];
  } else if (c.has("rope_parameters")) {
    if (!c.j["rope_parameters"].is_object()) fail("{}: \"rope_parameters\" is not an object", c.where);
    rope = c.j["rope_parameters"];
  }
  hp.rope_theta = c.number_or(c.j, "rope_theta", c.number_or(rope, "rope_theta", 10000.0));
  std::string type;
  if (rope.contains("rope_type") && rope["rope_type"].is_string()) type = rope["rope_type"].get<std::string>();
  else if (rope.contains("type") && rope["type"].is_string()) type = rope["type"].get<std::string>();
  if (type == "default" || type == "none") type.clear();
  hp.rope_factor = c.number_or(rope, "factor", 1.0);
  if (type == "linear") {
    if (!(hp.rope_factor > 0)) fail("{}: rope scaling factor {} must be positive", c.where, hp.rope_factor);
  } else if (type == "llama3") {
    if (arch != "llama") fail("{}: llama3 rope scaling is only supported for llama models", c.where);
    hp.low_freq_factor = c.number_or(rope, "low_freq_factor", 1.0);
    hp.high_freq_factor = c.number_or(rope, "high_freq_factor", 4.0);
    hp.original_context = (int64_t)c.number_or(rope, "original_max_position_embeddings",
                                               c.number_or(c.j, "original_max_position_embeddings", 8192));
    if (hp.low_freq_factor == hp.high_freq_factor) fail("{}: llama3 rope scaling with equal low/high frequency factors", c.where);
  } else if (!type.empty()) {
    fail("{}: rope scaling type '{}' is not supported (supported: linear, llama3)", c.where, type);
  }
  hp.rope_type = type;
  return hp;
}

// What the folder must hold: HF name -> (shape in PyTorch order, GGUF name, permutation heads or 0).
struct Expected {
  std::string hf_name;
  std::vector<int64_t> shape;
  std::string gguf_name;
  int64_t permute_heads = 0;
  bool required = true;
  bool experts = false;  // a layer's stacked experts: hf_name is their prefix, gguf_name the block's
};

std::vector<Expected> expected_tensors(const Hparams& hp, const ArchInfo& arch, bool with_biases) {
  std::vector<Expected> e;
  const int64_t H = hp.n_embd, q = hp.n_head * hp.head_dim, kv = hp.n_head_kv * hp.head_dim;
  const bool permute = hp.arch == "llama";
  e.push_back({"model.embed_tokens.weight", {hp.n_vocab, H}, "token_embd.weight"});
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    const std::string p = "model.layers." + std::to_string(il) + ".", b = "blk." + std::to_string(il) + ".";
    e.push_back({p + "input_layernorm.weight", {H}, b + "attn_norm.weight"});
    e.push_back({p + "self_attn.q_proj.weight", {q, H}, b + "attn_q.weight", permute ? hp.n_head : 0});
    if (with_biases) e.push_back({p + "self_attn.q_proj.bias", {q}, b + "attn_q.bias", permute ? hp.n_head : 0});
    e.push_back({p + "self_attn.k_proj.weight", {kv, H}, b + "attn_k.weight", permute ? hp.n_head_kv : 0});
    if (with_biases) e.push_back({p + "self_attn.k_proj.bias", {kv}, b + "attn_k.bias", permute ? hp.n_head_kv : 0});
    e.push_back({p + "self_attn.v_proj.weight", {kv, H}, b + "attn_v.weight"});
    if (with_biases) e.push_back({p + "self_attn.v_proj.bias", {kv}, b + "attn_v.bias"});
    e.push_back({p + "self_attn.o_proj.weight", {H, q}, b + "attn_output.weight"});
    if (arch.has(LayerTensor::AttnQNorm)) {
      e.push_back({p + "self_attn.q_norm.weight", {hp.head_dim}, b + "attn_q_norm.weight"});
      e.push_back({p + "self_attn.k_norm.weight", {hp.head_dim}, b + "attn_k_norm.weight"});
    }
    e.push_back({p + "post_attention_layernorm.weight", {H}, b + "ffn_norm.weight"});
    if (hp.moe) {
      Expected experts{p + "mlp.experts.", {}, b};
      experts.experts = true;
      e.push_back(experts);
      e.push_back({p + "mlp.gate.weight", {hp.experts.n_expert, H}, b + "ffn_gate_inp.weight"});
      continue;
    }
    e.push_back({p + "mlp.gate_proj.weight", {hp.n_ff, H}, b + "ffn_gate.weight"});
    e.push_back({p + "mlp.up_proj.weight", {hp.n_ff, H}, b + "ffn_up.weight"});
    e.push_back({p + "mlp.down_proj.weight", {H, hp.n_ff}, b + "ffn_down.weight"});
  }
  e.push_back({"model.norm.weight", {H}, "output_norm.weight"});
  e.push_back({"lm_head.weight", {hp.n_vocab, H}, "output.weight", 0, false});
  return e;
}

}  // namespace

ConvertResult convert_hf(const ConvertOptions& options) {
  const fs::path dir(options.source);
  const fs::path config_path = dir / "config.json";
  if (!fs::exists(config_path)) fail("{}: no config.json (not a Hugging Face model folder)", options.source);
  Config cfg{read_json_file(config_path), config_path.string()};
  if (!cfg.j.is_object()) fail("{}: not a JSON object", cfg.where);

  // The architecture: architectures[0], or text_config's when it names one (as llama.cpp decides).
  std::string hf_arch;
  auto first_arch = [&](const json& obj) {
    if (obj.is_object() && obj.contains("architectures") && obj["architectures"].is_array() &&
        !obj["architectures"].empty() && obj["architectures"][0].is_string())
      hf_arch = obj["architectures"][0].get<std::string>();
  };
  first_arch(cfg.j);
  if (cfg.has("text_config")) first_arch(cfg.j["text_config"]);
  if (hf_arch == "Qwen3_5ForConditionalGeneration" || hf_arch == "Qwen3_5ForCausalLM" ||
      hf_arch == "Qwen3_5MoeForConditionalGeneration" || hf_arch == "Qwen3_5MoeForCausalLM")
    return convert_qwen35(options, cfg.j, hf_arch);
  if (hf_arch == "Gemma3ForCausalLM" || hf_arch == "Gemma3ForConditionalGeneration") return convert_gemma3(options, cfg.j, hf_arch);
  const char* arch_name = nullptr;
  std::string known;
  for (const auto& a : kArchs) {
    known += (known.empty() ? "" : ", ") + std::string(a.hf_name);
    if (hf_arch == a.hf_name) arch_name = a.arch;
  }
  known += ", Qwen3_5ForConditionalGeneration, Qwen3_5ForCausalLM, Qwen3_5MoeForConditionalGeneration, Qwen3_5MoeForCausalLM, Gemma3ForCausalLM, Gemma3ForConditionalGeneration";
  if (!arch_name)
    fail("{}: architecture '{}' is not supported by convert (supported: {})", cfg.where, hf_arch.empty() ? "(none)" : hf_arch,
         known);
  const ArchInfo& arch = *find_arch(arch_name);
  const Hparams hp = read_hparams(cfg, arch_name);
  const std::optional<DType> requested = parse_outtype(options.outtype);

  const safetensors::SafetensorsModel st = safetensors::SafetensorsModel::open_folder(options.source);

  // Biases on q/k/v: qwen2 always; llama when attention_bias (or when the files carry them).
  bool with_biases = arch.has(LayerTensor::AttnQBias) && (hp.arch == "qwen2" || cfg.boolean_or("attention_bias", false) ||
                                               st.find("model.layers.0.self_attn.q_proj.bias") != nullptr);
  std::vector<Expected> expected = expected_tensors(hp, arch, with_biases);

  ConvertResult result;
  result.arch = hp.arch;
  std::vector<std::string> problems;
  std::set<std::string> used;
  std::vector<std::pair<const Expected*, const safetensors::Tensor*>> bound;
  std::map<const Expected*, LayerExperts> experts;
  bool have_output = false;
  for (const Expected& e : expected) {
    if (e.experts) {
      auto find = [&](const std::string& n) { return st.find(n); };
      experts[&e] = bind_layer_experts(find, e.hf_name, hp.experts, hp.n_embd, used, problems);
      bound.push_back({&e, nullptr});
      continue;
    }
    const safetensors::Tensor* t = st.find(e.hf_name);
    if (!t) {
      if (e.required) problems.push_back("missing " + e.hf_name);
      continue;
    }
    used.insert(e.hf_name);
    if (e.gguf_name == "output.weight") {
      if (hp.tied) continue;  // tied: the loader reuses token_embd
      have_output = true;
    }
    if (t->shape != e.shape)
      problems.push_back(fmt::format("{} has shape {}, expected {}", e.hf_name, t->shape_string(), shape_string(e.shape)));
    bound.push_back({&e, t});
  }
  for (const safetensors::Tensor* t : st.tensors()) {
    if (used.count(t->name)) continue;
    if (t->name.size() > 22 && t->name.substr(t->name.size() - 22) == ".rotary_emb.inv_freq") continue;  // computed, not stored
    problems.push_back("unexpected " + t->name);
  }
  if (!problems.empty())
    fail_with_problems(fmt::format("{}: the tensors do not match a {} model with this config.json", options.source, hf_arch),
                       problems);
  if (!hp.tied && !have_output)
    result.notes.push_back("lm_head.weight is absent: the output layer reuses the token embedding (tied)");

  // Output type: llama.cpp's "auto" picks f16 for f16 weights and bf16 otherwise (by the embedding's type).
  DType outtype;
  if (requested) {
    outtype = *requested;
  } else {
    const safetensors::Tensor* first = st.find("model.embed_tokens.weight");
    outtype = first->type == DType::F16 ? DType::F16 : DType::BF16;
  }
  result.outtype = dtype_name(outtype);

  // Metadata, in llama.cpp's order: general, hyperparameters, tokenizer.
  gguf::Metadata md;
  const std::string a = hp.arch;
  std::string name = fs::absolute(dir).lexically_normal().filename().string();
  if (name.empty()) name = fs::absolute(dir).lexically_normal().parent_path().filename().string();
  md.set("general.architecture", gguf::Value::string(a));
  md.set("general.type", gguf::Value::string("model"));
  md.set("general.name", gguf::Value::string(name));
  md.set(a + ".block_count", gguf::Value::u32((uint32_t)hp.n_layer));
  if (hp.n_ctx > 0) md.set(a + ".context_length", gguf::Value::u32((uint32_t)hp.n_ctx));
  md.set(a + ".embedding_length", gguf::Value::u32((uint32_t)hp.n_embd));
  if (hp.n_ff > 0) md.set(a + ".feed_forward_length", gguf::Value::u32((uint32_t)hp.n_ff));
  md.set(a + ".attention.head_count", gguf::Value::u32((uint32_t)hp.n_head));
  md.set(a + ".attention.head_count_kv", gguf::Value::u32((uint32_t)hp.n_head_kv));
  md.set(a + ".rope.freq_base", gguf::Value::f32((float)hp.rope_theta));
  md.set(a + ".attention.layer_norm_rms_epsilon", gguf::Value::f32((float)hp.rms_eps));
  if (hp.moe) add_moe_counts(md, a, hp.experts);
  if (hp.head_dim_given || hp.head_dim * hp.n_head != hp.n_embd) {
    md.set(a + ".attention.key_length", gguf::Value::u32((uint32_t)hp.head_dim));
    md.set(a + ".attention.value_length", gguf::Value::u32((uint32_t)hp.head_dim));
  }
  md.set("general.file_type", gguf::Value::u32(file_type_for(outtype)));
  if (hp.moe) add_moe_lengths(md, a, hp.experts);
  if (a == "llama") {
    md.set(a + ".vocab_size", gguf::Value::u32((uint32_t)hp.n_vocab));
    md.set(a + ".rope.dimension_count", gguf::Value::u32((uint32_t)hp.head_dim));
  }
  if (hp.rope_type == "linear") {
    md.set(a + ".rope.scaling.type", gguf::Value::string("linear"));
    md.set(a + ".rope.scaling.factor", gguf::Value::f32((float)hp.rope_factor));
  }
  md.set("general.quantization_version", gguf::Value::u32(2));
  const std::string tokenizer_json = options.tokenizer.empty() ? (dir / "tokenizer.json").string() : options.tokenizer;
  if (!fs::exists(tokenizer_json))
    fail("{}: no tokenizer.json (SentencePiece tokenizer.model folders are not supported)", options.source);
  add_hf_tokenizer_metadata(md, tokenizer_json, (int)hp.n_vocab, options.pre);

  // Tensors: token_embd, rope_freqs, the layers in order, output_norm, output.
  std::vector<PlannedTensor> planned;
  auto plan = [&](const Expected& e, const safetensors::Tensor* t) {
    std::vector<int64_t> shape(e.shape.rbegin(), e.shape.rend());
    std::string note;
    const DType type = tensor_type_for(e.gguf_name, (int)shape.size(), shape[0], outtype, &note);
    if (!note.empty()) result.notes.push_back(note);
    const int64_t heads = e.permute_heads, head_dim = hp.head_dim;
    const int64_t row = shape[0];
    const int64_t unit = shape.size() == 1 ? 1 : row;  // what the permutation moves: matrix rows, or bias elements
    planned.push_back({e.gguf_name, shape, type, [t, heads, head_dim, row, unit](float* dst, int64_t r0, int64_t nr) {
                         if (!heads) {
                           safetensors::tensor_to_f32(*t, r0 * row, nr * row, dst);
                           return;
                         }
                         // GGUF row r = head h, pair i, half p (r = h*hd + 2i + p) comes from HF row h*hd + p*hd/2 + i.
                         const int64_t u0 = r0 * row / unit, nu = nr * row / unit;
                         for (int64_t r = u0; r < u0 + nu; ++r) {
                           const int64_t h = r / head_dim, j = r % head_dim;
                           const int64_t src = h * head_dim + (j % 2) * (head_dim / 2) + j / 2;
                           safetensors::tensor_to_f32(*t, src * unit, unit, dst + (r - u0) * unit);
                         }
                       }});
  };
  for (const auto& [e, t] : bound) {
    if (e->gguf_name == "output.weight") continue;
    if (e->experts) {
      for (PlannedTensor& p : plan_layer_experts(experts.at(e), e->gguf_name, hp.experts, hp.n_embd, outtype, result))
        planned.push_back(std::move(p));
      continue;
    }
    plan(*e, t);
    if (e->gguf_name == "token_embd.weight" && hp.rope_type == "llama3") {
      const std::vector<float> factors =
          llama3_rope_factors((int)hp.head_dim, (float)hp.rope_theta, (float)hp.rope_factor, (float)hp.low_freq_factor,
                              (float)hp.high_freq_factor, (int)hp.original_context);
      planned.push_back({"rope_freqs.weight", {(int64_t)factors.size()}, DType::F32,
                         [factors](float* dst, int64_t, int64_t) { std::copy(factors.begin(), factors.end(), dst); }});
    }
  }
  for (const auto& [e, t] : bound)
    if (e->gguf_name == "output.weight") plan(*e, t);

  write_converted(options, md, planned, result);
  return result;
}

}  // namespace roofline::convert
