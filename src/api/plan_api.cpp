// SPDX-License-Identifier: Apache-2.0
// extern "C" entry points: plans (batch metadata), selection and attention.
#include <algorithm>
#include <climits>
#include <cstring>

#include "api/guard.hpp"
#include "api/layer.hpp"
#include "core/dtype.hpp"
#include "core/plan_meta.hpp"
#include "core/versioned.hpp"
#include "limits.hpp"

using namespace qsakv;

namespace {

qsakv_plan_options default_plan_options() {
  qsakv_plan_options o = QSAKV_PLAN_OPTIONS_INIT;  // the header's defaults, one definition
  return o;
}

qsakv_batch default_batch() {
  qsakv_batch b = QSAKV_BATCH_INIT;
  return b;
}

// The top-k list a call reads or writes: the caller's (stride checked) or, for NULL, the
// layer's buffer (the model-level shared one unless the cache made private ones). The
// caller's buffer is [max_rows, stride] for the plan's max_rows (a captured graph replays
// with any later batch of at most that many rows): its span must be a size some buffer
// can have, so that no row offset wraps. Whether the buffer really is that large cannot
// be checked from the host (docs/safety.md).
void resolve_topk(const qsakv_plan* plan, int qsa, int32_t*& topk, int64_t& stride) {
  const qsakv_cache* cache = plan->cache;
  if (!topk) {
    topk = cache->topk_for(qsa);
    stride = cache->layout.topk_cols;
    return;
  }
  require_element_aligned(topk, sizeof(int32_t), "int32_t", "topk");
  const int width = cache->geometry.topk_width;
  if (stride < width)
    fail(QSAKV_ERROR_INVALID_ARGUMENT, "topk_stride is %lld; must be >= the top-k width %d",
         static_cast<long long>(stride), width);
  // (max_rows - 1) * stride + width int32 elements, without overflow.
  const uint64_t rows = static_cast<uint64_t>(plan->options.max_rows);
  uint64_t span = 0;
  if (!mul_u64(rows - 1, static_cast<uint64_t>(stride), &span) ||
      !add_u64(span, static_cast<uint64_t>(width), &span) ||
      span > kMaxBufferBytes / sizeof(int32_t))
    fail(QSAKV_ERROR_INVALID_ARGUMENT,
         "topk_stride is %lld; a top-k buffer of the plan's "
         "max_rows %d rows at that stride would span more than %llu bytes, more than any "
         "buffer holds",
         static_cast<long long>(stride), plan->options.max_rows,
         static_cast<unsigned long long>(kMaxBufferBytes));
}

// The CUDA kernels read the row count from the plan's device metadata and exit early, so
// they are launched even for an empty batch: a graph captured then still holds them and
// replays correctly after the next update. The CPU backend has nothing to capture.
bool launches_for_empty_batches(const qsakv_cache* cache) {
  return cache->context->backend->info().kind == QSAKV_BACKEND_CUDA;
}

void require_plan(const qsakv_plan* plan) {
  if (!plan) fail(QSAKV_ERROR_INVALID_ARGUMENT, "plan is NULL");
  if (plan->num_rows < 0)
    fail(QSAKV_ERROR_STATE, "the plan has no batch yet: call qsakv_plan_update first");
}

}  // namespace

qsakv::PlanMetaView qsakv_plan::meta_view() const { return plan_meta_view(meta.get(), shape); }

qsakv_plan::~qsakv_plan() {
  if (fence) {
    Backend* be = cache->context->backend.get();
    if (fence_pending) {
      try {
        be->wait_fence(fence);
      } catch (...) {
      }
    }
    be->destroy_fence(fence);
  }
}

extern "C" {

qsakv_status qsakv_plan_options_init(qsakv_plan_options* options) {
  return guarded([&] {
    if (!options) fail(QSAKV_ERROR_INVALID_ARGUMENT, "options is NULL");
    *options = default_plan_options();
  });
}

qsakv_status qsakv_plan_create(qsakv_plan** out, qsakv_cache* cache,
                               const qsakv_plan_options* options) {
  return guarded([&] {
    require_out(out, "out");
    if (!cache) fail(QSAKV_ERROR_INVALID_ARGUMENT, "cache is NULL");
    auto o = options ? read_versioned(options, default_plan_options(), "options")
                     : default_plan_options();
    const qsakv_model_config& c = cache->config;
    if (o.max_rows == 0) o.max_rows = c.max_batched_tokens;
    if (o.max_requests == 0) o.max_requests = c.max_requests;
    if (o.max_rows < 0 || o.max_rows > c.max_batched_tokens)
      fail(QSAKV_ERROR_INVALID_ARGUMENT,
           "options.max_rows is %d; must be in 1..%d "
           "(max_batched_tokens, the top-k buffer's rows)",
           o.max_rows, c.max_batched_tokens);
    if (o.max_requests < 0 || o.max_requests > c.max_requests)
      fail(QSAKV_ERROR_INVALID_ARGUMENT, "options.max_requests is %d; must be in 1..%d",
           o.max_requests, c.max_requests);
    if (o.num_splits < 0 || o.num_splits > kMaxSplits)
      fail(QSAKV_ERROR_INVALID_ARGUMENT,
           "options.num_splits is %d; must be in 0..%d "
           "(0: from occupancy)",
           o.num_splits, kMaxSplits);
    if (o.multi_row_min_rows < -1)
      fail(QSAKV_ERROR_INVALID_ARGUMENT,
           "options.multi_row_min_rows is %d; must be -1 (never), 0 (automatic) or >= 1",
           o.multi_row_min_rows);
    Backend* be = cache->context->backend.get();
    // One CTA group per (row, KV head, chunk of query heads) in the CUDA kernel.
    const int chunks =
        (cache->geometry.group_size + kAttentionHeadsPerCta - 1) / kAttentionHeadsPerCta;
    // Up to 2^20 rows x 4096 KV heads: counted in 64 bits, the occupancy estimate clamped.
    const int64_t groups = static_cast<int64_t>(o.max_rows) * cache->geometry.kv_heads * chunks;
    if (o.num_splits == 0)
      o.num_splits = be->choose_splits(static_cast<int>(std::min<int64_t>(groups, INT32_MAX)),
                                       cache->geometry.topk_width);

    auto plan = std::make_unique<qsakv_plan>();
    plan->cache = cache;
    // The grouped multi-row route: off when the backend has none for this geometry.
    const GroupingRule& rule = plan->grouping =
        grouping_rule(be->grouped_rows_per_group(cache->geometry.group_size, c.head_dim),
                      c.kv_dtype, o.multi_row_min_rows);
    o.multi_row_min_rows = reported_min_rows(rule);
    plan->options = o;
    plan->shape = {o.max_rows, o.max_requests, max_groups_for(o.max_rows, o.max_requests, rule)};
    plan->meta_bytes = plan_meta_bytes(plan->shape);
    plan->meta = DeviceBuffer(be, plan->meta_bytes);
    plan->staging = HostBuffer(be, plan->meta_bytes);
    const int q_heads = cache->geometry.q_heads;
    if (o.num_splits > 1) {
      const int64_t parts = static_cast<int64_t>(o.max_rows) * q_heads * o.num_splits;
      plan->partial_out = DeviceBuffer(
          be, require_bytes("the split-K workspace's rows x heads x splits (options.max_rows "
                            "times num_splits)",
                            parts, c.head_dim * sizeof(float)));
      plan->partial_lse = DeviceBuffer(be, static_cast<size_t>(parts) * sizeof(float));
      // One arrival counter per CTA group: the last split to finish merges (zeroed here,
      // and reset by that CTA, so captured graphs replay from zero).
      plan->split_counters = DeviceBuffer(be, static_cast<size_t>(groups) * sizeof(int32_t));
    }
    if (plan->shape.max_groups > 0) {
      const int groups = plan->shape.max_groups;
      const int cap = grouped_union_cap(cache->geometry.topk_width);
      const int items = be->grouped_max_items();
      const int64_t kvh = cache->geometry.kv_heads;
      plan->union_count = DeviceBuffer(be, static_cast<size_t>(groups) * sizeof(int32_t));
      plan->union_off = DeviceBuffer(
          be, require_bytes("the grouped route's token unions (groups x union capacity)",
                            static_cast<int64_t>(groups) * cap, sizeof(int64_t)));
      plan->union_mask =
          DeviceBuffer(be, static_cast<size_t>(groups) * static_cast<size_t>(cap) * 4);
      const int64_t parts = kvh * items * kGroupedMaxVectors;
      plan->grouped_partial_out =
          DeviceBuffer(be, require_bytes("the grouped route's split-K workspace", parts,
                                         c.head_dim * sizeof(float)));
      plan->grouped_partial_lse = DeviceBuffer(be, static_cast<size_t>(parts) * sizeof(float));
      // Zeroed here and reset by the last CTA of each group, so graphs replay from zero.
      plan->grouped_counters =
          DeviceBuffer(be, static_cast<size_t>(kvh * groups) * sizeof(int32_t));
      // Each grouped row's own entries (at most its list).
      plan->own_lists = DeviceBuffer(
          be, require_bytes("the grouped route's own-entry lists (options.max_rows x top-k width)",
                            static_cast<int64_t>(o.max_rows) * cache->geometry.topk_width,
                            sizeof(int32_t)));
      plan->row_split = DeviceBuffer(be, static_cast<size_t>(o.max_rows) * 2 * sizeof(int32_t));
      const int64_t heads = static_cast<int64_t>(o.max_rows) * q_heads;
      plan->shared_out = DeviceBuffer(
          be, require_bytes("the grouped route's shared parts (options.max_rows x query heads)",
                            heads, c.head_dim * sizeof(float)));
      plan->shared_lse = DeviceBuffer(be, static_cast<size_t>(heads) * sizeof(float));
      GroupedView& gv = plan->grouped;
      gv.rows_per_group = rule.rows_per_group;
      gv.union_cap = cap;
      gv.window = grouped_union_window(c.max_model_len);
      gv.one_window = c.max_model_len <= gv.window;
      gv.wide_window = grouped_union_wide_window(c.max_model_len);
      gv.own_lists = plan->own_lists.as<int32_t>();
      gv.row_split = plan->row_split.as<int32_t>();
      gv.shared_out = plan->shared_out.as<float>();
      gv.shared_lse = plan->shared_lse.as<float>();
      gv.max_items = items;
      gv.union_count = plan->union_count.as<int32_t>();
      gv.union_off = plan->union_off.as<int64_t>();
      gv.union_mask = plan->union_mask.as<uint32_t>();
      gv.partial_out = plan->grouped_partial_out.as<float>();
      gv.partial_lse = plan->grouped_partial_lse.as<float>();
      gv.counters = plan->grouped_counters.as<int32_t>();
    }
    const int64_t max_blocks = c.max_model_len / c.compress_ratio;
    plan->select_ws = DeviceBuffer(be, be->select_workspace_bytes(o.max_rows, max_blocks));
    plan->fence = be->create_fence();
    *out = plan.release();
  });
}

void qsakv_plan_destroy(qsakv_plan* plan) { delete plan; }

qsakv_status qsakv_plan_update(qsakv_plan* plan, const qsakv_batch* batch, qsakv_stream_t stream) {
  return guarded([&] {
    if (!plan) fail(QSAKV_ERROR_INVALID_ARGUMENT, "plan is NULL");
    const qsakv_batch b = read_versioned(batch, default_batch(), "batch");
    const int rows =
        validate_batch(b, plan->cache->config, plan->options.max_rows, plan->options.max_requests);
    Backend* be = plan->cache->context->backend.get();
    // Captured, the copy would become a graph node reading the staging buffer at each
    // replay (whatever a later update left there), and the fence wait is not capturable.
    be->require_not_capturing(stream, "qsakv_plan_update");
    // The previous update's copy may still be reading the staging buffer.
    if (plan->fence_pending) {
      be->wait_fence(plan->fence);
      plan->fence_pending = false;
    }
    const PlanRouting routed =
        fill_plan_meta(plan->staging.get(), b, rows, plan->shape, plan->grouping);
    be->copy(plan->meta.get(), plan->staging.get(), plan->meta_bytes, QSAKV_COPY_HOST_TO_DEVICE,
             stream);
    // The device now receives the new batch. Should the fence fail, the plan keeps no
    // batch (run calls refuse with STATE until an update succeeds) and the copy is waited
    // for, so that the next update does not rewrite the staging buffer under it.
    try {
      be->record_fence(plan->fence, stream);
    } catch (...) {
      plan->num_rows = -1;
      try {
        be->synchronize(stream);
      } catch (...) {  // the fence's error is the one to report
      }
      throw;
    }
    plan->fence_pending = true;
    plan->num_rows = rows;
    plan->num_requests = b.num_requests;
    plan->num_groups = routed.num_groups;
    plan->max_request_rows = routed.max_request_rows;
    plan->min_request_rows = routed.min_request_rows;
    plan->grouped_rows = routed.grouped_rows;
  });
}

qsakv_status qsakv_plan_get_info(const qsakv_plan* plan, qsakv_plan_info* info) {
  return guarded([&] {
    if (!plan) fail(QSAKV_ERROR_INVALID_ARGUMENT, "plan is NULL");
    auto i = blank_versioned<qsakv_plan_info>(QSAKV_PLAN_INFO_VERSION);
    i.max_rows = plan->options.max_rows;
    i.max_requests = plan->options.max_requests;
    i.num_splits = plan->options.num_splits;
    i.num_rows = plan->num_rows < 0 ? 0 : plan->num_rows;
    i.num_requests = plan->num_requests;
    i.workspace_bytes = plan->meta.bytes() + plan->partial_out.bytes() + plan->partial_lse.bytes() +
                        plan->split_counters.bytes() + plan->select_ws.bytes() +
                        plan->union_count.bytes() + plan->union_off.bytes() +
                        plan->union_mask.bytes() + plan->grouped_partial_out.bytes() +
                        plan->grouped_partial_lse.bytes() + plan->grouped_counters.bytes() +
                        plan->own_lists.bytes() + plan->row_split.bytes() +
                        plan->shared_out.bytes() + plan->shared_lse.bytes();
    i.rows_per_group = plan->grouping.rows_per_group;
    i.multi_row_min_rows = plan->options.multi_row_min_rows;
    i.num_groups = plan->num_rows < 0 ? 0 : plan->num_groups;
    i.grouped_rows = plan->num_rows < 0 ? 0 : plan->grouped_rows;
    write_versioned(info, i, "info");
  });
}

qsakv_status qsakv_select_topk(qsakv_plan* plan, int32_t layer, const void* index_q, int32_t* topk,
                               int64_t topk_stride, qsakv_stream_t stream) {
  return guarded([&] {
    require_plan(plan);
    const qsakv_cache* cache = plan->cache;
    const int i = require_qsa_layer(cache, layer);
    const qsakv_model_config& c = cache->config;
    const qsakv_rank_geometry& g = cache->geometry;
    resolve_topk(plan, i, topk, topk_stride);
    if (!index_q) fail(QSAKV_ERROR_INVALID_ARGUMENT, "index_q is NULL");
    require_element_aligned(index_q, sizeof(uint16_t), "FP16 values", "index_q");
    if (plan->num_rows == 0 && !launches_for_empty_batches(cache)) return;
    SelectParams p{};
    p.meta = plan->meta_view();
    p.index_q = static_cast<const uint16_t*>(index_q);
    p.keys = cache->compressed_view(i);
    p.num_blocks = cache->layout.num_blocks;
    p.block_size = c.block_size;
    p.index_heads = c.index_num_heads;
    p.index_dim = c.index_head_dim;
    p.ratio = c.compress_ratio;
    p.topk_blocks = g.topk_blocks;
    p.topk_width = g.topk_width;
    p.topk = topk;
    p.topk_stride = topk_stride;
    p.score_workspace = plan->select_ws.as<float>();
    p.score_workspace_elems = static_cast<int64_t>(plan->select_ws.bytes() / sizeof(float));
    p.max_blocks = c.max_model_len / c.compress_ratio;
    p.rows_share_requests = plan->max_request_rows > 1;
    p.min_request_rows = plan->min_request_rows;
    p.batch_rows = plan->num_rows;
    cache->context->backend->select_topk(p, stream);
  });
}

qsakv_status qsakv_attention_run(qsakv_plan* plan, int32_t layer, qsakv_attention_mode mode,
                                 const void* q, const int32_t* topk, int64_t topk_stride, void* out,
                                 qsakv_stream_t stream) {
  return guarded([&] {
    require_plan(plan);
    const qsakv_cache* cache = plan->cache;
    const int i = require_qsa_layer(cache, layer);
    const qsakv_rank_geometry& g = cache->geometry;
    const int32_t m = enum_value(mode);
    if (m != QSAKV_ATTENTION_SPARSE && m != QSAKV_ATTENTION_DENSE)
      fail(QSAKV_ERROR_INVALID_ARGUMENT, "mode is %d; must be SPARSE (0) or DENSE (1)", m);
    int32_t* list = const_cast<int32_t*>(topk);  // read only by attention
    if (m == QSAKV_ATTENTION_SPARSE) resolve_topk(plan, i, list, topk_stride);
    if (!q) fail(QSAKV_ERROR_INVALID_ARGUMENT, "q is NULL");
    if (!out) fail(QSAKV_ERROR_INVALID_ARGUMENT, "out is NULL");
    const size_t act = dtype_size(cache->config.activation_dtype);
    require_element_aligned(q, act, "16-bit values", "q");
    require_element_aligned(out, act, "16-bit values", "out");
    if (plan->num_rows == 0 && !launches_for_empty_batches(cache)) return;
    AttentionParams p{};
    p.meta = plan->meta_view();
    p.cache = cache->kv_view(i);
    p.q = q;
    p.out = out;
    p.act_dtype = cache->config.activation_dtype;
    p.q_heads = g.q_heads;
    p.group_size = g.group_size;
    p.softmax_scale = g.softmax_scale;
    p.mode = static_cast<qsakv_attention_mode>(m);
    p.topk = list;
    p.topk_stride = topk_stride;
    p.topk_width = g.topk_width;
    p.num_splits = plan->options.num_splits;
    p.partial_out = plan->partial_out.as<float>();
    p.partial_lse = plan->partial_lse.as<float>();
    p.split_counters = plan->split_counters.as<int32_t>();
    p.grouped = plan->grouped;
    p.grouped.num_groups = plan->num_groups;
    cache->context->backend->attention(p, stream);
  });
}

}  // extern "C"
