// Text <-> token ids for every vocabulary roofline loads: byte-level BPE (GGUF model "gpt2"),
// SentencePiece by scores (model "llama" without merges: Llama 2, llama2.c), and SentencePiece-style
// BPE with merges and byte fallback (model "llama" with merges: Gemma 3 from tokenizer.json).
// Loaded from GGUF tokenizer.ggml.* metadata; tokenizer.json and llama2.c tok.bin go through the same keys.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "formats/gguf_metadata.h"

namespace roofline {

// GGUF token types (llama.h's llama_token_type).
enum class TokenType : int32_t { Undefined = 0, Normal = 1, Unknown = 2, Control = 3, UserDefined = 4, Unused = 5, Byte = 6 };

enum class VocabKind {
  ByteLevelBpe,  // tokenizer.ggml.model = gpt2
  Spm,           // llama, merged by scores (sentencepiece)
  SpmBpe,        // llama with tokenizer.ggml.merges: ranked merges over ▁-text, byte fallback
};

class PreTokenizer;

// The byte of a byte token's text "<0xHH>", or -1 when the text is not of that form (a file may type
// any token as a byte token; such a token then stands for its text).
int byte_token_value(std::string_view text);

class Tokenizer {
 public:
  // From GGUF metadata; throws Error on missing/inconsistent keys or an unknown model/pre name.
  static std::shared_ptr<const Tokenizer> from_metadata(const gguf::Metadata& md);
  // From a file: *.gguf (vocab or model), tokenizer.json (+ tokenizer_config.json beside it), or a
  // llama2.c tokenizer (*.bin).
  static std::shared_ptr<const Tokenizer> from_file(const std::string& path);

  ~Tokenizer();

  // Tokenizes `text`. add_special adds BOS/EOS as the metadata says; parse_special turns the text of
  // control tokens into those tokens (user-defined/added tokens are always matched).
  std::vector<int32_t> encode(std::string_view text, bool add_special = false, bool parse_special = true) const;
  // The bytes a token stands for. Control tokens give their text when `special`, else "".
  std::string token_to_piece(int32_t id, bool special = true) const;
  // Concatenated pieces; drops the leading space SentencePiece adds, like Hugging Face's decoders.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const;

  VocabKind kind() const { return kind_; }
  const std::string& model_name() const { return model_; }  // tokenizer.ggml.model
  const std::string& pre_name() const { return pre_; }      // tokenizer.ggml.pre ("" for SPM)
  int32_t n_vocab() const { return (int32_t)tokens_.size(); }
  const std::string& token_text(int32_t id) const;
  TokenType token_type(int32_t id) const;
  float token_score(int32_t id) const;
  int32_t find_token(std::string_view text) const;  // -1 when absent

  int32_t bos() const { return bos_; }  // -1 when the vocabulary has none
  int32_t eos() const { return eos_; }
  int32_t eot() const { return eot_; }
  int32_t eom() const { return eom_; }
  int32_t pad() const { return pad_; }
  int32_t unk() const { return unk_; }
  bool add_bos() const { return add_bos_; }
  bool add_eos() const { return add_eos_; }
  bool add_space_prefix() const { return add_space_prefix_; }
  // End of generation: eos, eot, eom and the known end-of-turn tokens of the vocabulary.
  bool is_eog(int32_t id) const;
  const std::vector<int32_t>& eog_ids() const { return eog_; }
  // Text of a special token for templates ("" when id < 0).
  std::string special_text(int32_t id) const { return id >= 0 ? token_text(id) : std::string(); }

  struct Impl;  // lookup tables (tokenizer_impl.h), internal

 private:
  Tokenizer();
  void load(const gguf::Metadata& md);
  void encode_text(std::string_view text, bool after_special, std::vector<int32_t>& out) const;
  void encode_bpe_word(std::string_view word, std::vector<int32_t>& out) const;
  void encode_spm(std::string_view text, std::vector<int32_t>& out) const;

  VocabKind kind_ = VocabKind::ByteLevelBpe;
  std::string model_, pre_;
  std::vector<std::string> tokens_;
  std::vector<TokenType> types_;
  std::vector<float> scores_;
  std::vector<uint8_t> lstrip_, rstrip_;
  int32_t bos_ = -1, eos_ = -1, eot_ = -1, eom_ = -1, pad_ = -1, unk_ = -1;
  bool add_bos_ = false, add_eos_ = false, add_space_prefix_ = false;
  std::vector<int32_t> eog_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace roofline
