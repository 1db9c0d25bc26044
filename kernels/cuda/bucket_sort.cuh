// SPDX-License-Identifier: Apache-2.0
// A block-wide sort of a row's top-k winners (unique nonzero 64-bit composites, see
// radix_topk.cuh) by buckets over their own value range: a counting sort on the bucket,
// then a count of the larger members within each bucket.
//
// Why buckets over the range, not over fixed digits: the composite's top half is the
// order-preserving score key, whose top bits (sign, exponent, two mantissa bits) put a
// row's winners in a handful of values; their actual range cut into kSortBuckets equal
// parts spreads 512 winners one or two to a bucket for the score distributions we see.
// A crowded bucket (near-equal winners beside a far outlier, or many equal scores beside
// other scores) makes the sort decline, and the caller sorts another way.
#pragma once

#include <stdint.h>

#include "cuda/block_scan.cuh"

namespace qsakv {
namespace cuda {

constexpr int kSortBuckets = 2048;
constexpr int kSortBucketLog2 = 11;
static_assert(1 << kSortBucketLog2 == kSortBuckets, "a power of two");
// More winners than this in one bucket and the sort declines: the count of larger members
// is a loop over the bucket per winner (~4 instructions a member), quadratic in its size.
// At 128 a crowded bucket costs its warps at most ~512 instructions each, below the runs
// sort's ~800 a thread for every thread (docs/perf.md run 42) plus this sort's own; at
// ~250 the two meet. Ties are what crowd a bucket in practice (ReLU zeros of a short row
// whose every block is taken, quantised scores).
constexpr int kSortBucketMax = 128;

// The smallest and largest of one value per thread over a CTA of kWarps warps (lo, hi:
// this thread's; pass ~0 and 0 for none). scratch: 2 * kWarps shared values. Every thread
// gets the results. One barrier; a caller that reuses scratch must add its own.
template <int kWarps>
__device__ __forceinline__ void block_min_max(unsigned long long& lo, unsigned long long& hi,
                                              unsigned long long* scratch) {
  static_assert(kWarps <= 16, "the warps' values fit in half a warp");
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) {
    const unsigned long long l = __shfl_xor_sync(0xffffffffu, lo, d);
    const unsigned long long h = __shfl_xor_sync(0xffffffffu, hi, d);
    lo = l < lo ? l : lo;
    hi = h > hi ? h : hi;
  }
  if (lane == 0) {
    scratch[warp] = lo;
    scratch[kWarps + warp] = hi;
  }
  __syncthreads();
  lo = lane < kWarps ? scratch[lane] : ~0ull;
  hi = lane < kWarps ? scratch[kWarps + lane] : 0ull;
#pragma unroll
  for (int d = 8; d > 0; d >>= 1) {  // lanes 0..15 reduce among themselves
    const unsigned long long l = __shfl_xor_sync(0xffffffffu, lo, d);
    const unsigned long long h = __shfl_xor_sync(0xffffffffu, hi, d);
    lo = l < lo ? l : lo;
    hi = h > hi ? h : hi;
  }
  lo = __shfl_sync(0xffffffffu, lo, 0);
  hi = __shfl_sync(0xffffffffu, hi, 0);
}

// The sort proper, over a range [lo, hi] that holds every value (lo <= v <= hi), with
// the buckets cleared and the clears ordered by a barrier. See sort_descending_by_buckets.
template <int kThreads, int kSlots>
__device__ __forceinline__ bool sort_descending_in_buckets(
    const unsigned long long (&v)[kSlots], int n, unsigned long long lo, unsigned long long hi,
    uint32_t* buckets, unsigned long long* staging, int* warp_totals, unsigned long long* out) {
  constexpr int kWarps = kThreads / 32;
  constexpr int kPer = kSortBuckets / kThreads;  // consecutive buckets a thread scans
  static_assert(kSortBuckets % kThreads == 0 && kPer % 2 == 0, "whole pairs of buckets");
  const int tid = static_cast<int>(threadIdx.x);
  // The range's top kSortBucketLog2 bits pick the bucket: (hi - lo) >> shift < kSortBuckets.
  const unsigned long long width = hi - lo;
  const int bits = 64 - __clzll(static_cast<long long>(width));
  const int shift = bits > kSortBucketLog2 ? bits - kSortBucketLog2 : 0;
  // Bucket 0 holds the largest values, so that ascending buckets are the output order.
  // place[s]: the value's bucket | its slot in the bucket << kSortBucketLog2 (-1: none).
  int place[kSlots];
  bool crowded = false;
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    place[s] = -1;
    if (s * kThreads + tid < n) {
      // Clamped: a value outside [lo, hi] (only from an inconsistent workspace) lands in an
      // end bucket, a wrong order but no write outside the buckets.
      const unsigned long long off = (v[s] - lo) >> shift;
      const int b =
          kSortBuckets - 1 - static_cast<int>(off < kSortBuckets ? off : kSortBuckets - 1);
      const int slot = static_cast<int>(atomicAdd(&buckets[b], 1u));
      crowded |= slot >= kSortBucketMax;
      place[s] = b | slot << kSortBucketLog2;
    }
  }
  if (__syncthreads_or(crowded)) return false;
  // Each bucket's first output position, packed with its count: (start << 16) | count
  // (both at most n, which the callers keep below 2^16).
  uint32_t c[kPer];
  int mine = 0;
#pragma unroll
  for (int j = 0; j < kPer; j += 2) {
    const uint2 pair = reinterpret_cast<const uint2*>(buckets)[(kPer * tid + j) / 2];
    c[j] = pair.x;
    c[j + 1] = pair.y;
    mine += static_cast<int>(pair.x + pair.y);
  }
  int total;
  int start = block_exclusive_scan_by_shuffles<kWarps>(mine, warp_totals, total);
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    buckets[kPer * tid + j] = (static_cast<uint32_t>(start) << 16) | c[j];
    start += static_cast<int>(c[j]);
  }
  __syncthreads();
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    if (place[s] < 0) continue;
    const uint32_t packed = buckets[place[s] & (kSortBuckets - 1)];
    staging[(packed >> 16) + (place[s] >> kSortBucketLog2)] = v[s];
  }
  __syncthreads();
  // A value's rank: its bucket's start plus the members of its bucket that are larger.
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    if (place[s] < 0) continue;
    const uint32_t packed = buckets[place[s] & (kSortBuckets - 1)];
    const int first = static_cast<int>(packed >> 16), count = static_cast<int>(packed & 0xFFFFu);
    int rank = first;
    for (int j = 0; j < count; ++j) rank += staging[first + j] > v[s] ? 1 : 0;
    out[rank] = v[s];
  }
  __syncthreads();
  return true;
}

// Clears the kSortBuckets buckets (kThreads threads); the caller orders them with a barrier.
template <int kThreads>
__device__ __forceinline__ void clear_sort_buckets(uint32_t* buckets) {
  constexpr int kPer = kSortBuckets / kThreads;
  static_assert(kSortBuckets % kThreads == 0 && kPer % 2 == 0, "whole pairs of buckets");
#pragma unroll
  for (int j = 0; j < kPer; ++j) buckets[kPer * static_cast<int>(threadIdx.x) + j] = 0u;
}

// Sorts the n values (unique, nonzero) held kSlots per thread (element s * kThreads + tid;
// zero past n) descending into out[0..n), over their own range (a block-wide min and max).
// Shared memory: buckets (kSortBuckets words), staging (n values: it may be the array the
// values were loaded from, which is then overwritten), scratch (2 * kThreads / 32 values),
// warp_totals (kThreads / 32 ints). Returns false, leaving out and staging untouched,
// where a bucket holds more than kSortBucketMax values; the result is block-uniform.
// Contains barriers (the last one after out is written); every thread must call it.
template <int kThreads, int kSlots>
__device__ __forceinline__ bool sort_descending_by_buckets(
    const unsigned long long (&v)[kSlots], int n, uint32_t* buckets, unsigned long long* staging,
    unsigned long long* scratch, int* warp_totals, unsigned long long* out) {
  const int tid = static_cast<int>(threadIdx.x);
  if (n <= 0) return true;                  // block-uniform
  if (n > kThreads * kSlots) return false;  // (not held: the callers never pass more)
  clear_sort_buckets<kThreads>(buckets);
  unsigned long long lo = ~0ull, hi = 0ull;
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    if (s * kThreads + tid < n) {
      lo = v[s] < lo ? v[s] : lo;
      hi = v[s] > hi ? v[s] : hi;
    }
  }
  block_min_max<kThreads / 32>(lo, hi, scratch);  // its barrier also orders the clears above
  return sort_descending_in_buckets<kThreads, kSlots>(v, n, lo, hi, buckets, staging, warp_totals,
                                                      out);
}

// The same where the caller knows bounds of the values (lo <= every value <= hi): no
// block-wide min and max (in the one-CTA top-k they were a twelfth of a prefill row's
// instructions, docs/perf.md run 47). Bounds wider than the values' own range make the
// buckets coarser, and a crowded one declines: the one-CTA top-k passes the threshold its
// radix select resolved (below the smallest winner by less than the last digit's weight)
// and the largest winner's score key with all low bits set (less than 2^32 above it).
template <int kThreads, int kSlots>
__device__ __forceinline__ bool sort_descending_by_buckets_in(
    const unsigned long long (&v)[kSlots], int n, unsigned long long lo, unsigned long long hi,
    uint32_t* buckets, unsigned long long* staging, int* warp_totals, unsigned long long* out) {
  if (n <= 0) return true;                  // block-uniform
  if (n > kThreads * kSlots) return false;  // (not held: the callers never pass more)
  clear_sort_buckets<kThreads>(buckets);
  __syncthreads();
  return sort_descending_in_buckets<kThreads, kSlots>(v, n, lo, hi, buckets, staging, warp_totals,
                                                      out);
}

}  // namespace cuda
}  // namespace qsakv
