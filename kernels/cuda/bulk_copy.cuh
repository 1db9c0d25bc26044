// SPDX-License-Identifier: Apache-2.0
// Hopper bulk copies (cp.async.bulk, the TMA engine's 1-D form) into shared memory with
// mbarrier completion: one instruction moves a whole K or V row, and the bytes in flight
// are bounded by the shared-memory ring, not by registers. SM90+ only; the callers are
// compiled for every architecture but launched only where the GPU has them (a lower
// architecture's build traps if one is ever reached).
#pragma once

#include <stdint.h>

#include "cuda/smem_tile.cuh"

namespace qsakv {
namespace cuda {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define QSAKV_HAS_BULK_COPY 1
#else
#define QSAKV_HAS_BULK_COPY 0
#endif

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
#if QSAKV_HAS_BULK_COPY
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count)
               : "memory");
#else
  (void)bar, (void)count;
  __trap();
#endif
}

// Makes initialised barriers visible to the async proxy (the bulk copies) before use.
__device__ __forceinline__ void mbar_fence_init() {
#if QSAKV_HAS_BULK_COPY
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}

// One arrival that also announces `bytes` of bulk copies completing on this phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
#if QSAKV_HAS_BULK_COPY
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
#else
  (void)bar, (void)bytes;
  __trap();
#endif
}

// Blocks until the barrier's phase with this parity has completed.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
#if QSAKV_HAS_BULK_COPY
  asm volatile(
      "{\n\t.reg .pred done;\n"
      "wait_%=:\n\t"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n\t"
      "@!done bra wait_%=;\n\t}" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
#else
  (void)bar, (void)parity;
  __trap();
#endif
}

// Orders this thread's earlier generic-proxy accesses of shared memory (reads of a ring
// stage) before later async-proxy writes to it (the bulk copy that refills the stage).
__device__ __forceinline__ void fence_proxy_async_shared() {
#if QSAKV_HAS_BULK_COPY
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}

// bytes (a multiple of 16, both addresses 16-byte aligned) global -> shared, completing
// as transactions on bar.
__device__ __forceinline__ void bulk_copy_to_smem(void* dst, const void* src, uint32_t bytes,
                                                  uint64_t* bar) {
#if QSAKV_HAS_BULK_COPY
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
#else
  (void)dst, (void)src, (void)bytes, (void)bar;
  __trap();
#endif
}

}  // namespace cuda
}  // namespace qsakv
