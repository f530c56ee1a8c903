// A fake model backend for the scheduler tests: a real SequenceMemory whose KV blocks store token ids,
// and logits that are a deterministic function of every token a sequence's block table reads (like
// attention does), so wrong block sharing, forks or prefix adoption change the output. In recurrent
// mode each state cell holds every token the sequence has fed (as a recurrent state summarizes them)
// and the logits are computed from the cell, so a wrong snapshot, restore or fork changes the output
// too. Every step's batch is logged for the batching tests.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "serve/step_runner.h"

namespace roofline::serve::test {

struct FakeRecurrent {
  int n_seq_max = 0;  // 0: no recurrent state (attention-only model)
  int n_snapshots = 0;
};

class FakeRunner : public StepRunner, private SequenceMemory::Device {
 public:
  using Recurrent = FakeRecurrent;
  FakeRunner(int n_vocab = 64, int n_blocks = 64, int block_size = 4, int n_batch = 32, int n_ctx = 0, Recurrent rec = {})
      : n_vocab_(n_vocab), n_batch_(n_batch), n_ctx_(n_ctx > 0 ? n_ctx : n_blocks * block_size),
        kv_(memory_options(n_blocks, block_size, rec), this), store_((size_t)n_blocks * block_size, -1),
        cells_((size_t)SequenceMemory::state_cells(memory_options(n_blocks, block_size, rec))) {}

  int n_vocab() const override { return n_vocab_; }
  int n_batch() const override { return n_batch_; }
  int n_ctx() const override { return n_ctx_; }
  SequenceMemory& memory() override { return kv_; }
  int state_copies = 0;  // copy_state calls (snapshots, restores, forks)

  // Next-token rule: by default a hash of all tokens the sequence holds; tests may script it.
  std::function<int32_t(const std::vector<int32_t>& content)> next_token;
  bool fail_next_step = false;
  std::atomic<bool> device_fault_next_step{false};  // the next step throws DeviceFault (a sticky GPU fault)
  int step_delay_ms = 0;  // makes each step take this long (HTTP tests)

  std::vector<float> decode(const std::vector<BatchRow>& rows) override {
    if (device_fault_next_step.exchange(false)) throw DeviceFault("injected CUDA error cudaErrorIllegalAddress");
    if (fail_next_step) {
      fail_next_step = false;
      fail("injected step failure");
    }
    if ((int)rows.size() > n_batch_) fail("batch of {} rows exceeds {}", rows.size(), n_batch_);
    if (step_delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(step_delay_ms));
    steps.push_back(rows);
    // Group contiguous rows per sequence, check and reserve like Engine::decode.
    std::vector<std::pair<int, int>> runs;
    for (size_t r = 0; r < rows.size(); ++r) {
      if (rows[r].token < 0 || rows[r].token >= n_vocab_) fail("token {} out of range", rows[r].token);
      if (r == 0 || rows[r - 1].seq != rows[r].seq) runs.push_back({rows[r].seq, 0});
      runs.back().second++;
    }
    int blocks = 0;
    for (auto& [seq, n] : runs) {
      if (kv_.length(seq) + n > n_ctx_) fail("sequence {} exceeds the context", seq);
      blocks += kv_.blocks_needed(seq, n);
    }
    if (blocks > kv_.free_blocks()) fail("the KV cache is full");
    for (auto& [seq, n] : runs)
      if (!kv_.reserve(seq, n)) fail("reserve failed");
    std::vector<float> logits;
    size_t r = 0;
    for (auto& [seq, n] : runs) {
      const int base = kv_.length(seq);
      const auto& table = kv_.block_table(seq);
      std::vector<int32_t>* cell = nullptr;
      if (kv_.recurrent()) {
        cell = &cells_[(size_t)kv_.state_cell(seq)];
        if (base == 0) cell->clear();  // a new sequence starts from a zero state, whatever the cell held
        if ((int)cell->size() != base) fail("state of sequence {} holds {} tokens at position {}", seq, cell->size(), base);
      }
      for (int i = 0; i < n; ++i, ++r) {
        const int pos = base + i;
        // A sequence only writes into blocks it owns alone.
        const int32_t block = table[pos / kv_.block_size()];
        if (kv_.kv().block_refcount(block) != 1) fail("write into shared block {}", block);
        store_[(size_t)block * kv_.block_size() + pos % kv_.block_size()] = rows[r].token;
        if (cell) cell->push_back(rows[r].token);
        if (rows[r].want_logits) {
          std::vector<int32_t> content;
          for (int p = 0; p <= pos; ++p) content.push_back(store_[(size_t)table[p / kv_.block_size()] * kv_.block_size() + p % kv_.block_size()]);
          if (cell && *cell != content) fail("the state of sequence {} disagrees with its KV blocks", seq);
          append_logits(cell ? *cell : content, logits);
        }
      }
      kv_.commit(seq, n);
    }
    return logits;
  }

  void copy_kv_block(int src, int dst) override {
    for (int i = 0; i < kv_.block_size(); ++i)
      store_[(size_t)dst * kv_.block_size() + i] = store_[(size_t)src * kv_.block_size() + i];
  }
  void copy_state(int src, int dst) override {
    cells_.at((size_t)dst) = cells_.at((size_t)src);
    ++state_copies;
  }

  // Logits for a content: a smooth spread plus a clear winner (the next-token rule's pick).
  void append_logits(const std::vector<int32_t>& content, std::vector<float>& out) const {
    uint64_t h = 1469598103934665603ull;
    for (int32_t t : content) h = (h ^ (uint64_t)(uint32_t)t) * 1099511628211ull;
    const int32_t pick = next_token ? next_token(content) : (int32_t)(1 + h % (uint64_t)(n_vocab_ - 1));
    for (int v = 0; v < n_vocab_; ++v) {
      const uint64_t x = (h ^ ((uint64_t)v * 0x9E3779B97F4A7C15ull)) * 0xBF58476D1CE4E5B9ull;
      out.push_back((float)((x >> 40) % 1000) / 500.0f - 1.0f + (v == pick ? 6.0f : 0.0f));
    }
  }

  std::vector<std::vector<BatchRow>> steps;

  // The next step's output has one row more than the step asked for, so the scheduler's internal
  // check of the output fails (a bug of ours, as the server sees it).
  std::atomic<bool> bad_output_next_step{false};
  const StepOutput& finish() override {
    const StepOutput& out = StepRunner::finish();
    if (!bad_output_next_step.exchange(false)) return out;
    bad_out_ = out;
    bad_out_.argmax.push_back(0);
    bad_out_.logits.push_back(nullptr);
    return bad_out_;
  }

 private:
  StepOutput bad_out_;
  static SequenceMemory::Options memory_options(int n_blocks, int block_size, Recurrent rec) {
    SequenceMemory::Options o;
    o.n_blocks = n_blocks;
    o.block_size = block_size;
    o.recurrent = rec.n_seq_max > 0;
    o.n_seq_max = rec.n_seq_max;
    o.n_snapshots = rec.n_snapshots;
    return o;
  }
  int n_vocab_, n_batch_, n_ctx_;
  SequenceMemory kv_;
  std::vector<int32_t> store_;
  std::vector<std::vector<int32_t>> cells_;  // recurrent: per state cell, the tokens it has seen
};

// Token t prints as pieces[t] when given, else as one letter; eog is end of generation.
class FakeText : public TokenText {
 public:
  std::map<int32_t, std::string> pieces;
  int32_t eog = -1;
  std::string piece(int32_t t) const override {
    auto it = pieces.find(t);
    if (it != pieces.end()) return it->second;
    return std::string(1, (char)('a' + t % 26));
  }
  bool is_eog(int32_t t) const override { return t == eog; }
};

}  // namespace roofline::serve::test
