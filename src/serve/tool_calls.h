// Tool calls in the chat completions API: the request's `tools` / `tool_choice` validated, and the
// model's output in the Qwen3 / Qwen3.5 format (`<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`,
// several in a row for parallel calls) split into plain content and OpenAI tool calls, incrementally so
// that streaming can emit content until a call opens and each call once it closes. A call that does not
// parse, or names a function the request did not offer, stays in the content as the text it was.
#pragma once

#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

namespace roofline::serve {

// How the request wants tools used (OpenAI's tool_choice).
// Required and Named are enforced by constrained decoding (structured_output.h).
enum class ToolChoice { None, Auto, Required, Named };

struct ToolsRequest {
  nlohmann::ordered_json tools;     // null when the request has none (the template then sees none)
  ToolChoice choice = ToolChoice::Auto;
  std::set<std::string> names;      // the functions offered
  std::string forced;               // Named: the function the call must name
  bool parallel = true;             // parallel_tool_calls: Required may make several calls
  bool parse_calls() const { return choice != ToolChoice::None && !names.empty(); }
};

// Validates `tools`, `tool_choice` and `parallel_tool_calls` of a chat request body. Throws ApiError 400
// on malformed fields, a "required" choice without tools, or a named function not offered.
ToolsRequest parse_tools_request(const nlohmann::ordered_json& body);

struct ParsedToolCall {
  std::string name;
  std::string arguments;  // compact JSON text of the arguments object (OpenAI's JSON-string form)
};

// Splits model output into content and tool calls as it arrives.
class ToolCallStream {
 public:
  struct Out {
    std::string content;               // text outside calls (and calls that did not parse)
    std::vector<ParsedToolCall> calls; // calls completed by this piece, in order
  };
  explicit ToolCallStream(std::set<std::string> names = {}) : names_(std::move(names)) {}
  bool made_calls() const { return made_calls_; }
  Out push(const std::string& text);
  // End of output: an unclosed call or a held-back partial tag is released as content.
  Out flush();

 private:
  void settle_call(Out& out);  // buf_ holds "<tool_call>...</tool_call>": a call or plain content
  void emit_content(Out& out, const std::string& s);  // content, its trailing whitespace held back
  std::set<std::string> names_;
  std::string buf_;      // held-back text: a possible tag prefix, or an open call
  std::string space_;    // held-back trailing whitespace of the content
  bool in_call_ = false;
  bool made_calls_ = false;
};

// The body of one call's text between the tags -> a call, if it is {"name": known, "arguments": {...}}.
bool parse_tool_call_body(const std::string& body, const std::set<std::string>& names, ParsedToolCall& call);

// A whole output parsed at once (what ToolCallStream yields when fed everything, then flushed).
ToolCallStream::Out parse_tool_calls(const std::string& text, const std::set<std::string>& names);

}  // namespace roofline::serve
