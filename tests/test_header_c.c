// SPDX-License-Identifier: Apache-2.0
/* The public header compiles as C99, twice in one translation unit (include guard) and
 * in a second unit (test_header_c_again.c), and defines what it promises. */
#include "qsakv.h"
#include "qsakv.h"
#include <stdio.h>

#include "testutil.h"

int qsakv_header_again_version(void);
size_t qsakv_header_again_stream_size(void);

static void test_versions(void** state) {
  (void)state;
  assert_int_equal(qsakv_version(), QSAKV_VERSION_NUMBER);
  assert_int_equal(qsakv_abi_version(), QSAKV_ABI_VERSION);
  assert_int_equal(qsakv_header_again_version(), QSAKV_VERSION_NUMBER);
  char expect[32];
  snprintf(expect, sizeof expect, "%d.%d.%d", QSAKV_VERSION_MAJOR, QSAKV_VERSION_MINOR,
           QSAKV_VERSION_PATCH);
  assert_string_equal(qsakv_version_string(), expect);
}

static void test_stream_is_opaque_pointer(void** state) {
  (void)state;
  assert_int_equal(sizeof(qsakv_stream_t), sizeof(void*));
  assert_int_equal(qsakv_header_again_stream_size(), sizeof(void*));
}

static void test_structs_start_with_size_and_version(void** state) {
  (void)state;
  assert_int_equal(offsetof(qsakv_context_options, struct_size), 0);
  assert_int_equal(offsetof(qsakv_context_options, version), sizeof(size_t));
  assert_int_equal(offsetof(qsakv_model_config, version), sizeof(size_t));
  assert_int_equal(offsetof(qsakv_cache_options, version), sizeof(size_t));
  assert_int_equal(offsetof(qsakv_plan_options, version), sizeof(size_t));
  assert_int_equal(offsetof(qsakv_batch, version), sizeof(size_t));
}

static void test_dtypes(void** state) {
  (void)state;
  assert_int_equal(qsakv_dtype_size(QSAKV_DTYPE_E4M3), 1);
  assert_int_equal(qsakv_dtype_size(QSAKV_DTYPE_FP16), 2);
  assert_int_equal(qsakv_dtype_size(QSAKV_DTYPE_BF16), 2);
  assert_int_equal(qsakv_dtype_size(QSAKV_DTYPE_INT64), 8);
  assert_int_equal(qsakv_dtype_size((qsakv_dtype)99), 0);
  assert_string_equal(qsakv_dtype_name(QSAKV_DTYPE_E4M3), "e4m3");
  assert_string_equal(qsakv_dtype_name((qsakv_dtype)99), "invalid");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_versions),
      cmocka_unit_test(test_stream_is_opaque_pointer),
      cmocka_unit_test(test_structs_start_with_size_and_version),
      cmocka_unit_test(test_dtypes),
  };
  return cmocka_run_group_tests_name("header_c", tests, NULL, NULL);
}
