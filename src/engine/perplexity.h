// Perplexity and KL divergence with llama-perplexity's meaning: the text tokenized once (BOS as the
// vocabulary asks), cut into windows of n_ctx tokens whose first token becomes BOS, the second half of
// each window scored. The .kld file (--kl-divergence-base) stores the tokens and every scored row's
// log-probabilities as llama.cpp lays them out, so files move between the two tools.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/engine.h"
#include "tokenizer/tokenizer.h"

namespace roofline {

// The whole text as llama-perplexity tokenizes it: special tokens added (BOS), not parsed from text.
std::vector<int32_t> perplexity_tokens(const Tokenizer& tokenizer, std::string_view text);

// -log p(token) from one row of logits (llama.cpp's arithmetic: float logits, double sum of exps).
double token_nll(const float* logits, int n_vocab, int32_t token);

// One row of a .kld file: [scale f32, min_log_prob f32, n_vocab u16, padding] = kld_row_values(n_vocab) u16.
int kld_row_values(int n_vocab);
// Fills `row` from logits and returns -log p(token).
double encode_kld_row(const float* logits, int n_vocab, int32_t token, uint16_t* row);

// Evaluates windows of the token stream: for window w (tokens [w*n_ctx, (w+1)*n_ctx)), the logits of
// positions first..n_ctx-2 (the rows that predict tokens first+1..n_ctx-1), several windows per
// forward step when the engine's batch allows. The window's first token is replaced by `bos` when >= 0.
class WindowEvaluator {
 public:
  // Which rows' logits eval() returns: the scored ones, every row of the window, or none.
  enum class Rows { Scored, All, None };
  WindowEvaluator(Engine& engine, int n_ctx, int32_t bos, Rows rows = Rows::Scored);
  int n_ctx() const { return n_ctx_; }
  int first() const { return n_ctx_ / 2; }
  int scored() const { return n_ctx_ - 1 - first(); }  // rows scored per window
  int windows_per_step() const { return n_seq_; }
  int rows_returned() const { return rows_ == Rows::Scored ? scored() : rows_ == Rows::All ? n_ctx_ : 0; }
  // Logits of windows [w0, w0+n) of `tokens`: [n][rows_returned()][n_vocab].
  std::vector<float> eval(const std::vector<int32_t>& tokens, int w0, int n);

 private:
  Engine& engine_;
  int n_ctx_;
  int32_t bos_;
  Rows rows_;
  int n_seq_;
};

struct PerplexityOptions {
  int n_ctx = 512;
  int n_chunks = -1;  // -1: every whole window
  int n_threads = 0;  // for the log-softmax work (0: all cores)
  std::string kld_base_path;  // non-empty: save llama.cpp's .kld file of log-probabilities here
  // After each window: its 1-based index, the window count and the running perplexity.
  std::function<void(int chunk, int n_chunk, double ppl)> on_chunk;
};

struct PerplexityResult {
  int n_chunk = 0;
  int64_t count = 0;  // tokens scored
  double nll = 0, nll2 = 0;  // sums of -log p and its square
  double ppl = 0, ppl_err = 0;
  double seconds = 0;
};

// Throws Error when the text is shorter than two windows (as llama-perplexity refuses it).
PerplexityResult compute_perplexity(Engine& engine, const Tokenizer& tokenizer, std::vector<int32_t> tokens,
                                    const PerplexityOptions& options);

// A .kld file being read: header (n_ctx, n_vocab, n_chunk, tokens), then one chunk of rows at a time.
class KldReader {
 public:
  explicit KldReader(const std::string& path);  // throws Error with one line on a bad or short file
  ~KldReader();
  KldReader(const KldReader&) = delete;
  KldReader& operator=(const KldReader&) = delete;
  int n_ctx() const { return n_ctx_; }
  int n_vocab() const { return n_vocab_; }
  int n_chunk() const { return n_chunk_; }
  const std::vector<int32_t>& tokens() const { return tokens_; }
  // Reads the next chunk's (n_ctx - 1 - n_ctx/2) rows of kld_row_values(n_vocab) values.
  void read_chunk(std::vector<uint16_t>& rows);

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
  int n_ctx_ = 0, n_vocab_ = 0, n_chunk_ = 0, chunks_read_ = 0;
  std::vector<int32_t> tokens_;
};

// Running sums of the comparison against a base, as llama.cpp keeps them.
struct KldStats {
  double sum_nll = 0, sum_nll2 = 0, sum_nll_base = 0, sum_nll_base2 = 0, sum_nll_nll_base = 0;
  double sum_kld = 0, sum_kld2 = 0, sum_p_diff = 0, sum_p_diff2 = 0, sum_p_diff4 = 0;
  float max_p_diff = 0;
  int64_t n_same_top = 0, count = 0;
  std::vector<float> kld_values, p_diff_values;  // per scored token, in order

  void add_row(const float* logits, int n_vocab, const uint16_t* base_row, int32_t token);
  // llama.cpp's per-chunk line: chunk, PPL, ln(PPL(Q)/PPL(base)), KLD, RMS Δp, same top p.
  std::string chunk_line(int chunk) const;
  // The closing statistics (perplexity, KL divergence, token probability), one string per line.
  std::vector<std::string> report() const;
  double mean_kld() const;
  double same_top_fraction() const;
};

struct KlDivergenceOptions {
  int n_threads = 0;
  int n_chunks = -1;
  std::function<void(int chunk, int n_chunk, const KldStats& stats)> on_chunk;
};

// Runs the tokens stored in `base` through the engine and compares with the stored log-probabilities.
// Throws Error when the vocabulary size differs.
KldStats compute_kl_divergence(Engine& engine, const Tokenizer& tokenizer, KldReader& base, const KlDivergenceOptions& options);

}  // namespace roofline
