// Host time the server spends per generated token outside the forward step: the scheduler's step()
// over a runner whose forward pass costs nothing and returns a real-sized logits row (151936 floats,
// Qwen3's vocabulary), for one greedy stream (the single-stream decode loop) and for 16 and 64 streams
// (greedy with the device's argmax, or sampled), and how much of it is on the critical path between two
// steps; plus its parts: the sampler (greedy and sampled) and the log-probabilities over a full row, and a fresh
// logits buffer per step.
// Build: ninja -C build serve_step_bench; run build/serve_step_bench.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstring>
#include <vector>

#include "engine/sampler.h"
#include "serve/scheduler.h"

namespace roofline::serve {
namespace {

constexpr int kVocab = 151936;

std::vector<float> make_row(int n_vocab, int32_t winner) {
  std::vector<float> row((size_t)n_vocab);
  uint64_t x = 88172645463325252ull;
  for (float& v : row) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    v = (float)(x % 20000) / 1000.0f - 10.0f;
  }
  row[(size_t)winner] = 20.0f;
  return row;
}

// A runner whose step is free: KV bookkeeping as the engine does it (a real SequenceMemory whose device
// copies cost nothing), then a fixed row per wanted logit in a reused buffer (as Engine::step returns
// them), with greedy rows picked on the host, or with `device_argmax` left without logits (as from a
// backend that picks them). It measures the host time on the critical path, from the end of a step's
// device work (finish() entered: what comes after is the copy of the logits and the host argmax) to the
// next step's launch() done.
class FreeRunner final : public StepRunner, private SequenceMemory::Device {
 public:
  explicit FreeRunner(bool device_argmax) : memory_(memory_options(), this), row_(make_row(kVocab, 1234)), device_argmax_(device_argmax) {}
  int n_vocab() const override { return kVocab; }
  int n_batch() const override { return 512; }
  int n_ctx() const override { return 8192 * 32; }
  SequenceMemory& memory() override { return memory_; }
  std::vector<float> decode(const std::vector<BatchRow>&) override { return {}; }
  void launch(const std::vector<BatchRow>& rows) override {
    for (size_t r = 0; r < rows.size();) {
      size_t e = r;
      while (e < rows.size() && rows[e].seq == rows[r].seq) ++e;
      if (!memory_.reserve(rows[r].seq, (int)(e - r))) fail("the KV cache is full");
      memory_.commit(rows[r].seq, (int)(e - r));
      r = e;
    }
    rows_ = rows;
    const auto t = std::chrono::steady_clock::now();
    if (finished_) critical_s_ += std::chrono::duration<double>(t - t_finish_).count(), ++gaps_;
    finished_ = false;
  }
  const StepOutput& finish() override {
    t_finish_ = std::chrono::steady_clock::now();
    finished_ = true;
    out_.argmax.clear();
    out_.logits.clear();
    size_t wanted = 0;
    for (const BatchRow& r : rows_) wanted += r.want_logits && !(device_argmax_ && r.argmax_only) ? 1 : 0;
    out_.buffer.resize(wanted * (size_t)kVocab);
    size_t k = 0;
    for (const BatchRow& r : rows_) {
      if (!r.want_logits) continue;
      if (device_argmax_ && r.argmax_only) {
        out_.argmax.push_back(1234);
        out_.logits.push_back(nullptr);
        continue;
      }
      float* l = out_.buffer.data() + k++ * kVocab;
      std::memcpy(l, row_.data(), row_.size() * 4);
      out_.logits.push_back(l);
      out_.argmax.push_back(r.argmax_only ? argmax_logits(l, kVocab) : -1);
    }
    return out_;
  }
  double critical_us() const { return gaps_ ? critical_s_ / gaps_ * 1e6 : 0; }

 private:
  static SequenceMemory::Options memory_options() {
    SequenceMemory::Options o;
    o.n_blocks = 8192;
    o.block_size = 32;
    return o;
  }
  void copy_kv_block(int, int) override {}
  void copy_state(int, int) override {}

  SequenceMemory memory_;
  std::vector<float> row_;
  bool device_argmax_;
  StepOutput out_;
  std::vector<BatchRow> rows_;
  std::chrono::steady_clock::time_point t_finish_;
  bool finished_ = false;
  double critical_s_ = 0;
  long gaps_ = 0;
};

class Text final : public TokenText {
 public:
  std::string piece(int32_t t) const override { return t % 2 ? " to" : "ken"; }
  bool is_eog(int32_t) const override { return false; }
};

GenParams greedy_request(int max_tokens, std::vector<std::string> stop) {
  GenParams p;
  p.id = "bench";
  for (int i = 0; i < 128; ++i) p.prompt.push_back(1000 + i);
  p.max_tokens = max_tokens;
  p.sampling.temperature = 0;
  p.ignore_eos = true;
  p.stop = std::move(stop);
  p.cache_prompt = false;
  return p;
}

// One stream, greedy, as tests/load/load.py sends it: time per step() of the decode loop (all host
// work per token) and, as `critical_us`, the part of it between a step's end and the next launch.
void BM_SchedulerStepOneStream(benchmark::State& state) {
  FreeRunner runner(state.range(1) != 0);
  Text text;
  Metrics metrics;
  SchedulerOptions o;
  o.n_slots = 64;
  Scheduler s(runner, text, o, &metrics);
  std::vector<std::string> stop;
  if (state.range(0)) stop = {"</s>", "\n\nUser:"};
  std::shared_ptr<Request> req;
  std::vector<Event> events;
  for (auto _ : state) {
    if (!req) {
      state.PauseTiming();
      req = s.submit(greedy_request(4096, stop));
      s.step();  // the prompt
      state.ResumeTiming();
    }
    s.step();
    events.clear();
    if (req->poll(events, std::chrono::milliseconds(0))) req.reset();
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["critical_us"] = runner.critical_us();
}
BENCHMARK(BM_SchedulerStepOneStream)->ArgsProduct({{0, 1}, {0, 1}})->ArgNames({"stop_strings", "device_argmax"});

// `streams` streams decoding together, greedy with the argmax picked by the device (the GPU server's rows)
// or sampled (temperature 0.8 and the default chain: every row's logits on the host; sampled:2 also asks
// for 5 top log-probabilities a token): host time per
// step() (one token for every stream) and, as `critical_us`, the part between a step's end and the next
// launch, which a device step of 14-23 ms (16-64 streams on an H200) waits for.
void BM_SchedulerStepStreams(benchmark::State& state) {
  const int streams = (int)state.range(0);
  const bool sampled = state.range(1) != 0, logprobs = state.range(1) == 2;
  FreeRunner runner(true);
  Text text;
  Metrics metrics;
  SchedulerOptions o;
  o.n_slots = 64;
  Scheduler s(runner, text, o, &metrics);
  std::vector<std::shared_ptr<Request>> reqs((size_t)streams);
  std::vector<Event> events;
  const auto request = [&](int i) {
    GenParams p = greedy_request(2048, {});
    p.id = "bench-" + std::to_string(i);
    if (sampled) {
      p.sampling.temperature = 0.8f;
      p.sampling.seed = 1000 + (uint64_t)i;
    }
    if (logprobs) p.logprobs = 5;
    return s.submit(std::move(p));
  };
  for (auto _ : state) {
    bool prompts = false;
    for (int i = 0; i < streams; ++i)
      if (!reqs[(size_t)i]) {
        if (!prompts) state.PauseTiming();
        prompts = true;
        reqs[(size_t)i] = request(i);
      }
    if (prompts) {
      s.step();  // the new prompts
      state.ResumeTiming();
    }
    s.step();
    for (auto& r : reqs) {
      events.clear();
      if (r->poll(events, std::chrono::milliseconds(0))) r.reset();
    }
  }
  state.SetItemsProcessed(state.iterations() * streams);
  state.counters["critical_us"] = runner.critical_us();
}
BENCHMARK(BM_SchedulerStepStreams)->ArgsProduct({{16, 64}, {0, 1, 2}})->ArgNames({"streams", "sampled"})->UseRealTime();

// One row over the full vocabulary, greedy (the argmax) or sampled (temperature 0.8, top-k 40, top-p 0.95,
// min-p 0.05: the defaults).
void BM_SampleFullRow(benchmark::State& state) {
  const std::vector<float> row = make_row(kVocab, 4321);
  SamplingParams p;
  p.temperature = state.range(0) ? 0.8f : 0.0f;
  p.seed = 7;
  Sampler s(p, kVocab);
  std::vector<int32_t> history(256, 7);
  for (auto _ : state) benchmark::DoNotOptimize(s.sample(row.data(), history));
}
BENCHMARK(BM_SampleFullRow)->Arg(0)->Arg(1)->ArgName("sampled");

// A row's log-probabilities for `logprobs` with `top_logprobs` 5 (the log-softmax over the full vocabulary).
void BM_LogprobsFullRow(benchmark::State& state) {
  const std::vector<float> row = make_row(kVocab, 4321);
  for (auto _ : state) benchmark::DoNotOptimize(compute_logprobs(row.data(), kVocab, 4321, 5));
}
BENCHMARK(BM_LogprobsFullRow);

void BM_LogitsBufferPerStep(benchmark::State& state) {
  const std::vector<float> row = make_row(kVocab, 4321);
  for (auto _ : state) {
    std::vector<float> out((size_t)kVocab);
    std::memcpy(out.data(), row.data(), row.size() * 4);
    benchmark::DoNotOptimize(out.data());
  }
}
BENCHMARK(BM_LogitsBufferPerStep);

}  // namespace
}  // namespace roofline::serve

BENCHMARK_MAIN();
