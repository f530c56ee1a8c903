// Mixture-of-experts pieces of the Hugging Face converters (internal to src/convert): the expert
// hyperparameters of a Qwen3-MoE / Qwen3.5-MoE config.json, and one layer's experts stacked into
// llama.cpp's 3-D tensors ffn_{down,gate,up}_exps (GGUF ne {in, out, n_expert}) from either form
// transformers saves: one tensor per expert (mlp.experts.<e>.{gate,up,down}_proj.weight) or the fused
// transformers-5 tensors (mlp.experts.gate_up_proj [E, 2*ff, H], mlp.experts.down_proj [E, H, ff]).
#pragma once

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "convert/convert.h"
#include "convert/convert_hf_util.h"
#include "formats/gguf_metadata.h"
#include "formats/safetensors.h"

namespace roofline::convert {

struct MoeHparams {
  int64_t n_expert = 0;       // num_experts
  int64_t n_expert_used = 0;  // num_experts_per_tok
  int64_t n_ff_exp = 0;       // moe_intermediate_size
  int64_t n_ff_shexp = 0;     // shared_expert_intermediate_size (0: none)
  bool norm_topk_prob = true;
};
// Reads and checks the keys; `shared` requires shared_expert_intermediate_size. Rejects what roofline
// would run differently from transformers (dense layers between sparse ones, a router not softmax).
MoeHparams read_moe_hparams(const HfConfig& c, bool shared);

// expert_count and expert_used_count (TextModel.set_gguf_parameters, after the norm epsilons), and the
// expert lengths Qwen2MoeModel adds after general.file_type; expert_weights_norm only when
// norm_topk_prob is false (llama.cpp's qwen3moe / qwen35moe always renormalise and write no key).
void add_moe_counts(gguf::Metadata& md, const std::string& arch, const MoeHparams& m);
void add_moe_lengths(gguf::Metadata& md, const std::string& arch, const MoeHparams& m);

// Where one layer's stacked experts come from.
struct LayerExperts {
  std::vector<const safetensors::Tensor*> gate, up, down;  // per expert, or
  const safetensors::Tensor* gate_up = nullptr;             // fused
  const safetensors::Tensor* down_fused = nullptr;
  int64_t n_params() const;
};

// True for a tensor inside a layer's experts ("....mlp.experts.<...>").
bool is_expert_tensor(const std::string& name);

// Finds the layer's experts under `prefix` ("model.layers.3.mlp.experts."), through `find` (nullptr when
// absent); names bound go to `used`; missing, mixed or mis-shaped tensors to `problems`.
LayerExperts bind_layer_experts(const std::function<const safetensors::Tensor*(const std::string&)>& find,
                                const std::string& prefix, const MoeHparams& m, int64_t n_embd,
                                std::set<std::string>& used, std::vector<std::string>& problems);

// The layer's three stacked tensors in llama.cpp's order: ffn_down_exps, ffn_gate_exps, ffn_up_exps
// (`blk` is "blk.3.").
std::vector<PlannedTensor> plan_layer_experts(const LayerExperts& x, const std::string& blk, const MoeHparams& m,
                                              int64_t n_embd, DType outtype, ConvertResult& result);

}  // namespace roofline::convert
