// SPDX-License-Identifier: Apache-2.0
#include "core/plan_meta.hpp"

#include <algorithm>
#include <cstdint>

#include "core/error.hpp"
#include "limits.hpp"

namespace qsakv {

GroupingRule grouping_rule(int rows_per_group, qsakv_dtype kv_dtype, int multi_row_min_rows) {
  if (multi_row_min_rows == -1 || rows_per_group <= 0) return GroupingRule{0, 0, 0};
  const bool e4m3 = kv_dtype == QSAKV_DTYPE_E4M3;
  if (multi_row_min_rows > 0) return GroupingRule{multi_row_min_rows, 0, rows_per_group};
  // Automatic: a request needs enough rows, and the batch enough such rows, to pay for the
  // route's fixed cost (docs/perf.md says on which workloads these were measured).
  return GroupingRule{e4m3 ? kGroupedAutoMinRowsE4M3 : kGroupedAutoMinRows16,
                      e4m3 ? kGroupedAutoMinBatchRowsE4M3 : kGroupedAutoMinBatchRows16,
                      rows_per_group};
}

int max_groups_for(int max_rows, int max_requests, const GroupingRule& rule) {
  if (rule.min_rows <= 0 || rule.rows_per_group <= 0 || max_rows < rule.min_rows ||
      max_rows < rule.min_batch_rows)
    return 0;  // no batch of this plan can take the route
  const int requests = std::min(max_requests, max_rows / rule.min_rows);
  return max_rows / rule.rows_per_group + requests;
}

size_t plan_meta_bytes(const PlanMetaShape& s) {
  return sizeof(PlanMetaHeader) + sizeof(int32_t) * (3 * static_cast<size_t>(s.max_rows) +
                                                     2 * static_cast<size_t>(s.max_requests) +
                                                     2 * static_cast<size_t>(s.max_groups));
}

PlanMetaView plan_meta_view(void* base_ptr, const PlanMetaShape& s) {
  PlanMetaView v;
  char* base = static_cast<char*>(base_ptr);
  v.header = reinterpret_cast<const PlanMetaHeader*>(base);
  v.row_request = reinterpret_cast<const int32_t*>(base + sizeof(PlanMetaHeader));
  v.row_pos = v.row_request + s.max_rows;
  v.row_group = v.row_pos + s.max_rows;
  v.req_len = v.row_group + s.max_rows;
  v.req_slot = v.req_len + s.max_requests;
  v.group_row0 = v.req_slot + s.max_requests;
  v.group_rows = v.group_row0 + s.max_groups;
  v.max_rows = s.max_rows;
  v.max_requests = s.max_requests;
  v.max_groups = s.max_groups;
  return v;
}

PlanRouting fill_plan_meta(void* dst, const qsakv_batch& b, int rows, const PlanMetaShape& shape,
                           const GroupingRule& rule) {
  const PlanMetaView v = plan_meta_view(dst, shape);
  auto* h = const_cast<PlanMetaHeader*>(v.header);
  auto* row_request = const_cast<int32_t*>(v.row_request);
  auto* row_pos = const_cast<int32_t*>(v.row_pos);
  auto* row_group = const_cast<int32_t*>(v.row_group);
  auto* req_len = const_cast<int32_t*>(v.req_len);
  auto* req_slot = const_cast<int32_t*>(v.req_slot);
  auto* group_row0 = const_cast<int32_t*>(v.group_row0);
  auto* group_rows = const_cast<int32_t*>(v.group_rows);
  // Rows in requests long enough for the grouped route: too few, and none takes it.
  int eligible = 0;
  if (shape.max_groups > 0 && rule.min_rows > 0)
    for (int r = 0; r < b.num_requests; ++r) {
      const int n = b.query_start[r + 1] - b.query_start[r];
      if (n >= rule.min_rows) eligible += n;
    }
  const bool route = eligible > 0 && eligible >= rule.min_batch_rows;
  int groups = 0, most = 0, least = 0;
  for (int r = 0; r < b.num_requests; ++r) {
    const int first = b.query_start[r];
    const int n = b.query_start[r + 1] - first;
    const bool grouped = route && n >= rule.min_rows;
    most = std::max(most, n);
    if (n > 0) least = least == 0 ? n : std::min(least, n);
    for (int j = 0; j < n; ++j) {
      row_request[first + j] = r;
      row_pos[first + j] = b.seq_lens[r] - n + j;
      row_group[first + j] = grouped ? groups + j / rule.rows_per_group : -1;
    }
    if (grouped)
      for (int j = 0; j < n; j += rule.rows_per_group) {
        // max_groups_for bounds the count for every valid batch; a broken bound must
        // not write past the arrays.
        if (groups >= shape.max_groups)
          fail(QSAKV_ERROR_INTERNAL, "the batch makes more than the plan's %d row groups",
               shape.max_groups);
        group_row0[groups] = first + j;
        group_rows[groups] = std::min(rule.rows_per_group, n - j);
        ++groups;
      }
    req_len[r] = b.seq_lens[r];
    req_slot[r] = b.request_slots ? b.request_slots[r] : r;
  }
  h->num_rows = rows;
  h->num_requests = b.num_requests;
  h->block_table_stride = b.block_table_stride;
  h->num_groups = groups;
  h->block_table = b.block_table;
  return PlanRouting{groups, route ? eligible : 0, most, least};
}

int validate_batch(const qsakv_batch& b, const qsakv_model_config& c, int max_rows,
                   int max_requests) {
  if (b.num_requests < 0 || b.num_requests > max_requests)
    fail(QSAKV_ERROR_INVALID_ARGUMENT, "batch.num_requests is %d; the plan serves 0..%d",
         b.num_requests, max_requests);
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
      fail(QSAKV_ERROR_INVALID_ARGUMENT,
           "batch.query_start[%d] is %d; must be in %d..%d "
           "(query_start decreases at request %d: %d -> %d)",
           r + 1, hi, lo, max_rows, r, lo, hi);
    if (hi > max_rows)
      fail(QSAKV_ERROR_INVALID_ARGUMENT,
           "batch.query_start[%d] is %d; the batch has more "
           "than the plan's max_rows %d rows",
           r + 1, hi, max_rows);
    const int n = hi - lo;  // 0 <= lo <= hi <= max_rows
    if (b.seq_lens[r] < n || b.seq_lens[r] > c.max_model_len)
      fail(QSAKV_ERROR_INVALID_ARGUMENT,
           "batch.seq_lens[%d] is %d; must be in %d..%d "
           "(its %d rows .. max_model_len)",
           r, b.seq_lens[r], n, c.max_model_len, n);
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
      fail(QSAKV_ERROR_INVALID_ARGUMENT,
           "batch.block_table_stride is %d; the longest request "
           "(%d tokens) needs %lld pages of %d",
           b.block_table_stride, max_len, static_cast<long long>(pages), c.block_size);
  }
  return rows;
}

}  // namespace qsakv
