// SPDX-License-Identifier: Apache-2.0
/* Stores: E4M3 quantisation bit for bit against the FP64 oracle (NaN, inf, subnormals,
 * saturating values), 16-bit copies, -1 slots skipped, untouched bytes left alone, the
 * index-key rings and the compressed cache. On a GPU: CUDA equals CPU byte for byte. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

/* FP16 inputs that exercise every path of the encoder. */
static uint16_t special_fp16(int i) {
  const uint16_t specials[] = {0x0000, 0x8000, 0x7C00, 0xFC00, 0x7E00, 0xFE01, 0x0001, 0x8001,
                               0x03FF, 0x0400, 0x7BFF, 0xFBFF, 0x5F00, 0x5F80, 0x3C00, 0xBC00};
  return specials[i % 16];
}

typedef struct {
  qsakv_context* ctx;
  qsakv_cache* cache;
  qsakv_overlay* ov;
  qsakv_cache_layout L;
} store_world;

static void make_world(store_world* w, qsakv_context* ctx, qsakv_dtype act, qsakv_dtype kv,
                       float ks, float vs) {
  memset(w, 0, sizeof *w);
  w->ctx = ctx;
  qsakv_model_config c;
  tu_small_config(&c, 8, 2, 128, act, kv, 16);
  if (kv == QSAKV_DTYPE_E4M3) {
    float k[2] = {ks, ks}, v[2] = {vs, vs};
    w->ov = tu_make_overlay(&c, k, v);
  }
  qsakv_cache_options o;
  TU_OK(qsakv_cache_options_init(&o));
  o.num_blocks = 40;
  TU_OK(qsakv_cache_create(&w->cache, ctx, &c, w->ov, &o));
  w->L.struct_size = sizeof w->L;
  TU_OK(qsakv_cache_get_layout(w->cache, &w->L));
}

static void free_world(store_world* w) {
  qsakv_cache_destroy(w->cache);
  qsakv_overlay_destroy(w->ov);
}

/* Stores n tokens (random plus specials) into layer 3 with a random slot mapping that
 * has -1 entries; returns the layer's bytes after the store. */
static uint8_t* do_store(store_world* w, const uint16_t* k, const uint16_t* v, const int64_t* slots,
                         int n) {
  const size_t row = 2 * 128, bytes = (size_t)n * row * 2;
  qsakv_layer_buffers lb = {sizeof lb, QSAKV_LAYER_BUFFERS_VERSION};
  TU_OK(qsakv_cache_get_layer_buffers(w->cache, 3, &lb));
  /* Poison first: bytes no slot names must keep it. */
  void* poison = tu_device_filled(w->ctx, w->L.kv_bytes_per_layer, 0xA5);
  TU_OK(qsakv_memcpy(w->ctx, lb.kv, poison, w->L.kv_bytes_per_layer, QSAKV_COPY_DEVICE_TO_DEVICE,
                     NULL));
  qsakv_free(w->ctx, poison);
  void* dk = tu_to_device(w->ctx, k, bytes);
  void* dv = tu_to_device(w->ctx, v, bytes);
  void* ds = tu_to_device(w->ctx, slots, sizeof(int64_t) * n);
  TU_OK(qsakv_store_kv(w->cache, 3, dk, dv, ds, n, NULL));
  uint8_t* out = malloc(w->L.kv_bytes_per_layer);
  tu_to_host(w->ctx, out, lb.kv, w->L.kv_bytes_per_layer);
  qsakv_free(w->ctx, dk);
  qsakv_free(w->ctx, dv);
  qsakv_free(w->ctx, ds);
  return out;
}

static void make_inputs(int n, int capacity, qsakv_dtype act, uint16_t** k, uint16_t** v,
                        int64_t** slots) {
  const int row = 2 * 128;
  *k = malloc(2 * (size_t)n * row);
  *v = malloc(2 * (size_t)n * row);
  *slots = malloc(sizeof(int64_t) * n);
  int* perm = malloc(sizeof(int) * capacity);
  for (int i = 0; i < capacity; ++i) perm[i] = i;
  for (int i = capacity - 1; i > 0; --i) {
    int j = (int)(tu_next() % (uint64_t)(i + 1)), t = perm[i];
    perm[i] = perm[j];
    perm[j] = t;
  }
  for (int t = 0; t < n; ++t) {
    (*slots)[t] = tu_int(0, 5) == 0 ? -1 : perm[t];
    for (int e = 0; e < row; ++e) {
      const int special = tu_int(0, 9) == 0;
      (*k)[t * row + e] =
          special ? special_fp16(tu_int(0, 15))
                  : tu_f32_to_act((float)(tu_normal() * pow(2.0, tu_uniform(-12, 6))), act);
      (*v)[t * row + e] =
          special ? special_fp16(tu_int(0, 15))
                  : tu_f32_to_act((float)(tu_normal() * pow(2.0, tu_uniform(-12, 6))), act);
    }
  }
  free(perm);
}

static void check_e4m3_store(qsakv_context* ctx, qsakv_dtype act) {
  const float ks = (float)tu_uniform(0.001, 0.1), vs = (float)tu_uniform(0.001, 0.1);
  store_world w;
  make_world(&w, ctx, act, QSAKV_DTYPE_E4M3, ks, vs);
  const int n = 300, capacity = 40 * 16;
  uint16_t *k, *v;
  int64_t* slots;
  make_inputs(n, capacity, act, &k, &v, &slots);
  uint8_t* got = do_store(&w, k, v, slots, n);
  uint8_t* want = malloc(w.L.kv_bytes_per_layer);
  memset(want, 0xA5, w.L.kv_bytes_per_layer);
  for (int t = 0; t < n; ++t) {
    if (slots[t] < 0) continue;
    const int64_t blk = slots[t] / 16, off = slots[t] % 16;
    for (int kv = 0; kv < 2; ++kv)
      for (int e = 0; e < 256; ++e) {
        const float x = tu_act_to_f32((kv ? v : k)[t * 256 + e], act);
        want[blk * w.L.kv_stride_block + kv * w.L.kv_stride_kv + off * w.L.kv_stride_token + e] =
            tu_e4m3_encode(x / (kv ? vs : ks));
      }
  }
  size_t bad = 0;
  for (size_t i = 0; i < w.L.kv_bytes_per_layer; ++i)
    if (got[i] != want[i])
      if (bad++ < 5) print_error("byte %zu: got 0x%02x want 0x%02x\n", i, got[i], want[i]);
  assert_int_equal(bad, 0);
  free(got);
  free(want);
  free(k);
  free(v);
  free(slots);
  free_world(&w);
}

static void test_e4m3_store_cpu(void** state) {
  (void)state;
  qsakv_context* ctx = tu_context(QSAKV_BACKEND_CPU);
  check_e4m3_store(ctx, QSAKV_DTYPE_FP16);
  check_e4m3_store(ctx, QSAKV_DTYPE_BF16);
  qsakv_context_destroy(ctx);
}

static void test_16bit_store_cpu(void** state) {
  (void)state;
  qsakv_context* ctx = tu_context(QSAKV_BACKEND_CPU);
  store_world w;
  make_world(&w, ctx, QSAKV_DTYPE_BF16, QSAKV_DTYPE_BF16, 1, 1);
  const int n = 200;
  uint16_t *k, *v;
  int64_t* slots;
  make_inputs(n, 40 * 16, QSAKV_DTYPE_BF16, &k, &v, &slots);
  uint8_t* got = do_store(&w, k, v, slots, n);
  const uint16_t* g16 = (const uint16_t*)got;
  for (int t = 0; t < n; ++t) {
    if (slots[t] < 0) continue;
    const int64_t base =
        (slots[t] / 16) * w.L.kv_stride_block + (slots[t] % 16) * w.L.kv_stride_token;
    assert_memory_equal(g16 + base, k + t * 256, 512);
    assert_memory_equal(g16 + base + w.L.kv_stride_kv, v + t * 256, 512);
  }
  free(got);
  free(k);
  free(v);
  free(slots);
  free_world(&w);
  qsakv_context_destroy(ctx);
}

static void test_cuda_store_equals_cpu(void** state) {
  (void)state;
  qsakv_context* gpu = tu_cuda_context_or_skip();
  qsakv_context* cpu = tu_context(QSAKV_BACKEND_CPU);
  const qsakv_dtype acts[] = {QSAKV_DTYPE_FP16, QSAKV_DTYPE_BF16};
  const qsakv_dtype kvs[] = {QSAKV_DTYPE_E4M3, QSAKV_DTYPE_E4M3};
  for (int c = 0; c < 3; ++c) {
    const qsakv_dtype act = c == 2 ? QSAKV_DTYPE_FP16 : acts[c];
    const qsakv_dtype kvt = c == 2 ? QSAKV_DTYPE_FP16 : kvs[c];
    const float ks = (float)tu_uniform(0.001, 0.1), vs = (float)tu_uniform(0.001, 0.1);
    store_world a, b;
    make_world(&a, cpu, act, kvt, ks, vs);
    make_world(&b, gpu, act, kvt, ks, vs);
    const int n = 600;
    uint16_t *k, *v;
    int64_t* slots;
    make_inputs(n, 40 * 16, act, &k, &v, &slots);
    uint8_t* x = do_store(&a, k, v, slots, n);
    uint8_t* y = do_store(&b, k, v, slots, n);
    assert_memory_equal(x, y, a.L.kv_bytes_per_layer);
    free(x);
    free(y);
    free(k);
    free(v);
    free(slots);
    free_world(&a);
    free_world(&b);
  }
  qsakv_context_destroy(cpu);
  qsakv_context_destroy(gpu);
}

/* Every FP16 bit pattern at several scales through the GPU store and the CPU store:
 * identical bytes (the GPU divides without a division instruction; this is its proof). */
static void test_cuda_store_every_fp16(void** state) {
  (void)state;
  qsakv_context* gpu = tu_cuda_context_or_skip();
  qsakv_context* cpu = tu_context(QSAKV_BACKEND_CPU);
  const float scales[] = {1.0f, 1.0f / 448.0f, 0.0123f, 3.7f, 1e-3f, 100.0f, 0.3333333f, 1e-6f};
  const int n = 65536 / 256; /* tokens of 256 elements (2 heads x 128) */
  uint16_t* k = malloc(2 * 65536);
  int64_t* slots = malloc(sizeof(int64_t) * n);
  for (int i = 0; i < 65536; ++i) k[i] = (uint16_t)i;
  for (int t = 0; t < n; ++t) slots[t] = t;
  size_t bad = 0;
  for (size_t si = 0; si < sizeof scales / sizeof scales[0]; ++si) {
    store_world a, b;
    make_world(&a, cpu, QSAKV_DTYPE_FP16, QSAKV_DTYPE_E4M3, scales[si], scales[si]);
    make_world(&b, gpu, QSAKV_DTYPE_FP16, QSAKV_DTYPE_E4M3, scales[si], scales[si]);
    uint8_t* x = do_store(&a, k, k, slots, n);
    uint8_t* y = do_store(&b, k, k, slots, n);
    for (size_t i = 0; i < a.L.kv_bytes_per_layer; ++i)
      if (x[i] != y[i] && bad++ < 5)
        print_error("scale %g byte %zu: cpu 0x%02x gpu 0x%02x\n", scales[si], i, x[i], y[i]);
    free(x);
    free(y);
    free_world(&a);
    free_world(&b);
  }
  assert_int_equal(bad, 0);
  free(k);
  free(slots);
  qsakv_context_destroy(cpu);
  qsakv_context_destroy(gpu);
}

static void check_index_stores(qsakv_context* ctx, uint8_t** ring_out, uint8_t** comp_out,
                               const uint16_t* keys, const int32_t* req, const int64_t* pos,
                               const int64_t* cslots, int n, store_world* w) {
  qsakv_layer_buffers lb = {sizeof lb, QSAKV_LAYER_BUFFERS_VERSION};
  TU_OK(qsakv_cache_get_layer_buffers(w->cache, 7, &lb));
  void* dk = tu_to_device(ctx, keys, 2 * (size_t)n * 128);
  void* dr = tu_to_device(ctx, req, 4 * (size_t)n);
  void* dp = tu_to_device(ctx, pos, 8 * (size_t)n);
  void* dc = tu_to_device(ctx, cslots, 8 * (size_t)n);
  TU_OK(qsakv_store_index_keys(w->cache, 7, dk, dr, dp, n, NULL));
  TU_OK(qsakv_store_compressed_keys(w->cache, 7, dk, dc, n, NULL));
  *ring_out = malloc(w->L.ring_bytes_per_layer);
  *comp_out = malloc(w->L.compressed_bytes_per_layer);
  tu_to_host(ctx, *ring_out, lb.ring_keys, w->L.ring_bytes_per_layer);
  tu_to_host(ctx, *comp_out, lb.compressed_keys, w->L.compressed_bytes_per_layer);
  qsakv_free(ctx, dk);
  qsakv_free(ctx, dr);
  qsakv_free(ctx, dp);
  qsakv_free(ctx, dc);
}

static void test_index_key_stores_cpu_and_cuda(void** state) {
  (void)state;
  qsakv_context* cpu = tu_context(QSAKV_BACKEND_CPU);
  qsakv_context* gpu = tu_context(QSAKV_BACKEND_CUDA);
  store_world w;
  make_world(&w, cpu, QSAKV_DTYPE_FP16, QSAKV_DTYPE_FP16, 1, 1);
  const int n = 64;
  uint16_t keys[64 * 128];
  int32_t req[64];
  int64_t pos[64], cs[64];
  for (int i = 0; i < n; ++i) {
    req[i] = i % 8;
    pos[i] = i == 5 ? -1 : (int64_t)(i / 8) + 100;         /* ring slot = pos % 4 */
    cs[i] = i == 9 ? -1 : (int64_t)(i * 4 + tu_int(0, 3)); /* any token of the group */
    for (int d = 0; d < 128; ++d) keys[i * 128 + d] = tu_f32_to_fp16((float)tu_normal());
  }
  uint8_t *ring, *comp;
  check_index_stores(cpu, &ring, &comp, keys, req, pos, cs, n, &w);
  const uint16_t* r16 = (const uint16_t*)ring;
  const uint16_t* c16 = (const uint16_t*)comp;
  /* Last writer wins in the ring: rows with the same (request, pos % 4). */
  for (int i = 0; i < n; ++i) {
    if (pos[i] >= 0) {
      int last = i;
      for (int j = i + 1; j < n; ++j)
        if (pos[j] >= 0 && req[j] == req[i] && pos[j] % 4 == pos[i] % 4) last = j;
      assert_memory_equal(r16 + ((size_t)req[i] * w.L.ring_length + pos[i] % 4) * 128,
                          keys + last * 128, 256);
    }
    if (cs[i] >= 0) assert_memory_equal(c16 + (size_t)(cs[i] / 4) * 128, keys + i * 128, 256);
  }
  if (gpu) {
    store_world g;
    make_world(&g, gpu, QSAKV_DTYPE_FP16, QSAKV_DTYPE_FP16, 1, 1);
    uint8_t *ring2, *comp2;
    /* No duplicate (request, slot) pairs for the GPU comparison: order is not defined. */
    /* (request i % 8, position i / 8) for i < 32 only: every ring entry written once. */
    for (int i = 0; i < n; ++i) pos[i] = i < 32 ? i / 8 : -1;
    free(ring);
    free(comp);
    check_index_stores(cpu, &ring, &comp, keys, req, pos, cs, n, &w);
    check_index_stores(gpu, &ring2, &comp2, keys, req, pos, cs, n, &g);
    assert_memory_equal(ring, ring2, w.L.ring_bytes_per_layer);
    assert_memory_equal(comp, comp2, w.L.compressed_bytes_per_layer);
    free(ring2);
    free(comp2);
    free_world(&g);
    qsakv_context_destroy(gpu);
  } else {
    print_message("[ SKIP part] GPU comparison of index-key stores: no GPU\n");
  }
  free(ring);
  free(comp);
  free_world(&w);
  qsakv_context_destroy(cpu);
}

static void test_store_errors(void** state) {
  (void)state;
  qsakv_context* ctx = tu_context(QSAKV_BACKEND_CPU);
  store_world w;
  make_world(&w, ctx, QSAKV_DTYPE_FP16, QSAKV_DTYPE_FP16, 1, 1);
  uint16_t k[256];
  int64_t s[1] = {0};
  TU_EXPECT_STATUS(qsakv_store_kv(NULL, 3, k, k, s, 1, NULL), QSAKV_ERROR_INVALID_ARGUMENT);
  TU_EXPECT_STATUS(qsakv_store_kv(w.cache, 4, k, k, s, 1, NULL), QSAKV_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(qsakv_last_error(), "layer 4"));
  TU_EXPECT_STATUS(qsakv_store_kv(w.cache, 3, NULL, k, s, 1, NULL), QSAKV_ERROR_INVALID_ARGUMENT);
  TU_EXPECT_STATUS(qsakv_store_kv(w.cache, 3, k, k, s, -1, NULL), QSAKV_ERROR_INVALID_ARGUMENT);
  TU_OK(qsakv_store_kv(w.cache, 3, NULL, NULL, NULL, 0, NULL)); /* nothing to do */
  free_world(&w);
  qsakv_context_destroy(ctx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_e4m3_store_cpu),
      cmocka_unit_test(test_16bit_store_cpu),
      cmocka_unit_test(test_cuda_store_equals_cpu),
      cmocka_unit_test(test_cuda_store_every_fp16),
      cmocka_unit_test(test_index_key_stores_cpu_and_cuda),
      cmocka_unit_test(test_store_errors),
  };
  tu_apply_filter();
  return cmocka_run_group_tests_name("store", tests, NULL, NULL);
}
