// The architecture table: one row per GGUF general.architecture roofline runs, with the structural
// flags the forward pass branches on. Adding a family is a row here (plus a converter mapping), and
// only a structurally different block needs code of its own.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace roofline {

enum class RopeStyle {
  Norm,  // rotate adjacent pairs (2i, 2i+1): llama (Q/K permuted at conversion)
  Neox,  // rotate pairs (i, i + n_rot/2): qwen2, qwen3, gemma
};

struct ArchInfo {
  std::string name;        // general.architecture
  RopeStyle rope_style;
  bool qkv_bias_allowed;   // attn_{q,k,v}.bias may be present (qwen2; optional for llama)
  bool qk_norm;            // per-head RMSNorm of Q and K before RoPE (qwen3)
  bool rope_dims_must_equal_head_dim;
};

const std::vector<ArchInfo>& supported_archs();
// nullptr when the architecture is not supported.
const ArchInfo* find_arch(std::string_view name);
std::string supported_arch_names();  // "llama, qwen2, qwen3"

}  // namespace roofline
