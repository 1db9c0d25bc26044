// SPDX-License-Identifier: Apache-2.0
/* CUDA graphs: select + attention captured once for a plan's maximum shape, then the
 * plan re-planned for other batches (fewer rows, other requests, other lengths, another
 * block table) and the graph replayed without re-capture: each replay must equal a
 * direct (uncaptured) run of the same batch bit for bit, and stay within the FP64
 * bound. Nothing in the captured calls may allocate or synchronise, or capture fails.
 * Then attention alone captured over caller-provided lists: the list buffer rewritten
 * between replays (other overlaps, unions past the grouped route's old workspace), each
 * replay equal to a direct run bit for bit and within the FP64 bound. And a whole decode
 * step (stores, selection, attention) captured once and replayed with new inputs, each
 * replay equal to the same calls run directly on a twin world. */
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

static tu_world view_of(const tu_world* w, const sub_batch* sb);

/* min_rows: the plan's multi_row_min_rows (0: automatic, these batches stay on the decode
 * route; 1: every row on the grouped route). index_keys: the compressed index keys' dtype
 * (the selection's scoring kernels differ). */
static void capture_replan_replay(int min_rows, qsakv_dtype index_keys) {
  qsakv_context* ctx = tu_cuda_context_or_skip();
  tu_multi_row_min_rows = min_rows;
  qsakv_model_config c;
  tu_small_config(&c, 6, 1, 256, QSAKV_DTYPE_FP16, QSAKV_DTYPE_E4M3, 64);
  c.index_key_dtype = index_keys;
  const char* route = index_keys == QSAKV_DTYPE_E4M3
                          ? (min_rows == 1 ? "grouped, E4M3 keys" : "auto, E4M3 keys")
                          : (min_rows == 1 ? "grouped" : "auto");
  tu_shape shape = {4, {1, 4, 3, 8}, {3000, 2500, 700, 90}};
  tu_world w;
  tu_world_build(&w, ctx, &c, &shape, tu_next(), 2.0f, 0.01f, 0.01f, 0); /* max_rows 16 */
  tu_multi_row_min_rows = 0;
  const int max_rows = w.rows;
  void* kv = tu_world_read_kv(&w);
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
    print_message("%s: batch %zu: %d rows, replay vs direct %s, %zu non-finite\n", route, k, rows,
                  memcmp(a, b, 2 * n) == 0 ? "identical" : "DIFFERENT", nan);
    assert_int_equal(nan, 0);
    assert_memory_equal(a, b, 2 * n);
    /* Equal to the direct run, and right: the FP64 attention over the lists the replayed
     * selection wrote (the layer's shared top-k buffer, topk_width wide). */
    qsakv_layer_buffers lb = {sizeof lb, QSAKV_LAYER_BUFFERS_VERSION};
    TU_OK(qsakv_cache_get_layer_buffers(w.cache, w.layer, &lb));
    const int width = w.geo.topk_width;
    int32_t* lists = malloc(sizeof(int32_t) * (size_t)rows * width);
    tu_to_host(ctx, lists, lb.topk, sizeof(int32_t) * (size_t)rows * width);
    tu_world v = view_of(&w, &batches[k]);
    double* ref = malloc(sizeof(double) * n);
    double* got = malloc(sizeof(double) * n);
    tu_reference_attention(&v, kv, hq, lists, width, 0, ref);
    for (size_t i = 0; i < n; ++i) got[i] = tu_fp16_to_f32(a[i]);
    const double err = tu_rel_l2(ref, got, n);
    print_message("%s: batch %zu: rel_l2 vs FP64 %.3e (bound 2e-3)\n", route, k, err);
    assert_true(err <= 2e-3);
    free(lists);
    free(ref);
    free(got);
    free(v.block_table);
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
                  route, memcmp(a, b, 2 * n) == 0 ? "identical" : "different routes", err, nan);
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
  free(kv);
  qsakv_free(ctx, q);
  qsakv_free(ctx, iq);
  qsakv_free(ctx, out_graph);
  qsakv_free(ctx, out_direct);
  tu_world_destroy(&w);
  qsakv_context_destroy(ctx);
}

static void test_capture_replan_replay(void** state) {
  (void)state;
  capture_replan_replay(0, QSAKV_DTYPE_FP16);
  capture_replan_replay(1, QSAKV_DTYPE_FP16);
  capture_replan_replay(0, QSAKV_DTYPE_E4M3);
}

/* w restricted to a sub-batch (its requests' rows and block-table rows), for the host-side
 * lists and reference of that batch; the caller frees view.block_table. */
static tu_world view_of(const tu_world* w, const sub_batch* sb) {
  tu_world v = *w;
  v.shape.num_requests = sb->n;
  v.rows = 0;
  v.block_table = malloc(sizeof(int32_t) * ((size_t)sb->n * w->bt_stride + 1));
  for (int i = 0; i < sb->n; ++i) {
    v.shape.rows[i] = sb->rows[i];
    v.shape.seq_lens[i] = w->shape.seq_lens[sb->req[i]];
    memcpy(v.block_table + i * w->bt_stride, w->block_table + sb->req[i] * w->bt_stride,
           sizeof(int32_t) * w->bt_stride);
    v.rows += sb->rows[i];
  }
  return v;
}

/* Writes `lists` (v's rows) into the captured top-k buffer, replays the graph into
 * out_graph and runs the same call eagerly into out_direct (both NaN-poisoned first):
 * equal bit for bit, all finite, within the FP64 bound of v's reference. */
static void replay_and_check(const tu_world* v, const char* what, cudaGraphExec_t exec,
                             cudaStream_t s, const void* kv, const uint16_t* hq, void* q,
                             void* dtopk, const int32_t* lists, int64_t stride, void* out_graph,
                             void* out_direct) {
  const size_t n = (size_t)v->rows * v->geo.q_heads * v->cfg.head_dim;
  /* On s: cudaMemcpy from pageable memory may return before its DMA lands, and s (a
   * non-blocking stream) does not wait for the legacy stream. */
  CUDA_OK(cudaMemcpyAsync(dtopk, lists, sizeof(int32_t) * (size_t)v->rows * stride,
                          cudaMemcpyHostToDevice, s));
  CUDA_OK(cudaMemsetAsync(out_graph, 0xFF, 2 * n, s));
  CUDA_OK(cudaMemsetAsync(out_direct, 0xFF, 2 * n, s));
  CUDA_OK(cudaGraphLaunch(exec, s));
  TU_OK(qsakv_attention_run(v->plan, v->layer, QSAKV_ATTENTION_SPARSE, q, dtopk, stride, out_direct,
                            (qsakv_stream_t)s));
  CUDA_OK(cudaStreamSynchronize(s));
  uint16_t* a = malloc(2 * n);
  uint16_t* b = malloc(2 * n);
  tu_to_host(v->ctx, a, out_graph, 2 * n);
  tu_to_host(v->ctx, b, out_direct, 2 * n);
  double* ref = malloc(sizeof(double) * n);
  double* got = malloc(sizeof(double) * n);
  tu_reference_attention(v, kv, hq, lists, stride, 0, ref);
  size_t nan = 0;
  for (size_t i = 0; i < n; ++i) {
    nan += (a[i] & 0x7C00) == 0x7C00;
    got[i] = tu_fp16_to_f32(a[i]);
  }
  const double err = tu_rel_l2(ref, got, n);
  print_message("%s: replay vs eager %s, rel_l2 vs FP64 %.3e (bound 2e-3), %zu non-finite\n", what,
                memcmp(a, b, 2 * n) == 0 ? "identical" : "DIFFERENT", err, nan);
  assert_int_equal(nan, 0);
  assert_memory_equal(a, b, 2 * n);
  assert_true(err <= 2e-3);
  free(a);
  free(b);
  free(ref);
  free(got);
}

/* Caller-provided lists under a graph that captured attention alone (a device top-k
 * buffer and stride, mode SPARSE) on a plan with row groups: the buffer overwritten with
 * lists of other overlaps, not re-planned, and the graph replayed; then the plan
 * re-planned to single-row requests and the graph replayed once more. min_rows: the plan's
 * multi_row_min_rows, 1 (every request grouped, the single rows too: groups of one row)
 * or 2 (the decode row takes the decode route at capture; the single-row batch has no
 * groups at all, so the captured grouped kernels must do nothing and the decode kernels
 * every row). */
static void caller_lists_replay(int min_rows) {
  qsakv_context* ctx = tu_cuda_context_or_skip();
  const int grouped = tu_has_grouped_route(ctx);
  qsakv_model_config c;
  tu_small_config(&c, 6, 1, 256, QSAKV_DTYPE_FP16, QSAKV_DTYPE_E4M3, 64);
  tu_shape shape = {3, {40, 16, 1}, {9000, 3000, 5000}};
  tu_reserve_block0 = 1; /* block 0 unmapped and NaN-poisoned */
  tu_multi_row_min_rows = min_rows;
  tu_world w;
  tu_world_build(&w, ctx, &c, &shape, tu_next(), 2.0f, 0.01f, 0.008f, 0);
  tu_multi_row_min_rows = 0;
  tu_reserve_block0 = 0;
  tu_assert_block0_unmapped(&w);
  qsakv_plan_info pi;
  memset(&pi, 0, sizeof pi);
  pi.struct_size = sizeof pi;
  TU_OK(qsakv_plan_get_info(w.plan, &pi));
  if (grouped) {
    assert_int_equal(pi.num_groups, min_rows == 1 ? 5 : 4); /* 16 + 16 + 8, 16 (+ 1) */
    assert_int_equal(pi.grouped_rows, min_rows == 1 ? 57 : 56);
  } else {
    assert_int_equal(pi.grouped_rows, 0);
  }
  const int width = w.geo.topk_width;
  const int64_t stride = width + 3;
  const size_t qn = (size_t)w.rows * w.geo.q_heads * c.head_dim;
  void* kv = tu_world_read_kv(&w);
  uint16_t* hq = malloc(2 * qn);
  for (size_t i = 0; i < qn; ++i) hq[i] = tu_f32_to_fp16((float)tu_normal());
  void* q = tu_to_device(ctx, hq, 2 * qn);
  void* dtopk = tu_device_filled(ctx, sizeof(int32_t) * (size_t)w.rows * stride, 0xFF);
  void* out_graph = tu_device_filled(ctx, 2 * qn, 0xFF);
  void* out_direct = tu_device_filled(ctx, 2 * qn, 0xFF);
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

  /* Lists of each overlap; the graph captures with the first. */
  const double fs[4] = {0.9, 1.0, 0.5, 0.0};
  int32_t* lists[4];
  for (int k = 0; k < 4; ++k) lists[k] = tu_overlap_topk(&w, stride, fs[k], width - k % 3);
  CUDA_OK(cudaMemcpyAsync(dtopk, lists[0], sizeof(int32_t) * (size_t)w.rows * stride,
                          cudaMemcpyHostToDevice, s));
  CUDA_OK(cudaStreamSynchronize(s));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  TU_OK(qsakv_attention_run(w.plan, w.layer, QSAKV_ATTENTION_SPARSE, q, dtopk, stride, out_graph,
                            (qsakv_stream_t)s));
  CUDA_OK(cudaStreamEndCapture(s, &graph));
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));

  /* The other overlaps, then the captured lists again. */
  const int order[5] = {0, 1, 2, 3, 0};
  for (int i = 0; i < 5; ++i) {
    const int k = order[i];
    const int u = tu_max_window_union(&w, lists[k], stride);
    if (fs[k] <= 0.5) assert_true(u > 2 * width + 64); /* past the old union workspace */
    char what[160];
    snprintf(what, sizeof what, "min_rows %d, captured f=0.90, replayed f=%.2f (union<=%d)",
             min_rows, fs[k], u);
    replay_and_check(&w, what, exec, s, kv, hq, q, dtopk, lists[k], stride, out_graph, out_direct);
  }

  /* Re-planned to single rows of three requests, lists f=0.5 (shared by a group of one
   * row at most). */
  const sub_batch single = {3, {2, 0, 1}, {1, 1, 1}};
  void* dbt = NULL;
  update(&w, &single, &dbt, s);
  CUDA_OK(cudaStreamSynchronize(s));
  memset(&pi, 0, sizeof pi);
  pi.struct_size = sizeof pi;
  TU_OK(qsakv_plan_get_info(w.plan, &pi));
  assert_int_equal(pi.num_groups, grouped && min_rows == 1 ? 3 : 0);
  tu_world v = view_of(&w, &single);
  int32_t* single_lists = tu_overlap_topk(&v, stride, 0.5, width);
  char what[160];
  snprintf(what, sizeof what, "min_rows %d, re-planned to 3 single rows (%d groups), replayed",
           min_rows, pi.num_groups);
  replay_and_check(&v, what, exec, s, kv, hq, q, dtopk, single_lists, stride, out_graph,
                   out_direct);
  free(single_lists);
  free(v.block_table);
  qsakv_free(ctx, dbt);

  CUDA_OK(cudaGraphExecDestroy(exec));
  CUDA_OK(cudaGraphDestroy(graph));
  CUDA_OK(cudaStreamDestroy(s));
  for (int k = 0; k < 4; ++k) free(lists[k]);
  free(hq);
  free(kv);
  qsakv_free(ctx, q);
  qsakv_free(ctx, dtopk);
  qsakv_free(ctx, out_graph);
  qsakv_free(ctx, out_direct);
  tu_world_destroy(&w);
  qsakv_context_destroy(ctx);
}

static void test_capture_caller_lists_replay(void** state) {
  (void)state;
  caller_lists_replay(1);
  caller_lists_replay(2);
}

/* The library and the caller's CUDA state: qsakv_plan_update on a capturing stream is
 * refused (STATE, the capture left intact and empty), and an error the caller's own runtime
 * call left pending stays the caller's: the run calls succeed and do not clear it. */
static void test_capture_and_caller_errors(void** state) {
  (void)state;
  qsakv_context* ctx = tu_cuda_context_or_skip();
  qsakv_model_config c;
  tu_small_config(&c, 6, 1, 256, QSAKV_DTYPE_FP16, QSAKV_DTYPE_E4M3, 64);
  tu_shape shape = {2, {1, 3}, {900, 300}};
  tu_world w;
  tu_world_build(&w, ctx, &c, &shape, tu_next(), 2.0f, 0.01f, 0.01f, 0);
  const size_t qn = (size_t)w.rows * w.geo.q_heads * c.head_dim;
  const size_t iqn = (size_t)w.rows * c.index_num_heads * c.index_head_dim;
  void* q = tu_device_filled(ctx, 2 * qn, 0);
  void* iq = tu_device_filled(ctx, 2 * iqn, 0);
  void* out = tu_device_filled(ctx, 2 * qn, 0xFF);
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const sub_batch full = {2, {0, 1}, {1, 3}};
  void* dbt = NULL;

  /* An update inside a capture (to one row): refused, naming the call; the capture stays
   * valid and empty, and the plan keeps the world's batch of 4 rows. */
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  int32_t qs[2] = {0, 1}, lens[1] = {900};
  qsakv_batch b = QSAKV_BATCH_INIT;
  b.num_requests = 1;
  b.query_start = qs;
  b.seq_lens = lens;
  b.block_table = w.block_table_dev;
  b.block_table_stride = w.bt_stride;
  assert_int_equal(qsakv_plan_update(w.plan, &b, (qsakv_stream_t)s), QSAKV_ERROR_STATE);
  print_message("update under capture: %s\n", qsakv_last_error());
  assert_non_null(strstr(qsakv_last_error(), "qsakv_plan_update cannot be captured"));
  cudaGraph_t graph;
  CUDA_OK(cudaStreamEndCapture(s, &graph));
  size_t nodes = 1;
  CUDA_OK(cudaGraphGetNodes(graph, NULL, &nodes));
  assert_int_equal(nodes, 0);
  CUDA_OK(cudaGraphDestroy(graph));
  qsakv_plan_info info = {sizeof info, QSAKV_PLAN_INFO_VERSION};
  TU_OK(qsakv_plan_get_info(w.plan, &info));
  assert_int_equal(info.num_rows, 4);

  /* A pending error of the caller's (an invalid device id) across successful calls. */
  update(&w, &full, &dbt, s);
  assert_int_equal((int)cudaSetDevice(-1), (int)cudaErrorInvalidDevice);
  assert_int_equal((int)cudaPeekAtLastError(), (int)cudaErrorInvalidDevice);
  enqueue(&w, iq, q, out, s);
  assert_int_equal((int)cudaGetLastError(), (int)cudaErrorInvalidDevice);
  CUDA_OK(cudaStreamSynchronize(s));
  CUDA_OK(cudaGetLastError());
  uint16_t* h = malloc(2 * qn);
  tu_to_host(ctx, h, out, 2 * qn);
  size_t unwritten = 0;
  for (size_t i = 0; i < qn; ++i) unwritten += h[i] == 0xFFFF;
  assert_int_equal(unwritten, 0); /* the calls did run */
  free(h);
  qsakv_free(ctx, dbt);
  CUDA_OK(cudaStreamDestroy(s));
  qsakv_free(ctx, q);
  qsakv_free(ctx, iq);
  qsakv_free(ctx, out);
  tu_world_destroy(&w);
  qsakv_context_destroy(ctx);
}
/* A whole decode step in one graph (issue 28): the step's stores in one call
 * (qsakv_store_step: each row's new K/V, its raw index key, and the compressed key of the
 * group it completes), the selection and the attention, captured once and replayed with
 * new inputs (new K/V, keys, queries) each time. The graph runs on one world; the same
 * three calls run directly on its twin (the same data seed). After each replay: the layer's
 * K/V, ring and compressed-key bytes, the top-k lists and the output equal the twin's bit
 * for bit, the replay did store (the K/V bytes changed), and the output is within the FP64
 * bound over the replayed cache and lists. */
static void capture_whole_step(qsakv_dtype index_keys) {
  qsakv_context* ctx = tu_cuda_context_or_skip();
  qsakv_model_config c;
  tu_small_config(&c, 6, 1, 256, QSAKV_DTYPE_FP16, QSAKV_DTYPE_E4M3, 64);
  c.index_key_dtype = index_keys;
  const int ratio = c.compress_ratio, idim = c.index_head_dim;
  /* Decode rows; the new tokens of the first two complete a group, the third's does not. */
  tu_shape shape = {3, {1, 1, 1}, {ratio * 700, ratio * 512, ratio * 150 + 1}};
  const uint64_t seed = tu_next();
  tu_world w, twin;
  tu_world_build(&w, ctx, &c, &shape, seed, 2.0f, 0.01f, 0.01f, 0);
  tu_world_build(&twin, ctx, &c, &shape, seed, 2.0f, 0.01f, 0.01f, 0);
  const int rows = w.rows, n = shape.num_requests;
  assert_int_equal(rows, n);
  assert_memory_equal(w.block_table, twin.block_table, sizeof(int32_t) * (size_t)n * w.bt_stride);
  const int row_elems = w.geo.kv_heads * c.head_dim;
  const size_t qn = (size_t)rows * w.geo.q_heads * c.head_dim;
  const size_t iqn = (size_t)rows * c.index_num_heads * idim;
  const size_t kv_bytes = w.layout.kv_bytes_per_layer;

  /* The step's inputs: device buffers that the graph reads at each replay. */
  int64_t slot[3], pos[3], cslot[3];
  int32_t req[3];
  int nc = 0;
  for (int r = 0; r < n; ++r) {
    const int t = shape.seq_lens[r] - 1; /* the row's new token */
    req[r] = r;
    pos[r] = t;
    slot[r] = (int64_t)w.block_table[r * w.bt_stride + t / c.block_size] * c.block_size +
              t % c.block_size;
    if ((t + 1) % ratio == 0) cslot[nc++] = slot[r]; /* any token of the group names it */
  }
  assert_int_equal(nc, 2);
  void* dk = tu_device_filled(ctx, 2 * (size_t)n * row_elems, 0);
  void* dv = tu_device_filled(ctx, 2 * (size_t)n * row_elems, 0);
  void* dring = tu_device_filled(ctx, 2 * (size_t)n * idim, 0);
  void* dck = tu_device_filled(ctx, 2 * (size_t)nc * idim, 0);
  void* dslot = tu_to_device(ctx, slot, sizeof slot);
  void* dreq = tu_to_device(ctx, req, sizeof req);
  void* dpos = tu_to_device(ctx, pos, sizeof pos);
  void* dcslot = tu_to_device(ctx, cslot, sizeof(int64_t) * nc);
  void* q = tu_device_filled(ctx, 2 * qn, 0);
  void* iq = tu_device_filled(ctx, 2 * iqn, 0);
  void* out[2] = {tu_device_filled(ctx, 2 * qn, 0xFF), tu_device_filled(ctx, 2 * qn, 0xFF)};
  qsakv_step_stores st = QSAKV_STEP_STORES_INIT;
  st.k = dk;
  st.v = dv;
  st.kv_slot_mapping = dslot;
  st.num_tokens = n;
  st.index_keys = dring;
  st.index_request_slots = dreq;
  st.index_positions = dpos;
  st.num_index_keys = n;
  st.compressed_keys = dck;
  st.compressed_slot_mapping = dcslot;
  st.num_compressed_keys = nc;
  tu_world* worlds[2] = {&w, &twin};
  qsakv_layer_buffers lb[2];
  for (int i = 0; i < 2; ++i) {
    lb[i] = (qsakv_layer_buffers){sizeof lb[i], QSAKV_LAYER_BUFFERS_VERSION};
    TU_OK(qsakv_cache_get_layer_buffers(worlds[i]->cache, worlds[i]->layer, &lb[i]));
  }
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
#define WHOLE_STEP(world, o)                                                                     \
  do {                                                                                           \
    TU_OK(qsakv_store_step((world)->cache, (world)->layer, &st, (qsakv_stream_t)s));             \
    TU_OK(qsakv_select_topk((world)->plan, (world)->layer, iq, NULL, 0, (qsakv_stream_t)s));     \
    TU_OK(qsakv_attention_run((world)->plan, (world)->layer, QSAKV_ATTENTION_SPARSE, q, NULL, 0, \
                              (o), (qsakv_stream_t)s));                                          \
  } while (0)
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  WHOLE_STEP(&w, out[0]);
  CUDA_OK(cudaStreamEndCapture(s, &graph));
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  CUDA_OK(cudaStreamSynchronize(s));

  const struct {
    uint64_t bytes;
    const char* what;
  } parts[3] = {{kv_bytes, "K/V"},
                {w.layout.ring_bytes_per_layer, "raw index keys"},
                {w.layout.compressed_bytes_per_layer, "compressed keys"}};
  void* const part_dev[2][3] = {{lb[0].kv, lb[0].ring_keys, lb[0].compressed_keys},
                                {lb[1].kv, lb[1].ring_keys, lb[1].compressed_keys}};
  uint16_t* hk = malloc(2 * (size_t)n * row_elems);
  uint16_t* hv = malloc(2 * (size_t)n * row_elems);
  uint16_t* hring = malloc(2 * (size_t)n * idim);
  uint16_t* hck = malloc(2 * (size_t)nc * idim);
  uint16_t* hq = malloc(2 * qn);
  uint16_t* hiq = malloc(2 * iqn);
  uint16_t* o[2] = {malloc(2 * qn), malloc(2 * qn)};
  const int width = w.geo.topk_width;
  int32_t* lists[2] = {malloc(sizeof(int32_t) * (size_t)rows * width),
                       malloc(sizeof(int32_t) * (size_t)rows * width)};
  double* ref = malloc(sizeof(double) * qn);
  double* got = malloc(sizeof(double) * qn);
  for (int k = 0; k < 3; ++k) {
    for (size_t i = 0; i < (size_t)n * row_elems; ++i) {
      hk[i] = tu_f32_to_fp16((float)(2.0 * tu_normal()));
      hv[i] = tu_f32_to_fp16((float)(2.0 * tu_normal()));
    }
    /* Small integers, as the world's keys: exact scores, and ties. */
    for (size_t i = 0; i < (size_t)n * idim; ++i) hring[i] = tu_f32_to_fp16((float)tu_int(-3, 3));
    for (size_t i = 0; i < (size_t)nc * idim; ++i) hck[i] = tu_f32_to_fp16((float)tu_int(-3, 3));
    for (size_t i = 0; i < qn; ++i) hq[i] = tu_f32_to_fp16((float)tu_normal());
    for (size_t i = 0; i < iqn; ++i) hiq[i] = tu_f32_to_fp16((float)tu_int(-2, 2));
    CUDA_OK(cudaMemcpyAsync(dk, hk, 2 * (size_t)n * row_elems, cudaMemcpyHostToDevice, s));
    CUDA_OK(cudaMemcpyAsync(dv, hv, 2 * (size_t)n * row_elems, cudaMemcpyHostToDevice, s));
    CUDA_OK(cudaMemcpyAsync(dring, hring, 2 * (size_t)n * idim, cudaMemcpyHostToDevice, s));
    CUDA_OK(cudaMemcpyAsync(dck, hck, 2 * (size_t)nc * idim, cudaMemcpyHostToDevice, s));
    CUDA_OK(cudaMemcpyAsync(q, hq, 2 * qn, cudaMemcpyHostToDevice, s));
    CUDA_OK(cudaMemcpyAsync(iq, hiq, 2 * iqn, cudaMemcpyHostToDevice, s));
    for (int i = 0; i < 2; ++i) CUDA_OK(cudaMemsetAsync(out[i], 0xFF, 2 * qn, s));
    CUDA_OK(cudaStreamSynchronize(s));
    /* Before the first replay, capturing ran nothing: the twins are still equal. */
    void* before = tu_world_read_kv(&w);
    if (k == 0) {
      void* twin_before = tu_world_read_kv(&twin);
      assert_memory_equal(before, twin_before, kv_bytes);
      free(twin_before);
    }
    CUDA_OK(cudaGraphLaunch(exec, s));
    WHOLE_STEP(&twin, out[1]);
    CUDA_OK(cudaStreamSynchronize(s));
    void* kv = tu_world_read_kv(&w);
    assert_true(memcmp(before, kv, kv_bytes) != 0); /* the replay stored */
    free(before);
    for (int p = 0; p < 3; ++p) {
      uint8_t* a = malloc(parts[p].bytes);
      uint8_t* b = malloc(parts[p].bytes);
      tu_to_host(ctx, a, part_dev[0][p], parts[p].bytes);
      tu_to_host(ctx, b, part_dev[1][p], parts[p].bytes);
      const int same = memcmp(a, b, parts[p].bytes) == 0;
      print_message("whole step, %s keys, replay %d: %s %s\n", qsakv_dtype_name(index_keys), k,
                    parts[p].what, same ? "identical to the direct calls'" : "DIFFERENT");
      assert_true(same);
      free(a);
      free(b);
    }
    for (int i = 0; i < 2; ++i) {
      tu_to_host(ctx, o[i], out[i], 2 * qn);
      tu_to_host(ctx, lists[i], lb[i].topk, sizeof(int32_t) * (size_t)rows * width);
    }
    assert_memory_equal(lists[0], lists[1], sizeof(int32_t) * (size_t)rows * width);
    size_t nan = 0;
    for (size_t i = 0; i < qn; ++i) nan += (o[0][i] & 0x7C00) == 0x7C00;
    assert_int_equal(nan, 0);
    assert_memory_equal(o[0], o[1], 2 * qn);
    tu_reference_attention(&w, kv, hq, lists[0], width, 0, ref);
    for (size_t i = 0; i < qn; ++i) got[i] = tu_fp16_to_f32(o[0][i]);
    const double err = tu_rel_l2(ref, got, qn);
    print_message(
        "whole step, %s keys, replay %d: output identical to the direct calls', "
        "rel_l2 vs FP64 %.3e (bound 2e-3)\n",
        qsakv_dtype_name(index_keys), k, err);
    assert_true(err <= 2e-3);
    free(kv);
  }
#undef WHOLE_STEP
  CUDA_OK(cudaGraphExecDestroy(exec));
  CUDA_OK(cudaGraphDestroy(graph));
  CUDA_OK(cudaStreamDestroy(s));
  free(hk);
  free(hv);
  free(hring);
  free(hck);
  free(hq);
  free(hiq);
  for (int i = 0; i < 2; ++i) {
    free(o[i]);
    free(lists[i]);
    qsakv_free(ctx, out[i]);
  }
  free(ref);
  free(got);
  void* const dev[] = {dk, dv, dring, dck, dslot, dreq, dpos, dcslot, q, iq};
  for (size_t i = 0; i < sizeof dev / sizeof dev[0]; ++i) qsakv_free(ctx, dev[i]);
  tu_world_destroy(&w);
  tu_world_destroy(&twin);
  qsakv_context_destroy(ctx);
}

static void test_capture_whole_step_replay(void** state) {
  (void)state;
  capture_whole_step(QSAKV_DTYPE_E4M3);
  capture_whole_step(QSAKV_DTYPE_FP16);
}
#else
/* A build without the CUDA backend: skipped, saying so, unless QSAKV_REQUIRE_GPU=1. */
static void no_cudart(void) {
  if (tu_gpu_required()) fail_msg("QSAKV_REQUIRE_GPU=1, but this build has no CUDA runtime");
  fprintf(stderr, "[ SKIP     ] built without the CUDA runtime: no graphs to test\n");
  skip();
}
static void test_capture_replan_replay(void** state) {
  (void)state;
  no_cudart();
}
static void test_capture_caller_lists_replay(void** state) {
  (void)state;
  no_cudart();
}
static void test_capture_and_caller_errors(void** state) {
  (void)state;
  no_cudart();
}
static void test_capture_whole_step_replay(void** state) {
  (void)state;
  no_cudart();
}
#endif

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_capture_replan_replay),
                                     cmocka_unit_test(test_capture_caller_lists_replay),
                                     cmocka_unit_test(test_capture_and_caller_errors),
                                     cmocka_unit_test(test_capture_whole_step_replay)};
  tu_apply_filter();
  return cmocka_run_group_tests_name("graph", tests, NULL, NULL);
}
