// The weights of the batched-decode products (9-64 rows) as the tensor-core kernels take them: one Q4_K
// or Q6_K row's super-block staged in shared memory, then dequantized by the four lanes that share the
// row in the mma fragment layout straight into f16 A fragments. Shared by the mma.sync kernel
// (cuda_gemm.cu) and the Hopper warpgroup kernel (cuda_wgmma_rows.cu), which take the same fragments.
#pragma once

#include <cstdint>
#include <cstring>

#include "backend/cuda/cuda_kernels.cuh"
#include "backend/cuda/cuda_mma.cuh"

namespace roofline::cuda {

// --- Batched decode (9..64 rows): weights dequantized in registers, f16 tensor-core mma ---
// Each warp owns 16 x MT weight rows (MT m16 tiles) and every token (NT n8 tiles). The four lanes that
// share a row in the mma fragment layout (lane = 4 * row_in_tile + t) read that row's super-block
// with 16-byte loads, dequantize their 64 weights straight into A fragments (f16), and multiply them
// with activations prepared by to_f16_fragments_kernel. The order of the 16 weights of one k16 step inside a
// fragment does not matter as long as A and B agree, so each lane takes groups of 4 consecutive
// weights in the order its loads deliver them, and the activations are stored with each group of 4
// as (x0, x2, x1, x3): then one 8-byte load is exactly a lane's B fragment (k-slots 2t, 2t+1 hold
// x0, x2 and 2t+8, 2t+9 hold x1, x3; the weight nibbles of bytes 0 and 2 land in one half2 with one
// mask). Weights go from DRAM to registers once per step; activations come through L1, laid out in
// the order the warps read them: one 16-byte load per lane and n tile holds two k16 steps' B
// fragments, and a warp's 32 loads are 512 consecutive bytes (4 cache lines; gathered from the token
// rows they touched 16 lines, which made the L1 the bottleneck at 64 tokens).
__device__ __forceinline__ uint32_t h2_bits(__half2 h) {
  uint32_t u;
  memcpy(&u, &h, 4);
  return u;
}
__device__ __forceinline__ __half2 bits_h2(uint32_t u) {
  __half2 h;
  memcpy(&h, &u, 4);
  return h;
}

// (v & MASK) | 0x64006400 in one logic instruction: the halves of the result are 1024 + the masked bits (< 1024),
// from which a subtraction of 1024 gives the small unsigned integers exactly. Written as C, the compiler splits
// it in two (an instruction takes one 32-bit immediate); the exponent bits come from a register here.
template <uint32_t MASK>
__device__ __forceinline__ uint32_t masked_with_exponent(uint32_t v) {
  uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(r) : "r"(v), "n"(MASK), "r"(0x64006400u));  // (a & b) | c
  return r;
}

// One row's super-block as lane t holds it. Q4_K (GGUF blocks): header + quant bytes [16t, 16t+16) and
// [64+16t, 64+16t+16); load h, word u, nibble p hold elements 4u..4u+3 of sub-block 2(2h + t/2) + p at
// byte offset 16(t%2) of that sub-block. Q6_K (planes): low nibbles of chunk c = t + 4h (elements
// 32c..32c+31) and its 2-bit highs; word u, part p -> elements 32c + 16p + 4u.
template <DType T>
struct RowBlock;

// A warp stages the super-blocks of its rows in shared memory, kSlotBytes per row slot (8 rows: lane
// 4g + t reads row g): copy() issues the lane's share of the asynchronous copies (its own quant bytes,
// and with `shared_part` the bytes the row's four lanes share), from_smem() fills the registers.
template <>
struct RowBlock<DType::Q4_K> {
  uint32_t dm, sc[3];  // d and dmin (f16 pair), 12 bytes of packed 6-bit scales and mins
  uint32_t q[8];
  // [0, 512): each lane's quant bytes [16t, 16t+16), [512, 1024): [64+16t, ...), [1024, 1152): headers by g
  static constexpr int kSlotBytes = 1152;
  static __device__ __forceinline__ void copy(const DeviceWeight& w, int64_t row, int64_t sb, int lane, bool shared_part, uint8_t* slot) {
    const uint8_t* blk = w.data + row * w.row_bytes + sb * 144;
    const int t = lane % 4;
    copy_async<16>(slot + 16 * lane, blk + 16 + 16 * t);
    copy_async<16>(slot + 512 + 16 * lane, blk + 80 + 16 * t);
    if (shared_part) copy_async<16>(slot + 1024 + 16 * (lane / 4), blk);
  }
  // copy() of one row's super-blocks in turn from a pointer that steps 144 bytes a super-block, so that a loop's copies
  // cost no 64-bit multiply of the row and super-block (the warpgroup kernel's bulk pipeline). The pointer is this
  // lane's first quant piece, so that its other piece and the header (copied by lane t = T_SHARED of each row) are
  // constant offsets from it.
  struct Cursor {
    const uint8_t* p;  // the row's current super-block + 16 + 16 t
    Cursor() = default;
    __device__ __forceinline__ Cursor(const DeviceWeight& w, int64_t row, int64_t sb, int lane)
        : p(w.data + row * w.row_bytes + sb * 144 + 16 + 16 * (lane % 4)) {}
    template <int T_SHARED>
    __device__ __forceinline__ void copy(int lane, bool shared_part, uint8_t* slot) const {
      copy_async<16>(slot + 16 * lane, p);
      copy_async<16>(slot + 512 + 16 * lane, p + 64);
      if (shared_part) copy_async<16>(slot + 1024 + 16 * (lane / 4), p - 16 - 16 * T_SHARED);  // lane t = T_SHARED: the header
    }
    __device__ __forceinline__ void next() { p += 144; }
  };
  // Slot i of a warp's row slots as a tensor map's box leaves them (the warpgroup kernel's TMA weights): row r's whole
  // 144-byte block at 144 r, r = 8 i + g. (The two rows of a quarter-warp's 16-byte loads start 16 bytes apart modulo
  // 128, so three of four pieces meet another row's in a bank: two passes for those loads.)
  __device__ __forceinline__ void from_smem_rows(const uint8_t* warp_slots, int i, int lane, bool) {
    const uint8_t* blk = warp_slots + 144 * (8 * i + lane / 4);
    const int t = lane % 4;
    const int4 hdr = *reinterpret_cast<const int4*>(blk);
    const int4 q0 = *reinterpret_cast<const int4*>(blk + 16 + 16 * t);
    const int4 q1 = *reinterpret_cast<const int4*>(blk + 80 + 16 * t);
    dm = hdr.x; sc[0] = hdr.y; sc[1] = hdr.z; sc[2] = hdr.w;
    q[0] = q0.x; q[1] = q0.y; q[2] = q0.z; q[3] = q0.w;
    q[4] = q1.x; q[5] = q1.y; q[6] = q1.z; q[7] = q1.w;
  }
  __device__ __forceinline__ void from_smem(const uint8_t* slot, int lane, bool) {
    const int4 hdr = *reinterpret_cast<const int4*>(slot + 1024 + 16 * (lane / 4));
    const int4 q0 = *reinterpret_cast<const int4*>(slot + 16 * lane);
    const int4 q1 = *reinterpret_cast<const int4*>(slot + 512 + 16 * lane);
    dm = hdr.x; sc[0] = hdr.y; sc[1] = hdr.z; sc[2] = hdr.w;
    q[0] = q0.x; q[1] = q0.y; q[2] = q0.z; q[3] = q0.w;
    q[4] = q1.x; q[5] = q1.y; q[6] = q1.z; q[7] = q1.w;
  }
  // Scale and offset (as half2 broadcasts) of the sub-block of load h, nibble p: w = q * scale - offset.
  // (Register selects only: a run-time index into these arrays would put them in local memory.) The four
  // 6-bit scales (and mins) of load h's sub-blocks are unpacked together, one byte each; one byte
  // permutation then pairs the lane's scale and min (sub-block 4h + 2(t/2) + p: `sel` = lane_scale_selector)
  // and they become halves exactly through the 1024 + n trick, multiplied by d and dmin in one half2
  // product (d * sc rounds to half once, as a float product converted would). Integer and logic
  // instructions are what this kernel's issue slots are short of (ncu at 16 tokens: the ALU pipe the
  // busiest), so the unpacking is shared by the lane's two sub-blocks of each load.
  static __device__ __forceinline__ uint32_t lane_scale_selector(int t, int p) {
    const uint32_t b = 2 * (t / 2) + p;  // the byte of the lane's sub-block in the four unpacked scales
    return b | (b << 4) | ((b + 4) << 8) | ((b + 4) << 12);
  }
  __device__ __forceinline__ void scales(int h, uint32_t sel, __half2& scale, __half2& offset) const {
    uint32_t s4, m4;  // byte j: scale (min) of sub-block 4h + j
    if (h == 0) {
      s4 = sc[0] & 0x3F3F3F3Fu;
      m4 = sc[1] & 0x3F3F3F3Fu;
    } else {
      s4 = (sc[2] & 0x0F0F0F0Fu) | ((sc[0] >> 2) & 0x30303030u);
      m4 = ((sc[2] >> 4) & 0x0F0F0F0Fu) | ((sc[1] >> 2) & 0x30303030u);
    }
    const uint32_t pair = masked_with_exponent<0x00FF00FFu>(__byte_perm(s4, m4, sel));  // (1024 + sc, 1024 + m)
    const __half2 sm = __hmul2(__hsub2(bits_h2(pair), bits_h2(0x64006400u)), bits_h2(dm));  // (d * sc, dmin * m)
    scale = __low2half2(sm);
    offset = __high2half2(sm);
  }
  // A-fragment halves for word u of load h, nibble p: (e0, e2) and (e1, e3). The nibbles become halves
  // exactly: low ones as (1024 + q) - 1024, high ones in place as (1024 + 16 q) / 16 - 64 (no shift).
  // Bytes 1 and 3 come down by a shift for the low nibbles and by a byte permutation (which brings the
  // exponent bits too) for the high ones: two forms, so the compiler does not keep the shifted words
  // of every row alive between the two nibbles' products (registers this kernel does not have).
  __device__ __forceinline__ void group(int h, int p, int u, __half2 scale, __half2 offset, uint32_t& lo, uint32_t& hi) const {
    const uint32_t w = q[4 * h + u];
    __half2 v02, v13;
    if (p == 0) {
      const __half2 k1024 = bits_h2(0x64006400u);
      v02 = __hsub2(bits_h2(masked_with_exponent<0x000F000Fu>(w)), k1024);
      v13 = __hsub2(bits_h2(masked_with_exponent<0x000F000Fu>(w >> 8)), k1024);
    } else {
      const __half2 sixteenth = bits_h2(0x2C002C00u), minus64 = bits_h2(0xD400D400u);
      v02 = __hfma2(bits_h2(masked_with_exponent<0x00F000F0u>(w)), sixteenth, minus64);
      v13 = __hfma2(bits_h2(__byte_perm(w, 0x64646464u, 0x4341) & 0xFFF0FFF0u), sixteenth, minus64);
    }
    lo = h2_bits(__hfma2(v02, scale, __hneg2(offset)));
    hi = h2_bits(__hfma2(v13, scale, __hneg2(offset)));
  }
  // Offset in halves, inside the super-block, of the activations of word u of load h, nibble p.
  static __device__ __forceinline__ int x_offset(int h, int p, int u, int t) { return 64 * (t / 2) + 16 * (t % 2) + 128 * h + 32 * p + 4 * u; }

  // The warpgroup kernel's folded form (cuda_wgmma_rows.cu, ROOFLINE_WGMMA_FOLD): the mins are a product of their own
  // with the sub-blocks' sums (the tiles' 17th step: min_fragment), so a weight is q * scale alone, one fused
  // multiply-add from its nibble in place: (1024 + q) * scale - 1024 * scale for the low nibbles, (1024 + 16 q) * scale -
  // 1024 * scale for the high ones, exactly round(q * scale) and round(16 q * scale) (which multiply activations stored
  // divided by 16: WgTiles::folded). scale2: d * sc in both halves, as (1024 + sc) * d - 1024 * d in one fused
  // multiply-add (exact before its one rounding, so round(d * sc) as a product would give; d2 and neg1024d, d and -1024
  // d in both halves, once a row: folded_d); bias2: -1024 times it.
  __device__ __forceinline__ void folded_d(__half2& d2, __half2& neg1024d) const {
    d2 = __low2half2(bits_h2(dm));
    neg1024d = __hmul2(d2, bits_h2(0xE400E400u));
  }
  static __device__ __forceinline__ uint32_t lane_scale_selector_folded(int t, int p) {
    const uint32_t b = 2 * (t / 2) + p;  // the byte of the lane's sub-block in the four unpacked scales; 4: 0x64
    return b | (4u << 4) | (b << 8) | (4u << 12);
  }
  __device__ __forceinline__ void scales_folded(int h, uint32_t sel, __half2 d2, __half2 neg1024d, __half2& scale2, __half2& bias2) const {
    const uint32_t s4 = h == 0 ? sc[0] & 0x3F3F3F3Fu : (sc[2] & 0x0F0F0F0Fu) | ((sc[0] >> 2) & 0x30303030u);
    const uint32_t pair = __byte_perm(s4, 0x64646464u, sel);  // (1024 + sc, 1024 + sc)
    scale2 = __hfma2(bits_h2(pair), d2, neg1024d);
    bias2 = __hmul2(scale2, bits_h2(0xE400E400u));  // times -1024: exact
  }
  __device__ __forceinline__ void group_folded(int h, int p, int u, __half2 scale2, __half2 bias2, uint32_t& lo, uint32_t& hi) const {
    const uint32_t w = q[4 * h + u];
    if (p == 0) {
      lo = h2_bits(__hfma2(bits_h2(masked_with_exponent<0x000F000Fu>(w)), scale2, bias2));
      hi = h2_bits(__hfma2(bits_h2(masked_with_exponent<0x000F000Fu>(w >> 8)), scale2, bias2));
    } else {
      lo = h2_bits(__hfma2(bits_h2(masked_with_exponent<0x00F000F0u>(w)), scale2, bias2));
      hi = h2_bits(__hfma2(bits_h2(masked_with_exponent<0x00F000F0u>(w >> 8)), scale2, bias2));
    }
  }
  // The A fragment half pair of the 17th step for lane t: columns 2t and 2t + 1 (and 2t + 8, 2t + 9: the sums' remainders)
  // are sub-blocks 2t and 2t + 1, whose weights' mins are -dmin * m.
  static constexpr int kSumSteps = 1;
  __device__ __forceinline__ uint32_t min_fragment(int t, int) const {
    const uint32_t m4 = t < 2 ? sc[1] & 0x3F3F3F3Fu : ((sc[2] >> 4) & 0x0F0F0F0Fu) | ((sc[1] >> 2) & 0x30303030u);
    const uint32_t b = 2 * (t % 2);
    const uint32_t pair = __byte_perm(m4, 0x64646464u, b | (4u << 4) | ((b + 1) << 8) | (4u << 12));  // (1024 + m, 1024 + m')
    return h2_bits(__hmul2(__hsub2(bits_h2(pair), bits_h2(0x64006400u)), __hneg2(__high2half2(bits_h2(dm)))));
  }
};

template <>
struct RowBlock<DType::Q6_K> {
  uint32_t lo[8], hi[4];
  uint32_t sc[4];  // 16 int8 sub-block scales
  __half d;
  // [0, 1024): each lane's low nibbles [16t, +16) and [64+16t, +16); [1024, 1536): its high bits [8t, +8)
  // and [32+8t, +8); [1536, 1664): the 16 scales by g; [1664, 1696): by g, the aligned 4 bytes holding d.
  static constexpr int kSlotBytes = 1696;
  static __device__ __forceinline__ void copy(const DeviceWeight& w, int64_t row, int64_t sb, int lane, bool shared_part, uint8_t* slot) {
    const int64_t n_sb = w.cols / 256;
    const uint8_t* lo_p = w.data + row * (w.cols / 2) + sb * 128;
    const uint8_t* hi_p = w.plane1 + row * (w.cols / 4) + sb * 64;
    const int t = lane % 4, g = lane / 4;
    copy_async<16>(slot + 16 * lane, lo_p + 16 * t);
    copy_async<16>(slot + 512 + 16 * lane, lo_p + 64 + 16 * t);
    copy_async<8>(slot + 1024 + 8 * lane, hi_p + 8 * t);
    copy_async<8>(slot + 1280 + 8 * lane, hi_p + 32 + 8 * t);
    if (shared_part) {
      copy_async<16>(slot + 1536 + 16 * g, w.plane2 + row * (w.cols / 16) + sb * 16);
      const int64_t di = row * n_sb + sb;  // d's index; the copy takes the 4-byte word holding it
      copy_async<4>(slot + 1664 + 4 * g, w.plane3 + 2 * (di & ~(int64_t)1));
    }
  }
  // copy() of one row's super-blocks in turn from pointers that step a super-block at a time (see RowBlock<Q4_K>::Cursor):
  // this lane's low nibbles and high bits, the row's scales, and d_at, d's byte in plane 3, whose 4-byte word the copy
  // takes (plane 3 is 4-byte aligned, as copy() assumes).
  struct Cursor {
    const uint8_t *lo_p, *hi_p, *sc_p, *d_at;
    Cursor() = default;
    __device__ __forceinline__ Cursor(const DeviceWeight& w, int64_t row, int64_t sb, int lane)
        : lo_p(w.data + row * (w.cols / 2) + sb * 128 + 16 * (lane % 4)), hi_p(w.plane1 + row * (w.cols / 4) + sb * 64 + 8 * (lane % 4)),
          sc_p(w.plane2 + row * (w.cols / 16) + sb * 16), d_at(w.plane3 + 2 * (row * (w.cols / 256) + sb)) {}
    template <int>
    __device__ __forceinline__ void copy(int lane, bool shared_part, uint8_t* slot) const {
      const int g = lane / 4;
      copy_async<16>(slot + 16 * lane, lo_p);
      copy_async<16>(slot + 512 + 16 * lane, lo_p + 64);
      copy_async<8>(slot + 1024 + 8 * lane, hi_p);
      copy_async<8>(slot + 1280 + 8 * lane, hi_p + 32);
      if (shared_part) {
        copy_async<16>(slot + 1536 + 16 * g, sc_p);
        copy_async<4>(slot + 1664 + 4 * g, reinterpret_cast<const uint8_t*>(reinterpret_cast<uintptr_t>(d_at) & ~(uintptr_t)3));
      }
    }
    __device__ __forceinline__ void next() { lo_p += 128, hi_p += 64, sc_p += 16, d_at += 2; }
  };
  // A warp's row slots as the warpgroup kernel's TMA weights leave them: the tensor maps' boxes of 16 rows' low nibbles
  // (128 bytes a row), high bits (64) and scales (16), then d's 4-byte words (copy_d_word); row r = 8 i + g of slot i.
  static constexpr int kRowsLo = 0, kRowsHi = 16 * 128, kRowsSc = kRowsHi + 16 * 64, kRowsD = kRowsSc + 16 * 16;
  static_assert(kRowsD + 16 * 4 <= 2 * kSlotBytes, "a warp's TMA rows fit its two slots");
  static __device__ __forceinline__ void copy_d_word(uint8_t* warp_slots, int i, int lane, const uint8_t* d_at) {
    copy_async<4>(warp_slots + kRowsD + 4 * (8 * i + lane / 4), reinterpret_cast<const uint8_t*>(reinterpret_cast<uintptr_t>(d_at) & ~(uintptr_t)3));
  }
  __device__ __forceinline__ void from_smem_rows(const uint8_t* warp_slots, int i, int lane, bool odd) {
    const int r = 8 * i + lane / 4, t = lane % 4;
    const int4 l0 = *reinterpret_cast<const int4*>(warp_slots + kRowsLo + 128 * r + 16 * t);
    const int4 l1 = *reinterpret_cast<const int4*>(warp_slots + kRowsLo + 128 * r + 64 + 16 * t);
    const int2 h0 = *reinterpret_cast<const int2*>(warp_slots + kRowsHi + 64 * r + 8 * t);
    const int2 h1 = *reinterpret_cast<const int2*>(warp_slots + kRowsHi + 64 * r + 32 + 8 * t);
    const int4 s = *reinterpret_cast<const int4*>(warp_slots + kRowsSc + 16 * r);
    const uint32_t dw = *reinterpret_cast<const uint32_t*>(warp_slots + kRowsD + 4 * r);
    set(l0, l1, h0, h1, s, dw, odd);
  }
  // `odd`: d is the high half of its word (row * n_sb + sb odd).
  __device__ __forceinline__ void from_smem(const uint8_t* slot, int lane, bool odd) {
    const int g = lane / 4;
    const int4 l0 = *reinterpret_cast<const int4*>(slot + 16 * lane);
    const int4 l1 = *reinterpret_cast<const int4*>(slot + 512 + 16 * lane);
    const int2 h0 = *reinterpret_cast<const int2*>(slot + 1024 + 8 * lane);
    const int2 h1 = *reinterpret_cast<const int2*>(slot + 1280 + 8 * lane);
    const int4 s = *reinterpret_cast<const int4*>(slot + 1536 + 16 * g);
    const uint32_t dw = *reinterpret_cast<const uint32_t*>(slot + 1664 + 4 * g);
    set(l0, l1, h0, h1, s, dw, odd);
  }
  __device__ __forceinline__ void set(int4 l0, int4 l1, int2 h0, int2 h1, int4 s, uint32_t dw, bool odd) {
    d = __ushort_as_half((unsigned short)(odd ? dw >> 16 : dw & 0xFFFF));
    lo[0] = l0.x; lo[1] = l0.y; lo[2] = l0.z; lo[3] = l0.w;
    lo[4] = l1.x; lo[5] = l1.y; lo[6] = l1.z; lo[7] = l1.w;
    hi[0] = h0.x; hi[1] = h0.y; hi[2] = h1.x; hi[3] = h1.y;
    sc[0] = s.x; sc[1] = s.y; sc[2] = s.z; sc[3] = s.w;
  }
  // Sub-block 2(t + 4h) + p: word 2h + t/2 (bit 8 of the selector), byte 2(t%2) + p (its shift, bits 0-7).
  static __device__ __forceinline__ uint32_t lane_scale_selector(int t, int p) { return (t / 2) << 8 | 8 * (2 * (t % 2) + p); }
  __device__ __forceinline__ void scales(int h, uint32_t sel, __half2& scale, __half2& offset) const {
    const uint32_t word = (sel >> 8) ? sc[2 * h + 1] : sc[2 * h];
    // The signed scale biased by 128 becomes a half exactly (1024 + 128 + sc), then times d.
    const uint32_t biased = ((word >> (sel & 0xFF)) & 0xFF) ^ 0x80;
    const __half sv = __hsub(__ushort_as_half((unsigned short)(0x6400 | biased)), __ushort_as_half((unsigned short)0x6480));
    scale = __half2half2(__hmul(sv, d));
    offset = __half2half2(__ushort_as_half((unsigned short)0));
  }
  // Word u of load h, part p: its 6-bit values (low nibbles | high bits << 4, one per byte) become halves
  // exactly as (1024 + q) - 1056 = q - 32.
  __device__ __forceinline__ void group(int h, int p, int u, __half2 scale, __half2, uint32_t& lo_out, uint32_t& hi_out) const {
    const uint32_t q = ((lo[4 * h + u] >> (4 * p)) & 0x0F0F0F0Fu) | (((hi[2 * h + p] >> (2 * u)) & 0x03030303u) << 4);
    const __half2 bias = bits_h2(0x64206420u);  // 1056
    lo_out = h2_bits(__hmul2(__hsub2(bits_h2(masked_with_exponent<0x00FF00FFu>(q)), bias), scale));
    hi_out = h2_bits(__hmul2(__hsub2(bits_h2(masked_with_exponent<0x00FF00FFu>(q >> 8)), bias), scale));
  }
  static __device__ __forceinline__ int x_offset(int h, int p, int u, int t) { return 32 * t + 128 * h + 16 * p + 4 * u; }

  // The warpgroup kernel's folded form (ROOFLINE_WGMMA_FOLD_Q6): w = scale * (q - 32) as round(q * scale), one fused
  // multiply-add from the 6-bit value, (1024 + q) * scale - 1024 * scale, and the -32 * scale of each sub-block of 16 a
  // product of its own with the sub-blocks' sums (the tiles' 17th and 18th steps: min_fragment). scale2 is scales()'s
  // round(d * sc); bias2 -1024 times it (exact).
  __device__ __forceinline__ void folded_d(__half2& d2, __half2& unused) const { d2 = unused = __half2half2(d); }
  static __device__ __forceinline__ uint32_t lane_scale_selector_folded(int t, int p) { return lane_scale_selector(t, p); }
  __device__ __forceinline__ void scales_folded(int h, uint32_t sel, __half2, __half2, __half2& scale2, __half2& bias2) const {
    __half2 zero;
    scales(h, sel, scale2, zero);
    bias2 = __hmul2(scale2, bits_h2(0xE400E400u));
  }
  __device__ __forceinline__ void group_folded(int h, int p, int u, __half2 scale2, __half2 bias2, uint32_t& lo_out, uint32_t& hi_out) const {
    const uint32_t q = ((lo[4 * h + u] >> (4 * p)) & 0x0F0F0F0Fu) | (((hi[2 * h + p] >> (2 * u)) & 0x03030303u) << 4);
    lo_out = h2_bits(__hfma2(bits_h2(__byte_perm(q, 0x64646464u, 0x4240)), scale2, bias2));  // (1024 + q0, 1024 + q2)
    hi_out = h2_bits(__hfma2(bits_h2(__byte_perm(q, 0x64646464u, 0x4341)), scale2, bias2));  // (1024 + q1, 1024 + q3)
  }
  // The A fragment half pair of sums step s (17th: s = 0, 18th: 1) for lane t: columns 2t and 2t + 1 (and 2t + 8, 2t + 9:
  // the sums' remainders) are sub-blocks 8 s + 2t and 8 s + 2t + 1, whose weights' share of -32 is -32 round(d * sc),
  // d * sc rounded as scales() rounds it.
  static constexpr int kSumSteps = 2;
  __device__ __forceinline__ uint32_t min_fragment(int t, int s) const {
    const uint32_t word = (s == 0 ? (t < 2 ? sc[0] : sc[1]) : (t < 2 ? sc[2] : sc[3])) ^ 0x80808080u;  // biased by 128
    const uint32_t b = 2 * (t % 2);
    const uint32_t pair = __byte_perm(word, 0x64646464u, b | (4u << 4) | ((b + 1) << 8) | (4u << 12));  // 1024 + 128 + sc
    const __half2 sv = __hsub2(bits_h2(pair), bits_h2(0x64806480u));
    return h2_bits(__hmul2(__hmul2(sv, __half2half2(d)), bits_h2(0xD000D000u)));  // times -32: exact
  }
};


}  // namespace roofline::cuda
