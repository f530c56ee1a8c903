// The serving scheduler: -np slots over one shared paged KV pool, a bounded FIFO queue, admission by
// KV blocks (prompt + max_tokens reserved up front), continuous batching (decode rows of every running
// sequence plus chunks of pending prompts in one step), prompt caching (a new sequence adopts the
// cached blocks of the longest matching prefix), n > 1 through forks, sampling, stop strings and
// logprobs, speculative decoding (a drafter's tokens verified inside the same steps, engine/speculative.h).
// One thread owns the StepRunner; HTTP threads only submit and read per-request channels.
// Each iteration picks the tokens of the step that just finished, launches the next step, and makes
// the text and events of those tokens while the device computes it.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/thread_pool.h"
#include "engine/pooling.h"
#include "engine/sampler.h"
#include "engine/speculative.h"
#include "serve/metrics.h"
#include "serve/step_runner.h"

namespace roofline::serve {

class Grammar;
class GrammarAutomaton;
class AutomatonCache;
class TokenVocab;

struct TopLogprob {
  int32_t token = 0;
  float logprob = 0;
};
struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0;
  std::vector<TopLogprob> top;  // the most likely tokens, best first
};
// log-softmax of the raw logits at `token`, and the k most likely tokens (ties: lower id first).
TokenLogprob compute_logprobs(const float* logits, int n_vocab, int32_t token, int k);

enum class Finish { None, Eos, StopWord, Length, Cancelled, Error };
const char* finish_name(Finish f);  // OpenAI finish_reason: "stop", "length", ... (Cancelled/Error: "error")

// One step's output for one choice, in order.
struct Event {
  int choice = 0;
  std::string text;                     // text released by this step (may be empty: held back)
  std::vector<int32_t> tokens;          // tokens sampled this step
  std::vector<TokenLogprob> logprobs;   // one per token when requested
  Finish finish = Finish::None;
  std::string stop_word;
  std::string error;
  // Embedding requests: the prompt's pooled embedding (one vector), or one per token (pooling none).
  std::vector<std::vector<float>> embedding;
};

// What a request cost, llama-server's `timings` and the log line.
struct Timings {
  int n_prompt = 0;     // prompt tokens
  int n_cached = 0;     // of them, adopted from the prompt cache
  int n_generated = 0;  // over all choices
  double queue_ms = 0;     // submission to admission
  double prompt_ms = 0;    // admission to the first token
  double generate_ms = 0;  // first token to the last
  double ttft_ms = 0;      // submission to the first token
  int slot = -1;
  int draft_n = 0;           // speculative decoding: draft tokens the target verified (llama-server's draft_n)
  int draft_n_accepted = 0;  // of them, accepted
};

struct GenParams {
  std::string id;  // for logs and /slots
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  int max_tokens = -1;  // -1: until end of generation or the context
  int n = 1;            // choices
  std::vector<std::string> stop;
  bool ignore_eos = false;
  int logprobs = -1;    // -1: none; k >= 0: the sampled token's logprob and the top k
  bool cache_prompt = true;
  // An embedding request: the prompt is evaluated in a sequence of its own (never taken from or left in
  // the prompt cache), its final hidden states pooled, and the result sent in one event; nothing is
  // generated (n 1, max_tokens 0). The prompt may fill the whole context.
  bool embedding = false;
  Pooling pooling = Pooling::Last;
  int embd_normalize = 2;  // llama-server's embd_normalize (normalize_embedding)
  // Constrained decoding: every choice's output follows this grammar (tokens outside it are masked;
  // the choice ends when the grammar is complete and can take nothing more). Null: unconstrained.
  std::shared_ptr<const Grammar> grammar;
  // Speculative decoding, llama-server's speculative.n_max / n_min / p_min of the request (-1: the
  // server's --draft-max / --draft-min / --draft-p-min; n_max at most the server's, 0: no drafts).
  int draft_max = -1;
  int draft_min = -1;
  float draft_p_min = -1;
};

// The channel between the scheduler (producer) and the HTTP thread (consumer) of one request.
class Request {
 public:
  const std::string& id() const { return id_; }
  // Appends available events to `out`, waiting up to `timeout` when there are none. Returns true
  // once the request has finished and every event is in `out`.
  bool poll(std::vector<Event>& out, std::chrono::milliseconds timeout);
  void cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }
  Timings timings() const;

 private:
  friend class Scheduler;
  void push(Event e);
  void finish(const Timings& t);

  std::string id_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Event> events_;
  bool done_ = false;
  Timings timings_;
  std::atomic<bool> cancelled_{false};
};

// Why submit() refused a request: status 400 (can never fit) or 503 (queue full, shutting down).
struct SubmitError : std::runtime_error {
  SubmitError(int status, std::string code, const std::string& message)
      : std::runtime_error(message), status(status), code(std::move(code)) {}
  int status;
  std::string code;  // "context_length_exceeded", "queue_full", "shutting_down", ...
};

struct SchedulerOptions {
  int n_slots = 4;
  int queue_size = 16;          // waiting requests beyond the running ones (0: none wait)
  int max_prefill_per_step = 0; // prompt tokens per step (0: the runner's batch size)
  bool prompt_cache = true;
  // Speculative decoding (engine/speculative.h): every generating choice carries up to the drafter's
  // n_max draft tokens per step, verified in that step. Null: none. Refused for models whose memory
  // cannot be cut back (recurrent or sliding-window layers).
  Drafter* drafter = nullptr;
};

struct SlotStatus {
  int id = 0;
  bool busy = false;
  std::string request;
  int n_prompt = 0;
  int n_generated = 0;
  bool prefilling = false;
};

struct SchedulerStatus {
  int n_slots = 0;
  int busy_slots = 0;
  int queue_depth = 0;
  int requests_processing = 0;
  int kv_blocks_total = 0, kv_blocks_used = 0, kv_blocks_cached = 0, kv_block_size = 0;
  uint64_t steps = 0;
  std::vector<SlotStatus> slots;
};

class Scheduler {
 public:
  Scheduler(StepRunner& runner, const TokenText& text, SchedulerOptions options, Metrics* metrics = nullptr);
  ~Scheduler();

  // Runs the step loop on its own thread (until stop()).
  void start();
  // Refuses new requests and cancels waiting ones; running ones are cancelled with `cancel_running`,
  // else they finish first. Returns at once; join() waits for the loop to end.
  void stop(bool cancel_running);
  void join();
  // Waits up to `timeout` for the running requests to finish (after stop(false)); true if none left.
  bool drain(std::chrono::milliseconds timeout);

  // Queues a request; throws SubmitError when it can never fit, the queue is full or we are stopping.
  std::shared_ptr<Request> submit(GenParams params);

  // One scheduling iteration on the calling thread (tests drive the scheduler with it instead of
  // start()): finishes the step in flight and picks its tokens, admits, builds and launches the next
  // step, then sends the picked tokens' events. Returns false when there was nothing to do.
  bool step();

  SchedulerStatus status() const;
  const SchedulerOptions& options() const { return options_; }
  // The sticky device fault that stopped the scheduler (empty while healthy): set when a step throws
  // DeviceFault; from then on running and queued requests fail and submit() refuses with 503.
  std::string device_fault() const;
  int n_ctx() const { return n_ctx_; }

 private:
  struct Choice;
  struct Active;
  struct Queued {
    std::shared_ptr<Request> request;
    GenParams params;
    std::chrono::steady_clock::time_point t_submit;
  };

  void loop();
  int reservation_tokens(const GenParams& p) const;        // generated tokens reserved at admission
  int blocks_for(int n_prompt, int n_gen, int n) const;    // blocks a request may allocate in all
  void drop_cancelled_queued();                            // under mutex_
  void admit();
  void finish_choice(Active& a, Choice& c);  // frees its KV (caching its blocks first)
  void finish_request(Active& a);
  void finish_embedding(Active& a, std::chrono::steady_clock::time_point now);  // its event, then frees its KV
  // A generated token whose text and event are made after the next step is launched.
  struct Emission {
    Active* a = nullptr;
    int choice = 0;
    int32_t token = 0;
    Finish finish = Finish::None;  // decided when picked: Eos, Length or None (stop strings: in emit)
    bool grammar_end = false;      // Eos because the grammar is complete: the token's text still counts
    std::vector<TokenLogprob> logprobs;
  };
  // Picks a choice's next token (`greedy` when the step gave it, else the sampler on `logits`) and
  // decides whether the choice ends; its text and event are queued (or made now when stop strings
  // depend on them).
  void take_token(Active& a, Choice& c, int32_t greedy, const float* logits, std::chrono::steady_clock::time_point now);
  Finish emit(Emission& m);                // text, stop strings and the event of one token
  void emit_pending(const Active* only);   // the queued emissions (of one request, or all)
  void start_decoding(Active& a, int32_t greedy, const float* logits, std::chrono::steady_clock::time_point now);
  // Speculative decoding: drafts for the generating choices of the next step, within `budget` rows
  // beyond their one row each.
  void draft_choices(int budget);
  // The rows of a choice that carried drafts (refs r .. r + drafts): accepts while the target's pick
  // equals the draft, cuts the rejected positions; returns the index of the next ref.
  size_t take_drafted(Active& a, Choice& c, const StepOutput& out, size_t r, std::chrono::steady_clock::time_point now);
  // Accepted tokens a generating choice feeds again before its pending token: after rejected drafts a
  // recurrent target goes back to its state before the verification step (SequenceMemory::roll_back).
  int replay_rows(const Choice& c);
  void complete_step();                    // waits for the step in flight and picks its tokens
  void presample_rows(const StepOutput& out);
  void fail_all(const std::string& message);
  bool step_once();                           // step() without the guard
  void recover(const std::exception& e);      // something in step_once() threw
  void step_failed(const std::exception& e);  // a launch or finish threw: fail the step's requests
  void mark_device_fault(const std::string& message);
  void publish_status();
  int available_blocks() const;
  const TokenVocab& vocab();  // the vocabulary trie of constrained decoding, built on first use

  StepRunner& runner_;
  const TokenText& text_;
  SchedulerOptions options_;
  Metrics* metrics_;
  int n_ctx_, n_batch_, block_size_, n_blocks_;

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::condition_variable idle_cv_;
  std::deque<Queued> queue_;
  bool stopping_ = false, cancel_running_ = false, loop_done_ = false;
  std::string device_fault_;  // under mutex_
  uint64_t wake_version_ = 0;  // bumped by submit() and stop(): the idle loop waits for a change
  SchedulerStatus status_;
  std::thread thread_;

  // Owned by the stepping thread.
  std::vector<std::unique_ptr<Active>> active_;
  std::vector<int> slot_owner_;  // per slot: 1 busy, -1 free
  size_t decode_rotation_ = 0;
  uint64_t steps_ = 0;
  // The step in flight (launched, not yet finished): its rows, which of them carry a choice's logits
  // (choice -1: the last prompt token of a request) and the prompt chunks it holds.
  struct LogitRef {
    Active* a;
    int choice;
  };
  std::vector<BatchRow> rows_;
  std::vector<LogitRef> refs_;
  std::vector<std::pair<Active*, int>> prefill_chunks_;
  // The rows with final hidden states: an embedding request's prompt position (choice kPooled), or the
  // target position of a row whose hidden state goes to the drafter (the MTP head): a prompt row
  // (kPrompt) or a choice's pending / draft row.
  struct HiddenRef {
    Active* a;
    int choice;
    int pos;
  };
  static constexpr int kPooled = -1, kPrompt = -2;
  std::vector<HiddenRef> hidden_refs_;
  bool in_flight_ = false;
  int step_rows_done_ = 0;           // rows of the step just finished (metrics)
  std::vector<Emission> pending_;    // tokens picked whose text and events are not out yet
  std::unique_ptr<TokenVocab> vocab_;
  // The automata of recent grammars, shared by a request's choices and kept for the next requests.
  std::unique_ptr<AutomatonCache> automata_;
  std::vector<float> masked_logits_;  // constrained decoding's scratch row
  std::unique_ptr<ThreadPool> sample_pool_;  // the step's sampled rows drawn in parallel (presample_rows)
};

}  // namespace roofline::serve
