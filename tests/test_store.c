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

/* A cache of `num_blocks` blocks: `kv` main cache (K scale ks, V scale vs where E4M3),
 * `index_keys` compressed keys. */
static void make_world_ex(store_world* w, qsakv_context* ctx, qsakv_dtype act, qsakv_dtype kv,
                          qsakv_dtype index_keys, float ks, float vs, int64_t num_blocks) {
  memset(w, 0, sizeof *w);
  w->ctx = ctx;
  qsakv_model_config c;
  tu_small_config(&c, 8, 2, 128, act, kv, 16);
  c.index_key_dtype = index_keys;
  if (kv == QSAKV_DTYPE_E4M3) {
    float k[2] = {ks, ks}, v[2] = {vs, vs};
    w->ov = tu_make_overlay(&c, k, v);
  }
  qsakv_cache_options o;
  TU_OK(qsakv_cache_options_init(&o));
  o.num_blocks = num_blocks;
  /* The codec tests' unit scale (the identity), asked for: E4M3 caches refuse unit scales
   * unless told (QSAKV_ERROR_OVERLAY_UNIT_SCALES). */
  o.allow_unit_scales = kv == QSAKV_DTYPE_E4M3 && ks == 1.0f && vs == 1.0f;
  TU_OK(qsakv_cache_create(&w->cache, ctx, &c, w->ov, &o));
  w->L.struct_size = sizeof w->L;
  TU_OK(qsakv_cache_get_layout(w->cache, &w->L));
}

static void make_world(store_world* w, qsakv_context* ctx, qsakv_dtype act, qsakv_dtype kv,
                       float ks, float vs) {
  make_world_ex(w, ctx, act, kv, QSAKV_DTYPE_FP16, ks, vs, 40);
}

static void free_world(store_world* w) {
  qsakv_cache_destroy(w->cache);
  qsakv_overlay_destroy(w->ov);
}

/* Fills `bytes` of device buffer `dst` with 0xA5: bytes no store names must keep it. */
static void poison(qsakv_context* ctx, void* dst, size_t bytes) {
  void* p = tu_device_filled(ctx, bytes, 0xA5);
  TU_OK(qsakv_memcpy(ctx, dst, p, bytes, QSAKV_COPY_DEVICE_TO_DEVICE, NULL));
  TU_OK(qsakv_stream_synchronize(ctx, NULL));
  qsakv_free(ctx, p);
}

/* Asserts got == want over the whole buffer, printing the first differing bytes. */
static void assert_image(const char* what, const uint8_t* got, const uint8_t* want, size_t n) {
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i)
    if (got[i] != want[i] && bad++ < 5)
      print_error("%s byte %zu: got 0x%02x want 0x%02x\n", what, i, got[i], want[i]);
  if (bad) fail_msg("%s: %zu of %zu bytes differ from the expected image", what, bad, n);
}

/* Stores n tokens (random plus specials) into layer 3 with a random slot mapping that
 * has -1 entries; returns the layer's bytes after the store. */
static uint8_t* do_store(store_world* w, const uint16_t* k, const uint16_t* v, const int64_t* slots,
                         int n) {
  const size_t row = 2 * 128, bytes = (size_t)n * row * 2;
  qsakv_layer_buffers lb = {sizeof lb, QSAKV_LAYER_BUFFERS_VERSION};
  TU_OK(qsakv_cache_get_layer_buffers(w->cache, 3, &lb));
  /* Poison first: bytes no slot names must keep it. */
  poison(w->ctx, lb.kv, w->L.kv_bytes_per_layer);
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
  assert_image("E4M3 store", got, want, w.L.kv_bytes_per_layer);
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

/* A 16-bit cache (BF16, then FP16) over a poisoned layer: each named slot holds its K and
 * V rows, every other byte (-1 slots, slots no token names) still the poison. */
static void test_16bit_store_cpu(void** state) {
  (void)state;
  qsakv_context* ctx = tu_context(QSAKV_BACKEND_CPU);
  const qsakv_dtype dtypes[] = {QSAKV_DTYPE_BF16, QSAKV_DTYPE_FP16};
  for (int di = 0; di < 2; ++di) {
    store_world w;
    make_world(&w, ctx, dtypes[di], dtypes[di], 1, 1);
    const int n = 200;
    uint16_t *k, *v;
    int64_t* slots;
    make_inputs(n, 40 * 16, dtypes[di], &k, &v, &slots);
    uint8_t* got = do_store(&w, k, v, slots, n);
    uint8_t* want = malloc(w.L.kv_bytes_per_layer);
    memset(want, 0xA5, w.L.kv_bytes_per_layer);
    uint16_t* w16 = (uint16_t*)want;
    for (int t = 0; t < n; ++t) {
      if (slots[t] < 0) continue;
      const int64_t base =
          (slots[t] / 16) * w.L.kv_stride_block + (slots[t] % 16) * w.L.kv_stride_token;
      memcpy(w16 + base, k + t * 256, 512);
      memcpy(w16 + base + w.L.kv_stride_kv, v + t * 256, 512);
    }
    assert_image(qsakv_dtype_name(dtypes[di]), got, want, w.L.kv_bytes_per_layer);
    free(got);
    free(want);
    free(k);
    free(v);
    free(slots);
    free_world(&w);
  }
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
  /* Poison first: ring rows and compressed entries no key names must keep it. */
  poison(ctx, lb.ring_keys, w->L.ring_bytes_per_layer);
  poison(ctx, lb.compressed_keys, w->L.compressed_bytes_per_layer);
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
  qsakv_context* gpu = tu_cuda_context_or_null("GPU comparison of index-key stores");
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
  /* The expected images over the poison: in key order, so that the last writer wins in the
   * ring (rows with the same request and pos % ring_length); the compressed entry of key i
   * is cs[i] / 4 (FP16 pages: entries of 128 keys' dims, back to back). */
  assert_int_equal(w.L.ring_length, 4);
  assert_int_equal(w.L.compressed_stride_block, (int64_t)w.L.compressed_keys_per_block * 128 * 2);
  uint8_t* want_ring = malloc(w.L.ring_bytes_per_layer);
  uint8_t* want_comp = malloc(w.L.compressed_bytes_per_layer);
  memset(want_ring, 0xA5, w.L.ring_bytes_per_layer);
  memset(want_comp, 0xA5, w.L.compressed_bytes_per_layer);
  for (int i = 0; i < n; ++i) {
    if (pos[i] >= 0)
      memcpy((uint16_t*)want_ring + ((size_t)req[i] * w.L.ring_length + pos[i] % 4) * 128,
             keys + i * 128, 256);
    if (cs[i] >= 0) memcpy((uint16_t*)want_comp + (size_t)(cs[i] / 4) * 128, keys + i * 128, 256);
  }
  assert_image("ring", ring, want_ring, w.L.ring_bytes_per_layer);
  assert_image("compressed keys", comp, want_comp, w.L.compressed_bytes_per_layer);
  free(want_ring);
  free(want_comp);
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
  }
  free(ring);
  free(comp);
  free_world(&w);
  qsakv_context_destroy(cpu);
}

/* ---- E4M3 compressed index keys ---------------------------------------------------- */

/* Stores n FP16 keys of 128 dims with E4M3 index keys (block size 16: 4 keys per page)
 * into layer 7 over a 0xA5-poisoned buffer; returns the buffer's bytes. */
static uint8_t* store_e4m3_keys(qsakv_context* ctx, const uint16_t* keys, const int64_t* slots,
                                int n, qsakv_cache_layout* L) {
  qsakv_model_config c;
  tu_small_config(&c, 8, 2, 128, QSAKV_DTYPE_FP16, QSAKV_DTYPE_FP16, 16);
  c.index_key_dtype = QSAKV_DTYPE_E4M3;
  qsakv_cache_options o;
  TU_OK(qsakv_cache_options_init(&o));
  o.num_blocks = 40;
  qsakv_cache* cache;
  TU_OK(qsakv_cache_create(&cache, ctx, &c, NULL, &o));
  L->struct_size = sizeof *L;
  TU_OK(qsakv_cache_get_layout(cache, L));
  qsakv_layer_buffers lb = {sizeof lb, QSAKV_LAYER_BUFFERS_VERSION};
  TU_OK(qsakv_cache_get_layer_buffers(cache, 7, &lb));
  poison(ctx, lb.compressed_keys, L->compressed_bytes_per_layer);
  void* dk = tu_to_device(ctx, keys, 2 * (size_t)n * 128);
  void* ds = tu_to_device(ctx, slots, 8 * (size_t)n);
  TU_OK(qsakv_store_compressed_keys(cache, 7, dk, ds, n, NULL));
  uint8_t* out = malloc(L->compressed_bytes_per_layer);
  tu_to_host(ctx, out, lb.compressed_keys, L->compressed_bytes_per_layer);
  qsakv_free(ctx, dk);
  qsakv_free(ctx, ds);
  qsakv_cache_destroy(cache);
  return out;
}

/* Keys that reach every rule of the per-key quantisation: zero and -0 keys (scale 0),
 * a NaN, +inf and -inf element (the key stored dead: scale 0, codes 0), FP16 subnormals
 * only, the FP16 range limits, an outlier channel, and random keys over six decades. */
static void make_index_keys(uint16_t* keys, int n) {
  for (int i = 0; i < n; ++i) {
    const double mag = pow(10.0, tu_uniform(-4.0, 2.0));
    for (int d = 0; d < 128; ++d) keys[i * 128 + d] = tu_f32_to_fp16((float)(mag * tu_normal()));
  }
  for (int d = 0; d < 128; ++d) {
    keys[0 * 128 + d] = 0x0000;
    keys[1 * 128 + d] = 0x8000;
    keys[5 * 128 + d] = (uint16_t)(0x0001 + d % 0x3FF + (d & 1 ? 0x8000 : 0)); /* subnormals */
  }
  keys[2 * 128 + 5] = 0x7E00;         /* NaN */
  keys[3 * 128 + 77] = 0x7C00;        /* +inf */
  keys[4 * 128 + 0] = 0xFC00;         /* -inf */
  keys[6 * 128 + 3] = 0x7BFF;         /* 65504 */
  keys[6 * 128 + 4] = 0xFBFF;         /* -65504 */
  keys[7 * 128 + 90] = tu_f32_to_fp16(/* an outlier channel */
                                      100.0f * tu_fp16_to_f32(keys[7 * 128 + 90]) + 50.0f);
}

/* The oracle: the header's rule in FP64 (a correctly rounded FP32 quotient of two FP32
 * values is the FP64 quotient rounded to FP32), codes by tu_e4m3_encode. */
static void oracle_e4m3_key(const uint16_t* x, uint8_t* codes, float* scale) {
  double amax = 0.0;
  int finite = 1;
  for (int d = 0; d < 128; ++d) {
    const double v = fabs((double)tu_fp16_to_f32(x[d]));
    if (!isfinite(v))
      finite = 0;
    else if (v > amax)
      amax = v;
  }
  const float s = finite && amax > 0.0 ? (float)(amax / 448.0) : 0.0f;
  for (int d = 0; d < 128; ++d)
    codes[d] = s > 0.0f ? tu_e4m3_encode((float)((double)tu_fp16_to_f32(x[d]) / (double)s)) : 0;
  *scale = s;
}

static void test_e4m3_index_key_store(void** state) {
  (void)state;
  qsakv_context* cpu = tu_context(QSAKV_BACKEND_CPU);
  const int n = 96, entries = 40 * 4;
  uint16_t* keys = malloc(2 * (size_t)n * 128);
  int64_t slots[96];
  make_index_keys(keys, n);
  /* Distinct entries in random order (the GPU writes keys in no defined order), any token
   * of the group, two skipped keys and one beyond the cache. */
  int perm[160];
  for (int i = 0; i < entries; ++i) perm[i] = i;
  for (int i = entries - 1; i > 0; --i) {
    const int j = tu_int(0, i), t = perm[i];
    perm[i] = perm[j];
    perm[j] = t;
  }
  for (int i = 0; i < n; ++i) slots[i] = (int64_t)perm[i] * 4 + tu_int(0, 3);
  slots[10] = -1;
  slots[11] = -7;
  slots[12] = (int64_t)entries * 4 + 1;
  qsakv_cache_layout L;
  uint8_t* got = store_e4m3_keys(cpu, keys, slots, n, &L);
  assert_int_equal(L.index_key_dtype, QSAKV_DTYPE_E4M3);
  assert_int_equal(L.compressed_keys_per_block, 4);
  assert_int_equal(L.compressed_scales_offset, 4 * 128);
  assert_int_equal(L.compressed_stride_block, 4 * 128 + 4 * 4);
  assert_int_equal(L.compressed_bytes_per_layer, 40 * L.compressed_stride_block);
  uint8_t* want = malloc(L.compressed_bytes_per_layer);
  memset(want, 0xA5, L.compressed_bytes_per_layer);
  for (int i = 0; i < n; ++i) {
    if (slots[i] < 0 || slots[i] / 4 >= entries) continue;
    const int64_t e = slots[i] / 4, page = e / 4, j = e % 4;
    uint8_t* base = want + page * L.compressed_stride_block;
    float s;
    oracle_e4m3_key(keys + (size_t)i * 128, base + j * 128, &s);
    memcpy(base + L.compressed_scales_offset + 4 * j, &s, 4);
  }
  size_t bad = 0;
  for (size_t b = 0; b < L.compressed_bytes_per_layer; ++b)
    if (got[b] != want[b] && bad++ < 5)
      print_error("byte %zu (page %zu): cpu 0x%02x oracle 0x%02x\n", b,
                  b / (size_t)L.compressed_stride_block, got[b], want[b]);
  assert_int_equal(bad, 0);
  /* The rules did fire: the dead and zero keys have scale 0, the range key 65504 / 448. */
  for (int i = 0; i <= 6; ++i) {
    const int64_t e = slots[i] / 4;
    float s;
    memcpy(&s, got + (e / 4) * L.compressed_stride_block + L.compressed_scales_offset + 4 * (e % 4),
           4);
    if (i <= 4) assert_true(s == 0.0f);
    if (i == 6) assert_true(s == (float)(65504.0 / 448.0));
    if (i == 5) assert_true(s > 0.0f && s < 1e-6f);
  }
  qsakv_context* gpu = tu_cuda_context_or_null("GPU comparison of E4M3 index-key stores");
  if (gpu) {
    qsakv_cache_layout L2;
    uint8_t* g = store_e4m3_keys(gpu, keys, slots, n, &L2);
    bad = 0;
    for (size_t b = 0; b < L.compressed_bytes_per_layer; ++b)
      if (g[b] != got[b] && bad++ < 5)
        print_error("byte %zu: gpu 0x%02x cpu 0x%02x\n", b, g[b], got[b]);
    assert_int_equal(bad, 0);
    free(g);
    qsakv_context_destroy(gpu);
  }
  free(got);
  free(want);
  free(keys);
  qsakv_context_destroy(cpu);
}

/* Every FP16 value (all 65536 patterns, 512 keys of 128) through the E4M3 key store on
 * the GPU and the CPU: identical bytes. */
static void test_cuda_e4m3_index_keys_every_fp16(void** state) {
  (void)state;
  qsakv_context* gpu = tu_cuda_context_or_skip();
  qsakv_context* cpu = tu_context(QSAKV_BACKEND_CPU);
  const int n = 512;
  uint16_t* keys = malloc(2 * 65536);
  for (int i = 0; i < 65536; ++i) keys[i] = (uint16_t)(i * 40503u); /* a permutation */
  /* Keys with a non-finite element are stored dead: keep most keys finite. */
  for (int i = 0; i < 65536; ++i)
    if ((keys[i] & 0x7C00) == 0x7C00 && (i / 128) % 8 != 0) keys[i] &= 0x3FFF;
  int64_t* slots = malloc(8 * (size_t)n);
  for (int i = 0; i < n; ++i) slots[i] = (int64_t)(i % 160) * 4 + (i / 160);
  qsakv_cache_layout L;
  /* 160 entries: store 160 keys per pass, four passes. */
  size_t bad = 0;
  for (int pass = 0; pass * 160 < n; ++pass) {
    const int m = n - pass * 160 < 160 ? n - pass * 160 : 160;
    uint8_t* a = store_e4m3_keys(cpu, keys + (size_t)pass * 160 * 128, slots + pass * 160, m, &L);
    uint8_t* b = store_e4m3_keys(gpu, keys + (size_t)pass * 160 * 128, slots + pass * 160, m, &L);
    for (size_t i = 0; i < L.compressed_bytes_per_layer; ++i)
      if (a[i] != b[i] && bad++ < 5)
        print_error("pass %d byte %zu: cpu 0x%02x gpu 0x%02x\n", pass, i, a[i], b[i]);
    free(a);
    free(b);
  }
  assert_int_equal(bad, 0);
  free(keys);
  free(slots);
  qsakv_context_destroy(cpu);
  qsakv_context_destroy(gpu);
}

/* ---- qsakv_store_step --------------------------------------------------------------- */

/* A layer's three buffers, poisoned (0xA5) before a store and read back after it. */
typedef struct {
  uint8_t *kv, *ring, *comp;
} layer_bytes;

static void poison_layer(store_world* w, int layer) {
  qsakv_layer_buffers lb = {sizeof lb, QSAKV_LAYER_BUFFERS_VERSION};
  TU_OK(qsakv_cache_get_layer_buffers(w->cache, layer, &lb));
  void* const dst[3] = {lb.kv, lb.ring_keys, lb.compressed_keys};
  const uint64_t bytes[3] = {w->L.kv_bytes_per_layer, w->L.ring_bytes_per_layer,
                             w->L.compressed_bytes_per_layer};
  for (int b = 0; b < 3; ++b) {
    void* poison = tu_device_filled(w->ctx, bytes[b], 0xA5);
    TU_OK(qsakv_memcpy(w->ctx, dst[b], poison, bytes[b], QSAKV_COPY_DEVICE_TO_DEVICE, NULL));
    qsakv_free(w->ctx, poison);
  }
}

static layer_bytes read_layer(store_world* w, int layer) {
  qsakv_layer_buffers lb = {sizeof lb, QSAKV_LAYER_BUFFERS_VERSION};
  TU_OK(qsakv_cache_get_layer_buffers(w->cache, layer, &lb));
  layer_bytes out = {malloc(w->L.kv_bytes_per_layer), malloc(w->L.ring_bytes_per_layer),
                     malloc(w->L.compressed_bytes_per_layer)};
  tu_to_host(w->ctx, out.kv, lb.kv, w->L.kv_bytes_per_layer);
  tu_to_host(w->ctx, out.ring, lb.ring_keys, w->L.ring_bytes_per_layer);
  tu_to_host(w->ctx, out.comp, lb.compressed_keys, w->L.compressed_bytes_per_layer);
  return out;
}

static void free_layer(layer_bytes* b) {
  free(b->kv);
  free(b->ring);
  free(b->comp);
}

static void expect_same_layer(const store_world* w, const layer_bytes* a, const layer_bytes* b,
                              const char* what) {
  if (memcmp(a->kv, b->kv, w->L.kv_bytes_per_layer) != 0) fail_msg("%s: K/V bytes differ", what);
  if (memcmp(a->ring, b->ring, w->L.ring_bytes_per_layer) != 0)
    fail_msg("%s: ring bytes differ", what);
  if (memcmp(a->comp, b->comp, w->L.compressed_bytes_per_layer) != 0)
    fail_msg("%s: compressed-key bytes differ", what);
}

/* A cache for the step tests (scales 0.75 and 1.5 where E4M3). */
static void make_step_world(store_world* w, qsakv_context* ctx, qsakv_dtype act, qsakv_dtype kv,
                            qsakv_dtype index_keys) {
  make_world_ex(w, ctx, act, kv, index_keys, 0.75f, 1.5f, 40);
}

/* A step's host inputs: n tokens of K/V with their slots (specials, -1 slots), n index
 * keys (make_index_keys: zero, NaN, inf, subnormal keys...), ring places naming every
 * (request, pos % 4) at most once and compressed entries once each (the GPU's order among
 * duplicates is not defined). */
enum { kStepTokens = 48 };
typedef struct {
  uint16_t *k, *v, *keys;
  int64_t* slots;
  int32_t req[kStepTokens];
  int64_t pos[kStepTokens], cslots[kStepTokens];
} step_inputs;

static void make_step_inputs(step_inputs* in, qsakv_dtype act) {
  make_inputs(kStepTokens, 40 * 16, act, &in->k, &in->v, &in->slots);
  in->keys = malloc(2 * (size_t)kStepTokens * 128);
  make_index_keys(in->keys, kStepTokens);
  for (int i = 0; i < kStepTokens; ++i) {
    in->req[i] = i % 8;
    in->pos[i] = i < 32 ? 200 + i / 8 : -1;
    in->cslots[i] = i == 11 ? -1 : (int64_t)(i * 4 + tu_int(0, 3)); /* entry i, any token */
  }
}

static void free_step_inputs(step_inputs* in) {
  free(in->k);
  free(in->v);
  free(in->keys);
  free(in->slots);
}

/* qsakv_store_step against the three calls it stands for: the same bytes in all three
 * buffers of the layer (poisoned first), with every part and with parts left out (whose
 * buffers keep the poison). Returns the bytes of the step with every part. */
static layer_bytes check_step_stores(qsakv_context* ctx, qsakv_dtype act, qsakv_dtype kv,
                                     qsakv_dtype index_keys, const step_inputs* in) {
  const int n = kStepTokens, layer = 7;
  const size_t kv_bytes = (size_t)n * 2 * 128 * 2;
  void* dk = tu_to_device(ctx, in->k, kv_bytes);
  void* dv = tu_to_device(ctx, in->v, kv_bytes);
  void* ds = tu_to_device(ctx, in->slots, 8 * (size_t)n);
  void* dkeys = tu_to_device(ctx, in->keys, 2 * (size_t)n * 128);
  void* dreq = tu_to_device(ctx, in->req, sizeof in->req);
  void* dpos = tu_to_device(ctx, in->pos, sizeof in->pos);
  void* dcs = tu_to_device(ctx, in->cslots, sizeof in->cslots);
  layer_bytes all = {NULL, NULL, NULL};
  for (int parts = 1; parts < 8; ++parts) { /* bit 0: K/V, 1: ring, 2: compressed */
    store_world calls, step;
    make_step_world(&calls, ctx, act, kv, index_keys);
    make_step_world(&step, ctx, act, kv, index_keys);
    poison_layer(&calls, layer);
    poison_layer(&step, layer);
    if (parts & 1) TU_OK(qsakv_store_kv(calls.cache, layer, dk, dv, ds, n, NULL));
    if (parts & 2) TU_OK(qsakv_store_index_keys(calls.cache, layer, dkeys, dreq, dpos, n, NULL));
    if (parts & 4) TU_OK(qsakv_store_compressed_keys(calls.cache, layer, dkeys, dcs, n, NULL));
    qsakv_step_stores st = QSAKV_STEP_STORES_INIT;
    if (parts & 1) {
      st.k = dk;
      st.v = dv;
      st.kv_slot_mapping = ds;
      st.num_tokens = n;
    }
    if (parts & 2) {
      st.index_keys = dkeys;
      st.index_request_slots = dreq;
      st.index_positions = dpos;
      st.num_index_keys = n;
    }
    if (parts & 4) {
      st.compressed_keys = dkeys;
      st.compressed_slot_mapping = dcs;
      st.num_compressed_keys = n;
    }
    TU_OK(qsakv_store_step(step.cache, layer, &st, NULL));
    layer_bytes a = read_layer(&calls, layer), b = read_layer(&step, layer);
    char what[64];
    snprintf(what, sizeof what, "store_step (parts %d) vs the calls", parts);
    expect_same_layer(&calls, &a, &b, what);
    if (parts == 7)
      all = a;
    else
      free_layer(&a);
    free_layer(&b);
    free_world(&calls);
    free_world(&step);
  }
  qsakv_free(ctx, dk);
  qsakv_free(ctx, dv);
  qsakv_free(ctx, ds);
  qsakv_free(ctx, dkeys);
  qsakv_free(ctx, dreq);
  qsakv_free(ctx, dpos);
  qsakv_free(ctx, dcs);
  return all;
}

/* On the CPU backend, and on a GPU against the CPU's bytes: E4M3 K/V from FP16 with E4M3
 * index keys, E4M3 from BF16 with FP16 keys, FP16 with FP16 keys. */
static void test_store_step(void** state) {
  (void)state;
  const qsakv_dtype kinds[3][3] = {{QSAKV_DTYPE_FP16, QSAKV_DTYPE_E4M3, QSAKV_DTYPE_E4M3},
                                   {QSAKV_DTYPE_BF16, QSAKV_DTYPE_E4M3, QSAKV_DTYPE_FP16},
                                   {QSAKV_DTYPE_FP16, QSAKV_DTYPE_FP16, QSAKV_DTYPE_FP16}};
  qsakv_context* cpu = tu_context(QSAKV_BACKEND_CPU);
  qsakv_context* gpu = tu_cuda_context_or_null("store_step on a GPU");
  for (int i = 0; i < 3; ++i) {
    step_inputs in;
    make_step_inputs(&in, kinds[i][0]);
    layer_bytes on_cpu = check_step_stores(cpu, kinds[i][0], kinds[i][1], kinds[i][2], &in);
    if (gpu) {
      layer_bytes on_gpu = check_step_stores(gpu, kinds[i][0], kinds[i][1], kinds[i][2], &in);
      store_world w;
      make_step_world(&w, cpu, kinds[i][0], kinds[i][1], kinds[i][2]);
      expect_same_layer(&w, &on_cpu, &on_gpu, "store_step, cuda vs cpu");
      free_world(&w);
      free_layer(&on_gpu);
    }
    free_layer(&on_cpu);
    free_step_inputs(&in);
  }
  print_message("store_step: the three calls' bytes, every combination of parts, %s\n",
                gpu ? "CPU and CUDA" : "CPU");
  if (gpu) qsakv_context_destroy(gpu);
  qsakv_context_destroy(cpu);
}

/* On a GPU, parts larger than one pass of their grid (the compressed keys' grid holds 8
 * CTAs per SM of 8 warps, a key a warp; the ring's 8 CTAs per SM of 256 threads, 16 per
 * row): 9,000 compressed keys and 20,000 ring rows (all but 32 skipped, so that no ring
 * entry has two writers) beside 64 tokens of K/V, against the separate calls. */
static void test_cuda_store_step_strides(void** state) {
  (void)state;
  qsakv_context* gpu = tu_cuda_context_or_skip();
  const int nk = 9000, nr = 20000, nt = 64, layer = 7;
  const int64_t num_blocks = (nk * 4 + 15) / 16; /* an entry per compressed key */
  uint16_t *k, *v;
  int64_t* slots;
  make_inputs(nt, (int)num_blocks * 16, QSAKV_DTYPE_FP16, &k, &v, &slots);
  uint16_t* keys = malloc(2 * (size_t)nr * 128);
  make_index_keys(keys, nr);
  int64_t* cslots = malloc(sizeof(int64_t) * (size_t)nk);
  int64_t* pos = malloc(sizeof(int64_t) * (size_t)nr);
  int32_t* req = malloc(sizeof(int32_t) * (size_t)nr);
  for (int i = 0; i < nk; ++i) cslots[i] = i == 17 ? -1 : (int64_t)i * 4 + tu_int(0, 3);
  for (int i = 0; i < nr; ++i) {
    req[i] = i % 8;
    pos[i] = i >= nr - 32 ? 500 + (nr - 1 - i) / 8 : -1; /* the last 32 rows, once each */
  }
  void* dk = tu_to_device(gpu, k, (size_t)nt * 2 * 128 * 2);
  void* dv = tu_to_device(gpu, v, (size_t)nt * 2 * 128 * 2);
  void* ds = tu_to_device(gpu, slots, 8 * (size_t)nt);
  void* dkeys = tu_to_device(gpu, keys, 2 * (size_t)nr * 128);
  void* dcs = tu_to_device(gpu, cslots, 8 * (size_t)nk);
  void* dpos = tu_to_device(gpu, pos, 8 * (size_t)nr);
  void* dreq = tu_to_device(gpu, req, 4 * (size_t)nr);
  store_world calls, step;
  make_world_ex(&calls, gpu, QSAKV_DTYPE_FP16, QSAKV_DTYPE_E4M3, QSAKV_DTYPE_E4M3, 0.5f, 2.0f,
                num_blocks);
  make_world_ex(&step, gpu, QSAKV_DTYPE_FP16, QSAKV_DTYPE_E4M3, QSAKV_DTYPE_E4M3, 0.5f, 2.0f,
                num_blocks);
  poison_layer(&calls, layer);
  poison_layer(&step, layer);
  TU_OK(qsakv_store_kv(calls.cache, layer, dk, dv, ds, nt, NULL));
  TU_OK(qsakv_store_index_keys(calls.cache, layer, dkeys, dreq, dpos, nr, NULL));
  TU_OK(qsakv_store_compressed_keys(calls.cache, layer, dkeys, dcs, nk, NULL));
  qsakv_step_stores st = QSAKV_STEP_STORES_INIT;
  st.k = dk;
  st.v = dv;
  st.kv_slot_mapping = ds;
  st.num_tokens = nt;
  st.index_keys = dkeys;
  st.index_request_slots = dreq;
  st.index_positions = dpos;
  st.num_index_keys = nr;
  st.compressed_keys = dkeys;
  st.compressed_slot_mapping = dcs;
  st.num_compressed_keys = nk;
  TU_OK(qsakv_store_step(step.cache, layer, &st, NULL));
  layer_bytes a = read_layer(&calls, layer), b = read_layer(&step, layer);
  expect_same_layer(&calls, &a, &b, "store_step with strided parts vs the calls");
  print_message("cuda: store_step of %d compressed keys, %d ring rows, %d tokens = the calls\n", nk,
                nr, nt);
  free_layer(&a);
  free_layer(&b);
  free_world(&calls);
  free_world(&step);
  void* dev[7] = {dk, dv, ds, dkeys, dcs, dpos, dreq};
  for (int i = 0; i < 7; ++i) qsakv_free(gpu, dev[i]);
  free(k);
  free(v);
  free(slots);
  free(keys);
  free(cslots);
  free(pos);
  free(req);
  qsakv_context_destroy(gpu);
}

/* qsakv_store_step refuses a bad struct or part before storing anything: the K/V part of
 * a call whose ring part is bad leaves the cache as it was. */
static void test_store_step_errors(void** state) {
  (void)state;
  qsakv_context* ctx = tu_context(QSAKV_BACKEND_CPU);
  store_world w;
  make_step_world(&w, ctx, QSAKV_DTYPE_FP16, QSAKV_DTYPE_FP16, QSAKV_DTYPE_FP16);
  uint16_t k[256], keys[128];
  for (int i = 0; i < 256; ++i) k[i] = 0x3C00;
  for (int i = 0; i < 128; ++i) keys[i] = 0x3C00;
  int64_t s[1] = {0};
  int32_t r[1] = {0};
  TU_EXPECT_STATUS(qsakv_store_step(w.cache, 7, NULL, NULL), QSAKV_ERROR_INVALID_ARGUMENT);
  qsakv_step_stores st = QSAKV_STEP_STORES_INIT;
  st.version = 0;
  TU_EXPECT_STATUS(qsakv_store_step(w.cache, 7, &st, NULL), QSAKV_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(qsakv_last_error(), "stores.version"));
  st = (qsakv_step_stores)QSAKV_STEP_STORES_INIT;
  st.struct_size = 4;
  TU_EXPECT_STATUS(qsakv_store_step(w.cache, 7, &st, NULL), QSAKV_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(qsakv_last_error(), "stores.struct_size"));
  st = (qsakv_step_stores)QSAKV_STEP_STORES_INIT;
  TU_OK(qsakv_store_step(w.cache, 7, &st, NULL)); /* every part empty: nothing to do */
  TU_EXPECT_STATUS(qsakv_store_step(w.cache, 4, &st, NULL), QSAKV_ERROR_INVALID_ARGUMENT);
  poison_layer(&w, 7);
  st.k = k;
  st.v = k;
  st.kv_slot_mapping = s;
  st.num_tokens = 1;
  st.index_keys = keys;
  st.index_request_slots = r;
  st.num_index_keys = 1; /* index_positions left NULL */
  TU_EXPECT_STATUS(qsakv_store_step(w.cache, 7, &st, NULL), QSAKV_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(qsakv_last_error(), "stores.index_positions"));
  st.num_index_keys = -1;
  TU_EXPECT_STATUS(qsakv_store_step(w.cache, 7, &st, NULL), QSAKV_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(qsakv_last_error(), "stores.num_index_keys"));
  layer_bytes after = read_layer(&w, 7);
  for (uint64_t i = 0; i < w.L.kv_bytes_per_layer; ++i)
    if (after.kv[i] != 0xA5)
      fail_msg("a refused store_step wrote K/V byte %llu", (unsigned long long)i);
  free_layer(&after);
  free_world(&w);
  qsakv_context_destroy(ctx);
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
      cmocka_unit_test(test_e4m3_index_key_store),
      cmocka_unit_test(test_cuda_e4m3_index_keys_every_fp16),
      cmocka_unit_test(test_store_errors),
      cmocka_unit_test(test_store_step),
      cmocka_unit_test(test_cuda_store_step_strides),
      cmocka_unit_test(test_store_step_errors),
  };
  tu_apply_filter();
  return cmocka_run_group_tests_name("store", tests, NULL, NULL);
}
