// ThreadPool: every index runs exactly once per parallel_for, over many back-to-back jobs (the spinning
// hand-off) and after the workers have gone to sleep (the condition-variable path); run_on_all gives each
// thread its index once; the first exception reaches the caller and the pool stays usable.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "core/thread_pool.h"

using namespace roofline;

namespace {

void expect_each_index_once(ThreadPool& pool, size_t n) {
  std::vector<std::atomic<int>> hits(n);
  pool.parallel_for(n, [&](size_t i) { hits[i].fetch_add(1); });
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "index " << i << " of " << n;
}

}  // namespace

TEST(ThreadPoolTest, EveryIndexOnceOverManyBackToBackJobs) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    for (int round = 0; round < 3000; ++round) expect_each_index_once(pool, (size_t)(1 + round % 37));
  }
}

TEST(ThreadPoolTest, JobsAfterTheWorkersSleptStillRun) {
  ThreadPool pool(4);
  for (int round = 0; round < 4; ++round) {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));  // past the spin: workers block
    expect_each_index_once(pool, 100);
  }
}

TEST(ThreadPoolTest, RunOnAllGivesEachThreadItsIndexOnce) {
  ThreadPool pool(4);
  for (int round = 0; round < 500; ++round) {
    std::vector<std::atomic<int>> seen(4);
    pool.run_on_all([&](int t, int n) {
      ASSERT_EQ(n, 4);
      seen[(size_t)t].fetch_add(1);
    });
    for (auto& s : seen) ASSERT_EQ(s.load(), 1);
  }
}

TEST(ThreadPoolTest, TheFirstExceptionReachesTheCallerAndThePoolStaysUsable) {
  ThreadPool pool(3);
  for (int round = 0; round < 200; ++round) {
    EXPECT_THROW(pool.parallel_for(50, [&](size_t i) {
      if (i == (size_t)(round % 50)) throw std::runtime_error("boom");
    }), std::runtime_error);
    expect_each_index_once(pool, 50);
  }
}
