// f16 copies of the GPU weights for prompt steps (--f16-copies, backend/cuda/cuda_f16_copies.cuh): the
// product on a copy against the double reference and against the dequantize-then-multiply path it
// replaces, the engine's logits with copies and without, the report, and `on` refusing what cannot fit.
// Skipped where no GPU is present (CI); run on the GPU machine with --gtest_filter='Gpu*'.
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <string>

#include "backend/gpu.h"
#include "core/error.h"
#include "core/rng.h"
#include "engine/engine.h"
#include "engine/engine_test_util.h"
#include "engine/random_weight.h"
#include "test_util.h"

using namespace roofline;
using test::some_tokens;
using test::tiny;

namespace {

struct MinRows {
  explicit MinRows(int rows) { gpu_set_f16_copy_min_rows_for_test(rows); }
  ~MinRows() { gpu_set_f16_copy_min_rows_for_test(0); }
};

EngineOptions on_gpu(F16Copies copies) {
  EngineOptions o;
  o.n_gpu_layers = EngineOptions::kGpuLayersAll;
  o.f16_copies = copies;
  return o;
}

bool has_line(const std::vector<std::string>& report, const std::string& part) {
  for (const std::string& line : report)
    if (line.find(part) != std::string::npos) return true;
  return false;
}

}  // namespace

// Every weight type the prompt path dequantizes, at prompt sizes (65+ rows) and, with
// the copies from 9 rows, at batched-decode sizes. The copy holds the values the dequantization writes
// and the whole matrix is one cuBLAS product either way (the test's scratch holds it), so the two paths agree
// to the bit from 65 rows; below that the copy replaces the fused kernel, and only the reference bound holds.
TEST(GpuMatmulTest, F16CopyProductsMatchTheReference) {
  SKIP_WITHOUT_GPU();
  Rng rng(41);
  for (DType type : {DType::Q4_K, DType::Q6_K, DType::Q8_0, DType::Q5_K, DType::F16, DType::BF16, DType::F32})
    for (int n : {16, 65, 130}) {
      const MinRows min_rows(n < 65 ? 9 : 65);
      const int64_t rows = 75, cols = type == DType::Q8_0 || type == DType::F16 || type == DType::BF16 || type == DType::F32 ? 320 : 768;
      test::RandomWeight w(type, rows, cols, rng);
      std::vector<float> x((size_t)(n * cols));
      for (float& v : x) v = (float)rng.normal();
      const int64_t calls = gpu_f16_copy_gemm_calls_for_test();
      const auto with_copy = gpu_matmul_for_test(w.weight(), x, n, 0, true);
      EXPECT_EQ(gpu_f16_copy_gemm_calls_for_test(), calls + 1) << dtype_name(type) << " n=" << n;
      const auto plain = gpu_matmul_for_test(w.weight(), x, n, 0, false);
      std::vector<float> ref((size_t)(n * rows));
      for (int t = 0; t < n; ++t) {
        const std::vector<double> yt = w.times(x, t);
        for (int64_t r = 0; r < rows; ++r) ref[(size_t)(t * rows + r)] = (float)yt[(size_t)r];
      }
      EXPECT_LT(test::nmse(with_copy.data(), ref.data(), ref.size()), 2e-6) << dtype_name(type) << " n=" << n;
      if (n >= 65) { EXPECT_EQ(with_copy, plain) << dtype_name(type) << " n=" << n; }
    }
}

// Whole models with copies (auto) and without: prompts of several lengths, a step mixing a prompt run with
// decode rows, a batched-decode step, decode steps. The copies hold what the prompt path's dequantization
// writes, so the logits are bit-identical (a 40-row step, fused kernel against copy, agrees to f16 rounding); the report says what was kept. A model with post-norms (Gemma 3),
// one of Q8_0 weights, a hybrid Qwen3.5 (the DeltaNet projections take copies too) and
// an MoE model (its attention takes copies, its stacked experts keep their kernels).
TEST(GpuEngineTest, F16CopiesGiveTheSameLogits) {
  SKIP_WITHOUT_GPU();
  for (const char* name : {"tiny-qwen3:Q4_K_M", "tiny-qwen3:Q8_0", "tiny-gemma3:Q8_0", "tiny-qwen35:Q4_K_M", "tiny-qwen3moe:Q4_K_M"}) {
    SCOPED_TRACE(name);
    auto model = tiny(name);
    const auto tokens = some_tokens(700, model->hparams().n_vocab, 17);
    std::vector<std::string> report;
    std::vector<float> batched;
    auto run = [&](F16Copies copies) {
      auto e = Engine::create(model, on_gpu(copies));
      report = e->report();
      const int sa = e->memory().create_sequence(), sb = e->memory().create_sequence();
      auto out = e->eval(sa, std::span<const int32_t>(tokens.data(), 100), true);
      auto add = [&](std::vector<float> more) { out.insert(out.end(), more.begin(), more.end()); };
      add(e->eval(sa, std::span<const int32_t>(tokens.data() + 100, 300), true));
      add(e->eval(sb, std::span<const int32_t>(tokens.data() + 400, 150), true));
      std::vector<Engine::BatchRow> rows = {{sa, tokens[550], true}};
      for (int i = 0; i < 90; ++i) rows.push_back({sb, tokens[(size_t)(560 + i)], true});
      add(e->decode(rows));
      rows.clear();
      for (int i = 0; i < 20; ++i) rows.push_back({sa, tokens[(size_t)(651 + i)], true});
      add(e->decode(rows));
      add(e->eval(sa, std::span<const int32_t>(tokens.data() + 671, 1), false));
      // A batched-decode step of 40 rows: the copies from 33 rows (f16_copy_min_rows), the fused kernel without.
      rows.clear();
      for (int i = 0; i < 20; ++i) rows.push_back({sa, tokens[(size_t)(672 + i)], true});
      for (int i = 0; i < 20; ++i) rows.push_back({sb, tokens[(size_t)(672 + i)], true});
      batched = e->decode(rows);
      return out;
    };
    const int64_t calls0 = gpu_f16_copy_gemm_calls_for_test();
    const auto plain = run(F16Copies::Off);
    const auto plain_batched = batched;
    EXPECT_EQ(gpu_f16_copy_gemm_calls_for_test(), calls0);
    EXPECT_FALSE(has_line(report, "f16 copies"));
    const auto copied = run(F16Copies::Auto);
    ASSERT_EQ(plain_batched.size(), batched.size());
    // The fused kernel rounds each weight to f16 through its own half arithmetic (d * sc, then q * scale - min),
    // the dequantization (and so the copy) through its own: f16 weights that differ in the last bit here and there.
    EXPECT_LT(test::nmse(batched.data(), plain_batched.data(), batched.size()), 2e-5);
    EXPECT_GT(gpu_f16_copy_gemm_calls_for_test(), calls0);
    EXPECT_TRUE(has_line(report, "f16 copies of ")) << "the report names the copies";
    ASSERT_EQ(plain.size(), copied.size());
    EXPECT_EQ(plain, copied);
  }
}

// `on` takes a copy of every matrix; a cap (--f16-copies GIB) keeps the copies that fit under it, in layer
// order, and the products of the rest dequantize as before: the same logits again. A cap below every
// matrix keeps none and says so. Deferred copies (serve, run and bench with a draft) come when asked, once.
TEST(GpuEngineTest, F16CopiesUnderACap) {
  SKIP_WITHOUT_GPU();
  auto model = tiny("tiny-qwen3:Q4_K_M");
  const auto tokens = some_tokens(300, model->hparams().n_vocab, 3);
  std::vector<std::string> report;
  auto run = [&](F16Copies copies, double max_gib) {
    EngineOptions o = on_gpu(copies);
    o.f16_copies_max_gib = max_gib;
    auto e = Engine::create(model, o);
    report = e->report();
    const int seq = e->memory().create_sequence();
    return e->eval(seq, std::span<const int32_t>(tokens.data(), tokens.size()), true);
  };
  const auto plain = run(F16Copies::Off, 0);
  const auto all = run(F16Copies::On, 0);
  std::string all_line;
  for (const std::string& line : report)
    if (line.find("f16 copies of ") != std::string::npos) all_line = line;
  ASSERT_FALSE(all_line.empty());
  EXPECT_EQ(all_line.find("would need"), std::string::npos) << all_line;  // every matrix has one
  EXPECT_EQ(plain, all);
  // The tiny model's layer matrices are tens of KiB to a few hundred: 1 MiB holds some, not all.
  const auto some = run(F16Copies::Auto, 1.0 / 1024);
  EXPECT_TRUE(has_line(report, "would need")) << "a capped run names what all would need";
  EXPECT_EQ(plain, some);
  const auto none = run(F16Copies::Auto, 1e-9);
  EXPECT_TRUE(has_line(report, "no f16 copies"));
  EXPECT_EQ(plain, none);
  // Deferred (a draft engine loads first): none until keep_f16_copies(), which makes them once.
  EngineOptions o = on_gpu(F16Copies::Auto);
  o.defer_f16_copies = true;
  auto e = Engine::create(model, o);
  EXPECT_FALSE(has_line(e->report(), "f16 copies"));
  const auto lines = e->keep_f16_copies();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("f16 copies of "), std::string::npos);
  EXPECT_TRUE(has_line(e->report(), "f16 copies of "));
  EXPECT_TRUE(e->keep_f16_copies().empty());
  const int64_t calls = gpu_f16_copy_gemm_calls_for_test();
  const int seq = e->memory().create_sequence();
  EXPECT_EQ(e->eval(seq, std::span<const int32_t>(tokens.data(), tokens.size()), true), plain);
  EXPECT_GT(gpu_f16_copy_gemm_calls_for_test(), calls);
}
