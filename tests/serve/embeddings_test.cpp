// The embeddings API: request parsing (every input form, encoding_format, dimensions, content, errors),
// base64, both response shapes; and the three routes over HTTP on the real engine (CPU, a tiny
// synthetic model): shapes, unit norms, determinism, input forms that agree, token counts, errors in
// the envelope, per-token vectors with pooling none, and a completion served alongside.
#include <gtest/gtest.h>
#include <httplib.h>

#include <cmath>
#include <cstring>
#include <thread>

#include "engine/engine.h"
#include "model/model_file.h"
#include "serve/embeddings.h"
#include "serve/server.h"

using namespace roofline;
using namespace roofline::serve;

namespace {

std::shared_ptr<const Model> tiny_model() {
  static std::shared_ptr<const Model> m = Model::load(open_model_file("synthetic:tiny-qwen3:F32"));
  return m;
}

std::unique_ptr<ModelContext> make_context(Pooling pooling, int n_ctx) {
  auto m = std::make_unique<ModelContext>();
  const Model& model = *tiny_model();
  m->tokenizer = Tokenizer::from_metadata(model.metadata());
  m->chat_template_source = chat_template_from_metadata(model.metadata());
  m->chat_template = std::make_unique<ChatTemplate>(m->chat_template_source);
  m->model_id = "tiny";
  m->n_ctx = n_ctx;
  m->n_vocab = model.hparams().n_vocab;
  m->n_embd = model.hparams().n_embd;
  m->pooling = pooling;
  return m;
}

ApiError parse_error(const std::string& body, const ModelContext& mc, EmbeddingRoute route = EmbeddingRoute::OpenAI) {
  try {
    parse_embedding_request(parse_body(body), mc, route);
  } catch (const ApiError& e) {
    return e;
  }
  return ApiError(200, "(accepted)");
}

std::vector<float> from_base64(const std::string& s) {
  auto val = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    return c == '+' ? 62 : c == '/' ? 63 : -1;
  };
  std::string bytes;
  uint32_t acc = 0;
  int bits = 0;
  for (char c : s) {
    if (c == '=') break;
    acc = acc << 6 | (uint32_t)val(c);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      bytes += (char)((acc >> bits) & 0xFF);
    }
  }
  std::vector<float> out(bytes.size() / 4);
  std::memcpy(out.data(), bytes.data(), out.size() * 4);
  return out;
}

// Vectors computed in different batches (other rows beside them) agree to rounding.
bool close(const json& a, const json& b) {
  if (a.size() != b.size() || a.empty()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::fabs(a[i].get<double>() - b[i].get<double>()) > 1e-5) return false;
  return true;
}

double l2(const json& v) {
  double s = 0;
  for (const json& x : v) s += x.get<double>() * x.get<double>();
  return std::sqrt(s);
}

}  // namespace

TEST(EmbeddingsApi, InputForms) {
  auto mc = make_context(Pooling::Mean, 256);
  const Tokenizer& tok = *mc->tokenizer;
  EmbeddingRequest r = parse_embedding_request(parse_body(R"({"input":"hello world","model":"m1"})"), *mc, EmbeddingRoute::OpenAI);
  ASSERT_EQ(r.inputs.size(), 1u);
  EXPECT_EQ(r.inputs[0], tok.encode("hello world", true, true));
  EXPECT_TRUE(r.openai);
  EXPECT_FALSE(r.base64);
  EXPECT_EQ(r.model, "m1");
  EXPECT_EQ(r.normalize, 2);

  r = parse_embedding_request(parse_body(R"({"input":["a","bc"]})"), *mc, EmbeddingRoute::OpenAI);
  ASSERT_EQ(r.inputs.size(), 2u);
  EXPECT_EQ(r.inputs[1], tok.encode("bc", true, true));
  EXPECT_EQ(r.model, "tiny");

  r = parse_embedding_request(parse_body(R"({"input":[72,105,33]})"), *mc, EmbeddingRoute::OpenAI);
  ASSERT_EQ(r.inputs.size(), 1u);
  EXPECT_EQ(r.inputs[0], (std::vector<int32_t>{72, 105, 33})) << "token ids are taken as they are";

  r = parse_embedding_request(parse_body(R"({"input":[[72,105],[33]],"encoding_format":"base64"})"), *mc, EmbeddingRoute::OpenAI);
  ASSERT_EQ(r.inputs.size(), 2u);
  EXPECT_EQ(r.inputs[1], (std::vector<int32_t>{33}));
  EXPECT_TRUE(r.base64);

  r = parse_embedding_request(parse_body(R"({"input":[72,"hi"]})"), *mc, EmbeddingRoute::OpenAI);  // mixed: one input
  ASSERT_EQ(r.inputs.size(), 1u);
  std::vector<int32_t> mixed = {72};
  for (int32_t t : tok.encode("hi", false, true)) mixed.push_back(t);
  EXPECT_EQ(r.inputs[0], mixed);

  // llama-server's `content` answers in its native shape, even on /v1/embeddings.
  r = parse_embedding_request(parse_body(R"({"content":"hi","embd_normalize":-1})"), *mc, EmbeddingRoute::OpenAI);
  EXPECT_FALSE(r.openai);
  EXPECT_EQ(r.normalize, -1);
  r = parse_embedding_request(parse_body(R"({"input":"hi","dimensions":)" + std::to_string(mc->n_embd) + "}"), *mc, EmbeddingRoute::Native);
  EXPECT_FALSE(r.openai);
}

TEST(EmbeddingsApi, BadRequestsAreClear400s) {
  auto mc = make_context(Pooling::Mean, 256);
  struct Case {
    const char* body;
    const char* param;
    const char* says;
  };
  const Case cases[] = {
      {R"({})", "input", "'input' (or 'content') is required"},
      {R"({"input":null})", "input", "is required"},
      {R"({"input":5})", "input", "must be a non-empty string"},
      {R"({"input":[]})", "input", "must be a non-empty string"},
      {R"({"input":""})", "input", "the input is empty"},
      {R"({"input":["a",""]})", "input", "input 1 is empty"},
      {R"({"input":[[]]})", "input", "must be a string, an array of token ids"},
      {R"({"input":[[1.5]]})", "input", "must hold integer token ids"},
      {R"({"input":[{"a":1}]})", "input", "must be a string"},
      {R"({"input":[99999999]})", "input", "out of range"},
      {R"({"input":[-1]})", "input", "out of range"},
      {R"({"input":"a","encoding_format":"hex"})", "encoding_format", "\"float\" or \"base64\""},
      {R"({"input":"a","encoding_format":1})", "encoding_format", "\"float\" or \"base64\""},
      {R"({"input":"a","dimensions":8})", "dimensions", "'dimensions' is not supported"},
      {R"({"input":"a","embd_normalize":"x"})", "embd_normalize", "must be an integer"},
      {R"({"input":"a","embd_normalize":99})", "embd_normalize", "between -1 and 64"},
  };
  for (const Case& c : cases) {
    const ApiError e = parse_error(c.body, *mc);
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body;
    EXPECT_NE(std::string(e.what()).find(c.says), std::string::npos) << c.body << ": " << e.what();
  }
  json many = json::array();
  for (int i = 0; i < 2049; ++i) many.push_back("x");
  const ApiError too_many = parse_error(json{{"input", many}}.dump(), *mc);
  EXPECT_EQ(too_many.status, 400);
  EXPECT_STREQ(too_many.what(), "'input' has 2049 inputs; at most 2048 per request");
  auto short_ctx = make_context(Pooling::Mean, 4);
  const ApiError too_long = parse_error(R"({"input":["ab",[1,2,3,4,5]]})", *short_ctx);
  EXPECT_EQ(too_long.status, 400);
  EXPECT_EQ(too_long.code, "context_length_exceeded");
  EXPECT_STREQ(too_long.what(), "input 1 has 5 tokens, more than the context size of 4 tokens: shorten it or start the server with a larger -c");
  // Pooling none: no single vector per input, so the OpenAI form is refused; the native one is not.
  auto none = make_context(Pooling::None, 256);
  const ApiError e = parse_error(R"({"input":"a"})", *none);
  EXPECT_EQ(e.status, 400);
  EXPECT_NE(std::string(e.what()).find("--pooling mean, last or cls"), std::string::npos) << e.what();
  EXPECT_EQ(parse_error(R"({"input":"a"})", *none, EmbeddingRoute::Native).status, 200);
  EXPECT_EQ(parse_error(R"({"content":"a"})", *none).status, 200);
}

TEST(EmbeddingsApi, Base64AndResponseShapes) {
  EXPECT_EQ(base64_encode("", 0), "");
  EXPECT_EQ(base64_encode("f", 1), "Zg==");
  EXPECT_EQ(base64_encode("fo", 2), "Zm8=");
  EXPECT_EQ(base64_encode("foo", 3), "Zm9v");
  EXPECT_EQ(base64_encode("foobar", 6), "Zm9vYmFy");

  auto mc = make_context(Pooling::Mean, 256);
  EmbeddingRequest r;
  r.inputs = {{1, 2, 3}, {4}};
  r.model = "m";
  const std::vector<std::vector<std::vector<float>>> v = {{{0.6f, -0.8f}}, {{1.0f, 0.0f}}};
  json j = embedding_response(r, *mc, v);
  EXPECT_EQ(j["object"], "list");
  EXPECT_EQ(j["model"], "m");
  EXPECT_EQ(j["usage"], (json{{"prompt_tokens", 4}, {"total_tokens", 4}}));
  ASSERT_EQ(j["data"].size(), 2u);
  EXPECT_EQ(j["data"][1]["object"], "embedding");
  EXPECT_EQ(j["data"][1]["index"], 1);
  EXPECT_EQ(j["data"][0]["embedding"][1].get<float>(), -0.8f);
  r.base64 = true;
  j = embedding_response(r, *mc, v);
  EXPECT_EQ(from_base64(j["data"][0]["embedding"].get<std::string>()), v[0][0]);
  r.openai = false;
  j = embedding_response(r, *mc, v);
  ASSERT_TRUE(j.is_array());
  EXPECT_EQ(j[1]["index"], 1);
  EXPECT_EQ(j[1]["embedding"][0][0].get<float>(), 1.0f);
}

// Over HTTP on the real engine.
class EmbeddingsServer : public ::testing::Test {
 protected:
  void start(Pooling pooling, bool enabled = true, int n_ctx = 128) {
    mc = make_context(pooling, n_ctx);
    EngineOptions o;
    o.n_ctx = n_ctx;
    o.n_batch = 32;
    o.kv_block_size = 16;
    o.n_threads = 2;
    engine = Engine::create(tiny_model(), o);
    runner = std::make_unique<EngineRunner>(*engine);
    text = std::make_unique<TokenizerText>(mc->tokenizer);
    SchedulerOptions so;
    so.n_slots = 4;
    so.queue_size = 4;
    mc->n_slots = 2;  // inputs go in windows of two
    scheduler = std::make_unique<Scheduler>(*runner, *text, so, &metrics);
    ServerOptions opt;
    opt.port = 0;
    opt.embeddings = enabled;
    server = std::make_unique<Server>(opt);
    port = server->bind();
    server->start();
    scheduler->start();
    server->set_ready(mc.get(), scheduler.get(), &metrics);
  }
  void TearDown() override {
    if (scheduler) {
      scheduler->stop(true);
      scheduler->join();
    }
    if (server) server->stop();
  }
  json post(const std::string& path, const std::string& body, int* status) {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(60, 0);
    auto r = c.Post(path, body, "application/json");
    if (!r) return json{{"no_response", true}};
    *status = r->status;
    return json::parse(r->body, nullptr, false);
  }
  std::unique_ptr<ModelContext> mc;
  Metrics metrics;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<EngineRunner> runner;
  std::unique_ptr<TokenizerText> text;
  std::unique_ptr<Scheduler> scheduler;
  std::unique_ptr<Server> server;
  int port = 0;
};

TEST_F(EmbeddingsServer, EveryInputFormShapesNormsAndDeterminism) {
  start(Pooling::Mean);
  const int n_embd = mc->n_embd;
  int st = 0;
  const json one = post("/v1/embeddings", R"({"model":"x","input":"The quick brown fox"})", &st);
  ASSERT_EQ(st, 200) << one.dump();
  EXPECT_EQ(one["object"], "list");
  EXPECT_EQ(one["model"], "x");
  ASSERT_EQ(one["data"].size(), 1u);
  const json& v = one["data"][0]["embedding"];
  ASSERT_EQ(v.size(), (size_t)n_embd);
  EXPECT_NEAR(l2(v), 1.0, 1e-5);
  const auto ids = mc->tokenizer->encode("The quick brown fox", true, true);
  EXPECT_EQ(one["usage"]["prompt_tokens"], ids.size());
  EXPECT_EQ(one["usage"]["total_tokens"], ids.size());

  // The same text as a list, as token ids, as a list of token-id lists, and again: the same vector.
  json tokens = json::array();
  for (int32_t t : ids) tokens.push_back(t);
  const json list = post("/v1/embeddings", json{{"input", {"The quick brown fox", "jumps"}}}.dump(), &st);
  ASSERT_EQ(st, 200) << list.dump();
  ASSERT_EQ(list["data"].size(), 2u);
  EXPECT_EQ(list["data"][0]["index"], 0);
  EXPECT_EQ(list["data"][1]["index"], 1);
  EXPECT_TRUE(close(list["data"][0]["embedding"], v));
  EXPECT_FALSE(close(list["data"][1]["embedding"], v));
  const json by_ids = post("/v1/embeddings", json{{"input", tokens}}.dump(), &st);
  ASSERT_EQ(st, 200);
  EXPECT_EQ(by_ids["data"][0]["embedding"], v);
  const json by_lists = post("/v1/embeddings", json{{"input", {tokens, {72, 105}}}}.dump(), &st);
  ASSERT_EQ(st, 200);
  ASSERT_EQ(by_lists["data"].size(), 2u);
  EXPECT_TRUE(close(by_lists["data"][0]["embedding"], v));
  EXPECT_EQ(by_lists["usage"]["prompt_tokens"], ids.size() + 2);
  EXPECT_EQ(post("/v1/embeddings", R"({"input":"The quick brown fox"})", &st)["data"][0]["embedding"], v) << "not deterministic";

  // base64: the same floats, little-endian float32.
  const json b64 = post("/v1/embeddings", R"({"input":"The quick brown fox","encoding_format":"base64"})", &st);
  ASSERT_EQ(st, 200);
  const std::vector<float> decoded = from_base64(b64["data"][0]["embedding"].get<std::string>());
  ASSERT_EQ(decoded.size(), (size_t)n_embd);
  for (int i = 0; i < n_embd; ++i) EXPECT_EQ(decoded[i], v[i].get<float>());

  // llama-server's routes: the native array, one vector per input.
  for (const char* path : {"/embeddings", "/embedding"}) {
    const json nat = post(path, R"({"content":"The quick brown fox"})", &st);
    ASSERT_EQ(st, 200) << nat.dump();
    ASSERT_TRUE(nat.is_array());
    ASSERT_EQ(nat[0]["embedding"].size(), 1u);
    EXPECT_TRUE(close(nat[0]["embedding"][0], v));
  }
  // No KV left behind by any of them.
  EXPECT_EQ(engine->memory().used_blocks(), 0);
}

TEST_F(EmbeddingsServer, ErrorsInTheEnvelope) {
  start(Pooling::Last, true, 64);
  int st = 0;
  std::string long_text;
  for (int i = 0; i < 100; ++i) long_text += "word ";
  struct Case {
    std::string body;
    const char* says;
  };
  const Case cases[] = {
      {json{{"input", long_text}}.dump(), "more than the context size of 64 tokens"},
      {R"({"input":"a","dimensions":3})", "'dimensions' is not supported"},
      {R"({"input":"a","encoding_format":"hex"})", "\"float\" or \"base64\""},
      {R"({"input":""})", "empty"},
      {R"({"nothing":1})", "is required"},
      {R"(not json)", ""},
  };
  for (const Case& c : cases) {
    const json e = post("/v1/embeddings", c.body, &st);
    EXPECT_EQ(st, 400) << c.body << " -> " << e.dump();
    ASSERT_TRUE(e.contains("error")) << e.dump();
    EXPECT_EQ(e["error"]["type"], "invalid_request_error");
    EXPECT_NE(e["error"]["message"].get<std::string>().find(c.says), std::string::npos) << e.dump();
  }
  // A list where one input is too long: none of it runs.
  EXPECT_EQ(post("/v1/embeddings", json{{"input", {"short", long_text}}}.dump(), &st).contains("error"), true);
  EXPECT_EQ(st, 400);
  EXPECT_EQ(engine->memory().used_blocks(), 0);
}

TEST_F(EmbeddingsServer, WithoutTheFlagIs501) {
  start(Pooling::Mean, false);
  int st = 0;
  const json e = post("/v1/embeddings", R"({"input":"a"})", &st);
  EXPECT_EQ(st, 501);
  EXPECT_EQ(e["error"]["type"], "not_supported_error");
}

TEST_F(EmbeddingsServer, PoolingNoneGivesPerTokenVectorsOnTheNativeRoutes) {
  start(Pooling::None);
  int st = 0;
  const json e = post("/v1/embeddings", R"({"input":"hello there"})", &st);
  EXPECT_EQ(st, 400) << e.dump();
  const json nat = post("/embeddings", R"({"input":["hello there","x"]})", &st);
  ASSERT_EQ(st, 200) << nat.dump();
  ASSERT_EQ(nat.size(), 2u);
  EXPECT_EQ(nat[0]["embedding"].size(), mc->tokenizer->encode("hello there", true, true).size());
  EXPECT_EQ(nat[0]["embedding"][0].size(), (size_t)mc->n_embd);
  EXPECT_EQ(nat[1]["index"], 1);
}

// A list longer than the queue runs (a window at a time), in order.
TEST_F(EmbeddingsServer, ListsLongerThanTheQueue) {
  start(Pooling::Last);
  json inputs = json::array();
  for (int i = 0; i < 40; ++i) inputs.push_back("input number " + std::to_string(i));
  int st = 0;
  const json r = post("/v1/embeddings", json{{"input", inputs}}.dump(), &st);
  ASSERT_EQ(st, 200) << r.dump();
  ASSERT_EQ(r["data"].size(), 40u);
  for (int i : {0, 17, 39}) {
    EXPECT_EQ(r["data"][i]["index"], i);
    const json one = post("/v1/embeddings", json{{"input", inputs[i]}}.dump(), &st);
    EXPECT_TRUE(close(r["data"][i]["embedding"], one["data"][0]["embedding"])) << i;
  }
  EXPECT_EQ(engine->memory().used_blocks(), 0);
}

// Embeddings and a completion at once: both answer, the completion as it does alone.
TEST_F(EmbeddingsServer, ServedBesideGeneration) {
  start(Pooling::Mean, true, 256);
  const std::string completion = R"({"prompt":"Once upon a time","max_tokens":16,"temperature":0})";
  int st = 0;
  const json alone = post("/v1/completions", completion, &st);
  ASSERT_EQ(st, 200) << alone.dump();
  json together;
  int st2 = 0;
  std::thread gen([&] { together = post("/v1/completions", completion, &st2); });
  std::vector<json> embeds(3);
  std::vector<int> sts(3, 0);
  std::vector<std::thread> ts;
  for (int k = 0; k < 3; ++k)
    ts.emplace_back([&, k] { embeds[k] = post("/v1/embeddings", json{{"input", {"alpha beta gamma", "delta"}}}.dump(), &sts[k]); });
  gen.join();
  for (auto& t : ts) t.join();
  ASSERT_EQ(st2, 200);
  EXPECT_EQ(together["choices"][0]["text"], alone["choices"][0]["text"]);
  for (int k = 0; k < 3; ++k) {
    ASSERT_EQ(sts[k], 200) << embeds[k].dump();
    for (int i = 0; i < 2; ++i) EXPECT_TRUE(close(embeds[k]["data"][i]["embedding"], embeds[0]["data"][i]["embedding"]));
  }
}
