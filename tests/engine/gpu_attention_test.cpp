// The CUDA attention kernels checked directly (skipped without a GPU), through the hooks of backend/gpu.h
// that plan and launch them as the backend does:
// - GpuAttention.DecodeMatchesTheReference: a decode-sized step (six rows: five sequences, one with two
//   new rows, padded to a bucket of 8 whose padding rows must come back zero) at depths from 1 to 4999
//   keys, so rows take one split, many short spans and spans doubled to 128; split-KV kernel only.
//   Also over a step of short rows only (at most 1024 keys: the split kernel's CTAs take two query heads
//   each), checked against the split kernel's own combine, which takes whole groups.
// - GpuAttention.ShortRowsGiveTheSameBitsWithAndWithoutHeadParts: a short row alone and beside a row past
//   1024 keys (whole groups), bit for bit.
// - GpuAttention.PrefillMatchesTheReference: an 86-row step mixing a 37-row prompt run 600 keys deep
//   (prefill_attention, in key tiles of 64 and of the default 1024, and 16-row chunks), a fresh 45-row
//   prompt too short for a run, a 3-row and a 1-row sequence (split kernel through the row list, with
//   widened multi-tile spans).
//   Both over every shape of Shapes() (GQA 2 to 12, head dims 64, 96 (the per-dimension value kernel),
//   128 and 256), K/V types F16, BF16, Q8_0, Q4_0 and mixed Q8_0/F16, full and sliding-window layers,
//   blocks scattered out of order; against attention_reference (float64, the dequantized cache). NMSE
//   bounds: 1e-8 for the split kernel (f32 arithmetic on the cache's exact values), 1e-5 for prefill
//   runs (queries, keys, values and probabilities rounded to f16 for the tensor cores). These three run
//   the split kernel for f16 caches too (gpu_use_flash_decode_for_test(0)).
// - GpuAttention.FlashDecodeMatchesTheReference: the split kernel's work on tensor cores for f16 caches (the
//   default there, cuda_flash_decode.cu) over the decode step's depths, GQA 1 to 8 and head dims 64 to 256,
//   full and sliding-window layers, to 1e-5 (f16 queries and probabilities); a row alone gives its bits in
//   the step; the first block's older keys staged before the dependency wait (ROOFLINE_FLASH_EARLY_KV) give
//   the same bits.
// - GpuAttention.OneSplitStepsFinalizeInTheFlashKernelWithTheCombinesBits: steps of rows of one split, finalized
//   in the flash kernel (no combine kernel), against the combine kernel's output and int8 form, bit for bit.
// - GpuAttention.LongPrefillRunsMatchTheReference: runs of 300 rows from position 0 and 70 rows 1000 deep
//   (several column tiles per KV head, many key blocks, GQA 1 to 8), f16 caches (the one-launch kernel,
//   cuda_flash_prefill.cu) and q8_0 (the tiled cuBLAS path), with and without a window of 100.
// - GpuRopeStore.MatchesTheReference: Q/K RMSNorm + RoPE + K/V store (rope_and_store; rotations from the step's
//   table for the larger step, as prompt steps take them) for normal and
//   NeoX styles, full and partial rotary (Qwen3.5: 64 of 256), frequency factors and scaling, q/k norms,
//   positions from 1234 on, decode-sized (padded) and larger steps, every KV type, and head dims whose
//   quantized rows cross heads (80: the whole-row store kernel). q and k against a float64 RoPE (NMSE <
//   1e-10); every stored K/V value dequantized against the float64 value within the type's rounding
//   (f32 1e-5 relative, f16 2^-10, bf16 2^-7, q8_0 0.6 and q4_0 1.05 of the group's step amax/127 or
//   amax/8); every other slot of the cache byte-identical to before.
// - GpuAttention.DISABLED_DecodeBandwidth: decode attention times and KV read GB/s at a few depths and
//   batch sizes (run with --gtest_also_run_disabled_tests).
// Run on the GPU machine: roofline_tests --gtest_filter='GpuAttention*:GpuRopeStore*'.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/attention_reference.h"
#include "backend/gpu.h"
#include "core/rng.h"
#include "engine/engine_test_util.h"
#include "formats/quant_ref.h"

using namespace roofline;

namespace {

constexpr int kBlock = 16;

std::vector<GpuAttentionShape> Shapes() {
  return {{8, 2, 64, 64}, {12, 1, 128, 128}, {4, 2, 256, 256}, {6, 2, 96, 96}};
}
std::vector<std::pair<DType, DType>> KvTypes() {
  return {{DType::F16, DType::F16}, {DType::BF16, DType::BF16}, {DType::Q8_0, DType::Q8_0}, {DType::Q4_0, DType::Q4_0},
          {DType::Q8_0, DType::F16}};
}

// A step of sequences (n_past, n_new), each one's rows together, their blocks drawn from a shuffled
// list of n_blocks (so tables are out of order and interleaved).
StepDesc make_step(const std::vector<std::pair<int, int>>& seqs, int n_blocks, Rng& rng) {
  std::vector<int32_t> free_blocks((size_t)n_blocks);
  std::iota(free_blocks.begin(), free_blocks.end(), 0);
  for (size_t i = free_blocks.size(); i > 1; --i) std::swap(free_blocks[i - 1], free_blocks[(size_t)rng.below(i)]);
  StepDesc st;
  size_t used = 0;
  for (const auto& [n_past, n_new] : seqs) {
    StepSequence s;
    s.n_past = n_past;
    s.n_new = n_new;
    s.first_token = st.n_tokens();
    const int blocks = (n_past + n_new + kBlock - 1) / kBlock;
    if (used + (size_t)blocks > free_blocks.size()) throw std::runtime_error("make_step: too few blocks");
    s.block_table.assign(free_blocks.begin() + (long)used, free_blocks.begin() + (long)(used + blocks));
    used += (size_t)blocks;
    for (int i = 0; i < n_new; ++i) {
      st.tokens.push_back(0);
      st.positions.push_back(n_past + i);
      st.row_seq.push_back((int32_t)st.sequences.size());
    }
    st.sequences.push_back(s);
  }
  return st;
}

int blocks_needed(const std::vector<std::pair<int, int>>& seqs) {
  int n = 1;
  for (const auto& [p, k] : seqs) n += (p + k + kBlock - 1) / kBlock;
  return n;
}

// A random cache (normal values through the reference quantizer) and its dequantized floats.
struct HostCache {
  GpuKvCacheForTest cache;
  std::vector<float> k, v;
};
HostCache random_cache(const GpuAttentionShape& s, DType tk, DType tv, int n_blocks, Rng& rng) {
  HostCache h;
  h.cache.type_k = tk;
  h.cache.type_v = tv;
  h.cache.block_size = kBlock;
  h.cache.n_blocks = n_blocks;
  const int64_t slots = (int64_t)n_blocks * kBlock;
  const int kd = s.n_head_kv * s.head_dim_k, vd = s.n_head_kv * s.head_dim_v;
  auto make = [&](DType t, int dim, std::vector<uint8_t>& bytes, std::vector<float>& floats) {
    std::vector<float> x((size_t)slots * dim);
    for (float& e : x) e = (float)rng.normal();
    bytes.resize(dtype_row_bytes(t, dim) * (size_t)slots);
    quantize_rows_ref(t, x.data(), bytes.data(), slots, dim);
    floats.resize(x.size());
    dequantize_rows_ref(t, bytes.data(), floats.data(), slots, dim);
  };
  make(tk, kd, h.cache.k, h.k);
  make(tv, vd, h.cache.v, h.v);
  return h;
}

std::string describe(const GpuAttentionShape& s, DType tk, DType tv, int window) {
  return std::to_string(s.n_head) + "/" + std::to_string(s.n_head_kv) + " heads of " + std::to_string(s.head_dim_k) + ", " +
         dtype_name(tk) + "/" + dtype_name(tv) + ", window " + std::to_string(window);
}

std::vector<float> random_values(size_t n, Rng& rng) {
  std::vector<float> x(n);
  for (float& e : x) e = (float)rng.normal();
  return x;
}

// The split kernel for f16 caches too (they otherwise take the tensor-core decode kernel, whose f16 queries and
// probabilities the split kernel's 1e-8 bounds do not allow), for the tests of the split kernel.
struct FlashDecodeMode {
  explicit FlashDecodeMode(int mode) { gpu_use_flash_decode_for_test(mode); }
  ~FlashDecodeMode() { gpu_use_flash_decode_for_test(-1); }
};
struct SplitKernelOnly : FlashDecodeMode {
  SplitKernelOnly() : FlashDecodeMode(0) {}
};

// One step of the sequences (n_past, n_new) over a random cache of scattered blocks (spare_blocks beyond
// those needed) and random queries: the GPU's attention (prefill runs in key tiles of key_tile, 0: the
// default) and the float64 reference's.
struct AttentionCase {
  StepDesc st;
  HostCache h;
  std::vector<float> q, out;
  std::vector<double> ref;
  float scale = 0;
  size_t row = 0;  // output values per row
};
AttentionCase run_against_reference(const GpuAttentionShape& s, DType tk, DType tv, int window, const std::vector<std::pair<int, int>>& seqs,
                                    uint64_t seed, int spare_blocks, int key_tile = 0) {
  AttentionCase c;
  Rng rng(seed);
  const int n_blocks = blocks_needed(seqs) + spare_blocks;
  c.st = make_step(seqs, n_blocks, rng);
  c.h = random_cache(s, tk, tv, n_blocks, rng);
  c.q = random_values((size_t)c.st.n_tokens() * s.n_head * s.head_dim_k, rng);
  c.scale = 1.0f / std::sqrt((float)s.head_dim_k);
  c.out = gpu_attention_for_test(s, c.h.cache, window, c.scale, c.st, c.q, key_tile);
  c.ref = test::attention_reference(c.st, {s.n_head, s.n_head_kv, s.head_dim_k, s.head_dim_v}, c.q.data(), c.h.k.data(), c.h.v.data(),
                                    kBlock, c.scale, window);
  c.row = (size_t)s.n_head * s.head_dim_v;
  return c;
}

// ROOFLINE_ATTN_LONG_SPLITS for a scope (read by attention_spans whenever a step is planned); null leaves the default.
struct LongSplits {
  explicit LongSplits(const char* v) {
    if (v) setenv("ROOFLINE_ATTN_LONG_SPLITS", v, 1);
  }
  ~LongSplits() { unsetenv("ROOFLINE_ATTN_LONG_SPLITS"); }
};

TEST(GpuAttention, DecodeMatchesTheReference) {
  SKIP_WITHOUT_GPU();
  const SplitKernelOnly split_kernel;
  // Keys 1, 20 (one split), 701 (22 spans of 32), 2101 (spans of 128 after doubling), then two rows of
  // one sequence at 4998 and 4999 keys (40 spans of 128), 9301 keys (73 spans of 128: these shapes' 1-2 KV heads
  // keep long spans from doubling, attention_spans); or, all short, 1021 and 1022 keys. Then the same with long spans
  // doubling past 16 splits: 2101 keys in spans of 256, 4998 and 9301 in spans of 512.
  // A step of short rows only (at most 1024 keys: the split kernel's CTAs take parts of each KV head's
  // query heads, AttentionPlan::split_heads) and one with deep rows (whole groups).
  for (const char* long_splits : {(const char*)nullptr, "16"}) {
  const LongSplits setting(long_splits);
  for (const std::vector<std::pair<int, int>>& seqs : {std::vector<std::pair<int, int>>{{0, 1}, {19, 1}, {700, 1}, {1020, 2}},
                                                       std::vector<std::pair<int, int>>{{0, 1}, {19, 1}, {700, 1}, {2100, 1}, {4997, 2}, {9300, 1}}})
  for (const GpuAttentionShape& s : Shapes())
    for (auto [tk, tv] : KvTypes())
      for (int window : {0, 300}) {
        SCOPED_TRACE(describe(s, tk, tv, window));
        const AttentionCase c = run_against_reference(s, tk, tv, window, seqs, 101 + (uint64_t)window + (uint64_t)s.head_dim_k, 3);
        const StepDesc& st = c.st;
        const std::vector<float>& out = c.out;
        const std::vector<double>& ref = c.ref;
        ASSERT_EQ(out.size(), ref.size());
        // The combine kernel and the split kernel's own combine do the same arithmetic in the same order
        // (the split kernels that combine are compiled apart: their last bits may differ).
        const auto separate = gpu_attention_for_test(s, c.h.cache, window, c.scale, st, c.q, 0, false);
        EXPECT_LT(test::nmse_vs_reference(out, std::vector<double>(separate.begin(), separate.end()), 0, out.size()), 1e-14)
            << "combine in the split kernel against the combine kernel";
        const size_t row = c.row;
        for (int r = 0; r < st.n_tokens(); ++r)
          EXPECT_LT(test::nmse_vs_reference(out, ref, r * row, (r + 1) * row), 1e-8) << "row " << r << " at " << st.positions[r];
      }
  }
}

// Batch invariance across AttentionPlan::split_heads: a short row gives the same bits in a step of short
// rows (the split kernel's CTAs take two query heads each) and beside a row past 1024 keys (whole groups).
TEST(GpuAttention, ShortRowsGiveTheSameBitsWithAndWithoutHeadParts) {
  SKIP_WITHOUT_GPU();
  const SplitKernelOnly split_kernel;
  for (const GpuAttentionShape& s : {GpuAttentionShape{8, 2, 64, 64}, GpuAttentionShape{12, 1, 128, 128}, GpuAttentionShape{16, 2, 128, 128}})
    for (auto [tk, tv] : KvTypes()) {
      SCOPED_TRACE(describe(s, tk, tv, 0));
      Rng rng(31 + (uint64_t)s.n_head);
      const std::vector<std::pair<int, int>> seqs = {{19, 1}, {700, 1}, {2100, 1}};
      const int n_blocks = blocks_needed(seqs) + 2;
      const StepDesc deep = make_step(seqs, n_blocks, rng);
      StepDesc shallow = deep;  // the first two rows alone, on the same blocks
      shallow.sequences.pop_back();
      shallow.tokens.resize(2);
      shallow.positions.resize(2);
      shallow.row_seq.resize(2);
      const HostCache h = random_cache(s, tk, tv, n_blocks, rng);
      const size_t q_row = (size_t)s.n_head * s.head_dim_k, o_row = (size_t)s.n_head * s.head_dim_v;
      const auto q = random_values(3 * q_row, rng);
      const float scale = 1.0f / std::sqrt((float)s.head_dim_k);
      const auto with_deep = gpu_attention_for_test(s, h.cache, 0, scale, deep, q, 0, false);
      const auto alone = gpu_attention_for_test(s, h.cache, 0, scale, shallow, std::vector<float>(q.begin(), q.begin() + 2 * q_row), 0, false);
      ASSERT_EQ(alone.size(), 2 * o_row);
      EXPECT_EQ(std::memcmp(alone.data(), with_deep.data(), 2 * o_row * sizeof(float)), 0) << "a short row's bits depend on its batch-mates";
    }
}

// The tensor-core decode kernel (cuda_flash_decode.cu, f16 caches): rows of 1 to 16701 keys (one split to 40
// spans of 128; the shape of 8 KV heads 37 of 256 and 33 of 512, the others spans of 128, attention_spans; blocks
// of 64 keys cut by the span's end), groups of 1 to 12 query heads, head dims 64 to 256,
// full and sliding-window layers, against the float64 reference to f16 rounding; and a row's bits alone as in
// its step.
TEST(GpuAttention, FlashDecodeMatchesTheReference) {
  SKIP_WITHOUT_GPU();
  const std::vector<std::pair<int, int>> seqs = {{0, 1}, {19, 1}, {700, 1}, {2100, 1}, {4997, 2}, {9300, 1}, {16700, 1}};
  for (int buffers : {1, 2})  // the staging buffers (heads of 256 always take one)
  for (const GpuAttentionShape& s : {GpuAttentionShape{8, 2, 64, 64}, GpuAttentionShape{12, 1, 128, 128}, GpuAttentionShape{4, 2, 256, 256},
                                     GpuAttentionShape{6, 2, 96, 96}, GpuAttentionShape{64, 8, 128, 128}, GpuAttentionShape{2, 2, 128, 128}})
    for (int window : {0, 300}) {
      SCOPED_TRACE(describe(s, DType::F16, DType::F16, window) + ", staging buffers " + std::to_string(buffers));
      const FlashDecodeMode flash(buffers);
      const AttentionCase c = run_against_reference(s, DType::F16, DType::F16, window, seqs, 211 + (uint64_t)window + (uint64_t)s.head_dim_k, 3);
      // The combine kernel merges (the split kernel's own combine, which the test hook uses by default, is the split kernel's).
      const auto out = gpu_attention_for_test(s, c.h.cache, window, c.scale, c.st, c.q, 0, false);
      ASSERT_EQ(out.size(), c.ref.size());
      double worst = 0;
      for (int r = 0; r < c.st.n_tokens(); ++r) {
        const double e = test::nmse_vs_reference(out, c.ref, r * c.row, (r + 1) * c.row);
        EXPECT_LT(e, 1e-5) << "row " << r << " at " << c.st.positions[r];
        worst = std::max(worst, e);
      }
      EXPECT_GT(worst, 1e-10) << "f32 arithmetic: the split kernel ran, not the tensor-core one";
      if (buffers == 1) {  // the first block's older keys staged before the dependency wait: the same bits
        gpu_use_flash_early_kv_for_test(1);
        const auto early = gpu_attention_for_test(s, c.h.cache, window, c.scale, c.st, c.q, 0, false);
        gpu_use_flash_early_kv_for_test(-1);
        ASSERT_EQ(early.size(), out.size());
        EXPECT_EQ(0, std::memcmp(early.data(), out.data(), out.size() * sizeof(float))) << "keys staged before the wait";
      }
      // The 2101-key row alone in a step: the same bits.
      StepDesc alone = c.st;
      alone.sequences = {c.st.sequences[3]};
      alone.sequences[0].first_token = 0;
      alone.tokens = {0};
      alone.positions = {c.st.positions[3]};
      alone.row_seq = {0};
      const std::vector<float> q3(c.q.begin() + 3 * (long)(s.n_head * s.head_dim_k), c.q.begin() + 4 * (long)(s.n_head * s.head_dim_k));
      const auto out3 = gpu_attention_for_test(s, c.h.cache, window, c.scale, alone, q3, 0, false);
      ASSERT_EQ(out3.size(), c.row);
      EXPECT_EQ(0, std::memcmp(out3.data(), out.data() + 3 * c.row, c.row * sizeof(float))) << "a row's bits depend on its batch-mates";
    }
}

// Steps whose rows all have one split (at most the shortest span of keys): the flash kernel finalizes them
// itself, without the combine kernel, and must give the combine kernel's bits, the output's int8 form
// included; padding rows of the bucket come back zero (the hook checks). Also against the float64 reference.
TEST(GpuAttention, OneSplitStepsFinalizeInTheFlashKernelWithTheCombinesBits) {
  SKIP_WITHOUT_GPU();
  struct FinalizeMode {
    explicit FinalizeMode(int m) { gpu_use_flash_finalize_for_test(m); }
    ~FinalizeMode() { gpu_use_flash_finalize_for_test(-1); }
  };
  // Five rows of 1 to 31 keys (one sequence with two new rows): a bucket of 8, three padding rows.
  const std::vector<std::pair<int, int>> seqs = {{0, 1}, {7, 1}, {29, 2}, {18, 1}};
  for (const GpuAttentionShape& s : {GpuAttentionShape{8, 2, 64, 64}, GpuAttentionShape{12, 1, 128, 128}, GpuAttentionShape{4, 2, 256, 256},
                                     GpuAttentionShape{6, 2, 96, 96}, GpuAttentionShape{64, 8, 128, 128}, GpuAttentionShape{16, 1, 128, 128}})
    for (int window : {0, 12}) {
      SCOPED_TRACE(describe(s, DType::F16, DType::F16, window));
      const AttentionCase c = run_against_reference(s, DType::F16, DType::F16, window, seqs, 331 + (uint64_t)window + (uint64_t)s.head_dim_k, 2);
      std::vector<uint8_t> act_fin, act_sep;
      const int64_t before = gpu_flash_finalize_launches_for_test();
      std::vector<float> fin, sep;
      {
        const FinalizeMode on(1);
        fin = gpu_attention_for_test(s, c.h.cache, window, c.scale, c.st, c.q, 0, false, 0, &act_fin);
      }
      EXPECT_GT(gpu_flash_finalize_launches_for_test(), before) << "the flash kernel did not finalize";
      const int64_t after = gpu_flash_finalize_launches_for_test();
      {
        const FinalizeMode off(0);
        sep = gpu_attention_for_test(s, c.h.cache, window, c.scale, c.st, c.q, 0, false, 0, &act_sep);
      }
      EXPECT_EQ(gpu_flash_finalize_launches_for_test(), after) << "finalized with the switch off";
      ASSERT_EQ(fin.size(), c.ref.size());
      ASSERT_EQ(sep.size(), fin.size());
      EXPECT_EQ(0, std::memcmp(fin.data(), sep.data(), fin.size() * sizeof(float))) << "the output's bits differ from the combine kernel's";
      ASSERT_EQ(act_fin.size(), act_sep.size());
      EXPECT_TRUE(act_fin == act_sep) << "the int8 output differs from the combine kernel's";
      for (int r = 0; r < c.st.n_tokens(); ++r)
        EXPECT_LT(test::nmse_vs_reference(fin, c.ref, r * c.row, (r + 1) * c.row), 1e-5) << "row " << r << " at " << c.st.positions[r];
    }
}

TEST(GpuAttention, PrefillMatchesTheReference) {
  SKIP_WITHOUT_GPU();
  const SplitKernelOnly split_kernel;
  // Rows 0-36: a prompt run (prefill_attention); 37-39 and 85: split kernel; 40-84 (45 rows, < 256 keys): a
  // prompt run where the one-launch flash kernel takes the cache (f16 K and V of equal head dims: every run of
  // 32 rows, prefill_min_keys), else the split kernel (the cuBLAS tiles take runs from 256 keys).
  const std::vector<std::pair<int, int>> seqs = {{600, 37}, {5, 3}, {0, 45}, {250, 1}};
  const int run_rows = 37, short_run_first = 40, short_run_end = 85;
  for (const GpuAttentionShape& s : Shapes())
    for (auto [tk, tv] : KvTypes())
      for (int window : {0, 100})
        for (int key_tile : {64, 0}) {
          SCOPED_TRACE(describe(s, tk, tv, window) + ", key tile " + std::to_string(key_tile));
          const AttentionCase c = run_against_reference(s, tk, tv, window, seqs, 7 + (uint64_t)window + (uint64_t)s.head_dim_k, 5, key_tile);
          const StepDesc& st = c.st;
          const std::vector<float>& out = c.out;
          const std::vector<double>& ref = c.ref;
          ASSERT_EQ(out.size(), ref.size());
          const size_t row = c.row;
          EXPECT_LT(test::nmse_vs_reference(out, ref, 0, run_rows * row), 1e-5) << "the prefill run";
          const bool flash = tk == DType::F16 && tv == DType::F16 && s.head_dim_k == s.head_dim_v;  // every shape's dims are flash's
          for (int r = run_rows; r < st.n_tokens(); ++r) {
            const bool in_short_run = r >= short_run_first && r < short_run_end;
            EXPECT_LT(test::nmse_vs_reference(out, ref, r * row, (r + 1) * row), flash && in_short_run ? 1e-5 : 1e-8)
                << "row " << r << " at " << st.positions[r];
          }
          if (flash) {  // the short run went through the flash kernel: f16 rounding, not the split kernel's f32 exactness
            double worst = 0;
            for (int r = short_run_first; r < short_run_end; ++r)
              worst = std::max(worst, test::nmse_vs_reference(out, ref, r * row, (r + 1) * row));
            EXPECT_GT(worst, 1e-10) << "the 45-row run from position 0 took the split kernel";
          }
        }
}

// Longer runs: several CTAs of query columns per KV head, many key blocks, the causal diagonal inside a
// block, a run that starts deep in its sequence, and a sliding window that drops whole key blocks.
TEST(GpuAttention, LongPrefillRunsMatchTheReference) {
  SKIP_WITHOUT_GPU();
  const SplitKernelOnly split_kernel;  // the last two rows' bound
  const std::vector<std::pair<int, int>> seqs = {{0, 300}, {1000, 70}, {33, 2}};
  for (const GpuAttentionShape& s : {GpuAttentionShape{16, 2, 128, 128}, GpuAttentionShape{8, 8, 64, 64}, GpuAttentionShape{12, 2, 256, 256},
                                     GpuAttentionShape{6, 3, 96, 96}})
    for (auto [tk, tv] : {std::pair{DType::F16, DType::F16}, std::pair{DType::Q8_0, DType::Q8_0}})
      for (int window : {0, 100}) {
        SCOPED_TRACE(describe(s, tk, tv, window));
        const AttentionCase c = run_against_reference(s, tk, tv, window, seqs, 17 + (uint64_t)window + (uint64_t)s.head_dim_k, 4);
        const StepDesc& st = c.st;
        const std::vector<float>& out = c.out;
        const std::vector<double>& ref = c.ref;
        ASSERT_EQ(out.size(), ref.size());
        const size_t row = c.row;
        for (int r = 0; r < st.n_tokens(); ++r)
          EXPECT_LT(test::nmse_vs_reference(out, ref, r * row, (r + 1) * row), r < 370 ? 1e-5 : 1e-8) << "row " << r << " at " << st.positions[r];
      }
}

// --- RoPE + K/V store ---

struct RopeCase {
  const char* name;
  GpuAttentionShape shape;
  int n_rot;
  bool neox, norms, factors;
  float freq_base, freq_scale;
};

// x: one head (head_dim values) in double: RMSNorm with w (when given), then RoPE of its first n_rot dims.
void rope_head_ref(std::vector<double>& x, const float* w, float eps, int pos, const RopeCase& c, const float* factors) {
  const int hd = (int)x.size(), half = c.n_rot / 2;
  if (w) {
    double ss = 0;
    for (double e : x) ss += e * e;
    const double inv = 1.0 / std::sqrt(ss / hd + eps);
    for (int i = 0; i < hd; ++i) x[(size_t)i] *= inv * w[i];
  }
  for (int i = 0; i < half; ++i) {
    double freq = (double)c.freq_scale * std::pow((double)c.freq_base, -2.0 * i / c.n_rot);
    if (factors) freq /= factors[i];
    const double th = pos * freq, cs = std::cos(th), sn = std::sin(th);
    const size_t a = c.neox ? (size_t)i : (size_t)(2 * i), b = c.neox ? (size_t)(i + half) : (size_t)(2 * i + 1);
    const double x0 = x[a], x1 = x[b];
    x[a] = x0 * cs - x1 * sn;
    x[b] = x0 * sn + x1 * cs;
  }
}

// Largest error a stored value of this type may have against the exact value x, where amax is the
// largest magnitude of x's 32-group in the row.
double store_tolerance(DType t, double x, double amax) {
  switch (t) {
    case DType::F32: return 1e-5 * (std::fabs(x) + 1e-1);
    case DType::F16: return std::ldexp(std::fabs(x), -10) + 1e-6;
    case DType::BF16: return std::ldexp(std::fabs(x), -7) + 1e-6;
    case DType::Q8_0: return 0.6 * amax / 127 + 1e-5;
    default: return 1.05 * amax / 8 + 1e-5;  // Q4_0: d = -max/8, a value at -max rounds to 7d (clamped)
  }
}

// The stored rows of slot `slot` (dequantized) against the float64 values want [dim].
void expect_stored(DType t, const std::vector<uint8_t>& plane, size_t slot, int dim, const std::vector<double>& want, const char* what,
                   int row) {
  std::vector<float> got((size_t)dim);
  dequantize_row_ref(t, plane.data() + slot * dtype_row_bytes(t, dim), got.data(), dim);
  int bad = 0;
  for (int i = 0; i < dim; ++i) {
    double amax = 0;
    for (int j = i / 32 * 32; j < std::min(dim, i / 32 * 32 + 32); ++j) amax = std::max(amax, std::fabs(want[(size_t)j]));
    const double err = std::fabs(got[(size_t)i] - want[(size_t)i]);
    if (!(err <= store_tolerance(t, want[(size_t)i], amax)) && bad++ < 3)
      ADD_FAILURE() << what << " of row " << row << " value " << i << ": stored " << got[(size_t)i] << ", want " << want[(size_t)i];
  }
}

TEST(GpuRopeStore, MatchesTheReference) {
  SKIP_WITHOUT_GPU();
  const std::vector<RopeCase> cases = {
      {"llama (normal)", {8, 2, 64, 64}, 64, false, false, false, 10000.0f, 1.0f},
      {"llama3 factors, scaled", {8, 4, 128, 128}, 128, false, false, true, 500000.0f, 0.25f},
      {"qwen3 (neox, q/k norm)", {16, 2, 128, 128}, 128, true, true, false, 1000000.0f, 1.0f},
      {"qwen3.5 (partial 64 of 256)", {8, 2, 256, 256}, 64, true, true, false, 10000000.0f, 1.0f},
      {"head 80 (whole-row store)", {4, 2, 80, 80}, 80, true, false, false, 10000.0f, 1.0f},
  };
  const DType types[] = {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0};
  // A decode-sized step (5 rows, padded to 8) and a larger one; positions from 1234 on, sequence 0's
  // early slots (where padding rows would land) not written.
  const std::vector<std::vector<std::pair<int, int>>> steps = {{{1234, 1}, {40, 3}, {7, 1}}, {{1234, 17}, {3000, 1}, {5, 30}}};
  for (const RopeCase& c : cases)
    for (DType type : types)
      for (const auto& seqs : steps) {
        const GpuAttentionShape& s = c.shape;
        SCOPED_TRACE(std::string(c.name) + ", " + dtype_name(type) + ", " + std::to_string(seqs.size()) + " sequences");
        Rng rng(3 + (uint64_t)s.head_dim_k + (uint64_t)type);
        const int n_blocks = blocks_needed(seqs) + 2;
        const StepDesc st = make_step(seqs, n_blocks, rng);
        const int n = st.n_tokens();
        const int kd = s.n_head_kv * s.head_dim_k, vd = s.n_head_kv * s.head_dim_v;
        HostCache h = random_cache(s, type, type, n_blocks, rng);
        const GpuKvCacheForTest before = h.cache;
        auto q = random_values((size_t)n * s.n_head * s.head_dim_k, rng);
        auto k = random_values((size_t)n * kd, rng);
        const auto v = random_values((size_t)n * vd, rng);
        std::vector<float> q_norm, k_norm, factors;
        GpuRopeForTest rope;
        rope.n_rot = c.n_rot;
        rope.neox = c.neox;
        rope.freq_base = c.freq_base;
        rope.freq_scale = c.freq_scale;
        rope.eps = 1e-6f;
        rope.table = seqs[0].second > 1;  // the larger step as prompt steps take it: rotations from a table
        if (c.norms) {
          q_norm = random_values((size_t)s.head_dim_k, rng);
          k_norm = random_values((size_t)s.head_dim_k, rng);
          rope.q_norm = q_norm.data();
          rope.k_norm = k_norm.data();
        }
        if (c.factors) {
          factors.resize((size_t)c.n_rot / 2);
          for (size_t i = 0; i < factors.size(); ++i) factors[i] = 1.0f + (float)(i % 7);
          rope.factors = factors.data();
        }
        const auto q_in = q, k_in = k;
        gpu_rope_store_for_test(s, rope, st, q, k, v, h.cache);
        // float64 reference of q and k, head by head.
        std::vector<double> q_ref(q.size()), k_ref(k.size());
        auto rotate = [&](const std::vector<float>& in, std::vector<double>& out, int heads, const float* w) {
          for (int r = 0; r < n; ++r)
            for (int hh = 0; hh < heads; ++hh) {
              const size_t at = ((size_t)r * heads + hh) * s.head_dim_k;
              std::vector<double> x(in.begin() + (long)at, in.begin() + (long)(at + s.head_dim_k));
              rope_head_ref(x, w, rope.eps, st.positions[(size_t)r], c, rope.factors);
              std::copy(x.begin(), x.end(), out.begin() + (long)at);
            }
        };
        rotate(q_in, q_ref, s.n_head, rope.q_norm);
        rotate(k_in, k_ref, s.n_head_kv, rope.k_norm);
        EXPECT_LT(test::nmse_vs_reference(q, q_ref), 1e-10) << "q";
        EXPECT_LT(test::nmse_vs_reference(k, k_ref), 1e-10) << "k";
        // Stored rows against the reference values; every other slot unchanged.
        std::vector<bool> written((size_t)n_blocks * kBlock, false);
        for (int r = 0; r < n; ++r) {
          const size_t slot = test::paged_slot(st.sequences[(size_t)st.row_seq[(size_t)r]], st.positions[(size_t)r], kBlock);
          written[slot] = true;
          const std::vector<double> kw(k_ref.begin() + (long)r * kd, k_ref.begin() + (long)(r + 1) * kd);
          const std::vector<double> vw(v.begin() + (long)r * vd, v.begin() + (long)(r + 1) * vd);
          expect_stored(type, h.cache.k, slot, kd, kw, "K", r);
          expect_stored(type, h.cache.v, slot, vd, vw, "V", r);
        }
        const size_t kb = dtype_row_bytes(type, kd), vb = dtype_row_bytes(type, vd);
        int changed = 0;
        for (size_t slot = 0; slot < written.size(); ++slot) {
          if (written[slot]) continue;
          const bool same = std::equal(h.cache.k.begin() + (long)(slot * kb), h.cache.k.begin() + (long)((slot + 1) * kb),
                                       before.k.begin() + (long)(slot * kb)) &&
                            std::equal(h.cache.v.begin() + (long)(slot * vb), h.cache.v.begin() + (long)((slot + 1) * vb),
                                       before.v.begin() + (long)(slot * vb));
          if (!same && changed++ < 3) ADD_FAILURE() << "slot " << slot << " was written though no row is at it";
        }
      }
}

// Decode attention's time and the KV bytes it reads per second, for a Qwen3-32B-like layer (64 query
// heads over 8 KV heads of 128) and a Qwen3.5-like one (16 over 2 of 256); printed, nothing expected:
// roofline_tests --gtest_also_run_disabled_tests --gtest_filter='GpuAttention.DISABLED_DecodeBandwidth'.
TEST(GpuAttention, DISABLED_DecodeBandwidth) {
  SKIP_WITHOUT_GPU();
  std::printf("device memory read bandwidth: %.0f GB/s\n", measure_gpu_read_bandwidth(0));
  const std::pair<const char*, GpuAttentionShape> shapes[] = {{"64/8 x 128", {64, 8, 128, 128}}, {"16/2 x 256", {16, 2, 256, 256}}};
  for (const auto& [name, s] : shapes)
    for (DType t : {DType::F16, DType::Q8_0})
      for (auto [n_seqs, depth] : {std::pair{1, 4096}, std::pair{1, 32768}, std::pair{8, 4096}, std::pair{8, 32768}, std::pair{64, 4096}}) {
        const double us = gpu_attention_decode_time_for_test(s, t, t, n_seqs, depth, 20);
        const double bytes = (double)n_seqs * depth *
                             (double)(dtype_row_bytes(t, s.n_head_kv * s.head_dim_k) + dtype_row_bytes(t, s.n_head_kv * s.head_dim_v));
        std::printf("  %-11s %-5s %2d x %5d keys: %8.1f us, %6.0f GB/s of KV\n", name, dtype_name(t).c_str(), n_seqs, depth, us,
                    bytes / us / 1e3);
      }
}

}  // namespace
