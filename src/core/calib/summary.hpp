// SPDX-License-Identifier: Apache-2.0
// From statistics to scales: the rounding rule, the refusals, the per-layer report.
#pragma once

#include "core/calib/stats.hpp"

namespace qsakv {
namespace calib {

// The smallest FP32 s >= max_abs / 448 (exact quotient rounded up). OVERLAY_BAD_SCALE
// unless max_abs is finite and > 0.
float scale_from_max(float max_abs);

// Every refusal of qsakv_calib_summarize, first broken rule first (see qsakv.h).
void check_summarizable(const HostStats& s);

// The report of one entry of statistics that passed check_summarizable.
qsakv_calib_summary summarize_entry(const HostStats& s, int qsa_index, int kind);

}  // namespace calib
}  // namespace qsakv
