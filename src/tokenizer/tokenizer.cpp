// Tokenizer loading (GGUF tokenizer.ggml.* keys), added/special token matching, and decoding.
// The merge algorithms themselves are in tokenizer_merge.cpp.
#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "formats/gguf.h"
#include "formats/hf_tokenizer.h"
#include "tokenizer/llama2c_vocab.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode.h"

namespace roofline {

void SpecialTrie::insert(std::string_view text, int32_t id) {
  if (text.empty()) return;
  int32_t node = 0;
  for (unsigned char c : text) {
    const uint64_t k = ((uint64_t)node << 8) | c;
    auto it = edges_.find(k);
    if (it == edges_.end()) {
      nodes_.push_back(Node{});
      it = edges_.emplace(k, (int32_t)nodes_.size() - 1).first;
    }
    node = it->second;
  }
  if (nodes_[node].id < 0) nodes_[node].id = id;  // first (lowest) id wins for duplicate texts
  if (!first_byte_[(unsigned char)text[0]]) {
    first_byte_[(unsigned char)text[0]] = true;
    ++first_byte_count_;
  }
}

size_t SpecialTrie::match(std::string_view text, size_t pos, int32_t* id) const {
  if (!first_byte_[(unsigned char)text[pos]]) return 0;
  int32_t node = 0;
  size_t best = 0;
  for (size_t i = pos; i < text.size(); ++i) {
    auto it = edges_.find(((uint64_t)node << 8) | (unsigned char)text[i]);
    if (it == edges_.end()) break;
    node = it->second;
    if (nodes_[node].id >= 0) {
      best = i + 1 - pos;
      *id = nodes_[node].id;
    }
  }
  return best;
}

Tokenizer::Tokenizer() : impl_(std::make_unique<Impl>()) {}
Tokenizer::~Tokenizer() = default;

std::shared_ptr<const Tokenizer> Tokenizer::from_metadata(const gguf::Metadata& md) {
  std::shared_ptr<Tokenizer> t(new Tokenizer());
  t->load(md);
  return t;
}

namespace {

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

int32_t optional_id(const gguf::Metadata& md, const char* key, int32_t n_vocab) {
  const gguf::Value* v = md.find(key);
  if (!v) return -1;
  const int64_t id = v->as_int(key);
  if (id < 0 || id >= n_vocab) return -1;  // llama.cpp treats out-of-range ids as absent
  return (int32_t)id;
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

int byte_token_value(std::string_view text) {
  if (text.size() != 6 || text.compare(0, 3, "<0x") != 0 || text[5] != '>') return -1;
  const int hi = hex_digit(text[3]), lo = hex_digit(text[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

std::shared_ptr<const Tokenizer> Tokenizer::from_file(const std::string& path) {
  gguf::Metadata md;
  if (ends_with(path, ".gguf")) {
    auto file = gguf::GgufFile::open(path);
    return from_metadata(file->metadata());
  }
  if (ends_with(path, ".json")) {
    add_hf_tokenizer_metadata(md, path);
    return from_metadata(md);
  }
  if (ends_with(path, ".bin")) {
    add_llama2c_tokenizer_metadata(md, path);
    return from_metadata(md);
  }
  fail("{}: unknown tokenizer file type (expected .gguf, tokenizer.json or a llama2.c tokenizer .bin)", path);
}

void Tokenizer::load(const gguf::Metadata& md) {
  model_ = md.get_string_or("tokenizer.ggml.model", "");
  if (model_.empty()) fail("the file has no tokenizer (tokenizer.ggml.model is missing)");
  const gguf::Value* tok_v = md.find("tokenizer.ggml.tokens");
  if (!tok_v) fail("tokenizer.ggml.tokens is missing");
  tokens_ = tok_v->as_string_array("tokenizer.ggml.tokens");
  const int32_t n = (int32_t)tokens_.size();
  if (n == 0) fail("tokenizer.ggml.tokens is empty");

  types_.assign(n, TokenType::Normal);
  if (const gguf::Value* v = md.find("tokenizer.ggml.token_type")) {
    auto ty = v->as_int_array("tokenizer.ggml.token_type");
    if ((int32_t)ty.size() != n) fail("tokenizer.ggml.token_type has {} entries for {} tokens", ty.size(), n);
    for (int32_t i = 0; i < n; ++i) {
      const int64_t t = ty[i];
      types_[i] = (t >= 0 && t <= 6) ? (TokenType)t : TokenType::Normal;
    }
  }
  scores_.assign(n, 0.0f);
  if (const gguf::Value* v = md.find("tokenizer.ggml.scores")) {
    auto sc = v->as_float_array("tokenizer.ggml.scores");
    if ((int32_t)sc.size() != n) fail("tokenizer.ggml.scores has {} entries for {} tokens", sc.size(), n);
    scores_ = std::move(sc);
  }

  Impl& im = *impl_;
  im.token_to_id.reserve(n * 2);
  for (int32_t i = 0; i < n; ++i) im.token_to_id.emplace(tokens_[i], i);

  const gguf::Value* merges_v = md.find("tokenizer.ggml.merges");
  if (model_ == "gpt2") {
    kind_ = VocabKind::ByteLevelBpe;
  } else if (model_ == "llama") {
    kind_ = (merges_v && merges_v->array_size() > 0) ? VocabKind::SpmBpe : VocabKind::Spm;
  } else {
    fail("tokenizer.ggml.model '{}' is not supported (supported: gpt2, llama)", model_);
  }

  if (kind_ == VocabKind::ByteLevelBpe) {
    pre_ = md.get_string_or("tokenizer.ggml.pre", "default");
    const PreTokenizerSpec* spec = find_pre_tokenizer(pre_);
    if (!spec) fail("tokenizer.ggml.pre '{}' is not supported (known: gpt2, llama-bpe, qwen2, qwen35, default)", pre_);
    im.pre = std::make_unique<PreTokenizer>(*spec);
    im.nfc = spec->nfc;
    im.ignore_merges = spec->ignore_merges;
  }

  // Ranked merges "a b" -> (rank, id of a+b).
  if (merges_v && kind_ != VocabKind::Spm) {
    const auto& merges = merges_v->as_string_array("tokenizer.ggml.merges");
    im.merges.reserve(merges.size() * 2);
    std::string joined;
    for (size_t r = 0; r < merges.size(); ++r) {
      const std::string& m = merges[r];
      // Split at the first space after position 0 whose halves are tokens (texts may hold spaces).
      bool done = false;
      for (size_t sp = m.find(' ', 1); sp != std::string::npos && !done; sp = m.find(' ', sp + 1)) {
        std::string_view a(m.data(), sp), b(m.data() + sp + 1, m.size() - sp - 1);
        const int32_t ia = im.find(a), ib = im.find(b);
        if (ia < 0 || ib < 0) continue;
        joined.assign(a);
        joined.append(b);
        const int32_t ij = im.find(joined);
        if (ij < 0) continue;
        im.merges.emplace(Impl::key(ia, ib), Merge{(int32_t)r, ij});  // first (best) rank wins
        done = true;
      }
    }
  }

  // Byte tokens.
  std::fill(std::begin(im.byte_tokens), std::end(im.byte_tokens), -1);
  const auto& blm = unicode::byte_level_map();
  for (int b = 0; b < 256; ++b) {
    if (kind_ == VocabKind::ByteLevelBpe) {
      im.byte_tokens[b] = im.find(blm.byte_to_utf8[b]);
    } else {
      im.byte_tokens[b] = im.find(fmt::format("<0x{:02X}>", b));
    }
  }

  bos_ = optional_id(md, "tokenizer.ggml.bos_token_id", n);
  eos_ = optional_id(md, "tokenizer.ggml.eos_token_id", n);
  eot_ = optional_id(md, "tokenizer.ggml.eot_token_id", n);
  eom_ = optional_id(md, "tokenizer.ggml.eom_token_id", n);
  pad_ = optional_id(md, "tokenizer.ggml.padding_token_id", n);
  unk_ = optional_id(md, "tokenizer.ggml.unknown_token_id", n);
  if (unk_ < 0 && kind_ != VocabKind::ByteLevelBpe) {
    for (int32_t i = 0; i < n; ++i)
      if (types_[i] == TokenType::Unknown) {
        unk_ = i;
        break;
      }
  }
  const bool spm = kind_ != VocabKind::ByteLevelBpe;
  add_bos_ = md.get_bool_or("tokenizer.ggml.add_bos_token", spm) && bos_ >= 0;
  add_eos_ = md.get_bool_or("tokenizer.ggml.add_eos_token", false) && eos_ >= 0;
  add_space_prefix_ = spm && md.get_bool_or("tokenizer.ggml.add_space_prefix", kind_ == VocabKind::Spm);

  // End-of-turn tokens by text, as llama.cpp finds them when the metadata does not name them.
  static const char* kEotTexts[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
                                    "<EOT>", "_<EOT>", "<｜end▁of▁sentence｜>", "<|end_of_text|>"};
  for (const char* t : kEotTexts) {
    const int32_t id = im.find(t);
    if (id < 0) continue;
    if (eot_ < 0 && std::strcmp(t, "<|endoftext|>") != 0 && std::strcmp(t, "<|end_of_text|>") != 0) eot_ = id;
    eog_.push_back(id);
  }
  if (eom_ < 0) eom_ = im.find("<|eom_id|>");
  for (int32_t id : {eos_, eot_, eom_})
    if (id >= 0) eog_.push_back(id);
  std::sort(eog_.begin(), eog_.end());
  eog_.erase(std::unique(eog_.begin(), eog_.end()), eog_.end());

  // lstrip/rstrip of added tokens: GGUF has no key; llama.cpp sets them for Phi-3 by model name.
  lstrip_.assign(n, 0);
  rstrip_.assign(n, 0);
  std::string name = md.get_string_or("general.name", "");
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return (char)std::tolower(c); });
  const bool phi3 = name.find("phi-3") != std::string::npos || name.find("phi3") != std::string::npos;

  for (int32_t i = 0; i < n; ++i) {
    const TokenType t = types_[i];
    if (t == TokenType::Control || t == TokenType::UserDefined || t == TokenType::Unknown) {
      im.specials_all.insert(tokens_[i], i);
      if (t == TokenType::UserDefined) im.specials_user.insert(tokens_[i], i);
      if (phi3 && t != TokenType::UserDefined) rstrip_[i] = 1;
    }
  }
  if (phi3) {
    for (const char* t : {"</s>"})
      if (int32_t id = im.find(t); id >= 0) rstrip_[id] = 1;
    for (const char* t : {"<unk>", "<s>", "<|endoftext|>"})
      if (int32_t id = im.find(t); id >= 0) rstrip_[id] = 0;
  }
}

const std::string& Tokenizer::token_text(int32_t id) const {
  if (id < 0 || id >= n_vocab()) fail("token id {} is out of range (vocabulary of {})", id, n_vocab());
  return tokens_[id];
}

TokenType Tokenizer::token_type(int32_t id) const {
  if (id < 0 || id >= n_vocab()) fail("token id {} is out of range (vocabulary of {})", id, n_vocab());
  return types_[id];
}

float Tokenizer::token_score(int32_t id) const {
  if (id < 0 || id >= n_vocab()) fail("token id {} is out of range (vocabulary of {})", id, n_vocab());
  return scores_[id];
}

int32_t Tokenizer::find_token(std::string_view text) const { return impl_->find(text); }

bool Tokenizer::is_eog(int32_t id) const { return std::binary_search(eog_.begin(), eog_.end(), id); }

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special, bool parse_special) const {
  std::vector<int32_t> out;
  if (add_special && add_bos_) out.push_back(bos_);
  const SpecialTrie& trie = parse_special ? impl_->specials_all : impl_->specials_user;
  bool after_special = true;  // the start of the text counts as "after a special token" (space prefix)
  size_t seg_start = 0, pos = 0;
  auto flush = [&](size_t end) {
    if (end > seg_start) encode_text(text.substr(seg_start, end - seg_start), after_special, out);
  };
  while (pos < text.size()) {
    int32_t id = -1;
    const size_t len = trie.empty() ? 0 : trie.match(text, pos, &id);
    if (!len) {
      ++pos;
      continue;
    }
    size_t end = pos;
    if (lstrip_[id])
      while (end > seg_start && std::strchr(" \t\n\r\f\v", text[end - 1]) && text[end - 1]) --end;
    flush(end);
    out.push_back(id);
    after_special = true;
    pos += len;
    if (rstrip_[id])
      while (pos < text.size() && text[pos] && std::strchr(" \t\n\r\f\v", text[pos])) ++pos;
    seg_start = pos;
  }
  flush(text.size());
  if (add_special && add_eos_) out.push_back(eos_);
  return out;
}

void Tokenizer::encode_text(std::string_view text, bool after_special, std::vector<int32_t>& out) const {
  const Impl& im = *impl_;
  if (kind_ == VocabKind::ByteLevelBpe) {
    std::string normalized;
    if (im.nfc) {
      normalized = unicode::nfc(text);
      text = normalized;
    }
    std::vector<std::string_view> words;
    im.pre->split(text, words);
    // Repeated words are common: cache their tokens for this call.
    std::unordered_map<std::string_view, std::pair<uint32_t, uint32_t>> cache;
    std::vector<int32_t> cached;
    for (std::string_view w : words) {
      auto it = cache.find(w);
      if (it != cache.end()) {
        out.insert(out.end(), cached.begin() + it->second.first, cached.begin() + it->second.second);
        continue;
      }
      const size_t before = out.size();
      encode_bpe_word(w, out);
      if (cache.size() < 100000) {
        const uint32_t start = (uint32_t)cached.size();
        cached.insert(cached.end(), out.begin() + before, out.end());
        cache.emplace(w, std::make_pair(start, (uint32_t)cached.size()));
      }
    }
    return;
  }
  // SentencePiece style: optional space prefix, spaces as U+2581.
  std::string s;
  s.reserve(text.size() + 8);
  if (add_space_prefix_ && after_special) s += "\xE2\x96\x81";
  for (char c : text) {
    if (c == ' ') s += "\xE2\x96\x81";
    else s += c;
  }
  if (kind_ == VocabKind::Spm) encode_spm(s, out);
  else encode_bpe_word(s, out);
}

std::string Tokenizer::token_to_piece(int32_t id, bool special) const {
  const std::string& text = token_text(id);
  const TokenType t = types_[id];
  switch (t) {
    case TokenType::Control:
    case TokenType::Unknown:
      return special ? text : std::string();
    case TokenType::UserDefined:
      if (kind_ == VocabKind::ByteLevelBpe) return text;  // stored as plain text
      break;                                              // SentencePiece: ▁ is a space here too
    case TokenType::Byte:
      if (const int b = byte_token_value(text); b >= 0) return std::string(1, (char)b);
      return text;
    default:
      break;
  }
  std::string out;
  if (kind_ == VocabKind::ByteLevelBpe) {
    unicode::byte_level_map().decode(text, out);
    return out;
  }
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text.compare(i, 3, "\xE2\x96\x81") == 0) {
      out += ' ';
      i += 2;
    } else {
      out += text[i];
    }
  }
  return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::string out;
  bool first = true;
  for (int32_t id : ids) {
    const TokenType t = token_type(id);
    if (skip_special && (t == TokenType::Control || t == TokenType::Unknown)) continue;
    std::string piece = token_to_piece(id, true);
    if (piece.empty()) continue;  // the leading space is the first text's, as in StreamDecoder
    if (first && add_space_prefix_ && piece[0] == ' ') piece.erase(0, 1);
    first = false;
    out += piece;
  }
  return out;
}

}  // namespace roofline
