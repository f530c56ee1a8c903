// Real chat templates (Qwen3, Qwen2.5, Llama 3.1, Gemma 3) rendered over the conversations of
// scripts/goldens/conversations.json must equal Jinja2's output byte for byte
// (goldens from scripts/goldens/gen_template_goldens.py), errors included.
#include <gtest/gtest.h>

#include "core/error.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer_test_util.h"

namespace roofline {
namespace {

using nlohmann::ordered_json;

std::string json_or_xz(const std::string& path) {
  if (path.size() > 3 && path.compare(path.size() - 3, 3, ".xz") == 0) return test::read_text_file(test::unxz_to_temp(path));
  return test::read_text_file(path);
}

std::string token_content(const ordered_json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content")) return v["content"].get<std::string>();
  return "";
}

TEST(TemplateChat, MatchesJinja2Goldens) {
  ROOFLINE_SHARED_PATH_OR_SKIP(td, "testdata");
  const auto golden = nlohmann::json::parse(test::read_text_file(test::source_dir() + "/tests/tokenizer/goldens/templates.json"));
  const auto conversations =
      ordered_json::parse(test::read_text_file(test::source_dir() + "/scripts/goldens/conversations.json"));
  // Config holding each template's special tokens.
  const std::map<std::string, std::string> config_of = {
      {"qwen3", "tokenizer/qwen3/tokenizer_config.json"},
      {"qwen2.5", "tokenizer/qwen3/tokenizer_config.json"},
      {"llama3.1", "tokenizer/llama3_1/tokenizer_config.json"},
      {"llama3_1-config", "tokenizer/llama3_1/tokenizer_config.json"},
      {"gemma3", "tokenizer/gemma3/tokenizer_config.json.xz"}};
  std::map<std::string, std::unique_ptr<ChatTemplate>> templates;
  std::map<std::string, ordered_json> configs;
  for (const auto& [name, rel] : golden["templates"].items()) {
    const std::string src_path = td + "/" + rel.get<std::string>();
    std::string source;
    if (src_path.find(".jinja") != std::string::npos) {
      source = test::read_text_file(src_path);
    } else {
      source = ordered_json::parse(json_or_xz(src_path))["chat_template"].get<std::string>();
    }
    templates[name] = std::make_unique<ChatTemplate>(source);
    configs[name] = ordered_json::parse(json_or_xz(td + "/" + config_of.at(name)));
  }
  int n = 0;
  for (const auto& c : golden["cases"]) {
    const std::string tname = c["template"], cname = c["conversation"];
    const bool agp = c["add_generation_prompt"];
    ordered_json conv;
    for (const auto& x : conversations)
      if (x["name"] == cname && x["add_generation_prompt"] == agp) conv = x;
    ASSERT_FALSE(conv.is_null()) << cname;
    const ordered_json& cfg = configs[tname];
    ChatTemplateInputs in;
    in.messages = conv["messages"];
    in.tools = conv.value("tools", ordered_json());
    in.kwargs = conv.value("kwargs", ordered_json::object());
    in.add_generation_prompt = agp;
    in.bos_token = token_content(cfg.value("bos_token", ordered_json()));
    in.eos_token = token_content(cfg.value("eos_token", ordered_json()));
    in.pad_token = token_content(cfg.value("pad_token", ordered_json()));
    in.unk_token = token_content(cfg.value("unk_token", ordered_json()));
    in.now = test::golden_now();
    const std::string label = tname + " / " + cname + (agp ? " (+generation prompt)" : "");
    if (c.contains("error")) {
      try {
        const std::string out = templates[tname]->apply(in);
        ADD_FAILURE() << label << ": Jinja2 raised \"" << c["error"].get<std::string>() << "\" but roofline rendered:\n" << out;
      } catch (const Error& e) {
        const std::string want = c["error"];
        if (want.rfind("TemplateError: ", 0) == 0) {
          EXPECT_NE(std::string(e.what()).find(want.substr(15)), std::string::npos) << label << ": " << e.what();
        }
      }
    } else {
      std::string out;
      try {
        out = templates[tname]->apply(in);
      } catch (const Error& e) {
        ADD_FAILURE() << label << ": " << e.what();
        continue;
      }
      EXPECT_EQ(out, c["output"].get<std::string>()) << label;
    }
    ++n;
  }
  EXPECT_GT(n, 100);
}

}  // namespace
}  // namespace roofline
