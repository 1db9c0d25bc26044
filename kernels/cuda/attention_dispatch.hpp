// SPDX-License-Identifier: Apache-2.0
// Host-side dispatch of the tensor-core attention kernels on the shapes that are compiled
// in: activation type x cache type x head_dim (x decoder for E4M3). Both attention
// launchers (decode and grouped route) call it with a generic lambda that launches one
// instantiation, so the set of kernels is written down once.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "cuda/decode_attention.cuh"
#include "cuda/e4m3_decode.cuh"
#include "cuda/kernel_smem.hpp"
#include "cuda/launch.hpp"

namespace qsakv {
namespace cuda {

// The compile-time shape a launcher receives.
template <class ActT, KvKind KvT, int DimT, Decoder DecT>
struct AttentionShape {
  using Act = ActT;
  static constexpr KvKind kKv = KvT;
  static constexpr int kDim = DimT;
  static constexpr Decoder kDecoder = DecT;
};

namespace detail {

template <class Act, KvKind KV, Decoder DEC, class F>
void attention_by_dim(int D, F&& launch) {
  switch (D) {
    case 64:
      return launch(AttentionShape<Act, KV, 64, DEC>{});
    case 128:
      return launch(AttentionShape<Act, KV, 128, DEC>{});
    case 256:
      return launch(AttentionShape<Act, KV, 256, DEC>{});
    default:
      refuse_launch(QSAKV_ERROR_UNSUPPORTED, "head_dim %d has no CUDA kernel (64, 128, 256)", D);
  }
}

template <class Act, class F>
void attention_by_cache(qsakv_dtype kv, bool hw, int D, F&& launch) {
  // A 16-bit cache always stores the activation type (the config enforces it).
  constexpr bool kBf16 = std::is_same<Act, __nv_bfloat16>::value;
  constexpr KvKind k16 = kBf16 ? KvKind::kBf16 : KvKind::kFp16;
  if (kv == QSAKV_DTYPE_E4M3) {
    if (hw)
      attention_by_dim<Act, KvKind::kE4M3, Decoder::kHardware>(D, launch);
    else
      attention_by_dim<Act, KvKind::kE4M3, Decoder::kSoftware>(D, launch);
  } else if (kv == (kBf16 ? QSAKV_DTYPE_BF16 : QSAKV_DTYPE_FP16)) {
    attention_by_dim<Act, k16, Decoder::kSoftware>(D, launch);
  } else {
    refuse_launch(QSAKV_ERROR_UNSUPPORTED, "no CUDA kernel for a %d cache with these activations",
                  kv);
  }
}

}  // namespace detail

// Calls launch(AttentionShape<...>{}) for the kernel of these types and head_dim; throws
// LaunchError (UNSUPPORTED) for a combination without one.
template <class F>
void dispatch_attention(qsakv_dtype act, qsakv_dtype kv, bool hardware_decoder, int head_dim,
                        F&& launch) {
  if (act == QSAKV_DTYPE_BF16)
    detail::attention_by_cache<__nv_bfloat16>(kv, hardware_decoder, head_dim, launch);
  else
    detail::attention_by_cache<__half>(kv, hardware_decoder, head_dim, launch);
}

}  // namespace cuda
}  // namespace qsakv
