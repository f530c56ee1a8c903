// Vector maths shared by the AVX-512 kernel files (activations_avx512.cpp, attention_avx512.cpp). Include it
// inside a file's AVX-512 region, after avx512_region_begin.h: everything here has internal linkage, so each
// file compiles its own copy for that target. No include guard and no includes of its own (the region has
// <immintrin.h>).
namespace roofline::cpu::detail {
namespace {

// e^x for 16 floats: 2^k * e^r with k = round(x / ln 2), r = x - k ln 2 (ln 2 split in two parts) and a
// degree-7 Taylor polynomial of e^r on |r| <= ln 2 / 2 (relative error ~1e-8, a few float ulps in all), then
// scalef by k; arguments are clamped to +-104, where scalef already gives inf or 0.
inline __m512 exp16(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-104.0f)), _mm512_set1_ps(104.0f));
  const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693145751953125f), x);  // ln 2, high part (exact product)
  r = _mm512_fnmadd_ps(k, _mm512_set1_ps(1.42860682030941723212e-6f), r);  // ln 2, low part
  __m512 p = _mm512_set1_ps(1.0f / 5040);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, k);
}

// The sums of 16 vectors: lane j of the result is the sum of v[j]'s 16 lanes, always combined in the same tree
// (lanes i and i + 2 of each 128-bit quarter, then the two pairs, then quarters 0 + 1 and 2 + 3, then the two
// halves), whichever vector j is: 45 instructions for 16 sums where one _mm512_reduce_add_ps per vector takes
// about 8 each.
inline __m512 sum16x16(const __m512* v) {
  __m512 t[8], u[4], w[2];
  for (int i = 0; i < 8; ++i)
    t[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; ++i)
    u[i] = _mm512_add_ps(_mm512_shuffle_ps(t[2 * i], t[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(t[2 * i], t[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  for (int i = 0; i < 2; ++i)
    w[i] = _mm512_add_ps(_mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(w[0], w[1], _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(w[0], w[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

}  // namespace
}  // namespace roofline::cpu::detail
