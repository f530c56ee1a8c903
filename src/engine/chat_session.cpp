// ChatSession: one sequence per conversation, fed only what it does not hold yet (chat_session.h).
#include "engine/chat_session.h"

#include <chrono>
#include <climits>

#include "core/error.h"
#include "core/log.h"

namespace roofline {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Bytes of `s` that form whole UTF-8 characters (a character may span several tokens).
size_t complete_utf8_prefix(const std::string& s) {
  const size_t n = s.size();
  size_t back = 0;  // continuation bytes at the end
  while (back < 4 && back < n && ((unsigned char)s[n - 1 - back] & 0xC0) == 0x80) ++back;
  if (back == n) return n;
  const unsigned char lead = (unsigned char)s[n - 1 - back];
  const size_t need = lead < 0x80 ? 1 : (lead >> 5) == 6 ? 2 : (lead >> 4) == 14 ? 3 : (lead >> 3) == 30 ? 4 : 1;
  return back + 1 >= need ? n : n - 1 - back;
}

}  // namespace

ChatSession::ChatSession(Engine& engine, std::shared_ptr<const Tokenizer> tokenizer, std::shared_ptr<const ChatTemplate> tmpl,
                         Options options)
    : engine_(engine),
      tokenizer_(std::move(tokenizer)),
      template_(std::move(tmpl)),
      options_(std::move(options)),
      sampler_(options_.sampling, engine.n_vocab()) {
  clear();
}

ChatSession::~ChatSession() {
  if (seq_ >= 0 && engine_.memory().has_sequence(seq_)) engine_.memory().free_sequence(seq_);
}

void ChatSession::clear() {
  messages_ = nlohmann::ordered_json::array();
  if (!options_.system_prompt.empty()) messages_.push_back({{"role", "system"}, {"content", options_.system_prompt}});
}

int ChatSession::sequence_length() const { return seq_ >= 0 ? engine_.memory().length(seq_) : 0; }

std::vector<int32_t> ChatSession::render(const nlohmann::ordered_json& messages, bool add_generation_prompt) const {
  ChatTemplateInputs in;
  in.messages = normalize_chat_messages(messages);
  in.add_generation_prompt = add_generation_prompt;
  in.kwargs = options_.template_kwargs;
  const Tokenizer& tok = *tokenizer_;
  in.bos_token = tok.special_text(tok.bos());
  in.eos_token = tok.special_text(tok.eos());
  in.pad_token = tok.special_text(tok.pad());
  in.unk_token = tok.special_text(tok.unk());
  // As the server does: the template writes the special tokens it wants (BOS included).
  return tok.encode(template_->apply(in), false, true);
}

void ChatSession::restart_sequence() {
  if (seq_ >= 0) engine_.memory().free_sequence(seq_);
  seq_ = engine_.memory().create_sequence(false);
  fed_.clear();
}

int ChatSession::sync(const std::vector<int32_t>& prompt, ChatTurnStats& stats) {
  size_t common = 0;
  while (common < fed_.size() && common < prompt.size() && fed_[common] == prompt[common]) ++common;
  if (seq_ < 0) {
    restart_sequence();
    return 0;
  }
  // The last prompt token must be fed this turn (its logits start the reply).
  const size_t want = std::min(common, prompt.size() - 1);
  if (want == fed_.size()) return (int)want;
  if (!engine_.memory().recurrent()) {
    const int kept = engine_.memory().truncate(seq_, (int)want);
    fed_.resize((size_t)kept);
    log_debug("chat: the history departs from the sequence at token {}; cut back to {}", common, kept);
    return kept;
  }
  // A recurrent state cannot go back: start over with the whole history.
  log_debug("chat: the history departs from the sequence at token {} of {}; a recurrent model starts a fresh sequence",
            common, fed_.size());
  restart_sequence();
  stats.fresh_sequence = true;
  return 0;
}

ChatTurnStats ChatSession::reply(const std::string& user_message, const std::function<void(const std::string&)>& on_text,
                                 const std::atomic<bool>* stop) {
  ChatTurnStats stats;
  const int n_ctx = engine_.options().n_ctx;
  const nlohmann::ordered_json message = {{"role", "user"}, {"content", user_message}};
  const size_t first = !messages_.empty() && messages_[0]["role"] == "system" ? 1 : 0;
  {  // a message that does not fit even alone is refused, the history left as it was
    nlohmann::ordered_json alone(messages_.begin(), messages_.begin() + (long)first);
    alone.push_back(message);
    const size_t n = render(alone, true).size();
    if ((int)n >= n_ctx) fail("the message takes {} tokens with the chat template; the context holds {} (-c)", n, n_ctx);
  }
  messages_.push_back(message);
  std::vector<int32_t> prompt = render(messages_, true);
  // Keep room for a reply; drop the oldest exchanges (never the system prompt or this message) until
  // the conversation fits.
  const int room = options_.n_predict > 0 ? std::min(options_.n_predict, n_ctx / 2) : std::min(256, n_ctx / 4);
  while ((int)prompt.size() + room > n_ctx && messages_.size() > first + 1) {
    size_t end = first + 1;  // the oldest message and what follows it up to the next user message
    while (end + 1 < messages_.size() && messages_[end]["role"] != "user") ++end;
    stats.dropped_messages += (int)(end - first);
    messages_.erase(messages_.begin() + (long)first, messages_.begin() + (long)end);
    prompt = render(messages_, true);
  }
  stats.prompt_tokens = (int)prompt.size();

  auto t0 = Clock::now();
  const int reused = sync(prompt, stats);
  stats.reused_tokens = reused;
  stats.fed_tokens = (int)prompt.size() - reused;
  std::vector<float> logits = engine_.eval(seq_, std::span<const int32_t>(prompt.data() + reused, prompt.size() - reused), false);
  fed_.insert(fed_.end(), prompt.begin() + reused, prompt.end());
  stats.prompt_seconds = seconds_since(t0);
  log_debug("chat: prompt {} tokens, {} already in the sequence, {} fed", stats.prompt_tokens, reused, stats.fed_tokens);

  t0 = Clock::now();
  std::string text, pending;
  const int limit = options_.n_predict < 0 ? INT_MAX : options_.n_predict;
  while (stats.generated_tokens < limit) {
    if (stop && stop->load()) {
      stats.interrupted = true;
      break;
    }
    const int32_t next = sampler_.sample(logits.data(), fed_).token;
    ++stats.generated_tokens;
    if (tokenizer_->is_eog(next)) break;
    const std::string piece = tokenizer_->token_to_piece(next, false);
    text += piece;
    pending += piece;
    if (const size_t n = complete_utf8_prefix(pending); n > 0) {
      on_text(pending.substr(0, n));
      pending.erase(0, n);
    }
    if (stats.generated_tokens == limit) break;
    if ((int)fed_.size() + 1 >= n_ctx) {
      stats.context_full = true;
      break;
    }
    const int32_t one[1] = {next};
    logits = engine_.eval(seq_, one, false);
    fed_.push_back(next);
  }
  if (!pending.empty()) on_text(pending);
  stats.generation_seconds = seconds_since(t0);
  messages_.push_back({{"role", "assistant"}, {"content", text}});
  return stats;
}

}  // namespace roofline
