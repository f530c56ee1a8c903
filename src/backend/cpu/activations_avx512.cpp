// AVX-512 forms of the gated activations of the feed-forward blocks (cpu_ops.h: gated_activation):
// g = silu(g) * u and g = gelu_tanh(g) * u, 16 elements at a time with a masked tail, through avx512_math.h's
// exp16, whose clamp to +-104 lets silu and tanh reach their limits (0, x, +-1) exactly as the scalar forms do. Each element is a fixed sequence of operations of its own value: any split of the rows and
// columns over threads gives the same bits.
#include <cstddef>

#include "backend/cpu/cpu_ops.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include "backend/cpu/avx512_region_begin.h"
#include "backend/cpu/avx512_math.h"

namespace roofline::cpu::detail {
namespace {

inline __m512 silu16(__m512 x) {
  const __m512 one = _mm512_set1_ps(1.0f);
  return _mm512_div_ps(x, _mm512_add_ps(one, exp16(_mm512_sub_ps(_mm512_setzero_ps(), x))));
}

// 0.5 x (1 + tanh(y)), y = sqrt(2 / pi) (x + 0.044715 x^3), taken as x / (1 + e^(-2y)) (the same value:
// 1 + tanh(y) = 2 / (1 + e^(-2y))), which has no cancellation where tanh(y) nears -1.
inline __m512 gelu_tanh16(__m512 x) {
  const __m512 x3 = _mm512_mul_ps(_mm512_mul_ps(x, x), x);
  const __m512 y = _mm512_mul_ps(_mm512_set1_ps(0.7978845608f), _mm512_fmadd_ps(_mm512_set1_ps(0.044715f), x3, x));
  const __m512 e = exp16(_mm512_mul_ps(_mm512_set1_ps(-2.0f), y));
  return _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}

template <bool kGelu>
void gated(float* g, const float* u, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 x = _mm512_loadu_ps(g + i);
    _mm512_storeu_ps(g + i, _mm512_mul_ps(kGelu ? gelu_tanh16(x) : silu16(x), _mm512_loadu_ps(u + i)));
  }
  if (i < n) {
    const __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
    const __m512 x = _mm512_maskz_loadu_ps(m, g + i);
    _mm512_mask_storeu_ps(g + i, m, _mm512_mul_ps(kGelu ? gelu_tanh16(x) : silu16(x), _mm512_maskz_loadu_ps(m, u + i)));
  }
}

}  // namespace

void gated_activation_avx512(float* g, const float* u, size_t n, bool geglu) {
  if (geglu) gated<true>(g, u, n);
  else gated<false>(g, u, n);
}

}  // namespace roofline::cpu::detail

#include "backend/cpu/avx512_region_end.h"

#else  // not x86-64 GCC/Clang: cpu_ops.cpp never calls it (no AVX-512 level)

namespace roofline::cpu::detail {
void gated_activation_avx512(float*, const float*, size_t, bool) {}
}  // namespace roofline::cpu::detail

#endif
