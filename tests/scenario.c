// SPDX-License-Identifier: Apache-2.0
#include "scenario.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int tu_multi_row_min_rows = 0;
int tu_plan_max_rows = 0;
int tu_reserve_block0 = 0;
int tu_store_kv = 1;

uint64_t tu_rng_next(tu_rng* r) {
  uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double tu_rng_normal(tu_rng* r) {
  double u1 = ((double)(tu_rng_next(r) >> 11) + 1.0) * (1.0 / 9007199254740993.0);
  double u2 = (double)(tu_rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

int tu_rng_int(tu_rng* r, int lo, int hi) {
  return lo + (int)(tu_rng_next(r) % (uint64_t)(hi - lo + 1));
}

int tu_row_request(const tu_world* w, int row) {
  int start = 0;
  for (int r = 0; r < w->shape.num_requests; ++r) {
    if (row < start + w->shape.rows[r]) return r;
    start += w->shape.rows[r];
  }
  return -1;
}

int tu_row_pos(const tu_world* w, int row) {
  int start = 0;
  for (int r = 0; r < w->shape.num_requests; ++r) {
    const int n = w->shape.rows[r];
    if (row < start + n) return w->shape.seq_lens[r] - n + (row - start);
    start += n;
  }
  return -1;
}

static size_t act_size(void) { return 2; }

/* w's plan for its whole batch (block table already on the device). */
static void make_plan(tu_world* w, int multi_row_min_rows, int num_splits) {
  qsakv_plan_options po;
  TU_OK(qsakv_plan_options_init(&po));
  po.max_rows = tu_plan_max_rows > 0 ? tu_plan_max_rows : (w->rows > 0 ? w->rows : 1);
  po.num_splits = num_splits;
  po.multi_row_min_rows = multi_row_min_rows;
  TU_OK(qsakv_plan_create(&w->plan, w->cache, &po));
  int32_t qs[TU_MAX_REQ + 1];
  qs[0] = 0;
  for (int r = 0; r < w->shape.num_requests; ++r) qs[r + 1] = qs[r] + w->shape.rows[r];
  qsakv_batch b = QSAKV_BATCH_INIT;
  b.num_requests = w->shape.num_requests;
  b.query_start = qs;
  b.seq_lens = w->shape.seq_lens;
  b.block_table = w->block_table_dev;
  b.block_table_stride = w->bt_stride;
  TU_OK(qsakv_plan_update(w->plan, &b, NULL));
  TU_OK(qsakv_stream_synchronize(w->ctx, NULL));
}

void tu_world_build(tu_world* w, qsakv_context* ctx, const qsakv_model_config* cfg,
                    const tu_shape* shape, uint64_t data_seed, float amplitude, float k_scale,
                    float v_scale, int num_splits) {
  memset(w, 0, sizeof *w);
  w->ctx = ctx;
  w->cfg = *cfg;
  w->shape = *shape;
  w->layer = cfg->qsa_layers[cfg->num_qsa_layers - 1];
  w->geo.struct_size = sizeof w->geo;
  TU_OK(qsakv_model_config_rank_geometry(cfg, &w->geo));
  tu_rng rng = {data_seed};
  const int bs = cfg->block_size;
  int pages_total = 0, max_pages = 1;
  for (int r = 0; r < shape->num_requests; ++r) {
    const int pages = (shape->seq_lens[r] + bs - 1) / bs;
    pages_total += pages;
    if (pages > max_pages) max_pages = pages;
    w->rows += shape->rows[r];
  }
  /* Spare blocks that no page maps: NaN-poisoned, must never leak into outputs. */
  const int64_t num_blocks = pages_total + 8;
  w->bt_stride = max_pages + 3;
  w->block_table = calloc((size_t)shape->num_requests * w->bt_stride + 1, sizeof(int32_t));
  int32_t* perm = malloc(sizeof(int32_t) * num_blocks);
  for (int64_t i = 0; i < num_blocks; ++i) perm[i] = (int32_t)i;
  for (int64_t i = num_blocks - 1; i > 0; --i) {
    int64_t j = (int64_t)(tu_rng_next(&rng) % (uint64_t)(i + 1));
    int32_t t = perm[i];
    perm[i] = perm[j];
    perm[j] = t;
  }
  /* Block 0 to a spare slot (the permutation's last: num_blocks > pages_total). */
  if (tu_reserve_block0)
    for (int64_t i = 0; i < pages_total; ++i)
      if (perm[i] == 0) {
        perm[i] = perm[num_blocks - 1];
        perm[num_blocks - 1] = 0;
      }
  int next = 0;
  for (int r = 0; r < shape->num_requests; ++r) {
    const int pages = (shape->seq_lens[r] + bs - 1) / bs;
    for (int pg = 0; pg < w->bt_stride; ++pg)
      w->block_table[r * w->bt_stride + pg] = pg < pages ? perm[next++] : -1;
  }
  free(perm);

  if (cfg->kv_dtype == QSAKV_DTYPE_E4M3) {
    float ks[QSAKV_MAX_LAYERS], vs[QSAKV_MAX_LAYERS];
    for (int i = 0; i < cfg->num_qsa_layers; ++i) {
      ks[i] = k_scale;
      vs[i] = v_scale;
    }
    w->overlay = tu_make_overlay(cfg, ks, vs);
    w->k_scale = k_scale;
    w->v_scale = v_scale;
  } else {
    w->k_scale = w->v_scale = 1.0f;
  }
  qsakv_cache_options co;
  TU_OK(qsakv_cache_options_init(&co));
  co.num_blocks = num_blocks;
  /* Worlds with unit scales (integer data whose products stay exact) ask for them: the
   * library refuses a unit-scale overlay otherwise. */
  co.allow_unit_scales = k_scale == 1.0f && v_scale == 1.0f;
  TU_OK(qsakv_cache_create(&w->cache, ctx, cfg, w->overlay, &co));
  w->layout.struct_size = sizeof w->layout;
  TU_OK(qsakv_cache_get_layout(w->cache, &w->layout));

  /* Poison every byte of the layer's caches (0xFF is NaN in E4M3, FP16 and BF16). */
  qsakv_layer_buffers lb = {sizeof lb, QSAKV_LAYER_BUFFERS_VERSION};
  TU_OK(qsakv_cache_get_layer_buffers(w->cache, w->layer, &lb));
  void* poison = tu_device_filled(ctx, w->layout.kv_bytes_per_layer, 0xFF);
  TU_OK(qsakv_memcpy(ctx, lb.kv, poison, w->layout.kv_bytes_per_layer, QSAKV_COPY_DEVICE_TO_DEVICE,
                     NULL));
  qsakv_free(ctx, poison);
  poison = tu_device_filled(ctx, w->layout.compressed_bytes_per_layer, 0xFF);
  TU_OK(qsakv_memcpy(ctx, lb.compressed_keys, poison, w->layout.compressed_bytes_per_layer,
                     QSAKV_COPY_DEVICE_TO_DEVICE, NULL));
  qsakv_free(ctx, poison);

  /* K/V and compressed keys of every token of every request. */
  const int row_elems = w->geo.kv_heads * cfg->head_dim;
  const int ratio = cfg->compress_ratio, idim = cfg->index_head_dim;
  for (int r = 0; r < shape->num_requests; ++r) {
    const int L = shape->seq_lens[r];
    if (L == 0) continue;
    const size_t kv_elems = tu_store_kv ? (size_t)L * row_elems : 0;
    uint16_t* k = malloc(act_size() * kv_elems + 1);
    uint16_t* v = malloc(act_size() * kv_elems + 1);
    int64_t* slots = malloc(sizeof(int64_t) * L);
    for (int t = 0; t < L; ++t) {
      slots[t] = (int64_t)w->block_table[r * w->bt_stride + t / bs] * bs + t % bs;
      for (int e = 0; e < (tu_store_kv ? row_elems : 0); ++e) {
        k[(size_t)t * row_elems + e] =
            tu_f32_to_act((float)(amplitude * tu_rng_normal(&rng)), cfg->activation_dtype);
        v[(size_t)t * row_elems + e] =
            tu_f32_to_act((float)(amplitude * tu_rng_normal(&rng)), cfg->activation_dtype);
      }
    }
    if (tu_store_kv) {
      void* dk = tu_to_device(ctx, k, act_size() * kv_elems);
      void* dv = tu_to_device(ctx, v, act_size() * kv_elems);
      void* ds = tu_to_device(ctx, slots, sizeof(int64_t) * L);
      TU_OK(qsakv_store_kv(w->cache, w->layer, dk, dv, ds, L, NULL));
      qsakv_free(ctx, dk);
      qsakv_free(ctx, dv);
      qsakv_free(ctx, ds);
    }
    const int groups = L / ratio;
    if (groups > 0) {
      uint16_t* ck = malloc(2 * (size_t)groups * idim);
      int64_t* cs = malloc(sizeof(int64_t) * groups);
      for (int g = 0; g < groups; ++g) {
        cs[g] = slots[g * ratio];
        /* Small integers: scores are exact in FP32 and FP64, and ties occur. */
        for (int d = 0; d < idim; ++d)
          ck[(size_t)g * idim + d] = tu_f32_to_fp16((float)tu_rng_int(&rng, -3, 3));
      }
      void* dck = tu_to_device(ctx, ck, 2 * (size_t)groups * idim);
      void* dcs = tu_to_device(ctx, cs, sizeof(int64_t) * groups);
      TU_OK(qsakv_store_compressed_keys(w->cache, w->layer, dck, dcs, groups, NULL));
      qsakv_free(ctx, dck);
      qsakv_free(ctx, dcs);
      free(ck);
      free(cs);
    }
    free(k);
    free(v);
    free(slots);
  }
  TU_OK(qsakv_stream_synchronize(ctx, NULL));

  w->block_table_dev = tu_to_device(
      ctx, w->block_table, sizeof(int32_t) * ((size_t)shape->num_requests * w->bt_stride + 1));
  make_plan(w, tu_multi_row_min_rows, num_splits);
}

void tu_world_destroy(tu_world* w) {
  qsakv_plan_destroy(w->plan);
  qsakv_cache_destroy(w->cache);
  qsakv_overlay_destroy(w->overlay);
  qsakv_free(w->ctx, w->block_table_dev);
  free(w->block_table);
}

void tu_world_replan(tu_world* w, int multi_row_min_rows, int num_splits) {
  qsakv_plan_destroy(w->plan);
  w->plan = NULL;
  make_plan(w, multi_row_min_rows, num_splits);
}

void* tu_world_read_kv(const tu_world* w) {
  qsakv_layer_buffers lb = {sizeof lb, QSAKV_LAYER_BUFFERS_VERSION};
  TU_OK(qsakv_cache_get_layer_buffers(w->cache, w->layer, &lb));
  void* h = malloc(w->layout.kv_bytes_per_layer);
  tu_to_host(w->ctx, h, lb.kv, w->layout.kv_bytes_per_layer);
  return h;
}

/* The oracles' values of every E4M3 code and FP16 bit pattern, tabulated once (the same
 * doubles as calling them per element, without their cost in the reference's loops). */
static double e4m3_table[256];
static double fp16_table[65536];
static int tables_ready;

static void build_tables(void) {
  if (tables_ready) return;
  for (int c = 0; c < 256; ++c) e4m3_table[c] = tu_e4m3_value((uint8_t)c);
  for (int h = 0; h < 65536; ++h) fp16_table[h] = tu_fp16_to_f32((uint16_t)h);
  tables_ready = 1;
}

static double kv_value(const tu_world* w, const void* kv, int64_t off) {
  switch (w->cfg.kv_dtype) {
    case QSAKV_DTYPE_E4M3:
      return e4m3_table[((const uint8_t*)kv)[off]];
    case QSAKV_DTYPE_BF16:
      return tu_bf16_to_f32(((const uint16_t*)kv)[off]);
    default:
      return fp16_table[((const uint16_t*)kv)[off]];
  }
}

void tu_reference_attention(const tu_world* w, const void* kv, const uint16_t* q,
                            const int32_t* topk, int64_t topk_stride, int dense, double* out) {
  const qsakv_cache_layout* L = &w->layout;
  const int D = w->cfg.head_dim, H = w->geo.q_heads, G = w->geo.group_size;
  const double scale = w->geo.softmax_scale;
  int64_t* offs = malloc(sizeof(int64_t) * (size_t)(w->cfg.max_model_len + 1));
  double* logit = malloc(sizeof(double) * (size_t)(w->cfg.max_model_len + 1));
  double* qd = malloc(sizeof(double) * (size_t)D);
  build_tables();
  for (int row = 0; row < w->rows; ++row) {
    const int req = tu_row_request(w, row), pos = tu_row_pos(w, row);
    int n = 0;
    const int count = dense ? pos + 1 : w->geo.topk_width;
    for (int j = 0; j < count; ++j) {
      const int t = dense ? j : topk[row * topk_stride + j];
      if (t < 0 || t > pos) continue;
      const int32_t phys = w->block_table[req * w->bt_stride + t / L->block_size];
      offs[n++] =
          (int64_t)phys * L->kv_stride_block + (int64_t)(t % L->block_size) * L->kv_stride_token;
    }
    for (int h = 0; h < H; ++h) {
      const int kvh = h / G;
      double* o = out + ((size_t)row * H + h) * D;
      for (int d = 0; d < D; ++d) o[d] = 0.0;
      if (n == 0) continue;
      for (int d = 0; d < D; ++d)
        qd[d] = (double)tu_act_to_f32(q[((size_t)row * H + h) * D + d], w->cfg.activation_dtype);
      double m = -INFINITY;
      for (int j = 0; j < n; ++j) {
        double s = 0;
        for (int d = 0; d < D; ++d)
          s += qd[d] * kv_value(w, kv, offs[j] + kvh * L->kv_stride_head + d) * w->k_scale;
        logit[j] = s * scale;
        if (logit[j] > m) m = logit[j];
      }
      double l = 0;
      for (int j = 0; j < n; ++j) {
        const double p = exp(logit[j] - m);
        l += p;
        for (int d = 0; d < D; ++d)
          o[d] += p * kv_value(w, kv, offs[j] + L->kv_stride_kv + kvh * L->kv_stride_head + d);
      }
      for (int d = 0; d < D; ++d) o[d] = o[d] / l * w->v_scale;
    }
  }
  free(offs);
  free(logit);
  free(qd);
}

int tu_group_rows(const tu_world* w) {
  const int g = 96 / w->geo.group_size;
  return g < 16 ? g : 16;
}

int tu_draw_tokens(int hi, uint8_t* taken, int count, int32_t* out) {
  int32_t* cand = malloc(sizeof(int32_t) * (size_t)(hi + 2));
  int n = 0;
  for (int t = 0; t <= hi; ++t)
    if (!taken[t]) cand[n++] = t;
  if (count > n) count = n;
  /* Partial Fisher-Yates over the free tokens. */
  for (int i = 0; i < count; ++i) {
    const int j = i + (int)(tu_next() % (uint64_t)(n - i));
    const int32_t t = cand[i];
    cand[i] = cand[j];
    cand[j] = t;
    out[i] = cand[i];
    taken[cand[i]] = 1;
  }
  free(cand);
  return count;
}

void tu_place_list(int32_t* row, int64_t stride, int width, int32_t* toks, int n) {
  assert_true(n <= width);
  for (int i = n - 1; i > 0; --i) {
    const int j = (int)(tu_next() % (uint64_t)(i + 1));
    const int32_t t = toks[i];
    toks[i] = toks[j];
    toks[j] = t;
  }
  for (int64_t j = 0; j < stride; ++j) row[j] = j < width ? -1 : 0;
  int col = 0;
  for (int i = 0; i < n; ++i) {
    while (col < width - (n - i) && tu_int(0, 7) == 0) ++col;
    row[col++] = toks[i];
  }
}

/* First row of each request of w, into row0[num_requests + 1]. */
static void request_rows(const tu_world* w, int* row0) {
  row0[0] = 0;
  for (int r = 0; r < w->shape.num_requests; ++r) row0[r + 1] = row0[r] + w->shape.rows[r];
}

int32_t* tu_overlap_topk(const tu_world* w, int64_t stride, double f, int max_len) {
  const int width = w->geo.topk_width, rpg = tu_group_rows(w);
  assert_true(max_len <= width && f >= 0.0 && f <= 1.0);
  int32_t* topk = malloc(sizeof(int32_t) * ((size_t)w->rows * stride + 1));
  int32_t* shared = malloc(sizeof(int32_t) * (size_t)width);
  int32_t* toks = malloc(sizeof(int32_t) * (size_t)width);
  int row0[TU_MAX_REQ + 1];
  request_rows(w, row0);
  for (int r = 0; r < w->shape.num_requests; ++r) {
    const int L = w->shape.seq_lens[r];
    uint8_t* in_shared = calloc((size_t)L + 1, 1);
    uint8_t* taken = malloc((size_t)L + 1);
    for (int g0 = row0[r]; g0 < row0[r + 1]; g0 += rpg) {
      const int g1 = g0 + rpg < row0[r + 1] ? g0 + rpg : row0[r + 1];
      const int p0 = tu_row_pos(w, g0);
      const int S = max_len < p0 + 1 ? max_len : p0 + 1;
      const int ns = (int)lround(S * f);
      memset(in_shared, 0, (size_t)L + 1);
      assert_int_equal(tu_draw_tokens(p0, in_shared, ns, shared), ns);
      for (int row = g0; row < g1; ++row) {
        memcpy(taken, in_shared, (size_t)L + 1);
        memcpy(toks, shared, sizeof(int32_t) * (size_t)ns);
        const int np = tu_draw_tokens(tu_row_pos(w, row), taken, S - ns, toks + ns);
        assert_int_equal(np, S - ns);
        tu_place_list(topk + (size_t)row * stride, stride, width, toks, S);
      }
    }
    free(in_shared);
    free(taken);
  }
  free(shared);
  free(toks);
  return topk;
}

int tu_max_window_union(const tu_world* w, const int32_t* topk, int64_t stride) {
  const int rpg = tu_group_rows(w);
  int row0[TU_MAX_REQ + 1], best = 0;
  request_rows(w, row0);
  for (int r = 0; r < w->shape.num_requests; ++r) {
    uint8_t* seen = malloc((size_t)w->shape.seq_lens[r] + 1);
    for (int g0 = row0[r]; g0 < row0[r + 1]; g0 += rpg) {
      const int g1 = g0 + rpg < row0[r + 1] ? g0 + rpg : row0[r + 1];
      memset(seen, 0, (size_t)w->shape.seq_lens[r] + 1);
      int n = 0;
      for (int row = g0; row < g1; ++row)
        for (int j = 0; j < w->geo.topk_width; ++j) {
          const int t = topk[(size_t)row * stride + j];
          if (t >= 0 && t <= tu_row_pos(w, row) && !seen[t]) {
            seen[t] = 1;
            ++n;
          }
        }
      if (n > best) best = n;
    }
    free(seen);
  }
  return best;
}

void tu_assert_block0_unmapped(const tu_world* w) {
  for (int r = 0; r < w->shape.num_requests; ++r)
    for (int pg = 0; pg < w->bt_stride; ++pg)
      assert_int_not_equal(w->block_table[r * w->bt_stride + pg], 0);
}
