// Tool-call formats beside Qwen's <tool_call> tags (see ToolCallFormat in tool_calls.h): which one a
// chat template implies, the JSON-answer parser shared by Llama 3.x and the generic format (an answer
// that opens with '{' — or, generic, a ```json fence — is held back and parsed whole at its end: calls
// when every object in it is a valid call of an offered function, else the text as content), and the
// message rewriting that lets a template without tools (Gemma 3) render a tool conversation.
#include <fmt/format.h>

#include <cstring>
#include <map>
#include <optional>
#include <string_view>

#include "core/json_nesting.h"
#include "serve/api.h"
#include "serve/tool_calls.h"

namespace roofline::serve {

namespace {

constexpr const char* kSpace = " \t\r\n";
constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr std::string_view kFence = "```";

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
bool is_proper_prefix(std::string_view s, std::string_view of) { return s.size() < of.size() && starts_with(of, s); }

std::string_view trim(std::string_view s) {
  const size_t b = s.find_first_not_of(kSpace);
  if (b == std::string_view::npos) return {};
  const size_t e = s.find_last_not_of(kSpace);
  return s.substr(b, e - b + 1);
}

// The top-level JSON objects of `text`, separated by whitespace, ';' or ',' (Llama 3 writes parallel
// calls one after another). False when anything else is there or an object does not close.
bool split_objects(std::string_view text, std::vector<std::string_view>& objects) {
  size_t i = 0;
  while (true) {
    while (i < text.size() && (std::strchr(kSpace, text[i]) || text[i] == ';' || text[i] == ',')) ++i;
    if (i == text.size()) return !objects.empty();
    if (text[i] != '{') return false;
    const size_t begin = i;
    int depth = 0;
    bool in_string = false, escaped = false;
    for (; i < text.size(); ++i) {
      const char c = text[i];
      if (in_string) {
        if (escaped) escaped = false;
        else if (c == '\\') escaped = true;
        else if (c == '"') in_string = false;
      } else if (c == '"') {
        in_string = true;
      } else if (c == '{' || c == '[') {
        ++depth;
      } else if (c == '}' || c == ']') {
        if (--depth == 0) break;
      }
    }
    if (i == text.size()) return false;  // unclosed
    objects.push_back(text.substr(begin, ++i - begin));
  }
}

// One call object: {"name": offered, "arguments" | "parameters": object or its JSON text}, optionally
// with "type": "function" or wrapped as OpenAI writes it ({"type": "function", "function": {...}}).
bool call_from_json(const json& j, const std::set<std::string>& names, ParsedToolCall& call) {
  if (!j.is_object()) return false;
  if (j.contains("function") && j["function"].is_object() && !j.contains("name")) return call_from_json(j["function"], names, call);
  if (j.contains("type") && j["type"] != "function") return false;
  if (!j.contains("name") || !j["name"].is_string() || !names.count(j["name"].get<std::string>())) return false;
  json args = json::object();
  const char* key = j.contains("arguments") ? "arguments" : j.contains("parameters") ? "parameters" : nullptr;
  if (key && !j[key].is_null()) {
    args = j[key];
    if (args.is_string()) {
      if (json_nesting_depth(args.get<std::string>()) > kMaxJsonNesting) return false;
      try {
        args = json::parse(args.get<std::string>());
      } catch (const json::exception&) {
        return false;
      }
    }
    if (!args.is_object()) return false;
  }
  call.name = j["name"].get<std::string>();
  call.arguments = dump_json(args);
  return true;
}

std::optional<json> parse_object(std::string_view text) {
  if (json_nesting_depth(text) > kMaxJsonNesting) return std::nullopt;
  try {
    return json::parse(text);
  } catch (const json::exception&) {
    return std::nullopt;
  }
}

// A whole JSON answer -> calls (or, generic, the text of {"response": ...}). False: not a call answer.
bool parse_json_answer(std::string_view text, ToolCallFormat format, const std::set<std::string>& names,
                       ToolCallStream::Out& out) {
  text = trim(text);
  if (format == ToolCallFormat::Llama3) {
    if (starts_with(text, kPythonTag)) text = trim(text.substr(kPythonTag.size()));
    std::vector<std::string_view> objects;
    if (!split_objects(text, objects)) return false;
    std::vector<ParsedToolCall> calls(objects.size());
    for (size_t i = 0; i < objects.size(); ++i) {
      const std::optional<json> j = parse_object(objects[i]);
      if (!j || !call_from_json(*j, names, calls[i])) return false;
    }
    for (auto& c : calls) out.calls.push_back(std::move(c));
    return true;
  }
  if (starts_with(text, kFence)) {  // ```json\n{...}\n```
    const size_t line = text.find('\n');
    if (line == std::string_view::npos) return false;
    text = trim(text.substr(line + 1));
    if (text.size() >= kFence.size() && text.substr(text.size() - kFence.size()) == kFence) text = trim(text.substr(0, text.size() - kFence.size()));
  }
  const std::optional<json> j = parse_object(text);
  if (!j || !j->is_object()) return false;
  std::vector<ParsedToolCall> calls;
  if (j->contains("tool_calls")) {
    const json& arr = (*j)["tool_calls"];
    if (!arr.is_array() || arr.empty()) return false;
    calls.resize(arr.size());
    for (size_t i = 0; i < arr.size(); ++i)
      if (!call_from_json(arr[i], names, calls[i])) return false;
  } else if (j->contains("tool_call")) {
    calls.resize(1);
    if (!call_from_json((*j)["tool_call"], names, calls[0])) return false;
  } else if (j->size() == 1 && j->contains("response") && (*j)["response"].is_string()) {
    out.content += (*j)["response"].get<std::string>();
    return true;
  } else {
    calls.resize(1);
    if (!call_from_json(*j, names, calls[0])) return false;
  }
  for (auto& c : calls) out.calls.push_back(std::move(c));
  return true;
}

}  // namespace

const char* tool_call_format_name(ToolCallFormat f) {
  switch (f) {
    case ToolCallFormat::Hermes:
      return "hermes";
    case ToolCallFormat::Llama3:
      return "llama3";
    case ToolCallFormat::GenericJson:
      return "generic";
  }
  return "?";
}

// From markers of the template, as llama-server decides: Qwen / Hermes templates write <tool_call>
// tags, and so does the ChatML family they belong to (<|im_start|>); Llama 3.1+ templates know the
// ipython role and <|python_tag|>; anything else (Gemma 3 has no tool support) gets generic JSON.
ToolCallFormat tool_call_format_of_template(const std::string& src) {
  if (src.find("<tool_call>") != std::string::npos) return ToolCallFormat::Hermes;
  if (src.find("<|python_tag|>") != std::string::npos || src.find("ipython<|end_header_id|>") != std::string::npos)
    return ToolCallFormat::Llama3;
  if (src.find("<|im_start|>") != std::string::npos) return ToolCallFormat::Hermes;
  return ToolCallFormat::GenericJson;
}

ToolCallStream::Out ToolCallStream::push_json_answer(const std::string& text) {
  Out out;
  if (answer_ == Answer::Content) {
    emit_content(out, text);
    return out;
  }
  buf_ += text;
  if (answer_ == Answer::Json) return out;
  // Undecided: what comes after leading whitespace (and Llama's <|python_tag|>) decides.
  const size_t first = buf_.find_first_not_of(kSpace);
  if (first == std::string::npos) return out;
  std::string_view rest = std::string_view(buf_).substr(first);
  if (format_ == ToolCallFormat::Llama3) {
    if (is_proper_prefix(rest, kPythonTag)) return out;
    if (starts_with(rest, kPythonTag)) {
      rest = rest.substr(kPythonTag.size());
      const size_t b = rest.find_first_not_of(kSpace);
      if (b == std::string_view::npos) return out;
      rest = rest.substr(b);
    }
  } else if (is_proper_prefix(rest, kFence)) {
    return out;
  }
  if (rest[0] == '{' || (format_ == ToolCallFormat::GenericJson && starts_with(rest, kFence))) {
    answer_ = Answer::Json;
    return out;
  }
  answer_ = Answer::Content;
  emit_content(out, buf_);
  buf_.clear();
  return out;
}

ToolCallStream::Out ToolCallStream::flush_json_answer() {
  Out out;
  if (answer_ == Answer::Json && parse_json_answer(buf_, format_, names_, out)) {
    made_calls_ = made_calls_ || !out.calls.empty();
    if (!out.content.empty()) {  // {"response": ...}: its text is the answer
      const std::string text = std::move(out.content);
      out.content.clear();
      emit_content(out, text);
    }
  } else if (!buf_.empty()) {
    emit_content(out, buf_);  // not a call answer (or not closed): the text as it was
  }
  buf_.clear();
  answer_ = Answer::Undecided;
  if (!made_calls_) out.content += space_;
  space_.clear();
  return out;
}

bool template_needs_tool_rewrite(const std::string& template_source) {
  return tool_call_format_of_template(template_source) == ToolCallFormat::GenericJson &&
         template_source.find("tools") == std::string::npos;
}

json describe_tools_in_messages(const json& messages, const json& tools) {
  const bool have_tools = tools.is_array() && !tools.empty();
  json out = json::array();
  auto append = [&out](json m) {
    if (!out.empty() && out.back()["role"] == m["role"] && m["role"] != "system") {
      std::string joined = out.back()["content"].is_string() ? out.back()["content"].get<std::string>() : "";
      const std::string more = m["content"].is_string() ? m["content"].get<std::string>() : "";
      out.back()["content"] = joined.empty() ? more : more.empty() ? joined : joined + "\n\n" + more;
      return;
    }
    out.push_back(std::move(m));
  };
  if (have_tools) {
    std::string guide =
        "You can call the following tools. Each is given with a JSON Schema of its parameters.\n\n" + tools.dump(2) +
        "\n\nTo call tools, answer with only this JSON object and no other text:\n"
        "{\"tool_calls\": [{\"name\": \"<tool name>\", \"arguments\": {\"<parameter>\": <value>}}]}\n"
        "List several calls in the array to make them at once. To answer without a tool, write the answer as plain text.";
    if (!messages.empty() && messages[0].value("role", "") == "system") {
      json sys = messages[0];
      const std::string text = sys["content"].is_string() ? sys["content"].get<std::string>() : "";
      sys["content"] = text.empty() ? guide : text + "\n\n" + guide;
      out.push_back(std::move(sys));
    } else {
      out.push_back(json{{"role", "system"}, {"content", guide}});
    }
  }
  std::map<std::string, std::string> call_names;  // tool_call id -> function name
  for (size_t i = 0; i < messages.size(); ++i) {
    if (have_tools && i == 0 && messages[0].value("role", "") == "system") continue;
    json m = messages[i];
    const std::string role = m.value("role", "");
    if (role == "assistant" && m.contains("tool_calls") && m["tool_calls"].is_array() && !m["tool_calls"].empty()) {
      json calls = json::array();
      for (const json& tc : m["tool_calls"]) {
        const json& fn = tc.contains("function") ? tc["function"] : tc;
        json c = json::object();
        c["name"] = fn.value("name", "");
        c["arguments"] = fn.contains("arguments") ? fn["arguments"] : json::object();
        if (tc.contains("id") && tc["id"].is_string()) {
          c["id"] = tc["id"];
          call_names[tc["id"].get<std::string>()] = c["name"].get<std::string>();
        }
        calls.push_back(std::move(c));
      }
      const std::string text = m["content"].is_string() ? m["content"].get<std::string>() : "";
      const std::string call_text = json{{"tool_calls", calls}}.dump();
      m["content"] = text.empty() ? call_text : text + "\n" + call_text;
      m.erase("tool_calls");
      append(std::move(m));
    } else if (role == "tool") {
      json r = json::object();
      const std::string id = m.contains("tool_call_id") && m["tool_call_id"].is_string() ? m["tool_call_id"].get<std::string>() : "";
      if (m.contains("name") && m["name"].is_string()) r["name"] = m["name"];
      else if (call_names.count(id)) r["name"] = call_names[id];
      if (!id.empty()) r["tool_call_id"] = id;
      r["content"] = m["content"];
      append(json{{"role", "user"}, {"content", json{{"tool_response", r}}.dump()}});
    } else {
      append(std::move(m));
    }
  }
  return out;
}

}  // namespace roofline::serve
