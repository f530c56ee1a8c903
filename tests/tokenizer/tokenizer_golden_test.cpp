// Token ids of every tokenizer in ../shared/testdata against goldens made by the reference
// implementations (scripts/goldens/gen_tokenizer_goldens.mjs): one differing id fails the test.
#include <gtest/gtest.h>

#include "tokenizer/tokenizer_test_util.h"

namespace roofline {
namespace {

std::string ids_str(const std::vector<int32_t>& v) {
  std::string s;
  for (auto x : v) s += std::to_string(x) + " ";
  return s;
}

std::string escaped(const std::string& s) { return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }

class TokenizerGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(TokenizerGolden, MatchesReferenceIds) {
  const std::string name = GetParam();
  if (test::shared_dir().empty()) GTEST_SKIP() << "../shared is absent; skipping tokenizer " << name;
  auto tok = test::load_test_tokenizer(name);
  ASSERT_TRUE(tok);
  const auto golden = test::load_golden("tok_" + name + ".json");
  const bool parse_special = golden.value("parse_special", true);
  int failures = 0;
  for (const auto& c : golden["cases"]) {
    const std::string text = c["text"];
    const auto want = c["ids"].get<std::vector<int32_t>>();
    const auto got = tok->encode(text, false, parse_special);
    if (got != want) {
      ++failures;
      ADD_FAILURE() << name << " text " << escaped(text) << "\n  want " << ids_str(want) << "\n  got  " << ids_str(got);
    }
    const auto want_add = c["ids_add"].get<std::vector<int32_t>>();
    const auto got_add = tok->encode(text, true, parse_special);
    if (got_add != want_add) {
      ++failures;
      ADD_FAILURE() << name << " (add special) text " << escaped(text) << "\n  want " << ids_str(want_add) << "\n  got  "
                    << ids_str(got_add);
    }
    if (c.contains("decoded")) {
      const std::string want_text = c["decoded"];
      const std::string got_text = tok->decode(want);
      if (got_text != want_text) {
        ++failures;
        ADD_FAILURE() << name << " decode of " << escaped(text) << "\n  want " << escaped(want_text) << "\n  got  "
                      << escaped(got_text);
      }
    }
    if (failures > 20) FAIL() << "too many failures";
  }
}

INSTANTIATE_TEST_SUITE_P(All, TokenizerGolden,
                         ::testing::Values("qwen3", "llama3_1", "gemma3", "gpt-2", "llama-spm", "phi-3", "tok512"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (auto& ch : n)
                             if (!isalnum((unsigned char)ch)) ch = '_';
                           return n;
                         });

}  // namespace
}  // namespace roofline
