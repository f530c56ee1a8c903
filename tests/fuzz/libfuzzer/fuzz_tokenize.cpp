// libFuzzer target: any text (a prompt, a message, a stop string) through the real tokenizers of
// ../shared/testdata, unpacked by scripts/fuzz.sh into $ROOFLINE_FUZZ_TOKENIZERS: Qwen3, Llama 3.1 and
// Gemma 3 from tokenizer.json, GPT-2, Llama 2 and Phi-3 GGUF vocabularies, llama2.c's tok512.bin. The
// first byte picks the tokenizer. Beyond fuzz_tokenizer_common.h's checks, the decode of the encoding
// is the text again where the tokenizer keeps every byte: byte-level BPE without a normalizer for any
// bytes, Qwen's (NFC) for valid UTF-8 as its NFC form, the SentencePiece ones (byte fallback) for valid
// UTF-8 without U+2581 (which decodes to a space) whose encoding has no added token: as in Hugging Face,
// the text after one gets the space prefix again, and Phi-3 strips the spaces after some of them.
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "tests/fuzz/libfuzzer/fuzz_tokenizer_common.h"

using namespace roofline;

namespace {

struct Loaded {
  std::string name;
  std::shared_ptr<const Tokenizer> tok;
};

const std::vector<Loaded>& tokenizers() {
  static const std::vector<Loaded> all = [] {
    const char* dir = std::getenv("ROOFLINE_FUZZ_TOKENIZERS");
    if (!dir) fuzz::defect("setup", "ROOFLINE_FUZZ_TOKENIZERS is not set (scripts/fuzz.sh sets it)");
    std::vector<Loaded> out;
    for (const char* name : {"qwen3/tokenizer.json", "llama3_1/tokenizer.json", "gemma3/tokenizer.json",
                             "ggml-vocab-gpt-2.gguf", "ggml-vocab-llama-spm.gguf", "ggml-vocab-phi-3.gguf", "tok512.bin"}) {
      const std::string path = std::string(dir) + "/" + name;
      if (!std::filesystem::exists(path)) fuzz::defect("setup", ("missing " + path).c_str());
      out.push_back({name, Tokenizer::from_file(path)});
    }
    return out;
  }();
  return all;
}

bool keeps_every_byte(const Tokenizer& tok) {
  return tok.kind() == VocabKind::ByteLevelBpe && tok.pre_name() != "qwen2";
}

bool has_added_token(const Tokenizer& tok, const std::vector<int32_t>& ids) {
  for (int32_t id : ids) {
    const TokenType t = tok.token_type(id);
    if (t != TokenType::Normal && t != TokenType::Byte) return true;
  }
  return false;
}

}  // namespace

// Under libFuzzer the tokenizers load before the first input, so their loading (seconds under the
// sanitizers) is not counted against that input's -timeout. The replay binary renames the entry point
// (LLVMFuzzerTestOneInput is then a macro) and loads them at the first call instead.
#ifndef LLVMFuzzerTestOneInput
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tokenizers();
  return 0;
}
#endif

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const auto& all = tokenizers();
  const Loaded& t = all[data[0] % all.size()];
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  const std::vector<int32_t> ids = fuzz::exercise_tokenizer(t.tok, text);
  const std::string back = t.tok->decode(ids);
  const bool valid = unicode::is_valid_utf8(text);
  std::string want;
  bool check = false;
  if (keeps_every_byte(*t.tok)) {
    want = text;
    check = true;
  } else if (t.tok->kind() == VocabKind::ByteLevelBpe && valid) {
    want = unicode::nfc(text);
    check = true;
  } else if (t.tok->kind() != VocabKind::ByteLevelBpe && valid && text.find("\xE2\x96\x81") == std::string::npos &&
             !has_added_token(*t.tok, ids)) {
    want = text;
    check = true;
  }
  if (check && back != want) {
    std::fprintf(stderr, "%s: decode(encode(text)) is not the text\n", t.name.c_str());
    fuzz::defect("round trip", t.name.c_str());
  }
  return 0;
}
