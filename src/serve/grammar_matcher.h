// Constrained decoding's runtime: a grammar (grammar.h) run as a pushdown automaton over bytes, and
// the token mask it allows over a vocabulary.
//
// The automaton's state is a set of parse stacks (hash-consed, so equal stacks share one id, and a
// rule's last element pops before its callee expands, so right recursion such as x* runs in constant
// depth) plus a partial UTF-8 character. States are interned and their byte transitions cached in a
// dense 256-entry table, so the automaton becomes a lazily built DFA: after warm-up a byte costs one
// table read. The vocabulary is a trie of the tokens' bytes laid out in pre-order; a mask walks it
// once, reading one transition per trie node and skipping a node's whole subtree on the first byte the
// grammar rejects. Masks are cached per state, which makes the common case (the next character of a
// JSON string, the same state again and again) a copy.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/thread_pool.h"
#include "engine/sampler.h"
#include "serve/grammar.h"

namespace roofline::serve {

// The vocabulary as a byte trie, built once per model. Tokens with no bytes (control tokens) are in no
// node: a grammar never allows them; end-of-generation tokens are allowed when the grammar is complete.
class TokenVocab {
 public:
  TokenVocab(const std::vector<std::string>& pieces, const std::vector<bool>& is_eog);

  int n_vocab() const { return (int)pieces_.size(); }
  const std::string& piece(int32_t t) const { return pieces_[(size_t)t]; }
  bool is_eog(int32_t t) const { return eog_[(size_t)t]; }
  const std::vector<int32_t>& eog_tokens() const { return eog_list_; }
  size_t n_nodes() const { return nodes_.size(); }

  // Pre-order trie: node 0 is the root; a node's subtree is [i, subtree_end).
  struct Node {
    uint32_t subtree_end = 0;
    uint32_t token_begin = 0;  // into tokens_sorted(), the tokens whose bytes end here
    uint16_t token_count = 0;
    uint16_t depth = 0;
    uint8_t byte = 0;
  };
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<int32_t>& tokens_sorted() const { return sorted_; }
  size_t max_depth() const { return max_depth_; }

 private:
  std::vector<std::string> pieces_;
  std::vector<bool> eog_;
  std::vector<int32_t> eog_list_;
  std::vector<Node> nodes_;
  std::vector<int32_t> sorted_;
  size_t max_depth_ = 0;
};

// The automaton of one grammar: interned states, their cached transitions and masks. Shared by every
// matcher of that grammar (the scheduler keeps the automata of recent grammars, so a schema sent again
// and again finds its DFA and masks built); not thread-safe (the scheduler's thread uses it).
class GrammarAutomaton {
 public:
  static constexpr int32_t kDead = -1;
  explicit GrammarAutomaton(std::shared_ptr<const Grammar> grammar);

  const std::shared_ptr<const Grammar>& grammar() const { return g_; }
  int32_t start() const { return start_; }
  int32_t step(int32_t state, uint8_t byte);  // kDead when the byte cannot come next
  bool is_complete(int32_t state) const;
  bool can_continue(int32_t state) const;
  const std::vector<uint64_t>& mask(int32_t state, const TokenVocab& vocab);
  size_t n_states() const { return states_.size(); }
  // Characters' steps whose stacks were expanded rather than found already advanced (advance()).
  size_t expansions() const { return expansions_; }
  // Past this many states a matcher moves to a fresh automaton (bounding the transition tables).
  bool full() const;
  void forget_masks() { masks_.clear(); }
  // Heap bytes held: transitions, states, stack nodes, cached masks (hash map nodes estimated).
  size_t bytes() const;
  // The same state, built in this automaton from `from`'s state (when a matcher moves).
  int32_t import_state(const GrammarAutomaton& from, int32_t state);
  // Whether some transition was refused because the grammar is open in too many ways at once (an
  // ambiguous grammar: more than kMaxStacks parses, or an expansion past kMaxRawStacks) or the states
  // already hold kMaxStateBytes: such a byte is treated as one the grammar does not allow, so a
  // pathological grammar costs bounded time and memory instead of stalling the scheduler.
  bool limited() const { return limited_; }
  static constexpr size_t kMaxStacks = 1024;
  static constexpr size_t kMaxRawStacks = 1 << 14;
  static constexpr size_t kMaxStateBytes = 256u << 20;

 private:
  static constexpr int32_t kUnknown = -2;
  // State::partial of an incomplete character whose every possible code point is legal and matched
  // by every stack of the state: the bits read so far no longer matter.
  static constexpr uint32_t kAnyTail = 0xFFFFFFFFu;
  struct StackNode {
    uint32_t pos;     // the element to match next (or to resume at, below the top)
    uint32_t parent;  // the node below; 0 is the empty stack
  };
  struct State {
    std::vector<uint32_t> stacks;  // sorted stack ids (0: the empty stack, i.e. complete)
    uint32_t partial = 0;          // code point bits read so far of an incomplete UTF-8 character (or kAnyTail)
    uint8_t need = 0;              // continuation bytes still expected
    uint8_t length = 0;            // the incomplete character's length in bytes (2..4)
  };

  uint32_t stack_node(uint32_t pos, uint32_t parent);
  // Pushes onto `out` the stacks reached from "`pos` on top of `parent`" whose top is a character
  // class (or 0 when the stack empties).
  void expand(uint32_t pos, uint32_t parent, std::vector<uint32_t>& out);
  int32_t intern(State s);
  int32_t compute_step(int32_t state, uint8_t byte);
  // The state after a complete character that these stacks (in their state's order) match: each one's
  // next element expanded. Memoized by the list, since it is all the result depends on: a class such as
  // `.` takes the same stacks on for every byte, so a state expands once instead of once a byte.
  int32_t advance(const std::vector<uint32_t>& stacks);

  std::shared_ptr<const Grammar> g_;
  std::vector<StackNode> nodes_;
  std::unordered_map<uint64_t, uint32_t> node_ids_;
  std::vector<State> states_;
  std::unordered_map<std::string, int32_t> state_ids_;
  std::vector<int32_t> transitions_;  // [state * 256 + byte]
  std::unordered_map<int32_t, std::vector<uint64_t>> masks_;
  const TokenVocab* masks_vocab_ = nullptr;  // the vocabulary the cached masks are of
  std::vector<int32_t> walk_;  // per trie depth, the state after that many bytes
  std::vector<std::pair<uint32_t, uint32_t>> expand_todo_;  // expand()'s work list (position, parent)
  std::vector<uint32_t> advancing_;                          // compute_step()'s stacks that the character advances
  std::unordered_map<std::string, int32_t> advances_;        // advance()'s results by their stack lists
  size_t state_heap_bytes_ = 0;  // the states' stack lists and their map entries, and advance()'s memo
  size_t expansions_ = 0;
  int32_t start_ = 0;
  bool limited_ = false;
};

// Where one output is in its grammar.
class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<const Grammar> grammar);  // with an automaton of its own
  explicit GrammarMatcher(std::shared_ptr<GrammarAutomaton> automaton);

  // Whether `bytes` may come next; consumes them if so (else the state is unchanged).
  bool accept_bytes(std::string_view bytes);
  bool allows_bytes(std::string_view bytes);
  // The text so far is a complete sentence of the grammar (end of generation allowed).
  bool is_complete() const { return a_->is_complete(current_); }
  // Some byte may still follow.
  bool can_continue() const { return a_->can_continue(current_); }
  // Some continuation was cut by the automaton's bounds (GrammarAutomaton::limited).
  bool limited() const { return a_->limited(); }

  // Token level: a token is allowed when its bytes keep the text a valid prefix (an end-of-generation
  // token: when the text is complete). Tokens without bytes are never allowed.
  bool token_allowed(const TokenVocab& vocab, int32_t token);
  void accept_token(const TokenVocab& vocab, int32_t token);  // the token must be allowed
  // Bit t of the result (word t / 64) is set when token t is allowed. Valid until the next call.
  const std::vector<uint64_t>& mask(const TokenVocab& vocab);

  size_t n_states() const { return a_->n_states(); }
  // Drops the cached masks (transitions stay): the next mask() walks the trie again (benchmarks).
  void forget_masks() { a_->forget_masks(); }

 private:
  void move_if_full();  // to a fresh automaton holding only the current state
  std::shared_ptr<GrammarAutomaton> a_;
  int32_t current_ = 0;
};

// Samples a token the grammar allows: first the sampler's pick on the raw logits, kept when the
// grammar allows it (one short walk; the usual case for a model that follows the format), else a
// second draw from logits masked to the allowed tokens (-inf elsewhere). Drawing unmasked first and
// redrawing on a rejection samples exactly the masked distribution. -1 when no token is allowed.
int32_t sample_with_grammar(Sampler& sampler, GrammarMatcher& matcher, const TokenVocab& vocab, const float* logits,
                            const std::vector<int32_t>& history, std::vector<float>& scratch);

// One constrained row of a step for sample_rows_with_grammar: its own sampler and matcher (rows may
// share an automaton), logits and history; `token` receives what sample_with_grammar would return.
struct GrammarRow {
  Sampler* sampler = nullptr;
  GrammarMatcher* matcher = nullptr;
  const float* logits = nullptr;
  const std::vector<int32_t>* history = nullptr;
  int32_t token = -1;
};
// sample_with_grammar over many rows, the same tokens (each row's sampler draws in the same order): the
// parts that read the whole vocabulary (the first draw, the masked one) run on `pool`; the automata,
// which rows may share and which are not thread-safe, are used from the calling thread only.
void sample_rows_with_grammar(std::vector<GrammarRow>& rows, const TokenVocab& vocab, ThreadPool* pool);

}  // namespace roofline::serve
