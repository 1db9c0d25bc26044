// SPDX-License-Identifier: Apache-2.0
/* Status strings, the thread-local last error, NULL handling. */
#include <pthread.h>
#include <string.h>

#include "testutil.h"

static void test_status_strings_distinct(void** state) {
  (void)state;
  const qsakv_status all[] = {QSAKV_SUCCESS,
                              QSAKV_ERROR_INVALID_ARGUMENT,
                              QSAKV_ERROR_INVALID_CONFIG,
                              QSAKV_ERROR_UNSUPPORTED,
                              QSAKV_ERROR_NO_DEVICE,
                              QSAKV_ERROR_OUT_OF_MEMORY,
                              QSAKV_ERROR_CUDA,
                              QSAKV_ERROR_NCCL,
                              QSAKV_ERROR_IO,
                              QSAKV_ERROR_FORMAT,
                              QSAKV_ERROR_STATE,
                              QSAKV_ERROR_INTERNAL,
                              QSAKV_ERROR_OVERLAY_MISSING,
                              QSAKV_ERROR_OVERLAY_INCOMPLETE,
                              QSAKV_ERROR_OVERLAY_BAD_SCALE,
                              QSAKV_ERROR_OVERLAY_BAD_TENSOR,
                              QSAKV_ERROR_OVERLAY_DUPLICATE,
                              QSAKV_ERROR_OVERLAY_UNKNOWN_TENSOR,
                              QSAKV_ERROR_REVISION_MISMATCH,
                              QSAKV_ERROR_HASH_MISMATCH,
                              QSAKV_ERROR_CONTRACT,
                              QSAKV_ERROR_OVERLAY_NOT_VALIDATED,
                              QSAKV_ERROR_CALIB_NON_FINITE,
                              QSAKV_ERROR_TP_MISMATCH,
                              QSAKV_ERROR_OVERLAY_UNIT_SCALES};
  const size_t n = sizeof all / sizeof all[0];
  for (size_t i = 0; i < n; ++i) {
    const char* s = qsakv_status_string(all[i]);
    assert_non_null(s);
    assert_true(strncmp(s, "QSAKV_", 6) == 0);
    assert_string_not_equal(s, "QSAKV_ERROR_UNKNOWN");
    for (size_t j = 0; j < i; ++j) assert_string_not_equal(s, qsakv_status_string(all[j]));
  }
  assert_string_equal(qsakv_status_string((qsakv_status)-999), "QSAKV_ERROR_UNKNOWN");
  assert_string_equal(qsakv_status_string(QSAKV_SUCCESS), "QSAKV_SUCCESS");
}

static void test_last_error_set_and_cleared(void** state) {
  (void)state;
  qsakv_clear_error();
  assert_string_equal(qsakv_last_error(), "");
  TU_EXPECT_STATUS(qsakv_model_config_init(NULL), QSAKV_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(qsakv_last_error(), "config is NULL"));
  /* A success leaves the message alone. */
  TU_OK(qsakv_model_config_preset(&(qsakv_model_config){0}, "qwen4_exp"));
  assert_non_null(strstr(qsakv_last_error(), "config is NULL"));
  qsakv_clear_error();
  assert_string_equal(qsakv_last_error(), "");
}

static void* other_thread(void* arg) {
  (void)arg;
  /* This thread starts with no message, and its failure does not touch main's. */
  int empty = qsakv_last_error()[0] == '\0';
  qsakv_model_config c;
  qsakv_model_config_init(&c);
  qsakv_status s = qsakv_model_config_preset(&c, "no_such_model");
  int ok = empty && s == QSAKV_ERROR_INVALID_ARGUMENT &&
           strstr(qsakv_last_error(), "no_such_model") != NULL;
  return (void*)(intptr_t)ok;
}

static void test_last_error_thread_local(void** state) {
  (void)state;
  TU_EXPECT_STATUS(qsakv_context_create(NULL, NULL), QSAKV_ERROR_INVALID_ARGUMENT);
  char mine[256];
  snprintf(mine, sizeof mine, "%s", qsakv_last_error());
  assert_true(mine[0] != '\0');
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, other_thread, NULL), 0);
  void* ret = NULL;
  pthread_join(t, &ret);
  assert_int_equal((intptr_t)ret, 1);
  assert_string_equal(qsakv_last_error(), mine);
}

static void destroy_nulls(qsakv_context* ctx) {
  qsakv_context_destroy(NULL);
  qsakv_overlay_destroy(NULL);
  qsakv_cache_destroy(NULL);
  qsakv_plan_destroy(NULL);
  qsakv_calib_destroy(NULL);
  qsakv_free(NULL, NULL);
  qsakv_free(ctx, NULL);
}

/* destroy(NULL) and free(NULL) are no-ops (the header): they neither crash (the adversarial
 * suite's "destroy NULL" runs them in a child process) nor touch the thread's last error,
 * whether one is set or not. */
static void test_destroy_null_is_noop(void** state) {
  (void)state;
  qsakv_context* ctx = tu_context(QSAKV_BACKEND_CPU);
  assert_non_null(ctx);
  TU_EXPECT_STATUS(qsakv_model_config_init(NULL), QSAKV_ERROR_INVALID_ARGUMENT);
  char before[512];
  snprintf(before, sizeof before, "%s", qsakv_last_error());
  assert_non_null(strstr(before, "config is NULL"));
  destroy_nulls(ctx);
  assert_string_equal(qsakv_last_error(), before);
  qsakv_clear_error();
  destroy_nulls(ctx);
  assert_string_equal(qsakv_last_error(), "");
  qsakv_context_destroy(ctx);
}

static void test_versioned_struct_checks(void** state) {
  (void)state;
  qsakv_context_options o;
  memset(&o, 0, sizeof o); /* struct_size 0: not initialised */
  qsakv_context* ctx = (qsakv_context*)0x1;
  TU_EXPECT_STATUS(qsakv_context_create(&ctx, &o), QSAKV_ERROR_INVALID_ARGUMENT);
  assert_null(ctx); /* *out is NULL on failure */
  assert_non_null(strstr(qsakv_last_error(), "struct_size"));
  /* An older, shorter struct (header + backend only) is read with defaults after it. */
  qsakv_context_options_init(&o);
  o.backend = QSAKV_BACKEND_CPU;
  o.struct_size = offsetof(qsakv_context_options, device);
  o.device = -5; /* beyond struct_size: must be ignored */
  TU_OK(qsakv_context_create(&ctx, &o));
  qsakv_context_destroy(ctx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_status_strings_distinct),
      cmocka_unit_test(test_last_error_set_and_cleared),
      cmocka_unit_test(test_last_error_thread_local),
      cmocka_unit_test(test_destroy_null_is_noop),
      cmocka_unit_test(test_versioned_struct_checks),
  };
  return cmocka_run_group_tests_name("errors", tests, NULL, NULL);
}
