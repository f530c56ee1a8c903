// GPUs as the rest of the program sees them, without CUDA headers: what devices exist, and a
// factory for the CUDA backend. In a build without -DROOFLINE_CUDA=ON there are no devices.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/partial_sum.h"

namespace roofline {

struct GpuInfo {
  int index = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;
  uint64_t total_bytes = 0, free_bytes = 0;
  int sm_count = 0;
  bool has_kernel_image = true;  // the binary was compiled for this compute capability
  int code_arch = 0;  // what its kernels run as (10 * major + minor): below the GPU's in a PTX-only older build
};

bool gpu_support_compiled();                // built with -DROOFLINE_CUDA=ON
std::vector<GpuInfo> gpu_devices();          // empty without CUDA or without a device
std::string gpu_build_info();                // "CUDA runtime 13.0, driver 13.0, archs 75;80;86;89;90" or "no CUDA"

struct GpuBackendOptions {
  int device = 0;
  int max_tokens = 512;  // most rows in one step (n_batch)
  int n_ctx = 4096;      // for the attention's split-KV scratch
  int kv_block_size = 16;  // positions per KV block (the step's block tables hold n_ctx / kv_block_size + 2)
  // MoE layers whose stacked experts stay in host memory and run on the CPU (one flag per model layer;
  // empty: none): --cpu-moe, --n-cpu-moe, -ot REGEX=CPU (backend/cpu/host_experts.h).
  std::vector<bool> experts_on_host;
  int n_host_threads = 0;  // CPU threads for those experts (0: every core)
  size_t gemm_scratch_bytes = 128 << 20;  // the prompt GEMMs' f16 weight scratch (placement.h gemm_scratch_bytes)
  int dequant_ahead_slots = 0;            // as many more of it, dequantized ahead (placement.h dequant_ahead_slots)
  // f16 copies of the weight matrices kept for prompt steps (Backend::keep_f16_copies): where they fit in
  // what is free after everything else, less margin_bytes (and within vram_limit_bytes of this backend's
  // allocations, when that is set).
  F16Copies f16_copies = F16Copies::Off;
  double f16_copies_max_bytes = 0;  // auto: at most this much (0: no cap)
  double vram_limit_bytes = 0;
  double margin_bytes = 1073741824.0;
};
std::unique_ptr<Backend> make_gpu_backend(const GpuBackendOptions& options);

// -sm row: the reducer of the partial sums of GPU ranks on `devices` (rank order), for steps of at most
// max_floats values per sum. ROOFLINE_TP_COMM picks it: `nccl` (the default when the devices are distinct:
// NCCL all-reduces, the library loaded at run time, backend/nccl.h) or `peer` (the default when a device
// repeats, as tests do on one GPU: one kernel per sum that publishes each rank's partial, meets the other
// ranks through flags in device memory and adds every rank's partial in rank order, over peer access).
std::unique_ptr<PartialSumReducer> make_gpu_reducer(const std::vector<int>& devices, size_t max_floats);
// For tests: x through the NCCL reducer's all-reduce on a communicator of one GPU (the identity, through
// the real library: its loading, the bound entry points and, with graph, capture into a CUDA graph).
std::vector<float> gpu_nccl_sum_for_test(const std::vector<float>& x, int device, bool graph);

// For tests: y[t][r] = sum_c W[r][c] x[t][c] computed by the GPU's kernels (matvec for n_tokens <= 8,
// GEMM beyond), with W uploaded in its device layout. x: [n_tokens x cols], returns [n_tokens x rows].
// f16_copy: W also gets the f16 copy the backend keeps for prompt steps (the product then multiplies it where
// gemm_uses_f16_copy says so: n_tokens >= ROOFLINE_F16_COPY_MIN_ROWS, 33 by default; gpu_set_f16_copy_min_rows_for_test).
std::vector<float> gpu_matmul_for_test(const Weight& w, const std::vector<float>& x, int n_tokens, int device = 0, bool f16_copy = false);
// For tests: products of int8-activation weights of one row length in one launch, as the backend joins
// q/k/v and gate/up: 1-8 tokens through matvec_multi (one kind, or Q4_K and Q6_K together), 9-64 through
// the batched tensor-core kernel (gemm_multi: Q4_K or Q6_K, one type). Returns each weight's
// [n_tokens x rows] output, one after the other.
std::vector<float> gpu_joined_products_for_test(const std::vector<const Weight*>& ws, const std::vector<float>& x, int n_tokens,
                                                int device = 0);
// For tests: the batched products of Q4_K weights on int8 tensor cores (cuda_mma_int8.cu) for 9-64 rows (1)
// or never (0) whatever ROOFLINE_INT8_MMA says, or back to what it says (-1: never unless set).
void gpu_use_int8_products_for_test(int mode);
// For tests: the batched products of Q4_K and Q6_K weights on Hopper's warpgroup tensor cores (cuda_wgmma_rows.cu)
// for steps of min_rows-64 rows (9 or more), never (0), or as ROOFLINE_WGMMA says (-1), with m_tiles m64 tiles a
// warpgroup (1 or 2; 0: as ROOFLINE_WGMMA_TILES says); and whether this device and build can run them (sm_90 with
// sm_90a code).
void gpu_use_wgmma_products_for_test(int min_rows, int m_tiles = 0);
bool gpu_wgmma_products_available_for_test();
// For tests: the warpgroup kernel's pipeline without CTA-wide barriers (1; 2: with Q4_K weights as tensor-map boxes), the
// plain one (0), or as ROOFLINE_WGMMA_BULK and ROOFLINE_WGMMA_TMA say (-1: 2 unless either is 0).
void gpu_use_wgmma_bulk_for_test(int mode);
// For tests: the warpgroup kernel's Q4_K products with the mins folded out of the weights (1), with them in the
// weights (0), or as ROOFLINE_WGMMA_FOLD says (-1: folded unless it is 0).
void gpu_use_wgmma_fold_for_test(int on);
// Q6_K's -32 folded out the same way (ROOFLINE_WGMMA_FOLD_Q6): 1 on, 0 off, -1 the environment's.
void gpu_use_wgmma_fold_q6_for_test(int on);
// For tests: batched Q4_K and Q6_K products of one input joined in one warpgroup launch (1), in launches of one kind
// each (0), or as ROOFLINE_WGMMA_MIXED says (-1: joined unless it is 0).
void gpu_use_wgmma_mixed_for_test(int on);
// For tests: the grouped expert products on the warpgroup kernel (1), not (0), or as ROOFLINE_WGMMA_EXPERTS says (-1).
void gpu_use_wgmma_experts_for_test(int on);
// For tests: one-token Q4_K products (and Q4_K/Q6_K groups) pipeline a warp's rounds of loads for rows of up to
// max_sb super-blocks (0: never), or as ROOFLINE_MATVEC_PIPE says (-1; unset: launches of at most 4 CTAs a SM).
void gpu_set_matvec_pipe_for_test(int64_t max_sb);
// For tests: rows per warp (2 or 4) of the 2-8 token Q4_K products, or back to ROOFLINE_MATVEC_Q4K_ROWS's (0; unset: 4).
void gpu_set_matvec_q4k_rows_for_test(int rows);
// For tests: x[t] = sum_s weights[t * k + s] * down_{ids[t * k + s]} h[t * k + s] for t < n_rows (1 or 2) through the fused
// MoE down + combine launch of decode steps (h quantized to int8 first; stacked_down holds n_expert experts' rows one after
// the other), by its eight-row kernel for Q4_K experts of 1-4 super-blocks a row (short_rows) or its four-row one.
std::vector<float> gpu_moe_down_combine_for_test(const Weight& stacked_down, int n_expert, const std::vector<float>& h,
                                                 const std::vector<int32_t>& ids, const std::vector<float>& weights, int n_rows, int k,
                                                 bool short_rows, int device = 0);
// For tests: rows per warp of one-token Q4_K products (2 or 4) and Q6_K products (1 or 2), or the launch's rule (0).
void gpu_set_matvec_one_token_rows_for_test(int q4k_rows, int q6k_rows);
// For tests: how many products have multiplied a weight's f16 copy (GpuBackendOptions::f16_copies) in this process.
int64_t gpu_f16_copy_gemm_calls_for_test();
// For tests: the fewest rows whose products take the f16 copies (at least 9), or back to ROOFLINE_F16_COPY_MIN_ROWS's (0).
void gpu_set_f16_copy_min_rows_for_test(int rows);
// For tests: decode attention of f16 caches on tensor cores (cuda_flash_decode.cu) always (1; 2: with two staging
// buffers, as ROOFLINE_FLASH_DECODE_BUFFERS=2), never (0), or as ROOFLINE_FLASH_DECODE says (-1; on unless it is 0).
void gpu_use_flash_decode_for_test(int mode);
// For tests: steps whose rows all have one split finalize in the flash decode kernel (1), or go through the
// combine kernel (0), or as ROOFLINE_FLASH_FINALIZE says (-1; off unless it is 1).
void gpu_use_flash_finalize_for_test(int mode);
// For tests: flash decode launches so far that finalized their rows themselves.
int64_t gpu_flash_finalize_launches_for_test();
// For tests: the one-buffer flash decode kernel stages its first block's older keys before the dependency wait
// (1), after it (0), or as ROOFLINE_FLASH_EARLY_KV says (-1; on unless it is 0).
void gpu_use_flash_early_kv_for_test(int mode);
// For tests: products of 2-8 tokens of Q4_K weights on int8 tensor cores (1), by the warp kernels (0), or as
// ROOFLINE_MATVEC_MMA says (-1; off unless it is 1).
void gpu_use_mma_matvec_for_test(int mode);
// For tests: the feed-forward block of one decode row, x += down(silu(gate(xn)) * up(xn)) with xn = rmsnorm(x) *
// norm_w, as the backend's separate launches (persistent false: rms norm, gate/up, SwiGLU, down) or as the
// persistent kernel (cuda_decode_ffn.cu) over n_ctas CTAs (0: one per SM). The block runs `repeats` times in
// turn on x (each run's grid barrier on the same counter); returns x after each run ([repeats x x.size()]).
std::vector<float> gpu_decode_ffn_for_test(const Weight& gate, const Weight& up, const Weight& down, const std::vector<float>& norm_w,
                                           const std::vector<float>& x, bool persistent, int n_ctas, int repeats, float eps = 1e-6f,
                                           int device = 0);
// For tests: one-row decode steps take the persistent FFN kernel where it fits (1), never (0), or as
// ROOFLINE_PERSISTENT_FFN says (-1).
void gpu_use_persistent_ffn_for_test(int mode);
// For tests: how many products the tiled Q4_K prompt GEMM (cuda_gemm_q4k_tiles.cu) has run in this process.
int64_t gpu_q4k_tile_gemm_calls_for_test();
// For tests: how many tensor maps of weights (the warpgroup kernel's TMA weights) uploads have made in this process.
int64_t gpu_weight_tensor_maps_for_test();

// For tests: the MoE expert products, grouped by expert on the device as the MoE block runs them (tensor
// cores for more than 64 tokens of Q4_K / Q6_K weights with even rows per expert, else the int8 / float kernels).
// stacked: n_expert experts' [rows x cols] weights stacked ([n_expert * rows] rows); ids: [n_tokens x k]
// expert ids (pair p = token p / k); x: [n_tokens x cols]. Returns [n_tokens * k x rows] in pair order.
std::vector<float> gpu_expert_products_for_test(const Weight& stacked, int n_expert, const std::vector<int32_t>& ids, int k,
                                                const std::vector<float>& x, int n_tokens, int device = 0);

// For tests: a decode step's MoE routing as the block runs it for n_rows rows (moe_router: the f32 router's
// own kernel, whose last CTA routes up to 8 rows; more rows go through the route kernel). router:
// [n_expert x cols], xn: [n_rows x cols]. Returns the ids [n_rows x k] in routing order and their weights.
// The launch runs twice with the outputs cleared between (the last-CTA counter must be back at zero).
std::vector<int32_t> gpu_moe_route_for_test(const std::vector<float>& router, int n_expert, int cols, const std::vector<float>& xn, int n_rows,
                                            int k, bool normalize, float scale, std::vector<float>* weights, int device = 0);

// For tests: the MoE block's norm and router for a decode step of n_rows <= 8 rows (residual x [n_rows x cols],
// norm weight [cols]), with the norm in the router kernel (router_norms: moe_router_norms' path) or as its own
// kernel before it (rms_norm, then the router on its output). Returns the logits [n_rows x n_expert], then xn
// [n_rows x cols], then the int8 rows as q, d and s ([n_rows x cols] values, [n_rows x cols / 32] twice) as floats.
std::vector<float> gpu_moe_router_norm_for_test(const std::vector<float>& router, int n_expert, int cols, const std::vector<float>& x,
                                                const std::vector<float>& norm_w, float eps, int n_rows, bool router_norms, int device = 0);

// For tests: one row-wise op of the GPU over host rows a [n_rows x n]; b is the norm weight or the
// bias [n], or up [n_rows x n] for the SwiGLU ops. The Int8 variants return the int8 activations the
// op writes for the next product, times their block scales (n % 32 == 0); Argmax each row's index.
// ArgmaxAllowed: b holds one value per element of a, nonzero where the token is allowed; a row whose b
// values are all negative has no mask (plain argmax). Both argmax forms return the indices as floats.
// The post-norm ops (Gemma 3's x += rmsnorm(y) * w, then rmsnorm(x) * w2) take a = [y rows, then x rows]
// and b = [w, w2]; PostNormAdd returns the new x, PostNormAddNorm rmsnorm(x) * w2, PostNormAddInt8 its
// int8 form dequantized (at most 8 rows, n a multiple of 32).
enum class GpuOpForTest { RmsNorm, RmsNormInt8, RmsNormF16, Swiglu, SwigluInt8, SwigluF16, AddBias, Argmax, ArgmaxAllowed, PostNormAdd, PostNormAddNorm, PostNormAddInt8 };
// For tests: a 9-64 row step's product input written as the warpgroup kernel's activation tiles by the kernel that
// computes it (RmsNorm: a = x rows, b = the norm weight; Swiglu: a = gate rows, b = up rows, GeGLU where geglu; n a
// multiple of 256), against the same op's f32 rows converted by the products' own conversion and by the reference
// conversion that builds each 16-byte run from the row blocks' offsets; q6: Q6_K's tile layout, else Q4_K's (folded
// or not as the products are: gpu_use_wgmma_fold_for_test). Returns
// the three buffers' halves as bits, in that order ([3][n_pad x n], n_pad the rows rounded up to 16).
std::vector<uint16_t> gpu_producer_tiles_for_test(GpuOpForTest op, bool geglu, bool q6, const std::vector<float>& a, const std::vector<float>& b,
                                                  int n_rows, int n, float eps, int device = 0);
// Whether engines created after the call have producers write those tiles (ROOFLINE_PRODUCER_TILES; -1: the
// environment's), and how many products have taken tiles so written, over the process.
void gpu_use_producer_tiles_for_test(int on);
int64_t gpu_producer_tiles_taken_for_test();
// For tests: the norm of 9-64 row steps by a CTA per run of 1024 values of each row (1) or one CTA a row (0), or as
// ROOFLINE_NORM_WIDE_ROWS says (-1).
void gpu_use_wide_norm_rows_for_test(int on);
std::vector<float> gpu_op_for_test(GpuOpForTest op, const std::vector<float>& a, const std::vector<float>& b, int n_rows, int n,
                                   float eps = 1e-6f, int device = 0);

// For tests: two decode products (1-8 tokens) joined as a layer joins them. Norm: x' = x + P a (the
// residual add), then C (rmsnorm(x') * norm_w); SwiGlu: C (silu(P a) * (P2 a)); GeGlu: C (gelu(P a) * (P2 a),
// the tanh approximation). fused: the norm or SwiGLU/GeGLU
// runs in P's epilogue (MatvecEpilogue), else in its own kernel. The chain runs twice on the same buffers
// (the epilogue's counters must be back at zero). Returns C's output of each run, then x' (Norm):
// [2 x n_tokens x C.rows()] (+ [n_tokens x P.rows()]). a: [n_tokens x P.cols()], x: [n_tokens x P.rows()].
enum class GpuChainForTest { Norm, SwiGlu, GeGlu };
std::vector<float> gpu_chained_products_for_test(GpuChainForTest kind, bool fused, const Weight& p, const Weight* p2, const Weight& c,
                                                 const std::vector<float>& a, const std::vector<float>& x, const std::vector<float>& norm_w,
                                                 int n_tokens, float eps = 1e-6f, int device = 0);

// For tests: the DeltaNet mixer (backend/delta_net.h) by the CUDA kernels over host data, as
// delta_net_reference takes it (here in plain types: the CUDA sources compile as C++17, without
// delta_net.h's spans): each seqs[i].state (state_floats() host floats) is read unless fresh and
// updated. The launch is padded like a decode bucket: two more rows than n_rows (no sequence owns
// them; their outputs must come back zero) and two more sequence records than seqs (garbage beyond the
// count, which the kernels must skip); cells are in reverse order with a padded stride, and fresh
// sequences' cells hold NaNs. Returns out [(n_rows + 2) x value_dim]; with int8_out, also the int8
// activations times their block scales (value_dim % 32 == 0). graph: the launches are captured in a
// CUDA graph while the records say "no sequences", then the records are uploaded and the graph replayed.
enum class GpuDeltaNetForm { Recurrent, Chunked, ChunkedPrecise };
struct GpuDeltaNetSeq {  // as DeltaNetSeq
  int first_row = 0, n_rows = 0;
  bool fresh = false;
  float* state = nullptr;
};
std::vector<float> gpu_delta_net_for_test(const DeltaNetDims& dims, const float* conv, const float* dt_bias, const float* a,
                                          const float* norm, float eps, const std::vector<GpuDeltaNetSeq>& seqs,
                                          const float* qkv, const float* z, const float* alpha, const float* beta, int n_rows,
                                          GpuDeltaNetForm form, bool graph, std::vector<float>* int8_out, int device = 0);
// Whether GpuDeltaNetForm::Chunked runs as such on this device for these dims (else it runs recurrent).
bool gpu_delta_net_chunked_supported(const DeltaNetDims& dims, int device = 0);
// For tests: microseconds per layer of the DeltaNet mixer's launches on random data (n_seqs sequences
// of rows_per_seq rows each, carried states; f32 and int8 outputs), each measured as a CUDA graph of
// `reps` repetitions: {all, prepare, rule (recurrent, or the chunked form's first kernel), the chunked
// form's second kernel (0 for recurrent), output}.
std::vector<double> gpu_delta_net_time_for_test(const DeltaNetDims& dims, int n_seqs, int rows_per_seq, GpuDeltaNetForm form,
                                                int reps, int device = 0);

// For tests: one attention layer's paged KV cache in host memory: n_blocks * block_size slots, each a
// row of n_head_kv * head_dim values of type_k (K) or type_v (V) in GGUF row bytes (dtype_row_bytes;
// q8_0/q4_0 rows of whole 32-groups), as quantize_rows_ref writes them. The hooks move them into and
// out of the planes the CUDA backend keeps.
struct GpuKvCacheForTest {
  DType type_k = DType::F16, type_v = DType::F16;
  int block_size = 16, n_blocks = 0;
  std::vector<uint8_t> k, v;
};
struct GpuAttentionShape {
  int n_head = 1, n_head_kv = 1, head_dim_k = 64, head_dim_v = 64;
};
// For tests: a step's attention (step.positions, row_seq and the sequences' block tables into the
// cache) as the backend runs it: plan_attention splits the rows (decode-sized steps padded to their
// bucket, whose padding rows must come back zero; in larger ones runs of prompt rows go through
// prefill_attention, in key tiles of prefill_key_tile (32-1024, 0: the default) and chunks of 16 rows,
// the others through the split-KV kernel), with max_splits as for a context of the step's deepest row.
// q: [rows x n_head * head_dim_k]; window > 0: a sliding-window layer. Returns [rows x n_head * head_dim_v].
// combine_in_split: decode steps merge the splits in the split kernel (else the combine kernel). Runs
// twice and fails unless both give the same bits. act: also the output's int8 form as decode steps write it
// for the o product (when head_dim_v is a multiple of 32): q, then each group of 32's d and s as raw bytes.
std::vector<float> gpu_attention_for_test(const GpuAttentionShape& shape, const GpuKvCacheForTest& cache, int window, float scale,
                                          const StepDesc& step, const std::vector<float>& q, int prefill_key_tile = 0,
                                          bool combine_in_split = true, int device = 0, std::vector<uint8_t>* act = nullptr);
// For tests: the prologue of attention (rope_and_store) over a step's rows, padded like a decode
// bucket (the padding rows must store nothing): Q/K RMSNorm with q_norm / k_norm ([head_dim_k], when
// given), RoPE of the first n_rot dimensions of each head (NeoX pairs (i, i + n_rot/2) when neox, else
// (2i, 2i + 1)) at each row's position, frequencies divided by factors ([n_rot/2], when given), and
// each row's K and V written into the cache at its position's slot. q and k are rotated in place; the
// cache comes back as the device holds it after the step.
struct GpuRopeForTest {
  int n_rot = 64;
  bool neox = false;
  float freq_base = 10000.0f, freq_scale = 1.0f, eps = 1e-6f;
  const float* q_norm = nullptr;
  const float* k_norm = nullptr;
  const float* factors = nullptr;
  bool table = false;  // the rotations computed once for the step (rope_table) instead of in rope's CTAs
};
void gpu_rope_store_for_test(const GpuAttentionShape& shape, const GpuRopeForTest& rope, const StepDesc& step, std::vector<float>& q,
                             std::vector<float>& k, const std::vector<float>& v, GpuKvCacheForTest& cache, int device = 0);
// For tests: microseconds per decode step of attention (n_seqs one-row sequences, each `depth` keys
// deep in blocks of 16 interleaved with the others'), measured as a CUDA graph of `reps` steps (0: one
// launch, for a profiler).
double gpu_attention_decode_time_for_test(const GpuAttentionShape& shape, DType type_k, DType type_v, int n_seqs, int depth,
                                          int reps, int device = 0);

// Read bandwidth of device memory in GB/s, measured with a streaming kernel (bench's roofline).
double measure_gpu_read_bandwidth(int device);

}  // namespace roofline
