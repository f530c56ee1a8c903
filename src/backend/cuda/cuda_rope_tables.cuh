// The rotations of a prompt step's rows for rope_and_store, computed once per step and frequency base
// (rope_table, cuda_attention.cu) instead of in each of a row's rope CTAs: in a prompt step most of those
// CTAs start after the previous kernel, so their double-precision cos/sin was on the step's critical path.
// Decode and batched steps (up to 64 rows, every rope CTA resident early) keep computing them in rope's
// CTAs before the dependency wait. ROOFLINE_ROPE_TABLE=0 turns the tables off.
#pragma once

#include <array>
#include <cstdint>

#include "backend/cuda/cuda_kernels.cuh"

namespace roofline::cuda {

class RopeTables {
 public:
  static constexpr int kTables = 2;  // frequency bases a step may use (Gemma 3: local and global layers)
  static size_t floats(int max_rows, int n_rot) { return (size_t)kTables * max_rows * (n_rot > 0 ? n_rot : 0); }
  // buffer: floats(max_rows, n_rot) floats.
  void init(float* buffer, int max_rows, int n_rot) {
    n_rot_ = n_rot;
    if (n_rot <= 0) return;
    for (int i = 0; i < kTables; ++i) tables_[(size_t)i].table = buffer + (size_t)i * max_rows * n_rot;
  }
  void new_step() { ++step_; }  // the tables of the last step are stale
  // The table of this step's n_rows rows at (base, scale), computed on first use in the step; null where
  // rope computes them itself (at most 64 rows, the switch off, or a third base).
  const float* get(const DeviceStep& st, int n_rows, const float* factors, float base, float scale, cudaStream_t stream) {
    static const bool on = env_switch("ROOFLINE_ROPE_TABLE", true);
    if (!on || n_rows <= 64 || n_rot_ <= 0) return nullptr;
    for (Table& t : tables_) {
      if (t.step == step_ && t.base == base && t.scale == scale && t.positions == st.positions) return t.table;
      if (t.step != step_) {
        t.step = step_, t.base = base, t.scale = scale, t.positions = st.positions;
        rope_table(st, n_rows, factors, n_rot_, base, scale, t.table, stream);
        return t.table;
      }
    }
    return nullptr;
  }

 private:
  struct Table {
    float* table = nullptr;
    uint64_t step = 0;
    float base = 0, scale = 0;
    const int* positions = nullptr;
  };
  std::array<Table, kTables> tables_{};
  uint64_t step_ = 1;
  int n_rot_ = 0;
};

}  // namespace roofline::cuda
