// SPDX-License-Identifier: Apache-2.0
// extern "C" entry points: model config.
#include "api/guard.hpp"
#include "core/config.hpp"

using namespace qsakv;

extern "C" {

qsakv_status qsakv_model_config_init(qsakv_model_config* config) {
  return guarded([&] {
    if (!config) fail(QSAKV_ERROR_INVALID_ARGUMENT, "config is NULL");
    *config = default_model_config();
  });
}

qsakv_status qsakv_model_config_preset(qsakv_model_config* config, const char* preset_name) {
  return guarded([&] {
    if (!config) fail(QSAKV_ERROR_INVALID_ARGUMENT, "config is NULL");
    if (!preset_name) fail(QSAKV_ERROR_INVALID_ARGUMENT, "preset_name is NULL");
    qsakv_model_config c;
    apply_preset(c, preset_name);
    *config = c;
  });
}

qsakv_status qsakv_model_config_validate(const qsakv_model_config* config) {
  return guarded([&] {
    if (!config) fail(QSAKV_ERROR_INVALID_ARGUMENT, "config is NULL");
    validate_config(read_versioned(config, default_model_config(), "config"));
  });
}

qsakv_status qsakv_model_config_rank_geometry(const qsakv_model_config* config,
                                              qsakv_rank_geometry* out) {
  return guarded([&] {
    const auto c = read_versioned(config, default_model_config(), "config");
    write_versioned(out, rank_geometry(c), "out");
  });
}

}  // extern "C"
