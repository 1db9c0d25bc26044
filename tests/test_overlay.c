// SPDX-License-Identifier: Apache-2.0
/* Overlays through the public API: writing a scale pack, loading it in every form
 * (bare file, explicit manifest, pack directory, materialised checkpoint), every
 * accepted name spelling and prefix, validation for the reference config at TP1 and
 * TP4, and the refusals of the writer and of materialisation. Malformed inputs are in
 * test_overlay_adversarial.c. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
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

static qsakv_overlay_info info_of(const qsakv_overlay* o) { return tu_overlay_info(o); }

/* Reference scales: k = 0.01 * (i + 1), v = 0.02 * (i + 1) for QSA layer index i. */
static void reference_scales(int32_t* layers, float* k, float* v) {
  for (int i = 0; i < 12; ++i) {
    layers[i] = 4 * i + 3;
    k[i] = 0.01f * (float)(i + 1);
    v[i] = 0.02f * (float)(i + 1);
  }
}

/* Writes root/out with the library's writer. */
static void write_pack(ovf_pack* p, const qsakv_overlay_write_options* extra, char* out,
                       size_t cap) {
  int32_t layers[12];
  float k[12], v[12];
  reference_scales(layers, k, v);
  qsakv_overlay_write_options wo;
  if (extra) {
    wo = *extra;
  } else {
    OVF_OK(qsakv_overlay_write_options_init(&wo));
  }
  wo.base_index_path = p->base_index;
  snprintf(out, cap, "%s/out", p->root);
  OVF_OK(qsakv_overlay_write(out, layers, k, v, 12, &wo));
}

static void expect_reference_scales(const qsakv_overlay* o) {
  for (int i = 0; i < 12; ++i) {
    float k = 0, v = 0;
    OVF_OK(qsakv_overlay_get_scales(o, 4 * i + 3, &k, &v));
    assert_true(k == 0.01f * (float)(i + 1)); /* bit-exact round trip */
    assert_true(v == 0.02f * (float)(i + 1));
  }
}

static void test_write_then_load_bare_file(void** state) {
  ovf_pack* p = *state;
  char out[OVF_PATH], scale[OVF_PATH + 64];
  write_pack(p, NULL, out, sizeof out);
  snprintf(scale, sizeof scale, "%s/model-kvscales.safetensors", out);
  qsakv_overlay* o = NULL;
  OVF_OK(qsakv_overlay_load(&o, scale, NULL));
  qsakv_overlay_info info = info_of(o);
  assert_int_equal(info.num_scales, 24);
  assert_int_equal(info.validated, 0);
  assert_int_equal(info.unit_scale_control, 0);
  assert_int_equal(info.contract_tp_size, 0);
  assert_int_equal(info.contract_speculative_tokens, -1);
  assert_int_equal(info.contract_activation_dtype, QSAKV_DTYPE_INVALID);
  assert_int_equal(info.contract_min_sm, 0);
  assert_string_equal(info.base_index_sha256, p->base_sha);
  char sha[65];
  ovf_sha256_file(scale, sha);
  assert_string_equal(info.scale_file_sha256, sha);
  assert_string_equal(info.layer_prefix, "model.layers");
  expect_reference_scales(o); /* readable before validation, for inspection */
  qsakv_model_config c;
  ovf_config(&c, 1);
  OVF_OK(qsakv_overlay_validate(o, &c, p->base_sha));
  assert_int_equal(info_of(o).validated, 1);
  expect_reference_scales(o);
  float k, v;
  OVF_EXPECT(qsakv_overlay_get_scales(o, 4, &k, &v), QSAKV_ERROR_INVALID_ARGUMENT);
  OVF_EXPECT(qsakv_overlay_get_scales(o, 3, NULL, &v), QSAKV_ERROR_INVALID_ARGUMENT);
  qsakv_overlay_destroy(o);
}

static void test_uppercase_revision_is_accepted(void** state) {
  ovf_pack* p = *state;
  char out[OVF_PATH], upper[65];
  write_pack(p, NULL, out, sizeof out);
  qsakv_overlay* o = NULL;
  OVF_OK(qsakv_overlay_load(&o, out, NULL));
  for (int i = 0; i < 65; ++i)
    upper[i] = (p->base_sha[i] >= 'a' && p->base_sha[i] <= 'f') ? (char)(p->base_sha[i] - 32)
                                                                : p->base_sha[i];
  qsakv_model_config c;
  ovf_config(&c, 1);
  OVF_OK(qsakv_overlay_validate(o, &c, upper));
  qsakv_overlay_destroy(o);
}

static void test_written_files(void** state) {
  ovf_pack* p = *state;
  char out[OVF_PATH], path[OVF_PATH + 64];
  write_pack(p, NULL, out, sizeof out);
  snprintf(path, sizeof path, "%s/qsakv-overlay.json", out);
  char* m = ovf_read_text(path);
  assert_non_null(m);
  assert_non_null(strstr(m, p->base_sha));
  assert_non_null(strstr(m, "\"layer_prefix\": \"model.layers\""));
  assert_non_null(strstr(m, "model.layers.47.self_attn.v_scale"));
  free(m);
  snprintf(path, sizeof path, "%s/model-kvscales.safetensors", out);
  char* s = ovf_read_text(path);
  assert_non_null(s);
  assert_non_null(strstr(s + 8, "e4m3fn(x/scale), max_abs/448"));
  assert_non_null(strstr(s + 8, "\"qsakv.unit_scale_control\":\"0\""));
  uint64_t hn = 0;
  for (int b = 7; b >= 0; --b) hn = (hn << 8) | (unsigned char)s[b];
  assert_int_equal(hn % 8, 0); /* data section 8-byte aligned, as the reference writer */
  free(s);
  /* No staging directory left beside the output. */
  char cmd[OVF_PATH + 64];
  snprintf(cmd, sizeof cmd, "ls -d %s/out.staging-* 2>/dev/null | grep -q .", p->root);
  assert_int_not_equal(system(cmd), 0);
}

static void test_explicit_manifest_path(void** state) {
  ovf_pack* p = *state;
  char out[OVF_PATH], scale[OVF_PATH + 64], from[OVF_PATH + 64], to[OVF_PATH + 64];
  write_pack(p, NULL, out, sizeof out);
  snprintf(scale, sizeof scale, "%s/model-kvscales.safetensors", out);
  snprintf(from, sizeof from, "%s/qsakv-overlay.json", out);
  snprintf(to, sizeof to, "%s/elsewhere.json", p->root);
  assert_int_equal(rename(from, to), 0);
  qsakv_overlay* o = NULL;
  OVF_EXPECT(qsakv_overlay_load(&o, scale, NULL), QSAKV_ERROR_OVERLAY_MISSING);
  OVF_OK(qsakv_overlay_load(&o, scale, to));
  assert_int_equal(info_of(o).num_scales, 24);
  qsakv_overlay_destroy(o);
}

static void test_pack_directory(void** state) {
  ovf_pack* p = *state;
  char out[OVF_PATH];
  write_pack(p, NULL, out, sizeof out);
  qsakv_overlay* o = NULL;
  OVF_OK(qsakv_overlay_load(&o, out, NULL));
  qsakv_model_config c;
  ovf_config(&c, 1);
  OVF_OK(qsakv_overlay_validate(o, &c, p->base_sha));
  expect_reference_scales(o);
  qsakv_overlay_destroy(o);
}

static void test_materialized_checkpoint(void** state) {
  ovf_pack* p = *state;
  char out[OVF_PATH], ckpt[OVF_PATH + 16], path[OVF_PATH + 64];
  write_pack(p, NULL, out, sizeof out);
  snprintf(ckpt, sizeof ckpt, "%s/ckpt", p->root);
  OVF_OK(qsakv_overlay_materialize(ckpt, p->base_dir, out));
  /* Untouched base files are links; the merged index maps the 24 names. */
  struct stat st;
  snprintf(path, sizeof path, "%s/model-00001-of-00002.safetensors", ckpt);
  assert_int_equal(lstat(path, &st), 0);
  assert_true(S_ISLNK(st.st_mode));
  snprintf(path, sizeof path, "%s/qsakv-provenance.json", ckpt);
  char* prov = ovf_read_text(path);
  assert_non_null(prov);
  assert_non_null(strstr(prov, p->base_sha));
  free(prov);
  snprintf(path, sizeof path, "%s/model.safetensors.index.json", ckpt);
  char* index = ovf_read_text(path);
  assert_non_null(index);
  assert_non_null(
      strstr(index, "\"model.layers.47.self_attn.v_scale\": \"model-kvscales.safetensors\""));
  assert_non_null(strstr(index, "\"model.embed_tokens.weight\""));
  /* total_size: 1000 + the scale file's size. */
  snprintf(path, sizeof path, "%s/model-kvscales.safetensors", out);
  assert_int_equal(stat(path, &st), 0);
  char want[64];
  snprintf(want, sizeof want, "\"total_size\": %lld", 1000LL + (long long)st.st_size);
  assert_non_null(strstr(index, want));
  free(index);
  qsakv_overlay* o = NULL;
  OVF_OK(qsakv_overlay_load(&o, ckpt, NULL));
  qsakv_model_config c;
  ovf_config(&c, 1);
  OVF_OK(qsakv_overlay_validate(o, &c, p->base_sha));
  expect_reference_scales(o);
  qsakv_overlay_destroy(o);
  /* A second materialisation onto the same directory is refused. */
  OVF_EXPECT(qsakv_overlay_materialize(ckpt, p->base_dir, out), QSAKV_ERROR_INVALID_ARGUMENT);
}

static void test_materialize_other_revision(void** state) {
  ovf_pack* p = *state;
  char out[OVF_PATH], ckpt[OVF_PATH + 16];
  write_pack(p, NULL, out, sizeof out);
  /* The base checkpoint moves on after calibration. */
  ovf_write_text(p->base_index,
                 "{\"weight_map\": {\"model.norm.weight\": \"model-00001.safetensors\"}}");
  snprintf(ckpt, sizeof ckpt, "%s/ckpt", p->root);
  OVF_EXPECT(qsakv_overlay_materialize(ckpt, p->base_dir, out), QSAKV_ERROR_REVISION_MISMATCH);
  assert_false(ovf_exists(ckpt));
}

/* The revision of a materialised checkpoint is its base's, hashed now: the README's flow
 * (revision and overlay from the same directory) holds, and a base that moved on after
 * materialisation is a revision mismatch, not scales silently served with new weights. */
static void test_materialized_checkpoint_revision_is_the_base_s(void** state) {
  ovf_pack* p = *state;
  char out[OVF_PATH], ckpt[OVF_PATH + 16], path[OVF_PATH + 64], rev[65], merged[65];
  write_pack(p, NULL, out, sizeof out);
  snprintf(ckpt, sizeof ckpt, "%s/ckpt", p->root);
  OVF_OK(qsakv_overlay_materialize(ckpt, p->base_dir, out));
  OVF_OK(qsakv_checkpoint_revision(ckpt, rev));
  assert_string_equal(rev, p->base_sha);
  /* The index file itself still hashes as it is (the merged index). */
  snprintf(path, sizeof path, "%s/model.safetensors.index.json", ckpt);
  OVF_OK(qsakv_checkpoint_revision(path, merged));
  assert_string_not_equal(merged, p->base_sha);
  qsakv_overlay* o = NULL;
  qsakv_model_config c;
  ovf_config(&c, 1);
  OVF_OK(qsakv_overlay_load(&o, ckpt, NULL));
  OVF_OK(qsakv_overlay_validate(o, &c, rev));
  qsakv_overlay_destroy(o);
  /* The base moves on in place: the materialised directory's revision moves with it. */
  ovf_write_text(p->base_index,
                 "{\"weight_map\": {\"model.norm.weight\": \"model-00001.safetensors\"}}");
  OVF_OK(qsakv_checkpoint_revision(ckpt, rev));
  assert_string_not_equal(rev, p->base_sha);
  OVF_OK(qsakv_overlay_load(&o, ckpt, NULL));
  OVF_EXPECT(qsakv_overlay_validate(o, &c, rev), QSAKV_ERROR_REVISION_MISMATCH);
  qsakv_overlay_destroy(o);
  /* The base gone: no revision (the record names it). */
  assert_int_equal(unlink(p->base_index), 0);
  OVF_EXPECT(qsakv_checkpoint_revision(ckpt, rev), QSAKV_ERROR_IO);
  assert_non_null(strstr(qsakv_last_error(), "is a materialised checkpoint"));
  assert_non_null(strstr(qsakv_last_error(), p->base_dir));
  /* The merged index edited after materialisation. */
  ovf_write_text(p->base_index, "{\"weight_map\": {}}");
  ovf_write_text(path, "{\"weight_map\": {}}");
  OVF_EXPECT(qsakv_checkpoint_revision(ckpt, rev), QSAKV_ERROR_HASH_MISMATCH);
  assert_non_null(strstr(qsakv_last_error(), "index changed since it was built"));
  /* A provenance record that is not one. */
  snprintf(path, sizeof path, "%s/qsakv-provenance.json", ckpt);
  ovf_write_text(path, "{\"schema_version\": 1, \"kind\": \"qsakv-provenance\"}");
  OVF_EXPECT(qsakv_checkpoint_revision(ckpt, rev), QSAKV_ERROR_FORMAT);
  assert_non_null(strstr(qsakv_last_error(), "lacks the field \"base_checkpoint\""));
  ovf_write_text(path, "{\"schema_version\": 2}");
  OVF_EXPECT(qsakv_checkpoint_revision(ckpt, rev), QSAKV_ERROR_FORMAT);
  assert_non_null(strstr(qsakv_last_error(), "schema_version is 2"));
}

/* Replaces the first `from` in the file at `path` with `to`; the text must be there. */
static void edit_file(const char* path, const char* from, const char* to) {
  char* text = ovf_read_text(path);
  assert_non_null(text);
  char* at = strstr(text, from);
  if (!at) fail_msg("%s lacks \"%s\"", path, from);
  const size_t n = strlen(text) - strlen(from) + strlen(to) + 1;
  char* out = malloc(n);
  assert_non_null(out);
  snprintf(out, n, "%.*s%s%s", (int)(at - text), text, to, at + strlen(from));
  ovf_write_text(path, out);
  free(out);
  free(text);
}

static void copy_file(const char* from, const char* to) {
  FILE* f = fopen(from, "rb");
  assert_non_null(f);
  static char buf[1 << 16];
  const size_t n = fread(buf, 1, sizeof buf, f);
  assert_true(n < sizeof buf && feof(f));
  fclose(f);
  ovf_write_file(to, buf, n);
}

/* `<what> <path> has SHA-256 <actual>; <record> records <expected>`: the refusal names
 * the file, the hash it has now and the hash the provenance record holds. */
static void expect_record_mismatch(const char* ckpt, const char* file, const char* recorded) {
  char path[OVF_PATH + 64], actual[65];
  snprintf(path, sizeof path, "%s/%s", ckpt, file);
  ovf_sha256_file(path, actual);
  OVF_MESSAGE_HAS(path);
  OVF_MESSAGE_HAS(actual);
  OVF_MESSAGE_HAS(recorded);
  OVF_MESSAGE_HAS("qsakv-provenance.json");
  OVF_MESSAGE_HAS("changed since the checkpoint was built");
}

/* A materialised checkpoint's provenance record vouches for its scale file, manifest and
 * merged index: another pack's files copied over them, or a manifest whose contract was
 * widened in place, are refused at load (the manifest's own hash of the scale file cannot
 * tell: a swapped pack brings a manifest that matches it). */
static void test_materialized_checkpoint_files_must_match_the_record(void** state) {
  ovf_pack* p = *state;
  char out[OVF_PATH], unit[OVF_PATH + 16], ckpt[OVF_PATH + 16];
  char from[OVF_PATH + 64], to[OVF_PATH + 64], scale[OVF_PATH + 64], manifest[OVF_PATH + 64];
  char index[OVF_PATH + 64], other[OVF_PATH + 64];
  char scale_sha[65], manifest_sha[65], index_sha[65];
  qsakv_overlay_write_options wo;
  OVF_OK(qsakv_overlay_write_options_init(&wo));
  wo.contract_tp_size = 4;
  write_pack(p, &wo, out, sizeof out);
  /* Another pack for the same base: unit scales, no contract. */
  int32_t layers[12];
  float k[12], v[12];
  reference_scales(layers, k, v);
  for (int i = 0; i < 12; ++i) k[i] = v[i] = 1.0f;
  OVF_OK(qsakv_overlay_write_options_init(&wo));
  wo.base_index_path = p->base_index;
  snprintf(unit, sizeof unit, "%s/unit", p->root);
  OVF_OK(qsakv_overlay_write(unit, layers, k, v, 12, &wo));
  snprintf(ckpt, sizeof ckpt, "%s/ckpt", p->root);
  OVF_OK(qsakv_overlay_materialize(ckpt, p->base_dir, out));
  snprintf(scale, sizeof scale, "%s/model-kvscales.safetensors", ckpt);
  snprintf(manifest, sizeof manifest, "%s/qsakv-overlay.json", ckpt);
  snprintf(index, sizeof index, "%s/model.safetensors.index.json", ckpt);
  ovf_sha256_file(scale, scale_sha);
  ovf_sha256_file(manifest, manifest_sha);
  ovf_sha256_file(index, index_sha);
  qsakv_model_config c;
  ovf_config(&c, 4);
  char rev[65];
  qsakv_overlay* o = NULL;
  OVF_OK(qsakv_overlay_load(&o, ckpt, NULL));
  qsakv_overlay_destroy(o);

  /* 1. The other pack's scale file and manifest copied in: the pair agrees with itself,
   * the record says otherwise. The manifest is checked first. */
  snprintf(from, sizeof from, "%s/model-kvscales.safetensors", unit);
  copy_file(from, scale);
  snprintf(from, sizeof from, "%s/qsakv-overlay.json", unit);
  copy_file(from, manifest);
  OVF_OK(qsakv_checkpoint_revision(ckpt, rev)); /* the index is untouched */
  OVF_EXPECT(qsakv_overlay_load(&o, ckpt, NULL), QSAKV_ERROR_HASH_MISMATCH);
  assert_null(o);
  expect_record_mismatch(ckpt, "qsakv-overlay.json", manifest_sha);
  OVF_MESSAGE_HAS("manifest");
  /* Named as a bare file in that directory: the same record holds. */
  OVF_EXPECT(qsakv_overlay_load(&o, scale, NULL), QSAKV_ERROR_HASH_MISMATCH);
  expect_record_mismatch(ckpt, "qsakv-overlay.json", manifest_sha);

  /* 2. Only the scale file swapped (the original manifest back): the scale file is
   * checked against the record before the manifest's own hash of it. */
  snprintf(from, sizeof from, "%s/qsakv-overlay.json", out);
  copy_file(from, manifest);
  OVF_EXPECT(qsakv_overlay_load(&o, ckpt, NULL), QSAKV_ERROR_HASH_MISMATCH);
  expect_record_mismatch(ckpt, "model-kvscales.safetensors", scale_sha);
  OVF_MESSAGE_HAS("scale file");
  snprintf(from, sizeof from, "%s/model-kvscales.safetensors", out);
  copy_file(from, scale);
  OVF_OK(qsakv_overlay_load(&o, ckpt, NULL));
  OVF_OK(qsakv_overlay_validate(o, &c, rev));
  qsakv_overlay_destroy(o);

  /* 3. The manifest's contract widened in place: TP 2 would then validate. */
  edit_file(manifest, "\"tp_size\": 4", "\"tp_size\": null");
  OVF_EXPECT(qsakv_overlay_load(&o, ckpt, NULL), QSAKV_ERROR_HASH_MISMATCH);
  expect_record_mismatch(ckpt, "qsakv-overlay.json", manifest_sha);
  /* ... nor through manifest_path: whatever manifest is read must be the recorded one. */
  snprintf(other, sizeof other, "%s/widened.json", p->root);
  copy_file(manifest, other);
  snprintf(from, sizeof from, "%s/qsakv-overlay.json", out);
  copy_file(from, manifest);
  OVF_EXPECT(qsakv_overlay_load(&o, ckpt, other), QSAKV_ERROR_HASH_MISMATCH);
  OVF_MESSAGE_HAS(other);
  OVF_MESSAGE_HAS(manifest_sha);
  snprintf(to, sizeof to, "%s/same.json", p->root);
  copy_file(manifest, to);
  OVF_OK(qsakv_overlay_load(&o, ckpt, to)); /* an identical copy is the recorded manifest */
  qsakv_overlay_destroy(o);

  /* 4. The merged index edited (a change that keeps every scale mapped): the load, not
   * only qsakv_checkpoint_revision, refuses it. */
  edit_file(index, "\"weight_map\": {",
            "\"weight_map\": {\"model.extra.weight\": "
            "\"model-00001-of-00002.safetensors\", ");
  OVF_EXPECT(qsakv_overlay_load(&o, ckpt, NULL), QSAKV_ERROR_HASH_MISMATCH);
  expect_record_mismatch(ckpt, "model.safetensors.index.json", index_sha);
  OVF_MESSAGE_HAS("merged index");
}

/* ---- a pack file changing while materialisation reads it ---------------------------- */

/* The library opens files with open(2), through its PLT entry, which binds to this
 * definition (the executable's comes first): once armed, the race_at-th open of
 * race_path first overwrites that file with race_bytes, as another process could between
 * the pack's load and its copy. Every open goes on to the kernel unchanged. */
static const char* race_path;
static int race_at;
static const void* race_bytes;
static size_t race_len;
static int race_fired;

int open(const char* path, int flags, ...) {
  mode_t mode = 0;
  if (flags & (O_CREAT | O_TMPFILE)) {
    va_list ap;
    va_start(ap, flags);
    mode = va_arg(ap, mode_t);
    va_end(ap);
  }
  if (race_path && strcmp(path, race_path) == 0 && --race_at == 0) {
    race_path = NULL;
    ovf_write_file(path, race_bytes, race_len); /* fopen: glibc's own open, not this one */
    race_fired = 1;
  }
  return (int)syscall(SYS_openat, AT_FDCWD, path, flags, mode);
}

static size_t read_bytes(const char* path, char* buf, size_t cap) {
  FILE* f = fopen(path, "rb");
  assert_non_null(f);
  const size_t n = fread(buf, 1, cap, f);
  assert_true(n < cap && feof(f));
  fclose(f);
  return n;
}

/* Materialises pack `out` into `ckpt` while `path` is rewritten to `bytes` (race_bytes,
 * race_len) at its second open (the load's read, then the copy's): refused as changed,
 * the message naming the file and its hashes before and after, nothing left behind. */
static void expect_materialize_race(ovf_pack* p, const char* ckpt, const char* out,
                                    const char* path, const char* before, const char* after) {
  race_fired = 0;
  race_at = 2;
  race_path = path;
  const qsakv_status s = qsakv_overlay_materialize(ckpt, p->base_dir, out);
  race_path = NULL;
  assert_true(race_fired);
  OVF_EXPECT(s, QSAKV_ERROR_HASH_MISMATCH);
  OVF_MESSAGE_HAS(path);
  OVF_MESSAGE_HAS("changed while the checkpoint was built");
  OVF_MESSAGE_HAS(before);
  OVF_MESSAGE_HAS(after);
  assert_false(ovf_exists(ckpt));
}

/* Materialisation copies the pack's files from a second read: a scale file or manifest
 * that changed after the load checked it is refused, naming the file and both hashes. A
 * manifest edited so that it still lists the scale file's hash (here: its contract
 * widened) counts as changed too: it was compared only by that hash, so its new contract
 * was copied into the checkpoint and recorded. */
static void test_materialize_refuses_a_pack_changed_while_read(void** state) {
  ovf_pack* p = *state;
  char out[OVF_PATH], ckpt[OVF_PATH + 16], scale[OVF_PATH + 64], manifest[OVF_PATH + 64];
  char other[OVF_PATH + 64], before[65], after[65];
  static char bytes[1 << 16];
  qsakv_overlay_write_options wo;
  OVF_OK(qsakv_overlay_write_options_init(&wo));
  wo.contract_tp_size = 4;
  write_pack(p, &wo, out, sizeof out);
  snprintf(scale, sizeof scale, "%s/model-kvscales.safetensors", out);
  snprintf(manifest, sizeof manifest, "%s/qsakv-overlay.json", out);
  snprintf(ckpt, sizeof ckpt, "%s/ckpt", p->root);
  snprintf(other, sizeof other, "%s/other.bin", p->root);

  /* 1. The scale file: another file's bytes (the manifest's, any will do) by the copy. */
  ovf_sha256_file(scale, before);
  race_len = read_bytes(manifest, bytes, sizeof bytes);
  race_bytes = bytes;
  ovf_write_file(other, bytes, race_len);
  ovf_sha256_file(other, after);
  expect_materialize_race(p, ckpt, out, scale, before, after);

  /* 2. The manifest, its contract widened (the scale file's hash in it unchanged). */
  ovf_rmtree(out);
  write_pack(p, &wo, out, sizeof out);
  ovf_sha256_file(manifest, before);
  static char text[1 << 16];
  text[read_bytes(manifest, text, sizeof text)] = 0;
  char* at = strstr(text, "\"tp_size\": 4,");
  assert_non_null(at);
  snprintf(bytes, sizeof bytes, "%.*s\"tp_size\": null,%s", (int)(at - text), text,
           at + strlen("\"tp_size\": 4,"));
  race_len = strlen(bytes);
  ovf_write_file(other, bytes, race_len);
  ovf_sha256_file(other, after);
  expect_materialize_race(p, ckpt, out, manifest, before, after);

  /* Unarmed, the same pack materialises. */
  ovf_rmtree(out);
  write_pack(p, &wo, out, sizeof out);
  OVF_OK(qsakv_overlay_materialize(ckpt, p->base_dir, out));
}

/* Published packs and checkpoints are readable by other users as the umask allows (a
 * serving process is often not the calibration run's user): not mkdtemp's 0700. */
static void test_published_modes_follow_the_umask(void** state) {
  ovf_pack* p = *state;
  const mode_t masks[] = {022, 077};
  for (int i = 0; i < 2; ++i) {
    char out[OVF_PATH], ckpt[OVF_PATH + 16], path[OVF_PATH + 64];
    const mode_t old = umask(masks[i]);
    write_pack(p, NULL, out, sizeof out);
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", p->root);
    OVF_OK(qsakv_overlay_materialize(ckpt, p->base_dir, out));
    umask(old);
    struct stat st;
    assert_int_equal(stat(out, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0755 & ~masks[i]);
    assert_int_equal(stat(ckpt, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0755 & ~masks[i]);
    snprintf(path, sizeof path, "%s/qsakv-overlay.json", out);
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0644 & ~masks[i]);
    ovf_rmtree(ckpt);
    ovf_rmtree(out);
  }
}

static void test_write_refuses_name_in_base(void** state) {
  ovf_pack* p = *state;
  char out[OVF_PATH];
  ovf_write_text(p->base_index,
                 "{\"weight_map\": {\"model.layers.3.self_attn.k_scale\": "
                 "\"model-00001.safetensors\"}}");
  int32_t layers[12];
  float k[12], v[12];
  reference_scales(layers, k, v);
  qsakv_overlay_write_options wo;
  OVF_OK(qsakv_overlay_write_options_init(&wo));
  wo.base_index_path = p->base_index;
  snprintf(out, sizeof out, "%s/out", p->root);
  OVF_EXPECT(qsakv_overlay_write(out, layers, k, v, 12, &wo), QSAKV_ERROR_OVERLAY_DUPLICATE);
  OVF_MESSAGE_HAS("already in the base checkpoint");
  assert_false(ovf_exists(out));
}

static void test_materialize_refuses_name_in_base(void** state) {
  ovf_pack* p = *state;
  /* A hand-made pack bound to a base that already holds one of its names (the library's
   * writer would have refused to make it). */
  ovf_write_text(p->base_index,
                 "{\"weight_map\": {\"model.layers.3.self_attn.k_scale\": "
                 "\"model-00001.safetensors\"}}");
  ovf_sha256_file(p->base_index, p->base_sha);
  ovf_write_pack(p);
  char ckpt[OVF_PATH + 16];
  snprintf(ckpt, sizeof ckpt, "%s/ckpt", p->root);
  OVF_EXPECT(qsakv_overlay_materialize(ckpt, p->base_dir, p->pack_dir),
             QSAKV_ERROR_OVERLAY_DUPLICATE);
  OVF_MESSAGE_HAS("model.layers.3.self_attn.k_scale");
  assert_false(ovf_exists(ckpt));
}

static void test_materialize_base_already_has_scale_file(void** state) {
  ovf_pack* p = *state;
  char out[OVF_PATH], ckpt[OVF_PATH + 16], path[OVF_PATH + 64];
  write_pack(p, NULL, out, sizeof out);
  snprintf(path, sizeof path, "%s/model-kvscales.safetensors", p->base_dir);
  ovf_write_text(path, "old");
  snprintf(ckpt, sizeof ckpt, "%s/ckpt", p->root);
  OVF_EXPECT(qsakv_overlay_materialize(ckpt, p->base_dir, out), QSAKV_ERROR_OVERLAY_DUPLICATE);
  assert_false(ovf_exists(ckpt));
}

/* Every accepted spelling, under every prefix, loads and validates, and each scale lands
 * on its own layer and kind (k_of and v_of: a distinct value for each, exact in FP32). */
static float k_of(int i) { return 0.25f + (float)i; }
static float v_of(int i) { return 100.5f + (float)i; }

static void test_name_variants(void** state) {
  ovf_pack* p = *state;
  static const char* prefixes[] = {"model.layers", "model.language_model.layers",
                                   "language_model.model.layers", "transformer.h"};
  static const char* k_suffix[] = {"self_attn.k_scale", "k_scale",
                                   "attn.k_scale",      "self_attn.attn.k_scale",
                                   "k_proj.k_scale",    "k_proj.output_scale"};
  static const char* v_suffix[] = {"self_attn.v_scale", "v_scale",
                                   "attn.v_scale",      "self_attn.attn.v_scale",
                                   "v_proj.v_scale",    "v_proj.output_scale"};
  for (int pi = 0; pi < 4; ++pi) {
    for (int si = 0; si < 6; ++si) {
      p->n = 0;
      p->prefix = prefixes[pi];
      for (int i = 0; i < 12; ++i) {
        char name[160];
        /* Mix spellings across layers too: the rule is per tensor. */
        const int s = (si + i) % 6;
        snprintf(name, sizeof name, "%s.%d.%s", prefixes[pi], 4 * i + 3, k_suffix[s]);
        ovf_set_f32(p, p->n++, name, k_of(i));
        snprintf(name, sizeof name, "%s.%d.%s", prefixes[pi], 4 * i + 3, v_suffix[si]);
        ovf_set_f32(p, p->n++, name, v_of(i));
      }
      ovf_write_pack(p);
      qsakv_overlay* o = NULL;
      OVF_OK(qsakv_overlay_load(&o, p->scale, NULL));
      qsakv_model_config c;
      ovf_config(&c, 1);
      OVF_OK(qsakv_overlay_validate(o, &c, p->base_sha));
      assert_string_equal(info_of(o).layer_prefix, prefixes[pi]);
      /* Each scale where its name put it: a value of its own per layer and kind. */
      for (int i = 0; i < 12; ++i) {
        float k, v;
        OVF_OK(qsakv_overlay_get_scales(o, 4 * i + 3, &k, &v));
        if (k != k_of(i) || v != v_of(i))
          fail_msg("prefix %s, spellings %d: layer %d has k %g, v %g; written %g, %g", prefixes[pi],
                   si, 4 * i + 3, (double)k, (double)v, (double)k_of(i), (double)v_of(i));
      }
      qsakv_overlay_destroy(o);
    }
  }
}

/* A unit-scale negative control loads and validates (presence, not value, is the rule of
 * validation), and backs an E4M3 cache only where the cache's options ask for it. */
static void test_unit_scales_are_valid(void** state) {
  ovf_pack* p = *state;
  int32_t layers[12];
  float k[12], v[12];
  reference_scales(layers, k, v);
  for (int i = 0; i < 12; ++i) k[i] = v[i] = 1.0f;
  qsakv_overlay_write_options wo;
  OVF_OK(qsakv_overlay_write_options_init(&wo));
  wo.base_index_path = p->base_index;
  wo.unit_scale_control = 1;
  char out[OVF_PATH];
  snprintf(out, sizeof out, "%s/unit", p->root);
  OVF_OK(qsakv_overlay_write(out, layers, k, v, 12, &wo));
  qsakv_overlay* o = NULL;
  OVF_OK(qsakv_overlay_load(&o, out, NULL));
  qsakv_model_config c;
  ovf_config(&c, 1);
  OVF_OK(qsakv_overlay_validate(o, &c, p->base_sha)); /* presence, not value, is the signal */
  assert_int_equal(info_of(o).unit_scale_control, 1);
  float ks, vs;
  OVF_OK(qsakv_overlay_get_scales(o, 3, &ks, &vs));
  assert_true(ks == 1.0f && vs == 1.0f);
  /* Valid, but an E4M3 cache runs on it only when asked to (a negative control). */
  qsakv_context* ctx = tu_context(QSAKV_BACKEND_CPU);
  qsakv_cache_options co;
  OVF_OK(qsakv_cache_options_init(&co));
  co.num_blocks = 2;
  qsakv_cache* cache = NULL;
  OVF_EXPECT(qsakv_cache_create(&cache, ctx, &c, o, &co), QSAKV_ERROR_OVERLAY_UNIT_SCALES);
  assert_non_null(strstr(qsakv_last_error(), "unit_scale_control: true"));
  co.allow_unit_scales = 1;
  OVF_OK(qsakv_cache_create(&cache, ctx, &c, o, &co));
  qsakv_cache_destroy(cache);
  qsakv_overlay_destroy(o);
  /* The marker alone is the signal: calibrated-looking scales marked as a control are
   * refused the same way. */
  reference_scales(layers, k, v);
  snprintf(out, sizeof out, "%s/unit-marked", p->root);
  OVF_OK(qsakv_overlay_write(out, layers, k, v, 12, &wo));
  OVF_OK(qsakv_overlay_load(&o, out, NULL));
  OVF_OK(qsakv_overlay_validate(o, &c, p->base_sha));
  co.allow_unit_scales = 0;
  OVF_EXPECT(qsakv_cache_create(&cache, ctx, &c, o, &co), QSAKV_ERROR_OVERLAY_UNIT_SCALES);
  assert_null(cache);
  qsakv_overlay_destroy(o);
  qsakv_context_destroy(ctx);
}

static void test_tp4_reference_contract(void** state) {
  ovf_pack* p = *state;
  qsakv_overlay_write_options wo;
  OVF_OK(qsakv_overlay_write_options_init(&wo));
  wo.layer_prefix = "model.language_model.layers";
  wo.contract_tp_size = 4;
  wo.contract_speculative_tokens = 0;
  wo.contract_activation_dtype = QSAKV_DTYPE_FP16;
  wo.contract_min_sm = 70;
  char out[OVF_PATH];
  write_pack(p, &wo, out, sizeof out);
  qsakv_overlay* o = NULL;
  OVF_OK(qsakv_overlay_load(&o, out, NULL));
  qsakv_overlay_info info = info_of(o);
  assert_int_equal(info.contract_tp_size, 4);
  assert_int_equal(info.contract_speculative_tokens, 0);
  assert_int_equal(info.contract_activation_dtype, QSAKV_DTYPE_FP16);
  assert_int_equal(info.contract_min_sm, 70);
  assert_string_equal(info.layer_prefix, "model.language_model.layers");
  qsakv_model_config c;
  for (int rank = 0; rank < 4; ++rank) {
    ovf_config(&c, 4);
    c.tp_rank = rank;
    OVF_OK(qsakv_overlay_validate(o, &c, p->base_sha));
  }
  ovf_config(&c, 1);
  OVF_EXPECT(qsakv_overlay_validate(o, &c, p->base_sha), QSAKV_ERROR_CONTRACT);
  assert_int_equal(info_of(o).validated, 0);
  qsakv_overlay_destroy(o);
}

static void test_write_refusals(void** state) {
  ovf_pack* p = *state;
  int32_t layers[12];
  float k[12], v[12];
  reference_scales(layers, k, v);
  qsakv_overlay_write_options wo;
  OVF_OK(qsakv_overlay_write_options_init(&wo));
  wo.base_index_path = p->base_index;
  char out[OVF_PATH];
  snprintf(out, sizeof out, "%s/w", p->root);
  /* Subnormals too (1e-45 was written, validated and backed a cache whose every stored
   * value saturated): a scale is a normal positive float. */
  const float bad[] = {NAN, INFINITY, -INFINITY, 0.0f, -0.0f, -1.0f, 1e-45f, 1.17549421e-38f};
  const char* said[] = {"nan", "inf", "-inf", "0", "-0", "-1", "1.40129846e-45", "1.17549421e-38"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
    float kk[12];
    memcpy(kk, k, sizeof kk);
    kk[5] = bad[i];
    OVF_EXPECT(qsakv_overlay_write(out, layers, kk, v, 12, &wo), QSAKV_ERROR_OVERLAY_BAD_SCALE);
    char want[96];
    snprintf(want, sizeof want, "layer 23 k_scale is %s; a scale must be a normal positive float",
             said[i]);
    OVF_MESSAGE_HAS(want);
    assert_false(ovf_exists(out));
  }
  {
    float vv[12];
    memcpy(vv, v, sizeof vv);
    vv[0] = 1.17549435e-38f; /* FLT_MIN, the smallest normal float: valid */
    OVF_OK(qsakv_overlay_write(out, layers, k, vv, 12, &wo));
    ovf_rmtree(out);
  }
  int32_t dup[12];
  memcpy(dup, layers, sizeof dup);
  dup[1] = dup[0];
  OVF_EXPECT(qsakv_overlay_write(out, dup, k, v, 12, &wo), QSAKV_ERROR_OVERLAY_DUPLICATE);
  OVF_EXPECT(qsakv_overlay_write(out, layers, k, v, 0, &wo), QSAKV_ERROR_INVALID_ARGUMENT);
  OVF_EXPECT(qsakv_overlay_write(out, layers, k, v, 12, NULL), QSAKV_ERROR_INVALID_ARGUMENT);
  OVF_EXPECT(qsakv_overlay_write(NULL, layers, k, v, 12, &wo), QSAKV_ERROR_INVALID_ARGUMENT);
  wo.layer_prefix = "model..layers";
  OVF_EXPECT(qsakv_overlay_write(out, layers, k, v, 12, &wo), QSAKV_ERROR_INVALID_ARGUMENT);
  wo.layer_prefix = NULL;
  wo.base_index_path = NULL;
  OVF_EXPECT(qsakv_overlay_write(out, layers, k, v, 12, &wo), QSAKV_ERROR_INVALID_ARGUMENT);
  char missing[OVF_PATH + 16];
  snprintf(missing, sizeof missing, "%s/none.json", p->root);
  wo.base_index_path = missing;
  OVF_EXPECT(qsakv_overlay_write(out, layers, k, v, 12, &wo), QSAKV_ERROR_IO);
  wo.base_index_path = p->base_index;
  wo.contract_activation_dtype = QSAKV_DTYPE_E4M3;
  OVF_EXPECT(qsakv_overlay_write(out, layers, k, v, 12, &wo), QSAKV_ERROR_INVALID_ARGUMENT);
  wo.contract_activation_dtype = QSAKV_DTYPE_INVALID;
  /* Each contract bound is the manifest reader's: the writer never makes a pack that
   * no load accepts (tp_size 70000 was written, then refused by every load). */
  wo.contract_tp_size = 65537;
  OVF_EXPECT(qsakv_overlay_write(out, layers, k, v, 12, &wo), QSAKV_ERROR_INVALID_ARGUMENT);
  OVF_MESSAGE_HAS("options.contract_tp_size is 65537; 0 (not constrained) or 1..65536");
  wo.contract_tp_size = -1;
  OVF_EXPECT(qsakv_overlay_write(out, layers, k, v, 12, &wo), QSAKV_ERROR_INVALID_ARGUMENT);
  wo.contract_tp_size = 0;
  wo.contract_speculative_tokens = 65;
  OVF_EXPECT(qsakv_overlay_write(out, layers, k, v, 12, &wo), QSAKV_ERROR_INVALID_ARGUMENT);
  wo.contract_speculative_tokens = -1;
  wo.contract_min_sm = 10001;
  OVF_EXPECT(qsakv_overlay_write(out, layers, k, v, 12, &wo), QSAKV_ERROR_INVALID_ARGUMENT);
  OVF_MESSAGE_HAS("options.contract_min_sm is 10001; 0 (not constrained) or 1..10000");
  wo.contract_min_sm = 0;
  assert_false(ovf_exists(out));
  /* The largest bounds are written and load again. */
  wo.contract_tp_size = 65536;
  wo.contract_speculative_tokens = 64;
  wo.contract_min_sm = 10000;
  OVF_OK(qsakv_overlay_write(out, layers, k, v, 12, &wo));
  qsakv_overlay* o = NULL;
  OVF_OK(qsakv_overlay_load(&o, out, NULL));
  const qsakv_overlay_info info = info_of(o);
  assert_int_equal(info.contract_tp_size, 65536);
  assert_int_equal(info.contract_speculative_tokens, 64);
  assert_int_equal(info.contract_min_sm, 10000);
  qsakv_overlay_destroy(o);
  ovf_rmtree(out);
  OVF_OK(qsakv_overlay_write_options_init(&wo));
  wo.base_index_path = p->base_index;
  /* An existing directory, even empty, is never overwritten. */
  assert_int_equal(mkdir(out, 0755), 0);
  OVF_EXPECT(qsakv_overlay_write(out, layers, k, v, 12, &wo), QSAKV_ERROR_INVALID_ARGUMENT);
  OVF_MESSAGE_HAS("already exists");
}

static void test_handles_and_arguments(void** state) {
  ovf_pack* p = *state;
  qsakv_overlay_destroy(NULL);
  OVF_EXPECT(qsakv_overlay_load(NULL, p->scale, NULL), QSAKV_ERROR_INVALID_ARGUMENT);
  qsakv_overlay* o = (qsakv_overlay*)(uintptr_t)1;
  OVF_EXPECT(qsakv_overlay_load(&o, NULL, NULL), QSAKV_ERROR_INVALID_ARGUMENT);
  assert_null(o);
  OVF_EXPECT(qsakv_overlay_load(&o, "", NULL), QSAKV_ERROR_INVALID_ARGUMENT);
  qsakv_model_config c;
  ovf_config(&c, 1);
  OVF_EXPECT(qsakv_overlay_validate(NULL, &c, p->base_sha), QSAKV_ERROR_INVALID_ARGUMENT);
  OVF_EXPECT(qsakv_overlay_get_info(NULL, NULL), QSAKV_ERROR_INVALID_ARGUMENT);
  OVF_EXPECT(qsakv_overlay_write_options_init(NULL), QSAKV_ERROR_INVALID_ARGUMENT);
  qsakv_overlay_write_options wo;
  OVF_OK(qsakv_overlay_write_options_init(&wo));
  assert_int_equal(wo.struct_size, sizeof wo);
  assert_int_equal(wo.contract_speculative_tokens, -1);
  /* An older, shorter info struct gets only its prefix written. */
  char out[OVF_PATH];
  write_pack(p, NULL, out, sizeof out);
  OVF_OK(qsakv_overlay_load(&o, out, NULL));
  qsakv_overlay_info small;
  memset(&small, 0x5a, sizeof small);
  small.struct_size = offsetof(qsakv_overlay_info, validated);
  OVF_OK(qsakv_overlay_get_info(o, &small));
  assert_int_equal(small.num_scales, 24);
  assert_int_equal(small.validated, 0x5a5a5a5a);
  OVF_EXPECT(qsakv_overlay_validate(o, NULL, p->base_sha), QSAKV_ERROR_INVALID_ARGUMENT);
  qsakv_overlay_destroy(o);
}

/* A config with other QSA layers: the same overlay is then incomplete or unknown. */
static void test_other_geometry(void** state) {
  ovf_pack* p = *state;
  char out[OVF_PATH];
  write_pack(p, NULL, out, sizeof out);
  qsakv_overlay* o = NULL;
  OVF_OK(qsakv_overlay_load(&o, out, NULL));
  qsakv_model_config c;
  ovf_config(&c, 1);
  c.qsa_layers[c.num_qsa_layers++] = 48;
  c.num_layers = 52;
  OVF_EXPECT(qsakv_overlay_validate(o, &c, p->base_sha), QSAKV_ERROR_OVERLAY_INCOMPLETE);
  OVF_MESSAGE_HAS("loaded 24/26 K/V scales; missing: layer 48 k_scale, layer 48 v_scale");
  qsakv_overlay_destroy(o);
}

#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)

int main(void) {
  const struct CMUnitTest tests[] = {
      T(test_write_then_load_bare_file),
      T(test_uppercase_revision_is_accepted),
      T(test_written_files),
      T(test_explicit_manifest_path),
      T(test_pack_directory),
      T(test_materialized_checkpoint),
      T(test_materialize_other_revision),
      T(test_materialized_checkpoint_revision_is_the_base_s),
      T(test_materialized_checkpoint_files_must_match_the_record),
      T(test_materialize_refuses_a_pack_changed_while_read),
      T(test_published_modes_follow_the_umask),
      T(test_write_refuses_name_in_base),
      T(test_materialize_refuses_name_in_base),
      T(test_materialize_base_already_has_scale_file),
      T(test_name_variants),
      T(test_unit_scales_are_valid),
      T(test_tp4_reference_contract),
      T(test_write_refusals),
      T(test_handles_and_arguments),
      T(test_other_geometry),
  };
  return cmocka_run_group_tests_name("overlay", tests, NULL, NULL);
}
