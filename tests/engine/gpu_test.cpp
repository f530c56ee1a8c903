// The CUDA backend against the references (skipped where no GPU is present, e.g. CI): the row-wise ops,
// and whole models against the CPU engine for full and partial offload and every KV type; decode batches are
// bit-identical alone and together; results are reproducible (the products of every weight type: gpu_matmul_test.cpp).
// Run on the GPU machine: roofline_tests --gtest_filter='Gpu*'.
#include <gtest/gtest.h>

#include <random>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "backend/cpu/cpu_ops.h"
#include "backend/gpu.h"
#include "core/error.h"
#include "core/fp16.h"
#include "core/rng.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "formats/quant_ref.h"
#include "model/model_file.h"
#include "model/synthetic.h"
#include "engine/engine_test_util.h"
#include "engine/random_weight.h"
#include "test_util.h"

using namespace roofline;
using test::tiny;
using test::some_tokens;

namespace {

// Engine options with every unit on the GPU.
EngineOptions all_on_gpu() {
  EngineOptions o;
  o.n_gpu_layers = EngineOptions::kGpuLayersAll;
  return o;
}

std::vector<float> run_logits(std::shared_ptr<const Model> model, EngineOptions o, const std::vector<int32_t>& tokens) {
  auto engine = Engine::create(model, o);
  const int seq = engine->memory().create_sequence();
  // A prefill chunk, then single decode steps.
  const size_t split = tokens.size() / 2;
  auto out = engine->eval(seq, std::span<const int32_t>(tokens.data(), split), true);
  for (size_t i = split; i < tokens.size(); ++i) {
    auto l = engine->eval(seq, std::span<const int32_t>(&tokens[i], 1), false);
    out.insert(out.end(), l.begin(), l.end());
  }
  return out;
}

}  // namespace

// The row-wise ops against the CPU's on random rows of odd sizes: RMSNorm, SwiGLU, bias, each with its
// f32 output (70 rows: the prompt kernels), SwiGLU's f16 output (a prompt step's down input), the int8
// activations RMSNorm and SwiGLU write for the next product (whole 32-blocks), and the device argmax (ties to the lowest index, NaNs skipped) against argmax_logits.
TEST(GpuOpsTest, RowOpsMatchTheCpuOnOddSizes) {
  SKIP_WITHOUT_GPU();
  Rng rng(11);
  auto randoms = [&](size_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = (float)rng.normal();
    return v;
  };
  for (int n_rows : {1, 3, 9, 70})
    for (int n : {1, 31, 100, 257, 4099, 160}) {
      SCOPED_TRACE(std::to_string(n_rows) + " rows of " + std::to_string(n));
      const auto a = randoms((size_t)n_rows * n), w = randoms((size_t)n), up = randoms((size_t)n_rows * n);
      std::vector<float> norm((size_t)n_rows * n), swiglu((size_t)n_rows * n), biased((size_t)n_rows * n);
      for (int r = 0; r < n_rows; ++r) {
        cpu::rms_norm(a.data() + (size_t)r * n, w.data(), norm.data() + (size_t)r * n, n, 1e-5f);
        for (int i = 0; i < n; ++i) {
          const size_t k = (size_t)r * n + i;
          swiglu[k] = cpu::silu(a[k]) * up[k];
          biased[k] = a[k] + w[i];
        }
      }
      const auto g_norm = gpu_op_for_test(GpuOpForTest::RmsNorm, a, w, n_rows, n, 1e-5f);
      const auto g_swiglu = gpu_op_for_test(GpuOpForTest::Swiglu, a, up, n_rows, n);
      const auto g_bias = gpu_op_for_test(GpuOpForTest::AddBias, a, w, n_rows, n);
      EXPECT_LT(test::nmse(g_norm.data(), norm.data(), norm.size()), 1e-10);
      EXPECT_LT(test::nmse(g_swiglu.data(), swiglu.data(), swiglu.size()), 1e-10);
      // The f16 form (prompt steps: down's input; 16-byte path where n % 8 == 0): f16 rounding, ~1e-7.
      const auto h_swiglu = gpu_op_for_test(GpuOpForTest::SwigluF16, a, up, n_rows, n);
      EXPECT_LT(test::nmse(h_swiglu.data(), swiglu.data(), swiglu.size()), 1e-6);
      EXPECT_EQ(g_bias, biased);
      if (n_rows > 8 && n % 4 == 0) {
        // The norm's f16 rows (a prompt GEMM's input): exactly its f32 output converted as gemm converts,
        // saturated at the f16 range (one weight large enough to push every row's first value past it).
        auto w_big = w;
        w_big[0] = 1e6f;
        const auto f = gpu_op_for_test(GpuOpForTest::RmsNorm, a, w_big, n_rows, n, 1e-5f);
        const auto h = gpu_op_for_test(GpuOpForTest::RmsNormF16, a, w_big, n_rows, n, 1e-5f);
        ASSERT_EQ(h.size(), f.size());
        for (size_t i = 0; i < f.size(); ++i)
          ASSERT_EQ(h[i], fp16_to_f32(f32_to_fp16(std::min(65504.0f, std::max(-65504.0f, f[i]))))) << "value " << i;
        int saturated = 0;
        for (int r = 0; r < n_rows; ++r) saturated += std::fabs(h[(size_t)r * n]) == 65504.0f;
        EXPECT_GT(saturated, n_rows / 2);
      }
      if (n % 32 == 0) {  // int8 rows: round-to-nearest in blocks of 32, so ~(1/127)^2 / 12 relative
        const auto q_norm = gpu_op_for_test(GpuOpForTest::RmsNormInt8, a, w, n_rows, n, 1e-5f);
        const auto q_swiglu = gpu_op_for_test(GpuOpForTest::SwigluInt8, a, up, n_rows, n);
        EXPECT_LT(test::nmse(q_norm.data(), norm.data(), norm.size()), 1e-4);
        EXPECT_LT(test::nmse(q_swiglu.data(), swiglu.data(), swiglu.size()), 1e-4);
      }
      // Argmax with a tie (the first maximum wins) and a NaN in every row.
      auto x = a;
      for (int r = 0; r < n_rows && n > 2; ++r) {
        float* row = x.data() + (size_t)r * n;
        const int m = (int)(std::max_element(row, row + n) - row);
        row[(m + 1) % n] = row[m];
        row[(m + 2) % n] = std::nanf("");
      }
      const auto g_arg = gpu_op_for_test(GpuOpForTest::Argmax, x, {}, n_rows, n);
      for (int r = 0; r < n_rows; ++r) EXPECT_EQ((int)g_arg[r], argmax_logits(x.data() + (size_t)r * n, n)) << "row " << r;
      // Argmax among allowed tokens (constrained decoding): masks sparse, dense, of whole 64-token words,
      // and empty; one row unmasked; ties among allowed tokens; -inf and NaN logits never picked.
      std::vector<float> allowed(x.size());
      std::vector<std::vector<uint64_t>> words((size_t)n_rows, std::vector<uint64_t>(((size_t)n + 63) / 64, 0));
      std::mt19937 mrng((unsigned)(n * 7 + n_rows));
      for (int r = 0; r < n_rows; ++r) {
        float* row = x.data() + (size_t)r * n;
        for (int t = 0; t < n; ++t) {
          const int kind = r % 5;  // 0 sparse, 1 dense, 2 words, 3 none allowed, 4 no mask at all
          const bool ok = kind == 0 ? mrng() % 17 == 0 : kind == 1 ? mrng() % 4 != 0 : kind == 2 ? (t / 64) % 3 == 1 : false;
          allowed[(size_t)r * n + t] = kind == 4 ? -1.0f : ok ? 1.0f : 0.0f;
          if (ok) words[(size_t)r][(size_t)t / 64] |= 1ull << (t % 64);
        }
        if (r % 5 == 0 && n > 8) row[3] = -INFINITY, row[5] = row[7];  // ties and -inf among what may be allowed
      }
      const auto g_allowed = gpu_op_for_test(GpuOpForTest::ArgmaxAllowed, x, allowed, n_rows, n);
      for (int r = 0; r < n_rows; ++r) {
        const float* row = x.data() + (size_t)r * n;
        const int want = r % 5 == 4 ? argmax_logits(row, n) : argmax_allowed(row, n, words[(size_t)r].data());
        EXPECT_EQ((int)g_allowed[r], want) << "masked row " << r << " of " << n;
        if (r % 5 == 3) {
          EXPECT_EQ(want, -1);
        }
      }
    }
}

// The argmax over rows as long as vocabularies (a row's chunks on CTAs of their own, merged by the last to finish):
// the first maximum wins across chunks (a tie placed in an earlier and in a later chunk), NaNs are skipped (at a
// chunk's first value too), a NaN first value gives 0, a row of -inf gives 0 (-1 masked), and masks whose only
// allowed tokens sit in the last chunk. Each shape twice: the per-row counters must be left at zero.
TEST(GpuOpsTest, ArgmaxOfVocabularyRowsMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  Rng rng(23);
  for (int n : {2049, 151936, 262151})
    for (int n_rows : {1, 7}) {
      SCOPED_TRACE(std::to_string(n_rows) + " rows of " + std::to_string(n));
      std::vector<float> x((size_t)n_rows * n), allowed(x.size(), 0.0f);
      for (float& v : x) v = (float)rng.normal();
      const int n_chunks = std::min(64, (n + 2047) / 2048), chunk = (n + n_chunks - 1) / n_chunks;  // the kernel's chunks
      for (int r = 0; r < n_rows; ++r) {
        float* row = x.data() + (size_t)r * n;
        switch (r % 7) {
          case 0: row[n - 3] = 9.0f, row[n / 3] = 9.0f; break;                   // a tie: the earlier one wins
          case 1: row[0] = std::nanf(""); break;                                   // NaN first: 0
          case 2: std::fill(row, row + n, -INFINITY); row[n / 2] = std::nanf(""); break;  // nothing above -inf: 0
          case 3: for (int i = chunk; i < n; i += chunk) row[i] = std::nanf(""); row[n - 1] = 7.0f; break;  // NaN chunk starts
          case 4: row[n - 1] = INFINITY, row[5] = INFINITY; break;
          default: row[rng.next_u64() % (uint64_t)n] = 5.0f; break;
        }
        float* mask = allowed.data() + (size_t)r * n;
        if (r % 7 == 5) std::fill(mask, mask + n, -1.0f);  // no mask: the plain argmax
        else if (r % 7 == 6) for (int i = n - 50; i < n; i += 7) mask[i] = 1.0f;  // allowed only in the last chunk
        else if (r % 7 == 2) mask[n / 4] = 1.0f;  // allowed, but -inf: none
        else for (int i = 0; i < n; i += 3) mask[i] = 1.0f;
      }
      for (int again = 0; again < 2; ++again) {
        const auto plain = gpu_op_for_test(GpuOpForTest::Argmax, x, {}, n_rows, n);
        const auto masked = gpu_op_for_test(GpuOpForTest::ArgmaxAllowed, x, allowed, n_rows, n);
        for (int r = 0; r < n_rows; ++r) {
          const float* row = x.data() + (size_t)r * n;
          EXPECT_EQ((int)plain[(size_t)r], argmax_logits(row, n)) << "row " << r;
          std::vector<uint64_t> words(((size_t)n + 63) / 64, 0);
          for (int t = 0; t < n; ++t)
            if (allowed[(size_t)r * n + t] > 0) words[(size_t)t / 64] |= 1ull << (t % 64);
          const int want = r % 7 == 5 ? argmax_logits(row, n) : argmax_allowed(row, n, words.data());
          EXPECT_EQ((int)masked[(size_t)r], want) << "masked row " << r;
        }
      }
    }
  // The cases' own answers, so the test cannot pass by agreeing with a wrong reference.
  std::vector<float> row(151936, 0.5f);
  row[100000] = 2.0f, row[20000] = 2.0f, row[0] = std::nanf("");
  EXPECT_EQ(argmax_logits(row.data(), (int)row.size()), 0);
  EXPECT_EQ((int)gpu_op_for_test(GpuOpForTest::Argmax, row, {}, 1, (int)row.size())[0], 0);
  row[0] = 0.0f;
  EXPECT_EQ((int)gpu_op_for_test(GpuOpForTest::Argmax, row, {}, 1, (int)row.size())[0], 20000);
}

// Gemma 3's fused post-norm kernel (decode steps): x += rmsnorm(y) * w, then rmsnorm(x) * w2 and its int8
// form, against the CPU's norm and adds, at 1-8 rows and widths from one 32-block to the largest it takes.
TEST(GpuOpsTest, FusedPostNormMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  Rng rng(12);
  auto randoms = [&](size_t n, double scale) {
    std::vector<float> v(n);
    for (float& x : v) x = (float)(scale * rng.normal());
    return v;
  };
  for (int n_rows : {1, 3, 8})
    for (int n : {32, 160, 5376, 8192}) {
      SCOPED_TRACE(std::to_string(n_rows) + " rows of " + std::to_string(n));
      const size_t na = (size_t)n_rows * n;
      const auto y = randoms(na, 3.0), x = randoms(na, 1.0), w = randoms((size_t)n, 1.0), w2 = randoms((size_t)n, 1.0);
      std::vector<float> x_new(na), out(na), normed((size_t)n);
      for (int r = 0; r < n_rows; ++r) {
        const size_t o = (size_t)r * n;
        cpu::rms_norm(y.data() + o, w.data(), normed.data(), n, 1e-6f);
        for (int i = 0; i < n; ++i) x_new[o + i] = x[o + i] + normed[i];
        cpu::rms_norm(x_new.data() + o, w2.data(), out.data() + o, n, 1e-6f);
      }
      std::vector<float> a = y, b = w;
      a.insert(a.end(), x.begin(), x.end());
      b.insert(b.end(), w2.begin(), w2.end());
      const auto g_x = gpu_op_for_test(GpuOpForTest::PostNormAdd, a, b, n_rows, n, 1e-6f);
      const auto g_out = gpu_op_for_test(GpuOpForTest::PostNormAddNorm, a, b, n_rows, n, 1e-6f);
      const auto g_q = gpu_op_for_test(GpuOpForTest::PostNormAddInt8, a, b, n_rows, n, 1e-6f);
      EXPECT_LT(test::nmse(g_x.data(), x_new.data(), na), 1e-10);
      EXPECT_LT(test::nmse(g_out.data(), out.data(), na), 1e-10);
      EXPECT_LT(test::nmse(g_q.data(), out.data(), na), 1e-4);  // int8 blocks of 32, as the other int8 ops
      // The int8 form is the float output's, block by block: amax / 127 scales, values rounded to nearest.
      for (size_t blk = 0; blk < na / 32; ++blk) {
        float amax = 0;
        for (int k = 0; k < 32; ++k) amax = std::max(amax, std::fabs(g_out[32 * blk + k]));
        const float d = amax / 127.0f, inv = d > 0 ? 1.0f / d : 0.0f;
        for (int k = 0; k < 32; ++k) {
          const size_t i = 32 * blk + k;
          ASSERT_EQ(g_q[i], (float)std::nearbyint(g_out[i] * inv) * d) << "block " << blk << " value " << k;
        }
      }
    }
  // What it does not take fails in one line instead of running.
  EXPECT_THROW(gpu_op_for_test(GpuOpForTest::PostNormAdd, std::vector<float>(2 * 9 * 32), std::vector<float>(64), 9, 32), Error);
}

TEST(GpuEngineTest, FullOffloadMatchesCpuForEveryMix) {
  SKIP_WITHOUT_GPU();
  for (const char* spec : {"tiny-qwen3:F32", "tiny-qwen3:F16", "tiny-qwen3:Q8_0", "tiny-qwen3:Q4_K_M", "tiny-llama:Q6_K",
                           "tiny-qwen2:Q5_K_M", "tiny-llama:Q2_K", "tiny-qwen3:Q3_K_M", "tiny-qwen3:IQ4_XS",
                           "tiny-qwen2:Q4_0", "tiny-llama:Q5_0", "tiny-qwen3:Q4_1", "tiny-qwen2:Q5_1", "tiny-llama:IQ4_NL",
                           "tiny-qwen3:BF16"}) {
    auto model = tiny(spec);
    const auto tokens = some_tokens(24, model->hparams().n_vocab);
    EngineOptions cpu, gpu = all_on_gpu();
    const auto a = run_logits(model, cpu, tokens), b = run_logits(model, gpu, tokens);
    ASSERT_EQ(a.size(), b.size());
    const double e = test::nmse(b.data(), a.data(), a.size());
    std::printf("%-20s GPU vs CPU logits NMSE %.3g\n", spec, e);
    EXPECT_LT(e, 2e-3) << spec;
  }
}

// Layer split: two backends on one GPU (each with its own buffers, stream and KV blocks, the hidden
// state crossing through host memory) give the same logits as one; also behind CPU layers.
TEST(GpuEngineTest, LayerSplitOverTwoBackendsMatchesOne) {
  SKIP_WITHOUT_GPU();
  auto model = tiny("tiny-qwen3:Q4_K_M");  // 2 layers + output = 3 units
  const auto tokens = some_tokens(20, model->hparams().n_vocab);
  EngineOptions one = all_on_gpu();
  const auto ref = run_logits(model, one, tokens);
  for (auto [ngl, ts] : std::vector<std::pair<int, std::vector<double>>>{{3, {1, 1}}, {3, {1, 2}}, {3, {2, 1}}}) {
    EngineOptions o;
    o.n_gpu_layers = ngl;
    o.gpu_ids = {0, 0};
    o.tensor_split = ts;
    auto engine = Engine::create(model, o);
    int gpu_ranges = 0;
    for (const auto& p : engine->placements()) gpu_ranges += p.gpu ? 1 : 0;
    EXPECT_EQ(gpu_ranges, 2);
    const auto l = run_logits(model, o, tokens);
    EXPECT_EQ(l, ref) << "-ts " << ts[0] << "," << ts[1];
  }
  EngineOptions partial_one, partial_two;
  partial_one.n_gpu_layers = partial_two.n_gpu_layers = 2;
  partial_two.gpu_ids = {0, 0};
  partial_two.tensor_split = {1, 1};
  EXPECT_EQ(run_logits(model, partial_two, tokens), run_logits(model, partial_one, tokens));
}

// On a machine with two GPUs: a layer split over GPU 0 and GPU 1 gives the logits of GPU 0 alone.
TEST(GpuEngineTest, LayerSplitOverTwoGpusMatchesOne) {
  SKIP_WITHOUT_GPU();
  if (gpu_devices().size() < 2) GTEST_SKIP() << "needs two GPUs";
  auto model = tiny("qwen3-0.6b:Q4_K_M");
  const auto tokens = some_tokens(40, model->hparams().n_vocab);
  EngineOptions one = all_on_gpu(), two = all_on_gpu();
  one.gpu_ids = {0};
  two.gpu_ids = {0, 1};
  two.tensor_split = {1, 1};
  EXPECT_EQ(run_logits(model, two, tokens), run_logits(model, one, tokens));
}

// Greedy rows picked on the GPU (Backend::output_argmax) give the CPU's argmax of the same logits, and
// the rows that want logits in the same step get them unchanged (packed around the greedy ones).
TEST(GpuEngineTest, DeviceArgmaxMatchesTheHostArgmax) {
  SKIP_WITHOUT_GPU();
  auto model = tiny("tiny-qwen3:Q4_K_M");
  const int n_vocab = model->hparams().n_vocab;
  EngineOptions o = all_on_gpu();
  auto a = Engine::create(model, o), b = Engine::create(model, o);
  std::vector<int> sa, sb;
  for (int i = 0; i < 3; ++i) {
    sa.push_back(a->memory().create_sequence());
    sb.push_back(b->memory().create_sequence());
  }
  const auto prompt = some_tokens(12, n_vocab);
  for (int i = 0; i < 3; ++i) {
    a->eval(sa[i], std::span<const int32_t>(prompt.data(), 4 + i), false);
    b->eval(sb[i], std::span<const int32_t>(prompt.data(), 4 + i), false);
  }
  // Row 2 is constrained from the third step on (a mask of every third token, then of none): its
  // greedy token is the best allowed one (argmax_allowed of the same logits), -1 when none is allowed.
  std::vector<uint64_t> every_third(((size_t)n_vocab + 63) / 64, 0), none(every_third.size(), 0);
  for (int v = 0; v < n_vocab; v += 3) every_third[(size_t)v / 64] |= 1ull << (v % 64);
  for (int t = 0; t < 6; ++t) {
    const int32_t tok = prompt[t];
    std::vector<Engine::BatchRow> rows_a, rows_b;
    for (int i = 0; i < 3; ++i) {
      rows_a.push_back({sa[i], tok, true, i != 1});  // the middle row wants its logits
      rows_b.push_back({sb[i], tok, true, false});
    }
    const uint64_t* mask = t < 2 ? nullptr : t < 5 ? every_third.data() : none.data();
    rows_a[2].allowed = mask;
    const auto& out = a->step(rows_a);
    const auto ref = b->decode(rows_b);
    for (int i = 0; i < 3; ++i) {
      const float* ref_row = ref.data() + (size_t)i * n_vocab;
      if (i == 1) {
        ASSERT_NE(out.logits[i], nullptr);
        EXPECT_EQ(std::vector<float>(out.logits[i], out.logits[i] + n_vocab), std::vector<float>(ref_row, ref_row + n_vocab));
      } else if (i == 2 && mask) {
        const int32_t want = argmax_allowed(ref_row, n_vocab, mask);
        EXPECT_EQ(out.argmax[i], want) << "step " << t << " masked row";
        if (mask == none.data()) EXPECT_EQ(want, -1);
        else EXPECT_EQ(want % 3, 0);
      } else {
        EXPECT_EQ(out.argmax[i], argmax_logits(ref_row, n_vocab)) << "step " << t << " row " << i;
      }
    }
  }
}

// step() hands out the logits where the GPU backend staged them (its pinned buffer, no copy into the
// StepOutput): the same values as decode()'s copy, for steps of one row and of a batch, at every step.
TEST(GpuEngineTest, StepLogitsAreTheStagedRowsWithoutACopy) {
  SKIP_WITHOUT_GPU();
  auto model = tiny("tiny-qwen3:Q4_K_M");
  const int n_vocab = model->hparams().n_vocab;
  EngineOptions o = all_on_gpu();
  auto a = Engine::create(model, o), b = Engine::create(model, o);
  for (int n_rows : {1, 12}) {
    std::vector<int> sa, sb;
    for (int i = 0; i < n_rows; ++i) {
      sa.push_back(a->memory().create_sequence());
      sb.push_back(b->memory().create_sequence());
    }
    const auto tokens = some_tokens(3 * n_rows, n_vocab);
    for (int t = 0; t < 3; ++t) {
      std::vector<Engine::BatchRow> rows_a, rows_b;
      for (int i = 0; i < n_rows; ++i) {
        rows_a.push_back({sa[i], tokens[(size_t)(t * n_rows + i)], true});
        rows_b.push_back({sb[i], tokens[(size_t)(t * n_rows + i)], true});
      }
      const auto& out = a->step(rows_a);
      EXPECT_TRUE(out.buffer.empty()) << "the logits were copied out of the staging buffer";
      const auto ref = b->decode(rows_b);
      ASSERT_EQ(out.logits.size(), (size_t)n_rows);
      for (int i = 0; i < n_rows; ++i)
        ASSERT_EQ(std::vector<float>(out.logits[i], out.logits[i] + n_vocab),
                  std::vector<float>(ref.begin() + (ptrdiff_t)i * n_vocab, ref.begin() + (ptrdiff_t)(i + 1) * n_vocab))
            << n_rows << " rows, step " << t << ", row " << i;
    }
    for (int i = 0; i < n_rows; ++i) {
      a->memory().free_sequence(sa[i]);
      b->memory().free_sequence(sb[i]);
    }
  }
}

// --vram-limit: -ngl auto fits under it, an explicit -ngl over it is refused with the numbers.
TEST(GpuEngineTest, VramLimitCapsPlacement) {
  SKIP_WITHOUT_GPU();
  auto model = tiny("tiny-qwen3:Q4_K_M");
  EngineOptions o = all_on_gpu();
  o.gpu_margin_gib = 0;
  o.vram_limit_gib = {0.0001};
  try {
    Engine::create(model, o);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--vram-limit"), std::string::npos) << e.what();
  }
  o.n_gpu_layers = EngineOptions::kGpuLayersAuto;
  EXPECT_EQ(Engine::create(model, o)->gpu_units(), 0);
  o.vram_limit_gib = {64};
  auto engine = Engine::create(model, o);
  std::string report;
  for (const auto& line : engine->report()) report += line + "\n";
  EXPECT_EQ(engine->gpu_units(), 3) << report;
}

TEST(GpuEngineTest, PartialOffloadAndKvTypes) {
  SKIP_WITHOUT_GPU();
  auto model = tiny("tiny-qwen3:Q4_K_M");  // 2 layers + output = 3 units
  const auto tokens = some_tokens(20, model->hparams().n_vocab);
  EngineOptions cpu;
  const auto ref = run_logits(model, cpu, tokens);
  for (int ngl : {1, 2, 3}) {
    EngineOptions o;
    o.n_gpu_layers = ngl;
    const auto l = run_logits(model, o, tokens);
    EXPECT_LT(test::nmse(l.data(), ref.data(), ref.size()), 2e-3) << "-ngl " << ngl;
  }
  for (DType kv : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0}) {
    EngineOptions c, g = all_on_gpu();
    c.type_k = c.type_v = g.type_k = g.type_v = kv;
    const auto a = run_logits(model, c, tokens), b = run_logits(model, g, tokens);
    const double e = test::nmse(b.data(), a.data(), a.size());
    std::printf("KV %-5s GPU vs CPU logits NMSE %.3g\n", dtype_name(kv).c_str(), e);
    EXPECT_LT(e, kv == DType::Q4_0 ? 2e-2 : 3e-3) << dtype_name(kv);
  }
}

// With the separate norm / SwiGLU / combine kernels and with the decode epilogues and the split kernel's
// combine (ROOFLINE_FUSED_INPUTS, ROOFLINE_SPLIT_COMBINE: read when a backend is created).
TEST(GpuEngineTest, DecodeBatchesAreInvariantAndReproducible) {
  SKIP_WITHOUT_GPU();
  auto model = tiny("tiny-llama:Q4_K_M");
  const int n_vocab = model->hparams().n_vocab;
  EngineOptions o = all_on_gpu();
  const auto prompt_a = some_tokens(5, n_vocab, 1), prompt_b = some_tokens(6, n_vocab, 2);
  for (const char* fused : {"0", "1"}) {
    SCOPED_TRACE(std::string("fused ") + fused);
    setenv("ROOFLINE_FUSED_INPUTS", fused, 1);
    setenv("ROOFLINE_SPLIT_COMBINE", fused, 1);
    auto decode_alone = [&]() {
      auto e = Engine::create(model, o);
      const int s = e->memory().create_sequence();
      std::vector<float> out;
      for (int32_t t : prompt_a) {  // one row per step: matvec path throughout
        auto l = e->eval(s, std::span<const int32_t>(&t, 1), false);
        out.insert(out.end(), l.begin(), l.end());
      }
      return out;
    };
    const auto alone = decode_alone();
    EXPECT_EQ(alone, decode_alone()) << "reproducible";
    auto e = Engine::create(model, o);
    unsetenv("ROOFLINE_FUSED_INPUTS");
    unsetenv("ROOFLINE_SPLIT_COMBINE");
    const int sb = e->memory().create_sequence(), sa = e->memory().create_sequence();
    for (size_t i = 0; i < prompt_a.size(); ++i) {
      std::vector<Engine::BatchRow> batch = {{sb, prompt_b[i], false}, {sa, prompt_a[i], true}};
      auto l = e->decode(batch);
      ASSERT_EQ(l.size(), (size_t)n_vocab);
      EXPECT_EQ(0, std::memcmp(l.data(), alone.data() + i * n_vocab, n_vocab * sizeof(float))) << "step " << i;
    }
  }
}

// Decode rows hundreds of keys deep take several attention splits each (32-key spans at this depth),
// alone and in a 12-row batch (the batched path, where each row still takes its own spans).
TEST(GpuEngineTest, DecodeAtDepthOverSeveralSplitsMatchesCpu) {
  SKIP_WITHOUT_GPU();
  auto model = tiny("tiny-qwen3:Q4_K_M");
  const int n_vocab = model->hparams().n_vocab;
  const auto tokens = some_tokens(300, n_vocab, 3);  // prefill 150, then 150 one-row decode steps
  EngineOptions cpu, gpu = all_on_gpu();
  cpu.n_ctx = gpu.n_ctx = 4096;  // the 12 sequences below hold ~2400 positions
  const auto ref = run_logits(model, cpu, tokens), got = run_logits(model, gpu, tokens);
  EXPECT_LT(test::nmse(got.data(), ref.data(), ref.size()), 3e-3);

  constexpr int kRows = 12;
  auto c = Engine::create(model, cpu), g = Engine::create(model, gpu);
  std::vector<int> seq_c, seq_g;
  for (int i = 0; i < kRows; ++i) {
    const auto prompt = some_tokens(120 + 13 * i, n_vocab, 10 + i);
    seq_c.push_back(c->memory().create_sequence());
    seq_g.push_back(g->memory().create_sequence());
    c->eval(seq_c.back(), prompt, false);
    g->eval(seq_g.back(), prompt, false);
  }
  for (int step = 0; step < 3; ++step) {
    std::vector<Engine::BatchRow> rows_c, rows_g;
    for (int i = 0; i < kRows; ++i) {
      const int32_t t = (int32_t)((i * 37 + step * 11) % n_vocab);
      rows_c.push_back({seq_c[i], t, true});
      rows_g.push_back({seq_g[i], t, true});
    }
    const auto a = c->decode(rows_c), b = g->decode(rows_g);
    ASSERT_EQ(a.size(), (size_t)kRows * n_vocab);
    ASSERT_EQ(b.size(), a.size());
    EXPECT_LT(test::nmse(b.data(), a.data(), a.size()), 3e-3) << "step " << step;
  }
}

// Decode attention's kernel variants: the vectorized value sums with 8 and with 16 accumulators per
// chunk (groups of up to 8 and of 9-16 query heads, heads of 64 and 256), and the per-dimension kernel
// for value heads whose 8-value chunks do not tile a warp (96), and a mixed K/V type pair (the
// run-time-typed kernel). Tiny Qwen3 shapes with those head layouts (f16 weights, as the K-quants need
// rows of 256), prefilled then decoded 400 keys deep (13 splits), against the CPU engine; every KV type
// on the 12-head group.
TEST(GpuEngineTest, DecodeAttentionVariantsMatchCpu) {
  SKIP_WITHOUT_GPU();
  struct Variant {
    int n_head, n_head_kv, head_dim;
    const char* what;
  };
  for (const Variant v : {Variant{8, 1, 64, "group of 8, head 64"}, Variant{12, 1, 64, "group of 12, head 64"},
                          Variant{6, 2, 96, "group of 3, head 96 (per-dimension kernel)"},
                          Variant{16, 1, 256, "group of 16, head 256"}}) {
    SyntheticSpec spec = parse_synthetic_spec("synthetic:tiny-qwen3:F16");
    spec.shape.n_head = v.n_head;
    spec.shape.n_head_kv = v.n_head_kv;
    spec.shape.head_dim = v.head_dim;
    auto model = Model::load(build_synthetic_model(spec));
    const auto tokens = some_tokens(400, model->hparams().n_vocab, 5);  // prefill 200, then 200 decode steps
    for (DType kv : {DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::F32}) {
      if (kv != DType::F16 && v.n_head != 12) continue;
      EngineOptions cpu, gpu = all_on_gpu();
      cpu.n_ctx = gpu.n_ctx = 512;
      cpu.type_k = gpu.type_k = kv;
      cpu.type_v = gpu.type_v = kv == DType::F32 ? DType::Q8_0 : kv;  // the last: a mixed pair
      const auto ref = run_logits(model, cpu, tokens), got = run_logits(model, gpu, tokens);
      const double e = test::nmse(got.data(), ref.data(), ref.size());
      const std::string types = dtype_name(gpu.type_k) + "/" + dtype_name(gpu.type_v);
      std::printf("%-42s KV %-9s GPU vs CPU logits NMSE %.3g\n", v.what, types.c_str(), e);
      EXPECT_LT(e, kv == DType::Q4_0 ? 2e-2 : 3e-3) << v.what << " KV " << types;
    }
  }
}

// Prompt chunks of 32+ rows reaching 256+ keys take the prefill attention path (tensor-core products
// over tiles of keys); with 64-key tiles a 200-row chunk after 100 cached positions spans five tiles
// and every row's causal mask cuts one. Also a mixed step: one decode row of a sequence beside a
// 40-row chunk of another at positions 250-289 (the other rows go through the split-KV kernel).
TEST(GpuEngineTest, PrefillAttentionMatchesCpuOverSeveralKeyTiles) {
  SKIP_WITHOUT_GPU();
  auto model = tiny("tiny-qwen3:Q4_K_M");
  const int n_vocab = model->hparams().n_vocab;
  const auto tokens = some_tokens(300, n_vocab, 5);
  auto prompt_logits = [&](EngineOptions o) {
    auto e = Engine::create(model, o);
    const int s = e->memory().create_sequence();
    auto out = e->eval(s, std::span<const int32_t>(tokens.data(), 100), true);
    auto more = e->eval(s, std::span<const int32_t>(tokens.data() + 100, 200), true);
    out.insert(out.end(), more.begin(), more.end());
    return out;
  };
  for (const char* tile : {"64", "1024"}) {
    setenv("ROOFLINE_ATTN_KEY_TILE", tile, 1);
    for (DType kv : {DType::F16, DType::Q8_0, DType::BF16}) {
      EngineOptions c, g = all_on_gpu();
      c.type_k = c.type_v = g.type_k = g.type_v = kv;
      const auto a = prompt_logits(c), b = prompt_logits(g);
      ASSERT_EQ(a.size(), b.size());
      const double e = test::nmse(b.data(), a.data(), a.size());
      std::printf("prefill, key tile %s, KV %-5s: GPU vs CPU logits NMSE %.3g\n", tile, dtype_name(kv).c_str(), e);
      EXPECT_LT(e, 3e-3) << "tile " << tile << " KV " << dtype_name(kv);
    }
  }
  unsetenv("ROOFLINE_ATTN_KEY_TILE");

  EngineOptions c, g = all_on_gpu();
  auto mixed = [&](EngineOptions o) {
    auto e = Engine::create(model, o);
    const int sa = e->memory().create_sequence(), sb = e->memory().create_sequence();
    e->eval(sa, std::span<const int32_t>(tokens.data(), 50), false);
    e->eval(sb, std::span<const int32_t>(tokens.data() + 50, 250), false);
    std::vector<Engine::BatchRow> rows = {{sa, tokens[50], true}};
    for (int i = 0; i < 40; ++i) rows.push_back({sb, tokens[i], true});
    return e->decode(rows);
  };
  const auto a = mixed(c), b = mixed(g);
  ASSERT_EQ(a.size(), (size_t)41 * n_vocab);
  ASSERT_EQ(b.size(), a.size());
  EXPECT_LT(test::nmse(b.data(), a.data(), a.size()), 3e-3);
}

// A decode bucket's graph is captured by its first step: here bucket 4 with 3 real rows, then replayed
// with 4. Every real row of the replay must be computed: the 4th row's logits equal its sequence's
// decoded alone (decode steps are batch-invariant).
TEST(GpuEngineTest, BucketGraphsServeEveryRealRow) {
  SKIP_WITHOUT_GPU();
  auto model = tiny("tiny-llama:Q4_K_M");
  const int n_vocab = model->hparams().n_vocab;
  EngineOptions o = all_on_gpu();
  auto batched = Engine::create(model, o), alone = Engine::create(model, o);
  std::vector<int> seqs;
  for (int i = 0; i < 4; ++i) {
    seqs.push_back(batched->memory().create_sequence());
    const int32_t t = (int32_t)(7 + 13 * i);
    batched->eval(seqs.back(), std::span<const int32_t>(&t, 1), false);
  }
  const int s_alone = alone->memory().create_sequence();
  const int32_t first = 7 + 13 * 3;
  alone->eval(s_alone, std::span<const int32_t>(&first, 1), false);
  std::vector<Engine::BatchRow> three;
  for (int i = 0; i < 3; ++i) three.push_back({seqs[i], (int32_t)(100 + i), true});
  batched->decode(three);  // captures bucket 4 with 3 real rows
  std::vector<Engine::BatchRow> four;
  for (int i = 0; i < 4; ++i) four.push_back({seqs[i], (int32_t)(200 + i), true});
  four[3].token = 100 + 3;  // the 4th sequence's first decoded token: the alone run decodes the same
  const auto got = batched->decode(four);
  const int32_t t = 100 + 3;
  const auto want = alone->eval(s_alone, std::span<const int32_t>(&t, 1), false);
  ASSERT_EQ(got.size(), (size_t)4 * n_vocab);
  EXPECT_EQ(0, std::memcmp(got.data() + 3 * n_vocab, want.data(), n_vocab * sizeof(float)));
}

TEST(GpuEngineTest, CudaGraphsGiveTheSameLogits) {
  SKIP_WITHOUT_GPU();
  auto model = tiny("tiny-qwen3:Q4_K_M");
  EngineOptions o = all_on_gpu();
  const auto tokens = some_tokens(12, model->hparams().n_vocab);
  const auto with_graphs = run_logits(model, o, tokens);
  setenv("ROOFLINE_NO_CUDA_GRAPHS", "1", 1);
  const auto without = run_logits(model, o, tokens);
  unsetenv("ROOFLINE_NO_CUDA_GRAPHS");
  EXPECT_EQ(with_graphs, without);
}

// Decode steps launch attention's split kernel over the splits their rows need (a power of two), not over
// every split the pool could need, and capture a graph per such grid: decoding from 100 to 200 keys deep (4
// to 7 splits of 32 keys: grids of 4 and 8) gives the same bits with graphs and without, and with a pool of
// 16384 positions (128 splits at most) as with one of 256 (8).
TEST(GpuEngineTest, DecodeGraphsFollowTheAttentionGrid) {
  SKIP_WITHOUT_GPU();
  auto model = tiny("tiny-qwen3:Q4_K_M");
  const auto tokens = some_tokens(200, model->hparams().n_vocab, 5);
  EngineOptions big = all_on_gpu(), small = all_on_gpu();
  big.n_ctx = 16384;
  small.n_ctx = 256;
  const auto with_graphs = run_logits(model, big, tokens);
  EXPECT_EQ(with_graphs, run_logits(model, small, tokens)) << "the pool's size changed a row's attention";
  setenv("ROOFLINE_NO_CUDA_GRAPHS", "1", 1);
  const auto without = run_logits(model, big, tokens);
  unsetenv("ROOFLINE_NO_CUDA_GRAPHS");
  EXPECT_EQ(with_graphs, without) << "a graph captured for a smaller attention grid was replayed";
}

// Prompt GEMM weights dequantized ahead on a side stream (ROOFLINE_DEQUANT_AHEAD, cuda_dequant_ahead.cuh):
// prompt steps of several lengths, a batched step between them (its fused products record nothing) and
// a second sequence. With cuBLAS on every SM the products are the same, so the logits are bit-identical
// to dequantizing on the step's stream; with SMs left to the side stream cuBLAS may sum in another order.
TEST(GpuEngineTest, WeightsDequantizedAheadGiveTheSameLogits) {
  SKIP_WITHOUT_GPU();
  auto model = tiny("tiny-qwen3:Q4_K_M");
  const auto tokens = some_tokens(400, model->hparams().n_vocab, 9);
  EngineOptions o = all_on_gpu();
  o.f16_copies = F16Copies::Off;  // weights with copies dequantize nothing
  auto run = [&]() {
    auto e = Engine::create(model, o);
    const int sa = e->memory().create_sequence(), sb = e->memory().create_sequence();
    auto out = e->eval(sa, std::span<const int32_t>(tokens.data(), 100), true);
    auto add = [&](std::vector<float> more) { out.insert(out.end(), more.begin(), more.end()); };
    add(e->eval(sa, std::span<const int32_t>(tokens.data() + 100, 150), true));
    std::vector<Engine::BatchRow> rows;
    for (int i = 0; i < 20; ++i) rows.push_back({sa, tokens[(size_t)(250 + i)], true});
    add(e->decode(rows));
    add(e->eval(sb, std::span<const int32_t>(tokens.data() + 270, 120), true));
    add(e->eval(sa, std::span<const int32_t>(tokens.data() + 280, 90), true));
    return out;
  };
  setenv("ROOFLINE_DEQUANT_AHEAD", "0", 1);  // (on by default on GPUs of 64 GiB and more)
  const auto plain = run();
  setenv("ROOFLINE_DEQUANT_AHEAD", "2", 1);
  setenv("ROOFLINE_DEQUANT_AHEAD_SMS", "0", 1);
  const auto ahead = run();
  setenv("ROOFLINE_DEQUANT_AHEAD", "3", 1);
  setenv("ROOFLINE_DEQUANT_AHEAD_SMS", "8", 1);
  const auto ahead_fewer_sms = run();
  unsetenv("ROOFLINE_DEQUANT_AHEAD");
  unsetenv("ROOFLINE_DEQUANT_AHEAD_SMS");
  ASSERT_EQ(plain.size(), ahead.size());
  EXPECT_EQ(plain, ahead);
  ASSERT_EQ(plain.size(), ahead_fewer_sms.size());
  EXPECT_LT(test::nmse(ahead_fewer_sms.data(), plain.data(), plain.size()), 1e-8);
}

// Prompt norms and prompt attention writing their products' f16 inputs themselves (ROOFLINE_F16_OUTPUTS):
// the same values converted the same way as gemm converts an f32 output, so the logits are bit-identical
// to converting. Prompts of several lengths at depth 0 and deeper, a step mixing a prompt run with decode
// rows (its attention output stays f32), batched steps of 20 and 40 rows, a model with post-norms (Gemma 3)
// and one whose weights take no fused batched product at 9-64 rows (Q8_0).
TEST(GpuEngineTest, PromptF16OutputsGiveTheSameLogits) {
  SKIP_WITHOUT_GPU();
  for (const char* name : {"tiny-qwen3:Q4_K_M", "tiny-qwen3:Q8_0", "tiny-gemma3:Q8_0"}) {
    SCOPED_TRACE(name);
    auto model = tiny(name);
    const auto tokens = some_tokens(640, model->hparams().n_vocab, 5);
    auto run = [&]() {
      auto e = Engine::create(model, all_on_gpu());
      const int sa = e->memory().create_sequence(), sb = e->memory().create_sequence();
      auto out = e->eval(sa, std::span<const int32_t>(tokens.data(), 100), true);  // split attention kernel
      auto add = [&](std::vector<float> more) { out.insert(out.end(), more.begin(), more.end()); };
      add(e->eval(sa, std::span<const int32_t>(tokens.data() + 100, 200), true));  // a prefill run (300 keys)
      add(e->eval(sb, std::span<const int32_t>(tokens.data() + 300, 200), true));
      std::vector<Engine::BatchRow> rows = {{sa, tokens[500], true}};  // a decode row beside a prefill run
      for (int i = 0; i < 90; ++i) rows.push_back({sb, tokens[(size_t)(510 + i)], true});
      add(e->decode(rows));
      rows.clear();
      for (int i = 0; i < 20; ++i) rows.push_back({sa, tokens[(size_t)(601 + i)], true});
      add(e->decode(rows));
      return out;
    };
    setenv("ROOFLINE_F16_OUTPUTS", "0", 1);
    const auto converted = run();
    unsetenv("ROOFLINE_F16_OUTPUTS");
    const auto direct = run();
    ASSERT_EQ(converted.size(), direct.size());
    EXPECT_EQ(converted, direct);
  }
}

// Prompt steps of a Q4_K_M model with every Q4_K product of 65-256 rows on the tiled GEMM (forced onto
// the tiny model's small matrices) against the cuBLAS path: the same f16 weights and activations, summed
// in another order; the residual products (o, down) add into the stream, the others write it.
TEST(GpuEngineTest, Q4KTileGemmPromptsMatchTheCublasPath) {
  SKIP_WITHOUT_GPU();
  auto model = tiny("tiny-qwen3:Q4_K_M");
  const auto tokens = some_tokens(520, model->hparams().n_vocab, 13);
  EngineOptions o = all_on_gpu();
  o.f16_copies = F16Copies::Off;  // a weight's f16 copy would take its products instead
  auto run = [&]() {
    auto e = Engine::create(model, o);
    const int sa = e->memory().create_sequence(), sb = e->memory().create_sequence();
    auto out = e->eval(sa, std::span<const int32_t>(tokens.data(), 100), true);
    auto add = [&](std::vector<float> more) { out.insert(out.end(), more.begin(), more.end()); };
    add(e->eval(sa, std::span<const int32_t>(tokens.data() + 100, 200), true));
    add(e->eval(sb, std::span<const int32_t>(tokens.data() + 300, 220), true));
    return out;
  };
  setenv("ROOFLINE_Q4K_TILE_GEMM", "0", 1);
  const int64_t calls0 = gpu_q4k_tile_gemm_calls_for_test();
  const auto cublas = run();
  EXPECT_EQ(gpu_q4k_tile_gemm_calls_for_test(), calls0);
  setenv("ROOFLINE_Q4K_TILE_GEMM", "256", 1);
  setenv("ROOFLINE_Q4K_TILE_GEMM_ANY", "1", 1);
  const auto tiled = run();
  unsetenv("ROOFLINE_Q4K_TILE_GEMM");
  unsetenv("ROOFLINE_Q4K_TILE_GEMM_ANY");
  // (With K of 256 and 768, the tiled sums and cuBLAS's may well agree to the bit, so the calls say it ran.)
  EXPECT_GT(gpu_q4k_tile_gemm_calls_for_test(), calls0);
  ASSERT_EQ(cublas.size(), tiled.size());
  EXPECT_LT(test::nmse(tiled.data(), cublas.data(), cublas.size()), 1e-6);
}

TEST(GpuEngineTest, ForkCopiesBlocksOnTheGpu) {
  SKIP_WITHOUT_GPU();
  auto model = tiny("tiny-qwen3:Q8_0");
  const int n_vocab = model->hparams().n_vocab;
  EngineOptions o = all_on_gpu();
  o.kv_block_size = 16;
  const auto prefix = some_tokens(21, n_vocab), tail = some_tokens(3, n_vocab, 4);
  auto e = Engine::create(model, o);
  const int s = e->memory().create_sequence();
  e->eval(s, prefix, false);
  const int f = e->fork_sequence(s);
  const auto lf = e->eval(f, tail, true);
  auto fresh = Engine::create(model, o);
  std::vector<int32_t> full = prefix;
  full.insert(full.end(), tail.begin(), tail.end());
  const int s2 = fresh->memory().create_sequence();
  fresh->eval(s2, prefix, false);
  const auto lr = fresh->eval(s2, tail, true);
  EXPECT_EQ(lf, lr);
}
