// Constrained decoding's core: the GBNF parser (good grammars and clear errors for bad ones), the
// byte automaton accepting and rejecting strings (UTF-8 split across bytes, repetitions, nesting),
// JSON Schema -> grammar (documents that validate are accepted, ones that do not are rejected,
// unsupported keywords named with their path), and token masks against a brute-force reference
// (an independent stack-set recognizer run on every token) on random vocabularies and random states,
// and on the real Qwen3 vocabulary, with the mask's cost printed.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <random>
#include <set>

#include "schema_validate.h"
#include "serve/grammar_matcher.h"
#include "serve/json_schema_grammar.h"
#include "tokenizer/tokenizer_test_util.h"

using namespace roofline;
using namespace roofline::serve;
using json = nlohmann::ordered_json;

namespace {

bool full_match(const std::string& gbnf, const std::string& text) {
  GrammarMatcher m(Grammar::parse(gbnf));
  return m.accept_bytes(text) && m.is_complete();
}
bool prefix_ok(const std::string& gbnf, const std::string& text) {
  GrammarMatcher m(Grammar::parse(gbnf));
  return m.accept_bytes(text);
}
std::string parse_error(const std::string& gbnf) {
  try {
    Grammar::parse(gbnf);
  } catch (const GrammarError& e) {
    return e.what();
  }
  return "(parsed)";
}

// ---- The reference recognizer: explicit stacks (vectors of element positions), no sharing, no caches.
struct RefState {
  std::set<std::vector<uint32_t>> stacks;  // top at the back; empty vector: complete
  std::string tail;                        // bytes of an incomplete UTF-8 character
  bool dead = false;
};

void ref_expand(const Grammar& g, std::vector<uint32_t> st, std::set<std::vector<uint32_t>>& out) {
  if (st.empty()) {
    out.insert(st);
    return;
  }
  const GrammarElement e = g.elements()[st.back()];
  if (e.kind == GrammarElement::Chars) {
    out.insert(st);
  } else if (e.kind == GrammarElement::End) {
    st.pop_back();
    ref_expand(g, st, out);
  } else {
    st.back() += 1;  // resume after the reference
    for (uint32_t alt : g.alternatives()[e.index]) {
      auto next = st;
      next.push_back(alt);
      ref_expand(g, next, out);
    }
  }
}

RefState ref_start(const Grammar& g) {
  RefState s;
  for (uint32_t alt : g.alternatives()[g.root()]) ref_expand(g, {alt}, s.stacks);
  // Stacks whose bottom was a finished root alternative are "complete" (popped to empty) already.
  return s;
}

RefState ref_advance_cp(const Grammar& g, const RefState& s, uint32_t cp) {
  RefState out;
  for (const auto& st : s.stacks) {
    if (st.empty()) continue;
    const GrammarElement e = g.elements()[st.back()];
    if (!g.classes()[e.index].matches(cp)) continue;
    auto next = st;
    next.back() += 1;
    ref_expand(g, next, out.stacks);
  }
  out.dead = out.stacks.empty();
  return out;
}

// A class as a bitmap over every code point (filled one code point at a time by matches()), kept by
// the class's ranges (not by grammar address: a later test's grammar may reuse a freed one's).
const std::vector<uint64_t>& class_bits(const Grammar& g, uint32_t cls) {
  static std::map<std::pair<std::vector<std::pair<uint32_t, uint32_t>>, bool>, std::vector<uint64_t>> cache;
  std::vector<uint64_t>& bits = cache[{g.classes()[cls].ranges, g.classes()[cls].negated}];
  if (bits.empty()) {
    bits.assign(0x110000 / 64, 0);
    for (uint32_t c = 0; c < 0x110000; ++c)
      if (g.classes()[cls].matches(c)) bits[c >> 6] |= 1ull << (c & 63);
  }
  return bits;
}

// Advances over bytes; an incomplete final character is kept when some stack's class matches one of
// the code points it may become (checked one by one).
RefState ref_advance(const Grammar& g, RefState s, const std::string& bytes) {
  for (unsigned char b : bytes) {
    if (s.dead) return s;
    s.tail += (char)b;
    const unsigned char lead = (unsigned char)s.tail[0];
    size_t len = 0;  // 0: a byte no UTF-8 character starts with
    if (lead < 0x80) len = 1;
    else if (lead >= 0xC2 && lead <= 0xDF) len = 2;
    else if (lead >= 0xE0 && lead <= 0xEF) len = 3;
    else if (lead >= 0xF0 && lead <= 0xF4) len = 4;
    if (len == 0 || (s.tail.size() > 1 && ((unsigned char)s.tail.back() & 0xC0) != 0x80)) {
      s.dead = true;
      return s;
    }
    uint32_t cp = len == 1 ? lead : len == 2 ? (lead & 0x1F) : len == 3 ? (lead & 0x0F) : (lead & 0x07);
    for (size_t i = 1; i < s.tail.size(); ++i) cp = (cp << 6) | ((unsigned char)s.tail[i] & 0x3F);
    // What a sequence of this length may encode: no overlong forms, no surrogates, nothing past U+10FFFF.
    const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000}, max_cp[5] = {0, 0x7F, 0x7FF, 0xFFFF, 0x10FFFF};
    auto legal = [&](uint32_t c) { return c >= min_cp[len] && c <= max_cp[len] && !(c >= 0xD800 && c <= 0xDFFF); };
    if (s.tail.size() == len) {
      s.tail.clear();
      if (!legal(cp)) {
        s.dead = true;
        return s;
      }
      s = ref_advance_cp(g, s, cp);
      continue;
    }
    const uint32_t shift = 6 * (uint32_t)(len - s.tail.size());
    bool any = false;
    for (const auto& st : s.stacks) {
      if (st.empty()) continue;
      const std::vector<uint64_t>& bits = class_bits(g, g.elements()[st.back()].index);
      for (uint32_t c = cp << shift; c < ((cp + 1) << shift) && !any; ++c)
        any = legal(c) && ((bits[c >> 6] >> (c & 63)) & 1);
      if (any) break;
    }
    if (!any) s.dead = true;
  }
  return s;
}

bool ref_complete(const RefState& s) { return !s.dead && s.tail.empty() && s.stacks.count({}); }

// Checks the mask at the matcher's current state against the reference at `ref`, token by token.
void expect_mask_matches_reference(GrammarMatcher& m, const Grammar& g, const RefState& ref, const TokenVocab& v) {
  const std::vector<uint64_t>& mask = m.mask(v);
  int mismatches = 0;
  for (int t = 0; t < v.n_vocab() && mismatches < 5; ++t) {
    bool want;
    if (v.is_eog(t)) want = ref_complete(ref);
    else if (v.piece(t).empty()) want = false;
    else want = !ref_advance(g, ref, v.piece(t)).dead;
    const bool got = (mask[(size_t)t / 64] >> (t % 64)) & 1;
    if (got != want) {
      ++mismatches;
      ADD_FAILURE() << "token " << t << " '" << v.piece(t) << "': mask says " << got << ", reference " << want;
    }
    EXPECT_EQ(m.token_allowed(v, t), want) << "token " << t;
  }
}

const char* kPersonSchema = R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "maxLength": 12},
    "age": {"type": "integer"},
    "email": {"type": ["string", "null"]},
    "tags": {"type": "array", "items": {"enum": ["a", "b", "ç"]}, "maxItems": 3},
    "kind": {"anyOf": [{"const": "cat"}, {"type": "number"}]},
    "home": {"$ref": "#/$defs/place"}
  },
  "required": ["name", "age"],
  "$defs": {"place": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string", "format": "date"}},
                      "required": ["city"]}}
})";

}  // namespace

TEST(Grammar, ParsesTheGbnfForms) {
  const std::string g = R"(# a comment
root ::= greeting " " name ("!" | "?")* tail
greeting ::= "hi" | "hello"   # trailing comment
name ::= [A-Z] [a-z]{1,4}
tail ::= ( "\n" | "\x41" )? [^0-9\u00e9]
     | "."
)";
  EXPECT_TRUE(full_match(g, "hi Bob!?!x"));
  EXPECT_TRUE(full_match(g, "hello Alice\nz"));
  EXPECT_TRUE(full_match(g, "hi BobAx"));
  EXPECT_TRUE(full_match(g, "hi Bo."));
  EXPECT_FALSE(full_match(g, "hi B."));        // [a-z]{1,4} needs one
  EXPECT_FALSE(full_match(g, "hi Bobbyy."));   // at most four
  EXPECT_FALSE(full_match(g, "hi Bob!5"));     // [^0-9...]
  EXPECT_FALSE(full_match(g, "hi Bob\xC3\xA9"));  // é excluded
  EXPECT_TRUE(full_match(g, "hi Bob\xC3\xA8"));   // è is not
  EXPECT_TRUE(prefix_ok(g, "hel"));
  EXPECT_FALSE(prefix_ok(g, "hex"));
  // '+', '.', {m,}, {m} and nested groups.
  EXPECT_TRUE(full_match(R"(root ::= ("ab"+ "c"){2} .{2,})", "ababcabcxyz"));
  EXPECT_FALSE(full_match(R"(root ::= ("ab"+ "c"){2} .{2,})", "abcabcx"));
  EXPECT_TRUE(full_match("root ::= [\\-\\]a]+", "-]a"));
  // A UTF-8 character split across bytes.
  GrammarMatcher m(Grammar::parse("root ::= \"\xE2\x82\xAC\" [\xCE\xB1-\xCF\x89]"));  // € then a Greek small letter
  EXPECT_TRUE(m.accept_bytes("\xE2"));
  EXPECT_FALSE(m.is_complete());
  EXPECT_FALSE(m.allows_bytes("\x83"));  // U+20C3 is not €
  EXPECT_TRUE(m.accept_bytes("\x82\xAC\xCE"));
  EXPECT_FALSE(m.allows_bytes("\x80"));  // U+0380 is below α
  EXPECT_TRUE(m.accept_bytes("\xB2"));    // β
  EXPECT_TRUE(m.is_complete());
  EXPECT_FALSE(m.can_continue());
}

TEST(Grammar, RightRecursionRunsInBoundedState) {
  GrammarMatcher m(Grammar::parse(R"g(root ::= "[" item* "]"
item ::= [a-z] | "(" item* ")")g"));
  ASSERT_TRUE(m.accept_bytes("["));
  for (int i = 0; i < 5000; ++i) ASSERT_TRUE(m.accept_bytes("ab"));
  EXPECT_LT(m.n_states(), 16u);  // the same state again and again
  ASSERT_TRUE(m.accept_bytes("((x)(y))]"));
  EXPECT_TRUE(m.is_complete());
  EXPECT_FALSE(m.accept_bytes(")"));
}

TEST(Grammar, MatchersShareAnAutomatonAndMoveOffAFullOne) {
  // Two outputs of one grammar on one automaton, interleaved, each where it should be.
  auto g = Grammar::parse(R"(root ::= "{" [a-z]* "}" | "[" [0-9]+ "]")");
  auto shared = std::make_shared<GrammarAutomaton>(g);
  GrammarMatcher a(shared), b(shared);
  EXPECT_TRUE(a.accept_bytes("{ab"));
  EXPECT_TRUE(b.accept_bytes("[1"));
  EXPECT_FALSE(a.allows_bytes("1"));
  EXPECT_FALSE(b.allows_bytes("a"));
  EXPECT_TRUE(a.accept_bytes("c}"));
  EXPECT_TRUE(b.accept_bytes("23]"));
  EXPECT_TRUE(a.is_complete() && b.is_complete());
  // A counted repetition makes a new state per character: past the automaton's limit the matcher
  // moves to a fresh one, where the count goes on exactly.
  GrammarMatcher m(Grammar::parse("root ::= [a-z]{0,20000} \"!\""));
  for (int i = 0; i < 20000; ++i) ASSERT_TRUE(m.accept_bytes("q")) << i;
  EXPECT_LT(m.n_states(), 20000u);  // it moved
  EXPECT_FALSE(m.allows_bytes("q"));
  EXPECT_FALSE(m.is_complete());
  EXPECT_TRUE(m.accept_bytes("!"));
  EXPECT_TRUE(m.is_complete());
}

// An ambiguous grammar whose open parses grow with the text (each x may end at any depth of its own
// nesting, under each of 40 positions of root): past GrammarAutomaton::kMaxStacks parses the automaton
// refuses the byte and says why (limited), where it used to take minutes and gigabytes a few dozen
// bytes in (found by tests/fuzz/libfuzzer/fuzz_gbnf). An unambiguous grammar never comes near the bound.
TEST(Grammar, AnAmbiguousGrammarIsCutAtTheBoundAndSaysSo) {
  GrammarMatcher m(Grammar::parse("root ::= x{40,}\nx ::= [a-z] xs\nxs ::= x xs |"));
  int taken = 0;
  while (taken < 1000 && m.accept_bytes("a")) ++taken;
  EXPECT_TRUE(m.limited());
  EXPECT_GE(taken, 40);   // the short texts still parse ...
  EXPECT_LT(taken, 1000);  // ... and the long ones are cut, not parsed at any cost
  GrammarMatcher plain(Grammar::parse("root ::= x{40,}\nx ::= [a-z]"));
  for (int i = 0; i < 1000; ++i) ASSERT_TRUE(plain.accept_bytes("a"));
  EXPECT_FALSE(plain.limited());
  // One whose start alone opens too many parses is refused as the request's grammar is compiled.
  std::string wide = "root ::= a0\n";
  for (int i = 0; i < 12; ++i) wide += "a" + std::to_string(i) + " ::= a" + std::to_string(i + 1) + " | a" + std::to_string(i + 1) + " \"x\"\n";
  wide += "a12 ::= [a-z]";
  try {
    GrammarMatcher w(Grammar::parse(wide));
    FAIL() << "the grammar was accepted";
  } catch (const GrammarError& e) {
    EXPECT_NE(std::string(e.what()).find("too ambiguous"), std::string::npos) << e.what();
  }
}

// `.` takes on every stack of a state for every ASCII byte, so a state's step is expanded once and the
// other bytes find it (GrammarAutomaton::advance). Found by tests/fuzz/libfuzzer/fuzz_gbnf: `root ::= . root*`
// opens one parse per depth, and expanding them once per byte of a mask's walk cost ~100 ms a token on the
// Qwen3 vocabulary a hundred characters in (10.7 s over the 180 tokens before the bound cuts it; 0.4 s now).
TEST(Grammar, AWildcardStepIsExpandedOnceAStateNotOnceAByte) {
  std::vector<std::string> pieces;
  for (int b = 1; b < 128; ++b) pieces.push_back(std::string(1, (char)b));
  pieces.push_back("\xC3\xA9");
  pieces.push_back("");
  std::vector<bool> eog(pieces.size(), false);
  eog.back() = true;
  const TokenVocab v(pieces, eog);
  const int32_t a = 'a' - 1;  // token of "a"
  auto automaton = std::make_shared<GrammarAutomaton>(Grammar::parse("root ::= . root*"));
  GrammarMatcher m(automaton);
  for (int i = 0; i < 40; ++i) {
    const std::vector<uint64_t>& mask = m.mask(v);
    ASSERT_TRUE(mask[(size_t)a / 64] >> (a % 64) & 1) << "after " << i << " characters";
    EXPECT_TRUE(mask[(size_t)(pieces.size() - 2) / 64] >> ((pieces.size() - 2) % 64) & 1) << "the two-byte character";
    m.accept_token(v, a);
  }
  EXPECT_TRUE(m.is_complete());
  EXPECT_FALSE(m.limited());
  // One expansion a state reached by a whole character (and the start's), not one for each of the 127 bytes
  // that reach it.
  EXPECT_LE(automaton->expansions(), automaton->n_states()) << automaton->n_states() << " states";
  EXPECT_GE(automaton->expansions(), 40u);
}

// Grammars deep in ways a request can make them (found with tests/fuzz/libfuzzer/fuzz_gbnf and its
// follow-ups; each was a stack overflow of the server, or minutes of parsing): groups nested past the
// bound are an error; a hundred thousand rules each starting with the next, each with a second
// alternative, are expanded without recursion; a chain of that many rules that can match nothing is
// found nullable in one pass.
TEST(Grammar, DeepGrammarsAreErrorsOrRunWithoutRecursion) {
  const int n = 100000;
  EXPECT_NE(parse_error("root ::= " + std::string(n, '(') + "\"a\"" + std::string(n, ')')).find("nested more than 256"), std::string::npos);
  EXPECT_TRUE(full_match("root ::= " + std::string(200, '(') + "\"a\"" + std::string(200, ')'), "a"));
  std::string chain = "root ::= r0\n", empty_chain = "root ::= r0 \"!\"\n";
  for (int i = 0; i < n; ++i) {
    chain += "r" + std::to_string(i) + " ::= r" + std::to_string(i + 1) + " | \"x\"\n";
    empty_chain += "r" + std::to_string(i) + " ::= r" + std::to_string(i + 1) + "\n";
  }
  chain += "r" + std::to_string(n) + " ::= \"y\"";
  empty_chain += "r" + std::to_string(n) + " ::= \"\" | \"y\"";
  // Its start opens n + 1 parses (each level's "x" and the last "y"): expanded without recursion, then
  // refused by the bound on parses (the old recursive expansion overflowed the stack first).
  try {
    GrammarMatcher m(Grammar::parse(chain));
    FAIL() << "accepted";
  } catch (const GrammarError& e) {
    EXPECT_NE(std::string(e.what()).find("too ambiguous"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(full_match(empty_chain, "!"));
  EXPECT_TRUE(full_match(empty_chain, "y!"));
  // A rule that reaches itself through the nullable chain is still left recursion.
  EXPECT_NE(parse_error(empty_chain + "\nr" + std::to_string(n / 2) + "x ::= r0 r" + std::to_string(n / 2) + "x").find("left-recursive"),
            std::string::npos);
}

// Random byte strings heavy in UTF-8 lead and continuation bytes, on one shared automaton: every prefix
// is allowed (and complete) exactly when the reference says so. Classes that take every non-ASCII code
// point, a few of them, or all but one make states where the bits read so far do or do not matter.
TEST(Grammar, RandomUtf8BytesMatchTheReference) {
  auto g = Grammar::parse(R"g(root ::= item*
item ::= "s" [^"\\\x00-\x1F]{0,3} "\"" | "g" [\u03B1-\u03C9]+ "." | "n" [^\u00E9]* ";" | "a" [\u0800-\uFFFF] | "x" [\U00010000-\U0010FFFF] "!" | "m" ([\u00E8] | [\u00C0-\u00FF]) "."
)g");
  auto shared = std::make_shared<GrammarAutomaton>(g);
  const std::vector<std::string> atoms = {"s", "g", "n", "a", "x", "m", "\"", ".", ";", "!", "q", "\xC2", "\xC3", "\xCE", "\xCF", "\xDF",
                                          "\xE0", "\xE1", "\xED", "\xEF", "\xF0", "\xF3", "\xF4", "\xF5", "\xC0", "\xC1",
                                          "\x80", "\x8F", "\x90", "\x9F", "\xA0", "\xA8", "\xA9", "\xB1", "\xBF", "\xC3\xA9", "\xC3\xA8"};
  std::mt19937 rng(77);
  int allowed = 0, complete = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    GrammarMatcher m(shared);
    RefState ref = ref_start(*g);
    std::string text;
    const int n = 1 + (int)(rng() % 12);
    for (int k = 0; k < n && !ref.dead; ++k) {
      const std::string& b = atoms[rng() % (k == 0 ? 6 : atoms.size())];  // an item's first letter, then anything
      text += b;
      ref = ref_advance(*g, ref, b);
      ASSERT_EQ(m.allows_bytes(b), !ref.dead) << "text " << ::testing::PrintToString(text);
      if (ref.dead) break;
      ASSERT_TRUE(m.accept_bytes(b));
      ASSERT_EQ(m.is_complete(), ref_complete(ref)) << "text " << ::testing::PrintToString(text);
      allowed++;
      complete += ref_complete(ref);
    }
  }
  EXPECT_GT(allowed, 3000);  // the strings get past their first byte often enough to check something
  EXPECT_GT(complete, 20);
}

// A JSON string under random bytes (a random model's output): the states stay few. The bits of an
// incomplete UTF-8 character make a state only while they decide something (the string's class takes
// every non-ASCII code point), not one per prefix read; before, 2000 such outputs made ~49k states.
TEST(Grammar, RandomBytesInAJsonStringMakeFewStates) {
  auto g = Grammar::parse(json_schema_to_gbnf(json::parse(
      R"({"type":"object","properties":{"city":{"type":"string","maxLength":10},"temp":{"type":"integer"}},"required":["city","temp"]})")));
  GrammarAutomaton a(g);
  std::mt19937 rng(1);
  for (int run = 0; run < 2000; ++run) {
    int32_t s = a.start();
    for (int i = 0; i < 400; ++i) {
      std::vector<int> ok;
      for (int b = 0; b < 256; ++b)
        if (a.step(s, (uint8_t)b) != GrammarAutomaton::kDead) ok.push_back(b);
      if (ok.empty() || (a.is_complete(s) && rng() % 4 == 0)) break;
      s = a.step(s, (uint8_t)ok[rng() % ok.size()]);
    }
  }
  EXPECT_LT(a.n_states(), 2000u);
  EXPECT_FALSE(a.full());
}

TEST(Grammar, BadGbnfIsAClearError) {
  EXPECT_NE(parse_error("item ::= \"a\"").find("no 'root' rule"), std::string::npos);
  EXPECT_NE(parse_error("root ::= missing").find("'missing' is used but never defined"), std::string::npos);
  EXPECT_NE(parse_error("root ::= \"abc").find("unterminated string"), std::string::npos);
  EXPECT_NE(parse_error("root ::= [abc").find("unterminated character class"), std::string::npos);
  EXPECT_NE(parse_error("root ::= (\"a\"").find("expected ')'"), std::string::npos);
  EXPECT_NE(parse_error("root \"a\"").find("expected '::='"), std::string::npos);
  EXPECT_NE(parse_error("root ::= \"\\q\"").find("unknown escape"), std::string::npos);
  EXPECT_NE(parse_error("root ::= \"a\"{3,1}").find("below its minimum"), std::string::npos);
  EXPECT_NE(parse_error("root ::= root \"a\" | \"b\"").find("left-recursive"), std::string::npos);
  EXPECT_NE(parse_error("root ::= x \"a\"\nx ::= \"\" | root").find("left-recursive"), std::string::npos);
  EXPECT_NE(parse_error("root ::= \"a\"\nroot ::= \"b\"").find("defined twice"), std::string::npos);
  EXPECT_NE(parse_error("root ::= \"a\" )").find("line 1, column"), std::string::npos);
  EXPECT_NE(parse_error("root ::= \"a\"\nx ::= @").find("line 2"), std::string::npos);
}

TEST(JsonSchemaGrammar, AcceptsValidDocumentsAndRejectsInvalidOnes) {
  const json schema = json::parse(kPersonSchema);
  const std::string g = json_schema_to_gbnf(schema);
  const std::vector<std::string> good = {
      R"({"name": "Ann", "age": 3})",
      R"({ "name" : "Ann" ,"age":-12, "email": null, "tags": ["a", "ç"], "kind": "cat", "home": {"city": "Oslo", "zip": "2024-01-31"}})",
      "{\n  \"name\": \"\",\n  \"age\": 0,\n  \"kind\": 1.5e-3\n}",
      R"({"name": "x\"\u00e9\n", "age": 7, "tags": []})",
      R"({"name": "a", "age": 1, "home": {"city": ""}})",
      R"({"name": "\uD83D\ude00 \uffff\ud7ff\ue000", "age": 1})",  // a surrogate pair; the code points around them
  };
  for (const std::string& doc : good) {
    EXPECT_TRUE(full_match(g, doc)) << doc;
    EXPECT_EQ(serve::test::validate_schema(json::parse(doc), schema), "") << doc;
  }
  const std::vector<std::string> bad = {
      R"({"age": 3, "name": "Ann"})",               // properties in the schema's order
      R"({"name": "Ann"})",                         // age is required
      R"({"name": "Ann", "age": 3.5})",             // integer
      R"({"name": "Ann", "age": 3, "x": 1})",       // no extra properties
      R"({"name": "Ann", "age": 3, "tags": ["a","b","a","b"]})",  // maxItems
      R"({"name": "Ann", "age": 3, "tags": ["c"]})",
      R"({"name": "0123456789abc", "age": 3})",     // maxLength 12
      R"({"name": "Ann", "age": 3, "home": {"zip": "2024-01-01"}})",
      R"({"name": "Ann", "age": 3, "home": {"city": "x", "zip": "2024-13-01"}})",
      R"({"name": "Ann", "age": 03})",
      R"({"name": "Ann", "age": 3,})",
      "{\"name\": \"a\tb\", \"age\": 3}",           // control characters must be escaped
      R"({"name": "\ud800", "age": 3})",          // a lone surrogate escape, which strict parsers reject
      R"({"name": "\uDBFF-", "age": 3})",
      R"({"name": "\udc00", "age": 3})",
      R"({"name": "\ud800\u0041", "age": 3})",
  };
  for (const std::string& doc : bad) EXPECT_FALSE(full_match(g, doc)) << doc;
}

TEST(JsonSchemaGrammar, ArraysOptionalsAndAdditionalProperties) {
  auto check = [](const char* schema, const std::vector<std::string>& good, const std::vector<std::string>& bad) {
    const std::string g = json_schema_to_gbnf(json::parse(schema));
    for (const auto& d : good) {
      EXPECT_TRUE(full_match(g, d)) << schema << " should accept " << d;
      EXPECT_EQ(serve::test::validate_schema(json::parse(d), json::parse(schema)), "") << d;
    }
    for (const auto& d : bad) EXPECT_FALSE(full_match(g, d)) << schema << " should reject " << d;
  };
  check(R"({"type":"array","prefixItems":[{"type":"integer"},{"type":"string"}],"items":{"type":"boolean"},"minItems":1,"maxItems":4})",
        {"[1]", "[1, \"a\"]", "[1,\"a\",true,false]"}, {"[]", "[\"a\"]", "[1,2]", "[1,\"a\",true,false,true]"});
  check(R"({"type":"array","prefixItems":[{"type":"null"}],"items":false})", {"[]", "[null]"}, {"[null,null]", "[1]"});
  check(R"({"type":"array","items":{"type":"number"},"minItems":2})", {"[1,2]", "[1,2,3,4,5]"}, {"[1]", "[]"});
  check(R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"},"c":{"type":"integer"}}})",
        {"{}", R"({"a":1})", R"({"b":1})", R"({"c":1})", R"({"a":1,"c":2})", R"({"a":1,"b":2,"c":3})"},
        {R"({"b":1,"a":2})", R"({,"a":1})", R"({"a":1,})", R"({"d":1})"});
  check(R"({"type":"object","properties":{"a":{"type":"integer"}},"required":["a"],"additionalProperties":{"type":"string"}})",
        {R"({"a":1})", R"({"a":1,"x":"y","z":""})"}, {R"({"a":1,"x":2})", R"({"x":"y"})"});
  check(R"({"type":"object","additionalProperties":true})", {"{}", R"({"k":[1,{"z":null}]})"}, {"[]"});
  check(R"({"type":"string","minLength":2,"maxLength":3})", {R"("ab")", R"("\u00e9\n")", "\"\xC3\xA9\xC3\xA9\""}, {R"("a")", R"("abcd")"});
  check(R"({"type":"string","format":"uuid"})", {R"("123e4567-e89b-12d3-a456-426614174000")"}, {R"("123e4567")"});
  check(R"({"type":"string","format":"date-time"})", {R"("2024-02-29T23:59:59Z")", R"("2024-02-29T10:00:00.123+02:00")"},
        {R"("2024-02-29 10:00:00Z")"});
  check(R"({"oneOf":[{"type":"boolean"},{"enum":[1,"two",null,[3]]}]})", {"true", "1", "\"two\"", "null", "[3]"}, {"2", "\"three\""});
  check(R"({"$ref":"#/definitions/node","definitions":{"node":{"type":"object","properties":{"next":{"anyOf":[{"$ref":"#/definitions/node"},{"type":"null"}]}},"required":["next"]}}})",
        {R"({"next":null})", R"({"next":{"next":{"next":null}}})"}, {R"({"next":{}})"});
  check("{}", {"1", "\"s\"", "[{}]", "{\"a\":[null,true]}"}, {"", "nul", "[1,]"});
}

TEST(JsonSchemaGrammar, UnsupportedKeywordsAreNamedWithTheirPath) {
  auto error = [](const char* schema) -> std::pair<std::string, std::string> {
    try {
      json_schema_to_gbnf(json::parse(schema));
    } catch (const SchemaError& e) {
      return {e.what(), e.path};
    }
    return {"(converted)", ""};
  };
  auto [what, path] = error(R"({"type":"object","properties":{"n":{"type":"string","pattern":"^a+$"}}})");
  EXPECT_NE(what.find("'pattern'"), std::string::npos) << what;
  EXPECT_EQ(path, "/properties/n/pattern");
  std::tie(what, path) = error(R"({"type":"integer","minimum":3})");
  EXPECT_NE(what.find("'minimum'"), std::string::npos);
  std::tie(what, path) = error(R"({"type":"string","format":"email"})");
  EXPECT_NE(what.find("email"), std::string::npos);
  std::tie(what, path) = error(R"({"$ref":"https://example.com/s.json"})");
  EXPECT_NE(what.find("local references"), std::string::npos);
  std::tie(what, path) = error(R"({"$ref":"#/$defs/missing"})");
  EXPECT_NE(what.find("does not resolve"), std::string::npos);
  std::tie(what, path) = error(R"({"type":"object","properties":{},"required":["x"]})");
  EXPECT_NE(what.find("'x'"), std::string::npos);
  std::tie(what, path) = error(R"({"type":"martian"})");
  EXPECT_NE(what.find("martian"), std::string::npos);
  // References that reach themselves before any character (found by tests/fuzz/libfuzzer/fuzz_json_schema):
  // the schema's error, where the generated grammar used to fail later on its own rule names.
  for (const char* cyclic : {R"({"$ref":"#"})", R"({"$defs":{"a":{"$ref":"#/$defs/b"},"b":{"anyOf":[{"$ref":"#/$defs/a"},{"type":"null"}]}},"$ref":"#/$defs/a"})"}) {
    std::tie(what, path) = error(cyclic);
    EXPECT_NE(what.find("'$ref' reaches itself"), std::string::npos) << cyclic << ": " << what;
  }
}

TEST(JsonSchemaGrammar, ToolCallsInTheQwenFormat) {
  std::vector<ToolGrammarSpec> tools = {
      {"get_weather", json::parse(R"({"type":"object","properties":{"city":{"type":"string"}},"required":["city"]})")},
      {"now", json()}};
  const std::string one = tool_calls_gbnf(tools, false);
  const std::string call = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
  const std::string call2 = "<tool_call>\n{\"name\": \"now\", \"arguments\": {\"tz\": [1]}}\n</tool_call>";
  EXPECT_TRUE(full_match(one, call));
  EXPECT_TRUE(full_match(one, call2));
  EXPECT_FALSE(full_match(one, call + "\n" + call2));
  EXPECT_FALSE(full_match(one, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>"));
  EXPECT_FALSE(full_match(one, "<tool_call>\n{\"name\": \"other\", \"arguments\": {}}\n</tool_call>"));
  EXPECT_TRUE(full_match(tool_calls_gbnf(tools, true), call + "\n" + call2 + "\n" + call));
}

// Random vocabularies (ASCII, JSON punctuation, multi-byte characters and their fragments) and random
// walks through a schema's grammar: the mask equals the reference at every step.
TEST(TokenMask, MatchesBruteForceOnRandomVocabulariesAndStates) {
  std::mt19937 rng(1234);
  const std::vector<std::string> atoms = {"{", "}", "[", "]", "\"", ":", ",", " ", "\n", "a", "b", "c", "ç", "t", "rue", "null",
                                          "1", "0", "-", ".", "e", "\\", "n", "u", "name", "age", "tags", "kind", "cat", "home",
                                          "city", "\xC3", "\xA7", "\xE2\x82", "\xAC", "2024", "-01", "\t", "x",
                                          "\xF0\x80", "\x80\xA0", "\xC0", "\xF5", "\xE0\x80"};  // overlong / invalid UTF-8
  const std::vector<std::string> schemas = {kPersonSchema, R"({"type":"number"})", R"({"enum":["a","ab","abc\u00e7"]})",
                                            R"({"type":"array","items":{"type":"integer"},"maxItems":3})"};
  int complete_states = 0;
  for (int trial = 0; trial < 8; ++trial) {
    auto g = Grammar::parse(json_schema_to_gbnf(json::parse(schemas[(size_t)trial % schemas.size()])));
    std::vector<std::string> pieces;
    std::vector<bool> eog;
    std::set<std::string> seen;
    for (int t = 0; t < 600; ++t) {
      std::string p;
      const int n = 1 + (int)(rng() % 4);
      for (int k = 0; k < n; ++k) p += atoms[rng() % atoms.size()];
      if (t % 97 == 5) p.clear();                // control tokens: no bytes
      if (t < 60 && !seen.insert(p).second) p += "a";  // a few duplicates stay possible later on
      pieces.push_back(p);
      eog.push_back(t == 7 || t == 300);
    }
    TokenVocab v(pieces, eog);
    GrammarMatcher m(g);
    RefState ref = ref_start(*g);
    for (int step = 0; step < 40; ++step) {
      SCOPED_TRACE("trial " + std::to_string(trial) + " step " + std::to_string(step));
      expect_mask_matches_reference(m, *g, ref, v);
      if (::testing::Test::HasFailure()) return;
      complete_states += ref_complete(ref);
      const std::vector<uint64_t>& mask = m.mask(v);
      std::vector<int32_t> allowed;
      for (int t = 0; t < v.n_vocab(); ++t)
        if ((mask[(size_t)t / 64] >> (t % 64)) & 1 && !v.is_eog(t)) allowed.push_back(t);
      if (allowed.empty()) break;
      const int32_t t = allowed[rng() % allowed.size()];
      m.accept_token(v, t);
      ref = ref_advance(*g, ref, v.piece(t));
      ASSERT_FALSE(ref.dead);
    }
  }
  EXPECT_GT(complete_states, 0);  // states where end of generation is allowed were checked too
}

// The real Qwen3 vocabulary (151k tokens): masks at states along a JSON document equal the reference,
// and the cost is printed (cold: transitions computed on the way; warm: the cached DFA; the check of
// one sampled token, which is what most steps of a model that follows the format cost).
TEST(TokenMask, Qwen3VocabularyMatchesReferenceAndPrintsCost) {
  auto tok = roofline::test::load_test_tokenizer("qwen3");
  if (!tok) GTEST_SKIP() << "../shared is absent; skipping the Qwen3 vocabulary";
  using Clock = std::chrono::steady_clock;
  auto t0 = Clock::now();
  std::vector<std::string> pieces((size_t)tok->n_vocab());
  std::vector<bool> eog((size_t)tok->n_vocab());
  for (int t = 0; t < tok->n_vocab(); ++t) {
    eog[(size_t)t] = tok->is_eog(t);
    pieces[(size_t)t] = eog[(size_t)t] ? "" : tok->token_to_piece(t, false);
  }
  TokenVocab v(pieces, eog);
  const double build_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  const json schema = json::parse(kPersonSchema);
  auto g = Grammar::parse(json_schema_to_gbnf(schema));
  const std::string doc = R"({"name": "Zoë B", "age": 42, "tags": ["a", "ç"], "kind": "cat", "home": {"city": "Kraków"}})";
  const std::vector<int32_t> ids = tok->encode(doc, false, false);
  GrammarMatcher m(g);
  RefState ref = ref_start(*g);
  double cold_ms = 0, warm_ms = 0, check_us = 0;
  int n = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i % 7 == 0) {  // the reference over the whole vocabulary is slow: every seventh state
      expect_mask_matches_reference(m, *g, ref, v);
      if (::testing::Test::HasFailure()) return;
    }
    GrammarMatcher fresh(g);  // the same state without caches: the cold cost
    for (size_t k = 0; k < i; ++k) fresh.accept_token(v, ids[k]);
    auto a = Clock::now();
    (void)fresh.mask(v);
    auto b = Clock::now();
    fresh.forget_masks();  // the transitions are known now: a warm walk
    (void)fresh.mask(v);
    auto c = Clock::now();
    const bool ok = m.token_allowed(v, ids[i]);
    auto d = Clock::now();
    cold_ms += std::chrono::duration<double, std::milli>(b - a).count();
    warm_ms += std::chrono::duration<double, std::milli>(c - b).count();
    check_us += std::chrono::duration<double, std::micro>(d - c).count();
    ++n;
    ASSERT_TRUE(ok) << "token " << i << " of the document";
    m.accept_token(v, ids[i]);
    ref = ref_advance(*g, ref, v.piece(ids[i]));
  }
  EXPECT_TRUE(m.is_complete());
  EXPECT_FALSE(m.can_continue());
  // A forced tool call may start with Qwen3's single <tool_call> token (its text is the tag).
  {
    GrammarMatcher call(Grammar::parse(tool_calls_gbnf({{"f", json()}}, false)));
    const std::vector<int32_t> tag = tok->encode("<tool_call>", false, true);
    ASSERT_EQ(tag.size(), 1u);
    EXPECT_TRUE(call.token_allowed(v, tag[0]));
    const std::vector<uint64_t>& mask = call.mask(v);
    EXPECT_TRUE((mask[(size_t)tag[0] / 64] >> (tag[0] % 64)) & 1);
    int allowed = 0;
    for (uint64_t w : mask) allowed += __builtin_popcountll(w);
    EXPECT_LT(allowed, 20);  // "<", "<tool", ... and the tag itself
    call.accept_token(v, tag[0]);
    EXPECT_TRUE(call.allows_bytes("\n{\"name\": \"f\""));
  }
  // A fresh walk with every transition already known (a new state inside a long string).
  GrammarMatcher s(Grammar::parse(json_schema_to_gbnf(json::parse(R"({"type":"string"})"))));
  s.accept_bytes("\"");
  (void)s.mask(v);
  auto a = Clock::now();
  int walks = 0;
  for (const char* more : {"a", "b", "c", "d", "e", "f", "g", "h"}) {
    s.accept_bytes(more);
    (void)s.mask(v);  // same state as before: the cached mask
    ++walks;
  }
  const double string_us = std::chrono::duration<double, std::micro>(Clock::now() - a).count() / walks;
  // Sampling with random logits (the worst case: the model ignores the format, so the first draw is
  // mostly rejected and a mask is needed) against the same sampler without a grammar.
  SamplingParams sp;
  sp.seed = 42;
  Sampler plain(sp, v.n_vocab()), constrained(sp, v.n_vocab());
  std::vector<float> logits((size_t)v.n_vocab()), scratch;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  GrammarMatcher gen(g);
  std::vector<int32_t> history;
  double plain_us = 0, constrained_us = 0;
  int generated = 0, rejected_first = 0;
  for (; generated < 300 && gen.can_continue(); ++generated) {
    for (float& x : logits) x = normal(rng);
    auto p0 = Clock::now();
    const int32_t unconstrained = plain.sample(logits.data(), history).token;
    auto p1 = Clock::now();
    rejected_first += !gen.token_allowed(v, unconstrained);
    auto p2 = Clock::now();
    const int32_t t = sample_with_grammar(constrained, gen, v, logits.data(), history, scratch);
    ASSERT_GE(t, 0);
    gen.accept_token(v, t);
    auto p3 = Clock::now();
    plain_us += std::chrono::duration<double, std::micro>(p1 - p0).count();
    constrained_us += std::chrono::duration<double, std::micro>(p3 - p2).count();
    history.push_back(t);
  }
  std::printf("[ mask cost ] random logits, %d tokens (%d first draws rejected): sampling %.1f us/token unconstrained, "
              "%.1f us/token constrained (%zu automaton states)\n",
              generated, rejected_first, plain_us / generated, constrained_us / generated, gen.n_states());
  std::printf("[ mask cost ] Qwen3 vocabulary %d tokens, trie %zu nodes, built in %.1f ms\n", v.n_vocab(), v.n_nodes(), build_ms);
  std::printf("[ mask cost ] %d states of a JSON document: full mask cold %.3f ms, warm %.3f ms, sampled-token check %.2f us (means)\n",
              n, cold_ms / n, warm_ms / n, check_us / n);
  std::printf("[ mask cost ] inside a JSON string (cached state): %.2f us per mask\n", string_us);
  // An ambiguous grammar (one open parse per depth: Grammar.AWildcardStepIsExpandedOnceAStateNotOnceAByte), a mask and
  // the token "a" a step until its bound cuts it: every mask is at new states.
  const auto a_token = std::find(pieces.begin(), pieces.end(), std::string("a"));
  ASSERT_NE(a_token, pieces.end());
  GrammarMatcher deep(Grammar::parse("root ::= . root*"));
  double deep_ms = 0, deep_worst_ms = 0;
  int deep_steps = 0;
  for (; deep_steps < 1000; ++deep_steps) {
    auto d0 = Clock::now();
    const std::vector<uint64_t>& mask = deep.mask(v);
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - d0).count();
    deep_ms += ms;
    deep_worst_ms = std::max(deep_worst_ms, ms);
    const int32_t t = (int32_t)(a_token - pieces.begin());
    if (!(mask[(size_t)t / 64] >> (t % 64) & 1)) break;
    deep.accept_token(v, t);
  }
  EXPECT_TRUE(deep.limited());  // cut by the bound, not run to the loop's end
  std::printf("[ mask cost ] `root ::= . root*`, %d masks until its bound: %.0f ms in all, the slowest %.1f ms\n", deep_steps,
              deep_ms, deep_worst_ms);
}

// sample_with_grammar: greedy picks the best allowed token; sampling draws exactly the distribution
// masked to the allowed tokens (the first unmasked draw kept when allowed, else a masked redraw).
TEST(TokenMask, ConstrainedSamplingPicksFromTheMaskedDistribution) {
  // Tokens: "a", "b", "c", "1", "2", EOG. The grammar allows a letter, then only "1" or "2".
  TokenVocab v({"a", "b", "c", "1", "2", ""}, {false, false, false, false, false, true});
  auto g = Grammar::parse(R"(root ::= [a-c] [12])");
  const std::vector<float> logits = {0.0f, 1.0f, -1.0f, 3.0f, 2.0f, 5.0f};
  SamplingParams greedy;
  greedy.temperature = 0;
  Sampler gs(greedy, 6);
  std::vector<float> scratch;
  GrammarMatcher m(g);
  EXPECT_EQ(sample_with_grammar(gs, m, v, logits.data(), {}, scratch), 1);  // "b": the best letter
  m.accept_token(v, 1);
  EXPECT_EQ(sample_with_grammar(gs, m, v, logits.data(), {}, scratch), 3);  // "1", not EOG (5.0)
  m.accept_token(v, 3);
  EXPECT_EQ(sample_with_grammar(gs, m, v, logits.data(), {}, scratch), 5);  // complete: only EOG

  SamplingParams sp;
  sp.temperature = 1;
  sp.top_k = 0;
  sp.top_p = 1;
  sp.min_p = 0;
  sp.seed = 99;
  Sampler s(sp, 6);
  const int draws = 40000;
  std::vector<int> count(6, 0);
  GrammarMatcher start(g);
  for (int i = 0; i < draws; ++i) {
    GrammarMatcher fresh = start;
    const int32_t t = sample_with_grammar(s, fresh, v, logits.data(), {}, scratch);
    ASSERT_GE(t, 0);
    ASSERT_LE(t, 2);  // only letters at the start
    count[(size_t)t]++;
  }
  const double z = std::exp(0.0) + std::exp(1.0) + std::exp(-1.0);
  for (int t = 0; t < 3; ++t) {
    const double p = std::exp((double)logits[(size_t)t]) / z;
    const double sd = std::sqrt(p * (1 - p) / draws);
    EXPECT_NEAR((double)count[(size_t)t] / draws, p, 5 * sd) << "token " << t;
  }
}

// sample_rows_with_grammar (a step's constrained rows at once, the vocabulary-wide parts on a pool)
// picks what sample_with_grammar picks row by row, for rows sharing one automaton, greedy (with ties
// and whole 64-token words allowed) and sampled, over many steps of each row's output.
TEST(TokenMask, RowsSampledTogetherMatchRowByRow) {
  std::mt19937 rng(77);
  std::vector<std::string> pieces;
  const std::vector<std::string> atoms = {"{", "}", "[", "]", "\"", ":", ",", " ", "a", "b", "1", "2", "true", "null", "x", "\\"};
  for (int t = 0; t < 700; ++t) {
    std::string p;
    for (int k = 0, n = 1 + (int)(rng() % 3); k < n; ++k) p += atoms[rng() % atoms.size()];
    pieces.push_back(p);
  }
  std::vector<bool> eog(pieces.size(), false);
  eog[5] = true;
  pieces[5].clear();
  TokenVocab v(pieces, eog);
  auto g = Grammar::parse(json_schema_to_gbnf(json::parse(R"({"type":"object"})")));
  ThreadPool pool(4);
  for (const float temperature : {0.0f, 0.8f}) {
    SCOPED_TRACE("temperature " + std::to_string(temperature));
    SamplingParams sp;
    sp.temperature = temperature;
    sp.seed = 5;
    const int n_rows = 6;
    auto shared_a = std::make_shared<GrammarAutomaton>(g), shared_b = std::make_shared<GrammarAutomaton>(g);
    std::vector<std::unique_ptr<Sampler>> sa, sb;
    std::vector<std::unique_ptr<GrammarMatcher>> ma, mb;
    std::vector<std::vector<int32_t>> ha(n_rows), hb(n_rows);
    for (int i = 0; i < n_rows; ++i) {
      SamplingParams p = sp;
      p.seed = sp.seed + (uint64_t)i;
      sa.push_back(std::make_unique<Sampler>(p, v.n_vocab()));
      sb.push_back(std::make_unique<Sampler>(p, v.n_vocab()));
      ma.push_back(std::make_unique<GrammarMatcher>(shared_a));
      mb.push_back(std::make_unique<GrammarMatcher>(shared_b));
    }
    std::vector<std::vector<float>> logits(n_rows, std::vector<float>((size_t)v.n_vocab()));
    std::vector<float> scratch;
    int masked = 0, ties = 0;
    for (int step = 0; step < 30; ++step) {
      std::vector<GrammarRow> rows;
      for (int i = 0; i < n_rows; ++i) {
        for (float& x : logits[(size_t)i]) x = (float)(rng() % 64) * 0.25f;  // coarse values: ties happen
        if (i == 0 && step % 3 == 0) std::fill(logits[0].begin(), logits[0].end(), 1.0f);  // every token tied
        ties += i == 0 && step % 3 == 0;
        rows.push_back({sb[(size_t)i].get(), mb[(size_t)i].get(), logits[(size_t)i].data(), &hb[(size_t)i], -1});
      }
      sample_rows_with_grammar(rows, v, &pool);
      for (int i = 0; i < n_rows; ++i) {
        const auto& l = logits[(size_t)i];
        const int32_t raw_best = (int32_t)(std::max_element(l.begin(), l.end()) - l.begin());
        masked += !ma[(size_t)i]->token_allowed(v, raw_best);  // greedy: this row takes the masked path
        const int32_t want = sample_with_grammar(*sa[(size_t)i], *ma[(size_t)i], v, logits[(size_t)i].data(), ha[(size_t)i], scratch);
        ASSERT_EQ(rows[(size_t)i].token, want) << "step " << step << " row " << i;
        if (want < 0) continue;
        ma[(size_t)i]->accept_token(v, want);
        mb[(size_t)i]->accept_token(v, want);
        ha[(size_t)i].push_back(want);
        hb[(size_t)i].push_back(want);
      }
    }
    EXPECT_GT(masked, 20);  // most picks went through a mask
    EXPECT_GT(ties, 0);
  }
}
