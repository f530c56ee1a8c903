// Host-memory experts for GPU backends (host_experts.h): the CPU's MoE routing and grouped products
// over the model file's stacked expert tensors, and the layer choice from llama.cpp's placement flags.
#include "backend/cpu/host_experts.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <regex>

#include "backend/cpu/moe_cpu.h"
#include "core/error.h"
#include "core/mapped_file.h"
#include "core/thread_pool.h"

namespace roofline {

namespace {

// Maps the pages of [data, data + bytes) in now, as llama.cpp maps its file in (MAP_POPULATE): a token
// reads 8 of 128 experts, so otherwise a file-backed model's expert pages are faulted in a few at a
// time over hundreds of tokens and the first tokens' speed depends on that. MADV_POPULATE_READ
// (Linux 5.14) where the kernel has it, else one read per page over the pool.
void populate_pages(const void* data, size_t bytes, ThreadPool& pool) {
  if (!data || bytes == 0) return;
  const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
  const uintptr_t begin = (uintptr_t)data & ~(page - 1), end = ((uintptr_t)data + bytes + page - 1) & ~(page - 1);
#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif
  if (madvise((void*)begin, end - begin, MADV_POPULATE_READ) == 0) return;
  const size_t n_pages = (end - begin) / page;
  pool.parallel_for(64, [&](size_t c) {
    volatile uint8_t sink = 0;
    for (size_t i = n_pages * c / 64; i < n_pages * (c + 1) / 64; ++i) sink = sink ^ *reinterpret_cast<const volatile uint8_t*>(begin + i * page);
    (void)sink;
  });
}

}  // namespace

struct HostExperts::Impl {
  std::shared_ptr<const Model> model;
  ThreadPool pool;
  std::vector<cpu::ExpertViews> views;  // per layer (empty for layers on the GPU)
  cpu::PackedWeights packed;            // the experts' packed copies (types with packed kernels)
  cpu::MoeExperts moe;
  Impl(std::shared_ptr<const Model> m, int n_threads) : model(std::move(m)), pool(n_threads) {}
};

HostExperts::HostExperts(std::shared_ptr<const Model> model, const std::vector<bool>& on_host, int n_threads)
    : impl_(std::make_unique<Impl>(std::move(model), n_threads)), on_host_(on_host) {
  const Model& m = *impl_->model;
  ROOFLINE_CHECK(m.hparams().is_moe() && (int)on_host.size() == m.hparams().n_layer);
  impl_->views.resize(on_host.size());
  for (int il = 0; il < (int)on_host.size(); ++il) {
    if (!on_host[(size_t)il]) continue;
    const LayerWeights& L = m.layer(il);
    for (LayerTensor t : {LayerTensor::FfnGateInp, LayerTensor::FfnGateExps, LayerTensor::FfnUpExps, LayerTensor::FfnDownExps}) {
      if (!L[t].data()) fail("tensor {} has no data (a layout-only model cannot run)", L[t].tensor->name);
      cpu::vec_dot_fn(L[t].type());  // throws for a type without a CPU kernel
    }
    impl_->views[(size_t)il].build(L[LayerTensor::FfnGateExps], L[LayerTensor::FfnUpExps], L[LayerTensor::FfnDownExps]);
    // Packed where the packed kernels read the type (the file's pages then leave the resident set: the
    // copy is what the products read); otherwise mapped in now.
    const cpu::ExpertViews& v = impl_->views[(size_t)il];
    for (const auto* expert_views : {&v.gate, &v.up, &v.down}) {
      bool all_packed = true;
      for (const gguf::TensorInfo& t : *expert_views) all_packed = impl_->packed.add(Weight{&t}, impl_->pool) && all_packed;
      const gguf::TensorInfo& stacked = expert_views == &v.gate ? *v.gate_stacked : expert_views == &v.up ? *v.up_stacked : *v.down_stacked;
      if (!all_packed) {
        populate_pages(stacked.data, stacked.n_bytes, impl_->pool);
      } else if (!m.file().in_memory()) {
        release_mapped_pages(stacked.data, stacked.n_bytes);
      }
    }
  }
}

HostExperts::~HostExperts() = default;

void HostExperts::forward(int il, const float* xn, int n, float* out) {
  ROOFLINE_CHECK(holds(il), "internal error: layer {} keeps its experts on the GPU", il);
  const Model& m = *impl_->model;
  impl_->moe.forward(m.layer(il)[LayerTensor::FfnGateInp], impl_->views[(size_t)il], m.hparams(), xn, n, out, impl_->pool,
                     nullptr, &impl_->packed);
}

std::vector<bool> experts_on_host(const Model& model, int n_cpu_moe, const std::vector<std::string>& patterns,
                                  std::string* note) {
  const HParams& hp = model.hparams();
  std::vector<bool> out((size_t)hp.n_layer, false);
  if (n_cpu_moe < 0) fail("--n-cpu-moe {}: expected a number of layers (0 or more)", n_cpu_moe);
  std::vector<std::regex> res;
  for (const std::string& p : patterns) {
    try {
      res.emplace_back(p);
    } catch (const std::regex_error& e) {
      fail("-ot '{}=CPU': not a valid regular expression ({})", p, e.what());
    }
  }
  const LayerTensor experts[] = {LayerTensor::FfnGateExps, LayerTensor::FfnUpExps, LayerTensor::FfnDownExps};
  auto is_expert = [&](const std::string& name) {
    int il = -1;
    char rest[96] = {};
    if (std::sscanf(name.c_str(), "blk.%d.%95s", &il, rest) != 2) return false;
    for (LayerTensor t : experts)
      if (const TensorRule* r = model.arch().rule(t); r && std::string(rest) == r->name) return true;
    return false;
  };
  for (size_t i = 0; i < res.size(); ++i)
    for (const auto& t : model.file().tensors())
      if (std::regex_search(t.name, res[i]) && !is_expert(t.name))
        fail("-ot '{}=CPU' matches {}, which is not a stacked expert tensor: only experts (ffn_*_exps) can be kept in host "
             "memory", patterns[i], t.name);
  if (!hp.is_moe()) return out;
  for (int il = 0; il < hp.n_layer; ++il) {
    int matched = 0;
    for (LayerTensor t : experts) {
      const Weight& w = model.layer(il)[t];
      for (const std::regex& re : res)
        if (w && std::regex_search(w.tensor->name, re)) {
          ++matched;
          break;
        }
    }
    out[(size_t)il] = il < n_cpu_moe || matched > 0;
    if (matched > 0 && matched < 3 && il >= n_cpu_moe && note)
      *note += fmt::format("{}layer {}: -ot matches {} of its 3 expert tensors; all 3 stay in host memory", note->empty() ? "" : "; ",
                           il, matched);
  }
  return out;
}

}  // namespace roofline
