// SPDX-License-Identifier: Apache-2.0
// The log2 histogram: bins of 16-bit activations, bin edges, quantiles.
#pragma once

#include <cstdint>
#include <vector>

#include "calib_params.hpp"

namespace qsakv {
namespace calib {

// Bin (or kCodeZero / kCodeNonFinite) of every FP16 or BF16 bit pattern:
// floor((log2|x| + 24) * 4096 / 40) in FP64, clamped to [0, 4095]. One table serves
// both backends, so their histograms agree bit for bit.
std::vector<uint16_t> make_bin_table(qsakv_dtype act);

// Lower edge of bin b (b = kBins gives the upper edge of the last bin): 2^(-24 + 40b/4096).
double bin_lower_edge(int b);

// |x| at quantile q (0 < q < 1) of `finite` values of which `finite - nonzero` are zero
// and the rest are in `hist`: the upper edge of the bin holding the ceil(q * finite)-th
// smallest value, capped at max_abs; 0 when that value is a zero.
float hist_quantile(const uint64_t* hist, uint64_t finite, uint64_t nonzero, float max_abs,
                    double q);

}  // namespace calib
}  // namespace qsakv
