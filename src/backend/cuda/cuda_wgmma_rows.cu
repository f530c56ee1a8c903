// Products of 9-64 rows of Q4_K and Q6_K weights on Hopper's warpgroup tensor cores (wgmma, sm_90a; the default
// there, ROOFLINE_WGMMA: see wgmma_products_min_rows; and with ROOFLINE_WGMMA_EXPERTS the grouped MoE expert
// products). The same weights in the same A fragments as the mma.sync kernel (cuda_row_blocks.cuh: each row's
// super-block staged in shared memory and dequantized by the four lanes that share it; 128 rows a CTA, by default
// two warpgroups of 16 rows a warp), but one warpgroup instruction multiplies a warp's 16 rows
// by every token at once, reading the activations from shared memory itself: no B fragments in registers,
// a quarter of the tensor instructions at 64 tokens, and the instruction runs while the warp dequantizes
// the next weights. The activations of a super-block are staged once per CTA in the layout the instruction's
// descriptor names: by default as one bulk copy on shared-memory barriers, so that warps do not meet at a CTA barrier
// each super-block (wgmma_rows' BULK; the plain pipeline, every thread's cp.async copies and a CTA barrier, with
// ROOFLINE_WGMMA_BULK=0), and Q4_K weights as one box of a tensor map a warp and super-block (TMA weights, BULK 2;
// ROOFLINE_WGMMA_TMA=0 for each lane's cp.async pieces). Q4_K products fold the mins out of the weights (FOLD,
// ROOFLINE_WGMMA_FOLD): a 17th k16 step of the tiles holds the sub-blocks' sums, which the mins multiply, so a weight
// is one fused multiply-add from its nibble in place (16 times the weight for a high nibble, whose activations the
// tiles hold divided by 16).
#include "backend/cuda/cuda_batched_products.cuh"
#include "backend/cuda/cuda_row_blocks.cuh"

namespace roofline::cuda {

namespace {

// Activations as wgmma's B operand: per super-block, its 16 k16 steps (h, p, u) of the A fragments
// (step 8h + 4p + u), each a K-major tile of 16 k x N tokens without swizzle: [k half][token][8 k] halves,
// so the core matrices (8 tokens x 8 k, 16 bytes a token) are 128 contiguous bytes, the next 8 tokens'
// 128 bytes on (the stride byte offset) and the other k half 16 N bytes on (the leading byte offset).
// Slot j of a k16 step holds the activation that A fragment column j multiplies: lane t's columns 2t, 2t + 1
// are its word's elements 0 and 2, columns 2t + 8, 2t + 9 elements 1 and 3 (RowBlock::group), so column
// 8 kb + jj is element kb + 2 (jj % 2) of the word at RowBlock::x_offset(h, p, u, jj / 2). Q4_K's super-blocks have a
// 17th step, the sums of their sub-blocks (wg_sb_steps), which the folded kernels multiply by the mins.
template <int N>
constexpr int wg_step_bytes() { return 32 * N; }
// A super-block's tiles in memory, and what a stage holds of them: every step, or, for a Q4_K kernel that does not fold
// the mins (FOLD false), the 16 of values.
template <DType T, int N>
constexpr int wg_x_sb_bytes() { return wg_sb_steps(T == DType::Q6_K) * wg_step_bytes<N>(); }
template <DType T, int N, bool FOLD>
constexpr int wg_x_stage_bytes() { return FOLD ? wg_x_sb_bytes<T, N>() : 16 * wg_step_bytes<N>(); }

// Activations [n_tok x cols] (value(n, k): token n's value k, as f32) -> the B tiles of every super-block (tokens past
// n_tok: zeros): run i (in layout order) is 16 bytes, 8 k of one token (wg_tile_index is the inverse).
template <DType T, typename Value>
__device__ __forceinline__ int4 wgmma_b_run(const Value& value, int n_tok, int n_pad, bool folded, int64_t i) {
  constexpr int kSteps = wg_sb_steps(T == DType::Q6_K);
  const int n = (int)(i % n_pad), kb = (int)(i / n_pad % 2), step = (int)(i / (2 * n_pad) % kSteps);
  const int64_t sb = i / (2 * kSteps * n_pad);
  union {
    int4 v;
    __half h[8];
  } o;
  if (step >= 16) {  // the sums: slot j sub-block 8 (step - 16) + j's, in wg_quad_sum / wg_quartet_sum / wg_octet_sum's order
    constexpr int kQuads = T == DType::Q6_K ? 4 : 8;  // quads of four values a sub-block (kb 0: the f16 sum, 1: the rest)
#pragma unroll 1
    for (int j = 0; j < 8; ++j) {
      if (T == DType::Q4_K && !folded) {  // Q4_K products that do not fold the mins: zeros
        o.h[j] = __float2half(0.0f);
        continue;
      }
      const int64_t k0 = sb * 256 + kQuads * 4 * (8 * (step - 16) + j);
      float quad[kQuads];
      for (int qd = 0; qd < kQuads; ++qd) {
        float f[4];
        for (int e = 0; e < 4; ++e) f[e] = n < n_tok ? __half2float(saturated_half(value(n, k0 + 4 * qd + e))) : 0.0f;
        quad[qd] = wg_quad_sum(f[0], f[1], f[2], f[3]);
      }
      float sum = (quad[0] + quad[1]) + (quad[2] + quad[3]);
      if constexpr (kQuads == 8) sum += (quad[4] + quad[5]) + (quad[6] + quad[7]);
      const __half hi = saturated_half(sum);
      o.h[j] = kb == 0 ? hi : saturated_half(sum - __half2float(hi));
    }
    return o.v;
  }
  const bool sixteenths = T == DType::Q4_K && folded && (step / 4) % 2 == 1;  // the high nibbles' steps (k % 64 >= 32)
#pragma unroll
  for (int jj = 0; jj < 8; ++jj) {
    const int64_t k = sb * 256 + RowBlock<T>::x_offset(step / 8, (step / 4) % 2, step % 4, jj / 2) + kb + 2 * (jj % 2);
    const __half v = n < n_tok ? saturated_half(value(n, k)) : __float2half(0.0f);
    o.h[jj] = sixteenths ? wg_sixteenth(v) : v;
  }
  return o.v;
}
template <DType T>
__device__ __forceinline__ int4 wgmma_b_run(const float* x, int n_tok, int64_t cols, int n_pad, bool folded, int64_t i) {
  return wgmma_b_run<T>([&](int n, int64_t k) { return x[(int64_t)n * cols + k]; }, n_tok, n_pad, folded, i);
}
// One thread per run, in the tiles' order (the expert tiles below; and for tests, the reference the value-order
// kernels are checked against).
template <DType T>
__global__ void to_wgmma_b_kernel(const float* x, int n_tok, int64_t cols, int n_pad, bool folded, int4* out) {
  wait_for_previous_kernel();
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < wg_tiles_halves(cols, n_pad, T == DType::Q6_K) / 8) out[i] = wgmma_b_run<T>(x, n_tok, cols, n_pad, folded, i);
}
// The same tiles in the values' order: one thread per four values of a row (16-byte loads, a warp's coalesced), which
// land as two half pairs (values 4i, 4i + 2 and 4i + 1, 4i + 3 share a run: wg_tile_index); rows n_tok..n_pad - 1
// write zeros. value4(n, i) gives values 4i..4i + 3 of token n as f32: the activations themselves (the products'
// conversion) or act(gate) * up (gated_to_wgmma_tiles_kernel, down's input straight from gate/up).
template <typename Value4>
__device__ __forceinline__ void wgmma_tiles_store4(const Value4& value4, int n_tok, int64_t cols, const WgTiles& tiles) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, per_row = cols / 4;
  if (i >= per_row * tiles.n_pad) return;
  const int n = (int)(i / per_row);
  const int64_t k = 4 * (i % per_row);
  wg_tiles_store4(tiles, k, n, n < n_tok ? value4(n, k) : make_float4(0.0f, 0.0f, 0.0f, 0.0f));
}
__global__ void to_wgmma_tiles_kernel(const float* x, int n_tok, int64_t cols, WgTiles tiles) {
  wait_for_previous_kernel();
  wgmma_tiles_store4([&](int n, int64_t k) { return *reinterpret_cast<const float4*>(x + (int64_t)n * cols + k); }, n_tok, cols, tiles);
}
// act(gate) * up: the values gated_product_kernel writes, converted as the products convert them.
template <GateAct kAct>
__global__ void gated_to_wgmma_tiles_kernel(const float* gate, const float* up, int n_tok, int64_t cols, WgTiles tiles) {
  wait_for_previous_kernel();
  wgmma_tiles_store4(
      [&](int n, int64_t k) {
        const float4 g = *reinterpret_cast<const float4*>(gate + (int64_t)n * cols + k);
        const float4 u = *reinterpret_cast<const float4*>(up + (int64_t)n * cols + k);
        return make_float4(gated_value<kAct>(g.x, u.x), gated_value<kAct>(g.y, u.y), gated_value<kAct>(g.z, u.z), gated_value<kAct>(g.w, u.w));
      },
      n_tok, cols, tiles);
}
// Threads of the value-order kernels above.
inline dim3 wgmma_tiles_grid(int64_t cols, int n_pad) { return dim3((unsigned)((cols / 4 * n_pad + 255) / 256)); }
// The expert products' token tiles (grid.y: tile slots; each tile's grouped rows from its row0), one after the other;
// the expert kernel does not fold the mins, so these are plain values (and zeros in Q4_K's 17th step; Q6_K's sums).
template <DType T>
__global__ void to_wgmma_b_tiles_kernel(const float* x, ExpertTiles tiles, int64_t cols, int n_pad, int4* out) {
  wait_for_previous_kernel();
  const int tile = blockIdx.y;
  if (tile >= *tiles.n_tiles) return;
  const int64_t per_tile = wg_tiles_halves(cols, n_pad, T == DType::Q6_K) / 8, i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < per_tile) out[tile * per_tile + i] = wgmma_b_run<T>(x + (int64_t)tiles.row0[tile] * cols, tiles.rows[tile], cols, n_pad, false, i);
}

// The shared-memory matrix descriptor of a K-major tile without swizzle (start address, leading and stride
// byte offsets, each in 16-byte units).
__device__ __forceinline__ uint64_t wg_descriptor(uint32_t smem_addr, uint32_t leading_bytes, uint32_t stride_bytes) {
  return (uint64_t)((smem_addr >> 4) & 0x3FFF) | (uint64_t)((leading_bytes >> 4) & 0x3FFF) << 16 |
         (uint64_t)((stride_bytes >> 4) & 0x3FFF) << 32;
}
// The descriptors of a super-block's k16 steps, built once a super-block: step s's tile starts s * step_bytes after the
// first, which adds s * step_bytes / 16 to the low word's start field (shared memory stays below 2^18 bytes, so the
// 14-bit field never carries into the leading byte offset). One integer addition a product instead of the four
// instructions of a descriptor built from its address.
struct WgDescriptors {
  uint64_t d0;  // step 0's
  __device__ __forceinline__ WgDescriptors(uint32_t smem_addr, uint32_t leading_bytes, uint32_t stride_bytes)
      : d0(wg_descriptor(smem_addr, leading_bytes, stride_bytes)) {}
  __device__ __forceinline__ uint64_t at(uint32_t offset_bytes) const { return d0 + (offset_bytes >> 4); }
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// d (m64 x N, f32; warp w's rows 16w.., the mma.sync m16n8 accumulator layout per 8 tokens) += A (this
// warp's 16 rows as one m16n8k16 A fragment) . B (the descriptor's 16 x N tile).
template <int N>
__device__ __forceinline__ void wgmma_f16(float (&d)[N / 2], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint64_t desc);
template <>
__device__ __forceinline__ void wgmma_f16<16>(float (&d)[8], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint64_t desc) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, 1, 1, 1, 0;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc));
}
template <>
__device__ __forceinline__ void wgmma_f16<32>(float (&d)[16], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint64_t desc) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, 1, 1, 1, 0;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc));
}
template <>
__device__ __forceinline__ void wgmma_f16<48>(float (&d)[24], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint64_t desc) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n48k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23}, {%24, %25, %26, %27}, %28, 1, 1, 1, 0;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc));
}
template <>
__device__ __forceinline__ void wgmma_f16<64>(float (&d)[32], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint64_t desc) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, 1, 1, 1, 0;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc));
}
// Register writes before a warpgroup product that reads them; one batch of products; wait for all but the
// newest `Pending` batches.
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int Pending>
__device__ __forceinline__ void wg_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(Pending) : "memory"); }
// This thread's generic-proxy writes to shared memory (its cp.async copies, once landed) made visible to the
// asynchronous proxy that wgmma reads shared memory through.
__device__ __forceinline__ void fence_proxy_async_shared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Shared-memory barriers (mbarrier) and bulk copies for the pipeline without CTA-wide barriers (BULK below): a
// barrier completes a phase when its expected arrivals have arrived and the bytes announced to it have landed.
__device__ __forceinline__ void mbar_init(uint64_t* bar, int arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"((uint32_t)__cvta_generic_to_shared(bar)), "r"(arrivals) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"((uint32_t)__cvta_generic_to_shared(bar)) : "memory");
}
// This thread's arrival, and `bytes` more to land before the phase completes.
__device__ __forceinline__ void mbar_arrive_expect_bytes(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"((uint32_t)__cvta_generic_to_shared(bar)), "r"(bytes) : "memory");
}
// Returns once the phase of parity `parity` has completed.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  const uint32_t addr = (uint32_t)__cvta_generic_to_shared(bar);
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "wait_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n"
      "}\n" ::"r"(addr),
      "r"(parity)
      : "memory");
}
// The box at (x, y) of the 2-D tensor map `map` (in global memory) to shared memory (128-byte aligned), landing on `bar`.
__device__ __forceinline__ void tensor_copy_2d(void* dst, const void* map, int x, int y, uint64_t* bar) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
                   (uint32_t)__cvta_generic_to_shared(dst)),
               "l"(map), "r"(x), "r"(y), "r"((uint32_t)__cvta_generic_to_shared(bar))
               : "memory");
}
// The TMA weights' boxes of a warp's 16 rows at super-block sb (row_base the first row) into its row slots, and the bytes
// they bring: Q4_K one box of whole blocks; Q6_K three, of its low nibbles, high bits and scales, from its three maps
// (consecutive, 128 bytes each) to where RowBlock<Q6_K>::from_smem_rows reads them.
template <DType T>
constexpr uint32_t wg_box_bytes() { return T == DType::Q4_K ? 16 * 144 : 16 * (128 + 64 + 16); }
template <DType T>
__device__ __forceinline__ void wg_tensor_copies(uint8_t* slots, const void* maps, int sb, int row_base, uint64_t* bar) {
  if constexpr (T == DType::Q4_K) {
    tensor_copy_2d(slots, maps, 144 * sb, row_base, bar);
  } else {
    const uint8_t* m = static_cast<const uint8_t*>(maps);
    tensor_copy_2d(slots + RowBlock<T>::kRowsLo, m, 128 * sb, row_base, bar);
    tensor_copy_2d(slots + RowBlock<T>::kRowsHi, m + 128, 64 * sb, row_base, bar);
    tensor_copy_2d(slots + RowBlock<T>::kRowsSc, m + 256, 16 * sb, row_base, bar);
  }
}
// `bytes` (a multiple of 16, both addresses 16-byte aligned) from global to shared memory, landing on `bar`.
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   (uint32_t)__cvta_generic_to_shared(dst)),
               "l"(src), "r"(bytes), "r"((uint32_t)__cvta_generic_to_shared(bar))
               : "memory");
}
#endif

// A CTA takes 128 weight rows: MT = 2, one warpgroup whose warps own 32 rows each (two m64 tiles a
// warpgroup: each activation tile read by the tensor cores serves 128 rows); MT = 1, two warpgroups whose
// warps own 16 rows (one m64 tile each: half the accumulators and fragments, so twice the warps a SM); two CTAs a
// SM. (CTAs of 256 rows, four warpgroups and one CTA a SM, measured 5-8% slower on an H100: docs/performance.md.)
constexpr int kWgRows = 128;
// A warp's row slots (16 rows: two of RowBlock's 8-row slots) in a stage, padded to 128 bytes, where the TMA weights'
// boxes land (Q6_K: 3392 -> 3456; no stage count changes). (Warps of 32 rows, MT = 2, keep their 4 x kSlotBytes, which
// the 8 x this of a stage holds.)
template <DType T>
constexpr int wg_warp_slot_bytes() { return (2 * RowBlock<T>::kSlotBytes + 127) / 128 * 128; }
template <int MT>
constexpr int wg_threads() { return 256 / MT; }
// Super-blocks staged at once: as many as fit the two CTAs a SM (up to 4, at least 2). (Three CTAs a SM, at 80
// registers a thread, have ptxas serialize the warpgroup products for want of registers in every form, sm_90a.)
// (Where two stages do not fit two CTAs, Q6_K at 64 tokens, the CTA runs alone on its SM; staging as many as fit one
// CTA there, three, measured 1.7% slower on an all-Q6_K qwen3-8b at `-npl 64`: docs/performance.md.)
template <DType T, int N, bool FOLD>
constexpr int wg_stage_bytes() { return wg_x_stage_bytes<T, N, FOLD>() + 8 * wg_warp_slot_bytes<T>(); }
template <DType T, int N, bool FOLD>
constexpr int wg_stages() {
  constexpr int fit = (227 * 1024 / 2 - 1024) / wg_stage_bytes<T, N, FOLD>();
  return fit < 2 ? 2 : fit > 4 ? 4 : fit;
}
// With the bulk pipeline, its 2 S barriers after the stages.
// BULK 2 adds each warp's S weight barriers (see wgmma_rows).
template <DType T, int N, int BULK, bool FOLD>
constexpr int wg_smem_bytes() {
  return wg_stages<T, N, FOLD>() * wg_stage_bytes<T, N, FOLD>() + (BULK ? 16 * wg_stages<T, N, FOLD>() : 0) +
         (BULK == 2 ? 8 * 8 * wg_stages<T, N, FOLD>() : 0);
}

// A row block's scales and A-fragment halves, with the mins (RowBlock::scales, group) or folded out (Q4_K: scales_folded
// with the row's d pair from folded_d, group_folded).
template <bool FOLD, DType T>
__device__ __forceinline__ void wg_scales(const RowBlock<T>& b, const __half2 (&d)[2], int h, uint32_t sel, __half2& scale, __half2& offset) {
  if constexpr (FOLD) b.scales_folded(h, sel, d[0], d[1], scale, offset);
  else b.scales(h, sel, scale, offset);
}
template <bool FOLD, DType T>
__device__ __forceinline__ void wg_group(const RowBlock<T>& b, int h, int p, int u, __half2 scale, __half2 offset, uint32_t& lo, uint32_t& hi) {
  if constexpr (FOLD) b.group_folded(h, p, u, scale, offset, lo, hi);
  else b.group(h, p, u, scale, offset, lo, hi);
}

// One super-block of a warp's rows: its R staged row slots dequantized into A fragments and multiplied by the
// activation tiles at x_addr (shared memory), in four batches of products, each batch's registers freed by a wait
// for the batch before; the last batch is left in flight. FOLD: the weights without their mins (Q4_K: the high
// nibbles' 16 times the weights, against folded tiles' values divided by 16; Q6_K: q * scale without the -32), then a
// fifth batch, the mins by the sub-blocks' sums (the tiles' 17th step, and Q6_K's 18th). PACKED: the slots hold whole
// row blocks as a tensor map's box leaves them (RowBlock<Q4_K>::from_smem_rows).
template <DType T, int N, int MT, bool FOLD, bool PACKED = false>
__device__ __forceinline__ void wg_super_block(float (&acc)[MT][N / 2], const uint8_t* slots, uint32_t x_addr,
                                               int lane, const bool (&row_odd)[2 * MT], int64_t sb, const uint32_t (&scale_sel)[2]) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int R = 2 * MT;
  const WgDescriptors desc0(x_addr, 16 * N, 128);
  RowBlock<T> blk[R];
#pragma unroll
  for (int i = 0; i < R; ++i) {
    if constexpr (PACKED) blk[i].from_smem_rows(slots, i, lane, row_odd[i] != ((sb & 1) != 0));
    else blk[i].from_smem(slots + i * RowBlock<T>::kSlotBytes, lane, row_odd[i] != ((sb & 1) != 0));
  }
  __half2 d[R][2];  // FOLD: each row's d and -1024 d
  if constexpr (FOLD) {
#pragma unroll
    for (int i = 0; i < R; ++i) blk[i].folded_d(d[i][0], d[i][1]);
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int p = 0; p < 2; ++p) {
      uint32_t a_lo[4][R], a_hi[4][R];  // [u][row slot]
      __half2 scale[R], offset[R];        // FOLD: the scale and -1024 times it
#pragma unroll
      for (int i = 0; i < R; ++i) wg_scales<FOLD>(blk[i], d[i], h, scale_sel[p], scale[i], offset[i]);
#pragma unroll
      for (int u = 0; u < 4; ++u)
#pragma unroll
        for (int i = 0; i < R; ++i) wg_group<FOLD>(blk[i], h, p, u, scale[i], offset[i], a_lo[u][i], a_hi[u][i]);
      wg_fence();
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const uint64_t desc = desc0.at((8 * h + 4 * p + u) * wg_step_bytes<N>());
#pragma unroll
        for (int m = 0; m < MT; ++m)
          wgmma_f16<N>(acc[m], a_lo[u][2 * m], a_lo[u][2 * m + 1], a_hi[u][2 * m], a_hi[u][2 * m + 1], desc);
      }
      wg_commit();
      wg_wait<1>();  // the batch before this one: its fragments' registers are free for the next
    }
  }
  if constexpr (FOLD) {
    uint32_t a_min[RowBlock<T>::kSumSteps][R];
#pragma unroll
    for (int s = 0; s < RowBlock<T>::kSumSteps; ++s)
#pragma unroll
      for (int i = 0; i < R; ++i) a_min[s][i] = blk[i].min_fragment(lane % 4, s);
    wg_fence();
#pragma unroll
    for (int s = 0; s < RowBlock<T>::kSumSteps; ++s) {
      const uint64_t desc = desc0.at((16 + s) * wg_step_bytes<N>());
#pragma unroll
      for (int m = 0; m < MT; ++m)
        wgmma_f16<N>(acc[m], a_min[s][2 * m], a_min[s][2 * m + 1], a_min[s][2 * m], a_min[s][2 * m + 1], desc);
    }
    wg_commit();
    wg_wait<1>();
  }
#endif
}

// y[t * ldy + r] (+)= W[r, :] . x[t, :] for t < n_tok <= N over the 128 rows of `row_tile`, K split `split` of
// `n_splits` (partial sums to part, as mma_rows: the same splits and stores).
// BULK (the default; ROOFLINE_WGMMA_BULK=0 for the plain pipeline): no barrier of the whole CTA per super-block. Each
// warp waits only for its own weight copies; a stage's activations come as one bulk copy, issued by thread 0, whose
// landing a barrier of the stage ("full") tells every warp; each warp, done with a stage's products, arrives at the
// stage's "empty" barrier, which thread 0 waits on before it copies into the stage again. The copies run S - 2
// super-blocks ahead where S >= 3 (thread 0 then waits for every warp's super-block before the previous one), S - 1
// where S = 2. So a warp runs ahead of the others by up to the stages in flight instead of meeting them every
// super-block. The plain pipeline: every thread copies its share of a stage's activations, copies run S - 1 ahead, and
// the CTA meets at a barrier each super-block. BULK 2 (the default for Q4_K): the weights as tensor-map boxes (below).
template <DType T, int N, int MT, int BULK, bool FOLD>
__device__ __forceinline__ void wgmma_rows(const DeviceWeight& w, const int4* xb, int n_tok, float* y, int ldy, bool accumulate, float* part,
                                           int64_t row_tile, int split, int n_splits) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4, warp = threadIdx.x / 32;
  constexpr int kThreads = wg_threads<MT>(), R = 2 * MT;  // R: the lane's rows (g, g + 8, g + 16, g + 24)
  const int64_t row_base = row_tile * kWgRows + warp * (16 * MT);
  const int64_t n_sb = w.cols / 256;
  const int64_t sb_begin = n_sb * split / n_splits, sb_end = n_sb * (split + 1) / n_splits;
  int64_t rows[R];  // rows g, g + 8 (this warp's first 16: m tile 0), g + 16, g + 24 (m tile 1); past the end, the last
#pragma unroll
  for (int i = 0; i < R; ++i) rows[i] = min(row_base + g + 8 * i, w.rows - 1);
  bool row_odd[R];  // rows[i] * n_sb odd: super-block sb's index in the row-major blocks is odd where this differs from sb's
#pragma unroll
  for (int i = 0; i < R; ++i) row_odd[i] = ((rows[i] * n_sb) & 1) != 0;
  // kX: a stage's activation bytes, kXsb: a super-block's in memory (FOLD false skips Q4_K's 17th step).
  constexpr int S = wg_stages<T, N, FOLD>(), kX = wg_x_stage_bytes<T, N, FOLD>(), kXsb = wg_x_sb_bytes<T, N>();
  constexpr int kStage = wg_stage_bytes<T, N, FOLD>();
  constexpr int L = BULK && S >= 3 ? S - 2 : S - 1;  // super-blocks the copies run ahead
  constexpr int kWarpSlots = MT == 1 ? wg_warp_slot_bytes<T>() : R * RowBlock<T>::kSlotBytes;
  extern __shared__ __align__(128) int4 wg_smem[];  // (128: the TMA weights' boxes land at multiples of it)
  uint8_t* smem = reinterpret_cast<uint8_t*>(wg_smem);
  // Stage s: [activations of its super-block][warp 0's R row slots][warp 1's] ...; with BULK, after the S stages the
  // S "full" barriers, then the S "empty" ones.
  auto slots = [&](int stage) { return smem + stage * kStage + kX + warp * kWarpSlots; };
  auto weights_copy = [&](int64_t sb, int stage) {
    if (sb < sb_end) {
#pragma unroll
      for (int i = 0; i < R; ++i) RowBlock<T>::copy(w, rows[i], sb, lane, t == i, slots(stage) + i * RowBlock<T>::kSlotBytes);
    }
  };
  float acc[MT][N / 2] = {};
  uint32_t scale_sel[2] = {RowBlock<T>::lane_scale_selector(t, 0), RowBlock<T>::lane_scale_selector(t, 1)};
  if constexpr (FOLD) scale_sel[0] = RowBlock<T>::lane_scale_selector_folded(t, 0), scale_sel[1] = RowBlock<T>::lane_scale_selector_folded(t, 1);
  const uint32_t smem_base = (uint32_t)__cvta_generic_to_shared(smem);
  if constexpr (BULK) {
    uint64_t* full = reinterpret_cast<uint64_t*>(smem + S * kStage);
    uint64_t* empty = full + S;
    constexpr int kWarps = kThreads / 32;
    if (threadIdx.x == 0) {
      for (int s = 0; s < S; ++s) {
        mbar_init(full + s, 1);
        mbar_init(empty + s, kWarps);
      }
      asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    // TMA weights (BULK 2, every member with its tensor maps): the warp's 16 rows' blocks of a super-block arrive as
    // boxes of the weight's tensor maps (rows past the matrix zero), copied by lane 0 on the warp's own barrier of the
    // stage, instead of 16-byte cp.async pieces that each lane waits for; the slots then hold the rows in order
    // (RowBlock::from_smem_rows). Q4_K: one box of 16 rows x 144 bytes. Q6_K: three, of its low nibbles, high bits and
    // scales (16 x 128, 64, 16 bytes); d's 4-byte words still come by cp.async, one lane a row.
    constexpr bool kTmaWeights = BULK == 2 && MT == 1;
    constexpr bool kPieces = !kTmaWeights || T == DType::Q6_K;  // cp.async copies to wait for
    uint64_t* weights_full = empty + S + warp * S;  // (kTmaWeights) this warp's S barriers
    int box_sb = (int)sb_begin;                      // (kTmaWeights) the next super-block
    if constexpr (kTmaWeights) {
      if (lane == 0) {
        for (int s = 0; s < S; ++s) mbar_init(weights_full + s, 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
      }
      __syncwarp();
    }
    // Weights are no kernel's output: the first L stages' weights are fetched before the wait for the previous kernel
    // (one copy group each); the loop's super-block j then waits for all but this thread's newest L - 1 groups. Each row's
    // copies step along it from a cursor, and the loop's stages, phases and activation addresses are counters, so that
    // an iteration spends no 64-bit multiply or division on them.
    const int n = (int)(sb_end - sb_begin);
    typename RowBlock<T>::Cursor cursor[R];
#pragma unroll
    for (int i = 0; i < R; ++i) cursor[i] = typename RowBlock<T>::Cursor(w, rows[i], sb_begin, lane);
    auto weights_copy_next = [&](int stage) {
      uint8_t* slot = slots(stage);
      if constexpr (kTmaWeights) {
        if (lane == 0) {
          mbar_arrive_expect_bytes(weights_full + stage, wg_box_bytes<T>());
          wg_tensor_copies<T>(slot, w.tmap, box_sb, (int)row_base, weights_full + stage);
        }
        ++box_sb;
        if constexpr (T == DType::Q6_K) {
#pragma unroll
          for (int i = 0; i < R; ++i) {
            if (t == i) RowBlock<T>::copy_d_word(slot, i, lane, cursor[i].d_at);
            cursor[i].next();
          }
        }
        return;
      }
      cursor[0].template copy<0>(lane, t == 0, slot);
      cursor[1].template copy<1>(lane, t == 1, slot + RowBlock<T>::kSlotBytes);
      if constexpr (R == 4) {
        cursor[2].template copy<2>(lane, t == 2, slot + 2 * RowBlock<T>::kSlotBytes);
        cursor[3].template copy<3>(lane, t == 3, slot + 3 * RowBlock<T>::kSlotBytes);
      }
#pragma unroll
      for (int i = 0; i < R; ++i) cursor[i].next();
    };
#pragma unroll
    for (int s = 0; s < L; ++s) {
      if (s < n) weights_copy_next(s);
      copy_async_commit();
    }
    __syncthreads();  // the barriers initialized
    wait_for_previous_kernel();
    // Thread 0 copies stage `stage`'s activations (the super-block at x_next) once every warp is done with the stage's
    // use before (`use` > 0).
    const int4* x_next = xb + sb_begin * (kXsb / 16);
    auto x_bulk = [&](int stage, uint32_t use) {
      if (threadIdx.x == 0) {
        if (use > 0) mbar_wait(empty + stage, (use - 1) & 1);
        mbar_arrive_expect_bytes(full + stage, kX);
        bulk_copy(smem + stage * kStage, x_next, kX, full + stage);
        x_next += kXsb / 16;
      }
    };
#pragma unroll
    for (int s = 0; s < L; ++s)
      if (s < n) x_bulk(s, 0);
    int stage = 0, copy_stage = L % S;  // copy_stage: stage (j + L) % S, its use (j + L) / S
    uint32_t phase = 0, copy_use = L / S;
    for (int j = 0; j < n; ++j) {
      if constexpr (kPieces) {
        copy_async_wait<L - 1>();
        __syncwarp();  // the other lanes' copies (the row headers the four lanes of a row share) landed too
      }
      if (j + L < n) weights_copy_next(copy_stage);
      if constexpr (kPieces) copy_async_commit();
      if (j + L < n) x_bulk(copy_stage, copy_use);
      if constexpr (kTmaWeights) mbar_wait(weights_full + stage, phase);
      mbar_wait(full + stage, phase);
      __syncwarp();  // converged for the warpgroup instructions
      wg_super_block<T, N, MT, FOLD, kTmaWeights>(acc, slots(stage), smem_base + stage * kStage, lane, row_odd, sb_begin + j, scale_sel);
      wg_wait<0>();
      __syncwarp();
      if (lane == 0) mbar_arrive(empty + stage);
      if (++stage == S) stage = 0, phase ^= 1;
      if (++copy_stage == S) copy_stage = 0, ++copy_use;
    }
  } else {
    auto x_copy = [&](int64_t sb, int stage) {
      if (sb < sb_end) {
        const int4* src = xb + sb * (kXsb / 16);
        int4* dst = reinterpret_cast<int4*>(smem + stage * kStage);
#pragma unroll
        for (int k = threadIdx.x; k < kX / 16; k += kThreads) copy_async<16>(dst + k, src + k);
      }
    };
    // Weights are no kernel's output: the first L stages' weights are fetched before the wait for the previous
    // kernel (one copy group each), their activations after it (one group for all). So super-block j of the loop
    // waits for all but the newest min(j, L - 1) groups: the first ones for that activation group (with only the
    // loop's own groups after it), the rest for their own stage's group.
#pragma unroll
    for (int s = 0; s < L; ++s) {
      weights_copy(sb_begin + s, s);
      copy_async_commit();
    }
    wait_for_previous_kernel();
#pragma unroll
    for (int s = 0; s < L; ++s) x_copy(sb_begin + s, s);
    copy_async_commit();
    auto stage_copy = [&](int64_t sb, int stage) {
      weights_copy(sb, stage);
      x_copy(sb, stage);
      copy_async_commit();  // one group per super-block (empty past the end)
    };
    int stage = 0;
    for (int64_t sb = sb_begin; sb < sb_end; ++sb) {
      const int64_t j = sb - sb_begin;  // the loop's groups issued so far
      static_assert(L - 1 <= 2, "the waits below cover up to two pending groups");
      if (j == 0) copy_async_wait<0>();
      else if (j == 1) copy_async_wait<(L - 1 < 1 ? L - 1 : 1)>();
      else copy_async_wait<L - 1>();
      fence_proxy_async_shared();
      // Every thread's copies of this stage have landed, and every warp's products from the stage the copy
      // below overwrites (the previous super-block's: each ends with a wait for all its products) are done.
      __syncthreads();
      stage_copy(sb + L, (stage + L) % S);
      wg_super_block<T, N, MT, FOLD>(acc, slots(stage), smem_base + stage * kStage, lane, row_odd, sb, scale_sel);
      stage = stage == S - 1 ? 0 : stage + 1;
      wg_wait<0>();
    }
  }
  wg_wait<0>();
  store_mma_tiles<MT, N / 8>(reinterpret_cast<const float(&)[MT][N / 8][4]>(acc), row_base, w.rows, n_tok, g, t, y, ldy, accumulate, part,
                            split, n_splits);
#else
  __trap();  // the host takes this path only where the device is sm_90 and the build has sm_90a code (wgmma_products_available)
#endif
}

// The products of one input (grid.x over the members' 128-row tiles, K split over grid.y).
template <DType T, int N, int MT, int BULK, bool FOLD>
__global__ void __launch_bounds__(wg_threads<MT>(), 2) wgmma_rows_kernel(MmaMembers members, const int4* xb, int n_tok, bool accumulate,
                                                                         float* part) {
  const MmaMember mem = mma_member(members, blockIdx.x);
  wgmma_rows<T, N, MT, BULK, FOLD>(mem.w, xb, n_tok, mem.y, mem.ldy, accumulate, part + mem.part_off, blockIdx.x - mem.tile0, blockIdx.y,
                             gridDim.y);
}

// The products of one input with members of both kinds (Q4_K first, e.g. q and k, then a Q6_K v): each CTA takes its
// member's kind of kernel, with that kind's activation tiles (xb: Q4_K's, xb6: Q6_K's), one m64 tile a warpgroup; FOLD
// and FOLD6 say whether the Q4_K and the Q6_K products fold.
template <int N, int BULK, bool FOLD, bool FOLD6>
__global__ void __launch_bounds__(wg_threads<1>(), 2) wgmma_rows_mixed_kernel(MmaMembers members, const int4* xb, const int4* xb6, int n_tok,
                                                                               bool accumulate, float* part) {
  const MmaMember mem = mma_member(members, blockIdx.x);
  if (mem.w.type == DType::Q6_K)
    wgmma_rows<DType::Q6_K, N, 1, BULK, FOLD6>(mem.w, xb6, n_tok, mem.y, mem.ldy, accumulate, part + mem.part_off, blockIdx.x - mem.tile0,
                                               blockIdx.y, gridDim.y);
  else
    wgmma_rows<DType::Q4_K, N, 1, BULK, FOLD>(mem.w, xb, n_tok, mem.y, mem.ldy, accumulate, part + mem.part_off, blockIdx.x - mem.tile0,
                                              blockIdx.y, gridDim.y);
}

// Expert products grouped by expert (as mma_experts_kernel): CTA (x, y) takes row tile x of the expert of token
// tile y, whose activation tiles start tile_int4s * y into xb. The expert comes from the routing kernels' output, so
// the wait for the previous kernel comes first here.
template <DType T, int N, int MT>
__global__ void __launch_bounds__(wg_threads<MT>(), 2) wgmma_experts_kernel(DeviceWeight w, int64_t rows_per_expert, ExpertTiles tiles,
                                                                            const int4* xb, int64_t tile_int4s, float* y, int ldy) {
  wait_for_previous_kernel();
  const int i = blockIdx.y;
  if (i >= *tiles.n_tiles) return;
  const DeviceWeight we = expert_view(w, tiles.expert[i], rows_per_expert);
  const int64_t row0 = tiles.row0[i];
  wgmma_rows<T, N, MT, false, false>(we, xb + i * tile_int4s, tiles.rows[i], y + row0 * ldy, ldy, false, nullptr, blockIdx.x, 0, 1);
}

// The pipeline fill a CTA costs, in super-blocks, for the split choice (ROOFLINE_WGMMA_FILL, default 2).
int wgmma_fill_sb() {
  static const int fill = [] {
    const char* e = std::getenv("ROOFLINE_WGMMA_FILL");
    return e ? std::clamp(std::atoi(e), 0, 16) : 2;
  }();
  return fill;
}

int wgmma_tiles_for_test = 0;  // (gpu_use_wgmma_products_for_test; 0: the environment's)

// m64 tiles a warpgroup (ROOFLINE_WGMMA_TILES, 1 or 2; default 1).
int wgmma_tiles() {
  static const int env = [] {
    const char* e = std::getenv("ROOFLINE_WGMMA_TILES");
    return e && std::atoi(e) == 2 ? 2 : 1;
  }();
  return wgmma_tiles_for_test > 0 ? wgmma_tiles_for_test : env;
}

// The bulk pipeline without CTA-wide barriers (see wgmma_rows; on by default, measured +3-8% on an H100 over the
// plain one, ROOFLINE_WGMMA_BULK=0), and in it the weights as tensor-map boxes (TMA weights, on by default; Q4_K: `-npl 16`
// +3.9-4.7%, `-npl 64` +3.3-7.0% on an H100; Q6_K's planes too, where they have maps (ROOFLINE_Q6K_TMAP): `-npl 16`
// +1.8-3.8% more; ROOFLINE_WGMMA_TMA=0 for the lanes' cp.async pieces): mode 0, 1 or 2.
int wgmma_bulk_for_test = -1;  // (gpu_use_wgmma_bulk_for_test; -1: the environment's)
int wgmma_bulk_mode() {
  static const int env = !env_switch("ROOFLINE_WGMMA_BULK", true) ? 0 : env_switch("ROOFLINE_WGMMA_TMA", true) ? 2 : 1;
  return wgmma_bulk_for_test >= 0 ? std::min(wgmma_bulk_for_test, 2) : env;
}
bool wgmma_bulk() { return wgmma_bulk_mode() > 0; }
// Every member has its tensor maps (TMA weights).
bool maps_for(const DeviceWeight* const* ws, int count) {
  for (int m = 0; m < count; ++m)
    if (!ws[m]->tmap) return false;
  return true;
}

// Q4_K products with the mins folded out of the weights (RowBlock<Q4_K>::group_folded: one instruction a weight pair
// instead of one and a half, and a 17th product of the mins by the sub-blocks' sums; ROOFLINE_WGMMA_FOLD, on).
int wgmma_fold_for_test = -1;  // (gpu_use_wgmma_fold_for_test; -1: the environment's)
bool wgmma_fold() {
  static const bool env = env_switch("ROOFLINE_WGMMA_FOLD", true);
  return wgmma_fold_for_test >= 0 ? wgmma_fold_for_test > 0 : env;
}
// Q6_K products with the -32 folded out the same way (RowBlock<Q6_K>::group_folded: one instruction a weight pair
// instead of two, and two more k16 steps a super-block, the -32 scales by the sums of the sub-blocks of 16;
// ROOFLINE_WGMMA_FOLD_Q6). Q6_K tiles hold the sums either way.
int wgmma_fold_q6_for_test = -1;  // (gpu_use_wgmma_fold_q6_for_test; -1: the environment's)
bool wgmma_fold_q6() {
  static const bool env = env_switch("ROOFLINE_WGMMA_FOLD_Q6", true);
  return wgmma_fold_q6_for_test >= 0 ? wgmma_fold_q6_for_test > 0 : env;
}

}  // namespace

bool wg_tiles_folded() { return wgmma_fold(); }

int wgmma_mixed_for_test = -1;  // (gpu_use_wgmma_mixed_for_test; -1: the environment's)
bool wgmma_mixed_joins() {
  static const bool env = env_switch("ROOFLINE_WGMMA_MIXED", true);
  // (The plain pipeline's mixed kernels are built with both folds or neither.)
  return (wgmma_mixed_for_test >= 0 ? wgmma_mixed_for_test > 0 : env) && wgmma_tiles() == 1 &&
         (wgmma_bulk() || wgmma_fold() == wgmma_fold_q6());
}

namespace {

template <DType T, int N, int MT, int BULK, bool FOLD>
void launch_wgmma_rows_form(const DeviceWeight* const* ws, float* const* ys, const int* ldys, int count, const int4* xb, int n_tok,
                            bool accumulate, float* part, size_t part_floats, cudaStream_t stream) {
  constexpr int smem = wg_smem_bytes<T, N, BULK, FOLD>();
  const int slots = smem_set_once<wgmma_rows_kernel<T, N, MT, BULK, FOLD>>(smem, wg_threads<MT>());
  const MmaPlan plan = plan_mma_launch(ws, ys, ldys, count, n_tok, kWgRows, slots, part_floats, wgmma_fill_sb());
  launch(wgmma_rows_kernel<T, N, MT, BULK, FOLD>, dim3((unsigned)plan.tiles, (unsigned)plan.splits), dim3(wg_threads<MT>()), smem,
         stream, pdl_enabled(), plan.m, xb, n_tok, accumulate, part);
  reduce_k_splits(plan, n_tok, accumulate, part, stream);
}
template <DType T, int N, bool FOLD>
void launch_wgmma_rows_folded(const DeviceWeight* const* ws, float* const* ys, const int* ldys, int count, const int4* xb, int n_tok,
                              bool accumulate, float* part, size_t part_floats, cudaStream_t stream) {
  if (wgmma_tiles() == 2) launch_wgmma_rows_form<T, N, 2, false, FOLD>(ws, ys, ldys, count, xb, n_tok, accumulate, part, part_floats, stream);
  else if (wgmma_bulk()) {
    if (wgmma_bulk_mode() == 2 && maps_for(ws, count))
      return launch_wgmma_rows_form<T, N, 1, 2, FOLD>(ws, ys, ldys, count, xb, n_tok, accumulate, part, part_floats, stream);
    launch_wgmma_rows_form<T, N, 1, 1, FOLD>(ws, ys, ldys, count, xb, n_tok, accumulate, part, part_floats, stream);
  } else {
    launch_wgmma_rows_form<T, N, 1, 0, FOLD>(ws, ys, ldys, count, xb, n_tok, accumulate, part, part_floats, stream);
  }
}
template <DType T, int N>
void launch_wgmma_rows(const DeviceWeight* const* ws, float* const* ys, const int* ldys, int count, const int4* xb, int n_tok,
                       bool accumulate, float* part, size_t part_floats, cudaStream_t stream) {
  if (T == DType::Q4_K ? wgmma_fold() : wgmma_fold_q6())
    return launch_wgmma_rows_folded<T, N, true>(ws, ys, ldys, count, xb, n_tok, accumulate, part, part_floats, stream);
  launch_wgmma_rows_folded<T, N, false>(ws, ys, ldys, count, xb, n_tok, accumulate, part, part_floats, stream);
}

template <int N, int BULK, bool FOLD, bool FOLD6>
void launch_wgmma_mixed_form(const DeviceWeight* const* ws, float* const* ys, const int* ldys, int count, const int4* xb, const int4* xb6,
                             int n_tok, bool accumulate, float* part, size_t part_floats, cudaStream_t stream) {
  constexpr int smem = std::max(wg_smem_bytes<DType::Q4_K, N, BULK, FOLD>(), wg_smem_bytes<DType::Q6_K, N, BULK, FOLD6>());
  const int slots = smem_set_once<wgmma_rows_mixed_kernel<N, BULK, FOLD, FOLD6>>(smem, wg_threads<1>());
  const MmaPlan plan = plan_mma_launch(ws, ys, ldys, count, n_tok, kWgRows, slots, part_floats, wgmma_fill_sb());
  launch(wgmma_rows_mixed_kernel<N, BULK, FOLD, FOLD6>, dim3((unsigned)plan.tiles, (unsigned)plan.splits), dim3(wg_threads<1>()), smem, stream,
         pdl_enabled(), plan.m, xb, xb6, n_tok, accumulate, part);
  reduce_k_splits(plan, n_tok, accumulate, part, stream);
}
// The bulk pipeline in each pair of folds; the plain one (ROOFLINE_WGMMA_BULK=0) with both or neither (wgmma_mixed_joins).
template <int N>
void launch_wgmma_mixed(const DeviceWeight* const* ws, float* const* ys, const int* ldys, int count, const int4* xb, const int4* xb6, int n_tok,
                        bool accumulate, float* part, size_t part_floats, cudaStream_t stream) {
  const bool fold = wgmma_fold(), fold6 = wgmma_fold_q6();
  if (wgmma_bulk_mode() == 2 && fold && fold6 && maps_for(ws, count))  // (TMA weights with the default folds only)
    launch_wgmma_mixed_form<N, 2, true, true>(ws, ys, ldys, count, xb, xb6, n_tok, accumulate, part, part_floats, stream);
  else if (wgmma_bulk()) {
    if (fold && fold6) launch_wgmma_mixed_form<N, true, true, true>(ws, ys, ldys, count, xb, xb6, n_tok, accumulate, part, part_floats, stream);
    else if (fold) launch_wgmma_mixed_form<N, true, true, false>(ws, ys, ldys, count, xb, xb6, n_tok, accumulate, part, part_floats, stream);
    else if (fold6) launch_wgmma_mixed_form<N, true, false, true>(ws, ys, ldys, count, xb, xb6, n_tok, accumulate, part, part_floats, stream);
    else launch_wgmma_mixed_form<N, true, false, false>(ws, ys, ldys, count, xb, xb6, n_tok, accumulate, part, part_floats, stream);
  } else {
    if (fold) launch_wgmma_mixed_form<N, false, true, true>(ws, ys, ldys, count, xb, xb6, n_tok, accumulate, part, part_floats, stream);
    else launch_wgmma_mixed_form<N, false, false, false>(ws, ys, ldys, count, xb, xb6, n_tok, accumulate, part, part_floats, stream);
  }
}
// Members of both kinds, Q4_K first: both tile layouts of x (x_ready: the producer wrote them, wg_q6_tiles), then one launch.
void wgmma_products_mixed(const DeviceWeight* const* ws, float* const* ys, const int* ldys, int count, const float* x, int n_tokens,
                          bool accumulate, float* part, size_t part_floats, __half* x_scratch, bool x_ready, cudaStream_t stream) {
  const int n_pad = wgmma_n_pad(n_tokens);
  const int64_t cols = ws[0]->cols;
  __half* x6 = wg_q6_tiles(x_scratch, cols, n_pad);
  if (!x_ready)
    launch(to_wgmma_tiles_kernel, wgmma_tiles_grid(cols, n_pad), dim3(256), 0, stream, pdl_enabled(), x, n_tokens, cols,
           WgTiles{x_scratch, n_pad, false, wg_tiles_folded(), x6});
  const int4* xb = reinterpret_cast<const int4*>(x_scratch);
  const int4* xb6 = reinterpret_cast<const int4*>(x6);
  switch (n_pad / 16) {
    case 1: return launch_wgmma_mixed<16>(ws, ys, ldys, count, xb, xb6, n_tokens, accumulate, part, part_floats, stream);
    case 2: return launch_wgmma_mixed<32>(ws, ys, ldys, count, xb, xb6, n_tokens, accumulate, part, part_floats, stream);
    case 3: return launch_wgmma_mixed<48>(ws, ys, ldys, count, xb, xb6, n_tokens, accumulate, part, part_floats, stream);
    default: return launch_wgmma_mixed<64>(ws, ys, ldys, count, xb, xb6, n_tokens, accumulate, part, part_floats, stream);  // <= 64
  }
}

template <DType T>
void wgmma_products_of(const DeviceWeight* const* ws, float* const* ys, const int* ldys, int count, const float* x, int n_tokens,
                       bool accumulate, float* part, size_t part_floats, __half* x_scratch, bool x_ready, cudaStream_t stream) {
  const int n_pad = wgmma_n_pad(n_tokens);
  const int64_t cols = ws[0]->cols;
  int4* xb = reinterpret_cast<int4*>(x_scratch);
  if (!x_ready)
    launch(to_wgmma_tiles_kernel, wgmma_tiles_grid(cols, n_pad), dim3(256), 0, stream, pdl_enabled(), x, n_tokens, cols,
           WgTiles{x_scratch, n_pad, T == DType::Q6_K, wg_tiles_folded()});
  switch (n_pad / 16) {
    case 1: return launch_wgmma_rows<T, 16>(ws, ys, ldys, count, xb, n_tokens, accumulate, part, part_floats, stream);
    case 2: return launch_wgmma_rows<T, 32>(ws, ys, ldys, count, xb, n_tokens, accumulate, part, part_floats, stream);
    case 3: return launch_wgmma_rows<T, 48>(ws, ys, ldys, count, xb, n_tokens, accumulate, part, part_floats, stream);
    default: return launch_wgmma_rows<T, 64>(ws, ys, ldys, count, xb, n_tokens, accumulate, part, part_floats, stream);  // <= 64
  }
}

int wgmma_mode_for_test = -1;  // (gpu_use_wgmma_products_for_test; -1: the environment's)
int wgmma_experts_for_test = -1;  // (gpu_use_wgmma_experts_for_test; -1: the environment's)

template <DType T, int N>
void launch_wgmma_experts(const DeviceWeight& w, int64_t rows_per_expert, const ExpertTiles& tiles, const float* x, __half* scratch, float* y,
                          int ldy, cudaStream_t stream) {
  const int64_t per_tile = wg_tiles_halves(w.cols, N, T == DType::Q6_K) / 8;  // 16-byte runs of one tile's activations
  int4* xb = reinterpret_cast<int4*>(scratch);
  launch(to_wgmma_b_tiles_kernel<T>, dim3((unsigned)((per_tile + 255) / 256), (unsigned)tiles.max_tiles), dim3(256), 0, stream, pdl_enabled(),
         x, tiles, w.cols, N, xb);
  constexpr int smem = wg_smem_bytes<T, N, false, false>();
  smem_set_once<wgmma_experts_kernel<T, N, 1>>(smem, wg_threads<1>());
  launch(wgmma_experts_kernel<T, N, 1>, dim3((unsigned)((rows_per_expert + kWgRows - 1) / kWgRows), (unsigned)tiles.max_tiles),
         dim3(wg_threads<1>()), smem, stream, pdl_enabled(), w, rows_per_expert, tiles, (const int4*)xb, per_tile, y, ldy);
}
template <DType T>
void wgmma_experts_of(const DeviceWeight& w, int64_t rows_per_expert, const ExpertTiles& tiles, const float* x, __half* scratch, float* y,
                      int ldy, cudaStream_t stream) {
  switch (tiles.nt) {
    case 2: return launch_wgmma_experts<T, 16>(w, rows_per_expert, tiles, x, scratch, y, ldy, stream);
    case 4: return launch_wgmma_experts<T, 32>(w, rows_per_expert, tiles, x, scratch, y, ldy, stream);
    case 6: return launch_wgmma_experts<T, 48>(w, rows_per_expert, tiles, x, scratch, y, ldy, stream);
    case 8: return launch_wgmma_experts<T, 64>(w, rows_per_expert, tiles, x, scratch, y, ldy, stream);
    default: fail("internal error: expert token tiles of {} n8 tiles", tiles.nt);
  }
}

}  // namespace

// The smallest row count that takes the warpgroup kernel: 9 by default (measured faster than the mma.sync kernel
// at 9-32 rows and than the f16 copies at 33-64 on an H100, docs/performance.md); ROOFLINE_WGMMA=N: N-64, =0: none.
int wgmma_products_min_rows() {
  static const int env = [] {
    const char* e = std::getenv("ROOFLINE_WGMMA");
    const int v = e ? std::atoi(e) : 9;
    return v <= 0 ? 0 : std::max(9, v);
  }();
  return wgmma_mode_for_test < 0 ? env : wgmma_mode_for_test;
}

bool wgmma_products_available() {
#if defined(ROOFLINE_CUDA_HAS_SM90A)
  static thread_local int cached_dev = -1;
  static thread_local bool cached = false;
  int dev = 0;
  ROOFLINE_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev != cached_dev) {
    int major = 0, minor = 0;
    ROOFLINE_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    ROOFLINE_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    cached = major == 9 && minor == 0;
    cached_dev = dev;
  }
  return cached;
#else
  return false;
#endif
}

bool wgmma_products_take(const DeviceWeight& w, int n_tokens) {
  const int min_rows = wgmma_products_min_rows();
  return min_rows > 0 && n_tokens >= min_rows && n_tokens > 8 && n_tokens <= kMaxFusedRows && w.cols % 256 == 0 &&
         ((w.type == DType::Q4_K && w.layout == WeightLayout::Raw) || (w.type == DType::Q6_K && w.layout == WeightLayout::Q6KPlanes)) &&
         wgmma_products_available();
}

// The grouped expert products on the warpgroup kernel: with ROOFLINE_WGMMA_EXPERTS=1 (off: written after the
// session's device time was spent, not yet measured).
bool wgmma_experts_take(const DeviceWeight& stacked) {
  static const bool env = env_switch("ROOFLINE_WGMMA_EXPERTS", false);
  const bool on = wgmma_experts_for_test < 0 ? env : wgmma_experts_for_test > 0;
  return on && stacked.cols % 256 == 0 &&
         ((stacked.type == DType::Q4_K && stacked.layout == WeightLayout::Raw) || (stacked.type == DType::Q6_K && stacked.layout == WeightLayout::Q6KPlanes)) &&
         wgmma_products_available();
}

void wgmma_experts(const DeviceWeight& stacked, int64_t rows_per_expert, const ExpertTiles& tiles, const float* x_grouped, __half* scratch,
                   float* y, int ldy, cudaStream_t stream) {
  if (stacked.type == DType::Q4_K) wgmma_experts_of<DType::Q4_K>(stacked, rows_per_expert, tiles, x_grouped, scratch, y, ldy, stream);
  else wgmma_experts_of<DType::Q6_K>(stacked, rows_per_expert, tiles, x_grouped, scratch, y, ldy, stream);
}

void wgmma_products(const DeviceWeight* const* ws, float* const* ys, const int* ldys, int count, const float* x, int n_tokens,
                    bool accumulate, float* part, size_t part_floats, __half* x_scratch, bool x_ready, cudaStream_t stream) {
  for (int k = 1; k < count; ++k)
    if (ws[k]->type != ws[0]->type) {
      if (ws[0]->type != DType::Q4_K || !wgmma_mixed_joins()) fail("internal error: warpgroup products of {} and {} weights joined", dtype_name(ws[0]->type), dtype_name(ws[k]->type));
      return wgmma_products_mixed(ws, ys, ldys, count, x, n_tokens, accumulate, part, part_floats, x_scratch, x_ready, stream);
    }
  if (ws[0]->type == DType::Q4_K)
    wgmma_products_of<DType::Q4_K>(ws, ys, ldys, count, x, n_tokens, accumulate, part, part_floats, x_scratch, x_ready, stream);
  else
    wgmma_products_of<DType::Q6_K>(ws, ys, ldys, count, x, n_tokens, accumulate, part, part_floats, x_scratch, x_ready, stream);
}

void gated_wgmma_tiles(bool geglu, const float* gate, const float* up, int n_rows, int n, const WgTiles& tiles, cudaStream_t stream) {
  if (n % 256 != 0 || tiles.n_pad < n_rows || tiles.n_pad % 16 != 0)
    fail("internal error: warpgroup tiles of {} rows of {} values for {} tokens", n_rows, n, tiles.n_pad);
  const dim3 grid = wgmma_tiles_grid(n, tiles.n_pad);
  if (geglu) launch(gated_to_wgmma_tiles_kernel<GateAct::GeluTanh>, grid, dim3(256), 0, stream, pdl_enabled(), gate, up, n_rows, (int64_t)n, tiles);
  else launch(gated_to_wgmma_tiles_kernel<GateAct::Silu>, grid, dim3(256), 0, stream, pdl_enabled(), gate, up, n_rows, (int64_t)n, tiles);
}

void wgmma_convert_for_test(const float* x, int n_rows, int n, const WgTiles& tiles, bool run_order, cudaStream_t stream) {
  if (!run_order) {
    launch(to_wgmma_tiles_kernel, wgmma_tiles_grid(n, tiles.n_pad), dim3(256), 0, stream, pdl_enabled(), x, n_rows, (int64_t)n, tiles);
    return;
  }
  const int64_t runs = wg_tiles_halves(n, tiles.n_pad, tiles.q6) / 8;
  const dim3 grid((unsigned)((runs + 255) / 256));
  int4* out = reinterpret_cast<int4*>(tiles.out);
  if (tiles.q6) launch(to_wgmma_b_kernel<DType::Q6_K>, grid, dim3(256), 0, stream, pdl_enabled(), x, n_rows, (int64_t)n, tiles.n_pad, false, out);
  else launch(to_wgmma_b_kernel<DType::Q4_K>, grid, dim3(256), 0, stream, pdl_enabled(), x, n_rows, (int64_t)n, tiles.n_pad, tiles.folded, out);
}

}  // namespace roofline::cuda

namespace roofline {

void gpu_use_wgmma_products_for_test(int min_rows, int m_tiles) {
  cuda::wgmma_mode_for_test = min_rows;
  cuda::wgmma_tiles_for_test = m_tiles;
}
bool gpu_wgmma_products_available_for_test() { return cuda::wgmma_products_available(); }
void gpu_use_wgmma_experts_for_test(int on) { cuda::wgmma_experts_for_test = on; }
void gpu_use_wgmma_bulk_for_test(int mode) { cuda::wgmma_bulk_for_test = mode; }
void gpu_use_wgmma_fold_for_test(int on) { cuda::wgmma_fold_for_test = on; }
void gpu_use_wgmma_fold_q6_for_test(int on) { cuda::wgmma_fold_q6_for_test = on; }
void gpu_use_wgmma_mixed_for_test(int on) { cuda::wgmma_mixed_for_test = on; }

}  // namespace roofline
