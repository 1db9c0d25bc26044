// SPDX-License-Identifier: Apache-2.0
// The CUDA kernel tier a context asks for: parsed from QSAKV_CUDA_TIER at context creation
// (a test hook: it lets an SM75+ GPU run the SM70 tier, the V100 code path).
#pragma once

#include "qsakv.h"

namespace qsakv {

constexpr const char* kCudaTierEnv = "QSAKV_CUDA_TIER";

// NONE means "from the GPU's compute capability". value may be nullptr (unset); "" and
// "auto" are the default. Anything else but "sm70" / "sm75" fails with
// QSAKV_ERROR_INVALID_ARGUMENT, naming the variable and the accepted values.
qsakv_kernel_tier parse_cuda_tier(const char* value);

// The tier the GPU gets unless one is forced: SM70..SM74 -> SM70, SM75+ -> SM75; NONE
// below SM70 (no kernels).
qsakv_kernel_tier default_cuda_tier(int sm_version);

const char* cuda_tier_name(qsakv_kernel_tier tier);

}  // namespace qsakv
