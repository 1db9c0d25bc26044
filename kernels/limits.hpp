// SPDX-License-Identifier: Apache-2.0
// Kernel geometry that the library's planning and checks depend on, in one place so the
// host side cannot drift from the kernels (both include this header).
#pragma once

namespace qsakv {

// Attention CTAs resident per SM (the kernels' launch bounds): the plan's split count
// fills this many CTA slots per SM.
constexpr int kAttentionCtasPerSm = 2;
// Query heads of one GQA group per attention CTA: the plan sizes its split counters as
// rows x KV heads x ceil(group / kAttentionHeadsPerCta).
constexpr int kAttentionHeadsPerCta = 8;
// The CUDA selection: index heads per row (the N of one MMA tile) and top-k blocks (the
// shared-memory lists of the top-k kernels). Larger configs run on the CPU backend only.
constexpr int kSelectMaxHeads = 8;
constexpr int kSelectMaxTopkBlocks = 1024;

}  // namespace qsakv
