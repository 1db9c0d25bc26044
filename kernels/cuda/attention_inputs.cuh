// SPDX-License-Identifier: Apache-2.0
// What every attention kernel reads, whatever its route: the plan's row metadata, the
// layer's paged cache (byte strides; paged_address.cuh turns a token into its row), the
// rows' queries and outputs, and the layer's scales. The decode route's parameters extend
// it with its lists, splits and merge workspace (decode_attention.cuh); the grouped
// route's hold it next to the group lists and their partials (grouped_attention.cuh).
#pragma once

#include <stdint.h>

#include "params.hpp"

namespace qsakv {
namespace cuda {

// The cache's element type, as the kernels are compiled for it.
enum class KvKind { kE4M3 = 0, kFp16 = 1, kBf16 = 2 };

struct AttentionInputs {
  const PlanMetaHeader* header;
  const int32_t* row_request;
  const int32_t* row_pos;
  // A grouped row (sparse): GroupedView::row_split's {own entries (-1: its top-k row is
  // its own list), its group's listed tokens}.
  const int2* row_split;
  const uint8_t* kv;     // the layer's main cache
  int64_t stride_block;  // bytes
  int64_t stride_kv;     // bytes
  int64_t stride_token;  // bytes
  int64_t stride_head;   // bytes
  int32_t block_size;
  int64_t num_blocks;
  const float* scales;      // device [k_scale, v_scale]
  const int32_t* nan_flag;  // device: an E4M3 NaN code was stored in this layer
  const void* q;            // [rows, q_heads, D]
  void* out;                // [rows, q_heads, D]
  int32_t q_heads;
  int32_t group;  // query heads per KV head
  int32_t kv_heads;
  float softmax_scale_log2;  // softmax_scale * log2(e)
  int32_t dense;
};

// The inputs from the backend's parameters (host code; every route and tier).
inline void fill_attention_inputs(AttentionInputs& in, const AttentionParams& p) {
  const KvCacheView& c = p.cache;
  const int64_t esz = c.dtype == QSAKV_DTYPE_E4M3 ? 1 : 2;
  in.header = p.meta.header;
  in.row_request = p.meta.row_request;
  in.row_pos = p.meta.row_pos;
  in.row_split = reinterpret_cast<const int2*>(p.grouped.row_split);
  in.kv = static_cast<const uint8_t*>(c.data);
  in.stride_block = c.stride_block * esz;
  in.stride_kv = c.stride_kv * esz;
  in.stride_token = c.stride_token * esz;
  in.stride_head = c.stride_head * esz;
  in.block_size = c.block_size;
  in.num_blocks = c.num_blocks;
  in.scales = c.scales;
  in.nan_flag = c.nan_flag;
  in.q = p.q;
  in.out = p.out;
  in.q_heads = p.q_heads;
  in.group = p.group_size;
  in.kv_heads = c.kv_heads;
  in.softmax_scale_log2 = p.softmax_scale * 1.4426950408889634f;
  in.dense = p.mode == QSAKV_ATTENTION_DENSE;
}

}  // namespace cuda
}  // namespace qsakv
