// The server's cap on glibc malloc arenas (serve/malloc_arenas.h): with it, 40 threads that allocate at
// once share at most kServerMallocArenas arenas; without it they get more (the control, on 2+ cores).
// Each case runs in a fresh process (a threadsafe death test), since arenas made by earlier tests stay.
#include <gtest/gtest.h>

#include <cstdlib>
#include <latch>
#include <thread>
#include <vector>

#include "serve/malloc_arenas.h"

using namespace roofline::serve;

namespace {

// Arenas in use while 40 threads each hold some small blocks (made after capping when `cap`).
int arenas_with_40_threads(bool cap) {
  if (cap) limit_malloc_arenas();
  constexpr int kThreads = 40;
  std::latch allocated(kThreads + 1), release(1);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i)
    threads.emplace_back([&] {
      std::vector<void*> blocks;
      for (int k = 0; k < 200; ++k) blocks.push_back(std::malloc(64 + k));
      allocated.count_down();
      release.wait();
      for (void* b : blocks) std::free(b);
    });
  allocated.arrive_and_wait();
  const int n = count_malloc_arenas();
  release.count_down();
  for (auto& t : threads) t.join();
  return n;
}

}  // namespace

TEST(MallocArenas, TheServersCapHoldsUnderManyThreads) {
  if (std::getenv("MALLOC_ARENA_MAX") || std::getenv("GLIBC_TUNABLES")) GTEST_SKIP() << "malloc is tuned from the environment";
  if (count_malloc_arenas() < 0) GTEST_SKIP() << "not glibc malloc";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(std::exit(arenas_with_40_threads(true) <= kServerMallocArenas ? 0 : 1), ::testing::ExitedWithCode(0), "");
  if (std::thread::hardware_concurrency() >= 2) {  // glibc's own limit is 8 per core: more than the cap
    EXPECT_EXIT(std::exit(arenas_with_40_threads(false) > kServerMallocArenas ? 0 : 1), ::testing::ExitedWithCode(0), "");
  }
}
