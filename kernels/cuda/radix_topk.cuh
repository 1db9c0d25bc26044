// SPDX-License-Identifier: Apache-2.0
// Exact top-k of one row's score keys by radix select, block-wide (one CTA per row).
//
// Every candidate is a 64-bit composite: (score key << 32) | (0xFFFFFFFF - block), so
// larger composite = higher score, then lower block index. Composites are unique, so the
// k-th largest composite is a single value and "take everything at or above it" takes
// exactly k blocks in the reference order (score descending, block ascending on ties)
// with no separate tie-break step. Digits are resolved from the top until the chosen
// digit holds exactly the number of composites still needed.
#pragma once

#include <stdint.h>

#include "cuda/block_scan.cuh"

namespace qsakv {
namespace cuda {

constexpr int kTopkThreads = 512;

__device__ __forceinline__ uint64_t composite(uint32_t key, uint32_t block) {
  return (static_cast<uint64_t>(key) << 32) | (0xFFFFFFFFu - block);
}
__device__ __forceinline__ uint32_t composite_block(uint64_t c) {
  return 0xFFFFFFFFu - static_cast<uint32_t>(c & 0xFFFFFFFFull);
}

// Appends v to arr (a shared-memory list of `capacity` entries with a shared counter)
// where `take`, one atomic per warp instead of one per lane (the counter is contended by
// the whole CTA). Never writes past capacity (callers size the lists so that correct
// counts fit). Every lane of the warp must call it.
template <int capacity>
__device__ __forceinline__ void warp_append(unsigned long long* arr, int* counter, bool take,
                                            unsigned long long v) {
  const unsigned mask = __ballot_sync(0xffffffffu, take);
  if (mask == 0u) return;
  const int lane = threadIdx.x & 31, leader = __ffs(mask) - 1;
  int base = 0;
  if (lane == leader) base = atomicAdd(counter, __popc(mask));
  base = __shfl_sync(0xffffffffu, base, leader);
  const int slot = base + __popc(mask & ((1u << lane) - 1u));
  if (take && slot < capacity) arr[slot] = v;
}

// Inclusive block-wide scan of one int per thread (kTopkThreads threads); *total gets the
// sum over the block. warp_sums: shared, kTopkThreads / 32 ints. Contains barriers.
// SM80 and up: block_scan.cuh's shuffle form (the one-CTA top-k runs it two or three times
// a row, and the filter kernel once per CTA: ~35 instructions a thread fewer each time).
// Below: the warps' sums summed by every thread, the form that fits the filter kernel's
// 64-register cap for sm_70 (the shuffle form, or the exclusive scan plus the thread's
// own value, spills there; ptxas 12.9, tools/sm70-check.sh).
__device__ __forceinline__ int block_inclusive_scan(int v, int* warp_sums, int* total) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int x = warp_inclusive_scan(v);
  __syncthreads();
  if (lane == 31) warp_sums[warp] = x;
  __syncthreads();
  int before = 0, all = 0;
#pragma unroll
  for (int w = 0; w < kTopkThreads / 32; ++w) {
    const int s = warp_sums[w];
    before += w < warp ? s : 0;
    all += s;
  }
  *total = all;
  return x + before;
#else
  int all;
  const int before = block_exclusive_scan_by_shuffles<kTopkThreads / 32>(v, warp_sums, all);
  *total = all;
  return before + v;
#endif
}

// The bins of a kBins-bin histogram that one thread of find_digit owns: thread t owns
// bins [kBins - kPer*(t+1), kBins - kPer*t), thread 0 the highest.
template <int kBins>
__host__ __device__ constexpr int bins_per_thread() {
  return kBins >= kTopkThreads ? kBins / kTopkThreads : 1;
}

// Loads this thread's bins of hist (shared or global) into c, for find_digit_in; apart
// from it, so that a caller can issue the loads together with its others.
template <int kBins>
__device__ __forceinline__ void load_bins(const uint32_t* hist,
                                          uint32_t (&c)[bins_per_thread<kBins>()]) {
  constexpr int kPer = bins_per_thread<kBins>();
  const int hi = kBins - kPer * static_cast<int>(threadIdx.x);
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int b = hi - 1 - j;
    c[j] = b >= 0 ? hist[b] : 0u;
  }
}

// Given each thread's bins (load_bins) of the histogram of the candidates still in play,
// finds how many to take, K = min(their total, need_cap), and the digit d such that the
// bins above d hold fewer than K items and bins >= d hold at least K; writes d and how
// many items of bin d are still needed (>= 1) to *digit and *need_in_digit (shared;
// untouched when K is 0). Returns K. kBins is a multiple of kTopkThreads or at most
// kTopkThreads. Contains barriers; every thread must call it.
template <int kBins>
__device__ __forceinline__ int find_digit_in(const uint32_t (&c)[bins_per_thread<kBins>()],
                                             int need_cap, int* warp_sums, int* digit,
                                             int* need_in_digit) {
  constexpr int kPer = bins_per_thread<kBins>();
  const int hi = kBins - kPer * static_cast<int>(threadIdx.x);
  int mine = 0;
#pragma unroll
  for (int j = 0; j < kPer; ++j) mine += static_cast<int>(c[j]);
  int total;
  const int incl = block_inclusive_scan(mine, warp_sums, &total);
  const int need = min(total, need_cap);
  const int above = incl - mine;  // items in the bins above this thread's
  if (need > 0 && above < need && incl >= need) {
    int acc = above;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      if (acc < need && acc + static_cast<int>(c[j]) >= need) {
        *digit = hi - 1 - j;
        *need_in_digit = need - acc;
      }
      acc += static_cast<int>(c[j]);
    }
  }
  __syncthreads();
  return need;
}

// find_digit_in over hist[kBins] (shared or global).
template <int kBins>
__device__ __forceinline__ int find_digit(const uint32_t* hist, int need_cap, int* warp_sums,
                                          int* digit, int* need_in_digit) {
  uint32_t c[bins_per_thread<kBins>()];
  load_bins<kBins>(hist, c);
  return find_digit_in<kBins>(c, need_cap, warp_sums, digit, need_in_digit);
}

// find_digit's answer computed by one warp while the CTA's other warps wait at the caller's
// barrier: for the one-CTA top-k, whose thousands of rows keep every SM's issue slots
// busy, a block-wide scan costs sixteen warps' instructions (and three barriers) for what
// one warp does in ~150. Lane l owns the same bins as find_digit's thread l would with 32
// threads (lane 0 the highest 64); the lane holding the need-th item is found by a
// warp scan, then its bins are split over the warp (kBins / 1024 a lane) and scanned
// again. Writes K = min(total, need_cap) to *k and, when K > 0, the digit and the items
// still needed from it (>= 1) to *digit and *need_in_digit; the caller's barrier
// publishes them. Every lane of the calling warp must call it. hist: shared memory,
// 16-byte aligned, complete (a barrier after its last update).
template <int kBins>
__device__ __forceinline__ void find_digit_in_warp(const uint32_t* hist, int need_cap, int* k,
                                                   int* digit, int* need_in_digit) {
  constexpr int kPerLane = kBins / 32, kVecs = kPerLane / 4, kSub = kPerLane / 32;
  static_assert(kBins % 1024 == 0 && (kVecs & (kVecs - 1)) == 0, "whole skewed 16-byte words");
  const unsigned full = 0xffffffffu;
  const int lane = threadIdx.x & 31;
  const uint4* own = reinterpret_cast<const uint4*>(hist + kBins - kPerLane * (lane + 1));
  uint32_t sum = 0u;
  // Each lane starts at its own word: lanes 256 bytes apart would read one bank group
  // (an 8-way conflict per 128-bit phase); skewed, 8 lanes of a phase hit 8 groups.
#pragma unroll
  for (int i = 0; i < kVecs; ++i) {
    const uint4 q = own[(i + lane) & (kVecs - 1)];
    sum += q.x + q.y + q.z + q.w;
  }
  const int mine = static_cast<int>(sum);
  const int incl = warp_inclusive_scan(mine);
  const int need = min(__shfl_sync(full, incl, 31), need_cap);
  if (lane == 0) *k = need;
  if (need <= 0) return;  // warp-uniform
  const int owner = __ffs(__ballot_sync(full, incl >= need)) - 1;
  const int above_owner = __shfl_sync(full, incl - mine, owner);
  // The owner's bins, kSub a lane from its top down: c[0] the highest.
  const int sub_top = kBins - kPerLane * owner - kSub * lane;
  uint32_t c[kSub];
  int sub = 0;
#pragma unroll
  for (int j = 0; j < kSub; ++j) {
    c[j] = hist[sub_top - 1 - j];
    sub += static_cast<int>(c[j]);
  }
  const int incl2 = warp_inclusive_scan(sub) + above_owner;
  if (lane == __ffs(__ballot_sync(full, incl2 >= need)) - 1) {
    int acc = incl2 - sub;  // < need: the lanes before hold fewer
#pragma unroll
    for (int j = 0; j < kSub; ++j) {
      if (acc < need && acc + static_cast<int>(c[j]) >= need) {
        *digit = sub_top - 1 - j;
        *need_in_digit = need - acc;
      }
      acc += static_cast<int>(c[j]);
    }
  }
}

// Appends to `list` (capacity `cap`, counter `*count`; shared or global) the composites of
// this thread's keys whose bit is set in `take` (bit 4u + j: key j of 16-byte word
// words[u], whose first block is 4 * word_index[u]): one atomic per warp. Entries past the
// capacity are counted but not written. Every lane of the warp must call it.
template <int kWords>
__device__ __forceinline__ void warp_append_words(unsigned long long* list, int* count, int cap,
                                                  uint32_t take, const uint4 (&words)[kWords],
                                                  const uint32_t (&word_index)[kWords]) {
  const int lane = threadIdx.x & 31;
  const int mine = __popc(take);
  const int incl = warp_inclusive_scan(mine);
  const int total = __shfl_sync(0xffffffffu, incl, 31);
  if (total == 0) return;  // warp-uniform
  int base = 0;
  if (lane == 31) base = atomicAdd(count, total);
  int slot = __shfl_sync(0xffffffffu, base, 31) + incl - mine;
#pragma unroll
  for (int u = 0; u < kWords; ++u) {
    const uint32_t w[4] = {words[u].x, words[u].y, words[u].z, words[u].w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if ((take >> (4 * u + j)) & 1u) {
        if (slot < cap) list[slot] = composite(w[j], static_cast<uint32_t>(4 * word_index[u] + j));
        ++slot;
      }
    }
  }
}

}  // namespace cuda
}  // namespace qsakv
