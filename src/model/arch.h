// The architecture table: one row per GGUF general.architecture roofline runs, with the flags the
// forward pass branches on and the table of tensors a layer holds (name, shape from the
// hyperparameters, required or optional, which layer kinds have it, how backends read it). That one
// table drives model loading, synthetic models, conversion checks, memory plans and backend uploads.
// Adding a family is a row here (plus a converter mapping); only a structurally different block
// needs code of its own (docs/architecture.md, "Adding an architecture").
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "formats/gguf_metadata.h"
#include "model/hparams.h"

namespace roofline {

enum class RopeStyle {
  Norm,  // rotate adjacent pairs (2i, 2i+1): llama (Q/K permuted at conversion)
  Neox,  // rotate pairs (i, i + n_rot/2): qwen2, qwen3, qwen35, gemma
};

// Every tensor a layer can hold, by what it is for. GGUF names come from the arch's table.
enum class LayerTensor : uint8_t {
  AttnNorm,  // the mixer's input norm
  AttnQ, AttnK, AttnV, AttnOut, AttnQBias, AttnKBias, AttnVBias, AttnQNorm, AttnKNorm,
  FfnNorm,   // the FFN's input norm (qwen35 calls it post_attention_norm)
  FfnGate, FfnUp, FfnDown,
  // Mixture of experts: the router, the stacked experts (GGUF ne {in, out, n_expert}), the shared
  // expert and its gate (one value per token).
  FfnGateInp, FfnGateExps, FfnUpExps, FfnDownExps, FfnGateInpShexp, FfnGateShexp, FfnUpShexp, FfnDownShexp,
  SsmQkv, SsmGate, SsmConv, SsmDtBias, SsmA, SsmAlpha, SsmBeta, SsmNorm, SsmOut,  // DeltaNet
  AttnPostNorm, FfnPostNorm,  // gemma: norms of the mixer's and the FFN's outputs, before the residual add
  Count
};
constexpr size_t kLayerTensorCount = (size_t)LayerTensor::Count;
constexpr bool is_stacked_experts(LayerTensor t) {
  return t == LayerTensor::FfnGateExps || t == LayerTensor::FfnUpExps || t == LayerTensor::FfnDownExps;
}

// The gated FFN's activation: down(act(gate(x)) * up(x)).
enum class FfnKind : uint8_t {
  SwiGLU,  // act = silu
  GeGLU,   // act = gelu, tanh approximation (gemma)
};

// How a backend reads a tensor: a matrix product's weight (kept in its type, repacked as the
// backend likes), or small values it reads as f32 (norms, biases, the conv taps, decays).
enum class TensorUse : uint8_t { Matrix, Floats };

// A shape in GGUF order (ne[0] = row length) computed from the hyperparameters.
using ShapeFn = std::vector<int64_t> (*)(const HParams& hp);

struct TensorRule {
  LayerTensor role;
  const char* name;     // after "blk.N.": "attn_q.weight"
  ShapeFn shape;
  bool required;
  unsigned mixers;      // bit (1 << MixerKind) per layer kind that holds it
  TensorUse use;
};
constexpr unsigned mixer_bit(MixerKind k) { return 1u << (unsigned)k; }

struct ArchInfo {
  std::string name;        // general.architecture
  RopeStyle rope_style;
  bool rope_dims_must_equal_head_dim;
  bool attn_output_gate;   // qwen35: the Q projection carries a gate per head
  bool hybrid;             // layer kinds from full_attention_interval / attention.recurrent_layers (qwen35)
  bool moe;                // the FFN is a mixture of experts (expert_count, expert_used_count, ...)
  std::vector<TensorRule> layer_tensors;
  FfnKind ffn = FfnKind::SwiGLU;
  // gemma3: embeddings scaled by sqrt(n_embd), sliding-window layers (attention.sliding_window,
  // every sliding_window_pattern-th layer global), attention scale derived from the shape as llama.cpp does.
  bool gemma = false;

  // The table's rule for a role (nullptr when no layer of this arch holds it).
  const TensorRule* rule(LayerTensor role) const;
  bool has(LayerTensor role) const { return rule(role) != nullptr; }
};

const std::vector<ArchInfo>& supported_archs();
// nullptr when the architecture is not supported.
const ArchInfo* find_arch(std::string_view name);
std::string supported_arch_names();  // "llama, qwen2, qwen3, qwen35, gemma3"

// Hyperparameters from metadata with llama.cpp's defaults; throws Error naming the key on a missing
// or out-of-range value. n_vocab is left 0 (it comes from the token embedding's shape).
HParams read_hparams(const gguf::Metadata& md, const ArchInfo& arch);

// The tensors layer il holds, in table order, with their GGUF names ("blk.7.attn_q.weight") and shapes.
struct PlannedTensor {
  const TensorRule* rule;
  std::string name;
  std::vector<int64_t> shape;
};
std::vector<PlannedTensor> layer_tensor_plan(const ArchInfo& arch, const HParams& hp, int il);

}  // namespace roofline
