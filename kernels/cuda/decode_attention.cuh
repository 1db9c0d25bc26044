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
// is free, so each thread owns a contiguous span of K dims (and of V/output dims) and
// Q's fragments are permuted to match (see kv_span / q fragments below).
//
// Numerics (DOMAIN.md section 3): the K scale sits in the base-2 softmax factor, the V
// scale is applied once to the normalised output (after the split merge), probabilities
// stay 16-bit for P.V, and Q.K accumulates in FP32.
#pragma once

#include <math_constants.h>
#include <stdint.h>

#include <type_traits>

#include "core/params.hpp"
#include "cuda/common.cuh"
#include "cuda/e4m3_decode.cuh"
#include "cuda/mma.cuh"

namespace qsakv {
namespace cuda {

enum class KvKind { kE4M3 = 0, kFp16 = 1, kBf16 = 2 };

struct DecodeParams {
  const PlanMetaHeader* header;
  const int32_t* row_request;
  const int32_t* row_pos;
  const uint8_t* kv;        // the layer's main cache
  int64_t stride_block;     // bytes
  int64_t stride_kv;        // bytes
  int64_t stride_token;     // bytes
  int64_t stride_head;      // bytes
  int32_t block_size;
  int64_t num_blocks;
  const float* scales;      // device [k_scale, v_scale]
  const void* q;            // [rows, q_heads, D]
  void* out;                // [rows, q_heads, D]
  int32_t q_heads;
  int32_t group;            // query heads per KV head
  int32_t kv_heads;
  int32_t head_chunks;      // ceil(group / 8)
  float softmax_scale_log2; // softmax_scale * log2(e)
  int32_t dense;
  const int32_t* topk;
  int64_t topk_stride;
  int32_t topk_width;
  int32_t num_splits;
  float* partial_out;       // [max_rows, q_heads, splits, D]
  float* partial_lse;       // [max_rows, q_heads, splits]
};

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kWindow = 1024;  // token-list entries compacted per prologue
constexpr int kHeadsPerCta = 8;

template <KvKind KV, int D>
struct Shape {
  static constexpr int kBytes = KV == KvKind::kE4M3 ? 1 : 2;
  static constexpr int kKSteps = D / 16;                // MMA k-steps over head dims
  static constexpr int kMTiles = D / 16;                // MMA m-tiles over output dims
  static constexpr int kKWords = D * kBytes / 16;       // K words per token per thread
  static constexpr int kVWords = D * kBytes / 32;       // V words per token per thread
  static constexpr int kKSpan = D / 4;                  // K dims per thread (by lane % 4)
  static constexpr int kVSpan = D / 8;                  // V/out dims per thread (by lane / 4)
  static constexpr bool kBf16Mma = KV == KvKind::kBf16;
};

template <int D>
struct alignas(16) MergeSmem {
  float m[kWarps][kHeadsPerCta];
  float l[kWarps][kHeadsPerCta];
  float o[kWarps][kHeadsPerCta][D];
};

template <int D>
union DecodeSmem {
  int64_t offsets[kWindow];
  MergeSmem<D> merge;
  int32_t warp_totals[kWarps];
};

// Compacts the valid tokens of list entries [begin, end) into smem offsets (bytes of the
// token's K row for this KV head). Returns the count; all threads agree.
__device__ __forceinline__ int compact_window(const DecodeParams& p, int64_t* offsets,
                                              int32_t* warp_totals, int row, int kvh,
                                              int pos, const int32_t* bt, int begin, int end) {
  constexpr int kPer = kWindow / kThreads;
  const int tid = threadIdx.x;
  __syncthreads();  // every warp is done with the previous window's offsets
  int64_t off[kPer];
  uint32_t valid_mask = 0;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int col = begin + i * kThreads + tid;
    off[i] = 0;
    if (col < end) {
      const int t = p.dense ? col : __ldg(p.topk + static_cast<int64_t>(row) * p.topk_stride + col);
      if (t >= 0 && t <= pos) {
        const int32_t phys = __ldg(bt + t / p.block_size);
        if (phys >= 0 && phys < p.num_blocks) {
          off[i] = phys * p.stride_block + static_cast<int64_t>(t % p.block_size) * p.stride_token +
                   kvh * p.stride_head;
          valid_mask |= 1u << i;
        }
      }
    }
  }
  // Block-wide exclusive scan of the per-thread counts.
  const int count = __popc(valid_mask);
  const int lane = tid & 31, warp = tid >> 5;
  int incl = count;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const int v = __shfl_up_sync(0xffffffffu, incl, d);
    if (lane >= d) incl += v;
  }
  if (lane == 31) warp_totals[warp] = incl;
  __syncthreads();
  int base = incl - count, total = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    const int t = warp_totals[w];
    if (w < warp) base += t;
    total += t;
  }
  __syncthreads();  // warp_totals shares storage with offsets
#pragma unroll
  for (int i = 0; i < kPer; ++i)
    if (valid_mask & (1u << i)) offsets[base++] = off[i];
  __syncthreads();
  return total;
}

template <class Act, KvKind KV, int D, Decoder DEC>
__global__ void __launch_bounds__(kThreads, 2) decode_attention_kernel(const DecodeParams p) {
  using S = Shape<KV, D>;
  __shared__ DecodeSmem<D> smem;

  const int split = blockIdx.y;
  int bx = blockIdx.x;
  const int chunk = bx % p.head_chunks;
  bx /= p.head_chunks;
  const int kvh = bx % p.kv_heads;
  const int row = bx / p.kv_heads;
  if (row >= p.header->num_rows) return;  // rows beyond this batch (graph replay)

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const int req = p.row_request[row];
  const int pos = p.row_pos[row];
  const int32_t* bt = p.header->block_table + static_cast<int64_t>(req) * p.header->block_table_stride;

  // ---- Q fragments (B operand of S^T = K Q^T), permuted to this thread's K span ----
  const int head_local = chunk * kHeadsPerCta + g;
  const bool has_head = head_local < p.group;
  const int q_head = kvh * p.group + head_local;
  uint32_t qraw[S::kKSpan / 2];  // this thread's K-span dims of Q, two per word
  if (has_head) {
    const Act* qp = static_cast<const Act*>(p.q) + (static_cast<int64_t>(row) * p.q_heads + q_head) * D +
                    t4 * S::kKSpan;
#pragma unroll
    for (int i = 0; i < S::kKSpan / 8; ++i) {
      const uint4 v = __ldg(reinterpret_cast<const uint4*>(qp) + i);
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
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, d));
    int e = 0;
    if (mx > 0.0f && isfinite(mx)) frexpf(mx, &e);  // mx in [2^(e-1), 2^e)
    const int shift = 15 - e;
    const float up = ldexpf(1.0f, shift);
    q_unscale = ldexpf(1.0f, -shift);
#pragma unroll
    for (int i = 0; i < S::kKSpan / 2; ++i) {
      const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&qraw[i]));
      qraw[i] = pack_half2(f.x * up, f.y * up);
    }
  }
  uint32_t qb[S::kKSteps][2];
#pragma unroll
  for (int s = 0; s < S::kKSteps; ++s) {
    if constexpr (KV == KvKind::kE4M3) {
      // K word s holds dims 4s..4s+3 of the span; the decoder pairs (0,2) and (1,3).
      qb[s][0] = prmt(qraw[2 * s], qraw[2 * s + 1], 0x5410u);
      qb[s][1] = prmt(qraw[2 * s], qraw[2 * s + 1], 0x7632u);
    } else {
      qb[s][0] = qraw[2 * s];      // dims 4s, 4s+1
      qb[s][1] = qraw[2 * s + 1];  // dims 4s+2, 4s+3
    }
  }

  const float k_scale = __ldg(p.scales), v_scale = __ldg(p.scales + 1);
  constexpr float kUnit = KV == KvKind::kE4M3 ? decoded_unit<DEC>() : 1.0f;
  const float factor = p.softmax_scale_log2 * k_scale * kUnit * q_unscale;

  float m[2] = {-CUDART_INF_F, -CUDART_INF_F};
  float l[2] = {0.0f, 0.0f};
  float o[S::kMTiles][4];
#pragma unroll
  for (int i = 0; i < S::kMTiles; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;

  const int n_cols = p.dense ? pos + 1 : p.topk_width;
  const int per_split = (n_cols + p.num_splits - 1) / p.num_splits;
  const int c0 = split * per_split;
  const int c1 = min(n_cols, c0 + per_split);
  const uint8_t* kbase = p.kv;
  const uint8_t* vbase = p.kv + p.stride_kv;

  for (int win = c0; win < c1; win += kWindow) {
    const int n = compact_window(p, smem.offsets, smem.warp_totals, row, kvh, pos, bt, win,
                                 min(c1, win + kWindow));
    const int tiles = (n + 15) >> 4;
    for (int tile = warp; tile < tiles; tile += kWarps) {
      const int base = tile << 4;
      // ---- loads: K rows of tokens g, g+8; V rows of tokens 2t4, 2t4+1, 2t4+8, 2t4+9 ----
      const bool kv0 = base + g < n, kv1 = base + g + 8 < n;
      uint32_t kw0[S::kKWords], kw1[S::kKWords];
      if (kv0) load_words(kw0, kbase + smem.offsets[base + g] + t4 * S::kKSpan * S::kBytes);
      else zero_words(kw0);
      if (kv1) load_words(kw1, kbase + smem.offsets[base + g + 8] + t4 * S::kKSpan * S::kBytes);
      else zero_words(kw1);
      uint32_t vw[4][S::kVWords];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int tok = base + 2 * t4 + (j & 1) + (j >> 1) * 8;
        if (tok < n) load_words(vw[j], vbase + smem.offsets[tok] + g * S::kVSpan * S::kBytes);
        else zero_words(vw[j]);
      }

      // ---- S^T = K Q^T ----
      float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int ks = 0; ks < S::kKSteps; ++ks) {
        uint32_t a[4];
        if constexpr (KV == KvKind::kE4M3) {
          decode4_exact<DEC>(kw0[ks], a[0], a[2]);
          decode4_exact<DEC>(kw1[ks], a[1], a[3]);
        } else {
          a[0] = kw0[2 * ks];
          a[2] = kw0[2 * ks + 1];
          a[1] = kw1[2 * ks];
          a[3] = kw1[2 * ks + 1];
        }
        mma_16816<S::kBf16Mma>(s, a, qb[ks][0], qb[ks][1]);
      }
      // s[0], s[1]: token g, heads 2t4, 2t4+1; s[2], s[3]: token g+8.
      s[0] = kv0 ? s[0] * factor : -CUDART_INF_F;
      s[1] = kv0 ? s[1] * factor : -CUDART_INF_F;
      s[2] = kv1 ? s[2] * factor : -CUDART_INF_F;
      s[3] = kv1 ? s[3] * factor : -CUDART_INF_F;

      // ---- online softmax (base 2) for this thread's heads 2t4, 2t4+1 ----
      float mx0 = fmaxf(s[0], s[2]), mx1 = fmaxf(s[1], s[3]);
#pragma unroll
      for (int d = 4; d < 32; d <<= 1) {
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, d));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, d));
      }
      const float mn0 = fmaxf(m[0], mx0), mn1 = fmaxf(m[1], mx1);
      // All-masked so far: keep everything at zero (exp2(-inf - -inf) would be NaN).
      const float ref0 = mn0 == -CUDART_INF_F ? 0.0f : mn0;
      const float ref1 = mn1 == -CUDART_INF_F ? 0.0f : mn1;
      const float alpha0 = fast_exp2(m[0] - ref0), alpha1 = fast_exp2(m[1] - ref1);
      m[0] = mn0;
      m[1] = mn1;
      s[0] = fast_exp2(s[0] - ref0);
      s[1] = fast_exp2(s[1] - ref1);
      s[2] = fast_exp2(s[2] - ref0);
      s[3] = fast_exp2(s[3] - ref1);
      l[0] = l[0] * alpha0 + s[0] + s[2];
      l[1] = l[1] * alpha1 + s[1] + s[3];
#pragma unroll
      for (int i = 0; i < S::kMTiles; ++i) {
        o[i][0] *= alpha0;
        o[i][1] *= alpha1;
        o[i][2] *= alpha0;
        o[i][3] *= alpha1;
      }
      // P^T as the B operand: transpose the 8x8 (token x head) fragments.
      const uint32_t pb0 = transpose_8x8(S::kBf16Mma ? pack_bf162(s[0], s[1]) : pack_half2(s[0], s[1]));
      const uint32_t pb1 = transpose_8x8(S::kBf16Mma ? pack_bf162(s[2], s[3]) : pack_half2(s[2], s[3]));

      // ---- O^T += V^T P^T ----
#pragma unroll
      for (int j = 0; j < S::kVWords; ++j) {
        if constexpr (KV == KvKind::kE4M3) {
          // Word j: dims 4j..4j+3 of the span = m-tiles 2j (dims 4j, 4j+1) and 2j+1.
          uint32_t a[4], b[4];
          decode4_exact<DEC>(prmt(vw[0][j], vw[1][j], 0x5410u), a[0], a[1]);
          decode4_exact<DEC>(prmt(vw[2][j], vw[3][j], 0x5410u), a[2], a[3]);
          decode4_exact<DEC>(prmt(vw[0][j], vw[1][j], 0x7632u), b[0], b[1]);
          decode4_exact<DEC>(prmt(vw[2][j], vw[3][j], 0x7632u), b[2], b[3]);
          mma_16816<false>(o[2 * j], a, pb0, pb1);
          mma_16816<false>(o[2 * j + 1], b, pb0, pb1);
        } else {
          // Word j: dims 2j, 2j+1 of the span = m-tile j.
          uint32_t a[4];
          a[0] = prmt(vw[0][j], vw[1][j], 0x5410u);
          a[1] = prmt(vw[0][j], vw[1][j], 0x7632u);
          a[2] = prmt(vw[2][j], vw[3][j], 0x5410u);
          a[3] = prmt(vw[2][j], vw[3][j], 0x7632u);
          mma_16816<S::kBf16Mma>(o[j], a, pb0, pb1);
        }
      }
    }
  }

  // ---- merge the 4 warps ----
#pragma unroll
  for (int d = 4; d < 32; d <<= 1) {
    l[0] += __shfl_xor_sync(0xffffffffu, l[0], d);
    l[1] += __shfl_xor_sync(0xffffffffu, l[1], d);
  }
  __syncthreads();  // the last window's offsets are dead; reuse the storage
  MergeSmem<D>& ms = smem.merge;
  if (g == 0) {
    ms.m[warp][2 * t4] = m[0];
    ms.m[warp][2 * t4 + 1] = m[1];
    ms.l[warp][2 * t4] = l[0];
    ms.l[warp][2 * t4 + 1] = l[1];
  }
#pragma unroll
  for (int i = 0; i < S::kMTiles; ++i) {
    const int d0 = g * S::kVSpan + 2 * i;
    ms.o[warp][2 * t4][d0] = o[i][0];
    ms.o[warp][2 * t4 + 1][d0] = o[i][1];
    ms.o[warp][2 * t4][d0 + 1] = o[i][2];
    ms.o[warp][2 * t4 + 1][d0 + 1] = o[i][3];
  }
  __syncthreads();
  const float v_factor = v_scale * kUnit;
  for (int idx = threadIdx.x; idx < kHeadsPerCta * D; idx += kThreads) {
    const int h = idx / D, d = idx % D;
    const int hl = chunk * kHeadsPerCta + h;
    if (hl >= p.group) break;  // idx grows with h: no later head is valid either
    const int qh = kvh * p.group + hl;
    float M = -CUDART_INF_F;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, ms.m[w][h]);
    float L = 0.0f, acc = 0.0f;
    if (M != -CUDART_INF_F) {
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const float c = fast_exp2(ms.m[w][h] - M);
        L += ms.l[w][h] * c;
        acc += ms.o[w][h][d] * c;
      }
    }
    const int64_t oi = (static_cast<int64_t>(row) * p.q_heads + qh);
    if (p.num_splits == 1) {
      const float r = L > 0.0f ? acc / L * v_factor : 0.0f;
      static_cast<Act*>(p.out)[oi * D + d] = from_float<Act>(r);
    } else {
      const int64_t pi = oi * p.num_splits + split;
      p.partial_out[pi * D + d] = L > 0.0f ? acc / L : 0.0f;
      if (d == 0) p.partial_lse[pi] = L > 0.0f ? M + log2f(L) : -CUDART_INF_F;
    }
  }
}

// Combines the splits of each (row, head): weights exp2(lse_i - max), then the V scale.
template <class Act, int D>
__global__ void merge_splits_kernel(const DecodeParams p, float v_unit) {
  const int row = blockIdx.x / p.q_heads, qh = blockIdx.x % p.q_heads;
  if (row >= p.header->num_rows) return;
  const int64_t base = (static_cast<int64_t>(row) * p.q_heads + qh) * p.num_splits;
  float M = -CUDART_INF_F;
  for (int s = 0; s < p.num_splits; ++s) M = fmaxf(M, p.partial_lse[base + s]);
  const float v_factor = __ldg(p.scales + 1) * v_unit;
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float acc = 0.0f, W = 0.0f;
    if (M != -CUDART_INF_F) {
      for (int s = 0; s < p.num_splits; ++s) {
        const float w = fast_exp2(p.partial_lse[base + s] - M);
        W += w;
        acc += w * p.partial_out[(base + s) * D + d];
      }
    }
    const float r = W > 0.0f ? acc / W * v_factor : 0.0f;
    static_cast<Act*>(p.out)[(static_cast<int64_t>(row) * p.q_heads + qh) * D + d] = from_float<Act>(r);
  }
}

}  // namespace cuda
}  // namespace qsakv
