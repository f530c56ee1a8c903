// Throughput of the CPU dot kernels (backend/cpu/vec_dot.h): GB/s of weight data streamed through a
// [rows x cols] matrix for one token (one dot per row) and for a batch of tokens (the prefill tile),
// hot (one matrix, cache-resident where it fits) and cold (rotating over copies larger than L3); and the
// same through the packed kernels (backend/cpu/packed_weights.h) for the types that have them.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cpu/packed_weights.h"
#include "backend/cpu/vec_dot.h"
#include "core/fp16.h"
#include "core/thread_pool.h"
#include "core/rng.h"
#include "formats/quant_blocks.h"

namespace roofline::cpu {
namespace {

// Random level bytes with every scale field set to a sane f16 (speed does not depend on values).
std::vector<uint8_t> random_matrix(DType t, int64_t rows, int64_t cols, uint64_t seed) {
  std::vector<uint8_t> m(dtype_row_bytes(t, cols) * (size_t)rows);
  Rng rng(seed);
  for (size_t i = 0; i + 8 <= m.size(); i += 8) {
    const uint64_t v = rng.next_u64();
    std::memcpy(m.data() + i, &v, 8);
  }
  const uint16_t h = f32_to_fp16(0.01f);
  size_t bb = dtype_block_bytes(t), off = 0, off2 = SIZE_MAX;
  switch (t) {
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q4_1:
    case DType::Q5_1: off2 = 2; break;  // d and dmin / d and m
    case DType::Q6_K: off = offsetof(BlockQ6_K, d); break;
    case DType::Q3_K: off = offsetof(BlockQ3_K, d); break;
    case DType::Q2_K:
      off = offsetof(BlockQ2_K, d);
      off2 = offsetof(BlockQ2_K, dmin);
      break;
    case DType::F16:
    case DType::BF16: bb = 2; break;
    default: break;
  }
  for (size_t b = 0; b < m.size() / bb; ++b) {
    std::memcpy(m.data() + b * bb + off, &h, 2);
    if (off2 != SIZE_MAX) std::memcpy(m.data() + b * bb + off2, &h, 2);
  }
  return m;
}

struct Setup {
  int64_t rows, cols;
  std::vector<std::vector<uint8_t>> mats;  // copies, to defeat the caches in the cold runs
  std::vector<uint8_t> act;                // kActRows activation rows
  size_t w_row, a_row;
  std::vector<std::vector<uint8_t>> packed;  // the copies packed (types with a packed kernel)
  std::vector<float> act_scales;             // the activation rows' block sums for the packed kernels
  std::vector<int32_t> act_sums;
  std::vector<KSums> act_k_sums;
  std::vector<uint8_t> act_tiles;  // the rows in AMX tile order (the prompt kernels)
  PackedActs packed_acts() const {
    const int64_t nb = cols / dtype_block_size(mats.empty() ? DType::F32 : type);
    return PackedActs{act.data(), a_row, act_scales.data(), act_sums.data(), act_k_sums.data(), (size_t)nb,
                      act_tiles.empty() ? nullptr : act_tiles.data()};
  }
  DType type = DType::F32;
};

constexpr int kActRows = 128;  // activation rows prepared (the most any benchmark multiplies at once)

Setup& setup(DType t, int64_t rows, int64_t cols, int copies) {
  static std::vector<std::pair<std::tuple<DType, int64_t, int64_t, int>, std::unique_ptr<Setup>>> cache;
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  for (auto& [key, s] : cache) {
    if (key == std::make_tuple(t, rows, cols, copies)) return *s;
  }
  auto s = std::make_unique<Setup>();
  s->rows = rows;
  s->cols = cols;
  s->type = t;
  for (int c = 0; c < copies; ++c) s->mats.push_back(random_matrix(t, rows, cols, 1 + c));
  if (packed_entry_bytes(t) > 0) {
    for (const auto& m : s->mats) {
      s->packed.emplace_back(packed_group_bytes(t, cols) * (size_t)(rows / kPackRows));
      pack_groups(t, m.data(), rows, cols, 0, rows / kPackRows, s->packed.back().data());
    }
  }
  const ActFormat f = act_format_for(t);
  s->w_row = dtype_row_bytes(t, cols);
  s->a_row = act_row_bytes(f, cols);
  s->act.resize(s->a_row * kActRows);
  Rng rng(99);
  std::vector<float> x((size_t)cols);
  for (int r = 0; r < kActRows; ++r) {
    for (float& v : x) v = (float)rng.normal();
    quantize_act_row(f, x.data(), s->act.data() + r * s->a_row, cols);
  }
  const int64_t nb = cols / dtype_block_size(t);
  if (f == ActFormat::Q8_0) {
    s->act_scales.resize((size_t)(kActRows * nb));
    s->act_sums.resize((size_t)(kActRows * nb));
    for (int r = 0; r < kActRows; ++r)
      q8_0_scales_and_sums(s->act.data() + r * s->a_row, nb, s->act_scales.data() + r * nb, s->act_sums.data() + r * nb);
  }
  if (f == ActFormat::Q8_K) {
    s->act_k_sums.resize((size_t)(kActRows * nb));
    for (int r = 0; r < kActRows; ++r) q8_k_sums(s->act.data() + r * s->a_row, nb, s->act_k_sums.data() + r * nb);
  }
  if (f == ActFormat::Q8_0 || f == ActFormat::Q8_K) {
    s->act_tiles.resize(act_tiles_bytes(kActRows, cols));
    build_act_tiles(f, s->act.data(), s->a_row, kActRows, cols, s->act_tiles.data());
  }
  cache.emplace_back(std::make_tuple(t, rows, cols, copies), std::move(s));
  return *cache.back().second;
}

// Args: tokens (0: one single dot per row; >= 1: the tile over that many activation rows, as matmul
// runs decode (1) and prefill), cold (0/1). ROOFLINE_CPU_ISA=avx2|avx512|scalar picks the kernels.
// One iteration is a chunk of kChunkRows rows (the next chunk of the matrix, or of the next copy when
// cold); the machine is shared, so rates come from the fastest chunk (short enough to run
// unpreempted) as well as from the CPU time of all of them.
constexpr int64_t kChunkRows = 256;

// Runs `chunk_fn(matrix copy, first row)` once per iteration over the chunks of the matrices (threads take
// interleaved chunks, so together they stream each matrix once) and reports per thread (summed over
// threads), from the fastest chunk: GB/s of weights, multiply-adds/s.
template <typename ChunkFn>
void run_chunks(benchmark::State& state, const Setup& s, int tokens, const std::string& label, ChunkFn chunk_fn) {
  const int64_t n_chunks = s.rows / kChunkRows;
  int64_t chunk = state.thread_index();
  size_t m = 0;
  double best = 1e30;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    chunk_fn(m, chunk * kChunkRows);
    benchmark::ClobberMemory();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    chunk += state.threads();
    if (chunk >= n_chunks) {
      chunk = state.thread_index();
      m = (m + 1) % s.mats.size();
    }
  }
  const double bytes = (double)kChunkRows * (double)s.w_row;
  state.SetBytesProcessed((int64_t)(bytes * (double)state.iterations()));
  state.counters["GBps_best"] = bytes / best * 1e-9;
  state.counters["GMACps_best"] = (double)kChunkRows * (double)s.cols * std::max(tokens, 1) / best * 1e-9;
  state.SetLabel(label + (state.range(1) != 0 ? " cold" : " hot"));
}

void BM_Matmul(benchmark::State& state, DType t) {
  const int tokens = (int)state.range(0);  // 0: single dots on one activation row
  Setup& s = setup(t, 6144, 2048, state.range(1) != 0 ? 12 : 1);
  const VecDotFn dot = vec_dot_fn(t);
  const VecDotTileFn tile = vec_dot_tile_fn(t);
  std::vector<float> y((size_t)s.rows * std::max(tokens, 1));
  run_chunks(state, s, tokens, cpu_simd_name(), [&](size_t m, int64_t r0) {
    const uint8_t* w = s.mats[m].data();
    if (tokens == 0) {
      for (int64_t r = r0; r < r0 + kChunkRows; ++r) y[(size_t)r] = dot(w + (size_t)r * s.w_row, s.act.data(), s.cols);
    } else {
      tile(w + (size_t)r0 * s.w_row, s.w_row, (int)kChunkRows, s.act.data(), s.a_row, tokens, s.cols, y.data() + r0,
           (size_t)s.rows);
    }
    benchmark::DoNotOptimize(y.data());
  });
}

// One packed kernel over a packed matrix, tokens activation rows per call.
void run_packed(benchmark::State& state, DType t, PackedTileFn tile, const char* label) {
  const int tokens = (int)state.range(0);
  Setup& s = setup(t, 6144, 2048, state.range(1) != 0 ? 12 : 1);
  const size_t group_bytes = packed_group_bytes(t, s.cols);
  const PackedActs acts = s.packed_acts();
  std::vector<float> y((size_t)s.rows * tokens);
  run_chunks(state, s, tokens, label, [&](size_t m, int64_t r0) {
    tile(s.packed[m].data() + (size_t)(r0 / kPackRows) * group_bytes, group_bytes, (int)kChunkRows, acts, 0, tokens,
         s.cols, y.data() + r0, (size_t)s.rows);
    benchmark::DoNotOptimize(y.data());
  });
}

// The packed kernels (tokens >= 1 only: decode runs them with one activation row).
void BM_MatmulPacked(benchmark::State& state, DType t) {
  const PackedTileFn tile = packed_tile_fn(t);
  if (!tile || state.range(0) == 0) {
    state.SkipWithError("no packed kernel for this type on this CPU (or tokens = 0)");
    return;
  }
  run_packed(state, t, tile, "packed");
}

// The packed matrices' prompt kernels (AMX where the CPU has it; the same bits as BM_MatmulPacked's) over
// prompt-sized tiles of activation rows.
void BM_MatmulPackedPrompt(benchmark::State& state, DType t) {
  const PackedTileFn tile = detail::amx_packed_tile(t);
  if (!tile) {
    state.SkipWithError("no prompt (AMX) kernel for this type on this CPU");
    return;
  }
  run_packed(state, t, tile, "prompt");
}

void PromptArgs(benchmark::internal::Benchmark* b) {
  b->ArgNames({"tokens", "cold"});
  for (int tokens : {16, 32, 64, 128}) b->Args({tokens, 0});
  b->Threads(1);
}

void Args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"tokens", "cold"});
  for (int cold : {0, 1}) {
    for (int tokens : {0, 1, 4, 8, 16}) b->Args({tokens, cold});
  }
  b->Threads(1)->Threads(2);
}

BENCHMARK_CAPTURE(BM_Matmul, Q4_K, DType::Q4_K)->Apply(Args);
BENCHMARK_CAPTURE(BM_Matmul, Q6_K, DType::Q6_K)->Apply(Args);
BENCHMARK_CAPTURE(BM_Matmul, Q8_0, DType::Q8_0)->Apply(Args);
BENCHMARK_CAPTURE(BM_Matmul, Q5_K, DType::Q5_K)->Apply(Args);
BENCHMARK_CAPTURE(BM_Matmul, IQ4_XS, DType::IQ4_XS)->Apply(Args);
BENCHMARK_CAPTURE(BM_Matmul, Q4_0, DType::Q4_0)->Apply(Args);
BENCHMARK_CAPTURE(BM_Matmul, Q3_K, DType::Q3_K)->Apply(Args);
BENCHMARK_CAPTURE(BM_Matmul, Q2_K, DType::Q2_K)->Apply(Args);
BENCHMARK_CAPTURE(BM_Matmul, IQ4_NL, DType::IQ4_NL)->Apply(Args);
BENCHMARK_CAPTURE(BM_Matmul, Q4_1, DType::Q4_1)->Apply(Args);
BENCHMARK_CAPTURE(BM_Matmul, Q5_1, DType::Q5_1)->Apply(Args);
BENCHMARK_CAPTURE(BM_Matmul, F32, DType::F32)->Apply(Args);
BENCHMARK_CAPTURE(BM_Matmul, F16, DType::F16)->Apply(Args);
BENCHMARK_CAPTURE(BM_Matmul, BF16, DType::BF16)->Apply(Args);
BENCHMARK_CAPTURE(BM_MatmulPacked, Q4_K, DType::Q4_K)->Apply(Args);
BENCHMARK_CAPTURE(BM_MatmulPacked, Q5_K, DType::Q5_K)->Apply(Args);
BENCHMARK_CAPTURE(BM_MatmulPacked, Q6_K, DType::Q6_K)->Apply(Args);
BENCHMARK_CAPTURE(BM_MatmulPacked, Q8_0, DType::Q8_0)->Apply(Args);
BENCHMARK_CAPTURE(BM_MatmulPacked, Q4_0, DType::Q4_0)->Apply(Args);
BENCHMARK_CAPTURE(BM_MatmulPackedPrompt, Q4_K, DType::Q4_K)->Apply(PromptArgs);
BENCHMARK_CAPTURE(BM_MatmulPackedPrompt, Q5_K, DType::Q5_K)->Apply(PromptArgs);
BENCHMARK_CAPTURE(BM_MatmulPackedPrompt, Q6_K, DType::Q6_K)->Apply(PromptArgs);
BENCHMARK_CAPTURE(BM_MatmulPackedPrompt, Q8_0, DType::Q8_0)->Apply(PromptArgs);
BENCHMARK_CAPTURE(BM_MatmulPackedPrompt, Q4_0, DType::Q4_0)->Apply(PromptArgs);

// One parallel_for of a pool of `threads` threads over `tasks` tasks that each add to one float of their
// own (64 bytes apart): the cost of a dispatch, its wake-ups and the task hand-out, as the many short
// parallel steps of a forward step see it.
void BM_PoolDispatch(benchmark::State& state) {
  static std::unique_ptr<ThreadPool> pool;
  if (!pool || pool->size() != (int)state.range(0)) pool = std::make_unique<ThreadPool>((int)state.range(0));
  const size_t tasks = (size_t)state.range(1);
  std::vector<float> sink(tasks * 16);
  for (auto _ : state) {
    pool->parallel_for(tasks, [&](size_t i) { sink[i * 16] += 1.0f; });
    benchmark::ClobberMemory();
  }
  state.SetLabel(std::to_string(state.range(0)) + " threads, " + std::to_string(tasks) + " tasks");
}
BENCHMARK(BM_PoolDispatch)->ArgNames({"pool", "tasks"})->ArgsProduct({{2, 4, 8, 16}, {2, 16, 128, 1024}})->UseRealTime();

}  // namespace
}  // namespace roofline::cpu

BENCHMARK_MAIN();
