// The scheduler: admission by KV blocks from a bounded FIFO queue, one batch per step mixing decode
// rows of running sequences with prompt chunks, sampling, stop strings, logprobs, prompt caching and
// forks for n > 1 (speculative decoding's drafts: scheduler_drafts.cpp). Only the stepping thread touches the
// runner and the KV cache.
#include "serve/scheduler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "core/log.h"
#include "serve/automaton_cache.h"
#include "serve/grammar_matcher.h"
#include "serve/scheduler_state.h"
#include "serve/text_stream.h"

namespace roofline::serve {

namespace {

double ms_between(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); }

int ceil_div(int a, int b) { return (a + b - 1) / b; }

}  // namespace

const char* finish_name(Finish f) {
  switch (f) {
    case Finish::Eos:
    case Finish::StopWord:
      return "stop";
    case Finish::Length:
      return "length";
    case Finish::Cancelled:
      return "cancelled";
    case Finish::Error:
      return "error";
    case Finish::None:
      break;
  }
  return "";
}

// ---- Request channel ----

bool Request::poll(std::vector<Event>& out, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (events_.empty() && !done_) cv_.wait_for(lock, timeout, [&] { return !events_.empty() || done_; });
  while (!events_.empty()) {
    out.push_back(std::move(events_.front()));
    events_.pop_front();
  }
  return done_;
}

Timings Request::timings() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return timings_;
}

void Request::push(Event e) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    events_.push_back(std::move(e));
  }
  cv_.notify_all();
}

void Request::finish(const Timings& t) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    timings_ = t;
    done_ = true;
  }
  cv_.notify_all();
}

Scheduler::Scheduler(StepRunner& runner, const TokenText& text, SchedulerOptions options, Metrics* metrics)
    : runner_(runner), text_(text), options_(options), metrics_(metrics), automata_(std::make_unique<AutomatonCache>()) {
  if (options_.n_slots <= 0) fail("the number of slots must be positive (got {})", options_.n_slots);
  if (options_.queue_size < 0) fail("the queue size must not be negative (got {})", options_.queue_size);
  n_ctx_ = runner_.n_ctx();
  n_batch_ = runner_.n_batch();
  block_size_ = runner_.memory().block_size();
  n_blocks_ = runner_.memory().n_blocks();
  if (options_.max_prefill_per_step <= 0) options_.max_prefill_per_step = n_batch_;
  if (options_.drafter) check_draft_target(runner_.memory(), "speculative decoding");
  if (options_.drafter && options_.drafter->wants_hidden() && runner_.n_embd() == 0)
    fail("this model runner gives no hidden states, which the MTP drafter reads");
  slot_owner_.assign(options_.n_slots, -1);
  publish_status();
}

Scheduler::~Scheduler() {
  stop(true);
  join();
}

void Scheduler::start() {
  if (thread_.joinable()) return;
  thread_ = std::thread([this] { loop(); });
}

void Scheduler::stop(bool cancel_running) {
  std::deque<Queued> dropped;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    if (cancel_running) cancel_running_ = true;
    dropped.swap(queue_);
    ++wake_version_;
  }
  for (Queued& q : dropped) {
    Event e;
    e.finish = Finish::Cancelled;
    e.error = "the server is shutting down";
    q.request->push(std::move(e));
    q.request->finish(Timings{});
  }
  cv_.notify_all();
}

void Scheduler::join() {
  if (thread_.joinable()) thread_.join();
}

bool Scheduler::drain(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  return idle_cv_.wait_for(lock, timeout, [&] { return status_.requests_processing == 0 && queue_.empty(); });
}

void Scheduler::loop() {
  for (;;) {
    bool cancel = false;
    uint64_t seen = 0;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty() || !active_.empty() || in_flight_; });
      if (stopping_ && active_.empty() && queue_.empty() && !in_flight_) break;
      cancel = cancel_running_;
      seen = wake_version_;
    }
    if (cancel)
      for (auto& a : active_) a->request->cancel();
    if (!step()) {
      // Nothing could run (the queue waits for slots or blocks): sleep until a submit or stop changes
      // that (the timeout only rechecks cancelled queued requests).
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait_for(lock, std::chrono::milliseconds(100), [&] { return stopping_ || wake_version_ != seen; });
    }
  }
  std::lock_guard<std::mutex> lock(mutex_);
  loop_done_ = true;
  idle_cv_.notify_all();
}

int Scheduler::reservation_tokens(const GenParams& p) const {
  if (p.embedding) return 0;
  const int P = (int)p.prompt.size();
  const int room = std::max(0, n_ctx_ - P);
  if (p.max_tokens >= 0) return std::min(p.max_tokens, room);
  // No max_tokens: reserve a fair share of the pool (at least one block); beyond it the sequence
  // grows into blocks nobody has reserved, and stops with "length" if the pool runs out.
  const int share = n_blocks_ * block_size_ / options_.n_slots - P;
  return std::min(room, std::max(share, block_size_));
}

int Scheduler::blocks_for(int n_prompt, int n_gen, int n) const {
  const int total = ceil_div(n_prompt + n_gen, block_size_);
  return total + (n - 1) * (total - n_prompt / block_size_);
}

int Scheduler::available_blocks() const {
  int promised = 0;
  for (const auto& a : active_) {
    for (const Choice& c : a->choices) promised += c.promised;
    promised += a->fork_promise * (int)(a->params.n - a->choices.size());
  }
  return runner_.memory().free_blocks() - promised;
}

std::shared_ptr<Request> Scheduler::submit(GenParams p) {
  const int P = (int)p.prompt.size();
  auto reject = [&](int status, const char* code, const std::string& message) {
    if (metrics_) metrics_->on_request_rejected();
    throw SubmitError(status, code, message);
  };
  if (P == 0) reject(400, "invalid_request_error", p.embedding ? "the input is empty" : "the prompt is empty");
  if (p.embedding) {
    if (runner_.n_embd() <= 0) reject(501, "not_supported", "this model runner gives no hidden states (embeddings)");
    if (P > n_ctx_)
      reject(400, "context_length_exceeded",
             fmt::format("the input has {} tokens, more than the context size of {} tokens: shorten it or start the server with a larger -c",
                         P, n_ctx_));
    p.n = 1;
    p.max_tokens = 0;
    p.cache_prompt = false;  // its own sequence: no prefix adopted (every position must be evaluated), no KV kept
  }
  if (p.n < 1) reject(400, "invalid_request_error", "n must be at least 1");
  if (p.n > options_.n_slots)
    reject(400, "invalid_request_error", fmt::format("n = {} is more than the server's {} parallel slots", p.n, options_.n_slots));
  if (!p.embedding && P >= n_ctx_)
    reject(400, "context_length_exceeded",
           fmt::format("the prompt has {} tokens; the context is {} tokens and must leave room for at least one more", P, n_ctx_));
  for (int32_t t : p.prompt)
    if (t < 0 || t >= runner_.n_vocab()) reject(400, "invalid_request_error", fmt::format("token id {} is out of range", t));
  const int gen = reservation_tokens(p);
  const int need = blocks_for(P, gen, p.n);
  if (need > n_blocks_)
    reject(400, "context_length_exceeded",
           fmt::format("the request needs {} KV positions ({} prompt + {} generated{}), the cache holds {}", need * block_size_, P,
                       gen, p.n > 1 ? fmt::format(" x {} choices", p.n) : "", n_blocks_ * block_size_));
  auto request = std::make_shared<Request>();
  request->id_ = p.id;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) {
      if (metrics_) metrics_->on_request_rejected();
      throw SubmitError(503, "shutting_down", "the server is shutting down");
    }
    if (!device_fault_.empty()) {
      if (metrics_) metrics_->on_request_rejected();
      throw SubmitError(503, "device_fault", "the device failed and the server cannot generate: " + device_fault_);
    }
    drop_cancelled_queued();
    // The queue holds up to queue_size requests beyond those the free slots can start now.
    const int free_slots = std::max(0, options_.n_slots - status_.busy_slots);
    if ((int)queue_.size() >= options_.queue_size + free_slots) {
      if (metrics_) metrics_->on_request_rejected();
      throw SubmitError(503, "queue_full", fmt::format("the server is busy: {} requests are waiting", queue_.size()));
    }
    queue_.push_back({request, std::move(p), Clock::now()});
    status_.queue_depth = (int)queue_.size();
    ++wake_version_;
  }
  cv_.notify_all();
  return request;
}

void Scheduler::drop_cancelled_queued() {
  for (auto it = queue_.begin(); it != queue_.end();) {
    if (it->request->cancelled()) {
      Event e;
      e.finish = Finish::Cancelled;
      it->request->push(std::move(e));
      it->request->finish(Timings{});
      it = queue_.erase(it);
    } else {
      ++it;
    }
  }
}

void Scheduler::admit() {
  std::lock_guard<std::mutex> lock(mutex_);
  drop_cancelled_queued();
  SequenceMemory& mem = runner_.memory();
  while (!queue_.empty() && !cancel_running_) {
    Queued& q = queue_.front();
    const GenParams& p = q.params;
    std::vector<int> free_slots;
    for (int s = 0; s < options_.n_slots; ++s)
      if (slot_owner_[s] < 0) free_slots.push_back(s);
    if ((int)free_slots.size() < p.n) break;
    const int P = (int)p.prompt.size();
    const int gen = reservation_tokens(p);
    const int max_adopt = options_.prompt_cache && p.cache_prompt ? (P - 1) / block_size_ : 0;
    int unreferenced = 0;
    const int matched = max_adopt > 0 ? mem.match_prefix(p.prompt, max_adopt, &unreferenced) : 0;
    const int total0 = ceil_div(P + gen, block_size_);
    const int fork_promise = total0 - P / block_size_;
    const int need = (total0 - matched) + (p.n - 1) * fork_promise;
    if (available_blocks() < need + unreferenced) break;

    auto a = std::make_unique<Active>();
    a->request = q.request;
    a->params = std::move(q.params);
    a->t_submit = q.t_submit;
    a->t_admit = Clock::now();
    a->max_gen = std::max(0, std::min(a->params.max_tokens >= 0 ? a->params.max_tokens : n_ctx_, n_ctx_ - P));
    a->fork_promise = fork_promise;
    a->greedy = greedy_from_raw_logits(a->params.sampling) && a->params.logprobs < 0 && !a->params.grammar;
    a->grammar_greedy = greedy_from_raw_logits(a->params.sampling) && a->params.logprobs < 0 && a->params.grammar;
    a->choices.reserve(a->params.n);
    for (int i = 0; i < a->params.n; ++i) {
      a->slots.push_back(free_slots[i]);
      slot_owner_[free_slots[i]] = 1;
    }
    Choice c;
    c.index = 0;
    c.seq = mem.create_sequence(options_.prompt_cache && a->params.cache_prompt);
    if (matched > 0) a->n_cached = mem.adopt_prefix(c.seq, a->params.prompt, matched);
    a->n_prompt_done = a->n_cached;
    c.promised = total0 - matched;
    SamplingParams sp = a->params.sampling;
    c.sampler = std::make_unique<Sampler>(sp, runner_.n_vocab());
    if (a->params.grammar) c.grammar = std::make_unique<GrammarMatcher>(automata_->get(a->params.grammar));
    c.history = a->params.prompt;
    c.text = TextStream(a->params.stop);
    a->choices.push_back(std::move(c));
    if (a->params.embedding) a->pooler = std::make_unique<PromptPooler>(a->params.pooling, P, runner_.n_embd());
    queue_.pop_front();
    active_.push_back(std::move(a));
  }
  status_.queue_depth = (int)queue_.size();
}

void Scheduler::finish_choice(Active& a, Choice& c) {
  c.finished = true;
  c.promised = 0;
  c.drafts.clear();
  if (c.seq >= 0) {
    SequenceMemory& mem = runner_.memory();
    if (options_.drafter) options_.drafter->release(c.seq);
    if (options_.prompt_cache && a.params.cache_prompt && !a.failed) {
      const int len = c.kv_valid >= 0 ? std::min(c.kv_valid, mem.length(c.seq)) : mem.length(c.seq);
      mem.cache_blocks(c.seq, std::span<const int32_t>(c.history.data(), std::min((size_t)len, c.history.size())));
    }
    mem.free_sequence(c.seq);
    c.seq = -1;
  }
}

void Scheduler::finish_request(Active& a) {
  const Clock::time_point now = Clock::now();
  Timings t;
  t.slot = a.slots.empty() ? -1 : a.slots[0];
  for (int s : a.slots) slot_owner_[s] = -1;
  a.slots.clear();
  a.fork_promise = 0;
  t.n_prompt = (int)a.params.prompt.size();
  t.n_cached = a.n_cached;
  for (const Choice& c : a.choices) t.n_generated += c.n_generated;
  const bool started = a.t_first != Clock::time_point{};
  t.queue_ms = ms_between(a.t_submit, a.t_admit);
  t.prompt_ms = started ? ms_between(a.t_admit, a.t_first) : ms_between(a.t_admit, now);
  t.generate_ms = started && a.t_last > a.t_first ? ms_between(a.t_first, a.t_last) : 0;
  t.ttft_ms = started ? ms_between(a.t_submit, a.t_first) : 0;
  t.draft_n = a.draft_n;
  t.draft_n_accepted = a.draft_accepted;
  const bool cancelled = a.request->cancelled();
  if (metrics_) {
    metrics_->on_generated(t.n_generated, t.generate_ms / 1000.0);
    metrics_->on_request_done(ms_between(a.t_submit, now) / 1000.0, !cancelled && !a.failed);
  }
  const int evaluated = t.n_prompt - t.n_cached;
  const int after_first = t.n_generated - (int)a.choices.size();
  if (a.params.embedding)
    log_info("request {}: embedding of {} tokens (pooling {}), queued {:.1f} ms, {:.1f} ms, {:.1f} tok/s, {}", a.params.id, t.n_prompt,
             pooling_name(a.params.pooling), t.queue_ms, t.prompt_ms, t.prompt_ms > 0 ? evaluated * 1000.0 / t.prompt_ms : 0.0,
             a.failed ? "error" : cancelled ? "cancelled" : "ok");
  else
    log_info("request {}: prompt {} tokens ({} cached), generated {}, ttft {:.1f} ms, prefill {:.1f} tok/s, decode {:.1f} tok/s{}, {}",
           a.params.id, t.n_prompt, t.n_cached, t.n_generated, t.ttft_ms, t.prompt_ms > 0 ? evaluated * 1000.0 / t.prompt_ms : 0.0,
           t.generate_ms > 0 && after_first > 0 ? after_first * 1000.0 / t.generate_ms : 0.0,
           options_.drafter ? fmt::format(", draft acceptance {}/{} ({:.0f}%)", t.draft_n_accepted, t.draft_n,
                                          t.draft_n > 0 ? 100.0 * t.draft_n_accepted / t.draft_n : 0.0)
                            : std::string(),
           a.failed ? "error" : cancelled ? "cancelled" : "ok");
  a.request->finish(t);
}

void Scheduler::finish_embedding(Active& a, Clock::time_point now) {
  a.prefilling = false;
  a.t_first = a.t_last = now;
  if (metrics_)
    metrics_->on_prompt((int)a.params.prompt.size() - a.n_cached, std::chrono::duration<double>(now - a.t_admit).count(), a.n_cached);
  Event e;
  e.finish = Finish::Eos;
  e.embedding = a.pooler->result(a.params.embd_normalize);
  a.request->push(std::move(e));
  finish_choice(a, a.choices[0]);
}

void Scheduler::take_token(Active& a, Choice& c, int32_t greedy, const float* logits, Clock::time_point now) {
  const GenParams& p = a.params;
  int32_t tok;
  if (c.grammar) {
    // A step argmax of a constrained row is the best token its mask allows (grammar_greedy rows).
    if (!logits || greedy >= 0) tok = greedy >= 0 && c.grammar->token_allowed(vocab(), greedy) ? greedy : -1;
    else if (c.presampled != kNotSampled) tok = std::exchange(c.presampled, kNotSampled);
    else tok = sample_with_grammar(*c.sampler, *c.grammar, vocab(), logits, c.history, masked_logits_);
    if (tok < 0) {  // the model gives every token the grammar allows no chance at all
      emit_pending(&a);
      Event e;
      e.choice = c.index;
      e.text = c.text.flush();
      e.finish = Finish::Error;
      e.error = c.grammar->limited()
                    ? fmt::format("no token the grammar allows could be taken: the grammar is too ambiguous (more than {} parses "
                                  "open at once) and continuations past that were cut",
                                  GrammarAutomaton::kMaxStacks)
                    : "no token the grammar allows has a finite logit";
      a.request->push(std::move(e));
      a.failed = true;
      finish_choice(a, c);
      return;
    }
    c.grammar->accept_token(vocab(), tok);
  } else if (greedy >= 0) {
    tok = greedy;
  } else {
    tok = c.presampled != kNotSampled ? std::exchange(c.presampled, kNotSampled) : c.sampler->sample(logits, c.history).token;
  }
  Emission m;
  m.a = &a;
  m.choice = c.index;
  m.token = tok;
  if (p.logprobs >= 0) {
    std::optional<TokenLogprob> pre = std::exchange(c.prelogprobs, std::nullopt);
    m.logprobs.push_back(pre && pre->token == tok ? std::move(*pre) : compute_logprobs(logits, runner_.n_vocab(), tok, p.logprobs));
  }
  c.history.push_back(tok);
  c.n_generated++;
  if (c.n_generated > 1 && metrics_) metrics_->on_inter_token(std::chrono::duration<double>(now - c.t_last).count());
  c.t_last = now;
  a.t_last = now;
  c.pending = tok;
  if (text_.is_eog(tok) && !p.ignore_eos) m.finish = Finish::Eos;
  else if (c.grammar && !text_.is_eog(tok) && !c.grammar->can_continue()) m.finish = Finish::Eos, m.grammar_end = true;
  else if (c.n_generated >= a.max_gen) m.finish = Finish::Length;
  // Without stop strings the text cannot end the choice: it is made while the next step runs. With
  // them it decides whether the choice goes on, so it is made now.
  Finish f = m.finish;
  if (p.stop.empty()) pending_.push_back(std::move(m));
  else f = emit(m);
  if (f != Finish::None) finish_choice(a, c);
}

Finish Scheduler::emit(Emission& m) {
  Choice& c = m.a->choices[m.choice];
  Event e;
  e.choice = m.choice;
  e.tokens.push_back(m.token);
  e.logprobs = std::move(m.logprobs);
  if (m.finish == Finish::Eos && !m.grammar_end) {
    e.text = c.text.flush();
    e.finish = Finish::Eos;
  } else {
    TextStream::Result r = c.text.push(text_.piece(m.token));
    e.text = std::move(r.text);
    if (r.stopped) {
      e.finish = Finish::StopWord;
      e.stop_word = r.stop_word;
    } else if (m.finish == Finish::Length || m.grammar_end) {
      e.text += c.text.flush();
      e.finish = m.finish;
    }
  }
  const Finish f = e.finish;
  m.a->request->push(std::move(e));
  return f;
}

void Scheduler::emit_pending(const Active* only) {
  if (pending_.empty()) return;
  std::vector<Emission> keep;
  for (Emission& m : pending_) {
    if (only && m.a != only) keep.push_back(std::move(m));
    else emit(m);
  }
  pending_.swap(keep);
}

void Scheduler::start_decoding(Active& a, int32_t greedy, const float* logits, Clock::time_point now) {
  a.prefilling = false;
  a.t_first = now;
  if (metrics_) {
    metrics_->on_first_token(std::chrono::duration<double>(now - a.t_submit).count());
    metrics_->on_prompt((int)a.params.prompt.size() - a.n_cached, std::chrono::duration<double>(now - a.t_admit).count(), a.n_cached);
  }
  if (a.max_gen == 0) {  // prompt only (n_predict 0)
    for (int i = 0; i < a.params.n; ++i) {
      Event e;
      e.choice = i;
      e.finish = Finish::Length;
      a.request->push(std::move(e));
    }
    finish_choice(a, a.choices[0]);
    return;
  }
  const int P = (int)a.params.prompt.size();
  const int first_seq = a.choices[0].seq;
  for (int i = 1; i < a.params.n; ++i) {
    Choice c;
    c.index = i;
    c.seq = runner_.memory().fork_sequence(first_seq);
    c.promised = a.fork_promise - (P % block_size_ != 0 ? 1 : 0);
    SamplingParams sp = a.params.sampling;
    if (sp.seed != 0xFFFFFFFFu) sp.seed += (uint64_t)i;  // distinct, reproducible choices
    c.sampler = std::make_unique<Sampler>(sp, runner_.n_vocab());
    if (a.params.grammar) c.grammar = std::make_unique<GrammarMatcher>(automata_->get(a.params.grammar));
    c.history = a.params.prompt;
    c.text = TextStream(a.params.stop);
    a.choices.push_back(std::move(c));
  }
  a.fork_promise = 0;
  for (Choice& c : a.choices) take_token(a, c, greedy, logits, now);
}

const TokenVocab& Scheduler::vocab() {
  if (!vocab_) {
    const int n = runner_.n_vocab();
    const int n_text = std::min(n, text_.n_tokens());
    std::vector<std::string> pieces((size_t)n);
    std::vector<bool> eog((size_t)n, false);
    for (int t = 0; t < n_text; ++t) {
      eog[(size_t)t] = text_.is_eog(t);
      if (!eog[(size_t)t]) pieces[(size_t)t] = text_.piece(t);
    }
    vocab_ = std::make_unique<TokenVocab>(pieces, eog);
    log_info("constrained decoding: vocabulary trie of {} tokens, {} nodes", n, vocab_->n_nodes());
  }
  return *vocab_;
}

void Scheduler::fail_all(const std::string& message) {
  emit_pending(nullptr);
  for (auto& a : active_) {
    a->failed = true;
    for (Choice& c : a->choices) {
      if (c.finished) continue;
      Event e;
      e.choice = c.index;
      e.finish = Finish::Error;
      e.error = message;
      a->request->push(std::move(e));
      finish_choice(*a, c);
    }
    finish_request(*a);
  }
  active_.clear();
}

void Scheduler::step_failed(const std::exception& e) {
  log_error("forward step failed: {}", e.what());
  const bool sticky = dynamic_cast<const DeviceFault*>(&e) != nullptr;
  const bool ours = dynamic_cast<const InternalError*>(&e) != nullptr;
  // The fault is marked before the requests in flight are answered, so a client that reads its
  // error and then asks /health (or submits again) already sees the device as failed.
  if (sticky) mark_device_fault(e.what());
  fail_all(fmt::format("{}: {}", sticky ? "the device failed" : ours ? "generation failed" : "the forward step failed", e.what()));
}

// Waiting requests cannot run either: they fail now, and later ones are refused at submit().
void Scheduler::mark_device_fault(const std::string& message) {
  std::deque<Queued> dropped;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (device_fault_.empty()) device_fault_ = message;
    dropped.swap(queue_);
    status_.queue_depth = 0;
  }
  for (Queued& q : dropped) {
    Event e;
    e.finish = Finish::Error;
    e.error = "the device failed: " + message;
    q.request->push(std::move(e));
    q.request->finish(Timings{});
  }
}

std::string Scheduler::device_fault() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return device_fault_;
}

void Scheduler::complete_step() {
  in_flight_ = false;
  const StepOutput* out = nullptr;
  try {
    out = &runner_.finish();
  } catch (const std::exception& e) {
    step_failed(e);
    return;
  }
  steps_++;
  const Clock::time_point now = Clock::now();
  SequenceMemory& mem = runner_.memory();
  for (auto& [a, chunk] : prefill_chunks_) {
    a->n_prompt_done += chunk;
    // Sliding-window models keep a window snapshot only where the prompt ends (at its last block boundary
    // before the final token, which a repeated prompt can resume from); recurrent ones at every boundary.
    const int P = (int)a->params.prompt.size();
    if (options_.prompt_cache && a->params.cache_prompt)
      mem.cache_blocks(a->choices[0].seq, std::span<const int32_t>(a->params.prompt.data(), (size_t)a->n_prompt_done),
                       a->n_prompt_done == P ? P - 1 : 0);
  }
  ROOFLINE_CHECK(out->argmax.size() == refs_.size() && out->logits.size() == refs_.size(), "step output rows mismatch");
  ROOFLINE_CHECK(out->hidden.size() == hidden_refs_.size(), "step hidden rows mismatch");
  for (size_t r = 0; r < hidden_refs_.size(); ++r) {
    const HiddenRef& h = hidden_refs_[r];
    if (h.choice == kPooled) h.a->pooler->add(h.pos, out->hidden[r]);
    else if (h.choice == kPrompt) options_.drafter->add_hidden(h.a->choices[0].seq, h.pos, out->hidden[r], 1);
  }
  for (auto& [a, chunk] : prefill_chunks_)
    if (a->params.embedding && a->n_prompt_done == (int)a->params.prompt.size() && !a->request->cancelled()) finish_embedding(*a, now);
  presample_rows(*out);
  for (size_t r = 0; r < refs_.size();) {
    Active& a = *refs_[r].a;
    if (refs_[r].choice < 0) {
      start_decoding(a, out->argmax[r], out->logits[r], now);
    } else {
      Choice& c = a.choices[refs_[r].choice];
      if (!c.drafts.empty()) {
        r = take_drafted(a, c, *out, r, now);
        continue;
      }
      if (!c.finished) take_token(a, c, out->argmax[r], out->logits[r], now);
    }
    ++r;
  }
  // The drafter's hidden states of the positions that stay: every token but the pending one (a rejected
  // draft's position is the new pending token's or past it).
  for (size_t r = 0; r < hidden_refs_.size(); ++r) {
    const HiddenRef& h = hidden_refs_[r];
    if (h.choice < 0) continue;
    const Choice& c = h.a->choices[h.choice];
    if (!c.finished && h.pos + 1 < (int)c.history.size()) options_.drafter->add_hidden(c.seq, h.pos, out->hidden[r], 1);
  }
  step_rows_done_ = (int)rows_.size();
}

// The sampled rows of a decode step drawn together, one row per thread of the sampling pool: the
// constrained ones (16 streams under a JSON schema: 16 masked picks at once) and the plain ones (a draw
// reads the whole vocabulary: ~0.1 ms a row of 152k, 6 ms a step of 64 rows on one thread). Each choice
// has a sampler of its own, drawn from once for the row either way, so the tokens are the same.
void Scheduler::presample_rows(const StepOutput& out) {
  std::vector<GrammarRow> rows;
  std::vector<Choice*> owners, plain;
  std::vector<const float*> plain_logits;
  std::vector<int> owner_k, plain_k;  // the log-probabilities each asks for (-1: none)
  for (size_t r = 0; r < refs_.size(); ++r) {
    if (refs_[r].choice < 0) continue;
    Choice& c = refs_[r].a->choices[refs_[r].choice];
    // A choice verifying drafts picks its rows in turn (each pick moves its grammar): take_drafted.
    if (c.finished || !out.logits[r] || out.argmax[r] >= 0 || !c.drafts.empty()) continue;
    if (c.grammar) {
      rows.push_back({c.sampler.get(), c.grammar.get(), out.logits[r], &c.history, -1});
      owners.push_back(&c);
      owner_k.push_back(refs_[r].a->params.logprobs);
    } else {
      plain.push_back(&c);
      plain_logits.push_back(out.logits[r]);
      plain_k.push_back(refs_[r].a->params.logprobs);
    }
  }
  if (rows.size() < 2 && plain.size() < 2) return;  // one row of a kind is drawn in take_token
  if (!sample_pool_) sample_pool_ = std::make_unique<ThreadPool>(std::min(8, ThreadPool::default_thread_count()));
  // A row's log-probabilities (a pass over the vocabulary) are taken with its draw, on the pool too.
  const int n_vocab = runner_.n_vocab();
  const auto with_logprobs = [n_vocab](Choice& c, const float* logits, int k) {
    if (k >= 0 && c.presampled >= 0) c.prelogprobs = compute_logprobs(logits, n_vocab, c.presampled, k);
  };
  if (rows.size() >= 2) {
    sample_rows_with_grammar(rows, vocab(), sample_pool_.get());
    for (size_t i = 0; i < rows.size(); ++i) owners[i]->presampled = rows[i].token;
    if (std::any_of(owner_k.begin(), owner_k.end(), [](int k) { return k >= 0; }))
      sample_pool_->parallel_for(rows.size(), [&](size_t i) { with_logprobs(*owners[i], rows[i].logits, owner_k[i]); });
  }
  if (plain.size() >= 2)
    sample_pool_->parallel_for(plain.size(), [&](size_t i) {
      plain[i]->presampled = plain[i]->sampler->sample(plain_logits[i], plain[i]->history).token;
      with_logprobs(*plain[i], plain_logits[i], plain_k[i]);
    });
}

// A failed internal check (or anything unexpected) while stepping must not end the process: the
// requests the scheduler holds fail with the message (a 500 to their clients) and it goes on.
bool Scheduler::step() {
  try {
    return step_once();
  } catch (const std::exception& e) {
    recover(e);
    return true;
  }
}

void Scheduler::recover(const std::exception& e) {
  if (in_flight_) {
    in_flight_ = false;
    try {
      runner_.finish();
    } catch (const std::exception&) {
      // Its failure is the one being handled, or comes of it.
    }
  }
  try {
    step_failed(e);
  } catch (const std::exception& again) {
    // The requests' own state is broken: end them as they are and take no more (503 from now on).
    log_error("the scheduler cannot recover from '{}': {}", e.what(), again.what());
    mark_device_fault(fmt::format("the scheduler failed: {}", again.what()));
    for (auto& a : active_) {
      Event ev;
      ev.finish = Finish::Error;
      ev.error = fmt::format("internal error: {}", e.what());
      a->request->push(std::move(ev));
      a->request->finish(Timings{});
    }
    active_.clear();
    pending_.clear();
  }
  publish_status();
}

bool Scheduler::step_once() {
  SequenceMemory& mem = runner_.memory();
  // The step in flight: its tokens are picked now; their text and events are made once the next
  // step is launched, while it runs.
  if (in_flight_) complete_step();
  // Cancelled requests (client gone, stop()) release their slots and blocks.
  for (size_t i = 0; i < active_.size();) {
    Active& a = *active_[i];
    if (a.request->cancelled()) {
      emit_pending(&a);
      for (Choice& c : a.choices) {
        if (c.finished) continue;
        Event e;
        e.choice = c.index;
        e.finish = Finish::Cancelled;
        a.request->push(std::move(e));
        finish_choice(a, c);
      }
      finish_request(a);
      active_.erase(active_.begin() + (long)i);
    } else {
      ++i;
    }
  }
  admit();
  if (active_.empty()) {
    publish_status();
    return false;
  }

  // Build the batch: one decode row per running sequence (rotating when they exceed the batch),
  // then prompt chunks, oldest request first.
  rows_.clear();
  refs_.clear();
  prefill_chunks_.clear();
  hidden_refs_.clear();
  int budget = n_batch_;
  int overflow = 0;  // blocks taken beyond reservations this step
  const int n_active = (int)active_.size();
  // While prompts wait, decode rows leave part of the batch to them, so they are never starved.
  const bool prefill_pending = std::any_of(active_.begin(), active_.end(), [](const auto& a) { return a->prefilling; });
  int decode_budget = prefill_pending ? std::max(1, n_batch_ - std::max(1, n_batch_ / 8)) : n_batch_;
  // A drafter that reads the target's hidden states (the MTP head) gets those of every prompt and decode row.
  const bool drafter_hidden = options_.drafter && options_.drafter->wants_hidden();
  if (options_.drafter) {
    // Every generating choice keeps its one row; drafts share what the decode budget leaves.
    int n_decoding = 0;
    for (auto& a : active_)
      if (!a->prefilling)
        for (const Choice& c : a->choices) n_decoding += c.finished ? 0 : 1 + replay_rows(c);
    draft_choices(decode_budget - n_decoding);
  }
  for (int k = 0; k < n_active && decode_budget > 0; ++k) {
    Active& a = *active_[(decode_rotation_ + k) % n_active];
    if (a.prefilling) continue;
    for (Choice& c : a.choices) {
      if (c.finished || decode_budget == 0) {
        c.drafts.clear();
        continue;
      }
      // Accepted tokens fed again before the pending one (a recurrent target after rejected drafts).
      const int n_replay = replay_rows(c);
      if (1 + n_replay > decode_budget) {
        c.drafts.clear();
        continue;
      }
      if ((int)c.drafts.size() > decode_budget - 1 - n_replay) c.drafts.resize((size_t)(decode_budget - 1 - n_replay));
      int need = mem.blocks_needed(c.seq, n_replay + 1 + (int)c.drafts.size());
      // Drafts only take blocks that are free: without them the choice steps without drafts.
      if (!c.drafts.empty() && need > c.promised && available_blocks() - overflow < need - c.promised) {
        c.drafts.clear();
        need = mem.blocks_needed(c.seq, n_replay + 1);
      }
      c.step_extra = 0;
      if (need > 0) {
        const int from_promise = std::min(need, c.promised);
        const int extra = need - from_promise;
        if (extra > 0 && available_blocks() - overflow < extra) {
          log_warn("request {}: the KV cache is full; stopping choice {} at {} tokens", a.params.id, c.index, c.n_generated);
          emit_pending(&a);  // its last token's text comes before the end
          Event e;
          e.choice = c.index;
          e.text = c.text.flush();
          e.finish = Finish::Length;
          a.request->push(std::move(e));
          finish_choice(a, c);
          continue;
        }
        c.promised -= from_promise;
        overflow += extra;
        c.step_extra = extra;
      }
      const int len = mem.length(c.seq);
      for (int i = 0; i < n_replay; ++i) rows_.push_back({c.seq, c.history[(size_t)(len + i)], false});
      // Drafts that may be rejected: a recurrent state is kept to go back to.
      if (!c.drafts.empty()) mem.keep_state(c.seq);
      const int pos = len + n_replay;  // the pending token's
      if (a.grammar_greedy && c.grammar) {
        // Greedy under a grammar: the step picks the best token its mask allows where the logits are.
        c.allowed = c.grammar->mask(vocab());
        rows_.push_back({c.seq, c.pending, true, true, drafter_hidden, c.allowed.data()});
      } else {
        rows_.push_back({c.seq, c.pending, true, a.greedy, drafter_hidden});
      }
      refs_.push_back({&a, c.index});
      if (drafter_hidden) hidden_refs_.push_back({&a, c.index, pos});
      for (size_t i = 0; i < c.drafts.size(); ++i) {
        rows_.push_back({c.seq, c.drafts[i], true, a.greedy, drafter_hidden});
        refs_.push_back({&a, c.index});
        if (drafter_hidden) hidden_refs_.push_back({&a, c.index, pos + 1 + (int)i});
      }
      budget -= n_replay + 1 + (int)c.drafts.size();
      decode_budget -= n_replay + 1 + (int)c.drafts.size();
    }
  }
  decode_rotation_++;
  int prefill_budget = std::min(budget, options_.max_prefill_per_step);
  for (auto& ap : active_) {
    if (prefill_budget <= 0) break;
    Active& a = *ap;
    if (!a.prefilling) continue;
    Choice& c = a.choices[0];
    const int P = (int)a.params.prompt.size();
    int chunk = std::min(P - a.n_prompt_done, prefill_budget);
    // Models with recurrent layers keep a state snapshot where a step ends on a block boundary: prompt
    // chunks end on one, and the prompt's last boundary before its final token ends a chunk, so a later
    // prompt with the same prefix can resume from there.
    const int interval = mem.snapshot_interval();
    if (interval > 0 && options_.prompt_cache && a.params.cache_prompt) {
      const int end = a.n_prompt_done + chunk;
      const int last = (P - 1) / interval * interval;
      if (end == P && a.n_prompt_done < last) chunk = last - a.n_prompt_done;
      else if (end < P && end / interval * interval > a.n_prompt_done) chunk = end / interval * interval - a.n_prompt_done;
    }
    const int need = mem.blocks_needed(c.seq, chunk);
    c.promised = std::max(0, c.promised - need);
    for (int i = 0; i < chunk; ++i) {
      const int pos = a.n_prompt_done + i;
      if (a.pooler) {  // embeddings: the final hidden states pooling takes, no logits
        const bool hidden = a.pooler->wants(pos);
        rows_.push_back({c.seq, a.params.prompt[pos], false, false, hidden});
        if (hidden) hidden_refs_.push_back({&a, kPooled, pos});
        continue;
      }
      const bool last = pos + 1 == P;
      rows_.push_back({c.seq, a.params.prompt[pos], last, last && a.greedy, drafter_hidden});
      if (drafter_hidden) hidden_refs_.push_back({&a, kPrompt, pos});
      if (last) refs_.push_back({&a, -1});
    }
    prefill_chunks_.push_back({&a, chunk});
    prefill_budget -= chunk;
  }

  if (!rows_.empty()) {
    try {
      runner_.launch(rows_);
      in_flight_ = true;
    } catch (const std::exception& e) {
      step_failed(e);
      publish_status();
      return true;
    }
  }
  // While it runs: the text and events of the tokens picked above, the metrics, and the requests
  // whose choices have all ended (their last events are out).
  emit_pending(nullptr);
  if (metrics_ && step_rows_done_ > 0) {
    int busy = 0;
    for (auto& a : active_) busy += (int)a->choices.size();
    metrics_->on_step(step_rows_done_, busy);
    int high = 0;
    for (auto& a : active_)
      for (const Choice& c : a->choices)
        if (c.seq >= 0) high = std::max(high, mem.length(c.seq));
    metrics_->on_context_high_water(high);
  }
  step_rows_done_ = 0;
  for (size_t i = 0; i < active_.size();) {
    Active& a = *active_[i];
    const bool all_done = !a.prefilling && std::all_of(a.choices.begin(), a.choices.end(), [](const Choice& c) { return c.finished; });
    if (all_done) {
      finish_request(a);
      active_.erase(active_.begin() + (long)i);
    } else {
      ++i;
    }
  }
  publish_status();
  return in_flight_ || !active_.empty();
}

void Scheduler::publish_status() {
  const SequenceMemory& mem = runner_.memory();
  SchedulerStatus s;
  s.n_slots = options_.n_slots;
  s.kv_blocks_total = mem.n_blocks();
  s.kv_blocks_used = mem.used_blocks();
  s.kv_blocks_cached = mem.cached_blocks();
  s.kv_block_size = mem.block_size();
  s.requests_processing = (int)active_.size();
  s.steps = steps_;
  for (int i = 0; i < options_.n_slots; ++i) {
    SlotStatus ss;
    ss.id = i;
    s.slots.push_back(ss);
  }
  for (const auto& a : active_) {
    for (size_t k = 0; k < a->slots.size(); ++k) {
      SlotStatus& ss = s.slots[a->slots[k]];
      ss.busy = true;
      ss.request = a->params.id;
      ss.n_prompt = (int)a->params.prompt.size();
      ss.prefilling = a->prefilling;
      ss.n_generated = k < a->choices.size() ? a->choices[k].n_generated : 0;
    }
  }
  for (const SlotStatus& ss : s.slots) s.busy_slots += ss.busy ? 1 : 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    s.queue_depth = (int)queue_.size();
    status_ = std::move(s);
  }
  idle_cv_.notify_all();
}

SchedulerStatus Scheduler::status() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return status_;
}

}  // namespace roofline::serve
