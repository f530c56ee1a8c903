// Batched decode steps (9-64 rows, one row per sequence) captured and replayed as CUDA graphs
// (on by default, ROOFLINE_BATCHED_GRAPHS=0 turns it off; cuda_backend.cuh batched_graph): the same kernels with the same arguments as the
// launches they replace, so every step's logits have the same bits with the switch on and off. Steps of 12, 20
// and 24 rows over sequences of different depths, each size more than once (a captured graph replayed), between
// prompt steps (not captured) and one-row steps (their own graphs). And the serve warm-up's walk through the depths
// where steps of up to 8 rows take new graphs (Engine::decode_graph_depths): after it, requests capture none.
// Skipped without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <cstring>
#include <span>
#include <vector>

#include "backend/gpu.h"
#include "engine/engine.h"
#include "engine/engine_test_util.h"
#include "engine/warm_up.h"
#include "test_util.h"

using namespace roofline;

namespace {

// ROOFLINE_NO_CUDA_GRAPHS set (the GPU suite runs under it too): nothing is captured, and batched steps are not bucketed.
bool graphs_turned_off() {
  const char* v = std::getenv("ROOFLINE_NO_CUDA_GRAPHS");
  return v && *v && std::strcmp(v, "0") != 0;
}

std::vector<float> batched_steps(const char* spec, bool graphs) {
  setenv("ROOFLINE_BATCHED_GRAPHS", graphs ? "1" : "0", 1);
  auto model = test::tiny(spec);
  EngineOptions o;
  o.n_gpu_layers = EngineOptions::kGpuLayersAll;
  o.n_ctx = 4096;     // 24 sequences of up to ~65 positions
  o.n_seq_max = 24;   // a state cell (Qwen3.5) or a window ring (Gemma 3) each
  auto engine = Engine::create(model, o);
  unsetenv("ROOFLINE_BATCHED_GRAPHS");  // read when the backend is created
  const int n_vocab = model->hparams().n_vocab;
  const auto tokens = test::some_tokens(2000, n_vocab, 11);
  size_t next = 0;
  auto token = [&] { return tokens[next++ % tokens.size()]; };
  std::vector<float> out;
  auto add = [&](const std::vector<float>& l) { out.insert(out.end(), l.begin(), l.end()); };
  std::vector<int> seqs;
  for (int i = 0; i < 24; ++i) {  // prompts of 3 to 49 tokens: rows of different depths in every step
    seqs.push_back(engine->memory().create_sequence());
    std::vector<int32_t> prompt;
    for (int k = 0; k < 3 + 2 * i; ++k) prompt.push_back(token());
    add(engine->eval(seqs.back(), std::span<const int32_t>(prompt), false));
  }
  auto step = [&](int first, int count) {
    std::vector<Engine::BatchRow> rows;
    for (int i = 0; i < count; ++i) rows.push_back({seqs[(size_t)((first + i) % 24)], token(), true});
    add(engine->decode(rows));
  };
  for (int round = 0; round < 3; ++round) {
    step(0, 12);
    step(4, 20);
    step(round, 12);
    step(0, 24);
    const int32_t t = token();
    add(engine->eval(seqs[(size_t)round], std::span<const int32_t>(&t, 1), false));  // a one-row step between
  }
  return out;
}

}  // namespace

TEST(GpuBatchedGraphs, StepsGiveTheSameLogitsAsLaunchedOneByOne) {
  SKIP_WITHOUT_GPU();
  for (const char* spec : {"tiny-qwen3:Q4_K_M", "tiny-llama:Q8_0", "tiny-qwen35:Q4_K_M", "tiny-gemma3:Q8_0"}) {
    const auto launched = batched_steps(spec, false), graphs = batched_steps(spec, true);
    ASSERT_EQ(launched.size(), graphs.size()) << spec;
    EXPECT_EQ(launched, graphs) << spec;
  }
}

// A request after the warm-up: a prompt longer than any batched graph's rows, its decode through every depth the
// context holds at one row, then with two more sequences (steps of 3 rows: the bucket of 4). The warm-up's walk must
// have captured every graph these steps take: none is captured after it. Without the walk the first one-row step
// past 128 keys takes a new grid of splits, and so a new graph.
TEST(GpuDecodeGraphs, TheWarmUpWalkCapturesEveryGraphOfUpToEightRows) {
  SKIP_WITHOUT_GPU();
  if (graphs_turned_off()) GTEST_SKIP() << "ROOFLINE_NO_CUDA_GRAPHS turns the graphs (and the buckets) off";
  for (const char* spec : {"tiny-qwen3:Q4_K_M", "tiny-qwen35:Q4_K_M", "tiny-gemma3:Q8_0"}) {
    auto model = test::tiny(spec);
    EngineOptions o;
    o.n_gpu_layers = EngineOptions::kGpuLayersAll;
    o.n_ctx = 2048;
    o.n_seq_max = 4;
    auto engine = Engine::create(model, o);
    const std::vector<int> depths = engine->decode_graph_depths();
    ASSERT_GE(depths.size(), 4u) << spec;
    EXPECT_EQ(depths[0], 1) << spec;
    for (size_t i = 1; i < depths.size(); ++i) EXPECT_LT(depths[i - 1], depths[i]) << spec;
    EXPECT_LE(depths.back(), o.n_ctx) << spec;
    int one_row_steps = 0;
    ASSERT_TRUE(warm_up(*engine, {.n_parallel = 4,
                                  .shorter_prompts = true,
                                  .graph_depths = depths,
                                  .on_decode_step = [&](int rows, int) { one_row_steps += rows == 1; }}))
        << spec;
    EXPECT_GE(one_row_steps, 3) << spec;
    const size_t graphs = engine->captured_graphs();
    EXPECT_GT(graphs, 0u) << spec;

    const int n_vocab = model->hparams().n_vocab;
    const auto tokens = test::some_tokens(2048, n_vocab, 5);
    SequenceMemory& mem = engine->memory();
    const int seq = mem.create_sequence();
    engine->eval(seq, std::span<const int32_t>(tokens.data(), 100), false);
    int n = 100;
    for (; n < 1400; ++n) engine->step({{seq, tokens[(size_t)n], true, true}});
    EXPECT_EQ(engine->captured_graphs(), graphs) << spec << ": one-row steps to 1400 keys";
    const int a = mem.create_sequence(), b = mem.create_sequence();
    engine->eval(a, std::span<const int32_t>(tokens.data(), 1), false);
    engine->eval(b, std::span<const int32_t>(tokens.data() + 1, 1), false);
    for (int i = 0; i < 8; ++i, ++n) engine->step({{seq, tokens[(size_t)n], true, true}, {a, tokens[(size_t)i], true, true}, {b, tokens[(size_t)i + 1], true, true}});
    EXPECT_EQ(engine->captured_graphs(), graphs) << spec << ": three-row steps";
    for (int s : {seq, a, b}) mem.free_sequence(s);
  }
}

namespace {

std::unique_ptr<Engine> gpu_engine(const std::shared_ptr<const Model>& model, int n_ctx, int n_seq_max) {
  EngineOptions o;
  o.n_gpu_layers = EngineOptions::kGpuLayersAll;
  o.n_ctx = n_ctx;
  o.n_seq_max = n_seq_max;
  return Engine::create(model, o);
}

}  // namespace

// Batched decode steps run padded to 16, 32, 48 or 64 rows (ROOFLINE_BATCHED_BUCKETS, on): the rows of a step of 12 get
// the bits they get in a step of 16 that holds them and four more sequences, and the two steps replay one graph.
TEST(GpuBatchedGraphs, RowsKeepTheirBitsWithinTheirBucket) {
  SKIP_WITHOUT_GPU();
  if (graphs_turned_off()) GTEST_SKIP() << "ROOFLINE_NO_CUDA_GRAPHS turns the graphs (and the buckets) off";
  for (const char* spec : {"tiny-qwen3:Q4_K_M", "tiny-llama:Q8_0", "tiny-qwen35:Q4_K_M", "tiny-gemma3:Q8_0"}) {
    auto model = test::tiny(spec);
    const int n_vocab = model->hparams().n_vocab;
    const auto tokens = test::some_tokens(400, n_vocab, 3);
    std::vector<std::vector<float>> logits;  // [engine][rows x n_vocab]: the 12-row step's, the 16-row step's
    size_t graphs_after_12 = 0, graphs_after_16 = 0;
    for (int rows : {12, 16}) {
      auto engine = gpu_engine(model, 2048, 20);
      std::vector<int> seqs;
      size_t next = 0;
      for (int i = 0; i < 16; ++i) {  // prompts of 3 to 18 tokens: rows of different depths, under 32 keys
        seqs.push_back(engine->memory().create_sequence());
        engine->eval(seqs.back(), std::span<const int32_t>(tokens.data() + next, (size_t)(3 + i)), false);
        next += 3 + i;
      }
      std::vector<Engine::BatchRow> batch;
      for (int i = 0; i < rows; ++i) batch.push_back({seqs[(size_t)i], tokens[next + (size_t)i], true});
      logits.push_back(engine->decode(batch));
      if (rows == 16) {  // then the 12 rows again, one token on: the same bucket and grid, no new graph
        graphs_after_16 = engine->captured_graphs();
        batch.resize(12);
        for (int i = 0; i < 12; ++i) batch[(size_t)i].token = tokens[next + 16 + (size_t)i];
        engine->decode(batch);
        graphs_after_12 = engine->captured_graphs();
      }
    }
    ASSERT_EQ(logits[0].size(), (size_t)12 * n_vocab) << spec;
    ASSERT_EQ(logits[1].size(), (size_t)16 * n_vocab) << spec;
    EXPECT_TRUE(std::equal(logits[0].begin(), logits[0].end(), logits[1].begin())) << spec << ": the 12 rows' logits";
    EXPECT_EQ(graphs_after_12, graphs_after_16) << spec << ": a step of 12 rows replays the graph of 16";
  }
}

// The serve warm-up's walk with more slots than 8 steps each bucket (16, 32 and the slots' 40, run as 48) at every
// depth where a batched step's grid changes: steps of 11, 20 and 40 rows through those depths capture nothing.
TEST(GpuDecodeGraphs, TheWarmUpWalkCapturesTheBatchedBuckets) {
  SKIP_WITHOUT_GPU();
  if (graphs_turned_off()) GTEST_SKIP() << "ROOFLINE_NO_CUDA_GRAPHS turns the graphs (and the buckets) off";
  for (const char* spec : {"tiny-qwen3:Q4_K_M", "tiny-qwen35:Q4_K_M", "tiny-gemma3:Q8_0"}) {
    auto model = test::tiny(spec);
    auto engine = gpu_engine(model, 16384, 44);
    const std::vector<int> rows = engine->decode_graph_rows();
    EXPECT_EQ(rows, (std::vector<int>{1, 2, 4, 8, 16, 32, 48, 64})) << spec;
    std::vector<int> walked;
    ASSERT_TRUE(warm_up(*engine, {.n_parallel = 40,
                                  .graph_depths = engine->decode_graph_depths(),
                                  .graph_rows = rows,
                                  .on_decode_step = [&](int r, int) { walked.push_back(r); }}))
        << spec;
    for (int r : {16, 32, 40}) EXPECT_NE(std::find(walked.begin(), walked.end(), r), walked.end()) << spec << ": " << r << " rows";

    const int n_vocab = model->hparams().n_vocab;
    const auto tokens = test::some_tokens(4096, n_vocab, 9);
    SequenceMemory& mem = engine->memory();
    std::vector<int> seqs;
    for (int i = 0; i < 40; ++i) {
      seqs.push_back(mem.create_sequence());
      engine->eval(seqs.back(), std::span<const int32_t>(tokens.data() + i, 1), false);
    }
    engine->eval(seqs[0], std::span<const int32_t>(tokens.data(), 100), false);  // the deep row: a prompt step (no graph)
    const size_t graphs = engine->captured_graphs();
    // The deep row through 600 keys (the grids of 16-64-row steps up to there: 1 to 32 splits), in steps of 11, 20
    // and 40 rows by turns, the other rows taken from the rest in turn.
    const int counts[3] = {11, 20, 40};
    size_t other = 0;
    for (int k = 0; mem.length(seqs[0]) < 600; ++k) {
      const int n = counts[k % 3];
      std::vector<Engine::BatchRow> batch{{seqs[0], tokens[(size_t)k % tokens.size()], true, true}};
      for (int i = 1; i < n; ++i, ++other) batch.push_back({seqs[1 + other % 39], tokens[(size_t)(k + i) % tokens.size()], true, true});
      engine->step(batch);
    }
    EXPECT_EQ(engine->captured_graphs(), graphs) << spec << ": batched steps to 600 keys";
    for (int s : seqs) mem.free_sequence(s);
  }
}
