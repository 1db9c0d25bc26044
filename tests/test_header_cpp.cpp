// SPDX-License-Identifier: Apache-2.0
// The public header compiles as C++ (twice: include guard), with C linkage.
#include "qsakv.h"
#include "qsakv.h"

#include <type_traits>

#include "testutil.h"

static_assert(std::is_pointer<qsakv_stream_t>::value, "qsakv_stream_t is a pointer");
static_assert(std::is_standard_layout<qsakv_model_config>::value, "C layout");

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
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_cpp_linkage)};
  return cmocka_run_group_tests_name("header_cpp", tests, NULL, NULL);
}
