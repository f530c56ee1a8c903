// The CUDA backend: weights uploaded once (repacked where the kernels want it), the KV blocks of its
// layers in device memory, and a layer as norm+quantize -> Q/K/V -> rope+store -> split-KV attention
// -> O (+residual) -> norm+quantize -> gate/up -> SwiGLU+quantize -> down (+residual). Decode steps
// (<= 8 rows) use the matvec kernels, larger steps dequantize-to-f16 GEMMs. Per-step values live in
// a device step descriptor uploaded once per step (pack_step, cuda_step_pack.cuh).
#include <cublas_v2.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>

#include "backend/cuda/cuda_argmax_masks.cuh"
#include "backend/cuda/cuda_backend_sizes.cuh"
#include "backend/cuda/cuda_delta_net.cuh"
#include "backend/cuda/cuda_dequant_ahead.cuh"
#include "backend/cuda/cuda_f16_copies.cuh"
#include "backend/cuda/cuda_graph_cache.cuh"
#include "backend/cuda/cuda_kernels.cuh"
#include "backend/cuda/cuda_moe.cuh"
#include "backend/cuda/cuda_product_inputs.cuh"
#include "backend/cuda/cuda_rope_tables.cuh"
#include "backend/cuda/cuda_step_pack.cuh"
#include "backend/cuda/cuda_step_profiler.cuh"
#include "backend/cuda/step_layout.h"
#include "backend/cpu/host_experts.h"
#include "backend/cuda/cuda_weights.cuh"
#include "backend/cuda/cuda_window_snapshots.cuh"
#include "backend/gpu.h"
#include "core/log.h"
#include "formats/quant_ref.h"

namespace roofline::cuda {
namespace {

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const GpuBackendOptions& options) : options_(options) {
    int count = 0;
    ROOFLINE_CUDA_CHECK(cudaGetDeviceCount(&count));
    if (options.device < 0 || options.device >= count) fail("GPU {} does not exist ({} found)", options.device, count);
    ROOFLINE_CUDA_CHECK(cudaSetDevice(options.device));
    // With prompt weights dequantized ahead on a side stream (cuda_dequant_ahead.cuh) the step's stream
    // takes the greatest priority.
    ahead_slots_ = DequantAhead::slots_wanted(options.dequant_ahead_slots);
    int least = 0, greatest = 0;
    ROOFLINE_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    ROOFLINE_CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, ahead_slots_ > 0 ? greatest : least));
    if (cublasCreate(&cublas_) != CUBLAS_STATUS_SUCCESS) fail("cuBLAS could not be initialized");
    cublasSetStream(cublas_, stream_);
    // A workspace of our own, set once: without it cuBLAS takes one from its pool on each call.
    ROOFLINE_CUDA_CHECK(cudaMalloc(&cublas_workspace_, kCublasWorkspaceBytes));
    if (cublasSetWorkspace(cublas_, cublas_workspace_, kCublasWorkspaceBytes) != CUBLAS_STATUS_SUCCESS)
      fail("cuBLAS workspace could not be set");
    const char* no_graphs = std::getenv("ROOFLINE_NO_CUDA_GRAPHS");
    graphs_enabled_ = !(no_graphs && *no_graphs && *no_graphs != '0');
    if (profiler_.enabled()) graphs_enabled_ = false;
    const char* split_combine = std::getenv("ROOFLINE_SPLIT_COMBINE");
    split_combine_ = split_combine && std::strcmp(split_combine, "1") == 0;  // off: slower on the H200 (docs/performance.md)
  }
  ~CudaBackend() override {
    cudaSetDevice(options_.device);
    ahead_.reset();
    if (cublas_) cublasDestroy(cublas_);
    if (cublas_workspace_) cudaFree(cublas_workspace_);
    if (stream_) cudaStreamDestroy(stream_);
    if (step_host_) cudaFreeHost(step_host_);
    if (logits_host_) cudaFreeHost(logits_host_);
    if (argmax_host_) cudaFreeHost(argmax_host_);
    if (hidden_rows_dev_) cudaFree(hidden_rows_dev_);
    if (host_rows_) cudaFreeHost(host_rows_);
  }

  std::string name() const override { return fmt::format("CUDA{}", options_.device); }

  uint64_t weight_bytes(const Model& model, const LayerSet& layers) const override {
    return device_weights_bytes(model, layers, [&](int il, LayerTensor role) { return expert_on_host(il, role); });
  }

  uint64_t kv_block_bytes(const Model& model, const LayerSet& layers, const KvConfig& kv) const override {
    const HParams& hp = model.hparams();
    const int paged = hp.count_layers(MixerKind::Attention, layers.begin, layers.end) - ring_layers(hp, layers, kv);
    return (uint64_t)paged * kv_plane_bytes(hp, kv, kv.block_size);
  }
  uint64_t swa_cell_bytes(const Model& model, const LayerSet& layers, const KvConfig& kv) const override {
    return (uint64_t)ring_layers(model.hparams(), layers, kv) * kv_plane_bytes(model.hparams(), kv, kv.swa_ring);
  }
  uint64_t swa_snapshot_bytes(const Model& model, const LayerSet& layers, const KvConfig& kv) const override {
    const int64_t positions = (int64_t)kv.swa_snapshot_blocks * kv.block_size;  // in host memory: no alignment slack
    return (uint64_t)ring_layers(model.hparams(), layers, kv) * (kv_plane_bytes(model.hparams(), kv, positions) - 4 * 256);
  }
  uint64_t state_cell_bytes(const Model& model, const LayerSet& layers) const override {
    const HParams& hp = model.hparams();
    return (uint64_t)hp.count_layers(MixerKind::DeltaNet, layers.begin, layers.end) * ((hp.delta_net.state_floats() + 3) / 4 * 16 + 256);
  }

  void load(std::shared_ptr<const Model> model, const LayerSet& layers) override {
    ROOFLINE_CUDA_CHECK(cudaSetDevice(options_.device));
    model_ = std::move(model);
    layers_ = layers;
    const HParams& hp = model_->hparams();
    weights_.reserve(weight_bytes(*model_, layers) + 4096);
    layer_dev_.resize(layers.n_layers());
    for (int il = layers.begin; il < layers.end; ++il) {
      const LayerWeights& L = model_->layer(il);
      LayerDev& d = layer_dev_[il - layers.begin];
      d.mixer = L.mixer;
      d.il = il;
      for (const PlannedTensor& t : layer_tensor_plan(model_->arch(), hp, il)) {
        const Weight& w = L[t.rule->role];
        const size_t i = (size_t)t.rule->role;
        if (expert_on_host(il, t.rule->role)) continue;  // MoE hook: experts kept in host memory
        if (t.rule->use == TensorUse::Matrix) {
          d.mats[i] = upload_weight(w, weights_, stream_);
          d.mat_bytes[i] = w ? w.bytes() : 0;
        } else {
          d.vecs[i] = upload_floats(to_floats(w), weights_, stream_);
        }
      }
    }
    if (model_->arch().has(LayerTensor::AttnPostNorm) && hp.n_ff < hp.n_embd)  // post_norm_add's scratch is the FFN's
      fail("the GPU backend needs feed_forward_length ({}) >= embedding_length ({}) for post norms", hp.n_ff, hp.n_embd);
    const bool has_delta = hp.count_layers(MixerKind::DeltaNet, layers.begin, layers.end) > 0;
    if (has_delta) {
      const std::string why = delta_net_unsupported(hp.delta_net);
      if (!why.empty()) fail("the GPU cannot run this model's Gated DeltaNet layers: {}", why);
    }
    if (layers.embedding) embd_ = upload_weight(model_->token_embd(), weights_, stream_);
    if (layers.output) {
      out_ = (layers.embedding && model_->tied_embeddings()) ? embd_ : upload_weight(model_->output(), weights_, stream_);
      out_norm_ = upload_floats(to_floats(model_->output_norm()), weights_, stream_);
      out_bytes_ = model_->output().bytes();
    }
    rope_factors_ = upload_floats(to_floats(model_->rope_freqs()), weights_, stream_);

    // Work buffers for up to max_tokens rows.
    const int T = std::max(1, options_.max_tokens);
    const DeltaNetDims& dn = hp.delta_net;
    const int64_t max_cols = std::max<int64_t>({hp.n_embd, hp.n_ff, (int64_t)hp.n_head * hp.head_dim_v, has_delta ? dn.value_dim() : 0});
    min_span_ = attention_min_span();
    span_splits_ = attention_span_splits();
    max_splits_ = attention_max_splits(options_.n_ctx, min_span_, span_splits_);
    const size_t partial = attention_partial_floats(8, hp.n_head, hp.head_dim_v, max_splits_);
    const int64_t q_rows = (int64_t)hp.q_dim() * (hp.attn_output_gate ? 2 : 1);
    int64_t max_rows_w = std::max<int64_t>({q_rows, hp.kv_dim_k(), hp.kv_dim_v(), hp.n_ff, hp.n_embd, has_delta ? dn.conv_dim() : 0});
    if (layers.output) max_rows_w = std::max<int64_t>(max_rows_w, hp.n_vocab);
    // The prompt GEMMs' f16 weight chunks: what the engine's placement billed (128 MiB, or 320 MiB on GPUs
    // of 64 GiB and more: whole matrices of the 27-32B models in one cuBLAS product each), or
    // ROOFLINE_GEMM_SCRATCH_MB, beyond that allowance.
    const size_t scratch_cap = [&] {
      const char* env = std::getenv("ROOFLINE_GEMM_SCRATCH_MB");
      return env ? (size_t)std::max(1, std::atoi(env)) << 19 : std::max<size_t>(options_.gemm_scratch_bytes / 2, 1);  // halves
    }();
    gemm_scratch_elems_ = std::min<size_t>((size_t)max_rows_w * max_cols, scratch_cap);
    gemm_scratch_elems_ = std::max<size_t>(gemm_scratch_elems_, (size_t)max_cols);
    if (ahead_slots_ > 0) {
      ahead_ = std::make_unique<DequantAhead>(ahead_slots_, gemm_scratch_elems_, stream_);
      ahead_->leave_sms(cublas_, options_.device);
    }
    const size_t floats = (size_t)T * (2 * hp.n_embd + hp.q_dim() + hp.kv_dim_k() + hp.kv_dim_v() +
                                       (size_t)hp.n_head * hp.head_dim_v + 2 * hp.n_ff) +
                          partial + (layers.output ? (size_t)T * hp.n_vocab : 0) + (partial_sum_ ? (size_t)T * hp.n_embd : 0) +
                          (hp.attn_output_gate ? (size_t)T * 3 * hp.q_dim() : 0);
    // DeltaNet layers: their four in-projections, the mixer's output and its scratch.
    dn_chunked_ = has_delta && delta_net_chunked_supported(dn);
    const size_t dn_floats = has_delta ? (size_t)T * (dn.conv_dim() + 2 * dn.value_dim() + 2 * dn.n_v_heads) +
                                             delta_net_scratch_floats(dn, T, dn_chunked_) + 64
                                       : 0;
    const size_t act_bytes = ProductInputs::bytes(T, max_cols) + attention_combine_counters(hp.n_head_kv) * 4 + 256;
    const size_t half_bytes = (gemm_scratch_elems_ + (size_t)(T + 15) / 16 * 16 * max_cols) * 2;
    const size_t step_ints = step_capacity_ints();
    // Prefill attention (runs of one sequence's rows through tensor-core products): K/V tiles as f16 and
    // the online-softmax state; its scores use the GEMM scratch, its queries x_f16_ and its running
    // output gate_ (all idle during attention), so it needs them large enough.
    const int64_t kv_dim = std::max(hp.kv_dim_k(), hp.kv_dim_v());
    prefill_.key_tile = (int)std::min<int64_t>(cuda::prefill_key_tile(), (int64_t)(gemm_scratch_elems_ / 2 / hp.n_head) / 32 * 32);
    prefill_ok_ = prefill_.key_tile >= 32 && hp.q_dim() <= max_cols && hp.n_ff >= (int64_t)hp.n_head * hp.head_dim_v;
    const size_t prefill_bytes = prefill_ok_ ? (size_t)2 * prefill_.key_tile * kv_dim * 2 + (size_t)2 * T * hp.n_head * 4 : 0;
    const size_t rope_floats = RopeTables::floats(T, hp.n_rot);
    work_.reserve(floats * 4 + dn_floats * 4 + act_bytes + half_bytes + step_ints * 4 + (size_t)T * 4 + prefill_bytes + rope_floats * 4 +
                  38 * 256);
    auto take_f = [&](size_t n) { return reinterpret_cast<float*>(work_.take(n * 4)); };
    x_ = take_f((size_t)T * hp.n_embd);
    xn_ = take_f((size_t)T * hp.n_embd);
    q_ = take_f((size_t)T * hp.q_dim());
    k_ = take_f((size_t)T * hp.kv_dim_k());
    v_ = take_f((size_t)T * hp.kv_dim_v());
    attn_ = take_f((size_t)T * hp.n_head * hp.head_dim_v);
    gate_ = take_f((size_t)T * hp.n_ff);
    up_ = take_f((size_t)T * hp.n_ff);
    partial_ = take_f(partial);
    if (partial_sum_) tp_sum_ = take_f((size_t)T * hp.n_embd);
    if (hp.attn_output_gate) {
      q_full_ = take_f((size_t)T * 2 * hp.q_dim());
      attn_gate_ = take_f((size_t)T * hp.q_dim());
    }
    if (layers.output) logits_ = take_f((size_t)T * hp.n_vocab);
    if (has_delta) {
      dn_qkv_ = take_f((size_t)T * dn.conv_dim());
      dn_z_ = take_f((size_t)T * dn.value_dim());
      dn_alpha_ = take_f((size_t)T * dn.n_v_heads);
      dn_beta_ = take_f((size_t)T * dn.n_v_heads);
      dn_out_ = take_f((size_t)T * dn.value_dim());
      dn_scratch_ = delta_net_scratch(dn, T, dn_chunked_, take_f(delta_net_scratch_floats(dn, T, dn_chunked_)));
    }
    inputs_.init(work_, T, max_cols, stream_);
    if (split_combine_) {  // ROOFLINE_SPLIT_COMBINE=1: decode attention combines in its split kernel
      combine_counters_ = reinterpret_cast<int*>(work_.take(attention_combine_counters(hp.n_head_kv) * 4));
      ROOFLINE_CUDA_CHECK(cudaMemsetAsync(combine_counters_, 0, attention_combine_counters(hp.n_head_kv) * 4, stream_));
    }
    gemm_scratch_ = reinterpret_cast<__half*>(work_.take(gemm_scratch_elems_ * 2));
    // f16 activations of a product; the batched-decode kernel's layout pads the rows to a multiple of 16.
    x_f16_ = reinterpret_cast<__half*>(work_.take((size_t)(T + 15) / 16 * 16 * max_cols * 2));
    step_dev_ = reinterpret_cast<int*>(work_.take(step_ints * 4));
    ROOFLINE_CUDA_CHECK(cudaMallocHost(&step_host_, step_ints * 4));
    if (layers.output) ROOFLINE_CUDA_CHECK(cudaMallocHost(&logits_host_, (size_t)T * hp.n_vocab * 4));
    argmax_dev_ = reinterpret_cast<int32_t*>(work_.take((size_t)T * 4));
    ffn_sync_ = reinterpret_cast<unsigned long long*>(work_.take(8));  // the persistent FFN's grid barrier
    ROOFLINE_CUDA_CHECK(cudaMemsetAsync(ffn_sync_, 0, 8, stream_));
    rope_tables_.init(rope_floats > 0 ? take_f(rope_floats) : nullptr, T, hp.n_rot);
    if (prefill_ok_) {
      prefill_.q16 = x_f16_;
      prefill_.kv16 = reinterpret_cast<__half*>(work_.take((size_t)2 * prefill_.key_tile * kv_dim * 2));
      prefill_.scores = reinterpret_cast<float*>(gemm_scratch_);
      prefill_.score_floats = gemm_scratch_elems_ / 2;
      prefill_.m_state = take_f((size_t)T * hp.n_head);
      prefill_.l_state = take_f((size_t)T * hp.n_head);
      prefill_.o_acc = gate_;
    }
    ROOFLINE_CUDA_CHECK(cudaMallocHost(&argmax_host_, (size_t)T * 4));
    if (hp.is_moe()) moe_ = std::make_unique<MoeFfn>(hp, T, stream_);  // MoE hook (cuda_moe.cuh)
    if (hp.is_moe() && std::count(options_.experts_on_host.begin(), options_.experts_on_host.end(), true) > 0) {
      // MoE hook: experts in host memory run on the CPU between device steps (a host sync: no graphs).
      host_experts_ = std::make_unique<HostExperts>(model_, options_.experts_on_host, options_.n_host_threads);
      ROOFLINE_CUDA_CHECK(cudaMallocHost(&host_rows_, (size_t)T * hp.n_embd * 4 * 2));
      graphs_enabled_ = false;
    }
  }

  void init_kv(const KvConfig& kv) override {
    ROOFLINE_CUDA_CHECK(cudaSetDevice(options_.device));
    const HParams& hp = model_->hparams();
    for (DType t : {kv.type_k, kv.type_v})
      if (t != DType::F32 && t != DType::F16 && t != DType::BF16 && t != DType::Q8_0 && t != DType::Q4_0)
        fail("KV cache type {} is not supported on the GPU", dtype_name(t));
    if ((kv.type_k == DType::Q8_0 || kv.type_k == DType::Q4_0) && hp.head_dim_k % 32)
      fail("KV cache type {} needs a head dimension that is a multiple of 32 (the model's K heads have {})", dtype_name(kv.type_k), hp.head_dim_k);
    if ((kv.type_v == DType::Q8_0 || kv.type_v == DType::Q4_0) && hp.head_dim_v % 32)
      fail("KV cache type {} needs a head dimension that is a multiple of 32 (the model's V heads have {})", dtype_name(kv.type_v), hp.head_dim_v);
    kv_ = kv;
    if (kv.n_blocks > table_capacity_blocks()) fail("internal error: KV blocks exceed the step table capacity");
    const int64_t slots = (int64_t)kv.n_blocks * kv.block_size;
    const int64_t nk = slots * hp.kv_dim_k(), nv = slots * hp.kv_dim_v();
    if (kv.swa_ring % kv.block_size) fail("internal error: the sliding-window ring {} is not a multiple of the block size", kv.swa_ring);
    size_t paged = 0;
    for (LayerDev& d : layer_dev_) {
      d.ring = d.mixer == MixerKind::Attention && kv.swa_ring > 0 && hp.is_sliding(d.il);
      paged += d.mixer == MixerKind::Attention && !d.ring ? 1 : 0;
    }
    kv_arena_.reserve((kv_values_bytes(kv.type_k, nk) + kv_scales_bytes(kv.type_k, nk) + kv_values_bytes(kv.type_v, nv) +
                       kv_scales_bytes(kv.type_v, nv) + 4 * 256) * paged + 256);
    for (LayerDev& d : layer_dev_) {
      if (d.mixer != MixerKind::Attention) continue;
      d.kv.type_k = kv.type_k;
      d.kv.type_v = kv.type_v;
      d.kv.block_size = kv.block_size;
      d.kv.window = hp.attention_window(d.il);  // sliding layers: keys before the window masked
      if (d.ring) continue;  // its ring planes come with the state cells (init_state)
      d.kv.k = kv_arena_.take(kv_values_bytes(kv.type_k, nk));
      d.kv.v = kv_arena_.take(kv_values_bytes(kv.type_v, nv));
      if (kv_scales_bytes(kv.type_k, nk)) d.kv.k_scales = kv_arena_.take(kv_scales_bytes(kv.type_k, nk));
      if (kv_scales_bytes(kv.type_v, nv)) d.kv.v_scales = kv_arena_.take(kv_scales_bytes(kv.type_v, nv));
    }
  }

  void init_state(int n_cells) override {
    ROOFLINE_CUDA_CHECK(cudaSetDevice(options_.device));
    cell_stride_ = (int64_t)(model_->hparams().delta_net.state_floats() + 3) / 4 * 4;
    const size_t cell_bytes = (size_t)cell_stride_ * 4;
    size_t total = 0;
    const HParams& hp = model_->hparams();
    const int64_t ring_slots = (int64_t)n_cells * kv_.swa_ring;
    for (const LayerDev& d : layer_dev_) {
      if (d.mixer == MixerKind::DeltaNet) total += (cell_bytes * n_cells + 255) / 256 * 256;
      if (d.ring) total += kv_plane_bytes(hp, kv_, ring_slots);
    }
    n_state_cells_ = n_cells;
    if (total == 0) return;
    state_arena_.reserve(total + 256);
    const int64_t nk = ring_slots * hp.kv_dim_k(), nv = ring_slots * hp.kv_dim_v();
    for (LayerDev& d : layer_dev_) {
      if (d.mixer == MixerKind::DeltaNet) d.state = reinterpret_cast<float*>(state_arena_.take(cell_bytes * n_cells));
      if (!d.ring) continue;  // a sliding layer's ring: n_cells x swa_ring slots, addressed through swa tables
      d.kv.k = state_arena_.take(kv_values_bytes(kv_.type_k, nk));
      d.kv.v = state_arena_.take(kv_values_bytes(kv_.type_v, nv));
      if (kv_scales_bytes(kv_.type_k, nk)) d.kv.k_scales = state_arena_.take(kv_scales_bytes(kv_.type_k, nk));
      if (kv_scales_bytes(kv_.type_v, nv)) d.kv.v_scales = state_arena_.take(kv_scales_bytes(kv_.type_v, nv));
    }
  }

  void begin_step(const StepDesc& step) override {
    ROOFLINE_CUDA_CHECK(cudaSetDevice(options_.device));
    const HParams& hp = model_->hparams();
    StepPackConfig c;
    c.max_tokens = options_.max_tokens;
    c.layout = step_layout();
    c.max_splits = max_splits_, c.min_span = min_span_, c.span_splits = span_splits_;
    c.prefill_min_keys = prefill_ok_ ? prefill_min_keys(flash_prefill_fits(kv_.type_k, kv_.type_v, hp.head_dim_k, hp.head_dim_v)) : 0;
    c.rings = kv_.swa_ring > 0 && std::any_of(layer_dev_.begin(), layer_dev_.end(), [](const LayerDev& d) { return d.ring; });
    c.swa_ring = kv_.swa_ring, c.kv_block_size = kv_.block_size, c.sliding_window = hp.sliding_window;
    c.n_state_cells = n_state_cells_;
    c.delta_net = dn_qkv_ != nullptr, c.delta_net_chunked = dn_chunked_, c.delta_net_chunked_min_rows = kDeltaNetChunkedMinRows;
    PackedStep p = pack_step(step, c, step_host_, step_dev_, stream_);
    n_real_ = p.n_real, n_tok_ = p.n_tok, splits_ = p.splits, grid_splits_ = p.grid_splits, split_heads_ = p.split_heads, n_attn_rows_ = p.n_attn_rows;
    prefill_runs_ = std::move(p.prefill_runs);
    attn_rows_dev_ = p.attn_rows_dev;
    dstep_ = p.dstep, dstep_swa_ = p.dstep_swa;
    if (c.delta_net) dn_seqs_ = p.dn_seqs, dn_real_seqs_ = p.dn_real_seqs, dn_max_seq_rows_ = p.dn_max_seq_rows, dn_form_ = p.dn_form;
    n_logit_ = (int)step.logit_rows.size();
    (argmax_only_ = step.argmax_only).resize(n_logit_, 0);
    (argmax_allowed_ = step.argmax_allowed).resize(n_logit_, nullptr);
    hidden_rows_ = step.hidden_rows;
    rope_tables_.new_step();
  }

  void embed() override {
    ROOFLINE_CHECK(layers_.embedding, "the GPU backend does not hold the token embedding");
    mark("embedding", 0);
    cuda::embed(embd_, dstep_, x_, n_tok_, model_->hparams().n_embd, stream_);
    if (model_->hparams().embd_scale > 0) scale_values(x_, (int64_t)n_tok_ * model_->hparams().n_embd, model_->hparams().embd_scale, stream_);
  }
  void set_hidden(const float* hidden) override {
    const size_t row = (size_t)model_->hparams().n_embd * 4;
    ROOFLINE_CUDA_CHECK(cudaMemcpyAsync(x_, hidden, (size_t)n_real_ * row, cudaMemcpyHostToDevice, stream_));
    if (n_tok_ > n_real_)
      ROOFLINE_CUDA_CHECK(cudaMemsetAsync(reinterpret_cast<uint8_t*>(x_) + n_real_ * row, 0, (n_tok_ - n_real_) * row, stream_));
  }
  void get_hidden(float* hidden) override {
    ROOFLINE_CUDA_CHECK(cudaMemcpyAsync(hidden, x_, (size_t)n_real_ * model_->hparams().n_embd * 4, cudaMemcpyDeviceToHost, stream_));
    ROOFLINE_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  void forward(int layer_begin, int layer_end) override {
    ROOFLINE_CHECK(layer_begin >= layers_.begin && layer_end <= layers_.end);
    if (layer_begin == layer_end) return;
    forward_end_ = layer_end;  // a layer may prepare the next one's input only inside this range
    attn_input_ready_ = ffn_input_ready_ = false;
    inputs_.reset();  // each forward starts on the first int8 buffer (a captured graph replays the pointers it saw)
    if (n_tok_ > 8 || !graphs_enabled_) {
      if (ahead_) ahead_->begin_step();
      for (int il = layer_begin; il < layer_end; ++il) forward_layer(layer_dev_[il - layers_.begin]);
      if (ahead_) ahead_->end_step();
      return;
    }
    // Decode: one CUDA graph per (bucket, layer range, head split, attention grid), captured on first use and
    // replayed after (grid_splits_ <= 8192: 14 bits).
    const uint64_t key = ((uint64_t)split_heads_ << 62) | ((uint64_t)grid_splits_ << 48) | ((uint64_t)n_tok_ << 40) | ((uint64_t)layer_begin << 20) |
                         (uint64_t)layer_end;
    graphs_.run(key, stream_, [&] {
      for (int il = layer_begin; il < layer_end; ++il) forward_layer(layer_dev_[il - layers_.begin]);
    });
  }

  // Final norm and output matrix into logits_ (device); false when no row wants logits.
  bool compute_logits() {
    ROOFLINE_CHECK(layers_.output, "the GPU backend does not hold the output layer");
    const HParams& hp = model_->hparams();
    if (n_logit_ == 0) {
      ROOFLINE_CUDA_CHECK(cudaStreamSynchronize(stream_));
      return false;
    }
    const bool q8 = matvec_uses_q8(out_.type) && n_logit_ <= 8 && hp.n_embd % 32 == 0;
    mark("output norm + quantize", 0);
    rms_norm(x_, out_norm_, hp.rms_eps, n_logit_, hp.n_embd, dstep_.logit_rows, xn_, q8 ? inputs_.writable() : ActQ8{}, stream_);
    n_quantized_cols_ = q8 ? hp.n_embd : -1;
    mark(op_name("matvec output", out_).c_str(), (double)out_bytes_);
    project(out_, xn_, n_logit_, logits_, hp.n_vocab, false);
    if (hp.final_logit_softcap > 0) softcap(logits_, (int64_t)n_logit_ * hp.n_vocab, hp.final_logit_softcap, stream_);
    n_quantized_cols_ = -1;
    return true;
  }

  void output(float* logits) override {
    if (!compute_logits()) return;
    mark("logits to host", 0);
    const size_t bytes = (size_t)n_logit_ * model_->hparams().n_vocab * 4;
    ROOFLINE_CUDA_CHECK(cudaMemcpyAsync(logits_host_, logits_, bytes, cudaMemcpyDeviceToHost, stream_));
    ROOFLINE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    profiler_.collect(stream_);
    std::memcpy(logits, logits_host_, bytes);
  }

  // Greedy rows get their argmax picked here (only the token comes back); the other rows' logits are
  // copied back packed in row order.
  bool supports_output_argmax() const override { return true; }
  void output_argmax(float* logits, int32_t* tokens) override {
    if (!compute_logits()) return;
    const int n_vocab = model_->hparams().n_vocab;
    mark("argmax + logits to host", 0);
    if (!argmax_masks_.upload(argmax_only_, argmax_allowed_, n_logit_, n_vocab, stream_)) argmax_rows(logits_, n_logit_, n_vocab, argmax_dev_, stream_);
    else argmax_rows_allowed(logits_, n_logit_, n_vocab, argmax_masks_.masks(), argmax_masks_.has_mask(), argmax_dev_, stream_);
    ROOFLINE_CUDA_CHECK(cudaMemcpyAsync(argmax_host_, argmax_dev_, (size_t)n_logit_ * 4, cudaMemcpyDeviceToHost, stream_));
    int packed = 0;
    for (int i = 0; i < n_logit_; ++i) {
      if (argmax_only_[i]) continue;
      ROOFLINE_CUDA_CHECK(cudaMemcpyAsync(logits_host_ + (size_t)packed * n_vocab, logits_ + (size_t)i * n_vocab,
                                          (size_t)n_vocab * 4, cudaMemcpyDeviceToHost, stream_));
      ++packed;
    }
    ROOFLINE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    profiler_.collect(stream_);
    for (int i = 0; i < n_logit_; ++i) tokens[i] = argmax_only_[i] ? argmax_host_[i] : -1;
    if (packed > 0) std::memcpy(logits, logits_host_, (size_t)packed * n_vocab * 4);
  }

  // Embeddings: the output norm of the step's hidden rows (gathered), copied back; no output matrix.
  void output_hidden(float* hidden) override {
    ROOFLINE_CHECK(layers_.output, "the GPU backend does not hold the output layer");
    const int n = (int)hidden_rows_.size();
    if (n == 0) return;
    ROOFLINE_CUDA_CHECK(cudaSetDevice(options_.device));
    const HParams& hp = model_->hparams();
    if (!hidden_rows_dev_) ROOFLINE_CUDA_CHECK(cudaMalloc(&hidden_rows_dev_, (size_t)std::max(1, options_.max_tokens) * 4));
    ROOFLINE_CUDA_CHECK(cudaMemcpyAsync(hidden_rows_dev_, hidden_rows_.data(), (size_t)n * 4, cudaMemcpyHostToDevice, stream_));
    rms_norm(x_, out_norm_, hp.rms_eps, n, hp.n_embd, hidden_rows_dev_, xn_, ActQ8{}, stream_);
    ROOFLINE_CUDA_CHECK(cudaMemcpyAsync(hidden, xn_, (size_t)n * hp.n_embd * 4, cudaMemcpyDeviceToHost, stream_));
    ROOFLINE_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  void copy_kv_block(int src, int dst) override {
    ROOFLINE_CUDA_CHECK(cudaSetDevice(options_.device));
    const HParams& hp = model_->hparams();
    const int64_t bk = (int64_t)kv_.block_size * hp.kv_dim_k(), bv = (int64_t)kv_.block_size * hp.kv_dim_v();
    auto copy = [&](uint8_t* base, size_t bytes_per_block) {
      if (!base || !bytes_per_block) return;
      ROOFLINE_CUDA_CHECK(cudaMemcpyAsync(base + dst * bytes_per_block, base + src * bytes_per_block, bytes_per_block,
                                          cudaMemcpyDeviceToDevice, stream_));
    };
    for (LayerDev& d : layer_dev_) {
      if (d.mixer != MixerKind::Attention || d.ring) continue;
      copy(d.kv.k, kv_values_bytes(kv_.type_k, bk));
      copy(d.kv.v, kv_values_bytes(kv_.type_v, bv));
      copy(d.kv.k_scales, kv_scales_bytes(kv_.type_k, bk));
      copy(d.kv.v_scales, kv_scales_bytes(kv_.type_v, bv));
    }
    ROOFLINE_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  void copy_state(int src, int dst) override {
    ROOFLINE_CHECK(src >= 0 && dst >= 0 && src < n_state_cells_ && dst < n_state_cells_, "state cell out of range");
    ROOFLINE_CUDA_CHECK(cudaSetDevice(options_.device));
    const size_t floats = model_->hparams().delta_net.state_floats();
    for (LayerDev& d : layer_dev_)
      if (d.state)
        ROOFLINE_CUDA_CHECK(cudaMemcpyAsync(d.state + (size_t)dst * cell_stride_, d.state + (size_t)src * cell_stride_, floats * 4,
                                            cudaMemcpyDeviceToDevice, stream_));
    const size_t per_cell = (size_t)(kv_.swa_ring / kv_.block_size);  // sliding layers' rings, a cell's blocks at once
    for (const WindowSnapshots::Plane& p : ring_planes())
      ROOFLINE_CUDA_CHECK(cudaMemcpyAsync(p.base + dst * per_cell * p.block_bytes, p.base + src * per_cell * p.block_bytes,
                                          per_cell * p.block_bytes, cudaMemcpyDeviceToDevice, stream_));
  }

  // The sliding layers' ring planes (K and V values and scales), block by block.
  std::vector<WindowSnapshots::Plane> ring_planes() const {
    const int64_t bk = (int64_t)kv_.block_size * model_->hparams().kv_dim_k(), bv = (int64_t)kv_.block_size * model_->hparams().kv_dim_v();
    std::vector<WindowSnapshots::Plane> planes;
    for (const LayerDev& d : layer_dev_)
      if (d.ring)
        for (auto [base, bytes] : {std::pair{d.kv.k, kv_values_bytes(kv_.type_k, bk)}, std::pair{d.kv.v, kv_values_bytes(kv_.type_v, bv)},
                                   std::pair{d.kv.k_scales, kv_scales_bytes(kv_.type_k, bk)}, std::pair{d.kv.v_scales, kv_scales_bytes(kv_.type_v, bv)}})
          if (base && bytes) planes.push_back({base, bytes});
    return planes;
  }

  void init_snapshots(int n) override {
    window_snapshots_.init(options_.device, ring_planes(), n, kv_.swa_snapshot_blocks, kv_.swa_ring / kv_.block_size, n_state_cells_);
  }
  std::string keep_f16_copies() override {  // of the layers' matrices, not the stacked experts (their own kernels)
    ROOFLINE_CUDA_CHECK(cudaSetDevice(options_.device));
    std::vector<DeviceWeight*> ws;
    for (LayerDev& d : layer_dev_)
      for (size_t i = 0; i < d.mats.size(); ++i)
        if (d.mats[i].data && !is_stacked_experts((LayerTensor)i)) ws.push_back(&d.mats[i]);
    const size_t own = weights_.capacity() + work_.capacity() + kv_arena_.capacity() + state_arena_.capacity() + kCublasWorkspaceBytes;
    const double room = f16_copy_room(options_.margin_bytes, options_.vram_limit_bytes, (double)own, options_.f16_copies_max_bytes);
    const std::string line = make_f16_copies(ws, options_.f16_copies, room, f16_copies_, stream_, options_.device);
    // Every layer matrix has a copy: nothing is left to dequantize ahead, so cuBLAS gets every SM back.
    if (ahead_ && std::all_of(ws.begin(), ws.end(), [](const DeviceWeight* w) { return w->f16 != nullptr; })) {
      ahead_.reset();
      cublasSetSmCountTarget(cublas_, 0);
    }
    return line;
  }
  void save_window(int cell, int first, int n, int snapshot) override { window_snapshots_.save(stream_, cell, first, n, snapshot); }
  void load_window(int snapshot, int cell, int first, int n) override { window_snapshots_.load(stream_, snapshot, cell, first, n); }

  bool supports_partial_sum() const override { return true; }
  void set_partial_sum(PartialSum hook) override {
    ROOFLINE_CHECK(!model_, "the partial-sum hook is set before the model is loaded");
    partial_sum_ = std::move(hook);
  }
  void finish_step() override {
    ROOFLINE_CUDA_CHECK(cudaSetDevice(options_.device));
    ROOFLINE_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void set_matmul_observer(MatmulObserver observer) override {
    if (observer) fail("importance matrices are collected on the CPU backend (run imatrix with -ngl 0)");
  }

 private:
  // A layer on the device: its matrices (uploaded in the kernels' layout) and f32 vectors by role.
  struct LayerDev {
    MixerKind mixer = MixerKind::Attention;
    std::array<DeviceWeight, kLayerTensorCount> mats{};
    std::array<size_t, kLayerTensorCount> mat_bytes{};  // bytes in the file (what a product reads)
    std::array<float*, kLayerTensorCount> vecs{};
    KvLayer kv;
    float* state = nullptr;  // DeltaNet layers: n_cells x state_floats
    int il = 0;              // the model's layer index (per-layer RoPE base on sliding-window layers)
    bool ring = false;       // a sliding layer kept in rings per state cell (KvConfig::swa_ring), not paged
    const DeviceWeight& m(LayerTensor t) const { return mats[(size_t)t]; }
    double bytes(LayerTensor t) const { return (double)mat_bytes[(size_t)t]; }
    float* v(LayerTensor t) const { return vecs[(size_t)t]; }
  };

  // MoE hook: whether a layer's tensor stays in host memory (its stacked experts, --cpu-moe and the like).
  bool expert_on_host(int il, LayerTensor role) const {
    return is_stacked_experts(role) && il < (int)options_.experts_on_host.size() && options_.experts_on_host[(size_t)il];
  }

  int table_capacity_blocks() const {
    const int64_t bs = std::max(1, std::min(16, options_.kv_block_size));  // smaller blocks need longer tables
    return (int)(((int64_t)options_.n_ctx + bs - 1) / bs + 2);
  }
  StepLayout step_layout() const {
    return StepLayout::make(options_.max_tokens, table_capacity_blocks(), model_ && model_->hparams().has_sliding_layers());
  }
  size_t step_capacity_ints() const { return (size_t)step_layout().capacity; }

  // Profiling (ROOFLINE_PROFILE=1, CUDA graphs off; cuda_step_profiler.cuh): an event before each op.
  void mark(const char* op, double bytes) { profiler_.mark(stream_, op, bytes, n_tok_); }
  static std::string op_name(const char* what, const DeviceWeight& w) { return fmt::format("{} {}", what, dtype_name(w.type)); }

  // Decode epilogues (ProductInputs): whether a product of this step can write the normed input of
  // `consumers` (each reads int8 activations of the n_embd columns; nulls are skipped).
  using Consumers = std::array<const DeviceWeight*, 4>;
  bool fuses_input(const Consumers& consumers) const {
    if (!inputs_.enabled() || n_tok_ > ProductInputs::kDecodeRows || model_->hparams().n_embd % 32 != 0) return false;
    for (const DeviceWeight* w : consumers)
      if (w && w->data && !matvec_uses_q8(w->type)) return false;
    return true;
  }
  Consumers ffn_inputs(const LayerDev& L) const { return {&L.m(LayerTensor::FfnGate), &L.m(LayerTensor::FfnUp), nullptr, nullptr}; }
  Consumers mixer_inputs(const LayerDev& L) const {
    using LT = LayerTensor;
    if (L.mixer == MixerKind::Attention) return {&L.m(LT::AttnQ), &L.m(LT::AttnK), &L.m(LT::AttnV), nullptr};
    return {&L.m(LT::SsmQkv), &L.m(LT::SsmGate), &L.m(LT::SsmAlpha), &L.m(LT::SsmBeta)};
  }
  // The layer after L when this forward() runs it too (a layer may prepare only such a layer's input).
  LayerDev* next_layer_here(LayerDev& L) {
    const int il = (int)(&L - layer_dev_.data()) + layers_.begin;
    return il + 1 < forward_end_ ? &L + 1 : nullptr;
  }
  void take_input(const MatvecEpilogue& ep, int cols) {
    inputs_.take(ep);
    n_quantized_cols_ = cols;
  }

  // The int8 form of x for a decode matvec over w, unless the current input already holds it.
  void quantize_input(const DeviceWeight& w, const float* x, int n) {
    if (matvec_uses_q8(w.type) && n_quantized_cols_ != w.cols) quantize_rows(x, n, (int)w.cols, inputs_.writable(), stream_);
  }

  // y (+)= W x for the step's rows: matvec for decode-sized steps, GEMM beyond. With an epilogue (decode
  // only), its output is the next product's input (`next_cols` wide) after the launch.
  // x_ready: x_f16_ already holds x; x16: x as f16 rows is there instead (prompt GEMMs only: gemm_takes_f16).
  void project(const DeviceWeight& w, const float* x, int n, float* y, int ldy, bool accumulate, const MatvecEpilogue& ep = {},
               int next_cols = -1, bool x_ready = false, __half* x16 = nullptr) {
    if (n <= 8) {
      quantize_input(w, x, n);
      matvec(w, inputs_.current(), x, n, y, ldy, accumulate, stream_, ep);
      if (ep.kind != MatvecEpilogue::Kind::None) take_input(ep, next_cols);
    } else {
      if (ep.kind != MatvecEpilogue::Kind::None) fail("internal error: a decode epilogue on a product of {} rows", n);
      gemm(cublas_, w, x, n, y, ldy, accumulate, gemm_scratch_, gemm_scratch_elems_, x16 ? x16 : x_f16_, stream_, x_ready || x16,
           ahead_.get());
    }
  }

  // Whether a product of n rows goes through cuBLAS with its input converted to f16 rows in x_f16_ (so
  // products of one input convert it once, and SwiGLU can write down's input as f16 directly).
  // ROOFLINE_F16_INPUT_REUSE=0 converts for every product.
  static bool gemm_takes_f16(const DeviceWeight& w, int n) {
    static const bool on = env_switch("ROOFLINE_F16_INPUT_REUSE", true);
    return on && n > 8 && !gemm_fuses_dequant(w, n);
  }
  // A block's pre-norm, xn_ = rmsnorm(x_) * w (and its int8 form when q8) for the products of `first`'s
  // input; on prompt steps where `first` takes an f16 input, x_f16_ too. Returns the columns x_f16_ then
  // holds (project_group's f16_cols), or -1.
  int64_t pre_norm(const char* what, const float* w, bool q8, const DeviceWeight& first) {
    const HParams& hp = model_->hparams();
    mark(what, 0);
    __half* x16 = f16_outputs_ && gemm_takes_f16(first, n_tok_) ? x_f16_ : nullptr;
    return rms_norm(x_, w, hp.rms_eps, n_tok_, hp.n_embd, nullptr, xn_, q8 ? inputs_.writable() : ActQ8{}, stream_, x16) ? hp.n_embd : -1;
  }

  // Products of one input (q/k/v, gate/up): for decode-sized steps, those matvec_can_join joins go out
  // as one launch; for batched decode (9-64 rows), those of one fused kind (gemm_can_join); otherwise
  // one project() each. ROOFLINE_GEMM_JOIN=0 keeps the batched products apart.
  struct Product {
    const char* what;
    const DeviceWeight* w;
    double bytes;
    float* y;
    int ldy;
  };
  // f16_cols: x_f16_ holds x already, as rows of this many values (a prompt norm wrote it).
  void project_group(std::initializer_list<Product> products, const float* x, int n, int64_t f16_cols = -1) {
    const Product* p = products.begin();
    const size_t count = products.size();
    int64_t converted_cols = f16_cols;  // x_f16_ holds x as rows of this many values (prompt GEMMs)
    for (size_t i = 0; i < count;) {
      size_t j = i + 1;
      if (n <= 8)
        while (j < count && j - i < kMatvecGroupMax && matvec_can_join(*p[i].w, *p[j].w)) ++j;
      else
        while (j < count && j - i < kMatvecGroupMax && gemm_can_join(*p[i].w, *p[j].w, n)) ++j;
      if (j - i == 1) {
        mark(op_name(fmt::format("matvec {}", p[i].what).c_str(), *p[i].w).c_str(), p[i].bytes);
        const bool f16 = gemm_takes_f16(*p[i].w, n);
        project(*p[i].w, x, n, p[i].y, p[i].ldy, false, {}, -1, f16 && converted_cols == p[i].w->cols);
        converted_cols = f16 ? p[i].w->cols : -1;
      } else {
        converted_cols = -1;
        std::string names;
        double bytes = 0;
        const DeviceWeight* ws[kMatvecGroupMax];
        float* ys[kMatvecGroupMax];
        int lds[kMatvecGroupMax];
        for (size_t k = i; k < j; ++k) {
          names += (k > i ? "+" : "") + std::string(p[k].what);
          bytes += p[k].bytes;
          ws[k - i] = p[k].w;
          ys[k - i] = p[k].y;
          lds[k - i] = p[k].ldy;
        }
        mark(op_name(fmt::format("matvec {}", names).c_str(), *p[i].w).c_str(), bytes);
        if (n > 8) {
          gemm_multi(ws, ys, lds, (int)(j - i), x, n, gemm_scratch_, gemm_scratch_elems_, x_f16_, stream_);
        } else {
          quantize_input(*p[i].w, x, n);
          matvec_multi(ws, ys, lds, (int)(j - i), inputs_.current(), x, n, false, stream_);
        }
      }
      i = j;
    }
  }

  // A layer: norm -> mixer (attention or Gated DeltaNet) -> residual, then the FFN block.
  void forward_layer(LayerDev& L) {
    if (L.mixer == MixerKind::Attention) attention_block(L);
    else delta_net_block(L);
    ffn_block(L);
  }

  bool needs_q8(std::initializer_list<const DeviceWeight*> ws) const {
    if (n_tok_ > 8) return false;
    for (auto* w : ws)
      if (matvec_uses_q8(w->type)) return true;
    return false;
  }

  void attention_block(LayerDev& L) {
    using LT = LayerTensor;
    const HParams& hp = model_->hparams();
    const int n = n_tok_;
    // Attention block.
    const bool q8_in = attn_takes_q8(L);
    // (else the previous layer's post-norm kernel wrote the input)
    const int64_t f16_cols = attn_input_ready_ ? -1 : pre_norm("attn norm + quantize", L.v(LT::AttnNorm), q8_in, L.m(LT::AttnQ));
    attn_input_ready_ = false;
    n_quantized_cols_ = q8_in ? hp.n_embd : -1;
    const bool gated = hp.attn_output_gate;
    project_group({{"q", &L.m(LT::AttnQ), L.bytes(LT::AttnQ), gated ? q_full_ : q_, gated ? 2 * hp.q_dim() : hp.q_dim()},
                   {"k", &L.m(LT::AttnK), L.bytes(LT::AttnK), k_, hp.kv_dim_k()},
                   {"v", &L.m(LT::AttnV), L.bytes(LT::AttnV), v_, hp.kv_dim_v()}},
                  xn_, n, f16_cols);
    mark("bias + rope + kv store", 0);
    if (gated) split_q_gate(q_full_, n, hp.n_head, hp.head_dim_k, q_, attn_gate_, stream_);
    add_bias(q_, L.v(LT::AttnQBias), n, hp.q_dim(), stream_);
    add_bias(k_, L.v(LT::AttnKBias), n, hp.kv_dim_k(), stream_);
    add_bias(v_, L.v(LT::AttnVBias), n, hp.kv_dim_v(), stream_);
    const DeviceStep& st = L.ring ? dstep_swa_ : dstep_;  // ring layers address their rings through swa tables
    rope_and_store(st, q_, k_, v_, L.v(LT::AttnQNorm), L.v(LT::AttnKNorm), rope_factors_, n, hp.n_head, hp.n_head_kv, hp.head_dim_k,
                   hp.head_dim_v, hp.n_rot, model_->arch().rope_style == RopeStyle::Neox, hp.rope_base(L.il),
                   hp.rope_scale(L.il), hp.rms_eps, L.kv, stream_,
                   rope_tables_.get(st, n, rope_factors_, hp.rope_base(L.il), hp.rope_scale(L.il), stream_));
    const float scale = hp.attn_scale > 0 ? hp.attn_scale : 1.0f / std::sqrt((float)hp.head_dim_k);
    mark("attention (+quantize)", 0);
    const bool q8_attn = needs_q8({&L.m(LT::AttnOut)});
    // Prompt steps whose rows all take the prefill kernels write o's f16 input there (in attn_'s space).
    __half* attn16 = !gated && n_attn_rows_ == 0 && !prefill_runs_.empty() && gemm_takes_f16(L.m(LT::AttnOut), n) && f16_outputs_
                         ? reinterpret_cast<__half*>(attn_) : nullptr;
    if (!prefill_attention(cublas_, st, prefill_runs_, q_, n, L.kv, hp.n_head, hp.n_head_kv, hp.head_dim_k, hp.head_dim_v, scale,
                           prefill_, attn_, stream_, attn16))
      attn16 = nullptr;
    bool quantized = attention(st, q_, L.kv, n_attn_rows_, hp.n_head, hp.n_head_kv, hp.head_dim_k, hp.head_dim_v, scale,
                               splits_, partial_, attn_, q8_attn && !gated ? inputs_.writable() : ActQ8{}, attn_rows_dev_, stream_,
                               combine_counters_, split_heads_, grid_splits_);
    if (gated) {  // attn *= sigmoid(gate), then its int8 form for the output product
      mark("output gate (+quantize)", 0);
      quantized = q8_attn && hp.q_dim() % 32 == 0;
      output_gate(attn_gate_, attn_, n, hp.q_dim(), quantized ? inputs_.writable() : ActQ8{}, stream_);
    }
    n_quantized_cols_ = quantized ? hp.n_head * hp.head_dim_v : -1;
    mark(op_name("matvec o", L.m(LT::AttnOut)).c_str(), L.bytes(LT::AttnOut));
    if (partial_sum_) {  // -sm row: this slice's share of o, summed over the slices, then the residual add
      project(L.m(LT::AttnOut), attn_, n, tp_sum_, hp.n_embd, false, {}, -1, false, attn16);
      sum_partials();
      if (float* post = L.v(LT::AttnPostNorm)) {
        const bool q8_ffn = ffn_takes_q8(L);
        ffn_input_ready_ = post_norm_add(tp_sum_, post, xn_, L.v(LT::FfnNorm), q8_ffn);
      } else {
        add_values(x_, tp_sum_, (int64_t)n * hp.n_embd, stream_);
      }
    } else if (float* post = L.v(LT::AttnPostNorm)) {  // gemma: x += rmsnorm(o) * w (gate_ is free until the FFN)
      project(L.m(LT::AttnOut), attn_, n, gate_, hp.n_embd, false, {}, -1, false, attn16);
      // Decode steps: the FFN's pre-norm (and its int8 form) in the same kernel.
      const bool q8_ffn = !moe_ && ffn_takes_q8(L);
      ffn_input_ready_ = post_norm_add(gate_, post, xn_, moe_ ? nullptr : L.v(LT::FfnNorm), q8_ffn);
    } else if (!moe_ && fuses_input(ffn_inputs(L))) {  // x += o, and the FFN's normed input (decode)
      mark(op_name("matvec o + ffn norm", L.m(LT::AttnOut)).c_str(), L.bytes(LT::AttnOut));
      project(L.m(LT::AttnOut), attn_, n, x_, hp.n_embd, true, inputs_.norm(L.v(LT::FfnNorm), hp.rms_eps), hp.n_embd);
      ffn_input_ready_ = true;
    } else {
      project(L.m(LT::AttnOut), attn_, n, x_, hp.n_embd, true, {}, -1, false, attn16);
    }
  }

  // -sm row: tp_sum_ (this slice's part of a block's output) becomes the sum over the slices.
  void sum_partials() {
    mark("partial sum", 0);
    partial_sum_(tp_sum_, (size_t)n_tok_ * model_->hparams().n_embd, stream_);
  }

  // x += rmsnorm(y) * w over the step's rows, through `tmp` ([rows x n_embd]). With next_norm, decode
  // steps also write xn_ = rmsnorm(x) * next_norm (and the int8 input when q8) in the same kernel; returns whether
  // it did (the caller then skips that norm).
  bool post_norm_add(const float* y, const float* w, float* tmp, const float* next_norm = nullptr, bool q8 = false) {
    const HParams& hp = model_->hparams();
    if (post_norm_add_fits(n_tok_, hp.n_embd)) {
      mark(next_norm ? "post norm + residual + norm" : "post norm + residual", 0);
      cuda::post_norm_add(y, w, hp.rms_eps, n_tok_, hp.n_embd, x_, next_norm, next_norm ? xn_ : nullptr, next_norm && q8 ? inputs_.writable() : ActQ8{},
                          stream_);
      if (next_norm) n_quantized_cols_ = q8 ? hp.n_embd : -1;
      return next_norm != nullptr;
    }
    mark("post norm + residual", 0);
    rms_norm(y, w, hp.rms_eps, n_tok_, hp.n_embd, nullptr, tmp, ActQ8{}, stream_);
    add_values(x_, tmp, (int64_t)n_tok_ * hp.n_embd, stream_);
    return false;
  }

  bool attn_takes_q8(LayerDev& L) const {
    using LT = LayerTensor;
    return needs_q8({&L.m(LT::AttnQ), &L.m(LT::AttnK), &L.m(LT::AttnV)}) && model_->hparams().n_embd % 32 == 0;
  }
  bool ffn_takes_q8(LayerDev& L) const {
    using LT = LayerTensor;
    return needs_q8({&L.m(LT::FfnGate), &L.m(LT::FfnUp)}) && model_->hparams().n_embd % 32 == 0;
  }

  // A one-row step's dense SwiGLU block as one persistent launch (cuda_decode_ffn.cu) where it fits.
  bool persistent_ffn(LayerDev& L) {
    using LT = LayerTensor;
    if (!ffn_ctas_ || !persistent_ffn_on() || partial_sum_ || inputs_.enabled() || ffn_input_ready_ || L.v(LT::FfnPostNorm) ||
        model_->arch().ffn == FfnKind::GeGLU || !decode_ffn_fits(L.m(LT::FfnGate), L.m(LT::FfnUp), L.m(LT::FfnDown), ffn_ctas_))
      return false;
    mark(op_name("ffn (one launch)", L.m(LT::FfnGate)).c_str(), L.bytes(LT::FfnGate) + L.bytes(LT::FfnUp) + L.bytes(LT::FfnDown));
    decode_ffn({L.m(LT::FfnGate), L.m(LT::FfnUp), L.m(LT::FfnDown), L.v(LT::FfnNorm), model_->hparams().rms_eps, x_, gate_, ffn_sync_}, ffn_ctas_,
               stream_);
    n_quantized_cols_ = -1;
    return true;
  }
  // Feed-forward block: norm -> gate/up -> SwiGLU -> down (+ residual).
  void ffn_block(LayerDev& L) {
    using LT = LayerTensor;
    const HParams& hp = model_->hparams();
    const int n = n_tok_;
    if (moe_) {  // MoE hook: norm, then routing, experts and shared expert on the device (cuda_moe.cuh)
      mark("moe ffn", 0);
      rms_norm(x_, L.v(LT::FfnNorm), hp.rms_eps, n, hp.n_embd, nullptr, xn_, moe_->input_act(), stream_);
      const bool shared = L.m(LT::FfnGateShexp).data != nullptr;
      const MoeLayerDev layer{&L.m(LT::FfnGateInp), &L.m(LT::FfnGateExps), &L.m(LT::FfnUpExps), &L.m(LT::FfnDownExps),
                              shared ? &L.m(LT::FfnGateShexp) : nullptr, shared ? &L.m(LT::FfnUpShexp) : nullptr,
                              shared ? &L.m(LT::FfnDownShexp) : nullptr, L.v(LT::FfnGateInpShexp)};
      const int il = (int)(&L - layer_dev_.data()) + layers_.begin;
      if (host_experts_ && host_experts_->holds(il)) moe_->forward_on_host(layer, *host_experts_, il, xn_, n, x_, host_rows_, stream_);
      else moe_->forward(layer, xn_, n, x_, stream_);
      return;
    }
    if (n == 1 && persistent_ffn(L)) return;
    const bool q8_ffn = ffn_takes_q8(L);
    // (else the attention block's post-norm kernel wrote the input)
    const int64_t f16_cols = ffn_input_ready_ ? -1 : pre_norm("ffn norm + quantize", L.v(LT::FfnNorm), q8_ffn, L.m(LT::FfnGate));
    ffn_input_ready_ = false;
    n_quantized_cols_ = q8_ffn ? hp.n_embd : -1;
    const bool q8_down = needs_q8({&L.m(LT::FfnDown)}) && hp.n_ff % 32 == 0;
    const DeviceWeight &gate = L.m(LT::FfnGate), &up = L.m(LT::FfnUp);
    const bool gelu_ffn = model_->arch().ffn == FfnKind::GeGLU;
    bool down_f16 = false;  // x_f16_ holds down's input (then gate_ does not)
    if (inputs_.enabled() && n <= 8 && q8_down && matvec_can_group(gate, up)) {
      // Decode: gate and up in one launch whose epilogue writes SwiGLU's (GeGLU's) int8 output (down's input).
      mark(op_name(gelu_ffn ? "matvec gate+up + geglu" : "matvec gate+up + swiglu", gate).c_str(), L.bytes(LT::FfnGate) + L.bytes(LT::FfnUp));
      quantize_input(gate, xn_, n);
      const DeviceWeight* ws[2] = {&gate, &up};
      float* ys[2] = {gate_, up_};
      const int lds[2] = {(int)hp.n_ff, (int)hp.n_ff};
      const MatvecEpilogue ep = inputs_.gated(gelu_ffn);
      matvec_multi(ws, ys, lds, 2, inputs_.current(), xn_, n, false, stream_, ep);
      take_input(ep, (int)hp.n_ff);
    } else {
      project_group({{"gate", &gate, L.bytes(LT::FfnGate), gate_, hp.n_ff}, {"up", &up, L.bytes(LT::FfnUp), up_, hp.n_ff}}, xn_, n,
                    f16_cols);
      // Prompt steps: down's f16 input straight from the gated product (no f32 copy, no conversion).
      down_f16 = gemm_takes_f16(L.m(LT::FfnDown), n);
      float* h32 = down_f16 ? nullptr : gate_;
      __half* h16 = down_f16 ? x_f16_ : nullptr;
      if (gelu_ffn) {
        mark("geglu + quantize", 0);
        geglu(gate_, up_, n, hp.n_ff, h32, q8_down ? inputs_.writable() : ActQ8{}, stream_, h16);
      } else {
        mark("swiglu + quantize", 0);
        swiglu(gate_, up_, n, hp.n_ff, h32, q8_down ? inputs_.writable() : ActQ8{}, stream_, h16);
      }
      n_quantized_cols_ = q8_down ? hp.n_ff : -1;
    }
    mark(op_name("matvec down", L.m(LT::FfnDown)).c_str(), L.bytes(LT::FfnDown));
    if (partial_sum_) {  // -sm row: this slice's share of down, summed over the slices, then the residual add
      project(L.m(LT::FfnDown), gate_, n, tp_sum_, hp.n_embd, false, {}, -1, down_f16);
      sum_partials();
      if (float* post = L.v(LT::FfnPostNorm)) {
        LayerDev* next = next_layer_here(L);
        if (next && next->mixer != MixerKind::Attention) next = nullptr;
        attn_input_ready_ = post_norm_add(tp_sum_, post, xn_, next ? next->v(LT::AttnNorm) : nullptr, next && attn_takes_q8(*next));
      } else {
        add_values(x_, tp_sum_, (int64_t)n * hp.n_embd, stream_);
      }
    } else if (float* post = L.v(LT::FfnPostNorm)) {  // gemma: x += rmsnorm(down) * w (xn_ and up_ are free here)
      project(L.m(LT::FfnDown), gate_, n, xn_, hp.n_embd, false, {}, -1, down_f16);
      // Decode steps: the next layer's attention pre-norm in the same kernel, when that layer is here.
      LayerDev* next = next_layer_here(L);
      if (next && next->mixer != MixerKind::Attention) next = nullptr;
      attn_input_ready_ = post_norm_add(xn_, post, up_, next ? next->v(LT::AttnNorm) : nullptr, next && attn_takes_q8(*next));
    } else if (LayerDev* next = next_layer_here(L); next && fuses_input(mixer_inputs(*next))) {
      // x += down, and the next layer's normed input (decode).
      mark(op_name("matvec down + attn norm", L.m(LT::FfnDown)).c_str(), L.bytes(LT::FfnDown));
      project(L.m(LT::FfnDown), gate_, n, x_, hp.n_embd, true, inputs_.norm(next->v(LT::AttnNorm), hp.rms_eps), hp.n_embd);
      attn_input_ready_ = true;
    } else {
      project(L.m(LT::FfnDown), gate_, n, x_, hp.n_embd, true, {}, -1, down_f16);
    }
    n_quantized_cols_ = -1;
  }

  // Gated DeltaNet: norm -> qkv/z/alpha/beta projections -> the mixer (cuda_delta_net.cuh; the
  // sequences' states in their cells) -> ssm_out (+ residual).
  void delta_net_block(LayerDev& L) {
    using LT = LayerTensor;
    const HParams& hp = model_->hparams();
    const DeltaNetDims& d = hp.delta_net;
    const int n = n_tok_;
    const bool q8_in = needs_q8({&L.m(LT::SsmQkv), &L.m(LT::SsmGate), &L.m(LT::SsmAlpha), &L.m(LT::SsmBeta)}) && hp.n_embd % 32 == 0;
    // (else the previous layer's down product wrote the input)
    const int64_t f16_cols = attn_input_ready_ ? -1 : pre_norm("attn norm + quantize", L.v(LT::AttnNorm), q8_in, L.m(LT::SsmQkv));
    attn_input_ready_ = false;
    n_quantized_cols_ = q8_in ? hp.n_embd : -1;
    project_group({{"qkv", &L.m(LT::SsmQkv), L.bytes(LT::SsmQkv), dn_qkv_, d.conv_dim()},
                   {"z", &L.m(LT::SsmGate), L.bytes(LT::SsmGate), dn_z_, d.value_dim()},
                   {"alpha", &L.m(LT::SsmAlpha), L.bytes(LT::SsmAlpha), dn_alpha_, d.n_v_heads},
                   {"beta", &L.m(LT::SsmBeta), L.bytes(LT::SsmBeta), dn_beta_, d.n_v_heads}},
                  xn_, n, f16_cols);
    DeltaNetLayerDev layer;
    layer.conv = L.v(LT::SsmConv);
    layer.dt_bias = L.v(LT::SsmDtBias);
    layer.a = L.v(LT::SsmA);
    layer.norm = L.v(LT::SsmNorm);
    layer.state = L.state;
    layer.cell_stride = cell_stride_;
    const bool q8_out = needs_q8({&L.m(LT::SsmOut)}) && d.value_dim() % 32 == 0;
    mark(dn_form_ == DeltaNetForm::Chunked ? "delta net (chunked)" : "delta net (recurrent)",
         (double)dn_real_seqs_ * d.ssm_state_floats() * 8);
    delta_net_forward(d, layer, hp.rms_eps, dn_seqs_, n, dn_form_, dn_max_seq_rows_, dn_qkv_, dn_z_, dn_alpha_, dn_beta_,
                      dn_scratch_, dn_out_, q8_out ? inputs_.writable() : ActQ8{}, stream_);
    n_quantized_cols_ = q8_out ? d.value_dim() : -1;
    if (!moe_ && fuses_input(ffn_inputs(L))) {  // x += ssm_out, and the FFN's normed input (decode)
      mark(op_name("matvec ssm_out + ffn norm", L.m(LT::SsmOut)).c_str(), L.bytes(LT::SsmOut));
      project(L.m(LT::SsmOut), dn_out_, n, x_, hp.n_embd, true, inputs_.norm(L.v(LT::FfnNorm), hp.rms_eps), hp.n_embd);
      ffn_input_ready_ = true;
    } else {
      mark(op_name("matvec ssm_out", L.m(LT::SsmOut)).c_str(), L.bytes(LT::SsmOut));
      project(L.m(LT::SsmOut), dn_out_, n, x_, hp.n_embd, true);
      n_quantized_cols_ = -1;
    }
  }

  GpuBackendOptions options_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  std::shared_ptr<const Model> model_;
  LayerSet layers_;
  KvConfig kv_;
  DeviceArena weights_, work_, kv_arena_, state_arena_, f16_copies_;
  int n_state_cells_ = 0;
  WindowSnapshots window_snapshots_;  // prompt-cache snapshots of the rings, in pinned host memory
  std::vector<LayerDev> layer_dev_;
  DeviceWeight embd_, out_;
  float* out_norm_ = nullptr;
  float* rope_factors_ = nullptr;
  float *x_ = nullptr, *xn_ = nullptr, *q_ = nullptr, *k_ = nullptr, *v_ = nullptr, *attn_ = nullptr, *gate_ = nullptr,
        *up_ = nullptr, *partial_ = nullptr, *logits_ = nullptr;
  float* tp_sum_ = nullptr;  // -sm row: a block's partial output, summed over the slices by partial_sum_
  PartialSum partial_sum_;
  float *q_full_ = nullptr, *attn_gate_ = nullptr;  // gated attention: the Q projection, the gate split from it
  // DeltaNet layers: in-projections, the mixer's output and scratch, the step's sequence records.
  float *dn_qkv_ = nullptr, *dn_z_ = nullptr, *dn_alpha_ = nullptr, *dn_beta_ = nullptr, *dn_out_ = nullptr;
  DeltaNetScratch dn_scratch_;
  DeltaNetSeqs dn_seqs_;
  bool dn_chunked_ = false;
  DeltaNetForm dn_form_ = DeltaNetForm::Recurrent;
  int dn_max_seq_rows_ = 1, dn_real_seqs_ = 0;
  int64_t cell_stride_ = 0;  // floats between state cells (16-byte aligned)
  // Runs of at least this many rows of one sequence take the chunked (tensor-core) form.
  static constexpr int kDeltaNetChunkedMinRows = 64;
  ProductInputs inputs_;        // the int8 inputs of the products (two buffers: decode epilogues)
  int n_quantized_cols_ = -1;  // inputs_.current() holds the current input quantized (row length), or -1
  __half* gemm_scratch_ = nullptr;
  __half* x_f16_ = nullptr;
  // Prompt norms and prompt attention write the next products' f16 inputs themselves (instead of an f32
  // output that gemm converts); ROOFLINE_F16_OUTPUTS=0, read when the backend is created, converts.
  const bool f16_outputs_ = env_switch("ROOFLINE_F16_OUTPUTS", true);
  size_t gemm_scratch_elems_ = 0;
  int* step_dev_ = nullptr;
  int* step_host_ = nullptr;
  float* logits_host_ = nullptr;
  int32_t* argmax_dev_ = nullptr;   // per logit row: its greedy token (output_argmax)
  int32_t* argmax_host_ = nullptr;
  std::vector<uint8_t> argmax_only_;  // the step's per-logit-row flags
  std::vector<const uint64_t*> argmax_allowed_;  // and masks (constrained greedy rows; host memory)
  ArgmaxMasks argmax_masks_;                     // their device copy
  std::vector<int32_t> hidden_rows_;  // the step's rows wanting their final hidden state (output_hidden)
  int* hidden_rows_dev_ = nullptr;    // their device copy (allocated on first use)
  DeviceStep dstep_;
  DeviceStep dstep_swa_;  // dstep_ with the swa tables as block tables (ring layers)
  int n_tok_ = 0, n_real_ = 0, n_logit_ = 0, max_splits_ = 1, splits_ = 1, grid_splits_ = 1, min_span_ = 32, span_splits_ = 32;
  // Prefill attention: runs of this step, the other rows (device list) and their count.
  bool prefill_ok_ = false;
  cuda::PrefillScratch prefill_;
  std::vector<cuda::PrefillRun> prefill_runs_;
  const int* attn_rows_dev_ = nullptr;
  bool ffn_input_ready_ = false;   // xn_ (and the int8 input) already hold the FFN's normalized input (post_norm_add)
  bool attn_input_ready_ = false;  // ... the next attention block's (post_norm_add at the end of a gemma layer)
  int forward_end_ = 0;            // the layer range's end of the running forward()
  int n_attn_rows_ = 0;
  bool split_combine_ = false;         // decode attention merges its splits in the split kernel
  bool split_heads_ = false;           // the step's attention splits query-head groups (AttentionPlan::split_heads)
  int* combine_counters_ = nullptr;    // ... with these counters (attention())
  unsigned long long* ffn_sync_ = nullptr;  // persistent_ffn's barrier counter, and its CTAs (0: not on this GPU)
  const int ffn_ctas_ = cuda::decode_ffn_ctas(options_.device);
  bool graphs_enabled_ = true;
  int ahead_slots_ = 0;
  RopeTables rope_tables_;  // prompt steps' rotations
  std::unique_ptr<DequantAhead> ahead_;  // ROOFLINE_DEQUANT_AHEAD
  static constexpr size_t kCublasWorkspaceBytes = (size_t)32 << 20;
  void* cublas_workspace_ = nullptr;
  StepProfiler profiler_;
  size_t out_bytes_ = 0;
  GraphCache graphs_;  // decode graphs (destroyed after ~CudaBackend's body, which makes this device current)
  std::unique_ptr<MoeFfn> moe_;  // MoE hook: mixture-of-experts models only
  std::unique_ptr<HostExperts> host_experts_;  // MoE hook: experts kept in host memory, run on the CPU
  float* host_rows_ = nullptr;                 // pinned: the normed rows out, the experts' output back
};

}  // namespace
}  // namespace roofline::cuda

auto roofline::make_gpu_backend(const GpuBackendOptions& options) -> std::unique_ptr<Backend> {
  auto devices = gpu_devices();
  if (devices.empty()) fail("no CUDA GPU found");
  if (options.device < 0 || options.device >= (int)devices.size()) fail("GPU {} does not exist ({} found)", options.device, devices.size());
  const GpuInfo& g = devices[options.device];
  if (!g.has_kernel_image)
    fail("this binary has no kernels for {} (compute capability {}.{}; compiled for {}): rebuild with "
         "-DROOFLINE_CUDA_ARCHITECTURES={}{}",
         g.name, g.cc_major, g.cc_minor, ROOFLINE_CUDA_ARCHS, g.cc_major, g.cc_minor);
  return std::make_unique<cuda::CudaBackend>(options);
}
