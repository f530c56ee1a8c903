// Speculative decoding: the draft model's sequences and shared draft steps, the vocabulary check, and
// the verification loop of one sequence (speculative.h has the algorithm).
#include "engine/speculative.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/log.h"
#include "tokenizer/tokenizer.h"

namespace roofline {

// The draft's probability of its top token: 1 / sum(exp(l - max)).
float draft_top_probability(const float* logits, int n) {
  float mx = logits[0];
  for (int i = 1; i < n; ++i) mx = std::max(mx, logits[i]);
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += std::exp((double)logits[i] - mx);
  return sum > 0 ? (float)(1.0 / sum) : 0.0f;
}

namespace {

std::shared_ptr<const Tokenizer> vocabulary_of(const Model& m) {
  if (!m.metadata().find("tokenizer.ggml.tokens")) return nullptr;
  return Tokenizer::from_metadata(m.metadata());
}

}  // namespace

// ---- the checks ----

void check_draft_compatible(const Model& target, const Model& draft) {
  const int nt = target.hparams().n_vocab, nd = draft.hparams().n_vocab;
  if (nt != nd) fail("the draft model's vocabulary has {} tokens, the target's {}: a draft must share the target's vocabulary", nd, nt);
  const auto vt = vocabulary_of(target), vd = vocabulary_of(draft);
  if (!vt || !vd) {
    if (vt || vd) fail("the {} model carries no vocabulary, the {} does: cannot check that the draft shares the target's", vt ? "draft" : "target",
                       vt ? "target" : "draft");
    return;
  }
  if (vt->n_vocab() != vd->n_vocab())
    fail("the draft model's vocabulary has {} token texts, the target's {}: a draft must share the target's vocabulary", vd->n_vocab(), vt->n_vocab());
  for (int32_t id = 0; id < vt->n_vocab(); ++id)
    if (vt->token_text(id) != vd->token_text(id))
      fail("the draft model's token {} is '{}', the target's '{}': a draft must share the target's vocabulary", id, vd->token_text(id),
           vt->token_text(id));
  if (vt->bos() != vd->bos() || vt->eos() != vd->eos())
    fail("the draft model's BOS/EOS tokens ({}/{}) differ from the target's ({}/{})", vd->bos(), vd->eos(), vt->bos(), vt->eos());
}

void check_draft_target(const SequenceMemory& memory, const char* what) {
  if (!memory.can_roll_back())
    fail("{}: speculative decoding on a model with {} needs a state cell per sequence to go back to when drafts are "
         "rejected (internal error: the engine was created without EngineOptions::draft_rollback)",
         what, memory.windowed() ? "sliding-window attention rings" : "recurrent (DeltaNet) layers");
}

// ---- the draft model ----

DraftModel::DraftModel(std::unique_ptr<Engine> engine, const DraftParams& params) : engine_(std::move(engine)), params_(params) {
  if (params_.n_max < 1) fail("--draft-max {}: expected at least 1", params_.n_max);
  if (params_.n_min < 0 || params_.n_min > params_.n_max) fail("--draft-min {}: expected 0..--draft-max ({})", params_.n_min, params_.n_max);
  if (!(params_.p_min >= 0 && params_.p_min <= 1)) fail("--draft-p-min {}: expected 0..1", params_.p_min);
  if (engine_->memory().recurrent())
    fail("the draft model has recurrent or sliding-window layers, whose state cannot be cut back: use a transformer draft");
}

DraftModel::~DraftModel() { release_all(); }

DraftModel::Sequence& DraftModel::sequence_for(int key) {
  auto it = seqs_.find(key);
  if (it != seqs_.end()) return it->second;
  Sequence s;
  s.seq = engine_->memory().create_sequence(false);
  return seqs_.emplace(key, std::move(s)).first->second;
}

void DraftModel::release(int key) { free_sequence(engine_->memory(), seqs_, key); }

void DraftModel::release_all() { free_sequences(engine_->memory(), seqs_); }

void DraftModel::draft(std::vector<Job>& jobs) {
  SequenceMemory& mem = engine_->memory();
  const int n_vocab = engine_->n_vocab();
  const int n_batch = engine_->options().n_batch;
  const int n_ctx = engine_->options().n_ctx;
  struct Work {
    Job* job;
    Sequence* s;
    int n_max;
    float p_min;
    size_t fed;    // history tokens in the draft sequence
    bool done;
  };
  std::vector<Work> work;
  for (Job& j : jobs) {
    j.draft.clear();
    const int h = j.history ? (int)j.history->size() : 0;
    // The draft's positions: the history, then all but the last draft token.
    const int n_max = std::min({j.n_max, params_.n_max, n_ctx - h + 1});
    if (h == 0 || n_max <= 0) continue;
    Sequence& s = sequence_for(j.key);
    // Keep the longest common prefix, short of the last history token (its logits are wanted now).
    const std::vector<int32_t>& hist = *j.history;
    size_t common = 0;
    const size_t limit = std::min(s.tokens.size(), hist.size() - 1);
    while (common < limit && s.tokens[common] == hist[common]) ++common;
    if (common < s.tokens.size()) {
      common = (size_t)mem.truncate(s.seq, (int)common);  // a draft sequence shares no block: the cut is exact
      s.tokens.resize(common);
    }
    work.push_back({&j, &s, n_max, j.p_min >= 0 ? j.p_min : params_.p_min, common, false});
  }
  if (work.empty()) return;
  // Only the greedy token is needed unless some job stops on the draft's probability.
  bool argmax_only = true;
  for (const Work& w : work) argmax_only = argmax_only && w.p_min <= 0;

  // Picks a job's next draft token from its logits row; false when its drafting ends.
  auto take = [&](Work& w, int32_t greedy, const float* logits) {
    const int32_t tok = greedy >= 0 ? greedy : argmax_logits(logits, n_vocab);
    if (w.p_min > 0 && draft_top_probability(logits, n_vocab) < w.p_min) return false;
    w.job->draft.push_back(tok);
    return (int)w.job->draft.size() < w.n_max;
  };
  std::vector<Work*> pending;  // jobs whose rows are in the step being built, one per logits row
  auto run_step = [&]() {
    const Engine::StepOutput& out = engine_->step(rows_);
    ROOFLINE_CHECK(out.logits.size() == pending.size(), "draft step output rows mismatch");
    for (size_t r = 0; r < pending.size(); ++r) pending[r]->done = !take(*pending[r], out.argmax[r], out.logits[r]);
    rows_.clear();
    pending.clear();
  };
  try {
    // Catch-up: every job's history past its common prefix, packed into steps of up to n_batch rows;
    // the last history row of a job gives its first draft token.
    rows_.clear();
    for (Work& w : work) {
      const std::vector<int32_t>& hist = *w.job->history;
      while (w.fed < hist.size()) {
        const bool last = w.fed + 1 == hist.size();
        rows_.push_back({w.s->seq, hist[w.fed], last, last && argmax_only});
        w.s->tokens.push_back(hist[w.fed]);
        ++w.fed;
        if (last) pending.push_back(&w);
        if ((int)rows_.size() == n_batch) run_step();
      }
    }
    if (!rows_.empty()) run_step();
    // Then one greedy token per still-drafting job per step.
    for (;;) {
      for (Work& w : work) {
        if (w.done) continue;
        const int32_t tok = w.job->draft.back();
        rows_.push_back({w.s->seq, tok, true, argmax_only});
        w.s->tokens.push_back(tok);
        pending.push_back(&w);
      }
      if (rows_.empty()) break;
      run_step();
    }
  } catch (const DeviceFault&) {
    throw;
  } catch (const InternalError&) {
    throw;
  } catch (const Error& e) {
    // The draft's KV pool is full (or a step cannot run): no drafts this round, and the draft starts over.
    rows_.clear();
    release_all();
    drop_all_drafts(jobs, "draft model", e);
    return;
  }
  drop_short_drafts(jobs);
}

// ---- one sequence ----

SpeculativeDecoder::SpeculativeDecoder(Engine& target, Drafter* drafter) : target_(target), drafter_(drafter) {
  if (drafter_) check_draft_target(target_.memory(), "the target model");
}

void SpeculativeDecoder::release(int seq) {
  if (drafter_) drafter_->release(seq);
}

std::vector<float> SpeculativeDecoder::prefill(int seq, std::span<const int32_t> tokens) {
  if (!drafter_ || !drafter_->wants_hidden()) return target_.eval(seq, tokens);
  std::vector<float> logits;
  const size_t n_batch = (size_t)target_.options().n_batch;
  for (size_t start = 0; start < tokens.size(); start += n_batch) {
    const size_t end = std::min(tokens.size(), start + n_batch);
    const int first = target_.memory().length(seq);
    rows_.clear();
    for (size_t i = start; i < end; ++i) rows_.push_back({seq, tokens[i], i + 1 == tokens.size(), false, true});
    const Engine::StepOutput& o = target_.step(rows_);
    drafter_->add_hidden(seq, first, o.hidden_buffer.data(), (int)(end - start));
    if (end == tokens.size()) logits.assign(o.logits[0], o.logits[0] + target_.n_vocab());
  }
  return logits;
}

void SpeculativeDecoder::round(int seq, std::vector<int32_t>& history, int max_new, Sampler& sampler, bool greedy,
                               std::vector<int32_t>& out) {
  ROOFLINE_CHECK(max_new >= 1 && !history.empty(), "a speculative round needs room for a token and a pending token");
  SequenceMemory& mem = target_.memory();
  const int len = mem.length(seq);
  // The pending token's position; the positions between the memory's length and it hold accepted tokens
  // to feed again (a recurrent target went back to its kept state after rejected drafts).
  const int base = (int)history.size() - 1;
  const int n_replay = base - len;
  ROOFLINE_CHECK(n_replay >= 0, "the target holds more positions than the history");
  std::vector<int32_t> draft;
  // Drafts beyond what may still be emitted, or past the context, would only be thrown away. A round that
  // feeds tokens again drafts fewer, so that it has at most n_max + 1 rows as any round (a row's logits
  // are batch invariant up to there on every backend); its kept state is the one before them, so its
  // own rejections make the next round feed them too (never more than n_max: a round with as many
  // carries no drafts).
  const int room = std::min(max_new - 1, target_.options().n_ctx - base - 1);
  const int n_batch_room = target_.options().n_batch - 1 - n_replay;
  if (drafter_ && room > 0 && n_replay < drafter_->params().n_max) {
    jobs_.assign(1, Drafter::Job{});
    jobs_[0].key = seq;
    jobs_[0].history = &history;
    jobs_[0].n_max = std::min({room, drafter_->params().n_max - n_replay, n_batch_room});
    if (jobs_[0].n_max > 0) drafter_->draft(jobs_);
    draft = std::move(jobs_[0].draft);
  }
  const bool hidden = drafter_ && drafter_->wants_hidden();
  rows_.clear();
  for (int i = 0; i < n_replay; ++i) rows_.push_back({seq, history[(size_t)(len + i)], false});
  rows_.push_back({seq, history.back(), true, greedy, hidden});
  for (int32_t t : draft) rows_.push_back({seq, t, true, greedy, hidden});
  if (!draft.empty()) mem.keep_state(seq);
  const Engine::StepOutput& o = target_.step(rows_);
  int accepted = 0;
  for (size_t i = 0; i <= draft.size(); ++i) {
    const int32_t tok = greedy && o.argmax[i] >= 0 ? o.argmax[i] : sampler.sample(o.logits[i], history).token;
    history.push_back(tok);
    out.push_back(tok);
    if (i == draft.size() || tok != draft[i]) break;
    ++accepted;
  }
  stats_.add((int)draft.size(), accepted);
  // The drafter gets the target's hidden states of the positions that stay: the pending token's and the
  // accepted drafts'.
  if (hidden) drafter_->add_hidden(seq, base, o.hidden_buffer.data(), accepted + 1);
  // Positions kept: the pending token and the accepted drafts (the last emitted token is pending now).
  const int keep = base + 1 + accepted;
  if (mem.length(seq) != keep) {
    const int kept = mem.roll_back(seq, keep);
    ROOFLINE_CHECK(kept == keep || (mem.recurrent() && kept == len),
                   "cutting back rejected drafts left {} positions instead of {}", kept, keep);
  }
}

}  // namespace roofline
