// libFuzzer target: a generation request run to its end, as the server runs it: the body parsed
// (/v1/chat/completions, /v1/completions or /completion, by the first byte), submitted to the scheduler
// over the real engine (CPU) of the tiny Qwen3-shaped model, stepped until every part has finished,
// and answered whole and streamed by the ResponseBuilder. Sampling settings, stop strings, logit bias,
// logprobs, grammars and schemas, tools, n and prompt arrays all take effect on real logits (random
// weights: the tokens are arbitrary, which is what a fuzzer wants). A 400 is fine; a request that was
// accepted must finish without an error event, and the two responses must be JSON. Anything else
// (another exception, a sanitizer report, a request that never ends) is a defect. Generation is capped
// at 12 tokens a choice, 4 choices and 4 prompts so that an input stays fast. First bytes 3 and 4 are
// /v1/embeddings and /embeddings instead (run_embeddings, the scheduler stepped by a second thread as
// the server's loop would; last-token pooling, or none when the byte's next bit says so).
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "engine/pooling.h"
#include "model/model.h"
#include "model/model_file.h"
#include "serve/api.h"
#include "serve/embeddings.h"
#include "serve/scheduler.h"
#include "serve/step_runner.h"
#include "tests/fuzz/libfuzzer/fuzz_common.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

using namespace roofline;
using namespace roofline::serve;

namespace {

struct World {
  ModelContext mc;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<EngineRunner> runner;
  std::unique_ptr<TokenizerText> text;
  std::unique_ptr<Scheduler> scheduler;
};

World& world() {
  static World* w = [] {
    auto* w = new World;
    auto file = open_model_file("synthetic:tiny-qwen3:F32");
    auto model = Model::load(file);
    EngineOptions o;
    o.n_ctx = 512;
    o.n_threads = 1;
    o.n_batch = 64;
    o.kv_block_size = 16;
    o.n_seq_max = 4;
    w->engine = Engine::create(model, o);
    w->runner = std::make_unique<EngineRunner>(*w->engine);
    w->mc.tokenizer = Tokenizer::from_metadata(file->metadata());
    w->mc.chat_template_source = chat_template_from_metadata(file->metadata());
    w->mc.chat_template = std::make_unique<ChatTemplate>(w->mc.chat_template_source);
    w->mc.model_id = "tiny";
    w->mc.n_vocab = w->mc.tokenizer->n_vocab();
    w->mc.n_ctx = o.n_ctx;
    w->mc.n_embd = model->hparams().n_embd;
    w->mc.n_slots = 4;
    w->text = std::make_unique<TokenizerText>(w->mc.tokenizer);
    SchedulerOptions so;
    so.n_slots = 4;
    so.queue_size = 8;
    w->scheduler = std::make_unique<Scheduler>(*w->runner, *w->text, so);
    return w;
  }();
  return *w;
}

// An embeddings request: parsed, run, answered; a 400 (or a 503 for a full queue) is fine.
void run_embedding_request(World& w, const std::string& body_text, EmbeddingRoute route) {
  EmbeddingRequest r;
  try {
    r = parse_embedding_request(parse_body(body_text), w.mc, route);
  } catch (const ApiError& e) {
    if (e.status >= 500) fuzz::defect("parsing the embeddings request", e.what());
    return;
  } catch (const Error&) {
    return;
  } catch (const std::exception& e) {
    fuzz::defect("parsing the embeddings request", e.what());
  }
  if (r.inputs.size() > 8) return;
  std::atomic<bool> done{false};
  std::thread stepper([&] {
    while (!done) w.scheduler->step();
  });
  try {
    (void)run_embeddings(r, w.mc, *w.scheduler, "emb", [] { return true; }).dump();
  } catch (const ApiError& e) {
    if (e.status >= 500 && e.status != 503) {
      done = true;
      stepper.join();
      fuzz::defect("embeddings", e.what());
    }
  } catch (const SubmitError& e) {
    if (e.status != 400 && e.code != "queue_full") {
      done = true;
      stepper.join();
      fuzz::defect("embeddings submit", e.what());
    }
  } catch (const Error&) {
  } catch (const std::exception& e) {
    done = true;
    stepper.join();
    fuzz::defect("embeddings", e.what());
  }
  done = true;
  stepper.join();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  World& w = world();
  const std::string body_text(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 5 >= 3) {
    w.mc.pooling = (data[0] / 5) % 2 ? Pooling::None : Pooling::Last;
    run_embedding_request(w, body_text, data[0] % 5 == 3 ? EmbeddingRoute::OpenAI : EmbeddingRoute::Native);
    return 0;
  }
  const Endpoint endpoint = data[0] % 5 == 0 ? Endpoint::Chat : data[0] % 5 == 1 ? Endpoint::Completions : Endpoint::Native;
  ApiRequest ar;
  try {
    const json body = parse_body(body_text);
    ar = endpoint == Endpoint::Chat ? parse_chat_request(body, w.mc) : parse_completion_request(body, w.mc, endpoint);
  } catch (const ApiError& e) {
    if (e.status >= 500) fuzz::defect("parsing the request", e.what());
    return 0;
  } catch (const InternalError& e) {
    fuzz::defect("parsing the request", e.what());
  } catch (const Error&) {
    return 0;
  } catch (const std::exception& e) {
    fuzz::defect("parsing the request", e.what());
  }
  if (ar.gen.n > 4 || ar.prompts.size() > 4) return 0;
  if (ar.gen.max_tokens < 0 || ar.gen.max_tokens > 12) ar.gen.max_tokens = 12;
  ar.gen.id = "fuzz";

  std::vector<std::shared_ptr<Request>> parts;
  try {
    if (ar.prompts.empty()) {
      parts.push_back(w.scheduler->submit(ar.gen));
    } else {
      for (const auto& p : ar.prompts) {
        GenParams g = ar.gen;
        g.prompt = p;
        parts.push_back(w.scheduler->submit(g));
      }
    }
  } catch (const SubmitError& e) {
    for (auto& p : parts) p->cancel();
    for (int i = 0; i < 100; ++i) w.scheduler->step();  // let cancelled parts end
    if (e.status != 400 && e.code != "queue_full") fuzz::defect("submit", e.what());
    return 0;
  }

  try {
    ResponseBuilder whole(ar, w.mc, "id", 0), streamed(ar, w.mc, "id", 0);
    std::string sse = streamed.stream_begin();
    std::vector<bool> done(parts.size(), false);
    for (int step = 0;; ++step) {
      if (step > 5000) fuzz::defect("scheduler", "the request did not finish in 5000 steps");
      bool all = true;
      for (size_t i = 0; i < parts.size(); ++i) {
        if (done[i]) continue;
        std::vector<Event> events;
        done[i] = parts[i]->poll(events, std::chrono::milliseconds(0));
        for (Event& e : events) {
          if (e.finish == Finish::Error) fuzz::defect("generation", e.error.c_str());
          e.choice += (int)i * ar.gen.n;
        }
        whole.add_events(events);
        sse += streamed.stream_events(events);
        all = all && done[i];
      }
      if (all) break;
      w.scheduler->step();
    }
    const Timings t = parts[0]->timings();
    (void)whole.response(t).dump();
    sse += streamed.stream_end(t);
    if (whole.error()) fuzz::defect("response", whole.error()->second.c_str());
  } catch (const std::exception& e) {
    fuzz::defect("running the request", e.what());
  }
  return 0;
}
