// Decode products of quantized weights give the same bits whatever path takes them: the one-token Q4_K kernel
// with its rounds of loads pipelined or not, one-token products with any rows a warp; products of 2-8 tokens with two or four Q4_K rows a warp, and on tensor
// cores (cuda_matvec_mma.cu), against the warp kernels and against one token at a time (skipped where no GPU is present, e.g. CI).
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <vector>

#include "backend/gpu.h"
#include "core/rng.h"
#include "engine/engine_test_util.h"
#include "engine/random_weight.h"
#include "test_util.h"

using namespace roofline;

// One-token Q4_K products with a warp's rounds of loads pipelined (matvec_q4_k's P = 2, for rows of up to
// ROOFLINE_MATVEC_PIPE super-blocks) give the bits of the plain loop: alone (rows of 3, 16, 20 and 33
// super-blocks, a short last warp) and joined with Q6_K as q/k/v are; and the reference's values.
TEST(GpuMatmulTest, PipelinedQ4KRowsGiveTheBitsOfThePlainLoop) {
  SKIP_WITHOUT_GPU();
  struct Restore {
    ~Restore() { gpu_set_matvec_pipe_for_test(-1); }
  } restore;
  Rng rng(23);
  for (const int64_t cols : {768, 4096, 5120, 8448}) {
    const test::RandomWeight q4(DType::Q4_K, 67, cols, rng), q6(DType::Q6_K, 45, cols, rng);
    std::vector<float> x((size_t)cols);
    for (float& v : x) v = (float)rng.normal();
    const Weight q4w = q4.weight(), q6w = q6.weight();
    std::vector<float> plain, piped, plain_joined, piped_joined;
    for (const int64_t max_sb : {(int64_t)0, (int64_t)1000}) {
      gpu_set_matvec_pipe_for_test(max_sb);
      (max_sb ? piped : plain) = gpu_matmul_for_test(q4w, x, 1);
      (max_sb ? piped_joined : plain_joined) = gpu_joined_products_for_test({&q4w, &q6w}, x, 1);
    }
    ASSERT_EQ(plain.size(), 67u);
    EXPECT_EQ(0, std::memcmp(plain.data(), piped.data(), plain.size() * sizeof(float))) << "Q4_K alone, cols " << cols;
    ASSERT_EQ(plain_joined.size(), 112u);
    EXPECT_EQ(0, std::memcmp(plain_joined.data(), piped_joined.data(), plain_joined.size() * sizeof(float))) << "Q4_K with Q6_K, cols " << cols;
    const std::vector<double> ref = q4.times(x, 0);
    std::vector<float> reff(ref.begin(), ref.end());
    EXPECT_LT(test::nmse(piped.data(), reff.data(), reff.size()), 2e-4) << "cols " << cols;
  }
}

// One-token products give the same bits with any rows a warp (the launch's rule picks them by its waves:
// one_token_rows, cuda_matvec.cu): Q4_K with two or four, Q6_K with one or two, alone and joined as q/k/v are
// (rows of 3, 16, 20 and 33 super-blocks, a short last warp).
TEST(GpuMatmulTest, OneTokenRowsAWarpGiveTheSameBits) {
  SKIP_WITHOUT_GPU();
  struct Restore {
    ~Restore() { gpu_set_matvec_one_token_rows_for_test(0, 0); }
  } restore;
  Rng rng(41);
  for (const int64_t cols : {768, 4096, 5120, 8448}) {
    const test::RandomWeight q4(DType::Q4_K, 67, cols, rng), q6(DType::Q6_K, 45, cols, rng);
    std::vector<float> x((size_t)cols);
    for (float& v : x) v = (float)rng.normal();
    const Weight q4w = q4.weight(), q6w = q6.weight();
    std::vector<float> q4_out[2], q6_out[2], joined[2];
    for (int form = 0; form < 2; ++form) {
      gpu_set_matvec_one_token_rows_for_test(form ? 4 : 2, form ? 2 : 1);
      q4_out[form] = gpu_matmul_for_test(q4w, x, 1);
      q6_out[form] = gpu_matmul_for_test(q6w, x, 1);
      joined[form] = gpu_joined_products_for_test({&q4w, &q6w}, x, 1);
    }
    ASSERT_EQ(q4_out[0].size(), 67u);
    ASSERT_EQ(q6_out[0].size(), 45u);
    ASSERT_EQ(joined[0].size(), 112u);
    EXPECT_EQ(0, std::memcmp(q4_out[0].data(), q4_out[1].data(), 67 * sizeof(float))) << "Q4_K, cols " << cols;
    EXPECT_EQ(0, std::memcmp(q6_out[0].data(), q6_out[1].data(), 45 * sizeof(float))) << "Q6_K, cols " << cols;
    EXPECT_EQ(0, std::memcmp(joined[0].data(), joined[1].data(), 112 * sizeof(float))) << "Q4_K with Q6_K, cols " << cols;
    const std::vector<double> ref4 = q4.times(x, 0), ref6 = q6.times(x, 0);
    const std::vector<float> ref4f(ref4.begin(), ref4.end()), ref6f(ref6.begin(), ref6.end());
    EXPECT_LT(test::nmse(q4_out[1].data(), ref4f.data(), ref4f.size()), 2e-4) << "Q4_K, cols " << cols;
    EXPECT_LT(test::nmse(q6_out[1].data(), ref6f.data(), ref6f.size()), 2e-4) << "Q6_K, cols " << cols;
  }
}

namespace {

// Products of 2-8 tokens of a Q4_K weight (67 rows: a short last warp or tile; rows of 3, 16, 20 and 33
// super-blocks), alone and joined with a Q6_K weight as q/k/v are, in the form `use(false)` selects and in the
// form `use(true)` selects: the same bits from both, and the second form's outputs for each token are the
// one-token product's of that token (a step's results do not depend on how many tokens it holds).
void expect_few_token_forms_agree(uint64_t seed, const std::function<void(bool)>& use) {
  Rng rng(seed);
  for (const int64_t cols : {768, 4096, 5120, 8448}) {
    const test::RandomWeight q4(DType::Q4_K, 67, cols, rng), q6(DType::Q6_K, 45, cols, rng);
    const Weight q4w = q4.weight(), q6w = q6.weight();
    for (int n = 2; n <= 8; ++n) {
      std::vector<float> x((size_t)(n * cols));
      for (float& v : x) v = (float)rng.normal();
      use(false);
      const std::vector<float> base = gpu_matmul_for_test(q4w, x, n), base_joined = gpu_joined_products_for_test({&q4w, &q6w}, x, n);
      std::vector<float> single;
      for (int t = 0; t < n; ++t) {
        const std::vector<float> xt(x.begin() + (ptrdiff_t)(t * cols), x.begin() + (ptrdiff_t)((t + 1) * cols));
        const std::vector<float> yt = gpu_matmul_for_test(q4w, xt, 1);
        single.insert(single.end(), yt.begin(), yt.end());
      }
      use(true);
      const std::vector<float> form = gpu_matmul_for_test(q4w, x, n), form_joined = gpu_joined_products_for_test({&q4w, &q6w}, x, n);
      ASSERT_EQ(base.size(), (size_t)(67 * n));
      ASSERT_EQ(form.size(), base.size());
      EXPECT_EQ(0, std::memcmp(base.data(), form.data(), base.size() * sizeof(float))) << "Q4_K alone, cols " << cols << ", " << n << " tokens";
      EXPECT_EQ(0, std::memcmp(single.data(), form.data(), form.size() * sizeof(float)))
          << "against one token at a time, cols " << cols << ", " << n << " tokens";
      ASSERT_EQ(form_joined.size(), base_joined.size());
      EXPECT_EQ(0, std::memcmp(base_joined.data(), form_joined.data(), form_joined.size() * sizeof(float)))
          << "Q4_K with Q6_K, cols " << cols << ", " << n << " tokens";
    }
  }
}

}  // namespace

// Products of 2-8 tokens of Q4_K weights with four rows a warp (the default) give the bits of two rows a warp
// (ROOFLINE_MATVEC_Q4K_ROWS=2) and of one token at a time.
TEST(GpuMatmulTest, FourQ4KRowsAWarpGiveTheBitsOfTwo) {
  SKIP_WITHOUT_GPU();
  struct Restore {
    ~Restore() { gpu_set_matvec_q4k_rows_for_test(0); }
  } restore;
  expect_few_token_forms_agree(31, [](bool four) { gpu_set_matvec_q4k_rows_for_test(four ? 4 : 2); });
}

// Products of 2-8 tokens of Q4_K weights on int8 tensor cores (cuda_matvec_mma.cu) give the warp kernels' bits
// and those of one token at a time.
TEST(GpuMatmulTest, TensorCoreProductsOfFewTokensGiveTheWarpKernelsBits) {
  SKIP_WITHOUT_GPU();
  if (gpu_devices().empty() || gpu_devices()[0].code_arch < 80) GTEST_SKIP() << "int8 tensor cores need sm_80 or newer";
  struct Restore {
    ~Restore() { gpu_use_mma_matvec_for_test(-1); }
  } restore;
  expect_few_token_forms_agree(29, [](bool mma) { gpu_use_mma_matvec_for_test(mma ? 1 : 0); });
}
