// Recursive-descent Jinja parser for the subset chat templates use: if/elif/else, for (tuple
// targets, filter condition, else, loop controls), set (names, tuples, namespace attributes, blocks),
// macros, call/filter blocks, generation blocks (pass-through), and the full expression grammar.
#include "tokenizer/jinja/parser.h"

#include <cstring>

#include "core/error.h"

namespace roofline::jinja {
namespace {

// How deep expressions and blocks may nest (parentheses, operands, filters, blocks in blocks): each level
// is a few frames of this parser's recursion, of the interpreter's and of the tree's destructor, so a
// template (untrusted: it comes with the model file) nested deeper is an error, not a stack overflow.
// Python's own parser stops at 200 nested parentheses.
constexpr int kMaxNesting = 256;

class Parser {
 public:
  explicit Parser(std::vector<Token> toks) : t_(std::move(toks)) {}

  Body parse_all() {
    std::string end;
    Body body = parse_body({}, &end);
    return body;
  }

 private:
  const Token& cur() const { return t_[i_]; }
  const Token& peek(size_t k = 1) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  [[noreturn]] void error(const std::string& msg) const { fail("template line {}: {}", cur().line, msg); }
  // Counts nesting levels while in scope: one on entry when asked, one more each deeper() (a loop that
  // wraps the expression built so far in one more node nests it as deeply as recursion would).
  class Nest {
   public:
    Nest(Parser& p, int levels) : p_(p) {
      for (int i = 0; i < levels; ++i) deeper();
    }
    ~Nest() { p_.depth_ -= n_; }
    void deeper() {
      ++n_;
      if (++p_.depth_ > kMaxNesting) p_.error(fmt::format("expressions or blocks nested more than {} deep", kMaxNesting));
    }

   private:
    Parser& p_;
    int n_ = 0;
  };
  bool is_op(const char* op) const { return cur().type == Tok::Op && cur().text == op; }
  bool is_name(const char* n) const { return cur().type == Tok::Name && cur().text == n; }
  void expect_op(const char* op) {
    if (!is_op(op)) error(fmt::format("expected '{}', found {}", op, describe(cur())));
    ++i_;
  }
  std::string expect_name() {
    if (cur().type != Tok::Name) error("expected a name, found " + describe(cur()));
    return t_[i_++].text;
  }
  void expect_block_end() {
    if (cur().type != Tok::BlockEnd) error("expected end of tag '%}', found " + describe(cur()));
    ++i_;
  }
  static std::string describe(const Token& t) {
    switch (t.type) {
      case Tok::End: return "end of template";
      case Tok::BlockEnd: return "'%}'";
      case Tok::VarEnd: return "'}}'";
      case Tok::Text: return "text";
      case Tok::String: return "string '" + t.text + "'";
      default: return "'" + t.text + "'";
    }
  }

  // Parses statements until a block tag whose keyword is in `ends`; that keyword is consumed
  // (the rest of its tag is left) and returned in *end.
  Body parse_body(std::initializer_list<const char*> ends, std::string* end) {
    Nest nest(*this, 1);
    Body body;
    while (true) {
      const Token& tk = cur();
      if (tk.type == Tok::End) {
        if (ends.size()) {
          std::string want;
          for (const char* e : ends) want += (want.empty() ? "" : " or ") + std::string("'") + e + "'";
          error("unexpected end of template, expected " + want);
        }
        *end = "";
        return body;
      }
      if (tk.type == Tok::Text) {
        auto s = std::make_unique<Stmt>(Stmt::Kind::Text, tk.line);
        s->text = tk.text;
        body.push_back(std::move(s));
        ++i_;
      } else if (tk.type == Tok::VarBegin) {
        ++i_;
        auto s = std::make_unique<Stmt>(Stmt::Kind::Output, tk.line);
        s->expr = parse_expr();
        if (cur().type != Tok::VarEnd) error("expected end of print statement '}}', found " + describe(cur()));
        ++i_;
        body.push_back(std::move(s));
      } else if (tk.type == Tok::BlockBegin) {
        ++i_;
        const std::string kw = expect_name();
        for (const char* e : ends)
          if (kw == e) {
            *end = kw;
            return body;
          }
        body.push_back(parse_statement(kw));
      } else {
        error("unexpected " + describe(tk));
      }
    }
  }

  StmtPtr parse_statement(const std::string& kw) {
    const int line = t_[i_ - 1].line;
    if (kw == "if") {
      auto s = std::make_unique<Stmt>(Stmt::Kind::If, line);
      ExprPtr c = parse_expr();
      expect_block_end();
      std::string end;
      while (true) {
        Body b = parse_body({"elif", "else", "endif"}, &end);
        s->branches.emplace_back(std::move(c), std::move(b));
        if (end == "elif") {
          c = parse_expr();
          expect_block_end();
          continue;
        }
        if (end == "else") {
          expect_block_end();
          s->else_body = parse_body({"endif"}, &end);
        }
        expect_block_end();
        return s;
      }
    }
    if (kw == "for") {
      auto s = std::make_unique<Stmt>(Stmt::Kind::For, line);
      s->targets = parse_targets();
      if (!is_name("in")) error("expected 'in' in for loop, found " + describe(cur()));
      ++i_;
      s->expr = parse_expr(false);
      if (is_name("if")) {
        ++i_;
        s->cond = parse_expr(false);
      }
      if (is_name("recursive")) error("recursive for loops are not supported");
      expect_block_end();
      std::string end;
      s->body = parse_body({"else", "endfor"}, &end);
      if (end == "else") {
        expect_block_end();
        s->else_body = parse_body({"endfor"}, &end);
      }
      expect_block_end();
      return s;
    }
    if (kw == "set") {
      // set a = x | set a, b = x | set ns.attr = x | set a %}...{% endset
      if (cur().type == Tok::Name && peek().type == Tok::Op && peek().text == ".") {
        auto s = std::make_unique<Stmt>(Stmt::Kind::Set, line);
        auto ns = std::make_unique<Expr>(Expr::Kind::Name, line);
        ns->name = expect_name();
        expect_op(".");
        s->text = expect_name();
        s->attr_target = std::move(ns);
        expect_op("=");
        s->expr = parse_expr();
        expect_block_end();
        return s;
      }
      std::vector<std::string> names = parse_targets();
      if (is_op("=")) {
        ++i_;
        auto s = std::make_unique<Stmt>(Stmt::Kind::Set, line);
        s->targets = std::move(names);
        s->expr = parse_expr();
        expect_block_end();
        return s;
      }
      if (names.size() != 1) error("a block set takes one name");
      auto s = std::make_unique<Stmt>(Stmt::Kind::SetBlock, line);
      s->text = names[0];
      expect_block_end();
      std::string end;
      s->body = parse_body({"endset"}, &end);
      expect_block_end();
      return s;
    }
    if (kw == "macro") {
      auto s = std::make_unique<Stmt>(Stmt::Kind::Macro, line);
      s->text = expect_name();
      expect_op("(");
      while (!is_op(")")) {
        std::string p = expect_name();
        ExprPtr def;
        if (is_op("=")) {
          ++i_;
          def = parse_expr();
        }
        s->params.emplace_back(std::move(p), std::move(def));
        if (!is_op(")")) expect_op(",");
      }
      ++i_;
      expect_block_end();
      std::string end;
      s->body = parse_body({"endmacro"}, &end);
      if (cur().type == Tok::Name) ++i_;  // {% endmacro name %}
      expect_block_end();
      return s;
    }
    if (kw == "call") {
      auto s = std::make_unique<Stmt>(Stmt::Kind::CallBlock, line);
      s->expr = parse_expr();
      expect_block_end();
      std::string end;
      s->body = parse_body({"endcall"}, &end);
      expect_block_end();
      return s;
    }
    if (kw == "filter") {
      auto s = std::make_unique<Stmt>(Stmt::Kind::FilterBlock, line);
      // The filter chain is parsed as filters applied to a placeholder name.
      auto placeholder = std::make_unique<Expr>(Expr::Kind::Name, line);
      placeholder->name = "\x01filter-body";
      s->expr = parse_filter_chain(std::move(placeholder), true);
      expect_block_end();
      std::string end;
      s->body = parse_body({"endfilter"}, &end);
      expect_block_end();
      return s;
    }
    if (kw == "generation") {
      // transformers' {% generation %} marks assistant text for masks; it renders its body unchanged.
      expect_block_end();
      std::string end;
      Body b = parse_body({"endgeneration"}, &end);
      expect_block_end();
      auto s = std::make_unique<Stmt>(Stmt::Kind::If, line);
      auto t = std::make_unique<Expr>(Expr::Kind::Literal, line);
      t->literal = Value(true);
      s->branches.emplace_back(std::move(t), std::move(b));
      return s;
    }
    if (kw == "break" || kw == "continue") {
      expect_block_end();
      return std::make_unique<Stmt>(kw == "break" ? Stmt::Kind::Break : Stmt::Kind::Continue, line);
    }
    if (kw == "endif" || kw == "endfor" || kw == "endset" || kw == "endmacro" || kw == "else" || kw == "elif" ||
        kw == "endcall" || kw == "endfilter" || kw == "endgeneration")
      fail("template line {}: unexpected '{}' (no open block to close)", line, kw);
    fail("template line {}: unknown or unsupported tag '{}'", line, kw);
  }

  std::vector<std::string> parse_targets() {
    std::vector<std::string> names;
    const bool paren = is_op("(");
    if (paren) ++i_;
    names.push_back(expect_name());
    while (is_op(",")) {
      ++i_;
      if (cur().type != Tok::Name) break;
      names.push_back(expect_name());
    }
    if (paren) expect_op(")");
    return names;
  }

  ExprPtr make(Expr::Kind k) { return std::make_unique<Expr>(k, cur().line); }

  ExprPtr parse_expr(bool with_cond = true) {
    Nest nest(*this, 1);
    ExprPtr e = parse_or();
    while (with_cond && is_name("if")) {
      nest.deeper();
      ++i_;
      auto c = make(Expr::Kind::Cond);
      c->a = parse_or();
      if (is_name("else")) {
        ++i_;
        c->c = parse_expr();
      }
      c->b = std::move(e);
      e = std::move(c);
    }
    return e;
  }
  ExprPtr parse_or() {
    Nest nest(*this, 0);
    ExprPtr l = parse_and();
    while (is_name("or")) {
      nest.deeper();
      ++i_;
      auto n = make(Expr::Kind::Or);
      n->a = std::move(l);
      n->b = parse_and();
      l = std::move(n);
    }
    return l;
  }
  ExprPtr parse_and() {
    Nest nest(*this, 0);
    ExprPtr l = parse_not();
    while (is_name("and")) {
      nest.deeper();
      ++i_;
      auto n = make(Expr::Kind::And);
      n->a = std::move(l);
      n->b = parse_not();
      l = std::move(n);
    }
    return l;
  }
  ExprPtr parse_not() {
    if (is_name("not")) {
      Nest nest(*this, 1);
      ++i_;
      auto n = make(Expr::Kind::Not);
      n->a = parse_not();
      return n;
    }
    return parse_compare();
  }
  ExprPtr binary(const std::string& op, ExprPtr l, ExprPtr r) {
    auto n = make(Expr::Kind::Binary);
    n->name = op;
    n->a = std::move(l);
    n->b = std::move(r);
    return n;
  }
  ExprPtr parse_compare() {
    Nest nest(*this, 0);
    ExprPtr l = parse_math1();
    while (true) {
      if (cur().type == Tok::Op && (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == ">" ||
                                    cur().text == "<=" || cur().text == ">=")) {
        nest.deeper();
        const std::string op = t_[i_++].text;
        l = binary(op, std::move(l), parse_math1());
      } else if (is_name("in")) {
        nest.deeper();
        ++i_;
        l = binary("in", std::move(l), parse_math1());
      } else if (is_name("not") && peek().type == Tok::Name && peek().text == "in") {
        nest.deeper();
        i_ += 2;
        l = binary("not in", std::move(l), parse_math1());
      } else {
        return l;
      }
    }
  }
  ExprPtr parse_math1() {
    Nest nest(*this, 0);
    ExprPtr l = parse_concat();
    while (is_op("+") || is_op("-")) {
      nest.deeper();
      const std::string op = t_[i_++].text;
      l = binary(op, std::move(l), parse_concat());
    }
    return l;
  }
  ExprPtr parse_concat() {
    Nest nest(*this, 0);
    ExprPtr l = parse_math2();
    while (is_op("~")) {
      nest.deeper();
      ++i_;
      l = binary("~", std::move(l), parse_math2());
    }
    return l;
  }
  ExprPtr parse_math2() {
    Nest nest(*this, 0);
    ExprPtr l = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      nest.deeper();
      const std::string op = t_[i_++].text;
      l = binary(op, std::move(l), parse_pow());
    }
    return l;
  }
  ExprPtr parse_pow() {
    Nest nest(*this, 0);
    ExprPtr l = parse_unary(true);
    while (is_op("**")) {
      nest.deeper();
      ++i_;
      l = binary("**", std::move(l), parse_unary(true));
    }
    return l;
  }
  ExprPtr parse_unary(bool with_filter) {
    ExprPtr n;
    if (is_op("-") || is_op("+")) {
      Nest nest(*this, 1);
      auto u = make(Expr::Kind::Unary);
      u->name = t_[i_++].text;
      u->a = parse_unary(false);
      n = std::move(u);
    } else {
      n = parse_primary();
    }
    n = parse_postfix(std::move(n));
    if (with_filter) n = parse_filter_chain(std::move(n), false);
    return n;
  }

  ExprPtr parse_primary() {
    const Token& tk = cur();
    switch (tk.type) {
      case Tok::Name: {
        ++i_;
        auto lit = [&](Value v) {
          auto e = std::make_unique<Expr>(Expr::Kind::Literal, tk.line);
          e->literal = std::move(v);
          return e;
        };
        if (tk.text == "true" || tk.text == "True") return lit(Value(true));
        if (tk.text == "false" || tk.text == "False") return lit(Value(false));
        if (tk.text == "none" || tk.text == "None") return lit(Value::none());
        auto e = std::make_unique<Expr>(Expr::Kind::Name, tk.line);
        e->name = tk.text;
        return e;
      }
      case Tok::String: {
        std::string s;
        while (cur().type == Tok::String) s += t_[i_++].text;
        auto e = std::make_unique<Expr>(Expr::Kind::Literal, tk.line);
        e->literal = Value(s);
        return e;
      }
      case Tok::Int: {
        ++i_;
        auto e = std::make_unique<Expr>(Expr::Kind::Literal, tk.line);
        try {
          e->literal = Value((int64_t)std::stoll(tk.text));
        } catch (const std::exception&) {
          error("integer literal out of range: " + tk.text);
        }
        return e;
      }
      case Tok::Float: {
        ++i_;
        auto e = std::make_unique<Expr>(Expr::Kind::Literal, tk.line);
        e->literal = Value(std::strtod(tk.text.c_str(), nullptr));  // as Python: 1e999 is inf, 1e-999 is 0.0
        return e;
      }
      case Tok::Op:
        if (tk.text == "(") {
          ++i_;
          if (is_op(")")) {
            ++i_;
            auto l = make(Expr::Kind::List);
            l->name = "tuple";
            return l;
          }
          ExprPtr first = parse_expr();
          if (is_op(",")) {
            auto l = make(Expr::Kind::List);
            l->name = "tuple";
            l->items.push_back(std::move(first));
            while (is_op(",")) {
              ++i_;
              if (is_op(")")) break;
              l->items.push_back(parse_expr());
            }
            expect_op(")");
            return l;
          }
          expect_op(")");
          return first;
        }
        if (tk.text == "[") {
          ++i_;
          auto l = make(Expr::Kind::List);
          while (!is_op("]")) {
            l->items.push_back(parse_expr());
            if (!is_op("]")) expect_op(",");
          }
          ++i_;
          return l;
        }
        if (tk.text == "{") {
          ++i_;
          auto d = make(Expr::Kind::Dict);
          while (!is_op("}")) {
            d->items.push_back(parse_expr());
            expect_op(":");
            d->items.push_back(parse_expr());
            if (!is_op("}")) expect_op(",");
          }
          ++i_;
          return d;
        }
        break;
      default:
        break;
    }
    error("unexpected " + describe(tk) + " in expression");
  }

  void parse_call_args(Expr& call) {
    expect_op("(");
    while (!is_op(")")) {
      if (cur().type == Tok::Name && peek().type == Tok::Op && peek().text == "=") {
        std::string k = t_[i_].text;
        i_ += 2;
        call.kwargs.emplace_back(std::move(k), parse_expr());
      } else {
        if (is_op("*") || is_op("**")) error("*args and **kwargs in calls are not supported");
        call.items.push_back(parse_expr());
      }
      if (!is_op(")")) expect_op(",");
    }
    ++i_;
  }

  ExprPtr parse_postfix(ExprPtr n) {
    Nest nest(*this, 0);
    while (true) {
      if (is_op(".")) {
        nest.deeper();
        ++i_;
        auto a = make(Expr::Kind::Attr);
        if (cur().type == Tok::Int) a->name = t_[i_++].text;
        else a->name = expect_name();
        a->a = std::move(n);
        n = std::move(a);
      } else if (is_op("[")) {
        nest.deeper();
        ++i_;
        ExprPtr parts[3];
        bool slice = false;
        int k = 0;
        while (true) {
          if (is_op(":")) {
            slice = true;
            ++i_;
            if (++k > 2) error("too many ':' in slice");
            continue;
          }
          if (is_op("]")) break;
          if (parts[k]) error("expected ':' or ']' in subscript");
          parts[k] = parse_expr();
        }
        ++i_;
        if (slice) {
          auto s = make(Expr::Kind::Slice);
          s->a = std::move(n);
          s->b = std::move(parts[0]);
          s->c = std::move(parts[1]);
          s->d = std::move(parts[2]);
          n = std::move(s);
        } else {
          if (!parts[0]) error("empty subscript");
          auto s = make(Expr::Kind::Index);
          s->a = std::move(n);
          s->b = std::move(parts[0]);
          n = std::move(s);
        }
      } else if (is_op("(")) {
        nest.deeper();
        auto c = make(Expr::Kind::Call);
        c->a = std::move(n);
        parse_call_args(*c);
        n = std::move(c);
      } else {
        return n;
      }
    }
  }

  ExprPtr parse_filter_chain(ExprPtr n, bool first_without_bar) {
    Nest nest(*this, 0);
    bool first = first_without_bar;
    while (true) {
      if (is_op("|") || first) {
        nest.deeper();
        if (!first) ++i_;
        first = false;
        auto f = make(Expr::Kind::Filter);
        f->name = expect_name();
        while (is_op(".")) {
          ++i_;
          f->name += "." + expect_name();
        }
        f->a = std::move(n);
        if (is_op("(")) parse_call_args(*f);
        n = std::move(f);
      } else if (is_name("is")) {
        nest.deeper();
        ++i_;
        auto t = make(Expr::Kind::Test);
        if (is_name("not")) {
          ++i_;
          t->negated = true;
        }
        t->name = expect_name();
        t->a = std::move(n);
        if (is_op("(")) {
          parse_call_args(*t);
        } else if ((cur().type == Tok::Name || cur().type == Tok::String || cur().type == Tok::Int ||
                    cur().type == Tok::Float || is_op("[") || is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and") && !is_name("if") && !is_name("is") &&
                   !is_name("in") && !is_name("not")) {
          t->items.push_back(parse_postfix(parse_primary()));
        }
        n = std::move(t);
      } else if (is_op("(")) {
        nest.deeper();
        auto c = make(Expr::Kind::Call);
        c->a = std::move(n);
        parse_call_args(*c);
        n = std::move(c);
      } else {
        return n;
      }
    }
  }

  std::vector<Token> t_;
  size_t i_ = 0;
  int depth_ = 0;  // nesting levels open (Nest)
};

}  // namespace

Body parse(const std::string& source, const LexOptions& options) { return Parser(lex(source, options)).parse_all(); }

}  // namespace roofline::jinja
