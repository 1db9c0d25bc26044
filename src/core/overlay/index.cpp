// SPDX-License-Identifier: Apache-2.0
#include "core/overlay/index.hpp"

#include "core/error.hpp"

namespace qsakv {

CheckpointIndex parse_index(const std::string& text, const std::string& what) {
  JsonDuplicate dup;
  CheckpointIndex idx;
  idx.document = parse_json_strict(text, what, &dup);
  if (dup.found && dup.depth == 2 && dup.parent == "weight_map")
    fail(QSAKV_ERROR_OVERLAY_DUPLICATE, "%s: weight_map lists \"%s\" twice", what.c_str(),
         dup.key.c_str());
  if (dup.found)
    fail(QSAKV_ERROR_FORMAT, "%s: key \"%s\" appears twice", what.c_str(), dup.key.c_str());
  const json& d = idx.document;
  if (!d.is_object())
    fail(QSAKV_ERROR_FORMAT, "%s is a JSON %s, not an object", what.c_str(), json_kind(d));
  if (!d.contains("weight_map") || !d["weight_map"].is_object())
    fail(QSAKV_ERROR_FORMAT, "%s has no \"weight_map\" object", what.c_str());
  for (const auto& kv : d["weight_map"].items()) {
    if (!kv.value().is_string())
      fail(QSAKV_ERROR_FORMAT, "%s: weight_map \"%s\" is a JSON %s, not a file name", what.c_str(),
           kv.key().c_str(), json_kind(kv.value()));
    idx.weight_map[kv.key()] = kv.value().get<std::string>();
  }
  return idx;
}

}  // namespace qsakv
