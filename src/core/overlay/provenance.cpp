// SPDX-License-Identifier: Apache-2.0
#include "core/overlay/provenance.hpp"

#include "core/error.hpp"
#include "core/format/file_io.hpp"
#include "core/format/json_strict.hpp"
#include "core/format/sha256.hpp"
#include "core/overlay/json_fields.hpp"
#include "core/overlay/manifest.hpp"

namespace qsakv {

namespace {

const char* const kFields[] = {"schema_version",      "kind",
                               "base_checkpoint",     "base_index_sha256",
                               "merged_index_sha256", "scale_file_sha256",
                               "manifest_sha256",     "library_version"};

// An index maps tensor names to shards: 256 MiB is far beyond any real one.
constexpr uint64_t kMaxIndexBytes = 256ull << 20;
constexpr uint64_t kMaxProvenanceBytes = 1ull << 20;

}  // namespace

std::string write_provenance(const Provenance& p) {
  json j = json::object();
  j["schema_version"] = kProvenanceSchemaVersion;
  j["kind"] = kProvenanceKind;
  j["base_checkpoint"] = p.base_checkpoint;
  j["base_index_sha256"] = p.base_index_sha256;
  j["merged_index_sha256"] = p.merged_index_sha256;
  j["scale_file_sha256"] = p.scale_file_sha256;
  j["manifest_sha256"] = p.manifest_sha256;
  j["library_version"] = p.library_version;
  return j.dump(2) + "\n";
}

Provenance parse_provenance(const std::string& text, const std::string& what) {
  const json j = parse_json_strict(text, what);
  require_schema(j, kProvenanceSchemaVersion, kProvenanceKind, what);
  require_fields(j, kFields, what, "the provenance record");
  Provenance p;
  p.base_checkpoint = get_string(j, "base_checkpoint", what);
  if (p.base_checkpoint.empty())
    fail(QSAKV_ERROR_FORMAT, "%s: \"base_checkpoint\" is empty", what.c_str());
  p.base_index_sha256 = get_sha(j, "base_index_sha256", what);
  p.merged_index_sha256 = get_sha(j, "merged_index_sha256", what);
  p.scale_file_sha256 = get_sha(j, "scale_file_sha256", what);
  p.manifest_sha256 = get_sha(j, "manifest_sha256", what);
  p.library_version = get_string(j, "library_version", what);
  return p;
}

bool read_provenance(const std::string& dir, Provenance* out, std::string* path) {
  const std::string record_path = join_path(dir, kProvenanceFileName);
  if (path_kind(record_path, "provenance record") == PathKind::missing) return false;
  *out = parse_provenance(
      read_file(record_path, kMaxProvenanceBytes, "provenance record", QSAKV_ERROR_IO),
      record_path);
  *path = record_path;
  return true;
}

void require_recorded(const char* what, const std::string& path, const std::string& actual,
                      const std::string& recorded, const std::string& record_path) {
  if (actual != recorded)
    fail(QSAKV_ERROR_HASH_MISMATCH,
         "%s %s has SHA-256 %s; the provenance record %s of the materialised checkpoint "
         "records %s: the file changed since the checkpoint was built (or is not its %s)",
         what, path.c_str(), actual.c_str(), record_path.c_str(), recorded.c_str(), what);
}

std::string checkpoint_revision(const std::string& path) {
  if (path_kind(path, "checkpoint path") != PathKind::directory)
    return sha256_hex(read_file(path, kMaxIndexBytes, "checkpoint index", QSAKV_ERROR_IO));
  const std::string index_path = join_path(path, kIndexFileName);
  Provenance p;
  std::string record_path;
  if (!read_provenance(path, &p, &record_path))
    return sha256_hex(read_file(index_path, kMaxIndexBytes, "checkpoint index", QSAKV_ERROR_IO));
  const std::string merged =
      sha256_hex(read_file(index_path, kMaxIndexBytes, "checkpoint index", QSAKV_ERROR_IO));
  if (merged != p.merged_index_sha256)
    fail(QSAKV_ERROR_HASH_MISMATCH,
         "%s is a materialised checkpoint whose index changed since it was built: its SHA-256 "
         "is %s, %s records %s",
         path.c_str(), merged.c_str(), record_path.c_str(), p.merged_index_sha256.c_str());
  const std::string base_index = join_path(p.base_checkpoint, kIndexFileName);
  std::string text;
  try {
    text = read_file(base_index, kMaxIndexBytes, "base checkpoint index", QSAKV_ERROR_IO);
  } catch (const Error& e) {
    fail(e.status(),
         "%s is a materialised checkpoint: its revision is its base's, and the base index that "
         "%s names cannot be read (%s)",
         path.c_str(), record_path.c_str(), e.what());
  }
  return sha256_hex(text);
}

}  // namespace qsakv
