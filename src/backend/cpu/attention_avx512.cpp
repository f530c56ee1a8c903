// AVX-512 inner loops of the CPU paged attention (cpu_ops.cpp's attention, same tiles and the same
// two passes): keys and values of a block of 64 positions dequantized once into floats, then per query
// vector its scores against the block with the query held in registers (per key, one product per 16
// dimensions in two FMA chains; the 16 lane sums of 16 keys at once in one tree, avx512_math.h's sum16x16),
// a vectorized softmax (exp16), and per output vector its weighted sum over the block with the output held
// in registers. Every score and output element is a fixed sequence of operations over its
// own query, keys and values (keys in position order), whatever the tile: batch invariance. Head
// dimensions 64, 128 and 256 (K and V equal); others take the portable loops.
#include "backend/cpu/attention_kernels.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstddef>
#include <vector>

#include "backend/cpu/vec_dot.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include "backend/cpu/avx512_region_begin.h"
#include "backend/cpu/avx512_math.h"

namespace roofline::cpu::detail {
namespace {

constexpr int kKeyBlock = 64;

// Softmax of n scores in place, 16 at a time: the maximum, exp16(x - max) summed in 16 lanes (then the lanes
// in sum16x16's tree), times 1 / sum. The same operations for a row's scores in any tile.
void softmax16(float* sc, int n) {
  __m512 mx = _mm512_set1_ps(-INFINITY);
  for (int j = 0; j < n; j += 16) {
    const __mmask16 m = (__mmask16)(n - j >= 16 ? 0xFFFF : (1u << (n - j)) - 1);
    mx = _mm512_max_ps(mx, _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), m, sc + j));
  }
  const __m512 top = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
  __m512 sum = _mm512_setzero_ps();
  for (int j = 0; j < n; j += 16) {
    const __mmask16 m = (__mmask16)(n - j >= 16 ? 0xFFFF : (1u << (n - j)) - 1);
    const __m512 e = _mm512_maskz_mov_ps(m, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, sc + j), top)));
    _mm512_mask_storeu_ps(sc + j, m, e);
    sum = _mm512_add_ps(sum, e);
  }
  __m512 lanes[16];
  for (int k = 0; k < 16; ++k) lanes[k] = k == 0 ? sum : _mm512_setzero_ps();
  const __m512 inv = _mm512_set1_ps(1.0f / _mm512_cvtss_f32(sum16x16(lanes)));
  for (int j = 0; j < n; j += 16) {
    const __mmask16 m = (__mmask16)(n - j >= 16 ? 0xFFFF : (1u << (n - j)) - 1);
    _mm512_mask_storeu_ps(sc + j, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, sc + j), inv));
  }
}

template <int D16>  // head dimension / 16
void tile(const AttentionTile& t) {
  constexpr int kDim = 16 * D16;
  const KvLayerView& kv = *t.kv;
  const size_t k_head_bytes = dtype_row_bytes(kv.type_k, kDim), v_head_bytes = dtype_row_bytes(kv.type_v, kDim);
  thread_local std::vector<float> scores, block;
  size_t offset[kAttentionRowTile];  // row i's scores: n_gqa x (last - first + 1) from offset[i]
  size_t total = 0;
  int lo = INT_MAX, hi = -1;
  for (int i = 0; i < t.nr; ++i) {
    offset[i] = total;
    total += (size_t)t.n_gqa * (size_t)(t.last[i] + 1 - t.first[i]);
    lo = std::min(lo, t.first[i]);
    hi = std::max(hi, t.last[i]);
  }
  scores.assign(total, 0.0f);
  block.resize((size_t)kKeyBlock * kDim);
  // Dequantizes the positions [j0, j1) that some row sees into `block` (K or V of this kv head).
  // F16 rows are converted here, 16 values per instruction (exact, so the same floats as kv_row_to_f32); the
  // slots of consecutive positions are followed through the block table without a division per position.
  const auto load_block = [&](int j0, int j1, bool keys) {
    const DType type = keys ? kv.type_k : kv.type_v;
    const size_t row_bytes = keys ? kv.k_row_bytes : kv.v_row_bytes;
    const uint8_t* base = (keys ? kv.k : kv.v) + (size_t)t.kvh * (keys ? k_head_bytes : v_head_bytes);
    const int span = kv.ring > 0 ? kv.ring : kv.block_size;  // slots run consecutively within a block (or a ring)
    int at = j0 % span;
    size_t first_slot = kv_slot(kv, *t.seq, j0) - (size_t)at;
    for (int j = j0; j < j1; ++j, ++at) {
      if (at == span) {
        at = 0;
        first_slot = kv_slot(kv, *t.seq, j);
      }
      bool seen = false;
      for (int i = 0; i < t.nr && !seen; ++i) seen = j >= t.first[i] && j <= t.last[i];
      if (!seen) continue;
      const uint8_t* row = base + (first_slot + (size_t)at) * row_bytes;
      float* dst = block.data() + (size_t)(j - j0) * kDim;
      if (type == DType::F16) {
        for (int x = 0; x < D16; ++x)
          _mm512_storeu_ps(dst + 16 * x, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 32 * x))));
      } else {
        kv_row_to_f32(type, row, dst, kDim);
      }
    }
  };
  for (int j0 = lo; j0 <= hi; j0 += kKeyBlock) {
    const int j1 = std::min(hi + 1, j0 + kKeyBlock);
    load_block(j0, j1, true);
    for (int i = 0; i < t.nr; ++i) {
      const int a = std::max(j0, t.first[i]), b = std::min(j1, t.last[i] + 1);
      if (a >= b) continue;
      const int n_keys = t.last[i] + 1 - t.first[i];
      for (int g = 0; g < t.n_gqa; ++g) {
        const float* qv = t.q + (size_t)i * t.q_row_stride + (size_t)g * kDim;
        __m512 qr[D16];
        for (int x = 0; x < D16; ++x) qr[x] = _mm512_loadu_ps(qv + 16 * x);
        float* sc = scores.data() + offset[i] + (size_t)g * n_keys - t.first[i];  // score of position j at sc[j]
        for (int j = a; j < b; j += 16) {  // 16 keys: their lane products, then the 16 sums in one tree
          const int nk = std::min(16, b - j);
          __m512 part[16];
          for (int k = 0; k < 16; ++k) {
            if (k >= nk) {
              part[k] = _mm512_setzero_ps();
              continue;
            }
            const float* kr = block.data() + (size_t)(j + k - j0) * kDim;
            __m512 s0 = _mm512_mul_ps(qr[0], _mm512_loadu_ps(kr));
            __m512 s1 = _mm512_mul_ps(qr[1], _mm512_loadu_ps(kr + 16));
            for (int x = 2; x < D16; x += 2) {
              s0 = _mm512_fmadd_ps(qr[x], _mm512_loadu_ps(kr + 16 * x), s0);
              s1 = _mm512_fmadd_ps(qr[x + 1], _mm512_loadu_ps(kr + 16 * x + 16), s1);
            }
            part[k] = _mm512_add_ps(s0, s1);
          }
          _mm512_mask_storeu_ps(sc + j, (__mmask16)((1u << nk) - 1), _mm512_mul_ps(sum16x16(part), _mm512_set1_ps(t.scale)));
        }
      }
    }
  }
  for (int i = 0; i < t.nr; ++i) {
    const int n_keys = t.last[i] + 1 - t.first[i];
    for (int g = 0; g < t.n_gqa; ++g) softmax16(scores.data() + offset[i] + (size_t)g * n_keys, n_keys);
    float* oh = t.out + (size_t)i * t.out_row_stride;
    std::fill(oh, oh + (size_t)t.n_gqa * kDim, 0.0f);
  }
  for (int j0 = lo; j0 <= hi; j0 += kKeyBlock) {
    const int j1 = std::min(hi + 1, j0 + kKeyBlock);
    load_block(j0, j1, false);
    for (int i = 0; i < t.nr; ++i) {
      const int a = std::max(j0, t.first[i]), b = std::min(j1, t.last[i] + 1);
      if (a >= b) continue;
      const int n_keys = t.last[i] + 1 - t.first[i];
      for (int g = 0; g < t.n_gqa; ++g) {
        float* o = t.out + (size_t)i * t.out_row_stride + (size_t)g * kDim;
        const float* p = scores.data() + offset[i] + (size_t)g * n_keys - t.first[i];
        __m512 acc[D16];
        for (int x = 0; x < D16; ++x) acc[x] = _mm512_loadu_ps(o + 16 * x);
        for (int j = a; j < b; ++j) {
          const __m512 pj = _mm512_set1_ps(p[j]);
          const float* vr = block.data() + (size_t)(j - j0) * kDim;
          for (int x = 0; x < D16; ++x) acc[x] = _mm512_fmadd_ps(pj, _mm512_loadu_ps(vr + 16 * x), acc[x]);
        }
        for (int x = 0; x < D16; ++x) _mm512_storeu_ps(o + 16 * x, acc[x]);
      }
    }
  }
}

}  // namespace

bool attention_tile_avx512(const AttentionTile& t) {
  if (!avx512_supported() || cpu_isa() < CpuIsa::Avx512 || t.head_dim_k != t.head_dim_v) return false;
  switch (t.head_dim_k) {
    case 64: tile<4>(t); return true;
    case 128: tile<8>(t); return true;
    case 256: tile<16>(t); return true;
    default: return false;
  }
}

}  // namespace roofline::cpu::detail

#include "backend/cpu/avx512_region_end.h"

#else  // not x86-64 GCC/Clang

namespace roofline::cpu::detail {
bool attention_tile_avx512(const AttentionTile&) { return false; }
}  // namespace roofline::cpu::detail

#endif
