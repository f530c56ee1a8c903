// -sm row on GPUs through the engine: two ranks on one GPU (gpu_ids {0, 0}: each rank its own backend,
// stream and KV heads; the peer reducer sums through device memory, as it would over peer access) give
// the logits of one GPU within the GPU tests' bound, in prompt and decode steps (CUDA graphs), behind CPU
// layers, and for several sequences at once; on a machine with two GPUs, the same over NCCL. Two ranks on one GPU
// wait for each other on the device, so run these with CUDA_MODULE_LOADING=EAGER (the device scripts do; the
// roofline binary sets it when -dev lists a GPU twice): a kernel loaded lazily by one rank can wait for the other's.
#include <gtest/gtest.h>

#include <cstdio>
#include <span>

#include "backend/nccl.h"
#include "core/error.h"
#include "engine/engine_test_util.h"
#include "test_util.h"

using namespace roofline;
using namespace roofline::test;

namespace {

std::vector<float> run_logits(std::shared_ptr<const Model> model, const EngineOptions& o, const std::vector<int32_t>& tokens) {
  auto engine = Engine::create(model, o);
  // Two sequences: a prompt each, then decode steps of both in one batch.
  const int a = engine->memory().create_sequence(), b = engine->memory().create_sequence();
  const size_t split = tokens.size() / 2;
  auto out = engine->eval(a, std::span<const int32_t>(tokens.data(), split), true);
  auto more = engine->eval(b, std::span<const int32_t>(tokens.data() + 1, split), true);
  out.insert(out.end(), more.begin(), more.end());
  for (size_t i = split; i < tokens.size(); ++i) {
    std::vector<Engine::BatchRow> batch(2);
    batch[0].seq = a, batch[0].token = tokens[i], batch[0].want_logits = true;
    batch[1].seq = b, batch[1].token = tokens[tokens.size() - 1 - i], batch[1].want_logits = true;
    const Engine::StepOutput& s = engine->step(batch);
    for (const float* l : s.logits) out.insert(out.end(), l, l + model->hparams().n_vocab);
  }
  return out;
}

EngineOptions row_split(std::vector<int> gpus, int ngl = EngineOptions::kGpuLayersAll) {
  EngineOptions o;
  o.n_gpu_layers = ngl;
  o.split_mode = EngineOptions::SplitMode::Row;
  o.gpu_ids = std::move(gpus);
  return o;
}

}  // namespace

TEST(GpuTensorParallelTest, TwoRanksOnOneGpuMatchOneGpu) {
  SKIP_WITHOUT_GPU();
  for (const char* spec : {"tiny-qwen3:Q8_0", "tiny-qwen3:F16", "tiny-llama:Q8_0", "tiny-qwen2:Q4_0", "tiny-gemma3:Q8_0",
                           "qwen3-0.6b:Q4_K_M"}) {
    auto model = tiny(spec);
    const auto tokens = some_tokens(24, model->hparams().n_vocab, 2);
    EngineOptions one;
    one.n_gpu_layers = EngineOptions::kGpuLayersAll;
    one.gpu_ids = {0};
    const auto ref = run_logits(model, one, tokens);
    for (const std::vector<double>& ts : {std::vector<double>{1, 1}, std::vector<double>{2, 1}}) {
      EngineOptions o = row_split({0, 0});
      o.tensor_split = ts;
      auto engine = Engine::create(model, o);
      bool row = false;
      for (const std::string& line : engine->report()) row = row || line.find("split by row") != std::string::npos;
      EXPECT_TRUE(row) << spec;
      const auto got = run_logits(model, o, tokens);
      ASSERT_EQ(got.size(), ref.size());
      const double e = nmse(got.data(), ref.data(), ref.size());
      std::printf("%-20s -sm row -ts %g,%g on one GPU: NMSE against one GPU %.3g\n", spec, ts[0], ts[1], e);
      EXPECT_LT(e, 2e-3) << spec;
    }
  }
  // Behind CPU layers (partial offload): the last layer and the output layer split.
  auto model = tiny("tiny-qwen3:Q8_0");
  const auto tokens = some_tokens(16, model->hparams().n_vocab, 4);
  EngineOptions one;
  one.n_gpu_layers = 2;
  one.gpu_ids = {0};
  const auto ref = run_logits(model, one, tokens);
  const auto got = run_logits(model, row_split({0, 0}, 2), tokens);
  EXPECT_LT(nmse(got.data(), ref.data(), ref.size()), 2e-3);
}

TEST(GpuTensorParallelTest, WhatItCannotSplitIsOneLine) {
  SKIP_WITHOUT_GPU();
  for (const char* spec : {"tiny-qwen3moe:Q8_0", "tiny-qwen35:Q8_0"}) {
    try {
      Engine::create(tiny(spec), row_split({0, 0}));
      ADD_FAILURE() << spec << " was split";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("-sm row does not split"), std::string::npos) << e.what();
    }
  }
  // NCCL cannot have one GPU twice.
  ::setenv("ROOFLINE_TP_COMM", "nccl", 1);
  EXPECT_THROW(Engine::create(tiny("tiny-qwen3:Q8_0"), row_split({0, 0})), Error);
  ::unsetenv("ROOFLINE_TP_COMM");
}

TEST(GpuTensorParallelTest, TwoGpusOverNcclMatchOneGpu) {
  SKIP_WITHOUT_GPU();
  if (gpu_devices().size() < 2) GTEST_SKIP() << "needs two GPUs";
  auto model = tiny("qwen3-0.6b:Q4_K_M");
  const auto tokens = some_tokens(40, model->hparams().n_vocab);
  EngineOptions one;
  one.n_gpu_layers = EngineOptions::kGpuLayersAll;
  one.gpu_ids = {0};
  const auto ref = run_logits(model, one, tokens);
  const auto got = run_logits(model, row_split({0, 1}), tokens);
  const double e = nmse(got.data(), ref.data(), ref.size());
  std::printf("qwen3-0.6b:Q4_K_M -sm row over GPUs 0 and 1 (NCCL): NMSE against one GPU %.3g\n", e);
  EXPECT_LT(e, 2e-3);
}

// The NCCL reducer through the real library (the wheel on the GPU machine), on one GPU: loading, the bound
// entry points, and an all-reduce captured into a CUDA graph. Skipped where NCCL is not installed.
TEST(GpuTensorParallelTest, NcclAllReduceOnOneGpu) {
  SKIP_WITHOUT_GPU();
  try {
    (void)nccl::api();
  } catch (const Error& e) {
    GTEST_SKIP() << e.what();
  }
  std::printf("NCCL: %s (version %d)\n", nccl::api().path.c_str(), nccl::api().version);
  std::vector<float> x(5 * 1031);
  for (size_t i = 0; i < x.size(); ++i) x[i] = (float)i * 0.25f - 100.0f;
  EXPECT_EQ(gpu_nccl_sum_for_test(x, 0, false), x);
  EXPECT_EQ(gpu_nccl_sum_for_test(x, 0, true), x);
}
