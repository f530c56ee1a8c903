// Tool calls in the chat API: the Qwen3-format call parser (single, parallel, malformed, text around
// calls, unknown names, the stream split at every byte), tools / tool_choice validation (required and
// named choices constrain the output with a grammar; unknown names and missing tools are a 400), the agent round trip (assistant content null + tool_calls,
// tool results) rendered through the real Qwen3 template, responses built from injected model text
// (whole and streamed as OpenAI streams calls), and a server whose fake model emits a call.
#include <gtest/gtest.h>
#include <httplib.h>

#include <memory>
#include <set>

#include "serve/sse_util.h"
#include "fake_runner.h"
#include "model/model_file.h"
#include "serve/api.h"
#include "serve/server.h"
#include "serve/tool_calls.h"
#include "tokenizer/tokenizer_test_util.h"
#include "tiny_model_context.h"

using namespace roofline;
using namespace roofline::serve;

namespace {

const std::set<std::string> kNames = {"get_weather", "get_time"};

const char* kTools = R"([{"type":"function","function":{"name":"get_weather","description":"Weather of a city",
  "parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}},
  {"type":"function","function":{"name":"get_time","parameters":{"type":"object","properties":{}}}}])";

const char* kWeatherCall = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
const char* kTimeCall = "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";

const ModelContext& tiny() {
  static std::unique_ptr<ModelContext> mc = tiny_qwen3_context();
  return *mc;
}

std::string chat_body(const std::string& extra) {
  return std::string(R"({"messages":[{"role":"user","content":"Weather in Paris?"}],"tools":)") + kTools + extra + "}";
}

ApiError chat_error(const std::string& body) {
  try {
    parse_chat_request(parse_body(body), tiny());
  } catch (const ApiError& e) {
    return e;
  }
  return ApiError(200, "(accepted)");
}

Event text_event(std::string text, Finish f = Finish::None) {
  Event e;
  e.text = std::move(text);
  e.tokens = {65};
  e.finish = f;
  return e;
}

std::vector<json> payloads(const std::string& stream) { return roofline::test::sse_payloads<json>(stream); }

}  // namespace

TEST(ToolCallParser, SingleCallWithTextAround) {
  auto out = parse_tool_calls(std::string("Let me look.\n\n") + kWeatherCall, kNames);
  ASSERT_EQ(out.calls.size(), 1u);
  EXPECT_EQ(out.calls[0].name, "get_weather");
  EXPECT_EQ(out.calls[0].arguments, R"({"city":"Paris"})");
  EXPECT_EQ(out.content, "Let me look.");  // whitespace before the call and after the last dropped
  out = parse_tool_calls(std::string(kWeatherCall) + "\nDone, it seems.", kNames);
  ASSERT_EQ(out.calls.size(), 1u);
  EXPECT_EQ(out.content, "\nDone, it seems.");
  out = parse_tool_calls(std::string(kWeatherCall) + "\n", kNames);
  EXPECT_EQ(out.content, "");
}

TEST(ToolCallParser, ParallelCallsInOrder) {
  const auto out = parse_tool_calls(std::string(kWeatherCall) + "\n" + kTimeCall, kNames);
  ASSERT_EQ(out.calls.size(), 2u);
  EXPECT_EQ(out.calls[0].name, "get_weather");
  EXPECT_EQ(out.calls[1].name, "get_time");
  EXPECT_EQ(out.calls[1].arguments, "{}");
  EXPECT_EQ(out.content, "");
}

TEST(ToolCallParser, MalformedAndUnknownCallsStayContent) {
  const std::string cases[] = {
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": }\n</tool_call>",  // bad JSON
      "<tool_call>\n{\"name\": \"launch_rockets\", \"arguments\": {}}\n</tool_call>",        // not offered
      "<tool_call>\n{\"arguments\": {}}\n</tool_call>",                                      // no name
      "<tool_call>\n{\"name\": \"get_time\", \"arguments\": [1]}\n</tool_call>",             // not an object
      "<tool_call>\n[\"get_time\"]\n</tool_call>",                                           // not an object
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par",             // never closed
  };
  for (const std::string& c : cases) {
    const auto out = parse_tool_calls("Hi " + c, kNames);
    EXPECT_TRUE(out.calls.empty()) << c;
    EXPECT_EQ(out.content, "Hi " + c);
  }
  // A bad call beside a good one: the good one is a call, the bad one text.
  const std::string bad = "<tool_call>\n{oops}\n</tool_call>";
  const auto out = parse_tool_calls(bad + "\n" + kTimeCall, kNames);
  ASSERT_EQ(out.calls.size(), 1u);
  EXPECT_EQ(out.calls[0].name, "get_time");
  EXPECT_EQ(out.content, bad);
  // Arguments given as JSON text are accepted when that text is an object.
  const auto s = parse_tool_calls("<tool_call>{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\":\\\"Oslo\\\"}\"}</tool_call>", kNames);
  ASSERT_EQ(s.calls.size(), 1u);
  EXPECT_EQ(s.calls[0].arguments, R"({"city":"Oslo"})");
  // A partial tag at the very end is text.
  EXPECT_EQ(parse_tool_calls("a <tool_ca", kNames).content, "a <tool_ca");
  EXPECT_EQ(parse_tool_calls("plain text, no calls  \n", kNames).content, "plain text, no calls  \n");
}

TEST(ToolCallParser, StreamSplitAtEveryByteMatchesTheWholeParse) {
  const std::string text = std::string("Checking <both>.\n") + kWeatherCall + "\n" + kTimeCall +
                           "\n<tool_call>\n{\"name\": \"nope\"}\n</tool_call> and <tool_c";
  const auto whole = parse_tool_calls(text, kNames);
  ASSERT_EQ(whole.calls.size(), 2u);
  for (size_t a = 0; a <= text.size(); ++a) {
    for (size_t b = a; b <= text.size(); b += (a % 7 == 0 ? 1 : 13)) {  // every single split, many double splits
      ToolCallStream s(kNames);
      std::string content;
      std::vector<ParsedToolCall> calls;
      for (const std::string& piece : {text.substr(0, a), text.substr(a, b - a), text.substr(b)}) {
        auto o = s.push(piece);
        content += o.content;
        for (auto& c : o.calls) calls.push_back(c);
        // Nothing of a call's text leaks as content before the call settles.
        EXPECT_EQ(content.find("get_weather"), std::string::npos) << a << "," << b;
      }
      auto f = s.flush();
      content += f.content;
      for (auto& c : f.calls) calls.push_back(c);
      ASSERT_EQ(calls.size(), 2u) << a << "," << b;
      EXPECT_EQ(calls[0].arguments, whole.calls[0].arguments);
      EXPECT_EQ(calls[1].name, "get_time");
      EXPECT_EQ(content, whole.content) << a << "," << b;
    }
  }
  // Byte by byte: the content before the call is released before the call opens.
  ToolCallStream s(kNames);
  std::string early;
  const std::string t = std::string("Hello there") + kWeatherCall;
  for (size_t i = 0; i < 11; ++i) early += s.push(t.substr(i, 1)).content;
  EXPECT_EQ(early, "Hello there");
}

TEST(ToolChoice, ValidationRequiredAndNamedChoices) {
  EXPECT_EQ(chat_error(chat_body("")).status, 200);
  EXPECT_EQ(chat_error(chat_body(R"(,"tool_choice":"auto")")).status, 200);
  EXPECT_EQ(chat_error(chat_body(R"(,"tool_choice":"none")")).status, 200);
  const ApiRequest required = parse_chat_request(parse_body(chat_body(R"(,"tool_choice":"required")")), tiny());
  EXPECT_EQ(required.tools.choice, ToolChoice::Required);
  EXPECT_TRUE(required.gen.grammar);  // constrained to calls
  const ApiRequest named =
      parse_chat_request(parse_body(chat_body(R"(,"tool_choice":{"type":"function","function":{"name":"get_time"}})")), tiny());
  EXPECT_EQ(named.tools.choice, ToolChoice::Named);
  EXPECT_EQ(named.tools.forced, "get_time");
  EXPECT_TRUE(named.gen.grammar);
  ApiError e = chat_error(chat_body(R"(,"tool_choice":{"type":"function","function":{"name":"launch"}})"));
  EXPECT_EQ(e.status, 400);
  EXPECT_NE(std::string(e.what()).find("\"launch\", which 'tools' does not offer"), std::string::npos) << e.what();
  e = chat_error(R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"required"})");
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.param, "tool_choice");
  e = chat_error(chat_body(R"(,"tool_choice":"required","response_format":{"type":"json_object"})"));
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(chat_error(chat_body(R"(,"parallel_tool_calls":"yes")")).param, "parallel_tool_calls");
  // A parameters schema the constraint cannot follow: a 400 naming the function and the keyword.
  e = chat_error(R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"required","tools":[{"type":"function",
    "function":{"name":"lookup","parameters":{"type":"object","properties":{"q":{"type":"string","pattern":"^a"}}}}}]})");
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.param, "tools");
  EXPECT_NE(std::string(e.what()).find("'lookup'"), std::string::npos) << e.what();
  EXPECT_NE(std::string(e.what()).find("/properties/q/pattern"), std::string::npos) << e.what();
  EXPECT_EQ(chat_error(chat_body(R"(,"tool_choice":"sometimes")")).status, 400);
  EXPECT_EQ(chat_error(chat_body(R"(,"tool_choice":5)")).status, 400);
  EXPECT_EQ(chat_error(R"({"messages":[{"role":"user","content":"x"}],"tools":{}})").param, "tools");
  EXPECT_EQ(chat_error(R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function"}]})").param, "tools");
  EXPECT_EQ(chat_error(R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"x","function":{"name":"f"}}]})").param,
            "tools");

  // "none": the tools are still rendered, but calls are not parsed.
  const ApiRequest none = parse_chat_request(parse_body(chat_body(R"(,"tool_choice":"none")")), tiny());
  EXPECT_FALSE(none.tools.parse_calls());
  EXPECT_EQ(none.tools.tools.size(), 2u);
  const ApiRequest aut = parse_chat_request(parse_body(chat_body("")), tiny());
  EXPECT_TRUE(aut.tools.parse_calls());
  EXPECT_EQ(aut.tools.names, kNames);
}

TEST(ToolRoundTrip, RendersThroughTheRealQwen3Template) {
  ROOFLINE_SHARED_PATH_OR_SKIP(td, "testdata");
  ModelContext mc;
  mc.tokenizer = roofline::test::load_test_tokenizer("qwen3");
  ASSERT_TRUE(mc.tokenizer);
  mc.chat_template_source =
      json::parse(roofline::test::read_text_file(td + "/tokenizer/qwen3/tokenizer_config.json"))["chat_template"].get<std::string>();
  mc.chat_template = std::make_unique<ChatTemplate>(mc.chat_template_source);
  mc.n_vocab = mc.tokenizer->n_vocab();
  mc.n_ctx = 4096;
  // What the openai client sends back after a parallel call: content null, arguments as JSON strings.
  const std::string body = std::string(R"({"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}],
    "messages":[{"role":"user","content":"Weather in Paris and Oslo?"},
    {"role":"assistant","content":null,"tool_calls":[
      {"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}},
      {"id":"call_2","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Oslo\"}"}}]},
    {"role":"tool","tool_call_id":"call_1","content":"18C"},
    {"role":"tool","tool_call_id":"call_2","content":[{"type":"text","text":"9C"}]}]})");
  const ApiRequest r = parse_chat_request(parse_body(body), mc);
  const std::string want =
      "<|im_start|>system\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
      "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
      "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {\"type\": \"object\"}}}\n</tools>\n\n"
      "For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n"
      "<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n"
      "<|im_start|>user\nWeather in Paris and Oslo?<|im_end|>\n"
      "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call><|im_end|>\n"
      "<|im_start|>user\n<tool_response>\n18C\n</tool_response>\n<tool_response>\n9C\n</tool_response><|im_end|>\n"
      "<|im_start|>assistant\n";
  EXPECT_EQ(r.prompt_text, want);
  // The call the model makes in this format parses back into what the client sent.
  const auto parsed = parse_tool_calls(kWeatherCall, {"get_weather"});
  ASSERT_EQ(parsed.calls.size(), 1u);
  EXPECT_EQ(json::parse(parsed.calls[0].arguments), json::parse(R"({"city": "Paris"})"));
}

TEST(ToolResponses, WholeResponseCarriesToolCalls) {
  const ApiRequest r = parse_chat_request(parse_body(chat_body("")), tiny());
  ResponseBuilder b(r, tiny(), "chatcmpl-1", 1);
  b.add_events({text_event("I'll check.\n"), text_event(std::string(kWeatherCall) + "\n"), text_event(kTimeCall, Finish::Eos)});
  const json j = b.response(Timings{});
  const json& ch = j["choices"][0];
  EXPECT_EQ(ch["finish_reason"], "tool_calls");
  EXPECT_EQ(ch["message"]["content"], "I'll check.");
  const json& calls = ch["message"]["tool_calls"];
  ASSERT_EQ(calls.size(), 2u) << j.dump();
  EXPECT_EQ(calls[0]["type"], "function");
  EXPECT_EQ(calls[0]["function"]["name"], "get_weather");
  EXPECT_EQ(calls[0]["function"]["arguments"], R"({"city":"Paris"})");
  EXPECT_EQ(calls[1]["function"]["name"], "get_time");
  const std::string id0 = calls[0]["id"], id1 = calls[1]["id"];
  EXPECT_EQ(id0.rfind("call_", 0), 0u);
  EXPECT_EQ(id0.size(), 29u);
  EXPECT_NE(id0, id1);

  // Only calls: content is null. Stopped by length mid-call: plain content, finish "length".
  ResponseBuilder only(r, tiny(), "chatcmpl-2", 1);
  only.add_events({text_event(kTimeCall, Finish::Eos)});
  EXPECT_TRUE(only.response(Timings{})["choices"][0]["message"]["content"].is_null());
  ResponseBuilder cut(r, tiny(), "chatcmpl-3", 1);
  cut.add_events({text_event("<tool_call>\n{\"name\": \"get_ti", Finish::Length)});
  const json c = cut.response(Timings{})["choices"][0];
  EXPECT_EQ(c["finish_reason"], "length");
  EXPECT_EQ(c["message"]["content"], "<tool_call>\n{\"name\": \"get_ti");
  EXPECT_FALSE(c["message"].contains("tool_calls"));

  // tool_choice "none" and requests without tools leave the text alone.
  const ApiRequest none = parse_chat_request(parse_body(chat_body(R"(,"tool_choice":"none")")), tiny());
  ResponseBuilder nb(none, tiny(), "chatcmpl-4", 1);
  nb.add_events({text_event(kTimeCall, Finish::Eos)});
  const json n = nb.response(Timings{})["choices"][0];
  EXPECT_EQ(n["message"]["content"], kTimeCall);
  EXPECT_EQ(n["finish_reason"], "stop");
}

TEST(ToolResponses, StreamedAsOpenAIStreamsCalls) {
  const ApiRequest r = parse_chat_request(parse_body(chat_body(R"(,"stream":true)")), tiny());
  ResponseBuilder b(r, tiny(), "chatcmpl-5", 1);
  std::string sse = b.stream_begin();
  const std::string text = std::string("Sure.") + kWeatherCall + "\n" + kTimeCall;
  for (size_t i = 0; i < text.size(); i += 3) sse += b.stream_events({text_event(text.substr(i, 3))});
  sse += b.stream_events({text_event("", Finish::Eos)});
  sse += b.stream_end(Timings{});
  std::string content;
  std::vector<json> call_deltas;
  std::string finish;
  for (const json& p : payloads(sse)) {
    const json& ch = p["choices"][0];
    const json& d = ch["delta"];
    if (d.contains("content") && d["content"].is_string()) content += d["content"].get<std::string>();
    if (d.contains("tool_calls")) {
      EXPECT_EQ(content, "Sure.") << "the content before the call comes first";
      for (const json& tc : d["tool_calls"]) call_deltas.push_back(tc);
    }
    if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
  }
  EXPECT_EQ(content, "Sure.");
  EXPECT_EQ(finish, "tool_calls");
  ASSERT_EQ(call_deltas.size(), 4u) << sse;
  // Per call: index, id, type, name (empty arguments), then the arguments.
  EXPECT_EQ(call_deltas[0]["index"], 0);
  EXPECT_EQ(call_deltas[0]["type"], "function");
  EXPECT_EQ(call_deltas[0]["function"]["name"], "get_weather");
  EXPECT_EQ(call_deltas[0]["function"]["arguments"], "");
  EXPECT_EQ(call_deltas[0]["id"].get<std::string>().rfind("call_", 0), 0u);
  EXPECT_EQ(call_deltas[1]["index"], 0);
  EXPECT_FALSE(call_deltas[1].contains("id"));
  EXPECT_EQ(call_deltas[1]["function"]["arguments"], R"({"city":"Paris"})");
  EXPECT_EQ(call_deltas[2]["index"], 1);
  EXPECT_EQ(call_deltas[2]["function"]["name"], "get_time");
  EXPECT_EQ(call_deltas[3]["function"]["arguments"], "{}");
  EXPECT_NE(call_deltas[0]["id"], call_deltas[2]["id"]);
}

// Through HTTP: a fake model that writes a tool call, token by token, then ends.
TEST(ToolServer, FakeModelCallIsAnsweredAsToolCalls) {
  std::unique_ptr<ModelContext> mc = tiny_qwen3_context();
  const std::string body = chat_body(R"(,"temperature":0,"max_tokens":200)");
  const size_t n_prompt = parse_chat_request(parse_body(body), *mc).gen.prompt.size();
  std::vector<int32_t> script = mc->tokenizer->encode(std::string("On it.\n") + kWeatherCall, false, false);
  script.push_back(mc->tokenizer->eos());
  auto runner = std::make_unique<roofline::serve::test::FakeRunner>(mc->n_vocab, 512, 4, 64);
  mc->n_ctx = runner->n_ctx();
  runner->next_token = [script, n_prompt](const std::vector<int32_t>& content) {
    const size_t k = content.size() - n_prompt;
    return k < script.size() ? script[k] : script.back();
  };
  Metrics metrics;
  TokenizerText text(mc->tokenizer);
  SchedulerOptions so;
  so.n_slots = 2;
  so.queue_size = 4;
  Scheduler scheduler(*runner, text, so, &metrics);
  ServerOptions opt;
  opt.port = 0;
  opt.n_slots = 2;
  opt.queue_size = 4;
  Server server(opt);
  const int port = server.bind();
  server.start();
  scheduler.start();
  server.set_ready(mc.get(), &scheduler, &metrics);
  {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(30, 0);
    auto r = c.Post("/v1/chat/completions", body, "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const json j = json::parse(r->body);
    const json& ch = j["choices"][0];
    EXPECT_EQ(ch["finish_reason"], "tool_calls") << r->body;
    EXPECT_EQ(ch["message"]["content"], "On it.");
    ASSERT_EQ(ch["message"]["tool_calls"].size(), 1u) << r->body;
    EXPECT_EQ(ch["message"]["tool_calls"][0]["function"]["arguments"], R"({"city":"Paris"})");

    r = c.Post("/v1/chat/completions", chat_body(R"(,"temperature":0,"stream":true)"), "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200);
    std::string names, finish;
    for (const json& p : payloads(r->body)) {
      const json& chunk = p["choices"][0];
      if (chunk["delta"].contains("tool_calls") && chunk["delta"]["tool_calls"][0]["function"].contains("name"))
        names += chunk["delta"]["tool_calls"][0]["function"]["name"].get<std::string>();
      if (!chunk["finish_reason"].is_null()) finish = chunk["finish_reason"];
    }
    EXPECT_EQ(names, "get_weather") << r->body;
    EXPECT_EQ(finish, "tool_calls");

    r = c.Post("/v1/chat/completions", chat_body(R"(,"tool_choice":{"type":"function","function":{"name":"nope"}})"),
               "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400);
    EXPECT_NE(r->body.find("nope"), std::string::npos);
  }
  scheduler.stop(true);
  scheduler.join();
  server.stop();
}
