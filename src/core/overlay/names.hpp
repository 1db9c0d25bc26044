// SPDX-License-Identifier: Apache-2.0
// Scale tensor names: "<prefix>.<L>.<suffix>" where <suffix> is one of the spellings
// checkpoints use for a layer's K or V cache scale. Which layers are QSA is decided
// later, against a model config.
#pragma once

#include <cstdint>
#include <string>

namespace qsakv {

enum class ScaleKind { k, v };

struct ScaleName {
  std::string prefix;  // "model.layers", "model.language_model.layers", ...
  int32_t layer = -1;
  ScaleKind kind = ScaleKind::k;
};

// Recognises the K spellings self_attn.k_scale, k_scale, attn.k_scale,
// self_attn.attn.k_scale, k_proj.k_scale, k_proj.output_scale and their V twins.
// False for anything else (including a layer id with a sign, leading zeros or > 2^31-1).
bool parse_scale_name(const std::string& name, ScaleName* out);

// The canonical name this library writes: "<prefix>.<L>.self_attn.k_scale".
std::string canonical_scale_name(const std::string& prefix, int32_t layer, ScaleKind kind);

// "k_scale" / "v_scale", for messages.
const char* kind_name(ScaleKind kind);

// A prefix the writer accepts: dot-separated non-empty components of [A-Za-z0-9_-].
bool valid_layer_prefix(const std::string& prefix);

}  // namespace qsakv
