// SPDX-License-Identifier: Apache-2.0
// The host copy of calibration statistics and what is recorded beside them: the config,
// its fingerprint, the TP ranks covered and the number of runs pooled. Merging lives
// here; the device side only accumulates.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "calib_params.hpp"
#include "qsakv.h"

namespace qsakv {
namespace calib {

struct HostStats {
  qsakv_model_config config{};
  std::string fingerprint;     // config_fingerprint(config)
  int32_t rank = -1;           // the observing rank; -1 once ranks are merged
  std::vector<uint8_t> ranks;  // [tp_size]: 1 where that rank's statistics are in
  int32_t num_runs = 1;
  bool reduced = false;         // produced by an NCCL all-reduce
  std::vector<uint64_t> words;  // [num_qsa_layers * 2 * kEntryWords]
  std::vector<float> max_abs;   // [num_qsa_layers * 2]

  int num_entries() const { return config.num_qsa_layers * 2; }
  const uint64_t* entry(int qsa_index, int kind) const {
    return words.data() + static_cast<size_t>(qsa_index * 2 + kind) * kEntryWords;
  }
  float max_of(int qsa_index, int kind) const { return max_abs[qsa_index * 2 + kind]; }
  int ranks_covered() const;
  bool complete() const { return ranks_covered() == config.tp_size; }
};

// Empty statistics of one rank of `config` (validated by the caller).
HostStats empty_stats(const qsakv_model_config& config);

// SHA-256 hex of what makes statistics comparable: model layers and QSA layers, KV
// heads and head_dim (global), activation dtype and TP size. Not the rank (ranks of one
// run merge), nor runtime sizes that do not change activations (block size, ...).
std::string config_fingerprint(const qsakv_model_config& config);

// Merges inputs (at least one) per qsakv_calib_merge_mode; throws on a mismatch.
HostStats merge(const std::vector<const HostStats*>& inputs, qsakv_calib_merge_mode mode);

// Adds b's counts and histogram into a and takes the max of maxima (the algebra of every
// merge and of the all-reduce). Refuses a sum that does not fit in 64 bits.
void accumulate(HostStats& a, const HostStats& b);

// Checks that every entry tells one consistent story: finite <= count, nonzero <= finite,
// the histogram sums (without wrapping) to nonzero, max |x| finite, >= 0 and > 0 exactly
// when something nonzero was counted. Refuses with `status`, `what` naming the source.
void check_consistent(const HostStats& s, qsakv_status status, const std::string& what);

}  // namespace calib
}  // namespace qsakv
