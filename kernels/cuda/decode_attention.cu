// SPDX-License-Identifier: Apache-2.0
// Instantiation and dispatch of the decode attention kernels: activation type x cache
// type x head_dim (x decoder for E4M3) -- the shapes that pay for compile-time code.
#include <cmath>

#include "cuda/attention_dispatch.hpp"
#include "cuda/decode_attention.cuh"
#include "cuda/launch.hpp"

namespace qsakv {
namespace cuda {

namespace {

template <class Act, KvKind KV, int D, Decoder DEC>
void launch(const DecodeParams& dp, int max_rows, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(max_rows * dp.kv_heads * dp.head_chunks),
                  static_cast<unsigned>(dp.num_splits));
  constexpr int smem = dynamic_smem_bytes<D>();
  // Raising the dynamic shared-memory limit: once per kernel (thread-safe static init).
  static const cudaError_t attr = cudaFuncSetAttribute(
      decode_attention_kernel<Act, KV, D, DEC>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  require_smem_limit(attr, smem);
  decode_attention_kernel<Act, KV, D, DEC><<<grid, kThreads, smem, stream>>>(dp);
}

}  // namespace

void launch_decode_attention(const AttentionParams& p, bool hardware_decoder, bool simt,
                             cudaStream_t stream) {
  if (simt) return launch_decode_attention_simt(p, stream);  // the SM70 tier
  const KvCacheView& c = p.cache;
  const DecodeParams dp = decode_params(p);
  dispatch_attention(p.act_dtype, c.dtype, hardware_decoder, c.head_dim, [&](auto shape) {
    using S = decltype(shape);
    launch<typename S::Act, S::kKv, S::kDim, S::kDecoder>(dp, p.meta.max_rows, stream);
  });
}

}  // namespace cuda
}  // namespace qsakv
