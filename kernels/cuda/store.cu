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

void launch_store_kv(const StoreKvParams& p, int sm_count, cudaStream_t stream) {
  const int64_t work = p.num_tokens * 2 * (p.cache.kv_heads * p.cache.head_dim / 8);
  const int grid = grid_for(work, sm_count);
  const bool fp8 = p.cache.dtype == QSAKV_DTYPE_E4M3;
  const bool bf16 = p.act_dtype == QSAKV_DTYPE_BF16;
  if (fp8 && bf16) store_kv_kernel<__nv_bfloat16, true><<<grid, 256, 0, stream>>>(p);
  else if (fp8) store_kv_kernel<__half, true><<<grid, 256, 0, stream>>>(p);
  else store_kv_kernel<__half, false><<<grid, 256, 0, stream>>>(p);  // a bit copy
}

void launch_store_ring(const StoreRowsParams& p, int sm_count, cudaStream_t stream) {
  store_rows_kernel<true><<<grid_for(p.num_rows * (p.row_elems / 8), sm_count), 256, 0, stream>>>(p);
}

void launch_store_compressed(const StoreRowsParams& p, int sm_count, cudaStream_t stream) {
  store_rows_kernel<false><<<grid_for(p.num_rows * (p.row_elems / 8), sm_count), 256, 0, stream>>>(p);
}

}  // namespace cuda
}  // namespace qsakv
