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
    case WeightLayout::Q4_0Planes: {
      const uint8_t* q = w.data + (row * (w.cols / 32) + chunk) * 16;
      const float d = ld_half(w.plane1 + (row * (w.cols / 32) + chunk) * 2);
      for (int j = 0; j < 16; ++j) {
        out[j] = ((q[j] & 0xF) - 8) * d;
        out[j + 16] = ((q[j] >> 4) - 8) * d;
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
    case DType::Q4_0: {
      const uint8_t* b = rowp + chunk * 18;
      const float d = ld_half(b);
      for (int j = 0; j < 16; ++j) {
        out[j] = ((b[2 + j] & 0xF) - 8) * d;
        out[j + 16] = ((b[2 + j] >> 4) - 8) * d;
      }
      return;
    }
    case DType::Q4_1: {
      const uint8_t* b = rowp + chunk * 20;
      const float d = ld_half(b), m = ld_half(b + 2);
      for (int j = 0; j < 16; ++j) {
        out[j] = (b[4 + j] & 0xF) * d + m;
        out[j + 16] = (b[4 + j] >> 4) * d + m;
      }
      return;
    }
    case DType::Q5_0: {
      const uint8_t* b = rowp + chunk * 22;
      const float d = ld_half(b);
      uint32_t qh;
      memcpy(&qh, b + 2, 4);
      for (int j = 0; j < 16; ++j) {
        const int h0 = ((qh >> j) << 4) & 0x10, h1 = (qh >> (j + 12)) & 0x10;
        out[j] = (((b[6 + j] & 0xF) | h0) - 16) * d;
        out[j + 16] = (((b[6 + j] >> 4) | h1) - 16) * d;
      }
      return;
    }
    case DType::Q5_1: {
      const uint8_t* b = rowp + chunk * 24;
      const float d = ld_half(b), m = ld_half(b + 2);
      uint32_t qh;
      memcpy(&qh, b + 4, 4);
      for (int j = 0; j < 16; ++j) {
        const int h0 = ((qh >> j) << 4) & 0x10, h1 = (qh >> (j + 12)) & 0x10;
        out[j] = ((b[8 + j] & 0xF) | h0) * d + m;
        out[j + 16] = ((b[8 + j] >> 4) | h1) * d + m;
      }
      return;
    }
    case DType::Q8_0: {
      const uint8_t* b = rowp + chunk * 34;
      const float d = ld_half(b);
      for (int j = 0; j < 32; ++j) out[j] = d * (float)(int8_t)b[2 + j];
      return;
    }
    case DType::IQ4_NL: {
      const uint8_t* b = rowp + chunk * 18;
      const float d = ld_half(b);
      for (int j = 0; j < 16; ++j) {
        out[j] = d * kIQ4NLDevice[b[2 + j] & 0xF];
        out[j + 16] = d * kIQ4NLDevice[b[2 + j] >> 4];
      }
      return;
    }
    default:
      break;
  }
  // 256-element super-block types: sub-block s of block b.
  const int64_t blk = chunk / 8;
  const int s = (int)(chunk % 8);
  switch (w.type) {
    case DType::Q2_K: {
      const uint8_t* b = rowp + blk * 84;
      const float d = ld_half(b + 80), dmin = ld_half(b + 82);
      const int n = s / 4, pass = s % 4;
      for (int part = 0; part < 2; ++part) {
        const int sc = b[8 * n + 2 * pass + part];
        const float dl = d * (sc & 0xF), ml = dmin * (sc >> 4);
        for (int l = 0; l < 16; ++l) out[16 * part + l] = dl * ((b[16 + 32 * n + 16 * part + l] >> (2 * pass)) & 3) - ml;
      }
      return;
    }
    case DType::Q3_K: {
      const uint8_t* b = rowp + blk * 110;
      const uint8_t* hmask = b;
      const uint8_t* qs = b + 32;
      const uint8_t* sb = b + 96;
      const float d = ld_half(b + 108);
      const int n = s / 4, pass = s % 4;
      for (int part = 0; part < 2; ++part) {
        const int i = 8 * n + 2 * pass + part;
        const int low = i < 8 ? (sb[i] & 0xF) : (sb[i - 8] >> 4);
        const int high = (sb[8 + i % 4] >> (2 * (i / 4))) & 3;
        const float dl = d * (float)((low | (high << 4)) - 32);
        const int m = 1 << (4 * n + pass);
        for (int l = 0; l < 16; ++l) {
          const int q2 = (qs[32 * n + 16 * part + l] >> (2 * pass)) & 3;
          out[16 * part + l] = dl * (float)(q2 - ((hmask[16 * part + l] & m) ? 0 : 4));
        }
      }
      return;
    }
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
