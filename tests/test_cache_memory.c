// SPDX-License-Identifier: Apache-2.0
/* Caches over caller-owned memory: the same results as library-allocated caches, bit for
 * bit, through store, select and attention; every refusal names the buffer; the library
 * never frees the caller's buffers; the CUDA backend refuses host memory. */
#define _ISOC11_SOURCE
#include <stdlib.h>
#include <string.h>

#include "scenario.h"

enum { kTokens = 300, kRows = 3 };

typedef struct {
  qsakv_context* ctx;
  qsakv_model_config cfg;
  qsakv_overlay* overlay;
  qsakv_cache_options opts;
  qsakv_cache_layout layout;
  qsakv_layer_memory layers[QSAKV_MAX_LAYERS];
} fixture;

static void fixture_init(fixture* f, qsakv_context* ctx) {
  memset(f, 0, sizeof *f);
  f->ctx = ctx;
  tu_small_config(&f->cfg, 4, 1, 64, QSAKV_DTYPE_FP16, QSAKV_DTYPE_E4M3, 16);
  float ks[QSAKV_MAX_LAYERS], vs[QSAKV_MAX_LAYERS];
  for (int i = 0; i < f->cfg.num_qsa_layers; ++i) {
    ks[i] = 0.02f;
    vs[i] = 0.01f;
  }
  f->overlay = tu_make_overlay(&f->cfg, ks, vs);
  TU_OK(qsakv_cache_options_init(&f->opts));
  f->opts.num_blocks = 40;
  f->layout.struct_size = sizeof f->layout;
  TU_OK(qsakv_cache_layout_for(&f->cfg, &f->opts, &f->layout));
}

/* Allocates every layer's buffers through the library's helper (device memory on the CUDA
 * backend, host memory on the CPU backend), each the exact size the layout asks for. */
static void fixture_alloc(fixture* f) {
  for (int i = 0; i < f->cfg.num_qsa_layers; ++i) {
    qsakv_layer_memory* m = &f->layers[i];
    m->kv_bytes = f->layout.kv_bytes_per_layer;
    m->compressed_bytes = f->layout.compressed_bytes_per_layer;
    m->ring_bytes = f->layout.ring_bytes_per_layer;
    TU_OK(qsakv_malloc(f->ctx, &m->kv, m->kv_bytes));
    TU_OK(qsakv_malloc(f->ctx, &m->compressed_keys, m->compressed_bytes));
    TU_OK(qsakv_malloc(f->ctx, &m->ring_keys, m->ring_bytes));
  }
}

static void fixture_free(fixture* f) {
  for (int i = 0; i < f->cfg.num_qsa_layers; ++i) {
    qsakv_free(f->ctx, f->layers[i].kv);
    qsakv_free(f->ctx, f->layers[i].compressed_keys);
    qsakv_free(f->ctx, f->layers[i].ring_keys);
  }
  qsakv_overlay_destroy(f->overlay);
}

static qsakv_cache_memory memory_of(fixture* f) {
  qsakv_cache_memory m = {sizeof m, QSAKV_CACHE_MEMORY_VERSION};
  m.num_layers = f->cfg.num_qsa_layers;
  m.layers = f->layers;
  return m;
}

/* Store, select and sparse attention on `cache` with data from `seed`; returns the
 * attention output and (through *topk) the selection, host copies. */
static uint16_t* run_pipeline(qsakv_context* ctx, qsakv_cache* cache, const qsakv_model_config* c,
                              uint64_t seed, int32_t** topk_out) {
  const int layer = c->qsa_layers[1];
  qsakv_cache_layout L;
  memset(&L, 0, sizeof L);
  L.struct_size = sizeof L;
  TU_OK(qsakv_cache_get_layout(cache, &L));
  qsakv_rank_geometry g;
  memset(&g, 0, sizeof g);
  g.struct_size = sizeof g;
  TU_OK(qsakv_model_config_rank_geometry(c, &g));
  tu_rng rng = {seed};
  const int row = g.kv_heads * c->head_dim, idim = c->index_head_dim;
  const int pages = (kTokens + c->block_size - 1) / c->block_size;
  uint16_t* k = malloc(2 * (size_t)kTokens * row);
  uint16_t* v = malloc(2 * (size_t)kTokens * row);
  int64_t slots[kTokens];
  int32_t bt[64];
  for (int p = 0; p < pages; ++p)
    bt[p] = (p * 7 + 3) % (int)L.num_blocks; /* distinct: 7 and 40 coprime */
  for (int t = 0; t < kTokens; ++t) {
    slots[t] = (int64_t)bt[t / c->block_size] * c->block_size + t % c->block_size;
    for (int e = 0; e < row; ++e) {
      k[(size_t)t * row + e] = tu_f32_to_fp16((float)tu_rng_normal(&rng));
      v[(size_t)t * row + e] = tu_f32_to_fp16((float)tu_rng_normal(&rng));
    }
  }
  const int groups = kTokens / c->compress_ratio;
  uint16_t* ck = malloc(2 * (size_t)groups * idim);
  int64_t* cs = malloc(sizeof(int64_t) * groups);
  for (int i = 0; i < groups; ++i) {
    cs[i] = slots[i * c->compress_ratio];
    for (int d = 0; d < idim; ++d)
      ck[(size_t)i * idim + d] = tu_f32_to_fp16((float)tu_rng_int(&rng, -3, 3));
  }
  const size_t qn = (size_t)kRows * g.q_heads * c->head_dim;
  const size_t iqn = (size_t)kRows * c->index_num_heads * idim;
  uint16_t* q = malloc(2 * qn);
  uint16_t* iq = malloc(2 * iqn);
  for (size_t i = 0; i < qn; ++i) q[i] = tu_f32_to_fp16((float)tu_rng_normal(&rng));
  for (size_t i = 0; i < iqn; ++i) iq[i] = tu_f32_to_fp16((float)tu_rng_int(&rng, -2, 2));

  void* dk = tu_to_device(ctx, k, 2 * (size_t)kTokens * row);
  void* dv = tu_to_device(ctx, v, 2 * (size_t)kTokens * row);
  void* ds = tu_to_device(ctx, slots, sizeof slots);
  void* dck = tu_to_device(ctx, ck, 2 * (size_t)groups * idim);
  void* dcs = tu_to_device(ctx, cs, sizeof(int64_t) * groups);
  void* dbt = tu_to_device(ctx, bt, sizeof(int32_t) * pages);
  void* dq = tu_to_device(ctx, q, 2 * qn);
  void* diq = tu_to_device(ctx, iq, 2 * iqn);
  void* dout = tu_device_filled(ctx, 2 * qn, 0xFF);
  TU_OK(qsakv_store_kv(cache, layer, dk, dv, ds, kTokens, NULL));
  TU_OK(qsakv_store_compressed_keys(cache, layer, dck, dcs, groups, NULL));
  qsakv_plan_options po;
  TU_OK(qsakv_plan_options_init(&po));
  po.max_rows = 8;
  qsakv_plan* plan = NULL;
  TU_OK(qsakv_plan_create(&plan, cache, &po));
  int32_t qs[2] = {0, kRows}, lens[1] = {kTokens};
  qsakv_batch b = QSAKV_BATCH_INIT;
  b.num_requests = 1;
  b.query_start = qs;
  b.seq_lens = lens;
  b.block_table = dbt;
  b.block_table_stride = pages;
  TU_OK(qsakv_plan_update(plan, &b, NULL));
  TU_OK(qsakv_select_topk(plan, layer, diq, NULL, 0, NULL));
  TU_OK(qsakv_attention_run(plan, layer, QSAKV_ATTENTION_SPARSE, dq, NULL, 0, dout, NULL));
  TU_OK(qsakv_stream_synchronize(ctx, NULL));
  uint16_t* out = malloc(2 * qn);
  tu_to_host(ctx, out, dout, 2 * qn);
  qsakv_layer_buffers lb = {sizeof lb, QSAKV_LAYER_BUFFERS_VERSION};
  TU_OK(qsakv_cache_get_layer_buffers(cache, layer, &lb));
  *topk_out = malloc(sizeof(int32_t) * (size_t)kRows * g.topk_width);
  tu_to_host(ctx, *topk_out, lb.topk, sizeof(int32_t) * (size_t)kRows * g.topk_width);
  qsakv_plan_destroy(plan);
  void* dev[] = {dk, dv, ds, dck, dcs, dbt, dq, diq, dout};
  for (size_t i = 0; i < sizeof dev / sizeof dev[0]; ++i) qsakv_free(ctx, dev[i]);
  free(k);
  free(v);
  free(ck);
  free(cs);
  free(q);
  free(iq);
  return out;
}

/* The same pipeline on a library-allocated cache and on the caller's memory. */
static void check_same_results(qsakv_context* ctx, const char* what) {
  fixture f;
  fixture_init(&f, ctx);
  fixture_alloc(&f);
  /* Poison the caller's memory first: only what the store wrote may be read. */
  for (int i = 0; i < f.cfg.num_qsa_layers; ++i) {
    void* p = tu_device_filled(ctx, f.layout.kv_bytes_per_layer, 0x7F); /* E4M3 NaN */
    TU_OK(qsakv_memcpy(ctx, f.layers[i].kv, p, f.layout.kv_bytes_per_layer,
                       QSAKV_COPY_DEVICE_TO_DEVICE, NULL));
    qsakv_free(ctx, p);
  }
  qsakv_cache *owned = NULL, *external = NULL;
  TU_OK(qsakv_cache_create(&owned, ctx, &f.cfg, f.overlay, &f.opts));
  qsakv_cache_memory m = memory_of(&f);
  TU_OK(qsakv_cache_create_with_memory(&external, ctx, &f.cfg, f.overlay, &f.opts, &m));
  qsakv_cache_layout lo, le;
  memset(&lo, 0, sizeof lo);
  memset(&le, 0, sizeof le);
  lo.struct_size = le.struct_size = sizeof lo;
  TU_OK(qsakv_cache_get_layout(owned, &lo));
  TU_OK(qsakv_cache_get_layout(external, &le));
  assert_int_equal(le.kv_bytes_per_layer, f.layout.kv_bytes_per_layer);
  assert_int_equal(le.kv_stride_block, lo.kv_stride_block);
  assert_true(le.total_bytes < lo.total_bytes); /* the caller's buffers are not counted */
  qsakv_layer_buffers lb = {sizeof lb, QSAKV_LAYER_BUFFERS_VERSION};
  TU_OK(qsakv_cache_get_layer_buffers(external, f.cfg.qsa_layers[1], &lb));
  assert_ptr_equal(lb.kv, f.layers[1].kv);
  assert_ptr_equal(lb.compressed_keys, f.layers[1].compressed_keys);
  assert_ptr_equal(lb.ring_keys, f.layers[1].ring_keys);

  const uint64_t seed = tu_next();
  int32_t *topk_o, *topk_e;
  uint16_t* out_o = run_pipeline(ctx, owned, &f.cfg, seed, &topk_o);
  uint16_t* out_e = run_pipeline(ctx, external, &f.cfg, seed, &topk_e);
  qsakv_rank_geometry g;
  memset(&g, 0, sizeof g);
  g.struct_size = sizeof g;
  TU_OK(qsakv_model_config_rank_geometry(&f.cfg, &g));
  assert_memory_equal(topk_o, topk_e, sizeof(int32_t) * (size_t)kRows * g.topk_width);
  const size_t qn = (size_t)kRows * g.q_heads * f.cfg.head_dim;
  assert_memory_equal(out_o, out_e, 2 * qn);
  size_t finite = 0;
  for (size_t i = 0; i < qn; ++i) finite += (out_e[i] & 0x7C00) != 0x7C00;
  assert_int_equal(finite, qn); /* no poisoned byte was read */
  print_message(
      "%s: caller-owned cache == library cache: %zu outputs and the selection bit for bit\n", what,
      qn);
  qsakv_cache_destroy(external);
  qsakv_cache_destroy(owned);
  /* The caller's buffers are still the caller's: writable after the cache is gone, and
   * freed once, here (a library free would show as a double free under ASan). */
  void* p = tu_device_filled(ctx, 64, 0);
  TU_OK(qsakv_memcpy(ctx, f.layers[0].kv, p, 64, QSAKV_COPY_DEVICE_TO_DEVICE, NULL));
  TU_OK(qsakv_stream_synchronize(ctx, NULL));
  qsakv_free(ctx, p);
  fixture_free(&f);
  free(out_o);
  free(out_e);
  free(topk_o);
  free(topk_e);
}

static void test_same_results_cpu(void** state) {
  (void)state;
  qsakv_context* ctx = tu_context(QSAKV_BACKEND_CPU);
  check_same_results(ctx, "cpu");
  qsakv_context_destroy(ctx);
}

static void test_same_results_cuda(void** state) {
  (void)state;
  qsakv_context* ctx = tu_cuda_context_or_skip();
  check_same_results(ctx, "cuda");
  qsakv_context_destroy(ctx);
}

#define EXPECT_REFUSAL(call, needle)                                               \
  do {                                                                             \
    TU_EXPECT_STATUS(call, QSAKV_ERROR_INVALID_ARGUMENT);                          \
    if (!strstr(qsakv_last_error(), needle))                                       \
      fail_msg("message \"%s\" does not name \"%s\"", qsakv_last_error(), needle); \
    ++refusals;                                                                    \
  } while (0)
/* A refused create through &cache: *out is NULL afterwards whatever it held before (the
 * header's convention: on failure *out is NULL), so it starts as a stale non-NULL value. */
#define EXPECT_NO_CACHE(call, needle)                                             \
  do {                                                                            \
    cache = (qsakv_cache*)&stale_cache;                                           \
    EXPECT_REFUSAL(call, needle);                                                 \
    if (cache) fail_msg("a refused create left *out %p, not NULL", (void*)cache); \
  } while (0)

static void test_refusals(void** state) {
  (void)state;
  qsakv_context* ctx = tu_context(QSAKV_BACKEND_CPU);
  fixture f;
  fixture_init(&f, ctx);
  fixture_alloc(&f);
  qsakv_cache* cache = NULL;
  int stale_cache = 0; /* its address: a non-NULL *out that a refusal must clear */
  int refusals = 0;
  qsakv_cache_memory m = memory_of(&f);
  EXPECT_REFUSAL(qsakv_cache_create_with_memory(NULL, ctx, &f.cfg, f.overlay, &f.opts, &m), "out");
  EXPECT_NO_CACHE(qsakv_cache_create_with_memory(&cache, NULL, &f.cfg, f.overlay, &f.opts, &m),
                  "context is NULL");
  EXPECT_NO_CACHE(qsakv_cache_create_with_memory(&cache, ctx, NULL, f.overlay, &f.opts, &m),
                  "config");
  EXPECT_NO_CACHE(qsakv_cache_create_with_memory(&cache, ctx, &f.cfg, f.overlay, &f.opts, NULL),
                  "memory is NULL");
  EXPECT_REFUSAL(qsakv_cache_layout_for(NULL, &f.opts, &f.layout), "config");
  EXPECT_REFUSAL(qsakv_cache_layout_for(&f.cfg, NULL, &f.layout), "options is NULL");
  EXPECT_REFUSAL(qsakv_cache_layout_for(&f.cfg, &f.opts, NULL), "out");
  m.struct_size = 3;
  EXPECT_NO_CACHE(qsakv_cache_create_with_memory(&cache, ctx, &f.cfg, f.overlay, &f.opts, &m),
                  "memory.struct_size");
  m = memory_of(&f);
  m.version = 0xDEADBEEFu;
  EXPECT_NO_CACHE(qsakv_cache_create_with_memory(&cache, ctx, &f.cfg, f.overlay, &f.opts, &m),
                  "memory.version");
  m = memory_of(&f);
  m.num_layers = -1;
  EXPECT_NO_CACHE(qsakv_cache_create_with_memory(&cache, ctx, &f.cfg, f.overlay, &f.opts, &m),
                  "memory.num_layers is -1");
  m = memory_of(&f);
  EXPECT_NO_CACHE(qsakv_cache_create_with_memory(&cache, ctx, &f.cfg, f.overlay, NULL, &m),
                  "options");
  m.num_layers = 1;
  EXPECT_NO_CACHE(qsakv_cache_create_with_memory(&cache, ctx, &f.cfg, f.overlay, &f.opts, &m),
                  "memory.num_layers is 1");
  m = memory_of(&f);
  m.layers = NULL;
  EXPECT_NO_CACHE(qsakv_cache_create_with_memory(&cache, ctx, &f.cfg, f.overlay, &f.opts, &m),
                  "memory.layers is NULL");
  m = memory_of(&f);
  qsakv_cache_options o = f.opts;
  o.num_blocks = 0;
  o.memory_budget_bytes = 1 << 30;
  EXPECT_NO_CACHE(qsakv_cache_create_with_memory(&cache, ctx, &f.cfg, f.overlay, &o, &m),
                  "options.num_blocks is 0");
  EXPECT_REFUSAL(qsakv_cache_layout_for(&f.cfg, &o, &f.layout), "options.num_blocks is 0");

  qsakv_layer_memory saved = f.layers[1];
  f.layers[1].kv = NULL;
  EXPECT_NO_CACHE(qsakv_cache_create_with_memory(&cache, ctx, &f.cfg, f.overlay, &f.opts, &m),
                  "memory.layers[1].kv (layer 7) is NULL");
  f.layers[1] = saved;
  f.layers[1].compressed_bytes -= 1;
  EXPECT_NO_CACHE(qsakv_cache_create_with_memory(&cache, ctx, &f.cfg, f.overlay, &f.opts, &m),
                  "memory.layers[1].compressed_keys (layer 7) is");
  assert_non_null(strstr(qsakv_last_error(), "needs"));
  f.layers[1] = saved;
  f.layers[1].ring_keys = (char*)saved.ring_keys + 4;
  EXPECT_NO_CACHE(qsakv_cache_create_with_memory(&cache, ctx, &f.cfg, f.overlay, &f.opts, &m),
                  "16-byte aligned");
  f.layers[1] = saved;
  f.layers[1].kv = f.layers[0].kv;
  EXPECT_NO_CACHE(qsakv_cache_create_with_memory(&cache, ctx, &f.cfg, f.overlay, &f.opts, &m),
                  "memory.layers[1].kv (layer 7) overlaps memory.layers[0].kv");
  f.layers[1] = saved;
  /* The caller's top-k buffer: selection writes it, so it may not overlap a layer's buffer
   * (either create path checks its alignment). The buffer it names is the first one the
   * top-k's extent meets (the buffers are separate allocations). */
  o = f.opts;
  o.external_topk_dtype = QSAKV_DTYPE_INT32;
  o.external_topk_rows = f.layout.topk_rows;
  o.external_topk_cols = f.layout.topk_cols;
  o.external_topk = f.layers[1].compressed_keys;
  EXPECT_NO_CACHE(qsakv_cache_create_with_memory(&cache, ctx, &f.cfg, f.overlay, &o, &m),
                  "options.external_topk overlaps memory.layers[");
  int32_t* topk = malloc(sizeof(int32_t) * (size_t)(f.layout.topk_rows * f.layout.topk_cols + 1));
  o.external_topk = (char*)topk + 2;
  EXPECT_NO_CACHE(qsakv_cache_create_with_memory(&cache, ctx, &f.cfg, f.overlay, &o, &m),
                  "options.external_topk");
  assert_non_null(strstr(qsakv_last_error(), "4-byte aligned"));
  EXPECT_NO_CACHE(qsakv_cache_create(&cache, ctx, &f.cfg, f.overlay, &o), "4-byte aligned");
  o.external_topk = topk; /* a buffer of its own is taken */
  TU_OK(qsakv_cache_create_with_memory(&cache, ctx, &f.cfg, f.overlay, &o, &m));
  qsakv_cache_destroy(cache);
  free(topk);
  /* A bigger buffer than needed is fine. */
  f.layers[0].kv_bytes += 4096;
  TU_OK(qsakv_cache_create_with_memory(&cache, ctx, &f.cfg, f.overlay, &f.opts, &m));
  qsakv_cache_destroy(cache);
  print_message("caller memory: %d refusals, each naming its buffer or field\n", refusals);
  fixture_free(&f);
  qsakv_context_destroy(ctx);
}

/* The CUDA backend computes on device memory only: a host buffer is refused by name. */
static void test_cuda_refuses_host_memory(void** state) {
  (void)state;
  qsakv_context* ctx = tu_cuda_context_or_skip();
  fixture f;
  fixture_init(&f, ctx);
  fixture_alloc(&f);
  qsakv_cache_memory m = memory_of(&f);
  void* dev = f.layers[0].kv;
  void* host = aligned_alloc(256, (f.layout.kv_bytes_per_layer + 255) / 256 * 256);
  f.layers[0].kv = host;
  qsakv_cache* cache = NULL;
  int refusals = 0;
  EXPECT_REFUSAL(qsakv_cache_create_with_memory(&cache, ctx, &f.cfg, f.overlay, &f.opts, &m),
                 "memory.layers[0].kv (layer 3)");
  print_message("cuda: host memory refused: %s\n", qsakv_last_error());
  f.layers[0].kv = dev;
  free(host);
  fixture_free(&f);
  qsakv_context_destroy(ctx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_same_results_cpu),
      cmocka_unit_test(test_same_results_cuda),
      cmocka_unit_test(test_refusals),
      cmocka_unit_test(test_cuda_refuses_host_memory),
  };
  tu_apply_filter();
  return cmocka_run_group_tests_name("cache_memory", tests, NULL, NULL);
}
