// SPDX-License-Identifier: Apache-2.0
// Versions, status strings, the thread-local last error, dtype helpers.
#include <string>

#include "api/guard.hpp"
#include "core/dtype.hpp"

#define QSAKV_STR2(x) #x
#define QSAKV_STR(x) QSAKV_STR2(x)

namespace qsakv {
namespace {
thread_local std::string t_last_error;
}
void set_last_error(const std::string& message) { t_last_error = message; }
}  // namespace qsakv

extern "C" {

int qsakv_version(void) { return QSAKV_VERSION_NUMBER; }

const char* qsakv_version_string(void) {
  return QSAKV_STR(QSAKV_VERSION_MAJOR) "." QSAKV_STR(QSAKV_VERSION_MINOR) "." QSAKV_STR(
      QSAKV_VERSION_PATCH);
}

int qsakv_abi_version(void) { return QSAKV_ABI_VERSION; }

const char* qsakv_status_string(qsakv_status status) {
  // qsakv_status has negative enumerators, so every int32 is in its range; read it raw
  // all the same, like every other enum from a caller.
  switch (static_cast<qsakv_status>(qsakv::enum_value(status))) {
#define CASE(x) \
  case x:       \
    return #x;
    CASE(QSAKV_SUCCESS)
    CASE(QSAKV_ERROR_INVALID_ARGUMENT)
    CASE(QSAKV_ERROR_INVALID_CONFIG)
    CASE(QSAKV_ERROR_UNSUPPORTED)
    CASE(QSAKV_ERROR_NO_DEVICE)
    CASE(QSAKV_ERROR_OUT_OF_MEMORY)
    CASE(QSAKV_ERROR_CUDA)
    CASE(QSAKV_ERROR_NCCL)
    CASE(QSAKV_ERROR_IO)
    CASE(QSAKV_ERROR_FORMAT)
    CASE(QSAKV_ERROR_STATE)
    CASE(QSAKV_ERROR_INTERNAL)
    CASE(QSAKV_ERROR_OVERLAY_MISSING)
    CASE(QSAKV_ERROR_OVERLAY_INCOMPLETE)
    CASE(QSAKV_ERROR_OVERLAY_BAD_SCALE)
    CASE(QSAKV_ERROR_OVERLAY_BAD_TENSOR)
    CASE(QSAKV_ERROR_OVERLAY_DUPLICATE)
    CASE(QSAKV_ERROR_OVERLAY_UNKNOWN_TENSOR)
    CASE(QSAKV_ERROR_REVISION_MISMATCH)
    CASE(QSAKV_ERROR_HASH_MISMATCH)
    CASE(QSAKV_ERROR_CONTRACT)
    CASE(QSAKV_ERROR_OVERLAY_NOT_VALIDATED)
    CASE(QSAKV_ERROR_CALIB_NON_FINITE)
    CASE(QSAKV_ERROR_TP_MISMATCH)
    CASE(QSAKV_ERROR_OVERLAY_UNIT_SCALES)
    case QSAKV_STATUS_MAX_ENUM:  // the sentinel, not a status
      break;
#undef CASE
  }
  return "QSAKV_ERROR_UNKNOWN";
}

const char* qsakv_last_error(void) { return qsakv::t_last_error.c_str(); }

void qsakv_clear_error(void) { qsakv::t_last_error.clear(); }

size_t qsakv_dtype_size(qsakv_dtype dtype) { return qsakv::dtype_size(qsakv::enum_value(dtype)); }

const char* qsakv_dtype_name(qsakv_dtype dtype) {
  return qsakv::dtype_name(qsakv::enum_value(dtype));
}

}  // extern "C"
