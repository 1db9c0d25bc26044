// SPDX-License-Identifier: Apache-2.0
/* The main job end to end through the public API: on the GPU when there is one, on the
 * CPU reference backend otherwise.
 *   1. context (AUTO) and the capacity table for the reference model at TP4;
 *   2. a synthetic checkpoint directory; calibration through the library's calibration
 *      API (qsakv_calib_*): each of the 4 TP ranks observes its own synthetic K/V of
 *      every QSA layer, saves its statistics, the ranks are merged and the scales
 *      (max |x| / 448, rounded up) written as an overlay bound to that checkpoint, which
 *      is loaded and validated against its revision (fail closed);
 *   3. E4M3 and FP16 caches for the reference geometry (TP4 rank 0, fewer blocks);
 *   4. store K/V, store compressed index keys, select top-k, attend (a mixed batch of
 *      decode, verify and prefill rows), and the E4M3-vs-FP16 output error.
 * Usage: qsakv_demo [--keep]   (--keep keeps the working directory; it is always printed) */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "qsakv.h"

#define CHECK(call)                                                            \
  do {                                                                         \
    qsakv_status s_ = (call);                                                  \
    if (s_ != QSAKV_SUCCESS) {                                                 \
      fprintf(stderr, "%s:%d: %s failed: %s: %s\n", __FILE__, __LINE__, #call, \
              qsakv_status_string(s_), qsakv_last_error());                    \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

static uint64_t rng = 0x1234567ull;
static double uniform01(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (double)(rng >> 11) * (1.0 / 9007199254740992.0);
}
static double normal(void) {
  double u1 = uniform01() + 1e-300, u2 = uniform01();
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

static uint16_t f32_to_fp16(float x) {
  _Float16 h = (_Float16)x;
  uint16_t u;
  memcpy(&u, &h, 2);
  return u;
}
static float fp16_to_f32(uint16_t u) {
  _Float16 h;
  memcpy(&h, &u, 2);
  return (float)h;
}

static void* dev_copy(qsakv_context* ctx, const void* src, size_t bytes) {
  void* d = NULL;
  CHECK(qsakv_malloc(ctx, &d, bytes));
  CHECK(qsakv_memcpy(ctx, d, src, bytes, QSAKV_COPY_HOST_TO_DEVICE, NULL));
  return d;
}

static void print_capacity(const qsakv_model_config* base) {
  qsakv_model_config c = *base;
  const uint64_t budget = 40ull << 30;
  qsakv_capacity e, f;
  memset(&e, 0, sizeof e);
  e.struct_size = sizeof e;
  f = e;
  c.kv_dtype = QSAKV_DTYPE_E4M3;
  CHECK(qsakv_capacity_plan(&c, budget, &e));
  c.kv_dtype = QSAKV_DTYPE_FP16;
  CHECK(qsakv_capacity_plan(&c, budget, &f));
  printf("\nCapacity, reference model (qwen4_exp) at TP%d, 40 GiB per rank:\n", c.tp_size);
  printf("  %-6s %12s %14s %12s %14s\n", "cache", "B/token", "main B/token", "tokens",
         "top-k (MiB)");
  printf("  %-6s %12llu %14llu %12lld %14.1f\n", "fp16", (unsigned long long)f.bytes_per_token,
         (unsigned long long)f.main_bytes_per_token, (long long)f.num_tokens,
         f.topk_bytes / 1048576.0);
  printf("  %-6s %12llu %14llu %12lld %14.1f\n", "e4m3", (unsigned long long)e.bytes_per_token,
         (unsigned long long)e.main_bytes_per_token, (long long)e.num_tokens,
         e.topk_bytes / 1048576.0);
  printf(
      "  capacity ratio %.3fx (ideal %.3fx); one shared top-k buffer instead of %d saves %.1f "
      "MiB\n",
      e.capacity_ratio, e.ideal_ratio, c.num_qsa_layers,
      (e.topk_bytes_unshared - e.topk_bytes) / 1048576.0);
  printf(
      "  columns, per rank and per token over all %d QSA layers:\n"
      "    B/token       what one token costs: main K/V plus its compressed index key\n"
      "                  (%llu B of FP16 index keys, the same for both caches)\n"
      "    main B/token  the K and V part alone, the part E4M3 halves\n"
      "    tokens        tokens that fit in the 40 GiB after the fixed costs\n"
      "    top-k (MiB)   the top-k index workspace, int32 [%d batched tokens, %d], one\n"
      "                  buffer shared by every layer (a fixed cost, not per token)\n",
      c.num_qsa_layers, (unsigned long long)e.compressed_bytes_per_token, c.max_batched_tokens,
      c.topk_tokens + c.compress_ratio - 1);
}

/* One cache + pipeline run for a kv dtype; returns the attention output (host FP16). */
typedef struct {
  int requests, rows;
  int32_t qs[8], lens[8];
  int bt_stride;
  int32_t* bt;
  int64_t num_blocks;
  uint16_t *k, *v, *q, *iq, *ck; /* host data: K/V per request concatenated */
  int64_t* slots;
  int64_t* cslots;
  int total_tokens, groups;
} batch_data;

static uint16_t* run_pipeline(qsakv_context* ctx, const qsakv_model_config* cfg,
                              const qsakv_overlay* ov, const batch_data* b, double* ms) {
  qsakv_rank_geometry g;
  memset(&g, 0, sizeof g);
  g.struct_size = sizeof g;
  CHECK(qsakv_model_config_rank_geometry(cfg, &g));
  qsakv_cache_options co;
  CHECK(qsakv_cache_options_init(&co));
  co.num_blocks = b->num_blocks;
  qsakv_cache* cache = NULL;
  CHECK(qsakv_cache_create(&cache, ctx, cfg, ov, &co));
  const int layer = cfg->qsa_layers[0];
  const size_t kvb = (size_t)b->total_tokens * g.kv_heads * cfg->head_dim * 2;
  void* dk = dev_copy(ctx, b->k, kvb);
  void* dv = dev_copy(ctx, b->v, kvb);
  void* ds = dev_copy(ctx, b->slots, sizeof(int64_t) * b->total_tokens);
  void* dck = dev_copy(ctx, b->ck, (size_t)b->groups * cfg->index_head_dim * 2);
  void* dcs = dev_copy(ctx, b->cslots, sizeof(int64_t) * b->groups);
  void* dbt = dev_copy(ctx, b->bt, sizeof(int32_t) * b->requests * b->bt_stride);
  void* dq = dev_copy(ctx, b->q, (size_t)b->rows * g.q_heads * cfg->head_dim * 2);
  void* diq =
      dev_copy(ctx, b->iq, (size_t)b->rows * cfg->index_num_heads * cfg->index_head_dim * 2);
  void* dout = NULL;
  const size_t out_bytes = (size_t)b->rows * g.q_heads * cfg->head_dim * 2;
  CHECK(qsakv_malloc(ctx, &dout, out_bytes));

  qsakv_plan_options po;
  CHECK(qsakv_plan_options_init(&po));
  po.max_rows = b->rows;
  qsakv_plan* plan = NULL;
  CHECK(qsakv_plan_create(&plan, cache, &po));
  qsakv_batch batch;
  memset(&batch, 0, sizeof batch);
  batch.struct_size = sizeof batch;
  batch.version = QSAKV_BATCH_VERSION;
  batch.num_requests = b->requests;
  batch.query_start = b->qs;
  batch.seq_lens = b->lens;
  batch.block_table = dbt;
  batch.block_table_stride = b->bt_stride;

  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  CHECK(qsakv_store_kv(cache, layer, dk, dv, ds, b->total_tokens, NULL));
  CHECK(qsakv_store_compressed_keys(cache, layer, dck, dcs, b->groups, NULL));
  CHECK(qsakv_plan_update(plan, &batch, NULL));
  CHECK(qsakv_select_topk(plan, layer, diq, NULL, 0, NULL));
  CHECK(qsakv_attention_run(plan, layer, QSAKV_ATTENTION_SPARSE, dq, NULL, 0, dout, NULL));
  CHECK(qsakv_stream_synchronize(ctx, NULL));
  clock_gettime(CLOCK_MONOTONIC, &t1);
  *ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;

  uint16_t* out = malloc(out_bytes);
  CHECK(qsakv_memcpy(ctx, out, dout, out_bytes, QSAKV_COPY_DEVICE_TO_HOST, NULL));
  CHECK(qsakv_stream_synchronize(ctx, NULL));
  void* bufs[] = {dk, dv, ds, dck, dcs, dbt, dq, diq, dout};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; ++i) qsakv_free(ctx, bufs[i]);
  qsakv_plan_destroy(plan);
  qsakv_cache_destroy(cache);
  return out;
}

/* Synthetic K and V rows of one rank: channel-dependent K magnitudes, as real K has. */
static void synth_kv(uint16_t* k, uint16_t* v, size_t tokens, int row_elems) {
  for (size_t t = 0; t < tokens; ++t)
    for (int e = 0; e < row_elems; ++e) {
      k[t * row_elems + e] = f32_to_fp16((float)(normal() * (0.5 + 3.0 * (e % 17 == 0))));
      v[t * row_elems + e] = f32_to_fp16((float)(normal() * 0.8));
    }
}

/* Calibration through the library's calibration API, as a TP4 deployment runs it: each
 * rank (here: one live handle per rank on this one context) observes the K and V of
 * every QSA layer on its stream and saves its statistics; the rank files are merged as
 * the ranks of one run, summarised, and the overlay (scale pack) written from them,
 * bound to the checkpoint index. Rank 0 observes the K/V this demo stores later, the
 * other ranks synthetic traffic of the same kind. Returns the merged statistics. */
static qsakv_calib* calibrate(qsakv_context* ctx, const qsakv_model_config* cfg,
                              const batch_data* b, int row_elems, const char* dir) {
  enum { MAX_RANKS = 8 };
  qsakv_calib* ranks[MAX_RANKS];
  char path[400];
  snprintf(path, sizeof path, "%s/calib", dir);
  if (mkdir(path, 0755) != 0) perror("mkdir"), exit(1);
  printf("\nCalibration (qsakv_calib_*), TP%d: every rank observes the K/V of all %d QSA layers\n",
         cfg->tp_size, cfg->num_qsa_layers);
  for (int r = 0; r < cfg->tp_size && r < MAX_RANKS; ++r) {
    qsakv_model_config rank_cfg = *cfg;
    rank_cfg.tp_rank = r;
    const size_t tokens = r == 0 ? (size_t)b->total_tokens : 2048;
    uint16_t* k = b->k;
    uint16_t* v = b->v;
    if (r != 0) {
      k = malloc(2 * tokens * row_elems);
      v = malloc(2 * tokens * row_elems);
      synth_kv(k, v, tokens, row_elems);
    }
    void* dk = dev_copy(ctx, k, 2 * tokens * row_elems);
    void* dv = dev_copy(ctx, v, 2 * tokens * row_elems);
    qsakv_calib* live = NULL;
    CHECK(qsakv_calib_create(&live, ctx, &rank_cfg));
    CHECK(qsakv_calib_start(live));
    for (int i = 0; i < cfg->num_qsa_layers; ++i)
      CHECK(qsakv_calib_observe(live, cfg->qsa_layers[i], dk, dv, (int64_t)tokens, NULL));
    CHECK(qsakv_calib_stop(live));
    qsakv_calib* host = NULL;
    CHECK(qsakv_calib_snapshot(&host, live, NULL)); /* waits for the observes */
    snprintf(path, sizeof path, "%s/calib/rank%d.safetensors", dir, r);
    CHECK(qsakv_calib_save(host, path));
    qsakv_calib_destroy(host);
    qsakv_calib_destroy(live);
    qsakv_free(ctx, dk);
    qsakv_free(ctx, dv);
    if (r != 0) free(k), free(v);
    /* As an offline step would: from the files. */
    CHECK(qsakv_calib_load(&ranks[r], path));
    printf("  rank %d: %zu tokens per layer -> %s\n", r, tokens, path);
  }
  qsakv_calib* merged = NULL;
  CHECK(qsakv_calib_merge(&merged, (const qsakv_calib* const*)ranks, cfg->tp_size,
                          QSAKV_CALIB_MERGE_RANKS));
  for (int r = 0; r < cfg->tp_size; ++r) qsakv_calib_destroy(ranks[r]);
  for (int kind = 0; kind < 2; ++kind) {
    qsakv_calib_summary sum;
    memset(&sum, 0, sizeof sum);
    sum.struct_size = sizeof sum;
    sum.version = QSAKV_CALIB_SUMMARY_VERSION;
    CHECK(qsakv_calib_summarize(merged, cfg->qsa_layers[0], (qsakv_calib_kind)kind, &sum));
    printf(
        "  merged, layer %d %s: max |x| %.5g -> scale %.6g (max / 448 rounded up), "
        "p99.9 %.4g, saturating %.3g\n",
        cfg->qsa_layers[0], kind ? "V" : "K", (double)sum.max_abs, (double)sum.scale,
        (double)sum.p99_9, sum.saturate_fraction);
  }
  return merged;
}

static const char kDemoUsage[] =
    "usage: qsakv_demo [--keep]\n"
    "Runs the whole pipeline on synthetic data (GPU if present, else the CPU backend).\n"
    "  --keep   keep the working directory (checkpoint index, calibration statistics,\n"
    "           scale pack) instead of removing it at exit; it is printed either way\n";

int main(int argc, char** argv) {
  int keep = 0;
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--keep")) {
      keep = 1;
    } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      fputs(kDemoUsage, stdout);
      return 0;
    } else {
      fprintf(stderr, "qsakv_demo: unknown argument %s\n%s", argv[i], kDemoUsage);
      return 2;
    }
  }
  printf("libqsakv %s (ABI %d), built %s CUDA\n", qsakv_version_string(), qsakv_abi_version(),
         qsakv_built_with_cuda() ? "with" : "without");
  qsakv_context* ctx = NULL;
  CHECK(qsakv_context_create(&ctx, NULL));
  qsakv_context_info info;
  memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  CHECK(qsakv_context_get_info(ctx, &info));
  if (info.backend == QSAKV_BACKEND_CUDA)
    printf("backend: CUDA on %s (SM %d, %d SMs), %s E4M3 decoder\n", info.device_name,
           info.sm_version, info.multiprocessor_count,
           info.decoder == QSAKV_DECODER_HARDWARE ? "hardware" : "software");
  else
    printf("backend: CPU reference (%s)\n",
           info.fallback_reason[0] ? info.fallback_reason : "asked for");

  /* The working directory: a synthetic checkpoint, calibration statistics, the overlay. */
  char dir[] = "/tmp/qsakv-demo-XXXXXX";
  if (!mkdtemp(dir)) return perror("mkdtemp"), 1;
  printf("working directory: %s (%s)\n", dir,
         keep ? "kept at exit: --keep" : "removed at exit; --keep keeps it");

  qsakv_model_config cfg;
  CHECK(qsakv_model_config_preset(&cfg, "qwen4_exp"));
  cfg.tp_size = 4; /* rank 0 of TP4: 6 query heads, 1 KV head */
  print_capacity(&cfg);
  cfg.max_batched_tokens = 64; /* this demo's batches are small */
  cfg.max_requests = 8;
  cfg.max_model_len = 8192;

  /* A mixed batch: 1 decode row at 6000 tokens, 4 verify rows at 3000, a 24-row prefill
   * chunk at 24, a 3-token request. */
  batch_data b;
  memset(&b, 0, sizeof b);
  b.requests = 4;
  const int rows[4] = {1, 4, 24, 1}, lens[4] = {6000, 3000, 24, 3};
  qsakv_rank_geometry g;
  memset(&g, 0, sizeof g);
  g.struct_size = sizeof g;
  CHECK(qsakv_model_config_rank_geometry(&cfg, &g));
  const int bs = cfg.block_size, D = cfg.head_dim, row_elems = g.kv_heads * D;
  b.bt_stride = 0;
  for (int r = 0; r < 4; ++r) {
    b.qs[r + 1] = b.qs[r] + rows[r];
    b.lens[r] = lens[r];
    b.total_tokens += lens[r];
    b.groups += lens[r] / 4;
    const int pages = (lens[r] + bs - 1) / bs;
    if (pages > b.bt_stride) b.bt_stride = pages;
    b.num_blocks += pages;
  }
  b.rows = b.qs[4];
  b.bt = malloc(sizeof(int32_t) * 4 * b.bt_stride);
  b.k = malloc(2 * (size_t)b.total_tokens * row_elems);
  b.v = malloc(2 * (size_t)b.total_tokens * row_elems);
  b.slots = malloc(sizeof(int64_t) * b.total_tokens);
  b.ck = malloc(2 * (size_t)b.groups * cfg.index_head_dim);
  b.cslots = malloc(sizeof(int64_t) * b.groups);
  /* Blocks handed out in reverse order: pages are not contiguous. */
  int next = (int)b.num_blocks - 1, tok = 0, grp = 0;
  for (int r = 0; r < 4; ++r) {
    for (int p = 0; p < b.bt_stride; ++p)
      b.bt[r * b.bt_stride + p] = p * bs < lens[r] ? next-- : -1;
    for (int t = 0; t < lens[r]; ++t, ++tok) {
      b.slots[tok] = (int64_t)b.bt[r * b.bt_stride + t / bs] * bs + t % bs;
      for (int e = 0; e < row_elems; ++e) {
        /* Channel-dependent magnitudes, as real K/V have. */
        const float kx = (float)(normal() * (0.5 + 3.0 * (e % 17 == 0)));
        const float vx = (float)(normal() * 0.8);
        b.k[(size_t)tok * row_elems + e] = f32_to_fp16(kx);
        b.v[(size_t)tok * row_elems + e] = f32_to_fp16(vx);
      }
      if (t % 4 == 3) {
        b.cslots[grp] = b.slots[tok];
        for (int d = 0; d < cfg.index_head_dim; ++d)
          b.ck[(size_t)grp * cfg.index_head_dim + d] = f32_to_fp16((float)normal());
        ++grp;
      }
    }
  }
  b.q = malloc(2 * (size_t)b.rows * g.q_heads * D);
  for (size_t i = 0; i < (size_t)b.rows * g.q_heads * D; ++i) b.q[i] = f32_to_fp16((float)normal());
  b.iq = malloc(2 * (size_t)b.rows * cfg.index_num_heads * cfg.index_head_dim);
  for (size_t i = 0; i < (size_t)b.rows * cfg.index_num_heads * cfg.index_head_dim; ++i)
    b.iq[i] = f32_to_fp16((float)normal());

  /* A synthetic checkpoint (its index is what an overlay is bound to), calibrated. */
  char index[256], pack[256], scale_file[300];
  snprintf(index, sizeof index, "%s/model.safetensors.index.json", dir);
  FILE* f = fopen(index, "w");
  fprintf(f,
          "{\"metadata\": {\"total_size\": 1024}, \"weight_map\": "
          "{\"model.embed_tokens.weight\": \"model-00001-of-00001.safetensors\"}}\n");
  fclose(f);
  qsakv_calib* stats = calibrate(ctx, &cfg, &b, row_elems, dir);
  snprintf(pack, sizeof pack, "%s/kvscales", dir);
  qsakv_overlay_write_options wo;
  CHECK(qsakv_overlay_write_options_init(&wo));
  wo.base_index_path = index;
  wo.contract_tp_size = 4;
  wo.contract_speculative_tokens = 0;
  wo.contract_activation_dtype = QSAKV_DTYPE_FP16;
  CHECK(qsakv_calib_write_overlay(stats, pack, &wo));
  qsakv_calib_destroy(stats);
  printf("  scale pack written from the merged statistics: %s\n", pack);
  snprintf(scale_file, sizeof scale_file, "%s/model-kvscales.safetensors", pack);
  char revision[65];
  CHECK(qsakv_checkpoint_revision(dir, revision));
  qsakv_overlay* ov = NULL;
  CHECK(qsakv_overlay_load(&ov, scale_file, NULL));
  float ks = 0, vs = 0;
  CHECK(qsakv_overlay_get_scales(ov, cfg.qsa_layers[0], &ks, &vs));
  printf("\nOverlay: %d layers, layer %d k_scale %.6g, v_scale %.6g, bound to revision %.16s...\n",
         cfg.num_qsa_layers, cfg.qsa_layers[0], (double)ks, (double)vs, revision);
  /* Fail closed: a wrong revision is refused before anything is allocated. */
  char wrong[65];
  memcpy(wrong, revision, 65);
  wrong[0] = wrong[0] == '0' ? '1' : '0';
  qsakv_status s = qsakv_overlay_validate(ov, &cfg, wrong);
  printf("  validate against another revision: %s\n    %s\n", qsakv_status_string(s),
         qsakv_last_error());
  CHECK(qsakv_overlay_validate(ov, &cfg, revision));
  printf("  validate against the checkpoint's revision: QSAKV_SUCCESS\n");

  double ms_e4m3, ms_fp16;
  uint16_t* out8 = run_pipeline(ctx, &cfg, ov, &b, &ms_e4m3);
  qsakv_model_config cfg16 = cfg;
  cfg16.kv_dtype = QSAKV_DTYPE_FP16;
  uint16_t* out16 = run_pipeline(ctx, &cfg16, NULL, &b, &ms_fp16);
  double num = 0, den = 0;
  const size_t n = (size_t)b.rows * g.q_heads * D;
  for (size_t i = 0; i < n; ++i) {
    const double d = fp16_to_f32(out8[i]) - fp16_to_f32(out16[i]);
    num += d * d;
    den += (double)fp16_to_f32(out16[i]) * fp16_to_f32(out16[i]);
  }
  printf(
      "\nPipeline (store K/V + compressed keys, plan, select top-k, sparse attention), "
      "%d rows in %d requests, head_dim %d, %d query heads / %d KV head:\n",
      b.rows, b.requests, D, g.q_heads, g.kv_heads);
  printf("  e4m3 cache: %.1f ms   fp16 cache: %.1f ms   (wall clock of one cold run)\n", ms_e4m3,
         ms_fp16);
  if (info.backend == QSAKV_BACKEND_CUDA)
    printf(
        "  (CUDA backend, one run including launches and first-touch costs: `make bench`\n"
        "   measures kernels properly; docs/perf.md has H200 figures)\n");
  else
    printf(
        "  (CPU reference backend: these timings say nothing about GPU speed; the CPU\n"
        "   backend is the correctness oracle, not a fast path. docs/perf.md has H200 figures)\n");
  printf("  E4M3 vs FP16 attention output: relative L2 error %.3e\n", sqrt(num / den));
  if (keep) {
    printf(
        "\nkept working directory %s:\n"
        "  model.safetensors.index.json  the synthetic checkpoint's index (its revision)\n"
        "  calib/rank*.safetensors       each rank's calibration statistics\n"
        "  kvscales/                     the scale pack (model-kvscales.safetensors +\n"
        "                                qsakv-overlay.json)\n"
        "try (the qsakv tool is built beside qsakv_demo):\n"
        "     qsakv calib summarize %s/calib/rank*.safetensors\n"
        "     qsakv overlay inspect %s/kvscales\n",
        dir, dir, dir);
  } else {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
      fprintf(stderr, "could not remove %s\n", dir);
    else
      printf("\nremoved working directory %s (--keep keeps it)\n", dir);
  }
  qsakv_overlay_destroy(ov);
  qsakv_context_destroy(ctx);
  free(out8);
  free(out16);
  return 0;
}
