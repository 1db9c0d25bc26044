// SPDX-License-Identifier: Apache-2.0
// Producing overlays: the scale pack (scale file + manifest) and the materialised
// checkpoint directory (merged index, links to the base files, provenance).
// Both build in a staging directory beside the target and publish it with one rename.
#pragma once

#include <cstdint>
#include <string>

#include "qsakv.h"

namespace qsakv {

void overlay_write(const std::string& out_dir, const int32_t* layers, const float* k_scales,
                   const float* v_scales, int32_t num_layers,
                   const qsakv_overlay_write_options& options);

void overlay_materialize(const std::string& out_dir, const std::string& base_dir,
                         const std::string& pack_dir);

qsakv_overlay_write_options default_write_options();

}  // namespace qsakv
