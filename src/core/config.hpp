// SPDX-License-Identifier: Apache-2.0
// Model config: presets, validation with named errors, per-rank geometry.
#pragma once

#include <cstdint>
#include <string>

#include "qsakv.h"

namespace qsakv {

qsakv_model_config default_model_config();
void apply_preset(qsakv_model_config& config, const std::string& name);

// Throws Error(QSAKV_ERROR_INVALID_CONFIG) naming the field and the bad value.
void validate_config(const qsakv_model_config& config);

// Validates, then derives this rank's geometry.
qsakv_rank_geometry rank_geometry(const qsakv_model_config& config);

// Index of model layer `layer` among the QSA layers, or -1.
int qsa_index(const qsakv_model_config& config, int32_t layer);

// The first field, in struct order, in which two configs differ: its name ("max_requests",
// "qsa_layers[3]") and each config's value as text. `field` is empty when none does.
struct ConfigDifference {
  std::string field;
  std::string a;
  std::string b;
};
// Every field counts: geometry and runtime shape caches and contracts.
ConfigDifference config_difference(const qsakv_model_config& a, const qsakv_model_config& b);

}  // namespace qsakv
