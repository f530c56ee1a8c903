// `roofline template -m MODEL.gguf|tokenizer_config.json --messages MESSAGES.json
// [--add-generation-prompt] [--kwargs JSON] [--tools TOOLS.json] [--chat-template-file FILE.jinja]`:
// prints the prompt the model's chat template renders, byte for byte (no newline added).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "cli/model_options.h"
#include "core/error.h"
#include "model/model_file.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace roofline::cli {
namespace {

using nlohmann::ordered_json;

ordered_json read_json_file(const std::string& path, const char* flag) {
  try {
    return ordered_json::parse(read_file_or_fail(path, flag));
  } catch (const ordered_json::exception& e) {
    fail("{}: not valid JSON: {}", path, e.what());
  }
}

std::string token_content(const ordered_json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return "";
}

int run(int argc, char** argv) {
  CLI::App app{"Render a chat through the model's chat template"};
  std::string model, messages_path, kwargs_text, tools_path, template_file;
  bool add_generation_prompt = false;
  app.add_option("-m,--model", model, "GGUF model or vocabulary, tokenizer_config.json, or synthetic:SHAPE:MIX")->required();
  app.add_option("--messages", messages_path, "JSON file: an OpenAI-style messages array")->required();
  app.add_flag("--add-generation-prompt", add_generation_prompt, "end with the start of the assistant's turn");
  app.add_option("--kwargs", kwargs_text, "JSON object of extra template variables, e.g. '{\"enable_thinking\":false}'");
  app.add_option("--tools", tools_path, "JSON file: an OpenAI tools array");
  app.add_option("--chat-template-file", template_file, "use this Jinja template instead of the model's");
  if (int rc = parse_args(app, argc, argv); rc >= 0) return rc;

  ChatTemplateInputs in;
  std::string source;
  if (model.size() >= 5 && model.compare(model.size() - 5, 5, ".json") == 0) {
    const ordered_json cfg = read_json_file(model, "-m");
    if (cfg.contains("chat_template")) {
      const auto& ct = cfg["chat_template"];
      if (ct.is_string()) source = ct.get<std::string>();
      else if (ct.is_array())
        for (const auto& t : ct)
          if (t.value("name", "") == "default") source = t.value("template", "");
    }
    in.bos_token = token_content(cfg.value("bos_token", ordered_json()));
    in.eos_token = token_content(cfg.value("eos_token", ordered_json()));
    in.pad_token = token_content(cfg.value("pad_token", ordered_json()));
    in.unk_token = token_content(cfg.value("unk_token", ordered_json()));
  } else {
    auto mf = open_model_file(model);
    source = chat_template_from_metadata(mf->metadata());
    if (mf->metadata().contains("tokenizer.ggml.tokens")) {
      auto tok = Tokenizer::from_metadata(mf->metadata());
      in.bos_token = tok->special_text(tok->bos());
      in.eos_token = tok->special_text(tok->eos());
      in.pad_token = tok->special_text(tok->pad());
      in.unk_token = tok->special_text(tok->unk());
    }
  }
  if (!template_file.empty()) source = read_file_or_fail(template_file, "--chat-template-file");
  if (source.empty()) fail("{}: has no chat template (pass one with --chat-template-file)", model);

  ordered_json messages = read_json_file(messages_path, "--messages");
  if (messages.is_object() && messages.contains("messages")) messages = messages["messages"];
  in.messages = messages;
  if (!tools_path.empty()) {
    ordered_json tools = read_json_file(tools_path, "--tools");
    if (tools.is_object() && tools.contains("tools")) tools = tools["tools"];
    in.tools = tools;
  }
  if (!kwargs_text.empty()) {
    try {
      in.kwargs = ordered_json::parse(kwargs_text);
    } catch (const ordered_json::exception& e) {
      fail("--kwargs is not valid JSON: {}", e.what());
    }
  }
  in.add_generation_prompt = add_generation_prompt;
  const ChatTemplate tmpl(source);
  const std::string out = tmpl.apply(in);
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

int run_template(int argc, char** argv) { return run_guarded(run, argc, argv); }
const CommandRegistration registration{"template", "render a chat through the model's chat template", run_template, 61};

}  // namespace
}  // namespace roofline::cli
