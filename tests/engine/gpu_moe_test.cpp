// Mixture-of-experts models (qwen3moe, qwen35moe) on the CUDA backend against the CPU engine (skipped
// without a GPU): device routing and expert products over the stacked tensors, for prompts (steps of
// many rows) and decode steps (buckets replayed as CUDA graphs), full and partial offload; decode
// batches bit-identical to each sequence alone; the chosen experts the same as the CPU's (logits of f32
// models within float rounding, which a different expert in some row would break); the decode router
// kernel's routing against a double reference, and its norm against the norm kernel's bits; the fused down + combine launch's eight-row kernel for short Q4_K
// expert rows against its four-row one, bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "backend/gpu.h"
#include "core/rng.h"
#include "engine/engine.h"
#include "model/model_file.h"
#include "engine/engine_test_util.h"
#include "engine/random_weight.h"
#include "test_util.h"

using namespace roofline;
using test::tiny;
using test::some_tokens;
using test::prompt_then_decode;

TEST(GpuMoeTest, MatchesTheCpuFullAndPartialOffload) {
  SKIP_WITHOUT_GPU();
  struct Case {
    const char* spec;
    int units_all, units_part;  // layers + output; a partial offload (the output and the last layers)
    double bound;
  };
  // F32: the MoE products use f32 activations on both; the prompt's other products go through f16 GEMMs
  // on the GPU (GpuQwen35Test's bound, 1e-4; a changed expert choice would show as ~1e-2). Quantized:
  // the CPU quantizes activations to 8 bits, the GPU's MoE products do not, and a row near a routing tie
  // may pick another expert.
  for (const Case& c : {Case{"tiny-qwen3moe:F32", 3, 2, 1e-4}, Case{"tiny-qwen35moe:F32", 5, 3, 1e-4},
                        Case{"tiny-qwen3moe:Q4_K_M", 3, 2, 3e-2}, Case{"tiny-qwen35moe:Q8_0", 5, 3, 3e-2}}) {
    auto model = tiny(c.spec);
    const auto tokens = some_tokens(60, model->hparams().n_vocab);
    EngineOptions o;
    o.n_ctx = 256;
    o.type_k = o.type_v = DType::F32;
    auto cpu = Engine::create(model, o);
    const auto want = prompt_then_decode(*cpu, tokens, 48);
    for (int units : {c.units_all, c.units_part}) {
      const double e = test::offload_nmse(model, o, units, tokens, 48, want);
      std::printf("%-22s %d units on the GPU: NMSE vs CPU %.3g (bound %.0e)\n", c.spec, units, e, c.bound);
      EXPECT_LT(e, c.bound) << c.spec << " units " << units;
    }
  }
}

TEST(GpuMoeTest, DecodeBatchesAreBitIdenticalToEachSequenceAlone) {
  SKIP_WITHOUT_GPU();
  EngineOptions o;
  o.n_gpu_layers = EngineOptions::kGpuLayersAll;
  o.n_ctx = 512;
  o.n_seq_max = 6;
  for (const char* spec : {"tiny-qwen3moe:Q4_K_M", "tiny-qwen35moe:Q4_K_M"})
    test::expect_decode_batches_match_each_alone(tiny(spec), o, 8, spec);
}

// --cpu-moe / --n-cpu-moe / -ot: the experts of some layers stay in host memory and run on the CPU while
// the rest of each layer runs on the GPU; the logits match the CPU engine's as with every expert on the
// GPU, the report says where the experts went, and the GPU holds fewer weight bytes.
TEST(GpuMoeTest, ExpertsInHostMemoryMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  struct Case {
    const char* spec;
    int n_cpu_moe;
    std::vector<std::string> patterns;
    double bound;
  };
  for (const Case& c : {Case{"tiny-qwen3moe:F32", EngineOptions::kAllLayers, {}, 1e-4}, Case{"tiny-qwen35moe:F32", 1, {}, 1e-4},
                        Case{"tiny-qwen35moe:Q8_0", 0, {"blk\\.[13]\\.ffn_.*_exps"}, 3e-2},
                        Case{"tiny-qwen3moe:Q4_K_M", 0, {"exps"}, 3e-2}}) {
    auto model = tiny(c.spec);
    const auto tokens = some_tokens(40, model->hparams().n_vocab, 5);
    EngineOptions o;
    o.n_ctx = 256;
    o.type_k = o.type_v = DType::F32;
    auto cpu = Engine::create(model, o);
    const auto want = prompt_then_decode(*cpu, tokens, 30);
    o.n_gpu_layers = EngineOptions::kGpuLayersAll;
    auto all_gpu = Engine::create(model, o);
    o.n_cpu_moe = c.n_cpu_moe;
    o.cpu_tensor_patterns = c.patterns;
    auto hybrid = Engine::create(model, o);
    const auto got = prompt_then_decode(*hybrid, tokens, 30);
    ASSERT_EQ(got.size(), want.size());
    const double e = test::nmse(got.data(), want.data(), got.size());
    std::printf("%-22s experts partly in host memory: NMSE vs CPU %.3g (bound %.0e)\n", c.spec, e, c.bound);
    EXPECT_LT(e, c.bound) << c.spec;
    std::string report;
    for (const std::string& line : hybrid->report()) report += line + "\n";
    EXPECT_NE(report.find("MoE experts of"), std::string::npos) << report;
    auto gpu_bytes = [](const Engine& eng) {  // "CUDA0: layers 0..3 + output, 1.7 MiB of weights"
      double n = 0;
      for (const std::string& line : eng.report())
        if (line.rfind("CUDA", 0) == 0) n += std::atof(line.substr(line.rfind(", ") + 2).c_str());
      return n;
    };
    EXPECT_LT(gpu_bytes(*hybrid), gpu_bytes(*all_gpu)) << report;
  }
}

// -ngl auto on a MoE model that does not fit (a --vram-limit a little under its size): the experts of
// the first layers stay in host memory, every unit still goes to the GPU, the report says so, and the
// logits match the CPU's.
TEST(GpuMoeTest, NglAutoKeepsTheFirstLayersExpertsOnTheHostWhenTheModelDoesNotFit) {
  SKIP_WITHOUT_GPU();
  auto model = tiny("tiny-qwen3moe:F32");
  const HParams& hp = model->hparams();
  EngineOptions o;
  o.n_ctx = 256;
  o.type_k = o.type_v = DType::F32;
  o.n_gpu_layers = EngineOptions::kGpuLayersAuto;
  o.gpu_margin_gib = 0;
  double all = 0, experts = 0;
  for (const auto& t : model->file().tensors()) {
    all += (double)t.n_bytes;
    if (t.name.find("_exps") != std::string::npos) experts += (double)t.n_bytes;
  }
  const double work = (double)o.n_batch * (4.0 * hp.n_vocab + 64.0 * hp.n_ff) + 256.0 * 1048576;  // the engine's estimate
  const double kv = 2.0 * o.n_ctx * (hp.kv_dim_k() + hp.kv_dim_v()) * 4 * hp.n_layer + 65536;
  // Half the experts are layer 0's: with them on the host the rest fits, with none it does not.
  o.vram_limit_gib = {(work + all - 0.25 * experts + kv) / 1073741824.0};
  auto engine = Engine::create(model, o);
  std::string report;
  for (const std::string& line : engine->report()) report += line + "\n";
  EXPECT_EQ(engine->gpu_units(), hp.n_layer + 1) << report;
  EXPECT_NE(report.find("-ngl auto: the MoE experts of the first 1 of 2 layers stay in host memory"), std::string::npos) << report;
  const auto tokens = some_tokens(20, hp.n_vocab, 9);
  EngineOptions co;
  co.n_ctx = 256;
  co.type_k = co.type_v = DType::F32;
  auto cpu = Engine::create(model, co);
  const auto want = prompt_then_decode(*cpu, tokens, 12), got = prompt_then_decode(*engine, tokens, 12);
  EXPECT_LT(test::nmse(got.data(), want.data(), got.size()), 1e-4);
}

// A decode step's routing on the device (the f32 router's own kernel; its last CTA routes up to 8 rows,
// more rows take the route kernel) against a double reference: the same experts in the same order
// (larger logit first) and the same weights, for routers held in registers and wider ones (300
// experts), odd widths, k of 1 and 8, renormalised and scaled weights. Every row gets the same bits
// in a step of 1, 3, 8, 9 or 20 rows as in one of 64 (the tail and the route kernel agree), and each
// launch routes again (gpu_moe_route_for_test clears the outputs and runs twice).
TEST(GpuMoeTest, RouterKernelRoutesAsTheReferenceAndTheSameInEveryBatch) {
  SKIP_WITHOUT_GPU();
  if (const char* v = std::getenv("ROOFLINE_MOE_FUSED_ROUTER"); v && std::strcmp(v, "0") == 0)
    GTEST_SKIP() << "ROOFLINE_MOE_FUSED_ROUTER=0 turns the router kernel off";
  Rng rng(23);
  struct Case {
    int n_expert, cols, k;
    bool normalize;
    float scale;
  };
  for (const Case& c : {Case{128, 2048, 8, true, 1.0f}, Case{37, 132, 1, false, 2.5f}, Case{300, 516, 8, false, 1.0f}, Case{60, 4096, 4, true, 1.0f}}) {
    std::vector<float> router((size_t)c.n_expert * c.cols), xn((size_t)64 * c.cols);
    for (float& v : router) v = (float)rng.normal() * 0.05f;
    for (float& v : xn) v = (float)rng.normal();
    std::vector<float> all_w;
    const auto all_ids = gpu_moe_route_for_test(router, c.n_expert, c.cols, xn, 64, c.k, c.normalize, c.scale, &all_w);
    for (int t = 0; t < 64; ++t) {
      std::vector<double> l(c.n_expert);
      double mx = -1e300;
      for (int e = 0; e < c.n_expert; ++e) {
        double s = 0;
        for (int i = 0; i < c.cols; ++i) s += (double)router[(size_t)e * c.cols + i] * xn[(size_t)t * c.cols + i];
        l[e] = s;
        mx = std::max(mx, s);
      }
      double sum = 0;
      for (double v : l) sum += std::exp(v - mx);
      std::vector<int> order(c.n_expert);
      for (int e = 0; e < c.n_expert; ++e) order[e] = e;
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return l[a] > l[b]; });
      double top = 0;
      for (int s = 0; s < c.k; ++s) top += std::exp(l[order[s]] - mx) / sum;
      for (int s = 0; s < c.k; ++s) {
        const size_t p = (size_t)t * c.k + s;
        ASSERT_EQ(all_ids[p], order[s]) << c.n_expert << " experts, row " << t << " pick " << s;
        const double p_ref = std::exp(l[order[s]] - mx) / sum, want = (c.normalize ? p_ref / top : p_ref) * c.scale;
        EXPECT_NEAR(all_w[p], want, 1e-5 * std::abs(want) + 1e-7) << c.n_expert << " experts, row " << t << " pick " << s;
      }
    }
    for (int n : {1, 3, 8, 9, 20}) {
      std::vector<float> w;
      const std::vector<float> part(xn.begin(), xn.begin() + (size_t)n * c.cols);
      const auto ids = gpu_moe_route_for_test(router, c.n_expert, c.cols, part, n, c.k, c.normalize, c.scale, &w);
      const size_t pairs = (size_t)n * c.k;
      EXPECT_TRUE(std::equal(ids.begin(), ids.end(), all_ids.begin())) << c.n_expert << " experts, " << n << " rows";
      EXPECT_EQ(0, std::memcmp(w.data(), all_w.data(), pairs * 4)) << c.n_expert << " experts, " << n << " rows";
    }
  }
}

// The decode router kernel that norms its own input (ROOFLINE_MOE_ROUTER_NORM): the logits, xn and xn's int8 rows
// bit for bit as the norm kernel followed by the router give them, for 1-8 rows, widths whose last float4s or
// 32-element group are partial, and fewer CTAs (experts) than the norm's groups of eight; and near a double
// reference, so that the two cannot agree by both being wrong.
TEST(GpuMoeTest, RouterKernelNormsItsInputWithTheNormKernelsBits) {
  SKIP_WITHOUT_GPU();
  if (const char* v = std::getenv("ROOFLINE_MOE_FUSED_ROUTER"); v && std::strcmp(v, "0") == 0)
    GTEST_SKIP() << "ROOFLINE_MOE_FUSED_ROUTER=0 turns the router kernel off";
  Rng rng(71);
  struct Case {
    int n_expert, cols;
  };
  for (const Case& c : {Case{128, 2048}, Case{37, 132}, Case{2, 516}, Case{60, 4096}, Case{256, 2048}}) {
    std::vector<float> router((size_t)c.n_expert * c.cols), norm_w(c.cols), x((size_t)8 * c.cols);
    for (float& v : router) v = (float)rng.normal() * 0.05f;
    for (float& v : norm_w) v = 1.0f + 0.3f * (float)rng.normal();
    for (float& v : x) v = 3.0f * (float)rng.normal();
    const float eps = 1e-6f;
    for (int n : {1, 2, 5, 8}) {
      const std::vector<float> rows(x.begin(), x.begin() + (size_t)n * c.cols);
      const auto fused = gpu_moe_router_norm_for_test(router, c.n_expert, c.cols, rows, norm_w, eps, n, true);
      const auto apart = gpu_moe_router_norm_for_test(router, c.n_expert, c.cols, rows, norm_w, eps, n, false);
      const size_t n_logits = (size_t)n * c.n_expert, n_values = (size_t)n * c.cols;
      ASSERT_EQ(fused.size(), apart.size());
      ASSERT_EQ(fused.size(), n_logits + n_values + (c.cols % 32 == 0 ? n_values + 2 * (size_t)n * (c.cols / 32) : 0));
      EXPECT_EQ(0, std::memcmp(fused.data(), apart.data(), fused.size() * 4)) << c.n_expert << " x " << c.cols << ", " << n << " rows";
      for (int t = 0; t < n; ++t) {
        double ss = 0;
        for (int i = 0; i < c.cols; ++i) ss += (double)rows[(size_t)t * c.cols + i] * rows[(size_t)t * c.cols + i];
        const double inv = 1.0 / std::sqrt(ss / c.cols + eps);
        std::vector<double> xn(c.cols);
        for (int i = 0; i < c.cols; ++i) {
          xn[i] = rows[(size_t)t * c.cols + i] * inv * norm_w[i];
          ASSERT_NEAR(fused[n_logits + (size_t)t * c.cols + i], xn[i], 1e-5 * std::abs(xn[i]) + 1e-6) << c.cols << " row " << t << " col " << i;
        }
        for (int e = 0; e < c.n_expert; ++e) {
          double l = 0, mag = 0;
          for (int i = 0; i < c.cols; ++i) {
            l += (double)router[(size_t)e * c.cols + i] * xn[i];
            mag += std::abs((double)router[(size_t)e * c.cols + i] * xn[i]);
          }
          EXPECT_NEAR(fused[(size_t)t * c.n_expert + e], l, 1e-5 * mag + 1e-6) << c.cols << " row " << t << " expert " << e;
        }
      }
    }
  }
}

// The fused MoE down + combine of decode steps: the eight-row kernel for Q4_K experts of 1-4 super-blocks a row (one
// row per lane group, ROOFLINE_MOE_DOWN_SHORT=1) gives the four-row kernel's bits, for one and two rows of 3 of 5
// experts over 67 output rows (a short last CTA), and the double reference's values within the int8 inputs' error.
TEST(GpuMoeTest, ShortExpertRowsTakeTheEightRowKernelWithTheSameBits) {
  SKIP_WITHOUT_GPU();
  Rng rng(53);
  const int n_expert = 5, k = 3;
  const int64_t rows = 67;
  for (const int64_t cols : {256, 512, 768, 1024}) {
    const test::RandomWeight down(DType::Q4_K, n_expert * rows, cols, rng);
    for (const int n_rows : {1, 2}) {
      const size_t pairs = (size_t)n_rows * k;
      std::vector<float> h(pairs * (size_t)cols), weights(pairs);
      std::vector<int32_t> ids(pairs);
      for (float& v : h) v = (float)rng.normal();
      for (size_t p = 0; p < pairs; ++p) {
        ids[p] = (int32_t)((p * 2 + (size_t)cols / 256) % n_expert);
        weights[p] = 0.2f + 0.6f * (float)rng.uniform();
      }
      const std::vector<float> four = gpu_moe_down_combine_for_test(down.weight(), n_expert, h, ids, weights, n_rows, k, false);
      const std::vector<float> eight = gpu_moe_down_combine_for_test(down.weight(), n_expert, h, ids, weights, n_rows, k, true);
      ASSERT_EQ(four.size(), (size_t)(n_rows * rows));
      ASSERT_EQ(eight.size(), four.size());
      EXPECT_EQ(0, std::memcmp(four.data(), eight.data(), four.size() * sizeof(float))) << "cols " << cols << ", " << n_rows << " rows";
      // The reference: the experts' dequantized rows times the float inputs, weighted.
      std::vector<float> ref((size_t)(n_rows * rows));
      for (int t = 0; t < n_rows; ++t)
        for (int64_t r = 0; r < rows; ++r) {
          double sum = 0;
          for (int s = 0; s < k; ++s) {
            const size_t p = (size_t)(t * k + s);
            const float* w = down.values.data() + (size_t)((ids[p] * rows + r) * cols);
            double dot = 0;
            for (int64_t c = 0; c < cols; ++c) dot += (double)w[c] * (double)h[p * (size_t)cols + (size_t)c];
            sum += (double)weights[p] * dot;
          }
          ref[(size_t)(t * rows + r)] = (float)sum;
        }
      EXPECT_LT(test::nmse(eight.data(), ref.data(), ref.size()), 2e-4) << "cols " << cols << ", " << n_rows << " rows";
    }
  }
}
