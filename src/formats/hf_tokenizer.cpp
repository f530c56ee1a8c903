// tokenizer.json (+ tokenizer_config.json, config.json beside it) -> GGUF tokenizer keys, following
// what llama.cpp's convert_hf_to_gguf.py writes: byte-level BPE as model "gpt2" with a pre-tokenizer
// name found from the split regexes, SentencePiece-style BPE (▁, byte fallback) as model "llama".
// Deviation: for "llama" vocabularies the ranked merges are written too (llama.cpp ignores them;
// roofline uses them to match Hugging Face exactly), and added tokens keep their text unchanged.
#include "formats/hf_tokenizer.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"

namespace roofline {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

json read_json(const fs::path& p, bool required) {
  std::ifstream f(p, std::ios::binary);
  if (!f) {
    if (required) fail("{}: cannot open", p.string());
    return json();
  }
  std::stringstream ss;
  ss << f.rdbuf();
  try {
    return json::parse(ss.str());
  } catch (const json::exception& e) {
    fail("{}: not valid JSON: {}", p.string(), e.what());
  }
}

// A special token in tokenizer_config.json: "text" or {"content": "text", ...}.
std::string token_content(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return "";
}

bool looks_special(const std::string& t) {
  if (t == "<pad>" || t == "<mask>" || t == "<2mass>" || t == "[@BOS@]") return true;
  auto wrapped = [&](std::string_view a, std::string_view b) {
    return t.size() >= a.size() + b.size() && t.compare(0, a.size(), a) == 0 && t.compare(t.size() - b.size(), b.size(), b) == 0;
  };
  return wrapped("<|", "|>") || wrapped("<｜", "｜>");
}

// Walks a (possibly Sequence) pre_tokenizer, collecting Split regexes and ByteLevel's implied regex.
void collect_pre(const json& pt, std::vector<std::string>& regexes, bool& byte_level, bool& metaspace_prefix,
                 std::vector<std::string>& unsupported) {
  if (!pt.is_object()) return;
  const std::string type = pt.value("type", "");
  if (type == "Sequence") {
    for (const auto& p : pt.value("pretokenizers", json::array())) collect_pre(p, regexes, byte_level, metaspace_prefix, unsupported);
  } else if (type == "Split") {
    const json& pat = pt.value("pattern", json::object());
    if (pat.contains("Regex")) {
      regexes.push_back(pat["Regex"].get<std::string>());
    } else if (pat.contains("String")) {
      // Gemma-style split on ' ' after ' ' was replaced by ▁: no effect on the BPE input.
      if (pat["String"] != " ") unsupported.push_back("Split on string " + pat["String"].dump());
    }
  } else if (type == "ByteLevel") {
    byte_level = true;
    if (pt.value("use_regex", true)) regexes.push_back(find_pre_tokenizer("gpt2")->regexes[0]);
  } else if (type == "Metaspace") {
    const std::string scheme = pt.value("prepend_scheme", "always");
    metaspace_prefix = pt.value("add_prefix_space", true) && scheme != "never";
  } else if (type == "Digits" || type == "Punctuation" || type == "Whitespace" || type == "WhitespaceSplit" ||
             type == "BertPreTokenizer") {
    unsupported.push_back(type);
  }
}

bool normalizer_prepends_space(const json& n) {
  if (!n.is_object()) return false;
  const std::string type = n.value("type", "");
  if (type == "Sequence") {
    for (const auto& x : n.value("normalizers", json::array()))
      if (normalizer_prepends_space(x)) return true;
    return false;
  }
  return type == "Prepend" && n.value("prepend", "") == "\xE2\x96\x81";
}

// add_bos/add_eos and the token ids from a TemplateProcessing post-processor.
void template_processing(const json& pp, const json& added_by_content, int64_t& add_bos, int64_t& add_eos,
                         std::string& bos_text, std::string& eos_text) {
  if (!pp.is_object()) return;
  if (pp.value("type", "") == "Sequence") {
    for (const auto& p : pp.value("processors", json::array()))
      template_processing(p, added_by_content, add_bos, add_eos, bos_text, eos_text);
    return;
  }
  if (pp.value("type", "") != "TemplateProcessing" || !pp.contains("single")) return;
  const json& single = pp["single"];
  if (!single.is_array() || single.empty()) return;
  if (single.front().contains("SpecialToken")) {
    add_bos = 1;
    bos_text = single.front()["SpecialToken"].value("id", "");
  } else {
    add_bos = 0;
  }
  if (single.size() >= 2 && single.back().contains("SpecialToken")) {
    add_eos = 1;
    eos_text = single.back()["SpecialToken"].value("id", "");
  } else {
    add_eos = 0;
  }
}

void add_metadata(gguf::Metadata& md, const std::string& tokenizer_json_path, int n_vocab, const std::string& pre_override) {
  const fs::path tj_path(tokenizer_json_path);
  const json tj = read_json(tj_path, true);
  const fs::path dir = tj_path.parent_path();
  const json cfg = read_json(dir / "tokenizer_config.json", false);
  const json model_cfg = read_json(dir / "config.json", false);
  const std::string where = tj_path.string();

  if (!tj.is_object() || !tj.contains("model")) fail("{}: not a tokenizer.json (no \"model\")", where);
  const json& model = tj["model"];
  const std::string mtype = model.value("type", "");
  if (mtype != "BPE") fail("{}: tokenizer model type '{}' is not supported (only BPE)", where, mtype);
  if (!model.contains("vocab") || !model["vocab"].is_object()) fail("{}: model.vocab is missing", where);

  std::vector<std::string> regexes, unsupported;
  bool byte_level = false, metaspace_prefix = false;
  collect_pre(tj.value("pre_tokenizer", json()), regexes, byte_level, metaspace_prefix, unsupported);
  if (tj.contains("decoder") && tj["decoder"].is_object() && tj["decoder"].value("type", "") == "ByteLevel") byte_level = true;

  // Vocabulary: model.vocab plus added tokens, by id.
  std::map<int64_t, std::string> by_id;
  for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) {
    if (!it.value().is_number_integer()) fail("{}: vocab entry '{}' has no integer id", where, it.key());
    by_id[it.value().get<int64_t>()] = it.key();
  }
  struct Added {
    std::string content;
    bool special;
  };
  std::map<int64_t, Added> added;
  json added_by_content = json::object();
  for (const auto& a : tj.value("added_tokens", json::array())) {
    // Only an integer id counts: nlohmann's value() converts a float such as 1e70 to int64 (undefined).
    const json id_value = a.is_object() ? a.value("id", json()) : json();
    const int64_t id = id_value.is_number_integer() ? id_value.get<int64_t>() : -1;
    const std::string content = a.value("content", "");
    if (id < 0 || content.empty()) continue;
    added[id] = Added{content, a.value("special", false)};
    added_by_content[content] = id;
  }
  int64_t size = 0;
  if (!by_id.empty()) size = std::max(size, by_id.rbegin()->first + 1);
  if (!added.empty()) size = std::max(size, added.rbegin()->first + 1);
  if (size > 16 * 1024 * 1024) fail("{}: token id {} is implausibly large", where, size - 1);
  if (n_vocab > 0 && size > n_vocab) fail("{}: the tokenizer has {} tokens, more than the model's {}", where, size, n_vocab);
  if (n_vocab > 0) size = n_vocab;

  const std::string unk_text = model.contains("unk_token") && model["unk_token"].is_string() ? model["unk_token"].get<std::string>() : "";
  std::vector<std::string> tokens((size_t)size);
  std::vector<int32_t> types((size_t)size);
  std::vector<float> scores;
  for (int64_t i = 0; i < size; ++i) {
    auto ai = added.find(i);
    auto vi = by_id.find(i);
    if (ai != added.end()) {
      tokens[i] = ai->second.content;
      types[i] = (ai->second.special || looks_special(ai->second.content)) ? 3 : 4;
      if (!byte_level && ai->second.content == unk_text) types[i] = 2;
    } else if (vi != by_id.end()) {
      tokens[i] = vi->second;
      types[i] = 1;
      if (!byte_level && byte_token_value(vi->second) >= 0) types[i] = 6;
      if (!byte_level && vi->second == unk_text) types[i] = 2;
    } else {
      tokens[i] = "[PAD" + std::to_string(i) + "]";
      types[i] = 5;
    }
  }

  auto find_id = [&](const std::string& text) -> int64_t {
    if (text.empty()) return -1;
    if (added_by_content.contains(text)) return added_by_content[text].get<int64_t>();
    const json& v = model["vocab"];
    if (v.contains(text)) return v[text].get<int64_t>();
    return -1;
  };

  if (byte_level) {
    std::string pre = pre_override;
    if (pre.empty()) {
      if (!unsupported.empty()) fail("{}: pre-tokenizer step '{}' is not supported", where, unsupported[0]);
      pre = pre_tokenizer_name_for(regexes);
      if (pre.empty()) {
        std::string list;
        for (const auto& r : regexes) list += (list.empty() ? "" : " , ") + r;
        fail("{}: unknown pre-tokenizer regex {} (known: gpt2, llama-bpe, qwen2, qwen35); pass the name to use", where,
             list.empty() ? "(none)" : list);
      }
    }
    md.set("tokenizer.ggml.model", gguf::Value::string("gpt2"));
    md.set("tokenizer.ggml.pre", gguf::Value::string(pre));
  } else {
    if (!model.value("byte_fallback", false))
      fail("{}: a BPE tokenizer that is neither byte-level nor SentencePiece-style (byte_fallback) is not supported", where);
    md.set("tokenizer.ggml.model", gguf::Value::string("llama"));
    scores.resize((size_t)size, 0.0f);
    for (int64_t i = 0; i < size; ++i)
      if (types[i] == 1) scores[i] = -(float)i;  // sentencepiece BPE pieces come in merge order
  }
  md.set("tokenizer.ggml.tokens", gguf::Value::string_array(std::move(tokens)));
  if (!scores.empty()) md.set("tokenizer.ggml.scores", gguf::Value::f32_array(scores));
  md.set("tokenizer.ggml.token_type", gguf::Value::i32_array(types));

  // Merges as "a b".
  std::vector<std::string> merges;
  for (const auto& m : model.value("merges", json::array())) {
    if (m.is_string()) {
      merges.push_back(m.get<std::string>());
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
    } else {
      fail("{}: a merge is neither \"a b\" nor [\"a\", \"b\"]: {}", where, m.dump());
    }
  }
  if (!merges.empty()) md.set("tokenizer.ggml.merges", gguf::Value::string_array(std::move(merges)));  // as llama.cpp: no empty arrays

  // Special tokens: tokenizer_config.json first, then the post-processor, then config.json ids.
  int64_t add_bos = -1, add_eos = -1;
  std::string tp_bos, tp_eos;
  template_processing(tj.value("post_processor", json()), added_by_content, add_bos, add_eos, tp_bos, tp_eos);
  int64_t bos = -1, eos = -1, unk = -1, pad = -1;
  if (cfg.is_object()) {
    bos = find_id(token_content(cfg.value("bos_token", json())));
    eos = find_id(token_content(cfg.value("eos_token", json())));
    unk = find_id(token_content(cfg.value("unk_token", json())));
    pad = find_id(token_content(cfg.value("pad_token", json())));
    if (cfg.contains("add_bos_token") && cfg["add_bos_token"].is_boolean()) add_bos = cfg["add_bos_token"].get<bool>();
    if (cfg.contains("add_eos_token") && cfg["add_eos_token"].is_boolean()) add_eos = cfg["add_eos_token"].get<bool>();
  }
  if (bos < 0) bos = find_id(tp_bos);
  if (eos < 0 && add_eos == 1) eos = find_id(tp_eos);
  if (unk < 0 && !byte_level) unk = find_id(unk_text);
  // llama.cpp's SpecialVocab order: the ids found in the tokenizer files (bos, eos, unk, pad), then the
  // ones only config.json gives ("<typ>_token_id": an integer at the top level, else in text_config).
  auto in_range = [&](int64_t id) { return id >= 0 && id < size; };
  std::vector<std::pair<const char*, int64_t>> ids = {{"tokenizer.ggml.bos_token_id", bos},
                                                       {"tokenizer.ggml.eos_token_id", eos},
                                                       {"tokenizer.ggml.unknown_token_id", unk},
                                                       {"tokenizer.ggml.padding_token_id", pad}};
  for (const auto& [key, id] : ids)
    if (in_range(id)) md.set(key, gguf::Value::u32((uint32_t)id));
  if (model_cfg.is_object()) {
    auto id_of = [&](const char* k) -> int64_t {
      const json& v = model_cfg.value(k, json());
      if (v.is_number_integer()) return v.get<int64_t>();
      if (v.is_null() && model_cfg.contains("text_config") && model_cfg["text_config"].is_object()) {
        const json& t = model_cfg["text_config"].value(k, json());
        if (t.is_number_integer()) return t.get<int64_t>();
      }
      return -1;
    };
    const char* names[] = {"bos_token_id", "eos_token_id", "unk_token_id", "pad_token_id"};
    for (size_t i = 0; i < ids.size(); ++i)
      if (!in_range(ids[i].second) && in_range(id_of(names[i]))) md.set(ids[i].first, gguf::Value::u32((uint32_t)id_of(names[i])));
  }
  if (add_bos >= 0) md.set("tokenizer.ggml.add_bos_token", gguf::Value::boolean(add_bos == 1));
  if (add_eos >= 0) md.set("tokenizer.ggml.add_eos_token", gguf::Value::boolean(add_eos == 1));
  if (!byte_level)
    md.set("tokenizer.ggml.add_space_prefix",
           gguf::Value::boolean(normalizer_prepends_space(tj.value("normalizer", json())) || metaspace_prefix));

  // Chat template: tokenizer_config.json's (a string, or a list of named templates), else chat_template.jinja.
  std::string tmpl;
  if (cfg.is_object() && cfg.contains("chat_template")) {
    const json& ct = cfg["chat_template"];
    if (ct.is_string()) {
      tmpl = ct.get<std::string>();
    } else if (ct.is_array()) {
      std::vector<std::string> names;
      for (const auto& t : ct) {
        const std::string name = t.value("name", ""), text = t.value("template", "");
        if (name == "default") tmpl = text;
        else if (!name.empty()) {
          md.set("tokenizer.chat_template." + name, gguf::Value::string(text));
          names.push_back(name);
        }
      }
      if (!names.empty()) md.set("tokenizer.chat_templates", gguf::Value::string_array(names));
    }
  }
  if (tmpl.empty()) {
    std::ifstream f(dir / "chat_template.jinja", std::ios::binary);
    if (f) {
      std::stringstream ss;
      ss << f.rdbuf();
      tmpl = ss.str();
    }
  }
  if (!tmpl.empty()) md.set("tokenizer.chat_template", gguf::Value::string(tmpl));
}

}  // namespace

void add_hf_tokenizer_metadata(gguf::Metadata& md, const std::string& tokenizer_json_path, int n_vocab,
                               const std::string& pre_override) {
  // The files are JSON (read_json says when not); a field of another kind than the format's (a number
  // where a token's text belongs, a list where an object does) is the file's fault, said in one line.
  try {
    add_metadata(md, tokenizer_json_path, n_vocab, pre_override);
  } catch (const json::exception& e) {
    fail("{}: not laid out as a Hugging Face tokenizer: {}", tokenizer_json_path, e.what());
  }
}

}  // namespace roofline
