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
                         float* out, ThreadPool& pool, const Backend::MatmulObserver* observer, const PackedWeights* packed) {
  const int n_embd = hp.n_embd, n_expert = hp.n_expert, k = hp.n_expert_used, n_ff = hp.n_ff_exp;
  logits_.resize((size_t)n * n_expert);
  ids_.resize((size_t)n * k);
  weights_.resize((size_t)n * k);
  matmul(router, x, n, logits_.data(), pool, packed);
  const auto route = [&](size_t r) {
    route_row(logits_.data() + r * n_expert, n_expert, k, hp.expert_weights_norm, hp.expert_weights_scale,
              ids_.data() + r * k, weights_.data() + r * k);
  };
  if (n <= 4) {
    for (int r = 0; r < n; ++r) route((size_t)r);
  } else {
    pool.parallel_for((size_t)n, route);
  }

  // The rows (and their weights) each expert was chosen by; the experts used, in index order, and where
  // each one's rows start in the gathered buffers.
  std::vector<std::vector<std::pair<int, float>>> chosen_by((size_t)n_expert);
  for (int r = 0; r < n; ++r)
    for (int i = 0; i < k; ++i) chosen_by[(size_t)ids_[(size_t)r * k + i]].push_back({r, weights_[(size_t)r * k + i]});
  std::vector<int> used, first_row;
  int n_gathered = 0;
  for (int e = 0; e < n_expert; ++e) {
    if (chosen_by[(size_t)e].empty()) continue;
    used.push_back(e);
    first_row.push_back(n_gathered);
    n_gathered += (int)chosen_by[(size_t)e].size();
  }
  const size_t n_used = used.size();
  weight_bytes_read_ = (double)router.tensor->n_bytes;
  for (const int e : used)
    weight_bytes_read_ += (double)(experts.gate[(size_t)e].n_bytes + experts.up[(size_t)e].n_bytes + experts.down[(size_t)e].n_bytes);
  if (in_gate_.size() < n_used) {
    in_gate_.resize(n_used);
    in_up_.resize(n_used);
    hidden_.resize(n_used);
  }
  gate_.resize((size_t)n_gathered * n_ff);
  up_.resize((size_t)n_gathered * n_ff);
  ye_.resize((size_t)n_gathered * n_embd);

  // x's rows converted once per format, each expert's rows gathered from them (the same bytes as converting
  // them per expert), then every expert's gate and up products in one dispatch.
  const DType t_gate = experts.gate_stacked->type, t_up = experts.up_stacked->type, t_down = experts.down_stacked->type;
  const bool same_format = act_format_for(t_gate) == act_format_for(t_up);
  x_gate_.prepare(act_format_for(t_gate), x, n, n_embd, pool);
  if (!same_format) x_up_.prepare(act_format_for(t_up), x, n, n_embd, pool);
  std::vector<Weight> w_gate(n_used), w_up(n_used), w_down(n_used);
  std::vector<Product> products;
  products.reserve(2 * n_used);
  std::vector<int> rows;
  for (size_t i = 0; i < n_used; ++i) {
    const int e = used[i];
    rows.clear();
    for (const auto& [r, w] : chosen_by[(size_t)e]) rows.push_back(r);
    in_gate_[i].gather(x_gate_, rows);
    if (!same_format) in_up_[i].gather(x_up_, rows);
    w_gate[i] = Weight{&experts.gate[(size_t)e]};
    w_up[i] = Weight{&experts.up[(size_t)e]};
    w_down[i] = Weight{&experts.down[(size_t)e]};
    if (observer && *observer) {
      xe_.resize(rows.size() * (size_t)n_embd);
      for (size_t j = 0; j < rows.size(); ++j)
        std::memcpy(xe_.data() + j * n_embd, x + (size_t)rows[j] * n_embd, n_embd * sizeof(float));
      (*observer)(*experts.gate_stacked, xe_.data(), (int)rows.size(), n_embd, e);
      (*observer)(*experts.up_stacked, xe_.data(), (int)rows.size(), n_embd, e);
    }
    products.push_back({&w_gate[i], &in_gate_[i], gate_.data() + (size_t)first_row[i] * n_ff});
    products.push_back({&w_up[i], same_format ? &in_gate_[i] : &in_up_[i], up_.data() + (size_t)first_row[i] * n_ff});
  }
  matmul_products(products, pool, packed);

  // silu(gate) * up and its rows for the down products, one task per expert (in order, on this thread, when
  // an observer watches the down inputs).
  const auto hidden = [&](size_t i) {
    const int m = (int)chosen_by[(size_t)used[i]].size();
    float* g = gate_.data() + (size_t)first_row[i] * n_ff;
    const float* u = up_.data() + (size_t)first_row[i] * n_ff;
    gated_activation(g, u, (size_t)m * n_ff, false);
    if (observer && *observer) (*observer)(*experts.down_stacked, g, m, n_ff, used[i]);
    hidden_[i].prepare(act_format_for(t_down), g, m, n_ff, serial_);
  };
  if (observer && *observer) {
    for (size_t i = 0; i < n_used; ++i) hidden(i);
  } else {
    pool.parallel_for(n_used, hidden);
  }
  products.clear();
  for (size_t i = 0; i < n_used; ++i)
    products.push_back({&w_down[i], &hidden_[i], ye_.data() + (size_t)first_row[i] * n_embd});
  matmul_products(products, pool, packed);

  // Each row's experts added in expert order.
  std::fill(out, out + (size_t)n * n_embd, 0.0f);
  for (size_t i = 0; i < n_used; ++i) {
    const auto& chosen = chosen_by[(size_t)used[i]];
    for (size_t j = 0; j < chosen.size(); ++j) {
      float* o = out + (size_t)chosen[j].first * n_embd;
      const float* y = ye_.data() + (size_t)(first_row[i] + (int)j) * n_embd;
      const float w = chosen[j].second;
      for (int c = 0; c < n_embd; ++c) o[c] += w * y[c];
    }
  }
}

}  // namespace roofline::cpu
