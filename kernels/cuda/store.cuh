// Store kernels: K/V into the paged main cache (E4M3 quantisation or 16-bit copy) and
// index-key rows into the raw ring / compressed cache. One thread per 8 elements (16
// input bytes), so loads are 16 bytes wide and every launch is bandwidth-shaped.
#pragma once

#include <stdint.h>

#include "core/params.hpp"
#include "cuda/common.cuh"
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

// grid-stride over (token, K or V, chunk of 8 elements of kv_heads * head_dim).
template <class Act, bool kFp8>
__global__ void store_kv_kernel(const StoreKvParams p) {
  const KvCacheView c = p.cache;
  const int row = c.kv_heads * c.head_dim;
  const int chunks = row / 8;
  const int64_t total = p.num_tokens * 2 * chunks;
  const int64_t capacity = c.num_blocks * c.block_size;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int chunk = static_cast<int>(i % chunks);
    const int kv = static_cast<int>((i / chunks) & 1);
    const int64_t token = i / (2 * chunks);
    const int64_t slot = __ldg(p.slot_mapping + token);
    if (slot < 0 || slot >= capacity) continue;  // -1 is padding; out of range is dropped
    const int e = chunk * 8;
    const int h = e / c.head_dim, d = e % c.head_dim;
    const int64_t dst = (slot / c.block_size) * c.stride_block + kv * c.stride_kv +
                        (slot % c.block_size) * c.stride_token + h * c.stride_head + d;
    const uint4 x = __ldg(reinterpret_cast<const uint4*>(
        static_cast<const uint16_t*>(kv ? p.v : p.k) + token * row + e));
    if constexpr (kFp8) {
      const float scale = __ldg(c.scales + kv);
      const uint32_t w[4] = {x.x, x.y, x.z, x.w};
      uint32_t out[2] = {0u, 0u};
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const uint16_t b = static_cast<uint16_t>(w[j / 2] >> (16 * (j & 1)));
        // FP32 division (IEEE, not the fast reciprocal), then the shared encoder.
        const float q = __fdiv_rn(act_bits_to_float<Act>(b), scale);
        out[j / 4] |= static_cast<uint32_t>(e4m3::encode(q)) << (8 * (j & 3));
      }
      *reinterpret_cast<uint2*>(static_cast<uint8_t*>(c.data) + dst) = make_uint2(out[0], out[1]);
    } else {
      *reinterpret_cast<uint4*>(static_cast<uint16_t*>(c.data) + dst) = x;
    }
  }
}

// Row scatter of FP16 index keys: 16 bytes per thread.
template <bool kRing>
__global__ void store_rows_kernel(const StoreRowsParams p) {
  const int chunks = p.row_elems / 8;
  const int64_t total = p.num_rows * chunks;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / chunks;
    const int chunk = static_cast<int>(i % chunks);
    int64_t dst_row;
    if constexpr (kRing) {
      const int32_t req = __ldg(p.request_slots + r);
      const int64_t pos = __ldg(p.positions + r);
      if (pos < 0 || req < 0 || req >= p.max_requests) continue;
      dst_row = static_cast<int64_t>(req) * p.ring_length + pos % p.ring_length;
    } else {
      const int64_t slot = __ldg(p.slot_mapping + r);
      if (slot < 0) continue;
      dst_row = slot / p.compress_ratio;
      if (dst_row >= p.dst_rows) continue;
    }
    const uint4 x = __ldg(reinterpret_cast<const uint4*>(p.src + r * p.row_elems) + chunk);
    reinterpret_cast<uint4*>(static_cast<uint16_t*>(p.dst) + dst_row * p.row_elems)[chunk] = x;
  }
}

}  // namespace cuda
}  // namespace qsakv
