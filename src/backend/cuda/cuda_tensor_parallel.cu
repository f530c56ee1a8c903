// -sm row on GPUs: the reducers of the ranks' partial sums (backend/gpu.h, make_gpu_reducer).
// NCCL: one in-place all-reduce per sum on the rank's stream (captured into the decode graphs like any
// launch). Peer: one kernel per sum and rank. Each of its blocks copies its share of the partial into the
// rank's staging buffer (two, alternating per sum), raises its flag in every rank's signal table, waits
// until every rank's same block has raised theirs, then adds the ranks' staged shares in rank order, so
// every rank gets the same bits. A sum's staging buffer is written again only two sums later, after every
// rank has started the sum in between, which it does only once its reads of the earlier one are done
// (a rank's sums are kernels of one stream, launched without programmatic dependent launch).
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "backend/cuda/cuda_common.cuh"
#include "backend/gpu.h"
#include "backend/nccl.h"

namespace roofline {
namespace {

class NcclReducer final : public PartialSumReducer {
 public:
  explicit NcclReducer(const std::vector<int>& devices) : api_(nccl::api()), comms_(devices.size(), nullptr) {
    nccl::check(api_, api_.comm_init_all(comms_.data(), (int)devices.size(), devices.data()), "ncclCommInitAll");
  }
  ~NcclReducer() override {
    for (nccl::Comm c : comms_)
      if (c) api_.comm_destroy(c);
  }
  std::string name() const override {
    return fmt::format("NCCL {}.{}.{}", api_.version / 10000, api_.version / 100 % 100, api_.version % 100);
  }
  Backend::PartialSum hook(int rank) override {
    return [this, rank](float* data, size_t count, void* stream) {
      nccl::check(api_, api_.all_reduce(data, data, count, nccl::kFloat32, nccl::kSum, comms_[(size_t)rank], stream), "ncclAllReduce");
    };
  }

 private:
  const nccl::Api& api_;
  std::vector<nccl::Comm> comms_;
};

constexpr int kPeerBlocks = 32;
constexpr int kPeerThreads = 512;
constexpr int kMaxRanks = 8;

struct PeerArgs {
  float* stage[kMaxRanks][2];     // each rank's two staging buffers
  unsigned* signals[kMaxRanks];   // each rank's table [kPeerBlocks][kMaxRanks]: the epoch block b of rank k reached
  unsigned* epochs;               // this rank's per-block count of sums
  int n_ranks = 0, rank = 0;
};

__global__ void __launch_bounds__(kPeerThreads) peer_sum_kernel(PeerArgs a, float* data, unsigned long long count) {
  const int b = blockIdx.x;
  const unsigned e = a.epochs[b] + 1;
  const int parity = (int)(e & 1);
  const unsigned long long share = (count + gridDim.x - 1) / gridDim.x;
  const unsigned long long begin = min(count, share * b), end = min(count, begin + share);
  float* mine = a.stage[a.rank][parity];
  for (unsigned long long i = begin + threadIdx.x; i < end; i += blockDim.x) mine[i] = data[i];
  __syncthreads();
  if (threadIdx.x < (unsigned)a.n_ranks) {
    const int k = (int)threadIdx.x;
    __threadfence_system();  // the block's staged share is visible before the flag says so
    *(volatile unsigned*)(a.signals[k] + b * kMaxRanks + a.rank) = e;
    const volatile unsigned* theirs = a.signals[a.rank] + b * kMaxRanks + k;
    while ((int)(*theirs - e) < 0) {
    }
    __threadfence_system();
  }
  __syncthreads();
  for (unsigned long long i = begin + threadIdx.x; i < end; i += blockDim.x) {
    float s = 0.0f;
    for (int k = 0; k < a.n_ranks; ++k) s += __ldcv(a.stage[k][parity] + i);
    data[i] = s;
  }
  if (threadIdx.x == 0) a.epochs[b] = e;
}

class PeerReducer final : public PartialSumReducer {
 public:
  PeerReducer(const std::vector<int>& devices, size_t max_floats) : max_floats_(max_floats) {
    const int n = (int)devices.size();
    if (n > kMaxRanks) fail("-sm row over {} GPUs: the peer reducer takes at most {}", n, kMaxRanks);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) {
        if (devices[(size_t)i] == devices[(size_t)j]) continue;
        int can = 0;
        ROOFLINE_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, devices[(size_t)i], devices[(size_t)j]));
        if (!can) fail("-sm row: GPU {} cannot read GPU {}'s memory (no peer access); use ROOFLINE_TP_COMM=nccl", devices[(size_t)i], devices[(size_t)j]);
        ROOFLINE_CUDA_CHECK(cudaSetDevice(devices[(size_t)i]));
        const cudaError_t err = cudaDeviceEnablePeerAccess(devices[(size_t)j], 0);
        if (err == cudaErrorPeerAccessAlreadyEnabled) (void)cudaGetLastError();
        else ROOFLINE_CUDA_CHECK(err);
      }
    args_.n_ranks = n;
    epochs_.resize((size_t)n);
    for (int r = 0; r < n; ++r) {
      ROOFLINE_CUDA_CHECK(cudaSetDevice(devices[(size_t)r]));
      for (int p = 0; p < 2; ++p) args_.stage[r][p] = (float*)alloc(std::max<size_t>(max_floats, 1) * sizeof(float));
      args_.signals[r] = (unsigned*)alloc(kPeerBlocks * kMaxRanks * sizeof(unsigned));
      epochs_[(size_t)r] = (unsigned*)alloc(kPeerBlocks * sizeof(unsigned));
      ROOFLINE_CUDA_CHECK(cudaMemset(args_.signals[r], 0, kPeerBlocks * kMaxRanks * sizeof(unsigned)));
      ROOFLINE_CUDA_CHECK(cudaMemset(epochs_[(size_t)r], 0, kPeerBlocks * sizeof(unsigned)));
    }
    for (int r = 0; r < n; ++r) {
      ROOFLINE_CUDA_CHECK(cudaSetDevice(devices[(size_t)r]));
      ROOFLINE_CUDA_CHECK(cudaDeviceSynchronize());
    }
  }
  ~PeerReducer() override {
    for (size_t i = 0; i < allocations_.size(); ++i) {
      cudaSetDevice(allocation_device_[i]);
      cudaFree(allocations_[i]);
    }
  }
  std::string name() const override { return "peer sums"; }
  Backend::PartialSum hook(int rank) override {
    PeerArgs a = args_;
    a.rank = rank;
    a.epochs = epochs_[(size_t)rank];
    return [this, a](float* data, size_t count, void* stream) {
      if (count > max_floats_) fail("internal error: a partial sum of {} values, the reducer holds {}", count, max_floats_);
      peer_sum_kernel<<<kPeerBlocks, kPeerThreads, 0, (cudaStream_t)stream>>>(a, data, (unsigned long long)count);
      ROOFLINE_CUDA_CHECK(cudaGetLastError());
    };
  }

 private:
  void* alloc(size_t bytes) {
    void* p = nullptr;
    ROOFLINE_CUDA_CHECK(cudaMalloc(&p, bytes));
    int device = 0;
    ROOFLINE_CUDA_CHECK(cudaGetDevice(&device));
    allocations_.push_back(p);
    allocation_device_.push_back(device);
    return p;
  }

  PeerArgs args_;
  std::vector<unsigned*> epochs_;
  std::vector<void*> allocations_;
  std::vector<int> allocation_device_;
  const size_t max_floats_;
};

}  // namespace

std::unique_ptr<PartialSumReducer> make_gpu_reducer(const std::vector<int>& devices, size_t max_floats) {
  if (devices.size() < 2) fail("internal error: -sm row over {} GPU", devices.size());
  bool repeated = false;
  for (size_t i = 0; i < devices.size(); ++i)
    for (size_t j = 0; j < i; ++j) repeated = repeated || devices[i] == devices[j];
  const char* env = std::getenv("ROOFLINE_TP_COMM");
  const std::string comm = env && *env ? env : repeated ? "peer" : "nccl";
  if (comm == "peer") return std::make_unique<PeerReducer>(devices, max_floats);
  if (comm != "nccl") fail("ROOFLINE_TP_COMM '{}': expected nccl or peer", comm);
  if (repeated) fail("-sm row with NCCL needs distinct GPUs (a GPU is listed twice); ROOFLINE_TP_COMM=peer runs them");
  return std::make_unique<NcclReducer>(devices);
}

std::vector<float> gpu_nccl_sum_for_test(const std::vector<float>& x, int device, bool graph) {
  NcclReducer reducer({device});
  ROOFLINE_CUDA_CHECK(cudaSetDevice(device));
  cudaStream_t stream = nullptr;
  ROOFLINE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  float* data = nullptr;
  ROOFLINE_CUDA_CHECK(cudaMalloc(&data, std::max<size_t>(x.size(), 1) * sizeof(float)));
  ROOFLINE_CUDA_CHECK(cudaMemcpyAsync(data, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice, stream));
  const Backend::PartialSum sum = reducer.hook(0);
  if (graph) {
    cudaGraph_t g = nullptr;
    cudaGraphExec_t exec = nullptr;
    ROOFLINE_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    sum(data, x.size(), stream);
    ROOFLINE_CUDA_CHECK(cudaStreamEndCapture(stream, &g));
    ROOFLINE_CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));
    ROOFLINE_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    ROOFLINE_CUDA_CHECK(cudaStreamSynchronize(stream));
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(g);
  } else {
    sum(data, x.size(), stream);
  }
  std::vector<float> out(x.size());
  ROOFLINE_CUDA_CHECK(cudaMemcpyAsync(out.data(), data, x.size() * sizeof(float), cudaMemcpyDeviceToHost, stream));
  ROOFLINE_CUDA_CHECK(cudaStreamSynchronize(stream));
  cudaFree(data);
  cudaStreamDestroy(stream);
  return out;
}

}  // namespace roofline
