// Decode matrix-vector products (1-8 tokens), one launch per group of products sharing an input
// (q/k/v, gate/up: fewer launches per layer). One warp per output row, streaming the row with 16-byte
// loads; int8 activations and dp4a for Q4_K, Q5_K, Q6_K (planes) and Q8_0 (planes); float activations
// for F16/BF16/F32; a generic dequantize-and-FMA kernel for the other types. Each output is reduced
// by one warp in a fixed order, so results do not depend on the batch or on timing.
#include "backend/cuda/cuda_dequant.cuh"
#include "backend/cuda/cuda_kernels.cuh"

namespace roofline::cuda {

namespace {

constexpr int kWarps = 4;  // rows per CTA

__device__ __forceinline__ int4 ld16(const void* p) { return __ldg(reinterpret_cast<const int4*>(p)); }

__device__ __forceinline__ int dot16(const int4 w, const int4 a, int acc) {
  acc = __dp4a(w.x, a.x, acc);
  acc = __dp4a(w.y, a.y, acc);
  acc = __dp4a(w.z, a.z, acc);
  return __dp4a(w.w, a.w, acc);
}

template <int B>
__device__ __forceinline__ void store_rows(const float (&acc)[B], float* y, int ldy, int64_t row, bool accumulate, int lane) {
#pragma unroll
  for (int t = 0; t < B; ++t) {
    const float v = warp_sum(acc[t]);
    if (lane == 0) {
      float* dst = y + (int64_t)t * ldy + row;
      *dst = accumulate ? *dst + v : v;
    }
  }
}

// Q4_K (GGUF blocks of 144 B): 8 lanes per super-block; lane j reads 16 B of quants: chunk c = j/2,
// half h = j%2 -> low nibbles are elements 16h..16h+15 of sub-block 2c, high nibbles of sub-block 2c+1.
template <int B>
__device__ __forceinline__ void q4_k_superblock(const int4 hdr_v, const int4 qv, int64_t i, int c, int h, const ActQ8& act,
                                                int64_t cols, float (&acc)[B]) {
  union {
    int4 v;
    uint8_t b[16];
  } hdr;
  hdr.v = hdr_v;
  __half2 dm;
  memcpy(&dm, hdr.b, 4);
  const float d = __low2float(dm), dmin = __high2float(dm);
  int sc0, m0, sc1, m1;
  k4_scale_min(2 * c, hdr.b + 4, sc0, m0);
  k4_scale_min(2 * c + 1, hdr.b + 4, sc1, m1);
  const int4 lo = make_int4(qv.x & 0x0F0F0F0F, qv.y & 0x0F0F0F0F, qv.z & 0x0F0F0F0F, qv.w & 0x0F0F0F0F);
  const int4 hi = make_int4((qv.x >> 4) & 0x0F0F0F0F, (qv.y >> 4) & 0x0F0F0F0F, (qv.z >> 4) & 0x0F0F0F0F,
                            (qv.w >> 4) & 0x0F0F0F0F);
#pragma unroll
  for (int t = 0; t < B; ++t) {
    const int8_t* a = act.q + (int64_t)t * cols + i * 256 + 64 * c + 16 * h;
    const int dlo = dot16(lo, ld16(a), 0), dhi = dot16(hi, ld16(a + 32), 0);
    const int64_t s = (int64_t)t * (cols / 32) + 8 * i + 2 * c;
    acc[t] += d * ((float)sc0 * act.d[s] * (float)dlo + (float)sc1 * act.d[s + 1] * (float)dhi);
    if (h == 0) acc[t] -= dmin * ((float)m0 * act.s[s] + (float)m1 * act.s[s + 1]);
  }
}

// Each lane group takes super-blocks i and i + 4 per iteration, both loads issued before either is used
// (more bytes in flight per warp: the kernel is bound by memory latency otherwise).
template <int B>
__device__ __forceinline__ void matvec_q4_k(const DeviceWeight& w, const ActQ8& act, float* y, int ldy, bool accumulate, int64_t row, int lane) {
  const int j = lane % 8, c = j / 2, h = j % 2;
  const int64_t n_sb = w.cols / 256;
  const uint8_t* rowp = w.data + row * w.row_bytes;
  float acc[B] = {};
  for (int64_t i = lane / 8; i < n_sb; i += 8) {
    const bool second = i + 4 < n_sb;
    const int4 hdr0 = ld16(rowp + i * 144), q0 = ld16(rowp + i * 144 + 16 + 16 * j);
    int4 hdr1 = make_int4(0, 0, 0, 0), q1 = hdr1;
    if (second) {
      hdr1 = ld16(rowp + (i + 4) * 144);
      q1 = ld16(rowp + (i + 4) * 144 + 16 + 16 * j);
    }
    q4_k_superblock<B>(hdr0, q0, i, c, h, act, w.cols, acc);
    if (second) q4_k_superblock<B>(hdr1, q1, i + 4, c, h, act, w.cols, acc);
  }
  store_rows<B>(acc, y, ldy, row, accumulate, lane);
}

// Q5_K (176 B): as Q4_K, plus the fifth bit of each quant from qh (bit 2c for low, 2c+1 for high nibbles).
template <int B>
__device__ __forceinline__ void matvec_q5_k(const DeviceWeight& w, const ActQ8& act, float* y, int ldy, bool accumulate, int64_t row, int lane) {
  const int j = lane % 8, c = j / 2, h = j % 2;
  const int64_t n_sb = w.cols / 256;
  const uint8_t* rowp = w.data + row * w.row_bytes;
  float acc[B] = {};
  for (int64_t i = lane / 8; i < n_sb; i += 4) {
    const uint8_t* blk = rowp + i * 176;
    union {
      int4 v;
      uint8_t b[16];
    } hdr;
    hdr.v = ld16(blk);
    const int4 qh = ld16(blk + 16 + 16 * h);
    const int4 qv = ld16(blk + 48 + 16 * j);
    __half2 dm;
    memcpy(&dm, hdr.b, 4);
    const float d = __low2float(dm), dmin = __high2float(dm);
    int sc0, m0, sc1, m1;
    k4_scale_min(2 * c, hdr.b + 4, sc0, m0);
    k4_scale_min(2 * c + 1, hdr.b + 4, sc1, m1);
    const int s0 = 2 * c, s1 = 2 * c + 1;
    const int4 lo = make_int4((qv.x & 0x0F0F0F0F) | (((qh.x >> s0) & 0x01010101) << 4),
                              (qv.y & 0x0F0F0F0F) | (((qh.y >> s0) & 0x01010101) << 4),
                              (qv.z & 0x0F0F0F0F) | (((qh.z >> s0) & 0x01010101) << 4),
                              (qv.w & 0x0F0F0F0F) | (((qh.w >> s0) & 0x01010101) << 4));
    const int4 hi = make_int4(((qv.x >> 4) & 0x0F0F0F0F) | (((qh.x >> s1) & 0x01010101) << 4),
                              ((qv.y >> 4) & 0x0F0F0F0F) | (((qh.y >> s1) & 0x01010101) << 4),
                              ((qv.z >> 4) & 0x0F0F0F0F) | (((qh.z >> s1) & 0x01010101) << 4),
                              ((qv.w >> 4) & 0x0F0F0F0F) | (((qh.w >> s1) & 0x01010101) << 4));
#pragma unroll
    for (int t = 0; t < B; ++t) {
      const int8_t* a = act.q + (int64_t)t * w.cols + i * 256 + 64 * c + 16 * h;
      const int dlo = dot16(lo, ld16(a), 0), dhi = dot16(hi, ld16(a + 32), 0);
      const int64_t s = (int64_t)t * (w.cols / 32) + 8 * i + 2 * c;
      acc[t] += d * ((float)sc0 * act.d[s] * (float)dlo + (float)sc1 * act.d[s + 1] * (float)dhi);
      if (h == 0) acc[t] -= dmin * ((float)m0 * act.s[s] + (float)m1 * act.s[s + 1]);
    }
  }
  store_rows<B>(acc, y, ldy, row, accumulate, lane);
}

// Q6_K planes: lane j of a super-block reads 16 B of low nibbles and 8 B of 2-bit highs for elements
// 32j..32j+31 (sub-blocks 2j and 2j+1), giving signed 6-bit values (q - 32) for dp4a.
template <int B>
__device__ __forceinline__ void matvec_q6_k(const DeviceWeight& w, const ActQ8& act, float* y, int ldy, bool accumulate, int64_t row, int lane) {
  const int j = lane % 8;
  const int64_t n_sb = w.cols / 256;
  const uint8_t* lo_row = w.data + row * (w.cols / 2);
  const uint8_t* hi_row = w.plane1 + row * (w.cols / 4);
  const int8_t* sc_row = reinterpret_cast<const int8_t*>(w.plane2) + row * (w.cols / 16);
  const __half* d_row = reinterpret_cast<const __half*>(w.plane3) + row * n_sb;
  float acc[B] = {};
  // One super-block's 32 elements for lane j (low nibbles lo, 2-bit highs hi).
  auto superblock = [&](int64_t i, const int4 lo, const int2 hi) {
    const float d = __half2float(d_row[i]);
    const float sc0 = (float)sc_row[i * 16 + 2 * j], sc1 = (float)sc_row[i * 16 + 2 * j + 1];
    const int l[4] = {lo.x, lo.y, lo.z, lo.w};
    int4 w0, w1;
    int* p0 = &w0.x;
    int* p1 = &w1.x;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      p0[k] = (int)__vsub4((unsigned)((l[k] & 0x0F0F0F0F) | (((hi.x >> (2 * k)) & 0x03030303) << 4)), 0x20202020u);
      p1[k] = (int)__vsub4((unsigned)(((l[k] >> 4) & 0x0F0F0F0F) | (((hi.y >> (2 * k)) & 0x03030303) << 4)), 0x20202020u);
    }
#pragma unroll
    for (int t = 0; t < B; ++t) {
      const int8_t* a = act.q + (int64_t)t * w.cols + i * 256 + 32 * j;
      const int d0 = dot16(w0, ld16(a), 0), d1 = dot16(w1, ld16(a + 16), 0);
      acc[t] += d * act.d[(int64_t)t * (w.cols / 32) + 8 * i + j] * (sc0 * (float)d0 + sc1 * (float)d1);
    }
  };
  // Super-blocks i and i + 4 per iteration, both loaded before either is used.
  for (int64_t i = lane / 8; i < n_sb; i += 8) {
    const bool second = i + 4 < n_sb;
    const int4 lo0 = ld16(lo_row + i * 128 + 16 * j);
    const int2 hi0 = __ldg(reinterpret_cast<const int2*>(hi_row + i * 64 + 8 * j));
    int4 lo1 = make_int4(0, 0, 0, 0);
    int2 hi1 = make_int2(0, 0);
    if (second) {
      lo1 = ld16(lo_row + (i + 4) * 128 + 16 * j);
      hi1 = __ldg(reinterpret_cast<const int2*>(hi_row + (i + 4) * 64 + 8 * j));
    }
    superblock(i, lo0, hi0);
    if (second) superblock(i + 4, lo1, hi1);
  }
  store_rows<B>(acc, y, ldy, row, accumulate, lane);
}

// Q8_0 planes: one lane per 32-element block.
template <int B>
__device__ __forceinline__ void matvec_q8_0(const DeviceWeight& w, const ActQ8& act, float* y, int ldy, bool accumulate, int64_t row, int lane) {
  const int64_t n_blocks = w.cols / 32;
  const int8_t* q_row = reinterpret_cast<const int8_t*>(w.data) + row * w.cols;
  const __half* d_row = reinterpret_cast<const __half*>(w.plane1) + row * n_blocks;
  float acc[B] = {};
  for (int64_t b = lane; b < n_blocks; b += 32) {
    const int4 q0 = ld16(q_row + b * 32), q1 = ld16(q_row + b * 32 + 16);
    const float d = __half2float(d_row[b]);
#pragma unroll
    for (int t = 0; t < B; ++t) {
      const int8_t* a = act.q + (int64_t)t * w.cols + b * 32;
      const int dot = dot16(q1, ld16(a + 16), dot16(q0, ld16(a), 0));
      acc[t] += d * act.d[(int64_t)t * n_blocks + b] * (float)dot;
    }
  }
  store_rows<B>(acc, y, ldy, row, accumulate, lane);
}

// F16 / BF16 / F32 weights with float activations: each lane reads 16 B of the row per step.
template <int B, DType T>
__device__ __forceinline__ void matvec_float(const DeviceWeight& w, const float* x, float* y, int ldy, bool accumulate, int64_t row, int lane) {
  constexpr int kPer = T == DType::F32 ? 4 : 8;  // elements per 16-byte load
  const uint8_t* rowp = w.data + row * w.row_bytes;
  float acc[B] = {};
  const bool vec = w.cols % kPer == 0;
  if (vec) {
    for (int64_t e = (int64_t)lane * kPer; e < w.cols; e += 32 * kPer) {
      float wv[kPer];
      const int4 raw = ld16(rowp + e * (T == DType::F32 ? 4 : 2));
      if constexpr (T == DType::F32) {
        wv[0] = __int_as_float(raw.x); wv[1] = __int_as_float(raw.y); wv[2] = __int_as_float(raw.z); wv[3] = __int_as_float(raw.w);
      } else {
        const uint32_t u[4] = {(uint32_t)raw.x, (uint32_t)raw.y, (uint32_t)raw.z, (uint32_t)raw.w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          if constexpr (T == DType::F16) {
            __half2 h2;
            memcpy(&h2, &u[k], 4);
            const float2 f = __half22float2(h2);
            wv[2 * k] = f.x;
            wv[2 * k + 1] = f.y;
          } else {
            wv[2 * k] = __uint_as_float(u[k] << 16);
            wv[2 * k + 1] = __uint_as_float(u[k] & 0xFFFF0000u);
          }
        }
      }
#pragma unroll
      for (int t = 0; t < B; ++t) {
        const float* xr = x + (int64_t)t * w.cols + e;
#pragma unroll
        for (int k = 0; k < kPer; ++k) acc[t] += wv[k] * xr[k];
      }
    }
  } else {
    for (int64_t e = lane; e < w.cols; e += 32) {
      float v;
      if constexpr (T == DType::F32) v = reinterpret_cast<const float*>(rowp)[e];
      else if constexpr (T == DType::F16) v = ld_half(rowp + 2 * e);
      else v = ld_bf16(rowp + 2 * e);
#pragma unroll
      for (int t = 0; t < B; ++t) acc[t] += v * x[(int64_t)t * w.cols + e];
    }
  }
  store_rows<B>(acc, y, ldy, row, accumulate, lane);
}

// Any type: each lane dequantizes whole 32-element chunks and multiplies with float activations.
template <int B>
__device__ __forceinline__ void matvec_generic(const DeviceWeight& w, const float* x, float* y, int ldy, bool accumulate, int64_t row, int lane) {
  float acc[B] = {};
  float v[32];
  for (int64_t c = lane; c < w.cols / 32; c += 32) {
    dequant_chunk32(w, row, c, v);
#pragma unroll
    for (int t = 0; t < B; ++t) {
      const float* xr = x + (int64_t)t * w.cols + c * 32;
      float s = 0;
#pragma unroll
      for (int k = 0; k < 32; ++k) s += v[k] * xr[k];
      acc[t] += s;
    }
  }
  store_rows<B>(acc, y, ldy, row, accumulate, lane);
}

// The kernel behind every matvec launch: a group of products that share the input (q/k/v, gate/up),
// all of one weight kind, their rows laid end to end over the grid (one warp per row).
enum class Kind { Q4K, Q5K, Q6K, Q8_0, F16, BF16, F32, Generic };

struct MatvecGroup {
  static constexpr int kMax = 3;
  DeviceWeight w[kMax];
  float* y[kMax];
  int ldy[kMax];
  int64_t first_row[kMax + 1];  // member m holds grid rows [first_row[m], first_row[m + 1])
  int n = 0;
};

template <int B, Kind K>
__global__ void __launch_bounds__(kWarps * 32) matvec_kernel(MatvecGroup g, ActQ8 act, const float* x, bool accumulate) {
  const int lane = threadIdx.x % 32;
  const int64_t grid_row = (int64_t)blockIdx.x * kWarps + threadIdx.x / 32;
  wait_for_previous_kernel();
  if (grid_row >= g.first_row[g.n]) return;
  // The member, picked with selects (a run-time index into the parameter arrays would copy them to
  // local memory).
  DeviceWeight w = g.w[0];
  float* y = g.y[0];
  int ldy = g.ldy[0];
  int64_t first = 0;
#pragma unroll
  for (int m = 1; m < MatvecGroup::kMax; ++m)
    if (m < g.n && grid_row >= g.first_row[m]) {
      w = g.w[m];
      y = g.y[m];
      ldy = g.ldy[m];
      first = g.first_row[m];
    }
  const int64_t row = grid_row - first;
  if constexpr (K == Kind::Q4K) matvec_q4_k<B>(w, act, y, ldy, accumulate, row, lane);
  else if constexpr (K == Kind::Q5K) matvec_q5_k<B>(w, act, y, ldy, accumulate, row, lane);
  else if constexpr (K == Kind::Q6K) matvec_q6_k<B>(w, act, y, ldy, accumulate, row, lane);
  else if constexpr (K == Kind::Q8_0) matvec_q8_0<B>(w, act, y, ldy, accumulate, row, lane);
  else if constexpr (K == Kind::F16) matvec_float<B, DType::F16>(w, x, y, ldy, accumulate, row, lane);
  else if constexpr (K == Kind::BF16) matvec_float<B, DType::BF16>(w, x, y, ldy, accumulate, row, lane);
  else if constexpr (K == Kind::F32) matvec_float<B, DType::F32>(w, x, y, ldy, accumulate, row, lane);
  else matvec_generic<B>(w, x, y, ldy, accumulate, row, lane);
}

Kind kind_of(const DeviceWeight& w) {
  switch (w.type) {
    case DType::Q4_K: return Kind::Q4K;
    case DType::Q5_K: return Kind::Q5K;
    case DType::Q6_K: return Kind::Q6K;
    case DType::Q8_0: return Kind::Q8_0;
    case DType::F16: return Kind::F16;
    case DType::BF16: return Kind::BF16;
    case DType::F32: return Kind::F32;
    default: return Kind::Generic;
  }
}

template <int B>
void launch_matvec(const MatvecGroup& g, Kind kind, const ActQ8& act, const float* x, bool accumulate, cudaStream_t stream) {
  const dim3 grid((unsigned)((g.first_row[g.n] + kWarps - 1) / kWarps)), block(kWarps * 32);
  const bool pdl = pdl_enabled();
  switch (kind) {
    case Kind::Q4K: launch(matvec_kernel<B, Kind::Q4K>, grid, block, 0, stream, pdl, g, act, x, accumulate); return;
    case Kind::Q5K: launch(matvec_kernel<B, Kind::Q5K>, grid, block, 0, stream, pdl, g, act, x, accumulate); return;
    case Kind::Q6K: launch(matvec_kernel<B, Kind::Q6K>, grid, block, 0, stream, pdl, g, act, x, accumulate); return;
    case Kind::Q8_0: launch(matvec_kernel<B, Kind::Q8_0>, grid, block, 0, stream, pdl, g, act, x, accumulate); return;
    case Kind::F16: launch(matvec_kernel<B, Kind::F16>, grid, block, 0, stream, pdl, g, act, x, accumulate); return;
    case Kind::BF16: launch(matvec_kernel<B, Kind::BF16>, grid, block, 0, stream, pdl, g, act, x, accumulate); return;
    case Kind::F32: launch(matvec_kernel<B, Kind::F32>, grid, block, 0, stream, pdl, g, act, x, accumulate); return;
    case Kind::Generic: launch(matvec_kernel<B, Kind::Generic>, grid, block, 0, stream, pdl, g, act, x, accumulate); return;
  }
}

}  // namespace

bool matvec_uses_q8(DType type) {
  return type == DType::Q4_K || type == DType::Q5_K || type == DType::Q6_K || type == DType::Q8_0;
}

bool matvec_can_group(const DeviceWeight& a, const DeviceWeight& b) {
  return kind_of(a) == kind_of(b) && a.cols == b.cols;
}

void matvec_multi(const DeviceWeight* const* ws, float* const* ys, const int* ldys, int count, const ActQ8& act,
                  const float* x, int n_tokens, bool accumulate, cudaStream_t stream) {
  if (count < 1 || count > MatvecGroup::kMax) fail("internal error: a matvec group of {} products", count);
  MatvecGroup g;
  g.n = count;
  g.first_row[0] = 0;
  for (int m = 0; m < count; ++m) {
    if (!matvec_can_group(*ws[0], *ws[m])) fail("internal error: grouped matvec over different weight kinds or widths");
    g.w[m] = *ws[m];
    g.y[m] = ys[m];
    g.ldy[m] = ldys[m];
    g.first_row[m + 1] = g.first_row[m] + ws[m]->rows;
  }
  const Kind kind = kind_of(*ws[0]);
  switch (n_tokens) {
    case 1: launch_matvec<1>(g, kind, act, x, accumulate, stream); break;
    case 2: launch_matvec<2>(g, kind, act, x, accumulate, stream); break;
    case 3: launch_matvec<3>(g, kind, act, x, accumulate, stream); break;
    case 4: launch_matvec<4>(g, kind, act, x, accumulate, stream); break;
    case 5: launch_matvec<5>(g, kind, act, x, accumulate, stream); break;
    case 6: launch_matvec<6>(g, kind, act, x, accumulate, stream); break;
    case 7: launch_matvec<7>(g, kind, act, x, accumulate, stream); break;
    case 8: launch_matvec<8>(g, kind, act, x, accumulate, stream); break;
    default: fail("internal error: matvec of {} tokens (at most 8)", n_tokens);
  }
}

void matvec(const DeviceWeight& w, const ActQ8& act, const float* x, int n_tokens, float* y, int ldy, bool accumulate,
            cudaStream_t stream) {
  const DeviceWeight* ws[1] = {&w};
  float* ys[1] = {y};
  const int ldys[1] = {ldy};
  matvec_multi(ws, ys, ldys, 1, act, x, n_tokens, accumulate, stream);
}

}  // namespace roofline::cuda
