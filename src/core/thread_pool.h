// A fixed pool of worker threads with a blocking parallel_for. The split of work is deterministic
// (chunk i always covers the same range), so results never depend on scheduling. Workers and the
// caller spin for a short while (~50 us) before they sleep: decode runs hundreds of short parallel
// steps per token, and a wake-up through the condition variable costs tens of microseconds each.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace roofline {

class ThreadPool {
 public:
  // n_threads counts the calling thread: ThreadPool(1) runs everything inline.
  explicit ThreadPool(int n_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Calls fn(i) for i in [0, n), spread over the threads; returns when all calls are done.
  // The first exception thrown by fn is rethrown here.
  void parallel_for(size_t n, const std::function<void(size_t)>& fn);

  // Calls fn(u0, u1) on ranges that together cover [0, n) once, spread over the threads ("guided"
  // scheduling): each take is a share of what is left (about 1 / (2 x threads) of it, at least min_take),
  // so the first ranges are long (a thread streams long runs of memory) and the last short (threads finish
  // together). Which thread runs a range varies from call to call; the ranges' union does not.
  void parallel_ranges(size_t n, size_t min_take, const std::function<void(size_t, size_t)>& fn);

  // Calls fn(thread_index, n_threads) once on every thread (for kernels that split work themselves).
  void run_on_all(const std::function<void(int, int)>& fn);

  static int default_thread_count();

 private:
  void worker_loop(int index);

  int n_threads_;
  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  std::atomic<const std::function<void(int, int)>*> job_{nullptr};  // stored before the generation is bumped
  std::atomic<uint64_t> generation_{0};  // bumped (under mutex_) for each job
  std::atomic<int> pending_{0};          // workers still running the current job
  std::atomic<bool> caller_sleeping_{false};  // the caller waits on done_ (set under mutex_)
  std::atomic<bool> stop_{false};
  std::exception_ptr error_;
};

}  // namespace roofline
