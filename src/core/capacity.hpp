// SPDX-License-Identifier: Apache-2.0
// Capacity math: bytes per token of each cache and what fits in a memory budget.
#pragma once

#include "qsakv.h"

namespace qsakv {

// Where the top-k workspace comes from: its fixed cost differs.
enum class TopkBuffer { kShared, kPerLayer, kExternal };

// Validates config; fills every field of qsakv_capacity for the budget. The blocks that
// fit are what remains after the rings and the top-k workspace of `topk` (the public
// qsakv_capacity_plan reports the shared case).
qsakv_capacity plan_capacity(const qsakv_model_config& config, uint64_t budget_bytes,
                             TopkBuffer topk = TopkBuffer::kShared);

}  // namespace qsakv
