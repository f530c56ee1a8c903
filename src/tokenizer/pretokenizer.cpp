// Pre-tokenizer regexes (from the Hugging Face tokenizer.json files and llama.cpp's table) compiled
// with PCRE2. Oniguruma's \s (Unicode White_Space) differs from PCRE2's UCP \s by U+0085, so \s and
// \S are rewritten to explicit classes before compiling.
#include "tokenizer/pretokenizer.h"

#include <pcre2.h>

#include "core/error.h"

namespace roofline {
namespace {

const std::vector<PreTokenizerSpec>& specs() {
  static const std::vector<PreTokenizerSpec> table = {
      {"gpt2", {R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)"}, false, false},
      {"llama-bpe",
       {R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"},
       false, true},
      {"qwen2",
       {R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"},
       true, false},
      // Qwen3.5: qwen2's, with combining marks (\p{M}) inside letter runs and out of the punctuation run
      // (llama.cpp's LLAMA_VOCAB_PRE_TYPE_QWEN35; the regex of Qwen3.5's tokenizer.json).
      {"qwen35",
       {R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"},
       true, false},
      // llama.cpp's fallback for vocabularies without a known pre-tokenizer.
      {"default",
       {R"([\p{P}\$\+<=>\^~\|]+)", R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))",
        R"(\p{N}+)", R"([0-9][0-9][0-9])"},
       false, false},
  };
  return table;
}

// Oniguruma's \s: Unicode White_Space. Inside a class the brackets are dropped.
constexpr const char* kSpaceClassBody = R"(\t\n\x{0B}\f\r\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";

std::string to_pcre2(const std::string& re) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < re.size(); ++i) {
    const char c = re[i];
    if (c == '\\' && i + 1 < re.size()) {
      const char n = re[i + 1];
      if (n == 's') {
        out += in_class ? std::string(kSpaceClassBody) : "[" + std::string(kSpaceClassBody) + "]";
      } else if (n == 'S') {
        if (in_class) fail("pre-tokenizer regex uses \\S inside a character class: {}", re);
        out += "[^" + std::string(kSpaceClassBody) + "]";
      } else {
        out += c;
        out += n;
      }
      ++i;
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = true;
      out += c;
      if (i + 1 < re.size() && re[i + 1] == '^') out += re[++i];
      if (i + 1 < re.size() && re[i + 1] == ']') out += re[++i];  // literal ] first in class
      continue;
    }
    if (c == ']' && in_class) in_class = false;
    out += c;
  }
  return out;
}

}  // namespace

const PreTokenizerSpec* find_pre_tokenizer(std::string_view name) {
  // Other spellings llama.cpp accepts for the same pre-tokenizers.
  static const std::pair<std::string_view, std::string_view> aliases[] = {
      {"gpt-2", "gpt2"}, {"phi-2", "gpt2"}, {"llama3", "llama-bpe"}, {"llama-v3", "llama-bpe"},
      {"deepseek-r1-qwen", "qwen2"}};
  for (const auto& [alias, target] : aliases)
    if (name == alias) name = target;
  for (const auto& s : specs())
    if (s.name == name) return &s;
  return nullptr;
}

std::string pre_tokenizer_name_for(const std::vector<std::string>& regexes) {
  for (const auto& s : specs())
    if (s.regexes == regexes) return s.name;
  return "";
}

struct PreTokenizer::Compiled {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Compiled() {
    if (code) pcre2_code_free(code);
  }
};

PreTokenizer::PreTokenizer(const PreTokenizerSpec& spec) : spec_(spec) {
  for (const auto& re : spec_.regexes) {
    const std::string pattern = to_pcre2(re);
    int err = 0;
    PCRE2_SIZE err_off = 0;
    auto c = std::make_unique<Compiled>();
    c->code = pcre2_compile((PCRE2_SPTR)pattern.data(), pattern.size(), PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF,
                            &err, &err_off, nullptr);
    if (!c->code) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      fail("pre-tokenizer '{}': regex does not compile at offset {}: {}", spec_.name, (size_t)err_off, (const char*)msg);
    }
    c->jit = pcre2_jit_compile(c->code, PCRE2_JIT_COMPLETE) == 0;
    compiled_.push_back(std::move(c));
  }
}

PreTokenizer::~PreTokenizer() = default;

void PreTokenizer::split(std::string_view text, std::vector<std::string_view>& out) const {
  std::vector<std::string_view> cur{text}, next;
  for (const auto& c : compiled_) {
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(c->code, nullptr);
    if (!md) fail("out of memory in the pre-tokenizer");
    next.clear();
    for (std::string_view piece : cur) {
      size_t pos = 0, gap_start = 0;
      while (pos < piece.size()) {
        const int rc = c->jit ? pcre2_jit_match(c->code, (PCRE2_SPTR)piece.data(), piece.size(), pos, 0, md, nullptr)
                              : pcre2_match(c->code, (PCRE2_SPTR)piece.data(), piece.size(), pos, 0, md, nullptr);
        if (rc < 0) break;  // no further match (or a match error): the rest is one gap
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (me <= ms) {  // empty match: step over one byte
          pos = ms + 1;
          continue;
        }
        if (ms > gap_start) next.push_back(piece.substr(gap_start, ms - gap_start));
        next.push_back(piece.substr(ms, me - ms));
        pos = gap_start = me;
      }
      if (gap_start < piece.size()) next.push_back(piece.substr(gap_start));
    }
    pcre2_match_data_free(md);
    cur.swap(next);
  }
  out.insert(out.end(), cur.begin(), cur.end());
}

}  // namespace roofline
