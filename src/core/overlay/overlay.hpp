// SPDX-License-Identifier: Apache-2.0
// The overlay handle and what the rest of the library may ask of it.
//
// Loading (load.cpp) parses and cross-checks the files: container structure, duplicate
// names, the scale file's SHA-256 against the manifest, the manifest's names against the
// scale file and, in a checkpoint directory, against the merged index; in a materialised
// checkpoint also the manifest's, scale file's and merged index's SHA-256 against its
// provenance record. Everything that
// depends on a model config (which layers are QSA, completeness, contract) or on the
// caller's revision is decided by validate (validate.cpp), one status per rule.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/overlay/manifest.hpp"
#include "core/overlay/names.hpp"
#include "qsakv.h"

namespace qsakv {

// One tensor of the scale file, as found.
struct OverlayTensor {
  std::string name;
  std::string dtype;
  std::vector<uint64_t> shape;
  bool f32_scalar = false;
  float value = 0.0f;          // when f32_scalar
  bool is_scale_name = false;  // parse_scale_name accepted the name
  ScaleName scale;             // when is_scale_name
  // Checkpoint directory only: the shard the merged index maps this name to ("" absent).
  std::string index_target;
};

struct LayerScales {
  int32_t layer;
  float k;
  float v;
};

}  // namespace qsakv

// The opaque public type.
struct qsakv_overlay {
  std::string source;      // the path given to qsakv_overlay_load
  std::string scale_file;  // the scale file read
  bool has_index = false;  // loaded from a directory with a merged index
  qsakv::Manifest manifest;
  std::string scale_file_sha256;  // computed (equal to the manifest's after load)
  std::string manifest_sha256;    // of the manifest bytes read and parsed
  bool unit_scale_control = false;
  std::vector<qsakv::OverlayTensor> tensors;  // scale file order
  // Set by a successful validate only; cleared first by every validate.
  bool validated = false;
  qsakv_model_config validated_config{};
  std::vector<qsakv::LayerScales> scales;  // QSA layers in config order, once validated
};

namespace qsakv {

// Loads from a checkpoint directory, a scale-pack directory or a bare scale file.
qsakv_overlay* overlay_load(const std::string& path, const char* manifest_path);

// Runs every fail-closed rule; on success marks the overlay validated for `config`.
void overlay_validate(qsakv_overlay* o, const qsakv_model_config& config,
                      const std::string& expected_base_revision);

// Throws Error(QSAKV_ERROR_OVERLAY_NOT_VALIDATED) unless validated for a config equal to
// `config` (config_difference() finds none; the message names the first field that
// differs and both values); QSAKV_ERROR_OVERLAY_MISSING for a NULL overlay.
void overlay_require_validated(const qsakv_overlay* o, const qsakv_model_config& config);

// K and V scales of model layer `layer`. Validated overlays answer from the validated
// table; before validation from the first F32-scalar tensor of each kind (for
// inspection). QSAKV_ERROR_INVALID_ARGUMENT when absent.
void overlay_scales(const qsakv_overlay* o, int32_t layer, float* k, float* v);

// The manifest's minimum SM (e.g. 89); 0 = none. Checked by the context/cache code,
// which knows the device.
int overlay_contract_min_sm(const qsakv_overlay* o);

// A scale is a normal positive float: finite and >= FLT_MIN. Zero, negatives, NaN,
// infinities and subnormals are refused (QSAKV_ERROR_OVERLAY_BAD_SCALE) by the writer
// and by validation: with a subnormal scale every stored value saturates to 448, and the
// K scale folded into the softmax factor underflows to 0.
bool valid_scale(float s);
// The rule as messages state it, after "layer L k_scale is <scale_text(v)>; ".
constexpr const char* kScaleRule =
    "a scale must be a normal positive float, finite and >= FLT_MIN (1.17549435e-38)";
// A scale as messages show it: "nan", "inf", "-inf", else %.9g (exact for any float).
std::string scale_text(float v);

// K/V scales found: tensors with a scale name that are FP32 scalars.
int32_t overlay_num_scales(const qsakv_overlay* o);

}  // namespace qsakv
