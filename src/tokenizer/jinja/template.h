// A compiled Jinja template (the subset chat templates use), rendered with Python/Jinja2 semantics
// as transformers' ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) does.
#pragma once

#include <ctime>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "tokenizer/jinja/ast.h"
#include "tokenizer/jinja/lexer.h"
#include "tokenizer/jinja/value.h"

namespace roofline::jinja {

struct RenderOptions {
  std::time_t now = 0;          // strftime_now's clock (0: the current time)
  size_t max_output = 64 << 20;  // bytes; larger output is an error
};

class Template {
 public:
  // Parses `source`; throws Error("template line N: ...") on syntax errors.
  explicit Template(const std::string& source, const LexOptions& options = {});
  // Renders with the variables of `context` (a dict). Throws Error on template errors, including
  // raise_exception("...") calls (the message is the template's).
  std::string render(const Value& context, const RenderOptions& options = {}) const;
  std::string render(const nlohmann::ordered_json& context, const RenderOptions& options = {}) const;

 private:
  std::shared_ptr<const Body> body_;
};

}  // namespace roofline::jinja
