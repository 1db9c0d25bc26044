// Capacity math: bytes per token of each cache and what fits in a memory budget.
#pragma once

#include "qsakv.h"

namespace qsakv {

// Validates config; fills every field of qsakv_capacity for the budget.
qsakv_capacity plan_capacity(const qsakv_model_config& config, uint64_t budget_bytes);

}  // namespace qsakv
