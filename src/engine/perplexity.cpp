// Perplexity and KL divergence over windows of a token stream, scored and stored as llama-perplexity
// does (same windows, same BOS rule, same .kld layout and statistics), with the forward passes batched
// over several windows and the per-row log-softmax work spread over a thread pool.
#include "engine/perplexity.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "core/thread_pool.h"

namespace roofline {
namespace {

constexpr char kKldMagic[8] = {'_', 'l', 'o', 'g', 'i', 't', 's', '_'};

struct RowMax {
  float max;
  int arg;
};
RowMax row_max(const float* logits, int n_vocab) {
  RowMax m{logits[0], 0};
  for (int i = 1; i < n_vocab; ++i)
    if (logits[i] > m.max) m = {logits[i], i};
  return m;
}
double sum_exp(const float* logits, int n_vocab, float max) {
  double s = 0;
  for (int i = 0; i < n_vocab; ++i) s += std::exp(logits[i] - max);
  return s;
}

// The per-token quantities of a comparison against a stored base row.
struct KldRow {
  double nll, nll_base, kld;
  float p_diff;
  bool same_top;
};

KldRow compare_row(const float* logits, int n_vocab, const uint16_t* base, int32_t token) {
  const RowMax m = row_max(logits, n_vocab);
  const float log_sum = (float)std::log(sum_exp(logits, n_vocab, m.max));
  float scale, min_log_prob;
  std::memcpy(&scale, base, 4);
  std::memcpy(&min_log_prob, base + 2, 4);
  const uint16_t* q = base + 4;
  KldRow r;
  const float nll = m.max + log_sum - logits[token];
  const float nll_base = -(scale * q[token] + min_log_prob);
  r.nll = nll;
  r.nll_base = nll_base;
  // KL(base || this) over the tokens the base gives a log-probability above -16.
  const float log_norm = m.max + log_sum;
  double kld = 0;
  int arg_base = 0;
  float best_base = 0;
  for (int i = 0; i < n_vocab; ++i) {
    const float lp_base = scale * q[i] + min_log_prob;
    if (i == 0 || lp_base > best_base) {
      best_base = lp_base;
      arg_base = i;
    }
    if (lp_base > -16.f) kld += std::exp(lp_base) * (lp_base - logits[i] + log_norm);
  }
  r.kld = kld;
  r.same_top = arg_base == m.arg;
  r.p_diff = std::exp(-nll) - std::exp(-nll_base);
  return r;
}

void accumulate(KldStats& s, const KldRow& r) {
  s.sum_nll += r.nll;
  s.sum_nll2 += r.nll * r.nll;
  s.sum_nll_base += r.nll_base;
  s.sum_nll_base2 += r.nll_base * r.nll_base;
  s.sum_nll_nll_base += r.nll * r.nll_base;
  s.sum_kld += r.kld;
  s.sum_kld2 += r.kld * r.kld;
  s.sum_p_diff += r.p_diff;
  const double p2 = (double)r.p_diff * r.p_diff;
  s.sum_p_diff2 += p2;
  s.sum_p_diff4 += p2 * p2;
  s.max_p_diff = std::max(s.max_p_diff, std::fabs(r.p_diff));
  s.n_same_top += r.same_top;
  ++s.count;
  s.kld_values.push_back((float)r.kld);
  s.p_diff_values.push_back(r.p_diff);
}

std::pair<double, double> mean_and_error(double sum, double sum2, int64_t count) {
  if (count < 1) return {0, 0};
  const double f = sum / count;
  double df = sum2 / count - f * f;
  df = df > 0 && count > 10 ? std::sqrt(df / (count - 1)) : 0.0;
  return {f, df};
}
double covariance(double a, double b, double ab, int64_t count) {
  if (count < 10) return 0;
  return (ab / count - (a / count) * (b / count)) / (count - 1);
}
float percentile(const std::vector<float>& sorted, float fraction) {
  if (fraction <= 0) return sorted.front();
  if (fraction >= 1) return sorted.back();
  float p = fraction * (sorted.size() - 1);
  const size_t i = (size_t)p;
  p -= i;
  return (1 - p) * sorted[i] + p * sorted[std::min(i + 1, sorted.size() - 1)];
}
float median(const std::vector<float>& sorted) {
  const size_t n = sorted.size();
  return n % 2 == 0 ? 0.5f * (sorted[n / 2] + sorted[n / 2 - 1]) : sorted[n / 2];
}

void write_all(std::FILE* f, const void* data, size_t n, const std::string& path) {
  if (n && std::fwrite(data, 1, n, f) != n) fail("{}: write failed ({})", path, std::strerror(errno));
}

}  // namespace

std::vector<int32_t> perplexity_tokens(const Tokenizer& tokenizer, std::string_view text) {
  return tokenizer.encode(text, true, false);
}

double token_nll(const float* logits, int n_vocab, int32_t token) {
  const RowMax m = row_max(logits, n_vocab);
  return -(logits[token] - m.max - std::log(sum_exp(logits, n_vocab, m.max)));
}

int kld_row_values(int n_vocab) { return 2 * ((n_vocab + 1) / 2) + 4; }

double encode_kld_row(const float* logits, int n_vocab, int32_t token, uint16_t* row) {
  float max = logits[0], min = logits[0];
  for (int i = 1; i < n_vocab; ++i) {
    max = std::max(max, logits[i]);
    min = std::min(min, logits[i]);
  }
  min = std::max(min, max - 16);  // log-probabilities below max-16 are stored as the floor
  const float log_sum = (float)std::log(sum_exp(logits, n_vocab, max));
  const float min_log_prob = min - max - log_sum;
  const float scale = (max - min) / 65535.f;
  std::memcpy(row, &scale, 4);
  std::memcpy(row + 2, &min_log_prob, 4);
  uint16_t* q = row + 4;
  const int nv = kld_row_values(n_vocab) - 4;
  std::fill(q, q + nv, 0);
  if (scale != 0) {
    const float inv = 1 / scale;
    for (int i = 0; i < n_vocab; ++i) q[i] = logits[i] > min ? (uint16_t)std::lrintf(inv * (logits[i] - min)) : 0;
  }
  return max + log_sum - logits[token];
}

WindowEvaluator::WindowEvaluator(Engine& engine, int n_ctx, int32_t bos, Rows rows)
    : engine_(engine), n_ctx_(n_ctx), bos_(bos), rows_(rows) {
  if (n_ctx < 4) fail("the context size {} is too small for perplexity (at least 4)", n_ctx);
  const EngineOptions& o = engine.options();
  if (n_ctx > o.n_ctx) fail("a window of {} tokens does not fit the engine's context of {}", n_ctx, o.n_ctx);
  const int blocks_per_window = (n_ctx + o.kv_block_size - 1) / o.kv_block_size;
  const int kv_windows = engine.memory().free_blocks() / blocks_per_window;
  n_seq_ = std::max(1, std::min({o.n_batch / n_ctx, kv_windows, engine.memory().free_sequences()}));
}

std::vector<float> WindowEvaluator::eval(const std::vector<int32_t>& tokens, int w0, int n) {
  const int n_vocab = engine_.n_vocab();
  const int first = this->first();
  const int n_batch = engine_.options().n_batch;
  std::vector<float> out;
  out.reserve((size_t)n * rows_returned() * n_vocab);
  std::vector<int> seqs;
  for (int k = 0; k < n; ++k) seqs.push_back(engine_.memory().create_sequence());
  try {
    std::vector<Engine::BatchRow> batch;
    auto flush = [&] {
      if (batch.empty()) return;
      std::vector<float> logits = engine_.decode(batch);
      out.insert(out.end(), logits.begin(), logits.end());
      batch.clear();
    };
    for (int k = 0; k < n; ++k) {
      const size_t base = (size_t)(w0 + k) * n_ctx_;
      for (int i = 0; i < n_ctx_; ++i) {
        int32_t token = tokens[base + i];
        if (i == 0 && bos_ >= 0) token = bos_;
        const bool want = rows_ == Rows::All || (rows_ == Rows::Scored && i >= first && i < n_ctx_ - 1);
        batch.push_back({seqs[k], token, want});
        if ((int)batch.size() == n_batch) flush();
      }
    }
    flush();
  } catch (...) {
    for (int s : seqs) engine_.memory().free_sequence(s);
    throw;
  }
  for (int s : seqs) engine_.memory().free_sequence(s);
  return out;
}

PerplexityResult compute_perplexity(Engine& engine, const Tokenizer& tokenizer, std::vector<int32_t> tokens,
                                    const PerplexityOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  const int n_ctx = o.n_ctx;
  if (n_ctx <= 0) fail("perplexity needs a context size above 0 (-c)");
  if (tokenizer.add_eos()) fail("the vocabulary adds EOS after every text; perplexity windows cannot be built as llama.cpp does");
  if (tokens.size() < (size_t)2 * n_ctx)
    fail("the text tokenizes to only {} tokens; a context of {} needs at least {}", tokens.size(), n_ctx, 2 * n_ctx);
  const int n_chunk_max = (int)(tokens.size() / n_ctx);
  const int n_chunk = o.n_chunks < 0 ? n_chunk_max : std::min(o.n_chunks, n_chunk_max);
  if (n_chunk <= 0) fail("--chunks {} leaves nothing to evaluate", o.n_chunks);
  const int n_vocab = engine.n_vocab();
  WindowEvaluator ev(engine, n_ctx, tokenizer.add_bos() ? tokenizer.bos() : -1);
  ThreadPool pool(o.n_threads > 0 ? o.n_threads : ThreadPool::default_thread_count());

  // The .kld file goes to a temporary name, renamed when complete.
  std::FILE* kld = nullptr;
  std::string kld_tmp;
  const int nv = kld_row_values(n_vocab);
  std::vector<uint16_t> rows;
  if (!o.kld_base_path.empty()) {
    kld_tmp = o.kld_base_path + ".tmp";
    kld = std::fopen(kld_tmp.c_str(), "wb");
    if (!kld) fail("{}: cannot write ({})", o.kld_base_path, std::strerror(errno));
    const int32_t header[3] = {n_ctx, n_vocab, n_chunk};
    write_all(kld, kKldMagic, 8, kld_tmp);
    write_all(kld, header, sizeof(header), kld_tmp);
    write_all(kld, tokens.data(), (size_t)n_chunk * n_ctx * sizeof(int32_t), kld_tmp);
  }
  auto cleanup = [&] {
    if (kld) std::fclose(kld);
    kld = nullptr;
  };

  PerplexityResult r;
  r.n_chunk = n_chunk;
  const int scored = ev.scored(), first = ev.first();
  std::vector<double> nll_rows((size_t)scored);
  try {
    for (int c = 0; c < n_chunk; c += ev.windows_per_step()) {
      const int n = std::min(ev.windows_per_step(), n_chunk - c);
      const std::vector<float> logits = ev.eval(tokens, c, n);
      for (int k = 0; k < n; ++k) {
        const float* wl = logits.data() + (size_t)k * scored * n_vocab;
        const int32_t* targets = tokens.data() + (size_t)(c + k) * n_ctx + first + 1;
        if (kld) rows.assign((size_t)scored * nv, 0);
        pool.parallel_for((size_t)scored, [&](size_t j) {
          const float* row = wl + j * n_vocab;
          nll_rows[j] = kld ? encode_kld_row(row, n_vocab, targets[j], rows.data() + j * nv)
                            : token_nll(row, n_vocab, targets[j]);
        });
        for (double v : nll_rows) {
          r.nll += v;
          r.nll2 += v * v;
        }
        r.count += scored;
        if (kld) write_all(kld, rows.data(), rows.size() * sizeof(uint16_t), kld_tmp);
        if (o.on_chunk) o.on_chunk(c + k + 1, n_chunk, std::exp(r.nll / r.count));
      }
    }
    if (kld) {
      if (std::fclose(kld) != 0) {
        kld = nullptr;
        fail("{}: write failed", kld_tmp);
      }
      kld = nullptr;
      std::filesystem::rename(kld_tmp, o.kld_base_path);
    }
  } catch (...) {
    cleanup();
    if (!kld_tmp.empty()) std::remove(kld_tmp.c_str());
    throw;
  }
  const double mean = r.nll / r.count;
  double var = r.nll2 / r.count - mean * mean;
  r.ppl = std::exp(mean);
  r.ppl_err = var > 0 && r.count > 1 ? std::sqrt(var / (r.count - 1)) * r.ppl : 0;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

KldReader::KldReader(const std::string& path) : path_(path) {
  file_ = std::fopen(path.c_str(), "rb");
  if (!file_) fail("{}: cannot open ({})", path, std::strerror(errno));
  char magic[8];
  int32_t header[3];
  if (std::fread(magic, 1, 8, file_) != 8 || std::memcmp(magic, kKldMagic, 8) != 0)
    fail("{}: not a file of log-probabilities (llama-perplexity --kl-divergence-base)", path);
  if (std::fread(header, sizeof(int32_t), 3, file_) != 3) fail("{}: truncated header", path);
  n_ctx_ = header[0];
  n_vocab_ = header[1];
  n_chunk_ = header[2];
  if (n_ctx_ < 4 || n_ctx_ > (1 << 22) || n_vocab_ < 1 || n_vocab_ > (1 << 24) || n_chunk_ < 1 || n_chunk_ > (1 << 24))
    fail("{}: implausible header (n_ctx {}, n_vocab {}, chunks {})", path, n_ctx_, n_vocab_, n_chunk_);
  const uint64_t rows = (uint64_t)n_chunk_ * (n_ctx_ - 1 - n_ctx_ / 2);
  const uint64_t expected = 20 + (uint64_t)n_chunk_ * n_ctx_ * 4 + rows * kld_row_values(n_vocab_) * 2;
  std::error_code ec;
  const uint64_t size = std::filesystem::file_size(path, ec);
  if (!ec && size != expected)
    fail("{}: {} bytes, but its header (n_ctx {}, n_vocab {}, {} chunks) needs {}: truncated or corrupt", path, size,
         n_ctx_, n_vocab_, n_chunk_, expected);
  tokens_.resize((size_t)n_chunk_ * n_ctx_);
  if (std::fread(tokens_.data(), sizeof(int32_t), tokens_.size(), file_) != tokens_.size()) fail("{}: truncated tokens", path);
  for (int32_t t : tokens_)
    if (t < 0 || t >= n_vocab_) fail("{}: token id {} is outside the vocabulary of {}", path, t, n_vocab_);
}

KldReader::~KldReader() {
  if (file_) std::fclose(file_);
}

void KldReader::read_chunk(std::vector<uint16_t>& rows) {
  if (chunks_read_ >= n_chunk_) fail("{}: no chunk left to read", path_);
  rows.resize((size_t)(n_ctx_ - 1 - n_ctx_ / 2) * kld_row_values(n_vocab_));
  if (std::fread(rows.data(), sizeof(uint16_t), rows.size(), file_) != rows.size())
    fail("{}: truncated at chunk {}", path_, chunks_read_ + 1);
  ++chunks_read_;
}

void KldStats::add_row(const float* logits, int n_vocab, const uint16_t* base_row, int32_t token) {
  accumulate(*this, compare_row(logits, n_vocab, base_row, token));
}

double KldStats::mean_kld() const { return mean_and_error(sum_kld, sum_kld2, count).first; }
double KldStats::same_top_fraction() const { return count ? (double)n_same_top / count : 0; }

std::string KldStats::chunk_line(int chunk) const {
  const auto lp = mean_and_error(sum_nll, sum_nll2, count);
  const auto lb = mean_and_error(sum_nll_base, sum_nll_base2, count);
  const double cov = covariance(sum_nll, sum_nll_base, sum_nll_nll_base, count);
  const double ratio_err = std::sqrt(std::max(0.0, lp.second * lp.second + lb.second * lb.second - 2 * cov));
  const auto kl = mean_and_error(sum_kld, sum_kld2, count);
  const auto mse = mean_and_error(sum_p_diff2, sum_p_diff4, count);
  const double rms = std::sqrt(mse.first), rms_err = rms > 0 ? 0.5 / rms * mse.second : 0;
  const double top = same_top_fraction(), top_err = count > 1 ? std::sqrt(top * (1 - top) / (count - 1)) : 0;
  return fmt::format("{:4d}    {:9.4f} ± {:9.4f}    {:10.5f} ± {:10.5f}    {:10.5f} ± {:10.5f}    {:6.3f} ± {:6.3f} %    {:6.3f} ± {:6.3f} %",
                     chunk, std::exp(lp.first), std::exp(lp.first) * lp.second, lp.first - lb.first, ratio_err, kl.first,
                     kl.second, 100 * rms, 100 * rms_err, 100 * top, 100 * top_err);
}

std::vector<std::string> KldStats::report() const {
  std::vector<std::string> out;
  if (count == 0) return out;
  std::vector<float> kv = kld_values, pv = p_diff_values;
  std::sort(kv.begin(), kv.end());
  std::sort(pv.begin(), pv.end());
  const auto lp = mean_and_error(sum_nll, sum_nll2, count);
  const auto lb = mean_and_error(sum_nll_base, sum_nll_base2, count);
  const double ppl = std::exp(lp.first), ppl_err = ppl * lp.second;
  const double ppl_base = std::exp(lb.first), ppl_base_err = ppl_base * lb.second;
  const double cov = covariance(sum_nll, sum_nll_base, sum_nll_nll_base, count);
  const double cor = lp.second * lb.second > 0 ? cov / (lp.second * lb.second) : 0;
  const double ratio = lp.first - lb.first;
  const double ratio_err = std::sqrt(std::max(0.0, lp.second * lp.second + lb.second * lb.second - 2 * cov));
  out.push_back("====== Perplexity statistics ======");
  out.push_back(fmt::format("Mean PPL(Q)                   : {:10.6f} ± {:10.6f}", ppl, ppl_err));
  out.push_back(fmt::format("Mean PPL(base)                : {:10.6f} ± {:10.6f}", ppl_base, ppl_base_err));
  out.push_back(fmt::format("Cor(ln(PPL(Q)), ln(PPL(base))): {:6.2f}%", 100 * cor));
  out.push_back(fmt::format("Mean ln(PPL(Q)/PPL(base))     : {:10.6f} ± {:10.6f}", ratio, ratio_err));
  out.push_back(fmt::format("Mean PPL(Q)/PPL(base)         : {:10.6f} ± {:10.6f}", std::exp(ratio), std::exp(ratio) * ratio_err));
  const double diff_err =
      std::sqrt(std::max(0.0, ppl_err * ppl_err + ppl_base_err * ppl_base_err - 2 * ppl * ppl_base * cov));
  out.push_back(fmt::format("Mean PPL(Q)-PPL(base)         : {:10.6f} ± {:10.6f}", ppl - ppl_base, diff_err));
  out.push_back("");
  out.push_back("====== KL divergence statistics ======");
  const auto kl = mean_and_error(sum_kld, sum_kld2, count);
  out.push_back(fmt::format("Mean    KLD: {:10.6f} ± {:10.6f}", kl.first, kl.second));
  out.push_back(fmt::format("Maximum KLD: {:10.6f}", kv.back()));
  const std::pair<const char*, float> kq[] = {{"99.9%", 0.999f}, {"99.0%", 0.99f}, {"95.0%", 0.95f}, {"90.0%", 0.9f}};
  for (auto [label, f] : kq) out.push_back(fmt::format("{}   KLD: {:10.6f}", label, percentile(kv, f)));
  out.push_back(fmt::format("Median  KLD: {:10.6f}", median(kv)));
  const std::pair<const char*, float> kl_low[] = {{"10.0%", 0.1f}, {" 5.0%", 0.05f}, {" 1.0%", 0.01f}, {" 0.1%", 0.001f}};
  for (auto [label, f] : kl_low) out.push_back(fmt::format("{}   KLD: {:10.6f}", label, percentile(kv, f)));
  out.push_back(fmt::format("Minimum KLD: {:10.6f}", kv.front()));
  out.push_back("");
  out.push_back("====== Token probability statistics ======");
  const auto pd = mean_and_error(sum_p_diff, sum_p_diff2, count);
  out.push_back(fmt::format("Mean    Δp: {:6.3f} ± {:5.3f} %", 100 * pd.first, 100 * pd.second));
  out.push_back(fmt::format("Maximum Δp: {:6.3f}%", 100 * pv.back()));
  const std::pair<const char*, float> pq[] = {{"99.9%", 0.999f}, {"99.0%", 0.99f}, {"95.0%", 0.95f}, {"90.0%", 0.9f}, {"75.0%", 0.75f}};
  for (auto [label, f] : pq) out.push_back(fmt::format("{}   Δp: {:6.3f}%", label, 100 * percentile(pv, f)));
  out.push_back(fmt::format("Median  Δp: {:6.3f}%", 100 * median(pv)));
  const std::pair<const char*, float> pl[] = {{"25.0%", 0.25f}, {"10.0%", 0.1f}, {" 5.0%", 0.05f}, {" 1.0%", 0.01f}, {" 0.1%", 0.001f}};
  for (auto [label, f] : pl) out.push_back(fmt::format("{}   Δp: {:6.3f}%", label, 100 * percentile(pv, f)));
  out.push_back(fmt::format("Minimum Δp: {:6.3f}%", 100 * pv.front()));
  const auto mse = mean_and_error(sum_p_diff2, sum_p_diff4, count);
  const double rms = std::sqrt(mse.first);
  out.push_back(fmt::format("RMS Δp    : {:6.3f} ± {:5.3f} %", 100 * rms, rms > 0 ? 100 * 0.5 / rms * mse.second : 0.0));
  const double top = same_top_fraction();
  out.push_back(fmt::format("Same top p: {:6.3f} ± {:5.3f} %", 100 * top, count > 1 ? 100 * std::sqrt(top * (1 - top) / (count - 1)) : 0.0));
  return out;
}

KldStats compute_kl_divergence(Engine& engine, const Tokenizer& tokenizer, KldReader& base, const KlDivergenceOptions& o) {
  const int n_vocab = engine.n_vocab();
  if (base.n_vocab() != n_vocab)
    fail("the base log-probabilities have a vocabulary of {}, this model {}: they come from another model", base.n_vocab(), n_vocab);
  const int n_ctx = base.n_ctx();
  const int n_chunk = o.n_chunks < 0 ? base.n_chunk() : std::min(o.n_chunks, base.n_chunk());
  WindowEvaluator ev(engine, n_ctx, tokenizer.add_bos() ? tokenizer.bos() : -1);
  ThreadPool pool(o.n_threads > 0 ? o.n_threads : ThreadPool::default_thread_count());
  const int scored = ev.scored(), first = ev.first(), nv = kld_row_values(n_vocab);
  KldStats stats;
  std::vector<uint16_t> rows;
  std::vector<KldRow> results((size_t)scored);
  for (int c = 0; c < n_chunk; c += ev.windows_per_step()) {
    const int n = std::min(ev.windows_per_step(), n_chunk - c);
    const std::vector<float> logits = ev.eval(base.tokens(), c, n);
    for (int k = 0; k < n; ++k) {
      base.read_chunk(rows);
      const float* wl = logits.data() + (size_t)k * scored * n_vocab;
      const int32_t* targets = base.tokens().data() + (size_t)(c + k) * n_ctx + first + 1;
      pool.parallel_for((size_t)scored, [&](size_t j) {
        results[j] = compare_row(wl + j * n_vocab, n_vocab, rows.data() + j * nv, targets[j]);
      });
      for (const KldRow& r : results) accumulate(stats, r);
      if (o.on_chunk) o.on_chunk(c + k + 1, n_chunk, stats);
    }
  }
  return stats;
}

}  // namespace roofline
