// The feed-forward block of a one-row decode step in one persistent launch (cuda_decode_ffn.cu): the
// same bits as the separate launches (rms norm, gate/up, SwiGLU, down with the residual add) for Q4_K
// and Q6_K down matrices, over grids of one CTA per SM and of a few CTAs (several 32-row tiles and a
// partial one per CTA), run several times on the same barrier counter; near the double-precision block;
// then whole models with it on and off. Skipped without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "backend/gpu.h"
#include "core/rng.h"
#include "engine/engine.h"
#include "engine/engine_test_util.h"
#include "engine/random_weight.h"
#include "test_util.h"

using namespace roofline;

namespace {

std::vector<float> random_floats(size_t n, Rng& rng, double scale) {
  std::vector<float> v(n);
  for (float& f : v) f = (float)(rng.normal() * scale);
  return v;
}

// x + down(silu(gate(xn)) * up(xn)), xn = x / rms(x) * w, in double over the dequantized weights.
std::vector<float> reference_block(const test::RandomWeight& gate, const test::RandomWeight& up, const test::RandomWeight& down,
                                   const std::vector<float>& w, const std::vector<float>& x, double eps) {
  const size_t n = x.size();
  double ss = 0;
  for (float v : x) ss += (double)v * v;
  const double r = 1.0 / std::sqrt(ss / (double)n + eps);
  std::vector<double> xn(n);
  for (size_t i = 0; i < n; ++i) xn[i] = x[i] * r * w[i];
  const std::vector<double> g = gate.times(xn, 0), u = up.times(xn, 0);
  std::vector<double> h(g.size());
  for (size_t i = 0; i < h.size(); ++i) h[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
  const std::vector<double> y = down.times(h, 0);
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = (float)(x[i] + y[i]);
  return out;
}

}  // namespace

TEST(GpuDecodeFfn, OneLaunchGivesTheBitsOfTheSeparateLaunches) {
  SKIP_WITHOUT_GPU();
  Rng rng(59);
  const float eps = 1e-6f;
  const int repeats = 3;
  struct Shape {
    int64_t n_embd, n_ff;
  };
  // Rows of 2-9 super-blocks in, 3-22 out; a Q4_K down with an odd count of super-blocks.
  for (const Shape shape : {Shape{512, 768}, Shape{1280, 3072}, Shape{2304, 5632}})
    for (DType down_type : {DType::Q4_K, DType::Q6_K}) {
      if (down_type == DType::Q6_K && (shape.n_ff / 256) % 2) continue;  // the kernel copies Q6_K's d in words
      const test::RandomWeight gate(DType::Q4_K, shape.n_ff, shape.n_embd, rng), up(DType::Q4_K, shape.n_ff, shape.n_embd, rng),
          down(down_type, shape.n_embd, shape.n_ff, rng);
      const std::vector<float> x = random_floats((size_t)shape.n_embd, rng, 1.0);
      std::vector<float> w = random_floats((size_t)shape.n_embd, rng, 0.2);
      for (float& v : w) v += 1.0f;
      const auto separate = gpu_decode_ffn_for_test(gate.weight(), up.weight(), down.weight(), w, x, false, 0, repeats, eps);
      ASSERT_EQ(separate.size(), (size_t)(repeats * shape.n_embd));
      const std::vector<float> ref = reference_block(gate, up, down, w, x, eps);
      std::vector<float> y_ref(ref.size()), y_gpu(ref.size());
      for (size_t i = 0; i < ref.size(); ++i) y_ref[i] = ref[i] - x[i], y_gpu[i] = separate[i] - x[i];
      const std::string what = std::to_string(shape.n_embd) + " x " + std::to_string(shape.n_ff) + " down " + dtype_name(down_type);
      EXPECT_LT(test::nmse(y_gpu.data(), y_ref.data(), y_ref.size()), 1e-3) << what << ": the separate launches against double";
      for (int ctas : {0, 1, 3, 7}) {
        const auto one = gpu_decode_ffn_for_test(gate.weight(), up.weight(), down.weight(), w, x, true, ctas, repeats, eps);
        ASSERT_EQ(one.size(), separate.size());
        for (int run = 0; run < repeats; ++run)
          EXPECT_EQ(0, std::memcmp(one.data() + run * shape.n_embd, separate.data() + run * shape.n_embd, shape.n_embd * 4))
              << what << ", " << ctas << " CTAs (0: one per SM), run " << run;
      }
    }
}

// Whole models: one-row decode steps through the persistent block give the logits of the separate
// launches, bit for bit (prompt steps and batches never take it).
TEST(GpuDecodeFfn, WholeModelsGiveTheSameLogitsWithAndWithoutIt) {
  SKIP_WITHOUT_GPU();
  struct Mode {
    explicit Mode(int m) { gpu_use_persistent_ffn_for_test(m); }
    ~Mode() { gpu_use_persistent_ffn_for_test(-1); }
  };
  auto logits = [](const char* spec, int mode, const std::vector<int32_t>& tokens) {
    const Mode m(mode);
    EngineOptions o;
    o.n_gpu_layers = EngineOptions::kGpuLayersAll;
    auto engine = Engine::create(test::tiny(spec), o);
    return test::prompt_then_decode(*engine, tokens, tokens.size() / 2);
  };
  for (const char* spec : {"tiny-qwen3:Q4_K_M", "tiny-llama:Q4_K_M", "tiny-qwen35:Q4_K_M", "tiny-qwen3:Q4_K_S"}) {
    const auto tokens = test::some_tokens(24, test::tiny(spec)->hparams().n_vocab);
    const auto on = logits(spec, 1, tokens), off = logits(spec, 0, tokens);
    ASSERT_EQ(on.size(), off.size()) << spec;
    EXPECT_EQ(on, off) << spec;
  }
}
