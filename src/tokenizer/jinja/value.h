// Values of the Jinja subset: Python-like undefined/none/bool/int/float/string/list/dict, callables
// and namespaces, with Python's truthiness, comparison, str() and repr(), and transformers' tojson
// (json.dumps with ensure_ascii=False, separators ", " / ": ", key order kept).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace roofline::jinja {

class Value;
using Array = std::vector<Value>;
// Dicts keep insertion order, as Python's do.
struct Dict {
  std::vector<std::pair<Value, Value>> items;
  const Value* find(const Value& key) const;
  Value* find(const Value& key);
  void set(const Value& key, Value v);
};
struct Args;
using Function = std::function<Value(Args&)>;

class Value {
 public:
  enum class Kind { Undefined, None, Bool, Int, Float, String, List, Dict, Function };

  Value() = default;  // undefined
  static Value none() { Value v; v.kind_ = Kind::None; return v; }
  Value(bool b) : kind_(Kind::Bool), i_(b) {}
  Value(int i) : kind_(Kind::Int), i_(i) {}
  Value(int64_t i) : kind_(Kind::Int), i_(i) {}
  Value(double d) : kind_(Kind::Float), d_(d) {}
  Value(const char* s) : kind_(Kind::String), s_(std::make_shared<std::string>(s)) {}
  Value(std::string s) : kind_(Kind::String), s_(std::make_shared<std::string>(std::move(s))) {}
  Value(Array a) : kind_(Kind::List), a_(std::make_shared<Array>(std::move(a))) { measure(); }
  Value(Dict d, bool is_namespace = false)
      : kind_(Kind::Dict), d_map_(std::make_shared<Dict>(std::move(d))), namespace_(is_namespace) {
    measure();
  }
  static Value function(std::string name, Function f);
  static Value tuple(Array a) {
    Value v(std::move(a));
    v.tuple_ = true;
    return v;
  }
  static Value from_json(const nlohmann::ordered_json& j);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::Undefined; }
  bool is_none() const { return kind_ == Kind::None; }
  bool is_bool() const { return kind_ == Kind::Bool; }
  bool is_int() const { return kind_ == Kind::Int; }
  bool is_float() const { return kind_ == Kind::Float; }
  bool is_number() const { return kind_ == Kind::Int || kind_ == Kind::Float; }
  bool is_string() const { return kind_ == Kind::String; }
  bool is_list() const { return kind_ == Kind::List; }
  bool is_dict() const { return kind_ == Kind::Dict; }
  bool is_namespace() const { return kind_ == Kind::Dict && namespace_; }
  bool is_tuple() const { return kind_ == Kind::List && tuple_; }
  bool is_function() const { return kind_ == Kind::Function; }
  bool is_iterable() const { return is_list() || is_dict() || is_string(); }
  // Lists and dicts nest at most kMaxDepth levels (a deeper one is an Error where it is made): printing,
  // comparing and freeing a value recurse once per level. A namespace holds no namespace (set_attribute),
  // so no value contains itself and the bound stays true after a namespace changes.
  static constexpr uint32_t kMaxDepth = 1100;
  static constexpr size_t kMaxIteratedBytes = 1u << 20;  // iterate() of a longer string is an Error
  uint32_t depth() const { return depth_; }
  bool contains_namespace() const { return namespace_ || holds_namespace_; }
  // A namespace's attribute set, checked as above.
  void set_attribute(const std::string& name, Value v);

  bool as_bool() const { return i_ != 0; }
  int64_t as_int() const { return kind_ == Kind::Float ? float_to_int(d_) : i_; }
  // Truncated toward zero as Python's int(); saturated at the int64 range (NaN: 0), where a cast would be undefined.
  static int64_t float_to_int(double d) {
    if (!(d == d)) return 0;
    if (d >= 9.2233720368547758e18) return INT64_MAX;
    if (d <= -9.2233720368547758e18) return INT64_MIN;
    return (int64_t)d;
  }
  double as_double() const { return kind_ == Kind::Float ? d_ : (double)i_; }
  const std::string& str_ref() const { return *s_; }
  const Array& list() const { return *a_; }
  Array& list() { return *a_; }
  const Dict& dict() const { return *d_map_; }
  Dict& dict() { return *d_map_; }
  const std::string& function_name() const { return *s_; }
  Value call(Args& args) const { return (*f_)(args); }

  bool truthy() const;
  std::string str() const;   // Python str(): None, True, 1.0, ['a'], {'k': 1}
  std::string repr() const;  // Python repr()
  // json.dumps(self, ensure_ascii=False, indent=indent, separators=...); indent < 0 is None.
  std::string to_json(int indent = -1, const std::string& item_sep = "", const std::string& key_sep = ": ") const;
  nlohmann::ordered_json to_ordered_json() const;
  std::string type_name() const;  // for error messages

  // Items to iterate: list items, dict keys, string characters.
  Array iterate() const;
  size_t length() const;

 private:
  Kind kind_ = Kind::Undefined;
  int64_t i_ = 0;
  double d_ = 0;
  std::shared_ptr<std::string> s_;
  std::shared_ptr<Array> a_;
  std::shared_ptr<Dict> d_map_;
  std::shared_ptr<Function> f_;
  bool namespace_ = false;
  bool tuple_ = false;  // a list that prints as a Python tuple
  bool holds_namespace_ = false;  // some item (at any depth) is a namespace
  uint32_t depth_ = 0;            // levels of lists and dicts: 0 for a scalar
  void measure();                 // depth_ and holds_namespace_ from the items
};

bool operator==(const Value& a, const Value& b);
inline bool operator!=(const Value& a, const Value& b) { return !(a == b); }
// Python ordering of numbers, strings and lists; throws Error for other pairs.
int compare(const Value& a, const Value& b);
std::string python_float_repr(double d);

// Call arguments: positional and keyword.
struct Args {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  std::string callee;  // for error messages
  // Positional i or keyword `name`, else fallback (undefined when not given).
  Value get(size_t i, const char* name, Value fallback = Value()) const;
  bool has(size_t i, const char* name) const;
};

}  // namespace roofline::jinja
