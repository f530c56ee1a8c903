// Qwen3.5 on the CUDA backend against the CPU engine (skipped without a GPU): gated attention and
// Gated DeltaNet layers, full and partial offload (mixed layer kinds on both devices), prompt chunks
// that take the chunked (tensor-core) form of the delta rule, decode buckets replayed as CUDA graphs
// with the sequences' states in their cells, batch invariance among decode steps, and forks and
// prefix reuse that copy states on the GPU.
#include <gtest/gtest.h>

#include <cstring>

#include "backend/gpu.h"
#include "engine/engine.h"
#include "model/model_file.h"
#include "engine/engine_test_util.h"
#include "test_util.h"

using namespace roofline;
using test::tiny;
using test::some_tokens;
using test::prompt_then_decode;

TEST(GpuQwen35Test, MatchesTheCpuFullAndPartialOffload) {
  SKIP_WITHOUT_GPU();
  for (const char* spec : {"tiny-qwen35:F32", "tiny-qwen35:Q8_0", "tiny-qwen35:Q4_K_M"}) {
    auto model = tiny(spec);
    const auto tokens = some_tokens(112, model->hparams().n_vocab);
    EngineOptions o;
    o.n_ctx = 512;
    o.type_k = o.type_v = DType::F32;
    auto cpu = Engine::create(model, o);
    const auto want = prompt_then_decode(*cpu, tokens, 100);
    // Units: 4 layers + output. 5 = all, 3 = the output and the last two layers (one of each kind).
    for (int units : {5, 3}) {
      const double e = test::offload_nmse(model, o, units, tokens, 100, want);
      std::printf("%-20s %d units on the GPU: NMSE vs CPU %.3g\n", spec, units, e);
      // Measured on the H200: see docs/performance.md (prefill rows go through f16 GEMMs and the
      // tf32 delta rule; quantized files add the CPU's int8 activation rounding).
      EXPECT_LT(e, std::string(spec).find("F32") != std::string::npos ? 1e-4 : 5e-3) << spec << " units " << units;
    }
  }
}

TEST(GpuQwen35Test, DecodeBatchesAreBitIdenticalToEachSequenceAlone) {
  SKIP_WITHOUT_GPU();
  EngineOptions o;
  o.n_gpu_layers = EngineOptions::kGpuLayersAll;
  o.n_ctx = 1024;
  o.n_seq_max = 6;
  // Together: one decode row of each of the 5 sequences per step (bucket of 8, one graph replayed).
  test::expect_decode_batches_match_each_alone(tiny("tiny-qwen35:Q4_K_M"), o, 10, "tiny-qwen35:Q4_K_M");
}

TEST(GpuQwen35Test, ForksAndPrefixReuseCopyStatesOnTheGpu) {
  SKIP_WITHOUT_GPU();
  auto model = tiny("tiny-qwen35:Q8_0");
  const int n_vocab = model->hparams().n_vocab;
  EngineOptions o;
  o.n_gpu_layers = EngineOptions::kGpuLayersAll;
  o.kv_block_size = 16;
  o.n_seq_max = 3;
  o.n_state_snapshots = 2;
  auto engine = Engine::create(model, o);
  SequenceMemory& mem = engine->memory();
  const auto prompt = some_tokens(40, n_vocab, 3), tail = some_tokens(6, n_vocab, 9);
  const int s = mem.create_sequence();
  engine->eval(s, std::span<const int32_t>(prompt.data(), 32), false);  // a snapshot at 32
  engine->eval(s, std::span<const int32_t>(prompt.data() + 32, 8), false);
  const int f = engine->fork_sequence(s);
  const auto via_fork = engine->eval(f, tail, true);
  const auto via_parent = engine->eval(s, tail, true);
  EXPECT_EQ(0, std::memcmp(via_fork.data(), via_parent.data(), via_fork.size() * sizeof(float))) << "decode rows alone: same bits";
  mem.cache_blocks(s, prompt);
  mem.free_sequence(s);
  mem.free_sequence(f);
  const int t = mem.create_sequence();
  ASSERT_EQ(mem.adopt_prefix(t, prompt, 100), 32);
  std::vector<int32_t> rest(prompt.begin() + 32, prompt.end());
  rest.insert(rest.end(), tail.begin(), tail.end());
  const auto resumed = engine->eval(t, rest, true);
  auto fresh = Engine::create(model, o);
  std::vector<int32_t> full = prompt;
  full.insert(full.end(), tail.begin(), tail.end());
  const auto want = fresh->eval(fresh->memory().create_sequence(), full, true);
  const double e = test::nmse(resumed.data(), want.data() + 32 * (size_t)n_vocab, resumed.size());
  std::printf("resumed from a GPU snapshot vs a fresh evaluation: NMSE %.3g\n", e);
  EXPECT_LT(e, 1e-3);  // the same maths; the fresh run's prompt takes other (f16 GEMM) paths
}
