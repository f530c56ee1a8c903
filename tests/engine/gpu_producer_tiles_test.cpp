// Batched steps (9-64 rows) whose product inputs are written as the warpgroup kernel's activation tiles by the
// kernels that compute them (the pre-norm, the gated FFN step; ROOFLINE_PRODUCER_TILES): the tiles against the
// products' own conversion of the same values, bit for bit, and whole models' logits with the producers writing
// them and without. Skipped where no GPU is present (CI); run on the GPU machine with --gtest_filter='Gpu*'.
#include <gtest/gtest.h>

#include <cstdint>
#include <span>
#include <vector>

#include "backend/gpu.h"
#include "core/rng.h"
#include "engine/engine.h"
#include "engine/engine_test_util.h"
#include "test_util.h"

using namespace roofline;
using test::some_tokens;
using test::tiny;

namespace {

struct ProducerTiles {
  explicit ProducerTiles(int on) { gpu_use_producer_tiles_for_test(on); }
  ~ProducerTiles() { gpu_use_producer_tiles_for_test(-1); }
};

// The index of the first half where buffer j of gpu_producer_tiles_for_test (0: the producer's, 1: the products'
// conversion) differs from the reference conversion (2), or -1.
int64_t first_difference(const std::vector<uint16_t>& three, int j) {
  const size_t len = three.size() / 3;
  for (size_t i = 0; i < len; ++i)
    if (three[j * len + i] != three[2 * len + i]) return (int64_t)i;
  return -1;
}

// Whether the reference tiles (buffer 2) of rows tokens of n values hold a nonzero half in the sub-block sums' steps
// (Q4_K's 17th k16 step, Q6_K's 17th and 18th), whose runs are ((sb * steps + 16 + s) * 2 + kb) * n_pad + token.
bool sums_written(const std::vector<uint16_t>& three, bool q6, int rows, int n) {
  const int64_t n_pad = 16 * ((rows + 15) / 16), len = (int64_t)three.size() / 3, steps = q6 ? 18 : 17;
  for (int64_t sb = 0; sb < n / 256; ++sb)
    for (int64_t run = (sb * steps + 16) * 2 * n_pad; run < (sb + 1) * steps * 2 * n_pad; ++run)
      for (int64_t h = 0; h < 8; ++h)
        if ((three[2 * len + run * 8 + h] & 0x7fff) != 0) return true;
  return false;
}

struct WgmmaFold {
  explicit WgmmaFold(int on) { gpu_use_wgmma_fold_for_test(on); }
  ~WgmmaFold() { gpu_use_wgmma_fold_for_test(-1); }
};

}  // namespace

// Both tile layouts (Q4_K's and Q6_K's row blocks), row counts that fill 1-4 token tiles exactly and not, rows of
// one and of several super-blocks; values large enough that some saturate at the f16 range. Every half of the
// buffer, the padded tokens' zeros included, must be what the reference conversion (each run built from the row
// blocks' offsets) writes: from the norm and the gated step writing tiles, and from the products' own conversion.
// Q4_K's tiles for products that fold the mins (the fold on) carry the sub-block sums and the high nibbles' values
// divided by 16; with the fold off, plain values and zeros for the sums: both. Q6_K's always carry their sums.
TEST(GpuMatmulTest, ProducersWriteTheTilesTheProductsConvert) {
  SKIP_WITHOUT_GPU();
  Rng rng(77);
  for (int fold : {1, 0}) {
    for (bool q6 : {false, true})
      for (int rows : {9, 16, 23, 48, 64})
        for (int n : {256, 1280}) {
          if (q6 && fold == 0) continue;
          WgmmaFold fold_setting(fold);
          SCOPED_TRACE(testing::Message() << (q6 ? "Q6_K" : "Q4_K") << " layout, " << rows << " rows of " << n << ", fold " << fold);
          std::vector<float> x((size_t)rows * n), w((size_t)n), up((size_t)rows * n);
          for (float& v : x) v = (float)rng.normal();
          for (float& v : w) v = (float)rng.normal() * 3.0f;
          for (float& v : up) v = (float)rng.normal() * 8.0f;
          x[5] = 3e5f;  // a row with one huge value: the rest of it near zero, that value saturating after the weight
          w[5] = 1e5f;
          const auto norm = gpu_producer_tiles_for_test(GpuOpForTest::RmsNorm, false, q6, x, w, rows, n, 1e-6f);
          EXPECT_EQ(first_difference(norm, 0), -1) << "rms norm";
          EXPECT_EQ(first_difference(norm, 1), -1) << "the products' conversion of the norm's output";
          EXPECT_EQ(sums_written(norm, q6, rows, n), q6 || fold == 1) << "the sub-block sums";
          std::vector<float> gate = x;
          gate[7] = 2e4f;  // silu(2e4) * up beyond the f16 range
          const auto swiglu = gpu_producer_tiles_for_test(GpuOpForTest::Swiglu, false, q6, gate, up, rows, n, 0.0f);
          EXPECT_EQ(first_difference(swiglu, 0), -1) << "swiglu";
          EXPECT_EQ(first_difference(swiglu, 1), -1) << "the products' conversion of swiglu's output";
          EXPECT_EQ(sums_written(swiglu, q6, rows, n), q6 || fold == 1) << "swiglu's sub-block sums";
          const auto geglu = gpu_producer_tiles_for_test(GpuOpForTest::Swiglu, true, q6, gate, up, rows, n, 0.0f);
          EXPECT_EQ(first_difference(geglu, 0), -1) << "geglu";
        }
  }
}

// The norm of 9-64 row steps spread over a CTA per run of 1024 values of each row (ROOFLINE_NORM_WIDE_ROWS): each CTA
// sums the whole row as the row's one CTA does, so its f32 rows and its tiles (padded tokens' zeros included) are the
// same bits; rows of one run, of a run and a part (1280), and of five (5120).
TEST(GpuMatmulTest, WideNormRowsWriteTheSameBits) {
  SKIP_WITHOUT_GPU();
  struct Restore {
    ~Restore() { gpu_use_wide_norm_rows_for_test(-1); }
  } restore;
  Rng rng(78);
  for (int rows : {9, 23, 64})
    for (int n : {256, 1280, 5120}) {
      SCOPED_TRACE(testing::Message() << rows << " rows of " << n);
      std::vector<float> x((size_t)rows * n), w((size_t)n);
      for (float& v : x) v = (float)rng.normal();
      for (float& v : w) v = (float)rng.normal() * 3.0f;
      gpu_use_wide_norm_rows_for_test(0);
      const auto one = gpu_producer_tiles_for_test(GpuOpForTest::RmsNorm, false, false, x, w, rows, n, 1e-6f);
      gpu_use_wide_norm_rows_for_test(1);
      const auto wide = gpu_producer_tiles_for_test(GpuOpForTest::RmsNorm, false, false, x, w, rows, n, 1e-6f);
      EXPECT_EQ(one, wide);
      EXPECT_EQ(first_difference(wide, 0), -1) << "the wide norm's tiles against the reference conversion of its rows";
    }
}

// Whole models on batched steps of 9-64 rows with the producers writing the tiles and without: the products read the
// same halves either way, so the logits are the same bits. A dense Qwen3 (mixed Q4_K / Q6_K products; and all Q6_K, whose
// attention writes o's tiles with their sums), Gemma 3
// (GeGLU), a hybrid Qwen3.5 (the DeltaNet projections' pre-norm) and an MoE model (its attention's pre-norm). The
// count of products that took producer tiles must grow where the warpgroup kernel runs (Hopper), and stay where not.
TEST(GpuEngineTest, ProducerTilesGiveTheSameLogits) {
  SKIP_WITHOUT_GPU();
  for (const char* name : {"tiny-qwen3:Q4_K_M", "tiny-qwen3:Q6_K", "tiny-gemma3:Q4_K_M", "tiny-qwen35:Q4_K_M", "tiny-qwen3moe:Q4_K_M"}) {
    SCOPED_TRACE(name);
    auto model = tiny(name);
    const auto tokens = some_tokens(400, model->hparams().n_vocab, 23);
    auto run = [&](int producer_tiles) {
      const ProducerTiles setting(producer_tiles);
      EngineOptions o;
      o.n_gpu_layers = EngineOptions::kGpuLayersAll;
      o.n_seq_max = 64;
      o.n_ctx = 4096;
      auto e = Engine::create(model, o);
      std::vector<int> seqs;
      std::vector<float> out;
      for (int s = 0; s < 64; ++s) {
        seqs.push_back(e->memory().create_sequence());
        const auto l = e->eval(seqs.back(), std::span<const int32_t>(tokens.data() + s, 3), true);
        out.insert(out.end(), l.begin(), l.end());
      }
      for (int rows : {9, 17, 40, 64, 33, 12}) {
        std::vector<Engine::BatchRow> batch;
        for (int s = 0; s < rows; ++s) batch.push_back({seqs[(size_t)s], tokens[(size_t)(100 + 3 * s + rows)], true});
        const auto l = e->decode(batch);
        out.insert(out.end(), l.begin(), l.end());
      }
      return out;
    };
    const int64_t taken0 = gpu_producer_tiles_taken_for_test();
    const auto converted = run(0);
    EXPECT_EQ(gpu_producer_tiles_taken_for_test(), taken0);
    const auto produced = run(1);
    if (gpu_wgmma_products_available_for_test()) EXPECT_GT(gpu_producer_tiles_taken_for_test(), taken0);
    else EXPECT_EQ(gpu_producer_tiles_taken_for_test(), taken0);
    ASSERT_EQ(converted.size(), produced.size());
    EXPECT_EQ(converted, produced);
  }
}
