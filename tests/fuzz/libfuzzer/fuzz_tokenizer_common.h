// Shared by the tokenizer fuzz targets (fuzz_tokenize, fuzz_vocab, fuzz_tokenizer_files): what every
// tokenizer must do with any text, whatever vocabulary it was loaded from. Encoding never throws and
// gives ids of the vocabulary; decoding them never throws; the streamed decode (what the server sends
// token by token) is valid UTF-8 and, where the whole decode is valid UTF-8, the same text.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tests/fuzz/libfuzzer/fuzz_common.h"
#include "tokenizer/stream_decoder.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace roofline::fuzz {

// Runs encode (plain, and with specials added and parsed), decode and the stream decoder over `text`;
// returns the ids of the plain encoding. Any exception is a defect: a loaded tokenizer takes any text.
inline std::vector<int32_t> exercise_tokenizer(const std::shared_ptr<const Tokenizer>& tok, std::string_view text) {
  std::vector<int32_t> plain;
  try {
    for (int mode = 0; mode < 2; ++mode) {
      const std::vector<int32_t> ids = tok->encode(text, mode == 1, mode == 1);
      for (int32_t id : ids)
        if (id < 0 || id >= tok->n_vocab()) defect("encode", "an id outside the vocabulary");
      const std::string whole = tok->decode(ids, false);
      (void)tok->decode(ids, true);
      StreamDecoder stream(tok, true, true);
      std::string streamed;
      for (int32_t id : ids) streamed += stream.push(id);
      streamed += stream.flush();
      if (!unicode::is_valid_utf8(streamed)) defect("StreamDecoder", "invalid UTF-8 came out");
      if (unicode::is_valid_utf8(whole) && streamed != whole) defect("StreamDecoder", "the stream differs from decode");
      if (mode == 0) plain = ids;
    }
  } catch (const std::exception& e) {
    defect("encode/decode", e.what());
  }
  return plain;
}

}  // namespace roofline::fuzz
