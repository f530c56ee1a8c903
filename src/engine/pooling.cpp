// Pooling and normalisation of prompt embeddings (pooling.h).
#include "engine/pooling.h"

#include <cmath>

#include "core/error.h"

namespace roofline {

Pooling parse_pooling(const std::string& name) {
  if (name == "none") return Pooling::None;
  if (name == "mean") return Pooling::Mean;
  if (name == "cls") return Pooling::Cls;
  if (name == "last") return Pooling::Last;
  if (name == "rank") fail("--pooling rank: reranking needs a model with a classification head; use none, mean, cls or last");
  fail("--pooling '{}': use none, mean, cls or last", name);
}

const char* pooling_name(Pooling p) {
  switch (p) {
    case Pooling::None: return "none";
    case Pooling::Mean: return "mean";
    case Pooling::Cls: return "cls";
    case Pooling::Last: return "last";
  }
  return "?";
}

Pooling model_default_pooling(const Model& model) {
  const gguf::Metadata& md = model.metadata();
  const std::string arch = md.get_string_or("general.architecture", "");
  const int64_t v = md.get_int_or(arch + ".pooling_type", 0);
  switch (v) {
    case 1: return Pooling::Mean;
    case 2: return Pooling::Cls;
    case 3: return Pooling::Last;
    default: return Pooling::None;  // 0 (none), -1 (unspecified), 4 (rank: no classification head here)
  }
}

void normalize_embedding(std::vector<float>& v, int norm) {
  double sum = 0.0;
  if (norm == -1 || norm < -1) {
    sum = 1.0;
  } else if (norm == 0) {
    for (float x : v) sum = std::max(sum, (double)std::fabs(x));
    sum /= 32760.0;
  } else if (norm == 2) {
    for (float x : v) sum += (double)x * x;
    sum = std::sqrt(sum);
  } else {
    for (float x : v) sum += std::pow(std::fabs((double)x), norm);
    sum = std::pow(sum, 1.0 / norm);
  }
  const double scale = sum > 0.0 ? 1.0 / sum : 0.0;
  for (float& x : v) x = (float)(x * scale);
}

PromptPooler::PromptPooler(Pooling pooling, int n_tokens, int n_embd)
    : pooling_(pooling), n_tokens_(n_tokens), n_embd_(n_embd), seen_((size_t)n_tokens, false) {
  ROOFLINE_CHECK(n_tokens > 0 && n_embd > 0);
  n_wanted_ = pooling == Pooling::None || pooling == Pooling::Mean ? n_tokens : 1;
  if (pooling == Pooling::Mean) sum_.assign((size_t)n_embd, 0.0);
  if (pooling == Pooling::None) rows_.resize((size_t)n_tokens);
  else if (pooling != Pooling::Mean) rows_.resize(1);
}

bool PromptPooler::wants(int i) const {
  switch (pooling_) {
    case Pooling::None:
    case Pooling::Mean: return i >= 0 && i < n_tokens_;
    case Pooling::Cls: return i == 0;
    case Pooling::Last: return i == n_tokens_ - 1;
  }
  return false;
}

void PromptPooler::add(int i, const float* hidden) {
  ROOFLINE_CHECK(wants(i) && !seen_[(size_t)i], "position {} added twice or not pooled", i);
  seen_[(size_t)i] = true;
  ++n_added_;
  if (pooling_ == Pooling::Mean) {
    for (int k = 0; k < n_embd_; ++k) sum_[(size_t)k] += hidden[k];
    return;
  }
  rows_[pooling_ == Pooling::None ? (size_t)i : 0].assign(hidden, hidden + n_embd_);
}

std::vector<std::vector<float>> PromptPooler::result(int norm) const {
  ROOFLINE_CHECK(complete(), "the embedding of a prompt was asked for before every position was pooled");
  if (pooling_ == Pooling::None) return rows_;
  std::vector<float> v;
  if (pooling_ == Pooling::Mean) {
    v.resize((size_t)n_embd_);
    for (int k = 0; k < n_embd_; ++k) v[(size_t)k] = (float)(sum_[(size_t)k] / n_tokens_);
  } else {
    v = rows_[0];
  }
  normalize_embedding(v, norm);
  return {std::move(v)};
}

}  // namespace roofline
