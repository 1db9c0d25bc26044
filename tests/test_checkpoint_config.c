// SPDX-License-Identifier: Apache-2.0
/* qsakv_model_config_from_checkpoint: a model config from a Hugging Face config.json
 * (fixtures in tests/data/hf_config): the reference model read equals the preset; a
 * multimodal text_config; every refusal names the file and the key. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

static const char* fixture(const char* name) {
  static char path[1024];
  const char* dir = getenv("QSAKV_TEST_DATA");
  assert_non_null(dir);
  snprintf(path, sizeof path, "%s/hf_config/%s", dir, name);
  return path;
}

static void expect_refusal(const char* name, qsakv_status status, const char* needle1,
                           const char* needle2) {
  qsakv_model_config c;
  memset(&c, 0x5a, sizeof c);
  const char* path = fixture(name);
  TU_EXPECT_STATUS(qsakv_model_config_from_checkpoint(&c, path), status);
  const char* msg = qsakv_last_error();
  if (!strstr(msg, needle1) || (needle2 && !strstr(msg, needle2)) || !strstr(msg, path))
    fail_msg("%s: message \"%s\" should name \"%s\", \"%s\" and the file", name, msg, needle1,
             needle2 ? needle2 : "");
  /* Untouched on failure. */
  unsigned char poison[sizeof c];
  memset(poison, 0x5a, sizeof poison);
  assert_memory_equal(&c, poison, sizeof c);
}

/* The reference checkpoint's config.json (directory form) gives the qwen4_exp preset. */
static void test_reference_equals_preset(void** state) {
  (void)state;
  qsakv_model_config c, p;
  memset(&c, 0, sizeof c);
  TU_OK(qsakv_model_config_from_checkpoint(&c, fixture("qwen4_exp")));
  TU_OK(qsakv_model_config_preset(&p, "qwen4_exp"));
  assert_int_equal(c.struct_size, sizeof c);
  assert_int_equal(c.version, QSAKV_MODEL_CONFIG_VERSION);
  assert_int_equal(c.num_layers, 48);
  assert_int_equal(c.num_qsa_layers, 12);
  for (int i = 0; i < 12; ++i) assert_int_equal(c.qsa_layers[i], 4 * i + 3);
  assert_int_equal(c.num_q_heads, 24);
  assert_int_equal(c.num_kv_heads, 2);
  assert_int_equal(c.head_dim, 256);
  assert_int_equal(c.index_num_heads, 4);
  assert_int_equal(c.index_head_dim, 128);
  assert_int_equal(c.compress_ratio, 4);
  assert_int_equal(c.topk_tokens, 2048);
  /* Runtime fields: the preset's defaults, whatever the file says (torch_dtype bfloat16,
   * max_position_embeddings 262144 are the caller's to apply). */
  assert_int_equal(c.tp_size, 1);
  assert_int_equal(c.tp_rank, 0);
  assert_int_equal(c.activation_dtype, QSAKV_DTYPE_FP16);
  assert_int_equal(c.kv_dtype, QSAKV_DTYPE_E4M3);
  assert_int_equal(c.block_size, 64);
  assert_int_equal(c.max_model_len, 131072);
  assert_true(c.softmax_scale == 0.0f);
  /* Field by field equal to the preset, every field: overlays validated for one fit the
   * other. */
  tu_expect_same_model_config(&p, &c);
  TU_OK(qsakv_model_config_validate(&c));
  /* The file itself works as well as its directory. */
  char file[1100];
  snprintf(file, sizeof file, "%s/config.json", fixture("qwen4_exp"));
  qsakv_model_config d;
  TU_OK(qsakv_model_config_from_checkpoint(&d, file));
  assert_int_equal(d.num_qsa_layers, 12);
  assert_int_equal(d.qsa_layers[11], 47);
}

/* text_config is read; layer_types and qsa_layers given together must agree. */
static void test_multimodal_text_config(void** state) {
  (void)state;
  qsakv_model_config c;
  TU_OK(qsakv_model_config_from_checkpoint(&c, fixture("multimodal")));
  assert_int_equal(c.num_layers, 8);
  assert_int_equal(c.num_qsa_layers, 3);
  assert_int_equal(c.qsa_layers[0], 1);
  assert_int_equal(c.qsa_layers[1], 3);
  assert_int_equal(c.qsa_layers[2], 7);
  assert_int_equal(c.num_q_heads, 8);
  assert_int_equal(c.head_dim, 128); /* hidden_size 1024 / 8 heads */
  assert_int_equal(c.index_num_heads, 2);
  assert_int_equal(c.index_head_dim, 64);
  assert_int_equal(c.compress_ratio, 8);
  assert_int_equal(c.topk_tokens, 1024);
}

static void test_derived_head_dim(void** state) {
  (void)state;
  qsakv_model_config c;
  TU_OK(qsakv_model_config_from_checkpoint(&c, fixture("derived_head_dim.json")));
  assert_int_equal(c.head_dim, 256); /* 6144 / 24 */
  assert_int_equal(c.num_qsa_layers, 12);
}

static void test_refusals(void** state) {
  (void)state;
  expect_refusal("missing_kv_heads.json", QSAKV_ERROR_FORMAT, "\"num_key_value_heads\"", "missing");
  expect_refusal("wrong_type_head_dim.json", QSAKV_ERROR_FORMAT, "\"head_dim\"",
                 "expected an integer");
  expect_refusal("float_interval.json", QSAKV_ERROR_FORMAT, "\"full_attention_interval\"",
                 "expected an integer");
  expect_refusal("unknown_layer_type.json", QSAKV_ERROR_FORMAT, "\"layer_types[3]\"",
                 "sliding_attention");
  expect_refusal("no_pattern.json", QSAKV_ERROR_FORMAT, "no QSA layer pattern",
                 "full_attention_interval");
  expect_refusal("conflicting_patterns.json", QSAKV_ERROR_FORMAT, "qsa_layers",
                 "different QSA layers");
  expect_refusal("invalid_head_dim.json", QSAKV_ERROR_INVALID_CONFIG, "head_dim is 96",
                 "(key \"head_dim\")");
  expect_refusal("duplicate_key.json", QSAKV_ERROR_FORMAT, "head_dim", "twice");
  expect_refusal("no_such_checkpoint", QSAKV_ERROR_IO, "does not exist", NULL);
  /* A directory without config.json. */
  expect_refusal("", QSAKV_ERROR_IO, "config.json", "not found");
}

/* Edge cases written on the fly: bounds and types the fixtures do not cover. */
static void test_inline_cases(void** state) {
  (void)state;
  static const struct {
    const char* body;
    qsakv_status status;
    const char* needle;
  } cases[] = {
      {"[1, 2]", QSAKV_ERROR_FORMAT, "expected a JSON object"},
      {"{\"text_config\": 3}", QSAKV_ERROR_FORMAT, "\"text_config\""},
      {"{\"num_hidden_layers\": 4096}", QSAKV_ERROR_INVALID_CONFIG, "num_hidden_layers"},
      {"{\"num_hidden_layers\": 99999999999}", QSAKV_ERROR_FORMAT, "int32"},
      {"{\"num_hidden_layers\": true}", QSAKV_ERROR_FORMAT, "expected an integer"},
      {"{\"num_hidden_layers\": 8, \"num_attention_heads\": 8, \"num_key_value_heads\": 2,"
       " \"head_dim\": 128, \"index_n_heads\": 4, \"index_head_dim\": 128,"
       " \"index_compress_ratio\": 4, \"index_topk\": 2048, \"qsa_layers\": [3, 8]}",
       QSAKV_ERROR_FORMAT, "\"qsa_layers[1]\""},
      {"{\"num_hidden_layers\": 8, \"num_attention_heads\": 8, \"num_key_value_heads\": 2,"
       " \"head_dim\": 128, \"index_n_heads\": 4, \"index_head_dim\": 128,"
       " \"index_compress_ratio\": 4, \"index_topk\": 2048, \"layer_types\": [\"full_attention\"]}",
       QSAKV_ERROR_FORMAT, "has 1 entries"},
      {"{\"num_hidden_layers\": 8, \"num_attention_heads\": 8, \"num_key_value_heads\": 2,"
       " \"head_dim\": 128, \"index_n_heads\": 4, \"index_head_dim\": 128,"
       " \"index_compress_ratio\": 4, \"index_topk\": 2048, \"full_attention_interval\": 0}",
       QSAKV_ERROR_FORMAT, "must be > 0"},
      {"{\"num_hidden_layers\": 8, \"num_attention_heads\": 8, \"num_key_value_heads\": 3,"
       " \"head_dim\": 128, \"index_n_heads\": 4, \"index_head_dim\": 128,"
       " \"index_compress_ratio\": 4, \"index_topk\": 2048, \"full_attention_interval\": 4}",
       QSAKV_ERROR_INVALID_CONFIG, "(key \"num_attention_heads\")"},
  };
  char path[] = "/tmp/qsakv-hfcfg-XXXXXX";
  const int fd = mkstemp(path);
  assert_true(fd >= 0);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
    FILE* f = fopen(path, "w");
    assert_non_null(f);
    fputs(cases[i].body, f);
    fclose(f);
    qsakv_model_config c;
    TU_EXPECT_STATUS(qsakv_model_config_from_checkpoint(&c, path), cases[i].status);
    if (!strstr(qsakv_last_error(), cases[i].needle))
      fail_msg("case %zu: \"%s\" does not name \"%s\"", i, qsakv_last_error(), cases[i].needle);
  }
  remove(path);
  qsakv_model_config c;
  TU_EXPECT_STATUS(qsakv_model_config_from_checkpoint(NULL, path), QSAKV_ERROR_INVALID_ARGUMENT);
  TU_EXPECT_STATUS(qsakv_model_config_from_checkpoint(&c, NULL), QSAKV_ERROR_INVALID_ARGUMENT);
  TU_EXPECT_STATUS(qsakv_model_config_from_checkpoint(&c, ""), QSAKV_ERROR_INVALID_ARGUMENT);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_reference_equals_preset),
      cmocka_unit_test(test_multimodal_text_config),
      cmocka_unit_test(test_derived_head_dim),
      cmocka_unit_test(test_refusals),
      cmocka_unit_test(test_inline_cases),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
