// CpuBackend: one transformer layer is norm -> mixer (-> post norm) -> residual -> norm -> FFN (-> post
// norm) -> residual, the FFN a SwiGLU or GeGLU, or a mixture of SwiGLU experts (moe_cpu.h) with an
// optional gated shared expert; the mixer either attention (QKV (+bias) -> QK-norm -> RoPE -> KV store
// -> paged attention, sliding-window on gemma3's local layers (-> output gate) -> output projection) or
// Gated DeltaNet (in-projections -> conv, delta rule, gated norm (backend/delta_net.h) -> output projection).
#include "backend/cpu/cpu_backend.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/mapped_file.h"
#include "backend/cpu/delta_net_cpu.h"
#include "formats/quant_ref.h"

namespace roofline::cpu {

namespace {

std::vector<float> to_floats(const Weight& w) {
  if (!w) return {};
  if (!w.data()) fail("tensor {} has no data (a layout-only model cannot run)", w.tensor->name);
  std::vector<float> out((size_t)w.tensor->n_elements());
  dequantize_rows_ref(w.type(), w.data(), out.data(), w.tensor->n_rows(), w.tensor->row_length());
  return out;
}

void add_bias(float* y, const std::vector<float>& b, int n_rows) {
  if (b.empty()) return;
  const size_t n = b.size();
  for (int r = 0; r < n_rows; ++r)
    for (size_t i = 0; i < n; ++i) y[r * n + i] += b[i];
}

}  // namespace

CpuBackend::CpuBackend(int n_threads) : pool_(n_threads) {}
CpuBackend::~CpuBackend() = default;

uint64_t CpuBackend::weight_bytes(const Model& model, const LayerSet& layers) const {
  uint64_t n = 0;
  for (int il = layers.begin; il < layers.end; ++il) n += model.layer_bytes(il);
  if (layers.embedding) n += model.token_embd().bytes();
  if (layers.output && !(layers.embedding && model.tied_embeddings())) n += model.output_bytes();
  return n;
}

namespace {
// Attention layers among [begin, end) whose KV sits in rings (sliding layers, when rings are on).
int ring_layers(const HParams& hp, const LayerSet& layers, const KvConfig& kv) {
  return kv.swa_ring > 0 ? hp.count_sliding_layers(layers.begin, layers.end) : 0;
}
}  // namespace

uint64_t CpuBackend::kv_block_bytes(const Model& model, const LayerSet& layers, const KvConfig& kv) const {
  const HParams& hp = model.hparams();
  const int paged = hp.count_layers(MixerKind::Attention, layers.begin, layers.end) - ring_layers(hp, layers, kv);
  return (uint64_t)paged * kv.block_size * (dtype_row_bytes(kv.type_k, hp.kv_dim_k()) + dtype_row_bytes(kv.type_v, hp.kv_dim_v()));
}

uint64_t CpuBackend::swa_cell_bytes(const Model& model, const LayerSet& layers, const KvConfig& kv) const {
  const HParams& hp = model.hparams();
  return (uint64_t)ring_layers(hp, layers, kv) * kv.swa_ring *
         (dtype_row_bytes(kv.type_k, hp.kv_dim_k()) + dtype_row_bytes(kv.type_v, hp.kv_dim_v()));
}

uint64_t CpuBackend::swa_snapshot_bytes(const Model& model, const LayerSet& layers, const KvConfig& kv) const {
  const HParams& hp = model.hparams();
  return (uint64_t)ring_layers(hp, layers, kv) * kv.swa_snapshot_blocks * kv.block_size *
         (dtype_row_bytes(kv.type_k, hp.kv_dim_k()) + dtype_row_bytes(kv.type_v, hp.kv_dim_v()));
}

uint64_t CpuBackend::state_cell_bytes(const Model& model, const LayerSet& layers) const {
  const HParams& hp = model.hparams();
  return (uint64_t)hp.count_layers(MixerKind::DeltaNet, layers.begin, layers.end) * hp.delta_net.state_floats() * 4;
}

void CpuBackend::load(std::shared_ptr<const Model> model, const LayerSet& layers) {
  model_ = std::move(model);
  layers_ = layers;
  layer_data_.clear();
  layer_data_.resize(layers.n_layers());
  packed_.clear();
  const ArchInfo& arch = model_->arch();
  for (int il = layers.begin; il < layers.end; ++il) {
    const LayerWeights& L = model_->layer(il);
    LayerData& d = layer_data_[il - layers.begin];
    for (const PlannedTensor& t : layer_tensor_plan(arch, model_->hparams(), il)) {
      const Weight& w = L[t.rule->role];
      if (!w) continue;
      if (t.rule->use == TensorUse::Floats) {
        d.floats[(size_t)t.rule->role] = to_floats(w);
      } else {
        if (!w.data()) fail("tensor {} has no data (a layout-only model cannot run)", w.tensor->name);
        vec_dot_fn(w.type());  // throws for a type without a CPU kernel
        pack(w);
      }
    }
    if (arch.moe) {
      d.experts.build(L[LayerTensor::FfnGateExps], L[LayerTensor::FfnUpExps], L[LayerTensor::FfnDownExps]);
      for (auto* views : {&d.experts.gate, &d.experts.up, &d.experts.down})
        for (const gguf::TensorInfo& t : *views) pack(Weight{&t});
    }
  }
  if (layers.output) {
    output_norm_ = to_floats(model_->output_norm());
    vec_dot_fn(model_->output().type());
    pack(model_->output());
  }
  rope_factors_ = to_floats(model_->rope_freqs());
}

// A packed copy of w where the packed kernels read its type; the file's pages of the original then leave
// the resident set (they stay in the page cache; an embedding lookup of a tied output maps them again).
void CpuBackend::pack(const Weight& w) {
  if (packed_.add(w, pool_) && !model_->file().in_memory()) release_mapped_pages(w.data(), w.bytes());
}

void CpuBackend::init_kv(const KvConfig& kv) {
  const HParams& hp = model_->hparams();
  for (DType t : {kv.type_k, kv.type_v}) {
    if (!dtype_has_reference(t)) fail("KV cache type {} is not supported", dtype_name(t));
  }
  if (hp.head_dim_k % dtype_block_size(kv.type_k) != 0)
    fail("KV cache type {} needs a head dimension that is a multiple of {} (the model's K heads have {})",
         dtype_name(kv.type_k), dtype_block_size(kv.type_k), hp.head_dim_k);
  if (hp.head_dim_v % dtype_block_size(kv.type_v) != 0)
    fail("KV cache type {} needs a head dimension that is a multiple of {} (the model's V heads have {})",
         dtype_name(kv.type_v), dtype_block_size(kv.type_v), hp.head_dim_v);
  kv_ = kv;
  k_row_bytes_ = dtype_row_bytes(kv.type_k, hp.kv_dim_k());
  v_row_bytes_ = dtype_row_bytes(kv.type_v, hp.kv_dim_v());
  const size_t slots = (size_t)kv.n_blocks * kv.block_size;
  for (int il = layers_.begin; il < layers_.end; ++il) {
    if (!hp.has_kv(il)) continue;
    LayerData& d = layer_data_[il - layers_.begin];
    d.ring = kv.swa_ring > 0 && hp.is_sliding(il);
    if (d.ring) continue;  // its rings come with the state cells (init_state)
    d.k_cache.assign(slots * k_row_bytes_, 0);
    d.v_cache.assign(slots * v_row_bytes_, 0);
  }
}

void CpuBackend::init_state(int n_cells) {
  const HParams& hp = model_->hparams();
  n_state_cells_ = n_cells;
  for (int il = layers_.begin; il < layers_.end; ++il) {
    LayerData& d = layer_data_[il - layers_.begin];
    if (hp.mixer(il) == MixerKind::DeltaNet) d.state.assign((size_t)n_cells * hp.delta_net.state_floats(), 0.0f);
    if (d.ring) {
      const size_t rows = (size_t)n_cells * kv_.swa_ring;
      d.k_cache.assign(rows * k_row_bytes_, 0);
      d.v_cache.assign(rows * v_row_bytes_, 0);
    }
  }
}

KvLayerView CpuBackend::kv_view(int il) {
  LayerData& d = layer_data_[il - layers_.begin];
  KvLayerView v;
  v.k = d.k_cache.data();
  v.v = d.v_cache.data();
  v.type_k = kv_.type_k;
  v.type_v = kv_.type_v;
  v.k_row_bytes = k_row_bytes_;
  v.v_row_bytes = v_row_bytes_;
  v.block_size = kv_.block_size;
  v.ring = d.ring ? kv_.swa_ring : 0;
  return v;
}

void CpuBackend::begin_step(const StepDesc& step) {
  step_ = step;
  profiler_.begin_step(step.n_tokens());
  const HParams& hp = model_->hparams();
  const size_t n = (size_t)step.n_tokens();
  x_.resize(n * hp.n_embd);
  xn_.resize(n * hp.n_embd);
  if (layers_.n_layers() > 0 && !hp.is_moe()) {
    gate_.resize(n * hp.n_ff);
    up_.resize(n * hp.n_ff);
  }
  if (layers_.n_layers() > 0 && hp.is_moe()) {
    moe_out_.resize(n * hp.n_embd);
    shexp_gate_.resize(n * hp.n_ff_shexp);
    shexp_up_.resize(n * hp.n_ff_shexp);
  }
  if (hp.count_layers(MixerKind::Attention, layers_.begin, layers_.end) > 0) {
    q_.resize(n * hp.q_dim());
    k_.resize(n * hp.kv_dim_k());
    v_.resize(n * hp.kv_dim_v());
    attn_.resize(n * hp.n_head * hp.head_dim_v);
    if (hp.attn_output_gate) {
      q_full_.resize(n * hp.q_dim() * 2);
      attn_gate_.resize(n * hp.q_dim());
    }
    rope_ = rope_table(step.positions, hp.n_rot, hp.rope_freq_base, hp.rope_freq_scale,
                       rope_factors_.empty() ? nullptr : rope_factors_.data());
    if (hp.count_sliding_layers(layers_.begin, layers_.end) > 0)
      rope_swa_ = rope_table(step.positions, hp.n_rot, hp.rope_freq_base_swa, hp.rope_freq_scale_swa,
                             rope_factors_.empty() ? nullptr : rope_factors_.data());
  }
  if (ring_layers(hp, layers_, kv_) > 0)
    for (const StepSequence& sq : step.sequences) {
      if (sq.state_cell < 0 || sq.state_cell >= n_state_cells_)
        fail("internal error: sequence {} has no state cell for its sliding-window rings (cell {} of {})", sq.seq_id,
             sq.state_cell, n_state_cells_);
      // The step's new positions must not overwrite one that its first row still reads.
      if (sq.n_new > kv_.swa_ring - hp.sliding_window + 1 && sq.n_past + sq.n_new > kv_.swa_ring)
        fail("internal error: {} new positions of sequence {} in one step overrun its sliding-window ring of {}", sq.n_new,
             sq.seq_id, kv_.swa_ring);
    }
  if (hp.count_layers(MixerKind::DeltaNet, layers_.begin, layers_.end) > 0) {
    const DeltaNetDims& dn = hp.delta_net;
    dn_qkv_.resize(n * dn.conv_dim());
    dn_z_.resize(n * dn.value_dim());
    dn_alpha_.resize(n * dn.n_v_heads);
    dn_beta_.resize(n * dn.n_v_heads);
    dn_out_.resize(n * dn.value_dim());
    for (const StepSequence& sq : step.sequences)
      if (sq.state_cell < 0 || sq.state_cell >= n_state_cells_)
        fail("internal error: sequence {} has no recurrent-state cell (cell {} of {})", sq.seq_id, sq.state_cell, n_state_cells_);
  }
}

void CpuBackend::embed() {
  ROOFLINE_CHECK(layers_.embedding, "the CPU backend does not hold the token embedding");
  const Weight& e = model_->token_embd();
  const int n_embd = model_->hparams().n_embd;
  const size_t row_bytes = dtype_row_bytes(e.type(), n_embd);
  for (int r = 0; r < step_.n_tokens(); ++r)
    dequantize_row_ref(e.type(), e.data() + (size_t)step_.tokens[r] * row_bytes, x_.data() + (size_t)r * n_embd, n_embd);
  const float scale = model_->hparams().embd_scale;
  if (scale > 0)
    for (float& v : x_) v *= scale;
}

void CpuBackend::set_hidden(const float* hidden) { std::memcpy(x_.data(), hidden, x_.size() * sizeof(float)); }
void CpuBackend::get_hidden(float* hidden) { std::memcpy(hidden, x_.data(), x_.size() * sizeof(float)); }

void CpuBackend::forward(int layer_begin, int layer_end) {
  ROOFLINE_CHECK(layer_begin >= layers_.begin && layer_end <= layers_.end);
  for (int il = layer_begin; il < layer_end; ++il) forward_layer(il);
  profiler_.end_ops();
}

// Products of one input x (n rows of n_cols): the activations converted once per format, and the
// products that read the same format run in one dispatch (matmul_multi), in the order given.
void CpuBackend::products_of_one_input(const char* op, std::initializer_list<MatmulOut> outs, const float* x, int n,
                                       int64_t n_cols) {
  const MatmulOut* begin = outs.begin();
  while (begin != outs.end()) {
    const ActFormat format = act_format_for(begin->w->type());
    const MatmulOut* end = begin + 1;
    double bytes = (double)begin->w->bytes();
    while (end != outs.end() && act_format_for(end->w->type()) == format) bytes += (double)(end++)->w->bytes();
    if (act_.format() != format || begin == outs.begin()) {
      profiler_.mark("quantize activations");
      act_.prepare(format, x, n, n_cols, pool_);
    }
    profiler_.mark(op, bytes);
    matmul_multi(std::span<const MatmulOut>(begin, end), act_, pool_, &packed_);
    begin = end;
  }
}

void CpuBackend::product(const char* op, const Weight& w, const float* x, float* y) {
  observe(w, x, step_.n_tokens());
  profiler_.mark("quantize activations");
  act_.prepare(act_format_for(w.type()), x, step_.n_tokens(), w.cols(), pool_);
  profiler_.mark(op, (double)w.bytes());
  matmul(w, act_, y, pool_, &packed_);
}

void CpuBackend::forward_layer(int il) {
  const HParams& hp = model_->hparams();
  const LayerWeights& L = model_->layer(il);
  LayerData& d = layer_data_[il - layers_.begin];
  const int n = step_.n_tokens();
  const int n_embd = hp.n_embd;
  using LT = LayerTensor;

  // Mixer block.
  profiler_.mark("norm");
  pool_.parallel_for((size_t)n, [&](size_t r) {
    rms_norm(x_.data() + r * n_embd, d[LT::AttnNorm].data(), xn_.data() + r * n_embd, n_embd, hp.rms_eps);
  });
  if (L.mixer == MixerKind::Attention) attention_block(il, L, d);
  else delta_net_block(L, d);
  sum_partials();
  profiler_.mark("residual");
  post_norm(d[LT::AttnPostNorm]);
  add_residual();

  // Feed-forward block.
  profiler_.mark("norm");
  pool_.parallel_for((size_t)n, [&](size_t r) {
    rms_norm(x_.data() + r * n_embd, d[LT::FfnNorm].data(), xn_.data() + r * n_embd, n_embd, hp.rms_eps);
  });
  if (hp.is_moe()) moe_ffn_block(L, d);
  else dense_ffn_block(L);
  sum_partials();
  profiler_.mark("residual");
  post_norm(d[LT::FfnPostNorm]);
  add_residual();
}

// Tensor parallelism: xn_ holds this slice's part of the block's output; the hook sums it over the slices.
void CpuBackend::sum_partials() {
  if (!partial_sum_) return;
  profiler_.mark("partial sum");
  partial_sum_(xn_.data(), (size_t)step_.n_tokens() * (size_t)model_->hparams().n_embd, nullptr);
}

// x += xn over the step's rows, split over the pool by rows (elementwise: the same bits in any split).
void CpuBackend::add_residual() {
  const size_t n_embd = (size_t)model_->hparams().n_embd;
  pool_.parallel_for((size_t)step_.n_tokens(), [&](size_t r) {
    float* x = x_.data() + r * n_embd;
    const float* y = xn_.data() + r * n_embd;
    for (size_t i = 0; i < n_embd; ++i) x[i] += y[i];
  });
}

void CpuBackend::dense_ffn_block(const LayerWeights& L) {
  using LT = LayerTensor;
  const int n = step_.n_tokens();
  const Weight &w_gate = L[LT::FfnGate], &w_up = L[LT::FfnUp], &w_down = L[LT::FfnDown];
  observe(w_gate, xn_.data(), n);
  observe(w_up, xn_.data(), n);
  products_of_one_input("gate+up", {{&w_gate, gate_.data()}, {&w_up, up_.data()}}, xn_.data(), n, model_->hparams().n_embd);
  profiler_.mark("swiglu");
  // The gated activation over the pool in chunks of elements (elementwise: the same bits in any split;
  // decode's one row is split too).
  const size_t n_elems = (size_t)n * (size_t)model_->hparams().n_ff;
  const bool geglu = model_->arch().ffn == FfnKind::GeGLU;
  constexpr size_t kChunk = 1024;
  pool_.parallel_for((n_elems + kChunk - 1) / kChunk, [&](size_t c) {
    const size_t b = c * kChunk;
    gated_activation(gate_.data() + b, up_.data() + b, std::min(kChunk, n_elems - b), geglu);
  });
  product("down", w_down, gate_.data(), xn_.data());
}

// Routed experts (grouped by expert), plus the shared expert scaled by sigmoid(gate . x) where the
// arch has one. The matmul observer sees the router's, each expert's (with its index) and the shared
// expert's inputs.
void CpuBackend::moe_ffn_block(const LayerWeights& L, const LayerData& d) {
  using LT = LayerTensor;
  const HParams& hp = model_->hparams();
  const int n = step_.n_tokens();
  const int n_embd = hp.n_embd;
  observe(L[LT::FfnGateInp], xn_.data(), n);
  profiler_.mark("moe experts");
  moe_.forward(L[LT::FfnGateInp], d.experts, hp, xn_.data(), n, moe_out_.data(), pool_, &observer_, &packed_);
  profiler_.add_bytes(moe_.weight_bytes_read());
  if (hp.n_ff_shexp > 0) {
    const Weight &w_gate = L[LT::FfnGateShexp], &w_up = L[LT::FfnUpShexp], &w_down = L[LT::FfnDownShexp];
    observe(w_gate, xn_.data(), n);
    observe(w_up, xn_.data(), n);
    products_of_one_input("shared expert gate+up", {{&w_gate, shexp_gate_.data()}, {&w_up, shexp_up_.data()}}, xn_.data(), n, n_embd);
    profiler_.mark("shared expert gating");
    gated_activation(shexp_gate_.data(), shexp_up_.data(), (size_t)n * hp.n_ff_shexp, false);
    std::vector<float> scale((size_t)n);
    const float* g = d[LT::FfnGateInpShexp].data();
    for (int r = 0; r < n; ++r) {
      const float* xr = xn_.data() + (size_t)r * n_embd;
      float dot = 0;
      for (int i = 0; i < n_embd; ++i) dot += g[i] * xr[i];
      scale[(size_t)r] = 1.0f / (1.0f + std::exp(-dot));
    }
    product("shared expert down", w_down, shexp_gate_.data(), xn_.data());
    profiler_.mark("moe combine");
    for (int r = 0; r < n; ++r)
      for (int i = 0; i < n_embd; ++i) xn_[(size_t)r * n_embd + i] = moe_out_[(size_t)r * n_embd + i] + scale[(size_t)r] * xn_[(size_t)r * n_embd + i];
  } else {
    std::copy(moe_out_.begin(), moe_out_.begin() + (size_t)n * n_embd, xn_.begin());
  }
}

void CpuBackend::post_norm(const std::vector<float>& w) {
  if (w.empty()) return;
  const int n_embd = model_->hparams().n_embd;
  const float eps = model_->hparams().rms_eps;
  pool_.parallel_for((size_t)step_.n_tokens(), [&](size_t r) {
    rms_norm(xn_.data() + r * n_embd, w.data(), xn_.data() + r * n_embd, n_embd, eps);
  });
}

void CpuBackend::attention_block(int il, const LayerWeights& L, const LayerData& d) {
  const HParams& hp = model_->hparams();
  const int n = step_.n_tokens();
  const int n_embd = hp.n_embd;
  using LT = LayerTensor;
  const Weight &wq = L[LT::AttnQ], &wk = L[LT::AttnK], &wv = L[LT::AttnV], &wo = L[LT::AttnOut];
  observe(wq, xn_.data(), n);
  observe(wk, xn_.data(), n);
  observe(wv, xn_.data(), n);
  const bool gated = hp.attn_output_gate;
  products_of_one_input("q+k+v", {{&wq, gated ? q_full_.data() : q_.data()}, {&wk, k_.data()}, {&wv, v_.data()}}, xn_.data(),
                        n, n_embd);
  profiler_.mark("q/k norm, rope");
  add_bias(q_.data(), d[LT::AttnQBias], n);
  add_bias(k_.data(), d[LT::AttnKBias], n);
  add_bias(v_.data(), d[LT::AttnVBias], n);
  const int hd = hp.head_dim_k;
  if (gated) {  // per head [q_h | gate_h] -> q and the output gate
    for (int r = 0; r < n; ++r)
      for (int h = 0; h < hp.n_head; ++h) {
        const float* src = q_full_.data() + ((size_t)r * hp.n_head + h) * 2 * hd;
        std::memcpy(q_.data() + ((size_t)r * hp.n_head + h) * hd, src, hd * sizeof(float));
        std::memcpy(attn_gate_.data() + ((size_t)r * hp.n_head + h) * hd, src + hd, hd * sizeof(float));
      }
  }
  const RopeStyle style = model_->arch().rope_style;
  const RopeTable& rope = hp.is_sliding(il) ? rope_swa_ : rope_;
  const std::vector<float>&q_norm = d[LT::AttnQNorm], &k_norm = d[LT::AttnKNorm];
  pool_.parallel_for((size_t)n, [&](size_t r) {
    float* qr = q_.data() + r * hp.q_dim();
    float* kr = k_.data() + r * hp.kv_dim_k();
    if (!q_norm.empty()) {
      for (int h = 0; h < hp.n_head; ++h) rms_norm(qr + h * hd, q_norm.data(), qr + h * hd, hd, hp.rms_eps);
      for (int h = 0; h < hp.n_head_kv; ++h) rms_norm(kr + h * hd, k_norm.data(), kr + h * hd, hd, hp.rms_eps);
    }
    const float* c = rope.cos.data() + r * rope.half;
    const float* s = rope.sin.data() + r * rope.half;
    rope_row(qr, hp.n_head, hd, hp.n_rot, style, c, s);
    rope_row(kr, hp.n_head_kv, hd, hp.n_rot, style, c, s);
  });
  const KvLayerView kv = kv_view(il);
  profiler_.mark("kv store");
  kv_store(kv, step_, k_.data(), v_.data(), hp.kv_dim_k(), hp.kv_dim_v(), pool_);
  const float scale = hp.attn_scale > 0 ? hp.attn_scale : 1.0f / std::sqrt((float)hd);
  profiler_.mark("attention");
  attention(kv, step_, q_.data(), attn_.data(), hp.n_head, hp.n_head_kv, hd, hp.head_dim_v, scale, pool_,
            hp.attention_window(il));
  if (gated)
    for (size_t i = 0; i < attn_.size(); ++i) attn_[i] *= 1.0f / (1.0f + std::exp(-attn_gate_[i]));
  product("o", wo, attn_.data(), xn_.data());
}

void CpuBackend::delta_net_block(const LayerWeights& L, LayerData& d) {
  const HParams& hp = model_->hparams();
  const DeltaNetDims& dn = hp.delta_net;
  const int n = step_.n_tokens();
  using LT = LayerTensor;
  const Weight &w_qkv = L[LT::SsmQkv], &w_z = L[LT::SsmGate], &w_alpha = L[LT::SsmAlpha], &w_beta = L[LT::SsmBeta];
  for (const Weight* w : {&w_qkv, &w_z, &w_alpha, &w_beta}) observe(*w, xn_.data(), n);
  products_of_one_input("delta net qkv+z+alpha+beta",
                        {{&w_qkv, dn_qkv_.data()}, {&w_z, dn_z_.data()}, {&w_alpha, dn_alpha_.data()}, {&w_beta, dn_beta_.data()}},
                        xn_.data(), n, hp.n_embd);
  // Each sequence's delta-rule state is read and written once (counted as the CUDA backend's profile does).
  profiler_.mark("delta net", 8.0 * (double)dn.ssm_state_floats() * (double)step_.sequences.size());
  std::vector<DeltaNetSeq> seqs;
  seqs.reserve(step_.sequences.size());
  for (const StepSequence& s : step_.sequences)
    seqs.push_back({s.first_token, s.n_new, s.n_past == 0, d.state.data() + (size_t)s.state_cell * dn.state_floats()});
  DeltaNetWeights w;
  w.conv = d[LT::SsmConv].data();
  w.dt_bias = d[LT::SsmDtBias].data();
  w.a = d[LT::SsmA].data();
  w.norm = d[LT::SsmNorm].data();
  delta_net_forward(dn, w, hp.rms_eps, seqs, dn_qkv_.data(), dn_z_.data(), dn_alpha_.data(), dn_beta_.data(), dn_out_.data(),
                    pool_);
  product("ssm_out", L[LT::SsmOut], dn_out_.data(), xn_.data());
}

void CpuBackend::output(float* logits) {
  ROOFLINE_CHECK(layers_.output, "the CPU backend does not hold the output layer");
  const HParams& hp = model_->hparams();
  const int n_embd = hp.n_embd;
  const int n_out = (int)step_.logit_rows.size();
  if (n_out == 0) return;
  profiler_.mark("output norm");
  std::vector<float> normed((size_t)n_out * n_embd);
  for (int i = 0; i < n_out; ++i)
    rms_norm(x_.data() + (size_t)step_.logit_rows[i] * n_embd, output_norm_.data(), normed.data() + (size_t)i * n_embd,
             n_embd, hp.rms_eps);
  observe(model_->output(), normed.data(), n_out);
  profiler_.mark("output", (double)model_->output().bytes());
  matmul(model_->output(), normed.data(), n_out, logits, pool_, &packed_);
  if (const float cap = hp.final_logit_softcap; cap > 0) {
    const size_t n = (size_t)n_out * hp.n_vocab;
    for (size_t i = 0; i < n; ++i) logits[i] = cap * std::tanh(logits[i] / cap);
  }
  profiler_.end_ops();
}

void CpuBackend::output_hidden(float* hidden) {
  ROOFLINE_CHECK(layers_.output, "the CPU backend does not hold the output layer");
  const HParams& hp = model_->hparams();
  const int n_embd = hp.n_embd;
  for (size_t i = 0; i < step_.hidden_rows.size(); ++i)
    rms_norm(x_.data() + (size_t)step_.hidden_rows[i] * n_embd, output_norm_.data(), hidden + i * n_embd, n_embd, hp.rms_eps);
}

void CpuBackend::copy_kv_block(int src, int dst) {
  const size_t bs = (size_t)kv_.block_size;
  for (LayerData& d : layer_data_) {
    if (d.k_cache.empty() || d.ring) continue;
    std::memcpy(d.k_cache.data() + dst * bs * k_row_bytes_, d.k_cache.data() + src * bs * k_row_bytes_, bs * k_row_bytes_);
    std::memcpy(d.v_cache.data() + dst * bs * v_row_bytes_, d.v_cache.data() + src * bs * v_row_bytes_, bs * v_row_bytes_);
  }
}

void CpuBackend::copy_state(int src, int dst) {
  ROOFLINE_CHECK(src >= 0 && dst >= 0 && src < n_state_cells_ && dst < n_state_cells_, "state cell out of range");
  const size_t n = model_->hparams().delta_net.state_floats();
  const size_t ring = (size_t)kv_.swa_ring;
  for (LayerData& d : layer_data_) {
    if (!d.state.empty()) std::memcpy(d.state.data() + (size_t)dst * n, d.state.data() + (size_t)src * n, n * sizeof(float));
    if (d.ring) {
      std::memcpy(d.k_cache.data() + dst * ring * k_row_bytes_, d.k_cache.data() + src * ring * k_row_bytes_, ring * k_row_bytes_);
      std::memcpy(d.v_cache.data() + dst * ring * v_row_bytes_, d.v_cache.data() + src * ring * v_row_bytes_, ring * v_row_bytes_);
    }
  }
}

uint64_t CpuBackend::kv_bytes_allocated() const {
  uint64_t n = 0;
  for (const LayerData& d : layer_data_)
    n += d.k_cache.size() + d.v_cache.size() + d.k_snap.size() + d.v_snap.size() + d.state.size() * sizeof(float);
  return n;
}

void CpuBackend::init_snapshots(int n) {
  n_snapshots_ = n;
  const size_t rows = (size_t)n * kv_.swa_snapshot_blocks * kv_.block_size;
  for (LayerData& d : layer_data_) {
    if (!d.ring) continue;
    d.k_snap.assign(rows * k_row_bytes_, 0);
    d.v_snap.assign(rows * v_row_bytes_, 0);
  }
}

void CpuBackend::copy_window(int cell, int first_block, int n_blocks, int snapshot, bool to_snapshot) {
  ROOFLINE_CHECK(cell >= 0 && cell < n_state_cells_ && snapshot >= 0 && snapshot < n_snapshots_ && first_block >= 0 &&
                     n_blocks >= 0 && n_blocks <= kv_.swa_snapshot_blocks, "window snapshot out of range");
  const size_t bs = (size_t)kv_.block_size, per_cell = (size_t)kv_.swa_ring / bs;
  for (LayerData& d : layer_data_) {
    if (!d.ring) continue;
    for (int j = 0; j < n_blocks; ++j) {
      // Block b of the sequence sits at rows cell * ring + (b % per_cell) * bs of the ring planes.
      const size_t ring_row = (size_t)cell * kv_.swa_ring + ((size_t)(first_block + j) % per_cell) * bs;
      const size_t snap_row = ((size_t)snapshot * kv_.swa_snapshot_blocks + (size_t)j) * bs;
      uint8_t* rk = d.k_cache.data() + ring_row * k_row_bytes_;
      uint8_t* rv = d.v_cache.data() + ring_row * v_row_bytes_;
      uint8_t* sk = d.k_snap.data() + snap_row * k_row_bytes_;
      uint8_t* sv = d.v_snap.data() + snap_row * v_row_bytes_;
      std::memcpy(to_snapshot ? sk : rk, to_snapshot ? rk : sk, bs * k_row_bytes_);
      std::memcpy(to_snapshot ? sv : rv, to_snapshot ? rv : sv, bs * v_row_bytes_);
    }
  }
}

void CpuBackend::save_window(int cell, int first_block, int n_blocks, int snapshot) {
  copy_window(cell, first_block, n_blocks, snapshot, true);
}

void CpuBackend::load_window(int snapshot, int cell, int first_block, int n_blocks) {
  copy_window(cell, first_block, n_blocks, snapshot, false);
}

}  // namespace roofline::cpu
