// The CUDA backend's lifecycle (cuda_backend.cuh): the device, stream and cuBLAS; weights, KV blocks, recurrent
// state and scratch in device memory; a step's descriptor, its forward over a layer range (captured as a CUDA
// graph for decode steps), logits and greedy tokens; cell copies and window snapshots. The layers' forward is in
// cuda_backend_layers.cu.
#include "backend/cuda/cuda_backend.cuh"

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace roofline::cuda {

namespace {

// x_f16_'s halves: a product's f16 activations, rows padded to a multiple of 16 (prompt GEMMs), or the warpgroup
// kernel's tiles of up to 64 rows, in both layouts (Q4_K: 17 k16 steps a super-block, Q6_K: 18; wg_tiles_halves).
size_t x_f16_elems(int T, int64_t max_cols) {
  return std::max<size_t>((size_t)(T + 15) / 16 * 16 * max_cols, (size_t)wg_tiles_both_halves(max_cols / 256 * 256, 64));
}

}  // namespace

CudaBackend::CudaBackend(const GpuBackendOptions& options) : options_(options) {
  int count = 0;
  ROOFLINE_CUDA_CHECK(cudaGetDeviceCount(&count));
  if (options.device < 0 || options.device >= count) fail("GPU {} does not exist ({} found)", options.device, count);
  ROOFLINE_CUDA_CHECK(cudaSetDevice(options.device));
  matvec_query_waves();  // occupancy queries: here, not first inside a decode step's graph capture
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
  // Read per backend (the tests switch it between engines). Off: written, not yet measured (docs/performance.md).
  batched_graphs_ = env_switch("ROOFLINE_BATCHED_GRAPHS", true);
  batched_buckets_ = env_switch("ROOFLINE_BATCHED_BUCKETS", true);
  const char* split_combine = std::getenv("ROOFLINE_SPLIT_COMBINE");
  split_combine_ = split_combine && std::strcmp(split_combine, "1") == 0;  // off: slower on the H200 (docs/performance.md)
}

CudaBackend::~CudaBackend() {
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

uint64_t CudaBackend::weight_bytes(const Model& model, const LayerSet& layers) const {
  return device_weights_bytes(model, layers, [&](int il, LayerTensor role) { return expert_on_host(il, role); });
}

uint64_t CudaBackend::kv_block_bytes(const Model& model, const LayerSet& layers, const KvConfig& kv) const {
  const HParams& hp = model.hparams();
  const int paged = hp.count_layers(MixerKind::Attention, layers.begin, layers.end) - ring_layers(hp, layers, kv);
  return (uint64_t)paged * kv_plane_bytes(hp, kv, kv.block_size);
}

uint64_t CudaBackend::swa_cell_bytes(const Model& model, const LayerSet& layers, const KvConfig& kv) const {
  return (uint64_t)ring_layers(model.hparams(), layers, kv) * kv_plane_bytes(model.hparams(), kv, kv.swa_ring);
}

uint64_t CudaBackend::swa_snapshot_bytes(const Model& model, const LayerSet& layers, const KvConfig& kv) const {
  const int64_t positions = (int64_t)kv.swa_snapshot_blocks * kv.block_size;  // in host memory: no alignment slack
  return (uint64_t)ring_layers(model.hparams(), layers, kv) * (kv_plane_bytes(model.hparams(), kv, positions) - 4 * 256);
}

uint64_t CudaBackend::state_cell_bytes(const Model& model, const LayerSet& layers) const {
  const HParams& hp = model.hparams();
  return (uint64_t)hp.count_layers(MixerKind::DeltaNet, layers.begin, layers.end) * ((hp.delta_net.state_floats() + 3) / 4 * 16 + 256);
}

void CudaBackend::load(std::shared_ptr<const Model> model, const LayerSet& layers) {
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
  spans_ = attention_spans(hp.n_head_kv);
  max_splits_ = attention_max_splits(options_.n_ctx, spans_.min_span, spans_.splits);
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
  const size_t half_bytes = (gemm_scratch_elems_ + x_f16_elems(T, max_cols)) * 2;
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
                argmax_scratch_bytes(T) + 39 * 256);
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
  x_f16_ = reinterpret_cast<__half*>(work_.take(x_f16_elems(T, max_cols) * 2));
  step_dev_ = reinterpret_cast<int*>(work_.take(step_ints * 4));
  ROOFLINE_CUDA_CHECK(cudaMallocHost(&step_host_, step_ints * 4));
  if (layers.output) ROOFLINE_CUDA_CHECK(cudaMallocHost(&logits_host_, (size_t)T * hp.n_vocab * 4));
  argmax_dev_ = reinterpret_cast<int32_t*>(work_.take((size_t)T * 4));
  argmax_scratch_ = argmax_scratch_at(work_.take(argmax_scratch_bytes(T)), T, stream_);
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

void CudaBackend::init_kv(const KvConfig& kv) {
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

void CudaBackend::init_state(int n_cells) {
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

void CudaBackend::begin_step(const StepDesc& step) {
  ROOFLINE_CUDA_CHECK(cudaSetDevice(options_.device));
  gaps_.step_start(stream_, step.n_tokens());
  const HParams& hp = model_->hparams();
  StepPackConfig c;
  c.max_tokens = options_.max_tokens;
  c.layout = step_layout();
  c.max_splits = max_splits_, c.spans = spans_;
  c.prefill_min_keys = prefill_ok_ ? prefill_min_keys(flash_prefill_fits(kv_.type_k, kv_.type_v, hp.head_dim_k, hp.head_dim_v)) : 0;
  c.rings = kv_.swa_ring > 0 && std::any_of(layer_dev_.begin(), layer_dev_.end(), [](const LayerDev& d) { return d.ring; });
  c.swa_ring = kv_.swa_ring, c.kv_block_size = kv_.block_size, c.sliding_window = hp.sliding_window;
  c.n_state_cells = n_state_cells_;
  c.delta_net = dn_qkv_ != nullptr, c.delta_net_chunked = dn_chunked_, c.delta_net_chunked_min_rows = kDeltaNetChunkedMinRows;
  c.batched_buckets = buckets_batched_steps();
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

void CudaBackend::embed() {
  ROOFLINE_CHECK(layers_.embedding, "the GPU backend does not hold the token embedding");
  mark("embedding", 0);
  cuda::embed(embd_, dstep_, x_, n_tok_, model_->hparams().n_embd, stream_);
  if (model_->hparams().embd_scale > 0) scale_values(x_, (int64_t)n_tok_ * model_->hparams().n_embd, model_->hparams().embd_scale, stream_);
}

void CudaBackend::set_hidden(const float* hidden) {
  const size_t row = (size_t)model_->hparams().n_embd * 4;
  ROOFLINE_CUDA_CHECK(cudaMemcpyAsync(x_, hidden, (size_t)n_real_ * row, cudaMemcpyHostToDevice, stream_));
  if (n_tok_ > n_real_)
    ROOFLINE_CUDA_CHECK(cudaMemsetAsync(reinterpret_cast<uint8_t*>(x_) + n_real_ * row, 0, (n_tok_ - n_real_) * row, stream_));
}

void CudaBackend::get_hidden(float* hidden) {
  ROOFLINE_CUDA_CHECK(cudaMemcpyAsync(hidden, x_, (size_t)n_real_ * model_->hparams().n_embd * 4, cudaMemcpyDeviceToHost, stream_));
  ROOFLINE_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::forward(int layer_begin, int layer_end) {
  ROOFLINE_CHECK(layer_begin >= layers_.begin && layer_end <= layers_.end);
  if (layer_begin == layer_end) return;
  forward_end_ = layer_end;  // a layer may prepare the next one's input only inside this range
  attn_input_ready_ = ffn_input_ready_ = false;
  ready_tiles_x_ = nullptr;
  inputs_.reset();  // each forward starts on the first int8 buffer (a captured graph replays the pointers it saw)
  // Decode: one CUDA graph per (bucket, layer range, head split, attention grid), captured on first use and
  // replayed after (grid_splits_ <= 8192: 14 bits; buckets of at most 64 rows: 8 bits).
  const uint64_t key = ((uint64_t)split_heads_ << 62) | ((uint64_t)grid_splits_ << 48) | ((uint64_t)n_tok_ << 40) | ((uint64_t)layer_begin << 20) |
                       (uint64_t)layer_end;
  // Batched steps' keys (any row count from 9 to 64, any split count) are many: past kMaxGraphs graphs, new ones launch.
  const bool graph = graphs_enabled_ && (n_tok_ <= 8 || (batched_graph() && (graphs_.has(key) || graphs_.size() < kMaxGraphs)));
  if (!graph) {
    if (ahead_) ahead_->begin_step();
    for (int il = layer_begin; il < layer_end; ++il) forward_layer(layer_dev_[il - layers_.begin]);
    if (ahead_) ahead_->end_step();
    return;
  }
  gaps_.layers_start(stream_);
  const bool capture = !graphs_.has(key);
  graphs_.run(key, stream_, [&] {
    for (int il = layer_begin; il < layer_end; ++il) forward_layer(layer_dev_[il - layers_.begin]);
  });
  gaps_.launched(capture);
}

// A step's plan at every key count of its deepest row, as begin_step packs it (plan_attention), for one row (the
// plan of every step of up to 8 rows) and for each batched bucket: the counts where its grid of splits or its head
// split changes start a new graph key.
std::vector<int> CudaBackend::decode_graph_depths(int max_keys) const {
  std::vector<int> depths;
  if (!graphs_enabled_) return depths;
  StepDesc one;
  one.tokens = {0}, one.positions = {0}, one.row_seq = {0};
  for (int rows : decode_graph_rows()) {
    if (rows > 1 && rows <= 8) continue;  // up to 8 rows: the one-row plan's grid (the deepest row's splits)
    int grid = -1;
    bool heads = false;
    for (int keys = 1; keys <= max_keys; ++keys) {
      one.positions[0] = keys - 1;  // the bucket's other rows: shallower
      const AttentionPlan plan = plan_attention(one, max_splits_, spans_, 0, rows > 8 ? rows : 0);
      if (plan.grid_splits != grid || plan.split_heads != heads) depths.push_back(keys);
      grid = plan.grid_splits, heads = plan.split_heads;
    }
  }
  std::sort(depths.begin(), depths.end());
  depths.erase(std::unique(depths.begin(), depths.end()), depths.end());
  return depths;
}

std::vector<int> CudaBackend::decode_graph_rows() const {
  std::vector<int> rows;
  if (!graphs_enabled_) return rows;
  for (int r : {1, 2, 4, 8, 16, 32, 48, 64})
    if (r <= options_.max_tokens && (r <= 8 || (buckets_batched_steps() && batched_graphs_))) rows.push_back(r);
  return rows;
}

bool CudaBackend::compute_logits() {
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

void CudaBackend::output(float* logits) {
  if (!compute_logits()) return;
  mark("logits to host", 0);
  const size_t bytes = (size_t)n_logit_ * model_->hparams().n_vocab * 4;
  ROOFLINE_CUDA_CHECK(cudaMemcpyAsync(logits_host_, logits_, bytes, cudaMemcpyDeviceToHost, stream_));
  gaps_.step_end(stream_);
  ROOFLINE_CUDA_CHECK(cudaStreamSynchronize(stream_));
  gaps_.collect();
  profiler_.collect(stream_);
  if (logits) std::memcpy(logits, logits_host_, bytes);
}

void CudaBackend::output_argmax(float* logits, int32_t* tokens) {
  if (!compute_logits()) return;
  const int n_vocab = model_->hparams().n_vocab;
  mark("argmax + logits to host", 0);
  if (!argmax_masks_.upload(argmax_only_, argmax_allowed_, n_logit_, n_vocab, stream_))
    argmax_rows(logits_, n_logit_, n_vocab, argmax_scratch_, argmax_dev_, stream_);
  else
    argmax_rows_allowed(logits_, n_logit_, n_vocab, argmax_masks_.masks(), argmax_masks_.has_mask(), argmax_scratch_, argmax_dev_, stream_);
  ROOFLINE_CUDA_CHECK(cudaMemcpyAsync(argmax_host_, argmax_dev_, (size_t)n_logit_ * 4, cudaMemcpyDeviceToHost, stream_));
  int packed = 0;
  for (int i = 0; i < n_logit_; ++i) {
    if (argmax_only_[i]) continue;
    ROOFLINE_CUDA_CHECK(cudaMemcpyAsync(logits_host_ + (size_t)packed * n_vocab, logits_ + (size_t)i * n_vocab,
                                        (size_t)n_vocab * 4, cudaMemcpyDeviceToHost, stream_));
    ++packed;
  }
  gaps_.step_end(stream_);
  ROOFLINE_CUDA_CHECK(cudaStreamSynchronize(stream_));
  gaps_.collect();
  profiler_.collect(stream_);
  for (int i = 0; i < n_logit_; ++i) tokens[i] = argmax_only_[i] ? argmax_host_[i] : -1;
  if (packed > 0 && logits) std::memcpy(logits, logits_host_, (size_t)packed * n_vocab * 4);
}

void CudaBackend::output_hidden(float* hidden) {
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

void CudaBackend::copy_kv_block(int src, int dst) {
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

void CudaBackend::copy_state(int src, int dst) {
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

std::vector<WindowSnapshots::Plane> CudaBackend::ring_planes() const {
  const int64_t bk = (int64_t)kv_.block_size * model_->hparams().kv_dim_k(), bv = (int64_t)kv_.block_size * model_->hparams().kv_dim_v();
  std::vector<WindowSnapshots::Plane> planes;
  for (const LayerDev& d : layer_dev_)
    if (d.ring)
      for (auto [base, bytes] : {std::pair{d.kv.k, kv_values_bytes(kv_.type_k, bk)}, std::pair{d.kv.v, kv_values_bytes(kv_.type_v, bv)},
                                 std::pair{d.kv.k_scales, kv_scales_bytes(kv_.type_k, bk)}, std::pair{d.kv.v_scales, kv_scales_bytes(kv_.type_v, bv)}})
        if (base && bytes) planes.push_back({base, bytes});
  return planes;
}

void CudaBackend::init_snapshots(int n) {
  window_snapshots_.init(options_.device, ring_planes(), n, kv_.swa_snapshot_blocks, kv_.swa_ring / kv_.block_size, n_state_cells_);
}

std::string CudaBackend::keep_f16_copies() { // of the layers' matrices, not the stacked experts (their own kernels)
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

void CudaBackend::set_partial_sum(PartialSum hook) {
  ROOFLINE_CHECK(!model_, "the partial-sum hook is set before the model is loaded");
  partial_sum_ = std::move(hook);
}

void CudaBackend::finish_step() {
  ROOFLINE_CUDA_CHECK(cudaSetDevice(options_.device));
  ROOFLINE_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::set_matmul_observer(MatmulObserver observer) {
  if (observer) fail("importance matrices are collected on the CPU backend (run imatrix with -ngl 0)");
}

bool CudaBackend::expert_on_host(int il, LayerTensor role) const {
  return is_stacked_experts(role) && il < (int)options_.experts_on_host.size() && options_.experts_on_host[(size_t)il];
}

int CudaBackend::table_capacity_blocks() const {
  const int64_t bs = std::max(1, std::min(16, options_.kv_block_size));  // smaller blocks need longer tables
  return (int)(((int64_t)options_.n_ctx + bs - 1) / bs + 2);
}

StepLayout CudaBackend::step_layout() const {
  return StepLayout::make(options_.max_tokens, table_capacity_blocks(), model_ && model_->hparams().has_sliding_layers());
}

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
