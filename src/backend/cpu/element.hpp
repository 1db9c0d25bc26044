// SPDX-License-Identifier: Apache-2.0
// Loading and storing one element of a given dtype as FP32 on the host.
#pragma once

#include <cstdint>

#include "e4m3.cuh"
#include "half_bits.cuh"
#include "qsakv.h"

namespace qsakv {
namespace cpu {

inline float load_f32(const void* base, int64_t i, qsakv_dtype t) {
  switch (t) {
    case QSAKV_DTYPE_FP16:
      return halfbits::fp16_to_f32(static_cast<const uint16_t*>(base)[i]);
    case QSAKV_DTYPE_BF16:
      return halfbits::bf16_to_f32(static_cast<const uint16_t*>(base)[i]);
    case QSAKV_DTYPE_E4M3:
      return e4m3::decode(static_cast<const uint8_t*>(base)[i]);
    default:
      return static_cast<const float*>(base)[i];
  }
}

inline void store_from_f32(void* base, int64_t i, qsakv_dtype t, float x) {
  switch (t) {
    case QSAKV_DTYPE_FP16:
      static_cast<uint16_t*>(base)[i] = halfbits::f32_to_fp16(x);
      break;
    case QSAKV_DTYPE_BF16:
      static_cast<uint16_t*>(base)[i] = halfbits::f32_to_bf16(x);
      break;
    default:
      static_cast<float*>(base)[i] = x;
      break;
  }
}

}  // namespace cpu
}  // namespace qsakv
