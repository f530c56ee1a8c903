// The OpenAI / llama-server API as data: request bodies validated and translated into scheduler
// requests (chat messages rendered through the chat template, prompts tokenized), and scheduler
// events turned into response bodies and SSE chunks framed exactly as OpenAI frames them
// (`data: {json}\n\n`, then `data: [DONE]\n\n`). No HTTP here; server.cpp is the transport.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "serve/scheduler.h"
#include "serve/text_stream.h"
#include "serve/tool_calls.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace roofline::serve {

using json = nlohmann::ordered_json;

// An error answered with the OpenAI envelope {"error":{message,type,param,code}}.
struct ApiError : std::runtime_error {
  ApiError(int status, const std::string& message, std::string param = "", std::string code = "")
      : std::runtime_error(message), status(status), param(std::move(param)), code(std::move(code)) {}
  int status;
  std::string param;
  std::string code;  // "" -> null (OpenAI's envelope: code is a string or null, never a number)
};

// OpenAI error type for an HTTP status: 400 invalid_request_error, 401 authentication_error, ...
const char* error_type(int status);
json error_body(int status, const std::string& message, const std::string& param = "", const std::string& code = "");

// One SSE event: "data: <one-line json>\n\n" (invalid UTF-8 replaced, never multi-line).
std::string sse_data(const json& j);
inline const char* sse_done() { return "data: [DONE]\n\n"; }
// Compact single-line JSON with invalid UTF-8 replaced by U+FFFD.
std::string dump_json(const json& j);

// Parses a request body; malformed JSON or a non-object is an ApiError 400.
json parse_body(const std::string& body);

// What the API layer needs to know about the served model.
struct ModelContext {
  std::shared_ptr<const Tokenizer> tokenizer;
  std::unique_ptr<ChatTemplate> chat_template;
  std::string chat_template_source;
  json default_template_kwargs = json::object();
  std::string model_id;    // what responses echo in "model" (--alias or the file name)
  std::string model_path;
  std::string owned_by = "llamacpp";
  int n_ctx = 0;
  int n_ctx_train = 0;
  int n_vocab = 0;
  int n_embd = 0;
  uint64_t n_params = 0;
  uint64_t size_bytes = 0;
  int n_slots = 0;
  bool thinking_template = false;  // the template knows <think>
  SamplingParams default_sampling;  // server defaults (--temp, --top-k, ...)
  int default_n_predict = -1;       // -n
  Pooling pooling = Pooling::None;  // embeddings: --pooling, else the model's default (pooling.h)
  int embd_normalize = 2;           // embeddings: llama-server's default normalisation (Euclidean)
};

enum class Endpoint { Chat, Completions, Native };

struct ApiRequest {
  Endpoint endpoint = Endpoint::Chat;
  GenParams gen;
  bool stream = false;
  bool include_usage = false;
  bool echo = false;              // completions: prepend the prompt
  bool want_logprobs = false;
  bool split_reasoning = false;
  bool start_in_reasoning = false;
  bool return_tokens = false;     // native: token ids in the response
  std::string prompt_text;        // the rendered / given prompt
  // /v1/completions with an array of prompts: each prompt's tokens and text (gen.prompt is the first);
  // empty for a single prompt. Prompt i's choices are numbered i * gen.n + j, as OpenAI numbers them.
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::string> prompt_texts;
  int n_choices() const { return gen.n * (prompts.empty() ? 1 : (int)prompts.size()); }
  json generation_settings;       // native: echoed back
  ToolsRequest tools;             // chat: the offered tools and tool_choice (calls parsed when asked)
};

// Request bodies -> ApiRequest (ApiError 400 on anything malformed or out of range).
ApiRequest parse_chat_request(const json& body, const ModelContext& mc);
ApiRequest parse_completion_request(const json& body, const ModelContext& mc, Endpoint endpoint);
// Sampling fields shared by every endpoint (OpenAI names and llama-server's extras).
void parse_sampling(const json& body, const ModelContext& mc, ApiRequest& r, bool openai);

// Chat messages -> prompt text through the model's template (ApiError 400 if the template raises).
std::string render_chat(const ModelContext& mc, const json& messages, const json& tools, const json& kwargs,
                        bool add_generation_prompt);
// The messages array validated and normalized (content parts joined, developer -> system).
json normalize_messages(const json& messages);

// Builds responses from scheduler events, for streaming and whole responses alike.
class ResponseBuilder {
 public:
  ResponseBuilder(const ApiRequest& request, const ModelContext& mc, std::string id, long created);

  // Streaming: the first chunks (chat: the assistant role per choice).
  std::string stream_begin();
  // Streaming: SSE text for these events (empty when all text is held back).
  std::string stream_events(const std::vector<Event>& events);
  // Streaming: final chunks (finish reasons, usage when asked, timings) and the terminator.
  std::string stream_end(const Timings& t);

  // Whole response: feed events, then build.
  void add_events(const std::vector<Event>& events);
  json response(const Timings& t);

  // The error that ended the request, if any (cancelled by shutdown, failed step).
  const std::optional<std::pair<int, std::string>>& error() const { return error_; }
  bool any_output() const { return any_output_; }

 private:
  struct ChoiceState {
    std::string content, reasoning;
    ToolCallStream tool_stream;
    std::vector<ParsedToolCall> calls;
    std::vector<std::string> call_ids;
    std::vector<TokenLogprob> logprobs;
    std::vector<int32_t> tokens;
    std::string finish_reason;
    std::string stop_word;
    Finish finish = Finish::None;
    ReasoningSplitter splitter;
    size_t text_offset = 0;  // completions logprobs
  };
  struct Delta {
    std::string content, reasoning;
    size_t first_call = 0, n_calls = 0;  // the choice's calls completed by this event
    std::vector<TokenLogprob> logprobs;
    std::vector<int32_t> tokens;
  };
  Delta consume(const Event& e);
  ChoiceState& state(int choice);
  json chunk_base(const char* object) const;
  json logprobs_chat(const std::vector<TokenLogprob>& lps) const;
  json logprobs_completion(const std::vector<TokenLogprob>& lps, size_t& offset) const;
  json usage(const Timings& t) const;
  json timings(const Timings& t) const;
  json native_final(const Timings& t, const ChoiceState& c, bool stream) const;
  std::string token_text(int32_t t) const;
  std::string new_call_id();
  json tool_calls_json(const ChoiceState& c) const;
  const std::string& prompt_of(size_t choice) const;  // the prompt text of a choice (echo)

  const ApiRequest& req_;
  const ModelContext& mc_;
  std::string id_;
  long created_;
  std::vector<ChoiceState> choices_;
  std::optional<std::pair<int, std::string>> error_;
  bool any_output_ = false;
  uint64_t call_id_state_ = 0;
};

// /v1/models, /props, /slots, /tokenize, /detokenize bodies.
json models_body(const ModelContext& mc, long created);
json props_body(const ModelContext& mc, const SchedulerStatus& st);
json slots_body(const ModelContext& mc, const SchedulerStatus& st);
json tokenize_body(const ModelContext& mc, const json& body);
json detokenize_body(const ModelContext& mc, const json& body);
json apply_template_body(const ModelContext& mc, const json& body);

}  // namespace roofline::serve
