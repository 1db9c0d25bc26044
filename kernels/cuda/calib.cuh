// SPDX-License-Identifier: Apache-2.0
// Calibration statistics on the GPU: the launcher the CUDA backend calls.
#pragma once

#include <cuda_runtime.h>

#include "calib_params.hpp"

namespace qsakv {
namespace cuda {

// Accumulates K and V statistics of one layer into p's device entries. Async on
// `stream`; no allocation; capturable. k and v must be 16-byte aligned.
void launch_calib_observe(const CalibObserveParams& p, int sm_count, cudaStream_t stream);

}  // namespace cuda
}  // namespace qsakv
