// CPU dot kernels (backend/cpu/vec_dot.h): activation quantizers, then for every weight type the
// scalar, AVX2 and AVX-512 VNNI kernels (single dot and prefill tile; every level this CPU runs,
// forced one by one) against a double-precision reference on random data with odd sizes, bit-identity between tile and single dot and across calls, zero rows,
// and worst-case int8 values (int16 saturation in maddubs would show as a large error).
#include "backend/cpu/vec_dot.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/fp16.h"
#include "core/rng.h"
#include "formats/quant_blocks.h"
#include "formats/quant_ref.h"
#include "test_util.h"

namespace roofline::cpu {
namespace {

using test::nmse;

const DType kTypes[] = {DType::F32,  DType::F16,  DType::BF16, DType::Q4_0, DType::Q4_1,
                        DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q2_K, DType::Q3_K,
                        DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ4_NL, DType::IQ4_XS};

bool have_avx2() { return detail::avx2_supported(); }

std::vector<float> gaussian(size_t n, Rng& rng, double sigma = 1.0) {
  std::vector<float> v(n);
  for (float& x : v) x = (float)(rng.normal() * sigma);
  return v;
}

// ---------------------------------------------------------------------------------------------------
// Activation rows

std::vector<uint8_t> quantize_act(ActFormat f, const std::vector<float>& x) {
  std::vector<uint8_t> out(act_row_bytes(f, (int64_t)x.size()));
  quantize_act_row(f, x.data(), out.data(), (int64_t)x.size());
  return out;
}

// The activation row as the kernels see it: d * q (or the floats themselves).
std::vector<double> dequant_act(ActFormat f, const uint8_t* p, int64_t n) {
  std::vector<double> out((size_t)n);
  switch (f) {
    case ActFormat::F32:
      for (int64_t i = 0; i < n; ++i) out[(size_t)i] = reinterpret_cast<const float*>(p)[i];
      break;
    case ActFormat::Q8_0: {
      const auto* b = reinterpret_cast<const BlockQ8_0*>(p);
      for (int64_t i = 0; i < n; ++i) out[(size_t)i] = (double)fp16_to_f32(b[i / 32].d) * b[i / 32].qs[i % 32];
      break;
    }
    case ActFormat::Q8_1: {
      const auto* b = reinterpret_cast<const ActBlockQ8_1*>(p);
      for (int64_t i = 0; i < n; ++i) out[(size_t)i] = (double)fp16_to_f32(b[i / 32].d) * b[i / 32].qs[i % 32];
      break;
    }
    case ActFormat::Q8_K: {
      const auto* b = reinterpret_cast<const BlockQ8_K*>(p);
      for (int64_t i = 0; i < n; ++i) out[(size_t)i] = (double)b[i / 256].d * b[i / 256].qs[i % 256];
      break;
    }
  }
  return out;
}

TEST(VecDotAct, FormatsAndSizes) {
  EXPECT_EQ(act_format_for(DType::Q4_K), ActFormat::Q8_K);
  EXPECT_EQ(act_format_for(DType::IQ4_XS), ActFormat::Q8_K);
  EXPECT_EQ(act_format_for(DType::Q6_K), ActFormat::Q8_K);
  EXPECT_EQ(act_format_for(DType::Q4_0), ActFormat::Q8_0);
  EXPECT_EQ(act_format_for(DType::IQ4_NL), ActFormat::Q8_0);
  EXPECT_EQ(act_format_for(DType::Q5_1), ActFormat::Q8_1);
  EXPECT_EQ(act_format_for(DType::BF16), ActFormat::F32);
  EXPECT_EQ(act_row_bytes(ActFormat::Q8_0, 64), 68u);
  EXPECT_EQ(act_row_bytes(ActFormat::Q8_1, 64), 72u);
  EXPECT_EQ(act_row_bytes(ActFormat::Q8_K, 512), 584u);
  EXPECT_EQ(act_row_bytes(ActFormat::F32, 7), 28u);
  EXPECT_THROW(act_format_for(DType::IQ2_XXS), Error);
  EXPECT_THROW(vec_dot_fn(DType::Q8_K), Error);
  EXPECT_THROW(vec_dot_scalar_fn(DType::TQ1_0), Error);
  EXPECT_THROW(vec_dot_tile_fn(DType::I8), Error);
  std::printf("cpu_simd_name: %s\n", cpu_simd_name());
}

// ROOFLINE_CPU_ISA caps the level at what the CPU has; a wrong name is an error, in-process and as
// the command line's one-line message.
TEST(VecDotIsa, EnvironmentCapNamesAndLimits) {
  EXPECT_EQ(cpu_isa_capped(nullptr, CpuIsa::Avx512), CpuIsa::Avx512);
  EXPECT_EQ(cpu_isa_capped("", CpuIsa::Avx2), CpuIsa::Avx2);
  EXPECT_EQ(cpu_isa_capped("avx2", CpuIsa::Avx512), CpuIsa::Avx2);
  EXPECT_EQ(cpu_isa_capped("scalar", CpuIsa::Avx512), CpuIsa::Scalar);
  EXPECT_EQ(cpu_isa_capped("avx512", CpuIsa::Avx2), CpuIsa::Avx2);
  EXPECT_EQ(cpu_isa_capped("avx512", CpuIsa::Avx512), CpuIsa::Avx512);
  EXPECT_THROW(cpu_isa_capped("AVX2", CpuIsa::Avx512), Error);
  EXPECT_THROW(cpu_isa_capped("avx-512", CpuIsa::Avx512), Error);
  EXPECT_LE(cpu_isa(), cpu_isa_detected());
  EXPECT_THROW(vec_dot_fn_at((CpuIsa)((int)cpu_isa_detected() + 1), DType::Q4_K), Error);

  ASSERT_EQ(setenv("ROOFLINE_CPU_ISA", "avx9", 1), 0);
  test::CommandResult r = test::run_cli({"run", "-m", "synthetic:tiny-qwen3:Q8_0", "-p", "hi", "-n", "2"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("ROOFLINE_CPU_ISA=avx9 is not one of scalar, avx2, avx512"), std::string::npos) << r.err;
  for (const char* level : {"scalar", "avx2", "avx512"}) {
    ASSERT_EQ(setenv("ROOFLINE_CPU_ISA", level, 1), 0);
    r = test::run_cli({"run", "-m", "synthetic:tiny-qwen3:Q8_0", "-p", "hi", "-n", "2"});
    EXPECT_EQ(r.exit_code, 0) << level << ": " << r.err;
  }
  unsetenv("ROOFLINE_CPU_ISA");
}

TEST(VecDotAct, QuantizersRoundWithinHalfStepAndKeepSums) {
  Rng rng(11);
  for (ActFormat f : {ActFormat::Q8_0, ActFormat::Q8_1, ActFormat::Q8_K}) {
    const int bs = f == ActFormat::Q8_K ? 256 : 32;
    for (double sigma : {1e-6, 1e-3, 1.0, 300.0}) {
      std::vector<float> x = gaussian((size_t)bs * 9, rng, sigma);
      x[5] = 0;
      const std::vector<uint8_t> q = quantize_act(f, x);
      const std::vector<double> dq = dequant_act(f, q.data(), (int64_t)x.size());
      for (size_t b = 0; b < x.size() / bs; ++b) {
        double amax = 0, d = 0;
        for (int j = 0; j < bs; ++j) amax = std::max(amax, (double)std::fabs(x[b * bs + j]));
        if (f == ActFormat::Q8_0) d = fp16_to_f32(reinterpret_cast<const BlockQ8_0*>(q.data())[b].d);
        if (f == ActFormat::Q8_1) d = fp16_to_f32(reinterpret_cast<const ActBlockQ8_1*>(q.data())[b].d);
        if (f == ActFormat::Q8_K) d = reinterpret_cast<const BlockQ8_K*>(q.data())[b].d;
        ASSERT_NEAR(d, amax / 127, amax / 127 * 1e-3 + 3e-8);  // f16 rounding (and its subnormals)
        // Half a step, plus what a rounded scale (f16 for Q8_0/Q8_1) loses at the block's extreme,
        // clamped to 127 steps: everything when the f16 scale underflows to 0 (|x| < ~4e-6).
        const double bound = d * 0.5 * (1 + 1e-6) + 127 * std::fabs(d - amax / 127) + 1e-30;
        for (int j = 0; j < bs; ++j) {
          ASSERT_LE(std::fabs(dq[b * bs + j] - x[b * bs + j]), bound)
              << "format " << (int)f << " sigma " << sigma << " element " << b * bs + j;
        }
        if (f == ActFormat::Q8_1) {
          const auto& blk = reinterpret_cast<const ActBlockQ8_1*>(q.data())[b];
          int s = 0;
          for (int j = 0; j < 32; ++j) s += blk.qs[j];
          ASSERT_EQ(blk.sum, s);
        }
        if (f == ActFormat::Q8_K) {
          const auto& blk = reinterpret_cast<const BlockQ8_K*>(q.data())[b];
          for (int g = 0; g < 16; ++g) {
            int s = 0;
            for (int j = 0; j < 16; ++j) s += blk.qs[16 * g + j];
            ASSERT_EQ(blk.bsums[g], s);
          }
          for (int j = 0; j < 256; ++j) ASSERT_GE(blk.qs[j], -127);
        }
      }
    }
  }
}

TEST(VecDotAct, Avx2QuantizerIsBitIdenticalToScalar) {
  if (!have_avx2()) GTEST_SKIP() << "no AVX2";
  Rng rng(12);
  for (ActFormat f : {ActFormat::Q8_0, ActFormat::Q8_1, ActFormat::Q8_K}) {
    for (double sigma : {1e-7, 1e-4, 0.01, 1.0, 1e3, 1e5}) {
      std::vector<float> x = gaussian(256 * 5, rng, sigma);
      for (size_t i = 0; i < x.size(); i += 97) x[i] = 0;
      for (size_t i = 300; i < 340; ++i) x[i] = 0;                        // an all-zero block
      for (size_t i = 512; i < 544; ++i) x[i] = (float)(i % 2 ? 1 : -1);  // ties at the extremes
      std::vector<uint8_t> a(act_row_bytes(f, (int64_t)x.size())), b(a.size());
      detail::quantize_act_row_scalar(f, x.data(), a.data(), (int64_t)x.size());
      detail::quantize_act_row_avx2(f, x.data(), b.data(), (int64_t)x.size());
      ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size()), 0) << "format " << (int)f << " sigma " << sigma;
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// Weight rows

int64_t block_of(DType t) { return dtype_block_size(t); }

// Offsets of the f16 scale fields within one block (overwritten with sane values in random blocks).
std::vector<size_t> f16_fields(DType t) {
  switch (t) {
    case DType::Q4_0: return {offsetof(BlockQ4_0, d)};
    case DType::Q4_1: return {offsetof(BlockQ4_1, d), offsetof(BlockQ4_1, m)};
    case DType::Q5_0: return {offsetof(BlockQ5_0, d)};
    case DType::Q5_1: return {offsetof(BlockQ5_1, d), offsetof(BlockQ5_1, m)};
    case DType::Q8_0: return {offsetof(BlockQ8_0, d)};
    case DType::IQ4_NL: return {offsetof(BlockIQ4_NL, d)};
    case DType::Q2_K: return {offsetof(BlockQ2_K, d), offsetof(BlockQ2_K, dmin)};
    case DType::Q3_K: return {offsetof(BlockQ3_K, d)};
    case DType::Q4_K: return {offsetof(BlockQ4_K, d), offsetof(BlockQ4_K, dmin)};
    case DType::Q5_K: return {offsetof(BlockQ5_K, d), offsetof(BlockQ5_K, dmin)};
    case DType::Q6_K: return {offsetof(BlockQ6_K, d)};
    case DType::IQ4_XS: return {offsetof(BlockIQ4_XS, d)};
    default: return {};
  }
}

// Every byte `fill` (or random when fill < 0), then sane f16 scales: all bit patterns of the levels.
std::vector<uint8_t> pattern_row(DType t, int64_t n, Rng& rng, int fill) {
  std::vector<uint8_t> row(dtype_row_bytes(t, n));
  if (!dtype_traits(t).quantized) {  // plain types: finite random values
    const std::vector<float> x = gaussian((size_t)n, rng, 3.0);
    quantize_row_ref(t, x.data(), row.data(), n);
    return row;
  }
  for (uint8_t& b : row) b = (uint8_t)(fill < 0 ? rng.next_u32() : (uint32_t)fill);
  const size_t bb = dtype_block_bytes(t);
  for (size_t blk = 0; blk < row.size() / bb; ++blk) {
    for (size_t off : f16_fields(t)) {
      const float v = (rng.next_u32() & 1 ? 1.f : -1.f) * rng.uniform(0.001f, 0.05f);
      const uint16_t h = f32_to_fp16(v);
      std::memcpy(row.data() + blk * bb + off, &h, 2);
    }
  }
  return row;
}

std::vector<uint8_t> gaussian_row(DType t, int64_t n, Rng& rng) {
  std::vector<float> x = gaussian((size_t)n, rng);
  for (size_t i = 0; i < x.size(); i += 61) x[i] *= 8;  // a few outliers, as real weights have
  std::vector<uint8_t> row(dtype_row_bytes(t, n));
  quantize_row_ref(t, x.data(), row.data(), n);
  return row;
}

std::vector<double> dequant_weight(DType t, const uint8_t* row, int64_t n) {
  std::vector<float> f((size_t)n);
  dequantize_row_ref(t, row, f.data(), n);
  return std::vector<double>(f.begin(), f.end());
}

double dot_ref(const std::vector<double>& w, const std::vector<double>& a) {
  double s = 0;
  for (size_t i = 0; i < w.size(); ++i) s += w[i] * a[i];
  return s;
}

// A matrix product of n_w weight rows and n_a activation rows through every kernel we have.
struct Case {
  DType type;
  int64_t n;
  int n_w, n_a;
  std::vector<uint8_t> w;            // n_w rows
  std::vector<std::vector<float>> x; // n_a float activation rows
  std::vector<uint8_t> a;            // n_a quantized rows
  std::vector<double> ref, ref_float; // [c * n_w + r]: vs dequantized / un-quantized activations
};

Case make_case(DType t, int64_t n, int n_w, int n_a, uint64_t seed, int fill = -2, double act_sigma = 1.0,
               bool act_sign_only = false) {
  Rng rng(seed);
  Case cs{t, n, n_w, n_a, {}, {}, {}, {}, {}};
  const ActFormat f = act_format_for(t);
  for (int r = 0; r < n_w; ++r) {
    // fill -2: mostly quantized Gaussians plus one random-bytes row; otherwise the given pattern.
    const std::vector<uint8_t> row = fill == -2 ? (r % 4 == 3 ? pattern_row(t, n, rng, -1) : gaussian_row(t, n, rng))
                                                : pattern_row(t, n, rng, fill);
    cs.w.insert(cs.w.end(), row.begin(), row.end());
  }
  for (int c = 0; c < n_a; ++c) {
    std::vector<float> x = gaussian((size_t)n, rng, act_sigma);
    if (act_sign_only) {
      for (float& v : x) v = (float)(v < 0 ? -act_sigma : act_sigma);
      if (c % 3 == 1) for (float& v : x) v = (float)act_sigma;
      if (c % 3 == 2) for (float& v : x) v = (float)-act_sigma;
    }
    const std::vector<uint8_t> q = quantize_act(f, x);
    cs.a.insert(cs.a.end(), q.begin(), q.end());
    cs.x.push_back(std::move(x));
  }
  const size_t wb = dtype_row_bytes(t, n), ab = act_row_bytes(f, n);
  cs.ref.resize((size_t)n_w * n_a);
  cs.ref_float.resize(cs.ref.size());
  for (int r = 0; r < n_w; ++r) {
    const std::vector<double> wd = dequant_weight(t, cs.w.data() + r * wb, n);
    for (int c = 0; c < n_a; ++c) {
      cs.ref[(size_t)c * n_w + r] = dot_ref(wd, dequant_act(f, cs.a.data() + c * ab, n));
      cs.ref_float[(size_t)c * n_w + r] = dot_ref(wd, std::vector<double>(cs.x[c].begin(), cs.x[c].end()));
    }
  }
  return cs;
}

std::vector<float> run_single(const Case& cs, VecDotFn fn) {
  const size_t wb = dtype_row_bytes(cs.type, cs.n), ab = act_row_bytes(act_format_for(cs.type), cs.n);
  std::vector<float> y((size_t)cs.n_w * cs.n_a);
  for (int r = 0; r < cs.n_w; ++r) {
    for (int c = 0; c < cs.n_a; ++c) y[(size_t)c * cs.n_w + r] = fn(cs.w.data() + r * wb, cs.a.data() + c * ab, cs.n);
  }
  return y;
}

// Through the tile function with a padded output (ldy > n_w) whose padding must stay untouched.
std::vector<float> run_tile(const Case& cs, VecDotTileFn fn) {
  const size_t wb = dtype_row_bytes(cs.type, cs.n), ab = act_row_bytes(act_format_for(cs.type), cs.n);
  const size_t ldy = (size_t)cs.n_w + 3;
  std::vector<float> padded(ldy * cs.n_a, -12345.f);
  fn(cs.w.data(), wb, cs.n_w, cs.a.data(), ab, cs.n_a, cs.n, padded.data(), ldy);
  std::vector<float> y((size_t)cs.n_w * cs.n_a);
  for (int c = 0; c < cs.n_a; ++c) {
    for (size_t r = 0; r < ldy; ++r) {
      if (r < (size_t)cs.n_w) y[(size_t)c * cs.n_w + r] = padded[c * ldy + r];
      else EXPECT_EQ(padded[c * ldy + r], -12345.f) << "tile wrote outside its outputs";
    }
  }
  return y;
}

double nmse_vs(const std::vector<float>& got, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    num += (got[i] - ref[i]) * (got[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return den > 0 ? num / den : num;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Row length: an odd number of blocks (F32/F16/BF16: an odd length that exercises every tail).
int64_t odd_length(DType t) { return block_of(t) == 1 ? 1003 : (block_of(t) == 32 ? 32 * 67 : 256 * 9); }

// Kernel error bound (vs the dequantized activations): integer sums are exact, so only float rounding
// of the per-block products and their sum remains. Activation-quantization bound (vs the float
// activations): 8-bit activations with 127 levels per block give NMSE ~ 1e-5 on Gaussian data.
// Measured: kernel NMSE 5e-15..4e-13 (Q4_1/Q5_1 highest: the offset term), float-activation NMSE
// 2e-5..4e-5 for 32-element activation blocks and 4e-5..1.1e-4 for 256-element ones (their amax, so
// their step, is larger); F32/F16/BF16 ~4e-14 (float summation order only).
constexpr double kKernelNmse = 1e-11;
double act_nmse_bound(DType t) {
  switch (act_format_for(t)) {
    case ActFormat::F32: return 1e-12;
    case ActFormat::Q8_K: return 4e-4;
    default: return 2e-4;
  }
}

class VecDotType : public ::testing::TestWithParam<DType> {};

// The SIMD levels this CPU runs (each tested on its own, forced through vec_dot_fn_at).
std::vector<CpuIsa> simd_levels() {
  std::vector<CpuIsa> v;
  if (cpu_isa_detected() >= CpuIsa::Avx2) v.push_back(CpuIsa::Avx2);
  if (cpu_isa_detected() >= CpuIsa::Avx512) v.push_back(CpuIsa::Avx512);
  return v;
}
const char* level_name(CpuIsa l) { return l == CpuIsa::Avx512 ? "AVX-512" : l == CpuIsa::Avx2 ? "AVX2" : "scalar"; }

// The weight types each SIMD level has its own kernels for (the others fall back a level).
bool has_own_kernel(CpuIsa l, DType t) {
  if (l == CpuIsa::Avx2) return detail::avx2_dot(t) != nullptr;
  switch (t) {
    case DType::Q4_0:
    case DType::Q4_1:
    case DType::Q5_0:
    case DType::Q5_1:
    case DType::Q8_0:
    case DType::IQ4_NL:
    case DType::IQ4_XS:
    case DType::Q2_K:
    case DType::Q3_K:
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K: return true;
    default: return false;
  }
}

TEST_P(VecDotType, MatchesReferenceOnRandomRows) {
  const DType t = GetParam();
  const Case cs = make_case(t, odd_length(t), 9, 7, 100 + (uint64_t)t);
  const std::vector<float> ys = run_single(cs, vec_dot_scalar_fn(t));
  const double e_s = nmse_vs(ys, cs.ref), e_sf = nmse_vs(ys, cs.ref_float);
  EXPECT_LT(e_s, kKernelNmse) << "scalar vs reference";
  EXPECT_LT(e_sf, act_nmse_bound(t)) << "scalar vs float activations";
  EXPECT_TRUE(same_bits(run_tile(cs, vec_dot_tile_scalar_fn(t)), ys)) << "scalar tile differs from scalar dot";
  char buf[128];
  std::snprintf(buf, sizeof buf, "  %-6s NMSE vs reference / vs float activations: scalar %.3g / %.3g", dtype_name(t).c_str(),
                e_s, e_sf);
  std::string line = buf;
  for (CpuIsa level : simd_levels()) {
    SCOPED_TRACE(level_name(level));
    if (level == CpuIsa::Avx2) {
      ASSERT_NE(detail::avx2_dot(t), nullptr) << "no AVX2 kernel";
    }
    if (level == CpuIsa::Avx512 && has_own_kernel(level, t)) {
      ASSERT_NE(detail::avx512_dot(t), nullptr) << "no AVX-512 kernel";
      ASSERT_NE(detail::avx512_tile(t), nullptr) << "no AVX-512 tile";
      EXPECT_EQ(vec_dot_fn_at(level, t), detail::avx512_dot(t));
    }
    const VecDotFn fn = vec_dot_fn_at(level, t);
    const std::vector<float> ya = run_single(cs, fn);
    const double e_a = nmse_vs(ya, cs.ref), e_af = nmse_vs(ya, cs.ref_float);
    EXPECT_LT(e_a, kKernelNmse) << "SIMD vs reference";
    EXPECT_LT(e_af, act_nmse_bound(t)) << "SIMD vs float activations";
    EXPECT_LT(nmse(ya.data(), ys.data(), ya.size()), kKernelNmse) << "SIMD vs scalar";
    EXPECT_TRUE(same_bits(run_tile(cs, vec_dot_tile_fn_at(level, t)), ya)) << "tile differs from the single dot";
    EXPECT_TRUE(same_bits(run_single(cs, fn), ya)) << "dot not repeatable";
    std::snprintf(buf, sizeof buf, "; %s %.3g / %.3g", level_name(level), e_a, e_af);
    line += buf;
  }
  if (cpu_isa() == cpu_isa_detected()) {
    EXPECT_EQ(vec_dot_fn(t), vec_dot_fn_at(cpu_isa_detected(), t));
    EXPECT_EQ(vec_dot_tile_fn(t), vec_dot_tile_fn_at(cpu_isa_detected(), t));
  }
  std::printf("%s\n", line.c_str());
}

// Tiles of every shape the drivers split into (1..17 activation rows: the AVX2 groups of 4 and the
// AVX-512 groups of 8 with every remainder; 3 or 13 weight rows: the float kernels' blocks of 6, 4, 2 and 1),
// rows of 1 and 3 blocks, at every level.
TEST_P(VecDotType, TileShapesAreBitIdenticalToSingleDots) {
  const DType t = GetParam();
  for (int64_t blocks : {1, 3}) {
    const int64_t n = block_of(t) == 1 ? 37 * blocks : block_of(t) * blocks;
    for (int n_a = 1; n_a <= 17; ++n_a) {
      const Case cs = make_case(t, n, n_a % 2 ? 3 : 13, n_a, 200 + (uint64_t)n_a + 50 * (uint64_t)blocks);
      EXPECT_TRUE(same_bits(run_tile(cs, vec_dot_tile_scalar_fn(t)), run_single(cs, vec_dot_scalar_fn(t))));
      for (CpuIsa level : simd_levels()) {
        const std::vector<float> single = run_single(cs, vec_dot_fn_at(level, t));
        EXPECT_TRUE(same_bits(run_tile(cs, vec_dot_tile_fn_at(level, t)), single))
            << level_name(level) << " n_a " << n_a << " blocks " << blocks;
        EXPECT_LT(nmse_vs(single, cs.ref), kKernelNmse) << level_name(level) << " n_a " << n_a << " blocks " << blocks;
      }
    }
  }
}

TEST_P(VecDotType, ZeroRowsGiveExactZero) {
  const DType t = GetParam();
  const int64_t n = odd_length(t);
  const ActFormat f = act_format_for(t);
  Rng rng(7);
  const std::vector<uint8_t> zero_w(dtype_row_bytes(t, n), 0);  // all-zero bytes: every scale 0
  const std::vector<uint8_t> rand_w = gaussian_row(t, n, rng);
  const std::vector<uint8_t> zero_a = quantize_act(f, std::vector<float>((size_t)n, 0.f));
  const std::vector<uint8_t> rand_a = quantize_act(f, gaussian((size_t)n, rng));
  std::vector<VecDotFn> fns = {vec_dot_scalar_fn(t)};
  for (CpuIsa level : simd_levels()) fns.push_back(vec_dot_fn_at(level, t));
  for (VecDotFn fn : fns) {
    EXPECT_EQ(fn(zero_w.data(), rand_a.data(), n), 0.f);
    EXPECT_EQ(fn(rand_w.data(), zero_a.data(), n), 0.f);
  }
}

// Extreme levels (every byte 0x00, 0xFF, 0x80, 0x7F, 0x88, 0x77, random) times activations at
// +-127 (same signs, all positive, all negative), at several magnitudes: each output is checked
// against the double reference, relative to sum |w a|, so an int16 saturation cannot hide.
TEST_P(VecDotType, WorstCaseLevelsDoNotOverflow) {
  const DType t = GetParam();
  const int64_t n = block_of(t) == 1 ? 515 : block_of(t) * 3;
  const ActFormat f = act_format_for(t);
  int seed = 0;
  for (int fill : {0x00, 0xFF, 0x80, 0x7F, 0x88, 0x77, 0x11, -1}) {
    for (double mag : {1e-3, 1.0, 3e4}) {
      const Case cs = make_case(t, n, 2, 9, 300 + seed++, fill, mag, true);
      const size_t wb = dtype_row_bytes(t, n), ab = act_row_bytes(f, n);
      std::vector<std::vector<float>> outs = {run_single(cs, vec_dot_scalar_fn(t))};
      for (CpuIsa level : simd_levels()) {
        outs.push_back(run_single(cs, vec_dot_fn_at(level, t)));
        outs.push_back(run_tile(cs, vec_dot_tile_fn_at(level, t)));
      }
      for (int r = 0; r < cs.n_w; ++r) {
        const std::vector<double> wd = dequant_weight(t, cs.w.data() + r * wb, n);
        for (int c = 0; c < cs.n_a; ++c) {
          const std::vector<double> ad = dequant_act(f, cs.a.data() + c * ab, n);
          double mass = 0;
          for (int64_t i = 0; i < n; ++i) mass += std::fabs(wd[(size_t)i] * ad[(size_t)i]);
          const double ref = cs.ref[(size_t)c * cs.n_w + r];
          for (const auto& y : outs) {
            ASSERT_LE(std::fabs(y[(size_t)c * cs.n_w + r] - ref), 1e-5 * mass + 1e-30)
                << dtype_name(t) << " fill " << fill << " magnitude " << mag << " row " << r << " act " << c;
          }
        }
      }
    }
  }
}

std::string type_param_name(const ::testing::TestParamInfo<DType>& info) { return dtype_name(info.param); }

INSTANTIATE_TEST_SUITE_P(VecDot, VecDotType, ::testing::ValuesIn(kTypes), type_param_name);

// The KV row conversion (F16C where the CPU has it) gives the reference codec's exact floats for every
// f16 bit pattern but NaNs (all 65536, so denormals, infinities and both zeros), at row lengths that
// leave every tail size of the 8-wide loop.
TEST(KvRowToF32, F16IsBitIdenticalToTheReferenceCodec) {
  std::vector<uint16_t> all(65536);
  for (size_t i = 0; i < all.size(); ++i) all[i] = (uint16_t)i;
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{8}, int64_t{13}, int64_t{64}, int64_t{65535}, int64_t{65536}}) {
    std::vector<float> fast((size_t)n), ref((size_t)n);
    kv_row_to_f32(DType::F16, all.data() + (65536 - n), fast.data(), n);
    dequantize_row_ref(DType::F16, all.data() + (65536 - n), ref.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      if (std::isnan(ref[(size_t)i])) {
        EXPECT_TRUE(std::isnan(fast[(size_t)i])) << "n=" << n << " i=" << i;
        continue;
      }
      ASSERT_EQ(0, std::memcmp(&fast[(size_t)i], &ref[(size_t)i], sizeof(float)))
          << "n=" << n << " bits 0x" << std::hex << all[(size_t)(65536 - n + i)];
    }
  }
}

// The KV store's F16 conversion against the reference codec: every 4099th f32 bit pattern (all
// exponents, signs, infinities and NaNs), every pattern around the half subnormal and overflow
// boundaries, and ties, at row lengths that exercise the 8-wide loop and its tail.
TEST(KvRowFromF32, F16IsBitIdenticalToTheReferenceCodec) {
  std::vector<uint32_t> bits;
  for (uint64_t u = 0; u < (1ull << 32); u += 4099) bits.push_back((uint32_t)u);
  for (uint32_t edge : {0x33000000u, 0x38800000u, 0x477ff000u, 0x7f800000u})
    for (uint32_t d = 0; d < 8192; ++d) {
      bits.push_back(edge - 4096 + d);
      bits.push_back((edge - 4096 + d) | 0x80000000u);
    }
  for (uint32_t m = 0; m < 4096; ++m) bits.push_back(0x3f800000u | (m << 13) | 0x1000u);  // halfway cases
  std::vector<float> x(bits.size());
  std::memcpy(x.data(), bits.data(), x.size() * sizeof(float));
  for (int64_t n : {int64_t{1}, int64_t{13}, (int64_t)x.size()}) {
    std::vector<uint16_t> fast((size_t)n), ref((size_t)n);
    kv_row_from_f32(DType::F16, x.data(), fast.data(), n);
    quantize_row_ref(DType::F16, x.data(), ref.data(), n);
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(fast[(size_t)i], ref[(size_t)i]) << "n=" << n << " f32 bits 0x" << std::hex << bits[(size_t)i];
  }
}

// The quantized KV row types, from blocks written by hand (f16 scales given as bits, little endian) and
// values worked out here: Q8_0 is d * q, Q4_0 is d * (nibble - 8) with element j in the low nibble of
// byte j and element j + 16 in its high nibble; BF16 is the top half of an f32.
TEST(KvRowToF32, QuantizedRowsFromBlocksWrittenByHand) {
  {  // Q8_0: two blocks, d = 0.5 (0x3800) and d = -0.25 (0xB400), q = j - 16 and 3 * (j % 5) - 6.
    std::vector<uint8_t> q(2 * 34);
    std::vector<float> want(64);
    q[0] = 0x00, q[1] = 0x38, q[34] = 0x00, q[35] = 0xB4;
    for (int j = 0; j < 32; ++j) {
      const int8_t a = (int8_t)(j - 16), b = (int8_t)(3 * (j % 5) - 6);
      q[2 + j] = (uint8_t)a;
      q[36 + j] = (uint8_t)b;
      want[j] = 0.5f * a;
      want[32 + j] = -0.25f * b;
    }
    std::vector<float> got(64);
    kv_row_to_f32(DType::Q8_0, q.data(), got.data(), 64);
    for (int j = 0; j < 64; ++j) EXPECT_EQ(got[j], want[j]) << "Q8_0 element " << j;
  }
  {  // Q4_0: one block, d = 3.0 (0x4200); byte j holds nibbles lo = j and hi = 15 - j.
    std::vector<uint8_t> q(18);
    std::vector<float> want(32);
    q[0] = 0x00, q[1] = 0x42;
    for (int j = 0; j < 16; ++j) {
      q[2 + j] = (uint8_t)(j | (15 - j) << 4);
      want[j] = 3.0f * (j - 8);
      want[16 + j] = 3.0f * (15 - j - 8);
    }
    std::vector<float> got(32);
    kv_row_to_f32(DType::Q4_0, q.data(), got.data(), 32);
    for (int j = 0; j < 32; ++j) EXPECT_EQ(got[j], want[j]) << "Q4_0 element " << j;
  }
  {  // BF16: 1.0 (0x3F80), -3.0 (0xC040), 0.5 (0x3F00), 2^-7 (0x3C00).
    const uint16_t bits[4] = {0x3F80, 0xC040, 0x3F00, 0x3C00};
    const float want[4] = {1.0f, -3.0f, 0.5f, 0.0078125f};
    float got[4];
    kv_row_to_f32(DType::BF16, bits, got, 4);
    for (int j = 0; j < 4; ++j) EXPECT_EQ(got[j], want[j]) << "BF16 element " << j;
  }
}

}  // namespace
}  // namespace roofline::cpu
