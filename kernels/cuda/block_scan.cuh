// SPDX-License-Identifier: Apache-2.0
// A block-wide exclusive prefix sum of one value per thread (the decode route's window
// compaction and the grouped route's token union both number their survivors with it;
// the top-k's bucket sort places its buckets with the shuffle form).
#pragma once

#include <stdint.h>

namespace qsakv {
namespace cuda {

// The inclusive prefix sum of v over lanes 0..kLanes-1 of a warp (lanes past kLanes get
// partial sums that callers ignore). Every lane must call it.
template <int kLanes = 32, class T>
__device__ __forceinline__ T warp_inclusive_scan(T v) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int d = 1; d < kLanes; d <<= 1) {
    const T x = __shfl_up_sync(0xffffffffu, v, d);
    if (lane >= d) v += x;
  }
  return v;
}

// Every thread of a CTA of kWarps warps calls it with its value v; returns the sum of the
// values of the threads before it and sets total to the sum over the CTA (T: int, or a
// long long carrying two sums in its halves). warp_totals: shared memory of kWarps
// values. Its first barrier comes after the warp-level scan, so a
// caller's loads issued before the call overlap the shuffles; it also orders this call's
// use of warp_totals after any earlier one's. A caller that reuses warp_totals' storage
// for something else must add its own barrier after the call.
template <int kWarps, class T>
__device__ __forceinline__ T block_exclusive_scan(T v, T* warp_totals, T& total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const T incl = warp_inclusive_scan(v);
  __syncthreads();
  if (lane == 31) warp_totals[warp] = incl;
  __syncthreads();
  T before = incl - v, sum = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    const T t = warp_totals[w];
    if (w < warp) before += t;
    sum += t;
  }
  total = sum;
  return before;
}

// The same for int values, with the warps' totals scanned by shuffles (a lane per warp)
// instead of a loop over them in every thread: ~15 instructions a thread instead of ~50 for
// 16 warps. The same barriers and the same contract as block_exclusive_scan.
template <int kWarps>
__device__ __forceinline__ int block_exclusive_scan_by_shuffles(int v, int* warp_totals,
                                                                int& total) {
  static_assert(kWarps >= 1 && kWarps <= 32, "a lane per warp");
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int incl = warp_inclusive_scan(v);
  __syncthreads();
  if (lane == 31) warp_totals[warp] = incl;
  __syncthreads();
  // t: lane l's inclusive sum of the warps' totals 0..l.
  const int t = warp_inclusive_scan<kWarps>(lane < kWarps ? warp_totals[lane] : 0);
  const int warps_before = __shfl_sync(0xffffffffu, t, warp > 0 ? warp - 1 : 0);
  total = __shfl_sync(0xffffffffu, t, kWarps - 1);
  return (warp > 0 ? warps_before : 0) + incl - v;
}

}  // namespace cuda
}  // namespace qsakv
