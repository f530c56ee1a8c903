// CPU implementations of norm, RoPE, KV store and paged attention.
#include "backend/cpu/cpu_ops.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "backend/cpu/attention_kernels.h"
#include "backend/cpu/vec_dot.h"
#include "core/error.h"
#include "formats/quant_ref.h"

namespace roofline::cpu {

void rms_norm(const float* x, const float* w, float* y, int n, float eps) {
  // 16 lane sums (independent chains the compiler vectorizes), added in lane order, then the tail.
  constexpr int kLanes = 16;
  float lanes[kLanes] = {};
  int i0 = 0;
  for (; i0 + kLanes <= n; i0 += kLanes)
    for (int j = 0; j < kLanes; ++j) lanes[j] += x[i0 + j] * x[i0 + j];
  float sum = 0;
  for (int j = 0; j < kLanes; ++j) sum += lanes[j];
  for (int i = i0; i < n; ++i) sum += x[i] * x[i];
  const float scale = 1.0f / std::sqrt(sum / (float)n + eps);
  for (int i = 0; i < n; ++i) y[i] = x[i] * scale * w[i];
}

void gated_activation(float* g, const float* u, size_t n, bool geglu) {
  if (cpu_isa() >= CpuIsa::Avx512) {
    detail::gated_activation_avx512(g, u, n, geglu);
  } else if (geglu) {
    for (size_t i = 0; i < n; ++i) g[i] = gelu_tanh(g[i]) * u[i];
  } else {
    for (size_t i = 0; i < n; ++i) g[i] = silu(g[i]) * u[i];
  }
}

RopeTable rope_table(const std::vector<int32_t>& positions, int n_rot, float freq_base, float freq_scale,
                     const float* factors) {
  RopeTable t;
  t.half = n_rot / 2;
  t.cos.resize(positions.size() * t.half);
  t.sin.resize(positions.size() * t.half);
  std::vector<double> freq(t.half);
  for (int i = 0; i < t.half; ++i) {
    freq[i] = (double)freq_scale * std::pow((double)freq_base, -2.0 * i / n_rot);
    if (factors) freq[i] /= (double)factors[i];
  }
  for (size_t r = 0; r < positions.size(); ++r) {
    for (int i = 0; i < t.half; ++i) {
      const double theta = positions[r] * freq[i];
      t.cos[r * t.half + i] = (float)std::cos(theta);
      t.sin[r * t.half + i] = (float)std::sin(theta);
    }
  }
  return t;
}

void rope_row(float* x, int n_heads, int head_dim, int n_rot, RopeStyle style, const float* cos, const float* sin) {
  const int half = n_rot / 2;
  for (int h = 0; h < n_heads; ++h) {
    float* v = x + (size_t)h * head_dim;
    for (int i = 0; i < half; ++i) {
      const int a = style == RopeStyle::Norm ? 2 * i : i;
      const int b = style == RopeStyle::Norm ? 2 * i + 1 : i + half;
      const float x0 = v[a], x1 = v[b];
      v[a] = x0 * cos[i] - x1 * sin[i];
      v[b] = x0 * sin[i] + x1 * cos[i];
    }
  }
}

namespace {

size_t slot_of(const StepDesc& step, int row, const KvLayerView& kv) {
  return kv_slot(kv, step.sequences[step.row_seq[row]], step.positions[row]);
}

}  // namespace

namespace {
// sum a[i] * b[i] in eight interleaved partial sums added in a fixed tree: the same order for every
// call, and a loop the compiler turns into SIMD (a single running sum cannot be reordered).
float dot8(const float* a, const float* b, int n) {
  float acc[8] = {};
  int i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) acc[k] += a[i + k] * b[i + k];
  for (; i < n; ++i) acc[i % 8] += a[i] * b[i];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}
}  // namespace

void kv_store(const KvLayerView& kv, const StepDesc& step, const float* k, const float* v, int kv_dim_k, int kv_dim_v,
              ThreadPool& pool) {
  pool.parallel_for((size_t)step.n_tokens(), [&](size_t r) {
    const size_t slot = slot_of(step, (int)r, kv);
    kv_row_from_f32(kv.type_k, k + r * kv_dim_k, kv.k + slot * kv.k_row_bytes, kv_dim_k);
    kv_row_from_f32(kv.type_v, v + r * kv_dim_v, kv.v + slot * kv.v_row_bytes, kv_dim_v);
  });
}

void softmax_row(float* sc, int n) {
  float mx = sc[0];
  for (int j = 1; j < n; ++j) mx = std::max(mx, sc[j]);
  float sum = 0;
  for (int j = 0; j < n; ++j) {
    sc[j] = std::exp(sc[j] - mx);
    sum += sc[j];
  }
  const float inv = 1.0f / sum;
  for (int j = 0; j < n; ++j) sc[j] *= inv;
}

void attention(const KvLayerView& kv, const StepDesc& step, const float* q, float* out, int n_head, int n_head_kv,
               int head_dim_k, int head_dim_v, float scale, ThreadPool& pool, int window) {
  const int n_gqa = n_head / n_head_kv;
  const int n_rows = step.n_tokens();
  const size_t k_head_bytes = dtype_row_bytes(kv.type_k, head_dim_k);
  const size_t v_head_bytes = dtype_row_bytes(kv.type_v, head_dim_v);
  // Tiles of up to 16 consecutive rows of one sequence; one task per (tile, kv head). The K and V of a
  // position are dequantized once per tile for every query head of the group and every row that sees
  // it (prefill: 16x fewer conversions than one row at a time). Each row's own operations (its dots,
  // softmax and weighted sum over its keys in position order) do not depend on the tile: batch invariance.
  constexpr int kRowTile = kAttentionRowTile;
  std::vector<std::pair<int, int>> tiles;
  for (int r = 0; r < n_rows;) {
    int r1 = r + 1;
    while (r1 < n_rows && r1 - r < kRowTile && step.row_seq[r1] == step.row_seq[r]) ++r1;
    tiles.emplace_back(r, r1);
    r = r1;
  }
  pool.parallel_for(tiles.size() * (size_t)n_head_kv, [&](size_t task) {
    const auto [r0, r1] = tiles[task / (size_t)n_head_kv];
    const int kvh = (int)(task % (size_t)n_head_kv);
    const int nr = r1 - r0;
    const StepSequence& s = step.sequences[step.row_seq[r0]];
    thread_local std::vector<float> scores, kbuf, vbuf;
    int first[kRowTile], last[kRowTile];
    size_t offset[kRowTile];  // row i's scores: n_gqa x (last - first + 1) from offset[i]
    size_t total = 0;
    int lo = INT32_MAX, hi = -1;
    for (int i = 0; i < nr; ++i) {
      last[i] = step.positions[r0 + i];
      first[i] = window > 0 ? std::max(0, last[i] - window + 1) : 0;  // the first key position
      offset[i] = total;
      total += (size_t)n_gqa * (size_t)(last[i] + 1 - first[i]);
      lo = std::min(lo, first[i]);
      hi = std::max(hi, last[i]);
    }
    AttentionTile tile;
    tile.kv = &kv;
    tile.seq = &s;
    tile.kvh = kvh;
    tile.nr = nr;
    tile.n_gqa = n_gqa;
    tile.head_dim_k = head_dim_k;
    tile.head_dim_v = head_dim_v;
    tile.q = q + (size_t)r0 * n_head * head_dim_k + (size_t)kvh * n_gqa * head_dim_k;
    tile.q_row_stride = (size_t)n_head * head_dim_k;
    tile.out = out + (size_t)r0 * n_head * head_dim_v + (size_t)kvh * n_gqa * head_dim_v;
    tile.out_row_stride = (size_t)n_head * head_dim_v;
    tile.first = first;
    tile.last = last;
    tile.scale = scale;
    if (detail::attention_tile_avx512(tile)) return;
    // The portable loops: a position at a time.
    const auto sees = [&](int i, int j) { return j >= first[i] && j <= last[i]; };
    const auto seen = [&](int j) {
      for (int i = 0; i < nr; ++i)
        if (sees(i, j)) return true;
      return false;
    };
    scores.assign(total, 0.0f);
    kbuf.resize(head_dim_k);
    vbuf.resize(head_dim_v);
    for (int j = lo; j <= hi; ++j) {
      if (!seen(j)) continue;
      const size_t slot = kv_slot(kv, s, j);
      kv_row_to_f32(kv.type_k, kv.k + slot * kv.k_row_bytes + kvh * k_head_bytes, kbuf.data(), head_dim_k);
      for (int i = 0; i < nr; ++i) {
        if (!sees(i, j)) continue;
        const int n_keys = last[i] + 1 - first[i];
        const float* qh = q + (size_t)(r0 + i) * n_head * head_dim_k + (size_t)kvh * n_gqa * head_dim_k;
        for (int g = 0; g < n_gqa; ++g)
          scores[offset[i] + (size_t)g * n_keys + (size_t)(j - first[i])] =
              dot8(qh + (size_t)g * head_dim_k, kbuf.data(), head_dim_k) * scale;
      }
    }
    for (int i = 0; i < nr; ++i) {
      const int n_keys = last[i] + 1 - first[i];
      for (int g = 0; g < n_gqa; ++g) softmax_row(scores.data() + offset[i] + (size_t)g * n_keys, n_keys);
      float* oh = out + (size_t)(r0 + i) * n_head * head_dim_v + (size_t)kvh * n_gqa * head_dim_v;
      std::fill(oh, oh + (size_t)n_gqa * head_dim_v, 0.0f);
    }
    for (int j = lo; j <= hi; ++j) {
      if (!seen(j)) continue;
      const size_t slot = kv_slot(kv, s, j);
      kv_row_to_f32(kv.type_v, kv.v + slot * kv.v_row_bytes + kvh * v_head_bytes, vbuf.data(), head_dim_v);
      for (int i = 0; i < nr; ++i) {
        if (!sees(i, j)) continue;
        const int n_keys = last[i] + 1 - first[i];
        float* oh = out + (size_t)(r0 + i) * n_head * head_dim_v + (size_t)kvh * n_gqa * head_dim_v;
        for (int g = 0; g < n_gqa; ++g) {
          const float p = scores[offset[i] + (size_t)g * n_keys + (size_t)(j - first[i])];
          float* o = oh + (size_t)g * head_dim_v;
          for (int d = 0; d < head_dim_v; ++d) o[d] += p * vbuf[d];
        }
      }
    }
  });
}

}  // namespace roofline::cpu
