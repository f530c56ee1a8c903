// The built-in table of GPUs `roofline plan --gpu NAME` knows (memory, bandwidth, compute capability,
// dense FP16 tensor throughput) and the host CPU entry, so a plan can be made for a card one does not
// own. Figures and their sources are in gpu_table.cpp.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace roofline {

struct GpuInfo;  // backend/gpu.h

struct GpuSpec {
  std::string name;          // "v100-32gb": what --gpu takes
  std::string display_name;  // "Tesla V100-SXM2-32GB"
  double memory_gib = 0;     // total device memory as the driver reports it (GiB)
  double peak_gbs = 0;       // published peak memory bandwidth, GB/s (1e9 bytes/s)
  // The share of the peak a streaming read kernel reaches on this memory type (what `roofline bench`
  // measures); the decode roofline uses peak_gbs * stream_fraction.
  double stream_fraction = 0.9;
  int cc_major = 0, cc_minor = 0;  // compute capability (0.0 for the host)
  double tflops = 0;         // dense FP16 tensor-core TFLOPS with FP32 accumulate (FP32 TFLOPS without tensor cores)
  double fp32_tflops = 0;    // CUDA-core FP32 TFLOPS (0: unknown)
  bool host = false;         // the `cpu` entry: no GPU, everything runs on the host
  bool measured = false;     // --gpu auto: memory and bandwidth measured on this machine
  double achievable_gbs() const { return peak_gbs * stream_fraction; }
};

const std::vector<GpuSpec>& gpu_table();
// By table name (case-insensitive, "v100" alone is ambiguous and not found); nullptr if unknown.
const GpuSpec* find_gpu_spec(std::string_view name);
// The table names, comma-separated (for error messages and --help).
std::string gpu_table_names();
// The table entry whose card a CUDA device name ("NVIDIA H200", "Tesla V100-SXM2-32GB") describes,
// given its memory; nullptr if none matches.
const GpuSpec* match_gpu_spec(std::string_view device_name, double memory_gib);
// A CUDA device of this machine as the planner takes it: its table entry where one matches (else a blank
// spec: no prefill rate), with the memory free now as its memory (plus the CUDA context's allowance, which
// the plan subtracts again) and the table's bandwidth (`plan --gpu auto` measures it instead).
GpuSpec local_gpu_spec(const GpuInfo& device, double cuda_context_gib);

}  // namespace roofline
