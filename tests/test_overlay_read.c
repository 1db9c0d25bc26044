// SPDX-License-Identifier: Apache-2.0
/* qsakv_overlay_read_scale_file: the scales of a bare scale file, for inspection, with
 * no manifest; what it refuses. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"

static char dir[] = "/tmp/qsakv-read-XXXXXX";

static int setup(void** state) {
  (void)state;
  return mkdtemp(dir) ? 0 : -1;
}
static int teardown(void** state) {
  (void)state;
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  return system(cmd) == 0 ? 0 : -1;
}

/* A safetensors file of F32 scalars (name, value) pairs, written by hand. */
static const char* write_scalars(const char* file, const char* const* names, const float* values,
                                 int n, const char* dtype_of_first) {
  static char path[512];
  snprintf(path, sizeof path, "%s/%s", dir, file);
  char header[4096];
  size_t len = (size_t)snprintf(header, sizeof header, "{");
  for (int i = 0; i < n; ++i)
    len += (size_t)snprintf(header + len, sizeof header - len,
                            "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[],\"data_offsets\":[%d,%d]}",
                            i ? "," : "", names[i],
                            i == 0 && dtype_of_first ? dtype_of_first : "F32", 4 * i, 4 * i + 4);
  len += (size_t)snprintf(header + len, sizeof header - len, "}");
  FILE* f = fopen(path, "wb");
  assert_non_null(f);
  const uint64_t n64 = len;
  unsigned char le[8];
  for (int i = 0; i < 8; ++i) le[i] = (unsigned char)(n64 >> (8 * i));
  fwrite(le, 1, 8, f);
  fwrite(header, 1, len, f);
  fwrite(values, sizeof(float), (size_t)n, f);
  fclose(f);
  return path;
}

static void test_pack_without_manifest(void** state) {
  (void)state;
  char index[512], pack[512], scale[600], manifest[600];
  snprintf(index, sizeof index, "%s/model.safetensors.index.json", dir);
  FILE* f = fopen(index, "w");
  assert_non_null(f);
  fputs("{\"weight_map\": {\"lm_head.weight\": \"model-00001.safetensors\"}}", f);
  fclose(f);
  snprintf(pack, sizeof pack, "%s/pack", dir);
  int32_t layers[12];
  float k[12], v[12];
  for (int i = 0; i < 12; ++i) {
    layers[i] = 4 * i + 3;
    k[i] = 0.01f * (float)(i + 1);
    v[i] = 0.5f + (float)i;
  }
  qsakv_overlay_write_options wo;
  TU_OK(qsakv_overlay_write_options_init(&wo));
  wo.base_index_path = index;
  TU_OK(qsakv_overlay_write(pack, layers, k, v, 12, &wo));
  snprintf(scale, sizeof scale, "%s/model-kvscales.safetensors", pack);
  snprintf(manifest, sizeof manifest, "%s/qsakv-overlay.json", pack);
  /* The bound view's hash, before the manifest goes. */
  qsakv_overlay* o = NULL;
  TU_OK(qsakv_overlay_load(&o, scale, NULL));
  const qsakv_overlay_info info = tu_overlay_info(o);
  qsakv_overlay_destroy(o);
  assert_int_equal(unlink(manifest), 0);
  TU_EXPECT_STATUS(qsakv_overlay_load(&o, scale, NULL), QSAKV_ERROR_OVERLAY_MISSING);

  int32_t n = -1, got_layers[16];
  float gk[16], gv[16];
  char sha[65];
  /* Counting only. */
  TU_OK(qsakv_overlay_read_scale_file(scale, 0, NULL, NULL, NULL, &n, NULL));
  assert_int_equal(n, 12);
  /* Partial room: the first 5, the count still 12. */
  memset(got_layers, 0xff, sizeof got_layers);
  TU_OK(qsakv_overlay_read_scale_file(scale, 5, got_layers, gk, gv, &n, NULL));
  assert_int_equal(n, 12);
  assert_int_equal(got_layers[4], 19);
  assert_int_equal(got_layers[5], -1);
  TU_OK(qsakv_overlay_read_scale_file(scale, 16, got_layers, gk, gv, &n, sha));
  assert_int_equal(n, 12);
  for (int i = 0; i < 12; ++i) {
    assert_int_equal(got_layers[i], layers[i]);
    assert_true(gk[i] == k[i]);
    assert_true(gv[i] == v[i]);
  }
  assert_string_equal(sha, info.scale_file_sha256);
}

static void test_missing_half_is_nan(void** state) {
  (void)state;
  const char* names[] = {"model.layers.7.self_attn.v_scale", "model.layers.3.self_attn.k_scale",
                         "model.layers.3.self_attn.v_scale"};
  const float values[] = {2.0f, 0.25f, 0.5f};
  const char* path = write_scalars("half.safetensors", names, values, 3, NULL);
  int32_t n = 0, l[4];
  float k[4], v[4];
  TU_OK(qsakv_overlay_read_scale_file(path, 4, l, k, v, &n, NULL));
  assert_int_equal(n, 2);
  assert_int_equal(l[0], 3);
  assert_true(k[0] == 0.25f && v[0] == 0.5f);
  assert_int_equal(l[1], 7);
  assert_true(isnan(k[1]));
  assert_true(v[1] == 2.0f);
}

static void test_refusals(void** state) {
  (void)state;
  int32_t n = 0, l[4];
  float k[4], v[4];
  const float values[] = {1.0f, 1.0f};
  const char* unknown[] = {"model.layers.3.self_attn.k_scale", "lm_head.weight"};
  TU_EXPECT_STATUS(
      qsakv_overlay_read_scale_file(write_scalars("u.safetensors", unknown, values, 2, NULL), 4, l,
                                    k, v, &n, NULL),
      QSAKV_ERROR_OVERLAY_UNKNOWN_TENSOR);
  assert_non_null(strstr(qsakv_last_error(), "lm_head.weight"));
  const char* dup[] = {"model.layers.3.self_attn.k_scale", "model.layers.3.k_scale"};
  TU_EXPECT_STATUS(qsakv_overlay_read_scale_file(
                       write_scalars("d.safetensors", dup, values, 2, NULL), 4, l, k, v, &n, NULL),
                   QSAKV_ERROR_OVERLAY_DUPLICATE);
  assert_non_null(strstr(qsakv_last_error(), "layer 3"));
  /* A NaN scale is a scale the file gives: the same scale again is still a duplicate. */
  const float nan_first[] = {NAN, 1.0f};
  TU_EXPECT_STATUS(
      qsakv_overlay_read_scale_file(write_scalars("dn.safetensors", dup, nan_first, 2, NULL), 4, l,
                                    k, v, &n, NULL),
      QSAKV_ERROR_OVERLAY_DUPLICATE);
  assert_non_null(strstr(qsakv_last_error(), "\"model.layers.3.k_scale\" is the second"));
  const char* bad[] = {"model.layers.3.self_attn.k_scale", "model.layers.3.self_attn.v_scale"};
  TU_EXPECT_STATUS(qsakv_overlay_read_scale_file(
                       write_scalars("b.safetensors", bad, values, 2, "I32"), 4, l, k, v, &n, NULL),
                   QSAKV_ERROR_OVERLAY_BAD_TENSOR);
  char missing[600];
  snprintf(missing, sizeof missing, "%s/nothing.safetensors", dir);
  TU_EXPECT_STATUS(qsakv_overlay_read_scale_file(missing, 4, l, k, v, &n, NULL), QSAKV_ERROR_IO);
  TU_EXPECT_STATUS(qsakv_overlay_read_scale_file(missing, 4, NULL, k, v, &n, NULL),
                   QSAKV_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(qsakv_last_error(), "layers is NULL"));
  TU_EXPECT_STATUS(qsakv_overlay_read_scale_file(missing, 4, l, k, NULL, &n, NULL),
                   QSAKV_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(qsakv_last_error(), "v_scales is NULL"));
  /* An empty path is an argument error, as for every other path argument, not IO. */
  TU_EXPECT_STATUS(qsakv_overlay_read_scale_file("", 4, l, k, v, &n, NULL),
                   QSAKV_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(qsakv_last_error(), "scale_file is empty"));
  TU_EXPECT_STATUS(qsakv_overlay_read_scale_file(missing, -1, l, k, v, &n, NULL),
                   QSAKV_ERROR_INVALID_ARGUMENT);
  TU_EXPECT_STATUS(qsakv_overlay_read_scale_file(NULL, 4, l, k, v, &n, NULL),
                   QSAKV_ERROR_INVALID_ARGUMENT);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_pack_without_manifest),
      cmocka_unit_test(test_missing_half_is_nan),
      cmocka_unit_test(test_refusals),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
