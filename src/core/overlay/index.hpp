// SPDX-License-Identifier: Apache-2.0
// model.safetensors.index.json: the checkpoint's map from tensor name to shard file.
#pragma once

#include <map>
#include <string>

#include "core/format/json_strict.hpp"

namespace qsakv {

struct CheckpointIndex {
  json document;                                  // the whole file, for rewriting
  std::map<std::string, std::string> weight_map;  // name -> shard file name
};

// Parses strictly: an object whose "weight_map" is an object of strings. A name listed
// twice in weight_map is QSAKV_ERROR_OVERLAY_DUPLICATE; other defects QSAKV_ERROR_FORMAT.
CheckpointIndex parse_index(const std::string& text, const std::string& what);

}  // namespace qsakv
