// Structured output in the API: the request fields that constrain generation turned into a compiled
// grammar. OpenAI's response_format ({type: json_object} or {type: json_schema, json_schema: {name,
// schema, strict}}), llama-server's `json_schema` (a schema object) and `grammar` (GBNF text), on
// every completion endpoint; and the grammar of a tool call that tool_choice "required" or a named
// function forces. Anything unsupported or malformed is an ApiError 400 naming the field and part.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>

#include "serve/grammar.h"
#include "serve/tool_calls.h"

namespace roofline::serve {

// The grammar a request body asks for, or null when it asks for none (no field, or response_format text).
std::shared_ptr<const Grammar> parse_structured_output(const nlohmann::ordered_json& body);

// The grammar of the calls a "required" or named tool_choice forces (null for none / auto).
std::shared_ptr<const Grammar> tool_choice_grammar(const ToolsRequest& tools);

}  // namespace roofline::serve
