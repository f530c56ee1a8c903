// The 6-bit scales and mins of the 16 rows of a packed Q4_K / Q5_K entry (the transposed scale bytes of
// packed_weights.h: byte k of row i at 16k + i), decoded as unpack_k4_scale_min does per row, with 128-bit
// integer ops: sc[k] and mn[k] hold sub-block k's scale and min of row i in byte i. Include it inside a
// kernel file's target region, after its other headers: the function has internal linkage, so each file
// compiles its own copy for its own instruction set.
// No include guard and no includes of its own: one inclusion per kernel file, which has <immintrin.h> and
// <cstdint> already.
namespace roofline::cpu {

static inline void decode_k4_scales(const uint8_t* scale_bytes, __m128i sc[8], __m128i mn[8]) {
  const __m128i m63 = _mm_set1_epi8(63), m15 = _mm_set1_epi8(15), m3 = _mm_set1_epi8(3);
  __m128i B[12];
  for (int k = 0; k < 12; ++k) B[k] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(scale_bytes + 16 * k));
  for (int k = 0; k < 4; ++k) {
    sc[k] = _mm_and_si128(B[k], m63);
    mn[k] = _mm_and_si128(B[k + 4], m63);
  }
  for (int k = 4; k < 8; ++k) {
    sc[k] = _mm_or_si128(_mm_and_si128(B[k + 4], m15), _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(B[k - 4], 6), m3), 4));
    mn[k] = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(B[k + 4], 4), m15), _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(B[k], 6), m3), 4));
  }
}

}  // namespace roofline::cpu
