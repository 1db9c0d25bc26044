// SPDX-License-Identifier: Apache-2.0
// extern "C" entry points: overlay load, validation, inspection, writing.
#include <cstring>
#include <memory>

#include "api/guard.hpp"
#include "core/config.hpp"
#include "core/overlay/overlay.hpp"
#include "core/overlay/write.hpp"
#include "core/versioned.hpp"

using namespace qsakv;

namespace {

void require_path(const char* p, const char* what) {
  if (!p) fail(QSAKV_ERROR_INVALID_ARGUMENT, "%s is NULL", what);
  if (!*p) fail(QSAKV_ERROR_INVALID_ARGUMENT, "%s is empty", what);
}

void require_overlay(const qsakv_overlay* o) {
  if (!o) fail(QSAKV_ERROR_INVALID_ARGUMENT, "overlay is NULL");
}

// Copies a string into a fixed field, refusing one that does not fit (never truncates).
template <size_t N>
void copy_field(char (&dst)[N], const std::string& s, const char* field) {
  if (s.size() >= N)
    fail(QSAKV_ERROR_INVALID_ARGUMENT, "%s is %zu characters; the info field holds %zu", field,
         s.size(), N - 1);
  std::memcpy(dst, s.c_str(), s.size() + 1);
}

qsakv_overlay_info info_of(const qsakv_overlay& o) {
  auto i = blank_versioned<qsakv_overlay_info>(QSAKV_OVERLAY_INFO_VERSION);
  i.num_scales = overlay_num_scales(&o);
  i.validated = o.validated ? 1 : 0;
  i.unit_scale_control = o.unit_scale_control ? 1 : 0;
  const Contract& c = o.manifest.contract;
  i.contract_tp_size = c.tp_size;
  i.contract_speculative_tokens = c.speculative_tokens;
  i.contract_activation_dtype = c.activation_dtype;
  i.contract_min_sm = c.min_sm;
  copy_field(i.base_index_sha256, o.manifest.base_index_sha256, "base_index_sha256");
  copy_field(i.scale_file_sha256, o.scale_file_sha256, "scale_file_sha256");
  copy_field(i.layer_prefix, o.manifest.layer_prefix, "layer_prefix");
  return i;
}

}  // namespace

extern "C" {

qsakv_status qsakv_overlay_load(qsakv_overlay** out, const char* path, const char* manifest_path) {
  return guarded([&] {
    require_out(out, "out");
    require_path(path, "path");
    if (manifest_path) require_path(manifest_path, "manifest_path");
    *out = overlay_load(path, manifest_path);
  });
}

void qsakv_overlay_destroy(qsakv_overlay* overlay) { delete overlay; }

qsakv_status qsakv_overlay_validate(qsakv_overlay* overlay, const qsakv_model_config* config,
                                    const char* expected_base_revision) {
  return guarded([&] {
    require_overlay(overlay);
    // Any refusal, even of an argument, leaves the overlay unvalidated.
    overlay->validated = false;
    if (!expected_base_revision)
      fail(QSAKV_ERROR_INVALID_ARGUMENT,
           "expected_base_revision is NULL; the overlay is "
           "bound to one base checkpoint revision and must be checked against it");
    const qsakv_model_config c = read_versioned(config, default_model_config(), "config");
    overlay_validate(overlay, c, expected_base_revision);
  });
}

qsakv_status qsakv_overlay_get_info(const qsakv_overlay* overlay, qsakv_overlay_info* info) {
  return guarded([&] {
    require_overlay(overlay);
    write_versioned(info, info_of(*overlay), "info");
  });
}

qsakv_status qsakv_overlay_get_scales(const qsakv_overlay* overlay, int32_t layer, float* k_scale,
                                      float* v_scale) {
  return guarded([&] {
    require_overlay(overlay);
    if (!k_scale || !v_scale) fail(QSAKV_ERROR_INVALID_ARGUMENT, "k_scale or v_scale is NULL");
    overlay_scales(overlay, layer, k_scale, v_scale);
  });
}

qsakv_status qsakv_overlay_write_options_init(qsakv_overlay_write_options* options) {
  return guarded([&] {
    if (!options) fail(QSAKV_ERROR_INVALID_ARGUMENT, "options is NULL");
    *options = default_write_options();
  });
}

qsakv_status qsakv_overlay_write(const char* out_dir, const int32_t* layers, const float* k_scales,
                                 const float* v_scales, int32_t num_layers,
                                 const qsakv_overlay_write_options* options) {
  return guarded([&] {
    require_path(out_dir, "out_dir");
    if (!layers || !k_scales || !v_scales)
      fail(QSAKV_ERROR_INVALID_ARGUMENT, "layers, k_scales or v_scales is NULL");
    const auto opt = read_versioned(options, default_write_options(), "options");
    overlay_write(out_dir, layers, k_scales, v_scales, num_layers, opt);
  });
}

qsakv_status qsakv_overlay_materialize(const char* out_dir, const char* base_checkpoint_dir,
                                       const char* scale_pack_dir) {
  return guarded([&] {
    require_path(out_dir, "out_dir");
    require_path(base_checkpoint_dir, "base_checkpoint_dir");
    require_path(scale_pack_dir, "scale_pack_dir");
    overlay_materialize(out_dir, base_checkpoint_dir, scale_pack_dir);
  });
}

}  // extern "C"
