// Decode products joined by epilogues (MatvecEpilogue, ProductInputs): the residual add's epilogue
// writes the next norm's int8 input and leaves the 1/rms factor to the next product; gate/up's writes
// SwiGLU's. Checked against the double-precision chain of the dequantized weights, against the same
// chain through the separate norm / SwiGLU kernels, and run twice (the block counters must be back at
// zero), for producer kinds whose warps take 1, 2 or 4 rows; then whole models with the epilogues and
// the attention split kernel's own combine (ROOFLINE_FUSED_INPUTS, ROOFLINE_SPLIT_COMBINE) against the
// separate kernels and the CPU (decode batches against each row alone: gpu_test.cpp). Skipped without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "backend/gpu.h"
#include "core/rng.h"
#include "engine/engine.h"
#include "engine/engine_test_util.h"
#include "engine/random_weight.h"
#include "formats/quant_ref.h"
#include "model/model.h"
#include "test_util.h"

using namespace roofline;

namespace {

using TestWeight = test::RandomWeight;

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

TEST(GpuFusedInputs, GatedEpiloguesMatchTheReferenceAndTheSeparateKernels) {
  SKIP_WITHOUT_GPU();
  Rng rng(43);
  const int64_t cols = 768, mid = 1280, rows_c = 45;
  for (GpuChainForTest kind : {GpuChainForTest::SwiGlu, GpuChainForTest::GeGlu})
    for (DType producer : {DType::Q4_K, DType::Q6_K, DType::Q8_0})
      for (DType consumer : {DType::Q4_K, DType::Q6_K})
        for (int n : {1, 2, 5, 8}) {
          const TestWeight gate(producer, mid, cols, rng), up(producer, mid, cols, rng), c(consumer, rows_c, mid, rng);
          const std::vector<float> a = random_floats((size_t)(n * cols), rng);
          const Weight up_w = up.weight();
          const auto fused = gpu_chained_products_for_test(kind, true, gate.weight(), &up_w, c.weight(), a, {}, {}, n);
          const auto plain = gpu_chained_products_for_test(kind, false, gate.weight(), &up_w, c.weight(), a, {}, {}, n);
          const size_t ny = (size_t)(n * rows_c);
          ASSERT_EQ(fused.size(), 2 * ny);
          const std::vector<double> ad = to_double(a);
          std::vector<double> h((size_t)(n * mid));
          for (int t = 0; t < n; ++t) {
            const std::vector<double> g = gate.times(ad, t), u = up.times(ad, t);
            for (int64_t i = 0; i < mid; ++i) {
              const double x = g[(size_t)i];
              const double act = kind == GpuChainForTest::GeGlu ? 0.5 * x * (1.0 + std::tanh(0.7978845608 * (x + 0.044715 * x * x * x)))
                                                                : x / (1.0 + std::exp(-x));
              h[(size_t)(t * mid + i)] = act * u[(size_t)i];
            }
          }
          std::vector<float> y_ref(ny);
          for (int t = 0; t < n; ++t) {
            const std::vector<double> y = c.times(h, t);
            for (int64_t r = 0; r < rows_c; ++r) y_ref[(size_t)(t * rows_c + r)] = (float)y[(size_t)r];
          }
          const std::string what = std::string(kind == GpuChainForTest::GeGlu ? "GeGLU " : "SwiGLU ") + dtype_name(producer) + " -> " +
                                   dtype_name(consumer) + " n=" + std::to_string(n);
          EXPECT_LT(test::nmse(fused.data(), y_ref.data(), ny), 4e-4) << what;
          // The same formulas and quantization as the separate kernels (the products are compiled apart for
          // the epilogue, so allow their last bits).
          EXPECT_LT(test::nmse(fused.data(), plain.data(), ny), 1e-12) << what << " (against the separate kernel)";
          EXPECT_EQ(0, std::memcmp(fused.data(), fused.data() + ny, ny * 4)) << what << " (second run)";
        }
}

namespace {

// Logits of a prefill chunk, then one-row decode steps (the fused paths), on the GPU with the decode
// epilogues and the split kernel's combine switched on or off (both read when the backend is created).
std::vector<float> gpu_logits(const std::string& spec, bool fused, const std::vector<int32_t>& tokens, bool cpu = false) {
  setenv("ROOFLINE_FUSED_INPUTS", fused ? "1" : "0", 1);
  setenv("ROOFLINE_SPLIT_COMBINE", fused ? "1" : "0", 1);
  EngineOptions o;
  if (!cpu) o.n_gpu_layers = EngineOptions::kGpuLayersAll;
  auto engine = Engine::create(test::tiny(spec), o);
  unsetenv("ROOFLINE_FUSED_INPUTS");
  unsetenv("ROOFLINE_SPLIT_COMBINE");
  return test::prompt_then_decode(*engine, tokens, tokens.size() / 2);
}

}  // namespace

// Whole models (dense Qwen3 and Llama, hybrid Qwen3.5 with DeltaNet layers, Gemma 3's GeGLU, an MoE model
// (the split kernel's combine only), a Q8_0 file): decode with the
// epilogues and the split kernel's combine against the separate kernels and against the CPU.
TEST(GpuFusedInputs, WholeModelsMatchTheSeparateKernelsAndTheCpu) {
  SKIP_WITHOUT_GPU();
  // The split kernel's combine against the combine kernel after the same split kernel (f16 caches would
  // otherwise take the tensor-core decode kernel where the combine is separate).
  struct SplitKernelOnly {
    SplitKernelOnly() { gpu_use_flash_decode_for_test(0); }
    ~SplitKernelOnly() { gpu_use_flash_decode_for_test(-1); }
  } split_kernel;
  for (const char* spec : {"tiny-qwen3:Q4_K_M", "tiny-llama:Q4_K_M", "tiny-qwen35:Q4_K_M", "tiny-gemma3:Q4_K_M", "tiny-qwen3moe:Q4_K_M", "tiny-qwen3:Q8_0"}) {
    const auto tokens = test::some_tokens(24, test::tiny(spec)->hparams().n_vocab);
    const auto fused = gpu_logits(spec, true, tokens), plain = gpu_logits(spec, false, tokens), cpu = gpu_logits(spec, false, tokens, true);
    ASSERT_EQ(fused.size(), plain.size());
    ASSERT_EQ(fused.size(), cpu.size());
    const double e_plain = test::nmse(fused.data(), plain.data(), plain.size()), e_cpu = test::nmse(fused.data(), cpu.data(), cpu.size());
    std::printf("%-20s fused vs separate kernels NMSE %.3g, vs CPU %.3g\n", spec, e_plain, e_cpu);
    EXPECT_LT(e_plain, 1e-6) << spec;
    EXPECT_LT(e_cpu, 2e-3) << spec;
    EXPECT_EQ(fused, gpu_logits(spec, true, tokens)) << spec << ": reproducible";
  }
}
