// ThreadPool implementation: workers wait on a generation counter; the caller takes part as thread 0.
#include "core/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <exception>

namespace roofline {

int ThreadPool::default_thread_count() {
  const unsigned hw = std::thread::hardware_concurrency();
  return hw ? (int)hw : 1;
}

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads > 0 ? n_threads : default_thread_count()) {
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

namespace {

// Polls cond for up to ~kSpinIterations pause-length steps (tens of microseconds); true once it holds.
constexpr int kSpinIterations = 1 << 14;
template <class Cond>
bool spin_until(Cond cond) {
  for (int i = 0; i < kSpinIterations; ++i) {
    if (cond()) return true;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
    if ((i & 1023) == 1023) std::this_thread::yield();  // another runnable thread may need this core
  }
  return cond();
}

}  // namespace

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_.store(true);
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int, int)>* job;
    // A new job is published under the mutex; spinning sees the generation change without taking it.
    spin_until([&] { return stop_.load(std::memory_order_acquire) || generation_.load(std::memory_order_acquire) != seen; });
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stop_.load() || generation_.load() != seen; });
      if (stop_.load()) return;
      seen = generation_.load();
      job = job_;
    }
    try {
      (*job)(index, n_threads_);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error_) error_ = std::current_exception();
    }
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard<std::mutex> lock(mutex_);  // the caller checks pending_ under the mutex before it sleeps
      done_.notify_one();
    }
  }
}

void ThreadPool::run_on_all(const std::function<void(int, int)>& fn) {
  if (n_threads_ == 1) {
    fn(0, 1);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    job_ = &fn;
    pending_.store(n_threads_ - 1);
    error_ = nullptr;
    generation_.fetch_add(1, std::memory_order_acq_rel);
  }
  wake_.notify_all();
  std::exception_ptr own_error;
  try {
    fn(0, n_threads_);
  } catch (...) {
    own_error = std::current_exception();
  }
  if (!spin_until([&] { return pending_.load(std::memory_order_acquire) == 0; })) {
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return pending_.load() == 0; });
  }
  std::lock_guard<std::mutex> lock(mutex_);  // orders error_ (written under the mutex) before it is read
  job_ = nullptr;
  if (own_error) std::rethrow_exception(own_error);
  if (error_) std::rethrow_exception(error_);
}

void ThreadPool::parallel_for(size_t n, const std::function<void(size_t)>& fn) {
  if (n == 0) return;
  if (n_threads_ == 1 || n == 1) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<size_t> next{0};
  run_on_all([&](int, int) {
    for (size_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) fn(i);
  });
}

}  // namespace roofline
