// libFuzzer target: a JSON text taken as a response_format body's schema. Every schema the converter
// accepts must give GBNF that parses (a GrammarError there is the converter's defect) and a matcher
// that can start; the rest of the input (after the first NUL) is fed to that matcher as model output.
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "serve/grammar.h"
#include "serve/grammar_matcher.h"
#include "serve/json_schema_grammar.h"
#include "serve/structured_output.h"
#include "tests/fuzz/libfuzzer/fuzz_common.h"

using namespace roofline;
using namespace roofline::serve;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto [text, rest] = fuzz::split_at_nul({reinterpret_cast<const char*>(data), size});
  nlohmann::ordered_json schema;
  try {
    schema = nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception&) {
    return 0;  // not JSON: the API layer answers 400 before this point
  }
  std::string gbnf;
  try {
    gbnf = json_schema_to_gbnf(schema);
  } catch (const SchemaError&) {
    return 0;
  } catch (const std::exception& e) {
    fuzz::defect("json_schema_to_gbnf", e.what());
  }
  try {
    GrammarMatcher m(Grammar::parse(gbnf));
    m.accept_bytes(rest);
    m.is_complete();
  } catch (const GrammarError& e) {
    // A schema whose values are all excluded ("matches nothing") is the only grammar error allowed.
    if (std::string(e.what()).find("matches nothing") == std::string::npos) fuzz::defect("schema grammar", e.what());
  } catch (const std::exception& e) {
    fuzz::defect("schema grammar", e.what());
  }
  // The same schema as a request's response_format (the API's path, its errors 400s).
  try {
    nlohmann::ordered_json body = {{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", schema}}}}}};
    parse_structured_output(body);
  } catch (const GrammarError& e) {
    if (std::string(e.what()).find("matches nothing") == std::string::npos) fuzz::defect("parse_structured_output", e.what());
  } catch (const InternalError& e) {
    fuzz::defect("parse_structured_output", e.what());
  } catch (const std::runtime_error&) {  // ApiError, SchemaError, Error: a 400
  } catch (const std::exception& e) {
    fuzz::defect("parse_structured_output", e.what());
  }
  return 0;
}
