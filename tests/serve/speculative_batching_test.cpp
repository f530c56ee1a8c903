// How drafts ride the scheduler's steps, on the fake backend (token-id KV blocks, logits from every
// token a sequence holds) with a scripted drafter: each generating choice's pending token and drafts
// are contiguous rows of one step, next to other slots' rows and prompt chunks; drafts never reach past
// max_tokens; a draft that is right up to position k has exactly k tokens accepted; the KV cache keeps
// only accepted text (a wrong cut changes the fake logits, so the output would differ).
#include <gtest/gtest.h>

#include <map>

#include "engine/speculative.h"
#include "fake_runner.h"
#include "serve/scheduler.h"
#include "scheduler_runs.h"

using namespace roofline;
using namespace roofline::serve;
using roofline::serve::test::FakeRunner;
using roofline::serve::test::FakeText;
using roofline::serve::test::greedy_request;
using roofline::serve::test::tokens_of;

namespace {

// Drafts the fake model's own greedy continuation, wrong from position `wrong_at` on (-1: never).
class ScriptedDrafter final : public Drafter {
 public:
  ScriptedDrafter(const FakeRunner& runner, int n_max, int wrong_at) : runner_(runner), wrong_at_(wrong_at) { params_.n_max = n_max; }
  void draft(std::vector<Job>& jobs) override {
    for (Job& j : jobs) {
      EXPECT_LE(j.n_max, params_.n_max);
      std::vector<int32_t> content = *j.history;
      j.draft.clear();
      for (int i = 0; i < j.n_max; ++i) {
        if (j.n_min > j.n_max) break;  // as DraftModel: a draft shorter than n_min is dropped
        std::vector<float> logits;
        runner_.append_logits(content, logits);
        int32_t t = (int32_t)(std::max_element(logits.begin(), logits.end()) - logits.begin());
        if (wrong_at_ >= 0 && i >= wrong_at_) t = (t + 1) % (int32_t)logits.size();
        j.draft.push_back(t);
        content.push_back(t);
      }
      ++calls[j.key];
    }
  }
  void release(int key) override { released.push_back(key); }
  const DraftParams& params() const override { return params_; }
  std::map<int, int> calls;
  std::vector<int> released;

 private:
  const FakeRunner& runner_;
  DraftParams params_;
  int wrong_at_;
};

std::vector<int32_t> prompt_of(int n, int salt) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back(1 + (i * 7 + salt * 13) % 60);
  return p;
}

}  // namespace

TEST(SpeculativeBatchingTest, DraftRowsShareStepsWithOtherSlotsAndPromptChunks) {
  const std::vector<GenParams> params = {greedy_request(prompt_of(6, 1), 14), greedy_request(prompt_of(9, 2), 11),
                                         greedy_request(prompt_of(40, 3), 9)};
  std::vector<std::vector<int32_t>> want;
  for (const GenParams& p : params) {
    FakeRunner runner(64, 128, 4, 32);
    FakeText text;
    Scheduler s(runner, text, SchedulerOptions{});
    want.push_back(tokens_of(s, {s.submit(p)})[0]);
  }
  for (int wrong_at : {-1, 0, 2}) {
    SCOPED_TRACE(wrong_at);
    FakeRunner runner(64, 128, 4, 32);
    ScriptedDrafter drafter(runner, 3, wrong_at);
    FakeText text;
    SchedulerOptions o;
    o.n_slots = 3;
    o.max_prefill_per_step = 8;  // the long prompt takes several steps, beside the others' drafts
    o.drafter = &drafter;
    Scheduler s(runner, text, o);
    std::vector<std::shared_ptr<Request>> reqs;
    for (const GenParams& p : params) reqs.push_back(s.submit(p));
    std::vector<Timings> t;
    EXPECT_EQ(tokens_of(s, reqs, &t), want);
    // Acceptance: all, none, or the first two of each draft.
    for (size_t k = 0; k < params.size(); ++k) {
      EXPECT_GT(t[k].draft_n, 0) << k;
      if (wrong_at == -1) {
        EXPECT_EQ(t[k].draft_n_accepted, t[k].draft_n) << k;
      } else if (wrong_at == 0) {
        EXPECT_EQ(t[k].draft_n_accepted, 0) << k;
      } else {
        EXPECT_GT(t[k].draft_n_accepted, 0) << k;
      }
    }
    // A step where one sequence carries a pending token + drafts, another sequence decodes or drafts,
    // and a prompt chunk is also there.
    bool mixed = false;
    for (const auto& rows : runner.steps) {
      std::map<int, int> per_seq, logits;
      for (const auto& r : rows) {
        per_seq[r.seq]++;
        logits[r.seq] += r.want_logits ? 1 : 0;
      }
      int drafting = 0, prefill = 0;
      for (auto& [seq, n] : per_seq) {
        if (n > 1 && logits[seq] == n) ++drafting;       // every row of a verification wants logits
        if (logits[seq] < n) ++prefill;                   // a prompt chunk wants only its last row's
      }
      mixed = mixed || (drafting >= 1 && prefill >= 1 && per_seq.size() >= 3);
      EXPECT_LE((int)rows.size(), 32);
    }
    EXPECT_TRUE(mixed) << "no step held verification rows beside another slot and a prompt chunk";
    EXPECT_EQ(drafter.released.size(), 3u) << "every draft sequence released at the end";
    EXPECT_EQ(runner.memory().used_blocks(), runner.memory().cached_blocks() - runner.memory().evictable_blocks());
  }
}

// Drafts stop where max_tokens does: after the prompt's token, a request of N tokens verifies one step of
// N - 2 drafts (all accepted, plus the bonus token), never more; one of 1 or 2 tokens none.
TEST(SpeculativeBatchingTest, DraftsNeverReachPastMaxTokens) {
  for (int max_tokens : {1, 2, 5, 6}) {
    FakeRunner runner(64, 128, 4, 32);
    ScriptedDrafter drafter(runner, 8, -1);
    FakeText text;
    SchedulerOptions o;
    o.drafter = &drafter;
    Scheduler s(runner, text, o);
    std::vector<Timings> t;
    const auto out = tokens_of(s, {s.submit(greedy_request(prompt_of(7, 4), max_tokens))}, &t);
    ASSERT_EQ((int)out[0].size(), max_tokens);
    // The first token comes from the prompt; then one step of max_tokens - 2 drafts and the bonus token.
    EXPECT_EQ(t[0].draft_n, std::max(0, max_tokens - 2));
    for (const auto& rows : runner.steps) EXPECT_LE((int)rows.size(), 8);  // 7 prompt rows, or pending + drafts
  }
}

// A request's speculative.n_max (at most the server's; 0: none) and speculative.n_min (a shorter draft
// is dropped) change its drafts, not its tokens.
TEST(SpeculativeBatchingTest, PerRequestDraftSettings) {
  FakeRunner plain_runner(64, 128, 4, 32);
  FakeText text;
  Scheduler plain(plain_runner, text, SchedulerOptions{});
  const auto want = tokens_of(plain, {plain.submit(greedy_request(prompt_of(9, 5), 13))})[0];
  struct Case {
    int n_max, n_min, drafted;
  };
  // 12 tokens after the prompt's: steps of n_max drafts + the bonus token, the last one shorter.
  for (const Case& c : {Case{-1, -1, 9}, Case{0, -1, 0}, Case{2, -1, 8}, Case{9, -1, 9}, Case{-1, 3, 9}, Case{2, 3, 0}}) {
    SCOPED_TRACE(std::to_string(c.n_max) + " " + std::to_string(c.n_min));
    FakeRunner runner(64, 128, 4, 32);
    ScriptedDrafter drafter(runner, 3, -1);
    SchedulerOptions o;
    o.drafter = &drafter;
    Scheduler s(runner, text, o);
    GenParams p = greedy_request(prompt_of(9, 5), 13);
    p.draft_max = c.n_max;
    p.draft_min = c.n_min;
    std::vector<Timings> t;
    EXPECT_EQ(tokens_of(s, {s.submit(p)}, &t)[0], want);
    EXPECT_EQ(t[0].draft_n, c.drafted);
    EXPECT_EQ(t[0].draft_n_accepted, c.drafted);
  }
}
