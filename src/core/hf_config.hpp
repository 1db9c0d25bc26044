// SPDX-License-Identifier: Apache-2.0
// A model config from a checkpoint's Hugging Face config.json (the key mapping is
// documented at qsakv_model_config_from_checkpoint in include/qsakv.h).
#pragma once

#include <string>

#include "qsakv.h"

namespace qsakv {

// `path` is a checkpoint directory (its config.json is read) or a JSON file. Geometry
// from the file, runtime fields as in the qwen4_exp preset; validated. Throws Error:
// QSAKV_ERROR_IO (missing or unreadable file), QSAKV_ERROR_FORMAT (bad JSON, a missing
// or ill-typed key, no or an unknown QSA layer pattern), QSAKV_ERROR_INVALID_CONFIG
// (the result fails validate_config); every message names the file and the key.
qsakv_model_config config_from_hf(const std::string& path);

// The same from the JSON text itself; `file` names it in messages.
qsakv_model_config config_from_hf_text(const std::string& text, const std::string& file);

}  // namespace qsakv
