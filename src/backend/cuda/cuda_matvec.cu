// Decode matrix-vector products (1-8 tokens), one launch per group of products sharing an input
// (q/k/v, gate/up: fewer launches per layer). Each warp streams its output rows with 16-byte loads.
// Q4_K, Q6_K, Q3_K, Q2_K, Q8_0 and Q4_0 (planes) and IQ4_XS use int8 activations and dp4a, with 1, 2 or 4 rows per warp
// (row_shape; Q4_K two for one token and four for more, with 4 lanes per super-block): the activations, loaded once for the warp's rows,
// are larger than the 4.5-6.5-bit weights, and the L1 rather than DRAM limits these kernels; Q5_K (int8) and F16/BF16/F32 (float
// activations) one row per warp; a generic dequantize-and-FMA kernel for the other types. Each output
// is reduced by one warp in a fixed order, so results do not depend on the batch, on the rows sharing
// a warp, or on timing.
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/cuda_kernels.cuh"
#include "backend/cuda/cuda_matvec_blocks.cuh"

namespace roofline::cuda {

namespace {

constexpr int kWarps = 4;  // rows per CTA

// The kernel behind every matvec launch: a group of products that share the input (q/k/v, gate/up),
// all of one weight kind, their rows laid end to end over the grid (one warp per row_shape().rows rows).
// Q4K6K: a group of Q4_K and Q6_K products in one launch (matvec_can_join), each warp taking its member's kind.
enum class Kind { Q4K, Q5K, Q6K, Q8_0, Q4_0, IQ4XS, Q3K, Q2K, Q4_1, Q5_0, Q5_1, IQ4NL, F16, BF16, F32, Generic, Q4K6K };

// The 32-value block types (planes, and IQ4_XS): a lane per block; Q3_K and Q2_K planes: likewise, a lane per 32-value
// chunk (as Q6_K, which keeps its own shapes for 2-4 tokens).
constexpr bool block32(Kind k) {
  return k == Kind::Q8_0 || k == Kind::Q4_0 || k == Kind::IQ4XS || k == Kind::Q3K || k == Kind::Q2K || k == Kind::Q4_1 || k == Kind::Q5_0 ||
         k == Kind::Q5_1 || k == Kind::IQ4NL;
}
bool multi_row(Kind k) { return k == Kind::Q6K || block32(k); }
// The block walker's policy of each of those kinds (cuda_matvec_blocks.cuh).
template <Kind K>
struct BlocksOf;
template <> struct BlocksOf<Kind::Q8_0> { using T = Q8_0Blocks; };
template <> struct BlocksOf<Kind::Q4_0> { using T = Q4_0Blocks; };
template <> struct BlocksOf<Kind::IQ4XS> { using T = IQ4XSBlocks; };
template <> struct BlocksOf<Kind::Q3K> { using T = Q3KBlocks; };
template <> struct BlocksOf<Kind::Q2K> { using T = Q2KBlocks; };
template <> struct BlocksOf<Kind::Q4_1> { using T = Q4_1Blocks; };
template <> struct BlocksOf<Kind::Q5_0> { using T = Q5_0Blocks; };
template <> struct BlocksOf<Kind::Q5_1> { using T = Q5_1Blocks; };
template <> struct BlocksOf<Kind::IQ4NL> { using T = IQ4NLBlocks; };
template <Kind K>
using Blocks = typename BlocksOf<K>::T;
// Rows per warp (R) and super-blocks (Q8_0: blocks) in flight per lane group (S) of Q6_K and Q8_0. 2-4 tokens: four rows (the activations are the larger part of the L1 traffic); 5-8: two (four
// would spill). One token: one row (Q6_K: one_token_rows), with two super-blocks in flight per lane group where a row is one
// or two whole rounds of eight (the four lane groups x 2; ROOFLINE_MATVEC_SB2_ROUNDS raises the limit),
// else one. Measured on the H200 (tg128): qwen3-8b (rows of 16 and 48 super-blocks) R1/S1 everywhere
// 299.5, S2 on the 16-super-block rows 304.7, also on the 48 309.1, R2/S2 297.1, R4/S1 235.0;
// qwen3-32b (20, 32, 100) R1/S1 101.1, S2 on the 32-super-block rows 98.4, R2/S2 101.3, R4/S1 81.9.
// ROOFLINE_MATVEC_ROWS1 (1, 2, 4) and ROOFLINE_MATVEC_SB1 (1, 2) override the one-token choice
// (all read once).
struct RowShape {
  int rows = 1, sbs = 1;
  bool forced_rows = false;  // set by ROOFLINE_MATVEC_ROWS1: one_token_rows leaves it
};
// Q4_K (4 lanes per super-block) takes two rows per warp for one token (four for 2-8 tokens: q4k_warp_rows): they
// share each activation load, which the L1 limits (ncu, qwen3-32b gate+up with one row per warp: 2.6 TB/s with the
// L1 at 91%). Measured on the H200 (tg128, one run): qwen3-32b 115.2 against 114.0 with one row per warp
// where two would leave fewer warps than fit the GPU, qwen3-8b 348.7 / 341.8, qwen3.5-27b 138.7 / 136.4.
RowShape row_shape(Kind k, int n_tokens, int64_t cols) {
  if (k == Kind::Q4K) return {2, 1};
  if (!multi_row(k)) return {};
  if (n_tokens > 4) return {2, 1};
  if (n_tokens > 1) return {4, block32(k) ? 1 : 2};
  static const RowShape forced = [] {
    const char* r = std::getenv("ROOFLINE_MATVEC_ROWS1");
    const char* sb = std::getenv("ROOFLINE_MATVEC_SB1");
    RowShape shape{r ? std::atoi(r) : 0, sb ? std::atoi(sb) : 0};
    if (shape.rows != 1 && shape.rows != 2 && shape.rows != 4) shape.rows = 0;
    if (shape.sbs != 1 && shape.sbs != 2) shape.sbs = 0;
    return shape;
  }();
  static const int64_t max_rounds = [] {
    const char* env = std::getenv("ROOFLINE_MATVEC_SB2_ROUNDS");
    return env ? std::max<int64_t>(0, std::atoll(env)) : 2;
  }();
  const int64_t per_round = block32(k) ? 64 * 32 : 8 * 256;  // values a warp's lanes take in one round of S = 2
  RowShape shape{1, cols % per_round == 0 && cols / per_round <= max_rounds ? 2 : 1};
  if (forced.rows) shape.rows = forced.rows;
  shape.forced_rows = forced.rows != 0;
  if (forced.sbs) shape.sbs = forced.sbs;
  return shape;
}

// Counts lane 0's warp in at `counter` and returns the count before it. The add is a release (lane 0
// made every store of its warp's rows: store_rows) and an acquire (the last arrival sees every other
// warp's stores), without the sequentially consistent fence that __threadfence() is.
__device__ __forceinline__ int arrive(int* counter) {
  int before;
  asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], 1;" : "=r"(before) : "l"(counter) : "memory");
  return before;
}

// MatvecEpilogue: the warp that stored the last rows of its 32-row block forms that block of the next
// product's input for each token row. The stores of the other warps (other SMs) are read from the L2
// after the counter says they are all in. Norm: the last block of the grid then sums each token row's
// blocks into the row's 1/rms (in the order the separate norm's factor was summed in before: lane, then a
// butterfly). Inlined into the one-token kernels; called (finish_block_call) from the others, whose
// registers it would otherwise raise into spills (the two- to five-token Q4_K kernels).
__device__ __forceinline__ void finish_block(MatvecEpilogue::Kind kind, const float* norm_w, int8_t* q, float* d, float* s, float* ssq,
                                          float* row_factor, float eps, int* counters, int* grid_counter, const float* y0, int ldy0,
                                          const float* y1, int ldy1, int64_t row0, int64_t rows, int expected, int n_tokens, int lane) {
  using EK = MatvecEpilogue::Kind;
  const int64_t blk = row0 / 32, nb = rows / 32;
  int arrived = 0;
  if (lane == 0) arrived = arrive(counters + blk);
  arrived = __shfl_sync(0xffffffffu, arrived, 0);
  if (arrived != expected - 1) return;
  __syncwarp();
  __threadfence();  // the other lanes' reads after lane 0's acquire (one warp in 16-32 gets here)
  const int64_t i = blk * 32 + lane;
  for (int t = 0; t < n_tokens; ++t) {
    float v;
    if (kind == EK::Norm) {
      const float xv = __ldcg(y0 + (int64_t)t * ldy0 + i);
      v = xv * norm_w[i];
      const float ss = warp_sum(xv * xv);
      if (lane == 0) ssq[t * nb + blk] = ss;
    } else {
      // The formulas of gated_product_kernel (cuda_ops.cu), so the same bits as the separate kernels.
      const float a = __ldcg(y0 + (int64_t)t * ldy0 + i), u = __ldcg(y1 + (int64_t)t * ldy1 + i);
      if (kind == EK::GeGlu) v = 0.5f * a * (1.0f + tanhf(0.7978845608f * (a + 0.044715f * a * a * a))) * u;
      else v = a / (1.0f + __expf(-a)) * u;
    }
    const int64_t gi = t * nb + blk;
    warp_quantize32(v, lane, q + gi * 32, d + gi, s + gi);
  }
  if (lane == 0) counters[blk] = 0;
  if (kind != EK::Norm) return;
  int done = 0;
  if (lane == 0) done = arrive(grid_counter);
  done = __shfl_sync(0xffffffffu, done, 0);
  if (done != nb - 1) return;
  __syncwarp();
  __threadfence();
  for (int t = 0; t < n_tokens; ++t) {
    float sum = 0.0f;
    for (int64_t b = lane; b < nb; b += 32) sum += __ldcg(ssq + t * nb + b);
    const float factor = rsqrtf(warp_sum(sum) / (float)rows + eps);
    if (lane == 0) row_factor[t] = factor;
  }
  if (lane == 0) *grid_counter = 0;
}
__device__ __noinline__ void finish_block_call(MatvecEpilogue::Kind kind, const float* norm_w, int8_t* q, float* d, float* s, float* ssq,
                                               float* row_factor, float eps, int* counters, int* grid_counter, const float* y0, int ldy0,
                                               const float* y1, int ldy1, int64_t row0, int64_t rows, int expected, int n_tokens, int lane) {
  finish_block(kind, norm_w, q, d, s, ssq, row_factor, eps, counters, grid_counter, y0, ldy0, y1, ldy1, row0, rows, expected, n_tokens, lane);
}

// The register budget of a kernel: a minimum of CTAs a SM for its launch bounds (0: none given). With an
// explicit minimum of one, ptxas gives the one-token kernels the registers it otherwise holds back (Q4_K two
// rows a warp: 93 instead of 72) and schedules more of a round's loads at once: measured on an H200 qwen3-32b
// tg64 +6-7%, gemma3-27b +8%, qwen3.5-27b +5.6% (docs/performance.md, twenty-seventh session). The kernels of
// 2-8 tokens keep ptxas's own budget (a minimum of 3-4 CTAs a SM spilled and lost up to 10% at 6-8 tokens).
template <int B>
constexpr int matvec_min_ctas() { return B == 1 ? 1 : 0; }
// F: compiled for the decode epilogues (MatvecEpilogue, and inputs that carry a norm's factor); the
// kernels without them are the products as they were, register for register.
template <int B, Kind K, int R, int S, bool F>
__global__ void __launch_bounds__(kWarps * 32, matvec_min_ctas<B>()) matvec_kernel(MatvecGroup g, ActQ8 act, const float* x, bool accumulate, MatvecEpilogue ep) {
  const int lane = threadIdx.x % 32;
  const int64_t unit = (int64_t)blockIdx.x * kWarps + threadIdx.x / 32;
  const bool live = unit < g.first_unit[g.n];
  // The member, picked with selects as matvec_member does, written out here: the warp kernels' code as measured
  // (the helper's struct gives some of them other register counts).
  DeviceWeight w = g.w[0];
  float* y = g.y[0];
  int ldy = g.ldy[0];
  int64_t first = 0;
#pragma unroll
  for (int m = 1; m < MatvecGroup::kMax; ++m)
    if (m < g.n && unit >= g.first_unit[m]) {
      w = g.w[m];
      y = g.y[m];
      ldy = g.ldy[m];
      first = g.first_unit[m];
    }
  const int64_t row = (unit - first) * R;
  wait_for_previous_kernel();
  if (!live) return;
  if constexpr (K == Kind::Q4K) matvec_q4_k<B, R, F, S>(w, act, y, ldy, accumulate, row, lane);
  else if constexpr (K == Kind::Q5K) matvec_q5_k<B, F>(w, act, y, ldy, accumulate, row, lane);
  else if constexpr (K == Kind::Q6K) matvec_q6_k<B, R, S, F>(w, act, y, ldy, accumulate, row, lane);
  else if constexpr (K == Kind::Q4K6K) {
    if (w.type == DType::Q4_K) matvec_q4_k<B, R, F, S>(w, act, y, ldy, accumulate, row, lane);
    else matvec_q6_k<B, R, S, F>(w, act, y, ldy, accumulate, row, lane);
  }
  else if constexpr (block32(K)) matvec_blocks<Blocks<K>, B, R, S, F>(w, act, y, ldy, accumulate, row, lane);
  else if constexpr (K == Kind::F16) matvec_float<B, DType::F16>(w, x, y, ldy, accumulate, row, lane);
  else if constexpr (K == Kind::BF16) matvec_float<B, DType::BF16>(w, x, y, ldy, accumulate, row, lane);
  else if constexpr (K == Kind::F32) matvec_float<B, DType::F32>(w, x, y, ldy, accumulate, row, lane);
  else matvec_generic<B>(w, x, y, ldy, accumulate, row, lane);
  if constexpr (F) {
    if (ep.kind == MatvecEpilogue::Kind::None) return;
    const bool norm = ep.kind == MatvecEpilogue::Kind::Norm;
    int8_t* q = const_cast<int8_t*>(ep.out.q);
    float *d = const_cast<float*>(ep.out.d), *s = const_cast<float*>(ep.out.s), *factor = const_cast<float*>(ep.out.row_factor);
    const float* y0 = norm ? y : g.y[0];
    const int ldy0 = norm ? ldy : g.ldy[0], expected = (norm ? 1 : 2) * (32 / R);
    if constexpr (B == 1)
      finish_block(ep.kind, ep.norm_w, q, d, s, ep.ssq, factor, ep.eps, ep.counters, ep.grid_counter, y0, ldy0, g.y[1], g.ldy[1], row, w.rows,
                   expected, B, lane);
    else
      finish_block_call(ep.kind, ep.norm_w, q, d, s, ep.ssq, factor, ep.eps, ep.counters, ep.grid_counter, y0, ldy0, g.y[1], g.ldy[1], row,
                        w.rows, expected, B, lane);
  }
}

// Whether a product's launch needs the kernels compiled for the epilogues (only the int8 kinds have them).
bool wants_fused(Kind k, const ActQ8& act, const MatvecEpilogue& ep) {
  const bool fused = act.row_factor || ep.kind != MatvecEpilogue::Kind::None;
  if (fused && k != Kind::Q4K && k != Kind::Q5K && k != Kind::Q6K && !block32(k) && k != Kind::Q4K6K)
    fail("internal error: a decode epilogue or a norm's factor on a product of float activations");
  return fused;
}

Kind kind_of(const DeviceWeight& w) {
  switch (w.type) {
    case DType::Q4_K: return Kind::Q4K;
    case DType::Q5_K: return Kind::Q5K;
    case DType::Q6_K: return Kind::Q6K;
    case DType::Q8_0: return Kind::Q8_0;
    case DType::Q4_0: return w.layout == WeightLayout::Q4_0Planes ? Kind::Q4_0 : Kind::Generic;
    case DType::IQ4_NL: return w.layout == WeightLayout::Q4_0Planes ? Kind::IQ4NL : Kind::Generic;
    case DType::Q4_1: return w.layout == WeightLayout::Q4_1Planes ? Kind::Q4_1 : Kind::Generic;
    case DType::Q5_0: return w.layout == WeightLayout::Q5_0Planes ? Kind::Q5_0 : Kind::Generic;
    case DType::Q5_1: return w.layout == WeightLayout::Q5_1Planes ? Kind::Q5_1 : Kind::Generic;
    case DType::IQ4_XS: return Kind::IQ4XS;
    case DType::Q3_K: return w.layout == WeightLayout::Q3KPlanes ? Kind::Q3K : Kind::Generic;
    case DType::Q2_K: return w.layout == WeightLayout::Q2KPlanes ? Kind::Q2K : Kind::Generic;
    case DType::F16: return Kind::F16;
    case DType::BF16: return Kind::BF16;
    case DType::F32: return Kind::F32;
    default: return Kind::Generic;
  }
}

template <int B, Kind K, int R, int S>
void launch_one(const MatvecGroup& g, const ActQ8& act, const float* x, bool accumulate, const MatvecEpilogue& ep, cudaStream_t stream) {
  const dim3 grid((unsigned)((g.first_unit[g.n] + kWarps - 1) / kWarps)), block(kWarps * 32);
  if constexpr (K == Kind::Q4K || K == Kind::Q5K || K == Kind::Q6K || block32(K) || K == Kind::Q4K6K) {
    if (wants_fused(K, act, ep))
      return launch(matvec_kernel<B, K, R, S, true>, grid, block, 0, stream, pdl_enabled(), g, act, x, accumulate, ep);
  } else {
    wants_fused(K, act, ep);
  }
  launch(matvec_kernel<B, K, R, S, false>, grid, block, 0, stream, pdl_enabled(), g, act, x, accumulate, ep);
}

template <int B, Kind K>
void launch_multi_row(const MatvecGroup& g, RowShape shape, const ActQ8& act, const float* x, bool accumulate, const MatvecEpilogue& ep,
                      cudaStream_t stream) {
  if constexpr (B == 1) {
    const int key = shape.rows * 10 + shape.sbs;
    switch (key) {
      case 11: return launch_one<B, K, 1, 1>(g, act, x, accumulate, ep, stream);
      case 12: return launch_one<B, K, 1, 2>(g, act, x, accumulate, ep, stream);
      case 21: return launch_one<B, K, 2, 1>(g, act, x, accumulate, ep, stream);
      case 22: return launch_one<B, K, 2, 2>(g, act, x, accumulate, ep, stream);
      case 41: return launch_one<B, K, 4, 1>(g, act, x, accumulate, ep, stream);
      default: return launch_one<B, K, 4, 2>(g, act, x, accumulate, ep, stream);
    }
  } else if constexpr (B > 4) {
    launch_one<B, K, 2, 1>(g, act, x, accumulate, ep, stream);
  } else if constexpr (block32(K)) {
    launch_one<B, K, 4, 1>(g, act, x, accumulate, ep, stream);
  } else {
    launch_one<B, K, 4, 2>(g, act, x, accumulate, ep, stream);
  }
}

// One-token Q4_K products (and Q4_K/Q6_K groups) pipelined (matvec_pipelined): the next round's loads are
// issued before this round's arithmetic (S = 2 for these kinds: matvec_q4_k's P, and two Q6_K super-blocks in
// flight): the same bits, 121 registers instead of 72 (4 CTAs a SM instead of 7 on an H200). Measured there
// (tg128, docs/performance.md): for every launch, qwen3-8b +3% (411.3 / 414.3 against 399.2 / 401.2),
// qwen3-32b -1.2%, qwen3.5-27b -1.5%; capped at 96 registers (spills) all three lost; for rows of up to 16
// super-blocks only, qwen3-8b level. So the rule: a launch whose CTAs all fit on the GPU at once at the
// pipelined kernel's occupancy (wave_ctas), where the lower occupancy costs no second wave
// (qwen3-8b's o and Q4_K down): qwen3-8b 410.8 / 410.3 / 402.6 against 397.5 three times, qwen3-32b (no
// launch that small) level. ROOFLINE_MATVEC_PIPE=N instead pipelines every launch of rows of up to N
// super-blocks (0: never).
int64_t matvec_pipe_for_test = -1;  // gpu_set_matvec_pipe_for_test: -1 the environment's
// -1: the default rule.
int64_t matvec_pipe_max_sb() {
  static const int64_t v = [] {
    const char* e = std::getenv("ROOFLINE_MATVEC_PIPE");
    return e ? std::max<int64_t>(0, std::atoll(e)) : -1;
  }();
  return matvec_pipe_for_test >= 0 ? matvec_pipe_for_test : v;
}

// The CTAs of one wave of a one-token kernel on the current device: its occupancy (read once per device) times the SMs.
template <Kind K, int R, int S>
int64_t wave_ctas() {
  static int64_t waves[64] = {};
  int dev = 0;
  ROOFLINE_CUDA_CHECK(cudaGetDevice(&dev));
  int64_t& w = waves[dev & 63];
  if (w == 0) {
    int occ = 0;
    ROOFLINE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, matvec_kernel<1, K, R, S, false>, kWarps * 32, 0));
    w = std::max<int64_t>(1, (int64_t)occ * sm_count());
  }
  return w;
}
}  // namespace

void matvec_query_waves() {
  wave_ctas<Kind::Q4K, 2, 2>();
  wave_ctas<Kind::Q4K, 2, 1>();
  wave_ctas<Kind::Q4K, 4, 1>();
  wave_ctas<Kind::Q4K6K, 2, 1>();
  wave_ctas<Kind::Q4K6K, 4, 1>();
  wave_ctas<Kind::Q6K, 1, 1>();
}

namespace {

// Rows per warp of the Q4_K (and Q4_K/Q6_K group) products of 2-8 tokens: four, so that each activation load
// serves four rows (the L1 traffic of these products is mostly activations, and grows with the tokens);
// the same bits as two (a row's sum does not depend on the rows sharing its warp). Measured on an H200
// (-p 128 -n 32 -npl 2,4,8, generated tok/s, docs/performance.md): qwen3-8b 620 / 895 / 1128 -> 690-705 /
// 1013-1069 / 1434-1499, qwen3-32b 201 / 261 / 317 -> 226-231 / 296-300 / 398-402; eight rows (up to 4
// tokens) lost 8-17%, and so did four rows for one token (tg32 -5%) and for Q6_K / Q8_0 at 5-8 tokens
// (-8-10%). ROOFLINE_MATVEC_Q4K_ROWS=2 takes two. One token: one_token_rows.
int q4k_rows_for_test = 0;  // gpu_set_matvec_q4k_rows_for_test: 0 the environment's
int q4k_warp_rows(int n_tokens) {
  static const int few = [] {
    const char* e = std::getenv("ROOFLINE_MATVEC_Q4K_ROWS");
    return e && std::atoi(e) == 2 ? 2 : 4;
  }();
  if (n_tokens == 1) return 2;
  return q4k_rows_for_test ? q4k_rows_for_test : few;
}

// Rows a warp of one-token products by the waves of CTAs their launch needs. A launch of little more than one
// wave runs a second, nearly empty one (each warp's rounds of loads are a memory latency each, so a wave costs
// about as much full as nearly empty); more rows a warp fit it in one, and put as many bytes in flight per SM.
// - Q6_K (rounds of one super-block a lane group): two rows where one-row CTAs would need more than one wave.
// - Q4_K and Q4_K/Q6_K groups: four rows where two-row CTAs would need more than one wave and four-row ones fit in one.
// Measured on an H200 (tg64, two rounds alternated, docs/performance.md, twenty-eighth session), against one Q6_K
// row and two Q4_K rows everywhere: qwen3-32b 139.9 / 140.1 -> 146.7 / 146.1 (its 5120-row Q6_K down: 1.08 waves of
// one-row CTAs at 51 registers, one of two-row ones at 80), qwen3.5-27b 157.1 / 157.2 -> 162.5 / 162.0, gemma3-27b
// 150.4 / 150.1 -> 158.5 / 159.9 (of which the Q4_K rule, for its o, q/k/v and Q4_K down at 1.02-1.55 waves: 155.0 /
// 154.6 -> 158.5 / 159.9), qwen3-8b 437.3 / 438.2 -> 440.1 / 443.1, qwen3-30b-a3b level. Four Q4_K rows for every
// launch lost 3% on qwen3-32b and qwen3.5-27b, four Q6_K rows 1-3%.
// ROOFLINE_MATVEC_ROWS1 (Q6_K and the 32-value kinds) and ROOFLINE_MATVEC_Q4K_ROWS1 (2 or 4) override the rule.
int one_token_q4k_rows_for_test = 0, one_token_q6k_rows_for_test = 0;  // gpu_set_matvec_one_token_rows_for_test
int64_t ctas_at(int64_t rows, int rows_per_warp) { return (rows + (int64_t)rows_per_warp * kWarps - 1) / ((int64_t)rows_per_warp * kWarps); }
void one_token_rows(Kind kind, int64_t rows, RowShape& shape) {
  if (kind == Kind::Q6K && !shape.forced_rows) {
    if (one_token_q6k_rows_for_test) shape.rows = one_token_q6k_rows_for_test;
    else if (shape.sbs == 1) shape.rows = ctas_at(rows, 1) > wave_ctas<Kind::Q6K, 1, 1>() ? 2 : 1;
  }
  if (kind != Kind::Q4K && kind != Kind::Q4K6K) return;
  static const int forced = [] {
    const char* e = std::getenv("ROOFLINE_MATVEC_Q4K_ROWS1");
    const int r = e ? std::atoi(e) : 0;
    return r == 2 || r == 4 ? r : 0;
  }();
  if (one_token_q4k_rows_for_test || forced) {
    shape.rows = one_token_q4k_rows_for_test ? one_token_q4k_rows_for_test : forced;
    return;
  }
  const bool q4k = kind == Kind::Q4K;
  const int64_t wave2 = q4k ? wave_ctas<Kind::Q4K, 2, 1>() : wave_ctas<Kind::Q4K6K, 2, 1>();
  const int64_t wave4 = q4k ? wave_ctas<Kind::Q4K, 4, 1>() : wave_ctas<Kind::Q4K6K, 4, 1>();
  shape.rows = ctas_at(rows, 2) > wave2 && ctas_at(rows, 4) <= wave4 ? 4 : 2;
}

bool matvec_pipelined(const MatvecGroup& g) {
  const int64_t max_sb = matvec_pipe_max_sb();
  if (max_sb >= 0) return g.w[0].cols / 256 <= max_sb;
  return (g.first_unit[g.n] + kWarps - 1) / kWarps <= wave_ctas<Kind::Q4K, 2, 2>();
}

template <int B>
void launch_matvec(const MatvecGroup& g, Kind kind, RowShape shape, const ActQ8& act, const float* x, bool accumulate, const MatvecEpilogue& ep,
                   cudaStream_t stream) {
  const bool q4k = kind == Kind::Q4K || kind == Kind::Q4K6K;
  if constexpr (B == 1) {
    if (q4k && shape.rows == 4) {
      if (kind == Kind::Q4K) return launch_one<B, Kind::Q4K, 4, 1>(g, act, x, accumulate, ep, stream);
      return launch_one<B, Kind::Q4K6K, 4, 1>(g, act, x, accumulate, ep, stream);
    }
    if (q4k && matvec_pipelined(g)) {
      if (kind == Kind::Q4K) return launch_one<B, Kind::Q4K, 2, 2>(g, act, x, accumulate, ep, stream);
      return launch_one<B, Kind::Q4K6K, 2, 2>(g, act, x, accumulate, ep, stream);
    }
  } else if (q4k && shape.rows == 4) {
    if (kind == Kind::Q4K) return launch_one<B, Kind::Q4K, 4, 1>(g, act, x, accumulate, ep, stream);
    return launch_one<B, Kind::Q4K6K, 4, 1>(g, act, x, accumulate, ep, stream);
  }
  switch (kind) {
    case Kind::Q4K: return launch_one<B, Kind::Q4K, 2, 1>(g, act, x, accumulate, ep, stream);
    case Kind::Q6K: return launch_multi_row<B, Kind::Q6K>(g, shape, act, x, accumulate, ep, stream);
    case Kind::Q8_0: return launch_multi_row<B, Kind::Q8_0>(g, shape, act, x, accumulate, ep, stream);
    case Kind::Q4_0: return launch_multi_row<B, Kind::Q4_0>(g, shape, act, x, accumulate, ep, stream);
    case Kind::IQ4XS: return launch_multi_row<B, Kind::IQ4XS>(g, shape, act, x, accumulate, ep, stream);
    case Kind::Q3K: return launch_multi_row<B, Kind::Q3K>(g, shape, act, x, accumulate, ep, stream);
    case Kind::Q2K: return launch_multi_row<B, Kind::Q2K>(g, shape, act, x, accumulate, ep, stream);
    case Kind::Q4_1: return launch_multi_row<B, Kind::Q4_1>(g, shape, act, x, accumulate, ep, stream);
    case Kind::Q5_0: return launch_multi_row<B, Kind::Q5_0>(g, shape, act, x, accumulate, ep, stream);
    case Kind::Q5_1: return launch_multi_row<B, Kind::Q5_1>(g, shape, act, x, accumulate, ep, stream);
    case Kind::IQ4NL: return launch_multi_row<B, Kind::IQ4NL>(g, shape, act, x, accumulate, ep, stream);
    case Kind::Q5K: return launch_one<B, Kind::Q5K, 1, 1>(g, act, x, accumulate, ep, stream);
    case Kind::F16: return launch_one<B, Kind::F16, 1, 1>(g, act, x, accumulate, ep, stream);
    case Kind::BF16: return launch_one<B, Kind::BF16, 1, 1>(g, act, x, accumulate, ep, stream);
    case Kind::F32: return launch_one<B, Kind::F32, 1, 1>(g, act, x, accumulate, ep, stream);
    case Kind::Generic: return launch_one<B, Kind::Generic, 1, 1>(g, act, x, accumulate, ep, stream);
    case Kind::Q4K6K: return launch_one<B, Kind::Q4K6K, 2, 1>(g, act, x, accumulate, ep, stream);  // two rows per warp, both kinds
  }
}

// --- Expert products grouped by expert (matvec_experts) ---

// B tokens (1-8) of one product through the same device functions as the dense matvec (so an expert's
// output equals the dense product of its slice, whatever tokens share the chunk).
template <int B, Kind K, int R>
__device__ __forceinline__ void product_rows(const DeviceWeight& w, const ActQ8& act, const float* x, float* y, int ldy, int64_t row, int lane) {
  if constexpr (K == Kind::Q4K) matvec_q4_k<B, R>(w, act, y, ldy, false, row, lane);
  else if constexpr (K == Kind::Q5K) matvec_q5_k<B>(w, act, y, ldy, false, row, lane);
  else if constexpr (K == Kind::Q6K) matvec_q6_k<B, R, 1>(w, act, y, ldy, false, row, lane);
  else if constexpr (block32(K)) matvec_blocks<Blocks<K>, B, R, 1>(w, act, y, ldy, false, row, lane);
  else if constexpr (K == Kind::F16) matvec_float<B, DType::F16>(w, x, y, ldy, false, row, lane);
  else if constexpr (K == Kind::BF16) matvec_float<B, DType::BF16>(w, x, y, ldy, false, row, lane);
  else if constexpr (K == Kind::F32) matvec_float<B, DType::F32>(w, x, y, ldy, false, row, lane);
  else matvec_generic<B>(w, x, y, ldy, false, row, lane);
}

// The weight type of kind K, whose layout is then the one the device gives that type (Generic: any, read at run time).
constexpr DType kind_type(Kind k) {
  switch (k) {
    case Kind::Q4K: return DType::Q4_K;
    case Kind::Q5K: return DType::Q5_K;
    case Kind::Q6K: return DType::Q6_K;
    case Kind::Q8_0: return DType::Q8_0;
    case Kind::Q4_0: return DType::Q4_0;
    case Kind::IQ4XS: return DType::IQ4_XS;
    case Kind::Q3K: return DType::Q3_K;
    case Kind::Q2K: return DType::Q2_K;
    case Kind::Q4_1: return DType::Q4_1;
    case Kind::Q5_0: return DType::Q5_0;
    case Kind::Q5_1: return DType::Q5_1;
    case Kind::IQ4NL: return DType::IQ4_NL;
    case Kind::F16: return DType::F16;
    case Kind::BF16: return DType::BF16;
    default: return DType::F32;
  }
}
// Expert e's rows of a stacked weight of kind K (expert_view without the layout switch where K fixes the layout).
template <Kind K>
__device__ __forceinline__ DeviceWeight expert_slice(const DeviceWeight& w, int64_t e, int64_t rows) {
  if constexpr (K == Kind::Generic || K == Kind::Q4K6K) return expert_view(w, e, rows);
  else return expert_view_of<kind_type(K)>(w, e, rows);
}

// grid.x: tiles of the expert's rows (R per warp), grid.y: active expert slots, grid.z: CTAs sharing an
// expert's activation rows (chunks of 8 rows taken in turn). Each warp reads its weight rows once per
// chunk (from the L1/L2 after the first).
// With a second weight (w2, y2): grid.x holds both products' tiles, the second's from x_tiles on.
// One: compiled for one activation row per expert slot only (the unsorted pairs of a decode step,
// ExpertGroups::pair_ids), so its registers are those of the one-token product.
template <Kind K, int R, bool One = false>
__global__ void __launch_bounds__(kWarps * 32) expert_matvec_kernel(DeviceWeight w, DeviceWeight w2, int64_t rows_per_expert, ExpertGroups g,
                                                                   ActQ8 act, const float* x, float* y, float* y2, int ldy, int x_tiles) {
  const int lane = threadIdx.x % 32;
  const bool second = (int)blockIdx.x >= x_tiles;
  const int64_t row = ((int64_t)(blockIdx.x - (second ? x_tiles : 0)) * kWarps + threadIdx.x / 32) * R;
  if (second) {
    w = w2;
    y = y2;
  }
  wait_for_previous_kernel();
  if (row >= rows_per_expert) return;
  int e = 0, begin = 0, count = g.single_count, in_begin = 0;
  if (g.pair_ids) {
    e = g.pair_ids[blockIdx.y];
    begin = blockIdx.y;
    count = 1;
    in_begin = begin / g.input_div;
  } else if (g.offsets) {
    e = g.active[blockIdx.y];
    if (e < 0) return;
    begin = in_begin = g.offsets[e];
    count = g.offsets[e + 1] - begin;
  }
  const DeviceWeight we = expert_slice<K>(w, e, rows_per_expert);
  for (int j = (int)blockIdx.z * 8; j < count; j += (int)gridDim.z * 8) {
    const int64_t r0 = begin + j, in0 = in_begin + j;
    ActQ8 a{};
    if (act.q) a = ActQ8{act.q + in0 * w.cols, act.d + in0 * (w.cols / 32), act.s + in0 * (w.cols / 32)};
    const float* xr = x ? x + in0 * w.cols : nullptr;
    float* yr = y + r0 * ldy;
    if constexpr (One) {
      product_rows<1, K, R>(we, a, xr, yr, ldy, row, lane);
      continue;
    }
    switch (min(8, count - j)) {
      case 1: product_rows<1, K, R>(we, a, xr, yr, ldy, row, lane); break;
      case 2: product_rows<2, K, R>(we, a, xr, yr, ldy, row, lane); break;
      case 3: product_rows<3, K, R>(we, a, xr, yr, ldy, row, lane); break;
      case 4: product_rows<4, K, R>(we, a, xr, yr, ldy, row, lane); break;
      case 5: product_rows<5, K, R>(we, a, xr, yr, ldy, row, lane); break;
      case 6: product_rows<6, K, R>(we, a, xr, yr, ldy, row, lane); break;
      case 7: product_rows<7, K, R>(we, a, xr, yr, ldy, row, lane); break;
      default: product_rows<8, K, R>(we, a, xr, yr, ldy, row, lane); break;
    }
  }
}

template <Kind K, int R, bool One = false>
void launch_experts(const DeviceWeight& w, const DeviceWeight* w2, int64_t rows_per_expert, const ExpertGroups& g, const ActQ8& act,
                    const float* x, float* y, float* y2, int ldy, cudaStream_t stream) {
  const int64_t units = (rows_per_expert + R - 1) / R;
  const int x_tiles = (int)((units + kWarps - 1) / kWarps);
  const dim3 grid((unsigned)(w2 ? 2 * x_tiles : x_tiles), (unsigned)(g.offsets || g.pair_ids ? g.max_active : 1),
                  (unsigned)std::max(1, g.chunk_splits));
  launch(expert_matvec_kernel<K, R, One>, grid, dim3(kWarps * 32), 0, stream, pdl_enabled(), w, w2 ? *w2 : w, rows_per_expert, g, act, x, y,
         w2 ? y2 : y, ldy, x_tiles);
}

void experts(const DeviceWeight& stacked, const DeviceWeight* stacked2, int64_t rows_per_expert, const ExpertGroups& groups, const ActQ8& act,
             const float* x, float* y, float* y2, int ldy, cudaStream_t stream) {
  if (groups.offsets || groups.pair_ids ? groups.max_active < 1 || groups.max_active > 65535 : groups.single_count < 1) return;
  if (groups.chunk_splits > 65535) fail("internal error: {} chunk splits in an expert product", groups.chunk_splits);
  if (stacked2 && (kind_of(*stacked2) != kind_of(stacked) || stacked2->cols != stacked.cols))
    fail("internal error: paired expert products over different weight kinds or widths");
  // Decode steps' unsorted pairs: four rows per warp (each warp of these short products is one round of
  // loads, so fewer, wider warps). Measured on the H200 (tg128, two rounds alternated): qwen3-30b-a3b
  // 357.4 / 356.4 against 349.2 / 355.4 with two, qwen3.5-35b-a3b 348.5 / 340.5 against 333.9 / 340.8.
  // ROOFLINE_MOE_PAIR_ROWS=2 keeps two.
  static const int pair_rows = [] {
    const char* env = std::getenv("ROOFLINE_MOE_PAIR_ROWS");
    return env && std::atoi(env) == 2 ? 2 : 4;
  }();
  if (groups.pair_ids && pair_rows == 4) switch (kind_of(stacked)) {
      case Kind::Q4K: return launch_experts<Kind::Q4K, 4, true>(stacked, stacked2, rows_per_expert, groups, act, x, y, y2, ldy, stream);
      case Kind::Q6K: return launch_experts<Kind::Q6K, 4, true>(stacked, stacked2, rows_per_expert, groups, act, x, y, y2, ldy, stream);
      case Kind::Q8_0: return launch_experts<Kind::Q8_0, 4, true>(stacked, stacked2, rows_per_expert, groups, act, x, y, y2, ldy, stream);
      case Kind::Q4_0: return launch_experts<Kind::Q4_0, 4, true>(stacked, stacked2, rows_per_expert, groups, act, x, y, y2, ldy, stream);
      case Kind::IQ4XS: return launch_experts<Kind::IQ4XS, 4, true>(stacked, stacked2, rows_per_expert, groups, act, x, y, y2, ldy, stream);
      case Kind::Q3K: return launch_experts<Kind::Q3K, 4, true>(stacked, stacked2, rows_per_expert, groups, act, x, y, y2, ldy, stream);
      case Kind::Q2K: return launch_experts<Kind::Q2K, 4, true>(stacked, stacked2, rows_per_expert, groups, act, x, y, y2, ldy, stream);
      case Kind::Q4_1: return launch_experts<Kind::Q4_1, 4, true>(stacked, stacked2, rows_per_expert, groups, act, x, y, y2, ldy, stream);
      case Kind::Q5_0: return launch_experts<Kind::Q5_0, 4, true>(stacked, stacked2, rows_per_expert, groups, act, x, y, y2, ldy, stream);
      case Kind::Q5_1: return launch_experts<Kind::Q5_1, 4, true>(stacked, stacked2, rows_per_expert, groups, act, x, y, y2, ldy, stream);
      case Kind::IQ4NL: return launch_experts<Kind::IQ4NL, 4, true>(stacked, stacked2, rows_per_expert, groups, act, x, y, y2, ldy, stream);
      default: break;
    }
  switch (kind_of(stacked)) {
    case Kind::Q4K: return launch_experts<Kind::Q4K, 2>(stacked, stacked2, rows_per_expert, groups, act, x, y, y2, ldy, stream);
    case Kind::Q5K: return launch_experts<Kind::Q5K, 1>(stacked, stacked2, rows_per_expert, groups, act, x, y, y2, ldy, stream);
    case Kind::Q6K: return launch_experts<Kind::Q6K, 2>(stacked, stacked2, rows_per_expert, groups, act, x, y, y2, ldy, stream);
    case Kind::Q8_0: return launch_experts<Kind::Q8_0, 2>(stacked, stacked2, rows_per_expert, groups, act, x, y, y2, ldy, stream);
    case Kind::Q4_0: return launch_experts<Kind::Q4_0, 2>(stacked, stacked2, rows_per_expert, groups, act, x, y, y2, ldy, stream);
    case Kind::IQ4XS: return launch_experts<Kind::IQ4XS, 2>(stacked, stacked2, rows_per_expert, groups, act, x, y, y2, ldy, stream);
    case Kind::Q3K: return launch_experts<Kind::Q3K, 2>(stacked, stacked2, rows_per_expert, groups, act, x, y, y2, ldy, stream);
    case Kind::Q2K: return launch_experts<Kind::Q2K, 2>(stacked, stacked2, rows_per_expert, groups, act, x, y, y2, ldy, stream);
    case Kind::Q4_1: return launch_experts<Kind::Q4_1, 2>(stacked, stacked2, rows_per_expert, groups, act, x, y, y2, ldy, stream);
    case Kind::Q5_0: return launch_experts<Kind::Q5_0, 2>(stacked, stacked2, rows_per_expert, groups, act, x, y, y2, ldy, stream);
    case Kind::Q5_1: return launch_experts<Kind::Q5_1, 2>(stacked, stacked2, rows_per_expert, groups, act, x, y, y2, ldy, stream);
    case Kind::IQ4NL: return launch_experts<Kind::IQ4NL, 2>(stacked, stacked2, rows_per_expert, groups, act, x, y, y2, ldy, stream);
    case Kind::F16: return launch_experts<Kind::F16, 1>(stacked, stacked2, rows_per_expert, groups, act, x, y, y2, ldy, stream);
    case Kind::BF16: return launch_experts<Kind::BF16, 1>(stacked, stacked2, rows_per_expert, groups, act, x, y, y2, ldy, stream);
    case Kind::F32: return launch_experts<Kind::F32, 1>(stacked, stacked2, rows_per_expert, groups, act, x, y, y2, ldy, stream);
    case Kind::Generic: return launch_experts<Kind::Generic, 1>(stacked, stacked2, rows_per_expert, groups, act, x, y, y2, ldy, stream);
  }
}

}  // namespace

void matvec_experts(const DeviceWeight& stacked, int64_t rows_per_expert, const ExpertGroups& groups, const ActQ8& act,
                    const float* x, float* y, int ldy, cudaStream_t stream) {
  experts(stacked, nullptr, rows_per_expert, groups, act, x, y, nullptr, ldy, stream);
}

void matvec_experts_pair(const DeviceWeight& stacked, const DeviceWeight& stacked2, int64_t rows_per_expert, const ExpertGroups& groups,
                         const ActQ8& act, const float* x, float* y, float* y2, int ldy, cudaStream_t stream) {
  experts(stacked, &stacked2, rows_per_expert, groups, act, x, y, y2, ldy, stream);
}

bool matvec_uses_q8(DType type) {
  switch (type) {
    case DType::Q4_K: case DType::Q5_K: case DType::Q6_K: case DType::Q8_0: case DType::Q4_0: case DType::Q4_1: case DType::Q5_0:
    case DType::Q5_1: case DType::IQ4_NL: case DType::IQ4_XS: case DType::Q3_K: case DType::Q2_K:
      return true;
    default:
      return false;
  }
}

bool matvec_can_group(const DeviceWeight& a, const DeviceWeight& b) {
  return kind_of(a) == kind_of(b) && a.cols == b.cols;
}

// Q4_K and Q6_K products of one input in one launch: the Q4_K_M mixes give half the layers a Q6_K v (and
// down) beside Q4_K q and k, and a Q6_K v launched alone after q+k streams at 16-21% of the H200's bandwidth
// in a decode step (3.6-6 us; docs/performance.md, tenth session). Measured in the eleventh: tg128
// qwen3-32b +1.7%, qwen3.5-27b +0.7%, qwen3-8b level. ROOFLINE_MIXED_GROUPS=0 launches them apart.
bool matvec_can_join(const DeviceWeight& a, const DeviceWeight& b) {
  static const bool mixed = env_switch("ROOFLINE_MIXED_GROUPS", true);
  if (matvec_can_group(a, b)) return true;
  const Kind ka = kind_of(a), kb = kind_of(b);
  return mixed && a.cols == b.cols && (ka == Kind::Q4K || ka == Kind::Q6K) && (kb == Kind::Q4K || kb == Kind::Q6K);
}

void matvec_multi(const DeviceWeight* const* ws, float* const* ys, const int* ldys, int count, const ActQ8& act,
                  const float* x, int n_tokens, bool accumulate, cudaStream_t stream, const MatvecEpilogue& epilogue) {
  if (count < 1 || count > MatvecGroup::kMax) fail("internal error: a matvec group of {} products", count);
  using EK = MatvecEpilogue::Kind;
  if (epilogue.kind != EK::None &&
      (!epilogue.counters || !epilogue.out.q || ws[0]->rows % 32 != 0 || (epilogue.kind == EK::Norm ? count != 1 || !epilogue.ssq ||
                                                                                                          !epilogue.out.row_factor || !epilogue.grid_counter
                                                                                                    : count != 2 || ws[1]->rows != ws[0]->rows)))
    fail("internal error: a matvec epilogue over {} products of {} rows", count, ws[0]->rows);
  // 2-8 tokens: the Q4_K members on tensor cores (the same bits), the others of a mixed group by the warp kernels.
  if (epilogue.kind == EK::None && n_tokens >= 2 && n_tokens <= 8) {
    const DeviceWeight* mma_ws[MatvecGroup::kMax];
    const DeviceWeight* rest_ws[MatvecGroup::kMax];
    float* mma_ys[MatvecGroup::kMax];
    float* rest_ys[MatvecGroup::kMax];
    int mma_ldys[MatvecGroup::kMax], rest_ldys[MatvecGroup::kMax];
    int n_mma = 0, n_rest = 0;
    for (int m = 0; m < count; ++m) {
      if (matvec_mma_takes(*ws[m], n_tokens)) {
        mma_ws[n_mma] = ws[m], mma_ys[n_mma] = ys[m], mma_ldys[n_mma++] = ldys[m];
      } else {
        rest_ws[n_rest] = ws[m], rest_ys[n_rest] = ys[m], rest_ldys[n_rest++] = ldys[m];
      }
    }
    if (n_mma > 0) {
      if (n_rest > 0) matvec_multi(rest_ws, rest_ys, rest_ldys, n_rest, act, x, n_tokens, accumulate, stream);
      return matvec_mma_q4k(mma_ws, mma_ys, mma_ldys, n_mma, act, n_tokens, accumulate, stream);
    }
  }
  MatvecGroup g;
  g.n = count;
  g.first_unit[0] = 0;
  // One kind, or Q4_K and Q6_K together (Q4K6K: two rows per warp, one super-block in flight, whatever the kind).
  Kind kind = kind_of(*ws[0]);
  for (int m = 1; m < count; ++m)
    if (kind_of(*ws[m]) != kind) kind = Kind::Q4K6K;
  RowShape shape = kind == Kind::Q4K6K ? RowShape{2, 1} : row_shape(kind, n_tokens, ws[0]->cols);
  if (kind == Kind::Q4K || kind == Kind::Q4K6K) shape.rows = q4k_warp_rows(n_tokens);
  if (n_tokens == 1) {
    int64_t rows = 0;
    for (int m = 0; m < count; ++m) rows += ws[m]->rows;
    one_token_rows(kind, rows, shape);
  }
  const int rows_per_unit = shape.rows;
  for (int m = 0; m < count; ++m) {
    const Kind km = kind_of(*ws[m]);
    if (ws[m]->cols != ws[0]->cols || (kind == Kind::Q4K6K ? km != Kind::Q4K && km != Kind::Q6K : km != kind))
      fail("internal error: grouped matvec over different weight kinds or widths");
    g.w[m] = *ws[m];
    g.y[m] = ys[m];
    g.ldy[m] = ldys[m];
    g.first_unit[m + 1] = g.first_unit[m] + (ws[m]->rows + rows_per_unit - 1) / rows_per_unit;
  }
  switch (n_tokens) {
    case 1:
      launch_matvec<1>(g, kind, shape, act, x, accumulate, epilogue, stream);
      break;
    case 2: launch_matvec<2>(g, kind, shape, act, x, accumulate, epilogue, stream); break;
    case 3: launch_matvec<3>(g, kind, shape, act, x, accumulate, epilogue, stream); break;
    case 4: launch_matvec<4>(g, kind, shape, act, x, accumulate, epilogue, stream); break;
    case 5: launch_matvec<5>(g, kind, shape, act, x, accumulate, epilogue, stream); break;
    case 6: launch_matvec<6>(g, kind, shape, act, x, accumulate, epilogue, stream); break;
    case 7: launch_matvec<7>(g, kind, shape, act, x, accumulate, epilogue, stream); break;
    case 8: launch_matvec<8>(g, kind, shape, act, x, accumulate, epilogue, stream); break;
    default: fail("internal error: matvec of {} tokens (at most 8)", n_tokens);
  }
}

void matvec(const DeviceWeight& w, const ActQ8& act, const float* x, int n_tokens, float* y, int ldy, bool accumulate,
            cudaStream_t stream, const MatvecEpilogue& epilogue) {
  const DeviceWeight* ws[1] = {&w};
  float* ys[1] = {y};
  const int ldys[1] = {ldy};
  matvec_multi(ws, ys, ldys, 1, act, x, n_tokens, accumulate, stream, epilogue);
}

}  // namespace roofline::cuda

namespace roofline {

void gpu_set_matvec_pipe_for_test(int64_t max_sb) { cuda::matvec_pipe_for_test = max_sb < 0 ? -1 : max_sb; }
void gpu_set_matvec_q4k_rows_for_test(int rows) { cuda::q4k_rows_for_test = rows == 2 || rows == 4 ? rows : 0; }
void gpu_set_matvec_one_token_rows_for_test(int q4k_rows, int q6k_rows) {
  cuda::one_token_q4k_rows_for_test = q4k_rows == 2 || q4k_rows == 4 ? q4k_rows : 0;
  cuda::one_token_q6k_rows_for_test = q6k_rows == 1 || q6k_rows == 2 ? q6k_rows : 0;
}

}  // namespace roofline
