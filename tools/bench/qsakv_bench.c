// SPDX-License-Identifier: Apache-2.0
/* qsakv_bench: decode attention, store and selection timings on the GPU for the
 * reference geometry (TP4 rank: 6 query heads, 1 KV head, head_dim 256), 32K-token
 * contexts, 2051 selected tokens per row, block size 64.
 *
 * Method: every timed unit is a CUDA graph of 64 calls that rotate over 4 layers and 16
 * plans (each plan maps the rows to other requests, with its own random top-k lists),
 * so consecutive calls read disjoint K/V and nothing is served from L2 even for one row;
 * the time per call is the median over replays divided by 64. The "L2f" columns time one
 * call alone as a one-call graph with L2 flushed before each replay, the way peers'
 * kernels are usually measured (no launch amortisation, no L2 reuse). Inputs are random
 * (finite E4M3 codes, normal FP16 values), never zeros. A device-to-device copy is
 * measured in the same run (bytes read + written) as the bandwidth ceiling.
 * Prints a table and writes JSON (--json PATH). Benchmarks only: nothing is asserted. */
#define _GNU_SOURCE
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernel_trace.h"
#include "qsakv.h"

#define CHECK(call)                                                                              \
  do {                                                                                           \
    qsakv_status s_ = (call);                                                                    \
    if (s_ != QSAKV_SUCCESS) {                                                                   \
      fprintf(stderr, "%s:%d: %s: %s: %s\n", __FILE__, __LINE__, #call, qsakv_status_string(s_), \
              qsakv_last_error());                                                               \
      exit(1);                                                                                   \
    }                                                                                            \
  } while (0)
#define CUDA(call)                                                                           \
  do {                                                                                       \
    cudaError_t e_ = (call);                                                                 \
    if (e_ != cudaSuccess) {                                                                 \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      exit(1);                                                                               \
    }                                                                                        \
  } while (0)

/* Every copy of the bench's setup completes before anything else runs: the timed work
 * runs on a non-blocking stream, which does not wait for the legacy stream, and a
 * cudaMemcpy from pageable memory may return before its DMA lands. (A store that read
 * slot mappings still in flight once left every E4M3 index key unwritten, and the
 * selection then timed a row of all-equal scores.) */
static void copy_and_wait(void* dst, const void* src, size_t bytes, enum cudaMemcpyKind kind) {
  CUDA(cudaMemcpy(dst, src, bytes, kind));
  CUDA(cudaDeviceSynchronize());
}

enum { kLayers = 4, kPlans = 16, kCalls = 64, kRequests = 64, kSeq = 32767, kBlock = 64 };

/* The model config every table starts from: the qwen4_exp preset at TP4. */
static void reference_config(qsakv_model_config* c) {
  CHECK(qsakv_model_config_preset(c, "qwen4_exp"));
  c->tp_size = 4;
}

/* The geometry the tables run at, read in one place (init_geometry, at the start of main)
 * from reference_config and its qsakv_rank_geometry; the reference's values in brackets. */
typedef struct {
  int q_heads;     /* query heads per rank (6) */
  int kv_heads;    /* KV heads per rank (1) */
  int head_dim;    /* (256) */
  int ratio;       /* tokens per compressed key, the top-k lists' group (4) */
  int topk_blocks; /* groups a top-k list selects (512) */
  int topk_width;  /* entries of a top-k list: topk_blocks groups, then the open group's
                      tail of up to ratio - 1 tokens, -1 padded (2051) */
  int index_heads; /* indexer query heads (4) */
  int index_dim;   /* indexer head dim (128) */
} bench_geometry;
static bench_geometry g_geo;

static void init_geometry(void) {
  qsakv_model_config c;
  reference_config(&c);
  qsakv_rank_geometry r;
  memset(&r, 0, sizeof r);
  r.struct_size = sizeof r;
  CHECK(qsakv_model_config_rank_geometry(&c, &r));
  g_geo.q_heads = r.q_heads;
  g_geo.kv_heads = r.kv_heads;
  g_geo.head_dim = c.head_dim;
  g_geo.ratio = c.compress_ratio;
  g_geo.topk_blocks = r.topk_blocks;
  g_geo.topk_width = r.topk_width;
  g_geo.index_heads = c.index_num_heads;
  g_geo.index_dim = c.index_head_dim;
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void) {
  uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
static double normal(void) {
  double u1 = ((double)(rnd() >> 11) + 1.0) / 9007199254740993.0,
         u2 = (double)(rnd() >> 11) / 9007199254740992.0;
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}
static uint16_t fp16(float x) {
  _Float16 h = (_Float16)x;
  uint16_t u;
  memcpy(&u, &h, 2);
  return u;
}

static int cmp_float(const void* a, const void* b) {
  float x = *(const float*)a, y = *(const float*)b;
  return (x > y) - (x < y);
}

/* Median milliseconds of `reps` replays of a graph. flush_l2: a 256 MiB memset before
 * each replay, outside the timed events, so nothing is served from L2 (how peers are
 * measured); otherwise replays follow each other after three warm-ups. */
static void* g_flush = NULL; /* time_graph_ex's L2 flush buffer */
static const size_t kFlushBytes = 256ull << 20;
static float time_graph_ex(cudaGraphExec_t exec, cudaStream_t s, int reps, int flush_l2) {
  if (flush_l2 && !g_flush) CUDA(cudaMalloc(&g_flush, kFlushBytes));
  void* const flush = g_flush;
  const size_t flush_bytes = kFlushBytes;
  cudaEvent_t a, b;
  CUDA(cudaEventCreate(&a));
  CUDA(cudaEventCreate(&b));
  for (int i = 0; i < (flush_l2 ? 1 : 3); ++i) CUDA(cudaGraphLaunch(exec, s));
  float* t = malloc(sizeof(float) * reps);
  for (int i = 0; i < reps; ++i) {
    if (flush_l2) CUDA(cudaMemsetAsync(flush, i & 0xFF, flush_bytes, s));
    CUDA(cudaEventRecord(a, s));
    CUDA(cudaGraphLaunch(exec, s));
    CUDA(cudaEventRecord(b, s));
    CUDA(cudaEventSynchronize(b));
    CUDA(cudaEventElapsedTime(&t[i], a, b));
  }
  qsort(t, reps, sizeof(float), cmp_float);
  const float m = t[reps / 2];
  free(t);
  CUDA(cudaEventDestroy(a));
  CUDA(cudaEventDestroy(b));
  return m;
}

/* One L2 flush on `s`, as time_graph_ex makes before each flushed replay. */
static void flush_l2_now(cudaStream_t s) {
  if (!g_flush) CUDA(cudaMalloc(&g_flush, kFlushBytes));
  CUDA(cudaMemsetAsync(g_flush, 0x5A, kFlushBytes, s));
}

/* Ends the capture begun on `s` and times the graph: median ms of `reps` replays, each
 * after an L2 flush when flush_l2 (one call as peers are measured), else back to back. */
static float end_capture_and_time_ex(cudaStream_t s, int reps, int flush_l2) {
  cudaGraph_t g;
  cudaGraphExec_t e;
  CUDA(cudaStreamEndCapture(s, &g));
  CUDA(cudaGraphInstantiate(&e, g, 0));
  const float ms = time_graph_ex(e, s, reps, flush_l2);
  CUDA(cudaGraphExecDestroy(e));
  CUDA(cudaGraphDestroy(g));
  return ms;
}

/* Ends the capture begun on `s`, then times the graph (median ms of `reps` replays). */
static float end_capture_and_time(cudaStream_t s, int reps) {
  return end_capture_and_time_ex(s, reps, 0);
}

/* Keeps the GPU busy for ~0.5 s so clocks are up before anything is timed. */
static void warm_up(cudaStream_t s) {
  const size_t bytes = 1ull << 30;
  void *a, *b;
  CUDA(cudaMalloc(&a, bytes));
  CUDA(cudaMalloc(&b, bytes));
  for (int i = 0; i < 200; ++i) CUDA(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s));
  CUDA(cudaStreamSynchronize(s));
  CUDA(cudaFree(a));
  CUDA(cudaFree(b));
}

cudaError_t bench_copy(const void* src, void* dst, size_t bytes, int sms, cudaStream_t s);
cudaError_t bench_empty(cudaStream_t s);
cudaError_t bench_read(const void* src, size_t bytes, void* sink, int sms, cudaStream_t s);
cudaError_t bench_shrink(const void* src, void* dst, size_t dst_bytes, cudaStream_t s);

/* The floor of a one-call, L2-flushed measurement, taken the same way (median of 20
 * one-call graph replays, L2 flushed before each): FLOOR_EMPTY an empty kernel (launch and
 * graph cost), FLOOR_READ a contiguous read of `bytes` (what an attention call must read),
 * FLOOR_SHRINK `2 * bytes` read and `bytes` written (the E4M3 store's ratio), FLOOR_COPY
 * `bytes` read and written (the 16-bit store). Microseconds. */
typedef enum { FLOOR_EMPTY, FLOOR_READ, FLOOR_SHRINK, FLOOR_COPY } floor_op;
static double floor_us(cudaStream_t s, floor_op op, size_t bytes, int sms) {
  void *a = NULL, *b = NULL;
  if (op != FLOOR_EMPTY) {
    CUDA(cudaMalloc(&a, op == FLOOR_SHRINK ? 2 * bytes : bytes));
    CUDA(cudaMalloc(&b, op == FLOOR_READ ? 16 : bytes));
    CUDA(cudaMemset(a, 1, op == FLOOR_SHRINK ? 2 * bytes : bytes));
  }
  CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  if (op == FLOOR_EMPTY) CUDA(bench_empty(s));
  if (op == FLOOR_READ) CUDA(bench_read(a, bytes, b, sms, s));
  if (op == FLOOR_SHRINK) CUDA(bench_shrink(a, b, bytes, s));
  if (op == FLOOR_COPY) CUDA(bench_copy(a, b, bytes, sms, s));
  const double us = end_capture_and_time_ex(s, 20, 1) * 1e3;
  if (a) CUDA(cudaFree(a));
  if (b) CUDA(cudaFree(b));
  return us;
}

/* GB/s (read + write) of a 2 GiB device-to-device copy: cudaMemcpyAsync when
 * kernel == 0, SM threads with 16-byte accesses otherwise. */
static double copy_bandwidth(cudaStream_t s, int kernel, int sms) {
  const size_t bytes = 2ull << 30;
  void *a, *b;
  CUDA(cudaMalloc(&a, bytes));
  CUDA(cudaMalloc(&b, bytes));
  CUDA(cudaMemset(a, 1, bytes));
  CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  if (kernel)
    CUDA(bench_copy(a, b, bytes, sms, s));
  else
    CUDA(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s));
  const float ms = end_capture_and_time(s, 20);
  CUDA(cudaFree(a));
  CUDA(cudaFree(b));
  return 2.0 * bytes / (ms * 1e-3) / 1e9; /* read + write, GB/s */
}

typedef struct {
  qsakv_context* ctx;
  qsakv_model_config cfg;
  qsakv_cache* cache;
  qsakv_overlay* overlay;
  int32_t* block_table_host; /* [kRequests, pages] */
  int pages;
  int rows_per_group; /* the grouped route's (qsakv_plan_info; 0: none) */
} bench_cache;

static qsakv_overlay* make_overlay(const qsakv_model_config* c) {
  char dir[] = "/tmp/qsakv-bench-XXXXXX";
  if (!mkdtemp(dir)) exit(1);
  char index[256], pack[256], file[300];
  snprintf(index, sizeof index, "%s/model.safetensors.index.json", dir);
  FILE* f = fopen(index, "w");
  fprintf(f, "{\"metadata\": {\"total_size\": 0}, \"weight_map\": {}}\n");
  fclose(f);
  snprintf(pack, sizeof pack, "%s/pack", dir);
  float ks[QSAKV_MAX_LAYERS], vs[QSAKV_MAX_LAYERS];
  for (int i = 0; i < c->num_qsa_layers; ++i) ks[i] = vs[i] = 0.01f;
  qsakv_overlay_write_options wo;
  CHECK(qsakv_overlay_write_options_init(&wo));
  wo.base_index_path = index;
  CHECK(qsakv_overlay_write(pack, c->qsa_layers, ks, vs, c->num_qsa_layers, &wo));
  snprintf(file, sizeof file, "%s/model-kvscales.safetensors", pack);
  qsakv_overlay* ov = NULL;
  CHECK(qsakv_overlay_load(&ov, file, NULL));
  char rev[65];
  CHECK(qsakv_checkpoint_revision(index, rev));
  CHECK(qsakv_overlay_validate(ov, c, rev));
  return ov;
}

/* A cache of kRequests requests of kSeq tokens on `layers` layers, filled with random
 * finite data straight into its buffers. */
static void make_cache(bench_cache* b, qsakv_context* ctx, qsakv_dtype kv, int rows_max, int seq,
                       int requests) {
  memset(b, 0, sizeof *b);
  b->ctx = ctx;
  reference_config(&b->cfg);
  qsakv_model_config* c = &b->cfg;
  c->num_layers = 4 * kLayers;
  c->num_qsa_layers = kLayers;
  for (int i = 0; i < kLayers; ++i) c->qsa_layers[i] = 4 * i + 3;
  c->kv_dtype = kv;
  c->block_size = kBlock;
  c->max_requests = requests > rows_max ? requests : rows_max;
  c->max_batched_tokens = rows_max;
  /* Rows sit at positions below seq: a model of seq tokens (128K: the default length). */
  c->max_model_len = seq;
  b->pages = (seq + kBlock - 1) / kBlock;
  if (kv == QSAKV_DTYPE_E4M3) b->overlay = make_overlay(c);
  qsakv_cache_options o;
  CHECK(qsakv_cache_options_init(&o));
  o.num_blocks = (int64_t)requests * b->pages;
  CHECK(qsakv_cache_create(&b->cache, ctx, c, b->overlay, &o));
  qsakv_cache_layout L;
  memset(&L, 0, sizeof L);
  L.struct_size = sizeof L;
  CHECK(qsakv_cache_get_layout(b->cache, &L));
  /* 64 MiB of random finite codes, copied over every layer. */
  const size_t chunk = 64ull << 20;
  uint8_t* h = malloc(chunk);
  if (kv == QSAKV_DTYPE_E4M3) {
    for (size_t i = 0; i < chunk; ++i) {
      uint8_t x = (uint8_t)rnd();
      if ((x & 0x7F) == 0x7F) x ^= 1; /* no NaN codes */
      h[i] = x;
    }
  } else {
    uint16_t* h16 = (uint16_t*)h;
    for (size_t i = 0; i < chunk / 2; ++i) h16[i] = fp16((float)(normal() * 2.0));
  }
  void* d;
  CUDA(cudaMalloc(&d, chunk));
  copy_and_wait(d, h, chunk, cudaMemcpyHostToDevice);
  for (int l = 0; l < kLayers; ++l) {
    qsakv_layer_buffers lb = {.struct_size = sizeof lb, .version = QSAKV_LAYER_BUFFERS_VERSION};
    CHECK(qsakv_cache_get_layer_buffers(b->cache, c->qsa_layers[l], &lb));
    for (size_t off = 0; off < L.kv_bytes_per_layer; off += chunk) {
      const size_t n = L.kv_bytes_per_layer - off < chunk ? L.kv_bytes_per_layer - off : chunk;
      copy_and_wait((char*)lb.kv + off, d, n, cudaMemcpyDeviceToDevice);
    }
  }
  CUDA(cudaFree(d));
  free(h);
  /* Pages of request r on blocks r*pages .. : a shuffled order within the request. */
  b->block_table_host = malloc(sizeof(int32_t) * requests * b->pages);
  for (int r = 0; r < requests; ++r) {
    int32_t* bt = b->block_table_host + r * b->pages;
    for (int p = 0; p < b->pages; ++p) bt[p] = r * b->pages + p;
    for (int p = b->pages - 1; p > 0; --p) {
      int j = (int)(rnd() % (uint64_t)(p + 1)), t = bt[p];
      bt[p] = bt[j];
      bt[j] = t;
    }
  }
  /* The grouped route's rows per group: qsakv_plan_info of a one-row plan, automatic rule. */
  qsakv_plan_options po;
  CHECK(qsakv_plan_options_init(&po));
  po.max_rows = 1;
  po.max_requests = 1;
  po.multi_row_min_rows = 0;
  qsakv_plan* probe = NULL;
  CHECK(qsakv_plan_create(&probe, b->cache, &po));
  qsakv_plan_info pi;
  memset(&pi, 0, sizeof pi);
  pi.struct_size = sizeof pi;
  CHECK(qsakv_plan_get_info(probe, &pi));
  b->rows_per_group = pi.rows_per_group;
  qsakv_plan_destroy(probe);
}

static void free_cache(bench_cache* b) {
  qsakv_cache_destroy(b->cache);
  qsakv_overlay_destroy(b->overlay);
  free(b->block_table_host);
}

/* Row i of plan p decodes request (i + 4p) % kRequests at its last position. */
typedef struct {
  qsakv_plan* plan[kPlans];
  void* bt[kPlans];
  int32_t* topk[kPlans];
  void* q;
  void* out;
} plans_t;

/* --splits N: the decode table's plans take N splits instead of their own choice. */
static int g_forced_splits = 0;
/* --trace-select: each selection case also prints its kernels' timeline (one call, after an
 * L2 flush; tools/bench/kernel_trace.h). */
static int g_trace_select = 0;

static void make_plans(plans_t* P, bench_cache* b, int rows, cudaStream_t s) {
  const int width = g_geo.topk_width, ratio = g_geo.ratio, pos = kSeq - 1,
            groups = (pos + 1) / ratio;
  int32_t* qs = malloc(sizeof(int32_t) * (rows + 1));
  int32_t* lens = malloc(sizeof(int32_t) * rows);
  int32_t* bt = malloc(sizeof(int32_t) * rows * b->pages);
  int32_t* tk = malloc(sizeof(int32_t) * rows * width);
  uint8_t* seen = malloc(groups);
  for (int i = 0; i <= rows; ++i) qs[i] = i;
  for (int i = 0; i < rows; ++i) lens[i] = kSeq;
  for (int p = 0; p < kPlans; ++p) {
    for (int i = 0; i < rows; ++i)
      memcpy(bt + i * b->pages, b->block_table_host + ((i + 4 * p) % kRequests) * b->pages,
             sizeof(int32_t) * b->pages);
    CUDA(cudaMalloc(&P->bt[p], sizeof(int32_t) * rows * b->pages));
    copy_and_wait(P->bt[p], bt, sizeof(int32_t) * rows * b->pages, cudaMemcpyHostToDevice);
    /* topk_blocks distinct random groups, then the open group's tail (512 x 4 + 3 = 2051
     * tokens for the reference). */
    for (int i = 0; i < rows; ++i) {
      memset(seen, 0, groups);
      int32_t* t = tk + (size_t)i * width;
      int j = 0;
      while (j < g_geo.topk_blocks * ratio) {
        const int gsel = (int)(rnd() % (uint64_t)groups);
        if (seen[gsel]) continue;
        seen[gsel] = 1;
        for (int k = 0; k < ratio; ++k) t[j++] = gsel * ratio + k;
      }
      for (int k = groups * ratio; k <= pos; ++k) t[j++] = k;
      while (j < width) t[j++] = -1;
    }
    CUDA(cudaMalloc((void**)&P->topk[p], sizeof(int32_t) * rows * width));
    copy_and_wait(P->topk[p], tk, sizeof(int32_t) * rows * width, cudaMemcpyHostToDevice);
    qsakv_plan_options po;
    CHECK(qsakv_plan_options_init(&po));
    po.max_rows = rows;
    po.max_requests = rows;
    po.num_splits = g_forced_splits;
    CHECK(qsakv_plan_create(&P->plan[p], b->cache, &po));
    qsakv_batch batch;
    memset(&batch, 0, sizeof batch);
    batch.struct_size = sizeof batch;
    batch.version = QSAKV_BATCH_VERSION;
    batch.num_requests = rows;
    batch.query_start = qs;
    batch.seq_lens = lens;
    batch.block_table = P->bt[p];
    batch.block_table_stride = b->pages;
    CHECK(qsakv_plan_update(P->plan[p], &batch, (qsakv_stream_t)s));
  }
  const size_t qn = (size_t)rows * g_geo.q_heads * g_geo.head_dim;
  uint16_t* hq = malloc(2 * qn);
  for (size_t i = 0; i < qn; ++i) hq[i] = fp16((float)normal());
  CUDA(cudaMalloc(&P->q, 2 * qn));
  CUDA(cudaMalloc(&P->out, 2 * qn));
  copy_and_wait(P->q, hq, 2 * qn, cudaMemcpyHostToDevice);
  CUDA(cudaStreamSynchronize(s));
  free(hq);
  free(qs);
  free(lens);
  free(bt);
  free(tk);
  free(seen);
}

static void free_plans(plans_t* P) {
  for (int p = 0; p < kPlans; ++p) {
    qsakv_plan_destroy(P->plan[p]);
    CUDA(cudaFree(P->bt[p]));
    CUDA(cudaFree(P->topk[p]));
  }
  CUDA(cudaFree(P->q));
  CUDA(cudaFree(P->out));
}

/* Microseconds per attention call. */
/* Microseconds per attention call in a graph of kCalls rotating calls; *us_flushed (when
 * not NULL) gets one call alone as a one-call graph with L2 flushed before each replay,
 * the way peers are measured. */
static double time_attention(bench_cache* b, int rows, cudaStream_t s, int* splits,
                             double* us_flushed) {
  plans_t P;
  make_plans(&P, b, rows, s);
  qsakv_plan_info pi;
  memset(&pi, 0, sizeof pi);
  pi.struct_size = sizeof pi;
  CHECK(qsakv_plan_get_info(P.plan[0], &pi));
  *splits = pi.num_splits;
  CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  for (int k = 0; k < kCalls; ++k) {
    const int layer = b->cfg.qsa_layers[k % kLayers], p = (k / kLayers) % kPlans;
    CHECK(qsakv_attention_run(P.plan[p], layer, QSAKV_ATTENTION_SPARSE, P.q, P.topk[p],
                              g_geo.topk_width, P.out, (qsakv_stream_t)s));
  }
  const int reps = rows >= 256 ? 10 : 30;
  const float ms = end_capture_and_time(s, reps);
  if (us_flushed) {
    CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CHECK(qsakv_attention_run(P.plan[0], b->cfg.qsa_layers[0], QSAKV_ATTENTION_SPARSE, P.q,
                              P.topk[0], g_geo.topk_width, P.out, (qsakv_stream_t)s));
    *us_flushed = end_capture_and_time_ex(s, 2 * reps, 1) * 1e3;
  }
  free_plans(&P);
  return ms * 1e3 / kCalls;
}

/* ---- Multi-row batches (prefill chunks, verify rows, mixed): the grouped route against
 * the decode route on the same rows. Each case names the generator of its top-k lists
 * (gen_drift, gen_overlap below); every list is g_geo.topk_width entries, -1 padded. */
typedef struct mr_case mr_case;
/* Fills the case's lists: tk[rows x topk_width], request r's rows from row qs[r]. */
typedef void (*topk_gen)(const mr_case* c, const int32_t* qs, int32_t* tk);
struct mr_case {
  const char* kind;
  int num_requests;
  int rows[64]; /* rows of each request */
  int seq;      /* tokens of each request after the step */
  topk_gen gen; /* its lists */
  double f;     /* gen_overlap: the fraction of each row's groups its window shares */
  int window;   /* gen_overlap: rows per window, from the request's first (0: all its rows) */
};

typedef struct {
  double us_grouped, us_decode; /* one-call graph, L2 flushed */
  double us_auto;               /* the plan's own routing (multi_row_min_rows 0) */
  int auto_rows;                /* rows it put on the grouped route */
  double tokens_decode;         /* K/V tokens each route reads: rows x their list */
  double tokens_grouped;        /* sum over the grouped route's groups of their union */
  double tokens_distinct;       /* per request, its distinct selected tokens */
  double tokens_shared;         /* sum over those groups of their listed tokens */
  double tokens_read;           /* what the grouped route reads under the share rule */
  int groups;
} mr_timing;

/* Drift, the way adjacent rows' selections do: each request draws a random order of the
 * groups its first row sees, and its row j takes topk_blocks (512) consecutive groups of
 * that order from offset floor(0.19 j) (8192 rows at 32K then select ~2,070 distinct
 * groups, ~8,300 tokens, as measured on the model), plus its open group's tail. */
static void gen_drift(const mr_case* c, const int32_t* qs, int32_t* tk) {
  const int width = g_geo.topk_width, ratio = g_geo.ratio, blocks = g_geo.topk_blocks;
  for (int r = 0; r < c->num_requests; ++r) {
    const int n = c->rows[r], first_pos = c->seq - n;
    const int visible = (first_pos + 1) / ratio; /* groups every row of the request sees */
    int* order = malloc(sizeof(int) * (size_t)(visible > 0 ? visible : 1));
    for (int i = 0; i < visible; ++i) order[i] = i;
    for (int i = visible - 1; i > 0; --i) {
      const int j = (int)(rnd() % (uint64_t)(i + 1)), x = order[i];
      order[i] = order[j];
      order[j] = x;
    }
    const int take = visible < blocks ? visible : blocks;
    for (int j = 0; j < n; ++j) {
      const int pos = first_pos + j, off = (int)(0.19 * j);
      int32_t* out = tk + (size_t)(qs[r] + j) * width;
      int k = 0;
      for (int i = 0; i < take; ++i) {
        const int g = order[(off + i) % visible];
        for (int e = 0; e < ratio; ++e) out[k++] = ratio * g + e;
      }
      for (int x = (pos + 1) / ratio * ratio; x <= pos; ++x) out[k++] = x;
      while (k < width) out[k++] = -1;
    }
    free(order);
  }
}

/* A controlled overlap: a request's rows fall into windows of c->window consecutive rows
 * from its first (0: the whole request). Every row of a window sees the groups whose ratio
 * tokens are all at or before the window's first row; the window draws round(B f) of them
 * at random (B = topk_blocks, 512), and each of its rows takes those plus B - round(B f)
 * random groups of its own (distinct from the window's; other rows may pick the same ones
 * by chance), then its open group's tail, all in a shuffled order (real lists come in
 * score order). */
static void gen_overlap(const mr_case* c, const int32_t* qs, int32_t* tk) {
  const int width = g_geo.topk_width, ratio = g_geo.ratio, blocks = g_geo.topk_blocks;
  /* mark[g]: the stamp of the window (shared) or row (private) that took group g. */
  int* mark = calloc((size_t)c->seq / ratio + 1, sizeof(int));
  int* shared = malloc(sizeof(int) * (size_t)blocks);
  int stamp = 0;
  for (int r = 0; r < c->num_requests; ++r) {
    const int n = c->rows[r], first_pos = c->seq - n, window = c->window > 0 ? c->window : n;
    for (int w = 0; w < n; w += window) {
      const int visible = (first_pos + w + 1) / ratio;
      int n_shared = (int)lround((double)blocks * c->f);
      n_shared = n_shared < visible ? n_shared : visible;
      const int n_private =
          blocks - n_shared < visible - n_shared ? blocks - n_shared : visible - n_shared;
      const int window_stamp = ++stamp;
      for (int i = 0; i < n_shared;) {
        const int g = (int)(rnd() % (uint64_t)visible);
        if (mark[g] == window_stamp) continue;
        mark[g] = window_stamp;
        shared[i++] = g;
      }
      for (int j = w; j < n && j < w + window; ++j) {
        const int pos = first_pos + j, row_stamp = ++stamp;
        int32_t* out = tk + (size_t)(qs[r] + j) * width;
        int k = 0;
        for (int i = 0; i < n_shared; ++i)
          for (int e = 0; e < ratio; ++e) out[k++] = ratio * shared[i] + e;
        for (int i = 0; i < n_private;) {
          const int g = (int)(rnd() % (uint64_t)visible);
          if (mark[g] == window_stamp || mark[g] == row_stamp) continue;
          mark[g] = row_stamp;
          ++i;
          for (int e = 0; e < ratio; ++e) out[k++] = ratio * g + e;
        }
        for (int x = (pos + 1) / ratio * ratio; x <= pos; ++x) out[k++] = x;
        for (int i = k - 1; i > 0; --i) {
          const int x = (int)(rnd() % (uint64_t)(i + 1));
          const int32_t v = out[i];
          out[i] = out[x];
          out[x] = v;
        }
        while (k < width) out[k++] = -1;
      }
    }
  }
  free(mark);
  free(shared);
}

/* The least shared tokens of a group that shares any, and the most own entries of a row
 * that moves them into its group's list (kernels/limits.hpp). The rows per group are the
 * plan's (bench_cache.rows_per_group, from qsakv_plan_info). */
enum { kGroupedMinShared = 64, kGroupedOwnMax = 32 };

/* The grouped route's share rule; mirrors kernels/limits.hpp grouped_share_min_rows (its
 * cost term kGroupedShareRowsE4M3 = 7, kGroupedShareRows16 = 3) and kGroupedMinShared. In
 * a group of n rows, token t, held by k_t of them (bit j of rows_of[t]: the group's row j
 * selects it), is shared when k_t >= max(2, (n + 1) / 2, min(n, cost)), unless fewer than
 * kGroupedMinShared of the group's nt distinct tokens qualify: then none is. Returns the
 * least k_t that is shared (n + 1: none is). */
static int share_threshold(int n, int e4m3, const uint32_t* rows_of, const int* tokens, int nt) {
  const int cost = e4m3 ? 7 : 3, half = (n + 1) / 2, want = n < cost ? n : cost;
  int need = half > want ? half : want;
  if (need < 2) need = 2;
  int qualify = 0;
  for (int i = 0; i < nt; ++i) qualify += __builtin_popcount(rows_of[tokens[i]]) >= need;
  return qualify >= kGroupedMinShared ? need : n + 1;
}

/* The case's token counts (fields tokens_* and groups of *t) from its lists: a row's valid
 * entries are t >= 0 and t <= its position; its request's rows form groups of up to
 * rows_per_group (1..32) consecutive rows from the first, as the library groups them. */
static void mr_token_stats(const mr_case* c, int e4m3, int rows_per_group, const int32_t* qs,
                           const int32_t* tk, mr_timing* t) {
  const int width = g_geo.topk_width;
  uint32_t* rows_of = calloc((size_t)c->seq, sizeof(uint32_t)); /* bit j: the group's row j */
  int* last_request = malloc(sizeof(int) * (size_t)c->seq);
  int* tokens = malloc(sizeof(int) * (size_t)rows_per_group * width);
  for (int i = 0; i < c->seq; ++i) last_request[i] = -1;
  for (int r = 0; r < c->num_requests; ++r) {
    const int n = c->rows[r], first_pos = c->seq - n;
    for (int j0 = 0; j0 < n; j0 += rows_per_group) {
      const int m = n - j0 < rows_per_group ? n - j0 : rows_per_group;
      int nt = 0;
      for (int j = 0; j < m; ++j) {
        const int pos = first_pos + j0 + j;
        const int32_t* row = tk + (size_t)(qs[r] + j0 + j) * width;
        for (int e = 0; e < width; ++e) {
          const int x = row[e];
          if (x < 0 || x > pos) continue;
          t->tokens_decode += 1;
          if (last_request[x] != r) {
            last_request[x] = r;
            t->tokens_distinct += 1;
          }
          if (!rows_of[x]) tokens[nt++] = x;
          rows_of[x] |= 1u << j;
        }
      }
      const int need = share_threshold(m, e4m3, rows_of, tokens, nt);
      /* Rows left with at most kGroupedOwnMax entries of their own move them into the
       * group's list (kernels/limits.hpp; only where the group shares). */
      unsigned moved = 0;
      for (int j = 0; j < m && need <= m; ++j) {
        const int pos = first_pos + j0 + j;
        const int32_t* row = tk + (size_t)(qs[r] + j0 + j) * width;
        int own = 0;
        for (int e = 0; e < width; ++e) {
          const int x = row[e];
          own += x >= 0 && x <= pos && __builtin_popcount(rows_of[x]) < need;
        }
        if (own <= kGroupedOwnMax) moved |= 1u << j;
      }
      int listed = 0;
      for (int i = 0; i < nt; ++i) {
        const unsigned k = rows_of[tokens[i]];
        listed += __builtin_popcount(k) >= need || (k & moved) != 0;
      }
      double unshared = 0;
      for (int j = 0; j < m; ++j) {
        const int pos = first_pos + j0 + j;
        const int32_t* row = tk + (size_t)(qs[r] + j0 + j) * width;
        if (moved >> j & 1) continue;
        for (int e = 0; e < width; ++e) {
          const int x = row[e];
          unshared += x >= 0 && x <= pos && __builtin_popcount(rows_of[x]) < need;
        }
      }
      for (int i = 0; i < nt; ++i) rows_of[tokens[i]] = 0;
      t->tokens_grouped += nt;
      t->tokens_shared += listed;
      t->tokens_read += listed + unshared;
      ++t->groups;
    }
  }
  free(rows_of);
  free(last_request);
  free(tokens);
}

static double time_one_call(qsakv_plan* plan, int layer, void* q, int32_t* topk, void* out,
                            cudaStream_t s) {
  CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  CHECK(qsakv_attention_run(plan, layer, QSAKV_ATTENTION_SPARSE, q, topk, g_geo.topk_width, out,
                            (qsakv_stream_t)s));
  return end_capture_and_time_ex(s, 15, 1) * 1e3;
}

static mr_timing time_multirow(bench_cache* b, const mr_case* c, cudaStream_t s) {
  const int width = g_geo.topk_width;
  if (b->rows_per_group < 1 || b->rows_per_group > 32) {
    fprintf(stderr, "multi-row tables: the plan's rows_per_group is %d, not 1..32\n",
            b->rows_per_group);
    exit(1);
  }
  int rows = 0;
  for (int r = 0; r < c->num_requests; ++r) rows += c->rows[r];
  int32_t qs[65], lens[64];
  qs[0] = 0;
  for (int r = 0; r < c->num_requests; ++r) {
    qs[r + 1] = qs[r] + c->rows[r];
    lens[r] = c->seq;
  }
  int32_t* tk = malloc(sizeof(int32_t) * (size_t)rows * width);
  c->gen(c, qs, tk);
  mr_timing t;
  memset(&t, 0, sizeof t);
  mr_token_stats(c, b->cfg.kv_dtype == QSAKV_DTYPE_E4M3, b->rows_per_group, qs, tk, &t);
  void *bt, *topk, *q, *out;
  int32_t* bth = malloc(sizeof(int32_t) * (size_t)c->num_requests * b->pages);
  for (int r = 0; r < c->num_requests; ++r)
    memcpy(bth + (size_t)r * b->pages, b->block_table_host + (size_t)r * b->pages,
           sizeof(int32_t) * b->pages);
  CUDA(cudaMalloc(&bt, sizeof(int32_t) * (size_t)c->num_requests * b->pages));
  copy_and_wait(bt, bth, sizeof(int32_t) * (size_t)c->num_requests * b->pages,
                cudaMemcpyHostToDevice);
  CUDA(cudaMalloc(&topk, sizeof(int32_t) * (size_t)rows * width));
  copy_and_wait(topk, tk, sizeof(int32_t) * (size_t)rows * width, cudaMemcpyHostToDevice);
  const size_t qn = (size_t)rows * g_geo.q_heads * g_geo.head_dim;
  uint16_t* hq = malloc(2 * qn);
  for (size_t i = 0; i < qn; ++i) hq[i] = fp16((float)normal());
  CUDA(cudaMalloc(&q, 2 * qn));
  CUDA(cudaMalloc(&out, 2 * qn));
  copy_and_wait(q, hq, 2 * qn, cudaMemcpyHostToDevice);
  for (int route = 0; route < 3; ++route) {
    qsakv_plan_options po;
    CHECK(qsakv_plan_options_init(&po));
    po.max_rows = rows;
    po.max_requests = c->num_requests;
    po.multi_row_min_rows = route == 0 ? 1 : route == 1 ? -1 : 0;
    qsakv_plan* plan = NULL;
    CHECK(qsakv_plan_create(&plan, b->cache, &po));
    qsakv_batch batch = QSAKV_BATCH_INIT;
    batch.num_requests = c->num_requests;
    batch.query_start = qs;
    batch.seq_lens = lens;
    batch.block_table = bt;
    batch.block_table_stride = b->pages;
    CHECK(qsakv_plan_update(plan, &batch, (qsakv_stream_t)s));
    const double us = time_one_call(plan, b->cfg.qsa_layers[0], q, topk, out, s);
    if (route == 0) {
      t.us_grouped = us;
    } else if (route == 1) {
      t.us_decode = us;
    } else {
      qsakv_plan_info pi;
      memset(&pi, 0, sizeof pi);
      pi.struct_size = sizeof pi;
      CHECK(qsakv_plan_get_info(plan, &pi));
      t.us_auto = us;
      t.auto_rows = pi.grouped_rows;
    }
    CUDA(cudaStreamSynchronize(s));
    qsakv_plan_destroy(plan);
  }
  CUDA(cudaFree(bt));
  CUDA(cudaFree(topk));
  CUDA(cudaFree(q));
  CUDA(cudaFree(out));
  free(bth);
  free(hq);
  free(tk);
  return t;
}

static double gb_per_s(double bytes, double us) { return bytes / (us * 1e-6) / 1e9; }

/* Microseconds per store of `tokens` tokens (K and V, kv_heads x head_dim values each, 256
 * for the reference): a graph of one store into each of the kLayers layers, each from its
 * own inputs (4 x 64 MiB of FP16 read per replay: none of it is still in the 50 MB L2 when
 * read again); *us_flushed gets one store alone as a one-call graph with L2 flushed before
 * each replay (the peers' method). */
static double time_store(bench_cache* b, int tokens, cudaStream_t s, double* us_flushed) {
  const size_t n = (size_t)tokens * g_geo.kv_heads * g_geo.head_dim;
  uint16_t* h = malloc(2 * n);
  for (size_t i = 0; i < n; ++i) h[i] = fp16((float)normal());
  int64_t* slots = malloc(sizeof(int64_t) * tokens);
  for (int i = 0; i < tokens; ++i)
    slots[i] = ((int64_t)i * 7919) % ((int64_t)kRequests * b->pages * kBlock);
  void *k[kLayers], *v[kLayers], *sl;
  for (int l = 0; l < kLayers; ++l) {
    CUDA(cudaMalloc(&k[l], 2 * n));
    CUDA(cudaMalloc(&v[l], 2 * n));
    copy_and_wait(k[l], h, 2 * n, cudaMemcpyHostToDevice);
    copy_and_wait(v[l], h, 2 * n, cudaMemcpyHostToDevice);
  }
  CUDA(cudaMalloc(&sl, sizeof(int64_t) * tokens));
  copy_and_wait(sl, slots, sizeof(int64_t) * tokens, cudaMemcpyHostToDevice);
  CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  for (int l = 0; l < kLayers; ++l)
    CHECK(
        qsakv_store_kv(b->cache, b->cfg.qsa_layers[l], k[l], v[l], sl, tokens, (qsakv_stream_t)s));
  const float ms = end_capture_and_time(s, 20);
  CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  CHECK(qsakv_store_kv(b->cache, b->cfg.qsa_layers[0], k[0], v[0], sl, tokens, (qsakv_stream_t)s));
  *us_flushed = end_capture_and_time_ex(s, 20, 1) * 1e3;
  for (int l = 0; l < kLayers; ++l) {
    CUDA(cudaFree(k[l]));
    CUDA(cudaFree(v[l]));
  }
  CUDA(cudaFree(sl));
  free(h);
  free(slots);
  return ms * 1e3 / kLayers;
}

typedef struct {
  double us;               /* per call, 8 calls per graph (L2 warm for small cases) */
  double us_flushed;       /* one-call graph, L2 flushed before each replay */
  double key_bytes;        /* compressed-key bytes the rows read (each row its visible keys) */
  double flops;            /* 2 * heads * dim per row and visible key */
  double score_bytes;      /* score keys the scoring kernels write (4 B per row and visible key) */
  double score_us_flushed; /* the scoring kernels alone (QSAKV_SELECT_STAGES=score), as
                              us_flushed; NAN where not measured */
} select_timing;

/* 64 MiB of N(0,1) FP16 values on the device, made once (the selection and step tables
 * fill keys, queries and activations from it). */
enum { kRandomChunk = 64 << 20 };
static const void* random_fp16_chunk(void) {
  static void* d = NULL;
  if (!d) {
    uint16_t* h = malloc(kRandomChunk);
    for (size_t i = 0; i < kRandomChunk / 2; ++i) h[i] = fp16((float)normal());
    CUDA(cudaMalloc(&d, kRandomChunk));
    copy_and_wait(d, h, kRandomChunk, cudaMemcpyHostToDevice);
    free(h);
  }
  return d;
}

/* The reference model at TP4 reduced to one QSA layer (layer 3 of 4), for `requests`
 * requests, `rows` query rows and contexts of `seq` tokens. */
static void one_layer_config(qsakv_model_config* c, qsakv_dtype kv, qsakv_dtype index_keys,
                             int requests, int rows, int seq) {
  reference_config(c);
  c->num_layers = 4;
  c->num_qsa_layers = 1;
  c->qsa_layers[0] = 3;
  c->kv_dtype = kv;
  c->index_key_dtype = index_keys;
  c->block_size = kBlock;
  c->max_requests = requests;
  c->max_batched_tokens = rows;
  c->max_model_len = seq;
}

/* Fills a layer's compressed index keys with the N(0,1) FP16 keys of the device buffer
 * `d` (`chunk` bytes, repeated): copied for FP16 index keys, stored (the store computes
 * each key's scale) for E4M3 ones. */
static void fill_compressed_keys(qsakv_cache* cache, int layer, const qsakv_cache_layout* L,
                                 int ratio, const void* d, size_t chunk, cudaStream_t s) {
  qsakv_layer_buffers lb = {.struct_size = sizeof lb, .version = QSAKV_LAYER_BUFFERS_VERSION};
  CHECK(qsakv_cache_get_layer_buffers(cache, layer, &lb));
  if (L->index_key_dtype == QSAKV_DTYPE_FP16) {
    for (size_t off = 0; off < L->compressed_bytes_per_layer; off += chunk) {
      const size_t n =
          L->compressed_bytes_per_layer - off < chunk ? L->compressed_bytes_per_layer - off : chunk;
      copy_and_wait((char*)lb.compressed_keys + off, d, n, cudaMemcpyDeviceToDevice);
    }
  } else { /* the same N(0,1) keys through the store (it computes each key's scale) */
    const int64_t keys_per_chunk = (int64_t)(chunk / ((size_t)L->index_head_dim * 2));
    const int64_t entries = L->num_blocks * L->compressed_keys_per_block;
    int64_t* hs = malloc(sizeof(int64_t) * (size_t)keys_per_chunk);
    void* ds;
    CUDA(cudaMalloc(&ds, sizeof(int64_t) * (size_t)keys_per_chunk));
    for (int64_t e0 = 0; e0 < entries; e0 += keys_per_chunk) {
      const int64_t n = entries - e0 < keys_per_chunk ? entries - e0 : keys_per_chunk;
      for (int64_t i = 0; i < n; ++i) hs[i] = (e0 + i) * ratio;
      copy_and_wait(ds, hs, sizeof(int64_t) * (size_t)n, cudaMemcpyHostToDevice);
      CHECK(qsakv_store_compressed_keys(cache, layer, d, ds, n, (qsakv_stream_t)s));
    }
    CUDA(cudaStreamSynchronize(s));
    CUDA(cudaFree(ds));
    free(hs);
  }
}

/* Indexer selection for `requests` requests of `seq` tokens with `rows_per_request` query
 * rows each (the last positions: decode 1, verify 4, a prefill chunk 8192): scores over
 * the visible compressed keys, exact top-k (topk_blocks), expansion. */
static select_timing time_select(qsakv_context* ctx, int requests, int rows_per_request, int seq,
                                 qsakv_dtype index_keys, int flushed_only, cudaStream_t s) {
  const size_t chunk = kRandomChunk;
  const void* d = random_fp16_chunk();
  const int rows = requests * rows_per_request;
  qsakv_model_config c;
  one_layer_config(&c, QSAKV_DTYPE_E4M3, index_keys, requests, rows, seq);
  qsakv_overlay* ov = make_overlay(&c);
  const int pages = (seq + kBlock - 1) / kBlock;
  qsakv_cache_options o;
  CHECK(qsakv_cache_options_init(&o));
  o.num_blocks = (int64_t)requests * pages;
  qsakv_cache* cache = NULL;
  CHECK(qsakv_cache_create(&cache, ctx, &c, ov, &o));
  qsakv_cache_layout L;
  memset(&L, 0, sizeof L);
  L.struct_size = sizeof L;
  CHECK(qsakv_cache_get_layout(cache, &L));
  fill_compressed_keys(cache, 3, &L, c.compress_ratio, d, chunk, s);
  /* Bytes per compressed key as the pages hold them (FP16 256; E4M3 128 codes + scale). */
  const double key_bytes = (double)L.compressed_stride_block / L.compressed_keys_per_block;
  int32_t* bt = malloc(sizeof(int32_t) * (size_t)requests * pages);
  int32_t* qs = malloc(sizeof(int32_t) * (requests + 1));
  int32_t* lens = malloc(sizeof(int32_t) * requests);
  select_timing t = {0, 0, 0, 0, 0, NAN};
  for (int r = 0; r < requests; ++r) {
    for (int p = 0; p < pages; ++p) bt[(size_t)r * pages + p] = r * pages + p;
    qs[r] = r * rows_per_request;
    lens[r] = seq;
    for (int i = 0; i < rows_per_request; ++i) {
      const double visible = (double)((seq - rows_per_request + i + 1) / c.compress_ratio);
      t.key_bytes += visible * key_bytes;
      t.flops += visible * c.index_num_heads * c.index_head_dim * 2;
      t.score_bytes += visible * 4;
    }
  }
  qs[requests] = rows;
  void* dbt;
  CUDA(cudaMalloc(&dbt, sizeof(int32_t) * (size_t)requests * pages));
  copy_and_wait(dbt, bt, sizeof(int32_t) * (size_t)requests * pages, cudaMemcpyHostToDevice);
  qsakv_plan_options po;
  CHECK(qsakv_plan_options_init(&po));
  po.max_rows = rows;
  qsakv_plan* plan = NULL;
  CHECK(qsakv_plan_create(&plan, cache, &po));
  qsakv_batch batch;
  memset(&batch, 0, sizeof batch);
  batch.struct_size = sizeof batch;
  batch.version = QSAKV_BATCH_VERSION;
  batch.num_requests = requests;
  batch.query_start = qs;
  batch.seq_lens = lens;
  batch.block_table = dbt;
  batch.block_table_stride = pages;
  CHECK(qsakv_plan_update(plan, &batch, (qsakv_stream_t)s));
  void* iq;
  const size_t iq_bytes = (size_t)rows * c.index_num_heads * c.index_head_dim * 2;
  CUDA(cudaMalloc(&iq, iq_bytes));
  for (size_t off = 0; off < iq_bytes; off += chunk)
    copy_and_wait((char*)iq + off, d, iq_bytes - off < chunk ? iq_bytes - off : chunk,
                  cudaMemcpyDeviceToDevice);
  enum { kSelectCalls = 8 };
  const int reps = t.key_bytes > 4e9 ? 5 : 10;
  t.us = NAN;
  if (!flushed_only) {
    CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    for (int k = 0; k < kSelectCalls; ++k)
      CHECK(qsakv_select_topk(plan, 3, iq, NULL, 0, (qsakv_stream_t)s));
    t.us = end_capture_and_time(s, reps) * 1e3 / kSelectCalls;
  }
  CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  CHECK(qsakv_select_topk(plan, 3, iq, NULL, 0, (qsakv_stream_t)s));
  if (g_trace_select && !flushed_only) {
    cudaGraph_t g;
    cudaGraphExec_t e;
    CUDA(cudaStreamEndCapture(s, &g));
    CUDA(cudaGraphInstantiate(&e, g, 0));
    t.us_flushed = time_graph_ex(e, s, 2 * reps, 1) * 1e3;
    char label[200];
    const char* mma = getenv("QSAKV_SELECT_MMA");
    const char* sort = getenv("QSAKV_SELECT_SORT");
    const char* pdl = getenv("QSAKV_DEPENDENT_LAUNCH");
    snprintf(label, sizeof label,
             "select, %d x %d rows at %d, %s keys, QSAKV_SELECT_MMA=%s, QSAKV_SELECT_SORT=%s, "
             "QSAKV_DEPENDENT_LAUNCH=%s",
             requests, rows_per_request, seq, index_keys == QSAKV_DTYPE_E4M3 ? "E4M3" : "FP16",
             mma ? mma : "(auto)", sort ? sort : "(auto)", pdl ? pdl : "(auto)");
    time_graph_ex(e, s, 1, 1); /* the flush buffer exists, the graph is warm */
    flush_l2_now(s);
    CUDA(cudaStreamSynchronize(s));
    kernel_trace_begin();
    CUDA(cudaGraphLaunch(e, s));
    kernel_trace_end(stdout, label);
    CUDA(cudaGraphExecDestroy(e));
    CUDA(cudaGraphDestroy(g));
  } else {
    t.us_flushed = end_capture_and_time_ex(s, 2 * reps, 1) * 1e3;
  }
  qsakv_plan_destroy(plan);
  qsakv_cache_destroy(cache);
  qsakv_overlay_destroy(ov);
  CUDA(cudaFree(dbt));
  CUDA(cudaFree(iq));
  free(bt);
  free(qs);
  free(lens);
  return t;
}

/* ---- One decode step of one QSA layer (issue 28): for `rows` requests of one new token
 * each at position seq - 1 (seq a multiple of the compress ratio, so every row completes
 * a group): store its K/V, its raw index key and the group's compressed key, select,
 * attend. Each stage is timed alone (one call per graph, L2 flushed) next to the whole
 * step (one graph of the five calls: one call L2 flushed, and a graph of kStepCalls steps
 * back to back, per step). */
enum { kStepStages = 5, kStepCalls = 8 };
/* step_stage's pseudo-stage: stages 0-2 as one qsakv_store_step. */
enum { kStepFusedStores = 100 };
static const char* const kStepStageNames[kStepStages] = {"store_kv", "store_ring", "store_ckey",
                                                         "select", "attention"};
typedef struct {
  double stage_us[kStepStages]; /* each alone, one call, L2 flushed */
  double step_us;               /* the whole step, one call, L2 flushed */
  double step_graph_us;         /* per step, a graph of kStepCalls steps */
  /* The same with the three stores as one qsakv_store_step: alone, the step, per step. */
  double stores_fused_us, step_fused_us, step_fused_graph_us;
} step_timing;

typedef struct {
  qsakv_cache* cache;
  qsakv_plan* plan;
  int layer, rows;
  void *k, *v, *ring_keys, *ckeys, *index_q, *q, *out;
  int64_t* slots;
  int32_t* request_slots;
  int64_t* positions;
} step_args;

static void step_stage(const step_args* a, int stage, cudaStream_t s) {
  const qsakv_stream_t st = (qsakv_stream_t)s;
  switch (stage) {
    case 0:
      CHECK(qsakv_store_kv(a->cache, a->layer, a->k, a->v, a->slots, a->rows, st));
      break;
    case 1:
      CHECK(qsakv_store_index_keys(a->cache, a->layer, a->ring_keys, a->request_slots, a->positions,
                                   a->rows, st));
      break;
    case 2:
      CHECK(qsakv_store_compressed_keys(a->cache, a->layer, a->ckeys, a->slots, a->rows, st));
      break;
    case 3:
      CHECK(qsakv_select_topk(a->plan, a->layer, a->index_q, NULL, 0, st));
      break;
    case kStepFusedStores: {
      qsakv_step_stores ss = QSAKV_STEP_STORES_INIT;
      ss.k = a->k;
      ss.v = a->v;
      ss.kv_slot_mapping = a->slots;
      ss.num_tokens = a->rows;
      ss.index_keys = a->ring_keys;
      ss.index_request_slots = a->request_slots;
      ss.index_positions = a->positions;
      ss.num_index_keys = a->rows;
      ss.compressed_keys = a->ckeys;
      ss.compressed_slot_mapping = a->slots;
      ss.num_compressed_keys = a->rows;
      CHECK(qsakv_store_step(a->cache, a->layer, &ss, st));
      break;
    }
    default:
      CHECK(qsakv_attention_run(a->plan, a->layer, QSAKV_ATTENTION_SPARSE, a->q, NULL, 0, a->out,
                                st));
  }
}

static step_timing time_decode_step(qsakv_context* ctx, qsakv_dtype kv, qsakv_dtype index_keys,
                                    int rows, int seq, cudaStream_t s) {
  const size_t chunk = kRandomChunk;
  const void* d = random_fp16_chunk();
  qsakv_model_config c;
  one_layer_config(&c, kv, index_keys, rows, rows, seq);
  qsakv_rank_geometry geo;
  memset(&geo, 0, sizeof geo);
  geo.struct_size = sizeof geo;
  CHECK(qsakv_model_config_rank_geometry(&c, &geo));
  qsakv_overlay* ov = kv == QSAKV_DTYPE_E4M3 ? make_overlay(&c) : NULL;
  const int pages = (seq + kBlock - 1) / kBlock;
  qsakv_cache_options o;
  CHECK(qsakv_cache_options_init(&o));
  o.num_blocks = (int64_t)rows * pages;
  step_args a;
  memset(&a, 0, sizeof a);
  a.layer = c.qsa_layers[0];
  a.rows = rows;
  CHECK(qsakv_cache_create(&a.cache, ctx, &c, ov, &o));
  qsakv_cache_layout L;
  memset(&L, 0, sizeof L);
  L.struct_size = sizeof L;
  CHECK(qsakv_cache_get_layout(a.cache, &L));
  qsakv_layer_buffers lb = {.struct_size = sizeof lb, .version = QSAKV_LAYER_BUFFERS_VERSION};
  CHECK(qsakv_cache_get_layer_buffers(a.cache, a.layer, &lb));
  /* K/V: finite random bytes (E4M3 codes without NaN; FP16 N(0,1) values). */
  if (kv == QSAKV_DTYPE_E4M3) {
    uint8_t* h8 = malloc(chunk);
    for (size_t i = 0; i < chunk; ++i) {
      uint8_t x = (uint8_t)rnd();
      h8[i] = (x & 0x7F) == 0x7F ? (uint8_t)(x ^ 1) : x;
    }
    void* d8;
    CUDA(cudaMalloc(&d8, chunk));
    copy_and_wait(d8, h8, chunk, cudaMemcpyHostToDevice);
    for (size_t off = 0; off < L.kv_bytes_per_layer; off += chunk)
      copy_and_wait((char*)lb.kv + off, d8,
                    L.kv_bytes_per_layer - off < chunk ? L.kv_bytes_per_layer - off : chunk,
                    cudaMemcpyDeviceToDevice);
    CUDA(cudaFree(d8));
    free(h8);
  } else {
    for (size_t off = 0; off < L.kv_bytes_per_layer; off += chunk)
      copy_and_wait((char*)lb.kv + off, d,
                    L.kv_bytes_per_layer - off < chunk ? L.kv_bytes_per_layer - off : chunk,
                    cudaMemcpyDeviceToDevice);
  }
  fill_compressed_keys(a.cache, a.layer, &L, c.compress_ratio, d, chunk, s);
  /* Request r owns blocks r * pages ..; its new token sits at position seq - 1. */
  int32_t* bt = malloc(sizeof(int32_t) * (size_t)rows * pages);
  int32_t* qs = malloc(sizeof(int32_t) * (size_t)(rows + 1));
  int32_t* lens = malloc(sizeof(int32_t) * (size_t)rows);
  int64_t* slots = malloc(sizeof(int64_t) * (size_t)rows);
  int64_t* pos = malloc(sizeof(int64_t) * (size_t)rows);
  int32_t* rs = malloc(sizeof(int32_t) * (size_t)rows);
  for (int r = 0; r < rows; ++r) {
    for (int p = 0; p < pages; ++p) bt[(size_t)r * pages + p] = r * pages + p;
    qs[r] = r;
    lens[r] = seq;
    pos[r] = seq - 1;
    rs[r] = r;
    slots[r] = (int64_t)bt[(size_t)r * pages + (seq - 1) / kBlock] * kBlock + (seq - 1) % kBlock;
  }
  qs[rows] = rows;
  void* dbt;
  CUDA(cudaMalloc(&dbt, sizeof(int32_t) * (size_t)rows * pages));
  copy_and_wait(dbt, bt, sizeof(int32_t) * (size_t)rows * pages, cudaMemcpyHostToDevice);
  CUDA(cudaMalloc((void**)&a.slots, sizeof(int64_t) * (size_t)rows));
  copy_and_wait(a.slots, slots, sizeof(int64_t) * (size_t)rows, cudaMemcpyHostToDevice);
  CUDA(cudaMalloc((void**)&a.positions, sizeof(int64_t) * (size_t)rows));
  copy_and_wait(a.positions, pos, sizeof(int64_t) * (size_t)rows, cudaMemcpyHostToDevice);
  CUDA(cudaMalloc((void**)&a.request_slots, sizeof(int32_t) * (size_t)rows));
  copy_and_wait(a.request_slots, rs, sizeof(int32_t) * (size_t)rows, cudaMemcpyHostToDevice);
  /* Activations: slices of the random FP16 buffer (each a few MB at most). */
  const size_t kv_bytes = (size_t)rows * geo.kv_heads * c.head_dim * 2;
  const size_t key_bytes = (size_t)rows * c.index_head_dim * 2;
  const size_t iq_bytes = key_bytes * c.index_num_heads;
  const size_t q_bytes = (size_t)rows * geo.q_heads * c.head_dim * 2;
  void** bufs[6] = {&a.k, &a.v, &a.ring_keys, &a.ckeys, &a.index_q, &a.q};
  const size_t sizes[6] = {kv_bytes, kv_bytes, key_bytes, key_bytes, iq_bytes, q_bytes};
  for (int i = 0; i < 6; ++i) {
    CUDA(cudaMalloc(bufs[i], sizes[i]));
    copy_and_wait(*bufs[i], (const char*)d + (size_t)i * 4096, sizes[i], cudaMemcpyDeviceToDevice);
  }
  CUDA(cudaMalloc(&a.out, q_bytes));
  qsakv_plan_options po;
  CHECK(qsakv_plan_options_init(&po));
  po.max_rows = rows;
  CHECK(qsakv_plan_create(&a.plan, a.cache, &po));
  qsakv_batch batch = QSAKV_BATCH_INIT;
  batch.num_requests = rows;
  batch.query_start = qs;
  batch.seq_lens = lens;
  batch.block_table = dbt;
  batch.block_table_stride = pages;
  CHECK(qsakv_plan_update(a.plan, &batch, (qsakv_stream_t)s));
  CUDA(cudaStreamSynchronize(s));

  step_timing t;
  const int reps = 20;
  for (int st = 0; st < kStepStages; ++st) {
    CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    step_stage(&a, st, s);
    t.stage_us[st] = end_capture_and_time_ex(s, reps, 1) * 1e3;
  }
  CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  for (int st = 0; st < kStepStages; ++st) step_stage(&a, st, s);
  t.step_us = end_capture_and_time_ex(s, reps, 1) * 1e3;
  CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  for (int k = 0; k < kStepCalls; ++k)
    for (int st = 0; st < kStepStages; ++st) step_stage(&a, st, s);
  t.step_graph_us = end_capture_and_time_ex(s, reps, 0) * 1e3 / kStepCalls;
  const int fused[3] = {kStepFusedStores, 3, 4};
  CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  step_stage(&a, kStepFusedStores, s);
  t.stores_fused_us = end_capture_and_time_ex(s, reps, 1) * 1e3;
  CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  for (int st = 0; st < 3; ++st) step_stage(&a, fused[st], s);
  t.step_fused_us = end_capture_and_time_ex(s, reps, 1) * 1e3;
  CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  for (int k = 0; k < kStepCalls; ++k)
    for (int st = 0; st < 3; ++st) step_stage(&a, fused[st], s);
  t.step_fused_graph_us = end_capture_and_time_ex(s, reps, 0) * 1e3 / kStepCalls;

  qsakv_plan_destroy(a.plan);
  qsakv_cache_destroy(a.cache);
  qsakv_overlay_destroy(ov);
  for (int i = 0; i < 6; ++i) CUDA(cudaFree(*bufs[i]));
  CUDA(cudaFree(a.out));
  CUDA(cudaFree(a.slots));
  CUDA(cudaFree(a.positions));
  CUDA(cudaFree(a.request_slots));
  CUDA(cudaFree(dbt));
  free(bt);
  free(qs);
  free(lens);
  free(slots);
  free(pos);
  free(rs);
  return t;
}

/* The decode-step table: 1..64 rows at 32K and 128K, E4M3 (K/V and index keys) and FP16. */
static void run_decode_step_table(qsakv_context* ctx, cudaStream_t s, FILE* js) {
  const int rows_list[6] = {1, 2, 4, 8, 16, 64}, seqs[2] = {32768, 131072};
  printf(
      "\ndecode step of one QSA layer (store K/V, raw index key and compressed key of one new "
      "token per row,\nselect, attend; the reference geometry at TP4), us; stages alone and the "
      "whole step one call L2 flushed,\n'graph/step' a graph of %d steps back to back, per "
      "step; '1x': the three stores as one qsakv_store_step\n",
      kStepCalls);
  printf("%5s %5s %7s", "cache", "rows", "context");
  for (int st = 0; st < kStepStages; ++st) printf(" %10s", kStepStageNames[st]);
  printf(" %10s %10s %10s %10s %10s %10s\n", "stage sum", "step", "graph/step", "stores 1x",
         "step 1x", "graph 1x");
  if (js) fprintf(js, ",\n  \"decode_step\": [");
  int printed = 0;
  for (int dt = 0; dt < 2; ++dt)
    for (int si = 0; si < 2; ++si)
      for (int ri = 0; ri < 6; ++ri) {
        const qsakv_dtype kv = dt == 0 ? QSAKV_DTYPE_E4M3 : QSAKV_DTYPE_FP16;
        const step_timing t = time_decode_step(ctx, kv, kv, rows_list[ri], seqs[si], s);
        double sum = 0.0;
        for (int st = 0; st < kStepStages; ++st) sum += t.stage_us[st];
        printf("%5s %5d %7d", dt == 0 ? "e4m3" : "fp16", rows_list[ri], seqs[si]);
        for (int st = 0; st < kStepStages; ++st) printf(" %10.2f", t.stage_us[st]);
        printf(" %10.2f %10.2f %10.2f %10.2f %10.2f %10.2f\n", sum, t.step_us, t.step_graph_us,
               t.stores_fused_us, t.step_fused_us, t.step_fused_graph_us);
        if (js) {
          fprintf(js, "%s\n    {\"cache\": \"%s\", \"rows\": %d, \"tokens\": %d",
                  printed++ ? "," : "", dt == 0 ? "e4m3" : "fp16", rows_list[ri], seqs[si]);
          for (int st = 0; st < kStepStages; ++st)
            fprintf(js, ", \"%s_us_l2_flushed\": %.3f", kStepStageNames[st], t.stage_us[st]);
          fprintf(js,
                  ", \"step_us_l2_flushed\": %.3f, \"step_us_graph\": %.3f, "
                  "\"store_step_us_l2_flushed\": %.3f, \"step_store_step_us_l2_flushed\": %.3f, "
                  "\"step_store_step_us_graph\": %.3f}",
                  t.step_us, t.step_graph_us, t.stores_fused_us, t.step_fused_us,
                  t.step_fused_graph_us);
        }
      }
  if (js) fprintf(js, "\n  ]");
}

/* A JSON number with `decimals` decimals, or null where v is not finite (--e4m3-only's
 * columns); the text lasts until 8 more calls. */
static const char* json_num(double v, int decimals) {
  static char buf[8][32];
  static int next = 0;
  char* b = buf[next++ % 8];
  if (isfinite(v))
    snprintf(b, sizeof buf[0], "%.*f", decimals, v);
  else
    snprintf(b, sizeof buf[0], "null");
  return b;
}

/* E4M3 attention time (us) of the main table for `rows` rows, or NAN if not measured. */
static double attention_us_for(const int* rows_list, const double* us, int n, int rows) {
  for (int i = 0; i < n; ++i)
    if (rows_list[i] == rows) return us[i];
  return NAN;
}

static void usage(FILE* f, const char* argv0) {
  fprintf(
      f,
      "usage: %s [--json PATH] [--rows 1,8,...] [--e4m3-only] [--splits N] [--select-only] "
      "[--select-cases 0,4,...] [--select-stages] [--trace-select] [--store-only] [--decode-only] "
      "[--multirow-only] "
      "[--no-multirow] [--overlap-only] [--no-overlap] [--overlap-f 1,0.5,...] "
      "[--overlap-dtype e4m3|fp16] [--overlap-shapes 0,3,...] [--index-keys fp16|e4m3|both] "
      "[--step-only] [--tier auto|sm70|sm75] [--help]\n"
      "  --json PATH          write the results as JSON to PATH\n"
      "  --rows LIST          the decode table's row counts (default 1,8,16,20,32,64,128,256,"
      "1024)\n"
      "  --e4m3-only          the decode table without its software-decoder and FP16 columns\n"
      "  --splits N           the decode table's plans take N splits\n"
      "  --select-only        no decode table, no store\n"
      "  --select-cases LIST  only these selection cases (indices; 15: prefill 2048 at 32K,\n"
      "                       16-22: the rows-per-request sweep, 23-25: one-wave chunks)\n"
      "  --trace-select       each selection case also prints its kernels' timeline (one call\n"
      "                       after an L2 flush, CUPTI): starts, ends, overlaps\n"
      "  --select-stages      the scoring kernels alone on the decode rows too (always on the\n"
      "                       verify and prefill rows; the top-k column is the rest)\n"
      "  --index-keys K       the selection table with FP16 or E4M3 index keys, or both (default)\n"
      "  --store-only         only the store (no multi-row, decode or selection tables)\n"
      "  --decode-only        only the decode table\n"
      "  --step-only          only the decode-step table (store, select, attend per layer)\n"
      "  --multirow-only      only the multi-row table and the overlap sweep\n"
      "  --no-multirow        neither the multi-row table nor the overlap sweep\n"
      "  --overlap-only       only the overlap sweep (with --multirow-only: and the multi-row "
      "table)\n"
      "  --no-overlap         no overlap sweep\n"
      "  --overlap-f LIST     the sweep's shared fractions (default 1,0.9,0.75,0.5,0.25,0)\n"
      "  --overlap-dtype D    the sweep in one KV dtype only (e4m3 or fp16)\n"
      "  --overlap-shapes L   the sweep's workloads by index (0: prefill 8192 at 32K, 1: prefill "
      "2048 at 32K,\n                       2: verify 64x4, 3: verify 64x8, 4: prefill 8192 at "
      "128K)\n"
      "  --tier T             force the kernel tier (QSAKV_CUDA_TIER)\n"
      "  --help, -h           print this help and exit\n",
      argv0);
}

/* The end of a run (after every table, or after the one it was asked for): closes the
 * JSON object and releases what main made. */
static int finish_run(FILE* js, cudaStream_t s, qsakv_context* sw, qsakv_context* hw) {
  if (js) {
    fprintf(js, "\n}\n");
    fclose(js);
  }
  CUDA(cudaStreamDestroy(s));
  qsakv_context_destroy(sw);
  qsakv_context_destroy(hw);
  return 0;
}

int main(int argc, char** argv) {
  const char* json_path = NULL;
  int rows_list[16] = {1, 8, 16, 20, 32, 64, 128, 256, 1024};
  int n_rows = 9, e4m3_only = 0, select_only = 0, multirow_only = 0, no_multirow = 0, no_store = 0,
      store_only = 0, overlap_only = 0, no_overlap = 0, step_only = 0;
  int case_mask = -1;      /* selection cases to run (bit i: case i) */
  int overlap_dtypes = 3;  /* the sweep's KV dtypes (bit 0: E4M3, bit 1: FP16) */
  int overlap_shapes = -1; /* the sweep's workloads (bit i: shapes[i] below) */
  int select_keys = 3;     /* the selection table's index keys (bit 0: FP16, bit 1: E4M3) */
  int select_stages = 0;   /* the scoring kernels alone on the decode rows too */
  double overlap_f[16] = {1.0, 0.9, 0.75, 0.5, 0.25, 0.0};
  int n_overlap_f = 6;
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--json") && i + 1 < argc)
      json_path = argv[++i];
    else if (!strcmp(argv[i], "--e4m3-only"))
      e4m3_only = 1;
    else if (!strcmp(argv[i], "--select-only"))
      select_only = 1;
    else if (!strcmp(argv[i], "--multirow-only"))
      multirow_only = 1;
    else if (!strcmp(argv[i], "--no-multirow"))
      no_multirow = 1;
    else if (!strcmp(argv[i], "--overlap-only"))
      overlap_only = 1;
    else if (!strcmp(argv[i], "--no-overlap"))
      no_overlap = 1;
    else if (!strcmp(argv[i], "--overlap-f") && i + 1 < argc) {
      n_overlap_f = 0;
      for (char* t = strtok(argv[++i], ","); t; t = strtok(NULL, ",")) {
        char* end = NULL;
        const double f = strtod(t, &end);
        if (end == t || *end || !(f >= 0.0 && f <= 1.0) || n_overlap_f == 16) {
          fprintf(stderr, "--overlap-f: '%s' is not a fraction in [0, 1] (at most 16)\n", t);
          return 2;
        }
        overlap_f[n_overlap_f++] = f;
      }
      if (n_overlap_f == 0) {
        fprintf(stderr, "--overlap-f: no fraction given\n");
        return 2;
      }
    } else if (!strcmp(argv[i], "--overlap-shapes") && i + 1 < argc) {
      overlap_shapes = 0;
      for (char* t = strtok(argv[++i], ","); t; t = strtok(NULL, ","))
        overlap_shapes |= 1 << atoi(t);
    } else if (!strcmp(argv[i], "--overlap-dtype") && i + 1 < argc) {
      ++i;
      if (!strcmp(argv[i], "e4m3"))
        overlap_dtypes = 1;
      else if (!strcmp(argv[i], "fp16"))
        overlap_dtypes = 2;
      else {
        fprintf(stderr, "--overlap-dtype: '%s' is neither e4m3 nor fp16\n", argv[i]);
        return 2;
      }
    } else if (!strcmp(argv[i], "--index-keys") && i + 1 < argc) {
      ++i;
      if (!strcmp(argv[i], "fp16"))
        select_keys = 1;
      else if (!strcmp(argv[i], "e4m3"))
        select_keys = 2;
      else if (!strcmp(argv[i], "both"))
        select_keys = 3;
      else {
        fprintf(stderr, "--index-keys: '%s' is none of fp16, e4m3, both\n", argv[i]);
        return 2;
      }
    } else if (!strcmp(argv[i], "--store-only")) {
      no_multirow = 1;
      store_only = 1;
      case_mask = 0;
    } else if (!strcmp(argv[i], "--step-only")) {
      step_only = 1;
    } else if (!strcmp(argv[i], "--decode-only")) {
      no_multirow = 1;
      no_store = 1;
      case_mask = 0;
    } else if (!strcmp(argv[i], "--splits") && i + 1 < argc)
      g_forced_splits = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--select-stages"))
      select_stages = 1;
    else if (!strcmp(argv[i], "--trace-select")) {
      if (!kernel_trace_available()) {
        fprintf(stderr, "--trace-select: this bench was built without CUPTI\n");
        return 2;
      }
      g_trace_select = 1;
    } else if (!strcmp(argv[i], "--select-cases") && i + 1 < argc) {
      case_mask = 0;
      for (char* t = strtok(argv[++i], ","); t; t = strtok(NULL, ",")) case_mask |= 1 << atoi(t);
    } else if (!strcmp(argv[i], "--tier") && i + 1 < argc) {
      /* Forces the kernel tier of every context below (the library reads the variable at
       * context creation); an invalid value fails context creation, naming it. */
      setenv("QSAKV_CUDA_TIER", argv[++i], 1);
    } else if (!strcmp(argv[i], "--rows") && i + 1 < argc) {
      n_rows = 0;
      for (char* t = strtok(argv[++i], ","); t && n_rows < 16; t = strtok(NULL, ","))
        rows_list[n_rows++] = atoi(t);
    } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      usage(stdout, argv[0]);
      return 0;
    } else {
      usage(stderr, argv[0]);
      return 2;
    }
  }
  init_geometry();
  qsakv_context_options o;
  CHECK(qsakv_context_options_init(&o));
  o.backend = QSAKV_BACKEND_CUDA;
  qsakv_context* hw = NULL;
  CHECK(qsakv_context_create(&hw, &o));
  o.decoder = QSAKV_DECODER_SOFTWARE;
  qsakv_context* sw = NULL;
  CHECK(qsakv_context_create(&sw, &o));
  qsakv_context_info info;
  memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  CHECK(qsakv_context_get_info(hw, &info));
  cudaStream_t s;
  CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  warm_up(s);
  const double memcpy_gbs = copy_bandwidth(s, 0, info.multiprocessor_count);
  const double kcopy_gbs = copy_bandwidth(s, 1, info.multiprocessor_count);
  /* The ceiling: the faster of the two copies (percentages are then conservative). */
  const double copy_gbs = memcpy_gbs > kcopy_gbs ? memcpy_gbs : kcopy_gbs;
  const int sm70_tier = info.kernel_tier == QSAKV_KERNEL_TIER_SM70;
  printf("kernel tier: %s%s\n",
         sm70_tier ? "sm70 (CUDA-core FP32, software E4M3)" : "sm75+ (tensor cores)",
         sm70_tier && info.sm_version > 70
             ? " -- FORCED on this GPU: these times say the tier is not pathological, nothing "
               "about V100 speed"
             : "");
  printf(
      "device: %s (SM %d, %d SMs); decoder for e4m3: %s\n"
      "copy bandwidth (read+write): cudaMemcpy %.0f GB/s, SM copy kernel %.0f GB/s -> ceiling %.0f "
      "GB/s\n",
      info.device_name, info.sm_version, info.multiprocessor_count,
      info.decoder == QSAKV_DECODER_HARDWARE ? "hardware" : "software", memcpy_gbs, kcopy_gbs,
      copy_gbs);

  if (multirow_only) {
    select_only = 1;
    case_mask = 0;
  }
  /* Sections: --overlap-only drops all but the sweep, unless --multirow-only is also given
   * (then the multi-row table runs too); --no-multirow drops both multi-row sections. */
  const int run_multirow = !no_multirow && (!overlap_only || multirow_only) && !sm70_tier;
  const int run_overlap = !no_overlap && (overlap_only || !no_multirow) && !sm70_tier;
  if (sm70_tier && (overlap_only || multirow_only))
    printf("no multi-row sections: the sm70 tier has no grouped route\n");
  FILE* js = json_path ? fopen(json_path, "w") : NULL;
  if (!js && json_path) {
    fprintf(stderr, "cannot write %s\n", json_path);
    return 1;
  }
  /* JSON: each section starts with the comma that separates it from the one before. */
  if (js)
    fprintf(js,
            "{\n  \"device\": \"%s\",\n  \"kernel_tier\": \"%s\",\n  \"copy_gbs\": %.1f,\n"
            "  \"memcpy_gbs\": %.1f,\n  \"kernel_copy_gbs\": %.1f",
            info.device_name, sm70_tier ? "sm70" : "sm75", copy_gbs, memcpy_gbs, kcopy_gbs);
  if (step_only) {
    run_decode_step_table(hw, s, js);
    return finish_run(js, s, sw, hw);
  }
  if (run_multirow) {
    /* Grouped route against the decode route, one call alone, L2 flushed. */
    mr_case mr[16];
    int n_mr = 0;
    const int prefill[3] = {512, 2048, 8192}, verify_rows[9] = {1, 2, 3, 4, 5, 6, 7, 8, 20};
    for (int si = 0; si < 2; ++si)
      for (int i = 0; i < 3; ++i) {
        memset(&mr[n_mr], 0, sizeof mr[0]);
        mr[n_mr].kind = "prefill";
        mr[n_mr].num_requests = 1;
        mr[n_mr].rows[0] = prefill[i];
        mr[n_mr].gen = gen_drift;
        mr[n_mr++].seq = si == 0 ? 32768 : 131072;
      }
    for (int i = 0; i < 9; ++i) { /* 64 requests x verify rows */
      memset(&mr[n_mr], 0, sizeof mr[0]);
      mr[n_mr].kind = "verify";
      mr[n_mr].num_requests = 64;
      for (int r = 0; r < 64; ++r) mr[n_mr].rows[r] = verify_rows[i];
      mr[n_mr].gen = gen_drift;
      mr[n_mr++].seq = 32768;
    }
    const mr_case mixed = {"mixed49", 5, {1, 4, 16, 1, 27}, 32768, gen_drift, 0.0, 0};
    mr[n_mr++] = mixed;
    printf(
        "\nmulti-row attention, one call, L2 flushed: grouped route vs decode route on the same "
        "rows\n(TFLOP/s = rows x %d heads x %d x %d x 4 / time; tok/row: K/V tokens per row "
        "the grouped route reads (decode: %d), min/row: the request's distinct tokens per "
        "row)\n",
        g_geo.q_heads, g_geo.topk_width, g_geo.head_dim, g_geo.topk_width);
    printf("%8s %5s %6s %7s %6s %11s %9s %11s %8s %9s %9s %9s %9s\n", "kind", "reqs", "rows",
           "context", "dtype", "grouped us", "TFLOP/s", "decode us", "dec/grp", "auto us",
           "auto grp", "tok/row", "min/row");
    if (js) fprintf(js, ",\n  \"multirow\": [\n");
    int printed_mr = 0;
    const qsakv_dtype dts[2] = {QSAKV_DTYPE_E4M3, QSAKV_DTYPE_FP16};
    for (int di = 0; di < 2; ++di)
      for (int si = 0; si < 2; ++si) {
        const int seq = si == 0 ? 32768 : 131072;
        bench_cache mb;
        make_cache(&mb, hw, dts[di], 8192, seq, si == 0 ? 64 : 1);
        for (int ci = 0; ci < n_mr; ++ci) {
          const mr_case* c = &mr[ci];
          if (c->seq != seq) continue;
          const mr_timing t = time_multirow(&mb, c, s);
          int rows = 0;
          for (int r = 0; r < c->num_requests; ++r) rows += c->rows[r];
          const double flops = (double)rows * g_geo.q_heads * g_geo.topk_width * g_geo.head_dim * 4;
          const double tf = flops / (t.us_grouped * 1e-6) / 1e12;
          printf("%8s %5d %6d %7d %6s %11.2f %9.1f %11.2f %8.2f %9.2f %9d %9.0f %9.0f\n", c->kind,
                 c->num_requests, rows, seq, qsakv_dtype_name(dts[di]), t.us_grouped, tf,
                 t.us_decode, t.us_decode / t.us_grouped, t.us_auto, t.auto_rows,
                 t.tokens_grouped / rows, t.tokens_distinct / rows);
          if (js)
            fprintf(js,
                    "%s    {\"kind\": \"%s\", \"requests\": %d, \"rows\": %d, \"context\": %d, "
                    "\"dtype\": \"%s\", \"grouped_us\": %.3f, \"decode_us\": %.3f, "
                    "\"grouped_tflops\": %.2f, \"groups\": %d, \"tokens_decode\": %.0f, "
                    "\"tokens_grouped\": %.0f, \"tokens_distinct\": %.0f, \"auto_us\": %.3f, "
                    "\"auto_grouped_rows\": %d}",
                    printed_mr++ ? ",\n" : "", c->kind, c->num_requests, rows, seq,
                    qsakv_dtype_name(dts[di]), t.us_grouped, t.us_decode, tf, t.groups,
                    t.tokens_decode, t.tokens_grouped, t.tokens_distinct, t.us_auto, t.auto_rows);
          fflush(stdout);
        }
        free_cache(&mb);
      }
    if (js) fprintf(js, "\n  ]");
  }

  if (run_overlap) {
    /* The overlap sweep: gen_overlap's lists, a fraction f of each row's topk_blocks groups
     * shared by its window (prefill: the library's groups, kWindowRowsPerGroup; verify: the
     * request). */
    enum { kWindowRowsPerGroup = -1 }; /* ov_shape.window: the cache's rows_per_group */
    typedef struct {
      const char* kind;
      int requests, rows, seq, window;
    } ov_shape;
    const ov_shape shapes[] = {
        {"prefill", 1, 8192, 32768, kWindowRowsPerGroup},
        {"prefill", 1, 2048, 32768, kWindowRowsPerGroup},
        {"verify", 64, 4, 32768, 0},
        {"verify", 64, 8, 32768, 0},
        {"prefill", 1, 8192, 131072, kWindowRowsPerGroup},
    };
    const int n_shapes = (int)(sizeof shapes / sizeof shapes[0]);
    int header = 0; /* printed with the first cache: it states that cache's rows per group */
    if (js) fprintf(js, ",\n  \"overlap\": [\n");
    int printed_ov = 0;
    const qsakv_dtype dts[2] = {QSAKV_DTYPE_E4M3, QSAKV_DTYPE_FP16};
    for (int di = 0; di < 2; ++di) {
      if (!((overlap_dtypes >> di) & 1)) continue;
      for (int si = 0; si < 2; ++si) {
        const int seq = si == 0 ? 32768 : 131072;
        bench_cache mb;
        make_cache(&mb, hw, dts[di], 8192, seq, si == 0 ? 64 : 1);
        if (!header++) {
          const int g = mb.rows_per_group;
          printf(
              "\nmulti-row attention, overlap sweep, one call, L2 flushed: auto routing, decode "
              "route forced, grouped route forced\n(lists: a fraction f of each row's %d groups "
              "shared by its window -- prefill: %d rows, verify: the request's rows --, the rest "
              "private and random;\nTFLOP/s = rows x %d heads x %d x %d x 4 / auto time; "
              "auto/best = auto us / min(decode us, grouped us);\nper %d-row group: shared/grp "
              "the tokens of its list (held by >= max(2, (n + 1) / 2, min(n, 7 e4m3 / 3 fp16)) "
              "of its n rows, none if fewer than 64; plus the own entries of rows left with <= "
              "32), union/grp its distinct tokens;\ntok/row: K/V tokens per row the grouped "
              "route reads: each group's list once + each other row's own entries)\n",
              g_geo.topk_blocks, g, g_geo.q_heads, g_geo.topk_width, g_geo.head_dim, g);
          printf("%8s %5s %6s %7s %6s %5s %9s %11s %11s %9s %9s %9s %10s %10s %9s\n", "kind",
                 "reqs", "rows", "context", "dtype", "f", "auto us", "decode us", "grouped us",
                 "auto/best", "auto grp", "tok/row", "shared/grp", "union/grp", "TFLOP/s");
        }
        for (int hi = 0; hi < n_shapes; ++hi) {
          const ov_shape* h = &shapes[hi];
          if (h->seq != seq || !((overlap_shapes >> hi) & 1)) continue;
          for (int fi = 0; fi < n_overlap_f; ++fi) {
            mr_case c;
            memset(&c, 0, sizeof c);
            c.kind = h->kind;
            c.num_requests = h->requests;
            for (int r = 0; r < h->requests; ++r) c.rows[r] = h->rows;
            c.seq = seq;
            c.gen = gen_overlap;
            c.f = overlap_f[fi];
            c.window = h->window == kWindowRowsPerGroup ? mb.rows_per_group : h->window;
            const mr_timing t = time_multirow(&mb, &c, s);
            const int rows = h->requests * h->rows;
            const double flops =
                (double)rows * g_geo.q_heads * g_geo.topk_width * g_geo.head_dim * 4;
            const double tf = flops / (t.us_auto * 1e-6) / 1e12;
            const double best = t.us_decode < t.us_grouped ? t.us_decode : t.us_grouped;
            const double tok_row = t.tokens_read / rows, shared_grp = t.tokens_shared / t.groups,
                         union_grp = t.tokens_grouped / t.groups;
            printf(
                "%8s %5d %6d %7d %6s %5.2f %9.2f %11.2f %11.2f %9.3f %9d %9.0f %10.0f %10.0f "
                "%9.1f\n",
                c.kind, c.num_requests, rows, seq, qsakv_dtype_name(dts[di]), c.f, t.us_auto,
                t.us_decode, t.us_grouped, t.us_auto / best, t.auto_rows, tok_row, shared_grp,
                union_grp, tf);
            if (js)
              fprintf(js,
                      "%s    {\"kind\": \"%s\", \"requests\": %d, \"rows\": %d, \"context\": "
                      "%d, \"dtype\": \"%s\", \"f\": %.4f, \"auto_us\": %.3f, \"decode_us\": "
                      "%.3f, \"grouped_us\": %.3f, \"auto_grouped_rows\": %d, "
                      "\"tokens_per_row\": %.1f, \"shared_per_group\": %.1f, "
                      "\"union_per_group\": %.1f, \"groups\": %d, \"tflops_auto\": %.2f}",
                      printed_ov++ ? ",\n" : "", c.kind, c.num_requests, rows, seq,
                      qsakv_dtype_name(dts[di]), c.f, t.us_auto, t.us_decode, t.us_grouped,
                      t.auto_rows, tok_row, shared_grp, union_grp, t.groups, tf);
            fflush(stdout);
          }
        }
        free_cache(&mb);
      }
    }
    if (js) fprintf(js, "\n  ]");
  }

  if (overlap_only) return finish_run(js, s, sw, hw);

  if (select_only || store_only) n_rows = 0;
  int rows_max = 1;
  for (int i = 0; i < n_rows; ++i) rows_max = rows_list[i] > rows_max ? rows_list[i] : rows_max;
  bench_cache e8, e8sw, f16;
  make_cache(&e8, hw, QSAKV_DTYPE_E4M3, rows_max, kSeq, kRequests);
  make_cache(&e8sw, sw, QSAKV_DTYPE_E4M3, rows_max, kSeq, kRequests);
  make_cache(&f16, hw, QSAKV_DTYPE_FP16, rows_max, kSeq, kRequests);

  if (js) fprintf(js, ",\n  \"attention\": [");
  printf(
      "\nsparse decode attention, %d q heads / %d KV head, head_dim %d, %d tokens/row, 32K "
      "contexts, bs %d\n",
      g_geo.q_heads, g_geo.kv_heads, g_geo.head_dim, g_geo.topk_width, kBlock);
  printf("one-call L2-flushed floors (same method): an empty kernel %.2f us\n",
         floor_us(s, FLOOR_EMPTY, 0, info.multiprocessor_count));
  printf("%6s %7s %10s %10s %8s %7s %10s %9s %10s %10s %7s %11s %11s %11s\n", "rows", "splits",
         "e4m3 us", "MB read", "GB/s", "%copy", "e4m3sw us", "sw/hw", "fp16 us", "fp16 GB/s",
         "e4/f16", "e4m3 us L2f", "fp16 us L2f", "read8 L2f");
  double att_us[16];
  for (int i = 0; i < n_rows; ++i) {
    const int rows = rows_list[i];
    int splits = 0, s2 = 0, s3 = 0;
    double t8f = NAN, t16f = NAN;
    const double t8 = time_attention(&e8, rows, s, &splits, &t8f);
    att_us[i] = t8;
    const double t8sw = e4m3_only ? NAN : time_attention(&e8sw, rows, s, &s2, NULL);
    const double t16 = e4m3_only ? NAN : time_attention(&f16, rows, s, &s3, &t16f);
    const double bytes8 = (double)rows * g_geo.topk_width * 2 * g_geo.kv_heads * g_geo.head_dim,
                 bytes16 = 2 * bytes8;
    const double gbs8 = bytes8 / (t8 * 1e-6) / 1e9, gbs16 = bytes16 / (t16 * 1e-6) / 1e9;
    /* A contiguous read of the E4M3 call's bytes, one call, L2 flushed: its floor there. */
    const double read8f = floor_us(s, FLOOR_READ, (size_t)bytes8, info.multiprocessor_count);
    printf(
        "%6d %7d %10.2f %10.2f %8.0f %6.1f%% %10.2f %9.3f %10.2f %10.0f %7.3f %11.2f %11.2f "
        "%11.2f\n",
        rows, splits, t8, bytes8 / 1e6, gbs8, 100.0 * gbs8 / copy_gbs, t8sw, t8sw / t8, t16, gbs16,
        t8 / t16, t8f, t16f, read8f);
    if (js)
      fprintf(js,
              "%s\n    {\"rows\": %d, \"splits\": %d, \"e4m3_us\": %.3f, \"e4m3_sw_us\": %s, "
              "\"fp16_us\": %s, \"e4m3_bytes\": %.0f, \"e4m3_gbs\": %.1f, \"fp16_gbs\": %s, "
              "\"e4m3_pct_copy\": %.1f, \"fp16_pct_copy\": %s, \"e4m3_over_fp16\": %s, "
              "\"e4m3_us_l2_flushed\": %.3f, \"fp16_us_l2_flushed\": %.3f, "
              "\"e4m3_read_floor_us_l2_flushed\": %.3f}",
              i ? "," : "", rows, splits, t8, json_num(t8sw, 3), json_num(t16, 3), bytes8, gbs8,
              json_num(gbs16, 1), 100.0 * gbs8 / copy_gbs, json_num(100.0 * gbs16 / copy_gbs, 1),
              json_num(t8 / t16, 4), t8f, isnan(t16f) ? -1.0 : t16f, read8f);
  }
  if (js) fprintf(js, "\n  ]");

  if (!select_only && !no_store) {
    const int store_tokens = 65536;
    double ts8f = 0.0, ts16f = 0.0;
    const double ts8 = time_store(&e8, store_tokens, s, &ts8f);
    const double ts16 = time_store(&f16, store_tokens, s, &ts16f);
    const double kv_values = (double)g_geo.kv_heads * g_geo.head_dim; /* per token, K or V */
    const double sb8 = store_tokens * kv_values * 2 * (2 + 1),
                 sb16 = store_tokens * kv_values * 2 * (2 + 2);
    printf(
        "\nstore K/V, %d tokens: e4m3 %.2f us (%.0f GB/s, %.1f%% of copy), fp16 %.2f us (%.0f "
        "GB/s, %.1f%%); one call, L2 flushed: e4m3 %.2f us (%.1f%%), fp16 %.2f us (%.1f%%)\n",
        store_tokens, ts8, gb_per_s(sb8, ts8), 100.0 * gb_per_s(sb8, ts8) / copy_gbs, ts16,
        gb_per_s(sb16, ts16), 100.0 * gb_per_s(sb16, ts16) / copy_gbs, ts8f,
        100.0 * gb_per_s(sb8, ts8f) / copy_gbs, ts16f, 100.0 * gb_per_s(sb16, ts16f) / copy_gbs);
    /* The same bytes moved by plain SM kernels, one call, L2 flushed: the floors of the
     * one-call figures (E4M3: 2 bytes read per byte written; FP16: a copy). */
    const size_t out8 = (size_t)store_tokens * g_geo.kv_heads * g_geo.head_dim * 2,
                 out16 = 2 * out8;
    const double fl8 = floor_us(s, FLOOR_SHRINK, out8, info.multiprocessor_count),
                 fl16 = floor_us(s, FLOOR_COPY, out16, info.multiprocessor_count);
    printf(
        "  the same bytes by a plain kernel, one call, L2 flushed: e4m3's (read 2 : write 1) "
        "%.2f us -> the store at %.1f%% of it; fp16's (a copy) %.2f us -> %.1f%%\n",
        fl8, 100.0 * fl8 / ts8f, fl16, 100.0 * fl16 / ts16f);
    if (js)
      fprintf(js,
              ",\n  \"store\": {\"tokens\": %d, \"e4m3_us\": %.3f, \"fp16_us\": %.3f, "
              "\"e4m3_gbs\": %.1f, \"fp16_gbs\": %.1f, \"e4m3_us_l2_flushed\": %.3f, "
              "\"fp16_us_l2_flushed\": %.3f, \"e4m3_floor_us_l2_flushed\": %.3f, "
              "\"fp16_floor_us_l2_flushed\": %.3f}",
              store_tokens, ts8, ts16, gb_per_s(sb8, ts8), gb_per_s(sb16, ts16), ts8f, ts16f, fl8,
              fl16);
  }
  free_cache(&e8);
  free_cache(&e8sw);
  free_cache(&f16);

  /* Selection against the attention it feeds: decode rows at 32K/128K/256K, verify rows,
   * prefill chunks, each with FP16 and with E4M3 index keys. Key bytes: each row's visible
   * compressed keys (64 B per token FP16, 33 B E4M3). */
  typedef struct {
    const char* kind;
    int requests, rows_per_request, seq;
  } sel_case;
  const sel_case cases[] = {
      {"decode", 1, 1, 32768},
      {"decode", 8, 1, 32768},
      {"decode", 64, 1, 32768},
      {"decode", 256, 1, 32768},
      {"decode", 1, 1, 131072},
      {"decode", 8, 1, 131072},
      {"decode", 64, 1, 131072},
      {"decode", 256, 1, 131072},
      {"decode", 1, 1, 262144},
      {"decode", 8, 1, 262144},
      {"decode", 64, 1, 262144},
      {"decode", 256, 1, 262144},
      {"verify", 64, 4, 131072},
      {"prefill", 1, 8192, 32768},
      {"prefill", 1, 8192, 131072},
      {"prefill", 1, 2048, 32768},
      /* 16-22: rows per request around the automatic choice of the multi-row scorer's MMA
       * (docs/perf.md run 39), all one wave: 16 rows (one request: a plan too small for full
       * CTAs; 4 and 16 requests), 32, 512 at 8K, and fewer than 16 (8 and 12). */
      {"prefill", 1, 16, 32768},
      {"prefill", 4, 16, 32768},
      {"prefill", 16, 16, 131072},
      {"prefill", 8, 32, 32768},
      {"prefill", 2, 512, 8192},
      {"verify", 32, 8, 131072},
      {"prefill", 8, 12, 32768},
      /* 23-25: one-request chunks that fit one wave of the workspace, around the warpgroup
       * scorer's grid rule (docs/perf.md run 48): 1,024 rows at 32K (256 of its CTAs),
       * 4,096 at 32K (1,024 CTAs) and 1,024 at 128K (1,024 CTAs). */
      {"prefill", 1, 1024, 32768},
      {"prefill", 1, 4096, 32768},
      {"prefill", 1, 1024, 131072},
  };
  /* The scoring kernels alone, through a context made with QSAKV_SELECT_STAGES=score (the
   * library reads it at context creation): the top-k column is the whole call's time less
   * that (what the top-k adds; with programmatic dependent launch its start overlaps the
   * scoring's tail, so that is a little less than the top-k kernels' own time). On the verify and
   * prefill rows (issue 32's cases), or every row with
   * --select-stages (each decode row then fills its caches twice). */
  qsakv_context* scoring = NULL;
  if (case_mask != 0) {
    const char* was = getenv("QSAKV_SELECT_STAGES");
    char* keep = was ? strdup(was) : NULL;
    setenv("QSAKV_SELECT_STAGES", "score", 1);
    qsakv_context_options so;
    CHECK(qsakv_context_options_init(&so));
    so.backend = QSAKV_BACKEND_CUDA;
    CHECK(qsakv_context_create(&scoring, &so));
    if (keep)
      setenv("QSAKV_SELECT_STAGES", keep, 1);
    else
      unsetenv("QSAKV_SELECT_STAGES");
    free(keep);
  }
  const int n_cases = (int)(sizeof cases / sizeof cases[0]);
  printf(
      "\nindexer selection (%d heads x %d, top-%d of the visible compressed keys), E4M3 "
      "attention of the\n"
      "same row count from the table above (32K contexts; nan where that row count is not in "
      "it)\n",
      g_geo.index_heads, g_geo.index_dim, g_geo.topk_blocks);
  printf("%8s %5s %5s %7s %5s %10s %9s %7s %11s %9s %7s %9s %10s %10s %10s %10s %9s %10s\n", "kind",
         "reqs", "rows", "context", "keys", "key MB", "sel us", "GB/s", "sel us L2f", "GB/s",
         "%copy", "TFLOP/s", "attn us", "sel+attn", "score L2f", "top-k L2f", "score TF",
         "scores MB");
  if (js) fprintf(js, ",\n  \"select\": [\n");
  int printed = 0;
  for (int ci = 0; ci < 2 * n_cases; ++ci) {
    const int i = ci / 2, fp8_keys = ci % 2;
    if (!((case_mask >> i) & 1) || !((select_keys >> fp8_keys) & 1)) continue;
    const sel_case* c = &cases[i];
    const int rows = c->requests * c->rows_per_request;
    const qsakv_dtype keys = fp8_keys ? QSAKV_DTYPE_E4M3 : QSAKV_DTYPE_FP16;
    select_timing t = time_select(hw, c->requests, c->rows_per_request, c->seq, keys, 0, s);
    if (select_stages || strcmp(c->kind, "decode") != 0)
      t.score_us_flushed =
          time_select(scoring, c->requests, c->rows_per_request, c->seq, keys, 1, s).us_flushed;
    const double topk_us = t.us_flushed - t.score_us_flushed; /* NAN where not measured */
    const double score_tflops = t.flops / (t.score_us_flushed * 1e-6) / 1e12;
    const double gbs = t.key_bytes / (t.us * 1e-6) / 1e9,
                 gbs_f = t.key_bytes / (t.us_flushed * 1e-6) / 1e9;
    const double tflops = t.flops / (t.us_flushed * 1e-6) / 1e12;
    const double att = attention_us_for(rows_list, att_us, n_rows, rows);
    char att_json[32];
    if (isnan(att))
      snprintf(att_json, sizeof att_json, "null");
    else
      snprintf(att_json, sizeof att_json, "%.3f", att);
    printf(
        "%8s %5d %5d %7d %5s %10.1f %9.2f %7.0f %11.2f %9.0f %6.1f%% %9.1f %10.2f %10.2f %10.2f "
        "%10.2f %9.1f %10.1f\n",
        c->kind, c->requests, rows, c->seq, fp8_keys ? "e4m3" : "fp16", t.key_bytes / 1e6, t.us,
        gbs, t.us_flushed, gbs_f, 100.0 * gbs_f / copy_gbs, tflops, att, t.us_flushed + att,
        t.score_us_flushed, topk_us, score_tflops, t.score_bytes / 1e6);
    char score_json[96];
    if (isnan(t.score_us_flushed))
      snprintf(score_json, sizeof score_json, "null, \"score_tflops\": null");
    else
      snprintf(score_json, sizeof score_json, "%.3f, \"score_tflops\": %.2f", t.score_us_flushed,
               score_tflops);
    if (js)
      fprintf(js,
              "%s    {\"kind\": \"%s\", \"requests\": %d, \"rows\": %d, \"tokens\": %d, "
              "\"index_keys\": \"%s\", \"key_bytes\": %.0f, "
              "\"us\": %.3f, \"us_l2_flushed\": %.3f, \"gbs_l2_flushed\": %.1f, \"tflops\": %.2f, "
              "\"attention_us\": %s, \"score_bytes\": %.0f, \"score_us_l2_flushed\": %s}",
              printed++ ? ",\n" : "", c->kind, c->requests, rows, c->seq,
              fp8_keys ? "e4m3" : "fp16", t.key_bytes, t.us, t.us_flushed, gbs_f, tflops, att_json,
              t.score_bytes, score_json);
  }
  if (js) fprintf(js, "\n  ]");
  if (scoring) qsakv_context_destroy(scoring);
  return finish_run(js, s, sw, hw);
}
