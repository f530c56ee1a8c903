// A standalone lab for the memory side of the batched-decode products (cuda_wgmma_rows.cu): how fast the
// warpgroup kernel's pattern of weight reads can stream by itself, with no dequantization and no tensor
// instruction, beside a plain contiguous read of the same bytes. The pattern: CTAs of 128 Q4_K rows (8 warps
// of 16 rows, two CTAs a SM), K split over grid.y; per super-block every warp copies its rows' 144-byte
// blocks with 16-byte cp.async pieces (RowBlock<Q4_K>::copy's pieces) into a ring of S stages, L ahead, waits
// for them, then reads them back from shared memory (what from_smem loads). Variants:
// - SBS: super-blocks of each row per stage (1: the engine's; 2: 288 contiguous bytes a row);
// - x: each stage also copies the activation tiles of its super-blocks (8704 bytes each, L2-resident);
// - layout: the weights' placement (row-major as GGUF has them, or row groups whose blocks of a super-block are
//   adjacent), whether the 144-byte pieces of 128 rows a super-block cost the DRAM more than adjacent ones;
// - work: `work` half2 fused multiply-adds a lane and 8-row block on the loaded words, in four independent chains,
//   standing in for the dequantization's instructions (~76 a lane and 8-row block in the engine's loop: 8 words of
//   8 nibbles at ~9.5 instructions; ~190 with the scales, copies and products).
// - 64 tokens (tensor-map forms): the activation tiles 4x larger, two stages one ahead as the engine has them there, with
//   and without the tiles' copies, and with them multicast to clusters of two CTAs (each tile read from the L2 once a pair).
// So the lab says whether the access pattern, or the chain of work a warp runs between its copies, keeps the
// products at 50-70% of the bandwidth (docs/performance.md, fifty-third session).
// Build: nvcc -O3 -gencode arch=compute_90a,code=sm_90a -std=c++17 bench/gpu_batched_read_lab.cu -o gpu_batched_read_lab
// Run: gpu_batched_read_lab (one line per shape and variant: us a launch, GB/s, % of the plain read).
#include <cuda.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "gpu_lab_common.cuh"

template <int BYTES>
__device__ __forceinline__ void cp16(void* dst, const void* src) {
  const uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src));
}
__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void wait_groups() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// Every thread streams its share of [begin, end) with 16-byte loads, four in flight.
__global__ void plain_read(const int4* data, int64_t n16, unsigned* sink) {
  const int64_t per = (n16 + gridDim.x - 1) / gridDim.x, begin = per * blockIdx.x, end = min(begin + per, n16);
  unsigned acc = 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += 4 * blockDim.x) {
    int4 v[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) v[j] = i + j * blockDim.x < end ? __ldcs(data + i + j * blockDim.x) : make_int4(0, 0, 0, 0);
#pragma unroll
    for (int j = 0; j < 4; ++j) acc ^= v[j].x ^ v[j].y ^ v[j].z ^ v[j].w;
  }
  if (acc == 0x12345678u) sink[0] = acc;
}

constexpr int kRows = 128, kThreads = 256, kSlot = 1152, kXsb = 8704;

// The warpgroup kernel's weight reads (see the header). Stage: [SBS x activation tiles][8 warps x SBS x 2 x slot].
template <int S, int L, int SBS>
__global__ void __launch_bounds__(kThreads, 2) tile_read(const uint8_t* w, int64_t rows, int64_t cols, const int4* x, bool with_x, int work, int layout,
                                                        unsigned* sink) {
  extern __shared__ int4 smem4[];
  uint8_t* smem = reinterpret_cast<uint8_t*>(smem4);
  const int lane = threadIdx.x % 32, t = lane % 4, g = lane / 4, warp = threadIdx.x / 32;
  const int64_t n_sb = cols / 256, row_bytes = n_sb * 144;
  const int64_t sb_begin = n_sb * blockIdx.y / gridDim.y, sb_end = n_sb * (blockIdx.y + 1) / gridDim.y;
  const int64_t row_base = blockIdx.x * kRows + warp * 16;
  constexpr int kXStage = SBS * kXsb, kWarp = SBS * 2 * kSlot, kStage = kXStage + 8 * kWarp;
  int64_t row[2];
  for (int i = 0; i < 2; ++i) row[i] = min(row_base + g + 8 * i, rows - 1);
  auto copy = [&](int64_t sb0, int stage) {
    uint8_t* st = smem + stage * kStage;
    for (int k = 0; k < SBS; ++k) {
      const int64_t sb = sb0 + k;
      if (sb >= sb_end) break;
      for (int i = 0; i < 2; ++i) {
        uint8_t* slot = st + kXStage + warp * kWarp + (2 * k + i) * kSlot;
        // layout 0: row-major (GGUF's); 1: groups of 8 rows, their 8 blocks of a super-block adjacent (1152 bytes);
        // 2: the CTA's 128 rows' blocks of a super-block adjacent (18 KB): the same bytes, placed for this pattern.
        const int64_t r = row[i];
        const uint8_t* blk = layout == 0   ? w + r * row_bytes + sb * 144
                             : layout == 1 ? w + ((r / 8) * n_sb + sb) * 1152 + (r % 8) * 144
                                           : w + ((r / kRows) * n_sb + sb) * (kRows * 144) + (r % kRows) * 144;
        cp16<16>(slot + 16 * lane, blk + 16 + 16 * t);
        cp16<16>(slot + 512 + 16 * lane, blk + 80 + 16 * t);
        if (t == i) cp16<16>(slot + 1024 + 16 * g, blk);
      }
      if (with_x) {  // this warp's eighth of the super-block's activation tiles
        const int4* src = x + sb * (kXsb / 16);
        int4* dst = reinterpret_cast<int4*>(st + k * kXsb);
        for (int j = warp * 32 + lane; j < kXsb / 16; j += kThreads) cp16<16>(dst + j, src + j);
      }
    }
  };
  for (int s = 0; s < L; ++s) {
    copy(sb_begin + s * SBS, s);
    commit();
  }
  __half2 acc = __float2half2_rn(0.0f);
  unsigned bits = 0;
  int stage = 0;
  for (int64_t sb = sb_begin; sb < sb_end; sb += SBS) {
    wait_groups<L - 1>();
    __syncthreads();  // (the engine's warps wait only for their own copies and the activations' barrier)
    copy(sb + L * SBS, (stage + L) % S);
    commit();
    const uint8_t* st = smem + stage * kStage;
    for (int k = 0; k < SBS; ++k) {
      for (int i = 0; i < 2; ++i) {
        const uint8_t* slot = st + kXStage + warp * kWarp + (2 * k + i) * kSlot;
        const int4 h = *reinterpret_cast<const int4*>(slot + 1024 + 16 * g);
        const int4 q0 = *reinterpret_cast<const int4*>(slot + 16 * lane);
        const int4 q1 = *reinterpret_cast<const int4*>(slot + 512 + 16 * lane);
        bits ^= h.x ^ q0.x ^ q0.y ^ q0.z ^ q0.w ^ q1.x ^ q1.y ^ q1.z ^ q1.w;
        __half2 v = *reinterpret_cast<const __half2*>(&q0.x), m = *reinterpret_cast<const __half2*>(&q1.y);
        __half2 a1 = acc, a2 = m, a3 = v;
        for (int j = 0; j < work; j += 4) {  // four independent chains, as a dequantization's words are
          acc = __hfma2(acc, m, v);
          a1 = __hfma2(a1, v, m);
          a2 = __hfma2(a2, m, v);
          a3 = __hfma2(a3, v, m);
        }
        acc = __hadd2(__hadd2(acc, a1), __hadd2(a2, a3));
      }
      if (with_x) bits ^= *reinterpret_cast<const unsigned*>(st + k * kXsb + 16 * lane);
    }
    stage = stage == S - 1 ? 0 : stage + 1;
  }
  wait_groups<0>();
  if (bits == 0x12345678u || __half2float(__low2half(acc)) == 1234.5f) sink[0] = bits;
}

// What the bulk forms do with a warp's 16 whole row blocks of a super-block (row r's at row_stride r): the same loads and
// stand-in work as tile_read's, for lane 4g + t of rows g and g + 8.
__device__ __forceinline__ void use_blocks(const uint8_t* slots, int lane, int work, __half2& acc, unsigned& bits, int row_stride = 144) {
  const int g = lane / 4;
  for (int i = 0; i < 2; ++i) {
    const uint8_t* blk = slots + (g + 8 * i) * row_stride;
    const int4 h = *reinterpret_cast<const int4*>(blk);
    const int4 q0 = *reinterpret_cast<const int4*>(blk + 16 + 16 * (lane % 4));
    const int4 q1 = *reinterpret_cast<const int4*>(blk + 80 + 16 * (lane % 4));
    bits ^= h.x ^ q0.x ^ q0.y ^ q0.z ^ q0.w ^ q1.x ^ q1.y ^ q1.z ^ q1.w;
    __half2 v = *reinterpret_cast<const __half2*>(&q0.x), m = *reinterpret_cast<const __half2*>(&q1.y);
    __half2 a1 = acc, a2 = m, a3 = v;
    for (int j = 0; j < work; j += 4) {
      acc = __hfma2(acc, m, v);
      a1 = __hfma2(a1, v, m);
      a2 = __hfma2(a2, m, v);
      a3 = __hfma2(a3, v, m);
    }
    acc = __hadd2(__hadd2(acc, a1), __hadd2(a2, a3));
  }
}

// The bulk forms' loop: `copy(sb, stage)` issues the copies of SBS super-blocks from sb into a stage on the warp's barrier
// of it, L stages ahead of the stage the warp waits for and uses. Stage: [activation tiles (XSB bytes: kXsb a super-block
// of 16 tokens, 4 kXsb of 64)][8 warps x 16 rows x SBS blocks (a row's SBS blocks adjacent)].
constexpr int kBulkWarp = 16 * 144;
template <int XSB = kXsb, int SBS = 1>
__host__ __device__ constexpr int bulk_stage() { return XSB + 8 * SBS * kBulkWarp; }
// `release(stage)` after the warp is done with a stage (the multicast form's empty barriers; a no-op elsewhere).
struct NoRelease {
  __device__ void operator()(int) const {}
};
template <int S, int L, int XSB = kXsb, int SBS = 1, typename Copy, typename Release = NoRelease>
__device__ __forceinline__ void run_stages(const Copy& copy, uint64_t* bars, const uint8_t* smem, int64_t sb_begin, int64_t sb_end, int lane,
                                           int warp, int work, bool with_x, unsigned* sink, const Release& release = Release()) {
  for (int s = 0; s < L; ++s) copy(sb_begin + s * SBS, s);
  __half2 acc = __float2half2_rn(0.0f);
  unsigned bits = 0;
  int stage = 0;
  uint32_t phase = 0;
  for (int64_t sb = sb_begin; sb < sb_end; sb += SBS) {
    copy(sb + L * SBS, (stage + L) % S);
    bar_wait(bars + stage, phase);
    const uint8_t* st = smem + stage * bulk_stage<XSB, SBS>();
    const uint8_t* slots = st + XSB + warp * SBS * kBulkWarp;
    for (int j = 0; j < SBS; ++j) use_blocks(slots + j * 144, lane, work, acc, bits, SBS * 144);
    if (with_x) bits ^= *reinterpret_cast<const unsigned*>(st + 16 * lane);
    __syncwarp();
    release(stage);
    if (++stage == S) stage = 0, phase ^= 1;
  }
  if (bits == 0x12345678u || __half2float(__low2half(acc)) == 1234.5f) sink[0] = bits;
}

// A bulk form's thread in its CTA: lane, warp, the CTA's super-blocks [sb_begin, sb_end) (K split over grid.y) and the warp's
// first row (16 rows a warp, kRows a CTA).
// With `sbs` super-blocks a stage, the split's ends fall on multiples of sbs (every shape's count of super-blocks is one).
struct BulkThread {
  int lane, warp, row_base;
  int64_t sb_begin, sb_end;
  __device__ explicit BulkThread(int64_t cols, int sbs = 1)
      : lane(threadIdx.x % 32), warp(threadIdx.x / 32), row_base(blockIdx.x * kRows + warp * 16),
        sb_begin(cols / 256 / sbs * blockIdx.y / gridDim.y * sbs), sb_end(cols / 256 / sbs * (blockIdx.y + 1) / gridDim.y * sbs) {}
};

// The warp's S barriers, after the S stages (one arrival each: lane 0's, with the bytes it expects).
template <int S, int XSB = kXsb, int SBS = 1>
__device__ __forceinline__ uint64_t* warp_bars(uint8_t* smem, int warp, int lane) {
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + S * bulk_stage<XSB, SBS>()) + warp * S;
  if (lane == 0)
    for (int s = 0; s < S; ++s) bar_init(bars + s, 1);
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  __syncwarp();
  return bars;
}

// The same reads through the tensor memory accelerator: each warp's rows' super-block blocks arrive by bulk copies
// (cp.async.bulk) on a barrier of the warp's own (mbarrier, one a stage), row after row in its slots (144 bytes
// each), instead of 16-byte cp.async pieces; row-major (layout 0: one 144-byte copy a row, lanes 0-15) or 128-row
// tiles (layout 2: the warp's 16 blocks adjacent, one 2304-byte copy). With x, each warp also bulk-copies its eighth of
// the stage's activation tiles on its barrier (timing only: no warp waits for the others' eighths, so no CTA barrier).
template <int S, int L>
__global__ void __launch_bounds__(kThreads, 2) tile_read_bulk(const uint8_t* w, int64_t rows, int64_t cols, const int4* x, bool with_x, int work,
                                                             int layout, unsigned* sink) {
  extern __shared__ int4 smem4[];
  uint8_t* smem = reinterpret_cast<uint8_t*>(smem4);
  const BulkThread th(cols);
  const int lane = th.lane, warp = th.warp;
  const int64_t n_sb = cols / 256, row_bytes = n_sb * 144, sb_begin = th.sb_begin, sb_end = th.sb_end, row_base = th.row_base;
  uint64_t* bars = warp_bars<S>(smem, warp, lane);
  constexpr int kXPart = kXsb / 8;
  const uint32_t bytes = kBulkWarp + (with_x ? kXPart : 0);
  auto copy = [&](int64_t sb, int stage) {
    if (sb >= sb_end) return;
    uint8_t* st = smem + stage * bulk_stage();
    uint8_t* slots = st + kXsb + warp * kBulkWarp;
    if (lane == 0) bar_expect(bars + stage, bytes);
    __syncwarp();
    if (layout == 0) {
      if (lane < 16) {
        const int64_t r = min(row_base + lane, rows - 1);
        bulk(slots + lane * 144, w + r * row_bytes + sb * 144, 144, bars + stage);
      }
    } else if (lane == 0) {
      const int64_t r = min(row_base, rows - 16);
      bulk(slots, w + ((r / kRows) * n_sb + sb) * (kRows * 144) + (r % kRows) * 144, kBulkWarp, bars + stage);
    }
    if (with_x && lane == 16) bulk(st + warp * kXPart, x + sb * (kXsb / 16) + warp * (kXPart / 16), kXPart, bars + stage);
  };
  run_stages<S, L>(copy, bars, smem, sb_begin, sb_end, lane, warp, work, with_x, sink);
}

// tile_read_bulk's reads through a tensor map (cp.async.bulk.tensor.2d): the weights seen as rows of row_bytes bytes, one
// box of 16 rows x SBS 144 bytes (a warp's rows' blocks of SBS super-blocks, row-major as GGUF has them) a copy, issued by
// one lane, landing rows SBS 144 bytes apart. XSB: the activation tiles' bytes a stage (kXsb a super-block of 16 tokens;
// 4 kXsb for 64 tokens, where the engine's stages are two, one ahead). SBS 2: a box row is 288 bytes, whole 32-byte
// sectors (a 144-byte row starts mid-sector every other super-block), and half the box rows a byte. The map's elements are
// elem bytes (a box row is at most 256 elements: 4-byte elements for 288 bytes).
template <int S, int L, int XSB = kXsb, int SBS = 1>
__global__ void __launch_bounds__(kThreads, 2) tile_read_tmap(const __grid_constant__ CUtensorMap tmap, int64_t cols, const int4* x, bool with_x,
                                                             int work, unsigned* sink, int elem = 1) {
  extern __shared__ int4 smem4[];
  uint8_t* smem = reinterpret_cast<uint8_t*>(smem4);
  const BulkThread th(cols, SBS);
  const int lane = th.lane, warp = th.warp, row_base = th.row_base;
  const int64_t sb_begin = th.sb_begin, sb_end = th.sb_end;
  uint64_t* bars = warp_bars<S, XSB, SBS>(smem, warp, lane);
  constexpr int kXPart = XSB / 8;
  const uint32_t bytes = SBS * kBulkWarp + (with_x ? kXPart : 0);
  auto copy = [&](int64_t sb, int stage) {
    if (sb >= sb_end) return;
    uint8_t* st = smem + stage * bulk_stage<XSB, SBS>();
    if (lane == 0) {
      bar_expect(bars + stage, bytes);
      asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
                       (uint32_t)__cvta_generic_to_shared(st + XSB + warp * SBS * kBulkWarp)),
                   "l"(reinterpret_cast<uint64_t>(&tmap)), "r"((int)(sb * 144) / elem), "r"(row_base), "r"((uint32_t)__cvta_generic_to_shared(bars + stage))
                   : "memory");
      if (with_x) bulk(st + warp * kXPart, x + sb * (XSB / SBS / 16) + warp * (kXPart / 16), kXPart, bars + stage);
    }
  };
  run_stages<S, L, XSB, SBS>(copy, bars, smem, sb_begin, sb_end, lane, warp, work, with_x, sink);
}

// tile_read_tmap at 64 tokens with the activation tiles multicast: CTAs in clusters of two (adjacent row tiles, the same
// super-blocks); each copies half of every warp's eighth of a stage's tiles into both CTAs (.multicast::cluster), so the
// L2 serves a tile once a pair instead of once a CTA. A stage is refilled only when both CTAs' warp has used it: an empty
// barrier a warp and stage, one arrival from each CTA's warp, waited for by the lane that copies.
template <int S, int L, int XSB>
__global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(kThreads, 2)
    tile_read_tmap_mc(const __grid_constant__ CUtensorMap tmap, int64_t cols, const int4* x, int work, unsigned* sink) {
  extern __shared__ int4 smem4[];
  uint8_t* smem = reinterpret_cast<uint8_t*>(smem4);
  const BulkThread th(cols);
  const int lane = th.lane, warp = th.warp, row_base = th.row_base;
  const int64_t sb_begin = th.sb_begin, sb_end = th.sb_end;
  uint32_t rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + S * bulk_stage<XSB>()) + warp * 2 * S;
  uint64_t* empty = full + S;
  if (lane == 0)
    for (int s = 0; s < S; ++s) bar_init(full + s, 1), bar_init(empty + s, 2);
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
  constexpr uint32_t kXPart = XSB / 8, kHalf = kXPart / 2;
  auto copy = [&](int64_t sb, int stage) {
    if (sb >= sb_end || lane != 0) return;
    const int64_t use = (sb - sb_begin) / S;
    if (use > 0) {  // both CTAs' warp done with this stage's last use
      asm volatile(
          "{\n.reg .pred done;\nwait_%=:\nmbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 done, [%0], %1;\n@!done bra wait_%=;\n}\n" ::"r"(
              (uint32_t)__cvta_generic_to_shared(empty + stage)),
          "r"((uint32_t)((use - 1) & 1))
          : "memory");
    }
    uint8_t* st = smem + stage * bulk_stage<XSB>();
    bar_expect(full + stage, kBulkWarp + kXPart);  // its own weights, and both CTAs' halves of the tiles
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
                     (uint32_t)__cvta_generic_to_shared(st + XSB + warp * kBulkWarp)),
                 "l"(reinterpret_cast<uint64_t>(&tmap)), "r"((int)(sb * 144)), "r"(row_base), "r"((uint32_t)__cvta_generic_to_shared(full + stage))
                 : "memory");
    const uint32_t off = warp * kXPart + rank * kHalf;
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1], %2, [%3], %4;\n" ::"r"(
                     (uint32_t)__cvta_generic_to_shared(st + off)),
                 "l"(reinterpret_cast<const uint8_t*>(x + sb * (XSB / 16)) + off), "r"(kHalf), "r"((uint32_t)__cvta_generic_to_shared(full + stage)),
                 "h"((uint16_t)3)
                 : "memory");
  };
  auto release = [&](int stage) {  // this warp is done with the stage, in both CTAs' count
    if (lane != 0) return;
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(empty + stage);
    for (uint32_t r = 0; r < 2; ++r) {
      uint32_t ra;
      asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(ra) : "r"(a), "r"(r));
      asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(ra) : "memory");
    }
  };
  run_stages<S, L, XSB>(copy, full, smem, sb_begin, sb_end, lane, warp, work, true, sink, release);
  // No CTA leaves while its peer may still arrive on its barriers or copy into it.
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

// A 2-D tensor map of `rows` rows of `row_bytes` bytes at w, boxes of 16 rows x sbs 144 bytes, elements of elem bytes (1
// or 4), the L2 filled from the DRAM in `promotion` (CUtensorMapL2promotion: 256-byte pieces as the engine's maps, or 128,
// 64, none) (the driver's encoder, found through the runtime so that the lab links no driver library).
CUtensorMap weight_map(const uint8_t* w, int64_t rows, int64_t row_bytes, int sbs = 1, int elem = 1,
                       CUtensorMapL2promotion promotion = CU_TENSOR_MAP_L2_PROMOTION_L2_256B) {
  using Encode = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                              const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
  static Encode encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found;
    CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found));
    if (!fn) {
      std::fprintf(stderr, "cuTensorMapEncodeTiled not found\n");
      std::exit(1);
    }
    return reinterpret_cast<Encode>(fn);
  }();
  CUtensorMap map;
  const cuuint64_t dims[2] = {(cuuint64_t)(row_bytes / elem), (cuuint64_t)rows}, strides[1] = {(cuuint64_t)row_bytes};
  const cuuint32_t box[2] = {(cuuint32_t)(144 * sbs / elem), 16}, steps[2] = {1, 1};
  const CUresult r = encode(&map, elem == 4 ? CU_TENSOR_MAP_DATA_TYPE_UINT32 : CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<uint8_t*>(w), dims, strides, box, steps, CU_TENSOR_MAP_INTERLEAVE_NONE,
                            CU_TENSOR_MAP_SWIZZLE_NONE, promotion, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    std::fprintf(stderr, "cuTensorMapEncodeTiled failed: %d\n", (int)r);
    std::exit(1);
  }
  return map;
}

struct Shape {
  const char* name;
  int64_t rows, cols;
  int splits;
};

int main() {
  int dev = 0, sms = 0;
  CHECK(cudaGetDevice(&dev));
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, dev));
  std::printf("device: %s, %d SMs\n", prop.name, sms);
  const int64_t pool_bytes = 4LL << 30;
  uint8_t* pool = nullptr;
  CHECK(cudaMalloc(&pool, pool_bytes));
  CHECK(cudaMemset(pool, 0x5A, pool_bytes));
  int4* x = nullptr;
  CHECK(cudaMalloc(&x, 64 << 20));
  CHECK(cudaMemset(x, 0x3C, 64 << 20));
  unsigned* sink = nullptr;
  CHECK(cudaMalloc(&sink, 64));
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  // qwen3-32b's batched products as the engine launches them (K splits as its split choice gives at 16 rows).
  const Shape shapes[] = {{"gate+up 51200x5120", 51200, 5120, 1},
                          {"down 5120x25600", 5120, 25600, 6},
                          {"o 5120x8192", 5120, 8192, 6},
                          {"q/k/v 10240x5120", 10240, 5120, 3}};
  struct Variant {
    const char* name;
    int sbs, stages, ahead;
    bool with_x;
    int work, layout;
    bool bulk = false;  // tile_read_bulk
    bool tmap = false;  // tile_read_tmap
    int tokens = 16;    // (tmap) activation tiles of 16 or 64 tokens a stage
    bool multicast = false;  // (tmap, 64 tokens, with x) tile_read_tmap_mc
  };
  const Variant variants[] = {{"S4 L2 (engine)", 1, 4, 2, false, 0, 0},
                              {"S4 L3", 1, 4, 3, false, 0, 0},
                              {"S4 L2 +x", 1, 4, 2, true, 0, 0},
                              {"S4 L2 +x work 48", 1, 4, 2, true, 48, 0},
                              {"S4 L2 +x work 96", 1, 4, 2, true, 96, 0},
                              {"S4 L2 +x work 192", 1, 4, 2, true, 192, 0},
                              {"2 sb/stage S2 L1 +x", 2, 2, 1, true, 0, 0},
                              {"2 sb/stage S2 L1 +x work 96", 2, 2, 1, true, 96, 0},
                              {"8-row groups +x", 1, 4, 2, true, 0, 1},
                              {"8-row groups +x work 96", 1, 4, 2, true, 96, 1},
                              {"128-row tiles +x", 1, 4, 2, true, 0, 2},
                              {"128-row tiles +x work 96", 1, 4, 2, true, 96, 2},
                              {"bulk rows", 1, 4, 2, false, 0, 0, true},
                              {"bulk rows +x", 1, 4, 2, true, 0, 0, true},
                              {"bulk rows +x work 96", 1, 4, 2, true, 96, 0, true},
                              {"bulk rows S4 L3 +x work 96", 1, 4, 3, true, 96, 0, true},
                              {"bulk tiles +x", 1, 4, 2, true, 0, 2, true},
                              {"bulk tiles +x work 96", 1, 4, 2, true, 96, 2, true},
                              {"tensor map", 1, 4, 2, false, 0, 0, true, true},
                              {"tensor map +x", 1, 4, 2, true, 0, 0, true, true},
                              {"tensor map +x work 96", 1, 4, 2, true, 96, 0, true, true},
                              {"tensor map S4 L3 +x work 96", 1, 4, 3, true, 96, 0, true, true},
                              // the L2's fills from the DRAM in 128-byte pieces or none promoted, against the engine's 256
                              {"tensor map +x work 96 L2 128", 1, 4, 2, true, 96, 0, true, true},
                              {"tensor map +x work 96 L2 none", 1, 4, 2, true, 96, 0, true, true},
                              // boxes of two super-blocks (288-byte rows: whole sectors; 4-byte elements), at the same bytes
                              // in flight as S4 L2 (one stage of two ahead); and, with 4-byte elements too, one super-block a
                              // box at S4 L2 and at the same depth in stages, S2 L1
                              {"tensor map u32 +x work 96", 1, 4, 2, true, 96, 0, true, true},
                              {"tensor map u32 S2 L1 +x work 96", 1, 2, 1, true, 96, 0, true, true},
                              {"tensor map 2 sb S2 L1 +x", 2, 2, 1, true, 0, 0, true, true},
                              {"tensor map 2 sb S2 L1 +x work 96", 2, 2, 1, true, 96, 0, true, true},
                              // 64 tokens: the engine's two stages, one ahead; with and without the activation tiles' copies
                              // (what the 4x larger tiles, read from the L2 by every CTA, cost the weights' stream)
                              {"tensor map 64 tok S2 L1", 1, 2, 1, false, 0, 0, true, true, 64},
                              {"tensor map 64 tok S2 L1 +x", 1, 2, 1, true, 0, 0, true, true, 64},
                              {"tensor map 64 tok S2 L1 work 96", 1, 2, 1, false, 96, 0, true, true, 64},
                              {"tensor map 64 tok S2 L1 +x work 96", 1, 2, 1, true, 96, 0, true, true, 64},
                              {"tensor map 64 tok S2 L1 +x multicast", 1, 2, 1, true, 0, 0, true, true, 64, true},
                              {"tensor map 64 tok S2 L1 +x multicast work 96", 1, 2, 1, true, 96, 0, true, true, 64, true}};
  for (const Shape& sh : shapes) {
    const int64_t bytes = sh.rows * (sh.cols / 256) * 144;
    const int copies = (int)(pool_bytes / bytes);
    const int launches = copies < 24 ? copies : 24;
    auto time_graph = [&](auto launch) {
      cudaGraph_t graph;
      CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
      for (int i = 0; i < launches; ++i) launch(pool + (int64_t)(i % copies) * bytes);
      CHECK(cudaStreamEndCapture(stream, &graph));
      return replay_graph_us(graph, stream, 5) / launches;
    };
    const double plain = time_graph([&](const uint8_t* w) {
      plain_read<<<4 * sms, 512, 0, stream>>>(reinterpret_cast<const int4*>(w), bytes / 16, sink);
    });
    std::printf("%-20s plain read            %8.2f us %7.1f GB/s\n", sh.name, plain, bytes / plain / 1e3);
    for (const Variant& v : variants) {
      const dim3 grid((unsigned)((sh.rows + kRows - 1) / kRows), (unsigned)sh.splits);
      const int stage_bytes = v.bulk ? v.sbs * ((v.tokens / 16) * kXsb + 8 * 16 * 144) : v.sbs * kXsb + 8 * v.sbs * 2 * kSlot;
      const int smem = v.stages * stage_bytes + (v.bulk ? (v.multicast ? 2 : 1) * 8 * v.stages * 8 : 0);
      auto run = [&](auto kernel) {
        CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        return time_graph([&](const uint8_t* w) { kernel<<<grid, kThreads, smem, stream>>>(w, sh.rows, sh.cols, x, v.with_x, v.work, v.layout, sink); });
      };
      double us = 0;
      if (v.multicast) {
        auto kernel = tile_read_tmap_mc<2, 1, 4 * kXsb>;
        CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        us = time_graph([&](const uint8_t* w) {
          const CUtensorMap map = weight_map(w, sh.rows, bytes / sh.rows);
          kernel<<<grid, kThreads, smem, stream>>>(map, sh.cols, x, v.work, sink);
        });
      } else if (v.tmap) {
        auto kernel = v.tokens == 64                 ? tile_read_tmap<2, 1, 4 * kXsb>
                      : v.sbs == 2                   ? tile_read_tmap<2, 1, 2 * kXsb, 2>
                      : v.stages == 2                ? tile_read_tmap<2, 1>
                      : v.ahead == 2                 ? tile_read_tmap<4, 2>
                                                     : tile_read_tmap<4, 3>;
        CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        us = time_graph([&](const uint8_t* w) {
          const int elem = v.sbs == 2 || std::strstr(v.name, "u32") ? 4 : 1;
          const CUtensorMapL2promotion promotion = std::strstr(v.name, "L2 none")  ? CU_TENSOR_MAP_L2_PROMOTION_NONE
                                                   : std::strstr(v.name, "L2 128") ? CU_TENSOR_MAP_L2_PROMOTION_L2_128B
                                                                                   : CU_TENSOR_MAP_L2_PROMOTION_L2_256B;
          const CUtensorMap map = weight_map(w, sh.rows, bytes / sh.rows, v.sbs, elem, promotion);
          kernel<<<grid, kThreads, smem, stream>>>(map, sh.cols, x, v.with_x, v.work, sink, elem);
        });
      } else if (v.bulk && v.ahead == 2) us = run(tile_read_bulk<4, 2>);
      else if (v.bulk) us = run(tile_read_bulk<4, 3>);
      else if (v.sbs == 1 && v.ahead == 2) us = run(tile_read<4, 2, 1>);
      else if (v.sbs == 1 && v.ahead == 3) us = run(tile_read<4, 3, 1>);
      else us = run(tile_read<2, 1, 2>);
      std::printf("%-20s %-28s %8.2f us %7.1f GB/s %5.1f%% of plain (smem %d B, %u CTAs)\n", sh.name, v.name, us, bytes / us / 1e3,
                  100.0 * plain / us, smem, grid.x * grid.y);
    }
  }
  CHECK(cudaGetLastError());
  return 0;
}
