// SPDX-License-Identifier: Apache-2.0
// Indexer scoring on tensor cores: one warp scores 16 compressed keys of one row per
// MMA tile, keys as M, the row's index heads as N (up to 8), index dims as K.
//
// score(b) = sum over heads h of ReLU(q_h . k_b) / sqrt(D), FP16 inputs, FP32
// accumulation. Products of two FP16 values are exact in FP32, so the only difference
// from the CPU reference is the order of the FP32 additions (the numerics contract in
// docs/selection.md).
//
// Dimension permutation: a dot product does not care in which order its dims are
// visited, so each thread loads a contiguous run of dims of its key with 16-byte loads
// (the 4 threads of a key read 64 contiguous bytes per load) and the query fragments use
// the same permutation. For k-step ks = 2i + h, thread (g, t4) holds dims
// 32i + 8*t4 + 4h + {0,1} in MMA columns 2*t4, 2*t4+1 and dims 32i + 8*t4 + 4h + {2,3} in
// columns 8 + 2*t4, 9 + 2*t4: every dim appears exactly once over the k-steps.
#pragma once

#include <math_constants.h>
#include <stdint.h>

#include "cuda/common.cuh"
#include "limits.hpp"
#include "cuda/mma.cuh"

namespace qsakv {
namespace cuda {

constexpr int kScoreTileKeys = 16;               // M of one MMA tile
constexpr int kScoreMaxHeads = kSelectMaxHeads;  // N of one MMA tile

// Order-preserving map of a float to uint32 (larger float -> larger key). 0 is reserved
// for "not a candidate" (blocks on unmapped pages): real keys are never 0.
__device__ __forceinline__ uint32_t score_key(float f) {
  const uint32_t b = __float_as_uint(f);
  const uint32_t k = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  return k == 0u ? 1u : k;
}

// ReLU as the CPU reference writes it (x > 0 ? x : 0): a NaN dot product counts as 0.
__device__ __forceinline__ float relu_like_reference(float x) { return x > 0.0f ? x : 0.0f; }

// The query fragments (MMA B operand) of one row for a thread: head g (zero beyond the
// row's heads), D/32 runs of 8 dims. Word 2h / 2h+1 of run i feed k-step 2i + h.
template <int D>
struct QueryFrags {
  uint4 run[D / 32];
};

template <int D>
__device__ __forceinline__ void load_query_frags(QueryFrags<D>& q, const uint16_t* row_q, int heads,
                                                 int g, int t4) {
#pragma unroll
  for (int i = 0; i < D / 32; ++i)
    q.run[i] = g < heads ? __ldg(reinterpret_cast<const uint4*>(row_q + g * D + 32 * i + 8 * t4))
                         : make_uint4(0u, 0u, 0u, 0u);
}

// The two keys of a thread in one tile (keys g and g + 8), D/32 runs of 8 dims each.
template <int D>
struct KeyFrags {
  uint4 lo[D / 32];  // key g
  uint4 hi[D / 32];  // key g + 8
};

template <int D>
__device__ __forceinline__ void load_key_runs(uint4 (&run)[D / 32], const uint16_t* key, int t4) {
  if (key) {
#pragma unroll
    for (int i = 0; i < D / 32; ++i) run[i] = ld_stream16(key + 32 * i + 8 * t4);
  } else {
#pragma unroll
    for (int i = 0; i < D / 32; ++i) run[i] = make_uint4(0u, 0u, 0u, 0u);
  }
}

__device__ __forceinline__ uint32_t word(const uint4& v, int w) {
  return w == 0 ? v.x : w == 1 ? v.y : w == 2 ? v.z : v.w;
}

// Scores of the tile's keys g and g + 8, complete (all heads summed, scaled) in every
// lane of the key's quad. FP32 accumulation in a fixed order: the result depends on the
// key and the query only, never on the batch or the grid.
template <int D>
__device__ __forceinline__ void score_tile(const KeyFrags<D>& k, const QueryFrags<D>& q,
                                           float inv_sqrt_dim, float& s_lo, float& s_hi) {
  float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
  for (int i = 0; i < D / 32; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t a[4] = {word(k.lo[i], 2 * h), word(k.hi[i], 2 * h), word(k.lo[i], 2 * h + 1),
                             word(k.hi[i], 2 * h + 1)};
      mma_16816<false>(c, a, word(q.run[i], 2 * h), word(q.run[i], 2 * h + 1));
    }
  }
  // c[0], c[1]: key g, heads 2*t4, 2*t4+1; c[2], c[3]: key g + 8. Heads beyond the row's
  // have a zero query: their dot is 0 (or NaN for a non-finite key), and ReLU gives 0.
  float lo = relu_like_reference(c[0]) + relu_like_reference(c[1]);
  float hi = relu_like_reference(c[2]) + relu_like_reference(c[3]);
  lo += __shfl_xor_sync(0xffffffffu, lo, 1);
  hi += __shfl_xor_sync(0xffffffffu, hi, 1);
  lo += __shfl_xor_sync(0xffffffffu, lo, 2);
  hi += __shfl_xor_sync(0xffffffffu, hi, 2);
  s_lo = lo * inv_sqrt_dim;
  s_hi = hi * inv_sqrt_dim;
}

// ---- Several rows of one request per MMA (verify rows, prefill chunks) ----------------
//
// The rows of one request read the same keys, so a CTA scores a key tile once for up to
// kRowsPerBlock of them: N = rows x heads, kHeadsPad columns per row (the row's heads,
// zero-padded to a power of two), 8 / kHeadsPad rows per MMA n-tile. A column's dot
// product is the same MMA k-step sequence as in score_tile, and the head sum below adds
// the same values in the same order (score_tile's extra additions add +0), so both
// routes give every (row, key) the same score bits.

constexpr int kRowsPerBlock = 16;

// Column sums of one n-tile: on return the lanes with t4 % (kHeadsPad / 2) == 0 hold the
// scores of keys g (lo) and g + 8 (hi) for row 2 * t4 / kHeadsPad of the tile.
template <int kHeadsPad>
__device__ __forceinline__ void sum_row_heads(const float (&c)[4], float inv_sqrt_dim, float& lo,
                                              float& hi) {
  lo = relu_like_reference(c[0]) + relu_like_reference(c[1]);
  hi = relu_like_reference(c[2]) + relu_like_reference(c[3]);
#pragma unroll
  for (int s = 1; s < kHeadsPad / 2; s <<= 1) {
    lo += __shfl_xor_sync(0xffffffffu, lo, s);
    hi += __shfl_xor_sync(0xffffffffu, hi, s);
  }
  lo *= inv_sqrt_dim;
  hi *= inv_sqrt_dim;
}

}  // namespace cuda
}  // namespace qsakv
