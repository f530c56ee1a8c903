// Speculative decoding with a draft model: a small model that shares the target's vocabulary proposes
// a few tokens greedily; the target evaluates the last accepted token and those drafts as one step of
// N+1 rows of the sequence; its own sampler picks a token from each row's logits in order, accepting
// while the pick equals the draft. The first mismatch emits the target's pick and ends the round; when
// every draft is accepted, the last row's pick (the bonus token) is emitted too. Positions of rejected
// drafts are cut from the target's and the draft's sequence memory; a target with recurrent layers
// (DeltaNet states, sliding-window rings) keeps its state before a verification step and, when drafts
// are rejected, goes back to it and feeds the accepted tokens again in its next step, in front of the
// new pending token and fewer drafts (a sequence's rows per step stay at most n_max + 1;
// SequenceMemory::roll_back). Every emitted token is the
// target's own pick from its own logits, so the output is exactly what decoding without a draft
// gives (token for token under greedy sampling, and with a seeded sampler too, since the sampler
// draws once per emitted token either way) as long as a row's logits do not depend on the batch.
//
// Here: the Drafter interface (the scheduler's tests script drafts through it), DraftModel (a draft
// Engine with one draft sequence per target sequence, kept in sync with the accepted text; the drafts
// of many target sequences share its steps), the vocabulary check, and SpeculativeDecoder, the loop
// of one sequence that `run` and `bench` use. The server's scheduler verifies drafts inside its
// continuous-batching steps (serve/scheduler.cpp).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "engine/engine.h"
#include "engine/sampler.h"

namespace roofline {

// llama.cpp's draft settings (common_params_speculative_draft), with its defaults.
struct DraftParams {
  int n_max = 3;       // most tokens drafted per round (--draft-max, --spec-draft-n-max)
  int n_min = 0;       // a draft shorter than this is not used (--draft-min)
  float p_min = 0.0f;  // drafting stops when the draft model's top probability falls under this (--draft-p-min)
};

// What drafted and how much of it the target accepted (llama.cpp's spec_decode_* counters).
struct DraftStats {
  int64_t drafts = 0;    // rounds that carried at least one draft token
  int64_t drafted = 0;   // draft tokens proposed to the target
  int64_t accepted = 0;  // of them, accepted
  double acceptance() const { return drafted > 0 ? (double)accepted / (double)drafted : 0.0; }
  void add(int n_drafted, int n_accepted) {
    if (n_drafted <= 0) return;
    ++drafts;
    drafted += n_drafted;
    accepted += n_accepted;
  }
};

// Proposes draft tokens for target sequences. Keys are the caller's ids of its sequences (the target's
// sequence ids); a key's state lives until release().
class Drafter {
 public:
  virtual ~Drafter() = default;
  struct Job {
    int key = 0;
    const std::vector<int32_t>* history = nullptr;  // every token of the sequence so far, the pending one last
    int n_max = 0;                                  // at most this many tokens (<= params().n_max)
    int n_min = -1;                                 // this job's n_min, p_min (-1: params()')
    float p_min = -1;
    std::vector<int32_t> draft;                     // out: the proposed tokens (may be empty)
  };
  // Fills each job's draft. Never throws for lack of memory: a job that cannot be drafted gets none.
  virtual void draft(std::vector<Job>& jobs) = 0;
  // The key's sequence ended (or was restarted): forget what the drafter holds for it.
  virtual void release(int key) = 0;
  virtual const DraftParams& params() const = 0;
  // Drafters that read the target's final hidden states (the MTP head): the caller then asks for them
  // (Engine::BatchRow::want_hidden) on the rows it prefills or verifies and hands over those of the
  // positions that stay, in position order, before the next draft() of the key.
  virtual bool wants_hidden() const { return false; }
  // The target's final hidden states (after its output norm), [n x n_embd], of positions [first, first + n)
  // of the key's sequence, whose tokens are history[first + 1 ...] of the next job. `first` may skip
  // positions (a prefix adopted from the prompt cache was never computed).
  virtual void add_hidden(int key, int first, const float* hidden, int n) { (void)key, (void)first, (void)hidden, (void)n; }

 protected:
  // llama.cpp's --draft-min: a draft shorter than its job's n_min (or params().n_min) is not used.
  void drop_short_drafts(std::vector<Job>& jobs) const {
    for (Job& j : jobs)
      if ((int)j.draft.size() < (j.n_min >= 0 ? j.n_min : params().n_min)) j.draft.clear();
  }
  // A draft step failed (the drafter's memory is full, or a step cannot run): no job gets a draft this round.
  // Said once at warning level as "WHO: reason", later failures at debug level. The caller releases its
  // sequences, which start over at the next round.
  void drop_all_drafts(std::vector<Job>& jobs, const char* who, const Error& e) {
    if (!warned_) log_warn("{}: {}; no drafts this step, its sequences start over (said once)", who, e.what());
    else log_debug("{}: {}; no drafts this step", who, e.what());
    warned_ = true;
    for (Job& j : jobs) j.draft.clear();
  }

  // The drafters keep, per key, a record whose `seq` is a sequence of their engine's memory: free one key's
  // (when it has one) or every key's, and forget them.
  template <typename Sequences>
  static void free_sequence(SequenceMemory& mem, Sequences& seqs, int key) {
    auto it = seqs.find(key);
    if (it == seqs.end()) return;
    mem.free_sequence(it->second.seq);
    seqs.erase(it);
  }
  template <typename Sequences>
  static void free_sequences(SequenceMemory& mem, Sequences& seqs) {
    for (auto& [key, s] : seqs) mem.free_sequence(s.seq);
    seqs.clear();
  }

 private:
  bool warned_ = false;  // a draft step failed once
};

// A draft model on an Engine of its own: per key a draft sequence holding the accepted text (and the
// drafts of the last round, cut back to the common prefix at the next). The catch-up rows of every job
// and then each round of greedy draft tokens run as shared steps of the draft engine.
class DraftModel final : public Drafter {
 public:
  // Fails (one line) when the draft's memory cannot be cut back (recurrent or sliding-window layers) or
  // its step is too small for a round.
  DraftModel(std::unique_ptr<Engine> engine, const DraftParams& params);
  ~DraftModel() override;

  void draft(std::vector<Job>& jobs) override;
  void release(int key) override;
  const DraftParams& params() const override { return params_; }
  Engine& engine() { return *engine_; }

 private:
  struct Sequence {
    int seq = -1;
    std::vector<int32_t> tokens;  // what the draft sequence's positions hold
  };
  Sequence& sequence_for(int key);
  void release_all();

  std::unique_ptr<Engine> engine_;
  DraftParams params_;
  std::map<int, Sequence> seqs_;
  std::vector<Engine::BatchRow> rows_;
};

// A draft's probability of its top token (--draft-p-min compares it).
float draft_top_probability(const float* logits, int n_vocab);

// The draft must speak the target's vocabulary: the same number of logits and, where both models carry
// a vocabulary, the same text for every token id and the same BOS/EOS. A mismatch is an Error naming
// the first difference.
void check_draft_compatible(const Model& target, const Model& draft);
// The target's memory must go back to an earlier position to reject drafts: models with recurrent
// (DeltaNet) layers or sliding-window rings need an engine created with EngineOptions::draft_rollback
// (a kept state per sequence); without it they are refused with one line (`what` names the flag or role).
void check_draft_target(const SequenceMemory& target_memory, const char* what);

// Speculative generation of one target sequence (run, bench): each round drafts, verifies in one step of
// the target and returns the tokens it emits. Without a drafter a round is one plain decode step.
class SpeculativeDecoder {
 public:
  SpeculativeDecoder(Engine& target, Drafter* drafter);

  // Evaluates the prompt of `seq` (empty so far) and returns its last token's logits; hands the target's
  // hidden states to a drafter that wants them (Engine::eval otherwise).
  std::vector<float> prefill(int seq, std::span<const int32_t> tokens);
  // `history` is the sequence's tokens, the last of them sampled but not yet in the target's memory
  // (the target holds the positions before it, or, after a recurrent target rejected drafts, fewer: this
  // round feeds the rest first). Emits 1..max_new tokens (max_new >= 1): each appended to history and to
  // `out`; greedy picks the argmax (the step may compute it where the logits are), else `sampler` picks.
  // The target's memory then holds every emitted token but the last (or fewer, as above).
  void round(int seq, std::vector<int32_t>& history, int max_new, Sampler& sampler, bool greedy, std::vector<int32_t>& out);
  // The sequence ended: the drafter forgets it.
  void release(int seq);
  const DraftStats& stats() const { return stats_; }

 private:
  Engine& target_;
  Drafter* drafter_;
  DraftStats stats_;
  std::vector<Engine::BatchRow> rows_;
  std::vector<Drafter::Job> jobs_;
};

}  // namespace roofline
