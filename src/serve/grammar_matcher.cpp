// The byte-level grammar automaton, its cached transitions, and the vocabulary trie walk behind
// token masks (see grammar_matcher.h for the design).
#include "serve/grammar_matcher.h"

#include <functional>

#include <algorithm>
#include <cstring>
#include <limits>

#include "core/error.h"

namespace roofline::serve {

namespace {
// The code points a UTF-8 sequence of this length may encode (shorter forms are overlong, invalid).
constexpr uint32_t kMinForLength[5] = {0, 0, 0x80, 0x800, 0x10000};
constexpr uint32_t kMaxForLength[5] = {0, 0x7F, 0x7FF, 0xFFFF, 0x10FFFF};
bool is_surrogate(uint32_t cp) { return cp >= 0xD800 && cp <= 0xDFFF; }
constexpr size_t kMaxStates = 1 << 14;  // past this (16 MiB of transitions) matchers move to a fresh automaton
constexpr size_t kMaxMasks = 256;        // 19 KiB each at a 151k vocabulary
// The heap bytes of an entry of a map from such a string key to a state id (the key beyond its inline buffer, the
// node's pair, link and cached hash).
size_t key_entry_bytes(const std::string& key) {
  return (key.capacity() > 15 ? key.capacity() + 1 : 0) + sizeof(std::string) + sizeof(int32_t) + 2 * sizeof(void*);
}
}  // namespace

TokenVocab::TokenVocab(const std::vector<std::string>& pieces, const std::vector<bool>& is_eog) : pieces_(pieces), eog_(is_eog) {
  if (eog_.size() != pieces_.size()) fail("token vocabulary: {} pieces but {} end-of-generation flags", pieces_.size(), eog_.size());
  for (size_t t = 0; t < pieces_.size(); ++t) {
    if (eog_[t]) eog_list_.push_back((int32_t)t);
    else if (!pieces_[t].empty()) sorted_.push_back((int32_t)t);
  }
  std::sort(sorted_.begin(), sorted_.end(), [&](int32_t a, int32_t b) {
    const int c = pieces_[(size_t)a].compare(pieces_[(size_t)b]);
    return c != 0 ? c < 0 : a < b;
  });
  // Pre-order trie from the sorted pieces: each piece opens the nodes past its common prefix with the
  // previous one, closing the deeper nodes of the previous path.
  nodes_.push_back(Node{});
  std::vector<uint32_t> open{0};
  const std::string* prev = nullptr;
  for (size_t k = 0; k < sorted_.size(); ++k) {
    const std::string& p = pieces_[(size_t)sorted_[k]];
    size_t lcp = 0;
    if (prev)
      while (lcp < p.size() && lcp < prev->size() && p[lcp] == (*prev)[lcp]) ++lcp;
    while (open.size() > lcp + 1) {
      nodes_[open.back()].subtree_end = (uint32_t)nodes_.size();
      open.pop_back();
    }
    for (size_t d = lcp + 1; d <= p.size(); ++d) {
      if (d > 0xFFFF) fail("token {} is too long for the vocabulary trie ({} bytes)", sorted_[k], p.size());
      Node n;
      n.byte = (uint8_t)p[d - 1];
      n.depth = (uint16_t)d;
      open.push_back((uint32_t)nodes_.size());
      nodes_.push_back(n);
    }
    Node& at = nodes_[open[p.size()]];
    if (at.token_count == 0) at.token_begin = (uint32_t)k;
    if (at.token_count == 0xFFFF) fail("token vocabulary: too many tokens with the same bytes");
    at.token_count++;
    max_depth_ = std::max(max_depth_, p.size());
    prev = &p;
  }
  for (uint32_t i : open) nodes_[i].subtree_end = (uint32_t)nodes_.size();
}

GrammarAutomaton::GrammarAutomaton(std::shared_ptr<const Grammar> grammar) : g_(std::move(grammar)) {
  nodes_.push_back({0, 0});  // id 0: the empty stack
  State s;
  for (uint32_t alt : g_->alternatives()[g_->root()]) expand(alt, 0, s.stacks);
  start_ = intern(std::move(s));
  if (start_ == kDead && limited_)
    throw GrammarError(fmt::format("the grammar is too ambiguous: its start opens more than {} parses at once", kMaxStacks));
  if (start_ == kDead) throw GrammarError("the grammar matches nothing");
}

bool GrammarAutomaton::full() const { return states_.size() > kMaxStates || state_heap_bytes_ > kMaxStateBytes; }

size_t GrammarAutomaton::bytes() const {
  constexpr size_t kMapNode = 2 * sizeof(void*);  // an unordered_map node's link and cached hash, beyond its pair
  size_t b = transitions_.capacity() * sizeof(int32_t) + states_.capacity() * sizeof(State) + state_heap_bytes_ +
             state_ids_.bucket_count() * sizeof(void*) + nodes_.capacity() * sizeof(StackNode) +
             node_ids_.size() * (sizeof(uint64_t) + sizeof(uint32_t) + kMapNode) + node_ids_.bucket_count() * sizeof(void*) +
             masks_.bucket_count() * sizeof(void*) + walk_.capacity() * sizeof(int32_t) + advances_.bucket_count() * sizeof(void*) +
             advancing_.capacity() * sizeof(uint32_t);
  for (const auto& [state, m] : masks_) b += m.capacity() * sizeof(uint64_t) + sizeof(state) + sizeof(m) + kMapNode;
  return b;
}

int32_t GrammarAutomaton::import_state(const GrammarAutomaton& from, int32_t state) {
  State s = from.states_[(size_t)state];
  for (uint32_t& id : s.stacks) {
    std::vector<uint32_t> chain;  // positions from the top down
    for (uint32_t n = id; n != 0; n = from.nodes_[n].parent) chain.push_back(from.nodes_[n].pos);
    uint32_t parent = 0;
    for (size_t i = chain.size(); i-- > 0;) parent = stack_node(chain[i], parent);
    id = parent;
  }
  return intern(std::move(s));
}

GrammarMatcher::GrammarMatcher(std::shared_ptr<const Grammar> grammar)
    : GrammarMatcher(std::make_shared<GrammarAutomaton>(std::move(grammar))) {}

GrammarMatcher::GrammarMatcher(std::shared_ptr<GrammarAutomaton> automaton) : a_(std::move(automaton)), current_(a_->start()) {}

void GrammarMatcher::move_if_full() {
  if (!a_->full()) return;
  auto fresh = std::make_shared<GrammarAutomaton>(a_->grammar());
  current_ = fresh->import_state(*a_, current_);
  a_ = std::move(fresh);
}

uint32_t GrammarAutomaton::stack_node(uint32_t pos, uint32_t parent) {
  const uint64_t key = ((uint64_t)pos << 32) | parent;
  auto [it, inserted] = node_ids_.try_emplace(key, (uint32_t)nodes_.size());
  if (inserted) nodes_.push_back({pos, parent});
  return it->second;
}

void GrammarAutomaton::expand(uint32_t pos0, uint32_t parent0, std::vector<uint32_t>& out) {
  // Iterative, with the alternatives still to expand on a work list: a grammar whose rules start with
  // rule references a hundred thousand deep must not recurse that deep (the order of `out` is free:
  // intern() sorts it).
  const std::vector<GrammarElement>& el = g_->elements();
  std::vector<std::pair<uint32_t, uint32_t>>& todo = expand_todo_;
  todo.clear();
  todo.emplace_back(pos0, parent0);
  while (!todo.empty()) {
    auto [pos, parent] = todo.back();
    todo.pop_back();
    for (;;) {
      if (out.size() >= kMaxRawStacks) return;  // cut: intern() refuses the state
      const GrammarElement& e = el[pos];
      if (e.kind == GrammarElement::Chars) {
        out.push_back(stack_node(pos, parent));
        break;
      }
      if (e.kind == GrammarElement::End) {
        if (parent == 0) {
          out.push_back(0);
          break;
        }
        const StackNode below = nodes_[parent];
        pos = below.pos;
        parent = below.parent;
        continue;
      }
      // A rule reference: its alternatives on top of the continuation. When the reference is the last
      // element of its alternative, the continuation is the parent itself (a tail call).
      const uint32_t cont = el[pos + 1].kind == GrammarElement::End ? parent : stack_node(pos + 1, parent);
      const std::vector<uint32_t>& alts = g_->alternatives()[e.index];
      if (alts.empty()) break;
      for (size_t i = 0; i + 1 < alts.size(); ++i) todo.emplace_back(alts[i], cont);
      pos = alts.back();
      parent = cont;
    }
  }
}

int32_t GrammarAutomaton::intern(State s) {
  const bool cut = s.stacks.size() >= kMaxRawStacks;  // expand() stopped early: the list is incomplete
  std::sort(s.stacks.begin(), s.stacks.end());
  s.stacks.erase(std::unique(s.stacks.begin(), s.stacks.end()), s.stacks.end());
  if (s.stacks.empty()) return kDead;
  if (cut || s.stacks.size() > kMaxStacks) {
    limited_ = true;
    return kDead;
  }
  std::string key(s.stacks.size() * 4 + 6, '\0');
  std::memcpy(key.data(), s.stacks.data(), s.stacks.size() * 4);
  std::memcpy(key.data() + s.stacks.size() * 4, &s.partial, 4);
  key[key.size() - 2] = (char)s.need;
  key.back() = (char)s.length;
  if (state_heap_bytes_ > kMaxStateBytes && !state_ids_.count(key)) {
    limited_ = true;
    return kDead;
  }
  const size_t entry_bytes = key_entry_bytes(key);
  auto [it, inserted] = state_ids_.try_emplace(std::move(key), (int32_t)states_.size());
  if (inserted) {
    state_heap_bytes_ += s.stacks.capacity() * sizeof(uint32_t) + entry_bytes;
    states_.push_back(std::move(s));
    transitions_.resize(states_.size() * 256, kUnknown);
  }
  return it->second;
}

int32_t GrammarAutomaton::step(int32_t state, uint8_t byte) {
  const size_t at = (size_t)state * 256 + byte;
  int32_t t = transitions_[at];
  if (t != kUnknown) return t;
  t = compute_step(state, byte);
  transitions_[at] = t;
  return t;
}

int32_t GrammarAutomaton::compute_step(int32_t state, uint8_t byte) {
  const State& from = states_[(size_t)state];
  const std::vector<GrammarElement>& el = g_->elements();
  const std::vector<CharClass>& classes = g_->classes();
  if (from.need > 0 && from.partial == kAnyTail) {
    // Every code point this character may still become is legal and matched by every stack kept:
    // any continuation byte goes on, and the last one advances them all.
    if ((byte & 0xC0) != 0x80) return kDead;
    if (from.need > 1) {
      State to;
      to.need = (uint8_t)(from.need - 1);
      to.stacks = from.stacks;
      to.partial = kAnyTail;
      to.length = from.length;
      return intern(std::move(to));
    }
    return advance(from.stacks);  // (read only before intern() can move the states)
  }
  uint32_t cp;
  State to;
  if (from.need > 0) {
    if ((byte & 0xC0) != 0x80) return kDead;
    cp = (from.partial << 6) | (byte & 0x3F);
    to.need = (uint8_t)(from.need - 1);
    to.length = from.length;
  } else if (byte < 0x80) {
    cp = byte;
  } else if (byte >= 0xC2 && byte <= 0xDF) {
    cp = byte & 0x1F;
    to.need = 1;
    to.length = 2;
  } else if (byte >= 0xE0 && byte <= 0xEF) {
    cp = byte & 0x0F;
    to.need = 2;
    to.length = 3;
  } else if (byte >= 0xF0 && byte <= 0xF4) {
    cp = byte & 0x07;
    to.need = 3;
    to.length = 4;
  } else {
    return kDead;  // a continuation byte out of place, or a byte UTF-8 never uses
  }
  if (to.need > 0) {
    // An incomplete character: the stacks whose class matches a code point that starts with these
    // bits (dead when none). Only code points a sequence of this length may encode count (no overlong
    // forms, none past U+10FFFF).
    const uint32_t shift = 6u * to.need;
    const uint32_t first = cp << shift, last = ((cp + 1) << shift) - 1;
    const uint32_t lo = std::max(first, kMinForLength[to.length]);
    const uint32_t hi = std::min(last, kMaxForLength[to.length]);
    if (lo > hi || (is_surrogate(lo) && is_surrogate(hi))) return kDead;
    bool uniform = first == lo && last == hi && !(first <= 0xDFFF && last >= 0xD800);
    for (uint32_t s : from.stacks) {
      if (s == 0) continue;
      const CharClass& c = classes[el[nodes_[s].pos].index];
      if (!c.matches_any(lo, hi)) continue;
      to.stacks.push_back(s);
      uniform = uniform && c.matches_all(first, last);
    }
    if (to.stacks.empty()) return kDead;
    // When every code point left is legal and matched by every stack kept, which one it will be no
    // longer matters: such states share one id instead of one per prefix of bits (a JSON string after
    // random bytes would otherwise make tens of thousands of states).
    to.partial = uniform ? kAnyTail : cp;
    return intern(std::move(to));
  }
  if (from.need > 0 && (cp < kMinForLength[from.length] || is_surrogate(cp))) return kDead;  // overlong or a surrogate
  advancing_.clear();
  for (uint32_t s : from.stacks)
    if (s != 0 && classes[el[nodes_[s].pos].index].matches(cp)) advancing_.push_back(s);
  return advance(advancing_);
}

int32_t GrammarAutomaton::advance(const std::vector<uint32_t>& stacks) {
  if (stacks.empty()) return kDead;
  std::string key(stacks.size() * 4, '\0');
  std::memcpy(key.data(), stacks.data(), key.size());
  if (auto it = advances_.find(key); it != advances_.end()) return it->second;
  // expand() adds stack nodes, never states: the state stepped from stays where it is until intern() below.
  State to;
  ++expansions_;
  for (uint32_t s : stacks) expand(nodes_[s].pos + 1, nodes_[s].parent, to.stacks);
  const int32_t id = intern(std::move(to));
  if (state_heap_bytes_ <= kMaxStateBytes) {
    state_heap_bytes_ += key_entry_bytes(key);
    advances_.emplace(std::move(key), id);
  }
  return id;
}

bool GrammarMatcher::allows_bytes(std::string_view bytes) {
  int32_t s = current_;
  for (char c : bytes) {
    s = a_->step(s, (uint8_t)c);
    if (s == GrammarAutomaton::kDead) return false;
  }
  return true;
}

bool GrammarMatcher::accept_bytes(std::string_view bytes) {
  move_if_full();
  int32_t s = current_;
  for (char c : bytes) {
    s = a_->step(s, (uint8_t)c);
    if (s == GrammarAutomaton::kDead) return false;
  }
  current_ = s;
  return true;
}

bool GrammarAutomaton::is_complete(int32_t state) const {
  const State& s = states_[(size_t)state];
  return s.need == 0 && s.stacks.front() == 0;
}

bool GrammarAutomaton::can_continue(int32_t state) const {
  const State& s = states_[(size_t)state];
  return s.need > 0 || s.stacks.back() != 0;
}

bool GrammarMatcher::token_allowed(const TokenVocab& vocab, int32_t token) {
  if (token < 0 || token >= vocab.n_vocab()) return false;
  if (vocab.is_eog(token)) return is_complete();
  const std::string& p = vocab.piece(token);
  return !p.empty() && allows_bytes(p);
}

void GrammarMatcher::accept_token(const TokenVocab& vocab, int32_t token) {
  if (vocab.is_eog(token)) return;
  const bool ok = accept_bytes(vocab.piece(token));
  ROOFLINE_CHECK(ok, "token {} accepted against the grammar", token);
}

const std::vector<uint64_t>& GrammarMatcher::mask(const TokenVocab& vocab) {
  move_if_full();
  return a_->mask(current_, vocab);
}

const std::vector<uint64_t>& GrammarAutomaton::mask(int32_t state, const TokenVocab& vocab) {
  if (masks_vocab_ != &vocab) {
    masks_.clear();
    masks_vocab_ = &vocab;
  }
  if (auto it = masks_.find(state); it != masks_.end()) return it->second;
  if (masks_.size() >= kMaxMasks) masks_.clear();
  std::vector<uint64_t> m(((size_t)vocab.n_vocab() + 63) / 64, 0);
  if (is_complete(state))
    for (int32_t t : vocab.eog_tokens()) m[(size_t)t >> 6] |= 1ull << (t & 63);
  const std::vector<TokenVocab::Node>& nodes = vocab.nodes();
  const std::vector<int32_t>& sorted = vocab.tokens_sorted();
  walk_.resize(vocab.max_depth() + 1);
  walk_[0] = state;
  const size_t n = nodes.size();
  for (size_t i = 1; i < n;) {
    const TokenVocab::Node& node = nodes[i];
    const int32_t s = step(walk_[node.depth - 1u], node.byte);
    if (s == kDead) {
      i = node.subtree_end;
      continue;
    }
    walk_[node.depth] = s;
    for (uint32_t k = node.token_begin, e = node.token_begin + node.token_count; k < e; ++k) {
      const int32_t t = sorted[k];
      m[(size_t)t >> 6] |= 1ull << (t & 63);
    }
    ++i;
  }
  return masks_[state] = std::move(m);
}

namespace {

// The second draw of sample_with_grammar: from the logits masked to the allowed tokens.
int32_t masked_draw(Sampler& sampler, const std::vector<uint64_t>& m, const float* logits, int n, const std::vector<int32_t>& history,
                    std::vector<float>& scratch) {
  if (sampler.params().temperature <= 0 && !penalties_apply(sampler.params(), history)) return argmax_allowed(logits, n, m.data());
  scratch.assign(logits, logits + n);
  bool any = false;
  for (int w = 0; w < (int)m.size(); ++w) {
    const uint64_t bits = m[(size_t)w];
    any = any || bits != 0;
    const int end = std::min(n, (w + 1) * 64);
    if (bits == ~0ull && end - w * 64 == 64) continue;
    for (int t = w * 64; t < end; ++t)
      if (!(bits >> (t & 63) & 1)) scratch[(size_t)t] = -std::numeric_limits<float>::infinity();
  }
  return any ? sampler.sample(scratch.data(), history).token : -1;
}

}  // namespace

int32_t sample_with_grammar(Sampler& sampler, GrammarMatcher& matcher, const TokenVocab& vocab, const float* logits,
                            const std::vector<int32_t>& history, std::vector<float>& scratch) {
  const int32_t first = sampler.sample(logits, history).token;
  if (matcher.token_allowed(vocab, first)) return first;
  const int32_t t = masked_draw(sampler, matcher.mask(vocab), logits, vocab.n_vocab(), history, scratch);
  return t >= 0 && matcher.token_allowed(vocab, t) ? t : -1;
}

void sample_rows_with_grammar(std::vector<GrammarRow>& rows, const TokenVocab& vocab, ThreadPool* pool) {
  const size_t n = rows.size();
  auto each = [&](const std::function<void(size_t)>& fn) {
    if (pool && n > 1) pool->parallel_for(n, fn);
    else for (size_t i = 0; i < n; ++i) fn(i);
  };
  // 1. Every row's first draw on its raw logits.
  std::vector<int32_t> first(n);
  each([&](size_t i) { first[i] = rows[i].sampler->sample(rows[i].logits, *rows[i].history).token; });
  // 2. Kept where the grammar allows it; the others take a copy of their state's mask (a later mask()
  //    may drop the cached one).
  std::vector<std::vector<uint64_t>> masks(n);
  for (size_t i = 0; i < n; ++i) {
    if (rows[i].matcher->token_allowed(vocab, first[i])) rows[i].token = first[i];
    else masks[i] = rows[i].matcher->mask(vocab), rows[i].token = -1;
  }
  // 3. The masked draws.
  std::vector<int32_t> second(n, -1);
  each([&](size_t i) {
    if (masks[i].empty()) return;
    thread_local std::vector<float> scratch;
    second[i] = masked_draw(*rows[i].sampler, masks[i], rows[i].logits, vocab.n_vocab(), *rows[i].history, scratch);
  });
  for (size_t i = 0; i < n; ++i)
    if (!masks[i].empty()) rows[i].token = second[i] >= 0 && rows[i].matcher->token_allowed(vocab, second[i]) ? second[i] : -1;
}

}  // namespace roofline::serve
