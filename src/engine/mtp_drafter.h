// The MTP head as a built-in drafter (Qwen3.5 / Qwen3-Next multi-token prediction, as vLLM runs it). The
// GGUF file carries it as blk.<n_layer>: a full-attention decoder layer plus nextn.eh_proj, enorm, hnorm
// and shared_head_norm. For target position t with final hidden state h_t (after the target's output
// norm) and the next token x_{t+1}:
//   z   = eh_proj · [enorm(embed(x_{t+1})) ; hnorm(h_t)]           (embedding first, as vLLM concatenates)
//   h'  = shared_head_norm(layer(z))   at RoPE position t, attending over the layer's own KV of t' <= t
//   logits for x_{t+2} = output · h'
// The norms are plain RMSNorms with the weights as stored (the converter adds Qwen3.5's 1 to every
// norm weight, the nextn ones included). Drafting k tokens chains the head on its own output: the next
// row takes the drafted token and h' at position t + 1.
//
// The layer, the embedding and the output matrix run as a one-layer model (Model::mtp_block) on an
// Engine of their own, placed as the target's (-ngl), with a small KV cache: per key a sequence whose
// position i holds target position offset + i. z is computed on the host (the CPU backend's matrix
// kernels on eh_proj as stored; its own threads when the head runs on a GPU). The caller hands over the
// target's hidden states of every position that stays (Drafter::add_hidden); at draft time the rows the
// head has not seen run first (their tokens from the job's history), the last of them giving the first
// draft token. Positions the caller skipped (a prefix adopted from the prompt cache) restart the key's
// sequence at the first position it has: the drafts may be worse, never the output.
#pragma once

#include <map>
#include <memory>
#include <vector>

#include "core/thread_pool.h"
#include "engine/speculative.h"

namespace roofline {

class MtpDrafter final : public Drafter {
 public:
  // `options` are the target's engine options (placement, threads, batch, KV types); the context is sized
  // for n_seq_max sequences of options.n_ctx positions. Error (one line) when the model has no MTP block.
  MtpDrafter(std::shared_ptr<const Model> target, EngineOptions options, const DraftParams& params);
  ~MtpDrafter() override;

  void draft(std::vector<Job>& jobs) override;
  void release(int key) override;
  const DraftParams& params() const override { return params_; }
  bool wants_hidden() const override { return true; }
  void add_hidden(int key, int first, const float* hidden, int n) override;

  Engine& engine() { return *engine_; }
  // z for n rows (the head's input before its layer): [n x n_embd] into `out`.
  void input_rows(const int32_t* next_tokens, const float* target_hidden, int n, float* out);

 private:
  struct Sequence {
    int seq = -1;                // in the head's engine
    int offset = 0;              // the target position of the sequence's position 0
    int verified = 0;            // positions computed from the target's hidden states (the rest were drafts)
    int first_pending = 0;       // the target position of pending's first row
    std::vector<float> pending;  // target hidden states not run yet, in position order
  };
  Sequence& sequence_for(int key);
  void restart(Sequence& s, int first);
  void release_all();

  std::shared_ptr<const Model> block_;
  std::unique_ptr<Engine> engine_;
  DraftParams params_;
  int n_embd_ = 0;
  float eps_ = 0;
  Weight eh_proj_;                      // [2 n_embd -> n_embd], as stored
  std::vector<float> enorm_, hnorm_;    // f32 copies
  std::unique_ptr<ThreadPool> pool_;
  std::map<int, Sequence> seqs_;
  std::vector<Engine::BatchRow> rows_;
  std::vector<float> input_, hidden_in_;
  std::vector<int32_t> tokens_in_;
};

}  // namespace roofline
