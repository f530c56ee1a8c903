// `roofline convert`: Hugging Face folders (llama, qwen2, qwen3, qwen35, qwen3moe, qwen35moe, gemma3) and llama2.c checkpoints to GGUF, in
// llama.cpp's conventions (tensor names, metadata keys, Q/K permutation for llama, F32 norms and biases).
// Tensors stream one at a time through GgufWriter (temporary file renamed at the end).
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "formats/dtype.h"
#include "formats/gguf_metadata.h"

namespace roofline::convert {

struct ConvertOptions {
  std::string source;             // a Hugging Face folder, or a llama2.c checkpoint file
  std::string output;             // OUT.gguf
  // auto | f32 | f16 | bf16 | q8_0. auto is llama.cpp's --outtype auto for HF folders (f16 when the token
  // embedding is f16, else bf16, so bf16 and f32 sources give bf16) and f32 (lossless) for llama2.c.
  std::string outtype = "auto";
  std::string pre;                // tokenizer.ggml.pre override (HF only)
  std::string tokenizer;          // llama2.c: tok.bin (required); HF: a tokenizer.json other than SRC's
  int n_threads = 0;              // 0: all cores
  bool progress = true;           // a progress line on stderr (only when it is a terminal)
  int64_t chunk_elements = 1 << 22;  // rows converted per step: about this many values (bounds memory)
  bool no_mtp = false;            // Qwen3.5: leave out the MTP (NextN) block (llama.cpp's --no-mtp)
};

struct ConvertResult {
  std::string arch;
  std::string outtype;            // "F16", ...: the type the matrices got
  size_t n_tensors = 0;
  uint64_t n_params = 0;
  uint64_t file_bytes = 0;
  int64_t f16_saturated = 0;      // finite values beyond ±65504 stored as ±65504 (f16 output)
  int64_t f16_flushed = 0;        // non-zero values below f16's smallest subnormal stored as ±0
  std::vector<std::string> notes; // fallbacks and other remarks, one line each
};

// Dispatches on SRC: a folder is a Hugging Face model, a file a llama2.c checkpoint. Throws Error
// (one line) on any problem; the output file is then left untouched (never half written).
ConvertResult convert_model(const ConvertOptions& options);
ConvertResult convert_hf(const ConvertOptions& options);
ConvertResult convert_llama2c(const ConvertOptions& options);
// Qwen3_5ForConditionalGeneration / Qwen3_5ForCausalLM (llama.cpp arch qwen35) and their Qwen3_5Moe*
// forms (qwen35moe); `config` is config.json.
ConvertResult convert_qwen35(const ConvertOptions& options, const nlohmann::json& config, const std::string& hf_arch);
// Gemma3ForCausalLM / Gemma3ForConditionalGeneration's text tower (llama.cpp arch gemma3).
ConvertResult convert_gemma3(const ConvertOptions& options, const nlohmann::json& config, const std::string& hf_arch);

// ---- shared pieces (used by both converters; exposed for tests) ----

// The requested output type: nullopt for "auto"; throws for an unknown name.
std::optional<DType> parse_outtype(const std::string& name);
uint32_t file_type_for(DType outtype);  // general.file_type (llama_ftype) of an all-`outtype` model

// The type llama.cpp's converter gives a tensor: F32 for 1-D tensors, norms and non-".weight" tensors,
// else `outtype`; Q8_0 falls back to F16 when the row length is not a multiple of 32 (note says so).
DType tensor_type_for(const std::string& name, int n_dims, int64_t row_length, DType outtype, std::string* note);

// Q/K rows from Hugging Face's rotate-half order to GGUF's adjacent pairs (llama only): within each
// head of head_dim rows, row half*head_dim/2 + i moves to 2i + half. `row_length` 1 permutes a bias.
void permute_qk_rows(const float* src, float* dst, int64_t n_head, int64_t head_dim, int64_t row_length);
// The inverse (GGUF pairs back to rotate-half).
void unpermute_qk_rows(const float* src, float* dst, int64_t n_head, int64_t head_dim, int64_t row_length);

// One output tensor: its GGUF name, shape (innermost first), type, and a producer writing rows
// [first_row, first_row + n_rows) as f32 values in GGUF row-major order (rows of shape[0] elements).
struct PlannedTensor {
  std::string name;
  std::vector<int64_t> shape;
  DType type;
  std::function<void(float* dst, int64_t first_row, int64_t n_rows)> fill;
};

// Converts and writes every tensor in order through GgufWriter, a bounded chunk of rows at a time (memory
// stays near one chunk, whatever the model size), then renames into place.
void write_converted(const ConvertOptions& options, const gguf::Metadata& metadata,
                     const std::vector<PlannedTensor>& tensors, ConvertResult& result);

// Converts n f32 values to `type` (F32, F16, BF16; n a multiple of row_length for Q8_0), counting
// f16 saturation. dst receives dtype_row_bytes(type, n) bytes.
void convert_values(const float* src, int64_t n, int64_t row_length, DType type, uint8_t* dst, int64_t* saturated,
                    int64_t* flushed);

}  // namespace roofline::convert
