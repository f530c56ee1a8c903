// Request bodies of /v1/chat/completions, /v1/completions and /completion validated (wrong types and
// out-of-range values are 400s naming the field; unknown fields are ignored) and translated into the
// scheduler's GenParams: chat messages rendered through the chat template, prompts tokenized.
#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "core/json_nesting.h"
#include "serve/api.h"
#include "serve/structured_output.h"

namespace roofline::serve {

namespace {

const json* field(const json& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

std::string num_text(double v) {
  if (v == std::floor(v) && std::fabs(v) < 1e15) return fmt::format("{}", (long long)v);
  return fmt::format("{}", v);
}

double get_number(const json& body, const char* name, double lo, double hi, double def) {
  const json* v = field(body, name);
  if (!v) return def;
  if (!v->is_number()) throw ApiError(400, fmt::format("'{}' must be a number", name), name);
  const double d = v->get<double>();
  if (!std::isfinite(d) || d < lo || d > hi)
    throw ApiError(400, fmt::format("'{}' must be between {} and {} (got {})", name, num_text(lo), num_text(hi), num_text(d)), name);
  return d;
}

int64_t get_int(const json& body, const char* name, int64_t lo, int64_t hi, int64_t def) {
  const json* v = field(body, name);
  if (!v) return def;
  int64_t x = 0;
  if (v->is_number_integer()) {
    x = v->is_number_unsigned() ? (int64_t)std::min<uint64_t>(v->get<uint64_t>(), (uint64_t)INT64_MAX) : v->get<int64_t>();
  } else if (v->is_number_float() && std::isfinite(v->get<double>()) && v->get<double>() == std::floor(v->get<double>()) &&
             std::fabs(v->get<double>()) < 9e18) {
    x = (int64_t)v->get<double>();
  } else {
    throw ApiError(400, fmt::format("'{}' must be an integer", name), name);
  }
  if (x < lo || x > hi) throw ApiError(400, fmt::format("'{}' must be between {} and {} (got {})", name, lo, hi, x), name);
  return x;
}

bool get_bool(const json& body, const char* name, bool def) {
  const json* v = field(body, name);
  if (!v) return def;
  if (!v->is_boolean()) throw ApiError(400, fmt::format("'{}' must be a boolean", name), name);
  return v->get<bool>();
}

const char* first_present(const json& body, std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (field(body, n)) return n;
  return nullptr;
}

std::vector<int32_t> tokens_from_json(const json& arr, const ModelContext& mc, const char* param) {
  std::vector<int32_t> out;
  for (const json& t : arr) {
    if (!t.is_number_integer()) throw ApiError(400, fmt::format("'{}' token ids must be integers", param), param);
    const int64_t id = t.get<int64_t>();
    if (id < 0 || id >= mc.n_vocab)
      throw ApiError(400, fmt::format("token id {} in '{}' is out of range [0, {})", id, param, mc.n_vocab), param);
    out.push_back((int32_t)id);
  }
  return out;
}

void parse_logit_bias(const json& body, const ModelContext& mc, SamplingParams& sp) {
  const json* lb = field(body, "logit_bias");
  if (!lb) return;
  auto bias_value = [&](const json& v) -> float {
    if (v.is_boolean()) {
      if (!v.get<bool>()) return -std::numeric_limits<float>::infinity();
      throw ApiError(400, "'logit_bias' values must be numbers between -100 and 100, or false", "logit_bias");
    }
    if (!v.is_number()) throw ApiError(400, "'logit_bias' values must be numbers between -100 and 100, or false", "logit_bias");
    const double d = v.get<double>();
    if (!std::isfinite(d) || d < -100 || d > 100)
      throw ApiError(400, fmt::format("'logit_bias' values must be between -100 and 100 (got {})", num_text(d)), "logit_bias");
    return (float)d;
  };
  auto add = [&](const json& key, float bias) {
    if (key.is_number_integer()) {
      const int64_t id = key.get<int64_t>();
      if (id < 0 || id >= mc.n_vocab) throw ApiError(400, fmt::format("'logit_bias' token id {} is out of range", id), "logit_bias");
      sp.logit_bias.push_back({(int32_t)id, bias});
    } else if (key.is_string()) {  // llama-server: a string is tokenized and every token gets the bias
      for (int32_t id : mc.tokenizer->encode(key.get<std::string>(), false, false)) sp.logit_bias.push_back({id, bias});
    } else {
      throw ApiError(400, "'logit_bias' keys must be token ids", "logit_bias");
    }
  };
  if (lb->is_object()) {
    for (auto it = lb->begin(); it != lb->end(); ++it) {
      const std::string& k = it.key();
      char* end = nullptr;
      const long long id = std::strtoll(k.c_str(), &end, 10);
      if (k.empty() || *end) throw ApiError(400, fmt::format("'logit_bias' key '{}' is not a token id", k), "logit_bias");
      add(json(id), bias_value(it.value()));
    }
  } else if (lb->is_array()) {
    for (const json& pair : *lb) {
      if (!pair.is_array() || pair.size() != 2) throw ApiError(400, "'logit_bias' entries must be [token, bias] pairs", "logit_bias");
      add(pair[0], bias_value(pair[1]));
    }
  } else {
    throw ApiError(400, "'logit_bias' must be an object of token id -> bias", "logit_bias");
  }
}

std::vector<std::string> parse_stop(const json& body) {
  const json* s = field(body, "stop");
  std::vector<std::string> out;
  if (!s) return out;
  if (s->is_string()) {
    if (!s->get<std::string>().empty()) out.push_back(s->get<std::string>());
    return out;
  }
  if (!s->is_array()) throw ApiError(400, "'stop' must be a string or an array of strings", "stop");
  if (s->size() > 16) throw ApiError(400, "'stop' may hold at most 16 strings", "stop");
  for (const json& x : *s) {
    if (!x.is_string()) throw ApiError(400, "'stop' must be a string or an array of strings", "stop");
    if (!x.get<std::string>().empty()) out.push_back(x.get<std::string>());
  }
  return out;
}

}  // namespace

json parse_body(const std::string& body) {
  if (json_nesting_depth(body) > kMaxJsonNesting)
    throw ApiError(400, fmt::format("the request body nests arrays and objects more than {} levels deep", kMaxJsonNesting));
  json j;
  try {
    j = json::parse(body);
  } catch (const json::exception& e) {
    throw ApiError(400, fmt::format("the request body is not valid JSON: {}", e.what()));
  }
  if (!j.is_object()) throw ApiError(400, "the request body must be a JSON object");
  return j;
}

void parse_sampling(const json& body, const ModelContext& mc, ApiRequest& r, bool openai) {
  SamplingParams& sp = r.gen.sampling;
  sp = mc.default_sampling;
  sp.temperature = (float)get_number(body, "temperature", openai ? 0.0 : -1e9, openai ? 2.0 : 1e9, sp.temperature);
  sp.top_p = (float)get_number(body, "top_p", 0.0, 1.0, sp.top_p);
  sp.min_p = (float)get_number(body, "min_p", 0.0, 1.0, sp.min_p);
  sp.top_k = (int)get_int(body, "top_k", -1, INT32_MAX, sp.top_k);
  sp.presence_penalty = (float)get_number(body, "presence_penalty", -2.0, 2.0, sp.presence_penalty);
  sp.frequency_penalty = (float)get_number(body, "frequency_penalty", -2.0, 2.0, sp.frequency_penalty);
  if (const char* n = first_present(body, {"repeat_penalty", "repetition_penalty"}))
    sp.repeat_penalty = (float)get_number(body, n, 1e-6, 100.0, sp.repeat_penalty);
  sp.repeat_last_n = (int)get_int(body, "repeat_last_n", -1, INT32_MAX, sp.repeat_last_n);
  if (const char* n = first_present(body, {"typical_p", "typ_p"})) sp.typical_p = (float)get_number(body, n, 0.0, 1.0, sp.typical_p);
  if (field(body, "seed")) {
    const int64_t seed = get_int(body, "seed", INT64_MIN, INT64_MAX, -1);
    sp.seed = seed == -1 ? 0xFFFFFFFFu : (uint64_t)seed;
  }
  parse_logit_bias(body, mc, sp);
  r.gen.stop = parse_stop(body);
  r.gen.ignore_eos = get_bool(body, "ignore_eos", false);
  r.gen.cache_prompt = get_bool(body, "cache_prompt", true);
  // llama-server's per-request draft settings (flat keys); without a draft model they change nothing.
  r.gen.draft_max = (int)get_int(body, "speculative.n_max", 0, 1 << 20, -1);
  r.gen.draft_min = (int)get_int(body, "speculative.n_min", 0, 1 << 20, -1);
  r.gen.draft_p_min = (float)get_number(body, "speculative.p_min", 0.0, 1.0, -1.0);
  if (const char* n = first_present(body, {"n", "n_cmpl"})) r.gen.n = (int)get_int(body, n, 1, 128, 1);
  r.stream = get_bool(body, "stream", false);
  if (const json* so = field(body, "stream_options")) {
    if (!so->is_object()) throw ApiError(400, "'stream_options' must be an object", "stream_options");
    r.include_usage = get_bool(*so, "include_usage", false);
  }
  if (const json* m = field(body, "model"); m && !m->is_string()) throw ApiError(400, "'model' must be a string", "model");
  // response_format, json_schema, grammar: a grammar the output must follow (structured_output.h).
  r.gen.grammar = parse_structured_output(body);
}

json normalize_messages(const json& messages) {
  if (!messages.is_array()) throw ApiError(400, "'messages' must be an array", "messages");
  if (messages.empty()) throw ApiError(400, "'messages' must not be empty", "messages");
  json out = json::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    const json& m = messages[i];
    const std::string where = fmt::format("messages[{}]", i);
    if (!m.is_object()) throw ApiError(400, fmt::format("'{}' must be an object", where), "messages");
    if (!m.contains("role") || !m["role"].is_string())
      throw ApiError(400, fmt::format("'{}.role' must be a string", where), "messages");
    json msg = m;
    const std::string role = m["role"].get<std::string>();
    if (role == "developer") msg["role"] = "system";
    if (!m.contains("content") || m["content"].is_null()) {
      // As OpenAI: only an assistant message that calls tools (or a function) may come without content.
      const bool calls = role == "assistant" && ((m.contains("tool_calls") && !m["tool_calls"].is_null()) ||
                                                 (m.contains("function_call") && !m["function_call"].is_null()));
      if (!calls)
        throw ApiError(400, fmt::format("'{}.content' is required (a string or an array of content parts)", where), "messages");
      // Templates test and concatenate content ('</think>' in content, content + ...): a call without
      // text renders as empty content, as llama-server renders it.
      msg["content"] = "";
    } else if (m["content"].is_array()) {
      std::string text;
      for (const json& part : m["content"]) {
        if (part.is_string()) {
          text += part.get<std::string>();
          continue;
        }
        if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
          throw ApiError(400, fmt::format("'{}.content' parts must be objects with a 'type'", where), "messages");
        const std::string type = part["type"].get<std::string>();
        if (type == "text") {
          if (!part.contains("text") || !part["text"].is_string())
            throw ApiError(400, fmt::format("'{}.content' text parts need a string 'text'", where), "messages");
          if (!text.empty()) text += "\n";
          text += part["text"].get<std::string>();
        } else if (type == "refusal") {
          continue;
        } else {
          throw ApiError(400, fmt::format("content of type '{}' is not supported by this model", type), "messages");
        }
      }
      msg["content"] = text;
    } else if (!m["content"].is_string()) {
      throw ApiError(400, fmt::format("'{}.content' must be a string or an array of content parts", where), "messages");
    }
    out.push_back(std::move(msg));
  }
  return out;
}

namespace {
bool has_tool_messages(const json& messages) {
  for (const json& m : messages)
    if (m.value("role", "") == "tool" || (m.contains("tool_calls") && m["tool_calls"].is_array() && !m["tool_calls"].empty())) return true;
  return false;
}
}  // namespace

std::string render_chat(const ModelContext& mc, const json& messages, const json& tools, const json& kwargs,
                        bool add_generation_prompt) {
  if (!mc.chat_template) throw ApiError(500, "the server has no chat template");
  ChatTemplateInputs in;
  in.messages = normalize_chat_messages(normalize_messages(messages));
  in.tools = tools;
  // A template that knows no tools (Gemma 3) sees them, and the calls and results, as plain messages.
  if (template_needs_tool_rewrite(mc.chat_template_source) && (!tools.is_null() || has_tool_messages(in.messages))) {
    in.messages = describe_tools_in_messages(in.messages, tools);
    in.tools = nullptr;
  }
  in.add_generation_prompt = add_generation_prompt;
  in.kwargs = mc.default_template_kwargs;
  if (kwargs.is_object())
    for (auto it = kwargs.begin(); it != kwargs.end(); ++it) in.kwargs[it.key()] = it.value();
  const Tokenizer& tok = *mc.tokenizer;
  in.bos_token = tok.special_text(tok.bos());
  in.eos_token = tok.special_text(tok.eos());
  in.pad_token = tok.special_text(tok.pad());
  in.unk_token = tok.special_text(tok.unk());
  try {
    return mc.chat_template->apply(in);
  } catch (const InternalError&) {
    throw;  // a bug of ours (500), not the request's template input
  } catch (const Error& e) {
    throw ApiError(400, fmt::format("the chat template failed: {}", e.what()), "messages");
  } catch (const nlohmann::json::exception& e) {
    throw ApiError(400, fmt::format("the chat template failed: {}", e.what()), "messages");
  }
}

ApiRequest parse_chat_request(const json& body, const ModelContext& mc) {
  ApiRequest r;
  r.endpoint = Endpoint::Chat;
  const json* messages = field(body, "messages");
  if (!messages) throw ApiError(400, "'messages' is required", "messages");
  parse_sampling(body, mc, r, true);
  r.gen.max_tokens = mc.default_n_predict;
  if (const char* n = first_present(body, {"max_completion_tokens", "max_tokens", "n_predict"})) {
    const int64_t v = get_int(body, n, INT64_MIN, INT64_MAX, -1);
    if (v != -1 && (v < 1 || v > INT32_MAX))
      throw ApiError(400, fmt::format("'{}' must be between 1 and {}, or -1 for no limit (got {})", n, INT32_MAX, v), n);
    r.gen.max_tokens = (int)v;
  }
  r.want_logprobs = get_bool(body, "logprobs", false);
  if (field(body, "top_logprobs")) {
    const int k = (int)get_int(body, "top_logprobs", 0, 20, 0);
    if (!r.want_logprobs) throw ApiError(400, "'top_logprobs' needs 'logprobs': true", "top_logprobs");
    r.gen.logprobs = k;
  } else if (r.want_logprobs) {
    r.gen.logprobs = 0;
  }
  // Tools are rendered whatever tool_choice says (as llama-server); calls are parsed unless "none".
  r.tools = parse_tools_request(body);
  r.tools.format = tool_call_format_of_template(mc.chat_template_source);
  if (auto forced = tool_choice_grammar(r.tools)) {
    if (r.gen.grammar) throw ApiError(400, "tool_choice \"required\" or a named function cannot be combined with a response format or grammar", "tool_choice");
    r.gen.grammar = std::move(forced);
    r.tools.format = ToolCallFormat::Hermes;  // the grammar writes Qwen's <tool_call> form, whatever the template's
  }
  json kwargs = json::object();
  if (const json* k = field(body, "chat_template_kwargs")) {
    if (!k->is_object()) throw ApiError(400, "'chat_template_kwargs' must be an object", "chat_template_kwargs");
    kwargs = *k;
  }
  // Constrained output starts at the first generated token: a thinking template is asked for its
  // answer without reasoning (Qwen3's empty <think></think>) unless the request says otherwise.
  if (r.gen.grammar && mc.thinking_template && !kwargs.contains("enable_thinking") &&
      !mc.default_template_kwargs.contains("enable_thinking"))
    kwargs["enable_thinking"] = false;
  bool add_generation_prompt = get_bool(body, "add_generation_prompt", true);
  r.prompt_text = render_chat(mc, *messages, r.tools.tools, kwargs, add_generation_prompt);
  r.gen.prompt = mc.tokenizer->encode(r.prompt_text, false, true);
  std::string format = "auto";
  if (const json* f = field(body, "reasoning_format")) {
    if (!f->is_string()) throw ApiError(400, "'reasoning_format' must be a string", "reasoning_format");
    format = f->get<std::string>();
  }
  r.split_reasoning = mc.thinking_template && format != "none";
  if (r.split_reasoning) {
    std::string tail = r.prompt_text;
    while (!tail.empty() && (tail.back() == '\n' || tail.back() == ' ')) tail.pop_back();
    r.start_in_reasoning = tail.size() >= 7 && tail.compare(tail.size() - 7, 7, "<think>") == 0;
    // A grammar's output is the answer even where the prompt opened a reasoning block.
    if (r.gen.grammar && r.start_in_reasoning) r.split_reasoning = r.start_in_reasoning = false;
  }
  if (r.gen.prompt.empty()) throw ApiError(400, "the rendered prompt is empty", "messages");
  return r;
}

ApiRequest parse_completion_request(const json& body, const ModelContext& mc, Endpoint endpoint) {
  ApiRequest r;
  r.endpoint = endpoint;
  const bool openai = endpoint == Endpoint::Completions;
  parse_sampling(body, mc, r, openai);
  const json* prompt = field(body, "prompt");
  if (!prompt) throw ApiError(400, "'prompt' is required", "prompt");
  const Tokenizer& tok = *mc.tokenizer;
  // A string, token ids, or (one of) those in an array; the native API also mixes strings and ids.
  json p = *prompt;
  if (p.is_array() && p.size() == 1 && (p[0].is_string() || p[0].is_array())) p = p[0];
  if (p.is_string()) {
    r.prompt_text = p.get<std::string>();
    r.gen.prompt = tok.encode(r.prompt_text, true, true);
  } else if (p.is_array() && !p.empty()) {
    bool all_ints = true;
    for (const json& x : p) all_ints = all_ints && x.is_number_integer();
    if (all_ints) {
      r.gen.prompt = tokens_from_json(p, mc, "prompt");
    } else if (!openai) {
      for (const json& x : p) {
        if (x.is_number_integer()) {
          auto one = tokens_from_json(json::array({x}), mc, "prompt");
          r.gen.prompt.push_back(one[0]);
        } else if (x.is_string()) {
          auto more = tok.encode(x.get<std::string>(), r.gen.prompt.empty(), true);
          r.gen.prompt.insert(r.gen.prompt.end(), more.begin(), more.end());
        } else {
          throw ApiError(400, "'prompt' must be a string, token ids, or a mix of them", "prompt");
        }
      }
    } else if (std::all_of(p.begin(), p.end(), [](const json& x) { return x.is_string() || x.is_array(); })) {
      // Several prompts (OpenAI): each a string or token ids; prompt i's choices come at i * n + j.
      for (const json& x : p) {
        std::vector<int32_t> ids = x.is_string() ? tok.encode(x.get<std::string>(), true, true) : tokens_from_json(x, mc, "prompt");
        if (ids.empty()) throw ApiError(400, "a prompt of the array is empty", "prompt");
        r.prompt_texts.push_back(x.is_string() ? x.get<std::string>() : tok.decode(ids));
        r.prompts.push_back(std::move(ids));
      }
      r.gen.prompt = r.prompts[0];
    } else {
      throw ApiError(400, "'prompt' must be a string or an array of token ids", "prompt");
    }
    r.prompt_text = r.prompt_texts.empty() ? tok.decode(r.gen.prompt) : r.prompt_texts[0];
  } else {
    throw ApiError(400, "'prompt' must be a non-empty string, token ids, or an array of those", "prompt");
  }
  if (r.gen.prompt.empty()) throw ApiError(400, "the prompt is empty", "prompt");
  if (openai) {
    r.gen.max_tokens = 16;  // OpenAI's and vLLM's default for /v1/completions
    if (const char* n = first_present(body, {"max_tokens", "n_predict"})) r.gen.max_tokens = (int)get_int(body, n, -1, INT32_MAX, 16);
    r.echo = get_bool(body, "echo", false);
    if (field(body, "logprobs")) {
      const json& lp = body["logprobs"];
      if (lp.is_boolean()) {
        if (lp.get<bool>()) r.gen.logprobs = 0;
      } else {
        r.gen.logprobs = (int)get_int(body, "logprobs", 0, 20, 0);
      }
      r.want_logprobs = r.gen.logprobs >= 0;
    }
    (void)get_int(body, "best_of", 1, 128, 1);
    if (!r.prompts.empty() && r.prompts.size() * (size_t)r.gen.n > 128)
      throw ApiError(400, fmt::format("{} prompts x n = {} choices; at most 128 per request", r.prompts.size(), r.gen.n), "prompt");
  } else {
    r.gen.max_tokens = mc.default_n_predict;
    if (const char* n = first_present(body, {"n_predict", "max_tokens"})) r.gen.max_tokens = (int)get_int(body, n, -1, INT32_MAX, -1);
    if (field(body, "n_probs")) {
      r.gen.logprobs = (int)get_int(body, "n_probs", 0, 20, 0);
      r.want_logprobs = r.gen.logprobs > 0;
      if (!r.want_logprobs) r.gen.logprobs = -1;
    }
    r.return_tokens = get_bool(body, "return_tokens", false);
    const SamplingParams& sp = r.gen.sampling;
    r.generation_settings = json{{"n_predict", r.gen.max_tokens},
                                 {"temperature", sp.temperature},
                                 {"top_k", sp.top_k},
                                 {"top_p", sp.top_p},
                                 {"typical_p", sp.typical_p},
                                 {"min_p", sp.min_p},
                                 {"repeat_penalty", sp.repeat_penalty},
                                 {"repeat_last_n", sp.repeat_last_n},
                                 {"presence_penalty", sp.presence_penalty},
                                 {"frequency_penalty", sp.frequency_penalty},
                                 {"seed", sp.seed == 0xFFFFFFFFu ? (int64_t)-1 : (int64_t)sp.seed},
                                 {"stop", r.gen.stop},
                                 {"ignore_eos", r.gen.ignore_eos},
                                 {"stream", r.stream},
                                 {"cache_prompt", r.gen.cache_prompt},
                                 {"n_probs", std::max(0, r.gen.logprobs)}};
  }
  return r;
}

}  // namespace roofline::serve
