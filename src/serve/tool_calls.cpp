// Tool calls: `tools` / `tool_choice` validation and the incremental Qwen3-format call parser (see
// tool_calls.h). The parser holds back only what may still turn into a call: a partial "<tool_call>"
// tag at the end of the text, an open call until its "</tool_call>", and trailing whitespace (dropped
// at the end when the output made calls, so that "text\n\n<tool_call>..." answers content "text").
#include "serve/tool_calls.h"

#include <fmt/format.h>

#include "core/json_nesting.h"
#include "serve/api.h"

namespace roofline::serve {

namespace {

constexpr const char* kOpen = "<tool_call>";
constexpr const char* kClose = "</tool_call>";
constexpr const char* kSpace = " \t\r\n";

// Length of the longest suffix of `s` that is a proper prefix of `tag`.
size_t partial_tag_suffix(const std::string& s, const std::string& tag) {
  const size_t max = std::min(s.size(), tag.size() - 1);
  for (size_t n = max; n > 0; --n)
    if (s.compare(s.size() - n, n, tag, 0, n) == 0) return n;
  return 0;
}

}  // namespace

ToolsRequest parse_tools_request(const json& body) {
  ToolsRequest r;
  auto it = body.find("tools");
  if (it != body.end() && !it->is_null()) {
    if (!it->is_array()) throw ApiError(400, "'tools' must be an array", "tools");
    for (size_t i = 0; i < it->size(); ++i) {
      const json& t = (*it)[i];
      const std::string where = fmt::format("tools[{}]", i);
      if (!t.is_object()) throw ApiError(400, fmt::format("'{}' must be an object", where), "tools");
      if (t.contains("type") && !(t["type"].is_string() && t["type"].get<std::string>() == "function"))
        throw ApiError(400, fmt::format("'{}.type' must be \"function\"", where), "tools");
      if (!t.contains("function") || !t["function"].is_object() || !t["function"].contains("name") ||
          !t["function"]["name"].is_string() || t["function"]["name"].get<std::string>().empty())
        throw ApiError(400, fmt::format("'{}.function.name' must be a non-empty string", where), "tools");
      r.names.insert(t["function"]["name"].get<std::string>());
    }
    if (!it->empty()) r.tools = *it;
  }
  if (auto p = body.find("parallel_tool_calls"); p != body.end() && !p->is_null()) {
    if (!p->is_boolean()) throw ApiError(400, "'parallel_tool_calls' must be a boolean", "parallel_tool_calls");
    r.parallel = p->get<bool>();
  }
  auto tc = body.find("tool_choice");
  if (tc == body.end() || tc->is_null()) return r;
  if (tc->is_string()) {
    const std::string v = tc->get<std::string>();
    if (v == "none") {
      r.choice = ToolChoice::None;
    } else if (v == "auto") {
      r.choice = ToolChoice::Auto;
    } else if (v == "required") {
      if (r.names.empty()) throw ApiError(400, "tool_choice \"required\" needs 'tools'", "tool_choice");
      r.choice = ToolChoice::Required;
    } else {
      throw ApiError(400, fmt::format("'tool_choice' must be \"none\", \"auto\", \"required\" or a function (got \"{}\")", v),
                     "tool_choice");
    }
    return r;
  }
  if (tc->is_object() && tc->contains("function") && (*tc)["function"].is_object() && (*tc)["function"].contains("name") &&
      (*tc)["function"]["name"].is_string()) {
    r.forced = (*tc)["function"]["name"].get<std::string>();
    if (!r.names.count(r.forced))
      throw ApiError(400, fmt::format("tool_choice names the function \"{}\", which 'tools' does not offer", r.forced), "tool_choice");
    r.choice = ToolChoice::Named;
    return r;
  }
  throw ApiError(400, "'tool_choice' must be a string or {\"type\": \"function\", \"function\": {\"name\": ...}}", "tool_choice");
}

bool parse_tool_call_body(const std::string& body, const std::set<std::string>& names, ParsedToolCall& call) {
  if (json_nesting_depth(body) > kMaxJsonNesting) return false;  // too deep to be a call (and to walk safely)
  json j;
  try {
    j = json::parse(body);
  } catch (const json::exception&) {
    return false;
  }
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return false;
  const std::string name = j["name"].get<std::string>();
  if (!names.count(name)) return false;
  json args = json::object();
  if (j.contains("arguments") && !j["arguments"].is_null()) {
    args = j["arguments"];
    if (args.is_string()) {  // arguments given as JSON text: accepted when that text is an object
      if (json_nesting_depth(args.get<std::string>()) > kMaxJsonNesting) return false;
      try {
        args = json::parse(args.get<std::string>());
      } catch (const json::exception&) {
        return false;
      }
    }
    if (!args.is_object()) return false;
  }
  call.name = name;
  call.arguments = dump_json(args);
  return true;
}

void ToolCallStream::emit_content(Out& out, const std::string& s) {
  const size_t last = s.find_last_not_of(kSpace);
  if (last == std::string::npos) {
    space_ += s;
    return;
  }
  out.content += space_;
  space_.clear();
  out.content.append(s, 0, last + 1);
  space_ = s.substr(last + 1);
}

void ToolCallStream::settle_call(Out& out) {
  const size_t open = std::string(kOpen).size(), close = std::string(kClose).size();
  ParsedToolCall call;
  if (parse_tool_call_body(buf_.substr(open, buf_.size() - open - close), names_, call)) {
    out.calls.push_back(std::move(call));
    made_calls_ = true;
  } else {
    emit_content(out, buf_);
  }
  buf_.clear();
}

ToolCallStream::Out ToolCallStream::push(const std::string& text) {
  if (format_ != ToolCallFormat::Hermes) return push_json_answer(text);
  Out out;
  buf_ += text;
  while (!buf_.empty()) {
    if (!in_call_) {
      const size_t pos = buf_.find(kOpen);
      if (pos != std::string::npos) {
        emit_content(out, buf_.substr(0, pos));
        buf_.erase(0, pos);
        in_call_ = true;
        continue;
      }
      const size_t keep = partial_tag_suffix(buf_, kOpen);
      emit_content(out, buf_.substr(0, buf_.size() - keep));
      buf_.erase(0, buf_.size() - keep);
      break;
    }
    const size_t end = buf_.find(kClose, std::string(kOpen).size());
    if (end == std::string::npos) break;
    std::string rest = buf_.substr(end + std::string(kClose).size());
    buf_.resize(end + std::string(kClose).size());
    settle_call(out);
    in_call_ = false;
    buf_ = std::move(rest);
  }
  return out;
}

ToolCallStream::Out ToolCallStream::flush() {
  if (format_ != ToolCallFormat::Hermes) return flush_json_answer();
  Out out;
  if (!buf_.empty()) emit_content(out, buf_);  // an unclosed call or a partial tag: plain text
  buf_.clear();
  in_call_ = false;
  if (!made_calls_) out.content += space_;
  space_.clear();
  return out;
}

ToolCallStream::Out parse_tool_calls(const std::string& text, const std::set<std::string>& names, ToolCallFormat format) {
  ToolCallStream s(names, format);
  ToolCallStream::Out out = s.push(text);
  ToolCallStream::Out tail = s.flush();
  out.content += tail.content;
  for (auto& c : tail.calls) out.calls.push_back(std::move(c));
  return out;
}

}  // namespace roofline::serve
