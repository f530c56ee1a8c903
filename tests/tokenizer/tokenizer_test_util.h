// Test helpers of the tokenizer tests: the tokenizers of ../shared/testdata unpacked into a temp dir
// (tokenizer_config.json beside tokenizer.json), loaded once per process, and the golden files.
#pragma once

#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace roofline::test {

inline std::string read_text_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Path of a tokenizer by golden name: a tokenizer.json (with its config beside it), a GGUF vocab or
// tok512.bin. Empty when ../shared is absent.
inline std::string tokenizer_path(const std::string& name) {
  const std::string shared = shared_dir();
  if (shared.empty()) return "";
  const std::string td = shared + "/testdata/tokenizer/";
  if (name == "qwen3" || name == "llama3_1" || name == "gemma3") {
    const std::string tj = unxz_to_temp(td + name + "/tokenizer.json.xz");
    const std::filesystem::path dir = std::filesystem::path(tj).parent_path();
    const std::string cfg = td + name + "/tokenizer_config.json";
    const std::string cfg_src = std::filesystem::exists(cfg) ? cfg : unxz_to_temp(cfg + ".xz");
    std::filesystem::copy_file(cfg_src, dir / "tokenizer_config.json", std::filesystem::copy_options::skip_existing);
    return tj;
  }
  if (name == "tok512") return shared + "/testdata/models/stories260K/tok512.bin";
  return unxz_to_temp(td + "gguf-vocabs/ggml-vocab-" + name + ".gguf.xz");
}

inline std::shared_ptr<const Tokenizer> load_test_tokenizer(const std::string& name) {
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<const Tokenizer>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(name);
  if (it != cache.end()) return it->second;
  const std::string p = tokenizer_path(name);
  if (p.empty()) return nullptr;
  auto t = Tokenizer::from_file(p);
  cache[name] = t;
  return t;
}

inline nlohmann::json load_golden(const std::string& file) {
  return nlohmann::json::parse(read_text_file(source_dir() + "/tests/tokenizer/goldens/" + file));
}

// The clock strftime_now reads in the template goldens: scripts/goldens/gen_template_goldens.py's NOW,
// 2025-03-14 15:09:26 local time.
inline std::time_t golden_now() {
  std::tm tm{};
  tm.tm_year = 2025 - 1900;
  tm.tm_mon = 2;
  tm.tm_mday = 14;
  tm.tm_hour = 15;
  tm.tm_min = 9;
  tm.tm_sec = 26;
  tm.tm_isdst = -1;
  return std::mktime(&tm);
}

}  // namespace roofline::test
