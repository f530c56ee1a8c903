// Prompt-cache snapshots of the CUDA backend's sliding-window rings, in pinned host memory (as
// llama.cpp keeps its context checkpoints in host RAM): a snapshot holds the blocks of one sequence's
// window before a block boundary, copied out of its ring and later back into another sequence's ring,
// so the device holds only the live rings whatever the number of snapshots.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace roofline::cuda {

class WindowSnapshots {
 public:
  // A ring plane on the device (K or V values, or their scales, of one sliding layer): block i of the
  // n_cells x per_cell ring blocks at base + i * block_bytes.
  struct Plane {
    uint8_t* base = nullptr;
    size_t block_bytes = 0;
  };
  WindowSnapshots() = default;
  WindowSnapshots(const WindowSnapshots&) = delete;
  WindowSnapshots& operator=(const WindowSnapshots&) = delete;
  ~WindowSnapshots();

  // Room for n snapshots of `blocks` blocks of every plane; rings of per_cell blocks in n_cells cells, on
  // GPU `device`.
  void init(int device, std::vector<Plane> planes, int n, int blocks, int per_cell, int n_cells);
  // Blocks [first_block, first_block + n_blocks) of the sequence in `cell` to snapshot `snapshot`, and
  // back. Both are ordered on `stream` after the work before them and complete on return.
  void save(cudaStream_t stream, int cell, int first_block, int n_blocks, int snapshot);
  void load(cudaStream_t stream, int snapshot, int cell, int first_block, int n_blocks);
  size_t bytes() const { return per_snapshot_ * (size_t)n_; }

 private:
  void copy(cudaStream_t stream, int cell, int first_block, int n_blocks, int snapshot, bool to_host);

  std::vector<Plane> planes_;
  std::vector<size_t> plane_offset_;  // within a snapshot
  uint8_t* host_ = nullptr;
  size_t per_snapshot_ = 0;
  int device_ = 0, n_ = 0, blocks_ = 0, per_cell_ = 0, n_cells_ = 0;
};

}  // namespace roofline::cuda
