// ThreadPool implementation: workers wait on a generation counter (spinning, then on a condition
// variable); the caller takes part as thread 0.
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
    // A job is published by bumping the generation after job_ is stored; a spinning worker sees it and
    // runs without the mutex (15 workers taking one mutex in turn cost microseconds per parallel step).
    // Only a worker that spun in vain takes the mutex, to sleep.
    if (!spin_until([&] { return stop_.load(std::memory_order_acquire) || generation_.load(std::memory_order_acquire) != seen; })) {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stop_.load() || generation_.load() != seen; });
    }
    if (stop_.load(std::memory_order_acquire)) return;
    seen = generation_.load(std::memory_order_acquire);
    const std::function<void(int, int)>* job = job_.load(std::memory_order_acquire);
    try {
      (*job)(index, n_threads_);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error_) error_ = std::current_exception();
    }
    // seq_cst, both: with the caller's store of caller_sleeping_ and its load of pending_, one of the two
    // sides sees the other's write (the caller does not sleep, or this worker wakes it).
    if (pending_.fetch_sub(1) == 1 && caller_sleeping_.load()) {
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
  job_.store(&fn, std::memory_order_relaxed);
  pending_.store(n_threads_ - 1, std::memory_order_relaxed);
  error_ = nullptr;  // no worker runs between jobs: the last one finished before the previous call returned
  {
    // Under the mutex, so that a worker deciding to sleep (which checks the generation under it) either
    // sees the new generation or is already waiting when notify_all comes.
    std::lock_guard<std::mutex> lock(mutex_);
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
    caller_sleeping_.store(true);  // seq_cst: ordered before the predicate's load of pending_ (a worker checks it after its fetch_sub)
    done_.wait(lock, [&] { return pending_.load() == 0; });
    caller_sleeping_.store(false, std::memory_order_relaxed);
  }
  std::lock_guard<std::mutex> lock(mutex_);  // orders error_ (written under the mutex) before it is read
  if (own_error) std::rethrow_exception(own_error);
  if (error_) std::rethrow_exception(error_);
}

void ThreadPool::parallel_for(size_t n, const std::function<void(size_t)>& fn) {
  if (n == 0) return;
  if (n_threads_ == 1 || n == 1) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  // Indices are handed out in runs (about four per thread), so that a step of many short tasks costs a
  // few atomic operations per thread on the shared counter, not one per task.
  const size_t run = std::max<size_t>(1, n / (4 * (size_t)n_threads_));
  std::atomic<size_t> next{0};
  run_on_all([&](int, int) {
    for (size_t i0 = next.fetch_add(run); i0 < n; i0 = next.fetch_add(run))
      for (size_t i = i0, i1 = std::min(n, i0 + run); i < i1; ++i) fn(i);
  });
}

void ThreadPool::parallel_ranges(size_t n, size_t min_take, const std::function<void(size_t, size_t)>& fn) {
  if (n == 0) return;
  if (n_threads_ == 1) {
    fn(0, n);
    return;
  }
  min_take = std::max<size_t>(1, min_take);
  const size_t divisor = 2 * (size_t)n_threads_;
  std::atomic<size_t> next{0};
  run_on_all([&](int, int) {
    for (;;) {
      // The size comes from a possibly stale view of what is left: only the range's start is claimed
      // atomically, so ranges never overlap and a late take is at worst a little long.
      size_t seen = next.load(std::memory_order_relaxed);
      if (seen >= n) return;
      const size_t take = std::max(min_take, (n - seen) / divisor);
      const size_t u0 = next.fetch_add(take, std::memory_order_relaxed);
      if (u0 >= n) return;
      fn(u0, std::min(n, u0 + take));
    }
  });
}

}  // namespace roofline
