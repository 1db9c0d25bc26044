// SPDX-License-Identifier: Apache-2.0
// The softmax state every attention kernel keeps: the online update of a running maximum,
// the partial's LSE, and combining partials (the split-K merges of both routes and the
// merge of a row's decode-route part with its group's shared part). The last-arrival
// ticket that starts a merge is in last_arrival.cuh.
//
// A running state is (m, l, o): the largest score seen, the sum of exp2(score - m), and
// the output weighted the same way, all base 2. A partial is (o, lse): its output normalised by its
// own sum, and lse = m + log2(l) in base 2 (-inf when it saw no token). Partials combine with
// weights exp2(lse_s - M) / W, M the largest lse and W the sum of exp2(lse_s - M).
#pragma once

#include <math_constants.h>

#include "cuda/common.cuh"

namespace qsakv {
namespace cuda {

// One online-softmax step for a row whose running maximum was m and whose new tile's
// largest score is tile_max: the new maximum, the reference the tile's scores are
// exponentiated against (the maximum, or 0 while every score seen is -inf: exp2(-inf -
// -inf) would be NaN), and alpha = exp2(m - ref), the factor that rescales l and o. fmaxf
// ignores a NaN tile maximum, so a NaN score lives on in l and o.
struct OnlineMax {
  float m, ref, alpha;
};
__device__ __forceinline__ OnlineMax online_max(float m, float tile_max) {
  OnlineMax r;
  r.m = fmaxf(m, tile_max);
  r.ref = r.m == -CUDART_INF_F ? 0.0f : r.m;
  r.alpha = fast_exp2(m - r.ref);
  return r;
}

// The base-2 LSE of a running state, -inf when it saw no token (l == 0).
__device__ __forceinline__ float state_lse(float m, float l) {
  return l != 0.0f ? m + log2f(l) : -CUDART_INF_F;
}

// In place: the base-2 LSEs w[0..n) become the partials' weights; returns the combined
// LSE. fmaxf ignores a NaN lse (a NaN score), so M stays finite or -inf and the NaN lives
// on in its own weight and the sum. Every lse -inf (no token anywhere): weights 0 and a
// combined lse of -inf, so the output is zeros; a NaN weight makes every weight NaN.
__device__ __forceinline__ float lse_to_weights(float* w, int n) {
  float M = -CUDART_INF_F;
  for (int s = 0; s < n; ++s) M = fmaxf(M, w[s]);
  float W = 0.0f;
  for (int s = 0; s < n; ++s) {
    // M == -inf: every lse is -inf (weight 0) or NaN (kept, so it poisons W).
    w[s] = M == -CUDART_INF_F ? (w[s] == -CUDART_INF_F ? 0.0f : w[s]) : fast_exp2(w[s] - M);
    W += w[s];
  }
  const float inv = W != 0.0f ? 1.0f / W : 0.0f;  // 1 / NaN is NaN
  for (int s = 0; s < n; ++s) w[s] *= inv;
  return W != 0.0f ? M + log2f(W) : -CUDART_INF_F;
}

// Folds a normalised partial (its LSE ls) into an unnormalised state (running maximum M,
// sum L): returns the factors a (for L and the state's output) and b (for the partial's
// output) so that L' = L a + b, o' = o a + o_partial b. M is never NaN (fmaxf); a NaN ls
// makes b NaN, and so the output NaN, as a NaN score does.
__device__ __forceinline__ void fold_factors(float M, float ls, float& a, float& b) {
  const float mx = fmaxf(M, ls);
  a = M == -CUDART_INF_F ? 0.0f : fast_exp2(M - mx);
  b = ls == -CUDART_INF_F ? 0.0f : fast_exp2(ls - mx);
}

}  // namespace cuda
}  // namespace qsakv
