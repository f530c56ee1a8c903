// The scheduler's cache of grammar automata, bounded in count and bytes (see automaton_cache.h).
#include "serve/automaton_cache.h"

#include <algorithm>

namespace roofline::serve {

AutomatonCache::AutomatonCache(size_t max_automata, size_t max_bytes)
    : max_automata_(std::max<size_t>(1, max_automata)), max_bytes_(max_bytes) {}

std::shared_ptr<GrammarAutomaton> AutomatonCache::get(const std::shared_ptr<const Grammar>& grammar) {
  for (auto it = kept_.begin(); it != kept_.end(); ++it) {
    if ((*it)->grammar() != grammar) continue;
    if ((*it)->full()) {
      kept_.erase(it);
      break;
    }
    kept_.splice(kept_.begin(), kept_, it);
    trim();
    return kept_.front();
  }
  kept_.push_front(std::make_shared<GrammarAutomaton>(grammar));
  trim();
  return kept_.front();
}

size_t AutomatonCache::bytes() const {
  size_t total = 0;
  for (const auto& a : kept_) total += a->bytes();
  return total;
}

void AutomatonCache::trim() {
  while (kept_.size() > max_automata_) kept_.pop_back();
  size_t total = bytes();
  while (kept_.size() > 1 && total > max_bytes_) {
    total -= kept_.back()->bytes();
    kept_.pop_back();
  }
}

}  // namespace roofline::serve
