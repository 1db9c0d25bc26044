// SPDX-License-Identifier: Apache-2.0
// A plan's batch metadata: its layout in the plan's device buffer (a header, then
// row_request[max_rows], row_pos[max_rows], req_len[max_requests], req_slot[max_requests]),
// the validation of a caller's batch against the plan's limits, and the host-side fill
// that qsakv_plan_update copies to the device.
#pragma once

#include <cstddef>

#include "params.hpp"
#include "qsakv.h"

namespace qsakv {

size_t plan_meta_bytes(int max_rows, int max_requests);

// The arrays inside a metadata buffer at `base` (device or host).
PlanMetaView plan_meta_view(void* base, int max_rows, int max_requests);

// Validates a caller's batch for a plan of these limits (every bound named in the
// message); returns its row count.
int validate_batch(const qsakv_batch& b, const qsakv_model_config& c, int max_rows,
                   int max_requests);

// Writes the metadata of a validated batch of `rows` rows into `dst`.
void fill_plan_meta(void* dst, const qsakv_batch& b, int rows, int max_rows, int max_requests);

}  // namespace qsakv
