// Weights repacked once at load into the layout the CPU's row-interleaved kernels stream (Q4_0, Q8_0, Q4_K,
// Q5_K and Q6_K, with AVX-512 VNNI or with AVX2). In a GGUF row each block holds one row's values; a prefill product
// then needs scale conversions, multiplies and adds per block, row and activation row. Here 16 weight
// rows are interleaved so that one 512-bit vpdpbusd multiplies 4 values of each of the 16 rows with the
// same 4 activation values: the int32 sums of a (sub-)block land in the 16 lanes of one register, and
// the float work per (sub-)block is one conversion and one FMA for 16 outputs at once.
//
// Layout of a packed matrix of R rows and n columns (nb = n / block blocks per row): groups of 16 rows
// (the last group padded with rows of zero scales), group g at g * nb * entry bytes; in a group, block
// b's entry holds the block of rows 16g .. 16g + 15, with "row-interleaved 4-byte chunks": chunk j is
// 64 bytes, bytes 4j .. 4j + 3 of the block's level bytes for row 0, then row 1, ..., row 15.
//   Q4_0: 16 x f16 d, then chunks 0..3 of qs, unchanged (low nibbles: elements 4j .. 4j + 3, high
//         nibbles: elements 16 + 4j ..; unsigned levels 0..15, value = level - 8). 288 bytes = 16 x 18.
//   Q8_0: 16 x f16 d, then chunks 0..7 of qs as unsigned bytes q + 128 (value = byte - 128).
//         544 bytes = 16 x 34.
//   Q4_K: 16 x f16 d, 16 x f16 dmin, the 12 scale bytes transposed (byte k of row i at 16k + i), then
//         chunks 0..31 of qs (chunk 8p + t: low nibbles are elements 4t .. 4t + 3 of sub-block 2p, high
//         nibbles those of sub-block 2p + 1). 2304 bytes = 16 x 144.
//   Q5_K: as Q4_K, with chunks 0..7 of qh between the scales and the qs chunks. 2816 bytes = 16 x 176.
//   Q6_K: 16 x f16 d, the 16 int8 scales transposed (scale k of row i at 16k + i), then the 48 level
//         chunks in the order decode reads them: for half h and v (0, 1), for t = 0..3, the triple ql
//         chunk 16h + 4v + t, ql chunk 16h + 8 + 4v + t, qh chunk 8h + 4v + t, so one super-block is read
//         front to back. 3360 bytes = 16 x 210.
// So a packed matrix has the bytes of the GGUF tensor (plus the padding rows), and one output is a sum over
// blocks, in order, by FMA: the same operations whatever the number of activation rows (batch invariance
// holds on this path as on the others).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <unordered_map>

#include "backend/cpu/vec_dot.h"
#include "core/huge_page_buffer.h"
#include "core/thread_pool.h"
#include "model/model.h"

namespace roofline::cpu {

constexpr int kPackRows = 16;  // weight rows per interleaved group

// Q6_K: the packed chunk (0..47) holding ql chunk (kind 0: 16h + u, kind 1: 16h + 8 + u) or qh chunk (kind 2:
// 8h + u) of half h, u = 4v + t (the layout above).
constexpr int q6_packed_chunk(int h, int v, int kind, int t) { return 12 * (2 * h + v) + 3 * t + kind; }

// Bytes of one block entry of a group (scales and levels of 16 rows), or 0 for a type with no packed layout.
size_t packed_entry_bytes(DType type);
// Bytes of one group of 16 rows for rows of n elements.
inline size_t packed_group_bytes(DType type, int64_t n) {
  return packed_entry_bytes(type) * (size_t)(n / dtype_block_size(type));
}
// Repacks rows [16 * g0, 16 * g1) of a GGUF matrix (rows of n elements, `rows` in all) into the layout
// above, writing groups g0 .. g1 - 1 at dst (the start of the whole packed matrix). Portable code.
void pack_groups(DType type, const uint8_t* src, int64_t rows, int64_t n, int64_t g0, int64_t g1, uint8_t* dst);

// Activation rows as the packed kernels read them (act_format_for of the weight type), with per row and
// block: Q8_0, the scale as a float and the sum of the 32 levels (row c, block b at c * blocks_per_row +
// b); Q8_K, its KSums (at c * blocks_per_row + b).
struct KSums {
  int16_t sub[8];       // the sums of the levels of the 8 sub-blocks of 32 (Q4_K's mins term)
  int32_t minus32[16];  // -32 x the sums of the 16 sub-blocks of 16 (Q6_K's level offset)
};
struct PackedActs {
  const uint8_t* rows = nullptr;
  size_t row_stride = 0;
  const float* scales = nullptr;      // Q8_0
  const int32_t* sums = nullptr;      // Q8_0
  const KSums* k_sums = nullptr;      // Q8_K
  size_t blocks_per_row = 0;
  const uint8_t* tiles = nullptr;     // the levels again in AMX tile order (build_act_tiles), or nullptr
};

// Products of at least this many activation rows take a packed matrix's prompt kernel (AMX) where it has
// one, and their activation rows are also laid out for it (build_act_tiles). On one core of the development
// machine the AMX kernels matched the VNNI ones at 16 rows (the unpacking of each weight group is shared by
// fewer rows) and were 20-30% faster at 32.
constexpr int kPromptKernelRows = 24;
// The levels of n_rows Q8_0 or Q8_K rows (n elements each, at rows with row_stride) in AMX A-tile order:
// per 16 rows (the last 16 padded with zero levels) and pair P of 32-element chunks (levels 64P .. 64P + 63;
// a last odd chunk padded with zeros), 1024 bytes: the pair of each of the 16 rows, 64 bytes after 64 bytes.
// Rows 16t, pair P at dst + (t * ceil(n / 64) + P) * 1024.
size_t act_tiles_bytes(int n_rows, int64_t n);
void build_act_tiles(ActFormat format, const uint8_t* rows, size_t row_stride, int n_rows, int64_t n, uint8_t* dst);
// Scales and level sums of one Q8_0 row of nb blocks (portable; ActRows calls it for every Q8_0 row).
void q8_0_scales_and_sums(const void* row, int64_t nb, float* scales, int32_t* sums);
// The KSums of one Q8_K row of nb super-blocks (from their sums of 16).
void q8_k_sums(const void* row, int64_t nb, KSums* sums);

// y[c * ldy + r] = dot(weight row r, activation row c0 + c) for r < n_w (rows counted from the first row
// of the group at `packed`), c < n_a; rows of n elements.
using PackedTileFn = void (*)(const uint8_t* packed, size_t group_bytes, int n_w, const PackedActs& a, int c0,
                              int n_a, int64_t n, float* y, size_t ldy);
// The packed kernel for a type at cpu_isa() (nullptr: the type is read from its GGUF layout).
PackedTileFn packed_tile_fn(DType type);
// The same at one level (tests): nullptr where that level has no packed kernel for the type.
PackedTileFn packed_tile_fn_at(CpuIsa level, DType type);

// One repacked matrix, in a mapping that starts on a 2 MiB boundary and asks for huge pages
// (core/huge_page_buffer.h): decode streams it once per token.
class PackedMatrix {
 public:
  // Packs w for `tile` (a kernel for w's type: packed_tile_fn or, in tests, packed_tile_fn_at).
  PackedMatrix(const Weight& w, ThreadPool& pool, PackedTileFn tile);
  const uint8_t* data() const { return data_.data(); }
  size_t bytes() const { return data_.size(); }
  size_t group_bytes() const { return group_bytes_; }
  PackedTileFn tile() const { return tile_; }
  // A kernel for products of many activation rows (AMX) that gives the same bits as tile(), or nullptr.
  PackedTileFn prompt_tile() const { return prompt_tile_; }

 private:
  HugePageBuffer data_;
  size_t group_bytes_ = 0;
  PackedTileFn tile_ = nullptr;
  PackedTileFn prompt_tile_ = nullptr;
};

// False when ROOFLINE_CPU_REPACK=0 is set (read once).
bool repack_enabled();
// Whether products of many rows run on the AMX prompt kernels: repacking on, the kernels at AVX-512 (not capped
// by ROOFLINE_CPU_ISA) and detail::amx_supported().
bool prompt_kernels_enabled();

// The packed copies a backend made of its weights, found by tensor. Matrices of other types (or on a CPU
// without the kernels, or with ROOFLINE_CPU_REPACK=0 in the environment, to compare) are not added and
// products read them in place. A tensor that another PackedWeights of the process already holds is not
// packed again: both share that copy (the MTP head's engine and its target's read one output matrix).
class PackedWeights {
 public:
  // Packs w when packed_tile_fn(w.type()) exists (or shares the copy another PackedWeights holds); returns
  // whether w is now held.
  bool add(const Weight& w, ThreadPool& pool);
  const PackedMatrix* find(const Weight& w) const;
  uint64_t bytes() const;
  size_t count() const { return packed_.size(); }
  void clear() { packed_.clear(); }

 private:
  std::unordered_map<const gguf::TensorInfo*, std::shared_ptr<const PackedMatrix>> packed_;
};

namespace detail {
PackedTileFn avx512_packed_tile(DType type);  // nullptr if not compiled in or no kernel for the type
PackedTileFn avx2_packed_tile(DType type);    // the same for the AVX2 kernels (packed_kernels_avx2.cpp)
// AMX-INT8 (packed_amx.cpp): the same bits as avx512_packed_tile's kernel, for many activation rows. amx_supported:
// compiled in, the CPU has AMX-INT8 and AVX-512 VNNI, Linux grants the tile state, ROOFLINE_CPU_AMX is not 0.
bool amx_supported();
PackedTileFn amx_packed_tile(DType type);
// Streams of the AVX-512 one-row decode loops for tests (0: the default, or ROOFLINE_CPU_STREAMS; 1, 2, 4, 8).
extern int decode_streams_for_test;
}

}  // namespace roofline::cpu
