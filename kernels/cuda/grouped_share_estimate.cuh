// SPDX-License-Identifier: Apache-2.0
// The grouped route's first decision, made for every group before the union kernel and
// far cheaper than it: does the group's list pay (grouped_list_pays)?
//
// The union kernel counts exactly, but with one CTA of 1,024 threads per SM and about ten
// barriers it costs ~60-70 us for 8192 prefill rows at 32K on an H200 even where the rows
// share nothing, and past one window (contexts over 64K positions) it learns the counts
// window by window, after writing the earlier windows' own lists: groups that share little
// paid 4.7-16% over the decode route (docs/perf.md runs 26-29). This kernel estimates the
// rule's count over the whole context at once: every valid entry of the group's rows adds
// one to a 16-bit counter of a hash table in shared memory (the position's hash), and the
// estimate is the number of counters that reach grouped_share_min_rows. A shared token
// lands its count in its counter; tokens that collide add up, which overestimates by a
// few counters (the union, up to 16 x 2051 positions, over 16K counters: ~20 at most in
// random lists, against a rule of at least 64), and two shared tokens in one counter
// count once. A row listing a token twice counts it twice (the selection's lists never
// do). A group the estimate says does not pay is marked kGroupDecodeOnly in union_count:
// the union kernel only marks its rows kOwnIsTopk and their decode-route pass reads their
// top-k rows. Every other group is kUnionDecides, and the union kernel's exact rule
// decides as before.
// Work: each list read once, 32 loads in flight per thread and ~20 instructions an entry; 256
// threads and 32 KB of shared memory a CTA, so every group of a 8192-row chunk is resident at once.
#pragma once

#include <stdint.h>

#include "limits.hpp"
#include "cuda/grouped_union.cuh"

namespace qsakv {
namespace cuda {

constexpr int kEstimateThreads = 256;
constexpr int kEstimateSlotBits = 14;  // 16K counters, two a 32-bit word: 32 KB
constexpr int kEstimateSlots = 1 << kEstimateSlotBits;
constexpr int kEstimateLoads = 32;  // list loads in flight per thread
// A counter's 16 bits hold a group's entries when rows x width < 2^16; wider lists are
// left to the union kernel (kUnionDecides).
__host__ __device__ constexpr bool estimate_fits(int topk_width) {
  return static_cast<long long>(kGroupedMaxRows) * topk_width < 65536;
}

__global__ void __launch_bounds__(kEstimateThreads)
    grouped_share_estimate_kernel(const UnionParams p) {
  const int group = blockIdx.x;
  if (group >= p.meta.header->num_groups) return;
  const int tid = threadIdx.x;
  const int row0 = p.meta.group_row0[group];
  const int rows = p.meta.group_rows[group];
  const int pos0 = p.meta.row_pos[row0];  // the group's rows sit at pos0 .. pos0 + rows - 1
  if (rows < 2 || !estimate_fits(p.topk_width)) {  // one row shares with none
    if (tid == 0) p.union_count[group] = rows < 2 ? kGroupDecodeOnly : kUnionDecides;
    return;
  }
  __shared__ uint32_t counters[kEstimateSlots / 2];  // slot s: bits 16 (s & 1) .. of word s / 2
  __shared__ int listed_sum, entries_sum;
  for (int s = tid; s < kEstimateSlots / 2; s += kEstimateThreads) counters[s] = 0u;
  if (tid == 0) listed_sum = entries_sum = 0;
  __syncthreads();
  const int W = p.topk_width;
  int entries = 0;
  // The group's entries as one flat range (row r, column j at r x W + j), this thread's
  // every kEstimateThreads-th, with its row and column carried along (no division per
  // entry): kEstimateLoads independent loads, then their counts.
  int r = tid / W, j = tid - r * W;
  while (r < rows) {
    int t[kEstimateLoads];
#pragma unroll
    for (int u = 0; u < kEstimateLoads; ++u) {
      int x = -1;
      if (r < rows) {
        x = __ldg(p.topk + static_cast<int64_t>(row0 + r) * p.topk_stride + j);
        if (x > pos0 + r) x = -1;  // only the row's valid entries
      }
      t[u] = x;
      for (j += kEstimateThreads; j >= W; j -= W) ++r;
    }
#pragma unroll
    for (int u = 0; u < kEstimateLoads; ++u)
      if (t[u] >= 0) {
        ++entries;
        // Fibonacci hashing: consecutive positions (a selected block's tokens) spread out.
        const uint32_t s = (static_cast<uint32_t>(t[u]) * 0x9E3779B1u) >> (32 - kEstimateSlotBits);
        atomicAdd(&counters[s >> 1], 1u << ((s & 1u) << 4));
      }
  }
  __syncthreads();
  const uint32_t need = static_cast<uint32_t>(grouped_share_min_rows(rows, p.share_rows));
  int listed = 0;
  for (int s = tid; s < kEstimateSlots / 2; s += kEstimateThreads) {
    const uint32_t w = counters[s];
    listed += ((w & 0xFFFFu) >= need) + ((w >> 16) >= need);
  }
  for (int d = 16; d > 0; d >>= 1) {
    listed += __shfl_xor_sync(0xffffffffu, listed, d);
    entries += __shfl_xor_sync(0xffffffffu, entries, d);
  }
  if ((tid & 31) == 0) {
    atomicAdd(&listed_sum, listed);
    atomicAdd(&entries_sum, entries);
  }
  __syncthreads();
  if (tid == 0)
    p.union_count[group] =
        grouped_list_pays(listed_sum, entries_sum, rows) ? kUnionDecides : kGroupDecodeOnly;
}

}  // namespace cuda
}  // namespace qsakv
