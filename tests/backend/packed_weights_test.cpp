// Packed weights (backend/cpu/packed_weights.h): the repacked layout against the GGUF rows it came from,
// the packed kernels against a double-precision reference on random data (row counts that leave a
// partial 16-row group, odd block counts), batch invariance (every activation row gives the same bits
// alone, in any tile shape, and through matmul's task split), worst-case levels, and which matrices a
// backend packs. The kernels need AVX-512 VNNI: their tests skip on a CPU without it.
#include "backend/cpu/packed_weights.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "backend/cpu/matmul.h"
#include "core/fp16.h"
#include "core/rng.h"
#include "formats/quant_blocks.h"
#include "formats/quant_ref.h"

namespace roofline::cpu {
namespace {

const DType kPackedTypes[] = {DType::Q4_0, DType::Q8_0, DType::Q4_K, DType::Q5_K, DType::Q6_K};

// A matrix of `rows` rows of n elements in a GGUF type, with its TensorInfo (Weight views it).
struct Matrix {
  gguf::TensorInfo info;
  std::vector<uint8_t> bytes;
  Weight weight() const { return Weight{&info}; }
};

Matrix random_matrix(DType t, int64_t rows, int64_t n, uint64_t seed, int fill = -1) {
  Matrix m;
  m.info.name = "test.weight";
  m.info.type = t;
  m.info.n_dims = 2;
  m.info.ne = {n, rows, 1, 1};
  m.bytes.resize(dtype_row_bytes(t, n) * (size_t)rows);
  Rng rng(seed);
  if (fill >= 0) {  // every level byte `fill`, scales random
    std::memset(m.bytes.data(), fill, m.bytes.size());  // Q4_K: its scale bytes too (0xFF: scales and mins 63)
    const size_t block = dtype_row_bytes(t, dtype_block_size(t));
    for (size_t off = 0; off < m.bytes.size(); off += block) {
      for (int s = 0; s < (t == DType::Q4_K || t == DType::Q5_K ? 2 : 1); ++s) {  // d (and dmin; Q6_K's d comes last)
        const uint16_t d = f32_to_fp16((float)(0.01 + rng.uniform() * 0.02));
        std::memcpy(m.bytes.data() + off + (t == DType::Q6_K ? offsetof(BlockQ6_K, d) : 2 * s), &d, 2);
      }
    }
  } else {
    std::vector<float> x((size_t)(rows * n));
    for (float& v : x) v = (float)rng.normal();
    quantize_rows_ref(t, x.data(), m.bytes.data(), rows, n);
  }
  m.info.n_bytes = m.bytes.size();
  m.info.data = m.bytes.data();
  return m;
}

std::vector<float> random_acts(int n_a, int64_t n, uint64_t seed, double magnitude = 1.0, bool extreme = false) {
  Rng rng(seed);
  std::vector<float> x((size_t)(n_a * n));
  for (float& v : x) v = extreme ? (float)(rng.uniform() < 0.5 ? -magnitude : magnitude) : (float)(rng.normal() * magnitude);
  return x;
}

ActFormat act_of(DType t) { return act_format_for(t); }

// An activation row as the kernels see it: d * q.
std::vector<float> dequant_act(ActFormat f, const uint8_t* row, int64_t n) {
  std::vector<float> a((size_t)n);
  if (f == ActFormat::Q8_0) {
    dequantize_row_ref(DType::Q8_0, row, a.data(), n);
  } else {
    const auto* b = reinterpret_cast<const BlockQ8_K*>(row);
    for (int64_t i = 0; i < n; ++i) a[(size_t)i] = b[i / 256].d * (float)b[i / 256].qs[i % 256];
  }
  return a;
}

// Reference: the dequantized weights times the dequantized activation rows, in double.
std::vector<double> reference(const Matrix& m, const ActRows& act) {
  const int64_t rows = m.info.ne[1], n = m.info.ne[0];
  std::vector<float> w((size_t)(rows * n));
  dequantize_rows_ref(m.info.type, m.bytes.data(), w.data(), rows, n);
  std::vector<double> y((size_t)act.n_rows() * rows);
  for (int c = 0; c < act.n_rows(); ++c) {
    const std::vector<float> a = dequant_act(act.format(), act.row(c), n);
    for (int64_t r = 0; r < rows; ++r) {
      double s = 0;
      for (int64_t i = 0; i < n; ++i) s += (double)w[(size_t)(r * n + i)] * a[(size_t)i];
      y[(size_t)c * rows + r] = s;
    }
  }
  return y;
}

// The packed tile over all rows and activation rows [c0, c0 + n_a), into an output with padding that must
// stay untouched.
std::vector<float> run_packed(const PackedMatrix& pm, int64_t rows, const ActRows& act, int c0, int n_a, int64_t n,
                              PackedTileFn fn = nullptr) {
  const size_t ldy = (size_t)rows + 5;
  std::vector<float> padded(ldy * (size_t)n_a, -777.f);
  (fn ? fn : pm.tile())(pm.data(), pm.group_bytes(), (int)rows, act.packed(), c0, n_a, n, padded.data(), ldy);
  std::vector<float> y((size_t)n_a * rows);
  for (int c = 0; c < n_a; ++c)
    for (size_t r = 0; r < ldy; ++r) {
      if (r < (size_t)rows) y[(size_t)c * rows + r] = padded[c * ldy + r];
      else EXPECT_EQ(padded[c * ldy + r], -777.f) << "the tile wrote past its rows";
    }
  return y;
}

// The kernels are tested at every level the CPU has (AVX-512 VNNI, AVX2), whatever ROOFLINE_CPU_ISA caps
// the products at.
std::vector<CpuIsa> kernel_levels() {
  std::vector<CpuIsa> levels;
  for (CpuIsa l : {CpuIsa::Avx512, CpuIsa::Avx2})
    if (l <= cpu_isa_detected() && packed_tile_fn_at(l, DType::Q4_0) != nullptr) levels.push_back(l);
  return levels;
}
const char* level_name(CpuIsa l) { return l == CpuIsa::Avx512 ? "avx512" : "avx2"; }

class PackedType : public ::testing::TestWithParam<DType> {};

// The GGUF block of row i, block b, rebuilt from a packed entry (the inverse of pack_groups).
std::vector<uint8_t> unpack_block(DType t, const uint8_t* e, int i) {
  std::vector<uint8_t> blk(dtype_row_bytes(t, dtype_block_size(t)));
  const auto chunks = [&](const uint8_t* levels, uint8_t* qs, int n_chunks, uint8_t x) {
    for (int j = 0; j < n_chunks; ++j)
      for (int u = 0; u < 4; ++u) qs[4 * j + u] = (uint8_t)(levels[64 * j + 4 * i + u] ^ x);
  };
  std::memcpy(blk.data() + (t == DType::Q6_K ? offsetof(BlockQ6_K, d) : 0), e + 2 * i, 2);  // d
  if (t == DType::Q4_0) chunks(e + 32, blk.data() + 2, 4, 0);
  if (t == DType::Q8_0) chunks(e + 32, blk.data() + 2, 8, 0x80);
  if (t == DType::Q4_K || t == DType::Q5_K) {  // the same header; Q5_K's qh chunks come before its qs chunks
    const bool five = t == DType::Q5_K;
    std::memcpy(blk.data() + 2, e + 32 + 2 * i, 2);  // dmin
    for (int k = 0; k < kKScaleBytes; ++k) blk[4 + k] = e[64 + 16 * k + i];
    if (five) chunks(e + 64 + 16 * kKScaleBytes, blk.data() + offsetof(BlockQ5_K, qh), 8, 0);
    chunks(e + 64 + 16 * kKScaleBytes + (five ? 8 * 64 : 0),
           blk.data() + (five ? offsetof(BlockQ5_K, qs) : offsetof(BlockQ4_K, qs)), 32, 0);
  }
  if (t == DType::Q6_K) {
    for (int k = 0; k < 16; ++k) blk[offsetof(BlockQ6_K, scales) + k] = e[32 + 16 * k + i];
    for (int h = 0; h < 2; ++h)  // the chunks of each (h, v) together, in reading order
      for (int v = 0; v < 2; ++v)
        for (int t = 0; t < 4; ++t) {
          const int u = 4 * v + t;
          chunks(e + 32 + 256 + 64 * q6_packed_chunk(h, v, 0, t), blk.data() + offsetof(BlockQ6_K, ql) + 4 * (16 * h + u), 1, 0);
          chunks(e + 32 + 256 + 64 * q6_packed_chunk(h, v, 1, t), blk.data() + offsetof(BlockQ6_K, ql) + 4 * (16 * h + 8 + u), 1, 0);
          chunks(e + 32 + 256 + 64 * q6_packed_chunk(h, v, 2, t), blk.data() + offsetof(BlockQ6_K, qh) + 4 * (8 * h + u), 1, 0);
        }
  }
  return blk;
}

TEST_P(PackedType, LayoutHoldsEveryRowsBlockBytes) {
  const DType t = GetParam();
  const int64_t rows = 21, n = dtype_block_size(t) * 3;
  const Matrix m = random_matrix(t, rows, n, 11);
  std::vector<uint8_t> packed(packed_group_bytes(t, n) * 2);
  pack_groups(t, m.bytes.data(), rows, n, 0, 2, packed.data());
  const size_t entry = packed_entry_bytes(t), row_bytes = dtype_row_bytes(t, n), block_bytes = row_bytes / 3;
  ASSERT_EQ(entry, 16 * block_bytes);  // the tensor's bytes per 16 rows
  for (int64_t r = 0; r < 32; ++r) {
    for (int64_t b = 0; b < 3; ++b) {
      const uint8_t* e = packed.data() + (size_t)(r / 16) * packed_group_bytes(t, n) + (size_t)b * entry;
      const std::vector<uint8_t> got = unpack_block(t, e, (int)(r % 16));
      if (r >= rows) {
        const size_t d_at = t == DType::Q6_K ? offsetof(BlockQ6_K, d) : 0;
        EXPECT_EQ(got[d_at] | got[d_at + 1], 0) << "padding row " << r << " has a scale";
        continue;
      }
      ASSERT_EQ(std::memcmp(got.data(), m.bytes.data() + (size_t)r * row_bytes + (size_t)b * block_bytes, block_bytes), 0)
          << "row " << r << " block " << b;
    }
  }
}

TEST_P(PackedType, MatchesTheReferenceAndIsBatchInvariant) {
  if (kernel_levels().empty()) GTEST_SKIP() << "no AVX-512 VNNI or AVX2 on this CPU";
  const DType t = GetParam();
  ThreadPool pool(2);
  for (CpuIsa level : kernel_levels())
  for (int64_t rows : {16, 37, 5}) {
    if (!packed_tile_fn_at(level, t)) continue;  // AVX2 packs Q4_0, Q8_0 and Q4_K only
    SCOPED_TRACE(level_name(level));
    const int64_t n = dtype_block_size(t) == 256 ? 256 * 9 : 32 * 67;
    const Matrix m = random_matrix(t, rows, n, 100 + (uint64_t)rows);
    const PackedMatrix pm(m.weight(), pool, packed_tile_fn_at(level, t));
    const int n_act = 17;
    const std::vector<float> x = random_acts(n_act, n, 7 + (uint64_t)rows);
    ActRows act;
    act.prepare(act_of(t), x.data(), n_act, n, pool);
    const std::vector<double> ref = reference(m, act);
    const std::vector<float> all = run_packed(pm, rows, act, 0, n_act, n);
    double num = 0, den = 0;
    for (size_t i = 0; i < all.size(); ++i) {
      num += (all[i] - ref[i]) * (all[i] - ref[i]);
      den += ref[i] * ref[i];
    }
    EXPECT_LT(num / den, 1e-11) << dtype_name(t) << " rows " << rows;
    // Every activation row alone, and every tile shape from every start, gives the same bits.
    for (int c0 = 0; c0 < n_act; ++c0) {
      for (int n_a = 1; c0 + n_a <= n_act; n_a += 3) {
        const std::vector<float> part = run_packed(pm, rows, act, c0, n_a, n);
        ASSERT_EQ(std::memcmp(part.data(), all.data() + (size_t)c0 * rows, part.size() * sizeof(float)), 0)
            << dtype_name(t) << " rows " << rows << " from " << c0 << " n_a " << n_a;
      }
    }
  }
}

// Extreme levels (Q8_0 bytes 0x80 = -128 and 0x7F; Q4_0 nibbles 0 and 15; Q4_K scales and mins of 63;
// Q5_K levels 0 and 31; Q6_K levels 0 and 63, scales -128 and 127) times activations at +-127 of
// large and small magnitude: each output within 1e-5 of the sum of |w a| (an int32 wrap would not be).
TEST_P(PackedType, WorstCaseLevelsDoNotOverflow) {
  if (kernel_levels().empty()) GTEST_SKIP() << "no AVX-512 VNNI or AVX2 on this CPU";
  const DType t = GetParam();
  ThreadPool pool(1);
  const int64_t rows = 19, n = dtype_block_size(t) * 5;
  for (CpuIsa level : kernel_levels()) {
  if (!packed_tile_fn_at(level, t)) continue;
  SCOPED_TRACE(level_name(level));
  int seed = 0;
  for (int fill : {0x00, 0xFF, 0x80, 0x7F, 0x88, 0x77}) {
    for (double magnitude : {1e-3, 1.0, 3e4}) {
      const Matrix m = random_matrix(t, rows, n, 500 + seed, fill);
      const PackedMatrix pm(m.weight(), pool, packed_tile_fn_at(level, t));
      const std::vector<float> x = random_acts(3, n, 900 + seed++, magnitude, true);
      ActRows act;
      act.prepare(act_of(t), x.data(), 3, n, pool);
      const std::vector<double> ref = reference(m, act);
      const std::vector<float> y = run_packed(pm, rows, act, 0, 3, n);
      std::vector<float> w((size_t)(rows * n));
      dequantize_rows_ref(t, m.bytes.data(), w.data(), rows, n);
      for (int c = 0; c < 3; ++c) {
        const std::vector<float> a = dequant_act(act.format(), act.row(c), n);
        for (int64_t r = 0; r < rows; ++r) {
          double mass = 0;
          for (int64_t i = 0; i < n; ++i) mass += std::fabs((double)w[(size_t)(r * n + i)] * a[(size_t)i]);
          const size_t o = (size_t)c * rows + (size_t)r;
          ASSERT_LE(std::fabs(y[o] - ref[o]), 1e-5 * mass + 1e-30)
              << dtype_name(t) << " fill " << fill << " magnitude " << magnitude << " row " << r;
        }
      }
    }
  }
  }
}

// The AVX2 kernels compute the AVX-512 kernels' integer sums and float steps: the same bits. Q5_K and Q6_K have no
// AVX2 packed kernel (they stay in place on AVX2), so the loop checks exactly the types that have one.
TEST(PackedKernels, Avx2AndAvx512KernelsAgree) {
  if (kernel_levels().size() < 2) GTEST_SKIP() << "needs both AVX-512 VNNI and AVX2 kernels";
  int compared = 0;
  for (DType t : kPackedTypes) {
    if (!packed_tile_fn_at(CpuIsa::Avx2, t)) {
      EXPECT_TRUE(t == DType::Q5_K || t == DType::Q6_K) << dtype_name(t) << " lost its AVX2 packed kernel";
      continue;
    }
    ThreadPool pool(1);
    const int64_t rows = 21, n = dtype_block_size(t) * 7;
    const Matrix m = random_matrix(t, rows, n, 4242);
    const std::vector<float> x = random_acts(6, n, 31);
    ActRows act;
    act.prepare(act_of(t), x.data(), 6, n, pool);
    const PackedMatrix a(m.weight(), pool, packed_tile_fn_at(CpuIsa::Avx512, t));
    const PackedMatrix b(m.weight(), pool, packed_tile_fn_at(CpuIsa::Avx2, t));
    const std::vector<float> ya = run_packed(a, rows, act, 0, 6, n), yb = run_packed(b, rows, act, 0, 6, n);
    EXPECT_EQ(std::memcmp(ya.data(), yb.data(), ya.size() * sizeof(float)), 0) << dtype_name(t);
    ++compared;
  }
  EXPECT_EQ(compared, 3) << "Q4_0, Q8_0 and Q4_K have AVX2 packed kernels";
}

// The one-row decode loop walking 2, 4 or 8 groups side by side (ROOFLINE_CPU_STREAMS) gives the bits of one group at
// a time, for every packed type of every kernel level this CPU has (AVX-512 VNNI, AVX2), for ranges whose groups the
// streams split evenly and not (a remainder, a partial last group, fewer groups than streams).
TEST(PackedKernels, DecodeStreamsGiveTheBitsOfOneStream) {
  if (kernel_levels().empty()) GTEST_SKIP() << "no packed kernels on this CPU";
  ThreadPool pool(1);
  for (CpuIsa level : kernel_levels())
  for (DType t : kPackedTypes)
    for (int64_t rows : {16 * 16, 16 * 19 + 5, 16 * 37 + 11, 16 * 3 + 7}) {
      if (!packed_tile_fn_at(level, t)) continue;  // Q5_K and Q6_K have no AVX2 packed kernel
      const int64_t n = dtype_block_size(t) == 256 ? 256 * 5 : 32 * 23;
      const Matrix m = random_matrix(t, rows, n, 900 + (uint64_t)rows);
      const std::vector<float> x = random_acts(3, n, 17);
      ActRows act;
      act.prepare(act_of(t), x.data(), 3, n, pool);
      const PackedMatrix pm(m.weight(), pool, packed_tile_fn_at(level, t));
      const std::vector<double> ref = reference(m, act);
      for (int c0 = 0; c0 < 3; ++c0) {
        detail::decode_streams_for_test = 1;
        const std::vector<float> one = run_packed(pm, rows, act, c0, 1, n);
        for (int r = 0; r < rows; ++r)
          ASSERT_NEAR(one[(size_t)r], ref[(size_t)c0 * rows + r], 1e-3 * (1 + std::fabs(ref[(size_t)c0 * rows + r])));
        for (int streams : {2, 4, 8}) {
          detail::decode_streams_for_test = streams;
          const std::vector<float> y = run_packed(pm, rows, act, c0, 1, n);
          EXPECT_EQ(std::memcmp(y.data(), one.data(), y.size() * sizeof(float)), 0)
              << dtype_name(t) << " " << level_name(level) << " rows " << rows << " streams " << streams;
        }
      }
      detail::decode_streams_for_test = 0;
    }
}

// The AMX prompt kernels give the AVX-512 VNNI kernels' bits for every type, tile shape (partial tiles of
// activation rows and of weight rows) and start row, on random and on extreme levels and activations.
TEST(PackedKernels, AmxAndAvx512KernelsAgree) {
  if (!detail::amx_supported()) GTEST_SKIP() << "no AMX-INT8 on this CPU (or ROOFLINE_CPU_AMX=0)";
  ThreadPool pool(1);
  for (DType t : kPackedTypes) {
    const PackedTileFn vnni = packed_tile_fn_at(CpuIsa::Avx512, t);
    ASSERT_NE(vnni, nullptr);
    const int64_t n = dtype_block_size(t) == 256 ? 256 * 3 : 32 * 11;
    for (int fill : {-1, 0xFF, 0x80}) {
      const int64_t rows = fill < 0 ? 37 : 19;
      const Matrix m = random_matrix(t, rows, n, 4300 + (uint64_t)fill, fill);
      const PackedMatrix pm(m.weight(), pool, vnni);
      ASSERT_NE(pm.prompt_tile(), nullptr) << dtype_name(t);
      const int n_act = 43;
      const std::vector<float> x = random_acts(n_act, n, 77 + (uint64_t)fill, fill < 0 ? 1.0 : 3e4, fill >= 0);
      ActRows act;
      act.prepare(act_of(t), x.data(), n_act, n, pool);
      for (const auto& [c0, n_a] : {std::pair{0, 43}, {0, 16}, {3, 17}, {5, 1}, {2, 40}, {30, 13}, {16, 27}, {32, 11}}) {
        const std::vector<float> want = run_packed(pm, rows, act, c0, n_a, n);
        const std::vector<float> got = run_packed(pm, rows, act, c0, n_a, n, pm.prompt_tile());
        ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
            << dtype_name(t) << " fill " << fill << " from " << c0 << " n_a " << n_a;
      }
    }
  }
}

// Through matmul: several tasks of rows (prefill and decode splits), packed against in place, and each
// activation row alone against the batch.
TEST_P(PackedType, MatmulReadsThePackedCopy) {
  if (packed_tile_fn(GetParam()) == nullptr || !repack_enabled())
    GTEST_SKIP() << "no packed kernels at this CPU's level (or ROOFLINE_CPU_ISA's cap, or ROOFLINE_CPU_REPACK=0)";
  const DType t = GetParam();
  ThreadPool pool(2);
  const int64_t rows = 300, n = dtype_block_size(t) * 9;
  const Matrix m = random_matrix(t, rows, n, 42);
  PackedWeights packed;
  ASSERT_TRUE(packed.add(m.weight(), pool));
  ASSERT_NE(packed.find(m.weight()), nullptr);
  EXPECT_EQ(packed.bytes(), packed_group_bytes(t, n) * 19);  // 300 rows: 19 groups of 16
  static_assert(kPromptKernelRows <= 37);
  const int n_act = 37;  // at least kPromptKernelRows: the prompt (AMX) kernels where the CPU has them
  const std::vector<float> x = random_acts(n_act, n, 3);
  std::vector<float> y_packed((size_t)(n_act * rows)), y_plain((size_t)(n_act * rows));
  matmul(m.weight(), x.data(), n_act, y_packed.data(), pool, &packed);
  matmul(m.weight(), x.data(), n_act, y_plain.data(), pool);
  double num = 0, den = 0;
  for (size_t i = 0; i < y_plain.size(); ++i) {
    num += (y_packed[i] - y_plain[i]) * (y_packed[i] - y_plain[i]);
    den += (double)y_plain[i] * y_plain[i];
  }
  EXPECT_LT(num / den, 1e-11);  // the same integer sums; float order only
  for (int c : {0, 5, 20, 36}) {
    std::vector<float> one((size_t)rows);
    matmul(m.weight(), x.data() + (size_t)c * n, 1, one.data(), pool, &packed);
    EXPECT_EQ(std::memcmp(one.data(), y_packed.data() + (size_t)c * rows, one.size() * sizeof(float)), 0) << "row " << c;
  }
}

// Two PackedWeights holding the same tensor (two engines on one file: the MTP head's and its target's)
// share one packed copy; once neither holds it, a new holder packs it again.
TEST(PackedWeights, HoldersOfOneTensorShareOneCopy) {
  if (packed_tile_fn(DType::Q4_0) == nullptr || !repack_enabled()) GTEST_SKIP() << "no packed kernels at this level";
  ThreadPool pool(2);
  const Matrix m = random_matrix(DType::Q4_0, 40, 32 * 8, 9);
  auto first = std::make_unique<PackedWeights>();
  PackedWeights second;
  ASSERT_TRUE(first->add(m.weight(), pool));
  ASSERT_TRUE(second.add(m.weight(), pool));
  EXPECT_EQ(first->find(m.weight()), second.find(m.weight()));
  EXPECT_EQ(second.bytes(), first->bytes());
  const Matrix other = random_matrix(DType::Q4_0, 40, 32 * 8, 10);  // another tensor: its own copy
  ASSERT_TRUE(first->add(other.weight(), pool));
  EXPECT_NE(first->find(other.weight()), first->find(m.weight()));
  EXPECT_EQ(second.find(other.weight()), nullptr);
  first.reset();  // the shared copy lives on in `second`
  ASSERT_NE(second.find(m.weight()), nullptr);
  std::vector<float> x = random_acts(1, 32 * 8, 5), y(40), want(40);
  matmul(m.weight(), x.data(), 1, y.data(), pool, &second);
  matmul(m.weight(), x.data(), 1, want.data(), pool);
  double num = 0, den = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    num += ((double)y[i] - want[i]) * ((double)y[i] - want[i]);
    den += (double)want[i] * want[i];
  }
  EXPECT_LT(num / den, 1e-11);
}

INSTANTIATE_TEST_SUITE_P(Packed, PackedType, ::testing::ValuesIn(kPackedTypes),
                         [](const ::testing::TestParamInfo<DType>& info) { return dtype_name(info.param); });

// Gathered activation rows (a MoE layer's rows per expert) are the bytes and block sums of preparing those
// rows again, also on an ActRows last prepared in another format.
TEST(PackedWeights, GatheredRowsAreTheRowsPreparedAgain) {
  ThreadPool pool(2);
  const int64_t n = 512;
  const std::vector<float> x = random_acts(7, n, 77);
  const std::vector<int> pick = {5, 0, 5, 3};
  std::vector<float> picked;
  for (int r : pick) picked.insert(picked.end(), x.begin() + r * n, x.begin() + (r + 1) * n);
  for (ActFormat f : {ActFormat::Q8_0, ActFormat::Q8_K}) {
    ActRows src, gathered, want;
    src.prepare(f == ActFormat::Q8_0 ? ActFormat::Q8_K : ActFormat::Q8_0, x.data(), 7, n, pool);  // the other format first
    src.prepare(f, x.data(), 7, n, pool);
    gathered.prepare(ActFormat::Q8_0, x.data(), 2, n, pool);
    gathered.gather(src, pick);
    want.prepare(f, picked.data(), (int)pick.size(), n, pool);
    ASSERT_EQ(gathered.n_rows(), want.n_rows());
    ASSERT_EQ(gathered.format(), want.format());
    EXPECT_EQ(std::memcmp(gathered.row(0), want.row(0), want.row_stride() * pick.size()), 0);
    const PackedActs g = gathered.packed(), w = want.packed();
    ASSERT_EQ(g.blocks_per_row, w.blocks_per_row);
    const size_t nb = w.blocks_per_row * pick.size();
    if (f == ActFormat::Q8_0) {
      EXPECT_EQ(std::memcmp(g.scales, w.scales, nb * sizeof(float)), 0);
      EXPECT_EQ(std::memcmp(g.sums, w.sums, nb * sizeof(int32_t)), 0);
    } else {
      EXPECT_EQ(std::memcmp(g.k_sums, w.k_sums, nb * sizeof(KSums)), 0);
    }
  }
}

TEST(PackedWeights, OnlyMatricesOfPackedTypesAreAdded) {
  ThreadPool pool(1);
  const Matrix k = random_matrix(DType::Q3_K, 16, 256, 1);
  PackedWeights packed;
  EXPECT_FALSE(packed.add(k.weight(), pool));
  EXPECT_EQ(packed.find(k.weight()), nullptr);
  Matrix stacked = random_matrix(DType::Q8_0, 32, 64, 2);  // as if 2 experts of 16 rows
  stacked.info.ne = {64, 16, 2, 1};
  EXPECT_FALSE(packed.add(stacked.weight(), pool));
  const Matrix q = random_matrix(DType::Q8_0, 16, 64, 3);
  EXPECT_EQ(packed.add(q.weight(), pool), packed_tile_fn(DType::Q8_0) != nullptr && repack_enabled());
  EXPECT_EQ(packed.bytes(), packed.find(q.weight()) ? packed_group_bytes(DType::Q8_0, 64) : 0u);
}

}  // namespace
}  // namespace roofline::cpu
