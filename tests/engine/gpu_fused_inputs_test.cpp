// Decode products joined by epilogues (MatvecEpilogue, ProductInputs): the residual add's epilogue
// writes the next norm's int8 input and leaves the 1/rms factor to the next product; gate/up's writes
// SwiGLU's. Checked against the double-precision chain of the dequantized weights, against the same
// chain through the separate norm / SwiGLU kernels, and run twice (the block counters must be back at
// zero), for producer kinds whose warps take 1, 2 or 4 rows. Skipped without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "backend/gpu.h"
#include "core/rng.h"
#include "engine/engine_test_util.h"
#include "formats/quant_ref.h"
#include "model/model.h"
#include "test_util.h"

using namespace roofline;

namespace {

// A random weight quantized to `type`, and its dequantized values (what the reference multiplies).
struct TestWeight {
  std::vector<uint8_t> bytes;
  std::vector<float> values;
  gguf::TensorInfo info;
  TestWeight(DType type, int64_t rows, int64_t cols, Rng& rng) {
    std::vector<float> wf((size_t)(rows * cols));
    for (float& v : wf) v = (float)rng.normal() * 0.05f;
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
  TestWeight(const TestWeight&) = delete;
  Weight weight() const { return Weight{&info}; }
  int64_t rows() const { return info.ne[1]; }
  int64_t cols() const { return info.ne[0]; }
  std::vector<double> times(const std::vector<double>& x, int t) const {  // row t of x [.. x cols]
    std::vector<double> y((size_t)rows());
    for (int64_t r = 0; r < rows(); ++r) {
      double s = 0;
      for (int64_t c = 0; c < cols(); ++c) s += (double)values[(size_t)(r * cols() + c)] * x[(size_t)(t * cols() + c)];
      y[(size_t)r] = s;
    }
    return y;
  }
};

std::vector<float> random_floats(size_t n, Rng& rng, double scale = 1.0) {
  std::vector<float> v(n);
  for (float& f : v) f = (float)(rng.normal() * scale);
  return v;
}

std::vector<double> to_double(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

}  // namespace

TEST(GpuFusedInputs, NormEpilogueMatchesTheReferenceAndTheSeparateNorm) {
  SKIP_WITHOUT_GPU();
  Rng rng(41);
  const float eps = 1e-6f;
  const int64_t cols = 512, mid = 768, rows_c = 67;
  for (DType producer : {DType::Q4_K, DType::Q6_K, DType::Q8_0})
    for (DType consumer : {DType::Q4_K, DType::Q6_K})
      for (int n : {1, 3, 6, 8}) {
        const TestWeight p(producer, mid, cols, rng), c(consumer, rows_c, mid, rng);
        const std::vector<float> a = random_floats((size_t)(n * cols), rng), x = random_floats((size_t)(n * mid), rng, 0.3);
        std::vector<float> w = random_floats((size_t)mid, rng, 0.2);
        for (float& v : w) v += 1.0f;
        const auto fused = gpu_chained_products_for_test(GpuChainForTest::Norm, true, p.weight(), nullptr, c.weight(), a, x, w, n, eps);
        const auto plain = gpu_chained_products_for_test(GpuChainForTest::Norm, false, p.weight(), nullptr, c.weight(), a, x, w, n, eps);
        const size_t ny = (size_t)(n * rows_c), nx = (size_t)(n * mid);
        ASSERT_EQ(fused.size(), 2 * ny + nx);
        // Reference: x' = x + P a, h = x' / rms(x') * w, y = C h.
        const std::vector<double> ad = to_double(a);
        std::vector<float> x_ref(nx), h(nx), y_ref(ny);
        for (int t = 0; t < n; ++t) {
          const std::vector<double> pa = p.times(ad, t);
          double ss = 0;
          for (int64_t i = 0; i < mid; ++i) {
            const double v = (double)x[(size_t)(t * mid + i)] + pa[(size_t)i];
            x_ref[(size_t)(t * mid + i)] = (float)v;
            ss += v * v;
          }
          const double r = 1.0 / std::sqrt(ss / (double)mid + eps);
          for (int64_t i = 0; i < mid; ++i) h[(size_t)(t * mid + i)] = (float)(x_ref[(size_t)(t * mid + i)] * r * w[(size_t)i]);
        }
        const std::vector<double> hd = to_double(h);
        for (int t = 0; t < n; ++t) {
          const std::vector<double> y = c.times(hd, t);
          for (int64_t r = 0; r < rows_c; ++r) y_ref[(size_t)(t * rows_c + r)] = (float)y[(size_t)r];
        }
        const std::string what = std::string(dtype_name(producer)) + " -> " + dtype_name(consumer) + " n=" + std::to_string(n);
        // Two int8 stages (P's input, C's input): ~1e-4 each.
        EXPECT_LT(test::nmse(fused.data(), y_ref.data(), ny), 4e-4) << what;
        EXPECT_LT(test::nmse(fused.data() + 2 * ny, x_ref.data(), nx), 2e-4) << what << " (residual)";
        // The same int8 values as the separate norm's (up to rounding at a tie), so close to it.
        EXPECT_LT(test::nmse(fused.data(), plain.data(), ny), 1e-5) << what << " (against the separate norm)";
        EXPECT_EQ(0, std::memcmp(fused.data(), fused.data() + ny, ny * 4)) << what << " (second run)";
      }
}

TEST(GpuFusedInputs, SwigluEpilogueMatchesTheReferenceAndTheSeparateKernel) {
  SKIP_WITHOUT_GPU();
  Rng rng(43);
  const int64_t cols = 768, mid = 1280, rows_c = 45;
  for (DType producer : {DType::Q4_K, DType::Q6_K, DType::Q8_0})
    for (DType consumer : {DType::Q4_K, DType::Q6_K})
      for (int n : {1, 2, 5, 8}) {
        const TestWeight gate(producer, mid, cols, rng), up(producer, mid, cols, rng), c(consumer, rows_c, mid, rng);
        const std::vector<float> a = random_floats((size_t)(n * cols), rng);
        const Weight up_w = up.weight();
        const auto fused = gpu_chained_products_for_test(GpuChainForTest::SwiGlu, true, gate.weight(), &up_w, c.weight(), a, {}, {}, n);
        const auto plain = gpu_chained_products_for_test(GpuChainForTest::SwiGlu, false, gate.weight(), &up_w, c.weight(), a, {}, {}, n);
        const size_t ny = (size_t)(n * rows_c);
        ASSERT_EQ(fused.size(), 2 * ny);
        const std::vector<double> ad = to_double(a);
        std::vector<double> h((size_t)(n * mid));
        for (int t = 0; t < n; ++t) {
          const std::vector<double> g = gate.times(ad, t), u = up.times(ad, t);
          for (int64_t i = 0; i < mid; ++i) h[(size_t)(t * mid + i)] = g[(size_t)i] / (1.0 + std::exp(-g[(size_t)i])) * u[(size_t)i];
        }
        std::vector<float> y_ref(ny);
        for (int t = 0; t < n; ++t) {
          const std::vector<double> y = c.times(h, t);
          for (int64_t r = 0; r < rows_c; ++r) y_ref[(size_t)(t * rows_c + r)] = (float)y[(size_t)r];
        }
        const std::string what = std::string(dtype_name(producer)) + " -> " + dtype_name(consumer) + " n=" + std::to_string(n);
        EXPECT_LT(test::nmse(fused.data(), y_ref.data(), ny), 4e-4) << what;
        // The same formula and quantization as the SwiGLU kernel: identical.
        EXPECT_EQ(0, std::memcmp(fused.data(), plain.data(), ny * 4)) << what << " (against the separate kernel)";
        EXPECT_EQ(0, std::memcmp(fused.data(), fused.data() + ny, ny * 4)) << what << " (second run)";
      }
}
