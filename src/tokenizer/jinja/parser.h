// Jinja parser: tokens -> statement tree, with Jinja2's operator precedence (filters and tests bind
// tighter than arithmetic, "not" looser than comparisons).
#pragma once

#include <string>

#include "tokenizer/jinja/ast.h"
#include "tokenizer/jinja/lexer.h"

namespace roofline::jinja {

// Throws Error("template line N: ...") on syntax errors and unsupported tags.
Body parse(const std::string& source, const LexOptions& options = {});

}  // namespace roofline::jinja
