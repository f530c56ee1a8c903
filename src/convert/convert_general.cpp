// general.* metadata the way llama.cpp's converter derives it (gguf-py metadata.py: Metadata.load with
// the model card, config.json's "_name_or_path", generation_config.json and the folder name; then
// set_gguf_meta_model's key order). Our own code; ASCII-only case rules (Python's str.title/islower are
// Unicode-aware) and a README front-matter reader for flat scalars and lists (not a YAML parser).
#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>

#include "convert/convert_hf_util.h"
#include "core/error.h"

namespace roofline::convert {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

bool is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

// Python's str.title() and str.islower() on ASCII.
std::string py_title(const std::string& w) {
  std::string r = w;
  bool prev_cased = false;
  for (char& c : r) {
    if (is_alpha(c)) {
      c = prev_cased ? (char)std::tolower((unsigned char)c) : (char)std::toupper((unsigned char)c);
      prev_cased = true;
    } else {
      prev_cased = false;
    }
  }
  return r;
}
bool py_islower(const std::string& w) {
  bool cased = false;
  for (char c : w) {
    if (c >= 'A' && c <= 'Z') return false;
    if (c >= 'a' && c <= 'z') cased = true;
  }
  return cased;
}

std::vector<std::string> split_on(const std::string& s, char sep) {
  std::vector<std::string> parts;
  std::string cur;
  for (char c : s) {
    if (c == sep) {
      parts.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  parts.push_back(cur);
  return parts;
}

std::string join(const std::vector<std::string>& v, const std::string& sep) {
  std::string r;
  for (size_t i = 0; i < v.size(); ++i) r += (i ? sep : "") + v[i];
  return r;
}

bool full_match(const std::string& s, const char* re) {
  return std::regex_match(s, std::regex(re, std::regex::ECMAScript | std::regex::icase));
}

}  // namespace

// Metadata.get_model_id_components.
ModelIdParts model_id_parts(const std::string& model_id, int64_t total_params) {
  ModelIdParts r;
  if (model_id.find(' ') != std::string::npos) {
    r.full_name = model_id;
    return r;
  }
  std::string full = model_id;
  const size_t slash = model_id.find('/');
  if (slash != std::string::npos) {
    r.org = model_id.substr(0, slash);
    full = model_id.substr(slash + 1);
  }
  if (r.org && !r.org->empty() && (*r.org)[0] == '.') r.org.reset();
  r.full_name = full;

  std::vector<std::string> parts;
  for (auto& p : split_on(full, '-'))
    if (!p.empty()) parts.push_back(p);
  std::vector<std::set<std::string>> types(parts.size());
  for (size_t i = 0; i < parts.size(); ++i) {
    std::string part = parts[i];
    if (full_match(part, R"((v|iter)?\d+([.]\d+)*)")) {
      types[i].insert("version");
    } else if (full_match(part, R"(i?q\d(_\w)*|b?fp?(16|32))")) {
      types[i].insert("type");
      for (char& c : part) c = (char)std::toupper((unsigned char)c);
      parts[i] = part;
    } else if (i > 0 && full_match(part, R"((([A]|\d+[x])?\d+([._]\d+)?[KMBT][\d]?|small|mini|medium|large|x?xl))")) {
      for (char& c : part)
        if (c == '_') c = '.';
      if (is_digit(part.back())) part = part.substr(0, part.size() - 2) + "." + part.back() + part[part.size() - 2];
      if (part.size() > 1 && is_digit(part[part.size() - 2]) && std::string("kmbt").find(part.back()) != std::string::npos)
        part.back() = (char)std::toupper((unsigned char)part.back());
      if (total_params != 0) {
        // float(part[:-1]) * 1000 ** " KMBT".find(part[-1]); a ValueError (not a number) skips this.
        const std::string num = part.substr(0, part.size() - 1);
        char* end = nullptr;
        const double v = num.empty() ? 0 : std::strtod(num.c_str(), &end);
        const bool numeric = !num.empty() && end == num.c_str() + num.size() && !is_alpha(num[0]);
        if (numeric) {
          const long pos = (long)std::string(" KMBT").find(part.back());
          const double label_params = v * std::pow(1000.0, (double)(pos == (long)std::string::npos ? -1 : pos));
          const double total = (double)total_params;
          if ((total_params < 0 && label_params < (double)(std::llabs(total_params) / 8)) ||
              (total_params > 0 && std::fabs(label_params - total) > (double)(7 * total_params / 8))) {
            types[i].insert("finetune");
            part.back() = (char)std::tolower((unsigned char)part.back());
          }
        }
      }
      if (types[i].empty()) types[i].insert("size_label");
      parts[i] = part;
    } else if (i > 0 && full_match(part, "chat|instruct|vision|lora")) {
      std::string lower = part;
      for (char& c : lower) c = (char)std::tolower((unsigned char)c);
      if (total_params < 0 && lower == "lora") types[i].insert("type");
      else types[i].insert("finetune");
    }
  }
  // Word-based size labels go when a number-based one is present.
  bool numeric_size = false;
  for (size_t i = 0; i < parts.size(); ++i)
    if (types[i].count("size_label"))
      for (char c : parts[i])
        if (is_digit(c)) numeric_size = true;
  if (numeric_size)
    for (size_t i = 0; i < parts.size(); ++i)
      if (types[i].count("size_label")) {
        bool all_alpha = true;
        for (char c : parts[i]) all_alpha = all_alpha && is_alpha(c);
        if (all_alpha) types[i].erase("size_label");
      }
  bool at_start = true;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (at_start && ((types[i].empty() && is_alpha(parts[i][0])) || types[i].count("version"))) {
      types[i].insert("basename");
    } else {
      at_start = false;
      if (types[i].empty()) types[i].insert("finetune");
    }
  }
  for (size_t k = parts.size(); k-- > 0;) {
    if (types[k].count("basename") && types[k].size() > 1) types[k].erase("basename");
    else break;
  }
  std::vector<std::string> base, sizes, fine, ver;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (types[i].count("basename")) base.push_back(parts[i]);
    if (types[i].count("size_label") && std::find(sizes.begin(), sizes.end(), parts[i]) == sizes.end()) sizes.push_back(parts[i]);
    if (types[i].count("finetune")) fine.push_back(parts[i]);
    if (types[i].count("version") && !types[i].count("basename")) ver.push_back(parts[i]);
  }
  auto opt = [](const std::vector<std::string>& v) -> std::optional<std::string> {
    const std::string s = join(v, "-");
    return s.empty() ? std::nullopt : std::optional<std::string>(s);
  };
  r.basename = opt(base);
  r.size_label = opt(sizes);
  r.finetune = opt(fine);
  r.version = opt(ver);
  if (!r.size_label && !r.finetune && !r.version) r.basename.reset();
  return r;
}

namespace {

// README.md's front matter: top-level "key: scalar", "key: [a, b]" and "key:" followed by "- item" lines.
// Values are strings (quotes removed); nested mappings are skipped.
struct CardValue {
  std::optional<std::string> scalar;
  std::optional<std::vector<std::string>> list;
};

std::string card_scalar(std::string v) {
  auto trim = [](std::string s) {
    const size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t\r");
    return a == std::string::npos ? std::string() : s.substr(a, b - a + 1);
  };
  v = trim(v);
  if (v.size() >= 2 && ((v.front() == '"' && v.back() == '"') || (v.front() == '\'' && v.back() == '\'')))
    return v.substr(1, v.size() - 2);
  const size_t hash = v.find(" #");
  if (hash != std::string::npos) v = trim(v.substr(0, hash));
  if (v == "null" || v == "~") return "";
  return v;
}

std::map<std::string, CardValue> read_model_card(const fs::path& dir) {
  std::map<std::string, CardValue> card;
  std::ifstream in(dir / "README.md", std::ios::binary);
  if (!in) return card;
  std::string line;
  if (!std::getline(in, line) || line != "---") return card;
  std::string key;
  while (std::getline(in, line)) {
    if (line == "---") break;
    for (auto& c : line)
      if (c == '\t') c = ' ';
    if (line.empty() || line[0] == '#') continue;
    if (line[0] != ' ' && line[0] != '-') {
      const size_t colon = line.find(':');
      if (colon == std::string::npos) {
        key.clear();
        continue;
      }
      key = line.substr(0, colon);
      const std::string rest = card_scalar(line.substr(colon + 1));
      CardValue v;
      if (rest.size() >= 2 && rest.front() == '[' && rest.back() == ']') {
        v.list.emplace();
        for (auto& item : split_on(rest.substr(1, rest.size() - 2), ','))
          if (!card_scalar(item).empty()) v.list->push_back(card_scalar(item));
      } else if (!rest.empty()) {
        v.scalar = rest;
      }
      card[key] = v;
      continue;
    }
    const size_t a = line.find_first_not_of(' ');
    if (key.empty() || a == std::string::npos) continue;
    if (line.compare(a, 2, "- ") == 0 || line.compare(a, 2, "-") == 0) {
      CardValue& v = card[key];
      if (v.scalar) continue;
      if (!v.list) v.list.emplace();
      const std::string item = card_scalar(line.substr(a + 1));
      if (!item.empty()) v.list->push_back(item);
    } else {
      card[key].list.reset();  // a nested mapping: not something we take
      key.clear();
    }
  }
  return card;
}

}  // namespace

std::string model_id_to_title(const std::string& s) {
  std::string t = s;
  for (char& c : t)
    if (c == '-') c = ' ';
  std::istringstream words(t);
  std::vector<std::string> out;
  std::string w;
  static const std::regex version_or_number(R"(^(v\d+(?:\.\d+)*|\d.*)$)");
  while (words >> w) out.push_back(py_islower(w) && !std::regex_search(w, version_or_number) ? py_title(w) : w);
  return join(out, " ");
}

std::string weight_count_label(int64_t n) {
  double scaled;
  const char* suffix;
  const double x = (double)n;
  if (x > 1e12) scaled = x * 1e-12, suffix = "T";
  else if (x > 1e9) scaled = x * 1e-9, suffix = "B";
  else if (x > 1e6) scaled = x * 1e-6, suffix = "M";
  else scaled = x * 1e-3, suffix = "K";
  std::string rounded = fmt::format("{:.0f}", std::nearbyint(scaled));  // Python's round(): half to even
  rounded.erase(0, rounded.find_first_not_of('0'));
  const int fix = std::max(2 - (int)rounded.size(), 0);
  return fmt::format("{:.{}f}{}", scaled, fix, suffix);
}

void add_general_metadata(gguf::Metadata& md, const fs::path& dir, const json& raw_config, int64_t total_params) {
  struct Meta {
    std::optional<std::string> name, author, version, organization, description, finetune, basename, size_label,
        license, license_name, license_link, source_url, source_doi, source_uuid, source_repo_url;
    std::optional<std::vector<json>> base_models, datasets;
    std::optional<std::vector<std::string>> tags, languages;
  } m;

  // Model card.
  const auto card = read_model_card(dir);
  auto use = [&](std::optional<std::string>& field, const char* key) {
    auto it = card.find(key);
    if (it != card.end() && !field && it->second.scalar) field = it->second.scalar;
  };
  auto use_array = [&](std::optional<std::vector<std::string>>& field, const char* key) {
    auto it = card.find(key);
    if (it == card.end() || (!it->second.scalar && !it->second.list)) return;
    if (!field) field.emplace();
    if (it->second.scalar) field->push_back(*it->second.scalar);
    else field->insert(field->end(), it->second.list->begin(), it->second.list->end());
  };
  for (const char* prefix : {"", "model_"}) {
    const std::string p = prefix;
    use(m.name, (p + "name").c_str());
    use(m.author, (p + "author").c_str());
    use(m.version, (p + "version").c_str());
    use(m.organization, (p + "organization").c_str());
    use(m.description, (p + "description").c_str());
    use(m.finetune, (p + "finetune").c_str());
    use(m.basename, (p + "basename").c_str());
    use(m.size_label, (p + "size_label").c_str());
    use(m.source_url, (p + "url").c_str());
    use(m.source_doi, (p + "doi").c_str());
    use(m.source_uuid, (p + "uuid").c_str());
    use(m.source_repo_url, (p + "repo_url").c_str());
  }
  use(m.author, "model_creator");
  use(m.basename, "model_type");
  auto entries_for = [&](std::initializer_list<const char*> keys, std::optional<std::vector<json>>& out) {
    for (const char* k : keys) {
      auto it = card.find(k);
      if (it == card.end()) continue;
      std::vector<std::string> ids;
      if (it->second.scalar) ids.push_back(*it->second.scalar);
      else if (it->second.list) ids = *it->second.list;
      if (!out) out.emplace();
      for (const std::string& id : ids) {
        json e = json::object();
        std::string hf_id = id;
        const bool url = id.rfind("http://", 0) == 0 || id.rfind("https://", 0) == 0 || id.rfind("ssh://", 0) == 0;
        if (url) {
          e["repo_url"] = id;
          std::smatch mm;
          static const std::regex hf(R"(^https?://huggingface.co/([^/]+/[^/]+)$)");
          if (!std::regex_match(id, mm, hf)) {
            out->push_back(e);
            continue;
          }
          hf_id = mm[1].str();
        }
        const ModelIdParts c = model_id_parts(hf_id, total_params);
        if (c.full_name) e["name"] = model_id_to_title(*c.full_name);
        if (c.org) e["organization"] = model_id_to_title(*c.org);
        if (c.version) e["version"] = *c.version;
        if (!url && c.org && c.full_name) e["repo_url"] = "https://huggingface.co/" + *c.org + "/" + *c.full_name;
        out->push_back(e);
      }
      break;  // model_card.get("base_model", model_card.get("base_models", ...)): the first key present
    }
  };
  entries_for({"base_model", "base_models", "base_model_sources"}, m.base_models);
  entries_for({"datasets", "dataset", "dataset_sources"}, m.datasets);
  if (auto it = card.find("license"); it != card.end()) {
    if (it->second.scalar) m.license = it->second.scalar;
    else if (it->second.list) m.license = join(*it->second.list, ",");
  }
  use(m.license_name, "license_name");
  use(m.license_link, "license_link");
  use_array(m.tags, "tags");
  use_array(m.tags, "pipeline_tag");
  use_array(m.languages, "languages");
  use_array(m.languages, "language");

  // config.json's _name_or_path (a hub id, not a local path), then the folder name.
  auto apply_id = [&](const std::string& id) {
    const ModelIdParts c = model_id_parts(id, total_params);
    if (!m.name && c.full_name) m.name = model_id_to_title(*c.full_name);
    if (!m.organization && c.org) m.organization = model_id_to_title(*c.org);
    if (!m.basename && c.basename) m.basename = c.basename;
    if (!m.finetune && c.finetune) m.finetune = c.finetune;
    if (!m.version && c.version) m.version = c.version;
    if (!m.size_label && c.size_label) m.size_label = c.size_label;
  };
  if (raw_config.is_object() && raw_config.contains("_name_or_path") && raw_config["_name_or_path"].is_string()) {
    const std::string id = raw_config["_name_or_path"].get<std::string>();
    if (std::count(id.begin(), id.end(), '/') <= 1) apply_id(id);
  }
  fs::path folder = fs::absolute(dir).lexically_normal();
  if (folder.filename().empty()) folder = folder.parent_path();
  apply_id(folder.filename().string());
  if (!m.size_label && total_params > 0) m.size_label = weight_count_label(total_params);

  // generation_config.json (an unreadable one is ignored, as llama.cpp does).
  json gen;
  try {
    std::ifstream in(dir / "generation_config.json", std::ios::binary);
    if (in) gen = json::parse(in);
  } catch (const std::exception&) {
    gen = json();
  }
  if (gen.is_object()) {
    auto f32 = [&](const char* from, const char* key) {
      if (gen.contains(from) && gen[from].is_number()) md.set(key, gguf::Value::f32(gen[from].get<float>()));
    };
    auto i32 = [&](const char* from, const char* key) {
      if (gen.contains(from) && gen[from].is_number_integer()) md.set(key, gguf::Value::i32(gen[from].get<int32_t>()));
    };
    if (gen.contains("sequence") && gen["sequence"].is_string() && !gen["sequence"].get<std::string>().empty())
      md.set("general.sampling.sequence", gguf::Value::string(gen["sequence"].get<std::string>()));
    i32("top_k", "general.sampling.top_k");
    f32("top_p", "general.sampling.top_p");
    f32("min_p", "general.sampling.min_p");
    f32("xtc_probability", "general.sampling.xtc_probability");
    f32("xtc_threshold", "general.sampling.xtc_threshold");
    f32("temperature", "general.sampling.temp");
    i32("penalty_last_n", "general.sampling.penalty_last_n");
    f32("penalty_repeat", "general.sampling.penalty_repeat");
    i32("mirostat", "general.sampling.mirostat");
    f32("mirostat_tau", "general.sampling.mirostat_tau");
    f32("mirostat_eta", "general.sampling.mirostat_eta");
  }

  // set_gguf_meta_model's order; empty strings are not written (GGUFWriter.add_string skips them).
  auto str = [&](const char* key, const std::optional<std::string>& v) {
    if (v && !v->empty()) md.set(key, gguf::Value::string(*v));
  };
  str("general.name", m.name);
  str("general.author", m.author);
  str("general.version", m.version);
  str("general.organization", m.organization);
  str("general.finetune", m.finetune);
  str("general.basename", m.basename);
  str("general.description", m.description);
  str("general.size_label", m.size_label);
  str("general.license", m.license);
  str("general.license.name", m.license_name);
  str("general.license.link", m.license_link);
  str("general.source.url", m.source_url);
  str("general.source.doi", m.source_doi);
  str("general.source.uuid", m.source_uuid);
  str("general.source.repo_url", m.source_repo_url);
  auto entries = [&](const char* what, const std::optional<std::vector<json>>& list) {
    if (!list) return;
    md.set(fmt::format("general.{}.count", what), gguf::Value::u32((uint32_t)list->size()));
    for (size_t i = 0; i < list->size(); ++i)
      for (const char* k : {"name", "author", "version", "organization", "description", "url", "doi", "uuid", "repo_url"})
        if ((*list)[i].contains(k) && !(*list)[i][k].get<std::string>().empty())
          md.set(fmt::format("general.{}.{}.{}", what, i, k), gguf::Value::string((*list)[i][k].get<std::string>()));
  };
  entries("base_model", m.base_models);
  entries("dataset", m.datasets);
  if (m.tags && !m.tags->empty()) md.set("general.tags", gguf::Value::string_array(*m.tags));
  if (m.languages && !m.languages->empty()) md.set("general.languages", gguf::Value::string_array(*m.languages));
}

}  // namespace roofline::convert
