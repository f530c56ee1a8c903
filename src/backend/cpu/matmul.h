// Matrix products on the CPU: y[t] = W x[t] for a batch of activation rows, W in any tensor type.
// Activations are converted once into the format W's kernel reads (vec_dot.h); every output element
// is one dot in a fixed order, so a row's result does not depend on the rest of the batch.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/cpu/packed_weights.h"
#include "backend/cpu/vec_dot.h"
#include "core/thread_pool.h"
#include "model/model.h"

namespace roofline::cpu {

// Activation rows converted for one format; reused by every matrix that reads the same input
// (Q, K and V; gate and up).
class ActRows {
 public:
  void prepare(ActFormat format, const float* x, int n_rows, int64_t n_cols, ThreadPool& pool);
  // These rows of `src` (already prepared), in this order: the same bytes as preparing them again.
  void gather(const ActRows& src, std::span<const int> rows);
  ActFormat format() const { return format_; }
  const uint8_t* row(int r) const { return data_.data() + (size_t)r * row_bytes_; }
  int n_rows() const { return n_rows_; }
  size_t row_stride() const { return row_bytes_; }
  // Q8_0 or Q8_K rows as the packed kernels read them (with the block sums they need, kept with them).
  PackedActs packed() const;

 private:
  ActFormat format_ = ActFormat::F32;
  size_t row_bytes_ = 0;
  int n_rows_ = 0;
  std::vector<uint8_t> data_;
  std::vector<float> block_scales_;   // Q8_0: per row and block
  std::vector<int32_t> block_sums_;   // Q8_0: per row and block, the sum of the 32 levels
  std::vector<KSums> k_sums_;         // Q8_K: per row and super-block
  std::vector<uint8_t> tiles_;        // the levels in AMX tile order (build_act_tiles), for the prompt kernels
  void build_tiles(ThreadPool* pool);  // over the pool where given
};

// y: [n_rows x w.rows()], rows of the activations in `act` (prepared for act_format_for(w.type())).
// A weight found in `packed` is read from its packed copy (packed_weights.h), every other in place.
void matmul(const Weight& w, const ActRows& act, float* y, ThreadPool& pool, const PackedWeights* packed = nullptr);
// Several products of the same activations (Q, K and V; gate and up) in one dispatch over the pool,
// their output rows split into tasks together: one wait instead of one per product. Every weight's
// act_format_for must be act.format().
struct MatmulOut {
  const Weight* w;
  float* y;  // [n_rows x w->rows()]
};
void matmul_multi(std::span<const MatmulOut> outs, const ActRows& act, ThreadPool& pool,
                  const PackedWeights* packed = nullptr);
// Any number of products, each of its own activation rows, in one dispatch over the pool (a MoE layer's
// experts: one wait for all of them instead of one per product).
struct Product {
  const Weight* w = nullptr;
  const ActRows* act = nullptr;
  float* y = nullptr;  // [act->n_rows() x w->rows()]
};
void matmul_products(std::span<const Product> products, ThreadPool& pool, const PackedWeights* packed = nullptr);
// Convenience: converts x and multiplies.
void matmul(const Weight& w, const float* x, int n_rows, float* y, ThreadPool& pool,
            const PackedWeights* packed = nullptr);

// The rate of this CPU's prompt products, in TFLOPS (2 per multiply-add): a Q4_K matrix of 2048 x 4096
// (packed where the kernels pack it) times 64 activation rows on n_threads threads, best of a few passes.
// What `plan` predicts a CPU's prefill from.
double measure_cpu_product_tflops(int n_threads);

}  // namespace roofline::cpu
