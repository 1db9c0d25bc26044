// SPDX-License-Identifier: Apache-2.0
#include "core/plan_meta.hpp"

#include <cstdint>

#include "core/error.hpp"

namespace qsakv {

size_t plan_meta_bytes(int max_rows, int max_requests) {
  return sizeof(PlanMetaHeader) + sizeof(int32_t) * (2 * static_cast<size_t>(max_rows) +
                                                     2 * static_cast<size_t>(max_requests));
}

PlanMetaView plan_meta_view(void* base_ptr, int max_rows, int max_requests) {
  PlanMetaView v;
  char* base = static_cast<char*>(base_ptr);
  v.header = reinterpret_cast<const PlanMetaHeader*>(base);
  v.row_request = reinterpret_cast<const int32_t*>(base + sizeof(PlanMetaHeader));
  v.row_pos = v.row_request + max_rows;
  v.req_len = v.row_pos + max_rows;
  v.req_slot = v.req_len + max_requests;
  v.max_rows = max_rows;
  v.max_requests = max_requests;
  return v;
}

void fill_plan_meta(void* dst, const qsakv_batch& b, int rows, int max_rows, int max_requests) {
  char* base = static_cast<char*>(dst);
  auto* h = reinterpret_cast<PlanMetaHeader*>(base);
  auto* row_request = reinterpret_cast<int32_t*>(base + sizeof(PlanMetaHeader));
  int32_t* row_pos = row_request + max_rows;
  int32_t* req_len = row_pos + max_rows;
  int32_t* req_slot = req_len + max_requests;
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
