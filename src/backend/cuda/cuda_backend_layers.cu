// A layer's forward on the CUDA backend (cuda_backend.cuh): norm + quantize -> Q/K/V (one launch where they join)
// -> rope + KV store -> attention -> O (+ residual), or the Gated DeltaNet mixer; then norm + quantize -> gate/up ->
// SwiGLU + quantize -> down (+ residual), or the MoE block (cuda_moe.cuh). Decode-sized steps (<= 8 rows) go
// through the matvec kernels with int8 inputs, larger steps through the GEMMs; decode epilogues, post-norms
// (Gemma 3) and the -sm row partial sums are chosen here.
#include <atomic>

#include "backend/cuda/cuda_backend.cuh"

namespace roofline::cuda {

bool CudaBackend::fuses_input(const Consumers& consumers) const {
  if (!inputs_.enabled() || n_tok_ > ProductInputs::kDecodeRows || model_->hparams().n_embd % 32 != 0) return false;
  for (const DeviceWeight* w : consumers)
    if (w && w->data && !matvec_uses_q8(w->type)) return false;
  return true;
}

CudaBackend::Consumers CudaBackend::mixer_inputs(const LayerDev& L) const {
  using LT = LayerTensor;
  if (L.mixer == MixerKind::Attention) return {&L.m(LT::AttnQ), &L.m(LT::AttnK), &L.m(LT::AttnV), nullptr};
  return {&L.m(LT::SsmQkv), &L.m(LT::SsmGate), &L.m(LT::SsmAlpha), &L.m(LT::SsmBeta)};
}

CudaBackend::LayerDev* CudaBackend::next_layer_here(LayerDev& L) {
  const int il = (int)(&L - layer_dev_.data()) + layers_.begin;
  return il + 1 < forward_end_ ? &L + 1 : nullptr;
}

void CudaBackend::take_input(const MatvecEpilogue& ep, int cols) {
  inputs_.take(ep);
  n_quantized_cols_ = cols;
}

void CudaBackend::quantize_input(const DeviceWeight& w, const float* x, int n) {
  if (matvec_uses_q8(w.type) && n_quantized_cols_ != w.cols) quantize_rows(x, n, (int)w.cols, inputs_.writable(), stream_);
}

void CudaBackend::project(const DeviceWeight& w, const float* x, int n, float* y, int ldy, bool accumulate, const MatvecEpilogue& ep,
                          int next_cols, bool x_ready, __half* x16) {
  if (n <= 8) {
    quantize_input(w, x, n);
    matvec(w, inputs_.current(), x, n, y, ldy, accumulate, stream_, ep);
    if (ep.kind != MatvecEpilogue::Kind::None) take_input(ep, next_cols);
  } else {
    if (ep.kind != MatvecEpilogue::Kind::None) fail("internal error: a decode epilogue on a product of {} rows", n);
    const bool tiles = take_ready_tiles(w, x);
    gemm(cublas_, w, x, n, y, ldy, accumulate, gemm_scratch_, gemm_scratch_elems_, x16 ? x16 : x_f16_, stream_, x_ready || x16 || tiles,
         ahead_.get());
  }
}

int producer_tiles_for_test = -1;                    // (gpu_use_producer_tiles_for_test; -1: the environment's)
std::atomic<int64_t> producer_tiles_taken{0};  // (gpu_producer_tiles_taken_for_test)

WgTiles CudaBackend::producer_tiles(const DeviceWeight& first, const Consumers& joined) const {
  static const bool env = env_switch("ROOFLINE_PRODUCER_TILES", true);
  const bool on = producer_tiles_for_test < 0 ? env : producer_tiles_for_test > 0;
  if (!on || n_tok_ <= 8 || partial_sum_) return {};
  WgTiles tiles = gemm_input_tiles(first, n_tok_, x_f16_);
  // A consumer of the other kind joined with the first in one launch (a Q6_K v beside Q4_K q and k) reads the Q6_K layout.
  for (const DeviceWeight* w : joined)
    if (tiles.out && w && w->type != first.type && gemm_can_join(first, *w, n_tok_)) tiles.out_q6 = wg_q6_tiles(x_f16_, first.cols, tiles.n_pad);
  return tiles;
}

void CudaBackend::tiles_written(const float* x, const DeviceWeight& first, bool with_q6) {
  ready_tiles_x_ = x;
  ready_tiles_type_ = first.type;
  ready_tiles_cols_ = first.cols;
  ready_tiles_q6_ = with_q6;
}

bool CudaBackend::take_ready_tiles(const DeviceWeight& w, const float* x, bool need_q6) {
  const bool ready = x && x == ready_tiles_x_ && w.type == ready_tiles_type_ && w.cols == ready_tiles_cols_ &&
                     (!need_q6 || ready_tiles_q6_) && gemm_input_tiles(w, n_tok_, x_f16_).out != nullptr;
  ready_tiles_x_ = nullptr;
  if (ready) producer_tiles_taken.fetch_add(1, std::memory_order_relaxed);
  return ready;
}

bool CudaBackend::gemm_takes_f16(const DeviceWeight& w, int n) {
  static const bool on = env_switch("ROOFLINE_F16_INPUT_REUSE", true);
  return on && n > 8 && !gemm_fuses_dequant(w, n);
}

int64_t CudaBackend::pre_norm(const char* what, const float* w, bool q8, const Consumers& consumers) {
  const HParams& hp = model_->hparams();
  const DeviceWeight& first = *consumers[0];
  mark(what, 0);
  __half* x16 = f16_outputs_ && gemm_takes_f16(first, n_tok_) ? x_f16_ : nullptr;
  const WgTiles tiles = x16 || q8 ? WgTiles{} : producer_tiles(first, consumers);
  const bool wrote = rms_norm(x_, w, hp.rms_eps, n_tok_, hp.n_embd, nullptr, xn_, q8 ? inputs_.writable() : ActQ8{}, stream_, x16, tiles);
  if (wrote && tiles.out) tiles_written(xn_, first, tiles.out_q6 != nullptr);
  return wrote && x16 ? hp.n_embd : -1;
}

void CudaBackend::project_group(std::initializer_list<Product> products, const float* x, int n, int64_t f16_cols) {
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
        bool mixed = false;
        for (size_t k = 1; k < j - i; ++k) mixed = mixed || ws[k]->type != ws[0]->type;
        const bool tiles = take_ready_tiles(*ws[0], x, mixed);
        gemm_multi(ws, ys, lds, (int)(j - i), x, n, gemm_scratch_, gemm_scratch_elems_, x_f16_, stream_, tiles);
      } else {
        quantize_input(*p[i].w, x, n);
        matvec_multi(ws, ys, lds, (int)(j - i), inputs_.current(), x, n, false, stream_);
      }
    }
    i = j;
  }
}

void CudaBackend::forward_layer(LayerDev& L) {
  if (L.mixer == MixerKind::Attention) attention_block(L);
  else delta_net_block(L);
  ffn_block(L);
}

bool CudaBackend::needs_q8(std::initializer_list<const DeviceWeight*> ws) const {
  if (n_tok_ > 8) return false;
  for (auto* w : ws)
    if (matvec_uses_q8(w->type)) return true;
  return false;
}

void CudaBackend::attention_block(LayerDev& L) {
  using LT = LayerTensor;
  const HParams& hp = model_->hparams();
  const int n = n_tok_;
  // Attention block.
  const bool q8_in = attn_takes_q8(L);
  // (else the previous layer's post-norm kernel wrote the input)
  const int64_t f16_cols = attn_input_ready_ ? -1 : pre_norm("attn norm + quantize", L.v(LT::AttnNorm), q8_in, mixer_inputs(L));
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
  // Batched decode steps on the warpgroup kernel: the combine writes o's activation tiles too (not gated attention,
  // whose output gate comes after); ROOFLINE_ATTN_OUT_TILES=0 leaves that to o's conversion.
  static const bool attn_out_tiles = env_switch("ROOFLINE_ATTN_OUT_TILES", true);
  const WgTiles o_tiles = gated || !prefill_runs_.empty() || !attn_out_tiles ? WgTiles{} : producer_tiles(L.m(LT::AttnOut), {});
  bool o_tiles_written = false;
  bool quantized = attention(st, q_, L.kv, n_attn_rows_, hp.n_head, hp.n_head_kv, hp.head_dim_k, hp.head_dim_v, scale,
                             splits_, partial_, attn_, q8_attn && !gated ? inputs_.writable() : ActQ8{}, attn_rows_dev_, stream_,
                             combine_counters_, split_heads_, grid_splits_, o_tiles, &o_tiles_written);
  if (o_tiles_written) tiles_written(attn_, L.m(LT::AttnOut));
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

void CudaBackend::sum_partials() {
  mark("partial sum", 0);
  partial_sum_(tp_sum_, (size_t)n_tok_ * model_->hparams().n_embd, stream_);
}

bool CudaBackend::post_norm_add(const float* y, const float* w, float* tmp, const float* next_norm, bool q8) {
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

bool CudaBackend::attn_takes_q8(LayerDev& L) const {
  using LT = LayerTensor;
  return needs_q8({&L.m(LT::AttnQ), &L.m(LT::AttnK), &L.m(LT::AttnV)}) && model_->hparams().n_embd % 32 == 0;
}

bool CudaBackend::ffn_takes_q8(LayerDev& L) const {
  using LT = LayerTensor;
  return needs_q8({&L.m(LT::FfnGate), &L.m(LT::FfnUp)}) && model_->hparams().n_embd % 32 == 0;
}

bool CudaBackend::persistent_ffn(LayerDev& L) {
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

void CudaBackend::ffn_block(LayerDev& L) {
  using LT = LayerTensor;
  const HParams& hp = model_->hparams();
  const int n = n_tok_;
  if (moe_) {  // MoE hook: norm, then routing, experts and shared expert on the device (cuda_moe.cuh)
    mark("moe ffn", 0);
    const bool shared = L.m(LT::FfnGateShexp).data != nullptr;
    const MoeLayerDev layer{&L.m(LT::FfnGateInp), &L.m(LT::FfnGateExps), &L.m(LT::FfnUpExps), &L.m(LT::FfnDownExps),
                            shared ? &L.m(LT::FfnGateShexp) : nullptr, shared ? &L.m(LT::FfnUpShexp) : nullptr,
                            shared ? &L.m(LT::FfnDownShexp) : nullptr, L.v(LT::FfnGateInpShexp)};
    const int il = (int)(&L - layer_dev_.data()) + layers_.begin;
    if (host_experts_ && host_experts_->holds(il)) {
      rms_norm(x_, L.v(LT::FfnNorm), hp.rms_eps, n, hp.n_embd, nullptr, xn_, moe_->input_act(), stream_);
      moe_->forward_on_host(layer, *host_experts_, il, xn_, n, x_, host_rows_, stream_);
    } else {
      moe_->forward(layer, L.v(LT::FfnNorm), hp.rms_eps, xn_, n, x_, stream_);  // the norm inside (the router kernel's, for decode)
    }
    return;
  }
  if (n == 1 && persistent_ffn(L)) return;
  const bool q8_ffn = ffn_takes_q8(L);
  // (else the attention block's post-norm kernel wrote the input)
  const int64_t f16_cols = ffn_input_ready_ ? -1 : pre_norm("ffn norm + quantize", L.v(LT::FfnNorm), q8_ffn, ffn_inputs(L));
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
    // Batched steps on the warpgroup kernel: down's activation tiles straight from it (no f32 h, no conversion).
    const WgTiles down_tiles = down_f16 || q8_down || hp.n_ff % 256 != 0 ? WgTiles{} : producer_tiles(L.m(LT::FfnDown), {});
    if (down_tiles.out) {
      mark(gelu_ffn ? "geglu (down's tiles)" : "swiglu (down's tiles)", 0);
      gated_wgmma_tiles(gelu_ffn, gate_, up_, n, (int)hp.n_ff, down_tiles, stream_);
      tiles_written(gate_, L.m(LT::FfnDown));
    } else if (gelu_ffn) {
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

void CudaBackend::delta_net_block(LayerDev& L) {
  using LT = LayerTensor;
  const HParams& hp = model_->hparams();
  const DeltaNetDims& d = hp.delta_net;
  const int n = n_tok_;
  const bool q8_in = needs_q8({&L.m(LT::SsmQkv), &L.m(LT::SsmGate), &L.m(LT::SsmAlpha), &L.m(LT::SsmBeta)}) && hp.n_embd % 32 == 0;
  // (else the previous layer's down product wrote the input)
  const int64_t f16_cols = attn_input_ready_ ? -1 : pre_norm("attn norm + quantize", L.v(LT::AttnNorm), q8_in, mixer_inputs(L));
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

}  // namespace roofline::cuda

namespace roofline {

void gpu_use_producer_tiles_for_test(int on) { cuda::producer_tiles_for_test = on; }
int64_t gpu_producer_tiles_taken_for_test() { return cuda::producer_tiles_taken.load(); }

}  // namespace roofline
