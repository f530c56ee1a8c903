// CPU matrix products: work split over output rows in chunks (long ones for decode), several products
// of one input in one dispatch; each thread streams its weight rows once and applies each to every
// activation row of the batch.
#include "backend/cpu/matmul.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "formats/quant_blocks.h"

namespace roofline::cpu {

namespace {

// Decode ranges are at least this many weight bytes (a few microseconds of one core's stream).
constexpr size_t kDecodeMinTakeBytes = 64 << 10;

// ROOFLINE_CPU_DECODE_SPLIT=tasks splits decode products into the fixed tasks used before the guided ranges
// (for A/B measurements); anything else, or unset, takes the guided ranges.
bool decode_split_guided() {
  static const bool guided = [] {
    const char* v = std::getenv("ROOFLINE_CPU_DECODE_SPLIT");
    return !(v && std::strcmp(v, "tasks") == 0);
  }();
  return guided;
}

}  // namespace

void ActRows::gather(const ActRows& src, std::span<const int> rows) {
  format_ = src.format_;
  row_bytes_ = src.row_bytes_;
  n_rows_ = (int)rows.size();
  data_.resize(row_bytes_ * rows.size());
  const size_t nb = src.block_scales_.empty() ? 0 : src.block_scales_.size() / (size_t)src.n_rows_;
  const size_t nk = src.k_sums_.empty() ? 0 : src.k_sums_.size() / (size_t)src.n_rows_;
  block_scales_.resize(nb * rows.size());
  block_sums_.resize(nb * rows.size());
  k_sums_.resize(nk * rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    const size_t r = (size_t)rows[i];
    ROOFLINE_CHECK(rows[i] >= 0 && rows[i] < src.n_rows_);
    std::memcpy(data_.data() + i * row_bytes_, src.data_.data() + r * row_bytes_, row_bytes_);
    if (nb) {
      std::memcpy(block_scales_.data() + i * nb, src.block_scales_.data() + r * nb, nb * sizeof(float));
      std::memcpy(block_sums_.data() + i * nb, src.block_sums_.data() + r * nb, nb * sizeof(int32_t));
    }
    if (nk) std::memcpy(k_sums_.data() + i * nk, src.k_sums_.data() + r * nk, nk * sizeof(KSums));
  }
  build_tiles(nullptr);
}

void ActRows::build_tiles(ThreadPool* pool) {
  tiles_.clear();
  if ((format_ != ActFormat::Q8_0 && format_ != ActFormat::Q8_K) || n_rows_ < kPromptKernelRows || !prompt_kernels_enabled())
    return;
  const int64_t n = (int64_t)(row_bytes_ / (format_ == ActFormat::Q8_0 ? sizeof(BlockQ8_0) : sizeof(BlockQ8_K))) *
                    (format_ == ActFormat::Q8_0 ? kQK : kQKK);
  tiles_.resize(act_tiles_bytes(n_rows_, n));
  const size_t tile_bytes = act_tiles_bytes(16, n);  // each 16 rows' part of the copy is built alone
  const auto build = [&](size_t t) {
    const int r0 = 16 * (int)t;
    build_act_tiles(format_, data_.data() + (size_t)r0 * row_bytes_, row_bytes_, std::min(16, n_rows_ - r0), n,
                    tiles_.data() + t * tile_bytes);
  };
  const size_t n_tiles = (size_t)(n_rows_ + 15) / 16;
  if (pool) pool->parallel_for(n_tiles, build);
  else for (size_t t = 0; t < n_tiles; ++t) build(t);
}

void ActRows::prepare(ActFormat format, const float* x, int n_rows, int64_t n_cols, ThreadPool& pool) {
  format_ = format;
  n_rows_ = n_rows;
  row_bytes_ = act_row_bytes(format, n_cols);
  data_.resize(row_bytes_ * (size_t)n_rows);
  // Block sums for the packed kernels (packed_weights.h), cheap next to the quantization itself.
  const bool q8_0 = format == ActFormat::Q8_0, q8_k = format == ActFormat::Q8_K;
  const size_t nb = (size_t)n_cols / (q8_k ? kQKK : kQK);
  block_scales_.resize(q8_0 ? nb * (size_t)n_rows : 0);
  block_sums_.resize(q8_0 ? nb * (size_t)n_rows : 0);
  k_sums_.resize(q8_k ? nb * (size_t)n_rows : 0);
  pool.parallel_for((size_t)n_rows, [&](size_t r) {
    uint8_t* row = data_.data() + r * row_bytes_;
    quantize_act_row(format, x + r * (size_t)n_cols, row, n_cols);
    if (q8_0) q8_0_scales_and_sums(row, (int64_t)nb, block_scales_.data() + r * nb, block_sums_.data() + r * nb);
    if (q8_k) q8_k_sums(row, (int64_t)nb, k_sums_.data() + r * nb);
  });
  build_tiles(&pool);
}

PackedActs ActRows::packed() const {
  if (format_ == ActFormat::Q8_K)
    return PackedActs{data_.data(), row_bytes_, nullptr, nullptr, k_sums_.data(), row_bytes_ / sizeof(BlockQ8_K),
                      tiles_.empty() ? nullptr : tiles_.data()};
  ROOFLINE_CHECK(format_ == ActFormat::Q8_0);
  return PackedActs{data_.data(), row_bytes_, block_scales_.data(), block_sums_.data(), nullptr,
                    row_bytes_ / sizeof(BlockQ8_0), tiles_.empty() ? nullptr : tiles_.data()};
}

void matmul_products(std::span<const Product> products, ThreadPool& pool, const PackedWeights* packed) {
  if (products.empty()) return;
  int64_t total_rows = 0;
  int max_act = 0;
  for (const Product& p : products) {
    ROOFLINE_CHECK(p.act->format() == act_format_for(p.w->type()));
    if (!p.w->data()) fail("tensor {} has no data (a layout-only model cannot run)", p.w->tensor->name);
    total_rows += p.w->rows();
    max_act = std::max(max_act, p.act->n_rows());
  }
  thread_local std::vector<const PackedMatrix*> packs;
  packs.assign(products.size(), nullptr);
  for (size_t m = 0; m < products.size(); ++m) packs[m] = packed ? packed->find(*products[m].w) : nullptr;
  const std::vector<const PackedMatrix*>& pk = packs;  // the calling thread's, read by every worker
  constexpr int kActTile = 16;  // activation rows per tile call (kept cache-resident)
  // Rows [r0, r1) of product m (r0 on a 16-row group) against every activation row.
  const auto run_rows = [&](size_t m, int64_t r0, int64_t r1) {
    const Product& p = products[m];
    const Weight& w = *p.w;
    const ActRows& act = *p.act;
    const int n_act = act.n_rows();
    const int64_t n_out = w.rows(), n_in = w.cols();
    if (const PackedMatrix* pm = pk[m]) {
      const PackedActs pa = act.packed();
      const uint8_t* group = pm->data() + (size_t)(r0 / kPackRows) * pm->group_bytes();
      if (n_act >= kPromptKernelRows && pm->prompt_tile() && pa.tiles) {  // AMX: every activation row in one call
        pm->prompt_tile()(group, pm->group_bytes(), (int)(r1 - r0), pa, 0, n_act, n_in, p.y + r0, (size_t)n_out);
        return;
      }
      for (int t0 = 0; t0 < n_act; t0 += kActTile) {
        const int n_a = std::min(kActTile, n_act - t0);
        pm->tile()(group, pm->group_bytes(), (int)(r1 - r0), pa, t0, n_a, n_in, p.y + (size_t)t0 * n_out + r0,
                   (size_t)n_out);
      }
      return;
    }
    const size_t w_row_bytes = dtype_row_bytes(w.type(), n_in);
    const VecDotTileFn tile = vec_dot_tile_fn(w.type());
    for (int t0 = 0; t0 < n_act; t0 += kActTile) {
      const int n_a = std::min(kActTile, n_act - t0);
      tile(w.data() + (size_t)r0 * w_row_bytes, w_row_bytes, (int)(r1 - r0), act.row(t0), act.row_stride(), n_a, n_in,
           p.y + (size_t)t0 * n_out + r0, (size_t)n_out);
    }
  };
  thread_local std::vector<size_t> first;  // product m owns units [first[m], first[m + 1])
  first.assign(products.size() + 1, 0);
  if (max_act <= 4 && decode_split_guided()) {
    // Decode (a few activation rows): memory-bound, every thread streaming weight rows. Units of 16 rows
    // (a packed group) over all the products, taken in guided ranges (ThreadPool::parallel_ranges): long
    // runs of consecutive rows first (the hardware prefetchers lose their stream at every jump), short
    // ones last, so that no thread waits long for the others at the end of the dispatch. Each output is
    // computed by the same code whatever range holds it, so the split does not change a bit.
    size_t bytes = 0;
    for (size_t m = 0; m < products.size(); ++m) {
      const Weight& w = *products[m].w;
      first[m + 1] = first[m] + (size_t)((w.rows() + kPackRows - 1) / kPackRows);
      bytes += dtype_row_bytes(w.type(), w.cols()) * (size_t)w.rows();
    }
    const std::vector<size_t>& f = first;
    const size_t unit_bytes = std::max<size_t>(1, bytes / f.back());
    const size_t min_take = std::max<size_t>(1, kDecodeMinTakeBytes / unit_bytes);
    pool.parallel_ranges(f.back(), min_take, [&](size_t u0, size_t u1) {
      for (size_t m = (size_t)(std::upper_bound(f.begin(), f.end(), u0) - f.begin()) - 1; m < products.size() && f[m] < u1;
           ++m) {
        const int64_t n_out = products[m].w->rows();
        const int64_t r0 = (int64_t)(std::max(u0, f[m]) - f[m]) * kPackRows;
        const int64_t r1 = std::min(n_out, (int64_t)(std::min(u1, f[m + 1]) - f[m]) * kPackRows);
        if (r0 < r1) run_rows(m, r0, r1);
      }
    });
    return;
  }
  // Fixed tasks of output rows. Prefill: 16 rows, whose weights stay in the L2 while every activation tile
  // passes over them; 64 with the AVX-512 tiles, whose 32-element types first convert the tile's
  // activation rows into a panel (built once per task, so over more rows). Decode with
  // ROOFLINE_CPU_DECODE_SPLIT=tasks (the split before the guided ranges): 16-256 rows, at least 8 tasks a
  // thread (256 rather than 16 rows gave qwen3-1.7b Q4_K_M tg32 ~10.5 -> ~12.0 tok/s on the 2-core machine).
  const int64_t prefill_rows = cpu_isa() >= CpuIsa::Avx512 ? 64 : 16;
  const int64_t rows_per_task =
      max_act <= 4 ? std::clamp<int64_t>(total_rows / (8 * (int64_t)pool.size()) / 16 * 16, 16, 256) : prefill_rows;
  ROOFLINE_CHECK(rows_per_task % kPackRows == 0);  // packed tasks start on a 16-row group
  for (size_t m = 0; m < products.size(); ++m)
    first[m + 1] = first[m] + (size_t)((products[m].w->rows() + rows_per_task - 1) / rows_per_task);
  const std::vector<size_t>& ft = first;
  pool.parallel_for(ft.back(), [&](size_t task) {
    const size_t m = (size_t)(std::upper_bound(ft.begin(), ft.end(), task) - ft.begin()) - 1;
    const int64_t r0 = (int64_t)(task - ft[m]) * rows_per_task;
    run_rows(m, r0, std::min(products[m].w->rows(), r0 + rows_per_task));
  });
}

void matmul_multi(std::span<const MatmulOut> outs, const ActRows& act, ThreadPool& pool, const PackedWeights* packed) {
  constexpr size_t kMaxOuts = 4;
  ROOFLINE_CHECK(!outs.empty() && outs.size() <= kMaxOuts);
  Product products[kMaxOuts];
  for (size_t m = 0; m < outs.size(); ++m) products[m] = Product{outs[m].w, &act, outs[m].y};
  matmul_products(std::span<const Product>(products, outs.size()), pool, packed);
}

void matmul(const Weight& w, const ActRows& act, float* y, ThreadPool& pool, const PackedWeights* packed) {
  const MatmulOut out{&w, y};
  matmul_multi(std::span<const MatmulOut>(&out, 1), act, pool, packed);
}

void matmul(const Weight& w, const float* x, int n_rows, float* y, ThreadPool& pool, const PackedWeights* packed) {
  ActRows act;
  act.prepare(act_format_for(w.type()), x, n_rows, w.cols(), pool);
  matmul(w, act, y, pool, packed);
}

double measure_cpu_product_tflops(int n_threads) {
  constexpr int64_t kRows = 2048, kCols = 4096;
  constexpr int kActRows = 64;
  gguf::TensorInfo info;
  info.name = "product_probe.weight";
  info.type = DType::Q4_K;
  info.n_dims = 2;
  info.ne = {kCols, kRows, 1, 1};
  info.n_bytes = dtype_row_bytes(DType::Q4_K, kCols) * (size_t)kRows;
  std::vector<uint8_t> bytes(info.n_bytes, 0);  // zero scales and levels: the kernels' time does not depend on values
  info.data = bytes.data();
  const Weight w{&info};
  ThreadPool pool(n_threads);
  PackedWeights packed;
  packed.add(w, pool);
  std::vector<float> x((size_t)kActRows * kCols);
  for (size_t i = 0; i < x.size(); ++i) x[i] = (float)((i * 2654435761u) % 255) / 127.0f - 1.0f;
  ActRows act;
  act.prepare(act_format_for(DType::Q4_K), x.data(), kActRows, kCols, pool);
  std::vector<float> y((size_t)kActRows * kRows);
  double best = 0;
  for (int pass = 0; pass < 4; ++pass) {
    const auto t0 = std::chrono::steady_clock::now();
    matmul(w, act, y.data(), pool, &packed);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, 2.0 * (double)kRows * kCols * kActRows / s / 1e12);
  }
  return best;
}

}  // namespace roofline::cpu
