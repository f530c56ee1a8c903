// Structured output end to end over HTTP on the real engine (CPU, the tiny synthetic Qwen3 model with
// random weights, so nothing but the grammar makes the output JSON): response_format json_schema for
// several schemas (nested objects, arrays, enums, anyOf, optional properties, $ref, prefixItems, a
// date), whole and streamed, greedy and sampled, on chat and completions; json_object; llama-server's
// json_schema and GBNF grammar on /completion and the OpenAI routes; tool_choice "required" and a
// named function giving valid calls (finish_reason "tool_calls"); and the 400s for what is not
// supported. Every output must parse and validate against its schema.
#include <gtest/gtest.h>

#include <thread>
#include <httplib.h>

#include <regex>

#include "serve/sse_util.h"
#include "engine/engine.h"
#include "model/model_file.h"
#include "schema_validate.h"
#include "serve/server.h"
#include "tokenizer/tokenizer_test_util.h"

using namespace roofline;
using namespace roofline::serve;

namespace {

std::shared_ptr<const Model> tiny_model() {
  static std::shared_ptr<const Model> m = Model::load(open_model_file("synthetic:tiny-qwen3:F32"));
  return m;
}

std::vector<json> sse_payloads(const std::string& stream) { return roofline::test::sse_payloads<json>(stream); }

const char* kSchemas[] = {
    // Nested objects.
    R"({"type":"object","properties":{"id":{"type":"integer"},"user":{"type":"object","properties":{
       "name":{"type":"string","maxLength":6},"admin":{"type":"boolean"}},"required":["name","admin"]}},"required":["id","user"]})",
    // An array of objects with an optional property.
    R"({"type":"array","items":{"type":"object","properties":{"x":{"type":"number"},"ok":{"type":"boolean"}},"required":["x"]},
       "minItems":1,"maxItems":3})",
    // Enums, anyOf, optional properties.
    R"({"type":"object","properties":{"color":{"enum":["red","green","blue"]},"size":{"anyOf":[{"type":"integer"},{"type":"null"},
       {"type":"string","maxLength":4}]},"note":{"type":"string","maxLength":5}},"required":["color"]})",
    // $ref, prefixItems, a date.
    R"({"type":"object","properties":{"when":{"type":"string","format":"date"},"pair":{"type":"array","prefixItems":[
       {"type":"boolean"},{"$ref":"#/$defs/small"}],"items":false,"minItems":2}},"required":["when","pair"],
       "$defs":{"small":{"enum":[1,2,3]}}})",
};

class StructuredOutput : public ::testing::Test {
 protected:
  void SetUp() override {
    const Model& model = *tiny_model();
    mc.tokenizer = Tokenizer::from_metadata(model.metadata());
    mc.chat_template_source = chat_template_from_metadata(model.metadata());
    mc.chat_template = std::make_unique<ChatTemplate>(mc.chat_template_source);
    mc.model_id = "tiny";
    mc.n_ctx = 2048;
    mc.n_vocab = model.hparams().n_vocab;
    EngineOptions o;
    o.n_ctx = 2048;
    o.n_batch = 64;
    o.kv_block_size = 16;
    o.n_threads = 2;
    o.n_seq_max = 4;
    engine = Engine::create(tiny_model(), o);
    runner = std::make_unique<EngineRunner>(*engine);
    text = std::make_unique<TokenizerText>(mc.tokenizer);
    SchedulerOptions so;
    so.n_slots = 4;
    so.queue_size = 8;
    scheduler = std::make_unique<Scheduler>(*runner, *text, so, &metrics);
    ServerOptions opt;
    opt.port = 0;
    server = std::make_unique<Server>(opt);
    port = server->bind();
    server->start();
    scheduler->start();
    server->set_ready(&mc, scheduler.get(), &metrics);
  }
  void TearDown() override {
    scheduler->stop(true);
    scheduler->join();
    server->stop();
  }
  std::pair<int, std::string> post(const std::string& path, const json& body) {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(120, 0);
    auto r = c.Post(path, body.dump(), "application/json");
    if (!r) return {0, ""};
    return {r->status, r->body};
  }
  static json chat(const json& extra) {
    json b = {{"messages", json::array({json{{"role", "user"}, {"content", "Give me JSON."}}})}, {"max_tokens", 1500}};
    for (auto it = extra.begin(); it != extra.end(); ++it) b[it.key()] = it.value();
    return b;
  }
  // The content of a whole or streamed chat answer, and its finish reason.
  static std::pair<std::string, std::string> chat_content(const std::string& body, bool stream) {
    if (!stream) {
      const json j = json::parse(body);
      return {j["choices"][0]["message"]["content"].get<std::string>(), j["choices"][0]["finish_reason"].get<std::string>()};
    }
    std::string content, finish;
    for (const json& p : sse_payloads(body)) {
      if (p["choices"].empty()) continue;
      const json& ch = p["choices"][0];
      if (ch["delta"].contains("content") && ch["delta"]["content"].is_string()) content += ch["delta"]["content"].get<std::string>();
      if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"].get<std::string>();
    }
    return {content, finish};
  }

  ModelContext mc;
  Metrics metrics;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<EngineRunner> runner;
  std::unique_ptr<TokenizerText> text;
  std::unique_ptr<Scheduler> scheduler;
  std::unique_ptr<Server> server;
  int port = 0;
};

}  // namespace

TEST_F(StructuredOutput, ChatJsonSchemaOutputsValidateWholeAndStreamed) {
  for (const char* schema_text : kSchemas) {
    const json schema = json::parse(schema_text);
    for (int variant = 0; variant < 4; ++variant) {
      const bool stream = variant % 2 == 1;
      json extra = {{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "t"}, {"schema", schema}, {"strict", true}}}}},
                    {"stream", stream}};
      if (variant < 2) extra["temperature"] = 0;
      else extra.update(json{{"temperature", 1.0}, {"top_k", 0}, {"top_p", 1.0}, {"min_p", 0.0}, {"seed", 17 + variant}});
      SCOPED_TRACE(std::string(schema_text).substr(0, 60) + " variant " + std::to_string(variant));
      auto [status, body] = post("/v1/chat/completions", chat(extra));
      ASSERT_EQ(status, 200) << body;
      auto [content, finish] = chat_content(body, stream);
      EXPECT_EQ(finish, "stop") << content;
      const json doc = json::parse(content, nullptr, false);
      ASSERT_FALSE(doc.is_discarded()) << "not JSON: " << content;
      EXPECT_EQ(serve::test::validate_schema(doc, schema), "") << content;
    }
  }
}

// Four constrained requests at once: their rows of each step are sampled together on the pool
// (sample_rows_with_grammar) and each answer is the one the request gets alone (greedy), valid JSON.
TEST_F(StructuredOutput, ConcurrentConstrainedRequestsAnswerAsAlone) {
  const json schema = json::parse(kSchemas[0]);
  auto body_for = [&](int i) {
    json b = chat({{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "t"}, {"schema", schema}}}}}, {"temperature", 0}});
    b["messages"][0]["content"] = "Give me JSON number " + std::to_string(i) + ".";
    return b;
  };
  std::vector<std::string> alone(4), together(4);
  for (int i = 0; i < 4; ++i) {
    auto [status, body] = post("/v1/chat/completions", body_for(i));
    ASSERT_EQ(status, 200) << body;
    alone[(size_t)i] = chat_content(body, false).first;
  }
  std::vector<std::thread> clients;
  std::vector<int> statuses(4, 0);
  for (int i = 0; i < 4; ++i)
    clients.emplace_back([&, i] {
      auto [status, body] = post("/v1/chat/completions", body_for(i));
      statuses[(size_t)i] = status;
      if (status == 200) together[(size_t)i] = chat_content(body, false).first;
    });
  for (auto& t : clients) t.join();
  for (int i = 0; i < 4; ++i) {
    ASSERT_EQ(statuses[(size_t)i], 200);
    EXPECT_EQ(together[(size_t)i], alone[(size_t)i]) << "request " << i;
    const json doc = json::parse(together[(size_t)i], nullptr, false);
    ASSERT_FALSE(doc.is_discarded()) << together[(size_t)i];
    EXPECT_EQ(serve::test::validate_schema(doc, schema), "");
  }
}

TEST_F(StructuredOutput, CompletionsJsonObjectAndNativeFields) {
  // /v1/completions with a schema.
  const json schema = json::parse(kSchemas[2]);
  auto [status, body] = post("/v1/completions", json{{"prompt", "JSON:"}, {"max_tokens", 1500}, {"temperature", 0.7}, {"seed", 3},
                                                     {"response_format", {{"type", "json_schema"}, {"json_schema", {{"schema", schema}}}}}});
  ASSERT_EQ(status, 200) << body;
  json j = json::parse(body);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(serve::test::validate_schema(json::parse(j["choices"][0]["text"].get<std::string>()), schema), "") << j.dump();

  // json_object: any object (a bias towards closing quotes and braces keeps random weights short).
  const std::string quote = std::to_string(mc.tokenizer->encode("\"", false, false)[0]);
  const std::string brace = std::to_string(mc.tokenizer->encode("}", false, false)[0]);
  for (bool stream : {false, true}) {
    std::tie(status, body) = post("/v1/chat/completions", chat({{"response_format", {{"type", "json_object"}}}, {"stream", stream},
                                                                {"seed", 5}, {"logit_bias", {{quote, 4}, {brace, 4}}}}));
    ASSERT_EQ(status, 200) << body;
    auto [content, finish] = chat_content(body, stream);
    EXPECT_EQ(finish, "stop");
    const json doc = json::parse(content, nullptr, false);
    EXPECT_TRUE(doc.is_object()) << content;
  }

  // llama-server's native /completion: json_schema and a GBNF grammar.
  std::tie(status, body) = post("/completion", json{{"prompt", "x"}, {"n_predict", 1500}, {"json_schema", json::parse(kSchemas[3])}});
  ASSERT_EQ(status, 200) << body;
  j = json::parse(body);
  EXPECT_EQ(serve::test::validate_schema(json::parse(j["content"].get<std::string>()), json::parse(kSchemas[3])), "") << j["content"];
  for (int seed = 0; seed < 3; ++seed) {
    std::tie(status, body) = post("/completion", json{{"prompt", "x"}, {"n_predict", 50}, {"seed", seed}, {"temperature", 1.0},
                                                      {"grammar", "root ::= code \"-\" [a-z]{2} | \"none\"\ncode ::= [0-9]{3}"}});
    ASSERT_EQ(status, 200) << body;
    j = json::parse(body);
    EXPECT_TRUE(std::regex_match(j["content"].get<std::string>(), std::regex("[0-9]{3}-[a-z]{2}|none"))) << j["content"];
    EXPECT_TRUE(j["stop"].get<bool>());
  }
  // The OpenAI routes take llama-server's fields too.
  std::tie(status, body) = post("/v1/chat/completions", chat({{"grammar", "root ::= \"yes\" | \"no\""}, {"temperature", 0}}));
  ASSERT_EQ(status, 200) << body;
  const std::string yn = chat_content(body, false).first;
  EXPECT_TRUE(yn == "yes" || yn == "no") << yn;
}

TEST_F(StructuredOutput, ToolChoiceRequiredAndNamedGiveValidCalls) {
  const json tools = json::parse(R"([
    {"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{
       "city":{"type":"string","maxLength":8},"unit":{"enum":["C","F"]}},"required":["city"]}}},
    {"type":"function","function":{"name":"get_time","parameters":{"type":"object","properties":{}}}}])");
  const std::map<std::string, json> params = {{"get_weather", tools[0]["function"]["parameters"]},
                                              {"get_time", tools[1]["function"]["parameters"]}};
  for (int variant = 0; variant < 6; ++variant) {
    const bool stream = variant % 2 == 1;
    const bool named = variant >= 4;
    json extra = {{"tools", tools}, {"stream", stream}, {"seed", 100 + variant}, {"temperature", variant < 2 ? 0.0 : 1.0}};
    extra["tool_choice"] = named ? json{{"type", "function"}, {"function", {{"name", "get_weather"}}}} : json("required");
    SCOPED_TRACE("variant " + std::to_string(variant));
    auto [status, body] = post("/v1/chat/completions", chat(extra));
    ASSERT_EQ(status, 200) << body;
    std::vector<std::pair<std::string, std::string>> calls;  // name, arguments
    std::string finish;
    if (!stream) {
      const json j = json::parse(body);
      const json& msg = j["choices"][0]["message"];
      finish = j["choices"][0]["finish_reason"];
      EXPECT_TRUE(msg["content"].is_null() || msg["content"] == "") << msg.dump();
      for (const json& c : msg["tool_calls"]) calls.push_back({c["function"]["name"], c["function"]["arguments"]});
    } else {
      for (const json& p : sse_payloads(body)) {
        if (p["choices"].empty()) continue;
        const json& ch = p["choices"][0];
        if (ch["delta"].contains("tool_calls"))
          for (const json& c : ch["delta"]["tool_calls"]) {
            const size_t k = c["index"].get<size_t>();
            if (calls.size() <= k) calls.resize(k + 1);
            if (c["function"].contains("name")) calls[k].first += c["function"]["name"].get<std::string>();
            if (c["function"].contains("arguments")) calls[k].second += c["function"]["arguments"].get<std::string>();
          }
        if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
      }
    }
    EXPECT_EQ(finish, "tool_calls") << body;
    ASSERT_FALSE(calls.empty()) << body;
    if (named) {
      EXPECT_EQ(calls.size(), 1u);
    }
    for (const auto& [name, args] : calls) {
      ASSERT_TRUE(params.count(name)) << name;
      if (named) {
        EXPECT_EQ(name, "get_weather");
      }
      const json a = json::parse(args, nullptr, false);
      ASSERT_FALSE(a.is_discarded()) << args;
      EXPECT_EQ(serve::test::validate_schema(a, params.at(name)), "") << args;
    }
  }
}

TEST_F(StructuredOutput, UnsupportedSchemasAndBadGrammarsAre400) {
  auto error_of = [&](const std::string& path, const json& body) -> json {
    auto [status, text] = post(path, body);
    EXPECT_EQ(status, 400) << text;
    const json j = json::parse(text, nullptr, false);
    return j.is_discarded() ? json() : j["error"];
  };
  json e = error_of("/v1/chat/completions",
                    chat({{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "t"}, {"schema", json::parse(
                        R"({"type":"object","properties":{"n":{"type":"string","pattern":"^a"}}})")}}}}}}));
  EXPECT_EQ(e["type"], "invalid_request_error");
  EXPECT_NE(e["message"].get<std::string>().find("'pattern'"), std::string::npos) << e.dump();
  EXPECT_NE(e["message"].get<std::string>().find("/properties/n/pattern"), std::string::npos) << e.dump();
  e = error_of("/completion", json{{"prompt", "x"}, {"json_schema", json::parse(R"({"type":"number","multipleOf":2})")}});
  EXPECT_NE(e["message"].get<std::string>().find("multipleOf"), std::string::npos) << e.dump();
  e = error_of("/completion", json{{"prompt", "x"}, {"grammar", "root ::= \"a\" | undefined-rule"}});
  EXPECT_NE(e["message"].get<std::string>().find("undefined-rule"), std::string::npos) << e.dump();
  EXPECT_EQ(e["param"], "grammar");
  e = error_of("/v1/completions", json{{"prompt", "x"}, {"grammar", "root ::= [a-"}});
  EXPECT_NE(e["message"].get<std::string>().find("line 1"), std::string::npos) << e.dump();
  e = error_of("/v1/chat/completions", chat({{"response_format", {{"type", "json_object"}}}, {"grammar", "root ::= \"a\""}}));
  EXPECT_NE(e["message"].get<std::string>().find("send one"), std::string::npos) << e.dump();
  e = error_of("/v1/chat/completions", chat({{"response_format", {{"type", "json_schema"}}}}));
  EXPECT_EQ(e["param"], "response_format.json_schema");
}

// With a thinking template (the real Qwen3 one), constrained output asks the template for the answer
// without reasoning (enable_thinking false) unless the request sets it; the output is content.
TEST(StructuredOutputRequest, ThinkingTemplatesAnswerWithoutReasoning) {
  ROOFLINE_SHARED_PATH_OR_SKIP(td, "testdata");
  ModelContext mc;
  mc.tokenizer = roofline::test::load_test_tokenizer("qwen3");
  ASSERT_TRUE(mc.tokenizer);
  mc.chat_template_source =
      json::parse(roofline::test::read_text_file(td + "/tokenizer/qwen3/tokenizer_config.json"))["chat_template"].get<std::string>();
  mc.chat_template = std::make_unique<ChatTemplate>(mc.chat_template_source);
  mc.thinking_template = true;
  mc.n_vocab = mc.tokenizer->n_vocab();
  mc.n_ctx = 4096;
  auto ends_with = [](const std::string& s, const std::string& tail) {
    return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
  };
  const std::string base = R"({"messages":[{"role":"user","content":"JSON please"}])";
  ApiRequest plain = parse_chat_request(parse_body(base + "}"), mc);
  EXPECT_FALSE(plain.gen.grammar);
  EXPECT_TRUE(ends_with(plain.prompt_text, "<|im_start|>assistant\n")) << plain.prompt_text;
  ApiRequest constrained = parse_chat_request(parse_body(base + R"(,"response_format":{"type":"json_object"}})"), mc);
  EXPECT_TRUE(constrained.gen.grammar);
  EXPECT_TRUE(ends_with(constrained.prompt_text, "<think>\n\n</think>\n\n")) << constrained.prompt_text;
  ApiRequest asked = parse_chat_request(
      parse_body(base + R"(,"response_format":{"type":"json_object"},"chat_template_kwargs":{"enable_thinking":true}})"), mc);
  EXPECT_TRUE(ends_with(asked.prompt_text, "<|im_start|>assistant\n")) << asked.prompt_text;
}
