// Device dequantization of one 32-element chunk of a weight row, for every tensor type and device
// layout: the generic path (embedding rows, types without a fast kernel, dequantize-for-GEMM).
// The value formulas are the GGUF spec (formats/quant_ref.h is the host reference).
#pragma once

#include "backend/cuda/cuda_common.cuh"
#include "formats/quant_blocks.h"

namespace roofline::cuda {

static __device__ __constant__ int8_t kIQ4NLDevice[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                                          1,    13,   25,  38,  53,  69,  89,  113};

__device__ __forceinline__ float ld_half(const uint8_t* p) {
  __half h;
  memcpy(&h, p, 2);
  return __half2float(h);
}
__device__ __forceinline__ float ld_bf16(const uint8_t* p) {
  uint16_t u;
  memcpy(&u, p, 2);
  return __uint_as_float((uint32_t)u << 16);
}

// Scale and min j (0..7) of a Q4_K/Q5_K block from its 12 packed bytes, byte k being q(k) (memory, or
// registers the block was loaded into).
template <class Bytes>
__device__ __forceinline__ void k4_scale_min_of(int j, Bytes q, int& sc, int& m) {
  if (j < 4) {
    sc = q(j) & 63;
    m = q(j + 4) & 63;
  } else {
    sc = (q(j + 4) & 0xF) | ((q(j - 4) >> 6) << 4);
    m = (q(j + 4) >> 4) | ((q(j) >> 6) << 4);
  }
}
__device__ __forceinline__ void k4_scale_min(int j, const uint8_t* q, int& sc, int& m) {
  k4_scale_min_of(j, [q](int k) { return (int)q[k]; }, sc, m);
}

// Writes elements [32*chunk, 32*chunk + 32) of row `row` as floats.
__device__ inline void dequant_chunk32(const DeviceWeight& w, int64_t row, int64_t chunk, float* out) {
  const int64_t e0 = chunk * 32;
  switch (w.layout) {
    case WeightLayout::Q8_0Planes: {
      const int8_t* q = reinterpret_cast<const int8_t*>(w.data) + row * w.cols + e0;
      const float d = ld_half(w.plane1 + (row * (w.cols / 32) + chunk) * 2);
      for (int i = 0; i < 32; ++i) out[i] = d * q[i];
      return;
    }
    case WeightLayout::Q4_0Planes:
    case WeightLayout::Q4_1Planes:
    case WeightLayout::Q5_0Planes:
    case WeightLayout::Q5_1Planes: {
      // The file's 16 quant bytes (value j in the low nibble of byte j, j + 16 in the high one), f16 d (and m), and for
      // Q5_0/Q5_1 the fifth bits (value e at byte e % 4, bit e / 4); the formulas of the GGUF spec.
      const int64_t c = row * (w.cols / 32) + chunk;
      const uint8_t* q = w.data + c * 16;
      const bool with_min = w.layout == WeightLayout::Q4_1Planes || w.layout == WeightLayout::Q5_1Planes;
      const bool five = w.layout == WeightLayout::Q5_0Planes || w.layout == WeightLayout::Q5_1Planes;
      const float d = ld_half(w.plane1 + c * (with_min ? 4 : 2)), m = with_min ? ld_half(w.plane1 + c * 4 + 2) : 0.0f;
      for (int e = 0; e < 32; ++e) {
        int v = e < 16 ? q[e] & 0xF : q[e - 16] >> 4;
        if (five) v |= ((w.plane2[c * 4 + e % 4] >> (e / 4)) & 1) << 4;
        if (w.type == DType::IQ4_NL) out[e] = d * kIQ4NLDevice[v];
        else if (with_min) out[e] = v * d + m;
        else out[e] = (v - (five ? 16 : 8)) * d;
      }
      return;
    }
    case WeightLayout::Q6KPlanes: {
      const int64_t sb = e0 / 256;
      const int j = (int)((e0 % 256) / 32);
      const uint8_t* lo = w.data + row * (w.cols / 2) + sb * 128 + 16 * j;
      const uint8_t* hi = w.plane1 + row * (w.cols / 4) + sb * 64 + 8 * j;
      const int8_t* sc = reinterpret_cast<const int8_t*>(w.plane2) + row * (w.cols / 16) + sb * 16 + 2 * j;
      const float d = ld_half(w.plane3 + (row * (w.cols / 256) + sb) * 2);
      for (int e = 0; e < 32; ++e) {
        const int half = e / 16, t = e % 16;
        const int nib = half ? (lo[t] >> 4) : (lo[t] & 0xF);
        const int h = (hi[4 * half + (t % 4)] >> (2 * (t / 4))) & 3;
        out[e] = d * (float)sc[half] * (float)((nib | (h << 4)) - 32);
      }
      return;
    }
    case WeightLayout::Q3KPlanes:
    case WeightLayout::Q2KPlanes: {
      // A chunk's 2-bit words (value t of each 16 at byte t % 4, bits 2 * (t / 4)), then per type the rest.
      const int64_t c = row * (w.cols / 32) + chunk, sb = row * (w.cols / 256) + chunk / 8;
      const uint8_t* q = w.data + c * 8;
      if (w.layout == WeightLayout::Q3KPlanes) {
        const uint8_t* hi = w.plane1 + c * 4;
        const int8_t* sc = reinterpret_cast<const int8_t*>(w.plane2) + c * 2;
        const float d = ld_half(w.plane3 + sb * 2);
        for (int e = 0; e < 32; ++e) {
          const int half = e / 16, t = e % 16;
          const int low = (q[4 * half + t % 4] >> (2 * (t / 4))) & 3, sign = (hi[e % 4] >> (e / 4)) & 1;
          out[e] = d * (float)sc[half] * (float)(low - 4 * sign);
        }
      } else {
        const uint8_t* sc = w.plane1 + c * 2;
        const float d = ld_half(w.plane2 + sb * 4), dmin = ld_half(w.plane2 + sb * 4 + 2);
        for (int e = 0; e < 32; ++e) {
          const int half = e / 16, t = e % 16;
          const float dl = d * (sc[half] & 0xF), ml = dmin * (sc[half] >> 4);
          out[e] = dl * ((q[4 * half + t % 4] >> (2 * (t / 4))) & 3) - ml;
        }
      }
      return;
    }
    case WeightLayout::Raw:
      break;
  }
  const uint8_t* rowp = w.data + row * w.row_bytes;
  switch (w.type) {
    case DType::F32: {
      const float* p = reinterpret_cast<const float*>(rowp) + e0;
      for (int i = 0; i < 32; ++i) out[i] = p[i];
      return;
    }
    case DType::F16:
      for (int i = 0; i < 32; ++i) out[i] = ld_half(rowp + (e0 + i) * 2);
      return;
    case DType::BF16:
      for (int i = 0; i < 32; ++i) out[i] = ld_bf16(rowp + (e0 + i) * 2);
      return;
    default:
      break;
  }
  // 256-element super-block types: sub-block s of block b.
  const int64_t blk = chunk / 8;
  const int s = (int)(chunk % 8);
  switch (w.type) {
    case DType::Q4_K:
    case DType::Q5_K: {
      const bool five = w.type == DType::Q5_K;
      const uint8_t* b = rowp + blk * (five ? 176 : 144);
      const float d = ld_half(b), dmin = ld_half(b + 2);
      const uint8_t* scales = b + 4;
      const uint8_t* qh = b + 16;
      const uint8_t* qs = b + (five ? 48 : 16);
      int sc, m;
      k4_scale_min(s, scales, sc, m);
      const float d1 = d * sc, m1 = dmin * m;
      const int c = s / 2, high = s % 2;
      for (int l = 0; l < 32; ++l) {
        int q = high ? (qs[32 * c + l] >> 4) : (qs[32 * c + l] & 0xF);
        if (five && (qh[l] & (1 << s))) q += 16;
        out[l] = d1 * q - m1;
      }
      return;
    }
    case DType::Q6_K: {
      const uint8_t* b = rowp + blk * 210;
      const uint8_t* ql = b;
      const uint8_t* qh = b + 128;
      const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
      const float d = ld_half(b + 208);
      const int n = s / 4, k = s % 4;
      for (int l = 0; l < 32; ++l) {
        const uint8_t byte = ql[64 * n + l + (k & 1) * 32];
        const int nib = k < 2 ? (byte & 0xF) : (byte >> 4);
        const int h = (qh[32 * n + l] >> (2 * k)) & 3;
        out[l] = d * (float)sc[8 * n + l / 16 + 2 * k] * (float)((nib | (h << 4)) - 32);
      }
      return;
    }
    case DType::IQ4_XS: {
      const uint8_t* b = rowp + blk * 136;
      const float d = ld_half(b);
      uint16_t scales_h;
      memcpy(&scales_h, b + 2, 2);
      const int ls = ((b[4 + s / 2] >> (4 * (s % 2))) & 0xF) | (((scales_h >> (2 * s)) & 3) << 4);
      const float dl = d * (float)(ls - 32);
      const uint8_t* qs = b + 8 + 16 * s;
      for (int j = 0; j < 16; ++j) {
        out[j] = dl * kIQ4NLDevice[qs[j] & 0xF];
        out[j + 16] = dl * kIQ4NLDevice[qs[j] >> 4];
      }
      return;
    }
    default:
      for (int i = 0; i < 32; ++i) out[i] = 0.0f;  // unreachable: uploads reject other types
      return;
  }
}

}  // namespace roofline::cuda
