// SPDX-License-Identifier: Apache-2.0
// A plan's batch metadata: its layout in the plan's device buffer (PlanMetaHeader, then
// the row, request and group arrays of kernels/params.hpp), the validation of a caller's
// batch against the plan's limits, and the host-side fill that qsakv_plan_update copies
// to the device, including which rows take the grouped multi-row route.
#pragma once

#include <cstddef>

#include "params.hpp"
#include "qsakv.h"

namespace qsakv {

struct PlanMetaShape {
  int max_rows;
  int max_requests;
  int max_groups;  // 0: the plan has no grouped route
};

// Which requests take the grouped route: those with at least min_rows rows (0: none),
// when the batch has at least min_batch_rows rows in such requests, cut into groups of
// rows_per_group consecutive rows (the last one shorter). Which tokens a group then
// shares is the device's decision, at every launch (kernels/cuda/grouped_union.cuh).
struct GroupingRule {
  int min_rows;
  int min_batch_rows;
  int rows_per_group;
};

// The plan's rule, built in one place: rows_per_group is the backend's for the geometry
// (0: it has no grouped route); multi_row_min_rows is the caller's option (-1 never, 0
// automatic: the measured thresholds of kernels/limits.hpp for this cache type, >= 1 that
// many rows, with no batch minimum). A rule with no route has every field 0.
GroupingRule grouping_rule(int rows_per_group, qsakv_dtype kv_dtype, int multi_row_min_rows);

// The option value a plan reports for its rule (plan_info.multi_row_min_rows): the rows
// from which a request is grouped, or -1 when none is.
inline int reported_min_rows(const GroupingRule& rule) {
  return rule.min_rows == 0 ? -1 : rule.min_rows;
}

// Groups a plan of these limits can need: a request of n >= min_rows rows makes
// ceil(n / rows_per_group) groups, at most n / rows_per_group + 1.
int max_groups_for(int max_rows, int max_requests, const GroupingRule& rule);

size_t plan_meta_bytes(const PlanMetaShape& shape);

// The arrays inside a metadata buffer at `base` (device or host).
PlanMetaView plan_meta_view(void* base, const PlanMetaShape& shape);

// Validates a caller's batch for a plan of these limits (every bound named in the
// message); returns its row count.
int validate_batch(const qsakv_batch& b, const qsakv_model_config& c, int max_rows,
                   int max_requests);

// What one batch's metadata routes: its row groups (<= shape.max_groups; the device
// reads them from the header and row_group[], and the plan launches the grouped kernels
// only when there is one), the rows inside them, and the most rows of one request.
struct PlanRouting {
  int num_groups;
  int grouped_rows;
  int max_request_rows;
  int min_request_rows;  // fewest rows of a request that has any (0: no rows)
};

// Writes the metadata of a validated batch of `rows` rows into `dst`, applying the rule
// (the only place it is applied), and returns what it routed.
PlanRouting fill_plan_meta(void* dst, const qsakv_batch& b, int rows, const PlanMetaShape& shape,
                           const GroupingRule& rule);

}  // namespace qsakv
