// `roofline serve -m MODEL [--host H] [--port P] [-np N] [-c CTX] ...`: the OpenAI-compatible server,
// with llama-server's flag names and LLAMA_ARG_* environment variables. It listens first (/health is
// 503 while the model loads), then serves; SIGINT/SIGTERM stop accepting, let running requests
// finish (a second signal, or the grace period, cancels them) and exit cleanly.
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>

#include "cli/command.h"
#include "cli/draft_options.h"
#include "cli/model_options.h"
#include "core/error.h"
#include "core/log.h"
#include "backend/gpu.h"
#include "engine/gpu_table.h"
#include "engine/memory_plan.h"
#include "engine/pooling.h"
#include "engine/warm_up.h"
#include "serve/malloc_arenas.h"
#include "serve/server.h"

namespace roofline::cli {
namespace {

// The warm-up's walk through the decode graphs' depths; ROOFLINE_WARMUP_WALK=0 leaves it out (to measure what it
// saves: the captures then land on the first requests).
bool warm_up_walk_enabled() {
  const char* e = std::getenv("ROOFLINE_WARMUP_WALK");
  return !(e && std::strcmp(e, "0") == 0);
}

using serve::json;

int g_signal_pipe[2] = {-1, -1};  // the signal handler's only way out (async-signal-safe): the signal number
int g_loaded_pipe[2] = {-1, -1};  // the loader thread's "done" (loaded or failed)

void on_signal(int sig) {
  const char c = (char)sig;
  const ssize_t n = write(g_signal_pipe[1], &c, 1);
  (void)n;
}

// -b not given: steps of kLargeServeBatch rows where the whole model fits the GPU with their buffers
// (serve_batch_size); several GPUs, experts placed by flag, a draft model or no GPU: -b's default.
int choose_serve_batch(const Model& model, const ModelArgs& a, int n_parallel, bool prompt_cache) {
  const EngineOptions o = engine_options(a);
  if (o.n_gpu_layers == 0 || o.n_cpu_moe != 0 || !o.cpu_tensor_patterns.empty() || o.gpu_ids.size() > 1) return a.n_batch;
  const auto devices = gpu_devices();
  const int id = o.gpu_ids.empty() ? o.main_gpu : o.gpu_ids[0];
  if (id < 0 || id >= (int)devices.size()) return a.n_batch;
  if (devices.size() > 1 && o.gpu_ids.empty() && o.split_mode != EngineOptions::SplitMode::None) return a.n_batch;
  PlanSettings s;
  s.n_ctx = a.n_ctx;
  s.n_parallel = n_parallel;
  s.type_k = o.type_k, s.type_v = o.type_v;
  s.n_batch = a.n_batch;
  s.kv_block_size = o.kv_block_size;
  s.prompt_cache = prompt_cache;
  s.margin_gib = o.gpu_margin_gib;
  s.vram_limit_gib = o.vram_limit_gib.empty() ? 0 : o.vram_limit_gib[0];
  s.f16_copies = o.f16_copies != F16Copies::Off;
  s.f16_copies_max_gib = o.f16_copies_max_gib;
  try {
    return serve_batch_size(model, local_gpu_spec(devices[(size_t)id], s.cuda_context_gib), s);
  } catch (const Error& e) {
    log_debug("batch size: {}", e.what());
  }
  return a.n_batch;
}

// Waits up to timeout_ms (-1: forever) for a signal; true when one came.
bool wait_signal(int timeout_ms) {
  pollfd p{g_signal_pipe[0], POLLIN, 0};
  for (;;) {
    const int r = poll(&p, 1, timeout_ms);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    char buf[16];
    const ssize_t n = read(g_signal_pipe[0], buf, sizeof buf);
    (void)n;
    return true;
  }
}

// Waits for the loader thread or a signal, whichever comes first: the signal's number, or 0 when the
// loader is done.
int wait_signal_or_loaded() {
  pollfd p[2] = {{g_signal_pipe[0], POLLIN, 0}, {g_loaded_pipe[0], POLLIN, 0}};
  for (;;) {
    const int r = poll(p, 2, -1);
    if (r < 0 && errno == EINTR) continue;
    if (p[0].revents & POLLIN) {
      char c = 0;
      const ssize_t n = read(g_signal_pipe[0], &c, 1);
      return n == 1 && c > 0 ? (int)c : SIGTERM;
    }
    if (p[1].revents & POLLIN) return 0;
  }
}

std::vector<std::string> split_keys(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string k;
  while (std::getline(ss, k, ',')) {
    while (!k.empty() && (k.back() == ' ' || k.back() == '\n' || k.back() == '\r')) k.pop_back();
    while (!k.empty() && k.front() == ' ') k.erase(0, 1);
    if (!k.empty()) out.push_back(k);
  }
  return out;
}

// llama.cpp's `-fa` and `-cb` may stand alone or take on/off/auto: give the bare form a value.
std::vector<std::string> fill_optional_values(std::vector<std::string> args) {
  static const char* kOptional[] = {"--flash-attn", "--cont-batching"};
  static const char* kValues[] = {"on", "off", "auto", "1", "0", "true", "false", "enabled", "disabled"};
  std::vector<std::string> out;
  for (size_t i = 0; i < args.size(); ++i) {
    out.push_back(args[i]);
    for (const char* o : kOptional) {
      if (args[i] != o) continue;
      const bool has_value = i + 1 < args.size() && std::find(std::begin(kValues), std::end(kValues), args[i + 1]) != std::end(kValues);
      if (!has_value) out.push_back("on");
    }
  }
  return out;
}

int run(int argc, char** argv) {
  CLI::App app{"OpenAI-compatible server with parallel slots and continuous batching (a drop-in for llama-server)"};
  ModelArgs margs;
  // Steps of up to -b tokens: 512 (llama-server's physical batch, -ub), or 2048 where the whole model fits
  // the GPU with their buffers (choose_serve_batch). Larger steps let the prompts of many requests share a
  // step, but their buffers (logits for every row) come out of the GPU memory that -ngl auto would give to
  // layers, so they are taken only where no layer needs that memory.
  add_model_options(app, margs);
  app.get_option("--batch-size")
      ->description("most tokens per forward step (default: 2048 where the whole model, the KV cache and every f16 copy fit the GPU "
                    "with such steps, else 512)")
      ->default_str("auto");
  DraftArgs dargs;  // speculative decoding: -md, --draft-max, --draft-min, --draft-p-min, -ngld
  add_draft_options(app, dargs);
  serve::ServerOptions so;
  std::string api_key, api_key_file, alias, template_file, template_text, template_kwargs, flash_attn = "auto",
      cont_batching = "on", reasoning_format = "auto";
  int n_parallel = 4, queue_size = -1, n_predict = -1, ubatch = 512, shutdown_grace = 30;
  bool no_prompt_cache = false, jinja = true, kv_unified = true;
  SamplingParams sp;
  sp.seed = 0xFFFFFFFFu;
  int64_t seed = -1;
  double body_mib = 16;
  app.add_option("--host", so.host, "address to listen on")->capture_default_str()->envname("LLAMA_ARG_HOST");
  app.add_option("--port", so.port, "port to listen on, 0..65535 (0: any free port)")->capture_default_str()->envname("LLAMA_ARG_PORT");
  app.add_option("--parallel", n_parallel, "parallel slots (-np; -1: auto, 4)")->capture_default_str()->envname("LLAMA_ARG_N_PARALLEL");
  app.add_option("--queue-size", queue_size, "requests that may wait for a slot (default 4 x slots); beyond: 503")
      ->envname("LLAMA_ARG_QUEUE_SIZE");
  app.add_option("--api-key", api_key, "API key(s), comma-separated; clients send Authorization: Bearer KEY")->envname("LLAMA_API_KEY");
  app.add_option("--api-key-file", api_key_file, "file with one API key per line");
  app.add_option("--alias", alias, "model name in responses and /v1/models")->envname("LLAMA_ARG_ALIAS");
  app.add_option("--chat-template-file", template_file, "Jinja chat template to use instead of the model's")
      ->envname("LLAMA_ARG_CHAT_TEMPLATE_FILE");
  app.add_option("--chat-template", template_text, "Jinja chat template text to use instead of the model's")
      ->envname("LLAMA_ARG_CHAT_TEMPLATE");
  app.add_option("--chat-template-kwargs", template_kwargs, "JSON object of extra template variables, e.g. {\"enable_thinking\":false}")
      ->envname("LLAMA_CHAT_TEMPLATE_KWARGS");
  app.add_option("--reasoning-format", reasoning_format, "auto|deepseek: <think> text goes to reasoning_content; none: left in content")
      ->capture_default_str()->envname("LLAMA_ARG_THINK");
  app.add_flag("--metrics", so.metrics, "enable GET /metrics (Prometheus)")->envname("LLAMA_ARG_ENDPOINT_METRICS");
  app.add_flag("--slots,!--no-slots", so.slots, "GET /slots (on by default)")->envname("LLAMA_ARG_ENDPOINT_SLOTS");
  app.add_flag("--webui,!--no-webui", so.webui, "the built-in chat page at / (on by default)")->envname("LLAMA_ARG_WEBUI");
  app.add_option("--timeout", so.timeout_s, "read/write timeout of a connection in seconds (-to)")
      ->capture_default_str()->envname("LLAMA_ARG_TIMEOUT");
  app.add_option("--threads-http", so.threads_http, "resident HTTP worker threads (default max(np + 4, cores - 1); more start on demand)")
      ->envname("LLAMA_ARG_THREADS_HTTP");
  app.add_option("--max-body-size", body_mib, "largest request body in MiB (beyond: 413)")->capture_default_str();
  app.add_option("--flash-attn", flash_attn, "accepted for llama.cpp compatibility (-fa); roofline's attention is always fused")
      ->envname("LLAMA_ARG_FLASH_ATTN");
  app.add_option("--ubatch-size", ubatch, "accepted for compatibility (-ub); steps are sized by -b")->envname("LLAMA_ARG_UBATCH");
  app.add_option("--cont-batching", cont_batching, "continuous batching is always on (-cb)")->envname("LLAMA_ARG_CONT_BATCHING");
  app.add_flag("--no-cont-batching", [](int64_t) {}, "ignored: continuous batching is always on");
  app.add_flag("--jinja,!--no-jinja", jinja, "Jinja chat templates (always on)");
  app.add_flag("--kv-unified,!--no-kv-unified", kv_unified, "one KV pool shared by all slots (always)");
  app.add_flag("--no-cache-prompt", no_prompt_cache, "do not reuse the KV blocks of earlier prompts");
  bool no_warmup = false;
  app.add_flag("--no-warmup", no_warmup, "skip the warm-up steps before listening (they load the kernels the first requests would)");
  double cache_ram_mib = 8192;
  app.add_option("--cache-ram", cache_ram_mib,
                 "sliding-window models (gemma3): MiB of host memory for prompt-cache snapshots of the window (-cram; "
                 "-1: no limit, 0: none)")
      ->capture_default_str()->envname("LLAMA_ARG_CACHE_RAM");
  std::string pooling;
  int embd_normalize = 2;
  app.add_flag("--embedding,--embeddings", so.embeddings, "serve POST /v1/embeddings, /embeddings and /embedding (beside generation)")
      ->envname("LLAMA_ARG_EMBEDDINGS");
  app.add_option("--pooling", pooling, "embeddings: none, mean, cls or last (default: the model's pooling_type key, else none)")
      ->envname("LLAMA_ARG_POOLING");
  app.add_option("--embd-normalize", embd_normalize,
                 "embeddings: -1 none, 0 max absolute (int16 range), 1 taxicab, 2 Euclidean, >2 p-norm")->capture_default_str();
  app.add_option("--shutdown-grace", shutdown_grace, "seconds running requests may take to finish after SIGINT/SIGTERM")
      ->capture_default_str();
  app.add_option("-n,--n-predict", n_predict, "default most tokens to generate (-1: until end of generation)")
      ->capture_default_str()->envname("LLAMA_ARG_N_PREDICT");
  app.add_option("--temp", sp.temperature, "default temperature")->capture_default_str();
  app.add_option("--top-k", sp.top_k, "default top-k (0: off)")->capture_default_str();
  app.add_option("--top-p", sp.top_p, "default top-p")->capture_default_str();
  app.add_option("--min-p", sp.min_p, "default min-p")->capture_default_str();
  app.add_option("--typical", sp.typical_p, "default locally typical sampling p (1: off)")->capture_default_str();
  app.add_option("--repeat-penalty", sp.repeat_penalty, "default repetition penalty")->capture_default_str();
  app.add_option("--repeat-last-n", sp.repeat_last_n, "default penalty window")->capture_default_str();
  app.add_option("--presence-penalty", sp.presence_penalty, "default presence penalty")->capture_default_str();
  app.add_option("--frequency-penalty", sp.frequency_penalty, "default frequency penalty")->capture_default_str();
  app.add_option("-s,--seed", seed, "default seed (-1: random)")->capture_default_str();
  if (int rc = parse_args(app, fill_optional_values(normalize_llama_flags(argc, argv))); rc >= 0) return rc;
  const bool batch_given = app.count("--batch-size") > 0 || std::getenv("LLAMA_ARG_BATCH") != nullptr;

  // Everything that can be checked without the model is checked before listening, so a bad value
  // exits at once with one line (and never leaves a server answering "Loading model").
  std::optional<Pooling> pooling_override;
  if (!pooling.empty()) {
    try {
      pooling_override = parse_pooling(pooling);
    } catch (const Error& e) {
      usage_fail("{}", e.what());  // not one of the flag's values: exit status 2
    }
  }
  if (embd_normalize < -1 || embd_normalize > 64) fail("--embd-normalize {}: expected -1..64", embd_normalize);
  if (!so.embeddings && (pooling_override || app.count("--embd-normalize")))
    log_warn("--pooling and --embd-normalize only matter with --embeddings");
  if (so.port < 0 || so.port > 65535) fail("--port {}: expected 0..65535 (0: any free port)", so.port);
  if (n_parallel == -1) n_parallel = 4;  // llama-server: -1 means auto (4 slots)
  if (n_parallel <= 0 || n_parallel > kMaxSlots) fail("-np {}: expected 1..{} slots (or -1: auto, 4)", n_parallel, kMaxSlots);
  if (queue_size < 0) queue_size = 4 * n_parallel;
  if (queue_size > (1 << 20)) fail("--queue-size {}: expected at most {} waiting requests", queue_size, 1 << 20);
  if (so.timeout_s <= 0) fail("--timeout {}: expected at least 1 second", so.timeout_s);
  if (so.threads_http < 0) fail("--threads-http {}: expected 0 (auto) or more", so.threads_http);
  if (!(body_mib > 0 && body_mib <= 1048576)) fail("--max-body-size {}: expected a positive size in MiB, at most 1048576", body_mib);
  if (n_predict < -2) fail("-n {}: expected a count, -1 (until the end of generation) or -2 (until the context is full)", n_predict);
  if (seed != -1) sp.seed = (uint64_t)seed;
  check_sampling(sp);
  (void)engine_options(margs);  // -c, -b, -ctk/-ctv, -ngl, -sm, -ts, --vram-limit
  if (dargs.given()) check_draft_args(dargs);
  // llama-server flags roofline takes but that change nothing here: one line naming them.
  std::vector<std::string> ignored;
  auto is_off = [](const std::string& v) { return v == "off" || v == "0" || v == "false" || v == "disabled"; };
  if (app.count("--flash-attn") && is_off(flash_attn)) ignored.push_back("-fa " + flash_attn + " (attention is always the fused kernel)");
  if (app.count("--ubatch-size")) ignored.push_back(fmt::format("-ub {} (steps are sized by -b)", ubatch));
  if ((app.count("--cont-batching") && is_off(cont_batching)) || app.count("--no-cont-batching"))
    ignored.push_back("--no-cont-batching (continuous batching is always on)");
  if (!jinja) ignored.push_back("--no-jinja (chat templates are always Jinja)");
  if (!kv_unified) ignored.push_back("--no-kv-unified (one KV pool serves every slot)");
  if (!ignored.empty()) {
    std::string list;
    for (const std::string& i : ignored) list += (list.empty() ? "" : ", ") + i;
    log_warn("ignored (llama-server flags without effect in roofline): {}", list);
  }
  so.n_slots = n_parallel;
  so.queue_size = queue_size;
  so.max_body_bytes = (size_t)(std::max(0.001, body_mib) * 1048576.0);
  so.api_keys = split_keys(api_key);
  if (!api_key_file.empty()) {
    std::stringstream ss(read_file_or_fail(api_key_file, "--api-key-file"));
    std::string line;
    while (std::getline(ss, line))
      for (auto& k : split_keys(line)) so.api_keys.push_back(k);
  }
  if (reasoning_format != "auto" && reasoning_format != "deepseek" && reasoning_format != "none" && reasoning_format != "deepseek-legacy")
    fail("--reasoning-format '{}': use auto, deepseek or none", reasoning_format);
  json kwargs = json::object();
  if (!template_kwargs.empty()) {
    try {
      kwargs = json::parse(template_kwargs);
    } catch (const json::exception& e) {
      fail("--chat-template-kwargs is not valid JSON: {}", e.what());
    }
    if (!kwargs.is_object()) fail("--chat-template-kwargs must be a JSON object");
  }
  // A template given on the command line is read and parsed now; the model's own once it is loaded.
  std::string template_override;
  if (!template_file.empty()) template_override = read_file_or_fail(template_file, "--chat-template-file");
  else if (!template_text.empty()) template_override = template_text;
  if (!template_override.empty()) {
    try {
      ChatTemplate check(template_override);
    } catch (const Error& e) {
      fail("{}: {}", template_file.empty() ? "--chat-template" : "--chat-template-file " + template_file, e.what());
    }
  }

  if (pipe(g_signal_pipe) != 0 || pipe(g_loaded_pipe) != 0) fail("cannot create the signal pipes");
  std::signal(SIGPIPE, SIG_IGN);
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  // Before any thread of ours allocates: one arena per connection thread held memory for minutes.
  if (const std::string arenas = serve::limit_malloc_arenas(); !arenas.empty()) log_info("{}", arenas);
  serve::Server server(so);
  const int port = server.bind();
  server.start();
  log_info("listening on http://{}:{} (health answers 503 until the model is loaded)", so.host, port);
  // A line tools can wait for (tests start the server on port 0 and read the port from it).
  std::fprintf(stdout, "roofline serve: listening on %s:%d\n", so.host.c_str(), port);
  std::fflush(stdout);

  // Load the model on a thread while /health says 503; this thread waits for it or for a signal.
  std::shared_ptr<const Model> model;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<Drafter> draft;
  auto mc = std::make_unique<serve::ModelContext>();
  std::exception_ptr load_error;
  std::thread loader([&] {
    try {
      model = load_model(margs);
      const HParams& hp = model->hparams();
      fit_context(margs, hp, 16384);
      // Models with recurrent layers: a state per slot, and for prompt caching twice as many snapshots
      // (one each running slot takes at block boundaries, as many again kept for later prompts).
      margs.n_seq_max = n_parallel;
      margs.n_state_snapshots = no_prompt_cache ? 0 : 2 * n_parallel;
      margs.draft_rollback = dargs.given();
      if (!batch_given && !dargs.given()) {
        margs.n_batch = choose_serve_batch(*model, margs, n_parallel, !no_prompt_cache);
        if (margs.n_batch != ModelArgs{}.n_batch)
          log_info("steps of up to {} rows: the whole model and their buffers fit the GPU (-b sets the size)", margs.n_batch);
      }
      // Sliding-window models without recurrent layers: snapshots of the window in host memory, two per
      // slot as --cache-ram allows (the device holds only each slot's ring).
      const EngineOptions eo = engine_options(margs);
      const KvConfig kv = planned_kv_config(hp, eo.n_ctx, eo.n_batch, eo.kv_block_size, eo.type_k, eo.type_v);
      if (kv.swa_snapshot_blocks > 0)
        margs.n_state_snapshots = no_prompt_cache ? 0 : window_snapshot_count(*model, kv, n_parallel, cache_ram_mib);
      margs.defer_f16_copies = dargs.given();  // the draft's engine first
      engine = create_engine(model, margs);
      for (const std::string& line : engine->report()) log_info("{}", line);
      if (dargs.given()) draft = load_draft(dargs, margs, *engine);
      for (const std::string& line : engine->keep_f16_copies()) log_info("{}", line);
      // The shorter prompt steps only where layers are on a GPU: the CPU has no kernels to load. The walk through
      // the depths where decode steps take new CUDA graphs, so that no request waits for a capture.
      if (!no_warmup) {
        const auto t0 = std::chrono::steady_clock::now();
        WarmUpOptions wo;
        wo.n_parallel = n_parallel;
        wo.shorter_prompts = engine->gpu_units() > 0;
        // Only with every layer on a GPU: where some run on the CPU, a step's CPU time dwarfs a capture, and the walk's
        // prompts (up to a few thousand tokens) would run there too.
        if (warm_up_walk_enabled() && engine->gpu_units() == model->hparams().n_layer + 1) {
          wo.graph_depths = engine->decode_graph_depths();
          wo.graph_rows = engine->decode_graph_rows();
        }
        const bool complete = warm_up(*engine, wo);
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const size_t graphs = engine->captured_graphs();
        log_info("warm-up: {:.2f} s{}{}", seconds, complete ? "" : " (stopped early)",
                 graphs > 0 ? fmt::format(", {} decode graphs captured", graphs) : "");
      }
      mc->tokenizer = load_tokenizer(*model);
      std::string source = template_override.empty() ? chat_template_from_metadata(model->metadata()) : template_override;
      if (source.empty()) {
        log_warn("the model has no chat template; using ChatML");
        source = kChatMlTemplate;
      }
      try {
        mc->chat_template = std::make_unique<ChatTemplate>(source);
      } catch (const Error& e) {
        fail("the model's chat template: {} (give another with --chat-template-file)", e.what());
      }
      mc->chat_template_source = source;
      mc->thinking_template = reasoning_format != "none" && source.find("<think>") != std::string::npos;
      mc->default_template_kwargs = kwargs;
      mc->model_path = margs.model;
      mc->model_id = alias.empty() ? margs.model : alias;
      mc->n_ctx = engine->options().n_ctx;
      mc->n_ctx_train = hp.n_ctx_train;
      mc->n_vocab = hp.n_vocab;
      mc->n_embd = hp.n_embd;
      mc->n_params = model->n_params();
      mc->size_bytes = model->file().file_size();
      mc->n_slots = n_parallel;
      mc->default_sampling = sp;
      mc->default_n_predict = n_predict;
      mc->pooling = pooling_override ? *pooling_override : model_default_pooling(*model);
      mc->embd_normalize = embd_normalize;
    } catch (...) {
      load_error = std::current_exception();
    }
    const char c = 1;
    const ssize_t n = write(g_loaded_pipe[1], &c, 1);
    (void)n;
  });
  if (const int sig = wait_signal_or_loaded(); sig > 0) {
    // The load cannot be interrupted half-way; the process ends now, by the signal, as it asked.
    log_info("{} while loading the model: exiting", sig == SIGINT ? "SIGINT" : "SIGTERM");
    std::fflush(stdout);
    std::signal(sig, SIG_DFL);
    std::raise(sig);
    std::_Exit(128 + sig);
  }
  loader.join();
  if (load_error) {
    server.stop();
    std::rethrow_exception(load_error);  // "error: ..." and exit status 1 (run_guarded)
  }

  serve::EngineRunner runner(*engine);
  serve::TokenizerText text(mc->tokenizer);
  serve::Metrics metrics;
  serve::SchedulerOptions sched_opt;
  sched_opt.n_slots = n_parallel;
  sched_opt.queue_size = queue_size;
  sched_opt.prompt_cache = !no_prompt_cache;
  sched_opt.drafter = draft.get();
  serve::Scheduler scheduler(runner, text, sched_opt, &metrics);
  scheduler.start();
  server.set_ready(mc.get(), &scheduler, &metrics);
  log_info("ready: model {}, {} slots, context {} tokens shared by all slots (KV blocks of {}), queue {}, batch {}", mc->model_id,
           n_parallel, mc->n_ctx, engine->memory().block_size(), queue_size, engine->options().n_batch);
  if (so.embeddings)
    log_info("embeddings: pooling {}{}, normalisation {}{}", pooling_name(mc->pooling), pooling_override ? "" : " (the model's default)",
             embd_normalize, mc->pooling == Pooling::None ? "; /v1/embeddings needs --pooling mean, last or cls" : "");

  wait_signal(-1);
  log_info("shutting down: no new requests; waiting up to {} s for {} running ones", shutdown_grace,
           scheduler.status().requests_processing);
  server.begin_shutdown();
  scheduler.stop(false);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(std::max(0, shutdown_grace));
  for (;;) {
    if (scheduler.drain(std::chrono::milliseconds(100))) break;
    if (std::chrono::steady_clock::now() >= deadline) break;
    if (wait_signal(0)) {
      log_info("second signal: cancelling running requests");
      break;
    }
  }
  scheduler.stop(true);
  scheduler.join();
  // Let the HTTP threads write the last events, then stop listening.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  server.stop();
  log_info("stopped");
  return 0;
}

int run_serve(int argc, char** argv) { return run_guarded(run, argc, argv); }
const CommandRegistration registration{"serve", "OpenAI-compatible server with parallel slots and continuous batching", run_serve, 30};

}  // namespace
}  // namespace roofline::cli
