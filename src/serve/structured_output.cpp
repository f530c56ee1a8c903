// Request fields -> grammar for structured output and forced tool calls (see structured_output.h).
#include "serve/structured_output.h"

#include <fmt/format.h>

#include <deque>
#include <mutex>

#include "serve/api.h"
#include "serve/grammar_matcher.h"
#include "serve/json_schema_grammar.h"

namespace roofline::serve {

namespace {

// Compiled grammars of recent requests by their GBNF text: the same schema sent again gets the same
// Grammar, whose automaton (states, transitions, masks) the scheduler has kept.
std::shared_ptr<const Grammar> compile(const std::string& gbnf, const std::string& param) {
  static std::mutex mutex;
  static std::deque<std::pair<std::string, std::shared_ptr<const Grammar>>> recent;
  {
    std::lock_guard<std::mutex> lock(mutex);
    for (const auto& [text, g] : recent)
      if (text == gbnf) return g;
  }
  std::shared_ptr<const Grammar> g;
  try {
    g = Grammar::parse(gbnf);
    GrammarAutomaton probe(g);  // its start state: a grammar that matches nothing fails here, not in the scheduler
  } catch (const GrammarError& e) {
    throw ApiError(400, fmt::format("'{}': {}", param, e.what()), param);
  }
  std::lock_guard<std::mutex> lock(mutex);
  recent.push_back({gbnf, g});
  if (recent.size() > 16) recent.pop_front();
  return g;
}

std::shared_ptr<const Grammar> from_schema(const json& schema, const std::string& param) {
  std::string gbnf;
  try {
    gbnf = json_schema_to_gbnf(schema);
  } catch (const SchemaError& e) {
    throw ApiError(400, fmt::format("'{}' at '{}': {}", param, e.path.empty() ? "/" : e.path, e.what()), param);
  }
  return compile(gbnf, param);
}

}  // namespace

std::shared_ptr<const Grammar> parse_structured_output(const json& body) {
  std::shared_ptr<const Grammar> g;
  const char* source = nullptr;
  auto set = [&](std::shared_ptr<const Grammar> next, const char* name) {
    if (g) throw ApiError(400, fmt::format("'{}' and '{}' both constrain the output; send one", source, name), name);
    g = std::move(next);
    source = name;
  };
  if (auto rf = body.find("response_format"); rf != body.end() && !rf->is_null()) {
    if (!rf->is_object() || !rf->contains("type") || !(*rf)["type"].is_string())
      throw ApiError(400, "'response_format' must be an object with a 'type'", "response_format");
    const std::string type = (*rf)["type"].get<std::string>();
    if (type == "json_object") {
      // llama-server also takes a schema here ({"type": "json_object", "schema": {...}}).
      if (rf->contains("schema") && !(*rf)["schema"].is_null()) set(from_schema((*rf)["schema"], "response_format.schema"), "response_format");
      else set(compile(json_object_gbnf(), "response_format"), "response_format");
    } else if (type == "json_schema") {
      const json* holder = rf->contains("json_schema") ? &(*rf)["json_schema"] : nullptr;
      if (!holder || !holder->is_object())
        throw ApiError(400, "response_format json_schema needs a 'json_schema' object", "response_format.json_schema");
      if (holder->contains("name") && !(*holder)["name"].is_string())
        throw ApiError(400, "'response_format.json_schema.name' must be a string", "response_format.json_schema.name");
      if (holder->contains("strict") && !(*holder)["strict"].is_boolean() && !(*holder)["strict"].is_null())
        throw ApiError(400, "'response_format.json_schema.strict' must be a boolean", "response_format.json_schema.strict");
      if (!holder->contains("schema") || (*holder)["schema"].is_null())
        set(compile(json_object_gbnf(), "response_format"), "response_format");  // no schema: any object
      else
        set(from_schema((*holder)["schema"], "response_format.json_schema.schema"), "response_format");
    } else if (type != "text") {
      throw ApiError(400, fmt::format("response_format type '{}' is not supported (text, json_object, json_schema)", type),
                     "response_format");
    }
  }
  if (auto js = body.find("json_schema"); js != body.end() && !js->is_null()) {
    if (!js->is_object() && !js->is_boolean()) throw ApiError(400, "'json_schema' must be a JSON Schema object", "json_schema");
    set(from_schema(*js, "json_schema"), "json_schema");
  }
  if (auto gr = body.find("grammar"); gr != body.end() && !gr->is_null()) {
    if (!gr->is_string()) throw ApiError(400, "'grammar' must be a string of GBNF", "grammar");
    if (!gr->get<std::string>().empty()) set(compile(gr->get<std::string>(), "grammar"), "grammar");
  }
  return g;
}

std::shared_ptr<const Grammar> tool_choice_grammar(const ToolsRequest& tools) {
  if (tools.choice != ToolChoice::Required && tools.choice != ToolChoice::Named) return nullptr;
  std::vector<ToolGrammarSpec> specs;
  for (const json& t : tools.tools) {
    const json& f = t["function"];
    ToolGrammarSpec s;
    s.name = f["name"].get<std::string>();
    if (tools.choice == ToolChoice::Named && s.name != tools.forced) continue;
    s.parameters = f.contains("parameters") ? f["parameters"] : json();
    specs.push_back(std::move(s));
  }
  std::string gbnf;
  try {
    gbnf = tool_calls_gbnf(specs, tools.choice == ToolChoice::Required && tools.parallel);
  } catch (const SchemaError& e) {
    throw ApiError(400, fmt::format("'tools' parameters at '{}': {}", e.path.empty() ? "/" : e.path, e.what()), "tools");
  }
  return compile(gbnf, "tools");
}

}  // namespace roofline::serve
