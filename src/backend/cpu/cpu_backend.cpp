// CpuBackend: one transformer layer is norm -> QKV (+bias) -> QK-norm -> RoPE -> KV store ->
// paged attention -> output projection + residual -> norm -> SwiGLU FFN + residual.
#include "backend/cpu/cpu_backend.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
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

uint64_t CpuBackend::kv_block_bytes(const Model& model, const LayerSet& layers, const KvConfig& kv) const {
  const HParams& hp = model.hparams();
  return (uint64_t)layers.n_layers() * kv.block_size *
         (dtype_row_bytes(kv.type_k, hp.kv_dim_k()) + dtype_row_bytes(kv.type_v, hp.kv_dim_v()));
}

void CpuBackend::load(std::shared_ptr<const Model> model, const LayerSet& layers) {
  model_ = std::move(model);
  layers_ = layers;
  layer_data_.clear();
  layer_data_.resize(layers.n_layers());
  for (int il = layers.begin; il < layers.end; ++il) {
    const LayerWeights& L = model_->layer(il);
    LayerData& d = layer_data_[il - layers.begin];
    d.attn_norm = to_floats(L.attn_norm);
    d.ffn_norm = to_floats(L.ffn_norm);
    d.q_norm = to_floats(L.q_norm);
    d.k_norm = to_floats(L.k_norm);
    d.bq = to_floats(L.bq);
    d.bk = to_floats(L.bk);
    d.bv = to_floats(L.bv);
    for (const Weight* w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.ffn_gate, &L.ffn_up, &L.ffn_down}) {
      if (!w->data()) fail("tensor {} has no data (a layout-only model cannot run)", w->tensor->name);
      vec_dot_fn(w->type());  // throws for a type without a CPU kernel
    }
  }
  if (layers.output) {
    output_norm_ = to_floats(model_->output_norm());
    vec_dot_fn(model_->output().type());
  }
  rope_factors_ = to_floats(model_->rope_freqs());
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
  for (LayerData& d : layer_data_) {
    d.k_cache.assign(slots * k_row_bytes_, 0);
    d.v_cache.assign(slots * v_row_bytes_, 0);
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
  return v;
}

void CpuBackend::begin_step(const StepDesc& step) {
  step_ = step;
  const HParams& hp = model_->hparams();
  const size_t n = (size_t)step.n_tokens();
  x_.resize(n * hp.n_embd);
  xn_.resize(n * hp.n_embd);
  if (layers_.n_layers() > 0) {
    q_.resize(n * hp.q_dim());
    k_.resize(n * hp.kv_dim_k());
    v_.resize(n * hp.kv_dim_v());
    attn_.resize(n * hp.n_head * hp.head_dim_v);
    gate_.resize(n * hp.n_ff);
    up_.resize(n * hp.n_ff);
    rope_ = rope_table(step.positions, hp.n_rot, hp.rope_freq_base, hp.rope_freq_scale,
                       rope_factors_.empty() ? nullptr : rope_factors_.data());
  }
}

void CpuBackend::embed() {
  ROOFLINE_CHECK(layers_.embedding, "the CPU backend does not hold the token embedding");
  const Weight& e = model_->token_embd();
  const int n_embd = model_->hparams().n_embd;
  const size_t row_bytes = dtype_row_bytes(e.type(), n_embd);
  for (int r = 0; r < step_.n_tokens(); ++r)
    dequantize_row_ref(e.type(), e.data() + (size_t)step_.tokens[r] * row_bytes, x_.data() + (size_t)r * n_embd, n_embd);
}

void CpuBackend::set_hidden(const float* hidden) { std::memcpy(x_.data(), hidden, x_.size() * sizeof(float)); }
void CpuBackend::get_hidden(float* hidden) { std::memcpy(hidden, x_.data(), x_.size() * sizeof(float)); }

void CpuBackend::forward(int layer_begin, int layer_end) {
  ROOFLINE_CHECK(layer_begin >= layers_.begin && layer_end <= layers_.end);
  for (int il = layer_begin; il < layer_end; ++il) forward_layer(il);
}

// Products of one input x (n rows of n_cols): the activations converted once per format, and the
// products that read the same format run in one dispatch (matmul_multi), in the order given.
void CpuBackend::products_of_one_input(std::initializer_list<MatmulOut> outs, const float* x, int n, int64_t n_cols) {
  const MatmulOut* begin = outs.begin();
  while (begin != outs.end()) {
    const ActFormat format = act_format_for(begin->w->type());
    const MatmulOut* end = begin + 1;
    while (end != outs.end() && act_format_for(end->w->type()) == format) ++end;
    if (act_.format() != format || begin == outs.begin()) act_.prepare(format, x, n, n_cols, pool_);
    matmul_multi(std::span<const MatmulOut>(begin, end), act_, pool_);
    begin = end;
  }
}

void CpuBackend::forward_layer(int il) {
  const HParams& hp = model_->hparams();
  const LayerWeights& L = model_->layer(il);
  const LayerData& d = layer_data_[il - layers_.begin];
  const int n = step_.n_tokens();
  const int n_embd = hp.n_embd;

  // Attention block.
  pool_.parallel_for((size_t)n, [&](size_t r) {
    rms_norm(x_.data() + r * n_embd, d.attn_norm.data(), xn_.data() + r * n_embd, n_embd, hp.rms_eps);
  });
  observe(L.wq, xn_.data(), n);
  observe(L.wk, xn_.data(), n);
  observe(L.wv, xn_.data(), n);
  products_of_one_input({{&L.wq, q_.data()}, {&L.wk, k_.data()}, {&L.wv, v_.data()}}, xn_.data(), n, n_embd);
  add_bias(q_.data(), d.bq, n);
  add_bias(k_.data(), d.bk, n);
  add_bias(v_.data(), d.bv, n);
  const RopeStyle style = model_->arch().rope_style;
  pool_.parallel_for((size_t)n, [&](size_t r) {
    float* qr = q_.data() + r * hp.q_dim();
    float* kr = k_.data() + r * hp.kv_dim_k();
    if (!d.q_norm.empty()) {
      for (int h = 0; h < hp.n_head; ++h) rms_norm(qr + h * hp.head_dim_k, d.q_norm.data(), qr + h * hp.head_dim_k, hp.head_dim_k, hp.rms_eps);
      for (int h = 0; h < hp.n_head_kv; ++h) rms_norm(kr + h * hp.head_dim_k, d.k_norm.data(), kr + h * hp.head_dim_k, hp.head_dim_k, hp.rms_eps);
    }
    const float* c = rope_.cos.data() + r * rope_.half;
    const float* s = rope_.sin.data() + r * rope_.half;
    rope_row(qr, hp.n_head, hp.head_dim_k, hp.n_rot, style, c, s);
    rope_row(kr, hp.n_head_kv, hp.head_dim_k, hp.n_rot, style, c, s);
  });
  const KvLayerView kv = kv_view(il);
  kv_store(kv, step_, k_.data(), v_.data(), hp.kv_dim_k(), hp.kv_dim_v(), pool_);
  const float scale = hp.attn_scale > 0 ? hp.attn_scale : 1.0f / std::sqrt((float)hp.head_dim_k);
  attention(kv, step_, q_.data(), attn_.data(), hp.n_head, hp.n_head_kv, hp.head_dim_k, hp.head_dim_v, scale, pool_);
  observe(L.wo, attn_.data(), n);
  matmul(L.wo, attn_.data(), n, xn_.data(), pool_);
  for (size_t i = 0; i < x_.size(); ++i) x_[i] += xn_[i];

  // Feed-forward block.
  pool_.parallel_for((size_t)n, [&](size_t r) {
    rms_norm(x_.data() + r * n_embd, d.ffn_norm.data(), xn_.data() + r * n_embd, n_embd, hp.rms_eps);
  });
  observe(L.ffn_gate, xn_.data(), n);
  observe(L.ffn_up, xn_.data(), n);
  products_of_one_input({{&L.ffn_gate, gate_.data()}, {&L.ffn_up, up_.data()}}, xn_.data(), n, n_embd);
  for (size_t i = 0; i < gate_.size(); ++i) gate_[i] = silu(gate_[i]) * up_[i];
  observe(L.ffn_down, gate_.data(), n);
  matmul(L.ffn_down, gate_.data(), n, xn_.data(), pool_);
  for (size_t i = 0; i < x_.size(); ++i) x_[i] += xn_[i];
}

void CpuBackend::output(float* logits) {
  ROOFLINE_CHECK(layers_.output, "the CPU backend does not hold the output layer");
  const HParams& hp = model_->hparams();
  const int n_embd = hp.n_embd;
  const int n_out = (int)step_.logit_rows.size();
  if (n_out == 0) return;
  std::vector<float> normed((size_t)n_out * n_embd);
  for (int i = 0; i < n_out; ++i)
    rms_norm(x_.data() + (size_t)step_.logit_rows[i] * n_embd, output_norm_.data(), normed.data() + (size_t)i * n_embd,
             n_embd, hp.rms_eps);
  observe(model_->output(), normed.data(), n_out);
  matmul(model_->output(), normed.data(), n_out, logits, pool_);
}

void CpuBackend::copy_kv_block(int src, int dst) {
  const size_t bs = (size_t)kv_.block_size;
  for (LayerData& d : layer_data_) {
    std::memcpy(d.k_cache.data() + dst * bs * k_row_bytes_, d.k_cache.data() + src * bs * k_row_bytes_, bs * k_row_bytes_);
    std::memcpy(d.v_cache.data() + dst * bs * v_row_bytes_, d.v_cache.data() + src * bs * v_row_bytes_, bs * v_row_bytes_);
  }
}

}  // namespace roofline::cpu
