// SPDX-License-Identifier: Apache-2.0
// qsakv-provenance.json, the record a materialised checkpoint keeps of what it was built
// from, and the revision of a checkpoint directory, which for a materialised one is its
// base's, read again now.
//
// Schema version 1 (every field required, no other field allowed):
// {
//   "schema_version": 1,
//   "kind": "qsakv-provenance",
//   "base_checkpoint": "/real/path/of/the/base",   // UTF-8
//   "base_index_sha256": "<64 hex>",               // the base index when materialised
//   "merged_index_sha256": "<64 hex>",             // this directory's index
//   "scale_file_sha256": "<64 hex>",
//   "manifest_sha256": "<64 hex>",
//   "library_version": "0.1.0"
// }
#pragma once

#include <string>

namespace qsakv {

constexpr int kProvenanceSchemaVersion = 1;
constexpr const char* kProvenanceKind = "qsakv-provenance";

struct Provenance {
  std::string base_checkpoint;
  std::string base_index_sha256;
  std::string merged_index_sha256;
  std::string scale_file_sha256;
  std::string manifest_sha256;
  std::string library_version;
};

std::string write_provenance(const Provenance& p);

// Parses and checks a provenance record (QSAKV_ERROR_FORMAT naming the field). `what`
// names the file.
Provenance parse_provenance(const std::string& text, const std::string& what);

// Reads and checks `dir`/qsakv-provenance.json into *out and its path into *path; false
// (nothing set) when `dir` holds no record, i.e. is not a materialised checkpoint.
bool read_provenance(const std::string& dir, Provenance* out, std::string* path);

// Refuses (QSAKV_ERROR_HASH_MISMATCH) a file of a materialised checkpoint whose SHA-256
// `actual` is not the one its record `record_path` lists. `what` says which file
// ("scale file", "manifest", "merged index").
void require_recorded(const char* what, const std::string& path, const std::string& actual,
                      const std::string& recorded, const std::string& record_path);

// The revision (lower-case hex SHA-256 of model.safetensors.index.json) of a checkpoint
// directory or of an index file. A directory holding qsakv-provenance.json is a
// materialised checkpoint: its index is the merged one, so its revision is its base's,
// hashed now from the base directory the record names. That base index unreadable is
// QSAKV_ERROR_IO, and this directory's index no longer the one materialised is
// QSAKV_ERROR_HASH_MISMATCH: either way the revision the scales were bound to can no
// longer be shown.
std::string checkpoint_revision(const std::string& path);

}  // namespace qsakv
