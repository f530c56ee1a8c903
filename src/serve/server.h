// The HTTP transport (cpp-httplib): routes, API keys, CORS, body limit, error envelopes, and the SSE
// streams that read per-request channels. It listens before the model is loaded (/health answers
// 503 until set_ready) and never touches the engine: generation goes through the Scheduler.
#pragma once

#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "serve/api.h"
#include "serve/metrics.h"
#include "serve/scheduler.h"

namespace roofline::serve {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                 // 0: any free port (bind() returns it)
  std::vector<std::string> api_keys;
  bool metrics = false;            // GET /metrics (llama-server: --metrics)
  bool slots = true;               // GET /slots
  bool embeddings = false;         // POST /v1/embeddings, /embeddings, /embedding (llama-server: --embeddings)
  bool webui = true;               // the chat page at / (llama-server: --no-webui turns it off)
  int threads_http = 0;            // resident HTTP workers (0: max(n_slots + 4, cores - 1))
  int n_slots = 4;                 // to size the worker pool
  int queue_size = 16;
  int timeout_s = 600;             // read/write timeout of a connection
  size_t max_body_bytes = 16u << 20;
};

class Server {
 public:
  explicit Server(ServerOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  int bind();    // binds host:port; returns the port (throws Error when it cannot)
  void start();  // serves on a background thread
  // The model is loaded: generation endpoints go to `scheduler`; /metrics renders `metrics`.
  void set_ready(const ModelContext* mc, Scheduler* scheduler, Metrics* metrics);
  void begin_shutdown();  // generation requests get 503 from now on
  void stop();            // stops listening and joins the workers
  int port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// How an exception thrown while handling a request is answered: the client's mistakes (ApiError,
// Error from input checks) are 4xx; failed internal checks (InternalError) and anything unexpected are
// 500; a sticky device fault is 503. The body is the OpenAI error envelope (error_body).
struct HttpFailure {
  int status = 500;
  std::string message;
  std::string param;
  std::string code;
  bool retry_after = false;  // a passing condition (queue full): the client may retry soon
};
HttpFailure http_failure(std::exception_ptr ep);

// Default resident HTTP workers: llama-server's max(n_slots + 4, cores - 1).
int default_http_threads(int n_slots);

}  // namespace roofline::serve
