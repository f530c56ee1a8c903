// Internal: the tree-walking interpreter of jinja::Template and its built-in filters, tests,
// methods and globals (builtins.cpp).
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

#include "tokenizer/jinja/template.h"

namespace roofline::jinja {

class Interpreter {
 public:
  // Bounds on what a render builds: a chain such as |join(sep)|join(sep) grows a string geometrically,
  // list + list in a loop doubles it. Every value an expression yields is checked (check_size), and the
  // built-ins that could build a larger one inside a single call check as they go.
  static constexpr size_t kMaxStringBytes = 64u << 20;
  static constexpr size_t kMaxListItems = 1u << 20;

  Interpreter(const RenderOptions& options, std::string& out) : opt_(options), out_(&out) {}

  void run(const Body& body, const Value& context);

  // Used by the built-ins.
  Value apply_filter(const std::string& name, const Value& v, Args& args, int line);
  bool apply_test(const std::string& name, const Value& v, Args& args, int line);
  Value get_attr(const Value& obj, const std::string& name, int line);
  Value get_item(const Value& obj, const Value& key, int line);
  Value call(const Value& f, Args& args, int line);
  const RenderOptions& options() const { return opt_; }

 private:
  enum class Flow { Normal, Break, Continue };
  Flow exec(const Body& body);
  Flow exec(const Stmt& s);
  Value eval(const Expr& e);
  Args eval_args(const Expr& e);
  Value lookup(const std::string& name) const;
  void assign(const std::string& name, Value v);
  void write(const std::string& s);
  Value method(const Value& obj, const std::string& name, int line);
  Value global(const std::string& name) const;
  Value binary(const std::string& op, const Value& a, const Value& b, int line);
  Value make_macro(const Stmt& s);

  // Bounds on one render, since a template comes with the model file (untrusted): loop iterations and
  // calls together (a loop in a loop over long ranges would otherwise run for hours), and how deeply
  // statements and expressions recurse at run time (macros calling macros, each with nested
  // expressions): past either the render is an Error, not a hang or a stack overflow.
  static constexpr int64_t kMaxSteps = 250000;
  static void check_size(const Value& v, int line);
  Value eval_node(const Expr& e);
  static constexpr int kMaxRecursion = 1000;
  void count_step(int line);
  class Recursion;

  const RenderOptions& opt_;
  std::string* out_;
  std::vector<std::unordered_map<std::string, Value>> scopes_;
  int depth_ = 0;
  int64_t steps_ = 0;
  int recursion_ = 0;
};

[[noreturn]] void template_error(int line, const std::string& msg);
// The leading digits of an attribute name used as a list index (x.0, attr="items.2"); too large is an error.
int64_t index_from_digits(const std::string& name, int line);

}  // namespace roofline::jinja
