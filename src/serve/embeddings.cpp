// The embeddings endpoints (embeddings.h): input forms, submission, and the two response shapes.
#include "serve/embeddings.h"

#include <algorithm>
#include <chrono>
#include <memory>

#include "core/error.h"

namespace roofline::serve {

namespace {

constexpr size_t kMaxEmbeddingInputs = 2048;  // OpenAI's limit per request

bool is_token_id(const json& x) { return x.is_number_integer(); }

int32_t checked_token(const json& x, const ModelContext& mc, const char* param) {
  const int64_t id = x.is_number_unsigned() ? (int64_t)std::min<uint64_t>(x.get<uint64_t>(), (uint64_t)INT64_MAX) : x.get<int64_t>();
  if (id < 0 || id >= mc.n_vocab)
    throw ApiError(400, fmt::format("token id {} in '{}' is out of range [0, {})", id, param, mc.n_vocab), param);
  return (int32_t)id;
}

// One input: a string, token ids, or a mix of both (strings tokenized, the first with BOS/EOS).
std::vector<int32_t> one_input(const json& x, const ModelContext& mc, const char* param) {
  const Tokenizer& tok = *mc.tokenizer;
  if (x.is_string()) return tok.encode(x.get<std::string>(), true, true);
  if (!x.is_array() || x.empty())
    throw ApiError(400, fmt::format("'{}' must be a string, an array of token ids, or an array of those", param), param);
  std::vector<int32_t> out;
  bool first_text = true;
  for (const json& e : x) {
    if (is_token_id(e)) {
      out.push_back(checked_token(e, mc, param));
    } else if (e.is_string()) {
      const auto ids = tok.encode(e.get<std::string>(), first_text && out.empty(), true);
      out.insert(out.end(), ids.begin(), ids.end());
      first_text = false;
    } else {
      throw ApiError(400, fmt::format("'{}' token arrays must hold integer token ids (or strings)", param), param);
    }
  }
  return out;
}

int normalize_from(const json& body, int def) {
  auto it = body.find("embd_normalize");
  if (it == body.end() || it->is_null()) return def;
  if (!it->is_number_integer()) throw ApiError(400, "'embd_normalize' must be an integer (-1 none, 0 max abs, 1 taxicab, 2 Euclidean, >2 p-norm)", "embd_normalize");
  const int64_t v = it->get<int64_t>();
  if (v < -1 || v > 64) throw ApiError(400, fmt::format("'embd_normalize' must be between -1 and 64 (got {})", v), "embd_normalize");
  return (int)v;
}

json vector_json(const std::vector<float>& v) {
  json a = json::array();
  for (float x : v) a.push_back(x);
  return a;
}

}  // namespace

std::string base64_encode(const void* data, size_t n) {
  static const char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  const auto* p = static_cast<const uint8_t*>(data);
  std::string out;
  out.reserve((n + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= n; i += 3) {
    const uint32_t v = (uint32_t)p[i] << 16 | (uint32_t)p[i + 1] << 8 | p[i + 2];
    for (int s = 18; s >= 0; s -= 6) out += kAlphabet[(v >> s) & 63];
  }
  if (i < n) {
    const uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0u);
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += i + 1 < n ? kAlphabet[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

EmbeddingRequest parse_embedding_request(const json& body, const ModelContext& mc, EmbeddingRoute route) {
  EmbeddingRequest r;
  r.openai = route == EmbeddingRoute::OpenAI;
  const char* param = "input";
  const json* input = nullptr;
  if (auto it = body.find("input"); it != body.end() && !it->is_null()) {
    input = &*it;
  } else if (auto c = body.find("content"); c != body.end() && !c->is_null()) {
    input = &*c;  // llama-server's field: not OpenAI's, so the answer takes the native shape
    param = "content";
    r.openai = false;
  } else {
    throw ApiError(400, "'input' (or 'content') is required: a string, token ids, or an array of those", "input");
  }
  if (r.openai && mc.pooling == Pooling::None)
    throw ApiError(400,
                   "the server pools nothing (--pooling none, the default for a generative model without a pooling key), so "
                   "there is no one vector per input for the OpenAI form: start it with --pooling mean, last or cls, or use "
                   "/embeddings for per-token vectors",
                   "input");
  if (auto it = body.find("encoding_format"); it != body.end() && !it->is_null()) {
    if (!it->is_string() || (*it != "float" && *it != "base64"))
      throw ApiError(400, "'encoding_format' must be \"float\" or \"base64\"", "encoding_format");
    r.base64 = *it == "base64";
  }
  if (auto it = body.find("dimensions"); it != body.end() && !it->is_null()) {
    if (!it->is_number_integer() || it->get<int64_t>() != mc.n_embd)
      throw ApiError(400,
                     fmt::format("'dimensions' is not supported: this model's embeddings have {} dimensions (omit it, or give {})",
                                 mc.n_embd, mc.n_embd),
                     "dimensions");
  }
  r.normalize = normalize_from(body, mc.embd_normalize);
  r.model = mc.model_id;
  if (auto it = body.find("model"); it != body.end() && it->is_string()) r.model = it->get<std::string>();

  // A string, or an array holding token ids (with or without strings), is one input; any other
  // array is a list of inputs.
  const bool one = input->is_string() || (input->is_array() && std::any_of(input->begin(), input->end(), is_token_id));
  if (!one && input->is_array() && input->size() > kMaxEmbeddingInputs)
    throw ApiError(400, fmt::format("'{}' has {} inputs; at most {} per request", param, input->size(), kMaxEmbeddingInputs), param);
  if (one) {
    r.inputs.push_back(one_input(*input, mc, param));
  } else if (input->is_array() && !input->empty()) {
    for (const json& x : *input) r.inputs.push_back(one_input(x, mc, param));
  } else {
    throw ApiError(400, fmt::format("'{}' must be a non-empty string, token ids, or an array of those", param), param);
  }
  for (size_t i = 0; i < r.inputs.size(); ++i) {
    const std::string which = r.inputs.size() > 1 ? fmt::format("input {}", i) : std::string("the input");
    if (mc.n_ctx > 0 && (int64_t)r.inputs[i].size() > mc.n_ctx)  // checked here too, so a list runs all or none
      throw ApiError(400,
                     fmt::format("{} has {} tokens, more than the context size of {} tokens: shorten it or start the server with a larger -c",
                                 which, r.inputs[i].size(), mc.n_ctx),
                     param, "context_length_exceeded");
    if (r.inputs[i].empty())
      throw ApiError(400, which + " is empty (no tokens)", param);
  }
  return r;
}

json embedding_response(const EmbeddingRequest& r, const ModelContext& mc, const std::vector<std::vector<std::vector<float>>>& vectors) {
  (void)mc;
  if (!r.openai) {  // llama-server's native shape: per input, its vectors (one, or one per token)
    json out = json::array();
    for (size_t i = 0; i < vectors.size(); ++i) {
      json list = json::array();
      for (const auto& v : vectors[i]) list.push_back(vector_json(v));
      out.push_back(json{{"index", i}, {"embedding", std::move(list)}});
    }
    return out;
  }
  json data = json::array();
  int n_tokens = 0;
  for (size_t i = 0; i < vectors.size(); ++i) {
    ROOFLINE_CHECK(vectors[i].size() == 1, "an OpenAI embedding needs one pooled vector per input");
    const std::vector<float>& v = vectors[i][0];
    json item;
    item["object"] = "embedding";
    item["index"] = i;
    item["embedding"] = r.base64 ? json(base64_encode(v.data(), v.size() * sizeof(float))) : vector_json(v);
    data.push_back(std::move(item));
    n_tokens += (int)r.inputs[i].size();
  }
  json out;
  out["object"] = "list";
  out["data"] = std::move(data);
  out["model"] = r.model;
  out["usage"] = json{{"prompt_tokens", n_tokens}, {"total_tokens", n_tokens}};
  return out;
}

json run_embeddings(const EmbeddingRequest& r, const ModelContext& mc, Scheduler& scheduler, const std::string& id,
                    const std::function<bool()>& alive) {
  // Inputs go to the scheduler a window at a time (as many as it has slots), so a long list neither
  // fills its queue (503 for everyone) nor holds every slot while generation waits.
  const size_t n = r.inputs.size(), window = (size_t)std::max(1, mc.n_slots);
  std::vector<std::shared_ptr<Request>> parts(n);
  size_t submitted = 0;
  auto cancel_all = [&] {
    for (size_t k = 0; k < submitted; ++k) parts[k]->cancel();
  };
  auto submit_up_to = [&](size_t limit) {
    try {
      for (; submitted < std::min(limit, n); ++submitted) {
        GenParams g;
        g.id = n > 1 ? fmt::format("{}.{}", id, submitted) : id;
        g.prompt = r.inputs[submitted];
        g.embedding = true;
        g.pooling = mc.pooling;
        g.embd_normalize = r.normalize;
        parts[submitted] = scheduler.submit(std::move(g));
      }
    } catch (...) {
      cancel_all();  // all or none
      throw;
    }
  };
  submit_up_to(window);
  std::vector<std::vector<std::vector<float>>> vectors(n);
  for (size_t i = 0; i < n; ++i) {
    std::vector<Event> events;
    while (!parts[i]->poll(events, std::chrono::milliseconds(100))) {
      if (alive()) continue;
      cancel_all();  // the client went away: nothing more to compute
      for (size_t k = 0; k < submitted; ++k)
        while (!parts[k]->poll(events, std::chrono::milliseconds(100))) events.clear();
      return nullptr;
    }
    for (Event& e : events) {
      if (e.finish == Finish::Error) {
        cancel_all();
        throw ApiError(500, e.error.empty() ? "the forward step failed" : e.error);
      }
      if (e.finish == Finish::Cancelled) {
        cancel_all();
        throw ApiError(503, e.error.empty() ? "the request was cancelled" : e.error);
      }
      if (!e.embedding.empty()) vectors[i] = std::move(e.embedding);
    }
    if (vectors[i].empty()) {
      cancel_all();
      throw ApiError(500, "the embedding of an input did not come back");
    }
    submit_up_to(i + 1 + window);
  }
  return embedding_response(r, mc, vectors);
}

}  // namespace roofline::serve
