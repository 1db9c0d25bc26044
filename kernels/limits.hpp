// SPDX-License-Identifier: Apache-2.0
// Kernel geometry that the library's planning and checks depend on, in one place so the
// host side cannot drift from the kernels (both include this header).
#pragma once

namespace qsakv {

// Compute capabilities (major * 10 + minor) at which the CUDA backend's choices change;
// the kernels themselves guard instructions with __CUDA_ARCH__.
constexpr int kSmSimtTier = 70;         // the SM70 tier: CUDA-core kernels (V100)
constexpr int kSmTensorCoreTier = 75;   // mma.sync, ldmatrix, movmatrix: the SM75 tier
constexpr int kSmBf16TensorCores = 80;  // BF16 MMAs (BF16 caches on the SM75 tier)
constexpr int kSmFp8Convert = 89;       // cvt between E4M3 and FP16: the hardware decoder
// Measured on SM90 (H200), so taken there and on newer GPUs: the decode route's E4M3 copy
// ring (needs SM80's cp.async) and the selection's programmatic dependent launch.
constexpr int kSmCopyRing = 90;
constexpr int kSmProgrammaticLaunch = 90;
// Warpgroup MMAs (wgmma) exist only in arch-specific sm_90a code, which runs on SM 9.0
// alone (not on later GPUs): the grouped kernel's warpgroup variant is for exactly this SM.
constexpr int kSmWarpgroupMma = 90;

// Attention CTAs per SM that the plan's split count fills (choose_splits), and the SM70
// tier's launch bounds. (The tensor-core decode kernel compiles E4M3 for three per SM:
// decode_ctas_per_sm.)
constexpr int kAttentionCtasPerSm = 2;
// The largest split count a plan takes (options.num_splits): the last CTA's merge keeps
// one weight per split and head in the warp-merge storage (a static_assert there).
constexpr int kMaxSplits = 256;
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
// Which of a group's tokens are read once for all its rows (its shared list, on tensor
// cores): those that at least grouped_share_min_rows(n, ...) of its n rows select. Each
// row's other entries run on the decode route, and the two partial softmax states merge
// (docs/attention.md). A shared token costs the group about what share_rows rows reading
// it on the decode route cost, by the measured crossovers (H200, docs/perf.md run 20: an
// E4M3 16-row group at ~8 rows, grouped 798 us over 512 groups x ~2,066 tokens against
// decode 1,532 us over 8192 rows x 2,051; verify requests turn grouped-faster at 7 rows in
// E4M3 and at 2-3 in FP16, whose decode route reads twice the bytes). At least half of
// the group's rows, always: that bounds the shared list, since each shared token stands
// for at least n / 2 of the group's n x width entries, so a group never shares more than
// 2 x width tokens and no list outgrows the workspace. And at least 2 (one row alone is
// the decode route's).
constexpr int kGroupedShareRowsE4M3 = 7;
constexpr int kGroupedShareRows16 = 3;
constexpr int grouped_share_min_rows(int rows, int share_rows) {
  const int half = (rows + 1) / 2, cost = rows < share_rows ? rows : share_rows;
  const int t = half > cost ? half : cost;
  return t > 2 ? t : 2;
}
// A group sharing fewer tokens than this shares none (its rows run on the decode route
// alone): the shared part's fixed cost per group (its Q, one partial per row written and
// merged) is about that of 64 tokens read by every row on the decode route. Random lists
// of 8 rows at 32K share ~35 tokens by chance.
constexpr int kGroupedMinShared = 64;
// In a group that shares, a row left with at most this many entries of its own moves them
// into the group's list too (only its own bit in their masks), so it needs no decode-route
// pass: such a pass is a chain of dependent round trips per row whatever its length
// (~30 ns per row of GPU time at 8192 rows on an H200, docs/perf.md), about what 32 extra
// list tokens cost the group. The open group's tail (up to 3 tokens that only the group's
// rows at those positions can select) is the common case.
constexpr int kGroupedOwnMax = 32;
// Entries of a group's list the workspace holds: what the sharing rule allows (2 x width)
// plus what moved rows add.
constexpr int grouped_union_cap(int topk_width) {
  return 2 * topk_width + 64 + kGroupedMaxRows * kGroupedOwnMax;
}
// The union kernel keeps one 16-bit row mask per position of a window of this many
// positions in shared memory (128 KB); the plan sizes the window to the model's length
// where that is shorter (grouped_union_window), and longer contexts take several passes.
constexpr int kGroupedUnionWindow = 65536;
constexpr int kGroupedUnionThreads = 1024;
constexpr int grouped_union_window(int max_model_len) {
  // Each thread owns 8 consecutive positions or a multiple: whole 16-byte reads of masks.
  constexpr int kStep = 8 * kGroupedUnionThreads;
  const int rounded = (max_model_len + kStep - 1) / kStep * kStep;
  return rounded < kGroupedUnionWindow ? rounded : kGroupedUnionWindow;
}
// Past one such window and up to this many positions, the union kernel's wide variant
// keeps an 8-bit count per position instead (196 KB of shared memory for 2051-entry lists
// at 128K, 160 KB at 96K: where the GPU's opt-in limit per CTA holds it, SM90 and SM100 at
// 128K; elsewhere the windows), so the group is one window; docs/perf.md run 41. Its
// window, or 0 where it does not apply.
constexpr int kGroupedUnionWideWindow = 131072;
constexpr int grouped_union_wide_window(int max_model_len) {
  // Each thread owns whole 32-position words of listed bits.
  constexpr int kStep = 32 * kGroupedUnionThreads;
  if (max_model_len <= kGroupedUnionWindow || max_model_len > kGroupedUnionWideWindow) return 0;
  return (max_model_len + kStep - 1) / kStep * kStep;
}

// Split-K of the grouped route: CTAs per KV head it aims for (x SMs) and at most.
constexpr int kGroupedCtasPerSm = 2;
constexpr int kGroupedMaxSplits = 16;
// The plan's automatic routing (option multi_row_min_rows = 0): a request takes the
// grouped route from this many rows, when the batch has at least this many such rows.
// Measured against the decode route (H200, one call, L2 flushed; docs/perf.md, run 25, the
// drifting lists of 64 requests x v verify rows at 32K, after the decode route's runs
// 21-24 made it faster): E4M3 stays decode-faster at 7 and 8 rows (138 vs 162, 153 vs
// 164 us) and turns grouped-faster by 20 (293 vs 270); FP16 turns at 5 rows (174 vs 161;
// at 4, 95 vs 158). Run 21 had 7 and 2. The grouped route's floor (~100-150 us: the split
// kernel and per-tile latency with few groups) needs at least ~256 E4M3 / ~128 16-bit
// rows to repay.
constexpr int kGroupedAutoMinRowsE4M3 = 9;
constexpr int kGroupedAutoMinBatchRowsE4M3 = 256;
constexpr int kGroupedAutoMinRows16 = 5;
constexpr int kGroupedAutoMinBatchRows16 = 128;

}  // namespace qsakv
