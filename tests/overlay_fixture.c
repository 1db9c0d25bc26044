// SPDX-License-Identifier: Apache-2.0
#define _GNU_SOURCE
#include "overlay_fixture.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ftw.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

static void catf(char* buf, size_t cap, const char* fmt, ...) {
  size_t used = strlen(buf);
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf + used, cap - used, fmt, ap);
  va_end(ap);
  assert_true(n >= 0 && (size_t)n < cap - used);
}

void ovf_write_file(const char* path, const void* data, size_t n) {
  FILE* f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(data, 1, n, f), n);
  assert_int_equal(fclose(f), 0);
}

void ovf_write_text(const char* path, const char* text) {
  ovf_write_file(path, text, strlen(text));
}

char* ovf_read_text(const char* path) {
  FILE* f = fopen(path, "rb");
  if (!f) return NULL;
  size_t cap = 1 << 20, n;
  char* s = malloc(cap + 1);
  assert_non_null(s);
  n = fread(s, 1, cap, f);
  fclose(f);
  s[n] = 0;
  return s;
}

void ovf_sha256_file(const char* path, char out[65]) {
  FILE* f = fopen(path, "rb");
  assert_non_null(f);
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  assert_int_equal(EVP_DigestInit_ex(ctx, EVP_sha256(), NULL), 1);
  unsigned char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) EVP_DigestUpdate(ctx, buf, n);
  fclose(f);
  unsigned char md[32];
  unsigned int len = 0;
  assert_int_equal(EVP_DigestFinal_ex(ctx, md, &len), 1);
  EVP_MD_CTX_free(ctx);
  for (unsigned i = 0; i < 32; ++i) sprintf(out + 2 * i, "%02x", md[i]);
}

static int rm_entry(const char* path, const struct stat* st, int flag, struct FTW* ftw) {
  (void)st;
  (void)flag;
  (void)ftw;
  chmod(path, 0700); /* undo a test's chmod 000 */
  return remove(path);
}

void ovf_rmtree(const char* path) { nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

int ovf_exists(const char* path) {
  struct stat st;
  return lstat(path, &st) == 0;
}

void ovf_config(qsakv_model_config* c, int tp_size) {
  assert_int_equal(qsakv_model_config_preset(c, "qwen4_exp"), QSAKV_SUCCESS);
  c->tp_size = tp_size;
  c->tp_rank = 0;
}

void ovf_set_f32(ovf_pack* p, int i, const char* name, float value) {
  ovf_tensor* t = &p->t[i];
  char copy[sizeof t->name]; /* name may be t->name itself */
  snprintf(copy, sizeof copy, "%s", name);
  memcpy(t->name, copy, sizeof copy);
  t->dtype = "F32";
  t->shape = "[]";
  memcpy(t->bytes, &value, 4); /* x86-64 and aarch64: little-endian, as the format */
  t->nbytes = 4;
}

int ovf_add(ovf_pack* p, const char* name, const char* dtype, const char* shape, const void* bytes,
            size_t nbytes) {
  assert_true(p->n < OVF_MAX_TENSORS && nbytes <= sizeof p->t[0].bytes);
  ovf_tensor* t = &p->t[p->n];
  snprintf(t->name, sizeof t->name, "%s", name);
  t->dtype = dtype;
  t->shape = shape;
  memcpy(t->bytes, bytes, nbytes);
  t->nbytes = nbytes;
  return p->n++;
}

void ovf_remove(ovf_pack* p, int i) {
  memmove(&p->t[i], &p->t[i + 1], (size_t)(p->n - i - 1) * sizeof p->t[0]);
  p->n--;
}

int ovf_find(const ovf_pack* p, int layer, char kind) {
  char name[160];
  snprintf(name, sizeof name, "%s.%d.self_attn.%c_scale", p->prefix, layer, kind);
  for (int i = 0; i < p->n; ++i)
    if (!strcmp(p->t[i].name, name)) return i;
  fail_msg("no tensor %s", name);
  return -1;
}

void ovf_init(ovf_pack* p) {
  memset(p, 0, sizeof *p);
  snprintf(p->root, sizeof p->root, "/tmp/qsakv-overlay-XXXXXX");
  assert_non_null(mkdtemp(p->root));
  snprintf(p->base_dir, sizeof p->base_dir, "%s/base", p->root);
  snprintf(p->pack_dir, sizeof p->pack_dir, "%s/pack", p->root);
  assert_int_equal(mkdir(p->base_dir, 0755), 0);
  assert_int_equal(mkdir(p->pack_dir, 0755), 0);
  snprintf(p->base_index, OVF_PATH, "%s/model.safetensors.index.json", p->base_dir);
  ovf_write_text(
      p->base_index,
      "{\"metadata\": {\"total_size\": 1000}, \"weight_map\": {"
      "\"model.embed_tokens.weight\": \"model-00001-of-00002.safetensors\", "
      "\"model.layers.3.self_attn.q_proj.weight\": \"model-00002-of-00002.safetensors\"}}\n");
  char shard[OVF_PATH + 64];
  snprintf(shard, sizeof shard, "%s/model-00001-of-00002.safetensors", p->base_dir);
  ovf_write_text(shard, "shard one");
  snprintf(shard, sizeof shard, "%s/model-00002-of-00002.safetensors", p->base_dir);
  ovf_write_text(shard, "shard two");
  ovf_sha256_file(p->base_index, p->base_sha);
  snprintf(p->scale, OVF_PATH, "%s/model-kvscales.safetensors", p->pack_dir);
  snprintf(p->manifest, OVF_PATH, "%s/qsakv-overlay.json", p->pack_dir);
  p->prefix = "model.layers";
  p->contract =
      "{\"tp_size\": null, \"speculative_tokens\": null, "
      "\"activation_dtype\": null, \"min_sm\": null}";
  p->metadata = "{\"qsakv.scale_contract\": \"e4m3fn(x/scale), max_abs/448\"}";
  for (int i = 0; i < 12; ++i) {
    char name[160];
    snprintf(name, sizeof name, "model.layers.%d.self_attn.k_scale", 4 * i + 3);
    ovf_set_f32(p, p->n++, name, 0.01f * (float)(i + 1));
    snprintf(name, sizeof name, "model.layers.%d.self_attn.v_scale", 4 * i + 3);
    ovf_set_f32(p, p->n++, name, 0.02f * (float)(i + 1));
  }
}

void ovf_cleanup(ovf_pack* p) {
  if (p->root[0]) ovf_rmtree(p->root);
  p->root[0] = 0;
}

void ovf_header(const ovf_pack* p, char* buf, size_t cap) {
  buf[0] = 0;
  catf(buf, cap, "{");
  if (p->metadata) catf(buf, cap, "\"__metadata__\":%s", p->metadata);
  size_t off = 0;
  for (int i = 0; i < p->n; ++i) {
    const ovf_tensor* t = &p->t[i];
    catf(buf, cap, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":%s,\"data_offsets\":[%zu,%zu]}",
         (i || p->metadata) ? "," : "", t->name, t->dtype, t->shape, off, off + t->nbytes);
    off += t->nbytes;
  }
  catf(buf, cap, "}");
}

size_t ovf_image_with_header(const ovf_pack* p, const char* header, char* buf, size_t cap) {
  const uint64_t hn = strlen(header);
  size_t n = 8 + (size_t)hn;
  for (int i = 0; i < p->n; ++i) n += p->t[i].nbytes;
  assert_true(n <= cap);
  for (int b = 0; b < 8; ++b) buf[b] = (char)((hn >> (8 * b)) & 0xff);
  memcpy(buf + 8, header, hn);
  size_t at = 8 + (size_t)hn;
  for (int i = 0; i < p->n; ++i) {
    memcpy(buf + at, p->t[i].bytes, p->t[i].nbytes);
    at += p->t[i].nbytes;
  }
  return at;
}

void ovf_write_manifest(ovf_pack* p) {
  char sha[65];
  ovf_sha256_file(p->scale, sha);
  static char m[1 << 16];
  m[0] = 0;
  catf(m, sizeof m,
       "{\n  \"schema_version\": 1,\n  \"kind\": \"qsakv-overlay\",\n"
       "  \"base_index_sha256\": \"%s\",\n  \"scale_file_sha256\": \"%s\",\n"
       "  \"layer_prefix\": \"%s\",\n  \"tensor_names\": [",
       p->base_sha, sha, p->prefix);
  for (int i = 0; i < p->n; ++i) catf(m, sizeof m, "%s\"%s\"", i ? ", " : "", p->t[i].name);
  catf(m, sizeof m,
       "],\n  \"scale_contract\": \"e4m3fn(x/scale), max_abs/448\",\n"
       "  \"unit_scale_control\": %s,\n  \"contract\": %s\n}\n",
       p->unit_scale_control ? "true" : "false", p->contract);
  ovf_write_text(p->manifest, m);
}

void ovf_write_raw_pack(ovf_pack* p, const void* bytes, size_t n) {
  ovf_write_file(p->scale, bytes, n);
  ovf_write_manifest(p);
}

void ovf_write_pack(ovf_pack* p) {
  static char header[1 << 16];
  static char image[1 << 17];
  ovf_header(p, header, sizeof header);
  ovf_write_raw_pack(p, image, ovf_image_with_header(p, header, image, sizeof image));
}

qsakv_status ovf_load(ovf_pack* p, qsakv_overlay** out) {
  return qsakv_overlay_load(out, p->scale, NULL);
}

qsakv_status ovf_load_validate_path(ovf_pack* p, const char* path) {
  qsakv_overlay* o = (qsakv_overlay*)(uintptr_t)1; /* must come back NULL on a refusal */
  qsakv_status s = qsakv_overlay_load(&o, path, NULL);
  if (s != QSAKV_SUCCESS) {
    assert_null(o);
    return s;
  }
  qsakv_model_config c;
  ovf_config(&c, 1);
  s = qsakv_overlay_validate(o, &c, p->base_sha);
  /* Fail closed: validated exactly when validate said yes. */
  assert_int_equal(tu_overlay_info(o).validated, s == QSAKV_SUCCESS);
  qsakv_overlay_destroy(o);
  return s;
}

qsakv_status ovf_load_validate(ovf_pack* p) { return ovf_load_validate_path(p, p->scale); }
