// JSON Schema -> GBNF (see json_schema_grammar.h). Every schema becomes a rule matching its value
// without surrounding whitespace; containers put bounded whitespace (`ws`) between their tokens. An
// object's properties come in the schema's order: `first_i` (nothing written yet) and `rest_i`
// (something written, so a comma comes first) rules let each optional property be skipped. Numbers
// and whitespace are bounded so that any path through the grammar ends.
#include "serve/json_schema_grammar.h"

#include <fmt/format.h>

#include <functional>
#include <map>
#include <set>

#include "serve/grammar.h"

namespace roofline::serve {

using json = nlohmann::ordered_json;

namespace {

const std::set<std::string> kAnnotations = {"title",   "description", "default",  "examples",  "$schema",
                                            "$id",     "$comment",    "deprecated", "readOnly", "writeOnly",
                                            "$defs",   "definitions"};
const std::set<std::string> kKeywords = {"type",     "properties", "required", "additionalProperties", "items", "prefixItems",
                                         "minItems", "maxItems",   "enum",     "const",                "anyOf", "oneOf",
                                         "allOf",    "$ref",       "minLength", "maxLength",           "format"};

// Built-in rules, added to the output when used.
const std::map<std::string, std::string> kBuiltins = {
    {"ws", R"(| " " | "\n" [ \t]{0,20})"},
    // A \u escape outside U+D800..U+DFFF, or a high surrogate escape with its low one: strict parsers
    // (nlohmann's, the server's own tool-call parser) reject a lone surrogate.
    {"json-char", R"([^"\\\x00-\x1F] | "\\" (["\\/bfnrt] | "u" ([0-9a-cA-Ce-fE-F] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2} | )"
                  R"([dD] [89abAB] [0-9a-fA-F]{2} "\\u" [dD] [c-fC-F] [0-9a-fA-F]{2})))"},
    {"json-string", R"("\"" json-char* "\"")"},
    {"json-int", R"("-"? ([0-9] | [1-9] [0-9]{1,15}))"},
    {"json-number", R"(json-int ("." [0-9]{1,16})? ([eE] [-+]? [0-9]{1,2})?)"},
    {"json-boolean", R"("true" | "false")"},
    {"json-null", R"("null")"},
    {"json-value", R"(json-object | json-array | json-string | json-number | json-boolean | json-null)"},
    {"json-object", R"("{" ws (json-member ("," ws json-member)*)? "}")"},
    {"json-member", R"(json-string ws ":" ws json-value ws)"},
    {"json-array", R"("[" ws (json-value ws ("," ws json-value ws)*)? "]")"},
    {"json-date", R"([0-9]{4} "-" ("0" [1-9] | "1" [0-2]) "-" ("0" [1-9] | [12] [0-9] | "3" [01]))"},
    {"json-time",
     R"(([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ("." [0-9]{1,6})? ("Z" | [+-] ([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9]))"},
    {"json-uuid", R"([0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{12})"},
};
const std::map<std::string, std::vector<std::string>> kBuiltinDeps = {
    {"json-string", {"json-char"}},   {"json-number", {"json-int"}},
    {"json-value", {"json-object", "json-array", "json-string", "json-number", "json-boolean", "json-null"}},
    {"json-object", {"ws", "json-member"}}, {"json-member", {"json-string", "ws", "json-value"}},
    {"json-array", {"ws", "json-value"}},
};

// A GBNF string literal for these bytes.
std::string literal(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += (char)c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20) {
      out += fmt::format("\\x{:02X}", c);
    } else {
      out += (char)c;
    }
  }
  return out + "\"";
}

std::string sanitize(const std::string& s) {
  std::string out;
  for (char c : s) out += ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) ? c : '-';
  if (out.empty()) out = "x";
  if (out.size() > 40) out.resize(40);
  return out;
}

std::string escape_pointer(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '~') out += "~0";
    else if (c == '/') out += "~1";
    else out += c;
  }
  return out;
}

class SchemaConverter {
 public:
  // Sets the schema that $refs of the following visits resolve against; `tag` keeps their rules apart.
  void set_root(const json& root, std::string tag) {
    root_ = &root;
    tag_ = std::move(tag);
  }

  // A rule name (or a parenthesized expression) matching values of `s`, without surrounding whitespace.
  std::string visit(const json& s, const std::string& path, const std::string& hint) {
    if (s.is_boolean()) {
      if (!s.get<bool>()) throw SchemaError("the schema 'false' matches nothing", path);
      return builtin("json-value");
    }
    if (!s.is_object()) throw SchemaError("a schema must be an object or a boolean", path);
    std::vector<std::string> constraining;
    for (auto it = s.begin(); it != s.end(); ++it) {
      if (kAnnotations.count(it.key())) continue;
      if (!kKeywords.count(it.key()))
        throw SchemaError(fmt::format("unsupported JSON Schema keyword '{}'", it.key()), path + "/" + escape_pointer(it.key()));
      constraining.push_back(it.key());
    }
    auto only = [&](const char* key) {
      for (const std::string& k : constraining)
        if (k != key) throw SchemaError(fmt::format("'{}' beside '{}' is not supported", k, key), path + "/" + k);
    };
    if (s.contains("$ref")) {
      only("$ref");
      return ref(s["$ref"], path + "/$ref");
    }
    if (s.contains("const")) {
      only("const");
      return add_rule(hint, literal(s["const"].dump()));
    }
    if (s.contains("enum")) {
      const json& e = s["enum"];
      if (!e.is_array() || e.empty()) throw SchemaError("'enum' must be a non-empty array", path + "/enum");
      for (const std::string& k : constraining)
        if (k != "enum" && k != "type") throw SchemaError(fmt::format("'{}' beside 'enum' is not supported", k), path + "/" + k);
      std::string body;
      for (const json& v : e) {
        if (s.contains("type") && !type_matches(s["type"], v)) continue;
        body += (body.empty() ? "" : " | ") + literal(v.dump());
      }
      if (body.empty()) throw SchemaError("no 'enum' value has the schema's type", path + "/enum");
      return add_rule(hint, body);
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      if (!s.contains(key)) continue;
      only(key);
      const json& alts = s[key];
      if (!alts.is_array() || alts.empty()) throw SchemaError(fmt::format("'{}' must be a non-empty array", key), path + "/" + key);
      std::string body;
      for (size_t i = 0; i < alts.size(); ++i)
        body += (i ? " | " : "") + visit(alts[i], fmt::format("{}/{}/{}", path, key, i), hint + "-" + std::to_string(i));
      return add_rule(hint, body);
    }
    if (s.contains("allOf")) {
      only("allOf");
      const json& all = s["allOf"];
      if (!all.is_array() || all.size() != 1) throw SchemaError("'allOf' is supported with exactly one schema", path + "/allOf");
      return visit(all[0], path + "/allOf/0", hint);
    }
    std::vector<std::string> types;
    if (s.contains("type")) {
      const json& t = s["type"];
      if (t.is_string()) types.push_back(t.get<std::string>());
      else if (t.is_array() && !t.empty())
        for (const json& x : t) {
          if (!x.is_string()) throw SchemaError("'type' must be a string or an array of strings", path + "/type");
          types.push_back(x.get<std::string>());
        }
      else throw SchemaError("'type' must be a string or an array of strings", path + "/type");
    } else if (s.contains("properties") || s.contains("additionalProperties") || s.contains("required")) {
      types.push_back("object");
    } else if (s.contains("items") || s.contains("prefixItems") || s.contains("minItems") || s.contains("maxItems")) {
      types.push_back("array");
    } else if (s.contains("minLength") || s.contains("maxLength") || s.contains("format")) {
      types.push_back("string");
    } else {
      return builtin("json-value");
    }
    std::string body;
    for (const std::string& t : types) body += (body.empty() ? "" : " | ") + typed(s, t, path, hint);
    return types.size() == 1 ? body : add_rule(hint, body);
  }

  // The grammar text: root first, then every rule.
  std::string grammar(const std::string& root_body) const {
    std::string out = "root ::= " + root_body + "\n";
    for (const auto& [name, body] : rules_) out += name + " ::= " + body + "\n";
    return out;
  }

  std::string builtin(const std::string& name) {
    if (!defined_.insert(name).second) return name;
    if (auto d = kBuiltinDeps.find(name); d != kBuiltinDeps.end())
      for (const std::string& dep : d->second) builtin(dep);
    rules_.push_back({name, kBuiltins.at(name)});
    return name;
  }

  std::string add_rule(const std::string& hint, const std::string& body) {
    const std::string name = fresh_name(hint);
    rules_.push_back({name, body});
    return name;
  }

 private:
  static bool type_matches(const json& type, const json& v) {
    auto one = [&](const std::string& t) {
      if (t == "string") return v.is_string();
      if (t == "integer") return v.is_number_integer();
      if (t == "number") return v.is_number();
      if (t == "boolean") return v.is_boolean();
      if (t == "null") return v.is_null();
      if (t == "object") return v.is_object();
      if (t == "array") return v.is_array();
      return false;
    };
    if (type.is_string()) return one(type.get<std::string>());
    if (type.is_array())
      for (const json& t : type)
        if (t.is_string() && one(t.get<std::string>())) return true;
    return false;
  }

  std::string fresh_name(const std::string& hint) {
    std::string base = sanitize(hint);
    if (base == "root") base = "root-value";
    std::string name = base;
    for (int i = 1; defined_.count(name) || kBuiltins.count(name); ++i) name = fmt::format("{}-{}", base, i);
    defined_.insert(name);
    return name;
  }

  std::string ref(const json& r, const std::string& path) {
    if (!r.is_string()) throw SchemaError("'$ref' must be a string", path);
    const std::string target = r.get<std::string>();
    const std::string key = tag_ + target;
    if (auto it = refs_.find(key); it != refs_.end()) return it->second;
    if (target.rfind("#", 0) != 0) throw SchemaError(fmt::format("only local references (#/$defs/...) are supported, not '{}'", target), path);
    const json* node = root_;
    std::string pointer = target.substr(1);
    std::string last = "ref";
    size_t pos = 0;
    while (pos < pointer.size()) {
      if (pointer[pos] != '/') throw SchemaError(fmt::format("malformed reference '{}'", target), path);
      size_t end = pointer.find('/', pos + 1);
      if (end == std::string::npos) end = pointer.size();
      std::string token = pointer.substr(pos + 1, end - pos - 1);
      std::string unescaped;
      for (size_t i = 0; i < token.size(); ++i) {
        if (token[i] == '~' && i + 1 < token.size()) {
          unescaped += token[i + 1] == '1' ? '/' : '~';
          ++i;
        } else {
          unescaped += token[i];
        }
      }
      if (!node->is_object() || !node->contains(unescaped))
        throw SchemaError(fmt::format("reference '{}' does not resolve", target), path);
      node = &(*node)[unescaped];
      last = unescaped;
      pos = end;
    }
    const std::string name = fresh_name("ref-" + last);
    refs_[key] = name;
    const size_t slot = rules_.size();
    rules_.push_back({name, ""});
    const std::string body = visit(*node, target.substr(1), last);
    rules_[slot].second = body;
    return name;
  }

  static int64_t bound(const json& s, const char* key, const std::string& path, int64_t fallback) {
    if (!s.contains(key)) return fallback;
    const json& v = s[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 0) throw SchemaError(fmt::format("'{}' must be a non-negative integer", key), path + "/" + key);
    return v.get<int64_t>();
  }

  std::string typed(const json& s, const std::string& type, const std::string& path, const std::string& hint) {
    if (type == "object") return object(s, path, hint);
    if (type == "array") return array(s, path, hint);
    if (type == "string") return string(s, path, hint);
    if (type == "number") return builtin("json-number");
    if (type == "integer") return builtin("json-int");
    if (type == "boolean") return builtin("json-boolean");
    if (type == "null") return builtin("json-null");
    throw SchemaError(fmt::format("unknown type '{}'", type), path + "/type");
  }

  std::string string(const json& s, const std::string& path, const std::string& hint) {
    if (s.contains("format")) {
      if (!s["format"].is_string()) throw SchemaError("'format' must be a string", path + "/format");
      if (s.contains("minLength") || s.contains("maxLength"))
        throw SchemaError("'minLength' / 'maxLength' beside 'format' are not supported", path + "/format");
      const std::string f = s["format"].get<std::string>();
      std::string body;
      if (f == "date") body = builtin("json-date");
      else if (f == "time") body = builtin("json-time");
      else if (f == "date-time") body = builtin("json-date") + " \"T\" " + builtin("json-time");
      else if (f == "uuid") body = builtin("json-uuid");
      else throw SchemaError(fmt::format("unsupported string format '{}' (supported: date, time, date-time, uuid)", f), path + "/format");
      return add_rule(hint, "\"\\\"\" " + body + " \"\\\"\"");
    }
    const int64_t min = bound(s, "minLength", path, 0);
    const int64_t max = bound(s, "maxLength", path, -1);
    if (min == 0 && max < 0) return builtin("json-string");
    if (max >= 0 && max < min) throw SchemaError("'maxLength' is below 'minLength'", path + "/maxLength");
    if (max > 10000 || min > 10000) throw SchemaError("string lengths above 10000 are not supported", path);
    builtin("json-char");
    const std::string rep = max < 0 ? fmt::format("{{{},}}", min) : fmt::format("{{{},{}}}", min, max);
    return add_rule(hint, "\"\\\"\" json-char" + rep + " \"\\\"\"");
  }

  std::string object(const json& s, const std::string& path, const std::string& hint) {
    const json empty = json::object();
    const json& props = s.contains("properties") ? s["properties"] : empty;
    if (!props.is_object()) throw SchemaError("'properties' must be an object", path + "/properties");
    std::set<std::string> required;
    if (s.contains("required")) {
      if (!s["required"].is_array()) throw SchemaError("'required' must be an array of names", path + "/required");
      for (const json& r : s["required"]) {
        if (!r.is_string()) throw SchemaError("'required' must be an array of names", path + "/required");
        if (!props.contains(r.get<std::string>()))
          throw SchemaError(fmt::format("required property '{}' is not in 'properties'", r.get<std::string>()), path + "/required");
        required.insert(r.get<std::string>());
      }
    }
    // Extra properties: none when `properties` is given and additionalProperties is absent or false.
    std::string extra;
    if (s.contains("additionalProperties")) {
      const json& ap = s["additionalProperties"];
      if (!(ap.is_boolean() && !ap.get<bool>()))
        extra = visit(ap, path + "/additionalProperties", hint + "-additional");
    } else if (!s.contains("properties")) {
      extra = builtin("json-value");
    }
    builtin("ws");
    std::string extra_kv;
    if (!extra.empty()) extra_kv = add_rule(hint + "-additional-kv", builtin("json-string") + " ws \":\" ws " + extra + " ws");
    std::vector<std::string> kv;
    std::vector<bool> req;
    for (auto it = props.begin(); it != props.end(); ++it) {
      const std::string value = visit(it.value(), path + "/properties/" + escape_pointer(it.key()), hint + "-" + it.key());
      kv.push_back(add_rule(hint + "-" + it.key() + "-kv", literal(json(it.key()).dump()) + " ws \":\" ws " + value + " ws"));
      req.push_back(required.count(it.key()) > 0);
    }
    const size_t n = kv.size();
    // rest_i: properties i.. after something was written; first_i: the same with nothing written yet.
    std::vector<std::string> rest(n + 1), first(n + 1);
    rest[n] = extra_kv.empty() ? "" : add_rule(hint + "-rest", "(\",\" ws " + extra_kv + ")*");
    first[n] = extra_kv.empty() ? "" : add_rule(hint + "-first", "(" + extra_kv + " (\",\" ws " + extra_kv + ")*)?");
    for (size_t i = n; i-- > 0;) {
      const std::string after = rest[i + 1];
      if (req[i]) {
        rest[i] = add_rule(hint + "-rest", "\",\" ws " + kv[i] + (after.empty() ? "" : " " + after));
        first[i] = add_rule(hint + "-first", kv[i] + (after.empty() ? "" : " " + after));
      } else {
        rest[i] = add_rule(hint + "-rest", "(\",\" ws " + kv[i] + ")?" + (after.empty() ? "" : " " + after));
        const std::string take = kv[i] + (after.empty() ? "" : " " + after);
        first[i] = add_rule(hint + "-first", first[i + 1].empty() ? "(" + take + ")?" : take + " | " + first[i + 1]);
      }
    }
    return add_rule(hint, "\"{\" ws " + (first[0].empty() ? "" : first[0] + " ") + "\"}\"");
  }

  std::string array(const json& s, const std::string& path, const std::string& hint) {
    std::vector<std::string> prefix;
    if (s.contains("prefixItems")) {
      const json& p = s["prefixItems"];
      if (!p.is_array()) throw SchemaError("'prefixItems' must be an array of schemas", path + "/prefixItems");
      for (size_t i = 0; i < p.size(); ++i)
        prefix.push_back(visit(p[i], fmt::format("{}/prefixItems/{}", path, i), fmt::format("{}-{}", hint, i)));
    }
    std::string item;  // empty: no items past the prefix
    bool items_false = false;
    if (s.contains("items")) {
      const json& it = s["items"];
      if (it.is_boolean() && !it.get<bool>()) items_false = true;
      else item = visit(it, path + "/items", hint + "-item");
    } else {
      item = builtin("json-value");
    }
    const int64_t k = (int64_t)prefix.size();
    const int64_t min = bound(s, "minItems", path, 0);
    int64_t max = bound(s, "maxItems", path, -1);
    if (items_false && (max < 0 || max > k)) max = k;
    if (max >= 0 && max < min) throw SchemaError("'maxItems' is below what the array must hold", path + "/maxItems");
    if (min > 10000 || max > 10000) throw SchemaError("array sizes above 10000 are not supported", path);
    builtin("ws");
    auto element = [&](int64_t j) { return (j < k ? prefix[(size_t)j] : item) + " ws"; };
    // Elements from j on, given j elements written (so each starts with a comma).
    std::function<std::string(int64_t)> tail = [&](int64_t j) -> std::string {
      if (max >= 0 && j >= max) return "";
      if (j < k) {
        const std::string part = "\",\" ws " + element(j);
        const std::string more = tail(j + 1);
        const std::string seq = more.empty() ? part : part + " " + more;
        return j < min ? seq : "(" + seq + ")?";
      }
      const int64_t must = std::max<int64_t>(0, min - j);
      std::string out;
      if (must > 0) out += "(\",\" ws " + element(j) + "){" + std::to_string(must) + "}";
      const int64_t from = std::max(min, j);
      const std::string rep = max < 0 ? "*" : (max - from > 0 ? fmt::format("{{0,{}}}", max - from) : "");
      if (!rep.empty()) out += (out.empty() ? "" : " ") + ("(\",\" ws " + element(j) + ")" + rep);
      return out;
    };
    if (max == 0) return add_rule(hint, "\"[\" ws \"]\"");
    const std::string more = tail(1);
    const std::string elements = element(0) + (more.empty() ? "" : " " + more);
    return add_rule(hint, "\"[\" ws " + (min == 0 ? "(" + elements + ")?" : elements) + " \"]\"");
  }

  const json* root_ = nullptr;
  std::string tag_;
  std::vector<std::pair<std::string, std::string>> rules_;
  std::set<std::string> defined_;
  std::map<std::string, std::string> refs_;
};

}  // namespace

namespace {

// The grammar a schema became must be one the matcher takes: where it is not (a '$ref' that reaches itself
// before any character of the value, such as {"$ref": "#"}; a repetition too large to expand), that is
// the schema's problem and is said as such, not in the generated rules' names alone.
std::string usable(std::string gbnf) {
  try {
    Grammar::parse(gbnf);
  } catch (const GrammarError& e) {
    const std::string what = e.what();
    if (what.find("left-recursive") != std::string::npos)
      throw SchemaError(fmt::format("a '$ref' reaches itself before any character of the value ({})", what), "");
    throw SchemaError(fmt::format("the schema cannot be enforced: {}", what), "");
  }
  return gbnf;
}

}  // namespace

std::string json_schema_to_gbnf(const json& schema) {
  SchemaConverter c;
  c.set_root(schema, "");
  const std::string root = c.visit(schema, "", "value");
  return usable(c.grammar(root));
}

std::string json_object_gbnf() {
  SchemaConverter c;
  return c.grammar(c.builtin("json-object"));
}

std::string tool_calls_gbnf(const std::vector<ToolGrammarSpec>& tools, bool parallel) {
  if (tools.empty()) throw SchemaError("no tools to call", "");
  SchemaConverter c;
  std::string calls;
  for (size_t i = 0; i < tools.size(); ++i) {
    const ToolGrammarSpec& t = tools[i];
    const std::string hint = "tool-" + t.name;
    std::string args;
    if (t.parameters.is_null()) {
      args = c.builtin("json-object");
    } else {
      c.set_root(t.parameters, std::to_string(i) + ":");
      try {
        args = c.visit(t.parameters, "", hint + "-arguments");
      } catch (const SchemaError& e) {
        throw SchemaError(fmt::format("function '{}': {}", t.name, e.what()), e.path);
      }
    }
    const std::string head = "<tool_call>\n{\"name\": " + json(t.name).dump() + ", \"arguments\": ";
    const std::string call = c.add_rule(hint + "-call", literal(head) + " " + args + " " + literal("}\n</tool_call>"));
    calls += (calls.empty() ? "" : " | ") + call;
  }
  const std::string call = c.add_rule("tool-call", calls);
  return usable(c.grammar(parallel ? call + " (\"\\n\" " + call + ")*" : call));
}

}  // namespace roofline::serve
