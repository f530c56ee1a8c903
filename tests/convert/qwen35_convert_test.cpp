// Qwen3.5 conversion on tiny synthetic checkpoints: every tensor's name, order, shape, type and values
// against an independent reference of llama.cpp's conversion written here (name table, the V-head
// reorder as a scatter, +1 / -exp, f16 arithmetic for f16 sources), for both HF classes, f32/bf16/f16
// sources, shards, the MTP block and the vision tower; the metadata keys in order with their types.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>

#include "convert/convert.h"
#include "convert/convert_hf_util.h"
#include "core/error.h"
#include "core/fp16.h"
#include "engine/engine.h"
#include "engine/mtp_drafter.h"
#include "engine/speculative.h"
#include "formats/gguf.h"
#include "formats/quant_ref.h"
#include "qwen35_test_util.h"
#include "test_util.h"

using namespace roofline;
namespace fs = std::filesystem;

namespace {

bool ends_with(const std::string& s, const std::string& p) {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}
bool starts_with(const std::string& s, const std::string& p) { return s.rfind(p, 0) == 0; }

struct RefTensor {
  std::string name;
  std::vector<int64_t> ne;  // innermost first
  DType type;
  std::vector<float> values;
};

// The value a source element has once stored in the file.
float stored(const std::string& dtype, float v) {
  if (dtype == "BF16") return bf16_to_f32(f32_to_bf16(v));
  if (dtype == "F16") return round_to_fp16(v);
  return v;
}

// llama.cpp's name for an HF tensor ("" when skipped), after its renames, and the renamed HF name.
std::string ref_name(const std::string& hf, int n_layer, std::string* renamed) {
  if (hf.find("visual.") != std::string::npos) return "";
  std::string n = hf;
  if (starts_with(n, "model.language_model.")) n = "model." + n.substr(21);
  const std::string L = std::to_string(n_layer);
  const std::map<std::string, std::string> mtp_globals = {{"mtp.fc.weight", "model.layers." + L + ".eh_proj.weight"},
                                                          {"mtp.pre_fc_norm_embedding.weight", "model.layers." + L + ".enorm.weight"},
                                                          {"mtp.pre_fc_norm_hidden.weight", "model.layers." + L + ".hnorm.weight"},
                                                          {"mtp.norm.weight", "model.layers." + L + ".shared_head.norm.weight"}};
  if (mtp_globals.count(n)) n = mtp_globals.at(n);
  if (starts_with(n, "mtp.layers.")) {
    const size_t dot = n.find('.', 11);
    n = "model.layers." + std::to_string(n_layer + std::stoi(n.substr(11, dot - 11))) + n.substr(dot);
  }
  *renamed = n;
  if (n == "model.embed_tokens.weight") return "token_embd.weight";
  if (n == "model.norm.weight") return "output_norm.weight";
  if (n == "lm_head.weight") return "output.weight";
  const size_t dot = n.find('.', 13);
  const std::string blk = "blk." + n.substr(13, dot - 13) + ".", rest = n.substr(dot + 1);
  const std::map<std::string, std::string> table = {
      {"input_layernorm.weight", "attn_norm.weight"},
      {"post_attention_layernorm.weight", "post_attention_norm.weight"},
      {"mlp.gate_proj.weight", "ffn_gate.weight"},
      {"mlp.up_proj.weight", "ffn_up.weight"},
      {"mlp.down_proj.weight", "ffn_down.weight"},
      {"self_attn.q_proj.weight", "attn_q.weight"},
      {"self_attn.k_proj.weight", "attn_k.weight"},
      {"self_attn.v_proj.weight", "attn_v.weight"},
      {"self_attn.o_proj.weight", "attn_output.weight"},
      {"self_attn.q_norm.weight", "attn_q_norm.weight"},
      {"self_attn.k_norm.weight", "attn_k_norm.weight"},
      {"linear_attn.in_proj_qkv.weight", "attn_qkv.weight"},
      {"linear_attn.in_proj_z.weight", "attn_gate.weight"},
      {"linear_attn.in_proj_b.weight", "ssm_beta.weight"},
      {"linear_attn.in_proj_a.weight", "ssm_alpha.weight"},
      {"linear_attn.conv1d.weight", "ssm_conv1d.weight"},
      {"linear_attn.dt_bias", "ssm_dt.bias"},
      {"linear_attn.A_log", "ssm_a"},
      {"linear_attn.norm.weight", "ssm_norm.weight"},
      {"linear_attn.out_proj.weight", "ssm_out.weight"},
      {"eh_proj.weight", "nextn.eh_proj.weight"},
      {"enorm.weight", "nextn.enorm.weight"},
      {"hnorm.weight", "nextn.hnorm.weight"},
      {"shared_head.norm.weight", "nextn.shared_head_norm.weight"},
  };
  return blk + table.at(rest);
}

// Grouped -> tiled V heads, written as a scatter: grouped head k*per_k + r goes to tiled head r*n_k + k.
std::vector<float> tile_v(const std::vector<float>& x, int64_t first, int64_t n_k, int64_t n_v, int64_t unit) {
  std::vector<float> out = x;
  const int64_t per_k = n_v / n_k;
  for (int64_t k = 0; k < n_k; ++k)
    for (int64_t r = 0; r < per_k; ++r)
      for (int64_t u = 0; u < unit; ++u) out[first + (r * n_k + k) * unit + u] = x[first + (k * per_k + r) * unit + u];
  return out;
}

// What llama.cpp writes for the synthetic folder, in its order.
std::vector<RefTensor> reference(const test::SynthQ35& s, const std::vector<test::StTensor>& src, DType outtype, bool with_mtp = true) {
  std::vector<RefTensor> out;
  const auto shards = test::q35_shards(s, src);  // std::map: files sorted
  for (const auto& [file, ts] : shards) {
    std::vector<test::StTensor> sorted = ts;
    std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
    for (const auto& t : sorted) {
      std::string renamed;
      const std::string name = ref_name(t.name, s.layers, &renamed);
      if (name.empty() || (!with_mtp && starts_with(t.name, "mtp."))) continue;
      RefTensor r{name, {}, DType::F32, {}};
      for (float v : t.values) r.values.push_back(stored(s.dtype, v));
      std::vector<int64_t> shape = t.shape;
      if (ends_with(name, "ssm_conv1d.weight")) shape.erase(std::remove(shape.begin(), shape.end(), 1), shape.end());
      r.ne.assign(shape.rbegin(), shape.rend());
      // V-head reorder (linear attention, when the head counts differ).
      if (s.n_k != s.n_v && renamed.find("linear_attn.") != std::string::npos) {
        const int64_t key2 = 2LL * s.k_dim * s.n_k;
        if (ends_with(name, "attn_qkv.weight")) r.values = tile_v(r.values, key2 * s.hidden, s.n_k, s.n_v, s.v_dim * s.hidden);
        if (ends_with(name, "attn_gate.weight")) r.values = tile_v(r.values, 0, s.n_k, s.n_v, s.v_dim * s.hidden);
        if (ends_with(name, "ssm_beta.weight") || ends_with(name, "ssm_alpha.weight"))
          r.values = tile_v(r.values, 0, s.n_k, s.n_v, s.hidden);
        if (ends_with(name, "ssm_conv1d.weight")) r.values = tile_v(r.values, key2 * s.conv, s.n_k, s.n_v, s.v_dim * s.conv);
        if (ends_with(name, "ssm_dt.bias") || ends_with(name, "ssm_a")) r.values = tile_v(r.values, 0, s.n_k, s.n_v, 1);
        if (ends_with(name, "ssm_out.weight")) {  // columns, row by row
          const int64_t cols = (int64_t)s.v_dim * s.n_v;
          for (int64_t row = 0; row < s.hidden; ++row) {
            std::vector<float> one(r.values.begin() + row * cols, r.values.begin() + (row + 1) * cols);
            one = tile_v(one, 0, s.n_k, s.n_v, s.v_dim);
            std::copy(one.begin(), one.end(), r.values.begin() + row * cols);
          }
        }
      }
      // Elementwise: f16 sources stay f16 in llama.cpp's arithmetic.
      const bool plus_one = ends_with(renamed, "norm.weight") && !ends_with(renamed, "linear_attn.norm.weight");
      for (float& v : r.values) {
        if (plus_one) v = s.dtype == "F16" ? round_to_fp16(v + 1.0f) : v + 1.0f;
        if (ends_with(name, "ssm_a")) v = -(s.dtype == "F16" ? round_to_fp16(std::exp(v)) : std::exp(v));
      }
      const bool f32 = r.ne.size() == 1 || ends_with(name, "_norm.weight") || ends_with(name, "ssm_conv1d.weight") ||
                       !ends_with(name, ".weight");
      r.type = f32 ? DType::F32 : outtype;
      out.push_back(std::move(r));
    }
  }
  return out;
}

std::vector<float> gguf_values(const gguf::TensorInfo& t) {
  std::vector<float> v((size_t)t.n_elements());
  dequantize_rows_ref(t.type, t.data, v.data(), t.n_rows(), t.row_length());
  return v;
}

float as_stored(DType type, float v) {
  if (type == DType::BF16) return bf16_to_f32(f32_to_bf16(v));
  if (type == DType::F16) return round_to_fp16(v);
  return v;
}

std::shared_ptr<gguf::GgufFile> convert_q35(const std::string& dir, const std::string& outtype, convert::ConvertResult* result = nullptr,
                                        bool no_mtp = false) {
  convert::ConvertOptions o;
  o.source = dir;
  o.output = dir + "/out-" + outtype + (no_mtp ? "-nomtp" : "") + ".gguf";
  o.outtype = outtype;
  o.n_threads = 2;
  o.progress = false;
  o.no_mtp = no_mtp;
  const auto r = convert::convert_model(o);
  if (result) *result = r;
  return gguf::GgufFile::open(o.output);
}

// Every tensor, in order, bit for bit.
void expect_tensors(const gguf::GgufFile& f, const std::vector<RefTensor>& want) {
  ASSERT_EQ(f.tensors().size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    const gguf::TensorInfo& t = f.tensors()[i];
    const RefTensor& w = want[i];
    SCOPED_TRACE(w.name);
    ASSERT_EQ(t.name, w.name) << "tensor " << i;
    ASSERT_EQ(t.n_dims, (int)w.ne.size());
    for (size_t d = 0; d < w.ne.size(); ++d) EXPECT_EQ(t.ne[d], w.ne[d]);
    EXPECT_EQ(t.type, w.type);
    const std::vector<float> got = gguf_values(t);
    ASSERT_EQ(got.size(), w.values.size());
    size_t bad = 0;
    for (size_t k = 0; k < got.size(); ++k)
      if (std::memcmp(&got[k], &w.values[k], 4) != 0 && got[k] != as_stored(w.type, w.values[k])) ++bad;
    EXPECT_EQ(bad, 0u);
  }
}

std::vector<std::string> keys(const gguf::Metadata& md) {
  std::vector<std::string> k;
  for (const auto& [key, v] : md.entries()) k.push_back(key);
  return k;
}

}  // namespace

TEST(Qwen35ConvertTest, ConditionalGenerationF32EveryTensor) {
  const std::string dir = test::temp_dir() + "/q35-cg";
  test::SynthQ35 s;
  const auto src = test::q35_tensors(s);
  test::write_q35(dir, s, src);
  convert::ConvertResult r;
  auto f = convert_q35(dir, "f32", &r);
  EXPECT_EQ(r.arch, "qwen35");
  expect_tensors(*f, reference(s, src, DType::F32));
  // The vision tower is skipped with a note; nothing else is remarked on.
  ASSERT_EQ(r.notes.size(), 1u);
  EXPECT_NE(r.notes[0].find("skipped 4 vision tensors"), std::string::npos) << r.notes[0];
  // Spot checks of the layout (the reference above is the full check).
  EXPECT_EQ(f->tensor("blk.0.attn_qkv.weight").shape_string(), "[64, 80]");   // 2*16 + 48
  EXPECT_EQ(f->tensor("blk.0.ssm_conv1d.weight").shape_string(), "[4, 80]");
  EXPECT_EQ(f->tensor("blk.0.ssm_a").shape_string(), "[6]");
  EXPECT_EQ(f->tensor("blk.0.ssm_dt.bias").type, DType::F32);
  EXPECT_EQ(f->tensor("blk.1.attn_q.weight").shape_string(), "[64, 128]");    // query + gate
  EXPECT_EQ(f->tensor("blk.4.nextn.eh_proj.weight").shape_string(), "[128, 64]");
  EXPECT_EQ(f->tensor("blk.4.attn_q.weight").shape_string(), "[64, 128]");
  EXPECT_EQ(f->find_tensor("blk.4.ssm_a"), nullptr);
  // ssm_a = -exp(A_log), tiled: GGUF head h is HF head (h % 2) * 3 + h / 2.
  const auto& a_log = std::find_if(src.begin(), src.end(), [](auto& t) { return t.name == "model.language_model.layers.0.linear_attn.A_log"; })->values;
  const auto ssm_a = gguf_values(f->tensor("blk.0.ssm_a"));
  const int hf_head[6] = {0, 3, 1, 4, 2, 5};
  for (int h = 0; h < 6; ++h) EXPECT_EQ(ssm_a[h], -std::exp(a_log[hf_head[h]])) << h;

  // auto on an f32-only source: f16, as llama.cpp's --outtype auto.
  auto fa = convert_q35(dir, "auto", &r);
  EXPECT_EQ(r.outtype, "F16");
  expect_tensors(*fa, reference(s, src, DType::F16));
  EXPECT_EQ(fa->metadata().get_int("general.file_type"), 1);
}

TEST(Qwen35ConvertTest, CausalLmBf16ShardedTwelveLayers) {
  // Layers 10 and 11 sort before 2: the order is the sorted names of each shard, shards in order.
  const std::string dir = test::temp_dir() + "/q35-lm";
  test::SynthQ35 s;
  s.conditional = false;
  s.dtype = "BF16";
  s.layers = 12;
  s.interval = 4;
  s.shards = 3;
  s.hidden = 32;
  const auto src = test::q35_tensors(s);
  test::write_q35(dir, s, src);
  convert::ConvertResult r;
  auto f = convert_q35(dir, "auto", &r);
  EXPECT_EQ(r.outtype, "BF16");
  EXPECT_TRUE(r.notes.empty()) << r.notes[0];
  expect_tensors(*f, reference(s, src, DType::BF16));
  EXPECT_EQ(f->metadata().get_int("qwen35.block_count"), 13);
  EXPECT_EQ(f->metadata().get_int("qwen35.nextn_predict_layers"), 1);
  EXPECT_EQ(f->metadata().get_int("qwen35.full_attention_interval"), 4);
  auto f32 = convert_q35(dir, "f32");
  expect_tensors(*f32, reference(s, src, DType::F32));
}

TEST(Qwen35ConvertTest, F16SourceKeepsLlamaCppsF16Arithmetic) {
  // +1 and -exp on an f16 source are rounded to f16 (llama.cpp computes them on the f16 tensor).
  const std::string dir = test::temp_dir() + "/q35-f16";
  test::SynthQ35 s;
  s.dtype = "F16";
  s.vision = false;
  const auto src = test::q35_tensors(s);
  test::write_q35(dir, s, src);
  convert::ConvertResult r;
  auto f = convert_q35(dir, "auto", &r);
  EXPECT_EQ(r.outtype, "F16");
  EXPECT_TRUE(r.notes.empty());
  expect_tensors(*f, reference(s, src, DType::F16));
  const auto norm = gguf_values(f->tensor("output_norm.weight"));
  for (float v : norm) EXPECT_EQ(v, round_to_fp16(v));
}

TEST(Qwen35ConvertTest, EqualHeadCountsAreNotReordered) {
  const std::string dir = test::temp_dir() + "/q35-eq";
  test::SynthQ35 s;
  s.n_k = s.n_v = 4;
  s.k_dim = 8;
  s.v_dim = 16;  // different head dims: the V part still follows v_dim
  s.mtp_layers = 0;
  s.extra_text_config = {{"mtp_num_hidden_layers", nullptr}};
  const auto src = test::q35_tensors(s);
  test::write_q35(dir, s, src);
  auto f = convert_q35(dir, "bf16");
  expect_tensors(*f, reference(s, src, DType::BF16));
  const auto& md = f->metadata();
  EXPECT_EQ(md.get_int("qwen35.block_count"), 4);
  EXPECT_FALSE(md.contains("qwen35.nextn_predict_layers"));
  EXPECT_EQ(md.get_int("qwen35.ssm.state_size"), 8);
  EXPECT_EQ(md.get_int("qwen35.ssm.inner_size"), 64);
  // The reorder with unequal dims.
  const std::string dir2 = test::temp_dir() + "/q35-dims";
  s.n_k = 2;
  s.n_v = 4;
  const auto src2 = test::q35_tensors(s);
  test::write_q35(dir2, s, src2);
  expect_tensors(*convert_q35(dir2, "f32"), reference(s, src2, DType::F32));
}

TEST(Qwen35ConvertTest, MetadataKeysOrderTypesAndValues) {
  const std::string dir = test::temp_dir() + "/qwen3.5-tiny-v2";
  test::SynthQ35 s;
  const auto src = test::q35_tensors(s);
  test::write_q35(dir, s, src);
  auto f = convert_q35(dir, "bf16");
  const auto& md = f->metadata();
  const std::vector<std::string> want = {
      "general.architecture", "general.type", "general.name", "general.version", "general.basename",
      "general.size_label", "qwen35.block_count", "qwen35.context_length", "qwen35.embedding_length",
      "qwen35.feed_forward_length", "qwen35.attention.head_count", "qwen35.attention.head_count_kv",
      "qwen35.rope.dimension_sections", "qwen35.rope.freq_base", "qwen35.attention.layer_norm_rms_epsilon",
      "qwen35.attention.key_length", "qwen35.attention.value_length", "general.file_type",
      "qwen35.nextn_predict_layers", "qwen35.ssm.conv_kernel", "qwen35.ssm.state_size", "qwen35.ssm.group_count",
      "qwen35.ssm.time_step_rank", "qwen35.ssm.inner_size", "qwen35.full_attention_interval",
      "qwen35.rope.dimension_count", "general.quantization_version", "tokenizer.ggml.model", "tokenizer.ggml.pre",
      "tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.eos_token_id",
      "tokenizer.chat_template"};
  EXPECT_EQ(keys(md), want);
  using VT = gguf::ValueType;
  auto type_of = [&](const char* k) { return md.find(k)->type(); };
  EXPECT_EQ(md.get_string("general.architecture"), "qwen35");
  EXPECT_EQ(md.get_string("general.type"), "model");
  // gguf-py's heuristics on the folder name "qwen3.5-tiny-v2" (checked against llama.cpp's Python).
  EXPECT_EQ(md.get_string("general.name"), "Qwen3.5 Tiny v2");
  EXPECT_EQ(md.get_string("general.basename"), "qwen3.5-tiny");
  EXPECT_EQ(md.get_string("general.version"), "v2");
  int64_t n_params = 0;
  for (const auto& t : f->tensors()) n_params += t.n_elements();
  EXPECT_EQ(md.get_string("general.size_label"), convert::weight_count_label(n_params));
  for (const char* k : {"qwen35.block_count", "qwen35.context_length", "qwen35.embedding_length", "qwen35.feed_forward_length",
                        "qwen35.attention.head_count", "qwen35.attention.head_count_kv", "qwen35.attention.key_length",
                        "qwen35.attention.value_length", "general.file_type", "qwen35.nextn_predict_layers",
                        "qwen35.ssm.conv_kernel", "qwen35.ssm.state_size", "qwen35.ssm.group_count",
                        "qwen35.ssm.time_step_rank", "qwen35.ssm.inner_size", "qwen35.full_attention_interval",
                        "qwen35.rope.dimension_count", "general.quantization_version"})
    EXPECT_EQ(type_of(k), VT::UINT32) << k;
  EXPECT_EQ(type_of("qwen35.rope.freq_base"), VT::FLOAT32);
  EXPECT_EQ(type_of("qwen35.attention.layer_norm_rms_epsilon"), VT::FLOAT32);
  EXPECT_EQ(type_of("qwen35.rope.dimension_sections"), VT::ARRAY);
  EXPECT_EQ(md.find("qwen35.rope.dimension_sections")->array_type(), VT::INT32);
  EXPECT_EQ(md.find("qwen35.rope.dimension_sections")->as_int_array(), (std::vector<int64_t>{11, 11, 10, 0}));
  EXPECT_EQ(md.get_int("qwen35.block_count"), 5);  // 4 layers + the MTP block
  EXPECT_EQ(md.get_int("qwen35.context_length"), 4096);
  EXPECT_EQ(md.get_int("qwen35.embedding_length"), 64);
  EXPECT_EQ(md.get_int("qwen35.feed_forward_length"), 96);
  EXPECT_EQ(md.get_int("qwen35.attention.head_count"), 4);
  EXPECT_EQ(md.get_int("qwen35.attention.head_count_kv"), 2);
  EXPECT_EQ(md.get_int("qwen35.attention.key_length"), 16);
  EXPECT_EQ(md.get_int("qwen35.attention.value_length"), 16);
  EXPECT_EQ(md.get_float("qwen35.rope.freq_base"), 1e7);
  EXPECT_EQ((float)md.get_float("qwen35.attention.layer_norm_rms_epsilon"), 1e-6f);
  EXPECT_EQ(md.get_int("general.file_type"), 32);
  EXPECT_EQ(md.get_int("qwen35.nextn_predict_layers"), 1);
  EXPECT_EQ(md.get_int("qwen35.ssm.conv_kernel"), 4);
  EXPECT_EQ(md.get_int("qwen35.ssm.state_size"), 8);
  EXPECT_EQ(md.get_int("qwen35.ssm.group_count"), 2);
  EXPECT_EQ(md.get_int("qwen35.ssm.time_step_rank"), 6);
  EXPECT_EQ(md.get_int("qwen35.ssm.inner_size"), 48);
  EXPECT_EQ(md.get_int("qwen35.full_attention_interval"), 2);
  EXPECT_EQ(md.get_int("qwen35.rope.dimension_count"), 4);  // 16 * 0.25
  EXPECT_EQ(md.get_int("general.quantization_version"), 2);
  EXPECT_EQ(md.get_string("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(md.get_string("tokenizer.ggml.pre"), "qwen35");
  EXPECT_EQ(md.find("tokenizer.ggml.tokens")->array_size(), 300u);

  // No mrope_section in the config: [11, 11, 10, 0] after rope.dimension_count (the mixin's default);
  // a partial_rotary_factor only at the top level; no MTP block.
  const std::string dir2 = test::temp_dir() + "/q35-nomrope";
  s.mrope_section = false;
  s.mtp_layers = 0;
  s.extra_text_config = {{"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 5e6}}}, {"partial_rotary_factor", 0.5}};
  test::write_q35(dir2, s);
  auto f2 = convert_q35(dir2, "f32");
  const auto k2 = keys(f2->metadata());
  const auto dc = std::find(k2.begin(), k2.end(), "qwen35.rope.dimension_count");
  ASSERT_NE(dc, k2.end());
  EXPECT_EQ(*(dc + 1), "qwen35.rope.dimension_sections");
  EXPECT_EQ(*(dc - 1), "qwen35.full_attention_interval");
  EXPECT_EQ(std::count(k2.begin(), k2.end(), "qwen35.rope.dimension_sections"), 1);
  EXPECT_EQ(f2->metadata().find("qwen35.rope.dimension_sections")->as_int_array(), (std::vector<int64_t>{11, 11, 10, 0}));
  EXPECT_EQ(f2->metadata().get_int("qwen35.rope.dimension_count"), 8);
  EXPECT_EQ(f2->metadata().get_float("qwen35.rope.freq_base"), 5e6);
  EXPECT_EQ(f2->metadata().get_int("qwen35.block_count"), 4);
  EXPECT_FALSE(f2->metadata().contains("qwen35.nextn_predict_layers"));
  EXPECT_EQ(f2->metadata().get_int("general.file_type"), 0);
}

TEST(Qwen35ConvertTest, MropeSectionIsPaddedAndYarnKeysWritten) {
  const std::string dir = test::temp_dir() + "/q35-yarn";
  test::SynthQ35 s;
  s.mtp_layers = 0;
  s.vision = false;
  s.extra_text_config = {{"rope_parameters",
                          {{"rope_type", "yarn"}, {"rope_theta", 1e6}, {"factor", 4.0}, {"original_max_position_embeddings", 1024},
                           {"beta_fast", 32.0}, {"mrope_section", {2, 1, 1}}}}};
  test::write_q35(dir, s);
  auto f = convert_q35(dir, "f32");
  const auto& md = f->metadata();
  EXPECT_EQ(md.get_string("qwen35.rope.scaling.type"), "yarn");
  EXPECT_EQ(md.get_float("qwen35.rope.scaling.factor"), 4.0);
  EXPECT_EQ(md.get_int("qwen35.rope.scaling.original_context_length"), 1024);
  EXPECT_EQ(md.get_float("qwen35.rope.scaling.yarn_beta_fast"), 32.0);
  EXPECT_FALSE(md.contains("qwen35.rope.scaling.yarn_beta_slow"));
  EXPECT_EQ(md.find("qwen35.rope.dimension_sections")->as_int_array(), (std::vector<int64_t>{2, 1, 1, 0}));
  const auto k = keys(md);
  const auto pos = [&](const char* key) { return std::find(k.begin(), k.end(), key) - k.begin(); };
  EXPECT_LT(pos("qwen35.attention.head_count_kv"), pos("qwen35.rope.scaling.type"));
  EXPECT_LT(pos("qwen35.rope.scaling.yarn_beta_fast"), pos("qwen35.rope.dimension_sections"));
  EXPECT_LT(pos("qwen35.rope.dimension_sections"), pos("qwen35.rope.freq_base"));
}

TEST(Qwen35ConvertTest, TheMtpBlockNeverFailsTheConversion) {
  test::SynthQ35 s;
  s.vision = false;
  const auto src = test::q35_tensors(s);
  {  // --no-mtp: left out, like llama.cpp's --no-mtp.
    const std::string dir = test::temp_dir() + "/q35-nomtp";
    test::write_q35(dir, s, src);
    convert::ConvertResult r;
    auto f = convert_q35(dir, "f32", &r, true);
    expect_tensors(*f, reference(s, src, DType::F32, false));
    EXPECT_EQ(f->metadata().get_int("qwen35.block_count"), 4);
    EXPECT_FALSE(f->metadata().contains("qwen35.nextn_predict_layers"));
    ASSERT_EQ(r.notes.size(), 1u);
    EXPECT_NE(r.notes[0].find("--no-mtp"), std::string::npos);
  }
  {  // An incomplete block (no mtp.fc): left out with a note.
    const std::string dir = test::temp_dir() + "/q35-badmtp";
    std::vector<test::StTensor> kept;
    for (const auto& t : src)
      if (t.name != "mtp.fc.weight") kept.push_back(t);
    test::write_q35(dir, s, kept);
    convert::ConvertResult r;
    auto f = convert_q35(dir, "f32", &r);
    expect_tensors(*f, reference(s, src, DType::F32, false));
    ASSERT_EQ(r.notes.size(), 1u);
    EXPECT_NE(r.notes[0].find("MTP block was left out (missing mtp.fc.weight)"), std::string::npos) << r.notes[0];
  }
  {  // A mis-shaped MTP tensor, and an MTP layer count the config contradicts.
    const std::string dir = test::temp_dir() + "/q35-badmtp2";
    auto bad = src;
    for (auto& t : bad)
      if (t.name == "mtp.layers.0.mlp.up_proj.weight") t.shape = {48, 128}, t.values.resize(48 * 128);
    test::write_q35(dir, s, bad);
    convert::ConvertResult r;
    convert_q35(dir, "f32", &r);
    ASSERT_EQ(r.notes.size(), 1u);
    EXPECT_NE(r.notes[0].find("mtp.layers.0.mlp.up_proj.weight has shape [48, 128], expected [96, 64]"), std::string::npos)
        << r.notes[0];
    const std::string dir2 = test::temp_dir() + "/q35-mtp2";
    auto s2 = s;
    s2.extra_text_config = {{"mtp_num_hidden_layers", 2}};
    test::write_q35(dir2, s2, src);
    auto f2 = convert_q35(dir2, "f32", &r);
    EXPECT_FALSE(f2->metadata().contains("qwen35.nextn_predict_layers"));
    EXPECT_NE(r.notes.back().find("missing mtp.layers.1."), std::string::npos) << r.notes.back();
  }
  {  // The config announces a block the checkpoint does not have; no mtp_num_hidden_layers but a block.
    const std::string dir = test::temp_dir() + "/q35-nomtp-tensors";
    auto s2 = s;
    s2.mtp_layers = 0;
    s2.extra_text_config = {{"mtp_num_hidden_layers", 1}};
    test::write_q35(dir, s2);
    convert::ConvertResult r;
    auto f = convert_q35(dir, "f32", &r);
    EXPECT_EQ(f->metadata().get_int("qwen35.block_count"), 4);
    ASSERT_EQ(r.notes.size(), 1u);
    EXPECT_NE(r.notes[0].find("no mtp.* tensors"), std::string::npos) << r.notes[0];
    const std::string dir2 = test::temp_dir() + "/q35-mtp-uncounted";
    s2 = s;
    s2.extra_text_config = {{"mtp_num_hidden_layers", nullptr}};
    test::write_q35(dir2, s2, src);
    auto f2 = convert_q35(dir2, "f32", &r);
    expect_tensors(*f2, reference(s2, src, DType::F32));
    EXPECT_EQ(f2->metadata().get_int("qwen35.nextn_predict_layers"), 1);
  }
}

TEST(Qwen35ConvertTest, TiedEmbeddingsAndQ8_0) {
  const std::string dir = test::temp_dir() + "/q35-tied";
  test::SynthQ35 s;
  s.tied = true;
  s.hidden = 64;
  s.ffn = 80;  // ffn_down rows of 80: Q8_0 falls back to F16, as llama.cpp's converter
  test::write_q35(dir, s);
  convert::ConvertResult r;
  auto f = convert_q35(dir, "q8_0", &r);
  EXPECT_EQ(f->find_tensor("output.weight"), nullptr);
  EXPECT_EQ(f->tensor("blk.0.ffn_down.weight").type, DType::F16);
  EXPECT_EQ(f->tensor("blk.0.ffn_up.weight").type, DType::Q8_0);
  EXPECT_EQ(f->tensor("blk.0.ssm_conv1d.weight").type, DType::F32);
  EXPECT_EQ(f->tensor("blk.0.ssm_alpha.weight").type, DType::Q8_0);
  EXPECT_EQ(f->metadata().get_int("general.file_type"), 7);
}

// A converted checkpoint with its MTP block (blk.N.nextn.* and the block's own layer tensors after the
// main stack) loads and runs: the block is bound, never fails the load, and drafts as the MTP head.
TEST(Qwen35ConvertTest, AFileWithAnMtpBlockLoadsAndRuns) {
  const std::string dir = test::temp_dir() + "/q35-mtp-load";
  test::SynthQ35 s;
  test::write_q35(dir, s);
  auto file = convert_q35(dir, "f32");
  ASSERT_NE(file->find_tensor("blk.4.nextn.eh_proj.weight"), nullptr);
  auto model = Model::load(file);
  EXPECT_EQ(model->hparams().n_layer, 4);
  EXPECT_EQ(model->hparams().n_layer_nextn, 1);
  EXPECT_GE(model->nextn_tensors().size(), 5u);
  EngineOptions o;
  o.n_ctx = 64;
  auto engine = Engine::create(model, o);
  const std::vector<int32_t> tokens = {1, 5, 9, 2, 7, 3};
  const auto logits = engine->eval(engine->memory().create_sequence(), tokens, true);
  ASSERT_EQ(logits.size(), tokens.size() * (size_t)model->hparams().n_vocab);
  for (float v : logits) ASSERT_TRUE(std::isfinite(v));

  // Its MTP head as the drafter (the converter's block binds as a one-layer model): greedy output with
  // its drafts is the output without them.
  auto generate = [&](bool with_mtp) {
    EngineOptions eo = o;
    eo.draft_rollback = with_mtp;
    auto target = Engine::create(model, eo);
    std::unique_ptr<MtpDrafter> mtp;
    if (with_mtp) mtp = std::make_unique<MtpDrafter>(model, target->options(), DraftParams{});
    const int seq = target->memory().create_sequence(false);
    SpeculativeDecoder decoder(*target, mtp.get());
    std::vector<float> l = decoder.prefill(seq, tokens);
    std::vector<int32_t> history = tokens, out;
    history.push_back(argmax_logits(l.data(), target->n_vocab()));
    SamplingParams sp;
    sp.temperature = 0;
    Sampler sampler(sp, target->n_vocab());
    while (out.size() < 12) decoder.round(seq, history, 12 - (int)out.size(), sampler, true, out);
    if (mtp) {
      EXPECT_GT(decoder.stats().drafted, 0);
    }
    return out;
  };
  EXPECT_EQ(generate(true), generate(false));
}
