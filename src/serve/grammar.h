// GBNF grammars (llama.cpp's grammar format) parsed into a flat rule table for constrained decoding:
// rules of alternatives, each a sequence of code-point classes and rule references; repetitions
// (* + ? {m,n}) and groups are lowered into helper rules. Left recursion is refused at parse time, so
// the matcher (grammar_matcher.h) can expand rules without looping.
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace roofline::serve {

// A GBNF text that does not parse ("line L, column C: what"), or a grammar that cannot be used.
struct GrammarError : std::runtime_error {
  explicit GrammarError(const std::string& message) : std::runtime_error(message) {}
};

// One code point class: inclusive ranges, or their complement.
struct CharClass {
  std::vector<std::pair<uint32_t, uint32_t>> ranges;
  bool negated = false;
  bool matches(uint32_t cp) const;
  // Whether some code point in [lo, hi] matches (to prune a partial UTF-8 sequence).
  bool matches_any(uint32_t lo, uint32_t hi) const;
  // Whether every code point in [lo, hi] matches.
  bool matches_all(uint32_t lo, uint32_t hi) const;
};

struct GrammarElement {
  enum Kind : uint8_t { Chars, Ref, End };
  Kind kind = End;
  uint32_t index = 0;  // Chars: class index; Ref: rule index
};

class Grammar {
 public:
  // Parses GBNF text; the start rule is `root`. Throws GrammarError.
  static std::shared_ptr<const Grammar> parse(std::string_view gbnf);

  // Every alternative of every rule, flattened: an alternative is the elements from its start up to
  // (and including) an End element.
  const std::vector<GrammarElement>& elements() const { return elements_; }
  const std::vector<CharClass>& classes() const { return classes_; }
  // Start positions (into elements()) of each rule's alternatives.
  const std::vector<std::vector<uint32_t>>& alternatives() const { return alternatives_; }
  const std::vector<std::string>& rule_names() const { return names_; }
  uint32_t root() const { return root_; }

 private:
  friend class GrammarParser;
  std::vector<GrammarElement> elements_;
  std::vector<CharClass> classes_;
  std::vector<std::vector<uint32_t>> alternatives_;
  std::vector<std::string> names_;
  uint32_t root_ = 0;
};

}  // namespace roofline::serve
