// SPDX-License-Identifier: Apache-2.0
/* Hostile callers and hostile files (issue 11): every public entry point with NULL
 * pointers, out-of-range and negative enums, struct_size and version garbage, extreme
 * strides, counts, offsets and lengths, calls on stopped or half-built handles, and
 * crafted files (wrapping counters, JSON bombs, non-UTF-8 paths, stale staging dirs).
 *
 * Each case runs in a forked child, so a crash or a sanitizer report (ASan and UBSan
 * abort the child) is counted as a failure of that case, not the end of the run. The
 * child reports its verdict through a pipe:
 *   refused  - a non-OK status (the expected one) whose message names the argument, and
 *              outputs left as they were (NULL *out, caches and plans unchanged);
 *   correct  - success, with the results checked;
 *   wrong    - anything else (the message says what).
 * The parent counts them and prints: tried, refused cleanly, succeeded correctly,
 * crashed, wrong. Every group fails unless crashed == wrong == 0. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "qsakv.h"
#include "testutil.h"

/* Under ASan an allocation beyond its size limit is reported as a bug unless this is set;
 * a real process gets NULL from malloc, which the library turns into OUT_OF_MEMORY. */
const char* __asan_default_options(void);
const char* __asan_default_options(void) { return "allocator_may_return_null=1"; }

/* ---------------------------------------------------------------------------------- */
/* The forked-case runner                                                              */
/* ---------------------------------------------------------------------------------- */

enum { V_REFUSED = 1, V_CORRECT = 2, V_WRONG = 3 };
#define ANY_ERROR ((qsakv_status)1) /* "any failure status" for refuse() */

struct verdict {
  int kind;
  int status;
  char detail[480];
};

struct acase {
  const char* name;
  void (*fn)(void);
  int64_t param;
};

static int g_pipe = -1;
static int64_t P; /* the running case's parameter */
static struct { int tried, refused, correct, crashed, wrong; } g_count;

/* Reports the verdict and ends the child. In the parent (building the fixture) a wrong
 * verdict fails the cmocka test instead. */
__attribute__((noreturn, format(printf, 3, 4))) static void report(int kind, qsakv_status status,
                                                                   const char* fmt, ...) {
  struct verdict v;
  memset(&v, 0, sizeof v);
  v.kind = kind;
  v.status = (int)status;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(v.detail, sizeof v.detail, fmt, ap);
  va_end(ap);
  if (g_pipe < 0) {
    fail_msg("%s", v.detail);
    abort(); /* not reached: fail_msg does not return */
  }
  const char* p = (const char*)&v;
  size_t left = sizeof v;
  while (left > 0) {
    ssize_t n = write(g_pipe, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    p += n;
    left -= (size_t)n;
  }
  _exit(0);
}

/* A refusal: `got` must be `want` (any failure for ANY_ERROR) and the thread's message
 * must name `arg`. */
__attribute__((noreturn)) static void refuse(qsakv_status got, qsakv_status want, const char* arg) {
  const char* m = qsakv_last_error();
  if (got == QSAKV_SUCCESS) report(V_WRONG, got, "succeeded; expected a refusal naming %s", arg);
  if (want != ANY_ERROR && got != want)
    report(V_WRONG, got, "returned %s, expected %s: %s", qsakv_status_string(got),
           qsakv_status_string(want), m);
  if (!strstr(m, arg)) report(V_WRONG, got, "the message does not name \"%s\": %s", arg, m);
  report(V_REFUSED, got, "%s", m);
}

/* A refusal of a call with a `T** out`: *out must be NULL afterwards. `outp` is &out,
 * read after the call (an argument `out` could be read before it). */
__attribute__((noreturn)) static void refuse_out(qsakv_status got, qsakv_status want,
                                                 const char* arg, const void* outp) {
  void* out;
  memcpy(&out, outp, sizeof out);
  if (got != QSAKV_SUCCESS && out != NULL)
    report(V_WRONG, got, "refused but left *out non-NULL (%p)", out);
  refuse(got, want, arg);
}

/* A success whose results were checked (`ok`). */
__attribute__((noreturn)) static void correct(qsakv_status got, int ok, const char* what) {
  if (got != QSAKV_SUCCESS)
    report(V_WRONG, got, "%s: returned %s: %s", what, qsakv_status_string(got), qsakv_last_error());
  if (!ok) report(V_WRONG, got, "%s: succeeded with wrong results", what);
  report(V_CORRECT, got, "%s", what);
}

/* A call that must succeed, usable in a child: cmocka's own assertions would longjmp
 * back into cmocka's runner inside the child, which would then run on as a second
 * parent. */
#define C_OK(call)                                                                        \
  do {                                                                                    \
    qsakv_status c_ok_s_ = (call);                                                        \
    if (c_ok_s_ != QSAKV_SUCCESS)                                                         \
      report(V_WRONG, c_ok_s_, "%s returned %s: %s", #call, qsakv_status_string(c_ok_s_), \
             qsakv_last_error());                                                         \
  } while (0)

static ssize_t read_full(int fd, void* buf, size_t n) {
  size_t done = 0;
  while (done < n) {
    ssize_t r = read(fd, (char*)buf + done, n - done);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    done += (size_t)r;
  }
  return (ssize_t)done;
}

static void run_cases(const char* group, const struct acase* cases, size_t n) {
  int bad = 0;
  for (size_t i = 0; i < n; ++i) {
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    fflush(stdout);
    fflush(stderr);
    const pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
      /* cmocka catches SIGSEGV and friends with a longjmp back into its runner; in the
       * child that would run the rest of the suite as a second parent. A signal must end
       * the child instead, so the parent sees it. */
      const int sigs[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT, SIGSYS};
      for (size_t k = 0; k < sizeof sigs / sizeof sigs[0]; ++k) signal(sigs[k], SIG_DFL);
      close(fds[0]);
      g_pipe = fds[1];
      P = cases[i].param;
      alarm(120); /* a hang is a failure too */
      qsakv_clear_error();
      cases[i].fn();
      report(V_WRONG, QSAKV_SUCCESS, "the case ended without a verdict");
    }
    close(fds[1]);
    struct verdict v;
    memset(&v, 0, sizeof v);
    const ssize_t got = read_full(fds[0], &v, sizeof v);
    close(fds[0]);
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    g_count.tried++;
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0 || got != (ssize_t)sizeof v) {
      g_count.crashed++;
      bad++;
      if (WIFSIGNALED(st))
        fprintf(stderr, "CRASH %s/%s: signal %d\n", group, cases[i].name, WTERMSIG(st));
      else
        fprintf(stderr, "CRASH %s/%s: exit status %d, no verdict\n", group, cases[i].name,
                WIFEXITED(st) ? WEXITSTATUS(st) : -1);
      continue;
    }
    if (v.kind == V_REFUSED) {
      g_count.refused++;
    } else if (v.kind == V_CORRECT) {
      g_count.correct++;
    } else {
      g_count.wrong++;
      bad++;
      fprintf(stderr, "WRONG %s/%s: %s\n", group, cases[i].name, v.detail);
    }
  }
  printf("[ adversarial ] %-10s %3zu cases, %d failed\n", group, n, bad);
  assert_int_equal(bad, 0);
}

#define RUN(group, table) run_cases(group, table, sizeof table / sizeof table[0])

/* ---------------------------------------------------------------------------------- */
/* The fixture: built once in the parent, inherited (copy-on-write) by every child       */
/* ---------------------------------------------------------------------------------- */

#define ROWS 4
#define MAX_ROWS 16
#define BT_STRIDE 8
#define TOPK_EXTRA 5

static struct {
  qsakv_context* ctx;
  qsakv_model_config cfg;
  qsakv_rank_geometry geo;
  qsakv_cache* cache;
  qsakv_cache_layout layout;
  qsakv_plan* plan;  /* updated with a 2-request, 4-row batch */
  qsakv_plan* fresh; /* never updated */
  int32_t* block_table;
  uint16_t* q;
  uint16_t* out;
  uint16_t* index_q;
  uint16_t* kv_in; /* [8 tokens, kv_heads, head_dim] */
  int64_t* slots;
  int32_t* topk; /* [MAX_ROWS, width + TOPK_EXTRA] */
  int64_t topk_stride;
  qsakv_calib* live;
  qsakv_calib* host;
  char dir[64];
  char base[128]; /* a base checkpoint dir (index only) */
  char index[256];
  char pack[256]; /* a scale pack for the base */
  char rev[65];
  qsakv_overlay* overlay; /* the pack, loaded, not validated */
  char stats_big[2][256]; /* tp 2 rank files with counts 2^63 */
  char stats_wrap[256];   /* histogram total wraps to the nonzero count */
} F;

static void* dev(size_t bytes) {
  void* p = NULL;
  C_OK(qsakv_malloc(F.ctx, &p, bytes));
  memset(p, 0, bytes);
  return p;
}

static void fill_random_fp16(uint16_t* p, size_t n) {
  for (size_t i = 0; i < n; ++i) p[i] = tu_f32_to_fp16((float)tu_uniform(-1.0, 1.0));
}

static void write_text(const char* path, const char* text, size_t n) {
  FILE* f = fopen(path, "wb");
  if (!f || fwrite(text, 1, n, f) != n || fclose(f) != 0)
    report(V_WRONG, QSAKV_SUCCESS, "cannot write %s: %s", path, strerror(errno));
}

static char* read_all(const char* path, size_t* n) {
  FILE* f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  *n = (size_t)ftell(f);
  fseek(f, 0, SEEK_SET);
  char* b = malloc(*n);
  assert_int_equal(fread(b, 1, *n, f), *n);
  fclose(f);
  return b;
}

static const char kIndex[] =
    "{\"metadata\": {\"total_size\": 4}, \"weight_map\": "
    "{\"model.embed_tokens.weight\": \"model-00001.safetensors\"}}\n";

/* A statistics file of a tp-2 rank, its counts then rewritten: every entry gets count,
 * finite and nonzero `n`, histogram bins `hist0` at bin 0 and `hist1` at bin 2000, and
 * max |x| 1. Each such file is consistent on its own (unless the bins wrap). */
static void crafted_stats(const char* path, int rank, uint64_t n, uint64_t hist0, uint64_t hist1) {
  qsakv_model_config c = F.cfg;
  c.tp_size = 2;
  c.tp_rank = rank;
  qsakv_calib *live = NULL, *snap = NULL;
  C_OK(qsakv_calib_create(&live, F.ctx, &c));
  C_OK(qsakv_calib_snapshot(&snap, live, NULL));
  C_OK(qsakv_calib_save(snap, path));
  qsakv_calib_destroy(snap);
  qsakv_calib_destroy(live);
  size_t size = 0;
  char* b = read_all(path, &size);
  uint64_t hl = 0;
  memcpy(&hl, b, 8);
  char* data = b + 8 + hl;
  const size_t entry_words = 3 + QSAKV_CALIB_BINS, entries = (size_t)c.num_qsa_layers * 2;
  for (size_t e = 0; e < entries; ++e) {
    uint64_t* w = (uint64_t*)(data + e * entry_words * 8);
    w[0] = w[1] = w[2] = n;
    w[3 + 0] = hist0;
    w[3 + 2000] = hist1;
    const float one = 1.0f;
    memcpy(data + entries * entry_words * 8 + e * 4, &one, 4);
  }
  unlink(path);
  write_text(path, b, size);
  free(b);
}

static void fixture_build(void) {
  memset(&F, 0, sizeof F);
  F.ctx = tu_context(QSAKV_BACKEND_CPU);
  assert_non_null(F.ctx);
  tu_small_config(&F.cfg, 4, 2, 64, QSAKV_DTYPE_FP16, QSAKV_DTYPE_FP16, 16);
  F.cfg.topk_tokens = 16;
  F.cfg.max_requests = 4;
  F.cfg.max_batched_tokens = MAX_ROWS;
  F.cfg.max_model_len = 512;
  F.geo.struct_size = sizeof F.geo;
  F.geo.version = QSAKV_RANK_GEOMETRY_VERSION;
  C_OK(qsakv_model_config_rank_geometry(&F.cfg, &F.geo));
  qsakv_cache_options co;
  C_OK(qsakv_cache_options_init(&co));
  co.num_blocks = 64;
  C_OK(qsakv_cache_create(&F.cache, F.ctx, &F.cfg, NULL, &co));
  F.layout.struct_size = sizeof F.layout;
  F.layout.version = QSAKV_CACHE_LAYOUT_VERSION;
  C_OK(qsakv_cache_get_layout(F.cache, &F.layout));
  /* Random K/V and compressed keys in every layer. */
  for (int l = 0; l < F.cfg.num_qsa_layers; ++l) {
    qsakv_layer_buffers lb = {sizeof lb, QSAKV_LAYER_BUFFERS_VERSION};
    C_OK(qsakv_cache_get_layer_buffers(F.cache, F.cfg.qsa_layers[l], &lb));
    fill_random_fp16(lb.kv, F.layout.kv_bytes_per_layer / 2);
    fill_random_fp16(lb.compressed_keys, F.layout.compressed_bytes_per_layer / 2);
  }
  qsakv_plan_options po;
  C_OK(qsakv_plan_options_init(&po));
  C_OK(qsakv_plan_create(&F.plan, F.cache, &po));
  C_OK(qsakv_plan_create(&F.fresh, F.cache, &po));
  F.block_table = dev(sizeof(int32_t) * 2 * BT_STRIDE);
  for (int i = 0; i < 2 * BT_STRIDE; ++i) F.block_table[i] = i;
  const int32_t qs[3] = {0, 1, ROWS}, lens[2] = {40, 100};
  qsakv_batch b = QSAKV_BATCH_INIT;
  b.num_requests = 2;
  b.query_start = qs;
  b.seq_lens = lens;
  b.block_table = F.block_table;
  b.block_table_stride = BT_STRIDE;
  C_OK(qsakv_plan_update(F.plan, &b, NULL));
  const size_t qn = (size_t)MAX_ROWS * F.geo.q_heads * F.cfg.head_dim;
  F.q = dev(qn * 2);
  fill_random_fp16(F.q, qn);
  F.out = dev(qn * 2);
  const size_t iqn = (size_t)MAX_ROWS * F.cfg.index_num_heads * F.cfg.index_head_dim;
  F.index_q = dev(iqn * 2);
  fill_random_fp16(F.index_q, iqn);
  F.kv_in = dev((size_t)8 * F.geo.kv_heads * F.cfg.head_dim * 2);
  fill_random_fp16(F.kv_in, (size_t)8 * F.geo.kv_heads * F.cfg.head_dim);
  F.slots = dev(sizeof(int64_t) * 8);
  for (int i = 0; i < 8; ++i) F.slots[i] = 16 + i;
  F.topk_stride = F.geo.topk_width + TOPK_EXTRA;
  F.topk = dev(sizeof(int32_t) * MAX_ROWS * (size_t)F.topk_stride);
  C_OK(qsakv_select_topk(F.plan, 3, F.index_q, NULL, 0, NULL));
  /* Calibration handles. */
  C_OK(qsakv_calib_create(&F.live, F.ctx, &F.cfg));
  C_OK(qsakv_calib_snapshot(&F.host, F.live, NULL));
  /* Files. */
  strcpy(F.dir, "/tmp/qsakv-adv-XXXXXX");
  assert_non_null(mkdtemp(F.dir));
  snprintf(F.base, sizeof F.base, "%s/base", F.dir);
  assert_int_equal(mkdir(F.base, 0755), 0);
  snprintf(F.index, sizeof F.index, "%s/model.safetensors.index.json", F.base);
  write_text(F.index, kIndex, strlen(kIndex));
  C_OK(qsakv_checkpoint_revision(F.base, F.rev));
  snprintf(F.pack, sizeof F.pack, "%s/pack", F.dir);
  qsakv_overlay_write_options wo;
  C_OK(qsakv_overlay_write_options_init(&wo));
  wo.base_index_path = F.index;
  const float ks[2] = {0.5f, 0.25f}, vs[2] = {0.125f, 1.0f};
  C_OK(qsakv_overlay_write(F.pack, F.cfg.qsa_layers, ks, vs, 2, &wo));
  C_OK(qsakv_overlay_load(&F.overlay, F.pack, NULL));
  for (int r = 0; r < 2; ++r) {
    snprintf(F.stats_big[r], sizeof F.stats_big[r], "%s/big-rank%d.safetensors", F.dir, r);
    crafted_stats(F.stats_big[r], r, UINT64_C(1) << 63, 0, UINT64_C(1) << 63);
  }
  snprintf(F.stats_wrap, sizeof F.stats_wrap, "%s/wrap.safetensors", F.dir);
  crafted_stats(F.stats_wrap, 0, 1, UINT64_MAX, 2); /* UINT64_MAX + 2 wraps to 1 */
}

static void fixture_destroy(void) {
  qsakv_overlay_destroy(F.overlay);
  qsakv_calib_destroy(F.host);
  qsakv_calib_destroy(F.live);
  void* bufs[] = {F.block_table, F.q, F.out, F.index_q, F.kv_in, F.slots, F.topk};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; ++i) qsakv_free(F.ctx, bufs[i]);
  qsakv_plan_destroy(F.fresh);
  qsakv_plan_destroy(F.plan);
  qsakv_cache_destroy(F.cache);
  qsakv_context_destroy(F.ctx);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", F.dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", F.dir);
}

/* A fresh path under the fixture's directory (unique per child). */
static const char* tmp_path(const char* name) {
  static char p[512];
  snprintf(p, sizeof p, "%s/%s-%d", F.dir, name, (int)getpid());
  return p;
}

/* ---------------------------------------------------------------------------------- */
/* Context, memory helpers, status and dtype queries                                   */
/* ---------------------------------------------------------------------------------- */

static qsakv_context_options ctx_opts(void) {
  qsakv_context_options o;
  qsakv_context_options_init(&o);
  o.backend = QSAKV_BACKEND_CPU;
  return o;
}

static void c_ctx_out_null(void) {
  refuse(qsakv_context_create(NULL, NULL), QSAKV_ERROR_INVALID_ARGUMENT, "out");
}
static void c_ctx_backend(void) {
  qsakv_context_options o = ctx_opts();
  int32_t v = (int32_t)P;
  memcpy(&o.backend, &v, sizeof v);
  qsakv_context* c = (qsakv_context*)0x1;
  refuse_out(qsakv_context_create(&c, &o), QSAKV_ERROR_INVALID_ARGUMENT, "backend", &c);
}
static void c_ctx_decoder(void) {
  qsakv_context_options o = ctx_opts();
  int32_t v = (int32_t)P;
  memcpy(&o.decoder, &v, sizeof v);
  qsakv_context* c = (qsakv_context*)0x1;
  refuse_out(qsakv_context_create(&c, &o), QSAKV_ERROR_INVALID_ARGUMENT, "decoder", &c);
}
static void c_ctx_device(void) {
  qsakv_context_options o = ctx_opts();
  o.device = (int32_t)P;
  qsakv_context* c = (qsakv_context*)0x1;
  refuse_out(qsakv_context_create(&c, &o), QSAKV_ERROR_INVALID_ARGUMENT, "device", &c);
}
static void c_ctx_struct_size(void) {
  qsakv_context_options o = ctx_opts();
  o.struct_size = (size_t)P;
  qsakv_context* c = (qsakv_context*)0x1;
  refuse_out(qsakv_context_create(&c, &o), QSAKV_ERROR_INVALID_ARGUMENT, "struct_size", &c);
}
static void c_ctx_version(void) {
  qsakv_context_options o = ctx_opts();
  o.version = (uint32_t)P;
  qsakv_context* c = (qsakv_context*)0x1;
  refuse_out(qsakv_context_create(&c, &o), QSAKV_ERROR_INVALID_ARGUMENT, "version", &c);
}
static void c_ctx_huge_struct(void) {
  /* A newer caller's larger struct: the library reads its own prefix. */
  struct {
    qsakv_context_options o;
    char future[64];
  } big;
  memset(&big, 0x7f, sizeof big);
  big.o = ctx_opts();
  big.o.struct_size = sizeof big;
  qsakv_context* c = NULL;
  qsakv_status s = qsakv_context_create(&c, &big.o);
  qsakv_context_info info = {sizeof info, QSAKV_CONTEXT_INFO_VERSION};
  const int ok = s == QSAKV_SUCCESS && qsakv_context_get_info(c, &info) == QSAKV_SUCCESS &&
                 info.backend == QSAKV_BACKEND_CPU;
  qsakv_context_destroy(c);
  correct(s, ok, "a larger struct_size reads the known prefix");
}
static void c_ctx_info_null(void) {
  refuse(qsakv_context_get_info(F.ctx, NULL), QSAKV_ERROR_INVALID_ARGUMENT, "info");
}
static void c_ctx_info_ctx_null(void) {
  qsakv_context_info info;
  memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  refuse(qsakv_context_get_info(NULL, &info), QSAKV_ERROR_INVALID_ARGUMENT, "context");
}
static void c_ctx_info_size(void) {
  qsakv_context_info info;
  memset(&info, 0xAB, sizeof info);
  info.struct_size = (size_t)P;
  qsakv_context_info before = info;
  qsakv_status s = qsakv_context_get_info(F.ctx, &info);
  if (memcmp(&before, &info, sizeof info) != 0) report(V_WRONG, s, "info was written");
  refuse(s, QSAKV_ERROR_INVALID_ARGUMENT, "struct_size");
}
static void c_ctx_info_small(void) {
  /* A short (older) output struct: only its prefix is written. */
  unsigned char buf[sizeof(qsakv_context_info) + 16];
  memset(buf, 0xCD, sizeof buf);
  qsakv_context_info* info = (qsakv_context_info*)buf;
  const size_t n = offsetof(qsakv_context_info, decoder);
  info->struct_size = n;
  info->version = QSAKV_CONTEXT_INFO_VERSION;
  qsakv_status s = qsakv_context_get_info(F.ctx, info);
  int ok = info->backend == QSAKV_BACKEND_CPU;
  for (size_t i = n; i < sizeof buf; ++i) ok &= buf[i] == 0xCD;
  correct(s, ok, "a short info struct gets its prefix only");
}
static void c_malloc_out_null(void) {
  refuse(qsakv_malloc(F.ctx, NULL, 16), QSAKV_ERROR_INVALID_ARGUMENT, "out");
}
static void c_malloc_ctx_null(void) {
  void* p = (void*)0x1;
  refuse_out(qsakv_malloc(NULL, &p, 16), QSAKV_ERROR_INVALID_ARGUMENT, "context", &p);
}
static void c_malloc_bytes(void) {
  void* p = (void*)0x1;
  qsakv_status s = qsakv_malloc(F.ctx, &p, (size_t)P);
  refuse_out(s, P == 0 ? QSAKV_ERROR_INVALID_ARGUMENT : QSAKV_ERROR_OUT_OF_MEMORY, "bytes", &p);
}
static void c_memcpy_kind(void) {
  char a[8] = "abcdefg", b[8] = {0};
  qsakv_copy_kind k;
  int32_t v = (int32_t)P;
  memcpy(&k, &v, sizeof v);
  qsakv_status s = qsakv_memcpy(F.ctx, b, a, sizeof a, k, NULL);
  if (b[0] != 0) report(V_WRONG, s, "copied despite the refusal");
  refuse(s, QSAKV_ERROR_INVALID_ARGUMENT, "kind");
}
static void c_memcpy_kind_zero_bytes(void) {
  qsakv_copy_kind k;
  int32_t v = -1;
  memcpy(&k, &v, sizeof v);
  refuse(qsakv_memcpy(F.ctx, NULL, NULL, 0, k, NULL), QSAKV_ERROR_INVALID_ARGUMENT, "kind");
}
static void c_memcpy_dst_null(void) {
  char a[4] = "abc";
  refuse(qsakv_memcpy(F.ctx, NULL, a, 4, QSAKV_COPY_HOST_TO_DEVICE, NULL),
         QSAKV_ERROR_INVALID_ARGUMENT, "dst");
}
static void c_memcpy_src_null(void) {
  char a[4];
  refuse(qsakv_memcpy(F.ctx, a, NULL, 4, QSAKV_COPY_HOST_TO_DEVICE, NULL),
         QSAKV_ERROR_INVALID_ARGUMENT, "src");
}
static void c_memcpy_bytes(void) {
  char a[4] = "abc", b[4] = {0};
  refuse(qsakv_memcpy(F.ctx, b, a, (size_t)P, QSAKV_COPY_HOST_TO_DEVICE, NULL),
         QSAKV_ERROR_INVALID_ARGUMENT, "bytes");
}
static void c_memcpy_ctx_null(void) {
  char a[4] = "abc", b[4];
  refuse(qsakv_memcpy(NULL, b, a, 4, QSAKV_COPY_HOST_TO_DEVICE, NULL), QSAKV_ERROR_INVALID_ARGUMENT,
         "context");
}
static void c_sync_ctx_null(void) {
  refuse(qsakv_stream_synchronize(NULL, NULL), QSAKV_ERROR_INVALID_ARGUMENT, "context");
}
static void c_dtype_queries(void) {
  qsakv_dtype d;
  int32_t v = (int32_t)P;
  memcpy(&d, &v, sizeof v);
  const int known = v >= 1 && v <= 6;
  const int ok =
      (qsakv_dtype_size(d) != 0) == known && (strcmp(qsakv_dtype_name(d), "invalid") != 0) == known;
  correct(QSAKV_SUCCESS, ok, "dtype_size/dtype_name of any int32");
}
static void c_status_string(void) {
  qsakv_status s;
  int32_t v = (int32_t)P;
  memcpy(&s, &v, sizeof v);
  const char* n = qsakv_status_string(s);
  correct(QSAKV_SUCCESS, n && !strcmp(n, "QSAKV_ERROR_UNKNOWN"),
          "status_string of an unknown code");
}
static void c_options_init_null(void) {
  switch (P) {
    case 0:
      refuse(qsakv_context_options_init(NULL), QSAKV_ERROR_INVALID_ARGUMENT, "options");
    case 1:
      refuse(qsakv_cache_options_init(NULL), QSAKV_ERROR_INVALID_ARGUMENT, "options");
    case 2:
      refuse(qsakv_plan_options_init(NULL), QSAKV_ERROR_INVALID_ARGUMENT, "options");
    case 3:
      refuse(qsakv_overlay_write_options_init(NULL), QSAKV_ERROR_INVALID_ARGUMENT, "options");
    case 4:
      refuse(qsakv_model_config_init(NULL), QSAKV_ERROR_INVALID_ARGUMENT, "config");
    default:
      report(V_WRONG, QSAKV_SUCCESS, "no such case");
  }
}

/* Calls without arguments to abuse: each must answer what the header says. */
static void c_no_args(void) {
  char want[32];
  snprintf(want, sizeof want, "%d.%d.%d", QSAKV_VERSION_MAJOR, QSAKV_VERSION_MINOR,
           QSAKV_VERSION_PATCH);
  const int ok = qsakv_version() == QSAKV_VERSION_NUMBER &&
                 qsakv_abi_version() == QSAKV_ABI_VERSION &&
                 !strcmp(qsakv_version_string(), want) &&
                 (qsakv_built_with_cuda() == 0 || qsakv_built_with_cuda() == 1);
  correct(QSAKV_SUCCESS, ok, "version queries match the header");
}
/* *_destroy(NULL) and qsakv_free of NULL are no-ops; clear_error empties the message. */
static void c_destroy_null(void) {
  qsakv_context_destroy(NULL);
  qsakv_overlay_destroy(NULL);
  qsakv_cache_destroy(NULL);
  qsakv_plan_destroy(NULL);
  qsakv_calib_destroy(NULL);
  qsakv_free(F.ctx, NULL);
  qsakv_free(NULL, NULL);
  qsakv_status s = qsakv_context_create(NULL, NULL);
  const int had = qsakv_last_error()[0] != 0;
  qsakv_clear_error();
  correct(QSAKV_SUCCESS, s != QSAKV_SUCCESS && had && qsakv_last_error()[0] == 0,
          "destroy(NULL) and free(NULL) are no-ops; clear_error clears");
}

static const struct acase k_context_cases[] = {
    {"version queries", c_no_args, 0},
    {"destroy NULL", c_destroy_null, 0},
    {"create out NULL", c_ctx_out_null, 0},
    {"backend -1", c_ctx_backend, -1},
    {"backend 3", c_ctx_backend, 3},
    {"backend INT32_MIN", c_ctx_backend, INT32_MIN},
    {"backend INT32_MAX", c_ctx_backend, INT32_MAX},
    {"decoder -1", c_ctx_decoder, -1},
    {"decoder 3", c_ctx_decoder, 3},
    {"decoder INT32_MIN", c_ctx_decoder, INT32_MIN},
    {"decoder INT32_MAX", c_ctx_decoder, INT32_MAX},
    {"device -1", c_ctx_device, -1},
    {"device INT32_MIN", c_ctx_device, INT32_MIN},
    {"struct_size 0", c_ctx_struct_size, 0},
    {"struct_size 1", c_ctx_struct_size, 1},
    {"struct_size 11", c_ctx_struct_size, 11},
    {"version 0", c_ctx_version, 0},
    {"version 2", c_ctx_version, 2},
    {"version 0xDEADBEEF", c_ctx_version, 0xDEADBEEF},
    {"larger struct", c_ctx_huge_struct, 0},
    {"info NULL", c_ctx_info_null, 0},
    {"info context NULL", c_ctx_info_ctx_null, 0},
    {"info struct_size 0", c_ctx_info_size, 0},
    {"info struct_size 4", c_ctx_info_size, 4},
    {"info short struct", c_ctx_info_small, 0},
    {"malloc out NULL", c_malloc_out_null, 0},
    {"malloc context NULL", c_malloc_ctx_null, 0},
    {"malloc 0 bytes", c_malloc_bytes, 0},
    {"malloc SIZE_MAX", c_malloc_bytes, (int64_t)(SIZE_MAX >> 1)},
    {"malloc 2^62", c_malloc_bytes, INT64_C(1) << 62},
    {"memcpy kind -1", c_memcpy_kind, -1},
    {"memcpy kind 0", c_memcpy_kind, 0},
    {"memcpy kind 4", c_memcpy_kind, 4},
    {"memcpy kind INT32_MIN", c_memcpy_kind, INT32_MIN},
    {"memcpy kind INT32_MAX", c_memcpy_kind, INT32_MAX},
    {"memcpy kind -1, 0 bytes", c_memcpy_kind_zero_bytes, 0},
    {"memcpy dst NULL", c_memcpy_dst_null, 0},
    {"memcpy src NULL", c_memcpy_src_null, 0},
    {"memcpy bytes 2^62", c_memcpy_bytes, INT64_C(1) << 62},
    {"memcpy bytes INT64_MAX", c_memcpy_bytes, INT64_MAX},
    {"memcpy context NULL", c_memcpy_ctx_null, 0},
    {"synchronize context NULL", c_sync_ctx_null, 0},
    {"dtype -1", c_dtype_queries, -1},
    {"dtype 0", c_dtype_queries, 0},
    {"dtype 3", c_dtype_queries, 3},
    {"dtype 7", c_dtype_queries, 7},
    {"dtype INT32_MIN", c_dtype_queries, INT32_MIN},
    {"dtype INT32_MAX", c_dtype_queries, INT32_MAX},
    {"status INT32_MIN", c_status_string, INT32_MIN},
    {"status -12", c_status_string, -12},
    {"status 1", c_status_string, 1},
    {"context_options_init NULL", c_options_init_null, 0},
    {"cache_options_init NULL", c_options_init_null, 1},
    {"plan_options_init NULL", c_options_init_null, 2},
    {"overlay_write_options_init NULL", c_options_init_null, 3},
    {"model_config_init NULL", c_options_init_null, 4},
};

static void test_context(void** state) {
  (void)state;
  RUN("context", k_context_cases);
}

/* ---------------------------------------------------------------------------------- */
/* Model config                                                                        */
/* ---------------------------------------------------------------------------------- */

/* Field setters for the config cases: P selects the field and value. */
struct field_case {
  const char* field;
  size_t offset;
  int32_t value;
};
#define FC(f, v) \
  { #f, offsetof(qsakv_model_config, f), (v) }
static const struct field_case k_fields[] = {
    FC(num_layers, 0),
    FC(num_layers, -1),
    FC(num_layers, INT32_MIN),
    FC(num_layers, INT32_MAX),
    FC(num_qsa_layers, 0),
    FC(num_qsa_layers, -1),
    FC(num_qsa_layers, INT32_MAX),
    FC(num_qsa_layers, INT32_MIN),
    FC(qsa_layers, -1),
    FC(qsa_layers, INT32_MAX),
    FC(num_q_heads, 0),
    FC(num_q_heads, INT32_MAX),
    FC(num_q_heads, INT32_MIN),
    FC(num_kv_heads, 0),
    FC(num_kv_heads, INT32_MAX),
    FC(num_kv_heads, -4),
    FC(head_dim, 0),
    FC(head_dim, INT32_MIN),
    FC(head_dim, 512),
    FC(index_num_heads, 0),
    FC(index_num_heads, INT32_MAX),
    FC(index_head_dim, 0),
    FC(index_head_dim, 12),
    FC(index_head_dim, INT32_MAX),
    FC(compress_ratio, 0),
    FC(compress_ratio, INT32_MIN),
    FC(compress_ratio, INT32_MAX),
    FC(topk_tokens, 0),
    FC(topk_tokens, INT32_MAX),
    FC(topk_tokens, 17),
    FC(tp_size, 0),
    FC(tp_size, INT32_MIN),
    FC(tp_size, INT32_MAX),
    FC(tp_rank, -1),
    FC(tp_rank, INT32_MAX),
    FC(speculative_tokens, -1),
    FC(speculative_tokens, INT32_MAX),
    FC(activation_dtype, -1),
    FC(activation_dtype, 0),
    FC(activation_dtype, 3),
    FC(activation_dtype, INT32_MAX),
    FC(activation_dtype, INT32_MIN),
    FC(kv_dtype, -1),
    FC(kv_dtype, 0),
    FC(kv_dtype, 4),
    FC(kv_dtype, INT32_MAX),
    FC(kv_dtype, INT32_MIN),
    FC(block_size, 0),
    FC(block_size, INT32_MAX),
    FC(block_size, 18),
    FC(max_requests, 0),
    FC(max_requests, INT32_MAX),
    FC(max_requests, INT32_MIN),
    FC(max_batched_tokens, 0),
    FC(max_batched_tokens, INT32_MAX),
    FC(max_model_len, 0),
    FC(max_model_len, INT32_MAX),
    FC(max_model_len, INT32_MIN),
};

static qsakv_model_config bad_config(const char** field) {
  qsakv_model_config c = F.cfg;
  const struct field_case* f = &k_fields[P];
  memcpy((char*)&c + f->offset, &f->value, sizeof f->value);
  *field = f->field;
  return c;
}

static void c_cfg_validate(void) {
  const char* field;
  qsakv_model_config c = bad_config(&field);
  refuse(qsakv_model_config_validate(&c), QSAKV_ERROR_INVALID_CONFIG, field);
}
static void c_cfg_capacity(void) {
  const char* field;
  qsakv_model_config c = bad_config(&field);
  qsakv_capacity cap = {sizeof cap, QSAKV_CAPACITY_VERSION};
  refuse(qsakv_capacity_plan(&c, 1 << 30, &cap), QSAKV_ERROR_INVALID_CONFIG, field);
}
static void c_cfg_cache(void) {
  const char* field;
  qsakv_model_config c = bad_config(&field);
  qsakv_cache* cache = (qsakv_cache*)0x1;
  refuse_out(qsakv_cache_create(&cache, F.ctx, &c, NULL, NULL), QSAKV_ERROR_INVALID_CONFIG, field,
             &cache);
}
/* The same config refusals through every other entry point that takes a config: P is
 * path * 100 + field case. */
static void c_cfg_paths(void) {
  const int64_t path = P / 100;
  P %= 100;
  const char* field;
  qsakv_model_config c = bad_config(&field);
  switch (path) {
    case 0: {
      qsakv_overlay_info before, after;
      memset(&before, 0, sizeof before);
      before.struct_size = sizeof before;
      after = before;
      C_OK(qsakv_overlay_get_info(F.overlay, &before));
      qsakv_status s = qsakv_overlay_validate(F.overlay, &c, F.rev);
      C_OK(qsakv_overlay_get_info(F.overlay, &after));
      if (after.validated) report(V_WRONG, s, "the overlay counts as validated after a refusal");
      refuse(s, QSAKV_ERROR_INVALID_CONFIG, field);
    }
    case 1: {
      qsakv_calib* h = (qsakv_calib*)0x1;
      refuse_out(qsakv_calib_create(&h, F.ctx, &c), QSAKV_ERROR_INVALID_CONFIG, field, &h);
    }
    case 2:
      refuse(qsakv_tp_consensus(F.ctx, &c, NULL, (void*)0x10, NULL), QSAKV_ERROR_INVALID_CONFIG,
             field);
    case 3: {
      qsakv_rank_geometry g;
      memset(&g, 0, sizeof g);
      g.struct_size = sizeof g;
      refuse(qsakv_model_config_rank_geometry(&c, &g), QSAKV_ERROR_INVALID_CONFIG, field);
    }
    default:
      report(V_WRONG, QSAKV_SUCCESS, "no such case");
  }
}

static void c_cfg_softmax(void) {
  qsakv_model_config c = F.cfg;
  const float vals[] = {NAN, INFINITY, -INFINITY, -1.0f};
  c.softmax_scale = vals[P];
  refuse(qsakv_model_config_validate(&c), QSAKV_ERROR_INVALID_CONFIG, "softmax_scale");
}
static void c_cfg_version(void) {
  qsakv_model_config c = F.cfg;
  c.version = (uint32_t)P;
  refuse(qsakv_model_config_validate(&c), QSAKV_ERROR_INVALID_CONFIG, "version");
}
static void c_cfg_struct_size(void) {
  qsakv_model_config c = F.cfg;
  c.struct_size = (size_t)P;
  refuse(qsakv_model_config_validate(&c), ANY_ERROR, "struct_size");
}
static void c_cfg_null(void) {
  switch (P) {
    case 0:
      refuse(qsakv_model_config_validate(NULL), QSAKV_ERROR_INVALID_ARGUMENT, "config");
    case 1:
      refuse(qsakv_model_config_preset(NULL, "qwen4_exp"), QSAKV_ERROR_INVALID_ARGUMENT, "config");
    case 2: {
      qsakv_model_config c;
      refuse(qsakv_model_config_preset(&c, NULL), QSAKV_ERROR_INVALID_ARGUMENT, "preset_name");
    }
    case 3: {
      qsakv_model_config c;
      refuse(qsakv_model_config_preset(&c, "qwen4_exp\xff"), QSAKV_ERROR_INVALID_ARGUMENT,
             "preset");
    }
    case 4:
      refuse(qsakv_model_config_rank_geometry(&F.cfg, NULL), QSAKV_ERROR_INVALID_ARGUMENT, "out");
    case 5: {
      qsakv_rank_geometry g;
      memset(&g, 0, sizeof g);
      refuse(qsakv_model_config_rank_geometry(&F.cfg, &g), QSAKV_ERROR_INVALID_ARGUMENT,
             "struct_size");
    }
    case 6:
      refuse(qsakv_capacity_plan(NULL, 1, NULL), QSAKV_ERROR_INVALID_ARGUMENT, "config");
    case 7:
      refuse(qsakv_capacity_plan(&F.cfg, 1, NULL), QSAKV_ERROR_INVALID_ARGUMENT, "out");
    default:
      report(V_WRONG, QSAKV_SUCCESS, "no such case");
  }
}
static void c_capacity_budget(void) {
  qsakv_capacity cap = {sizeof cap, QSAKV_CAPACITY_VERSION};
  qsakv_status s = qsakv_capacity_plan(&F.cfg, (uint64_t)P, &cap);
  const int ok = cap.num_blocks >= 0 && cap.num_tokens == cap.num_blocks * F.cfg.block_size &&
                 (cap.num_blocks == 0 || cap.bytes_per_block > 0);
  correct(s, ok, "capacity of an extreme budget");
}

static const struct acase k_config_cases[] = {
#define FIELD(i)                                                                 \
  {"field " #i, c_cfg_validate, i}, {"capacity field " #i, c_cfg_capacity, i}, { \
    "cache field " #i, c_cfg_cache, i                                            \
  }
    FIELD(0),
    FIELD(1),
    FIELD(2),
    FIELD(3),
    FIELD(4),
    FIELD(5),
    FIELD(6),
    FIELD(7),
    FIELD(8),
    FIELD(9),
    FIELD(10),
    FIELD(11),
    FIELD(12),
    FIELD(13),
    FIELD(14),
    FIELD(15),
    FIELD(16),
    FIELD(17),
    FIELD(18),
    FIELD(19),
    FIELD(20),
    FIELD(21),
    FIELD(22),
    FIELD(23),
    FIELD(24),
    FIELD(25),
    FIELD(26),
    FIELD(27),
    FIELD(28),
    FIELD(29),
    FIELD(30),
    FIELD(31),
    FIELD(32),
    FIELD(33),
    FIELD(34),
    FIELD(35),
    FIELD(36),
    FIELD(37),
    FIELD(38),
    FIELD(39),
    FIELD(40),
    FIELD(41),
    FIELD(42),
    FIELD(43),
    FIELD(44),
    FIELD(45),
    FIELD(46),
    FIELD(47),
    FIELD(48),
    FIELD(49),
    FIELD(50),
    FIELD(51),
    FIELD(52),
    FIELD(53),
    FIELD(54),
    FIELD(55),
    FIELD(56),
    FIELD(57),
#undef FIELD
#define PATHS(i)                                          \
  {"overlay_validate field " #i, c_cfg_paths, i},         \
      {"calib_create field " #i, c_cfg_paths, 100 + i},   \
      {"tp_consensus field " #i, c_cfg_paths, 200 + i}, { \
    "rank_geometry field " #i, c_cfg_paths, 300 + i       \
  }
    PATHS(0),
    PATHS(3),
    PATHS(30),
    PATHS(37),
    PATHS(41),
    PATHS(42),
    PATHS(46),
#undef PATHS
    {"softmax_scale nan", c_cfg_softmax, 0},
    {"softmax_scale inf", c_cfg_softmax, 1},
    {"softmax_scale -inf", c_cfg_softmax, 2},
    {"softmax_scale -1", c_cfg_softmax, 3},
    {"version 0", c_cfg_version, 0},
    {"version 2", c_cfg_version, 2},
    {"version 0xDEADBEEF", c_cfg_version, 0xDEADBEEF},
    {"struct_size 0", c_cfg_struct_size, 0},
    {"struct_size 3", c_cfg_struct_size, 3},
    {"validate NULL", c_cfg_null, 0},
    {"preset config NULL", c_cfg_null, 1},
    {"preset name NULL", c_cfg_null, 2},
    {"preset name garbage", c_cfg_null, 3},
    {"rank_geometry out NULL", c_cfg_null, 4},
    {"rank_geometry struct_size 0", c_cfg_null, 5},
    {"capacity config NULL", c_cfg_null, 6},
    {"capacity out NULL", c_cfg_null, 7},
    {"capacity budget 0", c_capacity_budget, 0},
    {"capacity budget 1", c_capacity_budget, 1},
    {"capacity budget UINT64_MAX", c_capacity_budget, -1},
    {"capacity budget 2^62", c_capacity_budget, INT64_C(1) << 62},
};

static void test_config(void** state) {
  (void)state;
  assert_int_equal(sizeof k_fields / sizeof k_fields[0], 58);
  RUN("config", k_config_cases);
}

/* ---------------------------------------------------------------------------------- */
/* Cache creation and queries                                                          */
/* ---------------------------------------------------------------------------------- */

static qsakv_cache_options cache_opts(void) {
  qsakv_cache_options o;
  qsakv_cache_options_init(&o);
  o.num_blocks = 8;
  return o;
}

static void expect_cache_refused(qsakv_cache_options* o, qsakv_status want, const char* arg) {
  qsakv_cache* c = (qsakv_cache*)0x1;
  qsakv_status s = qsakv_cache_create(&c, F.ctx, &F.cfg, NULL, o);
  refuse_out(s, want, arg, &c);
}

static void c_cache_num_blocks(void) {
  qsakv_cache_options o = cache_opts();
  o.num_blocks = P;
  expect_cache_refused(
      &o, P == INT32_MAX ? QSAKV_ERROR_OUT_OF_MEMORY : QSAKV_ERROR_INVALID_ARGUMENT, "num_blocks");
}
static void c_cache_budget(void) {
  qsakv_cache_options o = cache_opts();
  o.num_blocks = 0;
  o.memory_budget_bytes = (uint64_t)P;
  expect_cache_refused(&o,
                       P == 0 || P == 1 ? QSAKV_ERROR_INVALID_ARGUMENT : QSAKV_ERROR_OUT_OF_MEMORY,
                       "memory_budget_bytes");
}
static void c_cache_share(void) {
  qsakv_cache_options o = cache_opts();
  o.share_topk = (int32_t)P;
  expect_cache_refused(&o, QSAKV_ERROR_INVALID_ARGUMENT, "share_topk");
}
static void c_cache_version(void) {
  qsakv_cache_options o = cache_opts();
  o.version = (uint32_t)P;
  expect_cache_refused(&o, QSAKV_ERROR_INVALID_ARGUMENT, "version");
}
static void c_cache_struct_size(void) {
  qsakv_cache_options o = cache_opts();
  o.struct_size = (size_t)P;
  expect_cache_refused(&o, QSAKV_ERROR_INVALID_ARGUMENT, "struct_size");
}
static void c_cache_ext(void) {
  qsakv_cache_options o = cache_opts();
  o.external_topk = F.topk;
  o.external_topk_dtype = QSAKV_DTYPE_INT32;
  o.external_topk_rows = MAX_ROWS;
  o.external_topk_cols = F.geo.topk_width;
  const char* arg = "external_topk";
  int32_t v;
  switch (P) {
    case 0:
      v = -1;
      memcpy(&o.external_topk_dtype, &v, 4);
      arg = "external_topk_dtype";
      break;
    case 1:
      v = INT32_MAX;
      memcpy(&o.external_topk_dtype, &v, 4);
      arg = "external_topk_dtype";
      break;
    case 2:
      v = INT32_MIN;
      memcpy(&o.external_topk_dtype, &v, 4);
      arg = "external_topk_dtype";
      break;
    case 3:
      o.external_topk_dtype = QSAKV_DTYPE_INT64;
      arg = "external_topk_dtype";
      break;
    case 4:
      o.external_topk_rows = -1;
      arg = "external_topk_rows";
      break;
    case 5:
      o.external_topk_rows = INT64_MIN;
      arg = "external_topk_rows";
      break;
    case 6:
      o.external_topk_rows = INT64_MAX;
      arg = "external_topk_rows";
      break;
    case 7:
      o.external_topk_cols = INT64_MAX;
      arg = "external_topk_cols";
      break;
    case 8:
      o.external_topk_cols = -1;
      arg = "external_topk_cols";
      break;
    case 9:
      o.share_topk = 0;
      arg = "share_topk";
      break;
    default:
      report(V_WRONG, QSAKV_SUCCESS, "no such case");
  }
  expect_cache_refused(&o, QSAKV_ERROR_INVALID_ARGUMENT, arg);
}
static void c_cache_nulls(void) {
  qsakv_cache_options o = cache_opts();
  qsakv_cache* c = (qsakv_cache*)0x1;
  switch (P) {
    case 0:
      refuse(qsakv_cache_create(NULL, F.ctx, &F.cfg, NULL, &o), QSAKV_ERROR_INVALID_ARGUMENT,
             "out");
    case 1:
      refuse_out(qsakv_cache_create(&c, NULL, &F.cfg, NULL, &o), QSAKV_ERROR_INVALID_ARGUMENT,
                 "context", &c);
    case 2:
      refuse_out(qsakv_cache_create(&c, F.ctx, NULL, NULL, &o), QSAKV_ERROR_INVALID_ARGUMENT,
                 "config", &c);
    case 3: /* an overlay for a 16-bit cache */
      refuse_out(qsakv_cache_create(&c, F.ctx, &F.cfg, F.overlay, &o), QSAKV_ERROR_INVALID_ARGUMENT,
                 "overlay", &c);
    case 4: { /* E4M3 with no overlay */
      qsakv_model_config e = F.cfg;
      e.kv_dtype = QSAKV_DTYPE_E4M3;
      refuse_out(qsakv_cache_create(&c, F.ctx, &e, NULL, &o), QSAKV_ERROR_OVERLAY_MISSING,
                 "overlay", &c);
    }
    case 5: { /* E4M3 with an overlay that was never validated */
      qsakv_model_config e = F.cfg;
      e.kv_dtype = QSAKV_DTYPE_E4M3;
      refuse_out(qsakv_cache_create(&c, F.ctx, &e, F.overlay, &o),
                 QSAKV_ERROR_OVERLAY_NOT_VALIDATED, "validate", &c);
    }
    case 6:
      refuse(qsakv_cache_get_layout(NULL, &F.layout), QSAKV_ERROR_INVALID_ARGUMENT, "cache");
    case 7:
      refuse(qsakv_cache_get_layout(F.cache, NULL), QSAKV_ERROR_INVALID_ARGUMENT, "out");
    case 8: {
      qsakv_cache_layout L;
      memset(&L, 0, sizeof L);
      refuse(qsakv_cache_get_layout(F.cache, &L), QSAKV_ERROR_INVALID_ARGUMENT, "struct_size");
    }
    case 9: {
      qsakv_layer_buffers lb = {sizeof lb, QSAKV_LAYER_BUFFERS_VERSION};
      refuse(qsakv_cache_get_layer_buffers(NULL, 3, &lb), QSAKV_ERROR_INVALID_ARGUMENT, "cache");
    }
    case 10:
      refuse(qsakv_cache_get_layer_buffers(F.cache, 3, NULL), QSAKV_ERROR_INVALID_ARGUMENT, "out");
    case 11:
      refuse(qsakv_cache_note_external_codes(NULL, 3, NULL), QSAKV_ERROR_INVALID_ARGUMENT, "cache");
    case 12: {
      qsakv_layer_buffers lb;
      memset(&lb, 0, sizeof lb);
      qsakv_status s = qsakv_cache_get_layer_buffers(F.cache, 3, &lb);
      if (s != QSAKV_SUCCESS && lb.kv) report(V_WRONG, s, "out written despite the refusal");
      refuse(s, QSAKV_ERROR_INVALID_ARGUMENT, "struct_size");
    }
    default:
      report(V_WRONG, QSAKV_SUCCESS, "no such case");
  }
}
static void c_cache_layer(void) {
  qsakv_layer_buffers lb;
  memset(&lb, 0, sizeof lb);
  lb.struct_size = sizeof lb;
  qsakv_status s = qsakv_cache_get_layer_buffers(F.cache, (int32_t)P, &lb);
  if (s != QSAKV_SUCCESS && lb.kv) report(V_WRONG, s, "out written despite the refusal");
  refuse(s, QSAKV_ERROR_INVALID_ARGUMENT, "layer");
}
static void c_cache_note_layer(void) {
  refuse(qsakv_cache_note_external_codes(F.cache, (int32_t)P, NULL), QSAKV_ERROR_INVALID_ARGUMENT,
         "layer");
}

static const struct acase k_cache_cases[] = {
    {"num_blocks -1", c_cache_num_blocks, -1},
    {"num_blocks INT64_MIN", c_cache_num_blocks, INT64_MIN},
    {"num_blocks INT64_MAX", c_cache_num_blocks, INT64_MAX},
    {"num_blocks 2^31", c_cache_num_blocks, INT64_C(1) << 31},
    {"num_blocks INT32_MAX", c_cache_num_blocks, INT32_MAX},
    {"budget 0", c_cache_budget, 0},
    {"budget 1", c_cache_budget, 1},
    {"budget UINT64_MAX", c_cache_budget, -1},
    {"budget 2^62", c_cache_budget, INT64_C(1) << 62},
    {"share_topk 2", c_cache_share, 2},
    {"share_topk -1", c_cache_share, -1},
    {"share_topk INT32_MIN", c_cache_share, INT32_MIN},
    {"version 0", c_cache_version, 0},
    {"version 0xDEADBEEF", c_cache_version, 0xDEADBEEF},
    {"struct_size 0", c_cache_struct_size, 0},
    {"struct_size 5", c_cache_struct_size, 5},
    {"external dtype -1", c_cache_ext, 0},
    {"external dtype INT32_MAX", c_cache_ext, 1},
    {"external dtype INT32_MIN", c_cache_ext, 2},
    {"external dtype int64", c_cache_ext, 3},
    {"external rows -1", c_cache_ext, 4},
    {"external rows INT64_MIN", c_cache_ext, 5},
    {"external rows INT64_MAX", c_cache_ext, 6},
    {"external cols INT64_MAX", c_cache_ext, 7},
    {"external cols -1", c_cache_ext, 8},
    {"external with share_topk 0", c_cache_ext, 9},
    {"create out NULL", c_cache_nulls, 0},
    {"create context NULL", c_cache_nulls, 1},
    {"create config NULL", c_cache_nulls, 2},
    {"overlay for fp16", c_cache_nulls, 3},
    {"e4m3 without overlay", c_cache_nulls, 4},
    {"e4m3 unvalidated overlay", c_cache_nulls, 5},
    {"layout cache NULL", c_cache_nulls, 6},
    {"layout out NULL", c_cache_nulls, 7},
    {"layout struct_size 0", c_cache_nulls, 8},
    {"layer_buffers cache NULL", c_cache_nulls, 9},
    {"layer_buffers out NULL", c_cache_nulls, 10},
    {"note cache NULL", c_cache_nulls, 11},
    {"layer_buffers struct_size 0", c_cache_nulls, 12},
    {"layer_buffers layer 0", c_cache_layer, 0},
    {"layer_buffers layer -1", c_cache_layer, -1},
    {"layer_buffers layer INT32_MIN", c_cache_layer, INT32_MIN},
    {"layer_buffers layer INT32_MAX", c_cache_layer, INT32_MAX},
    {"note layer 4", c_cache_note_layer, 4},
    {"note layer INT32_MIN", c_cache_note_layer, INT32_MIN},
};

static void test_cache(void** state) {
  (void)state;
  RUN("cache", k_cache_cases);
}

/* ---------------------------------------------------------------------------------- */
/* Stores                                                                              */
/* ---------------------------------------------------------------------------------- */

/* All of the cache's memory of layer 3 (main, compressed, ring), to compare before/after. */
static unsigned char* cache_copy(void) {
  qsakv_layer_buffers lb = {sizeof lb, QSAKV_LAYER_BUFFERS_VERSION};
  C_OK(qsakv_cache_get_layer_buffers(F.cache, 3, &lb));
  const size_t a = F.layout.kv_bytes_per_layer, b = F.layout.compressed_bytes_per_layer,
               c = F.layout.ring_bytes_per_layer;
  unsigned char* m = malloc(a + b + c);
  memcpy(m, lb.kv, a);
  memcpy(m + a, lb.compressed_keys, b);
  memcpy(m + a + b, lb.ring_keys, c);
  return m;
}
static int cache_same(const unsigned char* before) {
  unsigned char* now = cache_copy();
  const int same = memcmp(before, now,
                          F.layout.kv_bytes_per_layer + F.layout.compressed_bytes_per_layer +
                              F.layout.ring_bytes_per_layer) == 0;
  free(now);
  return same;
}

/* A refused store must leave the cache bit-identical. */
static void refuse_store(qsakv_status s, const unsigned char* before, const char* arg) {
  if (s != QSAKV_SUCCESS && !cache_same(before))
    report(V_WRONG, s, "a refused store wrote the cache");
  refuse(s, QSAKV_ERROR_INVALID_ARGUMENT, arg);
}

static void c_store_kv_arg(void) {
  unsigned char* before = cache_copy();
  const void *k = F.kv_in, *v = F.kv_in;
  const int64_t* slots = F.slots;
  int64_t n = 8;
  int32_t layer = 3;
  const char* arg = "";
  switch (P) {
    case 0:
      k = NULL;
      arg = "k";
      break;
    case 1:
      v = NULL;
      arg = "v";
      break;
    case 2:
      slots = NULL;
      arg = "slot_mapping";
      break;
    case 3:
      n = -1;
      arg = "num_tokens";
      break;
    case 4:
      n = INT64_MIN;
      arg = "num_tokens";
      break;
    case 5:
      n = INT64_MAX;
      arg = "num_tokens";
      break;
    case 6:
      n = INT64_C(1) << 45;
      arg = "num_tokens";
      break;
    case 7:
      layer = 4;
      arg = "layer";
      break;
    case 8:
      layer = INT32_MIN;
      arg = "layer";
      break;
    default:
      report(V_WRONG, QSAKV_SUCCESS, "no such case");
  }
  refuse_store(qsakv_store_kv(F.cache, layer, k, v, slots, n, NULL), before, arg);
}
static void c_store_kv_cache_null(void) {
  refuse(qsakv_store_kv(NULL, 3, F.kv_in, F.kv_in, F.slots, 8, NULL), QSAKV_ERROR_INVALID_ARGUMENT,
         "cache");
}
static void c_store_kv_zero(void) {
  unsigned char* before = cache_copy();
  qsakv_status s = qsakv_store_kv(F.cache, 3, NULL, NULL, NULL, 0, NULL);
  correct(s, cache_same(before), "an empty store with NULL buffers changes nothing");
}
/* Out-of-range slots are skipped exactly: the cache equals the one where those tokens
 * were not stored at all. */
static void c_store_kv_bad_slots(void) {
  unsigned char* before = cache_copy();
  int64_t* slots = dev(sizeof(int64_t) * 8);
  const int64_t cap = F.layout.num_blocks * F.layout.block_size;
  const int64_t bad[] = {INT64_MAX, INT64_MIN, -1, cap, cap + 1, -2, INT64_MAX - 15, -cap};
  memcpy(slots, bad, sizeof bad);
  qsakv_status s = qsakv_store_kv(F.cache, 3, F.kv_in, F.kv_in, slots, 8, NULL);
  correct(s, cache_same(before), "out-of-range slots are skipped");
}
static void c_store_index_arg(void) {
  unsigned char* before = cache_copy();
  int32_t* rs = dev(sizeof(int32_t) * 8);
  int64_t* pos = dev(sizeof(int64_t) * 8);
  const void* keys = F.index_q;
  int64_t n = 8;
  const char* arg = "";
  switch (P) {
    case 0:
      keys = NULL;
      arg = "keys";
      break;
    case 1:
      rs = NULL;
      arg = "request_slots";
      break;
    case 2:
      pos = NULL;
      arg = "positions";
      break;
    case 3:
      n = -1;
      arg = "num_tokens";
      break;
    case 4:
      n = INT64_MAX;
      arg = "num_tokens";
      break;
    case 5:
      n = INT64_MIN;
      arg = "num_tokens";
      break;
    default:
      report(V_WRONG, QSAKV_SUCCESS, "no such case");
  }
  refuse_store(qsakv_store_index_keys(F.cache, 3, keys, rs, pos, n, NULL), before, arg);
}
static void c_store_index_bad_slots(void) {
  unsigned char* before = cache_copy();
  int32_t* rs = dev(sizeof(int32_t) * 8);
  int64_t* pos = dev(sizeof(int64_t) * 8);
  const int32_t bad_rs[] = {-1, INT32_MIN, INT32_MAX, 4, 5, 1000, 0, 1};
  const int64_t p[] = {0, 1, 2, 3, 4, 5, INT64_MIN, -1};
  memcpy(rs, bad_rs, sizeof bad_rs);
  memcpy(pos, p, sizeof p);
  qsakv_status s = qsakv_store_index_keys(F.cache, 3, F.index_q, rs, pos, 8, NULL);
  correct(s, cache_same(before), "out-of-range request slots and negative positions skip");
}
static void c_store_compressed_arg(void) {
  unsigned char* before = cache_copy();
  const void* keys = F.index_q;
  const int64_t* slots = F.slots;
  int64_t n = 8;
  const char* arg = "";
  switch (P) {
    case 0:
      keys = NULL;
      arg = "keys";
      break;
    case 1:
      slots = NULL;
      arg = "slot_mapping";
      break;
    case 2:
      n = -1;
      arg = "num_keys";
      break;
    case 3:
      n = INT64_MAX;
      arg = "num_keys";
      break;
    case 4:
      n = INT64_C(1) << 50;
      arg = "num_keys";
      break;
    default:
      report(V_WRONG, QSAKV_SUCCESS, "no such case");
  }
  refuse_store(qsakv_store_compressed_keys(F.cache, 3, keys, slots, n, NULL), before, arg);
}
static void c_store_compressed_bad_slots(void) {
  unsigned char* before = cache_copy();
  int64_t* slots = dev(sizeof(int64_t) * 8);
  const int64_t cap = F.layout.num_blocks * F.layout.block_size;
  const int64_t bad[] = {INT64_MAX, INT64_MIN, -1, cap, cap + 3, -4, INT64_MAX - 3, -cap};
  memcpy(slots, bad, sizeof bad);
  qsakv_status s = qsakv_store_compressed_keys(F.cache, 3, F.index_q, slots, 8, NULL);
  correct(s, cache_same(before), "out-of-range compressed slots are skipped");
}
static void c_store_other_null(void) {
  switch (P) {
    case 0:
      refuse(qsakv_store_index_keys(NULL, 3, F.index_q, NULL, NULL, 1, NULL),
             QSAKV_ERROR_INVALID_ARGUMENT, "cache");
    case 1:
      refuse(qsakv_store_compressed_keys(NULL, 3, F.index_q, F.slots, 1, NULL),
             QSAKV_ERROR_INVALID_ARGUMENT, "cache");
    case 2:
      refuse(qsakv_store_index_keys(F.cache, -3, F.index_q, NULL, NULL, 1, NULL),
             QSAKV_ERROR_INVALID_ARGUMENT, "layer");
    case 3:
      refuse(qsakv_store_compressed_keys(F.cache, INT32_MAX, F.index_q, F.slots, 1, NULL),
             QSAKV_ERROR_INVALID_ARGUMENT, "layer");
    default:
      report(V_WRONG, QSAKV_SUCCESS, "no such case");
  }
}

/* A misaligned array (one byte past an element boundary, two for the 8-byte ones) is
 * refused by name, saying it must be aligned, before anything is stored: the GPU would
 * fault on it (a sticky error that ends the CUDA context), the CPU read it as undefined
 * behaviour. Each part of qsakv_store_step is refused under its field's name. */
static void c_store_misaligned(void) {
  unsigned char* before = cache_copy();
  const char* kv = (const char*)F.kv_in;
  const char* keys = (const char*)F.index_q;
  int32_t* rs = dev(sizeof(int32_t) * 9);
  int64_t* pos = dev(sizeof(int64_t) * 9);
  memset(rs, 0, sizeof(int32_t) * 9);
  memset(pos, 0, sizeof(int64_t) * 9);
  const int64_t* slots_odd = (const int64_t*)((const char*)F.slots + 4);
  const int32_t* rs_odd = (const int32_t*)((const char*)rs + 2);
  const int64_t* pos_odd = (const int64_t*)((const char*)pos + 4);
  qsakv_step_stores st = QSAKV_STEP_STORES_INIT;
  qsakv_status s = QSAKV_SUCCESS;
  const char* arg = "";
  switch (P) {
    case 0:
      s = qsakv_store_kv(F.cache, 3, kv + 1, F.kv_in, F.slots, 8, NULL);
      arg = "k (";
      break;
    case 1:
      s = qsakv_store_kv(F.cache, 3, F.kv_in, kv + 1, F.slots, 8, NULL);
      arg = "v (";
      break;
    case 2:
      s = qsakv_store_kv(F.cache, 3, F.kv_in, F.kv_in, slots_odd, 8, NULL);
      arg = "slot_mapping (";
      break;
    case 3:
      s = qsakv_store_index_keys(F.cache, 3, keys + 1, rs, pos, 8, NULL);
      arg = "keys (";
      break;
    case 4:
      s = qsakv_store_index_keys(F.cache, 3, F.index_q, rs_odd, pos, 8, NULL);
      arg = "request_slots (";
      break;
    case 5:
      s = qsakv_store_index_keys(F.cache, 3, F.index_q, rs, pos_odd, 8, NULL);
      arg = "positions (";
      break;
    case 6:
      s = qsakv_store_compressed_keys(F.cache, 3, keys + 1, F.slots, 8, NULL);
      arg = "keys (";
      break;
    case 7:
      s = qsakv_store_compressed_keys(F.cache, 3, F.index_q, slots_odd, 8, NULL);
      arg = "slot_mapping (";
      break;
    case 8: /* the K/V part misaligned, the other two parts well formed */
      st.k = F.kv_in;
      st.v = F.kv_in;
      st.kv_slot_mapping = slots_odd;
      st.num_tokens = 8;
      st.compressed_keys = F.index_q;
      st.compressed_slot_mapping = F.slots;
      st.num_compressed_keys = 8;
      s = qsakv_store_step(F.cache, 3, &st, NULL);
      arg = "stores.kv_slot_mapping (";
      break;
    case 9:
      st.index_keys = F.index_q;
      st.index_request_slots = rs;
      st.index_positions = pos_odd;
      st.num_index_keys = 8;
      s = qsakv_store_step(F.cache, 3, &st, NULL);
      arg = "stores.index_positions (";
      break;
    case 10:
      st.k = F.kv_in;
      st.v = F.kv_in;
      st.kv_slot_mapping = F.slots;
      st.num_tokens = 8;
      st.compressed_keys = keys + 1;
      st.compressed_slot_mapping = F.slots;
      st.num_compressed_keys = 8;
      s = qsakv_store_step(F.cache, 3, &st, NULL);
      arg = "stores.compressed_keys (";
      break;
    default:
      report(V_WRONG, QSAKV_SUCCESS, "no such case");
  }
  if (s != QSAKV_SUCCESS && !strstr(qsakv_last_error(), "-byte aligned"))
    report(V_WRONG, s, "the refusal does not say why: %s", qsakv_last_error());
  refuse_store(s, before, arg);
}

static const struct acase k_store_cases[] = {
    {"kv k NULL", c_store_kv_arg, 0},
    {"kv v NULL", c_store_kv_arg, 1},
    {"kv slot_mapping NULL", c_store_kv_arg, 2},
    {"kv num_tokens -1", c_store_kv_arg, 3},
    {"kv num_tokens INT64_MIN", c_store_kv_arg, 4},
    {"kv num_tokens INT64_MAX", c_store_kv_arg, 5},
    {"kv num_tokens 2^45", c_store_kv_arg, 6},
    {"kv layer 4", c_store_kv_arg, 7},
    {"kv layer INT32_MIN", c_store_kv_arg, 8},
    {"kv cache NULL", c_store_kv_cache_null, 0},
    {"kv 0 tokens, NULL buffers", c_store_kv_zero, 0},
    {"kv out-of-range slots", c_store_kv_bad_slots, 0},
    {"index keys NULL", c_store_index_arg, 0},
    {"index request_slots NULL", c_store_index_arg, 1},
    {"index positions NULL", c_store_index_arg, 2},
    {"index num_tokens -1", c_store_index_arg, 3},
    {"index num_tokens INT64_MAX", c_store_index_arg, 4},
    {"index num_tokens INT64_MIN", c_store_index_arg, 5},
    {"index out-of-range slots", c_store_index_bad_slots, 0},
    {"compressed keys NULL", c_store_compressed_arg, 0},
    {"compressed slot_mapping NULL", c_store_compressed_arg, 1},
    {"compressed num_keys -1", c_store_compressed_arg, 2},
    {"compressed num_keys INT64_MAX", c_store_compressed_arg, 3},
    {"compressed num_keys 2^50", c_store_compressed_arg, 4},
    {"compressed out-of-range slots", c_store_compressed_bad_slots, 0},
    {"index cache NULL", c_store_other_null, 0},
    {"compressed cache NULL", c_store_other_null, 1},
    {"index layer -3", c_store_other_null, 2},
    {"compressed layer INT32_MAX", c_store_other_null, 3},
    {"kv k misaligned", c_store_misaligned, 0},
    {"kv v misaligned", c_store_misaligned, 1},
    {"kv slot_mapping misaligned", c_store_misaligned, 2},
    {"index keys misaligned", c_store_misaligned, 3},
    {"index request_slots misaligned", c_store_misaligned, 4},
    {"index positions misaligned", c_store_misaligned, 5},
    {"compressed keys misaligned", c_store_misaligned, 6},
    {"compressed slot_mapping misaligned", c_store_misaligned, 7},
    {"step kv_slot_mapping misaligned", c_store_misaligned, 8},
    {"step index_positions misaligned", c_store_misaligned, 9},
    {"step compressed_keys misaligned", c_store_misaligned, 10},
};

static void test_store(void** state) {
  (void)state;
  RUN("store", k_store_cases);
}

/* ---------------------------------------------------------------------------------- */
/* Plans: creation and updates                                                         */
/* ---------------------------------------------------------------------------------- */

static void c_plan_create(void) {
  qsakv_plan_options o;
  qsakv_plan_options_init(&o);
  const char* arg = "";
  switch (P) {
    case 0:
      o.max_rows = -1;
      arg = "max_rows";
      break;
    case 1:
      o.max_rows = INT32_MAX;
      arg = "max_rows";
      break;
    case 2:
      o.max_rows = INT32_MIN;
      arg = "max_rows";
      break;
    case 3:
      o.max_requests = -1;
      arg = "max_requests";
      break;
    case 4:
      o.max_requests = INT32_MAX;
      arg = "max_requests";
      break;
    case 5:
      o.num_splits = -1;
      arg = "num_splits";
      break;
    case 6:
      o.num_splits = 257;
      arg = "num_splits";
      break;
    case 7:
      o.num_splits = INT32_MAX;
      arg = "num_splits";
      break;
    case 8:
      o.num_splits = INT32_MIN;
      arg = "num_splits";
      break;
    case 9:
      o.version = 0xDEADBEEF;
      arg = "version";
      break;
    case 10:
      o.struct_size = 0;
      arg = "struct_size";
      break;
    default:
      report(V_WRONG, QSAKV_SUCCESS, "no such case");
  }
  qsakv_plan* p = (qsakv_plan*)0x1;
  refuse_out(qsakv_plan_create(&p, F.cache, &o), QSAKV_ERROR_INVALID_ARGUMENT, arg, &p);
}
static void c_plan_create_null(void) {
  qsakv_plan* p = (qsakv_plan*)0x1;
  if (P == 0) refuse(qsakv_plan_create(NULL, F.cache, NULL), QSAKV_ERROR_INVALID_ARGUMENT, "out");
  refuse_out(qsakv_plan_create(&p, NULL, NULL), QSAKV_ERROR_INVALID_ARGUMENT, "cache", &p);
}

static qsakv_plan_info plan_info(const qsakv_plan* p) {
  qsakv_plan_info i = {sizeof i, QSAKV_PLAN_INFO_VERSION};
  C_OK(qsakv_plan_get_info(p, &i));
  return i;
}

/* A refused update leaves the plan as it was: same rows and requests, and the batch it
 * had still drives attention to the same output bits. */
static void refuse_update(const qsakv_batch* b, const char* arg) {
  const qsakv_plan_info before = plan_info(F.plan);
  const size_t on = (size_t)ROWS * F.geo.q_heads * F.cfg.head_dim;
  C_OK(qsakv_attention_run(F.plan, 3, QSAKV_ATTENTION_DENSE, F.q, NULL, 0, F.out, NULL));
  uint16_t* ref = malloc(on * 2);
  memcpy(ref, F.out, on * 2);
  qsakv_status s = qsakv_plan_update(F.plan, b, NULL);
  if (s != QSAKV_SUCCESS) {
    const qsakv_plan_info after = plan_info(F.plan);
    memset(F.out, 0, on * 2);
    C_OK(qsakv_attention_run(F.plan, 3, QSAKV_ATTENTION_DENSE, F.q, NULL, 0, F.out, NULL));
    if (after.num_rows != before.num_rows || after.num_requests != before.num_requests ||
        memcmp(ref, F.out, on * 2) != 0)
      report(V_WRONG, s, "a refused update changed the plan");
  }
  refuse(s, QSAKV_ERROR_INVALID_ARGUMENT, arg);
}

static void c_update(void) {
  int32_t qs[4] = {0, 1, ROWS, ROWS}, lens[3] = {40, 100, 8}, slots[3] = {0, 1, 2};
  qsakv_batch b = QSAKV_BATCH_INIT;
  b.num_requests = 2;
  b.query_start = qs;
  b.seq_lens = lens;
  b.block_table = F.block_table;
  b.block_table_stride = BT_STRIDE;
  const char* arg = "";
  switch (P) {
    case 0: /* the issue's example */
      qs[1] = 5;
      qs[2] = INT32_MIN;
      lens[0] = 300;
      lens[1] = 100;
      arg = "query_start[2]";
      break;
    case 1:
      qs[1] = 0;
      qs[2] = INT32_MIN;
      arg = "query_start[2]";
      break;
    case 2:
      qs[1] = INT32_MAX;
      arg = "query_start[1]";
      break;
    case 3:
      qs[1] = INT32_MIN;
      arg = "query_start[1]";
      break;
    case 4:
      qs[0] = 1;
      arg = "query_start[0]";
      break;
    case 5:
      qs[0] = INT32_MIN;
      arg = "query_start[0]";
      break;
    case 6:
      qs[1] = 3;
      qs[2] = 1;
      arg = "query_start[2]";
      break;
    case 7:
      qs[2] = MAX_ROWS + 1;
      arg = "query_start[2]";
      break;
    case 8:
      lens[0] = INT32_MIN;
      arg = "seq_lens[0]";
      break;
    case 9:
      lens[1] = INT32_MAX;
      arg = "seq_lens[1]";
      break;
    case 10:
      lens[1] = 2;
      arg = "seq_lens[1]";
      break; /* fewer tokens than its 3 rows */
    case 11:
      lens[0] = -1;
      arg = "seq_lens[0]";
      break;
    case 12:
      b.num_requests = -1;
      arg = "num_requests";
      break;
    case 13:
      b.num_requests = INT32_MAX;
      arg = "num_requests";
      break;
    case 14:
      b.num_requests = INT32_MIN;
      arg = "num_requests";
      break;
    case 15:
      b.num_requests = 5;
      arg = "num_requests";
      break;
    case 16:
      b.query_start = NULL;
      arg = "query_start";
      break;
    case 17:
      b.seq_lens = NULL;
      arg = "seq_lens";
      break;
    case 18:
      b.block_table = NULL;
      arg = "block_table";
      break;
    case 19:
      b.block_table_stride = -1;
      arg = "block_table_stride";
      break;
    case 20:
      b.block_table_stride = INT32_MIN;
      arg = "block_table_stride";
      break;
    case 21:
      b.block_table_stride = 0;
      arg = "block_table_stride";
      break;
    case 22:
      b.block_table_stride = 6;
      arg = "block_table_stride";
      break; /* 100 tokens: 7 pages */
    case 23:
      b.request_slots = slots;
      slots[1] = -1;
      arg = "request_slots[1]";
      break;
    case 24:
      b.request_slots = slots;
      slots[0] = INT32_MAX;
      arg = "request_slots[0]";
      break;
    case 25:
      b.request_slots = slots;
      slots[1] = 4;
      arg = "request_slots[1]";
      break;
    case 26:
      b.version = 0xDEADBEEF;
      arg = "version";
      break;
    case 27:
      b.version = 0;
      arg = "version";
      break;
    case 28:
      b.struct_size = 0;
      arg = "struct_size";
      break;
    case 29:
      b.struct_size = 7;
      arg = "struct_size";
      break;
    default:
      report(V_WRONG, QSAKV_SUCCESS, "no such case");
  }
  refuse_update(&b, arg);
}
static void c_update_null(void) {
  if (P == 0) {
    qsakv_batch b;
    memset(&b, 0, sizeof b);
    refuse(qsakv_plan_update(NULL, &b, NULL), QSAKV_ERROR_INVALID_ARGUMENT, "plan");
  }
  refuse_update(NULL, "batch");
}
/* Empty batches are valid: zero rows, then select and attention do nothing. */
static void c_update_empty(void) {
  qsakv_batch b = QSAKV_BATCH_INIT;
  b.num_requests = P; /* 0 requests; or requests with no rows */
  int32_t qs[3] = {0, 0, 0}, lens[2] = {0, 17};
  b.query_start = qs;
  b.seq_lens = lens;
  qsakv_status s = qsakv_plan_update(F.plan, &b, NULL);
  const size_t on = (size_t)MAX_ROWS * F.geo.q_heads * F.cfg.head_dim;
  memset(F.out, 0x5A, on * 2);
  int ok = s == QSAKV_SUCCESS && plan_info(F.plan).num_rows == 0 &&
           qsakv_attention_run(F.plan, 3, QSAKV_ATTENTION_DENSE, F.q, NULL, 0, F.out, NULL) ==
               QSAKV_SUCCESS;
  for (size_t i = 0; ok && i < on; ++i) ok = F.out[i] == 0x5A5A;
  correct(s, ok, "an empty batch: zero rows, nothing written");
}
static void c_plan_info(void) {
  if (P == 0) refuse(qsakv_plan_get_info(NULL, NULL), QSAKV_ERROR_INVALID_ARGUMENT, "plan");
  if (P == 1) refuse(qsakv_plan_get_info(F.plan, NULL), QSAKV_ERROR_INVALID_ARGUMENT, "info");
  qsakv_plan_info i;
  memset(&i, 0, sizeof i);
  refuse(qsakv_plan_get_info(F.plan, &i), QSAKV_ERROR_INVALID_ARGUMENT, "struct_size");
}

static const struct acase k_plan_cases[] = {
    {"create max_rows -1", c_plan_create, 0},
    {"create max_rows INT32_MAX", c_plan_create, 1},
    {"create max_rows INT32_MIN", c_plan_create, 2},
    {"create max_requests -1", c_plan_create, 3},
    {"create max_requests INT32_MAX", c_plan_create, 4},
    {"create num_splits -1", c_plan_create, 5},
    {"create num_splits 257", c_plan_create, 6},
    {"create num_splits INT32_MAX", c_plan_create, 7},
    {"create num_splits INT32_MIN", c_plan_create, 8},
    {"create version 0xDEADBEEF", c_plan_create, 9},
    {"create struct_size 0", c_plan_create, 10},
    {"create out NULL", c_plan_create_null, 0},
    {"create cache NULL", c_plan_create_null, 1},
    {"query_start {0,5,INT32_MIN}", c_update, 0},
    {"query_start {0,0,INT32_MIN}", c_update, 1},
    {"query_start[1] INT32_MAX", c_update, 2},
    {"query_start[1] INT32_MIN", c_update, 3},
    {"query_start[0] 1", c_update, 4},
    {"query_start[0] INT32_MIN", c_update, 5},
    {"query_start decreasing", c_update, 6},
    {"query_start beyond max_rows", c_update, 7},
    {"seq_lens INT32_MIN", c_update, 8},
    {"seq_lens INT32_MAX", c_update, 9},
    {"seq_lens below rows", c_update, 10},
    {"seq_lens -1", c_update, 11},
    {"num_requests -1", c_update, 12},
    {"num_requests INT32_MAX", c_update, 13},
    {"num_requests INT32_MIN", c_update, 14},
    {"num_requests max+1", c_update, 15},
    {"query_start NULL", c_update, 16},
    {"seq_lens NULL", c_update, 17},
    {"block_table NULL", c_update, 18},
    {"block_table_stride -1", c_update, 19},
    {"block_table_stride INT32_MIN", c_update, 20},
    {"block_table_stride 0", c_update, 21},
    {"block_table_stride short", c_update, 22},
    {"request_slots -1", c_update, 23},
    {"request_slots INT32_MAX", c_update, 24},
    {"request_slots max_requests", c_update, 25},
    {"batch version 0xDEADBEEF", c_update, 26},
    {"batch version 0", c_update, 27},
    {"batch struct_size 0", c_update, 28},
    {"batch struct_size 7", c_update, 29},
    {"update plan NULL", c_update_null, 0},
    {"update batch NULL", c_update_null, 1},
    {"empty batch, 0 requests", c_update_empty, 0},
    {"empty batch, 2 requests", c_update_empty, 2},
    {"info plan NULL", c_plan_info, 0},
    {"info NULL", c_plan_info, 1},
    {"info struct_size 0", c_plan_info, 2},
};

static void test_plan(void** state) {
  (void)state;
  RUN("plan", k_plan_cases);
}

/* ---------------------------------------------------------------------------------- */
/* Selection and attention                                                             */
/* ---------------------------------------------------------------------------------- */

static void c_select_stride(void) {
  /* The caller's buffer is guarded by a canary row before it: nothing may touch it. */
  const size_t n = (size_t)MAX_ROWS * F.topk_stride;
  int32_t* buf = dev(sizeof(int32_t) * (n + 64));
  for (size_t i = 0; i < n + 64; ++i) buf[i] = 0x7777;
  qsakv_status s = qsakv_select_topk(F.plan, 3, F.index_q, buf + 32, P, NULL);
  int untouched = 1;
  for (size_t i = 0; i < n + 64; ++i) untouched &= buf[i] == 0x7777;
  if (s != QSAKV_SUCCESS && !untouched) report(V_WRONG, s, "a refused select wrote the buffer");
  refuse(s, QSAKV_ERROR_INVALID_ARGUMENT, "topk_stride");
}
static void c_select_arg(void) {
  switch (P) {
    case 0:
      refuse(qsakv_select_topk(NULL, 3, F.index_q, NULL, 0, NULL), QSAKV_ERROR_INVALID_ARGUMENT,
             "plan");
    case 1:
      refuse(qsakv_select_topk(F.fresh, 3, F.index_q, NULL, 0, NULL), QSAKV_ERROR_STATE,
             "qsakv_plan_update");
    case 2:
      refuse(qsakv_select_topk(F.plan, 3, NULL, NULL, 0, NULL), QSAKV_ERROR_INVALID_ARGUMENT,
             "index_q");
    case 3:
      refuse(qsakv_select_topk(F.plan, 2, F.index_q, NULL, 0, NULL), QSAKV_ERROR_INVALID_ARGUMENT,
             "layer");
    case 4:
      refuse(qsakv_select_topk(F.plan, INT32_MIN, F.index_q, NULL, 0, NULL),
             QSAKV_ERROR_INVALID_ARGUMENT, "layer");
    default:
      report(V_WRONG, QSAKV_SUCCESS, "no such case");
  }
}
/* A caller buffer with a wide stride holds exactly the shared buffer's rows. */
static void c_select_wide(void) {
  const int w = F.geo.topk_width;
  qsakv_layer_buffers lb = {sizeof lb, QSAKV_LAYER_BUFFERS_VERSION};
  C_OK(qsakv_cache_get_layer_buffers(F.cache, 3, &lb));
  for (int i = 0; i < MAX_ROWS * F.topk_stride; ++i) F.topk[i] = 0x6666;
  qsakv_status s = qsakv_select_topk(F.plan, 3, F.index_q, F.topk, F.topk_stride, NULL);
  int ok = 1;
  for (int r = 0; r < ROWS; ++r) {
    ok &= memcmp(F.topk + (size_t)r * F.topk_stride, lb.topk + (size_t)r * w,
                 sizeof(int32_t) * w) == 0;
    for (int j = w; j < F.topk_stride; ++j) ok &= F.topk[(size_t)r * F.topk_stride + j] == 0x6666;
  }
  correct(s, ok, "select into a caller buffer equals the shared one");
}
static void c_attn_mode(void) {
  qsakv_attention_mode m;
  int32_t v = (int32_t)P;
  memcpy(&m, &v, sizeof v);
  const size_t on = (size_t)MAX_ROWS * F.geo.q_heads * F.cfg.head_dim;
  memset(F.out, 0x33, on * 2);
  qsakv_status s = qsakv_attention_run(F.plan, 3, m, F.q, NULL, 0, F.out, NULL);
  for (size_t i = 0; i < on; ++i)
    if (F.out[i] != 0x3333) report(V_WRONG, s, "a refused attention wrote out");
  refuse(s, QSAKV_ERROR_INVALID_ARGUMENT, "mode");
}
static void c_attn_stride(void) {
  const size_t on = (size_t)MAX_ROWS * F.geo.q_heads * F.cfg.head_dim;
  memset(F.out, 0x33, on * 2);
  qsakv_status s =
      qsakv_attention_run(F.plan, 3, QSAKV_ATTENTION_SPARSE, F.q, F.topk, P, F.out, NULL);
  for (size_t i = 0; i < on; ++i)
    if (F.out[i] != 0x3333) report(V_WRONG, s, "a refused attention wrote out");
  refuse(s, QSAKV_ERROR_INVALID_ARGUMENT, "topk_stride");
}
static void c_attn_arg(void) {
  switch (P) {
    case 0:
      refuse(qsakv_attention_run(NULL, 3, QSAKV_ATTENTION_DENSE, F.q, NULL, 0, F.out, NULL),
             QSAKV_ERROR_INVALID_ARGUMENT, "plan");
    case 1:
      refuse(qsakv_attention_run(F.fresh, 3, QSAKV_ATTENTION_DENSE, F.q, NULL, 0, F.out, NULL),
             QSAKV_ERROR_STATE, "qsakv_plan_update");
    case 2:
      refuse(qsakv_attention_run(F.plan, 3, QSAKV_ATTENTION_DENSE, NULL, NULL, 0, F.out, NULL),
             QSAKV_ERROR_INVALID_ARGUMENT, "q");
    case 3:
      refuse(qsakv_attention_run(F.plan, 3, QSAKV_ATTENTION_DENSE, F.q, NULL, 0, NULL, NULL),
             QSAKV_ERROR_INVALID_ARGUMENT, "out");
    case 4:
      refuse(qsakv_attention_run(F.plan, 8, QSAKV_ATTENTION_DENSE, F.q, NULL, 0, F.out, NULL),
             QSAKV_ERROR_INVALID_ARGUMENT, "layer");
    case 5:
      refuse(qsakv_attention_run(F.plan, -1, QSAKV_ATTENTION_SPARSE, F.q, NULL, 0, F.out, NULL),
             QSAKV_ERROR_INVALID_ARGUMENT, "layer");
    default:
      report(V_WRONG, QSAKV_SUCCESS, "no such case");
  }
}
/* DENSE ignores the top-k arguments, whatever they are. */
static void c_attn_dense_ignores(void) {
  const size_t on = (size_t)ROWS * F.geo.q_heads * F.cfg.head_dim;
  C_OK(qsakv_attention_run(F.plan, 3, QSAKV_ATTENTION_DENSE, F.q, NULL, 0, F.out, NULL));
  uint16_t* ref = malloc(on * 2);
  memcpy(ref, F.out, on * 2);
  memset(F.out, 0, on * 2);
  qsakv_status s = qsakv_attention_run(F.plan, 3, QSAKV_ATTENTION_DENSE, F.q,
                                       (const int32_t*)(uintptr_t)0x10, P, F.out, NULL);
  correct(s, memcmp(ref, F.out, on * 2) == 0, "dense attention ignores topk and its stride");
}
/* Out-of-range top-k indices are ignored exactly: the output equals the one where they
 * are -1 (none). */
static void c_attn_bad_indices(void) {
  const int w = F.geo.topk_width;
  qsakv_layer_buffers lb = {sizeof lb, QSAKV_LAYER_BUFFERS_VERSION};
  C_OK(qsakv_cache_get_layer_buffers(F.cache, 3, &lb));
  int32_t* bad = dev(sizeof(int32_t) * MAX_ROWS * w);
  int32_t* clean = dev(sizeof(int32_t) * MAX_ROWS * w);
  memcpy(bad, lb.topk, sizeof(int32_t) * MAX_ROWS * w);
  memcpy(clean, lb.topk, sizeof(int32_t) * MAX_ROWS * w);
  const int32_t junk[] = {INT32_MAX, INT32_MIN, -7, 1 << 30, 512, 100000};
  for (int r = 0; r < ROWS; ++r)
    for (int j = 0; j < 6; ++j) {
      bad[r * w + 2 * j] = junk[(j + r) % 6];
      clean[r * w + 2 * j] = -1;
    }
  const size_t on = (size_t)ROWS * F.geo.q_heads * F.cfg.head_dim;
  C_OK(qsakv_attention_run(F.plan, 3, QSAKV_ATTENTION_SPARSE, F.q, clean, w, F.out, NULL));
  uint16_t* ref = malloc(on * 2);
  memcpy(ref, F.out, on * 2);
  memset(F.out, 0, on * 2);
  qsakv_status s = qsakv_attention_run(F.plan, 3, QSAKV_ATTENTION_SPARSE, F.q, bad, w, F.out, NULL);
  correct(s, memcmp(ref, F.out, on * 2) == 0, "out-of-range top-k indices are ignored exactly");
}

/* Misaligned top-k, query and output arrays are refused by name (see c_store_misaligned). */
static void c_select_misaligned(void) {
  const int32_t* topk_odd = (const int32_t*)((const char*)F.topk + 2);
  const char* q = (const char*)F.q;
  qsakv_status s = QSAKV_SUCCESS;
  const char* arg = "";
  switch (P) {
    case 0:
      s = qsakv_select_topk(F.plan, 3, F.index_q, (int32_t*)topk_odd, F.topk_stride, NULL);
      arg = "topk (";
      break;
    case 1:
      s = qsakv_select_topk(F.plan, 3, (const char*)F.index_q + 1, NULL, 0, NULL);
      arg = "index_q (";
      break;
    case 2:
      s = qsakv_attention_run(F.plan, 3, QSAKV_ATTENTION_SPARSE, F.q, topk_odd, F.topk_stride,
                              F.out, NULL);
      arg = "topk (";
      break;
    case 3:
      s = qsakv_attention_run(F.plan, 3, QSAKV_ATTENTION_DENSE, q + 1, NULL, 0, F.out, NULL);
      arg = "q (";
      break;
    case 4:
      s = qsakv_attention_run(F.plan, 3, QSAKV_ATTENTION_DENSE, F.q, NULL, 0, (char*)F.out + 1,
                              NULL);
      arg = "out (";
      break;
    default:
      report(V_WRONG, QSAKV_SUCCESS, "no such case");
  }
  if (s != QSAKV_SUCCESS && !strstr(qsakv_last_error(), "-byte aligned"))
    report(V_WRONG, s, "the refusal does not say why: %s", qsakv_last_error());
  refuse(s, QSAKV_ERROR_INVALID_ARGUMENT, arg);
}

static const struct acase k_select_cases[] = {
    {"select stride INT64_MAX", c_select_stride, INT64_MAX},
    {"select stride INT64_MAX/2", c_select_stride, INT64_MAX / 2},
    {"select stride 2^50", c_select_stride, INT64_C(1) << 50},
    {"select stride INT64_MIN", c_select_stride, INT64_MIN},
    {"select stride -1", c_select_stride, -1},
    {"select stride 0", c_select_stride, 0},
    {"select stride width-1", c_select_stride, 18},
    {"select plan NULL", c_select_arg, 0},
    {"select before update", c_select_arg, 1},
    {"select index_q NULL", c_select_arg, 2},
    {"select layer 2", c_select_arg, 3},
    {"select layer INT32_MIN", c_select_arg, 4},
    {"select wide stride", c_select_wide, 0},
    {"attention mode -1", c_attn_mode, -1},
    {"attention mode 2", c_attn_mode, 2},
    {"attention mode INT32_MIN", c_attn_mode, INT32_MIN},
    {"attention mode INT32_MAX", c_attn_mode, INT32_MAX},
    {"attention stride INT64_MAX", c_attn_stride, INT64_MAX},
    {"attention stride 2^47", c_attn_stride, INT64_C(1) << 47},
    {"attention stride INT64_MIN", c_attn_stride, INT64_MIN},
    {"attention stride 0", c_attn_stride, 0},
    {"attention plan NULL", c_attn_arg, 0},
    {"attention before update", c_attn_arg, 1},
    {"attention q NULL", c_attn_arg, 2},
    {"attention out NULL", c_attn_arg, 3},
    {"attention layer 8", c_attn_arg, 4},
    {"attention layer -1", c_attn_arg, 5},
    {"dense ignores stride INT64_MAX", c_attn_dense_ignores, INT64_MAX},
    {"dense ignores stride INT64_MIN", c_attn_dense_ignores, INT64_MIN},
    {"sparse out-of-range indices", c_attn_bad_indices, 0},
    {"select topk misaligned", c_select_misaligned, 0},
    {"select index_q misaligned", c_select_misaligned, 1},
    {"attention topk misaligned", c_select_misaligned, 2},
    {"attention q misaligned", c_select_misaligned, 3},
    {"attention out misaligned", c_select_misaligned, 4},
};

static void test_select_attention(void** state) {
  (void)state;
  RUN("select", k_select_cases);
}

/* ---------------------------------------------------------------------------------- */
/* Calibration                                                                         */
/* ---------------------------------------------------------------------------------- */

static void c_calib_kind(void) {
  qsakv_calib_kind k;
  int32_t v = (int32_t)P;
  memcpy(&k, &v, sizeof v);
  qsakv_calib_summary sum = {sizeof sum, QSAKV_CALIB_SUMMARY_VERSION};
  qsakv_calib_stats st = {sizeof st, QSAKV_CALIB_STATS_VERSION};
  if (P & 1)
    refuse(qsakv_calib_summarize(F.host, 3, k, &sum), QSAKV_ERROR_INVALID_ARGUMENT, "kind");
  refuse(qsakv_calib_get_stats(F.host, 3, k, &st, NULL), QSAKV_ERROR_INVALID_ARGUMENT, "kind");
}
static void c_calib_merge_mode(void) {
  qsakv_calib_merge_mode m;
  int32_t v = (int32_t)P;
  memcpy(&m, &v, sizeof v);
  const qsakv_calib* in[1] = {F.host};
  qsakv_calib* out = (qsakv_calib*)0x1;
  refuse_out(qsakv_calib_merge(&out, in, 1, m), QSAKV_ERROR_INVALID_ARGUMENT, "mode", &out);
}
static void c_calib_observe(void) {
  qsakv_calib* h = F.live;
  if (P >= 100) C_OK(qsakv_calib_start(h)); /* the same cases while counting */
  const void *k = F.kv_in, *v = F.kv_in;
  int64_t n = 8;
  int32_t layer = 3;
  const char* arg = "";
  switch (P % 100) {
    case 0:
      k = NULL;
      arg = "k";
      break; /* the issue's example: stopped, k NULL */
    case 1:
      v = NULL;
      arg = "v";
      break;
    case 2:
      n = -1;
      arg = "num_tokens";
      break;
    case 3:
      n = INT64_MAX;
      arg = "num_tokens";
      break;
    case 4:
      n = INT64_MIN;
      arg = "num_tokens";
      break;
    case 5:
      n = INT64_C(1) << 46;
      arg = "num_tokens";
      break;
    case 6:
      layer = 5;
      arg = "layer";
      break;
    case 7:
      layer = INT32_MAX;
      arg = "layer";
      break;
    default:
      report(V_WRONG, QSAKV_SUCCESS, "no such case");
  }
  qsakv_status s = qsakv_calib_observe(h, layer, k, v, n, NULL);
  /* Nothing was counted. */
  qsakv_calib* snap = NULL;
  C_OK(qsakv_calib_snapshot(&snap, h, NULL));
  qsakv_calib_stats st = {sizeof st, QSAKV_CALIB_STATS_VERSION};
  C_OK(qsakv_calib_get_stats(snap, 3, QSAKV_CALIB_K, &st, NULL));
  if (st.count != 0)
    report(V_WRONG, s, "a refused observe counted %llu values", (unsigned long long)st.count);
  refuse(s, QSAKV_ERROR_INVALID_ARGUMENT, arg);
}
static void c_calib_state(void) {
  qsakv_calib_stats st = {sizeof st, QSAKV_CALIB_STATS_VERSION};
  switch (P) {
    case 0:
      refuse(qsakv_calib_start(F.host), QSAKV_ERROR_STATE, "live");
    case 1:
      refuse(qsakv_calib_stop(F.host), QSAKV_ERROR_STATE, "live");
    case 2:
      refuse(qsakv_calib_observe(F.host, 3, F.kv_in, F.kv_in, 1, NULL), QSAKV_ERROR_STATE, "live");
    case 3:
      refuse(qsakv_calib_get_stats(F.live, 3, QSAKV_CALIB_K, &st, NULL), QSAKV_ERROR_STATE,
             "snapshot");
    case 4:
      refuse(qsakv_calib_save(F.live, tmp_path("s")), QSAKV_ERROR_STATE, "snapshot");
    case 5:
      refuse(qsakv_calib_allreduce(F.live, NULL, NULL), QSAKV_ERROR_INVALID_ARGUMENT, "nccl_comm");
    case 6:
      refuse(qsakv_calib_allreduce(F.live, (void*)0x10, NULL), QSAKV_ERROR_UNSUPPORTED, "CPU");
    case 7:
      refuse(qsakv_calib_allreduce(F.host, (void*)0x10, NULL), QSAKV_ERROR_STATE, "live");
    case 8:
      refuse(qsakv_calib_summarize(F.host, 3, QSAKV_CALIB_K, NULL), ANY_ERROR, "summary");
    default:
      report(V_WRONG, QSAKV_SUCCESS, "no such case");
  }
}
static void c_calib_null(void) {
  qsakv_calib* out = (qsakv_calib*)0x1;
  qsakv_calib_info info;
  memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  qsakv_model_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.struct_size = sizeof cfg;
  qsakv_model_config bad = F.cfg;
  bad.activation_dtype = (qsakv_dtype)7;
  switch (P) {
    case 0:
      refuse(qsakv_calib_create(NULL, F.ctx, &F.cfg), QSAKV_ERROR_INVALID_ARGUMENT, "out");
    case 1:
      refuse_out(qsakv_calib_create(&out, NULL, &F.cfg), QSAKV_ERROR_INVALID_ARGUMENT, "context",
                 &out);
    case 2:
      refuse_out(qsakv_calib_create(&out, F.ctx, NULL), QSAKV_ERROR_INVALID_ARGUMENT, "config",
                 &out);
    case 3:
      refuse_out(qsakv_calib_create(&out, F.ctx, &bad), QSAKV_ERROR_INVALID_CONFIG,
                 "activation_dtype", &out);
    case 4:
      refuse(qsakv_calib_start(NULL), QSAKV_ERROR_INVALID_ARGUMENT, "calib");
    case 5:
      refuse(qsakv_calib_stop(NULL), QSAKV_ERROR_INVALID_ARGUMENT, "calib");
    case 6:
      refuse(qsakv_calib_observe(NULL, 3, F.kv_in, F.kv_in, 1, NULL), QSAKV_ERROR_INVALID_ARGUMENT,
             "calib");
    case 7:
      refuse(qsakv_calib_snapshot(NULL, F.live, NULL), QSAKV_ERROR_INVALID_ARGUMENT, "out");
    case 8:
      refuse_out(qsakv_calib_snapshot(&out, NULL, NULL), QSAKV_ERROR_INVALID_ARGUMENT, "calib",
                 &out);
    case 9:
      refuse(qsakv_calib_get_info(NULL, &info), QSAKV_ERROR_INVALID_ARGUMENT, "calib");
    case 10:
      refuse(qsakv_calib_get_info(F.host, NULL), QSAKV_ERROR_INVALID_ARGUMENT, "info");
    case 11:
      info.struct_size = 0;
      refuse(qsakv_calib_get_info(F.host, &info), QSAKV_ERROR_INVALID_ARGUMENT, "struct_size");
    case 12:
      refuse(qsakv_calib_get_config(F.host, NULL), QSAKV_ERROR_INVALID_ARGUMENT, "config");
    case 13:
      refuse(qsakv_calib_get_config(NULL, &cfg), QSAKV_ERROR_INVALID_ARGUMENT, "calib");
    case 14:
      refuse(qsakv_calib_get_stats(F.host, 3, QSAKV_CALIB_K, NULL, NULL),
             QSAKV_ERROR_INVALID_ARGUMENT, "stats");
    case 15:
      refuse(qsakv_calib_get_stats(F.host, 2, QSAKV_CALIB_K, NULL, NULL),
             QSAKV_ERROR_INVALID_ARGUMENT, "layer");
    case 16:
      refuse(qsakv_calib_save(F.host, NULL), QSAKV_ERROR_INVALID_ARGUMENT, "path");
    case 17:
      refuse(qsakv_calib_save(F.host, ""), QSAKV_ERROR_INVALID_ARGUMENT, "path");
    case 18:
      refuse(qsakv_calib_save(F.host, F.stats_wrap), QSAKV_ERROR_INVALID_ARGUMENT, "exists");
    case 19:
      refuse(qsakv_calib_load(NULL, F.stats_wrap), QSAKV_ERROR_INVALID_ARGUMENT, "out");
    case 20:
      refuse_out(qsakv_calib_load(&out, NULL), QSAKV_ERROR_INVALID_ARGUMENT, "path", &out);
    case 21:
      refuse_out(qsakv_calib_load(&out, ""), QSAKV_ERROR_INVALID_ARGUMENT, "path", &out);
    case 22:
      refuse_out(qsakv_calib_load(&out, tmp_path("missing")), QSAKV_ERROR_IO, "missing", &out);
    case 23:
      refuse(qsakv_calib_merge(NULL, NULL, 1, QSAKV_CALIB_MERGE_RANKS),
             QSAKV_ERROR_INVALID_ARGUMENT, "out");
    case 24:
      refuse_out(qsakv_calib_merge(&out, NULL, 1, QSAKV_CALIB_MERGE_RANKS),
                 QSAKV_ERROR_INVALID_ARGUMENT, "inputs", &out);
    case 25: {
      const qsakv_calib* in[2] = {F.host, F.host};
      refuse_out(qsakv_calib_merge(&out, in, 0, QSAKV_CALIB_MERGE_RANKS),
                 QSAKV_ERROR_INVALID_ARGUMENT, "num_inputs", &out);
    }
    case 26: {
      const qsakv_calib* in[2] = {F.host, F.host};
      refuse_out(qsakv_calib_merge(&out, in, INT32_MIN, QSAKV_CALIB_MERGE_ENVELOPE),
                 QSAKV_ERROR_INVALID_ARGUMENT, "num_inputs", &out);
    }
    case 27: {
      const qsakv_calib* in[2] = {F.host, NULL};
      refuse_out(qsakv_calib_merge(&out, in, 2, QSAKV_CALIB_MERGE_RANKS),
                 QSAKV_ERROR_INVALID_ARGUMENT, "inputs[1]", &out);
    }
    case 28: {
      const qsakv_calib* in[2] = {F.host, F.live};
      refuse_out(qsakv_calib_merge(&out, in, 2, QSAKV_CALIB_MERGE_RANKS), QSAKV_ERROR_STATE,
                 "snapshot", &out);
    }
    case 29: {
      const qsakv_calib* in[2] = {F.host, F.host}; /* the same rank twice */
      refuse_out(qsakv_calib_merge(&out, in, 2, QSAKV_CALIB_MERGE_RANKS),
                 QSAKV_ERROR_INVALID_ARGUMENT, "rank", &out);
    }
    case 30:
      refuse(qsakv_calib_scale_from_max(1.0f, NULL), QSAKV_ERROR_INVALID_ARGUMENT, "scale");
    case 31:
      refuse(qsakv_calib_write_overlay(F.host, NULL, NULL), QSAKV_ERROR_INVALID_ARGUMENT,
             "out_dir");
    case 32:
      refuse(qsakv_calib_write_overlay(F.host, "", NULL), QSAKV_ERROR_INVALID_ARGUMENT, "out_dir");
    case 33:
      refuse(qsakv_calib_write_overlay(F.host, tmp_path("o"), NULL), QSAKV_ERROR_INVALID_ARGUMENT,
             "options");
    case 34: {
      qsakv_overlay_write_options wo;
      qsakv_overlay_write_options_init(&wo);
      wo.version = 0xDEADBEEF;
      refuse(qsakv_calib_write_overlay(F.host, tmp_path("o"), &wo), QSAKV_ERROR_INVALID_ARGUMENT,
             "version");
    }
    case 35:
      refuse(qsakv_calib_summarize(NULL, 3, QSAKV_CALIB_K, NULL), QSAKV_ERROR_INVALID_ARGUMENT,
             "calib");
    case 36: {
      qsakv_calib_summary sum;
      memset(&sum, 0, sizeof sum);
      sum.struct_size = sizeof sum;
      refuse(qsakv_calib_summarize(F.host, INT32_MIN, QSAKV_CALIB_K, &sum),
             QSAKV_ERROR_INVALID_ARGUMENT, "layer");
    }
    default:
      report(V_WRONG, QSAKV_SUCCESS, "no such case");
  }
}
static void c_calib_scale(void) {
  const float vals[] = {NAN, INFINITY, -INFINITY, -1.0f, 0.0f, -0.0f};
  float s = 123.0f;
  qsakv_status st = qsakv_calib_scale_from_max(vals[P], &s);
  if (st != QSAKV_SUCCESS && s != 123.0f) report(V_WRONG, st, "scale written despite the refusal");
  refuse(st, QSAKV_ERROR_OVERLAY_BAD_SCALE, "max");
}
static void c_calib_scale_extreme(void) {
  const float vals[] = {FLT_MIN, 1e-45f, FLT_MAX, 448.0f};
  float s = 0;
  qsakv_status st = qsakv_calib_scale_from_max(vals[P], &s);
  const int ok = isfinite(s) && s > 0 && (double)s * 448.0 >= (double)vals[P];
  correct(st, ok, "scale of an extreme finite maximum covers it");
}

/* Two valid rank files whose counts are 2^63 each: the merge would wrap to 0. */
static void c_calib_wrap_merge(void) {
  qsakv_calib *a = NULL, *b = NULL, *out = (qsakv_calib*)0x1;
  C_OK(qsakv_calib_load(&a, F.stats_big[0]));
  C_OK(qsakv_calib_load(&b, F.stats_big[1]));
  const qsakv_calib* in[2] = {a, b};
  refuse_out(qsakv_calib_merge(&out, in, 2, QSAKV_CALIB_MERGE_RANKS), QSAKV_ERROR_INVALID_ARGUMENT,
             "count", &out);
}
/* Each file alone is valid: summarising one rank reports its 2^63 values. */
static void c_calib_big_alone(void) {
  qsakv_calib* a = NULL;
  qsakv_status s = qsakv_calib_load(&a, F.stats_big[0]);
  qsakv_calib_stats st = {sizeof st, QSAKV_CALIB_STATS_VERSION};
  const int ok = s == QSAKV_SUCCESS &&
                 qsakv_calib_get_stats(a, 7, QSAKV_CALIB_V, &st, NULL) == QSAKV_SUCCESS &&
                 st.count == (UINT64_C(1) << 63) && st.nonzero_count == st.count;
  correct(s, ok, "a rank file with 2^63 values loads with its counts");
}
static void c_calib_wrap_file(void) {
  qsakv_calib* out = (qsakv_calib*)0x1;
  refuse_out(qsakv_calib_load(&out, F.stats_wrap), QSAKV_ERROR_FORMAT, "histogram", &out);
}

static const struct acase k_calib_cases[] = {
    {"get_stats kind -1", c_calib_kind, -2},
    {"summarize kind -1", c_calib_kind, -1},
    {"get_stats kind 2", c_calib_kind, 2},
    {"summarize kind 3", c_calib_kind, 3},
    {"summarize kind INT32_MIN+1", c_calib_kind, INT32_MIN + 1},
    {"get_stats kind INT32_MIN", c_calib_kind, INT32_MIN},
    {"summarize kind INT32_MAX", c_calib_kind, INT32_MAX},
    {"merge mode -1", c_calib_merge_mode, -1},
    {"merge mode 2", c_calib_merge_mode, 2},
    {"merge mode INT32_MIN", c_calib_merge_mode, INT32_MIN},
    {"merge mode INT32_MAX", c_calib_merge_mode, INT32_MAX},
    {"observe stopped k NULL", c_calib_observe, 0},
    {"observe stopped v NULL", c_calib_observe, 1},
    {"observe stopped num_tokens -1", c_calib_observe, 2},
    {"observe stopped num_tokens INT64_MAX", c_calib_observe, 3},
    {"observe stopped num_tokens INT64_MIN", c_calib_observe, 4},
    {"observe stopped num_tokens 2^46", c_calib_observe, 5},
    {"observe stopped layer 5", c_calib_observe, 6},
    {"observe stopped layer INT32_MAX", c_calib_observe, 7},
    {"observe started k NULL", c_calib_observe, 100},
    {"observe started v NULL", c_calib_observe, 101},
    {"observe started num_tokens -1", c_calib_observe, 102},
    {"observe started num_tokens INT64_MAX", c_calib_observe, 103},
    {"observe started num_tokens INT64_MIN", c_calib_observe, 104},
    {"observe started num_tokens 2^46", c_calib_observe, 105},
    {"observe started layer 5", c_calib_observe, 106},
    {"observe started layer INT32_MAX", c_calib_observe, 107},
    {"start on a host copy", c_calib_state, 0},
    {"stop on a host copy", c_calib_state, 1},
    {"observe on a host copy", c_calib_state, 2},
    {"get_stats on a live handle", c_calib_state, 3},
    {"save a live handle", c_calib_state, 4},
    {"allreduce comm NULL", c_calib_state, 5},
    {"allreduce on CPU", c_calib_state, 6},
    {"allreduce on a host copy", c_calib_state, 7},
    {"summarize summary NULL", c_calib_state, 8},
#define NULLCASE(i) \
  { "argument case " #i, c_calib_null, i }
    NULLCASE(0),
    NULLCASE(1),
    NULLCASE(2),
    NULLCASE(3),
    NULLCASE(4),
    NULLCASE(5),
    NULLCASE(6),
    NULLCASE(7),
    NULLCASE(8),
    NULLCASE(9),
    NULLCASE(10),
    NULLCASE(11),
    NULLCASE(12),
    NULLCASE(13),
    NULLCASE(14),
    NULLCASE(15),
    NULLCASE(16),
    NULLCASE(17),
    NULLCASE(18),
    NULLCASE(19),
    NULLCASE(20),
    NULLCASE(21),
    NULLCASE(22),
    NULLCASE(23),
    NULLCASE(24),
    NULLCASE(25),
    NULLCASE(26),
    NULLCASE(27),
    NULLCASE(28),
    NULLCASE(29),
    NULLCASE(30),
    NULLCASE(31),
    NULLCASE(32),
    NULLCASE(33),
    NULLCASE(34),
    NULLCASE(35),
    NULLCASE(36),
#undef NULLCASE
    {"scale_from_max nan", c_calib_scale, 0},
    {"scale_from_max inf", c_calib_scale, 1},
    {"scale_from_max -inf", c_calib_scale, 2},
    {"scale_from_max -1", c_calib_scale, 3},
    {"scale_from_max 0", c_calib_scale, 4},
    {"scale_from_max -0", c_calib_scale, 5},
    {"scale_from_max FLT_MIN", c_calib_scale_extreme, 0},
    {"scale_from_max denormal", c_calib_scale_extreme, 1},
    {"scale_from_max FLT_MAX", c_calib_scale_extreme, 2},
    {"scale_from_max 448", c_calib_scale_extreme, 3},
    {"merge of 2^63 + 2^63 counts", c_calib_wrap_merge, 0},
    {"a 2^63-count rank file alone", c_calib_big_alone, 0},
    {"stats file whose histogram wraps", c_calib_wrap_file, 0},
};

static void test_calib(void** state) {
  (void)state;
  RUN("calib", k_calib_cases);
}

/* ---------------------------------------------------------------------------------- */
/* Overlays, revisions, materialize, consensus, crafted files                          */
/* ---------------------------------------------------------------------------------- */

static qsakv_overlay_write_options write_opts(void) {
  qsakv_overlay_write_options o;
  qsakv_overlay_write_options_init(&o);
  o.base_index_path = F.index;
  return o;
}

static void c_ov_write(void) {
  qsakv_overlay_write_options o = write_opts();
  int32_t layers[2] = {3, 7};
  float k[2] = {0.5f, 0.5f}, v[2] = {0.5f, 0.5f};
  int32_t n = 2;
  int32_t iv;
  qsakv_status want = QSAKV_ERROR_INVALID_ARGUMENT;
  const char* arg = "";
  switch (P) {
    case 0:
      iv = -1;
      memcpy(&o.contract_activation_dtype, &iv, 4);
      arg = "contract_activation_dtype";
      break;
    case 1:
      iv = INT32_MAX;
      memcpy(&o.contract_activation_dtype, &iv, 4);
      arg = "contract_activation_dtype";
      break;
    case 2:
      iv = INT32_MIN;
      memcpy(&o.contract_activation_dtype, &iv, 4);
      arg = "contract_activation_dtype";
      break;
    case 3:
      o.contract_activation_dtype = QSAKV_DTYPE_E4M3;
      arg = "contract_activation_dtype";
      break;
    case 4:
      o.version = 0xDEADBEEF;
      arg = "version";
      break;
    case 5:
      o.version = 0;
      arg = "version";
      break;
    case 6:
      o.struct_size = 0;
      arg = "struct_size";
      break;
    case 7:
      o.contract_tp_size = -1;
      arg = "contract_tp_size";
      break;
    case 8:
      o.contract_speculative_tokens = -2;
      arg = "contract_speculative_tokens";
      break;
    case 9:
      o.contract_speculative_tokens = INT32_MAX;
      arg = "contract_speculative_tokens";
      break;
    case 10:
      o.contract_min_sm = -1;
      arg = "contract_min_sm";
      break;
    case 11:
      o.unit_scale_control = 2;
      arg = "unit_scale_control";
      break;
    case 12:
      o.layer_prefix = "";
      arg = "layer_prefix";
      break;
    case 13:
      o.layer_prefix = "model..layers";
      arg = "layer_prefix";
      break;
    case 14:
      o.layer_prefix = "model.\xff\xfe";
      arg = "layer_prefix";
      break;
    case 15:
      o.base_index_path = NULL;
      arg = "base_index_path";
      break;
    case 16:
      o.base_index_path = "";
      arg = "base_index_path";
      break;
    case 17:
      n = 0;
      arg = "num_layers";
      break;
    case 18:
      n = -1;
      arg = "num_layers";
      break;
    case 19:
      n = INT32_MAX;
      arg = "num_layers";
      break;
    case 20:
      n = INT32_MIN;
      arg = "num_layers";
      break;
    case 21:
      layers[0] = -1;
      arg = "layers[0]";
      break;
    case 22:
      layers[1] = 3;
      want = QSAKV_ERROR_OVERLAY_DUPLICATE;
      arg = "layer 3";
      break;
    case 23:
      k[0] = NAN;
      want = QSAKV_ERROR_OVERLAY_BAD_SCALE;
      arg = "k_scale";
      break;
    case 24:
      v[1] = -1.0f;
      want = QSAKV_ERROR_OVERLAY_BAD_SCALE;
      arg = "v_scale";
      break;
    case 25:
      k[1] = INFINITY;
      want = QSAKV_ERROR_OVERLAY_BAD_SCALE;
      arg = "k_scale";
      break;
    case 26:
      v[0] = 0.0f;
      want = QSAKV_ERROR_OVERLAY_BAD_SCALE;
      arg = "v_scale";
      break;
    default:
      report(V_WRONG, QSAKV_SUCCESS, "no such case");
  }
  const char* out = tmp_path("pack");
  qsakv_status s = qsakv_overlay_write(out, layers, k, v, n, &o);
  struct stat st;
  if (s != QSAKV_SUCCESS && lstat(out, &st) == 0)
    report(V_WRONG, s, "a refused write left %s", out);
  refuse(s, want, arg);
}
static void c_ov_args(void) {
  qsakv_overlay* ov = (qsakv_overlay*)0x1;
  const int32_t layers[2] = {3, 7};
  const float k[2] = {1, 1};
  qsakv_overlay_write_options o = write_opts();
  qsakv_overlay_info info;
  memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  float ks, vs;
  char hex[65];
  switch (P) {
    case 0:
      refuse(qsakv_overlay_load(NULL, F.pack, NULL), QSAKV_ERROR_INVALID_ARGUMENT, "out");
    case 1:
      refuse_out(qsakv_overlay_load(&ov, NULL, NULL), QSAKV_ERROR_INVALID_ARGUMENT, "path", &ov);
    case 2:
      refuse_out(qsakv_overlay_load(&ov, "", NULL), QSAKV_ERROR_INVALID_ARGUMENT, "path", &ov);
    case 3:
      refuse_out(qsakv_overlay_load(&ov, F.pack, ""), QSAKV_ERROR_INVALID_ARGUMENT, "manifest_path",
                 &ov);
    case 4:
      refuse_out(qsakv_overlay_load(&ov, tmp_path("nothing"), NULL), QSAKV_ERROR_OVERLAY_MISSING,
                 "nothing", &ov);
    case 5:
      refuse(qsakv_overlay_validate(NULL, &F.cfg, F.rev), QSAKV_ERROR_INVALID_ARGUMENT, "overlay");
    case 6:
      refuse(qsakv_overlay_validate(F.overlay, &F.cfg, NULL), QSAKV_ERROR_INVALID_ARGUMENT,
             "expected_base_revision");
    case 7:
      refuse(qsakv_overlay_validate(F.overlay, NULL, F.rev), QSAKV_ERROR_INVALID_ARGUMENT,
             "config");
    case 8: {
      qsakv_model_config c = F.cfg;
      c.version = 0xDEADBEEF;
      refuse(qsakv_overlay_validate(F.overlay, &c, F.rev), QSAKV_ERROR_INVALID_CONFIG, "version");
    }
    case 9:
      refuse(qsakv_overlay_validate(F.overlay, &F.cfg, "not-a-revision"),
             QSAKV_ERROR_INVALID_ARGUMENT, "expected_base_revision");
    case 10:
      refuse(qsakv_overlay_get_info(NULL, &info), QSAKV_ERROR_INVALID_ARGUMENT, "overlay");
    case 11:
      refuse(qsakv_overlay_get_info(F.overlay, NULL), QSAKV_ERROR_INVALID_ARGUMENT, "info");
    case 12:
      info.struct_size = 3;
      refuse(qsakv_overlay_get_info(F.overlay, &info), QSAKV_ERROR_INVALID_ARGUMENT, "struct_size");
    case 13:
      refuse(qsakv_overlay_get_scales(NULL, 3, &ks, &vs), QSAKV_ERROR_INVALID_ARGUMENT, "overlay");
    case 14:
      refuse(qsakv_overlay_get_scales(F.overlay, 3, NULL, &vs), QSAKV_ERROR_INVALID_ARGUMENT,
             "k_scale");
    case 15:
      refuse(qsakv_overlay_get_scales(F.overlay, 3, &ks, NULL), QSAKV_ERROR_INVALID_ARGUMENT,
             "v_scale");
    case 16:
      refuse(qsakv_overlay_get_scales(F.overlay, INT32_MIN, &ks, &vs), QSAKV_ERROR_INVALID_ARGUMENT,
             "layer");
    case 17:
      refuse(qsakv_overlay_write(NULL, layers, k, k, 2, &o), QSAKV_ERROR_INVALID_ARGUMENT,
             "out_dir");
    case 18:
      refuse(qsakv_overlay_write("", layers, k, k, 2, &o), QSAKV_ERROR_INVALID_ARGUMENT, "out_dir");
    case 19:
      refuse(qsakv_overlay_write(tmp_path("p"), NULL, k, k, 2, &o), QSAKV_ERROR_INVALID_ARGUMENT,
             "layers");
    case 20:
      refuse(qsakv_overlay_write(tmp_path("p"), layers, NULL, k, 2, &o),
             QSAKV_ERROR_INVALID_ARGUMENT, "k_scales");
    case 21:
      refuse(qsakv_overlay_write(tmp_path("p"), layers, k, NULL, 2, &o),
             QSAKV_ERROR_INVALID_ARGUMENT, "v_scales");
    case 22:
      refuse(qsakv_overlay_write(tmp_path("p"), layers, k, k, 2, NULL),
             QSAKV_ERROR_INVALID_ARGUMENT, "options");
    case 23:
      refuse(qsakv_overlay_write(F.pack, layers, k, k, 2, &o), QSAKV_ERROR_INVALID_ARGUMENT,
             "exists");
    case 24:
      refuse(qsakv_checkpoint_revision(NULL, hex), QSAKV_ERROR_INVALID_ARGUMENT, "path");
    case 25:
      refuse(qsakv_checkpoint_revision("", hex), QSAKV_ERROR_INVALID_ARGUMENT, "path");
    case 26:
      refuse(qsakv_checkpoint_revision(F.base, NULL), QSAKV_ERROR_INVALID_ARGUMENT, "out_hex");
    case 27:
      refuse(qsakv_checkpoint_revision(tmp_path("none"), hex), QSAKV_ERROR_IO, "none");
    case 28:
      refuse(qsakv_overlay_materialize(NULL, F.base, F.pack), QSAKV_ERROR_INVALID_ARGUMENT,
             "out_dir");
    case 29:
      refuse(qsakv_overlay_materialize("", F.base, F.pack), QSAKV_ERROR_INVALID_ARGUMENT,
             "out_dir");
    case 30:
      refuse(qsakv_overlay_materialize(tmp_path("m"), NULL, F.pack), QSAKV_ERROR_INVALID_ARGUMENT,
             "base_checkpoint_dir");
    case 31:
      refuse(qsakv_overlay_materialize(tmp_path("m"), "", F.pack), QSAKV_ERROR_INVALID_ARGUMENT,
             "base_checkpoint_dir");
    case 32:
      refuse(qsakv_overlay_materialize(tmp_path("m"), F.base, NULL), QSAKV_ERROR_INVALID_ARGUMENT,
             "scale_pack_dir");
    case 33:
      refuse(qsakv_overlay_materialize(tmp_path("m"), F.base, ""), QSAKV_ERROR_INVALID_ARGUMENT,
             "scale_pack_dir");
    case 34:
      refuse(qsakv_tp_consensus(NULL, &F.cfg, NULL, (void*)0x10, NULL),
             QSAKV_ERROR_INVALID_ARGUMENT, "context");
    case 35:
      refuse(qsakv_tp_consensus(F.ctx, &F.cfg, NULL, NULL, NULL), QSAKV_ERROR_INVALID_ARGUMENT,
             "nccl_comm");
    case 36:
      refuse(qsakv_tp_consensus(F.ctx, NULL, NULL, (void*)0x10, NULL), QSAKV_ERROR_INVALID_ARGUMENT,
             "config");
    case 37:
      refuse(qsakv_tp_consensus(F.ctx, &F.cfg, NULL, (void*)0x10, NULL), QSAKV_ERROR_UNSUPPORTED,
             "CPU");
    default:
      report(V_WRONG, QSAKV_SUCCESS, "no such case");
  }
}

/* A safetensors file whose header is `json`, for calib_load (whose parser sees the header
 * first). */
static void write_safetensors(const char* path, const char* json, size_t n) {
  char* f = malloc(n + 8);
  for (int i = 0; i < 8; ++i) f[i] = (char)(((uint64_t)n >> (8 * i)) & 0xff);
  memcpy(f + 8, json, n);
  write_text(path, f, n + 8);
  free(f);
}
static long maxrss_kib(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss;
}
/* JSON bombs: deep nesting or a huge flat array, within the header size limit. The parse
 * must stop early with FORMAT and bounded memory. */
static void c_json_bomb(void) {
  const size_t depth = 10u << 20; /* 10 Mi levels: 20 MB of JSON */
  const size_t flat = 5u << 20;   /* 5 Mi values: 10 MB of JSON */
  size_t n = 0;
  char* j;
  const char* arg;
  if (P == 0 || P == 2) {
    j = malloc(2 * depth + 16);
    n += (size_t)sprintf(j, "{\"a\":");
    memset(j + n, '[', depth);
    n += depth;
    memset(j + n, ']', depth);
    n += depth;
    j[n++] = '}';
    arg = "deeper";
  } else {
    j = malloc(2 * flat + 16);
    n += (size_t)sprintf(j, "{\"a\":[");
    for (size_t i = 0; i < flat; ++i) {
      j[n++] = '0';
      j[n++] = ',';
    }
    j[n - 1] = ']';
    j[n++] = '}';
    arg = "JSON values";
  }
  const long before = maxrss_kib();
  qsakv_status s;
  if (P < 2) {
    const char* path = tmp_path("bomb.safetensors");
    write_safetensors(path, j, n);
    free(j);
    qsakv_calib* out = (qsakv_calib*)0x1;
    s = qsakv_calib_load(&out, path);
    if (out) report(V_WRONG, s, "*out non-NULL after a refusal");
  } else { /* a base checkpoint whose index is the bomb */
    const char* base = tmp_path("bombbase");
    mkdir(base, 0755);
    char index[600];
    snprintf(index, sizeof index, "%s/model.safetensors.index.json", base);
    write_text(index, j, n);
    free(j);
    char out[600];
    snprintf(out, sizeof out, "%s.out", base);
    s = qsakv_overlay_materialize(out, base, F.pack);
  }
  const long grown_mib = (maxrss_kib() - before) / 1024;
  if (grown_mib > 400)
    report(V_WRONG, s, "refusing the bomb cost %ld MiB (%s)", grown_mib, qsakv_last_error());
  refuse(s, QSAKV_ERROR_FORMAT, arg);
}
/* A header just inside the JSON limits whose array holds 2 Mi objects: parsing must be
 * linear (a parser that rescans the array per element took hours) and end in the
 * safetensors rule it breaks. */
static void c_json_wide(void) {
  const size_t n = (1u << 21) - 3; /* + root, key and array: exactly the value limit */
  char* j = malloc(3 * n + 16);
  size_t len = (size_t)sprintf(j, "{\"a\":[");
  for (size_t i = 0; i < n; ++i) {
    memcpy(j + len, "{},", 3);
    len += 3;
  }
  j[len - 1] = ']';
  j[len++] = '}';
  const char* path = tmp_path("wide.safetensors");
  write_safetensors(path, j, len);
  free(j);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  qsakv_calib* out = (qsakv_calib*)0x1;
  qsakv_status s = qsakv_calib_load(&out, path);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  const double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
  if (secs > 30) report(V_WRONG, s, "refusing took %.1f s", secs);
  refuse_out(s, QSAKV_ERROR_FORMAT, "\"a\"", &out);
}
/* A base directory whose name is not UTF-8: refused clearly (never INTERNAL); the same
 * base under a UTF-8 name materialises. */
static void c_materialize_non_utf8(void) {
  char base[600], index[700], out[700];
  snprintf(base, sizeof base, "%s", tmp_path(P ? "base-\xc3\xa9" : "base-\xff\xfe"));
  mkdir(base, 0755);
  snprintf(index, sizeof index, "%s/model.safetensors.index.json", base);
  write_text(index, kIndex, strlen(kIndex));
  snprintf(out, sizeof out, "%s/out-%d", F.dir, (int)getpid());
  qsakv_status s = qsakv_overlay_materialize(out, base, F.pack);
  if (P == 0) refuse(s, QSAKV_ERROR_INVALID_ARGUMENT, "base_checkpoint_dir");
  char prov[800];
  snprintf(prov, sizeof prov, "%s/qsakv-provenance.json", out);
  struct stat st;
  correct(s, stat(prov, &st) == 0, "a UTF-8 non-ASCII base name materialises");
}
/* The owner record a staging directory holds (see src/core/format/file_io.cpp). */
static void owner_record(char* buf, size_t cap, pid_t pid) {
  char host[256] = {0}, boot[128] = {0}, ns[128] = {0};
  gethostname(host, sizeof host - 1);
  FILE* f = fopen("/proc/sys/kernel/random/boot_id", "r");
  if (f) {
    if (!fgets(boot, sizeof boot, f)) boot[0] = 0;
    fclose(f);
  }
  size_t bl = strlen(boot);
  while (bl > 0 && (boot[bl - 1] == '\n' || boot[bl - 1] == ' ')) boot[--bl] = 0;
  if (readlink("/proc/self/ns/pid", ns, sizeof ns - 1) < 0) ns[0] = 0;
  snprintf(buf, cap, "pid %lld\nhost %s\nboot %s\npidns %s\n", (long long)pid, host, boot, ns);
}
/* A SIGKILLed materialize leaves "<out>.staging-XXXXXX": the next one to the same
 * destination removes it when its owner is gone, and leaves anything else alone. */
static void c_stale_staging(void) {
  char out[600], stale[700], foreign[700], live[700], rec[1024], p[800];
  snprintf(out, sizeof out, "%s/ckpt-%d", F.dir, (int)getpid());
  snprintf(stale, sizeof stale, "%s.staging-Ab12Cd", out);
  snprintf(foreign, sizeof foreign, "%s.staging-Zz99Yy", out);
  snprintf(live, sizeof live, "%s.staging-Li1ve0", out);
  /* A process that is gone: a child that exited and was reaped. */
  pid_t dead = fork();
  if (dead == 0) _exit(0);
  waitpid(dead, NULL, 0);
  mkdir(stale, 0755);
  owner_record(rec, sizeof rec, dead);
  snprintf(p, sizeof p, "%s/.qsakv-staging-owner", stale);
  write_text(p, rec, strlen(rec));
  snprintf(p, sizeof p, "%s/partial-file", stale);
  write_text(p, "x", 1);
  mkdir(foreign, 0755); /* no owner record: not ours to judge */
  mkdir(live, 0755);    /* owned by a live process (this one) */
  owner_record(rec, sizeof rec, getpid());
  snprintf(p, sizeof p, "%s/.qsakv-staging-owner", live);
  write_text(p, rec, strlen(rec));
  qsakv_status s = qsakv_overlay_materialize(out, F.base, F.pack);
  struct stat st;
  snprintf(p, sizeof p, "%s/.qsakv-staging-owner", out);
  const int ok = lstat(stale, &st) != 0 && lstat(foreign, &st) == 0 && lstat(live, &st) == 0 &&
                 lstat(p, &st) != 0; /* the published directory has no owner record */
  correct(s, ok, "stale staging removed, foreign and live ones kept");
}
/* metadata.total_size near 2^64: adding the scale file's size must not wrap. */
static void c_total_size_wrap(void) {
  const char* base = tmp_path("bigbase");
  mkdir(base, 0755);
  char index[600], out[600];
  snprintf(index, sizeof index, "%s/model.safetensors.index.json", base);
  const char* text = "{\"metadata\": {\"total_size\": 18446744073709551615}, \"weight_map\": {}}";
  write_text(index, text, strlen(text));
  /* A pack bound to this base. */
  qsakv_overlay_write_options o = write_opts();
  o.base_index_path = index;
  const int32_t layers[2] = {3, 7};
  const float k[2] = {1, 1};
  snprintf(out, sizeof out, "%s.pack", base);
  C_OK(qsakv_overlay_write(out, layers, k, k, 2, &o));
  char dest[700];
  snprintf(dest, sizeof dest, "%s.out", base);
  refuse(qsakv_overlay_materialize(dest, base, out), QSAKV_ERROR_FORMAT, "total_size");
}

static const struct acase k_overlay_cases[] = {
#define W(i) \
  { "write case " #i, c_ov_write, i }
    W(0),
    W(1),
    W(2),
    W(3),
    W(4),
    W(5),
    W(6),
    W(7),
    W(8),
    W(9),
    W(10),
    W(11),
    W(12),
    W(13),
    W(14),
    W(15),
    W(16),
    W(17),
    W(18),
    W(19),
    W(20),
    W(21),
    W(22),
    W(23),
    W(24),
    W(25),
    W(26),
#undef W
#define A(i) \
  { "argument case " #i, c_ov_args, i }
    A(0),
    A(1),
    A(2),
    A(3),
    A(4),
    A(5),
    A(6),
    A(7),
    A(8),
    A(9),
    A(10),
    A(11),
    A(12),
    A(13),
    A(14),
    A(15),
    A(16),
    A(17),
    A(18),
    A(19),
    A(20),
    A(21),
    A(22),
    A(23),
    A(24),
    A(25),
    A(26),
    A(27),
    A(28),
    A(29),
    A(30),
    A(31),
    A(32),
    A(33),
    A(34),
    A(35),
    A(36),
    A(37),
#undef A
    {"stats header nested 10 Mi deep", c_json_bomb, 0},
    {"stats header of 5 Mi values", c_json_bomb, 1},
    {"base index nested 10 Mi deep", c_json_bomb, 2},
    {"stats header of 2 Mi objects", c_json_wide, 0},
    {"materialize non-UTF-8 base", c_materialize_non_utf8, 0},
    {"materialize UTF-8 base", c_materialize_non_utf8, 1},
    {"materialize stale staging", c_stale_staging, 0},
    {"materialize total_size wraps", c_total_size_wrap, 0},
};

static void test_overlay(void** state) {
  (void)state;
  RUN("overlay", k_overlay_cases);
}

static void test_counts(void** state) {
  (void)state;
  printf(
      "[ adversarial ] cases tried: %d, refused cleanly: %d, succeeded correctly: %d, "
      "crashed: %d, wrong: %d\n",
      g_count.tried, g_count.refused, g_count.correct, g_count.crashed, g_count.wrong);
  assert_int_equal(g_count.crashed, 0);
  assert_int_equal(g_count.wrong, 0);
  assert_int_equal(g_count.tried, g_count.refused + g_count.correct);
}

static int setup(void** state) {
  (void)state;
  fixture_build();
  return 0;
}
static int teardown(void** state) {
  (void)state;
  fixture_destroy();
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_context), cmocka_unit_test(test_config),
      cmocka_unit_test(test_cache),   cmocka_unit_test(test_store),
      cmocka_unit_test(test_plan),    cmocka_unit_test(test_select_attention),
      cmocka_unit_test(test_calib),   cmocka_unit_test(test_overlay),
      cmocka_unit_test(test_counts),
  };
  tu_apply_filter();
  return cmocka_run_group_tests(tests, setup, teardown);
}
