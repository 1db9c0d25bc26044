// SPDX-License-Identifier: Apache-2.0
/* CUDA graphs: select + attention captured once for a plan's maximum shape, then the
 * plan re-planned for other batches (fewer rows, other requests, other lengths, another
 * block table) and the graph replayed without re-capture: each replay must equal a
 * direct (uncaptured) run of the same batch bit for bit, and stay within the FP64
 * bound. Nothing in the captured calls may allocate or synchronise, or capture fails. */
#include <stdlib.h>
#include <string.h>

#include "scenario.h"

#ifdef QSAKV_TEST_HAVE_CUDART
#include <cuda_runtime_api.h>

#define CUDA_OK(x) assert_int_equal((int)(x), 0)

typedef struct {
  int n;
  int req[8]; /* world request of each batch request */
  int rows[8];
} sub_batch;

static void update(tu_world* w, const sub_batch* sb, void** dbt, cudaStream_t stream) {
  int32_t qs[9] = {0}, lens[8];
  int32_t* bt = malloc(sizeof(int32_t) * sb->n * w->bt_stride);
  for (int i = 0; i < sb->n; ++i) {
    qs[i + 1] = qs[i] + sb->rows[i];
    lens[i] = w->shape.seq_lens[sb->req[i]];
    memcpy(bt + i * w->bt_stride, w->block_table + sb->req[i] * w->bt_stride,
           sizeof(int32_t) * w->bt_stride);
  }
  *dbt = tu_to_device(w->ctx, bt, sizeof(int32_t) * sb->n * w->bt_stride);
  free(bt);
  qsakv_batch b = QSAKV_BATCH_INIT;
  b.num_requests = sb->n;
  b.query_start = qs;
  b.seq_lens = lens;
  b.block_table = *dbt;
  b.block_table_stride = w->bt_stride;
  TU_OK(qsakv_plan_update(w->plan, &b, (qsakv_stream_t)stream));
}

static void enqueue(tu_world* w, void* iq, void* q, void* out, cudaStream_t s) {
  TU_OK(qsakv_select_topk(w->plan, w->layer, iq, NULL, 0, (qsakv_stream_t)s));
  TU_OK(qsakv_attention_run(w->plan, w->layer, QSAKV_ATTENTION_SPARSE, q, NULL, 0, out,
                            (qsakv_stream_t)s));
}

/* min_rows: the plan's multi_row_min_rows (0: automatic, these batches stay on the decode
 * route; 1: every row on the grouped route). */
static void capture_replan_replay(int min_rows) {
  qsakv_context* ctx = tu_cuda_context_or_skip();
  tu_multi_row_min_rows = min_rows;
  qsakv_model_config c;
  tu_small_config(&c, 6, 1, 256, QSAKV_DTYPE_FP16, QSAKV_DTYPE_E4M3, 64);
  tu_shape shape = {4, {1, 4, 3, 8}, {3000, 2500, 700, 90}};
  tu_world w;
  tu_world_build(&w, ctx, &c, &shape, tu_next(), 2.0f, 0.01f, 0.01f, 0); /* max_rows 16 */
  tu_multi_row_min_rows = 0;
  const int max_rows = w.rows;
  const size_t qn = (size_t)max_rows * w.geo.q_heads * c.head_dim;
  const size_t iqn = (size_t)max_rows * c.index_num_heads * c.index_head_dim;
  uint16_t* hq = malloc(2 * qn);
  uint16_t* hiq = malloc(2 * iqn);
  void* q = tu_device_filled(ctx, 2 * qn, 0);
  void* iq = tu_device_filled(ctx, 2 * iqn, 0);
  void* out_graph = tu_device_filled(ctx, 2 * qn, 0xFF);
  void* out_direct = tu_device_filled(ctx, 2 * qn, 0xFF);
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

  /* Capture with the full batch. */
  const sub_batch full = {4, {0, 1, 2, 3}, {1, 4, 3, 8}};
  void* dbt = NULL;
  update(&w, &full, &dbt, s);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  enqueue(&w, iq, q, out_graph, s);
  CUDA_OK(cudaStreamEndCapture(s, &graph));
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  CUDA_OK(cudaStreamSynchronize(s));
  qsakv_free(ctx, dbt);

  const sub_batch batches[] = {
      {4, {0, 1, 2, 3}, {1, 4, 3, 8}}, /* the captured shape */
      {1, {0}, {1}},                   /* a single decode row */
      {3, {3, 0, 2}, {8, 1, 2}},       /* other requests, other order, fewer rows */
      {2, {1, 1}, {4, 4}},             /* the same request twice */
  };
  uint16_t* a = malloc(2 * qn);
  uint16_t* b = malloc(2 * qn);
  for (size_t k = 0; k < sizeof batches / sizeof batches[0]; ++k) {
    for (size_t i = 0; i < qn; ++i) hq[i] = tu_f32_to_fp16((float)tu_normal());
    for (size_t i = 0; i < iqn; ++i) hiq[i] = tu_f32_to_fp16((float)tu_int(-2, 2));
    CUDA_OK(cudaMemcpyAsync(q, hq, 2 * qn, cudaMemcpyHostToDevice, s));
    CUDA_OK(cudaMemcpyAsync(iq, hiq, 2 * iqn, cudaMemcpyHostToDevice, s));
    CUDA_OK(cudaMemsetAsync(out_graph, 0xFF, 2 * qn, s));
    CUDA_OK(cudaMemsetAsync(out_direct, 0xFF, 2 * qn, s));
    update(&w, &batches[k], &dbt, s);
    CUDA_OK(cudaGraphLaunch(exec, s));
    enqueue(&w, iq, q, out_direct, s);
    CUDA_OK(cudaStreamSynchronize(s));
    int rows = 0;
    for (int i = 0; i < batches[k].n; ++i) rows += batches[k].rows[i];
    const size_t n = (size_t)rows * w.geo.q_heads * c.head_dim;
    tu_to_host(ctx, a, out_graph, 2 * n);
    tu_to_host(ctx, b, out_direct, 2 * n);
    size_t nan = 0;
    for (size_t i = 0; i < n; ++i) nan += (a[i] & 0x7C00) == 0x7C00;
    print_message("%s: batch %zu: %d rows, replay vs direct %s, %zu non-finite\n",
                  min_rows == 1 ? "grouped" : "auto", k, rows,
                  memcmp(a, b, 2 * n) == 0 ? "identical" : "DIFFERENT", nan);
    assert_int_equal(nan, 0);
    assert_memory_equal(a, b, 2 * n);
    qsakv_free(ctx, dbt);
  }
  CUDA_OK(cudaGraphExecDestroy(exec));
  CUDA_OK(cudaGraphDestroy(graph));

  /* A graph captured while the plan held an empty batch (a warm-up or idle step) still
   * holds the kernels: replayed after a real update, it equals a direct run. (Without
   * row groups at capture it holds no grouped kernels: on the grouped plan, the replay
   * runs every row on the decode route, so it matches the direct run within the
   * attention bound instead of bit for bit.) */
  const sub_batch empty = {0, {0}, {0}};
  update(&w, &empty, &dbt, s);
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  enqueue(&w, iq, q, out_graph, s);
  CUDA_OK(cudaStreamEndCapture(s, &graph));
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  CUDA_OK(cudaStreamSynchronize(s));
  qsakv_free(ctx, dbt);
  CUDA_OK(cudaMemsetAsync(out_graph, 0xFF, 2 * qn, s));
  CUDA_OK(cudaMemsetAsync(out_direct, 0xFF, 2 * qn, s));
  update(&w, &batches[2], &dbt, s);
  CUDA_OK(cudaGraphLaunch(exec, s));
  enqueue(&w, iq, q, out_direct, s);
  CUDA_OK(cudaStreamSynchronize(s));
  {
    const size_t n = (size_t)(8 + 1 + 2) * w.geo.q_heads * c.head_dim;
    tu_to_host(ctx, a, out_graph, 2 * n);
    tu_to_host(ctx, b, out_direct, 2 * n);
    double* da = malloc(sizeof(double) * n);
    double* db = malloc(sizeof(double) * n);
    size_t nan = 0;
    for (size_t i = 0; i < n; ++i) {
      da[i] = tu_fp16_to_f32(a[i]);
      db[i] = tu_fp16_to_f32(b[i]);
      nan += (a[i] & 0x7C00) == 0x7C00;
    }
    const double err = tu_rel_l2(db, da, n);
    print_message("%s: captured empty, replayed with 11 rows: %s (rel_l2 %.3e), %zu non-finite\n",
                  min_rows == 1 ? "grouped" : "auto",
                  memcmp(a, b, 2 * n) == 0 ? "identical" : "different routes", err, nan);
    assert_int_equal(nan, 0);
    if (min_rows == 1)
      assert_true(err <= 2e-3);
    else
      assert_memory_equal(a, b, 2 * n);
    free(da);
    free(db);
  }
  qsakv_free(ctx, dbt);
  CUDA_OK(cudaGraphExecDestroy(exec));
  CUDA_OK(cudaGraphDestroy(graph));
  CUDA_OK(cudaStreamDestroy(s));
  free(a);
  free(b);
  free(hq);
  free(hiq);
  qsakv_free(ctx, q);
  qsakv_free(ctx, iq);
  qsakv_free(ctx, out_graph);
  qsakv_free(ctx, out_direct);
  tu_world_destroy(&w);
  qsakv_context_destroy(ctx);
}

static void test_capture_replan_replay(void** state) {
  (void)state;
  capture_replan_replay(0);
  capture_replan_replay(1);
}
#else
static void test_capture_replan_replay(void** state) {
  (void)state;
  fprintf(stderr, "[ SKIP     ] built without the CUDA runtime: no graphs to test\n");
  skip();
}
#endif

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_capture_replan_replay)};
  tu_apply_filter();
  return cmocka_run_group_tests_name("graph", tests, NULL, NULL);
}
