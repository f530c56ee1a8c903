// UTF-8 helpers for the tokenizers: decoding with replacement of invalid bytes, the GPT-2 byte <->
// printable-codepoint map of byte-level BPE, and NFC normalization (utf8proc) that leaves invalid
// UTF-8 bytes untouched.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace roofline::unicode {

// Length of the valid UTF-8 sequence starting at s[pos] (1..4), or 0 when it is invalid/truncated.
size_t valid_utf8_len(std::string_view s, size_t pos);
// Decodes the code point at s[pos]; invalid bytes decode to U+FFFD with length 1.
uint32_t decode_utf8(std::string_view s, size_t pos, size_t* len);
void append_utf8(std::string& out, uint32_t cp);
bool is_valid_utf8(std::string_view s);
// Replaces every invalid byte with U+FFFD.
std::string sanitize_utf8(std::string_view s);
// Length of the longest prefix of s that ends on a complete UTF-8 sequence, treating a truncated
// multi-byte sequence at the very end as incomplete (it is held back); invalid bytes count as complete.
size_t complete_utf8_prefix(std::string_view s);

// GPT-2 byte-level map: every byte maps to one printable code point (as UTF-8).
struct ByteLevelMap {
  std::array<std::string, 256> byte_to_utf8;
  std::array<int16_t, 324> cp_to_byte;  // code points used are < 324; -1 where unused
  ByteLevelMap();
  std::string encode(std::string_view bytes) const;
  // Decodes a byte-level token text back to bytes; false when a code point is outside the map.
  bool decode(std::string_view text, std::string& out) const;
};
const ByteLevelMap& byte_level_map();

// NFC normalization of valid UTF-8 runs; invalid bytes pass through unchanged.
std::string nfc(std::string_view s);

}  // namespace roofline::unicode
