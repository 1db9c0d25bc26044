// SPDX-License-Identifier: Apache-2.0
#include "core/calib/histogram.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "half_bits.cuh"

namespace qsakv {
namespace calib {

std::vector<uint16_t> make_bin_table(qsakv_dtype act) {
  std::vector<uint16_t> t(65536);
  for (uint32_t b = 0; b < 65536; ++b) {
    const float x = act == QSAKV_DTYPE_BF16 ? halfbits::bf16_to_f32(static_cast<uint16_t>(b))
                                            : halfbits::fp16_to_f32(static_cast<uint16_t>(b));
    if (!std::isfinite(x)) {
      t[b] = kCodeNonFinite;
    } else if (x == 0.0f) {
      t[b] = kCodeZero;
    } else {
      // The formula, evaluated in this order in FP64 (the NumPy test does too).
      const double f = std::floor((std::log2(std::fabs(static_cast<double>(x))) - kLog2Min) *
                                  kBins / (kLog2Max - kLog2Min));
      t[b] = static_cast<uint16_t>(std::min<double>(std::max(f, 0.0), kBins - 1));
    }
  }
  return t;
}

double bin_lower_edge(int b) {
  return std::exp2(kLog2Min + static_cast<double>(b) * (kLog2Max - kLog2Min) / kBins);
}

float hist_quantile(const uint64_t* hist, uint64_t finite, uint64_t nonzero, float max_abs,
                    double q) {
  if (finite == 0) return 0.0f;
  const uint64_t rank = static_cast<uint64_t>(std::ceil(q * static_cast<double>(finite)));
  uint64_t seen = finite - nonzero;  // zeros sort first
  if (rank <= seen) return 0.0f;
  for (int b = 0; b < kBins; ++b) {
    seen += hist[b];
    // The last bin also holds everything above 2^16 (clamped): its edge is no bound.
    if (seen >= rank && b == kBins - 1) return max_abs;
    if (seen >= rank) return static_cast<float>(std::min<double>(bin_lower_edge(b + 1), max_abs));
  }
  return max_abs;  // inconsistent counts: the maximum is the safe answer
}

}  // namespace calib
}  // namespace qsakv
