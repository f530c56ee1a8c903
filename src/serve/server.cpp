// HTTP routes over cpp-httplib 0.11: auth and CORS in the pre-routing hook, error envelopes for every
// 4xx/5xx, the embedded chat page at /, generation handlers that submit to the scheduler and stream
// its events as SSE. Each connection holds a worker thread, so the pool grows with demand (bounded); a handler finds its
// connection's socket to notice a client that went away even while nothing is written.
#include "serve/server.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <ctime>
#include <deque>
#include <list>
#include <mutex>
#include <random>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "serve/embeddings.h"
#include "serve/web_assets.h"

namespace roofline::serve {

namespace {

// httplib's own pool has a fixed size and every open stream or keep-alive connection holds a worker,
// so /health would queue behind streams. This pool keeps `base` workers and adds more (up to `max`)
// whenever a task arrives with none idle. Where the system refuses a thread (its limit on threads or
// memory), the pool stays at the size it has and the task waits for a worker (logged once).
class ElasticPool : public httplib::TaskQueue {
 public:
  ElasticPool(size_t base, size_t max) : max_(std::max(base, max)) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t i = 0; i < base && spawn(); ++i) {
    }
  }
  ~ElasticPool() override = default;

  void enqueue(std::function<void()> fn) override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      jobs_.push_back(std::move(fn));
      if (idle_ < jobs_.size() && threads_.size() < max_) spawn();
    }
    cv_.notify_one();
  }

  void shutdown() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      shutdown_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
    threads_.clear();
  }

 private:
  bool spawn() {  // under mutex_; false (and max_ lowered to the size reached) when no thread can start
    try {
      threads_.emplace_back([this] { work(); });
      return true;
    } catch (const std::system_error& e) {
      if (!spawn_failed_)
        log_warn("HTTP workers: the system refused thread {} ({}); requests wait for the {} there are",
                 threads_.size() + 1, e.what(), threads_.size());
      spawn_failed_ = true;
      max_ = threads_.size();
      return false;
    }
  }

  void work() {
    for (;;) {
      std::function<void()> fn;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        ++idle_;
        cv_.wait(lock, [&] { return shutdown_ || !jobs_.empty(); });
        --idle_;
        if (jobs_.empty()) return;  // shutting down with nothing left
        fn = std::move(jobs_.front());
        jobs_.pop_front();
      }
      fn();
    }
  }

  size_t max_;
  bool spawn_failed_ = false;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  std::list<std::thread> threads_;
  size_t idle_ = 0;
  bool shutdown_ = false;
};

std::string sockaddr_ip(const sockaddr_storage& ss, int* port) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (ss.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, buf, sizeof buf);
    *port = ntohs(a->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof buf);
    *port = ntohs(a->sin6_port);
  } else {
    *port = -1;
  }
  return buf;
}

// The accepted socket serving `req` (httplib 0.11 does not hand it to handlers): the descriptor whose
// local and peer ports and peer address are the request's. -1 when not found.
int find_request_socket(const httplib::Request& req) {
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return -1;
  int found = -1;
  while (dirent* e = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (*end || fd < 0) continue;
    sockaddr_storage local{}, peer{};
    socklen_t len = sizeof local;
    if (getsockname((int)fd, reinterpret_cast<sockaddr*>(&local), &len) != 0) continue;
    int lport = -1, pport = -1;
    sockaddr_ip(local, &lport);
    if (lport != req.local_port) continue;
    len = sizeof peer;
    if (getpeername((int)fd, reinterpret_cast<sockaddr*>(&peer), &len) != 0) continue;
    const std::string pip = sockaddr_ip(peer, &pport);
    if (pport == req.remote_port && pip == req.remote_addr) {
      found = (int)fd;
      break;
    }
  }
  closedir(dir);
  return found;
}

// False once the peer has closed the connection (orderly shutdown or reset).
bool socket_alive(int fd) {
  if (fd < 0) return true;
  char c;
  const ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n > 0) return true;
  if (n == 0) return false;
  return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
}

std::string random_id(const char* prefix) {
  static std::atomic<uint64_t> counter{0};
  thread_local std::mt19937_64 rng(std::random_device{}() ^ (uint64_t)std::hash<std::thread::id>{}(std::this_thread::get_id()));
  static const char alphabet[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  std::string id = prefix;
  for (int i = 0; i < 24; ++i) id += alphabet[rng() % 62];
  (void)counter;
  return id;
}

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(dump_json(body), "application/json; charset=utf-8");
}

void send_error(httplib::Response& res, int status, const std::string& message, const std::string& param = "",
                const std::string& code = "") {
  send_json(res, status, error_body(status, message, param, code));
}

// The scheduler requests of one HTTP call: one, or one per prompt of a /v1/completions prompt array,
// read as one stream whose choices are numbered prompt by prompt (prompt i's choice j is i * n + j).
class RequestGroup {
 public:
  RequestGroup(std::vector<std::shared_ptr<Request>> parts, int n) : parts_(std::move(parts)), done_(parts_.size(), false), n_(n) {}

  // As Request::poll: appends what is there (waiting up to `timeout` on the first unfinished part);
  // true once every part has finished and all their events are in `out`.
  bool poll(std::vector<Event>& out, std::chrono::milliseconds timeout) {
    bool waited = false;
    for (size_t i = 0; i < parts_.size(); ++i) {
      if (done_[i]) continue;
      const size_t before = out.size();
      done_[i] = parts_[i]->poll(out, waited ? std::chrono::milliseconds(0) : timeout);
      waited = true;
      for (size_t k = before; k < out.size(); ++k) out[k].choice += (int)i * n_;
      if (out.size() > before) timeout = std::chrono::milliseconds(0);
    }
    return std::all_of(done_.begin(), done_.end(), [](bool d) { return d; });
  }
  void cancel() {
    for (auto& p : parts_) p->cancel();
  }
  Timings timings() const {
    Timings t = parts_[0]->timings();
    for (size_t i = 1; i < parts_.size(); ++i) {
      const Timings u = parts_[i]->timings();
      t.n_prompt += u.n_prompt;
      t.n_cached += u.n_cached;
      t.n_generated += u.n_generated;
      t.draft_n += u.draft_n;
      t.draft_n_accepted += u.draft_n_accepted;
      t.queue_ms = std::max(t.queue_ms, u.queue_ms);
      t.prompt_ms = std::max(t.prompt_ms, u.prompt_ms);
      t.generate_ms = std::max(t.generate_ms, u.generate_ms);
      t.ttft_ms = std::max(t.ttft_ms, u.ttft_ms);
    }
    return t;
  }

 private:
  std::vector<std::shared_ptr<Request>> parts_;
  std::vector<bool> done_;
  int n_;
};

}  // namespace

HttpFailure http_failure(std::exception_ptr ep) {
  try {
    std::rethrow_exception(ep);
  } catch (const ApiError& e) {
    return {e.status, e.what(), e.param, e.code, false};
  } catch (const SubmitError& e) {
    return {e.status, e.what(), "", e.code, e.status == 503 && e.code != "device_fault"};
  } catch (const InternalError& e) {  // a check of ours failed: our fault, not the client's
    return {500, e.what(), "", "", false};
  } catch (const DeviceFault& e) {
    return {503, fmt::format("the device failed: {}", e.what()), "", "device_fault", false};
  } catch (const Error& e) {  // bad input found below the API layer (a file, a token, a setting)
    return {400, e.what(), "", "", false};
  } catch (const std::bad_alloc&) {
    return {500, "out of memory", "", "", false};
  } catch (const std::exception& e) {
    return {500, e.what(), "", "", false};
  } catch (...) {
    return {500, "internal error", "", "", false};
  }
}

int default_http_threads(int n_slots) {
  const int cores = (int)std::max(1u, std::thread::hardware_concurrency());
  // Resident ones: at most 1024 (the pool grows past them while requests need it).
  return std::min(1024, std::max(n_slots + 4, cores - 1));
}

struct Server::Impl {
  ServerOptions opt;
  httplib::Server svr;
  std::thread thread;
  int port = -1;
  int listen_fd = -1;  // the listening socket (set by the socket-options hook when it is created)
  std::atomic<const ModelContext*> mc{nullptr};
  std::atomic<Scheduler*> sched{nullptr};
  std::atomic<Metrics*> metrics{nullptr};
  std::atomic<bool> shutting_down{false};
  std::atomic<bool> listener_done{false};
  std::atomic<uint64_t> next_request{0};

  explicit Impl(ServerOptions o) : opt(std::move(o)) {}

  bool ready() const { return mc.load() != nullptr && sched.load() != nullptr; }

  bool authorized(const httplib::Request& req) const {
    if (opt.api_keys.empty()) return true;
    const std::string h = req.get_header_value("Authorization");
    const std::string prefix = "Bearer ";
    if (h.size() <= prefix.size() || h.compare(0, prefix.size(), prefix) != 0) return false;
    const std::string key = h.substr(prefix.size());
    return std::find(opt.api_keys.begin(), opt.api_keys.end(), key) != opt.api_keys.end();
  }

  void setup();
  void handle_generation(const httplib::Request& req, httplib::Response& res, Endpoint endpoint);
  void handle_embeddings(const httplib::Request& req, httplib::Response& res, EmbeddingRoute route);
  template <typename F>
  void guarded(const httplib::Request& req, httplib::Response& res, F&& body);
};

template <typename F>
void Server::Impl::guarded(const httplib::Request& req, httplib::Response& res, F&& body) {
  try {
    body();
  } catch (...) {
    const HttpFailure f = http_failure(std::current_exception());
    if (f.status >= 500) log_error("{} {}: {}", req.method, req.path, f.message);
    send_error(res, f.status, f.message, f.param, f.code);
    if (f.retry_after) res.set_header("Retry-After", "1");
  }
}

void Server::Impl::handle_generation(const httplib::Request& req, httplib::Response& res, Endpoint endpoint) {
  if (!ready()) {
    send_error(res, 503, "Loading model");
    res.set_header("Retry-After", "1");
    return;
  }
  if (shutting_down) {
    send_error(res, 503, "the server is shutting down");
    return;
  }
  const ModelContext& m = *mc.load();
  Scheduler& s = *sched.load();
  if (const std::string fault = s.device_fault(); !fault.empty()) {  // fail fast: nothing can run
    send_error(res, 503, "the device failed and the server cannot generate: " + fault, "", "device_fault");
    return;
  }
  const json body = parse_body(req.body);
  auto ar = std::make_shared<ApiRequest>(endpoint == Endpoint::Chat ? parse_chat_request(body, m)
                                                                     : parse_completion_request(body, m, endpoint));
  const std::string id = random_id(endpoint == Endpoint::Chat ? "chatcmpl-" : "cmpl-");
  ar->gen.id = fmt::format("{}", next_request++);
  std::vector<std::shared_ptr<Request>> parts;
  if (ar->prompts.empty()) {
    parts.push_back(s.submit(ar->gen));  // throws SubmitError (400/503)
  } else {
    try {
      for (size_t i = 0; i < ar->prompts.size(); ++i) {
        GenParams g = ar->gen;
        g.prompt = ar->prompts[i];
        g.id = fmt::format("{}.{}", ar->gen.id, i);
        parts.push_back(s.submit(g));
      }
    } catch (...) {
      for (auto& p : parts) p->cancel();  // all or none
      throw;
    }
  }
  auto handle = std::make_shared<RequestGroup>(std::move(parts), ar->gen.n);
  auto builder = std::make_shared<ResponseBuilder>(*ar, m, id, (long)std::time(nullptr));
  const int fd = find_request_socket(req);

  if (!ar->stream) {
    std::vector<Event> events;
    while (!handle->poll(events, std::chrono::milliseconds(100))) {
      builder->add_events(events);
      events.clear();
      if (!socket_alive(fd)) {
        handle->cancel();
        while (!handle->poll(events, std::chrono::milliseconds(100))) events.clear();
        res.status = 499;
        return;
      }
    }
    builder->add_events(events);
    if (builder->error()) {
      send_error(res, builder->error()->first, builder->error()->second);
      return;
    }
    send_json(res, 200, builder->response(handle->timings()));
    return;
  }

  struct StreamState {
    std::shared_ptr<ApiRequest> ar;
    std::shared_ptr<ResponseBuilder> builder;
    std::shared_ptr<RequestGroup> handle;
    int fd;
    bool begun = false;
    bool ended = false;
  };
  auto st = std::make_shared<StreamState>(StreamState{ar, builder, handle, fd});
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      "text/event-stream",
      [st](size_t, httplib::DataSink& sink) {
        if (st->ended) return false;
        std::string out;
        if (!st->begun) {
          out = st->builder->stream_begin();
          st->begun = true;
        }
        std::vector<Event> events;
        const bool done = st->handle->poll(events, std::chrono::milliseconds(100));
        out += st->builder->stream_events(events);
        if (done) out += st->builder->stream_end(st->handle->timings());
        if (!out.empty() && (!sink.is_writable() || !sink.write(out.data(), out.size()))) {
          st->handle->cancel();
          return false;
        }
        if (done) {
          st->ended = true;
          sink.done();
          return true;
        }
        if (out.empty() && !socket_alive(st->fd)) {  // the client left while nothing was written
          st->handle->cancel();
          return false;
        }
        return true;
      },
      [st](bool success) {
        if (!success || !st->ended) st->handle->cancel();
      });
}

void Server::Impl::setup() {
  const int base = opt.threads_http > 0 ? opt.threads_http : default_http_threads(opt.n_slots);
  const int64_t wanted = 2 * ((int64_t)opt.n_slots + opt.queue_size) + 16;  // every slot and queued request a stream
  const int max = (int)std::max<int64_t>(base, std::min<int64_t>(wanted, 1 << 20));
  svr.new_task_queue = [base, max] { return new ElasticPool((size_t)base, (size_t)max); };
  // SO_REUSEADDR only (restarts while old connections linger), not httplib's SO_REUSEPORT, which would
  // let a second server bind the same port and take half of its connections.
  svr.set_socket_options([this](int sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    listen_fd = sock;
  });
  svr.set_payload_max_length(opt.max_body_bytes);
  svr.set_read_timeout(opt.timeout_s, 0);
  svr.set_write_timeout(opt.timeout_s, 0);
  svr.set_keep_alive_max_count(1000);
  svr.set_tcp_nodelay(true);

  svr.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    const std::string origin = req.get_header_value("Origin");
    res.set_header("Access-Control-Allow-Origin", origin.empty() ? "*" : origin);
    if (!origin.empty()) {
      res.set_header("Access-Control-Allow-Credentials", "true");
      res.set_header("Vary", "Origin");
    }
    if (req.method == "OPTIONS") {
      res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
      const std::string asked = req.get_header_value("Access-Control-Request-Headers");
      res.set_header("Access-Control-Allow-Headers", asked.empty() ? "*" : asked);
      res.set_header("Access-Control-Max-Age", "86400");
      res.status = 204;
      return httplib::Server::HandlerResponse::Handled;
    }
    // /health and the chat page are public (the page sends the key it is given with its API calls).
    const bool page = opt.webui && (req.method == "GET" || req.method == "HEAD") && find_web_asset(req.path);
    if (req.path != "/health" && req.path != "/v1/health" && !page && !authorized(req)) {
      send_error(res, 401, "Invalid API Key", "", "invalid_api_key");
      res.set_header("WWW-Authenticate", "Bearer");
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  svr.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty() || res.status == 499) return httplib::Server::HandlerResponse::Unhandled;
    std::string message;
    switch (res.status) {
      case 404: message = fmt::format("{} {} not found", req.method, req.path); break;
      case 405: message = "method not allowed"; break;
      case 413: message = "the request body is too large"; break;
      case 400: message = "bad request"; break;
      default: message = fmt::format("HTTP status {}", res.status); break;
    }
    send_error(res, res.status, message);
    return httplib::Server::HandlerResponse::Handled;
  }));
  svr.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "internal error";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    send_error(res, 500, what);
  });
  svr.set_logger([](const httplib::Request& req, const httplib::Response& res) {
    log_debug("http: {} {} {} -> {}", req.remote_addr, req.method, req.path, res.status);
  });

  auto health = [this](const httplib::Request&, httplib::Response& res) {
    if (!ready()) {
      send_error(res, 503, "Loading model");
      return;
    }
    if (const std::string fault = sched.load()->device_fault(); !fault.empty()) {
      send_error(res, 503, "the device failed: " + fault, "", "device_fault");
      return;
    }
    send_json(res, 200, json{{"status", "ok"}});
  };
  svr.Get("/health", health);
  svr.Get("/v1/health", health);

  // The chat page at / and its files (embedded, serve/web_assets.h); without them / is a 404.
  if (opt.webui) {
    auto serve_asset = [](const httplib::Request& req, httplib::Response& res) {
      const WebAsset* a = find_web_asset(req.path);
      if (!a) {
        res.status = 404;
        return;
      }
      res.set_header("Cache-Control", "no-cache");
      res.set_header("X-Content-Type-Options", "nosniff");
      res.set_content(std::string(a->bytes()), a->content_type);
    };
    svr.Get("/", serve_asset);
    for (const WebAsset& a : web_assets()) svr.Get(a.path, serve_asset);
  }

  auto need_model = [this](httplib::Response& res) {
    if (ready()) return true;
    send_error(res, 503, "Loading model");
    res.set_header("Retry-After", "1");
    return false;
  };
  auto models = [this, need_model](const httplib::Request& req, httplib::Response& res) {
    if (!need_model(res)) return;
    const json body = models_body(*mc.load(), (long)std::time(nullptr));
    if (req.matches.size() > 1) {
      const std::string want = req.matches[1];
      if (want != mc.load()->model_id) {
        send_error(res, 404, fmt::format("The model '{}' does not exist", want), "model", "model_not_found");
        return;
      }
      send_json(res, 200, body["data"][0]);
      return;
    }
    send_json(res, 200, body);
  };
  svr.Get("/v1/models", models);
  svr.Get("/models", models);
  svr.Get(R"(/v1/models/(.+))", models);

  svr.Get("/metrics", [this, need_model](const httplib::Request&, httplib::Response& res) {
    if (!opt.metrics) {
      send_error(res, 501, "This server does not support metrics endpoint. Start it with `--metrics`");
      return;
    }
    if (!need_model(res)) return;
    const SchedulerStatus st = sched.load()->status();
    LiveGauges g;
    g.requests_processing = st.requests_processing;
    g.requests_deferred = st.queue_depth;
    g.n_slots = st.n_slots;
    g.busy_slots = st.busy_slots;
    g.kv_blocks_total = st.kv_blocks_total;
    g.kv_blocks_used = st.kv_blocks_used;
    g.kv_blocks_cached = st.kv_blocks_cached;
    g.kv_block_size = st.kv_block_size;
    res.set_content(metrics.load()->render(g), "text/plain; version=0.0.4");
  });
  svr.Get("/slots", [this, need_model](const httplib::Request& req, httplib::Response& res) {
    if (!opt.slots) {
      send_error(res, 501, "This server does not support slots endpoint. Start it with `--slots`");
      return;
    }
    if (!need_model(res)) return;
    const SchedulerStatus st = sched.load()->status();
    if (req.get_param_value("fail_on_no_slot") == "1" && st.busy_slots >= st.n_slots) {
      send_error(res, 503, "no slot available");
      return;
    }
    send_json(res, 200, slots_body(*mc.load(), st));
  });
  svr.Get("/props", [this, need_model](const httplib::Request&, httplib::Response& res) {
    if (!need_model(res)) return;
    send_json(res, 200, props_body(*mc.load(), sched.load()->status()));
  });
  auto utility = [this, need_model](auto fn) {
    return [this, need_model, fn](const httplib::Request& req, httplib::Response& res) {
      if (!need_model(res)) return;
      guarded(req, res, [&] { send_json(res, 200, fn(*mc.load(), parse_body(req.body))); });
    };
  };
  svr.Post("/tokenize", utility(tokenize_body));
  svr.Post("/detokenize", utility(detokenize_body));
  svr.Post("/apply-template", utility(apply_template_body));

  auto generation = [this](Endpoint ep) {
    return [this, ep](const httplib::Request& req, httplib::Response& res) {
      guarded(req, res, [&] { handle_generation(req, res, ep); });
    };
  };
  svr.Post("/v1/chat/completions", generation(Endpoint::Chat));
  svr.Post("/chat/completions", generation(Endpoint::Chat));
  svr.Post("/v1/completions", generation(Endpoint::Completions));
  svr.Post("/completions", generation(Endpoint::Native));
  svr.Post("/completion", generation(Endpoint::Native));
  auto embeddings = [this](EmbeddingRoute route) {
    return [this, route](const httplib::Request& req, httplib::Response& res) {
      guarded(req, res, [&] { handle_embeddings(req, res, route); });
    };
  };
  svr.Post("/v1/embeddings", embeddings(EmbeddingRoute::OpenAI));
  svr.Post("/embeddings", embeddings(EmbeddingRoute::Native));
  svr.Post("/embedding", embeddings(EmbeddingRoute::Native));
}

// Embedding requests go through the scheduler (a sequence each, beside generation); without
// --embeddings the answer is llama-server's: 501 not_supported_error.
void Server::Impl::handle_embeddings(const httplib::Request& req, httplib::Response& res, EmbeddingRoute route) {
  if (!ready()) {
    send_error(res, 503, "Loading model");
    res.set_header("Retry-After", "1");
    return;
  }
  if (!opt.embeddings) {
    send_error(res, 501, "This server does not support embeddings. Start it with `--embeddings`");
    return;
  }
  if (shutting_down) {
    send_error(res, 503, "the server is shutting down");
    return;
  }
  const ModelContext& m = *mc.load();
  const EmbeddingRequest r = parse_embedding_request(parse_body(req.body), m, route);
  const int fd = find_request_socket(req);
  const json out = run_embeddings(r, m, *sched.load(), fmt::format("{}", next_request++), [fd] { return socket_alive(fd); });
  if (out.is_null()) {
    res.status = 499;  // the client went away
    return;
  }
  send_json(res, 200, out);
}

Server::Server(ServerOptions options) : impl_(std::make_unique<Impl>(std::move(options))) { impl_->setup(); }

Server::~Server() { stop(); }

int Server::bind() {
  Impl& d = *impl_;
  if (d.opt.port == 0) {
    d.port = d.svr.bind_to_any_port(d.opt.host);
    if (d.port < 0) fail("cannot bind to {} (any port)", d.opt.host);
  } else {
    if (!d.svr.bind_to_port(d.opt.host, d.opt.port)) fail("cannot bind to {}:{} (in use, or not an address of this host)", d.opt.host, d.opt.port);
    d.port = d.opt.port;
  }
  // httplib listens with a backlog of 5: 64 clients connecting at once would see SYNs dropped and
  // retried a second later. Listening again on the socket raises the backlog.
  if (d.listen_fd >= 0) ::listen(d.listen_fd, SOMAXCONN);
  return d.port;
}

void Server::start() {
  if (impl_->thread.joinable()) return;
  impl_->listener_done = false;
  impl_->thread = std::thread([this] {
    impl_->svr.listen_after_bind();
    impl_->listener_done = true;
  });
  // httplib's stop() does nothing until the listener thread has marked itself running, so a stop()
  // right after start() (a model that fails to load at once) would be lost and join() would wait
  // forever in accept(). Return only once stop() is sure to reach it.
  while (!impl_->svr.is_running() && !impl_->listener_done) std::this_thread::sleep_for(std::chrono::microseconds(200));
}

void Server::set_ready(const ModelContext* mc, Scheduler* scheduler, Metrics* metrics) {
  impl_->metrics = metrics;
  impl_->sched = scheduler;
  impl_->mc = mc;
}

void Server::begin_shutdown() { impl_->shutting_down = true; }

void Server::stop() {
  if (!impl_) return;
  impl_->shutting_down = true;
  impl_->svr.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

int Server::port() const { return impl_->port; }

}  // namespace roofline::serve
