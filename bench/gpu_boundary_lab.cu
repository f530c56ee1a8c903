// A standalone lab for what a kernel boundary costs in a decode step on sm_90, and whether waiting on a
// counter instead of the programmatic-dependent-launch wait makes it cheaper. A decode step is emulated
// as a chain of kernels with the launch shapes and weight bytes of qwen3-8b and qwen3-32b layers (per
// layer: norm, q/k/v product, rope, attention, combine, o product, norm, gate+up product, SwiGLU, down
// product; the products read their bytes from a pool larger than the L2, the small kernels move a few
// KB), captured in one CUDA graph and replayed. The chain is the same in every mode; only how a kernel
// waits for its predecessor changes:
//   plain     no programmatic dependent launch (each kernel starts when the previous one has ended)
//   pdl       griddepcontrol.wait then launch_dependents at the start (the engine's wait_for_previous_kernel)
//   pdl-pre   as pdl, with the product's weight loads issued before the wait (into registers)
//   flag      launch_dependents first, then CTA 0's thread 0 polls a step counter that every CTA of the
//             previous kernels adds 1 to when its stores are done (release / acquire), the counter reset at
//             the step's start by a memset node
//   flag-pre  as flag, with the weight loads issued before the poll (and once more with a 100 ns pause
//             between the poll's reads)
//   persist   the whole step as one kernel, one CTA a SM: a producer warp streams the CTA's share of every
//             product, in step order, into a ring of shared-memory stages by TMA bulk copies, as far ahead as
//             the ring allows (weights depend on nothing), while the consumer warps take the ring in order and
//             wait before each op until every CTA has finished the op before (Barrier: a count polled by all, a
//             word the last CTA publishes, or no wait at all for timing). The small ops run on their CTA counts
//             while the other CTAs' producers keep filling their rings. Run with rings of 2 and of 12 stages of
//             16 KiB (how much of the lead matters). docs/performance.md (thirty-seventh session) has the outcome.
// The shapes with "5 ops" have only the boundaries a fused layer keeps (q/k/v, attention, o, gate+up, down):
// what a step whose norms, rope and SwiGLU ride in the products would pay.
// Prints per mode and model: us per step, us per layer, and the step's weight bytes over its time.
// Build: nvcc -O3 -arch=sm_90 -std=c++17 bench/gpu_boundary_lab.cu -o gpu_boundary_lab
// Run: gpu_boundary_lab [replays]
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "gpu_lab_common.cuh"


enum Mode { kPlain, kPdl, kPdlPre, kFlag, kFlagPre, kModes };
const char* kModeNames[kModes] = {"plain", "pdl", "pdl-pre", "flag", "flag-pre"};

constexpr int kThreads = 128;
constexpr int kLoads = 12;  // 16-byte weight loads per thread per round: a CTA reads 24 KiB a round

__device__ unsigned long long g_done;  // CTAs of the step's kernels that have finished (reset each step)
__constant__ int c_sleep_ns;           // the poll's pause between reads (0: none)

__device__ __forceinline__ unsigned long long load_acquire(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

template <int M>
__device__ __forceinline__ void wait_prev(unsigned long long target) {
  if constexpr (M == kPdl || M == kPdlPre) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;");
  } else if constexpr (M == kFlag || M == kFlagPre) {
    if (threadIdx.x == 0)
      while (load_acquire(&g_done) < target)
        if (c_sleep_ns) __nanosleep(c_sleep_ns);
    __syncthreads();
  }
}

template <int M>
__device__ __forceinline__ void start() {
  if constexpr (M == kFlag || M == kFlagPre) asm volatile("griddepcontrol.launch_dependents;");
}

template <int M>
__device__ __forceinline__ void finish() {
  if constexpr (M == kFlag || M == kFlagPre) {
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();
      asm volatile("red.release.gpu.global.add.u64 [%0], 1;" ::"l"(&g_done) : "memory");
    }
  }
}

// A product: CTA b reads [b * chunk, (b + 1) * chunk) of w (rounds of kThreads * kLoads 16-byte loads), and
// the previous kernel's output vector (n_in floats); writes one float per thread.
template <int M>
__global__ void __launch_bounds__(kThreads) product_kernel(const int4* w, int64_t chunk16, const float* in, int n_in, float* out,
                                                           unsigned long long target) {
  start<M>();
  const int64_t base = blockIdx.x * chunk16;
  int4 v[kLoads];
  constexpr bool pre = M == kPdlPre || M == kFlagPre;
  if constexpr (pre) {
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {
      const int64_t k = threadIdx.x + (int64_t)i * kThreads;
      v[i] = k < chunk16 ? __ldcs(w + base + k) : int4{0, 0, 0, 0};
    }
  }
  wait_prev<M>(target);
  float acc = 0;
  for (int i = threadIdx.x; i < n_in; i += kThreads) acc += in[i];
  int sum = 0;
  for (int64_t r = 0; r < chunk16; r += kThreads * kLoads) {
    if (!pre || r > 0) {
#pragma unroll
      for (int i = 0; i < kLoads; ++i) {
        const int64_t k = r + threadIdx.x + (int64_t)i * kThreads;
        v[i] = k < chunk16 ? __ldcs(w + base + k) : int4{0, 0, 0, 0};
      }
    }
#pragma unroll
    for (int i = 0; i < kLoads; ++i) sum += v[i].x ^ v[i].y ^ v[i].z ^ v[i].w;
  }
  out[(blockIdx.x % 4096) * kThreads + threadIdx.x] = acc + (float)(sum & 1);  // (the buffers hold 4096 CTAs' floats)
  finish<M>();
}

// A small op: each CTA reads n_in floats of the previous output and writes kThreads floats.
template <int M>
__global__ void __launch_bounds__(kThreads) small_kernel(const float* in, int n_in, float* out, unsigned long long target) {
  start<M>();
  wait_prev<M>(target);
  float acc = 0;
  for (int i = threadIdx.x; i < n_in; i += kThreads) acc += in[i];
  __shared__ float red[kThreads];
  red[threadIdx.x] = acc;
  __syncthreads();
  out[(blockIdx.x % 4096) * kThreads + threadIdx.x] = red[(threadIdx.x + 1) % kThreads] * 0.5f;
  finish<M>();
}

struct Op {
  int64_t bytes;  // 0: a small op
  int ctas;       // small ops: CTAs
};

struct Shape {
  const char* name;
  int layers;
  std::vector<Op> layer;
};

template <typename K, typename... Args>
void launch(K kernel, int grid, bool pdl, cudaStream_t s, Args... args) {
  cudaLaunchConfig_t c{};
  c.gridDim = dim3(grid);
  c.blockDim = dim3(kThreads);
  c.stream = s;
  cudaLaunchAttribute a[1];
  if (pdl) {
    a[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    a[0].val.programmaticStreamSerializationAllowed = 1;
    c.attrs = a;
    c.numAttrs = 1;
  }
  CHECK(cudaLaunchKernelEx(&c, kernel, args...));
}

// One step as a CUDA graph, timed: the step counter `counter` (a __device__ symbol of 8 bytes) zeroed by a memset node, then what
// `enqueue(stream)` launches; the microseconds of one replay.
template <typename Counter, typename F>
double time_step(const Counter& counter, int replays, F enqueue) {
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  void* counter_ptr = nullptr;
  CHECK(cudaGetSymbolAddress(&counter_ptr, counter));
  cudaGraph_t graph;
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  CHECK(cudaMemsetAsync(counter_ptr, 0, 8, s));
  enqueue(s);
  CHECK(cudaStreamEndCapture(s, &graph));
  const double us = replay_graph_us(graph, s, replays);
  CHECK(cudaStreamDestroy(s));
  return us;
}

template <int M>
double run_mode(const Shape& sh, const uint8_t* pool, int64_t pool_bytes, float* bufs, int replays, int64_t* step_bytes) {
  const bool pdl = M != kPlain;
  int64_t offset = 0, bytes = 0;
  const double us = time_step(g_done, replays, [&](cudaStream_t s) {
    unsigned long long before = 0;  // CTAs of the step's kernels before this one
    int cur = 0, prev_ctas = 1;
    for (int l = 0; l < sh.layers; ++l)
      for (const Op& op : sh.layer) {
        const float* in = bufs + (size_t)cur * (1 << 20);
        float* out = bufs + (size_t)(cur ^ 1) * (1 << 20);
        const int n_in = std::min(prev_ctas * kThreads, 4096);
        int ctas;
        if (op.bytes > 0) {
          const int64_t chunk = 18432;  // 8 rows of 2304 bytes: the engine's CTA of 4 warps x 2 rows of qwen3-8b
          ctas = (int)((op.bytes + chunk - 1) / chunk);
          if (offset + (int64_t)ctas * chunk > pool_bytes) offset = 0;
          launch(product_kernel<M>, ctas, pdl, s, reinterpret_cast<const int4*>(pool + offset), chunk / 16, in, n_in, out, before);
          offset += (int64_t)ctas * chunk;
          bytes += (int64_t)ctas * chunk;
        } else {
          ctas = op.ctas;
          launch(small_kernel<M>, ctas, pdl, s, in, n_in, out, before);
        }
        before += ctas;
        prev_ctas = ctas;
        cur ^= 1;
      }
  });
  *step_bytes = bytes;
  return us;
}

// ---- persist: the step as one kernel ----
constexpr int kConsumerWarps = 8;
constexpr int kConsumerThreads = 32 * kConsumerWarps;
constexpr int kPersistThreads = kConsumerThreads + 32;  // the last warp produces
constexpr int kStageBytes = 16384;
constexpr int kMaxStages = 12;

struct PersistOp {
  int64_t offset;  // in the pool
  int64_t bytes;   // 0: a small op
  int ctas;        // small ops: the CTAs that run it
};

// CTAs that finished an op, over the step; the last op every CTA has finished (the "last" barrier). Reset each step.
__device__ unsigned int g_arrived[2];
// How the consumers wait between ops: every CTA polls the arrival count; the CTA that arrives last publishes
// the op in a second word that the others poll, with a 32 ns pause between reads; no wait at all (timing
// only: the ops' data dependencies are not kept).
enum Barrier { kCount, kLast, kNone, kBarriers };
const char* kBarrierNames[kBarriers] = {"count", "last", "none"};

__device__ __forceinline__ uint32_t smem_addr(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mbar_init(uint64_t* b, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(b)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* b, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(b)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* b) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(b)) : "memory");
}
// Waits until the phase of parity `parity` of the barrier has completed.
__device__ __forceinline__ void mbar_wait(uint64_t* b, uint32_t parity) {
  uint32_t done = 0;
  while (!done)
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_addr(b)), "r"(parity)
        : "memory");
}
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(smem_addr(dst)), "l"(src),
               "r"(bytes), "r"(smem_addr(bar))
               : "memory");
}
// The consumer warps only (named barrier 1), so the producer warp never waits with them.
__device__ __forceinline__ void consumers_sync() { asm volatile("bar.sync 1, %0;" ::"n"(kConsumerThreads) : "memory"); }

// CTA `cta` of `grid` takes [begin, begin + share) of a product's bytes (16-byte aligned shares).
__device__ __forceinline__ void share_of(int64_t bytes, int cta, int grid, int64_t* begin, int64_t* share) {
  const int64_t per = ((bytes + grid - 1) / grid + 15) / 16 * 16;
  *begin = min(bytes, per * cta);
  *share = min(bytes, *begin + per) - *begin;
}

__global__ void __launch_bounds__(kPersistThreads, 1) persist_kernel(const PersistOp* ops, int n_ops, const uint8_t* pool, float* bufs, int stages, int barrier) {
  extern __shared__ __align__(128) uint8_t ring[];
  __shared__ __align__(8) uint64_t full[kMaxStages], empty[kMaxStages];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, grid = gridDim.x, cta = blockIdx.x;
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], kConsumerWarps);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (warp == kConsumerWarps) {  // the producer: every piece of the CTA's shares, in step order
    if (lane == 0) {
      uint32_t it = 0;
      for (int j = 0; j < n_ops; ++j) {
        const PersistOp op = ops[j];
        if (op.bytes == 0) continue;
        int64_t begin, share;
        share_of(op.bytes, cta, grid, &begin, &share);
        for (int64_t p = 0; p < share; p += kStageBytes, ++it) {
          const int s = (int)(it % stages);
          mbar_wait(&empty[s], ((it / stages) & 1) ^ 1);
          const uint32_t n = (uint32_t)min((int64_t)kStageBytes, share - p);
          mbar_expect_tx(&full[s], n);
          bulk_copy(ring + s * kStageBytes, pool + op.offset + begin + p, n, &full[s]);
        }
      }
    }
    return;
  }
  uint32_t it = 0;
  int cur = 0, prev_ctas = 1;
  for (int j = 0; j < n_ops; ++j) {
    const PersistOp op = ops[j];
    const float* in = bufs + (size_t)cur * (1 << 20);
    float* out = bufs + (size_t)(cur ^ 1) * (1 << 20);
    const int n_in = min(prev_ctas * kConsumerThreads, 4096);
    if (j > 0 && barrier != kNone) {  // every CTA has finished op j - 1
      if (threadIdx.x == 0) {
        const unsigned int* word = barrier == kCount ? &g_arrived[0] : &g_arrived[1];
        const unsigned int target = barrier == kCount ? (unsigned)(j * grid) : (unsigned)j;
        while (true) {
          unsigned int v;
          asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(word) : "memory");
          if (v >= target) break;
          if (barrier == kLast) __nanosleep(32);
        }
      }
      consumers_sync();
    }
    const bool runs = op.bytes > 0 || cta < op.ctas;
    float acc = 0;
    if (runs)
      for (int i = threadIdx.x; i < n_in; i += kConsumerThreads) acc += in[i];
    int sum = 0;
    if (op.bytes > 0) {
      int64_t begin, share;
      share_of(op.bytes, cta, grid, &begin, &share);
      for (int64_t p = 0; p < share; p += kStageBytes, ++it) {
        const int s = (int)(it % stages);
        mbar_wait(&full[s], (it / stages) & 1);
        const int4* stage = reinterpret_cast<const int4*>(ring + s * kStageBytes);
        const int n16 = (int)(min((int64_t)kStageBytes, share - p) / 16);
        for (int i = threadIdx.x; i < n16; i += kConsumerThreads) {
          const int4 v = stage[i];
          sum += v.x ^ v.y ^ v.z ^ v.w;
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(&empty[s]);
      }
    }
    if (runs) out[cta * kConsumerThreads + threadIdx.x] = acc * 0.5f + (float)(sum & 1);
    prev_ctas = op.bytes > 0 ? grid : op.ctas;
    cur ^= 1;
    if (barrier == kNone) continue;
    consumers_sync();
    if (threadIdx.x == 0) {
      __threadfence();
      if (barrier == kCount) {
        asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(&g_arrived[0]) : "memory");
      } else if (atomicAdd(&g_arrived[0], 1u) == (unsigned)((j + 1) * grid - 1)) {
        __threadfence();
        asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(&g_arrived[1]), "r"(j + 1) : "memory");
      }
    }
  }
}

double run_persist(const Shape& sh, const uint8_t* pool, int64_t pool_bytes, float* bufs, int replays, int stages, int barrier, int64_t* step_bytes) {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  std::vector<PersistOp> ops;
  int64_t offset = 0, bytes = 0;
  for (int l = 0; l < sh.layers; ++l)
    for (const Op& op : sh.layer) {
      if (op.bytes > 0) {
        const int64_t b = (op.bytes + 15) / 16 * 16;
        if (offset + b > pool_bytes) offset = 0;
        ops.push_back({offset, b, 0});
        offset += b;
        bytes += b;
      } else {
        ops.push_back({0, 0, std::min(op.ctas, sms)});
      }
    }
  PersistOp* d_ops;
  CHECK(cudaMalloc(&d_ops, ops.size() * sizeof(PersistOp)));
  CHECK(cudaMemcpy(d_ops, ops.data(), ops.size() * sizeof(PersistOp), cudaMemcpyHostToDevice));
  const int smem = stages * kStageBytes;
  CHECK(cudaFuncSetAttribute(persist_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  int per_sm = 0;
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, persist_kernel, kPersistThreads, smem));
  if (per_sm < 1) {
    std::fprintf(stderr, "persist: the kernel does not fit a SM\n");
    std::exit(1);
  }
  const double us = time_step(g_arrived, replays, [&](cudaStream_t s) {
    persist_kernel<<<sms, kPersistThreads, smem, s>>>(d_ops, (int)ops.size(), pool, bufs, stages, barrier);
    CHECK(cudaGetLastError());
  });
  CHECK(cudaFree(d_ops));
  *step_bytes = bytes;
  return us;
}

int main(int argc, char** argv) {
  const int replays = argc > 1 ? std::atoi(argv[1]) : 20;
  const int64_t pool_bytes = 6LL << 30;
  uint8_t* pool;
  CHECK(cudaMalloc(&pool, pool_bytes));
  CHECK(cudaMemset(pool, 1, pool_bytes));
  float* bufs;
  CHECK(cudaMalloc(&bufs, 2 * (1 << 20) * sizeof(float)));
  CHECK(cudaMemset(bufs, 0, 2 * (1 << 20) * sizeof(float)));
  // Per layer: norm (1 CTA), q/k/v, rope (5 CTAs), attention (16), combine (32), o, norm, gate+up, SwiGLU (48 / 100), down.
  const Shape shapes[] = {
      {"qwen3-8b", 36, {{0, 1}, {14155776, 0}, {0, 5}, {0, 16}, {0, 32}, {9437184, 0}, {0, 1}, {56623104, 0}, {0, 48}, {28311552, 0}}},
      {"qwen3-32b", 64, {{0, 1}, {29491200, 0}, {0, 9}, {0, 32}, {0, 64}, {23592960, 0}, {0, 1}, {147456000, 0}, {0, 100}, {73728000, 0}}},
      {"products only (8b)", 36, {{14155776, 0}, {9437184, 0}, {56623104, 0}, {28311552, 0}}},
      {"qwen3-8b, 5 ops", 36, {{14155776, 0}, {0, 16}, {9437184, 0}, {56623104, 0}, {28311552, 0}}},
      {"qwen3-32b, 5 ops", 64, {{29491200, 0}, {0, 32}, {23592960, 0}, {147456000, 0}, {73728000, 0}}},
      {"one large read", 1, {{4000000000LL, 0}}},
  };
  for (const Shape& sh : shapes) {
    for (int m = 0; m < kModes + 1; ++m) {  // the last: flag-pre with a 100 ns pause between polls
      const int sleep_ns = m == kModes ? 100 : 0;
      CHECK(cudaMemcpyToSymbol(c_sleep_ns, &sleep_ns, sizeof(int)));
      int64_t bytes = 0;
      double us = 0;
      switch (m) {
        case kPlain: us = run_mode<kPlain>(sh, pool, pool_bytes, bufs, replays, &bytes); break;
        case kPdl: us = run_mode<kPdl>(sh, pool, pool_bytes, bufs, replays, &bytes); break;
        case kPdlPre: us = run_mode<kPdlPre>(sh, pool, pool_bytes, bufs, replays, &bytes); break;
        case kFlag: us = run_mode<kFlag>(sh, pool, pool_bytes, bufs, replays, &bytes); break;
        default: us = run_mode<kFlagPre>(sh, pool, pool_bytes, bufs, replays, &bytes); break;
      }
      std::printf("%-20s %-9s%s step %9.1f us  layer %7.2f us  %7.1f GB/s\n", sh.name, kModeNames[m < kModes ? m : kFlagPre], m == kModes ? "+sleep" : "", us, us / sh.layers,
                  (double)bytes / (us * 1e3));
    }
    for (int barrier = 0; barrier < kBarriers; ++barrier)
      for (int stages : {2, 12}) {
        int64_t bytes = 0;
        const double us = run_persist(sh, pool, pool_bytes, bufs, replays, stages, barrier, &bytes);
        std::printf("%-20s persist/%-2d %-5s step %9.1f us  layer %7.2f us  %7.1f GB/s\n", sh.name, stages, kBarrierNames[barrier], us, us / sh.layers,
                    (double)bytes / (us * 1e3));
      }
  }
  return 0;
}
