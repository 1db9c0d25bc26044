// SPDX-License-Identifier: Apache-2.0
// extern "C" entry point: the revision (index SHA-256) of a checkpoint.
#include <cstring>
#include <string>

#include "api/guard.hpp"
#include "core/format/file_io.hpp"
#include "core/format/sha256.hpp"

using namespace qsakv;

extern "C" qsakv_status qsakv_checkpoint_revision(const char* path, char out_hex[65]) {
  return guarded([&] {
    if (!path) fail(QSAKV_ERROR_INVALID_ARGUMENT, "path is NULL");
    if (!*path) fail(QSAKV_ERROR_INVALID_ARGUMENT, "path is empty");
    if (!out_hex) fail(QSAKV_ERROR_INVALID_ARGUMENT, "out_hex is NULL");
    std::string file = path;
    if (path_kind(file, "checkpoint path") == PathKind::directory)
      file = join_path(file, "model.safetensors.index.json");
    // An index maps tensor names to shards: 256 MiB is far beyond any real one.
    const std::string bytes = read_file(file, 256ull << 20, "checkpoint index", QSAKV_ERROR_IO);
    const std::string hex = sha256_hex(bytes);
    std::memcpy(out_hex, hex.c_str(), 65);
  });
}
