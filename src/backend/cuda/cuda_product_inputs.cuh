// The int8 inputs of a step's matrix products (ActQ8) and the decode epilogues that write the next
// product's input while a product stores its outputs (MatvecEpilogue, cuda_kernels.cuh): the output
// projection's residual add writes the FFN's normed input, gate/up write SwiGLU's (GeGLU's), down writes
// the next layer's, so no norm or SwiGLU kernel runs between them. Two buffers: the one the running product reads
// and the one its epilogue writes; after the launch the written one is current (take()).
//
// Invariant: the current input carries a row factor (the 1/rms still to apply, ActQ8::row_factor) only
// where a Norm epilogue wrote it; any other kernel that writes the current input gets it through
// writable(), which clears that.
#pragma once

#include <cstdlib>
#include <cstring>

#include "backend/cuda/cuda_kernels.cuh"
#include "backend/cuda/cuda_weights.cuh"

namespace roofline::cuda {

class ProductInputs {
 public:
  // Decode steps are at most this many rows (the matvec path).
  static constexpr int kDecodeRows = 8;

  // Device bytes for `rows` rows of up to max_cols columns (the first buffer) plus the decode buffer.
  static size_t bytes(int rows, int64_t max_cols) {
    const size_t blocks = (size_t)(max_cols / 32 + 1);
    return (size_t)rows * max_cols + 2 * (size_t)rows * blocks * 4 +                      // main: q, d, s
           (size_t)kDecodeRows * max_cols + 2 * (size_t)kDecodeRows * blocks * 4 +         // decode: q, d, s
           (size_t)kDecodeRows * blocks * 4 + 2 * kDecodeRows * 4 + (blocks + 1) * 4 +     // ssq, row factors, counters
           12 * 256;                                                                       // alignment
  }

  void init(DeviceArena& arena, int rows, int64_t max_cols, cudaStream_t stream) {
    const size_t blocks = (size_t)(max_cols / 32 + 1);
    auto take_f = [&](size_t n) { return reinterpret_cast<float*>(arena.take(n * 4)); };
    main_.q = reinterpret_cast<int8_t*>(arena.take((size_t)rows * max_cols));
    main_.d = take_f((size_t)rows * blocks);
    main_.s = take_f((size_t)rows * blocks);
    ssq_ = take_f((size_t)kDecodeRows * blocks);
    main_factor_ = take_f(kDecodeRows);
    alt_factor_ = take_f(kDecodeRows);
    alt_.q = reinterpret_cast<int8_t*>(arena.take((size_t)kDecodeRows * max_cols));
    alt_.d = take_f((size_t)kDecodeRows * blocks);
    alt_.s = take_f((size_t)kDecodeRows * blocks);
    counters_ = reinterpret_cast<int*>(arena.take((blocks + 1) * 4));
    grid_counter_ = counters_ + blocks;
    ROOFLINE_CUDA_CHECK(cudaMemsetAsync(counters_, 0, (blocks + 1) * 4, stream));
    current_ = main_;
    // ROOFLINE_FUSED_INPUTS=1 turns the epilogues on (off: 7-10% slower on the H200, docs/performance.md).
    const char* env = std::getenv("ROOFLINE_FUSED_INPUTS");
    enabled_ = env && std::strcmp(env, "1") == 0;
  }

  // Whether decode epilogues are on (ROOFLINE_FUSED_INPUTS=1).
  bool enabled() const { return enabled_; }
  // What the next product reads.
  const ActQ8& current() const { return current_; }
  // The current buffer, for a kernel that writes the next product's input itself.
  ActQ8 writable() {
    current_.row_factor = nullptr;
    return current_;
  }
  // An epilogue into the other buffer: v = y * norm_w, the 1/rms left to the next product.
  MatvecEpilogue norm(const float* norm_w, float eps) const {
    MatvecEpilogue ep = epilogue(MatvecEpilogue::Kind::Norm);
    ep.norm_w = norm_w;
    ep.out.row_factor = other_is_alt() ? alt_factor_ : main_factor_;
    ep.ssq = ssq_;
    ep.eps = eps;
    ep.grid_counter = grid_counter_;
    return ep;
  }
  // An epilogue into the other buffer: silu(gate) * up, or (geglu) gelu(gate) * up.
  MatvecEpilogue gated(bool geglu) const { return epilogue(geglu ? MatvecEpilogue::Kind::GeGlu : MatvecEpilogue::Kind::SwiGlu); }
  // After the product with that epilogue was launched: its output is the current input.
  void take(const MatvecEpilogue& ep) { current_ = ep.out; }
  // Back to the first buffer, nothing pending (each forward starts here).
  void reset() { current_ = main_; }

 private:
  bool other_is_alt() const { return current_.q == main_.q; }
  MatvecEpilogue epilogue(MatvecEpilogue::Kind kind) const {
    MatvecEpilogue ep;
    ep.kind = kind;
    ep.out = other_is_alt() ? alt_ : main_;
    ep.counters = counters_;
    return ep;
  }

  ActQ8 main_, alt_, current_;
  float* ssq_ = nullptr;          // the Norm epilogue's per-block sums (read within its launch only)
  float* main_factor_ = nullptr;  // the row factors of each buffer (ActQ8::row_factor)
  float* alt_factor_ = nullptr;
  int* counters_ = nullptr;
  int* grid_counter_ = nullptr;
  bool enabled_ = false;
};

}  // namespace roofline::cuda
