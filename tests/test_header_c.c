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

static void test_context_options_init_macro(void** state) {
  (void)state;
  const qsakv_context_options m = QSAKV_CONTEXT_OPTIONS_INIT;
  qsakv_context_options f;
  memset(&f, 0x5A, sizeof f);
  assert_int_equal(qsakv_context_options_init(&f), QSAKV_SUCCESS);
  assert_int_equal(m.struct_size, f.struct_size);
  assert_int_equal(m.version, f.version);
  assert_int_equal(m.backend, f.backend);
  assert_int_equal(m.device, f.device);
  assert_int_equal(m.decoder, f.decoder);
}

static void test_model_config_init_macro(void** state) {
  (void)state;
  const qsakv_model_config m = QSAKV_MODEL_CONFIG_INIT;
  qsakv_model_config f;
  memset(&f, 0x5A, sizeof f);
  assert_int_equal(qsakv_model_config_init(&f), QSAKV_SUCCESS);
  assert_int_equal(m.struct_size, f.struct_size);
  assert_int_equal(m.version, f.version);
  assert_int_equal(m.num_layers, f.num_layers);
  assert_int_equal(m.num_qsa_layers, f.num_qsa_layers);
  assert_memory_equal(m.qsa_layers, f.qsa_layers, sizeof m.qsa_layers);
  assert_int_equal(m.num_q_heads, f.num_q_heads);
  assert_int_equal(m.num_kv_heads, f.num_kv_heads);
  assert_int_equal(m.head_dim, f.head_dim);
  assert_true(m.softmax_scale == f.softmax_scale);
  assert_int_equal(m.index_num_heads, f.index_num_heads);
  assert_int_equal(m.index_head_dim, f.index_head_dim);
  assert_int_equal(m.compress_ratio, f.compress_ratio);
  assert_int_equal(m.topk_tokens, f.topk_tokens);
  assert_int_equal(m.tp_size, f.tp_size);
  assert_int_equal(m.tp_rank, f.tp_rank);
  assert_int_equal(m.speculative_tokens, f.speculative_tokens);
  assert_int_equal(m.activation_dtype, f.activation_dtype);
  assert_int_equal(m.kv_dtype, f.kv_dtype);
  assert_int_equal(m.block_size, f.block_size);
  assert_int_equal(m.max_requests, f.max_requests);
  assert_int_equal(m.max_batched_tokens, f.max_batched_tokens);
  assert_int_equal(m.max_model_len, f.max_model_len);
}

static void test_overlay_write_options_init_macro(void** state) {
  (void)state;
  const qsakv_overlay_write_options m = QSAKV_OVERLAY_WRITE_OPTIONS_INIT;
  qsakv_overlay_write_options f;
  memset(&f, 0x5A, sizeof f);
  assert_int_equal(qsakv_overlay_write_options_init(&f), QSAKV_SUCCESS);
  assert_int_equal(m.struct_size, f.struct_size);
  assert_int_equal(m.version, f.version);
  assert_ptr_equal(m.layer_prefix, f.layer_prefix);
  assert_ptr_equal(m.base_index_path, f.base_index_path);
  assert_int_equal(m.contract_tp_size, f.contract_tp_size);
  assert_int_equal(m.contract_speculative_tokens, f.contract_speculative_tokens);
  assert_int_equal(m.contract_activation_dtype, f.contract_activation_dtype);
  assert_int_equal(m.contract_min_sm, f.contract_min_sm);
  assert_int_equal(m.unit_scale_control, f.unit_scale_control);
}

static void test_cache_options_init_macro(void** state) {
  (void)state;
  const qsakv_cache_options m = QSAKV_CACHE_OPTIONS_INIT;
  qsakv_cache_options f;
  memset(&f, 0x5A, sizeof f);
  assert_int_equal(qsakv_cache_options_init(&f), QSAKV_SUCCESS);
  assert_int_equal(m.struct_size, f.struct_size);
  assert_int_equal(m.version, f.version);
  assert_int_equal(m.num_blocks, f.num_blocks);
  assert_int_equal(m.memory_budget_bytes, f.memory_budget_bytes);
  assert_int_equal(m.share_topk, f.share_topk);
  assert_ptr_equal(m.external_topk, f.external_topk);
  assert_int_equal(m.external_topk_dtype, f.external_topk_dtype);
  assert_int_equal(m.external_topk_rows, f.external_topk_rows);
  assert_int_equal(m.external_topk_cols, f.external_topk_cols);
}

static void test_plan_options_init_macro(void** state) {
  (void)state;
  const qsakv_plan_options m = QSAKV_PLAN_OPTIONS_INIT;
  qsakv_plan_options f;
  memset(&f, 0x5A, sizeof f);
  assert_int_equal(qsakv_plan_options_init(&f), QSAKV_SUCCESS);
  assert_int_equal(m.struct_size, f.struct_size);
  assert_int_equal(m.version, f.version);
  assert_int_equal(m.max_rows, f.max_rows);
  assert_int_equal(m.max_requests, f.max_requests);
  assert_int_equal(m.num_splits, f.num_splits);
}

/* The structs with no *_init function: the header and nothing else. */
static void test_batch_and_cache_memory_init_macros(void** state) {
  (void)state;
  const qsakv_batch b = QSAKV_BATCH_INIT;
  assert_int_equal(b.struct_size, sizeof b);
  assert_int_equal(b.version, QSAKV_BATCH_VERSION);
  assert_int_equal(b.num_requests, 0);
  assert_null(b.query_start);
  assert_null(b.seq_lens);
  assert_null(b.request_slots);
  assert_null(b.block_table);
  assert_int_equal(b.block_table_stride, 0);
  const qsakv_cache_memory mem = QSAKV_CACHE_MEMORY_INIT;
  assert_int_equal(mem.struct_size, sizeof mem);
  assert_int_equal(mem.version, QSAKV_CACHE_MEMORY_VERSION);
  assert_int_equal(mem.num_layers, 0);
  assert_null(mem.layers);
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
