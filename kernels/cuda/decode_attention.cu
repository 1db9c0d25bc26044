// SPDX-License-Identifier: Apache-2.0
// Instantiation and dispatch of the decode attention kernels: activation type x cache
// type x head_dim (x decoder for E4M3) -- the shapes that pay for compile-time code.
#include <cmath>

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
  // Raising the dynamic shared-memory limit is a one-time host call per kernel (thread-
  // safe static initialisation; it does not touch the stream, so it is capture-safe).
  static const cudaError_t attr = cudaFuncSetAttribute(
      decode_attention_kernel<Act, KV, D, DEC>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (attr != cudaSuccess)
    refuse_launch(QSAKV_ERROR_CUDA, "cudaFuncSetAttribute(%d bytes of shared memory): %s", smem,
                  cudaGetErrorString(attr));
  decode_attention_kernel<Act, KV, D, DEC><<<grid, kThreads, smem, stream>>>(dp);
}

template <class Act, KvKind KV, Decoder DEC>
void by_dim(const DecodeParams& dp, int D, int max_rows, cudaStream_t stream) {
  switch (D) {
    case 64:
      return launch<Act, KV, 64, DEC>(dp, max_rows, stream);
    case 128:
      return launch<Act, KV, 128, DEC>(dp, max_rows, stream);
    case 256:
      return launch<Act, KV, 256, DEC>(dp, max_rows, stream);
    default:
      refuse_launch(QSAKV_ERROR_UNSUPPORTED, "head_dim %d has no CUDA kernel (64, 128, 256)", D);
  }
}

template <class Act>
void by_cache(const DecodeParams& dp, qsakv_dtype kv, bool hw, int D, int max_rows,
              cudaStream_t stream) {
  // A 16-bit cache always stores the activation type (the config enforces it).
  constexpr bool kBf16 = std::is_same<Act, __nv_bfloat16>::value;
  constexpr KvKind k16 = kBf16 ? KvKind::kBf16 : KvKind::kFp16;
  if (kv == QSAKV_DTYPE_E4M3) {
    if (hw)
      by_dim<Act, KvKind::kE4M3, Decoder::kHardware>(dp, D, max_rows, stream);
    else
      by_dim<Act, KvKind::kE4M3, Decoder::kSoftware>(dp, D, max_rows, stream);
  } else if (kv == (kBf16 ? QSAKV_DTYPE_BF16 : QSAKV_DTYPE_FP16)) {
    by_dim<Act, k16, Decoder::kSoftware>(dp, D, max_rows, stream);
  } else {
    refuse_launch(QSAKV_ERROR_UNSUPPORTED, "no CUDA kernel for a %d cache with these activations",
                  kv);
  }
}

}  // namespace

void launch_decode_attention(const AttentionParams& p, bool hardware_decoder, bool simt,
                             cudaStream_t stream) {
  if (simt) return launch_decode_attention_simt(p, stream);  // the SM70 tier
  const KvCacheView& c = p.cache;
  const DecodeParams dp = decode_params(p);
  if (p.act_dtype == QSAKV_DTYPE_BF16)
    by_cache<__nv_bfloat16>(dp, c.dtype, hardware_decoder, c.head_dim, p.meta.max_rows, stream);
  else
    by_cache<__half>(dp, c.dtype, hardware_decoder, c.head_dim, p.meta.max_rows, stream);
}

}  // namespace cuda
}  // namespace qsakv
