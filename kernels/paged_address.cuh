// SPDX-License-Identifier: Apache-2.0
// Where a token's row lives in a paged cache, in host and device code (the CPU backend's
// attention, the decode, grouped and union kernels). Token t of a request sits in page
// t / block_size, which the request's block-table row maps to a physical block (or leaves
// unmapped: any value outside 0 .. num_blocks - 1, -1 by convention), at slot
// t % block_size of that block. The strides are the caller's units (bytes or elements);
// the KV head and the K/V half are the caller's to add.
#pragma once

#include <stdint.h>

#include "hd.cuh"

namespace qsakv {

// A block-table entry that names a block of the cache (an unmapped page reads as zeros
// in attention and is never dereferenced).
QSAKV_HD bool page_mapped(int32_t phys, int64_t num_blocks) {
  return phys >= 0 && phys < num_blocks;
}

// The offset of token t's row in mapped block phys.
QSAKV_HD int64_t paged_row_offset(int32_t phys, int t, int block_size, int64_t stride_block,
                                  int64_t stride_token) {
  return phys * stride_block + static_cast<int64_t>(t % block_size) * stride_token;
}

}  // namespace qsakv
