// Pre-tokenizers of byte-level BPE vocabularies, by llama.cpp's `tokenizer.ggml.pre` name: a list of
// regexes (PCRE2, UTF + UCP + JIT) applied in turn, each splitting every piece into matches and the
// gaps between them (Hugging Face's Split with behavior "Isolated").
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace roofline {

struct PreTokenizerSpec {
  std::string name;                  // llama.cpp name, e.g. "qwen2"
  std::vector<std::string> regexes;  // in Hugging Face (Oniguruma) syntax
  bool nfc = false;                  // the HF tokenizer normalizes to NFC first
  bool ignore_merges = false;        // a word that is itself a token is not merged (Llama 3)
};

// The known pre-tokenizers; nullptr when `name` is unknown.
const PreTokenizerSpec* find_pre_tokenizer(std::string_view name);
// The name whose regex list equals `regexes` (as Hugging Face's tokenizer.json writes them), or "".
std::string pre_tokenizer_name_for(const std::vector<std::string>& regexes);

class PreTokenizer {
 public:
  explicit PreTokenizer(const PreTokenizerSpec& spec);
  ~PreTokenizer();
  PreTokenizer(const PreTokenizer&) = delete;
  PreTokenizer& operator=(const PreTokenizer&) = delete;

  const PreTokenizerSpec& spec() const { return spec_; }
  // Splits `text` into pieces (string_views into `text`), appended to `out`. Thread-safe.
  void split(std::string_view text, std::vector<std::string_view>& out) const;

 private:
  struct Compiled;
  PreTokenizerSpec spec_;
  std::vector<std::unique_ptr<Compiled>> compiled_;
};

}  // namespace roofline
