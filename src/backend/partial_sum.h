// Tensor parallelism (-sm row): what adds up the ranks' partial sums. Each rank runs a slice of every
// layer (Model::tensor_slice), so its attention output and down products are partial sums of the
// whole; its backend hands each one to its hook (Backend::set_partial_sum), and the reducer leaves the
// sum over all ranks in every rank's buffer. Implementations: host sums for CPU ranks
// (engine/tensor_parallel.h), NCCL or peer-memory sums for GPUs (backend/gpu.h).
#pragma once

#include <string>

#include "backend/backend.h"

namespace roofline {

class PartialSumReducer {
 public:
  virtual ~PartialSumReducer() = default;
  virtual std::string name() const = 0;
  // What rank r's backend calls. Every rank calls its hook the same number of times with the same counts,
  // in the same order, each rank from its own thread.
  virtual Backend::PartialSum hook(int rank) = 0;
  // A rank failed in the middle of a step: the others must not wait for it any longer (their hooks throw
  // instead), until reset(). Reducers whose waiting happens on a device cannot honour it.
  virtual void abort() {}
  virtual void reset() {}
};

}  // namespace roofline
