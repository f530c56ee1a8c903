// `roofline plan`'s engine: from a model's tensor table (no weights needed) and a card (gpu_table.h),
// the memory bill per device (weights, KV cache, recurrent state, work buffers, CUDA context), how many
// units -ngl auto would offload (the same placement rule as Engine::create, placement.h), the
// predicted decode and prefill rates with their derivation, and recommendations when it does not fit.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "engine/gpu_table.h"
#include "formats/dtype.h"
#include "model/model.h"

namespace roofline {

// What the CUDA backend allocates for model units, computed without CUDA (it mirrors
// CudaBackend::weight_bytes / kv_block_bytes / state_cell_bytes; a GPU test compares them).
uint64_t planned_gpu_weight_bytes(const Model& model, const LayerSet& layers);
uint64_t planned_gpu_kv_block_bytes(const Model& model, const LayerSet& layers, const KvConfig& kv);
uint64_t planned_gpu_state_cell_bytes(const Model& model, const LayerSet& layers);
uint64_t planned_gpu_swa_cell_bytes(const Model& model, const LayerSet& layers, const KvConfig& kv);

// The KV geometry Engine::create uses: n_ctx positions in blocks; with sliding-window layers a ring per
// sequence of the window plus a step's tokens (n_batch - 1), in whole blocks, at most the context; for
// models whose only uncut-able memory is those rings (no recurrent layers: SequenceMemory's windowed
// mode), the blocks of one prompt-cache window snapshot.
KvConfig planned_kv_config(const HParams& hp, int n_ctx, int n_batch, int block_size, DType type_k, DType type_v);
// Bytes of one window snapshot of every sliding layer (host memory; CpuBackend::swa_snapshot_bytes).
uint64_t window_snapshot_bytes(const Model& model, const KvConfig& kv);
// The window snapshots serve keeps for prompt caching on a windowed model: two per slot, fewer when they
// do not fit cache_ram_mib (llama-server's --cache-ram, which bounds its host prompt cache; < 0: no
// limit); 0 for other models.
int window_snapshot_count(const Model& model, const KvConfig& kv, int n_parallel, double cache_ram_mib);

// The most slots serve and plan take (-np): each costs memory and scheduling work, and counts of state
// cells and rings are kept in int; llama-server has no bound, but no card serves more.
constexpr int kMaxSlots = 65536;

struct PlanSettings {
  int n_ctx = 0;           // KV positions shared by the slots (serve's -c; 0: trained context capped at 16384)
  int n_parallel = 4;      // slots (-np)
  DType type_k = DType::F16, type_v = DType::F16;
  int n_gpu_layers = -1;   // EngineOptions::kGpuLayersAuto (-1), kGpuLayersAll (-2) or a count
  int n_batch = 512;
  int kv_block_size = 32;
  bool prompt_cache = true;         // recurrent models: 2 state snapshots per slot (serve's default)
  bool speculative = false;         // recurrent models: a kept state per slot for rejected drafts (--spec-type, -md)
  // --spec-type draft-mtp: the model's MTP head (Model::mtp_block), an engine of its own that serve creates after
  // the target's, and the most tokens it drafts per step (--draft-max: its KV holds each slot's drafts too).
  std::shared_ptr<const Model> mtp_head;
  int draft_max = 3;
  double cache_ram_mib = 8192;      // serve's --cache-ram: host memory for sliding-window snapshots
  double margin_gib = 1.0;          // EngineOptions::gpu_margin_gib
  double cuda_context_gib = 0.5;    // driver context, cuBLAS and kernels: not visible as free memory
  double vram_limit_gib = 0;        // --vram-limit as serve takes it (0: none)
  double host_memory_gib = 0;       // host RAM (0: unknown, not checked)
  // The decode time model, fitted on the H200 (docs/performance.md, "The planner's decode model"): one
  // token takes  bytes on the GPU / (its read bandwidth x gpu_stream_efficiency)
  //            + gpu_layer_us for each layer on the GPU (the ops without weights, kernel launches)
  //            + bytes on the host / (host read bandwidth x host_stream_efficiency).
  // From qwen3-32b and qwen3-8b Q4_K_M decode (19.32 and 4.67 GB a token at the h200 entry's 4512 GB/s; 146.4
  // and 441.6 tok/s, tg64 at 372780a, one-token rows a warp by waves): 0.87 and 30 us (0.81 and 29 us from 140.1 /
  // 431.5 at f7c7301; 0.73 and 31 us from 127.0 / 392.7 at 30f1990 / 1cbd41c; 0.72 and 35 us at 021d0bf; 0.69 and 38 us before); Q8_0 weights (qwen3-8b Q8_0: 295.6 tok/s through serve) stream at 0.87; the layers left
  // on the host (qwen3-32b Q4_K_M with 19 of 65 units there, Q8_0 with 39: scripts/gpu/plan_check.sh
  // cases 6 and 10) read at 0.81 and 0.85 of the host's measured bandwidth: 0.83. Not measured on other
  // cards: their table bandwidth stands in for the H200's.
  double gpu_stream_efficiency = 0.87;
  double gpu_q8_stream_efficiency = 0.87;
  double gpu_layer_us = 30;
  // What a layer of these kinds adds on the GPU beyond gpu_layer_us (their further launches), each fitted on one model's
  // tg64 on the H200 with the terms above (docs/performance.md, twenty-eighth session): a DeltaNet mixer (qwen3.5-27b,
  // 162.2 tok/s), a mixture-of-experts FFN (qwen3-30b-a3b, 476.9), a shared expert beside it (qwen3.5-35b-a3b, 391.6).
  double gpu_recurrent_layer_us = 2.8;
  double gpu_moe_layer_us = 3.5;
  double gpu_shared_expert_us = 14.8;
  double host_stream_efficiency = 0.83;
  double host_read_gbs = 0;  // the host's read bandwidth, measured (0: the `cpu` table entry's)
  // Every slot decoding at once: each row after the first adds its FLOPs at this share of the card's
  // CUDA-core FP32 rate (H200, qwen3-32b -npl 2/4/8: 1.81 / 2.26 / 2.45 ms more per row for 65 GFLOP,
  // 0.53 / 0.43 / 0.40 of 67 TFLOPS). Our prefill reaches
  // ~28% of the dense FP16 tensor peak (qwen3.5-27b pp512 5657 tok/s x 49.1 GFLOP per prompt token, the output
  // matrix left out: 278 of 989 TFLOPS).
  double batched_row_efficiency = 0.43;
  // Steps of more than 8 rows (-np 9 and more, every slot generating) run the tensor-core kernels, not the warp kernels
  // the term above was fitted on: such a step streams the weights once (at a batched stream efficiency, plus a time a
  // layer), and each row adds its FLOPs at a share of the dense FP16 rate and a time a layer (attention, norms, rope),
  // besides its own KV and recurrent state. Fitted on qwen3-32b and qwen3-8b `-npl 16` and `-npl 64` (four figures,
  // four terms): Hopper's warpgroup kernel on an H100 (thirty-fourth session; held out, gemma3-27b and qwen3.5-27b come
  // out within 11% of theirs), and for the other tensor-core cards (sm_75-89) the mma.sync kernel with f16 copies from
  // 33 rows on an H200 (thirty-first session). Older cards keep the term above.
  // The weights' rate is capped where the kernel dequantizes slower than the card reads: Hopper's warpgroup kernel
  // ran qwen3-32b `-npl 16/64` on an H200 (4.5 TB/s) only 3-6% faster than on an H100 (3.1 TB/s; both 67 FP32
  // TFLOPS: 1122 / 3087 against 1053 / 2995 tok/s, thirty-fifth session), so its weights stream at most at
  // dequant_bytes_per_fp32_flop x the CUDA-core rate (0.0309: the H100's fitted 0.67 x 3082 GB/s at 67 TFLOPS, rounded up so the H100 keeps its bandwidth term).
  // 0: no cap (the mma.sync terms come from one card).
  struct BatchedDecodeTerms {
    double stream_efficiency, layer_us, tensor_efficiency, row_layer_us, dequant_bytes_per_fp32_flop;
  };
  BatchedDecodeTerms batched_hopper{0.67, 46, 0.75, 0.52, 0.0309};
  BatchedDecodeTerms batched_mma{0.68, 81, 0.39, 0.13, 0.0};
  // The routed experts of such a step: n rows touch 1 - (1 - k / E)^n of each layer's experts (at 16 rows of 8 of 128,
  // 64%), read by the grouped expert kernels at this share of the bandwidth (their token groups are small): fitted on
  // qwen3-30b-a3b `-npl 16` / `-npl 64` on an H100 (1263 / 2612 tok/s; predicted 18% low / 4% high; held out,
  // qwen3.5-35b-a3b 2% / 11% high).
  double batched_expert_stream_efficiency = 0.30;
  double prefill_efficiency = 0.28;
  // With the layers' f16 copies (serve's --f16-copies auto, made from the memory the bill leaves) the prompt
  // products dequantize nothing: qwen3-32b pp512 8024 tok/s, 505 of 989 TFLOPS (docs/performance.md, "f16
  // copies"). A prompt step whose GPU weights have copies for a share of them runs that share at this rate.
  double prefill_copies_efficiency = 0.51;
  // Stacked MoE experts keep no f16 copies: a 512-token prompt step dequantizes every expert its tokens route to
  // (at 512 tokens, nearly all of them) in the grouped tensor-core kernel, whose time follows those weight bytes
  // rather than the FLOPs (16-32 tokens an expert). Their rate, as expert weight bytes a second per dense FP16
  // FLOP/s of the card (qwen3-30b-a3b's pp512 was the same on an H200 and an H100: compute, not bandwidth):
  // the geometric mean of the rates pp512 gives on the H100 for qwen3-30b-a3b (18335 tok/s: 0.00069) and
  // qwen3.5-35b-a3b (11456: 0.00047), so those two are predicted 16% low and 19% high (docs/performance.md,
  // thirty-third session; FLOPs at the dense share put them 4.9x and 8.8x high).
  double prefill_expert_bytes_per_flop = 0.00057;
  bool f16_copies = true;         // --f16-copies off: false
  double f16_copies_max_gib = 0;  // --f16-copies GIB: at most this much (0: no cap)
  // The host's prompt products: their measured rate (cpu::measure_cpu_product_tflops; 0: the `cpu` entry's
  // rough figure), of which a CPU prompt step reaches this share (the products were 79-90% of qwen3-1.7b's
  // 128-token steps in the CPU profile, 1 to 16 threads: docs/performance.md).
  double host_tflops = 0;
  double host_prefill_efficiency = 0.8;
};

// One device's memory bill in bytes.
struct DeviceBill {
  std::string device;  // "GPU (v100-32gb)" or "host"
  double weights = 0, kv = 0, state = 0, work = 0, context = 0, margin = 0;
  double swa = 0, snapshots = 0;  // sliding-window rings of the slots; their prompt-cache snapshots (host)
  double draft = 0;     // the MTP head's engine: its weights, KV and (GPU) compute buffers
  double capacity = 0;  // memory available (0: unknown)
  double total() const { return weights + kv + state + swa + snapshots + draft + work + context + margin; }
  bool fits() const { return capacity <= 0 || total() <= capacity; }
};

// The prompt step the prefill prediction describes: a 512-token prompt (pp512), one step.
constexpr int kPlanPromptRows = 512;

struct Plan {
  GpuSpec gpu;
  PlanSettings settings;  // with n_ctx resolved
  int n_units = 0;        // n_layer + 1
  int n_gpu_layers = 0;   // units offloaded
  int draft_units = 0, draft_gpu_units = 0;  // the MTP head's units (its layer and its output), and those on the GPU
  int draft_positions = 0;                    // the MTP head's KV positions
  double draft_weights = 0, draft_kv = 0, draft_work = 0;  // its bill by kind, both devices together
  bool fits = false;      // every unit on the GPU (or, for the host entry, the host) and every bill within capacity
  DeviceBill gpu_bill, host_bill;
  double kv_bytes_total = 0, kv_bytes_per_slot = 0, kv_bytes_per_position = 0;
  int state_cells = 0;
  double state_bytes_per_cell = 0;
  KvConfig kv;                  // the geometry (planned_kv_config)
  int swa_ring_cells = 0;       // sliding-window rings: one per slot (or per state cell with recurrent layers)
  int window_snapshots = 0;     // windowed models: prompt-cache snapshots in host memory
  double swa_bytes_per_ring = 0, window_snapshot_bytes = 0;
  // Decode: bytes one token reads on each device at depth 0, and the rates.
  double gpu_bytes_per_token = 0, host_bytes_per_token = 0;
  double decode_roofline_tok_s = 0, decode_tok_s = 0, decode_tok_s_full_context = 0;
  double decode_tok_s_all_slots = 0;  // every slot generating at once, all slots together
  double flops_per_token = 0, prefill_tok_s = 0;  // flops_per_token: a decode row's (logits included)
  double prefill_expert_seconds = 0;               // of a prompt token's time, the GPU's routed experts (0: none)
  // f16 copies of the GPU layers' matrices (CudaBackend::keep_f16_copies): the bytes all of them take, and the
  // share of them that fits in what the GPU bill leaves (0 without a known capacity, or with them off).
  double f16_copy_bytes = 0, f16_copy_share = 0;
  double prompt_flops_per_token = 0;               // a prompt row's (no logits)
  std::vector<std::string> derivation;       // how the rates were computed, one line each
  std::vector<std::string> recommendations;  // computed alternatives when it does not fit
};

// Plans `model` on `gpu` (a table entry or a measured one). Error on nonsensical settings.
Plan make_plan(const Model& model, const GpuSpec& gpu, const PlanSettings& settings);

// serve's step size when -b is not given: kLargeServeBatch rows where the plan with that batch fits `gpu`
// entirely (every layer, the KV cache of -c, the slots' state and sliding-window rings, the larger steps'
// buffers: logits and activations of every row, ~2.2 MiB a row for qwen3-32b) and keeps as large a share of
// the f16 copies (settings.f16_copies) as settings.n_batch would; else settings.n_batch. Many requests'
// prompts then share a step: on an H200, qwen3-32b, 64 streams of 128-token prompts arriving at once, TTFT
// p99 1.36 s with 512 against 0.96 s with 2048 (docs/performance.md).
constexpr int kLargeServeBatch = 2048;
int serve_batch_size(const Model& model, const GpuSpec& gpu, PlanSettings settings);

// The same model under another quantization mix (nullptr when the source cannot be re-typed, e.g. a
// GGUF file): used to recommend a smaller quant.
using ModelForMix = std::function<std::shared_ptr<const Model>(const std::string& mix_name)>;
// Fills plan.recommendations: KV types, context, slots and (with model_for_mix) quant mixes that fit.
void add_recommendations(Plan& plan, const Model& model, const ModelForMix& model_for_mix);

}  // namespace roofline
