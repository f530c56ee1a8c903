// ThreadPool: every index runs exactly once per parallel_for, over many back-to-back jobs (the spinning
// hand-off) and after the workers have gone to sleep (the condition-variable path); run_on_all gives each
// thread its index once; parallel_ranges covers [0, n) exactly once in ranges that shrink towards the end
// and are never shorter than asked (but for the last); the first exception reaches the caller and the pool stays usable.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <utility>
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

TEST(ThreadPoolTest, GuidedRangesCoverEveryIndexOnceAndShrinkTowardsTheEnd) {
  for (int threads : {1, 2, 3, 4, 7}) {
    ThreadPool pool(threads);
    for (size_t n : {1, 2, 5, 16, 17, 100, 1000, 4099}) {
      for (size_t min_take : {0, 1, 3, 64}) {
        std::vector<std::atomic<int>> hits(n);
        std::mutex mutex;
        std::vector<std::pair<size_t, size_t>> ranges;
        pool.parallel_ranges(n, min_take, [&](size_t u0, size_t u1) {
          ASSERT_LT(u0, u1);
          ASSERT_LE(u1, n);
          for (size_t i = u0; i < u1; ++i) hits[i].fetch_add(1);
          std::lock_guard<std::mutex> lock(mutex);
          ranges.emplace_back(u0, u1);
        });
        for (size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "index " << i << " of " << n;
        std::sort(ranges.begin(), ranges.end());
        for (size_t k = 0; k + 1 < ranges.size(); ++k) {
          const size_t len = ranges[k].second - ranges[k].first;
          EXPECT_GE(len, std::max<size_t>(1, min_take)) << "a range before the last shorter than asked";
        }
        if (threads > 1 && n >= 1000 && min_take <= 1) {  // the first range is long, the last ones short
          EXPECT_GE(ranges.front().second - ranges.front().first, n / (4 * (size_t)threads));
          EXPECT_LE(ranges.back().second - ranges.back().first, n / (2 * (size_t)threads));
        }
      }
    }
  }
}
