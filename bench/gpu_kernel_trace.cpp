// A kernel timeline for any CUDA program, graph nodes included, without Nsight Systems: loaded by the
// CUDA driver through CUDA_INJECTION64_PATH, it turns on CUPTI's kernel activity records (which do not
// serialize kernels, so programmatic dependent launch keeps its overlap) and at exit writes one CSV line
// per kernel to ROOFLINE_TRACE_OUT (default kernel_trace.csv): start and duration in ns (GPU clock),
// grid, graph node, mangled name. scripts/gpu/timeline_table.py reads it.
//   build: g++ -O2 -shared -fPIC -std=c++17 bench/gpu_kernel_trace.cpp -I$CUDA/include -L$CUDA/lib -lcupti \
//            -o libkernel_trace.so     (scripts/gpu/build_for_device.sh does it when CUPTI is there)
//   use:   CUDA_INJECTION64_PATH=$PWD/libkernel_trace.so ROOFLINE_TRACE_OUT=t.csv roofline bench ...
#include <cupti.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

namespace {

struct Record {
  uint64_t start, end, graph_node;
  int grid_x, grid_y, grid_z, block_x;
  std::string name;
};

std::mutex g_mutex;
std::vector<Record>* g_records = nullptr;  // leaked on purpose: written from the atexit handler
constexpr size_t kBufferBytes = 8 << 20;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* rec = nullptr;
  std::lock_guard<std::mutex> lock(g_mutex);
  while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && rec->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
    g_records->push_back({k->start, k->end, k->graphNodeId, k->gridX, k->gridY, k->gridZ, k->blockX, k->name ? k->name : "?"});
  }
  std::free(buffer);
}

void write_trace() {
  cuptiActivityFlushAll(1);
  const char* path = std::getenv("ROOFLINE_TRACE_OUT");
  FILE* f = std::fopen(path && *path ? path : "kernel_trace.csv", "w");
  if (!f) {
    std::fprintf(stderr, "kernel trace: cannot write %s\n", path ? path : "kernel_trace.csv");
    return;
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  std::fprintf(f, "Start (ns),Duration (ns),GrdX,GrdY,GrdZ,BlkX,GraphNode,Name\n");
  for (const Record& r : *g_records)
    std::fprintf(f, "%llu,%llu,%d,%d,%d,%d,%llu,%s\n", (unsigned long long)r.start, (unsigned long long)(r.end - r.start), r.grid_x,
                 r.grid_y, r.grid_z, r.block_x, (unsigned long long)r.graph_node, r.name.c_str());
  std::fclose(f);
  std::fprintf(stderr, "kernel trace: %zu kernels\n", g_records->size());
}

}  // namespace

extern "C" int InitializeInjection() {
  g_records = new std::vector<Record>();
  g_records->reserve(1 << 20);
  if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS ||
      cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
    std::fprintf(stderr, "kernel trace: CUPTI did not start\n");
    return 0;
  }
  std::atexit(write_trace);
  return 1;
}
