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

/* Builds everything; k_scale/v_scale are used for E4M3 caches. amplitude scales K/V. */
void tu_world_build(tu_world* w, qsakv_context* ctx, const qsakv_model_config* cfg,
                    const tu_shape* shape, uint64_t data_seed, float amplitude, float k_scale,
                    float v_scale, int num_splits);
void tu_world_destroy(tu_world* w);

/* Query position of each row (host), request of each row. */
int tu_row_pos(const tu_world* w, int row);
int tu_row_request(const tu_world* w, int row);

/* The whole main cache of the layer under test, read back to the host. */
void* tu_world_read_kv(const tu_world* w);
/* FP64 reference attention from the cache bytes (an independent decoder). topk may be
 * NULL for dense. out: [rows, q_heads, head_dim]. */
void tu_reference_attention(const tu_world* w, const void* kv_host, const uint16_t* q,
                            const int32_t* topk, int64_t topk_stride, int dense, double* out);

/* Deterministic generator for data shared by two worlds. */
typedef struct {
  uint64_t s;
} tu_rng;
uint64_t tu_rng_next(tu_rng* r);
double tu_rng_normal(tu_rng* r);
int tu_rng_int(tu_rng* r, int lo, int hi);

#endif
