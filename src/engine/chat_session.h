// A multi-turn conversation on one engine sequence, as `roofline chat` (and `run -cnv`) hold it: the
// history is rendered through the model's chat template each turn, and only the tokens the sequence
// does not hold yet are fed. When the new rendering departs from what was fed (templates that drop
// earlier reasoning, a reply that tokenizes differently), a model without recurrent layers cuts its
// KV cache back to the common prefix; a model with recurrent layers (qwen35), whose state cannot go
// back, starts a fresh sequence and feeds the whole history again. Oldest turns are dropped when the
// history outgrows the context.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/sampler.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace roofline {

struct ChatTurnStats {
  int prompt_tokens = 0;    // the rendered conversation so far, in tokens
  int reused_tokens = 0;    // of those, already in the sequence (not fed again)
  int fed_tokens = 0;       // fed in this turn's prefill
  double prompt_seconds = 0;
  int generated_tokens = 0;
  double generation_seconds = 0;
  bool fresh_sequence = false;  // the sequence was started over this turn
  bool context_full = false;    // generation stopped at the end of the context
  bool interrupted = false;     // stopped by the caller's flag
  int dropped_messages = 0;     // oldest messages dropped to fit the context
};

class ChatSession {
 public:
  struct Options {
    std::string system_prompt;  // "" : none
    int n_predict = -1;         // most tokens per reply (-1: until the end of generation or context)
    SamplingParams sampling;
    nlohmann::ordered_json template_kwargs = nlohmann::ordered_json::object();
  };
  ChatSession(Engine& engine, std::shared_ptr<const Tokenizer> tokenizer, std::shared_ptr<const ChatTemplate> tmpl,
              Options options);
  ~ChatSession();
  ChatSession(const ChatSession&) = delete;
  ChatSession& operator=(const ChatSession&) = delete;

  // Adds the user's message and generates the reply, handing its text to on_text as it comes (whole
  // UTF-8 characters). `stop` (optional) ends the reply early when set. The reply joins the history.
  // Throws Error when even the message alone does not fit the context (it is then not kept).
  ChatTurnStats reply(const std::string& user_message, const std::function<void(const std::string&)>& on_text,
                      const std::atomic<bool>* stop = nullptr);

  void clear();  // forgets the conversation (the system prompt stays)
  const nlohmann::ordered_json& messages() const { return messages_; }
  int sequence_length() const;  // tokens the engine sequence holds
  // `messages` through the template and the tokenizer, as each turn renders the history.
  std::vector<int32_t> render(const nlohmann::ordered_json& messages, bool add_generation_prompt) const;

 private:
  // Brings the sequence to hold a prefix of `prompt`; returns how many of its tokens it holds.
  int sync(const std::vector<int32_t>& prompt, ChatTurnStats& stats);
  void restart_sequence();

  Engine& engine_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  std::shared_ptr<const ChatTemplate> template_;
  Options options_;
  Sampler sampler_;
  nlohmann::ordered_json messages_ = nlohmann::ordered_json::array();
  int seq_ = -1;
  std::vector<int32_t> fed_;  // the tokens the sequence holds, in order
};

}  // namespace roofline
