// SPDX-License-Identifier: Apache-2.0
/* Calibration: statistics against an independent FP64 reference (random data with
 * planted maxima, NaN, inf, zeros, subnormals), start/stop, the scale rounding rule at
 * FP32 boundaries, merge/envelope algebra, every refusal, the statistics file, and an
 * end-to-end run (observe -> save -> load -> merge of 2 ranks -> overlay -> materialised
 * checkpoint -> validated overlay -> E4M3 cache). CUDA tests compare the GPU's
 * statistics bit for bit with the CPU backend's, and skip without a GPU. */
#define _GNU_SOURCE
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "testutil.h"

#define BINS QSAKV_CALIB_BINS
#define MSG_HAS(text)                                                      \
  do {                                                                     \
    if (!strstr(qsakv_last_error(), (text)))                               \
      fail_msg("message \"%s\" lacks \"%s\"", qsakv_last_error(), (text)); \
  } while (0)

/* ---- independent reference ---------------------------------------------------- */

typedef struct ref_stats {
  uint64_t count, finite, nonzero;
  double max_abs;
  uint64_t hist[BINS];
} ref_stats;

static int ref_bin(double a) {
  double f = floor((log2(a) + 24.0) * 4096.0 / 40.0);
  if (f < 0) f = 0;
  if (f > BINS - 1) f = BINS - 1;
  return (int)f;
}

static void ref_add(ref_stats* r, const uint16_t* x, size_t n, qsakv_dtype act) {
  for (size_t i = 0; i < n; ++i) {
    const double v = tu_act_to_f32(x[i], act);
    r->count++;
    if (!isfinite(v)) continue;
    r->finite++;
    if (v == 0.0) continue;
    r->nonzero++;
    r->hist[ref_bin(fabs(v))]++;
    if (fabs(v) > r->max_abs) r->max_abs = fabs(v);
  }
}

static void expect_stats_equal(const qsakv_calib* c, int layer, qsakv_calib_kind kind,
                               const ref_stats* r) {
  qsakv_calib_stats s;
  memset(&s, 0, sizeof s);
  s.struct_size = sizeof s;
  static uint64_t hist[BINS];
  TU_OK(qsakv_calib_get_stats(c, layer, kind, &s, hist));
  assert_int_equal(s.count, r->count);
  assert_int_equal(s.finite_count, r->finite);
  assert_int_equal(s.nonzero_count, r->nonzero);
  assert_true((double)s.max_abs == r->max_abs);
  for (int b = 0; b < BINS; ++b)
    if (hist[b] != r->hist[b])
      fail_msg("layer %d kind %d bin %d: %llu, reference %llu", layer, kind, b,
               (unsigned long long)hist[b], (unsigned long long)r->hist[b]);
}

/* ---- data and handles ---------------------------------------------------------- */

/* 2 QSA layers (3, 7), kv_heads / tp per rank, head_dim 64. */
static void calib_config(qsakv_model_config* c, qsakv_dtype act, int tp, int rank) {
  tu_small_config(c, 8, 2, 64, act, QSAKV_DTYPE_E4M3, 16);
  c->tp_size = tp;
  c->tp_rank = rank;
}

static size_t row_elems(const qsakv_model_config* c) {
  const int kvh = c->num_kv_heads / c->tp_size > 0 ? c->num_kv_heads / c->tp_size : 1;
  return (size_t)kvh * (size_t)c->head_dim;
}

/* Random activations around `scale` with one planted maximum `peak` (sign random),
 * zeros, and optionally NaN / inf and very small values. */
static uint16_t* make_data(size_t n, qsakv_dtype act, double scale, double peak, int specials) {
  uint16_t* x = malloc(n * sizeof *x);
  for (size_t i = 0; i < n; ++i) {
    const double u = tu_uniform(0, 1);
    double v = tu_normal() * scale;
    if (u < 0.03)
      v = 0.0;
    else if (u < 0.06)
      v = tu_normal() * scale * 1e-6; /* deep into small bins */
    x[i] = tu_f32_to_act((float)v, act);
  }
  const int peak_at = tu_int(0, (int)n - 1);
  x[peak_at] = tu_f32_to_act((float)(tu_int(0, 1) ? peak : -peak), act);
  if (specials) {
    /* Two specials at two other places, so that exactly two values are non-finite and
     * the peak stays (drawn at random, they could land on one place: a 1-in-n flake). */
    int nan_at, inf_at;
    do nan_at = tu_int(0, (int)n - 1);
    while (nan_at == peak_at);
    do inf_at = tu_int(0, (int)n - 1);
    while (inf_at == peak_at || inf_at == nan_at);
    x[nan_at] = act == QSAKV_DTYPE_FP16 ? 0x7E00 : 0x7FC0; /* NaN */
    x[inf_at] = act == QSAKV_DTYPE_FP16 ? 0xFC00 : 0xFF80; /* -inf */
  }
  return x;
}

static qsakv_calib* live(qsakv_context* ctx, const qsakv_model_config* c) {
  qsakv_calib* h = NULL;
  TU_OK(qsakv_calib_create(&h, ctx, c));
  return h;
}

static qsakv_calib* snapshot(const qsakv_calib* h) {
  qsakv_calib* s = NULL;
  TU_OK(qsakv_calib_snapshot(&s, h, NULL));
  return s;
}

/* Observes x (tokens rows) as K and y as V of `layer`, copying to the device first. */
static void observe(qsakv_context* ctx, qsakv_calib* h, int layer, const uint16_t* k,
                    const uint16_t* v, size_t tokens, size_t row) {
  const size_t bytes = tokens * row * 2;
  void* dk = tu_to_device(ctx, k, bytes);
  void* dv = tu_to_device(ctx, v, bytes);
  TU_OK(qsakv_calib_observe(h, layer, dk, dv, (int64_t)tokens, NULL));
  TU_OK(qsakv_stream_synchronize(ctx, NULL));
  qsakv_free(ctx, dk);
  qsakv_free(ctx, dv);
}

/* Fills a handle's two layers with data; the reference collects the same values. */
static void fill(qsakv_context* ctx, qsakv_calib* h, const qsakv_model_config* c,
                 ref_stats refs[2][2], double peak, int specials) {
  const size_t row = row_elems(c);
  for (int li = 0; li < 2; ++li) {
    const int layer = c->qsa_layers[li];
    for (int call = 0; call < 3; ++call) { /* several calls accumulate */
      const size_t tokens = (size_t)tu_int(1, 40);
      uint16_t* k = make_data(tokens * row, c->activation_dtype, 2.0, peak * (li + 1), specials);
      uint16_t* v = make_data(tokens * row, c->activation_dtype, 0.5, peak * 0.25, specials);
      observe(ctx, h, layer, k, v, tokens, row);
      if (refs) {
        ref_add(&refs[li][0], k, tokens * row, c->activation_dtype);
        ref_add(&refs[li][1], v, tokens * row, c->activation_dtype);
      }
      free(k);
      free(v);
    }
  }
}

static void check_against_reference(qsakv_context* ctx, qsakv_dtype act) {
  qsakv_model_config c;
  calib_config(&c, act, 1, 0);
  qsakv_calib* h = live(ctx, &c);
  TU_OK(qsakv_calib_start(h));
  static ref_stats refs[2][2];
  memset(refs, 0, sizeof refs);
  fill(ctx, h, &c, refs, act == QSAKV_DTYPE_FP16 ? 60000.0 : 3.0e6, 1);
  qsakv_calib* s = snapshot(h);
  for (int li = 0; li < 2; ++li)
    for (int kind = 0; kind < 2; ++kind)
      expect_stats_equal(s, c.qsa_layers[li], (qsakv_calib_kind)kind, &refs[li][kind]);
  /* A live handle's numbers are on the device: reading them needs a snapshot. */
  qsakv_calib_stats st = {sizeof st, QSAKV_CALIB_STATS_VERSION, 0, 0, 0, 0};
  TU_EXPECT_STATUS(qsakv_calib_get_stats(h, 3, QSAKV_CALIB_K, &st, NULL), QSAKV_ERROR_STATE);
  MSG_HAS("qsakv_calib_snapshot");
  qsakv_calib_destroy(s);
  qsakv_calib_destroy(h);
}

static void test_stats_fp16_cpu(void** state) {
  (void)state;
  qsakv_context* ctx = tu_context(QSAKV_BACKEND_CPU);
  check_against_reference(ctx, QSAKV_DTYPE_FP16);
  qsakv_context_destroy(ctx);
}

static void test_stats_bf16_cpu(void** state) {
  (void)state;
  qsakv_context* ctx = tu_context(QSAKV_BACKEND_CPU);
  check_against_reference(ctx, QSAKV_DTYPE_BF16); /* peaks above 2^16 clamp to the top bin */
  qsakv_context_destroy(ctx);
}

/* Every FP16 bit pattern once: the bin table against the reference formula, all 65536. */
static void test_every_fp16_pattern(void** state) {
  (void)state;
  qsakv_context* ctx = tu_context(QSAKV_BACKEND_CPU);
  qsakv_model_config c;
  tu_small_config(&c, 1, 1, 64, QSAKV_DTYPE_FP16, QSAKV_DTYPE_FP16, 16);
  qsakv_calib* h = live(ctx, &c);
  TU_OK(qsakv_calib_start(h));
  uint16_t* x = malloc(65536 * 2);
  for (uint32_t i = 0; i < 65536; ++i) x[i] = (uint16_t)i;
  static ref_stats r;
  memset(&r, 0, sizeof r);
  ref_add(&r, x, 65536, QSAKV_DTYPE_FP16);
  observe(ctx, h, 3, x, x, 65536 / 64, 64);
  qsakv_calib* s = snapshot(h);
  expect_stats_equal(s, 3, QSAKV_CALIB_V, &r);
  assert_int_equal(r.count - r.finite, 2 * 1024); /* +-inf and the NaNs */
  free(x);
  qsakv_calib_destroy(s);
  qsakv_calib_destroy(h);
  qsakv_context_destroy(ctx);
}

/* ---- the rounding rule ----------------------------------------------------------- */

static void check_scale(float m) {
  float s = 0;
  TU_OK(qsakv_calib_scale_from_max(m, &s));
  /* Definition: the smallest FP32 s with s >= m / 448 in exact arithmetic. float x 448
   * is exact in double (24 + 3 bits), so these comparisons are exact. */
  if (!((double)s * 448.0 >= (double)m))
    fail_msg("max %a: scale %a gives 448*s < max", (double)m, (double)s);
  const float below = nextafterf(s, 0.0f);
  if (!((double)below * 448.0 < (double)m))
    fail_msg("max %a: scale %a is not the smallest (%a also covers it)", (double)m, (double)s,
             (double)below);
  /* Consequences in FP32 arithmetic: the product and the store's quotient. */
  volatile float prod = 448.0f * s, quot = m / s;
  assert_true(prod >= m);
  assert_true(quot <= 448.0f);
}

static void test_scale_rounding(void** state) {
  (void)state;
  float s = 0;
  TU_OK(qsakv_calib_scale_from_max(448.0f, &s));
  assert_true(s == 1.0f);
  /* 448 * (1 + 2^-20) is exact in FP32, so the scale is exactly 1 + 2^-20... */
  const float s20 = 1.0f + ldexpf(1.0f, -20);
  TU_OK(qsakv_calib_scale_from_max(448.0f * s20, &s));
  assert_true(s == s20);
  /* ...and one ulp more of maximum needs the next scale up. */
  TU_OK(qsakv_calib_scale_from_max(nextafterf(448.0f * s20, INFINITY), &s));
  assert_true(s == nextafterf(s20, 2.0f));
  /* 1/448 is not a float: the rounded-to-nearest quotient lies below it for 1.0? Either
   * way the rule holds; and a case where round-to-nearest is too small must exist. */
  int rn_too_small = 0;
  for (uint32_t h = 1; h < 0x7C00; ++h) { /* every positive finite FP16 maximum */
    const float m = tu_fp16_to_f32((uint16_t)h);
    check_scale(m);
    if ((double)(m / 448.0f) * 448.0 < (double)m) ++rn_too_small;
  }
  assert_true(rn_too_small > 0); /* the "round up" step is exercised */
  for (uint32_t h = 1; h < 0x7F80; ++h) check_scale(tu_bf16_to_f32((uint16_t)h)); /* BF16 */
  for (int i = 0; i < 200000; ++i) { /* random FP32 maxima over the whole range */
    uint32_t bits = (uint32_t)(tu_next() & 0x7F7FFFFFu);
    float m;
    memcpy(&m, &bits, 4);
    if (m > 0 && m < 1e38f) check_scale(m);
  }
  check_scale(1e-45f); /* smallest subnormal maximum: the scale is still > 0 */
  const float bad[] = {0.0f, -0.0f, -1.0f, NAN, INFINITY};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i)
    TU_EXPECT_STATUS(qsakv_calib_scale_from_max(bad[i], &s), QSAKV_ERROR_OVERLAY_BAD_SCALE);
}

/* ---- merging ------------------------------------------------------------------- */

static void words_of(const qsakv_calib* c, int layer, int kind, qsakv_calib_stats* st,
                     uint64_t* hist) {
  memset(st, 0, sizeof *st);
  st->struct_size = sizeof *st;
  TU_OK(qsakv_calib_get_stats(c, layer, (qsakv_calib_kind)kind, st, hist));
}

/* A snapshot of rank `rank` of a TP run filled with random data. */
static qsakv_calib* rank_stats(qsakv_context* ctx, int tp, int rank, double peak) {
  qsakv_model_config c;
  calib_config(&c, QSAKV_DTYPE_FP16, tp, rank);
  qsakv_calib* h = live(ctx, &c);
  TU_OK(qsakv_calib_start(h));
  fill(ctx, h, &c, NULL, peak, 0);
  qsakv_calib* s = snapshot(h);
  qsakv_calib_destroy(h);
  return s;
}

static void expect_merge_is_sum_max(const qsakv_calib* m, const qsakv_calib* const* in, int n) {
  static uint64_t hm[BINS], hi[BINS], sum[BINS];
  for (int layer = 3; layer <= 7; layer += 4)
    for (int kind = 0; kind < 2; ++kind) {
      qsakv_calib_stats sm, si;
      words_of(m, layer, kind, &sm, hm);
      uint64_t count = 0, finite = 0, nonzero = 0;
      float mx = 0;
      memset(sum, 0, sizeof sum);
      for (int i = 0; i < n; ++i) {
        words_of(in[i], layer, kind, &si, hi);
        count += si.count;
        finite += si.finite_count;
        nonzero += si.nonzero_count;
        mx = si.max_abs > mx ? si.max_abs : mx;
        for (int b = 0; b < BINS; ++b) sum[b] += hi[b];
      }
      assert_int_equal(sm.count, count);
      assert_int_equal(sm.finite_count, finite);
      assert_int_equal(sm.nonzero_count, nonzero);
      assert_true(sm.max_abs == mx);
      assert_memory_equal(hm, sum, sizeof sum);
    }
}

static void test_merge_algebra(void** state) {
  (void)state;
  qsakv_context* ctx = tu_context(QSAKV_BACKEND_CPU);
  qsakv_calib* r0 = rank_stats(ctx, 2, 0, 50.0);
  qsakv_calib* r1 = rank_stats(ctx, 2, 1, 70.0);
  const qsakv_calib* ab[] = {r0, r1};
  const qsakv_calib* ba[] = {r1, r0};
  qsakv_calib *m01 = NULL, *m10 = NULL;
  TU_OK(qsakv_calib_merge(&m01, ab, 2, QSAKV_CALIB_MERGE_RANKS));
  TU_OK(qsakv_calib_merge(&m10, ba, 2, QSAKV_CALIB_MERGE_RANKS));
  expect_merge_is_sum_max(m01, ab, 2);
  expect_merge_is_sum_max(m10, ab, 2); /* commutative */
  qsakv_calib_info info;
  memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  TU_OK(qsakv_calib_get_info(m01, &info));
  assert_int_equal(info.ranks_covered, 2);
  assert_int_equal(info.complete, 1);
  assert_int_equal(info.rank, -1);
  assert_int_equal(info.num_runs, 1);
  /* A rank counted twice is refused. */
  const qsakv_calib* twice[] = {r0, m01};
  qsakv_calib* bad = (qsakv_calib*)0x1;
  TU_EXPECT_STATUS(qsakv_calib_merge(&bad, twice, 2, QSAKV_CALIB_MERGE_RANKS),
                   QSAKV_ERROR_INVALID_ARGUMENT);
  assert_null(bad);
  MSG_HAS("rank 0");
  /* An envelope pools complete runs only. */
  TU_EXPECT_STATUS(qsakv_calib_merge(&bad, ab, 2, QSAKV_CALIB_MERGE_ENVELOPE),
                   QSAKV_ERROR_INVALID_ARGUMENT);
  MSG_HAS("envelope input 0 covers TP ranks 0 of 2");
  /* Two runs, each complete: envelope = max of maxima, runs add; associativity. */
  qsakv_calib* s0 = rank_stats(ctx, 2, 0, 900.0);
  qsakv_calib* s1 = rank_stats(ctx, 2, 1, 10.0);
  const qsakv_calib* run2_in[] = {s0, s1};
  qsakv_calib* run2 = NULL;
  TU_OK(qsakv_calib_merge(&run2, run2_in, 2, QSAKV_CALIB_MERGE_RANKS));
  const qsakv_calib* runs[] = {m01, run2};
  qsakv_calib* env = NULL;
  TU_OK(qsakv_calib_merge(&env, runs, 2, QSAKV_CALIB_MERGE_ENVELOPE));
  const qsakv_calib* all4[] = {r0, r1, s0, s1};
  expect_merge_is_sum_max(env, all4, 4);
  TU_OK(qsakv_calib_get_info(env, &info));
  assert_int_equal(info.num_runs, 2);
  qsakv_calib_stats st;
  words_of(env, 7, 0, &st, NULL);
  assert_true(st.max_abs == tu_fp16_to_f32(tu_f32_to_fp16(1800.0f))); /* run 2's planted peak */
  const qsakv_calib* env_env[] = {env, env};
  qsakv_calib* env2 = NULL;
  TU_OK(qsakv_calib_merge(&env2, env_env, 2, QSAKV_CALIB_MERGE_ENVELOPE));
  TU_OK(qsakv_calib_get_info(env2, &info));
  assert_int_equal(info.num_runs, 4);
  /* Ranks of runs pooling different numbers of runs do not rank-merge. */
  const qsakv_calib* mixed[] = {env, r0};
  TU_EXPECT_STATUS(qsakv_calib_merge(&bad, mixed, 2, QSAKV_CALIB_MERGE_RANKS),
                   QSAKV_ERROR_INVALID_ARGUMENT);
  /* Different fingerprints (TP size) never merge. */
  qsakv_calib* tp1 = rank_stats(ctx, 1, 0, 5.0);
  const qsakv_calib* other[] = {env, tp1};
  TU_EXPECT_STATUS(qsakv_calib_merge(&bad, other, 2, QSAKV_CALIB_MERGE_ENVELOPE),
                   QSAKV_ERROR_INVALID_ARGUMENT);
  MSG_HAS("fingerprint");
  TU_EXPECT_STATUS(qsakv_calib_merge(&bad, ab, 2, (qsakv_calib_merge_mode)7),
                   QSAKV_ERROR_INVALID_ARGUMENT);
  TU_EXPECT_STATUS(qsakv_calib_merge(&bad, ab, 0, QSAKV_CALIB_MERGE_RANKS),
                   QSAKV_ERROR_INVALID_ARGUMENT);
  qsakv_calib* tp1_copies[2] = {tp1, tp1};
  TU_EXPECT_STATUS(
      qsakv_calib_merge(&bad, (const qsakv_calib* const*)tp1_copies, 2, QSAKV_CALIB_MERGE_RANKS),
      QSAKV_ERROR_INVALID_ARGUMENT);
  qsakv_calib* all[] = {r0, r1, m01, m10, s0, s1, run2, env, env2, tp1};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) qsakv_calib_destroy(all[i]);
  qsakv_context_destroy(ctx);
}

/* ---- refusals --------------------------------------------------------------------- */

static void expect_summary_refused(const qsakv_calib* s, qsakv_status status, const char* text) {
  qsakv_calib_summary sum;
  memset(&sum, 0, sizeof sum);
  sum.struct_size = sizeof sum;
  TU_EXPECT_STATUS(qsakv_calib_summarize(s, 3, QSAKV_CALIB_K, &sum), status);
  MSG_HAS(text);
  qsakv_overlay_write_options wo;
  TU_OK(qsakv_overlay_write_options_init(&wo));
  wo.base_index_path = "/nonexistent/index.json"; /* never reached: refused before */
  TU_EXPECT_STATUS(qsakv_calib_write_overlay(s, "/tmp/qsakv-never-written", &wo), status);
  MSG_HAS(text);
}

/* A live TP1 handle with the given layers/kinds observed from `x` (8 tokens). */
static qsakv_calib* observed(qsakv_context* ctx, int k3, int v3, int k7, int v7,
                             const uint16_t* x) {
  qsakv_model_config c;
  calib_config(&c, QSAKV_DTYPE_FP16, 1, 0);
  qsakv_calib* h = live(ctx, &c);
  TU_OK(qsakv_calib_start(h));
  const size_t row = row_elems(&c);
  static uint16_t zeros[8 * 128];
  memset(zeros, 0, sizeof zeros);
  /* A missing half gets observed with zero tokens: calls that count nothing. */
  TU_OK(qsakv_calib_observe(h, 3, x, x, 0, NULL));
  if (k3 || v3) observe(ctx, h, 3, k3 ? x : zeros, v3 ? x : zeros, 8, row);
  if (k7 || v7) observe(ctx, h, 7, k7 ? x : zeros, v7 ? x : zeros, 8, row);
  qsakv_calib* s = snapshot(h);
  qsakv_calib_destroy(h);
  /* Emulate "never observed" by zeroing counts through a file round trip is not
   * possible from the API; so missing halves are made by observing zeros and then
   * checking the zero-max refusal instead, below. */
  return s;
}

/* The refusals of calibration, one behaviour each: a summary of statistics that do not
 * cover the model, a file that contradicts itself, a handle in the wrong state, a bad
 * argument. Each runs on the CPU backend with 8 rows of FP16 data (`cpu_calib_fixture`). */
typedef struct cpu_calib_fixture {
  qsakv_context* ctx;
  qsakv_model_config c;
  size_t row;
  uint16_t* x;   /* finite data */
  uint16_t* nan; /* the same with NaN and infinities mixed in */
} cpu_calib_fixture;

static int cpu_calib_setup(void** state) {
  cpu_calib_fixture* f = calloc(1, sizeof *f);
  if (!f) return -1;
  f->ctx = tu_context(QSAKV_BACKEND_CPU);
  calib_config(&f->c, QSAKV_DTYPE_FP16, 1, 0);
  f->row = row_elems(&f->c);
  f->x = make_data(8 * f->row, QSAKV_DTYPE_FP16, 1.0, 10.0, 0);
  f->nan = make_data(8 * f->row, QSAKV_DTYPE_FP16, 1.0, 10.0, 1);
  *state = f;
  return 0;
}

static int cpu_calib_teardown(void** state) {
  cpu_calib_fixture* f = *state;
  free(f->x);
  free(f->nan);
  qsakv_context_destroy(f->ctx);
  free(f);
  return 0;
}

/* A snapshot of a handle that observed layer 3 (and layer 7, when v7 is not NULL: K from x,
 * V from v7). */
static qsakv_calib* observed_3_and_7(cpu_calib_fixture* f, const uint16_t* v7) {
  qsakv_calib* h = live(f->ctx, &f->c);
  TU_OK(qsakv_calib_start(h));
  observe(f->ctx, h, 3, f->x, f->x, 8, f->row);
  if (v7) observe(f->ctx, h, 7, f->x, v7, 8, f->row);
  qsakv_calib* s = snapshot(h);
  qsakv_calib_destroy(h);
  return s;
}

static void test_summary_refuses_a_missing_layer(void** state) {
  cpu_calib_fixture* f = *state;
  qsakv_calib* s = observed_3_and_7(f, NULL);
  expect_summary_refused(s, QSAKV_ERROR_OVERLAY_INCOMPLETE, "layer 7: neither K nor V");
  qsakv_calib_destroy(s);
}

/* Saves a snapshot of layers 3 and 7 under a fresh temporary directory. */
static void saved_3_and_7(cpu_calib_fixture* f, char* dir, char* path, size_t cap) {
  qsakv_calib* s = observed_3_and_7(f, f->x);
  assert_non_null(mkdtemp(dir));
  snprintf(path, cap, "%s/rank0.safetensors", dir);
  TU_OK(qsakv_calib_save(s, path));
  qsakv_calib_destroy(s);
}

static void remove_saved(const char* dir, const char* path) {
  unlink(path);
  rmdir(dir);
}

static void test_save_refuses_to_overwrite(void** state) {
  cpu_calib_fixture* f = *state;
  char dir[] = "/tmp/qsakv-calib-XXXXXX", path[256];
  saved_3_and_7(f, dir, path, sizeof path);
  qsakv_calib* s = observed_3_and_7(f, f->x);
  TU_EXPECT_STATUS(qsakv_calib_save(s, path), QSAKV_ERROR_INVALID_ARGUMENT);
  MSG_HAS("already exists");
  qsakv_calib_destroy(s);
  remove_saved(dir, path);
}

/* A saved file is readable as write_file's are (0644 less the umask), not mkstemp's 0600:
 * a calibration run and the offline tools may be different users. */
static void test_saved_file_mode_follows_the_umask(void** state) {
  cpu_calib_fixture* f = *state;
  const mode_t masks[] = {022, 027};
  for (int i = 0; i < 2; ++i) {
    const mode_t old = umask(masks[i]);
    char dir[] = "/tmp/qsakv-calib-XXXXXX", path[256];
    saved_3_and_7(f, dir, path, sizeof path);
    umask(old);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0644 & ~masks[i]);
    remove_saved(dir, path);
  }
}

/* A saved statistics file opened for editing; *data gets the offset of its data section
 * (after the 8-byte header length and the JSON header), where the words tensor starts. */
static FILE* open_stats_data(const char* path, long* data) {
  FILE* file = fopen(path, "r+b");
  assert_non_null(file);
  uint64_t header_len = 0;
  assert_int_equal(fread(&header_len, 8, 1, file), 1);
  *data = 8 + (long)header_len;
  return file;
}

/* Edits a saved file of layers 3 and 7 so that layer 7's V was never observed: zeroes
 * its entry (count, finite, nonzero, histogram) and its max. The words tensor is first
 * in the data section, ordered (layer, kind); max_abs follows it. */
static void unobserve_layer_7_v(const char* path) {
  long words;
  FILE* file = open_stats_data(path, &words);
  const long entry = (long)(4096 + 3) * 8;
  static char zero[(4096 + 3) * 8];
  fseek(file, words + 3 * entry, SEEK_SET);
  fwrite(zero, 1, sizeof zero, file);
  fseek(file, words + 4 * entry + 3 * 4, SEEK_SET); /* max_abs[1][1] */
  fwrite(zero, 1, 4, file);
  fclose(file);
}

/* A missing K/V half: the API observes K and V together, so a file from another writer is
 * the only way to get one; it is made with the CPU handle and a file edit. */
static void test_summary_refuses_a_missing_kv_half(void** state) {
  cpu_calib_fixture* f = *state;
  char dir[] = "/tmp/qsakv-calib-XXXXXX", path[256];
  saved_3_and_7(f, dir, path, sizeof path);
  unobserve_layer_7_v(path);
  qsakv_calib* edited = NULL;
  TU_OK(qsakv_calib_load(&edited, path));
  qsakv_calib_summary sum;
  memset(&sum, 0, sizeof sum);
  sum.struct_size = sizeof sum;
  TU_EXPECT_STATUS(qsakv_calib_summarize(edited, 3, QSAKV_CALIB_K, &sum),
                   QSAKV_ERROR_OVERLAY_INCOMPLETE);
  MSG_HAS("layer 7: V was never observed but K was");
  qsakv_calib_destroy(edited);
  remove_saved(dir, path);
}

/* A corrupted count (the histogram no longer sums to the nonzero count) is a format error. */
static void test_load_refuses_inconsistent_counts(void** state) {
  cpu_calib_fixture* f = *state;
  char dir[] = "/tmp/qsakv-calib-XXXXXX", path[256];
  saved_3_and_7(f, dir, path, sizeof path);
  long words;
  FILE* file = open_stats_data(path, &words);
  fseek(file, words + 2 * 8, SEEK_SET); /* layer 3 K nonzero count */
  const uint64_t wrong = 1;
  fwrite(&wrong, 8, 1, file);
  fclose(file);
  qsakv_calib* edited = NULL;
  TU_EXPECT_STATUS(qsakv_calib_load(&edited, path), QSAKV_ERROR_FORMAT);
  MSG_HAS("layer 3 K statistics are inconsistent");
  remove_saved(dir, path);
}

static void test_load_of_a_missing_file_is_io(void** state) {
  (void)state;
  qsakv_calib* loaded = NULL;
  TU_EXPECT_STATUS(qsakv_calib_load(&loaded, "/nonexistent-qsakv-dir/missing.safetensors"),
                   QSAKV_ERROR_IO);
}

/* Non-finite activations, named by layer and kind. */
static void test_summary_refuses_non_finite_values(void** state) {
  cpu_calib_fixture* f = *state;
  qsakv_calib* s = observed_3_and_7(f, f->nan);
  expect_summary_refused(s, QSAKV_ERROR_CALIB_NON_FINITE, "layer 7 V: 2 of");
  qsakv_calib_destroy(s);
}

static void test_summary_refuses_a_zero_maximum(void** state) {
  cpu_calib_fixture* f = *state;
  qsakv_calib* s = observed(f->ctx, 1, 0, 1, 1, f->x);
  expect_summary_refused(s, QSAKV_ERROR_OVERLAY_BAD_SCALE, "layer 3 V: max |x| is 0");
  qsakv_calib_destroy(s);
}

/* Statistics of one rank of two. */
static void test_summary_refuses_one_rank_of_two(void** state) {
  cpu_calib_fixture* f = *state;
  qsakv_model_config c2;
  calib_config(&c2, QSAKV_DTYPE_FP16, 2, 1);
  qsakv_calib* h = live(f->ctx, &c2);
  TU_OK(qsakv_calib_start(h));
  observe(f->ctx, h, 3, f->x, f->x, 8, row_elems(&c2));
  observe(f->ctx, h, 7, f->x, f->x, 8, row_elems(&c2));
  qsakv_calib* s = snapshot(h);
  expect_summary_refused(s, QSAKV_ERROR_OVERLAY_INCOMPLETE,
                         "cover 1 of 2 TP ranks; missing rank(s) 0");
  qsakv_calib_destroy(s);
  qsakv_calib_destroy(h);
}

/* A snapshot of rank `rank` of a TP `tp` run that observed layer 3 and, if `with_7`,
 * layer 7 (K and V). */
static qsakv_calib* rank_observing(cpu_calib_fixture* f, int tp, int rank, int with_7) {
  qsakv_model_config c;
  calib_config(&c, QSAKV_DTYPE_FP16, tp, rank);
  qsakv_calib* h = live(f->ctx, &c);
  TU_OK(qsakv_calib_start(h));
  observe(f->ctx, h, 3, f->x, f->x, 8, row_elems(&c));
  if (with_7) observe(f->ctx, h, 7, f->x, f->x, 8, row_elems(&c));
  qsakv_calib* s = snapshot(h);
  qsakv_calib_destroy(h);
  return s;
}

static void expect_merge_refused(const qsakv_calib* a, const qsakv_calib* b,
                                 qsakv_calib_merge_mode mode, const char* text) {
  const qsakv_calib* in[] = {a, b};
  qsakv_calib* out = (qsakv_calib*)0x1;
  TU_EXPECT_STATUS(qsakv_calib_merge(&out, in, 2, mode), QSAKV_ERROR_OVERLAY_INCOMPLETE);
  assert_null(out);
  MSG_HAS(text);
}

/* At TP > 1 each rank holds other KV heads: a rank that never observed a layer (or half of
 * its K/V pair) must not vanish behind the other ranks' counts when they are summed. Every
 * input of a merge of two or more is checked, naming it, its ranks, the layer and kind. */
static void test_merge_refuses_an_input_that_missed_a_layer(void** state) {
  cpu_calib_fixture* f = *state;
  qsakv_calib* r0 = rank_observing(f, 2, 0, 1);
  qsakv_calib* r1_gap = rank_observing(f, 2, 1, 0);
  expect_merge_refused(r0, r1_gap, QSAKV_CALIB_MERGE_RANKS,
                       "input 1 (TP rank 1 of 2) never observed layer 7 K and V (count 0)");
  MSG_HAS("KV heads");
  expect_merge_refused(r1_gap, r0, QSAKV_CALIB_MERGE_RANKS,
                       "input 0 (TP rank 1 of 2) never observed layer 7 K and V");
  /* One input is copied as is; its summary refuses it (rank 0 is missing). */
  const qsakv_calib* one[] = {r1_gap};
  qsakv_calib* copy = NULL;
  TU_OK(qsakv_calib_merge(&copy, one, 1, QSAKV_CALIB_MERGE_RANKS));
  qsakv_calib_destroy(copy);
  /* Half of a pair: only V of layer 7 missing on rank 1 (a file edit; see above). */
  char dir[] = "/tmp/qsakv-calib-XXXXXX", path[256];
  assert_non_null(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/rank1.safetensors", dir);
  qsakv_calib* r1 = rank_observing(f, 2, 1, 1);
  TU_OK(qsakv_calib_save(r1, path));
  unobserve_layer_7_v(path);
  qsakv_calib* r1_half = NULL;
  TU_OK(qsakv_calib_load(&r1_half, path));
  expect_merge_refused(r0, r1_half, QSAKV_CALIB_MERGE_RANKS,
                       "input 1 (TP rank 1 of 2) never observed layer 7 V (count 0)");
  /* The whole ranks merge; that merge, once checked, envelopes with another. */
  const qsakv_calib* both[] = {r0, r1};
  qsakv_calib* run = NULL;
  TU_OK(qsakv_calib_merge(&run, both, 2, QSAKV_CALIB_MERGE_RANKS));
  const qsakv_calib* runs[] = {run, run};
  qsakv_calib* env = NULL;
  TU_OK(qsakv_calib_merge(&env, runs, 2, QSAKV_CALIB_MERGE_ENVELOPE));
  /* An envelope of TP1 runs: a run that missed a layer is refused too. */
  qsakv_calib* whole = rank_observing(f, 1, 0, 1);
  qsakv_calib* gap = rank_observing(f, 1, 0, 0);
  expect_merge_refused(whole, gap, QSAKV_CALIB_MERGE_ENVELOPE,
                       "input 1 (TP rank 0 of 1) never observed layer 7 K and V");
  qsakv_calib* all[] = {r0, r1_gap, r1, r1_half, run, env, whole, gap};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) qsakv_calib_destroy(all[i]);
  unlink(path);
  rmdir(dir);
}

/* A live handle is summarized or saved only through a snapshot. */
static void test_live_handle_refuses_summary_and_save(void** state) {
  cpu_calib_fixture* f = *state;
  qsakv_calib* h = live(f->ctx, &f->c);
  qsakv_calib_summary sum;
  memset(&sum, 0, sizeof sum);
  sum.struct_size = sizeof sum;
  TU_EXPECT_STATUS(qsakv_calib_summarize(h, 3, QSAKV_CALIB_K, &sum), QSAKV_ERROR_STATE);
  TU_EXPECT_STATUS(qsakv_calib_save(h, "/nonexistent-qsakv-dir/live.safetensors"),
                   QSAKV_ERROR_STATE);
  qsakv_calib_destroy(h);
}

static void test_create_refuses_bad_arguments(void** state) {
  cpu_calib_fixture* f = *state;
  qsakv_model_config cf;
  calib_config(&cf, QSAKV_DTYPE_FP16, 1, 0);
  cf.activation_dtype = QSAKV_DTYPE_FP32;
  qsakv_calib* h = (qsakv_calib*)0x1;
  TU_EXPECT_STATUS(qsakv_calib_create(&h, f->ctx, &cf), QSAKV_ERROR_INVALID_CONFIG);
  assert_null(h);
  TU_EXPECT_STATUS(qsakv_calib_create(&h, NULL, &f->c), QSAKV_ERROR_INVALID_ARGUMENT);
  TU_EXPECT_STATUS(qsakv_calib_create(NULL, f->ctx, &f->c), QSAKV_ERROR_INVALID_ARGUMENT);
}

/* Counting: a handle is stopped from creation, start and stop switch counting on the host;
 * host copies and the CPU backend refuse what they cannot do. On the CPU calibration
 * fixture (8 rows of FP16 data). */
static qsakv_calib_stats stats_of(const qsakv_calib* live_handle, int layer) {
  qsakv_calib* s = snapshot(live_handle);
  qsakv_calib_stats st = {sizeof st, QSAKV_CALIB_STATS_VERSION};
  TU_OK(qsakv_calib_get_stats(s, layer, QSAKV_CALIB_K, &st, NULL));
  qsakv_calib_destroy(s);
  return st;
}

/* Stopped (from creation): observe succeeds and counts nothing, but still checks its
 * arguments (the header's promise: warm-up passes catch wiring bugs). */
static void test_stopped_observe_counts_nothing_but_checks_arguments(void** state) {
  cpu_calib_fixture* f = *state;
  qsakv_calib* h = live(f->ctx, &f->c);
  observe(f->ctx, h, 3, f->x, f->x, 8, f->row);
  assert_int_equal(stats_of(h, 3).count, 0);
  TU_EXPECT_STATUS(qsakv_calib_observe(h, 4, f->x, f->x, 8, NULL), QSAKV_ERROR_INVALID_ARGUMENT);
  MSG_HAS("layer 4");
  TU_EXPECT_STATUS(qsakv_calib_observe(h, 3, NULL, f->x, 8, NULL), QSAKV_ERROR_INVALID_ARGUMENT);
  MSG_HAS("k is NULL");
  TU_EXPECT_STATUS(qsakv_calib_observe(h, 3, f->x, NULL, 8, NULL), QSAKV_ERROR_INVALID_ARGUMENT);
  MSG_HAS("v is NULL");
  TU_EXPECT_STATUS(qsakv_calib_observe(h, 3, f->x, f->x, INT64_MAX, NULL),
                   QSAKV_ERROR_INVALID_ARGUMENT);
  MSG_HAS("num_tokens");
  TU_OK(qsakv_calib_observe(h, 3, NULL, NULL, 0, NULL)); /* nothing to observe */
  qsakv_calib_destroy(h);
}

/* Started, observe counts (and checks its arguments); stopped again (a graph-capture
 * pass), it does not. */
static void test_start_counts_and_stop_pauses(void** state) {
  cpu_calib_fixture* f = *state;
  uint16_t* k = make_data(8 * f->row, QSAKV_DTYPE_FP16, 1.0, 100.0, 0);
  qsakv_calib* h = live(f->ctx, &f->c);
  TU_OK(qsakv_calib_start(h));
  TU_EXPECT_STATUS(qsakv_calib_observe(h, 3, NULL, k, 8, NULL), QSAKV_ERROR_INVALID_ARGUMENT);
  observe(f->ctx, h, 3, k, k, 8, f->row); /* counted */
  TU_OK(qsakv_calib_stop(h));
  observe(f->ctx, h, 3, k, k, 8, f->row); /* not counted */
  qsakv_calib_info info = {sizeof info, QSAKV_CALIB_INFO_VERSION};
  TU_OK(qsakv_calib_get_info(h, &info));
  assert_int_equal(info.live, 1);
  assert_int_equal(info.started, 0);
  const qsakv_calib_stats st = stats_of(h, 3);
  assert_int_equal(st.count, 8 * f->row);
  assert_true(st.max_abs == 100.0f);
  assert_int_equal(stats_of(h, 7).count, 0);
  qsakv_calib_destroy(h);
  free(k);
}

static void test_host_copies_neither_start_nor_observe(void** state) {
  cpu_calib_fixture* f = *state;
  qsakv_calib* s = observed_3_and_7(f, f->x);
  TU_EXPECT_STATUS(qsakv_calib_start(s), QSAKV_ERROR_STATE);
  TU_EXPECT_STATUS(qsakv_calib_observe(s, 3, f->x, f->x, 8, NULL), QSAKV_ERROR_STATE);
  qsakv_calib_destroy(s);
  qsakv_calib_destroy(NULL); /* a no-op */
}

/* The CPU backend cannot all-reduce over NCCL; the message points to the host merge. */
static void test_cpu_backend_cannot_allreduce(void** state) {
  cpu_calib_fixture* f = *state;
  qsakv_calib* h = live(f->ctx, &f->c);
  TU_EXPECT_STATUS(qsakv_calib_allreduce(h, (void*)0x1, NULL), QSAKV_ERROR_UNSUPPORTED);
  MSG_HAS("qsakv_calib_merge");
  qsakv_calib_destroy(h);
}

static void test_summary_values(void** state) {
  (void)state;
  qsakv_context* ctx = tu_context(QSAKV_BACKEND_CPU);
  qsakv_model_config c;
  calib_config(&c, QSAKV_DTYPE_FP16, 1, 0);
  const size_t row = row_elems(&c);            /* 128 */
  const size_t tokens = 100, n = tokens * row; /* 12800 values */
  uint16_t* x = malloc(n * 2);
  for (size_t i = 0; i < n; ++i) x[i] = tu_f32_to_fp16(1.0f);
  for (size_t i = 0; i < 10; ++i) x[i] = tu_f32_to_fp16(100.0f); /* top 10 */
  for (size_t i = 10; i < 74; ++i) x[i] = tu_f32_to_fp16(1e-5f); /* 64 that underflow */
  for (size_t i = 74; i < 100; ++i) x[i] = 0;                    /* 26 zeros */
  qsakv_calib* h = live(ctx, &c);
  TU_OK(qsakv_calib_start(h));
  observe(ctx, h, 3, x, x, tokens, row);
  observe(ctx, h, 7, x, x, tokens, row);
  qsakv_calib* s = snapshot(h);
  qsakv_calib_summary sum;
  memset(&sum, 0, sizeof sum);
  sum.struct_size = sizeof sum;
  TU_OK(qsakv_calib_summarize(s, 7, QSAKV_CALIB_V, &sum));
  assert_int_equal(sum.count, n);
  assert_int_equal(sum.nonzero_count, n - 26);
  assert_true(sum.max_abs == 100.0f);
  float want = 0;
  TU_OK(qsakv_calib_scale_from_max(100.0f, &want));
  assert_true(sum.scale == want);
  /* Rank ceil(0.999 * 12800) = 12788 is a 1.0: the upper edge of 1.0's bin. */
  const double edge = pow(2.0, -24.0 + (ref_bin(1.0) + 1) * 40.0 / 4096.0);
  assert_true(fabs(sum.p99_9 - edge) <= 1e-6 * edge);
  assert_true(sum.p99_9 > 1.0f && sum.p99_9 < 1.01f);
  /* Rank ceil(0.9999 * 12800) = 12799 is a 100: capped at the maximum. */
  assert_true(sum.p99_99 == 100.0f);
  assert_true(sum.saturate_fraction == 0.0);
  /* 1e-5 / (100/448) = 4.5e-5 < 2^-10: those 64 round to zero in E4M3. */
  assert_true(fabs(sum.underflow_fraction - 64.0 / (double)(n - 26)) < 1e-12);
  /* A too-small struct: only its prefix is written. */
  qsakv_calib_summary small;
  memset(&small, 0xAB, sizeof small);
  small.struct_size = offsetof(qsakv_calib_summary, max_abs);
  TU_OK(qsakv_calib_summarize(s, 7, QSAKV_CALIB_V, &small));
  assert_int_equal(small.count, n);
  assert_int_equal(((const unsigned char*)&small)[offsetof(qsakv_calib_summary, scale)], 0xAB);
  TU_EXPECT_STATUS(qsakv_calib_summarize(s, 5, QSAKV_CALIB_V, &sum), QSAKV_ERROR_INVALID_ARGUMENT);
  TU_EXPECT_STATUS(qsakv_calib_summarize(s, 3, (qsakv_calib_kind)2, &sum),
                   QSAKV_ERROR_INVALID_ARGUMENT);
  free(x);
  qsakv_calib_destroy(s);
  qsakv_calib_destroy(h);
  qsakv_context_destroy(ctx);
}

/* ---- files -------------------------------------------------------------------------- */

static int rm_entry(const char* p, const struct stat* sb, int flag, struct FTW* ftw) {
  (void)sb, (void)flag, (void)ftw;
  return remove(p);
}
static void rm_tree(const char* dir) { nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

static void test_save_load_roundtrip(void** state) {
  (void)state;
  qsakv_context* ctx = tu_context(QSAKV_BACKEND_CPU);
  qsakv_calib* r1 = rank_stats(ctx, 2, 1, 321.0);
  char dir[] = "/tmp/qsakv-calib-XXXXXX";
  assert_non_null(mkdtemp(dir));
  char path[256];
  snprintf(path, sizeof path, "%s/r1.safetensors", dir);
  TU_OK(qsakv_calib_save(r1, path));
  qsakv_calib* back = NULL;
  TU_OK(qsakv_calib_load(&back, path));
  const qsakv_calib* one[] = {r1};
  expect_merge_is_sum_max(back, one, 1); /* identical numbers */
  qsakv_calib_info a, b;
  memset(&a, 0, sizeof a);
  memset(&b, 0, sizeof b);
  a.struct_size = b.struct_size = sizeof a;
  TU_OK(qsakv_calib_get_info(r1, &a));
  TU_OK(qsakv_calib_get_info(back, &b));
  assert_int_equal(b.rank, 1);
  assert_int_equal(b.tp_size, 2);
  assert_int_equal(b.live, 0);
  assert_string_equal(a.config_fingerprint, b.config_fingerprint);
  assert_int_equal(strlen(b.config_fingerprint), 64);
  qsakv_model_config ca, cb;
  memset(&ca, 0, sizeof ca);
  memset(&cb, 0, sizeof cb);
  ca.struct_size = cb.struct_size = sizeof ca;
  TU_OK(qsakv_calib_get_config(r1, &ca));
  TU_OK(qsakv_calib_get_config(back, &cb));
  assert_memory_equal(&ca, &cb, sizeof ca);
  /* Every config field survives the file, index_key_dtype too (files before it was
   * recorded load as FP16 index keys, its default then). */
  {
    qsakv_model_config c;
    calib_config(&c, QSAKV_DTYPE_FP16, 2, 1);
    c.index_key_dtype = QSAKV_DTYPE_E4M3;
    qsakv_calib* lv = live(ctx, &c);
    TU_OK(qsakv_calib_start(lv));
    fill(ctx, lv, &c, NULL, 17.0, 0);
    qsakv_calib* h = snapshot(lv); /* save takes a host handle */
    qsakv_calib_destroy(lv);
    char e4m3_keys[256];
    snprintf(e4m3_keys, sizeof e4m3_keys, "%s/e4m3-keys.safetensors", dir);
    TU_OK(qsakv_calib_save(h, e4m3_keys));
    qsakv_calib* loaded = NULL;
    TU_OK(qsakv_calib_load(&loaded, e4m3_keys));
    memset(&ca, 0, sizeof ca);
    memset(&cb, 0, sizeof cb);
    ca.struct_size = cb.struct_size = sizeof ca;
    TU_OK(qsakv_calib_get_config(h, &ca));
    TU_OK(qsakv_calib_get_config(loaded, &cb));
    assert_int_equal(cb.index_key_dtype, QSAKV_DTYPE_E4M3);
    assert_memory_equal(&ca, &cb, sizeof ca);
    qsakv_calib_destroy(loaded);
    qsakv_calib_destroy(h);
  }
  /* A file that is not a statistics file. */
  char other[256];
  snprintf(other, sizeof other, "%s/other.safetensors", dir);
  FILE* f = fopen(other, "wb");
  const char hdr[] = "{\"__metadata__\":{\"format\":\"pt\"}}";
  const uint64_t n = sizeof hdr - 1;
  fwrite(&n, 8, 1, f);
  fwrite(hdr, 1, n, f);
  fclose(f);
  qsakv_calib* bad = NULL;
  TU_EXPECT_STATUS(qsakv_calib_load(&bad, other), QSAKV_ERROR_FORMAT);
  MSG_HAS("not a calibration statistics file");
  qsakv_calib_destroy(back);
  qsakv_calib_destroy(r1);
  rm_tree(dir);
  qsakv_context_destroy(ctx);
}

/* ---- end to end ---------------------------------------------------------------------- */

static void write_text(const char* path, const char* text) {
  FILE* f = fopen(path, "wb");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

static void test_end_to_end(void** state) {
  (void)state;
  qsakv_context* ctx = tu_context(QSAKV_BACKEND_CPU);
  char dir[] = "/tmp/qsakv-calib-e2e-XXXXXX";
  assert_non_null(mkdtemp(dir));
  char base[300], index[400], pack[300], ckpt[300], p0[300], p1[300], shard[400];
  snprintf(base, sizeof base, "%s/base", dir);
  snprintf(index, sizeof index, "%s/model.safetensors.index.json", base);
  snprintf(shard, sizeof shard, "%s/model-00001-of-00001.safetensors", base);
  snprintf(pack, sizeof pack, "%s/pack", dir);
  snprintf(ckpt, sizeof ckpt, "%s/ckpt", dir);
  snprintf(p0, sizeof p0, "%s/rank0.safetensors", dir);
  snprintf(p1, sizeof p1, "%s/rank1.safetensors", dir);
  assert_int_equal(mkdir(base, 0755), 0);
  write_text(index,
             "{\"metadata\": {\"total_size\": 8}, \"weight_map\": "
             "{\"lm_head.weight\": \"model-00001-of-00001.safetensors\"}}\n");
  write_text(shard, "weights!");

  /* Two ranks observe their own (different) activations; each saves its statistics. */
  qsakv_model_config c[2];
  uint16_t* data[2][2][2]; /* rank, layer, kind */
  const size_t tokens = 64;
  double peak[2][2] = {{0, 0}, {0, 0}};
  for (int r = 0; r < 2; ++r) {
    calib_config(&c[r], QSAKV_DTYPE_FP16, 2, r);
    const size_t row = row_elems(&c[r]);
    qsakv_calib* h = live(ctx, &c[r]);
    TU_OK(qsakv_calib_start(h));
    for (int li = 0; li < 2; ++li) {
      for (int kind = 0; kind < 2; ++kind) {
        const double p = 20.0 + 300.0 * tu_uniform(0, 1);
        data[r][li][kind] = make_data(tokens * row, QSAKV_DTYPE_FP16, 1.0, p, 0);
        const double pr = tu_fp16_to_f32(tu_f32_to_fp16((float)p));
        if (pr > peak[li][kind]) peak[li][kind] = pr;
      }
      observe(ctx, h, c[r].qsa_layers[li], data[r][li][0], data[r][li][1], tokens, row);
    }
    TU_OK(qsakv_calib_stop(h));
    qsakv_calib* s = snapshot(h);
    TU_OK(qsakv_calib_save(s, r ? p1 : p0));
    qsakv_calib_destroy(s);
    qsakv_calib_destroy(h);
  }
  /* Offline: load both, merge the ranks, write the scale pack. */
  qsakv_calib *l0 = NULL, *l1 = NULL, *m = NULL;
  TU_OK(qsakv_calib_load(&l0, p0));
  TU_OK(qsakv_calib_load(&l1, p1));
  const qsakv_calib* in[] = {l1, l0};
  TU_OK(qsakv_calib_merge(&m, in, 2, QSAKV_CALIB_MERGE_RANKS));
  qsakv_overlay_write_options wo;
  TU_OK(qsakv_overlay_write_options_init(&wo));
  wo.base_index_path = index;
  wo.contract_tp_size = 2;
  wo.contract_activation_dtype = QSAKV_DTYPE_FP16;
  TU_OK(qsakv_calib_write_overlay(m, pack, &wo));
  TU_OK(qsakv_overlay_materialize(ckpt, base, pack));

  /* The materialised checkpoint loads and validates for rank 0 of the TP2 config. */
  char revision[65];
  TU_OK(qsakv_checkpoint_revision(base, revision));
  qsakv_overlay* ov = NULL;
  TU_OK(qsakv_overlay_load(&ov, ckpt, NULL));
  TU_OK(qsakv_overlay_validate(ov, &c[0], revision));
  float ks[2], vs[2];
  for (int li = 0; li < 2; ++li) {
    TU_OK(qsakv_overlay_get_scales(ov, c[0].qsa_layers[li], &ks[li], &vs[li]));
    float want;
    TU_OK(qsakv_calib_scale_from_max((float)peak[li][0], &want));
    assert_true(ks[li] == want); /* the global max over both ranks */
    TU_OK(qsakv_calib_scale_from_max((float)peak[li][1], &want));
    assert_true(vs[li] == want);
  }

  /* An E4M3 cache on those scales stores the calibration data without saturating: the
   * largest value maps to 448 exactly (code 0x7E), every code matches the oracle. */
  qsakv_cache_options co;
  TU_OK(qsakv_cache_options_init(&co));
  co.num_blocks = 8;
  qsakv_cache* cache = NULL;
  TU_OK(qsakv_cache_create(&cache, ctx, &c[0], ov, &co));
  qsakv_cache_layout lay;
  memset(&lay, 0, sizeof lay);
  lay.struct_size = sizeof lay;
  TU_OK(qsakv_cache_get_layout(cache, &lay));
  const size_t row = row_elems(&c[0]);
  int64_t slots[64];
  for (int i = 0; i < 64; ++i) slots[i] = i;
  for (int r = 0; r < 2; ++r)
    for (int li = 0; li < 2; ++li) {
      TU_OK(qsakv_store_kv(cache, c[0].qsa_layers[li], data[r][li][0], data[r][li][1], slots,
                           (int64_t)tokens, NULL));
      qsakv_layer_buffers lb = {sizeof lb, QSAKV_LAYER_BUFFERS_VERSION};
      TU_OK(qsakv_cache_get_layer_buffers(cache, c[0].qsa_layers[li], &lb));
      const uint8_t* kv = lb.kv;
      for (int kind = 0; kind < 2; ++kind) {
        const float sc = kind ? vs[li] : ks[li];
        for (size_t t = 0; t < tokens; ++t)
          for (size_t e = 0; e < row; ++e) {
            const float xv = tu_fp16_to_f32(data[r][li][kind][t * row + e]);
            const size_t off = (t / 16) * lay.kv_stride_block + kind * lay.kv_stride_kv +
                               (t % 16) * lay.kv_stride_token + e;
            assert_true(fabsf(xv) / sc <= 448.0f);
            assert_int_equal(kv[off], tu_e4m3_encode(xv / sc));
            if ((double)fabsf(xv) == peak[li][kind]) assert_int_equal(kv[off] & 0x7F, 0x7E);
          }
      }
    }
  qsakv_cache_destroy(cache);
  qsakv_overlay_destroy(ov);
  for (int r = 0; r < 2; ++r)
    for (int li = 0; li < 2; ++li)
      for (int kind = 0; kind < 2; ++kind) free(data[r][li][kind]);
  qsakv_calib_destroy(l0);
  qsakv_calib_destroy(l1);
  qsakv_calib_destroy(m);
  rm_tree(dir);
  qsakv_context_destroy(ctx);
}

/* The pack from `stats` with `wo` (base index `index` set here) loaded from its scale file
 * into *ov; *info gets its contract. */
static void pack_of(const qsakv_calib* stats, qsakv_overlay_write_options wo, const char* index,
                    const char* pack, qsakv_overlay** ov, qsakv_overlay_info* info) {
  wo.base_index_path = index;
  TU_OK(qsakv_calib_write_overlay(stats, pack, &wo));
  char scale_file[400];
  snprintf(scale_file, sizeof scale_file, "%s/model-kvscales.safetensors", pack);
  TU_OK(qsakv_overlay_load(ov, scale_file, NULL));
  memset(info, 0, sizeof *info);
  info->struct_size = sizeof *info;
  info->version = QSAKV_OVERLAY_INFO_VERSION;
  TU_OK(qsakv_overlay_get_info(*ov, info));
}

/* Options left at QSAKV_OVERLAY_WRITE_OPTIONS_INIT bind the pack to what was calibrated
 * (the statistics' TP size and activation dtype), as `qsakv overlay make` does: BF16 TP1
 * statistics do not give a pack that validates for FP16 at TP2. contract_tp_size -1
 * lifts the TP constraint; explicit values are kept. */
static void test_write_overlay_binds_the_statistics_by_default(void** state) {
  (void)state;
  qsakv_context* ctx = tu_context(QSAKV_BACKEND_CPU);
  char dir[] = "/tmp/qsakv-calib-contract-XXXXXX";
  assert_non_null(mkdtemp(dir));
  char base[300], index[400], pack[400];
  snprintf(base, sizeof base, "%s/base", dir);
  snprintf(index, sizeof index, "%s/model.safetensors.index.json", base);
  assert_int_equal(mkdir(base, 0755), 0);
  write_text(index, "{\"weight_map\": {\"lm_head.weight\": \"model.safetensors\"}}\n");
  char revision[65];
  TU_OK(qsakv_checkpoint_revision(base, revision));
  qsakv_model_config bf16_tp1, fp16_tp2;
  calib_config(&bf16_tp1, QSAKV_DTYPE_BF16, 1, 0);
  calib_config(&fp16_tp2, QSAKV_DTYPE_FP16, 2, 0);
  qsakv_calib* h = live(ctx, &bf16_tp1);
  TU_OK(qsakv_calib_start(h));
  fill(ctx, h, &bf16_tp1, NULL, 40.0, 0);
  qsakv_calib* stats = snapshot(h);
  qsakv_calib_destroy(h);

  const qsakv_overlay_write_options init = QSAKV_OVERLAY_WRITE_OPTIONS_INIT;
  qsakv_overlay* ov = NULL;
  qsakv_overlay_info info;
  snprintf(pack, sizeof pack, "%s/default", dir);
  pack_of(stats, init, index, pack, &ov, &info);
  assert_int_equal(info.contract_tp_size, 1);
  assert_int_equal(info.contract_activation_dtype, QSAKV_DTYPE_BF16);
  assert_int_equal(info.contract_speculative_tokens, -1); /* not settled by statistics */
  assert_int_equal(info.contract_min_sm, 0);
  TU_EXPECT_STATUS(qsakv_overlay_validate(ov, &fp16_tp2, revision), QSAKV_ERROR_CONTRACT);
  MSG_HAS("tp_size must be 1");
  qsakv_model_config bf16_tp2 = fp16_tp2;
  bf16_tp2.activation_dtype = QSAKV_DTYPE_BF16;
  TU_EXPECT_STATUS(qsakv_overlay_validate(ov, &bf16_tp2, revision), QSAKV_ERROR_CONTRACT);
  qsakv_model_config fp16_tp1 = bf16_tp1;
  fp16_tp1.activation_dtype = QSAKV_DTYPE_FP16;
  TU_EXPECT_STATUS(qsakv_overlay_validate(ov, &fp16_tp1, revision), QSAKV_ERROR_CONTRACT);
  MSG_HAS("activation_dtype must be bf16");
  TU_OK(qsakv_overlay_validate(ov, &bf16_tp1, revision));
  qsakv_overlay_destroy(ov);

  /* The same through qsakv_overlay_write_options_init. */
  qsakv_overlay_write_options wo;
  TU_OK(qsakv_overlay_write_options_init(&wo));
  snprintf(pack, sizeof pack, "%s/init", dir);
  pack_of(stats, wo, index, pack, &ov, &info);
  assert_int_equal(info.contract_tp_size, 1);
  assert_int_equal(info.contract_activation_dtype, QSAKV_DTYPE_BF16);
  qsakv_overlay_destroy(ov);

  /* -1: no TP constraint (the dtype stays bound); explicit values as given. */
  wo.contract_tp_size = -1;
  snprintf(pack, sizeof pack, "%s/any-tp", dir);
  pack_of(stats, wo, index, pack, &ov, &info);
  assert_int_equal(info.contract_tp_size, 0);
  assert_int_equal(info.contract_activation_dtype, QSAKV_DTYPE_BF16);
  TU_OK(qsakv_overlay_validate(ov, &bf16_tp2, revision));
  qsakv_overlay_destroy(ov);
  wo.contract_tp_size = 4;
  wo.contract_activation_dtype = QSAKV_DTYPE_FP16;
  wo.contract_speculative_tokens = 2;
  wo.contract_min_sm = 90;
  snprintf(pack, sizeof pack, "%s/explicit", dir);
  pack_of(stats, wo, index, pack, &ov, &info);
  assert_int_equal(info.contract_tp_size, 4);
  assert_int_equal(info.contract_activation_dtype, QSAKV_DTYPE_FP16);
  assert_int_equal(info.contract_speculative_tokens, 2);
  assert_int_equal(info.contract_min_sm, 90);
  qsakv_overlay_destroy(ov);

  /* Below -1 is refused, naming the meanings; nothing is written. */
  wo.contract_tp_size = -2;
  wo.base_index_path = index;
  snprintf(pack, sizeof pack, "%s/never", dir);
  TU_EXPECT_STATUS(qsakv_calib_write_overlay(stats, pack, &wo), QSAKV_ERROR_INVALID_ARGUMENT);
  MSG_HAS("contract_tp_size is -2; 0 (the statistics' TP size, 1), -1 (not constrained)");
  assert_int_equal(access(pack, F_OK), -1);

  /* Merged TP2 statistics bind TP2. */
  qsakv_calib* ranks[2];
  for (int r = 0; r < 2; ++r) {
    qsakv_model_config c;
    calib_config(&c, QSAKV_DTYPE_FP16, 2, r);
    qsakv_calib* lr = live(ctx, &c);
    TU_OK(qsakv_calib_start(lr));
    fill(ctx, lr, &c, NULL, 9.0, 0);
    ranks[r] = snapshot(lr);
    qsakv_calib_destroy(lr);
  }
  qsakv_calib* m = NULL;
  TU_OK(qsakv_calib_merge(&m, (const qsakv_calib* const*)ranks, 2, QSAKV_CALIB_MERGE_RANKS));
  snprintf(pack, sizeof pack, "%s/tp2", dir);
  pack_of(m, init, index, pack, &ov, &info);
  assert_int_equal(info.contract_tp_size, 2);
  assert_int_equal(info.contract_activation_dtype, QSAKV_DTYPE_FP16);
  TU_OK(qsakv_overlay_validate(ov, &fp16_tp2, revision));
  TU_EXPECT_STATUS(qsakv_overlay_validate(ov, &fp16_tp1, revision), QSAKV_ERROR_CONTRACT);
  qsakv_overlay_destroy(ov);

  qsakv_calib_destroy(m);
  qsakv_calib_destroy(ranks[0]);
  qsakv_calib_destroy(ranks[1]);
  qsakv_calib_destroy(stats);
  rm_tree(dir);
  qsakv_context_destroy(ctx);
}

/* ---- CUDA ------------------------------------------------------------------------- */

/* The GPU's statistics equal the CPU backend's bit for bit on the same data. */
static void compare_backends(qsakv_dtype act) {
  qsakv_context* gpu = tu_cuda_context_or_skip();
  qsakv_context* cpu = tu_context(QSAKV_BACKEND_CPU);
  qsakv_model_config c;
  calib_config(&c, act, 1, 0);
  qsakv_calib* hg = live(gpu, &c);
  qsakv_calib* hc = live(cpu, &c);
  TU_OK(qsakv_calib_start(hg));
  TU_OK(qsakv_calib_start(hc));
  const size_t row = row_elems(&c);
  static ref_stats refs[2][2];
  memset(refs, 0, sizeof refs);
  for (int li = 0; li < 2; ++li)
    for (int call = 0; call < 4; ++call) {
      /* Sizes from 1 token to enough blocks to fill the GPU. */
      const size_t tokens = call == 3 ? 20000 : (size_t)tu_int(1, 300);
      uint16_t* k = make_data(tokens * row, act, 3.0, 1000.0 * (li + 1), 1);
      uint16_t* v = make_data(tokens * row, act, 0.1, 7.0, 1);
      observe(gpu, hg, c.qsa_layers[li], k, v, tokens, row);
      observe(cpu, hc, c.qsa_layers[li], k, v, tokens, row);
      ref_add(&refs[li][0], k, tokens * row, act);
      ref_add(&refs[li][1], v, tokens * row, act);
      free(k);
      free(v);
    }
  qsakv_calib* sg = snapshot(hg);
  qsakv_calib* sc = snapshot(hc);
  const qsakv_calib* one[] = {sc};
  expect_merge_is_sum_max(sg, one, 1);
  for (int li = 0; li < 2; ++li)
    for (int kind = 0; kind < 2; ++kind)
      expect_stats_equal(sg, c.qsa_layers[li], (qsakv_calib_kind)kind, &refs[li][kind]);
  /* Misaligned device pointers are refused on CUDA. */
  void* d = NULL;
  TU_OK(qsakv_malloc(gpu, &d, 4096));
  TU_EXPECT_STATUS(qsakv_calib_observe(hg, 3, (char*)d + 2, d, 1, NULL),
                   QSAKV_ERROR_INVALID_ARGUMENT);
  qsakv_free(gpu, d);
  qsakv_calib_destroy(sg);
  qsakv_calib_destroy(sc);
  qsakv_calib_destroy(hg);
  qsakv_calib_destroy(hc);
  qsakv_context_destroy(cpu);
  qsakv_context_destroy(gpu);
}

static void test_cuda_matches_cpu_fp16(void** state) {
  (void)state;
  compare_backends(QSAKV_DTYPE_FP16);
}

static void test_cuda_matches_cpu_bf16(void** state) {
  (void)state;
  compare_backends(QSAKV_DTYPE_BF16);
}

#define R(f) cmocka_unit_test_setup_teardown(f, cpu_calib_setup, cpu_calib_teardown)

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_stats_fp16_cpu),
      cmocka_unit_test(test_stats_bf16_cpu),
      cmocka_unit_test(test_every_fp16_pattern),
      R(test_stopped_observe_counts_nothing_but_checks_arguments),
      R(test_start_counts_and_stop_pauses),
      R(test_host_copies_neither_start_nor_observe),
      R(test_cpu_backend_cannot_allreduce),
      cmocka_unit_test(test_scale_rounding),
      cmocka_unit_test(test_merge_algebra),
      R(test_summary_refuses_a_missing_layer),
      R(test_save_refuses_to_overwrite),
      R(test_saved_file_mode_follows_the_umask),
      R(test_summary_refuses_a_missing_kv_half),
      R(test_load_refuses_inconsistent_counts),
      cmocka_unit_test(test_load_of_a_missing_file_is_io),
      R(test_summary_refuses_non_finite_values),
      R(test_summary_refuses_a_zero_maximum),
      R(test_summary_refuses_one_rank_of_two),
      R(test_merge_refuses_an_input_that_missed_a_layer),
      R(test_live_handle_refuses_summary_and_save),
      R(test_create_refuses_bad_arguments),
      cmocka_unit_test(test_summary_values),
      cmocka_unit_test(test_save_load_roundtrip),
      cmocka_unit_test(test_end_to_end),
      cmocka_unit_test(test_write_overlay_binds_the_statistics_by_default),
      cmocka_unit_test(test_cuda_matches_cpu_fp16),
      cmocka_unit_test(test_cuda_matches_cpu_bf16),
  };
  tu_seed();
  return cmocka_run_group_tests_name("calib", tests, NULL, NULL);
}
