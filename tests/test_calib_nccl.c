// SPDX-License-Identifier: Apache-2.0
#define _POSIX_C_SOURCE 200809L /* setenv */
/* qsakv_calib_allreduce over a real NCCL communicator of one rank (one GPU): the
 * reduction is the identity there, so the statistics must come back unchanged; plus
 * the refusals (a missing NCCL, a communicator of the wrong size, a second reduction).
 * Needs a GPU and NCCL; skips (exit 77) without a GPU. Built only where nccl.h and
 * libnccl are found; the library itself never links NCCL (it dlopens it). */
#include <stdlib.h>
#include <string.h>

#include <nccl.h>

#include "testutil.h"

#define MSG_HAS(text)                                                      \
  do {                                                                     \
    if (!strstr(qsakv_last_error(), (text)))                               \
      fail_msg("message \"%s\" lacks \"%s\"", qsakv_last_error(), (text)); \
  } while (0)

static void config(qsakv_model_config* c, int tp) {
  tu_small_config(c, 8, 2, 64, QSAKV_DTYPE_FP16, QSAKV_DTYPE_E4M3, 16);
  c->tp_size = tp;
  c->tp_rank = 0;
}

static ncclComm_t one_rank_comm(void) {
  ncclComm_t comm = NULL;
  int dev = 0;
  const ncclResult_t r = ncclCommInitAll(&comm, 1, &dev);
  if (r != ncclSuccess) fail_msg("ncclCommInitAll: %s", ncclGetErrorString(r));
  return comm;
}

/* Random FP16 data observed on both QSA layers (device copies). */
static void observe_random(qsakv_context* ctx, qsakv_calib* h, const qsakv_model_config* c) {
  const size_t row = (size_t)(c->num_kv_heads / c->tp_size) * (size_t)c->head_dim;
  const size_t tokens = 500, n = tokens * row;
  uint16_t* x = malloc(n * 2);
  for (int li = 0; li < 2; ++li) {
    for (size_t i = 0; i < n; ++i) x[i] = tu_f32_to_fp16((float)(tu_normal() * (li + 1)));
    void* d = tu_to_device(ctx, x, n * 2);
    assert_int_equal(qsakv_calib_observe(h, c->qsa_layers[li], d, d, (int64_t)tokens, NULL), 0);
    TU_OK(qsakv_stream_synchronize(ctx, NULL));
    qsakv_free(ctx, d);
  }
  free(x);
}

/* Runs first: before any successful load of NCCL in this process. */
static void test_missing_nccl(void** state) {
  (void)state;
  qsakv_context* ctx = tu_cuda_context_or_skip();
  qsakv_model_config c;
  config(&c, 1);
  qsakv_calib* h = NULL;
  TU_OK(qsakv_calib_create(&h, ctx, &c));
  /* The caller's own setting (a NCCL outside the loader's path) is put back for the
   * tests that load NCCL after this one. */
  char* saved = tu_env_save("QSAKV_NCCL_LIBRARY");
  setenv("QSAKV_NCCL_LIBRARY", "/nonexistent/libnccl.so.2", 1);
  TU_EXPECT_STATUS(qsakv_calib_allreduce(h, (void*)0x1, NULL), QSAKV_ERROR_NCCL);
  MSG_HAS("cannot load /nonexistent/libnccl.so.2");
  tu_env_restore("QSAKV_NCCL_LIBRARY", saved);
  qsakv_calib_info info;
  memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  TU_OK(qsakv_calib_get_info(h, &info));
  assert_int_equal(info.reduced, 0); /* a failed reduction changes nothing */
  qsakv_calib_destroy(h);
  qsakv_context_destroy(ctx);
}

static void test_allreduce_one_rank(void** state) {
  (void)state;
  qsakv_context* ctx = tu_cuda_context_or_skip();
  ncclComm_t comm = one_rank_comm();
  qsakv_model_config c;
  config(&c, 1);
  qsakv_calib* h = NULL;
  TU_OK(qsakv_calib_create(&h, ctx, &c));
  TU_OK(qsakv_calib_start(h));
  observe_random(ctx, h, &c);
  qsakv_calib *before = NULL, *after = NULL;
  TU_OK(qsakv_calib_snapshot(&before, h, NULL));
  TU_OK(qsakv_calib_allreduce(h, comm, NULL));
  TU_OK(qsakv_calib_snapshot(&after, h, NULL));
  static uint64_t hb[QSAKV_CALIB_BINS], ha[QSAKV_CALIB_BINS];
  for (int li = 0; li < 2; ++li)
    for (int kind = 0; kind < 2; ++kind) {
      qsakv_calib_stats sb, sa;
      memset(&sb, 0, sizeof sb);
      memset(&sa, 0, sizeof sa);
      sb.struct_size = sa.struct_size = sizeof sb;
      TU_OK(qsakv_calib_get_stats(before, c.qsa_layers[li], (qsakv_calib_kind)kind, &sb, hb));
      TU_OK(qsakv_calib_get_stats(after, c.qsa_layers[li], (qsakv_calib_kind)kind, &sa, ha));
      assert_true(sb.count > 0);
      assert_int_equal(sa.count, sb.count);
      assert_int_equal(sa.finite_count, sb.finite_count);
      assert_int_equal(sa.nonzero_count, sb.nonzero_count);
      assert_true(sa.max_abs == sb.max_abs);
      assert_memory_equal(ha, hb, sizeof ha);
    }
  qsakv_calib_info info;
  memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  TU_OK(qsakv_calib_get_info(after, &info));
  assert_int_equal(info.reduced, 1);
  assert_int_equal(info.complete, 1);
  /* Once only; and no more observing into global statistics. */
  TU_EXPECT_STATUS(qsakv_calib_allreduce(h, comm, NULL), QSAKV_ERROR_STATE);
  MSG_HAS("already all-reduced");
  TU_EXPECT_STATUS(qsakv_calib_observe(h, 3, NULL, NULL, 1, NULL), QSAKV_ERROR_STATE);
  qsakv_calib_summary sum;
  memset(&sum, 0, sizeof sum);
  sum.struct_size = sizeof sum;
  TU_OK(qsakv_calib_summarize(after, 7, QSAKV_CALIB_V, &sum));
  qsakv_calib_destroy(before);
  qsakv_calib_destroy(after);
  qsakv_calib_destroy(h);
  ncclCommDestroy(comm);
  qsakv_context_destroy(ctx);
}

static void test_comm_of_wrong_size(void** state) {
  (void)state;
  qsakv_context* ctx = tu_cuda_context_or_skip();
  ncclComm_t comm = one_rank_comm();
  qsakv_model_config c;
  config(&c, 2);
  qsakv_calib* h = NULL;
  TU_OK(qsakv_calib_create(&h, ctx, &c));
  TU_EXPECT_STATUS(qsakv_calib_allreduce(h, comm, NULL), QSAKV_ERROR_INVALID_ARGUMENT);
  MSG_HAS("has 1 rank(s)");
  TU_EXPECT_STATUS(qsakv_calib_allreduce(h, NULL, NULL), QSAKV_ERROR_INVALID_ARGUMENT);
  qsakv_calib_destroy(h);
  ncclCommDestroy(comm);
  qsakv_context_destroy(ctx);
}

/* qsakv_tp_consensus over a one-rank communicator: agreement passes; a config claiming
 * two ranks is refused with the numbering named. (Two or more ranks need a multi-GPU
 * machine: not run yet.) */
static void test_tp_consensus_one_rank(void** state) {
  (void)state;
  qsakv_context* ctx = tu_cuda_context_or_skip();
  ncclComm_t comm = one_rank_comm();
  qsakv_model_config c;
  config(&c, 1);
  TU_OK(qsakv_tp_consensus(ctx, &c, NULL, comm, NULL));
  c.num_kv_heads = 2;
  c.tp_size = 2; /* this process claims to be rank 0 of 2 */
  TU_EXPECT_STATUS(qsakv_tp_consensus(ctx, &c, NULL, comm, NULL), QSAKV_ERROR_TP_MISMATCH);
  MSG_HAS("the communicator has 1 ranks but rank 0 has tp_size 2");
  ncclCommDestroy(comm);
  qsakv_context_destroy(ctx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_missing_nccl),
      cmocka_unit_test(test_allreduce_one_rank),
      cmocka_unit_test(test_comm_of_wrong_size),
      cmocka_unit_test(test_tp_consensus_one_rank),
  };
  tu_seed();
  /* No GPU at all: the whole suite is skipped, visibly (CTest SKIP_RETURN_CODE 77), unless
   * QSAKV_REQUIRE_GPU=1; any other refusal of a CUDA context fails it (tu_cuda_absent_skips). */
  qsakv_context_options o;
  qsakv_context_options_init(&o);
  o.backend = QSAKV_BACKEND_CUDA;
  qsakv_context* probe = NULL;
  const qsakv_status s = qsakv_context_create(&probe, &o);
  if (s != QSAKV_SUCCESS) {
    const int skips = tu_cuda_absent_skips(s);
    fprintf(stderr, "[ %s ] test_calib_nccl: a CUDA context was refused with %s (%s)\n",
            skips ? "SKIP    " : " FAILED ", qsakv_status_string(s), qsakv_last_error());
    return skips ? 77 : 1;
  }
  qsakv_context_destroy(probe);
  return cmocka_run_group_tests_name("calib_nccl", tests, NULL, NULL);
}
