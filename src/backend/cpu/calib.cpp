// SPDX-License-Identifier: Apache-2.0
// Reference calibration statistics: the same bin table as the GPU, one value at a time.
#include <algorithm>
#include <cstring>

#include "backend/cpu/cpu_kernels.hpp"
#include "half_bits.cuh"

namespace qsakv {
namespace cpu {

namespace {
void observe_one(const uint16_t* x, int64_t n, qsakv_dtype act, const uint16_t* table,
                 uint64_t* words, float* max_abs) {
  uint64_t finite = 0, nonzero = 0;
  float mx = *max_abs;
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t code = table[x[i]];
    if (code == calib::kCodeNonFinite) continue;
    ++finite;
    if (code == calib::kCodeZero) continue;
    ++nonzero;
    ++words[calib::kWordHist + code];
    const uint16_t mag = x[i] & 0x7FFF;  // |x|: FP16 and BF16 both keep the sign on top
    mx = std::max(
        mx, act == QSAKV_DTYPE_BF16 ? halfbits::bf16_to_f32(mag) : halfbits::fp16_to_f32(mag));
  }
  words[calib::kWordCount] += static_cast<uint64_t>(n);
  words[calib::kWordFinite] += finite;
  words[calib::kWordNonzero] += nonzero;
  *max_abs = mx;
}
}  // namespace

void calib_observe(const CalibObserveParams& p) {
  observe_one(static_cast<const uint16_t*>(p.k), p.num_elems, p.act_dtype, p.bin_table, p.words_k,
              p.max_k);
  observe_one(static_cast<const uint16_t*>(p.v), p.num_elems, p.act_dtype, p.bin_table, p.words_v,
              p.max_v);
}

}  // namespace cpu
}  // namespace qsakv
