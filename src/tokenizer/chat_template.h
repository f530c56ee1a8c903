// Chat templates: OpenAI-style messages (+ tools, template kwargs) rendered into a prompt through the
// model's Jinja template, with the variables transformers' apply_chat_template passes (messages,
// tools, documents, add_generation_prompt, bos_token, eos_token, ...).
#pragma once

#include <ctime>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "formats/gguf_metadata.h"

namespace roofline {

namespace jinja {
class Template;
}

struct ChatTemplateInputs {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json tools;  // null: no tools (the template sees none)
  bool add_generation_prompt = false;
  nlohmann::ordered_json kwargs = nlohmann::ordered_json::object();  // extra variables, e.g. enable_thinking
  std::string bos_token, eos_token, pad_token, unk_token;             // "" leaves the variable undefined
  std::time_t now = 0;                                                // strftime_now's clock (0: now)
};

class ChatTemplate {
 public:
  // Parses the template; throws Error("chat template: template line N: ...") on syntax errors.
  explicit ChatTemplate(const std::string& source);
  ~ChatTemplate();
  const std::string& source() const { return source_; }
  // Renders; throws Error with the template's message (raise_exception) or the failing line.
  std::string apply(const ChatTemplateInputs& inputs) const;

 private:
  std::string source_;
  std::unique_ptr<jinja::Template> tmpl_;
};

// OpenAI messages as templates expect them: tool_calls[].function.arguments given as a JSON string
// is parsed into an object (as transformers users pass it); other fields are kept unchanged.
nlohmann::ordered_json normalize_chat_messages(const nlohmann::ordered_json& messages);

// The chat template stored in GGUF metadata ("" if none); `name` picks tokenizer.chat_template.NAME.
std::string chat_template_from_metadata(const gguf::Metadata& md, const std::string& name = "");

}  // namespace roofline
