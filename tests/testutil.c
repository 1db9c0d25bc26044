// SPDX-License-Identifier: Apache-2.0
#define _GNU_SOURCE
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static uint64_t g_state;
static int g_seeded;

uint64_t tu_seed(void) {
  if (!g_seeded) {
    const char* env = getenv("QSAKV_TEST_SEED");
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    g_state =
        env ? strtoull(env, NULL, 0) : ((uint64_t)ts.tv_sec * 1000000007ull) ^ (uint64_t)ts.tv_nsec;
    g_seeded = 1;
    fprintf(stderr, "[ seed     ] QSAKV_TEST_SEED=%llu\n", (unsigned long long)g_state);
  }
  return g_state;
}

uint64_t tu_next(void) { /* splitmix64 */
  tu_seed();
  uint64_t z = (g_state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double tu_uniform(double lo, double hi) {
  return lo + (hi - lo) * ((double)(tu_next() >> 11) * (1.0 / 9007199254740992.0));
}

double tu_normal(void) {
  double u1 = tu_uniform(1e-12, 1.0), u2 = tu_uniform(0.0, 1.0);
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

int tu_int(int lo, int hi) { return lo + (int)(tu_next() % (uint64_t)(hi - lo + 1)); }

uint16_t tu_f32_to_fp16(float x) {
  _Float16 h = (_Float16)x;
  uint16_t u;
  memcpy(&u, &h, 2);
  return u;
}

float tu_fp16_to_f32(uint16_t u) {
  _Float16 h;
  memcpy(&h, &u, 2);
  return (float)h;
}

uint16_t tu_f32_to_bf16(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  if (isnan(x)) return (uint16_t)((u >> 16) | 0x40);
  /* round to nearest even on the upper half */
  uint32_t lower = u & 0xFFFF, upper = u >> 16;
  if (lower > 0x8000 || (lower == 0x8000 && (upper & 1))) upper += 1;
  return (uint16_t)upper;
}

float tu_bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float x;
  memcpy(&x, &u, 4);
  return x;
}

float tu_act_to_f32(uint16_t h, qsakv_dtype act) {
  return act == QSAKV_DTYPE_BF16 ? tu_bf16_to_f32(h) : tu_fp16_to_f32(h);
}

uint16_t tu_f32_to_act(float x, qsakv_dtype act) {
  return act == QSAKV_DTYPE_BF16 ? tu_f32_to_bf16(x) : tu_f32_to_fp16(x);
}

double tu_e4m3_value(uint8_t code) {
  const int s = code >> 7, e = (code >> 3) & 15, m = code & 7;
  double v;
  if (e == 15 && m == 7) return NAN;
  if (e == 0)
    v = ldexp((double)m / 8.0, -6);
  else
    v = ldexp(1.0 + (double)m / 8.0, e - 7);
  return s ? -v : v;
}

uint8_t tu_e4m3_encode(float qf) {
  double q = (double)qf;
  if (isnan(q)) return signbit(q) ? 0xFF : 0x7F;
  const uint8_t sign = signbit(q) ? 0x80 : 0;
  double a = fabs(q);
  if (a > 448.0) a = 448.0;
  /* nearest of the 127 non-negative finite codes; ties go to the even code */
  int best = 0;
  double best_d = INFINITY;
  for (int c = 0; c <= 0x7E; ++c) {
    double d = fabs(tu_e4m3_value((uint8_t)c) - a);
    if (d < best_d || (d == best_d && (c & 1) == 0)) {
      best = c;
      best_d = d;
    }
  }
  return (uint8_t)(sign | best);
}

qsakv_context* tu_context(qsakv_backend backend) {
  qsakv_context_options o;
  qsakv_context_options_init(&o);
  o.backend = backend;
  qsakv_context* ctx = NULL;
  if (qsakv_context_create(&ctx, &o) != QSAKV_SUCCESS) return NULL;
  return ctx;
}

char* tu_env_save(const char* name) {
  const char* v = getenv(name);
  return v ? strdup(v) : NULL;
}

void tu_env_restore(const char* name, char* saved) {
  if (saved) {
    setenv(name, saved, 1);
    free(saved);
  } else {
    unsetenv(name);
  }
}

int tu_gpu_required(void) {
  const char* v = getenv("QSAKV_REQUIRE_GPU");
  return v && strcmp(v, "1") == 0;
}

int tu_cuda_absent_skips(qsakv_status status) {
  return status == QSAKV_ERROR_NO_DEVICE && !tu_gpu_required();
}

void tu_skip_or_fail_without_gpu(qsakv_status status, const char* what) {
  if (tu_cuda_absent_skips(status)) {
    fprintf(stderr, "[ SKIP     ] %s: no usable GPU: %s\n", what, qsakv_last_error());
    skip();
  }
  print_error(
      "%s: a CUDA context was refused with %s (%s)%s\n", what, qsakv_status_string(status),
      qsakv_last_error(),
      status == QSAKV_ERROR_NO_DEVICE ? ", and QSAKV_REQUIRE_GPU=1 says there is a GPU" : "");
  fail();
}

qsakv_context* tu_cuda_context_or_skip(void) {
  qsakv_context_options o;
  qsakv_context_options_init(&o);
  o.backend = QSAKV_BACKEND_CUDA;
  qsakv_context* ctx = NULL;
  const qsakv_status s = qsakv_context_create(&ctx, &o);
  if (s != QSAKV_SUCCESS) tu_skip_or_fail_without_gpu(s, "CUDA case");
  /* Once per suite: which kernel tier the CUDA cases ran on (QSAKV_CUDA_TIER=sm70 forces
   * the V100 tier on any GPU), so a forced run's log shows that it was forced. */
  static int tier_printed = 0;
  if (!tier_printed) {
    qsakv_context_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    if (qsakv_context_get_info(ctx, &info) == QSAKV_SUCCESS) {
      const char* forced = getenv("QSAKV_CUDA_TIER");
      printf("[ INFO     ] cuda kernel tier: %s on SM %d%s%s\n",
             info.kernel_tier == QSAKV_KERNEL_TIER_SM70 ? "sm70" : "sm75", info.sm_version,
             forced && *forced ? ", QSAKV_CUDA_TIER=" : "", forced && *forced ? forced : "");
      tier_printed = 1;
    }
  }
  return ctx;
}

qsakv_context* tu_cuda_context_or_null(const char* what) {
  qsakv_context_options o;
  qsakv_context_options_init(&o);
  o.backend = QSAKV_BACKEND_CUDA;
  qsakv_context* ctx = NULL;
  const qsakv_status s = qsakv_context_create(&ctx, &o);
  if (s == QSAKV_SUCCESS) return ctx;
  if (tu_cuda_absent_skips(s)) {
    print_message("[ SKIP part] %s: no usable GPU: %s\n", what, qsakv_last_error());
    return NULL;
  }
  tu_skip_or_fail_without_gpu(s, what); /* fails */
  return NULL;
}

int tu_has_grouped_route(qsakv_context* ctx) {
  qsakv_context_info info;
  memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  TU_OK(qsakv_context_get_info(ctx, &info));
  return info.backend == QSAKV_BACKEND_CUDA && info.kernel_tier != QSAKV_KERNEL_TIER_SM70;
}

int tu_is_cuda(qsakv_context* ctx) {
  qsakv_context_info info = {sizeof info, QSAKV_CONTEXT_INFO_VERSION};
  if (qsakv_context_get_info(ctx, &info) != QSAKV_SUCCESS) return 0;
  return info.backend == QSAKV_BACKEND_CUDA;
}

void* tu_to_device(qsakv_context* ctx, const void* host, size_t bytes) {
  void* d = NULL;
  TU_OK(qsakv_malloc(ctx, &d, bytes ? bytes : 1));
  if (bytes) TU_OK(qsakv_memcpy(ctx, d, host, bytes, QSAKV_COPY_HOST_TO_DEVICE, NULL));
  TU_OK(qsakv_stream_synchronize(ctx, NULL));
  return d;
}

void tu_to_host(qsakv_context* ctx, void* host, const void* dev, size_t bytes) {
  if (bytes) TU_OK(qsakv_memcpy(ctx, host, dev, bytes, QSAKV_COPY_DEVICE_TO_HOST, NULL));
  TU_OK(qsakv_stream_synchronize(ctx, NULL));
}

void* tu_device_filled(qsakv_context* ctx, size_t bytes, uint8_t byte) {
  void* h = malloc(bytes ? bytes : 1);
  memset(h, byte, bytes);
  void* d = tu_to_device(ctx, h, bytes);
  free(h);
  return d;
}

static void write_file(const char* path, const char* text) {
  FILE* f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

qsakv_overlay_info tu_overlay_info(const qsakv_overlay* overlay) {
  qsakv_overlay_info info = {sizeof info, QSAKV_OVERLAY_INFO_VERSION};
  TU_OK(qsakv_overlay_get_info(overlay, &info));
  return info;
}

qsakv_overlay* tu_make_overlay(const qsakv_model_config* c, const float* k, const float* v) {
  char base[] = "/tmp/qsakv-test-XXXXXX";
  assert_non_null(mkdtemp(base));
  char index[512], out[512];
  snprintf(index, sizeof index, "%s/model.safetensors.index.json", base);
  write_file(index,
             "{\"metadata\": {\"total_size\": 4}, \"weight_map\": "
             "{\"model.embed_tokens.weight\": \"model-00001.safetensors\"}}\n");
  snprintf(out, sizeof out, "%s/overlay", base);
  qsakv_overlay_write_options wo;
  TU_OK(qsakv_overlay_write_options_init(&wo));
  wo.base_index_path = index;
  TU_OK(qsakv_overlay_write(out, c->qsa_layers, k, v, c->num_qsa_layers, &wo));
  char scale_file[600];
  snprintf(scale_file, sizeof scale_file, "%s/model-kvscales.safetensors", out);
  qsakv_overlay* ov = NULL;
  TU_OK(qsakv_overlay_load(&ov, scale_file, NULL));
  const qsakv_overlay_info info = tu_overlay_info(ov);
  char revision[65];
  TU_OK(qsakv_checkpoint_revision(index, revision)); /* the checkpoint's own revision */
  assert_string_equal(revision, info.base_index_sha256);
  TU_OK(qsakv_overlay_validate(ov, c, revision));
  /* The overlay is in memory now: remove the files (no subdirectories but `out`). */
  const char* names[] = {"overlay/model-kvscales.safetensors", "overlay/qsakv-overlay.json",
                         "overlay", "model.safetensors.index.json"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; ++i) {
    char p[700];
    snprintf(p, sizeof p, "%s/%s", base, names[i]);
    if (remove(p) != 0) fprintf(stderr, "could not remove %s\n", p);
  }
  if (rmdir(base) != 0) fprintf(stderr, "could not remove %s\n", base);
  return ov;
}

void tu_small_config(qsakv_model_config* c, int num_q_heads, int num_kv_heads, int head_dim,
                     qsakv_dtype act, qsakv_dtype kv, int block_size) {
  TU_OK(qsakv_model_config_preset(c, "qwen4_exp"));
  c->num_layers = 8;
  c->num_qsa_layers = 2;
  c->qsa_layers[0] = 3;
  c->qsa_layers[1] = 7;
  c->num_q_heads = num_q_heads;
  c->num_kv_heads = num_kv_heads;
  c->head_dim = head_dim;
  c->activation_dtype = act;
  c->kv_dtype = kv;
  c->block_size = block_size;
  c->max_requests = 64;
  c->max_batched_tokens = 256;
  c->max_model_len = 1 << 16;
}

double tu_rel_l2(const double* ref, const double* got, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    double d = got[i] - ref[i];
    num += d * d;
    den += ref[i] * ref[i];
  }
  if (isnan(num)) return INFINITY;
  return den > 0 ? sqrt(num / den) : sqrt(num);
}

void tu_apply_filter(void) {
  const char* f = getenv("QSAKV_TEST_FILTER");
  if (f && *f) cmocka_set_test_filter(f);
}

void tu_field_map_start(tu_field_map* map, size_t size, size_t align) {
  assert_true(size <= TU_FIELD_MAP_MAX);
  memset(map, 0, sizeof *map);
  map->size = size;
  map->align = align;
}

void tu_same_field(tu_field_map* map, const char* name, const void* want_base,
                   const void* want_field, const void* got_field, size_t bytes, size_t align) {
  const size_t offset = (size_t)((const char*)want_field - (const char*)want_base);
  assert_true(offset + bytes <= map->size);
  if (memcmp(want_field, got_field, bytes) != 0)
    fail_msg("field %s (%zu bytes at offset %zu) differs", name, bytes, offset);
  memset(map->covered + offset, 1, bytes);
  map->align_at[offset] = (unsigned char)align;
}

void tu_all_fields_compared(const tu_field_map* map, const char* type) {
  size_t hole = 0;
  for (size_t b = 0; b <= map->size; ++b) {
    if (b < map->size && !map->covered[b]) {
      ++hole;
      continue;
    }
    /* b starts a field (or is the end): the hole before it can be padding only when it is
     * smaller than that field's (the struct's) alignment. */
    const size_t align = b < map->size ? map->align_at[b] : map->align;
    if (hole > 0 && hole >= align)
      fail_msg("%s: bytes %zu..%zu belong to a field that was not compared", type, b - hole, b - 1);
    hole = 0;
  }
}

void tu_expect_same_model_config(const qsakv_model_config* want, const qsakv_model_config* got) {
  tu_field_map map;
  TU_FIELDS_OF(map, *want);
  TU_SAME_FIELD(map, *want, *got, struct_size);
  TU_SAME_FIELD(map, *want, *got, version);
  TU_SAME_FIELD(map, *want, *got, num_layers);
  TU_SAME_FIELD(map, *want, *got, num_qsa_layers);
  TU_SAME_FIELD(map, *want, *got, qsa_layers);
  TU_SAME_FIELD(map, *want, *got, num_q_heads);
  TU_SAME_FIELD(map, *want, *got, num_kv_heads);
  TU_SAME_FIELD(map, *want, *got, head_dim);
  TU_SAME_FIELD(map, *want, *got, softmax_scale);
  TU_SAME_FIELD(map, *want, *got, index_num_heads);
  TU_SAME_FIELD(map, *want, *got, index_head_dim);
  TU_SAME_FIELD(map, *want, *got, compress_ratio);
  TU_SAME_FIELD(map, *want, *got, topk_tokens);
  TU_SAME_FIELD(map, *want, *got, tp_size);
  TU_SAME_FIELD(map, *want, *got, tp_rank);
  TU_SAME_FIELD(map, *want, *got, speculative_tokens);
  TU_SAME_FIELD(map, *want, *got, activation_dtype);
  TU_SAME_FIELD(map, *want, *got, kv_dtype);
  TU_SAME_FIELD(map, *want, *got, block_size);
  TU_SAME_FIELD(map, *want, *got, max_requests);
  TU_SAME_FIELD(map, *want, *got, max_batched_tokens);
  TU_SAME_FIELD(map, *want, *got, max_model_len);
  TU_SAME_FIELD(map, *want, *got, index_key_dtype);
  tu_all_fields_compared(&map, "qsakv_model_config");
}
