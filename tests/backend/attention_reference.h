// Test helpers shared by the CPU and GPU attention tests: a float64 reference of causal paged attention
// (optionally sliding-window) over a dequantized KV cache, and the NMSE of float results against it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "backend/step.h"

namespace roofline::test {

struct AttentionDims {
  int n_head = 1, n_head_kv = 1, head_dim_k = 64, head_dim_v = 64;
};

// Slot of position pos of a sequence in a paged cache of blocks of block_size positions.
inline size_t paged_slot(const StepSequence& s, int pos, int block_size) {
  return (size_t)s.block_table[(size_t)(pos / block_size)] * block_size + pos % block_size;
}

// out[r][h][:] = softmax_j(scale * q[r][h] . k[j]) v[j] over the keys j of row r's sequence in
// [first, positions[r]] (first = positions[r] - window + 1 on sliding layers, else 0), query head h
// reading KV head h / (n_head / n_head_kv). k, v: the dequantized cache, one row of n_head_kv *
// head_dim values per slot. q: [rows x n_head * head_dim_k]; returns [rows x n_head * head_dim_v].
inline std::vector<double> attention_reference(const StepDesc& st, const AttentionDims& d, const float* q, const float* k,
                                               const float* v, int block_size, float scale, int window) {
  const int gqa = d.n_head / d.n_head_kv;
  const size_t kd = (size_t)d.n_head_kv * d.head_dim_k, vd = (size_t)d.n_head_kv * d.head_dim_v;
  std::vector<double> out((size_t)st.n_tokens() * d.n_head * d.head_dim_v, 0.0);
  std::vector<double> w;
  for (int r = 0; r < st.n_tokens(); ++r) {
    const StepSequence& s = st.sequences[(size_t)st.row_seq[(size_t)r]];
    const int last = st.positions[(size_t)r], first = window > 0 ? std::max(0, last - window + 1) : 0;
    for (int h = 0; h < d.n_head; ++h) {
      const int kvh = h / gqa;
      const float* qh = q + ((size_t)r * d.n_head + h) * d.head_dim_k;
      w.clear();
      for (int j = first; j <= last; ++j) {
        const float* kr = k + paged_slot(s, j, block_size) * kd + (size_t)kvh * d.head_dim_k;
        double dot = 0;
        for (int i = 0; i < d.head_dim_k; ++i) dot += (double)qh[i] * kr[i];
        w.push_back(dot * scale);
      }
      const double mx = *std::max_element(w.begin(), w.end());
      double sum = 0;
      for (double& x : w) sum += (x = std::exp(x - mx));
      double* o = out.data() + ((size_t)r * d.n_head + h) * d.head_dim_v;
      for (int j = first; j <= last; ++j) {
        const float* vr = v + paged_slot(s, j, block_size) * vd + (size_t)kvh * d.head_dim_v;
        const double p = w[(size_t)(j - first)] / sum;
        for (int i = 0; i < d.head_dim_v; ++i) o[i] += p * vr[i];
      }
    }
  }
  return out;
}

// sum (a - ref)^2 / sum ref^2 over elements [begin, end) (all when end == 0).
inline double nmse_vs_reference(const std::vector<float>& a, const std::vector<double>& ref, size_t begin = 0, size_t end = 0) {
  if (end == 0) end = ref.size();
  double num = 0, den = 0;
  for (size_t i = begin; i < end; ++i) {
    const double e = (double)a[i] - ref[i];
    num += e * e;
    den += ref[i] * ref[i];
  }
  return den > 0 ? num / den : num;
}

}  // namespace roofline::test
