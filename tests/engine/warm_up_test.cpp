// The serve warm-up (engine/warm_up.h): it runs to the end where the slots allow, never leaves a
// sequence, block or recurrent state behind, and says so where a step could not run.
#include <gtest/gtest.h>

#include <utility>
#include <vector>

#include "engine/warm_up.h"
#include "engine_test_util.h"

namespace roofline {
namespace {

EngineOptions cpu_options(int n_seq_max) {
  EngineOptions o;
  o.n_ctx = 1024;
  o.n_batch = 512;  // the longest prompt step: 256 rows (a quarter of the context); shorter ones: 64 and 16
  o.n_threads = 2;
  o.n_seq_max = n_seq_max;
  return o;
}

// Every sequence state is free again: n_seq_max sequences can be made at once, and no block is held.
void expect_memory_free(Engine& engine, int n_seq_max) {
  SequenceMemory& mem = engine.memory();
  EXPECT_EQ(mem.used_blocks(), 0);
  std::vector<int> seqs;
  for (int i = 0; i < n_seq_max; ++i) EXPECT_NO_THROW(seqs.push_back(mem.create_sequence(false))) << i;
  for (int s : seqs) mem.free_sequence(s);
}

TEST(WarmUpTest, RunsEveryStepWithOneRecurrentStatePerSlot) {
  // A hybrid model keeps a recurrent state per live sequence; one slot gives it one state, so the
  // shorter prompts' sequences must be gone before the next one is made.
  auto engine = Engine::create(test::tiny("tiny-qwen35:Q4_K_M"), cpu_options(1));
  EXPECT_TRUE(warm_up(*engine, {.n_parallel = 1, .shorter_prompts = true, .graph_depths = {1, 40}}));
  expect_memory_free(*engine, 1);
  EXPECT_TRUE(warm_up(*engine, {.n_parallel = 1, .shorter_prompts = false}));
  expect_memory_free(*engine, 1);
}

TEST(WarmUpTest, WalksTheGraphDepthsWithEachRowCountUpToTheSlots) {
  auto engine = Engine::create(test::tiny("tiny-qwen3:Q4_K_M"), cpu_options(4));
  using Steps = std::vector<std::pair<int, int>>;  // (rows, the deepest row's keys)
  Steps steps;
  // Three slots: steps of 1, 2 and 3 rows at each depth; 2000 keys do not fit a context of 1024.
  EXPECT_TRUE(warm_up(*engine, {.n_parallel = 3,
                                .graph_depths = {1, 33, 65, 2000},
                                .on_decode_step = [&](int rows, int keys) { steps.push_back({rows, keys}); }}));
  // First the decode steps of 1 and 2 rows on the longest prompt (256 tokens), then the walk: the deepest row
  // sees each depth's keys in the one-row step, and one key more in each step after it.
  const Steps want{{1, 257}, {2, 258}, {1, 1}, {2, 2}, {3, 3}, {1, 33}, {2, 34}, {3, 35}, {1, 65}, {2, 66}, {3, 67}};
  EXPECT_EQ(steps, want);
  expect_memory_free(*engine, 4);
  // Depths past max_walk_keys are left to the requests that reach them.
  steps.clear();
  EXPECT_TRUE(warm_up(*engine, {.n_parallel = 1,
                                .graph_depths = {1, 33, 65},
                                .max_walk_keys = 40,
                                .on_decode_step = [&](int rows, int keys) { steps.push_back({rows, keys}); }}));
  EXPECT_EQ(steps, (Steps{{1, 257}, {1, 1}, {1, 33}}));
  expect_memory_free(*engine, 4);
}

TEST(WarmUpTest, WalksEveryRowCountItIsGivenWithThoseAboveTheSlotsAsTheSlots) {
  EngineOptions o = cpu_options(24);
  o.n_ctx = 4096;  // room for 20 sequences beside the deep one (blocks of 32 positions)
  auto engine = Engine::create(test::tiny("tiny-qwen3:Q4_K_M"), o);
  using Steps = std::vector<std::pair<int, int>>;  // (rows, the deepest row's keys)
  Steps steps;
  // 20 slots and the CUDA backend's counts: 1, 2, 4, 8, 16, then 20 for 32, 48 and 64 (the bucket 20 runs in).
  EXPECT_TRUE(warm_up(*engine, {.n_parallel = 20,
                                .graph_depths = {1, 129},
                                .graph_rows = {1, 2, 4, 8, 16, 32, 48, 64},
                                .on_decode_step = [&](int rows, int keys) { steps.push_back({rows, keys}); }}));
  // (Before the walk, the decode steps on the longest prompt: powers of two up to the slots.)
  const Steps want{{1, 513}, {2, 514}, {4, 515},  {8, 516},  {16, 517}, {1, 1},    {2, 2},   {4, 3},   {8, 4},
                   {16, 5},  {20, 6},  {1, 129},  {2, 130},  {4, 131},  {8, 132},  {16, 133}, {20, 134}};
  EXPECT_EQ(steps, want);
  expect_memory_free(*engine, 24);
}

TEST(WarmUpTest, DecodesAtEveryPowerOfTwoUpToTheSlots) {
  auto engine = Engine::create(test::tiny("tiny-qwen3:Q4_K_M"), cpu_options(4));
  EXPECT_TRUE(warm_up(*engine, {.n_parallel = 6, .shorter_prompts = true}));  // steps of 1, 2 and 4 rows
  expect_memory_free(*engine, 4);
  // The engine serves as before: the same logits as a fresh engine's for the same tokens.
  auto fresh = Engine::create(test::tiny("tiny-qwen3:Q4_K_M"), cpu_options(4));
  const auto tokens = test::some_tokens(40, engine->n_vocab());
  const auto got = test::prompt_then_decode(*engine, tokens, 24);
  const auto want = test::prompt_then_decode(*fresh, tokens, 24);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(got, want);
}

TEST(WarmUpTest, StopsEarlyAndFreesEverythingWhereTheSlotsExceedTheStates) {
  // Decode steps of 4 rows need 4 live sequences; 2 recurrent states cannot hold them.
  auto engine = Engine::create(test::tiny("tiny-qwen35:Q4_K_M"), cpu_options(2));
  EXPECT_FALSE(warm_up(*engine, {.n_parallel = 4, .shorter_prompts = true}));
  expect_memory_free(*engine, 2);
}

}  // namespace
}  // namespace roofline
