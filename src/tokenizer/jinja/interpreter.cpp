// Jinja interpreter: statements (Jinja2 scoping: a for-loop iteration and a macro call get their own
// scope, if-blocks do not), expressions with Python semantics, attribute/item lookup with Jinja's
// fallbacks, macros and loop variables. Filters/tests/methods/globals are in builtins.cpp.
#include <charconv>
#include <cmath>

#include "core/error.h"
#include "tokenizer/jinja/interpreter.h"
#include "tokenizer/jinja/parser.h"

namespace roofline::jinja {

namespace {
constexpr int kMaxDepth = 256;
constexpr const char* kFilterBody = "\x01filter-body";

int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}
}  // namespace

[[noreturn]] void template_error(int line, const std::string& msg) { fail("template line {}: {}", line, msg); }

int64_t index_from_digits(const std::string& name, int line) {
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(name.data(), name.data() + name.size(), v);
  if (ec != std::errc()) template_error(line, "index '" + name + "' out of range");
  return v;
}

// One level of run-time recursion (exec of a statement, eval of an expression) while in scope.
class Interpreter::Recursion {
 public:
  Recursion(Interpreter& in, int line) : in_(in) {
    if (++in_.recursion_ > kMaxRecursion) template_error(line, fmt::format("the template recurses more than {} levels deep", kMaxRecursion));
  }
  ~Recursion() { --in_.recursion_; }

 private:
  Interpreter& in_;
};

void Interpreter::count_step(int line) {
  if (++steps_ > kMaxSteps) template_error(line, fmt::format("the template runs more than {} loop iterations and calls", kMaxSteps));
}

Template::Template(const std::string& source, const LexOptions& options)
    : body_(std::make_shared<const Body>(parse(source, options))) {}

std::string Template::render(const Value& context, const RenderOptions& options) const {
  std::string out;
  Interpreter in(options, out);
  in.run(*body_, context);
  return out;
}

std::string Template::render(const nlohmann::ordered_json& context, const RenderOptions& options) const {
  return render(Value::from_json(context), options);
}

void Interpreter::run(const Body& body, const Value& context) {
  scopes_.clear();
  scopes_.emplace_back();
  if (context.is_dict())
    for (const auto& [k, v] : context.dict().items)
      if (k.is_string()) scopes_.back()[k.str_ref()] = v;
  const Flow f = exec(body);
  if (f != Flow::Normal) fail("template: 'break' or 'continue' outside of a loop");
}

void Interpreter::write(const std::string& s) {
  out_->append(s);
  if (out_->size() > opt_.max_output) fail("template output exceeds {} bytes", opt_.max_output);
}

Value Interpreter::lookup(const std::string& name) const {
  for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
    auto f = it->find(name);
    if (f != it->end()) return f->second;
  }
  return global(name);
}

void Interpreter::assign(const std::string& name, Value v) { scopes_.back()[name] = std::move(v); }

Interpreter::Flow Interpreter::exec(const Body& body) {
  for (const auto& s : body) {
    const Flow f = exec(*s);
    if (f != Flow::Normal) return f;
  }
  return Flow::Normal;
}

Interpreter::Flow Interpreter::exec(const Stmt& s) {
  const Recursion level(*this, s.line);
  switch (s.kind) {
    case Stmt::Kind::Text:
      write(s.text);
      return Flow::Normal;
    case Stmt::Kind::Output: {
      const Value v = eval(*s.expr);
      write(v.str());
      return Flow::Normal;
    }
    case Stmt::Kind::If:
      for (const auto& [cond, body] : s.branches)
        if (eval(*cond).truthy()) return exec(body);
      return exec(s.else_body);
    case Stmt::Kind::For: {
      const Value iterable = eval(*s.expr);
      if (iterable.is_undefined()) template_error(s.line, "'" + (s.expr->kind == Expr::Kind::Name ? s.expr->name : std::string("value")) + "' is undefined");
      if (!iterable.is_iterable()) template_error(s.line, "'" + iterable.type_name() + "' object is not iterable");
      Array items = iterable.iterate();
      auto bind = [&](const Value& item) {
        if (s.targets.size() == 1) {
          assign(s.targets[0], item);
          return;
        }
        Array parts = item.is_list() ? item.list() : item.iterate();
        if (parts.size() != s.targets.size())
          template_error(s.line, fmt::format("cannot unpack {} values into {} names", parts.size(), s.targets.size()));
        for (size_t k = 0; k < parts.size(); ++k) assign(s.targets[k], parts[k]);
      };
      if (s.cond) {
        Array kept;
        for (const auto& item : items) {
          count_step(s.line);
          scopes_.emplace_back();
          bind(item);
          const bool keep = eval(*s.cond).truthy();
          scopes_.pop_back();
          if (keep) kept.push_back(item);
        }
        items.swap(kept);
      }
      if (items.empty()) return exec(s.else_body);
      const int64_t n = (int64_t)items.size();
      for (int64_t i = 0; i < n; ++i) {
        count_step(s.line);
        scopes_.emplace_back();
        Dict loop;
        loop.set("index", Value(i + 1));
        loop.set("index0", Value(i));
        loop.set("revindex", Value(n - i));
        loop.set("revindex0", Value(n - i - 1));
        loop.set("first", Value(i == 0));
        loop.set("last", Value(i == n - 1));
        loop.set("length", Value(n));
        loop.set("depth", Value(1));
        loop.set("depth0", Value(0));
        loop.set("previtem", i > 0 ? items[i - 1] : Value());
        loop.set("nextitem", i + 1 < n ? items[i + 1] : Value());
        loop.set("cycle", Value::function("loop.cycle", [i](Args& a) -> Value {
                   if (a.pos.empty()) fail("no items for cycling given");
                   return a.pos[(size_t)i % a.pos.size()];
                 }));
        assign("loop", Value(std::move(loop)));
        bind(items[i]);
        const Flow f = exec(s.body);
        scopes_.pop_back();
        if (f == Flow::Break) break;
      }
      return Flow::Normal;
    }
    case Stmt::Kind::Set: {
      Value v = eval(*s.expr);
      if (s.attr_target) {
        Value ns = eval(*s.attr_target);
        if (!ns.is_namespace()) template_error(s.line, "can only set attributes of a namespace() object, not of " + ns.type_name());
        try {
          ns.set_attribute(s.text, std::move(v));
        } catch (const Error& e) {
          template_error(s.line, e.what());
        }
        return Flow::Normal;
      }
      if (s.targets.size() == 1) {
        assign(s.targets[0], std::move(v));
      } else {
        Array parts = v.is_list() ? v.list() : v.iterate();
        if (parts.size() != s.targets.size())
          template_error(s.line, fmt::format("cannot unpack {} values into {} names", parts.size(), s.targets.size()));
        for (size_t k = 0; k < parts.size(); ++k) assign(s.targets[k], parts[k]);
      }
      return Flow::Normal;
    }
    case Stmt::Kind::SetBlock: {
      std::string captured, *saved = out_;
      out_ = &captured;
      const Flow f = exec(s.body);
      out_ = saved;
      assign(s.text, Value(captured));
      return f;
    }
    case Stmt::Kind::Macro:
      assign(s.text, make_macro(s));
      return Flow::Normal;
    case Stmt::Kind::CallBlock: {
      if (s.expr->kind != Expr::Kind::Call) template_error(s.line, "{% call %} needs a macro call");
      const Body* body = &s.body;
      Value caller = Value::function("caller", [this, body](Args&) -> Value {
        std::string captured, *saved = out_;
        out_ = &captured;
        scopes_.emplace_back();
        exec(*body);
        scopes_.pop_back();
        out_ = saved;
        return Value(captured);
      });
      Value f = eval(*s.expr->a);
      Args args = eval_args(*s.expr);
      args.kw.emplace_back("caller", caller);
      write(call(f, args, s.line).str());
      return Flow::Normal;
    }
    case Stmt::Kind::FilterBlock: {
      std::string captured, *saved = out_;
      out_ = &captured;
      const Flow f = exec(s.body);
      out_ = saved;
      scopes_.emplace_back();
      assign(kFilterBody, Value(captured));
      const Value v = eval(*s.expr);
      scopes_.pop_back();
      write(v.str());
      return f;
    }
    case Stmt::Kind::Break: return Flow::Break;
    case Stmt::Kind::Continue: return Flow::Continue;
  }
  return Flow::Normal;
}

Value Interpreter::make_macro(const Stmt& s) {
  const Stmt* m = &s;
  return Value::function(s.text, [this, m](Args& args) -> Value {
    if (++depth_ > kMaxDepth) {
      depth_ = 0;
      template_error(m->line, "macro recursion too deep");
    }
    scopes_.emplace_back();
    Array varargs;
    for (size_t k = 0; k < m->params.size(); ++k) {
      const auto& [pname, def] = m->params[k];
      Value v = args.get(k, pname.c_str());
      if (!args.has(k, pname.c_str()) && def) v = eval(*def);
      assign(pname, v);
    }
    for (size_t k = m->params.size(); k < args.pos.size(); ++k) varargs.push_back(args.pos[k]);
    assign("varargs", Value(varargs));
    for (const auto& [k, v] : args.kw)
      if (k == "caller") assign("caller", v);
    std::string captured, *saved = out_;
    out_ = &captured;
    exec(m->body);
    out_ = saved;
    scopes_.pop_back();
    --depth_;
    return Value(captured);
  });
}

Args Interpreter::eval_args(const Expr& e) {
  Args a;
  for (const auto& x : e.items) a.pos.push_back(eval(*x));
  for (const auto& [k, x] : e.kwargs) a.kw.emplace_back(k, eval(*x));
  return a;
}

Value Interpreter::call(const Value& f, Args& args, int line) {
  if (!f.is_function()) template_error(line, "'" + f.type_name() + "' object is not callable");
  count_step(line);
  if (++depth_ > kMaxDepth) {
    depth_ = 0;
    template_error(line, "calls nested too deeply");
  }
  Value r = f.call(args);
  --depth_;
  return r;
}

Value Interpreter::get_attr(const Value& obj, const std::string& name, int line) {
  if (obj.is_undefined()) template_error(line, "cannot read attribute '" + name + "' of an undefined value");
  if (obj.is_dict() && !obj.is_namespace()) {
    static const char* dict_methods[] = {"items", "keys", "values", "get", "copy", "pop", "update", "setdefault"};
    for (const char* m : dict_methods)
      if (name == m) return method(obj, name, line);
    const Value* v = obj.dict().find(Value(name));
    return v ? *v : Value();
  }
  if (obj.is_namespace()) {
    const Value* v = obj.dict().find(Value(name));
    return v ? *v : Value();
  }
  if (obj.is_string() || obj.is_list()) {
    if (obj.is_list() && !name.empty() && std::isdigit((unsigned char)name[0])) return get_item(obj, Value(index_from_digits(name, line)), line);
    return method(obj, name, line);
  }
  return Value();
}

Value Interpreter::get_item(const Value& obj, const Value& key, int line) {
  if (obj.is_undefined()) template_error(line, "cannot index an undefined value");
  if (obj.is_dict()) {
    const Value* v = obj.dict().find(key);
    if (v) return *v;
    if (key.is_string() && !obj.is_namespace()) return Value();
    return Value();
  }
  if ((obj.is_list() || obj.is_string()) && (key.is_int() || key.is_bool())) {
    const Array items = obj.is_list() ? Array() : obj.iterate();
    const Array& arr = obj.is_list() ? obj.list() : items;
    int64_t i = key.as_int();
    if (i < 0) i += (int64_t)arr.size();
    if (i < 0 || i >= (int64_t)arr.size()) return Value();
    return arr[(size_t)i];
  }
  if (key.is_string()) return get_attr(obj, key.str_ref(), line);
  return Value();
}

Value Interpreter::binary(const std::string& op, const Value& a, const Value& b, int line) {
  auto num = [](const Value& v) { return v.is_number() || v.is_bool(); };
  auto type_err = [&]() -> Value {
    template_error(line, fmt::format("unsupported operand type(s) for {}: '{}' and '{}'", op, a.type_name(), b.type_name()));
  };
  if (op == "~") return Value(a.str() + b.str());
  if (op == "==") return Value(a == b);
  if (op == "!=") return Value(a != b);
  if (op == "<" || op == ">" || op == "<=" || op == ">=") {
    int c = 0;
    try {
      c = compare(a, b);
    } catch (const Error& e) {
      template_error(line, e.what());
    }
    if (op == "<") return Value(c < 0);
    if (op == ">") return Value(c > 0);
    if (op == "<=") return Value(c <= 0);
    return Value(c >= 0);
  }
  if (op == "in" || op == "not in") {
    bool r = false;
    if (b.is_string()) {
      if (!a.is_string()) template_error(line, "'in <string>' requires string as left operand, not " + a.type_name());
      r = b.str_ref().find(a.str_ref()) != std::string::npos;
    } else if (b.is_list()) {
      for (const auto& x : b.list()) r = r || x == a;
    } else if (b.is_dict()) {
      r = b.dict().find(a) != nullptr;
    } else if (!b.is_undefined()) {
      template_error(line, "argument of type '" + b.type_name() + "' is not iterable");
    }
    return Value(op == "in" ? r : !r);
  }
  if (a.is_undefined() || b.is_undefined()) template_error(line, "an operand of '" + op + "' is undefined");
  if (op == "+") {
    if (num(a) && num(b)) {
      if (a.is_float() || b.is_float()) return Value(a.as_double() + b.as_double());
      return Value(a.as_int() + b.as_int());
    }
    if (a.is_string() && b.is_string()) return Value(a.str_ref() + b.str_ref());
    if (a.is_list() && b.is_list()) {
      Array r = a.list();
      r.insert(r.end(), b.list().begin(), b.list().end());
      return Value(std::move(r));
    }
    return type_err();
  }
  if (op == "*") {
    if (num(a) && num(b)) {
      if (a.is_float() || b.is_float()) return Value(a.as_double() * b.as_double());
      return Value(a.as_int() * b.as_int());
    }
    const Value* seq = a.is_string() || a.is_list() ? &a : (b.is_string() || b.is_list() ? &b : nullptr);
    const Value* cnt = seq == &a ? &b : &a;
    if (seq && (cnt->is_int() || cnt->is_bool())) {
      const int64_t n = std::max<int64_t>(0, cnt->as_int());
      const int64_t size = seq->is_string() ? (int64_t)seq->str_ref().size() : (int64_t)seq->list().size();
      if (size > 0 && n > (int64_t)(seq->is_string() ? std::min(opt_.max_output, kMaxStringBytes) : kMaxListItems) / size)
        template_error(line, "repetition result too large");
      if (seq->is_string()) {
        std::string r;
        for (int64_t k = 0; k < n; ++k) r += seq->str_ref();
        return Value(r);
      }
      Array r;
      for (int64_t k = 0; k < n; ++k) r.insert(r.end(), seq->list().begin(), seq->list().end());
      return Value(std::move(r));
    }
    return type_err();
  }
  if (op == "%" && a.is_string()) {
    // printf-style formatting: %s, %d, %r, %%.
    Array vals = b.is_list() ? b.list() : Array{b};
    std::string r;
    size_t k = 0;
    const std::string& f = a.str_ref();
    for (size_t i = 0; i < f.size(); ++i) {
      if (f[i] != '%' || i + 1 >= f.size()) {
        r += f[i];
        continue;
      }
      const char c = f[++i];
      if (c == '%') {
        r += '%';
        continue;
      }
      if (k >= vals.size()) template_error(line, "not enough arguments for format string");
      const Value& v = vals[k++];
      if (c == 'd' || c == 'i') r += std::to_string(v.as_int());
      else if (c == 'r') r += v.repr();
      else r += v.str();
    }
    return Value(r);
  }
  if (!num(a) || !num(b)) return type_err();
  const bool fl = a.is_float() || b.is_float();
  if (op == "-") return fl ? Value(a.as_double() - b.as_double()) : Value(a.as_int() - b.as_int());
  if (op == "/") {
    if (b.as_double() == 0) template_error(line, "division by zero");
    return Value(a.as_double() / b.as_double());
  }
  if (op == "//") {
    if (b.as_double() == 0) template_error(line, "integer division or modulo by zero");
    if (fl) return Value(std::floor(a.as_double() / b.as_double()));
    return Value(floor_div(a.as_int(), b.as_int()));
  }
  if (op == "%") {
    if (b.as_double() == 0) template_error(line, "integer division or modulo by zero");
    if (fl) {
      const double x = a.as_double(), y = b.as_double();
      return Value(x - std::floor(x / y) * y);
    }
    return Value(a.as_int() - floor_div(a.as_int(), b.as_int()) * b.as_int());
  }
  if (op == "**") {
    if (!fl && b.as_int() >= 0) {
      int64_t r = 1;
      for (int64_t k = 0; k < b.as_int() && k < 64; ++k) r *= a.as_int();
      return Value(r);
    }
    return Value(std::pow(a.as_double(), b.as_double()));
  }
  return type_err();
}

void Interpreter::check_size(const Value& v, int line) {
  if (v.is_string() && v.str_ref().size() > kMaxStringBytes)
    template_error(line, fmt::format("a string of more than {} bytes", kMaxStringBytes));
  if (v.is_list() && v.list().size() > kMaxListItems) template_error(line, fmt::format("a list of more than {} items", kMaxListItems));
}

Value Interpreter::eval(const Expr& e) {
  const Recursion level(*this, e.line);
  Value v = eval_node(e);
  check_size(v, e.line);
  return v;
}

Value Interpreter::eval_node(const Expr& e) {
  switch (e.kind) {
    case Expr::Kind::Literal: return e.literal;
    case Expr::Kind::Name: return lookup(e.name);
    case Expr::Kind::List: {
      Array a;
      for (const auto& x : e.items) a.push_back(eval(*x));
      return e.name == "tuple" ? Value::tuple(std::move(a)) : Value(std::move(a));
    }
    case Expr::Kind::Dict: {
      Dict d;
      for (size_t i = 0; i + 1 < e.items.size(); i += 2) d.set(eval(*e.items[i]), eval(*e.items[i + 1]));
      return Value(std::move(d));
    }
    case Expr::Kind::Attr: {
      const Value obj = eval(*e.a);
      if (obj.is_undefined() && e.a->kind == Expr::Kind::Name) template_error(e.line, "'" + e.a->name + "' is undefined");
      return get_attr(obj, e.name, e.line);
    }
    case Expr::Kind::Index: {
      const Value obj = eval(*e.a);
      if (obj.is_undefined() && e.a->kind == Expr::Kind::Name) template_error(e.line, "'" + e.a->name + "' is undefined");
      return get_item(obj, eval(*e.b), e.line);
    }
    case Expr::Kind::Slice: {
      const Value obj = eval(*e.a);
      if (!obj.is_list() && !obj.is_string()) template_error(e.line, "cannot slice a value of type " + obj.type_name());
      const Array items = obj.is_list() ? obj.list() : obj.iterate();
      const int64_t n = (int64_t)items.size();
      const int64_t step = e.d ? eval(*e.d).as_int() : 1;
      if (step == 0) template_error(e.line, "slice step cannot be zero");
      auto clamp = [&](const ExprPtr& x, int64_t def) -> int64_t {
        if (!x) return def;
        const Value v = eval(*x);
        if (v.is_none() || v.is_undefined()) return def;
        int64_t i = v.as_int();
        if (i < 0) i += n;
        if (step > 0) return std::clamp<int64_t>(i, 0, n);
        return std::clamp<int64_t>(i, -1, n - 1);
      };
      const int64_t start = clamp(e.b, step > 0 ? 0 : n - 1), stop = clamp(e.c, step > 0 ? n : -1);
      Array out;
      for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.push_back(items[(size_t)i]);
      if (obj.is_list()) return Value(std::move(out));
      std::string s;
      for (const auto& x : out) s += x.str_ref();
      return Value(s);
    }
    case Expr::Kind::Call: {
      Args args = eval_args(e);
      if (e.a->kind == Expr::Kind::Name) {
        const Value f = lookup(e.a->name);
        if (f.is_undefined()) template_error(e.line, "'" + e.a->name + "' is undefined");
        args.callee = e.a->name;
        return call(f, args, e.line);
      }
      const Value f = eval(*e.a);
      args.callee = e.a->kind == Expr::Kind::Attr ? e.a->name : "function";
      return call(f, args, e.line);
    }
    case Expr::Kind::Filter: {
      const Value v = eval(*e.a);
      Args args = eval_args(e);
      return apply_filter(e.name, v, args, e.line);
    }
    case Expr::Kind::Test: {
      const Value v = eval(*e.a);
      Args args = eval_args(e);
      const bool r = apply_test(e.name, v, args, e.line);
      return Value(e.negated ? !r : r);
    }
    case Expr::Kind::Unary: {
      const Value v = eval(*e.a);
      if (!v.is_number() && !v.is_bool()) template_error(e.line, "bad operand type for unary " + e.name + ": '" + v.type_name() + "'");
      if (e.name == "+") return v.is_float() ? v : Value(v.as_int());
      return v.is_float() ? Value(-v.as_double()) : Value(-v.as_int());
    }
    case Expr::Kind::Binary: return binary(e.name, eval(*e.a), eval(*e.b), e.line);
    case Expr::Kind::And: {
      Value l = eval(*e.a);
      return l.truthy() ? eval(*e.b) : l;
    }
    case Expr::Kind::Or: {
      Value l = eval(*e.a);
      return l.truthy() ? l : eval(*e.b);
    }
    case Expr::Kind::Not: return Value(!eval(*e.a).truthy());
    case Expr::Kind::Cond:
      if (eval(*e.a).truthy()) return eval(*e.b);
      return e.c ? eval(*e.c) : Value();
  }
  return Value();
}

}  // namespace roofline::jinja
