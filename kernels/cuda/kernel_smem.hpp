// SPDX-License-Identifier: Apache-2.0
// Raising a kernel's dynamic shared-memory limit before its first launch on a device (the
// attention kernels' and the warpgroup selection scorer's), and whether a size fits.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <mutex>

#include "cuda/launch.hpp"

namespace qsakv {
namespace cuda {

// Refuses the launch when raising a kernel's dynamic shared-memory limit failed (the
// result of cudaFuncSetAttribute, a host call that does not touch a stream: capture-safe),
// clearing its error from the thread's last error.
inline void require_smem_limit(cudaError_t attr, int bytes) {
  if (attr != cudaSuccess) {
    char call[64];
    std::snprintf(call, sizeof call, "cudaFuncSetAttribute(%d bytes of shared memory)", bytes);
    refuse_failed_call(attr, call);
  }
}

// Raises a kernel's dynamic shared-memory limit to `bytes` (and, with max_carveout, asks
// for the largest shared-memory carveout) on the current device, once per kernel and
// device: cudaFuncSetAttribute acts on the current device only, so a process driving
// several GPUs needs it on each. `ready` is the kernel's own mask of devices done (one
// static per kernel); devices past 63 set it on every launch. Host calls that touch no
// stream: capture-safe.
template <class Kernel>
void prepare_kernel_smem(Kernel* kernel, int bytes, bool max_carveout,
                         std::atomic<uint64_t>& ready) {
  int device = 0;
  if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess)
    refuse_failed_call(e, "cudaGetDevice");
  const uint64_t bit = device < 64 ? uint64_t{1} << device : 0;
  if (bit != 0 && (ready.load(std::memory_order_acquire) & bit) != 0) return;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (e == cudaSuccess && max_carveout)
    e = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                             cudaSharedmemCarveoutMaxShared);
  require_smem_limit(e, bytes);
  ready.fetch_or(bit, std::memory_order_release);
}

// The dynamic shared-memory limit of a kernel whose size depends on the call (the grouped
// union kernel's, on the cache's config), per device, only ever raised: one static per
// kernel. Setting it to each call's size would let a thread launching with a smaller size
// lower it between another thread's raise and that thread's launch.
struct RaisedSmemLimit {
  std::mutex raising;
  std::atomic<int> bytes[64];  // zero-initialised (static storage)
};

// Makes `kernel`'s dynamic shared-memory limit on the current device at least `bytes`:
// nothing after the first call that needed the size (an atomic load), else
// cudaFuncSetAttribute under the kernel's lock. Devices past 63 set it on every launch, as
// before (a lowering race remains there). Host calls that touch no stream: capture-safe.
template <class Kernel>
void raise_kernel_smem(Kernel* kernel, int bytes, RaisedSmemLimit& limit) {
  int device = 0;
  if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess)
    refuse_failed_call(e, "cudaGetDevice");
  std::atomic<int>* known = device < 64 ? &limit.bytes[device] : nullptr;
  if (known && known->load(std::memory_order_acquire) >= bytes) return;
  std::lock_guard<std::mutex> lock(limit.raising);
  if (known && known->load(std::memory_order_relaxed) >= bytes) return;
  require_smem_limit(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), bytes);
  if (known) known->store(bytes, std::memory_order_release);
}

// Whether `kernel` can have `dynamic_bytes` of dynamic shared memory on the current device:
// the device's opt-in limit per CTA less the kernel's static shared memory. Host queries
// that touch no stream (capture-safe); one that fails answers no, and its error is
// cleared: the library's own, it must not stay pending for the caller.
template <class Kernel>
bool kernel_smem_fits(Kernel* kernel, int dynamic_bytes) {
  int device = 0, optin = 0;
  cudaFuncAttributes attr;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
          cudaSuccess ||
      cudaFuncGetAttributes(&attr, kernel) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return static_cast<size_t>(dynamic_bytes) + attr.sharedSizeBytes <= static_cast<size_t>(optin);
}

}  // namespace cuda
}  // namespace qsakv
