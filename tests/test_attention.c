// SPDX-License-Identifier: Apache-2.0
/* Attention against an FP64 reference computed here from the cache bytes (an independent
 * decoder, not the backend's code path): random data every run, poisoned outputs, NaN
 * pages no valid index reaches, -1 indices, empty requests, requests shorter than one
 * group, a 49-row mixed batch, 1 to 2051 selected tokens; sparse and dense; E4M3, FP16,
 * BF16; head_dim 64/128/256; GQA groups 1..12. On a GPU the CUDA backend is checked the
 * same way and against the CPU backend. Lists of given overlaps between the rows of a
 * group (shared by all, by exactly the grouped route's threshold of rows, by none; unions
 * far past its old workspace; empty rows; a causal tail), with block 0 unmapped and
 * poisoned, on every route. Bounds (relative L2 vs FP64):
 *   FP16 outputs 2e-3 (output rounding ~3e-4 RMS plus FP16 P.V operands on the GPU),
 *   BF16 outputs 1e-2 (8-bit mantissa rounding ~2.3e-3 RMS). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "scenario.h"

typedef struct {
  int q_heads, kv_heads, head_dim;
  qsakv_dtype act, kv;
  int block_size;
} geometry_case;

/* A CUDA context forced onto the software (bitcast) E4M3 decoder. */
static qsakv_context* software_decoder_context(void) {
  qsakv_context_options o;
  qsakv_context_options_init(&o);
  o.backend = QSAKV_BACKEND_CUDA;
  o.decoder = QSAKV_DECODER_SOFTWARE;
  qsakv_context* sw = NULL;
  TU_OK(qsakv_context_create(&sw, &o));
  return sw;
}

static double bound_for(qsakv_dtype act) { return act == QSAKV_DTYPE_BF16 ? 1e-2 : 2e-3; }

/* Random top-k rows: a random count (1..width) of distinct causal positions in random
 * order, -1 scattered between them, some rows all -1, some reaching the full width. */
static int32_t* random_topk(const tu_world* w, int64_t stride) {
  const int width = w->geo.topk_width;
  int32_t* topk = malloc(sizeof(int32_t) * (size_t)w->rows * stride);
  for (int row = 0; row < w->rows; ++row) {
    int32_t* out = topk + row * stride;
    for (int j = 0; j < stride; ++j) out[j] = -1;
    const int pos = tu_row_pos(w, row);
    const int kind = tu_int(0, 9);
    if (kind == 0) continue; /* all -1: the row outputs zeros */
    int want = kind == 1 ? width : tu_int(1, width);
    if (want > pos + 1) want = pos + 1;
    /* Partial Fisher-Yates over 0..pos. */
    int* cand = malloc(sizeof(int) * (pos + 1));
    for (int t = 0; t <= pos; ++t) cand[t] = t;
    for (int i = 0; i < want; ++i) {
      int j = i + (int)(tu_next() % (uint64_t)(pos + 1 - i));
      int t = cand[i];
      cand[i] = cand[j];
      cand[j] = t;
    }
    /* Place them at random columns, leaving -1 holes when there is room. */
    int col = 0;
    for (int i = 0; i < want; ++i) {
      while (col < width - (want - i) && tu_int(0, 7) == 0) ++col;
      out[col++] = cand[i];
    }
    free(cand);
  }
  return topk;
}

static uint16_t* random_q(const tu_world* w) {
  const size_t n = (size_t)w->rows * w->geo.q_heads * w->cfg.head_dim;
  uint16_t* q = malloc(2 * n + 2);
  for (size_t i = 0; i < n; ++i) q[i] = tu_f32_to_act((float)tu_normal(), w->cfg.activation_dtype);
  return q;
}

/* Runs attention on w's backend with poisoned outputs; returns the host output as FP64. */
static double* run_attention(const tu_world* w, const uint16_t* q, const int32_t* topk,
                             int64_t stride, int dense) {
  const size_t n = (size_t)w->rows * w->geo.q_heads * w->cfg.head_dim;
  void* dq = tu_to_device(w->ctx, q, 2 * n);
  void* dout = tu_device_filled(w->ctx, 2 * n, 0xFF); /* NaN: every element must be written */
  void* dtopk =
      topk ? tu_to_device(w->ctx, topk, sizeof(int32_t) * (size_t)w->rows * stride) : NULL;
  TU_OK(qsakv_attention_run(w->plan, w->layer,
                            dense ? QSAKV_ATTENTION_DENSE : QSAKV_ATTENTION_SPARSE, dq, dtopk,
                            stride, dout, NULL));
  uint16_t* out = malloc(2 * n + 2);
  tu_to_host(w->ctx, out, dout, 2 * n);
  double* r = malloc(sizeof(double) * (n + 1));
  for (size_t i = 0; i < n; ++i) r[i] = tu_act_to_f32(out[i], w->cfg.activation_dtype);
  free(out);
  qsakv_free(w->ctx, dq);
  qsakv_free(w->ctx, dout);
  if (dtopk) qsakv_free(w->ctx, dtopk);
  return r;
}

/* One run of w's plan over `topk` (NULL: dense) against `ref`, the FP64 reference of the
 * same lists: every output written and none NaN, the relative L2 within the bound, and
 * rows with no visible entry exact zeros. Prints one line; returns the error. */
static double check_run(const tu_world* w, const char* what, const char* mode, int splits_note,
                        const uint16_t* q, const int32_t* topk, int64_t stride, const double* ref) {
  const size_t n = (size_t)w->rows * w->geo.q_heads * w->cfg.head_dim;
  double* got = run_attention(w, q, topk, stride, topk == NULL);
  for (size_t i = 0; i < n; ++i)
    if (isnan(got[i]))
      fail_msg("%s %s: output %zu is NaN (unwritten or poisoned read)", what, mode, i);
  const double err = tu_rel_l2(ref, got, n);
  print_message("%-44s %-6s splits=%-3d rel_l2=%.3e (bound %.0e)\n", what, mode, splits_note, err,
                bound_for(w->cfg.activation_dtype));
  assert_true(err <= bound_for(w->cfg.activation_dtype));
  /* Rows whose selection is empty output exact zeros. */
  if (topk)
    for (int row = 0; row < w->rows; ++row) {
      int any = 0;
      for (int j = 0; j < w->geo.topk_width; ++j) {
        const int t = topk[row * stride + j];
        any |= t >= 0 && t <= tu_row_pos(w, row);
      }
      if (!any)
        for (int e = 0; e < w->geo.q_heads * w->cfg.head_dim; ++e)
          assert_true(got[(size_t)row * w->geo.q_heads * w->cfg.head_dim + e] == 0.0);
    }
  free(got);
  return err;
}

static void check_world(const tu_world* w, const char* what, int splits_note) {
  const size_t n = (size_t)w->rows * w->geo.q_heads * w->cfg.head_dim;
  void* kv = tu_world_read_kv(w);
  const uint16_t* q = random_q(w);
  for (int dense = 0; dense <= 1; ++dense) {
    const int64_t stride = w->geo.topk_width + (dense ? 0 : tu_int(0, 5));
    int32_t* topk = dense ? NULL : random_topk(w, stride);
    double* ref = malloc(sizeof(double) * (n + 1));
    tu_reference_attention(w, kv, q, topk, stride, dense, ref);
    check_run(w, what, dense ? "dense" : "sparse", splits_note, q, topk, stride, ref);
    free(ref);
    free(topk);
  }
  free((void*)q);
  free(kv);
}

static tu_shape mixed_49(void) {
  /* decode, verify rows, a prefill chunk, a request shorter than one group, an empty
   * request, and a long catch-up: 1 + 4 + 16 + 1 + 0 + 27 = 49 rows. */
  tu_shape s = {6, {1, 4, 16, 1, 0, 27}, {3000, 2500, 40, 3, 10, 2600}};
  return s;
}

static void config_for(qsakv_model_config* c, const geometry_case* g) {
  tu_small_config(c, g->q_heads, g->kv_heads, g->head_dim, g->act, g->kv, g->block_size);
}

static void run_cases(qsakv_context* ctx, const char* backend) {
  const geometry_case cases[] = {
      /* the reference geometry at TP4 (group 6, head_dim 256), E4M3 */
      {6, 1, 256, QSAKV_DTYPE_FP16, QSAKV_DTYPE_E4M3, 64},
      {6, 1, 256, QSAKV_DTYPE_BF16, QSAKV_DTYPE_E4M3, 64},
      {6, 1, 256, QSAKV_DTYPE_FP16, QSAKV_DTYPE_FP16, 64},
      {6, 1, 256, QSAKV_DTYPE_BF16, QSAKV_DTYPE_BF16, 16},
      {8, 2, 128, QSAKV_DTYPE_FP16, QSAKV_DTYPE_E4M3, 32},
      {12, 1, 128, QSAKV_DTYPE_FP16, QSAKV_DTYPE_E4M3, 16},
      {4, 4, 64, QSAKV_DTYPE_BF16, QSAKV_DTYPE_E4M3, 64},
      {2, 1, 64, QSAKV_DTYPE_FP16, QSAKV_DTYPE_FP16, 128},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
    qsakv_model_config c;
    config_for(&c, &cases[i]);
    tu_shape shape = mixed_49();
    if (cases[i].head_dim != 256 || cases[i].kv != QSAKV_DTYPE_E4M3) {
      /* Smaller batches for the other geometries keep the CPU run short. */
      tu_shape small = {4, {1, 3, 5, 1}, {2300, 700, 9, 2}};
      shape = small;
    }
    const float k_scale = (float)tu_uniform(0.004, 0.02), v_scale = (float)tu_uniform(0.004, 0.02);
    tu_world w;
    tu_world_build(&w, ctx, &c, &shape, tu_next(), 2.0f, k_scale, v_scale, 0);
    qsakv_plan_info pi;
    memset(&pi, 0, sizeof pi);
    pi.struct_size = sizeof pi;
    TU_OK(qsakv_plan_get_info(w.plan, &pi));
    char what[128];
    snprintf(what, sizeof what, "%s q%d kv%d d%d %s/%s bs%d grouped=%d", backend, cases[i].q_heads,
             cases[i].kv_heads, cases[i].head_dim, qsakv_dtype_name(cases[i].act),
             qsakv_dtype_name(cases[i].kv), cases[i].block_size, pi.grouped_rows);
    /* The route asked for is the route taken (the CUDA backend has the grouped one). */
    const int grouped_route = tu_has_grouped_route(ctx);
    if (tu_multi_row_min_rows == -1 || !grouped_route) assert_int_equal(pi.grouped_rows, 0);
    if (tu_multi_row_min_rows == 1 && grouped_route) assert_int_equal(pi.grouped_rows, w.rows);
    check_world(&w, what, pi.num_splits);
    tu_world_destroy(&w);
  }
}

static void test_cpu_against_fp64(void** state) {
  (void)state;
  qsakv_context* ctx = tu_context(QSAKV_BACKEND_CPU);
  run_cases(ctx, "cpu");
  qsakv_context_destroy(ctx);
}

/* Every route: the plan's automatic routing (the 49-row batch mixes both), every row on
 * the decode route, every row on the grouped route. */
static void test_cuda_against_fp64(void** state) {
  (void)state;
  qsakv_context* ctx = tu_cuda_context_or_skip();
  const int routes[3] = {0, -1, 1};
  const char* names[3] = {"cuda auto", "cuda decode", "cuda grouped"};
  for (int i = 0; i < 3; ++i) {
    tu_multi_row_min_rows = routes[i];
    run_cases(ctx, names[i]);
  }
  tu_multi_row_min_rows = 0;
  qsakv_context_destroy(ctx);
}

/* The grouped route's other paths, against FP64: a group whose rows select more distinct
 * tokens than the union workspace holds (each row's own list instead), enough groups that
 * the route runs without split-K (one split per group), and a request shorter than its
 * rows' group. Every row on the grouped route, sparse and dense. */
static void test_cuda_grouped_paths(void** state) {
  (void)state;
  qsakv_context* ctx = tu_cuda_context_or_skip();
  if (!tu_has_grouped_route(ctx)) {
    fprintf(stderr, "[ SKIP     ] the SM70 kernel tier has no grouped route\n");
    qsakv_context_destroy(ctx);
    skip();
  }
  tu_multi_row_min_rows = 1;
  const struct {
    geometry_case g;
    tu_shape shape;
    const char* what;
  } cases[] = {
      {{6, 1, 256, QSAKV_DTYPE_FP16, QSAKV_DTYPE_E4M3, 64},
       {1, {16}, {9000}},
       "union overflow (16 random lists over 9000 tokens)"},
      {{2, 1, 64, QSAKV_DTYPE_FP16, QSAKV_DTYPE_FP16, 64},
       {2, {2200, 30}, {2600, 40}},
       "140 groups: one split each"},
      {{8, 2, 128, QSAKV_DTYPE_BF16, QSAKV_DTYPE_BF16, 16},
       {3, {5, 17, 2}, {5, 300, 3}},
       "BF16 cache, 2 KV heads, tiny requests"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
    qsakv_model_config c;
    config_for(&c, &cases[i].g);
    c.max_batched_tokens = 4096;
    tu_world w;
    tu_world_build(&w, ctx, &c, &cases[i].shape, tu_next(), 2.0f, 0.01f, 0.008f, 0);
    qsakv_plan_info pi;
    memset(&pi, 0, sizeof pi);
    pi.struct_size = sizeof pi;
    TU_OK(qsakv_plan_get_info(w.plan, &pi));
    assert_int_equal(pi.grouped_rows, w.rows);
    assert_true(pi.num_groups > 0);
    /* The automatic routing's thresholds by cache type (kernels/limits.hpp). */
    qsakv_plan_options po = QSAKV_PLAN_OPTIONS_INIT;
    po.max_rows = 1024;
    qsakv_plan* auto_plan = NULL;
    TU_OK(qsakv_plan_create(&auto_plan, w.cache, &po));
    qsakv_plan_info ai;
    memset(&ai, 0, sizeof ai);
    ai.struct_size = sizeof ai;
    TU_OK(qsakv_plan_get_info(auto_plan, &ai));
    assert_int_equal(ai.multi_row_min_rows, cases[i].g.kv == QSAKV_DTYPE_E4M3 ? 9 : 5);
    const int gqa = cases[i].g.q_heads / cases[i].g.kv_heads;
    assert_int_equal(ai.rows_per_group, 96 / gqa < 16 ? 96 / gqa : 16);
    qsakv_plan_destroy(auto_plan);
    char what[160];
    snprintf(what, sizeof what, "grouped: %s, %d groups", cases[i].what, pi.num_groups);
    check_world(&w, what, pi.num_splits);
    tu_world_destroy(&w);
  }
  tu_multi_row_min_rows = 0;
  qsakv_context_destroy(ctx);
}

/* Overlapping lists (the grouped route's shared and per-row parts). Three geometries: the
 * reference one (E4M3), a FP16 cache, a BF16 cache with 2 KV heads; rows_per_group is 16
 * for each, so a request of up to 16 rows is one group. Block 0 is left unmapped (and
 * NaN-poisoned) in every world here. */
static const geometry_case overlap_geometries[3] = {
    {6, 1, 256, QSAKV_DTYPE_FP16, QSAKV_DTYPE_E4M3, 64},
    {6, 1, 256, QSAKV_DTYPE_FP16, QSAKV_DTYPE_FP16, 64},
    {8, 2, 128, QSAKV_DTYPE_BF16, QSAKV_DTYPE_BF16, 16},
};

/* The old union workspace of a group (2 x topk_width + 64 entries). */
static int old_union_cap(const tu_world* w) { return 2 * w->geo.topk_width + 64; }

static const char* route_name(int min_rows) {
  return min_rows == 1 ? "grouped" : min_rows == -1 ? "decode" : "auto";
}

/* Rows of w's requests of at least `min_rows` rows. */
static int rows_in_requests_of(const tu_world* w, int min_rows) {
  int n = 0;
  for (int r = 0; r < w->shape.num_requests; ++r)
    if (w->shape.rows[r] >= min_rows) n += w->shape.rows[r];
  return n;
}

/* w over `topk` against one FP64 reference on each route of `routes` (re-planned; a CPU
 * world runs once: its backend has one route). The plan routes as asked; auto_groups: the
 * batch is past the automatic thresholds, so on the grouped route's tier auto groups
 * every request that is long enough. */
static void check_routes(tu_world* w, const char* what, const void* kv, const uint16_t* q,
                         const int32_t* topk, int64_t stride, const int* routes, int num_routes,
                         int auto_groups) {
  const size_t n = (size_t)w->rows * w->geo.q_heads * w->cfg.head_dim;
  double* ref = malloc(sizeof(double) * (n + 1));
  tu_reference_attention(w, kv, q, topk, stride, 0, ref);
  const int cuda = tu_is_cuda(w->ctx), grouped = tu_has_grouped_route(w->ctx);
  for (int i = 0; i < (cuda ? num_routes : 1); ++i) {
    if (cuda) tu_world_replan(w, routes[i], 0);
    qsakv_plan_info pi;
    memset(&pi, 0, sizeof pi);
    pi.struct_size = sizeof pi;
    TU_OK(qsakv_plan_get_info(w->plan, &pi));
    if (!cuda || !grouped || routes[i] == -1) assert_int_equal(pi.grouped_rows, 0);
    if (cuda && grouped && routes[i] == 1) assert_int_equal(pi.grouped_rows, w->rows);
    if (cuda && grouped && routes[i] == 0 && auto_groups) {
      assert_true(pi.grouped_rows > 0);
      assert_int_equal(pi.grouped_rows, rows_in_requests_of(w, pi.multi_row_min_rows));
    }
    char label[256];
    snprintf(label, sizeof label, "%s %s %s/%s kv%d: %s grouped=%d", cuda ? "cuda" : "cpu",
             cuda ? route_name(routes[i]) : "-", qsakv_dtype_name(w->cfg.activation_dtype),
             qsakv_dtype_name(w->cfg.kv_dtype), w->geo.kv_heads, what, pi.grouped_rows);
    check_run(w, label, "sparse", pi.num_splits, q, topk, stride, ref);
  }
  free(ref);
}

/* Row `row`'s list: the n_common tokens of `common` (any position: those past the row's
 * are listed and skipped) and n_private more of its own, visible to it and not marked in
 * `exclude` (the request's seq_len + 1 flags, left as they were). */
static void edge_row(const tu_world* w, int32_t* topk, int64_t stride, int row,
                     const int32_t* common, int n_common, const uint8_t* exclude, int n_private) {
  const int L = w->shape.seq_lens[tu_row_request(w, row)], width = w->geo.topk_width;
  assert_true(n_common + n_private <= width);
  uint8_t* taken = malloc((size_t)L + 1);
  memcpy(taken, exclude, (size_t)L + 1);
  int32_t* toks = malloc(sizeof(int32_t) * (size_t)width);
  if (n_common) memcpy(toks, common, sizeof(int32_t) * (size_t)n_common);
  for (int i = 0; i < n_common; ++i) taken[common[i]] = 1;
  assert_int_equal(tu_draw_tokens(tu_row_pos(w, row), taken, n_private, toks + n_common),
                   n_private);
  tu_place_list(topk + (size_t)row * stride, stride, width, toks, n_common + n_private);
  free(toks);
  free(taken);
}

/* The edge world: one group per request (up to 16 rows), each with its own pattern. */
static tu_shape edge_shape(void) {
  tu_shape s = {11,
                {16, 16, 16, 16, 7, 3, 16, 16, 16, 2, 1},
                {33000, 9000, 6000, 9000, 5000, 4000, 8000, 5000, 5000, 3000, 7000}};
  return s;
}

static const char* const edge_what =
    "edge: 16 disjoint lists of 2051 (union 32816), 2 loners among 14 identical lists, "
    "empty rows and one listing only tokens past it, shared by exactly 8 of 16 / 4 of 7 / 2 "
    "of 3 rows against 7 / 3 / 1, a causal tail listed by every row, 64 and 63 tokens shared "
    "by all, 2 identical rows, a decode row";

/* Every row's list empty (all -1), to be filled request by request. */
static int32_t* empty_topk(const tu_world* w, int64_t stride) {
  int32_t* topk = malloc(sizeof(int32_t) * ((size_t)w->rows * stride + 1));
  for (int row = 0; row < w->rows; ++row)
    tu_place_list(topk + (size_t)row * stride, stride, w->geo.topk_width, NULL, 0);
  return topk;
}

static int32_t* edge_topk(const tu_world* w, int64_t stride) {
  const int width = w->geo.topk_width;
  int32_t* topk = empty_topk(w, stride);
  int32_t* a = malloc(sizeof(int32_t) * (size_t)16 * width);
  int32_t* b = malloc(sizeof(int32_t) * (size_t)width);
  int g0 = 0;
  for (int r = 0; r < w->shape.num_requests; g0 += w->shape.rows[r++]) {
    const int n = w->shape.rows[r], L = w->shape.seq_lens[r], p0 = tu_row_pos(w, g0);
    assert_true(n <= tu_group_rows(w)); /* one group */
    uint8_t* mark = calloc((size_t)L + 1, 1);
    int order[16];
    for (int i = 0; i < n; ++i) order[i] = i;
    for (int i = n - 1; i > 0; --i) {
      const int j = tu_int(0, i), t = order[i];
      order[i] = order[j];
      order[j] = t;
    }
    switch (r) {
      case 0: /* (a) nothing shared: 16 disjoint lists of the full width */
        assert_int_equal(tu_draw_tokens(p0, mark, 16 * width, a), 16 * width);
        for (int i = 0; i < n; ++i)
          edge_row(w, topk, stride, g0 + i, a + i * width, width, mark, 0);
        break;
      case 1: /* (b) rows 3 and 11 share nothing with the others, which share everything */
        assert_int_equal(tu_draw_tokens(p0, mark, width, a), width);
        for (int i = 0; i < n; ++i)
          if (i == 3 || i == 11)
            edge_row(w, topk, stride, g0 + i, NULL, 0, mark, width);
          else
            edge_row(w, topk, stride, g0 + i, a, width, mark, 0);
        break;
      case 2: /* (c) rows 0 and 5 empty, row 9 lists only tokens past its position, the
               * others 90% shared */
        assert_int_equal(tu_draw_tokens(p0, mark, 1846, a), 1846);
        for (int i = 0; i < n; ++i)
          if (i == 9) {
            for (int t = 0; t < n - 1 - i; ++t) b[t] = p0 + i + 1 + t;
            edge_row(w, topk, stride, g0 + i, b, n - 1 - i, mark, 0);
          } else if (i != 0 && i != 5) {
            edge_row(w, topk, stride, g0 + i, a, 1846, mark, 205);
          }
        break;
      case 3: /* (d) 8 of 16 rows (the threshold) select A, 7 others B, one neither */
      case 4: /* 4 of 7 against 3 */
      case 5: /* 2 of 3 (the threshold's floor) against 1 */
      {
        const int na = r == 3 ? 1000 : r == 4 ? 800 : 1500, np = r == 5 ? 500 : 400;
        const int in_a = r == 5 ? 2 : (n + 1) / 2, in_b = r == 5 ? 1 : (n + 1) / 2 - 1;
        assert_int_equal(tu_draw_tokens(p0, mark, na, a), na);
        assert_int_equal(tu_draw_tokens(p0, mark, na, b), na);
        for (int i = 0; i < n; ++i) {
          const int row = g0 + order[i];
          if (i < in_a)
            edge_row(w, topk, stride, row, a, na, mark, np);
          else if (i < in_a + in_b)
            edge_row(w, topk, stride, row, b, na, mark, np);
          else
            edge_row(w, topk, stride, row, NULL, 0, mark, na + np);
        }
        break;
      }
      case 6: /* (e) 2000 shared tokens, and the group's causal tail (p0+1 .. its last
               * row's position) listed by every row: token p0+j is visible to n-j rows */
        assert_int_equal(tu_draw_tokens(p0, mark, 2000, a), 2000);
        for (int t = 1; t < n; ++t) a[2000 + t - 1] = p0 + t;
        for (int i = 0; i < n; ++i) edge_row(w, topk, stride, g0 + i, a, 2000 + n - 1, mark, 0);
        break;
      case 7: /* 64 tokens shared by every row, 300 private each */
      case 8: /* 63 */
        assert_int_equal(tu_draw_tokens(p0, mark, 71 - r, a), 71 - r);
        for (int i = 0; i < n; ++i) edge_row(w, topk, stride, g0 + i, a, 71 - r, mark, 300);
        break;
      case 9: /* two rows, one list */
        assert_int_equal(tu_draw_tokens(p0, mark, width, a), width);
        for (int i = 0; i < n; ++i) edge_row(w, topk, stride, g0 + i, a, width, mark, 0);
        break;
      default: /* a decode row */
        edge_row(w, topk, stride, g0, NULL, 0, mark, width);
        break;
    }
    free(mark);
  }
  free(a);
  free(b);
  return topk;
}

/* Lists whose groups span several union windows (`window` positions each: the union
 * kernel's variant for several windows). share_window[r] says where request r's rows share
 * tokens: -1 nowhere (disjoint lists, so no window lists), else only in that window (min(1000,
 * width / 2) tokens shared by all its rows; each row also has 100 tokens of its own there and
 * the rest of its list elsewhere). A request whose first listing window is not the first
 * makes the kernel write the earlier windows' own entries after it finds that window
 * (grouped_union.cuh). One-row requests get decode rows. */
static int32_t* window_wait_topk(const tu_world* w, int64_t stride, int window,
                                 const int* share_window) {
  const int width = w->geo.topk_width, n_shared = width / 2 < 1000 ? width / 2 : 1000;
  const int n_inside = 100;
  int32_t* topk = empty_topk(w, stride);
  int32_t* a = malloc(sizeof(int32_t) * (size_t)16 * width);
  int32_t* own = malloc(sizeof(int32_t) * (size_t)width);
  int g0 = 0;
  for (int r = 0; r < w->shape.num_requests; g0 += w->shape.rows[r++]) {
    const int n = w->shape.rows[r], L = w->shape.seq_lens[r], p0 = tu_row_pos(w, g0);
    uint8_t* mark = calloc((size_t)L + 1, 1);
    if (n == 1) {
      edge_row(w, topk, stride, g0, NULL, 0, mark, width);
    } else if (share_window[r] < 0) { /* disjoint lists of the full width, anywhere */
      assert_int_equal(tu_draw_tokens(p0, mark, n * width, a), n * width);
      for (int i = 0; i < n; ++i) edge_row(w, topk, stride, g0 + i, a + i * width, width, mark, 0);
    } else {
      /* The shared tokens and each row's n_inside from the window only (every other
       * position marked taken for those draws), then the row's others from elsewhere. */
      const int lo = share_window[r] * window, hi = lo + window - 1;
      assert_true(p0 > lo + n_shared + 16 * n_inside);
      for (int t = 0; t <= L; ++t) mark[t] = t < lo || t > hi;
      assert_int_equal(tu_draw_tokens(p0, mark, n_shared, a), n_shared);
      for (int i = 0; i < n; ++i) {
        memcpy(own, a, sizeof(int32_t) * (size_t)n_shared);
        uint8_t* in_window = malloc((size_t)L + 1);
        memcpy(in_window, mark, (size_t)L + 1); /* the window, less the shared tokens */
        assert_int_equal(tu_draw_tokens(p0, in_window, n_inside, own + n_shared), n_inside);
        free(in_window);
        uint8_t* outside = malloc((size_t)L + 1);
        for (int t = 0; t <= L; ++t) outside[t] = t >= lo && t <= hi;
        edge_row(w, topk, stride, g0 + i, own, n_shared + n_inside, outside,
                 width - n_shared - n_inside);
        free(outside);
      }
    }
    free(mark);
  }
  free(own);
  free(a);
  return topk;
}

/* One world of a model of max_model_len tokens (block 0 unmapped): the lists of
 * window_wait_topk (share_window[r]: the 64K window of request r's shared tokens, -1:
 * disjoint lists), then those of overlap fs[k] over the whole context, each on every
 * route against FP64. */
static void window_cases(qsakv_context* ctx, const qsakv_model_config* c, int max_model_len,
                         const tu_shape* shape, int stride_pad, const int* share_window,
                         const char* what, const double* fs, int num_fs) {
  const int routes[3] = {1, -1, 0};
  qsakv_model_config cw = *c;
  cw.max_model_len = max_model_len;
  tu_world w;
  tu_world_build(&w, ctx, &cw, shape, tu_next(), 2.0f, 0.01f, 0.008f, 0);
  tu_assert_block0_unmapped(&w);
  void* kv = tu_world_read_kv(&w);
  uint16_t* q = random_q(&w);
  const int64_t stride = w.geo.topk_width + stride_pad;
  int32_t* topk = window_wait_topk(&w, stride, 65536, share_window);
  check_routes(&w, what, kv, q, topk, stride, routes, 3, 0);
  free(topk);
  for (int k = 0; k < num_fs; ++k) {
    topk = tu_overlap_topk(&w, stride, fs[k], w.geo.topk_width);
    char label[96];
    snprintf(label, sizeof label, "the same %d requests (model of %d tokens), f=%.2f",
             shape->num_requests, max_model_len, fs[k]);
    check_routes(&w, label, kv, q, topk, stride, routes, 3, 0);
    free(topk);
  }
  free(q);
  free(kv);
  tu_world_destroy(&w);
}

/* The overlap worlds of one geometry on ctx, each on routes 1 (grouped), -1 (decode) and 0
 * (auto). full: every overlap of the main world, the automatic routing's world and (with
 * long_context) the long one; otherwise (the CPU backend's check of the lists) overlaps
 * 0.9 and 0 of the main world and the edge cases. */
static void overlap_geometry(qsakv_context* ctx, const geometry_case* g, int full,
                             int long_context) {
  const int routes[3] = {1, -1, 0};
  qsakv_model_config c;
  config_for(&c, g);
  c.max_batched_tokens = 4096;
  const double all_fs[4] = {1.0, 0.9, 0.5, 0.0}, some_fs[2] = {0.9, 0.0};
  const double* fs = full ? all_fs : some_fs;
  tu_reserve_block0 = 1;
  tu_multi_row_min_rows = 1;
  /* A 40-row request at ~9000 tokens (groups of 16, 16, 8), a 16-row one, a decode row:
   * lists of close to the full width. */
  {
    tu_shape shape = {3, {40, 16, 1}, {9000, 3000, 5000}};
    tu_world w;
    tu_world_build(&w, ctx, &c, &shape, tu_next(), 2.0f, 0.01f, 0.008f, 0);
    tu_assert_block0_unmapped(&w);
    void* kv = tu_world_read_kv(&w);
    uint16_t* q = random_q(&w);
    for (int k = 0; k < (full ? 4 : 2); ++k) {
      const int64_t stride = w.geo.topk_width + tu_int(0, 5);
      const int len = w.geo.topk_width - tu_int(0, 2);
      int32_t* topk = tu_overlap_topk(&w, stride, fs[k], len);
      const int u = tu_max_window_union(&w, topk, stride);
      if (fs[k] == 0.0) assert_true(u > old_union_cap(&w));
      char what[96];
      snprintf(what, sizeof what, "40+16+1 rows, f=%.2f, len %d, union<=%d", fs[k], len, u);
      check_routes(&w, what, kv, q, topk, stride, routes, 3, 0);
      free(topk);
    }
    free(q);
    free(kv);
    tu_world_destroy(&w);
  }
  /* The edge cases, in the model's length and in one of 98304 tokens: past one 64K union
   * window, so on GPUs with the shared memory for it the union kernel's wide variant takes
   * them (3 count words a thread; the loners are its moved rows). */
  for (int m = 0; m < 2; ++m) {
    qsakv_model_config cm = c;
    if (m) cm.max_model_len = 98304;
    tu_shape shape = edge_shape();
    tu_world w;
    tu_world_build(&w, ctx, &cm, &shape, tu_next(), 2.0f, 0.01f, 0.008f, 0);
    tu_assert_block0_unmapped(&w);
    void* kv = tu_world_read_kv(&w);
    uint16_t* q = random_q(&w);
    const int64_t stride = w.geo.topk_width + 3;
    int32_t* topk = edge_topk(&w, stride);
    assert_int_equal(tu_max_window_union(&w, topk, stride), 16 * w.geo.topk_width);
    if (!m) print_message("%s\n", edge_what);
    check_routes(&w,
                 m ? "edge cases (11 groups), a model of 98304 tokens" : "edge cases (11 groups)",
                 kv, q, topk, stride, routes, 3, 0);
    free(topk);
    free(q);
    free(kv);
    tu_world_destroy(&w);
  }
  /* Enough rows for the automatic routing to group them (docs/attention.md: 256 rows in
   * long enough requests for E4M3, 128 for 16-bit caches), shorter lists. */
  if (full) {
    const int e4m3 = g->kv == QSAKV_DTYPE_E4M3;
    tu_shape shape = {3, {e4m3 ? 200 : 100, e4m3 ? 57 : 29, 1}, {6000, 3000, 4000}};
    tu_world w;
    tu_world_build(&w, ctx, &c, &shape, tu_next(), 2.0f, 0.01f, 0.008f, 0);
    tu_assert_block0_unmapped(&w);
    void* kv = tu_world_read_kv(&w);
    uint16_t* q = random_q(&w);
    const double auto_fs[2] = {0.9, 0.0};
    for (int k = 0; k < 2; ++k) {
      const int64_t stride = w.geo.topk_width + tu_int(0, 5);
      int32_t* topk = tu_overlap_topk(&w, stride, auto_fs[k], 384);
      char what[96];
      snprintf(what, sizeof what, "%d rows, f=%.2f, len 384, union<=%d", w.rows, auto_fs[k],
               tu_max_window_union(&w, topk, stride));
      check_routes(&w, what, kv, q, topk, stride, routes, 3, 1);
      free(topk);
    }
    free(q);
    free(kv);
    tu_world_destroy(&w);
  }
  /* Past one union window (the union kernel's bitmap covers 65536 positions a pass). */
  if (full && long_context) {
    c.max_model_len = 1 << 18;
    tu_shape shape = {2, {16, 1}, {140000, 3000}};
    tu_world w;
    tu_world_build(&w, ctx, &c, &shape, tu_next(), 2.0f, 0.01f, 0.008f, 0);
    tu_assert_block0_unmapped(&w);
    void* kv = tu_world_read_kv(&w);
    uint16_t* q = random_q(&w);
    const int64_t stride = w.geo.topk_width;
    int32_t* topk = tu_overlap_topk(&w, stride, 0.5, w.geo.topk_width);
    check_routes(&w, "16 rows at 140000 tokens + 1, f=0.50", kv, q, topk, stride, routes, 3, 0);
    free(topk);
    free(q);
    free(kv);
    tu_world_destroy(&w);
  }
  /* Groups over three union windows that wait for a window that lists: none does, the
   * last does, the middle one does. (Also on the CPU backend: the lists' own check.) */
  if (!full || long_context) {
    const tu_shape shape = {4, {16, 16, 16, 1}, {140000, 140000, 140000, 3000}};
    const int share_window[4] = {-1, 2, 1, -1};
    window_cases(ctx, &c, 1 << 18, &shape, 2, share_window,
                 "3 x 16 rows at 140000 tokens (3 union windows: none lists / the last lists /"
                 " the middle lists) + 1",
                 NULL, 0);
  }
  /* A model of 131072 tokens: where a CTA can have ~200 KB of shared memory (SM90, SM100)
   * the union kernel's wide variant takes each group as one window of counts
   * (docs/attention.md), elsewhere the 64K windows do. Groups sharing only past position
   * 65535 (offsets past 16 bits), only below it, nothing, and then f = 1, 0.5 and 0 over
   * the whole context. */
  if (!full || long_context) {
    const tu_shape shape = {4, {16, 16, 16, 1}, {131072, 120000, 100000, 3000}};
    const int share_window[4] = {1, 0, -1, -1};
    const double wide_fs[3] = {1.0, 0.5, 0.0};
    window_cases(ctx, &c, 1 << 17, &shape, 1, share_window,
                 "16 rows at 131072 tokens sharing past 65535, 16 at 120000 sharing below it, "
                 "16 at 100000 sharing nothing + 1 (a model of 131072 tokens)",
                 wide_fs, full ? 3 : 0);
  }
  /* Lists wider than one pass of the union kernel's registers (2304 entries a row: each
   * phase reloads its pass), in one window and in two. */
  if (full && long_context) {
    const int lens[2] = {1 << 16, 1 << 18};
    for (int m = 0; m < 2; ++m) {
      qsakv_model_config cw = c;
      cw.max_model_len = lens[m];
      cw.topk_tokens = 3072;
      tu_shape shape = {2, {16, 1}, {m ? 70000 : 9000, 4000}};
      tu_world w;
      tu_world_build(&w, ctx, &cw, &shape, tu_next(), 2.0f, 0.01f, 0.008f, 0);
      tu_assert_block0_unmapped(&w);
      void* kv = tu_world_read_kv(&w);
      uint16_t* q = random_q(&w);
      const int64_t stride = w.geo.topk_width + 1;
      for (int k = 0; k < 2; ++k) {
        const double f = k ? 0.5 : 1.0;
        int32_t* topk = tu_overlap_topk(&w, stride, f, w.geo.topk_width);
        char what[96];
        snprintf(what, sizeof what, "16 rows of width %d at %d tokens + 1, f=%.2f",
                 (int)w.geo.topk_width, shape.seq_lens[0], f);
        check_routes(&w, what, kv, q, topk, stride, routes, 3, 0);
        free(topk);
      }
      if (m) { /* two windows, several passes: shared only in the second (a late listing) */
        const int share_window[2] = {1, -1};
        int32_t* topk = window_wait_topk(&w, stride, 65536, share_window);
        char what[96];
        snprintf(what, sizeof what, "16 rows of width %d at %d tokens + 1, shared in window 1",
                 (int)w.geo.topk_width, shape.seq_lens[0]);
        check_routes(&w, what, kv, q, topk, stride, routes, 3, 0);
        free(topk);
      }
      free(q);
      free(kv);
      tu_world_destroy(&w);
    }
  }
  tu_reserve_block0 = 0;
  tu_multi_row_min_rows = 0;
}

/* The lists and the reference on the CPU backend (the reference geometry: the backend
 * computes each row on its own, so the overlap changes nothing there but the lists). */
static void test_cpu_overlap(void** state) {
  (void)state;
  qsakv_context* ctx = tu_context(QSAKV_BACKEND_CPU);
  overlap_geometry(ctx, &overlap_geometries[0], 0, 0);
  qsakv_context_destroy(ctx);
}

/* Lists of overlap f = 1, 0.9, 0.5 and 0 and the edge cases on every route against FP64:
 * the grouped route's shared tokens (those many rows of a group select) and each row's
 * others must give each row its own list's attention, whatever the overlap; unions far
 * past the old workspace (2 x 2051 + 64) included. */
static void test_cuda_overlap(void** state) {
  (void)state;
  qsakv_context* ctx = tu_cuda_context_or_skip();
  if (!tu_has_grouped_route(ctx))
    fprintf(stderr, "the SM70 kernel tier has no grouped route: every route is the decode one\n");
  for (int i = 0; i < 3; ++i) overlap_geometry(ctx, &overlap_geometries[i], 1, i == 0);
  qsakv_context_destroy(ctx);
}

/* The same world on several contexts: the CUDA backend against the CPU backend (relative
 * L2), the software and hardware decoders against each other (bit for bit), and split
 * counts 1, 16 and automatic (relative L2). The E4M3 kernel's paths (use_ring in
 * kernels/cuda/decode_attention.cu) on an SM90+ GPU of 132 SMs: 16 splits of the sparse
 * lists (129 entries each) take the copy ring, 1 split and automatic splits the register
 * path; a plan for 128 rows with 4 splits (512 CTAs: three per SM and more) the ring, with
 * two windows per dense split (up to 750 entries) and the rows past the batch idle; the
 * same plan with 3 splits (384 CTAs, fewer than three per SM) the register path with most
 * SMs holding three CTAs. */
static void test_cuda_matches_cpu_and_decoders_agree(void** state) {
  (void)state;
  qsakv_context* gpu = tu_cuda_context_or_skip();
  qsakv_context_info info;
  memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  TU_OK(qsakv_context_get_info(gpu, &info));
  qsakv_context* cpu = tu_context(QSAKV_BACKEND_CPU);
  qsakv_context* sw = software_decoder_context();
  const qsakv_dtype acts[2] = {QSAKV_DTYPE_FP16, QSAKV_DTYPE_BF16};
  for (int a = 0; a < 2; ++a) {
    geometry_case gc = {6, 1, 256, acts[a], QSAKV_DTYPE_E4M3, 64};
    qsakv_model_config c;
    config_for(&c, &gc);
    tu_shape shape = mixed_49();
    const uint64_t seed = tu_next();
    tu_world wc, wg, ws, w1, w16, w4, w3;
    tu_world_build(&wc, cpu, &c, &shape, seed, 2.0f, 0.01f, 0.008f, 0);
    tu_world_build(&wg, gpu, &c, &shape, seed, 2.0f, 0.01f, 0.008f, 0);
    tu_world_build(&ws, sw, &c, &shape, seed, 2.0f, 0.01f, 0.008f, 0);
    tu_world_build(&w1, gpu, &c, &shape, seed, 2.0f, 0.01f, 0.008f, 1);
    tu_world_build(&w16, gpu, &c, &shape, seed, 2.0f, 0.01f, 0.008f, 16);
    tu_plan_max_rows = 128;
    tu_world_build(&w4, gpu, &c, &shape, seed, 2.0f, 0.01f, 0.008f, 4);
    tu_world_build(&w3, gpu, &c, &shape, seed, 2.0f, 0.01f, 0.008f, 3);
    tu_plan_max_rows = 0;
    const size_t n = (size_t)wc.rows * wc.geo.q_heads * c.head_dim;
    uint16_t* q = random_q(&wc);
    for (int dense = 0; dense <= 1; ++dense) {
      const int64_t stride = wc.geo.topk_width;
      int32_t* topk = dense ? NULL : random_topk(&wc, stride);
      double* rc = run_attention(&wc, q, topk, stride, dense);
      double* rg = run_attention(&wg, q, topk, stride, dense);
      double* rs = run_attention(&ws, q, topk, stride, dense);
      double* r1 = run_attention(&w1, q, topk, stride, dense);
      double* r16 = run_attention(&w16, q, topk, stride, dense);
      double* r4 = run_attention(&w4, q, topk, stride, dense);
      double* r3 = run_attention(&w3, q, topk, stride, dense);
      const double e_cpu = tu_rel_l2(rc, rg, n), e_split = tu_rel_l2(r1, rg, n);
      const double e_16 = tu_rel_l2(rc, r16, n), e_4 = tu_rel_l2(rc, r4, n);
      const double e_3 = tu_rel_l2(rc, r3, n);
      size_t differ = 0;
      for (size_t i = 0; i < n; ++i) differ += memcmp(&rg[i], &rs[i], sizeof(double)) != 0;
      print_message(
          "%s %s: cuda vs cpu rel_l2=%.3e, splits 1 vs auto rel_l2=%.3e, 16 splits vs cpu "
          "rel_l2=%.3e, 128-row plan with 4 / 3 splits vs cpu rel_l2=%.3e / %.3e, hw vs sw "
          "decoder: %zu of %zu outputs differ (decoder %s)\n",
          qsakv_dtype_name(acts[a]), dense ? "dense" : "sparse", e_cpu, e_split, e_16, e_4, e_3,
          differ, n, info.decoder == QSAKV_DECODER_HARDWARE ? "hw" : "sw");
      assert_true(e_cpu <= bound_for(acts[a]));
      assert_true(e_split <= bound_for(acts[a]));
      assert_true(e_16 <= bound_for(acts[a]));
      assert_true(e_4 <= bound_for(acts[a]));
      assert_true(e_3 <= bound_for(acts[a]));
      assert_int_equal(differ, 0);
      free(rc);
      free(rg);
      free(rs);
      free(r1);
      free(r16);
      free(r4);
      free(r3);
      free(topk);
    }
    free(q);
    tu_world_destroy(&wc);
    tu_world_destroy(&wg);
    tu_world_destroy(&ws);
    tu_world_destroy(&w1);
    tu_world_destroy(&w16);
    tu_world_destroy(&w4);
    tu_world_destroy(&w3);
  }
  qsakv_context_destroy(sw);
  qsakv_context_destroy(cpu);
  qsakv_context_destroy(gpu);
}

/* Overwrites two tokens of request 0 (300 tokens, rows at 297..299) through the store, so
 * the layer's NaN flag is set as in real use: token 298 with a NaN K element (rows 298
 * and 299 attend to it: all their outputs NaN) and token 9 with a NaN V element in dim 17
 * (row 297 sees only that: NaN in dim 17 of every head, finite elsewhere). */
static void store_nan_tokens(tu_world* w) {
  const int row = w->geo.kv_heads * w->cfg.head_dim;
  const int toks[2] = {298, 9};
  uint16_t* k = malloc(2 * (size_t)row * 2);
  uint16_t* v = malloc(2 * (size_t)row * 2);
  int64_t slots[2];
  for (int i = 0; i < 2; ++i) {
    slots[i] = (int64_t)w->block_table[toks[i] / w->cfg.block_size] * w->cfg.block_size +
               toks[i] % w->cfg.block_size;
    for (int e = 0; e < row; ++e) {
      k[i * row + e] = tu_f32_to_act(0.25f, w->cfg.activation_dtype);
      v[i * row + e] = tu_f32_to_act(-0.5f, w->cfg.activation_dtype);
    }
  }
  k[0 * row + 3] = 0x7E00;  /* token 5: a NaN K element */
  v[1 * row + 17] = 0xFE00; /* token 9: a NaN V element (dim 17), sign set */
  void* dk = tu_to_device(w->ctx, k, 2 * (size_t)row * 2);
  void* dv = tu_to_device(w->ctx, v, 2 * (size_t)row * 2);
  void* ds = tu_to_device(w->ctx, slots, sizeof slots);
  TU_OK(qsakv_store_kv(w->cache, w->layer, dk, dv, ds, 2, NULL));
  TU_OK(qsakv_stream_synchronize(w->ctx, NULL));
  qsakv_free(w->ctx, dk);
  qsakv_free(w->ctx, dv);
  qsakv_free(w->ctx, ds);
  free(k);
  free(v);
}

/* E4M3 NaN codes in the cache propagate exactly: on the CPU, the expected outputs and only
 * those are NaN; on a GPU, the software decoder (which patches NaN codes only where a store
 * flagged one) and the hardware decoder give the same outputs bit for bit, the same NaN
 * positions as the CPU backend, and the finite outputs match it within the usual bound. */
/* The NaN world of store_nan_tokens on `ctx` (dense attention: every row sees every
 * earlier token); returns its outputs as FP64, *n their count. */
static double* nan_world_outputs(qsakv_context* ctx, qsakv_dtype kv, uint64_t seed,
                                 const uint16_t* q_in, uint16_t** q_out, size_t* n,
                                 int num_splits) {
  geometry_case gc = {6, 1, 256, QSAKV_DTYPE_FP16, kv, 64};
  qsakv_model_config c;
  config_for(&c, &gc);
  tu_shape shape = {2, {3, 2}, {300, 200}};
  tu_world w;
  tu_world_build(&w, ctx, &c, &shape, seed, 2.0f, 0.01f, 0.008f, num_splits);
  store_nan_tokens(&w);
  *n = (size_t)w.rows * w.geo.q_heads * c.head_dim;
  uint16_t* q = q_in ? (uint16_t*)q_in : random_q(&w);
  double* r = run_attention(&w, q, NULL, 0, 1);
  if (q_out) *q_out = q;
  tu_world_destroy(&w);
  return r;
}

static void test_nan_codes_cpu(void** state) {
  (void)state;
  qsakv_context* cpu = tu_context(QSAKV_BACKEND_CPU);
  uint16_t* q = NULL;
  size_t n = 0, nan_c = 0;
  double* r = nan_world_outputs(cpu, QSAKV_DTYPE_E4M3, tu_next(), NULL, &q, &n, 0);
  for (size_t i = 0; i < n; ++i) nan_c += isnan(r[i]);
  print_message("NaN codes: %zu of %zu CPU outputs NaN\n", nan_c, n);
  /* 2 rows x 6 heads x 256 (the K NaN) + 1 row x 6 heads x dim 17 (the V NaN) */
  assert_int_equal(nan_c, 2 * 6 * 256 + 6);
  free(r);
  free(q);
  qsakv_context_destroy(cpu);
}

/* On both routes (the grouped route reads tokens for all rows of a group at once: a NaN
 * must still reach only the rows that select it), for E4M3 codes and FP16 values, with
 * the GPU's plan sized for plan_rows (0: the batch's 5) and num_splits (0: automatic).
 * On an SM90+ GPU of 132 SMs the decode kernel takes for E4M3: 256 rows x 2 splits (512
 * CTAs) the copy ring; 128 rows x 3 splits (384 CTAs) and the batch's own plan the
 * register path, with three CTAs on most SMs and with few CTAs. */
static void nan_codes_on_gpu(qsakv_dtype kv, int min_rows, int plan_rows, int num_splits) {
  qsakv_context* gpu = tu_cuda_context_or_skip();
  qsakv_context* cpu = tu_context(QSAKV_BACKEND_CPU);
  qsakv_context* sw = software_decoder_context();
  const uint64_t seed = tu_next();
  uint16_t* q = NULL;
  size_t n = 0, nan_mismatch = 0, differ = 0, finite = 0;
  tu_multi_row_min_rows = min_rows;
  double* rc = nan_world_outputs(cpu, kv, seed, NULL, &q, &n, 0);
  tu_plan_max_rows = plan_rows;
  double* rg = nan_world_outputs(gpu, kv, seed, q, NULL, &n, num_splits);
  double* rs = nan_world_outputs(sw, kv, seed, q, NULL, &n, num_splits);
  tu_plan_max_rows = 0;
  tu_multi_row_min_rows = 0;
  double* fc = malloc(sizeof(double) * n);
  double* fg = malloc(sizeof(double) * n);
  for (size_t i = 0; i < n; ++i) {
    nan_mismatch += isnan(rc[i]) != isnan(rg[i]);
    differ += memcmp(&rg[i], &rs[i], sizeof(double)) != 0 && !(isnan(rg[i]) && isnan(rs[i]));
    if (!isnan(rc[i]) && !isnan(rg[i])) {
      fc[finite] = rc[i];
      fg[finite++] = rg[i];
    }
  }
  const double err = tu_rel_l2(fc, fg, finite);
  print_message(
      "NaN %s on the GPU, %s route, plan rows %d, splits %d: %zu NaN-position mismatches vs "
      "CPU; %zu outputs differ hw vs sw; finite outputs rel_l2=%.3e\n",
      kv == QSAKV_DTYPE_E4M3 ? "codes" : "FP16 values", min_rows == 1 ? "grouped" : "decode",
      plan_rows, num_splits, nan_mismatch, differ, err);
  assert_int_equal(nan_mismatch, 0);
  assert_int_equal(differ, 0);
  assert_true(err <= bound_for(QSAKV_DTYPE_FP16));
  free(fc);
  free(fg);
  free(rc);
  free(rg);
  free(rs);
  free(q);
  qsakv_context_destroy(sw);
  qsakv_context_destroy(cpu);
  qsakv_context_destroy(gpu);
}

static void test_cuda_nan_codes(void** state) {
  (void)state;
  const qsakv_dtype kvs[2] = {QSAKV_DTYPE_E4M3, QSAKV_DTYPE_FP16};
  for (int k = 0; k < 2; ++k) {
    nan_codes_on_gpu(kvs[k], -1, 0, 0);
    nan_codes_on_gpu(kvs[k], -1, 256, 2);
    nan_codes_on_gpu(kvs[k], -1, 128, 3);
    nan_codes_on_gpu(kvs[k], 1, 0, 0);
  }
}

/* The refusals of plan and attention calls, one behaviour each, on a CPU cache of 8
 * blocks (4 query heads, 2 KV heads, dim 64, 16-token blocks) and a plan of 8 rows. */
typedef struct plan_fixture {
  qsakv_context* ctx;
  qsakv_model_config c;
  qsakv_cache* cache;
  qsakv_plan* plan;
  /* A batch of two requests (4 and 5 rows: one more than the plan holds) over 10 and 20
   * tokens, one and two pages of a 4-page block table. */
  int32_t qs[3], lens[2], bt[2 * 4];
  qsakv_batch b;
  uint16_t q[8 * 4 * 64], out[8 * 4 * 64];
} plan_fixture;

static int plan_setup(void** state) {
  plan_fixture* f = calloc(1, sizeof *f);
  if (!f) return -1;
  f->ctx = tu_context(QSAKV_BACKEND_CPU);
  tu_small_config(&f->c, 4, 2, 64, QSAKV_DTYPE_FP16, QSAKV_DTYPE_FP16, 16);
  qsakv_cache_options co = QSAKV_CACHE_OPTIONS_INIT;
  co.num_blocks = 8;
  TU_OK(qsakv_cache_create(&f->cache, f->ctx, &f->c, NULL, &co));
  qsakv_plan_options po = QSAKV_PLAN_OPTIONS_INIT;
  po.max_rows = 8;
  TU_OK(qsakv_plan_create(&f->plan, f->cache, &po));
  const int32_t qs[3] = {0, 4, 9}, lens[2] = {10, 20}, bt[2 * 4] = {0, -1, -1, -1, 1, 2, -1, -1};
  memcpy(f->qs, qs, sizeof qs);
  memcpy(f->lens, lens, sizeof lens);
  memcpy(f->bt, bt, sizeof bt);
  const qsakv_batch b = QSAKV_BATCH_INIT;
  f->b = b;
  f->b.num_requests = 2;
  f->b.query_start = f->qs;
  f->b.seq_lens = f->lens;
  f->b.block_table = f->bt;
  f->b.block_table_stride = 4;
  *state = f;
  return 0;
}

static int plan_teardown(void** state) {
  plan_fixture* f = *state;
  qsakv_plan_destroy(f->plan);
  qsakv_cache_destroy(f->cache);
  qsakv_context_destroy(f->ctx);
  free(f);
  return 0;
}

static void test_plan_create_refuses_more_rows_than_the_config(void** state) {
  plan_fixture* f = *state;
  qsakv_plan_options po = QSAKV_PLAN_OPTIONS_INIT;
  po.max_rows = f->c.max_batched_tokens + 1;
  qsakv_plan* plan = NULL;
  TU_EXPECT_STATUS(qsakv_plan_create(&plan, f->cache, &po), QSAKV_ERROR_INVALID_ARGUMENT);
  assert_null(plan);
}

static void test_run_before_any_update_is_a_state_error(void** state) {
  plan_fixture* f = *state;
  TU_EXPECT_STATUS(
      qsakv_attention_run(f->plan, 7, QSAKV_ATTENTION_DENSE, f->q, NULL, 0, f->out, NULL),
      QSAKV_ERROR_STATE);
}

static void test_update_refuses_more_rows_than_the_plan(void** state) {
  plan_fixture* f = *state;
  TU_EXPECT_STATUS(qsakv_plan_update(f->plan, &f->b, NULL),
                   QSAKV_ERROR_INVALID_ARGUMENT); /* 9 > 8 rows */
  assert_non_null(strstr(qsakv_last_error(), "max_rows"));
}

static void test_update_refuses_fewer_tokens_than_rows(void** state) {
  plan_fixture* f = *state;
  f->qs[2] = 8;
  f->lens[0] = 3; /* 4 rows */
  TU_EXPECT_STATUS(qsakv_plan_update(f->plan, &f->b, NULL), QSAKV_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(qsakv_last_error(), "seq_lens[0]"));
}

static void test_update_refuses_a_block_table_too_narrow(void** state) {
  plan_fixture* f = *state;
  f->qs[2] = 8;
  f->b.block_table_stride = 1; /* 20 tokens need 2 pages of 16 */
  TU_EXPECT_STATUS(qsakv_plan_update(f->plan, &f->b, NULL), QSAKV_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(qsakv_last_error(), "block_table_stride"));
}

static void test_run_refuses_bad_arguments(void** state) {
  plan_fixture* f = *state;
  f->qs[2] = 8;
  TU_OK(qsakv_plan_update(f->plan, &f->b, NULL));
  TU_EXPECT_STATUS(
      qsakv_attention_run(f->plan, 5, QSAKV_ATTENTION_DENSE, f->q, NULL, 0, f->out, NULL),
      QSAKV_ERROR_INVALID_ARGUMENT); /* not a QSA layer */
  TU_EXPECT_STATUS(
      qsakv_attention_run(f->plan, 7, (qsakv_attention_mode)3, f->q, NULL, 0, f->out, NULL),
      QSAKV_ERROR_INVALID_ARGUMENT);
  static int32_t topk[8 * 2051];
  TU_EXPECT_STATUS(
      qsakv_attention_run(f->plan, 7, QSAKV_ATTENTION_SPARSE, f->q, topk, 2050, f->out, NULL),
      QSAKV_ERROR_INVALID_ARGUMENT); /* stride below the width */
  TU_EXPECT_STATUS(
      qsakv_attention_run(f->plan, 7, QSAKV_ATTENTION_DENSE, NULL, NULL, 0, f->out, NULL),
      QSAKV_ERROR_INVALID_ARGUMENT);
}

/* multi_row_min_rows: -1, 0 and n >= 1 are accepted, anything below -1 refused; the CPU
 * backend has no grouped route (plan_info says so; every row computes there anyway). */
static void test_plan_multi_row_option(void** state) {
  plan_fixture* f = *state;
  qsakv_plan_options po = QSAKV_PLAN_OPTIONS_INIT;
  qsakv_plan* p = NULL;
  po.multi_row_min_rows = -2;
  TU_EXPECT_STATUS(qsakv_plan_create(&p, f->cache, &po), QSAKV_ERROR_INVALID_ARGUMENT);
  assert_null(p);
  assert_non_null(strstr(qsakv_last_error(), "multi_row_min_rows is -2"));
  const int ok[3] = {-1, 0, 5};
  for (int i = 0; i < 3; ++i) {
    po.multi_row_min_rows = ok[i];
    TU_OK(qsakv_plan_create(&p, f->cache, &po));
    TU_OK(qsakv_plan_update(p, &f->b, NULL));
    qsakv_plan_info pi;
    memset(&pi, 0, sizeof pi);
    pi.struct_size = sizeof pi;
    TU_OK(qsakv_plan_get_info(p, &pi));
    assert_int_equal(pi.rows_per_group, 0);
    assert_int_equal(pi.multi_row_min_rows, -1);
    assert_int_equal(pi.num_groups, 0);
    assert_int_equal(pi.grouped_rows, 0);
    qsakv_plan_destroy(p);
  }
}

#define P(f) cmocka_unit_test_setup_teardown(f, plan_setup, plan_teardown)

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cpu_against_fp64),
      cmocka_unit_test(test_cuda_against_fp64),
      cmocka_unit_test(test_cuda_grouped_paths),
      cmocka_unit_test(test_cpu_overlap),
      cmocka_unit_test(test_cuda_overlap),
      cmocka_unit_test(test_cuda_matches_cpu_and_decoders_agree),
      cmocka_unit_test(test_nan_codes_cpu),
      cmocka_unit_test(test_cuda_nan_codes),
      P(test_plan_create_refuses_more_rows_than_the_config),
      P(test_run_before_any_update_is_a_state_error),
      P(test_update_refuses_more_rows_than_the_plan),
      P(test_update_refuses_fewer_tokens_than_rows),
      P(test_update_refuses_a_block_table_too_narrow),
      P(test_run_refuses_bad_arguments),
      P(test_plan_multi_row_option),
  };
  tu_apply_filter();
  return cmocka_run_group_tests_name("attention", tests, NULL, NULL);
}
