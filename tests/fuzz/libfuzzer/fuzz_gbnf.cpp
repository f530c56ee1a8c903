// libFuzzer target: GBNF text (up to the input's first NUL) parsed, then the rest of the input fed to a
// matcher byte by byte, with a token mask at each step over a small vocabulary. A token the mask allows
// must be accepted (accept_token checks it), and a grammar must parse or fail with GrammarError.
#include <cstdint>
#include <string>
#include <vector>

#include "serve/grammar.h"
#include "serve/grammar_matcher.h"
#include "tests/fuzz/libfuzzer/fuzz_common.h"

using namespace roofline;
using namespace roofline::serve;

namespace {

const TokenVocab& vocab() {
  static const TokenVocab v = [] {
    std::vector<std::string> pieces = {"", "{", "}", "\"", "\":", ", ", "[", "]", "true", "false", "null", "0", "12", "-", ".5",
                                       "e+", "a", "ab", "abc", " ", "\n", "\\", "\\u00", "\xC3", "\xA9", "\xC3\xA9", "\xE2\x82\xAC",
                                       "\xF0\x9F", "\x98\x80", "\xFF", "<tool_call>", "x y"};
    for (int b = 0; b < 128; b += 7) pieces.push_back(std::string(1, (char)b));
    std::vector<bool> eog(pieces.size(), false);
    eog[0] = true;  // an end-of-generation token without bytes
    return TokenVocab(pieces, eog);
  }();
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto [text, bytes] = fuzz::split_at_nul({reinterpret_cast<const char*>(data), size});
  try {
    GrammarMatcher m(Grammar::parse(text));
    const TokenVocab& v = vocab();
    for (size_t i = 0; i < bytes.size(); ++i) {
      const std::vector<uint64_t>& mask = m.mask(v);
      // Byte i picks one of the allowed tokens (if any), else is fed as a byte.
      std::vector<int32_t> allowed;
      for (int32_t t = 0; t < v.n_vocab(); ++t)
        if (mask[(size_t)t / 64] >> (t % 64) & 1) allowed.push_back(t);
      const uint8_t b = (uint8_t)bytes[i];
      if (b & 0x80 && !allowed.empty()) {
        const int32_t t = allowed[b % allowed.size()];
        if (!m.token_allowed(v, t)) fuzz::defect("gbnf", "the mask allows a token that token_allowed refuses");
        if (v.is_eog(t)) break;
        m.accept_token(v, t);
      } else if (!m.accept_bytes(std::string_view(&bytes[i], 1))) {
        m.is_complete();
        m.can_continue();
      }
    }
  } catch (const GrammarError&) {
  } catch (const Error& e) {
    fuzz::defect("gbnf", e.what());  // InternalError included: a check of ours failed
  } catch (const std::exception& e) {
    fuzz::defect("gbnf", e.what());
  }
  return 0;
}
