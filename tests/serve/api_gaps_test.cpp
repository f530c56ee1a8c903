// API behaviour a client meets early, as OpenAI has it: a message without content is refused (an
// assistant message calling tools excepted), the error envelope's code is a string or null, the
// max_tokens message states the range the check applies, /v1/completions takes an array of prompts
// (one choice per prompt, n each, numbered prompt by prompt, usage summed), typical_p reaches the
// sampler, and a server started without --embeddings answers the embedding routes as llama-server
// does: 501 not_supported_error, in the envelope.
#include <gtest/gtest.h>
#include <httplib.h>

#include <memory>

#include "fake_runner.h"
#include "model/model_file.h"
#include "core/json_nesting.h"
#include "serve/api.h"
#include "serve/server.h"
#include "serve/tool_calls.h"
#include "tiny_model_context.h"

using namespace roofline;
using namespace roofline::serve;

namespace {

const ModelContext& context() {
  static std::unique_ptr<ModelContext> mc = tiny_qwen3_context();
  return *mc;
}

ApiError chat_error(const std::string& body) {
  try {
    parse_chat_request(parse_body(body), context());
  } catch (const ApiError& e) {
    return e;
  }
  return ApiError(200, "(accepted)");
}

TEST(ApiGaps, AMessageWithoutContentIsRefused) {
  for (const char* m : {R"({"role":"user"})", R"({"role":"user","content":null})", R"({"role":"system"})",
                        R"({"role":"assistant"})", R"({"role":"tool","tool_call_id":"c1"})"}) {
    const std::string body = std::string(R"({"messages":[{"role":"user","content":"hi"},)") + m + "]}";
    const ApiError e = chat_error(body);
    EXPECT_EQ(e.status, 400) << body;
    EXPECT_STREQ(e.what(), "'messages[1].content' is required (a string or an array of content parts)");
    EXPECT_EQ(e.param, "messages");
  }
  // An assistant message that calls tools may have no content (null or absent), as OpenAI allows.
  const char* calls = R"("tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}])";
  for (const std::string content : {"\"content\":null,", ""}) {
    const std::string body = std::string(R"({"messages":[{"role":"user","content":"hi"},{"role":"assistant",)") + content +
                             calls + R"(},{"role":"tool","tool_call_id":"c1","content":"42"}]})";
    const json messages = normalize_messages(parse_body(body)["messages"]);
    EXPECT_EQ(messages.size(), 3u) << body;
  }
  EXPECT_EQ(chat_error(R"({"messages":[{"role":"user","content":""}]})").status, 200);  // empty is content
}

// A body nested deeper than kMaxJsonNesting is a 400 before anything walks it (a hundred thousand
// levels in a message's extra field, or in a response_format schema, overflowed the stack of the
// server: tests/fuzz/libfuzzer); a tool call's arguments string nested that deep stays a string.
TEST(ApiGaps, JsonNestedPastTheBoundIsRefused) {
  auto nest = [](int d) { return std::string(d, '[') + std::string(d, ']'); };
  const ApiError e = chat_error(R"({"messages":[{"role":"user","content":"hi","x":)" + nest(100000) + "}]}");
  EXPECT_EQ(e.status, 400);
  EXPECT_NE(std::string(e.what()).find("more than 512 levels deep"), std::string::npos) << e.what();
  EXPECT_EQ(chat_error(R"({"messages":[{"role":"user","content":"hi","x":)" + nest(400) + "}]}").status, 200);
  EXPECT_EQ(json_nesting_depth(R"({"a":"[[[[","b":[{"c":"\"]]"}]})"), 3u);  // brackets in strings do not count
  const std::string deep_args = nest(600);
  json messages = json::array({{{"role", "assistant"}, {"content", ""},
                                {"tool_calls", json::array({{{"type", "function"}, {"function", {{"name", "f"}, {"arguments", deep_args}}}}})}}});
  EXPECT_EQ(normalize_chat_messages(messages)[0]["tool_calls"][0]["function"]["arguments"], deep_args);
  ParsedToolCall call;
  EXPECT_FALSE(parse_tool_call_body(R"({"name":"f","arguments":)" + nest(600) + "}", {"f"}, call));
}

TEST(ApiGaps, ErrorCodesAreStringsOrNull) {
  EXPECT_TRUE(error_body(400, "bad")["error"]["code"].is_null());
  EXPECT_TRUE(error_body(503, "Loading model")["error"]["code"].is_null());
  EXPECT_EQ(error_body(404, "no", "model", "model_not_found")["error"]["code"], "model_not_found");
  for (int status : {400, 401, 404, 413, 429, 500, 501, 503}) {
    const json code = error_body(status, "x")["error"]["code"];
    EXPECT_TRUE(code.is_null() || code.is_string()) << status;
  }
}

TEST(ApiGaps, MaxTokensMessageStatesTheRangeItChecks) {
  const std::string want = "'max_tokens' must be between 1 and 2147483647, or -1 for no limit (got ";
  for (const char* v : {"0", "-5", "2147483648"}) {
    const ApiError e = chat_error(std::string(R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":)") + v + "}");
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(std::string(e.what()), want + v + ")");
  }
  for (const char* v : {"-1", "1", "2147483647"})
    EXPECT_EQ(chat_error(std::string(R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":)") + v + "}").status, 200) << v;
}

TEST(ApiGaps, PromptArraysAndTypicalPParse) {
  ApiRequest r = parse_completion_request(parse_body(R"({"prompt":["ab",[72,105],"cde"],"n":2,"typical_p":0.5})"), context(),
                                          Endpoint::Completions);
  ASSERT_EQ(r.prompts.size(), 3u);
  EXPECT_EQ(r.n_choices(), 6);
  EXPECT_EQ(r.prompt_texts[1], "Hi");
  EXPECT_EQ(r.prompts[1], (std::vector<int32_t>{72, 105}));
  EXPECT_EQ(r.gen.prompt, r.prompts[0]);
  EXPECT_FLOAT_EQ(r.gen.sampling.typical_p, 0.5f);
  EXPECT_THROW(parse_completion_request(parse_body(R"({"prompt":["ab",""]})"), context(), Endpoint::Completions), ApiError);
  EXPECT_THROW(parse_completion_request(parse_body(R"({"prompt":["a","b"],"n":100})"), context(), Endpoint::Completions),
               ApiError);  // 200 choices
  r = parse_completion_request(parse_body(R"({"prompt":["ab"]})"), context(), Endpoint::Completions);
  EXPECT_TRUE(r.prompts.empty());  // a one-element array is one prompt
}

// Through HTTP, over the fake runner (each generated token is a letter by position).
class ApiGapsServer : public ::testing::Test {
 protected:
  void SetUp() override {
    mc = tiny_qwen3_context();
    runner = std::make_unique<roofline::serve::test::FakeRunner>(mc->n_vocab, 512, 4, 64);
    mc->n_ctx = runner->n_ctx();
    runner->next_token = [](const std::vector<int32_t>& content) { return (int32_t)('a' + content.size() % 26); };
    text = std::make_unique<TokenizerText>(mc->tokenizer);
    SchedulerOptions so;
    so.n_slots = 4;
    so.queue_size = 8;
    scheduler = std::make_unique<Scheduler>(*runner, *text, so, &metrics);
    ServerOptions opt;
    opt.port = 0;
    opt.n_slots = 4;
    opt.queue_size = 8;
    server = std::make_unique<Server>(opt);
    port = server->bind();
    server->start();
    scheduler->start();
    server->set_ready(mc.get(), scheduler.get(), &metrics);
  }
  void TearDown() override {
    scheduler->stop(true);
    scheduler->join();
    server->stop();
  }
  std::unique_ptr<ModelContext> mc;
  Metrics metrics;
  std::unique_ptr<roofline::serve::test::FakeRunner> runner;
  std::unique_ptr<TokenizerText> text;
  std::unique_ptr<Scheduler> scheduler;
  std::unique_ptr<Server> server;
  int port = 0;
};

TEST_F(ApiGapsServer, CompletionsTakeAnArrayOfPrompts) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(30, 0);
  auto r = c.Post("/v1/completions", R"({"model":"tiny","prompt":["ab","wxyz"],"max_tokens":3,"n":2,"echo":true,"temperature":0})",
                  "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json j = json::parse(r->body);
  ASSERT_EQ(j["choices"].size(), 4u) << r->body;
  for (int i = 0; i < 4; ++i) {
    const json& ch = j["choices"][i];
    EXPECT_EQ(ch["index"], i);
    // Content length decides the letters: prompt "ab" (2 tokens) continues "cde", "wxyz" (4) "efg".
    EXPECT_EQ(ch["text"], i < 2 ? "abcde" : "wxyzefg") << r->body;
    EXPECT_EQ(ch["finish_reason"], "length");
  }
  EXPECT_EQ(j["usage"]["prompt_tokens"], 2 + 4) << r->body;  // each prompt counted once, whatever n
  EXPECT_EQ(j["usage"]["completion_tokens"], 12);

  // Streamed: every choice index appears, and one [DONE] ends it.
  r = c.Post("/v1/completions", R"({"prompt":["ab","wxyz"],"max_tokens":3,"stream":true,"temperature":0})", "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  std::map<int, std::string> texts;
  size_t pos = 0, done = 0;
  while ((pos = r->body.find("data: ", pos)) != std::string::npos) {
    const size_t end = r->body.find("\n\n", pos);
    const std::string payload = r->body.substr(pos + 6, end - pos - 6);
    pos = end;
    if (payload == "[DONE]") {
      ++done;
      continue;
    }
    const json chunk = json::parse(payload);
    for (const json& ch : chunk["choices"]) texts[ch["index"].get<int>()] += ch["text"].get<std::string>();
  }
  EXPECT_EQ(done, 1u) << r->body;
  EXPECT_EQ(texts[0], "cde") << r->body;
  EXPECT_EQ(texts[1], "efg");
}

TEST_F(ApiGapsServer, EmbeddingsWithoutTheFlagAnswer501InTheEnvelope) {
  httplib::Client c("127.0.0.1", port);
  for (const char* path : {"/v1/embeddings", "/embeddings", "/embedding"}) {
    auto r = c.Post(path, R"({"model":"tiny","input":"hello"})", "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 501);
    const json e = json::parse(r->body)["error"];
    EXPECT_EQ(e["type"], "not_supported_error");
    EXPECT_TRUE(e["code"].is_null());
    EXPECT_EQ(e["message"], "This server does not support embeddings. Start it with `--embeddings`");
  }
}

}  // namespace
