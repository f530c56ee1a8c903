// Speed of the CPU Gated DeltaNet mixer (backend/cpu/delta_net_cpu.h), recurrent vs chunked form, on
// one sequence's run of T rows (T = 1, 8, 64, 512) and on a batch of decode rows, for the Qwen3.5-27B
// layer shape (n_k 16, n_v 48, dk = dv = 128, K 4) and a small one (n_k 4, n_v 8, dk = dv = 64).
// Picks kDeltaNetChunkedMinRows. Run: ninja -C build delta_net_bench && build/delta_net_bench
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/delta_net_cpu.h"
#include "core/rng.h"
#include "core/thread_pool.h"

namespace roofline::cpu {
namespace {

const DeltaNetDims kShapes[] = {{16, 48, 128, 128, 4}, {4, 8, 64, 64, 4}};

struct Setup {
  DeltaNetDims d;
  std::vector<float> conv, dt_bias, a, norm, qkv_in, qkv, z, alpha, beta, out, states;
  std::vector<DeltaNetSeq> seqs;

  Setup(const DeltaNetDims& dims, int n_seqs, int rows_per_seq) : d(dims) {
    Rng rng(42);
    auto normal = [&](size_t n, double sigma) {
      std::vector<float> v(n);
      for (float& x : v) x = (float)(rng.normal() * sigma);
      return v;
    };
    const size_t rows = (size_t)n_seqs * rows_per_seq;
    conv = normal((size_t)d.conv_dim() * d.conv_kernel, 0.5);
    dt_bias.resize(d.n_v_heads);
    a.resize(d.n_v_heads);
    for (int h = 0; h < d.n_v_heads; ++h) {
      dt_bias[h] = rng.uniform(0.0f, 1.0f);
      a[h] = -std::exp(rng.uniform(-1.0f, 1.0f));
    }
    norm.assign(d.head_v, 1.0f);
    qkv_in = normal(rows * d.conv_dim(), 1.0);
    qkv = qkv_in;
    z = normal(rows * d.value_dim(), 1.0);
    alpha = normal(rows * d.n_v_heads, 1.0);
    beta = normal(rows * d.n_v_heads, 1.0);
    out.assign(rows * d.value_dim(), 0.0f);
    states = normal(d.state_floats() * n_seqs, 0.3);
    for (int s = 0; s < n_seqs; ++s)
      seqs.push_back({s * rows_per_seq, rows_per_seq, false, states.data() + d.state_floats() * s});
  }
};

ThreadPool& pool(int n_threads) {
  static ThreadPool one(1), all(ThreadPool::default_thread_count());
  return n_threads == 1 ? one : all;
}

// Args: shape, sequences, rows per sequence, form (1 recurrent, 2 chunked), threads (1 or all). With
// one thread the CPU time is the work, steady even while other jobs share the machine. qkv is scratch: it is
// restored outside the timed part (convolving conv outputs again and again drifts into denormals).
void BM_DeltaNet(benchmark::State& state) {
  Setup s(kShapes[state.range(0)], (int)state.range(1), (int)state.range(2));
  const DeltaNetOptions opt{state.range(3) == 1 ? DeltaNetForm::Recurrent : DeltaNetForm::Chunked, true};
  for (auto _ : state) {
    state.PauseTiming();
    std::copy(s.qkv_in.begin(), s.qkv_in.end(), s.qkv.begin());
    state.ResumeTiming();
    delta_net_forward(s.d, {s.conv.data(), s.dt_bias.data(), s.a.data(), s.norm.data()}, 1e-6f, s.seqs, s.qkv.data(),
                      s.z.data(), s.alpha.data(), s.beta.data(), s.out.data(), pool((int)state.range(4)), opt);
    benchmark::DoNotOptimize(s.out.data());
  }
  state.SetItemsProcessed(state.iterations() * state.range(1) * state.range(2));
  state.SetLabel(std::string(kShapes[state.range(0)].n_v_heads == 48 ? "27B" : "small") +
                 (state.range(3) == 1 ? " recurrent" : " chunked") + (state.range(4) == 1 ? " 1 thread" : ""));
}

void Args(benchmark::internal::Benchmark* b) {
  for (int threads : {1, 2})
    for (int shape : {0, 1}) {
      for (int rows : {1, 8, 16, 32, 64, 128, 512})
        for (int form : {1, 2}) b->Args({shape, 1, rows, form, threads});
      b->Args({shape, 16, 1, 1, threads});  // 16 decoding sequences
    }
}
double min_of(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }
BENCHMARK(BM_DeltaNet)->Apply(Args)->Unit(benchmark::kMicrosecond)->ComputeStatistics("min", min_of);

}  // namespace
}  // namespace roofline::cpu

BENCHMARK_MAIN();
