// Weight upload and repacking into the plane layouts of backend/device_planes.h: the 32-value block types split
// into quant bytes, scales and (Q5_0, Q5_1) fifth bits; Q6_K, Q3_K and Q2_K rearranged so that a lane's one or two
// loads give it 32 consecutive values, with small per-chunk scale planes beside (the decode kernels that read
// them: cuda_matvec_blocks.cuh, and cuda_matvec_rows.cuh for Q6_K).
#include "backend/cuda/cuda_weights.cuh"

#include <cuda.h>

#include <atomic>
#include <cstring>
#include <map>
#include <mutex>

#include "backend/device_planes.h"
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
  switch (t) {
    case DType::Q8_0: return WeightLayout::Q8_0Planes;
    case DType::Q4_0: case DType::IQ4_NL: return WeightLayout::Q4_0Planes;
    case DType::Q4_1: return WeightLayout::Q4_1Planes;
    case DType::Q5_0: return WeightLayout::Q5_0Planes;
    case DType::Q5_1: return WeightLayout::Q5_1Planes;
    case DType::Q6_K: return WeightLayout::Q6KPlanes;
    case DType::Q3_K: return WeightLayout::Q3KPlanes;
    case DType::Q2_K: return WeightLayout::Q2KPlanes;
    default: return WeightLayout::Raw;
  }
}

// One thread per 32-value block of BYTES bytes: SCALE bytes of scales (f16 d, and f16 m for the types with a
// min) first, then (FIFTH: Q5_0, Q5_1) a word of the values' fifth bits, then the quant bytes (32 for Q8_0, 16 for the
// 4- and 5-bit types). The quant bytes and scales go to their planes as they are; the fifth bits are transposed so
// that value e is bit e / 4 of byte e % 4 (a lane takes them for four values at once).
template <int BYTES, int SCALE, bool FIFTH>
__global__ void split_block32_kernel(const uint8_t* raw, int64_t n_blocks, uint8_t* qs, uint8_t* scales, uint8_t* fifth) {
  const int64_t b = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= n_blocks) return;
  constexpr int kQuantAt = SCALE + (FIFTH ? 4 : 0), kQuantBytes = BYTES - kQuantAt;
  const uint8_t* src = raw + b * BYTES;
  for (int i = 0; i < SCALE; ++i) scales[b * SCALE + i] = src[i];
  for (int i = 0; i < kQuantBytes; ++i) qs[b * kQuantBytes + i] = src[kQuantAt + i];
  if constexpr (FIFTH) {
    const uint32_t h = (uint32_t)src[SCALE] | (uint32_t)src[SCALE + 1] << 8 | (uint32_t)src[SCALE + 2] << 16 | (uint32_t)src[SCALE + 3] << 24;
    for (int k = 0; k < 4; ++k) {
      uint8_t byte = 0;
      for (int i = 0; i < 8; ++i) byte |= (uint8_t)(((h >> (4 * i + k)) & 1) << i);
      fifth[b * 4 + k] = byte;
    }
  }
}

// Writes 16 values of 2 bits (the low 2 bits of v[0..15]) as one little-endian word: value e at byte e % 4, bits
// 2 * (e / 4), so that (word >> 2k) & 0x03030303 gives values 4k..4k+3 as bytes.
__device__ void put_2bit_word(const uint8_t* v, uint8_t* out) {
  for (int k = 0; k < 4; ++k) {
    uint8_t byte = 0;
    for (int i = 0; i < 4; ++i) byte |= (uint8_t)((v[4 * i + k] & 3) << (2 * i));
    out[k] = byte;
  }
}

// One thread per super-block: unpack the 6-bit values (element order of llama-cpp-facts §2.3) and
// write them as lane chunks of 32: low nibbles of elements t and 16+t share byte t of a 16-byte run;
// the 2-bit highs of each 16 elements as put_2bit_word.
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
  uint8_t high[32];
  for (int j = 0; j < 8; ++j) {
    for (int t = 0; t < 16; ++t) lo[b * 128 + 16 * j + t] = (uint8_t)((q[32 * j + t] & 0xF) | ((q[32 * j + 16 + t] & 0xF) << 4));
    for (int e = 0; e < 32; ++e) high[e] = q[32 * j + e] >> 4;
    put_2bit_word(high, hi + b * 64 + 8 * j);
    put_2bit_word(high + 16, hi + b * 64 + 8 * j + 4);
  }
  for (int i = 0; i < 16; ++i) sc[b * 16 + i] = blk[192 + i];
  d[2 * b] = blk[208];
  d[2 * b + 1] = blk[209];
}

// The 2-bit fields of a Q2_K/Q3_K super-block's 64 quant bytes in element order: element 128n + 32p + l is
// bits 2p of byte 32n + l.
__device__ void unpack_2bit_fields(const uint8_t* qs, uint8_t* v) {
  for (int n = 0; n < 2; ++n)
    for (int p = 0; p < 4; ++p)
      for (int l = 0; l < 32; ++l) v[128 * n + 32 * p + l] = (qs[32 * n + l] >> (2 * p)) & 3;
}

// One thread per super-block. Q3_K (hmask[32], qs[64], 12 scale bytes, f16 d): values low - 4 * sign (-4..3) in
// chunks of 32: their low 2 bits as put_2bit_word (8 B), their sign bits (a clear hmask bit) as one word (value e at
// byte e % 4, bit e / 4), the 16 6-bit scales unpacked to int8 (s - 32), and d.
__global__ void repack_q3_k_kernel(const uint8_t* raw, int64_t n_blocks, uint8_t* lo, uint8_t* hi, uint8_t* sc, uint8_t* d) {
  const int64_t b = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= n_blocks) return;
  const uint8_t* blk = raw + b * 110;
  const uint8_t* hmask = blk;
  const uint8_t* scales = blk + 96;
  uint8_t v[256];
  unpack_2bit_fields(blk + 32, v);
  for (int e = 0; e < 256; ++e) v[e] |= (uint8_t)((~hmask[e % 32] >> (e / 32) & 1) << 2);  // bit 2: the sign (hmask clear: minus 4)
  for (int j = 0; j < 8; ++j) {
    put_2bit_word(v + 32 * j, lo + b * 64 + 8 * j);
    put_2bit_word(v + 32 * j + 16, lo + b * 64 + 8 * j + 4);
    for (int k = 0; k < 4; ++k) {
      uint8_t byte = 0;
      for (int i = 0; i < 8; ++i) byte |= (uint8_t)(((v[32 * j + 4 * i + k] >> 2) & 1) << i);
      hi[b * 32 + 4 * j + k] = byte;
    }
  }
  for (int i = 0; i < 16; ++i) {
    const int low = i < 8 ? scales[i] & 0xF : scales[i - 8] >> 4;
    const int high = (scales[8 + i % 4] >> (2 * (i / 4))) & 3;
    sc[b * 16 + i] = (uint8_t)(int8_t)((low | (high << 4)) - 32);
  }
  d[2 * b] = blk[108];
  d[2 * b + 1] = blk[109];
}

// One thread per super-block. Q2_K (16 scale bytes, qs[64], f16 d, f16 dmin): the 2-bit values in chunks of 32 as
// put_2bit_word, the scale bytes as they are (chunk j's are bytes 2j and 2j + 1), d and dmin.
__global__ void repack_q2_k_kernel(const uint8_t* raw, int64_t n_blocks, uint8_t* q, uint8_t* sc, uint8_t* dm) {
  const int64_t b = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= n_blocks) return;
  const uint8_t* blk = raw + b * 84;
  uint8_t v[256];
  unpack_2bit_fields(blk + 16, v);
  for (int j = 0; j < 16; ++j) put_2bit_word(v + 16 * j, q + b * 64 + 4 * j);
  for (int i = 0; i < 16; ++i) sc[b * 16 + i] = blk[i];
  for (int i = 0; i < 4; ++i) dm[b * 4 + i] = blk[80 + i];
}

size_t device_weight_bytes(const Weight& w) {
  return device_matrix_bytes(w.type(), w.tensor->n_rows() * w.cols(), w.bytes(), kAlign);
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
    if (d.type == DType::Q4_K) d.tmap = q4k_rows_map(p, rows, d.row_bytes);
    return d;
  }
  uint8_t* raw = nullptr;
  ROOFLINE_CUDA_CHECK(cudaMalloc(&raw, w.bytes()));
  ROOFLINE_CUDA_CHECK(cudaMemcpyAsync(raw, w.data(), w.bytes(), cudaMemcpyHostToDevice, stream));
  const DevicePlanes planes = device_planes(d.type);
  const int64_t n_blocks = rows * cols / planes.values;
  uint8_t* p[4] = {};
  for (int i = 0; i < 4; ++i)
    if (planes.bytes[i]) p[i] = arena.take((size_t)n_blocks * planes.bytes[i]);
  const int threads = 256;
  const int grid = (int)((n_blocks + threads - 1) / threads);
  switch (d.layout) {
    case WeightLayout::Q8_0Planes: split_block32_kernel<34, 2, false><<<grid, threads, 0, stream>>>(raw, n_blocks, p[0], p[1], p[2]); break;
    case WeightLayout::Q4_0Planes: split_block32_kernel<18, 2, false><<<grid, threads, 0, stream>>>(raw, n_blocks, p[0], p[1], p[2]); break;
    case WeightLayout::Q4_1Planes: split_block32_kernel<20, 4, false><<<grid, threads, 0, stream>>>(raw, n_blocks, p[0], p[1], p[2]); break;
    case WeightLayout::Q5_0Planes: split_block32_kernel<22, 2, true><<<grid, threads, 0, stream>>>(raw, n_blocks, p[0], p[1], p[2]); break;
    case WeightLayout::Q5_1Planes: split_block32_kernel<24, 4, true><<<grid, threads, 0, stream>>>(raw, n_blocks, p[0], p[1], p[2]); break;
    case WeightLayout::Q6KPlanes: repack_q6_k_kernel<<<grid, threads, 0, stream>>>(raw, n_blocks, p[0], p[1], p[2], p[3]); break;
    case WeightLayout::Q3KPlanes: repack_q3_k_kernel<<<grid, threads, 0, stream>>>(raw, n_blocks, p[0], p[1], p[2], p[3]); break;
    case WeightLayout::Q2KPlanes: repack_q2_k_kernel<<<grid, threads, 0, stream>>>(raw, n_blocks, p[0], p[1], p[2]); break;
    case WeightLayout::Raw: break;
  }
  d.data = p[0];
  d.plane1 = p[1];
  d.plane2 = p[2];
  d.plane3 = p[3];
  // (ROOFLINE_Q6K_TMAP=0: Q6_K weights without maps, their launches copy as before; the A/B of the maps.)
  if (d.layout == WeightLayout::Q6KPlanes && env_switch("ROOFLINE_Q6K_TMAP", true)) d.tmap = q6k_plane_maps(d);
  ROOFLINE_CUDA_CHECK(cudaGetLastError());
  ROOFLINE_CUDA_CHECK(cudaStreamSynchronize(stream));
  ROOFLINE_CUDA_CHECK(cudaFree(raw));
  return d;
}

namespace {

std::atomic<int64_t> weight_maps_made{0};  // (gpu_weight_tensor_maps_for_test)

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                 const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// The driver's encoder, found through the runtime (no driver library linked); null where the driver has none.
EncodeTiled tensor_map_encoder() {
  static const EncodeTiled fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
#if CUDART_VERSION >= 12050
    const cudaError_t err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &found);
#else  // (toolkits before 12.5 have only the unversioned query)
    const cudaError_t err = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &p, cudaEnableDefault, &found);
#endif
    if (err != cudaSuccess || found != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      return EncodeTiled{};
    }
    return reinterpret_cast<EncodeTiled>(p);
  }();
  return fn;
}

// A 2-D map of `rows` rows of row_bytes bytes at data, boxes of 16 rows x box_bytes; false where the driver declines.
bool encode_rows_map(CUtensorMap& map, const uint8_t* data, int64_t rows, size_t row_bytes, uint32_t box_bytes) {
  const EncodeTiled encode = tensor_map_encoder();
  if (!encode || rows <= 0 || row_bytes % 16 != 0 || reinterpret_cast<uintptr_t>(data) % 16 != 0) return false;
  const cuuint64_t dims[2] = {(cuuint64_t)row_bytes, (cuuint64_t)rows}, strides[1] = {(cuuint64_t)row_bytes};
  const cuuint32_t box[2] = {box_bytes, 16}, element_strides[2] = {1, 1};
  return encode(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<uint8_t*>(data), dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// `n` maps side by side in device memory on the current device (null where no memory is left for them).
const void* store_maps(const CUtensorMap* maps, int n) {
  // Maps go to chunks of device memory, one list a device, kept until the process ends.
  constexpr int kChunkMaps = 512;
  struct Pool {
    uint8_t* chunk = nullptr;
    int used = kChunkMaps;
  };
  static std::mutex mutex;
  static std::map<int, Pool> pools;
  int device = 0;
  ROOFLINE_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mutex);
  Pool& pool = pools[device];
  if (pool.used + n > kChunkMaps) {
    // (cudaMalloc aligns to 256 bytes.) A card filled to the last bytes gets no map: its kernels copy as before.
    uint8_t* chunk = nullptr;
    if (cudaMalloc(&chunk, kChunkMaps * sizeof(CUtensorMap)) != cudaSuccess) {
      cudaGetLastError();
      return nullptr;
    }
    pool.chunk = chunk;
    pool.used = 0;
  }
  uint8_t* at = pool.chunk + pool.used * sizeof(CUtensorMap);
  pool.used += n;
  ROOFLINE_CUDA_CHECK(cudaMemcpy(at, maps, n * sizeof(CUtensorMap), cudaMemcpyHostToDevice));
  weight_maps_made += n;
  return at;
}

}  // namespace

const void* q4k_rows_map(const uint8_t* data, int64_t rows, size_t row_bytes) {
  CUtensorMap map;
  return encode_rows_map(map, data, rows, row_bytes, 144) ? store_maps(&map, 1) : nullptr;
}

const void* q6k_plane_maps(const DeviceWeight& w) {
  CUtensorMap maps[3];
  const size_t cols = (size_t)w.cols;
  if (!encode_rows_map(maps[0], w.data, w.rows, cols / 2, 128) || !encode_rows_map(maps[1], w.plane1, w.rows, cols / 4, 64) ||
      !encode_rows_map(maps[2], w.plane2, w.rows, cols / 16, 16))
    return nullptr;
  return store_maps(maps, 3);
}

float* upload_floats(const std::vector<float>& v, DeviceArena& arena, cudaStream_t stream) {
  if (v.empty()) return nullptr;
  float* p = reinterpret_cast<float*>(arena.take(v.size() * sizeof(float)));
  ROOFLINE_CUDA_CHECK(cudaMemcpyAsync(p, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice, stream));
  ROOFLINE_CUDA_CHECK(cudaStreamSynchronize(stream));
  return p;
}

}  // namespace roofline::cuda

namespace roofline {

int64_t gpu_weight_tensor_maps_for_test() { return cuda::weight_maps_made.load(); }

}  // namespace roofline
