// SPDX-License-Identifier: Apache-2.0
/* The public header compiles as C99, twice in one translation unit (include guard) and
 * in a second unit (test_header_c_again.c), and defines what it promises: versions,
 * struct headers, and initializer macros equal to the *_init functions. */
#include "qsakv.h"
#include "qsakv.h"
#include <stdio.h>
#include <string.h>

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

#define STARTS_WITH_SIZE_AND_VERSION(T)                           \
  do {                                                            \
    assert_int_equal(offsetof(T, struct_size), 0);                \
    assert_int_equal(offsetof(T, version), sizeof(size_t));       \
    assert_int_equal(sizeof(((T*)0)->version), sizeof(uint32_t)); \
  } while (0)

/* Every struct that crosses the API, input or output, except the plain per-layer entries
 * of qsakv_cache_memory (qsakv_layer_memory, reached through that versioned struct). */
static void test_structs_start_with_size_and_version(void** state) {
  (void)state;
  STARTS_WITH_SIZE_AND_VERSION(qsakv_context_options);
  STARTS_WITH_SIZE_AND_VERSION(qsakv_context_info);
  STARTS_WITH_SIZE_AND_VERSION(qsakv_model_config);
  STARTS_WITH_SIZE_AND_VERSION(qsakv_rank_geometry);
  STARTS_WITH_SIZE_AND_VERSION(qsakv_overlay_info);
  STARTS_WITH_SIZE_AND_VERSION(qsakv_overlay_write_options);
  STARTS_WITH_SIZE_AND_VERSION(qsakv_capacity);
  STARTS_WITH_SIZE_AND_VERSION(qsakv_cache_options);
  STARTS_WITH_SIZE_AND_VERSION(qsakv_cache_layout);
  STARTS_WITH_SIZE_AND_VERSION(qsakv_layer_buffers);
  STARTS_WITH_SIZE_AND_VERSION(qsakv_cache_memory);
  STARTS_WITH_SIZE_AND_VERSION(qsakv_plan_options);
  STARTS_WITH_SIZE_AND_VERSION(qsakv_batch);
  STARTS_WITH_SIZE_AND_VERSION(qsakv_plan_info);
  STARTS_WITH_SIZE_AND_VERSION(qsakv_calib_info);
  STARTS_WITH_SIZE_AND_VERSION(qsakv_calib_stats);
  STARTS_WITH_SIZE_AND_VERSION(qsakv_calib_summary);
}

/* The *_init functions return the macros' values (the library builds its defaults from
 * them): each test fills the struct with garbage first, so a field the function leaves
 * unwritten, or a default that drifts from the macro, fails. An initializer that left a
 * field out would be a compile error here, not a silent zero: every macro names every
 * field. */
#pragma GCC diagnostic error "-Wmissing-field-initializers"
/* Each test compares every field (tu_field_map, testutil.h: a field left out of the
 * comparison fails it). */

static void test_context_options_init_macro(void** state) {
  (void)state;
  const qsakv_context_options m = QSAKV_CONTEXT_OPTIONS_INIT;
  qsakv_context_options f;
  memset(&f, 0x5A, sizeof f);
  assert_int_equal(qsakv_context_options_init(&f), QSAKV_SUCCESS);
  tu_field_map map;
  TU_FIELDS_OF(map, m);
  TU_SAME_FIELD(map, m, f, struct_size);
  TU_SAME_FIELD(map, m, f, version);
  TU_SAME_FIELD(map, m, f, backend);
  TU_SAME_FIELD(map, m, f, device);
  TU_SAME_FIELD(map, m, f, decoder);
  tu_all_fields_compared(&map, "qsakv_context_options");
}

static void test_model_config_init_macro(void** state) {
  (void)state;
  const qsakv_model_config m = QSAKV_MODEL_CONFIG_INIT;
  qsakv_model_config f;
  memset(&f, 0x5A, sizeof f);
  assert_int_equal(qsakv_model_config_init(&f), QSAKV_SUCCESS);
  tu_expect_same_model_config(&m, &f);
  /* The one default that is not zero. */
  assert_int_equal(f.index_key_dtype, QSAKV_DTYPE_FP16);
}

static void test_overlay_write_options_init_macro(void** state) {
  (void)state;
  const qsakv_overlay_write_options m = QSAKV_OVERLAY_WRITE_OPTIONS_INIT;
  qsakv_overlay_write_options f;
  memset(&f, 0x5A, sizeof f);
  assert_int_equal(qsakv_overlay_write_options_init(&f), QSAKV_SUCCESS);
  tu_field_map map;
  TU_FIELDS_OF(map, m);
  TU_SAME_FIELD(map, m, f, struct_size);
  TU_SAME_FIELD(map, m, f, version);
  TU_SAME_FIELD(map, m, f, layer_prefix);
  TU_SAME_FIELD(map, m, f, base_index_path);
  TU_SAME_FIELD(map, m, f, contract_tp_size);
  TU_SAME_FIELD(map, m, f, contract_speculative_tokens);
  TU_SAME_FIELD(map, m, f, contract_activation_dtype);
  TU_SAME_FIELD(map, m, f, contract_min_sm);
  TU_SAME_FIELD(map, m, f, unit_scale_control);
  tu_all_fields_compared(&map, "qsakv_overlay_write_options");
}

static void test_cache_options_init_macro(void** state) {
  (void)state;
  const qsakv_cache_options m = QSAKV_CACHE_OPTIONS_INIT;
  qsakv_cache_options f;
  memset(&f, 0x5A, sizeof f);
  assert_int_equal(qsakv_cache_options_init(&f), QSAKV_SUCCESS);
  tu_field_map map;
  TU_FIELDS_OF(map, m);
  TU_SAME_FIELD(map, m, f, struct_size);
  TU_SAME_FIELD(map, m, f, version);
  TU_SAME_FIELD(map, m, f, num_blocks);
  TU_SAME_FIELD(map, m, f, memory_budget_bytes);
  TU_SAME_FIELD(map, m, f, share_topk);
  TU_SAME_FIELD(map, m, f, external_topk);
  TU_SAME_FIELD(map, m, f, external_topk_dtype);
  TU_SAME_FIELD(map, m, f, external_topk_rows);
  TU_SAME_FIELD(map, m, f, external_topk_cols);
  TU_SAME_FIELD(map, m, f, allow_unit_scales);
  tu_all_fields_compared(&map, "qsakv_cache_options");
}

static void test_plan_options_init_macro(void** state) {
  (void)state;
  const qsakv_plan_options m = QSAKV_PLAN_OPTIONS_INIT;
  qsakv_plan_options f;
  memset(&f, 0x5A, sizeof f);
  assert_int_equal(qsakv_plan_options_init(&f), QSAKV_SUCCESS);
  tu_field_map map;
  TU_FIELDS_OF(map, m);
  TU_SAME_FIELD(map, m, f, struct_size);
  TU_SAME_FIELD(map, m, f, version);
  TU_SAME_FIELD(map, m, f, max_rows);
  TU_SAME_FIELD(map, m, f, max_requests);
  TU_SAME_FIELD(map, m, f, num_splits);
  TU_SAME_FIELD(map, m, f, multi_row_min_rows);
  tu_all_fields_compared(&map, "qsakv_plan_options");
}

/* The structs with no *_init function: the header and nothing else (struct_size and
 * version set, every other field zero or NULL). */
static void test_batch_and_cache_memory_init_macros(void** state) {
  (void)state;
  const qsakv_batch b = QSAKV_BATCH_INIT;
  qsakv_batch want_b;
  memset(&want_b, 0, sizeof want_b);
  want_b.struct_size = sizeof want_b;
  want_b.version = QSAKV_BATCH_VERSION;
  tu_field_map map;
  TU_FIELDS_OF(map, b);
  TU_SAME_FIELD(map, want_b, b, struct_size);
  TU_SAME_FIELD(map, want_b, b, version);
  TU_SAME_FIELD(map, want_b, b, num_requests);
  TU_SAME_FIELD(map, want_b, b, query_start);
  TU_SAME_FIELD(map, want_b, b, seq_lens);
  TU_SAME_FIELD(map, want_b, b, request_slots);
  TU_SAME_FIELD(map, want_b, b, block_table);
  TU_SAME_FIELD(map, want_b, b, block_table_stride);
  tu_all_fields_compared(&map, "qsakv_batch");
  const qsakv_cache_memory mem = QSAKV_CACHE_MEMORY_INIT;
  qsakv_cache_memory want_mem;
  memset(&want_mem, 0, sizeof want_mem);
  want_mem.struct_size = sizeof want_mem;
  want_mem.version = QSAKV_CACHE_MEMORY_VERSION;
  TU_FIELDS_OF(map, mem);
  TU_SAME_FIELD(map, want_mem, mem, struct_size);
  TU_SAME_FIELD(map, want_mem, mem, version);
  TU_SAME_FIELD(map, want_mem, mem, num_layers);
  TU_SAME_FIELD(map, want_mem, mem, layers);
  tu_all_fields_compared(&map, "qsakv_cache_memory");
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
      cmocka_unit_test(test_context_options_init_macro),
      cmocka_unit_test(test_model_config_init_macro),
      cmocka_unit_test(test_overlay_write_options_init_macro),
      cmocka_unit_test(test_cache_options_init_macro),
      cmocka_unit_test(test_plan_options_init_macro),
      cmocka_unit_test(test_batch_and_cache_memory_init_macros),
      cmocka_unit_test(test_dtypes),
  };
  return cmocka_run_group_tests_name("header_c", tests, NULL, NULL);
}
