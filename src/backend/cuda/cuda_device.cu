// The CUDA side of backend/gpu.h that needs no backend object: which devices exist and whether this
// binary has kernels for them, launch settings read once (programmatic dependent launch, attention
// tunables), the read-bandwidth probe bench uses for its roofline, and the single-op test hooks.
#include <cublas_v2.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

#include "backend/cuda/cuda_batched_products.cuh"
#include "backend/cuda/cuda_kernels.cuh"
#include "backend/cuda/cuda_moe.cuh"
#include "backend/cuda/cuda_product_inputs.cuh"
#include "backend/cuda/cuda_weights.cuh"
#include "backend/gpu.h"

namespace roofline {
namespace cuda {
namespace {

__global__ void read_bandwidth_kernel(const int4* data, int64_t n, int* sink) {
  int acc = 0;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const int4 v = __ldg(data + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x7fffffff) sink[0] = acc;  // keeps the loads alive
}

__global__ void probe_kernel() {}

}  // namespace

int sm_count() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 1;
  static int cached[64] = {};
  int& sms = cached[device & 63];
  if (sms == 0 && cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) sms = 1;
  return sms;
}

int code_arch() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 0;
  static int cached[64] = {};
  int& arch = cached[device & 63];
  if (arch == 0) {
    int major = 0, minor = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
    cudaFuncAttributes attr{};
    const bool loaded = cudaFuncGetAttributes(&attr, probe_kernel) == cudaSuccess;
    cudaGetLastError();
    // ptxVersion: the virtual architecture the running code was compiled for (75 in a compute_75
    // build the driver JIT-compiles for a newer GPU); the kernels' __CUDA_ARCH__ branches follow it.
    arch = loaded ? std::min(10 * major + minor, attr.ptxVersion) : 10 * major + minor;
  }
  return arch;
}

bool env_switch(const char* name, bool default_on) {
  const char* v = std::getenv(name);
  if (v && std::strcmp(v, "0") == 0) return false;
  if (v && std::strcmp(v, "1") == 0) return true;
  return default_on;
}

bool pinned_logits_on() {
  static const bool on = env_switch("ROOFLINE_PINNED_LOGITS", true);
  return on;
}

bool pdl_enabled() {
  static const bool enabled = [] {
    const char* env = std::getenv("ROOFLINE_PDL");
    if (env && env[0] == '0') return false;
    // The kernels wait for their predecessor only where they were compiled for sm_90+: launching code
    // built for an older architecture with PDL would let it run ahead of the kernel before it.
    return code_arch() >= 90;
  }();
  return enabled;
}

int prefill_min_keys(bool flash) {
  static const int keys = [] {
    const char* env = std::getenv("ROOFLINE_PREFILL_MIN_KEYS");
    return env ? std::max(kMinPrefillRun, std::atoi(env)) : 0;
  }();
  return keys > 0 ? keys : flash ? kMinPrefillRun : kMinPrefillKeys;
}

// A span setting: the environment variable's value where it is one of `allowed`, else the default.
static int span_setting(const char* name, int fallback, std::initializer_list<int> allowed) {
  const char* env = std::getenv(name);
  const int v = env ? std::atoi(env) : fallback;
  for (int s : allowed)
    if (v == s) return v;
  return fallback;
}

constexpr int kLongRowCtas = 512;  // twice the CTAs a long row keeps before its spans double

// A count setting: the environment variable's value clamped to [lo, hi], else the default.
static int count_setting(const char* name, int fallback, int lo, int hi) {
  const char* env = std::getenv(name);
  return env ? std::max(lo, std::min(hi, std::atoi(env))) : fallback;
}

AttentionSpans attention_spans(int n_head_kv) {
  AttentionSpans s;
  s.min_span = span_setting("ROOFLINE_ATTN_MIN_SPAN", 32, {16, 32, 64, 128});
  s.splits = count_setting("ROOFLINE_ATTN_SPLITS", 32, 8, 512);
  // Long spans double while a long row keeps more than ~256 CTAs a layer (about two a SM of an H100 or H200):
  // past 64 splits with 8 or 16 KV heads, past 128 with 4 (measured on an H100 at depths 8192 and 16384,
  // docs/performance.md, thirty-ninth session).
  const int long_default = std::max(2 * s.splits, kLongRowCtas / std::max(1, n_head_kv));
  s.long_splits = count_setting("ROOFLINE_ATTN_LONG_SPLITS", long_default, 8, 1024);
  s.max_span = span_setting("ROOFLINE_ATTN_MAX_SPAN", 512, {128, 256, 512, 1024});
  return s;
}

}  // namespace cuda

bool gpu_support_compiled() { return true; }

std::vector<GpuInfo> gpu_devices() {
  std::vector<GpuInfo> out;
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return out;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    GpuInfo g;
    g.index = i;
    g.name = p.name;
    g.cc_major = p.major;
    g.cc_minor = p.minor;
    g.sm_count = p.multiProcessorCount;
    g.total_bytes = p.totalGlobalMem;
    size_t free_b = 0, total_b = 0;
    cudaSetDevice(i);
    if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) g.free_bytes = free_b;
    cudaFuncAttributes attr{};
    g.has_kernel_image = cudaFuncGetAttributes(&attr, cuda::probe_kernel) == cudaSuccess;
    cudaGetLastError();
    g.code_arch = g.has_kernel_image ? cuda::code_arch() : 0;
    out.push_back(g);
  }
  return out;
}

std::string gpu_build_info() {
  int rt = 0, drv = 0;
  cudaRuntimeGetVersion(&rt);
  cudaDriverGetVersion(&drv);
  return fmt::format("CUDA runtime {}.{}, driver {}.{}, compiled for sm {}", rt / 1000, (rt % 1000) / 10, drv / 1000,
                     (drv % 1000) / 10, ROOFLINE_CUDA_ARCHS);
}


std::vector<float> gpu_op_for_test(GpuOpForTest op, const std::vector<float>& a, const std::vector<float>& b, int n_rows, int n,
                                   float eps, int device) {
  using namespace cuda;
  const bool int8 = op == GpuOpForTest::RmsNormInt8 || op == GpuOpForTest::SwigluInt8 || op == GpuOpForTest::PostNormAddInt8;
  const bool post = op == GpuOpForTest::PostNormAdd || op == GpuOpForTest::PostNormAddNorm || op == GpuOpForTest::PostNormAddInt8;
  if (int8 && n % 32 != 0) fail("int8 activations need rows of whole 32-blocks ({} values)", n);
  const size_t na = (size_t)n_rows * n;
  if (a.size() != (post ? 2 : 1) * na) fail("gpu_op_for_test: {} values for {} rows of {}", a.size(), n_rows, n);
  if (post && (b.size() != 2 * (size_t)n || !post_norm_add_fits(n_rows, n)))
    fail("gpu_op_for_test: the post-norm takes two weight rows and at most 8 rows of a multiple of 32");
  ROOFLINE_CUDA_CHECK(cudaSetDevice(device));
  cudaStream_t stream;
  ROOFLINE_CUDA_CHECK(cudaStreamCreate(&stream));
  DeviceArena arena;
  const size_t blocks = na / 32 + (size_t)n_rows;
  arena.reserve(na * 4 * 3 + b.size() * 4 + na + 2 * blocks * 4 + (size_t)n_rows * 4 + argmax_scratch_bytes(n_rows) + 16 * 256);
  float* da = reinterpret_cast<float*>(arena.take(a.size() * 4));
  float* db = reinterpret_cast<float*>(arena.take(std::max<size_t>(1, b.size()) * 4));
  float* dy = reinterpret_cast<float*>(arena.take(na * 4));
  ActQ8 act;
  act.q = reinterpret_cast<int8_t*>(arena.take(na));
  act.d = reinterpret_cast<float*>(arena.take(blocks * 4));
  act.s = reinterpret_cast<float*>(arena.take(blocks * 4));
  int32_t* di = reinterpret_cast<int32_t*>(arena.take((size_t)n_rows * 4));
  const ArgmaxScratch argmax_scratch = argmax_scratch_at(arena.take(argmax_scratch_bytes(n_rows)), n_rows, stream);
  ROOFLINE_CUDA_CHECK(cudaMemcpy(da, a.data(), a.size() * 4, cudaMemcpyHostToDevice));
  if (!b.empty()) ROOFLINE_CUDA_CHECK(cudaMemcpy(db, b.data(), b.size() * 4, cudaMemcpyHostToDevice));
  switch (op) {
    case GpuOpForTest::RmsNorm: rms_norm(da, db, eps, n_rows, n, nullptr, dy, ActQ8{}, stream); break;
    case GpuOpForTest::RmsNormInt8: rms_norm(da, db, eps, n_rows, n, nullptr, nullptr, act, stream); break;
    case GpuOpForTest::RmsNormF16:
      if (!rms_norm(da, db, eps, n_rows, n, nullptr, nullptr, ActQ8{}, stream, reinterpret_cast<__half*>(dy)))
        fail("gpu_op_for_test: the norm wrote no f16 rows for {} rows of {}", n_rows, n);
      break;
    case GpuOpForTest::Swiglu: swiglu(da, db, n_rows, n, dy, ActQ8{}, stream); break;
    case GpuOpForTest::SwigluInt8: swiglu(da, db, n_rows, n, nullptr, act, stream); break;
    case GpuOpForTest::SwigluF16: swiglu(da, db, n_rows, n, nullptr, ActQ8{}, stream, reinterpret_cast<__half*>(dy)); break;
    case GpuOpForTest::AddBias:
      ROOFLINE_CUDA_CHECK(cudaMemcpyAsync(dy, da, na * 4, cudaMemcpyDeviceToDevice, stream));
      add_bias(dy, db, n_rows, n, stream);
      break;
    case GpuOpForTest::PostNormAdd: post_norm_add(da, db, eps, n_rows, n, da + na, nullptr, nullptr, ActQ8{}, stream); break;
    case GpuOpForTest::PostNormAddNorm: post_norm_add(da, db, eps, n_rows, n, da + na, db + n, dy, ActQ8{}, stream); break;
    case GpuOpForTest::PostNormAddInt8: post_norm_add(da, db, eps, n_rows, n, da + na, db + n, nullptr, act, stream); break;
    case GpuOpForTest::Argmax: argmax_rows(da, n_rows, n, argmax_scratch, di, stream); break;
    case GpuOpForTest::ArgmaxAllowed: {
      if (b.size() != na) fail("gpu_op_for_test: the argmax masks need one value per logit");
      const size_t words = ((size_t)n + 63) / 64;
      std::vector<uint64_t> masks((size_t)n_rows * words + ((size_t)n_rows + 7) / 8, 0);
      uint8_t* has = reinterpret_cast<uint8_t*>(masks.data() + (size_t)n_rows * words);
      for (int r = 0; r < n_rows; ++r) {
        has[r] = b[(size_t)r * n] >= 0;
        for (int t = 0; t < n; ++t)
          if (b[(size_t)r * n + t] > 0) masks[(size_t)r * words + (size_t)t / 64] |= 1ull << (t % 64);
      }
      uint64_t* dm = nullptr;
      ROOFLINE_CUDA_CHECK(cudaMalloc(&dm, masks.size() * 8));
      ROOFLINE_CUDA_CHECK(cudaMemcpy(dm, masks.data(), masks.size() * 8, cudaMemcpyHostToDevice));
      argmax_rows_allowed(da, n_rows, n, dm, reinterpret_cast<const uint8_t*>(dm + (size_t)n_rows * words), argmax_scratch, di, stream);
      ROOFLINE_CUDA_CHECK(cudaStreamSynchronize(stream));
      ROOFLINE_CUDA_CHECK(cudaFree(dm));
      break;
    }
  }
  ROOFLINE_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<float> out;
  if (op == GpuOpForTest::Argmax || op == GpuOpForTest::ArgmaxAllowed) {
    std::vector<int32_t> idx((size_t)n_rows);
    ROOFLINE_CUDA_CHECK(cudaMemcpy(idx.data(), di, idx.size() * 4, cudaMemcpyDeviceToHost));
    out.assign(idx.begin(), idx.end());
  } else if (int8) {
    std::vector<int8_t> q(na);
    std::vector<float> d(na / 32);
    ROOFLINE_CUDA_CHECK(cudaMemcpy(q.data(), act.q, na, cudaMemcpyDeviceToHost));
    ROOFLINE_CUDA_CHECK(cudaMemcpy(d.data(), act.d, d.size() * 4, cudaMemcpyDeviceToHost));
    out.resize(na);
    for (size_t i = 0; i < na; ++i) out[i] = (float)q[i] * d[i / 32];
  } else if (op == GpuOpForTest::SwigluF16 || op == GpuOpForTest::RmsNormF16) {
    std::vector<__half> h(na);
    ROOFLINE_CUDA_CHECK(cudaMemcpy(h.data(), dy, na * 2, cudaMemcpyDeviceToHost));
    out.resize(na);
    for (size_t i = 0; i < na; ++i) out[i] = __half2float(h[i]);
  } else {
    out.resize(na);
    ROOFLINE_CUDA_CHECK(cudaMemcpy(out.data(), op == GpuOpForTest::PostNormAdd ? da + na : dy, na * 4, cudaMemcpyDeviceToHost));
  }
  ROOFLINE_CUDA_CHECK(cudaStreamDestroy(stream));
  return out;
}

std::vector<uint16_t> gpu_producer_tiles_for_test(GpuOpForTest op, bool geglu, bool q6, const std::vector<float>& a, const std::vector<float>& b,
                                                  int n_rows, int n, float eps, int device) {
  using namespace cuda;
  const bool norm = op == GpuOpForTest::RmsNorm;
  if (!norm && op != GpuOpForTest::Swiglu) fail("gpu_producer_tiles_for_test: RmsNorm or Swiglu");
  const size_t na = (size_t)n_rows * n;
  if (n % 256 != 0 || n_rows < 9 || n_rows > 64 || a.size() != na || b.size() != (norm ? (size_t)n : na))
    fail("gpu_producer_tiles_for_test: 9-64 rows of a multiple of 256 values, and b of {}", norm ? "n" : "n_rows x n");
  ROOFLINE_CUDA_CHECK(cudaSetDevice(device));
  cudaStream_t stream;
  ROOFLINE_CUDA_CHECK(cudaStreamCreate(&stream));
  const int n_pad = wgmma_n_pad(n_rows);
  const size_t halves = (size_t)wg_tiles_halves(n, n_pad, q6);
  DeviceArena arena;
  arena.reserve((na + b.size() + na) * 4 + 3 * halves * 2 + 8 * 256);
  float* da = reinterpret_cast<float*>(arena.take(na * 4));
  float* db = reinterpret_cast<float*>(arena.take(b.size() * 4));
  float* dy = reinterpret_cast<float*>(arena.take(na * 4));
  __half* tiles = reinterpret_cast<__half*>(arena.take(3 * halves * 2));  // produced, converted, the run-order reference
  ROOFLINE_CUDA_CHECK(cudaMemcpy(da, a.data(), na * 4, cudaMemcpyHostToDevice));
  ROOFLINE_CUDA_CHECK(cudaMemcpy(db, b.data(), b.size() * 4, cudaMemcpyHostToDevice));
  // Every half not written by a kernel stays a NaN pattern, so a missed one shows as a difference.
  ROOFLINE_CUDA_CHECK(cudaMemset(tiles, 0xFF, 3 * halves * 2));
  auto at = [&](int j) { return WgTiles{tiles + j * halves, n_pad, q6, wg_tiles_folded()}; };
  if (norm) {
    if (!rms_norm(da, db, eps, n_rows, n, nullptr, dy, ActQ8{}, stream, nullptr, at(0)))
      fail("gpu_producer_tiles_for_test: the norm wrote no tiles for {} rows of {}", n_rows, n);
    rms_norm(da, db, eps, n_rows, n, nullptr, dy, ActQ8{}, stream);
  } else {
    gated_wgmma_tiles(geglu, da, db, n_rows, n, at(0), stream);
    if (geglu) cuda::geglu(da, db, n_rows, n, dy, ActQ8{}, stream);
    else swiglu(da, db, n_rows, n, dy, ActQ8{}, stream);
  }
  wgmma_convert_for_test(dy, n_rows, n, at(1), false, stream);
  wgmma_convert_for_test(dy, n_rows, n, at(2), true, stream);
  ROOFLINE_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<uint16_t> out(3 * halves);
  ROOFLINE_CUDA_CHECK(cudaMemcpy(out.data(), tiles, 3 * halves * 2, cudaMemcpyDeviceToHost));
  ROOFLINE_CUDA_CHECK(cudaStreamDestroy(stream));
  return out;
}

std::vector<float> gpu_matmul_for_test(const Weight& w, const std::vector<float>& x, int n_tokens, int device, bool f16_copy) {
  using namespace cuda;
  ROOFLINE_CUDA_CHECK(cudaSetDevice(device));
  cudaStream_t stream;
  ROOFLINE_CUDA_CHECK(cudaStreamCreate(&stream));
  cublasHandle_t cublas;
  if (cublasCreate(&cublas) != CUBLAS_STATUS_SUCCESS) fail("cuBLAS could not be initialized");
  cublasSetStream(cublas, stream);
  const int64_t rows = w.rows(), cols = w.cols();
  DeviceArena arena;
  const size_t scratch = (size_t)rows * cols;
  const size_t padded_tokens = (size_t)(n_tokens + 15) / 16 * 16;  // the batched kernel's activation layout
  arena.reserve(device_weight_bytes(w) + (size_t)n_tokens * (cols * 4 + cols + 8 * (cols / 32 + 1) + rows * 4) +
                padded_tokens * cols * 2 + scratch * 2 * (f16_copy ? 2 : 1) + 16 * 256);
  DeviceWeight dw = upload_weight(w, arena, stream);
  if (f16_copy) {  // as CudaBackend::keep_f16_copies makes them
    __half* copy = reinterpret_cast<__half*>(arena.take(scratch * 2));
    dequant_rows_f16(dw, 0, rows, copy, stream);
    dw.f16 = copy;
  }
  float* dx = reinterpret_cast<float*>(arena.take((size_t)n_tokens * cols * 4));
  float* dy = reinterpret_cast<float*>(arena.take((size_t)n_tokens * rows * 4));
  ActQ8 act;
  act.q = reinterpret_cast<int8_t*>(arena.take((size_t)n_tokens * cols));
  act.d = reinterpret_cast<float*>(arena.take((size_t)n_tokens * (cols / 32 + 1) * 4));
  act.s = reinterpret_cast<float*>(arena.take((size_t)n_tokens * (cols / 32 + 1) * 4));
  __half* sc = reinterpret_cast<__half*>(arena.take(scratch * 2));
  __half* xh = reinterpret_cast<__half*>(arena.take(padded_tokens * cols * 2));
  ROOFLINE_CUDA_CHECK(cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
  if (n_tokens <= 8) {
    if (matvec_uses_q8(dw.type)) quantize_rows(dx, n_tokens, (int)cols, act, stream);
    matvec(dw, act, dx, n_tokens, dy, (int)rows, false, stream);
  } else {
    gemm(cublas, dw, dx, n_tokens, dy, (int)rows, false, sc, scratch, xh, stream);
  }
  std::vector<float> y((size_t)n_tokens * rows);
  ROOFLINE_CUDA_CHECK(cudaMemcpyAsync(y.data(), dy, y.size() * 4, cudaMemcpyDeviceToHost, stream));
  ROOFLINE_CUDA_CHECK(cudaStreamSynchronize(stream));
  cublasDestroy(cublas);
  cudaStreamDestroy(stream);
  return y;
}

std::vector<float> gpu_joined_products_for_test(const std::vector<const Weight*>& ws, const std::vector<float>& x, int n_tokens,
                                                int device) {
  using namespace cuda;
  const int count = (int)ws.size();
  if (count < 1 || count > kMatvecGroupMax || n_tokens < 1 || n_tokens > 64)
    fail("gpu_joined_products_for_test: {} products of {} tokens (1-{} products, 1-64 tokens)", count, n_tokens, kMatvecGroupMax);
  const int64_t cols = ws[0]->cols();
  const bool batched = n_tokens > 8;
  size_t bytes = 16 * 256 + (size_t)n_tokens * (cols * 4 + cols + 8 * (cols / 32 + 1));
  size_t all_rows = 0;
  for (const Weight* w : ws) {
    if (w->cols() != cols || !matvec_uses_q8(w->type())) fail("gpu_joined_products_for_test: weights of int8 kinds and one row length");
    bytes += device_weight_bytes(*w) + (size_t)n_tokens * w->rows() * 4 + 256;
    all_rows += (size_t)w->rows();
  }
  // Batched: the split-K partial sums (up to 32 splits of every output) and the padded f16 activations.
  // (The warpgroup kernel's tiles: Q4_K's 17 k16 steps a super-block, and Q6_K's after them for a launch of both kinds.)
  const size_t scratch = batched ? 2 * 32 * all_rows * (size_t)n_tokens : 0, padded_tokens = (size_t)(n_tokens + 15) / 16 * 16;
  const size_t x_halves = std::max<size_t>(padded_tokens * cols, (size_t)wg_tiles_both_halves(cols / 256 * 256, (int)padded_tokens));
  if (batched) bytes += scratch * 2 + x_halves * 2 + 512;
  if (x.size() != (size_t)(n_tokens * cols)) fail("gpu_joined_products_for_test: {} activations for {} x {}", x.size(), n_tokens, cols);
  ROOFLINE_CUDA_CHECK(cudaSetDevice(device));
  cudaStream_t stream;
  ROOFLINE_CUDA_CHECK(cudaStreamCreate(&stream));
  DeviceArena arena;
  arena.reserve(bytes);
  std::vector<DeviceWeight> dws;
  const DeviceWeight* dptr[kMatvecGroupMax];
  float* ys[kMatvecGroupMax];
  int lds[kMatvecGroupMax];
  for (int m = 0; m < count; ++m) dws.push_back(upload_weight(*ws[m], arena, stream));
  for (int m = 0; m < count; ++m) {
    dptr[m] = &dws[(size_t)m];
    ys[m] = reinterpret_cast<float*>(arena.take((size_t)n_tokens * ws[m]->rows() * 4));
    lds[m] = (int)ws[m]->rows();
  }
  float* dx = reinterpret_cast<float*>(arena.take((size_t)n_tokens * cols * 4));
  ActQ8 act;
  act.q = reinterpret_cast<int8_t*>(arena.take((size_t)n_tokens * cols));
  act.d = reinterpret_cast<float*>(arena.take((size_t)n_tokens * (cols / 32 + 1) * 4));
  act.s = reinterpret_cast<float*>(arena.take((size_t)n_tokens * (cols / 32 + 1) * 4));
  ROOFLINE_CUDA_CHECK(cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
  if (batched) {
    for (int m = 1; m < count; ++m)
      if (!gemm_can_join(dws[0], dws[(size_t)m], n_tokens)) fail("gpu_joined_products_for_test: weights the batched kernel cannot join");
    __half* sc = reinterpret_cast<__half*>(arena.take(scratch * 2));
    __half* xh = reinterpret_cast<__half*>(arena.take(x_halves * 2));
    gemm_multi(dptr, ys, lds, count, dx, n_tokens, sc, scratch, xh, stream);
  } else {
    quantize_rows(dx, n_tokens, (int)cols, act, stream);
    matvec_multi(dptr, ys, lds, count, act, dx, n_tokens, false, stream);
  }
  std::vector<float> out;
  for (int m = 0; m < count; ++m) {
    std::vector<float> y((size_t)n_tokens * ws[m]->rows());
    ROOFLINE_CUDA_CHECK(cudaMemcpyAsync(y.data(), ys[m], y.size() * 4, cudaMemcpyDeviceToHost, stream));
    ROOFLINE_CUDA_CHECK(cudaStreamSynchronize(stream));
    out.insert(out.end(), y.begin(), y.end());
  }
  ROOFLINE_CUDA_CHECK(cudaGetLastError());
  cudaStreamDestroy(stream);
  return out;
}

std::vector<float> gpu_moe_down_combine_for_test(const Weight& stacked_down, int n_expert, const std::vector<float>& h,
                                                 const std::vector<int32_t>& ids, const std::vector<float>& weights, int n_rows, int k,
                                                 bool short_rows, int device) {
  using namespace cuda;
  const int64_t rows = stacked_down.rows() / std::max(1, n_expert), cols = stacked_down.cols();
  const size_t pairs = (size_t)n_rows * k;
  if (n_expert < 1 || rows * n_expert != stacked_down.rows() || n_rows < 1 || n_rows > 2 || k < 1 || k > 8 || h.size() != pairs * cols ||
      ids.size() != pairs || weights.size() != pairs)
    fail("gpu_moe_down_combine_for_test: {} experts of a {} x {} tensor, {} rows of {} pairs", n_expert, stacked_down.rows(), cols, n_rows, k);
  for (const int32_t e : ids)
    if (e < 0 || e >= n_expert) fail("gpu_moe_down_combine_for_test: expert {} of {}", e, n_expert);
  ROOFLINE_CUDA_CHECK(cudaSetDevice(device));
  cudaStream_t stream;
  ROOFLINE_CUDA_CHECK(cudaStreamCreate(&stream));
  DeviceArena arena;
  arena.reserve(device_weight_bytes(stacked_down) + pairs * (cols * 5 + 2 * (cols / 32 + 1) * 4 + 8) + (size_t)n_rows * rows * 4 + 16 * 256);
  const DeviceWeight dw = upload_weight(stacked_down, arena, stream);
  if (!moe_down_combine_fits(dw)) fail("gpu_moe_down_combine_for_test: a {} down tensor the fused kernel does not take", dtype_name(dw.type));
  float* dh = reinterpret_cast<float*>(arena.take(pairs * cols * 4));
  ActQ8 act;
  act.q = reinterpret_cast<int8_t*>(arena.take(pairs * cols));
  act.d = reinterpret_cast<float*>(arena.take(pairs * (cols / 32 + 1) * 4));
  act.s = reinterpret_cast<float*>(arena.take(pairs * (cols / 32 + 1) * 4));
  int32_t* dids = reinterpret_cast<int32_t*>(arena.take(pairs * 4));
  float* dweights = reinterpret_cast<float*>(arena.take(pairs * 4));
  float* dx = reinterpret_cast<float*>(arena.take((size_t)n_rows * rows * 4));
  ROOFLINE_CUDA_CHECK(cudaMemcpyAsync(dh, h.data(), h.size() * 4, cudaMemcpyHostToDevice, stream));
  ROOFLINE_CUDA_CHECK(cudaMemcpyAsync(dids, ids.data(), pairs * 4, cudaMemcpyHostToDevice, stream));
  ROOFLINE_CUDA_CHECK(cudaMemcpyAsync(dweights, weights.data(), pairs * 4, cudaMemcpyHostToDevice, stream));
  ROOFLINE_CUDA_CHECK(cudaMemsetAsync(dx, 0, (size_t)n_rows * rows * 4, stream));
  quantize_rows(dh, (int)pairs, (int)cols, act, stream);
  const int before = moe_down_short_for_test;
  moe_down_short_for_test = short_rows ? 1 : 0;
  moe_down_combine(dw, rows, act, dids, dweights, n_rows, k, dx, stream);
  moe_down_short_for_test = before;
  std::vector<float> out((size_t)n_rows * rows);
  ROOFLINE_CUDA_CHECK(cudaMemcpyAsync(out.data(), dx, out.size() * 4, cudaMemcpyDeviceToHost, stream));
  ROOFLINE_CUDA_CHECK(cudaStreamSynchronize(stream));
  ROOFLINE_CUDA_CHECK(cudaGetLastError());
  cudaStreamDestroy(stream);
  return out;
}

std::vector<float> gpu_chained_products_for_test(GpuChainForTest kind, bool fused, const Weight& p, const Weight* p2, const Weight& c,
                                                 const std::vector<float>& a, const std::vector<float>& x, const std::vector<float>& norm_w,
                                                 int n_tokens, float eps, int device) {
  using namespace cuda;
  const bool norm = kind == GpuChainForTest::Norm, gelu_gate = kind == GpuChainForTest::GeGlu;
  const int64_t mid = p.rows(), cols = p.cols(), rows_c = c.rows();
  if (n_tokens < 1 || n_tokens > ProductInputs::kDecodeRows || mid % 32 != 0 || c.cols() != mid || !matvec_uses_q8(c.type()) ||
      (!norm && (!p2 || p2->rows() != mid || p2->cols() != cols)) || a.size() != (size_t)(n_tokens * cols) ||
      (norm && (x.size() != (size_t)(n_tokens * mid) || norm_w.size() != (size_t)mid)))
    fail("gpu_chained_products_for_test: shapes do not chain");
  ROOFLINE_CUDA_CHECK(cudaSetDevice(device));
  cudaStream_t stream;
  ROOFLINE_CUDA_CHECK(cudaStreamCreate(&stream));
  DeviceArena arena;
  const int64_t max_cols = std::max(cols, mid);
  arena.reserve(device_weight_bytes(p) + (p2 ? device_weight_bytes(*p2) : 0) + device_weight_bytes(c) +
                ((size_t)n_tokens * (cols + 4 * mid + rows_c) + mid) * 4 + ProductInputs::bytes(ProductInputs::kDecodeRows, max_cols) +
                16 * 256);
  const DeviceWeight dp = upload_weight(p, arena, stream), dp2 = p2 ? upload_weight(*p2, arena, stream) : dp,
                     dc = upload_weight(c, arena, stream);
  auto take_f = [&](size_t n) { return reinterpret_cast<float*>(arena.take(n * 4)); };
  float *da = take_f((size_t)n_tokens * cols), *dx = take_f((size_t)n_tokens * mid), *dg = take_f((size_t)n_tokens * mid),
        *du = take_f((size_t)n_tokens * mid), *dxn = take_f((size_t)n_tokens * mid), *dy = take_f((size_t)n_tokens * rows_c),
        *dw = take_f((size_t)mid);
  ProductInputs inputs;
  inputs.init(arena, ProductInputs::kDecodeRows, max_cols, stream);
  ROOFLINE_CUDA_CHECK(cudaMemcpy(da, a.data(), a.size() * 4, cudaMemcpyHostToDevice));
  if (norm) ROOFLINE_CUDA_CHECK(cudaMemcpy(dw, norm_w.data(), norm_w.size() * 4, cudaMemcpyHostToDevice));
  std::vector<float> out;
  for (int run = 0; run < 2; ++run) {
    if (norm) ROOFLINE_CUDA_CHECK(cudaMemcpyAsync(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice, stream));
    inputs.reset();
    quantize_rows(da, n_tokens, (int)cols, inputs.writable(), stream);
    const DeviceWeight* ws[2] = {&dp, &dp2};
    float* ys[2] = {dg, du};
    const int lds[2] = {(int)mid, (int)mid};
    const MatvecEpilogue ep = !fused ? MatvecEpilogue{} : norm ? inputs.norm(dw, eps) : inputs.gated(gelu_gate);
    if (norm) matvec(dp, inputs.current(), da, n_tokens, dx, (int)mid, true, stream, ep);
    else matvec_multi(ws, ys, lds, 2, inputs.current(), da, n_tokens, false, stream, ep);
    if (fused) inputs.take(ep);
    else if (norm) rms_norm(dx, dw, eps, n_tokens, (int)mid, nullptr, dxn, inputs.writable(), stream);
    else if (gelu_gate) geglu(dg, du, n_tokens, (int)mid, dxn, inputs.writable(), stream);
    else swiglu(dg, du, n_tokens, (int)mid, dxn, inputs.writable(), stream);
    matvec(dc, inputs.current(), dxn, n_tokens, dy, (int)rows_c, false, stream);
    std::vector<float> y((size_t)n_tokens * rows_c);
    ROOFLINE_CUDA_CHECK(cudaMemcpyAsync(y.data(), dy, y.size() * 4, cudaMemcpyDeviceToHost, stream));
    ROOFLINE_CUDA_CHECK(cudaStreamSynchronize(stream));
    out.insert(out.end(), y.begin(), y.end());
  }
  if (norm) {
    std::vector<float> xo((size_t)n_tokens * mid);
    ROOFLINE_CUDA_CHECK(cudaMemcpy(xo.data(), dx, xo.size() * 4, cudaMemcpyDeviceToHost));
    out.insert(out.end(), xo.begin(), xo.end());
  }
  ROOFLINE_CUDA_CHECK(cudaStreamDestroy(stream));
  return out;
}

std::vector<float> gpu_decode_ffn_for_test(const Weight& gate, const Weight& up, const Weight& down, const std::vector<float>& norm_w,
                                           const std::vector<float>& x, bool persistent, int n_ctas, int repeats, float eps, int device) {
  using namespace cuda;
  const int64_t n_embd = gate.cols(), n_ff = gate.rows();
  if (x.size() != (size_t)n_embd || norm_w.size() != (size_t)n_embd || up.rows() != n_ff || up.cols() != n_embd || down.rows() != n_embd ||
      down.cols() != n_ff || n_embd % 32 || n_ff % 32 || repeats < 1)
    fail("gpu_decode_ffn_for_test: shapes do not chain");
  ROOFLINE_CUDA_CHECK(cudaSetDevice(device));
  cudaStream_t stream;
  ROOFLINE_CUDA_CHECK(cudaStreamCreate(&stream));
  DeviceArena arena;
  const int64_t max_cols = std::max(n_embd, n_ff);
  arena.reserve(device_weight_bytes(gate) + device_weight_bytes(up) + device_weight_bytes(down) + (size_t)(2 * n_embd + 3 * n_ff) * 4 +
                ProductInputs::bytes(ProductInputs::kDecodeRows, max_cols) + 64 * 256);  // each take rounds up
  const DeviceWeight dg = upload_weight(gate, arena, stream), du = upload_weight(up, arena, stream), dd = upload_weight(down, arena, stream);
  auto take_f = [&](size_t n) { return reinterpret_cast<float*>(arena.take(n * 4)); };
  float *dx = take_f((size_t)n_embd), *dw = take_f((size_t)n_embd), *dxn = take_f((size_t)n_embd), *dgate = take_f((size_t)n_ff),
        *dup = take_f((size_t)n_ff), *dh = take_f((size_t)n_ff);
  auto* sync = reinterpret_cast<unsigned long long*>(arena.take(8));
  ROOFLINE_CUDA_CHECK(cudaMemset(sync, 0, 8));
  ProductInputs inputs;
  inputs.init(arena, ProductInputs::kDecodeRows, max_cols, stream);
  ROOFLINE_CUDA_CHECK(cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
  ROOFLINE_CUDA_CHECK(cudaMemcpy(dw, norm_w.data(), norm_w.size() * 4, cudaMemcpyHostToDevice));
  const int ctas = n_ctas > 0 ? n_ctas : decode_ffn_ctas(device);
  std::vector<float> out;
  for (int run = 0; run < repeats; ++run) {
    if (persistent) {
      decode_ffn({dg, du, dd, dw, eps, dx, dh, sync}, ctas, stream);
    } else {  // the backend's launches for one row (ffn_block)
      inputs.reset();
      rms_norm(dx, dw, eps, 1, (int)n_embd, nullptr, dxn, inputs.writable(), stream);
      const DeviceWeight* ws[2] = {&dg, &du};
      float* ys[2] = {dgate, dup};
      const int lds[2] = {(int)n_ff, (int)n_ff};
      matvec_multi(ws, ys, lds, 2, inputs.current(), dxn, 1, false, stream);
      swiglu(dgate, dup, 1, (int)n_ff, dgate, inputs.writable(), stream);
      matvec(dd, inputs.current(), dgate, 1, dx, (int)n_embd, true, stream);
    }
    std::vector<float> y((size_t)n_embd);
    ROOFLINE_CUDA_CHECK(cudaMemcpyAsync(y.data(), dx, y.size() * 4, cudaMemcpyDeviceToHost, stream));
    ROOFLINE_CUDA_CHECK(cudaStreamSynchronize(stream));
    out.insert(out.end(), y.begin(), y.end());
  }
  ROOFLINE_CUDA_CHECK(cudaStreamDestroy(stream));
  return out;
}

std::vector<float> gpu_expert_products_for_test(const Weight& stacked, int n_expert, const std::vector<int32_t>& ids, int k,
                                                const std::vector<float>& x, int n_tokens, int device) {
  using namespace cuda;
  ROOFLINE_CUDA_CHECK(cudaSetDevice(device));
  cudaStream_t stream;
  ROOFLINE_CUDA_CHECK(cudaStreamCreate(&stream));
  const int64_t rows = stacked.rows() / n_expert, cols = stacked.cols();
  const int pairs = n_tokens * k, max_active = std::min(pairs, n_expert);
  DeviceArena arena;
  arena.reserve(device_weight_bytes(stacked) + (size_t)pairs * (cols * 8 + cols + 8 * (cols / 32 + 1) + rows * 4 + 16) +
                (size_t)(n_expert + 1) * 8 + (size_t)(pairs + 64 * n_expert) * cols * 2 + (size_t)(pairs + n_expert + 1) * 12 + 24 * 256);
  const DeviceWeight dw = upload_weight(stacked, arena, stream);
  float* dx = reinterpret_cast<float*>(arena.take((size_t)n_tokens * cols * 4));
  float* xs = reinterpret_cast<float*>(arena.take((size_t)pairs * cols * 4));
  float* dy = reinterpret_cast<float*>(arena.take((size_t)pairs * rows * 4));
  auto take_i = [&](size_t n) { return reinterpret_cast<int32_t*>(arena.take(n * 4)); };
  int32_t *d_ids = take_i(pairs), *offsets = take_i(n_expert + 1), *active = take_i(n_expert + 1), *row_token = take_i(pairs),
          *slot = take_i(pairs);
  ActQ8 act;
  act.q = reinterpret_cast<int8_t*>(arena.take((size_t)pairs * cols));
  act.d = reinterpret_cast<float*>(arena.take((size_t)pairs * (cols / 32 + 1) * 4));
  act.s = reinterpret_cast<float*>(arena.take((size_t)pairs * (cols / 32 + 1) * 4));
  ROOFLINE_CUDA_CHECK(cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
  ROOFLINE_CUDA_CHECK(cudaMemcpy(d_ids, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
  // The MoE block's choice: tensor cores for prompts of Q4_K / Q6_K weights, else the int8 / float kernels.
  const bool mma = moe_uses_mma(dw, rows, n_tokens);
  const int nt = expert_tile_nt(pairs, n_expert);
  ExpertTiles tiles;
  tiles.max_tiles = expert_max_tiles(pairs, n_expert, nt);
  tiles.nt = nt;
  int32_t *tile_expert = take_i(tiles.max_tiles), *tile_row0 = take_i(tiles.max_tiles), *tile_rows = take_i(tiles.max_tiles),
          *n_tiles = take_i(1);
  tiles.expert = tile_expert;
  tiles.row0 = tile_row0;
  tiles.rows = tile_rows;
  tiles.n_tiles = n_tiles;
  const ExpertTileBuffers tile_buffers{8 * nt, tile_expert, tile_row0, tile_rows, n_tiles};
  __half* frag = mma ? reinterpret_cast<__half*>(arena.take(mma_experts_scratch_halves(cols, tiles) * 2)) : nullptr;
  group_pairs_by_expert(d_ids, pairs, k, n_expert, max_active, offsets, active, row_token, slot, mma ? &tile_buffers : nullptr, stream);
  gather_rows(dx, row_token, pairs, (int)cols, xs, stream);
  if (mma) {
    mma_experts(dw, rows, tiles, xs, frag, dy, (int)rows, stream);
  } else {
    const bool q8 = matvec_uses_q8(dw.type);
    if (q8) quantize_rows(dx, pairs, (int)cols, act, stream, row_token);  // as the MoE block: gathered while quantized
    ExpertGroups g;
    g.offsets = offsets;
    g.active = active;
    g.max_active = max_active;
    g.chunk_splits = std::max(1, (pairs / max_active + 7) / 8);
    matvec_experts(dw, rows, g, q8 ? act : ActQ8{}, xs, dy, (int)rows, stream);
  }
  std::vector<float> grouped((size_t)pairs * rows);
  std::vector<int32_t> slot_host(pairs);
  ROOFLINE_CUDA_CHECK(cudaMemcpyAsync(grouped.data(), dy, grouped.size() * 4, cudaMemcpyDeviceToHost, stream));
  ROOFLINE_CUDA_CHECK(cudaMemcpyAsync(slot_host.data(), slot, (size_t)pairs * 4, cudaMemcpyDeviceToHost, stream));
  ROOFLINE_CUDA_CHECK(cudaStreamSynchronize(stream));
  cudaStreamDestroy(stream);
  std::vector<float> y((size_t)pairs * rows);
  for (int p = 0; p < pairs; ++p)
    std::copy_n(grouped.begin() + (int64_t)slot_host[p] * rows, rows, y.begin() + (int64_t)p * rows);
  return y;
}

double measure_gpu_read_bandwidth(int device) {
  ROOFLINE_CUDA_CHECK(cudaSetDevice(device));
  size_t free_b = 0, total_b = 0;
  ROOFLINE_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  size_t bytes = std::min<size_t>((size_t)8 << 30, free_b / 4);
  bytes = bytes / 16 * 16;
  int4* data = nullptr;
  int* sink = nullptr;
  ROOFLINE_CUDA_CHECK(cudaMalloc(&data, bytes));
  ROOFLINE_CUDA_CHECK(cudaMalloc(&sink, 4));
  ROOFLINE_CUDA_CHECK(cudaMemset(data, 1, bytes));
  cudaDeviceProp p{};
  ROOFLINE_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  double best = 0;
  for (int pass = 0; pass < 6; ++pass) {
    cudaEventRecord(a);
    cuda::read_bandwidth_kernel<<<p.multiProcessorCount * 8, 512>>>(data, (int64_t)(bytes / 16), sink);
    cudaEventRecord(b);
    ROOFLINE_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    if (pass > 0) best = std::max(best, bytes / (ms * 1e-3) / 1e9);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaFree(data);
  cudaFree(sink);
  return best;
}

}  // namespace roofline
