// SPDX-License-Identifier: Apache-2.0
// Reference attention over a paged cache: per row and query head, softmax over the
// selected (sparse) or causal (dense) tokens, FP32 throughout, numerics as the GPU:
// the K scale folded into the base-2 softmax factor, the V scale applied once at the end.
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_kernels.hpp"
#include "backend/cpu/element.hpp"
#include "paged_address.cuh"

namespace qsakv {
namespace cpu {

namespace {
constexpr float kLog2e = 1.4426950408889634f;

// Element offsets of the row's valid tokens' K rows (V is + stride_kv).
void gather_tokens(const AttentionParams& p, int row, std::vector<int64_t>& offs) {
  const PlanMetaHeader& h = *p.meta.header;
  const KvCacheView& c = p.cache;
  const int req = p.meta.row_request[row];
  const int pos = p.meta.row_pos[row];
  const int32_t* bt = h.block_table + static_cast<int64_t>(req) * h.block_table_stride;
  offs.clear();
  const int n = p.mode == QSAKV_ATTENTION_SPARSE ? p.topk_width : pos + 1;
  for (int j = 0; j < n; ++j) {
    const int t = p.mode == QSAKV_ATTENTION_SPARSE ? p.topk[row * p.topk_stride + j] : j;
    if (t < 0 || t > pos) continue;  // padding, or not causal: never dereferenced
    const int32_t phys = bt[t / c.block_size];
    if (!page_mapped(phys, c.num_blocks)) continue;
    offs.push_back(paged_row_offset(phys, t, c.block_size, c.stride_block, c.stride_token));
  }
}
}  // namespace

void attention(const AttentionParams& p) {
  const PlanMetaHeader& h = *p.meta.header;
  const KvCacheView& c = p.cache;
  const int D = c.head_dim;
  const float k_scale = c.scales[0], v_scale = c.scales[1];
  const float factor = p.softmax_scale * kLog2e * k_scale;
  // Per-thread scratch, kept between calls: a call allocates only when it needs more
  // than the thread's calls before it (the header's "run" promise is the GPU's; the
  // CPU reference keeps it in the steady state).
  thread_local std::vector<int64_t> offs;
  thread_local std::vector<float> logits, acc, qf;
  acc.resize(D);
  qf.resize(D);
  for (int row = 0; row < h.num_rows; ++row) {
    gather_tokens(p, row, offs);
    for (int qh = 0; qh < p.q_heads; ++qh) {
      const int kvh = qh / p.group_size;
      const int64_t qo = (static_cast<int64_t>(row) * p.q_heads + qh) * D;
      for (int d = 0; d < D; ++d) qf[d] = load_f32(p.q, qo + d, p.act_dtype);
      logits.resize(offs.size());
      float m = -INFINITY;
      for (size_t j = 0; j < offs.size(); ++j) {
        const int64_t ko = offs[j] + static_cast<int64_t>(kvh) * c.stride_head;
        float s = 0.0f;
        for (int d = 0; d < D; ++d) s += qf[d] * load_f32(c.data, ko + d, c.dtype);
        logits[j] = s * factor;
        m = std::fmax(m, logits[j]);
      }
      float l = 0.0f;
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (size_t j = 0; j < offs.size(); ++j) {
        const float w = std::exp2(logits[j] - m);
        l += w;
        const int64_t vo = offs[j] + c.stride_kv + static_cast<int64_t>(kvh) * c.stride_head;
        for (int d = 0; d < D; ++d) acc[d] += w * load_f32(c.data, vo + d, c.dtype);
      }
      const float norm = offs.empty() ? 0.0f : v_scale / l;
      for (int d = 0; d < D; ++d) store_from_f32(p.out, qo + d, p.act_dtype, acc[d] * norm);
    }
  }
}

}  // namespace cpu
}  // namespace qsakv
