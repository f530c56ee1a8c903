// What the packed kernels of every instruction set share (packed_avx512.cpp, packed_kernels_avx2.cpp): the
// activation rows of a tile as they read them, an unaligned 4-byte load, the fetch-ahead of the few-row
// K-quant loops, and the 6-bit scales and mins of the 16 rows of a packed Q4_K / Q5_K entry. Include it inside a kernel file's target region, after its
// other headers: everything here has internal linkage, so each file compiles its own copy for its own
// instruction set (no AVX2 or AVX-512 copy of a shared inline function can be the one the linker keeps).
// No include guard and no includes of its own: one inclusion per kernel file, which has <immintrin.h>,
// <cpuid.h>, <cstdint>, <cstdlib>, <cstring>, packed_weights.h and quant_blocks.h already.
namespace roofline::cpu {
namespace {

inline int32_t load32(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

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
// fetches into the L2: the switches that measure it on other CPUs. The AVX2 kernels fetch in the Q4_K/Q5_K
// loops only, always.
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

// The activation rows c0 .. c0 + NA - 1 of a tile (Q8_0): their blocks, float scales and level sums.
template <int NA>
struct Rows {
  const BlockQ8_0* q[NA];
  const float* d[NA];
  const int32_t* sum[NA];
  Rows(const PackedActs& a, int c0) {
    for (int j = 0; j < NA; ++j) {
      q[j] = reinterpret_cast<const BlockQ8_0*>(a.rows + (size_t)(c0 + j) * a.row_stride);
      d[j] = a.scales + (size_t)(c0 + j) * a.blocks_per_row;
      sum[j] = a.sums + (size_t)(c0 + j) * a.blocks_per_row;
    }
  }
};

// The activation rows c0 .. c0 + NA - 1 of a K-quant tile (Q8_K): blocks and sub-block sums.
template <int NA>
struct RowsK {
  const BlockQ8_K* q[NA];
  const KSums* sums[NA];
  RowsK(const PackedActs& a, int c0) {
    for (int j = 0; j < NA; ++j) {
      q[j] = reinterpret_cast<const BlockQ8_K*>(a.rows + (size_t)(c0 + j) * a.row_stride);
      sums[j] = a.k_sums + (size_t)(c0 + j) * a.blocks_per_row;
    }
  }
};

// The 6-bit scales and mins of a packed Q4_K / Q5_K entry's 16 rows (the transposed scale bytes of
// packed_weights.h: byte k of row i at 16k + i), decoded as unpack_k4_scale_min does per row, with 128-bit
// integer ops: sc[k] and mn[k] hold sub-block k's scale and min of row i in byte i.
inline void decode_k4_scales(const uint8_t* scale_bytes, __m128i sc[8], __m128i mn[8]) {
  const __m128i m63 = _mm_set1_epi8(63), m15 = _mm_set1_epi8(15), m3 = _mm_set1_epi8(3);
  __m128i B[12];
  for (int k = 0; k < 12; ++k) B[k] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(scale_bytes + 16 * k));
  for (int k = 0; k < 4; ++k) {
    sc[k] = _mm_and_si128(B[k], m63);
    mn[k] = _mm_and_si128(B[k + 4], m63);
  }
  for (int k = 4; k < 8; ++k) {
    sc[k] = _mm_or_si128(_mm_and_si128(B[k + 4], m15), _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(B[k - 4], 6), m3), 4));
    mn[k] = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(B[k + 4], 4), m15), _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(B[k], 6), m3), 4));
  }
}

}  // namespace
}  // namespace roofline::cpu
