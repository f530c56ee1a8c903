// Pieces the Hugging Face converters share (internal to src/convert): typed config.json access with
// one-line errors naming the key, JSON file reading, problem lists, the text tensors of a checkpoint
// in llama.cpp's order (multimodal ones left out), and the general.* metadata that
// llama.cpp's converter derives from the folder (gguf-py's Metadata heuristics).
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "formats/dtype.h"
#include "formats/gguf_metadata.h"
#include "formats/safetensors.h"

namespace roofline::convert {

nlohmann::json read_json_file(const std::filesystem::path& p);

// Typed config.json access; `where` names the file (and the sub-object) in errors.
struct HfConfig {
  nlohmann::json j;
  std::string where;

  bool has(const char* key) const { return j.is_object() && j.contains(key) && !j[key].is_null(); }
  int64_t integer(const char* key) const;  // required, 1 .. 2^31
  int64_t integer_or(const char* key, int64_t fallback) const { return has(key) ? integer(key) : fallback; }
  double number(const char* key) const;    // required
  double number_or(const nlohmann::json& obj, const char* key, double fallback) const;
  bool boolean_or(const char* key, bool fallback) const;
};

// conversion/base.py TextModel.__init__: a multimodal config's text_config keys override the top level's;
// `where` then says "(text_config)".
HfConfig text_model_config(const nlohmann::json& config, const std::string& where_file);

std::string shape_string(const std::vector<int64_t>& s);

// conversion/base.py TextModel.filter_tensors: the multimodal tensors (vision tower, projector, audio)
// a text conversion leaves out.
bool is_multimodal_tensor(const std::string& name);

// A checkpoint's text-model tensors in llama.cpp's order: shards in sorted order, each shard's tensors
// sorted by name; multimodal tensors left out (counted in *n_multimodal), "language_model." dropped
// from names, rotary_emb.inv_freq buffers left out.
struct HfTensor {
  const safetensors::Tensor* t;
  std::string name;  // after the renames
};
std::vector<HfTensor> text_model_tensors(const safetensors::SafetensorsModel& st, size_t* n_multimodal);

// "PREFIX: a; b; ...; and N more" (at most `shown` items listed), thrown as one Error line.
[[noreturn]] void fail_with_problems(const std::string& prefix, const std::vector<std::string>& problems, size_t shown = 8);

// The general.* keys llama.cpp's converter writes after general.type, in its order (gguf-py
// Metadata.load + set_gguf_meta_model without an override file): general.sampling.* from
// generation_config.json; name, organization, basename, finetune, version and size_label from
// config.json's "_name_or_path" and the folder name (size_label from `total_params` otherwise);
// license, tags, languages and base models from README.md's YAML front matter (simple scalars and lists).
void add_general_metadata(gguf::Metadata& md, const std::filesystem::path& dir, const nlohmann::json& raw_config,
                          int64_t total_params);

// gguf-py helpers, exposed for tests.
struct ModelIdParts {  // Metadata.get_model_id_components: a hub id or folder name taken apart
  std::optional<std::string> full_name, org, basename, finetune, version, size_label;
};
ModelIdParts model_id_parts(const std::string& model_id, int64_t total_params);
std::string model_id_to_title(const std::string& s);          // Metadata.id_to_title
std::string weight_count_label(int64_t n_params);             // utility.model_weight_count_rounded_notation(n, 2)

// The output type: the requested one, or --outtype auto as llama.cpp's ModelBase picks it: the first
// tensor (in the order given) of 2+ dims that is bf16 or f16 decides; f32-only models give f16.
// tensor_of(item) returns the item's safetensors tensor.
template <typename Items, typename TensorOf>
DType requested_or_auto_outtype(const std::optional<DType>& requested, const Items& items, TensorOf tensor_of) {
  if (requested) return *requested;
  for (const auto& item : items) {
    const auto* t = tensor_of(item);
    if (t->shape.size() >= 2 && (t->type == DType::BF16 || t->type == DType::F16)) return t->type;
  }
  return DType::F16;
}

}  // namespace roofline::convert
