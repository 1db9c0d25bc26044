// SPDX-License-Identifier: Apache-2.0
// Plain parameter structs handed from the API layer to a backend. Raw pointers, strides
// and scalars only, so the CUDA kernels can take them by value. They live beside the
// kernels (as the codecs do), which include nothing from src/.
#pragma once

#include <stdint.h>

#include "hd.cuh"
#include "qsakv.h"

namespace qsakv {

// The paged main cache of one layer: [num_blocks, 2, block_size, kv_heads, head_dim].
struct KvCacheView {
  void* data;
  int64_t num_blocks;
  int32_t block_size;
  int32_t kv_heads;
  int32_t head_dim;
  int64_t stride_block;  // elements
  int64_t stride_kv;
  int64_t stride_token;
  int64_t stride_head;
  qsakv_dtype dtype;
  const float* scales;  // device float[2]: k_scale, v_scale
  // Device int32, set to 1 by a store that wrote an E4M3 NaN code. The software decoder
  // patches NaN codes only where this is set, keeping its hot loop free of checks.
  int32_t* nan_flag;
};

struct StoreKvParams {
  KvCacheView cache;
  const void* k;  // [num_tokens, kv_heads, head_dim], activation dtype
  const void* v;
  const int64_t* slot_mapping;
  int64_t num_tokens;
  qsakv_dtype act_dtype;
};

// The compressed index keys of one layer: num_blocks pages of stride_block bytes, page
// b holding keys_per_block keys (FP16: [keys_per_block, dim] FP16; E4M3:
// [keys_per_block, dim] codes, then keys_per_block FP32 scales at scales_offset).
struct CompressedKeysView {
  void* data;
  int64_t num_blocks;
  int32_t keys_per_block;
  int32_t keys_per_block_log2;  // when keys_per_block is a power of two, else -1
  int32_t dim;
  int64_t stride_block;   // bytes
  int64_t scales_offset;  // bytes from a page's start; -1 for FP16 keys
  qsakv_dtype dtype;      // FP16 or E4M3
};

// Compressed key number `entry` (= slot / compress_ratio) of a layer: its bytes, and its
// scale (E4M3; nullptr for FP16 keys).
struct CompressedKeyAddress {
  char* codes;
  float* scale;
};
// Key j of page `page` (the page of cache block `page`).
QSAKV_HD CompressedKeyAddress compressed_key_in_page(const CompressedKeysView& v, int64_t page,
                                                     int j) {
  char* base = static_cast<char*>(v.data) + page * v.stride_block;
  const bool fp8 = v.scales_offset >= 0;
  CompressedKeyAddress a;
  a.codes = base + static_cast<int64_t>(j) * v.dim * (fp8 ? 1 : 2);
  a.scale = fp8 ? reinterpret_cast<float*>(base + v.scales_offset) + j : nullptr;
  return a;
}
QSAKV_HD CompressedKeyAddress compressed_key_address(const CompressedKeysView& v, int64_t entry) {
  return compressed_key_in_page(v, entry / v.keys_per_block,
                                static_cast<int>(entry % v.keys_per_block));
}

// Finished compressed keys (FP16 [num_keys, dim]) into the compressed cache: key i to
// entry slot_mapping[i] / compress_ratio (a negative slot, or an entry beyond the cache,
// skips), quantised per key for E4M3 (qsakv_store_compressed_keys).
struct StoreCompressedParams {
  CompressedKeysView cache;
  const uint16_t* src;
  int64_t num_keys;
  const int64_t* slot_mapping;
  int32_t compress_ratio;
};

// Scatter of FP16 rows into the raw index-key ring: dst[index(i)] = src[i], with
// index = request_slots[i] * ring_length + positions[i] % ring_length (< 0 skips).
struct StoreRowsParams {
  void* dst;
  int64_t dst_rows;
  const uint16_t* src;
  int32_t row_elems;
  int64_t num_rows;
  const int32_t* request_slots;
  const int64_t* positions;
  int32_t ring_length;
  int32_t max_requests;
};

// One step's stores of a layer (qsakv_store_step): each part as its own call's params,
// `has_*` false where the step has none of it.
struct StoreStepParams {
  StoreKvParams kv;
  StoreRowsParams ring;
  StoreCompressedParams compressed;
  bool has_kv, has_ring, has_compressed;
};

// Batch metadata a plan keeps in device memory, rewritten by each update.
// One buffer: this header, then row_request[max_rows], row_pos[max_rows],
// row_group[max_rows], req_len[max_requests], req_slot[max_requests],
// group_row0[max_groups], group_rows[max_groups].
struct PlanMetaHeader {
  int32_t num_rows;
  int32_t num_requests;
  int32_t block_table_stride;
  int32_t num_groups;  // row groups of the grouped route in this batch
  const int32_t* block_table;
};

struct PlanMetaView {
  const PlanMetaHeader* header;
  const int32_t* row_request;
  const int32_t* row_pos;    // query position p of the row
  const int32_t* row_group;  // the row's group on the grouped route; -1: decode route
  const int32_t* req_len;    // request length L
  const int32_t* req_slot;
  const int32_t* group_row0;  // first row of each group (rows of one request, consecutive)
  const int32_t* group_rows;  // its row count, 1..rows_per_group
  int32_t max_rows;
  int32_t max_requests;
  int32_t max_groups;
};

struct SelectParams {
  PlanMetaView meta;
  const uint16_t* index_q;  // [rows, index_heads, index_dim] FP16
  CompressedKeysView keys;  // the layer's compressed index keys (FP16 or E4M3 pages)
  int64_t num_blocks;
  int32_t block_size;
  int32_t index_heads;
  int32_t index_dim;
  int32_t ratio;
  int32_t topk_blocks;  // 512
  int32_t topk_width;   // 2051
  int32_t* topk;        // [rows, topk_stride]
  int64_t topk_stride;
  float* score_workspace;  // backend scratch (plan-owned)
  int64_t score_workspace_elems;
  int64_t max_blocks;  // compressed blocks of the longest request the plan allows
  // Some request of the batch has several rows (verify rows, a prefill chunk): the CUDA
  // backend then scores each key once for all rows of its request (same scores).
  int32_t rows_share_requests;
  // Fewest rows of a request of the batch (that has rows), and the batch's rows: the
  // multi-row scorer's MMA choice (host-side; the kernels read the rows from the metadata).
  int32_t min_request_rows;
  int32_t batch_rows;
};

// The grouped multi-row route's shape and workspace (CUDA backend; zero when a plan has
// no such route). Groups of up to rows_per_group consecutive rows of one request: in
// dense mode a group reads the causal range once for all its rows; in sparse mode the
// union kernel splits its rows' lists, on the device at each launch, into the tokens
// many of its rows select (the group's list, read once for all rows) and each row's own
// entries (computed on the decode route, which then merges the two parts).
struct GroupedView {
  // The routing, decided once per update by fill_plan_meta (src/core/plan_meta.cpp): the
  // device reads it per row from meta.row_group[], the host from num_groups, the number of
  // groups that update made. With none, the grouped kernels are not launched and the
  // decode kernels ignore row_group[] (no empty launches), so a graph captured then runs
  // every later batch on the decode route. The backend also picks the grouped kernel's
  // MMA from it.
  int32_t num_groups;
  int32_t rows_per_group;
  int32_t union_cap;     // list entries per group
  int32_t window;        // the union kernel's positions per pass
  int32_t one_window;    // max_model_len <= window: every group's positions fit one pass
  int32_t wide_window;   // the union kernel's wide variant's window (0: none; limits.hpp)
  int32_t max_items;     // (group, split) work items the partials hold per KV head
  int32_t* union_count;  // [max_groups] listed tokens of the group
  int64_t* union_off;    // [max_groups, union_cap] K row byte offset (KV head 0); -1 none
  uint32_t* union_mask;  // [max_groups, union_cap] bit r: row r of the group selects it
  // [max_rows, topk_width]: each grouped row's own entries (the tokens not in its group's
  // list), in list order, for the decode route.
  int32_t* own_lists;
  // [max_rows] per grouped row: {its own entries, its group's listed tokens}; own -1
  // (kOwnIsTopk): its group listed nothing and its own list is its top-k row.
  int32_t* row_split;
  float* shared_out;   // [max_rows, q_heads, head_dim] a row's shared part, normalised
  float* shared_lse;   // [max_rows, q_heads] its base-2 LSE
  float* partial_out;  // [kv_heads, max_items, kGroupedMaxVectors, head_dim]
  float* partial_lse;  // [kv_heads, max_items, kGroupedMaxVectors]
  int32_t* counters;   // [kv_heads, max_groups], zero between runs
};

struct AttentionParams {
  PlanMetaView meta;
  KvCacheView cache;
  const void* q;  // [rows, q_heads, head_dim] activation dtype
  void* out;      // same
  qsakv_dtype act_dtype;
  int32_t q_heads;
  int32_t group_size;
  float softmax_scale;
  qsakv_attention_mode mode;
  const int32_t* topk;  // sparse: [rows, topk_stride]
  int64_t topk_stride;
  int32_t topk_width;
  int32_t num_splits;
  float* partial_out;       // split-K workspace [max_rows, q_heads, splits, head_dim]
  float* partial_lse;       // [max_rows, q_heads, splits]
  int32_t* split_counters;  // [max_rows, kv_heads, head chunks], zero between runs
  GroupedView grouped;
};

}  // namespace qsakv
