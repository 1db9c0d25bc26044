// SPDX-License-Identifier: Apache-2.0
// The grouped route's decision for groups whose positions span several union windows
// (contexts past 64K tokens), made before the union kernel and far cheaper than it.
//
// The union kernel decides whether a group lists anything from the exact counts of its
// window (grouped_list_pays); past one window it learns them only window by window, after
// it has written the earlier windows' own lists, so a group that shares almost nothing
// (independent selections) paid the whole kernel, twice the reads, and its rows then
// read their own lists instead of their top-k rows: 13-16% over the decode route at 128K
// (docs/perf.md run 27). This kernel estimates the rule over the whole context at once
// from two of the group's rows: the tokens the last and the middle row select go into a
// hash table in shared memory, every other row's entries mark the rows that select them,
// and the estimate is the number of those tokens that grouped_share_min_rows of the rows
// select, against grouped_list_pays with all rows' entries. (A token the rule lists is
// selected by at least half the rows, so the two sample rows miss few of them.) A group
// that does not pay is marked kGroupDecodeOnly in union_count, and the union kernel only
// says so to its rows (kOwnIsTopk); every other group is kUnionDecides and runs as before.
// Work: every row's list read once (coalesced), two rows' inserted and the others' probed
// in a table of <= 2/3 load; 256 threads and a table of 6 B a slot, so several groups
// share an SM.
#pragma once

#include <stdint.h>

#include "limits.hpp"
#include "params.hpp"

namespace qsakv {
namespace cuda {

// union_count's value between the estimate and the union kernel, which then overwrites it
// with the group's listed tokens.
constexpr int kUnionDecides = 0;      // the union kernel applies the rule window by window
constexpr int kGroupDecodeOnly = -1;  // lists nothing: every row reads its top-k row

constexpr int kEstimateThreads = 256;
// The largest table (96 KB of shared memory: top-k widths up to 5461); wider lists are
// left to the union kernel (kUnionDecides).
constexpr int kEstimateMaxSlotBits = 14;

// Slots for two rows of topk_width entries at load <= 2/3 (a power of two of at least
// 3 x topk_width); 0: too wide.
__host__ __device__ constexpr int estimate_slot_bits(int topk_width) {
  int bits = 6;
  while ((1 << bits) < 3 * topk_width && bits <= kEstimateMaxSlotBits) ++bits;
  return bits > kEstimateMaxSlotBits ? 0 : bits;
}
// A slot's key (int32, -1 empty) and its 16-bit row mask (two a word).
__host__ __device__ constexpr int estimate_smem_bytes(int slot_bits) {
  return slot_bits == 0 ? 0 : (1 << slot_bits) * 6;
}

struct ShareEstimateParams {
  PlanMetaView meta;
  const int32_t* topk;
  int64_t topk_stride;
  int32_t topk_width;
  int32_t share_rows;  // grouped_share_min_rows' cost term for this cache type
  int32_t window;      // the union kernel's positions per pass
  int32_t slot_bits;   // estimate_slot_bits(topk_width); 0: every group kUnionDecides
  int32_t* union_count;
};

__global__ void __launch_bounds__(kEstimateThreads) grouped_share_estimate_kernel(
    const ShareEstimateParams p) {
  const int group = blockIdx.x;
  if (group >= p.meta.header->num_groups) return;
  const int tid = threadIdx.x;
  const int row0 = p.meta.group_row0[group];
  const int rows = p.meta.group_rows[group];
  const int pos0 = p.meta.row_pos[row0];  // the group's rows sit at pos0 .. pos0 + rows - 1
  if (pos0 + rows - 1 < p.window || p.slot_bits == 0 || rows < 2) {
    // One window: the union kernel's own counts are exact. One row: nothing to share.
    if (tid == 0) p.union_count[group] = rows < 2 ? kGroupDecodeOnly : kUnionDecides;
    return;
  }
  extern __shared__ int32_t estimate_smem[];
  const int slots = 1 << p.slot_bits, wrap = slots - 1;
  int32_t* keys = estimate_smem;
  uint32_t* masks = reinterpret_cast<uint32_t*>(estimate_smem + slots);  // two slots a word
  __shared__ int listed_sum, entries_sum;
  for (int s = tid; s < slots; s += kEstimateThreads) keys[s] = -1;
  for (int s = tid; s < slots / 2; s += kEstimateThreads) masks[s] = 0u;
  if (tid == 0) listed_sum = entries_sum = 0;
  __syncthreads();
  const int W = p.topk_width;
  // Fibonacci hashing: consecutive positions (a selected block's tokens) spread out.
  auto hash = [&](int t) { return (static_cast<uint32_t>(t) * 0x9E3779B1u) >> (32 - p.slot_bits); };
  auto mark = [&](uint32_t h, int r) { atomicOr(&masks[h >> 1], (1u << r) << ((h & 1u) << 4)); };
  auto row_entry = [&](int r, int j) {
    const int t = __ldg(p.topk + static_cast<int64_t>(row0 + r) * p.topk_stride + j);
    return t >= 0 && t <= pos0 + r ? t : -1;  // the row's valid entries only
  };
  const int sample_a = rows - 1, sample_b = (rows - 1) / 2;
  int entries = 0;
  for (int i = tid; i < 2 * W; i += kEstimateThreads) {
    const int r = i < W ? sample_a : sample_b;
    const int t = row_entry(r, i < W ? i : i - W);
    if (t < 0) continue;
    ++entries;
    for (uint32_t h = hash(t);; h = (h + 1u) & wrap) {  // never full: <= 2W keys, >= 3W slots
      const int k = atomicCAS(&keys[h], -1, t);
      if (k == -1 || k == t) {
        mark(h, r);
        break;
      }
    }
  }
  __syncthreads();
  for (int r = 0; r < rows; ++r) {
    if (r == sample_a || r == sample_b) continue;
    for (int j = tid; j < W; j += kEstimateThreads) {
      const int t = row_entry(r, j);
      if (t < 0) continue;
      ++entries;
      for (uint32_t h = hash(t);; h = (h + 1u) & wrap) {
        const int k = keys[h];
        if (k == t) mark(h, r);
        if (k == t || k == -1) break;
      }
    }
  }
  __syncthreads();
  const int need = grouped_share_min_rows(rows, p.share_rows);
  int listed = 0;
  for (int s = tid; s < slots; s += kEstimateThreads)
    listed += keys[s] >= 0 && __popc((masks[s >> 1] >> ((s & 1) << 4)) & 0xFFFFu) >= need;
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
