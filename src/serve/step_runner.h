// What the scheduler needs from a model: one forward step over a batch of rows (launched, then
// finished, so host work can overlap the device), the memory sequences carry (KV blocks, recurrent
// states, prompt caching: engine/sequence_memory.h), forks, and token text. The Engine implements it through EngineRunner; the scheduler's tests use a fake backend with
// scripted logits, so scheduling is tested without a model or HTTP.
#pragma once

#include <cstdint>
#include <climits>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/engine.h"
#include "engine/sequence_memory.h"
#include "engine/sampler.h"
#include "tokenizer/tokenizer.h"

namespace roofline::serve {

using BatchRow = Engine::BatchRow;
using StepOutput = Engine::StepOutput;

class StepRunner {
 public:
  virtual ~StepRunner() = default;
  virtual int n_vocab() const = 0;
  virtual int n_batch() const = 0;  // most rows in one step
  virtual int n_ctx() const = 0;    // most positions one sequence may hold
  // Width of the final hidden states rows with want_hidden get (embeddings); 0: this runner gives none.
  virtual int n_embd() const { return 0; }
  virtual SequenceMemory& memory() = 0;
  // One forward step; logits of the rows that want them, in row order ([rows x n_vocab]).
  virtual std::vector<float> decode(const std::vector<BatchRow>& rows) = 0;
  // The step as the scheduler runs it, in two halves so that it can do the previous step's host work
  // while the device computes: launch() starts it (throws, leaving nothing in flight, when it cannot
  // run), finish() returns its output, valid until the next launch(). Rows with argmax_only get their
  // greedy token in `argmax` (among the tokens `allowed` sets, where given), and may come back without
  // logits. Between the two, nothing may change the sequences' memory. By default launch() runs
  // decode() and picks greedy tokens on the host.
  virtual void launch(const std::vector<BatchRow>& rows) {
    for (const BatchRow& r : rows)
      if (r.want_hidden) fail("this model runner gives no hidden states (embeddings)");
    out_.buffer = decode(rows);
    out_.hidden.clear();
    out_.argmax.clear();
    out_.logits.clear();
    const size_t n = (size_t)n_vocab();
    for (const BatchRow& r : rows) {
      if (!r.want_logits) continue;
      const float* l = out_.buffer.data() + n * out_.logits.size();
      out_.logits.push_back(l);
      out_.argmax.push_back(!r.argmax_only ? -1 : r.allowed ? argmax_allowed(l, (int)n, r.allowed) : argmax_logits(l, (int)n));
    }
  }
  virtual const StepOutput& finish() { return out_; }

 private:
  StepOutput out_;
};

// Token ids to text for the output side (what a request's generated tokens print as).
class TokenText {
 public:
  virtual ~TokenText() = default;
  virtual std::string piece(int32_t token) const = 0;  // the bytes a generated token adds
  virtual bool is_eog(int32_t token) const = 0;        // end of generation
  virtual int n_tokens() const { return INT32_MAX; }   // ids at or past this have no text
};

class EngineRunner final : public StepRunner {
 public:
  explicit EngineRunner(Engine& engine) : engine_(engine) {}
  int n_vocab() const override { return engine_.n_vocab(); }
  int n_batch() const override { return engine_.options().n_batch; }
  int n_ctx() const override { return engine_.options().n_ctx; }
  int n_embd() const override { return engine_.model().hparams().n_embd; }
  SequenceMemory& memory() override { return engine_.memory(); }
  std::vector<float> decode(const std::vector<BatchRow>& rows) override { return engine_.decode(rows); }
  void launch(const std::vector<BatchRow>& rows) override { engine_.launch(rows); }
  const StepOutput& finish() override { return engine_.finish(); }

 private:
  Engine& engine_;
};

class TokenizerText final : public TokenText {
 public:
  explicit TokenizerText(std::shared_ptr<const Tokenizer> tokenizer) : tok_(std::move(tokenizer)) {}
  std::string piece(int32_t token) const override { return tok_->token_to_piece(token, false); }
  bool is_eog(int32_t token) const override { return tok_->is_eog(token); }
  int n_tokens() const override { return tok_->n_vocab(); }

 private:
  std::shared_ptr<const Tokenizer> tok_;
};

}  // namespace roofline::serve
