// SPDX-License-Identifier: Apache-2.0
// Split-K decode attention over a paged K/V cache, sparse (top-k token lists) or dense
// (causal over the block table), for any number of rows per request.
//
// One CTA of 4 warps handles (row, KV head, chunk of up to 8 query heads of its GQA
// group, split): K/V of the KV head are read once for the whole chunk. The CTA walks its
// share of the row's token list in windows: a prologue turns the window's indices into
// byte offsets of valid tokens (-1, non-causal and unmapped entries are dropped, never
// dereferenced) compacted in shared memory; then each warp takes 16-token tiles and
// keeps its own online-softmax state, and the warps merge at the end.
//
// Per tile, on tensor cores (m16n8k16, FP32 accumulation):
//   S^T[16 tokens x 8 heads] = K[16 x D] . Q^T[D x 8]      (A = K, decoded in registers)
//   O^T[D x 8 heads]        += V^T[D x 16] . P^T[16 x 8]   (A = V^T, B = P^T by movmatrix)
// With tokens as M, the GQA group only pads 6 heads to N = 8, and each thread's A
// fragments come straight from 16-byte global loads: the dot product's dimension order
// is free, so each thread owns a span of K dims (and of V/output dims), laid out so that
// the warp's loads cover whole sectors, and Q's fragments are permuted to match
// (Shape::kKSpan / kVSpan, SpanLayout and the Q prologue below).
//
// Numerics (DOMAIN.md section 3): the K scale sits in the base-2 softmax factor, the V
// scale is applied once to the normalised output (after the split merge), probabilities
// stay 16-bit for P.V, and Q.K accumulates in FP32.
#pragma once

#include <math_constants.h>
#include <stdint.h>

#include <type_traits>

#include "limits.hpp"
#include "paged_address.cuh"
#include "params.hpp"
#include "cuda/attention_inputs.cuh"
#include "cuda/block_scan.cuh"
#include "cuda/common.cuh"
#include "cuda/dependent_launch.cuh"
#include "cuda/e4m3_decode.cuh"
#include "cuda/last_arrival.cuh"
#include "cuda/mma.cuh"
#include "cuda/smem_tile.cuh"
#include "cuda/softmax_state.cuh"

namespace qsakv {
namespace cuda {

// The decode route (both kernel tiers): the common inputs, then each row's list, splits
// and merge workspace.
struct DecodeParams : AttentionInputs {
  const int32_t* row_group;  // >= 0: the row is in a group of the grouped route
  int32_t skip_grouped;      // the grouped kernels run in this launch (row_group applies)
  // A grouped row's own entries and its shared part (row_split says how many).
  const int32_t* own_lists;
  const float* shared_out;
  const float* shared_lse;
  // The ring path's window entries are K row offsets in 16-byte units, in 32 bits: 1 when
  // every row of the cache has one (0: the register path runs).
  int32_t ring_offsets;
  int32_t head_chunks;  // ceil(group / 8)
  const int32_t* topk;
  int64_t topk_stride;
  int32_t topk_width;
  int32_t num_splits;
  float* partial_out;       // [max_rows, q_heads, splits, D]
  float* partial_lse;       // [max_rows, q_heads, splits]
  int32_t* split_counters;  // [max_rows, kv_heads, head_chunks]
};

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kWindow = 1024;  // token-list entries compacted per prologue
constexpr int kHeadsPerCta = kAttentionHeadsPerCta;

template <KvKind KV, int D>
struct Shape {
  static constexpr int kBytes = KV == KvKind::kE4M3 ? 1 : 2;
  static constexpr int kKSteps = D / 16;           // MMA k-steps over head dims
  static constexpr int kMTiles = D / 16;           // MMA m-tiles over output dims
  static constexpr int kKWords = D * kBytes / 16;  // K words per token per thread
  static constexpr int kVWords = D * kBytes / 32;  // V words per token per thread
  static constexpr int kKSpan = D / 4;             // K dims per thread (by lane % 4)
  static constexpr int kVSpan = D / 8;             // V/out dims per thread (by lane / 4)
  static constexpr bool kBf16Mma = KV == KvKind::kBf16;
};

template <int D>
struct alignas(16) MergeSmem {
  float m[kWarps][kHeadsPerCta];
  float l[kWarps][kHeadsPerCta];
  float o[kWarps][kHeadsPerCta][D];
};

// The copy ring (cp.async, SM80+; routed on SM90+, where it was measured; E4M3 at head_dim
// 256: the reference geometry): each warp owns NS stages of one 16-token tile in shared
// memory, K rows then V rows, each row padded by 16 bytes so that the fragment reads
// below are free of bank conflicts. Its window holds 32-bit row offsets in 16-byte units
// (DecodeParams::ring_offsets), so that three CTAs' rings and windows fit one SM. (Three
// stages at two CTAs per SM measured slower at 1024 rows and no faster at 32-256 rows:
// docs/perf.md.)
constexpr int kRingStages = 2;
constexpr int kRingWindow = 640;
template <int D>
constexpr int ring_row_bytes() {
  return D + 16;
}
template <int D>
constexpr int ring_stage_bytes() {
  return 32 * ring_row_bytes<D>();
}
template <KvKind KV, int D>
constexpr bool ring_shape() {
  return KV == KvKind::kE4M3 && D == 256;
}

// The window's entry type: byte offsets (register path) or 16-byte row offsets (ring).
template <bool kRing>
struct WindowOffset {
  using type = int64_t;
};
template <>
struct WindowOffset<true> {
  using type = uint32_t;
};

// Static shared memory: the window's token offsets (the scan's warp totals share it):
// byte offsets on the register path, 16-byte row offsets on the ring path.
template <int W, class Offset>
union DecodeSmem {
  Offset offsets[W];
  int32_t warp_totals[kWarps];
};

// Dynamic shared memory: the warp merge (and the split weights of the last CTA); on the
// ring path the rings too (the merge reuses them once every copy has landed).
template <int D, int NS = 0>
constexpr int dynamic_smem_bytes() {
  constexpr int merge = static_cast<int>(sizeof(MergeSmem<D>));
  constexpr int ring = kWarps * NS * ring_stage_bytes<D>();
  return ring > merge ? ring : merge;
}

// The kernels' parameters from the backend's (host code; both kernel tiers).
inline DecodeParams decode_params(const AttentionParams& p) {
  const KvCacheView& c = p.cache;
  DecodeParams dp;
  fill_attention_inputs(dp, p);
  dp.row_group = p.meta.row_group;
  dp.skip_grouped = p.grouped.num_groups > 0;
  dp.own_lists = p.grouped.own_lists;
  dp.shared_out = p.grouped.shared_out;
  dp.shared_lse = p.grouped.shared_lse;
  // The ring's entries: whole 16-byte units (as the kernels' 16-byte loads need anyway),
  // the last row's within 32 bits.
  const int64_t last_row = (c.num_blocks - 1) * dp.stride_block +
                           (c.block_size - 1) * dp.stride_token + (c.kv_heads - 1) * dp.stride_head;
  dp.ring_offsets = (dp.stride_block | dp.stride_token | dp.stride_head) % 16 == 0 &&
                    (last_row >> 4) <= int64_t{0xFFFFFFFF};
  dp.head_chunks = (p.group_size + kHeadsPerCta - 1) / kHeadsPerCta;
  dp.topk = p.topk;
  dp.topk_stride = p.topk_stride;
  dp.topk_width = p.topk_width;
  dp.num_splits = p.num_splits;
  dp.partial_out = p.partial_out;
  dp.partial_lse = p.partial_lse;
  dp.split_counters = p.split_counters;
  return dp;
}

// Compacts the valid tokens of list entries [begin, end) (at most W) into smem offsets:
// bytes of the token's K row for this KV head (int64_t), or the offset of the token's K
// row from its KV head's first, in 16-byte units (uint32_t, the ring path). list: the
// row's entries (sparse; dense: the entry is the token). Returns the count; all threads
// agree.
template <int W = kWindow, class Offset = int64_t>
__device__ __forceinline__ int compact_window(const DecodeParams& p, Offset* offsets,
                                              int32_t* warp_totals, const int32_t* list, int kvh,
                                              int pos, const int32_t* bt, int begin, int end) {
  static_assert(W % kThreads == 0, "every window entry has a thread");
  constexpr int kPer = W / kThreads;
  const int tid = threadIdx.x;
  int64_t off[kPer];
  uint32_t valid_mask = 0;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int col = begin + i * kThreads + tid;
    off[i] = 0;
    if (col < end) {
      const int t = p.dense ? col : __ldg(list + col);
      if (t >= 0 && t <= pos) {
        const int32_t phys = __ldg(bt + t / p.block_size);
        if (page_mapped(phys, p.num_blocks)) {
          off[i] = paged_row_offset(phys, t, p.block_size, p.stride_block, p.stride_token);
          if constexpr (sizeof(Offset) == 4)
            off[i] >>= 4;
          else
            off[i] += kvh * p.stride_head;
          valid_mask |= 1u << i;
        }
      }
    }
  }
  // The scan's first barrier is where every warp is done with the previous window's
  // offsets (and, for the first window, warp 0's Q fragments are published): a warp that
  // finishes its tiles early has the next window's indices and block-table entries in
  // flight meanwhile.
  int total;
  int base = block_exclusive_scan<kWarps>(__popc(valid_mask), warp_totals, total);
  __syncthreads();  // warp_totals shares storage with offsets
#pragma unroll
  for (int i = 0; i < kPer; ++i)
    if (valid_mask & (1u << i)) offsets[base++] = static_cast<Offset>(off[i]);
  __syncthreads();
  return total;
}

// One 16-token tile's raw K/V words in registers: K rows of tokens g and g+8 (this
// thread's K span), V rows of tokens 2t4, 2t4+1, 2t4+8, 2t4+9 (its V span).
template <KvKind KV, int D>
struct TileRegs {
  using S = Shape<KV, D>;
  uint32_t k0[S::kKWords];
  uint32_t k1[S::kKWords];
  uint32_t v[4][S::kVWords];
  bool kv0, kv1;
};

// Where each thread's span of head dims lies in a row (register path). A thread's span
// is read in 16-byte units (a whole span when it is shorter), and the lanes that share a
// row take consecutive units: K unit i of lane t4 is unit t4 + 4i of the row, V unit i of
// lane g is unit g + 8i. So every 16-byte load of the warp covers whole 32-byte sectors
// (a contiguous span per lane leaves each load half of every sector it touches, and the
// no-allocate loads then fetch sectors from L2 up to twice). The dot product's order
// of dims is free: Q's fragments (prologue) and the output dims (warp merge) follow the
// same maps.
template <KvKind KV, int D>
struct SpanLayout {
  using S = Shape<KV, D>;
  static constexpr int kUnitDims = 16 / S::kBytes;
  static constexpr int kKUnit = S::kKSpan < kUnitDims ? S::kKSpan : kUnitDims;  // dims
  static constexpr int kVUnit = S::kVSpan < kUnitDims ? S::kVSpan : kUnitDims;
  static_assert(S::kKSpan % kKUnit == 0 && S::kVSpan % kVUnit == 0, "whole units");
  // The head dim at position p of the K span of lane t4 / the V span of lane g.
  static __device__ __forceinline__ int k_dim(int t4, int p) {
    return (t4 + 4 * (p / kKUnit)) * kKUnit + p % kKUnit;
  }
  static __device__ __forceinline__ int v_dim(int g, int p) {
    return (g + 8 * (p / kVUnit)) * kVUnit + p % kVUnit;
  }
};

// The words of one span from a row: units of kUnitBytes at p, p + kStride, ... (p: the
// lane's first unit; the strides are compile-time, so every load is one immediate offset).
template <int Words, int kUnitBytes, int kStride>
__device__ __forceinline__ void load_span(uint32_t (&w)[Words], const uint8_t* p) {
  constexpr int kUnitWords = kUnitBytes / 4;
#pragma unroll
  for (int u = 0; u < Words / kUnitWords; ++u) {
    if constexpr (kUnitWords == 4) {
      const uint4 v = ld_stream16(p + u * kStride);
      w[4 * u] = v.x, w[4 * u + 1] = v.y, w[4 * u + 2] = v.z, w[4 * u + 3] = v.w;
    } else {
      static_assert(kUnitWords == 2, "8- or 16-byte units");
      const uint2 v = ld_stream8(p + u * kStride);
      w[2 * u] = v.x, w[2 * u + 1] = v.y;
    }
  }
}

// The K half of a tile (tokens g and g+8) and the V half (tokens 2t4, 2t4+1, 2t4+8,
// 2t4+9) load separately: the next tile's K is requested as soon as this tile's scores
// are computed, its V as soon as P.V is done (run_window), so each half's latency hides
// behind the other half's compute with no second register tile.
template <KvKind KV, int D>
__device__ __forceinline__ void load_tile_k(TileRegs<KV, D>& t, const int64_t* offsets, int n,
                                            int tile, const uint8_t* kbase, int g, int t4) {
  using S = Shape<KV, D>;
  using L = SpanLayout<KV, D>;
  constexpr int kUnitBytes = L::kKUnit * S::kBytes;
  const int lane_off = L::k_dim(t4, 0) * S::kBytes;
  const int base = tile << 4;
  t.kv0 = base + g < n;
  t.kv1 = base + g + 8 < n;
  if (t.kv0)
    load_span<S::kKWords, kUnitBytes, 4 * kUnitBytes>(t.k0, kbase + offsets[base + g] + lane_off);
  else
    zero_words(t.k0);
  if (t.kv1)
    load_span<S::kKWords, kUnitBytes, 4 * kUnitBytes>(t.k1,
                                                      kbase + offsets[base + g + 8] + lane_off);
  else
    zero_words(t.k1);
}

template <KvKind KV, int D>
__device__ __forceinline__ void load_tile_v(TileRegs<KV, D>& t, const int64_t* offsets, int n,
                                            int tile, const uint8_t* vbase, int g, int t4) {
  using S = Shape<KV, D>;
  using L = SpanLayout<KV, D>;
  constexpr int kUnitBytes = L::kVUnit * S::kBytes;
  const int lane_off = L::v_dim(g, 0) * S::kBytes;
  const int base = tile << 4;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int tok = base + 2 * t4 + (j & 1) + (j >> 1) * 8;
    if (tok < n)
      load_span<S::kVWords, kUnitBytes, 8 * kUnitBytes>(t.v[j], vbase + offsets[tok] + lane_off);
    else
      zero_words(t.v[j]);  // padding: zeros, never the bytes of another token
  }
}

// Online-softmax state of one warp: this thread's two heads (2t4, 2t4+1) and its
// fragments of O^T.
template <int D>
struct SoftmaxState {
  float m[2];
  float l[2];
  float o[D / 16][4];
};

// S^T = K Q^T for one tile, scaled to base-2 logits, masked tokens at -inf.
// qb: Q's B fragments in shared memory, [k-step][lane] (identical for every warp; kept
// out of registers, which the tile and the output fragments need: 32 fewer registers).
template <KvKind KV, int D, Decoder DEC, bool kPatchNaN>
__device__ __forceinline__ void tile_scores(const TileRegs<KV, D>& t, const uint2* qb, float factor,
                                            float (&s)[4]) {
  using S = Shape<KV, D>;
  // E4M3: two accumulators (even and odd k-steps), so the MMAs form two dependent chains
  // of kKSteps / 2 instead of one of kKSteps. (16-bit tiles keep one: their register
  // budget is spent on the tile, and the split measured no faster there.)
  constexpr int kChains = KV == KvKind::kE4M3 ? 2 : 1;
  float acc[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
  for (int ks = 0; ks < S::kKSteps; ++ks) {
    uint32_t a[4];
    if constexpr (KV == KvKind::kE4M3) {
      // The word's two pairs fill k-columns (2t4, 2t4+1) and (2t4+8, 2t4+9); Q's B fragment is
      // grouped to match (CodeGrouping, in the Q prologue).
      decode_pairs<DEC, kPatchNaN>(t.k0[ks], a[0], a[2]);
      decode_pairs<DEC, kPatchNaN>(t.k1[ks], a[1], a[3]);
    } else {
      a[0] = t.k0[2 * ks];
      a[2] = t.k0[2 * ks + 1];
      a[1] = t.k1[2 * ks];
      a[3] = t.k1[2 * ks + 1];
    }
    const uint2 b = qb[ks * 32 + (threadIdx.x & 31)];
    mma_16816<S::kBf16Mma>(acc[ks % kChains], a, b.x, b.y);
  }
  // s[0], s[1]: token g, heads 2t4, 2t4+1; s[2], s[3]: token g+8.
  s[0] = t.kv0 ? (acc[0][0] + acc[1][0]) * factor : -CUDART_INF_F;
  s[1] = t.kv0 ? (acc[0][1] + acc[1][1]) * factor : -CUDART_INF_F;
  s[2] = t.kv1 ? (acc[0][2] + acc[1][2]) * factor : -CUDART_INF_F;
  s[3] = t.kv1 ? (acc[0][3] + acc[1][3]) * factor : -CUDART_INF_F;
}

// The online-softmax update with one tile's scores s, then O^T += V^T P^T.
template <KvKind KV, int D, Decoder DEC, bool kPatchNaN>
__device__ __forceinline__ void tile_softmax_pv(const TileRegs<KV, D>& t, float (&s)[4],
                                                SoftmaxState<D>& st) {
  using S = Shape<KV, D>;
  // ---- online softmax (base 2) ----
  float mx0 = fmaxf(s[0], s[2]), mx1 = fmaxf(s[1], s[3]);
#pragma unroll
  for (int d = 4; d < 32; d <<= 1) {
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, d));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, d));
  }
  const OnlineMax u0 = online_max(st.m[0], mx0), u1 = online_max(st.m[1], mx1);
  const float ref0 = u0.ref, ref1 = u1.ref;
  // A maximum that did not move rescales by exactly 1 (the same result as exp2(0)), so
  // the warp skips the D / 2 multiplies of its output fragments unless some lane's moved:
  // past the first tiles of a split that is most tiles.
  const bool moved0 = u0.m != st.m[0], moved1 = u1.m != st.m[1];
  const float alpha0 = moved0 ? u0.alpha : 1.0f;
  const float alpha1 = moved1 ? u1.alpha : 1.0f;
  st.m[0] = u0.m;
  st.m[1] = u1.m;
  s[0] = fast_exp2(s[0] - ref0);
  s[1] = fast_exp2(s[1] - ref1);
  s[2] = fast_exp2(s[2] - ref0);
  s[3] = fast_exp2(s[3] - ref1);
  st.l[0] = st.l[0] * alpha0 + s[0] + s[2];
  st.l[1] = st.l[1] * alpha1 + s[1] + s[3];
  if (__any_sync(0xffffffffu, moved0 || moved1)) {
#pragma unroll
    for (int i = 0; i < S::kMTiles; ++i) {
      st.o[i][0] *= alpha0;
      st.o[i][1] *= alpha1;
      st.o[i][2] *= alpha0;
      st.o[i][3] *= alpha1;
    }
  }
  // P^T as the B operand: transpose the 8x8 (token x head) fragments.
  const uint32_t pb0 = transpose_8x8(S::kBf16Mma ? pack_bf162(s[0], s[1]) : pack_half2(s[0], s[1]));
  const uint32_t pb1 = transpose_8x8(S::kBf16Mma ? pack_bf162(s[2], s[3]) : pack_half2(s[2], s[3]));

  // ---- O^T += V^T P^T ----
#pragma unroll
  for (int j = 0; j < S::kVWords; ++j) {
    if constexpr (KV == KvKind::kE4M3) {
      // Word j: dims 4j..4j+3 of the span = m-tiles 2j (dims 4j, 4j+1) and 2j+1; one permute
      // pairs a dim's codes of two tokens (the A fragment's k-columns).
      using G = CodeGrouping<DEC>;
      uint32_t a[4], b[4];
      decode_pairs<DEC, kPatchNaN>(prmt(t.v[0][j], t.v[1][j], G::kCodesLo), a[0], a[1]);
      decode_pairs<DEC, kPatchNaN>(prmt(t.v[2][j], t.v[3][j], G::kCodesLo), a[2], a[3]);
      decode_pairs<DEC, kPatchNaN>(prmt(t.v[0][j], t.v[1][j], G::kCodesHi), b[0], b[1]);
      decode_pairs<DEC, kPatchNaN>(prmt(t.v[2][j], t.v[3][j], G::kCodesHi), b[2], b[3]);
      mma_16816<false>(st.o[2 * j], a, pb0, pb1);
      mma_16816<false>(st.o[2 * j + 1], b, pb0, pb1);
    } else {
      // Word j: dims 2j, 2j+1 of the span = m-tile j.
      uint32_t a[4];
      a[0] = prmt(t.v[0][j], t.v[1][j], 0x5410u);
      a[1] = prmt(t.v[0][j], t.v[1][j], 0x7632u);
      a[2] = prmt(t.v[2][j], t.v[3][j], 0x5410u);
      a[3] = prmt(t.v[2][j], t.v[3][j], 0x7632u);
      mma_16816<S::kBf16Mma>(st.o[j], a, pb0, pb1);
    }
  }
}

// A warp's tiles of one window: tile = warp, warp + 4, ..., straight into registers.
// E4M3: the next tile's K is requested right after this tile's scores and its V right
// after P.V (the registers they reuse are free by then). 16-bit tiles (twice the
// registers) load a whole tile and compute it: the split loads measured slower there at
// 1024 rows (docs/perf.md). (The copy ring below stages tiles in shared memory instead;
// it is routed only where it measured faster.)
template <KvKind KV, int D, Decoder DEC, bool kPatchNaN>
__device__ __forceinline__ void run_window(const int64_t* offsets, int n, int warp,
                                           const uint8_t* kbase, const uint8_t* vbase, int g,
                                           int t4, const uint2* qb, float factor,
                                           SoftmaxState<D>& st) {
  const int tiles = (n + 15) >> 4;
  TileRegs<KV, D> a;
  if constexpr (KV != KvKind::kE4M3) {
    for (int tile = warp; tile < tiles; tile += kWarps) {
      load_tile_k(a, offsets, n, tile, kbase, g, t4);
      load_tile_v(a, offsets, n, tile, vbase, g, t4);
      float s[4];
      tile_scores<KV, D, DEC, kPatchNaN>(a, qb, factor, s);
      tile_softmax_pv<KV, D, DEC, kPatchNaN>(a, s, st);
    }
    return;
  }
  if (warp >= tiles) return;
  load_tile_k(a, offsets, n, warp, kbase, g, t4);
  load_tile_v(a, offsets, n, warp, vbase, g, t4);
  for (int tile = warp;; tile += kWarps) {
    float s[4];
    tile_scores<KV, D, DEC, kPatchNaN>(a, qb, factor, s);
    const bool more = tile + kWarps < tiles;
    if (more) load_tile_k(a, offsets, n, tile + kWarps, kbase, g, t4);
    tile_softmax_pv<KV, D, DEC, kPatchNaN>(a, s, st);
    if (!more) break;
    load_tile_v(a, offsets, n, tile + kWarps, vbase, g, t4);
  }
}

// The ring path's fragment layout (E4M3, head_dim 256, rows of ring_row_bytes): thread
// (g, t4) reads 16-byte chunks 2t4, 2t4+1, 2t4+8, 2t4+9 of K rows g and g+8 (its K span:
// dims [32 t4, 32 t4 + 32) and [128 + 32 t4, ...)), and chunks g and g + 8 of the V rows
// of its four tokens (its V span: dims [16 g, 16 g + 16) and [128 + 16 g, ...)). With a
// row stride of 17 chunks, the 8 lanes of each shared-memory phase hit 8 distinct banks.
template <int D>
__device__ __forceinline__ int ring_k_chunk(int t4, int i) {
  return 2 * t4 + (i & 1) + (D / 32) * (i >> 1);
}
template <int D>
__device__ __forceinline__ int ring_v_chunk(int g, int i) {
  return g + (D / 32) * i;
}

// One tile's K words (then V words) from a ring stage, in the register path's word
// order, so the same tile_scores / tile_softmax_pv run on them. Tokens at or past n: K is
// masked by kv0/kv1; V is zero (a stale row of an earlier tile might hold NaN codes).
template <KvKind KV, int D>
__device__ __forceinline__ void read_ring_k(TileRegs<KV, D>& t, const uint8_t* stage, int base,
                                            int n, int g, int t4) {
  constexpr int kRow = ring_row_bytes<D>();
  t.kv0 = base + g < n;
  t.kv1 = base + g + 8 < n;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int c = ring_k_chunk<D>(t4, i) * 16;
    const uint4 a = *reinterpret_cast<const uint4*>(stage + g * kRow + c);
    const uint4 b = *reinterpret_cast<const uint4*>(stage + (g + 8) * kRow + c);
    t.k0[4 * i] = a.x, t.k0[4 * i + 1] = a.y, t.k0[4 * i + 2] = a.z, t.k0[4 * i + 3] = a.w;
    t.k1[4 * i] = b.x, t.k1[4 * i + 1] = b.y, t.k1[4 * i + 2] = b.z, t.k1[4 * i + 3] = b.w;
  }
}

template <KvKind KV, int D>
__device__ __forceinline__ void read_ring_v(TileRegs<KV, D>& t, const uint8_t* stage, int base,
                                            int n, int g, int t4) {
  constexpr int kRow = ring_row_bytes<D>();
  const uint8_t* vrows = stage + 16 * kRow;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int tok = 2 * t4 + (j & 1) + (j >> 1) * 8;
    const bool valid = base + tok < n;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      uint4 v = make_uint4(0u, 0u, 0u, 0u);
      if (valid)
        v = *reinterpret_cast<const uint4*>(vrows + tok * kRow + ring_v_chunk<D>(g, i) * 16);
      t.v[j][4 * i] = v.x, t.v[j][4 * i + 1] = v.y, t.v[j][4 * i + 2] = v.z,
                 t.v[j][4 * i + 3] = v.w;
    }
  }
}

// Where the ring path's window entries count from: the KV head's K row of block 0, token
// 0; its V rows lie v_offset bytes after the K rows.
struct RingSource {
  const uint8_t* k;
  int64_t v_offset;
};

// Requests tile `tile` of the window into a ring stage as one commit group of 16-byte
// cp.async copies: lane (half, c) copies chunk c of the K and V rows of tokens 2i + half,
// i < 8, so each instruction moves two whole rows. Rows past the window's end are
// zero-filled without a read. (One cp.async.bulk per row measured slower: the bulk copy
// takes uniform operands, so a warp's 32 row copies issue one lane at a time, nine
// instructions each, more than the rest of the tile's work; docs/perf.md run 22.)
template <int D>
__device__ __forceinline__ void issue_ring_tile(uint8_t* stage, const uint32_t* refs, int n,
                                                int tile, const RingSource& src, int lane) {
  static_assert(D == 16 * 16, "16 lanes of 16 bytes per row");
  constexpr int kRow = ring_row_bytes<D>();
  const int base = tile << 4;
  const int c = (lane & 15) * 16, half = lane >> 4;
  const uint8_t* k = src.k + c;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int r = 2 * i + half;
    const bool valid = base + r < n;
    // One wide multiply-add per row: the entry is in 16-byte units from this lane's chunk.
    const uint8_t* row = k + (static_cast<uint64_t>(valid ? refs[base + r] : 0u) << 4);
    copy16_async(stage + r * kRow + c, row, valid);
    copy16_async(stage + (16 + r) * kRow + c, row + src.v_offset, valid);
  }
}

// A warp's tiles of one window through its ring (NS tiles in flight while it computes):
// tile = warp, warp + 4, ... in stage k % NS. Every tile's group is committed (empty past
// the window's last tile) and every tile requested is consumed before the window ends, so
// the group count carries over to the next window: wait_group<NS - 1> before tile k
// always means "tile k has landed".
template <KvKind KV, int D, Decoder DEC, int NS, bool kPatchNaN>
__device__ __forceinline__ void run_window_ring(const uint32_t* refs, int n, int warp,
                                                const RingSource& src, int g, int t4,
                                                const uint2* qb, float factor, SoftmaxState<D>& st,
                                                uint8_t* ring) {
  constexpr int kStage = ring_stage_bytes<D>();
  const int lane = threadIdx.x & 31;
  const int tiles = (n + 15) >> 4;
#pragma unroll
  for (int s = 0; s < NS; ++s) {
    if (warp + s * kWarps < tiles)
      issue_ring_tile<D>(ring + s * kStage, refs, n, warp + s * kWarps, src, lane);
    copy_commit();
  }
  for (int k = 0;; ++k) {
    const int tile = warp + k * kWarps;
    if (tile >= tiles) break;
    const int stage = k % NS;
    copy_wait<NS - 1>();
    __syncwarp();  // every lane's copies of the stage are visible to the warp
    // K first (its words die in the scores), then V: one half-tile of registers at a time.
    TileRegs<KV, D> t;
    read_ring_k(t, ring + stage * kStage, tile << 4, n, g, t4);
    float s[4];
    tile_scores<KV, D, DEC, kPatchNaN>(t, qb, factor, s);
    read_ring_v(t, ring + stage * kStage, tile << 4, n, g, t4);
    __syncwarp();  // every lane's reads of the stage come before the copies that refill it
    const int next = tile + NS * kWarps;
    if (next < tiles) issue_ring_tile<D>(ring + stage * kStage, refs, n, next, src, lane);
    copy_commit();
    tile_softmax_pv<KV, D, DEC, kPatchNaN>(t, s, st);
  }
}

// Combines the splits of (row, KV head, chunk) once all have arrived; run by the last
// CTA to arrive, all threads. The weights exp2(lse_s - max) / sum are computed once per
// head into shared memory; then each output element is an independent sum over the
// splits' partials (written by other CTAs: read through L2 with ld.cg). shared: the row's
// group also has a shared part (the grouped kernel's partial), one more term.
template <class Act, int D>
__device__ void merge_splits(const DecodeParams& p, int row, int kvh, int chunk, float v_factor,
                             bool shared,
                             float* weights /* shared, [kHeadsPerCta][num_splits + 1] */) {
  const int heads = min(kHeadsPerCta, p.group - chunk * kHeadsPerCta);
  const int S = p.num_splits, SW = S + (shared ? 1 : 0);
  const int64_t head0 =
      static_cast<int64_t>(row) * p.q_heads + kvh * p.group + chunk * kHeadsPerCta;
  for (int i = threadIdx.x; i < heads * SW; i += kThreads) {
    const int h = i / SW, s = i - h * SW;
    weights[i] =
        s < S ? __ldcg(p.partial_lse + (head0 + h) * S + s) : __ldg(p.shared_lse + head0 + h);
  }
  __syncthreads();
  if (threadIdx.x < heads) lse_to_weights(weights + threadIdx.x * SW, SW);
  __syncthreads();
  // Each thread owns columns of 4 consecutive dims of a head (16-byte loads): all its
  // kCols columns (8 heads x D / 4 columns over the CTA) with kBatch splits each in
  // flight at once, so the merge is ceil(splits / kBatch) L2 round trips (3 for 17 splits
  // at D = 256), not one per column and batch of splits.
  constexpr int kCols = kHeadsPerCta * (D / 4) / kThreads;
  constexpr int kBatch = kCols >= 4 ? 6 : 8;
  static_assert(kCols >= 1 && kHeadsPerCta * (D / 4) % kThreads == 0, "whole columns");
  const int columns = heads * (D / 4);
  for (int c0 = threadIdx.x; c0 < columns; c0 += kCols * kThreads) {
    float4 acc[kCols];
    const float* part[kCols];
    const float* w[kCols];
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      const int idx = min(c0 + c * kThreads, columns - 1);  // a spare column repeats the last
      const int h = idx / (D / 4), d = (idx % (D / 4)) * 4;
      acc[c] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      part[c] = p.partial_out + (head0 + h) * S * D + d;
      w[c] = weights + h * SW;
    }
    for (int s0 = 0; s0 < S; s0 += kBatch) {
      float4 v[kCols][kBatch];
#pragma unroll
      for (int c = 0; c < kCols; ++c)
#pragma unroll
        for (int j = 0; j < kBatch; ++j)
          v[c][j] = s0 + j < S ? __ldcg(reinterpret_cast<const float4*>(
                                     part[c] + static_cast<int64_t>(s0 + j) * D))
                               : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
      for (int c = 0; c < kCols; ++c)
#pragma unroll
        for (int j = 0; j < kBatch; ++j) {
          const float wj = s0 + j < S ? w[c][s0 + j] : 0.0f;
          acc[c].x += wj * v[c][j].x;
          acc[c].y += wj * v[c][j].y;
          acc[c].z += wj * v[c][j].z;
          acc[c].w += wj * v[c][j].w;
        }
    }
    if (shared) {
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        const int idx = min(c0 + c * kThreads, columns - 1);
        const int h = idx / (D / 4), d = (idx % (D / 4)) * 4;
        const float4 v = __ldg(reinterpret_cast<const float4*>(p.shared_out + (head0 + h) * D + d));
        const float wj = w[c][S];
        acc[c].x += wj * v.x;
        acc[c].y += wj * v.y;
        acc[c].z += wj * v.z;
        acc[c].w += wj * v.w;
      }
    }
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      const int idx = c0 + c * kThreads;
      if (idx >= columns) break;
      const int h = idx / (D / 4), d = (idx % (D / 4)) * 4;
      store_act4<Act>(static_cast<Act*>(p.out) + (head0 + h) * D + d, acc[c].x * v_factor,
                      acc[c].y * v_factor, acc[c].z * v_factor, acc[c].w * v_factor);
    }
  }
}

// The end of every decode CTA (both kernel tiers): combines the warps' online-softmax
// states in `ms` into this split's output (one split: the final output; several: the
// partials, and the last CTA of (row, KV head, chunk) to arrive merges them). All
// threads; ms is complete and published. weights may alias ms (used after it is read).
// shared: the row's group has a shared part, the grouped kernel's partial of the row
// (p.shared_out / shared_lse, written by an earlier launch), folded into the output.
template <class Act, int D>
__device__ __forceinline__ void finish_cta(const DecodeParams& p, const MergeSmem<D>& ms, int row,
                                           int kvh, int chunk, int split, float v_factor,
                                           bool shared, int& last_arrival, float* weights) {
  static_assert(sizeof(MergeSmem<D>) >= kHeadsPerCta * (kMaxSplits + 1) * sizeof(float),
                "merge_splits' weights fit the warp-merge storage they reuse");
  // Each step of a thread combines 4 consecutive dims of one head (16-byte reads and
  // writes; from head_dim 128 a warp's lanes share the head), so the head's maximum, the
  // warps' factors and the normaliser are computed once per 4 dims: one element per step
  // took ~1,100 instructions per thread, a third of a small split's CTA (docs/perf.md).
  constexpr int kQuads = D / 4;
  for (int idx = threadIdx.x; idx < kHeadsPerCta * kQuads; idx += kThreads) {
    const int h = idx / kQuads, d = (idx % kQuads) * 4;
    const int hl = chunk * kHeadsPerCta + h;
    if (hl >= p.group) break;  // idx grows with h: no later head is valid either
    const int qh = kvh * p.group + hl;
    float M = -CUDART_INF_F;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, ms.m[w][h]);
    // fmaxf ignores NaN, so a NaN score never reaches M: it lives on in l and o, and
    // every step below must carry it (a NaN K code poisons the rows that see it). L is 0
    // only when the split saw no token; NaN is not "no token".
    float L = 0.0f;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      // All warps masked: each holds l = 0 and o = 0, or NaN from a NaN score.
      const float c = M == -CUDART_INF_F ? 1.0f : fast_exp2(ms.m[w][h] - M);
      L += ms.l[w][h] * c;
      const float4 o = *reinterpret_cast<const float4*>(&ms.o[w][h][d]);
      acc.x += o.x * c;
      acc.y += o.y * c;
      acc.z += o.z * c;
      acc.w += o.w * c;
    }
    const int64_t oi = (static_cast<int64_t>(row) * p.q_heads + qh);
    if (p.num_splits == 1 && shared) {
      float a, b;
      fold_factors(M, __ldg(p.shared_lse + oi), a, b);
      const float4 o = __ldg(reinterpret_cast<const float4*>(p.shared_out + oi * D + d));
      L = L * a + b;
      acc = make_float4(acc.x * a + o.x * b, acc.y * a + o.y * b, acc.z * a + o.z * b,
                        acc.w * a + o.w * b);
    }
    const float inv = L != 0.0f ? 1.0f / L : 0.0f;  // 1 / NaN is NaN
    if (p.num_splits == 1) {
      const float f = inv * v_factor;
      store_act4<Act>(static_cast<Act*>(p.out) + oi * D + d, acc.x * f, acc.y * f, acc.z * f,
                      acc.w * f);
    } else {
      const int64_t pi = oi * p.num_splits + split;
      *reinterpret_cast<float4*>(p.partial_out + pi * D + d) =
          make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
      if (d == 0) p.partial_lse[pi] = state_lse(M, L);
    }
  }
  if (p.num_splits == 1) return;

  // ---- split-K: the last CTA of this (row, KV head, chunk) to arrive merges ----
  int32_t* counter =
      p.split_counters + (static_cast<int64_t>(row) * p.kv_heads + kvh) * p.head_chunks + chunk;
  if (!arrive_last(counter, p.num_splits, last_arrival)) return;
  merge_splits<Act, D>(p, row, kvh, chunk, v_factor, shared, weights);
}

// A decode CTA's coordinates in the grid both kernel tiers launch: x = (row, KV head,
// head chunk), chunk fastest; y = the split.
struct DecodeCta {
  int row, kvh, chunk, split;
};
__device__ __forceinline__ DecodeCta decode_cta(const DecodeParams& p) {
  DecodeCta c;
  c.split = blockIdx.y;
  int bx = blockIdx.x;
  c.chunk = bx % p.head_chunks;
  bx /= p.head_chunks;
  c.kvh = bx % p.kv_heads;
  c.row = bx / p.kv_heads;
  return c;
}

// CTAs per SM each kernel is compiled for (the register cap follows): E4M3 tiles are half
// the registers of 16-bit ones, so three CTAs (12 warps) fit, as do three two-stage rings
// (a deeper ring's shared memory fits two).
constexpr int decode_ctas_per_sm(KvKind kv, int ring_stages = 0) {
  return kv == KvKind::kE4M3 && ring_stages < 3 ? 3 : 2;
}

// NS: 0 for the register path, else the copy ring's stages per warp (kRingStages;
// ring_shape<KV, D>() only, launched on SM90+ when the cache's row offsets fit the ring's
// 32-bit entries).
template <class Act, KvKind KV, int D, Decoder DEC, int NS = 0>
__global__ void __launch_bounds__(kThreads, decode_ctas_per_sm(KV, NS))
    decode_attention_kernel(const DecodeParams p) {
  using S = Shape<KV, D>;
  constexpr bool kRing = NS > 0;
  static_assert(!kRing || ring_shape<KV, D>(), "the ring path's layout is E4M3 at head_dim 256");
  constexpr int kWin = kRing ? kRingWindow : kWindow;
  using Offset = typename WindowOffset<kRing>::type;
  __shared__ DecodeSmem<kWin, Offset> smem;
  __shared__ uint2 q_frag[Shape<KV, D>::kKSteps * 32];
  __shared__ int last_arrival;
  extern __shared__ uint4 dynamic_smem[];  // the warp merge

  const DecodeCta cta = decode_cta(p);
  const int split = cta.split, chunk = cta.chunk, kvh = cta.kvh, row = cta.row;
  wait_for_predecessors();  // lists, the grouped route's parts (dependent_launch.cuh)
  allow_dependents();
  // The plan's row arrays have max_rows entries (row < max_rows by the grid), so their
  // loads go out together with the header's, before the batch's row count is known: one
  // dependent round trip fewer at the head of every CTA.
  const PlanMetaHeader* h = p.header;
  const int num_rows = h->num_rows;
  const int req = p.row_request[row];
  const int pos = p.row_pos[row];
  const int grouped = p.skip_grouped ? p.row_group[row] : -1;
  // (Loaded beside row_group; meaningful for grouped rows only.)
  const int2 split_info = p.skip_grouped && !p.dense ? p.row_split[row] : make_int2(0, 0);
  const int32_t* table = h->block_table;
  const int64_t table_stride = h->block_table_stride;
  if (row >= num_rows) return;  // rows beyond this batch (graph replay)
  // A grouped row whose every entry is its group's (dense: always): the grouped kernel
  // wrote its output. Otherwise this CTA computes the row's own entries and folds in its
  // group's shared part, if the group has one.
  if (grouped >= 0 && (p.dense || (split_info.x == 0 && split_info.y > 0))) return;
  const bool shared = grouped >= 0 && split_info.y > 0;
  // The row's list: its own entries when grouped (sparse), else its top-k row.
  // (A group that listed nothing marks its rows' own lists as their top-k rows.)
  const bool own_list = grouped >= 0 && split_info.x >= 0;
  const int32_t* list = own_list ? p.own_lists + static_cast<int64_t>(row) * p.topk_width
                                 : p.topk + static_cast<int64_t>(row) * p.topk_stride;

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const int32_t* bt = table + static_cast<int64_t>(req) * table_stride;

  // ---- Q fragments (B operand of S^T = K Q^T), permuted to this thread's K span ----
  const int head_local = chunk * kHeadsPerCta + g;
  const bool has_head = head_local < p.group;
  const int q_head = kvh * p.group + head_local;
  uint32_t qraw[S::kKSpan / 2];  // this thread's K-span dims of Q, two per word
  if (has_head) {
    const Act* qp =
        static_cast<const Act*>(p.q) + (static_cast<int64_t>(row) * p.q_heads + q_head) * D;
#pragma unroll
    for (int i = 0; i < S::kKSpan / 8; ++i) {
      // 8 dims per load, in the K span's order (SpanLayout; the ring path's: its four K
      // chunks, ring_k_chunk, 16 E4M3 dims each).
      const int d = kRing ? ring_k_chunk<D>(t4, i / 2) * 16 + (i % 2) * 8
                          : SpanLayout<KV, D>::k_dim(t4, 8 * i);
      const uint4 v = __ldg(reinterpret_cast<const uint4*>(qp + d));
      qraw[4 * i] = v.x;
      qraw[4 * i + 1] = v.y;
      qraw[4 * i + 2] = v.z;
      qraw[4 * i + 3] = v.w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < S::kKSpan / 2; ++i) qraw[i] = 0u;
  }
  // BF16 activations with an FP16 MMA: scale Q by a power of two so that its largest
  // element lands in [2^14, 2^15) (exact; no FP16 overflow), and undo it in the factor.
  float q_unscale = 1.0f;
  if constexpr (std::is_same<Act, __nv_bfloat16>::value && !S::kBf16Mma) {
    float mx = 0.0f;
#pragma unroll
    for (int i = 0; i < S::kKSpan / 2; ++i) {
      const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&qraw[i]));
      mx = fmaxf(mx, fmaxf(fabsf(f.x), fabsf(f.y)));
    }
    const int shift = bf16_query_shift(mx);
    const float up = ldexpf(1.0f, shift);
    q_unscale = ldexpf(1.0f, -shift);
#pragma unroll
    for (int i = 0; i < S::kKSpan / 2; ++i) {
      const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&qraw[i]));
      qraw[i] = pack_half2(f.x * up, f.y * up);
    }
  }
  if (warp == 0) {
#pragma unroll
    for (int s = 0; s < S::kKSteps; ++s) {
      uint2 b;
      if constexpr (KV == KvKind::kE4M3) {
        // K word s holds dims 4s..4s+3 of the span, paired as decode_pairs pairs them.
        b.x = prmt(qraw[2 * s], qraw[2 * s + 1], CodeGrouping<DEC>::kHalvesLo);
        b.y = prmt(qraw[2 * s], qraw[2 * s + 1], CodeGrouping<DEC>::kHalvesHi);
      } else {
        b.x = qraw[2 * s];      // dims 4s, 4s+1
        b.y = qraw[2 * s + 1];  // dims 4s+2, 4s+3
      }
      q_frag[s * 32 + lane] = b;
    }
  }
  // (compact_window's first barrier publishes q_frag before any tile reads it)

  const float k_scale = __ldg(p.scales), v_scale = __ldg(p.scales + 1);
  constexpr float kUnit = KV == KvKind::kE4M3 ? decoded_unit<DEC>() : 1.0f;
  const float factor = p.softmax_scale_log2 * k_scale * kUnit * q_unscale;
  // The software decoder needs NaN patching only if a NaN code was ever stored.
  const bool patch_nan = KV == KvKind::kE4M3 && DEC == Decoder::kSoftware && *p.nan_flag != 0;

  SoftmaxState<D> st;
  st.m[0] = st.m[1] = -CUDART_INF_F;
  st.l[0] = st.l[1] = 0.0f;
#pragma unroll
  for (int i = 0; i < S::kMTiles; ++i) st.o[i][0] = st.o[i][1] = st.o[i][2] = st.o[i][3] = 0.0f;

  const int n_cols = p.dense ? pos + 1 : own_list ? split_info.x : p.topk_width;
  const int per_split = (n_cols + p.num_splits - 1) / p.num_splits;
  const int c0 = split * per_split;
  const int c1 = min(n_cols, c0 + per_split);
  const uint8_t* kbase = p.kv;
  const uint8_t* vbase = p.kv + p.stride_kv;

  uint8_t* ring = reinterpret_cast<uint8_t*>(dynamic_smem) + warp * NS * ring_stage_bytes<D>();
  const RingSource src{kbase + kvh * p.stride_head, p.stride_kv};
  for (int win = c0; win < c1; win += kWin) {
    const int n = compact_window<kWin, Offset>(p, smem.offsets, smem.warp_totals, list, kvh, pos,
                                               bt, win, min(c1, win + kWin));
    if constexpr (kRing) {
      if (patch_nan)
        run_window_ring<KV, D, DEC, NS, true>(smem.offsets, n, warp, src, g, t4, q_frag, factor, st,
                                              ring);
      else
        run_window_ring<KV, D, DEC, NS, false>(smem.offsets, n, warp, src, g, t4, q_frag, factor,
                                               st, ring);
    } else {
      if (patch_nan)
        run_window<KV, D, DEC, true>(smem.offsets, n, warp, kbase, vbase, g, t4, q_frag, factor,
                                     st);
      else
        run_window<KV, D, DEC, false>(smem.offsets, n, warp, kbase, vbase, g, t4, q_frag, factor,
                                      st);
    }
  }

  // ---- merge the 4 warps ----
#pragma unroll
  for (int d = 4; d < 32; d <<= 1) {
    st.l[0] += __shfl_xor_sync(0xffffffffu, st.l[0], d);
    st.l[1] += __shfl_xor_sync(0xffffffffu, st.l[1], d);
  }
  __syncthreads();
  MergeSmem<D>& ms = *reinterpret_cast<MergeSmem<D>*>(dynamic_smem);
  if (g == 0) {
    ms.m[warp][2 * t4] = st.m[0];
    ms.m[warp][2 * t4 + 1] = st.m[1];
    ms.l[warp][2 * t4] = st.l[0];
    ms.l[warp][2 * t4 + 1] = st.l[1];
  }
#pragma unroll
  for (int i = 0; i < S::kMTiles; ++i) {
    // M-tile i holds span positions 2i and 2i+1 (one V chunk: consecutive dims).
    const int d0 =
        kRing ? ring_v_chunk<D>(g, i / 8) * 16 + (2 * i) % 16 : SpanLayout<KV, D>::v_dim(g, 2 * i);
    ms.o[warp][2 * t4][d0] = st.o[i][0];
    ms.o[warp][2 * t4 + 1][d0] = st.o[i][1];
    ms.o[warp][2 * t4][d0 + 1] = st.o[i][2];
    ms.o[warp][2 * t4 + 1][d0 + 1] = st.o[i][3];
  }
  __syncthreads();
  const float v_factor = v_scale * kUnit;
  finish_cta<Act, D>(p, ms, row, kvh, chunk, split, v_factor, shared, last_arrival,
                     reinterpret_cast<float*>(dynamic_smem));
}

}  // namespace cuda
}  // namespace qsakv
