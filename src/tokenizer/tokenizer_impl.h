// Internal state of Tokenizer shared by its source files: token lookup, ranked merges, the trie of
// added/special tokens and the pre-tokenizer. Not part of the public interface.
#pragma once

#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"

namespace roofline {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};

struct Merge {
  int32_t rank;
  int32_t result;
};

// Byte trie over the texts of added/special tokens (leftmost-longest matching).
class SpecialTrie {
 public:
  void insert(std::string_view text, int32_t id);
  // Longest token whose text starts at text[pos]; returns its length (0 = none) and id.
  size_t match(std::string_view text, size_t pos, int32_t* id) const;
  bool empty() const { return first_byte_count_ == 0; }

 private:
  struct Node {
    int32_t id = -1;
  };
  std::vector<Node> nodes_{Node{}};
  std::unordered_map<uint64_t, int32_t> edges_;  // (node << 8 | byte) -> child
  bool first_byte_[256] = {};
  int first_byte_count_ = 0;
};

struct Tokenizer::Impl {
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> token_to_id;
  std::unordered_map<uint64_t, Merge> merges;  // (left << 32 | right) -> rank, merged id
  int32_t byte_tokens[256];                     // id of each byte's token (byte-level char or <0xXX>), -1 if none
  SpecialTrie specials_all;                     // control + user-defined (+ unknown)
  SpecialTrie specials_user;                    // user-defined only (parse_special = false)
  std::unique_ptr<PreTokenizer> pre;
  bool nfc = false;
  bool ignore_merges = false;

  static uint64_t key(int32_t a, int32_t b) { return ((uint64_t)(uint32_t)a << 32) | (uint32_t)b; }
  const Merge* find_merge(int32_t a, int32_t b) const {
    auto it = merges.find(key(a, b));
    return it == merges.end() ? nullptr : &it->second;
  }
  int32_t find(std::string_view s) const {
    auto it = token_to_id.find(s);
    return it == token_to_id.end() ? -1 : it->second;
  }
};

}  // namespace roofline
