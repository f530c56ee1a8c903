// WindowSnapshots: pinned host copies of sliding-window ring blocks (cuda_window_snapshots.cuh).
#include "backend/cuda/cuda_window_snapshots.cuh"

#include <algorithm>

#include "backend/cuda/cuda_common.cuh"
#include "core/error.h"

namespace roofline::cuda {

WindowSnapshots::~WindowSnapshots() {
  if (host_) cudaFreeHost(host_);
}

void WindowSnapshots::init(int device, std::vector<Plane> planes, int n, int blocks, int per_cell, int n_cells) {
  ROOFLINE_CUDA_CHECK(cudaSetDevice(device));
  device_ = device;
  if (host_) cudaFreeHost(host_);
  host_ = nullptr;
  planes_ = std::move(planes);
  n_ = n;
  blocks_ = blocks;
  per_cell_ = per_cell;
  n_cells_ = n_cells;
  plane_offset_.clear();
  per_snapshot_ = 0;
  for (const Plane& p : planes_) {
    plane_offset_.push_back(per_snapshot_);
    per_snapshot_ += p.block_bytes * (size_t)blocks;
  }
  if (bytes() == 0) return;
  const cudaError_t err = cudaMallocHost(&host_, bytes());
  if (err != cudaSuccess) {
    cudaGetLastError();
    host_ = nullptr;
    fail("cannot allocate {:.1f} MiB of pinned host memory for {} prompt-cache snapshots of the sliding-window rings ({}); "
         "lower --cache-ram or use --no-prompt-cache", bytes() / 1048576.0, n, cudaGetErrorString(err));
  }
}

void WindowSnapshots::copy(cudaStream_t stream, int cell, int first_block, int n_blocks, int snapshot, bool to_host) {
  ROOFLINE_CHECK(cell >= 0 && cell < n_cells_ && snapshot >= 0 && snapshot < n_ && first_block >= 0 && n_blocks >= 0 &&
                     n_blocks <= blocks_ && n_blocks <= per_cell_, "window snapshot out of range");
  if (planes_.empty() || n_blocks == 0) return;
  ROOFLINE_CUDA_CHECK(cudaSetDevice(device_));
  // Block b of the sequence is ring block cell * per_cell + b % per_cell: the run wraps at most once.
  const int start = first_block % per_cell_;
  const int first_run = std::min(n_blocks, per_cell_ - start);
  for (size_t i = 0; i < planes_.size(); ++i) {
    const Plane& p = planes_[i];
    uint8_t* host = host_ + (size_t)snapshot * per_snapshot_ + plane_offset_[i];
    uint8_t* ring = p.base + (size_t)cell * per_cell_ * p.block_bytes;
    auto run = [&](int ring_block, int snap_block, int count) {
      if (count <= 0) return;
      uint8_t* dev = ring + (size_t)ring_block * p.block_bytes;
      uint8_t* hst = host + (size_t)snap_block * p.block_bytes;
      const size_t bytes = (size_t)count * p.block_bytes;
      if (to_host) ROOFLINE_CUDA_CHECK(cudaMemcpyAsync(hst, dev, bytes, cudaMemcpyDeviceToHost, stream));
      else ROOFLINE_CUDA_CHECK(cudaMemcpyAsync(dev, hst, bytes, cudaMemcpyHostToDevice, stream));
    };
    run(start, 0, first_run);
    run(0, first_run, n_blocks - first_run);
  }
  // The host copy must be whole before the snapshot is read or rewritten (saves), and its buffer
  // must not change under a pending upload (loads).
  ROOFLINE_CUDA_CHECK(cudaStreamSynchronize(stream));
}

void WindowSnapshots::save(cudaStream_t stream, int cell, int first_block, int n_blocks, int snapshot) {
  copy(stream, cell, first_block, n_blocks, snapshot, true);
}

void WindowSnapshots::load(cudaStream_t stream, int snapshot, int cell, int first_block, int n_blocks) {
  copy(stream, cell, first_block, n_blocks, snapshot, false);
}

}  // namespace roofline::cuda
