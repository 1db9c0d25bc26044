// SPDX-License-Identifier: Apache-2.0
// The cache's layout: blocks per layer and the strides and bytes of every per-layer
// buffer, computed once here for the cache (library- or caller-allocated) and for
// qsakv_cache_layout_for, with checked arithmetic (nothing wraps).
#pragma once

#include <cstdint>

#include "qsakv.h"

namespace qsakv {

// One cache block's page of compressed index keys (qsakv_cache_layout's description).
struct CompressedPage {
  int32_t keys;           // block_size / compress_ratio
  int64_t stride_bytes;   // bytes per page
  int64_t scales_offset;  // E4M3: the FP32 scales' offset in the page; FP16: -1
};
CompressedPage compressed_page(const qsakv_model_config& c);

// Blocks per layer: options.num_blocks, or as many as options.memory_budget_bytes holds.
int64_t resolve_num_blocks(const qsakv_model_config& c, const qsakv_cache_options& o);

// Strides and bytes per layer of a cache of num_blocks blocks; checks the top-k options.
// total_bytes is left 0 (what is allocated depends on who owns the memory).
qsakv_cache_layout build_layout(const qsakv_model_config& c, const qsakv_rank_geometry& g,
                                const qsakv_cache_options& o, int64_t num_blocks);

}  // namespace qsakv
