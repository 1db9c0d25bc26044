// SPDX-License-Identifier: Apache-2.0
/* A populated cache for selection and attention tests: random requests, pages on random
 * distinct physical blocks, every unused byte NaN-poisoned, K/V and compressed keys
 * stored through the library, and a plan updated with the batch. The same data seed on
 * two contexts (CPU and CUDA) builds identical worlds. */
#ifndef QSAKV_TEST_SCENARIO_H
#define QSAKV_TEST_SCENARIO_H

#include "testutil.h"

#define TU_MAX_REQ 64

typedef struct {
  int num_requests;
  int rows[TU_MAX_REQ];     /* query rows of each request (0 allowed) */
  int seq_lens[TU_MAX_REQ]; /* tokens after this step */
} tu_shape;

typedef struct {
  qsakv_context* ctx;
  qsakv_model_config cfg;
  qsakv_rank_geometry geo;
  qsakv_cache_layout layout;
  qsakv_cache* cache;
  qsakv_overlay* overlay;
  qsakv_plan* plan;
  tu_shape shape;
  int rows;
  int layer; /* the model layer under test */
  int bt_stride;
  int32_t* block_table; /* host copy */
  void* block_table_dev;
  float k_scale, v_scale;
} tu_world;

/* The plan option multi_row_min_rows of the next worlds built (default 0: automatic). */
extern int tu_multi_row_min_rows;
/* The plan option max_rows of the next worlds built (default 0: their own row count). */
extern int tu_plan_max_rows;
/* Nonzero: the next worlds built map no page to physical block 0, which stays
 * NaN-poisoned (a route that reads offset 0 for a token it should skip or mask reads NaN). */
extern int tu_reserve_block0;
/* Zero: the next worlds built store no K/V (the layer's K/V stay NaN-poisoned), only the
 * compressed keys. For suites that only select: drawing random K/V for every token was
 * most of their run time (default 1). */
extern int tu_store_kv;

/* Builds everything; k_scale/v_scale are used for E4M3 caches. amplitude scales K/V. */
void tu_world_build(tu_world* w, qsakv_context* ctx, const qsakv_model_config* cfg,
                    const tu_shape* shape, uint64_t data_seed, float amplitude, float k_scale,
                    float v_scale, int num_splits);
void tu_world_destroy(tu_world* w);
/* Replaces w's plan by a new one (multi_row_min_rows and num_splits as given, max_rows as
 * tu_plan_max_rows), updated with w's whole batch: the same world on another route. */
void tu_world_replan(tu_world* w, int multi_row_min_rows, int num_splits);

/* Query position of each row (host), request of each row. */
int tu_row_pos(const tu_world* w, int row);
int tu_row_request(const tu_world* w, int row);

/* The whole main cache of the layer under test, read back to the host. */
void* tu_world_read_kv(const tu_world* w);
/* FP64 reference attention from the cache bytes (an independent decoder). topk may be
 * NULL for dense. out: [rows, q_heads, head_dim]. */
void tu_reference_attention(const tu_world* w, const void* kv_host, const uint16_t* q,
                            const int32_t* topk, int64_t topk_stride, int dense, double* out);

/* Top-k lists (all drawn from tu_next). The CUDA grouped route's rows_per_group for w's
 * geometry, min(16, 96 / GQA group) (docs/attention.md), whatever w's backend. */
int tu_group_rows(const tu_world* w);
/* Up to `count` distinct tokens of 0..hi not marked in `taken` (which they are then marked
 * in), in random order; returns how many (fewer when fewer remain). */
int tu_draw_tokens(int hi, uint8_t* taken, int count, int32_t* out);
/* One row of a top-k buffer: the n tokens shuffled, at random columns of the first `width`
 * with -1 holes between them where there is room and -1 after them; the stride's columns
 * past the width hold token 0 (not part of the list: a route that read them would attend
 * to token 0). */
void tu_place_list(int32_t* row, int64_t stride, int width, int32_t* toks, int n);
/* Lists of overlap f in [0, 1]: for each request, windows of tu_group_rows(w) consecutive
 * rows from its first row (the grouped route's groups); a window with first row at
 * position p0 has S = min(max_len, p0 + 1) tokens per row, round(S f) of them shared by
 * all its rows (drawn from 0..p0) and S - round(S f) private to each row (drawn from the
 * row's own 0..pos, never a shared one; rows may pick the same ones by chance). max_len
 * <= topk_width; rows [rows, stride]. */
int32_t* tu_overlap_topk(const tu_world* w, int64_t stride, double f, int max_len);
/* The most distinct tokens visible to a window's rows (as tu_overlap_topk windows them)
 * over w's windows: the grouped route's largest union for these lists. */
int tu_max_window_union(const tu_world* w, const int32_t* topk, int64_t stride);
/* Asserts that no page of w maps physical block 0. */
void tu_assert_block0_unmapped(const tu_world* w);

/* Deterministic generator for data shared by two worlds. */
typedef struct {
  uint64_t s;
} tu_rng;
uint64_t tu_rng_next(tu_rng* r);
double tu_rng_normal(tu_rng* r);
int tu_rng_int(tu_rng* r, int lo, int hi);

#endif
