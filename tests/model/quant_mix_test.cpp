// The mix table: llama.cpp's per-tensor rules (use_more_bits layers, attn_v counters, output and
// embedding rules, row-size fallbacks), checked against llama.cpp-quantized files in ../shared and
// against the published sizes of llama.cpp's Q4_K_M files of real shapes.
#include <gtest/gtest.h>

#include "formats/gguf.h"
#include "model/quant_mix.h"
#include "model/synthetic.h"
#include "test_util.h"

using namespace roofline;

namespace {

std::vector<DType> plan_types(const QuantMix& mix, const gguf::GgufFile& base, MixOptions options = {}) {
  const auto& md = base.metadata();
  const std::string arch = md.get_string("general.architecture");
  std::vector<std::string> names;
  for (const auto& t : base.tensors()) names.push_back(t.name);
  MixPlanner planner(mix, mix_model_info(arch, (int)md.get_int(arch + ".block_count"), (int)md.get_int(arch + ".attention.head_count"),
                                         (int)md.get_int_or(arch + ".attention.head_count_kv", 0), 0, names),
                     options);
  std::vector<DType> types;
  for (const auto& t : base.tensors()) types.push_back(planner.type_for(t.name, t.type, t.ne, t.n_dims));
  return types;
}

}  // namespace

TEST(QuantMixTest, NamesAndAliases) {
  EXPECT_EQ(find_mix("q4_k_m")->file_type, FileType::MOSTLY_Q4_K_M);
  EXPECT_EQ(find_mix("Q4_K")->file_type, FileType::MOSTLY_Q4_K_M);
  EXPECT_EQ(find_mix("Q5_K")->file_type, FileType::MOSTLY_Q5_K_M);
  EXPECT_EQ(find_mix("Q3_K")->file_type, FileType::MOSTLY_Q3_K_M);
  EXPECT_EQ(find_mix("IQ4_XS")->default_type, DType::IQ4_XS);
  EXPECT_EQ(find_mix("Q7_K"), nullptr);
  EXPECT_EQ(file_type_description(15), "Q4_K - Medium");
  for (const char* required : {"Q8_0", "Q6_K", "Q5_K_M", "Q5_K_S", "Q4_K_M", "Q4_K_S", "Q3_K_L", "Q3_K_M", "Q3_K_S",
                               "Q2_K", "Q4_0", "Q5_0", "IQ4_XS", "F16", "BF16", "F32"})
    EXPECT_NE(find_mix(required), nullptr) << required;
}

TEST(QuantMixTest, WhatIsQuantized) {
  EXPECT_TRUE(tensor_allows_quantization("blk.0.attn_q.weight", 2));
  EXPECT_TRUE(tensor_allows_quantization("token_embd.weight", 2));
  EXPECT_FALSE(tensor_allows_quantization("blk.0.attn_norm.weight", 1));
  EXPECT_FALSE(tensor_allows_quantization("blk.0.attn_q_norm.weight", 2));
  EXPECT_FALSE(tensor_allows_quantization("blk.0.attn_q.bias", 2));
  EXPECT_FALSE(tensor_allows_quantization("blk.0.ffn_gate_inp.weight", 2));
  EXPECT_FALSE(tensor_allows_quantization("blk.0.ssm_conv1d.weight", 2));
  EXPECT_TRUE(tensor_allows_quantization("blk.0.ssm_alpha.weight", 2));
}

// use_more_bits over 28, 32 and 64 layers selects exactly the layers listed in llama-cpp-facts.md §3.4.
TEST(QuantMixTest, UseMoreBitsLayers) {
  auto q6_layers = [](int n_layer) {
    std::vector<std::string> names;
    for (int i = 0; i < n_layer; ++i) names.push_back("blk." + std::to_string(i) + ".ffn_down.weight");
    MixPlanner planner(*find_mix("Q4_K_M"), mix_model_info("qwen3", n_layer, 32, 8, 0, names));
    std::vector<int> layers;
    for (int i = 0; i < n_layer; ++i)
      if (planner.type_for(names[i], DType::F16, {4096, 4096, 1, 1}, 2) == DType::Q6_K) layers.push_back(i);
    return layers;
  };
  EXPECT_EQ(q6_layers(28), (std::vector<int>{0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 24, 25, 26, 27}));
  EXPECT_EQ(q6_layers(32), (std::vector<int>{0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31}));
  auto l64 = q6_layers(64);
  EXPECT_EQ(l64.size(), 32u);
  EXPECT_EQ(l64[8], 10);
  EXPECT_EQ(l64.back(), 63);
}

TEST(QuantMixTest, OutputEmbeddingAndFallbackRules) {
  const std::vector<std::string> untied = {"token_embd.weight", "blk.0.attn_v.weight", "output.weight"};
  {
    MixPlanner p(*find_mix("Q4_K_M"), mix_model_info("llama", 1, 32, 8, 0, untied));
    EXPECT_EQ(p.type_for("token_embd.weight", DType::F16, {4096, 1000, 1, 1}, 2), DType::Q4_K);
    EXPECT_EQ(p.type_for("blk.0.attn_v.weight", DType::F16, {4096, 1024, 1, 1}, 2), DType::Q6_K);
    EXPECT_EQ(p.type_for("output.weight", DType::F16, {4096, 1000, 1, 1}, 2), DType::Q6_K);
  }
  {  // tied: token_embd takes the output rule
    MixPlanner p(*find_mix("Q4_K_M"), mix_model_info("qwen3", 1, 16, 8, 0, {"token_embd.weight"}));
    EXPECT_EQ(p.type_for("token_embd.weight", DType::F16, {2048, 151936, 1, 1}, 2), DType::Q6_K);
  }
  {  // Q8_0 keeps Q8_0 everywhere
    MixPlanner p(*find_mix("Q8_0"), mix_model_info("llama", 1, 32, 8, 0, untied));
    EXPECT_EQ(p.type_for("output.weight", DType::F16, {4096, 1000, 1, 1}, 2), DType::Q8_0);
  }
  {  // rows that are not multiples of 256 fall back; of 32 neither: F16
    MixPlanner p(*find_mix("Q4_K_M"), mix_model_info("llama", 1, 32, 8, 0, untied));
    EXPECT_EQ(p.type_for("token_embd.weight", DType::F16, {4000, 10, 1, 1}, 2), DType::Q5_0);
    EXPECT_EQ(p.type_for("blk.0.attn_v.weight", DType::F16, {4000, 10, 1, 1}, 2), DType::Q8_0);
    EXPECT_EQ(p.type_for("output.weight", DType::F16, {4001, 10, 1, 1}, 2), DType::F16);
    EXPECT_EQ(p.fallback_count(), 3);
  }
  {  // overrides and --pure
    MixOptions o;
    o.output_type = DType::Q8_0;
    o.token_embedding_type = DType::Q6_K;
    MixPlanner p(*find_mix("Q4_K_M"), mix_model_info("llama", 1, 32, 8, 0, untied), o);
    EXPECT_EQ(p.type_for("token_embd.weight", DType::F16, {4096, 1000, 1, 1}, 2), DType::Q6_K);
    p.type_for("blk.0.attn_v.weight", DType::F16, {4096, 1024, 1, 1}, 2);
    EXPECT_EQ(p.type_for("output.weight", DType::F16, {4096, 1000, 1, 1}, 2), DType::Q8_0);
    MixOptions pure;
    pure.pure = true;
    MixPlanner q(*find_mix("Q4_K_M"), mix_model_info("llama", 1, 32, 8, 0, untied), pure);
    EXPECT_EQ(q.type_for("token_embd.weight", DType::F16, {4096, 1000, 1, 1}, 2), DType::Q4_K);
    EXPECT_EQ(q.type_for("blk.0.attn_v.weight", DType::F16, {4096, 1024, 1, 1}, 2), DType::Q4_K);
    EXPECT_EQ(q.type_for("output.weight", DType::F16, {4096, 1000, 1, 1}, 2), DType::Q4_K);
  }
  {  // Q3_K_M: first two attn_v Q5_K, attn_output Q4_K; Q2_K with GQA 4 gets Q4_K attn_v
    std::vector<std::string> names;
    for (int i = 0; i < 4; ++i) names.push_back("blk." + std::to_string(i) + ".attn_v.weight");
    MixPlanner p(*find_mix("Q3_K_M"), mix_model_info("llama", 4, 32, 8, 0, names));
    std::vector<DType> got;
    for (auto& n : names) got.push_back(p.type_for(n, DType::F16, {4096, 1024, 1, 1}, 2));
    EXPECT_EQ(got, (std::vector<DType>{DType::Q5_K, DType::Q5_K, DType::Q4_K, DType::Q4_K}));
    EXPECT_EQ(p.type_for("blk.0.attn_output.weight", DType::F16, {4096, 4096, 1, 1}, 2), DType::Q4_K);
    MixPlanner q(*find_mix("Q2_K"), mix_model_info("llama", 4, 32, 8, 0, names));
    EXPECT_EQ(q.type_for(names[0], DType::F16, {4096, 1024, 1, 1}, 2), DType::Q4_K);
    EXPECT_EQ(q.type_for("blk.0.ffn_down.weight", DType::F16, {14336, 4096, 1, 1}, 2), DType::Q3_K);
  }
  {  // 70B llama: attn_v Q4_K becomes Q5_K
    MixPlanner p(*find_mix("Q4_K_S"), mix_model_info("llama", 80, 64, 8, 0, {"blk.10.attn_v.weight"}));
    EXPECT_EQ(p.type_for("blk.10.attn_v.weight", DType::F16, {8192, 1024, 1, 1}, 2), DType::Q5_K);
  }
}

// Planning the F16 base with each mix gives exactly the tensor types llama-quantize wrote.
TEST(QuantMixTest, ReproducesLlamaCppFiles) {
  ROOFLINE_SHARED_PATH_OR_SKIP(dir, "testdata/models/qwen3-tiny512-llamacpp");
  auto base = gguf::GgufFile::open(dir + "/qwen3-tiny512-F16.gguf");
  for (const char* mix : {"Q8_0", "Q6_K", "Q5_K_M", "Q5_0", "Q4_K_M", "Q4_K_S", "IQ4_XS", "Q4_0", "Q3_K_M", "Q2_K"}) {
    auto quantized = gguf::GgufFile::open(dir + "/qwen3-tiny512-" + mix + ".gguf");
    const auto types = plan_types(*find_mix(mix), *base);
    EXPECT_EQ(quantized->metadata().get_int("general.file_type"), (int64_t)find_mix(mix)->file_type) << mix;
    for (size_t i = 0; i < base->tensors().size(); ++i) {
      const auto& name = base->tensors()[i].name;
      const gguf::TensorInfo* q = quantized->find_tensor(name);
      ASSERT_NE(q, nullptr) << mix << " " << name;
      EXPECT_EQ(dtype_name(types[i]), dtype_name(q->type)) << mix << " " << name;
    }
  }
}

// Synthetic Q4_K_M shapes have the tensor bytes of llama.cpp's files of those models
// (performance-targets.md / model-configs.md: qwen3-32b 19.76 GB, qwen3-8b 5.03 GB, 1.7b 1.11 GB).
TEST(QuantMixTest, SyntheticSizesMatchLlamaCppFiles) {
  auto bytes = [](const char* spec) {
    uint64_t n = 0;
    for (const auto& t : synthetic_layout(parse_synthetic_spec(spec)).tensors) n += t.n_bytes;
    return n / 1e9;
  };
  EXPECT_NEAR(bytes("qwen3-32b:Q4_K_M"), 19.76, 0.02);
  EXPECT_NEAR(bytes("qwen3-8b:Q4_K_M"), 5.03, 0.02);
  EXPECT_NEAR(bytes("qwen3-1.7b:Q4_K_M"), 1.11, 0.02);
  EXPECT_NEAR(bytes("qwen3-1.7b:Q8_0"), 1.83, 0.02);
  EXPECT_NEAR(bytes("llama3-8b:Q4_K_M"), 4.92, 0.02);
  EXPECT_NEAR(bytes("qwen2.5-32b:Q4_K_M"), 19.9, 0.1);
}
