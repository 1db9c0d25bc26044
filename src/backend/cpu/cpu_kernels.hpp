// SPDX-License-Identifier: Apache-2.0
// The reference backend's compute: plain C++, FP32 math, same layouts as the GPU.
#pragma once

#include "calib_params.hpp"
#include "params.hpp"

namespace qsakv {
namespace cpu {

void store_kv(const StoreKvParams& p);
void store_ring(const StoreRowsParams& p);
void store_compressed(const StoreCompressedParams& p);
void select_topk(const SelectParams& p);
void attention(const AttentionParams& p);
void calib_observe(const CalibObserveParams& p);

}  // namespace cpu
}  // namespace qsakv
