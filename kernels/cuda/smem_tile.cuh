// SPDX-License-Identifier: Apache-2.0
// Shared-memory tiles for the tensor-core kernels: 16-byte async copies (cp.async on
// SM80+, a plain load and store below), ldmatrix fragment loads, and the XOR swizzle that
// keeps both conflict-free.
#pragma once

#include <stdint.h>

namespace qsakv {
namespace cuda {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, asynchronous where the GPU can (SM80+). valid == false
// writes zeros and reads nothing (src is not dereferenced).
__device__ __forceinline__ void copy16_async(void* dst, const void* src, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(dst)), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
#else
  *static_cast<uint4*>(dst) = valid ? *static_cast<const uint4*>(src) : make_uint4(0, 0, 0, 0);
#endif
}
__device__ __forceinline__ void copy_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
// Waits until at most N of this thread's committed copy groups are still in flight.
template <int N>
__device__ __forceinline__ void copy_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}

// Four 8x8 b16 matrices (ldmatrix .x4, plain or transposed) from a shared-memory address
// (what smem_addr returns): lanes 8i..8i+7 give the row addresses of matrix i. Callers
// keep lane-constant offsets and add compile-time ones. (SM75+: an SM70 build compiles
// the tensor-core kernels but never launches them.)
__device__ __forceinline__ void ldmatrix_x4_at(uint32_t (&r)[4], uint32_t addr) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 750
  (void)addr;
  r[0] = r[1] = r[2] = r[3] = 0u;
  __trap();
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
#endif
}
__device__ __forceinline__ void ldmatrix_x4_trans_at(uint32_t (&r)[4], uint32_t addr) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 750
  (void)addr;
  r[0] = r[1] = r[2] = r[3] = 0u;
  __trap();
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
#endif
}

// The same from a generic pointer into shared memory.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  ldmatrix_x4_at(r, smem_addr(p));
}

// A tile of rows of `Chunks` 16-byte chunks: chunk c of row r sits at c ^ (r & 7), so the
// 8 rows an ldmatrix (or a column of fragment stores) touches fall in 8 different bank
// groups. Chunks >= 8.
template <int Chunks>
__device__ __forceinline__ int swizzled_chunk(int row, int chunk) {
  static_assert(Chunks >= 8, "the swizzle permutes 8 chunks");
  return row * Chunks + (chunk ^ (row & 7));
}

}  // namespace cuda
}  // namespace qsakv
