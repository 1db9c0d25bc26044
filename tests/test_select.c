// SPDX-License-Identifier: Apache-2.0
/* Indexer selection against a reference written here: FP64 scores, exact top-k (score
 * descending, block ascending on ties: the keys are small integers, so ties happen and
 * scores are exact in every precision), expansion with the open group's tail, -1
 * padding; requests shorter than one group; visibility stops at the row's position.
 *
 * With real-valued keys the GPU is held to the numerics contract of docs/selection.md:
 * its selection equals the CPU backend's except for blocks whose FP64 score lies within
 * the stated tolerance of the row's k-th score (counted and printed), its order is the
 * FP64 order up to that tolerance, and it is deterministic and batch-invariant. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "scenario.h"

typedef struct {
  double s;
  int b;
} scored;

static int by_score(const void* x, const void* y) {
  const scored* a = x;
  const scored* b = y;
  if (a->s != b->s) return a->s > b->s ? -1 : 1;
  return a->b - b->b;
}

/* The values of key `slot` of page `phys` from the layer's bytes as the host read them,
 * by the layout's description (FP16; or E4M3 codes, decoded by the FP64 oracle, times
 * the key's FP32 scale). */
static void key_values(const tu_world* w, const void* comp, int phys, int slot, double* k) {
  const qsakv_cache_layout* L = &w->layout;
  const uint8_t* page = (const uint8_t*)comp + (size_t)phys * L->compressed_stride_block;
  const int D = L->index_head_dim;
  if (L->index_key_dtype == QSAKV_DTYPE_E4M3) {
    float s;
    memcpy(&s, page + L->compressed_scales_offset + 4 * (size_t)slot, 4);
    for (int d = 0; d < D; ++d) k[d] = (double)s * tu_e4m3_value(page[(size_t)slot * D + d]);
  } else {
    const uint16_t* h = (const uint16_t*)page + (size_t)slot * D;
    for (int d = 0; d < D; ++d) k[d] = tu_fp16_to_f32(h[d]);
  }
}

/* The index-key dtype of the worlds the next checks build (FP16, or E4M3 for the
 * E4M3-key variants of the same checks). */
static qsakv_dtype g_index_keys = QSAKV_DTYPE_FP16;
/* The contract world's index heads and dims (0: the preset's, 4 x 128). */
static int g_index_heads = 0, g_index_dim = 0;

/* Stores n FP16 keys ([n, index_head_dim]) at compressed slots `slots` through
 * qsakv_store_compressed_keys (so E4M3 worlds quantise them as an engine's keys would),
 * then returns the layer's whole compressed buffer as the host reads it. */
static void* store_key_list(tu_world* w, const uint16_t* keys, const int64_t* slots, int64_t n) {
  const size_t D = (size_t)w->cfg.index_head_dim;
  void* dk = tu_to_device(w->ctx, keys, 2 * (size_t)n * D);
  void* ds = tu_to_device(w->ctx, slots, sizeof(int64_t) * (size_t)n);
  TU_OK(qsakv_store_compressed_keys(w->cache, w->layer, dk, ds, n, NULL));
  qsakv_free(w->ctx, dk);
  qsakv_free(w->ctx, ds);
  qsakv_layer_buffers lb = {sizeof lb, QSAKV_LAYER_BUFFERS_VERSION};
  TU_OK(qsakv_cache_get_layer_buffers(w->cache, w->layer, &lb));
  void* comp = malloc(w->layout.compressed_bytes_per_layer);
  tu_to_host(w->ctx, comp, lb.compressed_keys, w->layout.compressed_bytes_per_layer);
  return comp;
}

static void reference_select(const tu_world* w, const void* comp_host, const uint16_t* q,
                             int32_t* out) {
  const int ratio = w->cfg.compress_ratio, D = w->cfg.index_head_dim, H = w->cfg.index_num_heads;
  const int bs = w->cfg.block_size, width = w->geo.topk_width;
  for (int row = 0; row < w->rows; ++row) {
    const int req = tu_row_request(w, row), pos = tu_row_pos(w, row);
    const int visible = (pos + 1) / ratio;
    scored* sc = malloc(sizeof(scored) * (visible + 1));
    double k[1024];
    for (int b = 0; b < visible; ++b) {
      const int t0 = b * ratio;
      const int phys = w->block_table[req * w->bt_stride + t0 / bs];
      key_values(w, comp_host, phys, (t0 % bs) / ratio, k);
      double s = 0;
      for (int h = 0; h < H; ++h) {
        double dot = 0;
        for (int d = 0; d < D; ++d)
          dot += (double)tu_fp16_to_f32(q[((size_t)row * H + h) * D + d]) * k[d];
        s += dot > 0 ? dot : 0;
      }
      sc[b].s = s / sqrt((double)D);
      sc[b].b = b;
    }
    qsort(sc, visible, sizeof(scored), by_score);
    const int keep = visible < w->geo.topk_blocks ? visible : w->geo.topk_blocks;
    int32_t* o = out + (size_t)row * width;
    int j = 0;
    for (int i = 0; i < keep; ++i)
      for (int t = 0; t < ratio; ++t) o[j++] = sc[i].b * ratio + t;
    for (int t = visible * ratio; t <= pos; ++t) o[j++] = t;
    while (j < width) o[j++] = -1;
    free(sc);
  }
}

static int32_t* run_select(const tu_world* w, const uint16_t* q, int use_shared) {
  const int width = w->geo.topk_width;
  const size_t qn = (size_t)w->rows * w->cfg.index_num_heads * w->cfg.index_head_dim;
  void* dq = tu_to_device(w->ctx, q, 2 * qn);
  int32_t* out = malloc(sizeof(int32_t) * (size_t)w->rows * width);
  if (use_shared) {
    qsakv_layer_buffers lb = {sizeof lb, QSAKV_LAYER_BUFFERS_VERSION};
    TU_OK(qsakv_cache_get_layer_buffers(w->cache, w->layer, &lb));
    void* poison = tu_device_filled(w->ctx, sizeof(int32_t) * (size_t)w->rows * width, 0x7B);
    TU_OK(qsakv_memcpy(w->ctx, lb.topk, poison, sizeof(int32_t) * (size_t)w->rows * width,
                       QSAKV_COPY_DEVICE_TO_DEVICE, NULL));
    qsakv_free(w->ctx, poison);
    TU_OK(qsakv_select_topk(w->plan, w->layer, dq, NULL, 0, NULL));
    tu_to_host(w->ctx, out, lb.topk, sizeof(int32_t) * (size_t)w->rows * width);
  } else {
    void* dt = tu_device_filled(w->ctx, sizeof(int32_t) * (size_t)w->rows * width, 0x7B);
    TU_OK(qsakv_select_topk(w->plan, w->layer, dq, dt, width, NULL));
    tu_to_host(w->ctx, out, dt, sizeof(int32_t) * (size_t)w->rows * width);
    qsakv_free(w->ctx, dt);
  }
  qsakv_free(w->ctx, dq);
  return out;
}

static void check_select(qsakv_context* ctx, const char* what) {
  qsakv_model_config c;
  tu_small_config(&c, 4, 1, 64, QSAKV_DTYPE_FP16, QSAKV_DTYPE_FP16, 16);
  c.index_key_dtype = g_index_keys;
  /* decode rows at long contexts (more than 512 visible groups), verify rows, a
   * request shorter than one group, one exactly at a group boundary, an empty one */
  tu_shape shape = {6, {1, 4, 2, 1, 0, 3}, {4099, 2600, 3, 8, 5, 700}};
  tu_world w;
  tu_world_build(&w, ctx, &c, &shape, tu_next(), 1.0f, 1.0f, 1.0f, 0);
  qsakv_layer_buffers lb = {sizeof lb, QSAKV_LAYER_BUFFERS_VERSION};
  TU_OK(qsakv_cache_get_layer_buffers(w.cache, w.layer, &lb));
  uint8_t* comp = malloc(w.layout.compressed_bytes_per_layer);
  tu_to_host(ctx, comp, lb.compressed_keys, w.layout.compressed_bytes_per_layer);
  const size_t qn = (size_t)w.rows * c.index_num_heads * c.index_head_dim;
  uint16_t* q = malloc(2 * qn);
  for (size_t i = 0; i < qn; ++i) q[i] = tu_f32_to_fp16((float)tu_int(-2, 2));
  int32_t* want = malloc(sizeof(int32_t) * (size_t)w.rows * w.geo.topk_width);
  reference_select(&w, comp, q, want);
  for (int shared = 0; shared <= 1; ++shared) {
    int32_t* got = run_select(&w, q, shared);
    for (int row = 0; row < w.rows; ++row)
      for (int j = 0; j < w.geo.topk_width; ++j) {
        const size_t i = (size_t)row * w.geo.topk_width + j;
        if (got[i] != want[i])
          fail_msg("%s shared=%d row %d (pos %d) col %d: got %d want %d", what, shared, row,
                   tu_row_pos(&w, row), j, got[i], want[i]);
      }
    free(got);
  }
  /* Spot checks of the reference itself: the short request's row has only its tail. */
  const int short_row = 1 + 4 + 2; /* request 3: pos 7, two full groups */
  assert_int_equal(tu_row_pos(&w, short_row), 7);
  const int32_t* r3 = want + (size_t)short_row * w.geo.topk_width;
  assert_int_equal(r3[8], -1);
  const int tiny_row = 1 + 4; /* request 2, rows at pos 1 and 2: no full group, tail only */
  const int32_t* r2 = want + (size_t)tiny_row * w.geo.topk_width;
  assert_int_equal(r2[0], 0);
  assert_int_equal(r2[1], 1);
  assert_int_equal(r2[2], -1);
  print_message("%s: %d rows selected exactly\n", what, w.rows);
  free(want);
  free(q);
  free(comp);
  tu_world_destroy(&w);
}

/* ---- The numerics contract, on real-valued keys ------------------------------------- */

/* A row's index query as doubles [heads * dim], converted once per row (converting it for
 * every block was most of the contract tests' run time). Free with free(). */
static double* row_q64(const tu_world* w, const uint16_t* q, int row) {
  const size_t n = (size_t)w->cfg.index_num_heads * w->cfg.index_head_dim;
  double* out = malloc(sizeof(double) * n);
  for (size_t i = 0; i < n; ++i) out[i] = tu_fp16_to_f32(q[(size_t)row * n + i]);
  return out;
}

/* FP64 score of block b of a row (q64: row_q64's), and its magnitude
 * M(b) = sum |q_hd k_d| / sqrt(D); 0 in *mapped when the block's page is unmapped. */
static double score64(const tu_world* w, const void* comp, const double* q64, int row, int b,
                      double* magnitude, int* mapped) {
  const int ratio = w->cfg.compress_ratio, D = w->cfg.index_head_dim, H = w->cfg.index_num_heads;
  const int bs = w->cfg.block_size;
  const int t0 = b * ratio;
  const int phys = w->block_table[tu_row_request(w, row) * w->bt_stride + t0 / bs];
  *mapped = phys >= 0;
  *magnitude = 0;
  if (phys < 0) return -INFINITY;
  double k[1024];
  key_values(w, comp, phys, (t0 % bs) / ratio, k);
  double s = 0, m = 0;
  for (int h = 0; h < H; ++h) {
    double dot = 0;
    for (int d = 0; d < D; ++d) {
      const double t = q64[(size_t)h * D + d] * k[d];
      dot += t;
      m += fabs(t);
    }
    s += dot > 0 ? dot : 0;
  }
  *magnitude = m / sqrt((double)D);
  return s / sqrt((double)D);
}

/* The contract's tolerance between blocks of magnitudes ma and mb (docs/selection.md). */
static double contract_tol(double ma, double mb) { return 2e-5 * (ma + mb); }

/* Checks `got` against `want` (both [rows, width]) under the contract; `want` is an
 * exact selection (the CPU backend's or an FP64 one). Returns the boundary cases: blocks
 * in one selection and not the other. */
static int check_contract(const tu_world* w, const void* comp, const uint16_t* q,
                          const int32_t* want, const int32_t* got, const char* what) {
  const int ratio = w->cfg.compress_ratio, width = w->geo.topk_width;
  int boundary = 0;
  for (int row = 0; row < w->rows; ++row) {
    const int pos = tu_row_pos(w, row), visible = (pos + 1) / ratio;
    const int32_t* a = want + (size_t)row * width;
    const int32_t* g = got + (size_t)row * width;
    double* s = malloc(sizeof(double) * (visible + 1));
    double* m = malloc(sizeof(double) * (visible + 1));
    char* in_a = calloc(visible + 1, 1);
    char* in_g = calloc(visible + 1, 1);
    int mapped_count = 0;
    double* q64 = row_q64(w, q, row);
    for (int b = 0; b < visible; ++b) {
      int mapped;
      s[b] = score64(w, comp, q64, row, b, &m[b], &mapped);
      mapped_count += mapped;
    }
    free(q64);
    const int K = mapped_count < w->geo.topk_blocks ? mapped_count : w->geo.topk_blocks;
    /* Structure: K groups of `ratio` consecutive tokens of visible mapped blocks, no
     * block twice; then the tail and the padding, identical. */
    for (int j = 0; j < K; ++j) {
      const int ba = a[j * ratio] / ratio, bg = g[j * ratio] / ratio;
      if (bg < 0 || bg >= visible || s[bg] == -INFINITY || in_g[bg])
        fail_msg("%s row %d: group %d names block %d (visible %d, or unmapped, or repeated)", what,
                 row, j, bg, visible);
      in_g[bg] = 1;
      in_a[ba] = 1;
      for (int t = 0; t < ratio; ++t)
        if (g[j * ratio + t] != bg * ratio + t)
          fail_msg("%s row %d col %d: %d is not token %d of block %d", what, row, j * ratio + t,
                   g[j * ratio + t], t, bg);
    }
    for (int j = K * ratio; j < width; ++j)
      if (g[j] != a[j])
        fail_msg("%s row %d col %d (tail/padding): got %d want %d", what, row, j, g[j], a[j]);
    /* The k-th score of the exact selection, and its magnitude. */
    double sk = INFINITY, mk = 0;
    for (int j = 0; j < K; ++j) {
      const int b = a[j * ratio] / ratio;
      if (s[b] < sk) {
        sk = s[b];
        mk = m[b];
      }
    }
    for (int b = 0; b < visible; ++b) {
      if (in_a[b] == in_g[b]) continue;
      ++boundary;
      if (fabs(s[b] - sk) > contract_tol(m[b], mk))
        fail_msg(
            "%s row %d: block %d (score %.9g) is %s the exact selection, but the k-th "
            "score is %.9g: |difference| %.3g exceeds the tolerance %.3g",
            what, row, b, s[b], in_g[b] ? "not in" : "missing from", sk, fabs(s[b] - sk),
            contract_tol(m[b], mk));
    }
    /* Order: score descending up to the tolerance. */
    for (int j = 0; j + 1 < K; ++j) {
      const int b0 = g[j * ratio] / ratio, b1 = g[(j + 1) * ratio] / ratio;
      if (s[b1] - s[b0] > contract_tol(m[b0], m[b1]))
        fail_msg("%s row %d: block %d (%.9g) ranked before block %d (%.9g)", what, row, b0, s[b0],
                 b1, s[b1]);
    }
    free(s);
    free(m);
    free(in_a);
    free(in_g);
  }
  return boundary;
}

/* Overwrites the visible compressed keys of every request with N(0,1) FP16 values (the
 * same on every context for the same seed), E4M3 worlds with a magnitude per key drawn
 * over three decades (each key's scale differs); returns the layer's keys as the host
 * sees them (NaN poison elsewhere). */
/* How fill_keys fills the keys: N(0,1) values (E4M3 worlds with a magnitude per key);
 * whole values in [-3, 3] (many equal scores); or every element 1 except every 97th key's,
 * 64 (a crowd of equal scores beside a few 64 times larger ones). */
enum key_fill { kKeysReal, kKeysIntegers, kKeysTiesBesideOutliers };
static void* fill_keys(tu_world* w, uint64_t seed, enum key_fill fill);
static void* randomise_keys(tu_world* w, uint64_t seed) { return fill_keys(w, seed, kKeysReal); }
static void* fill_keys(tu_world* w, uint64_t seed, enum key_fill fill) {
  const int ratio = w->cfg.compress_ratio, D = w->cfg.index_head_dim, bs = w->cfg.block_size;
  int64_t n = 0;
  for (int r = 0; r < w->shape.num_requests; ++r) n += w->shape.seq_lens[r] / ratio;
  uint16_t* keys = malloc(2 * (size_t)(n + 1) * D);
  int64_t* slots = malloc(sizeof(int64_t) * (size_t)(n + 1));
  int64_t m = 0;
  tu_rng rng = {seed};
  for (int r = 0; r < w->shape.num_requests; ++r)
    for (int b = 0; b < w->shape.seq_lens[r] / ratio; ++b) {
      const int t0 = b * ratio, phys = w->block_table[r * w->bt_stride + t0 / bs];
      if (phys < 0) continue;
      const double mag =
          g_index_keys == QSAKV_DTYPE_E4M3 && fill == kKeysReal
              ? pow(10.0, 3.0 * (double)(tu_rng_next(&rng) >> 11) / 9007199254740992.0 - 1.5)
              : 1.0;
      for (int d = 0; d < D; ++d)
        keys[(size_t)m * D + d] =
            tu_f32_to_fp16(fill == kKeysIntegers ? (float)((int)(tu_rng_next(&rng) % 7) - 3)
                           : fill == kKeysTiesBesideOutliers ? (m % 97 == 0 ? 64.0f : 1.0f)
                                                             : (float)(mag * tu_rng_normal(&rng)));
      slots[m++] = (int64_t)phys * bs + t0 % bs;
    }
  void* comp = store_key_list(w, keys, slots, m);
  free(keys);
  free(slots);
  return comp;
}

static uint16_t* index_q(const tu_world* w, uint64_t seed, int integers) {
  const size_t qn = (size_t)w->rows * w->cfg.index_num_heads * w->cfg.index_head_dim;
  uint16_t* q = malloc(2 * qn);
  tu_rng rng = {seed};
  for (size_t i = 0; i < qn; ++i)
    q[i] = tu_f32_to_fp16(integers ? (float)((int)(tu_rng_next(&rng) % 5) - 2)
                                   : (float)tu_rng_normal(&rng));
  return q;
}
static uint16_t* random_index_q(const tu_world* w, uint64_t seed) { return index_q(w, seed, 0); }

/* Unmaps page `page` of request r (a hole in the block table) on the host and device. */
static void unmap_page(tu_world* w, int r, int page) {
  w->block_table[r * w->bt_stride + page] = -1;
  const int32_t minus_one = -1;
  TU_OK(qsakv_memcpy(w->ctx, (int32_t*)w->block_table_dev + r * w->bt_stride + page, &minus_one,
                     sizeof minus_one, QSAKV_COPY_HOST_TO_DEVICE, NULL));
  TU_OK(qsakv_stream_synchronize(w->ctx, NULL));
}

/* Long and short contexts (1 token to 256K), decode and verify rows, a 37-row chunk (row
 * blocks of the multi-row route hold several requests), an unmapped page. */
static const tu_shape kContractShape = {6, {1, 2, 1, 3, 1, 37}, {1, 5, 262144, 70001, 2051, 9000}};
/* A batch of prefill chunks alone (every request 16+ rows, as in a prefill step): the
 * 40-row chunk across the mma.sync scorer's 16-row blocks and the warpgroup scorer's 32-row
 * ones (test_select_warpgroup_scorer_cuda forces it), the next chunk starting in its last
 * block. 256 rows, more than any GPU has SMs: the one-CTA top-k takes its many-rows forms
 * here (kContractShape's 45 rows take the others). */
static const tu_shape kPrefillShape = {2, {40, 216}, {70001, 5000}};
static const tu_shape* const kContractShapes[2] = {&kContractShape, &kPrefillShape};

static void contract_config(qsakv_model_config* c) {
  tu_small_config(c, 4, 1, 64, QSAKV_DTYPE_FP16, QSAKV_DTYPE_FP16, 64);
  c->index_key_dtype = g_index_keys;
  c->max_model_len = 1 << 18;
  if (g_index_heads) c->index_num_heads = g_index_heads;
  if (g_index_dim) c->index_head_dim = g_index_dim;
}

static void build_contract_world(tu_world* w, qsakv_context* ctx, const tu_shape* shape,
                                 uint64_t seed, void** comp, uint16_t** q) {
  qsakv_model_config c;
  contract_config(&c);
  tu_world_build(w, ctx, &c, shape, seed, 1.0f, 1.0f, 1.0f, 0);
  unmap_page(w, shape->num_requests > 3 ? 3 : shape->num_requests - 1, 17);
  *comp = randomise_keys(w, seed ^ 0x5EEDull);
  *q = random_index_q(w, seed ^ 0xC0FFEEull);
}

/* QSAKV_SELECT_STAGES=score (the bench's scoring-alone timing): a context created with it
 * launches the scoring kernels only, so its selections leave every output as it was, on
 * both routes (a batch of decode rows: the one-row scorer and the filter kernel; a batch
 * with a 37-row chunk: the multi-row scorer and the one-CTA top-k); the same worlds on a
 * plain context write them. */
static void test_select_score_only_cuda(void** state) {
  (void)state;
  qsakv_context* plain = tu_cuda_context_or_skip();
  char* keep = tu_env_save("QSAKV_SELECT_STAGES");
  setenv("QSAKV_SELECT_STAGES", "score", 1);
  qsakv_context* scoring = tu_context(QSAKV_BACKEND_CUDA); /* the hook is read here */
  tu_env_restore("QSAKV_SELECT_STAGES", keep);
  assert_non_null(scoring);
  qsakv_model_config c;
  contract_config(&c);
  const tu_shape shapes[2] = {{2, {1, 1}, {4099, 70001}}, {3, {1, 1, 37}, {4099, 70001, 9000}}};
  const uint64_t seed = tu_next();
  for (int k = 0; k < 4; ++k) {
    const int shared = k % 2;
    tu_world ws, wp;
    tu_world_build(&ws, scoring, &c, &shapes[k / 2], seed, 1.0f, 1.0f, 1.0f, 0);
    tu_world_build(&wp, plain, &c, &shapes[k / 2], seed, 1.0f, 1.0f, 1.0f, 0);
    uint16_t* q = random_index_q(&ws, seed ^ 0xC0FFEEull);
    int32_t* untouched = run_select(&ws, q, shared);
    int32_t* written = run_select(&wp, q, shared);
    const size_t n = (size_t)ws.rows * ws.geo.topk_width;
    size_t changed = 0, differ = 0;
    for (size_t i = 0; i < n; ++i) {
      changed += untouched[i] != 0x7B7B7B7B;
      differ += written[i] != 0x7B7B7B7B;
    }
    if (changed)
      fail_msg("score only, %s, shared=%d: %zu of %zu outputs written",
               k < 2 ? "decode rows" : "a multi-row chunk", shared, changed, n);
    assert_int_equal(differ, n); /* the plain context writes every entry (tokens or -1) */
    free(written);
    free(untouched);
    free(q);
    tu_world_destroy(&wp);
    tu_world_destroy(&ws);
  }
  print_message(
      "score only: no output written (decode rows; a multi-row chunk); the plain context wrote "
      "them all\n");
  qsakv_context_destroy(scoring);
  qsakv_context_destroy(plain);
}

/* QSAKV_SELECT_SORT: contexts forced to each of the top-k's sorts of the winners (by runs;
 * by buckets, which declines where a bucket is crowded) give the automatic choice's bytes,
 * on both top-k routes (one-row requests: the many-CTA filter kernel; a batch with a 37-row
 * chunk: the one-CTA top-k), FP16 and E4M3 keys, with three kinds of keys: real values
 * (the winners spread over many buckets, one or two a bucket), small integers with integer
 * queries (ties share a bucket: 5-40 winners in the largest) and ties beside 64x outliers
 * (hundreds of equal winners in one bucket: the bucket sort declines and sorts by runs;
 * check_special_keys checks that case exactly against FP64 too). Where the GPU code has no
 * bucket sort (below SM80) every context sorts by runs and the test still compares them.
 * The hook is read at context creation; "auto" is set for the first context, whatever the
 * caller's environment says. */
static void test_select_sorts_agree_cuda(void** state) {
  (void)state;
  qsakv_context_destroy(tu_cuda_context_or_skip()); /* no GPU: skipped, saying so */
  qsakv_context* ctx[3] = {NULL, NULL, NULL};
  static const char* const kSort[3] = {"auto", "runs", "buckets"};
  char* keep = tu_env_save("QSAKV_SELECT_SORT");
  for (int i = 0; i < 3; ++i) {
    setenv("QSAKV_SELECT_SORT", kSort[i], 1);
    ctx[i] = tu_context(QSAKV_BACKEND_CUDA);
  }
  tu_env_restore("QSAKV_SELECT_SORT", keep); /* before any assertion can leave it set */
  for (int i = 0; i < 3; ++i) assert_non_null(ctx[i]);
  const tu_shape shapes[2] = {{3, {1, 1, 1}, {4099, 70001, 262144}},
                              {3, {1, 1, 37}, {4099, 70001, 9000}}};
  int compared = 0;
  for (int keys = 0; keys < 2; ++keys) {
    g_index_keys = keys ? QSAKV_DTYPE_E4M3 : QSAKV_DTYPE_FP16;
    qsakv_model_config c;
    contract_config(&c);
    for (int si = 0; si < 2; ++si)
      for (int fill = kKeysReal; fill <= kKeysTiesBesideOutliers; ++fill) {
        const uint64_t seed = tu_next();
        tu_world w[3];
        int32_t* out[3];
        for (int i = 0; i < 3; ++i) {
          tu_world_build(&w[i], ctx[i], &c, &shapes[si], seed, 1.0f, 1.0f, 1.0f, 0);
          free(fill_keys(&w[i], seed ^ 0x5EEDull, (enum key_fill)fill));
          uint16_t* q = index_q(&w[i], seed ^ 0xC0FFEEull, fill == kKeysIntegers);
          out[i] = run_select(&w[i], q, 0);
          free(q);
        }
        const size_t n = (size_t)w[0].rows * w[0].geo.topk_width;
        for (int i = 1; i < 3; ++i)
          for (size_t j = 0; j < n; ++j)
            if (out[i][j] != out[0][j])
              fail_msg("QSAKV_SELECT_SORT=%s, %s keys, %s, %s: row %zu col %zu is %d, auto's %d",
                       kSort[i], keys ? "E4M3" : "FP16",
                       si == 0 ? "one-row requests" : "a 37-row chunk",
                       fill == kKeysReal       ? "real keys"
                       : fill == kKeysIntegers ? "integer keys"
                                               : "ties beside outliers",
                       j / w[0].geo.topk_width, j % w[0].geo.topk_width, out[i][j], out[0][j]);
        for (int i = 0; i < 3; ++i) {
          free(out[i]);
          tu_world_destroy(&w[i]);
        }
        ++compared;
      }
  }
  g_index_keys = QSAKV_DTYPE_FP16;
  print_message("runs, buckets and auto sorts give the same bytes: %d batches\n", compared);
  for (int i = 0; i < 3; ++i) qsakv_context_destroy(ctx[i]);
}

/* The FP64 exact selection (reference_select's ordering on FP64 scores) of a world whose
 * pages may be unmapped. */
static void reference_select_mapped(const tu_world* w, const void* comp, const uint16_t* q,
                                    int32_t* out) {
  const int ratio = w->cfg.compress_ratio, width = w->geo.topk_width;
  for (int row = 0; row < w->rows; ++row) {
    const int pos = tu_row_pos(w, row), visible = (pos + 1) / ratio;
    scored* sc = malloc(sizeof(scored) * (visible + 1));
    int n = 0;
    double* q64 = row_q64(w, q, row);
    for (int b = 0; b < visible; ++b) {
      double mag;
      int mapped;
      const double s = score64(w, comp, q64, row, b, &mag, &mapped);
      if (!mapped) continue;
      sc[n].s = s;
      sc[n++].b = b;
    }
    free(q64);
    qsort(sc, n, sizeof(scored), by_score);
    const int keep = n < w->geo.topk_blocks ? n : w->geo.topk_blocks;
    int32_t* o = out + (size_t)row * width;
    int j = 0;
    for (int i = 0; i < keep; ++i)
      for (int t = 0; t < ratio; ++t) o[j++] = sc[i].b * ratio + t;
    for (int t = visible * ratio; t <= pos; ++t) o[j++] = t;
    while (j < width) o[j++] = -1;
    free(sc);
  }
}

/* The CPU backend against the exact FP64 selection: FP32 scores in sequential order are
 * held to the same contract (and make the checker itself run on every machine). */
static void check_contract_cpu(const tu_shape* shape) {
  qsakv_context* ctx = tu_context(QSAKV_BACKEND_CPU);
  tu_world w;
  void* comp;
  uint16_t* q;
  build_contract_world(&w, ctx, shape, tu_next(), &comp, &q);
  int32_t* exact = malloc(sizeof(int32_t) * (size_t)w.rows * w.geo.topk_width);
  reference_select_mapped(&w, comp, q, exact);
  int32_t* got = run_select(&w, q, 0);
  const int boundary = check_contract(&w, comp, q, exact, got, "cpu vs fp64");
  print_message(
      "contract, cpu vs fp64, %s keys, %d index heads x %d: %d rows of %d requests, %d "
      "boundary blocks\n",
      g_index_keys == QSAKV_DTYPE_E4M3 ? "E4M3" : "FP16", w.cfg.index_num_heads,
      w.cfg.index_head_dim, w.rows, shape->num_requests, boundary);
  free(got);
  free(exact);
  free(q);
  free(comp);
  tu_world_destroy(&w);
  qsakv_context_destroy(ctx);
}

static void test_select_contract_cpu(void** state) {
  (void)state;
  for (int i = 0; i < 2; ++i) check_contract_cpu(kContractShapes[i]);
}

/* Selection of the rows of `batch_rows` rows ending at request r's last row, through a
 * fresh plan of max_rows `max_rows`: request r alone as a decode row (pos = L - 1). */
static int32_t* select_row_at(tu_world* w, int r, int seq_len, const uint16_t* q_row, int max_rows);
static int32_t* select_single_row(tu_world* w, int r, const uint16_t* q_row, int max_rows) {
  return select_row_at(w, r, w->shape.seq_lens[r], q_row, max_rows);
}
/* The same, for request r as if it had seq_len tokens: its row at position seq_len - 1. */
static int32_t* select_row_at(tu_world* w, int r, int seq_len, const uint16_t* q_row,
                              int max_rows) {
  qsakv_plan_options po;
  TU_OK(qsakv_plan_options_init(&po));
  po.max_rows = max_rows;
  qsakv_plan* plan = NULL;
  TU_OK(qsakv_plan_create(&plan, w->cache, &po));
  int32_t qs[2] = {0, 1}, lens[1] = {seq_len};
  qsakv_batch b = QSAKV_BATCH_INIT;
  b.num_requests = 1;
  b.query_start = qs;
  b.seq_lens = lens;
  b.block_table = (int32_t*)w->block_table_dev + r * w->bt_stride;
  b.block_table_stride = w->bt_stride;
  TU_OK(qsakv_plan_update(plan, &b, NULL));
  const int width = w->geo.topk_width;
  const size_t qn = (size_t)w->cfg.index_num_heads * w->cfg.index_head_dim;
  void* dq = tu_to_device(w->ctx, q_row, 2 * qn);
  void* dt = tu_device_filled(w->ctx, sizeof(int32_t) * width, 0x7B);
  TU_OK(qsakv_select_topk(plan, w->layer, dq, dt, width, NULL));
  int32_t* out = malloc(sizeof(int32_t) * width);
  tu_to_host(w->ctx, out, dt, sizeof(int32_t) * width);
  qsakv_free(w->ctx, dq);
  qsakv_free(w->ctx, dt);
  qsakv_plan_destroy(plan);
  return out;
}

/* The GPU against the CPU backend under the contract; then determinism (the same call
 * twice: identical bytes) and batch invariance (each request's last row selected alone,
 * through plans of other sizes, hence other grids and waves: identical to the batch). */
static void check_contract_cuda(qsakv_context* gpu, const tu_shape* shape) {
  qsakv_context* cpu = tu_context(QSAKV_BACKEND_CPU);
  const uint64_t seed = tu_next();
  tu_world wc, wg;
  void *comp, *comp_g;
  uint16_t *q, *q_g;
  build_contract_world(&wc, cpu, shape, seed, &comp, &q);
  build_contract_world(&wg, gpu, shape, seed, &comp_g, &q_g);
  assert_memory_equal(comp, comp_g, wc.layout.compressed_bytes_per_layer);
  int32_t* want = run_select(&wc, q, 0);
  int32_t* got = run_select(&wg, q, 0);
  const int boundary = check_contract(&wg, comp, q, want, got, "cuda vs cpu");
  int32_t* again = run_select(&wg, q, 1);
  const size_t bytes = sizeof(int32_t) * (size_t)wg.rows * wg.geo.topk_width;
  assert_memory_equal(got, again, bytes);
  const int width = wg.geo.topk_width;
  const size_t qn = (size_t)wg.cfg.index_num_heads * wg.cfg.index_head_dim;
  int last = -1, invariant = 0;
  for (int r = 0; r < wg.shape.num_requests; ++r) {
    last += wg.shape.rows[r];
    for (int max_rows = 1; max_rows <= 64; max_rows *= 64) {
      int32_t* alone = select_single_row(&wg, r, q + (size_t)last * qn, max_rows);
      if (memcmp(alone, got + (size_t)last * width, sizeof(int32_t) * width) != 0)
        fail_msg("request %d's last row selected alone (plan max_rows %d) differs from the batch",
                 r, max_rows);
      ++invariant;
      free(alone);
    }
  }
  print_message(
      "contract, cuda vs cpu, %s keys, %d index heads x %d: %d rows of %d requests, %d "
      "boundary blocks; deterministic; %d rows batch-invariant\n",
      g_index_keys == QSAKV_DTYPE_E4M3 ? "E4M3" : "FP16", wg.cfg.index_num_heads,
      wg.cfg.index_head_dim, wg.rows, shape->num_requests, boundary, invariant);
  free(again);
  free(got);
  free(want);
  free(q);
  free(q_g);
  free(comp);
  free(comp_g);
  tu_world_destroy(&wg);
  tu_world_destroy(&wc);
  qsakv_context_destroy(cpu);
}

static void test_select_contract_cuda(void** state) {
  (void)state;
  qsakv_context* gpu = tu_cuda_context_or_skip();
  for (int i = 0; i < 2; ++i) check_contract_cuda(gpu, kContractShapes[i]);
  qsakv_context_destroy(gpu);
}

/* The multi-row scorer on warpgroup MMAs (SM 9.0 with sm_90a code), which the automatic
 * choice takes only for plans of several waves whose every request has 32+ rows (larger
 * than these tests' worlds): forced through QSAKV_SELECT_MMA=wgmma, read at context
 * creation, on both contract shapes with FP16 and E4M3 keys, against the CPU backend. Where
 * the GPU or the build lacks it, the context refuses the hook (UNSUPPORTED) and the test
 * says that it skipped. A QSAKV_SELECT_MMA already set is overridden here and restored. */
static void test_select_warpgroup_scorer_cuda(void** state) {
  (void)state;
  qsakv_context_destroy(tu_cuda_context_or_skip()); /* no GPU: skipped, saying so */
  char* keep = tu_env_save("QSAKV_SELECT_MMA");
  setenv("QSAKV_SELECT_MMA", "wgmma", 1);
  qsakv_context_options o;
  TU_OK(qsakv_context_options_init(&o));
  o.backend = QSAKV_BACKEND_CUDA;
  qsakv_context* gpu = NULL;
  const qsakv_status st = qsakv_context_create(&gpu, &o); /* the hook is read here */
  tu_env_restore("QSAKV_SELECT_MMA", keep);
  if (st == QSAKV_ERROR_UNSUPPORTED) {
    fprintf(stderr, "[ SKIP     ] no warpgroup scorer on this GPU or build: %s\n",
            qsakv_last_error());
    skip();
  }
  TU_OK(st);
  for (int keys = 0; keys < 2; ++keys) {
    g_index_keys = keys ? QSAKV_DTYPE_E4M3 : QSAKV_DTYPE_FP16;
    for (int i = 0; i < 2; ++i) check_contract_cuda(gpu, kContractShapes[i]);
  }
  g_index_keys = QSAKV_DTYPE_FP16;
  print_message("warpgroup scorer (QSAKV_SELECT_MMA=wgmma): both contract shapes, FP16 and E4M3\n");
  qsakv_context_destroy(gpu);
}

/* Ties everywhere and NaN keys, exactly: every key equal (all scores tie: the lowest
 * blocks win, in order), then some keys with a NaN element (a NaN dot product counts as
 * 0 under ReLU, as in the CPU reference), some with +inf elements, all-zero keys and keys
 * of +-65504 (the FP16 limit; E4M3 codes +-448). FP16 keys: against the FP64 reference,
 * exactly. E4M3 keys (stored dead where an element is NaN or infinite, scale 0 for the
 * zero keys, other scores one FP32 rounding from FP64): the CPU backend against FP64
 * under the contract, and a GPU against the CPU backend exactly (the integer keys keep
 * every dot product exact). */
static void check_special_keys(qsakv_context* ctx, const char* what) {
  qsakv_model_config c;
  tu_small_config(&c, 4, 1, 64, QSAKV_DTYPE_FP16, QSAKV_DTYPE_FP16, 16);
  c.index_key_dtype = g_index_keys;
  const int fp8 = g_index_keys == QSAKV_DTYPE_E4M3;
  qsakv_context* cpu = fp8 && tu_is_cuda(ctx) ? tu_context(QSAKV_BACKEND_CPU) : NULL;
  /* 20000 tokens: 5000 tied blocks, more than the GPU keeps in shared memory (or in the
   * filter route's lists). With a 2-row request the batch takes the multi-row route, with
   * one row per request the one-row route: both run. */
  for (int shape_i = 0; shape_i < 2; ++shape_i) {
    tu_shape shape = {3, {1, 1 + (shape_i == 0), 1}, {4099, 2600, 20000}};
    const uint64_t seed = tu_next();
    tu_world w, wc;
    tu_world_build(&w, ctx, &c, &shape, seed, 1.0f, 1.0f, 1.0f, 0);
    if (cpu) tu_world_build(&wc, cpu, &c, &shape, seed, 1.0f, 1.0f, 1.0f, 0);
    const int64_t n = w.layout.num_blocks * w.layout.compressed_keys_per_block;
    const int D = c.index_head_dim;
    uint16_t* keys = malloc(2 * (size_t)n * D);
    int64_t* slots = malloc(sizeof(int64_t) * (size_t)n);
    for (int64_t e = 0; e < n; ++e) slots[e] = e * c.compress_ratio;
    const size_t qn = (size_t)w.rows * c.index_num_heads * c.index_head_dim;
    uint16_t* q = malloc(2 * qn);
    for (size_t i = 0; i < qn; ++i) q[i] = tu_f32_to_fp16((float)tu_int(-2, 2));
    int32_t* want = malloc(sizeof(int32_t) * (size_t)w.rows * w.geo.topk_width);
    static const char* const kPassName[3] = {"all ties", "NaN/inf/zero/limit keys",
                                             "ties beside 64x outliers"};
    for (int pass = 0; pass < 3; ++pass) {
      for (size_t i = 0; i < (size_t)n * D; ++i)
        keys[i] = pass == 1 ? tu_f32_to_fp16((float)tu_int(-3, 3)) : tu_f32_to_fp16(1.0f);
      /* A few blocks 64 times the rest: the winners are those and a crowd of equal
       * scores, which makes the GPU's bucket sort of the winners decline (its buckets cut
       * the winners' range evenly). */
      if (pass == 2)
        for (int64_t e = 0; e < n; e += 97)
          for (int d = 0; d < D; ++d) keys[e * D + d] = tu_f32_to_fp16(64.0f);
      if (pass == 1)
        for (int64_t e = 0; e < n; e += 7) {
          keys[e * D + (e % D)] = 0x7E00;           /* NaN */
          if (e % 3 == 0) keys[e * D + 5] = 0x7C00; /* +inf */
          for (int d = 0; d < D; ++d) {
            if ((e + 1) % 11 == 0) keys[(e + 1) * D + d] = 0; /* all zero */
            if ((e + 2) % 13 == 0)                            /* 0 or +-65504 */
              keys[(e + 2) * D + d] = (uint16_t[]){0x0000, 0x7BFF, 0xFBFF}[tu_int(0, 2)];
          }
        }
      void* comp = store_key_list(&w, keys, slots, n);
      int32_t* got = run_select(&w, q, 0);
      if (!fp8) {
        reference_select(&w, comp, q, want);
      } else if (cpu) {
        free(store_key_list(&wc, keys, slots, n));
        int32_t* c_got = run_select(&wc, q, 0);
        memcpy(want, c_got, sizeof(int32_t) * (size_t)w.rows * w.geo.topk_width);
        free(c_got);
      } else { /* the CPU backend itself: the contract against FP64 */
        reference_select_mapped(&w, comp, q, want);
        check_contract(&w, comp, q, want, got, "cpu vs fp64, E4M3 keys");
      }
      for (int row = 0; row < w.rows && (!fp8 || cpu); ++row)
        for (int j = 0; j < w.geo.topk_width; ++j) {
          const size_t i = (size_t)row * w.geo.topk_width + j;
          if (got[i] != want[i])
            fail_msg("%s %s row %d col %d: got %d want %d", what, kPassName[pass], row, j, got[i],
                     want[i]);
        }
      if (pass == 0) /* all ties: block j is the j-th choice */
        for (int j = 0; j < w.geo.topk_blocks; ++j)
          assert_int_equal(got[j * c.compress_ratio], j * c.compress_ratio);
      free(got);
      free(comp);
    }
    print_message(
        "%s: all-tie, NaN/inf/zero/limit and tie-beside-outlier keys selected exactly (%d rows, "
        "%s route)%s\n",
        what, w.rows, shape_i == 0 ? "multi-row" : "one-row",
        fp8 ? (cpu ? ", E4M3 keys, equal to the CPU backend" : ", E4M3 keys, contract against FP64")
            : "");
    free(want);
    free(q);
    free(keys);
    free(slots);
    if (cpu) tu_world_destroy(&wc);
    tu_world_destroy(&w);
  }
  if (cpu) qsakv_context_destroy(cpu);
}

/* Prefill chunks of 8,192 rows, the bench's size, which the contract shapes' chunks (up to
 * 216 rows) do not reach: one at positions 0-8,191 (its first rows see no complete group)
 * and one at 24,576-32,767 (two waves of the score workspace; the warpgroup scorer where
 * the GPU has it), FP16 and E4M3 keys. 48 sampled rows of each chunk's selection (the first
 * 16, the last 16, 16 spread between) must equal the row selected alone on the GPU (batch
 * invariance across grids, routes and waves) and, under the contract, the CPU backend's
 * selection of the row alone. */
static void test_select_large_chunks_cuda(void** state) {
  (void)state;
  enum { kRows = 8192, kSamples = 48 };
  qsakv_context* gpu = tu_cuda_context_or_skip();
  qsakv_context* cpu = tu_context(QSAKV_BACKEND_CPU);
  for (int keys = 0; keys < 2; ++keys) {
    g_index_keys = keys ? QSAKV_DTYPE_E4M3 : QSAKV_DTYPE_FP16;
    for (int chunk = 0; chunk < 2; ++chunk) {
      qsakv_model_config c;
      contract_config(&c);
      c.max_batched_tokens = kRows;
      const tu_shape shape = {1, {kRows}, {chunk == 0 ? kRows : 4 * kRows}};
      const uint64_t seed = tu_next();
      tu_world wg, wc;
      tu_world_build(&wg, gpu, &c, &shape, seed, 1.0f, 1.0f, 1.0f, 0);
      tu_world_build(&wc, cpu, &c, &shape, seed, 1.0f, 1.0f, 1.0f, 0);
      void* comp = randomise_keys(&wg, seed ^ 0x5EEDull);
      void* comp_c = randomise_keys(&wc, seed ^ 0x5EEDull);
      assert_memory_equal(comp, comp_c, wg.layout.compressed_bytes_per_layer);
      uint16_t* q = random_index_q(&wg, seed ^ 0xC0FFEEull);
      int32_t* got = run_select(&wg, q, 0);
      const int width = wg.geo.topk_width;
      const size_t qn = (size_t)c.index_num_heads * c.index_head_dim;
      int boundary = 0;
      for (int i = 0; i < kSamples; ++i) {
        const int row = i < 16 ? i : i < 32 ? kRows - 32 + i : 16 + (i - 32) * (kRows - 32) / 16;
        const int pos = tu_row_pos(&wg, row);
        const uint16_t* q_row = q + (size_t)row * qn;
        const int32_t* g = got + (size_t)row * width;
        int32_t* alone = select_row_at(&wg, 0, pos + 1, q_row, 1);
        if (memcmp(alone, g, sizeof(int32_t) * width) != 0)
          fail_msg(
              "%d-row chunk at %d tokens, %s keys: row %d (position %d) selected alone "
              "differs from the chunk",
              kRows, shape.seq_lens[0], keys ? "E4M3" : "FP16", row, pos);
        int32_t* want = select_row_at(&wc, 0, pos + 1, q_row, 1);
        tu_world view = wg; /* request 0 as a batch of this one row */
        view.shape = (tu_shape){1, {1}, {pos + 1}};
        view.rows = 1;
        boundary += check_contract(&view, comp, q_row, want, g, "8192-row chunk vs cpu");
        free(alone);
        free(want);
      }
      print_message(
          "%d-row chunk at %d tokens, %s keys: %d sampled rows equal to the row alone "
          "and to the CPU under the contract (%d boundary blocks)\n",
          kRows, shape.seq_lens[0], keys ? "E4M3" : "FP16", kSamples, boundary);
      free(got);
      free(q);
      free(comp);
      free(comp_c);
      tu_world_destroy(&wg);
      tu_world_destroy(&wc);
    }
  }
  g_index_keys = QSAKV_DTYPE_FP16;
  qsakv_context_destroy(cpu);
  qsakv_context_destroy(gpu);
}

/* A wave of more one-row requests than the GPU has SMs (and than the filter route keeps
 * lists for) takes the one-CTA-per-row top-k; a row alone takes the many-CTA filter. 520
 * requests that all read request 0's pages with the same query must each equal that row
 * selected alone. */
static void test_select_many_rows_cuda(void** state) {
  (void)state;
  enum { kRows = 520 };
  qsakv_context* gpu = tu_cuda_context_or_skip();
  qsakv_model_config c;
  contract_config(&c);
  c.max_requests = kRows;
  c.max_batched_tokens = kRows;
  c.max_model_len = 16384;
  const tu_shape shape = {1, {1}, {12001}};
  tu_world w;
  tu_world_build(&w, gpu, &c, &shape, tu_next(), 1.0f, 1.0f, 1.0f, 0);
  void* comp = randomise_keys(&w, tu_next());
  uint16_t* q = random_index_q(&w, tu_next());
  int32_t* alone = select_single_row(&w, 0, q, 1);
  const size_t qn = (size_t)c.index_num_heads * c.index_head_dim;
  const int width = w.geo.topk_width;
  int32_t* bt = malloc(sizeof(int32_t) * kRows * w.bt_stride);
  uint16_t* qs_host = malloc(2 * qn * kRows);
  int32_t qs[kRows + 1], lens[kRows];
  for (int r = 0; r < kRows; ++r) {
    memcpy(bt + (size_t)r * w.bt_stride, w.block_table, sizeof(int32_t) * w.bt_stride);
    memcpy(qs_host + (size_t)r * qn, q, 2 * qn);
    qs[r] = r;
    lens[r] = shape.seq_lens[0];
  }
  qs[kRows] = kRows;
  void* dbt = tu_to_device(gpu, bt, sizeof(int32_t) * kRows * w.bt_stride);
  void* dq = tu_to_device(gpu, qs_host, 2 * qn * kRows);
  void* dt = tu_device_filled(gpu, sizeof(int32_t) * width * kRows, 0x7B);
  qsakv_plan_options po;
  TU_OK(qsakv_plan_options_init(&po));
  po.max_rows = kRows;
  qsakv_plan* plan = NULL;
  TU_OK(qsakv_plan_create(&plan, w.cache, &po));
  qsakv_batch b = QSAKV_BATCH_INIT;
  b.num_requests = kRows;
  b.query_start = qs;
  b.seq_lens = lens;
  b.block_table = dbt;
  b.block_table_stride = w.bt_stride;
  TU_OK(qsakv_plan_update(plan, &b, NULL));
  TU_OK(qsakv_select_topk(plan, w.layer, dq, dt, width, NULL));
  int32_t* got = malloc(sizeof(int32_t) * width * kRows);
  tu_to_host(gpu, got, dt, sizeof(int32_t) * width * kRows);
  for (int r = 0; r < kRows; ++r)
    if (memcmp(got + (size_t)r * width, alone, sizeof(int32_t) * width) != 0)
      fail_msg("row %d of %d identical one-row requests differs from the row selected alone", r,
               kRows);
  print_message(
      "cuda: %d identical one-row requests (one CTA per row) equal the row selected alone "
      "(many CTAs per row)\n",
      kRows);
  qsakv_plan_destroy(plan);
  qsakv_free(gpu, dbt);
  qsakv_free(gpu, dq);
  qsakv_free(gpu, dt);
  free(got);
  free(qs_host);
  free(bt);
  free(alone);
  free(q);
  free(comp);
  tu_world_destroy(&w);
  qsakv_context_destroy(gpu);
}

static void test_select_special_cpu(void** state) {
  (void)state;
  qsakv_context* ctx = tu_context(QSAKV_BACKEND_CPU);
  check_special_keys(ctx, "cpu");
  qsakv_context_destroy(ctx);
}

static void test_select_special_cuda(void** state) {
  (void)state;
  qsakv_context* ctx = tu_cuda_context_or_skip();
  check_special_keys(ctx, "cuda");
  qsakv_context_destroy(ctx);
}

/* Calls in a row leave nothing behind for the next one: 40 selections of the same decode
 * batches enqueued back to back, as a captured decode step replays them (one row at
 * 256K, 8 rows at 128K: the filter route, whose histogram the scoring kernel builds and
 * the top-k kernel clears for the next call), give identical bytes, with FP16 and with
 * E4M3 keys. */
static void test_select_repeated_cuda(void** state) {
  (void)state;
  qsakv_context* gpu = tu_cuda_context_or_skip();
  const tu_shape shapes[2] = {{1, {1}, {262144}},
                              {8,
                               {1, 1, 1, 1, 1, 1, 1, 1},
                               {131072, 131071, 130000, 99999, 131072, 120000, 131000, 65536}}};
  for (int keys = 0; keys < 2; ++keys)
    for (int si = 0; si < 2; ++si) {
      g_index_keys = keys ? QSAKV_DTYPE_E4M3 : QSAKV_DTYPE_FP16;
      qsakv_model_config c;
      contract_config(&c);
      tu_world w;
      tu_world_build(&w, gpu, &c, &shapes[si], tu_next(), 1.0f, 1.0f, 1.0f, 0);
      void* comp = randomise_keys(&w, tu_next());
      uint16_t* q = random_index_q(&w, tu_next());
      const int width = w.geo.topk_width;
      const size_t bytes = sizeof(int32_t) * (size_t)w.rows * width;
      void* dq = tu_to_device(gpu, q, 2 * (size_t)w.rows * c.index_num_heads * c.index_head_dim);
      void* dt = tu_device_filled(gpu, 40 * bytes, 0x7B);
      for (int call = 0; call < 40; ++call) /* no synchronisation between the calls */
        TU_OK(qsakv_select_topk(w.plan, w.layer, dq, (int32_t*)dt + (size_t)call * w.rows * width,
                                width, NULL));
      int32_t* all = malloc(40 * bytes);
      tu_to_host(gpu, all, dt, 40 * bytes);
      int32_t* first = malloc(bytes);
      memcpy(first, all, bytes);
      for (int call = 1; call < 40; ++call)
        if (memcmp(first, all + (size_t)call * w.rows * width, bytes) != 0)
          fail_msg("%s keys, %d rows: call %d differs from the first", keys ? "E4M3" : "FP16",
                   w.rows, call);
      free(all);
      qsakv_free(gpu, dq);
      qsakv_free(gpu, dt);
      print_message("cuda, %s keys: 40 calls of %d decode rows identical\n", keys ? "E4M3" : "FP16",
                    w.rows);
      free(first);
      free(q);
      free(comp);
      tu_world_destroy(&w);
    }
  g_index_keys = QSAKV_DTYPE_FP16;
  qsakv_context_destroy(gpu);
}

/* The same checks with E4M3 index keys. */
static void with_e4m3_keys(void (*test)(void**), void** state) {
  g_index_keys = QSAKV_DTYPE_E4M3;
  test(state);
  g_index_keys = QSAKV_DTYPE_FP16;
}
static void test_select_cpu(void** state);
static void test_select_cuda(void** state);
static void test_select_e4m3_keys_cpu(void** state) { with_e4m3_keys(test_select_cpu, state); }
static void test_select_e4m3_keys_cuda(void** state) { with_e4m3_keys(test_select_cuda, state); }
static void test_select_e4m3_keys_special_cpu(void** state) {
  with_e4m3_keys(test_select_special_cpu, state);
}
static void test_select_e4m3_keys_special_cuda(void** state) {
  with_e4m3_keys(test_select_special_cuda, state);
}
static void test_select_e4m3_keys_contract_cpu(void** state) {
  with_e4m3_keys(test_select_contract_cpu, state);
}
static void test_select_e4m3_keys_contract_cuda(void** state) {
  with_e4m3_keys(test_select_contract_cuda, state);
}

/* The contract on index geometries other than the reference's (4 x 128), which the tests
 * above use: on a GPU the multi-row scorer's other compiled shapes (128-dim keys with 2 and
 * 8 head columns per row, padded from 2, 6 and 8 heads; 64-dim keys with 4, padded from
 * 3), with FP16 and E4M3 keys; on the CPU backend the same worlds against FP64. */
static void for_index_geometries(void (*test)(void**), void** state) {
  const int shapes[4][2] = {{2, 128}, {6, 128}, {8, 128}, {3, 64}};
  for (int i = 0; i < 4; ++i) {
    g_index_heads = shapes[i][0];
    g_index_dim = shapes[i][1];
    g_index_keys = QSAKV_DTYPE_FP16; /* (a skipped E4M3 test leaves it set: skip() jumps out) */
    test(state);
    with_e4m3_keys(test, state);
  }
  g_index_heads = g_index_dim = 0;
}
static void test_select_index_geometries_cpu(void** state) {
  for_index_geometries(test_select_contract_cpu, state);
}
static void test_select_index_geometries_cuda(void** state) {
  qsakv_context_destroy(tu_cuda_context_or_skip()); /* skips before any global is set */
  for_index_geometries(test_select_contract_cuda, state);
}

static void test_select_cpu(void** state) {
  (void)state;
  qsakv_context* ctx = tu_context(QSAKV_BACKEND_CPU);
  check_select(ctx, "cpu");
  qsakv_context_destroy(ctx);
}

static void test_select_cuda(void** state) {
  (void)state;
  qsakv_context* ctx = tu_cuda_context_or_skip();
  check_select(ctx, "cuda");
  qsakv_context_destroy(ctx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_select_cpu),
      cmocka_unit_test(test_select_cuda),
      cmocka_unit_test(test_select_special_cpu),
      cmocka_unit_test(test_select_special_cuda),
      cmocka_unit_test(test_select_contract_cpu),
      cmocka_unit_test(test_select_contract_cuda),
      cmocka_unit_test(test_select_warpgroup_scorer_cuda),
      cmocka_unit_test(test_select_many_rows_cuda),
      cmocka_unit_test(test_select_large_chunks_cuda),
      cmocka_unit_test(test_select_repeated_cuda),
      cmocka_unit_test(test_select_score_only_cuda),
      cmocka_unit_test(test_select_sorts_agree_cuda),
      cmocka_unit_test(test_select_e4m3_keys_cpu),
      cmocka_unit_test(test_select_e4m3_keys_cuda),
      cmocka_unit_test(test_select_e4m3_keys_special_cpu),
      cmocka_unit_test(test_select_e4m3_keys_special_cuda),
      cmocka_unit_test(test_select_e4m3_keys_contract_cpu),
      cmocka_unit_test(test_select_e4m3_keys_contract_cuda),
      cmocka_unit_test(test_select_index_geometries_cpu),
      cmocka_unit_test(test_select_index_geometries_cuda),
  };
  tu_store_kv = 0; /* selection reads only the compressed keys */
  tu_apply_filter();
  return cmocka_run_group_tests_name("select", tests, NULL, NULL);
}
