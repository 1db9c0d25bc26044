// SPDX-License-Identifier: Apache-2.0
/* Model config: the reference preset, per-rank geometry, and a named refusal for every
 * inconsistent field. */
#include <string.h>

#include "testutil.h"

static void test_preset(void** state) {
  (void)state;
  qsakv_model_config c;
  TU_OK(qsakv_model_config_preset(&c, "qwen4_exp"));
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
  TU_OK(qsakv_model_config_validate(&c));
  TU_EXPECT_STATUS(qsakv_model_config_preset(&c, "llama"), QSAKV_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(qsakv_last_error(), "llama"));
}

static qsakv_rank_geometry geometry(qsakv_model_config* c) {
  qsakv_rank_geometry g = {sizeof g, QSAKV_RANK_GEOMETRY_VERSION};
  TU_OK(qsakv_model_config_rank_geometry(c, &g));
  return g;
}

static void test_rank_geometry(void** state) {
  (void)state;
  qsakv_model_config c;
  TU_OK(qsakv_model_config_preset(&c, "qwen4_exp"));
  const int tps[] = {1, 2, 4, 8};
  const int q[] = {24, 12, 6, 3}, kv[] = {2, 1, 1, 1};
  for (int i = 0; i < 4; ++i) {
    c.tp_size = tps[i];
    c.tp_rank = tps[i] - 1;
    qsakv_rank_geometry g = geometry(&c);
    assert_int_equal(g.q_heads, q[i]);
    assert_int_equal(g.kv_heads, kv[i]);
    assert_int_equal(g.group_size, q[i] / kv[i]);
    assert_int_equal(g.first_q_head, (tps[i] - 1) * q[i]);
    assert_int_equal(g.topk_width, 2051);
    assert_int_equal(g.topk_blocks, 512);
    assert_true(g.softmax_scale == 1.0f / 16.0f);
  }
  /* TP4: KV heads replicated, ranks 0,1 hold head 0 and ranks 2,3 head 1. */
  c.tp_size = 4;
  c.tp_rank = 1;
  assert_int_equal(geometry(&c).first_kv_head, 0);
  c.tp_rank = 2;
  assert_int_equal(geometry(&c).first_kv_head, 1);
  /* Ring length: ratio * ceil((ratio + spec) / ratio). */
  c.speculative_tokens = 0;
  assert_int_equal(geometry(&c).ring_length, 4);
  c.speculative_tokens = 3;
  assert_int_equal(geometry(&c).ring_length, 8);
  c.speculative_tokens = 4;
  assert_int_equal(geometry(&c).ring_length, 8);
  c.speculative_tokens = 5;
  assert_int_equal(geometry(&c).ring_length, 12);
}

/* Each case breaks one field; the refusal must name it. */
typedef struct {
  const char* field;
  void (*apply)(qsakv_model_config*);
} bad_case;

#define BAD(name, stmt) \
  static void bad_##name(qsakv_model_config* c) { stmt; }
BAD(layers0, c->num_layers = 0)
BAD(layers_big, c->num_layers = QSAKV_MAX_LAYERS + 1)
BAD(qsa0, c->num_qsa_layers = 0)
BAD(qsa_range, c->qsa_layers[11] = 48)
BAD(qsa_order, c->qsa_layers[5] = c->qsa_layers[4])
BAD(qheads0, c->num_q_heads = 0)
BAD(kvheads0, c->num_kv_heads = 0)
BAD(gqa, c->num_q_heads = 25)
BAD(headdim, c->head_dim = 96)
BAD(scale_neg, c->softmax_scale = -1.0f)
BAD(index_heads, c->index_num_heads = 0)
BAD(index_dim, c->index_head_dim = 100)
BAD(ratio, c->compress_ratio = 0)
BAD(topk, c->topk_tokens = 2047)
BAD(tp0, c->tp_size = 0)
BAD(tp_rank, {
  c->tp_size = 4;
  c->tp_rank = 4;
})
BAD(tp_heads, c->tp_size = 5)
BAD(tp_kv, {
  c->num_q_heads = 24;
  c->num_kv_heads = 3;
  c->tp_size = 2;
})
BAD(spec, c->speculative_tokens = -1)
BAD(act, c->activation_dtype = QSAKV_DTYPE_E4M3)
BAD(act_unknown, c->activation_dtype = (qsakv_dtype)42)
BAD(kv, c->kv_dtype = QSAKV_DTYPE_INT32)
BAD(kv_mismatch, {
  c->kv_dtype = QSAKV_DTYPE_BF16;
  c->activation_dtype = QSAKV_DTYPE_FP16;
})
BAD(block0, c->block_size = 0)
BAD(block_ratio, c->block_size = 66)
BAD(requests, c->max_requests = 0)
BAD(batched, c->max_batched_tokens = -3)
BAD(model_len, c->max_model_len = 0)
BAD(version, c->version = 99)
BAD(model_len_big, c->max_model_len = (1 << 30) + 1)
BAD(index_heads_big, c->index_num_heads = 65)
BAD(topk_big, c->topk_tokens = (1 << 20) + 4)
BAD(index_keys, c->index_key_dtype = QSAKV_DTYPE_BF16)
BAD(index_keys_zero, c->index_key_dtype = QSAKV_DTYPE_INVALID)
BAD(index_keys_unknown, c->index_key_dtype = (qsakv_dtype)77)

static void test_invalid_fields_are_named(void** state) {
  (void)state;
  const bad_case cases[] = {
      {"num_layers", bad_layers0},
      {"num_layers", bad_layers_big},
      {"num_qsa_layers", bad_qsa0},
      {"qsa_layers", bad_qsa_range},
      {"qsa_layers", bad_qsa_order},
      {"num_q_heads", bad_qheads0},
      {"num_kv_heads", bad_kvheads0},
      {"num_q_heads", bad_gqa},
      {"head_dim", bad_headdim},
      {"softmax_scale", bad_scale_neg},
      {"index_num_heads", bad_index_heads},
      {"index_head_dim", bad_index_dim},
      {"compress_ratio", bad_ratio},
      {"topk_tokens", bad_topk},
      {"tp_size", bad_tp0},
      {"tp_rank", bad_tp_rank},
      {"tp_size", bad_tp_heads},
      {"tp_size", bad_tp_kv},
      {"speculative_tokens", bad_spec},
      {"activation_dtype", bad_act},
      {"activation_dtype", bad_act_unknown},
      {"kv_dtype", bad_kv},
      {"kv_dtype", bad_kv_mismatch},
      {"block_size", bad_block0},
      {"block_size", bad_block_ratio},
      {"max_requests", bad_requests},
      {"max_batched_tokens", bad_batched},
      {"max_model_len", bad_model_len},
      {"version", bad_version},
      {"max_model_len", bad_model_len_big},
      {"index_num_heads", bad_index_heads_big},
      {"topk_tokens", bad_topk_big},
      {"index_key_dtype is bf16", bad_index_keys},
      {"index_key_dtype is invalid (0)", bad_index_keys_zero},
      {"index_key_dtype is invalid (77)", bad_index_keys_unknown},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
    qsakv_model_config c;
    TU_OK(qsakv_model_config_preset(&c, "qwen4_exp"));
    cases[i].apply(&c);
    TU_EXPECT_STATUS(qsakv_model_config_validate(&c), QSAKV_ERROR_INVALID_CONFIG);
    if (!strstr(qsakv_last_error(), cases[i].field))
      fail_msg("case %zu: message \"%s\" does not name %s", i, qsakv_last_error(), cases[i].field);
    /* The geometry derivation refuses the same config. */
    qsakv_rank_geometry g;
    memset(&g, 0, sizeof g);
    g.struct_size = sizeof g;
    TU_EXPECT_STATUS(qsakv_model_config_rank_geometry(&c, &g), QSAKV_ERROR_INVALID_CONFIG);
  }
}

static void test_message_names_value(void** state) {
  (void)state;
  qsakv_model_config c;
  TU_OK(qsakv_model_config_preset(&c, "qwen4_exp"));
  c.tp_size = 5;
  TU_EXPECT_STATUS(qsakv_model_config_validate(&c), QSAKV_ERROR_INVALID_CONFIG);
  assert_non_null(strstr(qsakv_last_error(), "5"));
  assert_non_null(strstr(qsakv_last_error(), "24"));
  c.tp_size = 1;
  c.block_size = 66;
  TU_EXPECT_STATUS(qsakv_model_config_validate(&c), QSAKV_ERROR_INVALID_CONFIG);
  assert_non_null(strstr(qsakv_last_error(), "66"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_preset),
      cmocka_unit_test(test_rank_geometry),
      cmocka_unit_test(test_invalid_fields_are_named),
      cmocka_unit_test(test_message_names_value),
  };
  return cmocka_run_group_tests_name("config", tests, NULL, NULL);
}
