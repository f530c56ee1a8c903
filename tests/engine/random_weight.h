// A random weight matrix quantized to a type, for GPU product tests: the GGUF bytes behind a Weight and
// their dequantized values (what a double-precision reference multiplies).
#pragma once

#include <cstdint>
#include <vector>

#include "core/rng.h"
#include "formats/quant_ref.h"
#include "model/model.h"

namespace roofline::test {

struct RandomWeight {
  std::vector<uint8_t> bytes;
  std::vector<float> values;  // dequantized, [rows x cols]
  gguf::TensorInfo info;

  // Values ~ N(0, scale^2) before quantization.
  RandomWeight(DType type, int64_t rows, int64_t cols, Rng& rng, float scale = 0.05f) {
    std::vector<float> wf((size_t)(rows * cols));
    for (float& v : wf) v = (float)rng.normal() * scale;
    bytes.resize(dtype_row_bytes(type, cols) * rows);
    quantize_rows_ref(type, wf.data(), bytes.data(), rows, cols);
    values.resize(wf.size());
    dequantize_rows_ref(type, bytes.data(), values.data(), rows, cols);
    info.name = "w";
    info.type = type;
    info.n_dims = 2;
    info.ne = {cols, rows, 1, 1};
    info.n_bytes = bytes.size();
    info.data = bytes.data();
  }
  RandomWeight(const RandomWeight&) = delete;
  RandomWeight& operator=(const RandomWeight&) = delete;
  Weight weight() const { return Weight{&info}; }
  int64_t rows() const { return info.ne[1]; }
  int64_t cols() const { return info.ne[0]; }
  // Row t of x ([.. x cols]) times the dequantized matrix, in double.
  template <typename T>
  std::vector<double> times(const std::vector<T>& x, int t) const {
    std::vector<double> y((size_t)rows());
    for (int64_t r = 0; r < rows(); ++r) {
      double s = 0;
      for (int64_t c = 0; c < cols(); ++c) s += (double)values[(size_t)(r * cols() + c)] * (double)x[(size_t)(t * cols() + c)];
      y[(size_t)r] = s;
    }
    return y;
  }
};

}  // namespace roofline::test
