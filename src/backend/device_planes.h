// How the CUDA backend stores a weight type on the GPU, in plain C++ so that the memory planner
// (engine/memory_plan.cpp) counts the same bytes as the backend allocates (cuda/cuda_weights.cu makes the
// planes; the decode kernels that read them are in cuda/cuda_matvec_blocks.cuh). Types whose blocks are not
// 16-byte aligned, or whose bits a lane would otherwise gather from all over a super-block, are split into
// up to four planes with a fixed number of bytes per block each, every plane stored row after row:
//   Q8_0    32 int8 values | f16 scale
//   Q4_0, IQ4_NL   the file's 16 quant bytes | f16 scale
//   Q4_1    the file's 16 quant bytes | f16 scale, f16 min
//   Q5_0    the file's 16 quant bytes | f16 scale | fifth bits (value e at byte e % 4, bit e / 4)
//   Q5_1    the file's 16 quant bytes | f16 scale, f16 min | fifth bits
//   Q6_K    low nibbles | 2-bit highs | int8 scales | f16 scale      (lane chunks of 32 values)
//   Q3_K    low 2 bits | sign bits | int8 scales (-32) | f16 scale   (lane chunks of 32 values)
//   Q2_K    2-bit values | the file's scale bytes | f16 d, dmin    (lane chunks of 32 values)
// Other types (Q4_K, Q5_K, IQ4_XS, the float types) stay as the file's blocks.
#pragma once

#include <cstddef>
#include <cstdint>

#include "formats/dtype.h"

namespace roofline {

struct DevicePlanes {
  int64_t values = 0;       // values per block (0: the type is stored as in the file)
  int bytes[4] = {0, 0, 0, 0};  // bytes of each plane per block (0: no such plane)
};

constexpr DevicePlanes device_planes(DType t) {
  switch (t) {
    case DType::Q8_0: return {32, {32, 2, 0, 0}};
    case DType::Q4_0: case DType::IQ4_NL: return {32, {16, 2, 0, 0}};
    case DType::Q4_1: return {32, {16, 4, 0, 0}};
    case DType::Q5_0: return {32, {16, 2, 4, 0}};
    case DType::Q5_1: return {32, {16, 4, 4, 0}};
    case DType::Q6_K: return {256, {128, 64, 16, 2}};
    case DType::Q3_K: return {256, {64, 32, 16, 2}};
    case DType::Q2_K: return {256, {64, 16, 4, 0}};
    default: return {};
  }
}

// The bytes a matrix of n values of type t takes on the device with each plane (or, stored as in the file, its
// file_bytes) rounded up to `align` (the weight arena's alignment).
constexpr size_t device_matrix_bytes(DType t, int64_t n, size_t file_bytes, size_t align) {
  const auto up = [align](size_t b) { return (b + align - 1) / align * align; };
  const DevicePlanes p = device_planes(t);
  if (p.values == 0) return up(file_bytes);
  size_t bytes = 0;
  for (int b : p.bytes) bytes += up((size_t)(n / p.values) * (size_t)b);
  return bytes;
}

}  // namespace roofline
