// SPDX-License-Identifier: Apache-2.0
// Store kernels: K/V into the paged main cache (E4M3 quantisation or 16-bit copy) and
// index-key rows into the raw ring / compressed cache. One thread per 8 elements (16
// input bytes), so loads are 16 bytes wide and every launch is bandwidth-shaped.
#pragma once

#include <math_constants.h>
#include <stdint.h>

#include <type_traits>

#include "params.hpp"
#include "cuda/common.cuh"
#include "cuda/dependent_launch.cuh"
#include "e4m3.cuh"

namespace qsakv {
namespace cuda {

template <class Act>
__device__ __forceinline__ float act_bits_to_float(uint16_t b);
template <>
__device__ __forceinline__ float act_bits_to_float<__half>(uint16_t b) {
  return __half2float(__ushort_as_half(b));
}
template <>
__device__ __forceinline__ float act_bits_to_float<__nv_bfloat16>(uint16_t b) {
  return __uint_as_float(static_cast<uint32_t>(b) << 16);
}

__device__ __forceinline__ float div_by_scale(float x, float scale, float recip) {
  const float q = __fmul_rn(x, recip);
  // Outside the range where the residual is exact (zeros, tiny or huge values, extreme
  // scales, NaN): the IEEE division. Rare and per element.
  if (!(fabsf(q) < 1e37f && fabsf(x) > 1e-30f && fabsf(recip) < 1e37f)) return __fdiv_rn(x, scale);
  const float r = __fmaf_rn(-q, scale, x);  // exact residual
  return __fmaf_rn(r, recip, q);
}

// The same quotient without the range check, for FP16 inputs when scale_in_fast_range:
// every finite nonzero FP16 x then has |x| >= 2^-24 and a quotient within [2^-84, 2^76],
// where div_by_scale takes this very path; zeros keep their sign (x / scale is -0 for
// x = -0; the correction alone would give +0). Infinities and NaN never come here.
__device__ __forceinline__ float div_by_scale_fp16(float x, float scale, float recip) {
  const float q = __fmul_rn(x, recip);
  const float r = __fmaf_rn(-q, scale, x);
  return copysignf(__fmaf_rn(r, recip, q), x);
}
__device__ __forceinline__ bool scale_in_fast_range(float scale) {
  return scale >= 0x1p-60f && scale <= 0x1p60f;
}

// Splits a slot into (block, offset). Slots below 2^32 (every realistic cache) take the
// 32-bit division: a 64-bit one costs several times more on the GPU.
__device__ __forceinline__ void split_slot(int64_t slot, int32_t block_size, int64_t& block,
                                           int64_t& offset) {
  if (slot < (int64_t{1} << 32)) {
    const uint32_t s = static_cast<uint32_t>(slot), b = static_cast<uint32_t>(block_size);
    block = s / b;
    offset = s - static_cast<uint32_t>(block) * b;
  } else {
    block = slot / block_size;
    offset = slot % block_size;
  }
}

// Quantises 8 activations (16 bytes) to 8 E4M3 codes. `any_nan` is set when an input
// was NaN (its code keeps the input's sign: __half2float returns a canonical NaN).
// kCvt: use the FP8 conversion instruction where the GPU has it; false (the SM70 tier)
// always runs the integer encoder, as a V100 does. kFast: FP16 inputs with
// scale_in_fast_range (div_by_scale_fp16; non-finite inputs take the rare path).
template <class Act, bool kCvt, bool kFast = false>
__device__ __forceinline__ uint2 encode8(const uint4& x, float scale, float recip, bool& any_nan) {
  static_assert(!kFast || std::is_same<Act, __half>::value, "the fast quotient is for FP16");
  const uint32_t w[4] = {x.x, x.y, x.z, x.w};
  uint32_t out[2] = {0u, 0u};
#pragma unroll
  for (int j = 0; j < 8; j += 2) {
    const float x0 = act_bits_to_float<Act>(static_cast<uint16_t>(w[j / 2]));
    const float x1 = act_bits_to_float<Act>(static_cast<uint16_t>(w[j / 2] >> 16));
    // The correctly rounded FP32 quotient x / scale (see div_by_scale), then round-to-
    // nearest-even with saturation: the FP8 conversion instruction where it exists,
    // else the shared integer encoder. Both match the CPU backend's IEEE division bit
    // for bit (test_store checks every FP16 input).
    const float q0 = kFast ? div_by_scale_fp16(x0, scale, recip) : div_by_scale(x0, scale, recip);
    const float q1 = kFast ? div_by_scale_fp16(x1, scale, recip) : div_by_scale(x1, scale, recip);
    uint32_t pair = 0u;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    if constexpr (kCvt) {
      uint16_t packed;
      asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(packed) : "f"(q1), "f"(q0));
      pair = packed;
    } else {
      pair = e4m3::encode(q0) | (static_cast<uint32_t>(e4m3::encode(q1)) << 8);
    }
#else
    pair = e4m3::encode(q0) | (static_cast<uint32_t>(e4m3::encode(q1)) << 8);
#endif
    // Rare: NaN (both paths), or an infinity on the fast path (whose quotient it skips).
    const bool rare =
        kFast ? !(fabsf(x0) < CUDART_INF_F && fabsf(x1) < CUDART_INF_F) : (x0 != x0 || x1 != x1);
    if (rare) {
      any_nan |= x0 != x0 || x1 != x1;
      const uint32_t s0 = (w[j / 2] >> 8) & 0x80u, s1 = (w[j / 2] >> 24) & 0x80u;
      const uint32_t b0 = x0 != x0 ? (s0 | e4m3::kNaN) : e4m3::quantize(x0, scale);
      const uint32_t b1 = x1 != x1 ? (s1 | e4m3::kNaN) : e4m3::quantize(x1, scale);
      pair = b0 | (b1 << 8);
    }
    out[j / 4] |= pair << (8 * (j & 3));
  }
  return make_uint2(out[0], out[1]);
}

// encode8 over a thread's N chunks.
template <class Act, bool kCvt, bool kFast, int N>
__device__ __forceinline__ void encode_run(const uint4 (&x)[N], float scale, float recip,
                                           bool& any_nan, uint2 (&out)[N]) {
#pragma unroll
  for (int q = 0; q < N; ++q) out[q] = encode8<Act, kCvt, kFast>(x[q], scale, recip, any_nan);
}

// One thread per (token, K or V, run of kStoreChunks * 8 elements of kv_heads *
// head_dim): its 16-byte loads are in flight together and its writes are one contiguous
// run; runs never straddle heads (head_dim is a multiple of 32). Measured on an H200
// (docs/perf.md): 4 chunks per thread took the E4M3 store from 46 to 34 us for 64K
// tokens, while the 16-bit copy was fastest at 1 (42 us, against 56 us at 4). The
// launcher keeps the grid's thread indices within 32 bits.
template <bool kFp8>
__host__ __device__ constexpr int store_chunks() {
  return kFp8 ? 4 : 1;
}

// Thread i (< total) of a K/V store of the tokens from token_begin: one run of one token's
// K or V (store_kv_kernel, store_step_kernel).
template <class Act, bool kFp8, bool kCvt>
__device__ __forceinline__ void store_kv_thread(const StoreKvParams& p, int64_t token_begin,
                                                uint32_t total, uint32_t i) {
  constexpr int kStoreChunks = store_chunks<kFp8>();
  const KvCacheView c = p.cache;
  const uint32_t row = static_cast<uint32_t>(c.kv_heads * c.head_dim);
  const uint32_t runs = row / (8 * kStoreChunks);
  if (i >= total) return;
  const uint32_t run = i % runs;
  const int kv = static_cast<int>((i / runs) & 1u);
  const int64_t token = token_begin + i / (2 * runs);
  const int64_t capacity = c.num_blocks * c.block_size;
  const int64_t slot = __ldg(p.slot_mapping + token);
  if (slot < 0 || slot >= capacity) return;  // -1 is padding; out of range is dropped
  const uint32_t e = run * 8 * kStoreChunks;
  const uint32_t h = e / static_cast<uint32_t>(c.head_dim),
                 d = e % static_cast<uint32_t>(c.head_dim);
  int64_t block, offset;
  split_slot(slot, c.block_size, block, offset);
  const int64_t dst =
      block * c.stride_block + kv * c.stride_kv + offset * c.stride_token + h * c.stride_head + d;
  const uint4* src = reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(kv ? p.v : p.k) +
                                                    token * row + e);
  uint4 x[kStoreChunks];
#pragma unroll
  for (int q = 0; q < kStoreChunks; ++q) x[q] = __ldg(src + q);
  if constexpr (kFp8) {
    const float scale = __ldg(c.scales + kv);
    const float recip = __frcp_rn(scale);
    constexpr bool kFastInputs = std::is_same<Act, __half>::value;  // div_by_scale_fp16
    bool any_nan = false;
    uint2 out[kStoreChunks];
    if (kFastInputs && scale_in_fast_range(scale))
      encode_run<Act, kCvt, kFastInputs>(x, scale, recip, any_nan, out);
    else
      encode_run<Act, kCvt, false>(x, scale, recip, any_nan, out);
    if (any_nan) atomicOr(c.nan_flag, 1);
    static_assert(kStoreChunks == 4, "two 16-byte stores of codes");
    uint4* o = reinterpret_cast<uint4*>(static_cast<uint8_t*>(c.data) + dst);
    o[0] = make_uint4(out[0].x, out[0].y, out[1].x, out[1].y);
    o[1] = make_uint4(out[2].x, out[2].y, out[3].x, out[3].y);
  } else {
    uint4* o = reinterpret_cast<uint4*>(static_cast<uint16_t*>(c.data) + dst);
#pragma unroll
    for (int q = 0; q < kStoreChunks; ++q) o[q] = x[q];
    // A non-finite V value: the grouped attention route checks this layer's V tiles.
    if (kv == 1) {
      constexpr uint32_t kExp = std::is_same<Act, __nv_bfloat16>::value ? 0x7F807F80u : 0x7C007C00u;
      bool bad = false;
#pragma unroll
      for (int q = 0; q < kStoreChunks; ++q) {
        const uint32_t w[4] = {x[q].x, x[q].y, x[q].z, x[q].w};
#pragma unroll
        for (int k = 0; k < 4; ++k)
          bad |= (w[k] & (kExp & 0xFFFFu)) == (kExp & 0xFFFFu) ||
                 (w[k] & (kExp & 0xFFFF0000u)) == (kExp & 0xFFFF0000u);
      }
      if (bad) atomicOr(c.nan_flag, 1);
    }
  }
}

template <class Act, bool kFp8, bool kCvt = true>
__global__ void store_kv_kernel(const StoreKvParams p, int64_t token_begin, uint32_t total) {
  wait_for_predecessors();  // dependent_launch.cuh
  allow_dependents();
  store_kv_thread<Act, kFp8, kCvt>(p, token_begin, total, blockIdx.x * blockDim.x + threadIdx.x);
}

// Row scatter of FP16 index keys into the raw ring, 16 bytes per thread: thread `first` of
// `threads` (a grid stride; store_ring_kernel, store_step_kernel).
__device__ __forceinline__ void store_ring_threads(const StoreRowsParams& p, int64_t first,
                                                   int64_t threads) {
  const int chunks = p.row_elems / 8;
  const int64_t total = p.num_rows * chunks;
  for (int64_t i = first; i < total; i += threads) {
    const int64_t r = i / chunks;
    const int chunk = static_cast<int>(i % chunks);
    const int32_t req = __ldg(p.request_slots + r);
    const int64_t pos = __ldg(p.positions + r);
    if (pos < 0 || req < 0 || req >= p.max_requests) continue;
    const int64_t dst_row = static_cast<int64_t>(req) * p.ring_length + pos % p.ring_length;
    const uint4 x = __ldg(reinterpret_cast<const uint4*>(p.src + r * p.row_elems) + chunk);
    reinterpret_cast<uint4*>(static_cast<uint16_t*>(p.dst) + dst_row * p.row_elems)[chunk] = x;
  }
}

__global__ void store_ring_kernel(const StoreRowsParams p) {
  wait_for_predecessors();
  allow_dependents();
  store_ring_threads(p, blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x,
                     static_cast<int64_t>(gridDim.x) * blockDim.x);
}

// Compressed index keys into their pages, one warp per key, 8 values (16 input bytes) per
// lane and step. FP16: a copy. E4M3 (kFp8): the warp's max |x| gives the key's scale
// (e4m3::key_scale), then each value is quantised with the IEEE division, exactly as the
// CPU backend does (e4m3::key_code): these keys are 1 per compress_ratio tokens, so the
// division's cost does not show. Thread `first` of `threads` (whole warps; a grid stride
// of warps: store_compressed_kernel, store_step_kernel).
template <bool kFp8>
__device__ __forceinline__ void store_compressed_threads(const StoreCompressedParams& p,
                                                         int64_t first, int64_t threads) {
  const CompressedKeysView& c = p.cache;
  const int lane = threadIdx.x & 31;
  const int chunks = c.dim / 8;
  const int64_t entries = c.num_blocks * c.keys_per_block;
  const int64_t warps = threads / 32;
  for (int64_t i = first / 32; i < p.num_keys; i += warps) {  // warp-uniform
    const int64_t slot = __ldg(p.slot_mapping + i);
    if (slot < 0) continue;
    const int64_t entry = slot / p.compress_ratio;
    if (entry >= entries) continue;
    const uint4* src = reinterpret_cast<const uint4*>(p.src + i * c.dim);
    const CompressedKeyAddress a = compressed_key_address(c, entry);
    if constexpr (!kFp8) {
      for (int k = lane; k < chunks; k += 32) reinterpret_cast<uint4*>(a.codes)[k] = __ldg(src + k);
    } else {
      float amax = 0.0f;
      bool finite = true;
      for (int k = lane; k < chunks; k += 32) {
        const uint4 x = __ldg(src + k);
        const uint32_t w[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const float v =
              fabsf(act_bits_to_float<__half>(static_cast<uint16_t>(w[j / 2] >> (16 * (j & 1)))));
          if (v <= 65504.0f)
            amax = fmaxf(amax, v);
          else
            finite = false;  // NaN or infinite
        }
      }
#pragma unroll
      for (int s = 16; s > 0; s >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, s));
      finite = __all_sync(0xffffffffu, finite);
      const float scale = e4m3::key_scale(amax, finite);
      for (int k = lane; k < chunks; k += 32) {
        const uint4 x = __ldg(src + k);
        const uint32_t w[4] = {x.x, x.y, x.z, x.w};
        uint32_t out[2] = {0u, 0u};
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const float v =
              act_bits_to_float<__half>(static_cast<uint16_t>(w[j / 2] >> (16 * (j & 1))));
          out[j / 4] |= static_cast<uint32_t>(e4m3::key_code(v, scale)) << (8 * (j & 3));
        }
        reinterpret_cast<uint2*>(a.codes)[k] = make_uint2(out[0], out[1]);
      }
      if (lane == 0) *a.scale = scale;
    }
  }
}

template <bool kFp8>
__global__ void store_compressed_kernel(const StoreCompressedParams p) {
  wait_for_predecessors();
  allow_dependents();
  store_compressed_threads<kFp8>(p, blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x,
                                 static_cast<int64_t>(gridDim.x) * blockDim.x);
}

// A step's three stores in one launch (qsakv_store_step): the grid's first kv_blocks CTAs
// store K/V (as store_kv_kernel with token_begin 0), the next ring_blocks the raw index
// keys (as store_ring_kernel), the rest the compressed keys (as store_compressed_kernel).
// The parts write disjoint memory; each CTA takes one part, so the parts' code paths stay
// those of their own kernels, and the launch latency is paid once instead of three times.
template <class Act, bool kFp8, bool kCvt = true>
__global__ void store_step_kernel(const StoreStepParams p, uint32_t kv_total, unsigned kv_blocks,
                                  unsigned ring_blocks) {
  wait_for_predecessors();
  allow_dependents();
  unsigned b = blockIdx.x;
  if (b < kv_blocks) {
    store_kv_thread<Act, kFp8, kCvt>(p.kv, 0, kv_total, b * blockDim.x + threadIdx.x);
    return;
  }
  b -= kv_blocks;
  if (b < ring_blocks) {
    store_ring_threads(p.ring, b * static_cast<int64_t>(blockDim.x) + threadIdx.x,
                       static_cast<int64_t>(ring_blocks) * blockDim.x);
    return;
  }
  b -= ring_blocks;
  const int64_t first = b * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t threads = static_cast<int64_t>(gridDim.x - kv_blocks - ring_blocks) * blockDim.x;
  if (p.compressed.cache.dtype == QSAKV_DTYPE_E4M3)  // CTA-uniform
    store_compressed_threads<true>(p.compressed, first, threads);
  else
    store_compressed_threads<false>(p.compressed, first, threads);
}

}  // namespace cuda
}  // namespace qsakv
