// A plain double-precision forward pass (no paging, no batching, no quantized activations) for the
// llama / qwen2 / qwen3 block, written from the architecture description independently of the
// engine: the oracle the engine's logits are compared with.
#pragma once

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
  }

  // Feeds one token at the next position; returns its logits.
  std::vector<double> step(int32_t token) {
    const int pos = n_past_++;
    std::vector<double> x = row(m_.token_embd(), token);
    for (int il = 0; il < hp_.n_layer; ++il) {
      const LayerWeights& L = m_.layer(il);
      std::vector<double> xn = norm(x, vec(L.attn_norm));
      std::vector<double> q = matvec(L.wq, xn), k = matvec(L.wk, xn), v = matvec(L.wv, xn);
      add(q, L.bq);
      add(k, L.bk);
      add(v, L.bv);
      if (L.q_norm) {
        const auto qw = vec(L.q_norm), kw = vec(L.k_norm);
        for (int h = 0; h < hp_.n_head; ++h) head_norm(q, h, qw);
        for (int h = 0; h < hp_.n_head_kv; ++h) head_norm(k, h, kw);
      }
      rope(q, hp_.n_head, pos);
      rope(k, hp_.n_head_kv, pos);
      kcache_[il].push_back(k);
      vcache_[il].push_back(v);
      std::vector<double> attn((size_t)hp_.n_head * hp_.head_dim_v, 0.0);
      const double scale = hp_.attn_scale > 0 ? hp_.attn_scale : 1.0 / std::sqrt((double)hp_.head_dim_k);
      for (int h = 0; h < hp_.n_head; ++h) {
        const int kvh = h / hp_.n_gqa();
        std::vector<double> s(pos + 1);
        double mx = -1e300;
        for (int j = 0; j <= pos; ++j) {
          double d = 0;
          for (int i = 0; i < hp_.head_dim_k; ++i) d += q[h * hp_.head_dim_k + i] * kcache_[il][j][kvh * hp_.head_dim_k + i];
          s[j] = d * scale;
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (double& e : s) sum += e = std::exp(e - mx);
        for (int j = 0; j <= pos; ++j)
          for (int i = 0; i < hp_.head_dim_v; ++i)
            attn[h * hp_.head_dim_v + i] += s[j] / sum * vcache_[il][j][kvh * hp_.head_dim_v + i];
      }
      std::vector<double> o = matvec(L.wo, attn);
      for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];
      xn = norm(x, vec(L.ffn_norm));
      std::vector<double> g = matvec(L.ffn_gate, xn), u = matvec(L.ffn_up, xn);
      for (size_t i = 0; i < g.size(); ++i) g[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
      std::vector<double> d = matvec(L.ffn_down, g);
      for (size_t i = 0; i < x.size(); ++i) x[i] += d[i];
    }
    return matvec(m_.output(), norm(x, vec(m_.output_norm())));
  }

 private:
  std::vector<double> vec(const Weight& w) const {
    std::vector<float> f((size_t)w.tensor->n_elements());
    dequantize_rows_ref(w.type(), w.data(), f.data(), w.tensor->n_rows(), w.tensor->row_length());
    return std::vector<double>(f.begin(), f.end());
  }
  std::vector<double> row(const Weight& w, int64_t r) const {
    std::vector<float> f((size_t)w.cols());
    dequantize_row_ref(w.type(), w.data() + r * dtype_row_bytes(w.type(), w.cols()), f.data(), w.cols());
    return std::vector<double>(f.begin(), f.end());
  }
  std::vector<double> matvec(const Weight& w, const std::vector<double>& x) const {
    std::vector<double> y((size_t)w.rows());
    std::vector<float> f((size_t)w.cols());
    const size_t rb = dtype_row_bytes(w.type(), w.cols());
    for (int64_t r = 0; r < w.rows(); ++r) {
      dequantize_row_ref(w.type(), w.data() + r * rb, f.data(), w.cols());
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
  void rope(std::vector<double>& x, int n_heads, int pos) const {
    const int half = hp_.n_rot / 2;
    std::vector<double> factors;
    if (m_.rope_freqs()) factors = vec(m_.rope_freqs());
    for (int h = 0; h < n_heads; ++h) {
      double* v = x.data() + (size_t)h * hp_.head_dim_k;
      for (int i = 0; i < half; ++i) {
        double freq = hp_.rope_freq_scale * std::pow((double)hp_.rope_freq_base, -2.0 * i / hp_.n_rot);
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
  std::vector<std::vector<std::vector<double>>> kcache_, vcache_;
};

}  // namespace roofline::test
