// Importance matrices: collection from the matmul observer, llama.cpp's two file formats (GGUF with
// <name>.in_sum2 / <name>.counts tensors and imatrix.* keys; the legacy .dat records of per-column
// means scaled by the call count), and the calibration run over windows of a text.
#include "engine/imatrix.h"

#include <algorithm>
#include <chrono>
#include <cfloat>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "engine/engine.h"
#include "engine/perplexity.h"
#include "formats/gguf.h"
#include "tokenizer/tokenizer.h"

namespace roofline {
namespace {

// The most rows an entry's count may say: 2^53, where float32/float64 files stop holding every integer
// (a file saying more is corrupt; merged files saying more are refused, so sums stay in int64).
constexpr int64_t kMaxCount = int64_t{1} << 53;

// Both formats store float32: a value past its range (merged files add up) would be written as inf,
// which no reader takes, so saving refuses it.
void check_stored(const std::string& entry, float v) {
  if (!std::isfinite(v)) fail("importance matrix entry '{}' holds a value past float32's range; it cannot be saved", entry);
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Reads little pieces of a legacy file with bounds checks.
class ByteReader {
 public:
  ByteReader(const std::string& path, std::vector<uint8_t> data) : path_(path), data_(std::move(data)) {}
  bool at_end() const { return pos_ >= data_.size(); }
  size_t left() const { return data_.size() - pos_; }
  template <typename T>
  T get(const char* what) {
    T v;
    need(sizeof(T), what);
    std::memcpy(&v, data_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  void read(void* dst, size_t n, const char* what) {
    need(n, what);
    std::memcpy(dst, data_.data() + pos_, n);
    pos_ += n;
  }

 private:
  void need(size_t n, const char* what) {
    if (left() < n) fail("{}: corrupt imatrix file: truncated at {} (byte {})", path_, what, pos_);
  }
  std::string path_;
  std::vector<uint8_t> data_;
  size_t pos_ = 0;
};

std::vector<uint8_t> read_file(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) fail("{}: cannot open ({})", path, std::strerror(errno));
  std::vector<uint8_t> data;
  uint8_t buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) data.insert(data.end(), buf, buf + n);
  std::fclose(f);
  return data;
}

}  // namespace

void Imatrix::add(const std::string& name, const float* x, int n_rows, int64_t n_cols) {
  std::lock_guard<std::mutex> lock(*mutex_);
  ImatrixEntry& e = entries_[name];
  if (e.sums.empty()) {
    e.sums.assign((size_t)n_cols, 0.0);
    e.counts.assign(1, 0);
  } else if ((int64_t)e.sums.size() != n_cols || e.counts.size() != 1) {
    fail("importance matrix entry '{}' has {} columns, a product with {} columns was observed", name, e.sums.size(), n_cols);
  }
  for (int r = 0; r < n_rows; ++r) {
    const float* row = x + (size_t)r * n_cols;
    for (int64_t j = 0; j < n_cols; ++j) e.sums[j] += (double)row[j] * row[j];
  }
  e.counts[0] += n_rows;
  for (int64_t j = 0; j < n_cols; ++j)
    if (!std::isfinite(e.sums[j])) fail("non-finite activations reached '{}' (column {})", name, j);
}

void Imatrix::add_expert(const std::string& name, int expert, int n_expert, const float* x, int n_rows, int64_t n_cols) {
  std::lock_guard<std::mutex> lock(*mutex_);
  ImatrixEntry& e = entries_[name];
  if (e.sums.empty()) {
    e.sums.assign((size_t)n_cols * n_expert, 0.0);
    e.counts.assign((size_t)n_expert, 0);
  } else if ((int64_t)e.sums.size() != n_cols * n_expert || (int)e.counts.size() != n_expert) {
    fail("importance matrix entry '{}' has {} values for {} matrices, {} experts of {} columns were observed", name,
         e.sums.size(), e.counts.size(), n_expert, n_cols);
  }
  ROOFLINE_CHECK(expert >= 0 && expert < n_expert);
  double* sums = e.sums.data() + (size_t)expert * n_cols;
  for (int r = 0; r < n_rows; ++r) {
    const float* row = x + (size_t)r * n_cols;
    for (int64_t j = 0; j < n_cols; ++j) sums[j] += (double)row[j] * row[j];
  }
  e.counts[(size_t)expert] += n_rows;
  for (int64_t j = 0; j < n_cols; ++j)
    if (!std::isfinite(sums[j])) fail("non-finite activations reached '{}' (expert {}, column {})", name, expert, j);
}

void Imatrix::merge(const Imatrix& other) {
  for (const auto& [name, oe] : other.entries_) {
    ImatrixEntry& e = entries_[name];
    if (e.sums.empty()) {
      e = oe;
      continue;
    }
    if (e.sums.size() != oe.sums.size() || e.counts.size() != oe.counts.size())
      fail("cannot merge importance matrices: entry '{}' has different shapes", name);
    for (size_t j = 0; j < e.sums.size(); ++j) e.sums[j] += oe.sums[j];
    for (size_t j = 0; j < e.counts.size(); ++j) {
      e.counts[j] += oe.counts[j];  // each at most kMaxCount: no overflow
      if (e.counts[j] > kMaxCount) fail("cannot merge importance matrices: entry '{}' would count more than 2^53 rows", name);
    }
  }
  for (const std::string& d : other.datasets_) datasets_.push_back(d);
  chunk_count_ = -1;
}

int Imatrix::chunk_count() const {
  if (chunk_count_ >= 0) return chunk_count_;
  int64_t max_count = 0;
  for (const auto& [name, e] : entries_)
    for (int64_t c : e.counts) max_count = std::max(max_count, c);
  return chunk_size_ > 0 ? (int)(max_count / chunk_size_) : 0;
}

ImportanceData Imatrix::importance(const std::string& file) const {
  ImportanceData d;
  d.file = file;
  d.dataset = datasets_.empty() ? "" : datasets_.front();
  d.chunk_count = chunk_count();
  for (const auto& [name, e] : entries_) {
    const size_t n_mat = e.counts.size(), n_cols = n_mat ? e.sums.size() / n_mat : 0;
    if (n_mat == 0 || n_cols == 0) continue;
    std::vector<float>& v = d.values[name];
    v.resize(e.sums.size());
    for (size_t m = 0; m < n_mat; ++m)
      for (size_t j = 0; j < n_cols; ++j)
        v[m * n_cols + j] = e.counts[m] > 0 ? (float)(e.sums[m * n_cols + j] / (double)e.counts[m]) : 1.0f;
  }
  return d;
}

Imatrix Imatrix::load(const std::string& path, int chunk_size) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) fail("{}: no such imatrix file", path);
  char magic[4] = {};
  if (std::FILE* f = std::fopen(path.c_str(), "rb")) {
    const size_t n = std::fread(magic, 1, 4, f);
    std::fclose(f);
    if (n == 4 && std::memcmp(magic, "GGUF", 4) == 0) return load_gguf(path, chunk_size);
    return load_dat(path, chunk_size);
  }
  fail("{}: cannot open ({})", path, std::strerror(errno));
}

Imatrix Imatrix::load_gguf(const std::string& path, int chunk_size) {
  auto file = gguf::GgufFile::open(path);
  const gguf::Metadata& md = file->metadata();
  if (md.contains("general.architecture") && !md.contains("imatrix.chunk_count"))
    fail("{}: this is a model, not an importance matrix", path);
  const int64_t file_chunk_size = md.get_int_or("imatrix.chunk_size", chunk_size);
  if (file_chunk_size < 1 || file_chunk_size > (1 << 24))
    fail("{}: corrupt imatrix: imatrix.chunk_size is {} (windows of 1..{} tokens)", path, file_chunk_size, 1 << 24);
  Imatrix im((int)file_chunk_size);
  if (const gguf::Value* ds = md.find("imatrix.datasets"); ds && ds->is_array() && ds->array_type() == gguf::ValueType::STRING)
    for (const std::string& s : ds->as_string_array("imatrix.datasets")) im.datasets_.push_back(s);
  struct Parts {
    const gguf::TensorInfo* sums = nullptr;
    const gguf::TensorInfo* counts = nullptr;
  };
  std::map<std::string, Parts> parts;
  for (const gguf::TensorInfo& t : file->tensors()) {
    if (ends_with(t.name, ".in_sum2")) parts[t.name.substr(0, t.name.size() - 8)].sums = &t;
    else if (ends_with(t.name, ".counts")) parts[t.name.substr(0, t.name.size() - 7)].counts = &t;
    // other tensors (e.g. <name>.in_sum, the plain activation sums of newer files) are not needed
  }
  if (parts.empty()) fail("{}: no importance-matrix entries (<name>.in_sum2 and <name>.counts tensors)", path);
  for (const auto& [name, p] : parts) {
    if (!p.sums || !p.counts) fail("{}: corrupt imatrix: entry '{}' lacks its {} tensor", path, name, p.sums ? "counts" : "in_sum2");
    if (p.sums->type != DType::F32 || p.counts->type != DType::F32)
      fail("{}: corrupt imatrix: entry '{}' is not stored as F32", path, name);
    const int64_t n_mat = p.counts->n_elements(), n_vals = p.sums->n_elements();
    if (n_mat < 1 || n_vals % n_mat != 0)
      fail("{}: corrupt imatrix: entry '{}' has {} sums for {} counts", path, name, n_vals, n_mat);
    ImatrixEntry& e = im.entries_[name];
    e.sums.resize((size_t)n_vals);
    e.counts.resize((size_t)n_mat);
    for (int64_t j = 0; j < n_vals; ++j) {
      float v;
      std::memcpy(&v, p.sums->data + 4 * j, 4);
      if (!std::isfinite(v) || v < 0) fail("{}: corrupt imatrix: entry '{}' holds {} (sums of squares are finite and >= 0)", path, name, v);
      e.sums[j] = v;
    }
    for (int64_t j = 0; j < n_mat; ++j) {
      float c;
      std::memcpy(&c, p.counts->data + 4 * j, 4);
      if (!std::isfinite(c) || c < 0 || c > (float)kMaxCount)
        fail("{}: corrupt imatrix: entry '{}' has count {}", path, name, c);
      e.counts[j] = std::llround(c);
    }
  }
  if (md.contains("imatrix.chunk_count")) im.chunk_count_ = (int)md.get_int("imatrix.chunk_count");
  return im;
}

Imatrix Imatrix::load_dat(const std::string& path, int chunk_size) {
  ByteReader in(path, read_file(path));
  if (in.left() < 4) fail("{}: not an imatrix file (neither GGUF nor llama.cpp's legacy .dat)", path);
  const int32_t n_entries = in.get<int32_t>("the entry count");
  if (n_entries < 1 || (size_t)n_entries > in.left() / 16)
    fail("{}: not an imatrix file (neither GGUF nor a legacy .dat with a plausible entry count; it says {})", path, n_entries);
  Imatrix im(chunk_size);
  for (int32_t i = 0; i < n_entries; ++i) {
    const int32_t len = in.get<int32_t>("a name length");
    if (len <= 0 || len > 4096) fail("{}: corrupt imatrix: entry {} has a name length of {}", path, i + 1, len);
    std::string name((size_t)len, '\0');
    in.read(name.data(), (size_t)len, "a name");
    const int32_t ncall = in.get<int32_t>("a call count");
    const int32_t nval = in.get<int32_t>("a value count");
    if (ncall < 0 || nval < 1 || (size_t)nval > in.left() / 4)
      fail("{}: corrupt imatrix: entry '{}' claims {} values after {} calls", path, name, nval, ncall);
    ImatrixEntry& e = im.entries_[name];
    e.sums.assign((size_t)nval, 0.0);
    // ncall 0 (a file made by hand): the values are the means themselves, as llama-quantize reads them.
    e.counts.assign(1, (int64_t)std::max(ncall, 1) * chunk_size);
    if (e.counts[0] > kMaxCount) fail("{}: corrupt imatrix: entry '{}' claims {} calls of {} rows", path, name, ncall, chunk_size);
    for (int32_t j = 0; j < nval; ++j) {
      const float v = in.get<float>("values");
      if (!std::isfinite(v) || v < 0) fail("{}: corrupt imatrix: entry '{}' holds {}", path, name, v);
      // Stored: mean * ncall. Kept as sums over ncall * chunk_size rows, as llama.cpp reloads it; a sum past
      // float32's range could not be written again (both formats store float32).
      e.sums[j] = (double)v * chunk_size;
      if (e.sums[j] > FLT_MAX) fail("{}: corrupt imatrix: entry '{}' holds {}, too large for its {} rows", path, name, v, chunk_size);
    }
  }
  if (!in.at_end()) {
    const int32_t last_chunk = in.get<int32_t>("the chunk count");
    if (last_chunk >= 0) im.chunk_count_ = last_chunk;
    if (in.left() >= 4) {
      const int32_t len = in.get<int32_t>("the dataset name length");
      if (len > 0 && (size_t)len <= in.left()) {
        std::string dataset((size_t)len, '\0');
        in.read(dataset.data(), (size_t)len, "the dataset name");
        im.datasets_.push_back(dataset);
      }
    }
  }
  return im;
}

void Imatrix::save(const std::string& path, ImatrixFormat format) const {
  std::lock_guard<std::mutex> lock(*mutex_);
  if (entries_.empty()) fail("the importance matrix is empty: nothing observed (is the text at least two windows long?)");
  if (format == ImatrixFormat::Gguf) save_gguf(path);
  else save_dat(path);
}

void Imatrix::save_gguf(const std::string& path) const {
  gguf::Metadata md;
  md.set("general.type", gguf::Value::string("imatrix"));
  md.set("imatrix.datasets", gguf::Value::string_array(datasets_));
  md.set("imatrix.chunk_count", gguf::Value::u32((uint32_t)chunk_count()));
  md.set("imatrix.chunk_size", gguf::Value::u32((uint32_t)chunk_size_));
  // As ggml writes them: a trailing dimension of 1 is dropped (one matrix: 1-D tensors).
  auto shape = [](int64_t cols, int64_t n_mat) { return n_mat > 1 ? std::vector<int64_t>{cols, n_mat} : std::vector<int64_t>{cols}; };
  std::vector<gguf::GgufWriter::TensorSpec> specs;
  std::vector<std::vector<float>> data;
  for (const auto& [name, e] : entries_) {  // std::map: sorted by name, as llama.cpp stores them
    const int64_t n_mat = (int64_t)e.counts.size();
    if (n_mat == 0 || e.sums.empty()) continue;
    specs.push_back({name + ".in_sum2", DType::F32, shape(e.n_cols(), n_mat)});
    data.emplace_back(e.sums.begin(), e.sums.end());
    for (float v : data.back()) check_stored(name, v);
    specs.push_back({name + ".counts", DType::F32, n_mat > 1 ? std::vector<int64_t>{1, n_mat} : std::vector<int64_t>{1}});
    data.emplace_back(e.counts.begin(), e.counts.end());
  }
  if (specs.empty()) fail("{}: no entry of the importance matrix holds data; a file of none could not be read", path);
  for (const auto& s : specs)
    if (s.name.size() > gguf::kMaxTensorName) fail("imatrix entry name '{}' is too long for GGUF", s.name);
  gguf::GgufWriter writer(path, md, specs);
  for (size_t i = 0; i < specs.size(); ++i) writer.write_tensor_data(i, data[i].data(), data[i].size() * sizeof(float));
  writer.finish();
}

void Imatrix::save_dat(const std::string& path) const {
  std::vector<uint8_t> out;
  auto put = [&](const void* p, size_t n) { out.insert(out.end(), (const uint8_t*)p, (const uint8_t*)p + n); };
  auto put_i32 = [&](int32_t v) { put(&v, 4); };
  std::vector<const std::pair<const std::string, ImatrixEntry>*> stored;
  for (const auto& kv : entries_) {
    bool any = false;
    for (int64_t c : kv.second.counts) any |= c > 0;
    if (any && !kv.second.sums.empty()) stored.push_back(&kv);  // entries without data are skipped, as llama.cpp does
  }
  if (stored.empty()) fail("{}: no entry of the importance matrix holds counts; a legacy file of none could not be read", path);
  put_i32((int32_t)stored.size());
  for (const auto* kv : stored) {
    const ImatrixEntry& e = kv->second;
    put_i32((int32_t)kv->first.size());
    put(kv->first.data(), kv->first.size());
    const int64_t max_count = *std::max_element(e.counts.begin(), e.counts.end());
    const int64_t calls = (max_count + chunk_size_ - 1) / chunk_size_;
    if (calls > INT32_MAX) fail("{}: entry '{}' spans {} windows, more than the legacy format counts; save it as GGUF", path, kv->first, calls);
    const int32_t ncall = (int32_t)calls;
    put_i32(ncall);
    put_i32((int32_t)e.sums.size());
    const size_t per_mat = e.sums.size() / e.counts.size();
    for (size_t j = 0; j < e.sums.size(); ++j) {
      const int64_t c = e.counts[j / per_mat];
      const float v = c > 0 ? (float)(e.sums[j] / (double)c * ncall) : 1.0f * ncall;
      check_stored(kv->first, v);
      put(&v, 4);
    }
  }
  put_i32(chunk_count());
  const std::string dataset = datasets_.empty() ? "" : datasets_.back();
  put_i32((int32_t)dataset.size());
  put(dataset.data(), dataset.size());

  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) fail("{}: cannot write ({})", path, std::strerror(errno));
  const bool ok = std::fwrite(out.data(), 1, out.size(), f) == out.size();
  if (std::fclose(f) != 0 || !ok) {
    std::remove(tmp.c_str());
    fail("{}: write failed", path);
  }
  std::filesystem::rename(tmp, path);
}

Backend::MatmulObserver imatrix_observer(Imatrix& imatrix, bool process_output) {
  return [&imatrix, process_output](const gguf::TensorInfo& w, const float* x, int n_rows, int64_t n_cols, int expert) {
    if (expert >= 0) {  // llama-imatrix collects every expert product (MUL_MAT_ID), whatever the batch
      imatrix.add_expert(w.name, expert, (int)w.ne[2], x, n_rows, n_cols);
      return;
    }
    if (n_rows < 16) return;  // llama-imatrix ignores small batches
    const bool layer_weight = w.name.compare(0, 4, "blk.") == 0;
    if (!layer_weight && !(process_output && w.name == "output.weight")) return;
    imatrix.add(w.name, x, n_rows, n_cols);
  };
}

ImatrixRunResult collect_imatrix(Engine& engine, const Tokenizer& tokenizer, const std::vector<int32_t>& tokens,
                                 Imatrix& imatrix, const ImatrixRunOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  const int n_ctx = o.n_ctx;
  if (n_ctx <= 0) fail("the context size must be above 0 (-c)");
  if (tokens.size() < (size_t)2 * n_ctx)
    fail("the text tokenizes to only {} tokens; a context of {} needs at least {}", tokens.size(), n_ctx, 2 * n_ctx);
  const int n_chunk_max = (int)(tokens.size() / n_ctx);
  const int n_chunk = o.n_chunks < 0 ? n_chunk_max : std::min(o.n_chunks, n_chunk_max);
  if (n_chunk <= 0) fail("--chunks {} leaves nothing to evaluate", o.n_chunks);
  // llama-imatrix asks for every row's logits, so output.weight sees whole windows.
  using Rows = WindowEvaluator::Rows;
  WindowEvaluator ev(engine, n_ctx, tokenizer.add_bos() ? tokenizer.bos() : -1,
                     o.process_output || o.compute_ppl ? Rows::All : Rows::None);
  const int n_vocab = engine.n_vocab();
  engine.set_matmul_observer(imatrix_observer(imatrix, o.process_output));
  ImatrixRunResult r;
  r.n_chunk = n_chunk;
  double nll = 0;
  int64_t count = 0;
  try {
    for (int c = 0; c < n_chunk; c += ev.windows_per_step()) {
      const int n = std::min(ev.windows_per_step(), n_chunk - c);
      const std::vector<float> logits = ev.eval(tokens, c, n);
      for (int k = 0; k < n; ++k) {
        if (o.compute_ppl) {
          const float* wl = logits.data() + (size_t)k * n_ctx * n_vocab;
          const size_t base = (size_t)(c + k) * n_ctx;
          for (int j = ev.first(); j < n_ctx - 1; ++j) nll += token_nll(wl + (size_t)j * n_vocab, n_vocab, tokens[base + j + 1]);
          count += ev.scored();
        }
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (o.on_chunk) o.on_chunk(c + k + 1, n_chunk, count ? std::exp(nll / count) : 0.0, s);
      }
    }
  } catch (...) {
    engine.set_matmul_observer(nullptr);
    throw;
  }
  engine.set_matmul_observer(nullptr);
  r.ppl = count ? std::exp(nll / count) : 0;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace roofline
