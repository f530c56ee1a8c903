// The scheduler's cache of grammar automata (serve/automaton_cache.h): equal schemas share one
// automaton, the cache stays within its byte budget and count across many distinct grammars, a full
// automaton is replaced by a fresh one, and an automaton's byte count follows what it holds.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "serve/automaton_cache.h"
#include "serve/structured_output.h"

using namespace roofline::serve;
using json = nlohmann::ordered_json;

namespace {

json schema_request(int max_length) {
  json schema = {{"type", "object"},
                 {"properties", {{"city", {{"type", "string"}, {"maxLength", max_length}}}, {"temp", {{"type", "integer"}}}}},
                 {"required", {"city", "temp"}}};
  return {{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "w"}, {"schema", schema}}}}}};
}

// A vocabulary of n_tokens short random pieces (masks of n_tokens bits each).
TokenVocab random_vocab(int n_tokens, std::mt19937& rng) {
  const std::string chars = "{}\":, abcdefghijklmnopqrstuvwxyz0123456789";
  std::vector<std::string> pieces;
  std::vector<bool> eog;
  for (int t = 0; t < n_tokens; ++t) {
    std::string p;
    for (int k = 0, n = 1 + (int)(rng() % 3); k < n; ++k) p += chars[rng() % chars.size()];
    pieces.push_back(p);
    eog.push_back(t == 0);
  }
  return TokenVocab(pieces, eog);
}

// Generates one random output through a matcher on `a`, taking a mask at every token.
void random_output(const std::shared_ptr<GrammarAutomaton>& a, const TokenVocab& v, std::mt19937& rng) {
  GrammarMatcher m(a);
  for (int step = 0; step < 60; ++step) {
    const std::vector<uint64_t>& mask = m.mask(v);
    std::vector<int32_t> allowed;
    for (int t = 0; t < v.n_vocab(); ++t)
      if ((mask[(size_t)t / 64] >> (t % 64)) & 1 && !v.is_eog(t)) allowed.push_back(t);
    if (allowed.empty()) return;
    m.accept_token(v, allowed[rng() % allowed.size()]);
  }
}

}  // namespace

TEST(AutomatonCache, EqualSchemasShareOneAutomaton) {
  // Each request parses its own body; the same schema text gives the same Grammar, and so the same automaton.
  auto g1 = parse_structured_output(schema_request(10));
  auto g2 = parse_structured_output(schema_request(10));
  auto g3 = parse_structured_output(schema_request(11));
  ASSERT_TRUE(g1 && g2 && g3);
  EXPECT_EQ(g1.get(), g2.get());
  EXPECT_NE(g1.get(), g3.get());
  AutomatonCache cache;
  auto a1 = cache.get(g1);
  EXPECT_EQ(cache.get(g2).get(), a1.get());
  EXPECT_NE(cache.get(g3).get(), a1.get());
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(cache.get(g1).get(), a1.get());  // still kept after another grammar was used
}

TEST(AutomatonCache, StaysWithinItsByteBudgetAcrossManyGrammars) {
  std::mt19937 rng(5);
  const TokenVocab v = random_vocab(20000, rng);  // 2.5 KB a mask
  constexpr size_t kBudget = size_t{1} << 20;
  AutomatonCache cache(8, kBudget);
  size_t evicted_by_bytes = 0;
  for (int i = 0; i < 40; ++i) {
    auto g = parse_structured_output(schema_request(5 + i));  // 40 distinct grammars
    auto a = cache.get(g);
    for (int k = 0; k < 4; ++k) random_output(a, v, rng);
    EXPECT_GT(a->bytes(), size_t{100} << 10) << "grammar " << i;  // states and masks were made
    a = cache.get(g);  // trims with what the automata hold now
    EXPECT_LE(cache.size(), 8u);
    EXPECT_LE(cache.bytes(), kBudget) << "grammar " << i << ", " << cache.size() << " automata kept";
    if (i >= 8 && cache.size() < 8) ++evicted_by_bytes;
  }
  EXPECT_GT(evicted_by_bytes, 0u);  // the byte budget, not only the count, bounded it
  // The count bound alone, with a budget nothing reaches.
  AutomatonCache by_count(3, size_t{1} << 40);
  for (int i = 0; i < 10; ++i) by_count.get(parse_structured_output(schema_request(100 + i)));
  EXPECT_EQ(by_count.size(), 3u);
}

TEST(AutomatonCache, AFullAutomatonIsReplaced) {
  auto g = Grammar::parse("root ::= [a-z]{0,20000} \"!\"");  // a new state per character
  AutomatonCache cache;
  auto first = cache.get(g);
  GrammarMatcher m(first);
  for (int i = 0; i < 17000; ++i) ASSERT_TRUE(m.accept_bytes("q"));
  ASSERT_TRUE(first->full());
  auto next = cache.get(g);
  EXPECT_NE(next.get(), first.get());
  EXPECT_FALSE(next->full());
  EXPECT_EQ(cache.size(), 1u);  // the full one is no longer kept
  EXPECT_EQ(cache.get(g).get(), next.get());
}

TEST(AutomatonCache, BytesFollowTransitionsAndMasks) {
  std::mt19937 rng(9);
  const TokenVocab v = random_vocab(6400, rng);  // 800 bytes a mask
  auto a = std::make_shared<GrammarAutomaton>(parse_structured_output(schema_request(10)));
  const size_t empty = a->bytes();
  random_output(a, v, rng);
  const size_t used = a->bytes();
  EXPECT_GE(used, empty + a->n_states() * 256 * sizeof(int32_t) / 2);  // a row of 256 transitions per state
  a->forget_masks();
  EXPECT_LT(a->bytes(), used);  // the masks counted too
}
