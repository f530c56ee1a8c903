// The grammar automata the scheduler keeps between requests, so a schema sent again and again finds
// its DFA and token masks built. Bounded twice: at most `max_automata` automata and, after every
// lookup, at most `max_bytes` of them together (least recently used dropped first; the one just
// returned always stays). An automaton past its state limit is dropped when next asked for: new
// requests get a fresh one, the matchers on the old one keep it until they move off.
#pragma once

#include <cstddef>
#include <list>
#include <memory>

#include "serve/grammar_matcher.h"

namespace roofline::serve {

class AutomatonCache {
 public:
  static constexpr size_t kDefaultMaxAutomata = 8;
  static constexpr size_t kDefaultMaxBytes = size_t{64} << 20;

  explicit AutomatonCache(size_t max_automata = kDefaultMaxAutomata, size_t max_bytes = kDefaultMaxBytes);

  // The automaton of `grammar` (the same Grammar object: structured_output.cpp hands out one per GBNF
  // text), made when there is none or the kept one is full.
  std::shared_ptr<GrammarAutomaton> get(const std::shared_ptr<const Grammar>& grammar);

  size_t size() const { return kept_.size(); }
  size_t bytes() const;  // of the kept automata, now (they grow while in use)

 private:
  void trim();
  size_t max_automata_, max_bytes_;
  std::list<std::shared_ptr<GrammarAutomaton>> kept_;  // the most recently used first
};

}  // namespace roofline::serve
