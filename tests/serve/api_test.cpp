// The API layer without HTTP: request validation (bad types and ranges are 400s naming the field,
// unknown fields ignored), chat rendering, the error envelope, SSE framing, streamed and whole
// responses for chat / completions / native, the <think> split, stop-string and UTF-8 holdback, and
// the Prometheus text format of /metrics.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <sstream>

#include "model/model_file.h"
#include "serve/api.h"
#include "serve/metrics.h"
#include "serve/text_stream.h"
#include "tiny_model_context.h"

using namespace roofline;
using namespace roofline::serve;

namespace {

// A byte-level tokenizer (each byte one token, plus <|endoftext|> <|im_start|> <|im_end|>) and ChatML.
const ModelContext& context() {
  static const std::unique_ptr<ModelContext> mc = [] {
    auto m = tiny_qwen3_context();
    m->default_sampling.temperature = 0.8f;
    return m;
  }();
  return *mc;
}

int status_of(const std::string& body, bool chat = true) {
  try {
    const json j = parse_body(body);
    if (chat) parse_chat_request(j, context());
    else parse_completion_request(j, context(), Endpoint::Completions);
    return 200;
  } catch (const ApiError& e) {
    return e.status;
  }
}

std::string param_of(const std::string& body) {
  try {
    parse_chat_request(parse_body(body), context());
  } catch (const ApiError& e) {
    return e.param;
  }
  return "(accepted)";
}

// Splits an SSE stream into its data payloads, checking the framing on the way.
std::vector<std::string> sse_payloads(const std::string& stream) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < stream.size()) {
    const size_t end = stream.find("\n\n", pos);
    EXPECT_NE(end, std::string::npos) << "unterminated event";
    if (end == std::string::npos) break;
    const std::string event = stream.substr(pos, end - pos);
    EXPECT_EQ(event.rfind("data: ", 0), 0u) << event;
    EXPECT_EQ(event.find('\n'), std::string::npos) << "multi-line data: " << event;
    out.push_back(event.substr(6));
    pos = end + 2;
  }
  return out;
}

Event ev(int choice, std::string text, Finish f = Finish::None, std::vector<int32_t> tokens = {65}) {
  Event e;
  e.choice = choice;
  e.text = std::move(text);
  e.tokens = std::move(tokens);
  e.finish = f;
  return e;
}

}  // namespace

TEST(ApiTest, MalformedAndOutOfRangeRequestsAre400) {
  const std::string ok = R"("messages":[{"role":"user","content":"hi"}])";
  EXPECT_EQ(status_of("{" + ok + "}"), 200);
  EXPECT_EQ(status_of("{not json"), 400);
  EXPECT_EQ(status_of("[1,2]"), 400);
  EXPECT_EQ(status_of("{}"), 400);
  EXPECT_EQ(status_of(R"({"messages":"hi"})"), 400);
  EXPECT_EQ(status_of(R"({"messages":[]})"), 400);
  EXPECT_EQ(status_of(R"({"messages":[{"content":"hi"}]})"), 400);
  EXPECT_EQ(status_of(R"({"messages":[{"role":"user","content":5}]})"), 400);
  EXPECT_EQ(status_of(R"({"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]})"), 400);
  const std::pair<const char*, const char*> bad[] = {
      {R"("temperature":"hot")", "temperature"}, {R"("temperature":3)", "temperature"},  {R"("top_p":-0.1)", "top_p"},
      {R"("n":0)", "n"},                         {R"("max_tokens":0)", "max_tokens"},     {R"("max_tokens":"10")", "max_tokens"},
      {R"("max_tokens":1.5)", "max_tokens"},     {R"("stop":5)", "stop"},                 {R"("stop":[1])", "stop"},
      {R"("logit_bias":{"abc":1})", "logit_bias"}, {R"("logit_bias":{"5":200})", "logit_bias"},
      {R"("logit_bias":{"999999":1})", "logit_bias"}, {R"("top_logprobs":3)", "top_logprobs"},
      {R"("logprobs":true,"top_logprobs":21)", "top_logprobs"}, {R"("stream":"yes")", "stream"},
      {R"("stream_options":"x")", "stream_options"}, {R"("presence_penalty":2.5)", "presence_penalty"},
      {R"("seed":"abc")", "seed"},                 {R"("response_format":{"type":"xml"})", "response_format"},
      {R"("model":42)", "model"},                  {R"("max_completion_tokens":-2)", "max_completion_tokens"},
  };
  for (const auto& [field, param] : bad) {
    const std::string body = "{" + ok + "," + field + "}";
    EXPECT_EQ(status_of(body), 400) << body;
    EXPECT_EQ(param_of(body), param) << body;
  }
  // Unknown fields and llama-server's extras are accepted.
  EXPECT_EQ(status_of("{" + ok + R"(,"user":"u","store":false,"metadata":{"a":1},"top_k":5,"min_p":0.1,"typ_p":0.9,)"
                      R"("repeat_penalty":1.1,"ignore_eos":true,"cache_prompt":false,"logit_bias":[[5,false],["a",-1]],"seed":-1})"),
            200);
  // Completions: prompt forms.
  EXPECT_EQ(status_of(R"({"prompt":"Hello"})", false), 200);
  EXPECT_EQ(status_of(R"({"prompt":[72,101]})", false), 200);
  EXPECT_EQ(status_of(R"({"prompt":["Hello"]})", false), 200);
  EXPECT_EQ(status_of(R"({"prompt":[[72,101]]})", false), 200);
  EXPECT_EQ(status_of(R"({})", false), 400);
  EXPECT_EQ(status_of(R"({"prompt":[72,-1]})", false), 400);
  EXPECT_EQ(status_of(R"({"prompt":[72,100000]})", false), 400);
  EXPECT_EQ(status_of(R"({"prompt":["a","b"]})", false), 200);  // one choice per prompt (api_gaps_test.cpp)
  EXPECT_EQ(status_of(R"({"prompt":["a",5]})", false), 400);
  EXPECT_EQ(status_of(R"({"prompt":{"x":1}})", false), 400);
  EXPECT_EQ(status_of(R"({"prompt":"x","logprobs":6})", false), 200);
  EXPECT_EQ(status_of(R"({"prompt":"x","logprobs":21})", false), 400);
}

TEST(ApiTest, ChatRequestsRenderTheTemplateAndMapFields) {
  const json body = parse_body(R"({"model":"m","messages":[{"role":"developer","content":"be brief"},
      {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}],
      "max_tokens":7,"max_completion_tokens":9,"temperature":0,"stop":"END","seed":3,"n":2,"logprobs":true,"top_logprobs":2,
      "stream":true,"stream_options":{"include_usage":true},"logit_bias":{"65":-100}})");
  const ApiRequest r = parse_chat_request(body, context());
  EXPECT_EQ(r.prompt_text, "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\na\nb<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(r.gen.prompt, context().tokenizer->encode(r.prompt_text, false, true));
  EXPECT_EQ(r.gen.max_tokens, 9);  // max_completion_tokens wins
  EXPECT_EQ(r.gen.sampling.temperature, 0.0f);
  EXPECT_EQ(r.gen.stop, std::vector<std::string>{"END"});
  EXPECT_EQ(r.gen.sampling.seed, 3u);
  EXPECT_EQ(r.gen.n, 2);
  EXPECT_EQ(r.gen.logprobs, 2);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  ASSERT_EQ(r.gen.sampling.logit_bias.size(), 1u);
  EXPECT_EQ(r.gen.sampling.logit_bias[0].first, 65);
  // Defaults: server temperature, unlimited tokens in chat, 16 in /v1/completions.
  const ApiRequest d = parse_chat_request(parse_body(R"({"messages":[{"role":"user","content":"x"}]})"), context());
  EXPECT_EQ(d.gen.max_tokens, -1);
  EXPECT_FLOAT_EQ(d.gen.sampling.temperature, 0.8f);
  EXPECT_EQ(parse_completion_request(parse_body(R"({"prompt":"x"})"), context(), Endpoint::Completions).gen.max_tokens, 16);
  EXPECT_EQ(parse_completion_request(parse_body(R"({"prompt":"x"})"), context(), Endpoint::Native).gen.max_tokens, -1);
}

TEST(ApiTest, ErrorEnvelopeAndSseFraming) {
  const json e = error_body(400, "bad 'x'", "x");
  EXPECT_EQ(e["error"]["message"], "bad 'x'");
  EXPECT_EQ(e["error"]["type"], "invalid_request_error");
  EXPECT_EQ(e["error"]["param"], "x");
  EXPECT_TRUE(e["error"]["code"].is_null());  // OpenAI: a string code, or null
  EXPECT_EQ(error_body(400, "long", "messages", "context_length_exceeded")["error"]["code"], "context_length_exceeded");
  EXPECT_EQ(error_body(401, "no")["error"]["type"], "authentication_error");
  EXPECT_EQ(error_body(503, "busy")["error"]["type"], "unavailable_error");
  EXPECT_TRUE(error_body(500, "x")["error"]["param"].is_null());
  const std::string s = sse_data(json{{"content", "line1\nline2\xff"}});
  EXPECT_EQ(s.rfind("data: {", 0), 0u);
  EXPECT_EQ(s.substr(s.size() - 2), "\n\n");
  EXPECT_EQ(s.find('\n'), s.size() - 2);
  EXPECT_NE(s.find("\\n"), std::string::npos);
  EXPECT_NE(s.find("\xEF\xBF\xBD"), std::string::npos);  // invalid UTF-8 replaced, not thrown
  EXPECT_STREQ(sse_done(), "data: [DONE]\n\n");
}

TEST(ApiTest, ChatStreamIsFramedLikeOpenAi) {
  ApiRequest r = parse_chat_request(parse_body(R"({"messages":[{"role":"user","content":"x"}],"stream":true,
      "stream_options":{"include_usage":true}})"), context());
  ResponseBuilder b(r, context(), "chatcmpl-1", 123);
  std::string stream = b.stream_begin();
  stream += b.stream_events({ev(0, "Hel"), ev(0, ""), ev(0, "lo", Finish::Length)});
  Timings t;
  t.n_prompt = 5;
  t.n_generated = 3;
  t.n_cached = 2;
  stream += b.stream_end(t);
  const auto payloads = sse_payloads(stream);
  ASSERT_EQ(payloads.size(), 6u);  // role, Hel, lo, finish, usage, [DONE]
  const json first = json::parse(payloads[0]);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["id"], "chatcmpl-1");
  EXPECT_EQ(first["created"], 123);
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(first.contains("usage") && first["usage"].is_null());
  EXPECT_EQ(json::parse(payloads[1])["choices"][0]["delta"]["content"], "Hel");
  EXPECT_TRUE(json::parse(payloads[1])["choices"][0]["finish_reason"].is_null());
  EXPECT_EQ(json::parse(payloads[2])["choices"][0]["delta"]["content"], "lo");
  const json fin = json::parse(payloads[3]);
  EXPECT_EQ(fin["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(fin["choices"][0]["delta"].empty());
  const json usage = json::parse(payloads[4]);
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["prompt_tokens"], 5);
  EXPECT_EQ(usage["usage"]["completion_tokens"], 3);
  EXPECT_EQ(usage["usage"]["total_tokens"], 8);
  EXPECT_EQ(usage["usage"]["prompt_tokens_details"]["cached_tokens"], 2);
  EXPECT_EQ(payloads[5], "[DONE]");
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(json::parse(payloads[i])["id"], "chatcmpl-1");
}

TEST(ApiTest, WholeResponsesForChatCompletionsAndNative) {
  ApiRequest chat = parse_chat_request(parse_body(R"({"messages":[{"role":"user","content":"x"}],"n":2,"logprobs":true,"top_logprobs":1})"),
                                       context());
  ResponseBuilder b(chat, context(), "chatcmpl-2", 1);
  Event e0 = ev(0, "A", Finish::None, {65});
  e0.logprobs.push_back({65, -0.5f, {{65, -0.5f}}});
  Event e1 = ev(1, "B", Finish::StopWord, {66});
  e1.logprobs.push_back({66, -1.5f, {{65, -0.25f}}});
  Event e2 = ev(0, "", Finish::Eos, {258});
  e2.logprobs.push_back({258, -0.1f, {{258, -0.1f}}});
  b.add_events({e0, e1, e2});
  Timings t;
  t.n_prompt = 4;
  t.n_generated = 3;
  const json j = b.response(t);
  EXPECT_EQ(j["object"], "chat.completion");
  ASSERT_EQ(j["choices"].size(), 2u);
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["message"]["content"], "A");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(j["choices"][1]["message"]["content"], "B");
  EXPECT_EQ(j["choices"][1]["finish_reason"], "stop");
  const json& lp = j["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(lp.size(), 2u);
  EXPECT_EQ(lp[0]["token"], "A");
  EXPECT_FLOAT_EQ(lp[0]["logprob"].get<float>(), -0.5f);
  EXPECT_EQ(lp[0]["bytes"], json::array({65}));
  EXPECT_EQ(lp[0]["top_logprobs"][0]["token"], "A");
  EXPECT_EQ(j["usage"]["total_tokens"], 7);

  ApiRequest cmpl = parse_completion_request(parse_body(R"({"prompt":"Hi","echo":true,"logprobs":1})"), context(), Endpoint::Completions);
  ResponseBuilder c(cmpl, context(), "cmpl-3", 1);
  Event x = ev(0, "yo", Finish::Length, {121});
  x.logprobs.push_back({121, -0.3f, {{121, -0.3f}}});
  c.add_events({x});
  const json k = c.response(t);
  EXPECT_EQ(k["object"], "text_completion");
  EXPECT_EQ(k["choices"][0]["text"], "Hiyo");
  EXPECT_EQ(k["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(k["choices"][0]["logprobs"]["tokens"][0], "y");
  EXPECT_EQ(k["choices"][0]["logprobs"]["text_offset"][0], 2);

  ApiRequest nat = parse_completion_request(parse_body(R"({"prompt":"Hi","n_predict":3,"stream":true})"), context(), Endpoint::Native);
  ResponseBuilder n(nat, context(), "x", 1);
  std::string stream = n.stream_begin() + n.stream_events({ev(0, "ab"), ev(0, "c", Finish::StopWord)});
  t.prompt_ms = 10;
  t.generate_ms = 20;
  stream += n.stream_end(t);
  const auto p = sse_payloads(stream);
  ASSERT_EQ(p.size(), 3u);  // two content events, the final one; no [DONE] on the native API
  EXPECT_EQ(json::parse(p[0])["content"], "ab");
  EXPECT_EQ(json::parse(p[0])["stop"], false);
  const json last = json::parse(p[2]);
  EXPECT_EQ(last["stop"], true);
  EXPECT_EQ(last["stop_type"], "word");
  EXPECT_EQ(last["timings"]["predicted_n"], 3);
  EXPECT_DOUBLE_EQ(last["timings"]["predicted_per_second"].get<double>(), 150.0);
}

TEST(ApiTest, ReasoningIsSplitFromContent) {
  ApiRequest r = parse_chat_request(parse_body(R"({"messages":[{"role":"user","content":"x"}],"stream":true})"), context());
  r.split_reasoning = true;
  ResponseBuilder b(r, context(), "c", 1);
  const std::string s = b.stream_events({ev(0, "<th"), ev(0, "ink>\nstep 1</th"), ev(0, "ink>\n\nAnswer"), ev(0, ".", Finish::Eos)});
  std::string reasoning, content;
  for (const auto& p : sse_payloads(s)) {
    const json d = json::parse(p)["choices"][0]["delta"];
    if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
    if (d.contains("content")) content += d["content"].get<std::string>();
  }
  EXPECT_EQ(reasoning, "step 1");
  EXPECT_EQ(content, "Answer.");
  // Whole response, and a prompt that already opened the think block.
  ReasoningSplitter open(true);
  auto o1 = open.push("abc</think>xyz");
  auto o2 = open.flush();
  EXPECT_EQ(o1.reasoning + o2.reasoning, "abc");
  EXPECT_EQ(o1.content + o2.content, "xyz");
  ReasoningSplitter plain;
  auto p1 = plain.push("<b>no think</b>");
  EXPECT_EQ(p1.content + plain.flush().content, "<b>no think</b>");
}

TEST(ApiTest, TextStreamHoldsBackPartialUtf8AndStopStrings) {
  TextStream plain;
  EXPECT_EQ(plain.push("\xE2\x82").text, "");
  EXPECT_EQ(plain.push("\xAC!").text, "\xE2\x82\xAC!");
  EXPECT_EQ(plain.push("\xF0\x9F").text, "");
  EXPECT_EQ(plain.flush(), "\xEF\xBF\xBD\xEF\xBF\xBD");  // an incomplete tail becomes U+FFFD
  TextStream s({"</s>", "STOP"});
  EXPECT_EQ(s.push("ab<").text, "ab");
  EXPECT_EQ(s.push("/").text, "");
  auto r = s.push("x");
  EXPECT_EQ(r.text, "</x");
  EXPECT_FALSE(r.stopped);
  EXPECT_EQ(s.push("ST").text, "");
  r = s.push("OP and more");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "");
  EXPECT_EQ(r.stop_word, "STOP");
  TextStream t({"lo"});
  EXPECT_EQ(t.push("hel").text, "he");
  EXPECT_EQ(t.flush(), "l");
}

TEST(ApiTest, TokenizeDetokenizeAndTemplateEndpoints) {
  const json tok = tokenize_body(context(), parse_body(R"({"content":"Hi<|im_end|>","with_pieces":true})"));
  ASSERT_EQ(tok["tokens"].size(), 3u);
  EXPECT_EQ(tok["tokens"][2]["id"], 258);
  EXPECT_EQ(tok["tokens"][2]["piece"], "<|im_end|>");
  const json ids = tokenize_body(context(), parse_body(R"({"content":"Hi"})"));
  EXPECT_EQ(detokenize_body(context(), json{{"tokens", ids["tokens"]}})["content"], "Hi");
  EXPECT_THROW(detokenize_body(context(), parse_body(R"({"tokens":[1,-4]})")), ApiError);
  EXPECT_THROW(tokenize_body(context(), parse_body(R"({"content":5})")), ApiError);
  const json vllm = tokenize_body(context(), parse_body(R"({"prompt":"Hi"})"));
  EXPECT_EQ(vllm["count"], 2);
  EXPECT_EQ(apply_template_body(context(), parse_body(R"({"messages":[{"role":"user","content":"q"}]})"))["prompt"],
            "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ApiTest, MetricsAreValidPrometheusText) {
  Metrics m;
  m.on_prompt(100, 0.5, 20);
  m.on_generated(40, 2.0);
  m.on_first_token(0.3);
  m.on_first_token(12.0);
  for (int i = 0; i < 10; ++i) m.on_inter_token(0.02 * i);
  m.on_step(5, 3);
  m.on_request_done(3.0, true);
  LiveGauges g;
  g.requests_processing = 2;
  g.requests_deferred = 1;
  g.kv_blocks_total = 100;
  g.kv_blocks_used = 25;
  g.kv_block_size = 32;
  const std::string text = m.render(g);
  std::istringstream in(text);
  std::string line;
  std::map<std::string, std::string> type_of;
  std::map<std::string, double> value;
  while (std::getline(in, line)) {
    ASSERT_FALSE(line.empty());
    if (line.rfind("# TYPE ", 0) == 0) {
      std::istringstream ls(line.substr(7));
      std::string name, type;
      ls >> name >> type;
      EXPECT_TRUE(type == "counter" || type == "gauge" || type == "histogram") << line;
      EXPECT_EQ(type_of.count(name), 0u) << "duplicate TYPE " << name;
      type_of[name] = type;
      continue;
    }
    if (line.rfind("# HELP ", 0) == 0) continue;
    ASSERT_NE(line[0], '#') << line;
    const size_t sp = line.rfind(' ');
    ASSERT_NE(sp, std::string::npos) << line;
    const std::string series = line.substr(0, sp);
    std::string base = series.substr(0, series.find('{'));
    for (const char* suffix : {"_bucket", "_sum", "_count"})
      if (!type_of.count(base) && base.size() > strlen(suffix) && base.compare(base.size() - strlen(suffix), strlen(suffix), suffix) == 0)
        base = base.substr(0, base.size() - strlen(suffix));
    EXPECT_TRUE(type_of.count(base)) << "sample before its TYPE: " << line;
    value[series] = std::stod(line.substr(sp + 1));
  }
  EXPECT_EQ(value["llamacpp:prompt_tokens_total"], 100);
  EXPECT_EQ(value["llamacpp:tokens_predicted_total"], 40);
  EXPECT_EQ(value["llamacpp:requests_processing"], 2);
  EXPECT_EQ(value["llamacpp:requests_deferred"], 1);
  EXPECT_DOUBLE_EQ(value["llamacpp:kv_cache_usage_ratio"], 0.25);
  EXPECT_EQ(value["llamacpp:time_to_first_token_seconds_count"], 2);
  EXPECT_EQ(value["llamacpp:time_to_first_token_seconds_bucket{le=\"+Inf\"}"], 2);
  EXPECT_EQ(value["llamacpp:time_to_first_token_seconds_bucket{le=\"0.5\"}"], 1);
  EXPECT_EQ(value["llamacpp:inter_token_latency_seconds_count"], 10);
  EXPECT_EQ(type_of["llamacpp:time_to_first_token_seconds"], "histogram");
}
