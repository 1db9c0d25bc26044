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
//   2. The top-k, launched early with programmatic dependent launch where the GPU has it.
//      select_filter_kernel (waves of at most one row per SM, histogram ready): many CTAs
//      per row find the histogram's threshold bin and send their chunk's keys above it
//      and in it to per-row lists; the last CTA of the row finishes it. select_topk_kernel
//      (other waves, or rows of the multi-row scoring route): one CTA per row, one pass
//      over the row's keys. Both resolve the threshold bin by a radix select over (score,
//      block) composites in shared memory (radix_topk.cuh), sort the winners (by buckets,
//      bucket_sort.cuh, or by runs; sort_winners) and expand.
// Rows are processed in waves when the workspace cannot hold every row of the plan at
// once (large prefill plans); decode-sized plans run in one wave.
#include <math_constants.h>
#include <stdint.h>

#include <algorithm>
#include <atomic>
#include <cmath>

#include "cuda/bucket_sort.cuh"
#include "cuda/common.cuh"
#include "cuda/dependent_launch.cuh"
#include "cuda/last_arrival.cuh"
#include "cuda/launch.hpp"
#include "cuda/radix_topk.cuh"
#include "cuda/kernel_smem.hpp"
#include "cuda/select_score.cuh"
#include "cuda/select_score_simt.cuh"
#include "cuda/select_score_wgmma.cuh"
#include "limits.hpp"

namespace qsakv {
namespace cuda {

namespace {

constexpr int kScoreWarps = 4;
// The longest rows (keys: compressed blocks of the plan's longest request) that the one-CTA
// top-k runs at 3 CTAs per SM (select_topk_kernel): 32K tokens at ratio 4, the longest
// measured faster that way; 128K (32,768 keys) measured slower (docs/perf.md run 39).
constexpr int64_t kTopkThreeCtasMaxKeys = 8192;
constexpr int kScoreMaxTilesPerCta = 16;              // 256 keys: 4 tiles per warp
constexpr int kScoreRowsMaxTilesPerCta = 32;          // the multi-row scorer's, at most
constexpr int kTopkMaxBlocks = kSelectMaxTopkBlocks;  // configs with more are refused
constexpr int kTopBits = 11;  // first radix digit: bits 31..21 of the score key
constexpr int kTopBins = 1 << kTopBits;
static_assert(kSimtHistBins == kTopBins, "the SM70 scoring kernel fills the same histogram");
constexpr int kCandidateCap = 3072;  // bin-of-the-threshold keys kept in shared memory
constexpr int kLoadsInFlight = 4;    // 16-byte workspace loads per thread per batch
constexpr int kSplitWords = 2;       // the same for passes that also append (registers)

constexpr int kFilterKeys = 4096;  // keys per CTA of the filter kernel (8 per thread)
// Entries of the threshold bin's list per thread that the filter's last CTA loads before
// it knows the count (a bin of a 32K-key row holds ~500-1,500 keys).
constexpr int kBinSlots = 2;
constexpr int kFilterMaxRows = 256;  // most rows of a wave on the filter route

// Workspace of one wave: score keys [rows][stride], then histograms [rows][kTopBins], then
// for the first min(rows, kFilterMaxRows) rows a FilterRowState each and the rows' lists
// (kTopkMaxBlocks composites above the threshold bin, then kCandidateCap in it). The
// histograms and states are zero between calls: the kernel that finishes a row clears
// them (and the allocation is zeroed).
__host__ __device__ inline int64_t workspace_stride(int64_t max_blocks) {
  return ((max_blocks > 1 ? max_blocks : 1) + 3) / 4 * 4;
}
struct FilterRowState {
  int n_above;   // list entries above the threshold bin (all CTAs of the row)
  int n_bin;     // entries in the bin (counted past the list's capacity)
  int32_t done;  // CTAs of the row that have finished their chunk (last_arrival.cuh)
  int unused;
};
constexpr int kListEntries = kTopkMaxBlocks + kCandidateCap;
__host__ __device__ inline int filter_rows(int wave_rows) {
  return wave_rows < kFilterMaxRows ? wave_rows : kFilterMaxRows;
}
__host__ __device__ inline size_t wave_workspace_bytes(int wave_rows, int64_t stride) {
  return static_cast<size_t>(wave_rows) * static_cast<size_t>(stride + kTopBins) * 4 +
         static_cast<size_t>(filter_rows(wave_rows)) *
             (sizeof(FilterRowState) + kListEntries * sizeof(unsigned long long));
}

// One row's part of the wave's workspace (no state or lists past kFilterMaxRows rows).
struct WaveRow {
  const uint32_t* keys;
  uint32_t* hist;
  FilterRowState* state;
  unsigned long long* above;
  unsigned long long* bin;
};
__device__ __forceinline__ WaveRow wave_row(float* ws, int wave_rows, int64_t stride, int r) {
  uint32_t* base = reinterpret_cast<uint32_t*>(ws);
  uint32_t* hist0 = base + static_cast<int64_t>(wave_rows) * stride;
  auto* state0 =
      reinterpret_cast<FilterRowState*>(hist0 + static_cast<int64_t>(wave_rows) * kTopBins);
  auto* lists0 = reinterpret_cast<unsigned long long*>(state0 + filter_rows(wave_rows));
  WaveRow w = {base + static_cast<int64_t>(r) * stride, hist0 + static_cast<int64_t>(r) * kTopBins,
               nullptr, nullptr, nullptr};
  if (r < filter_rows(wave_rows)) {
    w.state = state0 + r;
    w.above = lists0 + static_cast<int64_t>(r) * kListEntries;
    w.bin = w.above + kTopkMaxBlocks;
  }
  return w;
}

// ---------------------------------------------------------------------------------------
// 1. Scores
// ---------------------------------------------------------------------------------------

template <int D, bool kFp8>
__global__ void __launch_bounds__(kScoreWarps * 32, 5)
    select_score_kernel(const SelectParams p, int row0, int wave_rows, int64_t ws_stride,
                        int tiles_per_cta, float inv_sqrt_dim) {
  __shared__ uint32_t hist[kTopBins];
  // FP16: two tiles in flight per warp where registers allow (8 KB of keys per warp at
  // D=128). E4M3: one (measured on an H200, 64 rows at 128K, scoring kernel alone: 102 us
  // at one tile, 105 at two, 140 at three, more at four with fewer CTAs per SM; the
  // decode's registers cost more occupancy than a second tile gains). docs/perf.md.
  constexpr int kInFlight = kFp8 ? 1 : (D <= 128 ? 2 : 1);
  wait_for_predecessors();  // the compressed keys, the workspace's last reader
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
  load_query_frags<D, kFp8>(q, p.index_q + static_cast<int64_t>(row) * p.index_heads * D,
                            p.index_heads, g, t4);
  uint32_t* ws =
      reinterpret_cast<uint32_t*>(p.score_workspace) + static_cast<int64_t>(row - row0) * ws_stride;
  const TilePages pages = tile_pages(p, bt, cta0, tiles_per_cta, n, lane);
  __syncthreads();  // hist cleared

  for (int t = warp; t < tiles_per_cta; t += kScoreWarps * kInFlight) {
    if (cta0 + static_cast<int64_t>(t) * kScoreTileKeys >= n) break;  // warp-uniform
    KeyFrags<D, kFp8> k[kInFlight];
    bool mapped[kInFlight][2];
    float factor[kInFlight][2];  // key_score_factor, loaded with the keys
#pragma unroll
    for (int j = 0; j < kInFlight; ++j) {
      // A tile past this CTA's chunk (tiles_per_cta = 4) belongs to the next CTA: its
      // keys are neither read nor written nor counted here.
      const bool own = t + j * kScoreWarps < tiles_per_cta;
      const int64_t b = cta0 + static_cast<int64_t>(t + j * kScoreWarps) * kScoreTileKeys + g;
      CompressedKeyAddress lo, hi;
      tile_key_addresses(p, bt, pages, t + j * kScoreWarps, b, n, own, lo, hi);
      mapped[j][0] = lo.codes != nullptr;
      mapped[j][1] = hi.codes != nullptr;
      factor[j][0] = key_score_factor<kFp8>(lo.scale);
      factor[j][1] = key_score_factor<kFp8>(hi.scale);
      load_key_runs<D, kFp8>(k[j].lo, lo.codes, t4);
      load_key_runs<D, kFp8>(k[j].hi, hi.codes, t4);
    }
#pragma unroll
    for (int j = 0; j < kInFlight; ++j) {
      float s_lo, s_hi;
      score_tile<D, kFp8>(k[j], q, inv_sqrt_dim, s_lo, s_hi);
      const int64_t b = cta0 + static_cast<int64_t>(t + j * kScoreWarps) * kScoreTileKeys + g;
      if (t4 == 0 && t + j * kScoreWarps < tiles_per_cta) {
        s_lo *= factor[j][0];
        s_hi *= factor[j][1];
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
  __syncthreads();
  uint32_t* row_hist = reinterpret_cast<uint32_t*>(p.score_workspace) +
                       static_cast<int64_t>(wave_rows) * ws_stride +
                       static_cast<int64_t>(row - row0) * kTopBins;
  for (int i = threadIdx.x; i < kTopBins; i += kScoreWarps * 32)
    if (hist[i]) atomicAdd(row_hist + i, hist[i]);
  // No allow_dependents(): each CTA's exit is its trigger, so the top-k grid is scheduled
  // as the scoring grid drains, and its wait_for_predecessors() waits for this whole grid
  // and its writes in any case.
}

// Rows of one request scored together (see select_score.cuh). Grid: (key chunks, blocks of
// kRowsPerBlock rows). A block's rows are split into runs of one request each; a run's
// query fragments go to shared memory and every key tile is read once for the whole run.
// No histogram here: the top-k kernel builds it (hist_ready = false).
template <int D, int kHeadsPad, bool kFp8>
__global__ void __launch_bounds__(kScoreWarps * 32, 4)
    select_score_rows_kernel(const SelectParams p, int row0, int wave_rows, int64_t ws_stride,
                             int tiles_per_cta, float inv_sqrt_dim) {
  constexpr int kRowsPerTile = 8 / kHeadsPad;
  constexpr int kNTiles = kRowsPerBlock / kRowsPerTile;
  // Lanes that store: kHeadsPad >= 4, a pair of lanes per row (t4 even key g, odd g + 8);
  // kHeadsPad = 2, every lane both keys of its row.
  constexpr bool kSplit = kHeadsPad >= 4;
  constexpr int kGroup = 2;  // n-tiles whose MMA chains interleave (kNTiles % kGroup == 0)
  static_assert(kNTiles % kGroup == 0, "whole groups of n-tiles");
  __shared__ uint4 q_frag[kNTiles][D / 32][32];
  __shared__ int32_t row_n[kRowsPerBlock];  // visible keys of the run's rows (0: no row)
  wait_for_predecessors();                  // the compressed keys, the workspace's last reader
  const int num_rows = p.meta.header->num_rows;
  const int r_first = row0 + static_cast<int>(blockIdx.y) * kRowsPerBlock;
  const int r_last = min(min(r_first + kRowsPerBlock, row0 + wave_rows), num_rows);  // exclusive
  const int64_t cta0 = static_cast<int64_t>(blockIdx.x) * tiles_per_cta * kScoreTileKeys;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const bool odd = (t4 & 1) != 0;
  // The lane's row within an n-tile, and its key within the tile's pair (g or g + 8).
  const int lane_row = 2 * t4 / kHeadsPad;
  const bool lane_stores = !kSplit || t4 % (kHeadsPad / 2) < 2;
  static_assert(kRowsPerBlock <= 32, "a lane per row");
  const BlockRuns block(p.meta, r_first, r_last, lane);
  for (int r_begin = r_first; r_begin < r_last;) {
    const int first = r_begin - r_first;
    const BlockRuns::Run run = block.run_at(first, lane, p.ratio, p.max_blocks);
    const int req = run.req, r_end = r_first + run.end, n_run = r_end - r_begin;
    const int64_t n_max = run.n_max;
    if (cta0 < n_max) {  // block-uniform
      __syncthreads();   // the previous run is done with q_frag and row_n
      {
        // Thread (warp, lane) fills run i = warp % (D / 32) of lane `lane` for the n-tiles
        // j = warp / (D / 32) + kJStep * it: one (row, head) column pair per thread, whose
        // row advances by kJStep * kRowsPerTile rows per step (a pointer increment).
        constexpr int kRunsPerTile = D / 32;
        static_assert(kScoreWarps % kRunsPerTile == 0, "whole n-tiles per pass of the CTA");
        constexpr int kJStep = kScoreWarps / kRunsPerTile;
        static_assert(kNTiles % kJStep == 0, "every n-tile filled by the loop below");
        const int i = warp % kRunsPerTile, j0 = warp / kRunsPerTile;
        const int row0_l = j0 * kRowsPerTile + g / kHeadsPad, head = g % kHeadsPad;
        const uint16_t* src = p.index_q +
                              (static_cast<int64_t>(r_begin + row0_l) * p.index_heads + head) * D +
                              query_run_offset<kFp8>(i, t4);
        const int64_t src_step = static_cast<int64_t>(kJStep) * kRowsPerTile * p.index_heads * D;
#pragma unroll
        for (int it = 0; it < kNTiles / kJStep; ++it) {
          const int row = row0_l + it * kJStep * kRowsPerTile;
          q_frag[j0 + it * kJStep][i][lane] =
              row < n_run && head < p.index_heads
                  ? __ldg(reinterpret_cast<const uint4*>(src + it * src_step))
                  : make_uint4(0u, 0u, 0u, 0u);
        }
      }
      {
        // Thread t < kRowsPerBlock (warp 0) takes row r_begin + t's position from its lane.
        const int t = static_cast<int>(threadIdx.x);
        const int pos = block.pos_of(min(first + lane, 31));
        if (t < kRowsPerBlock)
          row_n[t] = t < n_run ? static_cast<int32_t>(
                                     min(static_cast<int64_t>((pos + 1) / p.ratio), p.max_blocks))
                               : 0;
      }
      __syncthreads();
      const int32_t* bt = p.meta.header->block_table +
                          static_cast<int64_t>(req) * p.meta.header->block_table_stride;
      const int n_tiles_used = (n_run + kRowsPerTile - 1) / kRowsPerTile;
      const TilePages pages = tile_pages(p, bt, cta0, tiles_per_cta, n_max, lane);
      // The lane's first row's scores; n-tile j's row is kRowsPerTile * j rows further.
      uint32_t* const ws_lane = reinterpret_cast<uint32_t*>(p.score_workspace) +
                                static_cast<int64_t>(r_begin + lane_row - row0) * ws_stride;
      const int64_t ws_tile_step = kRowsPerTile * ws_stride;
      for (int t = warp; t < tiles_per_cta; t += kScoreWarps) {
        const int64_t b = cta0 + static_cast<int64_t>(t) * kScoreTileKeys + g;
        if (b - g >= n_max) break;  // warp-uniform
        KeyFrags<D, kFp8> k;
        CompressedKeyAddress klo, khi;
        tile_key_addresses(p, bt, pages, t, b, n_max, true, klo, khi);
        load_key_runs<D, kFp8>(k.lo, klo.codes, t4);
        load_key_runs<D, kFp8>(k.hi, khi.codes, t4);
        // The tile's A fragments, converted once for all n-tiles (32 registers at D = 128).
        uint32_t a[D / 16][4];
#pragma unroll
        for (int ks = 0; ks < D / 16; ++ks) k.a_frag(ks, a[ks]);
        // Block indices fit in 32 bits (positions are int32).
        const uint32_t b32 = static_cast<uint32_t>(b);
        const CompressedKeyAddress ka = odd ? khi : klo;  // kSplit: the lane's key
        const float f = key_score_factor<kFp8>(ka.scale);
        const float f_lo = kSplit ? f : key_score_factor<kFp8>(klo.scale);
        const float f_hi = kSplit ? f : key_score_factor<kFp8>(khi.scale);
        const bool mapped = ka.codes != nullptr;
        const bool mapped_lo = klo.codes != nullptr, mapped_hi = khi.codes != nullptr;
        const uint32_t key = b32 + (kSplit && odd ? 8u : 0u);
        uint32_t* ws = ws_lane + key;
        // kGroup n-tiles at a time (independent MMA chains that interleave): each takes its
        // k-steps 0 .. D/16 - 1 in order into a fresh accumulator, as in score_tile (one
        // 16-byte query load feeds two k-steps), then its scores.
#pragma unroll
        for (int j0 = 0; j0 < kNTiles; j0 += kGroup) {
          if (j0 >= n_tiles_used) break;  // warp-uniform
          float c[kGroup][4];
#pragma unroll
          for (int u = 0; u < kGroup; ++u) c[u][0] = c[u][1] = c[u][2] = c[u][3] = 0.0f;
#pragma unroll
          for (int i = 0; i < D / 32; ++i) {
#pragma unroll
            for (int u = 0; u < kGroup; ++u) {
              const uint4 qv = q_frag[j0 + u][i][lane];
              mma_16816<false>(c[u], a[2 * i], qv.x, qv.y);
              mma_16816<false>(c[u], a[2 * i + 1], qv.z, qv.w);
            }
          }
#pragma unroll
          for (int u = 0; u < kGroup; ++u) {
            // n-tiles and rows past the run have row_n 0 (no store). Values are computed by
            // every lane and the stores predicated (the `mapped` select may still branch).
            const uint32_t n = static_cast<uint32_t>(row_n[(j0 + u) * kRowsPerTile + lane_row]);
            if constexpr (kSplit) {
              const float s = sum_row_heads_split<kHeadsPad>(c[u], inv_sqrt_dim, odd);
              const uint32_t v = mapped ? score_key(s * f) : 0u;
              if (lane_stores && key < n) *ws = v;
            } else {
              float s_lo, s_hi;
              sum_row_heads<kHeadsPad>(c[u], inv_sqrt_dim, s_lo, s_hi);
              const uint32_t v_lo = mapped_lo ? score_key(s_lo * f_lo) : 0u;
              const uint32_t v_hi = mapped_hi ? score_key(s_hi * f_hi) : 0u;
              if (b32 < n) ws[0] = v_lo;
              if (b32 + 8 < n) ws[8] = v_hi;
            }
            ws += ws_tile_step;
          }
        }
      }
    }
    r_begin = r_end;
  }
}

// ---------------------------------------------------------------------------------------
// 2. Top-k
// ---------------------------------------------------------------------------------------

// The one-CTA top-k's SM80 forms (find_digit_in_warp, the winners' bounds for the bucket
// sort). Code below SM80 keeps the block-wide forms: the SM70 tier sorts by runs, and with
// the warp's digit search the one-CTA top-k spilled at its 64-register cap for sm_70
// (ptxas 12.9, tools/sm70-check.sh).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
constexpr bool kTopkSm80Forms = false;
#else
constexpr bool kTopkSm80Forms = true;
#endif

// log2 of a power-of-two compression ratio (the reference model's 4), else -1.
__device__ __forceinline__ int ratio_shift_of(int ratio) {
  return (ratio & (ratio - 1)) == 0 ? __ffs(ratio) - 1 : -1;
}
// The complete blocks through position pos, (pos + 1) / ratio: a shift where ratio_shift
// (ratio_shift_of) allows; a runtime division is ~20 instructions, run by every thread of
// a top-k CTA.
__device__ __forceinline__ int blocks_through(int pos, int ratio, int ratio_shift) {
  return ratio_shift >= 0 ? (pos + 1) >> ratio_shift : (pos + 1) / ratio;
}

static_assert(kTopkMaxBlocks + kSortBuckets / 2 <= kCandidateCap,
              "the bucket sort's counts fit in cand past the sorted winners");
static_assert(kTopkMaxBlocks < (1 << 16), "the bucket sort packs a start and a count");
struct TopkSmem {
  // The histogram, or (once the last radix round has read it) the winners of the one-list
  // route (select_by_passes).
  union {
    // + a bin that build_top_hist sends unmapped keys to; 16-byte aligned for
    // find_digit_in_warp's loads.
    alignas(16) uint32_t hist[kTopBins + 1];
    unsigned long long win[kTopkMaxBlocks];
  };
  // sel (kTopkMaxBlocks), then cand (kCandidateCap); the one-list route uses both as one list.
  unsigned long long list[kTopkMaxBlocks + kCandidateCap];
  __device__ __forceinline__ unsigned long long* sel() { return list; }
  __device__ __forceinline__ unsigned long long* cand() { return list + kTopkMaxBlocks; }
  unsigned long long range[2 * kTopkThreads / 32];  // the bucket sort's min/max scratch
  int warp_sums[kTopkThreads / 32];
  // The one-list route's bounds of its winners for the bucket sort (take_from_threshold_bin):
  // the resolved threshold, and the largest winner's score key.
  unsigned long long winners_lo;
  uint32_t winners_key_max;
  int k;  // find_digit_in_warp's K
  int digit;
  int need;
  int n_sel;
  int n_cand;
  int last;
};

// find_digit over sm.hist into sm.digit and sm.need, for the top-k's forms (kManyRows:
// take_from_threshold_bin's): one warp searches while the others wait (find_digit_in_warp)
// on SM80 and up, else the block-wide search. Returns K; ends in a barrier.
template <bool kManyRows>
__device__ __forceinline__ int find_topk_digit(TopkSmem& sm, int need_cap) {
  if (kManyRows && kTopkSm80Forms) {
    if (threadIdx.x < 32)
      find_digit_in_warp<kTopBins>(sm.hist, need_cap, &sm.k, &sm.digit, &sm.need);
    __syncthreads();
    return sm.k;
  }
  return find_digit<kTopBins>(sm.hist, need_cap, sm.warp_sums, &sm.digit, &sm.need);
}

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

// A batch of kWords 16-byte words of score keys per thread, the warp's words consecutive:
// thread words w0 + lane + u * kTopkThreads (zero past w_end). Block indices fit in 32
// bits (positions are int32).
template <int kWords>
struct KeyWords {
  uint4 v[kWords];
  uint32_t index[kWords];  // word index: its first block is 4 * index
  __device__ __forceinline__ void load(const uint32_t* keys, uint32_t w0, uint32_t w_end) {
    const uint32_t lane = threadIdx.x & 31u;
#pragma unroll
    for (int u = 0; u < kWords; ++u) {
      index[u] = w0 + lane + u * kTopkThreads;
      v[u] = index[u] < w_end ? *reinterpret_cast<const uint4*>(keys + 4ull * index[u])
                              : make_uint4(0u, 0u, 0u, 0u);
    }
  }
  // Sends the keys of blocks [lo, hi) whose top `known` bits are above `top` to `above`
  // and those whose top bits equal `top` to `bin` (a capacity of 0 drops them), as
  // composites: each warp reserves its slots with one atomic per list (a per-key ballot
  // would cost more than the load). Lists and counters may be in shared or global memory.
  __device__ __forceinline__ void split(uint32_t lo, uint32_t hi, int known, uint32_t top,
                                        unsigned long long* above, int* n_above, int above_cap,
                                        unsigned long long* bin, int* n_bin, int bin_cap) const {
    uint32_t take_above = 0u, take_bin = 0u;
#pragma unroll
    for (int u = 0; u < kWords; ++u) {
      const uint32_t w[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t b = 4u * index[u] + j;
        const uint32_t t = w[j] >> (32 - known);
        const bool valid = w[j] != 0u && b >= lo && b < hi;
        take_above |= static_cast<uint32_t>(valid && t > top) << (4 * u + j);
        take_bin |= static_cast<uint32_t>(valid && t == top) << (4 * u + j);
      }
    }
    warp_append_words(above, n_above, above_cap, take_above, v, index);
    if (bin_cap > 0) warp_append_words(bin, n_bin, bin_cap, take_bin, v, index);
  }
};

// One pass over keys[b_begin, b_end) (b_begin a multiple of 4), a KeyWords batch at a
// time: see KeyWords::split.
template <int kWords>
__device__ __forceinline__ void split_at_bin(const uint32_t* keys, int64_t b_begin, int64_t b_end,
                                             int known, uint32_t top, unsigned long long* above,
                                             int* n_above, int above_cap, unsigned long long* bin,
                                             int* n_bin, int bin_cap) {
  const uint32_t w_begin = static_cast<uint32_t>(b_begin / 4);
  const uint32_t w_end = static_cast<uint32_t>((b_end + 3) / 4);
  const uint32_t lane = threadIdx.x & 31u;
  for (uint32_t w0 = w_begin + threadIdx.x - lane; w0 < w_end; w0 += kWords * kTopkThreads) {
    KeyWords<kWords> k;
    k.load(keys, w0, w_end);
    k.split(static_cast<uint32_t>(b_begin), static_cast<uint32_t>(b_end), known, top, above,
            n_above, above_cap, bin, n_bin, bin_cap);
  }
}

// A batch of kWords 16-byte words of keys[0..n) per thread, the warp's words consecutive
// (word w0 + lane + u * kTopkThreads), zero past the row. 32-bit indices (positions are
// int32). Only the row's last word can hold keys past n: one per-thread test per batch
// finds the thread that holds it (n % 4 != 0), which alone zeroes them.
template <int kWords>
__device__ __forceinline__ void load_row_words(const uint32_t* keys, uint32_t w0, uint32_t n,
                                               uint4 (&v)[kWords]) {
  const uint32_t n4 = (n + 3u) / 4u, lane = threadIdx.x & 31u;
  const uint4* p = reinterpret_cast<const uint4*>(keys) + (w0 + lane);  // 64-bit offsets below
#pragma unroll
  for (int u = 0; u < kWords; ++u)
    v[u] = w0 + lane + u * kTopkThreads < n4 ? p[u * kTopkThreads] : make_uint4(0u, 0u, 0u, 0u);
  const uint32_t rel = n4 - 1u - (w0 + lane);  // the last word's offset from this thread's first
  if ((n & 3u) != 0u && rel < kWords * kTopkThreads && rel % kTopkThreads == 0u) {
#pragma unroll
    for (int u = 0; u < kWords; ++u) {
      if (rel == u * kTopkThreads) {
        if ((n & 3u) < 2u) v[u].y = 0u;
        if ((n & 3u) < 3u) v[u].z = 0u;
        v[u].w = 0u;
      }
    }
  }
}

// The row's top-bits histogram (hist zero on entry, kTopBins + 1 entries): one pass,
// kLoadsInFlight words per thread per batch. Unmapped keys (0) and the zeros past the row
// go to the extra bin, which no one reads: no branch per key.
__device__ __forceinline__ void build_top_hist(const uint32_t* keys, uint32_t n, uint32_t* hist) {
  const uint32_t n4 = (n + 3u) / 4u, lane = threadIdx.x & 31u;
  for (uint32_t w0 = threadIdx.x - lane; w0 < n4; w0 += kLoadsInFlight * kTopkThreads) {
    uint4 v[kLoadsInFlight];
    load_row_words<kLoadsInFlight>(keys, w0, n, v);
#pragma unroll
    for (int u = 0; u < kLoadsInFlight; ++u) {
      // A slot past the row for the whole warp (warp-uniform) counts nothing: at 32K a
      // prefill row fills one batch only partly.
      if (w0 + u * kTopkThreads >= n4) break;
      const uint32_t w[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
#pragma unroll
      for (int j = 0; j < 4; ++j)
        atomicAdd(&hist[w[j] != 0u ? w[j] >> (32 - kTopBits) : kTopBins], 1u);
    }
  }
}

// Appends to list (capacity cap, counter *count; shared) the composites of the keys of
// keys[0..n) at or above thr. thr >= 1, so unmapped keys (0) and the zeros past the row
// never qualify. One pass, kWords words per thread per batch: a per-thread count, a warp
// scan, one shared atomic per warp and batch, then a predicated store per key. The caller
// sizes the list for every qualifying key (the histogram counts them exactly); should a
// thread's slots not fit anyway, it writes none of them (they stay counted).
template <int kWords>
__device__ __forceinline__ void collect_at_or_above(const uint32_t* keys, uint32_t n, uint32_t thr,
                                                    unsigned long long* list, int* count, int cap) {
  const uint32_t n4 = (n + 3u) / 4u, lane = threadIdx.x & 31u;
  for (uint32_t w0 = threadIdx.x - lane; w0 < n4; w0 += kWords * kTopkThreads) {
    uint4 v[kWords];
    load_row_words<kWords>(keys, w0, n, v);
    static_assert(kWords * 4 <= 32, "one bit per key");
    uint32_t take = 0u;  // bit 4u + j: key j of word u qualifies (one register, not 16)
#pragma unroll
    for (int u = 0; u < kWords; ++u) {
      const uint32_t w[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
#pragma unroll
      for (int j = 0; j < 4; ++j) take |= static_cast<uint32_t>(w[j] >= thr) << (4 * u + j);
    }
    const int mine = __popc(take);
    const int incl = warp_inclusive_scan(mine);
    const int total = __shfl_sync(0xffffffffu, incl, 31);
    if (total == 0) continue;  // warp-uniform
    int base = 0;
    if (lane == 31) base = atomicAdd(count, total);
    int slot = __shfl_sync(0xffffffffu, base, 31) + incl - mine;
    const bool room = slot + mine <= cap;
    // A 32-bit shared address: with a generic pointer ptxas rebuilds the shared window's
    // base for every predicated store (3 instructions a key).
    uint32_t out = static_cast<uint32_t>(__cvta_generic_to_shared(list)) + 8u * slot;
#pragma unroll
    for (int u = 0; u < kWords; ++u) {
      const uint32_t b0 = 4u * (w0 + lane + u * kTopkThreads);
      const uint32_t w[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const bool t = (take >> (4 * u + j)) & 1u;
        if (room && t)
          asm volatile("st.shared.v2.u32 [%0], {%1, %2};" ::"r"(out), "r"(0xFFFFFFFFu - (b0 + j)),
                       "r"(w[j])
                       : "memory");
        out += t ? 8u : 0u;
      }
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
// bits equal `top`. The remaining bits are resolved a digit at a time until the chosen
// digit holds exactly the composites still needed; composites are unique, so this happens
// at the latest on the last digit. The first digits are wide (53 = 11 + 10 + 4 x 8,
// 42 = 10 + 4 x 8): a threshold bin of ~1,500 keys spread over 2,048 sub-bins usually
// resolves in the first round.
// with_above: the candidates also hold every composite above the bin (the one-list route),
// which is taken too. The winners go to dst (counter sm.n_sel).
// kManyRows: the forms for a wave of more rows than SMs, whose CTAs keep every SM's issue
// slots busy, so that instructions, not a row's chain of steps, set the time: one warp
// finds each digit (find_digit_in_warp) while the others wait, and with with_above (every
// winner passes through here) the winners' bounds go to sm.winners_lo and
// sm.winners_key_max for the bucket sort. Else the block-wide search, whose chain is
// shorter: a few rows, each alone on its SM (and the filter kernel's finishing CTA, a lone
// decode row), finish sooner with it (docs/perf.md run 47).
template <bool kManyRows, class Src>
__device__ void take_from_threshold_bin(const Src& src, int known, uint32_t top, int need,
                                        TopkSmem& sm, bool with_above = false,
                                        unsigned long long* dst = nullptr) {
  const int resolved0 = 64 - known;  // bits at and above this are known
  uint64_t prefix = static_cast<uint64_t>(top) << resolved0;
  int shift = resolved0;
  // Ends at the latest on the last digit (shift 0), where composites are unique; the
  // bound also keeps a corrupted workspace from hanging the kernel.
  while (shift > 0) {
    const int width = shift % 8 == 0 ? 8 : min(kTopBits, 8 + shift % 8);
    const int next = shift - width;
    const uint32_t mask = (1u << width) - 1u;
    for (int i = threadIdx.x; i < kTopBins; i += kTopkThreads) sm.hist[i] = 0u;
    if (threadIdx.x == 0) sm.winners_key_max = 0u;
    __syncthreads();
    src.each([&](uint64_t v) {
      if (v != 0ull && (v >> shift) == (prefix >> shift))
        atomicAdd(&sm.hist[static_cast<uint32_t>(v >> next) & mask], 1u);
    });
    __syncthreads();
    find_topk_digit<kManyRows>(sm, need);
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
  // (v >> shift) >= (prefix >> shift) holds for every composite above the bin (its top bits
  // exceed top, prefix's top bits), so with_above only drops the in-bin test.
  unsigned long long* out = dst ? dst : sm.sel();
  uint32_t key_max = 0u;  // of the winners this thread takes
  src.each([&](uint64_t v) {
    const bool take =
        v != 0ull && (with_above || (v >> resolved0) == top) && (v >> shift) >= (prefix >> shift);
    warp_append<kTopkMaxBlocks>(out, &sm.n_sel, take, v);
    const uint32_t key = static_cast<uint32_t>(v >> 32);
    key_max = take && key > key_max ? key : key_max;
  });
#if !(defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800)  // kTopkSm80Forms (a warp reduction)
  if (kManyRows && with_above) {
    key_max = __reduce_max_sync(0xffffffffu, key_max);
    if ((threadIdx.x & 31) == 0 && key_max != 0u) atomicMax(&sm.winners_key_max, key_max);
    if (threadIdx.x == 0) sm.winners_lo = (prefix >> shift) << shift;  // shift < 64 here
  }
#else
  (void)key_max;
#endif
  __syncthreads();
}

// Fills sm.sel (returned) or, on the one-list route, sm.win (returned) with the row's top
// composites (unsorted) by passes over its keys, given the row's top-bits histogram in
// sm.hist and the threshold bin `top` of which `need` keys are taken. sm.n_sel and
// sm.n_cand start at 0. kManyRows: as take_from_threshold_bin's; bounded: the winners'
// bounds are in sm.winners_lo and sm.winners_key_max (the one-list route of the one-CTA
// form on SM80 and up).
template <bool kManyRows>
__device__ unsigned long long* select_by_passes(const uint32_t* keys, int64_t n, uint32_t top,
                                                int need, TopkSmem& sm, bool& bounded) {
  const int in_bin = static_cast<int>(sm.hist[top]);
  const bool fits = in_bin <= kCandidateCap;
  if (fits) {
    // One list of every key at or above the bin (K - need <= kTopkMaxBlocks above it, in_bin
    // in it: sm.list holds them), then the radix select over it, winners to sm.win.
    const uint32_t thr = top == 0u ? 1u : top << (32 - kTopBits);
    collect_at_or_above<kLoadsInFlight>(keys, static_cast<uint32_t>(n), thr, sm.list, &sm.n_cand,
                                        kTopkMaxBlocks + kCandidateCap);
    __syncthreads();
    const int listed = min(sm.n_cand, kTopkMaxBlocks + kCandidateCap);
    take_from_threshold_bin<kManyRows>(SharedCandidates{sm.list, listed}, kTopBits, top, need, sm,
                                       true, sm.win);
    bounded = kManyRows && kTopkSm80Forms;
    return sm.win;
  }
  // Too many equal top bits (thousands of near-equal scores): narrow the bin by the next
  // 11 bits (one more pass), then take every key above the narrower bin (those above the
  // first bin among them: their top 22 bits exceed top2 too, so a pass that took them
  // earlier listed them twice, and the sort of the duplicates left winners' slots unset)
  // and gather the narrower bin where it fits.
  // Every thread has read in_bin (and so taken this path) before the histogram is cleared:
  // without this barrier a fast warp's clear made a slow one read 0, take the other path
  // and pair the two paths' barriers (compute-sanitizer racecheck, docs/perf.md run 45).
  __syncthreads();
  for (int i = threadIdx.x; i < kTopBins; i += kTopkThreads) sm.hist[i] = 0u;
  __syncthreads();
  for_each_key(keys, n, [&](int64_t, uint32_t key) {
    if (key != 0u && key >> (32 - kTopBits) == top)
      atomicAdd(&sm.hist[(key >> (32 - 2 * kTopBits)) & (kTopBins - 1)], 1u);
  });
  __syncthreads();
  find_digit<kTopBins>(sm.hist, need, sm.warp_sums, &sm.digit, &sm.need);
  const uint32_t mid = static_cast<uint32_t>(sm.digit);
  const int need2 = sm.need;
  const int in_bin2 = static_cast<int>(sm.hist[mid]);
  const bool fits2 = in_bin2 <= kCandidateCap;
  const uint32_t top2 = (top << kTopBits) | mid;
  __syncthreads();
  split_at_bin<kSplitWords>(keys, 0, n, 2 * kTopBits, top2, sm.sel(), &sm.n_sel, kTopkMaxBlocks,
                            sm.cand(), &sm.n_cand, fits2 ? kCandidateCap : 0);
  __syncthreads();
  if (fits2)
    take_from_threshold_bin<kManyRows>(SharedCandidates{sm.cand(), in_bin2}, 2 * kTopBits, top2,
                                       need2, sm);
  else
    take_from_threshold_bin<kManyRows>(WorkspaceCandidates{keys, n}, 2 * kTopBits, top2, need2, sm);
  return sm.sel();
}

// Sorts sel[0..n) (sm.sel() or sm.win; n <= kTopkMaxBlocks; composites are unique and nonzero)
// descending into sm.cand. Each warp sorts a run of 32 in registers (bitonic over lanes: no
// barriers); then an element's position is, summed over every run, how many of that run's elements
// are larger (a branch-free binary search; in its own run that is its lane). Two barriers
// instead of one per bitonic stride, and no shared-memory exchange stages.
__device__ void sort_selection_descending(TopkSmem& sm, unsigned long long* sel, int n) {
  constexpr int kSlots = kTopkMaxBlocks / kTopkThreads;
  const int lane = threadIdx.x & 31;
  const int n_runs = (n + 31) / 32;
  unsigned long long v[kSlots];
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    const int i = s * kTopkThreads + static_cast<int>(threadIdx.x);
    v[s] = i < n ? sel[i] : 0ull;                   // 0 pads the last run (below every composite)
    if (s * kTopkThreads >= n_runs * 32) continue;  // block-uniform
#pragma unroll
    for (int size = 2; size <= 32; size <<= 1) {
#pragma unroll
      for (int st = size >> 1; st > 0; st >>= 1) {
        const unsigned long long o = __shfl_xor_sync(0xffffffffu, v[s], st);
        const bool keep_max = ((lane & size) == 0) == ((lane & st) == 0);
        v[s] = keep_max ? (v[s] > o ? v[s] : o) : (v[s] < o ? v[s] : o);
      }
    }
  }
  __syncthreads();  // every thread has read its element
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    const int i = s * kTopkThreads + static_cast<int>(threadIdx.x);
    if (i < n_runs * 32) sel[i] = v[s];
  }
  __syncthreads();
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    const int i = s * kTopkThreads + static_cast<int>(threadIdx.x);
    if (i >= n) continue;
    int rank = 0;
#pragma unroll 4
    for (int r = 0; r < n_runs; ++r) {
      const unsigned long long* run = sel + 32 * r;
      int cnt = 0;
#pragma unroll
      for (int st = 16; st > 0; st >>= 1) cnt += run[cnt + st - 1] > v[s] ? st : 0;
      rank += cnt + (run[31] > v[s] ? 1 : 0);
    }
    sm.cand()[rank] = v[s];
  }
  __syncthreads();
}

// Sorts sel[0..n) (as sort_selection_descending) into sm.cand: by buckets where asked and
// built (bucket_sort.cuh; it declines for crowded buckets), else by runs. Below SM80 by runs
// alone: the SM70 tier never asks, and the filter kernel's sm_70 build stays within its
// register cap. bounded: sm.winners_lo and sm.winners_key_max bound the winners
// (select_by_passes), so the bucket sort skips its block-wide min and max.
__device__ void sort_winners(TopkSmem& sm, unsigned long long* sel, int n, bool by_buckets,
                             bool bounded) {
#if !(defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800)
  if (by_buckets) {
    constexpr int kSlots = kTopkMaxBlocks / kTopkThreads;
    unsigned long long v[kSlots];
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      const int i = s * kTopkThreads + static_cast<int>(threadIdx.x);
      v[s] = i < n ? sel[i] : 0ull;
    }
    // The bucket counts go to cand past the sorted winners (free: the threshold bin is
    // resolved by now).
    uint32_t* buckets = reinterpret_cast<uint32_t*>(sm.cand() + kTopkMaxBlocks);
    if (bounded ? sort_descending_by_buckets_in<kTopkThreads, kSlots>(
                      v, n, sm.winners_lo,
                      (static_cast<unsigned long long>(sm.winners_key_max) << 32) | 0xFFFFFFFFull,
                      buckets, sel, sm.warp_sums, sm.cand())
                : sort_descending_by_buckets<kTopkThreads, kSlots>(v, n, buckets, sel, sm.range,
                                                                   sm.warp_sums, sm.cand()))
      return;
  }
#else
  (void)by_buckets;
  (void)bounded;
#endif
  sort_selection_descending(sm, sel, n);
}

// Sorts the row's K winners and writes its top-k row: the chosen blocks' tokens, then the
// open group's tail, then -1.
__device__ void sort_and_expand(const SelectParams& p, int row, int pos, int K, TopkSmem& sm,
                                unsigned long long* sel, bool by_buckets, bool bounded = false) {
  sort_winners(sm, sel, K, by_buckets, bounded);
  int32_t* out = p.topk + static_cast<int64_t>(row) * p.topk_stride;
  // A shift for a power-of-two ratio (the reference model's 4): an integer division per
  // output was a tenth of the top-k's instructions (docs/perf.md run 42).
  const int ratio_shift = ratio_shift_of(p.ratio);
  const int tail_start = blocks_through(pos, p.ratio, ratio_shift) * p.ratio;
  const int tail = pos + 1 - tail_start;
  for (int j = threadIdx.x; j < p.topk_width; j += kTopkThreads) {
    int32_t v = -1;
    if (j < K * p.ratio) {
      const int q = ratio_shift >= 0 ? j >> ratio_shift : j / p.ratio;
      const uint32_t b = composite_block(sm.cand()[q]);
      v = static_cast<int32_t>(b) * p.ratio + (j - q * p.ratio);
    } else if (j < K * p.ratio + tail) {
      v = tail_start + (j - K * p.ratio);
    }
    out[j] = v;
  }
}

// The whole top-k of one row in one CTA. hist_ready: the scoring kernel built the row's
// histogram (read here, and left zero for the next call); else one pass builds it.
// kManyRows: take_from_threshold_bin's (the filter kernel's fallback for an overfull bin
// keeps the block-wide forms, whose code fits its registers).
template <bool kManyRows>
__device__ void topk_row_in_one_cta(const SelectParams& p, int row, int pos, int64_t n,
                                    const WaveRow& w, bool hist_ready, bool bucket_sort,
                                    TopkSmem& sm) {
  if (hist_ready) {
    for (int i = threadIdx.x; i < kTopBins; i += kTopkThreads) {
      const uint32_t c = __ldcg(w.hist + i);
      sm.hist[i] = c;
      if (c) w.hist[i] = 0u;
    }
  } else {  // the multi-row scoring kernel builds no histogram
    for (int i = threadIdx.x; i < kTopBins; i += kTopkThreads) sm.hist[i] = 0u;
    __syncthreads();
    build_top_hist(w.keys, static_cast<uint32_t>(n), sm.hist);
  }
  __syncthreads();
  const int K = find_topk_digit<kManyRows>(sm, p.topk_blocks);
  unsigned long long* sel = sm.sel();
  bool bounded = false;
  if (K > 0)
    sel = select_by_passes<kManyRows>(w.keys, n, static_cast<uint32_t>(sm.digit), sm.need, sm,
                                      bounded);
  sort_and_expand(p, row, pos, K, sm, sel, bucket_sort, bounded);
}

// The head of both top-k kernels for their row: waits for the wave's scores (before any
// global access, as dependent_launch.cuh asks: the top-k grid is scheduled only as the
// scoring grid drains, so the metadata loads gain little by going first), clears the
// CTA's list counts, reads the row's position, visible keys and workspace. False: the row
// is beyond this batch (graph replay), and the CTA returns.
__device__ __forceinline__ bool begin_topk_row(const SelectParams& p, int row0, int wave_rows,
                                               int64_t ws_stride, int row, TopkSmem& sm, int& pos,
                                               int64_t& n, WaveRow& w) {
  wait_for_predecessors();  // the scores of this wave are complete and visible
  allow_dependents();       // the attention's CTAs may take free SMs while this one sorts
  if (threadIdx.x == 0) sm.n_sel = sm.n_cand = 0;
  if (row >= p.meta.header->num_rows) return false;
  pos = p.meta.row_pos[row];
  n = min(static_cast<int64_t>(blocks_through(pos, p.ratio, ratio_shift_of(p.ratio))),
          p.max_blocks);
  w = wave_row(p.score_workspace, wave_rows, ws_stride, row - row0);
  return true;
}

// One CTA per row: the route for rows whose scores come from the multi-row kernel (no
// histogram yet) and for waves with a row per SM or more. kCtasPerSm: 3 for rows of at most
// kTopkThreeCtasMaxKeys keys (40 registers, 60-92 bytes spilled on sm_90a, at phase
// boundaries), 2 for longer ones: a row's time is a chain of barriers and dependent
// shared-memory steps (Nsight Compute, docs/perf.md run 37), so more rows in flight per SM
// hide more of it, but at 32K keys a row the third CTA cost more than it hid (H200, run 39:
// the prefill top-k of 8192 rows at 32K -7%, at 128K +4.5%; decode rows within 1%).
// kManyRows: take_from_threshold_bin's, for waves of more rows than SMs.
// bucket_sort: sort the winners by buckets (sort_winners).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
// Code below SM80 keeps 2 CTAs per SM whatever the template says: for sm_70 (the SM70
// tier, which the host never gives 3 anyway) 3 spilled 164 bytes with CUDA 12.9, and the
// sm70 check assembles this kernel from compute_75 PTX, so the guard covers SM75 too
// (unmeasured there).
#define QSAKV_TOPK_CTAS_PER_SM(n) 2
#else
#define QSAKV_TOPK_CTAS_PER_SM(n) (n)
#endif
template <int kCtasPerSm, bool kManyRows>
__global__ void __launch_bounds__(kTopkThreads, QSAKV_TOPK_CTAS_PER_SM(kCtasPerSm))
    select_topk_kernel(const SelectParams p, int row0, int wave_rows, int64_t ws_stride,
                       bool hist_ready, bool bucket_sort) {
  __shared__ TopkSmem sm;
  const int row = row0 + static_cast<int>(blockIdx.x);
  int pos;
  int64_t n;
  WaveRow w;
  if (!begin_topk_row(p, row0, wave_rows, ws_stride, row, sm, pos, n, w)) return;
  topk_row_in_one_cta<kManyRows>(p, row, pos, n, w, hist_ready, bucket_sort, sm);
}

// Many CTAs per row (grid: key chunks of kFilterKeys, rows), for rows the one-row scoring
// kernel scored (histogram ready). Each CTA finds the threshold bin from the histogram,
// sends its chunk's keys above the bin and in the bin to the row's lists in the
// workspace, and takes a ticket; the last CTA of the row finishes it: radix select over
// the bin's keys in shared memory, sort, expand, and the row's state cleared for the
// next call. One long row thus filters on many SMs, and a single CTA does only the short
// remainder. A bin too large for its list takes the one-CTA route. The host launches
// this kernel only for waves of at most kFilterMaxRows rows, so every row has lists.
// kBucketSort: the finishing CTA sorts by buckets (the automatic choice: on an H200 0.3-0.5
// us faster on one decode row at 128K than by runs, although the instance spills 8 bytes
// at its 64-register cap on sm_90a; docs/perf.md run 44), else by runs
// (QSAKV_SELECT_SORT=runs). A template argument so that the runs instance holds no
// bucket-sort code.
template <bool kBucketSort>
__global__ void __launch_bounds__(kTopkThreads, 2)
    select_filter_kernel(const SelectParams p, int row0, int wave_rows, int64_t ws_stride) {
  constexpr int kWords = kFilterKeys / 4 / kTopkThreads;  // one batch covers the chunk
  constexpr int kAboveSlots = kTopkMaxBlocks / kTopkThreads;
  static_assert(kTopkMaxBlocks % kTopkThreads == 0, "the above list in whole slots");
  static_assert(kBinSlots * kTopkThreads <= kCandidateCap, "early bin loads inside the list");
  __shared__ TopkSmem sm;
  const int row = row0 + static_cast<int>(blockIdx.y);
  const int tid = threadIdx.x;
  wait_for_predecessors();  // the scores of this wave are complete and visible
  allow_dependents();
  if (tid == 0) sm.n_sel = sm.n_cand = 0;
  // The head in two round trips instead of three (a decode row's top-k is a chain of
  // them). First the batch's row count, the row's position (the plan's row arrays have
  // max_rows entries and row < max_rows by the grid, so it is read before the row is
  // known to be in the batch) and the row's histogram (8 KB that the row's CTAs share in
  // L2); then, for rows of the batch only, the chunk's keys, bounded by the row's
  // workspace rather than by its visible keys so that they need not wait for the position
  // (split() masks blocks past n). The grid covers the plan's max_rows rows: loading the
  // keys before the row count is known would read 16 KB per CTA of every row beyond the
  // batch.
  const int num_rows = p.meta.header->num_rows;
  const int pos = p.meta.row_pos[row];
  const WaveRow w = wave_row(p.score_workspace, wave_rows, ws_stride, row - row0);
  uint32_t bins[bins_per_thread<kTopBins>()];
  load_bins<kTopBins>(w.hist, bins);
  if (row >= num_rows) return;  // beyond this batch (a smaller batch, or graph replay)
  const int64_t b0 = static_cast<int64_t>(blockIdx.x) * kFilterKeys;
  KeyWords<kWords> chunk;
  chunk.load(w.keys, static_cast<uint32_t>(b0 / 4) + (tid & ~31),
             static_cast<uint32_t>(min(ws_stride, b0 + kFilterKeys) / 4));
  const int64_t n = min(static_cast<int64_t>((pos + 1) / p.ratio), p.max_blocks);
  const int64_t b1 = min(n, b0 + kFilterKeys);
  // Every CTA of the row derives the same threshold from the same histogram.
  const int K = find_digit_in<kTopBins>(bins, p.topk_blocks, sm.warp_sums, &sm.digit, &sm.need);
  const uint32_t top = static_cast<uint32_t>(sm.digit);
  const int need = sm.need;
  if (K > 0 && b0 < n)
    chunk.split(static_cast<uint32_t>(b0), static_cast<uint32_t>(b1), kTopBits, top, w.above,
                &w.state->n_above, kTopkMaxBlocks, w.bin, &w.state->n_bin, kCandidateCap);
  // The CTA that finishes last (its ticket resets `done`) finishes the row.
  if (!arrive_last(&w.state->done, static_cast<int>(gridDim.x), sm.last)) return;
  // The last CTA of the row. Every other CTA has read the histogram and appended. The
  // lists' counts, the list above the bin (K - need entries whenever it is complete) and
  // the bin's first kTopkThreads * kBinSlots entries are loaded together: one round trip,
  // a second only for a longer bin. Entries past a count are stale or zero, never used.
  const int above_expected = K > 0 ? K - need : 0;
  unsigned long long above_v[kAboveSlots], bin_v[kBinSlots];
#pragma unroll
  for (int s = 0; s < kAboveSlots; ++s) {
    const int i = s * kTopkThreads + tid;
    above_v[s] = i < above_expected ? __ldcg(w.above + i) : 0ull;
  }
#pragma unroll
  for (int s = 0; s < kBinSlots; ++s) bin_v[s] = __ldcg(w.bin + s * kTopkThreads + tid);
  const int n_above = __ldcg(&w.state->n_above), n_bin = __ldcg(&w.state->n_bin);
  // Composites are unique, so the lists hold exactly the keys above the bin (K - need of
  // them) and the bin's keys; the one-CTA route handles a bin longer than the list.
  const bool listed = K == 0 || (n_bin <= kCandidateCap && n_above == above_expected);
  if (listed) {
    for (int i = tid; i < kTopBins; i += kTopkThreads) w.hist[i] = 0u;  // for the next call
#pragma unroll
    for (int s = 0; s < kAboveSlots; ++s)
      if (s * kTopkThreads + tid < n_above) sm.sel()[s * kTopkThreads + tid] = above_v[s];
#pragma unroll
    for (int s = 0; s < kBinSlots; ++s)
      if (s * kTopkThreads + tid < n_bin) sm.cand()[s * kTopkThreads + tid] = bin_v[s];
    for (int i = kBinSlots * kTopkThreads + tid; i < n_bin; i += kTopkThreads)
      sm.cand()[i] = __ldcg(w.bin + i);
    if (tid == 0) sm.n_sel = n_above;
  }
  __syncthreads();
  if (tid == 0) {
    w.state->n_above = 0;
    w.state->n_bin = 0;
  }
  if (!listed) {
    topk_row_in_one_cta<false>(p, row, pos, n, w, true, kBucketSort, sm);
    return;
  }
  if (K > 0)
    take_from_threshold_bin<false>(SharedCandidates{sm.cand(), n_bin}, kTopBits, top, need, sm);
  sort_and_expand(p, row, pos, K, sm, sm.sel(), kBucketSort);
}

// The warpgroup-MMA scorer (select_score_wgmma.cuh) for this selection: available (the
// backend passes kSync where the GPU or the build lacks it), built for its shape (128-dim
// index keys, 3 or 4 heads), and chosen: forced, or automatically where it measured faster
// (kSelectWarpgroupMinRows' note): a batch whose every request fills a CTA's 32 rows, on a
// grid where the mma.sync scorer keeps its full CTAs (full_grid: the warpgroup scorer's
// CTAs do not shrink for small plans), and whose rows take several waves of the workspace
// (multi_wave) or whose wave alone gives the warpgroup scorer a CTA on every SM
// (full_wave; docs/perf.md run 48).
bool score_rows_on_warpgroups(const SelectParams& p, SelectScorerMma mma, bool full_grid,
                              bool multi_wave, bool full_wave) {
  return mma != SelectScorerMma::kSync && p.index_dim == kWgScoreDim && p.index_heads >= 3 &&
         p.index_heads <= kWgScoreHeads &&
         (mma == SelectScorerMma::kWarpgroup || (full_grid && (multi_wave || full_wave) &&
                                                 p.min_request_rows >= kSelectWarpgroupMinRows));
}

// The warpgroup scorer's grid for `rows` rows: (key ranges, row blocks).
dim3 score_rows_wgmma_grid(const SelectParams& p, int rows) {
  const int64_t chunks =
      (std::max<int64_t>(p.max_blocks, 1) + kWgScoreKeysPerCta - 1) / kWgScoreKeysPerCta;
  return dim3(static_cast<unsigned>(chunks),
              static_cast<unsigned>((rows + kWgScoreRows - 1) / kWgScoreRows));
}

template <bool kFp8>
void launch_score_rows_wgmma(const SelectParams& p, int rows, int row0, int wave, int64_t stride,
                             float inv_sqrt_dim, bool programmatic, cudaStream_t stream) {
  constexpr int smem = WgScoreSmem::kBytes;
  static std::atomic<uint64_t> ready{0};
  // The largest carveout, so that 3 CTAs of ~34 KB fit on an SM whatever the driver's
  // default (its registers allow 3; its loads bypass L1).
  prepare_kernel_smem(select_score_rows_wgmma_kernel<kFp8>, smem, true, ready);
  launch_kernel(programmatic, select_score_rows_wgmma_kernel<kFp8>, score_rows_wgmma_grid(p, rows),
                kWgScoreThreads, smem, stream, p, row0, wave, stride, inv_sqrt_dim);
}

// Launches the multi-row scoring kernel for the shapes it is instantiated for (128-dim
// index keys with up to 8 heads, the reference geometry; 64 dims with 3-4 heads); false
// for other shapes, which take the one-row route (same scores, more key reads).
template <bool kFp8>
bool launch_score_rows(const SelectParams& p, SelectScorerMma mma, int64_t chunks, int rows,
                       int row0, int wave, int64_t stride, int tiles_per_cta, float inv_sqrt_dim,
                       int sm_count, bool programmatic, cudaStream_t stream) {
  const dim3 wg_grid = score_rows_wgmma_grid(p, std::min(p.batch_rows, wave));
  if (score_rows_on_warpgroups(p, mma, tiles_per_cta == kScoreRowsMaxTilesPerCta,
                               p.batch_rows > wave, int64_t{wg_grid.x} * wg_grid.y >= sm_count)) {
    launch_score_rows_wgmma<kFp8>(p, rows, row0, wave, stride, inv_sqrt_dim, programmatic, stream);
    return true;
  }
  const dim3 grid(static_cast<unsigned>(chunks),
                  static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock));
  const int hp = p.index_heads <= 2 ? 2 : p.index_heads <= 4 ? 4 : 8;
  decltype(&select_score_rows_kernel<128, 2, kFp8>) kernel = nullptr;
  if (p.index_dim == 128)
    kernel = hp == 2   ? select_score_rows_kernel<128, 2, kFp8>
             : hp == 4 ? select_score_rows_kernel<128, 4, kFp8>
                       : select_score_rows_kernel<128, 8, kFp8>;
  else if (p.index_dim == 64 && hp == 4)
    kernel = select_score_rows_kernel<64, 4, kFp8>;
  if (!kernel) return false;
  launch_kernel(programmatic, kernel, grid, kScoreWarps * 32, 0, stream, p, row0, wave, stride,
                tiles_per_cta, inv_sqrt_dim);
  return true;
}

template <bool kFp8>
void launch_score_one_row(const SelectParams& p, int64_t chunks, int rows, int row0, int wave,
                          int64_t stride, int tiles_per_cta, float inv_sqrt_dim, bool programmatic,
                          cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(chunks), static_cast<unsigned>(rows));
  const auto kernel = p.index_dim == 64    ? select_score_kernel<64, kFp8>
                      : p.index_dim == 128 ? select_score_kernel<128, kFp8>
                                           : select_score_kernel<256, kFp8>;
  launch_kernel(programmatic, kernel, grid, kScoreWarps * 32, 0, stream, p, row0, wave, stride,
                tiles_per_cta, inv_sqrt_dim);
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
  return wave_workspace_bytes(select_rows_per_wave(max_rows, max_blocks),
                              workspace_stride(max_blocks));
}

bool select_supports(int index_heads, int index_dim, int topk_blocks) {
  return index_heads >= 1 && index_heads <= kScoreMaxHeads &&
         (index_dim == 64 || index_dim == 128 || index_dim == 256) && topk_blocks <= kTopkMaxBlocks;
}

bool select_warpgroup_mma_built() {
#ifdef QSAKV_HAVE_SM90A
  return true;
#else
  return false;
#endif
}

void launch_select_topk(const SelectParams& p, int sm_version, int sm_count, bool programmatic,
                        SelectScorerMma scorer_mma, SelectSort sort, bool score_only,
                        cudaStream_t stream) {
  // The warpgroup scorer's code is sm_90a: nowhere else, whatever the caller asked.
  if (sm_version != kSmWarpgroupMma || !select_warpgroup_mma_built())
    scorer_mma = SelectScorerMma::kSync;
  // The SM70 tier is the V100 code path, which sorts by runs (a V100 build has no bucket
  // sort: sort_winners). The backend passes that tier, on any GPU, as kSmSimtTier: this
  // line is the one place the rule is kept.
  if (sm_version < kSmTensorCoreTier) sort = SelectSort::kRuns;
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
  // The multi-row scorer's CTAs take twice the tiles (when the plan is large enough for
  // the full count above): a CTA's start (the rows' run, queries and pages) is then paid
  // half as often. H200, perf.md run 38 (with the one-round-trip runs above): prefill
  // 8192 rows 12% less scoring time, verify 64 x 4 at 128K 4-5% less selection time, no
  // bench row slower. 32 is tile_pages' limit (a lane per tile).
  const int rows_tiles_per_cta =
      tiles_per_cta == kScoreMaxTilesPerCta ? kScoreRowsMaxTilesPerCta : tiles_per_cta;
  const int64_t rows_chunks = (tiles + rows_tiles_per_cta - 1) / rows_tiles_per_cta;
  for (int row0 = 0; row0 < p.meta.max_rows; row0 += wave) {
    const int rows = std::min(wave, p.meta.max_rows - row0);
    // The SM70 tier (sm_version < 75) scores on CUDA cores, one row at a time.
    const bool simt = sm_version < kSmTensorCoreTier;
    // Rows sharing a request: each key tile read once for all of them (where built).
    const bool fp8 = p.keys.dtype == QSAKV_DTYPE_E4M3;
    const bool multi_row =
        !simt && p.rows_share_requests &&
        (fp8 ? launch_score_rows<true>(p, scorer_mma, rows_chunks, rows, row0, wave, stride,
                                       rows_tiles_per_cta, inv_sqrt_dim, sm_count, programmatic,
                                       stream)
             : launch_score_rows<false>(p, scorer_mma, rows_chunks, rows, row0, wave, stride,
                                        rows_tiles_per_cta, inv_sqrt_dim, sm_count, programmatic,
                                        stream));
    if (simt)  // launched as on a V100 (the backend passes programmatic = false)
      launch_score_simt(p, chunks, rows, row0, wave, stride, tiles_per_cta * kScoreTileKeys,
                        inv_sqrt_dim, stream);
    else if (!multi_row && fp8)
      launch_score_one_row<true>(p, chunks, rows, row0, wave, stride, tiles_per_cta, inv_sqrt_dim,
                                 programmatic, stream);
    else if (!multi_row)
      launch_score_one_row<false>(p, chunks, rows, row0, wave, stride, tiles_per_cta, inv_sqrt_dim,
                                  programmatic, stream);
    if (score_only) continue;
    // Programmatic dependent launch: the top-k grid is scheduled while the scoring grid
    // drains; it waits in wait_for_predecessors() for the scores.
    // Many CTAs per row only while one CTA per row would leave SMs idle: with a row per
    // SM or more, the extra per-CTA threshold search and list traffic cost more than the
    // spread gains (H200: 64 rows at 128K equal, 256 rows 6% slower with the filter).
    // One CTA per row builds the histogram itself when the multi-row kernel scored.
    if (multi_row || rows > std::min(sm_count, kFilterMaxRows)) {
      // More rows than SMs: the rows' CTAs share the SMs and their instructions set the
      // time (take_from_threshold_bin's kManyRows). H100, perf.md run 47: waves of 256-8,192
      // rows up to 6% less top-k time that way (none at 8,192 x 128K); 16-96 rows ~1 us
      // (5%) more, hence the rule.
      const bool many = !simt && rows > sm_count;
      const bool three = p.max_blocks <= kTopkThreeCtasMaxKeys && !simt;
      const auto kernel = three
                              ? (many ? select_topk_kernel<3, true> : select_topk_kernel<3, false>)
                              : (many ? select_topk_kernel<2, true> : select_topk_kernel<2, false>);
      launch_kernel(programmatic, kernel, dim3(static_cast<unsigned>(rows)), kTopkThreads, 0,
                    stream, p, row0, wave, stride, !multi_row, sort != SelectSort::kRuns);
    } else {  // many CTAs per row filter, the last one of each row finishes it
      const int64_t filter_chunks =
          (std::max<int64_t>(p.max_blocks, 1) + kFilterKeys - 1) / kFilterKeys;
      launch_kernel(
          programmatic,
          sort != SelectSort::kRuns ? select_filter_kernel<true> : select_filter_kernel<false>,
          dim3(static_cast<unsigned>(filter_chunks), static_cast<unsigned>(rows)), kTopkThreads, 0,
          stream, p, row0, wave, stride);
    }
  }
}

}  // namespace cuda
}  // namespace qsakv
