// core/fp16.h: IEEE half and bfloat16 conversions, exhaustively over every 16-bit pattern, plus the
// float->half rounding rules (ties to even, subnormals, overflow to infinity) checked against an
// independent definition (the nearest representable value computed in double).
#include "core/fp16.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "core/rng.h"

namespace roofline {
namespace {

bool half_is_nan(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0; }
bool bf16_is_nan(uint16_t h) { return (h & 0x7f80u) == 0x7f80u && (h & 0x7fu) != 0; }

// Value of a half computed from its fields in double (independent of the code under test).
double half_value(uint16_t h) {
  const int sign = (h >> 15) & 1, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  double v;
  if (exp == 0) v = std::ldexp((double)mant, -24);
  else if (exp == 31) v = mant ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  else v = std::ldexp((double)(mant | 0x400), exp - 25);
  return sign ? -v : v;
}

// The correctly rounded half of a finite float, by definition: the nearest of the two neighbouring
// halves (ties to the even mantissa), infinity at or beyond 65520.
uint16_t reference_to_half(float f) {
  const double a = std::fabs((double)f);
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  if (a >= 65520.0) return sign | 0x7c00;
  // Largest non-negative half <= a (halves are ordered like their bit patterns).
  uint16_t lo = 0, hi = 0x7bff;
  while (lo < hi) {
    const uint16_t mid = (uint16_t)((lo + hi + 1) / 2);
    if (half_value(mid) <= a) lo = mid;
    else hi = (uint16_t)(mid - 1);
  }
  if (half_value(lo) == a) return sign | lo;
  const uint16_t up = (uint16_t)(lo + 1);  // may be 0x7c00 (inf) only when a >= 65520, excluded above
  const double dlo = a - half_value(lo), dup = half_value(up) - a;
  if (dlo < dup) return sign | lo;
  if (dup < dlo) return sign | up;
  return sign | ((lo & 1) ? up : lo);
}

TEST(Fp16, DecodesEveryHalfExactly) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = fp16_to_f32((uint16_t)h);
    const double expected = half_value((uint16_t)h);
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(f)) << h;
    } else {
      EXPECT_EQ((double)f, expected) << "half 0x" << std::hex << h;
      EXPECT_EQ(std::signbit(f), (h & 0x8000u) != 0) << h;  // -0 stays -0
    }
  }
}

TEST(Fp16, RoundTripsEveryHalf) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t back = f32_to_fp16(fp16_to_f32((uint16_t)h));
    if (half_is_nan((uint16_t)h)) {
      EXPECT_TRUE(half_is_nan(back)) << h;
      EXPECT_EQ(back & 0x8000u, h & 0x8000u) << h;
    } else {
      EXPECT_EQ(back, h) << "half 0x" << std::hex << h;
    }
  }
}

TEST(Fp16, TiesRoundToEvenBetweenEveryPairOfHalves) {
  // The midpoint of two adjacent finite halves is exact in float; it must round to the even one, and
  // one float ulp either side must round to the nearer one.
  for (uint32_t h = 0; h < 0x7bff; ++h) {
    const float a = fp16_to_f32((uint16_t)h), b = fp16_to_f32((uint16_t)(h + 1));
    const float mid = (float)(((double)a + (double)b) / 2);
    ASSERT_EQ((double)mid, ((double)a + (double)b) / 2) << "midpoint not exact at " << h;
    const uint16_t even = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
    EXPECT_EQ(f32_to_fp16(mid), even) << h;
    EXPECT_EQ(f32_to_fp16(std::nextafter(mid, 0.f)), h) << h;
    EXPECT_EQ(f32_to_fp16(std::nextafter(mid, 1e9f)), h + 1) << h;
    EXPECT_EQ(f32_to_fp16(-mid), even | 0x8000u) << h;
  }
}

TEST(Fp16, SubnormalsUnderflowAndOverflow) {
  const float min_sub = std::ldexp(1.f, -24), min_normal = std::ldexp(1.f, -14);
  EXPECT_EQ(f32_to_fp16(min_sub), 0x0001);
  EXPECT_EQ(f32_to_fp16(min_normal), 0x0400);
  EXPECT_EQ(f32_to_fp16(std::nextafter(min_normal, 0.f)), 0x0400);  // rounds up into the normals
  EXPECT_EQ(f32_to_fp16(min_sub / 2), 0x0000);                      // tie between 0 and 2^-24: even (0)
  EXPECT_EQ(f32_to_fp16(std::nextafter(min_sub / 2, 1.f)), 0x0001);
  EXPECT_EQ(f32_to_fp16(min_sub * 1.5f), 0x0002);                   // tie between 1 and 2 ulps: even (2)
  EXPECT_EQ(f32_to_fp16(std::ldexp(1.f, -40)), 0x0000);
  EXPECT_EQ(f32_to_fp16(-std::ldexp(1.f, -40)), 0x8000);
  EXPECT_EQ(f32_to_fp16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(f32_to_fp16(-0.f), 0x8000);
  EXPECT_EQ(f32_to_fp16(65504.f), 0x7bff);
  EXPECT_EQ(f32_to_fp16(std::nextafter(65520.f, 0.f)), 0x7bff);
  EXPECT_EQ(f32_to_fp16(65520.f), 0x7c00);  // the tie above the largest half goes to infinity
  EXPECT_EQ(f32_to_fp16(1e10f), 0x7c00);
  EXPECT_EQ(f32_to_fp16(-1e10f), 0xfc00);
  EXPECT_EQ(f32_to_fp16(std::numeric_limits<float>::max()), 0x7c00);
  EXPECT_EQ(f32_to_fp16(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(f32_to_fp16(-std::numeric_limits<float>::infinity()), 0xfc00);
  EXPECT_TRUE(half_is_nan(f32_to_fp16(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(std::isnan(fp16_to_f32(0x7e00)));
  EXPECT_EQ(fp16_to_f32(0x7c00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(round_to_fp16(0.1f), fp16_to_f32(0x2e66));
}

TEST(Fp16, MatchesCorrectRoundingOnRandomFloats) {
  Rng rng(1234);
  for (int i = 0; i < 300000; ++i) {
    // Exponents spread over the whole half range and beyond, random mantissas.
    const uint32_t bits = (rng.next_u32() & 0x807fffffu) | ((uint32_t)(90 + rng.below(60)) << 23);
    const float f = f32_from_bits(bits);
    ASSERT_EQ(f32_to_fp16(f), reference_to_half(f)) << "float bits 0x" << std::hex << bits;
  }
}

#if defined(__FLT16_MAX__)
TEST(Fp16, AgreesWithCompilerHalfOnStridedFloats) {
  // Every 97th finite float bit pattern (44 million): the compiler's _Float16 conversion is IEEE
  // round-to-nearest-even.
  for (uint64_t u = 0; u < 0x7f800000ull; u += 97) {
    const float f = f32_from_bits((uint32_t)u);
    const _Float16 h = (_Float16)f;
    uint16_t hb;
    std::memcpy(&hb, &h, 2);
    if (f32_to_fp16(f) != hb) {
      FAIL() << "float bits 0x" << std::hex << u << ": got 0x" << f32_to_fp16(f) << " want 0x" << hb;
    }
  }
}
#endif

TEST(Fp16Bf16, RoundTripsEveryBf16) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = bf16_to_f32((uint16_t)h);
    EXPECT_EQ(f32_bits(f), h << 16);
    const uint16_t back = f32_to_bf16(f);
    if (bf16_is_nan((uint16_t)h)) {
      EXPECT_TRUE(bf16_is_nan(back)) << h;
      EXPECT_TRUE(back & 0x40u) << "NaN must come back quiet: " << h;
    } else {
      EXPECT_EQ(back, h) << h;
    }
  }
}

TEST(Fp16Bf16, RoundsToNearestEven) {
  for (uint32_t h = 0; h < 0x7f7f; h += 7) {
    const uint32_t lo = h << 16;
    const uint32_t mid = lo | 0x8000u;
    const uint16_t even = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
    EXPECT_EQ(f32_to_bf16(f32_from_bits(mid)), even) << h;
    EXPECT_EQ(f32_to_bf16(f32_from_bits(mid - 1)), h) << h;
    EXPECT_EQ(f32_to_bf16(f32_from_bits(mid + 1)), h + 1) << h;
    EXPECT_EQ(f32_to_bf16(f32_from_bits(mid | 0x80000000u)), even | 0x8000u) << h;
  }
  // The largest finite bf16 (0x7f7f) rounds up to infinity from its upper midpoint.
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(f32_to_bf16(f32_from_bits(0x7f7f7fffu)), 0x7f7f);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(f32_to_bf16(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(f32_to_bf16(f32_from_bits(0x00008000u)), 0x0000);  // subnormal tie to even
  EXPECT_EQ(f32_to_bf16(f32_from_bits(0x00018000u)), 0x0002);
  EXPECT_TRUE(bf16_is_nan(f32_to_bf16(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(bf16_is_nan(f32_to_bf16(f32_from_bits(0x7f800001u))));  // a NaN whose top bits look like inf
}

}  // namespace
}  // namespace roofline
