// `roofline serve` as a process (the binary, its flags and environment), over HTTP: --api-key-file,
// --alias, --chat-template / --chat-template-file / --chat-template-kwargs, --reasoning-format,
// --no-cache-prompt, --queue-size, --no-webui, and llama-server's LLAMA_ARG_* environment variables (a
// flag on the command line wins over its variable). The model is synthetic:tiny-qwen3 (ChatML, byte-level vocab).
#include <gtest/gtest.h>
#include <httplib.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

#include "test_util.h"

using json = nlohmann::json;

namespace {

// A running `roofline serve -m synthetic:tiny-qwen3:Q8_0 --host 127.0.0.1 --port 0 ARGS` with ENV added;
// ready once /health answers 200; SIGTERM on destruction.
class ServeProcess {
 public:
  ServeProcess(const std::vector<std::string>& args, const std::map<std::string, std::string>& env = {}) {
    log_path_ = roofline::test::temp_dir() + "/serve.log";
    std::vector<std::string> argv = {roofline::test::binary_path(), "serve", "-m", "synthetic:tiny-qwen3:Q8_0", "--host", "127.0.0.1",
                                     "--port", "0", "-t", "1"};
    argv.insert(argv.end(), args.begin(), args.end());
    // Everything the child needs is built before fork(): it only redirects and execs.
    std::vector<std::string> envs;
    for (char** e = environ; *e; ++e) {
      const std::string kv = *e;
      if (!env.count(kv.substr(0, kv.find('=')))) envs.push_back(kv);
    }
    for (const auto& [k, v] : env) envs.push_back(k + "=" + v);
    std::vector<char*> cargv, cenv;
    for (auto& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    for (auto& e : envs) cenv.push_back(e.data());
    cenv.push_back(nullptr);
    const int log = open(log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    int out[2];
    if (log < 0 || pipe(out) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      dup2(out[1], 1);
      dup2(log, 2);
      close(out[0]);
      execve(cargv[0], cargv.data(), cenv.data());
      _exit(127);
    }
    close(log);
    close(out[1]);
    // Read stdout until "listening on HOST:PORT".
    std::string text;
    char buf[256];
    const std::regex re(R"(listening on [^\s:]+:(\d+))");
    std::smatch m;
    const auto t0 = std::chrono::steady_clock::now();
    while (!std::regex_search(text, m, re) && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60)) {
      const ssize_t n = read(out[0], buf, sizeof buf);
      if (n <= 0) break;
      text.append(buf, (size_t)n);
    }
    stdout_fd_ = out[0];
    if (!std::regex_search(text, m, re)) return;
    port_ = std::stoi(m[1]);
    httplib::Client c("127.0.0.1", port_);
    while (std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60)) {
      auto r = c.Get("/health");
      if (r && r->status == 200) {
        ready_ = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  ~ServeProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      int status = 0;
      for (int i = 0; i < 200 && waitpid(pid_, &status, WNOHANG) == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(25));
      if (waitpid(pid_, &status, WNOHANG) == 0) {
        kill(pid_, SIGKILL);
        waitpid(pid_, &status, 0);
      }
    }
    if (stdout_fd_ >= 0) close(stdout_fd_);
  }
  bool ready() const { return ready_; }
  std::string log() const {
    std::ifstream in(log_path_);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  httplib::Client client(const std::string& key = "") const {
    httplib::Client c("127.0.0.1", port_);
    if (!key.empty()) c.set_default_headers({{"Authorization", "Bearer " + key}});
    c.set_read_timeout(60, 0);
    return c;
  }
  int port() const { return port_; }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
  int stdout_fd_ = -1;
  bool ready_ = false;
  std::string log_path_;
};

json post(httplib::Client& c, const std::string& path, const json& body, int* status = nullptr) {
  auto r = c.Post(path, body.dump(), "application/json");
  if (!r) return json{{"no_response", true}};
  if (status) *status = r->status;
  return json::parse(r->body, nullptr, false);
}

std::string write_file(const std::string& name, const std::string& text) {
  const std::string path = roofline::test::temp_dir() + "/" + name;
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

const json kHi = json::array({json{{"role", "user"}, {"content", "hi"}}});

}  // namespace

TEST(ServeCliTest, ApiKeyFileAndAlias) {
  const std::string keys = write_file("keys.txt", "first-key\nsecond-key\n");
  ServeProcess s({"--api-key-file", keys, "--alias", "my-model"});
  ASSERT_TRUE(s.ready()) << s.log();
  for (const char* key : {"first-key", "second-key"}) {
    auto c = s.client(key);
    auto r = c.Get("/v1/models");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << key;
    EXPECT_EQ(json::parse(r->body)["data"][0]["id"], "my-model");
    const json chat = post(c, "/v1/chat/completions", {{"messages", kHi}, {"max_tokens", 2}});
    EXPECT_EQ(chat["model"], "my-model");
  }
  for (const char* key : {"", "third-key", "first-key\nsecond-key"}) {
    auto c = s.client(key);
    auto r = c.Get("/v1/models");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 401) << "key '" << key << "'";
  }
  EXPECT_EQ(s.client().Get("/health")->status, 200) << "/health needs no key";
}

TEST(ServeCliTest, ChatTemplateFlags) {
  const std::string tmpl =
      "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}{% if greeting is defined %}[{{ greeting }}]{% endif %}"
      "{% if add_generation_prompt %}<assistant>{% endif %}";
  {
    ServeProcess s({"--chat-template", tmpl});
    ASSERT_TRUE(s.ready()) << s.log();
    auto c = s.client();
    EXPECT_EQ(post(c, "/apply-template", {{"messages", kHi}})["prompt"], "<user>hi<assistant>");
    EXPECT_EQ(json::parse(c.Get("/props")->body)["chat_template"], tmpl);
    // The chat endpoint uses it too: its prompt is the tokens of the rendered text.
    const json chat = post(c, "/v1/chat/completions", {{"messages", kHi}, {"max_tokens", 1}});
    const json tok = post(c, "/tokenize", {{"content", "<user>hi<assistant>"}});
    EXPECT_EQ(chat["usage"]["prompt_tokens"], tok["tokens"].size());
  }
  {
    ServeProcess s({"--chat-template-file", write_file("t.jinja", tmpl), "--chat-template-kwargs", R"({"greeting":"hello"})"});
    ASSERT_TRUE(s.ready()) << s.log();
    auto c = s.client();
    EXPECT_EQ(post(c, "/apply-template", {{"messages", kHi}})["prompt"], "<user>hi[hello]<assistant>");
    // A request's own kwargs win over the server's.
    EXPECT_EQ(post(c, "/apply-template", {{"messages", kHi}, {"chat_template_kwargs", {{"greeting", "yo"}}}})["prompt"],
              "<user>hi[yo]<assistant>");
  }
}

// A template whose generation prompt opens a <think> block: with the default reasoning format the
// generated text (no </think> follows from a random model) is reasoning_content; with
// --reasoning-format none it is all content; both are the same tokens.
TEST(ServeCliTest, ReasoningFormat) {
  const std::string tmpl = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}<assistant><think>\n";
  std::string reasoning, content;
  {
    ServeProcess s({"--chat-template", tmpl});
    ASSERT_TRUE(s.ready()) << s.log();
    auto c = s.client();
    EXPECT_EQ(json::parse(c.Get("/props")->body)["chat_template_caps"]["supports_thinking"], true);
    const json r = post(c, "/v1/chat/completions", {{"messages", kHi}, {"max_tokens", 6}, {"temperature", 0}});
    const json& msg = r["choices"][0]["message"];
    ASSERT_TRUE(msg.contains("reasoning_content")) << r.dump();
    reasoning = msg["reasoning_content"];
    EXPECT_TRUE(msg["content"].is_null() || msg["content"] == "") << r.dump();
  }
  {
    ServeProcess s({"--chat-template", tmpl, "--reasoning-format", "none"});
    ASSERT_TRUE(s.ready()) << s.log();
    auto c = s.client();
    EXPECT_EQ(json::parse(c.Get("/props")->body)["chat_template_caps"]["supports_thinking"], false);
    const json r = post(c, "/v1/chat/completions", {{"messages", kHi}, {"max_tokens", 6}, {"temperature", 0}});
    const json& msg = r["choices"][0]["message"];
    EXPECT_FALSE(msg.contains("reasoning_content")) << r.dump();
    content = msg["content"];
  }
  EXPECT_FALSE(content.empty());
  EXPECT_EQ(reasoning, content);
  // A bad value is refused at startup with one line.
  const auto bad = roofline::test::run_cli({"serve", "-m", "synthetic:tiny-qwen3:Q8_0", "--port", "0", "--reasoning-format", "sometimes"});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("--reasoning-format 'sometimes'"), std::string::npos) << bad.err;
}

// The same 100-token prompt twice: with prompt caching the second reuses its full KV blocks (3 of 32);
// with --no-cache-prompt it reuses nothing.
TEST(ServeCliTest, NoCachePrompt) {
  std::vector<int> prompt;
  for (int i = 0; i < 100; ++i) prompt.push_back(10 + (i * 7) % 200);
  for (bool cache : {true, false}) {
    SCOPED_TRACE(cache ? "cache" : "--no-cache-prompt");
    std::vector<std::string> args;
    if (!cache) args.push_back("--no-cache-prompt");
    ServeProcess s(args);
    ASSERT_TRUE(s.ready()) << s.log();
    auto c = s.client();
    const json body = {{"prompt", prompt}, {"max_tokens", 2}, {"temperature", 0}};
    const json first = post(c, "/v1/completions", body), second = post(c, "/v1/completions", body);
    EXPECT_EQ(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    EXPECT_EQ(second["usage"]["prompt_tokens_details"]["cached_tokens"], cache ? 96 : 0) << second.dump();
    EXPECT_EQ(first["choices"][0]["text"], second["choices"][0]["text"]);
  }
}

// One slot and --queue-size 1: while a long request runs and one waits, a third is refused with 503.
TEST(ServeCliTest, QueueSize) {
  ServeProcess s({"-np", "1", "--queue-size", "1", "-c", "8192", "--metrics"});
  ASSERT_TRUE(s.ready()) << s.log();
  std::atomic<bool> stop{false};
  std::thread running([&] {  // streams until told to stop
    auto c = s.client();
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = json{{"prompt", "a"}, {"max_tokens", 8000}, {"stream", true}, {"ignore_eos", true}}.dump();
    req.set_header("Content-Type", "application/json");
    req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return !stop.load(); };
    c.send(req);
  });
  auto metric = [&](const std::string& name) {
    auto r = s.client().Get("/metrics");
    const std::regex re("\n" + std::regex_replace(name, std::regex(":"), "\\:") + " ([0-9.]+)");
    std::smatch m;
    return r && std::regex_search(r->body, m, re) ? std::stod(m[1]) : -1.0;
  };
  auto wait_for = [&](const std::string& name, double value) {
    for (int i = 0; i < 500; ++i) {
      if (metric(name) == value) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  };
  ASSERT_TRUE(wait_for("llamacpp:requests_processing", 1)) << s.log();
  int queued_status = 0;
  std::thread queued([&] {
    auto c = s.client();
    post(c, "/v1/completions", {{"prompt", "b"}, {"max_tokens", 2}}, &queued_status);
  });
  const bool deferred = wait_for("llamacpp:requests_deferred", 1);
  int refused = 0;
  auto c = s.client();
  auto r = c.Post("/v1/completions", json{{"prompt", "c"}, {"max_tokens", 2}}.dump(), "application/json");
  if (r) refused = r->status;
  stop = true;
  running.join();
  queued.join();
  EXPECT_TRUE(deferred);
  EXPECT_EQ(refused, 503);
  EXPECT_EQ(queued_status, 200) << "the queued request runs once the slot is free";
}

// llama-server's environment variables, and the command line over them.
TEST(ServeCliTest, LlamaArgEnvironment) {
  ServeProcess s({}, {{"LLAMA_ARG_ALIAS", "env-alias"},
                      {"LLAMA_ARG_N_PARALLEL", "3"},
                      {"LLAMA_API_KEY", "env-key"},
                      {"LLAMA_ARG_ENDPOINT_METRICS", "1"},
                      {"LLAMA_ARG_CTX_SIZE", "1024"},
                      {"LLAMA_ARG_N_PREDICT", "3"}});
  ASSERT_TRUE(s.ready()) << s.log();
  auto c = s.client("env-key");
  EXPECT_EQ(s.client("other").Get("/v1/models")->status, 401);
  const json props = json::parse(c.Get("/props")->body);
  EXPECT_EQ(props["total_slots"], 3);
  EXPECT_EQ(props["model_alias"], "env-alias");
  EXPECT_EQ(props["default_generation_settings"]["n_ctx"], 1024);
  EXPECT_EQ(c.Get("/metrics")->status, 200);
  const json r = post(c, "/v1/chat/completions", {{"messages", kHi}, {"ignore_eos", true}});
  EXPECT_EQ(r["usage"]["completion_tokens"], 3) << "LLAMA_ARG_N_PREDICT sets the default of chat requests";

  ServeProcess t({"--alias", "flag-alias", "-np", "2"}, {{"LLAMA_ARG_ALIAS", "env-alias"}, {"LLAMA_ARG_N_PARALLEL", "3"}});
  ASSERT_TRUE(t.ready()) << t.log();
  const json p2 = json::parse(t.client().Get("/props")->body);
  EXPECT_EQ(p2["model_alias"], "flag-alias");
  EXPECT_EQ(p2["total_slots"], 2);
}

// --embeddings (or LLAMA_ARG_EMBEDDINGS) serves the embedding routes with --pooling, else the model's
// default: none for a generative model, so only the native routes answer (per-token vectors);
// without the flag they are llama-server's 501.
TEST(ServeCliTest, EmbeddingsFlagPoolingAndEnvironment) {
  {
    ServeProcess s({"--embeddings", "--pooling", "last"});
    ASSERT_TRUE(s.ready()) << s.log();
    auto c = s.client();
    int status = 0;
    const json r = post(c, "/v1/embeddings", json{{"input", {"hello", "world"}}}, &status);
    ASSERT_EQ(status, 200) << r.dump();
    ASSERT_EQ(r["data"].size(), 2u);
    double norm = 0;
    for (const json& x : r["data"][1]["embedding"]) norm += x.get<double>() * x.get<double>();
    EXPECT_NEAR(norm, 1.0, 1e-5);
    EXPECT_NE(s.log().find("embeddings: pooling last, normalisation 2"), std::string::npos) << s.log();
  }
  {
    ServeProcess s({}, {{"LLAMA_ARG_EMBEDDINGS", "1"}});
    ASSERT_TRUE(s.ready()) << s.log();
    auto c = s.client();
    int status = 0;
    const json e = post(c, "/v1/embeddings", json{{"input", "hello"}}, &status);
    EXPECT_EQ(status, 400) << e.dump();
    const json r = post(c, "/embedding", json{{"content", "hello"}}, &status);
    ASSERT_EQ(status, 200) << r.dump();
    EXPECT_GE(r[0]["embedding"].size(), 1u);
    EXPECT_NE(s.log().find("pooling none (the model's default)"), std::string::npos) << s.log();
  }
  {
    ServeProcess s({});
    ASSERT_TRUE(s.ready()) << s.log();
    auto c = s.client();
    int status = 0;
    post(c, "/v1/embeddings", json{{"input", "hello"}}, &status);
    EXPECT_EQ(status, 501);
  }
}

// The chat page is on by default (public even with --api-key); --no-webui and LLAMA_ARG_WEBUI=0 turn
// it off: / is then a 404 like any unknown route.
TEST(ServeCliTest, WebuiFlag) {
  {
    ServeProcess s({"--api-key", "k"});
    ASSERT_TRUE(s.ready()) << s.log();
    auto r = s.client().Get("/");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->get_header_value("Content-Type"), "text/html; charset=utf-8");
  }
  for (const auto& [args, env] : {std::pair<std::vector<std::string>, std::map<std::string, std::string>>{{"--no-webui"}, {}},
                                  {{}, {{"LLAMA_ARG_WEBUI", "0"}}}}) {
    ServeProcess s(args, env);
    ASSERT_TRUE(s.ready()) << s.log();
    auto r = s.client().Get("/");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 404);
    EXPECT_EQ(s.client().Get("/app.js")->status, 404);
    EXPECT_EQ(s.client().Get("/health")->status, 200);
  }
}

// --spec-type draft-mtp on a Qwen3.5 file with an MTP block (recurrent states kept and restored per
// slot): the text of the server without drafts, with the drafts in the timings.
TEST(ServeCliTest, MtpHeadDraftsOnAQwen35Target) {
  ServeProcess plain({"-m", "synthetic:tiny-qwen35-mtp:Q8_0", "-np", "2"});
  ServeProcess spec({"-m", "synthetic:tiny-qwen35-mtp:Q8_0", "-np", "2", "--spec-type", "draft-mtp", "--draft-max", "2"});
  ASSERT_TRUE(plain.ready()) << plain.log();
  ASSERT_TRUE(spec.ready()) << spec.log();
  EXPECT_NE(spec.log().find("the model's MTP head"), std::string::npos) << spec.log();
  auto pc = plain.client(), sc = spec.client();
  for (const json& body : {json{{"prompt", "Once upon a time"}, {"n_predict", 20}, {"temperature", 0}},
                           json{{"prompt", "Once upon a time, there"}, {"n_predict", 17}, {"temperature", 0}}}) {
    const json want = post(pc, "/completion", body), got = post(sc, "/completion", body);
    ASSERT_TRUE(got.contains("content")) << got.dump();
    EXPECT_EQ(got["content"], want["content"]) << body.dump();
    EXPECT_EQ(got["tokens_predicted"], want["tokens_predicted"]);
    EXPECT_GT(got["timings"].value("draft_n", 0), 0) << got["timings"].dump();
  }
}

// -md: speculative decoding gives the text of the server without a draft; the timings report the
// drafts (llama-server's draft_n, draft_n_accepted), /metrics the spec_decode counters; a draft with
// another vocabulary stops the server with one line.
TEST(ServeCliTest, DraftModelFlags) {
  ServeProcess plain({});
  ServeProcess spec({"-md", "synthetic:tiny-qwen3:Q8_0", "--draft-max", "4", "-ngld", "0", "--metrics"});
  ASSERT_TRUE(plain.ready()) << plain.log();
  ASSERT_TRUE(spec.ready()) << spec.log();
  auto pc = plain.client(), sc = spec.client();
  for (const json& body : {json{{"prompt", "Once upon a time"}, {"n_predict", 23}, {"temperature", 0}},
                           json{{"prompt", "The sky"}, {"n_predict", 40}, {"temperature", 0}, {"stop", json::array({"q"})}}}) {
    const json want = post(pc, "/completion", body), got = post(sc, "/completion", body);
    ASSERT_TRUE(got.contains("content")) << got.dump();
    EXPECT_EQ(got["content"], want["content"]) << body.dump();
    EXPECT_EQ(got["tokens_predicted"], want["tokens_predicted"]);
    EXPECT_EQ(got["stop_type"], want["stop_type"]);
    EXPECT_GT(got["timings"].value("draft_n", 0), 0) << got["timings"].dump();
    EXPECT_EQ(got["timings"].value("draft_n_accepted", -1), got["timings"].value("draft_n", 0)) << "the target as its own draft";
    EXPECT_FALSE(want["timings"].contains("draft_n"));
  }
  // llama-server's per-request settings: speculative.n_max 0 turns drafting off for the request.
  json off = post(sc, "/completion", {{"prompt", "Once"}, {"n_predict", 8}, {"temperature", 0}, {"speculative.n_max", 0}});
  EXPECT_FALSE(off["timings"].contains("draft_n")) << off.dump();
  json two = post(sc, "/completion", {{"prompt", "Once"}, {"n_predict", 8}, {"temperature", 0}, {"speculative.n_max", 2}});
  EXPECT_EQ(two["timings"].value("draft_n", 0), 4) << "7 tokens after the first: two steps of 2 drafts + the bonus, then one plain";
  EXPECT_EQ(two["content"], off["content"]);
  int status = 0;
  post(sc, "/completion", {{"prompt", "Once"}, {"speculative.p_min", 3}}, &status);
  EXPECT_EQ(status, 400);
  auto m = sc.Get("/metrics");
  ASSERT_TRUE(m && m->status == 200);
  EXPECT_NE(m->body.find("llamacpp:spec_decode_num_draft_tokens_total "), std::string::npos);
  EXPECT_NE(m->body.find("llamacpp:spec_decode_num_accepted_tokens_total "), std::string::npos);
  EXPECT_NE(spec.log().find("draft acceptance"), std::string::npos) << spec.log();

  const auto bad = roofline::test::run_cli({"serve", "-m", "synthetic:tiny-qwen3:Q8_0", "--port", "0", "-md", "synthetic:qwen3-0.6b:Q4_K_M"});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("error: the draft model's vocabulary has 151936 tokens, the target's 512: a draft must share the target's "
                         "vocabulary\n"), std::string::npos) << bad.err;
  const auto no_mtp = roofline::test::run_cli({"serve", "-m", "synthetic:tiny-qwen35:Q8_0", "--port", "0", "--spec-type", "draft-mtp"});
  EXPECT_EQ(no_mtp.exit_code, 1);
  EXPECT_NE(no_mtp.err.find("has no MTP block"), std::string::npos) << no_mtp.err;
}
