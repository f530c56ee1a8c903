// A standalone lab for the one-token Q4_K products inside a decode step's chain of kernels on sm_90. The
// boundary lab (gpu_boundary_lab.cu) found that a chain of plain reads with the engine's launch shapes takes
// ~34 us a qwen3-8b layer for the four products' bytes, where the engine's products cost ~48 (docs/performance.md,
// "What a decode step's kernels cost"). This lab runs the engine's own product code (cuda_matvec_rows.cuh,
// included, not copied) in the same kind of chain, beside forms that differ in one thing each, to find where
// the difference is. Each layer: norm (1 CTA, writes the int8 input of q/k/v), q/k/v, rope, attention,
// combine (writes o's input), o, norm (gate/up's input), gate+up, SwiGLU (down's input), down; every product
// Q4_K, two rows a warp, four warps a CTA, reading its weights from a pool larger than the L2. Product forms:
//   read       a plain read of the same bytes (16-byte loads, all of a CTA's in flight), no arithmetic
//   engine     matvec_q4_k as the engine runs it (P = 1: a warp's rounds one after the other)
//   pipe       matvec_q4_k with P = 2 (the next round's loads issued before this round's arithmetic)
//   pipe-pre   as pipe, the first round's weights loaded before the dependency wait
//   smem       as pipe-pre, the activations copied into shared memory once per CTA (a swizzle that keeps
//              a warp's 16-byte reads free of bank conflicts) and read from there
//   smem-p1    as smem with P = 1 (the first round before the wait)
//   no-copy    as smem without the copy and its barrier (reads whatever shared memory holds: the cost of the
//              copy, timing only)
//   ringS      each warp streams its rows' rounds (8 super-blocks of each of its two rows: 2 x 1152 contiguous
//              bytes) into a ring of S stages in shared memory with cp.async (no registers held by loads in
//              flight; every copy 16 contiguous bytes, no header read four times), the first S - 1 rounds
//              before the dependency wait; the arithmetic is q4_k_round's, on the round read back from the ring
//   lean       engine with fewer and cheaper instructions, the same bits: integers to floats by the 2^23 trick
//              (an OR and a subtraction on the full-rate pipes instead of a conversion at a quarter of the
//              rate), and the high nibbles' dot products on the bytes masked in place (16x the value, unsigned
//              times signed) and shifted back once, instead of shifting every word
//   lean-pipe  lean with P = 2
//   pattern    the engine's loads (Q4KRound, round after round) with a trivial use instead of the arithmetic
//   tiled      engine with the weights laid out so that a CTA's round of its 8 rows is one contiguous run
//              (round k of row r at 9216 k + 1152 (r % 8) in the CTA's 18 KiB; the lab's bytes are random, so
//              any layout reads the same data volume): whether the rows' interleaving costs the DRAM
//   pat-tiled  pattern on the tiled layout
//   smem-async as smem-p1 (P = 1, the first round before the wait), the activations copied with cp.async (every
//              copy issued, then one wait and the barrier)
//   no-copy-p1 smem-async without the copy and its barrier (timing only)
//   perm-act   engine with the activations of each run of 8 super-blocks (2 KiB) stored piece-major: lane 4g + c's
//              piece m at 512 m + 16 (4g + c), so each of a warp's four activation loads reads 512 contiguous bytes
//              (the lab's values are random, so a layout costs only its addresses; timing only, not the engine's bits)
//   planes     engine with a row's headers in a plane apart from its quants, and each super-block's quants
//              permuted so that a lane's two 16-byte pieces are c and c + 4 (each load covers 64 contiguous bytes
//              of each super-block; the header load 128 contiguous bytes); timing only
//   planes-perm both
//   persist    engine, with one wave of CTAs (as many as fit the GPU at once), each warp taking row pairs in
//              turn (no CTA starts after the first wave)
//   streamS    ringS in one wave of CTAs: each warp streams the rounds of all its row pairs through its ring,
//              the next pair's first rounds in flight while it finishes a pair
//   tmaS       ringS with the copy engine (sm_90): a round is two bulk copies (each row's 8 super-blocks, 1152
//              contiguous bytes) issued by lane 0 on the warp's barrier of the stage, so the copies cost the warp
//              two instructions instead of every lane's 16-byte pieces, and its wait is the barrier's
// The small kernels write their outputs with the engine's sizes; one step is one CUDA graph, replayed.
// Prints per model and form: us per step, us per layer, and the weight bytes over the step's time, for the
// whole layer chain and for a chain of the products alone (each product's input written by a one-CTA kernel).
// Before the timings, each form that computes is checked against the engine's output bit for bit.
// Build (from the repository root, as the engine's CUDA files are compiled; the binary is carried to the GPU machine):
//   nvcc -O3 -arch=sm_90 -std=c++17 -DFMT_HEADER_ONLY=1 --expt-relaxed-constexpr -I src bench/gpu_q4k_chain_lab.cu -o q4k_chain_lab
// Run: q4k_chain_lab [replays [form [model]]] (ncu: `--kernel-name regex:product_kernel --launch-skip 9`, past the checks)
#include "backend/cuda/cuda_matvec_rows.cuh"

#include "backend/cuda/cuda_mma.cuh"
#include "gpu_lab_common.cuh"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>


using namespace roofline;
using namespace roofline::cuda;

enum Form { kRead, kEngine, kPipe, kPipePre, kSmem, kSmemP1, kSmemNoCopy, kRing2, kRing3, kRing4, kLean, kLeanPipe, kPattern, kTiled, kPatternTiled, kSmemAsync, kNoCopyP1, kPermAct, kPlanes, kPlanesPermAct, kPersist, kStream2, kStream3, kStream4, kTma2, kTma3, kTma4, kForms };
const char* kFormNames[kForms] = {"read", "engine", "pipe", "pipe-pre", "smem", "smem-p1", "no-copy", "ring2", "ring3", "ring4", "lean", "lean-pipe", "pattern", "tiled", "pat-tiled", "smem-async", "no-copy-p1", "perm-act", "planes", "planes-perm", "persist", "stream2", "stream3", "stream4", "tma2", "tma3", "tma4"};
constexpr int ring_stages(int f) {
  return f == kRing2 || f == kStream2 || f == kTma2 ? 2 : f == kRing3 || f == kStream3 || f == kTma3 ? 3 : f == kRing4 || f == kStream4 || f == kTma4 ? 4 : 0;
}
constexpr bool persistent(int f) { return f >= kPersist && f <= kStream4; }
constexpr bool tma_ring(int f) { return f >= kTma2 && f <= kTma4; }

constexpr int kThreads = 128;  // four warps
constexpr int kRowsPerCta = 8;

// The smem forms: 16-byte unit u = 16 i + 4 c + k of the activations (super-block i, chunk c, piece k) is
// stored at 16 i + 4 c + ((k + 2 (c >> 1) + (i & 1)) & 3): the eight lanes of one phase of a warp's 16-byte
// read (super-blocks i, i + 1, chunks 0-3, one piece k) then fall in eight different groups of four banks.
__device__ __forceinline__ int swizzled_unit(int u) {
  const int i = u >> 4, c = (u >> 2) & 3, k = u & 3;
  return 16 * i + 4 * c + ((k + 2 * (c >> 1) + (i & 1)) & 3);
}

// q4_k_round (cuda_matvec_rows.cuh) with the activations read from shared memory: xq the int8 values
// (swizzled), xd / xs the per-32 scales and sums.
__device__ __forceinline__ void q4_k_round_smem(const Q4KRound<2>& in, const int4* xq, const float* xd, const float* xsum, int64_t i, int c,
                                                float (&acc)[2][1]) {
  const Q4KUnpacked<2> u(in.hdr, in.q0, in.q1, c);
  const int unit = 16 * (int)i + 4 * c;
  const int4 x0 = xq[swizzled_unit(unit)], x1 = xq[swizzled_unit(unit + 1)], x2 = xq[swizzled_unit(unit + 2)], x3 = xq[swizzled_unit(unit + 3)];
  const int s = 8 * (int)i + 2 * c;
  const float2 ad = *reinterpret_cast<const float2*>(xd + s);
  const float2 as = *reinterpret_cast<const float2*>(xsum + s);
#pragma unroll
  for (int r = 0; r < 2; ++r) acc[r][0] = u.term(r, acc[r][0], x0, x1, x2, x3, ad, as);
}

// Exact int -> float for |v| < 2^22 without the conversion pipe: 1.5 * 2^23 + v has v in its low mantissa bits.
__device__ __forceinline__ float int_to_float_exact(int v) { return __int_as_float(0x4B400000 + v) - 12582912.0f; }
// The 6-bit field at `shift` of `word` as a float (0-63 exactly).
__device__ __forceinline__ float six_bits_float(uint32_t word, int shift) {
  return __uint_as_float(((word >> shift) & 63u) | 0x4B000000u) - 8388608.0f;
}
// dp4a of unsigned bytes a with signed bytes b.
__device__ __forceinline__ int dp4a_us(uint32_t a, int b, int c) {
  int d;
  asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}
__device__ __forceinline__ int dot16_us(const int4 w, const int4 a, int acc) {
  acc = dp4a_us((uint32_t)w.x, a.x, acc);
  acc = dp4a_us((uint32_t)w.y, a.y, acc);
  acc = dp4a_us((uint32_t)w.z, a.z, acc);
  return dp4a_us((uint32_t)w.w, a.w, acc);
}
// Scale and min of sub-block j of a Q4_K super-block as floats, k4_scale_min_select's values.
__device__ __forceinline__ void k4_scale_min_lean(int j, uint32_t lo, uint32_t mid, uint32_t hi, float& sc, float& m) {
  const int k = 8 * (j & 3);
  const uint32_t a = lo >> k, b = mid >> k, c = hi >> k;
  const uint32_t sc_hi = (c & 0xF) | ((a >> 6 & 3) << 4), m_hi = (c >> 4 & 0xF) | ((b >> 6 & 3) << 4);
  const uint32_t sv = j < 4 ? a & 63 : sc_hi, mv = j < 4 ? b & 63 : m_hi;
  sc = __uint_as_float(sv | 0x4B000000u) - 8388608.0f;
  m = __uint_as_float(mv | 0x4B000000u) - 8388608.0f;
}
template <int R>
__device__ __forceinline__ void q4_k_round_lean(const Q4KRound<R>& in, const ActQ8& act, int64_t cols, int64_t i, int c, float (&acc)[R][1]) {
  float d[R], dmin[R], sc0[R], m0[R], sc1[R], m1[R];
  int4 lo0[R], lo1[R], hi0[R], hi1[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    half2_floats((uint32_t)in.hdr[r].x, d[r], dmin[r]);
    k4_scale_min_lean(2 * c, (uint32_t)in.hdr[r].y, (uint32_t)in.hdr[r].z, (uint32_t)in.hdr[r].w, sc0[r], m0[r]);
    k4_scale_min_lean(2 * c + 1, (uint32_t)in.hdr[r].y, (uint32_t)in.hdr[r].z, (uint32_t)in.hdr[r].w, sc1[r], m1[r]);
    const int4 a = in.q0[r], b = in.q1[r];
    lo0[r] = make_int4(a.x & 0x0F0F0F0F, a.y & 0x0F0F0F0F, a.z & 0x0F0F0F0F, a.w & 0x0F0F0F0F);
    lo1[r] = make_int4(b.x & 0x0F0F0F0F, b.y & 0x0F0F0F0F, b.z & 0x0F0F0F0F, b.w & 0x0F0F0F0F);
    hi0[r] = make_int4(a.x & 0xF0F0F0F0, a.y & 0xF0F0F0F0, a.z & 0xF0F0F0F0, a.w & 0xF0F0F0F0);
    hi1[r] = make_int4(b.x & 0xF0F0F0F0, b.y & 0xF0F0F0F0, b.z & 0xF0F0F0F0, b.w & 0xF0F0F0F0);
  }
  const int8_t* x = act.q + i * 256 + 64 * c;
  const int4 x0 = ld16(x), x1 = ld16(x + 16), x2 = ld16(x + 32), x3 = ld16(x + 48);
  const int64_t s = 8 * i + 2 * c;
  const float2 ad = __ldg(reinterpret_cast<const float2*>(act.d + s));
  const float2 as = __ldg(reinterpret_cast<const float2*>(act.s + s));
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int dlo = dot16(lo1[r], x1, dot16(lo0[r], x0, 0));
    const int dhi = dot16_us(hi1[r], x3, dot16_us(hi0[r], x2, 0)) >> 4;  // every term a multiple of 16: exact
    // q4k_lane_term's roundings, with the exact conversions
    const float both = __fmaf_rn(__fmul_rn(sc1[r], ad.y), int_to_float_exact(dhi), __fmul_rn(__fmul_rn(sc0[r], ad.x), int_to_float_exact(dlo)));
    acc[r][0] = __fmaf_rn(d[r], both, acc[r][0]);
    acc[r][0] = __fmaf_rn(-dmin[r], __fmaf_rn(m1[r], as.y, __fmul_rn(m0[r], as.x)), acc[r][0]);
  }
}

template <bool PermAct, bool Planes>
__device__ __forceinline__ void q4k_layout(const DeviceWeight& w, const ActQ8& act, float* y, int64_t row0, int lane) {
  const int g = lane / 4, c = lane % 4;
  const int64_t n_sb = w.cols / 256;
  int64_t rows[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) rows[r] = min(row0 + r, w.rows - 1);
  wait_for_previous_kernel();
  float acc[2][1] = {};
  for (int64_t i = g; i < n_sb; i += 8) {
    Q4KRound<2> in;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      if constexpr (Planes) {
        const uint8_t* qb = w.data + rows[r] * n_sb * 128 + i * 128;
        in.hdr[r] = ld16(w.data + w.rows * n_sb * 128 + (rows[r] * n_sb + i) * 16);
        in.q0[r] = ld16(qb + 16 * c);
        in.q1[r] = ld16(qb + 64 + 16 * c);
      } else {
        const uint8_t* blk = w.data + rows[r] * w.row_bytes + i * 144;
        in.hdr[r] = ld16(blk);
        in.q0[r] = ld16(blk + 16 + 32 * c);
        in.q1[r] = ld16(blk + 32 + 32 * c);
      }
    }
    const Q4KUnpacked<2> u(in.hdr, in.q0, in.q1, c);
    int4 x0, x1, x2, x3;
    if constexpr (PermAct) {
      const int8_t* xb = act.q + (i / 8) * 2048 + 16 * (4 * (i % 8) + c);
      x0 = ld16(xb);
      x1 = ld16(xb + 512);
      x2 = ld16(xb + 1024);
      x3 = ld16(xb + 1536);
    } else {
      const int8_t* x = act.q + i * 256 + 64 * c;
      x0 = ld16(x);
      x1 = ld16(x + 16);
      x2 = ld16(x + 32);
      x3 = ld16(x + 48);
    }
    const int64_t s = 8 * i + 2 * c;
    const float2 ad = __ldg(reinterpret_cast<const float2*>(act.d + s));
    const float2 as = __ldg(reinterpret_cast<const float2*>(act.s + s));
#pragma unroll
    for (int r = 0; r < 2; ++r) acc[r][0] = u.term(r, acc[r][0], x0, x1, x2, x3, ad, as);
  }
  store_row_set<1, 2, false>(acc, y, 0, row0, w.rows, false, lane, act);
}

constexpr int kRoundBytes = 2 * 8 * 144;  // one round of a warp: 8 super-blocks of each of two rows
// Shared memory of the ring forms: four warps' rings, and after them the tma forms' barriers (one a warp and stage).
constexpr int ring_smem(int f) { return (kThreads / 32) * ring_stages(f) * (kRoundBytes + (tma_ring(f) ? 8 : 0)); }

// Lane (g, c)'s share of a round staged in a ring slot (two rows of 8 super-blocks, 1152 bytes apart).
__device__ __forceinline__ Q4KRound<2> ring_round(const uint8_t* slot, int g, int c) {
  Q4KRound<2> cur;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const uint8_t* blk = slot + r * 1152 + g * 144;
    cur.hdr[r] = *reinterpret_cast<const int4*>(blk);
    cur.q0[r] = *reinterpret_cast<const int4*>(blk + 16 + 32 * c);
    cur.q1[r] = *reinterpret_cast<const int4*>(blk + 32 + 32 * c);
  }
  return cur;
}

// A warp's two rows (row0, row0 + 1; past the end a repeat) as Q4KRound::load takes them, and its lane's
// super-block group g and chunk c.
struct WarpRows {
  const uint8_t* rowp[2];
  int g, c;
  int64_t n_sb;
  __device__ __forceinline__ WarpRows(const DeviceWeight& w, int64_t row0, int lane) : g(lane / 4), c(lane % 4), n_sb(w.cols / 256) {
#pragma unroll
    for (int r = 0; r < 2; ++r) rowp[r] = w.data + min(row0 + r, w.rows - 1) * w.row_bytes;
  }
  // The lane's first round, loaded before the dependency wait (weights are no kernel's output); then the wait.
  __device__ __forceinline__ Q4KRound<2> first_round_then_wait() const {
    Q4KRound<2> cur;
    if (g < n_sb) cur.load(rowp, g, c);
    wait_for_previous_kernel();
    return cur;
  }
};

template <int S>
__device__ __forceinline__ void q4k_ring(const DeviceWeight& w, const ActQ8& act, float* y, int64_t row0, int lane, uint8_t* ring) {
  const WarpRows wr(w, row0, lane);
  const int g = wr.g, c = wr.c;
  const int64_t n_sb = wr.n_sb, n_rounds = (n_sb + 7) / 8;
  const auto& rowp = wr.rowp;
  // Round k into stage `stage`: each row's super-blocks 8k.. as contiguous 16-byte pieces. One commit per
  // round (empty past the end), so waiting for all but the newest S - 2 groups means round k has landed.
  auto copy_round = [&](int64_t k, int stage) {
    if (k < n_rounds) {
      const int pieces = (int)min((int64_t)8, n_sb - 8 * k) * 9;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const uint8_t* src = rowp[r] + 8 * k * 144;
        uint8_t* dst = ring + stage * kRoundBytes + r * 1152;
        for (int j = lane; j < pieces; j += 32) copy_async<16>(dst + 16 * j, src + 16 * j);
      }
    }
    copy_async_commit();
  };
#pragma unroll
  for (int s = 0; s < S - 1; ++s) copy_round(s, s);  // weights are no kernel's output
  wait_for_previous_kernel();
  float acc[2][1] = {};
  int stage = 0;
  for (int64_t k = 0; k < n_rounds; ++k) {
    copy_async_wait<S - 2>();
    __syncwarp();  // round k landed for every lane; every lane is done with round k - 1's stage
    copy_round(k + S - 1, stage == 0 ? S - 1 : stage - 1);
    const int64_t i = 8 * k + g;
    if (i < n_sb) {
      q4_k_round<1, 2>(ring_round(ring + stage * kRoundBytes, g, c), w, act, i, c, acc);
    }
    stage = stage == S - 1 ? 0 : stage + 1;
  }
  store_row_set<1, 2, false>(acc, y, 0, row0, w.rows, false, lane, act);
}

// tmaS: q4k_ring's rounds by bulk copies. Round k of row r (min(8, n_sb - 8k) super-blocks, contiguous) is one copy issued
// by lane 0 on `bars[stage]`; a round's stage is refilled only after the whole warp has used it (the __syncwarp).
template <int S>
__device__ __forceinline__ void q4k_tma_ring(const DeviceWeight& w, const ActQ8& act, float* y, int64_t row0, int lane, uint8_t* ring,
                                             uint64_t* bars) {
  const WarpRows wr(w, row0, lane);
  const int g = wr.g, c = wr.c;
  const int64_t n_sb = wr.n_sb, n_rounds = (n_sb + 7) / 8;
  if (lane == 0)
    for (int s = 0; s < S; ++s) bar_init(bars + s, 1);
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  __syncwarp();
  auto copy_round = [&](int64_t k, int stage) {
    if (k < n_rounds && lane == 0) {
      const uint32_t bytes = (uint32_t)min((int64_t)8, n_sb - 8 * k) * 144;
      bar_expect(bars + stage, 2 * bytes);
#pragma unroll
      for (int r = 0; r < 2; ++r) bulk(ring + stage * kRoundBytes + r * 1152, wr.rowp[r] + 8 * k * 144, bytes, bars + stage);
    }
  };
#pragma unroll
  for (int s = 0; s < S - 1; ++s) copy_round(s, s);  // weights are no kernel's output
  wait_for_previous_kernel();
  float acc[2][1] = {};
  int stage = 0;
  uint32_t phase = 0;
  for (int64_t k = 0; k < n_rounds; ++k) {
    copy_round(k + S - 1, stage == 0 ? S - 1 : stage - 1);  // (that stage's round k - 1 was used by every lane: the __syncwarp below)
    bar_wait(bars + stage, phase);
    const int64_t i = 8 * k + g;
    if (i < n_sb) {
      q4_k_round<1, 2>(ring_round(ring + stage * kRoundBytes, g, c), w, act, i, c, acc);
    }
    __syncwarp();
    if (++stage == S) stage = 0, phase ^= 1;
  }
  store_row_set<1, 2, false>(acc, y, 0, row0, w.rows, false, lane, act);
}

// streamS: warp `first` of `stride` takes row pairs first, first + stride, ..; its rounds in order through the ring.
template <int S>
__device__ __forceinline__ void q4k_stream(const DeviceWeight& w, const ActQ8& act, float* y, int64_t first, int64_t stride, int lane,
                                           uint8_t* ring) {
  const int g = lane / 4, c = lane % 4;
  const int64_t n_sb = w.cols / 256, n_rounds = (n_sb + 7) / 8, pairs = (w.rows + 1) / 2;
  const int64_t mine = first < pairs ? (pairs - first + stride - 1) / stride : 0, total = mine * n_rounds;
  auto copy_round = [&](int64_t t, int stage) {
    if (t < total) {
      const int64_t row0 = 2 * (first + t / n_rounds * stride), k = t % n_rounds;
      const int pieces = (int)min((int64_t)8, n_sb - 8 * k) * 9;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const uint8_t* src = w.data + min(row0 + r, w.rows - 1) * w.row_bytes + 8 * k * 144;
        uint8_t* dst = ring + stage * kRoundBytes + r * 1152;
        for (int j = lane; j < pieces; j += 32) copy_async<16>(dst + 16 * j, src + 16 * j);
      }
    }
    copy_async_commit();
  };
#pragma unroll
  for (int s = 0; s < S - 1; ++s) copy_round(s, s);
  wait_for_previous_kernel();
  float acc[2][1] = {};
  int stage = 0;
  for (int64_t t = 0; t < total; ++t) {
    copy_async_wait<S - 2>();
    __syncwarp();
    copy_round(t + S - 1, stage == 0 ? S - 1 : stage - 1);
    const int64_t k = t % n_rounds, i = 8 * k + g;
    if (i < n_sb) {
      q4_k_round<1, 2>(ring_round(ring + stage * kRoundBytes, g, c), w, act, i, c, acc);
    }
    stage = stage == S - 1 ? 0 : stage + 1;
    if (k == n_rounds - 1) {
      store_row_set<1, 2, false>(acc, y, 0, 2 * (first + t / n_rounds * stride), w.rows, false, lane, act);
      acc[0][0] = acc[1][0] = 0.0f;
    }
  }
}

template <int F>
__global__ void __launch_bounds__(kThreads, (F == kSmemAsync || F == kNoCopyP1) ? 8 : (F == kPermAct || F == kPlanes || F == kPlanesPermAct) ? 7 : 1)
    product_kernel(DeviceWeight w, ActQ8 act, float* y) {
  extern __shared__ int4 act_smem[];
  const int lane = threadIdx.x % 32;
  const int64_t row0 = ((int64_t)blockIdx.x * (kThreads / 32) + threadIdx.x / 32) * 2;
  if constexpr (F == kRead) {
    // The CTA's rows as one run of 16-byte loads, all in flight, then a trivial use.
    const int64_t n16 = kRowsPerCta * (int64_t)w.row_bytes / 16;
    const int4* base = reinterpret_cast<const int4*>(w.data + (int64_t)blockIdx.x * kRowsPerCta * w.row_bytes);
    constexpr int kMax = 12;  // 24 KiB a round (qwen3-32b down: 8 x 14400 B = 112 KiB, five rounds)
    wait_for_previous_kernel();
    int sum = 0;
    for (int64_t r = 0; r < n16; r += kThreads * kMax) {
      int4 v[kMax];
#pragma unroll
      for (int k = 0; k < kMax; ++k) {
        const int64_t idx = r + threadIdx.x + (int64_t)k * kThreads;
        v[k] = idx < n16 ? __ldcs(base + idx) : int4{0, 0, 0, 0};
      }
#pragma unroll
      for (int k = 0; k < kMax; ++k) sum += v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
    }
    const float v = warp_sum((float)(sum & 1) + (float)act.q[lane]);
    if (lane == 0 && row0 < w.rows) y[row0] = v;
  } else if constexpr (F == kLean || F == kLeanPipe) {
    const WarpRows wr(w, row0, lane);
    const int g = wr.g, c = wr.c;
    const int64_t n_sb = wr.n_sb;
    const auto& rowp = wr.rowp;
    wait_for_previous_kernel();
    float acc[2][1] = {};
    if constexpr (F == kLean) {
      for (int64_t i = g; i < n_sb; i += 8) {
        Q4KRound<2> cur;
        cur.load(rowp, i, c);
        q4_k_round_lean<2>(cur, act, w.cols, i, c, acc);
      }
    } else if (g < n_sb) {
      Q4KRound<2> cur;
      cur.load(rowp, g, c);
      for (int64_t i = g; i < n_sb; i += 8) {
        Q4KRound<2> next;
        const bool more = i + 8 < n_sb;
        if (more) next.load(rowp, i + 8, c);
        q4_k_round_lean<2>(cur, act, w.cols, i, c, acc);
        if (more) cur = next;
      }
    }
    store_row_set<1, 2, false>(acc, y, 0, row0, w.rows, false, lane, act);
  } else if constexpr (F == kPattern || F == kTiled || F == kPatternTiled) {
    const int g = lane / 4, c = lane % 4;
    const int64_t n_sb = w.cols / 256;
    const int64_t rr = min(row0, w.rows - 2);
    const uint8_t* rowp[2] = {w.data + rr * w.row_bytes, w.data + (rr + 1) * w.row_bytes};
    const uint8_t* cta = w.data + (rr / 8) * 8 * w.row_bytes;
    const int rc = (int)(rr % 8);
    wait_for_previous_kernel();
    float acc[2][1] = {};
    int x = 0;
    for (int64_t i = g; i < n_sb; i += 8) {
      Q4KRound<2> cur;
      if constexpr (F == kPattern) {
        cur.load(rowp, i, c);
      } else {
        // Round k = i / 8 of the CTA's rows as one run: 8 rows x (up to) 8 super-blocks, row after row.
        const int64_t k = i / 8, round_row = min((int64_t)8, n_sb - 8 * k) * 144;
        const uint8_t* tiled[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) tiled[r] = cta + k * 8 * 1152 + (rc + r) * round_row;
        cur.load(tiled, i % 8, c);  // + (i % 8) * 144
      }
      if constexpr (F == kTiled) {
        q4_k_round<1, 2>(cur, w, act, i, c, acc);
      } else {
#pragma unroll
        for (int r = 0; r < 2; ++r) x ^= cur.hdr[r].x ^ cur.q0[r].y ^ cur.q1[r].z ^ cur.q0[r].w ^ cur.q1[r].x;
      }
    }
    if constexpr (F != kTiled) acc[0][0] = (float)(x & 1) + (float)act.q[lane];
    store_row_set<1, 2, false>(acc, y, 0, row0, w.rows, false, lane, act);
  } else if constexpr (F == kSmemAsync || F == kNoCopyP1) {
    const WarpRows wr(w, row0, lane);
    const int g = wr.g, c = wr.c;
    const int64_t n_sb = wr.n_sb;
    const auto& rowp = wr.rowp;
    Q4KRound<2> cur = wr.first_round_then_wait();
    int4* xq = act_smem;
    float* xd = reinterpret_cast<float*>(act_smem + w.cols / 16);
    float* xs = xd + w.cols / 32;
    if constexpr (F == kSmemAsync) {
      const int4* q16 = reinterpret_cast<const int4*>(act.q);
      for (int k = threadIdx.x; k < (int)w.cols / 16; k += kThreads) copy_async<16>(xq + swizzled_unit(k), q16 + k);
      for (int64_t k = threadIdx.x; k < w.cols / 128; k += kThreads) {
        copy_async<16>(xd + 4 * k, act.d + 4 * k);
        copy_async<16>(xs + 4 * k, act.s + 4 * k);
      }
      copy_async_commit();
      copy_async_wait<0>();
      __syncthreads();
    }
    float acc[2][1] = {};
    for (int64_t i = g; i < n_sb; i += 8) {
      if (i != g) cur.load(rowp, i, c);
      q4_k_round_smem(cur, xq, xd, xs, i, c, acc);
    }
    store_row_set<1, 2, false>(acc, y, 0, row0, w.rows, false, lane, act);
  } else if constexpr (F == kPermAct || F == kPlanes || F == kPlanesPermAct) {
    q4k_layout<F != kPlanes, F != kPermAct>(w, act, y, row0, lane);
  } else if constexpr (F == kPersist) {
    wait_for_previous_kernel();
    const int64_t stride = (int64_t)gridDim.x * (kThreads / 32), pairs = (w.rows + 1) / 2;
    for (int64_t p = (int64_t)blockIdx.x * (kThreads / 32) + threadIdx.x / 32; p < pairs; p += stride)
      matvec_q4_k<1, 2, false, 1>(w, act, y, 0, false, 2 * p, lane);
  } else if constexpr (persistent(F)) {
    q4k_stream<ring_stages(F)>(w, act, y, (int64_t)blockIdx.x * (kThreads / 32) + threadIdx.x / 32, (int64_t)gridDim.x * (kThreads / 32), lane,
                               reinterpret_cast<uint8_t*>(act_smem) + (threadIdx.x / 32) * ring_stages(F) * kRoundBytes);
  } else if constexpr (tma_ring(F)) {
    constexpr int S = ring_stages(F);
    uint8_t* rings = reinterpret_cast<uint8_t*>(act_smem);
    uint64_t* bars = reinterpret_cast<uint64_t*>(rings + (kThreads / 32) * S * kRoundBytes) + (threadIdx.x / 32) * S;
    q4k_tma_ring<S>(w, act, y, row0, lane, rings + (threadIdx.x / 32) * S * kRoundBytes, bars);
  } else if constexpr (ring_stages(F) > 0) {
    q4k_ring<ring_stages(F)>(w, act, y, row0, lane, reinterpret_cast<uint8_t*>(act_smem) + (threadIdx.x / 32) * ring_stages(F) * kRoundBytes);
  } else if constexpr (F == kEngine || F == kPipe) {
    wait_for_previous_kernel();
    matvec_q4_k<1, 2, false, F == kPipe ? 2 : 1>(w, act, y, 0, false, row0, lane);
  } else {
    const WarpRows wr(w, row0, lane);
    const int g = wr.g, c = wr.c;
    const int64_t n_sb = wr.n_sb;
    const auto& rowp = wr.rowp;
    Q4KRound<2> cur = wr.first_round_then_wait();
    float acc[2][1] = {};
    if constexpr (F == kPipePre) {
      for (int64_t i = g; i < n_sb; i += 8) {
        Q4KRound<2> next;
        const bool more = i + 8 < n_sb;
        if (more) next.load(rowp, i + 8, c);
        q4_k_round<1, 2>(cur, w, act, i, c, acc);
        if (more) cur = next;
      }
    } else {
      // The CTA copies the activations into shared memory: int8 values (swizzled), then d and s.
      int4* xq = act_smem;
      float* xd = reinterpret_cast<float*>(act_smem + w.cols / 16);
      float* xs = xd + w.cols / 32;
      const int4* q16 = reinterpret_cast<const int4*>(act.q);
      if constexpr (F != kSmemNoCopy) {
        for (int k = threadIdx.x; k < (int)w.cols / 16; k += kThreads) xq[swizzled_unit(k)] = __ldcg(q16 + k);
        for (int64_t k = threadIdx.x; k < w.cols / 32; k += kThreads) {
          xd[k] = __ldcg(act.d + k);
          xs[k] = __ldcg(act.s + k);
        }
        __syncthreads();
      }
      if constexpr (F == kSmem || F == kSmemNoCopy) {
        for (int64_t i = g; i < n_sb; i += 8) {
          Q4KRound<2> next;
          const bool more = i + 8 < n_sb;
          if (more) next.load(rowp, i + 8, c);
          q4_k_round_smem(cur, xq, xd, xs, i, c, acc);
          if (more) cur = next;
        }
      } else {
        for (int64_t i = g; i < n_sb; i += 8) {
          if (i != g) cur.load(rowp, i, c);
          q4_k_round_smem(cur, xq, xd, xs, i, c, acc);
        }
      }
    }
    store_row_set<1, 2, false>(acc, y, 0, row0, w.rows, false, lane, act);
  }
}

// A small op: reads a few floats of the previous output, writes the next product's int8 input (cols values
// and their per-32 scales) over its CTAs.
__global__ void __launch_bounds__(kThreads) small_kernel(const float* in, int8_t* q, float* d, float* s, int64_t cols) {
  wait_for_previous_kernel();
  const float v = in[threadIdx.x];
  for (int64_t k = (int64_t)blockIdx.x * kThreads + threadIdx.x; k < cols / 16; k += (int64_t)gridDim.x * kThreads) {
    reinterpret_cast<int4*>(q)[k] = make_int4((int)k, (int)v, 3, 5);
    if (k % 2 == 0) {
      d[k / 2] = v * 1e-3f + 1e-3f;
      s[k / 2] = v;
    }
  }
}

struct Product {
  int64_t rows, cols;
};
struct Shape {
  const char* name;
  int layers;
  int64_t hidden, q_width, ffn;
  Product qkv, o, gate_up, down;
  int rope_ctas, attn_ctas, combine_ctas, swiglu_ctas;
};

constexpr int64_t kQ4KRowBytes(int64_t cols) { return cols / 256 * 144; }

template <int F>
double run(const Shape& sh, bool products_only, uint8_t* pool, int64_t pool_bytes, float* y, int8_t* aq, float* ad, float* as, int replays,
           int64_t* step_bytes) {
  cudaStream_t st;
  CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const int smem = F == kSmem || F == kSmemP1 || F == kSmemNoCopy || F == kSmemAsync || F == kNoCopyP1 ? (int)(sh.ffn * 5 / 4)  // values + d + s for the widest input
                   : ring_smem(F);
  if (smem > 48 * 1024) CHECK(cudaFuncSetAttribute(product_kernel<F>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  int wave = 0;  // persistent forms: CTAs the GPU holds at once
  if constexpr (persistent(F)) {
    int occ = 0, dev = 0, sms = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, product_kernel<F>, kThreads, smem));
    CHECK(cudaGetDevice(&dev));
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    wave = occ * sms;
  }
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  auto launch_small = [&](int ctas, int64_t cols) {
    cudaLaunchConfig_t c{};
    c.gridDim = dim3(ctas);
    c.blockDim = dim3(kThreads);
    c.stream = st;
    c.attrs = attr;
    c.numAttrs = 1;
    CHECK(cudaLaunchKernelEx(&c, small_kernel, (const float*)y, aq, ad, as, cols));
  };
  int64_t offset = 0, bytes = 0;
  auto launch_product = [&](Product p) {
    const int64_t rb = kQ4KRowBytes(p.cols), total = p.rows * rb;
    if (offset + total > pool_bytes) offset = 0;
    DeviceWeight w;
    w.type = DType::Q4_K;
    w.rows = p.rows;
    w.cols = p.cols;
    w.row_bytes = (size_t)rb;
    w.data = pool + offset;
    offset += (total + 255) / 256 * 256;
    bytes += total;
    ActQ8 act;
    act.q = aq;
    act.d = ad;
    act.s = as;
    cudaLaunchConfig_t c{};
    const int64_t ctas = (p.rows + kRowsPerCta - 1) / kRowsPerCta;
    c.gridDim = dim3((unsigned)(wave > 0 ? std::min<int64_t>(ctas, wave) : ctas));
    c.blockDim = dim3(kThreads);
    // The activation forms need 1.25 bytes a column (values, d, s); the ring forms their fixed ring.
    c.dynamicSmemBytes = (size_t)(ring_stages(F) > 0 || smem == 0 ? smem : (int)(p.cols * 5 / 4));
    c.stream = st;
    c.attrs = attr;
    c.numAttrs = 1;
    CHECK(cudaLaunchKernelEx(&c, product_kernel<F>, w, act, y));
  };
  cudaGraph_t graph;
  CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
  for (int l = 0; l < sh.layers; ++l) {
    launch_small(1, sh.hidden);  // norm
    launch_product(sh.qkv);
    if (!products_only) {
      launch_small(sh.rope_ctas, 0);
      launch_small(sh.attn_ctas, 0);
    }
    launch_small(products_only ? 1 : sh.combine_ctas, sh.q_width);
    launch_product(sh.o);
    launch_small(1, sh.hidden);  // norm
    launch_product(sh.gate_up);
    launch_small(products_only ? 1 : sh.swiglu_ctas, sh.ffn);
    launch_product(sh.down);
  }
  CHECK(cudaStreamEndCapture(st, &graph));
  const double us = replay_graph_us(graph, st, replays);
  CHECK(cudaStreamDestroy(st));
  *step_bytes = bytes;
  return us;
}

__global__ void fill_kernel(uint32_t* p, int64_t n) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    uint32_t x = (uint32_t)i * 2654435761u;
    x ^= x >> 13;
    p[i] = (x & 0x0F0F0F0Fu) | 0x20002000u;  // finite f16 pairs in the headers, any nibbles in the quants
  }
}

// One product of each form that computes (not read) against the engine's, bit for bit: 1 if all agree.
template <int F>
bool same_as_engine(const DeviceWeight& w, const ActQ8& act, float* y, const std::vector<float>& want) {
  int smem = ring_smem(F);
  if (F == kSmem || F == kSmemP1 || F == kSmemAsync) smem = (int)(w.cols * 5 / 4);
  if (smem > 48 * 1024) CHECK(cudaFuncSetAttribute(product_kernel<F>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const int64_t ctas = (w.rows + kRowsPerCta - 1) / kRowsPerCta;
  product_kernel<F><<<(unsigned)(persistent(F) ? std::min<int64_t>(ctas, 300) : ctas), kThreads, smem>>>(w, act, y);
  CHECK(cudaDeviceSynchronize());
  std::vector<float> got(want.size());
  CHECK(cudaMemcpy(got.data(), y, got.size() * 4, cudaMemcpyDeviceToHost));
  const bool same = std::memcmp(got.data(), want.data(), got.size() * 4) == 0;
  std::printf("check %-9s %s\n", kFormNames[F], same ? "same bits as engine" : "DIFFERENT");
  return same;
}

int main(int argc, char** argv) {
  const int replays = argc > 1 ? std::atoi(argv[1]) : 20;
  const char* only_form = argc > 2 ? argv[2] : nullptr;   // one form by name (all if absent)
  const char* only_model = argc > 3 ? argv[3] : nullptr;  // one model by name
  const int64_t pool_bytes = 6LL << 30;
  uint8_t* pool;
  CHECK(cudaMalloc(&pool, pool_bytes));
  fill_kernel<<<1024, 256>>>(reinterpret_cast<uint32_t*>(pool), pool_bytes / 4);
  CHECK(cudaGetLastError());
  float* y;
  int8_t* aq;
  float *ad, *as;
  CHECK(cudaMalloc(&y, 1 << 20));
  CHECK(cudaMemset(y, 0, 1 << 20));
  CHECK(cudaMalloc(&aq, 1 << 16));
  CHECK(cudaMalloc(&ad, 1 << 14));
  CHECK(cudaMalloc(&as, 1 << 14));
  {
    DeviceWeight w;
    w.type = DType::Q4_K;
    w.rows = 1000;  // odd pair count per CTA at the end
    w.cols = 20 * 256;
    w.row_bytes = (size_t)kQ4KRowBytes(w.cols);
    w.data = pool + 4096;
    ActQ8 act{aq, ad, as, nullptr};
    small_kernel<<<3, kThreads>>>(y, aq, ad, as, w.cols);
    CHECK(cudaDeviceSynchronize());
    product_kernel<kEngine><<<(unsigned)((w.rows + kRowsPerCta - 1) / kRowsPerCta), kThreads>>>(w, act, y + 4096);
    CHECK(cudaDeviceSynchronize());
    std::vector<float> want(w.rows);
    CHECK(cudaMemcpy(want.data(), y + 4096, want.size() * 4, cudaMemcpyDeviceToHost));
    float* out = y + 8192;
    same_as_engine<kPipe>(w, act, out, want);
    same_as_engine<kSmem>(w, act, out, want);
    same_as_engine<kRing3>(w, act, out, want);
    same_as_engine<kPersist>(w, act, out, want);
    same_as_engine<kLean>(w, act, out, want);
    same_as_engine<kSmemAsync>(w, act, out, want);
    same_as_engine<kLeanPipe>(w, act, out, want);
    same_as_engine<kStream3>(w, act, out, want);
    same_as_engine<kTma3>(w, act, out, want);
  }
  const Shape shapes[] = {
      {"qwen3-8b", 36, 4096, 4096, 12288, {6144, 4096}, {4096, 4096}, {24576, 4096}, {4096, 12288}, 5, 16, 32, 48},
      {"qwen3-32b", 64, 5120, 8192, 25600, {10240, 5120}, {5120, 8192}, {51200, 5120}, {5120, 25600}, 9, 32, 64, 100},
  };
  for (const Shape& sh : shapes)
    for (int po = 0; po < 2; ++po)
      for (int f = 0; f < kForms; ++f) {
        if ((only_form && std::strcmp(only_form, kFormNames[f]) != 0) || (only_model && std::strcmp(only_model, sh.name) != 0)) continue;
        int64_t bytes = 0;
        double us = 0;
        switch (f) {
          case kRead: us = run<kRead>(sh, po, pool, pool_bytes, y, aq, ad, as, replays, &bytes); break;
          case kEngine: us = run<kEngine>(sh, po, pool, pool_bytes, y, aq, ad, as, replays, &bytes); break;
          case kPipe: us = run<kPipe>(sh, po, pool, pool_bytes, y, aq, ad, as, replays, &bytes); break;
          case kPipePre: us = run<kPipePre>(sh, po, pool, pool_bytes, y, aq, ad, as, replays, &bytes); break;
          case kSmem: us = run<kSmem>(sh, po, pool, pool_bytes, y, aq, ad, as, replays, &bytes); break;
          case kRing2: us = run<kRing2>(sh, po, pool, pool_bytes, y, aq, ad, as, replays, &bytes); break;
          case kRing3: us = run<kRing3>(sh, po, pool, pool_bytes, y, aq, ad, as, replays, &bytes); break;
          case kRing4: us = run<kRing4>(sh, po, pool, pool_bytes, y, aq, ad, as, replays, &bytes); break;
          case kLean: us = run<kLean>(sh, po, pool, pool_bytes, y, aq, ad, as, replays, &bytes); break;
          case kLeanPipe: us = run<kLeanPipe>(sh, po, pool, pool_bytes, y, aq, ad, as, replays, &bytes); break;
          case kPattern: us = run<kPattern>(sh, po, pool, pool_bytes, y, aq, ad, as, replays, &bytes); break;
          case kTiled: us = run<kTiled>(sh, po, pool, pool_bytes, y, aq, ad, as, replays, &bytes); break;
          case kPatternTiled: us = run<kPatternTiled>(sh, po, pool, pool_bytes, y, aq, ad, as, replays, &bytes); break;
          case kSmemAsync: us = run<kSmemAsync>(sh, po, pool, pool_bytes, y, aq, ad, as, replays, &bytes); break;
          case kNoCopyP1: us = run<kNoCopyP1>(sh, po, pool, pool_bytes, y, aq, ad, as, replays, &bytes); break;
          case kPermAct: us = run<kPermAct>(sh, po, pool, pool_bytes, y, aq, ad, as, replays, &bytes); break;
          case kPlanes: us = run<kPlanes>(sh, po, pool, pool_bytes, y, aq, ad, as, replays, &bytes); break;
          case kPlanesPermAct: us = run<kPlanesPermAct>(sh, po, pool, pool_bytes, y, aq, ad, as, replays, &bytes); break;
          case kPersist: us = run<kPersist>(sh, po, pool, pool_bytes, y, aq, ad, as, replays, &bytes); break;
          case kStream2: us = run<kStream2>(sh, po, pool, pool_bytes, y, aq, ad, as, replays, &bytes); break;
          case kStream3: us = run<kStream3>(sh, po, pool, pool_bytes, y, aq, ad, as, replays, &bytes); break;
          case kStream4: us = run<kStream4>(sh, po, pool, pool_bytes, y, aq, ad, as, replays, &bytes); break;
          case kTma2: us = run<kTma2>(sh, po, pool, pool_bytes, y, aq, ad, as, replays, &bytes); break;
          case kTma3: us = run<kTma3>(sh, po, pool, pool_bytes, y, aq, ad, as, replays, &bytes); break;
          case kTma4: us = run<kTma4>(sh, po, pool, pool_bytes, y, aq, ad, as, replays, &bytes); break;
          case kSmemNoCopy: us = run<kSmemNoCopy>(sh, po, pool, pool_bytes, y, aq, ad, as, replays, &bytes); break;
          default: us = run<kSmemP1>(sh, po, pool, pool_bytes, y, aq, ad, as, replays, &bytes); break;
        }
        std::printf("%-10s %-14s %-9s step %8.1f us  layer %6.2f us  %7.1f GB/s\n", sh.name, po ? "products only" : "layers", kFormNames[f], us,
                    us / sh.layers, (double)bytes / (us * 1e3));
        std::fflush(stdout);
      }
  return 0;
}
