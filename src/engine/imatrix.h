// Importance matrices as llama-imatrix makes them: for every weight matrix, the sum of squared input
// activations per column and the number of rows summed, collected from the engine's matmul observer
// over a calibration text. Read and written in llama.cpp's GGUF imatrix format and its legacy .dat
// format, so files move between the two tools; quantize uses the per-column means.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/quantize.h"

namespace roofline {

class Engine;
class Tokenizer;

enum class ImatrixFormat { Gguf, Dat };

struct ImatrixEntry {
  std::vector<double> sums;     // n_cols * n_mat sums of x^2 (GGUF: <name>.in_sum2)
  std::vector<int64_t> counts;  // n_mat rows accumulated   (GGUF: <name>.counts)
  int64_t n_cols() const { return counts.empty() ? 0 : (int64_t)(sums.size() / counts.size()); }
};

class Imatrix {
 public:
  explicit Imatrix(int chunk_size = 512) : chunk_size_(chunk_size) {}

  // Adds n_rows input rows of a dense matrix (thread-safe).
  void add(const std::string& name, const float* x, int n_rows, int64_t n_cols);
  // Adds the n_rows input rows routed to expert `expert` of a stacked tensor of n_expert matrices (one
  // count per expert, as llama-imatrix keeps them; thread-safe).
  void add_expert(const std::string& name, int expert, int n_expert, const float* x, int n_rows, int64_t n_cols);
  // Adds another imatrix's sums and counts (same shapes required); keeps its datasets.
  void merge(const Imatrix& other);

  const std::map<std::string, ImatrixEntry>& entries() const { return entries_; }
  std::map<std::string, ImatrixEntry>& entries() { return entries_; }
  const std::vector<std::string>& datasets() const { return datasets_; }
  void add_dataset(const std::string& name) { datasets_.push_back(name); }
  int chunk_size() const { return chunk_size_; }
  int chunk_count() const;  // chunks of chunk_size rows behind the most-fed entry
  void set_chunk_count(int n) { chunk_count_ = n; }

  // Loads either format (GGUF by its magic, else legacy .dat); chunk_size guesses what a legacy file
  // does not store. Throws Error with one line for a missing, corrupt or non-imatrix file.
  static Imatrix load(const std::string& path, int chunk_size = 512);
  // Writes through a temporary file renamed at the end.
  void save(const std::string& path, ImatrixFormat format) const;

  // The per-column means the quantizer weights its error with (count 0: ones).
  ImportanceData importance(const std::string& file) const;

 private:
  static Imatrix load_gguf(const std::string& path, int chunk_size);
  static Imatrix load_dat(const std::string& path, int chunk_size);
  void save_gguf(const std::string& path) const;
  void save_dat(const std::string& path) const;

  int chunk_size_;
  int chunk_count_ = -1;  // -1: derived from the counts
  std::map<std::string, ImatrixEntry> entries_;
  std::vector<std::string> datasets_;
  std::unique_ptr<std::mutex> mutex_ = std::make_unique<std::mutex>();
};

// An observer for Engine::set_matmul_observer that feeds `imatrix` the way llama-imatrix collects:
// only products of at least 16 rows, only blk.* weights (and output.weight when process_output).
Backend::MatmulObserver imatrix_observer(Imatrix& imatrix, bool process_output);

struct ImatrixRunOptions {
  int n_ctx = 512;
  int n_chunks = -1;           // -1: every whole window
  bool process_output = false;
  bool compute_ppl = true;
  int n_threads = 0;
  // After each window: 1-based index, count, running perplexity (0 when not computed), seconds so far.
  std::function<void(int chunk, int n_chunk, double ppl, double seconds)> on_chunk;
};

struct ImatrixRunResult {
  int n_chunk = 0;
  double ppl = 0;
  double seconds = 0;
};

// Runs the text through the engine in windows of n_ctx tokens (BOS first, as llama-imatrix does)
// and collects into `imatrix`. Throws Error when the text is shorter than two windows.
ImatrixRunResult collect_imatrix(Engine& engine, const Tokenizer& tokenizer, const std::vector<int32_t>& tokens,
                                 Imatrix& imatrix, const ImatrixRunOptions& options);

}  // namespace roofline
