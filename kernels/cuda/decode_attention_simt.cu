// SPDX-License-Identifier: Apache-2.0
// Instantiation and dispatch of the SM70-tier decode attention kernels: activation type x
// cache type x head_dim (E4M3 always takes the software decoder here).
#include "cuda/decode_attention_simt.cuh"
#include "cuda/dependent_launch.cuh"
#include "cuda/launch.hpp"

namespace qsakv {
namespace cuda {

namespace {

template <class Act, KvKind KV, int D>
void launch_simt(const DecodeParams& dp, int max_rows, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(max_rows * dp.kv_heads * dp.head_chunks),
                  static_cast<unsigned>(dp.num_splits));
  // Static shared memory only (SimtSmem < 48 KB): no attribute to raise.
  launch_kernel(false, decode_attention_simt_kernel<Act, KV, D>, grid, kThreads, 0, stream, dp);
}

template <class Act, KvKind KV>
void simt_by_dim(const DecodeParams& dp, int D, int max_rows, cudaStream_t stream) {
  switch (D) {
    case 64:
      return launch_simt<Act, KV, 64>(dp, max_rows, stream);
    case 128:
      return launch_simt<Act, KV, 128>(dp, max_rows, stream);
    case 256:
      return launch_simt<Act, KV, 256>(dp, max_rows, stream);
    default:
      refuse_launch(QSAKV_ERROR_UNSUPPORTED, "head_dim %d has no CUDA kernel (64, 128, 256)", D);
  }
}

template <class Act>
void simt_by_cache(const DecodeParams& dp, qsakv_dtype kv, int D, int max_rows,
                   cudaStream_t stream) {
  // A 16-bit cache always stores the activation type (the config enforces it).
  constexpr bool kBf16 = std::is_same<Act, __nv_bfloat16>::value;
  if (kv == QSAKV_DTYPE_E4M3)
    simt_by_dim<Act, KvKind::kE4M3>(dp, D, max_rows, stream);
  else if (kv == (kBf16 ? QSAKV_DTYPE_BF16 : QSAKV_DTYPE_FP16))
    simt_by_dim<Act, kBf16 ? KvKind::kBf16 : KvKind::kFp16>(dp, D, max_rows, stream);
  else
    refuse_launch(QSAKV_ERROR_UNSUPPORTED, "no CUDA kernel for a %d cache with these activations",
                  kv);
}

}  // namespace

void launch_decode_attention_simt(const AttentionParams& p, cudaStream_t stream) {
  const DecodeParams dp = decode_params(p);
  if (p.act_dtype == QSAKV_DTYPE_BF16)
    simt_by_cache<__nv_bfloat16>(dp, p.cache.dtype, p.cache.head_dim, p.meta.max_rows, stream);
  else
    simt_by_cache<__half>(dp, p.cache.dtype, p.cache.head_dim, p.meta.max_rows, stream);
}

}  // namespace cuda
}  // namespace qsakv
