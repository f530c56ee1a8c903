// Qwen3_5ForConditionalGeneration / Qwen3_5ForCausalLM -> GGUF `qwen35` and Qwen3_5Moe* -> `qwen35moe` (the
// FFN a router, experts stacked into 3-D tensors by convert_moe.h, and a gated shared expert), tensor for
// tensor what llama.cpp's converter writes (conversion/qwen.py Qwen3_5TextModel, Qwen3_5MoeTextModel and
// their bases, conversion/base.py): tensors in the
// order llama.cpp reads them (shards sorted, names sorted within a shard), A_log -> ssm_a = -exp(A_log),
// dt_bias -> ssm_dt.bias, conv1d squeezed, every *norm.weight + 1 except the DeltaNet's gated norm, V heads
// reordered from grouped to tiled when linear_num_key_heads < linear_num_value_heads, the MTP block as
// blk.<n_layer + i>.* / blk.<n_layer>.nextn.*, the vision tower skipped; the same metadata keys, order and types.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "convert/convert.h"
#include "convert/convert_hf_util.h"
#include "convert/convert_moe.h"
#include "core/error.h"
#include "core/fp16.h"
#include "formats/hf_tokenizer.h"
#include "formats/safetensors.h"

namespace roofline::convert {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {


bool starts_with(const std::string& s, const char* p) { return s.rfind(p, 0) == 0; }
bool ends_with(const std::string& s, const char* p) {
  const size_t n = std::strlen(p);
  return s.size() >= n && s.compare(s.size() - n, n, p) == 0;
}

struct Hparams {
  int64_t n_embd, n_layer, n_ff, n_head, n_head_kv, head_dim, n_vocab;
  std::optional<int64_t> n_ctx;
  double rms_eps;
  std::optional<double> norm_eps;
  double rope_theta;
  double partial_rotary = 0.25;
  std::optional<std::vector<int32_t>> mrope_section;  // as given (padded to 4 when written)
  std::string rope_type;                             // "", "linear", "yarn"
  json rope_params;                                  // the rope object the scaling keys come from
  int64_t d_conv, k_head_dim, v_head_dim, n_k_heads, n_v_heads, interval;
  std::vector<bool> full_attention;                  // per layer
  int64_t mtp_config = 0;                            // mtp_num_hidden_layers (0: absent)
  bool tied = false;
  bool moe = false;                                  // qwen35moe: n_ff 0 when intermediate_size is absent
  MoeHparams experts;
};

Hparams read_hparams(const json& config, const std::string& where_file, bool moe) {
  const HfConfig c = text_model_config(config, where_file);  // text_config's keys over the top level's
  const std::string& where = c.where;
  const json& merged = c.j;
  Hparams hp;
  hp.n_embd = c.integer("hidden_size");
  hp.n_layer = c.integer("num_hidden_layers");
  hp.moe = moe;
  hp.n_ff = moe ? c.integer_or("intermediate_size", 0) : c.integer("intermediate_size");
  if (moe) hp.experts = read_moe_hparams(c, true);
  hp.n_head = c.integer("num_attention_heads");
  hp.n_head_kv = c.integer("num_key_value_heads");
  hp.head_dim = c.integer("head_dim");
  hp.n_vocab = c.integer("vocab_size");
  for (const char* k : {"max_position_embeddings", "n_ctx", "n_positions", "max_length", "max_sequence_length", "model_max_length"})
    if (c.has(k)) {
      hp.n_ctx = c.integer(k);
      break;
    }
  hp.rms_eps = c.number("rms_norm_eps");
  for (const char* k : {"layer_norm_eps", "layer_norm_epsilon", "norm_epsilon"})
    if (c.has(k)) {
      hp.norm_eps = c.number(k);
      break;
    }
  hp.d_conv = c.integer("linear_conv_kernel_dim");
  hp.k_head_dim = c.integer("linear_key_head_dim");
  hp.v_head_dim = c.integer("linear_value_head_dim");
  hp.n_k_heads = c.integer("linear_num_key_heads");
  hp.n_v_heads = c.integer("linear_num_value_heads");
  hp.interval = c.integer_or("full_attention_interval", 4);
  hp.tied = c.boolean_or("tie_word_embeddings", false);
  if (hp.n_head % hp.n_head_kv != 0)
    fail("{}: num_attention_heads {} is not a multiple of num_key_value_heads {}", where, hp.n_head, hp.n_head_kv);
  if (hp.n_v_heads % hp.n_k_heads != 0)
    fail("{}: linear_num_value_heads {} is not a multiple of linear_num_key_heads {}", where, hp.n_v_heads, hp.n_k_heads);
  if (c.has("hidden_act") && c.j["hidden_act"] != "silu")
    fail("{}: hidden_act {} is not supported (only silu)", where, c.j["hidden_act"].dump());
  if (c.boolean_or("attention_bias", false)) fail("{}: attention_bias true is not supported for Qwen3.5", where);
  if (c.has("mtp_num_hidden_layers")) {
    if (!c.j["mtp_num_hidden_layers"].is_number_integer() || c.j["mtp_num_hidden_layers"].get<int64_t>() < 0)
      fail("{}: \"mtp_num_hidden_layers\" is not a count", where);
    hp.mtp_config = c.j["mtp_num_hidden_layers"].get<int64_t>();
  }

  // Layer kinds: every interval-th layer is full attention; layer_types, when given, must say the same
  // (llama.cpp's GGUF carries only the interval).
  for (int64_t i = 0; i < hp.n_layer; ++i) hp.full_attention.push_back((i + 1) % hp.interval == 0);
  if (c.has("layer_types")) {
    const json& lt = c.j["layer_types"];
    if (!lt.is_array() || (int64_t)lt.size() != hp.n_layer)
      fail("{}: \"layer_types\" is not a list of {} layer types", where, hp.n_layer);
    for (int64_t i = 0; i < hp.n_layer; ++i) {
      const std::string t = lt[i].is_string() ? lt[i].get<std::string>() : "";
      if (t != "linear_attention" && t != "full_attention")
        fail("{}: layer_types[{}] is {} (expected linear_attention or full_attention)", where, i, lt[i].dump());
      if ((t == "full_attention") != hp.full_attention[i])
        fail("{}: layer_types[{}] is {}, which full_attention_interval {} does not give", where, i, t, hp.interval);
    }
  }

  // RoPE (TextModel.__init__): rope_parameters, else rope_scaling; top-level rope_theta, type and
  // partial_rotary_factor mirrored into it when absent there.
  json rp = json::object();
  const char* rope_key = merged.contains("rope_parameters") ? "rope_parameters" : "rope_scaling";
  if (merged.contains(rope_key) && !merged[rope_key].is_null()) {
    if (!merged[rope_key].is_object()) fail("{}: \"{}\" is not an object", where, rope_key);
    rp = merged[rope_key];
  }
  if (!rp.contains("full_attention") && !rp.contains("sliding_attention")) {
    if (!rp.contains("rope_theta"))
      for (const char* k : {"global_rope_theta", "rope_global_theta", "rope_theta_global", "rope_theta", "rotary_emb_base"})
        if (c.has(k)) {
          rp["rope_theta"] = merged[k];
          break;
        }
    if (!rp.contains("rope_type") && rp.contains("type")) rp["rope_type"] = rp["type"];
    if (!rp.contains("partial_rotary_factor"))
      for (const char* k : {"partial_rotary_factor", "rope_pct", "rope_percent"})
        if (c.has(k)) {
          rp["partial_rotary_factor"] = merged[k];
          break;
        }
    if (!rp.contains("original_max_position_embeddings") && c.has("original_max_position_embeddings"))
      rp["original_max_position_embeddings"] = merged["original_max_position_embeddings"];
  }
  hp.partial_rotary = c.number_or(rp, "partial_rotary_factor", 0.25);
  if (!(hp.partial_rotary > 0 && hp.partial_rotary <= 1)) fail("{}: partial_rotary_factor {} is out of range", where, hp.partial_rotary);
  if (rp.contains("mrope_section")) {
    const json& ms = rp["mrope_section"];
    if (!ms.is_array()) fail("{}: \"mrope_section\" is not a list", where);
    hp.mrope_section.emplace();
    for (const auto& v : ms) {
      if (!v.is_number_integer()) fail("{}: \"mrope_section\" holds {}, not an integer", where, v.dump());
      hp.mrope_section->push_back(v.get<int32_t>());
    }
  }
  hp.rope_params = rp.contains("full_attention") && rp["full_attention"].is_object() ? rp["full_attention"] : rp;
  if (!hp.rope_params.contains("rope_theta") || hp.rope_params["rope_theta"].is_null()) fail("{}: \"rope_theta\" is missing", where);
  hp.rope_theta = c.number_or(hp.rope_params, "rope_theta", 0);
  if (hp.rope_params.contains("rope_type") && hp.rope_params["rope_type"].is_string()) {
    const std::string t = hp.rope_params["rope_type"].get<std::string>();
    const bool has_factor = hp.rope_params.contains("factor") && !hp.rope_params["factor"].is_null();
    if ((t == "linear" || t == "yarn") && has_factor) {
      hp.rope_type = t;
      if (t == "yarn" && !hp.rope_params.contains("original_max_position_embeddings"))
        fail("{}: yarn rope scaling without \"original_max_position_embeddings\"", where);
    } else if (t != "default" && t != "mrope" && t != "none" && t != "linear" && t != "yarn") {
      fail("{}: rope type '{}' is not supported for Qwen3.5 (default, linear or yarn)", where, t);
    }
  }
  return hp;
}

// One tensor llama.cpp writes: its GGUF name, the PyTorch shape the source must have, and the transform.
enum class Op { Copy, PlusOne, NegExp };
enum class Reorder { None, Rows, Cols };  // V heads, on matrix rows or within rows (columns / 1-D elements)
struct Expected {
  std::string gguf_name;
  std::vector<int64_t> shape;  // PyTorch order
  Op op = Op::Copy;
  Reorder reorder = Reorder::None;
  int64_t reorder_offset = 0;    // first row / column of the V part
  int64_t reorder_head_dim = 0;  // values per V head along that axis
  bool squeeze = false;          // conv1d: size-1 dims dropped
  bool required = true;
};

// The FFN of a layer (HF prefix p, GGUF prefix b): SwiGLU, or the MoE router and the gated shared
// expert (the routed experts are bound apart, convert_moe.h).
void expected_ffn(std::map<std::string, Expected>& e, const Hparams& hp, const std::string& p, const std::string& b) {
  const int64_t H = hp.n_embd;
  if (!hp.moe) {
    e[p + "mlp.gate_proj.weight"] = {b + "ffn_gate.weight", {hp.n_ff, H}};
    e[p + "mlp.up_proj.weight"] = {b + "ffn_up.weight", {hp.n_ff, H}};
    e[p + "mlp.down_proj.weight"] = {b + "ffn_down.weight", {H, hp.n_ff}};
    return;
  }
  const int64_t S = hp.experts.n_ff_shexp;
  e[p + "mlp.gate.weight"] = {b + "ffn_gate_inp.weight", {hp.experts.n_expert, H}};
  e[p + "mlp.shared_expert_gate.weight"] = {b + "ffn_gate_inp_shexp.weight", {1, H}};
  e[p + "mlp.shared_expert.gate_proj.weight"] = {b + "ffn_gate_shexp.weight", {S, H}};
  e[p + "mlp.shared_expert.up_proj.weight"] = {b + "ffn_up_shexp.weight", {S, H}};
  e[p + "mlp.shared_expert.down_proj.weight"] = {b + "ffn_down_shexp.weight", {H, S}};
}

// HF name (after llama.cpp's "language_model." removal) -> what it becomes.
std::map<std::string, Expected> expected_main(const Hparams& hp) {
  std::map<std::string, Expected> e;
  const int64_t H = hp.n_embd, q = hp.n_head * hp.head_dim, kv = hp.n_head_kv * hp.head_dim;
  const int64_t key_dim = hp.k_head_dim * hp.n_k_heads, value_dim = hp.v_head_dim * hp.n_v_heads;
  const int64_t conv_dim = 2 * key_dim + value_dim;
  const bool reorder = hp.n_k_heads != hp.n_v_heads;
  auto V = [&](Expected x, Reorder r, int64_t offset, int64_t hd) {
    if (reorder) x.reorder = r, x.reorder_offset = offset, x.reorder_head_dim = hd;
    return x;
  };
  e["model.embed_tokens.weight"] = {"token_embd.weight", {hp.n_vocab, H}};
  e["model.norm.weight"] = {"output_norm.weight", {H}, Op::PlusOne};
  e["lm_head.weight"] = {"output.weight", {hp.n_vocab, H}};
  e["lm_head.weight"].required = false;
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    const std::string p = "model.layers." + std::to_string(il) + ".", b = "blk." + std::to_string(il) + ".";
    e[p + "input_layernorm.weight"] = {b + "attn_norm.weight", {H}, Op::PlusOne};
    e[p + "post_attention_layernorm.weight"] = {b + "post_attention_norm.weight", {H}, Op::PlusOne};
    expected_ffn(e, hp, p, b);
    if (hp.full_attention[il]) {
      e[p + "self_attn.q_proj.weight"] = {b + "attn_q.weight", {2 * q, H}};  // query and gate, interleaved per head
      e[p + "self_attn.k_proj.weight"] = {b + "attn_k.weight", {kv, H}};
      e[p + "self_attn.v_proj.weight"] = {b + "attn_v.weight", {kv, H}};
      e[p + "self_attn.o_proj.weight"] = {b + "attn_output.weight", {H, q}};
      e[p + "self_attn.q_norm.weight"] = {b + "attn_q_norm.weight", {hp.head_dim}, Op::PlusOne};
      e[p + "self_attn.k_norm.weight"] = {b + "attn_k_norm.weight", {hp.head_dim}, Op::PlusOne};
    } else {
      const std::string la = p + "linear_attn.";
      e[la + "in_proj_qkv.weight"] = V({b + "attn_qkv.weight", {conv_dim, H}}, Reorder::Rows, 2 * key_dim, hp.v_head_dim);
      e[la + "in_proj_z.weight"] = V({b + "attn_gate.weight", {value_dim, H}}, Reorder::Rows, 0, hp.v_head_dim);
      e[la + "in_proj_b.weight"] = V({b + "ssm_beta.weight", {hp.n_v_heads, H}}, Reorder::Rows, 0, 1);
      e[la + "in_proj_a.weight"] = V({b + "ssm_alpha.weight", {hp.n_v_heads, H}}, Reorder::Rows, 0, 1);
      Expected conv = V({b + "ssm_conv1d.weight", {conv_dim, 1, hp.d_conv}}, Reorder::Rows, 2 * key_dim, hp.v_head_dim);
      conv.squeeze = true;
      e[la + "conv1d.weight"] = conv;
      e[la + "dt_bias"] = V({b + "ssm_dt.bias", {hp.n_v_heads}}, Reorder::Cols, 0, 1);
      e[la + "A_log"] = V({b + "ssm_a", {hp.n_v_heads}, Op::NegExp}, Reorder::Cols, 0, 1);
      e[la + "norm.weight"] = {b + "ssm_norm.weight", {hp.v_head_dim}};  // the gated norm: no +1
      e[la + "out_proj.weight"] = V({b + "ssm_out.weight", {H, value_dim}}, Reorder::Cols, 0, hp.v_head_dim);
    }
  }
  return e;
}

// The MTP block (_QwenMtpMixin.filter_tensors): mtp.layers.<i>.* is a full-attention decoder layer at
// blk.<n_layer + i>; mtp.fc, pre_fc_norm_embedding, pre_fc_norm_hidden, norm are blk.<n_layer>.nextn.*.
std::map<std::string, Expected> expected_mtp(const Hparams& hp, int64_t n_mtp) {
  std::map<std::string, Expected> e;
  const int64_t H = hp.n_embd, q = hp.n_head * hp.head_dim, kv = hp.n_head_kv * hp.head_dim;
  const std::string nb = "blk." + std::to_string(hp.n_layer) + ".nextn.";
  e["mtp.fc.weight"] = {nb + "eh_proj.weight", {H, 2 * H}};
  e["mtp.pre_fc_norm_embedding.weight"] = {nb + "enorm.weight", {H}, Op::PlusOne};
  e["mtp.pre_fc_norm_hidden.weight"] = {nb + "hnorm.weight", {H}, Op::PlusOne};
  e["mtp.norm.weight"] = {nb + "shared_head_norm.weight", {H}, Op::PlusOne};
  e["mtp.norm.weight"].required = false;
  for (int64_t i = 0; i < n_mtp; ++i) {
    const std::string p = "mtp.layers." + std::to_string(i) + ".", b = "blk." + std::to_string(hp.n_layer + i) + ".";
    e[p + "input_layernorm.weight"] = {b + "attn_norm.weight", {H}, Op::PlusOne};
    e[p + "post_attention_layernorm.weight"] = {b + "post_attention_norm.weight", {H}, Op::PlusOne};
    e[p + "self_attn.q_proj.weight"] = {b + "attn_q.weight", {2 * q, H}};
    e[p + "self_attn.k_proj.weight"] = {b + "attn_k.weight", {kv, H}};
    e[p + "self_attn.v_proj.weight"] = {b + "attn_v.weight", {kv, H}};
    e[p + "self_attn.o_proj.weight"] = {b + "attn_output.weight", {H, q}};
    e[p + "self_attn.q_norm.weight"] = {b + "attn_q_norm.weight", {hp.head_dim}, Op::PlusOne};
    e[p + "self_attn.k_norm.weight"] = {b + "attn_k_norm.weight", {hp.head_dim}, Op::PlusOne};
    expected_ffn(e, hp, p, b);
  }
  return e;
}

// Grouped-by-K-head V order -> tiled (conversion/qwen.py _reorder_v_heads): tiled head h holds grouped
// head (h % n_k) * (n_v / n_k) + h / n_k. Index within the V part -> source index.
int64_t v_source_index(int64_t i, int64_t head_dim, int64_t n_k, int64_t n_v) {
  const int64_t h = i / head_dim, e = i % head_dim;
  return ((h % n_k) * (n_v / n_k) + h / n_k) * head_dim + e;
}

struct Bound {
  const safetensors::Tensor* t;
  const Expected* e;
  const LayerExperts* experts = nullptr;  // a layer's stacked experts (e null; t its first source tensor)
  std::string blk = "";                   // their "blk.N."
};

// "model.layers.3.mlp.experts." for a tensor inside a layer's experts.
std::string experts_prefix(const std::string& name) {
  const size_t at = name.find(".mlp.experts.");
  return name.substr(0, at + 13);
}
// The GGUF block of an experts prefix: model.layers.N -> blk.N, mtp.layers.i -> blk.<n_layer + i>.
std::string experts_block(const std::string& prefix, int64_t n_layer) {
  const bool mtp = starts_with(prefix, "mtp.layers.");
  const size_t start = mtp ? 11 : 13;
  const int64_t i = std::stoll(prefix.substr(start, prefix.find('.', start) - start));
  return "blk." + std::to_string(mtp ? n_layer + i : i) + ".";
}

PlannedTensor plan_tensor(const Bound& b, const Hparams& hp, DType outtype, ConvertResult& result) {
  const safetensors::Tensor* t = b.t;
  const Expected& e = *b.e;
  std::vector<int64_t> pt_shape;
  for (int64_t d : t->shape)
    if (!e.squeeze || d != 1) pt_shape.push_back(d);
  std::vector<int64_t> shape(pt_shape.rbegin(), pt_shape.rend());
  std::string note;
  const DType type = tensor_type_for(e.gguf_name, (int)shape.size(), shape[0], outtype, &note);
  if (!note.empty()) result.notes.push_back(note);
  const int64_t row = shape[0];

  // Source row for each row, source column for each column (V-head reorder), or none.
  std::shared_ptr<std::vector<int64_t>> row_src, col_src;
  if (e.reorder != Reorder::None) {
    const int64_t n = e.reorder == Reorder::Rows ? t->n_elements() / row : row;
    auto v = std::make_shared<std::vector<int64_t>>(n);
    for (int64_t i = 0; i < n; ++i)
      (*v)[i] = i < e.reorder_offset ? i
                                     : e.reorder_offset + v_source_index(i - e.reorder_offset, e.reorder_head_dim,
                                                                         hp.n_k_heads, hp.n_v_heads);
    (e.reorder == Reorder::Rows ? row_src : col_src) = v;
  }
  const Op op = e.op;
  // llama.cpp does this arithmetic in torch: f16 sources stay f16 (the f32 result rounded to f16), bf16
  // goes to f32 first; exp is correctly rounded (std::exp; torch's CPU exp is within 1 ulp of it).
  const bool f16_math = t->type == DType::F16;
  auto fill = [t, row, row_src, col_src, op, f16_math](float* dst, int64_t r0, int64_t nr) {
    if (!row_src && !col_src) {
      safetensors::tensor_to_f32(*t, r0 * row, nr * row, dst);
    } else {
      std::vector<float> tmp(col_src ? (size_t)row : 0);
      for (int64_t r = r0; r < r0 + nr; ++r) {
        const int64_t src = row_src ? (*row_src)[r] : r;
        float* out = dst + (r - r0) * row;
        if (!col_src) {
          safetensors::tensor_to_f32(*t, src * row, row, out);
        } else {
          safetensors::tensor_to_f32(*t, src * row, row, tmp.data());
          for (int64_t c = 0; c < row; ++c) out[c] = tmp[(*col_src)[c]];
        }
      }
    }
    if (op == Op::Copy) return;
    for (int64_t i = 0; i < nr * row; ++i) {
      float v = op == Op::PlusOne ? dst[i] + 1.0f : std::exp(dst[i]);
      if (f16_math) v = round_to_fp16(v);
      dst[i] = op == Op::NegExp ? -v : v;
    }
  };
  return {e.gguf_name, shape, type, fill};
}

}  // namespace

ConvertResult convert_qwen35(const ConvertOptions& options, const json& config, const std::string& hf_arch) {
  const fs::path dir(options.source);
  const bool moe = hf_arch.rfind("Qwen3_5Moe", 0) == 0;
  const std::string kArch = moe ? "qwen35moe" : "qwen35";
  const Hparams hp = read_hparams(config, (dir / "config.json").string(), moe);
  const std::optional<DType> requested = parse_outtype(options.outtype);
  const safetensors::SafetensorsModel st = safetensors::SafetensorsModel::open_folder(options.source);

  ConvertResult result;
  result.arch = kArch;
  const std::map<std::string, Expected> main = expected_main(hp);

  // llama.cpp's order and names (text_model_tensors), then model.mtp.* -> mtp.* and attention bias
  // buffers left out.
  using Item = HfTensor;
  size_t n_multimodal = 0;
  std::vector<Item> items;
  for (Item& it : text_model_tensors(st, &n_multimodal)) {
    if (starts_with(it.name, "model.mtp.")) it.name.erase(0, 6);
    if (ends_with(it.name, ".attention.masked_bias") || ends_with(it.name, ".attention.bias")) continue;
    items.push_back(std::move(it));
  }
  if (n_multimodal)
    result.notes.push_back(fmt::format("skipped {} vision tensors (model.visual.*): the GGUF holds the text model only", n_multimodal));

  // The main model: every tensor known, of the right shape; every required one present.
  std::vector<std::string> problems;
  std::map<std::string, Bound> bound;  // by renamed HF name
  std::vector<const Item*> mtp_items;
  std::map<std::string, const Item*> expert_items;  // by renamed name: bound per layer below
  for (const Item& it : items) {
    if (hp.moe && is_expert_tensor(it.name)) {
      expert_items[it.name] = &it;
      continue;
    }
    if (starts_with(it.name, "mtp.")) {
      mtp_items.push_back(&it);
      continue;
    }
    auto e = main.find(it.name);
    if (e == main.end()) {
      problems.push_back("unexpected " + it.t->name);
      continue;
    }
    if (!bound.emplace(it.name, Bound{it.t, &e->second}).second) {
      problems.push_back(fmt::format("{} is given twice", it.name));
      continue;
    }
    std::vector<int64_t> want = e->second.shape;
    if (it.t->shape != want)
      problems.push_back(fmt::format("{} has shape {}, expected {}", it.t->name, it.t->shape_string(), shape_string(want)));
  }
  for (const auto& [name, e] : main)
    if (e.required && !bound.count(name)) problems.push_back("missing " + name);
  // The routed experts, layer by layer.
  std::set<std::string> experts_used;
  std::map<std::string, LayerExperts> layer_experts;  // by prefix
  auto find_expert = [&](const std::string& n) -> const safetensors::Tensor* {
    auto it = expert_items.find(n);
    return it == expert_items.end() ? nullptr : it->second->t;
  };
  if (hp.moe) {
    for (int64_t il = 0; il < hp.n_layer; ++il) {
      const std::string prefix = "model.layers." + std::to_string(il) + ".mlp.experts.";
      layer_experts[prefix] = bind_layer_experts(find_expert, prefix, hp.experts, hp.n_embd, experts_used, problems);
    }
    for (const auto& [name, it] : expert_items)
      if (!starts_with(name, "mtp.") && !experts_used.count(name)) problems.push_back("unexpected " + it->t->name);
  }
  if (!problems.empty())
    fail_with_problems(fmt::format("{}: the tensors do not match a {} model with this config.json", options.source, hf_arch),
                       problems);
  if (!bound.count("lm_head.weight") && !hp.tied)
    result.notes.push_back("lm_head.weight is absent: the output layer reuses the token embedding (tied)");

  // The MTP block: kept (llama.cpp's default) when it is complete; any problem leaves it out with a note,
  // never failing the conversion. Its layer count is mtp_num_hidden_layers, else the mtp.layers.* found.
  int64_t n_mtp = 0;
  std::map<std::string, Expected> mtp;
  if (!mtp_items.empty() && options.no_mtp) {
    result.notes.push_back(fmt::format("the MTP block ({} mtp.* tensors) was left out (--no-mtp)", mtp_items.size()));
    mtp_items.clear();
  } else if (!mtp_items.empty()) {
    int64_t found = 0;
    for (const Item* it : mtp_items)
      if (starts_with(it->name, "mtp.layers.")) {
        const std::string rest = it->name.substr(11);
        const size_t dot = rest.find('.');
        if (dot != std::string::npos && dot > 0 && dot < 7 && std::all_of(rest.begin(), rest.begin() + dot, ::isdigit))
          found = std::max<int64_t>(found, std::stoll(rest.substr(0, dot)) + 1);
      }
    n_mtp = hp.mtp_config > 0 ? hp.mtp_config : found;
    std::string problem;
    if (n_mtp == 0) problem = "no mtp.layers.* tensors";
    mtp = expected_mtp(hp, n_mtp);
    std::set<std::string> seen;
    for (const Item* it : mtp_items) {
      if (!problem.empty()) break;
      auto e = mtp.find(it->name);
      if (e == mtp.end()) problem = "unexpected " + it->t->name;
      else if (!seen.insert(it->name).second) problem = it->name + " is given twice";
      else if (it->t->shape != e->second.shape)
        problem = fmt::format("{} has shape {}, expected {}", it->t->name, it->t->shape_string(), shape_string(e->second.shape));
    }
    for (const auto& [name, e] : mtp)
      if (problem.empty() && e.required && !seen.count(name)) problem = "missing " + name;
    for (int64_t i = 0; hp.moe && i < n_mtp && problem.empty(); ++i) {
      const std::string prefix = "mtp.layers." + std::to_string(i) + ".mlp.experts.";
      std::vector<std::string> expert_problems;
      layer_experts[prefix] = bind_layer_experts(find_expert, prefix, hp.experts, hp.n_embd, experts_used, expert_problems);
      if (!expert_problems.empty()) problem = expert_problems[0];
    }
    for (const auto& [name, it] : expert_items)
      if (problem.empty() && starts_with(name, "mtp.") && !experts_used.count(name)) problem = "unexpected " + it->t->name;
    if (!problem.empty()) {
      result.notes.push_back(fmt::format("the MTP block was left out ({}); the model converts without it", problem));
      mtp_items.clear();
      n_mtp = 0;
    }
  } else if (hp.mtp_config > 0 && !options.no_mtp) {
    result.notes.push_back(fmt::format("config.json says mtp_num_hidden_layers {} but there are no mtp.* tensors: no MTP block written",
                                       hp.mtp_config));
  }
  std::set<const safetensors::Tensor*> kept_mtp;
  for (const Item* it : mtp_items) kept_mtp.insert(it->t);

  // The written tensors, in order: a layer's stacked experts where its last expert tensor comes
  // (llama.cpp merges them when the last one arrives).
  std::map<std::string, const Item*> last_expert_item;
  for (const auto& [name, it] : expert_items) {
    const Item*& last = last_expert_item[experts_prefix(name)];
    if (!last || it > last) last = it;
  }
  std::vector<Bound> order;
  for (const Item& it : items) {
    if (hp.moe && is_expert_tensor(it.name)) {
      const std::string prefix = experts_prefix(it.name);
      if (last_expert_item.at(prefix) != &it) continue;
      if (starts_with(prefix, "mtp.") && n_mtp == 0) continue;  // the MTP block was left out
      const LayerExperts& x = layer_experts.at(prefix);
      const safetensors::Tensor* first = x.gate_up ? x.gate_up : x.gate.at(0);
      order.push_back({first, nullptr, &x, experts_block(prefix, hp.n_layer)});
      continue;
    }
    if (starts_with(it.name, "mtp.")) {
      if (kept_mtp.count(it.t)) order.push_back({it.t, &mtp.at(it.name)});
    } else {
      order.push_back(bound.at(it.name));
    }
  }

  const DType outtype = requested_or_auto_outtype(requested, order, [](const Bound& b) { return b.t; });
  result.outtype = dtype_name(outtype);
  std::vector<PlannedTensor> planned;
  int64_t total_params = 0;
  for (const Bound& b : order) {
    if (b.experts) {
      for (PlannedTensor& p : plan_layer_experts(*b.experts, b.blk, hp.experts, hp.n_embd, outtype, result))
        planned.push_back(std::move(p));
      total_params += b.experts->n_params();
      continue;
    }
    planned.push_back(plan_tensor(b, hp, outtype, result));
    total_params += b.t->n_elements();
  }

  // Metadata in llama.cpp's order: general (ModelBase.prepare_metadata), the hyperparameters
  // (TextModel, _QwenMtpMixin, Qwen3NextModel, _Qwen35MRopeMixin set_gguf_parameters), the tokenizer.
  gguf::Metadata md;
  const std::string a = kArch;
  md.set("general.architecture", gguf::Value::string(a));
  md.set("general.type", gguf::Value::string("model"));
  add_general_metadata(md, dir, config, total_params);
  md.set(a + ".block_count", gguf::Value::u32((uint32_t)(hp.n_layer + n_mtp)));
  if (hp.n_ctx) md.set(a + ".context_length", gguf::Value::u32((uint32_t)*hp.n_ctx));
  md.set(a + ".embedding_length", gguf::Value::u32((uint32_t)hp.n_embd));
  if (hp.n_ff > 0) md.set(a + ".feed_forward_length", gguf::Value::u32((uint32_t)hp.n_ff));
  md.set(a + ".attention.head_count", gguf::Value::u32((uint32_t)hp.n_head));
  md.set(a + ".attention.head_count_kv", gguf::Value::u32((uint32_t)hp.n_head_kv));
  if (hp.rope_type == "linear" || hp.rope_type == "yarn") {
    const HfConfig rc{hp.rope_params, (dir / "config.json").string()};
    md.set(a + ".rope.scaling.type", gguf::Value::string(hp.rope_type));
    md.set(a + ".rope.scaling.factor", gguf::Value::f32((float)rc.number("factor")));
    if (hp.rope_type == "yarn") {
      md.set(a + ".rope.scaling.original_context_length",
             gguf::Value::u32((uint32_t)rc.integer("original_max_position_embeddings")));
      auto opt = [&](const char* from, const char* alt, const char* key) {
        if (rc.has(from)) md.set(a + key, gguf::Value::f32((float)rc.number(from)));
        else if (alt && rc.has(alt)) md.set(a + key, gguf::Value::f32((float)rc.number(alt)));
      };
      opt("extrapolation_factor", nullptr, ".rope.scaling.yarn_ext_factor");
      opt("attention_factor", "attn_factor", ".rope.scaling.yarn_attn_factor");
      opt("beta_fast", nullptr, ".rope.scaling.yarn_beta_fast");
      opt("beta_slow", nullptr, ".rope.scaling.yarn_beta_slow");
    }
  }
  auto sections = [](std::vector<int32_t> s) {
    while (s.size() < 4) s.push_back(0);
    s.resize(4);
    return gguf::Value::i32_array(s);
  };
  if (hp.mrope_section) md.set(a + ".rope.dimension_sections", sections(*hp.mrope_section));
  md.set(a + ".rope.freq_base", gguf::Value::f32((float)hp.rope_theta));
  md.set(a + ".attention.layer_norm_rms_epsilon", gguf::Value::f32((float)hp.rms_eps));
  if (hp.norm_eps) md.set(a + ".attention.layer_norm_epsilon", gguf::Value::f32((float)*hp.norm_eps));
  if (hp.moe) add_moe_counts(md, a, hp.experts);
  md.set(a + ".attention.key_length", gguf::Value::u32((uint32_t)hp.head_dim));
  md.set(a + ".attention.value_length", gguf::Value::u32((uint32_t)hp.head_dim));
  md.set("general.file_type", gguf::Value::u32(file_type_for(outtype)));
  if (hp.moe) add_moe_lengths(md, a, hp.experts);
  if (n_mtp > 0) md.set(a + ".nextn_predict_layers", gguf::Value::u32((uint32_t)n_mtp));
  md.set(a + ".ssm.conv_kernel", gguf::Value::u32((uint32_t)hp.d_conv));
  md.set(a + ".ssm.state_size", gguf::Value::u32((uint32_t)hp.k_head_dim));
  md.set(a + ".ssm.group_count", gguf::Value::u32((uint32_t)hp.n_k_heads));
  md.set(a + ".ssm.time_step_rank", gguf::Value::u32((uint32_t)hp.n_v_heads));
  md.set(a + ".ssm.inner_size", gguf::Value::u32((uint32_t)(hp.v_head_dim * hp.n_v_heads)));
  md.set(a + ".full_attention_interval", gguf::Value::u32((uint32_t)hp.interval));
  md.set(a + ".rope.dimension_count", gguf::Value::u32((uint32_t)std::trunc((double)hp.head_dim * hp.partial_rotary)));
  if (!hp.mrope_section) md.set(a + ".rope.dimension_sections", sections({11, 11, 10, 0}));
  md.set("general.quantization_version", gguf::Value::u32(2));
  const std::string tokenizer_json = options.tokenizer.empty() ? (dir / "tokenizer.json").string() : options.tokenizer;
  if (!fs::exists(tokenizer_json)) fail("{}: no tokenizer.json", options.source);
  add_hf_tokenizer_metadata(md, tokenizer_json, (int)hp.n_vocab, options.pre);

  write_converted(options, md, planned, result);
  return result;
}

}  // namespace roofline::convert
