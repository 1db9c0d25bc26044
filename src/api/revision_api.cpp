// SPDX-License-Identifier: Apache-2.0
// extern "C" entry point: the revision (index SHA-256) of a checkpoint.
#include <cstring>
#include <string>

#include "api/guard.hpp"
#include "core/overlay/provenance.hpp"

using namespace qsakv;

extern "C" qsakv_status qsakv_checkpoint_revision(const char* path, char out_hex[65]) {
  return guarded([&] {
    if (!path) fail(QSAKV_ERROR_INVALID_ARGUMENT, "path is NULL");
    if (!*path) fail(QSAKV_ERROR_INVALID_ARGUMENT, "path is empty");
    if (!out_hex) fail(QSAKV_ERROR_INVALID_ARGUMENT, "out_hex is NULL");
    const std::string hex = checkpoint_revision(path);
    std::memcpy(out_hex, hex.c_str(), 65);
  });
}
