// JSON Schema -> GBNF, for structured output (response_format json_schema, llama-server's
// json_schema) and constrained tool calls. The grammar accepts exactly the JSON texts (with bounded
// whitespace between tokens) that validate against the supported subset; a schema keyword outside it
// is a SchemaError naming the keyword and where it is, never silently ignored.
//
// Supported: type (one or an array), properties, required (absent optional properties), additionalProperties
// (false / true / a schema; absent means false when `properties` is given), items, prefixItems, minItems,
// maxItems, enum, const, anyOf, oneOf (as anyOf), allOf of one schema, $ref to #/$defs/... or
// #/definitions/... (recursion allowed), minLength, maxLength, format date / time / date-time / uuid,
// and annotations (title, description, default, examples, ...). Objects list their properties in the
// schema's order.
#pragma once

#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

namespace roofline::serve {

struct SchemaError : std::runtime_error {
  SchemaError(const std::string& message, std::string path) : std::runtime_error(message), path(std::move(path)) {}
  std::string path;  // JSON-pointer-like location in the schema ("/properties/name")
};

// GBNF whose root matches a JSON value valid against `schema`.
std::string json_schema_to_gbnf(const nlohmann::ordered_json& schema);

// GBNF whose root matches any JSON object (response_format json_object).
std::string json_object_gbnf();

// One tool a call may name: its function name and its parameters schema (null: any object).
struct ToolGrammarSpec {
  std::string name;
  nlohmann::ordered_json parameters;
};

// GBNF for the Qwen3 / Qwen3.5 tool call format: `<tool_call>\n{"name": "...", "arguments": {...}}\n</tool_call>`,
// one call (`parallel` false) or one or more separated by newlines, the arguments following each
// tool's parameters schema.
std::string tool_calls_gbnf(const std::vector<ToolGrammarSpec>& tools, bool parallel);

}  // namespace roofline::serve
