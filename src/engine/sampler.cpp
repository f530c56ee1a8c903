// The sampler chain. Candidates are sorted with a total order (logit, then token id) so ties never
// depend on the standard library's sort.
#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_map>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "core/error.h"

namespace roofline {

namespace {
bool history_penalties_apply(const SamplingParams& p, const std::vector<int32_t>& history) {
  const bool any = p.repeat_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f;
  return any && p.repeat_last_n != 0 && !history.empty();
}
}  // namespace

bool penalties_apply(const SamplingParams& p, const std::vector<int32_t>& history) {
  return !p.logit_bias.empty() || history_penalties_apply(p, history);
}

bool greedy_from_raw_logits(const SamplingParams& p) {
  const bool any = p.repeat_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f;
  return p.temperature <= 0 && p.logit_bias.empty() && (!any || p.repeat_last_n == 0);
}

// Four SSE2 compares where the target has them (every x86-64), else one at a time.
bool any_above16(const float* p, float t) {
#if defined(__SSE2__)
  const __m128 tv = _mm_set1_ps(t);
  const __m128 a = _mm_or_ps(_mm_cmpgt_ps(_mm_loadu_ps(p), tv), _mm_cmpgt_ps(_mm_loadu_ps(p + 4), tv));
  const __m128 b = _mm_or_ps(_mm_cmpgt_ps(_mm_loadu_ps(p + 8), tv), _mm_cmpgt_ps(_mm_loadu_ps(p + 12), tv));
  return _mm_movemask_ps(_mm_or_ps(a, b)) != 0;
#else
  bool any = false;
  for (int j = 0; j < 16; ++j) any |= p[j] > t;
  return any;
#endif
}

int32_t argmax_logits(const float* x, int n) {
  const float x0 = x[0];
  if (x0 != x0) return 0;  // a NaN first: the scalar scan never moves off it
  // Pass 1: the largest value (NaNs skipped: a comparison with one is false), in 16 independent
  // lanes the compiler turns into SIMD max instructions.
  constexpr int kLanes = 16;
  float m[kLanes];
  for (float& v : m) v = x0;
  int i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) m[j] = x[i + j] > m[j] ? x[i + j] : m[j];
  float mx = x0;
  for (int j = 0; j < kLanes; ++j) mx = m[j] > mx ? m[j] : mx;
  for (; i < n; ++i) mx = x[i] > mx ? x[i] : mx;
  // Pass 2: its first occurrence (the scalar scan stops moving at the first value equal to the max).
  for (int k = 0; k < n; ++k)
    if (x[k] == mx) return k;
  return 0;
}

int32_t argmax_allowed(const float* logits, int n, const uint64_t* allowed) {
  int32_t best = -1;
  float best_v = -std::numeric_limits<float>::infinity();
  for (int w = 0, words = (n + 63) / 64; w < words; ++w) {
    const uint64_t bits = allowed[w];
    if (bits == 0) continue;
    const int base = w * 64;
    if (bits == ~0ull && base + 64 <= n) {  // a whole word allowed: its max first (vectorised)
      float mx = logits[base];
      for (int i = 1; i < 64; ++i) mx = logits[base + i] > mx ? logits[base + i] : mx;
      if (!(mx > best_v)) continue;
      for (int i = 0; i < 64; ++i)
        if (logits[base + i] == mx) {
          best = base + i, best_v = mx;
          break;
        }
      continue;
    }
    for (uint64_t b = bits; b != 0; b &= b - 1) {
      const int32_t t = base + __builtin_ctzll(b);
      if (t < n && logits[t] > best_v) best = t, best_v = logits[t];
    }
  }
  return best;
}

void apply_penalties(std::vector<float>& logits, const SamplingParams& p, const std::vector<int32_t>& history) {
  const int n_vocab = (int)logits.size();
  for (const auto& [token, bias] : p.logit_bias)
    if (token >= 0 && token < n_vocab) logits[token] += bias;
  if (!history_penalties_apply(p, history)) return;
  const size_t window = p.repeat_last_n < 0 ? history.size() : std::min(history.size(), (size_t)p.repeat_last_n);
  std::unordered_map<int32_t, int> counts;
  for (size_t i = history.size() - window; i < history.size(); ++i) counts[history[i]]++;
  for (const auto& [token, count] : counts) {
    if (token < 0 || token >= n_vocab) continue;
    float& l = logits[token];
    if (p.repeat_penalty != 1.0f) l = l > 0 ? l / p.repeat_penalty : l * p.repeat_penalty;
    l -= (float)count * p.frequency_penalty + (count > 0 ? p.presence_penalty : 0.0f);
  }
}

Sampler::Sampler(const SamplingParams& params, int n_vocab) : params_(params), n_vocab_(n_vocab) {
  if (n_vocab <= 0) fail("sampler needs a vocabulary");
  if (std::isnan(params.temperature) || std::isnan(params.top_p) || std::isnan(params.min_p) ||
      std::isnan(params.typical_p) || std::isnan(params.repeat_penalty))
    fail("sampling parameters must be numbers");
  if (params.repeat_penalty <= 0) fail("repeat_penalty must be positive");
  if (params_.temperature < 0) params_.temperature = 0;  // negative means greedy, as in llama.cpp
  seed_ = params.seed;
  if (seed_ == 0xFFFFFFFFu) seed_ = std::random_device{}();
  rng_.seed(seed_);
}

SampledToken Sampler::sample(const float* logits, const std::vector<int32_t>& history) {
  // Greedy without bias or penalties: the argmax of the row as it is (no copy of the vocabulary).
  const bool penalties = penalties_apply(params_, history);
  if (params_.temperature <= 0 && !penalties) return {argmax_logits(logits, n_vocab_), 1.0f};
  const float* row = logits;  // the logits the chain sees: copied only where penalties change them
  if (penalties) {
    adjusted_.assign(logits, logits + n_vocab_);
    apply_penalties(adjusted_, params_, history);
    row = adjusted_.data();
  }

  if (params_.temperature <= 0) return {argmax_logits(row, n_vocab_), 1.0f};

  // Candidates sorted by logit (descending), ties by token id.
  auto better = [](const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  };
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  candidates_.clear();
  if (params_.top_k > 0 && params_.top_k < n_vocab_) {
    // The top k in one pass (a server samples 64 rows of a 152k vocabulary a step; building and partially
    // sorting every candidate took ~0.4 ms a row): a heap whose front is the worst kept. Ids come in
    // ascending order, so a logit equal to the worst kept one is never better than it.
    const size_t k = (size_t)params_.top_k;
    int32_t i = 0;
    for (; i < n_vocab_ && candidates_.size() < k; ++i) {
      const float v = row[i];
      if (!(v > kNegInf)) continue;
      candidates_.push_back({v, i});
      std::push_heap(candidates_.begin(), candidates_.end(), better);
    }
    // Full: a logit enters only above the worst kept one (> -inf, so -inf and NaN never do). Blocks of 16
    // with none above it are passed over by four vector compares (most of a row once the heap holds good
    // candidates); the others take the same steps, in id order, as one at a time.
    const auto offer = [&](int32_t id) {
      const float v = row[id];
      if (!(v > candidates_.front().first)) return;
      std::pop_heap(candidates_.begin(), candidates_.end(), better);
      candidates_.back() = {v, id};
      std::push_heap(candidates_.begin(), candidates_.end(), better);
    };
    constexpr int32_t kBlock = 16;  // any_above16's width
    if (candidates_.size() == k) {
      for (; i + kBlock <= n_vocab_; i += kBlock) {
        const float worst = candidates_.front().first;
        if (any_above16(row + i, worst))
          for (int32_t j = 0; j < kBlock; ++j) offer(i + j);
      }
      for (; i < n_vocab_; ++i) offer(i);
    }
    std::sort_heap(candidates_.begin(), candidates_.end(), better);
  } else {
    for (int32_t i = 0; i < n_vocab_; ++i)
      if (row[i] > kNegInf) candidates_.push_back({row[i], i});
    std::sort(candidates_.begin(), candidates_.end(), better);
  }
  size_t n = candidates_.size();
  if (n == 0) return {0, 0.0f};
  // Softmax at temperature 1 for typical, top-p and min-p (llama.cpp applies temperature last).
  std::vector<double> prob(n);
  double mx = candidates_[0].first;
  auto softmax = [&] {
    double sum = 0;
    for (size_t i = 0; i < n; ++i) sum += prob[i] = std::exp((double)candidates_[i].first - mx);
    for (size_t i = 0; i < n; ++i) prob[i] /= sum;
  };
  softmax();
  if (params_.typical_p < 1.0f && n > 1) {
    // Locally typical (llama.cpp's typical sampler): keep the tokens whose surprise -log p is closest to
    // the entropy, until their probabilities add up to more than typical_p; then by logit again.
    double entropy = 0;
    for (size_t i = 0; i < n; ++i)
      if (prob[i] > 0) entropy -= prob[i] * std::log(prob[i]);
    std::vector<size_t> order(n);
    for (size_t i = 0; i < n; ++i) order[i] = i;
    auto shift = [&](size_t i) { return prob[i] > 0 ? std::fabs(-std::log(prob[i]) - entropy) : HUGE_VAL; };
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return shift(a) < shift(b); });
    size_t keep = n;
    double cum = 0;
    for (size_t i = 0; i < n; ++i) {
      cum += prob[order[i]];
      if (cum > params_.typical_p) {
        keep = i + 1;
        break;
      }
    }
    std::vector<std::pair<float, int32_t>> kept;
    for (size_t i = 0; i < keep; ++i) kept.push_back(candidates_[order[i]]);
    std::sort(kept.begin(), kept.end(), better);
    std::copy(kept.begin(), kept.end(), candidates_.begin());
    n = keep;
    mx = candidates_[0].first;
    softmax();  // over the kept tokens, as llama.cpp's next sampler sees them
  }
  if (params_.top_p < 1.0f) {
    double cum = 0;
    size_t keep = n;
    for (size_t i = 0; i < n; ++i) {
      cum += prob[i];
      if (cum >= params_.top_p) {
        keep = i + 1;
        break;
      }
    }
    n = std::max<size_t>(1, keep);
  }
  if (params_.min_p > 0.0f) {
    const double threshold = prob[0] * params_.min_p;
    size_t keep = 1;
    while (keep < n && prob[keep] >= threshold) ++keep;
    n = keep;
  }
  // Temperature, then the draw.
  std::vector<double> w(n);
  double wsum = 0;
  for (size_t i = 0; i < n; ++i) wsum += w[i] = std::exp(((double)candidates_[i].first - mx) / params_.temperature);
  std::uniform_real_distribution<double> uniform(0.0, wsum);
  const double u = uniform(rng_);
  double cum = 0;
  for (size_t i = 0; i < n; ++i) {
    cum += w[i];
    if (u < cum) return {candidates_[i].second, (float)(w[i] / wsum)};
  }
  return {candidates_[n - 1].second, (float)(w[n - 1] / wsum)};
}

}  // namespace roofline
