// libFuzzer target: a chat template (the text a GGUF file carries, so untrusted) parsed and rendered over
// a fixed conversation with tools. It must render or fail with roofline::Error, within libFuzzer's time
// and memory limits (a template that loops or grows without bound must be stopped by the interpreter).
// With a NUL in the input, the part after it is the messages array as JSON instead (when it parses).
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/fuzz/libfuzzer/fuzz_common.h"
#include "tokenizer/chat_template.h"

using namespace roofline;
using json = nlohmann::ordered_json;

namespace {

const json& default_messages() {
  static const json m = json::parse(R"([
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "id": "c1",
      "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "{\"t\": 21.5}"},
    {"role": "assistant", "content": "<think>ok</think>21.5 C"},
    {"role": "user", "content": [{"type": "text", "text": "thanks"}]}
  ])");
  return m;
}

const json& tools() {
  static const json t = json::parse(R"([{"type": "function", "function": {"name": "get_weather", "description": "d",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])");
  return t;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto [source, messages_text] = fuzz::split_at_nul({reinterpret_cast<const char*>(data), size});
  ChatTemplateInputs in;
  in.messages = default_messages();
  if (!messages_text.empty()) {
    try {
      json m = json::parse(messages_text);
      if (m.is_array()) in.messages = normalize_chat_messages(m);
    } catch (const nlohmann::json::exception&) {
    } catch (const Error&) {
    }
  }
  in.tools = tools();
  in.add_generation_prompt = true;
  in.kwargs = {{"enable_thinking", false}};
  in.bos_token = "<s>";
  in.eos_token = "</s>";
  in.now = 1700000000;
  try {
    ChatTemplate t{std::string(source)};
    t.apply(in);
  } catch (const InternalError& e) {
    fuzz::defect("jinja", e.what());
  } catch (const Error&) {
  } catch (const std::exception& e) {
    fuzz::defect("jinja", e.what());
  }
  return 0;
}
