// Chat template rendering on top of the Jinja interpreter, with transformers' variables.
#include "tokenizer/chat_template.h"

#include "core/error.h"
#include "core/json_nesting.h"
#include "tokenizer/jinja/template.h"

namespace roofline {

using nlohmann::ordered_json;

ChatTemplate::ChatTemplate(const std::string& source) : source_(source) {
  try {
    tmpl_ = std::make_unique<jinja::Template>(source);
  } catch (const Error& e) {
    fail("chat template: {}", e.what());
  }
}

ChatTemplate::~ChatTemplate() = default;

ordered_json normalize_chat_messages(const ordered_json& messages) {
  if (!messages.is_array()) fail("messages must be a JSON array of {{role, content}} objects");
  ordered_json out = messages;
  for (auto& m : out) {
    if (!m.is_object()) fail("each message must be a JSON object");
    if (!m.contains("tool_calls") || !m["tool_calls"].is_array()) continue;
    for (auto& tc : m["tool_calls"]) {
      ordered_json* fn = tc.is_object() && tc.contains("function") && tc["function"].is_object() ? &tc["function"] : &tc;
      if (!fn->is_object() || !fn->contains("arguments") || !(*fn)["arguments"].is_string()) continue;
      const std::string s = (*fn)["arguments"].get<std::string>();
      if (json_nesting_depth(s) > kMaxJsonNesting) continue;  // left as the string it is
      try {
        (*fn)["arguments"] = ordered_json::parse(s);
      } catch (const ordered_json::exception&) {
        // Not JSON: left as the string it is.
      }
    }
  }
  return out;
}

std::string ChatTemplate::apply(const ChatTemplateInputs& in) const {
  ordered_json ctx = ordered_json::object();
  if (!in.bos_token.empty()) ctx["bos_token"] = in.bos_token;
  if (!in.eos_token.empty()) ctx["eos_token"] = in.eos_token;
  if (!in.pad_token.empty()) ctx["pad_token"] = in.pad_token;
  if (!in.unk_token.empty()) ctx["unk_token"] = in.unk_token;
  ctx["messages"] = normalize_chat_messages(in.messages);
  ctx["tools"] = in.tools;
  ctx["documents"] = nullptr;
  ctx["add_generation_prompt"] = in.add_generation_prompt;
  if (!in.kwargs.is_null()) {
    if (!in.kwargs.is_object()) fail("template kwargs must be a JSON object");
    for (auto it = in.kwargs.begin(); it != in.kwargs.end(); ++it) ctx[it.key()] = it.value();
  }
  jinja::RenderOptions opt;
  opt.now = in.now;
  return tmpl_->render(ctx, opt);
}

std::string chat_template_from_metadata(const gguf::Metadata& md, const std::string& name) {
  const std::string key = name.empty() ? "tokenizer.chat_template" : "tokenizer.chat_template." + name;
  return md.get_string_or(key, "");
}

}  // namespace roofline
