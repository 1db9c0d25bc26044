// extern "C" entry points: plans (batch metadata), selection and attention.
#include <algorithm>
#include <climits>
#include <cstring>

#include "api/guard.hpp"
#include "api/layer.hpp"

using namespace qsakv;

namespace {

qsakv_plan_options default_plan_options() {
  qsakv_plan_options o;
  std::memset(&o, 0, sizeof o);
  o.struct_size = sizeof o;
  o.version = QSAKV_PLAN_OPTIONS_VERSION;
  return o;
}

qsakv_batch default_batch() {
  qsakv_batch b;
  std::memset(&b, 0, sizeof b);
  b.struct_size = sizeof b;
  b.version = QSAKV_BATCH_VERSION;
  return b;
}

size_t meta_bytes(int max_rows, int max_requests) {
  return sizeof(PlanMetaHeader) +
         sizeof(int32_t) * (2 * static_cast<size_t>(max_rows) + 2 * static_cast<size_t>(max_requests));
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
    fail(QSAKV_ERROR_INVALID_ARGUMENT, "topk_stride is %lld; a top-k buffer of the plan's "
         "max_rows %d rows at that stride would span more than %llu bytes, more than any "
         "buffer holds", static_cast<long long>(stride), plan->options.max_rows,
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

// Fills the staging mirror from a validated batch.
void fill_staging(qsakv_plan* plan, const qsakv_batch& b, int rows) {
  char* base = static_cast<char*>(plan->staging.get());
  auto* h = reinterpret_cast<PlanMetaHeader*>(base);
  const int max_rows = plan->options.max_rows;
  auto* row_request = reinterpret_cast<int32_t*>(base + sizeof(PlanMetaHeader));
  int32_t* row_pos = row_request + max_rows;
  int32_t* req_len = row_pos + max_rows;
  int32_t* req_slot = req_len + plan->options.max_requests;
  h->num_rows = rows;
  h->num_requests = b.num_requests;
  h->block_table_stride = b.block_table_stride;
  h->pad = 0;
  h->block_table = b.block_table;
  for (int r = 0; r < b.num_requests; ++r) {
    const int n = b.query_start[r + 1] - b.query_start[r];
    for (int j = 0; j < n; ++j) {
      row_request[b.query_start[r] + j] = r;
      row_pos[b.query_start[r] + j] = b.seq_lens[r] - n + j;
    }
    req_len[r] = b.seq_lens[r];
    req_slot[r] = b.request_slots ? b.request_slots[r] : r;
  }
}

int validate_batch(const qsakv_plan* plan, const qsakv_batch& b) {
  const qsakv_model_config& c = plan->cache->config;
  if (b.num_requests < 0 || b.num_requests > plan->options.max_requests)
    fail(QSAKV_ERROR_INVALID_ARGUMENT, "batch.num_requests is %d; the plan serves 0..%d",
         b.num_requests, plan->options.max_requests);
  if (b.num_requests == 0) return 0;
  if (!b.query_start) fail(QSAKV_ERROR_INVALID_ARGUMENT, "batch.query_start is NULL");
  if (!b.seq_lens) fail(QSAKV_ERROR_INVALID_ARGUMENT, "batch.seq_lens is NULL");
  if (b.query_start[0] != 0)
    fail(QSAKV_ERROR_INVALID_ARGUMENT, "batch.query_start[0] is %d; must be 0", b.query_start[0]);
  int max_len = 0;
  for (int r = 0; r < b.num_requests; ++r) {
    // Each bound is checked against the previous one and max_rows before any difference
    // is taken, so no caller value can overflow the row count.
    const int32_t lo = b.query_start[r], hi = b.query_start[r + 1];
    if (hi < lo)
      fail(QSAKV_ERROR_INVALID_ARGUMENT, "batch.query_start[%d] is %d; must be in %d..%d "
           "(query_start decreases at request %d: %d -> %d)", r + 1, hi, lo,
           plan->options.max_rows, r, lo, hi);
    if (hi > plan->options.max_rows)
      fail(QSAKV_ERROR_INVALID_ARGUMENT, "batch.query_start[%d] is %d; the batch has more "
           "than the plan's max_rows %d rows", r + 1, hi, plan->options.max_rows);
    const int n = hi - lo;  // 0 <= lo <= hi <= max_rows
    if (b.seq_lens[r] < n || b.seq_lens[r] > c.max_model_len)
      fail(QSAKV_ERROR_INVALID_ARGUMENT, "batch.seq_lens[%d] is %d; must be in %d..%d "
           "(its %d rows .. max_model_len)", r, b.seq_lens[r], n, c.max_model_len, n);
    if (b.request_slots && (b.request_slots[r] < 0 || b.request_slots[r] >= c.max_requests))
      fail(QSAKV_ERROR_INVALID_ARGUMENT, "batch.request_slots[%d] is %d; must be in 0..%d", r,
           b.request_slots[r], c.max_requests - 1);
    if (b.seq_lens[r] > max_len) max_len = b.seq_lens[r];
  }
  const int rows = b.query_start[b.num_requests];
  if (rows > 0) {
    if (!b.block_table) fail(QSAKV_ERROR_INVALID_ARGUMENT, "batch.block_table is NULL");
    const int64_t pages = (static_cast<int64_t>(max_len) + c.block_size - 1) / c.block_size;
    if (b.block_table_stride < pages)
      fail(QSAKV_ERROR_INVALID_ARGUMENT, "batch.block_table_stride is %d; the longest request "
           "(%d tokens) needs %lld pages of %d", b.block_table_stride, max_len,
           static_cast<long long>(pages), c.block_size);
  }
  return rows;
}

}  // namespace

qsakv::PlanMetaView qsakv_plan::meta_view() const {
  PlanMetaView v;
  char* base = static_cast<char*>(meta.get());
  v.header = reinterpret_cast<const PlanMetaHeader*>(base);
  v.row_request = reinterpret_cast<const int32_t*>(base + sizeof(PlanMetaHeader));
  v.row_pos = v.row_request + options.max_rows;
  v.req_len = v.row_pos + options.max_rows;
  v.req_slot = v.req_len + options.max_requests;
  v.max_rows = options.max_rows;
  v.max_requests = options.max_requests;
  return v;
}

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
      fail(QSAKV_ERROR_INVALID_ARGUMENT, "options.max_rows is %d; must be in 1..%d "
           "(max_batched_tokens, the top-k buffer's rows)", o.max_rows, c.max_batched_tokens);
    if (o.max_requests < 0 || o.max_requests > c.max_requests)
      fail(QSAKV_ERROR_INVALID_ARGUMENT, "options.max_requests is %d; must be in 1..%d",
           o.max_requests, c.max_requests);
    if (o.num_splits < 0 || o.num_splits > 256)
      fail(QSAKV_ERROR_INVALID_ARGUMENT, "options.num_splits is %d; must be in 0..256 "
           "(0: from occupancy)", o.num_splits);
    Backend* be = cache->context->backend.get();
    // One CTA group per (row, KV head, chunk of up to 8 query heads) in the CUDA kernel.
    const int chunks = (cache->geometry.group_size + 7) / 8;
    // Up to 2^20 rows x 4096 KV heads: counted in 64 bits, the occupancy estimate clamped.
    const int64_t groups = static_cast<int64_t>(o.max_rows) * cache->geometry.kv_heads * chunks;
    if (o.num_splits == 0)
      o.num_splits = be->choose_splits(static_cast<int>(std::min<int64_t>(groups, INT32_MAX)),
                                       cache->geometry.topk_width, c.max_model_len);

    auto plan = std::make_unique<qsakv_plan>();
    plan->cache = cache;
    plan->options = o;
    plan->meta_bytes = meta_bytes(o.max_rows, o.max_requests);
    plan->meta = DeviceBuffer(be, plan->meta_bytes);
    plan->staging = HostBuffer(be, plan->meta_bytes);
    const int q_heads = cache->geometry.q_heads;
    if (o.num_splits > 1) {
      const int64_t parts = static_cast<int64_t>(o.max_rows) * q_heads * o.num_splits;
      plan->partial_out = DeviceBuffer(
          be, require_bytes("the split-K workspace's rows x heads x splits (options.max_rows "
                            "times num_splits)", parts, c.head_dim * sizeof(float)));
      plan->partial_lse = DeviceBuffer(be, static_cast<size_t>(parts) * sizeof(float));
      // One arrival counter per CTA group: the last split to finish merges (zeroed here,
      // and reset by that CTA, so captured graphs replay from zero).
      plan->split_counters = DeviceBuffer(be, static_cast<size_t>(groups) * sizeof(int32_t));
    }
    const int64_t max_blocks = c.max_model_len / c.compress_ratio;
    plan->select_ws = DeviceBuffer(be, be->select_workspace_bytes(o.max_rows, max_blocks));
    plan->fence = be->create_fence();
    *out = plan.release();
  });
}

void qsakv_plan_destroy(qsakv_plan* plan) { delete plan; }

qsakv_status qsakv_plan_update(qsakv_plan* plan, const qsakv_batch* batch,
                               qsakv_stream_t stream) {
  return guarded([&] {
    if (!plan) fail(QSAKV_ERROR_INVALID_ARGUMENT, "plan is NULL");
    const qsakv_batch b = read_versioned(batch, default_batch(), "batch");
    const int rows = validate_batch(plan, b);
    Backend* be = plan->cache->context->backend.get();
    // The previous update's copy may still be reading the staging buffer.
    if (plan->fence_pending) {
      be->wait_fence(plan->fence);
      plan->fence_pending = false;
    }
    fill_staging(plan, b, rows);
    be->copy(plan->meta.get(), plan->staging.get(), plan->meta_bytes, QSAKV_COPY_HOST_TO_DEVICE,
             stream);
    be->record_fence(plan->fence, stream);
    plan->fence_pending = true;
    plan->num_rows = rows;
    plan->num_requests = b.num_requests;
    int most = 0;
    for (int r = 0; r < b.num_requests; ++r) most = std::max(most, b.query_start[r + 1] - b.query_start[r]);
    plan->max_request_rows = most;
  });
}

qsakv_status qsakv_plan_get_info(const qsakv_plan* plan, qsakv_plan_info* info) {
  return guarded([&] {
    if (!plan) fail(QSAKV_ERROR_INVALID_ARGUMENT, "plan is NULL");
    qsakv_plan_info i;
    std::memset(&i, 0, sizeof i);
    i.struct_size = sizeof i;
    i.version = QSAKV_PLAN_INFO_VERSION;
    i.max_rows = plan->options.max_rows;
    i.max_requests = plan->options.max_requests;
    i.num_splits = plan->options.num_splits;
    i.num_rows = plan->num_rows < 0 ? 0 : plan->num_rows;
    i.num_requests = plan->num_requests;
    i.workspace_bytes = plan->meta.bytes() + plan->partial_out.bytes() +
                        plan->partial_lse.bytes() + plan->split_counters.bytes() +
                        plan->select_ws.bytes();
    write_versioned(info, i, "info");
  });
}

qsakv_status qsakv_select_topk(qsakv_plan* plan, int32_t layer, const void* index_q,
                               int32_t* topk, int64_t topk_stride, qsakv_stream_t stream) {
  return guarded([&] {
    require_plan(plan);
    const qsakv_cache* cache = plan->cache;
    const int i = require_qsa_layer(cache, layer);
    const qsakv_model_config& c = cache->config;
    const qsakv_rank_geometry& g = cache->geometry;
    resolve_topk(plan, i, topk, topk_stride);
    if (!index_q) fail(QSAKV_ERROR_INVALID_ARGUMENT, "index_q is NULL");
    if (plan->num_rows == 0 && !launches_for_empty_batches(cache)) return;
    SelectParams p{};
    p.meta = plan->meta_view();
    p.index_q = static_cast<const uint16_t*>(index_q);
    p.compressed = reinterpret_cast<const uint16_t*>(cache->compressed_layers[static_cast<size_t>(i)]);
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
    cache->context->backend->select_topk(p, stream);
  });
}

qsakv_status qsakv_attention_run(qsakv_plan* plan, int32_t layer, qsakv_attention_mode mode,
                                 const void* q, const int32_t* topk, int64_t topk_stride,
                                 void* out, qsakv_stream_t stream) {
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
    cache->context->backend->attention(p, stream);
  });
}

}  // extern "C"
