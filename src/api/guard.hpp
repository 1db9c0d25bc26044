// SPDX-License-Identifier: Apache-2.0
// The one exception-to-status wrapper every exported body runs inside: nothing C++
// crosses the ABI, and every failure leaves a thread-local message.
#pragma once

#include <cstdint>
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

// How a caller fills each versioned input struct, named in a refusal's message (three of
// them have an initializer macro and no *_init function).
inline const char* init_hint(const qsakv_context_options*) {
  return "qsakv_context_options_init or QSAKV_CONTEXT_OPTIONS_INIT";
}
inline const char* init_hint(const qsakv_model_config*) {
  return "qsakv_model_config_init, a preset or QSAKV_MODEL_CONFIG_INIT";
}
inline const char* init_hint(const qsakv_overlay_write_options*) {
  return "qsakv_overlay_write_options_init or QSAKV_OVERLAY_WRITE_OPTIONS_INIT";
}
inline const char* init_hint(const qsakv_cache_options*) {
  return "qsakv_cache_options_init or QSAKV_CACHE_OPTIONS_INIT";
}
inline const char* init_hint(const qsakv_cache_memory*) { return "QSAKV_CACHE_MEMORY_INIT"; }
inline const char* init_hint(const qsakv_step_stores*) { return "QSAKV_STEP_STORES_INIT"; }
inline const char* init_hint(const qsakv_plan_options*) {
  return "qsakv_plan_options_init or QSAKV_PLAN_OPTIONS_INIT";
}
inline const char* init_hint(const qsakv_batch*) { return "QSAKV_BATCH_INIT"; }

// Copies a versioned struct the caller passed: checks the pointer, that struct_size
// covers at least the header and that version is one this library knows (1 ..
// defaults.version; the model config's version is checked by validate_config, with the
// config's status); reads min(struct_size, sizeof(T)) bytes over `defaults`.
template <class T>
T read_versioned(const T* in, const T& defaults, const char* what) {
  if (!in) fail(QSAKV_ERROR_INVALID_ARGUMENT, "%s is NULL", what);
  if (in->struct_size < sizeof(size_t) + sizeof(uint32_t))
    fail(QSAKV_ERROR_INVALID_ARGUMENT,
         "%s.struct_size is %zu; must be at least %zu (fill it with %s first)", what,
         in->struct_size, sizeof(size_t) + sizeof(uint32_t), init_hint(in));
  if (!std::is_same<T, qsakv_model_config>::value &&
      (in->version == 0 || in->version > defaults.version))
    fail(QSAKV_ERROR_INVALID_ARGUMENT,
         "%s.version is %u; this library knows versions 1..%u (fill it with %s first)", what,
         in->version, defaults.version, init_hint(in));
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

// A caller's array of `type` (its size `bytes`) must be aligned to its element: the
// backends read it element by element (a misaligned access is a fault on the GPU, which
// leaves the CUDA context unusable, and undefined behaviour on the CPU).
inline void require_element_aligned(const void* p, size_t bytes, const char* type,
                                    const char* what) {
  if (bytes > 1 && reinterpret_cast<uintptr_t>(p) % bytes != 0)  // (0: no element size known)
    fail(QSAKV_ERROR_INVALID_ARGUMENT, "%s (%p) must be %zu-byte aligned: it is an array of %s",
         what, p, bytes, type);
}

template <class T>
void require_out(T** out, const char* what) {
  if (!out) fail(QSAKV_ERROR_INVALID_ARGUMENT, "%s (the output pointer) is NULL", what);
  *out = nullptr;
}

}  // namespace qsakv
