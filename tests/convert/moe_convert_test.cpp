// `roofline convert` for mixture-of-experts folders: Qwen3MoeForCausalLM -> qwen3moe and
// Qwen3_5MoeForCausalLM / Qwen3_5MoeForConditionalGeneration -> qwen35moe, on synthetic safetensors
// folders written here: per-expert tensors stacked into ffn_{down,gate,up}_exps (values checked expert by
// expert), transformers 5's fused gate_up_proj / down_proj giving the same file, routers and the
// shared-expert gate kept f32 ([n_embd, 1]), llama.cpp's metadata keys in its order, the MoE MTP block,
// the files loading and running, and one-line errors for broken folders.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "convert/convert.h"
#include "core/error.h"
#include "core/fp16.h"
#include "engine/engine.h"
#include "formats/gguf.h"
#include "formats/quant_ref.h"
#include "model/model.h"
#include "qwen35_test_util.h"
#include "test_util.h"

using namespace roofline;
namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

namespace {

struct MoeShape {
  int n_expert = 5, n_used = 2, ff_exp = 24, ff_shexp = 0;  // ff_shexp > 0: a shared expert
  bool fused = false;                                       // transformers 5's gate_up_proj / down_proj
};

// The dense folder's tensors with every mlp.{gate,up,down}_proj replaced by a router, experts and
// (ff_shexp > 0) a gated shared expert.
std::vector<test::StTensor> to_moe(const std::vector<test::StTensor>& dense, const MoeShape& m, int64_t H,
                                   const std::string& dtype) {
  std::vector<test::StTensor> out;
  uint32_t seed = 5000;
  auto add = [&](const std::string& name, std::vector<int64_t> shape) {
    size_t n = 1;
    for (int64_t d : shape) n *= (size_t)d;
    out.push_back({name, dtype, shape, test::test_values(n, seed++, 0.5f)});
  };
  for (const auto& t : dense) {
    const size_t at = t.name.find("mlp.gate_proj.weight");
    if (t.name.find("mlp.up_proj.weight") != std::string::npos || t.name.find("mlp.down_proj.weight") != std::string::npos)
      continue;
    if (at == std::string::npos) {
      out.push_back(t);
      continue;
    }
    const std::string p = t.name.substr(0, at) + "mlp.";
    add(p + "gate.weight", {m.n_expert, H});
    if (m.fused) {
      add(p + "experts.gate_up_proj", {m.n_expert, 2 * m.ff_exp, H});
      add(p + "experts.down_proj", {m.n_expert, H, m.ff_exp});
    } else {
      for (int e = 0; e < m.n_expert; ++e) {
        const std::string x = p + "experts." + std::to_string(e) + ".";
        add(x + "gate_proj.weight", {m.ff_exp, H});
        add(x + "up_proj.weight", {m.ff_exp, H});
        add(x + "down_proj.weight", {H, m.ff_exp});
      }
    }
    if (m.ff_shexp > 0) {
      add(p + "shared_expert.gate_proj.weight", {m.ff_shexp, H});
      add(p + "shared_expert.up_proj.weight", {m.ff_shexp, H});
      add(p + "shared_expert.down_proj.weight", {H, m.ff_shexp});
      add(p + "shared_expert_gate.weight", {1, H});
    }
  }
  return out;
}

// The per-expert form of fused tensors (same values), to check both give one file.
std::vector<test::StTensor> unfuse(const std::vector<test::StTensor>& fused, const MoeShape& m, int64_t H) {
  std::vector<test::StTensor> out;
  const int64_t F = m.ff_exp;
  for (const auto& t : fused) {
    const bool gu = t.name.size() > 12 && t.name.compare(t.name.size() - 12, 12, "gate_up_proj") == 0;
    const bool dn = t.name.find("experts.down_proj") != std::string::npos;
    if (!gu && !dn) {
      out.push_back(t);
      continue;
    }
    const std::string p = t.name.substr(0, t.name.find("experts.") + 8);
    for (int e = 0; e < m.n_expert; ++e) {
      const std::string x = p + std::to_string(e) + ".";
      if (gu) {
        const float* base = t.values.data() + (size_t)e * 2 * F * H;
        out.push_back({x + "gate_proj.weight", t.dtype, {F, H}, std::vector<float>(base, base + F * H)});
        out.push_back({x + "up_proj.weight", t.dtype, {F, H}, std::vector<float>(base + F * H, base + 2 * F * H)});
      } else {
        const float* base = t.values.data() + (size_t)e * H * F;
        out.push_back({x + "down_proj.weight", t.dtype, {H, F}, std::vector<float>(base, base + H * F)});
      }
    }
  }
  return out;
}

test::SynthHf qwen3moe_folder(const MoeShape& m) {
  test::SynthHf s;
  s.hf_class = "Qwen3MoeForCausalLM";
  s.layers = 3;
  // transformers 5 saves qwen3_moe's expert count as num_local_experts (Qwen3.5-MoE's as num_experts).
  s.extra_config = {{"num_local_experts", m.n_expert}, {"num_experts_per_tok", m.n_used}, {"moe_intermediate_size", m.ff_exp},
                    {"norm_topk_prob", true}, {"decoder_sparse_step", 1}, {"mlp_only_layers", json::array()}};
  return s;
}

std::string write_qwen3moe(const std::string& name, const MoeShape& m, std::vector<test::StTensor>* out = nullptr) {
  const test::SynthHf s = qwen3moe_folder(m);
  test::SynthHf dense = s;
  dense.hf_class = "Qwen3ForCausalLM";
  const auto tensors = to_moe(test::synth_tensors(dense), m, s.hidden, s.dtype);
  const std::string dir = test::temp_dir() + "/" + name;
  fs::remove_all(dir);
  test::write_synth_hf(dir, s, tensors);
  if (out) *out = tensors;
  return dir;
}

std::shared_ptr<gguf::GgufFile> convert_dir(const std::string& dir, const std::string& outtype, convert::ConvertResult* r = nullptr) {
  convert::ConvertOptions o;
  o.source = dir;
  o.output = dir + "-" + outtype + ".gguf";
  o.outtype = outtype;
  o.progress = false;
  o.n_threads = 2;
  const auto res = convert::convert_model(o);
  if (r) *r = res;
  return gguf::GgufFile::open(o.output);
}

std::vector<float> values_of(const gguf::TensorInfo& t) {
  std::vector<float> v((size_t)t.n_elements());
  dequantize_rows_ref(t.type, t.data, v.data(), t.n_rows(), t.row_length());
  return v;
}

const gguf::TensorInfo& tensor(const gguf::GgufFile& f, const std::string& name) {
  for (const auto& t : f.tensors())
    if (t.name == name) return t;
  throw std::runtime_error("no tensor " + name);
}

size_t key_index(const gguf::Metadata& md, const std::string& key) {
  size_t i = 0;
  for (const auto& [k, v] : md.entries()) {
    if (k == key) return i;
    ++i;
  }
  return SIZE_MAX;
}

// GGUF expert e, row j of a stacked tensor equals the HF per-expert tensor's row j.
void expect_stacked(const gguf::GgufFile& f, const std::vector<test::StTensor>& src, const std::string& blk,
                    const std::string& hf_experts, const char* gguf_part, const char* hf_part, const MoeShape& m) {
  const gguf::TensorInfo& t = tensor(f, blk + gguf_part);
  ASSERT_EQ(t.n_dims, 3) << t.name;
  ASSERT_EQ(t.ne[2], m.n_expert) << t.name;
  const std::vector<float> got = values_of(t);
  const size_t per = (size_t)(t.ne[0] * t.ne[1]);
  for (int e = 0; e < m.n_expert; ++e) {
    const std::string want_name = hf_experts + std::to_string(e) + "." + hf_part;
    const test::StTensor* w = nullptr;
    for (const auto& s : src)
      if (s.name == want_name) w = &s;
    ASSERT_NE(w, nullptr) << want_name;
    ASSERT_EQ(w->values.size(), per);
    for (size_t i = 0; i < per; ++i) {
      const float want = w->dtype == "BF16" ? bf16_to_f32(f32_to_bf16(w->values[i])) : w->values[i];  // as the file stores it
      ASSERT_EQ(got[(size_t)e * per + i], want) << t.name << " expert " << e << " element " << i;
    }
  }
}

}  // namespace

TEST(MoeConvertTest, Qwen3MoeStacksEveryExpertAndWritesLlamaCppsKeys) {
  const MoeShape m;
  std::vector<test::StTensor> src;
  const std::string dir = write_qwen3moe("qwen3moe_per_expert", m, &src);
  convert::ConvertResult r;
  auto f = convert_dir(dir, "f16", &r);
  EXPECT_EQ(r.arch, "qwen3moe");
  const gguf::Metadata& md = f->metadata();
  EXPECT_EQ(md.get_string("general.architecture"), "qwen3moe");
  EXPECT_EQ(md.get_int("qwen3moe.expert_count"), 5);
  EXPECT_EQ(md.get_int("qwen3moe.expert_used_count"), 2);
  EXPECT_EQ(md.get_int("qwen3moe.expert_feed_forward_length"), 24);
  EXPECT_EQ(md.get_int("qwen3moe.feed_forward_length"), 80);
  EXPECT_FALSE(md.contains("qwen3moe.expert_shared_feed_forward_length"));
  EXPECT_FALSE(md.contains("qwen3moe.expert_weights_norm"));
  // llama.cpp's order: counts after the rms epsilon, before key_length; lengths right after file_type.
  EXPECT_EQ(key_index(md, "qwen3moe.expert_count"), key_index(md, "qwen3moe.attention.layer_norm_rms_epsilon") + 1);
  EXPECT_EQ(key_index(md, "qwen3moe.expert_used_count"), key_index(md, "qwen3moe.expert_count") + 1);
  EXPECT_EQ(key_index(md, "qwen3moe.attention.key_length"), key_index(md, "qwen3moe.expert_used_count") + 1);
  EXPECT_EQ(key_index(md, "qwen3moe.expert_feed_forward_length"), key_index(md, "general.file_type") + 1);

  for (int il = 0; il < 3; ++il) {
    const std::string blk = "blk." + std::to_string(il) + ".", hf = "model.layers." + std::to_string(il) + ".mlp.experts.";
    const gguf::TensorInfo& router = tensor(*f, blk + "ffn_gate_inp.weight");
    EXPECT_EQ(router.type, DType::F32);  // routers stay f32 whatever the outtype
    EXPECT_EQ(router.ne[0], 64);
    EXPECT_EQ(router.ne[1], 5);
    for (const char* part : {"ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"})
      EXPECT_EQ(tensor(*f, blk + part).type, DType::F16) << part;
    EXPECT_EQ(tensor(*f, blk + "ffn_gate_exps.weight").ne[1], 24);
    EXPECT_EQ(tensor(*f, blk + "ffn_down_exps.weight").ne[0], 24);
    EXPECT_EQ(tensor(*f, blk + "ffn_down_exps.weight").ne[1], 64);
    for (const char* dense : {"ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"})
      for (const auto& t : f->tensors()) EXPECT_NE(t.name, blk + dense);
  }
  // Values, expert by expert, from the lossless f32 file; llama.cpp's order within a layer: down, gate, up.
  auto f32 = convert_dir(dir, "f32");
  for (int il : {0, 2}) {
    const std::string blk = "blk." + std::to_string(il) + ".", hf = "model.layers." + std::to_string(il) + ".mlp.experts.";
    expect_stacked(*f32, src, blk, hf, "ffn_gate_exps.weight", "gate_proj.weight", m);
    expect_stacked(*f32, src, blk, hf, "ffn_up_exps.weight", "up_proj.weight", m);
    expect_stacked(*f32, src, blk, hf, "ffn_down_exps.weight", "down_proj.weight", m);
  }
  std::vector<std::string> names;
  for (const auto& t : f32->tensors()) names.push_back(t.name);
  const auto pos = [&](const std::string& n) { return std::find(names.begin(), names.end(), n) - names.begin(); };
  EXPECT_EQ(pos("blk.1.ffn_gate_exps.weight"), pos("blk.1.ffn_down_exps.weight") + 1);
  EXPECT_EQ(pos("blk.1.ffn_up_exps.weight"), pos("blk.1.ffn_gate_exps.weight") + 1);

  // It loads and runs.
  EngineOptions eo;
  eo.n_threads = 2;
  eo.n_ctx = 64;
  auto engine = Engine::create(Model::load(f), eo);
  const int seq = engine->memory().create_sequence();
  const std::vector<int32_t> toks = {5, 77, 190, 3};
  const auto logits = engine->eval(seq, toks, true);
  ASSERT_EQ(logits.size(), toks.size() * 300);
  for (float x : logits) ASSERT_TRUE(std::isfinite(x));
}

TEST(MoeConvertTest, FusedExpertsGiveTheSameFileAsPerExpertOnes) {
  MoeShape m;
  m.fused = true;
  const test::SynthHf s = qwen3moe_folder(m);
  test::SynthHf dense = s;
  dense.hf_class = "Qwen3ForCausalLM";
  const auto fused = to_moe(test::synth_tensors(dense), m, s.hidden, s.dtype);
  const std::string a = test::temp_dir() + "/qwen3moe_fused", b = test::temp_dir() + "/qwen3moe_unfused";
  fs::remove_all(a);
  fs::remove_all(b);
  test::write_synth_hf(a, s, fused);
  test::write_synth_hf(b, s, unfuse(fused, m, s.hidden));
  auto fa = convert_dir(a, "f32"), fb = convert_dir(b, "f32");
  ASSERT_EQ(fa->tensors().size(), fb->tensors().size());
  for (size_t i = 0; i < fa->tensors().size(); ++i) {
    const auto &x = fa->tensors()[i], &y = fb->tensors()[i];
    EXPECT_EQ(x.name, y.name);
    ASSERT_EQ(x.n_bytes, y.n_bytes) << x.name;
    EXPECT_EQ(0, std::memcmp(x.data, y.data, x.n_bytes)) << x.name;
  }
}

namespace {

test::SynthQ35 qwen35moe_shape(bool conditional) {
  test::SynthQ35 s;
  s.conditional = conditional;
  s.vision = conditional;
  s.dtype = "BF16";
  s.mtp_layers = 1;
  return s;
}

std::string write_qwen35moe(const std::string& name, const test::SynthQ35& s, const MoeShape& m,
                            std::vector<test::StTensor>* out = nullptr) {
  auto tensors = to_moe(test::q35_tensors(s), m, s.hidden, s.dtype);
  const std::string dir = test::temp_dir() + "/" + name;
  fs::remove_all(dir);
  test::write_q35(dir, s, tensors);
  // The MoE config: Qwen3_5Moe* classes, expert keys, no dense intermediate_size.
  json cfg = test::q35_config(s);
  json& text = s.conditional ? cfg["text_config"] : cfg;
  cfg["architectures"] = {s.conditional ? "Qwen3_5MoeForConditionalGeneration" : "Qwen3_5MoeForCausalLM"};
  text.erase("intermediate_size");
  text["num_experts"] = m.n_expert;
  text["num_experts_per_tok"] = m.n_used;
  text["moe_intermediate_size"] = m.ff_exp;
  text["shared_expert_intermediate_size"] = m.ff_shexp;
  std::ofstream(dir + "/config.json") << cfg.dump(2);
  if (out) *out = tensors;
  return dir;
}

}  // namespace

TEST(MoeConvertTest, Qwen35MoeWithSharedExpertAndMtpBlock) {
  MoeShape m;
  m.ff_shexp = 40;
  for (const bool conditional : {false, true}) {
    SCOPED_TRACE(conditional ? "ConditionalGeneration" : "CausalLM");
    const test::SynthQ35 s = qwen35moe_shape(conditional);
    std::vector<test::StTensor> src;
    const std::string dir = write_qwen35moe(conditional ? "q35moe_vl" : "q35moe", s, m, &src);
    convert::ConvertResult r;
    auto f = convert_dir(dir, "f32", &r);
    EXPECT_EQ(r.arch, "qwen35moe");
    const gguf::Metadata& md = f->metadata();
    EXPECT_EQ(md.get_int("qwen35moe.expert_count"), 5);
    EXPECT_EQ(md.get_int("qwen35moe.expert_shared_feed_forward_length"), 40);
    EXPECT_FALSE(md.contains("qwen35moe.feed_forward_length"));  // no intermediate_size in config.json
    EXPECT_EQ(md.get_int("qwen35moe.block_count"), s.layers + 1);
    EXPECT_EQ(md.get_int("qwen35moe.nextn_predict_layers"), 1);
    EXPECT_EQ(key_index(md, "qwen35moe.expert_feed_forward_length"), key_index(md, "general.file_type") + 1);
    EXPECT_EQ(key_index(md, "qwen35moe.nextn_predict_layers"), key_index(md, "qwen35moe.expert_shared_feed_forward_length") + 1);
    const std::string lm = conditional ? "model.language_model." : "model.";
    for (int il = 0; il <= s.layers; ++il) {  // the last one is the MTP block
      const std::string blk = "blk." + std::to_string(il) + ".";
      const std::string hf = il < s.layers ? lm + "layers." + std::to_string(il) + ".mlp.experts." : "mtp.layers.0.mlp.experts.";
      expect_stacked(*f, src, blk, hf, "ffn_gate_exps.weight", "gate_proj.weight", m);
      expect_stacked(*f, src, blk, hf, "ffn_down_exps.weight", "down_proj.weight", m);
      const gguf::TensorInfo& g = tensor(*f, blk + "ffn_gate_inp_shexp.weight");
      EXPECT_EQ(g.type, DType::F32);
      EXPECT_EQ(g.n_dims, 2);
      EXPECT_EQ(g.ne[0], s.hidden);
      EXPECT_EQ(g.ne[1], 1);
      EXPECT_EQ(tensor(*f, blk + "ffn_down_shexp.weight").ne[0], 40);
      EXPECT_EQ(tensor(*f, blk + "ffn_gate_inp.weight").type, DType::F32);
    }
    // llama.cpp's order: names sorted, a layer's stacked experts where its last expert tensor sorts
    // (after ...experts.4.up_proj, before ...mlp.gate.weight).
    std::vector<std::string> names;
    for (const auto& t : f->tensors()) names.push_back(t.name);
    const auto pos = [&](const std::string& n) { return std::find(names.begin(), names.end(), n) - names.begin(); };
    EXPECT_EQ(pos("blk.0.ffn_gate_inp.weight"), pos("blk.0.ffn_up_exps.weight") + 1);
    EXPECT_EQ(pos("blk.0.ffn_gate_exps.weight"), pos("blk.0.ffn_down_exps.weight") + 1);

    auto model = Model::load(f);
    EXPECT_EQ(model->hparams().n_ff_shexp, 40);
    EngineOptions eo;
    eo.n_threads = 2;
    eo.n_ctx = 64;
    auto engine = Engine::create(model, eo);
    const int seq = engine->memory().create_sequence();
    const std::vector<int32_t> toks = {5, 77, 190, 3, 9};
    const auto logits = engine->eval(seq, toks, true);
    for (float x : logits) ASSERT_TRUE(std::isfinite(x));
  }
}

TEST(MoeConvertTest, BrokenFoldersGiveOneLineErrors) {
  auto expect_error = [](const std::string& dir, const std::string& part) {
    try {
      convert_dir(dir, "f32");
      ADD_FAILURE() << "no error for " << dir;
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(part), std::string::npos) << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    }
  };
  const MoeShape m;
  {  // one expert tensor missing
    std::vector<test::StTensor> src;
    std::string dir = write_qwen3moe("qwen3moe_missing", m, &src);
    std::erase_if(src, [](const test::StTensor& t) { return t.name == "model.layers.1.mlp.experts.3.up_proj.weight"; });
    test::write_safetensors(dir + "/model.safetensors", src);
    expect_error(dir, "missing model.layers.1.mlp.experts.3.up_proj.weight");
  }
  {  // a mis-shaped fused tensor
    MoeShape fm = m;
    fm.fused = true;
    std::vector<test::StTensor> src;
    std::string dir = write_qwen3moe("qwen3moe_bad_fused", fm, &src);
    for (auto& t : src)
      if (t.name == "model.layers.0.mlp.experts.down_proj") t.shape = {5, 24, 64};
    test::write_safetensors(dir + "/model.safetensors", src);
    expect_error(dir, "model.layers.0.mlp.experts.down_proj has shape [5, 24, 64], expected [5, 64, 24]");
  }
  {  // config problems
    std::string dir = write_qwen3moe("qwen3moe_bad_config", m);
    test::SynthHf s = qwen3moe_folder(m);
    s.extra_config["num_experts_per_tok"] = 6;
    std::ofstream(dir + "/config.json") << test::synth_config(s).dump(2);
    expect_error(dir, "num_experts_per_tok 6 is more than num_experts 5");
    s = qwen3moe_folder(m);
    s.extra_config["mlp_only_layers"] = {1};
    std::ofstream(dir + "/config.json") << test::synth_config(s).dump(2);
    expect_error(dir, "mlp_only_layers [1] (dense layers in a MoE model) is not supported");
    s = qwen3moe_folder(m);
    s.extra_config.erase("num_local_experts");
    std::ofstream(dir + "/config.json") << test::synth_config(s).dump(2);
    expect_error(dir, "none of num_local_experts, num_experts, n_routed_experts is given");
    s = qwen3moe_folder(m);
    s.extra_config.erase("moe_intermediate_size");
    std::ofstream(dir + "/config.json") << test::synth_config(s).dump(2);
    expect_error(dir, "moe_intermediate_size");
  }
}
