// Tensor element types as GGUF numbers them (ggml_type ids), with their block geometry.
// Every id a GGUF file may carry is known here (so `inspect` can read any file); the reference
// codecs (formats/quant_ref.h) exist for the types roofline computes with (dtype_has_reference).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace roofline {

enum class DType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ1_S = 19,
  IQ4_NL = 20,
  IQ3_S = 21,
  IQ2_S = 22,
  IQ4_XS = 23,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  IQ1_M = 29,
  BF16 = 30,
  TQ1_0 = 34,
  TQ2_0 = 35,
  MXFP4 = 39,
};

struct DTypeTraits {
  const char* name;      // ggml's lower-case name: "q4_K", "bf16", ...
  int64_t block_size;    // elements per block (1 for plain types)
  size_t block_bytes;    // bytes per block
  bool quantized;        // a block type (not a plain scalar type)
  bool has_reference;    // roofline has a reference dequantizer/quantizer for it
};

// Returns nullptr for ids that are not (or no longer) GGUF tensor types.
const DTypeTraits* dtype_traits_or_null(uint32_t id);
const DTypeTraits& dtype_traits(DType type);

inline int64_t dtype_block_size(DType t) { return dtype_traits(t).block_size; }
inline size_t dtype_block_bytes(DType t) { return dtype_traits(t).block_bytes; }
inline bool dtype_has_reference(DType t) { return dtype_traits(t).has_reference; }

// Upper-case display name as gguf-dump and llama.cpp logs show it: "Q4_K", "F16", "BF16".
std::string dtype_name(DType type);

// Case-insensitive parse of a type name ("q8_0", "Q4_K", "bf16"); nullopt if unknown.
std::optional<DType> dtype_from_name(std::string_view name);

// Bytes of a row of n elements; n must be a multiple of the block size (checked by callers that
// validate input: dtype_row_bytes throws on a bad n).
size_t dtype_row_bytes(DType type, int64_t n);

}  // namespace roofline
