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
// Threads of a K/V store per token (one per run of K or V); a store's thread indices stay
// within 32 bits (launch_store_kv splits larger stores; launch_store_step does not fuse them).
int64_t store_kv_threads_per_token(const StoreKvParams& p) {
  const bool fp8 = p.cache.dtype == QSAKV_DTYPE_E4M3;
  const int chunks = fp8 ? store_chunks<true>() : store_chunks<false>();
  return 2 * (p.cache.kv_heads * p.cache.head_dim / (8 * chunks));
}
}  // namespace

void launch_store_kv(const StoreKvParams& p, bool fp8_instructions, bool programmatic,
                     cudaStream_t stream) {
  const bool fp8 = p.cache.dtype == QSAKV_DTYPE_E4M3;
  const int64_t per_token = store_kv_threads_per_token(p);
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

bool launch_store_step(const StoreStepParams& p, bool fp8_instructions, int sm_count,
                       bool programmatic, cudaStream_t stream) {
  const int64_t kv_threads = p.has_kv ? p.kv.num_tokens * store_kv_threads_per_token(p.kv) : 0;
  if (kv_threads >= (int64_t{1} << 30)) return false;  // a prefill's worth: separate launches
  const uint32_t kv_total = static_cast<uint32_t>(kv_threads);
  const unsigned kv_blocks = (kv_total + 255) / 256;
  const unsigned ring_blocks =
      p.has_ring ? grid_for(p.ring.num_rows * (p.ring.row_elems / 8), sm_count) : 0;
  const unsigned compressed_blocks =
      p.has_compressed ? grid_for(p.compressed.num_keys * 32, sm_count) : 0;
  const unsigned grid = kv_blocks + ring_blocks + compressed_blocks;
  if (grid == 0) return true;
  const bool fp8 = p.has_kv && p.kv.cache.dtype == QSAKV_DTYPE_E4M3;
  const bool bf16 = p.has_kv && p.kv.act_dtype == QSAKV_DTYPE_BF16;
  // The K/V part's variants, as launch_store_kv picks them (any one without a K/V part).
  auto launch = [&](auto kernel) {
    launch_kernel(programmatic, kernel, grid, 256, 0, stream, p, kv_total, kv_blocks, ring_blocks);
  };
  if (fp8 && !fp8_instructions && bf16)
    launch(store_step_kernel<__nv_bfloat16, true, false>);
  else if (fp8 && !fp8_instructions)
    launch(store_step_kernel<__half, true, false>);
  else if (fp8 && bf16)
    launch(store_step_kernel<__nv_bfloat16, true>);
  else if (fp8)
    launch(store_step_kernel<__half, true>);
  else
    launch(store_step_kernel<__half, false>);
  return true;
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
