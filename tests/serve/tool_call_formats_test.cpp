// Tool-call formats beside Qwen's: which format a template implies (the real Qwen3, Llama 3.1 and
// Gemma 3 templates), the Llama 3.x parser ({"name", "parameters"} after an optional <|python_tag|>,
// parallel calls) and the generic JSON parser ({"tool_calls": [...]}, {"tool_call": {...}}, ```json
// fences, {"response": ...}), malformed output kept as content, the stream split at every byte, the
// responses built from such output (whole and streamed), and the agent round trip rendered through
// the real Llama 3.1 template and, rewritten as plain messages, the real Gemma 3 template.
#include <gtest/gtest.h>

#include <memory>
#include <set>

#include "serve/api.h"
#include "serve/tool_calls.h"
#include "tokenizer/tokenizer_test_util.h"

using namespace roofline;
using namespace roofline::serve;

namespace {

const std::set<std::string> kNames = {"get_weather", "get_time"};

const char* kTools = R"([{"type":"function","function":{"name":"get_weather","description":"Weather of a city",
  "parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}},
  {"type":"function","function":{"name":"get_time","parameters":{"type":"object","properties":{}}}}])";

// What Llama 3.1 8B Instruct writes for a call (the eot/eom token is not part of the text).
const char* kLlamaCall = "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}";
const char* kGenericCalls =
    "{\"tool_calls\": [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, {\"name\": \"get_time\", \"arguments\": {}}]}";

std::string testdata(const std::string& rel) {
  const std::string shared = roofline::test::shared_dir();
  return shared.empty() ? "" : shared + "/testdata/" + rel;
}
std::string llama_template() {
  return roofline::test::read_text_file(testdata("tokenizer/chat_templates/meta-llama-Llama-3.1-8B-Instruct.jinja"));
}
std::string config_template(const std::string& name) {
  const std::string plain = testdata("tokenizer/" + name + "/tokenizer_config.json");
  const std::string path = std::filesystem::exists(plain) ? plain : roofline::test::unxz_to_temp(plain + ".xz");
  return json::parse(roofline::test::read_text_file(path))["chat_template"].get<std::string>();
}

// A model context of a real tokenizer and template from ../shared/testdata.
std::unique_ptr<ModelContext> context(const std::string& tokenizer, const std::string& source) {
  auto mc = std::make_unique<ModelContext>();
  mc->tokenizer = roofline::test::load_test_tokenizer(tokenizer);
  mc->chat_template_source = source;
  mc->chat_template = std::make_unique<ChatTemplate>(source);
  mc->n_vocab = mc->tokenizer->n_vocab();
  mc->n_ctx = 8192;
  mc->model_id = tokenizer;
  return mc;
}

ToolCallStream::Out parse(const std::string& text, ToolCallFormat f) { return parse_tool_calls(text, kNames, f); }

Event text_event(std::string text, Finish f = Finish::None) {
  Event e;
  e.text = std::move(text);
  e.tokens = {65};
  e.finish = f;
  return e;
}

// The agent round trip as the openai client sends it back: content null, arguments as JSON text.
const char* kRoundTrip = R"({"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}],
  "messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Weather in Paris?"},
  {"role":"assistant","content":null,"tool_calls":[
    {"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}}]},
  {"role":"tool","tool_call_id":"call_1","content":"18C and sunny"}]})";

}  // namespace

TEST(ToolCallFormat, ChosenFromTheRealTemplates) {
  ROOFLINE_SHARED_PATH_OR_SKIP(td, "testdata");
  EXPECT_EQ(tool_call_format_of_template(config_template("qwen3")), ToolCallFormat::Hermes);
  EXPECT_EQ(tool_call_format_of_template(llama_template()), ToolCallFormat::Llama3);
  EXPECT_EQ(tool_call_format_of_template(config_template("gemma3")), ToolCallFormat::GenericJson);
  EXPECT_FALSE(template_needs_tool_rewrite(llama_template()));
  EXPECT_FALSE(template_needs_tool_rewrite(config_template("qwen3")));
  EXPECT_TRUE(template_needs_tool_rewrite(config_template("gemma3")));
  // A plain ChatML template (no tools in it) is of the Qwen / Hermes family.
  const std::string chatml = "{%- for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endfor %}";
  EXPECT_EQ(tool_call_format_of_template(chatml), ToolCallFormat::Hermes);
  EXPECT_FALSE(template_needs_tool_rewrite(chatml));
  EXPECT_STREQ(tool_call_format_name(ToolCallFormat::Llama3), "llama3");
}

TEST(Llama3ToolCalls, CallsParallelCallsAndThePythonTag) {
  const auto f = ToolCallFormat::Llama3;
  auto out = parse(kLlamaCall, f);
  ASSERT_EQ(out.calls.size(), 1u);
  EXPECT_EQ(out.calls[0].name, "get_weather");
  EXPECT_EQ(out.calls[0].arguments, R"({"city":"Paris"})");
  EXPECT_EQ(out.content, "");
  out = parse(std::string("<|python_tag|>") + kLlamaCall, f);
  ASSERT_EQ(out.calls.size(), 1u);
  EXPECT_EQ(out.content, "");
  out = parse("\n {\"type\": \"function\", \"name\": \"get_time\", \"parameters\": {}}\n", f);
  ASSERT_EQ(out.calls.size(), 1u);
  EXPECT_EQ(out.calls[0].name, "get_time");
  EXPECT_EQ(out.calls[0].arguments, "{}");
  out = parse(std::string(kLlamaCall) + "; {\"name\": \"get_time\", \"parameters\": {}}", f);
  ASSERT_EQ(out.calls.size(), 2u);
  EXPECT_EQ(out.calls[1].name, "get_time");
  out = parse(std::string(kLlamaCall) + "\n{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Oslo\\\"}\"}", f);
  ASSERT_EQ(out.calls.size(), 2u);
  EXPECT_EQ(out.calls[1].arguments, R"({"city":"Oslo"})");
  // Braces and quotes inside strings do not confuse the object boundaries.
  out = parse("{\"name\": \"get_weather\", \"parameters\": {\"city\": \"a}\\\"{b\"}}", f);
  ASSERT_EQ(out.calls.size(), 1u);
  EXPECT_EQ(out.calls[0].arguments, R"({"city":"a}\"{b"})");
}

TEST(Llama3ToolCalls, MalformedOutputIsContent) {
  const std::string cases[] = {
      "{\"name\": \"get_weather\", \"parameters\": {\"city\": }}",          // bad JSON
      "{\"name\": \"launch_rockets\", \"parameters\": {}}",                  // not offered
      "{\"parameters\": {}}",                                                // no name
      "{\"name\": \"get_time\", \"parameters\": [1]}",                       // not an object
      "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Par",         // never closed
      std::string(kLlamaCall) + " and then some words",                      // text after the call
      std::string(kLlamaCall) + "; {\"name\": \"nope\", \"parameters\": {}}",  // one bad call of two
      "{\"type\": \"code\", \"name\": \"get_time\", \"parameters\": {}}",     // not a function
  };
  for (const std::string& c : cases) {
    const auto out = parse(c, ToolCallFormat::Llama3);
    EXPECT_TRUE(out.calls.empty()) << c;
    EXPECT_EQ(out.content, c);
  }
  // Text first: an answer, even when a call follows (Llama writes calls as the whole answer).
  const std::string mixed = std::string("Sure: ") + kLlamaCall;
  EXPECT_EQ(parse(mixed, ToolCallFormat::Llama3).content, mixed);
  EXPECT_EQ(parse("plain answer  \n", ToolCallFormat::Llama3).content, "plain answer  \n");
  EXPECT_EQ(parse("<|python_tag|>brave_search.call(query=\"x\")", ToolCallFormat::Llama3).content,
            "<|python_tag|>brave_search.call(query=\"x\")");
}

TEST(GenericToolCalls, CallObjectsFencesAndResponses) {
  const auto f = ToolCallFormat::GenericJson;
  auto out = parse(kGenericCalls, f);
  ASSERT_EQ(out.calls.size(), 2u);
  EXPECT_EQ(out.calls[0].name, "get_weather");
  EXPECT_EQ(out.calls[0].arguments, R"({"city":"Paris"})");
  EXPECT_EQ(out.calls[1].name, "get_time");
  EXPECT_EQ(out.content, "");
  out = parse("{\"tool_call\": {\"name\": \"get_time\", \"arguments\": {}}}", f);
  ASSERT_EQ(out.calls.size(), 1u);
  EXPECT_EQ(out.calls[0].name, "get_time");
  out = parse(std::string("```json\n") + kGenericCalls + "\n```\n", f);
  ASSERT_EQ(out.calls.size(), 2u);
  EXPECT_EQ(out.content, "");
  out = parse("{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}", f);
  ASSERT_EQ(out.calls.size(), 1u);
  out = parse("{\"tool_calls\": [{\"type\": \"function\", \"function\": {\"name\": \"get_time\", \"arguments\": \"{}\"}}]}", f);
  ASSERT_EQ(out.calls.size(), 1u);
  EXPECT_EQ(out.calls[0].arguments, "{}");
  out = parse("{\"response\": \"It is sunny.\"}", f);
  EXPECT_TRUE(out.calls.empty());
  EXPECT_EQ(out.content, "It is sunny.");
  EXPECT_EQ(parse("Just text, no JSON.", f).content, "Just text, no JSON.");
}

TEST(GenericToolCalls, MalformedOutputIsContent) {
  const std::string cases[] = {
      "{\"tool_calls\": [{\"name\": \"get_weather\", \"arguments\": {\"city\": }}]}",  // bad JSON
      "{\"tool_calls\": [{\"name\": \"nope\", \"arguments\": {}}]}",                   // not offered
      "{\"tool_calls\": []}",                                                         // no call
      "{\"tool_call\": {\"name\": \"get_time\", \"arguments\": 3}}",                   // not an object
      "{\"answer\": 42}",                                                             // some other JSON
      "{\"tool_calls\": [{\"name\": \"get_time\", \"arguments\": {}}",                 // never closed
      "```json\n{\"tool_call\": {\"name\": \"get_time\"}} trailing\n```",              // not one object
      "```python\nprint(1)\n```",                                                     // other code
  };
  for (const std::string& c : cases) {
    const auto out = parse(c, ToolCallFormat::GenericJson);
    EXPECT_TRUE(out.calls.empty()) << c;
    EXPECT_EQ(out.content, c);
  }
}

TEST(ToolCallFormats, StreamSplitAtEveryByteMatchesTheWholeParse) {
  struct Case {
    ToolCallFormat format;
    std::string text;
    size_t calls;
  };
  const Case cases[] = {
      {ToolCallFormat::Llama3, std::string(" <|python_tag|>") + kLlamaCall + ";\n{\"name\": \"get_time\", \"parameters\": {}}", 2},
      {ToolCallFormat::Llama3, "The answer is {not a call} <|python_tag|>", 0},
      {ToolCallFormat::GenericJson, std::string("```json\n") + kGenericCalls + "\n```", 2},
      {ToolCallFormat::GenericJson, "``` is a fence; {\"tool_call\": 1}", 0},
      {ToolCallFormat::GenericJson, "{\"response\": \"Hi <there>\"}", 0},
  };
  for (const Case& k : cases) {
    const auto whole = parse_tool_calls(k.text, kNames, k.format);
    ASSERT_EQ(whole.calls.size(), k.calls) << k.text;
    for (size_t a = 0; a <= k.text.size(); ++a) {
      for (size_t b = a; b <= k.text.size(); b += (a % 5 == 0 ? 1 : 11)) {
        ToolCallStream s(kNames, k.format);
        std::string content;
        std::vector<ParsedToolCall> calls;
        for (const std::string& piece : {k.text.substr(0, a), k.text.substr(a, b - a), k.text.substr(b)}) {
          auto o = s.push(piece);
          content += o.content;
          for (auto& c : o.calls) calls.push_back(c);
          if (k.calls > 0) EXPECT_EQ(content, "") << "a call's text leaked as content: " << k.text << " @" << a << "," << b;
        }
        auto fl = s.flush();
        content += fl.content;
        for (auto& c : fl.calls) calls.push_back(c);
        ASSERT_EQ(calls.size(), whole.calls.size()) << k.text << " @" << a << "," << b;
        for (size_t i = 0; i < calls.size(); ++i) {
          EXPECT_EQ(calls[i].name, whole.calls[i].name);
          EXPECT_EQ(calls[i].arguments, whole.calls[i].arguments);
        }
        EXPECT_EQ(content, whole.content) << k.text << " @" << a << "," << b;
      }
    }
  }
  // A plain answer streams from its first character, not held to the end.
  for (ToolCallFormat f : {ToolCallFormat::Llama3, ToolCallFormat::GenericJson}) {
    ToolCallStream s(kNames, f);
    std::string early;
    for (char c : std::string("Hello there, friend")) early += s.push(std::string(1, c)).content;
    EXPECT_EQ(early, "Hello there, friend");
  }
}

TEST(ToolCallFormats, ResponsesFromLlamaOutputWholeAndStreamed) {
  ROOFLINE_SHARED_PATH_OR_SKIP(td, "testdata");
  auto mc = context("llama3_1", llama_template());
  const std::string body = std::string(R"({"messages":[{"role":"user","content":"Weather in Paris?"}],"tools":)") + kTools + "}";
  const ApiRequest r = parse_chat_request(parse_body(body), *mc);
  EXPECT_EQ(r.tools.format, ToolCallFormat::Llama3);
  ResponseBuilder b(r, *mc, "chatcmpl-1", 1);
  b.add_events({text_event("{\"name\": \"get_weather\", "), text_event("\"parameters\": {\"city\": \"Paris\"}}", Finish::Eos)});
  const json ch = b.response(Timings{})["choices"][0];
  EXPECT_EQ(ch["finish_reason"], "tool_calls");
  EXPECT_TRUE(ch["message"]["content"].is_null());
  ASSERT_EQ(ch["message"]["tool_calls"].size(), 1u);
  EXPECT_EQ(ch["message"]["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(ch["message"]["tool_calls"][0]["function"]["arguments"], R"({"city":"Paris"})");

  const ApiRequest rs = parse_chat_request(parse_body(body.substr(0, body.size() - 1) + R"(,"stream":true})"), *mc);
  ResponseBuilder sb(rs, *mc, "chatcmpl-2", 1);
  std::string sse = sb.stream_begin();
  const std::string text = std::string(kLlamaCall) + "; {\"name\": \"get_time\", \"parameters\": {}}";
  for (size_t i = 0; i < text.size(); i += 4) sse += sb.stream_events({text_event(text.substr(i, 4))});
  sse += sb.stream_events({text_event("", Finish::Eos)});
  sse += sb.stream_end(Timings{});
  std::vector<json> deltas;
  std::string finish, content;
  for (size_t pos = 0; (pos = sse.find("data: ", pos)) != std::string::npos;) {
    const size_t end = sse.find("\n\n", pos);
    const std::string p = sse.substr(pos + 6, end - pos - 6);
    pos = end;
    if (p == "[DONE]") continue;
    const json chunk = json::parse(p);
    if (chunk["choices"].empty()) continue;
    const json& c = chunk["choices"][0];
    if (c["delta"].contains("content") && c["delta"]["content"].is_string()) content += c["delta"]["content"].get<std::string>();
    if (c["delta"].contains("tool_calls"))
      for (const json& tc : c["delta"]["tool_calls"]) deltas.push_back(tc);
    if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
  }
  EXPECT_EQ(content, "");
  EXPECT_EQ(finish, "tool_calls");
  ASSERT_EQ(deltas.size(), 4u) << sse;
  EXPECT_EQ(deltas[0]["function"]["name"], "get_weather");
  EXPECT_EQ(deltas[1]["function"]["arguments"], R"({"city":"Paris"})");
  EXPECT_EQ(deltas[2]["index"], 1);
  EXPECT_EQ(deltas[2]["function"]["name"], "get_time");

  // Malformed under auto: plain content, finish "stop".
  ResponseBuilder bad(r, *mc, "chatcmpl-3", 1);
  bad.add_events({text_event("{\"name\": \"get_weather\", \"parameters\": oops}", Finish::Eos)});
  const json bc = bad.response(Timings{})["choices"][0];
  EXPECT_EQ(bc["finish_reason"], "stop");
  EXPECT_EQ(bc["message"]["content"], "{\"name\": \"get_weather\", \"parameters\": oops}");
}

TEST(ToolCallFormats, RoundTripThroughTheRealLlama31Template) {
  ROOFLINE_SHARED_PATH_OR_SKIP(td, "testdata");
  auto mc = context("llama3_1", llama_template());
  const ApiRequest r = parse_chat_request(parse_body(kRoundTrip), *mc);
  const std::string want =
      "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\n"
      "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\nBe brief.<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, please respond with a JSON for a function "
      "call with its proper arguments that best answers the given prompt.\n\nRespond in the format {\"name\": function name, "
      "\"parameters\": dictionary of argument name and its value}.Do not use variables.\n\n"
      "{\n    \"type\": \"function\",\n    \"function\": {\n        \"name\": \"get_weather\",\n        \"parameters\": {\n"
      "            \"type\": \"object\",\n            \"properties\": {\n                \"city\": {\n"
      "                    \"type\": \"string\"\n                }\n            }\n        }\n    }\n}\n\n"
      "Weather in Paris?<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}<|eot_id|>"
      "<|start_header_id|>ipython<|end_header_id|>\n\n\"18C and sunny\"<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\n";
  EXPECT_EQ(r.prompt_text, want);
  // The assistant turn the template wrote parses back into the call the client sent.
  const auto back = parse_tool_calls("{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}", {"get_weather"},
                                     ToolCallFormat::Llama3);
  ASSERT_EQ(back.calls.size(), 1u);
  EXPECT_EQ(back.calls[0].arguments, R"({"city":"Paris"})");
}

TEST(ToolCallFormats, RoundTripThroughTheRealGemma3TemplateAsPlainMessages) {
  ROOFLINE_SHARED_PATH_OR_SKIP(td, "testdata");
  auto mc = context("gemma3", config_template("gemma3"));
  const ApiRequest r = parse_chat_request(parse_body(kRoundTrip), *mc);
  EXPECT_EQ(r.tools.format, ToolCallFormat::GenericJson);
  const std::string& p = r.prompt_text;
  // The system text (with the tool guide) opens the first user turn; the call is the model's turn as
  // JSON; the result is a user turn; the prompt ends ready for the model's answer.
  const size_t user = p.find("<start_of_turn>user\nBe brief.\n\nYou can call the following tools.");
  ASSERT_NE(user, std::string::npos) << p;
  EXPECT_NE(p.find("\"name\": \"get_weather\"", user), std::string::npos) << p;
  EXPECT_NE(p.find("{\"tool_calls\": [{\"name\": \"<tool name>\""), std::string::npos) << p;
  const size_t call = p.find(
      "<start_of_turn>model\n{\"tool_calls\":[{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"},\"id\":\"call_1\"}]}<end_of_turn>\n");
  ASSERT_NE(call, std::string::npos) << p;
  const size_t result = p.find(
      "<start_of_turn>user\n{\"tool_response\":{\"name\":\"get_weather\",\"tool_call_id\":\"call_1\",\"content\":\"18C and sunny\"}}<end_of_turn>\n");
  ASSERT_NE(result, std::string::npos) << p;
  EXPECT_LT(user, call);
  EXPECT_LT(call, result);
  EXPECT_TRUE(p.ends_with("<end_of_turn>\n<start_of_turn>model\n")) << p;

  // Two results of a parallel call are one user turn (Gemma wants turns to alternate).
  json two = json::parse(kRoundTrip);
  two["messages"][2]["tool_calls"].push_back(
      json::parse(R"({"id":"call_2","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Oslo\"}"}})"));
  two["messages"].push_back(json::parse(R"({"role":"tool","tool_call_id":"call_2","content":"9C"})"));
  const std::string p2 = parse_chat_request(two, *mc).prompt_text;
  EXPECT_NE(p2.find("\"content\":\"18C and sunny\"}}\n\n{\"tool_response\":{\"name\":\"get_weather\",\"tool_call_id\":\"call_2\""),
            std::string::npos)
      << p2;
  // Without tools nothing is rewritten.
  const std::string plain = parse_chat_request(parse_body(R"({"messages":[{"role":"user","content":"Hi"}]})"), *mc).prompt_text;
  EXPECT_EQ(plain, "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n");
}
