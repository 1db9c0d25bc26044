// SPDX-License-Identifier: Apache-2.0
// The CUDA kernel tier a context asks for: parsed from QSAKV_CUDA_TIER at context creation
// (a test hook: it lets an SM75+ GPU run the SM70 tier, the V100 code path).
#pragma once

#include "qsakv.h"

namespace qsakv {

constexpr const char* kCudaTierEnv = "QSAKV_CUDA_TIER";

// NONE means "from the GPU's compute capability". value may be nullptr (unset); "" and
// "auto" are the default. Anything else but "sm70" / "sm75" fails with
// QSAKV_ERROR_INVALID_ARGUMENT, naming the variable and the accepted values.
qsakv_kernel_tier parse_cuda_tier(const char* value);

// The tier the GPU gets unless one is forced: SM70..SM74 -> SM70, SM75+ -> SM75; NONE
// below SM70 (no kernels).
qsakv_kernel_tier default_cuda_tier(int sm_version);

const char* cuda_tier_name(qsakv_kernel_tier tier);

// Fails with QSAKV_ERROR_UNSUPPORTED, naming the GPU's SM, where the CUDA kernels of `tier`
// on an SM `sm_version` GPU cannot attend over a `kv_dtype` cache: BF16 on the SM75 tier
// below SM 8.0 (that tier attends on tensor cores, whose BF16 MMAs start at SM 8.0; the
// SM70 tier converts BF16 to FP32 on CUDA cores and takes it anywhere). Checked when a
// cache is created, so that no cache is made that its attention would refuse, and again
// by the CUDA backend's attention launch.
void require_cuda_cache_dtype(qsakv_kernel_tier tier, int sm_version, qsakv_dtype kv_dtype);

// Which MMA the grouped route's attention kernel uses on a GPU that has both (SM90 with
// sm_90a code): a test and benchmark hook, QSAKV_GROUPED_MMA, read at context creation and,
// like QSAKV_CUDA_TIER, checked on every backend. Unset, "" or "auto": the warpgroup MMA
// where the GPU and the build have it, for updates of at least kGroupedCtasPerSm x SMs
// groups (the CUDA backend's attention launch); "sync": mma.sync; "wgmma": the warpgroup MMA (the
// CUDA backend fails with QSAKV_ERROR_UNSUPPORTED where it is not available). Anything else
// fails with QSAKV_ERROR_INVALID_ARGUMENT naming the variable.
constexpr const char* kGroupedMmaEnv = "QSAKV_GROUPED_MMA";
enum class MmaChoice { kAuto, kSync, kWgmma };
MmaChoice parse_grouped_mma(const char* value);

// Which MMA the multi-row selection scorer (verify rows, prefill chunks) uses on a GPU that
// has both (SM 9.0 with sm_90a code): QSAKV_SELECT_MMA, a test and benchmark hook read and
// checked like QSAKV_GROUPED_MMA, with the same values. "auto": the warpgroup MMA when
// each of the last update's requests has 32 rows or more and its rows either take more
// than one wave of the score workspace or give the warpgroup scorer a CTA on every SM in
// one (large prefill batches; kSelectWarpgroupMinRows), mma.sync otherwise;
// "wgmma": the warpgroup MMA for every multi-row selection (the CUDA backend fails with
// QSAKV_ERROR_UNSUPPORTED where it is not available). Either way only for the shapes it
// is built for (128-dim index keys, 3 or 4 heads); others keep mma.sync, which gives the
// same scores bit for bit.
constexpr const char* kSelectMmaEnv = "QSAKV_SELECT_MMA";
MmaChoice parse_select_mma(const char* value);

// Which kernel families the CUDA backend launches as programmatic dependents of the
// previous kernel in the stream (SM90+, outside the SM70 tier;
// kernels/cuda/dependent_launch.cuh): QSAKV_DEPENDENT_LAUNCH, a benchmark hook for
// measuring each family against the plain launch. Unset, "" or "auto": the default set
// (kDependentLaunchDefault); "off": none; otherwise a comma-separated list of "store",
// "select" and "attention". Anything else fails with QSAKV_ERROR_INVALID_ARGUMENT naming
// the variable.
constexpr const char* kDependentLaunchEnv = "QSAKV_DEPENDENT_LAUNCH";
enum DependentLaunch : unsigned {
  kDependentStore = 1u,
  kDependentSelect = 2u,
  kDependentAttention = 4u,
};
// Attention is left out: launched early, its CTAs took free slots on busy SMs and ran
// unevenly spread (E4M3, 20-256 rows back to back: up to 25% slower), and behind the top-k
// the copy-ring variant cost ~8 us a decode step (docs/perf.md, run 34).
constexpr unsigned kDependentLaunchDefault = kDependentStore | kDependentSelect;
unsigned parse_dependent_launch(const char* value);

// Which stages of a selection the CUDA backend launches: QSAKV_SELECT_STAGES, a benchmark
// hook that times the scoring kernels alone (a selection's top-k time is then the
// difference). Unset, "" or "all": every stage; "score": the scoring kernels only, so the
// context's qsakv_select_topk writes no top-k rows (its outputs are left as they were) and
// the histograms that the top-k would have read and cleared keep counting. The CPU backend
// ignores it. Anything else fails with QSAKV_ERROR_INVALID_ARGUMENT naming the variable.
constexpr const char* kSelectStagesEnv = "QSAKV_SELECT_STAGES";
bool parse_select_score_only(const char* value);

// How the CUDA selection's top-k sorts a row's winners: QSAKV_SELECT_SORT, a test and
// benchmark hook (every choice gives the same output). Unset, "" or "auto": by buckets in
// both top-k kernels (docs/perf.md run 44 says which workloads chose this); "runs" or
// "buckets": that sort wherever the GPU code has it (the bucket sort exists
// from SM80, and the SM70 tier sorts by runs whatever is asked). Checked on every backend;
// anything else fails with QSAKV_ERROR_INVALID_ARGUMENT naming the variable.
constexpr const char* kSelectSortEnv = "QSAKV_SELECT_SORT";
enum class SortChoice { kAuto, kRuns, kBuckets };
SortChoice parse_select_sort(const char* value);

// Every test and benchmark hook of the CUDA backend, read from the environment once, at
// context creation (and checked on every backend, so that a typo fails loudly).
struct KernelHooks {
  qsakv_kernel_tier tier;  // NONE: from the GPU
  MmaChoice grouped_mma;
  MmaChoice select_mma;
  unsigned dependent_launch;  // DependentLaunch bits
  bool select_score_only;     // QSAKV_SELECT_STAGES=score
  SortChoice select_sort;
};
KernelHooks read_kernel_hooks();

}  // namespace qsakv
