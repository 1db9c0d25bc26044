// SPDX-License-Identifier: Apache-2.0
// Instantiation and dispatch of the decode attention kernels: activation type x cache
// type x head_dim (x decoder for E4M3) -- the shapes that pay for compile-time code.
#include <cmath>

#include "cuda/attention_dispatch.hpp"
#include "cuda/decode_attention.cuh"
#include "cuda/dependent_launch.cuh"
#include "cuda/launch.hpp"

namespace qsakv {
namespace cuda {

namespace {

template <class Act, KvKind KV, int D, Decoder DEC, int NS>
void launch(const DecodeParams& dp, int max_rows, bool programmatic, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(max_rows * dp.kv_heads * dp.head_chunks),
                  static_cast<unsigned>(dp.num_splits));
  constexpr int smem = dynamic_smem_bytes<D, NS>();
  // The rings need the largest shared-memory carveout for their occupancy.
  static std::atomic<uint64_t> ready{0};
  prepare_kernel_smem(decode_attention_kernel<Act, KV, D, DEC, NS>, smem, NS > 0, ready);
  launch_kernel(programmatic, decode_attention_kernel<Act, KV, D, DEC, NS>, grid, kThreads, smem,
                stream, dp);
}

// The copy ring where it measured faster on an H200 (docs/perf.md, runs 21-22): grids
// that fill three CTAs per SM (large batches: 1024 rows) and small sparse splits of up to
// kRingMaxSplitEntries list entries (1-16 rows). Between them (two CTAs per SM of
// 257-2051 entries: 32-256 rows) the register path is as fast in graphs of many calls
// and 2-10% faster one call at a time with L2 flushed; a three-stage ring at two CTAs per
// SM was no faster there either.
constexpr int kRingMaxSplitEntries = 192;
bool use_ring(const DecodeParams& dp, int max_rows, int sms) {
  if (sms == 0 || !dp.ring_offsets) return false;
  const int64_t ctas =
      static_cast<int64_t>(max_rows) * dp.kv_heads * dp.head_chunks * dp.num_splits;
  if (ctas >= static_cast<int64_t>(decode_ctas_per_sm(KvKind::kE4M3, kRingStages)) * sms)
    return true;
  const int per_split = (dp.topk_width + dp.num_splits - 1) / dp.num_splits;
  return !dp.dense && per_split <= kRingMaxSplitEntries;
}

}  // namespace

void launch_decode_attention(const AttentionParams& p, bool hardware_decoder, bool simt,
                             int ring_sms, bool programmatic, cudaStream_t stream) {
  // The SM70 tier (launched as on a V100: no programmatic launch).
  if (simt) return launch_decode_attention_simt(p, stream);
  const KvCacheView& c = p.cache;
  const DecodeParams dp = decode_params(p);
  dispatch_attention(p.act_dtype, c.dtype, hardware_decoder, c.head_dim, [&](auto shape) {
    using S = decltype(shape);
    using Act = typename S::Act;
    if constexpr (ring_shape<S::kKv, S::kDim>()) {
      if (use_ring(dp, p.meta.max_rows, ring_sms))
        return launch<Act, S::kKv, S::kDim, S::kDecoder, kRingStages>(dp, p.meta.max_rows,
                                                                      programmatic, stream);
    }
    launch<Act, S::kKv, S::kDim, S::kDecoder, 0>(dp, p.meta.max_rows, programmatic, stream);
  });
}

}  // namespace cuda
}  // namespace qsakv
