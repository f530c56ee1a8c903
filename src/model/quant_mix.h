// llama.cpp's quantization mixes as data: which type each tensor gets for Q4_K_M, Q6_K, ... by name,
// layer index and shape, including the row-size fallbacks. One table for `roofline quantize` and for
// synthetic models (facts: ../shared/reference/llama-cpp-facts.md §3).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "formats/dtype.h"

namespace roofline {

// llama_ftype ids, as general.file_type stores them.
enum class FileType : uint32_t {
  ALL_F32 = 0,
  MOSTLY_F16 = 1,
  MOSTLY_Q4_0 = 2,
  MOSTLY_Q4_1 = 3,
  MOSTLY_Q8_0 = 7,
  MOSTLY_Q5_0 = 8,
  MOSTLY_Q5_1 = 9,
  MOSTLY_Q2_K = 10,
  MOSTLY_Q3_K_S = 11,
  MOSTLY_Q3_K_M = 12,
  MOSTLY_Q3_K_L = 13,
  MOSTLY_Q4_K_S = 14,
  MOSTLY_Q4_K_M = 15,
  MOSTLY_Q5_K_S = 16,
  MOSTLY_Q5_K_M = 17,
  MOSTLY_Q6_K = 18,
  MOSTLY_IQ4_NL = 25,
  MOSTLY_IQ4_XS = 30,
  MOSTLY_BF16 = 32,
};

struct QuantMix {
  FileType file_type;
  const char* name;         // "Q4_K_M"
  DType default_type;       // the type most tensors get
  const char* description;  // llama.cpp's model-description suffix: "Q4_K - Medium"
};

// The mixes roofline can produce. find_mix accepts the names and llama-quantize's aliases
// (Q4_K = Q4_K_M, Q5_K = Q5_K_M, Q3_K = Q3_K_M), case-insensitively.
const std::vector<QuantMix>& quant_mixes();
const QuantMix* find_mix(std::string_view name);
const QuantMix* find_mix(FileType file_type);
// "Q4_K - Medium" for a general.file_type value, "unknown" if not known.
std::string file_type_description(uint32_t file_type);

// llama.cpp's rule for which tensors are quantized at all (2+ dims, a weight, not a norm or router).
bool tensor_allows_quantization(std::string_view name, int n_dims);

// What the mix rules need to know about the model.
struct MixModelInfo {
  std::string arch;        // general.architecture
  int n_layer = 0;
  int n_head = 1;
  int n_head_kv = 1;
  int n_expert = 0;
  bool has_output = true;  // false: embeddings tied (output.weight absent), token_embd gets the output rule
  int n_attention_wv = 0;  // attn_v-like tensors (attn_v, attn_qkv, attn_kv_b) in the file
};

struct MixOptions {
  std::optional<DType> output_type;           // --output-tensor-type
  std::optional<DType> token_embedding_type;  // --token-embedding-type
  bool pure = false;                          // --pure: every quantizable tensor gets the default type
  bool has_imatrix = false;
};

// Builds MixModelInfo from tensor names (in file order) and hyperparameters.
MixModelInfo mix_model_info(const std::string& arch, int n_layer, int n_head, int n_head_kv, int n_expert,
                            const std::vector<std::string>& tensor_names);

// Assigns types tensor by tensor; call type_for once per tensor, in file order (counters advance).
class MixPlanner {
 public:
  MixPlanner(const QuantMix& mix, MixModelInfo info, MixOptions options = {});

  // The type `name` gets, given its current type and shape (ne innermost first).
  DType type_for(const std::string& name, DType source_type, const std::array<int64_t, 4>& ne, int n_dims);

  int fallback_count() const { return n_fallback_; }

 private:
  DType mix_rule(const std::string& name, DType type);

  QuantMix mix_;
  MixModelInfo info_;
  MixOptions options_;
  int i_attention_wv_ = 0;
  int i_ffn_down_ = 0;
  int n_fallback_ = 0;
};

}  // namespace roofline
