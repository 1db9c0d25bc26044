// SPDX-License-Identifier: Apache-2.0
// Reference indexer selection: scores, exact top-k (score descending, block ascending),
// expansion into token positions with the open group's tail, -1 padding.
#include <algorithm>
#include <cmath>

#include "backend/cpu/cpu_kernels.hpp"
#include "e4m3.cuh"
#include "half_bits.cuh"

namespace qsakv {
namespace cpu {

void select_topk(const SelectParams& p) {
  const PlanMetaHeader& h = *p.meta.header;
  const int groups_per_block = p.block_size / p.ratio;
  const float inv_sqrt_dim = 1.0f / std::sqrt(static_cast<float>(p.index_dim));
  float key[1024];  // index_head_dim <= 1024 (validate_config)
  float* scores = p.score_workspace;
  int32_t* order = reinterpret_cast<int32_t*>(p.score_workspace) + p.score_workspace_elems / 2;
  for (int row = 0; row < h.num_rows; ++row) {
    const int req = p.meta.row_request[row];
    const int pos = p.meta.row_pos[row];
    const int32_t* bt = h.block_table + static_cast<int64_t>(req) * h.block_table_stride;
    const uint16_t* q = p.index_q + static_cast<int64_t>(row) * p.index_heads * p.index_dim;
    // Only completed groups at or before the row are visible (causal by construction).
    int visible = (pos + 1) / p.ratio;
    visible = std::min<int64_t>(visible, p.score_workspace_elems / 2);
    int n = 0;
    for (int b = 0; b < visible; ++b) {
      const int64_t t0 = static_cast<int64_t>(b) * p.ratio;
      const int32_t phys = bt[t0 / p.block_size];
      if (phys < 0 || phys >= p.num_blocks) continue;  // unmapped page: never read
      const CompressedKeyAddress a = compressed_key_address(
          p.keys, static_cast<int64_t>(phys) * groups_per_block + (t0 % p.block_size) / p.ratio);
      // The key's values (E4M3: the codes' values; the scale multiplies the score).
      for (int d = 0; d < p.index_dim; ++d)
        key[d] = a.scale ? e4m3::key_code_value(reinterpret_cast<const uint8_t*>(a.codes)[d])
                         : halfbits::fp16_to_f32(reinterpret_cast<const uint16_t*>(a.codes)[d]);
      float s = 0.0f;
      for (int hd = 0; hd < p.index_heads; ++hd) {
        float dot = 0.0f;
        for (int d = 0; d < p.index_dim; ++d)
          dot += halfbits::fp16_to_f32(q[hd * p.index_dim + d]) * key[d];
        s += dot > 0.0f ? dot : 0.0f;
      }
      s *= inv_sqrt_dim;
      if (a.scale) s *= *a.scale;
      // A NaN score (a corrupt key) ranks last instead of breaking the ordering.
      scores[b] = std::isnan(s) ? -INFINITY : s;
      order[n++] = b;
    }
    const int keep = std::min(n, p.topk_blocks);
    std::partial_sort(order, order + keep, order + n, [&](int32_t a, int32_t b) {
      return scores[a] > scores[b] || (scores[a] == scores[b] && a < b);
    });
    int32_t* out = p.topk + static_cast<int64_t>(row) * p.topk_stride;
    int j = 0;
    for (int i = 0; i < keep; ++i)
      for (int t = 0; t < p.ratio; ++t) out[j++] = order[i] * p.ratio + t;
    for (int t = (pos + 1) / p.ratio * p.ratio; t <= pos; ++t) out[j++] = t;
    while (j < p.topk_width) out[j++] = -1;
  }
}

}  // namespace cpu
}  // namespace qsakv
