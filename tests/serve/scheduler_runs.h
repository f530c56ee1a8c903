// What the scheduler tests on the real engine and on the fake runner share: a token text that prints
// nothing useful, a greedy request, and the loop that steps a scheduler until its requests end, handing
// each request's events to the test.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "serve/scheduler.h"

namespace roofline::serve::test {

// Every token is "x" and none ends generation: tests that compare tokens, not text.
class NoText final : public TokenText {
 public:
  std::string piece(int32_t) const override { return "x"; }
  bool is_eog(int32_t) const override { return false; }
};

// A greedy request: temperature 0 and every other sampler off, so the tokens are the argmax.
inline GenParams greedy_request(std::vector<int32_t> prompt, int max_tokens, std::string id = "r") {
  GenParams p;
  p.id = std::move(id);
  p.prompt = std::move(prompt);
  p.max_tokens = max_tokens;
  p.sampling.temperature = 0;
  p.sampling.top_k = 0;
  p.sampling.top_p = 1;
  p.sampling.min_p = 0;
  return p;
}

// Steps `s` until every request has ended. Each request's events go to on_event(k, event) in order, and
// on_done(k) runs once when request k has ended. A request that has not ended within max_steps steps is
// a test failure (false).
inline bool step_until_done(Scheduler& s, const std::vector<std::shared_ptr<Request>>& reqs,
                            const std::function<void(size_t, Event&)>& on_event, int max_steps = 20000,
                            const std::function<void(size_t)>& on_done = {}) {
  std::vector<bool> done(reqs.size(), false);
  for (int step = 0;; ++step) {
    bool all = true;
    for (size_t k = 0; k < reqs.size(); ++k) {
      if (done[k]) continue;
      std::vector<Event> events;
      done[k] = reqs[k]->poll(events, std::chrono::milliseconds(0));
      for (Event& e : events) on_event(k, e);
      if (done[k] && on_done) on_done(k);
      all = all && done[k];
    }
    if (all) return true;
    if (step == max_steps) break;
    s.step();
  }
  ADD_FAILURE() << "requests did not finish within " << max_steps << " steps";
  return false;
}

// The tokens of each request's first choice, every request expected to end without an error.
inline std::vector<std::vector<int32_t>> tokens_of(Scheduler& s, const std::vector<std::shared_ptr<Request>>& reqs,
                                                   std::vector<Timings>* timings = nullptr) {
  std::vector<std::vector<int32_t>> out(reqs.size());
  step_until_done(s, reqs, [&](size_t k, Event& e) {
    EXPECT_NE(e.finish, Finish::Error) << e.error;
    if (e.choice == 0) out[k].insert(out[k].end(), e.tokens.begin(), e.tokens.end());
  });
  if (timings)
    for (const auto& r : reqs) timings->push_back(r->timings());
  return out;
}

}  // namespace roofline::serve::test
