// Streaming detokenization: token pieces are appended as they are generated and only complete UTF-8
// comes out, so a character split across byte tokens (emoji, CJK with byte fallback) is held back
// until its last byte arrives. Invalid bytes come out as U+FFFD.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "tokenizer/tokenizer.h"

namespace roofline {

class StreamDecoder {
 public:
  // special: control tokens print their text; strip_leading_space: drop the space SentencePiece
  // vocabularies put before the first word (when the tokenizer adds a space prefix).
  explicit StreamDecoder(std::shared_ptr<const Tokenizer> tokenizer, bool special = false, bool strip_leading_space = false);

  // Adds a token; returns the text that became complete (possibly empty).
  std::string push(int32_t id);
  // Adds raw bytes (e.g. a piece already looked up).
  std::string push_bytes(const std::string& bytes);
  // Returns what is still held back (an incomplete sequence becomes U+FFFD) and resets.
  std::string flush();
  size_t pending_bytes() const { return pending_.size(); }

 private:
  std::shared_ptr<const Tokenizer> tok_;
  bool special_, strip_leading_space_, first_ = true;
  std::string pending_;
};

}  // namespace roofline
