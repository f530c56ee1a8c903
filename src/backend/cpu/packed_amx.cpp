// AMX-INT8 kernels for prompt products over the packed weights of packed_weights.h (Q4_0, Q8_0, Q4_K, Q5_K,
// Q6_K): the same outputs, bit for bit, as the AVX-512 VNNI kernels of packed_avx512.cpp, for products with
// many activation rows.
//
// A packed chunk (64 bytes: 4 consecutive levels of each of 16 weight rows) is one row of an AMX B tile in
// its "VNNI" layout, so the chunks of a block are a B tile of 16 weight rows x 32 levels (8 tile rows; Q6_K's
// sub-blocks of 16: 4 tile rows). The A tile is 16 activation rows of 32 (16) signed levels, read straight
// from their Q8_0 / Q8_K blocks with the row stride. One tdpbsud (signed activations x unsigned weight levels)
// gives the exact int32 sums of a (sub-)block for 16 x 16 outputs, which the VNNI kernel gets from 8 vpdpbusd
// per activation row. The float steps that follow are the VNNI kernel's, per output and in its order (level
// offset added as an integer, one conversion, the same scale products and FMAs), so both paths give the same
// bits and batch invariance holds across them: decode (VNNI) and a prompt (AMX) compute a row identically.
//
// Q8_0's chunks are used in place. The other types' levels are unpacked once per group of 16 weight rows
// into a thread's buffer of B tiles (nibbles split, Q5_K's fifth bit and Q6_K's high bits joined, exactly as
// the VNNI kernel forms them in registers) with their per-sub-block float scales; every activation row of
// the call then passes over that group, 16 rows per tile.
//
// The process asks Linux for the AMX tile state once (arch_prctl). Where that fails, the CPU lacks AMX-INT8,
// ROOFLINE_CPU_AMX=0 is set, or the kernel level is capped below AVX-512, amx_packed_tile returns nullptr.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include "backend/cpu/packed_weights.h"
#include "formats/quant_blocks.h"

#if defined(__x86_64__) && defined(__GNUC__) && defined(__linux__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <immintrin.h>

#if defined(__clang__)
#pragma clang attribute push(                                                                                     \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c,amx-tile,amx-int8"))), \
    apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c,amx-tile,amx-int8")
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include "backend/cpu/packed_kernel_common.h"

namespace roofline::cpu {
namespace {

constexpr int kTileRows = 16;  // activation rows per A tile (and C tile)

// The tile registers: C in tmm0, A in tmm2, B in tmm4.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Loads the configuration for `rows` activation rows and products over k levels (C in tmm0 and tmm1, A in
// tmm2 and tmm3, B in tmm4 and tmm5), unless it is loaded.
struct Tiles {
  int rows = 0, k = 0;
  void configure(int r, int kk) {
    if (r == rows && kk == k) return;
    TileConfig c;
    for (int t : {0, 1}) {
      c.rows[t] = (uint8_t)r;
      c.colsb[t] = 64;
    }
    for (int t : {2, 3}) {
      c.rows[t] = (uint8_t)r;
      c.colsb[t] = (uint16_t)kk;
    }
    for (int t : {4, 5}) {
      c.rows[t] = (uint8_t)(kk / 4);
      c.colsb[t] = 64;
    }
    _tile_loadconfig(&c);
    rows = r;
    k = kk;
  }
  ~Tiles() {
    if (rows) _tile_release();
  }
};

// out[16 x 16] = A (rows at a, stride a_stride) x B (the 64-byte tile rows at b): exact int32 sums, with B's
// levels signed (kSigned: tdpbssd) or unsigned (tdpbsud).
template <bool kSigned>
inline void tile_product(const void* a, size_t a_stride, const void* b, int32_t* out) {
  _tile_loadd(2, a, a_stride);
  _tile_loadd(4, b, 64);
  _tile_zero(0);
  if constexpr (kSigned) _tile_dpbssd(0, 2, 4);
  else _tile_dpbsud(0, 2, 4);
  _tile_stored(0, out, 64);
}

enum class Kind { Q4_0, Q8_0, Q4_K, Q5_K, Q6_K };

constexpr int block_of(Kind K) { return K == Kind::Q4_0 || K == Kind::Q8_0 ? kQK : kQKK; }
constexpr size_t packed_entry_bytes_of(Kind K) {  // packed_entry_bytes (packed_weights.cpp) as a constant
  switch (K) {
    case Kind::Q4_0: return 2 * kPackRows + 4 * 64;
    case Kind::Q8_0: return 2 * kPackRows + 8 * 64;
    case Kind::Q4_K: return 4 * kPackRows + kKScaleBytes * kPackRows + 32 * 64;
    case Kind::Q5_K: return 4 * kPackRows + kKScaleBytes * kPackRows + (8 + 32) * 64;
    default: return 2 * kPackRows + 16 * kPackRows + (32 + 16) * 64;
  }
}

// Per super-block float data of an unpacked K-quant group.
struct KScales {
  __m512 dsc[16];     // Q6_K: d x the sub-block scale, per row
  __m512 d, dmin;     // Q4_K / Q5_K
  __m512i mpair[4];   // Q4_K / Q5_K: the mins of sub-blocks 2p and 2p + 1 as int16 pairs
};

// A thread's unpacked group: B tiles (64-byte rows) and super-block scales, in 64-byte aligned storage (the
// kernels use aligned vector loads and stores on both).
class GroupBuffer {
 public:
  GroupBuffer() = default;
  GroupBuffer(const GroupBuffer&) = delete;
  GroupBuffer& operator=(const GroupBuffer&) = delete;
  ~GroupBuffer() { std::free(data_); }
  // Room for `tile_rows` B tile rows and `scales` KScales.
  void reserve(size_t tile_rows, size_t scales) {
    const size_t bytes = tile_rows * 64 + scales * sizeof(KScales);
    if (bytes > bytes_) {
      std::free(data_);
      data_ = std::aligned_alloc(64, bytes);
      if (!data_) throw std::bad_alloc();
      bytes_ = bytes;
    }
    tiles_ = static_cast<__m512i*>(data_);
    scales_ = reinterpret_cast<KScales*>(static_cast<uint8_t*>(data_) + tile_rows * 64);
  }
  __m512i* tiles() const { return tiles_; }
  KScales* scales() const { return scales_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  __m512i* tiles_ = nullptr;
  KScales* scales_ = nullptr;
};

GroupBuffer& group_buffer() {
  thread_local GroupBuffer buf;
  return buf;
}

// The B tiles of a Q4_0 or Q8_0 group as signed levels (level - 8, level - 128: the offset the VNNI kernel takes
// out through the activation sums, so the int32 sums are the same): block b at tile row 8b; Q4_0's rows
// 0..3 from the low nibbles of chunks 0..3, rows 4..7 from their high nibbles (the VNNI kernel's w[0..7]).
template <bool Q4>
void unpack_q_0(const uint8_t* group, int64_t nb, __m512i* t) {
  constexpr size_t kEntry = packed_entry_bytes_of(Q4 ? Kind::Q4_0 : Kind::Q8_0);
  const __m512i low4 = _mm512_set1_epi8(0x0F), eight = _mm512_set1_epi8(8), top = _mm512_set1_epi8((char)0x80);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* lv = group + (size_t)b * kEntry + 2 * kPackRows;
    for (int k = 0; k < (Q4 ? 4 : 8); ++k) {
      const __m512i v = _mm512_loadu_si512(lv + 64 * k);
      if constexpr (Q4) {
        t[8 * b + k] = _mm512_sub_epi8(_mm512_and_si512(v, low4), eight);
        t[8 * b + k + 4] = _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16(v, 4), low4), eight);
      } else {
        t[8 * b + k] = _mm512_xor_si512(v, top);
      }
    }
  }
}

// Bytes w (each <= 31) times s (each <= 7; the 32-bit lane of weight row i holds its s in both 16-bit halves).
inline __m512i scale_levels(__m512i w, __m512i s) {
  const __m512i even = _mm512_mullo_epi16(_mm512_and_si512(w, _mm512_set1_epi16(0x00FF)), s);
  const __m512i odd = _mm512_mullo_epi16(_mm512_srli_epi16(w, 8), s);
  return _mm512_or_si512(even, _mm512_slli_epi16(odd, 8));
}

// Q4_K / Q5_K with the sub-block scales inside the tiles: each 6-bit scale splits as 8 hi + lo (both 0..7), and
// the B tiles hold level x lo and level x hi (at most 31 x 7 = 217: unsigned bytes). Pair p of super-block b
// (sub-blocks 2p and 2p + 1, 64 levels: tile rows 0..7 from sub-block 2p, 8..15 from 2p + 1, each the VNNI
// kernel's w[t]) is 16 tile rows at 128b + 32p (lo), then 16 at 128b + 32p + 16 (hi). One pass over the four
// pairs accumulates sum_k lo_k s_k and sum_k hi_k s_k in two C tiles: their sum lo + 8 hi is the VNNI
// kernel's exact integer sum over sub-blocks of scale x level sum.
template <bool kFive>
void unpack_q4_k(const uint8_t* group, int64_t nb, __m512i* t, KScales* ks) {
  constexpr size_t kScales = 4 * kPackRows, kHigh = kScales + kKScaleBytes * kPackRows;
  constexpr size_t kLevels = kHigh + (kFive ? 8 * 64 : 0);
  constexpr size_t kEntry = kLevels + 32 * 64;
  const __m512i bit4 = _mm512_set1_epi8(0x10), low4 = _mm512_set1_epi8(0x0F);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* e = group + (size_t)b * kEntry;
    ks[b].d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(e)));
    ks[b].dmin = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(e + 2 * kPackRows)));
    __m128i sc[8], mn[8];
    decode_k4_scales(e + kScales, sc, mn);
    for (int p = 0; p < 4; ++p)
      ks[b].mpair[p] = _mm512_cvtepu8_epi16(
          _mm256_set_m128i(_mm_unpackhi_epi8(mn[2 * p], mn[2 * p + 1]), _mm_unpacklo_epi8(mn[2 * p], mn[2 * p + 1])));
    const uint8_t* lv = e + kLevels;
    for (int k = 0; k < 8; ++k) {
      const __m512i s32 = _mm512_cvtepu8_epi32(sc[k]);
      const __m512i lo = _mm512_and_si512(s32, _mm512_set1_epi32(7)), hi = _mm512_srli_epi32(s32, 3);
      const __m512i lo16 = _mm512_or_si512(lo, _mm512_slli_epi32(lo, 16)), hi16 = _mm512_or_si512(hi, _mm512_slli_epi32(hi, 16));
      __m512i* w = t + 128 * b + 32 * (k / 2) + 8 * (k % 2);
      for (int r = 0; r < 8; ++r) {
        const __m512i v = _mm512_loadu_si512(lv + 64 * (8 * (k / 2) + r));
        __m512i levels = _mm512_and_si512(k % 2 ? _mm512_srli_epi16(v, 4) : v, low4);
        if constexpr (kFive) {
          const __m512i h = _mm512_loadu_si512(e + kHigh + 64 * r);
          const __m512i moved = k < 4 ? _mm512_slli_epi16(h, 4 - k) : _mm512_srli_epi16(h, k - 4);
          levels = _mm512_or_si512(levels, _mm512_and_si512(moved, bit4));
        }
        w[r] = scale_levels(levels, lo16);
        w[16 + r] = scale_levels(levels, hi16);
      }
    }
  }
}

// Q6_K: sub-block sb of super-block b at tile row 4 (16b + sb), its rows t the 6-bit levels of quarter g of
// chunk triple (h, v, t) minus 32, signed (the VNNI kernel's w[g][t], whose offset it takes out through the
// activation sums), sb = 8h + 2g + v.
void unpack_q6_k(const uint8_t* group, int64_t nb, __m512i* t, KScales* ks) {
  constexpr size_t kScales = 2 * kPackRows, kLevels = kScales + 16 * kPackRows;
  constexpr size_t kEntry = kLevels + (32 + 16) * 64;
  const __m512i low4 = _mm512_set1_epi8(0x0F), bits45 = _mm512_set1_epi8(0x30), k32 = _mm512_set1_epi8(32);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* e = group + (size_t)b * kEntry;
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(e)));
    for (int sb = 0; sb < 16; ++sb)
      ks[b].dsc[sb] = _mm512_mul_ps(
          d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(e + kScales + 16 * sb)))));
    const uint8_t* lv = e + kLevels;
    for (int h = 0; h < 2; ++h)
      for (int v = 0; v < 2; ++v)
        for (int r = 0; r < 4; ++r) {
          const __m512i a = _mm512_loadu_si512(lv + 64 * q6_packed_chunk(h, v, 0, r));
          const __m512i bb = _mm512_loadu_si512(lv + 64 * q6_packed_chunk(h, v, 1, r));
          const __m512i c = _mm512_loadu_si512(lv + 64 * q6_packed_chunk(h, v, 2, r));
          __m512i* w = t + 4 * (16 * b + 8 * h + v);  // sub-block 8h + v; quarter g adds 2g sub-blocks
          w[r] = _mm512_or_si512(_mm512_and_si512(a, low4), _mm512_and_si512(_mm512_slli_epi16(c, 4), bits45));
          w[8 + r] = _mm512_or_si512(_mm512_and_si512(bb, low4), _mm512_and_si512(_mm512_slli_epi16(c, 2), bits45));
          w[16 + r] =
              _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(a, 4), low4), _mm512_and_si512(c, bits45));
          w[24 + r] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(bb, 4), low4),
                                      _mm512_and_si512(_mm512_srli_epi16(c, 2), bits45));
          for (int g = 0; g < 4; ++g) w[8 * g + r] = _mm512_sub_epi8(w[8 * g + r], k32);  // signed: level - 32
        }
  }
}

// The activation rows of one tile. Row m of the tile is activation row c0 + row(m): rows past the last are
// computed from a copy of it (or from the zero padding of the tile-order copy) and never stored. Its A tiles
// come from the tile-order copy (build_act_tiles: a 64-byte line per row and pair of chunks) when there is one
// and the tile starts on one of its tiles, else from the rows themselves (strided, with line splits).
struct TileRows {
  const uint8_t* base;  // the copy's tile, or row c0's first block
  size_t stride;
  int rows;
  bool from_copy;
  bool block32;  // Q8_0 rows (else Q8_K)
  TileRows(const PackedActs& a, int c0, int n_a, bool q8_0)
      : rows(n_a < kTileRows ? n_a : kTileRows), from_copy(a.tiles && c0 % kTileRows == 0), block32(q8_0) {
    const size_t pairs = (a.blocks_per_row * (q8_0 ? 1 : kQKK / kQK) + 1) / 2;
    base = from_copy ? a.tiles + (size_t)(c0 / kTileRows) * pairs * 1024 : a.rows + (size_t)c0 * a.row_stride;
    stride = from_copy ? 64 : a.row_stride;
  }
  int row(int m) const { return m < rows ? m : rows - 1; }
  int tile_rows() const { return from_copy ? kTileRows : rows; }
  // The first level of chunk j (levels 32j .. 32j + 31) of the tile's first row.
  const uint8_t* chunk(int64_t j) const {
    if (from_copy) return base + (size_t)(j / 2) * 1024 + 32 * (size_t)(j % 2);
    if (block32) return base + (size_t)j * sizeof(BlockQ8_0) + offsetof(BlockQ8_0, qs);
    return base + (size_t)(j / 8) * sizeof(BlockQ8_K) + offsetof(BlockQ8_K, qs) + 32 * (size_t)(j % 8);
  }
};

// Q4_0 / Q8_0: 16 weight rows x the tile's activation rows over blocks [b0, b1) (unpacked: block b0's B tile),
// added to acc.
template <bool Q4>
void tile_q_0(const uint8_t* group, const __m512i* unpacked, int64_t b0, int64_t b1, const PackedActs& a, int c0,
              const TileRows& tr, __m512* acc) {
  constexpr size_t kEntry = packed_entry_bytes_of(Q4 ? Kind::Q4_0 : Kind::Q8_0);
  alignas(64) int32_t c[2][kTileRows * 16];
  const float* d[kTileRows];
  for (int m = 0; m < kTileRows; ++m) d[m] = a.scales + (size_t)(c0 + tr.row(m)) * a.blocks_per_row;
  const auto b_tile = [&](int64_t b) { return unpacked + 8 * (b - b0); };  // block b's B tile
  const auto step = [&](int64_t b, const int32_t* sums) {  // block b's float steps, as the VNNI kernel's
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(group + (size_t)b * kEntry)));
    for (int m = 0; m < kTileRows; ++m) {
      const __m512 scale = _mm512_mul_ps(dw, _mm512_set1_ps(d[m][b]));
      acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(sums + 16 * m)), scale, acc[m]);
    }
  };
  int64_t b = b0;
  for (; b + 1 < b1; b += 2) {  // two blocks' tile products in flight (tmm0 and tmm1), then their steps in order
    _tile_loadd(2, tr.chunk(b), tr.stride);
    _tile_loadd(4, b_tile(b), 64);
    _tile_zero(0);
    _tile_dpbssd(0, 2, 4);
    _tile_loadd(3, tr.chunk(b + 1), tr.stride);
    _tile_loadd(5, b_tile(b + 1), 64);
    _tile_zero(1);
    _tile_dpbssd(1, 3, 5);
    _tile_stored(0, c[0], 64);
    _tile_stored(1, c[1], 64);
    step(b, c[0]);
    step(b + 1, c[1]);
  }
  if (b < b1) {
    tile_product<true>(tr.chunk(b), tr.stride, b_tile(b), c[0]);
    step(b, c[0]);
  }
}

// Q4_K / Q5_K: the same for super-blocks, from the unpacked pairs (unpack_q4_k): 8 tile products of 64 levels
// per super-block into two C tiles, then the VNNI kernel's float steps per output.
void tile_q4_k(const __m512i* unpacked, const KScales* ks, int64_t b0, int64_t b1, const PackedActs& a, int c0,
               const TileRows& tr, __m512* acc) {
  alignas(64) int32_t lo[kTileRows * 16], hi[kTileRows * 16];
  const BlockQ8_K* q[kTileRows];
  const KSums* sums[kTileRows];
  for (int m = 0; m < kTileRows; ++m) {
    q[m] = reinterpret_cast<const BlockQ8_K*>(a.rows + (size_t)(c0 + tr.row(m)) * a.row_stride);
    sums[m] = a.k_sums + (size_t)(c0 + tr.row(m)) * a.blocks_per_row;
  }
  for (int64_t b = b0; b < b1; ++b) {
    const __m512i* w = unpacked + 128 * (b - b0);  // super-block b's B tiles and scales (the run starts at b0)
    const KScales& k = ks[b - b0];
    _tile_zero(0);
    _tile_zero(1);
    for (int p = 0; p < 4; ++p) {
      _tile_loadd(2, tr.chunk(8 * b + 2 * p), tr.stride);
      _tile_loadd(4, w + 32 * p, 64);
      _tile_loadd(5, w + 32 * p + 16, 64);
      _tile_dpbsud(0, 2, 4);
      _tile_dpbsud(1, 2, 5);
    }
    _tile_stored(0, lo, 64);
    _tile_stored(1, hi, 64);
    for (int m = 0; m < kTileRows; ++m) {
      const __m512i isum = _mm512_add_epi32(_mm512_load_si512(lo + 16 * m), _mm512_slli_epi32(_mm512_load_si512(hi + 16 * m), 3));
      const int16_t* ss = sums[m][b].sub;
      __m512i mins = _mm512_setzero_si512();
      for (int p = 0; p < 4; ++p) mins = _mm512_dpwssd_epi32(mins, k.mpair[p], _mm512_set1_epi32(load32(ss + 2 * p)));
      const __m512 da = _mm512_set1_ps(q[m][b].d);
      acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(k.d, da), acc[m]);
      acc[m] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(mins), _mm512_mul_ps(k.dmin, da), acc[m]);
    }
  }
}

// Q6_K: per sub-block of 16 (the VNNI kernel's order: over h, v, then quarter g), a tile product and a float
// step per output, as that kernel does.
void tile_q6_k(const __m512i* unpacked, const KScales* ks, int64_t b0, int64_t b1, const PackedActs& a, int c0,
               const TileRows& tr, __m512* acc) {
  alignas(64) int32_t c[kTileRows * 16];
  const BlockQ8_K* q[kTileRows];
  for (int m = 0; m < kTileRows; ++m) q[m] = reinterpret_cast<const BlockQ8_K*>(a.rows + (size_t)(c0 + tr.row(m)) * a.row_stride);
  for (int64_t b = b0; b < b1; ++b) {
    const __m512i* w = unpacked + 64 * (b - b0);  // super-block b's B tiles and scales (the run starts at b0)
    const KScales& k = ks[b - b0];
    __m512 sub_acc[kTileRows];
    for (int m = 0; m < kTileRows; ++m) sub_acc[m] = _mm512_setzero_ps();
    for (int i = 0; i < 16; ++i) {
      const int sb = 8 * (i / 8) + 2 * (i % 4) + (i / 4) % 2;
      tile_product<true>(tr.chunk(8 * b + sb / 2) + 16 * (sb % 2), tr.stride, w + 4 * sb, c);
      const __m512 dsc = k.dsc[sb];
      for (int m = 0; m < kTileRows; ++m)
        sub_acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(c + 16 * m)), dsc, sub_acc[m]);
    }
    for (int m = 0; m < kTileRows; ++m) acc[m] = _mm512_fmadd_ps(sub_acc[m], _mm512_set1_ps(q[m][b].d), acc[m]);
  }
}

template <Kind K>
void amx_tile(const uint8_t* packed, size_t group_bytes, int n_w, const PackedActs& a, int c0, int n_a, int64_t n,
              float* y, size_t ldy) {
  constexpr bool kBlock32 = K == Kind::Q4_0 || K == Kind::Q8_0;
  constexpr size_t kEntry = packed_entry_bytes_of(K);
  // A group's (super-)blocks are taken a run at a time, whose B tiles (about 24 KiB: tile rows per block 8 for
  // Q4_0 / Q8_0, 64 for Q6_K, 128 for Q4_K / Q5_K with their lo and hi parts) stay in the L1 while every
  // activation tile passes over them; the accumulators of the activation tiles wait in memory between runs.
  constexpr int kTileRowsPerBlock = kBlock32 ? 8 : K == Kind::Q6_K ? 64 : 128;
  constexpr int64_t kRun = 384 / kTileRowsPerBlock;
  const int64_t nb = n / block_of(K);
  GroupBuffer& buf = group_buffer();
  buf.reserve((size_t)kRun * kTileRowsPerBlock, kBlock32 ? 0 : (size_t)kRun);
  thread_local std::vector<float> acc_rows;  // 16 outputs per activation row between runs
  acc_rows.resize((size_t)(n_a + kTileRows) * 16);
  Tiles tiles;
  for (int g = 0; g * kPackRows < n_w; ++g) {
    const int rows = n_w - g * kPackRows < kPackRows ? n_w - g * kPackRows : kPackRows;
    const __mmask16 keep = (__mmask16)((1u << rows) - 1);
    const uint8_t* group = packed + (size_t)g * group_bytes;
    for (int64_t b0 = 0; b0 < nb; b0 += kRun) {
      const int64_t b1 = b0 + kRun < nb ? b0 + kRun : nb;
      const uint8_t* run = group + (size_t)b0 * kEntry;
      if constexpr (kBlock32) unpack_q_0<K == Kind::Q4_0>(run, b1 - b0, buf.tiles());
      if constexpr (K == Kind::Q4_K || K == Kind::Q5_K) unpack_q4_k<K == Kind::Q5_K>(run, b1 - b0, buf.tiles(), buf.scales());
      if constexpr (K == Kind::Q6_K) unpack_q6_k(run, b1 - b0, buf.tiles(), buf.scales());
      for (int ct = 0; ct < n_a; ct += kTileRows) {
        const TileRows tr(a, c0 + ct, n_a - ct, kBlock32);
        tiles.configure(tr.tile_rows(), K == Kind::Q6_K ? 16 : kBlock32 ? 32 : 64);
        float* saved = acc_rows.data() + (size_t)ct * 16;
        __m512 acc[kTileRows];
        for (int m = 0; m < kTileRows; ++m) acc[m] = b0 == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(saved + 16 * m);
        if constexpr (kBlock32) tile_q_0<K == Kind::Q4_0>(group, buf.tiles(), b0, b1, a, c0 + ct, tr, acc);
        else if constexpr (K == Kind::Q6_K) tile_q6_k(buf.tiles(), buf.scales(), b0, b1, a, c0 + ct, tr, acc);
        else tile_q4_k(buf.tiles(), buf.scales(), b0, b1, a, c0 + ct, tr, acc);
        if (b1 < nb) {
          for (int m = 0; m < kTileRows; ++m) _mm512_storeu_ps(saved + 16 * m, acc[m]);
        } else {
          for (int m = 0; m < tr.rows; ++m)
            _mm512_mask_storeu_ps(y + (size_t)(ct + m) * ldy + (size_t)g * kPackRows, keep, acc[m]);
        }
      }
    }
  }
}

// Whether the CPU reports AMX-TILE and AMX-INT8 (CPUID leaf 7: EDX bits 24 and 25) and Linux grants this
// process the tile data state (ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA).
bool amx_granted() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  if (!(edx >> 24 & 1) || !(edx >> 25 & 1)) return false;
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

}  // namespace

namespace detail {
bool amx_supported() {
  static const bool ok = [] {
    const char* v = std::getenv("ROOFLINE_CPU_AMX");
    if (v && std::strcmp(v, "0") == 0) return false;
    return avx512_supported() && amx_granted();
  }();
  return ok;
}

PackedTileFn amx_packed_tile(DType type) {
  if (!amx_supported()) return nullptr;
  switch (type) {
    case DType::Q4_0: return amx_tile<Kind::Q4_0>;
    case DType::Q8_0: return amx_tile<Kind::Q8_0>;
    case DType::Q4_K: return amx_tile<Kind::Q4_K>;
    case DType::Q5_K: return amx_tile<Kind::Q5_K>;
    case DType::Q6_K: return amx_tile<Kind::Q6_K>;
    default: return nullptr;
  }
}
}  // namespace detail
}  // namespace roofline::cpu

#include "backend/cpu/avx512_region_end.h"  // closes this file's region (its begin adds the AMX targets)

#else  // not x86-64 Linux GCC/Clang

namespace roofline::cpu::detail {
bool amx_supported() { return false; }
PackedTileFn amx_packed_tile(DType) { return nullptr; }
}  // namespace roofline::cpu::detail

#endif
