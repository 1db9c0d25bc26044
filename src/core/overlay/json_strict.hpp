// Strict JSON parsing for overlay files: nlohmann's parser silently keeps the last of
// two equal keys, which would let a crafted file say two things at once. This wrapper
// watches every key through the parser callback and reports the first duplicate.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace qsakv {

// Insertion order kept: merged indexes and manifests are written back in their order.
using json = nlohmann::ordered_json;

struct JsonDuplicate {
  bool found = false;
  int depth = 0;       // 1: a key of the root object, 2: of an object inside it, ...
  std::string parent;  // key of the enclosing object in its parent ("" at the root)
  std::string key;
};

// Parses `text`; a syntax error is QSAKV_ERROR_FORMAT naming `what` and the byte.
// With dup == nullptr a duplicated key is QSAKV_ERROR_FORMAT too; otherwise the first
// duplicate is reported through *dup and the caller picks the status.
json parse_json_strict(const std::string& text, const std::string& what,
                       JsonDuplicate* dup = nullptr);

// "object", "array", "string", ... for messages.
const char* json_kind(const json& j);

}  // namespace qsakv
