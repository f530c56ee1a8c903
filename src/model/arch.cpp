// The rows of the architecture table, their tensor tables, and the hyperparameters every
// architecture shares (read with llama.cpp's defaults).
#include "model/arch.h"

#include <cmath>

#include "core/error.h"

namespace roofline {

const char* mixer_kind_name(MixerKind kind) {
  switch (kind) {
    case MixerKind::Attention: return "attention";
    case MixerKind::DeltaNet: return "Gated DeltaNet";
  }
  return "?";
}

int HParams::count_sliding_layers(int begin, int end) const {
  int n = 0;
  for (int il = begin; il < end && il < n_layer; ++il) n += is_sliding(il) ? 1 : 0;
  return n;
}

int HParams::count_layers(MixerKind kind, int begin, int end) const {
  int n = 0;
  for (int il = begin; il < end && il < (int)layer_mixer.size(); ++il) n += layer_mixer[(size_t)il] == kind ? 1 : 0;
  return n;
}

namespace {

using Shape = std::vector<int64_t>;
using LT = LayerTensor;
constexpr unsigned kAttn = mixer_bit(MixerKind::Attention);
constexpr unsigned kDelta = mixer_bit(MixerKind::DeltaNet);
constexpr unsigned kAll = kAttn | kDelta;
constexpr TensorUse kMat = TensorUse::Matrix;
constexpr TensorUse kVec = TensorUse::Floats;

Shape embd(const HParams& hp) { return {hp.n_embd}; }
Shape q_proj(const HParams& hp) { return {hp.n_embd, (int64_t)hp.q_dim() * (hp.attn_output_gate ? 2 : 1)}; }
Shape k_proj(const HParams& hp) { return {hp.n_embd, hp.kv_dim_k()}; }
Shape v_proj(const HParams& hp) { return {hp.n_embd, hp.kv_dim_v()}; }
Shape o_proj(const HParams& hp) { return {(int64_t)hp.n_head * hp.head_dim_v, hp.n_embd}; }
Shape q_bias(const HParams& hp) { return {hp.q_dim()}; }
Shape k_bias(const HParams& hp) { return {hp.kv_dim_k()}; }
Shape v_bias(const HParams& hp) { return {hp.kv_dim_v()}; }
Shape head_k(const HParams& hp) { return {hp.head_dim_k}; }
Shape ffn_in(const HParams& hp) { return {hp.n_embd, hp.n_ff}; }
Shape ffn_out(const HParams& hp) { return {hp.n_ff, hp.n_embd}; }
Shape router(const HParams& hp) { return {hp.n_embd, hp.n_expert}; }
Shape exps_in(const HParams& hp) { return {hp.n_embd, hp.n_ff_exp, hp.n_expert}; }
Shape exps_out(const HParams& hp) { return {hp.n_ff_exp, hp.n_embd, hp.n_expert}; }
Shape shexp_gate(const HParams& hp) { return {hp.n_embd, 1}; }  // llama.cpp's converter writes {n_embd, 1}
Shape shexp_in(const HParams& hp) { return {hp.n_embd, hp.n_ff_shexp}; }
Shape shexp_out(const HParams& hp) { return {hp.n_ff_shexp, hp.n_embd}; }
Shape ssm_qkv(const HParams& hp) { return {hp.n_embd, hp.delta_net.conv_dim()}; }
Shape ssm_gate(const HParams& hp) { return {hp.n_embd, hp.delta_net.value_dim()}; }
Shape ssm_conv(const HParams& hp) { return {hp.delta_net.conv_kernel, hp.delta_net.conv_dim()}; }
Shape ssm_heads(const HParams& hp) { return {hp.delta_net.n_v_heads}; }
Shape ssm_head_proj(const HParams& hp) { return {hp.n_embd, hp.delta_net.n_v_heads}; }
Shape ssm_norm(const HParams& hp) { return {hp.delta_net.head_v}; }
Shape ssm_out(const HParams& hp) { return {hp.delta_net.value_dim(), hp.n_embd}; }

// The llama-style block: norm, Q/K/V (+ optional biases), output, norm, SwiGLU FFN.
std::vector<TensorRule> llama_block(bool qk_norm, const char* ffn_norm_name = "ffn_norm.weight", unsigned attn = kAll) {
  std::vector<TensorRule> t = {
      {LT::AttnNorm, "attn_norm.weight", embd, true, kAll, kVec},
      {LT::AttnQ, "attn_q.weight", q_proj, true, attn, kMat},
      {LT::AttnK, "attn_k.weight", k_proj, true, attn, kMat},
      {LT::AttnV, "attn_v.weight", v_proj, true, attn, kMat},
      {LT::AttnOut, "attn_output.weight", o_proj, true, attn, kMat},
  };
  if (qk_norm) {
    t.push_back({LT::AttnQNorm, "attn_q_norm.weight", head_k, true, attn, kVec});
    t.push_back({LT::AttnKNorm, "attn_k_norm.weight", head_k, true, attn, kVec});
  } else {
    t.push_back({LT::AttnQBias, "attn_q.bias", q_bias, false, attn, kVec});
    t.push_back({LT::AttnKBias, "attn_k.bias", k_bias, false, attn, kVec});
    t.push_back({LT::AttnVBias, "attn_v.bias", v_bias, false, attn, kVec});
  }
  t.push_back({LT::FfnNorm, ffn_norm_name, embd, true, kAll, kVec});
  t.push_back({LT::FfnGate, "ffn_gate.weight", ffn_in, true, kAll, kMat});
  t.push_back({LT::FfnUp, "ffn_up.weight", ffn_in, true, kAll, kMat});
  t.push_back({LT::FfnDown, "ffn_down.weight", ffn_out, true, kAll, kMat});
  return t;
}

// Qwen3.5: gated attention layers (Q projection with a gate per head, q/k norms) and Gated DeltaNet
// layers; the FFN's input norm is named post_attention_norm.
std::vector<TensorRule> qwen35_block() {
  std::vector<TensorRule> t = llama_block(true, "post_attention_norm.weight", kAttn);
  const std::vector<TensorRule> delta = {
      {LT::SsmQkv, "attn_qkv.weight", ssm_qkv, true, kDelta, kMat},
      {LT::SsmGate, "attn_gate.weight", ssm_gate, true, kDelta, kMat},
      {LT::SsmConv, "ssm_conv1d.weight", ssm_conv, true, kDelta, kVec},
      {LT::SsmDtBias, "ssm_dt.bias", ssm_heads, true, kDelta, kVec},
      {LT::SsmA, "ssm_a", ssm_heads, true, kDelta, kVec},
      {LT::SsmBeta, "ssm_beta.weight", ssm_head_proj, true, kDelta, kMat},
      {LT::SsmAlpha, "ssm_alpha.weight", ssm_head_proj, true, kDelta, kMat},
      {LT::SsmNorm, "ssm_norm.weight", ssm_norm, true, kDelta, kVec},
      {LT::SsmOut, "ssm_out.weight", ssm_out, true, kDelta, kMat},
  };
  t.insert(t.begin() + 7, delta.begin(), delta.end());  // after the attention tensors, before the FFN's
  return t;
}

// The dense FFN replaced by a mixture of experts: router and stacked experts, and with a shared
// expert (qwen35moe) its gate and SwiGLU.
std::vector<TensorRule> moe_ffn(std::vector<TensorRule> t, bool shared_expert) {
  std::erase_if(t, [](const TensorRule& r) { return r.role == LT::FfnGate || r.role == LT::FfnUp || r.role == LT::FfnDown; });
  t.push_back({LT::FfnGateInp, "ffn_gate_inp.weight", router, true, kAll, kMat});
  t.push_back({LT::FfnGateExps, "ffn_gate_exps.weight", exps_in, true, kAll, kMat});
  t.push_back({LT::FfnUpExps, "ffn_up_exps.weight", exps_in, true, kAll, kMat});
  t.push_back({LT::FfnDownExps, "ffn_down_exps.weight", exps_out, true, kAll, kMat});
  if (shared_expert) {
    t.push_back({LT::FfnGateInpShexp, "ffn_gate_inp_shexp.weight", shexp_gate, true, kAll, kVec});
    t.push_back({LT::FfnGateShexp, "ffn_gate_shexp.weight", shexp_in, true, kAll, kMat});
    t.push_back({LT::FfnUpShexp, "ffn_up_shexp.weight", shexp_in, true, kAll, kMat});
    t.push_back({LT::FfnDownShexp, "ffn_down_shexp.weight", shexp_out, true, kAll, kMat});
  }
  return t;
}

// Gemma 3: the llama block with q/k norms and norms of the attention's and the FFN's outputs
// (post_attention_norm, post_ffw_norm); the FFN's input norm keeps the name ffn_norm.
std::vector<TensorRule> gemma3_block() {
  std::vector<TensorRule> t = llama_block(true);
  t.insert(t.begin() + 7, {LT::AttnPostNorm, "post_attention_norm.weight", embd, true, kAttn, kVec});
  t.push_back({LT::FfnPostNorm, "post_ffw_norm.weight", embd, true, kAll, kVec});
  return t;
}

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

// Which layers are Gated DeltaNet layers in a hybrid model: attention.recurrent_layers when given,
// else every layer but each full_attention_interval-th (llama.cpp's rule).
void read_layer_kinds(const gguf::Metadata& md, const std::string& a, int n_layer_all, HParams& hp) {
  hp.layer_mixer.assign((size_t)hp.n_layer, MixerKind::Attention);
  if (const gguf::Value* v = md.find(a + "attention.recurrent_layers")) {
    if (!v->is_array()) fail("metadata key '{}attention.recurrent_layers' must be an array", a);
    const auto flags = v->as_int_array(a + "attention.recurrent_layers");
    if ((int)flags.size() != n_layer_all && (int)flags.size() != hp.n_layer)
      fail("metadata key '{}attention.recurrent_layers' has {} values for {} layers", a, flags.size(), n_layer_all);
    for (int il = 0; il < hp.n_layer; ++il) hp.layer_mixer[(size_t)il] = flags[(size_t)il] ? MixerKind::DeltaNet : MixerKind::Attention;
    return;
  }
  const int interval = checked(md.get_int_or(a + "full_attention_interval", 4), a + "full_attention_interval", 1, 4096);
  for (int il = 0; il < hp.n_layer; ++il)
    hp.layer_mixer[(size_t)il] = (il + 1) % interval != 0 ? MixerKind::DeltaNet : MixerKind::Attention;
}

// Expert counts and sizes (llama.cpp's keys and defaults: n_ff_exp = n_ff / n_expert_used, the
// shared expert's n_ff_shexp = n_ff).
void read_experts(const gguf::Metadata& md, const std::string& a, const ArchInfo& arch, HParams& hp) {
  hp.n_expert = checked(uniform_int(md, a + "expert_count", 0, true), a + "expert_count", 1, 1 << 16);
  hp.n_expert_used = checked(uniform_int(md, a + "expert_used_count", 0, true), a + "expert_used_count", 1, hp.n_expert);
  const int64_t ff_exp = uniform_int(md, a + "expert_feed_forward_length", hp.n_ff / hp.n_expert_used, false);
  hp.n_ff_exp = checked(ff_exp, a + "expert_feed_forward_length", 1, 1 << 20);
  if (arch.has(LayerTensor::FfnGateShexp)) {
    const int64_t ff_shexp = uniform_int(md, a + "expert_shared_feed_forward_length", hp.n_ff, false);
    hp.n_ff_shexp = checked(ff_shexp, a + "expert_shared_feed_forward_length", 1, 1 << 20);
  }
  hp.expert_weights_norm = md.get_bool_or(a + "expert_weights_norm", true);
  const double scale = md.get_float_or(a + "expert_weights_scale", 0.0);
  hp.expert_weights_scale = scale != 0.0 ? (float)scale : 1.0f;  // llama.cpp: 0 (absent) means no scaling
  if (!std::isfinite(hp.expert_weights_scale)) fail("{}expert_weights_scale is not finite", a);
}

void read_delta_net(const gguf::Metadata& md, const std::string& a, HParams& hp) {
  DeltaNetDims& d = hp.delta_net;
  d.conv_kernel = checked(uniform_int(md, a + "ssm.conv_kernel", 0, true), a + "ssm.conv_kernel", 1, 64);
  d.head_k = checked(uniform_int(md, a + "ssm.state_size", 0, true), a + "ssm.state_size", 1, 1024);
  d.n_k_heads = checked(uniform_int(md, a + "ssm.group_count", 0, true), a + "ssm.group_count", 1, 4096);
  d.n_v_heads = checked(uniform_int(md, a + "ssm.time_step_rank", 0, true), a + "ssm.time_step_rank", 1, 4096);
  const int inner = checked(uniform_int(md, a + "ssm.inner_size", 0, true), a + "ssm.inner_size", 1, 1 << 20);
  if (inner % d.n_v_heads) fail("{}ssm.inner_size {} is not a multiple of ssm.time_step_rank {}", a, inner, d.n_v_heads);
  d.head_v = inner / d.n_v_heads;
  if (d.n_v_heads % d.n_k_heads)
    fail("{}ssm.time_step_rank {} (value heads) is not a multiple of ssm.group_count {} (key heads)", a, d.n_v_heads, d.n_k_heads);
}

// gemma3 as llama.cpp reads it: with attention.sliding_window > 0, layer il is a sliding layer unless
// il % P == P - 1 (P = attention.sliding_window_pattern, default 6; P = 0: every layer slides; an
// array gives the flag per layer); sliding layers rotate with rope.freq_base_swa (default 1e4) and no
// scaling. The attention scale is not read from the file: 1/sqrt(n_embd / n_head) for the 62-layer
// (27B) model, 1/sqrt(head_dim) otherwise, as llama.cpp derives it. Embeddings are scaled by sqrt(n_embd).
void read_gemma3(const gguf::Metadata& md, const std::string& a, HParams& hp) {
  hp.embd_scale = std::sqrt((float)hp.n_embd);
  hp.attn_scale = hp.n_layer + hp.n_layer_nextn == 62 ? 1.0f / std::sqrt((float)(hp.n_embd / hp.n_head))
                                                      : 1.0f / std::sqrt((float)hp.head_dim_k);
  hp.final_logit_softcap = (float)md.get_float_or(a + "final_logit_softcapping", 0.0);
  if (hp.final_logit_softcap < 0) fail("{}final_logit_softcapping {} must not be negative", a, hp.final_logit_softcap);
  hp.sliding_window = checked(md.get_int_or(a + "attention.sliding_window", 0), a + "attention.sliding_window", 0, 1 << 24);
  if (hp.sliding_window == 0) return;
  hp.layer_sliding.assign((size_t)hp.n_layer, 0);
  const std::string pattern_key = a + "attention.sliding_window_pattern";
  const gguf::Value* pattern = md.find(pattern_key);
  if (pattern && pattern->is_array()) {
    const auto flags = pattern->as_int_array(pattern_key);
    if ((int)flags.size() < hp.n_layer) fail("metadata key '{}' has {} values for {} layers", pattern_key, flags.size(), hp.n_layer);
    for (int il = 0; il < hp.n_layer; ++il) hp.layer_sliding[(size_t)il] = flags[(size_t)il] ? 1 : 0;
  } else {
    const int period = checked(pattern ? pattern->as_int(pattern_key) : 6, pattern_key, 0, 4096);
    for (int il = 0; il < hp.n_layer; ++il) hp.layer_sliding[(size_t)il] = period == 0 || il % period < period - 1 ? 1 : 0;
  }
  hp.rope_freq_base_swa = (float)md.get_float_or(a + "rope.freq_base_swa", 10000.0);
  if (!(hp.rope_freq_base_swa > 0)) fail("{}rope.freq_base_swa {} must be positive", a, hp.rope_freq_base_swa);
  hp.rope_freq_scale_swa = 1.0f;
}

}  // namespace

const std::vector<ArchInfo>& supported_archs() {
  static const std::vector<ArchInfo> archs = {
      {"llama", RopeStyle::Norm, true, false, false, false, llama_block(false)},
      {"qwen2", RopeStyle::Neox, false, false, false, false, llama_block(false)},
      {"qwen3", RopeStyle::Neox, false, false, false, false, llama_block(true)},
      {"qwen35", RopeStyle::Neox, false, true, true, false, qwen35_block()},
      {"qwen3moe", RopeStyle::Neox, false, false, false, true, moe_ffn(llama_block(true), false)},
      {"qwen35moe", RopeStyle::Neox, false, true, true, true, moe_ffn(qwen35_block(), true)},
      {"gemma3", RopeStyle::Neox, false, false, false, false, gemma3_block(), FfnKind::GeGLU, true},
  };
  return archs;
}

const TensorRule* ArchInfo::rule(LayerTensor role) const {
  for (const TensorRule& r : layer_tensors)
    if (r.role == role) return &r;
  return nullptr;
}

const ArchInfo* find_arch(std::string_view name) {
  for (const ArchInfo& a : supported_archs())
    if (a.name == name) return &a;
  return nullptr;
}

std::string supported_arch_names() {
  std::string s;
  for (const ArchInfo& a : supported_archs()) s += (s.empty() ? "" : ", ") + a.name;
  return s;
}

HParams read_hparams(const gguf::Metadata& md, const ArchInfo& arch) {
  HParams hp;
  hp.arch = arch.name;
  const std::string a = arch.name + ".";
  hp.n_embd = checked(uniform_int(md, a + "embedding_length", 0, true), a + "embedding_length", 1, 1 << 17);
  const int n_layer_all = checked(uniform_int(md, a + "block_count", 0, true), a + "block_count", 1, 4096);
  hp.n_layer_nextn = checked(md.get_int_or(a + "nextn_predict_layers", 0), a + "nextn_predict_layers", 0, n_layer_all - 1);
  hp.n_layer = n_layer_all - hp.n_layer_nextn;
  // A mixture of experts may leave the dense size out (its experts have their own keys).
  hp.n_ff = checked(uniform_int(md, a + "feed_forward_length", 0, !arch.moe), a + "feed_forward_length", arch.moe ? 0 : 1, 1 << 20);
  hp.n_head = checked(uniform_int(md, a + "attention.head_count", 0, true), a + "attention.head_count", 1, 4096);
  hp.n_head_kv = checked(uniform_int(md, a + "attention.head_count_kv", hp.n_head, false), a + "attention.head_count_kv", 1, hp.n_head);
  if (hp.n_head % hp.n_head_kv != 0)
    fail("attention.head_count {} is not a multiple of head_count_kv {}", hp.n_head, hp.n_head_kv);
  hp.head_dim_k = checked(md.get_int_or(a + "attention.key_length", hp.n_embd / hp.n_head), a + "attention.key_length", 2, 4096);
  hp.head_dim_v = checked(md.get_int_or(a + "attention.value_length", hp.n_embd / hp.n_head), a + "attention.value_length", 1, 4096);
  hp.n_ctx_train = checked(md.get_int_or(a + "context_length", 2048), a + "context_length", 1, 1 << 24);
  hp.n_rot = checked(md.get_int_or(a + "rope.dimension_count", hp.head_dim_k), a + "rope.dimension_count", 2, hp.head_dim_k);
  if (hp.n_rot % 2) fail("rope.dimension_count {} is odd", hp.n_rot);
  if (arch.rope_dims_must_equal_head_dim && hp.n_rot != hp.head_dim_k)
    fail("rope.dimension_count {} must equal the head dimension {} for {}", hp.n_rot, hp.head_dim_k, arch.name);
  hp.rope_freq_base = (float)md.get_float_or(a + "rope.freq_base", 10000.0);
  if (!(hp.rope_freq_base > 0)) fail("rope.freq_base {} must be positive", hp.rope_freq_base);
  hp.rms_eps = (float)md.get_float_or(a + "attention.layer_norm_rms_epsilon", 1e-5);
  if (!(hp.rms_eps > 0)) fail("attention.layer_norm_rms_epsilon {} must be positive", hp.rms_eps);
  const std::string scaling = md.get_string_or(a + "rope.scaling.type", "none");
  const double factor = md.get_float_or(a + "rope.scaling.factor", md.get_float_or(a + "rope.scale_linear", 0.0));
  if (scaling == "linear" || (scaling == "none" && md.contains(a + "rope.scale_linear"))) {
    if (factor > 0) hp.rope_freq_scale = (float)(1.0 / factor);
  } else if (scaling != "none") {
    fail("rope scaling '{}' is not supported (supported: none, linear, llama3 factors)", scaling);
  }
  hp.attn_scale = (float)md.get_float_or(a + "attention.scale", 0.0);
  hp.attn_output_gate = arch.attn_output_gate;
  if (hp.attn_output_gate && hp.head_dim_k != hp.head_dim_v)
    fail("attention.key_length {} and value_length {} must be equal for gated attention", hp.head_dim_k, hp.head_dim_v);
  if (arch.moe) read_experts(md, a, arch, hp);
  if (arch.hybrid) {
    read_layer_kinds(md, a, n_layer_all, hp);
    if (hp.count_layers(MixerKind::DeltaNet) > 0) read_delta_net(md, a, hp);
  } else {
    hp.layer_mixer.assign((size_t)hp.n_layer, MixerKind::Attention);
  }
  if (arch.gemma) read_gemma3(md, a, hp);
  return hp;
}

std::vector<PlannedTensor> layer_tensor_plan(const ArchInfo& arch, const HParams& hp, int il) {
  std::vector<PlannedTensor> out;
  const unsigned bit = mixer_bit(hp.mixer(il));
  const std::string prefix = "blk." + std::to_string(il) + ".";
  for (const TensorRule& r : arch.layer_tensors)
    if (r.mixers & bit) out.push_back({&r, prefix + r.name, r.shape(hp)});
  return out;
}

}  // namespace roofline
