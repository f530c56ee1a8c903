// Perplexity and KL divergence against llama.cpp's own figures on ../shared's qwen3-tiny512 set: the
// tokens of the .kld file, the F16 perplexity (504.47 ± 4.41), the KLD and same-top of llama.cpp's
// quantized files, the .kld layout (written, read back), windows batched or not, bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>

#include "core/error.h"
#include "engine/engine.h"
#include "engine/perplexity.h"
#include "formats/gguf.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

using namespace roofline;

namespace {

std::string gpl_text() {
  std::ifstream in("/usr/share/common-licenses/GPL-3", std::ios::binary);
  std::string s((std::istreambuf_iterator<char>(in)), {});
  return s.substr(0, std::min<size_t>(s.size(), 6000));
}

struct Loaded {
  std::shared_ptr<const Model> model;
  std::shared_ptr<const Tokenizer> tok;
  std::unique_ptr<Engine> engine;
};

Loaded load(const std::string& path, int n_batch = 2048) {
  Loaded l;
  l.model = Model::load(gguf::GgufFile::open(path));
  l.tok = Tokenizer::from_metadata(l.model->metadata());
  EngineOptions o;
  o.n_batch = n_batch;
  o.n_ctx = std::max(256, n_batch / 128 * 256);
  o.n_threads = 2;
  l.engine = Engine::create(l.model, o);
  return l;
}

}  // namespace

TEST(PerplexityTest, TokensMatchLlamaCpp) {
  ROOFLINE_SHARED_PATH_OR_SKIP(dir, "testdata/models/qwen3-tiny512-llamacpp");
  KldReader base(dir + "/qwen3-tiny512-F16.kld");
  EXPECT_EQ(base.n_ctx(), 128);
  EXPECT_EQ(base.n_vocab(), 512);
  EXPECT_EQ(base.n_chunk(), 29);
  auto l = load(dir + "/qwen3-tiny512-F16.gguf");
  const auto tokens = perplexity_tokens(*l.tok, gpl_text());
  ASSERT_GE(tokens.size(), base.tokens().size());
  EXPECT_EQ(tokens.size() / 128, 29u);
  for (size_t i = 0; i < base.tokens().size(); ++i) ASSERT_EQ(tokens[i], base.tokens()[i]) << "token " << i;
}

// llama.cpp: "Final estimate: PPL = 504.47 +/- 4.41" for the F16 file, -c 128.
TEST(PerplexityTest, F16MatchesLlamaCpp) {
  ROOFLINE_SHARED_PATH_OR_SKIP(dir, "testdata/models/qwen3-tiny512-llamacpp");
  auto l = load(dir + "/qwen3-tiny512-F16.gguf");
  PerplexityOptions o;
  o.n_ctx = 128;
  o.n_threads = 2;
  int last_chunk = 0;
  o.on_chunk = [&](int chunk, int n_chunk, double) {
    EXPECT_EQ(chunk, last_chunk + 1);
    EXPECT_EQ(n_chunk, 29);
    last_chunk = chunk;
  };
  const auto r = compute_perplexity(*l.engine, *l.tok, perplexity_tokens(*l.tok, gpl_text()), o);
  EXPECT_EQ(r.n_chunk, 29);
  EXPECT_EQ(r.count, 29 * 63);
  EXPECT_NEAR(r.ppl, 504.47, 0.05);
  EXPECT_NEAR(r.ppl_err, 4.41, 0.01);
}

// Windows batched several per step and one per step (and split over steps) give the same numbers.
TEST(PerplexityTest, BatchingDoesNotChangeTheResult) {
  ROOFLINE_SHARED_PATH_OR_SKIP(dir, "testdata/models/qwen3-tiny512-llamacpp");
  const auto text = gpl_text();
  PerplexityOptions o;
  o.n_ctx = 128;
  o.n_chunks = 6;
  double ppl[3];
  int i = 0;
  for (int n_batch : {1024, 128, 48}) {
    auto l = load(dir + "/qwen3-tiny512-F16.gguf", n_batch);
    ppl[i++] = compute_perplexity(*l.engine, *l.tok, perplexity_tokens(*l.tok, text), o).ppl;
  }
  EXPECT_EQ(ppl[0], ppl[1]);
  EXPECT_EQ(ppl[0], ppl[2]);
}

// KLD of llama.cpp's quantized files against llama.cpp's F16 .kld: the README's figures.
TEST(PerplexityTest, KldOfLlamaCppFilesMatchesReadme) {
  ROOFLINE_SHARED_PATH_OR_SKIP(dir, "testdata/models/qwen3-tiny512-llamacpp");
  struct Case {
    const char* type;
    double kld, same_top;
  };
  const Case cases[] = {{"F16", 0, 100},         {"Q8_0", 0.000020, 97.646}, {"Q6_K", 0.000157, 93.049},
                        {"Q5_K_M", 0.000378, 88.177}, {"Q5_0", 0.000631, 85.331}, {"Q4_K_M", 0.001267, 77.833},
                        {"Q4_K_S", 0.001232, 77.066}, {"Q4_0", 0.002255, 76.409}, {"Q3_K_M", 0.003131, 67.542},
                        {"Q2_K", 0.011272, 48.385}};
  for (const Case& c : cases) {
    auto l = load(dir + "/qwen3-tiny512-" + c.type + ".gguf");
    KldReader base(dir + "/qwen3-tiny512-F16.kld");
    KlDivergenceOptions o;
    o.n_threads = 2;
    const KldStats s = compute_kl_divergence(*l.engine, *l.tok, base, o);
    std::printf("  %-7s KLD %.6f (llama.cpp %.6f), same top %.3f%% (llama.cpp %.3f%%)\n", c.type, s.mean_kld(), c.kld,
                100 * s.same_top_fraction(), c.same_top);
    EXPECT_EQ(s.count, 29 * 63);
    if (c.kld == 0) {
      EXPECT_LT(s.mean_kld(), 2e-6) << c.type;  // our F16 forward vs llama.cpp's: rounding only
    } else {
      EXPECT_NEAR(s.mean_kld(), c.kld, 0.05 * c.kld + 2e-6) << c.type;
    }
    EXPECT_NEAR(100 * s.same_top_fraction(), c.same_top, 1.5) << c.type;
  }
}

// --kl-divergence-base writes llama.cpp's layout: the same header and tokens as llama.cpp's file, rows
// within a few quantization steps of it, and reading our own file back gives a KLD of ~0.
TEST(PerplexityTest, KldFileWrittenAndReadBack) {
  ROOFLINE_SHARED_PATH_OR_SKIP(dir, "testdata/models/qwen3-tiny512-llamacpp");
  auto l = load(dir + "/qwen3-tiny512-F16.gguf");
  const std::string path = test::temp_dir() + "/f16.kld";
  PerplexityOptions o;
  o.n_ctx = 128;
  o.kld_base_path = path;
  const auto r = compute_perplexity(*l.engine, *l.tok, perplexity_tokens(*l.tok, gpl_text()), o);
  EXPECT_NEAR(r.ppl, 504.47, 0.05);
  KldReader ours(path), theirs(dir + "/qwen3-tiny512-F16.kld");
  EXPECT_EQ(ours.n_ctx(), theirs.n_ctx());
  EXPECT_EQ(ours.n_vocab(), theirs.n_vocab());
  EXPECT_EQ(ours.n_chunk(), theirs.n_chunk());
  EXPECT_EQ(ours.tokens(), theirs.tokens());
  // Rows: our log-probabilities against llama.cpp's, where both are above the stored floor (our F16
  // forward differs from llama.cpp's by float rounding; measured worst 0.021).
  std::vector<uint16_t> a, b;
  double worst = 0;
  auto log_prob = [](const uint16_t* row, int i) {
    float scale, min;
    std::memcpy(&scale, row, 4);
    std::memcpy(&min, row + 2, 4);
    return std::make_pair(row[4 + i] > 0, (double)scale * row[4 + i] + min);
  };
  for (int c = 0; c < ours.n_chunk(); ++c) {
    ours.read_chunk(a);
    theirs.read_chunk(b);
    ASSERT_EQ(a.size(), b.size());
    for (size_t r = 0; r < a.size() / 516; ++r)
      for (int i = 0; i < 512; ++i) {
        const auto x = log_prob(a.data() + r * 516, i), y = log_prob(b.data() + r * 516, i);
        if (x.first && y.first) worst = std::max(worst, std::fabs(x.second - y.second));
      }
  }
  EXPECT_LT(worst, 0.05) << "stored log-probabilities differ by up to " << worst;
  KldReader again(path);
  const KldStats s = compute_kl_divergence(*l.engine, *l.tok, again, {});
  EXPECT_LT(s.mean_kld(), 1e-7);
  EXPECT_EQ(s.same_top_fraction(), 1.0);
  EXPECT_NEAR(std::exp(s.sum_nll_base / s.count), 504.47, 0.06);
  const auto lines = s.report();
  bool mean_line = false, top_line = false;
  for (const auto& line : lines) {
    mean_line |= line.rfind("Mean    KLD: ", 0) == 0;
    top_line |= line.rfind("Same top p: ", 0) == 0 && line.find(" %") != std::string::npos;
  }
  EXPECT_TRUE(mean_line && top_line);
}

TEST(PerplexityTest, BadInput) {
  ROOFLINE_SHARED_PATH_OR_SKIP(dir, "testdata/models/qwen3-tiny512-llamacpp");
  auto l = load(dir + "/qwen3-tiny512-F16.gguf");
  PerplexityOptions o;
  o.n_ctx = 128;
  EXPECT_THROW(compute_perplexity(*l.engine, *l.tok, perplexity_tokens(*l.tok, "too short"), o), Error);
  const std::string tmp = test::temp_dir();
  std::ofstream(tmp + "/short.kld", std::ios::binary) << "_logits_";
  EXPECT_THROW(KldReader(tmp + "/short.kld"), Error);
  std::ifstream in(dir + "/qwen3-tiny512-F16.kld", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  std::ofstream(tmp + "/cut.kld", std::ios::binary) << bytes.substr(0, bytes.size() - 100);
  try {
    KldReader r(tmp + "/cut.kld");
    FAIL() << "a truncated .kld was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
  }
  // The command line: the printed lines, and one error line for a missing text.
  auto r = test::run_cli({"perplexity", "-m", dir + "/qwen3-tiny512-Q4_K_M.gguf", "--kl-divergence-base",
                          dir + "/qwen3-tiny512-F16.kld", "--kl-divergence", "-t", "2", "--chunks", "4"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("Mean    KLD: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Same top p: "), std::string::npos) << r.out;
  r = test::run_cli({"perplexity", "-m", dir + "/qwen3-tiny512-F16.gguf", "-f", tmp + "/missing.txt"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find("missing.txt"), std::string::npos) << r.err;
}
