// The engine against the double-precision reference forward, on synthetic tiny llama/qwen2/qwen3/
// qwen35 and MoE (qwen3moe, qwen35moe) models: f32 weights near float rounding, quantized weights and KV types within bounds; batch
// invariance (a sequence's logits are bit-identical alone and in a mixed batch); the paged KV cache
// (forks share blocks, full cache is an error that changes nothing).
#include <gtest/gtest.h>

#include <cstring>

#include "backend/cpu/packed_weights.h"
#include "core/error.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "model/model_file.h"
#include "model/model_shapes.h"
#include "reference_forward.h"
#include "engine/engine_test_util.h"
#include "test_util.h"

using namespace roofline;
using test::tiny;
using test::some_tokens;

namespace {

double logits_nmse(const float* got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return num / den;
}

// Engine logits for every position vs the reference, fed one sequence in chunks of n_batch.
double max_nmse(const std::string& spec, EngineOptions options, int n_tokens) {
  auto model = tiny(spec);
  auto engine = Engine::create(model, options);
  const int seq = engine->memory().create_sequence();
  const auto tokens = some_tokens(n_tokens, model->hparams().n_vocab);
  const auto logits = engine->eval(seq, tokens, true);
  test::ReferenceForward ref(*model);
  double worst = 0;
  for (int i = 0; i < n_tokens; ++i)
    worst = std::max(worst, logits_nmse(logits.data() + (size_t)i * model->hparams().n_vocab, ref.step(tokens[i])));
  return worst;
}

}  // namespace

// Every row of the architecture table has a tiny synthetic shape, and its CPU forward (f32 weights and
// KV, fed in chunks so recurrent states and KV cross steps) matches the reference.
TEST(EngineTest, EveryArchitectureRowMatchesReference) {
  EngineOptions o;
  o.type_k = o.type_v = DType::F32;
  o.n_batch = 7;  // several chunks with a ragged last one
  for (const ArchInfo& arch : supported_archs()) {
    std::string spec;
    for (const ModelShape& s : model_shapes())
      if (s.arch == arch.name && s.name.rfind("tiny-", 0) == 0) spec = s.name + ":F32";
    ASSERT_FALSE(spec.empty()) << "architecture " << arch.name << " has no tiny synthetic shape";
    const double e = max_nmse(spec, o, 20);
    std::printf("%-20s NMSE %.3g\n", spec.c_str(), e);
    EXPECT_LT(e, 1e-10) << spec;
  }
}

TEST(EngineTest, QuantizedWeightsAndKvTypesWithinBounds) {
  struct Case {
    const char* spec;
    DType k, v;
    double bound;
  };
  // The engine multiplies with the same weights as the reference, so the error comes from the KV
  // cache type and the int8 activations of the quantized kernels (measured values x ~3).
  const Case cases[] = {
      {"tiny-qwen3:F16", DType::F16, DType::F16, 1e-6},    {"tiny-qwen3:Q8_0", DType::F16, DType::F16, 8e-4},
      {"tiny-qwen3:Q4_K_M", DType::F16, DType::F16, 8e-4}, {"tiny-llama:Q6_K", DType::BF16, DType::BF16, 1e-3},
      {"tiny-qwen2:Q5_K_M", DType::Q8_0, DType::Q8_0, 1e-3}, {"tiny-qwen3:Q4_0", DType::Q4_0, DType::Q4_0, 3e-3},
      {"tiny-llama:Q2_K", DType::Q8_0, DType::F16, 1.5e-3}, {"tiny-qwen3:IQ4_XS", DType::F16, DType::Q4_0, 3e-2},
      {"tiny-qwen35:Q4_K_M", DType::F16, DType::F16, 5e-3}, {"tiny-qwen35:Q8_0", DType::Q8_0, DType::Q8_0, 1e-3},
      // MoE: the routers read f32 activations, but a row whose earlier layers moved slightly may pick
      // another expert than the reference; tiny-qwen35moe:Q6_K's worst row (1.96e-2) is one such row,
      // the others are below 1e-3.
      {"tiny-qwen3moe:Q4_K_M", DType::F16, DType::F16, 1.5e-2}, {"tiny-qwen35moe:Q4_K_M", DType::F16, DType::F16, 2.5e-2},
      {"tiny-qwen3moe:Q8_0", DType::Q8_0, DType::Q8_0, 5e-4}, {"tiny-qwen35moe:Q6_K", DType::F16, DType::F16, 6e-2},
  };
  for (const Case& c : cases) {
    EngineOptions o;
    o.type_k = c.k;
    o.type_v = c.v;
    const double e = max_nmse(c.spec, o, 12);
    std::printf("%-20s K %-5s V %-5s NMSE %.3g (bound %.0e)\n", c.spec, dtype_name(c.k).c_str(), dtype_name(c.v).c_str(), e, c.bound);
    EXPECT_LT(e, c.bound) << c.spec << " K " << dtype_name(c.k) << " V " << dtype_name(c.v);
  }
}

class EngineArchTest : public ::testing::TestWithParam<const char*> {};
INSTANTIATE_TEST_SUITE_P(Archs, EngineArchTest, ::testing::Values("tiny-qwen3:Q4_K_M", "tiny-qwen35:Q4_K_M",
                                                                   "tiny-qwen3moe:Q4_K_M", "tiny-qwen35moe:Q4_K_M",
                                                                   "tiny-gemma3:Q4_K_M"));

TEST_P(EngineArchTest, BatchInvariance) {
  auto model = tiny(GetParam());
  const int n_vocab = model->hparams().n_vocab;
  const auto a = some_tokens(9, n_vocab, 1), b = some_tokens(13, n_vocab, 2), c = some_tokens(5, n_vocab, 3);
  EngineOptions o;
  o.n_threads = 2;
  // Alone.
  auto alone = Engine::create(model, o);
  const int sa = alone->memory().create_sequence();
  auto ref_prefill = alone->eval(sa, a, true);
  std::vector<float> ref_decode;
  for (int32_t t : c) {
    const int32_t one[1] = {t};
    auto l = alone->eval(sa, one, false);
    ref_decode.insert(ref_decode.end(), l.begin(), l.end());
  }
  // Mixed: b's prefill in the same steps as a's prefill, then decode steps shared with b's decode,
  // with a different thread count.
  o.n_threads = 1;
  auto mixed = Engine::create(model, o);
  const int sb = mixed->memory().create_sequence();
  const int sa2 = mixed->memory().create_sequence();
  std::vector<Engine::BatchRow> batch;
  for (int32_t t : b) batch.push_back({sb, t, true});
  for (int32_t t : a) batch.push_back({sa2, t, true});
  auto l = mixed->decode(batch);
  ASSERT_EQ(l.size(), (b.size() + a.size()) * n_vocab);
  EXPECT_EQ(0, std::memcmp(l.data() + b.size() * n_vocab, ref_prefill.data(), a.size() * n_vocab * sizeof(float)));
  for (size_t i = 0; i < c.size(); ++i) {
    std::vector<Engine::BatchRow> step = {{sa2, c[i], true}, {sb, c[(i + 1) % c.size()], false}};
    auto d = mixed->decode(step);
    ASSERT_EQ(d.size(), (size_t)n_vocab);
    EXPECT_EQ(0, std::memcmp(d.data(), ref_decode.data() + i * n_vocab, n_vocab * sizeof(float))) << "decode step " << i;
  }
}

// step(): the same logits as decode() in reused buffers, and for argmax_only rows the greedy token
// of those logits (on the CPU the logits come back too).
TEST(EngineTest, StepGivesDecodesLogitsAndGreedyTokens) {
  auto model = tiny("tiny-qwen3:Q4_K_M");
  const int n_vocab = model->hparams().n_vocab;
  const auto a = some_tokens(7, n_vocab, 4), b = some_tokens(5, n_vocab, 5);
  EngineOptions o;
  o.n_threads = 2;
  auto ref = Engine::create(model, o), eng = Engine::create(model, o);
  const int ra = ref->memory().create_sequence(), rb = ref->memory().create_sequence();
  const int ea = eng->memory().create_sequence(), eb = eng->memory().create_sequence();
  for (size_t i = 0; i < a.size(); ++i) {
    // Row 0: a's token, greedy; row 1: b's token, full logits (from the fourth step on).
    std::vector<Engine::BatchRow> rows = {{ra, a[i], true}, {rb, b[i % b.size()], i >= 3}};
    const std::vector<float> want = ref->decode(rows);
    rows[0].seq = ea;
    rows[1].seq = eb;
    rows[0].argmax_only = true;
    if (i == 2) {
      EXPECT_THROW(eng->launch({{eb + 100, 1, true}}), Error);  // leaves nothing in flight
    }
    const Engine::StepOutput* step_out = nullptr;
    if (i % 2) {
      eng->launch(rows);
      step_out = &eng->finish();
    } else {
      step_out = &eng->step(rows);
    }
    const Engine::StepOutput& out = *step_out;
    ASSERT_EQ(out.argmax.size(), i >= 3 ? 2u : 1u);
    ASSERT_EQ(out.logits.size(), out.argmax.size());
    EXPECT_EQ(out.argmax[0], argmax_logits(want.data(), n_vocab)) << "step " << i;
    ASSERT_NE(out.logits[0], nullptr);  // the CPU backend picks on the host: the logits are there
    EXPECT_EQ(0, std::memcmp(out.logits[0], want.data(), n_vocab * sizeof(float)));
    if (i >= 3) {
      EXPECT_EQ(out.argmax[1], -1);
      ASSERT_NE(out.logits[1], nullptr);
      EXPECT_EQ(0, std::memcmp(out.logits[1], want.data() + n_vocab, n_vocab * sizeof(float)));
    }
  }
  EXPECT_TRUE(eng->step({}).logits.empty());
}

// The startup report names the CPU's threads and kernels, and what it repacked for them (packed_weights.h):
// a Q8_0 model's matrices where this CPU has the packed kernels.
TEST(EngineTest, ReportSaysWhatTheCpuRepacked) {
  auto model = tiny("tiny-qwen3:Q8_0");
  EngineOptions o;
  o.n_threads = 2;
  auto engine = Engine::create(model, o);
  std::string report;
  for (const std::string& line : engine->report()) report += line + "\n";
  EXPECT_NE(report.find(std::string("CPU: 2 threads, ") + cpu::cpu_simd_name() + " kernels"), std::string::npos) << report;
  EXPECT_EQ(report.find("weight matrices repacked for them") != std::string::npos,
            cpu::packed_tile_fn(DType::Q8_0) != nullptr && cpu::repack_enabled()) << report;
}

TEST(EngineTest, ForkSharesPrefixBlocks) {
  auto model = tiny("tiny-llama:Q8_0");
  EngineOptions o;
  o.kv_block_size = 4;
  auto engine = Engine::create(model, o);
  const int n_vocab = model->hparams().n_vocab;
  const auto prefix = some_tokens(10, n_vocab);  // 2 full blocks + 2 positions
  const auto tail_a = some_tokens(6, n_vocab, 5), tail_b = some_tokens(7, n_vocab, 6);
  auto& kv = engine->memory();
  const int s = kv.create_sequence();
  engine->eval(s, prefix, false);
  const int used = kv.used_blocks();
  const int f = engine->fork_sequence(s);
  EXPECT_EQ(kv.used_blocks(), used + 1) << "only the partial block is copied";
  EXPECT_EQ(kv.kv().block_refcount(kv.block_table(s)[0]), 2);
  EXPECT_EQ(kv.kv().block_refcount(kv.block_table(s)[2]), 1);
  EXPECT_EQ(kv.length(f), 10);
  const auto la = engine->eval(s, tail_a, true);
  const auto lb = engine->eval(f, tail_b, true);
  // The same as sequences fed the whole text from scratch (logits are batch- and history-invariant).
  auto fresh = Engine::create(model, o);
  std::vector<int32_t> full_a = prefix, full_b = prefix;
  full_a.insert(full_a.end(), tail_a.begin(), tail_a.end());
  full_b.insert(full_b.end(), tail_b.begin(), tail_b.end());
  const auto ra = fresh->eval(fresh->memory().create_sequence(), full_a, true);
  const auto rb = fresh->eval(fresh->memory().create_sequence(), full_b, true);
  EXPECT_EQ(0, std::memcmp(la.data(), ra.data() + prefix.size() * n_vocab, la.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(lb.data(), rb.data() + prefix.size() * n_vocab, lb.size() * sizeof(float)));
  kv.free_sequence(s);
  EXPECT_EQ(kv.kv().block_refcount(kv.block_table(f)[0]), 1);
  kv.free_sequence(f);
  EXPECT_EQ(kv.used_blocks(), 0);
}

// Qwen3.5: a fork copies the recurrent state (and the partial KV block), so both continuations give
// the logits of sequences fed the whole text from scratch; sequences beyond n_seq_max and truncation
// are refused with an error.
TEST(EngineTest, RecurrentStateForksAndLimits) {
  auto model = tiny("tiny-qwen35:Q8_0");
  EngineOptions o;
  o.kv_block_size = 4;
  o.n_seq_max = 3;
  auto engine = Engine::create(model, o);
  const int n_vocab = model->hparams().n_vocab;
  const auto prefix = some_tokens(10, n_vocab), tail_a = some_tokens(6, n_vocab, 5), tail_b = some_tokens(7, n_vocab, 6);
  SequenceMemory& mem = engine->memory();
  ASSERT_TRUE(mem.recurrent());
  const int s = mem.create_sequence();
  engine->eval(s, prefix, false);
  const int f = engine->fork_sequence(s);
  EXPECT_NE(mem.state_cell(f), mem.state_cell(s));
  EXPECT_THROW(mem.truncate(s, 4), Error);
  const auto la = engine->eval(s, tail_a, true);
  const auto lb = engine->eval(f, tail_b, true);
  const int third = mem.create_sequence();
  EXPECT_THROW(mem.create_sequence(), Error) << "n_seq_max is 3";
  EXPECT_THROW(engine->fork_sequence(s), Error);
  mem.free_sequence(third);
  std::vector<int32_t> full_a = prefix, full_b = prefix;
  full_a.insert(full_a.end(), tail_a.begin(), tail_a.end());
  full_b.insert(full_b.end(), tail_b.begin(), tail_b.end());
  auto fresh = Engine::create(model, o);
  const auto ra = fresh->eval(fresh->memory().create_sequence(), full_a, true);
  const auto rb = fresh->eval(fresh->memory().create_sequence(), full_b, true);
  EXPECT_EQ(0, std::memcmp(la.data(), ra.data() + prefix.size() * n_vocab, la.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(lb.data(), rb.data() + prefix.size() * n_vocab, lb.size() * sizeof(float)));
}

// Qwen3.5 prompt caching: a sequence that reaches a block boundary leaves a state snapshot; a later
// prompt with the same prefix adopts the blocks up to the last snapshot (not beyond) and continues
// with the logits a fresh evaluation gives.
TEST(EngineTest, RecurrentPrefixReuseResumesFromASnapshot) {
  auto model = tiny("tiny-qwen35:Q8_0");
  EngineOptions o;
  o.kv_block_size = 4;
  o.n_seq_max = 2;
  o.n_state_snapshots = 2;
  auto engine = Engine::create(model, o);
  const int n_vocab = model->hparams().n_vocab;
  SequenceMemory& mem = engine->memory();
  const auto prompt = some_tokens(14, n_vocab, 7);  // blocks of 4: boundaries at 4, 8, 12
  const int s = mem.create_sequence();
  const std::vector<int32_t> first(prompt.begin(), prompt.begin() + 8), rest(prompt.begin() + 8, prompt.end());
  engine->eval(s, first, false);  // ends on the boundary at 8: a snapshot
  engine->eval(s, rest, false);   // 14: no boundary reached at the end of the step
  mem.cache_blocks(s, prompt);
  mem.free_sequence(s);
  EXPECT_EQ(mem.n_state_snapshots(), 1);
  auto longer = prompt;
  const auto more = some_tokens(5, n_vocab, 8);
  longer.insert(longer.end(), more.begin(), more.end());
  EXPECT_EQ(mem.kv().match_prefix(longer, 100), 3) << "three full blocks are cached";
  EXPECT_EQ(mem.match_prefix(longer, 100), 2) << "but the state is only known after the second";
  const int t = mem.create_sequence();
  ASSERT_EQ(mem.adopt_prefix(t, longer, 100), 8);
  const std::vector<int32_t> tail(longer.begin() + 8, longer.end());
  const auto got = engine->eval(t, tail, true);
  auto fresh = Engine::create(model, o);
  const auto want = fresh->eval(fresh->memory().create_sequence(), longer, true);
  EXPECT_EQ(0, std::memcmp(got.data(), want.data() + 8 * (size_t)n_vocab, got.size() * sizeof(float)));
}

TEST(EngineTest, TruncateInsideASharedBlockFallsBackToTheBlockStart) {
  KvCache kv(8, 4);
  const int s = kv.create_sequence();
  ASSERT_TRUE(kv.reserve(s, 10));
  kv.commit(s, 10);
  const auto fork = kv.fork_sequence(s);
  EXPECT_EQ(kv.truncate(fork.seq, 9), 9) << "the partial block is the fork's own copy";
  EXPECT_EQ(kv.truncate(fork.seq, 6), 4) << "cut inside a shared block: back to its start";
  EXPECT_EQ(kv.block_table(fork.seq).size(), 1u);
  EXPECT_THROW(kv.truncate(s, 11), Error);
}

TEST(EngineTest, FullCacheIsAnErrorThatChangesNothing) {
  auto model = tiny("tiny-llama:Q8_0");
  EngineOptions o;
  o.n_ctx = 64;
  o.kv_block_size = 16;
  auto engine = Engine::create(model, o);
  const int n_vocab = model->hparams().n_vocab;
  const int s1 = engine->memory().create_sequence();
  const int s2 = engine->memory().create_sequence();
  engine->eval(s1, some_tokens(40, n_vocab), false);
  EXPECT_THROW(engine->eval(s2, some_tokens(30, n_vocab), false), Error);
  EXPECT_EQ(engine->memory().length(s2), 0);
  EXPECT_EQ(engine->memory().length(s1), 40);
  EXPECT_THROW(engine->eval(s1, some_tokens(30, n_vocab), false), Error) << "past n_ctx";
  EXPECT_THROW(engine->decode({{s1, n_vocab, true}}), Error) << "token out of range";
  EXPECT_THROW(engine->decode({{99, 1, true}}), Error) << "unknown sequence";
  EXPECT_THROW(engine->decode({{s1, 1, true}, {s2, 1, true}, {s1, 2, true}}), Error) << "not contiguous";
  engine->memory().free_sequence(s1);
  EXPECT_NO_THROW(engine->eval(s2, some_tokens(30, n_vocab), false));
}

TEST(EngineTest, BadOptions) {
  auto model = tiny("tiny-llama:Q8_0");
  EngineOptions o;
  o.n_batch = 0;
  EXPECT_THROW(Engine::create(model, o), Error);
  o = {};
  o.type_k = DType::Q4_K;
  EXPECT_THROW(Engine::create(model, o), Error);
}
