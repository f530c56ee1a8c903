// Launchers of the CUDA backend's kernels (one declaration per op; the kernels live in the .cu file
// named after the op). All take the stream; per-step values come from the device step descriptor.
#pragma once

#include <cublas_v2.h>

#include <vector>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/step_layout.h"
#include "backend/device_planes.h"
#include "backend/step.h"

namespace roofline::cuda {

// The per-step values kernels read (device pointers into one buffer the backend uploads per step).
struct DeviceStep {
  const int* header = nullptr;      // StepHeader's ints (step_layout.h)
  const int* tokens = nullptr;      // [max_tokens]
  const int* positions = nullptr;   // [max_tokens]
  const int* row_seq = nullptr;     // [max_tokens]
  const int* logit_rows = nullptr;  // [max_tokens]
  const int* block_tables = nullptr;  // [max_seqs x table_stride]
  int table_stride = 0;
};

// Moves a view's planes down r0 rows of a plane layout of type T (its bytes per block known at compile time).
template <DType T>
__device__ __forceinline__ void skip_plane_rows(DeviceWeight& v, int64_t r0) {
  constexpr DevicePlanes p = device_planes(T);
  const int64_t blocks = r0 * (v.cols / p.values);
  v.data += blocks * p.bytes[0];
  v.plane1 += blocks * p.bytes[1];
  if constexpr (p.bytes[2] != 0) v.plane2 += blocks * p.bytes[2];
  if constexpr (p.bytes[3] != 0) v.plane3 += blocks * p.bytes[3];
}

// Expert e's slice [e * rows, (e + 1) * rows) of a stacked weight, as a weight of its own (every device
// layout stores its planes row by row, so each plane moves by whole rows).
__device__ __forceinline__ DeviceWeight expert_view(const DeviceWeight& w, int64_t e, int64_t rows) {
  DeviceWeight v = w;
  const int64_t r0 = e * rows;
  v.rows = rows;
  v.tmap = nullptr;  // (the map spans the whole tensor)
  switch (w.layout) {
    case WeightLayout::Raw: v.data = w.data + r0 * (int64_t)w.row_bytes; break;
    case WeightLayout::Q8_0Planes: skip_plane_rows<DType::Q8_0>(v, r0); break;
    case WeightLayout::Q4_0Planes: skip_plane_rows<DType::Q4_0>(v, r0); break;
    case WeightLayout::Q4_1Planes: skip_plane_rows<DType::Q4_1>(v, r0); break;
    case WeightLayout::Q5_0Planes: skip_plane_rows<DType::Q5_0>(v, r0); break;
    case WeightLayout::Q5_1Planes: skip_plane_rows<DType::Q5_1>(v, r0); break;
    case WeightLayout::Q6KPlanes: skip_plane_rows<DType::Q6_K>(v, r0); break;
    case WeightLayout::Q3KPlanes: skip_plane_rows<DType::Q3_K>(v, r0); break;
    case WeightLayout::Q2KPlanes: skip_plane_rows<DType::Q2_K>(v, r0); break;
  }
  return v;
}
// The same for a weight of type T in the layout the device gives T (backend/device_planes.h), known at compile time:
// no switch in the kernels that read one expert's rows per warp (the MoE decode kernels).
template <DType T>
__device__ __forceinline__ DeviceWeight expert_view_of(const DeviceWeight& w, int64_t e, int64_t rows) {
  DeviceWeight v = w;
  const int64_t r0 = e * rows;
  v.rows = rows;
  if constexpr (device_planes(T).values == 0) v.data = w.data + r0 * (int64_t)w.row_bytes;
  else skip_plane_rows<T>(v, r0);
  return v;
}

// --- matvec / GEMM (cuda_matvec.cu, cuda_gemm.cu) ---
// y[t * ldy + r] (+)= sum_c W[r, c] x[t, c] for t < n_tokens (n_tokens <= 8): int8 activations for the
// quantized types with a dp4a kernel (Q4_K, Q5_K, Q6_K, Q8_0), float activations otherwise.
bool matvec_uses_q8(DType type);
// Reads the occupancy of the one-token kernels whose launches are chosen by the waves of CTAs they need
// (cuda_matvec.cu: the pipelined Q4_K form, rows a warp). Backends call it once at creation, outside any graph capture.
void matvec_query_waves();
// A decode product's epilogue that writes the int8 input of the product after it, so that no norm or
// SwiGLU kernel runs between them. When the last warp of a 32-row block of the output has stored its
// rows, that warp forms the block of the next input for every token row and quantizes it into `out`:
//   Norm:   v = y * norm_w (y after the residual add), and sum(y^2) of the block into ssq; the last block
//           of the grid sums a token row's blocks into its 1/rms (out.row_factor, with eps), which the
//           next product applies (ActQ8::row_factor);
//   SwiGlu: v = silu(y_gate) * y_up, the group's two members (gate, then up; same rows);
//   GeGlu:  v = gelu(y_gate) * y_up (the tanh approximation), likewise.
// The output rows must be whole 32-blocks. counters: one int per 32-row block, then the grid's (Norm),
// zero before the launch (each last arrival sets its counter back to zero).
struct MatvecEpilogue {
  enum class Kind : int { None = 0, Norm, SwiGlu, GeGlu };
  Kind kind = Kind::None;
  const float* norm_w = nullptr;
  ActQ8 out;
  float* ssq = nullptr;  // Norm: [rows x blocks] scratch
  float eps = 0.0f;      // Norm
  int* counters = nullptr;
  int* grid_counter = nullptr;  // Norm
};
void matvec(const DeviceWeight& w, const ActQ8& act, const float* x, int n_tokens, float* y, int ldy, bool accumulate,
            cudaStream_t stream, const MatvecEpilogue& epilogue = {});
// Up to kMatvecGroupMax products of one input in one launch (ys[m] = W_m x: q/k/v, gate/up, a DeltaNet
// layer's qkv/z/alpha/beta), for weights where matvec_can_group holds
// pairwise (same kernel kind and row length), or Q4_K and Q6_K weights of one row length together.
bool matvec_can_group(const DeviceWeight& a, const DeviceWeight& b);
// matvec_can_group, or (unless ROOFLINE_MIXED_GROUPS=0) a Q4_K and a Q6_K weight of one row length: the products
// of one input that the backend joins in one launch (q/k/v; MoE experts keep one kind per launch).
bool matvec_can_join(const DeviceWeight& a, const DeviceWeight& b);
constexpr int kMatvecGroupMax = 4;
// Products of 2-8 tokens of Q4_K weights on int8 tensor cores with the warp kernels' bits (cuda_matvec_mma.cu),
// where ROOFLINE_MATVEC_MMA=1 (off by default) and the GPU has them: matvec_multi takes that path by itself.
bool matvec_mma_takes(const DeviceWeight& w, int n_tokens);
void matvec_mma_q4k(const DeviceWeight* const* ws, float* const* ys, const int* ldys, int count, const ActQ8& act, int n_tokens,
                    bool accumulate, cudaStream_t stream);
void matvec_multi(const DeviceWeight* const* ws, float* const* ys, const int* ldys, int count, const ActQ8& act,
                  const float* x, int n_tokens, bool accumulate, cudaStream_t stream, const MatvecEpilogue& epilogue = {});
// Expert products grouped by expert (MoE, cuda_moe.cu): for each active expert e, rows [0,
// rows_per_expert) of its slice of the stacked weight times its activation rows [offsets[e],
// offsets[e + 1]) (rows sorted by expert), y[j * ldy + r] for those rows j. Without offsets: one
// expert (0, the whole weight) and rows [0, single_count). Same kernels and results as matvec.
// With pair_ids instead (a step of a few tokens, not worth a sort): one row per pair p < max_active,
// expert pair_ids[p], input row p / input_div, output row p.
struct ExpertGroups {
  const int32_t* offsets = nullptr;  // [n_expert + 1], device
  const int32_t* active = nullptr;   // [max_active], device: the experts with rows, then -1
  const int32_t* pair_ids = nullptr;  // [max_active], device
  int input_div = 1;
  int max_active = 1;
  int single_count = 0;
  int chunk_splits = 1;  // CTAs sharing one expert's rows (8-row chunks taken in turn)
};
// Tensor-core form of the same for prefill (cuda_gemm.cu): token tiles of up to 8 * nt grouped rows of
// one expert each (moe_sort_kernel writes them), for weights where gemm_fuses_dequant holds.
struct ExpertTiles {
  const int32_t* expert = nullptr;   // [max_tiles] the tile's expert
  const int32_t* row0 = nullptr;     // [max_tiles] its first grouped row
  const int32_t* rows = nullptr;     // [max_tiles] its rows (<= 8 * nt)
  const int32_t* n_tiles = nullptr;  // [1] tiles written
  int max_tiles = 0;
  int nt = 8;  // n8 tiles per token tile: 2, 4, 6 or 8
};
// Halves of fragment scratch mma_experts needs.
size_t mma_experts_scratch_halves(int64_t cols, const ExpertTiles& tiles);
void mma_experts(const DeviceWeight& stacked, int64_t rows_per_expert, const ExpertTiles& tiles, const float* x_grouped, __half* scratch,
                 float* y, int ldy, cudaStream_t stream);
void matvec_experts(const DeviceWeight& stacked, int64_t rows_per_expert, const ExpertGroups& groups, const ActQ8& act,
                    const float* x, float* y, int ldy, cudaStream_t stream);
// Two products of the same input and shape in one launch (gate and up): y = W x, y2 = W2 x.
void matvec_experts_pair(const DeviceWeight& stacked, const DeviceWeight& stacked2, int64_t rows_per_expert, const ExpertGroups& groups,
                         const ActQ8& act, const float* x, float* y, float* y2, int ldy, cudaStream_t stream);
// More than 8 rows: up to 64 rows of Q4_K/Q6_K weights, a kernel dequantizing in registers into mma fragments
// (gemm_fuses_dequant); otherwise weights dequantized to f16 in row chunks (scratch) and cuBLAS. x_f16
// holds (n_tokens rounded up to 16) x cols halves (the fused kernel's activation layout pads the rows).
// x_ready: the cuBLAS path's x_f16 already holds x as f16 rows (an earlier product of the same input, or
// an f16 SwiGLU), so x is not read; on the fused path (gemm_fuses_dequant), x_f16 holds x's warpgroup tiles
// (gemm_input_tiles).
bool gemm_fuses_dequant(const DeviceWeight& w, int n_tokens);
// The f16 rows [r0, r0 + n_rows) of w into out ([n_rows x cols]), on `stream`: what the cuBLAS path multiplies.
void dequant_rows_f16(const DeviceWeight& w, int64_t r0, int64_t n_rows, __half* out, cudaStream_t stream);
// Whether a product of n_tokens rows multiplies w's f16 copy (DeviceWeight::f16) with cuBLAS: steps of at least
// f16_copy_min_rows() rows (ROOFLINE_F16_COPY_MIN_ROWS, read once; 33 by default: measured on an H200,
// qwen3-32b `-npl 64` 1883 generated tok/s from 33 rows against 1712-1758 with the fused kernel, `-npl 16`
// 669 from 9 rows against 896-906). Such products dequantize nothing and fuse nothing (gemm_fuses_dequant is
// false for them).
int f16_copy_min_rows();
bool gemm_uses_f16_copy(const DeviceWeight& w, int n_tokens);
// ahead: weights dequantized ahead on a side stream (cuda_dequant_ahead.cuh), or null.
class DequantAhead;
void gemm(cublasHandle_t cublas, const DeviceWeight& w, const float* x, int n_tokens, float* y, int ldy, bool accumulate,
          __half* scratch, size_t scratch_elems, __half* x_f16, cudaStream_t stream, bool x_ready = false, DequantAhead* ahead = nullptr);
// Products of one input joined in one launch of the fused kernel (q/k/v, gate/up of a 9-64 row step):
// weights where gemm_fuses_dequant holds, of one type and row length; ys[k] = W_k x (no accumulation).
// Prompt products of Q4_K weights as one tiled tensor-core GEMM that dequantizes its tiles in shared
// memory (cuda_gemm_q4k_tiles.cu), instead of an f16 copy of the weights for cuBLAS: gemm() takes it for
// steps of 65 to q4k_tile_gemm_max_tokens() rows (ROOFLINE_Q4K_TILE_GEMM; 0, the default, turns it off) on
// sm_80+, where the product has most of a GPU's wave of tiles (or wherever, ROOFLINE_Q4K_TILE_GEMM_ANY=1;
// both read per call). x16: the step's rows as f16 ([n_tokens][cols]).
int q4k_tile_gemm_max_tokens();
bool q4k_tile_gemm_fits(const DeviceWeight& w, int n_tokens);
void q4k_tile_gemm(const DeviceWeight& w, const __half* x16, int n_tokens, float* y, int ldy, bool accumulate, cudaStream_t stream);
// Products of one input that a batched step joins in one launch: of one fused kind and row length, or Q4_K first with
// Q6_K on the warpgroup kernel (wgmma_mixed_joins). ROOFLINE_GEMM_JOIN=0: gemm_can_join is false.
bool gemm_can_join(const DeviceWeight& a, const DeviceWeight& b, int n_tokens);
void gemm_multi(const DeviceWeight* const* ws, float* const* ys, const int* ldys, int count, const float* x, int n_tokens, __half* scratch,
                size_t scratch_elems, __half* x_f16, cudaStream_t stream, bool x_ready = false);
// Where the product of w over n_tokens rows takes Hopper's warpgroup kernel (9-64 rows), the tiles it reads its
// input from (in x_f16, the scratch gemm is given): a kernel that computes that input may write them itself
// (rms_norm's tiles, gated_wgmma_tiles), and gemm / gemm_multi then take x_ready and convert nothing. Elsewhere
// out == nullptr. (ROOFLINE_PRODUCER_TILES=0 keeps the conversion: the backend asks here only when it is on.)
WgTiles gemm_input_tiles(const DeviceWeight& w, int n_tokens, __half* x_f16);
// act(gate) * up (SwiGLU, or GeGLU) of rows [n_rows x n] straight into such tiles (n % 256 == 0).
void gated_wgmma_tiles(bool geglu, const float* gate, const float* up, int n_rows, int n, const WgTiles& tiles, cudaStream_t stream);

// --- the feed-forward block of a one-row decode step in one persistent launch (cuda_decode_ffn.cu) ---
// x += down(silu(gate(xn)) * up(xn)), xn = rmsnorm(x) * norm_w, with the bits of the separate launches
// (rms_norm, matvec_multi, swiglu, matvec with accumulate). h: [n_ff] scratch; sync: a device counter,
// zero before its first launch and used by no other kernel (the grid barrier).
struct DecodeFfn {
  DeviceWeight gate, up, down;
  const float* norm_w = nullptr;
  float eps = 0.0f;
  float* x = nullptr;
  float* h = nullptr;
  unsigned long long* sync = nullptr;
};
// Whether one-row decode steps take it: ROOFLINE_PERSISTENT_FFN=1 (or gpu_use_persistent_ffn_for_test).
bool persistent_ffn_on();
// Q4_K gate/up, Q4_K or Q6_K (planes) down, rows of whole super-blocks within the kernel's limits.
bool decode_ffn_fits(const DeviceWeight& gate, const DeviceWeight& up, const DeviceWeight& down, int n_ctas);
// CTAs of the launch on `device` (one per SM), or 0 where the kernel cannot run (shared memory, sm_80+).
int decode_ffn_ctas(int device);
// n_ctas <= decode_ffn_ctas(): every CTA must be resident at once (the barrier waits for all of them).
void decode_ffn(const DecodeFfn& f, int n_ctas, cudaStream_t stream);

// --- elementwise and normalization (cuda_ops.cu) ---
// Token embedding rows (dequantized) for the step's tokens; rows >= n_tokens are zeroed.
void embed(const DeviceWeight& table, const DeviceStep& step, float* x, int n_rows, int n_embd, cudaStream_t stream);
// out = rmsnorm(x[src_row]) * w for rows r < n_rows (src_row = gather ? gather[r] : r); writes f32 (if out)
// and int8 activations (if act.q). out16 (steps of more than 8 rows, no int8 output): the rows as f16 too,
// saturated as gemm converts its inputs (a prompt GEMM's x_f16); returns whether it wrote them (it does
// where its row kernel takes the shape: 16-byte aligned rows of up to 8192 values). tiles (the same shape, n a
// multiple of 256): the rows as the warpgroup kernel's activation tiles instead; returns whether it wrote them.
bool rms_norm(const float* x, const float* w, float eps, int n_rows, int n, const int* gather, float* out,
              ActQ8 act_out, cudaStream_t stream, __half* out16 = nullptr, const WgTiles& tiles = {});
// Activation quantization of rows (int8 blocks of 32); with gather, row r quantizes x's row gather[r].
void quantize_rows(const float* x, int n_rows, int n, ActQ8 act_out, cudaStream_t stream, const int32_t* gather = nullptr);
// h = silu(gate) * up, written as f32 (if out), int8 activations (if act.q) and f16 (if out16, saturated
// at the f16 range as gemm converts its inputs: the next prompt GEMM's x_f16).
void swiglu(const float* gate, const float* up, int n_rows, int n, float* out, ActQ8 act_out, cudaStream_t stream, __half* out16 = nullptr);
void add_bias(float* y, const float* bias, int n_rows, int n, cudaStream_t stream);
// Gemma: h = gelu_tanh(gate) * up (GeGLU), as swiglu; y += x and x *= s over n values (post norms, the
// embedding scale); x = cap * tanh(x / cap) (a final logit softcap).
void geglu(const float* gate, const float* up, int n_rows, int n, float* out, ActQ8 act_out, cudaStream_t stream, __half* out16 = nullptr);
void add_values(float* y, const float* x, int64_t n, cudaStream_t stream);
// Gemma 3's post-norm and residual in one kernel: x += rmsnorm(y) * w; with w2 also out2 = rmsnorm(x) * w2
// (if out2) and its int8 form (if act2.q), the next block's pre-norm. Decode-sized steps only
// (post_norm_add_fits: at most 8 rows, n a multiple of 32 up to 8192).
bool post_norm_add_fits(int n_rows, int n);
void post_norm_add(const float* y, const float* w, float eps, int n_rows, int n, float* x, const float* w2, float* out2, ActQ8 act2,
                   cudaStream_t stream);
void scale_values(float* x, int64_t n, float s, cudaStream_t stream);
void softcap(float* x, int64_t n, float cap, cudaStream_t stream);
// Gated attention: [q_h | gate_h] rows of the Q projection split into q and gate ([n_rows x n_head*hd]
// each), and x = x * sigmoid(gate) after attention (x in place, and its int8 form when act.q).
void split_q_gate(const float* q_full, int n_rows, int n_head, int hd, float* q, float* gate, cudaStream_t stream);
void output_gate(const float* gate, float* x, int n_rows, int n, ActQ8 act, cudaStream_t stream);
// The argmax kernels' chunk results ([rows x kArgmaxMaxChunks] values and indices) and a counter per row (zero
// between launches), for at most the rows it was made for: argmax_scratch_bytes of device memory, laid out (and
// its counters zeroed, on stream) by argmax_scratch_at.
constexpr int kArgmaxThreads = 256, kArgmaxMinChunk = 2048, kArgmaxMaxChunks = 64;
struct ArgmaxScratch {
  float* v = nullptr;
  int* i = nullptr;
  int* counters = nullptr;
};
size_t argmax_scratch_bytes(int max_rows);
ArgmaxScratch argmax_scratch_at(void* base, int max_rows, cudaStream_t stream);
// Per row of x [n_rows x n]: the index of its largest value, the lowest on ties, NaNs skipped (0 if the
// first value is NaN), as the CPU's argmax_logits picks it. A row's chunks go to CTAs of their own.
void argmax_rows(const float* x, int n_rows, int n, ArgmaxScratch scratch, int32_t* out, cudaStream_t stream);
// The same with masks: rows with has_mask[r] pick among the tokens whose bit is set in allowed[r * words ..]
// (words = (n + 63) / 64), -1 when none has a finite logit.
void argmax_rows_allowed(const float* x, int n_rows, int n, const uint64_t* allowed, const uint8_t* has_mask, ArgmaxScratch scratch,
                         int32_t* out, cudaStream_t stream);

// --- attention (cuda_attention.cu) ---
struct KvLayer {
  uint8_t* k = nullptr;    // values: f32/f16/bf16 elements, or int8 (q8_0) / nibbles (q4_0)
  uint8_t* v = nullptr;
  uint8_t* k_scales = nullptr;  // q8_0/q4_0: f16 per 32 values
  uint8_t* v_scales = nullptr;
  DType type_k = DType::F16, type_v = DType::F16;
  int block_size = 0;
  int window = 0;  // > 0: a sliding-window layer: a row at position p attends to keys (p - window, p] only
};
// The first key a row at position pos attends to (sliding-window layers start later than 0).
__host__ __device__ inline int attention_first_key(int pos, int window) { return window > 0 && pos >= window ? pos - window + 1 : 0; }
// Bytes of n values in a KV value plane, and of their scales (0 for float types).
inline size_t kv_values_bytes(DType type, int64_t n) {
  switch (type) {
    case DType::F32: return (size_t)n * 4;
    case DType::F16: case DType::BF16: return (size_t)n * 2;
    case DType::Q8_0: return (size_t)n;
    case DType::Q4_0: return (size_t)n / 2;
    default: fail("KV cache type {} is not supported on the GPU", dtype_name(type));
  }
}
inline size_t kv_scales_bytes(DType type, int64_t n) { return (type == DType::Q8_0 || type == DType::Q4_0) ? (size_t)n / 32 * 2 : 0; }
// Q/K RMSNorm (when q_norm), RoPE, and the K/V store into the paged cache, for rows < n_tokens (real).
void rope_and_store(const DeviceStep& step, float* q, float* k, const float* v, const float* q_norm, const float* k_norm,
                    const float* rope_factors, int n_rows, int n_head, int n_head_kv, int head_dim_k, int head_dim_v,
                    int n_rot, bool neox, float freq_base, float freq_scale, float eps, const KvLayer& kv,
                    cudaStream_t stream, const float* table = nullptr);
// The rotations of a step's rows for rope_and_store's `table` ([n_rows][n_rot]: cos, then sin, n_rot/2 each),
// once per step and frequency base instead of in each of a row's CTAs (prompt steps: their CTAs mostly start
// after the previous kernel, so that work was on the step's critical path).
void rope_table(const DeviceStep& step, int n_rows, const float* rope_factors, int n_rot, float freq_base, float freq_scale, float* table,
                cudaStream_t stream);
// How decode attention cuts a row's keys into spans (one CTA each), set when a backend is created and carried
// in the step header (kStepMinSpan, kStepSpanSplits, kStepLongSplits, kStepMaxSpan).
struct AttentionSpans {
  int min_span = 32;     // the shortest span (a power of two <= 128; ROOFLINE_ATTN_MIN_SPAN)
  int splits = 32;       // splits a row may take before spans shorter than kAttnLongSpan double (ROOFLINE_ATTN_SPLITS)
  int long_splits = 64;  // ... before spans of kAttnLongSpan keys and more double (attention_spans: by the KV heads)
  int max_span = 512;    // the longest span (a power of two; ROOFLINE_ATTN_MAX_SPAN)
};
constexpr int kAttnLongSpan = 128;
// Keys per attention split of a row with n_keys cached keys when the step does not fix one: short rows
// get short spans so more CTAs share their keys, doubled while a row would need more than `splits` splits;
// spans of kAttnLongSpan keys and more double only past `long_splits` (attention_spans: the keys of a long
// row go to fewer, longer CTAs while it keeps ~256 a layer; measured on an H100, qwen3-32b tg32 at depth 8192
// +3.5%, 16384 +4%, qwen3-30b-a3b at 16384 +8%, where 2-4k keys lose with fewer splits), up to max_span.
// It depends on the row alone, so a row's result does not depend on its batch-mates.
__host__ __device__ inline int attention_span(int n_keys, const AttentionSpans& s) {
  int span = s.min_span;
  while (span < s.max_span && n_keys > (span < kAttnLongSpan ? s.splits : s.long_splits) * span) span *= 2;
  return span;
}
// The most splits a row of a context of n_ctx positions takes (the split kernel's grid and the partial
// buffer of 8 rows are sized by it): `splits` for spans under kAttnLongSpan, n_ctx / kAttnLongSpan beyond.
__host__ __device__ inline int attention_max_splits(int n_ctx, int min_span, int splits) {
  const int a = splits < (n_ctx + min_span - 1) / min_span ? splits : (n_ctx + min_span - 1) / min_span;
  const int b = (n_ctx + kAttnLongSpan - 1) / kAttnLongSpan;
  return a > b ? (a > 1 ? a : 1) : (b > 1 ? b : 1);
}
// Splits a row of n_keys keys needs (header[kStepSplitLen] == 0).
__host__ __device__ inline int attention_splits(int n_keys, const AttentionSpans& s) {
  const int span = attention_span(n_keys, s);
  return (n_keys + span - 1) / span;
}
// The keys per split of a row with n_keys keys in a step on the device: the step's fixed length, or the
// row's own span by the rule the header carries.
__device__ __forceinline__ int row_split_len(const DeviceStep& step, int n_keys) {
  if (step.header[kStepSplitLen] > 0) return step.header[kStepSplitLen];
  const AttentionSpans s{step.header[kStepMinSpan], step.header[kStepSpanSplits], step.header[kStepLongSplits], step.header[kStepMaxSpan]};
  return attention_span(n_keys, s);
}
// Causal attention over each row's cached positions (the last kv.window of them on sliding layers), split over the KV length (step header[kStepSplitLen] keys per
// split, or attention_span's when 0; at most max_splits), combined in a fixed order. With row_list
// (device), the n_rows rows it names; else rows 0..n_rows-1. out: [rows x n_head*head_dim_v]; with out_act.q
// also its int8 form (when head_dim_v % 32 == 0; returns whether it was written). combine_counters
// (attention_combine_counters() ints, zero; or null): decode steps merge the splits in the split kernel
// itself, without the combine kernel. split_heads (AttentionPlan::split_heads): the split kernel's CTAs take
// parts of a KV head's query heads (attention_head_parts), for steps whose rows are all short. grid_splits
// (AttentionPlan::grid_splits; 0: max_splits): the split kernel's grid of splits, at least any row's splits
// (max_splits stays the partial buffer's stride). tiles (decode rows, no row list): the output as the o product's
// activation tiles too, where the combine kernel writes it (*tiles_written says whether it did).
bool attention(const DeviceStep& step, const float* q, const KvLayer& kv, int n_rows, int n_head, int n_head_kv,
               int head_dim_k, int head_dim_v, float scale, int max_splits, float* partial, float* out, ActQ8 out_act,
               const int* row_list, cudaStream_t stream, int* combine_counters = nullptr, bool split_heads = false,
               int grid_splits = 0, const WgTiles& tiles = {}, bool* tiles_written = nullptr);
inline size_t attention_combine_counters(int n_head_kv) { return (size_t)8 * n_head_kv; }
size_t attention_partial_floats(int n_rows, int n_head, int head_dim_v, int max_splits);

// Prefill attention with tensor-core products: for each run of consecutive rows of one sequence
// (consecutive positions), per KV head S = Q K^T over tiles of keys gathered from the paged cache as
// f16, an online softmax per row (causal mask by position), O += P V, then O / l into out
// [rows x n_head*head_dim_v]. Every K/V tile is read once per chunk of the run's rows, where the
// split kernel reads each key once per row.
struct PrefillRun {
  int first_row = 0, n_rows = 0;
  int seq = 0;  // index into the step's sequences (its block table)
  int first_pos = 0;
};
struct PrefillScratch {
  __half* q16 = nullptr;       // n_rows x n_head x head_dim_k
  __half* kv16 = nullptr;      // 2 x key_tile x max(kv_dim_k, kv_dim_v)
  float* scores = nullptr;     // score_floats
  size_t score_floats = 0;     // holds n_head x key_tile scores of at least one row
  float* m_state = nullptr;    // n_head x rows of a chunk, each
  float* l_state = nullptr;
  float* o_acc = nullptr;      // n_head x head_dim_v x rows of a chunk
  int key_tile = 1024;         // prefill_key_tile()
};
// out16: where the flash form below takes the runs, their rows are written there as f16 ([row][head][dim],
// saturated as gemm converts its inputs: the output product's x_f16) instead of as f32 to out; returns
// whether they were.
bool prefill_attention(cublasHandle_t cublas, const DeviceStep& step, const std::vector<PrefillRun>& runs, const float* q,
                       int n_rows, const KvLayer& kv, int n_head, int n_head_kv, int head_dim_k, int head_dim_v, float scale,
                       const PrefillScratch& scratch, float* out, cudaStream_t stream, __half* out16 = nullptr);
// prefill_attention's one-launch form for a run (cuda_flash_prefill.cu): f16 K and V caches, equal head
// dims of 64, 96, 128 or 256, sm_80 and newer, unless ROOFLINE_FLASH_PREFILL=0. q: the step's queries
// ([row][head][dim], f32; each CTA converts its own to f16 times scale); out is the step's output ([row][head][dim]).
bool flash_prefill_fits(const KvLayer& kv, int head_dim_k, int head_dim_v);
bool flash_prefill_fits(DType type_k, DType type_v, int head_dim_k, int head_dim_v);
// The split kernel's work on tensor cores (cuda_flash_decode.cu): the caches flash_prefill_fits takes, groups of
// up to 16 query heads, unless ROOFLINE_FLASH_DECODE=0 (or gpu_use_flash_decode_for_test). Writes the split
// kernel's partials for rows 0..n_rows-1 (or row_list's) over grid_splits splits; attention_combine_kernel merges.
// With `out` (grid_splits 1: every row one split; flash_decode_finalizes) it writes the output and its int8 form
// (act) itself, the combine kernel's bits, and no partials.
bool flash_decode_fits(const KvLayer& kv, int n_head, int n_head_kv, int head_dim_k, int head_dim_v);
void flash_decode(const DeviceStep& step, const float* q, float scale, const KvLayer& kv, int n_rows, int n_head, int n_head_kv,
                  int head_dim, int max_splits, int grid_splits, float* partial, const int* row_list, float* out, ActQ8 act,
                  cudaStream_t stream);
// Whether a flash decode launch of grid_splits splits finalizes its rows itself: where grid_splits is 1, with
// ROOFLINE_FLASH_FINALIZE=1 (or gpu_use_flash_finalize_for_test(1)); off by default (measured level).
bool flash_decode_finalizes(int grid_splits);
void flash_prefill_run(const DeviceStep& step, const PrefillRun& run, const float* q, float scale, const KvLayer& kv, int n_head,
                       int n_head_kv, int head_dim, float* out, cudaStream_t stream, __half* out16 = nullptr);
// Keys per tile of prefill_attention: 1024, or ROOFLINE_ATTN_KEY_TILE (32-1024; tests use small tiles),
// read when a backend is created.
int prefill_key_tile();

// How a step's rows share the attention kernels (the backend's begin_step; gpu_attention_for_test):
// decode-sized steps (<= 8 rows) take each row's own spans (attention_span) over up to max_splits
// splits; larger ones spans of at least 128 keys from 33 rows on, widened (split_len) when the partial
// buffer (8 rows x max_splits) cannot hold every row's splits. With prefill_min_keys > 0, runs of at
// least kMinPrefillRun consecutive rows of one sequence reaching prefill_min_keys keys go to
// prefill_attention and the other rows are listed for the split kernel (prefill_min_keys() says how many
// keys: a run's worth where the one-launch flash kernel takes the cache, kMinPrefillKeys otherwise).
constexpr int kMinPrefillRun = 32, kMinPrefillKeys = 256;
struct AttentionPlan {
  int split_len = 0;  // header[kStepSplitLen]: keys per split (0: attention_span's)
  int min_span = 32;  // header[kStepMinSpan]
  int splits = 1;     // the split kernel's splits per row (the partial buffer's stride)
  // The split kernel's grid of splits: decode-sized steps (a captured graph per grid) the power of two at or
  // above their rows' most splits, at most `splits`; larger steps `splits`. A decode step of a 32k-position
  // pool otherwise launched max_splits (256) splits per KV head for rows of a few hundred keys.
  int grid_splits = 1;
  bool split_heads = false;  // no row has more than kHeadSplitMaxKeys keys (attention's split_heads)
  std::vector<PrefillRun> runs;
  std::vector<int> split_rows;  // with runs: the rows the split kernel takes
};
// bucket_rows (> 8): a batched decode step padded to that many rows (StepPackConfig::batched_buckets).
AttentionPlan plan_attention(const StepDesc& step, int max_splits, const AttentionSpans& spans, int prefill_min_keys, int bucket_rows = 0);

}  // namespace roofline::cuda
