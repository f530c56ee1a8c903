// Tool calls in the chat completions API: the request's `tools` / `tool_choice` validated, and the
// model's output, in the format of its chat template (ToolCallFormat: Qwen's <tool_call> tags, Llama 3's
// JSON, or generic JSON for templates without tools), split into plain content and OpenAI tool calls,
// incrementally so that streaming can emit content until a call opens and each call once it closes.
// A call that does not parse, or names a function the request did not offer, stays in the content as
// the text it was.
#pragma once

#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

namespace roofline::serve {

// How the request wants tools used (OpenAI's tool_choice).
// Required and Named are enforced by constrained decoding (structured_output.h).
enum class ToolChoice { None, Auto, Required, Named };

// How the model writes a call, chosen from its chat template (tool_call_formats.cpp):
//  Hermes       Qwen2.5 / Qwen3 / Qwen3.5: <tool_call>{"name": ..., "arguments": {...}}</tool_call>, in a row.
//  Llama3       Llama 3.1 / 3.2: the whole answer is {"name": ..., "parameters": {...}} (after an optional
//               <|python_tag|>), several separated by ';' or new lines; the turn ends with <|eom_id|>/<|eot_id|>.
//  GenericJson  templates that know no tools (Gemma 3): the tools are described in the system message and
//               the whole answer is {"tool_calls": [{"name", "arguments"}]} / {"tool_call": {...}}, possibly
//               in a ```json fence; {"response": "..."} is an answer in JSON form.
enum class ToolCallFormat { Hermes, Llama3, GenericJson };
const char* tool_call_format_name(ToolCallFormat f);
ToolCallFormat tool_call_format_of_template(const std::string& template_source);

struct ToolsRequest {
  nlohmann::ordered_json tools;     // null when the request has none (the template then sees none)
  ToolChoice choice = ToolChoice::Auto;
  std::set<std::string> names;      // the functions offered
  std::string forced;               // Named: the function the call must name
  bool parallel = true;             // parallel_tool_calls: Required may make several calls
  ToolCallFormat format = ToolCallFormat::Hermes;  // the served template's (parse_chat_request sets it)
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
  explicit ToolCallStream(std::set<std::string> names = {}, ToolCallFormat format = ToolCallFormat::Hermes)
      : names_(std::move(names)), format_(format) {}
  bool made_calls() const { return made_calls_; }
  Out push(const std::string& text);
  // End of output: an unclosed call or a held-back partial tag is released as content.
  Out flush();

 private:
  void settle_call(Out& out);  // buf_ holds "<tool_call>...</tool_call>": a call or plain content
  void emit_content(Out& out, const std::string& s);  // content, its trailing whitespace held back
  // Llama3 / GenericJson (tool_call_formats.cpp): an answer that opens as JSON is held to the end and
  // then parsed whole; any other answer streams as content from its first character.
  Out push_json_answer(const std::string& text);
  Out flush_json_answer();
  std::set<std::string> names_;
  ToolCallFormat format_ = ToolCallFormat::Hermes;
  enum class Answer { Undecided, Json, Content } answer_ = Answer::Undecided;
  std::string buf_;      // held-back text: a possible tag prefix, or an open call
  std::string space_;    // held-back trailing whitespace of the content
  bool in_call_ = false;
  bool made_calls_ = false;
};

// The body of one call's text between the tags -> a call, if it is {"name": known, "arguments": {...}}.
bool parse_tool_call_body(const std::string& body, const std::set<std::string>& names, ParsedToolCall& call);

// A whole output parsed at once (what ToolCallStream yields when fed everything, then flushed).
ToolCallStream::Out parse_tool_calls(const std::string& text, const std::set<std::string>& names,
                                     ToolCallFormat format = ToolCallFormat::Hermes);

// Templates that know no tools (GenericJson and no mention of tools in the template; true of Gemma 3,
// template_needs_tool_rewrite): the messages as
// the template can render them. The tools go into the system message with how to call them; an
// assistant message's tool_calls become its content {"tool_calls": [...]}; a tool result becomes a
// user message {"tool_response": {...}}; consecutive messages of one role are joined (Gemma insists on
// alternating roles). Messages must be normalized (content strings, arguments objects).
bool template_needs_tool_rewrite(const std::string& template_source);
nlohmann::ordered_json describe_tools_in_messages(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools);

}  // namespace roofline::serve
