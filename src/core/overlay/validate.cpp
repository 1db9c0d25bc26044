// SPDX-License-Identifier: Apache-2.0
// qsakv_overlay_validate: the fail-closed rules (DOMAIN.md section 4), one status each.
// Order: config, revision, each tensor (name, layer, type, duplicate, index, value),
// completeness, contract. The first broken rule is reported.
#include <cctype>
#include <cfloat>
#include <cmath>

#include "core/config.hpp"
#include "core/dtype.hpp"
#include "core/error.hpp"
#include "core/overlay/overlay.hpp"
#include "core/format/sha256.hpp"

namespace qsakv {

namespace {

// Per QSA layer, in config order: the tensor supplying K and V (nullptr: none yet).
struct Slot {
  const OverlayTensor* k = nullptr;
  const OverlayTensor* v = nullptr;
};

void check_revision(const Manifest& m, const std::string& expected) {
  std::string want = expected;
  for (char& c : want) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (!is_sha256_hex(want))
    fail(QSAKV_ERROR_INVALID_ARGUMENT,
         "expected_base_revision \"%s\" is not a SHA-256 (64 hex digits)", expected.c_str());
  if (want != m.base_index_sha256)
    fail(QSAKV_ERROR_REVISION_MISMATCH,
         "expected_base_revision (the base checkpoint's index SHA-256) is %s; the overlay was "
         "made for %s",
         want.c_str(), m.base_index_sha256.c_str());
}

std::string qsa_list(const qsakv_model_config& c) {
  std::string s;
  for (int i = 0; i < c.num_qsa_layers; ++i) s += (i ? ", " : "") + std::to_string(c.qsa_layers[i]);
  return s;
}

std::string shape_text(const std::vector<uint64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// The tensor names a scale of a QSA layer under the overlay's prefix.
int slot_of(const OverlayTensor& t, const qsakv_overlay& o, const qsakv_model_config& c) {
  if (!t.is_scale_name)
    fail(QSAKV_ERROR_OVERLAY_UNKNOWN_TENSOR,
         "tensor \"%s\" in %s is not a K/V scale (expected \"%s.<layer>.self_attn.k_scale\", "
         "\"...v_scale\" or a known variant)",
         t.name.c_str(), o.scale_file.c_str(), o.manifest.layer_prefix.c_str());
  if (t.scale.prefix != o.manifest.layer_prefix)
    fail(QSAKV_ERROR_OVERLAY_UNKNOWN_TENSOR,
         "tensor \"%s\" uses layer prefix \"%s\"; the overlay's prefix is \"%s\" and one "
         "prefix must hold for every tensor",
         t.name.c_str(), t.scale.prefix.c_str(), o.manifest.layer_prefix.c_str());
  const int i = qsa_index(c, t.scale.layer);
  if (i < 0)
    fail(QSAKV_ERROR_OVERLAY_UNKNOWN_TENSOR,
         "tensor \"%s\" is a scale of layer %d, which is not a QSA layer of the config "
         "(QSA layers: %s)",
         t.name.c_str(), t.scale.layer, qsa_list(c).c_str());
  return i;
}

void check_type(const OverlayTensor& t) {
  if (!t.f32_scalar)
    fail(QSAKV_ERROR_OVERLAY_BAD_TENSOR,
         "layer %d %s (\"%s\") is %s of shape %s, not an FP32 scalar (F32, shape [])",
         t.scale.layer, kind_name(t.scale.kind), t.name.c_str(), t.dtype.c_str(),
         shape_text(t.shape).c_str());
}

// In a checkpoint directory the merged index must send the name to the scale file:
// anywhere else means the base checkpoint already has a tensor of that name.
void check_index(const OverlayTensor& t, const qsakv_overlay& o) {
  if (!o.has_index || t.index_target == kScaleFileName) return;
  if (t.index_target.empty())
    fail(QSAKV_ERROR_OVERLAY_INCOMPLETE,
         "layer %d %s (\"%s\") is missing from the merged index's weight_map; the "
         "checkpoint would not load it",
         t.scale.layer, kind_name(t.scale.kind), t.name.c_str());
  fail(QSAKV_ERROR_OVERLAY_DUPLICATE,
       "\"%s\" is already in the base checkpoint: the merged index maps it to %s, not %s",
       t.name.c_str(), t.index_target.c_str(), kScaleFileName);
}

void check_value(const OverlayTensor& t) {
  // A loaded 1.0 is valid: presence, not value, is the signal.
  if (!valid_scale(t.value))
    fail(QSAKV_ERROR_OVERLAY_BAD_SCALE, "layer %d %s is %s (tensor \"%s\"); %s", t.scale.layer,
         kind_name(t.scale.kind), scale_text(t.value).c_str(), t.name.c_str(), kScaleRule);
}

std::vector<Slot> check_tensors(const qsakv_overlay& o, const qsakv_model_config& c) {
  std::vector<Slot> slots(static_cast<size_t>(c.num_qsa_layers));
  for (const OverlayTensor& t : o.tensors) {
    Slot& s = slots[static_cast<size_t>(slot_of(t, o, c))];
    check_type(t);
    const OverlayTensor*& dst = t.scale.kind == ScaleKind::k ? s.k : s.v;
    if (dst)
      fail(QSAKV_ERROR_OVERLAY_DUPLICATE, "layer %d %s is given twice: \"%s\" and \"%s\"",
           t.scale.layer, kind_name(t.scale.kind), dst->name.c_str(), t.name.c_str());
    dst = &t;
    check_index(t, o);
    check_value(t);
  }
  return slots;
}

void check_complete(const std::vector<Slot>& slots, const qsakv_model_config& c) {
  int present = 0;
  std::string missing;
  for (int i = 0; i < c.num_qsa_layers; ++i) {
    const Slot& s = slots[static_cast<size_t>(i)];
    present += (s.k != nullptr) + (s.v != nullptr);
    if (!s.k) missing += format("%slayer %d k_scale", missing.empty() ? "" : ", ", c.qsa_layers[i]);
    if (!s.v) missing += format("%slayer %d v_scale", missing.empty() ? "" : ", ", c.qsa_layers[i]);
  }
  if (present != 2 * c.num_qsa_layers)
    fail(QSAKV_ERROR_OVERLAY_INCOMPLETE, "loaded %d/%d K/V scales; missing: %s", present,
         2 * c.num_qsa_layers, missing.c_str());
}

void contract_field(const char* field, const std::string& want, const std::string& have) {
  if (want != have)
    fail(QSAKV_ERROR_CONTRACT,
         "outside the overlay's contract: %s must be %s (calibrated and validated for it), "
         "the config has %s",
         field, want.c_str(), have.c_str());
}

void check_contract(const Contract& k, const qsakv_model_config& c) {
  if (k.tp_size != 0)
    contract_field("tp_size", std::to_string(k.tp_size), std::to_string(c.tp_size));
  if (k.speculative_tokens >= 0)
    contract_field("speculative_tokens", std::to_string(k.speculative_tokens),
                   std::to_string(c.speculative_tokens));
  if (k.activation_dtype != QSAKV_DTYPE_INVALID)
    contract_field("activation_dtype", dtype_name(k.activation_dtype),
                   dtype_name(c.activation_dtype));
  // min_sm needs a device: the context and cache code check it (overlay_contract_min_sm).
}

}  // namespace

bool valid_scale(float s) { return std::isfinite(s) && s >= FLT_MIN; }

std::string scale_text(float v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return format("%.9g", static_cast<double>(v));
}

void overlay_validate(qsakv_overlay* o, const qsakv_model_config& config,
                      const std::string& expected_base_revision) {
  // Fail closed: whatever happens below, an earlier success no longer counts.
  o->validated = false;
  o->scales.clear();
  validate_config(config);
  check_revision(o->manifest, expected_base_revision);
  const std::vector<Slot> slots = check_tensors(*o, config);
  check_complete(slots, config);
  check_contract(o->manifest.contract, config);
  std::vector<LayerScales> table;
  table.reserve(static_cast<size_t>(config.num_qsa_layers));
  for (int i = 0; i < config.num_qsa_layers; ++i)
    table.push_back({config.qsa_layers[i], slots[static_cast<size_t>(i)].k->value,
                     slots[static_cast<size_t>(i)].v->value});
  o->scales = std::move(table);
  o->validated_config = config;
  o->validated = true;
}

void overlay_require_validated(const qsakv_overlay* o, const qsakv_model_config& config) {
  if (!o)
    fail(QSAKV_ERROR_OVERLAY_MISSING,
         "an E4M3 cache needs an overlay; none was given "
         "(there is no unit-scale fallback)");
  if (!o->validated)
    fail(QSAKV_ERROR_OVERLAY_NOT_VALIDATED,
         "overlay %s has not been validated (qsakv_overlay_validate) or its last validation "
         "failed",
         o->source.c_str());
  const ConfigDifference d = config_difference(o->validated_config, config);
  if (!d.field.empty())
    fail(QSAKV_ERROR_OVERLAY_NOT_VALIDATED,
         "overlay %s was validated for another model config: %s is %s there, %s in this one "
         "(the first field that differs); validate it for this one",
         o->source.c_str(), d.field.c_str(), d.a.c_str(), d.b.c_str());
}

void overlay_scales(const qsakv_overlay* o, int32_t layer, float* k, float* v) {
  if (o->validated) {
    for (const LayerScales& s : o->scales)
      if (s.layer == layer) {
        *k = s.k;
        *v = s.v;
        return;
      }
    fail(QSAKV_ERROR_INVALID_ARGUMENT, "layer %d is not a QSA layer of the validated config",
         layer);
  }
  const OverlayTensor* kt = nullptr;
  const OverlayTensor* vt = nullptr;
  for (const OverlayTensor& t : o->tensors) {
    if (!t.is_scale_name || !t.f32_scalar || t.scale.layer != layer) continue;
    const OverlayTensor*& dst = t.scale.kind == ScaleKind::k ? kt : vt;
    if (!dst) dst = &t;
  }
  if (!kt || !vt)
    fail(QSAKV_ERROR_INVALID_ARGUMENT, "the overlay has no %s for layer %d",
         !kt && !vt ? "K or V scale"
         : !kt      ? "K scale"
                    : "V scale",
         layer);
  *k = kt->value;
  *v = vt->value;
}

}  // namespace qsakv
