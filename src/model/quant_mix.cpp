// The mix rules of llama.cpp's llama-quantize (llama_tensor_get_type), restated as a table plus the
// few per-category rules, for the mixes roofline produces.
#include "model/quant_mix.h"

#include <cctype>
#include <cstdio>

#include "core/error.h"

namespace roofline {

const std::vector<QuantMix>& quant_mixes() {
  static const std::vector<QuantMix> mixes = {
      {FileType::ALL_F32, "F32", DType::F32, "all F32"},
      {FileType::MOSTLY_F16, "F16", DType::F16, "F16"},
      {FileType::MOSTLY_BF16, "BF16", DType::BF16, "BF16"},
      {FileType::MOSTLY_Q8_0, "Q8_0", DType::Q8_0, "Q8_0"},
      {FileType::MOSTLY_Q6_K, "Q6_K", DType::Q6_K, "Q6_K"},
      {FileType::MOSTLY_Q5_K_M, "Q5_K_M", DType::Q5_K, "Q5_K - Medium"},
      {FileType::MOSTLY_Q5_K_S, "Q5_K_S", DType::Q5_K, "Q5_K - Small"},
      {FileType::MOSTLY_Q4_K_M, "Q4_K_M", DType::Q4_K, "Q4_K - Medium"},
      {FileType::MOSTLY_Q4_K_S, "Q4_K_S", DType::Q4_K, "Q4_K - Small"},
      {FileType::MOSTLY_Q3_K_L, "Q3_K_L", DType::Q3_K, "Q3_K - Large"},
      {FileType::MOSTLY_Q3_K_M, "Q3_K_M", DType::Q3_K, "Q3_K - Medium"},
      {FileType::MOSTLY_Q3_K_S, "Q3_K_S", DType::Q3_K, "Q3_K - Small"},
      {FileType::MOSTLY_Q2_K, "Q2_K", DType::Q2_K, "Q2_K - Medium"},
      {FileType::MOSTLY_Q4_0, "Q4_0", DType::Q4_0, "Q4_0"},
      {FileType::MOSTLY_Q4_1, "Q4_1", DType::Q4_1, "Q4_1"},
      {FileType::MOSTLY_Q5_0, "Q5_0", DType::Q5_0, "Q5_0"},
      {FileType::MOSTLY_Q5_1, "Q5_1", DType::Q5_1, "Q5_1"},
      {FileType::MOSTLY_IQ4_NL, "IQ4_NL", DType::IQ4_NL, "IQ4_NL - 4.5 bpw"},
      {FileType::MOSTLY_IQ4_XS, "IQ4_XS", DType::IQ4_XS, "IQ4_XS - 4.25 bpw"},
  };
  return mixes;
}

static bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::toupper((unsigned char)a[i]) != std::toupper((unsigned char)b[i])) return false;
  return true;
}

const QuantMix* find_mix(std::string_view name) {
  if (iequals(name, "Q4_K")) name = "Q4_K_M";
  else if (iequals(name, "Q5_K")) name = "Q5_K_M";
  else if (iequals(name, "Q3_K")) name = "Q3_K_M";
  for (const QuantMix& m : quant_mixes())
    if (iequals(m.name, name)) return &m;
  return nullptr;
}

const QuantMix* find_mix(FileType file_type) {
  for (const QuantMix& m : quant_mixes())
    if (m.file_type == file_type) return &m;
  return nullptr;
}

std::string file_type_description(uint32_t file_type) {
  const QuantMix* m = find_mix((FileType)file_type);
  return m ? m->description : "unknown";
}

static bool contains(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }
static bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

bool tensor_allows_quantization(std::string_view name, int n_dims) {
  if (n_dims < 2) return false;
  if (!ends_with(name, "weight")) return false;
  if (contains(name, "_norm.weight")) return false;
  if (contains(name, "ffn_gate_inp.weight")) return false;  // MoE router
  if (contains(name, "ssm_conv1d")) return false;
  if (contains(name, "position_embd") || contains(name, "pos_embd")) return false;
  if (contains(name, "token_types")) return false;
  if (contains(name, "ssm_a") && !contains(name, "ssm_alpha")) return false;
  if (contains(name, "ssm_dt") || contains(name, "time_mix_") || contains(name, "per_layer_model_proj")) return false;
  return true;
}

static bool is_attn_v_like(std::string_view name) {
  return contains(name, "attn_v.weight") || contains(name, "attn_qkv.weight") || contains(name, "attn_kv_b.weight");
}

MixModelInfo mix_model_info(const std::string& arch, int n_layer, int n_head, int n_head_kv, int n_expert,
                            const std::vector<std::string>& tensor_names) {
  MixModelInfo info;
  info.arch = arch;
  info.n_layer = n_layer;
  info.n_head = n_head;
  info.n_head_kv = n_head_kv > 0 ? n_head_kv : n_head;
  info.n_expert = n_expert;
  info.has_output = false;
  for (const std::string& n : tensor_names) {
    if (n == "output.weight") info.has_output = true;
    if (is_attn_v_like(n)) ++info.n_attention_wv;
  }
  return info;
}

MixPlanner::MixPlanner(const QuantMix& mix, MixModelInfo info, MixOptions options)
    : mix_(mix), info_(std::move(info)), options_(options) {}

static bool use_more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

static int layer_of(const std::string& name) {
  int layer = -1;
  if (std::sscanf(name.c_str(), "blk.%d.", &layer) != 1) return -1;
  return layer;
}

DType MixPlanner::mix_rule(const std::string& name, DType type) {
  const FileType ft = mix_.file_type;
  const bool falcon = info_.arch == "falcon";
  const int n_gqa = info_.n_head_kv > 0 ? info_.n_head / info_.n_head_kv : 1;
  const bool is_70b = (info_.arch == "llama" || info_.arch == "qwen2") && info_.n_layer == 80;

  if (name == "output.weight" || (!info_.has_output && name == "token_embd.weight")) {
    if (options_.output_type) return *options_.output_type;
    if (falcon) return DType::Q8_0;
    if (type != DType::Q8_0) return DType::Q6_K;  // shape fallback (row not a multiple of 256) happens later
    return type;
  }
  if (name == "token_embd.weight") {
    if (options_.token_embedding_type) return *options_.token_embedding_type;
    return type;
  }
  if (is_attn_v_like(name)) {
    const int i = i_attention_wv_++;
    const int n = info_.n_attention_wv;
    switch (ft) {
      case FileType::MOSTLY_Q2_K: type = n_gqa >= 4 ? DType::Q4_K : DType::Q3_K; break;
      case FileType::MOSTLY_Q3_K_M: type = i < 2 ? DType::Q5_K : DType::Q4_K; break;
      case FileType::MOSTLY_Q3_K_L: type = DType::Q5_K; break;
      case FileType::MOSTLY_IQ4_NL:
      case FileType::MOSTLY_IQ4_XS:
        if (n_gqa >= 4) type = DType::Q5_K;
        break;
      case FileType::MOSTLY_Q4_K_M:
      case FileType::MOSTLY_Q5_K_M:
        if (use_more_bits(i, n)) type = DType::Q6_K;
        break;
      case FileType::MOSTLY_Q4_K_S:
        if (i < 4) type = DType::Q5_K;
        break;
      default: break;
    }
    if (is_70b && (type == DType::Q3_K || type == DType::Q4_K)) type = DType::Q5_K;
    if (info_.n_expert == 8) type = DType::Q8_0;
    return type;
  }
  if (contains(name, "attn_k.weight")) {
    if (info_.n_expert == 8) type = DType::Q8_0;
    return type;
  }
  if (contains(name, "attn_q.weight")) return type;
  if (contains(name, "ffn_down")) {
    int i_layer = i_ffn_down_++;
    const int n_layer = info_.n_layer;
    if (info_.n_expert > 1) {
      i_layer = layer_of(name);
      if (i_layer < 0 || i_layer >= n_layer) fail("cannot determine the layer of tensor '{}'", name);
    }
    switch (ft) {
      case FileType::MOSTLY_Q2_K: type = DType::Q3_K; break;
      case FileType::MOSTLY_Q3_K_M:
        type = i_layer < n_layer / 16 ? DType::Q5_K
               : (!falcon || use_more_bits(i_layer, n_layer)) ? DType::Q4_K
                                                              : DType::Q3_K;
        break;
      case FileType::MOSTLY_Q3_K_L: type = falcon ? DType::Q4_K : DType::Q5_K; break;
      case FileType::MOSTLY_Q4_K_M:
        if (falcon) type = i_layer < n_layer / 16 ? DType::Q6_K : use_more_bits(i_layer, n_layer) ? DType::Q5_K : DType::Q4_K;
        else if (use_more_bits(i_layer, n_layer)) type = DType::Q6_K;
        break;
      case FileType::MOSTLY_IQ4_NL:
      case FileType::MOSTLY_IQ4_XS:
        if (i_layer < n_layer / 8 && !options_.has_imatrix) type = DType::Q5_K;
        break;
      case FileType::MOSTLY_Q5_K_M:
        if (use_more_bits(i_layer, n_layer)) type = DType::Q6_K;
        break;
      case FileType::MOSTLY_Q4_K_S:
        if (!falcon && i_layer < n_layer / 8) type = DType::Q5_K;
        break;
      case FileType::MOSTLY_Q4_0:
      case FileType::MOSTLY_Q5_0:
        if (options_.has_imatrix && i_layer < n_layer / 8) type = ft == FileType::MOSTLY_Q4_0 ? DType::Q4_1 : DType::Q5_1;
        break;
      default: break;
    }
    return type;
  }
  if (contains(name, "attn_output.weight")) {
    if (!falcon) {
      if (info_.n_expert == 8) {
        switch (ft) {
          case FileType::MOSTLY_Q2_K: case FileType::MOSTLY_Q3_K_S: case FileType::MOSTLY_Q3_K_M:
          case FileType::MOSTLY_IQ4_NL: case FileType::MOSTLY_Q4_K_S: case FileType::MOSTLY_Q4_K_M:
          case FileType::MOSTLY_IQ4_XS:
            type = DType::Q5_K;
            break;
          default: break;
        }
      } else {
        if (ft == FileType::MOSTLY_Q2_K) type = DType::Q3_K;
        else if (ft == FileType::MOSTLY_Q3_K_M) type = DType::Q4_K;
        else if (ft == FileType::MOSTLY_Q3_K_L) type = DType::Q5_K;
      }
    } else if (ft == FileType::MOSTLY_Q3_K_L) {
      type = DType::Q4_K;
    }
    return type;
  }
  return type;  // ffn_gate, ffn_up and everything else: the default
}

static DType shape_fallback(DType type, int64_t row_length, int* n_fallback) {
  if (row_length % dtype_block_size(type) == 0) return type;
  DType fb;
  switch (type) {
    case DType::Q2_K: case DType::Q3_K: fb = DType::Q4_0; break;  // llama.cpp: IQ4_NL for IQ types
    case DType::IQ4_XS: fb = DType::IQ4_NL; break;
    case DType::Q4_K: fb = DType::Q5_0; break;
    case DType::Q5_K: fb = DType::Q5_1; break;
    case DType::Q6_K: fb = DType::Q8_0; break;
    default: fb = DType::F16; break;
  }
  if (row_length % dtype_block_size(fb) != 0) fb = DType::F16;
  ++*n_fallback;
  return fb;
}

DType MixPlanner::type_for(const std::string& name, DType source_type, const std::array<int64_t, 4>& ne, int n_dims) {
  // llama.cpp counts dimensions as ggml_n_dims does, ignoring trailing 1s: qwen35moe's shared-expert
  // gate, stored as [n_embd, 1], is a vector and stays as it is.
  while (n_dims > 1 && ne[(size_t)n_dims - 1] == 1) --n_dims;
  if (!tensor_allows_quantization(name, n_dims)) return source_type;
  DType type = mix_.default_type;
  const bool quantized_default = dtype_traits(type).quantized;
  if (!options_.pure && quantized_default) {
    type = mix_rule(name, type);
  } else {
    // --pure and the float mixes skip the rules but still honour the explicit overrides.
    const bool is_output = name == "output.weight" || (!info_.has_output && name == "token_embd.weight");
    if (is_output && options_.output_type) type = *options_.output_type;
    else if (name == "token_embd.weight" && options_.token_embedding_type) type = *options_.token_embedding_type;
  }
  return shape_fallback(type, ne[0], &n_fallback_);
}

}  // namespace roofline
