// ChatSession: a conversation keeps one sequence and feeds only the new turn's tokens (on a model with
// recurrent layers too); when the re-rendered history departs from what was fed, the KV cache is cut
// back (attention-only models) or the sequence starts over (qwen35), and every reply equals greedy
// generation from a fresh sequence fed the whole rendered history; oldest turns make room in a full
// context; the system prompt survives /clear.
#include <gtest/gtest.h>

#include "core/error.h"
#include "engine/chat_session.h"
#include "model/model_file.h"

namespace roofline {
namespace {

using json = nlohmann::ordered_json;

struct ChatFixture {
  std::shared_ptr<const Model> model;
  std::unique_ptr<Engine> engine;
  std::shared_ptr<const Tokenizer> tokenizer;
  std::shared_ptr<const ChatTemplate> tmpl;
};

ChatFixture make(const std::string& shape, int n_ctx = 1024) {
  ChatFixture s;
  s.model = Model::load(open_model_file("synthetic:" + shape + ":Q8_0"));
  EngineOptions o;
  o.n_ctx = n_ctx;
  o.n_threads = 2;
  o.n_seq_max = 2;  // the session's sequence and a reference one
  s.engine = Engine::create(s.model, o);
  s.tokenizer = Tokenizer::from_metadata(s.model->metadata());
  s.tmpl = std::make_shared<ChatTemplate>(chat_template_from_metadata(s.model->metadata()));
  return s;
}

ChatSession::Options greedy(int n_predict) {
  ChatSession::Options o;
  o.n_predict = n_predict;
  o.sampling.temperature = 0;
  o.sampling.repeat_penalty = 1;
  return o;
}

std::string reply_text(ChatSession& c, const std::string& message, ChatTurnStats* stats = nullptr) {
  std::string out;
  const ChatTurnStats st = c.reply(message, [&](const std::string& t) { out += t; });
  if (stats) *stats = st;
  return out;
}

class ChatSessionTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ChatSessionTest, FeedsOnlyTheNewTurn) {
  ChatFixture s = make(GetParam());
  ChatSession::Options o = greedy(5);
  // Replies of one repeated letter re-tokenize exactly, so the history's rendering extends what was fed.
  const std::vector<int32_t> a = s.tokenizer->encode("a", false, false);
  ASSERT_EQ(a.size(), 1u);
  o.sampling.logit_bias.push_back({a[0], 1000.0f});
  o.system_prompt = "You are terse.";
  ChatSession c(*s.engine, s.tokenizer, s.tmpl, o);
  ChatTurnStats t1, t2, t3;
  EXPECT_EQ(reply_text(c, "Hello there", &t1), "aaaaa");
  EXPECT_EQ(t1.reused_tokens, 0);
  EXPECT_EQ(t1.fed_tokens, t1.prompt_tokens);
  EXPECT_EQ(c.sequence_length(), t1.prompt_tokens + 4);  // the last reply token is not fed yet
  EXPECT_EQ(reply_text(c, "And again", &t2), "aaaaa");
  EXPECT_FALSE(t2.fresh_sequence);
  EXPECT_EQ(t2.reused_tokens, t1.prompt_tokens + 4);
  EXPECT_EQ(t2.fed_tokens, t2.prompt_tokens - t2.reused_tokens);
  EXPECT_LT(t2.fed_tokens, t2.prompt_tokens / 2);
  reply_text(c, "Third", &t3);
  EXPECT_EQ(t3.reused_tokens, t2.prompt_tokens + 4);
  ASSERT_EQ(c.messages().size(), 7u);
  EXPECT_EQ(c.messages()[0]["role"], "system");
  EXPECT_EQ(c.messages()[6]["content"], "aaaaa");
}

// Whatever was reused, cut back or started over, each reply is what a fresh sequence fed the whole
// rendered history generates.
TEST_P(ChatSessionTest, RepliesMatchAFreshEvaluationOfTheHistory) {
  ChatFixture s = make(GetParam());
  const int n = 6;
  ChatSession c(*s.engine, s.tokenizer, s.tmpl, greedy(n));
  bool departed = false;
  for (const char* message : {"Hi", "Tell me more", "Why?"}) {
    ChatTurnStats st;
    const std::string got = reply_text(c, message, &st);
    departed = departed || st.fresh_sequence || (st.reused_tokens > 0 && st.reused_tokens < st.prompt_tokens - 1);
    json history = c.messages();
    history.erase(history.end() - 1);  // the reply just made
    const std::vector<int32_t> prompt = c.render(history, true);
    ASSERT_EQ((int)prompt.size(), st.prompt_tokens);
    const int seq = s.engine->memory().create_sequence(false);
    std::vector<float> logits = s.engine->eval(seq, prompt, false);
    std::string want;
    for (int i = 0; i < n; ++i) {
      const int32_t t = argmax_logits(logits.data(), s.engine->n_vocab());
      if (s.tokenizer->is_eog(t)) break;
      want += s.tokenizer->token_to_piece(t, false);
      const int32_t one[1] = {t};
      logits = s.engine->eval(seq, one, false);
    }
    s.engine->memory().free_sequence(seq);
    EXPECT_EQ(got, want) << "after \"" << message << "\"";
  }
  // Random weights write bytes that do not re-tokenize as generated: the history departed at least once.
  EXPECT_TRUE(departed);
}

TEST_P(ChatSessionTest, DropsOldestTurnsToFitTheContext) {
  ChatFixture s = make(GetParam(), 160);
  ChatSession::Options o = greedy(8);
  o.system_prompt = "sys";
  ChatSession c(*s.engine, s.tokenizer, s.tmpl, o);
  const std::string long_message(40, 'x');
  int dropped = 0;
  for (int turn = 0; turn < 6; ++turn) {
    ChatTurnStats st;
    reply_text(c, long_message + std::to_string(turn), &st);
    dropped += st.dropped_messages;
    EXPECT_LT(st.prompt_tokens + 8, 160);
  }
  EXPECT_GT(dropped, 0);
  EXPECT_EQ(c.messages()[0]["role"], "system");
  EXPECT_EQ(c.messages()[1]["role"], "user");  // whole exchanges go, the roles still alternate
  // A message that alone does not fit is refused and not kept.
  const size_t before = c.messages().size();
  EXPECT_THROW(reply_text(c, std::string(400, 'y')), Error);
  EXPECT_EQ(c.messages().size(), before);
  c.clear();
  ASSERT_EQ(c.messages().size(), 1u);
  EXPECT_EQ(c.messages()[0]["content"], "sys");
  ChatTurnStats st;
  reply_text(c, "again", &st);
  EXPECT_EQ(c.messages().size(), 3u);
}

INSTANTIATE_TEST_SUITE_P(Archs, ChatSessionTest, ::testing::Values("tiny-qwen3", "tiny-qwen35", "tiny-gemma3"),
                         [](const auto& info) {
                           return std::string(info.param == "tiny-qwen3" ? "Attention" : info.param == "tiny-qwen35" ? "Recurrent" : "SlidingWindow");
                         });

}  // namespace
}  // namespace roofline
