// The GBNF parser (grammar.h): a recursive-descent reader of rules, alternatives, sequences,
// literals, character classes, groups and repetitions. Groups and repetitions become helper rules
// named after their rule ("item_3"); x* is `R ::= x R |` (right recursion, which the matcher runs in
// constant stack depth), x{m,n} is m copies then nested optionals. Errors say line and column.
#include "serve/grammar.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "tokenizer/unicode.h"

namespace roofline::serve {

bool CharClass::matches(uint32_t cp) const {
  bool in = false;
  for (const auto& [lo, hi] : ranges)
    if (cp >= lo && cp <= hi) {
      in = true;
      break;
    }
  return in != negated;
}

namespace {
// Whether the ranges together cover every point of [lo, hi]. Walks them in order of start.
bool ranges_cover(std::vector<std::pair<uint32_t, uint32_t>> ranges, uint32_t lo, uint32_t hi) {
  std::sort(ranges.begin(), ranges.end());
  uint64_t next = lo;  // the smallest point not yet known to be covered
  for (const auto& [a, b] : ranges) {
    if (a > next) break;
    if ((uint64_t)b + 1 > next) next = (uint64_t)b + 1;
    if (next > hi) return true;
  }
  return next > hi;
}
bool ranges_touch(const std::vector<std::pair<uint32_t, uint32_t>>& ranges, uint32_t lo, uint32_t hi) {
  for (const auto& [a, b] : ranges)
    if (a <= hi && b >= lo) return true;
  return false;
}
}  // namespace

bool CharClass::matches_any(uint32_t lo, uint32_t hi) const {
  // Complement: some point of [lo, hi] outside every range.
  return negated ? !ranges_cover(ranges, lo, hi) : ranges_touch(ranges, lo, hi);
}

bool CharClass::matches_all(uint32_t lo, uint32_t hi) const {
  return negated ? !ranges_touch(ranges, lo, hi) : ranges_cover(ranges, lo, hi);
}

using unicode::append_utf8;

using Sequence = std::vector<GrammarElement>;

class GrammarParser {
 public:
  explicit GrammarParser(std::string_view text) : s_(text) {}

  std::shared_ptr<const Grammar> run() {
    auto g = std::make_shared<Grammar>();
    g_ = g.get();
    skip_space(true);
    while (pos_ < s_.size()) {
      parse_rule();
      skip_space(true);
    }
    auto root = ids_.find("root");
    if (root == ids_.end()) throw GrammarError("the grammar has no 'root' rule");
    for (size_t r = 0; r < rules_.size(); ++r)
      if (!defined_[r]) throw GrammarError(fmt::format("rule '{}' is used but never defined", g->names_[r]));
    g->root_ = root->second;
    flatten();
    if (g->elements_.size() > 1000000) throw GrammarError("the grammar is too large (over a million elements once repetitions are expanded)");
    check_left_recursion();
    return g;
  }

 private:
  [[noreturn]] void error(const std::string& what) const {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < pos_ && i < s_.size(); ++i) {
      if (s_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    throw GrammarError(fmt::format("grammar line {}, column {}: {}", line, col, what));
  }

  bool at_end() const { return pos_ >= s_.size(); }
  char peek(size_t off = 0) const { return pos_ + off < s_.size() ? s_[pos_ + off] : '\0'; }

  // Spaces, tabs and comments; newlines too when `newlines` (inside groups, after '|').
  void skip_space(bool newlines) {
    while (!at_end()) {
      const char c = peek();
      if (c == ' ' || c == '\t' || c == '\r' || (newlines && c == '\n')) {
        ++pos_;
      } else if (c == '#') {
        while (!at_end() && peek() != '\n') ++pos_;
      } else {
        break;
      }
    }
  }

  static bool is_name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
  }

  std::string parse_name() {
    const size_t start = pos_;
    while (!at_end() && is_name_char(peek())) ++pos_;
    if (pos_ == start) error("expected a rule name");
    return std::string(s_.substr(start, pos_ - start));
  }

  uint32_t rule_id(const std::string& name) {
    auto it = ids_.find(name);
    if (it != ids_.end()) return it->second;
    const uint32_t id = (uint32_t)rules_.size();
    ids_[name] = id;
    rules_.emplace_back();
    defined_.push_back(false);
    g_->names_.push_back(name);
    return id;
  }

  uint32_t new_helper_rule(const std::string& base) {
    std::string name;
    do {
      name = fmt::format("{}_{}", base, ++helper_counter_);
    } while (ids_.count(name));
    const uint32_t id = rule_id(name);
    defined_[id] = true;
    return id;
  }

  void parse_rule() {
    const std::string name = parse_name();
    skip_space(false);
    if (s_.substr(pos_, 3) != "::=") error(fmt::format("expected '::=' after rule name '{}'", name));
    pos_ += 3;
    const uint32_t id = rule_id(name);
    if (defined_[id]) error(fmt::format("rule '{}' is defined twice", name));
    defined_[id] = true;
    current_rule_ = name;
    auto alts = parse_alternatives(false);
    rules_[id] = std::move(alts);
    skip_space(false);
    if (!at_end() && peek() != '\n') error(fmt::format("unexpected '{}' (expected the end of the line)", peek()));
  }

  std::vector<Sequence> parse_alternatives(bool nested) {
    std::vector<Sequence> alts;
    alts.push_back(parse_sequence(nested));
    for (;;) {
      skip_space(nested);
      // At the top level a new line that starts with '|' continues the rule.
      if (!nested && peek() == '\n') {
        size_t p = pos_;
        while (p < s_.size() && (s_[p] == '\n' || s_[p] == ' ' || s_[p] == '\t' || s_[p] == '\r')) ++p;
        if (p < s_.size() && s_[p] == '|') pos_ = p;
      }
      if (peek() != '|') break;
      ++pos_;
      skip_space(true);
      alts.push_back(parse_sequence(nested));
    }
    return alts;
  }

  uint32_t read_hex(int digits) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      const char c = peek();
      int d;
      if (c >= '0' && c <= '9') d = c - '0';
      else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
      else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
      else error(fmt::format("expected {} hex digits in an escape", digits));
      v = v * 16 + (uint32_t)d;
      ++pos_;
    }
    return v;
  }

  // One code point of a literal or class (UTF-8 decoded, escapes resolved).
  uint32_t parse_char() {
    if (at_end()) error("unexpected end of the grammar");
    const unsigned char c = (unsigned char)peek();
    if (c == '\\') {
      ++pos_;
      const char e = peek();
      ++pos_;
      switch (e) {
        case 'n': return '\n';
        case 'r': return '\r';
        case 't': return '\t';
        case '0': return 0;
        case '\\': case '"': case '[': case ']': case '-': case '^': case '/': case '\'': case '.': return (uint32_t)e;
        case 'x': return read_hex(2);
        case 'u': return read_hex(4);
        case 'U': return read_hex(8);
        default: --pos_; error(fmt::format("unknown escape '\\{}'", e));
      }
    }
    int need = 0;
    uint32_t cp = c;
    if (c >= 0xF0) need = 3, cp = c & 0x07;
    else if (c >= 0xE0) need = 2, cp = c & 0x0F;
    else if (c >= 0xC0) need = 1, cp = c & 0x1F;
    else if (c >= 0x80) error("invalid UTF-8 in the grammar");
    ++pos_;
    for (int i = 0; i < need; ++i) {
      const unsigned char d = (unsigned char)peek();
      if ((d & 0xC0) != 0x80) error("invalid UTF-8 in the grammar");
      cp = (cp << 6) | (d & 0x3F);
      ++pos_;
    }
    return cp;
  }

  GrammarElement add_class(CharClass cc) {
    g_->classes_.push_back(std::move(cc));
    return {GrammarElement::Chars, (uint32_t)g_->classes_.size() - 1};
  }

  // Appends one item (a literal is several elements) to `seq`; returns how many elements it added.
  size_t parse_primary(Sequence& seq, bool nested) {
    const char c = peek();
    if (c == '"') {
      ++pos_;
      size_t n = 0;
      while (peek() != '"') {
        if (at_end() || peek() == '\n') error("unterminated string literal");
        const uint32_t cp = parse_char();
        CharClass cc;
        cc.ranges.push_back({cp, cp});
        seq.push_back(add_class(std::move(cc)));
        ++n;
      }
      ++pos_;
      return n;
    }
    if (c == '[') {
      ++pos_;
      CharClass cc;
      if (peek() == '^') {
        cc.negated = true;
        ++pos_;
      }
      while (peek() != ']') {
        if (at_end() || peek() == '\n') error("unterminated character class");
        const uint32_t lo = parse_char();
        uint32_t hi = lo;
        if (peek() == '-' && peek(1) != ']' && peek(1) != '\0') {
          ++pos_;
          hi = parse_char();
          if (hi < lo) error("a character range ends before it starts");
        }
        cc.ranges.push_back({lo, hi});
      }
      ++pos_;
      seq.push_back(add_class(std::move(cc)));
      return 1;
    }
    if (c == '.') {
      ++pos_;
      CharClass cc;
      cc.negated = true;  // nothing excluded: any code point
      seq.push_back(add_class(std::move(cc)));
      return 1;
    }
    if (c == '(') {
      // Groups recurse here: bounded, so a grammar of a hundred thousand '(' is an error, not a stack overflow.
      if (++group_depth_ > kMaxGroupDepth) error(fmt::format("groups nested more than {} deep", kMaxGroupDepth));
      ++pos_;
      skip_space(true);
      auto alts = parse_alternatives(true);
      --group_depth_;
      skip_space(true);
      if (peek() != ')') error("expected ')'");
      ++pos_;
      const uint32_t id = new_helper_rule(current_rule_);
      rules_[id] = std::move(alts);
      seq.push_back({GrammarElement::Ref, id});
      return 1;
    }
    if (is_name_char(c)) {
      const std::string name = parse_name();
      seq.push_back({GrammarElement::Ref, rule_id(name)});
      return 1;
    }
    (void)nested;
    error(fmt::format("unexpected '{}'", c));
  }

  int parse_count() {
    const size_t start = pos_;
    long v = 0;
    while (peek() >= '0' && peek() <= '9') {
      v = v * 10 + (peek() - '0');
      if (v > 100000) error("repetition count too large");
      ++pos_;
    }
    if (pos_ == start) error("expected a number in '{m,n}'");
    return (int)v;
  }

  // x repeated min..max times (max < 0: unbounded), as elements appended to `seq`.
  void lower_repeat(Sequence& seq, const Sequence& item, int min, int max) {
    for (int i = 0; i < min; ++i) seq.insert(seq.end(), item.begin(), item.end());
    if (max < 0) {
      const uint32_t star = new_helper_rule(current_rule_);  // star ::= item star |
      Sequence body = item;
      body.push_back({GrammarElement::Ref, star});
      rules_[star] = {body, Sequence{}};
      seq.push_back({GrammarElement::Ref, star});
      return;
    }
    if (max - min > 20000) error("repetition range too large (at most 20000 optional copies)");
    // Nested optionals: opt_k ::= item opt_{k-1} | ; opt_1 ::= item |
    uint32_t inner = 0;
    bool have_inner = false;
    for (int k = 1; k <= max - min; ++k) {
      const uint32_t opt = new_helper_rule(current_rule_);
      Sequence body = item;
      if (have_inner) body.push_back({GrammarElement::Ref, inner});
      rules_[opt] = {body, Sequence{}};
      inner = opt;
      have_inner = true;
    }
    if (have_inner) seq.push_back({GrammarElement::Ref, inner});
  }

  Sequence parse_sequence(bool nested) {
    Sequence seq;
    for (;;) {
      skip_space(nested);
      const char c = peek();
      if (at_end() || c == '|' || c == ')' || c == '\n') break;
      // A name followed by '::=' starts the next rule (after a '|' that ended a line).
      if (is_name_char(c)) {
        size_t p = pos_;
        while (p < s_.size() && is_name_char(s_[p])) ++p;
        while (p < s_.size() && (s_[p] == ' ' || s_[p] == '\t')) ++p;
        if (s_.substr(p, 3) == "::=") break;
      }
      const size_t before = seq.size();
      const size_t n = parse_primary(seq, nested);
      const char r = peek();
      if (r == '*' || r == '+' || r == '?' || r == '{') {
        // The repeated item: a single element (a literal of several characters becomes a helper rule).
        Sequence item(seq.begin() + (long)before, seq.end());
        seq.resize(before);
        if (n != 1) {
          const uint32_t id = new_helper_rule(current_rule_);
          rules_[id] = {item};
          item = {{GrammarElement::Ref, id}};
        }
        int min = 0, max = -1;
        ++pos_;
        if (r == '+') min = 1;
        else if (r == '?') max = 1;
        else if (r == '{') {
          skip_space(false);
          min = parse_count();
          skip_space(false);
          if (peek() == ',') {
            ++pos_;
            skip_space(false);
            max = peek() == '}' ? -1 : parse_count();
          } else {
            max = min;
          }
          skip_space(false);
          if (peek() != '}') error("expected '}' closing a repetition");
          ++pos_;
          if (max >= 0 && max < min) error("a repetition's maximum is below its minimum");
        }
        lower_repeat(seq, item, min, max);
      }
    }
    return seq;
  }

  void flatten() {
    Grammar& g = *g_;
    g.alternatives_.resize(rules_.size());
    for (size_t r = 0; r < rules_.size(); ++r) {
      for (const Sequence& alt : rules_[r]) {
        g.alternatives_[r].push_back((uint32_t)g.elements_.size());
        g.elements_.insert(g.elements_.end(), alt.begin(), alt.end());
        g.elements_.push_back({GrammarElement::End, 0});
      }
    }
  }

  // A rule that can reach itself without consuming a character would make the matcher loop.
  void check_left_recursion() {
    const size_t n = rules_.size();
    // Nullable rules (those that can match nothing) by propagation, linear in the grammar's size: an
    // alternative becomes nullable when the last of its rule references does; one with a character
    // class never does. (A fixed-point sweep over the rules would take one sweep per link of a chain of
    // rules written in the unlucky order: quadratic in a grammar of a hundred thousand rules.)
    constexpr uint32_t kNever = 0xFFFFFFFFu;
    std::vector<bool> nullable(n, false);
    std::vector<std::vector<uint32_t>> unknown(n);                   // per alternative: references not yet nullable
    std::vector<std::vector<std::pair<uint32_t, uint32_t>>> uses(n);  // rule -> (rule, alternative) it occurs in
    std::vector<uint32_t> found;
    auto mark = [&](uint32_t r) {
      if (nullable[r]) return;
      nullable[r] = true;
      found.push_back(r);
    };
    for (uint32_t r = 0; r < n; ++r) {
      unknown[r].assign(rules_[r].size(), 0);
      for (uint32_t a = 0; a < rules_[r].size(); ++a) {
        uint32_t refs = 0;
        bool chars = false;
        for (const GrammarElement& e : rules_[r][a]) {
          if (e.kind == GrammarElement::Chars) chars = true;
          else ++refs, uses[e.index].push_back({r, a});
        }
        unknown[r][a] = chars ? kNever : refs;
        if (!chars && refs == 0) mark(r);
      }
    }
    while (!found.empty()) {
      const uint32_t s = found.back();
      found.pop_back();
      for (const auto& [r, a] : uses[s])
        if (unknown[r][a] != kNever && --unknown[r][a] == 0) mark(r);
    }
    // Edges r -> s where s can start r without input consumed before it.
    std::vector<std::vector<uint32_t>> left(n);
    for (size_t r = 0; r < n; ++r)
      for (const Sequence& alt : rules_[r])
        for (const GrammarElement& e : alt) {
          if (e.kind == GrammarElement::Chars) break;
          left[r].push_back(e.index);
          if (!nullable[e.index]) break;
        }
    std::vector<int> color(n, 0);  // 0 new, 1 on the path, 2 done
    std::vector<std::pair<uint32_t, size_t>> stack;
    for (uint32_t start = 0; start < n; ++start) {
      if (color[start]) continue;
      stack.push_back({start, 0});
      color[start] = 1;
      while (!stack.empty()) {
        auto& [r, i] = stack.back();
        if (i < left[r].size()) {
          const uint32_t s = left[r][i++];
          if (color[s] == 1) throw GrammarError(fmt::format("rule '{}' is left-recursive (it can reach itself before any character)", g_->names_[s]));
          if (color[s] == 0) {
            color[s] = 1;
            stack.push_back({s, 0});
          }
        } else {
          color[r] = 2;
          stack.pop_back();
        }
      }
    }
  }

  static constexpr int kMaxGroupDepth = 256;
  std::string_view s_;
  size_t pos_ = 0;
  int group_depth_ = 0;
  Grammar* g_ = nullptr;
  std::map<std::string, uint32_t> ids_;
  std::vector<std::vector<Sequence>> rules_;
  std::vector<bool> defined_;
  std::string current_rule_;
  int helper_counter_ = 0;
};

std::shared_ptr<const Grammar> Grammar::parse(std::string_view gbnf) { return GrammarParser(gbnf).run(); }

}  // namespace roofline::serve
