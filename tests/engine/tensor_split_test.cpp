// The -sm row split (engine/tensor_split.h) without a GPU: which heads and FFN features each GPU takes,
// the one-line refusals, and the arithmetic it relies on: a layer's attention output and FFN computed
// from each GPU's slices (rows of q/k/v and gate/up, byte ranges of the output and down matrices'
// quantized rows) and summed over the GPUs equal the unsplit layer's; then whole models sliced by
// Model::tensor_slice, run by the double reference forward with the two sums per layer, against the
// unsplit model's logits. Also the NCCL loader's errors (backend/nccl.h): a library that is missing or
// is not NCCL is one line naming it.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "backend/nccl.h"
#include "core/error.h"
#include "engine/engine_test_util.h"
#include "engine/random_weight.h"
#include "engine/reference_forward.h"
#include "engine/tensor_split.h"

using namespace roofline;

namespace {

HParams dense(int n_head, int n_head_kv, int head_dim, int n_ff, int n_layer = 4) {
  HParams hp;
  hp.n_embd = n_head * head_dim;
  hp.n_layer = n_layer;
  hp.n_head = n_head;
  hp.n_head_kv = n_head_kv;
  hp.head_dim_k = hp.head_dim_v = head_dim;
  hp.n_ff = n_ff;
  hp.layer_mixer.assign((size_t)n_layer, MixerKind::Attention);
  return hp;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// y = W x over the dequantized values of a RandomWeight's rows, columns [c0, c1) of W and of x.
std::vector<double> product(const std::vector<float>& w, int64_t rows, int64_t cols, const std::vector<double>& x) {
  std::vector<double> y((size_t)rows, 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) y[(size_t)r] += (double)w[(size_t)(r * cols + c)] * x[(size_t)c];
  return y;
}

std::vector<float> dequantized(DType type, const std::vector<uint8_t>& bytes, int64_t rows, int64_t cols) {
  std::vector<float> out((size_t)(rows * cols));
  dequantize_rows_ref(type, bytes.data(), out.data(), rows, cols);
  return out;
}

}  // namespace

TEST(TensorSplitTest, HeadsAndFeaturesFollowTheProportionsInWholeBlocks) {
  // qwen3-32b: 64 query heads over 8 KV heads of 128, FFN 25600; K-quant output and down weights.
  const HParams hp = dense(64, 8, 128, 25600);
  auto s = plan_tensor_split(hp, {1, 1}, 256, 256);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].kv_head_begin, 0);
  EXPECT_EQ(s[0].kv_head_end, 4);
  EXPECT_EQ(s[1].kv_head_begin, 4);
  EXPECT_EQ(s[1].kv_head_end, 8);
  EXPECT_EQ(s[0].ff_begin, 0);
  EXPECT_EQ(s[0].ff_end, 12800);
  EXPECT_EQ(s[1].ff_end, 25600);
  s = plan_tensor_split(hp, {3, 1}, 256, 256);
  EXPECT_EQ(s[0].n_kv_heads(), 6);
  EXPECT_EQ(s[1].n_kv_heads(), 2);
  EXPECT_EQ(s[0].n_ff() % 256, 0);
  EXPECT_EQ(s[0].n_ff() + s[1].n_ff(), 25600);
  EXPECT_NEAR((double)s[0].n_ff() / 25600, 0.75, 0.01);
  // Four GPUs, groups of one query head of 64 values: 4 KV heads make one 256-column unit of the output
  // matrix, so 8 KV heads split only two ways.
  const HParams narrow = dense(8, 8, 64, 1024);
  s = plan_tensor_split(narrow, {1, 1}, 256, 256);
  EXPECT_EQ(s[0].n_kv_heads(), 4);
  EXPECT_NE(error_of([&] { plan_tensor_split(narrow, {1, 1, 1, 1}, 256, 256); }).find("groups of KV heads"), std::string::npos);
  // Q8_0 blocks of 32: the same model splits four ways.
  s = plan_tensor_split(narrow, {1, 1, 1, 1}, 32, 32);
  for (int g = 0; g < 4; ++g) EXPECT_EQ(s[(size_t)g].n_kv_heads(), 2);
}

TEST(TensorSplitTest, ModelsItCannotSplitGetOneLine) {
  HParams moe = dense(32, 4, 128, 6144);
  moe.n_expert = 128;
  EXPECT_NE(error_of([&] { plan_tensor_split(moe, {1, 1}, 256, 256); }).find("mixture-of-experts"), std::string::npos);
  HParams hybrid = dense(24, 4, 256, 17408);
  hybrid.layer_mixer[0] = MixerKind::DeltaNet;
  const std::string e = error_of([&] { plan_tensor_split(hybrid, {1, 1}, 256, 256); });
  EXPECT_NE(e.find("layer 0"), std::string::npos) << e;
  EXPECT_NE(error_of([&] { plan_tensor_split(dense(8, 1, 128, 4096), {1, 1}, 256, 256); }).find("1 splittable"), std::string::npos);
  EXPECT_NE(error_of([&] { plan_tensor_split(dense(8, 8, 128, 1000), {1, 1}, 256, 256); }).find("FFN width 1000"), std::string::npos);
  EXPECT_NE(error_of([&] { plan_tensor_split(dense(8, 8, 128, 4096), {1, 0}, 256, 256); }).find("GPU 1 of 2"), std::string::npos);
  for (const auto& e2 : {error_of([&] { plan_tensor_split(moe, {1, 1}, 256, 256); }),
                         error_of([&] { plan_tensor_split(dense(8, 8, 128, 1000), {1, 1}, 256, 256); })})
    EXPECT_EQ(e2.find('\n'), std::string::npos) << e2;
}

TEST(TensorSplitTest, SlicesSumToTheUnsplitProducts) {
  Rng rng(31);
  for (DType type : {DType::Q4_K, DType::Q6_K, DType::Q8_0, DType::F16}) {
    // Attention output: [n_embd x (n_head * head_dim)], each GPU its heads' columns times its heads' values.
    const HParams hp = dense(8, 4, 64, 768);
    const int64_t block = dtype_block_size(type), n_embd = 96, o_cols = (int64_t)hp.n_head * hp.head_dim_v;
    const auto shards = plan_tensor_split(hp, {2, 1}, block, block);
    test::RandomWeight o(type, n_embd, o_cols, rng);
    std::vector<double> attn((size_t)o_cols);
    for (double& v : attn) v = rng.normal();
    const std::vector<double> full = product(o.values, n_embd, o_cols, attn);
    std::vector<double> summed((size_t)n_embd, 0.0);
    for (const TensorShard& s : shards) {
      const int64_t c0 = (int64_t)s.kv_head_begin * hp.n_gqa() * hp.head_dim_v, c1 = (int64_t)s.kv_head_end * hp.n_gqa() * hp.head_dim_v;
      const auto bytes = slice_columns(o.bytes.data(), type, n_embd, o_cols, c0, c1);
      const std::vector<double> part_x(attn.begin() + c0, attn.begin() + c1);
      const auto part = product(dequantized(type, bytes, n_embd, c1 - c0), n_embd, c1 - c0, part_x);
      for (int64_t r = 0; r < n_embd; ++r) summed[(size_t)r] += part[(size_t)r];
    }
    for (int64_t r = 0; r < n_embd; ++r) EXPECT_NEAR(summed[(size_t)r], full[(size_t)r], 1e-9 * (1 + std::abs(full[(size_t)r]))) << dtype_name(type);

    // FFN: down(silu(gate x) * up x), each GPU its rows of gate and up and its columns of down.
    const int64_t n_ff = hp.n_ff;
    test::RandomWeight gate(type, n_ff, 256, rng), up(type, n_ff, 256, rng), down(type, n_embd, n_ff, rng);  // inputs of 256
    std::vector<double> x(256);
    for (double& v : x) v = rng.normal();
    const auto g = product(gate.values, n_ff, 256, x), u = product(up.values, n_ff, 256, x);
    std::vector<double> h((size_t)n_ff);
    for (int64_t i = 0; i < n_ff; ++i) h[(size_t)i] = g[(size_t)i] / (1 + std::exp(-g[(size_t)i])) * u[(size_t)i];
    const auto ffn_full = product(down.values, n_embd, n_ff, h);
    std::vector<double> ffn_sum((size_t)n_embd, 0.0);
    for (const TensorShard& s : shards) {
      // gate/up rows [ff_begin, ff_end) are contiguous rows of the GGUF tensor: their values are the same rows.
      std::vector<double> hs;
      for (int64_t i = s.ff_begin; i < s.ff_end; ++i) {
        double gi = 0, ui = 0;
        for (int64_t c = 0; c < 256; ++c) {
          gi += (double)gate.values[(size_t)(i * 256 + c)] * x[(size_t)c];
          ui += (double)up.values[(size_t)(i * 256 + c)] * x[(size_t)c];
        }
        hs.push_back(gi / (1 + std::exp(-gi)) * ui);
      }
      const auto bytes = slice_columns(down.bytes.data(), type, n_embd, n_ff, s.ff_begin, s.ff_end);
      const auto part = product(dequantized(type, bytes, n_embd, s.n_ff()), n_embd, s.n_ff(), hs);
      for (int64_t r = 0; r < n_embd; ++r) ffn_sum[(size_t)r] += part[(size_t)r];
    }
    for (int64_t r = 0; r < n_embd; ++r)
      EXPECT_NEAR(ffn_sum[(size_t)r], ffn_full[(size_t)r], 1e-9 * (1 + std::abs(ffn_full[(size_t)r]))) << dtype_name(type);
  }
  // Bounds off the blocks are refused.
  test::RandomWeight w(DType::Q4_K, 4, 512, rng);
  EXPECT_THROW(slice_columns(w.bytes.data(), DType::Q4_K, 4, 512, 0, 128), Error);
  EXPECT_THROW(slice_columns(w.bytes.data(), DType::Q4_K, 4, 512, 256, 256), Error);
}

// Whole models: each GPU's slice (Model::tensor_slice of plan_tensor_split's shards) through the reference
// forward, the attention and FFN outputs summed over the slices as the all-reduces will, for a few tokens;
// the logits against the unsplit model's.
TEST(TensorSplitTest, SlicedModelsGiveTheUnsplitLogits) {
  using LT = LayerTensor;
  // (Their K-quant mixes are one unit of heads: 256-column blocks span both KV groups of the output matrix.)
  for (const char* spec : {"tiny-qwen3:F32", "tiny-qwen3:Q8_0", "tiny-qwen3:Q4_0", "tiny-llama:Q8_0", "tiny-qwen2:Q8_0"}) {
    const auto model = test::tiny(spec);
    const HParams& hp = model->hparams();
    const auto& L0 = model->layer(0);
    const int64_t o_block = dtype_block_size(L0[LT::AttnOut].type()), down_block = dtype_block_size(L0[LT::FfnDown].type());
    for (const std::vector<double>& ts : {std::vector<double>{1, 1}, std::vector<double>{2, 1}}) {
      std::vector<TensorShard> shards;
      try {
        shards = plan_tensor_split(hp, ts, o_block, down_block);
      } catch (const Error& e) {
        ADD_FAILURE() << spec << ": " << e.what();
        continue;
      }
      std::vector<std::shared_ptr<const Model>> slices;
      for (const TensorShard& s : shards) {
        slices.push_back(Model::tensor_slice(model, s.kv_head_begin, s.kv_head_end, s.ff_begin, s.ff_end));
        EXPECT_EQ(slices.back()->hparams().n_head_kv, s.n_kv_heads());
        EXPECT_EQ(slices.back()->layer(0)[LT::FfnDown].cols(), s.n_ff());
      }
      test::ReferenceForward whole(*model);
      std::vector<test::ReferenceForward> parts;
      for (const auto& m : slices) parts.emplace_back(*m);
      const std::vector<int32_t> tokens = test::some_tokens(5, hp.n_vocab, 3);
      for (int pos = 0; pos < (int)tokens.size(); ++pos) {
        const std::vector<double> want = whole.step(tokens[(size_t)pos]);
        std::vector<double> x = whole.weight_row(model->token_embd(), tokens[(size_t)pos]);
        for (int il = 0; il < hp.n_layer; ++il) {
          std::vector<double> sum(x.size(), 0.0);
          for (auto& p : parts) {
            const auto o = p.attention_block(il, x, pos);
            for (size_t i = 0; i < x.size(); ++i) sum[i] += o[i];
          }
          for (size_t i = 0; i < x.size(); ++i) x[i] += sum[i];
          std::fill(sum.begin(), sum.end(), 0.0);
          for (auto& p : parts) {
            const auto d = p.ffn_block(il, x);
            for (size_t i = 0; i < x.size(); ++i) sum[i] += d[i];
          }
          for (size_t i = 0; i < x.size(); ++i) x[i] += sum[i];
        }
        const std::vector<double> got = parts[0].logits_of(x);
        ASSERT_EQ(got.size(), want.size());
        double err = 0, ref = 0;
        for (size_t i = 0; i < got.size(); ++i) {
          err += (got[i] - want[i]) * (got[i] - want[i]);
          ref += want[i] * want[i];
        }
        EXPECT_LT(err / ref, 1e-20) << spec << " -ts " << ts[0] << "," << ts[1] << " token " << pos;
      }
    }
  }
  // A slice that is not one: one line.
  const auto model = test::tiny("tiny-qwen3:F32");
  EXPECT_THROW(Model::tensor_slice(model, 0, model->hparams().n_head_kv + 1, 0, 256), Error);
}

TEST(NcclLoaderTest, AMissingOrForeignLibraryIsOneLineNamingIt) {
  std::string e = error_of([] { nccl::load("/nonexistent/libnccl.so.2"); });
  EXPECT_NE(e.find("/nonexistent/libnccl.so.2"), std::string::npos) << e;
  EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  // A library that loads but is not NCCL: the first missing entry point is named.
  e = error_of([] { nccl::load("libm.so.6"); });
  EXPECT_NE(e.find("libm.so.6 is not a usable NCCL library: it has no ncclGetVersion"), std::string::npos) << e;
  // ROOFLINE_NCCL_LIB replaces the search.
  setenv("ROOFLINE_NCCL_LIB", "/opt/x/libnccl.so.2", 1);
  EXPECT_EQ(nccl::candidate_paths(), std::vector<std::string>{"/opt/x/libnccl.so.2"});
  unsetenv("ROOFLINE_NCCL_LIB");
  const auto paths = nccl::candidate_paths();
  ASSERT_GE(paths.size(), 2u);
  EXPECT_EQ(paths[0], "libnccl.so.2");
}
