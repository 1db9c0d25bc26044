// SPDX-License-Identifier: Apache-2.0
// extern "C" entry points: context, capability queries, memory helpers.
#include <cstring>

#include "api/guard.hpp"
#include "api/handles.hpp"
#include "core/kernel_tier.hpp"
#include "core/versioned.hpp"

using namespace qsakv;

namespace {
qsakv_context_options default_context_options() {
  qsakv_context_options o = QSAKV_CONTEXT_OPTIONS_INIT;  // the header's defaults, one definition
  return o;
}

void require_context(const qsakv_context* c) {
  if (!c) fail(QSAKV_ERROR_INVALID_ARGUMENT, "context is NULL");
}
}  // namespace

extern "C" {

qsakv_status qsakv_context_options_init(qsakv_context_options* options) {
  return guarded([&] {
    if (!options) fail(QSAKV_ERROR_INVALID_ARGUMENT, "options is NULL");
    *options = default_context_options();
  });
}

int qsakv_built_with_cuda(void) {
#ifdef QSAKV_WITH_CUDA
  return 1;
#else
  return 0;
#endif
}

qsakv_status qsakv_context_create(qsakv_context** out, const qsakv_context_options* options) {
  return guarded([&] {
    require_out(out, "out");
    const auto o = options ? read_versioned(options, default_context_options(), "options")
                           : default_context_options();
    const int32_t backend = enum_value(o.backend), decoder = enum_value(o.decoder);
    if (backend != QSAKV_BACKEND_AUTO && backend != QSAKV_BACKEND_CPU &&
        backend != QSAKV_BACKEND_CUDA)
      fail(QSAKV_ERROR_INVALID_ARGUMENT,
           "options.backend is %d; must be AUTO (0), CPU (1) "
           "or CUDA (2)",
           backend);
    if (decoder != QSAKV_DECODER_AUTO && decoder != QSAKV_DECODER_HARDWARE &&
        decoder != QSAKV_DECODER_SOFTWARE)
      fail(QSAKV_ERROR_INVALID_ARGUMENT,
           "options.decoder is %d; must be AUTO (0), "
           "HARDWARE (1) or SOFTWARE (2)",
           decoder);
    if (o.device < 0)
      fail(QSAKV_ERROR_INVALID_ARGUMENT, "options.device is %d; must be >= 0", o.device);
    // Read once, here, and checked even when the CPU backend is chosen: a typo in a test
    // setup fails loudly instead of silently testing the default tier.
    const KernelHooks hooks = read_kernel_hooks();
    auto ctx = std::make_unique<qsakv_context>();
    if (backend != QSAKV_BACKEND_CPU) {
      std::string why;
      ctx->backend = make_cuda_backend(o.device, static_cast<qsakv_decoder>(decoder), hooks, &why);
      if (!ctx->backend) {
        if (backend == QSAKV_BACKEND_CUDA)
          fail(QSAKV_ERROR_NO_DEVICE, "CUDA backend requested but unavailable: %s", why.c_str());
        ctx->fallback_reason = why;
      }
    }
    if (!ctx->backend) {
      if (decoder == QSAKV_DECODER_HARDWARE)
        fail(QSAKV_ERROR_UNSUPPORTED,
             "options.decoder is HARDWARE, but the CPU backend has "
             "no FP8 conversion hardware; use AUTO or SOFTWARE");
      ctx->backend = make_cpu_backend();
    }
    *out = ctx.release();
  });
}

void qsakv_context_destroy(qsakv_context* context) { delete context; }

qsakv_status qsakv_context_get_info(const qsakv_context* context, qsakv_context_info* info) {
  return guarded([&] {
    require_context(context);
    const BackendInfo& b = context->backend->info();
    auto i = blank_versioned<qsakv_context_info>(QSAKV_CONTEXT_INFO_VERSION);
    i.backend = b.kind;
    i.decoder = b.decoder;
    i.device = b.device;
    i.sm_version = b.sm_version;
    i.multiprocessor_count = b.multiprocessor_count;
    i.has_fp8_conversion = b.has_fp8_conversion ? 1 : 0;
    i.device_memory_bytes = b.device_memory_bytes;
    std::strncpy(i.device_name, b.device_name.c_str(), sizeof i.device_name - 1);
    std::strncpy(i.fallback_reason, context->fallback_reason.c_str(), sizeof i.fallback_reason - 1);
    i.kernel_tier = b.tier;
    write_versioned(info, i, "info");
  });
}

qsakv_status qsakv_malloc(qsakv_context* context, void** out, size_t bytes) {
  return guarded([&] {
    require_out(out, "out");
    require_context(context);
    if (bytes == 0) fail(QSAKV_ERROR_INVALID_ARGUMENT, "bytes is 0");
    if (bytes > kMaxBufferBytes)
      fail(QSAKV_ERROR_OUT_OF_MEMORY,
           "bytes is %zu; more than any device holds (at most "
           "%llu)",
           bytes, static_cast<unsigned long long>(kMaxBufferBytes));
    *out = context->backend->alloc(bytes);
  });
}

void qsakv_free(qsakv_context* context, void* ptr) {
  if (context && ptr) context->backend->release(ptr);
}

qsakv_status qsakv_memcpy(qsakv_context* context, void* dst, const void* src, size_t bytes,
                          qsakv_copy_kind kind, qsakv_stream_t stream) {
  return guarded([&] {
    require_context(context);
    // The kind is checked even for an empty copy, so a wiring bug shows at once.
    const int32_t k = enum_value(kind);
    if (k != QSAKV_COPY_HOST_TO_DEVICE && k != QSAKV_COPY_DEVICE_TO_HOST &&
        k != QSAKV_COPY_DEVICE_TO_DEVICE)
      fail(QSAKV_ERROR_INVALID_ARGUMENT,
           "kind is %d; must be HOST_TO_DEVICE (1), "
           "DEVICE_TO_HOST (2) or DEVICE_TO_DEVICE (3)",
           k);
    if (bytes == 0) return;
    if (!dst || !src) fail(QSAKV_ERROR_INVALID_ARGUMENT, "%s is NULL", dst ? "src" : "dst");
    if (bytes > kMaxBufferBytes)
      fail(QSAKV_ERROR_INVALID_ARGUMENT,
           "bytes is %zu; more than any buffer holds (at most "
           "%llu)",
           bytes, static_cast<unsigned long long>(kMaxBufferBytes));
    context->backend->copy(dst, src, bytes, static_cast<qsakv_copy_kind>(k), stream);
  });
}

qsakv_status qsakv_stream_synchronize(qsakv_context* context, qsakv_stream_t stream) {
  return guarded([&] {
    require_context(context);
    context->backend->synchronize(stream);
  });
}

}  // extern "C"
