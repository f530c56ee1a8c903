// GGUF metadata: typed key/value pairs in file order. Values keep their GGUF type exactly (so a
// round trip writes the same bytes); typed getters check the type and throw a one-line Error
// naming the key when it is wrong ("wrong metadata types" is input validation, not an assert).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace roofline::gguf {

enum class ValueType : uint32_t {
  UINT8 = 0,
  INT8 = 1,
  UINT16 = 2,
  INT16 = 3,
  UINT32 = 4,
  INT32 = 5,
  FLOAT32 = 6,
  BOOL = 7,
  STRING = 8,
  ARRAY = 9,
  UINT64 = 10,
  INT64 = 11,
  FLOAT64 = 12,
};

const char* value_type_name(ValueType type);  // "u32", "string", "array", ...
bool value_type_is_integer(ValueType type);
size_t value_type_size(ValueType type);       // bytes of a scalar; 0 for STRING/ARRAY

// One metadata value: a scalar, a string, or a flat array of scalars or strings.
class Value {
 public:
  Value() = default;

  static Value u8(uint8_t v) { return integer(ValueType::UINT8, v); }
  static Value i8(int8_t v) { return integer(ValueType::INT8, v); }
  static Value u16(uint16_t v) { return integer(ValueType::UINT16, v); }
  static Value i16(int16_t v) { return integer(ValueType::INT16, v); }
  static Value u32(uint32_t v) { return integer(ValueType::UINT32, v); }
  static Value i32(int32_t v) { return integer(ValueType::INT32, v); }
  static Value u64(uint64_t v);
  static Value i64(int64_t v) { return integer(ValueType::INT64, v); }
  static Value f32(float v);
  static Value f64(double v);
  static Value boolean(bool v);
  static Value string(std::string v);
  static Value string_array(std::vector<std::string> v);
  static Value i32_array(const std::vector<int32_t>& v);
  static Value u32_array(const std::vector<uint32_t>& v);
  static Value f32_array(const std::vector<float>& v);
  static Value bool_array(const std::vector<bool>& v);
  // A numeric array of elem_type, given as raw little-endian bytes (count * size).
  static Value raw_array(ValueType elem_type, std::vector<uint8_t> bytes);

  ValueType type() const { return type_; }
  bool is_array() const { return type_ == ValueType::ARRAY; }
  ValueType array_type() const { return array_type_; }
  size_t array_size() const;

  // Scalar access. `what` names the key in error messages.
  int64_t as_int(std::string_view what = "value") const;     // any integer type (u64 above INT64_MAX fails)
  uint64_t as_uint(std::string_view what = "value") const;   // any non-negative integer
  double as_float(std::string_view what = "value") const;    // f32/f64, or any integer
  bool as_bool(std::string_view what = "value") const;
  const std::string& as_string(std::string_view what = "value") const;

  // Array access (element conversions as above).
  const std::vector<std::string>& as_string_array(std::string_view what = "value") const;
  std::vector<int64_t> as_int_array(std::string_view what = "value") const;
  std::vector<float> as_float_array(std::string_view what = "value") const;
  std::vector<bool> as_bool_array(std::string_view what = "value") const;
  const std::vector<uint8_t>& raw_array_bytes() const { return bytes_; }  // numeric arrays only

  // Short human-readable rendering (arrays abbreviated past max_items), as `inspect` prints it.
  std::string to_display(size_t max_items = 8) const;

  // Scalar storage (exposed for the writer): integers in int_, floats in float_.
  uint64_t raw_int() const { return int_; }
  double raw_float() const { return float_; }

 private:
  static Value integer(ValueType t, int64_t v);

  ValueType type_ = ValueType::UINT8;
  ValueType array_type_ = ValueType::UINT8;
  uint64_t int_ = 0;  // integer and bool scalars (sign-extended for signed types)
  double float_ = 0;
  std::string string_;
  std::vector<std::string> strings_;  // string arrays
  std::vector<uint8_t> bytes_;        // numeric arrays, little-endian element bytes
};

// Ordered key/value store. Keys are unique; set() on an existing key replaces its value in place.
class Metadata {
 public:
  void set(const std::string& key, Value value);
  bool erase(const std::string& key);
  const Value* find(std::string_view key) const;
  bool contains(std::string_view key) const { return find(key) != nullptr; }
  size_t size() const { return entries_.size(); }
  const std::vector<std::pair<std::string, Value>>& entries() const { return entries_; }

  // Typed getters: the *_or forms return `fallback` when the key is absent; all throw Error when the
  // key exists with the wrong type. The others throw when the key is missing too.
  int64_t get_int(std::string_view key) const;
  int64_t get_int_or(std::string_view key, int64_t fallback) const;
  double get_float(std::string_view key) const;
  double get_float_or(std::string_view key, double fallback) const;
  bool get_bool_or(std::string_view key, bool fallback) const;
  const std::string& get_string(std::string_view key) const;
  std::string get_string_or(std::string_view key, const std::string& fallback) const;

 private:
  std::vector<std::pair<std::string, Value>> entries_;
  std::map<std::string, size_t, std::less<>> index_;
};

}  // namespace roofline::gguf
