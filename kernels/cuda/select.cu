// Indexer selection on the GPU: score every visible compressed block, take the exact
// top-k (score descending, block ascending on ties), expand to tokens, pad with -1.
//
// One CTA per row (persistent over rows). Scores are computed in the CPU backend's exact
// FP32 operation order (sequential dot products, no FMA contraction), so selections are
// identical to the reference, ties included. The k-th largest score is found by a
// 4-pass radix select over order-preserving 32-bit keys kept in a per-CTA workspace;
// ties at the threshold are taken in block order; the winners are bitonic-sorted.
#include <math_constants.h>
#include <stdint.h>

#include "cuda/common.cuh"
#include "cuda/launch.hpp"

namespace qsakv {
namespace cuda {

namespace {

constexpr int kSelectThreads = 512;
constexpr int kMaxTopkBlocks = 1024;  // bitonic buffer; configs allow topk_blocks <= this
constexpr int kMaxIndexElems = 4096;  // index_heads * index_dim held in shared memory

// Order-preserving map of a float to uint32 (larger float -> larger key). 0 is reserved
// for "not a candidate" (unmapped pages): real keys are never 0.
__device__ __forceinline__ uint32_t float_key(float f) {
  const uint32_t b = __float_as_uint(f);
  const uint32_t k = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  return k == 0u ? 1u : k;
}

struct SelectSmem {
  float q[kMaxIndexElems];
  uint32_t hist[256];
  unsigned long long sorted[kMaxTopkBlocks];
  int32_t warp_sums[kSelectThreads / 32];
  uint32_t prefix;
  int32_t remaining;
  int32_t count;
  int32_t ties_taken;
};

__device__ float score_block(const SelectParams& p, const float* q, const uint16_t* k,
                             float inv_sqrt_dim) {
  float s = 0.0f;
  for (int h = 0; h < p.index_heads; ++h) {
    float dot = 0.0f;
    const float* qh = q + h * p.index_dim;
    for (int d0 = 0; d0 < p.index_dim; d0 += 8) {
      const uint4 raw = __ldg(reinterpret_cast<const uint4*>(k + d0));
      const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float kv = __half2float(__ushort_as_half(static_cast<uint16_t>(w[j / 2] >> (16 * (j & 1)))));
        dot = __fadd_rn(dot, __fmul_rn(qh[d0 + j], kv));  // the CPU's order, no FMA
      }
    }
    s = __fadd_rn(s, dot > 0.0f ? dot : 0.0f);
  }
  return isnan(s) ? -CUDART_INF_F : __fmul_rn(s, inv_sqrt_dim);
}

// Inclusive block scan of one int per thread; returns the thread's inclusive prefix and
// the block total through *total.
__device__ int block_scan(int v, int32_t* warp_sums, int* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int x = v;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, x, d);
    if (lane >= d) x += y;
  }
  __syncthreads();
  if (lane == 31) warp_sums[warp] = x;
  __syncthreads();
  int before = 0, all = 0;
  for (int w = 0; w < kSelectThreads / 32; ++w) {
    if (w < warp) before += warp_sums[w];
    all += warp_sums[w];
  }
  *total = all;
  return x + before;
}

__global__ void __launch_bounds__(kSelectThreads) select_topk_kernel(const SelectParams p,
                                                                     float inv_sqrt_dim,
                                                                     int64_t ws_per_cta) {
  __shared__ SelectSmem sm;
  uint32_t* keys = reinterpret_cast<uint32_t*>(p.score_workspace) + blockIdx.x * ws_per_cta;
  const int tid = threadIdx.x;
  const int groups_per_block = p.block_size / p.ratio;
  const int num_rows = p.meta.header->num_rows;
  for (int row = blockIdx.x; row < num_rows; row += gridDim.x) {
    const int req = p.meta.row_request[row], pos = p.meta.row_pos[row];
    const int32_t* bt = p.meta.header->block_table +
                        static_cast<int64_t>(req) * p.meta.header->block_table_stride;
    const int qn = p.index_heads * p.index_dim;
    __syncthreads();  // the previous row is done with shared memory
    for (int i = tid; i < qn; i += kSelectThreads)
      sm.q[i] = __half2float(__ushort_as_half(p.index_q[static_cast<int64_t>(row) * qn + i]));
    __syncthreads();

    // 1. Keys of the visible blocks (0 for unmapped pages).
    const int visible = static_cast<int>(min(static_cast<int64_t>((pos + 1) / p.ratio), ws_per_cta));
    int local_valid = 0;
    for (int b = tid; b < visible; b += kSelectThreads) {
      const int64_t t0 = static_cast<int64_t>(b) * p.ratio;
      const int32_t phys = __ldg(bt + t0 / p.block_size);
      uint32_t key = 0u;
      if (phys >= 0 && phys < p.num_blocks) {
        const uint16_t* k = p.compressed +
            (static_cast<int64_t>(phys) * groups_per_block + (t0 % p.block_size) / p.ratio) * p.index_dim;
        key = float_key(score_block(p, sm.q, k, inv_sqrt_dim));
        ++local_valid;
      }
      keys[b] = key;
    }
    int n_valid;
    block_scan(local_valid, sm.warp_sums, &n_valid);
    const int K = min(n_valid, p.topk_blocks);

    // 2. Radix select: the K-th largest key, 8 bits at a time from the top.
    if (tid == 0) {
      sm.prefix = 0u;
      sm.remaining = K;
    }
    __syncthreads();
    for (int shift = 24; shift >= 0 && K > 0; shift -= 8) {
      for (int i = tid; i < 256; i += kSelectThreads) sm.hist[i] = 0u;
      __syncthreads();
      const uint32_t prefix = sm.prefix;
      const uint32_t hi_mask = shift == 24 ? 0u : (0xFFFFFFFFu << (shift + 8));
      for (int b = tid; b < visible; b += kSelectThreads) {
        const uint32_t key = keys[b];
        if (key != 0u && (key & hi_mask) == (prefix & hi_mask))
          atomicAdd(&sm.hist[(key >> shift) & 0xFFu], 1u);
      }
      __syncthreads();
      if (tid == 0) {
        int need = sm.remaining;
        int digit = 255;
        for (; digit > 0; --digit) {
          const int c = static_cast<int>(sm.hist[digit]);
          if (c >= need) break;
          need -= c;
        }
        sm.prefix = prefix | (static_cast<uint32_t>(digit) << shift);
        sm.remaining = need;  // how many keys equal to the final prefix are still needed
      }
      __syncthreads();
    }
    const uint32_t thr = sm.prefix;
    const int ties_needed = sm.remaining;

    // 3. Collect: every key above the threshold, and the first ties_needed ties in block
    //    order (the deterministic tie-break).
    if (tid == 0) {
      sm.count = 0;
      sm.ties_taken = 0;
    }
    __syncthreads();
    if (K > 0) {
      for (int b0 = 0; b0 < visible; b0 += kSelectThreads) {
        const int b = b0 + tid;
        const uint32_t key = b < visible ? keys[b] : 0u;
        const bool tie = key != 0u && key == thr;
        int tie_total;
        const int tie_rank = block_scan(tie ? 1 : 0, sm.warp_sums, &tie_total) - 1;
        const int taken_before = sm.ties_taken;
        const bool take = key > thr || (tie && taken_before + tie_rank < ties_needed);
        if (take) {
          const int slot = atomicAdd(&sm.count, 1);
          sm.sorted[slot] = (static_cast<unsigned long long>(key) << 32) |
                            (0xFFFFFFFFu - static_cast<uint32_t>(b));
        }
        __syncthreads();
        if (tid == 0) sm.ties_taken = min(ties_needed, taken_before + tie_total);
        __syncthreads();
      }
    }
    // 4. Bitonic sort, descending: score descending, then block ascending.
    int n_sort = 1;
    while (n_sort < K) n_sort <<= 1;
    for (int i = K + tid; i < n_sort; i += kSelectThreads) sm.sorted[i] = 0ull;
    __syncthreads();
    for (int size = 2; size <= n_sort; size <<= 1) {
      for (int stride = size >> 1; stride > 0; stride >>= 1) {
        for (int i = tid; i < n_sort; i += kSelectThreads) {
          const int j = i ^ stride;
          if (j > i) {
            const bool desc = (i & size) == 0;
            const unsigned long long a = sm.sorted[i], c = sm.sorted[j];
            if (desc ? a < c : a > c) {
              sm.sorted[i] = c;
              sm.sorted[j] = a;
            }
          }
        }
        __syncthreads();
      }
    }
    // 5. Expand: chosen blocks' tokens, then the open group's tail, then -1.
    int32_t* out = p.topk + static_cast<int64_t>(row) * p.topk_stride;
    const int tail_start = (pos + 1) / p.ratio * p.ratio;
    const int tail = pos + 1 - tail_start;
    for (int j = tid; j < p.topk_width; j += kSelectThreads) {
      int32_t v = -1;
      if (j < K * p.ratio) {
        const uint32_t b = 0xFFFFFFFFu - static_cast<uint32_t>(sm.sorted[j / p.ratio] & 0xFFFFFFFFull);
        v = static_cast<int32_t>(b) * p.ratio + j % p.ratio;
      } else if (j < K * p.ratio + tail) {
        v = tail_start + (j - K * p.ratio);
      }
      out[j] = v;
    }
  }
}

}  // namespace

void launch_select_topk(const SelectParams& p, int grid_rows, cudaStream_t stream) {
  const float inv_sqrt_dim = 1.0f / std::sqrt(static_cast<float>(p.index_dim));
  const int64_t ws_per_cta = p.score_workspace_elems / grid_rows;
  select_topk_kernel<<<grid_rows, kSelectThreads, 0, stream>>>(p, inv_sqrt_dim, ws_per_cta);
}

}  // namespace cuda
}  // namespace qsakv
