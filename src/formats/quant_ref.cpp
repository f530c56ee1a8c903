// Reference codecs: argument checks, the dispatch to each type's row functions, the plain float types
// (F32, F16, BF16 with round-to-nearest-even) and the whole-tensor row loops.
// The block types live in quant_ref_legacy.cpp, quant_ref_kquants.cpp and quant_ref_iq4.cpp.
#include "formats/quant_ref.h"

#include <cstring>
#include <limits>

#include "core/error.h"
#include "core/fp16.h"
#include "formats/quant_ref_impl.h"

namespace roofline {
namespace {

using quant_detail::DequantRowFn;
using quant_detail::QuantRowFn;

void dequant_f32(const void* src, float* dst, int64_t n) { std::memcpy(dst, src, (size_t)n * sizeof(float)); }
void quant_f32(const float* src, void* dst, int64_t n, const float*) { std::memcpy(dst, src, (size_t)n * sizeof(float)); }

void dequant_f16(const void* src, float* dst, int64_t n) {
  const auto* h = static_cast<const uint8_t*>(src);
  for (int64_t i = 0; i < n; ++i) {
    uint16_t v;
    std::memcpy(&v, h + 2 * i, 2);
    dst[i] = fp16_to_f32(v);
  }
}
void quant_f16(const float* src, void* dst, int64_t n, const float*) {
  auto* h = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t v = f32_to_fp16(src[i]);
    std::memcpy(h + 2 * i, &v, 2);
  }
}

void dequant_bf16(const void* src, float* dst, int64_t n) {
  const auto* h = static_cast<const uint8_t*>(src);
  for (int64_t i = 0; i < n; ++i) {
    uint16_t v;
    std::memcpy(&v, h + 2 * i, 2);
    dst[i] = bf16_to_f32(v);
  }
}
void quant_bf16(const float* src, void* dst, int64_t n, const float*) {
  auto* h = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t v = f32_to_bf16(src[i]);
    std::memcpy(h + 2 * i, &v, 2);
  }
}

struct Codec {
  DequantRowFn dequant;
  QuantRowFn quant;
};

// The codec of a type, or a thrown Error naming the type when roofline has none.
Codec codec_for(DType type) {
  using namespace quant_detail;
  switch (type) {
    case DType::F32: return {dequant_f32, quant_f32};
    case DType::F16: return {dequant_f16, quant_f16};
    case DType::BF16: return {dequant_bf16, quant_bf16};
    case DType::Q4_0: return {dequant_q4_0, quant_q4_0};
    case DType::Q4_1: return {dequant_q4_1, quant_q4_1};
    case DType::Q5_0: return {dequant_q5_0, quant_q5_0};
    case DType::Q5_1: return {dequant_q5_1, quant_q5_1};
    case DType::Q8_0: return {dequant_q8_0, quant_q8_0};
    case DType::Q2_K: return {dequant_q2_k, quant_q2_k};
    case DType::Q3_K: return {dequant_q3_k, quant_q3_k};
    case DType::Q4_K: return {dequant_q4_k, quant_q4_k};
    case DType::Q5_K: return {dequant_q5_k, quant_q5_k};
    case DType::Q6_K: return {dequant_q6_k, quant_q6_k};
    case DType::IQ4_NL: return {dequant_iq4_nl, quant_iq4_nl};
    case DType::IQ4_XS: return {dequant_iq4_xs, quant_iq4_xs};
    default: break;
  }
  const DTypeTraits* traits = dtype_traits_or_null((uint32_t)type);
  if (!traits) fail("tensor type id {} is not a GGUF tensor type", (uint32_t)type);
  fail("no reference codec for tensor type {}", dtype_name(type));
}

void check_length(DType type, int64_t n) {
  const int64_t block = dtype_block_size(type);
  if (n < 0 || n % block != 0)
    fail("a row of {} elements is not a whole number of {} blocks ({} elements each)", n, dtype_name(type), block);
}

void check_pointers(const void* a, const void* b, int64_t n) {
  if (n > 0 && (!a || !b)) fail("null buffer passed to a reference codec");
}

// n_rows * row_length, checked for overflow (each row must also fit its byte size in size_t).
int64_t checked_elements(DType type, int64_t n_rows, int64_t row_length) {
  if (n_rows < 0) fail("negative row count {}", n_rows);
  check_length(type, row_length);
  if (row_length > 0 && n_rows > std::numeric_limits<int64_t>::max() / row_length)
    fail("{} rows of {} elements overflow", n_rows, row_length);
  return n_rows * row_length;
}

}  // namespace

void dequantize_row_ref(DType type, const void* src, float* dst, int64_t n) {
  const Codec c = codec_for(type);
  check_length(type, n);
  check_pointers(src, dst, n);
  if (n > 0) c.dequant(src, dst, n);
}

void quantize_row_ref(DType type, const float* src, void* dst, int64_t n, const float* importance) {
  const Codec c = codec_for(type);
  check_length(type, n);
  check_pointers(src, dst, n);
  if (n > 0) c.quant(src, dst, n, importance);
}

void dequantize_rows_ref(DType type, const void* src, float* dst, int64_t n_rows, int64_t row_length) {
  const Codec c = codec_for(type);
  const int64_t total = checked_elements(type, n_rows, row_length);
  check_pointers(src, dst, total);
  if (total == 0) return;
  const size_t row_bytes = dtype_row_bytes(type, row_length);
  const auto* in = static_cast<const uint8_t*>(src);
  for (int64_t r = 0; r < n_rows; ++r) c.dequant(in + (size_t)r * row_bytes, dst + r * row_length, row_length);
}

void quantize_rows_ref(DType type, const float* src, void* dst, int64_t n_rows, int64_t row_length,
                       const float* importance) {
  const Codec c = codec_for(type);
  const int64_t total = checked_elements(type, n_rows, row_length);
  check_pointers(src, dst, total);
  if (total == 0) return;
  const size_t row_bytes = dtype_row_bytes(type, row_length);
  auto* out = static_cast<uint8_t*>(dst);
  // Rows are quantized independently; the importance vector (one weight per column) applies to each.
  for (int64_t r = 0; r < n_rows; ++r) c.quant(src + r * row_length, out + (size_t)r * row_bytes, row_length, importance);
}

}  // namespace roofline
