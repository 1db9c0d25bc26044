// SPDX-License-Identifier: Apache-2.0
// Reading the fixed-schema JSON files of an overlay (the manifest, the provenance record):
// exactly the listed fields, and typed reads that name the field and the file on failure
// (QSAKV_ERROR_FORMAT).
#pragma once

#include <string>

#include "core/error.hpp"
#include "core/format/json_strict.hpp"

namespace qsakv {

// Refuses a field of `obj` that `fields` does not list, and a listed one it lacks. `what`
// names the file, `where` the object ("the manifest", "\"contract\"").
template <size_t N>
void require_fields(const json& obj, const char* const (&fields)[N], const std::string& what,
                    const char* where) {
  for (const auto& kv : obj.items()) {
    bool known = false;
    for (const char* f : fields) known = known || kv.key() == f;
    if (!known)
      fail(QSAKV_ERROR_FORMAT, "%s: unknown field \"%s\" in %s", what.c_str(), kv.key().c_str(),
           where);
  }
  for (const char* f : fields)
    if (!obj.contains(f))
      fail(QSAKV_ERROR_FORMAT, "%s: %s lacks the field \"%s\"", what.c_str(), where, f);
}

std::string get_string(const json& obj, const char* field, const std::string& what);

// A string field holding 64 lower-case hex digits (a SHA-256).
std::string get_sha(const json& obj, const char* field, const std::string& what);

// Refuses a document whose schema_version is not `version` (checked before the fields, so
// that a newer file says so rather than "unknown field") or whose kind is not `kind`.
void require_schema(const json& j, int version, const char* kind, const std::string& what);

}  // namespace qsakv
