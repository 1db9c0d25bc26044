// SPDX-License-Identifier: Apache-2.0
#include "core/overlay/json_fields.hpp"

#include "core/format/sha256.hpp"

namespace qsakv {

std::string get_string(const json& obj, const char* field, const std::string& what) {
  if (!obj[field].is_string())
    fail(QSAKV_ERROR_FORMAT, "%s: \"%s\" is a JSON %s, not a string", what.c_str(), field,
         json_kind(obj[field]));
  return obj[field].get<std::string>();
}

std::string get_sha(const json& obj, const char* field, const std::string& what) {
  std::string s = get_string(obj, field, what);
  if (!is_sha256_hex(s))
    fail(QSAKV_ERROR_FORMAT, "%s: \"%s\" is \"%s\", not 64 lower-case hex digits", what.c_str(),
         field, s.c_str());
  return s;
}

void require_schema(const json& j, int version, const char* kind, const std::string& what) {
  if (!j.is_object())
    fail(QSAKV_ERROR_FORMAT, "%s is a JSON %s, not an object", what.c_str(), json_kind(j));
  if (!j.contains("schema_version") || !j["schema_version"].is_number_integer() ||
      j["schema_version"].get<int64_t>() != version)
    fail(QSAKV_ERROR_FORMAT, "%s: schema_version is %s; this library reads version %d",
         what.c_str(),
         j.contains("schema_version") ? json_excerpt(j["schema_version"]).c_str() : "absent",
         version);
  if (!j.contains("kind") || !j["kind"].is_string() || j["kind"] != kind)
    fail(QSAKV_ERROR_FORMAT, "%s: kind is %s, not \"%s\"", what.c_str(),
         j.contains("kind") ? json_excerpt(j["kind"]).c_str() : "absent", kind);
}

}  // namespace qsakv
