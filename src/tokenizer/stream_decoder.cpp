// Streaming detokenizer: holds back an incomplete UTF-8 sequence at the end of the output.
#include "tokenizer/stream_decoder.h"

#include "tokenizer/unicode.h"

namespace roofline {

StreamDecoder::StreamDecoder(std::shared_ptr<const Tokenizer> tokenizer, bool special, bool strip_leading_space)
    : tok_(std::move(tokenizer)), special_(special), strip_leading_space_(strip_leading_space) {}

std::string StreamDecoder::push(int32_t id) {
  std::string piece = tok_->token_to_piece(id, special_);
  if (first_ && !piece.empty()) {
    if (strip_leading_space_ && tok_->add_space_prefix() && piece[0] == ' ') piece.erase(0, 1);
    first_ = false;
  }
  return push_bytes(piece);
}

std::string StreamDecoder::push_bytes(const std::string& bytes) {
  pending_ += bytes;
  const size_t n = unicode::complete_utf8_prefix(pending_);
  std::string out = unicode::sanitize_utf8(std::string_view(pending_).substr(0, n));
  pending_.erase(0, n);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out = unicode::sanitize_utf8(pending_);
  pending_.clear();
  first_ = true;
  return out;
}

}  // namespace roofline
