// SPDX-License-Identifier: Apache-2.0
// Element types: sizes and names.
#pragma once

#include <cstddef>
#include <cstdint>

#include "qsakv.h"

namespace qsakv {

// Both take the raw int32 (see enum_value in core/checked.hpp): any value is answered.
inline size_t dtype_size(int32_t d) {
  switch (d) {
    case QSAKV_DTYPE_FP16:
    case QSAKV_DTYPE_BF16:
      return 2;
    case QSAKV_DTYPE_E4M3:
      return 1;
    case QSAKV_DTYPE_FP32:
    case QSAKV_DTYPE_INT32:
      return 4;
    case QSAKV_DTYPE_INT64:
      return 8;
    default:
      return 0;
  }
}

inline const char* dtype_name(int32_t d) {
  switch (d) {
    case QSAKV_DTYPE_FP16:
      return "fp16";
    case QSAKV_DTYPE_BF16:
      return "bf16";
    case QSAKV_DTYPE_E4M3:
      return "e4m3";
    case QSAKV_DTYPE_FP32:
      return "fp32";
    case QSAKV_DTYPE_INT32:
      return "int32";
    case QSAKV_DTYPE_INT64:
      return "int64";
    default:
      return "invalid";
  }
}

}  // namespace qsakv
