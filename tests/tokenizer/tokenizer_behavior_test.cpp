// Tokenizer behaviour beyond the goldens: decode round trips, streaming UTF-8, special-token
// switches, random bytes and invalid UTF-8 (no crash), and the speed of the Qwen3 tokenizer.
#include <gtest/gtest.h>

#include <chrono>
#include <random>

#include "core/error.h"
#include "formats/gguf.h"
#include "formats/hf_tokenizer.h"
#include "tokenizer/stream_decoder.h"
#include "tokenizer/tokenizer_test_util.h"
#include "tokenizer/unicode.h"

namespace roofline {
namespace {

std::vector<std::string> corpus() {
  std::vector<std::string> out;
  for (const auto& c : test::load_golden("tok_qwen3.json")["cases"]) out.push_back(c["text"]);
  return out;
}

#define LOAD_OR_SKIP(var, name)                                                          \
  if (test::shared_dir().empty()) GTEST_SKIP() << "../shared is absent; skipping " name; \
  auto var = test::load_test_tokenizer(name);                                            \
  ASSERT_TRUE(var)

TEST(TokenizerRoundTrip, ByteLevelDecodesToTheSameText) {
  if (test::shared_dir().empty()) GTEST_SKIP() << "../shared is absent";
  for (const char* name : {"gpt-2", "llama3_1", "qwen3"}) {
    auto tok = test::load_test_tokenizer(name);
    for (const std::string& text : corpus()) {
      // Qwen normalizes to NFC, so compare with the NFC form there.
      const std::string want = tok->pre_name() == "qwen2" ? unicode::nfc(text) : text;
      EXPECT_EQ(tok->decode(tok->encode(text, false, true)), want) << name << ": " << text;
    }
  }
}

TEST(TokenizerRoundTrip, SentencePieceDecodesToTheSameText) {
  if (test::shared_dir().empty()) GTEST_SKIP() << "../shared is absent";
  for (const char* name : {"llama-spm", "gemma3", "tok512"}) {
    auto tok = test::load_test_tokenizer(name);
    for (const std::string& text : corpus()) {
      if (text.find("\xE2\x96\x81") != std::string::npos) continue;  // U+2581 decodes to a space
      const auto ids = tok->encode(text, false, false);
      std::string got = tok->decode(ids);
      EXPECT_EQ(got, text) << name;
    }
  }
}

TEST(TokenizerStream, HoldsBackIncompleteUtf8) {
  LOAD_OR_SKIP(tok, "llama-spm");
  // Emoji and Khmer fall back to byte tokens in Llama 2's vocabulary.
  const std::string text = "Hi 🦙 and កាន់ 😁!";
  const auto ids = tok->encode(text, false, false);
  StreamDecoder dec(tok, false, true);
  std::string out;
  for (int32_t id : ids) {
    const std::string part = dec.push(id);
    EXPECT_TRUE(unicode::is_valid_utf8(part)) << "partial UTF-8 was emitted";
    out += part;
  }
  out += dec.flush();
  EXPECT_EQ(out, text);
  // A lone lead byte is held back, then replaced at flush.
  StreamDecoder raw(tok);
  EXPECT_EQ(raw.push_bytes("a\xF0\x9F"), "a");
  EXPECT_EQ(raw.pending_bytes(), 2u);
  EXPECT_EQ(raw.push_bytes("\xA6\x99"), "\xF0\x9F\xA6\x99");
  EXPECT_EQ(raw.push_bytes("\xFF" "b"), "\xEF\xBF\xBD" "b");
  EXPECT_EQ(raw.push_bytes("\xE2\x82"), "");
  EXPECT_EQ(raw.flush(), "\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST(TokenizerStream, ByteLevelEmojiSplitAcrossTokens) {
  LOAD_OR_SKIP(tok, "gpt-2");
  const std::string text = "emoji 🦙🚀 中文字";
  StreamDecoder dec(tok);
  std::string out;
  for (int32_t id : tok->encode(text, false, false)) {
    const std::string part = dec.push(id);
    EXPECT_TRUE(unicode::is_valid_utf8(part));
    out += part;
  }
  EXPECT_EQ(out + dec.flush(), text);
}

TEST(TokenizerSpecial, ParseSpecialSwitch) {
  LOAD_OR_SKIP(tok, "qwen3");
  const int32_t im_start = tok->find_token("<|im_start|>");
  ASSERT_GE(im_start, 0);
  auto with = tok->encode("<|im_start|>user", false, true);
  ASSERT_FALSE(with.empty());
  EXPECT_EQ(with[0], im_start);
  auto without = tok->encode("<|im_start|>user", false, false);
  EXPECT_EQ(std::count(without.begin(), without.end(), im_start), 0);
  EXPECT_EQ(tok->decode(without), "<|im_start|>user");
  // Added non-special tokens (<think>) are matched either way, as in Hugging Face.
  const int32_t think = tok->find_token("<think>");
  EXPECT_EQ(tok->encode("<think>", false, false), std::vector<int32_t>{think});
  EXPECT_TRUE(tok->is_eog(tok->find_token("<|im_end|>")));
  EXPECT_TRUE(tok->is_eog(tok->find_token("<|endoftext|>")));
  EXPECT_FALSE(tok->is_eog(im_start));
  EXPECT_EQ(tok->bos(), -1);
  EXPECT_FALSE(tok->add_bos());
}

TEST(TokenizerSpecial, BosEosFromMetadata) {
  LOAD_OR_SKIP(tok, "llama3_1");
  EXPECT_EQ(tok->bos(), 128000);
  EXPECT_TRUE(tok->add_bos());
  EXPECT_EQ(tok->eos(), 128009);  // <|eot_id|> in tokenizer_config.json
  EXPECT_EQ(tok->pre_name(), "llama-bpe");
  auto gemma = test::load_test_tokenizer("gemma3");
  EXPECT_EQ(gemma->bos(), 2);
  EXPECT_TRUE(gemma->add_bos());
  EXPECT_EQ(gemma->kind(), VocabKind::SpmBpe);
  EXPECT_TRUE(gemma->is_eog(gemma->find_token("<end_of_turn>")));
  auto spm = test::load_test_tokenizer("llama-spm");
  EXPECT_EQ(spm->kind(), VocabKind::Spm);
  EXPECT_EQ(spm->encode("", true, true), std::vector<int32_t>{1});
}

TEST(TokenizerFuzz, RandomBytesNeverCrash) {
  if (test::shared_dir().empty()) GTEST_SKIP() << "../shared is absent";
  std::mt19937 rng(1234);
  for (const char* name : {"qwen3", "llama3_1", "gemma3", "gpt-2", "llama-spm", "phi-3", "tok512"}) {
    auto tok = test::load_test_tokenizer(name);
    ASSERT_TRUE(tok);
    for (int iter = 0; iter < 300; ++iter) {
      std::string s(rng() % 64, '\0');
      for (auto& c : s) {
        const uint32_t r = rng() % 8;
        c = r < 3 ? (char)(rng() % 256) : r < 5 ? (char)(0x80 + rng() % 64) : r < 6 ? (char)(0xE0 + rng() % 32) : " a<|>\n"[rng() % 6];
      }
      std::vector<int32_t> ids;
      ASSERT_NO_THROW(ids = tok->encode(s, true, (iter & 1) != 0)) << name;
      for (int32_t id : ids) ASSERT_TRUE(id >= 0 && id < tok->n_vocab()) << name;
      std::string back;
      ASSERT_NO_THROW(back = tok->decode(ids, true)) << name;
      // Byte-level BPE keeps every byte, invalid UTF-8 included (Qwen's NFC touches valid text only).
      if (std::string(name) == "gpt-2") {
        EXPECT_EQ(back, s);
      }
    }
  }
}

// fuzz_vocab: a token typed as a byte token whose text is not "<0xHH>" threw std::invalid_argument out of
// token_to_piece (a model file may say anything). It stands for its text now; the others for their byte.
TEST(TokenizerErrors, ByteTokensWithOtherTextsStandForTheirText) {
  gguf::Metadata md;
  md.set("tokenizer.ggml.model", gguf::Value::string("llama"));
  md.set("tokenizer.ggml.tokens", gguf::Value::string_array({"<unk>", "<s>", "</s>", "<0xZZ>", "<0x4a>", "<0x41>", "<0x>"}));
  md.set("tokenizer.ggml.token_type", gguf::Value::i32_array({2, 3, 3, 6, 6, 6, 6}));
  auto tok = Tokenizer::from_metadata(md);
  EXPECT_EQ(tok->token_to_piece(3), "<0xZZ>");
  EXPECT_EQ(tok->token_to_piece(4), "J");
  EXPECT_EQ(tok->token_to_piece(5), "A");
  EXPECT_EQ(tok->token_to_piece(6), "<0x>");
  EXPECT_EQ(tok->decode({3, 5}), "<0xZZ>A");
}

// A token with no text at the start does not keep the space prefix of the first word from being dropped,
// in decode as in the stream decoder (fuzz_vocab compared the two).
TEST(TokenizerErrors, EmptyPiecesDoNotKeepTheLeadingSpace) {
  gguf::Metadata md;
  md.set("tokenizer.ggml.model", gguf::Value::string("llama"));
  md.set("tokenizer.ggml.tokens", gguf::Value::string_array({"<unk>", "<s>", "</s>", "", "\xE2\x96\x81hi"}));
  md.set("tokenizer.ggml.token_type", gguf::Value::i32_array({2, 3, 3, 1, 1}));
  auto tok = Tokenizer::from_metadata(md);
  ASSERT_TRUE(tok->add_space_prefix());
  EXPECT_EQ(tok->decode({3, 4}), "hi");
  StreamDecoder stream(tok, true, true);
  EXPECT_EQ(stream.push(3) + stream.push(4) + stream.flush(), "hi");
}

TEST(TokenizerErrors, BadFilesGiveClearErrors) {
  const std::string dir = test::temp_dir();
  {
    std::ofstream(dir + "/tokenizer.json") << "{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}";
    try {
      Tokenizer::from_file(dir + "/tokenizer.json");
      FAIL() << "expected an error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("Unigram"), std::string::npos) << e.what();
    }
  }
  {
    std::ofstream(dir + "/tokenizer.json")
        << R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "pre_tokenizer": {"type": "Sequence", "pretokenizers": [)"
           R"({"type": "Split", "pattern": {"Regex": "\\w+"}, "behavior": "Isolated"}, {"type": "ByteLevel", "use_regex": false}]}})";
    try {
      Tokenizer::from_file(dir + "/tokenizer.json");
      FAIL() << "expected an error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("unknown pre-tokenizer regex \\w+"), std::string::npos) << e.what();
    }
  }
  {
    // fuzz_tokenizer_files: a field of another JSON kind escaped as nlohmann's type_error.
    std::ofstream(dir + "/tokenizer.json")
        << R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "added_tokens": [{"id": 1, "content": 48}]})";
    try {
      Tokenizer::from_file(dir + "/tokenizer.json");
      FAIL() << "expected an error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("not laid out as a Hugging Face tokenizer"), std::string::npos) << e.what();
    }
  }
  {
    // fuzz_tokenizer_files: an added token's id of 1e70 went through nlohmann's float-to-int64 conversion
    // (undefined); only integer ids count, so that token is left out like one without an id.
    std::ofstream(dir + "/tokenizer.json")
        << R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": [], "byte_fallback": true},)"
           R"( "added_tokens": [{"id": 1e70, "content": "<x>"}, {"id": 2, "content": "<y>"}]})";
    auto tok = Tokenizer::from_file(dir + "/tokenizer.json");
    EXPECT_EQ(tok->n_vocab(), 3);
    EXPECT_EQ(tok->find_token("<x>"), -1);
    EXPECT_EQ(tok->find_token("<y>"), 2);
  }
  gguf::Metadata md;
  EXPECT_THROW(Tokenizer::from_metadata(md), Error);
  md.set("tokenizer.ggml.model", gguf::Value::string("bert"));
  md.set("tokenizer.ggml.tokens", gguf::Value::string_array({"a"}));
  EXPECT_THROW(Tokenizer::from_metadata(md), Error);
}

TEST(TokenizerPerf, Qwen3LoadsAndEncodesFast) {
  if (test::shared_dir().empty()) GTEST_SKIP() << "../shared is absent";
  // tokenizer.json -> GGUF vocabulary file -> load from GGUF (the path models take).
  gguf::Metadata md;
  add_hf_tokenizer_metadata(md, test::tokenizer_path("qwen3"));
  const std::string path = test::temp_dir() + "/qwen3-vocab.gguf";
  gguf::write_gguf(path, md, {});
  auto t0 = std::chrono::steady_clock::now();
  auto file = gguf::GgufFile::open(path);
  auto tok = Tokenizer::from_metadata(file->metadata());
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // ~1 MB of English: the GPL texts, repeated.
  std::string text;
  for (const char* f : {"/usr/share/common-licenses/GPL-3", "/usr/share/common-licenses/GPL-2", "/usr/share/common-licenses/Apache-2.0"})
    text += test::read_text_file(f);
  if (text.empty()) GTEST_SKIP() << "no /usr/share/common-licenses texts";
  while (text.size() < (1u << 20)) text += text;
  text.resize(1u << 20);
  t0 = std::chrono::steady_clock::now();
  const auto ids = tok->encode(text, false, true);
  const double enc_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("qwen3 vocabulary: load from GGUF %.3f s; encode 1 MiB of English %.3f s (%.1f MB/s, %zu tokens)\n", load_s,
              enc_s, 1.048576 / enc_s, ids.size());
  EXPECT_LT(load_s, 2.0);
  EXPECT_LT(enc_s, 2.0);
  EXPECT_EQ(tok->decode(ids), text);
}

}  // namespace
}  // namespace roofline
