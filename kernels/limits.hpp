// SPDX-License-Identifier: Apache-2.0
// Kernel geometry that the library's planning and checks depend on, in one place so the
// host side cannot drift from the kernels (both include this header).
#pragma once

namespace qsakv {

// Attention CTAs per SM that the plan's split count fills (choose_splits), and the SM70
// tier's launch bounds. (The tensor-core decode kernel compiles E4M3 for three per SM:
// decode_ctas_per_sm.)
constexpr int kAttentionCtasPerSm = 2;
// Query heads of one GQA group per attention CTA: the plan sizes its split counters as
// rows x KV heads x ceil(group / kAttentionHeadsPerCta).
constexpr int kAttentionHeadsPerCta = 8;
// The CUDA selection: index heads per row (the N of one MMA tile) and top-k blocks (the
// shared-memory lists of the top-k kernels). Larger configs run on the CPU backend only.
constexpr int kSelectMaxHeads = 8;
constexpr int kSelectMaxTopkBlocks = 1024;

// The grouped multi-row route (kernels/cuda/grouped_attention.cuh): up to this many query
// vectors (rows x query heads of one KV head) per CTA, and rows per group (one bit per
// row in a token's mask).
constexpr int kGroupedMaxVectors = 96;
constexpr int kGroupedMaxRows = 16;
// Entries of a group's token union the workspace holds: twice a row's list. A group whose
// rows select more distinct tokens runs each row's own list instead (correct, slower).
constexpr int grouped_union_cap(int topk_width) { return 2 * topk_width + 64; }
// Split-K of the grouped route: CTAs per KV head it aims for (x SMs) and at most.
constexpr int kGroupedCtasPerSm = 2;
constexpr int kGroupedMaxSplits = 16;
// The plan's automatic routing (option multi_row_min_rows = 0): a request takes the
// grouped route from this many rows, when the batch has at least this many such rows.
// Measured crossovers against the decode route (H200, one call, L2 flushed; docs/perf.md,
// run 21): 64 requests x v verify rows at 32K turn grouped-faster between 6 and 7 rows
// in E4M3 (0.93x -> 1.46x) and at 2 rows in FP16 (1.00x; 1.51x at 3); the grouped route's
// floor is ~100 us (union + per-tile latency with few groups), which the decode route
// beats below ~256 E4M3 rows (0.4 us per row) and ~128 16-bit rows (0.8 us per row).
constexpr int kGroupedAutoMinRowsE4M3 = 7;
constexpr int kGroupedAutoMinBatchRowsE4M3 = 256;
constexpr int kGroupedAutoMinRows16 = 2;
constexpr int kGroupedAutoMinBatchRows16 = 128;

}  // namespace qsakv
