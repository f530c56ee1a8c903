// The GPU table. Sources: NVIDIA's data sheets for each card (memory size, peak bandwidth, dense FP16
// tensor TFLOPS without sparsity; GeForce cards at their FP32-accumulate rate, which is half the FP16-
// accumulate rate on Turing/Ampere GeForce) and the CUDA programming guide's compute-capability
// table. Memory is the nominal size; the driver reports slightly less on some cards (a V100 32 GB shows
// ~31.7 GiB), which the planner's CUDA-context allowance covers. FP32: the CUDA cores' rate, which bounds
// the int8 dot-product kernels that decode several rows at once.
// stream_fraction: the share of the peak a streaming read reaches. Measured here on the H200 (~4.5 of
// 4.8 TB/s, docs/performance.md); HBM2/HBM2e/GDDR6(X) cards reach ~0.85-0.92 in published STREAM-like
// GPU benchmarks (e.g. BabelStream), older Pascal HBM2/GDDR5X ~0.80. These are estimates, not measured
// by us on those cards: `--gpu auto` measures the local card instead.
#include "engine/gpu_table.h"

#include <algorithm>
#include <cctype>

#include "backend/gpu.h"

namespace roofline {

namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = (char)std::tolower((unsigned char)c);
  return out;
}

GpuSpec gpu(const char* name, const char* display, double gib, double gbs, double stream, int major, int minor, double tflops,
            double fp32_tflops) {
  GpuSpec g;
  g.name = name;
  g.display_name = display;
  g.memory_gib = gib;
  g.peak_gbs = gbs;
  g.stream_fraction = stream;
  g.cc_major = major;
  g.cc_minor = minor;
  g.tflops = tflops;
  g.fp32_tflops = fp32_tflops;
  return g;
}

}  // namespace

const std::vector<GpuSpec>& gpu_table() {
  static const std::vector<GpuSpec> table = [] {
    std::vector<GpuSpec> t;
    //            name          display                        GiB   GB/s   stream  cc     TFLOPS (tensor FP16, FP32)
    t.push_back(gpu("p100", "Tesla P100-PCIE-16GB", 16, 732, 0.80, 6, 0, 18.7, 9.3));   // FP16 (no tensor cores)
    t.push_back(gpu("p40", "Tesla P40", 24, 346, 0.80, 6, 1, 11.8, 11.8));              // FP32 (FP16 is 1/64 rate)
    t.push_back(gpu("v100-16gb", "Tesla V100-SXM2-16GB", 16, 900, 0.88, 7, 0, 125, 15.7));
    t.push_back(gpu("v100-32gb", "Tesla V100-SXM2-32GB", 32, 900, 0.88, 7, 0, 125, 15.7));
    t.push_back(gpu("t4", "Tesla T4", 16, 320, 0.85, 7, 5, 65, 8.1));
    t.push_back(gpu("rtx2080ti", "GeForce RTX 2080 Ti", 11, 616, 0.88, 7, 5, 53.8, 13.4));
    t.push_back(gpu("rtx3090", "GeForce RTX 3090", 24, 936, 0.90, 8, 6, 71, 35.6));
    t.push_back(gpu("a10", "NVIDIA A10", 24, 600, 0.88, 8, 6, 125, 31.2));
    t.push_back(gpu("a100-40gb", "NVIDIA A100-SXM4-40GB", 40, 1555, 0.90, 8, 0, 312, 19.5));
    t.push_back(gpu("a100-80gb", "NVIDIA A100-SXM4-80GB", 80, 2039, 0.90, 8, 0, 312, 19.5));
    t.push_back(gpu("rtx4090", "GeForce RTX 4090", 24, 1008, 0.90, 8, 9, 165.2, 82.6));
    t.push_back(gpu("l4", "NVIDIA L4", 24, 300, 0.88, 8, 9, 121, 30.3));
    t.push_back(gpu("l40s", "NVIDIA L40S", 48, 864, 0.90, 8, 9, 362, 91.6));
    t.push_back(gpu("h100", "NVIDIA H100 80GB HBM3", 80, 3350, 0.92, 9, 0, 989, 67));
    t.push_back(gpu("h200", "NVIDIA H200", 141, 4800, 0.94, 9, 0, 989, 67));  // stream 0.94: measured ~4.5 TB/s
    t.push_back(gpu("rtx5090", "GeForce RTX 5090", 32, 1792, 0.90, 12, 0, 209.5, 104.8));
    // The host: a typical dual-channel DDR5 desktop (2 x 44.8 GB/s peak); memory is filled in from this
    // machine by the planner. Compute: a rough 1 TFLOPS for a many-core AVX2/AVX-512 CPU.
    GpuSpec cpu = gpu("cpu", "host CPU", 0, 89.6, 0.70, 0, 0, 1.0, 1.0);
    cpu.host = true;
    t.push_back(cpu);
    return t;
  }();
  return table;
}

const GpuSpec* find_gpu_spec(std::string_view name) {
  const std::string n = lower(name);
  for (const GpuSpec& g : gpu_table())
    if (g.name == n) return &g;
  return nullptr;
}

std::string gpu_table_names() {
  std::string out;
  for (const GpuSpec& g : gpu_table()) out += (out.empty() ? "" : ", ") + g.name;
  return out;
}

const GpuSpec* match_gpu_spec(std::string_view device_name, double memory_gib) {
  const std::string n = lower(device_name);
  struct Key {
    const char* needle;
    const char* name;
    double max_gib;  // the entry applies up to this memory size (cards sold in two sizes)
  };
  static const Key keys[] = {
      {"h200", "h200", 1e9},     {"h100", "h100", 1e9},     {"a100", "a100-40gb", 48},   {"a100", "a100-80gb", 1e9},
      {"l40s", "l40s", 1e9},     {"l4", "l4", 1e9},         {"a10", "a10", 1e9},         {"v100", "v100-16gb", 20},
      {"v100", "v100-32gb", 1e9}, {"t4", "t4", 1e9},         {"p40", "p40", 1e9},         {"p100", "p100", 1e9},
      {"2080 ti", "rtx2080ti", 1e9}, {"3090", "rtx3090", 1e9}, {"4090", "rtx4090", 1e9}, {"5090", "rtx5090", 1e9},
  };
  for (const Key& k : keys)
    if (n.find(k.needle) != std::string::npos && memory_gib <= k.max_gib) return find_gpu_spec(k.name);
  return nullptr;
}

GpuSpec local_gpu_spec(const GpuInfo& device, double cuda_context_gib) {
  constexpr double kGiB = 1073741824.0;
  const GpuSpec* known = match_gpu_spec(device.name, (double)device.total_bytes / kGiB);
  GpuSpec spec = known ? *known : GpuSpec{};
  spec.name = known ? known->name + " (measured)" : "local GPU";
  spec.display_name = device.name;
  spec.cc_major = device.cc_major;
  spec.cc_minor = device.cc_minor;
  spec.memory_gib = (double)device.free_bytes / kGiB + cuda_context_gib;  // the plan subtracts the context again: usable = free
  spec.measured = true;
  if (!known) spec.tflops = 0;  // not in the table: prefill is not predicted
  return spec;
}

}  // namespace roofline
