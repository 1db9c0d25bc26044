// SPDX-License-Identifier: Apache-2.0
// The token union of a row group (the grouped route's first kernel): one CTA per group
// merges the top-k lists of its rows (up to 16 consecutive rows of one request) into one
// ascending list of distinct valid tokens, each with a mask of the rows that select it,
// and resolves each token's K row offset through the block table once for all rows.
//
// A bitmap over a window of 128K positions marks the selected tokens; a block-wide scan
// of its word popcounts gives each token its index; a second pass over the lists ORs the
// row bits into the masks (shared memory). Longer requests take several windows. Entries
// that are -1, not causal for their row (t > p) or beyond the window are skipped; a token
// on an unmapped page keeps its place with offset -1 (the attention kernel reads zeros
// for it and masks it for every row). More distinct tokens than the workspace holds:
// count -1, and the attention kernel runs each row's own list instead.
#pragma once

#include <stdint.h>

#include "params.hpp"

namespace qsakv {
namespace cuda {

constexpr int kUnionThreads = 512;
constexpr int kUnionWindowWords = 4096;  // 131072 positions per window
constexpr int kUnionWordsPerThread = kUnionWindowWords / kUnionThreads;

struct UnionParams {
  PlanMetaView meta;
  const int32_t* topk;
  int64_t topk_stride;
  int32_t topk_width;
  int32_t block_size;
  int64_t num_blocks;
  int64_t stride_block;  // bytes
  int64_t stride_token;  // bytes
  int32_t union_cap;
  int32_t* union_count;
  int64_t* union_off;
  uint32_t* union_mask;
};

// Dynamic shared memory: bitmap and word prefixes of one window, then the window's masks
// and tokens.
inline int union_smem_bytes(int union_cap) {
  return static_cast<int>(2 * kUnionWindowWords * sizeof(uint32_t) +
                          2 * static_cast<size_t>(union_cap) * sizeof(uint32_t));
}

// Visits every list entry of the group that is valid for its row and inside the window:
// f(row in group, token). Four rows x four columns per thread are loaded before any is
// used (no division by the width): a pass is a few rounds of loads, not one per entry.
template <class F>
__device__ __forceinline__ void for_each_selected(const UnionParams& p, int row0, int rows,
                                                  int pos0, int w0, F&& f) {
  constexpr int kRows = 4, kCols = 4;
  const int w = p.topk_width;
  for (int r0 = 0; r0 < rows; r0 += kRows)
    for (int base = threadIdx.x; base < w; base += kCols * kUnionThreads) {
      int t[kRows][kCols];
#pragma unroll
      for (int i = 0; i < kRows; ++i)
#pragma unroll
        for (int u = 0; u < kCols; ++u) {
          const int col = base + u * kUnionThreads;
          t[i][u] = r0 + i < rows && col < w
                        ? __ldg(p.topk + static_cast<int64_t>(row0 + r0 + i) * p.topk_stride + col)
                        : -1;
        }
#pragma unroll
      for (int i = 0; i < kRows; ++i)
#pragma unroll
        for (int u = 0; u < kCols; ++u) {
          const int r = r0 + i, x = t[i][u];
          if (x >= w0 && x - w0 < 32 * kUnionWindowWords && x <= pos0 + r) f(r, x);
        }
    }
}

__global__ void __launch_bounds__(kUnionThreads) grouped_union_kernel(const UnionParams p) {
  const int group = blockIdx.x;
  if (group >= p.meta.header->num_groups) return;
  extern __shared__ uint32_t union_smem[];
  uint32_t* bitmap = union_smem;
  uint32_t* prefix = union_smem + kUnionWindowWords;
  uint32_t* masks = union_smem + 2 * kUnionWindowWords;
  int32_t* tokens = reinterpret_cast<int32_t*>(masks + p.union_cap);
  __shared__ uint32_t warp_totals[kUnionThreads / 32];

  const int row0 = p.meta.group_row0[group];
  const int rows = p.meta.group_rows[group];
  const int pos0 = p.meta.row_pos[row0];  // the group's rows sit at pos0 .. pos0 + rows - 1
  const int req = p.meta.row_request[row0];
  const int32_t* bt =
      p.meta.header->block_table + static_cast<int64_t>(req) * p.meta.header->block_table_stride;
  const int64_t base = static_cast<int64_t>(group) * p.union_cap;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  int count = 0;
  for (int w0 = 0; w0 <= pos0 + rows - 1; w0 += 32 * kUnionWindowWords) {
    for (int i = tid; i < kUnionWindowWords; i += kUnionThreads) bitmap[i] = 0u;
    __syncthreads();
    for_each_selected(p, row0, rows, pos0, w0,
                      [&](int, int t) { atomicOr(&bitmap[(t - w0) >> 5], 1u << (t & 31)); });
    __syncthreads();
    // Exclusive prefix of the words' popcounts: each thread owns 16 consecutive words.
    const int first = tid * kUnionWordsPerThread;
    int mine = 0;
#pragma unroll
    for (int i = 0; i < kUnionWordsPerThread; ++i) mine += __popc(bitmap[first + i]);
    int incl = mine;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, incl, d);
      if (lane >= d) incl += v;
    }
    if (lane == 31) warp_totals[warp] = incl;
    __syncthreads();
    int before = incl - mine, window = 0;
#pragma unroll
    for (int w = 0; w < kUnionThreads / 32; ++w) {
      before += w < warp ? warp_totals[w] : 0;
      window += warp_totals[w];
    }
    int run = before;
#pragma unroll
    for (int i = 0; i < kUnionWordsPerThread; ++i) {
      prefix[first + i] = run;
      run += __popc(bitmap[first + i]);
    }
    if (count + window > p.union_cap) {  // uniform: every thread has the same totals
      count = -1;
      break;
    }
    for (int i = tid; i < window; i += kUnionThreads) masks[i] = 0u;
    __syncthreads();
    for_each_selected(p, row0, rows, pos0, w0, [&](int r, int t) {
      const int word = (t - w0) >> 5;
      const uint32_t below = bitmap[word] & ((1u << (t & 31)) - 1u);
      atomicOr(&masks[prefix[word] + __popc(below)], 1u << r);
    });
    __syncthreads();
    // The window's tokens in order (this thread's words), then each entry's offset
    // through the block table: independent loads, four in flight per thread.
#pragma unroll 1
    for (int i = 0; i < kUnionWordsPerThread; ++i) {
      uint32_t bits = bitmap[first + i];
      int u = prefix[first + i];
      while (bits) {
        const int b = __ffs(bits) - 1;
        bits &= bits - 1u;
        tokens[u++] = w0 + 32 * (first + i) + b;
      }
    }
    __syncthreads();
    constexpr int kUnroll = 4;
    for (int u0 = tid; u0 < window; u0 += kUnroll * kUnionThreads) {
      int32_t phys[kUnroll];
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) {
        const int u = u0 + k * kUnionThreads;
        phys[k] = u < window ? __ldg(bt + tokens[u] / p.block_size) : -1;
      }
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) {
        const int u = u0 + k * kUnionThreads;
        if (u >= window) break;
        const bool mapped = phys[k] >= 0 && phys[k] < p.num_blocks;
        p.union_off[base + count + u] =
            mapped ? phys[k] * p.stride_block +
                         static_cast<int64_t>(tokens[u] % p.block_size) * p.stride_token
                   : -1;
        p.union_mask[base + count + u] = mapped ? masks[u] : 0u;
      }
    }
    count += window;
    __syncthreads();  // the next window rewrites bitmap, prefix and masks
  }
  if (tid == 0) p.union_count[group] = count;
}

}  // namespace cuda
}  // namespace qsakv
