// Gemma 3 on the CUDA backend against the CPU engine and the double reference (skipped without a GPU):
// scaled embeddings, post norms, GeGLU, per-layer RoPE bases and sliding-window masking in the decode
// (split) and prefill (tensor-core) attention, with prompts longer than the window in one step and in
// chunks, small prefill key tiles (the window's first key inside a tile, tiles wholly before a row's
// window), full and partial offload (both devices keep sliding layers in rings per sequence: the GPU
// addresses them through per-sequence ring tables), rings that wrap, the memory report, forks and
// prefix reuse.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

#include <fmt/format.h>
#include "backend/gpu.h"
#include "engine/engine.h"
#include "engine/reference_forward.h"
#include "model/model_file.h"
#include "engine/engine_test_util.h"
#include "test_util.h"

using namespace roofline;
using test::tiny;
using test::some_tokens;
using test::prompt_then_decode;

TEST(GpuGemma3Test, MatchesTheCpuAndTheReference) {
  SKIP_WITHOUT_GPU();
  for (const char* spec : {"tiny-gemma3:F32", "tiny-gemma3:Q8_0", "tiny-gemma3:Q4_K_M"}) {
    auto model = tiny(spec);
    const int n_vocab = model->hparams().n_vocab;
    const auto tokens = some_tokens(90, n_vocab);  // window 8: most keys are outside it
    EngineOptions o;
    o.n_ctx = 512;
    o.type_k = o.type_v = DType::F32;
    auto cpu = Engine::create(model, o);
    const auto want = prompt_then_decode(*cpu, tokens, 78);
    // Units: 8 layers + output. 9 = all; 4 = the output and layers 5 (global) to 7 on the GPU.
    for (int units : {9, 4}) {
      for (int n_batch : {512, 13}) {  // the prompt in one step, or in chunks that start mid-window
        o.n_batch = n_batch;
        const double e = test::offload_nmse(model, o, units, tokens, 78, want);
        std::printf("%-20s %d units on the GPU, n_batch %d: NMSE vs CPU %.3g\n", spec, units, n_batch, e);
        EXPECT_LT(e, std::string(spec).find("F32") != std::string::npos ? 1e-4 : 5e-3) << spec << " units " << units;
      }
    }
    if (std::string(spec).find("F32") != std::string::npos) {  // and the double reference directly
      o.n_gpu_layers = EngineOptions::kGpuLayersAll;
      o.n_batch = 512;
      auto gpu = Engine::create(model, o);
      const auto got = prompt_then_decode(*gpu, tokens, 78);
      test::ReferenceForward ref(*model);
      double worst = 0;
      for (size_t i = 0; i < tokens.size(); ++i) {
        const auto r = ref.step(tokens[i]);
        std::vector<float> rf(r.begin(), r.end());
        worst = std::max(worst, test::nmse(got.data() + i * n_vocab, rf.data(), n_vocab));
      }
      std::printf("tiny-gemma3:F32 GPU vs reference: worst row NMSE %.3g\n", worst);
      EXPECT_LT(worst, 1e-4);
    }
  }
}

// Small prefill key tiles: a chunk's keys start at its first row's window, tiles can hold no key of a
// later row's window (its softmax state stays empty until one does).
TEST(GpuGemma3Test, SmallPrefillKeyTiles) {
  SKIP_WITHOUT_GPU();
  setenv("ROOFLINE_ATTN_KEY_TILE", "32", 1);
  auto model = tiny("tiny-gemma3:F32");
  const auto tokens = some_tokens(150, model->hparams().n_vocab, 3);
  EngineOptions o;
  o.n_ctx = 512;
  o.type_k = o.type_v = DType::F32;
  auto cpu = Engine::create(model, o);
  const auto want = prompt_then_decode(*cpu, tokens, 140);
  o.n_gpu_layers = EngineOptions::kGpuLayersAll;
  auto gpu = Engine::create(model, o);
  const auto got = prompt_then_decode(*gpu, tokens, 140);
  unsetenv("ROOFLINE_ATTN_KEY_TILE");
  const double e = test::nmse(got.data(), want.data(), got.size());
  std::printf("tiny-gemma3:F32 key tile 32: NMSE vs CPU %.3g\n", e);
  EXPECT_LT(e, 1e-4);
}

// A fork and a reused prefix on the GPU continue as fresh sequences do. Prefix reuse restores a window
// snapshot kept in pinned host memory into another sequence's ring: with blocks of 4 and steps of 4 the ring
// is 3 blocks and the snapshot at 28 (blocks 5 and 6) wraps it; with 4 units the first sliding layers stay
// on the CPU, whose backend keeps its own snapshots.
TEST(GpuGemma3Test, ForksAndPrefixReuse) {
  SKIP_WITHOUT_GPU();
  auto model = tiny("tiny-gemma3:Q8_0");
  const int n_vocab = model->hparams().n_vocab;
  struct Case {
    int block_size, n_batch, units, reused;
  };
  for (const Case c : {Case{16, 512, 9, 16}, Case{4, 4, 9, 28}, Case{4, 4, 4, 28}}) {
    SCOPED_TRACE(fmt::format("blocks of {}, steps of {}, {} units", c.block_size, c.n_batch, c.units));
    EngineOptions o;
    o.n_gpu_layers = c.units;
    o.kv_block_size = c.block_size;
    o.n_batch = c.n_batch;
    o.n_seq_max = 3;
    o.n_state_snapshots = 2;
    auto engine = Engine::create(model, o);
    SequenceMemory& mem = engine->memory();
    ASSERT_TRUE(mem.windowed());
    const auto prompt = some_tokens(30, n_vocab, 5);
    const int s = mem.create_sequence();
    engine->eval(s, prompt, false);
    mem.cache_blocks(s, prompt);  // a window snapshot at the last boundary
    ASSERT_EQ(mem.n_state_snapshots(), 1);
    const int f = engine->fork_sequence(s);
    const auto tail = some_tokens(6, n_vocab, 6);
    const auto lf = engine->eval(f, tail, true);
    auto fresh = Engine::create(model, o);
    std::vector<int32_t> full = prompt;
    full.insert(full.end(), tail.begin(), tail.end());
    const int q = fresh->memory().create_sequence();
    const auto want = fresh->eval(q, full, true);
    fresh->memory().free_sequence(q);
    EXPECT_LT(test::nmse(lf.data(), want.data() + prompt.size() * n_vocab, lf.size()), 5e-3);  // decode-sized vs GEMM paths
    mem.free_sequence(f);
    mem.free_sequence(s);
    const int t = mem.create_sequence();
    ASSERT_EQ(mem.adopt_prefix(t, full, 100), c.reused);
    const auto got = engine->eval(t, std::vector<int32_t>(full.begin() + c.reused, full.end()), true);
    EXPECT_LT(test::nmse(got.data(), want.data() + (size_t)c.reused * n_vocab, got.size()), 5e-3);
  }
}

// On the GPU too the paged cache holds only the global layer; the rings are reported per sequence.
TEST(GpuGemma3Test, SlidingLayersKeepOnlyTheirWindowOnTheGpu) {
  SKIP_WITHOUT_GPU();
  auto model = tiny("tiny-gemma3:Q8_0");
  EngineOptions o;
  o.n_gpu_layers = EngineOptions::kGpuLayersAll;
  o.n_ctx = 4096;
  o.n_batch = 8;
  o.n_seq_max = 2;
  auto engine = Engine::create(model, o);
  std::string report;
  for (const auto& line : engine->report()) report += line + "\n";
  EXPECT_NE(report.find("(1 of 8 layers keep a KV cache)"), std::string::npos) << report;
  EXPECT_NE(report.find("sliding-window KV: 7 layers keep the last 8 positions (32 with a step's tokens)"), std::string::npos)
      << report;
  // A long sequence decoded one token at a time wraps the 32-position rings many times.
  const auto tokens = some_tokens(200, model->hparams().n_vocab, 9);
  EngineOptions c = o;
  c.n_gpu_layers = 0;
  auto cpu = Engine::create(model, c);
  const auto want = prompt_then_decode(*cpu, tokens, 150);
  const auto got = prompt_then_decode(*engine, tokens, 150);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_LT(test::nmse(got.data(), want.data(), got.size()), 5e-3);
}
