// Reads llama2.c tokenizer files into GGUF tokenizer keys (tokens, scores, token types, BOS/EOS).
#include "tokenizer/llama2c_vocab.h"

#include <cstring>
#include <fstream>
#include <iterator>
#include <vector>

#include "core/error.h"

namespace roofline {

void add_llama2c_tokenizer_metadata(gguf::Metadata& md, const std::string& path, int n_vocab) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("{}: cannot open the llama2.c tokenizer", path);
  std::vector<char> data((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  size_t pos = 0;
  auto read = [&](void* dst, size_t n) {
    if (pos + n > data.size()) fail("{}: truncated llama2.c tokenizer at byte {}", path, pos);
    std::memcpy(dst, data.data() + pos, n);
    pos += n;
  };
  int32_t max_len = 0;
  read(&max_len, 4);
  if (max_len <= 0 || max_len > 4096) fail("{}: not a llama2.c tokenizer (max token length {})", path, max_len);
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<int32_t> types;
  while (pos < data.size() && (n_vocab <= 0 || (int)tokens.size() < n_vocab)) {
    float score = 0;
    int32_t len = 0;
    read(&score, 4);
    read(&len, 4);
    if (len < 0 || len > max_len) fail("{}: token {} has length {} (max {})", path, tokens.size(), len, max_len);
    std::string text;
    std::string raw(len, '\0');
    read(raw.data(), (size_t)len);
    const size_t id = tokens.size();
    int32_t type = 1;  // NORMAL
    if (raw.size() == 6 && raw.rfind("<0x", 0) == 0 && raw.back() == '>') {
      type = 6;  // BYTE
      text = raw;
    } else if (id <= 2 && (raw == "<unk>" || raw == "<s>" || raw == "</s>" || raw == "\n<s>\n" || raw == "\n</s>\n")) {
      // llama2.c's exporter writes BOS/EOS as "\n<s>\n" and "\n</s>\n".
      type = raw == "<unk>" ? 2 : 3;
      text = raw == "<unk>" ? "<unk>" : (raw.find("</s>") != std::string::npos ? "</s>" : "<s>");
    } else {
      for (char c : raw) {
        if (c == ' ') text += "\xE2\x96\x81";
        else text += c;
      }
    }
    tokens.push_back(std::move(text));
    scores.push_back(score);
    types.push_back(type);
  }
  if (n_vocab > 0 && (int)tokens.size() < n_vocab)
    fail("{}: has {} tokens, the model needs {}", path, tokens.size(), n_vocab);
  if (tokens.size() < 3) fail("{}: too few tokens ({})", path, tokens.size());
  md.set("tokenizer.ggml.model", gguf::Value::string("llama"));
  md.set("tokenizer.ggml.pre", gguf::Value::string("default"));
  md.set("tokenizer.ggml.tokens", gguf::Value::string_array(std::move(tokens)));
  md.set("tokenizer.ggml.scores", gguf::Value::f32_array(scores));
  md.set("tokenizer.ggml.token_type", gguf::Value::i32_array(types));
  md.set("tokenizer.ggml.bos_token_id", gguf::Value::u32(1));
  md.set("tokenizer.ggml.eos_token_id", gguf::Value::u32(2));
  md.set("tokenizer.ggml.unknown_token_id", gguf::Value::u32(0));
  md.set("tokenizer.ggml.add_bos_token", gguf::Value::boolean(true));
  md.set("tokenizer.ggml.add_eos_token", gguf::Value::boolean(false));
  md.set("tokenizer.ggml.add_space_prefix", gguf::Value::boolean(true));
}

}  // namespace roofline
