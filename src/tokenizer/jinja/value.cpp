// Jinja values: conversions from/to JSON, Python str()/repr(), json.dumps as transformers calls it,
// truthiness, equality and ordering.
#include "tokenizer/jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "core/error.h"

namespace roofline::jinja {

const Value* Dict::find(const Value& key) const {
  for (const auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}
Value* Dict::find(const Value& key) {
  for (auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}
void Dict::set(const Value& key, Value v) {
  if (Value* cur = find(key)) *cur = std::move(v);
  else items.emplace_back(key, std::move(v));
}

Value Value::function(std::string name, Function f) {
  Value v;
  v.kind_ = Kind::Function;
  v.s_ = std::make_shared<std::string>(std::move(name));
  v.f_ = std::make_shared<Function>(std::move(f));
  return v;
}

void Value::measure() {
  uint32_t deepest = 0;
  auto take = [&](const Value& v) {
    deepest = std::max(deepest, v.depth_);
    holds_namespace_ = holds_namespace_ || v.contains_namespace();
  };
  if (kind_ == Kind::List) {
    for (const Value& v : *a_) take(v);
  } else {
    for (const auto& [k, v] : d_map_->items) take(k), take(v);
  }
  depth_ = deepest + 1;
  if (namespace_ && holds_namespace_) fail("a namespace attribute cannot hold a namespace");
  if (depth_ > kMaxDepth) fail("a template value nests lists and dicts more than {} levels deep", kMaxDepth);
}

void Value::set_attribute(const std::string& name, Value v) {
  if (v.contains_namespace()) fail("a namespace attribute cannot hold a namespace ('{}')", name);
  depth_ = std::max(depth_, v.depth_ + 1);
  d_map_->set(Value(name), std::move(v));
}

Value Value::from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return none();
    case nlohmann::ordered_json::value_t::boolean: return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: return Value((int64_t)j.get<uint64_t>());
    case nlohmann::ordered_json::value_t::number_float: return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      Array a;
      a.reserve(j.size());
      for (const auto& x : j) a.push_back(from_json(x));
      return Value(std::move(a));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict d;
      for (auto it = j.begin(); it != j.end(); ++it) d.items.emplace_back(Value(it.key()), from_json(it.value()));
      return Value(std::move(d));
    }
    default: return Value();
  }
}

nlohmann::ordered_json Value::to_ordered_json() const {
  switch (kind_) {
    case Kind::Undefined:
    case Kind::None: return nullptr;
    case Kind::Bool: return as_bool();
    case Kind::Int: return i_;
    case Kind::Float: return d_;
    case Kind::String: return *s_;
    case Kind::List: {
      auto j = nlohmann::ordered_json::array();
      for (const auto& x : *a_) j.push_back(x.to_ordered_json());
      return j;
    }
    case Kind::Dict: {
      auto j = nlohmann::ordered_json::object();
      for (const auto& [k, v] : d_map_->items) j[k.is_string() ? k.str_ref() : k.str()] = v.to_ordered_json();
      return j;
    }
    case Kind::Function: return "<function " + *s_ + ">";
  }
  return nullptr;
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::Undefined:
    case Kind::None: return false;
    case Kind::Bool:
    case Kind::Int: return i_ != 0;
    case Kind::Float: return d_ != 0.0;
    case Kind::String: return !s_->empty();
    case Kind::List: return !a_->empty();
    case Kind::Dict: return namespace_ || !d_map_->items.empty();
    case Kind::Function: return true;
  }
  return false;
}

std::string python_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  // sci: [-]D[.DDD]e[+-]XX
  const size_t e = sci.find('e');
  std::string mant = sci.substr(0, e);
  const int exp = std::stoi(sci.substr(e + 1));
  bool neg = false;
  if (!mant.empty() && mant[0] == '-') {
    neg = true;
    mant.erase(0, 1);
  }
  std::string digits;
  for (char c : mant)
    if (c != '.') digits += c;
  std::string out;
  if (exp >= -4 && exp < 16) {
    if (exp < 0) {
      out = "0." + std::string((size_t)(-exp - 1), '0') + digits;
    } else if ((int)digits.size() <= exp + 1) {
      out = digits + std::string((size_t)(exp + 1 - (int)digits.size()), '0') + ".0";
    } else {
      out = digits.substr(0, (size_t)exp + 1) + "." + digits.substr((size_t)exp + 1);
    }
  } else {
    out = digits.substr(0, 1) + (digits.size() > 1 ? "." + digits.substr(1) : "");
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    out += eb;
  }
  return neg ? "-" + out : out;
}

namespace {

std::string py_str_repr(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos, has_double = s.find('"') != std::string::npos;
  const char q = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == '\\') out += "\\\\";
    else if (c == (unsigned char)q) out += std::string("\\") + (char)q;
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7f) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      out += b;
    } else out += (char)c;
  }
  out += q;
  return out;
}

void json_string(const std::string& s, std::string& out) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char b[8];
          std::snprintf(b, sizeof b, "\\u%04x", c);
          out += b;
        } else {
          out += (char)c;
        }
    }
  }
  out += '"';
}

void to_json_rec(const Value& v, int indent, int level, const std::string& item_sep, const std::string& key_sep,
                 std::string& out) {
  using K = Value::Kind;
  switch (v.kind()) {
    case K::Undefined:
    case K::None: out += "null"; return;
    case K::Bool: out += v.as_bool() ? "true" : "false"; return;
    case K::Int: out += std::to_string(v.as_int()); return;
    case K::Float: {
      const double d = v.as_double();
      if (std::isnan(d)) out += "NaN";
      else if (std::isinf(d)) out += d < 0 ? "-Infinity" : "Infinity";
      else out += python_float_repr(d);
      return;
    }
    case K::String: json_string(v.str_ref(), out); return;
    case K::Function: fail("Object of type function is not JSON serializable");
    case K::List:
    case K::Dict: break;
  }
  const bool is_list = v.is_list();
  const size_t n = is_list ? v.list().size() : v.dict().items.size();
  out += is_list ? '[' : '{';
  if (n == 0) {
    out += is_list ? ']' : '}';
    return;
  }
  const std::string newline_indent = indent >= 0 ? "\n" + std::string((size_t)(indent * (level + 1)), ' ') : "";
  for (size_t i = 0; i < n; ++i) {
    if (i) out += item_sep;
    out += newline_indent;
    if (is_list) {
      to_json_rec(v.list()[i], indent, level + 1, item_sep, key_sep, out);
    } else {
      const auto& [k, x] = v.dict().items[i];
      if (k.is_string()) json_string(k.str_ref(), out);
      else if (k.is_int() || k.is_float() || k.is_bool() || k.is_none()) {
        std::string ks;
        to_json_rec(k, -1, 0, item_sep, key_sep, ks);
        json_string(ks, out);
      } else fail("keys must be str, int, float, bool or None, not {}", k.type_name());
      out += key_sep;
      to_json_rec(x, indent, level + 1, item_sep, key_sep, out);
    }
  }
  if (indent >= 0) out += "\n" + std::string((size_t)(indent * level), ' ');
  out += is_list ? ']' : '}';
}

}  // namespace

std::string Value::str() const {
  switch (kind_) {
    case Kind::Undefined: return "";
    case Kind::String: return *s_;
    default: return repr();
  }
}

std::string Value::repr() const {
  switch (kind_) {
    case Kind::Undefined: return "";
    case Kind::None: return "None";
    case Kind::Bool: return i_ ? "True" : "False";
    case Kind::Int: return std::to_string(i_);
    case Kind::Float: return python_float_repr(d_);
    case Kind::String: return py_str_repr(*s_);
    case Kind::List: {
      std::string out = tuple_ ? "(" : "[";
      for (size_t i = 0; i < a_->size(); ++i) out += (i ? ", " : "") + (*a_)[i].repr();
      if (tuple_ && a_->size() == 1) out += ",";
      return out + (tuple_ ? ")" : "]");
    }
    case Kind::Dict: {
      std::string out = namespace_ ? "<Namespace {" : "{";
      for (size_t i = 0; i < d_map_->items.size(); ++i)
        out += (i ? ", " : "") + d_map_->items[i].first.repr() + ": " + d_map_->items[i].second.repr();
      return out + (namespace_ ? "}>" : "}");
    }
    case Kind::Function: return "<function " + *s_ + ">";
  }
  return "";
}

std::string Value::to_json(int indent, const std::string& item_sep, const std::string& key_sep) const {
  std::string out;
  const std::string sep = item_sep.empty() ? (indent >= 0 ? "," : ", ") : item_sep;
  to_json_rec(*this, indent, 0, sep, key_sep, out);
  return out;
}

std::string Value::type_name() const {
  switch (kind_) {
    case Kind::Undefined: return "undefined";
    case Kind::None: return "none";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::Float: return "float";
    case Kind::String: return "string";
    case Kind::List: return "list";
    case Kind::Dict: return namespace_ ? "namespace" : "dict";
    case Kind::Function: return "function";
  }
  return "?";
}

Array Value::iterate() const {
  switch (kind_) {
    case Kind::List: return *a_;
    case Kind::Dict: {
      Array keys;
      for (const auto& kv : d_map_->items) keys.push_back(kv.first);
      return keys;
    }
    case Kind::String: {
      Array chars;
      const std::string& s = *s_;
      // A value per character (~80 bytes each): a 64 MiB string would take gigabytes.
      if (s.size() > kMaxIteratedBytes) fail("cannot iterate over a string of more than {} bytes", kMaxIteratedBytes);
      for (size_t i = 0; i < s.size();) {
        size_t l = 1;
        const unsigned char c = s[i];
        if (c >= 0xF0) l = 4;
        else if (c >= 0xE0) l = 3;
        else if (c >= 0xC0) l = 2;
        l = std::min(l, s.size() - i);
        chars.emplace_back(s.substr(i, l));
        i += l;
      }
      return chars;
    }
    case Kind::Undefined: return {};
    default: fail("'{}' object is not iterable", type_name());
  }
}

size_t Value::length() const {
  switch (kind_) {
    case Kind::List: return a_->size();
    case Kind::Dict: return d_map_->items.size();
    case Kind::String: return iterate().size();
    case Kind::Undefined: return 0;
    default: fail("object of type '{}' has no len()", type_name());
  }
}

bool operator==(const Value& a, const Value& b) {
  using K = Value::Kind;
  const bool an = a.is_number() || a.is_bool(), bn = b.is_number() || b.is_bool();
  if (an && bn) {
    if (a.is_float() || b.is_float()) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case K::Undefined:
    case K::None: return true;
    case K::String: return a.str_ref() == b.str_ref();
    case K::List: {
      if (a.list().size() != b.list().size()) return false;
      for (size_t i = 0; i < a.list().size(); ++i)
        if (a.list()[i] != b.list()[i]) return false;
      return true;
    }
    case K::Dict: {
      if (a.dict().items.size() != b.dict().items.size()) return false;
      for (const auto& [k, v] : a.dict().items) {
        const Value* o = b.dict().find(k);
        if (!o || *o != v) return false;
      }
      return true;
    }
    case K::Function: return a.function_name() == b.function_name();
    default: return false;
  }
}

int compare(const Value& a, const Value& b) {
  const bool an = a.is_number() || a.is_bool(), bn = b.is_number() || b.is_bool();
  if (an && bn) {
    if (a.is_float() || b.is_float()) {
      const double x = a.as_double(), y = b.as_double();
      return x < y ? -1 : (x > y ? 1 : 0);
    }
    const int64_t x = a.as_int(), y = b.as_int();
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  if (a.is_string() && b.is_string()) {
    const int c = a.str_ref().compare(b.str_ref());
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if (a.is_list() && b.is_list()) {
    const auto &x = a.list(), &y = b.list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i)
      if (int c = compare(x[i], y[i])) return c;
    return x.size() < y.size() ? -1 : (x.size() > y.size() ? 1 : 0);
  }
  fail("'<' not supported between instances of '{}' and '{}'", a.type_name(), b.type_name());
}

Value Args::get(size_t i, const char* name, Value fallback) const {
  if (i < pos.size()) return pos[i];
  if (name)
    for (const auto& [k, v] : kw)
      if (k == name) return v;
  return fallback;
}

bool Args::has(size_t i, const char* name) const {
  if (i < pos.size()) return true;
  if (name)
    for (const auto& [k, v] : kw)
      if (k == name) return true;
  return false;
}

}  // namespace roofline::jinja
