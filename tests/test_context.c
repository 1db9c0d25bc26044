// SPDX-License-Identifier: Apache-2.0
/* Backend choice, fallback, capability queries. */
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

static qsakv_context_info info_of(qsakv_context* ctx) {
  qsakv_context_info info = {sizeof info, QSAKV_CONTEXT_INFO_VERSION};
  TU_OK(qsakv_context_get_info(ctx, &info));
  return info;
}

static void test_cpu_backend(void** state) {
  (void)state;
  qsakv_context* ctx = tu_context(QSAKV_BACKEND_CPU);
  assert_non_null(ctx);
  qsakv_context_info info = info_of(ctx);
  assert_int_equal(info.backend, QSAKV_BACKEND_CPU);
  assert_int_equal(info.decoder, QSAKV_DECODER_SOFTWARE);
  assert_int_equal(info.device, -1);
  assert_int_equal(info.sm_version, 0);
  assert_int_equal(info.has_fp8_conversion, 0);
  assert_string_equal(info.fallback_reason, "");
  assert_int_equal(info.kernel_tier, QSAKV_KERNEL_TIER_NONE);
  qsakv_context_destroy(ctx);
}

/* Every value in bad[] makes context creation fail with INVALID_ARGUMENT, no context, and a
 * message naming the variable and one valid value (`hint`). */
static void expect_env_refused(const char* name, const char* const* bad, size_t n,
                               const char* hint) {
  for (size_t i = 0; i < n; ++i) {
    setenv(name, bad[i], 1);
    qsakv_context* ctx = NULL;
    assert_int_equal(qsakv_context_create(&ctx, NULL), QSAKV_ERROR_INVALID_ARGUMENT);
    assert_null(ctx);
    assert_non_null(strstr(qsakv_last_error(), name));
    assert_non_null(strstr(qsakv_last_error(), hint));
  }
}

/* Every value in good[] is taken by the CPU backend. */
static void expect_env_taken_on_cpu(const char* name, const char* const* good, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    setenv(name, good[i], 1);
    qsakv_context* ctx = tu_context(QSAKV_BACKEND_CPU);
    assert_non_null(ctx);
    assert_int_equal(info_of(ctx).kernel_tier, QSAKV_KERNEL_TIER_NONE);
    qsakv_context_destroy(ctx);
  }
}

/* A context on the CUDA backend (whatever the hook variables say); *gpu is NULL on failure. */
static qsakv_status cuda_context_create(qsakv_context** gpu) {
  qsakv_context_options o;
  qsakv_context_options_init(&o);
  o.backend = QSAKV_BACKEND_CUDA;
  *gpu = NULL;
  return qsakv_context_create(gpu, &o);
}

/* QSAKV_CUDA_TIER (the kernel-tier override for tests) is read at context creation and
 * checked on every backend, so a typo never silently tests the default tier. */
static void test_cuda_tier_variable(void** state) {
  (void)state;
  char* keep = tu_env_save("QSAKV_CUDA_TIER");
  const char* bad[] = {"bogus", "SM70", "sm80", "70", " sm70"};
  expect_env_refused("QSAKV_CUDA_TIER", bad, sizeof bad / sizeof bad[0], "sm70");
  /* Valid values: the CPU backend takes them and reports no kernel tier. */
  const char* good[] = {"", "auto", "sm70", "sm75"};
  expect_env_taken_on_cpu("QSAKV_CUDA_TIER", good, sizeof good / sizeof good[0]);
  /* On a GPU, sm70 is honoured whatever the GPU (SM70+), and reported. */
  setenv("QSAKV_CUDA_TIER", "sm70", 1);
  qsakv_context* gpu = tu_cuda_context_or_null("sm70 on a GPU");
  if (gpu) {
    qsakv_context_info info = info_of(gpu);
    assert_int_equal(info.kernel_tier, QSAKV_KERNEL_TIER_SM70);
    assert_int_equal(info.decoder, QSAKV_DECODER_SOFTWARE); /* no FP8 instructions */
    qsakv_context_destroy(gpu);
  }
  tu_env_restore("QSAKV_CUDA_TIER", keep);
}

/* An MMA-choice hook (auto, sync, wgmma): bad values are refused naming the variable, good
 * ones taken on the CPU backend; "wgmma" on a GPU either works (SM 9.0 with sm_90a code) or
 * is refused as unsupported, naming the variable and SM 9.0. */
static void check_mma_hook(const char* var) {
  char* keep = tu_env_save(var);
  const char* bad[] = {"bogus", "WGMMA", "mma", " sync", "wgmma,"};
  expect_env_refused(var, bad, sizeof bad / sizeof bad[0], "wgmma");
  const char* good[] = {"", "auto", "sync", "wgmma"};
  expect_env_taken_on_cpu(var, good, sizeof good / sizeof good[0]);
  setenv(var, "wgmma", 1);
  qsakv_context* gpu = NULL;
  const qsakv_status s = cuda_context_create(&gpu);
  if (tu_cuda_absent_skips(s)) { /* else NO_DEVICE fails at TU_OK below */
    print_message("[ SKIP     ] %s=wgmma on a GPU: no usable GPU\n", var);
  } else if (s == QSAKV_ERROR_UNSUPPORTED) { /* not SM 9.0, or no sm_90a code */
    assert_null(gpu);
    assert_non_null(strstr(qsakv_last_error(), var));
    assert_non_null(strstr(qsakv_last_error(), "SM 9.0"));
  } else {
    TU_OK(s);
    assert_int_equal(info_of(gpu).sm_version, 90);
    qsakv_context_destroy(gpu);
  }
  tu_env_restore(var, keep);
}

/* QSAKV_GROUPED_MMA (the grouped kernel's MMA, a test and benchmark hook) likewise: read at
 * context creation, checked on every backend; on a GPU, "wgmma" is honoured only where the
 * GPU and the build have the warpgroup-MMA kernel, and refused by name elsewhere. */
static void test_grouped_mma_variable(void** state) {
  (void)state;
  check_mma_hook("QSAKV_GROUPED_MMA");
}

/* QSAKV_SELECT_MMA (the multi-row selection scorer's MMA) likewise; that both MMAs give the
 * same selections is checked by test_select on an SM 9.0 GPU. */
static void test_select_mma_variable(void** state) {
  (void)state;
  check_mma_hook("QSAKV_SELECT_MMA");
}

/* QSAKV_DEPENDENT_LAUNCH (programmatic dependent launch, a benchmark hook) likewise: read at
 * context creation and checked on every backend. That the launch mode changes no result is
 * checked by the GPU suites (which run with it on an SM90 GPU) against
 * tools/output_digest.py's run with it off. */
static void test_dependent_launch_variable(void** state) {
  (void)state;
  char* keep = tu_env_save("QSAKV_DEPENDENT_LAUNCH");
  const char* bad[] = {"bogus",         "OFF",           "on",   "0", " off", "store,", ",select",
                       "store,,select", "attention,off", "Store"};
  expect_env_refused("QSAKV_DEPENDENT_LAUNCH", bad, sizeof bad / sizeof bad[0],
                     "auto, off or a comma-separated list");
  const char* good[] = {"", "auto", "off", "store", "select,attention", "attention,store,select"};
  expect_env_taken_on_cpu("QSAKV_DEPENDENT_LAUNCH", good, sizeof good / sizeof good[0]);
  /* On a GPU "off" and a family list are taken whatever its SM (before SM90 there is
   * nothing to turn on or off); the other hooks are unset meanwhile, so that one inherited
   * from the shell cannot refuse the context for its own reason. */
  char* keep_tier = tu_env_save("QSAKV_CUDA_TIER");
  char* keep_mma = tu_env_save("QSAKV_GROUPED_MMA");
  unsetenv("QSAKV_CUDA_TIER");
  unsetenv("QSAKV_GROUPED_MMA");
  const char* on_gpu[] = {"off", "store,select,attention"};
  for (size_t i = 0; i < sizeof on_gpu / sizeof on_gpu[0]; ++i) {
    setenv("QSAKV_DEPENDENT_LAUNCH", on_gpu[i], 1);
    qsakv_context* gpu = NULL;
    const qsakv_status s = cuda_context_create(&gpu);
    if (tu_cuda_absent_skips(s)) { /* else NO_DEVICE fails at TU_OK below */
      print_message("[ SKIP     ] QSAKV_DEPENDENT_LAUNCH=%s on a GPU: no usable GPU\n", on_gpu[i]);
    } else {
      TU_OK(s);
      qsakv_context_destroy(gpu);
    }
  }
  tu_env_restore("QSAKV_DEPENDENT_LAUNCH", keep);
  tu_env_restore("QSAKV_GROUPED_MMA", keep_mma);
  tu_env_restore("QSAKV_CUDA_TIER", keep_tier);
}

/* QSAKV_SELECT_STAGES (the scoring kernels alone, a benchmark hook) likewise. That "score"
 * launches no top-k is checked by test_select on a GPU. */
static void test_select_stages_variable(void** state) {
  (void)state;
  char* keep = tu_env_save("QSAKV_SELECT_STAGES");
  const char* bad[] = {"bogus", "Score", "ALL", "topk", " score", "score,", "0"};
  expect_env_refused("QSAKV_SELECT_STAGES", bad, sizeof bad / sizeof bad[0], "all or score");
  const char* good[] = {"", "all", "score"};
  expect_env_taken_on_cpu("QSAKV_SELECT_STAGES", good, sizeof good / sizeof good[0]);
  tu_env_restore("QSAKV_SELECT_STAGES", keep);
}

/* QSAKV_SELECT_SORT (the top-k's sort of the winners, a test and benchmark hook) likewise.
 * That every value gives the same selections is checked by test_select on a GPU. */
static void test_select_sort_variable(void** state) {
  (void)state;
  char* keep = tu_env_save("QSAKV_SELECT_SORT");
  const char* bad[] = {"bogus", "Runs", "BUCKETS", "bucket", " runs", "runs,buckets", "1"};
  expect_env_refused("QSAKV_SELECT_SORT", bad, sizeof bad / sizeof bad[0], "auto, runs or buckets");
  const char* good[] = {"", "auto", "runs", "buckets"};
  expect_env_taken_on_cpu("QSAKV_SELECT_SORT", good, sizeof good / sizeof good[0]);
  tu_env_restore("QSAKV_SELECT_SORT", keep);
}

static void test_auto_chooses_and_says_why(void** state) {
  (void)state;
  qsakv_context* ctx = NULL;
  TU_OK(qsakv_context_create(&ctx, NULL));
  qsakv_context_info info = info_of(ctx);
  assert_true(info.backend == QSAKV_BACKEND_CPU || info.backend == QSAKV_BACKEND_CUDA);
  if (info.backend == QSAKV_BACKEND_CPU) {
    /* AUTO fell back: it must say why. */
    assert_true(strlen(info.fallback_reason) > 0);
    print_message("AUTO chose CPU: %s\n", info.fallback_reason);
  } else {
    assert_true(info.sm_version >= 70);
    assert_int_equal(info.has_fp8_conversion, info.sm_version >= 89);
    /* The tier follows the GPU unless QSAKV_CUDA_TIER forces one. */
    const char* forced = getenv("QSAKV_CUDA_TIER");
    if (forced && strcmp(forced, "sm70") == 0)
      assert_int_equal(info.kernel_tier, QSAKV_KERNEL_TIER_SM70);
    else if (forced && strcmp(forced, "sm75") == 0)
      assert_int_equal(info.kernel_tier, QSAKV_KERNEL_TIER_SM75);
    else
      assert_int_equal(info.kernel_tier,
                       info.sm_version >= 75 ? QSAKV_KERNEL_TIER_SM75 : QSAKV_KERNEL_TIER_SM70);
    assert_string_equal(info.fallback_reason, "");
  }
  qsakv_context_destroy(ctx);
}

static void test_cuda_explicit(void** state) {
  (void)state;
  qsakv_context_options o;
  qsakv_context_options_init(&o);
  o.backend = QSAKV_BACKEND_CUDA;
  qsakv_context* ctx = NULL;
  qsakv_status s = qsakv_context_create(&ctx, &o);
  if (s == QSAKV_ERROR_NO_DEVICE) {
    /* No GPU: a clear refusal, never a silent CPU context. The GPU half below is skipped,
     * saying so (or fails under QSAKV_REQUIRE_GPU=1). */
    assert_null(ctx);
    assert_non_null(strstr(qsakv_last_error(), "CUDA"));
  }
  if (s != QSAKV_SUCCESS) tu_skip_or_fail_without_gpu(s, "the CUDA backend's decoders");
  qsakv_context_info info = info_of(ctx);
  assert_int_equal(info.backend, QSAKV_BACKEND_CUDA);
  assert_true(info.multiprocessor_count > 0);
  assert_true(info.device_memory_bytes > 0);
  qsakv_context_destroy(ctx);
  /* Forcing each decoder: software everywhere, hardware only on SM89+ and never on the
   * SM70 kernel tier (which has only the software decoder, as a V100 has). */
  o.decoder = QSAKV_DECODER_SOFTWARE;
  TU_OK(qsakv_context_create(&ctx, &o));
  assert_int_equal(info_of(ctx).decoder, QSAKV_DECODER_SOFTWARE);
  qsakv_context_destroy(ctx);
  o.decoder = QSAKV_DECODER_HARDWARE;
  s = qsakv_context_create(&ctx, &o);
  if (info.sm_version >= 89 && info.kernel_tier != QSAKV_KERNEL_TIER_SM70) {
    TU_OK(s);
    assert_int_equal(info_of(ctx).decoder, QSAKV_DECODER_HARDWARE);
    qsakv_context_destroy(ctx);
  } else {
    assert_int_equal(s, QSAKV_ERROR_UNSUPPORTED);
  }
}

static void test_bad_options(void** state) {
  (void)state;
  qsakv_context_options o;
  qsakv_context_options_init(&o);
  qsakv_context* ctx = NULL;
  o.backend = (qsakv_backend)7;
  TU_EXPECT_STATUS(qsakv_context_create(&ctx, &o), QSAKV_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(qsakv_last_error(), "backend"));
  qsakv_context_options_init(&o);
  o.decoder = (qsakv_decoder)9;
  TU_EXPECT_STATUS(qsakv_context_create(&ctx, &o), QSAKV_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(qsakv_last_error(), "decoder"));
  qsakv_context_options_init(&o);
  o.device = -1;
  TU_EXPECT_STATUS(qsakv_context_create(&ctx, &o), QSAKV_ERROR_INVALID_ARGUMENT);
  qsakv_context_options_init(&o);
  o.backend = QSAKV_BACKEND_CPU;
  o.decoder = QSAKV_DECODER_HARDWARE;
  TU_EXPECT_STATUS(qsakv_context_create(&ctx, &o), QSAKV_ERROR_UNSUPPORTED);
  TU_EXPECT_STATUS(qsakv_context_get_info(NULL, NULL), QSAKV_ERROR_INVALID_ARGUMENT);
}

static void test_memory_helpers(void** state) {
  (void)state;
  qsakv_context* ctx = tu_context(QSAKV_BACKEND_CPU);
  void* p = NULL;
  TU_EXPECT_STATUS(qsakv_malloc(ctx, &p, 0), QSAKV_ERROR_INVALID_ARGUMENT);
  TU_OK(qsakv_malloc(ctx, &p, 64));
  char src[64], dst[64];
  for (int i = 0; i < 64; ++i) src[i] = (char)i;
  TU_OK(qsakv_memcpy(ctx, p, src, 64, QSAKV_COPY_HOST_TO_DEVICE, NULL));
  TU_OK(qsakv_memcpy(ctx, dst, p, 64, QSAKV_COPY_DEVICE_TO_HOST, NULL));
  assert_memory_equal(src, dst, 64);
  TU_EXPECT_STATUS(qsakv_memcpy(ctx, dst, p, 64, (qsakv_copy_kind)0, NULL),
                   QSAKV_ERROR_INVALID_ARGUMENT);
  qsakv_free(ctx, p);
  qsakv_context_destroy(ctx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cpu_backend),
      cmocka_unit_test(test_auto_chooses_and_says_why),
      cmocka_unit_test(test_cuda_explicit),
      cmocka_unit_test(test_bad_options),
      cmocka_unit_test(test_memory_helpers),
      cmocka_unit_test(test_cuda_tier_variable),
      cmocka_unit_test(test_grouped_mma_variable),
      cmocka_unit_test(test_select_mma_variable),
      cmocka_unit_test(test_dependent_launch_variable),
      cmocka_unit_test(test_select_stages_variable),
      cmocka_unit_test(test_select_sort_variable),
  };
  return cmocka_run_group_tests_name("context", tests, NULL, NULL);
}
