// Expert hyperparameters, metadata keys and stacked expert tensors for the MoE converters (convert_moe.h),
// as llama.cpp's conversion/qwen.py Qwen2MoeModel writes them.
#include "convert/convert_moe.h"

#include <memory>

#include "core/error.h"

namespace roofline::convert {

MoeHparams read_moe_hparams(const HfConfig& c, bool shared) {
  MoeHparams m;
  // The first key llama.cpp's TextModel finds (transformers 5 saves qwen3_moe's as num_local_experts).
  auto first = [&](std::initializer_list<const char*> keys) -> int64_t {
    for (const char* k : keys)
      if (c.has(k)) return c.integer(k);
    std::string list;
    for (const char* k : keys) list += (list.empty() ? "" : ", ") + std::string(k);
    fail("{}: none of {} is given", c.where, list);
  };
  m.n_expert = first({"num_local_experts", "num_experts", "n_routed_experts"});
  m.n_expert_used = first({"num_experts_per_tok", "num_experts_per_token", "top_k_experts"});
  m.n_ff_exp = c.integer("moe_intermediate_size");
  if (shared) m.n_ff_shexp = c.integer("shared_expert_intermediate_size");
  m.norm_topk_prob = c.boolean_or("norm_topk_prob", true);
  if (m.n_expert_used > m.n_expert)
    fail("{}: num_experts_per_tok {} is more than num_experts {}", c.where, m.n_expert_used, m.n_expert);
  if (c.integer_or("decoder_sparse_step", 1) != 1)
    fail("{}: decoder_sparse_step {} (dense layers between MoE layers) is not supported", c.where, c.integer("decoder_sparse_step"));
  if (c.has("mlp_only_layers") && !(c.j["mlp_only_layers"].is_array() && c.j["mlp_only_layers"].empty()))
    fail("{}: mlp_only_layers {} (dense layers in a MoE model) is not supported", c.where, c.j["mlp_only_layers"].dump());
  for (const char* key : {"scoring_func", "score_function", "moe_router_activation"})
    if (c.has(key) && c.j[key] != "softmax")
      fail("{}: {} {} is not supported (only softmax routing)", c.where, key, c.j[key].dump());
  return m;
}

void add_moe_counts(gguf::Metadata& md, const std::string& a, const MoeHparams& m) {
  md.set(a + ".expert_count", gguf::Value::u32((uint32_t)m.n_expert));
  md.set(a + ".expert_used_count", gguf::Value::u32((uint32_t)m.n_expert_used));
}

void add_moe_lengths(gguf::Metadata& md, const std::string& a, const MoeHparams& m) {
  md.set(a + ".expert_feed_forward_length", gguf::Value::u32((uint32_t)m.n_ff_exp));
  if (m.n_ff_shexp > 0) md.set(a + ".expert_shared_feed_forward_length", gguf::Value::u32((uint32_t)m.n_ff_shexp));
  if (!m.norm_topk_prob) md.set(a + ".expert_weights_norm", gguf::Value::boolean(false));
}

int64_t LayerExperts::n_params() const {
  int64_t n = 0;
  for (const auto* list : {&gate, &up, &down})
    for (const safetensors::Tensor* t : *list) n += t->n_elements();
  if (gate_up) n += gate_up->n_elements();
  if (down_fused) n += down_fused->n_elements();
  return n;
}

bool is_expert_tensor(const std::string& name) { return name.find(".mlp.experts.") != std::string::npos; }

LayerExperts bind_layer_experts(const std::function<const safetensors::Tensor*(const std::string&)>& find,
                                const std::string& prefix, const MoeHparams& m, int64_t n_embd,
                                std::set<std::string>& used, std::vector<std::string>& problems) {
  LayerExperts x;
  const int64_t E = m.n_expert, F = m.n_ff_exp, H = n_embd;
  auto take = [&](const std::string& base) -> const safetensors::Tensor* {
    for (const std::string& n : {base, base + ".weight"})
      if (const safetensors::Tensor* t = find(n)) {
        used.insert(n);
        return t;
      }
    return nullptr;
  };
  auto check = [&](const safetensors::Tensor* t, const std::vector<int64_t>& want) {
    if (t->shape != want)
      problems.push_back(fmt::format("{} has shape {}, expected {}", t->name, t->shape_string(), shape_string(want)));
  };
  x.gate_up = take(prefix + "gate_up_proj");
  x.down_fused = take(prefix + "down_proj");
  if (x.gate_up || x.down_fused) {  // transformers 5's fused experts
    if (!x.gate_up) problems.push_back("missing " + prefix + "gate_up_proj (the experts' down_proj is fused)");
    if (!x.down_fused) problems.push_back("missing " + prefix + "down_proj (the experts' gate_up_proj is fused)");
    if (x.gate_up) check(x.gate_up, {E, 2 * F, H});
    if (x.down_fused) check(x.down_fused, {E, H, F});
    if (find(prefix + "0.gate_proj.weight")) problems.push_back(prefix + "*: both fused and per-expert tensors are present");
    return x;
  }
  int64_t missing = 0;
  std::string first_missing;
  for (int64_t e = 0; e < E; ++e) {
    const std::string p = prefix + std::to_string(e) + ".";
    const std::pair<const char*, std::vector<const safetensors::Tensor*>*> parts[] = {
        {"gate_proj", &x.gate}, {"up_proj", &x.up}, {"down_proj", &x.down}};
    for (const auto& [part, list] : parts) {
      const safetensors::Tensor* t = take(p + part);
      if (!t) {
        if (missing++ == 0) first_missing = p + part + ".weight";
        continue;
      }
      check(t, std::string(part) == "down_proj" ? std::vector<int64_t>{H, F} : std::vector<int64_t>{F, H});
      list->push_back(t);
    }
  }
  if (missing == 1) problems.push_back("missing " + first_missing);
  else if (missing > 1) problems.push_back(fmt::format("missing {} and {} more expert tensors", first_missing, missing - 1));
  return x;
}

std::vector<PlannedTensor> plan_layer_experts(const LayerExperts& x, const std::string& blk, const MoeHparams& m,
                                              int64_t n_embd, DType outtype, ConvertResult& result) {
  const int64_t E = m.n_expert, F = m.n_ff_exp, H = n_embd;
  // GGUF row r of a stacked tensor with `per` rows per expert: expert r / per, row r % per of it.
  using Source = std::function<void(int64_t e, int64_t j, float* dst)>;
  auto stacked = [&](const char* name, int64_t row, int64_t per, Source src) {
    const std::string gguf_name = blk + name;
    std::string note;
    const DType type = tensor_type_for(gguf_name, 3, row, outtype, &note);
    if (!note.empty()) result.notes.push_back(note);
    auto fill = [row, per, src](float* dst, int64_t r0, int64_t nr) {
      for (int64_t r = r0; r < r0 + nr; ++r) src(r / per, r % per, dst + (r - r0) * row);
    };
    return PlannedTensor{gguf_name, {row, per, E}, type, fill};
  };
  std::vector<PlannedTensor> out;
  if (x.gate_up) {
    const safetensors::Tensor* gu = x.gate_up;
    const safetensors::Tensor* dn = x.down_fused;
    out.push_back(stacked("ffn_down_exps.weight", F, H, [dn, F, H](int64_t e, int64_t j, float* dst) {
      safetensors::tensor_to_f32(*dn, (e * H + j) * F, F, dst);
    }));
    out.push_back(stacked("ffn_gate_exps.weight", H, F, [gu, F, H](int64_t e, int64_t j, float* dst) {
      safetensors::tensor_to_f32(*gu, (e * 2 * F + j) * H, H, dst);
    }));
    out.push_back(stacked("ffn_up_exps.weight", H, F, [gu, F, H](int64_t e, int64_t j, float* dst) {
      safetensors::tensor_to_f32(*gu, (e * 2 * F + F + j) * H, H, dst);
    }));
  } else {
    auto per_expert = [](std::vector<const safetensors::Tensor*> list, int64_t row) {
      return [list, row](int64_t e, int64_t j, float* dst) { safetensors::tensor_to_f32(*list[(size_t)e], j * row, row, dst); };
    };
    out.push_back(stacked("ffn_down_exps.weight", F, H, per_expert(x.down, F)));
    out.push_back(stacked("ffn_gate_exps.weight", H, F, per_expert(x.gate, H)));
    out.push_back(stacked("ffn_up_exps.weight", H, F, per_expert(x.up, H)));
  }
  return out;
}

}  // namespace roofline::convert
