// SPDX-License-Identifier: Apache-2.0
#include "core/kernel_tier.hpp"

#include <cstdlib>
#include <cstring>
#include <string>

#include "core/error.hpp"
#include "limits.hpp"

namespace qsakv {

qsakv_kernel_tier parse_cuda_tier(const char* value) {
  if (value == nullptr || value[0] == '\0' || std::strcmp(value, "auto") == 0)
    return QSAKV_KERNEL_TIER_NONE;
  if (std::strcmp(value, "sm70") == 0) return QSAKV_KERNEL_TIER_SM70;
  if (std::strcmp(value, "sm75") == 0) return QSAKV_KERNEL_TIER_SM75;
  // Bounded in the message: the variable comes from the environment, not from us.
  fail(QSAKV_ERROR_INVALID_ARGUMENT,
       "environment variable %s is \"%.64s\"; must be auto, sm70 or sm75 (or unset)", kCudaTierEnv,
       value);
}

namespace {
MmaChoice parse_mma_choice(const char* env, const char* value) {
  if (value == nullptr || value[0] == '\0' || std::strcmp(value, "auto") == 0)
    return MmaChoice::kAuto;
  if (std::strcmp(value, "sync") == 0) return MmaChoice::kSync;
  if (std::strcmp(value, "wgmma") == 0) return MmaChoice::kWgmma;
  fail(QSAKV_ERROR_INVALID_ARGUMENT,
       "environment variable %s is \"%.64s\"; must be auto, sync or wgmma (or unset)", env, value);
}
}  // namespace

MmaChoice parse_grouped_mma(const char* value) { return parse_mma_choice(kGroupedMmaEnv, value); }
MmaChoice parse_select_mma(const char* value) { return parse_mma_choice(kSelectMmaEnv, value); }

unsigned parse_dependent_launch(const char* value) {
  if (value == nullptr || value[0] == '\0' || std::strcmp(value, "auto") == 0)
    return kDependentLaunchDefault;
  if (std::strcmp(value, "off") == 0) return 0;
  const std::string list(value);
  unsigned mask = 0;
  for (size_t start = 0;;) {  // an empty item (",", a trailing comma) matches no family
    const size_t end = list.find(',', start);
    const std::string item = list.substr(start, end == std::string::npos ? end : end - start);
    const unsigned bit = item == "store"       ? kDependentStore
                         : item == "select"    ? kDependentSelect
                         : item == "attention" ? kDependentAttention
                                               : 0u;
    if (bit == 0) break;
    mask |= bit;
    if (end == std::string::npos) return mask;
    start = end + 1;
  }
  fail(QSAKV_ERROR_INVALID_ARGUMENT,
       "environment variable %s is \"%.64s\"; must be auto, off or a comma-separated list of "
       "store, select and attention (or unset)",
       kDependentLaunchEnv, value);
}

bool parse_select_score_only(const char* value) {
  if (value == nullptr || value[0] == '\0' || std::strcmp(value, "all") == 0) return false;
  if (std::strcmp(value, "score") == 0) return true;
  fail(QSAKV_ERROR_INVALID_ARGUMENT,
       "environment variable %s is \"%.64s\"; must be all or score (or unset)", kSelectStagesEnv,
       value);
}

SortChoice parse_select_sort(const char* value) {
  if (value == nullptr || value[0] == '\0' || std::strcmp(value, "auto") == 0)
    return SortChoice::kAuto;
  if (std::strcmp(value, "runs") == 0) return SortChoice::kRuns;
  if (std::strcmp(value, "buckets") == 0) return SortChoice::kBuckets;
  fail(QSAKV_ERROR_INVALID_ARGUMENT,
       "environment variable %s is \"%.64s\"; must be auto, runs or buckets (or unset)",
       kSelectSortEnv, value);
}

KernelHooks read_kernel_hooks() {
  KernelHooks h;
  h.tier = parse_cuda_tier(std::getenv(kCudaTierEnv));
  h.grouped_mma = parse_grouped_mma(std::getenv(kGroupedMmaEnv));
  h.select_mma = parse_select_mma(std::getenv(kSelectMmaEnv));
  h.dependent_launch = parse_dependent_launch(std::getenv(kDependentLaunchEnv));
  h.select_score_only = parse_select_score_only(std::getenv(kSelectStagesEnv));
  h.select_sort = parse_select_sort(std::getenv(kSelectSortEnv));
  return h;
}

qsakv_kernel_tier default_cuda_tier(int sm_version) {
  if (sm_version >= kSmTensorCoreTier) return QSAKV_KERNEL_TIER_SM75;
  if (sm_version >= kSmSimtTier) return QSAKV_KERNEL_TIER_SM70;
  return QSAKV_KERNEL_TIER_NONE;
}

const char* cuda_tier_name(qsakv_kernel_tier tier) {
  switch (tier) {
    case QSAKV_KERNEL_TIER_SM70:
      return "sm70";
    case QSAKV_KERNEL_TIER_SM75:
      return "sm75";
    default:
      return "none";
  }
}

void require_cuda_cache_dtype(qsakv_kernel_tier tier, int sm_version, qsakv_dtype kv_dtype) {
  if (kv_dtype == QSAKV_DTYPE_BF16 && tier != QSAKV_KERNEL_TIER_SM70 &&
      sm_version < kSmBf16TensorCores)
    fail(QSAKV_ERROR_UNSUPPORTED,
         "kv_dtype bf16: BF16 caches need BF16 tensor cores (SM %d+) on the %s kernel tier; this "
         "GPU is SM %d (an FP16 cache runs on it)",
         kSmBf16TensorCores, cuda_tier_name(tier), sm_version);
}

}  // namespace qsakv
