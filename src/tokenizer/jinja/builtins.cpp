// Built-ins of the Jinja subset: filters (Jinja2's, with transformers' tojson), tests, Python string /
// dict / list methods, and the globals range, namespace, dict, raise_exception and strftime_now.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <ctime>

#include "core/error.h"
#include "tokenizer/jinja/interpreter.h"

namespace roofline::jinja {
namespace {

bool py_space(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

// Length of a Unicode whitespace sequence (beyond ASCII) at s[i], 0 if none.
size_t uspace_len(const std::string& s, size_t i) {
  const unsigned char c = s[i];
  if (py_space(c) || (c >= 0x1c && c <= 0x1f)) return 1;
  static const char* seqs[] = {"\xC2\x85", "\xC2\xA0", "\xE1\x9A\x80", "\xE2\x80\xA8", "\xE2\x80\xA9", "\xE2\x80\xAF",
                               "\xE2\x81\x9F", "\xE3\x80\x80"};
  for (const char* q : seqs)
    if (s.compare(i, std::strlen(q), q) == 0) return std::strlen(q);
  if (s.compare(i, 2, "\xE2\x80") == 0 && i + 2 < s.size() && (unsigned char)s[i + 2] >= 0x80 && (unsigned char)s[i + 2] <= 0x8A)
    return 3;
  return 0;
}

std::string strip(const std::string& s, const Value& chars, bool left, bool right) {
  size_t b = 0, e = s.size();
  if (chars.is_string()) {
    const std::string& cs = chars.str_ref();
    while (left && b < e && cs.find(s[b]) != std::string::npos) ++b;
    while (right && e > b && cs.find(s[e - 1]) != std::string::npos) --e;
    return s.substr(b, e - b);
  }
  while (left && b < e) {
    const size_t l = uspace_len(s, b);
    if (!l) break;
    b += l;
  }
  while (right && e > b) {
    size_t l = 0;
    for (size_t k = 1; k <= 3 && k <= e - b && !l; ++k)
      if (uspace_len(s, e - k) == k) l = k;
    if (!l) break;
    e -= l;
  }
  return s.substr(b, e - b);
}

Array split(const std::string& s, const Value& sep, int64_t maxsplit) {
  Array out;
  if (sep.is_string()) {
    const std::string& d = sep.str_ref();
    if (d.empty()) fail("empty separator");
    size_t pos = 0;
    while (maxsplit < 0 || (int64_t)out.size() < maxsplit) {
      const size_t f = s.find(d, pos);
      if (f == std::string::npos) break;
      out.emplace_back(s.substr(pos, f - pos));
      pos = f + d.size();
    }
    out.emplace_back(s.substr(pos));
    return out;
  }
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && py_space(s[i])) ++i;
    if (i >= s.size()) break;
    if (maxsplit >= 0 && (int64_t)out.size() >= maxsplit) {
      size_t e = s.size();
      while (e > i && py_space(s[e - 1])) --e;
      out.emplace_back(s.substr(i, e - i));
      break;
    }
    size_t j = i;
    while (j < s.size() && !py_space(s[j])) ++j;
    out.emplace_back(s.substr(i, j - i));
    i = j;
  }
  return out;
}

std::string replace_all(const std::string& s, const std::string& a, const std::string& b, int64_t count) {
  if (a.empty()) {
    std::string out;
    int64_t n = 0;
    for (size_t i = 0; i <= s.size(); ++i) {
      if (count < 0 || n < count) {
        out += b;
        ++n;
      }
      if (out.size() > Interpreter::kMaxStringBytes) fail("replace: the result is over {} bytes", Interpreter::kMaxStringBytes);
      if (i < s.size()) out += s[i];
    }
    return out;
  }
  std::string out;
  size_t pos = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    const size_t f = s.find(a, pos);
    if (f == std::string::npos) break;
    out += s.substr(pos, f - pos) + b;
    pos = f + a.size();
    ++n;
    if (out.size() > Interpreter::kMaxStringBytes) fail("replace: the result is over {} bytes", Interpreter::kMaxStringBytes);
  }
  return out + s.substr(pos);
}

std::string upper(std::string s) {
  for (auto& c : s) c = (char)std::toupper((unsigned char)c);
  return s;
}
std::string lower(std::string s) {
  for (auto& c : s) c = (char)std::tolower((unsigned char)c);
  return s;
}
std::string title(const std::string& s) {
  std::string out = s;
  bool prev_cased = false;
  for (auto& c : out) {
    const bool alpha = std::isalpha((unsigned char)c);
    if (alpha) c = prev_cased ? (char)std::tolower((unsigned char)c) : (char)std::toupper((unsigned char)c);
    prev_cased = alpha || ((unsigned char)c >= 0x80 && prev_cased);
  }
  return out;
}
std::string capitalize(const std::string& s) {
  std::string out = lower(s);
  if (!out.empty()) out[0] = (char)std::toupper((unsigned char)out[0]);
  return out;
}

const std::string& need_str(const Value& v, const std::string& what, int line) {
  if (!v.is_string()) template_error(line, what + " expects a string, got " + v.type_name());
  return v.str_ref();
}

Array items_of(const Value& v, int line) {
  Array out;
  if (v.is_undefined()) return out;
  if (!v.is_dict()) template_error(line, "items() needs a mapping, got " + v.type_name());
  for (const auto& [k, x] : v.dict().items) out.push_back(Value::tuple(Array{k, x}));
  return out;
}

}  // namespace

Value Interpreter::global(const std::string& name) const {
  if (name == "range")
    return Value::function("range", [](Args& a) -> Value {
      int64_t start = 0, stop = 0, step = 1;
      if (a.pos.size() == 1) stop = a.pos[0].as_int();
      else if (a.pos.size() >= 2) {
        start = a.pos[0].as_int();
        stop = a.pos[1].as_int();
        if (a.pos.size() >= 3) step = a.pos[2].as_int();
      } else fail("range expected at least 1 argument");
      if (step == 0) fail("range() arg 3 must not be zero");
      Array out;
      for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        out.push_back(Value(i));
        if (out.size() > Interpreter::kMaxListItems) fail("range too large (over {} items)", Interpreter::kMaxListItems);
      }
      return Value(std::move(out));
    });
  if (name == "namespace" || name == "dict")
    return Value::function(name, [name](Args& a) -> Value {
      Dict d;
      for (const auto& p : a.pos)
        if (p.is_dict())
          for (const auto& kv : p.dict().items) d.set(kv.first, kv.second);
      for (const auto& [k, v] : a.kw) d.set(Value(k), v);
      return Value(std::move(d), name == "namespace");
    });
  if (name == "raise_exception")
    return Value::function("raise_exception", [](Args& a) -> Value { fail("{}", a.get(0, "message").str()); });
  if (name == "strftime_now") {
    const std::time_t now = opt_.now ? opt_.now : std::time(nullptr);
    return Value::function("strftime_now", [now](Args& a) -> Value {
      std::tm tm{};
      localtime_r(&now, &tm);
      char buf[256];
      const std::string f = a.get(0, "format").str();
      const size_t n = std::strftime(buf, sizeof buf, f.c_str(), &tm);
      return Value(std::string(buf, n));
    });
  }
  return Value();
}

Value Interpreter::method(const Value& obj, const std::string& name, int line) {
  const Value self = obj;
  auto fn = [&](auto body) { return Value::function(name, body); };
  if (self.is_string()) {
    const std::string s = self.str_ref();
    if (name == "startswith" || name == "endswith") {
      const bool start = name == "startswith";
      return fn([s, start, line](Args& a) -> Value {
        const Value p = a.get(0, "prefix");
        Array opts = p.is_list() ? p.list() : Array{p};
        for (const auto& o : opts) {
          const std::string& x = need_str(o, start ? "startswith" : "endswith", line);
          if (x.size() <= s.size() && (start ? s.compare(0, x.size(), x) == 0 : s.compare(s.size() - x.size(), x.size(), x) == 0))
            return Value(true);
        }
        return Value(false);
      });
    }
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      const bool l = name != "rstrip", r = name != "lstrip";
      return fn([s, l, r](Args& a) -> Value { return Value(strip(s, a.get(0, "chars"), l, r)); });
    }
    if (name == "split" || name == "rsplit")
      return fn([s](Args& a) -> Value {
        const Value ms = a.get(1, "maxsplit");
        return Value(split(s, a.get(0, "sep"), ms.is_undefined() ? -1 : ms.as_int()));
      });
    if (name == "upper") return fn([s](Args&) -> Value { return Value(upper(s)); });
    if (name == "lower") return fn([s](Args&) -> Value { return Value(lower(s)); });
    if (name == "title") return fn([s](Args&) -> Value { return Value(title(s)); });
    if (name == "capitalize") return fn([s](Args&) -> Value { return Value(capitalize(s)); });
    if (name == "replace")
      return fn([s, line](Args& a) -> Value {
        const Value c = a.get(2, "count");
        return Value(replace_all(s, need_str(a.get(0, "old"), "replace", line), need_str(a.get(1, "new"), "replace", line),
                                 c.is_undefined() ? -1 : c.as_int()));
      });
    if (name == "find" || name == "rfind" || name == "index" || name == "count")
      return fn([s, name, line](Args& a) -> Value {
        const std::string& x = need_str(a.get(0, "sub"), name, line);
        if (name == "count") {
          if (x.empty()) return Value((int64_t)s.size() + 1);
          int64_t n = 0;
          for (size_t p = s.find(x); p != std::string::npos; p = s.find(x, p + x.size())) ++n;
          return Value(n);
        }
        const size_t p = name == "rfind" ? s.rfind(x) : s.find(x);
        if (p == std::string::npos) {
          if (name == "index") template_error(line, "substring not found");
          return Value((int64_t)-1);
        }
        return Value((int64_t)p);
      });
    if (name == "join")
      return fn([s](Args& a) -> Value {
        std::string out;
        const Array items = a.get(0, "iterable").iterate();
        for (size_t i = 0; i < items.size(); ++i) {
          out += (i ? s : "") + items[i].str();
          if (out.size() > Interpreter::kMaxStringBytes) fail("join: the result is over {} bytes", Interpreter::kMaxStringBytes);
        }
        return Value(out);
      });
    if (name == "isdigit" || name == "isalpha" || name == "isspace" || name == "isalnum" || name == "isupper" || name == "islower")
      return fn([s, name](Args&) -> Value {
        if (s.empty()) return Value(false);
        bool ok = true, cased = false;
        for (unsigned char c : s) {
          if (name == "isdigit") ok &= (bool)std::isdigit(c);
          else if (name == "isalpha") ok &= (bool)std::isalpha(c);
          else if (name == "isspace") ok &= py_space(c);
          else if (name == "isalnum") ok &= (bool)std::isalnum(c);
          else if (name == "isupper") { ok &= !std::islower(c); cased |= (bool)std::isupper(c); }
          else { ok &= !std::isupper(c); cased |= (bool)std::islower(c); }
        }
        return Value(ok && (name == "isupper" || name == "islower" ? cased : true));
      });
    if (name == "splitlines")
      return fn([s](Args&) -> Value {
        Array out;
        size_t b = 0;
        for (size_t i = 0; i < s.size(); ++i)
          if (s[i] == '\n' || s[i] == '\r') {
            out.emplace_back(s.substr(b, i - b));
            if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
            b = i + 1;
          }
        if (b < s.size()) out.emplace_back(s.substr(b));
        return Value(std::move(out));
      });
    return Value();
  }
  if (self.is_dict()) {
    if (name == "items") return fn([self, line](Args&) -> Value { return Value(items_of(self, line)); });
    if (name == "keys")
      return fn([self](Args&) -> Value {
        Array out;
        for (const auto& kv : self.dict().items) out.push_back(kv.first);
        return Value(std::move(out));
      });
    if (name == "values")
      return fn([self](Args&) -> Value {
        Array out;
        for (const auto& kv : self.dict().items) out.push_back(kv.second);
        return Value(std::move(out));
      });
    if (name == "get")
      return fn([self](Args& a) -> Value {
        const Value* v = self.dict().find(a.get(0, "key"));
        return v ? *v : a.get(1, "default", Value::none());
      });
    if (name == "copy") return fn([self](Args&) -> Value { return Value(Dict(self.dict())); });
    return fn([name, line](Args&) -> Value { template_error(line, "dict." + name + "() is not allowed (immutable sandbox)"); });
  }
  if (self.is_list()) {
    if (name == "index" || name == "count")
      return fn([self, name, line](Args& a) -> Value {
        const Value x = a.get(0, "value");
        int64_t n = 0;
        for (size_t i = 0; i < self.list().size(); ++i)
          if (self.list()[i] == x) {
            if (name == "index") return Value((int64_t)i);
            ++n;
          }
        if (name == "index") template_error(line, "value is not in list");
        return Value(n);
      });
    if (name == "append" || name == "pop" || name == "insert" || name == "extend" || name == "remove" || name == "sort" ||
        name == "reverse" || name == "clear")
      return fn([name, line](Args&) -> Value { template_error(line, "list." + name + "() is not allowed (immutable sandbox)"); });
  }
  return Value();
}

bool Interpreter::apply_test(const std::string& name, const Value& v, Args& a, int line) {
  using K = Value::Kind;
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "number") return v.is_number() || v.is_bool();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.is_float();
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && v.as_bool();
  if (name == "false") return v.is_bool() && !v.as_bool();
  if (name == "mapping") return v.is_dict();
  if (name == "iterable") return v.is_iterable();
  if (name == "sequence") return v.is_list() || v.is_string() || v.is_dict();
  if (name == "callable") return v.is_function();
  if (name == "odd" || name == "even") {
    if (!v.is_int()) template_error(line, "test '" + name + "' needs an integer");
    return (v.as_int() % 2 != 0) == (name == "odd");
  }
  if (name == "divisibleby") {
    const int64_t d = a.get(0, "num").as_int();
    if (d == 0) template_error(line, "divisibleby(0)");
    return v.as_int() % d == 0;
  }
  if (name == "lower" || name == "upper") {
    if (!v.is_string()) return false;
    return name == "lower" ? lower(v.str_ref()) == v.str_ref() : upper(v.str_ref()) == v.str_ref();
  }
  if (name == "sameas") {
    const Value o = a.get(0, "other");
    if (v.kind() != o.kind()) return false;
    if (v.kind() == K::None || v.kind() == K::Undefined) return true;
    if (v.kind() == K::Bool) return v.as_bool() == o.as_bool();
    return v == o;
  }
  if (name == "in") return binary("in", v, a.get(0, "seq"), line).truthy();
  static const std::pair<const char*, const char*> cmp[] = {{"eq", "=="}, {"equalto", "=="}, {"==", "=="}, {"ne", "!="},
                                                             {"!=", "!="}, {"lt", "<"},      {"lessthan", "<"}, {"<", "<"},
                                                             {"le", "<="}, {"<=", "<="},     {"gt", ">"},  {"greaterthan", ">"},
                                                             {">", ">"},   {"ge", ">="},     {">=", ">="}};
  for (const auto& [n, op] : cmp)
    if (name == n) return binary(op, v, a.get(0, "other"), line).truthy();
  template_error(line, "unknown test '" + name + "'");
}

namespace {

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

Value sort_key(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value(lower(v.str_ref()));
  return v;
}

}  // namespace

Value Interpreter::apply_filter(const std::string& name, const Value& v, Args& a, int line) {
  auto attr_path = [&](const Value& obj, const Value& attr) -> Value {
    if (attr.is_int()) return get_item(obj, attr, line);
    Value cur = obj;
    for (const Value& part : split(attr.str(), Value("."), -1)) {
      if (cur.is_undefined()) return cur;
      const std::string& p = part.str_ref();
      cur = (!p.empty() && std::isdigit((unsigned char)p[0])) ? get_item(cur, Value(index_from_digits(p, line)), line)
                                                              : get_item(cur, Value(p), line);
    }
    return cur;
  };
  if (name == "length" || name == "count") {
    try {
      return Value((int64_t)v.length());
    } catch (const Error& e) {
      template_error(line, e.what());
    }
  }
  if (name == "string") return Value(v.str());
  if (name == "safe") return v;
  if (name == "e" || name == "escape" || name == "forceescape") return Value(html_escape(v.str()));
  if (name == "trim") return Value(strip(v.str(), a.get(0, "chars"), true, true));
  if (name == "upper") return Value(upper(v.str()));
  if (name == "lower") return Value(lower(v.str()));
  if (name == "title") return Value(title(v.str()));
  if (name == "capitalize") return Value(capitalize(v.str()));
  if (name == "replace") {
    const Value c = a.get(2, "count");
    return Value(replace_all(v.str(), a.get(0, "old").str(), a.get(1, "new").str(), c.is_undefined() || c.is_none() ? -1 : c.as_int()));
  }
  if (name == "default" || name == "d") {
    const bool boolean = a.get(1, "boolean", Value(false)).truthy();
    if (v.is_undefined() || (boolean && !v.truthy())) return a.get(0, "default_value", Value(""));
    return v;
  }
  if (name == "items") return Value(items_of(v, line));
  if (name == "list") return Value(v.iterate());
  if (name == "first" || name == "last") {
    const Array items = v.iterate();
    if (items.empty()) return Value();
    return name == "first" ? items.front() : items.back();
  }
  if (name == "reverse") {
    if (v.is_string()) {
      Array chars = v.iterate();
      std::string s;
      for (auto it = chars.rbegin(); it != chars.rend(); ++it) s += it->str_ref();
      return Value(s);
    }
    Array items = v.iterate();
    std::reverse(items.begin(), items.end());
    return Value(std::move(items));
  }
  if (name == "join") {
    const std::string sep = a.get(0, "d", Value("")).str();
    const Value attr = a.get(1, "attribute");
    std::string out;
    const Array items = v.iterate();
    for (size_t i = 0; i < items.size(); ++i) {
      out += (i ? sep : "") + (attr.is_undefined() ? items[i] : attr_path(items[i], attr)).str();
      if (out.size() > kMaxStringBytes) template_error(line, fmt::format("join: the result is over {} bytes", kMaxStringBytes));
    }
    return Value(out);
  }
  if (name == "tojson") {
    const Value indent = a.get(0, "indent");
    std::string item_sep, key_sep = ": ";
    const Value seps = a.get(3, "separators");
    if (seps.is_list() && seps.list().size() == 2) {
      item_sep = seps.list()[0].str();
      key_sep = seps.list()[1].str();
    }
    try {
      return Value(v.to_json(indent.is_int() ? (int)indent.as_int() : -1, item_sep, key_sep));
    } catch (const Error& e) {
      template_error(line, e.what());
    }
  }
  if (name == "int") {
    const Value def = a.get(0, "default", Value((int64_t)0));
    if (v.is_int() || v.is_bool()) return Value(v.as_int());
    if (v.is_float()) return Value(v.as_int());
    if (v.is_string()) {
      try {
        size_t used = 0;
        const std::string s = strip(v.str_ref(), Value(), true, true);
        const double d = std::stod(s, &used);
        if (used == s.size()) return Value(Value::float_to_int(d));
      } catch (const std::exception&) {
      }
    }
    return def;
  }
  if (name == "float") {
    const Value def = a.get(0, "default", Value(0.0));
    if (v.is_number() || v.is_bool()) return Value(v.as_double());
    if (v.is_string()) {
      try {
        size_t used = 0;
        const double d = std::stod(v.str_ref(), &used);
        if (used == v.str_ref().size()) return Value(d);
      } catch (const std::exception&) {
      }
    }
    return def;
  }
  if (name == "abs") return v.is_float() ? Value(std::fabs(v.as_double())) : Value((int64_t)std::llabs(v.as_int()));
  if (name == "round") {
    const int64_t prec = a.get(0, "precision", Value((int64_t)0)).as_int();
    const std::string method = a.get(1, "method", Value("common")).str();
    const double m = std::pow(10.0, (double)prec), x = v.as_double() * m;
    double r = method == "ceil" ? std::ceil(x) : method == "floor" ? std::floor(x) : std::round(x);
    return Value(r / m);
  }
  if (name == "unique") {
    Array out;
    for (const auto& x : v.iterate())
      if (std::find(out.begin(), out.end(), x) == out.end()) out.push_back(x);
    return Value(std::move(out));
  }
  if (name == "sum") {
    const Value attr = a.get(0, "attribute");
    Value acc = a.get(1, "start", Value((int64_t)0));
    for (const auto& x : v.iterate()) acc = binary("+", acc, attr.is_undefined() ? x : attr_path(x, attr), line);
    return acc;
  }
  if (name == "min" || name == "max") {
    const Array items = v.iterate();
    if (items.empty()) return Value();
    Value best = items[0];
    for (const auto& x : items) {
      const int c = compare(sort_key(x, false), sort_key(best, false));
      if (name == "min" ? c < 0 : c > 0) best = x;
    }
    return best;
  }
  if (name == "sort" || name == "dictsort") {
    const bool dict = name == "dictsort";
    const bool reverse = a.get(dict ? 2 : 0, "reverse", Value(false)).truthy();
    const bool cs = a.get(dict ? 0 : 1, "case_sensitive", Value(false)).truthy();
    const Value attr = dict ? Value() : a.get(2, "attribute");
    const bool by_value = dict && a.get(1, "by", Value("key")).str() == "value";
    Array items = dict ? items_of(v, line) : v.iterate();
    std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
      Value kx = dict ? x.list()[by_value ? 1 : 0] : (attr.is_undefined() ? x : attr_path(x, attr));
      Value ky = dict ? y.list()[by_value ? 1 : 0] : (attr.is_undefined() ? y : attr_path(y, attr));
      const int c = compare(sort_key(kx, cs), sort_key(ky, cs));
      return reverse ? c > 0 : c < 0;
    });
    return Value(std::move(items));
  }
  if (name == "map") {
    Array out;
    const Value attr = a.get(99, "attribute");
    if (!attr.is_undefined()) {
      const Value def = a.get(99, "default");
      for (const auto& x : v.iterate()) {
        Value r = attr_path(x, attr);
        out.push_back(r.is_undefined() && !def.is_undefined() ? def : r);
      }
      return Value(std::move(out));
    }
    if (a.pos.empty()) template_error(line, "map needs a filter name or attribute=");
    const std::string f = a.pos[0].str();
    Args rest;
    rest.pos.assign(a.pos.begin() + 1, a.pos.end());
    rest.kw = a.kw;
    for (const auto& x : v.iterate()) out.push_back(apply_filter(f, x, rest, line));
    return Value(std::move(out));
  }
  if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
    const bool by_attr = name == "selectattr" || name == "rejectattr";
    const bool keep_if = name == "select" || name == "selectattr";
    size_t k = 0;
    Value attr;
    if (by_attr) attr = a.get(k++, "attribute");
    const Value test = a.get(k++, nullptr);
    Args targs;
    for (size_t i = k; i < a.pos.size(); ++i) targs.pos.push_back(a.pos[i]);
    Array out;
    for (const auto& x : v.iterate()) {
      const Value subject = by_attr ? attr_path(x, attr) : x;
      const bool r = test.is_undefined() ? subject.truthy() : apply_test(test.str(), subject, targs, line);
      if (r == keep_if) out.push_back(x);
    }
    return Value(std::move(out));
  }
  if (name == "attr") return get_attr(v, a.get(0, "name").str(), line);
  if (name == "indent") {
    const Value w = a.get(0, "width", Value((int64_t)4));
    const std::string ind = w.is_string() ? w.str_ref() : std::string((size_t)std::max<int64_t>(0, w.as_int()), ' ');
    const bool first = a.get(1, "first", Value(false)).truthy(), blank = a.get(2, "blank", Value(false)).truthy();
    std::string s = v.str() + "\n";
    Array lines = method(Value(s), "splitlines", line).call(a).list();
    std::string rv;
    for (size_t i = 0; i < lines.size(); ++i) {
      const std::string& l = lines[i].str_ref();
      if (i == 0) rv = l;
      else rv += "\n" + ((blank || !l.empty()) ? ind + l : l);
      if (rv.size() > kMaxStringBytes) template_error(line, fmt::format("indent: the result is over {} bytes", kMaxStringBytes));
    }
    return Value(first ? ind + rv : rv);
  }
  if (name == "wordcount") return Value((int64_t)split(v.str(), Value(), -1).size());
  if (name == "format") {
    Value args(Array(a.pos));
    return binary("%", Value(v.str()), args, line);
  }
  if (name == "center") {
    const int64_t w = a.get(0, "width", Value((int64_t)80)).as_int();
    std::string s = v.str();
    const int64_t pad = w - (int64_t)s.size();
    if (pad <= 0) return Value(s);
    if (w > (int64_t)kMaxStringBytes) template_error(line, fmt::format("center: a width over {} bytes", kMaxStringBytes));
    const int64_t left = pad / 2 + (pad & w & 1);
    return Value(std::string((size_t)left, ' ') + s + std::string((size_t)(pad - left), ' '));
  }
  template_error(line, "unknown filter '" + name + "'");
}

}  // namespace roofline::jinja
