// SPDX-License-Identifier: Apache-2.0
// FP16 / BF16 <-> FP32 conversions on raw bits, exact and round-to-nearest-even, for host
// code (the CPU backend, tests). Device code uses the CUDA intrinsics instead.
#pragma once

#include <stdint.h>

#include "e4m3.cuh"

namespace qsakv {
namespace halfbits {

QSAKV_HD float fp16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1Fu;
  uint32_t m = h & 0x3FFu;
  if (e == 0x1Fu) return e4m3::bits_f32(sign | 0x7F800000u | (m << 13));
  if (e == 0u) {
    if (m == 0u) return e4m3::bits_f32(sign);
    const float v = static_cast<float>(m) * (1.0f / 16777216.0f);  // m * 2^-24, exact
    return sign ? -v : v;
  }
  return e4m3::bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

QSAKV_HD uint16_t f32_to_fp16(float f) {
  const uint32_t x = e4m3::f32_bits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t a = x & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return sign | 0x7E00u | static_cast<uint16_t>((a >> 13) & 0x1FFu);
  if (a >= 0x477FF000u) return sign | 0x7C00u;  // rounds to >= 65520: infinity
  const int exp = static_cast<int>(a >> 23) - 127;
  if (exp < -14) {
    // Subnormal: value * 2^24, rounded half to even.
    if (exp < -25) return sign;
    const uint32_t mant = (a & 0x7FFFFFu) | 0x800000u;
    const int shift = 23 - (exp + 24);  // >= 14
    const uint32_t whole = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1);
    return sign |
           static_cast<uint16_t>(whole + ((rem > half || (rem == half && (whole & 1u))) ? 1u : 0u));
  }
  uint32_t code = (static_cast<uint32_t>(exp + 15) << 10) | ((a >> 13) & 0x3FFu);
  const uint32_t rem = a & 0x1FFFu;
  if (rem > 0x1000u || (rem == 0x1000u && (code & 1u))) code += 1u;
  return sign | static_cast<uint16_t>(code);
}

QSAKV_HD float bf16_to_f32(uint16_t h) { return e4m3::bits_f32(static_cast<uint32_t>(h) << 16); }

QSAKV_HD uint16_t f32_to_bf16(float f) {
  const uint32_t x = e4m3::f32_bits(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  const uint32_t lsb = (x >> 16) & 1u;
  return static_cast<uint16_t>((x + 0x7FFFu + lsb) >> 16);
}

}  // namespace halfbits
}  // namespace qsakv
