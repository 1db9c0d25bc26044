// SPDX-License-Identifier: Apache-2.0
/* Shared test helpers: seeded random data, independent FP16/BF16/E4M3 oracles (FP64),
 * contexts for each backend, overlays for E4M3 caches. Nothing here calls into the
 * library's internals: the oracles are written independently of both backends. */
#ifndef QSAKV_TESTUTIL_H
#define QSAKV_TESTUTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#ifdef __cplusplus
extern "C" { /* cmocka.h declares no C linkage itself */
#endif
#include <cmocka.h>
#ifdef __cplusplus
}
#endif

#include "qsakv.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Seed from QSAKV_TEST_SEED or the clock; printed once so a failure can be replayed. */
uint64_t tu_seed(void);
uint64_t tu_next(void);
double tu_uniform(double lo, double hi); /* [lo, hi) */
double tu_normal(void);
int tu_int(int lo, int hi); /* [lo, hi] */

/* Independent conversions: FP16 through the compiler's _Float16, BF16 by hand. */
uint16_t tu_f32_to_fp16(float x);
float tu_fp16_to_f32(uint16_t h);
uint16_t tu_f32_to_bf16(float x);
float tu_bf16_to_f32(uint16_t h);
float tu_act_to_f32(uint16_t h, qsakv_dtype act);
uint16_t tu_f32_to_act(float x, qsakv_dtype act);

/* E4M3 oracle in FP64: value of each code by the (1 + m/8) * 2^(e-7) formula, and the
 * nearest code (ties to even) to a clamped quotient. */
double tu_e4m3_value(uint8_t code);
uint8_t tu_e4m3_encode(float q);

/* Expects a call to fail with `status`; prints the library's message on mismatch. */
#define TU_EXPECT_STATUS(call, status)                                                     \
  do {                                                                                     \
    qsakv_status tu_s_ = (call);                                                           \
    if (tu_s_ != (status))                                                                 \
      print_error("%s returned %s (%s), expected %s\n", #call, qsakv_status_string(tu_s_), \
                  qsakv_last_error(), qsakv_status_string(status));                        \
    assert_int_equal(tu_s_, (status));                                                     \
  } while (0)
#define TU_OK(call) TU_EXPECT_STATUS(call, QSAKV_SUCCESS)

/* An environment variable under test (a hook read at context creation): its value saved
 * (a copy, or NULL when unset) and put back (and the copy freed), whatever the test set it
 * to in between. */
char* tu_env_save(const char* name);
void tu_env_restore(const char* name, char* saved);

qsakv_context* tu_context(qsakv_backend backend); /* NULL if unavailable */
/* Whether a CUDA case may skip: qsakv_context_create for the CUDA backend says
 * QSAKV_ERROR_NO_DEVICE when there is no GPU to run on (no CUDA device or driver, a GPU
 * older than SM70, a build without the CUDA backend); every other refusal (a QSAKV_* hook
 * variable refused, a start-up failure) is a failure. QSAKV_REQUIRE_GPU=1 in the
 * environment (the GPU runs: make gpu-test, tools/device-*.sh) makes NO_DEVICE a failure
 * too. */
int tu_gpu_required(void);
int tu_cuda_absent_skips(qsakv_status status);
/* After a CUDA context was refused with `status`: cmocka's skip() with the reason when
 * tu_cuda_absent_skips(status), else fail() with the status and message. Never returns. */
void tu_skip_or_fail_without_gpu(qsakv_status status, const char* what);
/* A CUDA context; cmocka's skip() when there is no GPU (tu_cuda_absent_skips), a failed
 * test on any other refusal. */
qsakv_context* tu_cuda_context_or_skip(void);
/* For a case whose GPU half is optional: a CUDA context, or NULL (after printing
 * "[ SKIP part] what: ..." with the reason) when tu_cuda_absent_skips; a failed test on any
 * other refusal. */
qsakv_context* tu_cuda_context_or_null(const char* what);
int tu_is_cuda(qsakv_context* ctx);
/* The CUDA backend on the tensor-core tier: the plan can route rows to the grouped
 * multi-row attention route (the CPU backend and the SM70 tier have none). */
int tu_has_grouped_route(qsakv_context* ctx);

/* Device buffer helpers on a context (host memory on the CPU backend). */
void* tu_to_device(qsakv_context* ctx, const void* host, size_t bytes);
void tu_to_host(qsakv_context* ctx, void* host, const void* dev, size_t bytes);
void* tu_device_filled(qsakv_context* ctx, size_t bytes, uint8_t byte);

/* Writes, loads and validates an overlay for `config` (E4M3) with the given scales per
 * QSA layer (index i of config->qsa_layers). The caller destroys it. */
/* The overlay's info (asserts the call succeeds). */
qsakv_overlay_info tu_overlay_info(const qsakv_overlay* overlay);
qsakv_overlay* tu_make_overlay(const qsakv_model_config* config, const float* k_scales,
                               const float* v_scales);

/* The reference config shrunk for tests: given heads, head_dim, dtypes, block size. */
void tu_small_config(qsakv_model_config* c, int num_q_heads, int num_kv_heads, int head_dim,
                     qsakv_dtype act, qsakv_dtype kv, int block_size);

double tu_rel_l2(const double* ref, const double* got, size_t n);

/* Field-by-field comparison of two structs of one type, each field byte for byte (padding
 * bytes are never compared: their values are unspecified), with a record of the bytes
 * compared: tu_all_fields_compared then fails when what no comparison covered is more than
 * padding could be (a hole at least as large as the alignment of the field after it, or of
 * the struct at its end), so a field left out of the comparison fails the test.
 *   tu_field_map map;
 *   TU_FIELDS_OF(map, want);
 *   TU_SAME_FIELD(map, want, got, num_layers); ... one per field
 *   tu_all_fields_compared(&map, "qsakv_model_config"); */
enum { TU_FIELD_MAP_MAX = 4096 };
typedef struct {
  size_t size, align;
  unsigned char covered[TU_FIELD_MAP_MAX];
  unsigned char align_at[TU_FIELD_MAP_MAX]; /* the alignment of the field starting here */
} tu_field_map;
void tu_field_map_start(tu_field_map* map, size_t size, size_t align);
void tu_same_field(tu_field_map* map, const char* name, const void* want_base,
                   const void* want_field, const void* got_field, size_t bytes, size_t align);
void tu_all_fields_compared(const tu_field_map* map, const char* type);
#define TU_FIELDS_OF(map, want) tu_field_map_start(&(map), sizeof(want), __alignof__(want))
#define TU_SAME_FIELD(map, want, got, field)                                                \
  tu_same_field(&(map), #field, &(want), &(want).field, &(got).field, sizeof((want).field), \
                __alignof__((want).field))

/* Every field of two model configs equal (tu_field_map: a field added to the struct and
 * not here fails). */
void tu_expect_same_model_config(const qsakv_model_config* want, const qsakv_model_config* got);

/* Applies QSAKV_TEST_FILTER (a cmocka glob such as "*cuda*") when set: GPU runs under
 * compute-sanitizer use it to skip the CPU-only cases. */
void tu_apply_filter(void);

#ifdef __cplusplus
}
#endif

#endif
