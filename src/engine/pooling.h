// Embeddings from a causal model, as llama.cpp computes them: each prompt token's final hidden state
// (after the output norm, what the output matrix would read; Engine BatchRow::want_hidden) pooled
// over the prompt (--pooling: none keeps one vector per token, mean averages them, cls takes the
// first token's, last the last one's), then normalised as llama-server's embd_normalize does
// (2, the default: Euclidean / L2; only pooled vectors are normalised).
#pragma once

#include <string>
#include <vector>

#include "model/model.h"

namespace roofline {

enum class Pooling { None, Mean, Cls, Last };

// "none", "mean", "cls", "last" (Error for anything else; "rank" needs a reranker head).
Pooling parse_pooling(const std::string& name);
const char* pooling_name(Pooling p);
// What llama.cpp uses when --pooling is not given: the model's `<arch>.pooling_type` key (llama.cpp's
// numbering: 0 none, 1 mean, 2 cls, 3 last), and none without it (generative models have none).
Pooling model_default_pooling(const Model& model);

// Divides `v` by its norm, as llama-server's embd_normalize: -1 none, 0 max absolute value scaled to
// the int16 range, 1 taxicab, 2 Euclidean (the default), p > 2 the p-norm. A zero vector stays zero.
void normalize_embedding(std::vector<float>& v, int norm);

// One prompt's embedding, fed the final hidden states of the prompt positions it wants, in any order.
class PromptPooler {
 public:
  PromptPooler(Pooling pooling, int n_tokens, int n_embd);
  // Whether position i (0-based in the prompt) is pooled: every one for none and mean, the first
  // for cls, the last for last.
  bool wants(int i) const;
  void add(int i, const float* hidden);
  // Every wanted position has been added.
  bool complete() const { return n_added_ == n_wanted_; }
  // One vector (mean, cls, last), normalised with `norm`; or one per token (none), as they are.
  std::vector<std::vector<float>> result(int norm) const;

 private:
  Pooling pooling_;
  int n_tokens_, n_embd_;
  int n_wanted_, n_added_ = 0;
  std::vector<double> sum_;                 // mean: the running sum
  std::vector<std::vector<float>> rows_;    // none: per token; cls, last: the one row
  std::vector<bool> seen_;
};

}  // namespace roofline
