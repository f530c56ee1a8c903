// The streaming model quantizer behind `roofline quantize`: plans every tensor's type with llama.cpp's
// mix rules (model/quant_mix.h), then converts tensor by tensor, rows in parallel, into a GGUF file
// written through a temporary name (memory stays near one chunk of rows whatever the model size).
// The output matches llama-quantize's: tensor order, metadata, and (without an imatrix) the bytes.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "formats/gguf.h"
#include "model/quant_mix.h"

namespace roofline {

// Per-tensor importance (an imatrix, reduced to what the quantizer uses): for each weight name, the
// mean squared activation of each input column, n_cols values per matrix (n_cols * n_expert for MoE).
struct ImportanceData {
  std::map<std::string, std::vector<float>, std::less<>> values;
  std::string file;     // written as quantize.imatrix.file
  std::string dataset;  // quantize.imatrix.dataset (the first dataset the imatrix names; may be empty)
  int chunk_count = 0;  // quantize.imatrix.chunks_count
};

struct QuantizeProgress {
  size_t tensor_index = 0;  // 0-based, in output order
  size_t n_tensors = 0;
  const std::string* name = nullptr;
  DType from = DType::F32, to = DType::F32;
  double tensor_fraction = 0;   // of this tensor done
  double total_fraction = 0;    // of all the work (weighted by elements converted and bytes copied)
  double elapsed_s = 0;
  bool tensor_done = false;     // the last report of each tensor
};

struct QuantizeOptions {
  const QuantMix* mix = nullptr;  // required
  MixOptions mix_options;         // pure, output/token-embedding types (has_imatrix is set from `imatrix`)
  int n_threads = 0;              // 0: all cores
  bool allow_requantize = false;  // accept already-quantized input tensors
  bool leave_output_tensor = false;
  const ImportanceData* imatrix = nullptr;
  const std::atomic<bool>* cancel = nullptr;  // set (e.g. by SIGINT) to stop; quantize_model then throws
  std::function<void(const QuantizeProgress&)> progress;
  size_t chunk_bytes = 32u << 20;  // output bytes converted per step (bounds memory)
};

struct TensorPlan {
  std::string name;
  DType from = DType::F32, to = DType::F32;
  int n_dims = 1;
  std::array<int64_t, 4> ne{1, 1, 1, 1};
  size_t in_bytes = 0, out_bytes = 0;
  bool convert = false;         // false: bytes copied unchanged
  bool uses_imatrix = false;
  const gguf::TensorInfo* source = nullptr;
};

struct QuantizePlan {
  std::vector<TensorPlan> tensors;  // in output order (llama-quantize's: by layer number, then name)
  gguf::Metadata metadata;          // the output's metadata
  uint64_t in_bytes = 0, out_bytes = 0;
  int n_fallback = 0;               // tensors whose row length forced another type
  std::vector<std::string> missing_imatrix;  // quantized tensors the imatrix has no entry for
};

// llama-quantize's output order: non-layer tensors first, then by layer number, then by name.
bool quantize_tensor_order(const std::string& a, const std::string& b);

// Plans types, sizes and metadata; throws Error (naming the tensor) on requantization without
// allow_requantize, an imatrix entry of the wrong size, or an input that is not a model.
QuantizePlan plan_quantization(const gguf::GgufFile& in, const QuantizeOptions& options);

struct QuantizeResult {
  QuantizePlan plan;
  double seconds = 0;
};

// Quantizes `in` into out_path (a temporary file renamed at the end; nothing is left behind on an
// error or cancellation). Throws Error with one clear line.
QuantizeResult quantize_model(const gguf::GgufFile& in, const std::string& out_path, const QuantizeOptions& options);

// Converts n_rows rows of `src_type` (row_length elements each) to `dst_type`, via f32; importance
// (row_length floats, or nullptr) weights the scale search. Checks the result like
// ggml_validate_row_data and throws naming `what` if a value or scale is NaN/Inf.
void convert_rows(DType src_type, const void* src, DType dst_type, void* dst, int64_t n_rows, int64_t row_length,
                  const float* importance, const std::string& what, int64_t row_offset = 0);

// ggml_validate_row_data's check: false (and the first bad element or block in *where) when a value
// of a float type, or a block's scale/min, is NaN or Inf.
bool validate_row_data(DType type, const void* data, size_t n_bytes, size_t* where = nullptr);

}  // namespace roofline
