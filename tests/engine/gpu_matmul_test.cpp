// The CUDA backend's matrix products against double references (skipped where no GPU is present, e.g. CI): every
// weight type at decode and prefill sizes; the one-token and 2-8 token kernels, the batched tensor-core kernels
// (mma.sync, int8, Hopper's warpgroup one) and the tiled prompt GEMM; products of one input joined in one launch;
// the MoE expert products grouped by expert. Run on the GPU machine: roofline_tests --gtest_filter='GpuMatmul*'.
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

namespace {

// NMSE of the GPU product of a random weight (rows x cols, quantized to `type`) with n random
// activation rows against the double-precision product with the dequantized weight.
double gpu_matmul_nmse(DType type, int64_t rows, int64_t cols, int n, Rng& rng) {
  const test::RandomWeight w(type, rows, cols, rng);
  std::vector<float> x((size_t)(n * cols));
  for (float& v : x) v = (float)rng.normal();
  const auto y = gpu_matmul_for_test(w.weight(), x, n);
  std::vector<float> ref((size_t)(n * rows));
  for (int t = 0; t < n; ++t) {
    const std::vector<double> yt = w.times(x, t);
    for (int64_t r = 0; r < rows; ++r) ref[t * rows + r] = (float)yt[(size_t)r];
  }
  return test::nmse(y.data(), ref.data(), ref.size());
}

// Weight types whose decode products (and expert products) multiply int8 activations (cuda_matvec.cu's
// matvec_uses_q8): their error is the activations' rounding, ~1e-4, where float activations give ~1e-12.
bool int8_decode_type(DType t) {
  return t == DType::Q4_K || t == DType::Q5_K || t == DType::Q6_K || t == DType::Q8_0 || t == DType::Q4_0 || t == DType::IQ4_XS ||
         t == DType::Q3_K || t == DType::Q2_K || t == DType::Q4_1 || t == DType::Q5_0 || t == DType::Q5_1 || t == DType::IQ4_NL;
}

// Which batched (9-64 row) kernel the products take for one test, put back to the environment's choice after it:
// int8 (ROOFLINE_INT8_MMA) and Hopper's warpgroup kernel (ROOFLINE_WGMMA, min rows and m tiles), 0 for off.
struct BatchedKernels {
  BatchedKernels(int int8, int wgmma_min_rows, int wgmma_tiles = 0) {
    gpu_use_int8_products_for_test(int8);
    gpu_use_wgmma_products_for_test(wgmma_min_rows, wgmma_tiles);
  }
  ~BatchedKernels() {
    gpu_use_int8_products_for_test(-1);
    gpu_use_wgmma_products_for_test(-1);
  }
};

}  // namespace

TEST(GpuMatmulTest, EveryTypeAtDecodeAndPrefillSizes) {
  SKIP_WITHOUT_GPU();
  // The mma.sync f16 batched kernel (the int8 one: Int8BatchedProductsMatchTheReference; Hopper's warpgroup one:
  // WarpgroupBatchedProductsMatchTheReference).
  const BatchedKernels mma_sync(0, 0);
  const DType types[] = {DType::F32, DType::F16, DType::BF16, DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1,
                         DType::Q8_0, DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ4_NL,
                         DType::IQ4_XS};
  Rng rng(3);
  for (DType type : types) {
    const int64_t cols = dtype_block_size(type) == 256 ? 768 : (type == DType::F32 || type == DType::F16 || type == DType::BF16 ? 100 : 96);
    for (int n : {1, 3, 8, 9, 16, 33, 48, 49, 57, 64, 65}) {
      const double e = gpu_matmul_nmse(type, 67, cols, n, rng);
      // int8 activations (decode, quantized types) ~1e-4; f16 inputs (GEMM, batched decode) ~1e-6; float matvec ~1e-12.
      const bool q8 = n <= 8 && int8_decode_type(type);
      const double bound = q8 ? 2e-4 : n > 8 ? 2e-6 : 1e-9;
      EXPECT_LT(e, bound) << dtype_name(type) << " n=" << n;
    }
  }
}

// The batched-decode kernel (Q4_K, Q6_K; 9-64 rows) over several row tiles with a partial last one
// and K split over CTAs; and the decode matvec (1-8 rows), whose warps take one, two or four weight
// rows each, on rows long enough for several loop iterations with two super-blocks each, and row
// counts that leave the last warp short.
TEST(GpuMatmulTest, BatchedDecodeKernelOnLargerMatrices) {
  SKIP_WITHOUT_GPU();
  // The mma.sync f16 batched kernel (the int8 one: Int8BatchedProductsMatchTheReference; Hopper's warpgroup one:
  // WarpgroupBatchedProductsMatchTheReference).
  const BatchedKernels mma_sync(0, 0);
  Rng rng(5);
  for (DType type : {DType::Q4_K, DType::Q6_K})
    for (int n : {9, 24, 40, 64}) {
      const double e = gpu_matmul_nmse(type, 300, 2560, n, rng);
      EXPECT_LT(e, 2e-6) << dtype_name(type) << " n=" << n;
    }
  for (DType type : {DType::Q4_K, DType::Q6_K, DType::Q8_0, DType::Q4_0, DType::IQ4_XS, DType::Q3_K, DType::Q2_K, DType::Q4_1, DType::Q5_0,
                     DType::Q5_1, DType::IQ4_NL})
    for (int n : {1, 2, 5, 8}) {
      const double e = gpu_matmul_nmse(type, 301, 5120, n, rng);
      EXPECT_LT(e, 2e-4) << dtype_name(type) << " n=" << n;
    }
  // One token over rows of whole rounds of two super-blocks (Q8_0, Q4_0: blocks) per lane group.
  for (DType type : {DType::Q4_K, DType::Q6_K, DType::Q8_0, DType::Q4_0, DType::IQ4_XS, DType::Q3_K, DType::Q2_K, DType::Q5_1}) {
    const double e = gpu_matmul_nmse(type, 131, type == DType::Q6_K || type == DType::Q4_K ? 6144 : 4096, 1, rng);
    EXPECT_LT(e, 2e-4) << dtype_name(type) << " whole rounds";
  }
}

// The tiled Q4_K prompt GEMM (cuda_gemm_q4k_tiles.cu) on small matrices (so forced, ROOFLINE_Q4K_TILE_GEMM_ANY=1):
// odd row counts (partial row tiles), token counts over one and several token tiles, partial ones
// included, and K of one to several super-blocks. It multiplies the same f16 weights as the cuBLAS
// path, so the bound is the f16 activations' rounding.
TEST(GpuMatmulTest, Q4KTileGemmMatchesTheReference) {
  SKIP_WITHOUT_GPU();
  struct Restore {
    ~Restore() {
      unsetenv("ROOFLINE_Q4K_TILE_GEMM_ANY");
      unsetenv("ROOFLINE_Q4K_TILE_GEMM");
    }
  } restore;
  setenv("ROOFLINE_Q4K_TILE_GEMM_ANY", "1", 1);
  setenv("ROOFLINE_Q4K_TILE_GEMM", "512", 1);
  Rng rng(23);
  for (int n : {65, 100, 128, 129, 300})
    for (auto [rows, cols] : {std::pair<int64_t, int64_t>{300, 1280}, {129, 256}, {77, 2816}}) {
      const double e = gpu_matmul_nmse(DType::Q4_K, rows, cols, n, rng);
      EXPECT_LT(e, 2e-6) << rows << " x " << cols << " n=" << n;
    }
}

namespace {

using JoinedGroup = std::vector<std::pair<DType, int64_t>>;  // each member's type and rows

// Random weights of `group` (cols wide) joined in one launch over n random activation rows
// (gpu_joined_products_for_test), each member's output against its double reference (NMSE < bound).
void expect_joined_products_match(const JoinedGroup& group, int64_t cols, int n, double bound, Rng& rng) {
  std::vector<std::unique_ptr<test::RandomWeight>> ws;
  for (const auto& [type, rows] : group) ws.push_back(std::make_unique<test::RandomWeight>(type, rows, cols, rng));
  std::vector<Weight> views;
  for (const auto& w : ws) views.push_back(w->weight());
  std::vector<const Weight*> wp;
  for (const Weight& v : views) wp.push_back(&v);
  std::vector<float> x((size_t)(n * cols));
  for (float& v : x) v = (float)rng.normal();
  const auto y = gpu_joined_products_for_test(wp, x, n);
  size_t at = 0;
  for (size_t m = 0; m < ws.size(); ++m) {
    const int64_t rows = group[m].second;
    std::vector<float> ref((size_t)(n * rows));
    for (int t = 0; t < n; ++t) {
      const std::vector<double> yt = ws[m]->times(x, t);
      for (int64_t r = 0; r < rows; ++r) ref[(size_t)(t * rows + r)] = (float)yt[(size_t)r];
    }
    ASSERT_LE(at + ref.size(), y.size());
    EXPECT_LT(test::nmse(y.data() + at, ref.data(), ref.size()), bound)
        << "member " << m << " (" << dtype_name(group[m].first) << ", " << rows << " rows) of " << group.size() << ", n=" << n
        << ", cols " << cols;
    at += ref.size();
  }
  EXPECT_EQ(at, y.size());
}

}  // namespace

// Decode products joined in one launch as the backend joins q/k/v: weights of one kind, and Q4_K with
// Q6_K (the Q4_K_M mixes' Q6_K v beside Q4_K q and k), row counts that leave warps short, rows of several
// rounds; each product against its double reference.
TEST(GpuMatmulTest, JoinedProductsOfOneInputMatchEachProduct) {
  SKIP_WITHOUT_GPU();
  Rng rng(9);
  const std::vector<JoinedGroup> groups = {{{DType::Q4_K, 67}, {DType::Q4_K, 33}, {DType::Q6_K, 45}},
                                           {{DType::Q6_K, 31}, {DType::Q4_K, 64}},
                                           {{DType::Q4_K, 40}, {DType::Q6_K, 17}, {DType::Q6_K, 9}, {DType::Q4_K, 3}},
                                           {{DType::Q6_K, 21}, {DType::Q6_K, 50}}};
  for (const int64_t cols : {768, 5120})
    for (const auto& group : groups)
      for (int n : {1, 2, 3, 5, 8}) expect_joined_products_match(group, cols, n, 2e-4, rng);
}

// Batched-decode products (9-64 tokens) joined in one launch of the tensor-core kernel, as the backend
// joins q/k/v and gate/up there: one type per launch, members whose row counts leave row tiles short,
// one member large enough to split K over CTAs; each product against its double reference (f16 inputs).
TEST(GpuMatmulTest, JoinedBatchedProductsMatchEachProduct) {
  SKIP_WITHOUT_GPU();
  // The mma.sync f16 batched kernel (the int8 one: Int8BatchedProductsMatchTheReference; Hopper's warpgroup one:
  // WarpgroupBatchedProductsMatchTheReference).
  const BatchedKernels mma_sync(0, 0);
  Rng rng(11);
  const std::vector<JoinedGroup> groups = {{{DType::Q4_K, 67}, {DType::Q4_K, 33}, {DType::Q4_K, 300}},
                                           {{DType::Q6_K, 31}, {DType::Q6_K, 150}},
                                           {{DType::Q4_K, 129}, {DType::Q4_K, 128}, {DType::Q4_K, 1}, {DType::Q4_K, 64}}};
  for (const int64_t cols : {768, 5120})
    for (const auto& group : groups)
      for (int n : {9, 16, 33, 64}) expect_joined_products_match(group, cols, n, 2e-6, rng);
}

// The int8 tensor-core form of the batched Q4_K products (ROOFLINE_INT8_MMA; forced on for 9-64 rows here): alone on
// odd sizes and every token tile count, and joined as q/k/v and gate/up are, with K split over CTAs;
// each product against its double reference. Activations are int8 with one step per 256 values, so
// the bound is the int8 decode path's (2e-4; measured 4-5e-5 on large outputs, 1.05e-4 on a one-row
// member of 24 tokens), not the f16 kernel's.
TEST(GpuMatmulTest, Int8BatchedProductsMatchTheReference) {
  SKIP_WITHOUT_GPU();
  const BatchedKernels int8(1, 0);
  Rng rng(19);
  for (int n : {9, 16, 17, 31, 40, 48, 57, 64}) {
    EXPECT_LT(gpu_matmul_nmse(DType::Q4_K, 300, 2560, n, rng), 2e-4) << "300 x 2560, n=" << n;
    EXPECT_LT(gpu_matmul_nmse(DType::Q4_K, 67, 768, n, rng), 2e-4) << "67 x 768, n=" << n;
  }
  const std::vector<JoinedGroup> groups = {{{DType::Q4_K, 67}, {DType::Q4_K, 33}, {DType::Q4_K, 300}},
                                           {{DType::Q4_K, 129}, {DType::Q4_K, 128}, {DType::Q4_K, 1}, {DType::Q4_K, 64}}};
  for (const int64_t cols : {768, 5120})
    for (const auto& group : groups)
      for (int n : {9, 24, 64}) expect_joined_products_match(group, cols, n, 2e-4, rng);
}

// The batched Q4_K and Q6_K products on Hopper's warpgroup tensor cores (ROOFLINE_WGMMA; forced on for 9-64 rows
// here): every token tile count (16-64 padded tokens), odd row counts that leave a warp's rows and the last
// row tile short, K split over CTAs on the larger matrix, and joined as q/k/v and gate/up are (Q4_K with a Q6_K member
// too, one launch of both kinds where one m64 tile a warpgroup); each product against its double reference with the f16
// kernel's bound (the same f16 weights and activations, f32 sums).
TEST(GpuMatmulTest, WarpgroupBatchedProductsMatchTheReference) {
  SKIP_WITHOUT_GPU();
  if (!gpu_wgmma_products_available_for_test()) GTEST_SKIP() << "the warpgroup kernels need an sm_90 GPU and a build with sm_90a code";
  Rng rng(23);
  const std::vector<JoinedGroup> groups = {{{DType::Q4_K, 67}, {DType::Q4_K, 33}, {DType::Q4_K, 300}},
                                           {{DType::Q6_K, 31}, {DType::Q6_K, 150}},
                                           {{DType::Q4_K, 129}, {DType::Q4_K, 128}, {DType::Q4_K, 1}, {DType::Q4_K, 64}}};
  const std::vector<JoinedGroup> mixed = {{{DType::Q4_K, 67}, {DType::Q4_K, 33}, {DType::Q6_K, 150}},
                                          {{DType::Q4_K, 300}, {DType::Q6_K, 31}, {DType::Q4_K, 1}, {DType::Q6_K, 129}}};
  struct Restore {
    ~Restore() {
      gpu_use_wgmma_bulk_for_test(-1);
      gpu_use_wgmma_fold_for_test(-1);
      gpu_use_wgmma_fold_q6_for_test(-1);
      gpu_use_wgmma_mixed_for_test(-1);
    }
  } restore;
  gpu_use_wgmma_mixed_for_test(1);
  // Forms: one m64 tile a warpgroup in the plain pipeline, two, and one in the pipeline without CTA-wide barriers
  // (5120 columns: more super-blocks than stages); Q4_K's mins and Q6_K's -32 folded out of the weights in each, and in
  // the bulk form also neither, and each alone (the mixed launches' four kernels); bulk 2: Q4_K weights as tensor-map boxes too.
  struct Form {
    int m_tiles, bulk, fold, fold6;
  };
  for (auto [m_tiles, bulk, fold, fold6] : {Form{1, 0, 1, 1}, Form{2, 0, 1, 1}, Form{1, 1, 1, 1}, Form{1, 1, 0, 0}, Form{1, 1, 1, 0},
                                            Form{1, 1, 0, 1}, Form{1, 2, 1, 1}, Form{1, 2, 0, 0}}) {
    const BatchedKernels warpgroup(0, 9, m_tiles);
    gpu_use_wgmma_bulk_for_test(bulk);
    gpu_use_wgmma_fold_for_test(fold);
    gpu_use_wgmma_fold_q6_for_test(fold6);
    const bool one_kind_each = fold != fold6;  // (forms that only the mixed launches need apart)
    for (DType type : {DType::Q4_K, DType::Q6_K})
      for (int n : {9, 16, 17, 31, 40, 48, 57, 64}) {
        if (one_kind_each && n % 2 == 0) continue;
        EXPECT_LT(gpu_matmul_nmse(type, 300, 2560, n, rng), 2e-6) << dtype_name(type) << " 300 x 2560, n=" << n << ", m tiles " << m_tiles
                                                                   << ", bulk " << bulk << ", fold " << fold << ", fold6 " << fold6;
        EXPECT_LT(gpu_matmul_nmse(type, 67, 768, n, rng), 2e-6) << dtype_name(type) << " 67 x 768, n=" << n << ", m tiles " << m_tiles
                                                                << ", bulk " << bulk << ", fold " << fold << ", fold6 " << fold6;
      }
    for (const int64_t cols : {768, 5120})
      for (const auto& group : groups)
        for (int n : {9, 24, 64})
          if (!one_kind_each) expect_joined_products_match(group, cols, n, 2e-6, rng);
    if (m_tiles == 1)
      for (const int64_t cols : {768, 5120})
        for (const auto& group : mixed)
          for (int n : {9, 24, 33, 64}) expect_joined_products_match(group, cols, n, 2e-6, rng);
  }
  // The two pipelines do the same arithmetic in the same order: the same bits. With the mins (Q4_K) or the -32 (Q6_K) folded, at every row count, the weights round otherwise:
  // other bits than unfolded.
  const BatchedKernels warpgroup(0, 9, 1);
  for (DType type : {DType::Q4_K, DType::Q6_K})
    for (int n : {9, 16, 24, 33, 64}) {
      const test::RandomWeight w(type, 200, 4096, rng);
      std::vector<float> x((size_t)n * 4096);
      for (float& v : x) v = (float)rng.normal();
      std::vector<float> by_fold[2];
      for (int fold : {0, 1}) {
        gpu_use_wgmma_fold_for_test(fold);
        gpu_use_wgmma_fold_q6_for_test(fold);
        gpu_use_wgmma_bulk_for_test(0);
        const std::vector<float> plain = gpu_matmul_for_test(w.weight(), x, n);
        gpu_use_wgmma_bulk_for_test(1);
        const std::vector<float> bulk = gpu_matmul_for_test(w.weight(), x, n);
        ASSERT_EQ(plain.size(), bulk.size());
        EXPECT_EQ(0, std::memcmp(plain.data(), bulk.data(), plain.size() * sizeof(float))) << dtype_name(type) << " n=" << n << ", fold " << fold;
        gpu_use_wgmma_bulk_for_test(2);  // the same blocks as a tensor map's boxes, read from other places: the same bits
        const std::vector<float> tma = gpu_matmul_for_test(w.weight(), x, n);
        ASSERT_EQ(plain.size(), tma.size());
        EXPECT_EQ(0, std::memcmp(plain.data(), tma.data(), plain.size() * sizeof(float))) << dtype_name(type) << " n=" << n << ", fold " << fold
                                                                                        << ", TMA weights";
        by_fold[fold] = plain;
      }
      EXPECT_NE(0, std::memcmp(by_fold[0].data(), by_fold[1].data(), by_fold[0].size() * sizeof(float)))
          << dtype_name(type) << " n=" << n << ": folding changed nothing";
    }
  // The TMA forms above ran on tensor maps (without one a launch falls back to the bulk form, which would prove nothing).
  EXPECT_GT(gpu_weight_tensor_maps_for_test(), 0);
}

// The MoE expert products grouped by expert on the device (sort, gather, grouped kernels) against the
// double product of each pair's expert slice, for every device layout's kind of kernel, token counts
// from one decode row to a prompt (experts with several 8-row chunks, split over CTAs; token tiles of
// the tensor-core path), row counts that leave the last warp or row tile short; and each pair of the
// int8 / float kernels bit-identical to the dense product of its expert's slice for that token alone
// (the grouped path runs the same kernels, whatever rows share a chunk).
// A second pass takes the tensor-core cases (Q4_K and Q6_K, prompt-sized) through Hopper's warpgroup kernel
// (ROOFLINE_WGMMA_EXPERTS) where the GPU has it.
TEST(GpuMatmulTest, ExpertProductsGroupedByExpertMatchEachExpertsProduct) {
  SKIP_WITHOUT_GPU();
  struct Restore {
    ~Restore() { gpu_use_wgmma_experts_for_test(-1); }
  } restore;
  Rng rng(17);
  const int n_expert = 12, k = 3;
  for (int wgmma : {0, 1})
  for (int64_t rows : {67, 130})
  for (DType type : {DType::Q4_K, DType::Q6_K, DType::Q8_0, DType::Q5_K, DType::Q4_0, DType::IQ4_XS, DType::Q3_K, DType::Q2_K, DType::Q4_1,
                     DType::Q5_0, DType::Q5_1, DType::IQ4_NL, DType::F32, DType::BF16}) {
    if (wgmma && (!gpu_wgmma_products_available_for_test() || rows % 2 != 0 || (type != DType::Q4_K && type != DType::Q6_K))) continue;
    gpu_use_wgmma_experts_for_test(wgmma);
    const int64_t cols = dtype_block_size(type) == 256 ? 512 : type == DType::F32 || type == DType::BF16 ? 100 : 96;
    std::vector<float> wf((size_t)(n_expert * rows * cols));
    for (float& v : wf) v = (float)rng.normal() * 0.05f;
    std::vector<uint8_t> wq(dtype_row_bytes(type, cols) * n_expert * rows);
    quantize_rows_ref(type, wf.data(), wq.data(), n_expert * rows, cols);
    std::vector<float> wd(wf.size());
    dequantize_rows_ref(type, wq.data(), wd.data(), n_expert * rows, cols);
    gguf::TensorInfo info;
    info.name = "w";
    info.type = type;
    info.n_dims = 2;
    info.ne = {cols, n_expert * rows, 1, 1};
    info.n_bytes = wq.size();
    info.data = wq.data();
    const Weight w{&info};
    for (int n : {1, 2, 5, 17, 64, 150}) {
      if (wgmma && n <= 64) continue;
      std::vector<float> x((size_t)(n * cols));
      for (float& v : x) v = (float)rng.normal();
      std::vector<int32_t> ids;
      for (int t = 0; t < n; ++t) {  // k distinct experts per token, skewed towards the low ids
        std::vector<int32_t> pick;
        while ((int)pick.size() < k) {
          const int32_t e = (int32_t)std::min<double>(n_expert - 1, std::abs(rng.normal()) * n_expert / 2.5);
          if (std::find(pick.begin(), pick.end(), e) == pick.end()) pick.push_back(e);
        }
        ids.insert(ids.end(), pick.begin(), pick.end());
      }
      const auto y = gpu_expert_products_for_test(w, n_expert, ids, k, x, n);
      std::vector<float> ref(y.size());
      for (int p = 0; p < n * k; ++p)
        for (int64_t r = 0; r < rows; ++r) {
          double s = 0;
          const float* wr = wd.data() + ((int64_t)ids[p] * rows + r) * cols;
          for (int64_t c = 0; c < cols; ++c) s += (double)wr[c] * x[(p / k) * cols + c];
          ref[(size_t)p * rows + r] = (float)s;
        }
      const double e = test::nmse(y.data(), ref.data(), ref.size());
      const bool q8 = int8_decode_type(type);
      EXPECT_LT(e, q8 ? 2e-4 : 1e-9) << dtype_name(type) << " n=" << n;
      // Pair 0 and the last pair against the dense product of their expert's slice, that token alone
      // (the int8 and float kernels; prompts of Q4_K / Q6_K with even rows go through tensor cores).
      const bool tensor_cores = n > 64 && rows % 2 == 0 && (type == DType::Q4_K || type == DType::Q6_K);
      if (tensor_cores) {
        EXPECT_LT(e, 2e-6) << dtype_name(type) << " n=" << n << (wgmma ? " (warpgroup tensor cores: f16 inputs)" : " (tensor cores: f16 inputs)");
      }
      for (int p : {0, n * k - 1}) {
        if (tensor_cores) break;
        gguf::TensorInfo slice = info;
        slice.ne = {cols, rows, 1, 1};
        slice.data = wq.data() + (size_t)ids[p] * rows * dtype_row_bytes(type, cols);
        slice.n_bytes = rows * dtype_row_bytes(type, cols);
        const std::vector<float> xt(x.begin() + (p / k) * cols, x.begin() + (p / k + 1) * cols);
        const auto dense = gpu_matmul_for_test(Weight{&slice}, xt, 1);
        EXPECT_EQ(0, std::memcmp(dense.data(), y.data() + (size_t)p * rows, rows * 4)) << dtype_name(type) << " n=" << n << " pair " << p;
      }
    }
  }
}
