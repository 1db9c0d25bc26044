// SPDX-License-Identifier: Apache-2.0
// The one exception-to-status wrapper every exported body runs inside: nothing C++
// crosses the ABI, and every failure leaves a thread-local message.
#pragma once

#include <cstring>
#include <new>
#include <string>
#include <type_traits>

#include "core/checked.hpp"
#include "core/error.hpp"
#include "qsakv.h"

namespace qsakv {

void set_last_error(const std::string& message);

template <class F>
qsakv_status guarded(F&& body) noexcept {
  try {
    body();
    return QSAKV_SUCCESS;
  } catch (const Error& e) {
    set_last_error(e.what());
    return e.status();
  } catch (const std::bad_alloc&) {
    set_last_error("host memory allocation failed");
    return QSAKV_ERROR_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    set_last_error(std::string("internal error: ") + e.what());
    return QSAKV_ERROR_INTERNAL;
  } catch (...) {
    set_last_error("internal error: unknown exception");
    return QSAKV_ERROR_INTERNAL;
  }
}

// Copies a versioned struct the caller passed: checks the pointer, that struct_size
// covers at least the header and that version is one this library knows (1 ..
// defaults.version; the model config's version is checked by validate_config, with the
// config's status); reads min(struct_size, sizeof(T)) bytes over `defaults`.
template <class T>
T read_versioned(const T* in, const T& defaults, const char* what) {
  if (!in) fail(QSAKV_ERROR_INVALID_ARGUMENT, "%s is NULL", what);
  if (in->struct_size < sizeof(size_t) + sizeof(uint32_t))
    fail(QSAKV_ERROR_INVALID_ARGUMENT,
         "%s.struct_size is %zu; must be at least %zu (call its *_init function first)", what,
         in->struct_size, sizeof(size_t) + sizeof(uint32_t));
  if (!std::is_same<T, qsakv_model_config>::value &&
      (in->version == 0 || in->version > defaults.version))
    fail(QSAKV_ERROR_INVALID_ARGUMENT,
         "%s.version is %u; this library knows versions 1..%u "
         "(call its *_init function first)",
         what, in->version, defaults.version);
  T out = defaults;
  const size_t n = in->struct_size < sizeof(T) ? in->struct_size : sizeof(T);
  std::memcpy(static_cast<void*>(&out), in, n);
  out.struct_size = sizeof(T);
  return out;
}

// Writes an output struct the caller sized: copies min(struct_size, sizeof(T)) bytes.
template <class T>
void write_versioned(T* out, T value, const char* what) {
  if (!out) fail(QSAKV_ERROR_INVALID_ARGUMENT, "%s is NULL", what);
  if (out->struct_size < sizeof(size_t) + sizeof(uint32_t))
    fail(QSAKV_ERROR_INVALID_ARGUMENT,
         "%s.struct_size is %zu; set it to sizeof the struct before the call", what,
         out->struct_size);
  const size_t n = out->struct_size < sizeof(T) ? out->struct_size : sizeof(T);
  value.struct_size = out->struct_size;
  std::memcpy(static_cast<void*>(out), &value, n);
}

template <class T>
void require_out(T** out, const char* what) {
  if (!out) fail(QSAKV_ERROR_INVALID_ARGUMENT, "%s (the output pointer) is NULL", what);
  *out = nullptr;
}

}  // namespace qsakv
