// Synthetic models: exact layout of the named shapes, deterministic content per seed whatever the
// thread count, sane weights (finite, std ~0.02 after dequantization), and the file written by
// `roofline synth` equal to the model built in memory.
#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <cstring>
#include <map>

#include "core/error.h"
#include "formats/gguf.h"
#include "formats/quant_ref.h"
#include "model/model.h"
#include "model/model_file.h"
#include "model/synthetic.h"
#include "test_util.h"

using namespace roofline;

TEST(SyntheticTest, SpecParsing) {
  auto s = parse_synthetic_spec("synthetic:qwen3-1.7b:q4_k_m");
  EXPECT_EQ(s.shape.name, "qwen3-1.7b");
  EXPECT_EQ(s.mix->name, std::string("Q4_K_M"));
  EXPECT_EQ(s.seed, 1u);
  EXPECT_EQ(parse_synthetic_spec("synthetic:tiny-qwen3:Q8_0:42").seed, 42u);
  EXPECT_THROW(parse_synthetic_spec("synthetic:qwen9-1b:Q4_K_M"), Error);
  EXPECT_THROW(parse_synthetic_spec("synthetic:qwen3-8b:Q9"), Error);
  EXPECT_THROW(parse_synthetic_spec("synthetic:qwen3-8b"), Error);
  EXPECT_THROW(parse_synthetic_spec("synthetic:qwen3-8b:Q8_0:x"), Error);
  try {
    parse_synthetic_spec("synthetic:nope:Q8_0");
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("qwen3-32b"), std::string::npos) << "lists the known shapes";
  }
}

TEST(SyntheticTest, Qwen3_1_7bLayout) {
  auto layout = synthetic_layout(parse_synthetic_spec("qwen3-1.7b:Q4_K_M"));
  const auto& md = layout.metadata;
  EXPECT_EQ(md.get_string("general.architecture"), "qwen3");
  EXPECT_EQ(md.get_int("qwen3.embedding_length"), 2048);
  EXPECT_EQ(md.get_int("qwen3.block_count"), 28);
  EXPECT_EQ(md.get_int("qwen3.attention.head_count"), 16);
  EXPECT_EQ(md.get_int("qwen3.attention.head_count_kv"), 8);
  EXPECT_EQ(md.get_int("qwen3.attention.key_length"), 128);
  EXPECT_EQ(md.get_int("qwen3.feed_forward_length"), 6144);
  EXPECT_EQ(md.find("tokenizer.ggml.tokens")->array_size(), 151936u);
  std::map<std::string, const gguf::TensorInfo*> by_name;
  for (const auto& t : layout.tensors) by_name[t.name] = &t;
  EXPECT_EQ(by_name.count("output.weight"), 0u) << "tied embeddings";
  EXPECT_EQ(by_name["token_embd.weight"]->type, DType::Q6_K) << "tied embedding takes the output rule";
  EXPECT_EQ(by_name["blk.0.attn_q.weight"]->ne[1], 2048);
  EXPECT_EQ(by_name["blk.0.attn_k.weight"]->ne[1], 1024);
  EXPECT_EQ(by_name["blk.3.attn_q_norm.weight"]->ne[0], 128);
  EXPECT_EQ(by_name["blk.27.ffn_down.weight"]->ne[0], 6144);
  EXPECT_EQ(by_name["blk.27.ffn_down.weight"]->type, DType::Q6_K);
  EXPECT_EQ(by_name["blk.3.ffn_down.weight"]->type, DType::Q4_K);
  EXPECT_EQ(by_name["blk.0.attn_norm.weight"]->type, DType::F32);
  EXPECT_EQ(layout.tensors.size(), 1u + 28 * 11 + 1);
}

TEST(SyntheticTest, LlamaAndQwen2Specifics) {
  auto llama = synthetic_layout(parse_synthetic_spec("llama3-8b:Q4_K_M"));
  bool has_rope_freqs = false;
  for (const auto& t : llama.tensors)
    if (t.name == "rope_freqs.weight") has_rope_freqs = t.ne[0] == 64 && t.type == DType::F32;
  EXPECT_TRUE(has_rope_freqs);
  EXPECT_EQ(llama.metadata.get_int("llama.rope.dimension_count"), 128);
  auto qwen2 = synthetic_layout(parse_synthetic_spec("qwen2.5-32b:Q4_K_M"));
  int biases = 0;
  for (const auto& t : qwen2.tensors)
    if (t.name.find(".bias") != std::string::npos) ++biases;
  EXPECT_EQ(biases, 64 * 3);
  // llama3 rope factors: high frequencies unscaled, low frequencies divided by 8.
  auto f = llama3_rope_factors(128, 500000.0f, 8, 1, 4, 8192);
  ASSERT_EQ(f.size(), 64u);
  EXPECT_FLOAT_EQ(f[0], 1.0f);
  EXPECT_FLOAT_EQ(f[63], 8.0f);
  for (size_t i = 1; i < f.size(); ++i) EXPECT_GE(f[i], f[i - 1]);
}

TEST(SyntheticTest, DeterministicAcrossThreadCounts) {
  auto spec = parse_synthetic_spec("tiny-qwen3:Q4_K_M:5");
  auto a = build_synthetic_model(spec, 1);
  auto b = build_synthetic_model(spec, 3);
  spec.seed = 6;
  auto c = build_synthetic_model(spec, 2);
  ASSERT_EQ(a->tensors().size(), b->tensors().size());
  size_t differing = 0;
  for (size_t i = 0; i < a->tensors().size(); ++i) {
    const auto& ta = a->tensors()[i];
    EXPECT_EQ(0, std::memcmp(ta.data, b->tensors()[i].data, ta.n_bytes)) << ta.name;
    if (std::memcmp(ta.data, c->tensors()[i].data, ta.n_bytes) != 0) ++differing;
  }
  EXPECT_GE(differing, a->tensors().size() - 1) << "another seed gives other weights";
}

TEST(SyntheticTest, WeightsAreSane) {
  for (const char* mix : {"F16", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_0", "Q3_K_M", "Q2_K", "IQ4_XS", "BF16", "Q5_0"}) {
    auto model = build_synthetic_model(parse_synthetic_spec(std::string("tiny-llama:") + mix), 2);
    for (const auto& t : model->tensors()) {
      std::vector<float> values((size_t)t.n_elements());
      dequantize_rows_ref(t.type, t.data, values.data(), t.n_rows(), t.row_length());
      double sum = 0, sum2 = 0;
      for (float v : values) {
        ASSERT_TRUE(std::isfinite(v)) << mix << " " << t.name;
        sum += v;
        sum2 += (double)v * v;
      }
      const double mean = sum / values.size(), stddev = std::sqrt(sum2 / values.size() - mean * mean);
      if (t.n_dims == 2) {
        EXPECT_GT(stddev, 0.005) << mix << " " << t.name;
        EXPECT_LT(stddev, 0.06) << mix << " " << t.name;
        EXPECT_LT(std::fabs(mean), 0.01) << mix << " " << t.name;
      } else if (t.name.find("norm") != std::string::npos) {
        EXPECT_NEAR(mean, 1.0, 0.01) << t.name;
      }
    }
  }
}

TEST(SyntheticTest, SynthFileEqualsInMemoryModel) {
  const std::string path = test::temp_dir() + "/tiny.gguf";
  auto r = test::run_cli({"synth", "tiny-qwen2:Q5_K_M", "-o", path, "--seed", "9"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto file = gguf::GgufFile::open(path);
  auto memory = open_model_file("synthetic:tiny-qwen2:Q5_K_M:9");
  ASSERT_EQ(file->tensors().size(), memory->tensors().size());
  for (size_t i = 0; i < file->tensors().size(); ++i) {
    const auto& a = file->tensors()[i];
    const auto& b = memory->tensors()[i];
    EXPECT_EQ(a.name, b.name);
    EXPECT_EQ(a.type, b.type);
    ASSERT_EQ(a.n_bytes, b.n_bytes);
    EXPECT_EQ(0, std::memcmp(a.data, b.data, a.n_bytes)) << a.name;
  }
  EXPECT_EQ(file->metadata().size(), memory->metadata().size());
  // inspect reads both
  EXPECT_EQ(test::run_cli({"inspect", path}).exit_code, 0);
  auto j = test::run_cli({"inspect", "synthetic:qwen3-32b:Q4_K_M", "--json"});
  EXPECT_EQ(j.exit_code, 0);
  EXPECT_NE(j.out.find("blk.63.ffn_down.weight"), std::string::npos);
}

TEST(SyntheticTest, CarriesAGgufVocabulary) {
  ROOFLINE_SHARED_PATH_OR_SKIP(xz, "testdata/tokenizer/gguf-vocabs/ggml-vocab-gpt-2.gguf.xz");
  const std::string vocab = test::unxz_to_temp(xz);
  auto spec = parse_synthetic_spec("tiny-qwen3:Q8_0");
  spec.tokenizer_path = vocab;
  spec.shape.n_vocab = 50304;  // gpt-2's 50257 tokens padded up
  auto layout = synthetic_layout(spec);
  const auto& tokens = layout.metadata.find("tokenizer.ggml.tokens")->as_string_array();
  ASSERT_EQ(tokens.size(), 50304u);
  EXPECT_EQ(tokens[50303], "[PAD50303]");
  EXPECT_EQ(layout.metadata.get_string("tokenizer.ggml.model"), "gpt2");
  spec.shape.n_vocab = 1000;  // too small for the vocabulary
  EXPECT_THROW(synthetic_layout(spec), Error);
}

// Qwen3.5-27B: llama.cpp's Q4_K_M of that shape has 851 tensors; DeltaNet and attention layers hold
// their own tables; types as its quantizer gives them (../shared/reference/model-configs.md).
TEST(SyntheticTest, Qwen35_27bLayout) {
  auto layout = synthetic_layout(parse_synthetic_spec("qwen3.5-27b:Q4_K_M"));
  const auto& md = layout.metadata;
  EXPECT_EQ(md.get_int("qwen35.ssm.inner_size"), 6144);
  EXPECT_EQ(md.get_int("qwen35.rope.dimension_count"), 64);
  EXPECT_EQ(md.get_int("qwen35.full_attention_interval"), 4);
  std::map<std::string, const gguf::TensorInfo*> by_name;
  std::map<std::string, int> count_by_type;  // "attn_qkv q6_K" -> n
  for (const auto& t : layout.tensors) {
    by_name[t.name] = &t;
    const size_t dot = t.name.find('.', 4);
    const std::string base = t.name.rfind("blk.", 0) == 0 ? t.name.substr(dot + 1) : t.name;
    count_by_type[base + " " + dtype_name(t.type)]++;
  }
  EXPECT_EQ(layout.tensors.size(), 851u);
  EXPECT_EQ(by_name["blk.0.attn_qkv.weight"]->ne[1], 10240);
  EXPECT_EQ(by_name["blk.0.ssm_conv1d.weight"]->ne[0], 4);
  EXPECT_EQ(by_name["blk.0.ssm_conv1d.weight"]->type, DType::F32);
  EXPECT_EQ(by_name["blk.3.attn_q.weight"]->ne[1], 2 * 24 * 256) << "query and gate";
  EXPECT_EQ(by_name.count("blk.3.attn_qkv.weight"), 0u);
  EXPECT_EQ(by_name.count("blk.0.attn_q.weight"), 0u);
  EXPECT_EQ(count_by_type["attn_qkv.weight Q6_K"], 24);
  EXPECT_EQ(count_by_type["attn_qkv.weight Q4_K"], 24);
  EXPECT_EQ(count_by_type["attn_v.weight Q6_K"], 8);
  EXPECT_EQ(count_by_type["ffn_down.weight Q6_K"], 32);
  EXPECT_EQ(count_by_type["ssm_out.weight Q4_K"], 48);
  EXPECT_EQ(count_by_type["output.weight Q6_K"], 1);
  EXPECT_EQ(count_by_type["token_embd.weight Q4_K"], 1);
}

// A qwen35 file with a missing or mis-shaped tensor, or a missing key, is refused in one line naming it.
TEST(SyntheticTest, Qwen35BadFilesNameTheProblem) {
  auto good = open_model_file("synthetic:tiny-qwen35:Q8_0");
  auto remake = [&](auto edit_md, auto edit_tensors) {
    gguf::Metadata md = good->metadata();
    std::vector<gguf::TensorInfo> tensors = good->tensors();
    edit_md(md);
    edit_tensors(tensors);
    return gguf::GgufFile::from_parts("bad.gguf", std::move(md), std::move(tensors), nullptr, good->alignment());
  };
  auto message = [](std::shared_ptr<gguf::GgufFile> f) {
    try {
      Model::load(f);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(loaded)");
  };
  const auto none = [](auto&) {};
  std::string m = message(remake(none, [](std::vector<gguf::TensorInfo>& t) {
    t.erase(std::find_if(t.begin(), t.end(), [](const auto& x) { return x.name == "blk.0.ssm_a"; }));
  }));
  EXPECT_NE(m.find("missing blk.0.ssm_a"), std::string::npos) << m;
  EXPECT_EQ(m.find('\n'), std::string::npos);
  m = message(remake(none, [](std::vector<gguf::TensorInfo>& t) {
    for (auto& x : t)
      if (x.name == "blk.1.attn_q.weight") x.ne[1] /= 2;
  }));
  EXPECT_NE(m.find("blk.1.attn_q.weight has shape"), std::string::npos) << m;
  m = message(remake([](gguf::Metadata& md) { md.erase("qwen35.ssm.state_size"); }, none));
  EXPECT_NE(m.find("qwen35.ssm.state_size"), std::string::npos) << m;
  m = message(remake([](gguf::Metadata& md) { md.set("qwen35.ssm.time_step_rank", gguf::Value::u32(3)); }, none));
  EXPECT_NE(m.find("time_step_rank"), std::string::npos) << m;
}
