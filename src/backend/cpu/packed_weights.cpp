// Repacking GGUF matrices into 16-row interleaved groups (layout in packed_weights.h), and the table of
// a backend's packed copies.
#include "backend/cpu/packed_weights.h"

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <tuple>
#include <utility>

#include "core/error.h"
#include "core/fp16.h"
#include "formats/quant_blocks.h"

namespace roofline::cpu {

size_t packed_entry_bytes(DType type) {
  switch (type) {
    case DType::Q4_0: return 2 * kPackRows + 4 * 64;
    case DType::Q8_0: return 2 * kPackRows + 8 * 64;
    case DType::Q4_K: return 4 * kPackRows + kKScaleBytes * kPackRows + 32 * 64;
    case DType::Q5_K: return 4 * kPackRows + kKScaleBytes * kPackRows + (8 + 32) * 64;
    case DType::Q6_K: return 2 * kPackRows + 16 * kPackRows + (32 + 16) * 64;
    default: return 0;
  }
}

static_assert(offsetof(BlockQ5_K, d) == offsetof(BlockQ4_K, d) && offsetof(BlockQ5_K, dmin) == offsetof(BlockQ4_K, dmin) &&
              offsetof(BlockQ5_K, scales) == offsetof(BlockQ4_K, scales));

namespace {
// Row-interleaved 4-byte chunks: chunk j of `levels` gets bytes 4j .. 4j + 3 of `src` for row i (xor x).
void put_chunks(uint8_t* levels, int i, const uint8_t* src, int chunks, uint8_t x) {
  for (int j = 0; j < chunks; ++j)
    for (int t = 0; t < 4; ++t) levels[64 * j + 4 * i + t] = (uint8_t)(src[4 * j + t] ^ x);
}
}  // namespace

void pack_groups(DType type, const uint8_t* src, int64_t rows, int64_t n, int64_t g0, int64_t g1, uint8_t* dst) {
  const size_t entry = packed_entry_bytes(type);
  const int64_t block = dtype_block_size(type);
  ROOFLINE_CHECK(entry > 0 && n % block == 0);
  const int64_t nb = n / block;
  const size_t row_bytes = dtype_row_bytes(type, n), block_bytes = row_bytes / (size_t)nb;
  for (int64_t g = g0; g < g1; ++g) {
    uint8_t* group = dst + (size_t)g * packed_group_bytes(type, n);
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* e = group + (size_t)b * entry;
      auto* d = reinterpret_cast<uint16_t*>(e);  // entries are 2-byte aligned (sizes are even)
      for (int i = 0; i < kPackRows; ++i) {
        const int64_t r = g * kPackRows + i;
        // A padding row: zero scales (and zero levels, though any would do).
        static const uint8_t kZeroBlock[sizeof(BlockQ6_K)] = {};  // the largest block packed
        const uint8_t* blk = r < rows ? src + (size_t)r * row_bytes + (size_t)b * block_bytes : kZeroBlock;
        switch (type) {
          case DType::Q4_0: {
            const auto& q = *reinterpret_cast<const BlockQ4_0*>(blk);
            std::memcpy(&d[i], &q.d, 2);
            put_chunks(e + 2 * kPackRows, i, q.qs, 4, 0);
            break;
          }
          case DType::Q8_0: {
            const auto& q = *reinterpret_cast<const BlockQ8_0*>(blk);
            std::memcpy(&d[i], &q.d, 2);
            put_chunks(e + 2 * kPackRows, i, reinterpret_cast<const uint8_t*>(q.qs), 8, 0x80);
            break;
          }
          case DType::Q4_K:
          case DType::Q5_K: {  // Q5_K: Q4_K's header, then qh before qs
            const auto& h = *reinterpret_cast<const BlockQ4_K*>(blk);
            std::memcpy(&d[i], &h.d, 2);
            std::memcpy(&d[kPackRows + i], &h.dmin, 2);
            for (int k = 0; k < kKScaleBytes; ++k) e[4 * kPackRows + kPackRows * k + i] = h.scales[k];
            uint8_t* levels = e + (4 + kKScaleBytes) * kPackRows;
            const uint8_t* qs = h.qs;
            if (type == DType::Q5_K) {
              const auto& q5 = *reinterpret_cast<const BlockQ5_K*>(blk);
              put_chunks(levels, i, q5.qh, 8, 0);
              levels += 8 * 64;
              qs = q5.qs;
            }
            put_chunks(levels, i, qs, 32, 0);
            break;
          }
          case DType::Q6_K: {
            const auto& q = *reinterpret_cast<const BlockQ6_K*>(blk);
            std::memcpy(&d[i], &q.d, 2);
            for (int k = 0; k < 16; ++k) e[2 * kPackRows + kPackRows * k + i] = (uint8_t)q.scales[k];
            uint8_t* levels = e + 18 * kPackRows;
            for (int h = 0; h < 2; ++h)
              for (int v = 0; v < 2; ++v)
                for (int t = 0; t < 4; ++t) {
                  const int u = 4 * v + t;
                  put_chunks(levels + 64 * q6_packed_chunk(h, v, 0, t), i, q.ql + 4 * (16 * h + u), 1, 0);
                  put_chunks(levels + 64 * q6_packed_chunk(h, v, 1, t), i, q.ql + 4 * (16 * h + 8 + u), 1, 0);
                  put_chunks(levels + 64 * q6_packed_chunk(h, v, 2, t), i, q.qh + 4 * (8 * h + u), 1, 0);
                }
            break;
          }
          default: ROOFLINE_CHECK(false);
        }
      }
    }
  }
}

void q8_0_scales_and_sums(const void* row, int64_t nb, float* scales, int32_t* sums) {
  const auto* blocks = static_cast<const BlockQ8_0*>(row);
  for (int64_t b = 0; b < nb; ++b) {
    scales[b] = fp16_to_f32(blocks[b].d);
    int32_t s = 0;
    for (int i = 0; i < kQK; ++i) s += blocks[b].qs[i];
    sums[b] = s;
  }
}

void q8_k_sums(const void* row, int64_t nb, KSums* sums) {
  const auto* blocks = static_cast<const BlockQ8_K*>(row);
  for (int64_t b = 0; b < nb; ++b) {
    for (int k = 0; k < 8; ++k)  // |sum| <= 32 * 127: fits int16
      sums[b].sub[k] = (int16_t)(blocks[b].bsums[2 * k] + blocks[b].bsums[2 * k + 1]);
    for (int k = 0; k < 16; ++k) sums[b].minus32[k] = -32 * (int32_t)blocks[b].bsums[k];
  }
}

size_t act_tiles_bytes(int n_rows, int64_t n) { return (size_t)((n_rows + 15) / 16 * 16) * (size_t)((n + 63) / 64 * 64); }

void build_act_tiles(ActFormat format, const uint8_t* rows, size_t row_stride, int n_rows, int64_t n, uint8_t* dst) {
  ROOFLINE_CHECK((format == ActFormat::Q8_0 || format == ActFormat::Q8_K) && n % kQK == 0);
  const int64_t chunks = n / kQK, pairs = (chunks + 1) / 2;
  std::memset(dst, 0, act_tiles_bytes(n_rows, n));
  for (int r = 0; r < n_rows; ++r) {
    const uint8_t* row = rows + (size_t)r * row_stride;
    uint8_t* tile = dst + (size_t)(r / 16) * (size_t)pairs * 1024 + 64 * (size_t)(r % 16);
    for (int64_t j = 0; j < chunks; ++j) {
      const uint8_t* levels = format == ActFormat::Q8_0
                                  ? row + (size_t)j * sizeof(BlockQ8_0) + offsetof(BlockQ8_0, qs)
                                  : row + (size_t)(j / 8) * sizeof(BlockQ8_K) + offsetof(BlockQ8_K, qs) + 32 * (size_t)(j % 8);
      std::memcpy(tile + (size_t)(j / 2) * 1024 + 32 * (size_t)(j % 2), levels, 32);
    }
  }
}

PackedTileFn packed_tile_fn_at(CpuIsa level, DType type) {
  ROOFLINE_CHECK(level <= cpu_isa_detected());
  if (level >= CpuIsa::Avx512) return detail::avx512_packed_tile(type);
  if (level >= CpuIsa::Avx2) return detail::avx2_packed_tile(type);
  return nullptr;
}

PackedTileFn packed_tile_fn(DType type) { return packed_tile_fn_at(cpu_isa(), type); }

PackedMatrix::PackedMatrix(const Weight& w, ThreadPool& pool, PackedTileFn tile) : tile_(tile) {
  ROOFLINE_CHECK(tile_ != nullptr);
  if (tile_ == detail::avx512_packed_tile(w.type())) prompt_tile_ = detail::amx_packed_tile(w.type());
  if (!w.data()) fail("tensor {} has no data (a layout-only model cannot run)", w.tensor->name);
  const int64_t rows = w.rows(), n = w.cols();
  const int64_t groups = (rows + kPackRows - 1) / kPackRows;
  group_bytes_ = packed_group_bytes(w.type(), n);
  data_ = HugePageBuffer(group_bytes_ * (size_t)groups);
  // Tasks of 16 groups (256 rows): long sequential reads of the source.
  constexpr int64_t kGroupsPerTask = 16;
  const int64_t tasks = (groups + kGroupsPerTask - 1) / kGroupsPerTask;
  pool.parallel_for((size_t)tasks, [&](size_t t) {
    const int64_t g0 = (int64_t)t * kGroupsPerTask, g1 = std::min(groups, g0 + kGroupsPerTask);
    pack_groups(w.type(), w.data(), rows, n, g0, g1, data_.data());
  });
}

bool repack_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("ROOFLINE_CPU_REPACK");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  return on;
}

bool prompt_kernels_enabled() { return repack_enabled() && cpu_isa() >= CpuIsa::Avx512 && detail::amx_supported(); }

namespace {
// Every packed copy alive in the process, by tensor and kernel (the key's tensor outlives the copy: the
// backends holding a copy hold its model).
struct SharedPacks {
  std::mutex mutex;
  std::map<std::pair<const gguf::TensorInfo*, PackedTileFn>, std::weak_ptr<const PackedMatrix>> copies;
  size_t sweep_at = 1024;  // expired entries are dropped when the map reaches this size (then twice the live ones)
};
SharedPacks& shared_packs() {
  static SharedPacks s;
  return s;
}
}  // namespace

bool PackedWeights::add(const Weight& w, ThreadPool& pool) {
  if (!repack_enabled()) return false;
  // Matrices only (stacked expert tensors are multiplied through per-expert views, in place).
  const PackedTileFn tile = w ? packed_tile_fn(w.type()) : nullptr;
  if (!w || tile == nullptr || w.cols() % dtype_block_size(w.type()) != 0 || w.tensor->n_rows() != w.rows()) return false;
  if (packed_.count(w.tensor)) return true;
  SharedPacks& shared = shared_packs();
  const auto key = std::make_pair(w.tensor, tile);
  {
    std::lock_guard<std::mutex> lock(shared.mutex);
    if (std::shared_ptr<const PackedMatrix> copy = shared.copies[key].lock()) {
      packed_.emplace(w.tensor, std::move(copy));
      return true;
    }
  }
  auto copy = std::make_shared<const PackedMatrix>(w, pool, tile);  // outside the lock: packing takes a while
  std::lock_guard<std::mutex> lock(shared.mutex);
  std::weak_ptr<const PackedMatrix>& slot = shared.copies[key];
  if (std::shared_ptr<const PackedMatrix> other = slot.lock()) copy = std::move(other);  // packed meanwhile elsewhere
  else slot = copy;
  if (shared.copies.size() >= shared.sweep_at) {
    for (auto it = shared.copies.begin(); it != shared.copies.end();) it = it->second.expired() ? shared.copies.erase(it) : std::next(it);
    shared.sweep_at = std::max<size_t>(1024, 2 * shared.copies.size());
  }
  packed_.emplace(w.tensor, std::move(copy));
  return true;
}

const PackedMatrix* PackedWeights::find(const Weight& w) const {
  if (packed_.empty()) return nullptr;
  const auto it = packed_.find(w.tensor);
  return it == packed_.end() ? nullptr : it->second.get();
}

uint64_t PackedWeights::bytes() const {
  uint64_t n = 0;
  for (const auto& [t, m] : packed_) n += m->bytes();
  return n;
}

}  // namespace roofline::cpu
