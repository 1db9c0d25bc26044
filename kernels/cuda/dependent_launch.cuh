// SPDX-License-Identifier: Apache-2.0
// Programmatic dependent launch (SM90+): a kernel launched with it may be scheduled while
// the kernel before it in the stream still runs, so the launch's latency (~2-3 us a
// kernel on an H200, docs/perf.md's decode step) overlaps the predecessor's tail instead
// of following it. The contract, for every kernel launched this way:
//   1. wait_for_predecessors() before its first access to global memory that any earlier
//      work in the stream may write or read (everything but the kernel's parameters):
//      it returns once every predecessor grid has completed and its writes are visible;
//   2. allow_dependents() when the next kernel may be scheduled. Called right after the
//      wait: the trigger takes effect only once every CTA of this grid has called it (or
//      exited), so the next grid's CTAs never take the place of this grid's own, and the
//      next grid still waits in its step 1 for this one to finish. They do take whatever
//      slots are free meanwhile, on SMs still running this grid, so a large next grid can
//      start unevenly spread: which kernels are launched this way is the backend's
//      measured choice (docs/gpu-tiers.md).
// Launched without the attribute (before SM90, or when the backend turns it off), both are
// no-ops in effect: the stream already serialises the kernels.
#pragma once

#include <cuda_runtime.h>

#if !defined(__CUDACC_RTC__)  // host code: not in the NVRTC sm_70 build check
#include "cuda/launch.hpp"
#endif

namespace qsakv {
namespace cuda {

__device__ __forceinline__ void wait_for_predecessors() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void allow_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" :::);
#endif
}

#if !defined(__CUDACC_RTC__)
// Launches `kernel` on `stream`, as a programmatic dependent of the stream's previous
// kernel when `programmatic` (the kernel must keep the contract above). A launch the
// runtime refuses throws LaunchError with its error; its status is then cleared from the
// thread's last error, which the launch path otherwise never reads, so that an error the
// caller's own earlier runtime call left there stays the caller's (and is not reported as
// the library's).
template <class... Params, class... Args>
void launch_kernel(bool programmatic, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                   cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = programmatic ? 1 : 0;
  const cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, static_cast<Params>(args)...);
  if (e != cudaSuccess) refuse_failed_call(e, "cudaLaunchKernelEx");
}
#endif

}  // namespace cuda
}  // namespace qsakv
