// SPDX-License-Identifier: Apache-2.0
/* Adversarial overlays: every malformed or dishonest input is refused with its own
 * status (and, for a few, the exact words of the message). Each test breaks one rule of
 * a well-formed overlay, so it fails if that rule is removed from the library. */
#define _GNU_SOURCE
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "overlay_fixture.h"

static int setup(void** state) {
  ovf_pack* p = malloc(sizeof *p);
  if (!p) return -1;
  ovf_init(p);
  *state = p;
  return 0;
}

static int teardown(void** state) {
  ovf_cleanup(*state);
  free(*state);
  return 0;
}

static char g_header[1 << 16];
static char g_image[1 << 17];

/* Writes p's image with `header` as its header text. */
static void write_with_header(ovf_pack* p, const char* header) {
  ovf_write_raw_pack(p, g_image, ovf_image_with_header(p, header, g_image, sizeof g_image));
}

/* The well-formed image of p, for byte-level damage. */
static size_t good_image(ovf_pack* p) {
  ovf_header(p, g_header, sizeof g_header);
  return ovf_image_with_header(p, g_header, g_image, sizeof g_image);
}

static void set_header_length(uint64_t n) {
  for (int b = 0; b < 8; ++b) g_image[b] = (char)((n >> (8 * b)) & 0xff);
}

/* Replaces the first occurrence of `from` in g_header by `to`. */
static void edit_header(const char* from, const char* to) {
  char* at = strstr(g_header, from);
  assert_non_null(at);
  char rest[1 << 16];
  snprintf(rest, sizeof rest, "%s", at + strlen(from));
  snprintf(at, sizeof g_header - (size_t)(at - g_header), "%s%s", to, rest);
}

/* ---- the container ------------------------------------------------------------ */

static void test_sanity_the_fixture_is_valid(void** state) {
  ovf_pack* p = *state;
  ovf_write_pack(p);
  OVF_OK(ovf_load_validate(p));
}

static void test_empty_file(void** state) {
  ovf_pack* p = *state;
  ovf_write_raw_pack(p, "", 0);
  OVF_EXPECT(ovf_load_validate(p), QSAKV_ERROR_FORMAT);
  OVF_MESSAGE_HAS("truncated");
}

static void test_truncated_inside_length(void** state) {
  ovf_pack* p = *state;
  size_t n = good_image(p);
  (void)n;
  ovf_write_raw_pack(p, g_image, 5);
  OVF_EXPECT(ovf_load_validate(p), QSAKV_ERROR_FORMAT);
}

static void test_truncated_inside_header(void** state) {
  ovf_pack* p = *state;
  good_image(p);
  ovf_write_raw_pack(p, g_image, 8 + strlen(g_header) / 2);
  OVF_EXPECT(ovf_load_validate(p), QSAKV_ERROR_FORMAT);
  OVF_MESSAGE_HAS("runs past the end");
}

static void test_truncated_data(void** state) {
  ovf_pack* p = *state;
  size_t n = good_image(p);
  ovf_write_raw_pack(p, g_image, n - 1);
  OVF_EXPECT(ovf_load_validate(p), QSAKV_ERROR_FORMAT);
  OVF_MESSAGE_HAS("past the");
}

static void test_header_length_larger_than_file(void** state) {
  ovf_pack* p = *state;
  size_t n = good_image(p);
  set_header_length(n); /* one full file more than there is */
  ovf_write_raw_pack(p, g_image, n);
  OVF_EXPECT(ovf_load_validate(p), QSAKV_ERROR_FORMAT);
}

static void test_header_length_zero(void** state) {
  ovf_pack* p = *state;
  size_t n = good_image(p);
  set_header_length(0);
  ovf_write_raw_pack(p, g_image, n);
  OVF_EXPECT(ovf_load_validate(p), QSAKV_ERROR_FORMAT);
}

static void test_header_length_over_limit(void** state) {
  ovf_pack* p = *state;
  size_t n = good_image(p);
  set_header_length((uint64_t)1 << 40); /* would need a terabyte of header */
  ovf_write_raw_pack(p, g_image, n);
  OVF_EXPECT(ovf_load_validate(p), QSAKV_ERROR_FORMAT);
  OVF_MESSAGE_HAS("limit");
}

static void test_header_not_json(void** state) {
  ovf_pack* p = *state;
  write_with_header(p, "{this is not json}");
  OVF_EXPECT(ovf_load_validate(p), QSAKV_ERROR_FORMAT);
}

static void test_header_json_array(void** state) {
  ovf_pack* p = *state;
  write_with_header(p, "[{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}]");
  OVF_EXPECT(ovf_load_validate(p), QSAKV_ERROR_FORMAT);
}

static void test_header_json_then_garbage(void** state) {
  ovf_pack* p = *state;
  ovf_header(p, g_header, sizeof g_header);
  strcat(g_header, " {}");
  write_with_header(p, g_header);
  OVF_EXPECT(ovf_load_validate(p), QSAKV_ERROR_FORMAT);
}

static void test_header_padding_spaces_are_fine(void** state) {
  ovf_pack* p = *state;
  ovf_header(p, g_header, sizeof g_header);
  strcat(g_header, "       "); /* the reference writer pads to 8 bytes this way */
  write_with_header(p, g_header);
  OVF_OK(ovf_load_validate(p));
}

static void test_header_invalid_utf8(void** state) {
  ovf_pack* p = *state;
  ovf_header(p, g_header, sizeof g_header);
  edit_header("model.layers.3.self_attn.k_scale", "model.layers.3.self_attn.k_scale\xff");
  write_with_header(p, g_header);
  OVF_EXPECT(ovf_load_validate(p), QSAKV_ERROR_FORMAT);
}

static void test_trailing_garbage(void** state) {
  ovf_pack* p = *state;
  size_t n = good_image(p);
  memcpy(g_image + n, "JUNK", 4);
  ovf_write_raw_pack(p, g_image, n + 4);
  OVF_EXPECT(ovf_load_validate(p), QSAKV_ERROR_FORMAT);
  OVF_MESSAGE_HAS("belong to no tensor");
}

static void test_offsets_past_end(void** state) {
  ovf_pack* p = *state;
  ovf_header(p, g_header, sizeof g_header);
  edit_header("[92,96]", "[96,100]"); /* the last tensor, moved past the data */
  write_with_header(p, g_header);
  OVF_EXPECT(ovf_load_validate(p), QSAKV_ERROR_FORMAT);
}

static void test_overlapping_offsets(void** state) {
  ovf_pack* p = *state;
  ovf_header(p, g_header, sizeof g_header);
  edit_header("[4,8]", "[0,4]"); /* two tensors share bytes 0..4 */
  write_with_header(p, g_header);
  OVF_EXPECT(ovf_load_validate(p), QSAKV_ERROR_FORMAT);
  OVF_MESSAGE_HAS("overlaps");
}

static void test_gap_in_data(void** state) {
  ovf_pack* p = *state;
  /* Tensor 1 moves to the end; bytes 4..8 are then referenced by no tensor. */
  ovf_header(p, g_header, sizeof g_header);
  edit_header("[4,8]", "[96,100]");
  const unsigned char extra[4] = {0, 0, 0x80, 0x3f};
  ovf_add(p, "unused", "U8", "[0]", extra, 4); /* appends 4 data bytes, header unchanged */
  write_with_header(p, g_header);
  ovf_remove(p, p->n - 1);
  ovf_write_manifest(p);
  OVF_EXPECT(ovf_load_validate(p), QSAKV_ERROR_FORMAT);
  OVF_MESSAGE_HAS("belong to no tensor");
}

static void test_offsets_do_not_match_size(void** state) {
  ovf_pack* p = *state;
  ovf_header(p, g_header, sizeof g_header);
  edit_header("\"shape\":[],\"data_offsets\":[0,4]", "\"shape\":[],\"data_offsets\":[0,8]");
  edit_header("[4,8]", "[8,8]");
  write_with_header(p, g_header);
  OVF_EXPECT(ovf_load_validate(p), QSAKV_ERROR_FORMAT);
}

static void test_negative_offset(void** state) {
  ovf_pack* p = *state;
  ovf_header(p, g_header, sizeof g_header);
  edit_header("[0,4]", "[-4,0]");
  write_with_header(p, g_header);
  OVF_EXPECT(ovf_load_validate(p), QSAKV_ERROR_FORMAT);
}

static void test_fractional_offset(void** state) {
  ovf_pack* p = *state;
  ovf_header(p, g_header, sizeof g_header);
  edit_header("[0,4]", "[0.0,4]");
  write_with_header(p, g_header);
  OVF_EXPECT(ovf_load_validate(p), QSAKV_ERROR_FORMAT);
}

static void test_unknown_dtype(void** state) {
  ovf_pack* p = *state;
  ovf_header(p, g_header, sizeof g_header);
  edit_header("\"F32\"", "\"F33\"");
  write_with_header(p, g_header);
  OVF_EXPECT(ovf_load_validate(p), QSAKV_ERROR_FORMAT);
}

static void test_unknown_entry_field(void** state) {
  ovf_pack* p = *state;
  ovf_header(p, g_header, sizeof g_header);
  edit_header("\"dtype\":\"F32\"", "\"dtype\":\"F32\",\"scale\":2");
  write_with_header(p, g_header);
  OVF_EXPECT(ovf_load_validate(p), QSAKV_ERROR_FORMAT);
}

static void test_duplicated_entry_field(void** state) {
  ovf_pack* p = *state;
  ovf_header(p, g_header, sizeof g_header);
  edit_header("\"dtype\":\"F32\"", "\"dtype\":\"F16\",\"dtype\":\"F32\"");
  write_with_header(p, g_header);
  OVF_EXPECT(ovf_load_validate(p), QSAKV_ERROR_FORMAT);
}

static void test_metadata_not_strings(void** state) {
  ovf_pack* p = *state;
  p->metadata = "{\"qsakv.scale_contract\": \"e4m3fn(x/scale), max_abs/448\", \"n\": 3}";
  ovf_write_pack(p);
  OVF_EXPECT(ovf_load_validate(p), QSAKV_ERROR_FORMAT);
}

static void test_metadata_other_scale_contract(void** state) {
  ovf_pack* p = *state;
  p->metadata = "{\"qsakv.scale_contract\": \"e4m3fn(x*scale)\"}";
  ovf_write_pack(p);
  OVF_EXPECT(ovf_load_validate(p), QSAKV_ERROR_FORMAT);
}

static void test_metadata_unit_flag_contradicts_manifest(void** state) {
  ovf_pack* p = *state;
  p->metadata = "{\"qsakv.unit_scale_control\": \"1\"}"; /* the manifest says false */
  ovf_write_pack(p);
  OVF_EXPECT(ovf_load_validate(p), QSAKV_ERROR_FORMAT);
}

static void test_duplicate_tensor_key(void** state) {
  ovf_pack* p = *state;
  /* Tensor 1 takes tensor 0's name: nlohmann would silently keep the last. */
  ovf_header(p, g_header, sizeof g_header);
  edit_header("model.layers.3.self_attn.v_scale", "model.layers.3.self_attn.k_scale");
  write_with_header(p, g_header);
  OVF_EXPECT(ovf_load_validate(p), QSAKV_ERROR_OVERLAY_DUPLICATE);
  OVF_MESSAGE_HAS("appears twice");
}

/* ---- the tensors ---------------------------------------------------------------- */

static void replace_tensor(ovf_pack* p, int i, const char* dtype, const char* shape,
                           const void* bytes, size_t n) {
  p->t[i].dtype = dtype;
  p->t[i].shape = shape;
  memcpy(p->t[i].bytes, bytes, n);
  p->t[i].nbytes = n;
  ovf_write_pack(p);
}

static void test_dtype_f16(void** state) {
  ovf_pack* p = *state;
  const unsigned char half_one[2] = {0x00, 0x3c};
  replace_tensor(p, ovf_find(p, 7, 'k'), "F16", "[]", half_one, 2);
  OVF_EXPECT(ovf_load_validate(p), QSAKV_ERROR_OVERLAY_BAD_TENSOR);
  OVF_MESSAGE_HAS("layer 7 k_scale");
}

static void test_dtype_f64(void** state) {
  ovf_pack* p = *state;
  const double one = 1.0;
  replace_tensor(p, ovf_find(p, 7, 'v'), "F64", "[]", &one, 8);
  OVF_EXPECT(ovf_load_validate(p), QSAKV_ERROR_OVERLAY_BAD_TENSOR);
}

static void test_dtype_bf16_packed_in_f32_bytes(void** state) {
  ovf_pack* p = *state;
  const unsigned char two_bf16[4] = {0x80, 0x3f, 0x80, 0x3f};
  replace_tensor(p, 0, "BF16", "[2]", two_bf16, 4);
  OVF_EXPECT(ovf_load_validate(p), QSAKV_ERROR_OVERLAY_BAD_TENSOR);
}

static void test_shape_one(void** state) {
  ovf_pack* p = *state;
  const float one = 1.0f;
  replace_tensor(p, 0, "F32", "[1]", &one, 4);
  OVF_EXPECT(ovf_load_validate(p), QSAKV_ERROR_OVERLAY_BAD_TENSOR);
  OVF_MESSAGE_HAS("not an FP32 scalar");
}

static void test_shape_two(void** state) {
  ovf_pack* p = *state;
  const float two[2] = {1.0f, 1.0f};
  replace_tensor(p, 0, "F32", "[2]", two, 8);
  OVF_EXPECT(ovf_load_validate(p), QSAKV_ERROR_OVERLAY_BAD_TENSOR);
}

static void bad_value(ovf_pack* p, int layer, char kind, float v) {
  const int i = ovf_find(p, layer, kind);
  ovf_set_f32(p, i, p->t[i].name, v);
  ovf_write_pack(p);
}

static void test_scale_nan(void** state) {
  ovf_pack* p = *state;
  bad_value(p, 11, 'k', NAN);
  OVF_EXPECT(ovf_load_validate(p), QSAKV_ERROR_OVERLAY_BAD_SCALE);
  OVF_MESSAGE_HAS("layer 11 k_scale is nan");
}

static void test_scale_inf(void** state) {
  ovf_pack* p = *state;
  bad_value(p, 23, 'v', INFINITY);
  OVF_EXPECT(ovf_load_validate(p), QSAKV_ERROR_OVERLAY_BAD_SCALE);
  OVF_MESSAGE_HAS("layer 23 v_scale is inf");
}

static void test_scale_minus_inf(void** state) {
  ovf_pack* p = *state;
  bad_value(p, 3, 'k', -INFINITY);
  OVF_EXPECT(ovf_load_validate(p), QSAKV_ERROR_OVERLAY_BAD_SCALE);
}

static void test_scale_zero(void** state) {
  ovf_pack* p = *state;
  bad_value(p, 47, 'v', 0.0f);
  OVF_EXPECT(ovf_load_validate(p), QSAKV_ERROR_OVERLAY_BAD_SCALE);
  OVF_MESSAGE_HAS("layer 47 v_scale is 0");
}

static void test_scale_negative_zero(void** state) {
  ovf_pack* p = *state;
  bad_value(p, 47, 'k', -0.0f);
  OVF_EXPECT(ovf_load_validate(p), QSAKV_ERROR_OVERLAY_BAD_SCALE);
}

static void test_scale_negative(void** state) {
  ovf_pack* p = *state;
  bad_value(p, 19, 'k', -0.5f);
  OVF_EXPECT(ovf_load_validate(p), QSAKV_ERROR_OVERLAY_BAD_SCALE);
  OVF_MESSAGE_HAS("-0.5");
}

static void test_scale_negative_subnormal(void** state) {
  ovf_pack* p = *state;
  bad_value(p, 19, 'v', -1e-45f);
  OVF_EXPECT(ovf_load_validate(p), QSAKV_ERROR_OVERLAY_BAD_SCALE);
}

static void test_scale_positive_subnormal_is_valid(void** state) {
  ovf_pack* p = *state;
  bad_value(p, 19, 'v', 1e-45f); /* the smallest positive float: finite and > 0 */
  OVF_OK(ovf_load_validate(p));
}

static void test_23_of_24(void** state) {
  ovf_pack* p = *state;
  ovf_remove(p, ovf_find(p, 47, 'v'));
  ovf_write_pack(p);
  OVF_EXPECT(ovf_load_validate(p), QSAKV_ERROR_OVERLAY_INCOMPLETE);
  OVF_MESSAGE_HAS("loaded 23/24");
  OVF_MESSAGE_HAS("missing: layer 47 v_scale");
}

static void test_22_of_24_names_both(void** state) {
  ovf_pack* p = *state;
  ovf_remove(p, ovf_find(p, 3, 'k'));
  ovf_remove(p, ovf_find(p, 27, 'v'));
  ovf_write_pack(p);
  OVF_EXPECT(ovf_load_validate(p), QSAKV_ERROR_OVERLAY_INCOMPLETE);
  OVF_MESSAGE_HAS("loaded 22/24 K/V scales; missing: layer 3 k_scale, layer 27 v_scale");
}

static void test_no_tensors(void** state) {
  ovf_pack* p = *state;
  p->n = 0;
  ovf_write_pack(p);
  OVF_EXPECT(ovf_load_validate(p), QSAKV_ERROR_OVERLAY_INCOMPLETE);
  OVF_MESSAGE_HAS("loaded 0/24");
}

static void test_extra_unknown_tensor(void** state) {
  ovf_pack* p = *state;
  const float one = 1.0f;
  ovf_add(p, "model.layers.3.mlp.gate_proj.weight", "F32", "[]", &one, 4);
  ovf_write_pack(p);
  OVF_EXPECT(ovf_load_validate(p), QSAKV_ERROR_OVERLAY_UNKNOWN_TENSOR);
  OVF_MESSAGE_HAS("model.layers.3.mlp.gate_proj.weight");
}

static void test_scale_of_non_qsa_layer(void** state) {
  ovf_pack* p = *state;
  const float one = 1.0f;
  ovf_add(p, "model.layers.4.self_attn.k_scale", "F32", "[]", &one, 4);
  ovf_write_pack(p);
  OVF_EXPECT(ovf_load_validate(p), QSAKV_ERROR_OVERLAY_UNKNOWN_TENSOR);
  OVF_MESSAGE_HAS("layer 4, which is not a QSA layer");
}

static void test_scale_of_layer_past_the_model(void** state) {
  ovf_pack* p = *state;
  const float one = 1.0f;
  ovf_add(p, "model.layers.51.self_attn.v_scale", "F32", "[]", &one, 4);
  ovf_write_pack(p);
  OVF_EXPECT(ovf_load_validate(p), QSAKV_ERROR_OVERLAY_UNKNOWN_TENSOR);
}

static void test_same_scale_under_two_spellings(void** state) {
  ovf_pack* p = *state;
  const float one = 1.0f;
  ovf_add(p, "model.layers.11.self_attn.attn.k_scale", "F32", "[]", &one, 4);
  ovf_write_pack(p);
  OVF_EXPECT(ovf_load_validate(p), QSAKV_ERROR_OVERLAY_DUPLICATE);
  OVF_MESSAGE_HAS("layer 11 k_scale is given twice");
}

static void test_mixed_prefixes(void** state) {
  ovf_pack* p = *state;
  const int i = ovf_find(p, 15, 'k');
  ovf_set_f32(p, i, "model.language_model.layers.15.self_attn.k_scale", 0.5f);
  ovf_write_pack(p);
  OVF_EXPECT(ovf_load_validate(p), QSAKV_ERROR_OVERLAY_UNKNOWN_TENSOR);
  OVF_MESSAGE_HAS("layer prefix");
}

/* ---- hashes, revision, contract ---------------------------------------------------- */

static void test_scale_file_hash_mismatch(void** state) {
  ovf_pack* p = *state;
  ovf_write_pack(p);
  /* Change one scale after the manifest was made: 0.01 -> 0.02 for layer 3 k. */
  size_t n = good_image(p);
  const int i = ovf_find(p, 3, 'k');
  ovf_set_f32(p, i, p->t[i].name, 0.02f);
  n = good_image(p);
  ovf_write_file(p->scale, g_image, n);
  OVF_EXPECT(ovf_load_validate(p), QSAKV_ERROR_HASH_MISMATCH);
  OVF_MESSAGE_HAS("SHA-256");
}

static void test_wrong_base_revision(void** state) {
  ovf_pack* p = *state;
  ovf_write_pack(p);
  qsakv_overlay* o = NULL;
  OVF_OK(ovf_load(p, &o));
  qsakv_model_config c;
  ovf_config(&c, 1);
  char other[65];
  memset(other, 'a', 64);
  other[64] = 0;
  OVF_EXPECT(qsakv_overlay_validate(o, &c, other), QSAKV_ERROR_REVISION_MISMATCH);
  char want[256];
  snprintf(want, sizeof want, "base checkpoint index SHA-256 is %s, the overlay was made for %s",
           other, p->base_sha);
  OVF_MESSAGE_HAS(want);
  qsakv_overlay_destroy(o);
}

static void test_revision_not_a_hash(void** state) {
  ovf_pack* p = *state;
  ovf_write_pack(p);
  qsakv_overlay* o = NULL;
  OVF_OK(ovf_load(p, &o));
  qsakv_model_config c;
  ovf_config(&c, 1);
  OVF_EXPECT(qsakv_overlay_validate(o, &c, "main"), QSAKV_ERROR_INVALID_ARGUMENT);
  OVF_EXPECT(qsakv_overlay_validate(o, &c, NULL), QSAKV_ERROR_INVALID_ARGUMENT);
  qsakv_overlay_destroy(o);
}

static qsakv_status validate_with(ovf_pack* p, int tp, int spec, qsakv_dtype act) {
  qsakv_overlay* o = NULL;
  OVF_OK(ovf_load(p, &o));
  qsakv_model_config c;
  ovf_config(&c, tp);
  c.speculative_tokens = spec;
  c.activation_dtype = act;
  qsakv_status s = qsakv_overlay_validate(o, &c, p->base_sha);
  qsakv_overlay_destroy(o);
  return s;
}

static void test_contract_tp(void** state) {
  ovf_pack* p = *state;
  p->contract =
      "{\"tp_size\": 4, \"speculative_tokens\": 0, \"activation_dtype\": \"fp16\", "
      "\"min_sm\": 70}";
  ovf_write_pack(p);
  OVF_OK(validate_with(p, 4, 0, QSAKV_DTYPE_FP16));
  OVF_EXPECT(validate_with(p, 2, 0, QSAKV_DTYPE_FP16), QSAKV_ERROR_CONTRACT);
  OVF_MESSAGE_HAS("tp_size must be 4");
  OVF_MESSAGE_HAS("the config has 2");
}

static void test_contract_speculative_tokens(void** state) {
  ovf_pack* p = *state;
  p->contract =
      "{\"tp_size\": 4, \"speculative_tokens\": 0, \"activation_dtype\": \"fp16\", "
      "\"min_sm\": 70}";
  ovf_write_pack(p);
  OVF_EXPECT(validate_with(p, 4, 3, QSAKV_DTYPE_FP16), QSAKV_ERROR_CONTRACT);
  OVF_MESSAGE_HAS("speculative_tokens must be 0");
}

static void test_contract_activation_dtype(void** state) {
  ovf_pack* p = *state;
  p->contract =
      "{\"tp_size\": 4, \"speculative_tokens\": 0, \"activation_dtype\": \"fp16\", "
      "\"min_sm\": 70}";
  ovf_write_pack(p);
  OVF_EXPECT(validate_with(p, 4, 0, QSAKV_DTYPE_BF16), QSAKV_ERROR_CONTRACT);
  OVF_MESSAGE_HAS("activation_dtype must be fp16");
  OVF_MESSAGE_HAS("the config has bf16");
}

static void test_unconstrained_contract_accepts_any_runtime(void** state) {
  ovf_pack* p = *state;
  ovf_write_pack(p);
  OVF_OK(validate_with(p, 2, 4, QSAKV_DTYPE_BF16));
}

/* ---- files and directories ---------------------------------------------------------- */

static void test_missing_path(void** state) {
  ovf_pack* p = *state;
  qsakv_overlay* o = (qsakv_overlay*)(uintptr_t)1; /* must come back NULL */
  char path[OVF_PATH + 16];
  snprintf(path, sizeof path, "%s/nowhere", p->root);
  OVF_EXPECT(qsakv_overlay_load(&o, path, NULL), QSAKV_ERROR_OVERLAY_MISSING);
  assert_null(o);
}

static void test_directory_without_scale_file(void** state) {
  ovf_pack* p = *state;
  qsakv_overlay* o = NULL;
  OVF_EXPECT(qsakv_overlay_load(&o, p->pack_dir, NULL), QSAKV_ERROR_OVERLAY_MISSING);
}

static void test_missing_manifest(void** state) {
  ovf_pack* p = *state;
  ovf_write_pack(p);
  assert_int_equal(unlink(p->manifest), 0);
  OVF_EXPECT(ovf_load_validate(p), QSAKV_ERROR_OVERLAY_MISSING);
  OVF_MESSAGE_HAS("manifest");
}

static void test_manifest_not_json(void** state) {
  ovf_pack* p = *state;
  ovf_write_pack(p);
  ovf_write_text(p->manifest, "schema_version = 1\n");
  OVF_EXPECT(ovf_load_validate(p), QSAKV_ERROR_FORMAT);
}

/* Rewrites the manifest with one substring replaced. */
static void edit_manifest(ovf_pack* p, const char* from, const char* to) {
  char* m = ovf_read_text(p->manifest);
  assert_non_null(m);
  char* at = strstr(m, from);
  assert_non_null(at);
  char out[1 << 16];
  snprintf(out, sizeof out, "%.*s%s%s", (int)(at - m), m, to, at + strlen(from));
  free(m);
  ovf_write_text(p->manifest, out);
}

static void test_manifest_duplicate_key(void** state) {
  ovf_pack* p = *state;
  ovf_write_pack(p);
  /* A second base_index_sha256 after the first: which one would count? Neither. */
  char dup[128];
  snprintf(dup, sizeof dup, "\"kind\": \"qsakv-overlay\", \"base_index_sha256\": \"%064d\",", 0);
  edit_manifest(p, "\"kind\": \"qsakv-overlay\",", dup);
  OVF_EXPECT(ovf_load_validate(p), QSAKV_ERROR_FORMAT);
  OVF_MESSAGE_HAS("appears twice");
}

static void test_manifest_missing_field(void** state) {
  ovf_pack* p = *state;
  ovf_write_pack(p);
  edit_manifest(p, "\"unit_scale_control\": false,", "");
  OVF_EXPECT(ovf_load_validate(p), QSAKV_ERROR_FORMAT);
  OVF_MESSAGE_HAS("unit_scale_control");
}

static void test_manifest_unknown_field(void** state) {
  ovf_pack* p = *state;
  ovf_write_pack(p);
  edit_manifest(p, "\"kind\": \"qsakv-overlay\",",
                "\"kind\": \"qsakv-overlay\", \"fallback_scale\": 1.0,");
  OVF_EXPECT(ovf_load_validate(p), QSAKV_ERROR_FORMAT);
  OVF_MESSAGE_HAS("unknown field \"fallback_scale\"");
}

static void test_manifest_newer_schema(void** state) {
  ovf_pack* p = *state;
  ovf_write_pack(p);
  edit_manifest(p, "\"schema_version\": 1", "\"schema_version\": 2");
  OVF_EXPECT(ovf_load_validate(p), QSAKV_ERROR_FORMAT);
  OVF_MESSAGE_HAS("schema_version");
}

static void test_manifest_other_scale_contract(void** state) {
  ovf_pack* p = *state;
  ovf_write_pack(p);
  edit_manifest(p, "max_abs/448", "p99.9/448");
  OVF_EXPECT(ovf_load_validate(p), QSAKV_ERROR_FORMAT);
}

static void test_manifest_bad_contract_value(void** state) {
  ovf_pack* p = *state;
  p->contract =
      "{\"tp_size\": 4, \"speculative_tokens\": 0, \"activation_dtype\": \"fp8\", "
      "\"min_sm\": 70}";
  ovf_write_pack(p);
  OVF_EXPECT(ovf_load_validate(p), QSAKV_ERROR_FORMAT);
}

static void test_manifest_names_differ_from_file(void** state) {
  ovf_pack* p = *state;
  ovf_write_pack(p);
  edit_manifest(p, "model.layers.47.self_attn.v_scale", "model.layers.47.self_attn.attn.v_scale");
  OVF_EXPECT(ovf_load_validate(p), QSAKV_ERROR_FORMAT);
}

static void test_manifest_name_listed_twice(void** state) {
  ovf_pack* p = *state;
  ovf_write_pack(p);
  edit_manifest(p, "\"tensor_names\": [",
                "\"tensor_names\": [\"model.layers.3.self_attn.k_scale\", ");
  OVF_EXPECT(ovf_load_validate(p), QSAKV_ERROR_OVERLAY_DUPLICATE);
}

static void test_scale_file_is_a_directory(void** state) {
  /* "Unreadable": the tests run as root, for whom chmod 000 changes nothing, so a
   * directory stands where the file should be. As another user chmod 000 is tried too. */
  ovf_pack* p = *state;
  ovf_write_pack(p);
  char dir[OVF_PATH + 8];
  snprintf(dir, sizeof dir, "%s/ckpt", p->root);
  assert_int_equal(mkdir(dir, 0755), 0);
  char path[OVF_PATH + 64];
  snprintf(path, sizeof path, "%s/model-kvscales.safetensors", dir);
  assert_int_equal(mkdir(path, 0755), 0);
  snprintf(path, sizeof path, "%s/qsakv-overlay.json", dir);
  assert_int_equal(symlink(p->manifest, path), 0);
  qsakv_overlay* o = NULL;
  OVF_EXPECT(qsakv_overlay_load(&o, dir, NULL), QSAKV_ERROR_IO);
  assert_null(o);
  if (geteuid() != 0) {
    assert_int_equal(chmod(p->scale, 0), 0);
    OVF_EXPECT(qsakv_overlay_load(&o, p->scale, NULL), QSAKV_ERROR_IO);
    assert_int_equal(chmod(p->scale, 0644), 0);
  }
}

static void test_scale_file_is_a_fifo(void** state) {
  /* Must neither block nor read it as an empty file (that would be HASH_MISMATCH). */
  ovf_pack* p = *state;
  ovf_write_pack(p);
  char dir[OVF_PATH + 8], path[OVF_PATH + 64];
  snprintf(dir, sizeof dir, "%s/ckpt", p->root);
  assert_int_equal(mkdir(dir, 0755), 0);
  snprintf(path, sizeof path, "%s/model-kvscales.safetensors", dir);
  assert_int_equal(mkfifo(path, 0644), 0);
  snprintf(path, sizeof path, "%s/qsakv-overlay.json", dir);
  assert_int_equal(symlink(p->manifest, path), 0);
  qsakv_overlay* o = NULL;
  OVF_EXPECT(qsakv_overlay_load(&o, dir, NULL), QSAKV_ERROR_IO);
  OVF_MESSAGE_HAS("not a regular file");
}

static void test_symlink_loop(void** state) {
  ovf_pack* p = *state;
  ovf_write_pack(p);
  char dir[OVF_PATH + 8];
  snprintf(dir, sizeof dir, "%s/ckpt", p->root);
  assert_int_equal(mkdir(dir, 0755), 0);
  char a[OVF_PATH + 64], b[OVF_PATH + 64];
  snprintf(a, sizeof a, "%s/model-kvscales.safetensors", dir);
  snprintf(b, sizeof b, "%s/loop", dir);
  assert_int_equal(symlink(b, a), 0); /* scale file -> loop -> scale file */
  assert_int_equal(symlink(a, b), 0);
  snprintf(b, sizeof b, "%s/qsakv-overlay.json", dir);
  assert_int_equal(symlink(p->manifest, b), 0);
  qsakv_overlay* o = NULL;
  OVF_EXPECT(qsakv_overlay_load(&o, dir, NULL), QSAKV_ERROR_IO);
  /* The directory itself a loop. */
  snprintf(a, sizeof a, "%s/selfloop", p->root);
  assert_int_equal(symlink(a, a), 0);
  OVF_EXPECT(qsakv_overlay_load(&o, a, NULL), QSAKV_ERROR_IO);
}

/* ---- the merged index of a checkpoint directory -------------------------------------- */

/* A checkpoint dir in root/ckpt with the pack's files and the given index text. */
static void make_checkpoint(ovf_pack* p, const char* index, char* dir, size_t cap) {
  ovf_write_pack(p);
  snprintf(dir, cap, "%s/ckpt", p->root);
  assert_int_equal(mkdir(dir, 0755), 0);
  char path[OVF_PATH + 64];
  snprintf(path, sizeof path, "%s/model-kvscales.safetensors", dir);
  assert_int_equal(symlink(p->scale, path), 0);
  snprintf(path, sizeof path, "%s/qsakv-overlay.json", dir);
  assert_int_equal(symlink(p->manifest, path), 0);
  snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
  ovf_write_text(path, index);
}

/* An index mapping every pack name to the scale file, with `extra` spliced in first. */
static void index_text(const ovf_pack* p, const char* extra, const char* skip, char* out,
                       size_t cap) {
  snprintf(out, cap, "{\"weight_map\": {%s", extra);
  for (int i = 0; i < p->n; ++i) {
    if (skip && !strcmp(p->t[i].name, skip)) continue;
    size_t used = strlen(out);
    snprintf(out + used, cap - used, "%s\"%s\": \"model-kvscales.safetensors\"",
             (i || *extra) ? ", " : "", p->t[i].name);
  }
  strncat(out, "}}", cap - strlen(out) - 1);
}

static qsakv_status validate_dir(ovf_pack* p, const char* dir) {
  qsakv_overlay* o = NULL;
  qsakv_status s = qsakv_overlay_load(&o, dir, NULL);
  if (s != QSAKV_SUCCESS) return s;
  qsakv_model_config c;
  ovf_config(&c, 1);
  s = qsakv_overlay_validate(o, &c, p->base_sha);
  qsakv_overlay_destroy(o);
  return s;
}

static void test_checkpoint_dir_is_valid(void** state) {
  ovf_pack* p = *state;
  char index[1 << 14], dir[OVF_PATH + 8];
  index_text(p, "\"model.embed_tokens.weight\": \"model-00001.safetensors\"", NULL, index,
             sizeof index);
  make_checkpoint(p, index, dir, sizeof dir);
  OVF_OK(validate_dir(p, dir));
}

static void test_name_already_in_base(void** state) {
  ovf_pack* p = *state;
  char index[1 << 14], dir[OVF_PATH + 8];
  /* The base had its own layer 7 k_scale in a shard: the merged index still points there. */
  index_text(p, "\"model.layers.7.self_attn.k_scale\": \"model-00002.safetensors\"",
             "model.layers.7.self_attn.k_scale", index, sizeof index);
  make_checkpoint(p, index, dir, sizeof dir);
  OVF_EXPECT(validate_dir(p, dir), QSAKV_ERROR_OVERLAY_DUPLICATE);
  OVF_MESSAGE_HAS("already in the base checkpoint");
}

static void test_index_lists_a_name_twice(void** state) {
  ovf_pack* p = *state;
  char index[1 << 14], dir[OVF_PATH + 8];
  index_text(p, "\"model.layers.7.self_attn.k_scale\": \"model-00002.safetensors\"", NULL, index,
             sizeof index);
  make_checkpoint(p, index, dir, sizeof dir);
  OVF_EXPECT(validate_dir(p, dir), QSAKV_ERROR_OVERLAY_DUPLICATE);
  OVF_MESSAGE_HAS("twice");
}

static void test_index_lacks_a_scale(void** state) {
  ovf_pack* p = *state;
  char index[1 << 14], dir[OVF_PATH + 8];
  index_text(p, "", "model.layers.31.self_attn.v_scale", index, sizeof index);
  make_checkpoint(p, index, dir, sizeof dir);
  OVF_EXPECT(validate_dir(p, dir), QSAKV_ERROR_OVERLAY_INCOMPLETE);
  OVF_MESSAGE_HAS("layer 31 v_scale");
}

static void test_index_promises_a_tensor_the_file_lacks(void** state) {
  ovf_pack* p = *state;
  char index[1 << 14], dir[OVF_PATH + 8];
  index_text(p, "\"model.layers.51.self_attn.k_scale\": \"model-kvscales.safetensors\"", NULL,
             index, sizeof index);
  make_checkpoint(p, index, dir, sizeof dir);
  OVF_EXPECT(validate_dir(p, dir), QSAKV_ERROR_FORMAT);
}

static void test_index_not_json(void** state) {
  ovf_pack* p = *state;
  char dir[OVF_PATH + 8];
  make_checkpoint(p, "{\"weight_map\": ", dir, sizeof dir);
  OVF_EXPECT(validate_dir(p, dir), QSAKV_ERROR_FORMAT);
}

/* ---- validation state and config --------------------------------------------------- */

static void test_failed_validation_clears_validated(void** state) {
  ovf_pack* p = *state;
  ovf_write_pack(p);
  qsakv_overlay* o = NULL;
  OVF_OK(ovf_load(p, &o));
  qsakv_model_config c;
  ovf_config(&c, 1);
  qsakv_overlay_info info;
  memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  OVF_OK(qsakv_overlay_validate(o, &c, p->base_sha));
  OVF_OK(qsakv_overlay_get_info(o, &info));
  assert_int_equal(info.validated, 1);
  c.num_qsa_layers = 11; /* layer 47 is no longer QSA: its scales are unknown */
  OVF_EXPECT(qsakv_overlay_validate(o, &c, p->base_sha), QSAKV_ERROR_OVERLAY_UNKNOWN_TENSOR);
  OVF_OK(qsakv_overlay_get_info(o, &info));
  assert_int_equal(info.validated, 0);
  ovf_config(&c, 1);
  OVF_OK(qsakv_overlay_validate(o, &c, p->base_sha));
  /* Refused arguments unvalidate too. */
  OVF_EXPECT(qsakv_overlay_validate(o, &c, NULL), QSAKV_ERROR_INVALID_ARGUMENT);
  OVF_OK(qsakv_overlay_get_info(o, &info));
  assert_int_equal(info.validated, 0);
  OVF_OK(qsakv_overlay_validate(o, &c, p->base_sha));
  c.head_dim = 100; /* an invalid config is refused as such, and unvalidates too */
  OVF_EXPECT(qsakv_overlay_validate(o, &c, p->base_sha), QSAKV_ERROR_INVALID_CONFIG);
  OVF_OK(qsakv_overlay_get_info(o, &info));
  assert_int_equal(info.validated, 0);
  qsakv_overlay_destroy(o);
}

#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)

int main(void) {
  const struct CMUnitTest tests[] = {
      T(test_sanity_the_fixture_is_valid),
      T(test_empty_file),
      T(test_truncated_inside_length),
      T(test_truncated_inside_header),
      T(test_truncated_data),
      T(test_header_length_larger_than_file),
      T(test_header_length_zero),
      T(test_header_length_over_limit),
      T(test_header_not_json),
      T(test_header_json_array),
      T(test_header_json_then_garbage),
      T(test_header_padding_spaces_are_fine),
      T(test_header_invalid_utf8),
      T(test_trailing_garbage),
      T(test_offsets_past_end),
      T(test_overlapping_offsets),
      T(test_gap_in_data),
      T(test_offsets_do_not_match_size),
      T(test_negative_offset),
      T(test_fractional_offset),
      T(test_unknown_dtype),
      T(test_unknown_entry_field),
      T(test_duplicated_entry_field),
      T(test_metadata_not_strings),
      T(test_metadata_other_scale_contract),
      T(test_metadata_unit_flag_contradicts_manifest),
      T(test_duplicate_tensor_key),
      T(test_dtype_f16),
      T(test_dtype_f64),
      T(test_dtype_bf16_packed_in_f32_bytes),
      T(test_shape_one),
      T(test_shape_two),
      T(test_scale_nan),
      T(test_scale_inf),
      T(test_scale_minus_inf),
      T(test_scale_zero),
      T(test_scale_negative_zero),
      T(test_scale_negative),
      T(test_scale_negative_subnormal),
      T(test_scale_positive_subnormal_is_valid),
      T(test_23_of_24),
      T(test_22_of_24_names_both),
      T(test_no_tensors),
      T(test_extra_unknown_tensor),
      T(test_scale_of_non_qsa_layer),
      T(test_scale_of_layer_past_the_model),
      T(test_same_scale_under_two_spellings),
      T(test_mixed_prefixes),
      T(test_scale_file_hash_mismatch),
      T(test_wrong_base_revision),
      T(test_revision_not_a_hash),
      T(test_contract_tp),
      T(test_contract_speculative_tokens),
      T(test_contract_activation_dtype),
      T(test_unconstrained_contract_accepts_any_runtime),
      T(test_missing_path),
      T(test_directory_without_scale_file),
      T(test_missing_manifest),
      T(test_manifest_not_json),
      T(test_manifest_duplicate_key),
      T(test_manifest_missing_field),
      T(test_manifest_unknown_field),
      T(test_manifest_newer_schema),
      T(test_manifest_other_scale_contract),
      T(test_manifest_bad_contract_value),
      T(test_manifest_names_differ_from_file),
      T(test_manifest_name_listed_twice),
      T(test_scale_file_is_a_directory),
      T(test_scale_file_is_a_fifo),
      T(test_symlink_loop),
      T(test_checkpoint_dir_is_valid),
      T(test_name_already_in_base),
      T(test_index_lists_a_name_twice),
      T(test_index_lacks_a_scale),
      T(test_index_promises_a_tensor_the_file_lacks),
      T(test_index_not_json),
      T(test_failed_validation_clears_validated),
  };
  return cmocka_run_group_tests_name("overlay_adversarial", tests, NULL, NULL);
}
