// AVX-512 prompt kernels for plain float weights (F32, F16, BF16) against F32 activation rows: the prompt
// products of unquantized models. Each weight is converted to f32 exactly (F16 by vcvtph2ps, BF16 by a
// shift) and multiplied in f32, as in the AVX2 and scalar kernels.
//
// Bits: every output takes exactly the operations of the AVX2 kernel's dot (vec_dot_avx2.cpp, dot_float):
// four 8-lane accumulators over 32-element steps (here two 16-lane registers, lanes 0-7 and 8-15 of each
// being two of them), the 8-element rest into the first, the same horizontal sum, the last elements one
// FMA at a time. So the single dot on an AVX-512 CPU stays the AVX2 one, decode tiles (one or two
// activation rows: one weight stream, read at the memory's rate by that kernel) are the AVX2 ones, and a
// prompt tile gives each row the bits a decode step would (vec_dot.h's contract).
//
// A prompt tile runs blocks of 3 weight rows x 4 activation rows (24 accumulators, 4 activation vectors and
// one weight vector: 29 of 32 registers): per 16 lanes every weight vector is loaded (and converted) once
// for the block's activation rows and every activation vector once for its weight rows, 12 FMAs to 7 loads,
// where the one-row dot does one FMA per two loads.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "backend/cpu/vec_dot.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include "backend/cpu/avx512_region_begin.h"
#include "backend/cpu/float_dot_common.h"

namespace roofline::cpu {
namespace {

constexpr int kBlockRows = 3;  // weight rows of a block
constexpr int kBlockActs = 4;  // activation rows of a block

template <DType T>
constexpr int64_t kWeightBytes = T == DType::F32 ? 4 : 2;

// 16 weights from element i as f32.
template <DType T>
inline __m512 load16(const uint8_t* row, int64_t i) {
  const uint8_t* p = row + i * kWeightBytes<T>;
  if constexpr (T == DType::F32) {
    return _mm512_loadu_ps(p);
  } else if constexpr (T == DType::F16) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  } else {
    const __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
  }
}
// 8 weights from element i as f32, and one (the AVX2 kernel's load8 and load1; the sum: float_dot_common.h).
template <DType T>
inline __m256 load8(const uint8_t* row, int64_t i) {
  const uint8_t* p = row + i * kWeightBytes<T>;
  if constexpr (T == DType::F32) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
  } else if constexpr (T == DType::F16) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  } else {
    const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
  }
}
template <DType T>
inline float load1(const uint8_t* row, int64_t i) {
  if constexpr (T == DType::F32) {
    float f;
    std::memcpy(&f, row + 4 * i, 4);
    return f;
  } else {
    uint16_t h;
    std::memcpy(&h, row + 2 * i, 2);
    return T == DType::F16 ? f16(h) : bf16(h);
  }
}

// y[c * ldy + r] = W[r] . A[c] for an R x C block. lo[r][c] holds the dot's accumulators 0 and 1 (elements
// i..i+15 of each 32-element step), hi[r][c] accumulators 2 and 3 (i+16..i+31).
template <DType T, int R, int C>
void block(const uint8_t* w, size_t w_stride, const float* const* a, int64_t n, float* y, size_t ldy) {
  __m512 lo[R][C], hi[R][C];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) lo[r][c] = hi[r][c] = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m512 av[C];
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) {
      av[c] = _mm512_loadu_ps(a[c] + i);
      __asm__("" : "+v"(av[c]));  // in a register: GCC would fold the load into every FMA (a load each)
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m512 wv = load16<T>(w + (size_t)r * w_stride, i);
#pragma GCC unroll 4
      for (int c = 0; c < C; ++c) lo[r][c] = _mm512_fmadd_ps(wv, av[c], lo[r][c]);
    }
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) {
      av[c] = _mm512_loadu_ps(a[c] + i + 16);
      __asm__("" : "+v"(av[c]));
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m512 wv = load16<T>(w + (size_t)r * w_stride, i + 16);
#pragma GCC unroll 4
      for (int c = 0; c < C; ++c) hi[r][c] = _mm512_fmadd_ps(wv, av[c], hi[r][c]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    const uint8_t* row = w + (size_t)r * w_stride;
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) {
      __m256 acc0 = _mm512_castps512_ps256(lo[r][c]);
      const __m256 acc1 = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(lo[r][c]), 1));
      const __m256 acc2 = _mm512_castps512_ps256(hi[r][c]);
      const __m256 acc3 = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(hi[r][c]), 1));
      int64_t k = i;
      for (; k + 8 <= n; k += 8) acc0 = _mm256_fmadd_ps(load8<T>(row, k), _mm256_loadu_ps(a[c] + k), acc0);
      float sum = hsum(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
      for (; k < n; ++k) sum = std::fma(load1<T>(row, k), a[c][k], sum);
      y[(size_t)c * ldy + r] = sum;
    }
  }
}

template <DType T, int R>
void block_of_acts(int n_acts, const uint8_t* w, size_t w_stride, const float* const* a, int64_t n, float* y, size_t ldy) {
  switch (n_acts) {
    case 1: return block<T, R, 1>(w, w_stride, a, n, y, ldy);
    case 2: return block<T, R, 2>(w, w_stride, a, n, y, ldy);
    case 3: return block<T, R, 3>(w, w_stride, a, n, y, ldy);
    default: return block<T, R, 4>(w, w_stride, a, n, y, ldy);
  }
}

// Decode tiles go to the AVX2 kernel; prompt tiles take the activation rows in blocks of 4, each against the
// weight rows in blocks of 3 (the rest in blocks of 2 and 1): the block's activation rows stay in the L1
// while the weight rows pass (fewer bytes from the L2 per FMA than the other way round).
template <DType T>
void tile(const void* w, size_t w_stride, int n_w, const void* a, size_t a_stride, int n_a, int64_t n, float* y,
          size_t ldy) {
  static const VecDotTileFn decode_tile = detail::avx2_tile(T);
  if (n_a <= 2) return decode_tile(w, w_stride, n_w, a, a_stride, n_a, n, y, ldy);
  const auto* wb = static_cast<const uint8_t*>(w);
  const auto* ab = static_cast<const uint8_t*>(a);
  for (int c = 0; c < n_a; c += kBlockActs) {
    const int nc = n_a - c < kBlockActs ? n_a - c : kBlockActs;
    const float* acts[kBlockActs];
    for (int j = 0; j < nc; ++j) acts[j] = reinterpret_cast<const float*>(ab + (size_t)(c + j) * a_stride);
    for (int r = 0; r < n_w;) {
      const int left = n_w - r, nr = left >= kBlockRows ? kBlockRows : left;
      const uint8_t* rows = wb + (size_t)r * w_stride;
      float* out = y + (size_t)c * ldy + r;
      if (nr == 3) block_of_acts<T, 3>(nc, rows, w_stride, acts, n, out, ldy);
      else if (nr == 2) block_of_acts<T, 2>(nc, rows, w_stride, acts, n, out, ldy);
      else block_of_acts<T, 1>(nc, rows, w_stride, acts, n, out, ldy);
      r += nr;
    }
  }
}

}  // namespace

namespace detail {

VecDotTileFn avx512_float_tile(DType t) {
  switch (t) {
    case DType::F32: return tile<DType::F32>;
    case DType::F16: return tile<DType::F16>;
    case DType::BF16: return tile<DType::BF16>;
    default: return nullptr;
  }
}

}  // namespace detail
}  // namespace roofline::cpu

#include "backend/cpu/avx512_region_end.h"

#else  // not x86-64 GCC/Clang: the dispatcher takes the AVX2 or scalar float kernels

namespace roofline::cpu::detail {
VecDotTileFn avx512_float_tile(DType) { return nullptr; }
}  // namespace roofline::cpu::detail

#endif
