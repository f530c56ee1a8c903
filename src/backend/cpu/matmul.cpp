// CPU matrix products: work split over output rows in fixed chunks; each thread streams its
// weight rows once and applies each to every activation row of the batch.
#include "backend/cpu/matmul.h"

#include <algorithm>

#include "core/error.h"

namespace roofline::cpu {

void ActRows::prepare(ActFormat format, const float* x, int n_rows, int64_t n_cols, ThreadPool& pool) {
  format_ = format;
  n_rows_ = n_rows;
  row_bytes_ = act_row_bytes(format, n_cols);
  data_.resize(row_bytes_ * (size_t)n_rows);
  pool.parallel_for((size_t)n_rows, [&](size_t r) {
    quantize_act_row(format, x + r * (size_t)n_cols, data_.data() + r * row_bytes_, n_cols);
  });
}

void matmul(const Weight& w, const ActRows& act, float* y, ThreadPool& pool) {
  ROOFLINE_CHECK(act.format() == act_format_for(w.type()));
  const int64_t n_out = w.rows(), n_in = w.cols();
  const size_t w_row_bytes = dtype_row_bytes(w.type(), n_in);
  const VecDotFn dot = vec_dot_fn(w.type());
  const int n_act = act.n_rows();
  const uint8_t* wdata = w.data();
  if (!wdata) fail("tensor {} has no data (a layout-only model cannot run)", w.tensor->name);
  constexpr int64_t kChunk = 16;  // output rows per task
  const size_t n_chunks = (size_t)((n_out + kChunk - 1) / kChunk);
  pool.parallel_for(n_chunks, [&](size_t c) {
    const int64_t r0 = (int64_t)c * kChunk, r1 = std::min(n_out, r0 + kChunk);
    for (int64_t r = r0; r < r1; ++r) {
      const uint8_t* wr = wdata + (size_t)r * w_row_bytes;
      for (int t = 0; t < n_act; ++t) y[(size_t)t * n_out + r] = dot(wr, act.row(t), n_in);
    }
  });
}

void matmul(const Weight& w, const float* x, int n_rows, float* y, ThreadPool& pool) {
  ActRows act;
  act.prepare(act_format_for(w.type()), x, n_rows, w.cols(), pool);
  matmul(w, act, y, pool);
}

}  // namespace roofline::cpu
