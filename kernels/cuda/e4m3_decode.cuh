// SPDX-License-Identifier: Apache-2.0
// Packed E4M3 -> FP16 decoders for the attention inner loop. Both produce the same pairs
// from a 32-bit word of four codes [b0 b1 b2 b3] so the two decoders feed identical
// operands to the same MMAs:
//   even = (b0, b2), odd = (b1, b3)  (low half first).
// The software decoder (every GPU) places each code's bits into an FP16 with shifts and
// masks: exact, but the value is code / 256 (the exponent bias differs by 8); the factor
// 256 is folded into the K softmax factor and the V output scale, both powers of two,
// so results are bit-identical to the hardware decoder's. Codes 0x7F/0xFF (NaN) come
// out as 1.875 * 2^0 and are patched by the caller's NaN check (rare path).
#pragma once

#include <stdint.h>

#include "cuda/common.cuh"

namespace qsakv {
namespace cuda {

enum class Decoder { kSoftware = 0, kHardware = 1 };

// The software decoder's values are code/256: the factor to undo in scales.
template <Decoder D>
constexpr float decoded_unit() {
  return D == Decoder::kSoftware ? 256.0f : 1.0f;
}

template <Decoder D>
__device__ __forceinline__ void decode4(uint32_t x, uint32_t& even, uint32_t& odd);

template <>
__device__ __forceinline__ void decode4<Decoder::kSoftware>(uint32_t x, uint32_t& even,
                                                            uint32_t& odd) {
  // (sign at bit 15) | (exp:mant at bits 13..7): FP16 exponent field = E4M3 exponent.
  odd = (x & 0x80008000u) | ((x >> 1) & 0x3F803F80u);
  const uint32_t y = x << 8;
  even = (y & 0x80008000u) | ((y >> 1) & 0x3F803F80u);
}

template <>
__device__ __forceinline__ void decode4<Decoder::kHardware>(uint32_t x, uint32_t& even,
                                                            uint32_t& odd) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  const uint32_t p = prmt(x, x, 0x3120u);  // [b0 b2 b1 b3]
  asm("{\n\t.reg .b16 lo, hi;\n\tmov.b32 {lo, hi}, %2;\n\t"
      "cvt.rn.f16x2.e4m3x2 %0, lo;\n\tcvt.rn.f16x2.e4m3x2 %1, hi;\n\t}"
      : "=r"(even), "=r"(odd)
      : "r"(p));
#else
  // Never launched below SM89 (the context refuses the hardware decoder there).
  (void)x;
  even = odd = 0x7E007E00u;
  __trap();
#endif
}

// True when any of the four codes is NaN (0x7F or 0xFF): adding 1 to each 7-bit
// magnitude carries into bit 7 only for 0x7F.
__device__ __forceinline__ uint32_t nan_bits(uint32_t x) {
  return ((x & 0x7F7F7F7Fu) + 0x01010101u) & 0x80808080u;
}

// Exact per-lane fix for the software decoder: FP16 NaN where the code is NaN.
__device__ __forceinline__ uint32_t patch_nan(uint32_t h2, uint32_t code_lo, uint32_t code_hi) {
  if ((code_lo & 0x7Fu) == 0x7Fu) h2 = (h2 & 0xFFFF0000u) | 0x7E00u;
  if ((code_hi & 0x7Fu) == 0x7Fu) h2 = (h2 & 0x0000FFFFu) | 0x7E000000u;
  return h2;
}

template <Decoder D>
__device__ __forceinline__ void decode4_exact(uint32_t x, uint32_t& even, uint32_t& odd) {
  decode4<D>(x, even, odd);
  if constexpr (D == Decoder::kSoftware) {
    if (nan_bits(x)) {
      even = patch_nan(even, x & 0xFFu, (x >> 16) & 0xFFu);
      odd = patch_nan(odd, (x >> 8) & 0xFFu, x >> 24);
    }
  }
}

// The attention kernels' decoder: the two FP16 pairs of a word of four codes
// [b0 b1 b2 b3] in whichever grouping the decoder produces cheapest. A dot product over
// the four codes may take either, as long as the other operand is grouped alike
// (CodeGrouping below):
//   hardware: lo = (b0, b1), hi = (b2, b3)  (two conversions of the word's halves, without
//             decode4's byte permute: a third of its instructions)
//   software: lo = (b0, b2), hi = (b1, b3)  (decode4's even and odd)
// kExact: the software decoder patches NaN codes (decode4_exact); the hardware one is exact.
template <Decoder D, bool kExact>
__device__ __forceinline__ void decode_pairs(uint32_t x, uint32_t& lo, uint32_t& hi) {
  if constexpr (D == Decoder::kHardware) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    asm("{\n\t.reg .b16 l, h;\n\tmov.b32 {l, h}, %2;\n\t"
        "cvt.rn.f16x2.e4m3x2 %0, l;\n\tcvt.rn.f16x2.e4m3x2 %1, h;\n\t}"
        : "=r"(lo), "=r"(hi)
        : "r"(x));
#else
    (void)x;  // never launched below SM89, as decode4
    lo = hi = 0x7E007E00u;
    __trap();
#endif
  } else if constexpr (kExact) {
    decode4_exact<D>(x, lo, hi);
  } else {
    decode4<D>(x, lo, hi);
  }
}

// prmt selectors that group other operands the way decode_pairs groups codes:
// - kHalvesLo / kHalvesHi: 16-bit values of two words (d0 d1) (d2 d3) into the pair that
//   meets decode_pairs' lo / hi (hardware (d0 d1) / (d2 d3), software (d0 d2) / (d1 d3));
// - kCodesLo / kCodesHi: codes of two words x, y into one word whose decode_pairs gives
//   lo = (x.b0, y.b0), hi = (x.b1, y.b1) (kCodesLo) or the same of bytes 2 and 3 (kCodesHi).
template <Decoder D>
struct CodeGrouping;
template <>
struct CodeGrouping<Decoder::kHardware> {
  static constexpr uint32_t kHalvesLo = 0x3210u, kHalvesHi = 0x7654u;
  static constexpr uint32_t kCodesLo = 0x5140u, kCodesHi = 0x7362u;
};
template <>
struct CodeGrouping<Decoder::kSoftware> {
  static constexpr uint32_t kHalvesLo = 0x5410u, kHalvesHi = 0x7632u;
  static constexpr uint32_t kCodesLo = 0x5410u, kCodesHi = 0x7632u;
};

}  // namespace cuda
}  // namespace qsakv
