// SPDX-License-Identifier: Apache-2.0
// Hopper warpgroup MMA (wgmma.mma_async, sm_90a only): shared-memory matrix descriptors
// for 128-byte-swizzled tiles, the shapes that the grouped route and the warpgroup
// selection scorer use, and the fences around them. Four warps (a warpgroup) issue each
// MMA together; the accumulator layout per warp is mma.sync m16n8's (warp w of the group
// holds rows 16w .. 16w + 15), so the softmax and epilogue code of the m16n8k16 kernels
// reads it unchanged.
//
// Tiles in shared memory are "atom-major": a matrix of R rows and C 16-bit columns is
// C / 64 atoms of R rows x 128 bytes each, the 16-byte chunk c of row r of an atom at
// (c ^ (r & 7)): the hardware's 128-byte swizzle, whose pattern repeats every 1024 bytes,
// so each atom starts on a 1024-byte boundary. The same bytes serve as a K-major operand
// (rows = M or N, columns = K: Q and K) and as an MN-major one (rows = K, columns = N: V).
#pragma once

#include <stdint.h>

#include "cuda/smem_tile.cuh"

// The wgmma instructions exist in sm_90a code only; elsewhere the wrappers trap (the
// host launches the kernels that use them on SM90 GPUs with sm_90a code only).
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define QSAKV_WGMMA 1
#else
#define QSAKV_WGMMA 0
#endif

namespace qsakv {
namespace cuda {

// Byte offset of 16-byte chunk `chunk` (of 8 x atoms) of row `row` in an atom-major tile
// of `rows` rows.
__host__ __device__ constexpr int sw128_offset(int rows, int row, int chunk) {
  return (chunk >> 3) * rows * 128 + row * 128 + (((chunk & 7) ^ (row & 7)) << 4);
}

// A descriptor of a 128-byte-swizzled operand at shared address `addr`: `lead` is the byte
// stride between atoms along MN (MN-major operands; unused for K-major), `stride` between
// groups of 8 rows (1024 for whole atoms).
__device__ __forceinline__ uint64_t sw128_desc(uint32_t addr, uint32_t lead, uint32_t stride) {
  return static_cast<uint64_t>((addr & 0x3FFFFu) >> 4) |
         static_cast<uint64_t>((lead & 0x3FFFFu) >> 4) << 16 |
         static_cast<uint64_t>((stride & 0x3FFFFu) >> 4) << 32 | uint64_t{1} << 62;
}

// Orders this thread's register writes before the warpgroup's next MMAs read them.
__device__ __forceinline__ void wgmma_fence() {
#if QSAKV_WGMMA
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#if QSAKV_WGMMA
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
// Waits until at most N of the warpgroup's committed MMA groups are in flight.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
#if QSAKV_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
// Shared-memory writes of this thread (st.shared, cp.async) made visible to the MMAs'
// reads (the async proxy); then a barrier publishes them to the warpgroups.
__device__ __forceinline__ void fence_smem_for_wgmma() {
#if QSAKV_WGMMA
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
// Keeps the compiler from moving accumulator registers across an MMA still in flight.
template <int N>
__device__ __forceinline__ void pin_accumulators(float (&d)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+f"(d[i][j])::"memory");
}

// PTX wants every register of an MMA named: the lists are spelled out.
#define QSAKV_ACC16(d)                                                                          \
  "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),     \
      "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), \
      "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])
#define QSAKV_ACC32(d)                                                                          \
  QSAKV_ACC16(d), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]),    \
      "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), \
      "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
#define QSAKV_ACC64(d)                                                                             \
  QSAKV_ACC32(d), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]),       \
      "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), \
      "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),              \
      "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]),              \
      "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]),              \
      "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]),              \
      "+f"(d[15][3])
#define QSAKV_REGS16 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
#define QSAKV_REGS32                                                         \
  QSAKV_REGS16                                                               \
  ", %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, " \
  "%30, %31"
#define QSAKV_REGS64                                                                        \
  QSAKV_REGS32                                                                              \
  ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, " \
  "%49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
// D[64 x 32] += A[64 x 16] B[16 x 32]; A and B K-major in shared memory.
#define QSAKV_WGMMA_N32_SS(TY)                                                  \
  asm volatile(                                                                 \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"                              \
      "wgmma.mma_async.sync.aligned.m64n32k16.f32." TY "." TY " {" QSAKV_REGS16 \
      "}, %16, %17, p, 1, 1, 0, 0;\n}\n"                                        \
      : QSAKV_ACC16(d)                                                          \
      : "l"(a), "l"(b), "r"(1))
// D[64 x 128] += A[64 x 16] B[16 x 128]; A and B K-major in shared memory.
#define QSAKV_WGMMA_N128_SS(TY)                                                  \
  asm volatile(                                                                  \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                               \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " {" QSAKV_REGS64 \
      "}, %64, %65, p, 1, 1, 0, 0;\n}\n"                                         \
      : QSAKV_ACC64(d)                                                           \
      : "l"(a), "l"(b), "r"(1))
// D[64 x 64] += A[64 x 16] B[16 x 64]; A in registers (mma.sync's A fragment per warp), B
// MN-major in shared memory.
#define QSAKV_WGMMA_N64_RS(TY)                                                  \
  asm volatile(                                                                 \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                              \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " {" QSAKV_REGS32 \
      "}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"                          \
      : QSAKV_ACC32(d)                                                          \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1))

// D[64 x 64] (+)= A[64 x 16] B[16 x 64]; A in registers, B K-major in shared memory; D is
// overwritten (not accumulated into) where %37 is 0: a chain's first k-step needs no zeroed
// accumulators.
#define QSAKV_WGMMA_N64_RS_KB(TY)                                               \
  asm volatile(                                                                 \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                              \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " {" QSAKV_REGS32 \
      "}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"                          \
      : QSAKV_ACC32(d)                                                          \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate ? 1 : 0))

// D[64 x 128] += A[64 x 16] B[16 x 128]; A in registers (mma.sync's A fragment per warp), B
// K-major in shared memory.
#define QSAKV_WGMMA_N128_RS(TY)                                                  \
  asm volatile(                                                                  \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                               \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " {" QSAKV_REGS64 \
      "}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"                           \
      : QSAKV_ACC64(d)                                                           \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1))

// Issues instruction macro M for the element type (sm_90a code); elsewhere traps.
#if QSAKV_WGMMA
#define QSAKV_WGMMA_ISSUE(M) \
  if constexpr (kBf16)       \
    M("bf16");               \
  else                       \
    M("f16")
#else
#define QSAKV_WGMMA_ISSUE(M) __trap()
#endif

template <bool kBf16>
__device__ __forceinline__ void wgmma_m64n32k16_ss([[maybe_unused]] float (&d)[4][4],
                                                   [[maybe_unused]] uint64_t a,
                                                   [[maybe_unused]] uint64_t b) {
  QSAKV_WGMMA_ISSUE(QSAKV_WGMMA_N32_SS);
}

template <bool kBf16>
__device__ __forceinline__ void wgmma_m64n128k16_ss([[maybe_unused]] float (&d)[16][4],
                                                    [[maybe_unused]] uint64_t a,
                                                    [[maybe_unused]] uint64_t b) {
  QSAKV_WGMMA_ISSUE(QSAKV_WGMMA_N128_SS);
}

template <bool kBf16>
__device__ __forceinline__ void wgmma_m64n64k16_rs([[maybe_unused]] float (&d)[8][4],
                                                   [[maybe_unused]] const uint32_t (&a)[4],
                                                   [[maybe_unused]] uint64_t b) {
  QSAKV_WGMMA_ISSUE(QSAKV_WGMMA_N64_RS);
}

// K-major B; accumulate false: D = A B (the first k-step of a chain).
template <bool kBf16>
__device__ __forceinline__ void wgmma_m64n64k16_rs_kmajor([[maybe_unused]] float (&d)[8][4],
                                                          [[maybe_unused]] const uint32_t (&a)[4],
                                                          [[maybe_unused]] uint64_t b,
                                                          [[maybe_unused]] bool accumulate) {
  QSAKV_WGMMA_ISSUE(QSAKV_WGMMA_N64_RS_KB);
}

template <bool kBf16>
__device__ __forceinline__ void wgmma_m64n128k16_rs([[maybe_unused]] float (&d)[16][4],
                                                    [[maybe_unused]] const uint32_t (&a)[4],
                                                    [[maybe_unused]] uint64_t b) {
  QSAKV_WGMMA_ISSUE(QSAKV_WGMMA_N128_RS);
}

// Keeps the compiler from reusing A-fragment registers while an MMA that reads them may
// still be in flight (call after the wait).
template <int N>
__device__ __forceinline__ void pin_fragments(uint32_t (&a)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(a[i][j])::"memory");
}

#undef QSAKV_WGMMA_ISSUE
#undef QSAKV_WGMMA_N128_RS
#undef QSAKV_WGMMA_N64_RS
#undef QSAKV_WGMMA_N64_RS_KB
#undef QSAKV_WGMMA_N128_SS
#undef QSAKV_WGMMA_N32_SS
#undef QSAKV_REGS64
#undef QSAKV_REGS32
#undef QSAKV_REGS16
#undef QSAKV_ACC64
#undef QSAKV_ACC32
#undef QSAKV_ACC16

}  // namespace cuda
}  // namespace qsakv
