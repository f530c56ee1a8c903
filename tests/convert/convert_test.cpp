// The converter on small synthetic Hugging Face folders: tensor names, shapes, types and values per
// --outtype, llama's Q/K permutation (and its round trip), metadata keys, rope scaling, tied embeddings,
// qwen2 biases and qwen3 q/k norms, f16 saturation, and the stories260K llama2.c checkpoint.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "convert/convert.h"
#include "convert_test_util.h"
#include "core/error.h"
#include "formats/gguf.h"
#include "formats/llama2c.h"
#include "formats/quant_ref.h"
#include "model/model.h"
#include "model/synthetic.h"
#include "test_util.h"

using namespace roofline;
namespace fs = std::filesystem;

namespace {

std::vector<float> gguf_f32(const gguf::TensorInfo& t) {
  std::vector<float> v((size_t)t.n_elements());
  dequantize_rows_ref(t.type, t.data, v.data(), t.n_rows(), t.row_length());
  return v;
}

std::shared_ptr<gguf::GgufFile> convert_dir(const std::string& dir, const std::string& outtype, std::string* out_path = nullptr,
                                            convert::ConvertResult* result = nullptr) {
  convert::ConvertOptions o;
  o.source = dir;
  o.output = dir + "/out-" + outtype + ".gguf";
  o.outtype = outtype;
  o.n_threads = 2;
  o.progress = false;
  auto r = convert::convert_model(o);
  if (result) *result = r;
  if (out_path) *out_path = o.output;
  return gguf::GgufFile::open(o.output);
}

const test::StTensor& find(const std::vector<test::StTensor>& ts, const std::string& name) {
  for (const auto& t : ts)
    if (t.name == name) return t;
  throw std::runtime_error("no " + name);
}

}  // namespace

TEST(ConvertTest, PermutationRoundTripAndLayout) {
  // 2 heads of head_dim 4, rows of length 3: HF row (h, half, i) -> GGUF row (h, 2i + half).
  const int64_t heads = 2, hd = 4, row = 3;
  std::vector<float> src(heads * hd * row), dst(src.size()), back(src.size());
  for (size_t i = 0; i < src.size(); ++i) src[i] = (float)i;
  convert::permute_qk_rows(src.data(), dst.data(), heads, hd, row);
  // head 0: HF rows 0,1 (first half), 2,3 (second half) -> GGUF order 0,2,1,3
  const int order[8] = {0, 2, 1, 3, 4, 6, 5, 7};
  for (int r = 0; r < 8; ++r)
    for (int c = 0; c < row; ++c) EXPECT_EQ(dst[r * row + c], src[order[r] * row + c]) << r;
  convert::unpermute_qk_rows(dst.data(), back.data(), heads, hd, row);
  EXPECT_EQ(back, src);
  // Larger random round trip (bias-shaped: row length 1).
  std::vector<float> b = test::test_values(8 * 64, 3), pb(b.size()), bb(b.size());
  convert::permute_qk_rows(b.data(), pb.data(), 8, 64, 1);
  EXPECT_NE(pb, b);
  convert::unpermute_qk_rows(pb.data(), bb.data(), 8, 64, 1);
  EXPECT_EQ(bb, b);
}

TEST(ConvertTest, TypeRulesAndF16Saturation) {
  std::string note;
  EXPECT_EQ(convert::tensor_type_for("blk.0.attn_norm.weight", 1, 64, DType::F16, &note), DType::F32);
  EXPECT_EQ(convert::tensor_type_for("blk.0.attn_q_norm.weight", 1, 64, DType::Q8_0, &note), DType::F32);
  EXPECT_EQ(convert::tensor_type_for("blk.0.attn_q.bias", 1, 64, DType::BF16, &note), DType::F32);
  EXPECT_EQ(convert::tensor_type_for("blk.0.attn_q.weight", 2, 64, DType::BF16, &note), DType::BF16);
  EXPECT_TRUE(note.empty());
  EXPECT_EQ(convert::tensor_type_for("blk.0.ffn_down.weight", 2, 80, DType::Q8_0, &note), DType::F16);
  EXPECT_NE(note.find("not a multiple of 32"), std::string::npos);
  EXPECT_EQ(convert::tensor_type_for("token_embd.weight", 2, 96, DType::Q8_0, nullptr), DType::Q8_0);
  EXPECT_FALSE(convert::parse_outtype("auto").has_value());
  EXPECT_EQ(*convert::parse_outtype("Q8_0"), DType::Q8_0);
  EXPECT_THROW(convert::parse_outtype("q4_k"), Error);
  EXPECT_EQ(convert::file_type_for(DType::BF16), 32u);

  const std::vector<float> x = {1e5f, -7e4f, 65504.0f, 65519.0f, 65520.0f, 1e-9f, 0.0f, -3.0f};
  std::vector<uint8_t> out(x.size() * 2);
  int64_t sat = 0, flushed = 0;
  convert::convert_values(x.data(), (int64_t)x.size(), (int64_t)x.size(), DType::F16, out.data(), &sat, &flushed);
  EXPECT_EQ(sat, 3);      // 1e5, -7e4, 65520 (which rounds to inf)
  EXPECT_EQ(flushed, 1);  // 1e-9
  auto h = [&](int i) { return fp16_to_f32((uint16_t)(out[2 * i] | (out[2 * i + 1] << 8))); };
  EXPECT_EQ(h(0), 65504.0f);
  EXPECT_EQ(h(1), -65504.0f);
  EXPECT_EQ(h(2), 65504.0f);
  EXPECT_EQ(h(3), 65504.0f);
  EXPECT_EQ(h(4), 65504.0f);
  EXPECT_EQ(h(7), -3.0f);
}

TEST(ConvertTest, LlamaFolderEveryOuttype) {
  const std::string dir = test::temp_dir() + "/llama";
  test::SynthHf s;
  const auto src = test::synth_tensors(s);
  test::write_synth_hf(dir, s, src);
  for (const std::string outtype : {"f32", "f16", "bf16", "q8_0"}) {
    SCOPED_TRACE(outtype);
    convert::ConvertResult r;
    auto f = convert_dir(dir, outtype, nullptr, &r);
    const DType want = *convert::parse_outtype(outtype);
    EXPECT_EQ(r.arch, "llama");
    const auto& md = f->metadata();
    EXPECT_EQ(md.get_string("general.architecture"), "llama");
    EXPECT_EQ(md.get_string("general.name"), "llama");
    EXPECT_EQ(md.get_int("general.file_type"), convert::file_type_for(want));
    EXPECT_EQ(md.get_int("general.quantization_version"), 2);
    EXPECT_EQ(md.get_int("llama.context_length"), 1024);
    EXPECT_EQ(md.get_int("llama.embedding_length"), 64);
    EXPECT_EQ(md.get_int("llama.block_count"), 2);
    EXPECT_EQ(md.get_int("llama.feed_forward_length"), 80);
    EXPECT_EQ(md.get_int("llama.attention.head_count"), 4);
    EXPECT_EQ(md.get_int("llama.attention.head_count_kv"), 2);
    EXPECT_EQ(md.get_int("llama.attention.key_length"), 16);
    EXPECT_EQ(md.get_int("llama.attention.value_length"), 16);
    EXPECT_EQ(md.get_int("llama.rope.dimension_count"), 16);
    EXPECT_EQ(md.get_int("llama.vocab_size"), 300);
    EXPECT_FLOAT_EQ((float)md.get_float("llama.rope.freq_base"), 10000.0f);
    EXPECT_FLOAT_EQ((float)md.get_float("llama.attention.layer_norm_rms_epsilon"), 1e-5f);
    EXPECT_EQ(md.get_string("tokenizer.ggml.model"), "gpt2");
    EXPECT_EQ(md.get_string("tokenizer.ggml.pre"), "gpt2");
    EXPECT_EQ(md.find("tokenizer.ggml.tokens")->array_size(), 300u);  // padded to the embedding rows
    EXPECT_TRUE(md.contains("tokenizer.chat_template"));
    EXPECT_FALSE(md.contains("llama.rope.scaling.type"));

    EXPECT_EQ(f->tensors().size(), 1 + 2 * 9 + 2u);
    EXPECT_EQ(f->tensor("token_embd.weight").shape_string(), "[64, 300]");
    EXPECT_EQ(f->tensor("output.weight").shape_string(), "[64, 300]");
    EXPECT_EQ(f->tensor("blk.1.attn_q.weight").shape_string(), "[64, 64]");
    EXPECT_EQ(f->tensor("blk.1.attn_k.weight").shape_string(), "[64, 32]");
    EXPECT_EQ(f->tensor("blk.1.attn_output.weight").shape_string(), "[64, 64]");
    EXPECT_EQ(f->tensor("blk.1.ffn_gate.weight").shape_string(), "[64, 80]");
    EXPECT_EQ(f->tensor("blk.1.ffn_down.weight").shape_string(), "[80, 64]");
    EXPECT_EQ(f->tensor("blk.0.attn_norm.weight").type, DType::F32);
    EXPECT_EQ(f->tensor("output_norm.weight").type, DType::F32);
    EXPECT_EQ(f->tensor("blk.0.attn_q.weight").type, want);
    EXPECT_EQ(f->tensor("token_embd.weight").type, want);
    // ffn_down rows are 80 long: Q8_0 falls back to F16 as llama.cpp's converter does.
    EXPECT_EQ(f->tensor("blk.0.ffn_down.weight").type, want == DType::Q8_0 ? DType::F16 : want);
    if (want == DType::Q8_0) EXPECT_FALSE(r.notes.empty());

    // Values: Q/K permuted (GGUF row r = HF row of unpermute), everything else as is.
    const auto& q_src = find(src, "model.layers.1.self_attn.q_proj.weight").values;
    const auto& k_src = find(src, "model.layers.1.self_attn.k_proj.weight").values;
    std::vector<float> q_perm(q_src.size()), k_perm(k_src.size());
    convert::permute_qk_rows(q_src.data(), q_perm.data(), 4, 16, 64);
    convert::permute_qk_rows(k_src.data(), k_perm.data(), 2, 16, 64);
    const double tol = want == DType::F32 ? 0 : (want == DType::Q8_0 ? 0.01 : (want == DType::F16 ? 5e-4 : 4e-3));
    auto close = [&](const std::vector<float>& got, const std::vector<float>& exp, const char* what) {
      ASSERT_EQ(got.size(), exp.size()) << what;
      EXPECT_LE(test::max_abs_diff(got.data(), exp.data(), got.size()), tol) << what;
    };
    close(gguf_f32(f->tensor("blk.1.attn_q.weight")), q_perm, "attn_q");
    close(gguf_f32(f->tensor("blk.1.attn_k.weight")), k_perm, "attn_k");
    close(gguf_f32(f->tensor("blk.1.attn_v.weight")), find(src, "model.layers.1.self_attn.v_proj.weight").values, "attn_v");
    close(gguf_f32(f->tensor("blk.0.ffn_down.weight")), find(src, "model.layers.0.mlp.down_proj.weight").values, "ffn_down");
    close(gguf_f32(f->tensor("output.weight")), find(src, "lm_head.weight").values, "output");
    const auto norm = gguf_f32(f->tensor("blk.0.ffn_norm.weight"));
    EXPECT_EQ(norm, find(src, "model.layers.0.post_attention_layernorm.weight").values);
    // The model loader accepts it.
    EXPECT_NO_THROW(Model::load(f));
  }
}

TEST(ConvertTest, AutoOuttypeFollowsTheSource) {
  for (const std::string dtype : {"F16", "BF16", "F32"}) {
    const std::string dir = test::temp_dir() + "/auto-" + dtype;
    test::SynthHf s;
    s.dtype = dtype;
    test::write_synth_hf(dir, s);
    convert::ConvertResult r;
    auto f = convert_dir(dir, "auto", nullptr, &r);
    const DType want = dtype == "F16" ? DType::F16 : DType::BF16;  // llama.cpp's auto: f16 for f16, else bf16
    EXPECT_EQ(f->tensor("blk.0.attn_q.weight").type, want) << dtype;
    EXPECT_EQ(r.outtype, dtype_name(want));
  }
}

TEST(ConvertTest, Bf16ToF16SaturatesAndCounts) {
  const std::string dir = test::temp_dir() + "/bf16big";
  test::SynthHf s;
  s.dtype = "BF16";
  auto ts = test::synth_tensors(s);
  for (auto& t : ts)
    if (t.name == "model.layers.0.mlp.up_proj.weight") {
      t.values[0] = 1e6f;
      t.values[5] = -3e5f;
      t.values[7] = 70000.0f;
    }
  test::write_synth_hf(dir, s, ts);
  convert::ConvertResult r;
  auto f = convert_dir(dir, "f16", nullptr, &r);
  EXPECT_EQ(r.f16_saturated, 3);
  ASSERT_EQ(r.notes.size(), 1u);
  EXPECT_NE(r.notes[0].find("blk.0.ffn_up.weight: 3 values"), std::string::npos) << r.notes[0];
  const auto up = gguf_f32(f->tensor("blk.0.ffn_up.weight"));
  EXPECT_EQ(up[0], 65504.0f);
  EXPECT_EQ(up[5], -65504.0f);
  for (float v : up) EXPECT_TRUE(std::isfinite(v));
  // The CLI says so on stderr.
  auto res = test::run_cli({"convert", dir, "-o", dir + "/cli.gguf", "--outtype", "f16"});
  EXPECT_EQ(res.exit_code, 0) << res.err;
  EXPECT_NE(res.err.find("3 values beyond the f16 range"), std::string::npos) << res.err;
}

TEST(ConvertTest, Llama3RopeFactorsAndLinearScaling) {
  const std::string dir = test::temp_dir() + "/llama3";
  test::SynthHf s;
  s.tied = true;
  s.extra_config = {{"rope_theta", 500000.0},
                    {"rope_scaling",
                     {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                      {"original_max_position_embeddings", 64}}}};
  test::write_synth_hf(dir, s);
  auto f = convert_dir(dir, "f32");
  const auto& rf = f->tensor("rope_freqs.weight");
  EXPECT_EQ(rf.type, DType::F32);
  EXPECT_EQ(rf.shape_string(), "[8]");
  const auto want = llama3_rope_factors(16, 500000.0f, 8.0f, 1.0f, 4.0f, 64);
  EXPECT_EQ(gguf_f32(rf), want);
  EXPECT_EQ(want.front(), 1.0f);
  EXPECT_EQ(want.back(), 8.0f);
  EXPECT_EQ(f->find_tensor("output.weight"), nullptr);  // tied
  EXPECT_NO_THROW(Model::load(f));

  // transformers 5's rope_parameters form, linear scaling.
  const std::string dir2 = test::temp_dir() + "/linear";
  s.tied = false;
  s.extra_config = {{"rope_theta", nullptr},
                    {"rope_parameters", {{"rope_type", "linear"}, {"factor", 2.0}, {"rope_theta", 1000000.0}}}};
  test::write_synth_hf(dir2, s);
  auto f2 = convert_dir(dir2, "f32");
  EXPECT_EQ(f2->metadata().get_string("llama.rope.scaling.type"), "linear");
  EXPECT_FLOAT_EQ((float)f2->metadata().get_float("llama.rope.scaling.factor"), 2.0f);
  EXPECT_FLOAT_EQ((float)f2->metadata().get_float("llama.rope.freq_base"), 1e6f);
  EXPECT_EQ(f2->find_tensor("rope_freqs.weight"), nullptr);
  auto m = Model::load(f2);
  EXPECT_FLOAT_EQ(m->hparams().rope_freq_scale, 0.5f);
}

TEST(ConvertTest, Qwen2BiasesAndQwen3Norms) {
  {
    const std::string dir = test::temp_dir() + "/qwen2";
    test::SynthHf s;
    s.hf_class = "Qwen2ForCausalLM";
    s.tied = true;
    const auto src = test::synth_tensors(s);
    test::write_synth_hf(dir, s, src);
    auto f = convert_dir(dir, "f16");
    EXPECT_EQ(f->metadata().get_string("general.architecture"), "qwen2");
    EXPECT_FALSE(f->metadata().contains("qwen2.rope.dimension_count"));
    EXPECT_FALSE(f->metadata().contains("qwen2.vocab_size"));
    const auto& bq = f->tensor("blk.1.attn_q.bias");
    EXPECT_EQ(bq.type, DType::F32);
    EXPECT_EQ(bq.shape_string(), "[64]");
    EXPECT_EQ(gguf_f32(bq), find(src, "model.layers.1.self_attn.q_proj.bias").values);  // not permuted
    EXPECT_EQ(f->tensor("blk.0.attn_v.bias").shape_string(), "[32]");
    EXPECT_EQ(f->find_tensor("output.weight"), nullptr);
    // Q is not permuted for qwen2.
    const auto q = gguf_f32(f->tensor("blk.0.attn_q.weight"));
    const auto& qs = find(src, "model.layers.0.self_attn.q_proj.weight").values;
    EXPECT_LE(test::max_abs_diff(q.data(), qs.data(), q.size()), 5e-4);
    EXPECT_NO_THROW(Model::load(f));
  }
  {
    const std::string dir = test::temp_dir() + "/qwen3";
    test::SynthHf s;
    s.hf_class = "Qwen3ForCausalLM";
    s.head_dim = 32;  // q_dim 128 != hidden 64
    const auto src = test::synth_tensors(s);
    test::write_synth_hf(dir, s, src);
    auto f = convert_dir(dir, "q8_0");
    EXPECT_EQ(f->metadata().get_string("general.architecture"), "qwen3");
    EXPECT_EQ(f->metadata().get_int("qwen3.attention.key_length"), 32);
    EXPECT_EQ(f->tensor("blk.0.attn_q.weight").shape_string(), "[64, 128]");
    EXPECT_EQ(f->tensor("blk.0.attn_output.weight").shape_string(), "[128, 64]");
    const auto& qn = f->tensor("blk.1.attn_q_norm.weight");
    EXPECT_EQ(qn.type, DType::F32);
    EXPECT_EQ(qn.shape_string(), "[32]");
    EXPECT_EQ(gguf_f32(qn), find(src, "model.layers.1.self_attn.q_norm.weight").values);
    EXPECT_EQ(f->tensor("blk.1.attn_k.weight").type, DType::Q8_0);
    EXPECT_NO_THROW(Model::load(f));
  }
}

TEST(ConvertTest, Stories260KConverts) {
  ROOFLINE_SHARED_PATH_OR_SKIP(dir, "testdata/models/stories260K");
  convert::ConvertOptions o;
  o.source = dir + "/stories260K.bin";
  o.tokenizer = dir + "/tok512.bin";
  o.output = test::temp_dir() + "/stories.gguf";
  o.progress = false;
  auto r = convert::convert_model(o);
  EXPECT_EQ(r.outtype, "F32");
  EXPECT_EQ(r.n_tensors, 1u + 5 * 9 + 1);
  EXPECT_EQ(r.n_params, 264128u - 2 * 512 * 4);  // everything but the RoPE tables
  auto f = gguf::GgufFile::open(o.output);
  EXPECT_EQ(f->metadata().get_int("llama.rope.dimension_count"), 8);
  EXPECT_EQ(f->metadata().get_int("llama.attention.head_count_kv"), 4);
  EXPECT_EQ(f->metadata().get_int("llama.context_length"), 512);
  EXPECT_EQ(f->metadata().get_string("tokenizer.ggml.model"), "llama");
  EXPECT_EQ(f->tensor("blk.4.attn_k.weight").shape_string(), "[64, 32]");
  EXPECT_EQ(f->tensor("blk.4.ffn_down.weight").shape_string(), "[172, 64]");
  EXPECT_EQ(f->find_tensor("output.weight"), nullptr);
  auto ck = llama2c::Checkpoint::open(o.source);
  const auto wq = ck->layer("wq", 2);
  const auto got = gguf_f32(f->tensor("blk.2.attn_q.weight"));
  EXPECT_EQ(0, std::memcmp(got.data(), wq.data, got.size() * 4));  // not permuted, bit-exact
  EXPECT_NO_THROW(Model::load(f));
  // q8_0: ffn rows of 172 fall back to F16.
  o.outtype = "q8_0";
  o.output = test::temp_dir() + "/stories-q8.gguf";
  convert::convert_model(o);
  auto q = gguf::GgufFile::open(o.output);
  EXPECT_EQ(q->tensor("blk.0.attn_q.weight").type, DType::Q8_0);
  EXPECT_EQ(q->tensor("blk.0.ffn_down.weight").type, DType::F16);
  EXPECT_EQ(q->tensor("blk.0.ffn_up.weight").type, DType::Q8_0);
}

TEST(ConvertTest, ChunkedConversionIsIdenticalAndLlamaBiasesArePermuted) {
  const std::string dir = test::temp_dir() + "/llama-bias";
  test::SynthHf s;
  s.extra_config = {{"attention_bias", true}};
  auto ts = test::synth_tensors(s);
  std::vector<test::StTensor> with_bias;
  for (auto& t : ts) {
    with_bias.push_back(t);
    const std::string& n = t.name;
    for (const char* proj : {"q_proj", "k_proj", "v_proj"})
      if (n.size() > 14 && n.substr(n.size() - 13) == std::string(proj) + ".weight")
        with_bias.push_back({n.substr(0, n.size() - 6) + "bias", "F32", {t.shape[0]}, test::test_values((size_t)t.shape[0], 77)});
  }
  test::write_synth_hf(dir, s, with_bias);
  for (const std::string outtype : {"f32", "q8_0"}) {
    std::string whole, chunked;
    convert_dir(dir, outtype, &whole);
    convert::ConvertOptions o;
    o.source = dir;
    o.output = dir + "/chunked-" + outtype + ".gguf";
    o.outtype = outtype;
    o.progress = false;
    o.chunk_elements = 100;  // one row per step for every matrix
    convert::convert_model(o);
    std::ifstream a(whole, std::ios::binary), b(o.output, std::ios::binary);
    const std::string ba((std::istreambuf_iterator<char>(a)), {}), bb((std::istreambuf_iterator<char>(b)), {});
    EXPECT_EQ(ba, bb) << outtype;
  }
  auto f = gguf::GgufFile::open(dir + "/out-f32.gguf");
  const auto& qb = find(with_bias, "model.layers.1.self_attn.q_proj.bias").values;
  const auto& kb = find(with_bias, "model.layers.1.self_attn.k_proj.bias").values;
  std::vector<float> qp(qb.size()), kp(kb.size());
  convert::permute_qk_rows(qb.data(), qp.data(), 4, 16, 1);
  convert::permute_qk_rows(kb.data(), kp.data(), 2, 16, 1);
  EXPECT_EQ(gguf_f32(f->tensor("blk.1.attn_q.bias")), qp);
  EXPECT_EQ(gguf_f32(f->tensor("blk.1.attn_k.bias")), kp);
  EXPECT_EQ(gguf_f32(f->tensor("blk.1.attn_v.bias")), find(with_bias, "model.layers.1.self_attn.v_proj.bias").values);
  EXPECT_NO_THROW(Model::load(f));
}
