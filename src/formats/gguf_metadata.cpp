// Metadata values and the ordered key/value store, with type-checked getters.
#include "formats/gguf_metadata.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.h"

namespace roofline::gguf {

const char* value_type_name(ValueType type) {
  switch (type) {
    case ValueType::UINT8: return "u8";
    case ValueType::INT8: return "i8";
    case ValueType::UINT16: return "u16";
    case ValueType::INT16: return "i16";
    case ValueType::UINT32: return "u32";
    case ValueType::INT32: return "i32";
    case ValueType::FLOAT32: return "f32";
    case ValueType::BOOL: return "bool";
    case ValueType::STRING: return "string";
    case ValueType::ARRAY: return "array";
    case ValueType::UINT64: return "u64";
    case ValueType::INT64: return "i64";
    case ValueType::FLOAT64: return "f64";
  }
  return "unknown";
}

bool value_type_is_integer(ValueType t) {
  switch (t) {
    case ValueType::UINT8: case ValueType::INT8: case ValueType::UINT16: case ValueType::INT16:
    case ValueType::UINT32: case ValueType::INT32: case ValueType::UINT64: case ValueType::INT64:
      return true;
    default:
      return false;
  }
}

static bool is_signed(ValueType t) {
  return t == ValueType::INT8 || t == ValueType::INT16 || t == ValueType::INT32 || t == ValueType::INT64;
}

size_t value_type_size(ValueType t) {
  switch (t) {
    case ValueType::UINT8: case ValueType::INT8: case ValueType::BOOL: return 1;
    case ValueType::UINT16: case ValueType::INT16: return 2;
    case ValueType::UINT32: case ValueType::INT32: case ValueType::FLOAT32: return 4;
    case ValueType::UINT64: case ValueType::INT64: case ValueType::FLOAT64: return 8;
    default: return 0;
  }
}

Value Value::integer(ValueType t, int64_t v) {
  Value x;
  x.type_ = t;
  x.int_ = (uint64_t)v;
  return x;
}
Value Value::u64(uint64_t v) {
  Value x;
  x.type_ = ValueType::UINT64;
  x.int_ = v;
  return x;
}
Value Value::f32(float v) {
  Value x;
  x.type_ = ValueType::FLOAT32;
  x.float_ = v;
  return x;
}
Value Value::f64(double v) {
  Value x;
  x.type_ = ValueType::FLOAT64;
  x.float_ = v;
  return x;
}
Value Value::boolean(bool v) {
  Value x;
  x.type_ = ValueType::BOOL;
  x.int_ = v ? 1 : 0;
  return x;
}
Value Value::string(std::string v) {
  Value x;
  x.type_ = ValueType::STRING;
  x.string_ = std::move(v);
  return x;
}
Value Value::string_array(std::vector<std::string> v) {
  Value x;
  x.type_ = ValueType::ARRAY;
  x.array_type_ = ValueType::STRING;
  x.strings_ = std::move(v);
  return x;
}
Value Value::raw_array(ValueType elem_type, std::vector<uint8_t> bytes) {
  ROOFLINE_CHECK(value_type_size(elem_type) > 0 && bytes.size() % value_type_size(elem_type) == 0);
  Value x;
  x.type_ = ValueType::ARRAY;
  x.array_type_ = elem_type;
  x.bytes_ = std::move(bytes);
  return x;
}
template <typename T>
static std::vector<uint8_t> to_bytes(const T* p, size_t n) {
  std::vector<uint8_t> b(n * sizeof(T));
  if (n) std::memcpy(b.data(), p, b.size());
  return b;
}
Value Value::i32_array(const std::vector<int32_t>& v) { return raw_array(ValueType::INT32, to_bytes(v.data(), v.size())); }
Value Value::u32_array(const std::vector<uint32_t>& v) { return raw_array(ValueType::UINT32, to_bytes(v.data(), v.size())); }
Value Value::f32_array(const std::vector<float>& v) { return raw_array(ValueType::FLOAT32, to_bytes(v.data(), v.size())); }
Value Value::bool_array(const std::vector<bool>& v) {
  std::vector<uint8_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = v[i] ? 1 : 0;
  return raw_array(ValueType::BOOL, std::move(b));
}

size_t Value::array_size() const {
  if (type_ != ValueType::ARRAY) return 0;
  if (array_type_ == ValueType::STRING) return strings_.size();
  return bytes_.size() / value_type_size(array_type_);
}

namespace {

[[noreturn]] void wrong_type(std::string_view what, ValueType got, const char* want) {
  fail("metadata key '{}' has type {}, expected {}", what, value_type_name(got), want);
}

// Reads element i of a numeric array as int64 (integers) or double (floats).
int64_t element_int(ValueType t, const uint8_t* p) {
  switch (t) {
    case ValueType::UINT8: return *p;
    case ValueType::INT8: return (int8_t)*p;
    case ValueType::BOOL: return *p;
    case ValueType::UINT16: { uint16_t v; std::memcpy(&v, p, 2); return v; }
    case ValueType::INT16: { int16_t v; std::memcpy(&v, p, 2); return v; }
    case ValueType::UINT32: { uint32_t v; std::memcpy(&v, p, 4); return v; }
    case ValueType::INT32: { int32_t v; std::memcpy(&v, p, 4); return v; }
    case ValueType::UINT64: { uint64_t v; std::memcpy(&v, p, 8); return (int64_t)v; }
    case ValueType::INT64: { int64_t v; std::memcpy(&v, p, 8); return v; }
    default: return 0;
  }
}
double element_float(ValueType t, const uint8_t* p) {
  if (t == ValueType::FLOAT32) { float v; std::memcpy(&v, p, 4); return v; }
  if (t == ValueType::FLOAT64) { double v; std::memcpy(&v, p, 8); return v; }
  return (double)element_int(t, p);
}

}  // namespace

int64_t Value::as_int(std::string_view what) const {
  if (!value_type_is_integer(type_)) wrong_type(what, type_, "an integer");
  if (type_ == ValueType::UINT64 && int_ > (uint64_t)std::numeric_limits<int64_t>::max())
    fail("metadata key '{}' value {} is out of range", what, int_);
  return (int64_t)int_;
}
uint64_t Value::as_uint(std::string_view what) const {
  if (!value_type_is_integer(type_)) wrong_type(what, type_, "an integer");
  if (is_signed(type_) && (int64_t)int_ < 0) fail("metadata key '{}' is negative ({})", what, (int64_t)int_);
  return int_;
}
double Value::as_float(std::string_view what) const {
  if (type_ == ValueType::FLOAT32 || type_ == ValueType::FLOAT64) return float_;
  if (value_type_is_integer(type_)) return is_signed(type_) ? (double)(int64_t)int_ : (double)int_;
  wrong_type(what, type_, "a number");
}
bool Value::as_bool(std::string_view what) const {
  if (type_ != ValueType::BOOL) wrong_type(what, type_, "bool");
  return int_ != 0;
}
const std::string& Value::as_string(std::string_view what) const {
  if (type_ != ValueType::STRING) wrong_type(what, type_, "string");
  return string_;
}
const std::vector<std::string>& Value::as_string_array(std::string_view what) const {
  if (type_ != ValueType::ARRAY || array_type_ != ValueType::STRING) wrong_type(what, type_, "an array of strings");
  return strings_;
}
std::vector<int64_t> Value::as_int_array(std::string_view what) const {
  if (type_ != ValueType::ARRAY || !(value_type_is_integer(array_type_) || array_type_ == ValueType::BOOL))
    wrong_type(what, type_ == ValueType::ARRAY ? array_type_ : type_, "an array of integers");
  const size_t sz = value_type_size(array_type_), n = array_size();
  std::vector<int64_t> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = element_int(array_type_, bytes_.data() + i * sz);
  return out;
}
std::vector<float> Value::as_float_array(std::string_view what) const {
  if (type_ != ValueType::ARRAY || array_type_ == ValueType::STRING || array_type_ == ValueType::BOOL)
    wrong_type(what, type_ == ValueType::ARRAY ? array_type_ : type_, "an array of numbers");
  const size_t sz = value_type_size(array_type_), n = array_size();
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = (float)element_float(array_type_, bytes_.data() + i * sz);
  return out;
}
std::vector<bool> Value::as_bool_array(std::string_view what) const {
  if (type_ != ValueType::ARRAY || array_type_ != ValueType::BOOL) wrong_type(what, type_, "an array of bools");
  std::vector<bool> out(bytes_.size());
  for (size_t i = 0; i < bytes_.size(); ++i) out[i] = bytes_[i] != 0;
  return out;
}

namespace {
std::string quote(const std::string& s, size_t max_len) {
  std::string out = "\"";
  size_t n = 0;
  for (unsigned char c : s) {
    if (n++ >= max_len) {
      out += "...";
      break;
    }
    if (c == '\n') out += "\\n";
    else if (c == '"') out += "\\\"";
    else if (c == '\\') out += "\\\\";
    else if (c < 0x20) out += fmt::format("\\x{:02x}", c);
    else out += (char)c;
  }
  return out + "\"";
}
std::string scalar_display(ValueType t, uint64_t i, double f) {
  if (t == ValueType::BOOL) return i ? "true" : "false";
  if (t == ValueType::FLOAT32) return fmt::format("{}", (float)f);
  if (t == ValueType::FLOAT64) return fmt::format("{}", f);
  if (is_signed(t)) return fmt::format("{}", (int64_t)i);
  return fmt::format("{}", i);
}
}  // namespace

std::string Value::to_display(size_t max_items) const {
  if (type_ == ValueType::STRING) return quote(string_, 120);
  if (type_ != ValueType::ARRAY) return scalar_display(type_, int_, float_);
  const size_t n = array_size();
  std::string out = "[";
  for (size_t i = 0; i < n && i < max_items; ++i) {
    if (i) out += ", ";
    if (array_type_ == ValueType::STRING) {
      out += quote(strings_[i], 40);
    } else {
      const uint8_t* p = bytes_.data() + i * value_type_size(array_type_);
      if (array_type_ == ValueType::FLOAT32)
        out += fmt::format("{}", (float)element_float(array_type_, p));
      else if (array_type_ == ValueType::FLOAT64)
        out += fmt::format("{}", element_float(array_type_, p));
      else
        out += scalar_display(array_type_, (uint64_t)element_int(array_type_, p), 0);
    }
  }
  if (n > max_items) out += fmt::format(", ... ({} items)", n);
  return out + "]";
}

void Metadata::set(const std::string& key, Value value) {
  auto it = index_.find(key);
  if (it != index_.end()) {
    entries_[it->second].second = std::move(value);
    return;
  }
  index_.emplace(key, entries_.size());
  entries_.emplace_back(key, std::move(value));
}

bool Metadata::erase(const std::string& key) {
  auto it = index_.find(key);
  if (it == index_.end()) return false;
  entries_.erase(entries_.begin() + (ptrdiff_t)it->second);
  index_.clear();
  for (size_t i = 0; i < entries_.size(); ++i) index_.emplace(entries_[i].first, i);
  return true;
}

const Value* Metadata::find(std::string_view key) const {
  auto it = index_.find(key);
  return it == index_.end() ? nullptr : &entries_[it->second].second;
}

static const Value& require(const Metadata& m, std::string_view key) {
  const Value* v = m.find(key);
  if (!v) fail("metadata key '{}' is missing", key);
  return *v;
}

int64_t Metadata::get_int(std::string_view key) const { return require(*this, key).as_int(key); }
int64_t Metadata::get_int_or(std::string_view key, int64_t fallback) const {
  const Value* v = find(key);
  return v ? v->as_int(key) : fallback;
}
double Metadata::get_float(std::string_view key) const { return require(*this, key).as_float(key); }
double Metadata::get_float_or(std::string_view key, double fallback) const {
  const Value* v = find(key);
  return v ? v->as_float(key) : fallback;
}
bool Metadata::get_bool_or(std::string_view key, bool fallback) const {
  const Value* v = find(key);
  return v ? v->as_bool(key) : fallback;
}
const std::string& Metadata::get_string(std::string_view key) const { return require(*this, key).as_string(key); }
std::string Metadata::get_string_or(std::string_view key, const std::string& fallback) const {
  const Value* v = find(key);
  return v ? v->as_string(key) : fallback;
}

}  // namespace roofline::gguf
