// Gemma 3 conversion on tiny synthetic checkpoints written here: tensor names, order, shapes, types and
// values (every *norm.weight + 1, the embedding trimmed to the tokenizer) for Gemma3ForCausalLM and the
// text tower of Gemma3ForConditionalGeneration (vision tower skipped, identical tensors); metadata from
// transformers 5 configs (rope_parameters per layer type, layer_types) and 4.x ones (rope_scaling,
// rope_local_base_freq, sliding_window_pattern); the SentencePiece-style vocabulary as model "llama";
// configs llama.cpp's GGUF cannot express refused in one line; the converted model runs.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "convert/convert.h"
#include "convert_test_util.h"
#include "core/error.h"
#include "engine/engine.h"
#include "formats/gguf.h"
#include "formats/quant_ref.h"
#include "model/model.h"
#include "test_util.h"

using namespace roofline;
namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

namespace {

constexpr int kHidden = 64, kHeads = 4, kKvHeads = 2, kHeadDim = 16, kFfn = 96, kLayers = 7, kRows = 320;

// A SentencePiece-style BPE tokenizer.json as Gemma's: <pad> <eos> <bos> <unk>, the 256 byte tokens
// <0x00>..<0xFF>, ▁-words, byte fallback, ' ' -> ▁ normalizer; <start_of_turn>/<end_of_turn> added.
// 4 + 256 + 8 + 2 = 270 tokens, fewer than the checkpoint's kRows embedding rows.
int write_spm_tokenizer(const std::string& dir) {
  ojson vocab = ojson::object();
  const char* specials[] = {"<pad>", "<eos>", "<bos>", "<unk>"};
  int id = 0;
  for (const char* s : specials) vocab[s] = id++;
  char buf[8];
  for (int b = 0; b < 256; ++b) {
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    vocab[buf] = id++;
  }
  for (const char* w : {"\xe2\x96\x81", "\xe2\x96\x81" "t", "he", "\xe2\x96\x81" "the", "\xe2\x96\x81" "a", "in", "\xe2\x96\x81" "in", "er"})
    vocab[w] = id++;
  ojson added = ojson::array();
  for (int i = 0; i < 4; ++i)
    added.push_back({{"id", i}, {"content", specials[i]}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                     {"normalized", false}, {"special", true}});
  for (const char* s : {"<start_of_turn>", "<end_of_turn>"})
    added.push_back({{"id", id++}, {"content", s}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                     {"normalized", false}, {"special", true}});
  const ojson merges = ojson::array({ojson::array({"\xe2\x96\x81", "t"}), ojson::array({"h", "e"}),
                                     ojson::array({"\xe2\x96\x81" "t", "he"}), ojson::array({"\xe2\x96\x81", "a"}),
                                     ojson::array({"i", "n"}), ojson::array({"\xe2\x96\x81", "in"}), ojson::array({"e", "r"})});
  ojson tj = {{"version", "1.0"},
              {"truncation", nullptr},
              {"padding", nullptr},
              {"added_tokens", added},
              {"normalizer", {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\xe2\x96\x81"}}},
              {"pre_tokenizer", {{"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", "MergedWithPrevious"}, {"invert", false}}},
              {"post_processor",
               {{"type", "TemplateProcessing"},
                {"single", {{{"SpecialToken", {{"id", "<bos>"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
                {"pair", ojson::array()},
                {"special_tokens", {{"<bos>", {{"id", "<bos>"}, {"ids", {2}}, {"tokens", {"<bos>"}}}}}}}},
              {"decoder", {{"type", "Sequence"}, {"decoders", {{{"type", "Replace"}, {"pattern", {{"String", "\xe2\x96\x81"}}}, {"content", " "}},
                                                               {{"type", "ByteFallback"}},
                                                               {{"type", "Fuse"}}}}}},
              {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", "<unk>"}, {"continuing_subword_prefix", nullptr},
                         {"end_of_word_suffix", nullptr}, {"fuse_unk", true}, {"byte_fallback", true}, {"ignore_merges", false},
                         {"vocab", vocab}, {"merges", merges}}}};
  std::ofstream(dir + "/tokenizer.json") << tj.dump();
  ojson cfg = {{"bos_token", "<bos>"}, {"eos_token", "<end_of_turn>"}, {"pad_token", "<pad>"}, {"unk_token", "<unk>"},
               {"add_bos_token", true}, {"add_eos_token", false},
               {"chat_template", "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}<end_of_turn>\n{% endfor %}"}};
  std::ofstream(dir + "/tokenizer_config.json") << cfg.dump();
  return id;
}

// The text model's tensors under HF names (prefix "model." or "model.language_model.").
std::vector<test::StTensor> gemma_tensors(const std::string& prefix, const std::string& dtype = "F32") {
  std::vector<test::StTensor> t;
  uint32_t seed = 11;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, float scale = 0.5f) {
    size_t n = 1;
    for (int64_t d : shape) n *= (size_t)d;
    t.push_back({prefix + name, dtype, shape, test::test_values(n, seed++, scale)});
  };
  const int64_t q = kHeads * kHeadDim, kv = kKvHeads * kHeadDim;
  add("embed_tokens.weight", {kRows, kHidden});
  for (int il = 0; il < kLayers; ++il) {
    const std::string p = "layers." + std::to_string(il) + ".";
    add(p + "input_layernorm.weight", {kHidden}, 0.1f);
    add(p + "self_attn.q_proj.weight", {q, kHidden}, 0.3f);
    add(p + "self_attn.k_proj.weight", {kv, kHidden}, 0.3f);
    add(p + "self_attn.v_proj.weight", {kv, kHidden}, 0.3f);
    add(p + "self_attn.o_proj.weight", {kHidden, q}, 0.3f);
    add(p + "self_attn.q_norm.weight", {kHeadDim}, 0.1f);
    add(p + "self_attn.k_norm.weight", {kHeadDim}, 0.1f);
    add(p + "post_attention_layernorm.weight", {kHidden}, 0.1f);
    add(p + "pre_feedforward_layernorm.weight", {kHidden}, 0.1f);
    add(p + "post_feedforward_layernorm.weight", {kHidden}, 0.1f);
    add(p + "mlp.gate_proj.weight", {kFfn, kHidden}, 0.3f);
    add(p + "mlp.up_proj.weight", {kFfn, kHidden}, 0.3f);
    add(p + "mlp.down_proj.weight", {kHidden, kFfn}, 0.3f);
  }
  add("norm.weight", {kHidden}, 0.1f);
  return t;
}

// transformers 5's Gemma3TextConfig as save_pretrained writes it (the keys roofline reads).
ojson text_config_v5() {
  ojson layer_types = ojson::array();
  for (int il = 0; il < kLayers; ++il) layer_types.push_back(il % 6 < 5 ? "sliding_attention" : "full_attention");
  return {{"model_type", "gemma3_text"},
          {"hidden_size", kHidden},
          {"intermediate_size", kFfn},
          {"num_hidden_layers", kLayers},
          {"num_attention_heads", kHeads},
          {"num_key_value_heads", kKvHeads},
          {"head_dim", kHeadDim},
          {"vocab_size", kRows},
          {"max_position_embeddings", 4096},
          {"rms_norm_eps", 1e-6},
          {"hidden_activation", "gelu_pytorch_tanh"},
          {"query_pre_attn_scalar", kHeadDim},
          {"sliding_window", 5},
          {"layer_types", layer_types},
          {"attn_logit_softcapping", nullptr},
          {"final_logit_softcapping", nullptr},
          {"rope_parameters",
           {{"full_attention", {{"rope_type", "linear"}, {"factor", 8.0}, {"rope_theta", 1000000.0}}},
            {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 10000.0}}}}},
          {"tie_word_embeddings", true},
          {"bos_token_id", 2},
          {"eos_token_id", 1},
          {"pad_token_id", 0}};
}

std::string make_causal(const std::string& name, const ojson& config, const std::string& dtype = "F32") {
  const std::string dir = test::temp_dir() + "/" + name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  ojson c = config;
  c["architectures"] = {"Gemma3ForCausalLM"};
  std::ofstream(dir + "/config.json") << c.dump(2);
  test::write_safetensors(dir + "/model.safetensors", gemma_tensors("model.", dtype));
  write_spm_tokenizer(dir);
  return dir;
}

std::string convert_folder(const std::string& src, const std::string& outtype = "f32", convert::ConvertResult* result = nullptr) {
  convert::ConvertOptions o;
  o.source = src;
  o.output = src + "-" + outtype + ".gguf";
  o.outtype = outtype;
  o.progress = false;
  o.n_threads = 2;
  const auto r = convert::convert_model(o);
  if (result) *result = r;
  return o.output;
}

std::string convert_error(const std::string& src) {
  try {
    convert_folder(src);
  } catch (const Error& e) {
    return e.what();
  }
  return "(converted)";
}

std::vector<float> values_of(const gguf::TensorInfo& t) {
  std::vector<float> v((size_t)t.n_elements());
  dequantize_rows_ref(t.type, t.data, v.data(), t.n_elements() / t.ne[0], t.ne[0]);
  return v;
}

}  // namespace

// Names, order, shapes, types and values against the HF tensors; the metadata as llama.cpp writes it.
TEST(Gemma3ConvertTest, CausalLmTensorsAndMetadata) {
  const std::string dir = make_causal("gemma3_causal", text_config_v5());
  convert::ConvertResult result;
  auto f = gguf::GgufFile::open(convert_folder(dir, "f32", &result));
  EXPECT_EQ(result.arch, "gemma3");
  const auto hf = gemma_tensors("model.");
  std::map<std::string, const test::StTensor*> by_hf;
  for (const auto& t : hf) by_hf[t.name] = &t;

  // llama.cpp's order: names sorted within the shard.
  std::vector<std::string> sorted;
  for (const auto& t : hf) sorted.push_back(t.name);
  std::sort(sorted.begin(), sorted.end());
  ASSERT_EQ(f->tensors().size(), sorted.size()) << "no output.weight: tied";
  const std::map<std::string, std::string> suffix = {
      {"input_layernorm.weight", "attn_norm.weight"}, {"self_attn.q_proj.weight", "attn_q.weight"},
      {"self_attn.k_proj.weight", "attn_k.weight"}, {"self_attn.v_proj.weight", "attn_v.weight"},
      {"self_attn.o_proj.weight", "attn_output.weight"}, {"self_attn.q_norm.weight", "attn_q_norm.weight"},
      {"self_attn.k_norm.weight", "attn_k_norm.weight"}, {"post_attention_layernorm.weight", "post_attention_norm.weight"},
      {"pre_feedforward_layernorm.weight", "ffn_norm.weight"}, {"post_feedforward_layernorm.weight", "post_ffw_norm.weight"},
      {"mlp.gate_proj.weight", "ffn_gate.weight"}, {"mlp.up_proj.weight", "ffn_up.weight"}, {"mlp.down_proj.weight", "ffn_down.weight"}};
  // llama.cpp's count without tokenizer.model: model.vocab (268) + added_tokens (6, four of them also in
  // the vocab) = 274 rows kept of 320; the token list is padded to them.
  const int n_tokens = 274;
  for (size_t i = 0; i < sorted.size(); ++i) {
    const test::StTensor& src = *by_hf[sorted[i]];
    const gguf::TensorInfo& t = f->tensors()[i];
    std::string want = sorted[i] == "model.embed_tokens.weight" ? "token_embd.weight" : "output_norm.weight";
    if (sorted[i].rfind("model.layers.", 0) == 0) {
      const size_t dot = sorted[i].find('.', 13);
      want = "blk." + sorted[i].substr(13, dot - 13) + "." + suffix.at(sorted[i].substr(dot + 1));
    }
    ASSERT_EQ(t.name, want) << i;
    const bool norm = want.find("norm") != std::string::npos;
    EXPECT_EQ(t.type, DType::F32) << want;
    const auto v = values_of(t);
    const bool embd = want == "token_embd.weight";
    ASSERT_EQ(v.size(), embd ? (size_t)n_tokens * kHidden : src.values.size()) << want;
    for (size_t k = 0; k < v.size(); ++k) ASSERT_EQ(v[k], src.values[k] + (norm ? 1.0f : 0.0f)) << want << " " << k;
    if (embd) EXPECT_EQ(t.ne[1], n_tokens) << "trimmed to the tokenizer's tokens";
  }

  const gguf::Metadata& md = f->metadata();
  EXPECT_EQ(md.get_string("general.architecture"), "gemma3");
  EXPECT_EQ(md.get_int("gemma3.block_count"), kLayers);
  EXPECT_EQ(md.get_int("gemma3.context_length"), 4096);
  EXPECT_EQ(md.get_int("gemma3.attention.key_length"), kHeadDim);
  EXPECT_EQ(md.get_int("gemma3.attention.sliding_window"), 5);
  EXPECT_FALSE(md.contains("gemma3.attention.sliding_window_pattern")) << "the default pattern is not written";
  EXPECT_FALSE(md.contains("gemma3.final_logit_softcapping"));
  EXPECT_FALSE(md.contains("gemma3.attention.scale"));
  EXPECT_DOUBLE_EQ(md.get_float("gemma3.rope.freq_base"), 1000000.0);
  EXPECT_DOUBLE_EQ(md.get_float("gemma3.rope.freq_base_swa"), 10000.0);
  EXPECT_EQ(md.get_string("gemma3.rope.scaling.type"), "linear");
  EXPECT_DOUBLE_EQ(md.get_float("gemma3.rope.scaling.factor"), 8.0);
  EXPECT_EQ(md.get_string("tokenizer.ggml.model"), "llama");
  EXPECT_EQ(md.get_int("tokenizer.ggml.bos_token_id"), 2);
  EXPECT_EQ(md.find("tokenizer.ggml.tokens")->as_string_array("tokens").size(), (size_t)n_tokens);
  EXPECT_FALSE(md.get_bool_or("tokenizer.ggml.add_space_prefix", true));
  EXPECT_TRUE(md.contains("tokenizer.chat_template"));
  // Keys in llama.cpp's order (TextModel's, then Gemma3Model's new ones).
  std::vector<std::string> order;
  for (const auto& [key, value] : md.entries())
    if (key.rfind("gemma3.", 0) == 0 || key == "general.file_type") order.push_back(key);
  EXPECT_EQ(order, (std::vector<std::string>{"gemma3.block_count", "gemma3.context_length", "gemma3.embedding_length",
                                             "gemma3.feed_forward_length", "gemma3.attention.head_count",
                                             "gemma3.attention.head_count_kv", "gemma3.rope.scaling.type",
                                             "gemma3.rope.scaling.factor", "gemma3.rope.freq_base", "gemma3.rope.freq_base_swa",
                                             "gemma3.attention.layer_norm_rms_epsilon", "gemma3.attention.key_length",
                                             "gemma3.attention.value_length", "general.file_type",
                                             "gemma3.attention.sliding_window"}));

  // It loads as llama.cpp would read it, and runs.
  auto model = Model::load(f);
  EXPECT_EQ(model->hparams().n_vocab, n_tokens);
  EXPECT_TRUE(model->tied_embeddings());
  EXPECT_FALSE(model->hparams().is_sliding(5));
  EXPECT_TRUE(model->hparams().is_sliding(6));
  EngineOptions eo;
  eo.n_threads = 2;
  eo.n_ctx = 64;
  auto engine = Engine::create(model, eo);
  const int seq = engine->memory().create_sequence();
  const std::vector<int32_t> toks = {2, 265, 100, 7, 266, 40, 41, 42, 43, 44};
  const auto logits = engine->eval(seq, toks, false);
  ASSERT_EQ(logits.size(), (size_t)n_tokens);
  for (float x : logits) ASSERT_TRUE(std::isfinite(x));
}

// Gemma3ForConditionalGeneration: the text tower (model.language_model.*) converts to the same tensors
// as the causal model's; the vision tower and projector are left out with a note.
TEST(Gemma3ConvertTest, ConditionalGenerationTextTower) {
  const std::string causal = make_causal("gemma3_for_vl_compare", text_config_v5());
  const std::string dir = test::temp_dir() + "/gemma3_vl";
  fs::remove_all(dir);
  fs::create_directories(dir);
  ojson c = {{"architectures", {"Gemma3ForConditionalGeneration"}},
             {"model_type", "gemma3"},
             {"text_config", text_config_v5()},
             {"vision_config", {{"hidden_size", 32}, {"model_type", "siglip_vision_model"}}},
             {"mm_tokens_per_image", 4}};
  std::ofstream(dir + "/config.json") << c.dump(2);
  auto tensors = gemma_tensors("model.language_model.");
  tensors.push_back({"model.vision_tower.vision_model.embeddings.patch_embedding.weight", "F32", {32, 3, 2, 2},
                     test::test_values(32 * 12, 99)});
  tensors.push_back({"model.multi_modal_projector.mm_input_projection_weight", "F32", {32, kHidden}, test::test_values(32 * kHidden, 98)});
  tensors.push_back({"model.multi_modal_projector.mm_soft_emb_norm.weight", "F32", {32}, test::test_values(32, 97)});
  test::write_safetensors(dir + "/model.safetensors", tensors);
  write_spm_tokenizer(dir);
  convert::ConvertResult result;
  auto vl = gguf::GgufFile::open(convert_folder(dir, "f32", &result));
  auto text = gguf::GgufFile::open(convert_folder(causal));
  bool noted = false;
  for (const auto& n : result.notes) noted = noted || n.find("skipped 3 vision tensors") != std::string::npos;
  EXPECT_TRUE(noted);
  ASSERT_EQ(vl->tensors().size(), text->tensors().size());
  for (size_t i = 0; i < vl->tensors().size(); ++i) {
    const auto& a = vl->tensors()[i];
    const auto& b = text->tensors()[i];
    ASSERT_EQ(a.name, b.name);
    ASSERT_EQ(a.n_bytes, b.n_bytes);
    EXPECT_EQ(0, std::memcmp(a.data, b.data, a.n_bytes)) << a.name;
  }
  for (const char* key : {"gemma3.attention.sliding_window", "gemma3.rope.freq_base_swa", "gemma3.rope.scaling.factor"})
    EXPECT_TRUE(vl->metadata().contains(key)) << key;
}

// A transformers 4.x config (rope_theta + rope_local_base_freq + rope_scaling, sliding_window_pattern)
// gives the same hyperparameters; an f16 source gets its +1 rounded to f16 as torch does.
TEST(Gemma3ConvertTest, OlderConfigAndF16Source) {
  ojson c = text_config_v5();
  c.erase("rope_parameters");
  c.erase("layer_types");
  c["rope_theta"] = 1000000.0;
  c["rope_local_base_freq"] = 10000.0;
  c["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 8.0}};
  c["sliding_window_pattern"] = 6;
  const std::string dir = make_causal("gemma3_v4", c, "F16");
  auto f = gguf::GgufFile::open(convert_folder(dir, "auto"));
  const gguf::Metadata& md = f->metadata();
  EXPECT_DOUBLE_EQ(md.get_float("gemma3.rope.freq_base"), 1000000.0);
  EXPECT_DOUBLE_EQ(md.get_float("gemma3.rope.freq_base_swa"), 10000.0);
  EXPECT_DOUBLE_EQ(md.get_float("gemma3.rope.scaling.factor"), 8.0);
  EXPECT_EQ(md.get_int("gemma3.attention.sliding_window"), 5);
  EXPECT_FALSE(md.contains("gemma3.attention.sliding_window_pattern"));
  for (const auto& t : f->tensors()) {
    if (t.name != "blk.0.attn_norm.weight") continue;
    const auto v = values_of(t);
    const auto src = gemma_tensors("model.", "F16")[1].values;
    for (size_t k = 0; k < v.size(); ++k) EXPECT_EQ(v[k], round_to_fp16(round_to_fp16(src[k]) + 1.0f)) << k;
  }
  EXPECT_EQ(f->tensors()[0].type, DType::F16) << "auto keeps an f16 source f16";
}

// Sliding layers other than every 6th global: written as the pattern key llama.cpp reads (a period),
// or per layer; the loaded model has them.
TEST(Gemma3ConvertTest, OtherSlidingPatterns) {
  ojson c = text_config_v5();
  for (int il = 0; il < kLayers; ++il) c["layer_types"][il] = il % 3 == 2 ? "full_attention" : "sliding_attention";
  auto f = gguf::GgufFile::open(convert_folder(make_causal("gemma3_p3", c)));
  EXPECT_EQ(f->metadata().get_int("gemma3.attention.sliding_window_pattern"), 3);
  auto m = Model::load(f);
  for (int il = 0; il < kLayers; ++il) EXPECT_EQ(m->hparams().is_sliding(il), il % 3 != 2) << il;
  c["layer_types"][0] = "full_attention";  // no period gives this
  auto g = gguf::GgufFile::open(convert_folder(make_causal("gemma3_irregular", c)));
  auto m2 = Model::load(g);
  EXPECT_FALSE(m2->hparams().is_sliding(0));
  EXPECT_TRUE(m2->hparams().is_sliding(1));
  EXPECT_FALSE(m2->hparams().is_sliding(2));
}

// What a gemma3 GGUF cannot say is refused, in one line naming the key.
TEST(Gemma3ConvertTest, UnrepresentableConfigsAreRefused) {
  struct Case {
    const char* key;
    ojson value;
    const char* expect;
  };
  const Case cases[] = {
      {"query_pre_attn_scalar", 32, "query_pre_attn_scalar"},
      {"hidden_activation", "gelu", "hidden_activation"},
      {"attn_logit_softcapping", 50.0, "attn_logit_softcapping"},
      {"use_bidirectional_attention", true, "use_bidirectional_attention"},
  };
  for (const Case& k : cases) {
    ojson c = text_config_v5();
    c[k.key] = k.value;
    const std::string m = convert_error(make_causal(std::string("gemma3_bad_") + k.key, c));
    EXPECT_NE(m.find(k.expect), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
  // A missing tensor is named.
  const std::string dir = make_causal("gemma3_missing", text_config_v5());
  auto t = gemma_tensors("model.");
  t.erase(std::find_if(t.begin(), t.end(), [](const auto& x) { return x.name == "model.layers.3.post_feedforward_layernorm.weight"; }));
  test::write_safetensors(dir + "/model.safetensors", t);
  const std::string m = convert_error(dir);
  EXPECT_NE(m.find("missing model.layers.3.post_feedforward_layernorm.weight"), std::string::npos) << m;
}
