// The MTP drafter (mtp_drafter.h has the maths): the head's input rows on the host, its layer and output
// on an engine of its own, per key a sequence kept in step with the target's verified positions.
#include "engine/mtp_drafter.h"

#include <algorithm>
#include <cmath>

#include "backend/cpu/matmul.h"
#include "core/error.h"
#include "core/log.h"
#include "formats/quant_ref.h"

namespace roofline {

namespace {

std::vector<float> dequantized(const Weight& w) {
  std::vector<float> out((size_t)w.cols() * (size_t)w.rows());
  const size_t row_bytes = dtype_row_bytes(w.type(), w.cols());
  for (int64_t r = 0; r < w.rows(); ++r)
    dequantize_row_ref(w.type(), w.data() + (size_t)r * row_bytes, out.data() + (size_t)r * (size_t)w.cols(), w.cols());
  return out;
}

// x * w / sqrt(mean(x^2) + eps) into out.
void rms_norm(const float* x, const float* w, int n, float eps, float* out) {
  double ss = 0;
  for (int i = 0; i < n; ++i) ss += (double)x[i] * x[i];
  const float scale = (float)(1.0 / std::sqrt(ss / n + (double)eps));
  for (int i = 0; i < n; ++i) out[i] = x[i] * scale * w[i];
}

}  // namespace

MtpDrafter::MtpDrafter(std::shared_ptr<const Model> target, EngineOptions options, const DraftParams& params) : params_(params) {
  if (params_.n_max < 1) fail("--draft-max {}: expected at least 1", params_.n_max);
  if (params_.n_min < 0 || params_.n_min > params_.n_max) fail("--draft-min {}: expected 0..--draft-max ({})", params_.n_min, params_.n_max);
  if (!(params_.p_min >= 0 && params_.p_min <= 1)) fail("--draft-p-min {}: expected 0..1", params_.p_min);
  block_ = Model::mtp_block(target);
  const HParams& hp = block_->hparams();
  n_embd_ = hp.n_embd;
  eps_ = hp.rms_eps;
  eh_proj_ = target->nextn_tensor("nextn.eh_proj.weight");
  enorm_ = dequantized(target->nextn_tensor("nextn.enorm.weight"));
  hnorm_ = dequantized(target->nextn_tensor("nextn.hnorm.weight"));
  // Every target sequence's positions, plus each one's drafts and a block.
  if (options.n_ctx == 0) options.n_ctx = std::min(hp.n_ctx_train, 4096);
  options.n_ctx += std::max(1, options.n_seq_max) * (params_.n_max + options.kv_block_size);
  options.n_state_snapshots = 0;
  options.draft_rollback = false;
  options.n_cpu_moe = 0;
  options.cpu_tensor_patterns.clear();
  engine_ = Engine::create(block_, options);
  // The host's share (the input rows) runs on its own threads only when no layer runs on the CPU.
  pool_ = std::make_unique<ThreadPool>(engine_->gpu_units() == hp.n_layer + 1 ? std::min(8, ThreadPool::default_thread_count()) : 1);
}

MtpDrafter::~MtpDrafter() { release_all(); }

MtpDrafter::Sequence& MtpDrafter::sequence_for(int key) {
  auto it = seqs_.find(key);
  if (it != seqs_.end()) return it->second;
  Sequence s;
  s.seq = engine_->memory().create_sequence(false);
  return seqs_.emplace(key, std::move(s)).first->second;
}

void MtpDrafter::restart(Sequence& s, int first) {
  engine_->memory().free_sequence(s.seq);
  s.seq = engine_->memory().create_sequence(false);
  s.offset = first;
  s.verified = 0;
  s.first_pending = first;
  s.pending.clear();
}

void MtpDrafter::release(int key) { free_sequence(engine_->memory(), seqs_, key); }

void MtpDrafter::release_all() { free_sequences(engine_->memory(), seqs_); }

void MtpDrafter::add_hidden(int key, int first, const float* hidden, int n) {
  if (n <= 0) return;
  Sequence& s = sequence_for(key);
  const int expected = s.first_pending + (int)(s.pending.size() / (size_t)n_embd_);
  const bool empty = s.verified == 0 && s.pending.empty();
  if (empty || first != expected) restart(s, first);  // the first rows, or a gap: start from here
  s.pending.insert(s.pending.end(), hidden, hidden + (size_t)n * n_embd_);
}

void MtpDrafter::input_rows(const int32_t* next_tokens, const float* target_hidden, int n, float* out) {
  const Weight& embd = block_->token_embd();
  const size_t row_bytes = dtype_row_bytes(embd.type(), n_embd_);
  const size_t H = (size_t)n_embd_;
  std::vector<float> cat(2 * H * (size_t)n), e(H);
  const float scale = block_->hparams().embd_scale;
  for (int r = 0; r < n; ++r) {
    ROOFLINE_CHECK(next_tokens[r] >= 0 && next_tokens[r] < block_->hparams().n_vocab, "MTP input token {} out of range", next_tokens[r]);
    dequantize_row_ref(embd.type(), embd.data() + (size_t)next_tokens[r] * row_bytes, e.data(), n_embd_);
    if (scale > 0)
      for (float& v : e) v *= scale;
    rms_norm(e.data(), enorm_.data(), n_embd_, eps_, cat.data() + 2 * H * r);
    rms_norm(target_hidden + H * r, hnorm_.data(), n_embd_, eps_, cat.data() + 2 * H * r + H);
  }
  // The fc with the CPU's kernels, on the weight as stored (a row's result does not depend on the batch).
  cpu::matmul(eh_proj_, cat.data(), n, out, *pool_);
}

void MtpDrafter::draft(std::vector<Job>& jobs) {
  SequenceMemory& mem = engine_->memory();
  const int n_vocab = engine_->n_vocab();
  const int n_batch = engine_->options().n_batch;
  const int n_ctx = engine_->options().n_ctx;
  const size_t H = (size_t)n_embd_;
  struct Work {
    Job* job;
    Sequence* s;
    int n_max;
    float p_min;
    bool done;
    std::vector<float> h;  // the head's output hidden state of the last row (chained into the next)
  };
  std::vector<Work> work;
  for (Job& j : jobs) {
    j.draft.clear();
    const int hsize = j.history ? (int)j.history->size() : 0;
    auto it = seqs_.find(j.key);
    if (hsize == 0 || it == seqs_.end()) continue;
    Sequence& s = it->second;
    // The chained rows of the last round go; the verified ones stay.
    if (mem.length(s.seq) > s.verified) ROOFLINE_CHECK(mem.truncate(s.seq, s.verified) == s.verified);
    // Drafting needs the hidden state of the position before the pending token.
    const int n_pending = (int)(s.pending.size() / H);
    if (s.first_pending + n_pending != hsize - 1 || s.offset + s.verified != s.first_pending) continue;
    const int n_max = std::min({j.n_max, params_.n_max, n_ctx - s.verified - n_pending + 1});
    if (n_max <= 0 || n_pending == 0) continue;
    work.push_back({&j, &s, n_max, j.p_min >= 0 ? j.p_min : params_.p_min, false, {}});
  }
  if (work.empty()) return;
  bool argmax_only = true;
  for (const Work& w : work) argmax_only = argmax_only && w.p_min <= 0;

  auto take = [&](Work& w, int32_t greedy, const float* logits, const float* hidden) {
    const int32_t tok = greedy >= 0 ? greedy : argmax_logits(logits, n_vocab);
    if (w.p_min > 0 && draft_top_probability(logits, n_vocab) < w.p_min) return false;
    w.job->draft.push_back(tok);
    w.h.assign(hidden, hidden + H);
    return (int)w.job->draft.size() < w.n_max;
  };
  std::vector<Work*> pending;  // per logits row of the step being built
  auto add_row = [&](Sequence& s, int32_t token, const float* hidden, bool last, Work* w) {
    rows_.push_back({s.seq, token, last, last && argmax_only, last});
    tokens_in_.push_back(token);
    hidden_in_.insert(hidden_in_.end(), hidden, hidden + H);
    if (last) pending.push_back(w);
  };
  auto run_step = [&]() {
    input_.resize(rows_.size() * H);
    input_rows(tokens_in_.data(), hidden_in_.data(), (int)rows_.size(), input_.data());
    const Engine::StepOutput& out = engine_->step(rows_, input_.data());
    ROOFLINE_CHECK(out.logits.size() == pending.size() && out.hidden.size() == pending.size(), "MTP step output rows mismatch");
    for (size_t r = 0; r < pending.size(); ++r) pending[r]->done = !take(*pending[r], out.argmax[r], out.logits[r], out.hidden[r]);
    rows_.clear();
    tokens_in_.clear();
    hidden_in_.clear();
    pending.clear();
  };
  try {
    rows_.clear();
    tokens_in_.clear();
    hidden_in_.clear();
    // Catch-up: the target positions the head has not run (token: the next one in the history); the
    // last gives the first draft token.
    for (Work& w : work) {
      Sequence& s = *w.s;
      const std::vector<int32_t>& hist = *w.job->history;
      const int n_pending = (int)(s.pending.size() / H);
      for (int i = 0; i < n_pending; ++i) {
        const int p = s.first_pending + i;
        add_row(s, hist[(size_t)p + 1], s.pending.data() + H * i, i + 1 == n_pending, &w);
        if ((int)rows_.size() == n_batch) run_step();
      }
      s.verified += n_pending;
      s.first_pending += n_pending;
      s.pending.clear();
    }
    if (!rows_.empty()) run_step();
    // Then one chained row per still-drafting job per step: the drafted token and the head's own hidden state.
    for (;;) {
      for (Work& w : work)
        if (!w.done) add_row(*w.s, w.job->draft.back(), w.h.data(), true, &w);
      if (rows_.empty()) break;
      run_step();
    }
  } catch (const DeviceFault&) {
    throw;
  } catch (const InternalError&) {
    throw;
  } catch (const Error& e) {
    rows_.clear();
    tokens_in_.clear();
    hidden_in_.clear();
    release_all();
    drop_all_drafts(jobs, "MTP drafter", e);
    return;
  }
  drop_short_drafts(jobs);
}

}  // namespace roofline
