// SPDX-License-Identifier: Apache-2.0
// The plan's row routing (compiled in from src/core: the host side of the grouped
// multi-row route, which the GPU suites exercise end to end): the rule a plan's options
// make, which requests take the grouped route, how their rows are cut into groups, what
// the fill reports, and the bound on the group count a plan allocates for.
#include <vector>

#include "core/plan_meta.hpp"
#include "limits.hpp"
#include "testutil.h"

namespace {

struct Batch {
  std::vector<int32_t> query_start, seq_lens;
  qsakv_batch b;
  explicit Batch(const std::vector<int>& rows) {
    query_start.push_back(0);
    for (int n : rows) {
      query_start.push_back(query_start.back() + n);
      seq_lens.push_back(1000 + n);
    }
    b = QSAKV_BATCH_INIT;
    b.num_requests = static_cast<int32_t>(rows.size());
    b.query_start = query_start.data();
    b.seq_lens = seq_lens.data();
  }
  int rows() const { return query_start.back(); }
};

struct Filled {
  qsakv::PlanMetaShape shape;
  std::vector<char> buf;
  qsakv::PlanMetaView v;
  qsakv::PlanRouting routed;
};

Filled fill(const Batch& b, const qsakv::GroupingRule& rule, int max_rows, int max_requests) {
  Filled f;
  f.shape = {max_rows, max_requests, qsakv::max_groups_for(max_rows, max_requests, rule)};
  f.buf.assign(qsakv::plan_meta_bytes(f.shape), '\x5a');
  f.v = qsakv::plan_meta_view(f.buf.data(), f.shape);
  f.routed = qsakv::fill_plan_meta(f.buf.data(), b.b, b.rows(), f.shape, rule);
  return f;
}

// Groups cover exactly the grouped rows, in order, each within one request and at most
// rows_per_group long; row_group names the group holding the row.
void check_groups(const Filled& f, const Batch& b, const qsakv::GroupingRule& rule) {
  assert_int_equal(f.v.header->num_groups, f.routed.num_groups);
  for (int g = 0; g < f.routed.num_groups; ++g) {
    const int r0 = f.v.group_row0[g], n = f.v.group_rows[g];
    assert_true(n >= 1 && n <= rule.rows_per_group);
    for (int j = 0; j < n; ++j) {
      assert_int_equal(f.v.row_group[r0 + j], g);
      assert_int_equal(f.v.row_request[r0 + j], f.v.row_request[r0]);
      assert_int_equal(f.v.row_pos[r0 + j], f.v.row_pos[r0] + j);
    }
  }
  for (int r = 0; r < b.b.num_requests; ++r) {
    const int n = b.query_start[r + 1] - b.query_start[r];
    for (int j = 0; j < n; ++j) {
      const bool grouped = f.v.row_group[b.query_start[r] + j] >= 0;
      assert_int_equal(grouped, f.routed.num_groups > 0 && n >= rule.min_rows);
    }
  }
}

void test_requests_from_min_rows_are_grouped(void** state) {
  (void)state;
  const qsakv::GroupingRule rule{4, 0, 16};
  const Batch b({1, 4, 16, 1, 0, 27, 3, 40});
  const Filled f = fill(b, rule, 128, 8);
  // 4 -> 1 group, 16 -> 1, 27 -> 2 (16 + 11), 40 -> 3 (16 + 16 + 8)
  assert_int_equal(f.routed.num_groups, 7);
  assert_int_equal(f.routed.grouped_rows, 4 + 16 + 27 + 40);
  assert_int_equal(f.routed.max_request_rows, 40);
  assert_int_equal(f.routed.min_request_rows, 1);  // the request of 0 rows does not count
  assert_int_equal(f.v.group_rows[3], 11);
  assert_int_equal(f.v.group_rows[6], 8);
  check_groups(f, b, rule);
}

void test_batch_minimum(void** state) {
  (void)state;
  const qsakv::GroupingRule rule{7, 256, 16};
  const Batch few(std::vector<int>(30, 8));         // 240 rows of 8-row requests: below 256
  const Batch enough(std::vector<int>(40, 7));      // 280 rows of 7-row requests
  const Batch short_rows(std::vector<int>(64, 6));  // 384 rows, every request below 7
  const Filled f = fill(few, rule, 512, 64);
  assert_int_equal(f.routed.num_groups, 0);
  assert_int_equal(f.routed.grouped_rows, 0);  // long enough, but too few in the batch
  assert_int_equal(f.routed.max_request_rows, 8);
  assert_int_equal(f.routed.min_request_rows, 8);
  const Filled e = fill(enough, rule, 512, 64);
  assert_int_equal(e.routed.num_groups, 40);
  assert_int_equal(e.routed.grouped_rows, 280);
  check_groups(e, enough, rule);
  const Filled s = fill(short_rows, rule, 512, 64);
  assert_int_equal(s.routed.num_groups, 0);
  assert_int_equal(s.routed.min_request_rows, 6);
  check_groups(s, short_rows, rule);
}

void test_no_route(void** state) {
  (void)state;
  const Batch b({20, 30});
  // min_rows 0 (the caller said never, or no backend route): no group, no arrays.
  const qsakv::GroupingRule never{0, 0, 0};
  const Filled f = fill(b, never, 64, 4);
  assert_int_equal(f.shape.max_groups, 0);
  assert_int_equal(f.routed.num_groups, 0);
  for (int r = 0; r < b.rows(); ++r) assert_int_equal(f.v.row_group[r], -1);
  // A plan too small for the batch minimum allocates no groups either.
  assert_int_equal(qsakv::max_groups_for(200, 64, {7, 256, 16}), 0);
}

// The bound holds for the batches that make the most groups: every request just at the
// threshold, and one row past each multiple of rows_per_group.
void test_group_bound(void** state) {
  (void)state;
  for (int min_rows = 1; min_rows <= 20; ++min_rows)
    for (int per = 1; per <= 16; per *= 2) {
      const qsakv::GroupingRule rule{min_rows, 0, per};
      const int max_rows = 200, max_requests = 64;
      std::vector<int> rows;
      int total = 0;
      const int n = std::max(min_rows, per + 1);
      while (static_cast<int>(rows.size()) < max_requests && total + n <= max_rows) {
        rows.push_back(n);
        total += n;
      }
      const Batch b(rows);
      const Filled f = fill(b, rule, max_rows, max_requests);
      assert_true(f.routed.num_groups <= f.shape.max_groups);
      check_groups(f, b, rule);
    }
}

// The rule from a plan's option and the backend's rows per group, and what the plan
// reports for it.
void test_rule_from_options(void** state) {
  (void)state;
  auto same = [](const qsakv::GroupingRule& a, const qsakv::GroupingRule& b) {
    assert_int_equal(a.min_rows, b.min_rows);
    assert_int_equal(a.min_batch_rows, b.min_batch_rows);
    assert_int_equal(a.rows_per_group, b.rows_per_group);
  };
  const qsakv::GroupingRule none{0, 0, 0};
  same(qsakv::grouping_rule(16, QSAKV_DTYPE_E4M3, -1), none);  // the caller said never
  same(qsakv::grouping_rule(0, QSAKV_DTYPE_E4M3, 0), none);    // no route on this backend
  same(qsakv::grouping_rule(0, QSAKV_DTYPE_FP16, 4), none);
  same(qsakv::grouping_rule(16, QSAKV_DTYPE_E4M3, 0),
       {qsakv::kGroupedAutoMinRowsE4M3, qsakv::kGroupedAutoMinBatchRowsE4M3, 16});
  same(qsakv::grouping_rule(8, QSAKV_DTYPE_FP16, 0),
       {qsakv::kGroupedAutoMinRows16, qsakv::kGroupedAutoMinBatchRows16, 8});
  same(qsakv::grouping_rule(8, QSAKV_DTYPE_BF16, 0),
       {qsakv::kGroupedAutoMinRows16, qsakv::kGroupedAutoMinBatchRows16, 8});
  same(qsakv::grouping_rule(16, QSAKV_DTYPE_E4M3, 3), {3, 0, 16});  // no batch minimum
  assert_int_equal(qsakv::reported_min_rows(none), -1);
  assert_int_equal(qsakv::reported_min_rows(qsakv::grouping_rule(16, QSAKV_DTYPE_FP16, 0)),
                   qsakv::kGroupedAutoMinRows16);
  assert_int_equal(qsakv::reported_min_rows({3, 0, 16}), 3);
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_requests_from_min_rows_are_grouped),
      cmocka_unit_test(test_batch_minimum),
      cmocka_unit_test(test_no_route),
      cmocka_unit_test(test_group_bound),
      cmocka_unit_test(test_rule_from_options),
  };
  return cmocka_run_group_tests_name("plan_routing", tests, NULL, NULL);
}
