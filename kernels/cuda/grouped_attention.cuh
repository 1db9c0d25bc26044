// SPDX-License-Identifier: Apache-2.0
// Grouped multi-row attention (prefill chunks, verify rows): up to 16 consecutive rows of
// one request read each K/V tile once for all their query heads of one KV head.
//
// One CTA of up to 6 warps handles (group, KV head, split). Its M = rows x GQA group
// query vectors (<= 96; vector m is row m / group, head m % group) sit in shared memory;
// warp w owns vectors 16w .. 16w+15. The CTA walks an entry list in tiles of 16 tokens:
//   sparse: the group's shared list (grouped_union.cuh: the tokens many of its rows
//           select), each entry with a row mask; a row with entries of its own as well
//           gets a partial (normalised output and LSE) that the decode route folds in;
//   dense:  tokens 0 .. the last row's position, masked causally per row.
// Per tile (FlashAttention-2 layout, m16n8k16, FP32 accumulation):
//   S[16 vectors x 16 tokens] = Q . K^T   (A = Q by ldmatrix, B = K by ldmatrix)
//   masked per row, online softmax (base 2), P kept in registers as the A operand,
//   O[16 x D] += P . V                     (B = V by ldmatrix.trans)
// K/V tiles arrive by 16-byte async copies, three tiles in flight. E4M3 tiles land raw
// and are decoded once per tile into FP16 in shared memory (never per fragment); 16-bit
// tiles land directly in their swizzled place.
// On SM90 (sm_90a code) the same kernel computes with warpgroup MMAs instead (kWg): a
// warpgroup per 64 vectors (96 padded to 128), 32-token tiles, S = Q K^T with Q and K read
// by the tensor cores from shared memory, P V with P from registers; the per-warp
// accumulator layout is the same, so the masking, softmax and epilogue are shared. Its
// P V runs on while the next tile is decoded.
//
// Numerics as the decode route (DOMAIN.md section 3): the K scale sits in the softmax
// factor, the V scale is applied to the normalised output; FP16 MMAs for E4M3 caches
// (BF16 queries scaled by a power of two per vector into FP16 range), BF16 MMAs for BF16
// caches; P in the MMA's 16-bit type. NaN semantics as the CPU backend: a NaN K element
// makes the scores of the rows that select its token NaN (masking happens after the
// product, so other rows never see it); a non-finite V element would reach every row of
// the tile through P = 0 (0 x NaN), so where the layer's flag says one may exist the tile
// is checked, the element zeroed and the output dim of each selecting row set to NaN.
#pragma once

#include <math_constants.h>
#include <stdint.h>

#include <type_traits>

#include "limits.hpp"
#include "paged_address.cuh"
#include "params.hpp"
#include "cuda/common.cuh"
#include "cuda/dependent_launch.cuh"
#include "cuda/attention_inputs.cuh"
#include "cuda/e4m3_decode.cuh"
#include "cuda/last_arrival.cuh"
#include "cuda/mma.cuh"
#include "cuda/smem_tile.cuh"
#include "cuda/softmax_state.cuh"
#include "cuda/wgmma.cuh"

namespace qsakv {
namespace cuda {

constexpr int kGCopyStages = 3;  // tiles in flight
constexpr int kGEntryAhead = 4;  // tiles whose entries are resolved ahead of the compute
// The two compute paths: m16n8k16 (every SM75+ GPU; warp w owns vectors 16w .. 16w + 15,
// 16-token tiles) and, on SM90 with sm_90a code, warpgroup MMAs (kernels/cuda/wgmma.cuh:
// each warpgroup owns 64 vectors, padded; 32-token tiles, so that Q, read by the tensor
// cores from shared memory for every tile, is read once per 32 tokens).
template <bool kWg>
struct GroupedShape {
  static constexpr int kTile = kWg ? 32 : 16;                    // tokens per tile
  static constexpr int kSlots = kWg ? 128 : kGroupedMaxVectors;  // Q rows in shared memory
  static constexpr int kThreadsMax = kWg ? 256 : 32 * (kGroupedMaxVectors / 16);
  static constexpr int kCtasPerSm = kWg ? 1 : kGroupedCtasPerSm;
  // The resolved entries, a ring of slots: kGEntryAhead tiles ahead of the compute, and
  // the warpgroup path (one barrier per tile) keeps four more so that a slot is rewritten
  // only after every warp's last read of it.
  static constexpr int kEntrySlots = kWg ? 8 : kGEntryAhead;
  // Threads of a CTA for `vectors` query vectors: a warpgroup per 64 (warpgroup MMAs) or
  // a warp per 16 (m16n8k16); the kernel reads the count back from blockDim.
  static constexpr int threads(int vectors) {
    return kWg ? 128 * ((vectors + 63) / 64) : 32 * ((vectors + 15) / 16);
  }
};
// The launch bounds hold every group a plan can make.
static_assert(GroupedShape<false>::threads(kGroupedMaxVectors) <= GroupedShape<false>::kThreadsMax);
static_assert(GroupedShape<true>::threads(kGroupedMaxVectors) <= GroupedShape<true>::kThreadsMax);
enum class EntrySource { kUnion = 0, kDense = 1 };

struct GroupedParams {
  AttentionInputs in;  // cache, q, out, scales, metadata, row splits
  const int32_t* group_row0;
  const int32_t* group_rows;
  int32_t vectors;  // rows_per_group x group
  int32_t union_cap;
  int32_t max_items;
  const int32_t* union_count;
  const int64_t* union_off;
  const uint32_t* union_mask;
  float* shared_out;  // rows with entries of their own: their shared part (GroupedView)
  float* shared_lse;
  float* partial_out;
  float* partial_lse;
  int32_t* counters;
  int32_t max_groups;
};

// Shared memory of one CTA (bytes), by cache type, head_dim and compute path. The
// warpgroup path's Q and K/V tiles are atom-major (wgmma.cuh) from a 1024-byte boundary
// (the kernel rounds its base up: kBytes has the slack).
template <KvKind KV, int D, bool kWg = false>
struct GroupedSmem {
  using Shape = GroupedShape<kWg>;
  static constexpr int kGTile = Shape::kTile;
  static constexpr bool kE4M3 = KV == KvKind::kE4M3;
  static constexpr int kChunks16 = D / 8;             // 16-byte chunks per 16-bit row
  static constexpr int kTile16 = 2 * kGTile * D * 2;  // K then V, 16-bit, swizzled
  static constexpr int kStages16 = kE4M3 ? 2 : kGCopyStages;
  static constexpr int kRawChunks = kE4M3 ? D / 16 : D / 8;    // chunks per raw row
  static constexpr int kTileRaw = kE4M3 ? 2 * kGTile * D : 0;  // [token][K | V] codes
  static constexpr int kStagesRaw = kE4M3 ? kGCopyStages : 0;
  static constexpr int kQ = 0;  // [slots][D] 16-bit, swizzled (later: output staging)
  static constexpr int kKv16 = kQ + Shape::kSlots * D * 2;
  static constexpr int kRaw = kKv16 + kStages16 * kTile16;
  static constexpr int kEntOff = kRaw + kStagesRaw * kTileRaw;                 // int64 [slots][16]
  static constexpr int kEntMask = kEntOff + Shape::kEntrySlots * kGTile * 8;   // u32 [slots][tile]
  static constexpr int kQFactor = kEntMask + Shape::kEntrySlots * kGTile * 4;  // float [q slots]
  static constexpr int kPoison = kQFactor + Shape::kSlots * 4;                 // u32 [16][D/32]
  static constexpr int kBytes = kPoison + kGroupedMaxRows * (D / 32) * 4 + (kWg ? 1024 : 0);
  // Byte offsets of 16-byte chunk ch of Q's vector m and of a K or V tile's token j.
  __device__ static int q_chunk(int m, int ch) {
    if constexpr (kWg) return sw128_offset(Shape::kSlots, m, ch);
    return swizzled_chunk<kChunks16>(m, ch) * 16;
  }
  __device__ static int kv_chunk(int j, int ch) {
    if constexpr (kWg) return sw128_offset(kGTile, j, ch);
    return swizzled_chunk<kChunks16>(j, ch) * 16;
  }
};

template <KvKind KV, int D, bool kWg = false>
constexpr int grouped_smem_bytes() {
  return GroupedSmem<KV, D, kWg>::kBytes;
}

// The split count of this launch (every CTA computes the same): enough (group, split)
// items to fill max_items CTA slots per KV head, at most kGroupedMaxSplits.
__device__ __forceinline__ int grouped_splits(const GroupedParams& p, int groups) {
  return max(1, min(kGroupedMaxSplits, p.max_items / max(1, groups)));
}

// The CTA's coordinates and its entry list.
struct GroupCta {
  int group, split, splits, kvh;
  int row0, rows, pos0;
  const int32_t* bt;
  EntrySource source;
  int64_t ubase;  // union entries of this group
  int entries;
  int tile0, tile1;  // this split's tiles
};

// Tile `tile`'s 16 entries, resolved in two steps by warp 0 (lanes 0..15) so that the
// global loads of one tile overlap the compute of the previous one: fetch_entry reads the
// entry (shared list: offset and mask; dense: the token is the index), commit_entry looks
// up the page where needed and writes the slot: the byte offset of the K row (-1: none,
// reads zeros) and the mask of rows that see the token.
struct Entry {
  int64_t off;
  uint32_t mask;
  int t;
};

template <int kGTile>
__device__ __forceinline__ Entry fetch_entry(const GroupedParams& p, const GroupCta& c, int tile) {
  const int lane = threadIdx.x & 31;
  const int j = tile * kGTile + lane;
  Entry e{-1, 0u, -1};
  if (lane >= kGTile || tile >= c.tile1 || j >= c.entries) return e;
  if (c.source == EntrySource::kUnion) {
    e.off = __ldg(p.union_off + c.ubase + j);
    e.mask = __ldg(p.union_mask + c.ubase + j);
  } else {  // dense: rows r >= t - pos0 see token t = j
    e.t = j;
    e.mask = ((1u << c.rows) - 1u) & ~((1u << max(0, j - c.pos0)) - 1u);
  }
  return e;
}

template <int kGTile>
__device__ __forceinline__ void commit_entry(const GroupedParams& p, const GroupCta& c, Entry e,
                                             int64_t* off_slot, uint32_t* mask_slot) {
  const int lane = threadIdx.x & 31;
  if (lane >= kGTile) return;
  if (c.source == EntrySource::kDense && e.mask != 0u) {
    const int32_t phys = __ldg(c.bt + e.t / p.in.block_size);
    if (page_mapped(phys, p.in.num_blocks))
      e.off = paged_row_offset(phys, e.t, p.in.block_size, p.in.stride_block, p.in.stride_token);
  }
  off_slot[lane] = e.off;
  mask_slot[lane] = e.off >= 0 ? e.mask : 0u;
}

// Issues the async copies of tile `tile` (K and V rows of its 16 tokens) into its stage.
template <KvKind KV, int D, bool kWg>
__device__ __forceinline__ void issue_tile(const GroupedParams& p, uint8_t* smem, int tile,
                                           int tile1, int kvh, const int64_t* off_slot) {
  using L = GroupedSmem<KV, D, kWg>;
  constexpr int kGTile = L::kGTile;
  if (tile >= tile1) {  // past this split: an empty group keeps the wait counts uniform
    copy_commit();
    return;
  }
  constexpr int kChunks = 2 * kGTile * L::kRawChunks;
  const uint8_t* base = p.in.kv + static_cast<int64_t>(kvh) * p.in.stride_head;
  for (int c = threadIdx.x; c < kChunks; c += blockDim.x) {
    const int j = c / (2 * L::kRawChunks);
    const int rem = c - j * 2 * L::kRawChunks;
    const int kv = rem / L::kRawChunks, part = rem - kv * L::kRawChunks;
    const int64_t off = off_slot[j];
    const uint8_t* src = base + (off >= 0 ? off : 0) + kv * p.in.stride_kv + part * 16;
    uint8_t* dst;
    if constexpr (L::kE4M3)
      dst = smem + L::kRaw + (tile % L::kStagesRaw) * L::kTileRaw + c * 16;
    else
      dst = smem + L::kKv16 + (tile % L::kStages16) * L::kTile16 + kv * (kGTile * D * 2) +
            L::kv_chunk(j, part);
    copy16_async(dst, src, off >= 0);
  }
  copy_commit();
}

// Marks output dim d of every row in `rows` as NaN (a non-finite V element).
__device__ __forceinline__ void poison_rows(uint32_t* poison, int words_per_row, uint32_t rows,
                                            int d) {
  while (rows) {
    const int r = __ffs(rows) - 1;
    rows &= rows - 1u;
    atomicOr(&poison[r * words_per_row + (d >> 5)], 1u << (d & 31));
  }
}

// E4M3: decodes tile `tile` from its raw stage into its FP16 stage (natural dim order,
// swizzled rows). check_v: zero NaN V codes and poison the rows that select them.
template <KvKind KV, int D, Decoder DEC, bool kWg>
__device__ __forceinline__ void decode_tile(uint8_t* smem, int tile, bool patch_nan, bool check_v,
                                            const uint32_t* mask_slot, uint32_t* poison) {
  using L = GroupedSmem<KV, D, kWg>;
  constexpr int kGTile = L::kGTile;
  constexpr int kChunks = 2 * kGTile * L::kRawChunks;
  const uint8_t* raw = smem + L::kRaw + (tile % L::kStagesRaw) * L::kTileRaw;
  uint8_t* dst16 = smem + L::kKv16 + (tile % L::kStages16) * L::kTile16;
  for (int c = threadIdx.x; c < kChunks; c += blockDim.x) {
    const int j = c / (2 * L::kRawChunks);
    const int rem = c - j * 2 * L::kRawChunks;
    const int kv = rem / L::kRawChunks, part = rem - kv * L::kRawChunks;
    uint4 x = *reinterpret_cast<const uint4*>(raw + c * 16);
    uint32_t w[4] = {x.x, x.y, x.z, x.w};
    if (kv == 1 && check_v) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint32_t nan = nan_bits(w[i]);  // 0x80 in each NaN byte
        if (nan) {
#pragma unroll
          for (int b = 0; b < 4; ++b)
            if (nan & (0x80u << (8 * b)))
              poison_rows(poison, D / 32, mask_slot[j], part * 16 + 4 * i + b);
          w[i] &= ~((nan >> 7) * 0xFFu);  // NaN codes -> +0
        }
      }
    }
    uint32_t h[8];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      uint32_t even, odd;  // (b0, b2), (b1, b3)
      if (kv == 0 && patch_nan)
        decode4_exact<DEC>(w[i], even, odd);
      else
        decode4<DEC>(w[i], even, odd);
      h[2 * i] = prmt(even, odd, 0x5410u);      // (b0, b1)
      h[2 * i + 1] = prmt(even, odd, 0x7632u);  // (b2, b3)
    }
    uint8_t* row = dst16 + kv * (kGTile * D * 2);
    *reinterpret_cast<uint4*>(row + L::kv_chunk(j, 2 * part)) = make_uint4(h[0], h[1], h[2], h[3]);
    *reinterpret_cast<uint4*>(row + L::kv_chunk(j, 2 * part + 1)) =
        make_uint4(h[4], h[5], h[6], h[7]);
  }
}

// 16-bit caches where non-finite values may exist: zero non-finite V elements of tile
// `tile` in place and poison the rows that select them.
template <KvKind KV, int D, bool kWg>
__device__ __forceinline__ void check_tile_v(uint8_t* smem, int tile, const uint32_t* mask_slot,
                                             uint32_t* poison) {
  using L = GroupedSmem<KV, D, kWg>;
  constexpr int kGTile = L::kGTile;
  constexpr uint32_t kExp = KV == KvKind::kBf16 ? 0x7F80u : 0x7C00u;
  uint8_t* v = smem + L::kKv16 + (tile % L::kStages16) * L::kTile16 + kGTile * D * 2;
  for (int c = threadIdx.x; c < kGTile * L::kChunks16; c += blockDim.x) {
    const int j = c / L::kChunks16, part = c - j * L::kChunks16;
    uint16_t* e = reinterpret_cast<uint16_t*>(v + L::kv_chunk(j, part));
#pragma unroll
    for (int i = 0; i < 8; ++i)
      if ((e[i] & kExp) == kExp) {
        poison_rows(poison, D / 32, mask_slot[j], part * 8 + i);
        e[i] = 0;
      }
  }
}

// One warp's work on one tile: S = Q K^T for its 16 vectors, masking, online softmax,
// O += P V. State: m, l of rows g and g+8; o[n-tile][4].
template <KvKind KV, int D>
struct GroupedState {
  float m[2];
  float l[2];
  float o[D / 8][4];
};

// A warp's scores of one tile, s[nt][0..1]: row g, tokens 8nt + 2t4 + {0,1}; s[nt][2..3]:
// row g + 8 (the m16n8 accumulator layout, which wgmma's per-warp layout is too): masked per
// row, scaled, the running maxima and sums updated and the output rescaled where a maximum
// moved; s is left holding P = exp2(s - max).
template <int NT, KvKind KV, int D>
__device__ __forceinline__ void softmax_tile(float (&s)[NT][4], const uint32_t* mask_slot,
                                             uint32_t rbit0, uint32_t rbit1, float f0, float f1,
                                             GroupedState<KV, D>& st) {
  const int t4 = threadIdx.x & 3;
  float mx0 = -CUDART_INF_F, mx1 = -CUDART_INF_F;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const uint32_t mask = mask_slot[8 * nt + 2 * t4 + e];
      s[nt][e] = mask & rbit0 ? s[nt][e] * f0 : -CUDART_INF_F;
      s[nt][2 + e] = mask & rbit1 ? s[nt][2 + e] * f1 : -CUDART_INF_F;
      mx0 = fmaxf(mx0, s[nt][e]);
      mx1 = fmaxf(mx1, s[nt][2 + e]);
    }
#pragma unroll
  for (int d = 1; d < 4; d <<= 1) {
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, d));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, d));
  }
  const OnlineMax u0 = online_max(st.m[0], mx0), u1 = online_max(st.m[1], mx1);
  const float ref0 = u0.ref, ref1 = u1.ref, alpha0 = u0.alpha, alpha1 = u1.alpha;
  st.m[0] = u0.m;
  st.m[1] = u1.m;
  float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      s[nt][e] = fast_exp2(s[nt][e] - ref0);
      s[nt][2 + e] = fast_exp2(s[nt][2 + e] - ref1);
      sum0 += s[nt][e];
      sum1 += s[nt][2 + e];
    }
  st.l[0] = st.l[0] * alpha0 + sum0;  // this thread's columns; summed over the quad at the end
  st.l[1] = st.l[1] * alpha1 + sum1;
  // Once the running maxima settle, most tiles leave them unchanged: skip the 4D/8
  // multiplies then (warp-uniform, so no divergence).
  if (__any_sync(0xffffffffu, alpha0 != 1.0f || alpha1 != 1.0f)) {
#pragma unroll
    for (int i = 0; i < D / 8; ++i) {
      st.o[i][0] *= alpha0;
      st.o[i][1] *= alpha0;
      st.o[i][2] *= alpha1;
      st.o[i][3] *= alpha1;
    }
  }
}

// P's A fragment for k-step kk (the tile's tokens 16kk .. 16kk + 15) from softmax_tile's s.
template <bool kBf16, int NT>
__device__ __forceinline__ void pack_p(const float (&s)[NT][4], int kk, uint32_t (&a)[4]) {
  const float* lo = s[2 * kk];
  const float* hi = s[2 * kk + 1];
  a[0] = kBf16 ? pack_bf162(lo[0], lo[1]) : pack_half2(lo[0], lo[1]);
  a[1] = kBf16 ? pack_bf162(lo[2], lo[3]) : pack_half2(lo[2], lo[3]);
  a[2] = kBf16 ? pack_bf162(hi[0], hi[1]) : pack_half2(hi[0], hi[1]);
  a[3] = kBf16 ? pack_bf162(hi[2], hi[3]) : pack_half2(hi[2], hi[3]);
}

// Lane-constant byte offsets of a lane's ldmatrix rows within a swizzled 16-bit tile, for
// k-steps (or V column pairs) i = 4a + b: offset[b] + 128a. (The swizzle XORs the chunk's
// low three bits with row & 7 = lane & 7; chunks 2i + half for i = 4a + b are 8a +
// ((2b + half) ^ (lane & 7)).)
template <int D>
__device__ __forceinline__ void tile_lane_offsets(int row, int half, uint32_t (&off)[4]) {
  const int x = threadIdx.x & 7;
#pragma unroll
  for (int b = 0; b < 4; ++b)
    off[b] = static_cast<uint32_t>(row * D * 2 + ((2 * b + half) ^ x) * 16);
}

// Q's A fragments in each computing warp's own 8 KB of the Q area, as [k-step][lane]
// uint4: one conflict-free 16-byte load per k-step in the tile loop, at a compile-time
// offset (instead of an ldmatrix with swizzled addressing). In place: the warp reads all
// its fragments before it writes any.
template <KvKind KV, int D>
__device__ __forceinline__ void relayout_q(uint8_t* smem, int m0) {
  using L = GroupedSmem<KV, D>;
  const int lane = threadIdx.x & 31;
  uint32_t a[D / 16][4];
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks)
    ldmatrix_x4(
        a[ks],
        smem + L::kQ + swizzled_chunk<L::kChunks16>(m0 + (lane & 15), 2 * ks + (lane >> 4)) * 16);
  __syncwarp();
  uint4* qf = reinterpret_cast<uint4*>(smem + L::kQ + m0 * D * 2) + lane;
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks)
    qf[ks * 32] = make_uint4(a[ks][0], a[ks][1], a[ks][2], a[ks][3]);
  __syncwarp();
}

template <KvKind KV, int D>
__device__ __forceinline__ void compute_tile(const uint8_t* smem, int tile, int m0,
                                             const uint32_t* mask_slot, uint32_t rbit0,
                                             uint32_t rbit1, float f0, float f1,
                                             GroupedState<KV, D>& st) {
  using L = GroupedSmem<KV, D>;
  constexpr bool kBf16 = KV == KvKind::kBf16;
  constexpr int kSteps = D / 16;
  const int lane = threadIdx.x & 31;
  const uint4* qf = reinterpret_cast<const uint4*>(smem + L::kQ + m0 * D * 2) + lane;
  const uint32_t kt = smem_addr(smem + L::kKv16 + (tile % L::kStages16) * L::kTile16);
  const uint32_t vt = kt + L::kGTile * D * 2;

  // ---- S = Q K^T, the next k-step's K fragments loaded ahead ----
  uint32_t koff[4];
  tile_lane_offsets<D>((lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1, koff);
  float s[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
  uint32_t b[2][4];
  ldmatrix_x4_at(b[0], kt + koff[0]);
#pragma unroll
  for (int ks = 0; ks < kSteps; ++ks) {
    if (ks + 1 < kSteps)
      ldmatrix_x4_at(b[(ks + 1) & 1], kt + koff[(ks + 1) & 3] + ((ks + 1) >> 2) * 128);
    const uint4 q = qf[ks * 32];
    const uint32_t a[4] = {q.x, q.y, q.z, q.w};
    mma_16816<kBf16>(s[0], a, b[ks & 1][0], b[ks & 1][1]);
    mma_16816<kBf16>(s[1], a, b[ks & 1][2], b[ks & 1][3]);
  }
  softmax_tile(s, mask_slot, rbit0, rbit1, f0, f1, st);
  // The score fragments are P's A fragment for k = the tile's 16 tokens.
  uint32_t a[4];
  pack_p<kBf16>(s, 0, a);
  // ---- O += P V, the next column pair's V fragments loaded ahead ----
  uint32_t voff[4];
  tile_lane_offsets<D>((lane & 7) + (((lane >> 3) & 1) << 3), lane >> 4, voff);
  ldmatrix_x4_trans_at(b[0], vt + voff[0]);
#pragma unroll
  for (int j = 0; j < kSteps; ++j) {
    if (j + 1 < kSteps)
      ldmatrix_x4_trans_at(b[(j + 1) & 1], vt + voff[(j + 1) & 3] + ((j + 1) >> 2) * 128);
    mma_16816<kBf16>(st.o[2 * j], a, b[j & 1][0], b[j & 1][1]);
    mma_16816<kBf16>(st.o[2 * j + 1], a, b[j & 1][2], b[j & 1][3]);
  }
}

// The warpgroup path's work on one tile, for the 64 vectors of warpgroup wg (each warp's
// share as in compute_tile), in two calls so that the CTA can work between them:
// issue_scores_wg starts S = Q K^T on the tensor cores (Q and K read from shared memory);
// finish_tile_wg waits for it (and for the previous tile's P V), runs the softmax on S and
// starts O += P V with P from registers, which it leaves in flight: the caller waits before
// the V stage is overwritten, or the next finish_tile_wg does before it rescales O.
template <KvKind KV, int D>
__device__ __forceinline__ void issue_scores_wg(const uint8_t* smem, int tile, int wg,
                                                float (&s)[GroupedShape<true>::kTile / 8][4]) {
  using L = GroupedSmem<KV, D, true>;
  constexpr bool kBf16 = KV == KvKind::kBf16;
  constexpr int kTile = L::kGTile;
  constexpr int kQAtom = L::Shape::kSlots * 128, kKvAtom = kTile * 128;  // bytes per atom
  // The descriptors of k-step 0; k-step ks adds its byte offset / 16 (atom ks / 4, bytes
  // 32 (ks % 4) of a row), a constant: no descriptor arithmetic per MMA.
  const uint64_t q = sw128_desc(smem_addr(smem + L::kQ) + wg * 64 * 128, 16, 1024);
  const uint64_t k =
      sw128_desc(smem_addr(smem + L::kKv16 + (tile % L::kStages16) * L::kTile16), 16, 1024);
#pragma unroll
  for (int i = 0; i < kTile / 8; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks)
    wgmma_m64n32k16_ss<kBf16>(s, q + ((ks >> 2) * kQAtom + (ks & 3) * 32) / 16,
                              k + ((ks >> 2) * kKvAtom + (ks & 3) * 32) / 16);
  wgmma_commit();
}

template <KvKind KV, int D>
__device__ __forceinline__ void finish_tile_wg(const uint8_t* smem, int tile,
                                               const uint32_t* mask_slot, uint32_t rbit0,
                                               uint32_t rbit1, float f0, float f1,
                                               float (&s)[GroupedShape<true>::kTile / 8][4],
                                               GroupedState<KV, D>& st) {
  using L = GroupedSmem<KV, D, true>;
  constexpr bool kBf16 = KV == KvKind::kBf16;
  constexpr int kTile = L::kGTile;
  constexpr int kKvAtom = kTile * 128;
  // V as an N-major operand: dims 64n .. 64n + 63 are atom n (lead: the atom stride),
  // tokens 16kk .. 16kk + 15 its rows 16kk .. (2048 bytes a k-step).
  const uint64_t v =
      sw128_desc(smem_addr(smem + L::kKv16 + (tile % L::kStages16) * L::kTile16 + kTile * D * 2),
                 kKvAtom, 1024);
  wgmma_wait<0>();  // S, and the previous tile's P V
  pin_accumulators(s);
  pin_accumulators(st.o);
  softmax_tile(s, mask_slot, rbit0, rbit1, f0, f1, st);
  uint32_t a[kTile / 16][4];
#pragma unroll
  for (int kk = 0; kk < kTile / 16; ++kk) pack_p<kBf16>(s, kk, a[kk]);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kTile / 16; ++kk)
#pragma unroll
    for (int n = 0; n < D / 64; ++n)
      wgmma_m64n64k16_rs<kBf16>(*reinterpret_cast<float(*)[8][4]>(&st.o[8 * n]), a[kk],
                                v + (n * kKvAtom + kk * 16 * 128) / 16);
  wgmma_commit();
  pin_accumulators(st.o);
}

// Q of the CTA's vectors into shared memory by async copies (zeros for padding vectors);
// committed with the first tile's copies.
template <class Act, KvKind KV, int D, bool kWg>
__device__ __forceinline__ void issue_q(const GroupedParams& p, const GroupCta& c, uint8_t* smem) {
  using L = GroupedSmem<KV, D, kWg>;
  const int n = (blockDim.x >> 5) * 16 * L::kChunks16;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const int m = i / L::kChunks16, ch = i - m * L::kChunks16;
    const int r = m / p.in.group, h = m - r * p.in.group;
    const bool valid = m < p.vectors && r < c.rows;
    const Act* src = static_cast<const Act*>(p.in.q) +
                     (static_cast<int64_t>(c.row0 + (valid ? r : 0)) * p.in.q_heads +
                      c.kvh * p.in.group + (valid ? h : 0)) *
                         D +
                     ch * 8;
    copy16_async(smem + L::kQ + L::q_chunk(m, ch), src, valid);
  }
}

// Each vector's softmax factor, once Q has landed. BF16 queries against an E4M3 cache
// (FP16 MMAs) are first scaled by a power of two that puts the vector's largest element
// in [2^14, 2^15) (exact, in place), undone in its factor.
template <class Act, KvKind KV, int D, bool kWg>
__device__ __forceinline__ void prepare_q(uint8_t* smem, float base_factor) {
  using L = GroupedSmem<KV, D, kWg>;
  constexpr bool kScale = std::is_same<Act, __nv_bfloat16>::value && KV == KvKind::kE4M3;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  float* qfactor = reinterpret_cast<float*>(smem + L::kQFactor);
  for (int m = warp; m < warps * 16; m += warps) {
    float unscale = 1.0f;
    if constexpr (kScale) {
      constexpr int kPer = (L::kChunks16 + 31) / 32;
      uint4* row[kPer];
      float mx = 0.0f;
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        const int ch = lane + 32 * i;
        row[i] = reinterpret_cast<uint4*>(smem + L::kQ + L::q_chunk(m, ch));
        if (ch < L::kChunks16) {
          const uint4 x = *row[i];
          const uint32_t w[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[k]));
            mx = fmaxf(mx, fmaxf(fabsf(f.x), fabsf(f.y)));
          }
        }
      }
      const int shift = bf16_query_shift(mx);
      const float up = ldexpf(1.0f, shift);
      unscale = ldexpf(1.0f, -shift);
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        if (lane + 32 * i >= L::kChunks16) continue;
        const uint4 x = *row[i];
        uint32_t w[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[k]));
          w[k] = pack_half2(f.x * up, f.y * up);
        }
        *row[i] = make_uint4(w[0], w[1], w[2], w[3]);
      }
    }
    if (lane == 0) qfactor[m] = base_factor * unscale;
  }
}

// Where the output of the group's row r goes: its final output (v_factor applied), or,
// for a row with entries of its own on the decode route (bit r of partial_rows), its
// shared part as a partial: normalised, no V scale, with its base-2 LSE.
template <class Act, int D>
__device__ __forceinline__ void store_vector4(const GroupedParams& p, const GroupCta& c,
                                              uint32_t partial_rows, int m, int d, float4 o,
                                              float lse, float v_factor) {
  const int r = m / p.in.group, h = m - r * p.in.group;
  const int64_t oi = static_cast<int64_t>(c.row0 + r) * p.in.q_heads + c.kvh * p.in.group + h;
  if (partial_rows >> r & 1u) {
    *reinterpret_cast<float4*>(p.shared_out + oi * D + d) = o;
    if (d == 0) p.shared_lse[oi] = lse;
  } else {
    store_act4<Act>(static_cast<Act*>(p.in.out) + oi * D + d, o.x * v_factor, o.y * v_factor,
                    o.z * v_factor, o.w * v_factor);
  }
}

// The last CTA of a split group combines the splits' partials (normalised outputs and
// base-2 LSEs, per vector) into the output, or into the row's shared part (see
// store_vector4); weights as in the decode merge (lse_to_weights).
template <class Act, int D>
__device__ void merge_grouped_splits(const GroupedParams& p, const GroupCta& c, int64_t item0,
                                     uint32_t partial_rows, float v_factor,
                                     float* weights /* smem [96][splits + 1] */) {
  const int S = c.splits, SW = S + 1;  // w[S]: the vector's combined LSE
  const int vectors = min(p.vectors, c.rows * p.in.group);
  const int64_t pbase = (static_cast<int64_t>(c.kvh) * p.max_items + item0) * kGroupedMaxVectors;
  for (int i = threadIdx.x; i < vectors * S; i += blockDim.x) {
    const int m = i / S, s = i - m * S;
    weights[m * SW + s] =
        __ldcg(p.partial_lse + pbase + static_cast<int64_t>(s) * kGroupedMaxVectors + m);
  }
  __syncthreads();
  for (int m = threadIdx.x; m < vectors; m += blockDim.x)
    weights[m * SW + S] = lse_to_weights(weights + m * SW, S);
  __syncthreads();
  for (int idx = threadIdx.x; idx < vectors * (D / 4); idx += blockDim.x) {
    const int m = idx / (D / 4), d = (idx - m * (D / 4)) * 4;
    const float* w = weights + m * SW;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int s = 0; s < S; ++s) {
      const float4 v = __ldcg(reinterpret_cast<const float4*>(
          p.partial_out + ((pbase + static_cast<int64_t>(s) * kGroupedMaxVectors + m) * D + d)));
      acc.x += w[s] * v.x;
      acc.y += w[s] * v.y;
      acc.z += w[s] * v.z;
      acc.w += w[s] * v.w;
    }
    store_vector4<Act, D>(p, c, partial_rows, m, d, acc, w[S], v_factor);
  }
}

template <class Act, KvKind KV, int D, Decoder DEC, bool kWg = false>
__global__ void __launch_bounds__(GroupedShape<kWg>::kThreadsMax, GroupedShape<kWg>::kCtasPerSm)
    grouped_attention_kernel(const GroupedParams p) {
  using L = GroupedSmem<KV, D, kWg>;
  constexpr int kGTile = L::kGTile;
#if !QSAKV_WGMMA
  if constexpr (kWg) {  // sm_90a code only (the host launches it on SM90 alone)
    __trap();
    return;
  }
#endif
  extern __shared__ uint4 grouped_smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>(grouped_smem_raw);
  if constexpr (kWg)  // atom-major tiles start on 1024-byte boundaries (kBytes has the slack)
    smem += (1024u - (smem_addr(smem) & 1023u)) & 1023u;
  __shared__ int last_arrival;
  __shared__ uint32_t partial_rows_smem;  // bit r: row r also has entries of its own
  wait_for_predecessors();                // the union kernel's lists (dependent_launch.cuh)
  allow_dependents();

  // ---- coordinates: (group, split) from the launch's split count ----
  const int groups = p.in.header->num_groups;
  GroupCta c;
  c.splits = grouped_splits(p, groups);
  c.group = blockIdx.x / c.splits;
  c.split = blockIdx.x - c.group * c.splits;
  c.kvh = blockIdx.y;
  if (c.group >= groups) return;  // beyond this batch (graph replay) or this split count
  c.row0 = p.group_row0[c.group];
  c.rows = p.group_rows[c.group];
  c.pos0 = p.in.row_pos[c.row0];
  const int req = p.in.row_request[c.row0];
  c.bt = p.in.header->block_table + static_cast<int64_t>(req) * p.in.header->block_table_stride;
  c.ubase = static_cast<int64_t>(c.group) * p.union_cap;
  if (p.in.dense) {
    c.source = EntrySource::kDense;
    c.entries = c.pos0 + c.rows;
  } else {
    c.source = EntrySource::kUnion;
    c.entries = p.union_count[c.group];
    // Nothing shared: the decode route computes every row of the group whole.
    if (c.entries == 0) return;
  }
  const int tiles = (c.entries + kGTile - 1) / kGTile;
  c.tile0 = static_cast<int>(static_cast<int64_t>(tiles) * c.split / c.splits);
  c.tile1 = static_cast<int>(static_cast<int64_t>(tiles) * (c.split + 1) / c.splits);

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  int64_t* ent_off = reinterpret_cast<int64_t*>(smem + L::kEntOff);
  uint32_t* ent_mask = reinterpret_cast<uint32_t*>(smem + L::kEntMask);
  uint32_t* poison = reinterpret_cast<uint32_t*>(smem + L::kPoison);
  const float* qfactor = reinterpret_cast<const float*>(smem + L::kQFactor);

  const float k_scale = __ldg(p.in.scales), v_scale = __ldg(p.in.scales + 1);
  constexpr float kUnit = KV == KvKind::kE4M3 ? decoded_unit<DEC>() : 1.0f;
  // Where the layer may hold a NaN code (E4M3) or a non-finite value (16-bit caches).
  const bool flagged = *p.in.nan_flag != 0;
  const bool patch_k = KV == KvKind::kE4M3 && DEC == Decoder::kSoftware && flagged;

  // ---- prologue: Q, entries of the first four tiles, copies of the first three ----
  issue_q<Act, KV, D, kWg>(p, c, smem);
  constexpr int kSlots = L::Shape::kEntrySlots;
  Entry pending{-1, 0u, -1};  // warp 0: the entries of the tile kGEntryAhead ahead
  if (warp == 0) {
    // (Read here, used after the main loop: many barriers publish it.)
    const bool part = !p.in.dense && lane < c.rows && p.in.row_split[c.row0 + lane].x > 0;
    const uint32_t rows_with_own = __ballot_sync(0xffffffffu, part);
    if (lane == 0) partial_rows_smem = rows_with_own;
#pragma unroll
    for (int i = 0; i < kGEntryAhead; ++i)
      commit_entry<kGTile>(p, c, fetch_entry<kGTile>(p, c, c.tile0 + i),
                           ent_off + ((c.tile0 + i) % kSlots) * kGTile,
                           ent_mask + ((c.tile0 + i) % kSlots) * kGTile);
    pending = fetch_entry<kGTile>(p, c, c.tile0 + kGEntryAhead);
  }
  for (int i = threadIdx.x; i < kGroupedMaxRows * (D / 32); i += blockDim.x) poison[i] = 0u;
  __syncthreads();
#pragma unroll
  for (int i = 0; i < kGCopyStages; ++i)
    issue_tile<KV, D, kWg>(p, smem, c.tile0 + i, c.tile1, c.kvh,
                           ent_off + ((c.tile0 + i) % kSlots) * kGTile);
  copy_wait<kGCopyStages - 1>();  // Q and the first tile have landed
  __syncthreads();
  prepare_q<Act, KV, D, kWg>(smem, p.in.softmax_scale_log2 * k_scale * kUnit);
  const uint32_t* first_mask = ent_mask + (c.tile0 % kSlots) * kGTile;
  if (c.tile0 < c.tile1) {  // (an empty split copied nothing)
    if constexpr (KV == KvKind::kE4M3)
      decode_tile<KV, D, DEC, kWg>(smem, c.tile0, patch_k, flagged, first_mask, poison);
    else if (flagged)
      check_tile_v<KV, D, kWg>(smem, c.tile0, first_mask, poison);
  }
  if constexpr (kWg) fence_smem_for_wgmma();  // Q and the first tile, for the MMAs' reads
  __syncthreads();

  // ---- main loop ----
  // Warps whose vectors are all padding (a group shorter than rows_per_group) only copy
  // and decode: the MMAs of the others get their issue slots.
  const int m0 = warp * 16;
  const bool computes = m0 < min(p.vectors, c.rows * p.in.group);
  // The warpgroup path: all four warps of a warpgroup with a vector to compute issue its
  // MMAs (a warp of padding vectors too: its rows are masked, and it writes nothing).
  const bool wg_computes = (warp >> 2) * 64 < min(p.vectors, c.rows * p.in.group);
  if constexpr (!kWg)
    if (computes) relayout_q<KV, D>(smem, m0);
  const int v0 = m0 + g, v1 = m0 + g + 8;
  const int r0 = v0 / p.in.group, r1 = v1 / p.in.group;
  const uint32_t rbit0 = v0 < p.vectors && r0 < c.rows ? 1u << r0 : 0u;
  const uint32_t rbit1 = v1 < p.vectors && r1 < c.rows ? 1u << r1 : 0u;
  const float f0 = qfactor[v0], f1 = qfactor[v1];
  GroupedState<KV, D> st;
  st.m[0] = st.m[1] = -CUDART_INF_F;
  st.l[0] = st.l[1] = 0.0f;
#pragma unroll
  for (int i = 0; i < D / 8; ++i) st.o[i][0] = st.o[i][1] = st.o[i][2] = st.o[i][3] = 0.0f;

  if constexpr (kWg && KV == KvKind::kE4M3) {
    // One barrier per tile: the scores of `tile` are computed by the tensor cores while the
    // CTA decodes tile + 1, and its P V while the CTA waits at the next barrier.
    float s[kGTile / 8][4];
    for (int tile = c.tile0; tile < c.tile1; ++tile) {
      if (wg_computes) wgmma_wait<0>();  // P V of tile - 1 (its V stage is decoded into next)
      copy_wait<kGCopyStages - 2>();     // tile + 1's raw copies (this thread's)
      fence_smem_for_wgmma();            // tile's decoded FP16, for the MMAs' reads
      __syncthreads();
      if (warp == 0) {  // tile + 4's entries: every read of the slot's old tile is done
        commit_entry<kGTile>(p, c, pending, ent_off + ((tile + kGEntryAhead) % kSlots) * kGTile,
                             ent_mask + ((tile + kGEntryAhead) % kSlots) * kGTile);
        pending = fetch_entry<kGTile>(p, c, tile + kGEntryAhead + 1);
      }
      if (wg_computes) issue_scores_wg<KV, D>(smem, tile, warp >> 2, s);
      if (tile + 1 < c.tile1)
        decode_tile<KV, D, DEC, kWg>(smem, tile + 1, patch_k, flagged,
                                     ent_mask + ((tile + 1) % kSlots) * kGTile, poison);
      issue_tile<KV, D, kWg>(p, smem, tile + kGCopyStages, c.tile1, c.kvh,
                             ent_off + ((tile + kGCopyStages) % kSlots) * kGTile);
      if (wg_computes)
        finish_tile_wg<KV, D>(smem, tile, ent_mask + (tile % kSlots) * kGTile, rbit0, rbit1, f0, f1,
                              s, st);
    }
  } else {
    for (int tile = c.tile0; tile < c.tile1; ++tile) {
      const uint32_t* mask = ent_mask + (tile % kSlots) * kGTile;
      if constexpr (kWg) {
        if (wg_computes) {
          float s[kGTile / 8][4];
          issue_scores_wg<KV, D>(smem, tile, warp >> 2, s);
          finish_tile_wg<KV, D>(smem, tile, mask, rbit0, rbit1, f0, f1, s, st);
          // 16-bit tiles land in place: the next copies overwrite the stage P V reads.
          wgmma_wait<0>();
        }
      } else if (computes) {
        compute_tile<KV, D>(smem, tile, m0, mask, rbit0, rbit1, f0, f1, st);
      }
      copy_wait<kGCopyStages - 2>();  // tile + 1 has landed (this thread's copies)
      if constexpr (kWg) fence_smem_for_wgmma();
      __syncthreads();  // everyone's copies; everyone is done with `tile`
      const uint32_t* next_mask = ent_mask + ((tile + 1) % kSlots) * kGTile;
      if constexpr (KV == KvKind::kE4M3) {
        if (tile + 1 < c.tile1)
          decode_tile<KV, D, DEC, kWg>(smem, tile + 1, patch_k, flagged, next_mask, poison);
      } else if (flagged && tile + 1 < c.tile1) {
        check_tile_v<KV, D, kWg>(smem, tile + 1, next_mask, poison);
      }
      issue_tile<KV, D, kWg>(p, smem, tile + kGCopyStages, c.tile1, c.kvh,
                             ent_off + ((tile + kGCopyStages) % kSlots) * kGTile);
      if (warp == 0) {
        commit_entry<kGTile>(p, c, pending, ent_off + ((tile + kGEntryAhead) % kSlots) * kGTile,
                             ent_mask + ((tile + kGEntryAhead) % kSlots) * kGTile);
        pending = fetch_entry<kGTile>(p, c, tile + kGEntryAhead + 1);
      }
      if (KV == KvKind::kE4M3 || flagged) {  // the next tile's FP16 is written
        if constexpr (kWg) fence_smem_for_wgmma();
        __syncthreads();
      }
    }
  }
  copy_wait<0>();
  if constexpr (kWg) {
    wgmma_wait<0>();  // the last tile's P V
    pin_accumulators(st.o);
  }

  // ---- this split's result ----
  st.l[0] += __shfl_xor_sync(0xffffffffu, st.l[0], 1);
  st.l[0] += __shfl_xor_sync(0xffffffffu, st.l[0], 2);
  st.l[1] += __shfl_xor_sync(0xffffffffu, st.l[1], 1);
  st.l[1] += __shfl_xor_sync(0xffffffffu, st.l[1], 2);
  const float v_factor = v_scale * kUnit;
  const uint32_t partial_rows = partial_rows_smem;
  const bool part0 = rbit0 & partial_rows, part1 = rbit1 & partial_rows;
  auto lse = [&](int i) { return state_lse(st.m[i], st.l[i]); };
  // This thread's normalised outputs of vectors v0 and v1 for dims d, d + 1 of n-tile i,
  // a non-finite V element's dims NaN (a poisoned dim stays NaN through any merge).
  auto normalised = [&](int i, float2& a, float2& b) {
    const int d = 8 * i + 2 * t4;
    const float n0 = st.l[0] != 0.0f ? 1.0f / st.l[0] : 0.0f;
    const float n1 = st.l[1] != 0.0f ? 1.0f / st.l[1] : 0.0f;
    a = make_float2(st.o[i][0] * n0, st.o[i][1] * n0);
    b = make_float2(st.o[i][2] * n1, st.o[i][3] * n1);
    if (flagged) {
      const uint32_t w0 = rbit0 ? poison[r0 * (D / 32) + (d >> 5)] : 0u;
      const uint32_t w1 = rbit1 ? poison[r1 * (D / 32) + (d >> 5)] : 0u;
      if (w0 & (1u << (d & 31))) a.x = CUDART_NAN_F;
      if (w0 & (2u << (d & 31))) a.y = CUDART_NAN_F;
      if (w1 & (1u << (d & 31))) b.x = CUDART_NAN_F;
      if (w1 & (2u << (d & 31))) b.y = CUDART_NAN_F;
    }
  };
  __syncthreads();  // Q's shared memory becomes the output staging
  if (c.splits == 1) {
    // Final outputs through shared memory (16-byte stores); a row with entries of its own
    // gets its shared part as a partial, straight from registers.
    if (computes) {
      const int64_t oi0 = static_cast<int64_t>(c.row0 + r0) * p.in.q_heads + c.kvh * p.in.group +
                          (v0 - r0 * p.in.group);
      const int64_t oi1 = static_cast<int64_t>(c.row0 + r1) * p.in.q_heads + c.kvh * p.in.group +
                          (v1 - r1 * p.in.group);
#pragma unroll
      for (int i = 0; i < D / 8; ++i) {
        const int d = 8 * i + 2 * t4;
        float2 a, b;
        normalised(i, a, b);
        if (part0)
          *reinterpret_cast<float2*>(p.shared_out + oi0 * D + d) = a;
        else {
          Act* s0 =
              reinterpret_cast<Act*>(smem + L::kQ + swizzled_chunk<L::kChunks16>(v0, i) * 16) +
              2 * t4;
          s0[0] = from_float<Act>(a.x * v_factor);
          s0[1] = from_float<Act>(a.y * v_factor);
        }
        if (part1)
          *reinterpret_cast<float2*>(p.shared_out + oi1 * D + d) = b;
        else {
          Act* s1 =
              reinterpret_cast<Act*>(smem + L::kQ + swizzled_chunk<L::kChunks16>(v1, i) * 16) +
              2 * t4;
          s1[0] = from_float<Act>(b.x * v_factor);
          s1[1] = from_float<Act>(b.y * v_factor);
        }
      }
      if (t4 == 0 && part0) p.shared_lse[oi0] = lse(0);
      if (t4 == 0 && part1) p.shared_lse[oi1] = lse(1);
    }
    __syncthreads();
    const int vectors = min(p.vectors, c.rows * p.in.group);
    for (int idx = threadIdx.x; idx < vectors * L::kChunks16; idx += blockDim.x) {
      const int m = idx / L::kChunks16, ch = idx - m * L::kChunks16;
      const int r = m / p.in.group, h = m - r * p.in.group;
      if (partial_rows >> r & 1u) continue;
      uint4* o = reinterpret_cast<uint4*>(
          static_cast<Act*>(p.in.out) +
          (static_cast<int64_t>(c.row0 + r) * p.in.q_heads + c.kvh * p.in.group + h) * D);
      o[ch] =
          *reinterpret_cast<const uint4*>(smem + L::kQ + swizzled_chunk<L::kChunks16>(m, ch) * 16);
    }
    return;
  }

  // ---- split-K: partials, then the last CTA of (group, KV head) merges ----
  const int64_t item0 = static_cast<int64_t>(c.group) * c.splits;
  const int64_t pbase =
      (static_cast<int64_t>(c.kvh) * p.max_items + item0 + c.split) * kGroupedMaxVectors;
  if (computes) {
#pragma unroll
    for (int i = 0; i < D / 8; ++i) {
      const int d = 8 * i + 2 * t4;
      float2 a, b;
      normalised(i, a, b);
      *reinterpret_cast<float2*>(p.partial_out + (pbase + v0) * D + d) = a;
      *reinterpret_cast<float2*>(p.partial_out + (pbase + v1) * D + d) = b;
    }
    if (t4 == 0) {
      p.partial_lse[pbase + v0] = lse(0);
      p.partial_lse[pbase + v1] = lse(1);
    }
  }
  int32_t* counter = p.counters + static_cast<int64_t>(c.kvh) * p.max_groups + c.group;
  if (!arrive_last(counter, c.splits, last_arrival)) return;
  merge_grouped_splits<Act, D>(p, c, item0, partial_rows, v_factor,
                               reinterpret_cast<float*>(smem + L::kQ));
}

}  // namespace cuda
}  // namespace qsakv
