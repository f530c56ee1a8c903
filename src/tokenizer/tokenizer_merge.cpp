// The merge loops: ranked BPE merges over one pre-tokenized word (byte-level BPE and the
// SentencePiece-style BPE of Gemma), and SentencePiece's score-ordered bigram merging with byte fallback.
#include <algorithm>
#include <queue>
#include <string>
#include <unordered_map>

#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode.h"

namespace roofline {
namespace {

struct Symbol {
  int32_t id;
  int32_t prev, next;
  bool alive;
};

// Merges adjacent symbols by rank (lowest first, leftmost on ties) until no ranked pair remains.
void merge_ranked(const Tokenizer::Impl& im, std::vector<Symbol>& sym) {
  const int n = (int)sym.size();
  if (n < 2) return;
  if (n <= 24) {
    // Short words: rescan for the best pair each round (cheaper than a heap).
    std::vector<int32_t> ids(n);
    for (int i = 0; i < n; ++i) ids[i] = sym[i].id;
    int len = n;
    while (len > 1) {
      int best = -1;
      Merge bm{INT32_MAX, -1};
      for (int i = 0; i + 1 < len; ++i) {
        const Merge* m = im.find_merge(ids[i], ids[i + 1]);
        if (m && m->rank < bm.rank) {
          bm = *m;
          best = i;
        }
      }
      if (best < 0) break;
      ids[best] = bm.result;
      std::copy(ids.begin() + best + 2, ids.begin() + len, ids.begin() + best + 1);
      --len;
    }
    sym.resize(len);
    for (int i = 0; i < len; ++i) sym[i] = Symbol{ids[i], i - 1, i + 1 < len ? i + 1 : -1, true};
    return;
  }
  struct Item {
    int32_t rank, pos;
    bool operator<(const Item& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Item> q;
  for (int i = 0; i + 1 < n; ++i)
    if (const Merge* m = im.find_merge(sym[i].id, sym[i + 1].id)) q.push({m->rank, i});
  while (!q.empty()) {
    const Item top = q.top();
    q.pop();
    Symbol& l = sym[top.pos];
    if (!l.alive || l.next < 0) continue;
    Symbol& r = sym[l.next];
    const Merge* m = im.find_merge(l.id, r.id);
    if (!m || m->rank != top.rank) continue;  // stale entry
    l.id = m->result;
    r.alive = false;
    l.next = r.next;
    if (r.next >= 0) sym[r.next].prev = top.pos;
    if (l.prev >= 0)
      if (const Merge* pm = im.find_merge(sym[l.prev].id, l.id)) q.push({pm->rank, l.prev});
    if (l.next >= 0)
      if (const Merge* nm = im.find_merge(l.id, sym[l.next].id)) q.push({nm->rank, top.pos});
  }
  std::vector<Symbol> out;
  for (int i = 0; i >= 0 && i < n; i = sym[i].next) out.push_back(sym[i]);
  sym.swap(out);
}

}  // namespace

void Tokenizer::encode_bpe_word(std::string_view word, std::vector<int32_t>& out) const {
  const Impl& im = *impl_;
  std::vector<Symbol> sym;
  sym.reserve(word.size());
  auto push = [&](int32_t id) { sym.push_back(Symbol{id, (int32_t)sym.size() - 1, -1, true}); };
  if (kind_ == VocabKind::ByteLevelBpe) {
    if (im.ignore_merges) {
      const std::string enc = unicode::byte_level_map().encode(word);
      if (const int32_t id = im.find(enc); id >= 0) {
        out.push_back(id);
        return;
      }
    }
    for (unsigned char c : word) {
      const int32_t id = im.byte_tokens[c];
      if (id >= 0) push(id);
      else if (unk_ >= 0) push(unk_);
    }
  } else {
    // Characters, with byte fallback for characters outside the vocabulary; unknowns are fused.
    bool last_unk = false;
    for (size_t i = 0; i < word.size();) {
      const size_t l = unicode::valid_utf8_len(word, i);
      const size_t len = l ? l : 1;
      const int32_t id = l ? im.find(word.substr(i, len)) : -1;
      if (id >= 0) {
        push(id);
        last_unk = false;
      } else {
        bool all_bytes = true;
        for (size_t k = 0; k < len; ++k) all_bytes &= im.byte_tokens[(unsigned char)word[i + k]] >= 0;
        if (all_bytes) {
          for (size_t k = 0; k < len; ++k) push(im.byte_tokens[(unsigned char)word[i + k]]);
          last_unk = false;
        } else if (unk_ >= 0 && !last_unk) {
          push(unk_);
          last_unk = true;
        }
      }
      i += len;
    }
  }
  for (size_t i = 0; i + 1 < sym.size(); ++i) sym[i].next = (int32_t)i + 1;
  merge_ranked(im, sym);
  for (const Symbol& s : sym) out.push_back(s.id);
}

void Tokenizer::encode_spm(std::string_view text, std::vector<int32_t>& out) const {
  const Impl& im = *impl_;
  struct Sym {
    int32_t prev, next;
    size_t start, n;
  };
  std::vector<Sym> sym;
  for (size_t i = 0; i < text.size();) {
    const size_t l = unicode::valid_utf8_len(text, i);
    const size_t len = l ? l : 1;
    sym.push_back(Sym{(int32_t)sym.size() - 1, -1, i, len});
    i += len;
  }
  for (size_t i = 0; i + 1 < sym.size(); ++i) sym[i].next = (int32_t)i + 1;
  struct Bigram {
    int32_t left, right;
    float score;
    size_t size;
    bool operator<(const Bigram& o) const { return score < o.score || (score == o.score && left > o.left); }
  };
  std::priority_queue<Bigram> q;
  auto try_add = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const std::string_view s = text.substr(sym[left].start, sym[left].n + sym[right].n);
    const int32_t id = im.find(s);
    if (id < 0) return;
    q.push(Bigram{left, right, scores_[id], s.size()});
  };
  for (size_t i = 1; i < sym.size(); ++i) try_add((int32_t)i - 1, (int32_t)i);
  while (!q.empty()) {
    const Bigram b = q.top();
    q.pop();
    Sym& l = sym[b.left];
    Sym& r = sym[b.right];
    if (l.n == 0 || r.n == 0 || l.n + r.n != b.size) continue;
    l.n += r.n;
    r.n = 0;
    l.next = r.next;
    if (r.next >= 0) sym[r.next].prev = b.left;
    try_add(l.prev, b.left);
    try_add(b.left, l.next);
  }
  // Every final symbol is a token (merges only make tokens) or a single character: bytes then.
  for (int32_t i = sym.empty() ? -1 : 0; i >= 0; i = sym[i].next) {
    const std::string_view s = text.substr(sym[i].start, sym[i].n);
    if (const int32_t id = im.find(s); id >= 0) {
      out.push_back(id);
      continue;
    }
    for (unsigned char c : s) {
      const int32_t id = im.byte_tokens[c];
      if (id >= 0) out.push_back(id);
      else if (unk_ >= 0) out.push_back(unk_);
    }
  }
}

}  // namespace roofline
