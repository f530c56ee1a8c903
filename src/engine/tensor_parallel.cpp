// -sm row: the backend that drives one slice of the model per rank, in a thread each (tensor_parallel.h).
#include "engine/tensor_parallel.h"

#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <numeric>
#include <thread>

#include "core/error.h"
#include "model/model.h"

namespace roofline {

namespace {

class HostReducer final : public PartialSumReducer {
 public:
  explicit HostReducer(int n) : n_(n), data_((size_t)n), sums_((size_t)n) {}
  std::string name() const override { return "host sums"; }
  Backend::PartialSum hook(int rank) override {
    return [this, rank](float* data, size_t count, void*) {
      data_[(size_t)rank] = data;
      meet();  // every rank's partial is ready
      std::vector<float>& sum = sums_[(size_t)rank];
      sum.assign(data_[0], data_[0] + count);
      for (int k = 1; k < n_; ++k) {
        const float* p = data_[(size_t)k];
        for (size_t i = 0; i < count; ++i) sum[i] += p[i];
      }
      meet();  // no rank reads the partials any more
      std::memcpy(data, sum.data(), count * sizeof(float));
    };
  }
  void abort() override {
    std::lock_guard<std::mutex> lock(m_);
    aborted_ = true;
    cv_.notify_all();
  }
  void reset() override {
    std::lock_guard<std::mutex> lock(m_);
    aborted_ = false;
    arrived_ = 0;
  }

 private:
  void meet() {
    std::unique_lock<std::mutex> lock(m_);
    if (aborted_) fail("-sm row: another slice of the model failed during this step");
    const uint64_t generation = generation_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return generation_ != generation || aborted_; });
    if (generation_ == generation) fail("-sm row: another slice of the model failed during this step");
  }

  const int n_;
  std::mutex m_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  bool aborted_ = false;
  std::vector<float*> data_;
  std::vector<std::vector<float>> sums_;
};

}  // namespace

std::unique_ptr<PartialSumReducer> make_host_reducer(int n_ranks) { return std::make_unique<HostReducer>(n_ranks); }

// One thread per rank, each running its queue of jobs in order. The first failure stops every queue's
// remaining jobs (and releases ranks waiting in the reducer) until wait() reports it.
class TensorParallelBackend::Workers {
 public:
  Workers(int n, PartialSumReducer* reducer) : reducer_(reducer), queues_((size_t)n) {
    for (int r = 0; r < n; ++r) threads_.emplace_back([this, r] { loop(r); });
  }
  ~Workers() {
    {
      std::lock_guard<std::mutex> lock(m_);
      stop_ = true;
    }
    work_.notify_all();
    for (std::thread& t : threads_) t.join();
  }
  void post(int rank, std::function<void()> job) {
    {
      std::lock_guard<std::mutex> lock(m_);
      queues_[(size_t)rank].push_back(std::move(job));
      ++pending_;
    }
    work_.notify_all();
  }
  void wait() {
    std::unique_lock<std::mutex> lock(m_);
    done_.wait(lock, [&] { return pending_ == 0; });
    if (error_) {
      std::exception_ptr e = error_;
      error_ = nullptr;
      reducer_->reset();
      std::rethrow_exception(e);
    }
  }

 private:
  void loop(int rank) {
    std::unique_lock<std::mutex> lock(m_);
    for (;;) {
      work_.wait(lock, [&] { return stop_ || !queues_[(size_t)rank].empty(); });
      if (queues_[(size_t)rank].empty()) return;  // stop_, nothing left
      std::function<void()> job = std::move(queues_[(size_t)rank].front());
      queues_[(size_t)rank].pop_front();
      const bool skip = error_ != nullptr;
      lock.unlock();
      if (!skip) {
        try {
          job();
        } catch (...) {
          std::lock_guard<std::mutex> g(m_);
          if (!error_) error_ = std::current_exception();
          reducer_->abort();
        }
      }
      lock.lock();
      if (--pending_ == 0) done_.notify_all();
    }
  }

  PartialSumReducer* reducer_;
  std::mutex m_;
  std::condition_variable work_, done_;
  std::vector<std::deque<std::function<void()>>> queues_;
  std::vector<std::thread> threads_;
  int64_t pending_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

TensorParallelBackend::TensorParallelBackend(std::vector<std::unique_ptr<Backend>> ranks, std::vector<std::shared_ptr<const Model>> slices,
                                             std::unique_ptr<PartialSumReducer> reducer)
    : ranks_(std::move(ranks)), slices_(std::move(slices)), reducer_(std::move(reducer)) {
  ROOFLINE_CHECK(!ranks_.empty() && ranks_.size() == slices_.size() && reducer_, "a tensor-parallel backend needs a slice per rank");
  for (size_t r = 0; r < ranks_.size(); ++r) {
    if (!ranks_[r]->supports_partial_sum()) fail("-sm row: the {} backend cannot run a slice of the model", ranks_[r]->name());
    ranks_[r]->set_partial_sum(reducer_->hook((int)r));
  }
  workers_ = std::make_unique<Workers>((int)ranks_.size(), reducer_.get());
}

TensorParallelBackend::~TensorParallelBackend() {
  try {
    wait();
  } catch (...) {
  }
  workers_.reset();  // the threads end before the ranks go
}

std::string TensorParallelBackend::name() const {
  std::string s;
  for (const auto& r : ranks_) s += (s.empty() ? "" : "+") + r->name();
  return s + " (-sm row, " + reducer_->name() + ")";
}

LayerSet TensorParallelBackend::rank_layers(int i, const LayerSet& layers) const {
  LayerSet set = layers;
  set.output = layers.output && i == 0;
  return set;
}

uint64_t TensorParallelBackend::weight_bytes(const Model&, const LayerSet& layers) const {
  return sum_over_ranks(layers, [](const Backend& b, const Model& m, const LayerSet& set) { return b.weight_bytes(m, set); });
}
uint64_t TensorParallelBackend::kv_block_bytes(const Model&, const LayerSet& layers, const KvConfig& kv) const {
  return sum_over_ranks(layers, [&](const Backend& b, const Model& m, const LayerSet& set) { return b.kv_block_bytes(m, set, kv); });
}
uint64_t TensorParallelBackend::state_cell_bytes(const Model&, const LayerSet& layers) const {
  return sum_over_ranks(layers, [](const Backend& b, const Model& m, const LayerSet& set) { return b.state_cell_bytes(m, set); });
}
uint64_t TensorParallelBackend::swa_cell_bytes(const Model&, const LayerSet& layers, const KvConfig& kv) const {
  return sum_over_ranks(layers, [&](const Backend& b, const Model& m, const LayerSet& set) { return b.swa_cell_bytes(m, set, kv); });
}
uint64_t TensorParallelBackend::swa_snapshot_bytes(const Model&, const LayerSet& layers, const KvConfig& kv) const {
  return sum_over_ranks(layers, [&](const Backend& b, const Model& m, const LayerSet& set) { return b.swa_snapshot_bytes(m, set, kv); });
}

void TensorParallelBackend::post(std::function<void(int, Backend&)> f) {
  auto shared = std::make_shared<std::function<void(int, Backend&)>>(std::move(f));
  for (size_t r = 0; r < ranks_.size(); ++r) workers_->post((int)r, [shared, r, this] { (*shared)((int)r, *ranks_[r]); });
}

void TensorParallelBackend::wait() { workers_->wait(); }

void TensorParallelBackend::on_rank0(std::function<void(Backend&)> f) {
  workers_->post(0, [this, f = std::move(f)] { f(*ranks_[0]); });
  for (size_t r = 1; r < ranks_.size(); ++r) workers_->post((int)r, [this, r] { ranks_[r]->finish_step(); });
  wait();
}

void TensorParallelBackend::load(std::shared_ptr<const Model> model, const LayerSet& layers) {
  (void)model;  // the slices were cut from it
  post([this, layers](int r, Backend& b) { b.load(slices_[(size_t)r], rank_layers(r, layers)); });
  wait();
}
void TensorParallelBackend::init_kv(const KvConfig& kv) {
  post([kv](int, Backend& b) { b.init_kv(kv); });
  wait();
}
void TensorParallelBackend::init_state(int n_cells) {
  post([n_cells](int, Backend& b) { b.init_state(n_cells); });
  wait();
}
void TensorParallelBackend::init_snapshots(int n) {
  post([n](int, Backend& b) { b.init_snapshots(n); });
  wait();
}

std::string TensorParallelBackend::keep_f16_copies() {
  std::vector<std::string> lines(ranks_.size());
  post([&lines](int r, Backend& b) { lines[(size_t)r] = b.keep_f16_copies(); });
  wait();
  std::string all;
  for (const std::string& line : lines)
    if (!line.empty()) all += (all.empty() ? "" : "; ") + line;
  return all;
}

void TensorParallelBackend::begin_step(const StepDesc& step) {
  n_tokens_ = (size_t)step.n_tokens();
  auto copy = std::make_shared<StepDesc>(step);
  post([copy](int, Backend& b) { b.begin_step(*copy); });
}
void TensorParallelBackend::embed() {
  post([](int, Backend& b) { b.embed(); });
}
void TensorParallelBackend::set_hidden(const float* hidden) {
  // The rows of the step begun last: as many as its tokens, n_embd each.
  const size_t n = (size_t)slices_[0]->hparams().n_embd * n_tokens_;
  auto copy = std::make_shared<std::vector<float>>(hidden, hidden + n);
  post([copy](int, Backend& b) { b.set_hidden(copy->data()); });
}
void TensorParallelBackend::get_hidden(float* hidden) {
  on_rank0([hidden](Backend& b) { b.get_hidden(hidden); });
}
void TensorParallelBackend::forward(int layer_begin, int layer_end) {
  post([layer_begin, layer_end](int, Backend& b) { b.forward(layer_begin, layer_end); });
}
void TensorParallelBackend::finish_step() {
  post([](int, Backend& b) { b.finish_step(); });
  wait();
}
void TensorParallelBackend::output(float* logits) {
  on_rank0([logits](Backend& b) { b.output(logits); });
}
void TensorParallelBackend::output_hidden(float* hidden) {
  on_rank0([hidden](Backend& b) { b.output_hidden(hidden); });
}
bool TensorParallelBackend::supports_output_argmax() const { return ranks_[0]->supports_output_argmax(); }
void TensorParallelBackend::output_argmax(float* logits, int32_t* tokens) {
  on_rank0([logits, tokens](Backend& b) { b.output_argmax(logits, tokens); });
}
void TensorParallelBackend::set_matmul_observer(MatmulObserver observer) {
  if (observer) fail("importance matrices are not collected with -sm row (run imatrix on one device)");
}

void TensorParallelBackend::copy_kv_block(int src, int dst) {
  post([src, dst](int, Backend& b) { b.copy_kv_block(src, dst); });
}
void TensorParallelBackend::copy_state(int src, int dst) {
  post([src, dst](int, Backend& b) { b.copy_state(src, dst); });
}
void TensorParallelBackend::save_window(int cell, int first_block, int n_blocks, int snapshot) {
  post([=](int, Backend& b) { b.save_window(cell, first_block, n_blocks, snapshot); });
  wait();
}
void TensorParallelBackend::load_window(int snapshot, int cell, int first_block, int n_blocks) {
  post([=](int, Backend& b) { b.load_window(snapshot, cell, first_block, n_blocks); });
  wait();
}

ModelSplit split_model(const std::shared_ptr<const Model>& model, const std::vector<double>& weights) {
  require_tensor_splittable(model->hparams());
  // Every layer's cut must fall on a block boundary of its own output and down types: the least common
  // multiple of their block sizes (1, 32 and 256 in practice, so the largest).
  int64_t o_block = 1, down_block = 1;
  for (int il = 0; il < model->hparams().n_layer; ++il) {
    const LayerWeights& L = model->layer(il);
    o_block = std::lcm(o_block, (int64_t)dtype_block_size(L[LayerTensor::AttnOut].type()));
    down_block = std::lcm(down_block, (int64_t)dtype_block_size(L[LayerTensor::FfnDown].type()));
  }
  ModelSplit split;
  split.shards = plan_tensor_split(model->hparams(), weights, o_block, down_block);
  for (const TensorShard& s : split.shards)
    split.slices.push_back(Model::tensor_slice(model, s.kv_head_begin, s.kv_head_end, s.ff_begin, s.ff_end));
  return split;
}

}  // namespace roofline
