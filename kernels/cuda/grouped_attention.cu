// SPDX-License-Identifier: Apache-2.0
// Instantiation and launch of the grouped multi-row route: the union kernel (sparse
// only: the shared lists and the rows' filters), then the attention kernel over (group x
// split, KV head). The decode kernels, launched after, compute the rows' own entries.
#include "cuda/attention_dispatch.hpp"
#include "cuda/dependent_launch.cuh"
#include "cuda/grouped_attention.cuh"
#include "cuda/grouped_union.cuh"
#include "cuda/kernel_smem.hpp"
#include "cuda/launch.hpp"

namespace qsakv {
namespace cuda {

namespace {

// kWg: the warpgroup-MMA kernel (sm_90a code; SM90 GPUs), one warpgroup per 64 vectors;
// otherwise the m16n8k16 kernel, one warp per 16.
template <class Act, KvKind KV, int D, Decoder DEC, bool kWg>
void launch(const GroupedParams& gp, int max_groups, bool programmatic, cudaStream_t stream) {
  constexpr int smem = grouped_smem_bytes<KV, D, kWg>();
  static std::atomic<uint64_t> ready{0};
  prepare_kernel_smem(grouped_attention_kernel<Act, KV, D, DEC, kWg>, smem, false, ready);
  const int threads = GroupedShape<kWg>::threads(gp.vectors);
  const dim3 grid(static_cast<unsigned>(std::max(max_groups, gp.max_items)),
                  static_cast<unsigned>(gp.in.kv_heads));
  launch_kernel(programmatic, grouped_attention_kernel<Act, KV, D, DEC, kWg>, grid, threads, smem,
                stream, gp);
}

}  // namespace

int grouped_rows_per_group(int group_size, int head_dim) {
  if (head_dim != 64 && head_dim != 128 && head_dim != 256) return 0;
  if (group_size < 1 || group_size > kGroupedMaxVectors) return 0;
  return std::min(kGroupedMaxRows, kGroupedMaxVectors / group_size);
}

bool grouped_warpgroup_mma_built() {
#ifdef QSAKV_HAVE_SM90A
  return true;
#else
  return false;
#endif
}

void launch_grouped_attention(const AttentionParams& p, bool hardware_decoder, bool warpgroup_mma,
                              bool programmatic, cudaStream_t stream) {
  const int max_groups = p.meta.max_groups;
  if (max_groups == 0 || p.grouped.num_groups == 0) return;  // no groups in this batch
  const KvCacheView& c = p.cache;
  const GroupedView& g = p.grouped;
  GroupedParams gp;
  fill_attention_inputs(gp.in, p);
  if (p.mode == QSAKV_ATTENTION_SPARSE) {
    UnionParams up;
    up.meta = p.meta;
    up.topk = p.topk;
    up.topk_stride = p.topk_stride;
    up.topk_width = p.topk_width;
    up.block_size = gp.in.block_size;
    up.num_blocks = gp.in.num_blocks;
    up.stride_block = gp.in.stride_block;
    up.stride_token = gp.in.stride_token;
    up.share_rows = c.dtype == QSAKV_DTYPE_E4M3 ? kGroupedShareRowsE4M3 : kGroupedShareRows16;
    up.entry_words = g.rows_per_group * union_row_words(p.topk_width);
    up.union_cap = g.union_cap;
    up.union_count = g.union_count;
    up.union_off = g.union_off;
    up.union_mask = g.union_mask;
    up.own_lists = g.own_lists;
    up.row_split = reinterpret_cast<int2*>(g.row_split);
    // The variant and its shared memory follow the plan's geometry (its limit is raised to
    // the largest size launched: raise_kernel_smem).
    const bool one_pass =
        union_row_words(p.topk_width) <= kUnionEntries * kUnionWarps / kGroupedMaxRows;
    // (Blocks of a multiple of 4 tokens: a list that repeats a token, which lists must not,
    // can carry a count into a neighbour up to 3 positions on, past the rows; its block is
    // then still the request's last.)
    const bool wide = !g.one_window && one_pass && g.wide_window > 0 && up.block_size % 4 == 0 &&
                      kernel_smem_fits(grouped_union_kernel<kUnionWide>,
                                       union_smem_bytes(g.wide_window, true, up));
    up.window = wide ? g.wide_window : g.window;
    const int smem = union_smem_bytes(up.window, wide, up);
    auto kernel = wide                       ? grouped_union_kernel<kUnionWide>
                  : g.one_window && one_pass ? grouped_union_kernel<kUnionOneWindow>
                                             : grouped_union_kernel<kUnionReload>;
    static RaisedSmemLimit limits[3];  // one per variant
    raise_kernel_smem(kernel, smem, limits[wide ? 0 : g.one_window && one_pass ? 1 : 2]);
    launch_kernel(programmatic, kernel, max_groups, kUnionThreads, smem, stream, up);
  }
  gp.group_row0 = p.meta.group_row0;
  gp.group_rows = p.meta.group_rows;
  gp.vectors = g.rows_per_group * p.group_size;
  gp.union_cap = g.union_cap;
  gp.max_items = g.max_items;
  gp.union_count = g.union_count;
  gp.union_off = g.union_off;
  gp.union_mask = g.union_mask;
  gp.shared_out = g.shared_out;
  gp.shared_lse = g.shared_lse;
  gp.partial_out = g.partial_out;
  gp.partial_lse = g.partial_lse;
  gp.counters = g.counters;
  gp.max_groups = max_groups;
  dispatch_attention(p.act_dtype, c.dtype, hardware_decoder, c.head_dim, [&](auto shape) {
    using S = decltype(shape);
    if (warpgroup_mma)
      launch<typename S::Act, S::kKv, S::kDim, S::kDecoder, true>(gp, max_groups, programmatic,
                                                                  stream);
    else
      launch<typename S::Act, S::kKv, S::kDim, S::kDecoder, false>(gp, max_groups, programmatic,
                                                                   stream);
  });
}

}  // namespace cuda
}  // namespace qsakv
