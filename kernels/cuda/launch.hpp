// SPDX-License-Identifier: Apache-2.0
// Host-side launchers of the CUDA kernels (compiled by nvcc, called by the backend).
#pragma once

#include <cuda_runtime.h>

#include <cstdarg>
#include <cstdio>
#include <stdexcept>

#include "calib_params.hpp"
#include "params.hpp"
#include "qsakv.h"

namespace qsakv {
namespace cuda {

// A launch the kernels cannot make (a shape or dtype without a kernel, a failed attribute
// call or launch), thrown by a launcher with its status; the backend reports it as a library error
// (kernels/ does not include the library's error machinery).
class LaunchError : public std::runtime_error {
 public:
  LaunchError(qsakv_status status, const char* what) : std::runtime_error(what), status_(status) {}
  qsakv_status status() const noexcept { return status_; }

 private:
  qsakv_status status_;
};
[[noreturn]] inline void refuse_launch(qsakv_status status, const char* fmt, ...) {
  char message[256];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(message, sizeof message, fmt, ap);
  va_end(ap);
  throw LaunchError(status, message);
}
// Refuses the launch with a failed runtime call's error `e` (OUT_OF_MEMORY for an
// allocation failure, else CUDA), after clearing it from the thread's last error: it is
// the library's own, and must not stay pending for the caller's next check.
[[noreturn]] inline void refuse_failed_call(cudaError_t e, const char* call) {
  (void)cudaGetLastError();
  refuse_launch(e == cudaErrorMemoryAllocation ? QSAKV_ERROR_OUT_OF_MEMORY : QSAKV_ERROR_CUDA,
                "%s: %s (%s)", call, cudaGetErrorString(e), cudaGetErrorName(e));
}

// programmatic (every launcher): launch the kernels as programmatic dependents of the
// stream's previous kernel (dependent_launch.cuh). The backend decides per kernel family:
// SM90+ outside the SM70 tier, the families QSAKV_DEPENDENT_LAUNCH names (by default the
// stores and the selection; core/kernel_tier.hpp).

// Whether the code the current device runs was compiled for SM90+, where the kernels'
// waits exist (dependent_launch.cuh). A build without an SM90+ entry in QSAKV_CUDA_ARCHS
// runs on an SM90 GPU from the PTX of an older architecture, with the waits compiled out:
// it must launch plainly.
bool dependent_launch_compiled();
// fp8_instructions: false on the SM70 tier (the integer E4M3 encoder, as on a V100).
void launch_store_kv(const StoreKvParams& p, bool fp8_instructions, bool programmatic,
                     cudaStream_t stream);
void launch_store_ring(const StoreRowsParams& p, int sm_count, bool programmatic,
                       cudaStream_t stream);
void launch_store_compressed(const StoreCompressedParams& p, int sm_count, bool programmatic,
                             cudaStream_t stream);
// The three in one launch (store_step_kernel); false, launching nothing, for a K/V part too
// large for one launch's 32-bit thread indices (the caller then makes the three launches).
bool launch_store_step(const StoreStepParams& p, bool fp8_instructions, int sm_count,
                       bool programmatic, cudaStream_t stream);
// hardware_decoder: use the FP8 conversion instructions (SM89+) for E4M3 caches. simt:
// the SM70 tier (CUDA-core FP32, decode_attention_simt.cuh), same semantics.
// ring_sms: the GPU's SM count where the copy ring is routed (SM90+, where it was
// measured; the kernel itself needs SM80), else 0: E4M3 at head_dim 256 then streams K/V
// through a shared-memory ring instead of registers where that measured faster
// (use_ring). Throws LaunchError for a head_dim or cache type without a kernel.
void launch_decode_attention(const AttentionParams& p, bool hardware_decoder, bool simt,
                             int ring_sms, bool programmatic, cudaStream_t stream);
void launch_decode_attention_simt(const AttentionParams& p, cudaStream_t stream);
// The grouped multi-row route (SM75+ tensor-core tier): the rows of the plan's row groups
// (p.meta.row_group >= 0; the decode kernels skip them). No-op for a plan without groups.
// rows_per_group: the group size the kernels take for this GQA group and head_dim (0: no
// grouped route for that geometry).
int grouped_rows_per_group(int group_size, int head_dim);
// warpgroup_mma: the SM90 kernel (wgmma); only where grouped_warpgroup_mma_built() and the
// GPU is SM 9.0 (sm_90a code runs there alone).
bool grouped_warpgroup_mma_built();
void launch_grouped_attention(const AttentionParams& p, bool hardware_decoder, bool warpgroup_mma,
                              bool programmatic, cudaStream_t stream);
// Selection: scores on tensor cores (sm_version < 75: CUDA cores, select_score_simt.cuh), then an
// exact per-row radix top-k (select.cu). The workspace holds the scores of select_rows_per_wave
// rows at a time.
bool select_supports(int index_heads, int index_dim, int topk_blocks);
int select_rows_per_wave(int max_rows, int64_t max_blocks);
size_t select_workspace_bytes(int max_rows, int64_t max_blocks);
// Which MMA the multi-row scorer uses where the warpgroup scorer exists (an SM 9.0 GPU, a
// build with sm_90a code; the backend passes kSync elsewhere): kAuto decides by the batch's
// rows and rows per request (select_score_wgmma.cuh's kSelectWarpgroupMinRows).
enum class SelectScorerMma { kAuto, kSync, kWarpgroup };
bool select_warpgroup_mma_built();
// How the top-k sorts a row's winners (the same order either way; bucket_sort.cuh): kAuto
// by buckets in both top-k kernels (today the same as kBuckets); kRuns, kBuckets everywhere
// (a test and benchmark hook: QSAKV_SELECT_SORT). Code below SM80 sorts by runs whatever is
// asked.
enum class SelectSort { kAuto, kRuns, kBuckets };
// score_only: the scoring kernels alone, no top-k (a benchmark hook: QSAKV_SELECT_STAGES).
void launch_select_topk(const SelectParams& p, int sm_version, int sm_count, bool programmatic,
                        SelectScorerMma scorer_mma, SelectSort sort, bool score_only,
                        cudaStream_t stream);

// Calibration: accumulates K and V statistics of one layer into p's device entries.
// Async on `stream`; no allocation; capturable. k and v must be 16-byte aligned.
void launch_calib_observe(const CalibObserveParams& p, int sm_count, cudaStream_t stream);

}  // namespace cuda
}  // namespace qsakv
