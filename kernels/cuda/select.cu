// SPDX-License-Identifier: Apache-2.0
// Indexer selection on the GPU: score every visible compressed block on tensor cores,
// take the exact top-k of the scores (score descending, block ascending on ties), expand
// to tokens with the open group's tail, pad with -1.
//
// Two kernels per wave of rows:
//   1. select_score_kernel: grid (key chunks, rows). Each CTA scores kScoreKeysPerCta
//      consecutive compressed keys of one row, so one long row spreads over the whole GPU
//      and the key bytes (the selection's whole cost) stream at full bandwidth. Scores go
//      to a plan-owned workspace as order-preserving 32-bit keys (0: unmapped page), and
//      each CTA adds its keys to the row's histogram of the top 11 key bits.
//   2. select_topk_kernel: one CTA per row (launched early with programmatic dependent
//      launch where the GPU has it). The histogram names the bin of the k-th score; one
//      pass over the row's keys takes every key above that bin and gathers the bin into
//      shared memory, where a radix select over (score, block) composites finds the exact
//      remainder (radix_topk.cuh). A bin too large for shared memory is first narrowed by
//      a histogram of the next 11 bits (one more pass). The winners are sorted (bitonic,
//      the short strides in registers) and expanded.
// Rows are processed in waves when the workspace cannot hold every row of the plan at
// once (large prefill plans); decode-sized plans run in one wave.
#include <math_constants.h>
#include <stdint.h>

#include <algorithm>
#include <cmath>

#include "cuda/common.cuh"
#include "cuda/launch.hpp"
#include "cuda/radix_topk.cuh"
#include "cuda/select_score.cuh"
#include "cuda/select_score_simt.cuh"

namespace qsakv {
namespace cuda {

namespace {

constexpr int kScoreWarps = 4;
constexpr int kScoreMaxTilesPerCta = 16;  // 256 keys: 4 tiles per warp
constexpr int kTopkMaxBlocks = 1024;      // configs with more top-k blocks are refused
constexpr int kTopBits = 11;              // first radix digit: bits 31..21 of the score key
constexpr int kTopBins = 1 << kTopBits;
static_assert(kSimtHistBins == kTopBins, "the SM70 scoring kernel fills the same histogram");
constexpr int kCandidateCap = 3072;  // bin-of-the-threshold keys kept in shared memory
constexpr int kLoadsInFlight = 4;    // 16-byte workspace loads per thread per batch

// Workspace of one wave: score keys [rows][stride], then histograms [rows][kTopBins]
// (zero between calls: the top-k kernel clears its row's after reading it).
__host__ __device__ inline int64_t workspace_stride(int64_t max_blocks) {
  return ((max_blocks > 1 ? max_blocks : 1) + 3) / 4 * 4;
}

// ---------------------------------------------------------------------------------------
// 1. Scores
// ---------------------------------------------------------------------------------------

// Address of compressed key b of a row, or nullptr when b is not visible or its page is
// unmapped (such a block is never read and never selected).
__device__ __forceinline__ const uint16_t* key_address(const SelectParams& p, const int32_t* bt,
                                                       int64_t b, int64_t n, int D) {
  if (b >= n) return nullptr;
  const int64_t t0 = b * p.ratio;
  const int32_t phys = __ldg(bt + t0 / p.block_size);
  if (phys < 0 || phys >= p.num_blocks) return nullptr;
  const int groups_per_block = p.block_size / p.ratio;
  return p.compressed +
         (static_cast<int64_t>(phys) * groups_per_block + (t0 % p.block_size) / p.ratio) * D;
}

template <int D>
__global__ void __launch_bounds__(kScoreWarps * 32, 5)
    select_score_kernel(const SelectParams p, int row0, int wave_rows, int64_t ws_stride,
                        int tiles_per_cta, float inv_sqrt_dim) {
  __shared__ uint32_t hist[kTopBins];
  // Two tiles in flight per warp where registers allow (8 KB of keys per warp at D=128).
  constexpr int kInFlight = D <= 128 ? 2 : 1;
  const int row = row0 + static_cast<int>(blockIdx.y);
  if (row >= p.meta.header->num_rows) return;
  const int pos = p.meta.row_pos[row];
  const int64_t n = min(static_cast<int64_t>((pos + 1) / p.ratio), p.max_blocks);
  const int64_t cta0 = static_cast<int64_t>(blockIdx.x) * tiles_per_cta * kScoreTileKeys;
  if (cta0 >= n) return;
  const int req = p.meta.row_request[row];
  const int32_t* bt =
      p.meta.header->block_table + static_cast<int64_t>(req) * p.meta.header->block_table_stride;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t4 = lane & 3;

  for (int i = threadIdx.x; i < kTopBins; i += kScoreWarps * 32) hist[i] = 0u;
  QueryFrags<D> q;
  load_query_frags<D>(q, p.index_q + static_cast<int64_t>(row) * p.index_heads * D, p.index_heads,
                      g, t4);
  uint32_t* ws =
      reinterpret_cast<uint32_t*>(p.score_workspace) + static_cast<int64_t>(row - row0) * ws_stride;
  __syncthreads();  // hist cleared

  for (int t = warp; t < tiles_per_cta; t += kScoreWarps * kInFlight) {
    if (cta0 + static_cast<int64_t>(t) * kScoreTileKeys >= n) break;  // warp-uniform
    KeyFrags<D> k[kInFlight];
    bool mapped[kInFlight][2];
#pragma unroll
    for (int j = 0; j < kInFlight; ++j) {
      // A tile past this CTA's chunk (tiles_per_cta = 4) belongs to the next CTA: its
      // keys are neither read nor written nor counted here.
      const bool own = t + j * kScoreWarps < tiles_per_cta;
      const int64_t b = cta0 + static_cast<int64_t>(t + j * kScoreWarps) * kScoreTileKeys + g;
      const uint16_t* lo = own ? key_address(p, bt, b, n, D) : nullptr;
      const uint16_t* hi = own ? key_address(p, bt, b + 8, n, D) : nullptr;
      mapped[j][0] = lo != nullptr;
      mapped[j][1] = hi != nullptr;
      load_key_runs<D>(k[j].lo, lo, t4);
      load_key_runs<D>(k[j].hi, hi, t4);
    }
#pragma unroll
    for (int j = 0; j < kInFlight; ++j) {
      float s_lo, s_hi;
      score_tile<D>(k[j], q, inv_sqrt_dim, s_lo, s_hi);
      const int64_t b = cta0 + static_cast<int64_t>(t + j * kScoreWarps) * kScoreTileKeys + g;
      if (t4 == 0 && t + j * kScoreWarps < tiles_per_cta) {
        if (b < n) {
          const uint32_t key = mapped[j][0] ? score_key(s_lo) : 0u;
          ws[b] = key;
          if (key) atomicAdd(&hist[key >> (32 - kTopBits)], 1u);
        }
        if (b + 8 < n) {
          const uint32_t key = mapped[j][1] ? score_key(s_hi) : 0u;
          ws[b + 8] = key;
          if (key) atomicAdd(&hist[key >> (32 - kTopBits)], 1u);
        }
      }
    }
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cudaTriggerProgrammaticLaunchCompletion();  // the top-k kernel may start its prologue
#endif
  __syncthreads();
  uint32_t* row_hist = reinterpret_cast<uint32_t*>(p.score_workspace) +
                       static_cast<int64_t>(wave_rows) * ws_stride +
                       static_cast<int64_t>(row - row0) * kTopBins;
  for (int i = threadIdx.x; i < kTopBins; i += kScoreWarps * 32)
    if (hist[i]) atomicAdd(row_hist + i, hist[i]);
}

// Rows of one request scored together (see select_score.cuh). Grid: (key chunks, blocks of
// kRowsPerBlock rows). A block's rows are split into runs of one request each; a run's
// query fragments go to shared memory and every key tile is read once for the whole run.
// No histogram here: the top-k kernel builds it (hist_ready = false).
template <int D, int kHeadsPad>
__global__ void __launch_bounds__(kScoreWarps * 32, 4)
    select_score_rows_kernel(const SelectParams p, int row0, int wave_rows, int64_t ws_stride,
                             int tiles_per_cta, float inv_sqrt_dim) {
  constexpr int kRowsPerTile = 8 / kHeadsPad;
  constexpr int kNTiles = kRowsPerBlock / kRowsPerTile;
  __shared__ uint4 q_frag[kNTiles][D / 32][32];
  const int num_rows = p.meta.header->num_rows;
  const int r_first = row0 + static_cast<int>(blockIdx.y) * kRowsPerBlock;
  const int r_last = min(min(r_first + kRowsPerBlock, row0 + wave_rows), num_rows);  // exclusive
  const int64_t cta0 = static_cast<int64_t>(blockIdx.x) * tiles_per_cta * kScoreTileKeys;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  for (int r_begin = r_first; r_begin < r_last;) {
    const int req = p.meta.row_request[r_begin];
    int r_end = r_begin + 1;
    int pos_max = p.meta.row_pos[r_begin];
    while (r_end < r_last && p.meta.row_request[r_end] == req)
      pos_max = max(pos_max, p.meta.row_pos[r_end++]);
    const int n_run = r_end - r_begin;
    const int64_t n_max = min(static_cast<int64_t>((pos_max + 1) / p.ratio), p.max_blocks);
    if (cta0 < n_max) {  // block-uniform
      __syncthreads();   // the previous run is done with q_frag
      for (int e = threadIdx.x; e < kNTiles * (D / 32) * 32; e += kScoreWarps * 32) {
        const int j = e / ((D / 32) * 32), i = (e / 32) % (D / 32), l = e % 32;
        const int row = j * kRowsPerTile + (l >> 2) / kHeadsPad, head = (l >> 2) % kHeadsPad;
        q_frag[j][i][l] =
            row < n_run && head < p.index_heads
                ? __ldg(reinterpret_cast<const uint4*>(
                      p.index_q + (static_cast<int64_t>(r_begin + row) * p.index_heads + head) * D +
                      32 * i + 8 * (l & 3)))
                : make_uint4(0u, 0u, 0u, 0u);
      }
      __syncthreads();
      const int32_t* bt = p.meta.header->block_table +
                          static_cast<int64_t>(req) * p.meta.header->block_table_stride;
      const int n_tiles_used = (n_run + kRowsPerTile - 1) / kRowsPerTile;
      for (int t = warp; t < tiles_per_cta; t += kScoreWarps) {
        const int64_t b = cta0 + static_cast<int64_t>(t) * kScoreTileKeys + g;
        if (b - g >= n_max) break;  // warp-uniform
        KeyFrags<D> k;
        const uint16_t* klo = key_address(p, bt, b, n_max, D);
        const uint16_t* khi = key_address(p, bt, b + 8, n_max, D);
        load_key_runs<D>(k.lo, klo, t4);
        load_key_runs<D>(k.hi, khi, t4);
        float c[kNTiles][4];
#pragma unroll
        for (int j = 0; j < kNTiles; ++j) c[j][0] = c[j][1] = c[j][2] = c[j][3] = 0.0f;
#pragma unroll
        for (int i = 0; i < D / 32; ++i) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const uint32_t a[4] = {word(k.lo[i], 2 * h), word(k.hi[i], 2 * h),
                                   word(k.lo[i], 2 * h + 1), word(k.hi[i], 2 * h + 1)};
#pragma unroll
            for (int j = 0; j < kNTiles; ++j) {
              if (j >= n_tiles_used) break;  // warp-uniform
              const uint4 qv = q_frag[j][i][lane];
              mma_16816<false>(c[j], a, word(qv, 2 * h), word(qv, 2 * h + 1));
            }
          }
        }
#pragma unroll
        for (int j = 0; j < kNTiles; ++j) {
          if (j >= n_tiles_used) break;
          float s_lo, s_hi;
          sum_row_heads<kHeadsPad>(c[j], inv_sqrt_dim, s_lo, s_hi);
          const int row = j * kRowsPerTile + 2 * t4 / kHeadsPad;
          if ((t4 % (kHeadsPad / 2)) != 0 || row >= n_run) continue;
          const int rr = r_begin + row;
          const int64_t n =
              min(static_cast<int64_t>((p.meta.row_pos[rr] + 1) / p.ratio), p.max_blocks);
          uint32_t* ws = reinterpret_cast<uint32_t*>(p.score_workspace) +
                         static_cast<int64_t>(rr - row0) * ws_stride;
          if (b < n) ws[b] = klo ? score_key(s_lo) : 0u;
          if (b + 8 < n) ws[b + 8] = khi ? score_key(s_hi) : 0u;
        }
      }
    }
    r_begin = r_end;
  }
}

// ---------------------------------------------------------------------------------------
// 2. Top-k
// ---------------------------------------------------------------------------------------

struct TopkSmem {
  uint32_t hist[kTopBins];
  unsigned long long sel[kTopkMaxBlocks];
  unsigned long long cand[kCandidateCap];
  int warp_sums[kTopkThreads / 32];
  int digit;
  int need;
  int n_sel;
  int n_cand;
};

// Calls f(block, key) for every key of the row (keys[0..n)): 16-byte loads, a batch of
// kLoadsInFlight per thread issued before any is used (the loop is latency-bound). Every
// lane of a warp runs the same iterations (f may use warp collectives); positions past
// the row pass key 0, which no caller takes.
template <class F>
__device__ __forceinline__ void for_each_key(const uint32_t* keys, int64_t n, F&& f) {
  const int64_t n4 = (n + 3) / 4;
  const int lane = threadIdx.x & 31;
  for (int64_t base0 = threadIdx.x - lane; base0 < n4; base0 += kLoadsInFlight * kTopkThreads) {
    uint4 v[kLoadsInFlight];
#pragma unroll
    for (int u = 0; u < kLoadsInFlight; ++u) {
      const int64_t i = base0 + lane + u * kTopkThreads;
      v[u] = i < n4 ? *reinterpret_cast<const uint4*>(keys + 4 * i) : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (int u = 0; u < kLoadsInFlight; ++u) {
      const int64_t i = base0 + lane + u * kTopkThreads;
      const uint32_t w[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
#pragma unroll
      for (int j = 0; j < 4; ++j) f(4 * i + j, 4 * i + j < n ? w[j] : 0u);
    }
  }
}

// The candidates of the threshold bin: in shared memory, or (when they did not fit) the
// row's keys in the workspace.
struct SharedCandidates {
  const unsigned long long* c;
  int n;
  template <class F>
  __device__ __forceinline__ void each(F&& f) const {
    // Warp-uniform trip count; lanes past the list pass 0 (below every composite).
    for (int i0 = threadIdx.x & ~31; i0 < n; i0 += kTopkThreads) {
      const int i = i0 + (threadIdx.x & 31);
      f(i < n ? static_cast<uint64_t>(c[i]) : 0ull);
    }
  }
};
struct WorkspaceCandidates {
  const uint32_t* keys;
  int64_t n;
  template <class F>
  __device__ __forceinline__ void each(F&& f) const {
    for_each_key(keys, n, [&](int64_t b, uint32_t key) {
      f(key != 0u ? composite(key, static_cast<uint32_t>(b)) : 0ull);
    });
  }
};

// Appends to sm.sel the `need` largest composites of the candidates whose top `known`
// bits equal `top`. The remaining bits are resolved a digit at a time (the first digit
// takes the odd bits: 53 = 5 + 6 x 8, 42 = 2 + 5 x 8) until the chosen digit holds
// exactly the composites still needed; composites are unique, so this happens at the
// latest on the last digit.
template <class Src>
__device__ void take_from_threshold_bin(const Src& src, int known, uint32_t top, int need,
                                        TopkSmem& sm) {
  const int resolved0 = 64 - known;  // bits at and above this are known
  uint64_t prefix = static_cast<uint64_t>(top) << resolved0;
  int shift = resolved0;
  // Ends at the latest on the last digit (shift 0), where composites are unique; the
  // bound also keeps a corrupted workspace from hanging the kernel.
  while (shift > 0) {
    const int width = shift == resolved0 && resolved0 % 8 != 0 ? resolved0 % 8 : 8;
    const int next = shift - width;
    const uint32_t mask = (1u << width) - 1u;
    for (int i = threadIdx.x; i < 256; i += kTopkThreads) sm.hist[i] = 0u;
    __syncthreads();
    src.each([&](uint64_t v) {
      if (v != 0ull && (v >> shift) == (prefix >> shift))
        atomicAdd(&sm.hist[static_cast<uint32_t>(v >> next) & mask], 1u);
    });
    __syncthreads();
    find_digit<256>(sm.hist, need, sm.warp_sums, &sm.digit, &sm.need);
    const int digit = sm.digit, need_in_digit = sm.need;
    const int in_digit = static_cast<int>(sm.hist[digit]);
    __syncthreads();  // everyone has read the histogram before it is reused
    prefix |= static_cast<uint64_t>(digit) << next;
    shift = next;
    need = need_in_digit;
    if (in_digit == need_in_digit) break;
  }
  // Take every candidate of the bin at or above the threshold: exactly `need` of them
  // from the last digit, and everything the earlier digits ranked higher.
  src.each([&](uint64_t v) {
    warp_append<kTopkMaxBlocks>(
        sm.sel, &sm.n_sel,
        v != 0ull && (v >> resolved0) == top && (v >> shift) >= (prefix >> shift), v);
  });
  __syncthreads();
}

// Sorts sm.sel[0..n) descending (n <= kTopkMaxBlocks), padding to a power of two with
// zeros (below every composite). Bitonic; strides under 32 run in registers with warp
// shuffles, one barrier per size instead of one per stride.
__device__ void sort_selection_descending(TopkSmem& sm, int n) {
  constexpr int kSlots = kTopkMaxBlocks / kTopkThreads;
  int n_sort = 1;
  while (n_sort < n) n_sort <<= 1;
  for (int i = n + threadIdx.x; i < n_sort; i += kTopkThreads) sm.sel[i] = 0ull;
  __syncthreads();
  for (int size = 2; size <= n_sort; size <<= 1) {
    int stride = size >> 1;
    for (; stride >= 32; stride >>= 1) {
      for (int i = threadIdx.x; i < n_sort; i += kTopkThreads) {
        const int j = i ^ stride;
        if (j > i) {
          const bool desc = (i & size) == 0;
          const unsigned long long a = sm.sel[i], c = sm.sel[j];
          if (desc ? a < c : a > c) {
            sm.sel[i] = c;
            sm.sel[j] = a;
          }
        }
      }
      __syncthreads();
    }
    // Strides < 32: partners are lanes of the same warp. Indices >= n_sort only meet
    // each other (n_sort is a power of two) and are never written back.
#pragma unroll
    for (int slot = 0; slot < kSlots; ++slot) {
      const int i = slot * kTopkThreads + threadIdx.x;
      if (slot * kTopkThreads >= n_sort) break;  // block-uniform
      unsigned long long v = i < n_sort ? sm.sel[i] : 0ull;
      const bool desc = (i & size) == 0;
      for (int s = stride; s > 0; s >>= 1) {
        const unsigned long long o = __shfl_xor_sync(0xffffffffu, v, s);
        const bool lower = (i & s) == 0;
        const bool keep_max = desc == lower;
        v = keep_max ? (v > o ? v : o) : (v < o ? v : o);
      }
      if (i < n_sort) sm.sel[i] = v;
    }
    __syncthreads();
  }
}

__global__ void __launch_bounds__(kTopkThreads)
    select_topk_kernel(const SelectParams p, int row0, int wave_rows, int64_t ws_stride,
                       bool hist_ready) {
  __shared__ TopkSmem sm;
  const int row = row0 + static_cast<int>(blockIdx.x);
  const int tid = threadIdx.x;
  if (tid == 0) {
    sm.n_sel = 0;
    sm.n_cand = 0;
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cudaGridDependencySynchronize();  // the scores of this wave are complete and visible
#endif
  if (row >= p.meta.header->num_rows) return;
  const int pos = p.meta.row_pos[row];
  const int64_t n = min(static_cast<int64_t>((pos + 1) / p.ratio), p.max_blocks);
  const uint32_t* keys = reinterpret_cast<const uint32_t*>(p.score_workspace) +
                         static_cast<int64_t>(row - row0) * ws_stride;
  uint32_t* row_hist = reinterpret_cast<uint32_t*>(p.score_workspace) +
                       static_cast<int64_t>(wave_rows) * ws_stride +
                       static_cast<int64_t>(row - row0) * kTopBins;

  // The histogram of the top bits (left zero for the next call) and the number of
  // selectable (mapped) blocks.
  int local = 0;
  if (hist_ready) {
    for (int i = tid; i < kTopBins; i += kTopkThreads) {
      const uint32_t c = row_hist[i];
      sm.hist[i] = c;
      local += static_cast<int>(c);
      if (c) row_hist[i] = 0u;
    }
  } else {  // the multi-row scoring kernel builds no histogram: one pass here
    for (int i = tid; i < kTopBins; i += kTopkThreads) sm.hist[i] = 0u;
    __syncthreads();
    for_each_key(keys, n, [&](int64_t, uint32_t key) {
      if (key != 0u) {
        atomicAdd(&sm.hist[key >> (32 - kTopBits)], 1u);
        ++local;
      }
    });
  }
  int n_valid;
  block_inclusive_scan(local, sm.warp_sums, &n_valid);
  const int K = min(n_valid, p.topk_blocks);

  if (K > 0) {
    find_digit<kTopBins>(sm.hist, K, sm.warp_sums, &sm.digit, &sm.need);
    const uint32_t top = static_cast<uint32_t>(sm.digit);
    const int need = sm.need;
    const int in_bin = static_cast<int>(sm.hist[top]);
    const bool fits = in_bin <= kCandidateCap;
    __syncthreads();  // hist is reused below when the bin does not fit
    if (!fits)
      for (int i = tid; i < kTopBins; i += kTopkThreads) sm.hist[i] = 0u;
    __syncthreads();
    // Keys above the threshold bin are taken; the bin's keys are gathered, or (too many)
    // counted by their next 11 bits.
    for_each_key(keys, n, [&](int64_t b, uint32_t key) {
      const uint32_t t = key >> (32 - kTopBits);
      const uint64_t v = composite(key, static_cast<uint32_t>(b));
      warp_append<kTopkMaxBlocks>(sm.sel, &sm.n_sel, key != 0u && t > top, v);
      if (fits)
        warp_append<kCandidateCap>(sm.cand, &sm.n_cand, key != 0u && t == top, v);
      else if (key != 0u && t == top)
        atomicAdd(&sm.hist[(key >> (32 - 2 * kTopBits)) & (kTopBins - 1)], 1u);
    });
    __syncthreads();
    if (fits) {
      take_from_threshold_bin(SharedCandidates{sm.cand, in_bin}, kTopBits, top, need, sm);
    } else {
      // Narrow the bin by the next 11 bits, then gather the narrower bin.
      find_digit<kTopBins>(sm.hist, need, sm.warp_sums, &sm.digit, &sm.need);
      const uint32_t mid = static_cast<uint32_t>(sm.digit);
      const int need2 = sm.need;
      const int in_bin2 = static_cast<int>(sm.hist[mid]);
      const bool fits2 = in_bin2 <= kCandidateCap;
      const uint32_t top2 = (top << kTopBits) | mid;
      __syncthreads();
      for_each_key(keys, n, [&](int64_t b, uint32_t key) {
        const uint32_t t = key >> (32 - 2 * kTopBits);
        const bool in_top = key != 0u && (t >> kTopBits) == top;
        const uint64_t v = composite(key, static_cast<uint32_t>(b));
        warp_append<kTopkMaxBlocks>(sm.sel, &sm.n_sel, in_top && t > top2, v);
        if (fits2) warp_append<kCandidateCap>(sm.cand, &sm.n_cand, in_top && t == top2, v);
      });
      __syncthreads();
      if (fits2)
        take_from_threshold_bin(SharedCandidates{sm.cand, in_bin2}, 2 * kTopBits, top2, need2, sm);
      else
        take_from_threshold_bin(WorkspaceCandidates{keys, n}, 2 * kTopBits, top2, need2, sm);
    }
  }

  sort_selection_descending(sm, K);

  // Expand: chosen blocks' tokens, then the open group's tail, then -1.
  int32_t* out = p.topk + static_cast<int64_t>(row) * p.topk_stride;
  const int tail_start = (pos + 1) / p.ratio * p.ratio;
  const int tail = pos + 1 - tail_start;
  for (int j = tid; j < p.topk_width; j += kTopkThreads) {
    int32_t v = -1;
    if (j < K * p.ratio) {
      const uint32_t b = composite_block(sm.sel[j / p.ratio]);
      v = static_cast<int32_t>(b) * p.ratio + j % p.ratio;
    } else if (j < K * p.ratio + tail) {
      v = tail_start + (j - K * p.ratio);
    }
    out[j] = v;
  }
}

// Launches the multi-row scoring kernel for the shapes it is instantiated for (128-dim
// index keys with up to 8 heads, the reference geometry; 64 dims with 3-4 heads); false
// for other shapes, which take the one-row route (same scores, more key reads).
bool launch_score_rows(const SelectParams& p, int64_t chunks, int rows, int row0, int wave,
                       int64_t stride, int tiles_per_cta, float inv_sqrt_dim, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(chunks),
                  static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock));
  const int hp = p.index_heads <= 2 ? 2 : p.index_heads <= 4 ? 4 : 8;
  const dim3 block(kScoreWarps * 32);
  if (p.index_dim == 128) {
    if (hp == 2)
      select_score_rows_kernel<128, 2>
          <<<grid, block, 0, stream>>>(p, row0, wave, stride, tiles_per_cta, inv_sqrt_dim);
    else if (hp == 4)
      select_score_rows_kernel<128, 4>
          <<<grid, block, 0, stream>>>(p, row0, wave, stride, tiles_per_cta, inv_sqrt_dim);
    else
      select_score_rows_kernel<128, 8>
          <<<grid, block, 0, stream>>>(p, row0, wave, stride, tiles_per_cta, inv_sqrt_dim);
    return true;
  }
  if (p.index_dim == 64 && hp == 4) {
    select_score_rows_kernel<64, 4>
        <<<grid, block, 0, stream>>>(p, row0, wave, stride, tiles_per_cta, inv_sqrt_dim);
    return true;
  }
  return false;
}

}  // namespace

int select_rows_per_wave(int max_rows, int64_t max_blocks) {
  // Up to 128 MiB of score keys: a decode plan holds all its rows (64 rows at 128K use
  // 8 MiB); an 8192-row prefill plan at 32K runs in two waves.
  constexpr int64_t kBudget = 128ll << 20;
  const int64_t per_row = workspace_stride(max_blocks) * 4;
  const int64_t rows = std::max<int64_t>(1, kBudget / per_row);
  return static_cast<int>(std::min<int64_t>({rows, max_rows, 65535}));
}

size_t select_workspace_bytes(int max_rows, int64_t max_blocks) {
  return static_cast<size_t>(select_rows_per_wave(max_rows, max_blocks)) *
         static_cast<size_t>(workspace_stride(max_blocks) + kTopBins) * 4;
}

bool select_supports(int index_heads, int index_dim, int topk_blocks) {
  return index_heads >= 1 && index_heads <= kScoreMaxHeads &&
         (index_dim == 64 || index_dim == 128 || index_dim == 256) && topk_blocks <= kTopkMaxBlocks;
}

void launch_select_topk(const SelectParams& p, int sm_version, int sm_count, cudaStream_t stream) {
  const float inv_sqrt_dim = 1.0f / std::sqrt(static_cast<float>(p.index_dim));
  const int64_t stride = workspace_stride(p.max_blocks);
  const int wave = select_rows_per_wave(p.meta.max_rows, p.max_blocks);
  const int64_t tiles = (std::max<int64_t>(p.max_blocks, 1) + kScoreTileKeys - 1) / kScoreTileKeys;
  // Fewer tiles per CTA when the plan's rows would not give every SM ~4 CTAs: a short
  // batch of long rows then still has many loads in flight (1 row at 128K: 256 CTAs).
  // Scores do not depend on this choice (each key is scored by one warp either way).
  int tiles_per_cta = kScoreMaxTilesPerCta;
  while (tiles_per_cta > 2 * kScoreWarps &&
         (tiles + tiles_per_cta - 1) / tiles_per_cta * std::min(wave, p.meta.max_rows) <
             4ll * sm_count)
    tiles_per_cta /= 2;
  const int64_t chunks = (tiles + tiles_per_cta - 1) / tiles_per_cta;
  for (int row0 = 0; row0 < p.meta.max_rows; row0 += wave) {
    const int rows = std::min(wave, p.meta.max_rows - row0);
    // The SM70 tier (sm_version < 75) scores on CUDA cores, one row at a time.
    const bool simt = sm_version < 75;
    // Rows sharing a request: each key tile read once for all of them (where built).
    const bool multi_row =
        !simt && p.rows_share_requests &&
        launch_score_rows(p, chunks, rows, row0, wave, stride, tiles_per_cta, inv_sqrt_dim, stream);
    if (simt) {
      launch_score_simt(p, chunks, rows, row0, wave, stride, tiles_per_cta * kScoreTileKeys,
                        inv_sqrt_dim, stream);
    } else if (!multi_row) {
      const dim3 grid(static_cast<unsigned>(chunks), static_cast<unsigned>(rows));
      switch (p.index_dim) {
        case 64:
          select_score_kernel<64><<<grid, kScoreWarps * 32, 0, stream>>>(
              p, row0, wave, stride, tiles_per_cta, inv_sqrt_dim);
          break;
        case 128:
          select_score_kernel<128><<<grid, kScoreWarps * 32, 0, stream>>>(
              p, row0, wave, stride, tiles_per_cta, inv_sqrt_dim);
          break;
        default:
          select_score_kernel<256><<<grid, kScoreWarps * 32, 0, stream>>>(
              p, row0, wave, stride, tiles_per_cta, inv_sqrt_dim);
          break;
      }
    }
    // Programmatic dependent launch (SM90+): the top-k grid is scheduled while the
    // scoring grid drains; it waits in cudaGridDependencySynchronize for the scores.
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(static_cast<unsigned>(rows));
    cfg.blockDim = dim3(kTopkThreads);
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = sm_version >= 90 ? 1 : 0;
    if (cudaLaunchKernelEx(&cfg, select_topk_kernel, p, row0, wave, stride, !multi_row) !=
        cudaSuccess)
      return;  // the error stays pending for the caller's check
  }
}

}  // namespace cuda
}  // namespace qsakv
