// Qwen3.5 conversion failures (one line, exit 1, nothing written) for malformed folders; the general.*
// heuristics against values computed by llama.cpp's own gguf-py code; and the qwen35 pre-tokenizer
// (combining marks stay in letter runs, unlike qwen2), detected from Qwen3.5's tokenizer.json.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "convert/convert.h"
#include "convert/convert_hf_util.h"
#include "formats/gguf.h"
#include "formats/hf_tokenizer.h"
#include "qwen35_test_util.h"
#include "test_util.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"

using namespace roofline;
namespace fs = std::filesystem;

namespace {

std::string fresh(const std::string& name) {
  const std::string d = test::temp_dir() + "/" + name;
  fs::create_directories(d);
  return d;
}

// Converts through the CLI and checks the failure contract; returns the error line.
std::string fails(const std::string& dir) {
  const std::string out = fresh(fs::path(dir).filename().string() + "-out") + "/m.gguf";
  const auto r = test::run_cli({"convert", dir, "-o", out});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  std::string err = r.err;
  while (!err.empty() && err.back() == '\n') err.pop_back();
  EXPECT_EQ(err.find('\n'), std::string::npos) << "more than one line: " << r.err;
  EXPECT_FALSE(fs::exists(out));
  for (const auto& e : fs::directory_iterator(fs::path(out).parent_path()))
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
  return err;
}

std::vector<std::string> split(std::string_view text, const PreTokenizer& pre) {
  std::vector<std::string_view> v;
  pre.split(text, v);
  return {v.begin(), v.end()};
}

}  // namespace

TEST(Qwen35ConvertErrorsTest, TensorsMissingMisshapedUnexpected) {
  test::SynthQ35 s;
  auto ts = test::q35_tensors(s);
  std::vector<test::StTensor> kept;
  for (auto& t : ts) {
    if (t.name == "model.language_model.layers.2.linear_attn.A_log") continue;
    if (t.name == "model.language_model.layers.0.linear_attn.in_proj_z.weight") t.shape = {40, 64}, t.values.resize(40 * 64);
    kept.push_back(t);
  }
  kept.push_back({"model.language_model.layers.1.linear_attn.out_proj.weight", "F32", {64, 48}, test::test_values(64 * 48, 3)});
  const std::string dir = fresh("q35-badtensors");
  test::write_q35(dir, s, kept);
  const std::string e = fails(dir);
  EXPECT_NE(e.find("do not match a Qwen3_5ForConditionalGeneration model"), std::string::npos) << e;
  EXPECT_NE(e.find("missing model.layers.2.linear_attn.A_log"), std::string::npos) << e;
  EXPECT_NE(e.find("model.language_model.layers.0.linear_attn.in_proj_z.weight has shape [40, 64], expected [48, 64]"),
            std::string::npos) << e;
  EXPECT_NE(e.find("unexpected model.language_model.layers.1.linear_attn.out_proj.weight"), std::string::npos) << e;
}

TEST(Qwen35ConvertErrorsTest, ConfigKeysAndHeadCounts) {
  struct Case {
    const char* name;
    nlohmann::ordered_json extra;
    const char* want;
  };
  const Case cases[] = {
      {"nokheads", {{"linear_num_key_heads", nullptr}}, "\"linear_num_key_heads\" is missing"},
      {"vheads", {{"linear_num_value_heads", 5}}, "linear_num_value_heads 5 is not a multiple of linear_num_key_heads 2"},
      {"kvheads", {{"num_key_value_heads", 3}}, "num_attention_heads 4 is not a multiple of num_key_value_heads 3"},
      {"types", {{"layer_types", {"linear_attention", "full_attention", "full_attention", "full_attention"}}},
       "layer_types[2] is full_attention, which full_attention_interval 2 does not give"},
      {"theta", {{"rope_parameters", {{"rope_type", "default"}}}}, "\"rope_theta\" is missing"},
      {"ropetype", {{"rope_parameters", {{"rope_type", "llama3"}, {"rope_theta", 1e6}}}}, "rope type 'llama3' is not supported"},
      {"headdim", {{"head_dim", "x"}}, "\"head_dim\" is not an integer"},
      {"bias", {{"attention_bias", true}}, "attention_bias true is not supported"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    test::SynthQ35 s;
    s.extra_text_config = c.extra;
    const std::string dir = fresh(std::string("q35-cfg-") + c.name);
    test::write_q35(dir, s);
    const std::string e = fails(dir);
    EXPECT_NE(e.find(c.want), std::string::npos) << e;
    EXPECT_NE(e.find("config.json (text_config)"), std::string::npos) << e;
  }
}

TEST(Qwen35ConvertErrorsTest, GeneralMetadataFollowsGgufPy) {
  // Expected values printed by llama.cpp's gguf-py (Metadata.get_model_id_components, id_to_title,
  // model_weight_count_rounded_notation) for these inputs.
  struct IdCase {
    const char* id;
    int64_t params;
    const char *name, *org, *basename, *finetune, *version, *size_label;
  };
  const IdCase ids[] = {
      {"qwen35-cg-f32", 300000, "Qwen35 Cg F32", nullptr, nullptr, nullptr, nullptr, nullptr},
      {"Qwen3.5-0.8B-Instruct", 300000, "Qwen3.5 0.8B Instruct", nullptr, "Qwen3.5", "0.8b-Instruct", nullptr, nullptr},
      {"Qwen/Qwen3.5-27B", 27000000000, "Qwen3.5 27B", "Qwen", "Qwen3.5", nullptr, nullptr, "27B"},
      {"qwen3.5-tiny-v2", 123456, "Qwen3.5 Tiny v2", nullptr, "qwen3.5-tiny", nullptr, "v2", nullptr},
      {"Meta-Llama-3.1-8B-Instruct", 8000000000, "Meta Llama 3.1 8B Instruct", nullptr, "Meta-Llama-3.1", "Instruct", nullptr, "8B"},
      {"tiny_model", 1000, "Tiny_Model", nullptr, nullptr, nullptr, nullptr, nullptr},
      {"bloom-7b1", 7100000000, "Bloom 7b1", nullptr, "bloom", nullptr, nullptr, "7.1B"},
      {"mixtral-8x7B-v0.1", 46000000000, "Mixtral 8x7B v0.1", nullptr, "mixtral", nullptr, "v0.1", "8x7B"},
      {"Qwen3.5-35B-A3B-FP8", 35000000000, "Qwen3.5 35B A3B FP8", nullptr, "Qwen3.5", "FP8", nullptr, "35B-A3B"},
      {"x-small-7B", 7000000000, "X Small 7B", nullptr, "x-small", nullptr, nullptr, "7B"},
      {"a-1M-context", 7000000000, "A 1M Context", nullptr, "a", "1m-context", nullptr, nullptr},
  };
  auto opt = [](const std::optional<std::string>& v) { return v ? *v : std::string("(none)"); };
  auto str = [](const char* v) { return v ? std::string(v) : std::string("(none)"); };
  for (const IdCase& c : ids) {
    SCOPED_TRACE(c.id);
    const auto p = convert::model_id_parts(c.id, c.params);
    EXPECT_EQ(convert::model_id_to_title(*p.full_name), c.name);
    EXPECT_EQ(opt(p.org), str(c.org));
    EXPECT_EQ(opt(p.basename), str(c.basename));
    EXPECT_EQ(opt(p.finetune), str(c.finetune));
    EXPECT_EQ(opt(p.version), str(c.version));
    EXPECT_EQ(opt(p.size_label), str(c.size_label));
  }
  const std::pair<int64_t, const char*> labels[] = {{999, "1.0K"},     {52345, "52K"},      {1500000, "1.5M"},
                                                    {2500000, "2.5M"}, {999999, "1000K"},   {1000001, "1.0M"},
                                                    {5, "0.01K"},      {123456789, "123M"}, {9999999, "10M"},
                                                    {2450000, "2.4M"}, {27000000000, "27B"}};
  for (const auto& [n, want] : labels) EXPECT_EQ(convert::weight_count_label(n), want) << n;
  EXPECT_EQ(convert::model_id_to_title("abc1def xyz"), "Abc1Def Xyz");
  EXPECT_EQ(convert::model_id_to_title("v1.2 3rd Mixed hello_world"), "v1.2 3rd Mixed Hello_World");

  // README front matter, generation_config.json and _name_or_path, in set_gguf_meta_model's order.
  const std::string dir = fresh("Qwen3.5-2B");
  std::ofstream(dir + "/README.md") << "---\nlicense: apache-2.0\nlicense_link: https://example.com/LICENSE\n"
                                       "pipeline_tag: image-text-to-text\nlibrary_name: transformers\ntags:\n- qwen\n"
                                       "base_model:\n- Qwen/Qwen3.5-2B-Base\n---\n# Qwen3.5\n";
  std::ofstream(dir + "/generation_config.json") << R"({"do_sample": true, "temperature": 0.6, "top_k": 20, "top_p": 0.95})";
  gguf::Metadata md;
  convert::add_general_metadata(md, dir, nlohmann::json{{"_name_or_path", "Qwen/Qwen3.5-2B"}}, 2000000000);
  std::vector<std::string> k;
  for (const auto& [key, v] : md.entries()) k.push_back(key);
  const std::vector<std::string> want = {"general.sampling.top_k", "general.sampling.top_p", "general.sampling.temp",
                                         "general.name", "general.organization", "general.basename", "general.size_label",
                                         "general.license", "general.license.link", "general.base_model.count",
                                         "general.base_model.0.name", "general.base_model.0.organization",
                                         "general.base_model.0.repo_url", "general.tags"};
  EXPECT_EQ(k, want);
  EXPECT_EQ(md.find("general.sampling.top_k")->type(), gguf::ValueType::INT32);
  EXPECT_EQ(md.get_int("general.sampling.top_k"), 20);
  EXPECT_EQ((float)md.get_float("general.sampling.temp"), 0.6f);
  EXPECT_EQ(md.get_string("general.name"), "Qwen3.5 2B");
  EXPECT_EQ(md.get_string("general.organization"), "Qwen");
  EXPECT_EQ(md.get_string("general.basename"), "Qwen3.5");
  EXPECT_EQ(md.get_string("general.size_label"), "2B");
  EXPECT_EQ(md.get_string("general.license"), "apache-2.0");
  EXPECT_EQ(md.get_string("general.base_model.0.name"), "Qwen3.5 2B Base");
  EXPECT_EQ(md.get_string("general.base_model.0.repo_url"), "https://huggingface.co/Qwen/Qwen3.5-2B-Base");
  EXPECT_EQ(md.find("general.tags")->as_string_array(), (std::vector<std::string>{"qwen", "image-text-to-text"}));
}

TEST(Qwen35PreTokenizerTest, CombiningMarksStayInLetterRuns) {
  const PreTokenizerSpec* q2 = find_pre_tokenizer("qwen2");
  const PreTokenizerSpec* q35 = find_pre_tokenizer("qwen35");
  ASSERT_TRUE(q2 && q35);
  EXPECT_TRUE(q35->nfc);
  const PreTokenizer p2(*q2), p35(*q35);
  using V = std::vector<std::string>;
  // q + U+0301 (no precomposed form, NFC keeps it): qwen2 splits the mark off, qwen35 keeps one letter run.
  EXPECT_EQ(split("q\xCC\x81yz a", p2), (V{"q", "\xCC\x81yz", " a"}));
  EXPECT_EQ(split("q\xCC\x81yz a", p35), (V{"q\xCC\x81yz", " a"}));
  // Devanagari vowel signs and virama are marks (Mn/Mc).
  const std::string namaste = "\xE0\xA4\xA8\xE0\xA4\xAE\xE0\xA4\xB8\xE0\xA5\x8D\xE0\xA4\xA4\xE0\xA5\x87";  // नमस्ते
  EXPECT_EQ(split(" " + namaste + "!", p35), (V{" " + namaste, "!"}));
  EXPECT_GT(split(" " + namaste + "!", p2).size(), 2u);
  // A lone mark after a space: qwen2's punctuation run takes it, qwen35's letter run does.
  EXPECT_EQ(split("a \xCC\x81!", p2), (V{"a", " \xCC\x81!"}));
  EXPECT_EQ(split("a \xCC\x81!", p35), (V{"a", " \xCC\x81", "!"}));
  // ASCII text splits the same way.
  const std::string ascii = "Hello, world! It's 2025:\n\n  done.";
  EXPECT_EQ(split(ascii, p2), split(ascii, p35));
  EXPECT_EQ(pre_tokenizer_name_for({test::kQwen35Regex}), "qwen35");
}

TEST(Qwen35PreTokenizerTest, TokenizerFromQwen35TokenizerJson) {
  // A byte-level vocabulary with merges across the mark: only qwen35's split lets them apply.
  const std::string dir = fresh("q35-tok");
  test::write_byte_level_tokenizer(dir, test::kQwen35Regex);
  nlohmann::ordered_json tj = nlohmann::ordered_json::parse(std::ifstream(dir + "/tokenizer.json"));
  const std::string x = "q", m1 = test::gpt2_byte_token(0xCC), m2 = test::gpt2_byte_token(0x81);
  tj["model"]["vocab"][x + m1] = 256;
  tj["model"]["vocab"][x + m1 + m2] = 257;
  tj["model"]["merges"] = {x + " " + m1, x + m1 + " " + m2};
  for (auto& a : tj["added_tokens"]) a["id"] = a["id"].get<int>() + 2;
  std::ofstream(dir + "/tokenizer.json") << tj.dump();
  gguf::Metadata md;
  add_hf_tokenizer_metadata(md, dir + "/tokenizer.json");
  EXPECT_EQ(md.get_string("tokenizer.ggml.pre"), "qwen35");
  const auto tok35 = Tokenizer::from_metadata(md);
  EXPECT_EQ(tok35->encode("q\xCC\x81", false, false), (std::vector<int32_t>{257}));
  EXPECT_EQ(tok35->decode({257}), "q\xCC\x81");
  md.set("tokenizer.ggml.pre", gguf::Value::string("qwen2"));
  const auto tok2 = Tokenizer::from_metadata(md);
  EXPECT_EQ(tok2->encode("q\xCC\x81", false, false), (std::vector<int32_t>{'q', 0xCC, 0x81}));
}

TEST(Qwen35PreTokenizerTest, SpecialIdsInLlamaCppsOrderWithTextConfigFallback) {
  // tokenizer_config.json names eos and pad; bos comes from config.json's text_config (as gguf-py's
  // SpecialVocab does for multimodal configs), and is written after them.
  const std::string dir = fresh("q35-specials");
  test::write_byte_level_tokenizer(dir, test::kQwen35Regex);
  std::ofstream(dir + "/tokenizer_config.json") << R"({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": null})";
  std::ofstream(dir + "/config.json") << R"({"architectures": ["Qwen3_5ForConditionalGeneration"], "text_config": {"bos_token_id": 257, "eos_token_id": 256, "pad_token_id": [1]}})";
  gguf::Metadata md;
  add_hf_tokenizer_metadata(md, dir + "/tokenizer.json");
  std::vector<std::string> ids;
  for (const auto& [k, v] : md.entries())
    if (k.size() > 9 && k.compare(k.size() - 9, 9, "_token_id") == 0) ids.push_back(k);
  EXPECT_EQ(ids, (std::vector<std::string>{"tokenizer.ggml.eos_token_id", "tokenizer.ggml.padding_token_id",
                                           "tokenizer.ggml.bos_token_id"}));
  EXPECT_EQ(md.get_int("tokenizer.ggml.eos_token_id"), 258);
  EXPECT_EQ(md.get_int("tokenizer.ggml.padding_token_id"), 256);
  EXPECT_EQ(md.get_int("tokenizer.ggml.bos_token_id"), 257);
  EXPECT_FALSE(md.contains("tokenizer.ggml.merges"));  // no merges: no empty array (llama.cpp writes none)
}
