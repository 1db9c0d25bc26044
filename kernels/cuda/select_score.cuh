// SPDX-License-Identifier: Apache-2.0
// Indexer scoring on tensor cores: one warp scores 16 compressed keys of one row per
// MMA tile, keys as M, the row's index heads as N (up to 8), index dims as K.
//
// score(b) = sum over heads h of ReLU(q_h . k_b) / sqrt(D), FP16 inputs, FP32
// accumulation. Products of two FP16 values are exact in FP32, so the only difference
// from the CPU reference is the order of the FP32 additions (the numerics contract in
// docs/selection.md).
//
// E4M3 keys (kFp8): the codes become FP16 by a bitcast (sign to bit 15, the other seven
// bits to bits 13..7), which is exact and gives the code's value times 2^-8, so the MMA
// computes the dot products times 2^-8 exactly as it would the true ones (a power of two
// commutes with every rounding here); the score is then multiplied by the key's scale
// times 2^8, which equals the CPU's (dot sum / sqrt(D)) x scale bit for bit when the dots
// agree.
//
// Dimension permutation: a dot product does not care in which order its dims are
// visited, so each thread loads a contiguous run of dims of its key with 16-byte loads
// (the 4 threads of a key read 64 contiguous bytes per load) and the query fragments use
// the same permutation. Thread (g, t4) holds in MMA columns 2*t4, 2*t4+1 and 8 + 2*t4,
// 9 + 2*t4 of k-step ks the dims
//   FP16: 32*(ks/2) + 8*t4 + 4*(ks%2) + {0,1} and {2,3}  (a 16-byte load: 8 dims, 2 k-steps)
//   E4M3: 64*(ks/4) + 16*t4 + 4*(ks%4) + {0,1} and {2,3} (a 16-byte load: 16 dims, 4 k-steps)
// so every dim appears exactly once over the k-steps, and each k-step of an E4M3 key is
// one 32-bit word of codes.
#pragma once

#include <math_constants.h>
#include <stdint.h>

#include "cuda/common.cuh"
#include "limits.hpp"
#include "paged_address.cuh"
#include "params.hpp"
#include "cuda/mma.cuh"

namespace qsakv {
namespace cuda {

constexpr int kScoreTileKeys = 16;               // M of one MMA tile
constexpr int kScoreMaxHeads = kSelectMaxHeads;  // N of one MMA tile

// Compressed key b of a row (codes and, for E4M3, scale), or codes == nullptr when b is
// not visible or its page is unmapped (such a block is never read and never selected).
__device__ __forceinline__ CompressedKeyAddress key_address(const SelectParams& p,
                                                            const int32_t* bt, int64_t b,
                                                            int64_t n) {
  CompressedKeyAddress a = {nullptr, nullptr};
  if (b >= n) return a;
  // Key b lies on page b / keys_per_block at slot b % keys_per_block (block_size is
  // keys_per_block * ratio). b < 2^31 (positions are int32): 32-bit arithmetic, a shift
  // for the usual power-of-two page, instead of the 64-bit divisions that dominated the
  // scoring kernels' instructions.
  const uint32_t key = static_cast<uint32_t>(b);
  const int lg = p.keys.keys_per_block_log2;
  const uint32_t kpb = static_cast<uint32_t>(p.keys.keys_per_block);
  const uint32_t page = lg >= 0 ? key >> lg : key / kpb;
  const int32_t phys = __ldg(bt + page);
  if (!page_mapped(phys, p.num_blocks)) return a;
  return compressed_key_in_page(p.keys, phys, static_cast<int>(key - page * kpb));
}

// Tiles of 16 keys start at multiples of 16, so with pages of a power-of-two multiple of
// 16 keys (the reference geometry: 64-token blocks, ratio 4) each tile lies in one page.
// Then lane l of every warp looks up the page of the CTA's tile l once, before the loop
// (tiles_per_cta <= 32), and the loop takes it by a shuffle: no block-table load, and no
// load-to-load dependency, in front of each tile's key loads.
struct TilePages {
  bool active;
  int32_t lane_phys;  // the page of tile `lane` of the CTA (-1: none)
};
__device__ __forceinline__ TilePages tile_pages(const SelectParams& p, const int32_t* bt,
                                                int64_t cta0, int tiles_per_cta, int64_t n,
                                                int lane) {
  TilePages tp = {p.keys.keys_per_block_log2 >= 4, -1};
  const int64_t b = cta0 + static_cast<int64_t>(lane) * kScoreTileKeys;
  if (tp.active && lane < tiles_per_cta && b < n)
    tp.lane_phys = __ldg(bt + (static_cast<uint32_t>(b) >> p.keys.keys_per_block_log2));
  return tp;
}
// Key b of tile `tile` of the CTA: as key_address, with the tile's page from TilePages
// when active. Every lane of the warp must call it (the shuffle), with the same tile.
__device__ __forceinline__ void tile_key_addresses(const SelectParams& p, const int32_t* bt,
                                                   const TilePages& tp, int tile, int64_t b,
                                                   int64_t n, bool own, CompressedKeyAddress& lo,
                                                   CompressedKeyAddress& hi) {
  const int32_t phys = __shfl_sync(0xffffffffu, tp.lane_phys, tile & 31);
  lo = hi = CompressedKeyAddress{nullptr, nullptr};
  if (!own) return;
  if (!tp.active) {
    lo = key_address(p, bt, b, n);
    hi = key_address(p, bt, b + 8, n);
    return;
  }
  if (phys < 0 || phys >= p.num_blocks) return;
  const int slot = static_cast<int>(static_cast<uint32_t>(b) & (p.keys.keys_per_block - 1));
  if (b < n) lo = compressed_key_in_page(p.keys, phys, slot);
  if (b + 8 < n) hi = compressed_key_in_page(p.keys, phys, slot + 8);
}

// Order-preserving map of a float to uint32 (larger float -> larger key). 0 is reserved
// for "not a candidate" (blocks on unmapped pages): real keys are never 0.
__device__ __forceinline__ uint32_t score_key(float f) {
  const uint32_t b = __float_as_uint(f);
  const uint32_t k = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  return k == 0u ? 1u : k;
}

// ReLU as the CPU reference writes it (x > 0 ? x : 0): a NaN dot product counts as 0.
__device__ __forceinline__ float relu_like_reference(float x) { return x > 0.0f ? x : 0.0f; }

__device__ __forceinline__ uint32_t word(const uint4& v, int w) {
  return w == 0 ? v.x : w == 1 ? v.y : w == 2 ? v.z : v.w;
}

// Offset (in elements) of a thread's 8-dim query run i: word 2h / 2h+1 of run i feed
// k-step 2i + h (the permutation above).
template <bool kFp8>
__device__ __forceinline__ int query_run_offset(int i, int t4) {
  return kFp8 ? 64 * (i >> 1) + 16 * t4 + 8 * (i & 1) : 32 * i + 8 * t4;
}

// The query fragments (MMA B operand) of one row for a thread: head g (zero beyond the
// row's heads), D/32 runs of 8 dims.
template <int D>
struct QueryFrags {
  uint4 run[D / 32];
};

template <int D, bool kFp8>
__device__ __forceinline__ void load_query_frags(QueryFrags<D>& q, const uint16_t* row_q, int heads,
                                                 int g, int t4) {
#pragma unroll
  for (int i = 0; i < D / 32; ++i)
    q.run[i] =
        g < heads
            ? __ldg(reinterpret_cast<const uint4*>(row_q + g * D + query_run_offset<kFp8>(i, t4)))
            : make_uint4(0u, 0u, 0u, 0u);
}

// Two E4M3 codes (bytes 0, 1 or 2, 3 of w, by kPerm) as an FP16 pair of their values
// times 2^-8 (the bitcast described above).
template <uint32_t kPerm>
__device__ __forceinline__ uint32_t e4m3_pair_as_half2_scaled(uint32_t w) {
  const uint32_t v = __byte_perm(w, 0u, kPerm);  // code bytes to bits 15..8 and 31..24
  return ((v >> 1) & 0x3F803F80u) | (v & 0x80008000u);
}

// The two keys of a thread in one tile (keys g and g + 8): FP16, D/32 16-byte runs of 8
// dims each; E4M3, D/64 runs of 16 codes.
template <int D, bool kFp8>
struct KeyFrags {
  static constexpr int kRuns = kFp8 ? D / 64 : D / 32;
  uint4 lo[kRuns];  // key g
  uint4 hi[kRuns];  // key g + 8

  // A fragment of k-step ks (rows g, g+8 x columns 2*t4.., 8+2*t4..).
  __device__ __forceinline__ void a_frag(int ks, uint32_t (&a)[4]) const {
    if constexpr (kFp8) {
      const uint32_t l = word(lo[ks >> 2], ks & 3), h = word(hi[ks >> 2], ks & 3);
      a[0] = e4m3_pair_as_half2_scaled<0x1404u>(l);
      a[1] = e4m3_pair_as_half2_scaled<0x1404u>(h);
      a[2] = e4m3_pair_as_half2_scaled<0x3424u>(l);
      a[3] = e4m3_pair_as_half2_scaled<0x3424u>(h);
    } else {
      const int i = ks >> 1, w = 2 * (ks & 1);
      a[0] = word(lo[i], w);
      a[1] = word(hi[i], w);
      a[2] = word(lo[i], w + 1);
      a[3] = word(hi[i], w + 1);
    }
  }
};

// A thread's runs of one key (its bytes at `key`; nullptr: an unmapped or invisible key,
// zeros): 16-byte loads, the quad's four threads reading 64 contiguous bytes each.
template <int D, bool kFp8>
__device__ __forceinline__ void load_key_runs(uint4 (&run)[KeyFrags<D, kFp8>::kRuns],
                                              const char* key, int t4) {
  constexpr int kRuns = KeyFrags<D, kFp8>::kRuns;
  if (key) {
#pragma unroll
    for (int i = 0; i < kRuns; ++i) run[i] = ld_stream16(key + 64 * i + 16 * t4);
  } else {
#pragma unroll
    for (int i = 0; i < kRuns; ++i) run[i] = make_uint4(0u, 0u, 0u, 0u);
  }
}

// The factor a key's head sum / sqrt(D) is multiplied by: FP16 keys 1 (no multiply);
// E4M3 keys the scale times 2^8 (the bitcast's 2^-8 undone; exact).
template <bool kFp8>
__device__ __forceinline__ float key_score_factor(const float* scale) {
  return kFp8 && scale ? __ldg(scale) * 256.0f : 1.0f;
}

// Scores of the tile's keys g and g + 8, complete (all heads summed, scaled by 1/sqrt(D),
// not yet by the key's scale) in every lane of the key's quad. FP32 accumulation in a
// fixed order: the result depends on the key and the query only, never on the batch or
// the grid.
template <int D, bool kFp8>
__device__ __forceinline__ void score_tile(const KeyFrags<D, kFp8>& k, const QueryFrags<D>& q,
                                           float inv_sqrt_dim, float& s_lo, float& s_hi) {
  float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    uint32_t a[4];
    k.a_frag(ks, a);
    mma_16816<false>(c, a, word(q.run[ks >> 1], 2 * (ks & 1)),
                     word(q.run[ks >> 1], 2 * (ks & 1) + 1));
  }
  // c[0], c[1]: key g, heads 2*t4, 2*t4+1; c[2], c[3]: key g + 8. Heads beyond the row's
  // have a zero query: their dot is 0 (or NaN for a non-finite key), and ReLU gives 0.
  float lo = relu_like_reference(c[0]) + relu_like_reference(c[1]);
  float hi = relu_like_reference(c[2]) + relu_like_reference(c[3]);
  lo += __shfl_xor_sync(0xffffffffu, lo, 1);
  hi += __shfl_xor_sync(0xffffffffu, hi, 1);
  lo += __shfl_xor_sync(0xffffffffu, lo, 2);
  hi += __shfl_xor_sync(0xffffffffu, hi, 2);
  s_lo = lo * inv_sqrt_dim;
  s_hi = hi * inv_sqrt_dim;
}

// ---- Several rows of one request per MMA (verify rows, prefill chunks) ----------------
//
// The rows of one request read the same keys, so a CTA scores a key tile once for up to
// kRowsPerBlock of them: N = rows x heads, kHeadsPad columns per row (the row's heads,
// zero-padded to a power of two), 8 / kHeadsPad rows per MMA n-tile. A column's dot
// product is the same MMA k-step sequence as in score_tile, and the head sum below adds
// the same values in the same order (score_tile's extra additions add +0), so both
// routes give every (row, key) the same score bits.

constexpr int kRowsPerBlock = 16;

// The rows of a multi-row scoring CTA (at most 32 consecutive rows of the batch), split into
// runs of one request each. Lane l of every warp holds row l's request and position (-1
// past the block): one round trip for the whole block (a loop that read them row after row
// held a fifth of the scorer's stall samples, docs/perf.md run 37). Every thread of the
// block calls the members in block-uniform control flow, with the same `first` (each lane
// passes its own lane index; pos_of's row may differ by lane).
struct BlockRuns {
  int rows;      // rows in the block
  int lane_req;  // row `lane`'s request
  int lane_pos;  // row `lane`'s position

  __device__ __forceinline__ BlockRuns(const PlanMetaView& meta, int r_first, int r_last, int lane)
      : rows(r_last - r_first),
        lane_req(lane < r_last - r_first ? meta.row_request[r_first + lane] : -1),
        lane_pos(lane < r_last - r_first ? meta.row_pos[r_first + lane] : -1) {}

  // The run that starts at block row `first` (< rows): its request, its end (a block row,
  // exclusive: the first later row of another request) and the keys its rows see at most
  // (the largest position's, capped at max_blocks).
  struct Run {
    int req;
    int end;
    int64_t n_max;
  };
  __device__ __forceinline__ Run run_at(int first, int lane, int ratio, int64_t max_blocks) const {
    Run run;
    run.req = __shfl_sync(0xffffffffu, lane_req, first);
    const uint32_t other = __ballot_sync(0xffffffffu, lane < rows && lane_req != run.req) &
                           ~((2u << first) - 1u);  // lanes after `first` only
    run.end = other ? __ffs(other) - 1 : rows;
    int pos_max = lane >= first && lane < run.end ? lane_pos : -1;
#pragma unroll
    for (int s = 16; s > 0; s >>= 1)
      pos_max = max(pos_max, __shfl_xor_sync(0xffffffffu, pos_max, s));
    run.n_max = min(static_cast<int64_t>((pos_max + 1) / ratio), max_blocks);
    return run;
  }

  // Block row `row`'s position (row < 32; -1 past the block).
  __device__ __forceinline__ int pos_of(int row) const {
    return __shfl_sync(0xffffffffu, lane_pos, row);
  }
};

// Column sums of one n-tile: on return the lanes with t4 % (kHeadsPad / 2) == 0 hold the
// scores of keys g (lo) and g + 8 (hi) for row 2 * t4 / kHeadsPad of the tile.
template <int kHeadsPad>
__device__ __forceinline__ void sum_row_heads(const float (&c)[4], float inv_sqrt_dim, float& lo,
                                              float& hi) {
  lo = relu_like_reference(c[0]) + relu_like_reference(c[1]);
  hi = relu_like_reference(c[2]) + relu_like_reference(c[3]);
#pragma unroll
  for (int s = 1; s < kHeadsPad / 2; s <<= 1) {
    lo += __shfl_xor_sync(0xffffffffu, lo, s);
    hi += __shfl_xor_sync(0xffffffffu, hi, s);
  }
  lo *= inv_sqrt_dim;
  hi *= inv_sqrt_dim;
}

// sum_row_heads with the two keys split between the lanes of a pair (kHeadsPad >= 4):
// on return the lanes with t4 % (kHeadsPad / 2) < 2 hold the score of key g (t4 even) or
// g + 8 (t4 odd) for row 2 * t4 / kHeadsPad of the tile. The first exchange sends the sum
// the lane does not keep, so each lane adds its partner's partial to its own: the same
// two operands as sum_row_heads (an FP32 addition is commutative bit for bit), one
// shuffle and one addition instead of two each per level.
template <int kHeadsPad>
__device__ __forceinline__ float sum_row_heads_split(const float (&c)[4], float inv_sqrt_dim,
                                                     bool odd) {
  static_assert(kHeadsPad >= 4, "a pair of lanes per row");
  const float lo = relu_like_reference(c[0]) + relu_like_reference(c[1]);
  const float hi = relu_like_reference(c[2]) + relu_like_reference(c[3]);
  float keep = odd ? hi : lo;
  keep += __shfl_xor_sync(0xffffffffu, odd ? lo : hi, 1);
#pragma unroll
  for (int s = 2; s < kHeadsPad / 2; s <<= 1) keep += __shfl_xor_sync(0xffffffffu, keep, s);
  return keep * inv_sqrt_dim;
}

}  // namespace cuda
}  // namespace qsakv
