// SPDX-License-Identifier: Apache-2.0
// The SM70 tier of decode attention: the same CTAs, splits, token windows, warp merge and
// split merge as decode_attention.cuh (whose helpers it uses), with the tile arithmetic
// on CUDA cores in FP32 instead of tensor cores (SM70 has neither m16n8k16 nor
// movmatrix). Chosen for simplicity and exactness, not speed: V100 users get a correct
// path, and forcing this tier on an SM75+ GPU tests the V100 code path.
//
// Per warp, tiles of 32 tokens of the window:
//   S = Q K^T: lane l scores token l of the tile against the chunk's 8 query heads,
//     reading its token's K row with 16-byte loads and Q (FP32) from shared memory.
//   online softmax (base 2) per head over the tile (warp max), P to shared memory;
//   O += P V: lane l owns D/32 consecutive output dims of every head and walks the
//     tile's tokens, reading each token's V dims (the warp reads the whole row).
//
// Numerics as the SM75+ tier (DOMAIN.md section 3): E4M3 decoded exactly by the
// software (bitcast) decoder to FP16 and then FP32 (values code/256, undone in the K
// factor and V scale); products of 16-bit values are exact in FP32, sums are FP32; P is
// rounded to 16 bits for P.V as the tensor-core tier rounds it for its MMA (l sums the
// unrounded P, as there). NaN codes: a NaN K code gives NaN scores for the token, which
// poison the rows' softmax; a NaN V code gives NaN in its output dim only.
// BF16 activations and caches are converted to FP32 exactly, so this tier supports them
// on every GPU (no BF16 arithmetic is used).
#pragma once

#include <math_constants.h>
#include <stdint.h>

#include "cuda/decode_attention.cuh"

namespace qsakv {
namespace cuda {

constexpr int kSimtTile = 32;  // tokens per warp tile: one per lane for Q.K

template <KvKind KV, int D>
struct SimtShape {
  static constexpr int kBytes = KV == KvKind::kE4M3 ? 1 : 2;
  static constexpr int kKChunks = D * kBytes / 16;  // 16-byte loads per K row
  static constexpr int kChunkDims = 16 / kBytes;    // dims per 16-byte load
  static constexpr int kVDims = D / 32;             // output dims per lane
  static constexpr int kVBytes = kVDims * kBytes;   // 2..16 bytes of a V row per lane
  static constexpr int kVWords = (kVBytes + 3) / 4;
};

template <int D>
struct alignas(16) SimtLoopSmem {
  float q[kHeadsPerCta][D];                  // the chunk's queries in FP32 (0 beyond the group)
  float p[kWarps][kHeadsPerCta][kSimtTile];  // a warp's tile probabilities, 16-bit rounded
  union {
    int64_t offsets[kWindow];
    int32_t warp_totals[kWarps];
  } win;
};

// The loop's storage and the warp merge's (and the split weights') share shared memory:
// D = 256 takes 33 KB, so two CTAs fit in a V100 SM's 96 KB.
template <int D>
union SimtSmem {
  SimtLoopSmem<D> loop;
  MergeSmem<D> merge;
};

// The FP16 values in the low and high halves of a word (no address taken: registers).
__device__ __forceinline__ float half_lo(uint32_t w) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(w & 0xFFFFu)));
}
__device__ __forceinline__ float half_hi(uint32_t w) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(w >> 16)));
}

// Cache words -> FP32 values in dim order, the first N of them. E4M3: 4 codes per word,
// in units of 1/256 (the software decoder); FP16 / BF16: 2 values per word.
template <KvKind KV, bool kPatchNaN, int N, int W>
__device__ __forceinline__ void words_to_floats(const uint32_t (&w)[W], float (&out)[N]) {
  if constexpr (KV == KvKind::kE4M3) {
#pragma unroll
    for (int i = 0; i < W; ++i) {
      uint32_t even, odd;  // (b0, b2), (b1, b3) as FP16 pairs
      if constexpr (kPatchNaN)
        decode4_exact<Decoder::kSoftware>(w[i], even, odd);
      else
        decode4<Decoder::kSoftware>(w[i], even, odd);
      const float f[4] = {half_lo(even), half_lo(odd), half_hi(even), half_hi(odd)};
#pragma unroll
      for (int j = 0; j < 4; ++j)
        if (4 * i + j < N) out[4 * i + j] = f[j];
    }
  } else {
#pragma unroll
    for (int i = 0; i < W; ++i) {
      float lo, hi;
      if constexpr (KV == KvKind::kBf16) {
        lo = __uint_as_float(w[i] << 16);  // BF16 -> FP32 is a shift
        hi = __uint_as_float(w[i] & 0xFFFF0000u);
      } else {
        lo = half_lo(w[i]);
        hi = half_hi(w[i]);
      }
      if (2 * i < N) out[2 * i] = lo;
      if (2 * i + 1 < N) out[2 * i + 1] = hi;
    }
  }
}

// This lane's kVBytes of a V row (aligned to their size: the row starts 16-byte aligned).
template <int Bytes>
__device__ __forceinline__ void load_v_words(uint32_t (&w)[(Bytes + 3) / 4], const uint8_t* p) {
  if constexpr (Bytes == 2) {
    w[0] = __ldg(reinterpret_cast<const unsigned short*>(p));
  } else if constexpr (Bytes == 4) {
    w[0] = __ldg(reinterpret_cast<const unsigned int*>(p));
  } else {
    load_words(w, p);  // 8 or 16 bytes
  }
}

// The P.V operand precision of the tensor-core tier: FP16, or BF16 for BF16 caches.
template <KvKind KV>
__device__ __forceinline__ float round_probability(float x) {
  if constexpr (KV == KvKind::kBf16)
    return __bfloat162float(__float2bfloat16_rn(x));
  else
    return __half2float(__float2half_rn(x));
}

// A warp's online-softmax state: m is warp-uniform; l is this lane's share (summed over
// the warp at the end: alpha is uniform, so the sum of shares is the sum); o holds this
// lane's kVDims output dims of every head.
template <int D>
struct SimtState {
  float m[kHeadsPerCta];
  float l[kHeadsPerCta];
  float o[kHeadsPerCta][D / 32];
};

// One tile of up to 32 tokens (offsets[0..count)) for one warp.
template <KvKind KV, int D, bool kPatchNaN>
__device__ __forceinline__ void simt_tile(const int64_t* offsets, int count, const uint8_t* kbase,
                                          const uint8_t* vbase, const SimtLoopSmem<D>& sm,
                                          float (&p_tile)[kHeadsPerCta][kSimtTile], float factor,
                                          SimtState<D>& st) {
  using S = SimtShape<KV, D>;
  const int lane = threadIdx.x & 31;
  // ---- S = Q K^T, one token per lane ----
  float s[kHeadsPerCta];
#pragma unroll
  for (int h = 0; h < kHeadsPerCta; ++h) s[h] = 0.0f;
  if (lane < count) {
    const uint8_t* krow = kbase + offsets[lane];
#pragma unroll
    for (int c = 0; c < S::kKChunks; ++c) {
      // Through L1 (not ld_stream16's no-allocate): a lane reads its row in 16-byte
      // pieces, so the second half of each 32-byte sector is an L1 hit, not an L2 trip.
      const uint4 v = __ldg(reinterpret_cast<const uint4*>(krow) + c);
      const uint32_t w[4] = {v.x, v.y, v.z, v.w};
      float k[S::kChunkDims];
      words_to_floats<KV, kPatchNaN>(w, k);
#pragma unroll
      for (int h = 0; h < kHeadsPerCta; ++h) {
        const float* q = &sm.q[h][c * S::kChunkDims];
#pragma unroll
        for (int i = 0; i < S::kChunkDims; ++i) s[h] = fmaf(q[i], k[i], s[h]);
      }
    }
#pragma unroll
    for (int h = 0; h < kHeadsPerCta; ++h) s[h] *= factor;
  } else {
#pragma unroll
    for (int h = 0; h < kHeadsPerCta; ++h) s[h] = -CUDART_INF_F;  // no token: weight 0
  }

  // ---- online softmax (base 2), as tile_softmax_pv in decode_attention.cuh ----
#pragma unroll
  for (int h = 0; h < kHeadsPerCta; ++h) {
    const float mx = warp_max(s[h]);  // fmaxf ignores NaN: a NaN score lives on in l and o
    const OnlineMax u = online_max(st.m[h], mx);
    st.m[h] = u.m;
    const float pr = fast_exp2(s[h] - u.ref);
    st.l[h] = st.l[h] * u.alpha + pr;
#pragma unroll
    for (int j = 0; j < S::kVDims; ++j) st.o[h][j] *= u.alpha;
    p_tile[h][lane] = round_probability<KV>(pr);
  }
  __syncwarp();

  // ---- O += P V: this lane's dims of every head, token by token ----
  const uint8_t* vlane = vbase + lane * S::kVBytes;
#pragma unroll 4
  for (int t = 0; t < count; ++t) {
    uint32_t w[S::kVWords];
    load_v_words<S::kVBytes>(w, vlane + offsets[t]);
    float v[S::kVDims];
    words_to_floats<KV, kPatchNaN>(w, v);
#pragma unroll
    for (int h = 0; h < kHeadsPerCta; ++h) {
      const float ph = p_tile[h][t];
#pragma unroll
      for (int j = 0; j < S::kVDims; ++j) st.o[h][j] = fmaf(ph, v[j], st.o[h][j]);
    }
  }
  __syncwarp();  // p_tile is rewritten by the next tile
}

template <KvKind KV, int D, bool kPatchNaN>
__device__ __forceinline__ void simt_window(SimtLoopSmem<D>& sm, int n, int warp,
                                            const uint8_t* kbase, const uint8_t* vbase,
                                            float factor, SimtState<D>& st) {
  for (int base = warp * kSimtTile; base < n; base += kWarps * kSimtTile)
    simt_tile<KV, D, kPatchNaN>(sm.win.offsets + base, min(kSimtTile, n - base), kbase, vbase, sm,
                                sm.p[warp], factor, st);
}

template <class Act, KvKind KV, int D>
__global__ void __launch_bounds__(kThreads, kAttentionCtasPerSm)
    decode_attention_simt_kernel(const DecodeParams p) {
  using S = SimtShape<KV, D>;
  __shared__ SimtSmem<D> smem;
  __shared__ int last_arrival;
  SimtLoopSmem<D>& sm = smem.loop;

  const DecodeCta cta = decode_cta(p);  // the same grid as decode_attention_kernel
  const int split = cta.split, chunk = cta.chunk, kvh = cta.kvh, row = cta.row;
  if (row >= p.header->num_rows) return;  // rows beyond this batch (graph replay)
  // The SM70 tier has no grouped route (its plans make no groups): a guard, not a path.
  if (p.skip_grouped && p.row_group[row] >= 0) return;

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int req = p.row_request[row];
  const int pos = p.row_pos[row];
  const int32_t* bt =
      p.header->block_table + static_cast<int64_t>(req) * p.header->block_table_stride;

  // The chunk's queries in FP32 (exact for FP16 and BF16); heads beyond the group are 0.
  for (int i = threadIdx.x; i < kHeadsPerCta * D; i += kThreads) {
    const int h = i / D, d = i % D;
    const int hl = chunk * kHeadsPerCta + h;
    float x = 0.0f;
    if (hl < p.group)
      x = to_float<Act>(static_cast<const Act*>(
          p.q)[(static_cast<int64_t>(row) * p.q_heads + kvh * p.group + hl) * D + d]);
    sm.q[h][d] = x;
  }
  // (compact_window's first barrier publishes sm.q before any tile reads it)

  const float k_scale = __ldg(p.scales), v_scale = __ldg(p.scales + 1);
  constexpr float kUnit = KV == KvKind::kE4M3 ? decoded_unit<Decoder::kSoftware>() : 1.0f;
  const float factor = p.softmax_scale_log2 * k_scale * kUnit;
  const bool patch_nan = KV == KvKind::kE4M3 && *p.nan_flag != 0;

  SimtState<D> st;
#pragma unroll
  for (int h = 0; h < kHeadsPerCta; ++h) {
    st.m[h] = -CUDART_INF_F;
    st.l[h] = 0.0f;
#pragma unroll
    for (int j = 0; j < S::kVDims; ++j) st.o[h][j] = 0.0f;
  }

  const int n_cols = p.dense ? pos + 1 : p.topk_width;
  const int per_split = (n_cols + p.num_splits - 1) / p.num_splits;
  const int c0 = split * per_split;
  const int c1 = min(n_cols, c0 + per_split);
  const uint8_t* kbase = p.kv;
  const uint8_t* vbase = p.kv + p.stride_kv;

  for (int win = c0; win < c1; win += kWindow) {
    const int n = compact_window(p, sm.win.offsets, sm.win.warp_totals,
                                 p.topk + static_cast<int64_t>(row) * p.topk_stride, kvh, pos, bt,
                                 win, min(c1, win + kWindow));
    if (patch_nan)
      simt_window<KV, D, true>(sm, n, warp, kbase, vbase, factor, st);
    else
      simt_window<KV, D, false>(sm, n, warp, kbase, vbase, factor, st);
  }

  // ---- merge the 4 warps (finish_cta, shared with the tensor-core tier) ----
#pragma unroll
  for (int h = 0; h < kHeadsPerCta; ++h)
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) st.l[h] += __shfl_xor_sync(0xffffffffu, st.l[h], d);
  __syncthreads();  // every warp is done with the loop's storage (the merge reuses it)
  MergeSmem<D>& ms = smem.merge;
  if (lane == 0) {
#pragma unroll
    for (int h = 0; h < kHeadsPerCta; ++h) {
      ms.m[warp][h] = st.m[h];
      ms.l[warp][h] = st.l[h];
    }
  }
#pragma unroll
  for (int h = 0; h < kHeadsPerCta; ++h)
#pragma unroll
    for (int j = 0; j < S::kVDims; ++j) ms.o[warp][h][lane * S::kVDims + j] = st.o[h][j];
  __syncthreads();
  finish_cta<Act, D>(p, ms, row, kvh, chunk, split, v_scale * kUnit, false, last_arrival,
                     reinterpret_cast<float*>(&smem));
}

}  // namespace cuda
}  // namespace qsakv
