// A plain double-precision forward pass (no paging, no batching, no quantized activations) for the
// llama / qwen2 / qwen3 block, Qwen3.5's gated attention and Gated DeltaNet layers, the mixture-of-experts
// FFN of qwen3moe / qwen35moe (as transformers routes) and Gemma 3's block (scaled embeddings, post
// norms, GeGLU, sliding-window layers with their own RoPE base), written from
// the architecture description independently of the engine: the oracle the engine's logits are
// compared with.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "formats/quant_ref.h"
#include "model/model.h"

namespace roofline::test {

class ReferenceForward {
 public:
  explicit ReferenceForward(const Model& model) : m_(model), hp_(model.hparams()) {
    kcache_.resize(hp_.n_layer);
    vcache_.resize(hp_.n_layer);
    conv_window_.resize(hp_.n_layer);
    ssm_state_.resize(hp_.n_layer);
  }

  // Rounds every K and V row stored from now on through that type's reference codec, as a KV cache of
  // that type stores them (whole rows of n_head_kv * head_dim; F32: exact).
  void set_kv_types(DType k, DType v) {
    kv_type_k_ = k;
    kv_type_v_ = v;
  }

  // Feeds one token at the next position; returns its logits.
  std::vector<double> step(int32_t token) {
    std::vector<double> x = row(m_.token_embd(), token);
    if (hp_.embd_scale > 0)
      for (double& e : x) e *= hp_.embd_scale;
    return step_input(std::move(x));
  }

  // Feeds one row at the next position starting from the hidden state x instead of a token's embedding
  // (the MTP block's input); returns its logits.
  std::vector<double> step_input(std::vector<double> x) {
    const int pos = n_past_++;
    using LT = LayerTensor;
    const bool geglu = m_.arch().ffn == FfnKind::GeGLU;
    for (int il = 0; il < hp_.n_layer; ++il) {
      const LayerWeights& L = m_.layer(il);
      std::vector<double> xn = norm(x, vec(L[LT::AttnNorm]));
      std::vector<double> o = L.mixer == MixerKind::Attention ? attention(L, il, xn, pos) : delta_net(L, il, xn);
      if (L[LT::AttnPostNorm]) o = norm(o, vec(L[LT::AttnPostNorm]));
      for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];
      xn = norm(x, vec(L[LT::FfnNorm]));
      std::vector<double> d = hp_.is_moe() ? moe(L, xn) : gated_ffn(L[LT::FfnGate], L[LT::FfnUp], L[LT::FfnDown], xn, geglu);
      if (L[LT::FfnPostNorm]) d = norm(d, vec(L[LT::FfnPostNorm]));
      for (size_t i = 0; i < x.size(); ++i) x[i] += d[i];
    }
    hidden_ = norm(x, vec(m_.output_norm()));
    std::vector<double> logits = matvec(m_.output(), hidden_);
    if (hp_.final_logit_softcap > 0)
      for (double& l : logits) l = hp_.final_logit_softcap * std::tanh(l / hp_.final_logit_softcap);
    return logits;
  }

  // A dense attention layer in two pieces, for a caller that sums each piece over tensor-parallel slices
  // of the model (Model::tensor_slice): the attention block's output for the residual x at position pos
  // (its norm, attention over this model's heads storing the row's keys and values, the output product),
  // and the FFN block's output for x. Then the logits of a final residual x.
  std::vector<double> attention_block(int il, const std::vector<double>& x, int pos) {
    const LayerWeights& L = m_.layer(il);
    return attention(L, il, norm(x, vec(L[LayerTensor::AttnNorm])), pos);
  }
  std::vector<double> ffn_block(int il, const std::vector<double>& x) {
    const LayerWeights& L = m_.layer(il);
    using LT = LayerTensor;
    return gated_ffn(L[LT::FfnGate], L[LT::FfnUp], L[LT::FfnDown], norm(x, vec(L[LT::FfnNorm])), m_.arch().ffn == FfnKind::GeGLU);
  }
  std::vector<double> logits_of(const std::vector<double>& x) const { return matvec(m_.output(), norm(x, vec(m_.output_norm()))); }

  // The final hidden state of the last step(), after the output norm (what embeddings pool).
  const std::vector<double>& last_hidden() const { return hidden_; }

  // The weight helpers, for oracles built on this one (the MTP head's input rows).
  std::vector<double> weight_vector(const Weight& w) const { return vec(w); }
  std::vector<double> weight_row(const Weight& w, int64_t r) const { return row(w, r); }
  std::vector<double> product(const Weight& w, const std::vector<double>& x) const { return matvec(w, x); }
  std::vector<double> rms_norm(const std::vector<double>& x, const std::vector<double>& w) const { return norm(x, w); }

 private:
  std::vector<double> attention(const LayerWeights& L, int il, const std::vector<double>& xn, int pos) {
    using LT = LayerTensor;
    const int hd = hp_.head_dim_k;
    std::vector<double> qg = matvec(L[LT::AttnQ], xn), k = matvec(L[LT::AttnK], xn), v = matvec(L[LT::AttnV], xn);
    std::vector<double> q = qg, gate;
    if (hp_.attn_output_gate) {  // per head [q_h | gate_h]
      q.assign((size_t)hp_.q_dim(), 0.0);
      gate.assign((size_t)hp_.q_dim(), 0.0);
      for (int h = 0; h < hp_.n_head; ++h)
        for (int i = 0; i < hd; ++i) {
          q[(size_t)h * hd + i] = qg[(size_t)h * 2 * hd + i];
          gate[(size_t)h * hd + i] = qg[(size_t)h * 2 * hd + hd + i];
        }
    }
    add(q, L[LT::AttnQBias]);
    add(k, L[LT::AttnKBias]);
    add(v, L[LT::AttnVBias]);
    if (L[LT::AttnQNorm]) {
      const auto qw = vec(L[LT::AttnQNorm]), kw = vec(L[LT::AttnKNorm]);
      for (int h = 0; h < hp_.n_head; ++h) head_norm(q, h, qw);
      for (int h = 0; h < hp_.n_head_kv; ++h) head_norm(k, h, kw);
    }
    rope(q, hp_.n_head, pos, il);
    rope(k, hp_.n_head_kv, pos, il);
    kcache_[il].push_back(round_through(kv_type_k_, k));
    vcache_[il].push_back(round_through(kv_type_v_, v));
    std::vector<double> attn((size_t)hp_.n_head * hp_.head_dim_v, 0.0);
    const double scale = hp_.attn_scale > 0 ? hp_.attn_scale : 1.0 / std::sqrt((double)hd);
    // A sliding layer sees the keys at positions (pos - window, pos].
    const int window = hp_.attention_window(il);
    const int first = window > 0 ? std::max(0, pos - window + 1) : 0;
    for (int h = 0; h < hp_.n_head; ++h) {
      const int kvh = h / hp_.n_gqa();
      std::vector<double> s(pos + 1, 0.0);
      double mx = -1e300;
      for (int j = first; j <= pos; ++j) {
        double d = 0;
        for (int i = 0; i < hd; ++i) d += q[h * hd + i] * kcache_[il][j][kvh * hd + i];
        s[j] = d * scale;
        mx = std::max(mx, s[j]);
      }
      double sum = 0;
      for (int j = first; j <= pos; ++j) sum += s[j] = std::exp(s[j] - mx);
      for (int j = first; j <= pos; ++j)
        for (int i = 0; i < hp_.head_dim_v; ++i)
          attn[h * hp_.head_dim_v + i] += s[j] / sum * vcache_[il][j][kvh * hp_.head_dim_v + i];
    }
    if (!gate.empty())
      for (size_t i = 0; i < attn.size(); ++i) attn[i] /= 1.0 + std::exp(-gate[i]);
    return matvec(L[LT::AttnOut], attn);
  }

  // Gated DeltaNet: conv over the raw qkv channels (kept window), L2-normalised q/k, the gated delta
  // rule per value head (key head h % n_k_heads), gated RMSNorm, output projection.
  std::vector<double> delta_net(const LayerWeights& L, int il, const std::vector<double>& xn) {
    using LT = LayerTensor;
    const DeltaNetDims& d = hp_.delta_net;
    const int K = d.conv_kernel, C = d.conv_dim(), dk = d.head_k, dv = d.head_v;
    const std::vector<double> raw = matvec(L[LT::SsmQkv], xn), z = matvec(L[LT::SsmGate], xn);
    const std::vector<double> alpha = matvec(L[LT::SsmAlpha], xn), beta = matvec(L[LT::SsmBeta], xn);
    const std::vector<double> conv = vec(L[LT::SsmConv]), dt = vec(L[LT::SsmDtBias]), a = vec(L[LT::SsmA]);
    const std::vector<double> nw = vec(L[LT::SsmNorm]);
    auto& window = conv_window_[il];
    auto& S = ssm_state_[il];
    if (window.empty()) window.assign((size_t)(K - 1) * C, 0.0);
    if (S.empty()) S.assign((size_t)d.n_v_heads * dk * dv, 0.0);  // S[h][i][j], i: key, j: value
    std::vector<double> c(C);
    for (int ch = 0; ch < C; ++ch) {
      double acc = conv[(size_t)ch * K + K - 1] * raw[ch];
      for (int k = 0; k < K - 1; ++k) acc += conv[(size_t)ch * K + k] * window[(size_t)k * C + ch];
      c[ch] = acc / (1.0 + std::exp(-acc));
    }
    for (int k = 0; k + 1 < K - 1; ++k)
      for (int ch = 0; ch < C; ++ch) window[(size_t)k * C + ch] = window[(size_t)(k + 1) * C + ch];
    if (K > 1)
      for (int ch = 0; ch < C; ++ch) window[(size_t)(K - 2) * C + ch] = raw[ch];
    auto l2 = [&](double* p) {
      double ss = 0;
      for (int i = 0; i < dk; ++i) ss += p[i] * p[i];
      for (int i = 0; i < dk; ++i) p[i] /= std::sqrt(ss + 1e-6);
    };
    for (int h = 0; h < d.n_k_heads; ++h) {
      l2(c.data() + (size_t)h * dk);
      l2(c.data() + d.key_dim() + (size_t)h * dk);
    }
    std::vector<double> out((size_t)d.value_dim());
    for (int h = 0; h < d.n_v_heads; ++h) {
      const double* q = c.data() + (size_t)(h % d.n_k_heads) * dk;
      const double* kk = c.data() + d.key_dim() + (size_t)(h % d.n_k_heads) * dk;
      const double* v = c.data() + 2 * d.key_dim() + (size_t)h * dv;
      const double sp = alpha[h] + dt[h] > 20 ? alpha[h] + dt[h] : std::log1p(std::exp(alpha[h] + dt[h]));
      const double decay = std::exp(sp * a[h]), b = 1.0 / (1.0 + std::exp(-beta[h]));
      double* Sh = S.data() + (size_t)h * dk * dv;
      for (size_t e = 0; e < (size_t)dk * dv; ++e) Sh[e] *= decay;
      std::vector<double> o(dv);
      for (int j = 0; j < dv; ++j) {
        double kv = 0;
        for (int i = 0; i < dk; ++i) kv += Sh[(size_t)i * dv + j] * kk[i];
        const double delta = b * (v[j] - kv);
        for (int i = 0; i < dk; ++i) Sh[(size_t)i * dv + j] += kk[i] * delta;
      }
      double ss = 0;
      for (int j = 0; j < dv; ++j) {
        double acc = 0;
        for (int i = 0; i < dk; ++i) acc += Sh[(size_t)i * dv + j] * q[i];
        o[j] = acc / std::sqrt((double)dk);
        ss += o[j] * o[j];
      }
      const double inv = 1.0 / std::sqrt(ss / dv + hp_.rms_eps);
      for (int j = 0; j < dv; ++j) {
        const double zj = z[(size_t)h * dv + j];
        out[(size_t)h * dv + j] = o[j] * inv * nw[j] * zj / (1.0 + std::exp(-zj));
      }
    }
    return matvec(L[LT::SsmOut], out);
  }

  // down(silu(gate x) * up x); `expert` picks one matrix of stacked [in, out, n_expert] tensors.
  // down(act(gate x) * up x), act = silu (SwiGLU) or tanh-approximated GELU (GeGLU: gemma).
  std::vector<double> gated_ffn(const Weight& gate, const Weight& up, const Weight& down, const std::vector<double>& x,
                                bool geglu = false, int64_t expert = 0) const {
    std::vector<double> g = matvec(gate, x, expert), u = matvec(up, x, expert);
    for (size_t i = 0; i < g.size(); ++i) {
      const double a = g[i];
      const double act = geglu ? 0.5 * a * (1.0 + std::tanh(0.7978845608028654 * (a + 0.044715 * a * a * a)))
                               : a / (1.0 + std::exp(-a));
      g[i] = act * u[i];
    }
    return matvec(down, g, expert);
  }

  // transformers' Qwen3MoeSparseMoeBlock / Qwen3_5MoeSparseMoeBlock: softmax over the router's logits,
  // the top k probabilities (renormalised to sum 1 when norm_topk_prob), each chosen expert's SwiGLU
  // weighted by its probability; plus the shared expert times sigmoid(shared_expert_gate x).
  std::vector<double> moe(const LayerWeights& L, const std::vector<double>& xn) const {
    using LT = LayerTensor;
    const std::vector<double> logits = matvec(L[LT::FfnGateInp], xn);
    const double mx = *std::max_element(logits.begin(), logits.end());
    std::vector<double> p(logits.size());
    double sum = 0;
    for (size_t e = 0; e < p.size(); ++e) sum += p[e] = std::exp(logits[e] - mx);
    for (double& v : p) v /= sum;
    std::vector<size_t> order(p.size());
    for (size_t e = 0; e < order.size(); ++e) order[e] = e;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return p[a] > p[b]; });
    order.resize((size_t)hp_.n_expert_used);
    double top = 0;
    for (size_t e : order) top += p[e];
    std::vector<double> out(xn.size(), 0.0);
    for (size_t e : order) {
      const double w = (hp_.expert_weights_norm ? p[e] / top : p[e]) * hp_.expert_weights_scale;
      const std::vector<double> y = gated_ffn(L[LT::FfnGateExps], L[LT::FfnUpExps], L[LT::FfnDownExps], xn, false, (int64_t)e);
      for (size_t i = 0; i < out.size(); ++i) out[i] += w * y[i];
    }
    if (L[LT::FfnGateInpShexp]) {
      const std::vector<double> g = vec(L[LT::FfnGateInpShexp]);
      double dot = 0;
      for (size_t i = 0; i < xn.size(); ++i) dot += g[i] * xn[i];
      const double s = 1.0 / (1.0 + std::exp(-dot));
      const std::vector<double> y = gated_ffn(L[LT::FfnGateShexp], L[LT::FfnUpShexp], L[LT::FfnDownShexp], xn);
      for (size_t i = 0; i < out.size(); ++i) out[i] += s * y[i];
    }
    return out;
  }

  std::vector<double> vec(const Weight& w) const {
    std::vector<float> f((size_t)w.tensor->n_elements());
    dequantize_rows_ref(w.type(), w.data(), f.data(), w.tensor->n_rows(), w.tensor->row_length());
    return std::vector<double>(f.begin(), f.end());
  }
  static std::vector<double> round_through(DType type, const std::vector<double>& x) {
    if (type == DType::F32) return x;
    std::vector<float> f(x.begin(), x.end()), back(x.size());
    std::vector<uint8_t> q(dtype_row_bytes(type, (int64_t)x.size()));
    quantize_row_ref(type, f.data(), q.data(), (int64_t)x.size());
    dequantize_row_ref(type, q.data(), back.data(), (int64_t)x.size());
    return std::vector<double>(back.begin(), back.end());
  }
  std::vector<double> row(const Weight& w, int64_t r) const {
    std::vector<float> f((size_t)w.cols());
    dequantize_row_ref(w.type(), w.data() + r * dtype_row_bytes(w.type(), w.cols()), f.data(), w.cols());
    return std::vector<double>(f.begin(), f.end());
  }
  std::vector<double> matvec(const Weight& w, const std::vector<double>& x, int64_t matrix = 0) const {
    std::vector<double> y((size_t)w.rows());
    std::vector<float> f((size_t)w.cols());
    const size_t rb = dtype_row_bytes(w.type(), w.cols());
    const uint8_t* base = w.data() + (size_t)matrix * w.rows() * rb;
    for (int64_t r = 0; r < w.rows(); ++r) {
      dequantize_row_ref(w.type(), base + r * rb, f.data(), w.cols());
      double s = 0;
      for (int64_t i = 0; i < w.cols(); ++i) s += (double)f[i] * x[i];
      y[r] = s;
    }
    return y;
  }
  void add(std::vector<double>& y, const Weight& b) const {
    if (!b) return;
    const auto bv = vec(b);
    for (size_t i = 0; i < y.size(); ++i) y[i] += bv[i];
  }
  std::vector<double> norm(const std::vector<double>& x, const std::vector<double>& w) const {
    double s = 0;
    for (double v : x) s += v * v;
    const double k = 1.0 / std::sqrt(s / x.size() + hp_.rms_eps);
    std::vector<double> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * k * w[i];
    return y;
  }
  void head_norm(std::vector<double>& x, int h, const std::vector<double>& w) const {
    std::vector<double> part(x.begin() + h * hp_.head_dim_k, x.begin() + (h + 1) * hp_.head_dim_k);
    part = norm(part, w);
    std::copy(part.begin(), part.end(), x.begin() + h * hp_.head_dim_k);
  }
  void rope(std::vector<double>& x, int n_heads, int pos, int il) const {
    const int half = hp_.n_rot / 2;
    std::vector<double> factors;
    if (m_.rope_freqs()) factors = vec(m_.rope_freqs());
    for (int h = 0; h < n_heads; ++h) {
      double* v = x.data() + (size_t)h * hp_.head_dim_k;
      for (int i = 0; i < half; ++i) {
        double freq = hp_.rope_scale(il) * std::pow((double)hp_.rope_base(il), -2.0 * i / hp_.n_rot);
        if (!factors.empty()) freq /= factors[i];
        const double c = std::cos(pos * freq), s = std::sin(pos * freq);
        const bool norm_style = m_.arch().rope_style == RopeStyle::Norm;
        const int a = norm_style ? 2 * i : i, b = norm_style ? 2 * i + 1 : i + half;
        const double x0 = v[a], x1 = v[b];
        v[a] = x0 * c - x1 * s;
        v[b] = x0 * s + x1 * c;
      }
    }
  }

  const Model& m_;
  const HParams& hp_;
  int n_past_ = 0;
  std::vector<double> hidden_;  // the last step's final hidden state (normed)
  DType kv_type_k_ = DType::F32, kv_type_v_ = DType::F32;
  std::vector<std::vector<std::vector<double>>> kcache_, vcache_;
  std::vector<std::vector<double>> conv_window_, ssm_state_;  // DeltaNet layers
};

}  // namespace roofline::test
