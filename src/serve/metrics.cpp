// Prometheus text rendering of the server's counters, gauges and histograms.
#include "serve/metrics.h"

#include <fmt/format.h>

#include <cmath>

namespace roofline::serve {

std::string prometheus_number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::floor(v) && std::fabs(v) < 1e15) return fmt::format("{}", (long long)v);
  return fmt::format("{:.9g}", v);
}

Histogram::Histogram(std::vector<double> upper_bounds) : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  size_t i = 0;
  while (i < bounds_.size() && value > bounds_[i]) ++i;
  counts_[i]++;
  count_++;
  sum_ += value;
}

void Histogram::render(std::string& out, const std::string& name, const std::string& help) const {
  out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, prometheus_number(bounds_[i]), cum);
  }
  cum += counts_.back();
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n", name, cum);
  out += fmt::format("{}_sum {}\n{}_count {}\n", name, prometheus_number(sum_), name, count_);
}

Metrics::Metrics()
    : ttft_({0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 10, 20, 40, 80}),
      itl_({0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1, 2.5, 5}),
      e2e_({0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320, 640}) {}

void Metrics::on_step(int n_rows, int n_busy) {
  std::lock_guard<std::mutex> lock(mutex_);
  n_decode_++;
  busy_sum_ += (uint64_t)n_busy;
  (void)n_rows;
}

void Metrics::on_prompt(int n_tokens, double seconds, int n_cached) {
  std::lock_guard<std::mutex> lock(mutex_);
  prompt_tokens_ += (uint64_t)n_tokens;
  cached_tokens_ += (uint64_t)n_cached;
  prompt_seconds_ += seconds;
}

void Metrics::on_generated(int n_tokens, double seconds) {
  std::lock_guard<std::mutex> lock(mutex_);
  predicted_tokens_ += (uint64_t)n_tokens;
  predicted_seconds_ += seconds;
}

void Metrics::on_first_token(double s) {
  std::lock_guard<std::mutex> lock(mutex_);
  ttft_.observe(s);
}

void Metrics::on_inter_token(double s) {
  std::lock_guard<std::mutex> lock(mutex_);
  itl_.observe(s);
}

void Metrics::on_request_done(double e2e, bool ok) {
  std::lock_guard<std::mutex> lock(mutex_);
  e2e_.observe(e2e);
  (ok ? requests_ok_ : requests_failed_)++;
}

void Metrics::on_request_rejected() {
  std::lock_guard<std::mutex> lock(mutex_);
  requests_rejected_++;
}

void Metrics::on_context_high_water(int n_tokens) {
  std::lock_guard<std::mutex> lock(mutex_);
  n_tokens_max_ = std::max(n_tokens_max_, n_tokens);
}

void Metrics::on_draft(int n_drafted, int n_accepted) {
  if (n_drafted <= 0) return;
  std::lock_guard<std::mutex> lock(mutex_);
  drafts_++;
  draft_tokens_ += (uint64_t)n_drafted;
  draft_accepted_ += (uint64_t)n_accepted;
  if ((int)accepted_at_.size() < n_accepted) accepted_at_.resize((size_t)n_accepted, 0);
  for (int k = 0; k < n_accepted; ++k) accepted_at_[(size_t)k]++;
}

std::string Metrics::render(const LiveGauges& g) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::string out;
  auto metric = [&](const char* name, const char* type, const char* help, double value) {
    out += fmt::format("# HELP llamacpp:{} {}\n# TYPE llamacpp:{} {}\nllamacpp:{} {}\n", name, help, name, type, name,
                       prometheus_number(value));
  };
  metric("prompt_tokens_total", "counter", "Number of prompt tokens processed.", (double)prompt_tokens_);
  metric("prompt_seconds_total", "counter", "Prompt process time", prompt_seconds_);
  metric("tokens_predicted_total", "counter", "Number of generation tokens processed.", (double)predicted_tokens_);
  metric("tokens_predicted_seconds_total", "counter", "Predict process time", predicted_seconds_);
  metric("n_decode_total", "counter", "Total number of llama_decode() calls", (double)n_decode_);
  metric("n_tokens_max", "counter", "Largest observed n_tokens.", (double)n_tokens_max_);
  metric("spec_decode_num_draft_tokens_total", "counter", "Number of draft tokens the target model verified.", (double)draft_tokens_);
  metric("spec_decode_num_accepted_tokens_total", "counter", "Number of draft tokens the target model accepted.",
         (double)draft_accepted_);
  metric("spec_decode_num_drafts_total", "counter", "Number of drafts (rounds with at least one draft token).", (double)drafts_);
  if (!accepted_at_.empty()) {
    const char* name = "spec_decode_num_accepted_tokens_per_pos_total";
    out += fmt::format("# HELP llamacpp:{} Number of accepted draft tokens at each draft position.\n# TYPE llamacpp:{} counter\n", name, name);
    for (size_t k = 0; k < accepted_at_.size(); ++k)
      out += fmt::format("llamacpp:{}{{position=\"{}\"}} {}\n", name, k, accepted_at_[k]);
  }
  metric("prompt_tokens_seconds", "gauge", "Average prompt throughput in tokens/s.",
         prompt_seconds_ > 0 ? prompt_tokens_ / prompt_seconds_ : 0.0);
  metric("predicted_tokens_seconds", "gauge", "Average generation throughput in tokens/s.",
         predicted_seconds_ > 0 ? predicted_tokens_ / predicted_seconds_ : 0.0);
  metric("n_busy_slots_per_decode", "gauge", "Average number of busy slots per llama_decode() call",
         n_decode_ > 0 ? (double)busy_sum_ / (double)n_decode_ : 0.0);
  metric("requests_processing", "gauge", "Number of requests processing.", g.requests_processing);
  metric("requests_deferred", "gauge", "Number of requests deferred.", g.requests_deferred);
  // roofline's additions (same prefix, so one scrape config covers them).
  metric("queue_depth", "gauge", "Requests waiting for a slot or KV blocks.", g.requests_deferred);
  metric("slots_total", "gauge", "Parallel slots (-np).", g.n_slots);
  metric("slots_busy", "gauge", "Slots generating or prefilling.", g.busy_slots);
  metric("kv_cache_blocks_total", "gauge", "KV cache blocks in the shared pool.", g.kv_blocks_total);
  metric("kv_cache_blocks_used", "gauge", "KV cache blocks held by live sequences.", g.kv_blocks_used);
  metric("kv_cache_blocks_cached", "gauge", "KV cache blocks indexed for prompt caching.", g.kv_blocks_cached);
  metric("kv_cache_tokens_total", "gauge", "KV cache capacity in tokens.", (double)g.kv_blocks_total * g.kv_block_size);
  metric("kv_cache_usage_ratio", "gauge", "KV cache usage by live sequences (0-1).",
         g.kv_blocks_total > 0 ? (double)g.kv_blocks_used / g.kv_blocks_total : 0.0);
  metric("prompt_tokens_cached_total", "counter", "Prompt tokens reused from the prompt cache.", (double)cached_tokens_);
  metric("requests_success_total", "counter", "Requests that finished normally.", (double)requests_ok_);
  metric("requests_failed_total", "counter", "Requests cancelled or failed after admission.", (double)requests_failed_);
  metric("requests_rejected_total", "counter", "Requests refused (queue full, never fits, shutting down).",
         (double)requests_rejected_);
  ttft_.render(out, "llamacpp:time_to_first_token_seconds", "Time from request arrival to its first generated token.");
  itl_.render(out, "llamacpp:inter_token_latency_seconds", "Time between consecutive generated tokens of a sequence.");
  e2e_.render(out, "llamacpp:request_latency_seconds", "Time from request arrival to its last token.");
  return out;
}

}  // namespace roofline::serve
