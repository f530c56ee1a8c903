// Experts kept in host memory for a GPU backend (--cpu-moe, --n-cpu-moe, -ot REGEX=CPU, as llama.cpp
// means them): the routed part of those layers' MoE FFN (router, grouped expert products) run by the
// CPU from the model file's mapping, while everything else of the layer stays on the GPU. Plain host
// arrays in and out, so the CUDA backend needs no CPU headers beyond this one.
#pragma once

#include <memory>
#include <vector>

#include "model/model.h"

namespace roofline {

class HostExperts {
 public:
  // `on_host` has one flag per layer of the model; n_threads 0: every core.
  HostExperts(std::shared_ptr<const Model> model, const std::vector<bool>& on_host, int n_threads);
  ~HostExperts();

  bool holds(int il) const { return il >= 0 && il < (int)on_host_.size() && on_host_[(size_t)il]; }
  // out[r] = the routed experts' output for xn[r] (n rows of n_embd; the shared expert not included).
  void forward(int il, const float* xn, int n, float* out);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::vector<bool> on_host_;
};

// Which layers keep their experts in host memory: the first n_cpu_moe layers (--n-cpu-moe; a number at
// least n_layer: --cpu-moe), and those with an expert tensor matching one of the -ot REGEX=CPU patterns
// (std::regex search, as llama.cpp matches). Throws Error when a pattern matches a tensor that is not
// a stacked expert (only experts can be kept on the host) or is not a valid regex; `note` gets a line
// when a pattern matches only some of a layer's experts (the whole layer's experts then go).
std::vector<bool> experts_on_host(const Model& model, int n_cpu_moe, const std::vector<std::string>& patterns,
                                  std::string* note = nullptr);

}  // namespace roofline
