// Shared pieces of the CUDA backend: error checks that throw roofline::Error, the one launch helper
// every kernel goes through (so launch attributes such as programmatic dependent launch are set in
// one place), warp reductions in a fixed order, and the device-side view of a weight.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/error.h"
#include "formats/dtype.h"

namespace roofline::cuda {

// Errors after which the CUDA context is unusable: every later call in the process reports them again
// (CUDA runtime API documentation of each code). They throw DeviceFault so that the server stops
// taking requests; other errors throw Error.
inline bool cuda_error_is_sticky(cudaError_t err) {
  switch (err) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
    case cudaErrorLaunchTimeout:
    case cudaErrorECCUncorrectable:
    case cudaErrorNvlinkUncorrectable:
      return true;
    default:
      return false;
  }
}

[[noreturn]] inline void cuda_check_failed(cudaError_t err, const char* file, int line) {
  const std::string message = fmt::format("CUDA error {} ({}) at {}:{}", cudaGetErrorName(err), cudaGetErrorString(err), file, line);
  if (cuda_error_is_sticky(err)) throw ::roofline::DeviceFault(message);
  throw ::roofline::Error(message);
}

#define ROOFLINE_CUDA_CHECK(expr)                                                            \
  do {                                                                                       \
    cudaError_t err_ = (expr);                                                               \
    if (err_ != cudaSuccess) ::roofline::cuda::cuda_check_failed(err_, __FILE__, __LINE__);  \
  } while (0)

// Launches kernel<<<grid, block, smem, stream>>>(args...) through cudaLaunchKernelEx. With `pdl`, the
// launch allows programmatic dependent launch (sm_90: the kernel may start while the previous one drains;
// kernels that read the previous kernel's output call cudaGridDependencySynchronize() first).
template <typename... KernelArgs, typename... Args>
void launch(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, bool pdl,
            Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attr[1];
  if (pdl) {
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    config.attrs = attr;
    config.numAttrs = 1;
  }
  ROOFLINE_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

// Called by every CTA of every kernel launched with `pdl_enabled()`, before it reads anything the previous
// kernel wrote and before it exits: waits until the previous kernel has finished and its writes are
// visible (PDL lets this kernel's CTAs start while that one drains), then lets the next kernel's CTAs
// launch. A no-op before sm_90 or when launched without PDL. Before the call a kernel may read only what
// no kernel of the current step writes: the step's buffers (written by the host before its first kernel),
// the weights, and state left by earlier steps. Rope's cos/sin, attention's split bounds and the DeltaNet
// state loads are done there, off the step's critical path.
__device__ __forceinline__ void wait_for_previous_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cudaGridDependencySynchronize();
  cudaTriggerProgrammaticLaunchCompletion();
#endif
}

// Whether step kernels are launched with programmatic dependent launch: on GPUs of compute capability
// 9.0 and newer, unless ROOFLINE_PDL=0. Every kernel launched with it must call
// wait_for_previous_kernel() before touching memory (a kernel that skipped it could finish before its
// predecessor and release the next kernel early).
bool pdl_enabled();
// An on/off switch from the environment: `name`=0 turns it off, =1 on, anything else (or unset) leaves
// `default_on`. Callers read it once (a function-local static) and say its measured reason beside it.
bool env_switch(const char* name, bool default_on);
// Whether a step's logits are handed out where they were staged (the pinned buffer) instead of copied
// (Backend::keeps_host_logits): on unless ROOFLINE_PINNED_LOGITS=0, for A/B measurements.
bool pinned_logits_on();
// The architecture the current device's kernels run as, 10 * major + minor: its compute capability, or
// less where the binary only has code for an older one (a PTX-only build JIT-compiled by the driver).
// Host code picks kernel forms by this, never by the device's capability alone.
int code_arch();
// The current device's SM count (cached per device; 1 if it cannot be read).
int sm_count();
// Decode attention's span rule (attention_span), read when a backend is created: the shortest span (32, or
// ROOFLINE_ATTN_MIN_SPAN: 16-128), the splits per row before short spans double (32, or ROOFLINE_ATTN_SPLITS:
// 8-512), before spans of 128 keys and more double (twice that, and at least 512 / n_head_kv, or
// ROOFLINE_ATTN_LONG_SPLITS: 8-1024) and the longest span (512, or ROOFLINE_ATTN_MAX_SPAN: 128-1024).
struct AttentionSpans;
AttentionSpans attention_spans(int n_head_kv);
// The keys a run of prompt rows must reach to take prefill_attention (plan_attention): any run where the
// flash kernel takes the cache (`flash`), kMinPrefillKeys otherwise; ROOFLINE_PREFILL_MIN_KEYS (at least
// kMinPrefillRun) sets both, read once.
int prefill_min_keys(bool flash);

// A float as f16, saturated at the f16 range (an activation beyond it would otherwise become inf): the
// tensor-core products' f16 inputs.
__device__ __forceinline__ __half saturated_half(float v) { return __float2half(fminf(fmaxf(v, -65504.0f), 65504.0f)); }
// Eight floats (two 16-byte loads) times scale as eight saturated f16 (one 16-byte store).
__device__ __forceinline__ int4 f16x8_saturated(float4 a, float4 b, float scale = 1.0f) {
  auto h = [&](float v) { return saturated_half(v * scale); };
  union {
    int4 v;
    __half h[8];
  } o;
  o.h[0] = h(a.x), o.h[1] = h(a.y), o.h[2] = h(a.z), o.h[3] = h(a.w);
  o.h[4] = h(b.x), o.h[5] = h(b.y), o.h[6] = h(b.z), o.h[7] = h(b.w);
  return o.v;
}

// Four floats as four saturated f16 (one 8-byte store).
__device__ __forceinline__ uint2 f16x4_saturated(float4 a) {
  union {
    uint2 v;
    __half h[4];
  } o;
  o.h[0] = saturated_half(a.x), o.h[1] = saturated_half(a.y), o.h[2] = saturated_half(a.z), o.h[3] = saturated_half(a.w);
  return o.v;
}

// act(gate) * up, the gated FFN's (and gated attention's) elementwise step: silu (SwiGLU), sigmoid (gated
// attention's output gate) or GELU with the tanh approximation (GeGLU). One definition for every kernel that
// computes it, so they agree to the bit.
enum class GateAct { Silu, Sigmoid, GeluTanh };
template <GateAct kAct>
__device__ __forceinline__ float gated_value(float a, float u) {
  if constexpr (kAct == GateAct::GeluTanh) return 0.5f * a * (1.0f + tanhf(0.7978845608f * (a + 0.044715f * a * a * a))) * u;
  else return (kAct == GateAct::Sigmoid ? 1.0f : a) / (1.0f + __expf(-a)) * u;
}

// A product input of a 9-64 row step written by the kernel that computes it straight as the activation tiles of
// Hopper's warpgroup kernel (cuda_wgmma_rows.cu), so that no conversion launch runs between the two: n_pad
// tokens (the step's rows rounded up to 16; the rows past the step's as zeros, as the conversion writes them)
// in the layout of Q6_K's row blocks (q6) or Q4_K's. out == nullptr: no tiles. folded (Q4_K): tiles for products that
// fold the mins out of the weights (wg_tiles_folded): the 17th k16 step holds the sub-block sums (below), and the
// values the high nibbles multiply (k % 64 >= 32) are stored divided by 16 (wg_sixteenth); else plain values and zeros.
// Q6_K tiles always hold their sub-block sums (steps 17 and 18), which products that fold Q6_K's -32 read.
// out_q6 (Q4_K tiles only): the same values also in Q6_K's layout there, for a launch whose products are of both kinds
// (q/k with a Q6_K v: wgmma_mixed_joins).
struct WgTiles {
  __half* out = nullptr;
  int n_pad = 0;
  bool q6 = false;
  bool folded = true;
  __half* out_q6 = nullptr;
};
// A value the folded products' high nibbles multiply: they take 16 q * scale (the nibble in place), so the value is
// stored / 16, exact unless the quotient is subnormal in f16 (|x| < 2^-10), where it rounds to 2^-24.
__device__ __forceinline__ __half wg_sixteenth(__half x) { return __hmul(x, __float2half(0.0625f)); }
// k16 steps a super-block of tiles: 16 of values, then the sums of its sub-blocks, which the products' mins multiply
// (RowBlock<T>::min_fragment): Q4_K's eight sub-blocks of 32 values in a 17th step, Q6_K's sixteen of 16 in a 17th
// (sub-blocks 0-7) and an 18th (8-15). In run kb = 0 of a token, slot j holds sub-block j's (8 s + j's) sum rounded to
// f16, in run kb = 1 what that rounding left.
__host__ __device__ constexpr int wg_sb_steps(bool q6) { return q6 ? 18 : 17; }
// The most steps a super-block of either kind (scratch sized for both).
constexpr int kWgMaxSbSteps = 18;
// Halves of the tiles of n_pad tokens of cols values.
__host__ __device__ constexpr int64_t wg_tiles_halves(int64_t cols, int n_pad, bool q6) { return cols / 256 * wg_sb_steps(q6) * 16 * n_pad; }
// Where value k of token n goes in them, in halves. The conversion kernel (wgmma_b_run) writes, for super-block sb,
// k16 step 8h + 4p + u and k half kb, one 16-byte run per token whose slot 2t + j holds k = 256 sb +
// RowBlock<T>::x_offset(h, p, u, t) + kb + 2j; the bits of k % 256 are then, high to low, h t1 p t0 u1 u0 j kb
// for Q4_K and h t1 t0 p u1 u0 j kb for Q6_K. So k and k + 2 (k % 4 < 2) are neighbours in one run.
__device__ __forceinline__ int64_t wg_tile_index(const WgTiles& tiles, int64_t k, int n) {
  const int kin = (int)(k & 255), h = kin >> 7, u = (kin >> 2) & 3, j = (kin >> 1) & 1, kb = kin & 1;
  const int p = tiles.q6 ? (kin >> 4) & 1 : (kin >> 5) & 1;
  const int t = tiles.q6 ? (kin >> 5) & 3 : 2 * ((kin >> 6) & 1) + ((kin >> 4) & 1);
  const int64_t run = (((k >> 8) * wg_sb_steps(tiles.q6) + 8 * h + 4 * p + u) * 2 + kb) * tiles.n_pad + n;
  return run * 8 + 2 * t + j;
}
// A sub-block's sum (token n, values k.. k + 31 for Q4_K, k.. k + 15 for Q6_K; k the sub-block's first) into the sums'
// step: f16 and its remainder.
__device__ __forceinline__ void wg_sum_store(const WgTiles& tiles, int64_t k, int n, float sum) {
  const int j = tiles.q6 ? (int)((k & 255) >> 4) : (int)((k & 255) >> 5);
  const int64_t run = ((k >> 8) * wg_sb_steps(tiles.q6) + 16 + j / 8) * 2 * (int64_t)tiles.n_pad + n;
  const __half hi = saturated_half(sum);
  tiles.out[run * 8 + j % 8] = hi;
  tiles.out[(run + tiles.n_pad) * 8 + j % 8] = saturated_half(sum - __half2float(hi));
}
// The sum of a sub-block's f16 values, in one order for every writer of the tiles (so the sums have one set of bits):
// each quad of consecutive values ((a + b) + c) + d, then the quads pairwise: Q6_K's four (q0 + q1) + (q2 + q3), Q4_K's
// eight ((q0 + q1) + (q2 + q3)) + ((q4 + q5) + (q6 + q7)), the sum of two Q6_K sums. wg_quartet_sum / wg_octet_sum: the
// quads held by four (eight) aligned consecutive lanes (quad q in lane 4 g + q, 8 g + q); the sum lands in all of them.
__device__ __forceinline__ float wg_quad_sum(float a, float b, float c, float d) { return ((a + b) + c) + d; }
__device__ __forceinline__ float wg_quartet_sum(float q) {
  q += __shfl_xor_sync(0xffffffffu, q, 1);
  q += __shfl_xor_sync(0xffffffffu, q, 2);
  return q;
}
__device__ __forceinline__ float wg_octet_sum(float q) {
  q = wg_quartet_sum(q);
  q += __shfl_xor_sync(0xffffffffu, q, 4);
  return q;
}
// Values k..k + 3 of token n (k % 4 == 0) into the tiles, saturated: two half pairs (k, k + 2 and k + 1, k + 3); the
// sub-block sums (of the values before any division by 16) for Q6_K tiles and folded Q4_K tiles. Called by whole warps
// whose lanes hold consecutive quads of a token's values (lane l values k0 + 4 l.., k0 % 128 == 0), so that four (eight)
// aligned lanes hold a Q6_K (Q4_K) sub-block.
__device__ __forceinline__ void wg_tiles_store4(const WgTiles& tiles, int64_t k, int n, float4 v) {
  __half x = saturated_half(v.x), y = saturated_half(v.y), z = saturated_half(v.z), w = saturated_half(v.w);
  const bool q4_sums = !tiles.q6 && tiles.folded, q6_sums = tiles.q6 || tiles.out_q6;
  float sum16 = 0.0f, sum32 = 0.0f;
  if (q4_sums || q6_sums) {
    sum16 = wg_quartet_sum(wg_quad_sum(__half2float(x), __half2float(y), __half2float(z), __half2float(w)));
    sum32 = sum16 + __shfl_xor_sync(0xffffffffu, sum16, 4);
  }
  if (tiles.out_q6) {
    const WgTiles q6{tiles.out_q6, tiles.n_pad, true, false};
    *reinterpret_cast<__half2*>(q6.out + wg_tile_index(q6, k, n)) = __halves2half2(x, z);
    *reinterpret_cast<__half2*>(q6.out + wg_tile_index(q6, k + 1, n)) = __halves2half2(y, w);
    if ((k & 15) == 0) wg_sum_store(q6, k, n, sum16);
  }
  if (q4_sums && (k & 32)) x = wg_sixteenth(x), y = wg_sixteenth(y), z = wg_sixteenth(z), w = wg_sixteenth(w);
  *reinterpret_cast<__half2*>(tiles.out + wg_tile_index(tiles, k, n)) = __halves2half2(x, z);
  *reinterpret_cast<__half2*>(tiles.out + wg_tile_index(tiles, k + 1, n)) = __halves2half2(y, w);
  if (tiles.q6 ? (k & 15) == 0 : (k & 31) == 0) wg_sum_store(tiles, k, n, tiles.q6 ? sum16 : sum32);
}
// Value k of token n into the tiles; the sub-block sums for Q6_K tiles and folded Q4_K tiles. Called by whole warps
// whose lane l holds value k0 + l (k0 % 32 == 0): a Q4_K sub-block (two Q6_K ones) a warp.
__device__ __forceinline__ void wg_tiles_store1(const WgTiles& tiles, int64_t k, int n, float v) {
  const __half x = saturated_half(v);
  const int lane = threadIdx.x % 32;
  const bool q4_sums = !tiles.q6 && tiles.folded, q6_sums = tiles.q6 || tiles.out_q6;
  float sum16 = 0.0f, sum32 = 0.0f;  // lane 0: values k0.., lane 4 (sum16): k0 + 16..
  if (q4_sums || q6_sums) {
    const float f = __half2float(x);
    const float b = __shfl_down_sync(0xffffffffu, f, 1), c = __shfl_down_sync(0xffffffffu, f, 2), d = __shfl_down_sync(0xffffffffu, f, 3);
    const float quad = __shfl_sync(0xffffffffu, wg_quad_sum(f, b, c, d), 4 * (lane % 8));  // lanes 0-7: quads 0-7
    sum16 = wg_quartet_sum(quad);
    sum32 = sum16 + __shfl_xor_sync(0xffffffffu, sum16, 4);
  }
  // Lanes 0 and 4 store the Q6_K sums of values k0.. and k0 + 16.. (lane 4 holds k0 + 4: its sub-block starts 12 on).
  const bool q6_lane = lane == 0 || lane == 4;
  const int64_t k16 = lane == 4 ? k + 12 : k;
  if (tiles.out_q6) {
    const WgTiles q6{tiles.out_q6, tiles.n_pad, true, false};
    q6.out[wg_tile_index(q6, k, n)] = x;
    if (q6_lane) wg_sum_store(q6, k16, n, sum16);
  }
  tiles.out[wg_tile_index(tiles, k, n)] = q4_sums && (k & 32) ? wg_sixteenth(x) : x;
  if (tiles.q6 ? q6_lane : lane == 0) wg_sum_store(tiles, tiles.q6 ? k16 : k, n, tiles.q6 ? sum16 : sum32);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Sum over the CTA in a fixed order (result valid in every thread; smem: 32 floats).
__device__ __forceinline__ float block_sum(float v, float* smem) {
  v = warp_sum(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  float total = 0;
  for (int i = 0; i < (int)(blockDim.x / 32); ++i) total += smem[i];
  __syncthreads();
  return total;
}

// A thread's share of a row's sum of squares, float4 i of the row: the order the decode norms take
// (rms_norm_wide_kernel, and the MoE router that norms its own input): thread j sums i = j, j + blockDim.x, ..
// in turn, then block_sum; rsqrtf(sum / n + eps) is the row's scale.
__device__ __forceinline__ float add_squares(float ss, float4 v) { return ss + (v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w); }

// The warp quantizes the 32 values it holds (lane k holds value k) to int8 with d = amax/127 and writes
// q, d and s = d * sum(q). Only called for whole groups of 32.
__device__ __forceinline__ void warp_quantize32(float v, int lane, int8_t* q, float* d_out, float* s_out) {
  const float amax = warp_max(fabsf(v));
  const float d = amax / 127.0f, inv = d > 0 ? 1.0f / d : 0.0f;
  const int qi = __float2int_rn(v * inv);
  q[lane] = (int8_t)qi;
  int sum = qi;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (lane == 0) {
    *d_out = d;
    *s_out = d * (float)sum;
  }
}

// How a weight is stored on the device. Raw: GGUF blocks as in the file. The plane layouts split a
// type into aligned planes (backend/device_planes.h says which and their bytes; cuda_weights.cu makes them).
enum class WeightLayout : int {
  Raw = 0,
  Q8_0Planes = 1,
  Q6KPlanes = 2,
  Q4_0Planes = 3,  // Q4_0 and IQ4_NL
  Q3KPlanes = 4,
  Q2KPlanes = 5,
  Q4_1Planes = 6,
  Q5_0Planes = 7,
  Q5_1Planes = 8
};

struct DeviceWeight {
  DType type = DType::F32;
  WeightLayout layout = WeightLayout::Raw;
  int64_t rows = 0, cols = 0;
  size_t row_bytes = 0;          // Raw: bytes of one GGUF row
  // Raw: the file's blocks; the plane layouts: their planes in device_planes.h's order (cuda_matvec_blocks.cuh reads them).
  const uint8_t* data = nullptr;
  const uint8_t* plane1 = nullptr;
  const uint8_t* plane2 = nullptr;
  const uint8_t* plane3 = nullptr;
  // An f16 copy of the whole matrix ([rows x cols], the values the prompt path's dequantization gives), kept
  // where memory allows (CudaBackend::keep_f16_copies): prompt products multiply it instead of dequantizing.
  const __half* f16 = nullptr;
  // Raw Q4_K: a 2-D tensor map of the rows (q4k_rows_map, cuda_weights.cuh) in device memory, boxes of 16 rows x one
  // super-block; Q6_K planes: three, of its planes (q6k_plane_maps). The warpgroup kernel's TMA weights copy a warp's
  // rows through them (null: none; a row slice has none).
  const void* tmap = nullptr;
};

// Activations of a matrix product in int8 form: per 32 elements a float scale d and s = d * sum(q).
// With row_factor set, q/d/s hold x * w, the input of an rms norm before its 1/rms factor (a decode
// product's epilogue wrote them, MatvecEpilogue::Kind::Norm, while x was still being summed over the grid,
// and the grid's last block put each token row's 1/rms in row_factor): a product multiplies each output
// of token row t by row_factor[t]. Scaling before or after the quantization gives the same int8 values
// (d = amax/127 scales with x).
struct ActQ8 {
  const int8_t* q = nullptr;           // [rows x cols]
  const float* d = nullptr;            // [rows x cols/32]
  const float* s = nullptr;            // [rows x cols/32]
  const float* row_factor = nullptr;   // [rows], or null: q/d/s are the input itself
};

// enqueue()'s launches on `stream` captured into an instantiated CUDA graph (the caller destroys it). A
// throw from enqueue ends the capture and drops the partial graph before it goes on.
template <typename Enqueue>
cudaGraphExec_t capture_graph(cudaStream_t stream, Enqueue&& enqueue) {
  cudaGraph_t g = nullptr;
  ROOFLINE_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  try {
    enqueue();
  } catch (...) {
    cudaStreamEndCapture(stream, &g);
    if (g) cudaGraphDestroy(g);
    throw;
  }
  ROOFLINE_CUDA_CHECK(cudaStreamEndCapture(stream, &g));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t err = cudaGraphInstantiate(&exec, g, 0);
  cudaGraphDestroy(g);
  ROOFLINE_CUDA_CHECK(err);
  return exec;
}

// For test hooks' timing modes: `enqueue` (the launches of one repetition on `stream`) captured `reps`
// times into a CUDA graph, launched once to warm up, then three times under events; the microseconds of
// one repetition.
template <typename Enqueue>
double time_in_graph_us(cudaStream_t stream, int reps, Enqueue&& enqueue) {
  cudaGraphExec_t exec = capture_graph(stream, [&] {
    for (int r = 0; r < reps; ++r) enqueue();
  });
  ROOFLINE_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  cudaEvent_t a, b;
  ROOFLINE_CUDA_CHECK(cudaEventCreate(&a));
  ROOFLINE_CUDA_CHECK(cudaEventCreate(&b));
  ROOFLINE_CUDA_CHECK(cudaEventRecord(a, stream));
  for (int i = 0; i < 3; ++i) ROOFLINE_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  ROOFLINE_CUDA_CHECK(cudaEventRecord(b, stream));
  ROOFLINE_CUDA_CHECK(cudaEventSynchronize(b));
  float ms = 0;
  ROOFLINE_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaGraphExecDestroy(exec);
  return ms * 1000.0 / (3.0 * (reps > 0 ? reps : 1));
}

}  // namespace roofline::cuda
