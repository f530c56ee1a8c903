// The Gated DeltaNet mixer in double precision, token by token, written straight from the formulas
// in delta_net.h: the oracle the CPU and CUDA kernels are tested against.
#include <cmath>
#include <vector>

#include "backend/delta_net.h"
#include "core/error.h"

namespace roofline {

namespace {

double silu(double x) { return x / (1.0 + std::exp(-x)); }
double softplus(double x) { return x > 20.0 ? x : std::log1p(std::exp(x)); }
double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

void l2_normalize(double* x, int n) {
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += x[i] * x[i];
  const double inv = 1.0 / std::sqrt(sum + 1e-6);
  for (int i = 0; i < n; ++i) x[i] *= inv;
}

}  // namespace

void delta_net_reference(const DeltaNetDims& d, const DeltaNetWeights& w, float eps, std::span<const DeltaNetSeq> seqs,
                         const float* qkv, const float* z, const float* alpha, const float* beta, float* out) {
  ROOFLINE_CHECK(d.n_k_heads > 0 && d.n_v_heads % d.n_k_heads == 0 && d.conv_kernel >= 1);
  const int K = d.conv_kernel, C = d.conv_dim(), dk = d.head_k, dv = d.head_v, nv = d.n_v_heads;
  const size_t conv_floats = d.conv_state_floats();
  for (const DeltaNetSeq& s : seqs) {
    // The state in double for the whole run of rows.
    std::vector<double> window((size_t)(K - 1) * C, 0.0);
    std::vector<double> S(d.ssm_state_floats(), 0.0);
    if (!s.fresh) {
      for (size_t i = 0; i < window.size(); ++i) window[i] = s.state[i];
      for (size_t i = 0; i < S.size(); ++i) S[i] = s.state[conv_floats + i];
    }
    std::vector<double> c(C), o(dv);
    for (int t = 0; t < s.n_rows; ++t) {
      const int row = s.first_row + t;
      const float* x = qkv + (size_t)row * C;
      // Causal conv over [window (K-1 rows, oldest first), x], then SiLU; the window slides by one.
      for (int ch = 0; ch < C; ++ch) {
        double acc = 0;
        for (int k = 0; k < K - 1; ++k) acc += w.conv[(size_t)ch * K + k] * window[(size_t)k * C + ch];
        acc += w.conv[(size_t)ch * K + K - 1] * (double)x[ch];
        c[ch] = silu(acc);
      }
      if (K > 1) {
        for (int k = 0; k + 1 < K - 1; ++k)
          for (int ch = 0; ch < C; ++ch) window[(size_t)k * C + ch] = window[(size_t)(k + 1) * C + ch];
        for (int ch = 0; ch < C; ++ch) window[(size_t)(K - 2) * C + ch] = x[ch];
      }
      double* q = c.data();
      double* k = c.data() + d.key_dim();
      const double* v = c.data() + 2 * d.key_dim();
      for (int h = 0; h < d.n_k_heads; ++h) {
        l2_normalize(q + (size_t)h * dk, dk);
        l2_normalize(k + (size_t)h * dk, dk);
      }
      for (int h = 0; h < nv; ++h) {
        const int hk = h % d.n_k_heads;
        const double* qh = q + (size_t)hk * dk;
        const double* kh = k + (size_t)hk * dk;
        const double* vh = v + (size_t)h * dv;
        const double g = softplus((double)alpha[(size_t)row * nv + h] + w.dt_bias[h]) * w.a[h];
        const double b = sigmoid(beta[(size_t)row * nv + h]);
        const double decay = std::exp(g);
        double* Sh = S.data() + (size_t)h * dv * dk;  // Sh[j * dk + i] = S[i][j]
        for (size_t e = 0; e < (size_t)dv * dk; ++e) Sh[e] *= decay;
        for (int j = 0; j < dv; ++j) {
          double kv = 0;
          for (int i = 0; i < dk; ++i) kv += Sh[(size_t)j * dk + i] * kh[i];
          const double delta = b * (vh[j] - kv);
          for (int i = 0; i < dk; ++i) Sh[(size_t)j * dk + i] += kh[i] * delta;
        }
        const double scale = 1.0 / std::sqrt((double)dk);
        double ss = 0;
        for (int j = 0; j < dv; ++j) {
          double acc = 0;
          for (int i = 0; i < dk; ++i) acc += Sh[(size_t)j * dk + i] * qh[i];
          o[j] = acc * scale;
          ss += o[j] * o[j];
        }
        const double inv = 1.0 / std::sqrt(ss / dv + (double)eps);
        for (int j = 0; j < dv; ++j) {
          const double zj = z[(size_t)row * d.value_dim() + (size_t)h * dv + j];
          out[(size_t)row * d.value_dim() + (size_t)h * dv + j] = (float)(o[j] * inv * w.norm[j] * silu(zj));
        }
      }
    }
    for (size_t i = 0; i < window.size(); ++i) s.state[i] = (float)window[i];
    for (size_t i = 0; i < S.size(); ++i) s.state[conv_floats + i] = (float)S[i];
  }
}

}  // namespace roofline
