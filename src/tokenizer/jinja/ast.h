// Syntax tree of a parsed Jinja template: expressions and statements, each with its source line.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/jinja/value.h"

namespace roofline::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind { Literal, Name, List, Dict, Attr, Index, Slice, Call, Filter, Test, Unary, Binary, And, Or, Not, Cond };
  Kind kind;
  int line = 0;
  Value literal;                 // Literal
  std::string name;              // Name, Attr, Filter, Test; operator of Unary/Binary
  std::vector<ExprPtr> items;    // List, Dict (k0, v0, k1, v1...), Call/Filter/Test positional args
  std::vector<std::pair<std::string, ExprPtr>> kwargs;  // Call/Filter/Test keyword args
  ExprPtr a, b, c, d;            // operands: object, index/slice parts, condition ...
  bool negated = false;          // Test: "is not"

  Expr(Kind k, int l) : kind(k), line(l) {}
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Stmt {
  enum class Kind { Text, Output, If, For, Set, SetBlock, Macro, Break, Continue, FilterBlock, CallBlock };
  Kind kind;
  int line = 0;
  std::string text;                              // Text; Set/SetBlock/Macro name; FilterBlock filter name
  ExprPtr expr;                                  // Output; Set value; For iterable; FilterBlock/CallBlock call
  std::vector<std::pair<ExprPtr, Body>> branches;  // If: (condition, body)...
  Body body, else_body;                          // For, SetBlock, Macro, If (else)
  std::vector<std::string> targets;              // For / Set names (tuple unpacking)
  ExprPtr attr_target;                           // Set ns.attr = ...: the namespace expression
  ExprPtr cond;                                  // For ... if cond
  std::vector<std::pair<std::string, ExprPtr>> params;  // Macro parameters with defaults (may be null)

  Stmt(Kind k, int l) : kind(k), line(l) {}
};

}  // namespace roofline::jinja
