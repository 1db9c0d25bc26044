// SPDX-License-Identifier: Apache-2.0
#include <algorithm>

#include "cuda/dependent_launch.cuh"
#include "cuda/launch.hpp"
#include "cuda/store.cuh"

namespace qsakv {
namespace cuda {

namespace {
int grid_for(int64_t work, int sm_count) {
  const int64_t blocks = (work + 255) / 256;
  const int64_t cap = static_cast<int64_t>(sm_count) * 8;  // enough to fill the GPU
  return static_cast<int>(blocks < cap ? (blocks > 0 ? blocks : 1) : cap);
}
}  // namespace

void launch_store_kv(const StoreKvParams& p, bool fp8_instructions, bool programmatic,
                     cudaStream_t stream) {
  const bool fp8 = p.cache.dtype == QSAKV_DTYPE_E4M3;
  const int chunks = fp8 ? store_chunks<true>() : store_chunks<false>();
  const int64_t per_token = 2 * (p.cache.kv_heads * p.cache.head_dim / (8 * chunks));
  const bool bf16 = p.act_dtype == QSAKV_DTYPE_BF16;
  // Pieces small enough for 32-bit thread indices.
  const int64_t max_tokens = (int64_t{1} << 30) / per_token;
  for (int64_t begin = 0; begin < p.num_tokens; begin += max_tokens) {
    const int64_t tokens = std::min(max_tokens, p.num_tokens - begin);
    const uint32_t total = static_cast<uint32_t>(tokens * per_token);
    const unsigned grid = (total + 255) / 256;
    if (fp8 && !fp8_instructions && bf16)  // the SM70 tier: the integer encoder
      launch_kernel(programmatic, store_kv_kernel<__nv_bfloat16, true, false>, grid, 256, 0, stream,
                    p, begin, total);
    else if (fp8 && !fp8_instructions)
      launch_kernel(programmatic, store_kv_kernel<__half, true, false>, grid, 256, 0, stream, p,
                    begin, total);
    else if (fp8 && bf16)
      launch_kernel(programmatic, store_kv_kernel<__nv_bfloat16, true>, grid, 256, 0, stream, p,
                    begin, total);
    else if (fp8)
      launch_kernel(programmatic, store_kv_kernel<__half, true>, grid, 256, 0, stream, p, begin,
                    total);
    else
      launch_kernel(programmatic, store_kv_kernel<__half, false>, grid, 256, 0, stream, p, begin,
                    total);  // a bit copy
  }
}

bool dependent_launch_compiled() {
  cudaFuncAttributes a;
  if (cudaFuncGetAttributes(&a, store_ring_kernel) != cudaSuccess) {
    cudaGetLastError();  // not this call's error to leave pending
    return false;
  }
  return a.ptxVersion >= 90;  // every kernel is built from the same virtual architectures
}

void launch_store_ring(const StoreRowsParams& p, int sm_count, bool programmatic,
                       cudaStream_t stream) {
  launch_kernel(programmatic, store_ring_kernel, grid_for(p.num_rows * (p.row_elems / 8), sm_count),
                256, 0, stream, p);
}

void launch_store_compressed(const StoreCompressedParams& p, int sm_count, bool programmatic,
                             cudaStream_t stream) {
  const int grid = grid_for(p.num_keys * 32, sm_count);  // a warp per key
  launch_kernel(programmatic,
                p.cache.dtype == QSAKV_DTYPE_E4M3 ? store_compressed_kernel<true>
                                                  : store_compressed_kernel<false>,
                grid, 256, 0, stream, p);
}

}  // namespace cuda
}  // namespace qsakv
