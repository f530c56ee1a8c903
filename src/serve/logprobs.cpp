// Token log-probabilities for `logprobs` / `n_probs`: the log-softmax of the raw logits at the sampled
// token and the most likely tokens (declared in scheduler.h beside TokenLogprob).
#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "serve/scheduler.h"

namespace roofline::serve {

TokenLogprob compute_logprobs(const float* logits, int n_vocab, int32_t token, int k) {
  float mx = -std::numeric_limits<float>::infinity();
  for (int i = 0; i < n_vocab; ++i) mx = std::max(mx, logits[i]);
  double sum = 0;
  for (int i = 0; i < n_vocab; ++i) sum += std::exp((double)logits[i] - mx);
  const double lse = mx + std::log(sum);
  TokenLogprob out;
  out.token = token;
  out.logprob = (float)((double)logits[token] - lse);
  k = std::min(k, n_vocab);
  if (k > 0) {
    std::vector<std::pair<float, int32_t>> top;  // kept sorted, best first
    top.reserve(k + 1);
    for (int i = 0; i < n_vocab; ++i) {
      const float l = logits[i];
      if ((int)top.size() == k && l <= top.back().first) continue;
      auto pos = std::upper_bound(top.begin(), top.end(), std::make_pair(l, (int32_t)i),
                                  [](const auto& a, const auto& b) { return a.first != b.first ? a.first > b.first : a.second < b.second; });
      top.insert(pos, {l, (int32_t)i});
      if ((int)top.size() > k) top.pop_back();
    }
    for (const auto& [l, id] : top) out.top.push_back({id, (float)((double)l - lse)});
  }
  return out;
}

}  // namespace roofline::serve
