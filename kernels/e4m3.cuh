// SPDX-License-Identifier: Apache-2.0
// E4M3 (float8 e4m3fn) codec shared by the CPU backend and the CUDA kernels.
//
// Format: 1 sign, 4 exponent bits (bias 7), 3 mantissa bits; no infinities; NaN is
// S.1111.111 (0x7F/0xFF); largest finite 0x7E = 448; subnormals m * 2^-9.
//
// Store contract: byte = encode(fp32(x) / scale): the division is done in FP32 (an FP16
// division would round ties differently), the quotient is clamped to +-448 (so
// infinities saturate), then rounded to nearest even. NaN stays NaN. This equals
// ml_dtypes.float8_e4m3fn applied to the clamped FP32 quotient, bit for bit.
#pragma once

#include <stdint.h>

#include "hd.cuh"

namespace qsakv {
namespace e4m3 {

constexpr uint8_t kNaN = 0x7F;

QSAKV_HD uint32_t f32_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  __builtin_memcpy(&u, &x, 4);
  return u;
#endif
}

QSAKV_HD float bits_f32(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  __builtin_memcpy(&x, &u, 4);
  return x;
#endif
}

// Quantises an FP32 value (already divided by the scale) to E4M3 with round-to-nearest-
// even and saturation. Integer-only after the clamp, so host and device agree exactly.
QSAKV_HD uint8_t encode(float q) {
  const uint32_t bits = f32_bits(q);
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  uint32_t a = bits & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return sign | kNaN;  // NaN stays NaN
  if (a > 0x43E00000u) a = 0x43E00000u;     // |q| > 448 (inf too) saturates to 448
  const int exp = static_cast<int>(a >> 23) - 127;
  if (exp < -6) {
    // Subnormal range (|q| < 2^-6): code = round_half_even(|q| * 2^9). Build the
    // product's integer and fraction from the FP32 fields without float arithmetic.
    if (a < 0x00800000u) return sign;                   // FP32 subnormals are far below 2^-10
    const uint32_t mant = (a & 0x7FFFFFu) | 0x800000u;  // 1.m * 2^23
    const int shift = 23 - (exp + 9);                   // value*2^9 = mant >> shift, shift >= 21
    if (shift > 31) return sign;                        // < 2^-9 * 2^-8: rounds to 0
    const uint32_t whole = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1);
    uint32_t m = whole + ((rem > half || (rem == half && (whole & 1u))) ? 1u : 0u);
    return static_cast<uint8_t>(sign | m);  // m == 8 is the smallest normal, 0x08
  }
  // Normal range: keep 3 mantissa bits, round half to even; a carry moves into the
  // exponent field by itself.
  uint32_t keep = (a >> 20) & 0x7u;
  const uint32_t rem = a & 0xFFFFFu;
  uint32_t code = (static_cast<uint32_t>(exp + 7) << 3) | keep;
  if (rem > 0x80000u || (rem == 0x80000u && (keep & 1u))) code += 1u;
  if (code > 0x7Eu) code = 0x7Eu;  // unreachable after the clamp; kept safe
  return static_cast<uint8_t>(sign | code);
}

// The store contract in one place: byte = encode(fp32(x) / scale), with NaN keeping its
// sign explicitly (IEEE leaves a NaN quotient's sign to the implementation: x86 keeps
// it, CUDA returns a canonical positive NaN).
QSAKV_HD uint8_t quantize(float x, float scale) {
  if (x != x) return static_cast<uint8_t>(((f32_bits(x) >> 24) & 0x80u) | kNaN);
#if defined(__CUDA_ARCH__)
  return encode(__fdiv_rn(x, scale));
#else
  return encode(x / scale);
#endif
}

// The exact bitcast decoder: builds FP32 bits directly, no exp2, no table.
QSAKV_HD float decode(uint8_t b) {
  const uint32_t sign = static_cast<uint32_t>(b & 0x80u) << 24;
  const uint32_t e = (b >> 3) & 0xFu;
  const uint32_t m = b & 0x7u;
  if (e == 0xFu && m == 0x7u) return bits_f32(sign | 0x7FC00000u);
  if (e == 0u) {
    const float v = static_cast<float>(m) * 0.001953125f;  // m * 2^-9, exact
    return sign ? -v : v;
  }
  return bits_f32(sign | ((e + 120u) << 23) | (m << 20));
}

// ---- E4M3 index keys: one FP32 scale per key --------------------------------------
//
// scale = max |x| / 448 (FP32 division), code = quantize(x, scale); a key whose max is 0,
// or which has a NaN or infinite element, is stored as scale 0 and all codes 0 (it then
// scores 0, as an FP16 key with a NaN element does). key_scale returns that scale from
// the key's max |x| over its finite elements and whether all were finite.
QSAKV_HD float key_scale(float finite_amax, bool all_finite) {
  if (!all_finite || !(finite_amax > 0.0f)) return 0.0f;
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(finite_amax, 448.0f);
#else
  return finite_amax / 448.0f;
#endif
}
QSAKV_HD uint8_t key_code(float x, float scale) { return scale > 0.0f ? quantize(x, scale) : 0; }

// The value an index-key code stands for (times the key's scale), as the tensor-core
// scoring's bitcast conversion reads it: exact for every finite code; the NaN codes
// 0x7F/0xFF, which the store never writes, read as +-480 on every backend.
QSAKV_HD float key_code_value(uint8_t b) {
  if ((b & 0x7Fu) == kNaN) return (b & 0x80u) ? -480.0f : 480.0f;
  return decode(b);
}

}  // namespace e4m3
}  // namespace qsakv
