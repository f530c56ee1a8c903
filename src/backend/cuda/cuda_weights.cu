// Weight upload and repacking. Q6_K: low nibbles, 2-bit highs, int8 scales and f16 super-block scales
// in four planes, ordered so one 16-byte load gives a lane 32 consecutive weights (see the Q6_K
// matvec). Q8_0: int8 values and f16 scales in two planes; Q4_0 likewise (each block's 16 quant bytes as in
// the file, so one aligned 16-byte load gives a lane its 32 weights).
#include "backend/cuda/cuda_weights.cuh"

#include <cstring>

#include "formats/quant_blocks.h"

namespace roofline::cuda {

namespace {
constexpr size_t kAlign = 256;
size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
}  // namespace

bool device_supports(DType t) {
  switch (t) {
    case DType::F32: case DType::F16: case DType::BF16: case DType::Q4_0: case DType::Q4_1: case DType::Q5_0:
    case DType::Q5_1: case DType::Q8_0: case DType::Q2_K: case DType::Q3_K: case DType::Q4_K: case DType::Q5_K:
    case DType::Q6_K: case DType::IQ4_NL: case DType::IQ4_XS:
      return true;
    default:
      return false;
  }
}

WeightLayout device_layout_for(DType t) {
  if (t == DType::Q8_0) return WeightLayout::Q8_0Planes;
  if (t == DType::Q4_0) return WeightLayout::Q4_0Planes;
  if (t == DType::Q6_K) return WeightLayout::Q6KPlanes;
  return WeightLayout::Raw;
}

// One thread per block: a GGUF block of an f16 scale followed by QBYTES quant bytes (Q8_0: 32, Q4_0: 16) split
// into its quant bytes and its scale.
template <int QBYTES>
__global__ void split_scale_kernel(const uint8_t* raw, int64_t n_blocks, uint8_t* qs, uint8_t* d) {
  const int64_t b = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= n_blocks) return;
  const uint8_t* src = raw + b * (2 + QBYTES);
  d[2 * b] = src[0];
  d[2 * b + 1] = src[1];
  for (int i = 0; i < QBYTES; ++i) qs[b * QBYTES + i] = src[2 + i];
}

// One thread per super-block: unpack the 6-bit values (element order of llama-cpp-facts §2.3) and
// write them as lane chunks of 32: low nibbles of elements t and 16+t share byte t of a 16-byte run;
// the 2-bit highs of 16 elements fill one 32-bit word (element e: byte e%4, bits 2*(e/4)).
__global__ void repack_q6_k_kernel(const uint8_t* raw, int64_t n_blocks, uint8_t* lo, uint8_t* hi, uint8_t* sc, uint8_t* d) {
  const int64_t b = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= n_blocks) return;
  const uint8_t* blk = raw + b * 210;
  const uint8_t* ql_all = blk;
  const uint8_t* qh_all = blk + 128;
  uint8_t q[256];
  for (int n = 0; n < 2; ++n)
    for (int l = 0; l < 32; ++l) {
      const uint8_t* ql = ql_all + 64 * n;
      const uint8_t* qh = qh_all + 32 * n;
      q[128 * n + l] = (uint8_t)((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4));
      q[128 * n + l + 32] = (uint8_t)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4));
      q[128 * n + l + 64] = (uint8_t)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
      q[128 * n + l + 96] = (uint8_t)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
    }
  for (int j = 0; j < 8; ++j) {
    for (int t = 0; t < 16; ++t) lo[b * 128 + 16 * j + t] = (uint8_t)((q[32 * j + t] & 0xF) | ((q[32 * j + 16 + t] & 0xF) << 4));
    for (int half = 0; half < 2; ++half)
      for (int k = 0; k < 4; ++k) {
        uint8_t byte = 0;
        for (int i = 0; i < 4; ++i) byte |= (uint8_t)(((q[32 * j + 16 * half + 4 * i + k] >> 4) & 3) << (2 * i));
        hi[b * 64 + 8 * j + 4 * half + k] = byte;
      }
  }
  for (int i = 0; i < 16; ++i) sc[b * 16 + i] = blk[192 + i];
  d[2 * b] = blk[208];
  d[2 * b + 1] = blk[209];
}

size_t device_weight_bytes(const Weight& w) {
  const int64_t rows = w.tensor->n_rows(), cols = w.cols();
  switch (device_layout_for(w.type())) {
    case WeightLayout::Q8_0Planes: return align_up((size_t)(rows * cols)) + align_up((size_t)(rows * cols / 32 * 2));
    case WeightLayout::Q4_0Planes: return align_up((size_t)(rows * cols / 2)) + align_up((size_t)(rows * cols / 32 * 2));
    case WeightLayout::Q6KPlanes:
      return align_up((size_t)(rows * cols / 2)) + align_up((size_t)(rows * cols / 4)) + align_up((size_t)(rows * cols / 16)) +
             align_up((size_t)(rows * cols / 256 * 2));
    case WeightLayout::Raw: break;
  }
  return align_up(w.bytes());
}

DeviceArena::~DeviceArena() {
  if (base_) cudaFree(base_);
}

void DeviceArena::reserve(size_t bytes) {
  if (base_) fail("device arena reserved twice");
  if (bytes == 0) return;
  const cudaError_t err = cudaMalloc(&base_, bytes);
  if (err != cudaSuccess) {
    cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    base_ = nullptr;
    fail("out of GPU memory: asked for {:.2f} GiB, {:.2f} GiB free of {:.2f} GiB (fewer GPU layers with -ngl, a smaller -c, "
         "-ctk/-ctv q8_0, or a smaller quantization)",
         bytes / 1073741824.0, free_b / 1073741824.0, total_b / 1073741824.0);
  }
  capacity_ = bytes;
}

uint8_t* DeviceArena::take(size_t bytes) {
  const size_t n = align_up(bytes);
  if (used_ + n > capacity_) fail("internal error: device arena overflow ({} + {} > {})", used_, n, capacity_);
  uint8_t* p = base_ + used_;
  used_ += n;
  return p;
}

DeviceWeight upload_weight(const Weight& w, DeviceArena& arena, cudaStream_t stream) {
  if (!device_supports(w.type())) fail("tensor {} has type {}, which the CUDA backend does not support", w.tensor->name, dtype_name(w.type()));
  if (!w.data()) fail("tensor {} has no data (a layout-only model cannot run)", w.tensor->name);
  DeviceWeight d;
  d.type = w.type();
  d.layout = device_layout_for(w.type());
  d.rows = w.tensor->n_rows();
  d.cols = w.cols();
  d.row_bytes = dtype_row_bytes(w.type(), d.cols);
  const int64_t rows = d.rows, cols = d.cols;
  // The file's blocks go to the device as they are; the plane layouts are made there by a kernel.
  if (d.layout == WeightLayout::Raw) {
    uint8_t* p = arena.take(w.bytes());
    ROOFLINE_CUDA_CHECK(cudaMemcpyAsync(p, w.data(), w.bytes(), cudaMemcpyHostToDevice, stream));
    ROOFLINE_CUDA_CHECK(cudaStreamSynchronize(stream));
    d.data = p;
    return d;
  }
  uint8_t* raw = nullptr;
  ROOFLINE_CUDA_CHECK(cudaMalloc(&raw, w.bytes()));
  ROOFLINE_CUDA_CHECK(cudaMemcpyAsync(raw, w.data(), w.bytes(), cudaMemcpyHostToDevice, stream));
  const int64_t n_blocks = rows * cols / (d.layout == WeightLayout::Q6KPlanes ? 256 : 32);
  const int threads = 256;
  const int grid = (int)((n_blocks + threads - 1) / threads);
  if (d.layout == WeightLayout::Q8_0Planes || d.layout == WeightLayout::Q4_0Planes) {
    const bool q8 = d.layout == WeightLayout::Q8_0Planes;
    uint8_t* pq = arena.take((size_t)n_blocks * (q8 ? 32 : 16));
    uint8_t* pd = arena.take((size_t)n_blocks * 2);
    if (q8) split_scale_kernel<32><<<grid, threads, 0, stream>>>(raw, n_blocks, pq, pd);
    else split_scale_kernel<16><<<grid, threads, 0, stream>>>(raw, n_blocks, pq, pd);
    d.data = pq;
    d.plane1 = pd;
  } else {
    uint8_t* plo = arena.take((size_t)n_blocks * 128);
    uint8_t* phi = arena.take((size_t)n_blocks * 64);
    uint8_t* psc = arena.take((size_t)n_blocks * 16);
    uint8_t* pd = arena.take((size_t)n_blocks * 2);
    repack_q6_k_kernel<<<grid, threads, 0, stream>>>(raw, n_blocks, plo, phi, psc, pd);
    d.data = plo;
    d.plane1 = phi;
    d.plane2 = psc;
    d.plane3 = pd;
  }
  ROOFLINE_CUDA_CHECK(cudaGetLastError());
  ROOFLINE_CUDA_CHECK(cudaStreamSynchronize(stream));
  ROOFLINE_CUDA_CHECK(cudaFree(raw));
  return d;
}

float* upload_floats(const std::vector<float>& v, DeviceArena& arena, cudaStream_t stream) {
  if (v.empty()) return nullptr;
  float* p = reinterpret_cast<float*>(arena.take(v.size() * sizeof(float)));
  ROOFLINE_CUDA_CHECK(cudaMemcpyAsync(p, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice, stream));
  ROOFLINE_CUDA_CHECK(cudaStreamSynchronize(stream));
  return p;
}

}  // namespace roofline::cuda
