// SPDX-License-Identifier: Apache-2.0
// The last-arrival ticket: several CTAs write partial results to global memory, and the
// one that finishes last combines them (the split-K merges of both attention routes, the
// selection's filter route). Each CTA makes its writes visible, then takes a ticket from
// a counter shared by the CTAs of its task; the CTA whose ticket is the last one of
// `expected` resets the counter (so the next launch, e.g. a graph replay, starts from
// zero without a memset) and is the only one to return true, after a fence that orders
// its reads after every other CTA's writes.
#pragma once

#include <stdint.h>

namespace qsakv {
namespace cuda {

// Called by every thread of the CTA; `flag` is a __shared__ int of the caller (the kernels
// keep it in their own shared-memory layouts). Returns the same value in every thread.
__device__ __forceinline__ bool arrive_last(int32_t* counter, int expected, int& flag) {
  __threadfence();  // this CTA's partials are visible before it is counted
  __syncthreads();
  if (threadIdx.x == 0) {
    const int arrived = atomicAdd(counter, 1);
    flag = arrived == expected - 1;
    if (flag) *counter = 0;  // ready for the next launch
  }
  __syncthreads();
  if (!flag) return false;
  __threadfence();
  return true;
}

}  // namespace cuda
}  // namespace qsakv
