// Decode steps' CUDA graphs (cuda_backend.cu): one per key (bucket, layer range), captured from the
// launches on first use and replayed after. The device the graphs belong to must be current when the cache
// is destroyed.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <map>

#include "backend/cuda/cuda_common.cuh"

namespace roofline::cuda {

class GraphCache {
 public:
  GraphCache() = default;
  GraphCache(const GraphCache&) = delete;
  GraphCache& operator=(const GraphCache&) = delete;
  ~GraphCache() {
    for (auto& [key, exec] : graphs_) cudaGraphExecDestroy(exec);
  }

  bool has(uint64_t key) const { return graphs_.count(key) != 0; }
  size_t size() const { return graphs_.size(); }
  // Launches key's graph on stream, capturing enqueue()'s launches into it the first time.
  template <typename Enqueue>
  void run(uint64_t key, cudaStream_t stream, Enqueue&& enqueue) {
    auto it = graphs_.find(key);
    if (it == graphs_.end()) it = graphs_.emplace(key, capture_graph(stream, enqueue)).first;
    ROOFLINE_CUDA_CHECK(cudaGraphLaunch(it->second, stream));
  }

 private:
  std::map<uint64_t, cudaGraphExec_t> graphs_;
};

}  // namespace roofline::cuda
