// What the float dot kernels share (vec_dot_avx2.cpp's one-row dot, float_kernels_avx512.cpp's prompt tiles):
// the f16 and bf16 weight conversions and the horizontal sum that ends every dot. One definition, so a
// prompt tile and a decode step give a row the same bits. Everything has internal linkage (each kernel file
// compiles its own copy for its instruction set, as packed_kernel_common.h explains); include it inside the
// file's target region, after <immintrin.h>, <cstdint> and <cstring>. No include guard: one inclusion per file.
namespace roofline::cpu {
namespace {

inline float f16(uint16_t h) { return _cvtsh_ss(h); }
inline float bf16(uint16_t h) {
  const uint32_t u = (uint32_t)h << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// The sum of an 8-lane register: halves, then pairs, then the last two.
inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

}  // namespace
}  // namespace roofline::cpu
