// Asynchronous global -> shared copies (cp.async, SM80+) with zero fill, and the
// synchronous fallback for SM75. Each thread copies and later reads back only its own
// bytes, so a thread waits for its own groups and needs no barrier with other threads.
#pragma once

#include <stdint.h>

namespace qsakv {
namespace cuda {

template <int Bytes>
__device__ __forceinline__ void cp_async(void* smem, const void* gmem, bool valid) {
  static_assert(Bytes == 16 || Bytes == 8, "16- or 8-byte copies");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int src_bytes = valid ? Bytes : 0;  // 0: nothing is read, the bytes are zeroed
  if constexpr (Bytes == 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(gmem), "r"(src_bytes));
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" ::"r"(s), "l"(gmem), "r"(src_bytes));
#else
  if constexpr (Bytes == 16)
    *static_cast<uint4*>(smem) = valid ? *static_cast<const uint4*>(gmem) : make_uint4(0, 0, 0, 0);
  else
    *static_cast<uint2*>(smem) = valid ? *static_cast<const uint2*>(gmem) : make_uint2(0, 0);
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;" ::);
#endif
}

// Waits until at most N of this thread's groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}

}  // namespace cuda
}  // namespace qsakv
