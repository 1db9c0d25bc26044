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
// rows_per_group consecutive rows (the last one shorter).
struct GroupingRule {
  int min_rows;
  int min_batch_rows;
  int rows_per_group;
};

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

// Writes the metadata of a validated batch of `rows` rows into `dst`; returns the number
// of groups (<= shape.max_groups).
int fill_plan_meta(void* dst, const qsakv_batch& b, int rows, const PlanMetaShape& shape,
                   const GroupingRule& rule);

}  // namespace qsakv
