// Test helper: an independent JSON Schema validator for the subset structured output supports (type,
// properties, required, additionalProperties, items, prefixItems, min/maxItems, enum, const, anyOf,
// oneOf, allOf, $ref to local definitions, min/maxLength counted in code points, format date / time /
// date-time / uuid). Returns "" when valid, else the first reason it is not.
#pragma once

#include <nlohmann/json.hpp>
#include <regex>
#include <string>

namespace roofline::serve::test {

inline size_t utf8_length(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

inline std::string validate_schema(const nlohmann::ordered_json& v, const nlohmann::ordered_json& s,
                                   const nlohmann::ordered_json& root, const std::string& at = "$") {
  using json = nlohmann::ordered_json;
  if (s.is_boolean()) return s.get<bool>() ? "" : at + ": schema false";
  if (s.contains("$ref")) {
    std::string ref = s["$ref"].get<std::string>().substr(1);
    return validate_schema(v, root[json::json_pointer(ref)], root, at);
  }
  if (s.contains("const") && v != s["const"]) return at + ": not the const " + s["const"].dump();
  if (s.contains("enum")) {
    bool found = false;
    for (const json& e : s["enum"]) found = found || e == v;
    if (!found) return at + ": not in enum";
  }
  for (const char* key : {"anyOf", "oneOf"})
    if (s.contains(key)) {
      int n = 0;
      for (const json& alt : s[key]) n += validate_schema(v, alt, root, at).empty();
      if (n == 0) return at + ": matches no " + key + " alternative";
    }
  if (s.contains("allOf"))
    for (const json& alt : s["allOf"])
      if (std::string e = validate_schema(v, alt, root, at); !e.empty()) return e;
  if (s.contains("type")) {
    auto is = [&](const std::string& t) {
      if (t == "object") return v.is_object();
      if (t == "array") return v.is_array();
      if (t == "string") return v.is_string();
      if (t == "integer") return v.is_number_integer();
      if (t == "number") return v.is_number();
      if (t == "boolean") return v.is_boolean();
      if (t == "null") return v.is_null();
      return false;
    };
    bool ok = false;
    if (s["type"].is_string()) ok = is(s["type"].get<std::string>());
    else
      for (const json& t : s["type"]) ok = ok || is(t.get<std::string>());
    if (!ok) return at + ": wrong type for " + s["type"].dump();
  }
  if (v.is_object()) {
    const json props = s.value("properties", json::object());
    if (s.contains("required"))
      for (const json& r : s["required"])
        if (!v.contains(r.get<std::string>())) return at + ": missing required " + r.get<std::string>();
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (props.contains(it.key())) {
        if (std::string e = validate_schema(it.value(), props[it.key()], root, at + "." + it.key()); !e.empty()) return e;
      } else if (s.contains("additionalProperties")) {
        if (std::string e = validate_schema(it.value(), s["additionalProperties"], root, at + "." + it.key()); !e.empty()) return e;
      } else if (s.contains("properties")) {
        return at + ": unexpected property " + it.key();  // absent additionalProperties: none (the server's rule)
      }
    }
  }
  if (v.is_array()) {
    if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>()) return at + ": too few items";
    if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>()) return at + ": too many items";
    const size_t k = s.contains("prefixItems") ? s["prefixItems"].size() : 0;
    for (size_t i = 0; i < v.size(); ++i) {
      const std::string where = at + "[" + std::to_string(i) + "]";
      if (i < k) {
        if (std::string e = validate_schema(v[i], s["prefixItems"][i], root, where); !e.empty()) return e;
      } else if (s.contains("items")) {
        if (std::string e = validate_schema(v[i], s["items"], root, where); !e.empty()) return e;
      }
    }
  }
  if (v.is_string()) {
    const std::string str = v.get<std::string>();
    if (s.contains("minLength") && utf8_length(str) < s["minLength"].get<size_t>()) return at + ": too short";
    if (s.contains("maxLength") && utf8_length(str) > s["maxLength"].get<size_t>()) return at + ": too long";
    if (s.contains("format")) {
      const std::string f = s["format"].get<std::string>();
      const std::string date = R"(\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01]))";
      const std::string time = R"(([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d{1,6})?(Z|[+-]([01]\d|2[0-3]):[0-5]\d))";
      std::string re = f == "date" ? date : f == "time" ? time : f == "date-time" ? date + "T" + time
                       : f == "uuid" ? "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}" : ".*";
      if (!std::regex_match(str, std::regex(re))) return at + ": not a " + f;
    }
  }
  return "";
}

inline std::string validate_schema(const nlohmann::ordered_json& v, const nlohmann::ordered_json& s) {
  return validate_schema(v, s, s);
}

}  // namespace roofline::serve::test
