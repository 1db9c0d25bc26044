// SPDX-License-Identifier: Apache-2.0
/* Why AUTO fell back to the CPU backend, in words a user acts on: a machine without an
 * NVIDIA driver says "no NVIDIA driver found" (not the runtime's "CUDA driver version is
 * insufficient"), with the CUDA error name kept in parentheses; asking for CUDA there
 * fails with the same reason. On a machine with a usable GPU there is nothing to check. */
#include <dlfcn.h>
#include <string.h>

#include "testutil.h"

static void test_fallback_reason(void** state) {
  (void)state;
  qsakv_context* ctx = NULL;
  TU_OK(qsakv_context_create(&ctx, NULL));
  qsakv_context_info info = {sizeof info, QSAKV_CONTEXT_INFO_VERSION};
  TU_OK(qsakv_context_get_info(ctx, &info));
  qsakv_context_destroy(ctx);
  if (info.backend == QSAKV_BACKEND_CUDA) {
    assert_string_equal(info.fallback_reason, "");
    skip(); /* a usable GPU: no fallback to explain */
  }
  print_message("fallback reason: %s\n", info.fallback_reason);
  if (!qsakv_built_with_cuda()) {
    assert_non_null(strstr(info.fallback_reason, "built without the CUDA backend"));
    return;
  }
  void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!driver) {
    /* No driver at all on this machine. */
    assert_non_null(strstr(info.fallback_reason, "no NVIDIA driver found ("));
    assert_non_null(strstr(info.fallback_reason, "(cudaError"));
    assert_null(strstr(info.fallback_reason, "insufficient"));
  } else {
    dlclose(driver);
    assert_true(info.fallback_reason[0] != '\0');
  }
  /* CUDA asked for: refused, naming the same reason. */
  qsakv_context_options o;
  TU_OK(qsakv_context_options_init(&o));
  o.backend = QSAKV_BACKEND_CUDA;
  TU_EXPECT_STATUS(qsakv_context_create(&ctx, &o), QSAKV_ERROR_NO_DEVICE);
  assert_null(ctx);
  assert_non_null(strstr(qsakv_last_error(), info.fallback_reason));
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_fallback_reason)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
