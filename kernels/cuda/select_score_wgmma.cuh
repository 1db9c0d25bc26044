// SPDX-License-Identifier: Apache-2.0
// The multi-row scorer on Hopper's warpgroup MMAs (sm_90a code, launched on SM 9.0 GPUs
// only): 128-dim index keys, 3 or 4 index heads (the reference geometry). Other shapes and
// GPUs keep select_score_rows_kernel (mma.sync), which gives the same bits.
//
// One warpgroup per CTA scores 64-key tiles for 32 rows of one request at a time, in two
// halves of 16 rows:
//   D[64 keys x 64 (head, row) columns] = K[64 x 128 dims] Q^T, m64n64k16, 8 k-steps each.
// The keys are A, in registers: warp w loads keys 16w .. 16w + 15 of the tile exactly as
// select_score_rows_kernel's warps load a 16-key tile (KeyFrags, straight from global
// memory, E4M3 codes bitcast to FP16 in registers), because a warpgroup MMA's A fragment
// per warp is mma.sync's. The queries are B, staged once per run in shared memory (K-major,
// 128-byte swizzled, wgmma.cuh's layout) with the mma.sync scorers' dimension permutation,
// so each k-step holds the dims that the mma.sync scorers' k-step holds in the same
// columns, and each (row, key) dot product is the same 8-step FP32 accumulation from zero,
// which the warpgroup MMA computes to the same bits as mma.sync (measured on an H200 with
// both operands in shared memory, docs/perf.md runs 37-38, and in this form, A from
// registers: tools/mma_bits.cu's kinds 5-6, run 39; in this kernel's m64n64 form, whose
// first k-step overwrites the accumulators instead of adding to zeros, the output digests
// of every route, forced scorers included, equal the m64n128 form's: run 48). The
// accumulator layout per warp is
// mma.sync's (warp w: keys 16w + g and 16w + g + 8; lane t4 of a quad: columns 2 t4 and
// 2 t4 + 1 of each 8-column n-tile), and the columns are ordered head-major within a half
// (column 16 h + r: head h of the half's row r), so n-tiles 2h + p hold head h of rows
// 8p .. 8p + 7, and a lane holds all four heads of its rows 8p + 2 t4 (+1) for both its
// keys: the head sum is the mma.sync scorers' ((h0 + h1) + (h2 + h3), in its order)
// without a shuffle, and every lane stores four scores of each n-tile pair. The two halves
// are separate commit groups, so the first half's epilogue runs while the second half's
// MMAs do.
//
// No key tile goes through shared memory, and the next tile's key loads are issued before
// this tile's MMAs, so they arrive while the MMAs and the epilogue run. (A first version
// staged the keys in shared memory and ran load, convert, barrier, MMA and epilogue in
// sequence: 20% of issue slots busy, slower than mma.sync; docs/perf.md run 38.)
#pragma once

#include <stdint.h>

#include "cuda/common.cuh"
#include "cuda/dependent_launch.cuh"
#include "cuda/select_score.cuh"
#include "cuda/smem_tile.cuh"
#include "cuda/wgmma.cuh"
#include "params.hpp"

namespace qsakv {
namespace cuda {

constexpr int kWgScoreRows = 32;        // rows of a CTA's block: N = 32 rows x 4 heads
constexpr int kWgScoreKeys = 64;        // keys of a tile: M (16 per warp)
constexpr int kWgScoreDim = 128;        // index dims: K (two 64-dim atoms)
constexpr int kWgScoreThreads = 128;    // one warpgroup
constexpr int kWgScoreTilesPerCta = 8;  // 512 keys per chunk (32 16-key subtiles: tile_pages)
// Chunks of 512 keys a CTA scores, one after the other, for each run of its rows: the runs'
// queries are staged once for all of them (the staging is a third of a one-chunk CTA's
// loads). docs/perf.md run 46, against 1 chunk: 2 take 5-6% off the scoring at 8,192 rows x
// 32K and 9-13% at 128K (H100 and H200); 4 are slower than 1 at 32K (H100). Only batches of
// several waves take this scorer: on one-wave batches (forced) 2 chunks are slower.
constexpr int kWgScoreChunksPerCta = 2;
constexpr int64_t kWgScoreKeysPerCta =
    int64_t{kWgScoreChunksPerCta} * kWgScoreTilesPerCta * kWgScoreKeys;
constexpr int kWgScoreHeads = 4;      // (row, head) columns per row
constexpr int kWgScoreCtasPerSm = 3;  // by its registers (~166 a thread)
// The automatic choice takes this scorer only for batches whose rows take more than one
// wave of the workspace (select_rows_per_wave: 4,096 rows at 32K, 1,024 at 128K) and whose
// every request has a CTA's full 32 rows or more. H200, docs/perf.md run 39, every
// selection bench row against both forced scorers: 8,192 prefill rows (2 waves at 32K, 8
// at 128K) 2-12% less selection time; one wave (2,048 rows at 32K, 2 x 512 at 8K, 8 x 32
// at 32K) equal or up to 14% slower; requests of 16 rows (two runs per CTA) 33-75% slower,
// of 8-12 rows ~1.6-2.2x. Since run 48's faster epilogue it also takes a one-wave batch
// whose grid has a CTA on every SM: one-request chunks of 1,024-4,096 rows (256-1,024
// CTAs) measured 0-15% faster with it on an H100, and 1,024 rows at 32K 15% (E4M3 keys)
// and 12% (FP16) less selection time on an H200 (run 49); the bench's one-wave grids of 64
// CTAs (2 x 512 rows at 8K, 8 x 32 at 32K) 13-17% slower, so they stay on mma.sync.
constexpr int kSelectWarpgroupMinRows = kWgScoreRows;

// Dynamic shared memory, byte offsets from a 1024-byte boundary (atoms start on one).
struct WgScoreSmem {
  static constexpr int kQ = 0;  // 128 columns x 256 bytes: 2 atoms of 16 KB
  static constexpr int kRowN = kQ + kWgScoreRows * kWgScoreHeads * kWgScoreDim * 2;  // int per row
  static constexpr int kEnd = kRowN + kWgScoreRows * 4;
  static constexpr int kBytes = kEnd + 1024;  // + the slack for the alignment
};

// The 8 chunks (16 bytes, 4 words) of one 64-dim half of a row as the operand stores them,
// from the half's 32 words of FP16 pairs in dim order (w[i] = dims 2i, 2i + 1): chunk q's
// word t is the pair that select_score.cuh's permutation puts in k-step column 2t + 8 (q % 2)
// of the half's k-step q / 2. FP16 keys permute within 32 dims (16 words: src 4t + q of
// each group of 4 chunks), E4M3 within 64 (32 words: src 8t + q).
template <bool kFp8>
__device__ __forceinline__ void permute_half(const uint32_t (&w)[32], uint4 (&chunk)[8]) {
#pragma unroll
  for (int c = 0; c < 8; ++c) {
    uint32_t v[4];
#pragma unroll
    for (int t = 0; t < 4; ++t) v[t] = kFp8 ? w[8 * t + c] : w[16 * (c >> 2) + 4 * t + (c & 3)];
    chunk[c] = make_uint4(v[0], v[1], v[2], v[3]);
  }
}

// Stores the 8 chunks of half h of operand row `row` (of `rows`) into the atom-major tile.
__device__ __forceinline__ void store_half(uint8_t* tile, int rows, int row, int h,
                                           const uint4 (&chunk)[8]) {
#pragma unroll
  for (int c = 0; c < 8; ++c)
    *reinterpret_cast<uint4*>(tile + sw128_offset(rows, row, 8 * h + c)) = chunk[c];
}

// 64 FP16 values (128 bytes at src, 16-byte aligned; nullptr: zeros) as 32 words.
__device__ __forceinline__ void load_half_fp16(const char* src, uint32_t (&w)[32]) {
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint4 v = src ? ld_stream16(src + 16 * i) : make_uint4(0u, 0u, 0u, 0u);
    w[4 * i] = v.x;
    w[4 * i + 1] = v.y;
    w[4 * i + 2] = v.z;
    w[4 * i + 3] = v.w;
  }
}

// A warp's 16 keys of a 64-key tile (keys g and g + 8 of its quad rows), loaded into
// registers, and what the epilogue needs of the lane's own key (the pair's g or g + 8).
template <bool kFp8>
struct WgKeyTile {
  KeyFrags<kWgScoreDim, kFp8> k;
  // E4M3: keys g and g + 8's scales as loaded, 2^-8 where a key has none; the factor is
  // this x 2^8 (= key_score_factor's, bit for bit), multiplied where it is used so that the
  // scale's load is not waited for when the tile is loaded.
  float scale[2];
  uint32_t mask[2];  // ~0: the key is visible and mapped; 0: its score key is 0
};

// Stores v at p where key < n, as one predicated store (a C++ `if` became a branch per
// store: docs/perf.md run 48).
__device__ __forceinline__ void store_score_if(uint32_t* p, uint32_t key, uint32_t n, uint32_t v) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.lt.u32 p, %0, %1;\n@p st.global.u32 [%2], %3;\n}\n" ::"r"(key),
      "r"(n), "l"(p), "r"(v));
}

// Rows of one request scored together on warpgroup MMAs. Grid: (key ranges of
// kWgScoreKeysPerCta, blocks of kWgScoreRows rows). A block's rows are split into runs of
// one request each, as in select_score_rows_kernel; a run's queries are staged once in
// shared memory, then each key tile of the range's chunks is loaded into registers and
// scored for all of them.
template <bool kFp8>
__global__ void __launch_bounds__(kWgScoreThreads, kWgScoreCtasPerSm)
    select_score_rows_wgmma_kernel(const SelectParams p, int row0, int wave_rows, int64_t ws_stride,
                                   float inv_sqrt_dim) {
#if !QSAKV_WGMMA
  (void)p, (void)row0, (void)wave_rows, (void)ws_stride, (void)inv_sqrt_dim;
  __trap();  // sm_90a code only (the host launches it on SM 9.0 GPUs alone)
#else
  using L = WgScoreSmem;
  constexpr int D = kWgScoreDim;
  constexpr int kSubTiles = kWgScoreTilesPerCta * (kWgScoreKeys / kScoreTileKeys);
  static_assert(kSubTiles <= 32, "tile_pages: a lane per 16-key subtile");
  extern __shared__ uint4 wg_score_smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>(wg_score_smem_raw);
  smem += (1024u - (smem_addr(smem) & 1023u)) & 1023u;  // kBytes has the slack
  uint8_t* const q_tile = smem + L::kQ;
  int* const row_n = reinterpret_cast<int*>(smem + L::kRowN);

  wait_for_predecessors();  // the compressed keys, the workspace's last reader
  const int num_rows = p.meta.header->num_rows;
  const int r_first = row0 + static_cast<int>(blockIdx.y) * kWgScoreRows;
  const int r_last = min(min(r_first + kWgScoreRows, row0 + wave_rows), num_rows);  // exclusive
  const int64_t cta_first = static_cast<int64_t>(blockIdx.x) * kWgScoreKeysPerCta;
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  static_assert(kWgScoreRows <= 32, "a lane per row");
  const BlockRuns block(p.meta, r_first, r_last, lane);
  for (int r_begin = r_first; r_begin < r_last;) {
    const int first = r_begin - r_first;
    const BlockRuns::Run run = block.run_at(first, lane, p.ratio, p.max_blocks);
    const int req = run.req, r_end = r_first + run.end, n_run = r_end - r_begin;
    const int64_t n_max = run.n_max;
    if (cta_first < n_max) {  // block-uniform
      __syncthreads();        // the previous run's MMAs and epilogue are done with q_tile and row_n
      {
        // The run's queries, column n = 64 x half + 16 x head + row of the half (zeros past
        // the run's rows and heads): thread t stages dims 64 u .. 64 u + 63 of column t.
        static_assert(kWgScoreRows * kWgScoreHeads == kWgScoreThreads, "a column per thread");
        static_assert(kWgScoreRows == 32 && kWgScoreHeads == 4, "two halves of 16 rows x 4 heads");
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          const int n = tid, h = u;
          const int row = 16 * (n >> 6) + (n & 15), head = (n >> 4) & 3;
          const char* src =
              row < n_run && head < p.index_heads
                  ? reinterpret_cast<const char*>(
                        p.index_q +
                        (static_cast<int64_t>(r_begin + row) * p.index_heads + head) * D + 64 * h)
                  : nullptr;
          uint32_t w[32];
          load_half_fp16(src, w);
          uint4 chunk[8];
          permute_half<kFp8>(w, chunk);
          store_half(q_tile, kWgScoreRows * kWgScoreHeads, n, h, chunk);
        }
        // Thread t < kWgScoreRows (warp 0) takes row r_begin + t's position from its lane.
        const int pos = block.pos_of(min(first + lane, 31));
        if (tid < kWgScoreRows)
          row_n[tid] =
              tid < n_run
                  ? static_cast<int>(min(static_cast<int64_t>((pos + 1) / p.ratio), p.max_blocks))
                  : 0;
      }
      fence_smem_for_wgmma();  // this thread's query writes, to the MMAs' proxy
      __syncthreads();
      const int32_t* bt = p.meta.header->block_table +
                          static_cast<int64_t>(req) * p.meta.header->block_table_stride;
      for (int c = 0; c < kWgScoreChunksPerCta; ++c) {
        const int64_t cta0 =
            cta_first + static_cast<int64_t>(c) * kWgScoreTilesPerCta * kWgScoreKeys;
        if (cta0 >= n_max) break;  // block-uniform
        const TilePages pages = tile_pages(p, bt, cta0, kSubTiles, n_max, lane);
        // The lane's first row's scores (row 2 t4 of the block's run; the lane's rows are
        // 16 half + 8 p + 2 t4 + e).
        uint32_t* const ws_lane = reinterpret_cast<uint32_t*>(p.score_workspace) +
                                  static_cast<int64_t>(r_begin + 2 * t4 - row0) * ws_stride;
        const uint64_t q_desc = sw128_desc(smem_addr(q_tile), 16, 1024);
        constexpr int kQAtom = kWgScoreRows * kWgScoreHeads * 128;
        constexpr int kQHalf = kQAtom / 2;  // the second half's 64 columns, 8 KB into each atom
        // Tiles with a visible key (warpgroup-uniform: every warp takes part in each MMA;
        // a warp whose 16 keys are all past n_max loads zeros and stores nothing).
        const int n_tiles = static_cast<int>(min(static_cast<int64_t>(kWgScoreTilesPerCta),
                                                 (n_max - cta0 + kWgScoreKeys - 1) / kWgScoreKeys));
        // Key b = cta0 + 64 t + 16 w + g (and b + 8) of tile t: subtile 4 t + w of the CTA.
        const int64_t b0 = cta0 + kScoreTileKeys * warp + g;  // key g of the warp in tile 0
        // Tile t's keys into kt (loads in flight on return).
        auto load_tile = [&](WgKeyTile<kFp8>& kt, int t) {
          CompressedKeyAddress lo, hi;
          tile_key_addresses(p, bt, pages, 4 * t + warp,
                             b0 + static_cast<int64_t>(t) * kWgScoreKeys, n_max, true, lo, hi);
          load_key_runs<D, kFp8>(kt.k.lo, lo.codes, t4);
          load_key_runs<D, kFp8>(kt.k.hi, hi.codes, t4);
          kt.scale[0] = kFp8 && lo.scale ? __ldg(lo.scale) : 1.0f / 256.0f;
          kt.scale[1] = kFp8 && hi.scale ? __ldg(hi.scale) : 1.0f / 256.0f;
          kt.mask[0] = lo.codes != nullptr ? ~0u : 0u;
          kt.mask[1] = hi.codes != nullptr ? ~0u : 0u;
        };
        // The epilogue of one half's accumulators: for each of the lane's 4 rows of the
        // half and each of its 2 keys, the head sum, the scale and the store (the mma.sync
        // scorers' arithmetic, in their order). Rows past the run have row_n 0: no store.
        auto store_half_scores = [&](const float(&d)[8][4], int half, uint32_t* ws_tile,
                                     uint32_t key, const float(&f)[2], const uint32_t(&mask)[2]) {
#pragma unroll
          for (int q = 0; q < 2; ++q) {
            const int2 n = *reinterpret_cast<const int2*>(&row_n[16 * half + 8 * q + 2 * t4]);
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              uint32_t* const ws =
                  ws_tile + static_cast<int64_t>(16 * half + 8 * q + e) * ws_stride;
#pragma unroll
              for (int kh = 0; kh < 2; ++kh) {
                const int i = 2 * kh + e;
                const float sum =
                    (relu_like_reference(d[q][i]) + relu_like_reference(d[2 + q][i])) +
                    (relu_like_reference(d[4 + q][i]) + relu_like_reference(d[6 + q][i]));
                const uint32_t v = score_key(sum * inv_sqrt_dim * f[kh]) & mask[kh];
                store_score_if(ws + 8 * kh, key + 8u * kh, static_cast<uint32_t>(e ? n.y : n.x), v);
              }
            }
          }
        };
        // Scores tile t from cur, after issuing tile t + 1's loads into next: they arrive
        // while the MMAs and the epilogue run. Two buffers, alternated by the caller, so that
        // no register copies from one to the other.
        auto score_tile = [&](const WgKeyTile<kFp8>& cur, WgKeyTile<kFp8>& next, int t) {
          uint32_t a[D / 16][4];  // the A fragments, converted once (32 registers)
#pragma unroll
          for (int ks = 0; ks < D / 16; ++ks) cur.k.a_frag(ks, a[ks]);
          const float f[2] = {kFp8 ? cur.scale[0] * 256.0f : 1.0f,
                              kFp8 ? cur.scale[1] * 256.0f : 1.0f};
          const uint32_t mask[2] = {cur.mask[0], cur.mask[1]};  // (masks, not selects: no branch)
          if (t + 1 < n_tiles) load_tile(next, t + 1);          // block-uniform
          // Block indices fit in 32 bits (positions are int32).
          const uint32_t key = static_cast<uint32_t>(b0 + static_cast<int64_t>(t) * kWgScoreKeys);
          uint32_t* const ws_tile = ws_lane + key;
          auto issue_half = [&](float(&d)[8][4], int half) {
#pragma unroll
            for (int ks = 0; ks < D / 16; ++ks)
              wgmma_m64n64k16_rs_kmajor<false>(
                  d, a[ks], q_desc + ((ks >> 2) * kQAtom + half * kQHalf + (ks & 3) * 32) / 16,
                  ks > 0);
            wgmma_commit();
          };
          pin_fragments(a);
          float d0[8][4], d1[8][4];  // rows 0-15 and 16-31; the first k-step overwrites them
          wgmma_fence();
          issue_half(d0, 0);
          issue_half(d1, 1);
          wgmma_wait<1>();
          pin_accumulators(d0);
          store_half_scores(d0, 0, ws_tile, key, f, mask);
          wgmma_wait<0>();
          pin_accumulators(d1);
          pin_fragments(a);
          store_half_scores(d1, 1, ws_tile, key, f, mask);
        };
        WgKeyTile<kFp8> kt0, kt1;
        load_tile(kt0, 0);
        for (int t = 0; t < n_tiles; t += 2) {
          score_tile(kt0, kt1, t);
          if (t + 1 < n_tiles) score_tile(kt1, kt0, t + 1);  // block-uniform
        }
      }
    }
    r_begin = r_end;
  }
  // No allow_dependents(): as select_score_rows_kernel.
#endif
}

}  // namespace cuda
}  // namespace qsakv
