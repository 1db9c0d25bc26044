// SPDX-License-Identifier: Apache-2.0
// Calibration statistics kernel: one pass over K and V (blockIdx.y picks which), 8
// values (16 bytes) per load. Each block bins into a shared-memory histogram, then
// flushes its nonzero bins, its counts and its maximum with global atomics, so any
// number of blocks, streams and calls accumulate into the same entry.
//
// The bin of a value comes from a 64K-entry table of every 16-bit pattern (built on the
// host in FP64, shared with the CPU backend): no log2 on the device, and both backends
// give bit-identical histograms.
#include <stdint.h>

#include "cuda/launch.hpp"
#include "cuda/common.cuh"
#include "cuda/dependent_launch.cuh"

namespace qsakv {
namespace cuda {

namespace {

constexpr int kThreads = 256;

template <bool kBf16>
__device__ __forceinline__ float magnitude(uint16_t bits) {
  const uint16_t m = bits & 0x7FFF;
  if constexpr (kBf16)
    return __uint_as_float(static_cast<uint32_t>(m) << 16);
  else
    return __half2float(__ushort_as_half(m));
}

template <bool kBf16>
__device__ __forceinline__ void observe_value(uint16_t bits, const uint16_t* __restrict__ table,
                                              uint32_t* hist, uint32_t& finite, uint32_t& nonzero,
                                              float& mx) {
  const uint16_t code = __ldg(table + bits);
  if (code == calib::kCodeNonFinite) return;
  ++finite;
  if (code == calib::kCodeZero) return;
  ++nonzero;
  atomicAdd(hist + code, 1u);
  mx = fmaxf(mx, magnitude<kBf16>(bits));
}

template <bool kBf16>
__global__ void __launch_bounds__(kThreads) calib_observe_kernel(const CalibObserveParams p) {
  __shared__ uint32_t hist[calib::kBins];
  __shared__ uint32_t s_finite, s_nonzero;
  __shared__ float s_max;
  const bool is_v = blockIdx.y == 1;
  const uint16_t* __restrict__ x = static_cast<const uint16_t*>(is_v ? p.v : p.k);
  uint64_t* words = is_v ? p.words_v : p.words_k;
  float* max_out = is_v ? p.max_v : p.max_k;
  for (int b = threadIdx.x; b < calib::kBins; b += kThreads) hist[b] = 0u;
  if (threadIdx.x == 0) {
    s_finite = 0u;
    s_nonzero = 0u;
    s_max = 0.0f;
  }
  __syncthreads();

  // Per-thread counts stay in 32 bits: a block sees at most 2^32 - 1 values per call
  // (the launcher bounds elements per block accordingly).
  uint32_t finite = 0u, nonzero = 0u;
  float mx = 0.0f;
  const int64_t chunks = p.num_elems / 8;
  for (int64_t c = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; c < chunks;
       c += static_cast<int64_t>(gridDim.x) * kThreads) {
    const uint4 w = ld_stream16(x + c * 8);
    const uint32_t words4[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int j = 0; j < 8; ++j)
      observe_value<kBf16>(static_cast<uint16_t>(words4[j / 2] >> (16 * (j & 1))), p.bin_table,
                           hist, finite, nonzero, mx);
  }
  // The tail beyond the last whole 16-byte chunk (rows are multiples of 8 in practice).
  if (blockIdx.x == 0)
    for (int64_t i = chunks * 8 + threadIdx.x; i < p.num_elems; i += kThreads)
      observe_value<kBf16>(x[i], p.bin_table, hist, finite, nonzero, mx);

      // Warp reduction, then one shared atomic per warp.
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    finite += __shfl_xor_sync(0xffffffffu, finite, o);
    nonzero += __shfl_xor_sync(0xffffffffu, nonzero, o);
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  }
  if ((threadIdx.x & 31) == 0) {
    atomicAdd(&s_finite, finite);
    atomicAdd(&s_nonzero, nonzero);
    // Non-negative floats order like their bit patterns.
    atomicMax(reinterpret_cast<unsigned int*>(&s_max), __float_as_uint(mx));
  }
  __syncthreads();
  unsigned long long* out = reinterpret_cast<unsigned long long*>(words);
  for (int b = threadIdx.x; b < calib::kBins; b += kThreads)
    if (hist[b]) atomicAdd(out + calib::kWordHist + b, static_cast<unsigned long long>(hist[b]));
  if (threadIdx.x == 0) {
    if (blockIdx.x == 0)
      atomicAdd(out + calib::kWordCount, static_cast<unsigned long long>(p.num_elems));
    if (s_finite) atomicAdd(out + calib::kWordFinite, static_cast<unsigned long long>(s_finite));
    if (s_nonzero) atomicAdd(out + calib::kWordNonzero, static_cast<unsigned long long>(s_nonzero));
    if (s_max > 0.0f) atomicMax(reinterpret_cast<unsigned int*>(max_out), __float_as_uint(s_max));
  }
}

}  // namespace

void launch_calib_observe(const CalibObserveParams& p, int sm_count, cudaStream_t stream) {
  const int64_t chunks = p.num_elems / 8;
  // Two blocks per SM and kind fill the GPU; at least one 16-byte chunk per thread
  // (fewer blocks for small calls: each block flushes up to 4096 bins); and enough
  // blocks that no block sees 2^32 values (its 32-bit counters).
  int64_t blocks = (chunks + kThreads - 1) / kThreads;
  blocks = blocks < 2 * sm_count ? blocks : 2 * sm_count;
  const int64_t min_blocks = p.num_elems / (int64_t{1} << 31) + 1;
  if (blocks < min_blocks) blocks = min_blocks;
  if (blocks > 65535 * 16) blocks = 65535 * 16;
  const dim3 grid(static_cast<unsigned>(blocks > 0 ? blocks : 1), 2);
  if (p.act_dtype == QSAKV_DTYPE_BF16)
    launch_kernel(false, calib_observe_kernel<true>, grid, kThreads, 0, stream, p);
  else
    launch_kernel(false, calib_observe_kernel<false>, grid, kThreads, 0, stream, p);
}

}  // namespace cuda
}  // namespace qsakv
