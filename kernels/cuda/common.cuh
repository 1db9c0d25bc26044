// SPDX-License-Identifier: Apache-2.0
// Small device helpers shared by the kernels: vector loads, bit permutes, conversions.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include <type_traits>

namespace qsakv {
namespace cuda {

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}

// Read-only 16/8/4-byte loads that bypass L1 allocation: K/V are streamed once.
__device__ __forceinline__ uint4 ld_stream16(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}
__device__ __forceinline__ uint2 ld_stream8(const void* p) {
  uint2 v;
  asm("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}

// Loads `Words` 32-bit words from p (aligned to min(16, 4*Words) bytes) into w.
template <int Words>
__device__ __forceinline__ void load_words(uint32_t (&w)[Words], const void* p) {
  if constexpr (Words % 4 == 0) {
#pragma unroll
    for (int i = 0; i < Words / 4; ++i) {
      const uint4 v = ld_stream16(static_cast<const char*>(p) + 16 * i);
      w[4 * i] = v.x;
      w[4 * i + 1] = v.y;
      w[4 * i + 2] = v.z;
      w[4 * i + 3] = v.w;
    }
  } else {
    static_assert(Words == 2, "2, or a multiple of 4, words");
    const uint2 v = ld_stream8(p);
    w[0] = v.x;
    w[1] = v.y;
  }
}

template <int Words>
__device__ __forceinline__ void zero_words(uint32_t (&w)[Words]) {
#pragma unroll
  for (int i = 0; i < Words; ++i) w[i] = 0u;
}

// 2^x with the SFU (ex2.approx: relative error ~2^-22; exp2(-inf) = 0).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Activation element <-> float.
template <class T>
__device__ __forceinline__ float to_float(T x);
template <>
__device__ __forceinline__ float to_float<__half>(__half x) {
  return __half2float(x);
}
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
template <class T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// The maximum of x over the warp's 32 lanes (fmaxf: a NaN lane is ignored unless all are).
__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, d));
  return x;
}

// BF16 queries on FP16 MMAs: the exponent `shift` that scales a query row so that its
// largest |q| (each lane's `mx`, reduced here over the warp: call it from every lane) sits
// just under FP16's top; the kernel multiplies Q by 2^shift and its scores by 2^-shift.
// Clamped so that 2^shift stays finite: a tiny query keeps its (FP16-subnormal or zero)
// values instead of becoming inf * 0 = NaN.
__device__ __forceinline__ int bf16_query_shift(float mx) {
  mx = warp_max(mx);
  int e = 0;
  if (mx > 0.0f && isfinite(mx)) frexpf(mx, &e);  // mx in [2^(e-1), 2^e)
  return max(-100, min(100, 15 - e));
}

__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}
__device__ __forceinline__ uint32_t pack_bf162(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// Four activations from floats (round to nearest) in one 8-byte store; o 8-byte aligned.
template <class Act>
__device__ __forceinline__ void store_act4(Act* o, float a, float b, float c, float d) {
  uint2 w;
  if constexpr (std::is_same<Act, __half>::value) {
    w = make_uint2(pack_half2(a, b), pack_half2(c, d));
  } else {
    static_assert(std::is_same<Act, __nv_bfloat16>::value, "FP16 or BF16 activations");
    w = make_uint2(pack_bf162(a, b), pack_bf162(c, d));
  }
  *reinterpret_cast<uint2*>(o) = w;
}

}  // namespace cuda
}  // namespace qsakv
