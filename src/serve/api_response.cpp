// Responses: scheduler events -> OpenAI chat/completions bodies and chunks, llama-server's native
// /completion bodies (with `timings`), SSE framing, the error envelope, and the small GET/utility
// endpoints' bodies (/v1/models, /props, /slots, /tokenize, /detokenize, /apply-template).
#include <fmt/format.h>

#include <algorithm>
#include <random>

#include "serve/api.h"

namespace roofline::serve {

const char* error_type(int status) {
  switch (status) {
    case 400:
    case 413:
    case 422:
      return "invalid_request_error";
    case 401:
      return "authentication_error";
    case 403:
      return "permission_error";
    case 404:
      return "not_found_error";
    case 429:
      return "rate_limit_error";
    case 501:
      return "not_supported_error";
    case 503:
      return "unavailable_error";
    default:
      return status >= 500 ? "server_error" : "invalid_request_error";
  }
}

json error_body(int status, const std::string& message, const std::string& param, const std::string& code) {
  json e;
  e["message"] = utf8_sanitize(message);
  e["type"] = error_type(status);
  e["param"] = param.empty() ? json(nullptr) : json(param);
  e["code"] = code.empty() ? json(nullptr) : json(code);  // OpenAI's: a string, or null
  return json{{"error", e}};
}

std::string dump_json(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string sse_data(const json& j) { return "data: " + dump_json(j) + "\n\n"; }

// ---- ResponseBuilder ----

ResponseBuilder::ResponseBuilder(const ApiRequest& request, const ModelContext& mc, std::string id, long created)
    : req_(request), mc_(mc), id_(std::move(id)), created_(created) {
  call_id_state_ = std::random_device{}();
  call_id_state_ = (call_id_state_ << 32) ^ std::random_device{}() ^ (uint64_t)created;
  for (int i = 0; i < request.n_choices(); ++i) {
    ChoiceState c;
    c.splitter = ReasoningSplitter(request.start_in_reasoning);
    c.tool_stream = ToolCallStream(request.tools.names, request.tools.format);
    choices_.push_back(std::move(c));
  }
}

ResponseBuilder::ChoiceState& ResponseBuilder::state(int choice) {
  if (choice < 0 || choice >= (int)choices_.size()) choice = 0;
  return choices_[choice];
}

const std::string& ResponseBuilder::prompt_of(size_t choice) const {
  return req_.prompt_texts.empty() ? req_.prompt_text : req_.prompt_texts[choice / (size_t)req_.gen.n];
}

// "call_" and 24 letters/digits, unique within the server's run (a splitmix64 sequence seeded at random).
std::string ResponseBuilder::new_call_id() {
  static const char kChars[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  std::string id = "call_";
  for (int part = 0; part < 2; ++part) {
    uint64_t z = (call_id_state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    for (int i = 0; i < 12; ++i, z /= 62) id += kChars[z % 62];
  }
  return id;
}

json ResponseBuilder::tool_calls_json(const ChoiceState& c) const {
  json arr = json::array();
  for (size_t i = 0; i < c.calls.size(); ++i)
    arr.push_back(json{{"id", c.call_ids[i]},
                       {"type", "function"},
                       {"function", json{{"name", c.calls[i].name}, {"arguments", c.calls[i].arguments}}}});
  return arr;
}

std::string ResponseBuilder::token_text(int32_t t) const { return utf8_sanitize(mc_.tokenizer->token_to_piece(t, false)); }

ResponseBuilder::Delta ResponseBuilder::consume(const Event& e) {
  ChoiceState& c = state(e.choice);
  Delta d;
  if (req_.split_reasoning) {
    ReasoningSplitter::Out o = c.splitter.push(e.text);
    if (e.finish != Finish::None) {
      ReasoningSplitter::Out f = c.splitter.flush();
      o.content += f.content;
      o.reasoning += f.reasoning;
    }
    d.content = std::move(o.content);
    d.reasoning = std::move(o.reasoning);
  } else {
    d.content = e.text;
  }
  if (req_.endpoint == Endpoint::Chat && req_.tools.parse_calls()) {
    ToolCallStream::Out o = c.tool_stream.push(d.content);
    if (e.finish != Finish::None) {
      ToolCallStream::Out f = c.tool_stream.flush();
      o.content += f.content;
      for (auto& call : f.calls) o.calls.push_back(std::move(call));
    }
    d.content = std::move(o.content);
    d.first_call = c.calls.size();
    d.n_calls = o.calls.size();
    for (auto& call : o.calls) {
      c.calls.push_back(std::move(call));
      c.call_ids.push_back(new_call_id());
    }
  }
  c.content += d.content;
  c.reasoning += d.reasoning;
  d.logprobs = e.logprobs;
  d.tokens = e.tokens;
  c.logprobs.insert(c.logprobs.end(), e.logprobs.begin(), e.logprobs.end());
  c.tokens.insert(c.tokens.end(), e.tokens.begin(), e.tokens.end());
  if (!e.text.empty() || !e.tokens.empty()) any_output_ = true;
  if (e.finish != Finish::None) {
    c.finish = e.finish;
    c.finish_reason = finish_name(e.finish);
    if (!c.calls.empty() && (e.finish == Finish::Eos || e.finish == Finish::StopWord)) c.finish_reason = "tool_calls";
    c.stop_word = e.stop_word;
    if ((e.finish == Finish::Error || e.finish == Finish::Cancelled) && !error_) {
      if (e.finish == Finish::Error) error_ = std::make_pair(500, e.error.empty() ? std::string("generation failed") : e.error);
      else if (!e.error.empty()) error_ = std::make_pair(503, e.error);
    }
  }
  return d;
}

json ResponseBuilder::chunk_base(const char* object) const {
  json j;
  j["id"] = id_;
  j["object"] = object;
  j["created"] = created_;
  j["model"] = mc_.model_id;
  j["system_fingerprint"] = "roofline";
  return j;
}

json ResponseBuilder::logprobs_chat(const std::vector<TokenLogprob>& lps) const {
  json content = json::array();
  auto bytes_of = [&](int32_t t) {
    json b = json::array();
    for (unsigned char ch : mc_.tokenizer->token_to_piece(t, false)) b.push_back((int)ch);
    return b;
  };
  for (const TokenLogprob& lp : lps) {
    json top = json::array();
    for (const TopLogprob& t : lp.top) top.push_back(json{{"token", token_text(t.token)}, {"logprob", t.logprob}, {"bytes", bytes_of(t.token)}});
    content.push_back(json{{"token", token_text(lp.token)}, {"logprob", lp.logprob}, {"bytes", bytes_of(lp.token)}, {"top_logprobs", top}});
  }
  return json{{"content", content}, {"refusal", nullptr}};
}

json ResponseBuilder::logprobs_completion(const std::vector<TokenLogprob>& lps, size_t& offset) const {
  json tokens = json::array(), token_logprobs = json::array(), top_logprobs = json::array(), offsets = json::array();
  for (const TokenLogprob& lp : lps) {
    const std::string text = token_text(lp.token);
    tokens.push_back(text);
    token_logprobs.push_back(lp.logprob);
    json top = json::object();
    for (const TopLogprob& t : lp.top) top[token_text(t.token)] = t.logprob;
    top_logprobs.push_back(top);
    offsets.push_back(offset);
    offset += text.size();
  }
  return json{{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top_logprobs}, {"text_offset", offsets}};
}

json ResponseBuilder::usage(const Timings& t) const {
  json u;
  u["prompt_tokens"] = t.n_prompt;
  u["completion_tokens"] = t.n_generated;
  u["total_tokens"] = t.n_prompt + t.n_generated;
  u["prompt_tokens_details"] = json{{"cached_tokens", t.n_cached}};
  return u;
}

json ResponseBuilder::timings(const Timings& t) const {
  const int prompt_n = t.n_prompt - t.n_cached;
  json j;
  j["cache_n"] = t.n_cached;
  j["prompt_n"] = prompt_n;
  j["prompt_ms"] = t.prompt_ms;
  j["prompt_per_token_ms"] = prompt_n > 0 ? t.prompt_ms / prompt_n : 0.0;
  j["prompt_per_second"] = t.prompt_ms > 0 ? prompt_n * 1000.0 / t.prompt_ms : 0.0;
  j["predicted_n"] = t.n_generated;
  j["predicted_ms"] = t.generate_ms;
  j["predicted_per_token_ms"] = t.n_generated > 0 ? t.generate_ms / t.n_generated : 0.0;
  j["predicted_per_second"] = t.generate_ms > 0 ? t.n_generated * 1000.0 / t.generate_ms : 0.0;
  if (t.draft_n > 0) {  // speculative decoding, as llama-server reports it
    j["draft_n"] = t.draft_n;
    j["draft_n_accepted"] = t.draft_n_accepted;
  }
  return j;
}

std::string ResponseBuilder::stream_begin() {
  std::string out;
  if (req_.endpoint == Endpoint::Chat) {
    for (size_t i = 0; i < choices_.size(); ++i) {
      json j = chunk_base("chat.completion.chunk");
      j["choices"] = json::array({json{{"index", i},
                                       {"delta", json{{"role", "assistant"}, {"content", ""}}},
                                       {"logprobs", nullptr},
                                       {"finish_reason", nullptr}}});
      if (req_.include_usage) j["usage"] = nullptr;
      out += sse_data(j);
    }
  } else if (req_.endpoint == Endpoint::Completions && req_.echo) {
    for (size_t i = 0; i < choices_.size(); ++i) {
      json j = chunk_base("text_completion");
      j["choices"] = json::array({json{{"text", prompt_of(i)}, {"index", i}, {"logprobs", nullptr}, {"finish_reason", nullptr}}});
      if (req_.include_usage) j["usage"] = nullptr;
      out += sse_data(j);
    }
  }
  return out;
}

std::string ResponseBuilder::stream_events(const std::vector<Event>& events) {
  std::string out;
  for (const Event& e : events) {
    const Delta d = consume(e);
    ChoiceState& c = state(e.choice);
    if ((e.finish == Finish::Error || e.finish == Finish::Cancelled) && error_) {
      out += sse_data(error_body(error_->first, error_->second));
      continue;
    }
    if (e.finish == Finish::Cancelled) continue;
    switch (req_.endpoint) {
      case Endpoint::Chat: {
        auto emit = [&](json delta, const std::vector<TokenLogprob>* lps) {
          json j = chunk_base("chat.completion.chunk");
          json choice{{"index", e.choice}, {"delta", std::move(delta)},
                      {"logprobs", lps && req_.want_logprobs ? logprobs_chat(*lps) : json(nullptr)}, {"finish_reason", nullptr}};
          j["choices"] = json::array({choice});
          if (req_.include_usage) j["usage"] = nullptr;
          out += sse_data(j);
        };
        const bool has_lp = req_.want_logprobs && !d.logprobs.empty();
        if (!d.reasoning.empty()) emit(json{{"reasoning_content", d.reasoning}}, d.content.empty() && has_lp ? &d.logprobs : nullptr);
        if (!d.content.empty()) emit(json{{"content", d.content}}, has_lp ? &d.logprobs : nullptr);
        else if (d.reasoning.empty() && has_lp) emit(json{{"content", ""}}, &d.logprobs);
        // Each completed call as OpenAI streams one: its index, id, type and name, then its arguments.
        for (size_t k = d.first_call; k < d.first_call + d.n_calls; ++k) {
          emit(json{{"tool_calls", json::array({json{{"index", k},
                                                     {"id", c.call_ids[k]},
                                                     {"type", "function"},
                                                     {"function", json{{"name", c.calls[k].name}, {"arguments", ""}}}}})}},
               nullptr);
          emit(json{{"tool_calls", json::array({json{{"index", k}, {"function", json{{"arguments", c.calls[k].arguments}}}}})}},
               nullptr);
        }
        if (e.finish != Finish::None) {
          json j = chunk_base("chat.completion.chunk");
          j["choices"] = json::array({json{{"index", e.choice}, {"delta", json::object()}, {"logprobs", nullptr}, {"finish_reason", c.finish_reason}}});
          if (req_.include_usage) j["usage"] = nullptr;
          out += sse_data(j);
        }
        break;
      }
      case Endpoint::Completions: {
        if (d.content.empty() && e.finish == Finish::None && !(req_.want_logprobs && !d.logprobs.empty())) break;
        json j = chunk_base("text_completion");
        j["choices"] = json::array({json{{"text", d.content},
                                         {"index", e.choice},
                                         {"logprobs", req_.want_logprobs ? logprobs_completion(d.logprobs, c.text_offset) : json(nullptr)},
                                         {"finish_reason", e.finish != Finish::None ? json(c.finish_reason) : json(nullptr)}}});
        if (req_.include_usage) j["usage"] = nullptr;
        out += sse_data(j);
        break;
      }
      case Endpoint::Native: {
        if (d.content.empty() && d.tokens.empty()) break;
        json j;
        j["index"] = e.choice;
        j["content"] = d.content;
        j["tokens"] = req_.return_tokens ? json(d.tokens) : json::array();
        j["stop"] = false;
        j["id_slot"] = 0;
        if (req_.want_logprobs) j["completion_probabilities"] = logprobs_chat(d.logprobs)["content"];
        out += sse_data(j);
        break;
      }
    }
  }
  return out;
}

json ResponseBuilder::native_final(const Timings& t, const ChoiceState& c, bool stream) const {
  json j;
  j["index"] = &c - choices_.data();
  j["content"] = stream ? std::string() : c.content;
  j["tokens"] = req_.return_tokens && !stream ? json(c.tokens) : json::array();
  j["id_slot"] = t.slot;
  j["stop"] = true;
  j["model"] = mc_.model_id;
  j["tokens_predicted"] = (int)c.tokens.size();
  j["tokens_evaluated"] = t.n_prompt;
  j["generation_settings"] = req_.generation_settings;
  j["prompt"] = req_.prompt_text;
  j["has_new_line"] = c.content.find('\n') != std::string::npos;
  j["truncated"] = false;
  j["stop_type"] = c.finish == Finish::Eos ? "eos" : c.finish == Finish::StopWord ? "word" : c.finish == Finish::Length ? "limit" : "none";
  j["stopping_word"] = c.stop_word;
  j["tokens_cached"] = t.n_cached;
  j["timings"] = timings(t);
  if (req_.want_logprobs && !stream) j["completion_probabilities"] = logprobs_chat(c.logprobs)["content"];
  return j;
}

std::string ResponseBuilder::stream_end(const Timings& t) {
  if (error_) return "";  // the error event ended the stream
  std::string out;
  if (req_.endpoint == Endpoint::Native) {
    for (const ChoiceState& c : choices_) out += sse_data(native_final(t, c, true));
    return out;
  }
  if (req_.include_usage) {
    json j = chunk_base(req_.endpoint == Endpoint::Chat ? "chat.completion.chunk" : "text_completion");
    j["choices"] = json::array();
    j["usage"] = usage(t);
    j["timings"] = timings(t);
    out += sse_data(j);
  }
  out += sse_done();
  return out;
}

void ResponseBuilder::add_events(const std::vector<Event>& events) {
  for (const Event& e : events) consume(e);
}

json ResponseBuilder::response(const Timings& t) {
  if (req_.endpoint == Endpoint::Native) {
    if (choices_.size() == 1) return native_final(t, choices_[0], false);
    json arr = json::array();
    for (const ChoiceState& c : choices_) arr.push_back(native_final(t, c, false));
    return arr;
  }
  json j = chunk_base(req_.endpoint == Endpoint::Chat ? "chat.completion" : "text_completion");
  json choices = json::array();
  for (size_t i = 0; i < choices_.size(); ++i) {
    const ChoiceState& c = choices_[i];
    if (req_.endpoint == Endpoint::Chat) {
      json msg{{"role", "assistant"}, {"content", c.content}};
      if (req_.split_reasoning && !c.reasoning.empty()) {
        std::string r = c.reasoning;
        while (!r.empty() && (r.back() == '\n' || r.back() == ' ')) r.pop_back();
        msg["reasoning_content"] = r;
      }
      msg["refusal"] = nullptr;
      if (!c.calls.empty()) {
        if (c.content.empty()) msg["content"] = nullptr;
        msg["tool_calls"] = tool_calls_json(c);
      }
      choices.push_back(json{{"index", i},
                             {"message", msg},
                             {"logprobs", req_.want_logprobs ? logprobs_chat(c.logprobs) : json(nullptr)},
                             {"finish_reason", c.finish_reason.empty() ? json(nullptr) : json(c.finish_reason)}});
    } else {
      size_t offset = req_.echo ? prompt_of(i).size() : 0;
      choices.push_back(json{{"text", req_.echo ? prompt_of(i) + c.content : c.content},
                             {"index", i},
                             {"logprobs", req_.want_logprobs ? logprobs_completion(c.logprobs, offset) : json(nullptr)},
                             {"finish_reason", c.finish_reason.empty() ? json(nullptr) : json(c.finish_reason)}});
    }
  }
  j["choices"] = choices;
  j["usage"] = usage(t);
  j["timings"] = timings(t);
  return j;
}

// ---- small endpoints ----

json models_body(const ModelContext& mc, long created) {
  json meta{{"vocab_type", mc.tokenizer ? (int)mc.tokenizer->kind() + 1 : 0},
            {"n_vocab", mc.n_vocab},
            {"n_ctx_train", mc.n_ctx_train},
            {"n_embd", mc.n_embd},
            {"n_params", mc.n_params},
            {"size", mc.size_bytes}};
  json model{{"id", mc.model_id}, {"object", "model"}, {"created", created}, {"owned_by", mc.owned_by}, {"meta", meta}};
  return json{{"object", "list"}, {"data", json::array({model})}};
}

json props_body(const ModelContext& mc, const SchedulerStatus& st) {
  const SamplingParams& sp = mc.default_sampling;
  json params{{"n_predict", mc.default_n_predict}, {"temperature", sp.temperature},       {"top_k", sp.top_k},
              {"top_p", sp.top_p},                     {"typical_p", sp.typical_p},           {"min_p", sp.min_p},
              {"repeat_penalty", sp.repeat_penalty},   {"repeat_last_n", sp.repeat_last_n}};
  json j;
  j["default_generation_settings"] = json{{"n_ctx", mc.n_ctx}, {"params", params}};
  j["total_slots"] = st.n_slots;
  j["model_path"] = mc.model_path;
  j["model_alias"] = mc.model_id;
  j["chat_template"] = mc.chat_template_source;
  j["chat_template_caps"] = json{{"supports_tools", mc.chat_template_source.find("tools") != std::string::npos},
                                 {"supports_thinking", mc.thinking_template}};
  j["modalities"] = json{{"vision", false}, {"audio", false}};
  j["build_info"] = "roofline";
  j["is_sleeping"] = false;
  j["bos_token"] = mc.tokenizer ? mc.tokenizer->special_text(mc.tokenizer->bos()) : "";
  j["eos_token"] = mc.tokenizer ? mc.tokenizer->special_text(mc.tokenizer->eos()) : "";
  return j;
}

json slots_body(const ModelContext& mc, const SchedulerStatus& st) {
  json arr = json::array();
  for (const SlotStatus& s : st.slots) {
    arr.push_back(json{{"id", s.id},
                       {"id_task", s.busy ? json(s.request) : json(-1)},
                       {"n_ctx", mc.n_ctx},
                       {"speculative", false},
                       {"is_processing", s.busy},
                       {"prompt_tokens", s.n_prompt},
                       {"prefilling", s.prefilling},
                       {"next_token", json{{"has_next_token", s.busy}, {"n_decoded", s.n_generated}}}});
  }
  return arr;
}

json tokenize_body(const ModelContext& mc, const json& body) {
  const Tokenizer& tok = *mc.tokenizer;
  auto bool_field = [&](const char* name, bool def) {
    if (!body.contains(name) || body[name].is_null()) return def;
    if (!body[name].is_boolean()) throw ApiError(400, fmt::format("'{}' must be a boolean", name), name);
    return body[name].get<bool>();
  };
  std::vector<int32_t> ids;
  bool llama_dialect = true;
  if (body.contains("content")) {
    if (!body["content"].is_string()) throw ApiError(400, "'content' must be a string", "content");
    ids = tok.encode(body["content"].get<std::string>(), bool_field("add_special", false), bool_field("parse_special", true));
  } else if (body.contains("prompt")) {
    llama_dialect = false;
    if (!body["prompt"].is_string()) throw ApiError(400, "'prompt' must be a string", "prompt");
    ids = tok.encode(body["prompt"].get<std::string>(), bool_field("add_special_tokens", true), true);
  } else if (body.contains("messages")) {
    llama_dialect = false;
    const std::string text = render_chat(mc, body["messages"], json(), json::object(), bool_field("add_generation_prompt", true));
    ids = tok.encode(text, bool_field("add_special_tokens", false), true);
  } else {
    throw ApiError(400, "'content' (or 'prompt' / 'messages') is required", "content");
  }
  json j;
  if (llama_dialect && bool_field("with_pieces", false)) {
    json arr = json::array();
    for (int32_t id : ids) {
      const std::string piece = tok.token_to_piece(id, true);
      const std::string clean = utf8_sanitize(piece);
      if (clean == piece) {
        arr.push_back(json{{"id", id}, {"piece", piece}});
      } else {
        json bytes = json::array();
        for (unsigned char ch : piece) bytes.push_back((int)ch);
        arr.push_back(json{{"id", id}, {"piece", bytes}});
      }
    }
    j["tokens"] = arr;
  } else {
    j["tokens"] = ids;
  }
  j["count"] = ids.size();
  j["max_model_len"] = mc.n_ctx;
  if (!llama_dialect && bool_field("return_token_strs", false)) {
    json strs = json::array();
    for (int32_t id : ids) strs.push_back(utf8_sanitize(tok.token_to_piece(id, true)));
    j["token_strs"] = strs;
  }
  return j;
}

json detokenize_body(const ModelContext& mc, const json& body) {
  if (!body.contains("tokens") || !body["tokens"].is_array()) throw ApiError(400, "'tokens' must be an array of token ids", "tokens");
  std::vector<int32_t> ids;
  for (const json& t : body["tokens"]) {
    if (!t.is_number_integer()) throw ApiError(400, "'tokens' must be an array of token ids", "tokens");
    const int64_t id = t.get<int64_t>();
    if (id < 0 || id >= mc.n_vocab) throw ApiError(400, fmt::format("token id {} is out of range [0, {})", id, mc.n_vocab), "tokens");
    ids.push_back((int32_t)id);
  }
  std::string text;
  for (int32_t id : ids) text += mc.tokenizer->token_to_piece(id, true);
  text = utf8_sanitize(text);
  return json{{"content", text}, {"prompt", text}};
}

json apply_template_body(const ModelContext& mc, const json& body) {
  if (!body.contains("messages")) throw ApiError(400, "'messages' is required", "messages");
  json tools;
  if (body.contains("tools") && body["tools"].is_array() && !body["tools"].empty()) tools = body["tools"];
  json kwargs = body.contains("chat_template_kwargs") && body["chat_template_kwargs"].is_object() ? body["chat_template_kwargs"] : json::object();
  bool add_generation_prompt = true;
  if (body.contains("add_generation_prompt") && body["add_generation_prompt"].is_boolean())
    add_generation_prompt = body["add_generation_prompt"].get<bool>();
  return json{{"prompt", render_chat(mc, body["messages"], tools, kwargs, add_generation_prompt)}};
}

}  // namespace roofline::serve
