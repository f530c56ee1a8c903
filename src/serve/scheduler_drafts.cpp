// The scheduler's speculative decoding (engine/speculative.h): drafts for the generating choices of a
// step, and the verification of a choice's drafted rows (acceptance, cutting back rejected positions;
// a recurrent target goes back to its kept state and feeds the accepted tokens again).
#include <algorithm>

#include "core/error.h"
#include "serve/scheduler_state.h"

namespace roofline::serve {

void Scheduler::draft_choices(int budget) {
  const int server_n_max = options_.drafter->params().n_max;
  std::vector<Drafter::Job> jobs;
  std::vector<Choice*> owners;
  const int n_active = (int)active_.size();
  // In the decode rows' rotation, so a short budget goes to each choice in turn.
  for (int k = 0; k < n_active; ++k) {
    Active& a = *active_[(decode_rotation_ + k) % n_active];
    if (a.prefilling) continue;
    const int n_max = a.params.draft_max >= 0 ? std::min(a.params.draft_max, server_n_max) : server_n_max;
    for (Choice& c : a.choices) {
      c.drafts.clear();
      // A choice feeding accepted tokens again (its recurrent state went back before rejected drafts)
      // drafts fewer: its rows stay at most n_max + 1 (a row's logits are then batch invariant on every
      // backend, as without them). Its kept state is the one before them, so a step after more
      // rejections feeds them again too, never more than n_max of them.
      if (c.finished || budget <= 0) continue;
      // A step emits at most drafts + 1 tokens: never past max_tokens or the context.
      const int room = std::min(a.max_gen - c.n_generated - 1, n_ctx_ - ((int)c.history.size() - 1) - 1);
      const int n = std::min({n_max - replay_rows(c), room, budget});
      if (n <= 0) continue;
      Drafter::Job j;
      j.key = c.seq;
      j.history = &c.history;
      j.n_max = n;
      j.n_min = a.params.draft_min;
      j.p_min = a.params.draft_p_min;
      jobs.push_back(std::move(j));
      owners.push_back(&c);
      budget -= n;
    }
  }
  if (jobs.empty()) return;
  options_.drafter->draft(jobs);
  for (size_t i = 0; i < jobs.size(); ++i) owners[i]->drafts = std::move(jobs[i].draft);
}

int Scheduler::replay_rows(const Choice& c) {
  const int n = (int)c.history.size() - 1 - runner_.memory().length(c.seq);
  ROOFLINE_CHECK(n >= 0, "choice {} holds more positions than tokens", c.index);
  return n;
}

size_t Scheduler::take_drafted(Active& a, Choice& c, const StepOutput& out, size_t r, Clock::time_point now) {
  const std::vector<int32_t> drafts = std::move(c.drafts);
  c.drafts.clear();
  const int n = (int)drafts.size();
  if (c.finished) return r + (size_t)n + 1;
  SequenceMemory& mem = runner_.memory();
  const int seq = c.seq;
  const int base = mem.length(seq) - 1 - n;  // the pending token's position
  int accepted = 0;
  for (int i = 0; i <= n; ++i) {
    c.kv_valid = base + 1 + i;  // the pending token and the drafts accepted so far
    const size_t before = c.history.size();
    take_token(a, c, out.argmax[r + (size_t)i], out.logits[r + (size_t)i], now);
    const bool match = i < n && c.history.size() > before && c.history.back() == drafts[(size_t)i];
    accepted += match ? 1 : 0;
    if (c.finished || !match) break;
  }
  c.kv_valid = -1;
  a.draft_n += n;
  a.draft_accepted += accepted;
  if (metrics_) metrics_->on_draft(n, accepted);
  if (!c.finished) {
    // The rejected drafts' positions go; blocks they alone took return to the choice's reservation.
    const int keep = base + 1 + accepted;
    const size_t blocks = mem.block_table(seq).size();
    // A recurrent target goes back to its state before the step; the next step feeds the tokens since again.
    const int kept = mem.roll_back(seq, keep);
    ROOFLINE_CHECK(kept == keep || (mem.recurrent() && kept <= base), "cutting back rejected drafts left {} positions instead of {}",
                   kept, keep);
    const int freed = (int)(blocks - mem.block_table(seq).size());
    c.promised += std::max(0, freed - c.step_extra);
  }
  c.step_extra = 0;
  return r + (size_t)n + 1;
}

}  // namespace roofline::serve
