// The embeddings API (POST /v1/embeddings, llama-server's /embeddings and /embedding): request
// bodies parsed into token inputs, each input run through the scheduler as its own embedding request
// (a sequence of its own; generation goes on beside it), and the OpenAI list or llama-server's native
// array built from the pooled vectors. No HTTP here; server.cpp routes to it.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "serve/api.h"
#include "serve/scheduler.h"

namespace roofline::serve {

enum class EmbeddingRoute { OpenAI, Native };  // /v1/embeddings; /embeddings and /embedding

struct EmbeddingRequest {
  std::vector<std::vector<int32_t>> inputs;  // one token list per input, in order
  bool openai = true;   // OpenAI's response ({object:"list", data, model, usage}); else llama-server's array
  bool base64 = false;  // encoding_format "base64": little-endian float32 bytes
  int normalize = 2;    // embd_normalize (pooling.h)
  std::string model;    // what the response echoes (the request's "model", else the served one)
};

// llama-server's forms: `input` (or `content`, which answers in the native shape) as a string, token
// ids, a mix of strings and ids (one input), or an array of those (several); strings get the model's
// BOS/EOS as a completion prompt does, token ids are taken as they are. `encoding_format` float or
// base64; `dimensions` only as the model's width; `embd_normalize` as the server's option.
// ApiError 400 on anything else (also: more than 2048 inputs, an input longer than the context), and
// for the OpenAI form when the server pools nothing (pooling none).
EmbeddingRequest parse_embedding_request(const json& body, const ModelContext& mc, EmbeddingRoute route);

// The response for the vectors of each input (one each, or one per token with pooling none).
json embedding_response(const EmbeddingRequest& r, const ModelContext& mc, const std::vector<std::vector<std::vector<float>>>& vectors);

// Submits the inputs (a window of mc.n_slots at a time; all or none: SubmitError as generation
// requests, the rest cancelled), waits for their vectors, and returns the response. `alive` is polled while waiting: false cancels the request (the client
// went away) and returns null. A failed or cancelled step is an ApiError (500, 503).
json run_embeddings(const EmbeddingRequest& r, const ModelContext& mc, Scheduler& scheduler, const std::string& id,
                    const std::function<bool()>& alive);

// Standard base64 (RFC 4648, with padding).
std::string base64_encode(const void* data, size_t n);

}  // namespace roofline::serve
