// SPDX-License-Identifier: Apache-2.0
/* Capacity planning: bytes per token of each cache, what fits in a budget, and the
 * shared top-k workspace's saving; cache creation and layout queries on the CPU. */
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "testutil.h"

static qsakv_capacity plan(const qsakv_model_config* c, uint64_t budget) {
  qsakv_capacity cap = {sizeof cap, QSAKV_CAPACITY_VERSION};
  TU_OK(qsakv_capacity_plan(c, budget, &cap));
  return cap;
}

static void test_reference_tp4(void** state) {
  (void)state;
  qsakv_model_config c;
  TU_OK(qsakv_model_config_preset(&c, "qwen4_exp"));
  c.tp_size = 4;
  qsakv_capacity e4m3 = plan(&c, 1ull << 50); /* a budget that dwarfs fixed costs */
  assert_int_equal(e4m3.bytes_per_token, 6912);
  assert_int_equal(e4m3.fp16_bytes_per_token, 13056);
  assert_int_equal(e4m3.compressed_bytes_per_token, 12 * 64);
  assert_true(fabs(e4m3.ideal_ratio - 1.889) / 1.889 < 0.01);
  assert_true(fabs(e4m3.capacity_ratio - 1.889) / 1.889 < 0.01);
  /* Top-k workspace: 8192 x 2051 int32 = 64.1 MiB shared vs 12x that per layer. */
  assert_int_equal(e4m3.topk_bytes, 8192ull * 2051 * 4);
  assert_int_equal(e4m3.topk_bytes_unshared, 12ull * 8192 * 2051 * 4);
  const double saved_mib = (double)(e4m3.topk_bytes_unshared - e4m3.topk_bytes) / (1 << 20);
  assert_true(fabs(saved_mib - 705.1) < 1.0);
  /* Rings: 12 layers x 256 requests x 4 slots x 128 FP16. */
  assert_int_equal(e4m3.ring_bytes, 12ull * 256 * 4 * 128 * 2);
  c.kv_dtype = QSAKV_DTYPE_FP16;
  qsakv_capacity fp16 = plan(&c, 1ull << 50);
  assert_int_equal(fp16.bytes_per_token, 13056);
}

/* E4M3 index keys: 16 keys of 128 codes and 16 FP32 scales per 64-token page (2,112
 * bytes), 33 bytes per token and layer instead of 64; with the E4M3 main cache 6,540 bytes
 * per token against the all-FP16 13,056: 1.996x. */
static void test_reference_tp4_e4m3_index_keys(void** state) {
  (void)state;
  qsakv_model_config c;
  TU_OK(qsakv_model_config_preset(&c, "qwen4_exp"));
  assert_int_equal(c.index_key_dtype, QSAKV_DTYPE_FP16); /* the preset's default */
  c.tp_size = 4;
  c.index_key_dtype = QSAKV_DTYPE_E4M3;
  qsakv_capacity cap = plan(&c, 1ull << 50);
  assert_int_equal(cap.compressed_bytes_per_token, 12 * 33);
  assert_int_equal(cap.bytes_per_token, 6144 + 12 * 33);
  assert_int_equal(cap.fp16_bytes_per_token, 13056);
  assert_int_equal(cap.bytes_per_block, 12ull * (64 * 512 + 2112));
  assert_true(cap.ideal_ratio >= 1.99);
  assert_true(cap.capacity_ratio >= 1.99);
  /* What fits in 40 GiB, exactly: the fixed costs, then whole blocks. */
  const uint64_t budget = 40ull << 30, fixed = cap.ring_bytes + cap.topk_bytes;
  cap = plan(&c, budget);
  assert_int_equal(cap.num_blocks, (int64_t)((budget - fixed) / cap.bytes_per_block));
  assert_int_equal(cap.fp16_num_tokens, (int64_t)((budget - fixed) / (13056ull * 64)) * 64);
  /* A 16-bit main cache with E4M3 keys: only the index keys shrink. */
  c.kv_dtype = QSAKV_DTYPE_FP16;
  cap = plan(&c, 1ull << 50);
  assert_int_equal(cap.bytes_per_token, 12288 + 12 * 33);
  /* The layout a cache of this config has. */
  qsakv_cache_options o;
  TU_OK(qsakv_cache_options_init(&o));
  o.num_blocks = 10;
  qsakv_cache_layout L = {sizeof L, QSAKV_CACHE_LAYOUT_VERSION};
  TU_OK(qsakv_cache_layout_for(&c, &o, &L));
  assert_int_equal(L.index_key_dtype, QSAKV_DTYPE_E4M3);
  assert_int_equal(L.index_head_dim, 128);
  assert_int_equal(L.compressed_keys_per_block, 16);
  assert_int_equal(L.compressed_stride_block, 2112);
  assert_int_equal(L.compressed_scales_offset, 2048);
  assert_int_equal(L.compressed_bytes_per_layer, 10 * 2112);
  c.index_key_dtype = QSAKV_DTYPE_FP16;
  TU_OK(qsakv_cache_layout_for(&c, &o, &L));
  assert_int_equal(L.compressed_stride_block, 16 * 128 * 2);
  assert_int_equal(L.compressed_scales_offset, -1);
  /* A page whose codes and scales are not a multiple of 16 bytes is padded: block size 4,
   * ratio 4: one key, 128 + 4 bytes, a 144-byte page. */
  c.index_key_dtype = QSAKV_DTYPE_E4M3;
  c.block_size = 4;
  TU_OK(qsakv_cache_layout_for(&c, &o, &L));
  assert_int_equal(L.compressed_keys_per_block, 1);
  assert_int_equal(L.compressed_stride_block, 144);
  assert_int_equal(L.compressed_scales_offset, 128);
}

static void test_budget_arithmetic(void** state) {
  (void)state;
  qsakv_model_config c;
  TU_OK(qsakv_model_config_preset(&c, "qwen4_exp"));
  c.tp_size = 4;
  const uint64_t budget = 40ull << 30;
  qsakv_capacity cap = plan(&c, budget);
  const uint64_t fixed = cap.ring_bytes + cap.topk_bytes;
  assert_int_equal(cap.bytes_per_block, 6912ull * 64);
  assert_int_equal(cap.num_blocks, (int64_t)((budget - fixed) / cap.bytes_per_block));
  assert_int_equal(cap.num_tokens, cap.num_blocks * 64);
  /* One more block would not fit. */
  assert_true(fixed + (uint64_t)(cap.num_blocks + 1) * cap.bytes_per_block > budget);
  /* A budget below the fixed costs holds nothing. */
  cap = plan(&c, fixed - 1);
  assert_int_equal(cap.num_blocks, 0);
}

static void test_cache_create_and_layout(void** state) {
  (void)state;
  qsakv_context* ctx = tu_context(QSAKV_BACKEND_CPU);
  qsakv_model_config c;
  tu_small_config(&c, 4, 2, 64, QSAKV_DTYPE_FP16, QSAKV_DTYPE_FP16, 16);
  qsakv_cache_options o;
  TU_OK(qsakv_cache_options_init(&o));
  o.num_blocks = 10;
  qsakv_cache* cache = NULL;
  TU_OK(qsakv_cache_create(&cache, ctx, &c, NULL, &o));
  qsakv_cache_layout L;
  memset(&L, 0, sizeof L);
  L.struct_size = sizeof L;
  TU_OK(qsakv_cache_get_layout(cache, &L));
  assert_int_equal(L.num_blocks, 10);
  assert_int_equal(L.kv_stride_head, 64);
  assert_int_equal(L.kv_stride_token, 2 * 64);
  assert_int_equal(L.kv_stride_kv, 16 * 2 * 64);
  assert_int_equal(L.kv_stride_block, 2 * 16 * 2 * 64);
  assert_int_equal(L.kv_bytes_per_layer, 10ull * 2 * 16 * 2 * 64 * 2);
  assert_int_equal(L.topk_cols, 2051);
  assert_int_equal(L.topk_rows, c.max_batched_tokens);
  assert_int_equal(L.topk_shared, 1);
  /* Shared top-k: every layer reports the same buffer. */
  qsakv_layer_buffers a = {sizeof a, QSAKV_LAYER_BUFFERS_VERSION};
  qsakv_layer_buffers b = {sizeof b, QSAKV_LAYER_BUFFERS_VERSION};
  TU_OK(qsakv_cache_get_layer_buffers(cache, 3, &a));
  TU_OK(qsakv_cache_get_layer_buffers(cache, 7, &b));
  assert_ptr_equal(a.topk, b.topk);
  assert_ptr_not_equal(a.kv, b.kv);
  TU_EXPECT_STATUS(qsakv_cache_get_layer_buffers(cache, 4, &a), QSAKV_ERROR_INVALID_ARGUMENT);
  qsakv_cache_destroy(cache);
  /* Private per-layer buffers on request. */
  o.share_topk = 0;
  TU_OK(qsakv_cache_create(&cache, ctx, &c, NULL, &o));
  TU_OK(qsakv_cache_get_layer_buffers(cache, 3, &a));
  TU_OK(qsakv_cache_get_layer_buffers(cache, 7, &b));
  assert_ptr_not_equal(a.topk, b.topk);
  qsakv_cache_destroy(cache);
  qsakv_context_destroy(ctx);
}

static void test_external_topk_checked(void** state) {
  (void)state;
  qsakv_context* ctx = tu_context(QSAKV_BACKEND_CPU);
  qsakv_model_config c;
  tu_small_config(&c, 4, 2, 64, QSAKV_DTYPE_FP16, QSAKV_DTYPE_FP16, 16);
  static int32_t buf[256 * 2051];
  qsakv_cache_options o;
  TU_OK(qsakv_cache_options_init(&o));
  o.num_blocks = 4;
  o.external_topk = buf;
  o.external_topk_dtype = QSAKV_DTYPE_INT32;
  o.external_topk_rows = 256;
  o.external_topk_cols = 2051;
  qsakv_cache* cache = NULL;
  TU_OK(qsakv_cache_create(&cache, ctx, &c, NULL, &o));
  qsakv_layer_buffers lb = {sizeof lb, QSAKV_LAYER_BUFFERS_VERSION};
  TU_OK(qsakv_cache_get_layer_buffers(cache, 7, &lb));
  assert_ptr_equal(lb.topk, buf);
  qsakv_cache_destroy(cache);
  o.external_topk_dtype = QSAKV_DTYPE_INT64;
  TU_EXPECT_STATUS(qsakv_cache_create(&cache, ctx, &c, NULL, &o), QSAKV_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(qsakv_last_error(), "int32"));
  o.external_topk_dtype = QSAKV_DTYPE_INT32;
  o.external_topk_cols = 2048;
  TU_EXPECT_STATUS(qsakv_cache_create(&cache, ctx, &c, NULL, &o), QSAKV_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(qsakv_last_error(), "2051"));
  o.external_topk_cols = 2051;
  o.external_topk_rows = 255;
  TU_EXPECT_STATUS(qsakv_cache_create(&cache, ctx, &c, NULL, &o), QSAKV_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(qsakv_last_error(), "max_batched_tokens"));
  assert_null(cache);
  qsakv_context_destroy(ctx);
}

static void test_e4m3_needs_overlay(void** state) {
  (void)state;
  qsakv_context* ctx = tu_context(QSAKV_BACKEND_CPU);
  qsakv_model_config c;
  tu_small_config(&c, 4, 2, 64, QSAKV_DTYPE_FP16, QSAKV_DTYPE_E4M3, 16);
  qsakv_cache_options o;
  TU_OK(qsakv_cache_options_init(&o));
  o.num_blocks = 4;
  qsakv_cache* cache = NULL;
  TU_EXPECT_STATUS(qsakv_cache_create(&cache, ctx, &c, NULL, &o), QSAKV_ERROR_OVERLAY_MISSING);
  assert_null(cache);
  /* An overlay validated for another config is refused too. */
  const float k[2] = {0.5f, 0.25f}, v[2] = {0.125f, 2.0f};
  qsakv_overlay* ov = tu_make_overlay(&c, k, v);
  qsakv_model_config other = c;
  other.max_requests = 32;
  TU_EXPECT_STATUS(qsakv_cache_create(&cache, ctx, &other, ov, &o),
                   QSAKV_ERROR_OVERLAY_NOT_VALIDATED);
  /* The message names the first field that differs and both values. */
  char want[128];
  snprintf(want, sizeof want, "max_requests is %d there, 32 in this one", c.max_requests);
  if (!strstr(qsakv_last_error(), want))
    fail_msg("message \"%s\" lacks \"%s\"", qsakv_last_error(), want);
  other = c;
  other.index_key_dtype = QSAKV_DTYPE_E4M3;
  TU_EXPECT_STATUS(qsakv_cache_create(&cache, ctx, &other, ov, &o),
                   QSAKV_ERROR_OVERLAY_NOT_VALIDATED);
  assert_non_null(strstr(qsakv_last_error(), "index_key_dtype is fp16 there, e4m3 in this one"));
  TU_OK(qsakv_cache_create(&cache, ctx, &c, ov, &o));
  qsakv_layer_buffers lb = {sizeof lb, QSAKV_LAYER_BUFFERS_VERSION};
  TU_OK(qsakv_cache_get_layer_buffers(cache, 7, &lb));
  assert_true(lb.scales[0] == 0.25f && lb.scales[1] == 2.0f); /* CPU: host memory */
  qsakv_cache_destroy(cache);
  /* Unit scales: one scale of 1.0 is a value like any other; an overlay of nothing but
   * 1.0 is refused unless the options ask for it (a negative control). */
  const float one_k[2] = {1.0f, 0.25f}, ones[2] = {1.0f, 1.0f};
  qsakv_overlay* one = tu_make_overlay(&c, one_k, v);
  TU_OK(qsakv_cache_create(&cache, ctx, &c, one, &o));
  qsakv_cache_destroy(cache);
  qsakv_overlay_destroy(one);
  qsakv_overlay* unit = tu_make_overlay(&c, ones, ones);
  TU_EXPECT_STATUS(qsakv_cache_create(&cache, ctx, &c, unit, &o), QSAKV_ERROR_OVERLAY_UNIT_SCALES);
  assert_null(cache);
  assert_non_null(strstr(qsakv_last_error(), "every one of its scales is 1.0"));
  assert_non_null(strstr(qsakv_last_error(), "allow_unit_scales is 0"));
  o.allow_unit_scales = 2;
  TU_EXPECT_STATUS(qsakv_cache_create(&cache, ctx, &c, unit, &o), QSAKV_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(qsakv_last_error(), "allow_unit_scales is 2"));
  o.allow_unit_scales = 1;
  TU_OK(qsakv_cache_create(&cache, ctx, &c, unit, &o));
  TU_OK(qsakv_cache_get_layer_buffers(cache, 7, &lb));
  assert_true(lb.scales[0] == 1.0f && lb.scales[1] == 1.0f);
  qsakv_cache_destroy(cache);
  o.allow_unit_scales = 0;
  /* Options of version 1 (without the field) get the default: refused. */
  o.version = 1;
  o.struct_size = offsetof(qsakv_cache_options, allow_unit_scales);
  TU_EXPECT_STATUS(qsakv_cache_create(&cache, ctx, &c, unit, &o), QSAKV_ERROR_OVERLAY_UNIT_SCALES);
  o.version = QSAKV_CACHE_OPTIONS_VERSION;
  o.struct_size = sizeof o;
  qsakv_overlay_destroy(unit);
  /* A 16-bit cache takes no overlay. */
  c.kv_dtype = QSAKV_DTYPE_FP16;
  TU_EXPECT_STATUS(qsakv_cache_create(&cache, ctx, &c, ov, &o), QSAKV_ERROR_INVALID_ARGUMENT);
  qsakv_overlay_destroy(ov);
  /* A budget too small for one block is refused with the arithmetic. */
  o.num_blocks = 0;
  o.memory_budget_bytes = 1000;
  TU_EXPECT_STATUS(qsakv_cache_create(&cache, ctx, &c, NULL, &o), QSAKV_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(qsakv_last_error(), "fixed costs"));
  qsakv_context_destroy(ctx);
}

static void test_budget_honoured_in_every_topk_mode(void** state) {
  (void)state;
  qsakv_context* ctx = tu_context(QSAKV_BACKEND_CPU);
  qsakv_model_config c;
  tu_small_config(&c, 4, 2, 64, QSAKV_DTYPE_FP16, QSAKV_DTYPE_FP16, 16);
  const uint64_t budget = 200ull << 20;
  for (int share = 1; share >= 0; --share) {
    qsakv_cache_options o;
    TU_OK(qsakv_cache_options_init(&o));
    o.memory_budget_bytes = budget;
    o.share_topk = share;
    qsakv_cache* cache = NULL;
    TU_OK(qsakv_cache_create(&cache, ctx, &c, NULL, &o));
    qsakv_cache_layout L;
    memset(&L, 0, sizeof L);
    L.struct_size = sizeof L;
    TU_OK(qsakv_cache_get_layout(cache, &L));
    print_message("share_topk=%d: %lld blocks, %llu of %llu bytes\n", share,
                  (long long)L.num_blocks, (unsigned long long)L.total_bytes,
                  (unsigned long long)budget);
    assert_true(L.num_blocks > 0);
    assert_true(L.total_bytes <= budget);
    /* and nearly all of it is used: less than two blocks' worth (plus the scales) left */
    assert_true(
        budget - L.total_bytes <
        2 * (L.kv_bytes_per_layer / L.num_blocks + L.compressed_bytes_per_layer / L.num_blocks) *
                2 +
            4096);
    qsakv_cache_destroy(cache);
  }
  qsakv_context_destroy(ctx);
}

static void test_sizes_that_would_wrap_are_refused(void** state) {
  (void)state;
  qsakv_context* ctx = tu_context(QSAKV_BACKEND_CPU);
  qsakv_model_config c;
  tu_small_config(&c, 4, 2, 64, QSAKV_DTYPE_FP16, QSAKV_DTYPE_FP16, 16);
  qsakv_cache_options o;
  TU_OK(qsakv_cache_options_init(&o));
  qsakv_cache* cache = NULL;
  o.num_blocks = (int64_t)1 << 52; /* its byte size would wrap around 2^64 */
  TU_EXPECT_STATUS(qsakv_cache_create(&cache, ctx, &c, NULL, &o), QSAKV_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(qsakv_last_error(), "num_blocks"));
  o.num_blocks = (int64_t)INT32_MAX + 1; /* block tables are int32 */
  TU_EXPECT_STATUS(qsakv_cache_create(&cache, ctx, &c, NULL, &o), QSAKV_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(qsakv_last_error(), "int32"));
  assert_null(cache);
  o.num_blocks = 4;
  TU_OK(qsakv_cache_create(&cache, ctx, &c, NULL, &o));
  TU_OK(qsakv_cache_note_external_codes(cache, 3, NULL));
  TU_EXPECT_STATUS(qsakv_cache_note_external_codes(cache, 4, NULL), QSAKV_ERROR_INVALID_ARGUMENT);
  /* The same message as every layer argument: which layers are QSA layers. */
  assert_non_null(strstr(qsakv_last_error(), "layer 4 is not a QSA layer of this config ("));
  qsakv_cache_destroy(cache);
  qsakv_context_destroy(ctx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_reference_tp4),
      cmocka_unit_test(test_reference_tp4_e4m3_index_keys),
      cmocka_unit_test(test_budget_arithmetic),
      cmocka_unit_test(test_cache_create_and_layout),
      cmocka_unit_test(test_external_topk_checked),
      cmocka_unit_test(test_e4m3_needs_overlay),
      cmocka_unit_test(test_budget_honoured_in_every_topk_mode),
      cmocka_unit_test(test_sizes_that_would_wrap_are_refused),
  };
  return cmocka_run_group_tests_name("capacity", tests, NULL, NULL);
}
