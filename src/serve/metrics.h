// Server metrics in the Prometheus text format (0.0.4): llama-server's llamacpp: counters and gauges,
// plus KV-cache use, queue depth and histograms of time to first token, inter-token latency and
// request latency. The scheduler records; /metrics renders. Thread-safe.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace roofline::serve {

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double value);
  // Appends `# HELP`, `# TYPE` and the _bucket{le=...}/_sum/_count lines.
  void render(std::string& out, const std::string& name, const std::string& help) const;
  uint64_t count() const { return count_; }
  double sum() const { return sum_; }

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative); the last is +Inf
  uint64_t count_ = 0;
  double sum_ = 0;
};

// Gauges read from the scheduler when /metrics is asked.
struct LiveGauges {
  int requests_processing = 0;
  int requests_deferred = 0;  // waiting in the queue
  int n_slots = 0;
  int busy_slots = 0;
  int kv_blocks_total = 0;
  int kv_blocks_used = 0;    // held by live sequences
  int kv_blocks_cached = 0;  // indexed for prompt caching
  int kv_block_size = 0;
};

class Metrics {
 public:
  Metrics();

  void on_step(int n_rows, int n_busy_sequences);
  void on_prompt(int n_tokens, double seconds, int n_cached);  // prompt evaluated for one request
  void on_generated(int n_tokens, double seconds);             // tokens of one request after the first
  void on_first_token(double ttft_seconds);
  void on_inter_token(double seconds);
  void on_request_done(double e2e_seconds, bool ok);
  void on_request_rejected();
  void on_context_high_water(int n_tokens);
  // Speculative decoding: one choice's round verified n_drafted draft tokens, n_accepted of them accepted.
  void on_draft(int n_drafted, int n_accepted);

  std::string render(const LiveGauges& live) const;

 private:
  mutable std::mutex mutex_;
  uint64_t prompt_tokens_ = 0, cached_tokens_ = 0, predicted_tokens_ = 0, n_decode_ = 0, busy_sum_ = 0;
  double prompt_seconds_ = 0, predicted_seconds_ = 0;
  uint64_t requests_ok_ = 0, requests_failed_ = 0, requests_rejected_ = 0;
  int n_tokens_max_ = 0;
  uint64_t drafts_ = 0, draft_tokens_ = 0, draft_accepted_ = 0;
  std::vector<uint64_t> accepted_at_;  // per draft position: drafts accepted at least that far
  Histogram ttft_, itl_, e2e_;
};

// Formats a metric value the way Prometheus clients do (integers without a fraction, +Inf, NaN).
std::string prometheus_number(double v);

}  // namespace roofline::serve
