// Jinja lexer: splits a template into text and tag tokens with Jinja2's whitespace control
// ({%- -%}, {{- -}}, {#- -#}, {%+ +%}) and the trim_blocks / lstrip_blocks options that
// transformers turns on, then tokenizes the expressions inside the tags.
#pragma once

#include <string>
#include <vector>

namespace roofline::jinja {

enum class Tok {
  Text,        // raw template text
  VarBegin,    // {{
  VarEnd,      // }}
  BlockBegin,  // {%
  BlockEnd,    // %}
  Name,
  String,      // already unescaped
  Int,
  Float,
  Op,          // operators and punctuation
  End,         // end of template
};

struct Token {
  Tok type;
  std::string text;
  int line;
};

struct LexOptions {
  bool trim_blocks = true;
  bool lstrip_blocks = true;
};

// Throws Error("template line N: ...") on unterminated tags or strings.
std::vector<Token> lex(const std::string& source, const LexOptions& options = {});

}  // namespace roofline::jinja
