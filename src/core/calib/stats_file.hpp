// SPDX-License-Identifier: Apache-2.0
// The statistics file: a safetensors file (readable by the `safetensors` package).
//
// Tensors:
//   "words"   U64 [num_qsa_layers, 2, 4099]: per QSA layer (ascending), K then V:
//             count, finite count, nonzero count, histogram[4096]
//   "max_abs" F32 [num_qsa_layers, 2]: max |x| over finite values
//   "ranks"   U8  [tp_size]: 1 where that TP rank's statistics are included
// Metadata (strings): format "qsakv-calib-stats", schema_version "1",
// config_fingerprint (64 hex), config (JSON of every qsakv_model_config field), tp_size,
// rank ("-1" when merged), num_runs, reduced ("0"/"1"), hist_bins "4096",
// hist_log2_min "-24", hist_log2_max "16". Every key is required; see
// docs/calibration.md.
#pragma once

#include <string>

#include "core/calib/stats.hpp"

namespace qsakv {
namespace calib {

constexpr int kStatsSchemaVersion = 1;
constexpr const char* kStatsFormat = "qsakv-calib-stats";

// The file image of `s`.
std::string write_stats(const HostStats& s);
// Parses and checks a file image; QSAKV_ERROR_FORMAT naming `what` and the field.
HostStats parse_stats(const std::string& file, const std::string& what);

// Writes a new file: refuses an existing path (INVALID_ARGUMENT), publishes by rename.
void save_stats(const HostStats& s, const std::string& path);
HostStats load_stats(const std::string& path);

}  // namespace calib
}  // namespace qsakv
