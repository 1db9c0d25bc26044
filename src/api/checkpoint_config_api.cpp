// SPDX-License-Identifier: Apache-2.0
// extern "C" entry point: a model config from a checkpoint's Hugging Face config.json.
#include "api/guard.hpp"
#include "core/hf_config.hpp"

using namespace qsakv;

extern "C" {

qsakv_status qsakv_model_config_from_checkpoint(qsakv_model_config* config,
                                                const char* checkpoint_dir_or_config_json) {
  return guarded([&] {
    if (!config) fail(QSAKV_ERROR_INVALID_ARGUMENT, "config is NULL");
    if (!checkpoint_dir_or_config_json)
      fail(QSAKV_ERROR_INVALID_ARGUMENT, "checkpoint_dir_or_config_json is NULL");
    if (!*checkpoint_dir_or_config_json)
      fail(QSAKV_ERROR_INVALID_ARGUMENT, "checkpoint_dir_or_config_json is empty");
    *config = config_from_hf(checkpoint_dir_or_config_json);
  });
}

}  // extern "C"
