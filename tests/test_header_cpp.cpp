// SPDX-License-Identifier: Apache-2.0
// The public header compiles as C++ (twice: include guard), with C linkage.
#include "qsakv.h"
#include "qsakv.h"

#include <type_traits>

#include "testutil.h"

static_assert(std::is_pointer<qsakv_stream_t>::value, "qsakv_stream_t is a pointer");
static_assert(std::is_standard_layout<qsakv_model_config>::value, "C layout");

// The initializer macros are C++ too, and name every field (an omitted one is an error).
#pragma GCC diagnostic error "-Wmissing-field-initializers"
static void test_init_macros_in_cpp(void** state) {
  (void)state;
  const qsakv_context_options ctx = QSAKV_CONTEXT_OPTIONS_INIT;
  const qsakv_model_config cfg = QSAKV_MODEL_CONFIG_INIT;
  const qsakv_overlay_write_options wo = QSAKV_OVERLAY_WRITE_OPTIONS_INIT;
  const qsakv_cache_options co = QSAKV_CACHE_OPTIONS_INIT;
  const qsakv_plan_options po = QSAKV_PLAN_OPTIONS_INIT;
  const qsakv_batch b = QSAKV_BATCH_INIT;
  const qsakv_cache_memory mem = QSAKV_CACHE_MEMORY_INIT;
  assert_int_equal(ctx.struct_size, sizeof ctx);
  assert_int_equal(cfg.struct_size, sizeof cfg);
  assert_int_equal(wo.contract_speculative_tokens, -1);
  assert_int_equal(co.share_topk, 1);
  assert_int_equal(po.version, QSAKV_PLAN_OPTIONS_VERSION);
  assert_int_equal(b.struct_size, sizeof b);
  assert_int_equal(mem.struct_size, sizeof mem);
}

static void test_cpp_linkage(void** state) {
  (void)state;
  // Taking the address of a C function through a C++ TU checks the extern "C" block.
  int (*fn)(void) = &qsakv_version;
  assert_int_equal(fn(), QSAKV_VERSION_NUMBER);
  qsakv_model_config c;
  assert_int_equal(qsakv_model_config_init(&c), QSAKV_SUCCESS);
  assert_int_equal(c.struct_size, sizeof c);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_cpp_linkage),
                                     cmocka_unit_test(test_init_macros_in_cpp)};
  return cmocka_run_group_tests_name("header_cpp", tests, NULL, NULL);
}
