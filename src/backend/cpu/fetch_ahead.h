// The fetch-ahead rule of the CPU's decode loops: whether a kernel's one- and two-row loop asks for its
// weights a few KiB ahead of where it reads, by CPU and by switch. Included by packed_kernel_common.h and by
// vec_dot_avx2.cpp inside their target regions; everything has internal linkage (each kernel file keeps its
// own copy, as packed_kernel_common.h explains). Needs <cpuid.h>, <cstdlib>, <cstring> and <immintrin.h>.
// No include guard: one inclusion per kernel file.
namespace roofline::cpu {
namespace {

// Fetch-ahead in the one- and two-row loops (decode), 4 KiB ahead into the L1. On an AMD EPYC the Q4_K/Q5_K
// loops read memory at 18-21 GB/s a core (AVX2: 15) without it, where the other packed types read 45-50:
// that CPU's prefetchers do not keep up with them; fetching brings them to 47 (AVX2: 24-26), while the other
// types' loops measured the same or 5-10% slower with it (cpu_vec_dot_bench, one thread, cold). On the GPU
// machine's Intel Xeon host every type gains: qwen3-8b / qwen3-1.7b decode at 4 threads +15-30% (Q8_0) and
// +27-36% (Q4_0), qwen3-8b Q4_0 at 16 threads +26% (docs/performance.md, tenth session). On an AMD EPYC of
// family 1Ah (Zen 5) the Q6_K loop reads 35-36 GB/s a core without it and 47 with it, and decode at 2 threads
// gains 10-17% (twenty-ninth session). So Intel CPUs and AMD ones from family 1Ah fetch in every type's loop,
// others (Zen 4 and older) in the Q4_K/Q5_K loops only. ROOFLINE_CPU_FETCH=all / k / none chooses
// instead, ROOFLINE_CPU_FETCH_AHEAD sets the distance (bytes, 512-65536) and ROOFLINE_CPU_FETCH_HINT=l2
// fetches into the L2: the switches that measure it on other CPUs. The AVX2 packed kernels fetch in the
// Q4_K/Q5_K loops only, always. The plain float kernels (F32, F16, BF16 weights, vec_dot_avx2.cpp) follow the
// rule of the "other" types: on the Zen 5 development machine a qwen3-0.6b F16 / BF16 file decodes at 2
// threads 14% faster with it (docs/performance.md, thirty-second session).
constexpr size_t kPrefetchAhead = 4096;
// The CPU's family from CPUID leaf 1 (base family, plus the extended family when the base is 0Fh).
inline unsigned cpu_family() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
  const unsigned base = (a >> 8) & 0xF;
  return base == 0xF ? base + ((a >> 20) & 0xFF) : base;
}
enum class FetchKind { KQuant4, Other };
struct FetchConfig {
  bool k_quant4 = true, other = false, to_l2 = false;
  size_t ahead = kPrefetchAhead;
  FetchConfig() {
    __builtin_cpu_init();
    other = __builtin_cpu_is("intel") || (__builtin_cpu_is("amd") && cpu_family() >= 0x1A);
    if (const char* m = std::getenv("ROOFLINE_CPU_FETCH")) {
      const bool all = std::strcmp(m, "all") == 0, none = std::strcmp(m, "none") == 0;
      k_quant4 = !none;
      other = all;
    }
    if (const char* h = std::getenv("ROOFLINE_CPU_FETCH_HINT")) to_l2 = std::strcmp(h, "l2") == 0;
    if (const char* a = std::getenv("ROOFLINE_CPU_FETCH_AHEAD")) {
      const long v = std::atol(a);
      if (v >= 512 && v <= 65536) ahead = (size_t)v / 64 * 64;
    }
  }
};
inline const FetchConfig& fetch_config() {
  static const FetchConfig config;
  return config;
}
inline bool fetches(FetchKind k) { return k == FetchKind::KQuant4 ? fetch_config().k_quant4 : fetch_config().other; }
// The kEntry bytes at p, one line at a time, into the L1 (or the L2: to_l2). Callers read fetch_config()
// once before their loop, not per entry.
template <size_t kEntry>
inline void prefetch_entry(const uint8_t* p, bool to_l2) {
  if (to_l2) {
    for (size_t o = 0; o < kEntry; o += 64) _mm_prefetch(reinterpret_cast<const char*>(p + o), _MM_HINT_T1);
  } else {
    for (size_t o = 0; o < kEntry; o += 64) _mm_prefetch(reinterpret_cast<const char*>(p + o), _MM_HINT_T0);
  }
}

}  // namespace
}  // namespace roofline::cpu
