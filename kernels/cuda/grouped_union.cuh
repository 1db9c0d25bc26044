// SPDX-License-Identifier: Apache-2.0
// The grouped route's first kernel (sparse): one CTA per row group (up to 16 consecutive
// rows of one request) splits its rows' top-k lists by how many of the rows select each
// token, on the device at every launch (so one captured graph routes each replay by that
// replay's lists):
//   - tokens that at least grouped_share_min_rows(n, ...) of the group's n rows select
//     form its list: ascending, each with the mask of the rows that select it and its K
//     row offset (block table resolved once), read once for all rows by the grouped
//     attention kernel on tensor cores;
//   - a row left with at most kGroupedOwnMax entries of its own moves them into the list
//     as well (with its bit only), so it needs no pass of its own;
//   - every other valid entry is the row's own: it is written, in list order, to the
//     row's own list, which the decode route computes, folding in the row's shared part
//     (decode_attention.cuh).
// So the work on each route follows what the rows actually share, and no list outgrows a
// workspace: each token the rule shares stands for at least n / 2 of the n x width
// entries, so the rule never shares more than 2 x width, and moved rows add at most
// kGroupedOwnMax each (grouped_union_cap). A window in which the rule shares fewer than
// kGroupedMinShared tokens lists none (limits.hpp says why for each number).
//
// Per window of positions (one window up to 32K tokens):
//   1. each thread holds up to kUnionEntries of the group's list entries in registers,
//      loaded once (valid: t >= 0 and t <= its row's position; -1 otherwise);
//   2. each entry ORs its row's bit into its position's 16-bit mask (shared memory);
//   3. the positions the rule shares are counted, and each row's other entries by warp
//      ballots (a warp's 32 consecutive entries span at most two rows of a long list);
//   4. the listed positions are numbered (block scan, each thread owning consecutive
//      positions) and written to the list, their K offsets resolved with four loads in
//      flight per thread;
//   5. each entry's own bit by warp ballot (the warp's 32 consecutive entries are one
//      word); a block scan of the words' popcounts gives each own entry its place in its
//      row's own list.
// A token on an unmapped page keeps its place in the list with offset -1 and an empty
// mask (the attention kernel reads zeros for it, and no row sees it).
#pragma once

#include <stdint.h>

#include "limits.hpp"
#include "params.hpp"
#include "cuda/block_scan.cuh"

namespace qsakv {
namespace cuda {

constexpr int kUnionThreads = kGroupedUnionThreads;
constexpr int kUnionWarps = kUnionThreads / 32;
// List entries per thread per pass, in registers: 16 rows x 2051 entries (the reference
// geometry) fit one pass of 1024 threads. Larger groups' lists take several passes, each
// reading its entries again.
constexpr int kUnionEntries = 36;

struct UnionParams {
  PlanMetaView meta;
  const int32_t* topk;
  int64_t topk_stride;
  int32_t topk_width;
  uint32_t width_inv;  // ceil(2^32 / topk_width): entry e's row is umulhi(e, width_inv)
  int32_t block_size;
  int64_t num_blocks;
  int64_t stride_block;  // bytes
  int64_t stride_token;  // bytes
  int32_t share_rows;    // grouped_share_min_rows' cost term for this cache type
  int32_t window;        // positions per pass (grouped_union_window)
  int32_t entry_words;   // ceil(rows_per_group x topk_width / 32)
  int32_t union_cap;
  int32_t* union_count;
  int64_t* union_off;
  uint32_t* union_mask;
  int32_t* own_lists;  // [max_rows, topk_width]
  int2* row_split;
};

// Dynamic shared memory, in 32-bit words: the window's masks (two positions a word), the
// window's listed tokens and their masks, the own-entry words and their prefixes.
struct UnionLayout {
  int tokens, token_masks, own, own_prefix, words;
};
__host__ __device__ inline UnionLayout union_layout(int window, int union_cap, int entry_words) {
  UnionLayout L;
  L.tokens = window / 2;
  L.token_masks = L.tokens + union_cap;
  L.own = L.token_masks + (union_cap + 1) / 2;
  L.own_prefix = L.own + entry_words;
  L.words = L.own_prefix + entry_words;
  return L;
}

// Adds the set bits of a 32-entry word (entries e0 .. e0 + 31 of the group, rows of width
// W) to counts[row]: a word can span rows.
__device__ __forceinline__ void add_bits_by_row(uint32_t x, int e0, int W, uint32_t width_inv,
                                                int32_t* counts) {
  int lo = e0;
  while (x) {
    const int r = static_cast<int>(__umulhi(static_cast<unsigned>(lo), width_inv));
    const int n = min(32, (r + 1) * W - e0);  // row r's entries end at bit n
    const uint32_t sel = n >= 32 ? x : x & ((1u << n) - 1u);
    if (sel) atomicAdd(&counts[r], __popc(sel));
    x &= ~sel;
    lo = e0 + n;
  }
}

__global__ void __launch_bounds__(kUnionThreads) grouped_union_kernel(const UnionParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 750
  // Not part of the SM70 tier (its plans make no groups), so never launched in sm_70 code,
  // where this body spills at 64 registers (CUDA 12.9): a V100 build carries a stub.
  (void)p;
  __trap();
#else
  const int group = blockIdx.x;
  if (group >= p.meta.header->num_groups) return;
  extern __shared__ uint4 union_smem_raw[];
  uint32_t* union_smem = reinterpret_cast<uint32_t*>(union_smem_raw);
  const UnionLayout L = union_layout(p.window, p.union_cap, p.entry_words);
  uint32_t* pmask = union_smem;  // position x's mask: bits 16 (x & 1) .. of word x / 2
  int32_t* tokens = reinterpret_cast<int32_t*>(union_smem + L.tokens);
  uint16_t* token_masks = reinterpret_cast<uint16_t*>(union_smem + L.token_masks);
  uint32_t* own = union_smem + L.own;                                           // this window's
  int32_t* own_prefix = reinterpret_cast<int32_t*>(union_smem + L.own_prefix);  // exclusive
  __shared__ int32_t warp_totals[kUnionWarps];
  __shared__ int32_t row_own[kGroupedMaxRows];   // this window's own entries by the rule
  __shared__ int32_t row_done[kGroupedMaxRows];  // own entries written, earlier windows

  const int row0 = p.meta.group_row0[group];
  const int rows = p.meta.group_rows[group];
  const int pos0 = p.meta.row_pos[row0];  // the group's rows sit at pos0 .. pos0 + rows - 1
  const int req = p.meta.row_request[row0];
  const int32_t* bt =
      p.meta.header->block_table + static_cast<int64_t>(req) * p.meta.header->block_table_stride;
  const int W = p.topk_width;
  const int entries = rows * W;
  const int used_words = (entries + 31) / 32;
  constexpr int kPass = kUnionEntries * kUnionThreads;
  const int passes = (entries + kPass - 1) / kPass;
  const int T = grouped_share_min_rows(rows, p.share_rows);
  const int last = pos0 + rows - 1;
  const int per = p.window / kUnionThreads;  // positions this thread owns, consecutive
  const int64_t base = static_cast<int64_t>(group) * p.union_cap;
  const int tid = threadIdx.x, lane = tid & 31;
  if (tid < kGroupedMaxRows) row_done[tid] = 0;

  // Entry e = (pass x kUnionEntries + k) x kUnionThreads + tid is row e / W, column e % W.
  int tok[kUnionEntries];
  auto entry = [&](int pass, int k) { return (pass * kUnionEntries + k) * kUnionThreads + tid; };
  auto row_of = [&](int e) {
    return static_cast<int>(__umulhi(static_cast<unsigned>(e), p.width_inv));
  };
  auto load = [&](int pass) {
#pragma unroll
    for (int k = 0; k < kUnionEntries; ++k) {
      const int e = entry(pass, k);
      int t = -1;
      if (e < entries) {
        const int r = row_of(e);
        const int x = __ldg(p.topk + static_cast<int64_t>(row0 + r) * p.topk_stride + (e - r * W));
        t = x >= 0 && x <= pos0 + r ? x : -1;
      }
      tok[k] = t;
    }
  };
  auto mask_at = [&](int x) { return (pmask[x >> 1] >> ((x & 1) << 4)) & 0xFFFFu; };
  // This thread's positions' masks, 8 at a time (16-byte reads): f(position offset, mask).
  auto for_my_masks = [&](auto&& f) {
    const uint4* m = reinterpret_cast<const uint4*>(pmask) + tid * (per / 8);
    for (int i = 0; i < per / 8; ++i) {
      const uint4 v = m[i];
      const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        f(8 * i + 2 * j, w[j] & 0xFFFFu);
        f(8 * i + 2 * j + 1, w[j] >> 16);
      }
    }
  };
  if (passes == 1) load(0);

  int count = 0;  // listed tokens of the earlier windows
  for (int w0 = 0; w0 <= last; w0 += p.window) {
    for (int i = tid; i < p.window / 2; i += kUnionThreads) pmask[i] = 0u;
    if (tid < kGroupedMaxRows) row_own[tid] = 0;
    __syncthreads();
    auto in_window = [&](int t) {
      return t >= 0 && static_cast<unsigned>(t - w0) < static_cast<unsigned>(p.window);
    };
    for (int pass = 0; pass < passes; ++pass) {
      if (passes > 1) load(pass);
#pragma unroll
      for (int k = 0; k < kUnionEntries; ++k)
        if (in_window(tok[k])) {
          const int x = tok[k] - w0;
          atomicOr(&pmask[x >> 1], (1u << row_of(entry(pass, k))) << ((x & 1) << 4));
        }
    }
    __syncthreads();
    // How many positions the row rule shares.
    int mine = 0;
    for_my_masks([&](int, uint32_t m) { mine += __popc(m) >= T; });
    int by_rule;
    block_exclusive_scan<kUnionWarps>(mine, warp_totals, by_rule);
    const bool sharing = by_rule >= kGroupedMinShared;  // uniform
    // Each row's entries the rule does not share, counted: rows left with at most
    // kGroupedOwnMax move them to the list.
    uint32_t moved = 0u;
    if (sharing) {
      for (int pass = 0; pass < passes; ++pass) {
        if (passes > 1) load(pass);
#pragma unroll
        for (int k = 0; k < kUnionEntries; ++k) {
          const bool mine_only = in_window(tok[k]) && __popc(mask_at(tok[k] - w0)) < T;
          const uint32_t ballot = __ballot_sync(0xffffffffu, mine_only);
          if (lane == 0 && ballot)
            add_bits_by_row(ballot, entry(pass, k) - lane, W, p.width_inv, row_own);
        }
      }
      __syncthreads();
      for (int r = 0; r < rows; ++r) moved |= row_own[r] <= kGroupedOwnMax ? 1u << r : 0u;
    }
    // A position's mask in the list: every selecting row's where the rule shares it, else
    // the moved rows' (0: not listed).
    auto listed_mask = [&](uint32_t m) { return __popc(m) >= T ? m : m & moved; };
    mine = 0;
    if (sharing) for_my_masks([&](int, uint32_t m) { mine += listed_mask(m) != 0u; });
    int listed;
    int slot = block_exclusive_scan<kUnionWarps>(mine, warp_totals, listed);
    // Uniform. (The rules keep count + listed <= union_cap; the bound is checked anyway,
    // so a broken rule costs speed, never memory safety.)
    const bool listing = sharing && count + listed <= p.union_cap;
    if (listing)
      for_my_masks([&](int x, uint32_t m) {
        const uint32_t lm = listed_mask(m);
        if (lm) {
          tokens[slot] = w0 + tid * per + x;
          token_masks[slot++] = static_cast<uint16_t>(lm);
        }
      });
    __syncthreads();
    if (listing) {
      constexpr int kUnroll = 4;  // independent block-table loads in flight per thread
      for (int i0 = tid; i0 < listed; i0 += kUnroll * kUnionThreads) {
        int32_t phys[kUnroll];
#pragma unroll
        for (int k = 0; k < kUnroll; ++k) {
          const int i = i0 + k * kUnionThreads;
          phys[k] = i < listed ? __ldg(bt + tokens[i] / p.block_size) : -1;
        }
#pragma unroll
        for (int k = 0; k < kUnroll; ++k) {
          const int i = i0 + k * kUnionThreads;
          if (i >= listed) break;
          const bool mapped = phys[k] >= 0 && phys[k] < p.num_blocks;
          p.union_off[base + count + i] =
              mapped ? phys[k] * p.stride_block +
                           static_cast<int64_t>(tokens[i] % p.block_size) * p.stride_token
                     : -1;
          p.union_mask[base + count + i] = mapped ? token_masks[i] : 0u;
        }
      }
    }
    // The own entries (valid, in the window, not listed for their row), a word per warp
    // and entry slot, then their places in their rows' own lists.
    for (int pass = 0; pass < passes; ++pass) {
      if (passes > 1) load(pass);
#pragma unroll
      for (int k = 0; k < kUnionEntries; ++k) {
        bool mine_entry = false;
        if (in_window(tok[k])) {
          const int r = row_of(entry(pass, k));
          mine_entry = !listing || !(__popc(mask_at(tok[k] - w0)) >= T || (moved >> r & 1u) != 0u);
        }
        const uint32_t ballot = __ballot_sync(0xffffffffu, mine_entry);
        const int word = entry(pass, k) >> 5;  // this warp's: 32 consecutive entries
        if (lane == 0 && word < used_words) own[word] = ballot;
      }
    }
    __syncthreads();
    {
      const int first = tid * ((used_words + kUnionThreads - 1) / kUnionThreads);
      const int last_word =
          min(used_words, first + (used_words + kUnionThreads - 1) / kUnionThreads);
      int n = 0;
      for (int j = first; j < last_word; ++j) n += __popc(own[j]);
      int total;
      int before = block_exclusive_scan<kUnionWarps>(n, warp_totals, total);
      for (int j = first; j < last_word; ++j) {
        own_prefix[j] = before;
        before += __popc(own[j]);
      }
    }
    __syncthreads();
    // An entry's place among the own entries of all rows before it, in entry order.
    auto own_before = [&](int e) {
      const int j = e >> 5;
      return own_prefix[j] + __popc(own[j] & ((1u << (e & 31)) - 1u));
    };
    for (int pass = 0; pass < passes; ++pass) {
      if (passes > 1) load(pass);
#pragma unroll
      for (int k = 0; k < kUnionEntries; ++k) {
        const int e = entry(pass, k);
        if (e < entries && (own[e >> 5] >> (e & 31) & 1u)) {
          const int r = row_of(e);
          const int place = row_done[r] + own_before(e) - own_before(r * W);
          p.own_lists[static_cast<int64_t>(row0 + r) * W + place] = tok[k];
        }
      }
    }
    __syncthreads();
    if (tid < rows) {
      const int end = tid + 1 < rows ? own_before((tid + 1) * W)
                                     : own_prefix[used_words - 1] + __popc(own[used_words - 1]);
      row_done[tid] += end - own_before(tid * W);
    }
    if (listing) count += listed;
    __syncthreads();  // the next window rewrites the masks, tokens and own words
  }
  if (tid < rows) p.row_split[row0 + tid] = make_int2(row_done[tid], count);
  if (tid == 0) p.union_count[group] = count;
#endif
}

}  // namespace cuda
}  // namespace qsakv
