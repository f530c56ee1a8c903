// A standalone lab for the one-token Q4_K decode product on sm_90: the engine's kernel (a copy of
// cuda_matvec.cu's matvec_q4_k at one token, two rows per warp) beside candidate forms, each timed in a
// CUDA graph over enough copies of the weights that no product is served from the L2, at the products'
// real shapes, with a plain read of the same bytes as the ceiling. Candidates:
// - "pieces": a warp takes 4 super-blocks (576 B) of each of its rows per round as 36 contiguous 16-byte
//   pieces (one full load and one of 4 lanes), so every weight load is contiguous; the headers go to
//   the lanes of their super-block by shuffles; each lane's activations are two 16-byte loads.
// - "bulk": the same arithmetic on weights that a CTA streams into shared memory with TMA bulk copies
//   (cp.async.bulk, mbarrier-completed, several stages in flight), so the weights bypass the L1 and
//   take no registers while in flight.
// Build: nvcc -O3 -arch=sm_90 -std=c++17 bench/gpu_q4k_matvec_lab.cu -o gpu_q4k_matvec_lab
// Run: gpu_q4k_matvec_lab (prints one line per shape and kernel: us, GB/s, NMSE against the engine's).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "gpu_lab_common.cuh"


struct W {
  const uint8_t* data;
  int64_t rows, cols, row_bytes;
};
struct A {
  const int8_t* q;
  const float* d;
  const float* s;
};

__device__ __forceinline__ int4 ld16(const void* p) { return __ldg(reinterpret_cast<const int4*>(p)); }
__device__ __forceinline__ int dot16(const int4 w, const int4 a, int acc) {
  acc = __dp4a(w.x, a.x, acc);
  acc = __dp4a(w.y, a.y, acc);
  acc = __dp4a(w.z, a.z, acc);
  return __dp4a(w.w, a.w, acc);
}
__host__ __device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ void half2_floats(uint32_t bits, float& a, float& b) {
  __half2 h;
  memcpy(&h, &bits, 4);
  a = __low2float(h);
  b = __high2float(h);
}
__device__ __forceinline__ void k4_scale_min_select(int j, uint32_t lo, uint32_t mid, uint32_t hi, float& sc, float& m) {
  const int k = 8 * (j & 3);
  const uint32_t a = lo >> k, b = mid >> k, c = hi >> k;
  const uint32_t sc_lo = a & 63, m_lo = b & 63;
  const uint32_t sc_hi = (c & 0xF) | ((a >> 6 & 3) << 4), m_hi = (c >> 4 & 0xF) | ((b >> 6 & 3) << 4);
  sc = (float)(j < 4 ? sc_lo : sc_hi);
  m = (float)(j < 4 ? m_lo : m_hi);
}

// ---- The engine's kernel (one token, R rows per warp, 4 warps per CTA) ----
template <int R>
__global__ void __launch_bounds__(128) engine_kernel(W w, A act, float* y) {
  const int lane = threadIdx.x % 32;
  const int64_t row0 = ((int64_t)blockIdx.x * 4 + threadIdx.x / 32) * R;
  if (row0 >= w.rows) return;
  const int g = lane / 4, c = lane % 4;
  const int64_t n_sb = w.cols / 256;
  const uint8_t* rowp[R];
#pragma unroll
  for (int r = 0; r < R; ++r) rowp[r] = w.data + min(row0 + r, w.rows - 1) * w.row_bytes;
  float acc[R] = {};
  for (int64_t i = g; i < n_sb; i += 8) {
    int4 hdr[R], q0[R], q1[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const uint8_t* blk = rowp[r] + i * 144;
      hdr[r] = ld16(blk);
      q0[r] = ld16(blk + 16 + 32 * c);
      q1[r] = ld16(blk + 32 + 32 * c);
    }
    const int8_t* x = act.q + i * 256 + 64 * c;
    const int4 x0 = ld16(x), x1 = ld16(x + 16), x2 = ld16(x + 32), x3 = ld16(x + 48);
    const int64_t s = 8 * i + 2 * c;
    const float2 ad = __ldg(reinterpret_cast<const float2*>(act.d + s));
    const float2 as = __ldg(reinterpret_cast<const float2*>(act.s + s));
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float d, dmin, sc0, m0, sc1, m1;
      half2_floats((uint32_t)hdr[r].x, d, dmin);
      k4_scale_min_select(2 * c, (uint32_t)hdr[r].y, (uint32_t)hdr[r].z, (uint32_t)hdr[r].w, sc0, m0);
      k4_scale_min_select(2 * c + 1, (uint32_t)hdr[r].y, (uint32_t)hdr[r].z, (uint32_t)hdr[r].w, sc1, m1);
      const int4 a = q0[r], b = q1[r];
      const int4 lo0 = make_int4(a.x & 0x0F0F0F0F, a.y & 0x0F0F0F0F, a.z & 0x0F0F0F0F, a.w & 0x0F0F0F0F);
      const int4 lo1 = make_int4(b.x & 0x0F0F0F0F, b.y & 0x0F0F0F0F, b.z & 0x0F0F0F0F, b.w & 0x0F0F0F0F);
      const int4 hi0 = make_int4((a.x >> 4) & 0x0F0F0F0F, (a.y >> 4) & 0x0F0F0F0F, (a.z >> 4) & 0x0F0F0F0F, (a.w >> 4) & 0x0F0F0F0F);
      const int4 hi1 = make_int4((b.x >> 4) & 0x0F0F0F0F, (b.y >> 4) & 0x0F0F0F0F, (b.z >> 4) & 0x0F0F0F0F, (b.w >> 4) & 0x0F0F0F0F);
      const int dlo = dot16(lo1, x1, dot16(lo0, x0, 0));
      const int dhi = dot16(hi1, x3, dot16(hi0, x2, 0));
      acc[r] += d * (sc0 * ad.x * (float)dlo + sc1 * ad.y * (float)dhi);
      acc[r] -= dmin * (m0 * as.x + m1 * as.y);
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const float v = warp_sum(acc[r]);
    if (lane == 0 && row0 + r < w.rows) y[row0 + r] = v;
  }
}

// ---- Pieces: 4 super-blocks per round as 36 contiguous 16-byte pieces ----
// Lane L holds piece L of the round (lanes 0, 9, 18, 27: the headers) and, for those four lanes, piece
// 32 + L/9 as well; its quants piece is L where L % 9 != 0, else 32 + L / 9.
struct PieceLane {
  int sb, c, h, hdr_lane;
  bool extra;
  __device__ explicit PieceLane(int lane) {
    extra = lane % 9 == 0;
    const int p = extra ? 32 + lane / 9 : lane;
    sb = p / 9;
    const int q = p % 9 - 1;
    c = q / 2;
    h = q % 2;
    hdr_lane = 9 * sb;
  }
};

// One round's arithmetic for a lane: its 16 quant bytes `qv` (values 64c+16h+t low, +32 high) and the
// round's header piece from the header lane.
__device__ __forceinline__ float piece_dot(const PieceLane& pl, int4 first, int4 qv, const int4 x0, const int4 x1, float2 ad, float2 as) {
  const uint32_t h0 = __shfl_sync(0xffffffffu, (uint32_t)first.x, pl.hdr_lane);
  const uint32_t h1 = __shfl_sync(0xffffffffu, (uint32_t)first.y, pl.hdr_lane);
  const uint32_t h2 = __shfl_sync(0xffffffffu, (uint32_t)first.z, pl.hdr_lane);
  const uint32_t h3 = __shfl_sync(0xffffffffu, (uint32_t)first.w, pl.hdr_lane);
  float d, dmin, sc0, m0, sc1, m1;
  half2_floats(h0, d, dmin);
  k4_scale_min_select(2 * pl.c, h1, h2, h3, sc0, m0);
  k4_scale_min_select(2 * pl.c + 1, h1, h2, h3, sc1, m1);
  const int4 lo = make_int4(qv.x & 0x0F0F0F0F, qv.y & 0x0F0F0F0F, qv.z & 0x0F0F0F0F, qv.w & 0x0F0F0F0F);
  const int4 hi = make_int4((qv.x >> 4) & 0x0F0F0F0F, (qv.y >> 4) & 0x0F0F0F0F, (qv.z >> 4) & 0x0F0F0F0F, (qv.w >> 4) & 0x0F0F0F0F);
  const int dlo = dot16(lo, x0, 0), dhi = dot16(hi, x1, 0);
  float v = d * (sc0 * ad.x * (float)dlo + sc1 * ad.y * (float)dhi);
  if (pl.h == 0) v -= dmin * (m0 * as.x + m1 * as.y);
  return v;
}

template <int R>
__global__ void __launch_bounds__(128) pieces_kernel(W w, A act, float* y) {
  const int lane = threadIdx.x % 32;
  const int64_t row0 = ((int64_t)blockIdx.x * 4 + threadIdx.x / 32) * R;
  if (row0 >= w.rows) return;
  const PieceLane pl(lane);
  const int64_t rounds = w.cols / 1024;
  const uint8_t* rowp[R];
#pragma unroll
  for (int r = 0; r < R; ++r) rowp[r] = w.data + min(row0 + r, w.rows - 1) * w.row_bytes;
  const int act_off = pl.sb * 256 + 64 * pl.c + 16 * pl.h;
  const int sub = pl.sb * 8 + 2 * pl.c;
  float acc[R] = {};
  for (int64_t g = 0; g < rounds; ++g) {
    int4 first[R], second[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const uint8_t* base = rowp[r] + g * 576;
      first[r] = ld16(base + 16 * lane);
      second[r] = pl.extra ? ld16(base + 512 + 16 * (lane / 9)) : first[r];
    }
    const int8_t* x = act.q + g * 1024 + act_off;
    const int4 x0 = ld16(x), x1 = ld16(x + 32);
    const float2 ad = make_float2(__ldg(act.d + g * 32 + sub), __ldg(act.d + g * 32 + sub + 1));
    const float2 as = make_float2(__ldg(act.s + g * 32 + sub), __ldg(act.s + g * 32 + sub + 1));
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] += piece_dot(pl, first[r], second[r], x0, x1, ad, as);
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const float v = warp_sum(acc[r]);
    if (lane == 0 && row0 + r < w.rows) y[row0 + r] = v;
  }
}

// ---- Bulk: TMA bulk copies of (tile rows x chunk) into shared-memory stages ----
__device__ __forceinline__ uint32_t smem_addr(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count));
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n .reg .pred p;\n WAIT_%=:\n mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra WAIT_%=;\n}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(smem_addr(dst)), "l"(src),
               "r"(bytes), "r"(smem_addr(bar))
               : "memory");
}

struct BulkShape {
  int warps, rows_per_warp, chunk_rounds, stages;
  __host__ __device__ int tile_rows() const { return warps * rows_per_warp; }
  __host__ __device__ int stage_bytes() const { return tile_rows() * chunk_rounds * 576; }
  int smem_bytes() const { return 128 + stages * stage_bytes(); }
};

template <int R>
__global__ void bulk_kernel(W w, A act, float* y, BulkShape bs) {
  extern __shared__ __align__(128) uint8_t smem[];
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem);
  uint8_t* stages = smem + 128;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int tile_rows = bs.tile_rows();
  const int64_t rounds_per_row = w.cols / 1024;
  const int n_chunks = (int)((rounds_per_row + bs.chunk_rounds - 1) / bs.chunk_rounds);
  const int64_t n_tiles = (w.rows + tile_rows - 1) / tile_rows;
  const int64_t my_tiles = n_tiles > blockIdx.x ? (n_tiles - blockIdx.x + gridDim.x - 1) / gridDim.x : 0;
  const int64_t items = my_tiles * n_chunks;
  const int chunk_bytes = bs.chunk_rounds * 576;
  if (threadIdx.x == 0) {
    for (int s = 0; s < bs.stages; ++s) mbar_init(&bars[s], 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  // Item k: tile blockIdx.x + (k / n_chunks) * gridDim.x, chunk k % n_chunks, into stage k % stages.
  auto issue = [&](int64_t k) {
    const int64_t tile = blockIdx.x + (k / n_chunks) * gridDim.x;
    const int chunk = (int)(k % n_chunks);
    const int rounds = (int)min64(bs.chunk_rounds, rounds_per_row - (int64_t)chunk * bs.chunk_rounds);
    const int64_t row0 = tile * tile_rows;
    const int rows = (int)min64(tile_rows, w.rows - row0);
    uint64_t* bar = &bars[k % bs.stages];
    mbar_expect_tx(bar, (uint32_t)(rows * rounds * 576));
    uint8_t* dst = stages + (k % bs.stages) * bs.stage_bytes();
    for (int r = 0; r < rows; ++r)
      bulk_copy(dst + r * chunk_bytes, w.data + (row0 + r) * w.row_bytes + (int64_t)chunk * bs.chunk_rounds * 576, rounds * 576, bar);
  };
  if (threadIdx.x == 0)
    for (int64_t k = 0; k < min64(bs.stages, items); ++k) issue(k);
  const PieceLane pl(lane);
  const int act_off = pl.sb * 256 + 64 * pl.c + 16 * pl.h;
  const int sub = pl.sb * 8 + 2 * pl.c;
  float acc[R] = {};
  for (int64_t k = 0; k < items; ++k) {
    const int64_t tile = blockIdx.x + (k / n_chunks) * gridDim.x;
    const int chunk = (int)(k % n_chunks);
    const int rounds = (int)min64(bs.chunk_rounds, rounds_per_row - (int64_t)chunk * bs.chunk_rounds);
    mbar_wait(&bars[k % bs.stages], (uint32_t)((k / bs.stages) & 1));
    const uint8_t* st = stages + (k % bs.stages) * bs.stage_bytes() + (warp * R) * chunk_bytes;
    for (int g = 0; g < rounds; ++g) {
      const int64_t gg = (int64_t)chunk * bs.chunk_rounds + g;
      const int8_t* x = act.q + gg * 1024 + act_off;
      const int4 x0 = ld16(x), x1 = ld16(x + 32);
      const float2 ad = make_float2(__ldg(act.d + gg * 32 + sub), __ldg(act.d + gg * 32 + sub + 1));
      const float2 as = make_float2(__ldg(act.s + gg * 32 + sub), __ldg(act.s + gg * 32 + sub + 1));
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const uint8_t* base = st + r * chunk_bytes + g * 576;
        const int4 first = *reinterpret_cast<const int4*>(base + 16 * lane);
        const int4 second = pl.extra ? *reinterpret_cast<const int4*>(base + 512 + 16 * (lane / 9)) : first;
        acc[r] += piece_dot(pl, first, second, x0, x1, ad, as);
      }
    }
    if (chunk == n_chunks - 1) {
      const int64_t row0 = tile * tile_rows + warp * R;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const float v = warp_sum(acc[r]);
        if (lane == 0 && row0 + r < w.rows) y[row0 + r] = v;
        acc[r] = 0;
      }
    }
    __syncthreads();  // the stage is free
    if (threadIdx.x == 0 && k + bs.stages < items) issue(k + bs.stages);
  }
}

// ---- The ceiling: a plain read of the same bytes ----
__global__ void read_kernel(const int4* p, int64_t n, int* sink) {
  int acc = 0;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const int4 v = __ldg(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678) *sink = acc;
}

// ---- Host ----
__global__ void fill_kernel(uint8_t* p, int64_t n, uint32_t seed) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    uint32_t x = (uint32_t)i * 2654435761u ^ seed;
    x ^= x >> 15;
    x *= 2246822519u;
    x ^= x >> 13;
    p[i] = (uint8_t)x;
  }
}
// Sane super-block scales: d and dmin small halves.
__global__ void fix_scales_kernel(uint8_t* p, int64_t n_sb) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n_sb; i += (int64_t)gridDim.x * blockDim.x) {
    __half* h = reinterpret_cast<__half*>(p + i * 144);
    h[0] = __float2half(0.001f + 0.0001f * (float)(i % 7));
    h[1] = __float2half(0.0005f + 0.0001f * (float)(i % 5));
  }
}

struct Shape {
  const char* name;
  int64_t rows, cols;
};

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 20;
  int n_sm = 0;
  CHECK(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, 0));
  const Shape shapes[] = {
      {"32b gate+up", 51200, 5120}, {"32b down", 5120, 25600}, {"32b qkv", 10240, 5120}, {"32b o", 5120, 8192},
      {"8b gate+up", 24576, 4096},  {"8b down", 4096, 12288},  {"8b qkv", 6144, 4096},   {"8b o", 4096, 4096},
      {"27b gate+up", 34816, 5120}, {"27b down", 5120, 17408},
  };
  std::printf("SMs %d; reps %d per graph; GB/s counts the weight bytes\n", n_sm, reps);
  for (const Shape& sh : shapes) {
    const int64_t row_bytes = sh.cols / 256 * 144, bytes = sh.rows * row_bytes;
    const int copies = (int)std::max<int64_t>(2, (400ll << 20) / bytes + 1);
    uint8_t* wbuf;
    CHECK(cudaMalloc(&wbuf, bytes * copies));
    fill_kernel<<<1024, 256>>>(wbuf, bytes * copies, 1234);
    fix_scales_kernel<<<1024, 256>>>(wbuf, bytes * copies / 144);
    int8_t* aq;
    float *ad, *as, *y;
    int* sink;
    CHECK(cudaMalloc(&aq, sh.cols));
    CHECK(cudaMalloc(&ad, sh.cols / 32 * 4));
    CHECK(cudaMalloc(&as, sh.cols / 32 * 4));
    CHECK(cudaMalloc(&y, sh.rows * 4 * 8));
    CHECK(cudaMalloc(&sink, 4));
    fill_kernel<<<64, 256>>>(reinterpret_cast<uint8_t*>(aq), sh.cols, 99);
    {
      std::vector<float> hd(sh.cols / 32), hs(sh.cols / 32);
      for (size_t i = 0; i < hd.size(); ++i) {
        hd[i] = 0.01f + 0.001f * (float)(i % 13);
        hs[i] = hd[i] * (float)((int)(i % 17) - 8);
      }
      CHECK(cudaMemcpy(ad, hd.data(), hd.size() * 4, cudaMemcpyHostToDevice));
      CHECK(cudaMemcpy(as, hs.data(), hs.size() * 4, cudaMemcpyHostToDevice));
    }
    const A act{aq, ad, as};
    cudaStream_t stream;
    CHECK(cudaStreamCreate(&stream));
    std::vector<float> ref;
    auto run = [&](const char* name, auto&& enqueue) {
      // Output of copy 0 against the engine kernel's.
      CHECK(cudaMemset(y, 0, sh.rows * 4));
      enqueue(W{wbuf, sh.rows, sh.cols, row_bytes}, stream);
      CHECK(cudaStreamSynchronize(stream));
      CHECK(cudaGetLastError());
      std::vector<float> out(sh.rows);
      CHECK(cudaMemcpy(out.data(), y, sh.rows * 4, cudaMemcpyDeviceToHost));
      double nmse = 0;
      if (ref.empty()) {
        ref = out;
      } else {
        double num = 0, den = 0;
        for (int64_t i = 0; i < sh.rows; ++i) {
          num += ((double)out[i] - ref[i]) * ((double)out[i] - ref[i]);
          den += (double)ref[i] * ref[i];
        }
        nmse = den > 0 ? num / den : num;
      }
      cudaGraph_t graph;
      CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      for (int r = 0; r < reps; ++r) enqueue(W{wbuf + (r % copies) * bytes, sh.rows, sh.cols, row_bytes}, stream);
      CHECK(cudaStreamEndCapture(stream, &graph));
      cudaGraphExec_t exec;
      CHECK(cudaGraphInstantiate(&exec, graph, 0));
      CHECK(cudaGraphLaunch(exec, stream));
      cudaEvent_t e0, e1;
      CHECK(cudaEventCreate(&e0));
      CHECK(cudaEventCreate(&e1));
      float best = 1e30f;
      for (int t = 0; t < 3; ++t) {
        CHECK(cudaEventRecord(e0, stream));
        CHECK(cudaGraphLaunch(exec, stream));
        CHECK(cudaEventRecord(e1, stream));
        CHECK(cudaEventSynchronize(e1));
        float ms;
        CHECK(cudaEventElapsedTime(&ms, e0, e1));
        best = std::min(best, ms);
      }
      const double us = best * 1000.0 / reps;
      std::printf("%-12s %5lld x %5lld  %-22s %8.2f us %7.0f GB/s  nmse %.2e\n", sh.name, (long long)sh.rows, (long long)sh.cols, name, us,
                  (double)bytes / us / 1e3, nmse);
      CHECK(cudaGraphExecDestroy(exec));
      CHECK(cudaGraphDestroy(graph));
    };
    run("engine R2", [&](W w, cudaStream_t s) { engine_kernel<2><<<(unsigned)((w.rows / 2 + 3) / 4), 128, 0, s>>>(w, act, y); });
    run("engine R1", [&](W w, cudaStream_t s) { engine_kernel<1><<<(unsigned)((w.rows + 3) / 4), 128, 0, s>>>(w, act, y); });
    run("pieces R1", [&](W w, cudaStream_t s) { pieces_kernel<1><<<(unsigned)((w.rows + 3) / 4), 128, 0, s>>>(w, act, y); });
    run("pieces R2", [&](W w, cudaStream_t s) { pieces_kernel<2><<<(unsigned)((w.rows / 2 + 3) / 4), 128, 0, s>>>(w, act, y); });
    run("pieces R4", [&](W w, cudaStream_t s) { pieces_kernel<4><<<(unsigned)((w.rows / 4 + 3) / 4), 128, 0, s>>>(w, act, y); });
    const BulkShape bulk_shapes[] = {{4, 2, 5, 4}, {4, 2, 2, 6}, {8, 1, 5, 3}, {8, 2, 2, 4}, {4, 1, 5, 4}, {8, 1, 2, 6}};
    for (const BulkShape& bs : bulk_shapes) {
      const int smem = bs.smem_bytes();
      auto k1 = bulk_kernel<1>;
      auto k2 = bulk_kernel<2>;
      CHECK(cudaFuncSetAttribute(k1, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
      CHECK(cudaFuncSetAttribute(k2, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
      int per_sm = 0;
      CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, bs.rows_per_warp == 1 ? k1 : k2, bs.warps * 32, smem));
      char name[64];
      std::snprintf(name, sizeof name, "bulk w%d R%d c%d s%d x%d", bs.warps, bs.rows_per_warp, bs.chunk_rounds, bs.stages, per_sm);
      const unsigned grid = (unsigned)(n_sm * std::max(1, per_sm));
      run(name, [&](W w, cudaStream_t s) {
        if (bs.rows_per_warp == 1) k1<<<grid, bs.warps * 32, smem, s>>>(w, act, y, bs);
        else k2<<<grid, bs.warps * 32, smem, s>>>(w, act, y, bs);
      });
    }
    run("read (ceiling)", [&](W w, cudaStream_t s) {
      read_kernel<<<n_sm * 8, 256, 0, s>>>(reinterpret_cast<const int4*>(w.data), bytes / 16, sink);
      CHECK(cudaMemsetAsync(y, 0, 4, s));
    });
    ref.clear();
    CHECK(cudaStreamDestroy(stream));
    CHECK(cudaFree(wbuf));
    CHECK(cudaFree(aq));
    CHECK(cudaFree(ad));
    CHECK(cudaFree(as));
    CHECK(cudaFree(y));
    CHECK(cudaFree(sink));
  }
  return 0;
}
