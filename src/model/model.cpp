// Model loading: hyperparameters from metadata (with llama.cpp's defaults) and tensor binding with
// shape checks; all problems are collected and reported in one Error.
#include "model/model.h"

#include <cmath>
#include <map>
#include <set>

#include "core/error.h"
#include "model/quant_mix.h"

namespace roofline {
namespace {

// A per-layer key may be a scalar or an array with one value per layer (roofline needs them equal).
int64_t uniform_int(const gguf::Metadata& md, const std::string& key, int64_t fallback, bool required) {
  const gguf::Value* v = md.find(key);
  if (!v) {
    if (required) fail("metadata key '{}' is missing", key);
    return fallback;
  }
  if (!v->is_array()) return v->as_int(key);
  const auto values = v->as_int_array(key);
  if (values.empty()) fail("metadata key '{}' is an empty array", key);
  for (int64_t x : values)
    if (x != values[0]) fail("metadata key '{}' varies per layer, which this architecture does not support", key);
  return values[0];
}

int checked(int64_t v, const std::string& what, int64_t lo, int64_t hi) {
  if (v < lo || v > hi) fail("{} = {} is out of range [{}, {}]", what, v, lo, hi);
  return (int)v;
}

}  // namespace

std::shared_ptr<const Model> Model::load(std::shared_ptr<const gguf::GgufFile> file) {
  auto model = std::shared_ptr<Model>(new Model());
  model->file_ = file;
  const gguf::Metadata& md = file->metadata();
  const std::string& name = file->name();
  try {
    const std::string arch = md.get_string("general.architecture");
    model->arch_ = find_arch(arch);
    if (!model->arch_) fail("architecture '{}' is not supported (supported: {})", arch, supported_arch_names());
    HParams& hp = model->hparams_;
    hp.arch = arch;
    const std::string a = arch + ".";
    hp.n_embd = checked(uniform_int(md, a + "embedding_length", 0, true), a + "embedding_length", 1, 1 << 17);
    hp.n_layer = checked(uniform_int(md, a + "block_count", 0, true), a + "block_count", 1, 4096);
    hp.n_ff = checked(uniform_int(md, a + "feed_forward_length", 0, true), a + "feed_forward_length", 1, 1 << 20);
    hp.n_head = checked(uniform_int(md, a + "attention.head_count", 0, true), a + "attention.head_count", 1, 4096);
    hp.n_head_kv = checked(uniform_int(md, a + "attention.head_count_kv", hp.n_head, false), a + "attention.head_count_kv", 1, hp.n_head);
    if (hp.n_head % hp.n_head_kv != 0)
      fail("attention.head_count {} is not a multiple of head_count_kv {}", hp.n_head, hp.n_head_kv);
    hp.head_dim_k = checked(md.get_int_or(a + "attention.key_length", hp.n_embd / hp.n_head), a + "attention.key_length", 2, 4096);
    hp.head_dim_v = checked(md.get_int_or(a + "attention.value_length", hp.n_embd / hp.n_head), a + "attention.value_length", 1, 4096);
    hp.n_ctx_train = checked(md.get_int_or(a + "context_length", 2048), a + "context_length", 1, 1 << 24);
    hp.n_rot = checked(md.get_int_or(a + "rope.dimension_count", hp.head_dim_k), a + "rope.dimension_count", 2, hp.head_dim_k);
    if (hp.n_rot % 2) fail("rope.dimension_count {} is odd", hp.n_rot);
    if (model->arch_->rope_dims_must_equal_head_dim && hp.n_rot != hp.head_dim_k)
      fail("rope.dimension_count {} must equal the head dimension {} for {}", hp.n_rot, hp.head_dim_k, arch);
    hp.rope_freq_base = (float)md.get_float_or(a + "rope.freq_base", 10000.0);
    if (!(hp.rope_freq_base > 0)) fail("rope.freq_base {} must be positive", hp.rope_freq_base);
    hp.rms_eps = (float)md.get_float_or(a + "attention.layer_norm_rms_epsilon", 1e-5);
    if (!(hp.rms_eps > 0)) fail("attention.layer_norm_rms_epsilon {} must be positive", hp.rms_eps);
    const std::string scaling = md.get_string_or(a + "rope.scaling.type", "none");
    double factor = md.get_float_or(a + "rope.scaling.factor", md.get_float_or(a + "rope.scale_linear", 0.0));
    if (scaling == "linear" || (scaling == "none" && md.contains(a + "rope.scale_linear"))) {
      if (factor > 0) hp.rope_freq_scale = (float)(1.0 / factor);
    } else if (scaling != "none") {
      fail("rope scaling '{}' is not supported (supported: none, linear, llama3 factors)", scaling);
    }
    hp.attn_scale = (float)md.get_float_or(a + "attention.scale", 0.0);
  } catch (const Error& e) {
    fail("{}: {}", name, e.what());
  }

  const HParams& hp = model->hparams_;
  std::map<std::string, const gguf::TensorInfo*, std::less<>> tensors;
  for (const auto& t : file->tensors()) tensors.emplace(t.name, &t);
  std::set<std::string, std::less<>> used;
  std::vector<std::string> problems;

  auto bind = [&](const std::string& tname, std::vector<int64_t> shape, bool required) -> Weight {
    auto it = tensors.find(tname);
    if (it == tensors.end()) {
      if (required) problems.push_back("missing " + tname);
      return {};
    }
    used.insert(tname);
    const gguf::TensorInfo* t = it->second;
    bool ok = t->n_dims <= (int)std::max<size_t>(shape.size(), 1);
    for (size_t i = 0; i < 4; ++i) ok = ok && t->ne[i] == (i < shape.size() ? shape[i] : 1);
    if (!ok) {
      std::string want = "[";
      for (size_t i = 0; i < shape.size(); ++i) want += (i ? ", " : "") + std::to_string(shape[i]);
      problems.push_back(fmt::format("{} has shape {}, expected {}]", tname, t->shape_string(), want));
    }
    if (!dtype_has_reference(t->type))
      problems.push_back(fmt::format("{} has type {}, which roofline does not support", tname, dtype_name(t->type)));
    return Weight{t};
  };

  const int64_t n_vocab = tensors.count("token_embd.weight") ? tensors.find("token_embd.weight")->second->ne[1] : 0;
  model->hparams_.n_vocab = (int)n_vocab;
  model->token_embd_ = bind("token_embd.weight", {hp.n_embd, n_vocab}, true);
  model->output_norm_ = bind("output_norm.weight", {hp.n_embd}, true);
  model->output_ = bind("output.weight", {hp.n_embd, n_vocab}, false);
  if (!model->output_) {
    model->output_ = model->token_embd_;
    model->tied_ = true;
  }
  model->rope_freqs_ = bind("rope_freqs.weight", {hp.n_rot / 2}, false);
  if (model->rope_freqs_ && model->rope_freqs_.type() != DType::F32) problems.push_back("rope_freqs.weight must be F32");

  const ArchInfo& arch = *model->arch_;
  model->layers_.resize(hp.n_layer);
  for (int il = 0; il < hp.n_layer; ++il) {
    const std::string p = "blk." + std::to_string(il) + ".";
    LayerWeights& L = model->layers_[il];
    L.attn_norm = bind(p + "attn_norm.weight", {hp.n_embd}, true);
    L.wq = bind(p + "attn_q.weight", {hp.n_embd, hp.q_dim()}, true);
    L.wk = bind(p + "attn_k.weight", {hp.n_embd, hp.kv_dim_k()}, true);
    L.wv = bind(p + "attn_v.weight", {hp.n_embd, hp.kv_dim_v()}, true);
    L.wo = bind(p + "attn_output.weight", {(int64_t)hp.n_head * hp.head_dim_v, hp.n_embd}, true);
    if (arch.qkv_bias_allowed) {
      L.bq = bind(p + "attn_q.bias", {hp.q_dim()}, false);
      L.bk = bind(p + "attn_k.bias", {hp.kv_dim_k()}, false);
      L.bv = bind(p + "attn_v.bias", {hp.kv_dim_v()}, false);
    }
    if (arch.qk_norm) {
      L.q_norm = bind(p + "attn_q_norm.weight", {hp.head_dim_k}, true);
      L.k_norm = bind(p + "attn_k_norm.weight", {hp.head_dim_k}, true);
    }
    L.ffn_norm = bind(p + "ffn_norm.weight", {hp.n_embd}, true);
    L.ffn_gate = bind(p + "ffn_gate.weight", {hp.n_embd, hp.n_ff}, true);
    L.ffn_up = bind(p + "ffn_up.weight", {hp.n_embd, hp.n_ff}, true);
    L.ffn_down = bind(p + "ffn_down.weight", {hp.n_ff, hp.n_embd}, true);
  }
  for (const auto& [tname, t] : tensors)
    if (!used.count(tname)) problems.push_back("unexpected tensor " + tname);
  if (!problems.empty()) {
    std::string list;
    const size_t shown = std::min<size_t>(problems.size(), 8);
    for (size_t i = 0; i < shown; ++i) list += (i ? "; " : "") + problems[i];
    if (problems.size() > shown) list += fmt::format("; and {} more", problems.size() - shown);
    fail("{}: not a valid {} model: {}", name, hp.arch, list);
  }
  return model;
}

uint64_t Model::layer_bytes(int i) const {
  const LayerWeights& L = layers_[i];
  uint64_t n = 0;
  for (const Weight* w : {&L.attn_norm, &L.wq, &L.wk, &L.wv, &L.wo, &L.bq, &L.bk, &L.bv, &L.q_norm, &L.k_norm,
                          &L.ffn_norm, &L.ffn_gate, &L.ffn_up, &L.ffn_down})
    if (*w) n += w->bytes();
  return n;
}

uint64_t Model::output_bytes() const { return output_norm_.bytes() + output_.bytes(); }

uint64_t Model::n_params() const {
  uint64_t n = 0;
  for (const auto& t : file_->tensors()) n += (uint64_t)t.n_elements();
  return n;
}

std::string Model::description() const {
  const double p = (double)n_params();
  std::string size = p >= 1e9 ? fmt::format("{:.1f}B", p / 1e9) : fmt::format("{:.0f}M", p / 1e6);
  const int64_t ft = metadata().get_int_or("general.file_type", -1);
  return fmt::format("{} {} {}", hparams_.arch, size, ft >= 0 ? file_type_description((uint32_t)ft) : "unknown type");
}

}  // namespace roofline
