// Routing and grouped expert products of the CPU's mixture-of-experts FFN (moe_cpu.h).
#include "backend/cpu/moe_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "backend/cpu/cpu_ops.h"
#include "core/error.h"

namespace roofline::cpu {

void route_row(const float* logits, int n_expert, int k, bool normalize, float scale, int32_t* ids, float* weights) {
  double mx = -INFINITY;
  for (int e = 0; e < n_expert; ++e) mx = std::max(mx, (double)logits[e]);
  std::vector<double> p((size_t)n_expert);
  double sum = 0;
  for (int e = 0; e < n_expert; ++e) sum += p[(size_t)e] = std::exp((double)logits[e] - mx);
  std::vector<int32_t> order((size_t)n_expert);
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
    return p[(size_t)a] != p[(size_t)b] ? p[(size_t)a] > p[(size_t)b] : a < b;
  });
  double top = 0;
  for (int i = 0; i < k; ++i) top += p[(size_t)order[(size_t)i]];
  const double denom = normalize ? top : sum;
  for (int i = 0; i < k; ++i) {
    ids[i] = order[(size_t)i];
    weights[i] = (float)(p[(size_t)order[(size_t)i]] / denom * scale);
  }
}

gguf::TensorInfo expert_slice(const gguf::TensorInfo& stacked, int expert) {
  ROOFLINE_CHECK(expert >= 0 && expert < stacked.ne[2], "expert {} out of range for {}", expert, stacked.name);
  gguf::TensorInfo t = stacked;
  t.n_dims = 2;
  t.ne = {stacked.ne[0], stacked.ne[1], 1, 1};
  t.n_bytes = stacked.n_bytes / (size_t)stacked.ne[2];
  t.offset = stacked.offset + (uint64_t)expert * t.n_bytes;
  t.data = stacked.data ? stacked.data + (size_t)expert * t.n_bytes : nullptr;
  return t;
}

void ExpertViews::build(const Weight& gate_exps, const Weight& up_exps, const Weight& down_exps) {
  gate.clear();
  up.clear();
  down.clear();
  const int n_expert = (int)gate_exps.tensor->ne[2];
  gate_stacked = gate_exps.tensor;
  up_stacked = up_exps.tensor;
  down_stacked = down_exps.tensor;
  for (int e = 0; e < n_expert; ++e) {
    gate.push_back(expert_slice(*gate_exps.tensor, e));
    up.push_back(expert_slice(*up_exps.tensor, e));
    down.push_back(expert_slice(*down_exps.tensor, e));
  }
}

void MoeExperts::forward(const Weight& router, const ExpertViews& experts, const HParams& hp, const float* x, int n,
                         float* out, ThreadPool& pool, const Backend::MatmulObserver* observer) {
  const int n_embd = hp.n_embd, n_expert = hp.n_expert, k = hp.n_expert_used, n_ff = hp.n_ff_exp;
  logits_.resize((size_t)n * n_expert);
  ids_.resize((size_t)n * k);
  weights_.resize((size_t)n * k);
  matmul(router, x, n, logits_.data(), pool);
  pool.parallel_for((size_t)n, [&](size_t r) {
    route_row(logits_.data() + r * n_expert, n_expert, k, hp.expert_weights_norm, hp.expert_weights_scale,
              ids_.data() + r * k, weights_.data() + r * k);
  });

  // The rows (and their weights) each expert was chosen by, experts in index order.
  std::vector<std::vector<std::pair<int, float>>> chosen_by((size_t)n_expert);
  for (int r = 0; r < n; ++r)
    for (int i = 0; i < k; ++i) chosen_by[(size_t)ids_[(size_t)r * k + i]].push_back({r, weights_[(size_t)r * k + i]});

  std::fill(out, out + (size_t)n * n_embd, 0.0f);
  for (int e = 0; e < n_expert; ++e) {
    const auto& rows = chosen_by[(size_t)e];
    const int m = (int)rows.size();
    if (m == 0) continue;
    xe_.resize((size_t)m * n_embd);
    gate_.resize((size_t)m * n_ff);
    up_.resize((size_t)m * n_ff);
    ye_.resize((size_t)m * n_embd);
    for (int j = 0; j < m; ++j)
      std::memcpy(xe_.data() + (size_t)j * n_embd, x + (size_t)rows[(size_t)j].first * n_embd, n_embd * sizeof(float));
    const Weight w_gate{&experts.gate[(size_t)e]}, w_up{&experts.up[(size_t)e]}, w_down{&experts.down[(size_t)e]};
    if (observer && *observer) {
      (*observer)(*experts.gate_stacked, xe_.data(), m, n_embd, e);
      (*observer)(*experts.up_stacked, xe_.data(), m, n_embd, e);
    }
    if (act_format_for(w_gate.type()) == act_format_for(w_up.type())) {
      act_.prepare(act_format_for(w_gate.type()), xe_.data(), m, n_embd, pool);
      const MatmulOut outs[] = {{&w_gate, gate_.data()}, {&w_up, up_.data()}};
      matmul_multi(outs, act_, pool);
    } else {
      matmul(w_gate, xe_.data(), m, gate_.data(), pool);
      matmul(w_up, xe_.data(), m, up_.data(), pool);
    }
    for (size_t i = 0; i < gate_.size(); ++i) gate_[i] = silu(gate_[i]) * up_[i];
    if (observer && *observer) (*observer)(*experts.down_stacked, gate_.data(), m, n_ff, e);
    matmul(w_down, gate_.data(), m, ye_.data(), pool);
    for (int j = 0; j < m; ++j) {
      float* o = out + (size_t)rows[(size_t)j].first * n_embd;
      const float* y = ye_.data() + (size_t)j * n_embd;
      const float w = rows[(size_t)j].second;
      for (int i = 0; i < n_embd; ++i) o[i] += w * y[i];
    }
  }
}

}  // namespace roofline::cpu
