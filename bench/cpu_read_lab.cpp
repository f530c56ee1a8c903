// How fast can T threads of this host read memory? The ceiling for memory-bound CPU decode (issue #18's
// Q8_0 rows at 4 threads): each form reads one buffer much larger than the L3 once a pass, split in T
// slices, and prints the best and median GB/s of its passes. Forms differ in how a thread walks its slice
// (one stream, several interleaved streams, software fetch ahead, streaming loads) and in whether threads
// are pinned to distinct physical cores. Standalone, no project code (`ninja cpu_read_lab` in a build folder, or):
//   g++ -O2 -std=c++20 -mavx512f -mavx512bw -pthread bench/cpu_read_lab.cpp -o cpu_read_lab
//   ./cpu_read_lab [GiB=4] [threads=4,16] [passes=7]
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

// One 64-byte line folded into an accumulator, so the loads cannot be dropped.
inline __m512i fold(__m512i acc, const uint8_t* p) {
  return _mm512_xor_si512(acc, _mm512_load_si512(reinterpret_cast<const void*>(p)));
}

// A slice as one stream, four lines an iteration; AHEAD > 0 prefetches that many bytes ahead into L1.
template <int AHEAD>
uint64_t read_one_stream(const uint8_t* p, size_t n) {
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i < n; i += 256) {
    if constexpr (AHEAD > 0) {
      _mm_prefetch(reinterpret_cast<const char*>(p + i + AHEAD), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(p + i + AHEAD + 64), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(p + i + AHEAD + 128), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(p + i + AHEAD + 192), _MM_HINT_T0);
    }
    a0 = fold(a0, p + i);
    a1 = fold(a1, p + i + 64);
    a2 = fold(a2, p + i + 128);
    a3 = fold(a3, p + i + 192);
  }
  __m512i a = _mm512_xor_si512(_mm512_xor_si512(a0, a1), _mm512_xor_si512(a2, a3));
  return (uint64_t)_mm512_reduce_add_epi64(a);
}

// The slice cut in S parts read side by side, 256 bytes of each in turn (S streams, as a product that
// walks S weight rows at once).
template <int S>
uint64_t read_streams(const uint8_t* p, size_t n) {
  const size_t part = n / S / 256 * 256;
  __m512i acc[S];
  for (int s = 0; s < S; ++s) acc[s] = _mm512_setzero_si512();
  for (size_t i = 0; i < part; i += 256) {
    for (int s = 0; s < S; ++s) {
      const uint8_t* q = p + (size_t)s * part + i;
      acc[s] = fold(acc[s], q);
      acc[s] = fold(acc[s], q + 64);
      acc[s] = fold(acc[s], q + 128);
      acc[s] = fold(acc[s], q + 192);
    }
  }
  __m512i a = acc[0];
  for (int s = 1; s < S; ++s) a = _mm512_xor_si512(a, acc[s]);
  return (uint64_t)_mm512_reduce_add_epi64(a);
}

uint64_t read_stream_loads(const uint8_t* p, size_t n) {
  __m512i a0 = _mm512_setzero_si512(), a1 = a0;
  for (size_t i = 0; i < n; i += 128) {
    a0 = _mm512_xor_si512(a0, _mm512_stream_load_si512((void*)(p + i)));
    a1 = _mm512_xor_si512(a1, _mm512_stream_load_si512((void*)(p + i + 64)));
  }
  return (uint64_t)_mm512_reduce_add_epi64(_mm512_xor_si512(a0, a1));
}

struct Form {
  const char* name;
  std::function<uint64_t(const uint8_t*, size_t)> read;
};

// One CPU per physical core (the first thread of each core), in the order the kernel lists them.
std::vector<int> one_cpu_per_core() {
  std::vector<int> cpus;
  std::set<std::string> seen;
  for (int c = 0; c < 1024; ++c) {
    std::ifstream f("/sys/devices/system/cpu/cpu" + std::to_string(c) + "/topology/thread_siblings_list");
    if (!f) break;
    std::string s;
    std::getline(f, s);
    if (seen.insert(s).second) cpus.push_back(c);
  }
  return cpus;
}

void pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

// Passes over the buffer by T threads; returns the GB/s of each pass.
std::vector<double> run(const uint8_t* buf, size_t bytes, int threads, const Form& form, int passes,
                        const std::vector<int>* pins) {
  const size_t slice = bytes / threads / 4096 * 4096;
  std::vector<double> gbs;
  std::barrier sync(threads + 1);
  std::atomic<uint64_t> sink{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      if (pins) pin((*pins)[t % pins->size()]);
      for (int k = 0; k < passes; ++k) {
        sync.arrive_and_wait();
        sink += form.read(buf + (size_t)t * slice, slice);
        sync.arrive_and_wait();
      }
    });
  }
  for (int k = 0; k < passes; ++k) {
    auto t0 = Clock::now();
    sync.arrive_and_wait();
    sync.arrive_and_wait();
    double s = std::chrono::duration<double>(Clock::now() - t0).count();
    gbs.push_back((double)slice * threads / s / 1e9);
  }
  for (auto& th : pool) th.join();
  if (sink.load() == 42) std::printf(" ");
  return gbs;
}

std::vector<int> parse_list(const char* s) {
  std::vector<int> v;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) v.push_back(std::atoi(item.c_str()));
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  if (!__builtin_cpu_supports("avx512f")) {
    std::fprintf(stderr, "cpu_read_lab: this CPU has no AVX-512\n");
    return 1;
  }
  const double gib = argc > 1 ? std::atof(argv[1]) : 4.0;
  const std::vector<int> thread_counts = parse_list(argc > 2 ? argv[2] : "4,16");
  const int passes = argc > 3 ? std::atoi(argv[3]) : 7;
  const size_t bytes = (size_t)(gib * (1u << 30)) / (2u << 20) * (2u << 20);
  auto* buf = static_cast<uint8_t*>(std::aligned_alloc(2u << 20, bytes));
  if (!buf) {
    std::fprintf(stderr, "cpu_read_lab: cannot allocate %zu bytes\n", bytes);
    return 1;
  }
  madvise(buf, bytes, MADV_HUGEPAGE);
  for (size_t i = 0; i < bytes; i += 64) std::memset(buf + i, (int)(i >> 6), 64);

  const std::vector<Form> forms = {
      {"one stream", read_one_stream<0>},
      {"one stream, fetch 4 KiB ahead", read_one_stream<4096>},
      {"one stream, fetch 1 KiB ahead", read_one_stream<1024>},
      {"2 streams", read_streams<2>},
      {"4 streams", read_streams<4>},
      {"8 streams", read_streams<8>},
      {"streaming loads", read_stream_loads},
  };
  const std::vector<int> cores = one_cpu_per_core();
  std::printf("%zu MiB, %u CPUs, %zu physical cores (one CPU each: first %d)\n", bytes >> 20,
              std::thread::hardware_concurrency(), cores.size(), cores.empty() ? -1 : cores[0]);
  std::printf("| threads | form | pinned | best GB/s | median GB/s | GB/s a thread |\n|---:|---|---|---:|---:|---:|\n");
  for (int threads : thread_counts) {
    for (int pinned = 0; pinned < 2; ++pinned) {
      for (const Form& f : forms) {
        std::vector<double> g = run(buf, bytes, threads, f, passes, pinned ? &cores : nullptr);
        std::sort(g.begin(), g.end());
        std::printf("| %d | %s | %s | %.1f | %.1f | %.1f |\n", threads, f.name, pinned ? "one a core" : "no",
                    g.back(), g[g.size() / 2], g[g.size() / 2] / threads);
        std::fflush(stdout);
      }
    }
  }
  std::free(buf);
  return 0;
}
