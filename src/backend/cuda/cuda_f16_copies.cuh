// f16 copies of a GPU backend's weight matrices, kept for its prompt steps (--f16-copies). A prompt product
// of a quantized weight otherwise dequantizes the whole matrix to f16 in the GEMM scratch and multiplies that
// with cuBLAS, in every step: for qwen3-32b that is ~64 GB written and read again per prompt step, a third of a
// pp512 step and most of a pp128 one. With the copies made once at load, a prompt product is one cuBLAS GEMM
// on its copy (gemm_uses_f16_copy). They are made last, from memory nothing else was given, so they never
// cost a layer, a KV block or a slot; the values are those the dequantization gives, so the logits are too.
#pragma once

#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_weights.cuh"

namespace roofline::cuda {

// Bytes the current device can give copies: what it has free, less margin_bytes; with a limit (--vram-limit,
// 0: none), also no more than limit_bytes less own_bytes (what this backend has allocated) and the margin; with a
// cap (--f16-copies GIB, 0: none), no more than that.
double f16_copy_room(double margin_bytes, double limit_bytes, double own_bytes, double cap_bytes);

// Gives weights an f16 copy each, in order, while they fit in room_bytes (Auto), or every one of them (On:
// a one-line error naming the bytes when they do not fit). An F16 matrix in its raw layout is its own copy
// and takes no memory. The copies live in `arena` (reserved here, once). Returns the startup report's line
// for GPU `device` ("" when it keeps no copy).
std::string make_f16_copies(const std::vector<DeviceWeight*>& weights, F16Copies mode, double room_bytes, DeviceArena& arena,
                            cudaStream_t stream, int device);

}  // namespace roofline::cuda
