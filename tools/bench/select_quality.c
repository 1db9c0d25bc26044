/* qsakv_select_quality: what E4M3 index keys change in the selection and in the attention
 * it feeds, measured on the CPU backend (the reference every GPU tier is held to; no GPU
 * needed). For each key distribution and context, the same FP16 compressed keys are
 * stored once with FP16 index keys and once with E4M3 index keys (one FP32 scale per key)
 * and every row is selected with the same index queries; then
 *   recall = |top-512 blocks (E4M3 keys) & top-512 blocks (FP16 keys)| / 512 per row
 *   attention change = relative L2 of attention(E4M3-key list) against attention(FP16-key
 *                      list), both over the same FP16 K/V cache (only the list differs).
 * Usage: qsakv_select_quality [--contexts 32768,131072] [--requests N] [--rows N]
 *        [--seed S] */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qsakv.h"

#define CHECK(x)                                                                      \
  do {                                                                                \
    const qsakv_status st_ = (x);                                                     \
    if (st_ != QSAKV_SUCCESS) {                                                       \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, qsakv_last_error()); \
      exit(1);                                                                        \
    }                                                                                 \
  } while (0)

static uint64_t rng = 0x243F6A8885A308D3ull;
static double uniform(void) { /* [0, 1) */
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (double)(rng >> 11) / 9007199254740992.0;
}
static double normal(void) {
  const double u = uniform() + 1e-300, v = uniform();
  return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}
static uint16_t fp16(float x) { /* round to nearest even, finite inputs in FP16 range */
  uint32_t u;
  memcpy(&u, &x, 4);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const float a = fabsf(x);
  if (a >= 65520.0f) return (uint16_t)(sign | 0x7BFFu);
  if (a < 6.103515625e-05f) /* subnormal: multiples of 2^-24 */
    return (uint16_t)(sign | (uint32_t)lrintf(a * 16777216.0f));
  uint32_t m = u & 0x7FFFFFFFu;
  const uint32_t rest = m & 0x1FFFu, half = 0x1000u;
  m >>= 13;
  if (rest > half || (rest == half && (m & 1u))) ++m;
  return (uint16_t)(sign | (m - ((127 - 15) << 10)));
}
static float fp16_value(uint16_t h) {
  const int e = (h >> 10) & 0x1F, m = h & 0x3FF;
  const float v = e ? ldexpf(1.0f + m / 1024.0f, e - 15) : ldexpf((float)m, -24);
  return (h & 0x8000) ? -v : v;
}

enum { kDim = 128, kHeads = 4, kBlock = 64, kRatio = 4, kTopBlocks = 512 };

typedef enum { DIST_GAUSS, DIST_OUTLIERS, DIST_MAGNITUDES, DIST_PEAKED, DIST_COUNT } dist;
static const char* kDistName[DIST_COUNT] = {"gaussian", "outlier channels", "key magnitudes",
                                            "peaked queries"};

/* One compressed key of the distribution. */
static void make_key(dist d, uint16_t* k) {
  const double mag = d == DIST_MAGNITUDES ? pow(10.0, 2.0 * uniform() - 1.0) : 1.0;
  for (int i = 0; i < kDim; ++i) {
    /* Outlier channels: 4 of 128 channels 30x the others, as activation outliers are. */
    const double ch = d == DIST_OUTLIERS && (i % 32) == 7 ? 30.0 : 1.0;
    k[i] = fp16((float)(mag * ch * normal()));
  }
}

typedef struct {
  qsakv_cache* cache;
  qsakv_plan* plan;
} side;

static void make_side(side* s, qsakv_context* ctx, const qsakv_model_config* c0, qsakv_dtype keys,
                      int64_t blocks, const qsakv_batch* b) {
  qsakv_model_config c = *c0;
  c.index_key_dtype = keys;
  qsakv_cache_options o;
  CHECK(qsakv_cache_options_init(&o));
  o.num_blocks = blocks;
  CHECK(qsakv_cache_create(&s->cache, ctx, &c, NULL, &o));
  qsakv_plan_options po;
  CHECK(qsakv_plan_options_init(&po));
  po.max_rows = c.max_batched_tokens;
  CHECK(qsakv_plan_create(&s->plan, s->cache, &po));
  CHECK(qsakv_plan_update(s->plan, b, NULL));
}

static int parse_list(char* s, int* out, int max) {
  int n = 0;
  for (char* t = strtok(s, ","); t && n < max; t = strtok(NULL, ",")) out[n++] = atoi(t);
  return n;
}

int main(int argc, char** argv) {
  int contexts[8] = {32768, 131072}, n_contexts = 2, requests = 4, rows_per_request = 8;
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--contexts") && i + 1 < argc)
      n_contexts = parse_list(argv[++i], contexts, 8);
    else if (!strcmp(argv[i], "--requests") && i + 1 < argc)
      requests = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--rows") && i + 1 < argc)
      rows_per_request = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--seed") && i + 1 < argc)
      rng = strtoull(argv[++i], NULL, 0) | 1u;
    else {
      fprintf(stderr, "usage: %s [--contexts 32768,131072] [--requests N] [--rows N] [--seed S]\n",
              argv[0]);
      return 2;
    }
  }
  if (n_contexts < 1 || requests < 1 || rows_per_request < 1) {
    fprintf(stderr, "contexts, requests and rows must be positive\n");
    return 2;
  }
  qsakv_context_options co;
  CHECK(qsakv_context_options_init(&co));
  co.backend = QSAKV_BACKEND_CPU;
  qsakv_context* ctx;
  CHECK(qsakv_context_create(&ctx, &co));
  printf(
      "E4M3 index keys against FP16 index keys, CPU backend (the reference); %d requests x %d "
      "rows at the last positions;\nrecall of each row's top-%d blocks; lost rank: the mean "
      "(best) FP16-key rank of the blocks the E4M3-key list lost;\nattention change: relative L2 "
      "of the attention output (6 heads x 256, N(0,1) FP16 K/V and queries) over the two lists\n",
      requests, rows_per_request, kTopBlocks);
  printf("%-18s %8s %12s %12s %12s %12s %14s %14s\n", "keys", "context", "recall mean",
         "recall worst", "lost rank", "best lost", "attn rel L2", "attn worst row");
  for (int ci = 0; ci < n_contexts; ++ci) {
    const int L = contexts[ci], pages = (L + kBlock - 1) / kBlock,
              rows = requests * rows_per_request;
    qsakv_model_config c;
    CHECK(qsakv_model_config_preset(&c, "qwen4_exp"));
    c.tp_size = 4; /* 6 query heads, 1 KV head on this rank */
    c.num_layers = 4;
    c.num_qsa_layers = 1;
    c.qsa_layers[0] = 3;
    c.kv_dtype = QSAKV_DTYPE_FP16;
    c.max_requests = requests;
    c.max_batched_tokens = rows;
    c.max_model_len = L;
    int32_t* bt = malloc(sizeof(int32_t) * (size_t)requests * pages);
    int32_t* qs = malloc(sizeof(int32_t) * (size_t)(requests + 1));
    int32_t* lens = malloc(sizeof(int32_t) * (size_t)requests);
    for (int r = 0; r < requests; ++r) {
      for (int p = 0; p < pages; ++p) bt[(size_t)r * pages + p] = r * pages + p;
      qs[r] = r * rows_per_request;
      lens[r] = L;
    }
    qs[requests] = rows;
    qsakv_batch b = QSAKV_BATCH_INIT;
    b.num_requests = requests;
    b.query_start = qs;
    b.seq_lens = lens;
    b.block_table = bt;
    b.block_table_stride = pages;
    side f16, e8;
    make_side(&f16, ctx, &c, QSAKV_DTYPE_FP16, (int64_t)requests * pages, &b);
    make_side(&e8, ctx, &c, QSAKV_DTYPE_E4M3, (int64_t)requests * pages, &b);
    /* K/V: N(0,1) FP16, the same for both lists (the attention runs on the FP16-key side). */
    const int64_t tokens = (int64_t)requests * L, kv_row = 256;
    {
      uint16_t* kv = malloc(2 * 2 * (size_t)tokens * kv_row);
      int64_t* slots = malloc(sizeof(int64_t) * (size_t)tokens);
      for (int64_t i = 0; i < 2 * tokens * kv_row; ++i) kv[i] = fp16((float)normal());
      for (int64_t t = 0; t < tokens; ++t) slots[t] = t; /* request r's pages follow r-1's */
      CHECK(qsakv_store_kv(f16.cache, 3, kv, kv + (size_t)tokens * kv_row, slots, tokens, NULL));
      free(kv);
      free(slots);
    }
    const int64_t groups = tokens / kRatio;
    uint16_t* keys = malloc(2 * (size_t)groups * kDim);
    int64_t* cslots = malloc(sizeof(int64_t) * (size_t)groups);
    for (int64_t g = 0; g < groups; ++g) cslots[g] = g * kRatio;
    const size_t qn = (size_t)rows * kHeads * kDim, width = 2051, on = (size_t)rows * 6 * 256;
    uint16_t* iq = malloc(2 * qn);
    uint16_t* q = malloc(2 * on);
    int32_t* la = malloc(sizeof(int32_t) * rows * width);
    int32_t* lb = malloc(sizeof(int32_t) * rows * width);
    uint16_t* oa = malloc(2 * on);
    uint16_t* ob = malloc(2 * on);
    uint8_t* mark = calloc((size_t)L / kRatio + 1, 1);
    for (int d = 0; d < DIST_COUNT; ++d) {
      for (int64_t g = 0; g < groups; ++g) make_key((dist)d, keys + (size_t)g * kDim);
      CHECK(qsakv_store_compressed_keys(f16.cache, 3, keys, cslots, groups, NULL));
      CHECK(qsakv_store_compressed_keys(e8.cache, 3, keys, cslots, groups, NULL));
      for (int row = 0; row < rows; ++row) {
        const int r = row / rows_per_request;
        for (int h = 0; h < kHeads; ++h) {
          uint16_t* qq = iq + ((size_t)row * kHeads + h) * kDim;
          if (d == DIST_PEAKED) {
            /* A query near the sum of 4 of the request's keys: a clear top set. */
            double acc[kDim] = {0};
            for (int j = 0; j < 4; ++j) {
              const int64_t g = (int64_t)r * (L / kRatio) + (int64_t)(uniform() * (L / kRatio - 1));
              for (int i = 0; i < kDim; ++i) acc[i] += fp16_value(keys[(size_t)g * kDim + i]);
            }
            for (int i = 0; i < kDim; ++i) qq[i] = fp16((float)(0.25 * acc[i] + 0.5 * normal()));
          } else {
            for (int i = 0; i < kDim; ++i) qq[i] = fp16((float)normal());
          }
        }
      }
      for (size_t i = 0; i < on; ++i) q[i] = fp16((float)normal());
      CHECK(qsakv_select_topk(f16.plan, 3, iq, la, (int64_t)width, NULL));
      CHECK(qsakv_select_topk(e8.plan, 3, iq, lb, (int64_t)width, NULL));
      CHECK(qsakv_attention_run(f16.plan, 3, QSAKV_ATTENTION_SPARSE, q, la, (int64_t)width, oa,
                                NULL));
      CHECK(qsakv_attention_run(f16.plan, 3, QSAKV_ATTENTION_SPARSE, q, lb, (int64_t)width, ob,
                                NULL));
      double recall_sum = 0, recall_worst = 1, num = 0, den = 0, worst_row = 0, rank_sum = 0;
      int missed = 0, best_missed = kTopBlocks + 1;
      for (int row = 0; row < rows; ++row) {
        const int32_t* a = la + (size_t)row * width;
        const int32_t* bb = lb + (size_t)row * width;
        for (int j = 0; j < kTopBlocks; ++j) mark[bb[j * kRatio] / kRatio] = 1;
        int common = 0;
        for (int j = 0; j < kTopBlocks; ++j) {
          /* A block of the FP16-key list that the E4M3-key list lost: its FP16 rank. */
          if (mark[a[j * kRatio] / kRatio]) {
            ++common;
          } else {
            rank_sum += j + 1;
            ++missed;
            if (j + 1 < best_missed) best_missed = j + 1;
          }
        }
        for (int j = 0; j < kTopBlocks; ++j) mark[bb[j * kRatio] / kRatio] = 0;
        const double recall = (double)common / kTopBlocks;
        recall_sum += recall;
        if (recall < recall_worst) recall_worst = recall;
        double rn = 0, rd = 0;
        for (size_t i = (size_t)row * 6 * 256; i < (size_t)(row + 1) * 6 * 256; ++i) {
          const double x = fp16_value(oa[i]), y = fp16_value(ob[i]);
          rn += (x - y) * (x - y);
          rd += x * x;
        }
        num += rn;
        den += rd;
        if (sqrt(rn / rd) > worst_row) worst_row = sqrt(rn / rd);
      }
      printf("%-18s %8d %12.4f %12.4f %12.0f %12d %14.3e %14.3e\n", kDistName[d], L,
             recall_sum / rows, recall_worst, missed ? rank_sum / missed : 0.0,
             missed ? best_missed : 0, sqrt(num / den), worst_row);
      fflush(stdout);
    }
    free(mark);
    free(keys);
    free(cslots);
    free(iq);
    free(q);
    free(la);
    free(lb);
    free(oa);
    free(ob);
    qsakv_plan_destroy(f16.plan);
    qsakv_plan_destroy(e8.plan);
    qsakv_cache_destroy(f16.cache);
    qsakv_cache_destroy(e8.cache);
    free(bt);
    free(qs);
    free(lens);
  }
  qsakv_context_destroy(ctx);
  return 0;
}
