// The quantizer's plan on real model shapes (synthetic layouts, no data): per-tensor types by name and
// layer for each mix (llama.cpp's rules as llama-cpp-facts.md §3.5 states them), the options (--pure,
// type overrides, --leave-output-tensor, an imatrix changing the rules), output order, metadata, and
// the refusals (requantizing, imatrix of the wrong shape).
#include <gtest/gtest.h>

#include <regex>

#include "core/error.h"
#include "model/model_file.h"
#include "model/quantize.h"
#include "model/synthetic.h"

using namespace roofline;

namespace {

std::shared_ptr<gguf::GgufFile> layout(const std::string& spec) {
  ModelFileOptions o;
  o.layout_only = true;
  return open_model_file("synthetic:" + spec, o);
}

std::map<std::string, DType> plan_types(const gguf::GgufFile& f, const char* mix, QuantizeOptions o = {}) {
  o.mix = find_mix(mix);
  std::map<std::string, DType> out;
  for (const TensorPlan& p : plan_quantization(f, o).tensors) out[p.name] = p.to;
  return out;
}

std::string blk(int layer, const char* name) { return "blk." + std::to_string(layer) + "." + name + ".weight"; }

// Layers use_more_bits selects for 28 layers (llama-cpp-facts.md §3.4).
const std::set<int> kMoreBits28 = {0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 24, 25, 26, 27};

}  // namespace

TEST(QuantizePlanTest, OutputOrderIsLayerThenName) {
  EXPECT_TRUE(quantize_tensor_order("output.weight", "blk.0.attn_q.weight"));
  EXPECT_TRUE(quantize_tensor_order("output.weight", "output_norm.weight"));
  EXPECT_TRUE(quantize_tensor_order("output_norm.weight", "token_embd.weight"));
  EXPECT_TRUE(quantize_tensor_order("blk.9.ffn_up.weight", "blk.10.attn_k.weight"));
  EXPECT_TRUE(quantize_tensor_order("blk.2.attn_k.weight", "blk.2.attn_k_norm.weight"));
  auto f = layout("qwen3-1.7b:F16");
  QuantizeOptions o;
  o.mix = find_mix("Q4_K_M");
  const auto plan = plan_quantization(*f, o);
  for (size_t i = 1; i < plan.tensors.size(); ++i)
    EXPECT_TRUE(quantize_tensor_order(plan.tensors[i - 1].name, plan.tensors[i].name)) << plan.tensors[i].name;
}

TEST(QuantizePlanTest, Qwen3_1_7bRulesPerMix) {
  auto f = layout("qwen3-1.7b:F16");  // 28 layers, 16 heads / 8 KV heads, tied embeddings
  for (const char* mix : {"Q4_K_M", "Q5_K_M", "Q4_K_S", "Q5_K_S", "Q3_K_M", "Q3_K_L", "Q3_K_S", "Q2_K", "Q6_K", "Q8_0",
                          "IQ4_XS", "Q4_0", "Q5_0"}) {
    SCOPED_TRACE(mix);
    const auto t = plan_types(*f, mix);
    const DType def = find_mix(mix)->default_type;
    // Tied embeddings take the output rule: Q6_K (Q8_0 for Q8_0).
    EXPECT_EQ(t.at("token_embd.weight"), def == DType::Q8_0 ? DType::Q8_0 : DType::Q6_K);
    EXPECT_EQ(t.at("output_norm.weight"), DType::F32);
    for (int l = 0; l < 28; ++l) {
      SCOPED_TRACE(l);
      const bool more = kMoreBits28.count(l) > 0;
      DType v = def, down = def, out = def;
      const std::string m = mix;
      if (m == "Q4_K_M") v = down = more ? DType::Q6_K : DType::Q4_K;
      if (m == "Q5_K_M") v = down = more ? DType::Q6_K : DType::Q5_K;
      if (m == "Q4_K_S") v = l < 4 ? DType::Q5_K : DType::Q4_K, down = l < 3 ? DType::Q5_K : DType::Q4_K;
      if (m == "Q3_K_M") v = l < 2 ? DType::Q5_K : DType::Q4_K, down = l < 1 ? DType::Q5_K : DType::Q4_K, out = DType::Q4_K;
      if (m == "Q3_K_L") v = down = out = DType::Q5_K;
      if (m == "Q2_K") v = down = out = DType::Q3_K;  // GQA 2 (< 4): attn_v Q3_K
      if (m == "IQ4_XS") down = l < 3 ? DType::Q5_K : DType::IQ4_XS;  // no imatrix: first eighth Q5_K
      EXPECT_EQ(dtype_name(t.at(blk(l, "attn_v"))), dtype_name(v));
      EXPECT_EQ(dtype_name(t.at(blk(l, "ffn_down"))), dtype_name(down));
      EXPECT_EQ(dtype_name(t.at(blk(l, "attn_output"))), dtype_name(out));
      for (const char* same : {"attn_q", "attn_k", "ffn_gate", "ffn_up"}) EXPECT_EQ(dtype_name(t.at(blk(l, same))), dtype_name(def)) << same;
      for (const char* norm : {"attn_norm", "ffn_norm", "attn_q_norm", "attn_k_norm"}) EXPECT_EQ(t.at(blk(l, norm)), DType::F32) << norm;
    }
  }
}

TEST(QuantizePlanTest, GqaAndUntiedRules) {
  auto f = layout("llama3-8b:F16");  // 32 layers, GQA 4, untied embeddings
  auto t = plan_types(*f, "Q4_K_M");
  EXPECT_EQ(t.at("token_embd.weight"), DType::Q4_K);  // untied: the default type
  EXPECT_EQ(t.at("output.weight"), DType::Q6_K);
  EXPECT_EQ(t.at(blk(3, "attn_v")), DType::Q6_K);  // 32 layers: 0-3 are in the first eighth
  EXPECT_EQ(t.at(blk(4, "attn_v")), DType::Q4_K);
  EXPECT_EQ(t.at(blk(6, "attn_v")), DType::Q6_K);
  t = plan_types(*f, "Q2_K");
  EXPECT_EQ(t.at(blk(5, "attn_v")), DType::Q4_K);  // GQA >= 4
  EXPECT_EQ(t.at("token_embd.weight"), DType::Q2_K);
  t = plan_types(*f, "IQ4_XS");
  EXPECT_EQ(t.at(blk(10, "attn_v")), DType::Q5_K);  // GQA >= 4
  EXPECT_EQ(t.at(blk(3, "ffn_down")), DType::Q5_K);
  EXPECT_EQ(t.at(blk(4, "ffn_down")), DType::IQ4_XS);
  auto big = layout("llama3-70b:F16");  // 80 layers: attn_v Q4_K becomes Q5_K
  t = plan_types(*big, "Q4_K_S");
  EXPECT_EQ(t.at(blk(40, "attn_v")), DType::Q5_K);
}

TEST(QuantizePlanTest, ImatrixChangesRules) {
  auto f = layout("qwen3-1.7b:F16");
  ImportanceData im;  // an imatrix with no entries still counts as "has imatrix" for the rules
  QuantizeOptions o;
  o.imatrix = &im;
  auto t = plan_types(*f, "IQ4_XS", o);
  EXPECT_EQ(t.at(blk(0, "ffn_down")), DType::IQ4_XS);  // the Q5_K bump is only for quantizing without one
  t = plan_types(*f, "Q4_0", o);
  EXPECT_EQ(t.at(blk(2, "ffn_down")), DType::Q4_1);  // first eighth: Q4_1 with an imatrix
  EXPECT_EQ(t.at(blk(3, "ffn_down")), DType::Q4_0);
  t = plan_types(*f, "Q5_0", o);
  EXPECT_EQ(t.at(blk(0, "ffn_down")), DType::Q5_1);
  EXPECT_EQ(plan_types(*f, "Q4_0").at(blk(0, "ffn_down")), DType::Q4_0);
}

TEST(QuantizePlanTest, OptionsOverrideTheMix) {
  auto tied = layout("qwen3-1.7b:F16");
  auto untied = layout("llama3-8b:F16");
  QuantizeOptions o;
  o.mix_options.output_type = DType::Q8_0;
  EXPECT_EQ(plan_types(*tied, "Q4_K_M", o).at("token_embd.weight"), DType::Q8_0);  // tied: token_embd is the output
  o = {};
  o.mix_options.token_embedding_type = DType::Q8_0;
  auto t = plan_types(*untied, "Q4_K_M", o);
  EXPECT_EQ(t.at("token_embd.weight"), DType::Q8_0);
  EXPECT_EQ(t.at("output.weight"), DType::Q6_K);
  o = {};
  o.mix_options.pure = true;
  t = plan_types(*untied, "Q4_K_M", o);
  for (const auto& [name, type] : t) {
    if (name.find("norm") != std::string::npos || name == "rope_freqs.weight") continue;  // 1-D: never quantized
    EXPECT_EQ(type, DType::Q4_K) << name;
  }
  o = {};
  o.leave_output_tensor = true;
  EXPECT_EQ(plan_types(*untied, "Q4_K_M", o).at("output.weight"), DType::F16);
}

// Planning each mix on an F16 layout gives exactly the synthetic layout of that mix (the one
// whose sizes quant_mix_test checks against llama.cpp's published files).
TEST(QuantizePlanTest, MatchesSyntheticLayouts) {
  for (const char* shape : {"qwen3-1.7b", "llama3-8b", "qwen2.5-7b"}) {
    auto f = layout(std::string(shape) + ":F16");
    for (const char* mix : {"Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_K_S", "Q3_K_M", "Q2_K", "IQ4_XS", "Q4_0"}) {
      SCOPED_TRACE(std::string(shape) + " " + mix);
      QuantizeOptions o;
      o.mix = find_mix(mix);
      const QuantizePlan plan = plan_quantization(*f, o);
      const SyntheticLayout want = synthetic_layout(parse_synthetic_spec(std::string("synthetic:") + shape + ":" + mix));
      std::map<std::string, DType> types;
      uint64_t bytes = 0;
      for (const auto& t : want.tensors) types[t.name] = t.type, bytes += t.n_bytes;
      ASSERT_EQ(plan.tensors.size(), want.tensors.size());
      for (const TensorPlan& p : plan.tensors) EXPECT_EQ(dtype_name(p.to), dtype_name(types.at(p.name))) << p.name;
      EXPECT_EQ(plan.out_bytes, bytes);
    }
  }
}

TEST(QuantizePlanTest, MetadataAsLlamaQuantizeWrites) {
  auto f = layout("qwen3-1.7b:F16");
  gguf::Metadata md = f->metadata();
  md.set("split.count", gguf::Value::u16(1));
  auto with_split = gguf::GgufFile::from_parts("x", md, f->tensors(), nullptr);
  ImportanceData im;
  im.file = "imatrix.gguf";
  im.dataset = "calibration.txt";
  im.chunk_count = 12;
  im.values["blk.0.attn_q.weight"] = std::vector<float>(2048, 1.0f);
  QuantizeOptions o;
  o.mix = find_mix("Q4_K_M");
  o.imatrix = &im;
  const auto plan = plan_quantization(*with_split, o);
  const auto& e = plan.metadata.entries();
  EXPECT_FALSE(plan.metadata.contains("split.count"));
  const size_t n = e.size();
  ASSERT_GE(n, 6u);
  EXPECT_EQ(e[n - 6].first, "general.quantization_version");
  EXPECT_EQ(e[n - 5].first, "general.file_type");
  EXPECT_EQ(plan.metadata.get_int("general.file_type"), 15);
  EXPECT_EQ(e[n - 4].first, "quantize.imatrix.file");
  EXPECT_EQ(plan.metadata.get_string("quantize.imatrix.dataset"), "calibration.txt");
  EXPECT_EQ(plan.metadata.get_int("quantize.imatrix.entries_count"), 1);
  EXPECT_EQ(plan.metadata.get_int("quantize.imatrix.chunks_count"), 12);
  for (const TensorPlan& p : plan.tensors) EXPECT_EQ(p.uses_imatrix, p.name == "blk.0.attn_q.weight") << p.name;
  EXPECT_EQ(plan.missing_imatrix.size(), 28u * 7 + 1 - 1);  // every other quantized matrix (token_embd included)
}

TEST(QuantizePlanTest, Refusals) {
  auto q4 = layout("qwen3-1.7b:Q4_K_M");
  QuantizeOptions o;
  o.mix = find_mix("Q8_0");
  try {
    plan_quantization(*q4, o);
    FAIL() << "requantizing was not refused";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("already quantized"), std::string::npos) << m;
    EXPECT_NE(m.find("--allow-requantize"), std::string::npos) << m;
  }
  o.allow_requantize = true;
  EXPECT_NO_THROW(plan_quantization(*q4, o));
  o.allow_requantize = false;
  o.mix = find_mix("Q4_K_M");  // the same types: nothing is requantized, every tensor is copied
  const auto same = plan_quantization(*q4, o);
  for (const TensorPlan& p : same.tensors) EXPECT_FALSE(p.convert) << p.name;

  auto f16 = layout("qwen3-1.7b:F16");
  ImportanceData im;
  im.values["blk.3.ffn_down.weight"] = std::vector<float>(100, 1.0f);  // ffn_down has 6144 columns
  o.imatrix = &im;
  try {
    plan_quantization(*f16, o);
    FAIL() << "a wrong-sized imatrix entry was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("blk.3.ffn_down.weight"), std::string::npos) << e.what();
  }
  gguf::Metadata md;
  md.set("general.type", gguf::Value::string("imatrix"));
  auto not_model = gguf::GgufFile::from_parts("im.gguf", md, {}, nullptr);
  o.imatrix = nullptr;
  EXPECT_THROW(plan_quantization(*not_model, o), Error);
}
