// libFuzzer target: a GGUF file's tokenizer.ggml.* keys as a model file may carry them (vocabulary,
// token types, scores, merges, special ids, flags), built from the input, then text through the
// tokenizer they make. Loading may refuse the vocabulary (roofline::Error: one line for the user);
// a vocabulary it accepts must then take any text (fuzz_tokenizer_common.h), and token_to_piece must
// take every id of it.
// Input: byte 0 flags (bits 0-1 model gpt2 / llama / llama with merges / bert, bit 2 add_bos key, bit 3
// add_eos, bit 4 add_space_prefix, bit 5 a Phi-3 name, bit 6 token types, bit 7 scores); byte 1 the pre
// name; bytes 2-5 bos/eos/eot/unk ids (signed, 0x80 = key absent); then NUL-separated: tokens ('\n'
// between), merges ('\n' between), one type byte a token (its score is the byte, signed, / 4), and the
// text to encode.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "formats/gguf_metadata.h"
#include "tests/fuzz/libfuzzer/fuzz_tokenizer_common.h"

using namespace roofline;

namespace {

std::vector<std::string> split_lines(std::string_view s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    const size_t nl = s.find('\n', start);
    const size_t end = nl == std::string_view::npos ? s.size() : nl;
    out.emplace_back(s.substr(start, end - start));
    if (nl == std::string_view::npos) break;
    start = nl + 1;
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 6) return 0;
  const uint8_t flags = data[0];
  std::string_view rest(reinterpret_cast<const char*>(data) + 6, size - 6);
  auto [tokens_text, after_tokens] = fuzz::split_at_nul(rest);
  auto [merges_text, after_merges] = fuzz::split_at_nul(after_tokens);
  auto [types_text, text] = fuzz::split_at_nul(after_merges);

  gguf::Metadata md;
  static const char* kModels[] = {"gpt2", "llama", "llama", "bert"};
  md.set("tokenizer.ggml.model", gguf::Value::string(kModels[flags & 3]));
  static const char* kPre[] = {"gpt2", "llama-bpe", "qwen2", "qwen35", "default", "unknown-pre"};
  md.set("tokenizer.ggml.pre", gguf::Value::string(kPre[data[1] % 6]));
  const std::vector<std::string> tokens = split_lines(tokens_text);
  if (tokens.size() > 4096) return 0;
  md.set("tokenizer.ggml.tokens", gguf::Value::string_array(tokens));
  if ((flags & 3) == 2) md.set("tokenizer.ggml.merges", gguf::Value::string_array(split_lines(merges_text)));
  if (flags & 0x40) {
    std::vector<int32_t> types(tokens.size(), 1);
    for (size_t i = 0; i < types.size() && i < types_text.size(); ++i) types[i] = (uint8_t)types_text[i] % 8;
    md.set("tokenizer.ggml.token_type", gguf::Value::i32_array(types));
  }
  if (flags & 0x80) {
    std::vector<float> scores(tokens.size(), 0.0f);
    for (size_t i = 0; i < scores.size(); ++i)
      scores[i] = i < types_text.size() ? (int8_t)types_text[i] / 4.0f : -(float)i;
    md.set("tokenizer.ggml.scores", gguf::Value::f32_array(scores));
  }
  static const char* kIds[] = {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                               "tokenizer.ggml.eot_token_id", "tokenizer.ggml.unknown_token_id"};
  for (int i = 0; i < 4; ++i)
    if (data[2 + i] != 0x80) md.set(kIds[i], gguf::Value::i32((int8_t)data[2 + i]));
  if (flags & 4) md.set("tokenizer.ggml.add_bos_token", gguf::Value::boolean(true));
  md.set("tokenizer.ggml.add_eos_token", gguf::Value::boolean((flags & 8) != 0));
  md.set("tokenizer.ggml.add_space_prefix", gguf::Value::boolean((flags & 16) != 0));
  if (flags & 32) md.set("general.name", gguf::Value::string("Phi-3 mini"));

  std::shared_ptr<const Tokenizer> tok;
  try {
    tok = Tokenizer::from_metadata(md);
  } catch (const Error&) {
    return 0;  // refused with a message: fine
  } catch (const std::exception& e) {
    fuzz::defect("Tokenizer::from_metadata", e.what());
  }
  try {
    for (int32_t id = 0; id < tok->n_vocab(); ++id) {
      (void)tok->token_to_piece(id, true);
      (void)tok->token_to_piece(id, false);
    }
  } catch (const std::exception& e) {
    fuzz::defect("token_to_piece", e.what());
  }
  fuzz::exercise_tokenizer(tok, text);
  return 0;
}
