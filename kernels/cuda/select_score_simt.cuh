// SPDX-License-Identifier: Apache-2.0
// The SM70 tier of indexer scoring: CUDA-core FP32, one thread per compressed key (SM70
// has no m16n8k16 MMA). It fills the same workspace as select_score_kernel (select.cu):
// the row's score keys at ws + (row - row0) * ws_stride, 0 for an unmapped page, and adds
// every key to the row's histogram of its top 11 bits (the top-k kernel then runs with
// hist_ready = true).
//
// score(b) = sum over heads h of ReLU(q_h . k_b) / sqrt(D), FP16 inputs, FP32 FMA: each
// product of two FP16 values is exact, the dot product is accumulated dim 0..D-1 and the
// heads are summed 0..7 (heads beyond the row's add +0). One thread runs this fixed
// sequence for one (row, key), whatever the grid or batch: deterministic and
// batch-invariant, as docs/selection.md requires (the values may differ from the tensor-
// core tier's in the last bits: another order of FP32 additions). E4M3 keys (kFp8): the
// codes' values (e4m3::key_code_value), the score times the key's scale, as on the CPU.
#pragma once

#include <stdint.h>

#include "e4m3.cuh"
#include "params.hpp"
#include "cuda/common.cuh"
#include "cuda/dependent_launch.cuh"
#include "cuda/select_score.cuh"

namespace qsakv {
namespace cuda {

constexpr int kSimtScoreThreads = 128;
constexpr int kSimtHistBits = 11;  // select.cu's kTopBits (checked there)
constexpr int kSimtHistBins = 1 << kSimtHistBits;

template <int D, bool kFp8>
__global__ void __launch_bounds__(kSimtScoreThreads, 4)
    select_score_simt_kernel(const SelectParams p, int row0, int wave_rows, int64_t ws_stride,
                             int keys_per_cta, float inv_sqrt_dim) {
  __shared__ uint32_t hist[kSimtHistBins];
  __shared__ alignas(16) float q[kScoreMaxHeads][D];  // the row's heads in FP32, 0 beyond
  const int row = row0 + static_cast<int>(blockIdx.y);
  if (row >= p.meta.header->num_rows) return;
  const int pos = p.meta.row_pos[row];
  const int64_t n = min(static_cast<int64_t>((pos + 1) / p.ratio), p.max_blocks);
  const int64_t cta0 = static_cast<int64_t>(blockIdx.x) * keys_per_cta;
  if (cta0 >= n) return;
  const int64_t cta1 = min(n, cta0 + keys_per_cta);
  const int req = p.meta.row_request[row];
  const int32_t* bt =
      p.meta.header->block_table + static_cast<int64_t>(req) * p.meta.header->block_table_stride;

  for (int i = threadIdx.x; i < kSimtHistBins; i += kSimtScoreThreads) hist[i] = 0u;
  for (int i = threadIdx.x; i < kScoreMaxHeads * D; i += kSimtScoreThreads) {
    const int h = i / D, d = i % D;
    q[h][d] = h < p.index_heads
                  ? __half2float(__ushort_as_half(
                        p.index_q[(static_cast<int64_t>(row) * p.index_heads + h) * D + d]))
                  : 0.0f;
  }
  uint32_t* ws =
      reinterpret_cast<uint32_t*>(p.score_workspace) + static_cast<int64_t>(row - row0) * ws_stride;
  __syncthreads();  // hist cleared, q loaded

  for (int64_t b = cta0 + threadIdx.x; b < cta1; b += kSimtScoreThreads) {
    // Key b's bytes (codes == nullptr: its page is unmapped, no key).
    const CompressedKeyAddress a = key_address(p, bt, b, n);
    uint32_t key = 0u;
    if (a.codes) {
      constexpr int kPerLoad = kFp8 ? 16 : 8;  // values per 16-byte load
      float acc[kScoreMaxHeads];
#pragma unroll
      for (int h = 0; h < kScoreMaxHeads; ++h) acc[h] = 0.0f;
#pragma unroll
      for (int c = 0; c < D / kPerLoad; ++c) {
        // Through L1: a thread reads its key in 16-byte pieces of 32-byte sectors.
        const uint4 w = __ldg(reinterpret_cast<const uint4*>(a.codes) + c);
        const uint32_t words[4] = {w.x, w.y, w.z, w.w};
        float kf[kPerLoad];
#pragma unroll
        for (int j = 0; j < kPerLoad; ++j)
          kf[j] = kFp8 ? e4m3::key_code_value(static_cast<uint8_t>(words[j / 4] >> (8 * (j % 4))))
                       : __half2float(__ushort_as_half(
                             static_cast<uint16_t>(words[j / 2] >> (16 * (j % 2)))));
#pragma unroll
        for (int h = 0; h < kScoreMaxHeads; ++h)
#pragma unroll
          for (int i = 0; i < kPerLoad; ++i) acc[h] = fmaf(q[h][kPerLoad * c + i], kf[i], acc[h]);
      }
      float s = 0.0f;
#pragma unroll
      for (int h = 0; h < kScoreMaxHeads; ++h) s += relu_like_reference(acc[h]);
      s *= inv_sqrt_dim;
      if (kFp8) s *= __ldg(a.scale);
      key = score_key(s);
    }
    ws[b] = key;
    if (key) atomicAdd(&hist[key >> (32 - kSimtHistBits)], 1u);
  }
  __syncthreads();
  uint32_t* row_hist = reinterpret_cast<uint32_t*>(p.score_workspace) +
                       static_cast<int64_t>(wave_rows) * ws_stride +
                       static_cast<int64_t>(row - row0) * kSimtHistBins;
  for (int i = threadIdx.x; i < kSimtHistBins; i += kSimtScoreThreads)
    if (hist[i]) atomicAdd(row_hist + i, hist[i]);
}

#if !defined(__CUDACC_RTC__)  // host code: not in the NVRTC sm_70 build check
// Grid (chunks, rows), each CTA the same keys_per_cta keys as the tensor-core route's.
template <bool kFp8>
inline void launch_score_simt_keys(const SelectParams& p, const dim3 grid, int row0, int wave,
                                   int64_t stride, int keys_per_cta, float inv_sqrt_dim,
                                   cudaStream_t stream) {
  switch (p.index_dim) {
    case 64:
      launch_kernel(false, select_score_simt_kernel<64, kFp8>, grid, kSimtScoreThreads, 0, stream,
                    p, row0, wave, stride, keys_per_cta, inv_sqrt_dim);
      break;
    case 128:
      launch_kernel(false, select_score_simt_kernel<128, kFp8>, grid, kSimtScoreThreads, 0, stream,
                    p, row0, wave, stride, keys_per_cta, inv_sqrt_dim);
      break;
    default:
      launch_kernel(false, select_score_simt_kernel<256, kFp8>, grid, kSimtScoreThreads, 0, stream,
                    p, row0, wave, stride, keys_per_cta, inv_sqrt_dim);
      break;
  }
}
inline void launch_score_simt(const SelectParams& p, int64_t chunks, int rows, int row0, int wave,
                              int64_t stride, int keys_per_cta, float inv_sqrt_dim,
                              cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(chunks), static_cast<unsigned>(rows));
  if (p.keys.dtype == QSAKV_DTYPE_E4M3)
    launch_score_simt_keys<true>(p, grid, row0, wave, stride, keys_per_cta, inv_sqrt_dim, stream);
  else
    launch_score_simt_keys<false>(p, grid, row0, wave, stride, keys_per_cta, inv_sqrt_dim, stream);
}
#endif

}  // namespace cuda
}  // namespace qsakv
