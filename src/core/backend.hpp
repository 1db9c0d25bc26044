// SPDX-License-Identifier: Apache-2.0
// The interface both backends implement. The API layer owns handles and validation; a
// backend owns memory and compute. Backends are siblings: neither includes the other.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "calib_params.hpp"
#include "core/error.hpp"
#include "core/kernel_tier.hpp"
#include "params.hpp"
#include "qsakv.h"

namespace qsakv {

struct BackendInfo {
  qsakv_backend kind;
  qsakv_decoder decoder;
  qsakv_kernel_tier tier;  // CUDA kernels launched (NONE on the CPU backend)
  int device;
  int sm_version;
  int multiprocessor_count;
  bool has_fp8_conversion;
  uint64_t device_memory_bytes;
  std::string device_name;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const BackendInfo& info() const = 0;

  // Memory. alloc returns zeroed device memory or throws OUT_OF_MEMORY.
  virtual void* alloc(size_t bytes) = 0;
  virtual void release(void* ptr) noexcept = 0;
  // Pinned (page-locked) host memory for staging; plain host memory on the CPU backend.
  virtual void* alloc_host(size_t bytes) = 0;
  virtual void release_host(void* ptr) noexcept = 0;
  virtual void copy(void* dst, const void* src, size_t bytes, qsakv_copy_kind kind,
                    qsakv_stream_t stream) = 0;
  virtual void synchronize(qsakv_stream_t stream) = 0;
  // Refuses (STATE, naming `call`) a call made while `stream` is being captured into a CUDA
  // graph, for calls whose work must happen now rather than at each replay. The CPU backend
  // has no capture.
  virtual void require_not_capturing(qsakv_stream_t, const char* /*call*/) const {}
  // Refuses (INVALID_ARGUMENT, naming `what`) memory this backend cannot compute on: on the
  // CUDA backend, anything but device or managed memory of its GPU. The CPU backend cannot
  // tell host pointers apart and accepts them.
  virtual void check_caller_memory(const void*, uint64_t, const char*) const {}

  // Staging fences for plan updates: record after an async copy; wait before the
  // staging buffer is rewritten.
  virtual void* create_fence() = 0;
  virtual void destroy_fence(void* fence) noexcept = 0;
  virtual void record_fence(void* fence, qsakv_stream_t stream) = 0;
  virtual void wait_fence(void* fence) = 0;

  // Split-K factor for a plan whose largest batch launches `row_groups` CTA groups
  // (rows x KV heads x head chunks) over lists of topk_width entries.
  virtual int choose_splits(int row_groups, int topk_width) const = 0;
  // The grouped multi-row route: rows per group for this GQA group and head_dim (0: the
  // backend has no such route, every row takes the decode route), and the (group, split)
  // work items its split-K partials hold per KV head.
  virtual int grouped_rows_per_group(int /*group_size*/, int /*head_dim*/) const { return 0; }
  virtual int grouped_max_items() const { return 0; }
  // Bytes of select scratch a plan needs.
  virtual size_t select_workspace_bytes(int max_rows, int64_t max_blocks) const = 0;

  // Compute: enqueue on stream (the CPU backend runs synchronously).
  virtual void store_kv(const StoreKvParams& p, qsakv_stream_t stream) = 0;
  virtual void store_ring(const StoreRowsParams& p, qsakv_stream_t stream) = 0;
  virtual void store_compressed(const StoreCompressedParams& p, qsakv_stream_t stream) = 0;
  // A step's stores together (qsakv_store_step): the parts present, as the calls above. A
  // backend that can do it in fewer launches overrides this.
  virtual void store_step(const StoreStepParams& p, qsakv_stream_t stream) {
    if (p.has_kv) store_kv(p.kv, stream);
    if (p.has_ring) store_ring(p.ring, stream);
    if (p.has_compressed) store_compressed(p.compressed, stream);
  }
  virtual void select_topk(const SelectParams& p, qsakv_stream_t stream) = 0;
  virtual void attention(const AttentionParams& p, qsakv_stream_t stream) = 0;

  // Calibration statistics (accumulating into device memory; see kernels/calib_params.hpp).
  // Not pure, so a backend without them still builds: it refuses instead.
  virtual void calib_observe(const CalibObserveParams&, qsakv_stream_t) {
    fail(QSAKV_ERROR_UNSUPPORTED, "calibration statistics are not implemented by this backend");
  }
  // In-place NCCL all-reduce of the statistics: sum of words, max of maxima.
  virtual void calib_allreduce(uint64_t*, size_t, float*, size_t, void*, int, int, qsakv_stream_t) {
    fail(QSAKV_ERROR_UNSUPPORTED,
         "this backend cannot all-reduce calibration statistics over "
         "NCCL (the CPU backend has no device memory to share): save each rank's statistics "
         "and merge them with qsakv_calib_merge");
  }
};

std::unique_ptr<Backend> make_cpu_backend();
// Returns nullptr with *why set when no usable GPU (or no CUDA in this build). hooks: the
// kernel tier forced by QSAKV_CUDA_TIER (NONE: the one the GPU's SM selects), the grouped
// kernel's MMA asked for by QSAKV_GROUPED_MMA, and QSAKV_DEPENDENT_LAUNCH
// (core/kernel_tier.hpp).
std::unique_ptr<Backend> make_cuda_backend(int device, qsakv_decoder decoder,
                                           const KernelHooks& hooks, std::string* why);

}  // namespace qsakv
