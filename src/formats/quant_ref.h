// Reference codecs: the scalar, exact statement of every tensor type roofline computes with.
// dequantize_row_ref is bit-exact with the GGUF spec (llama.cpp's dequantize_row_* produce the same
// floats). quantize_row_ref produces valid blocks of the type; the K-quants and IQ4 types search for
// their scales as llama.cpp's reference quantizers do, optionally weighted by an importance matrix.
// Fast CPU/CUDA kernels are tested against these.
#pragma once

#include <cstdint>

#include "formats/dtype.h"

namespace roofline {

// dst receives n floats. n must be a multiple of the type's block size. Throws for types without a
// reference (dtype_has_reference false).
void dequantize_row_ref(DType type, const void* src, float* dst, int64_t n);

// Quantizes n floats into dtype_row_bytes(type, n) bytes at dst. `importance` (n floats, or nullptr)
// weights the squared error of each element in the scale search (an imatrix column weight).
void quantize_row_ref(DType type, const float* src, void* dst, int64_t n, const float* importance = nullptr);

// Whole tensors: rows of row_length elements (rows are independent; multi-threaded by the caller).
void dequantize_rows_ref(DType type, const void* src, float* dst, int64_t n_rows, int64_t row_length);
void quantize_rows_ref(DType type, const float* src, void* dst, int64_t n_rows, int64_t row_length,
                       const float* importance = nullptr);

}  // namespace roofline
