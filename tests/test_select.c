/* Indexer selection against a reference written here: FP64 scores, exact top-k (score
 * descending, block ascending on ties: the keys are small integers, so ties happen and
 * scores are exact in every precision), expansion with the open group's tail, -1
 * padding; requests shorter than one group; visibility stops at the row's position. */
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

static void reference_select(const tu_world* w, const uint16_t* comp_host, const uint16_t* q,
                             int32_t* out) {
  const int ratio = w->cfg.compress_ratio, D = w->cfg.index_head_dim, H = w->cfg.index_num_heads;
  const int bs = w->cfg.block_size, width = w->geo.topk_width;
  for (int row = 0; row < w->rows; ++row) {
    const int req = tu_row_request(w, row), pos = tu_row_pos(w, row);
    const int visible = (pos + 1) / ratio;
    scored* sc = malloc(sizeof(scored) * (visible + 1));
    for (int b = 0; b < visible; ++b) {
      const int t0 = b * ratio;
      const int phys = w->block_table[req * w->bt_stride + t0 / bs];
      const uint16_t* k = comp_host + ((size_t)phys * (bs / ratio) + (t0 % bs) / ratio) * D;
      double s = 0;
      for (int h = 0; h < H; ++h) {
        double dot = 0;
        for (int d = 0; d < D; ++d)
          dot += (double)tu_fp16_to_f32(q[((size_t)row * H + h) * D + d]) * tu_fp16_to_f32(k[d]);
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
    qsakv_layer_buffers lb;
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
  /* decode rows at long contexts (more than 512 visible groups), verify rows, a
   * request shorter than one group, one exactly at a group boundary, an empty one */
  tu_shape shape = {6, {1, 4, 2, 1, 0, 3}, {4099, 2600, 3, 8, 5, 700}};
  tu_world w;
  tu_world_build(&w, ctx, &c, &shape, tu_next(), 1.0f, 1.0f, 1.0f, 0);
  qsakv_layer_buffers lb;
  TU_OK(qsakv_cache_get_layer_buffers(w.cache, w.layer, &lb));
  uint16_t* comp = malloc(w.layout.compressed_bytes_per_layer);
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
  };
  tu_apply_filter();
  return cmocka_run_group_tests_name("select", tests, NULL, NULL);
}
