// The HTTP server over a fake backend, through a real socket: /health while loading and when ready,
// API keys, CORS preflight, error envelopes (400/401/404/413/503), chat and completions whole and
// streamed (SSE on the wire), /metrics, /slots, a client that disconnects (its slot is freed), a
// full queue (503 + Retry-After), /health answering promptly while every slot streams, the chat page
// (served without a key, off with webui = false), and which failures are ours: 500 for a failed
// internal check, 503 on /health and for new requests after a sticky device fault.
#include <gtest/gtest.h>
#include <httplib.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "core/error.h"
#include "fake_runner.h"
#include "model/model_file.h"
#include "serve/server.h"
#include "serve/web_assets.h"
#include "tiny_model_context.h"

using namespace roofline;
using namespace roofline::serve;
using roofline::serve::test::FakeRunner;

namespace {

std::vector<std::string> payloads(const std::string& stream) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < stream.size()) {
    const size_t end = stream.find("\n\n", pos);
    if (end == std::string::npos) break;
    std::string ev = stream.substr(pos, end - pos);
    if (ev.rfind("data: ", 0) == 0) out.push_back(ev.substr(6));
    pos = end + 2;
  }
  return out;
}

class ServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    describe_tiny_qwen3(mc);
    runner = std::make_unique<FakeRunner>(mc.n_vocab, 512, 4, 64);
    mc.n_ctx = runner->n_ctx();
    // Generated text: letters a, b, c, ... by position.
    runner->next_token = [](const std::vector<int32_t>& content) { return (int32_t)('a' + content.size() % 26); };
    text = std::make_unique<TokenizerText>(mc.tokenizer);
    SchedulerOptions so;
    so.n_slots = 2;
    so.queue_size = 2;
    scheduler = std::make_unique<Scheduler>(*runner, *text, so, &metrics);
    ServerOptions opt;
    opt.host = "127.0.0.1";
    opt.port = 0;
    opt.api_keys = {"secret"};
    opt.metrics = true;
    opt.n_slots = 2;
    opt.queue_size = 2;
    opt.max_body_bytes = 64 * 1024;
    server = std::make_unique<Server>(opt);
    port = server->bind();
    server->start();
  }
  void TearDown() override {
    scheduler->stop(true);
    scheduler->join();
    server->stop();
  }
  void ready() {
    scheduler->start();
    server->set_ready(&mc, scheduler.get(), &metrics);
  }
  httplib::Client client() {
    httplib::Client c("127.0.0.1", port);
    c.set_default_headers({{"Authorization", "Bearer secret"}});
    c.set_read_timeout(30, 0);
    return c;
  }
  bool wait_idle(int ms) {
    for (int i = 0; i < ms / 10; ++i) {
      if (scheduler->status().requests_processing == 0) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }

  ModelContext mc;
  Metrics metrics;
  std::unique_ptr<FakeRunner> runner;
  std::unique_ptr<TokenizerText> text;
  std::unique_ptr<Scheduler> scheduler;
  std::unique_ptr<Server> server;
  int port = 0;
};

const char* kChat = R"({"model":"x","messages":[{"role":"user","content":"hi"}],"max_tokens":5,"temperature":0})";

}  // namespace

TEST_F(ServerTest, HealthIs503WhileLoadingThen200) {
  auto c = client();
  auto r = c.Get("/health");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503);
  EXPECT_EQ(json::parse(r->body)["error"]["message"], "Loading model");
  r = c.Post("/v1/chat/completions", kChat, "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503);
  ready();
  httplib::Client anon("127.0.0.1", port);  // /health needs no key
  r = anon.Get("/health");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(json::parse(r->body)["status"], "ok");
}

TEST_F(ServerTest, AuthCorsAndErrorEnvelopes) {
  ready();
  httplib::Client anon("127.0.0.1", port);
  auto r = anon.Get("/v1/models");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
  EXPECT_EQ(json::parse(r->body)["error"]["type"], "authentication_error");
  httplib::Client wrong("127.0.0.1", port);
  wrong.set_default_headers({{"Authorization", "Bearer nope"}});
  EXPECT_EQ(wrong.Post("/v1/chat/completions", kChat, "application/json")->status, 401);
  auto c = client();
  r = c.Get("/v1/models");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(json::parse(r->body)["data"][0]["id"], "tiny");
  EXPECT_EQ(c.Get("/models")->status, 200);
  EXPECT_EQ(c.Get("/v1/models/tiny")->status, 200);
  EXPECT_EQ(c.Get("/v1/models/other")->status, 404);
  // CORS preflight needs no key and echoes the origin.
  httplib::Headers h = {{"Origin", "http://ui.example"}, {"Access-Control-Request-Headers", "authorization,content-type"}};
  r = anon.Options("/v1/chat/completions", h);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 204);
  EXPECT_EQ(r->get_header_value("Access-Control-Allow-Origin"), "http://ui.example");
  EXPECT_EQ(r->get_header_value("Access-Control-Allow-Headers"), "authorization,content-type");
  // Envelopes.
  r = c.Post("/v1/chat/completions", "{oops", "application/json");
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(json::parse(r->body)["error"]["type"], "invalid_request_error");
  r = c.Post("/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"temperature":9})", "application/json");
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(json::parse(r->body)["error"]["param"], "temperature");
  r = c.Get("/no/such/path");
  EXPECT_EQ(r->status, 404);
  EXPECT_TRUE(json::parse(r->body).contains("error"));
  r = c.Post("/v1/completions", std::string(100 * 1024, ' '), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 413);
  // A prompt longer than the context: 400 before any work.
  const std::string long_prompt(5000, 'x');
  r = c.Post("/v1/completions", json{{"prompt", long_prompt}, {"max_tokens", 4}}.dump(), "application/json");
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(json::parse(r->body)["error"]["code"], "context_length_exceeded");
}

TEST_F(ServerTest, ChatAndCompletionsWholeAndStreamed) {
  ready();
  auto c = client();
  auto r = c.Post("/v1/chat/completions", kChat, "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json j = json::parse(r->body);
  const std::string content = j["choices"][0]["message"]["content"];
  // The fake model's rule: the token after a sequence of n tokens is 'a' + n % 26.
  auto letters = [&](int n_prompt, int n) {
    std::vector<int32_t> ids;
    for (int i = 0; i < n; ++i) ids.push_back((int32_t)('a' + (n_prompt + i) % 26));
    return mc.tokenizer->decode(ids);
  };
  const int n_prompt = j["usage"]["prompt_tokens"];
  EXPECT_EQ(n_prompt, (int)mc.tokenizer->encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", false, true).size());
  EXPECT_EQ(content, letters(n_prompt, 5));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["completion_tokens"], 5);
  EXPECT_EQ(j["model"], "tiny");
  // Streamed: the same text.
  json body = json::parse(kChat);
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  r = c.Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Content-Type"), "text/event-stream");
  const auto p = payloads(r->body);
  ASSERT_GE(p.size(), 4u);
  EXPECT_EQ(p.back(), "[DONE]");
  std::string streamed;
  for (size_t i = 0; i + 1 < p.size(); ++i) {
    const json ch = json::parse(p[i]);
    if (!ch["choices"].empty() && ch["choices"][0]["delta"].contains("content"))
      streamed += ch["choices"][0]["delta"]["content"].get<std::string>();
  }
  EXPECT_EQ(streamed, content);
  EXPECT_EQ(json::parse(p[p.size() - 2])["usage"]["completion_tokens"], 5);
  // Completions and the native endpoint.
  r = c.Post("/v1/completions", R"({"prompt":"abc","max_tokens":3,"temperature":0})", "application/json");
  ASSERT_EQ(r->status, 200) << r->body;
  const json jc = json::parse(r->body);
  EXPECT_EQ(jc["choices"][0]["text"], letters(jc["usage"]["prompt_tokens"], 3));
  r = c.Post("/completion", R"({"prompt":"abc","n_predict":3})", "application/json");
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(json::parse(r->body)["timings"]["predicted_n"], 3);
  // Metrics and slots.
  r = c.Get("/metrics");
  ASSERT_EQ(r->status, 200);
  EXPECT_NE(r->body.find("llamacpp:tokens_predicted_total 16"), std::string::npos) << r->body;
  r = c.Get("/slots");
  ASSERT_EQ(r->status, 200);
  EXPECT_EQ(json::parse(r->body).size(), 2u);
  EXPECT_EQ(c.Get("/props")->status, 200);
}

// A client that leaves mid-request cancels it: its slot is free long before the request could have
// finished by itself. Each request asks for 1800 tokens at >= 5 ms a step (>= 9 s uncancelled); the
// slot must be idle within 3 s of the client leaving and the request must have run far fewer steps.
TEST_F(ServerTest, DisconnectedClientsFreeTheirSlots) {
  runner->step_delay_ms = 5;
  ready();
  constexpr int kMaxTokens = 1800;
  constexpr int kIdleWaitMs = 3000;  // a third of the uncancelled run
  auto check_cancelled = [&](const char* what, uint64_t steps_before, std::chrono::steady_clock::time_point left) {
    const bool idle = wait_idle(kIdleWaitMs);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - left).count();
    const uint64_t steps = scheduler->status().steps - steps_before;
    std::printf("  %s: idle %.0f ms after the client left, %llu steps of %d\n", what, ms, (unsigned long long)steps, kMaxTokens);
    EXPECT_TRUE(idle) << what << ": the request still runs " << kIdleWaitMs << " ms after its client left";
    EXPECT_LT(steps, (uint64_t)kMaxTokens / 3) << what << ": the request was not cancelled";
  };
  const std::string body = json{{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", kMaxTokens}, {"stream", true}}.dump();
  // Streaming client that stops reading after a few chunks.
  uint64_t before = scheduler->status().steps;
  std::thread t([&] {
    httplib::Client c("127.0.0.1", port);
    c.set_default_headers({{"Authorization", "Bearer secret"}});
    int n = 0;
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/chat/completions";
    req.body = body;
    req.set_header("Content-Type", "application/json");
    req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++n < 3; };
    c.send(req);
  });
  t.join();
  check_cancelled("stream", before, std::chrono::steady_clock::now());
  // A non-streaming client that gives up after 300 ms.
  before = scheduler->status().steps;
  {
    auto c = client();
    c.set_read_timeout(0, 300000);
    auto r = c.Post("/v1/chat/completions", json{{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", kMaxTokens}}.dump(),
                    "application/json");
    EXPECT_FALSE(r);
  }
  check_cancelled("whole", before, std::chrono::steady_clock::now());
}

TEST_F(ServerTest, FullQueueIs503AndHealthStaysPrompt) {
  runner->step_delay_ms = 10;
  ready();
  const std::string body = R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":60,"stream":true})";
  std::vector<std::thread> streams;
  std::atomic<int> ok{0};
  for (int i = 0; i < 4; ++i) {  // 2 slots + 2 queued
    streams.emplace_back([&] {
      auto c = client();
      auto r = c.Post("/v1/chat/completions", body, "application/json");
      if (r && r->status == 200 && r->body.find("[DONE]") != std::string::npos) ++ok;
    });
  }
  for (int i = 0; i < 200; ++i) {
    const SchedulerStatus st = scheduler->status();
    if (st.requests_processing == 2 && st.queue_depth == 2) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  auto c = client();
  auto r = c.Post("/v1/chat/completions", body, "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503);
  EXPECT_EQ(r->get_header_value("Retry-After"), "1");
  const auto t0 = std::chrono::steady_clock::now();
  auto h = c.Get("/health");
  auto m = c.Get("/metrics");
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(h && m);
  EXPECT_EQ(h->status, 200);
  EXPECT_EQ(m->status, 200);
  EXPECT_LT(ms, 500);
  for (auto& t : streams) t.join();
  EXPECT_EQ(ok, 4);
}

// A second server on a port in use fails to bind with a clear error (no SO_REUSEPORT sharing), and 200
// clients connecting at once are all accepted promptly (the listen backlog is raised past httplib's 5).
TEST_F(ServerTest, PortInUseIsAnErrorAndManyConnectsAreAccepted) {
  ServerOptions other;
  other.host = "127.0.0.1";
  other.port = port;
  Server second(other);
  EXPECT_THROW(second.bind(), Error);

  std::vector<std::thread> clients;
  std::atomic<int> connected{0};
  for (int i = 0; i < 200; ++i) {
    clients.emplace_back([&] {
      const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_port = htons((uint16_t)port);
      addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) ++connected;
      ::close(fd);
    });
  }
  const auto t0 = std::chrono::steady_clock::now();
  for (auto& t : clients) t.join();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(connected.load(), 200);
  EXPECT_LT(s, 0.9) << "connections waited for SYN retries";
}

// The chat page: / and its files with their content types, public even with API keys (the page sends
// the key it is given); the API beside it still wants the key. With webui off, / is a plain 404.
TEST_F(ServerTest, ChatPageIsServedAndCanBeTurnedOff) {
  ready();
  httplib::Client anon("127.0.0.1", port);
  auto r = anon.Get("/");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Content-Type"), "text/html; charset=utf-8");
  EXPECT_NE(r->body.find("<title>roofline chat</title>"), std::string::npos);
  EXPECT_NE(r->body.find("/app.js"), std::string::npos);
  const std::pair<const char*, const char*> files[] = {{"/app.js", "text/javascript; charset=utf-8"},
                                                       {"/markdown.js", "text/javascript; charset=utf-8"},
                                                       {"/style.css", "text/css; charset=utf-8"},
                                                       {"/index.html", "text/html; charset=utf-8"}};
  for (const auto& [path, type] : files) {
    r = anon.Get(path);
    ASSERT_TRUE(r) << path;
    EXPECT_EQ(r->status, 200) << path;
    EXPECT_EQ(r->get_header_value("Content-Type"), type) << path;
    const WebAsset* a = find_web_asset(path);
    ASSERT_NE(a, nullptr) << path;
    EXPECT_EQ(r->body, std::string(a->bytes())) << path;
    EXPECT_GT(r->body.size(), 500u) << path;
  }
  r = anon.Get("/nope.js");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);  // not a page file: the API's key rule
  r = anon.Get("/v1/models");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);

  ServerOptions off;
  off.host = "127.0.0.1";
  off.port = 0;
  off.webui = false;
  Server plain(off);
  const int plain_port = plain.bind();
  plain.start();
  httplib::Client c2("127.0.0.1", plain_port);
  for (const char* path : {"/", "/app.js"}) {
    r = c2.Get(path);
    ASSERT_TRUE(r) << path;
    EXPECT_EQ(r->status, 404) << path;
    EXPECT_EQ(json::parse(r->body)["error"]["type"], "not_found_error") << path;
  }
  plain.stop();
}

// Which side a failure is on: the client's mistakes stay 4xx, our failed checks are 500 server_error,
// a sticky device fault is 503 without Retry-After (retrying soon will not help), a full queue 503 with.
TEST(HttpFailure, ClientMistakesAre4xxOursAre5xx) {
  auto of = [](auto e) { return http_failure(std::make_exception_ptr(e)); };
  EXPECT_EQ(of(ApiError(400, "bad field", "temperature")).status, 400);
  EXPECT_EQ(of(ApiError(400, "bad field", "temperature")).param, "temperature");
  EXPECT_EQ(of(Error("token id 99999 is out of range")).status, 400);
  HttpFailure f = of(InternalError("internal error: n > 0 failed at x.cpp:1"));
  EXPECT_EQ(f.status, 500);
  EXPECT_EQ(error_body(f.status, f.message)["error"]["type"], "server_error");
  f = http_failure([] {
    try {
      ROOFLINE_CHECK(1 + 1 == 3, "arithmetic");
    } catch (...) {
      return std::current_exception();
    }
    return std::exception_ptr();
  }());
  EXPECT_EQ(f.status, 500);
  EXPECT_NE(f.message.find("arithmetic"), std::string::npos);
  EXPECT_EQ(of(std::runtime_error("unexpected")).status, 500);
  EXPECT_EQ(of(std::bad_alloc()).status, 500);
  f = of(DeviceFault("CUDA error cudaErrorIllegalAddress"));
  EXPECT_EQ(f.status, 503);
  EXPECT_EQ(f.code, "device_fault");
  EXPECT_FALSE(f.retry_after);
  f = of(SubmitError(503, "queue_full", "busy"));
  EXPECT_EQ(f.status, 503);
  EXPECT_TRUE(f.retry_after);
  EXPECT_EQ(of(SubmitError(400, "context_length_exceeded", "too long")).status, 400);
}

// A failed internal check in the scheduler's thread while a request runs: that request is a 500
// server_error (ours, not the client's), the server stays up and the next request is answered.
TEST_F(ServerTest, AFailedInternalCheckIsA500AndTheServerGoesOn) {
  ready();
  auto c = client();
  runner->bad_output_next_step = true;
  auto r = c.Post("/v1/chat/completions", kChat, "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 500) << r->body;
  const json e = json::parse(r->body)["error"];
  EXPECT_EQ(e["type"], "server_error");
  EXPECT_NE(e["message"].get<std::string>().find("internal error"), std::string::npos) << e.dump();
  r = c.Post("/v1/chat/completions", kChat, "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(c.Get("/health")->status, 200);
}

// A step that fails with a sticky device fault: the request in flight ends with a 500 server_error,
// /health turns 503 (device_fault) and new requests are refused at once with 503, not queued to fail.
TEST_F(ServerTest, StickyDeviceFaultMakesHealth503AndNewRequestsFailFast) {
  ready();
  auto c = client();
  auto r = c.Post("/v1/chat/completions", kChat, "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  runner->device_fault_next_step = true;
  r = c.Post("/v1/chat/completions", kChat, "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 500) << r->body;
  EXPECT_EQ(json::parse(r->body)["error"]["type"], "server_error");
  EXPECT_NE(r->body.find("cudaErrorIllegalAddress"), std::string::npos);
  r = c.Get("/health");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503);
  EXPECT_EQ(json::parse(r->body)["error"]["code"], "device_fault");
  const auto t0 = std::chrono::steady_clock::now();
  for (const char* path : {"/v1/chat/completions", "/completion"}) {
    r = c.Post(path, path[1] == 'v' ? kChat : R"({"prompt":"hi","n_predict":3})", "application/json");
    ASSERT_TRUE(r) << path;
    EXPECT_EQ(r->status, 503) << path;
    EXPECT_EQ(json::parse(r->body)["error"]["code"], "device_fault") << path;
    EXPECT_FALSE(r->has_header("Retry-After")) << path;
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 1.0);
  EXPECT_NE(scheduler->device_fault().find("cudaErrorIllegalAddress"), std::string::npos);
}
