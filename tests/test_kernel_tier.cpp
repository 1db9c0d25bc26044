// SPDX-License-Identifier: Apache-2.0
// What each CUDA kernel tier takes (compiled in from src/core: the rule the cache creation
// and the attention launch share). Runs without a GPU: no test GPU has SM 7.5, so this is
// where the refusal of BF16 caches there is checked.
#include <cstring>
#include <string>

#include "core/error.hpp"
#include "core/kernel_tier.hpp"
#include "limits.hpp"
#include "testutil.h"

namespace {

// The status and message require_cuda_cache_dtype fails with; QSAKV_SUCCESS if it takes it.
qsakv_status verdict(qsakv_kernel_tier tier, int sm, qsakv_dtype kv, std::string* message) {
  try {
    qsakv::require_cuda_cache_dtype(tier, sm, kv);
  } catch (const qsakv::Error& e) {
    *message = e.what();
    return e.status();
  }
  message->clear();
  return QSAKV_SUCCESS;
}

void test_bf16_needs_sm80_on_the_tensor_core_tier(void** state) {
  (void)state;
  std::string m;
  assert_int_equal(verdict(QSAKV_KERNEL_TIER_SM75, 75, QSAKV_DTYPE_BF16, &m),
                   QSAKV_ERROR_UNSUPPORTED);
  assert_non_null(std::strstr(m.c_str(), "kv_dtype bf16"));
  assert_non_null(std::strstr(m.c_str(), "this GPU is SM 75"));
  assert_non_null(std::strstr(m.c_str(), "sm75 kernel tier"));
  assert_int_equal(
      verdict(QSAKV_KERNEL_TIER_SM75, qsakv::kSmBf16TensorCores - 1, QSAKV_DTYPE_BF16, &m),
      QSAKV_ERROR_UNSUPPORTED);
  for (int sm : {qsakv::kSmBf16TensorCores, 86, 89, 90, 100, 120})
    assert_int_equal(verdict(QSAKV_KERNEL_TIER_SM75, sm, QSAKV_DTYPE_BF16, &m), QSAKV_SUCCESS);
}

void test_other_caches_and_the_sm70_tier_take_anything(void** state) {
  (void)state;
  std::string m;
  for (int sm : {70, 75, 80, 90}) {
    // The SM70 tier converts BF16 to FP32 on CUDA cores (forced on newer GPUs too).
    assert_int_equal(verdict(QSAKV_KERNEL_TIER_SM70, sm, QSAKV_DTYPE_BF16, &m), QSAKV_SUCCESS);
    for (qsakv_dtype kv : {QSAKV_DTYPE_FP16, QSAKV_DTYPE_E4M3}) {
      assert_int_equal(verdict(QSAKV_KERNEL_TIER_SM75, sm, kv, &m), QSAKV_SUCCESS);
      assert_int_equal(verdict(QSAKV_KERNEL_TIER_SM70, sm, kv, &m), QSAKV_SUCCESS);
    }
  }
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bf16_needs_sm80_on_the_tensor_core_tier),
      cmocka_unit_test(test_other_caches_and_the_sm70_tier_take_anything),
  };
  return cmocka_run_group_tests_name("kernel_tier", tests, NULL, NULL);
}
