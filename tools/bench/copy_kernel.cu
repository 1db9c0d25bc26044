// SPDX-License-Identifier: Apache-2.0
// A device-to-device copy done by SM threads (16-byte loads and stores, grid-stride),
// the same memory path the attention kernels use: the bandwidth ceiling of the bench.
#include <cuda_runtime.h>
#include <stdint.h>

__global__ void bench_copy_kernel(const uint4* __restrict__ src, uint4* __restrict__ dst,
                                  size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    dst[i] = __ldg(src + i);
}

extern "C" cudaError_t bench_copy(const void* src, void* dst, size_t bytes, int sms,
                                  cudaStream_t s) {
  bench_copy_kernel<<<sms * 8, 512, 0, s>>>(static_cast<const uint4*>(src),
                                            static_cast<uint4*>(dst), bytes / 16);
  return cudaGetLastError();
}
