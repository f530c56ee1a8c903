// libFuzzer target: tokenizer files as `convert`, `synth` and `tokenize` read them: a Hugging Face
// tokenizer.json (with a tokenizer_config.json beside it) or a llama2.c tokenizer .bin, each turned into
// GGUF tokenizer keys, optionally padded to a model's vocabulary size, then loaded and given text. A file
// may be refused (roofline::Error, which says what is wrong with it); one that loads must
// take any text (fuzz_tokenizer_common.h).
// Input: byte 0 (bit 0: llama2.c, else tokenizer.json; bits 1-2: pad to 0 / 300 / 70000 tokens), byte
// 1 the length L of the text to encode, L bytes of text, then the file: for tokenizer.json its text, a
// NUL, then tokenizer_config.json (absent when empty); for llama2.c the bytes of the .bin.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <string_view>

#include "core/error.h"
#include "formats/hf_tokenizer.h"
#include "tests/fuzz/libfuzzer/fuzz_tokenizer_common.h"
#include "tokenizer/llama2c_vocab.h"

using namespace roofline;

namespace {

std::string work_dir() {
  static const fuzz::TempDir dir("fuzz-tokenizer-files");
  return dir.path().string();
}

void write_file(const std::string& path, std::string_view bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), (std::streamsize)bytes.size());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const uint8_t mode = data[0];
  const size_t text_len = data[1];
  if (size < 2 + text_len) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data) + 2, text_len);
  const std::string_view file(reinterpret_cast<const char*>(data) + 2 + text_len, size - 2 - text_len);
  static const int kPad[] = {0, 300, 70000, 0};
  const int n_vocab = kPad[(mode >> 1) & 3];

  gguf::Metadata md;
  try {
    if (mode & 1) {
      const std::string path = work_dir() + "/tok.bin";
      write_file(path, file);
      add_llama2c_tokenizer_metadata(md, path, n_vocab);
    } else {
      auto [json_text, config_text] = fuzz::split_at_nul(file);
      const std::string path = work_dir() + "/tokenizer.json";
      const std::string config = work_dir() + "/tokenizer_config.json";
      write_file(path, json_text);
      if (config_text.empty()) std::filesystem::remove(config);
      else write_file(config, config_text);
      add_hf_tokenizer_metadata(md, path, n_vocab);
    }
  } catch (const Error&) {
    return 0;
  } catch (const std::exception& e) {
    fuzz::defect("reading the tokenizer file", e.what());
  }
  std::shared_ptr<const Tokenizer> tok;
  try {
    tok = Tokenizer::from_metadata(md);
  } catch (const Error&) {
    return 0;
  } catch (const std::exception& e) {
    fuzz::defect("Tokenizer::from_metadata", e.what());
  }
  fuzz::exercise_tokenizer(tok, text);
  return 0;
}
