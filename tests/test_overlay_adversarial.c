// SPDX-License-Identifier: Apache-2.0
/* Adversarial overlays: every malformed or dishonest input is refused with its own
 * status (and, for many, the words of the message). The cases are one table, `kCases`:
 * a name, how a well-formed overlay is damaged, how it is opened, the status expected
 * and the fragments its message must contain (every refusing row names some: many rules
 * share a status, so the status alone cannot tell which rule refused). Each row breaks one
 * rule of a well-formed overlay, so it fails if that rule is removed from the library
 * (another rule that still catches the file says something else); the few rows that
 * expect success pin down what must stay accepted. What is not a damaged file (the
 * runtime config against the contract, the base revision, the validated flag) follows
 * the table as ordinary tests. */
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

/* ---- one row of the table ------------------------------------------------------------ */

typedef struct overlay_case overlay_case;
typedef void (*damage_fn)(ovf_pack* p, const overlay_case* c);
typedef qsakv_status (*open_fn)(ovf_pack* p);

struct overlay_case {
  const char* name;
  damage_fn damage; /* writes the overlay, broken as the row says */
  /* The damage's arguments, where it takes any. */
  const char* from; /* text replaced (header, manifest), metadata, contract, index entry */
  const char* to;   /* its replacement, or the index name left out */
  int layer;        /* the scale changed: its QSA layer, 'k' or 'v', its value */
  char kind;
  float value;
  open_fn open; /* NULL: the bare scale file, validated at TP1 against the base */
  qsakv_status expected;
  const char* message[2]; /* fragments the message must contain (NULL: not checked) */
};

/* ---- damage: the container ------------------------------------------------------------ */

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

static void well_formed(ovf_pack* p, const overlay_case* c) {
  (void)c;
  ovf_write_pack(p);
}

static void empty_file(ovf_pack* p, const overlay_case* c) {
  (void)c;
  ovf_write_raw_pack(p, "", 0);
}

static void cut_inside_length(ovf_pack* p, const overlay_case* c) {
  (void)c;
  good_image(p);
  ovf_write_raw_pack(p, g_image, 5);
}

static void cut_inside_header(ovf_pack* p, const overlay_case* c) {
  (void)c;
  good_image(p);
  ovf_write_raw_pack(p, g_image, 8 + strlen(g_header) / 2);
}

static void cut_last_data_byte(ovf_pack* p, const overlay_case* c) {
  (void)c;
  ovf_write_raw_pack(p, g_image, good_image(p) - 1);
}

static void header_length_file_size(ovf_pack* p, const overlay_case* c) {
  (void)c;
  const size_t n = good_image(p);
  set_header_length(n); /* one full file more than there is */
  ovf_write_raw_pack(p, g_image, n);
}

static void header_length_zero(ovf_pack* p, const overlay_case* c) {
  (void)c;
  const size_t n = good_image(p);
  set_header_length(0);
  ovf_write_raw_pack(p, g_image, n);
}

static void header_length_terabyte(ovf_pack* p, const overlay_case* c) {
  (void)c;
  const size_t n = good_image(p);
  set_header_length((uint64_t)1 << 40);
  ovf_write_raw_pack(p, g_image, n);
}

/* The header text is c->from, whole. */
static void header_is(ovf_pack* p, const overlay_case* c) { write_with_header(p, c->from); }

/* The well-formed header with c->to appended. */
static void header_appended(ovf_pack* p, const overlay_case* c) {
  ovf_header(p, g_header, sizeof g_header);
  strcat(g_header, c->to);
  write_with_header(p, g_header);
}

/* The well-formed header with c->from replaced by c->to. */
static void header_edited(ovf_pack* p, const overlay_case* c) {
  ovf_header(p, g_header, sizeof g_header);
  edit_header(c->from, c->to);
  write_with_header(p, g_header);
}

static void sizes_disagree_with_offsets(ovf_pack* p, const overlay_case* c) {
  (void)c;
  ovf_header(p, g_header, sizeof g_header);
  edit_header("\"shape\":[],\"data_offsets\":[0,4]", "\"shape\":[],\"data_offsets\":[0,8]");
  edit_header("[4,8]", "[8,8]");
  write_with_header(p, g_header);
}

static void trailing_bytes(ovf_pack* p, const overlay_case* c) {
  (void)c;
  const size_t n = good_image(p);
  memcpy(g_image + n, "JUNK", 4);
  ovf_write_raw_pack(p, g_image, n + 4);
}

static void gap_in_data(ovf_pack* p, const overlay_case* c) {
  (void)c;
  /* Tensor 1 moves to the end; bytes 4..8 are then referenced by no tensor. */
  ovf_header(p, g_header, sizeof g_header);
  edit_header("[4,8]", "[96,100]");
  const unsigned char extra[4] = {0, 0, 0x80, 0x3f};
  ovf_add(p, "unused", "U8", "[0]", extra, 4); /* appends 4 data bytes, header unchanged */
  write_with_header(p, g_header);
  ovf_remove(p, p->n - 1);
  ovf_write_manifest(p);
}

/* The scale file's __metadata__ is c->from. */
static void metadata_is(ovf_pack* p, const overlay_case* c) {
  p->metadata = c->from;
  ovf_write_pack(p);
}

/* ---- damage: the tensors ----------------------------------------------------------------- */

static void replace_tensor(ovf_pack* p, int i, const char* dtype, const char* shape,
                           const void* bytes, size_t n) {
  p->t[i].dtype = dtype;
  p->t[i].shape = shape;
  memcpy(p->t[i].bytes, bytes, n);
  p->t[i].nbytes = n;
  ovf_write_pack(p);
}

static void layer_7_k_is_f16(ovf_pack* p, const overlay_case* c) {
  (void)c;
  const unsigned char half_one[2] = {0x00, 0x3c};
  replace_tensor(p, ovf_find(p, 7, 'k'), "F16", "[]", half_one, 2);
}

static void layer_7_v_is_f64(ovf_pack* p, const overlay_case* c) {
  (void)c;
  const double one = 1.0;
  replace_tensor(p, ovf_find(p, 7, 'v'), "F64", "[]", &one, 8);
}

static void two_bf16_in_f32_bytes(ovf_pack* p, const overlay_case* c) {
  (void)c;
  const unsigned char two_bf16[4] = {0x80, 0x3f, 0x80, 0x3f};
  replace_tensor(p, 0, "BF16", "[2]", two_bf16, 4);
}

static void shape_one(ovf_pack* p, const overlay_case* c) {
  (void)c;
  const float one = 1.0f;
  replace_tensor(p, 0, "F32", "[1]", &one, 4);
}

static void shape_two(ovf_pack* p, const overlay_case* c) {
  (void)c;
  const float two[2] = {1.0f, 1.0f};
  replace_tensor(p, 0, "F32", "[2]", two, 8);
}

/* The scale of c->layer / c->kind is c->value. */
static void scale_is(ovf_pack* p, const overlay_case* c) {
  const int i = ovf_find(p, c->layer, c->kind);
  ovf_set_f32(p, i, p->t[i].name, c->value);
  ovf_write_pack(p);
}

/* The scale of c->layer / c->kind is left out. */
static void scale_left_out(ovf_pack* p, const overlay_case* c) {
  ovf_remove(p, ovf_find(p, c->layer, c->kind));
  ovf_write_pack(p);
}

static void layer_3_k_and_27_v_left_out(ovf_pack* p, const overlay_case* c) {
  (void)c;
  ovf_remove(p, ovf_find(p, 3, 'k'));
  ovf_remove(p, ovf_find(p, 27, 'v'));
  ovf_write_pack(p);
}

static void no_tensors(ovf_pack* p, const overlay_case* c) {
  (void)c;
  p->n = 0;
  ovf_write_pack(p);
}

/* An F32 scalar named c->from is added. */
static void tensor_added(ovf_pack* p, const overlay_case* c) {
  const float one = 1.0f;
  ovf_add(p, c->from, "F32", "[]", &one, 4);
  ovf_write_pack(p);
}

/* The scale of c->layer / c->kind is renamed c->from. */
static void scale_renamed(ovf_pack* p, const overlay_case* c) {
  const int i = ovf_find(p, c->layer, c->kind);
  ovf_set_f32(p, i, c->from, 0.5f);
  ovf_write_pack(p);
}

/* ---- damage: hashes and the manifest ------------------------------------------------------ */

static void scale_changed_after_manifest(ovf_pack* p, const overlay_case* c) {
  (void)c;
  ovf_write_pack(p);
  /* Change one scale after the manifest was made: 0.01 -> 0.02 for layer 3 k. */
  const int i = ovf_find(p, 3, 'k');
  ovf_set_f32(p, i, p->t[i].name, 0.02f);
  ovf_write_file(p->scale, g_image, good_image(p));
}

static void manifest_deleted(ovf_pack* p, const overlay_case* c) {
  (void)c;
  ovf_write_pack(p);
  assert_int_equal(unlink(p->manifest), 0);
}

/* The manifest's whole text is c->from. */
static void manifest_is(ovf_pack* p, const overlay_case* c) {
  ovf_write_pack(p);
  ovf_write_text(p->manifest, c->from);
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

/* The manifest with c->from replaced by c->to. */
static void manifest_edited(ovf_pack* p, const overlay_case* c) {
  ovf_write_pack(p);
  edit_manifest(p, c->from, c->to);
}

static void manifest_key_twice(ovf_pack* p, const overlay_case* c) {
  (void)c;
  ovf_write_pack(p);
  /* A second base_index_sha256 after the first: which one would count? Neither. */
  char dup[128];
  snprintf(dup, sizeof dup, "\"kind\": \"qsakv-overlay\", \"base_index_sha256\": \"%064d\",", 0);
  edit_manifest(p, "\"kind\": \"qsakv-overlay\",", dup);
}

/* The manifest's contract is c->from. */
static void contract_is(ovf_pack* p, const overlay_case* c) {
  p->contract = c->from;
  ovf_write_pack(p);
}

/* ---- damage: files and directories (opened as root/ckpt) ----------------------------------- */

static void ckpt_dir(const ovf_pack* p, char* dir, size_t cap) {
  snprintf(dir, cap, "%s/ckpt", p->root);
}

/* root/ckpt with the manifest linked in and `scale` as its scale file's path. */
static void ckpt_with_manifest(ovf_pack* p, char* scale, size_t cap) {
  ovf_write_pack(p);
  char dir[OVF_PATH + 8], path[OVF_PATH + 64];
  ckpt_dir(p, dir, sizeof dir);
  assert_int_equal(mkdir(dir, 0755), 0);
  snprintf(path, sizeof path, "%s/qsakv-overlay.json", dir);
  assert_int_equal(symlink(p->manifest, path), 0);
  snprintf(scale, cap, "%s/model-kvscales.safetensors", dir);
}

static void nothing_there(ovf_pack* p, const overlay_case* c) { (void)p, (void)c; }

static void empty_dir(ovf_pack* p, const overlay_case* c) {
  (void)c;
  char dir[OVF_PATH + 8];
  ckpt_dir(p, dir, sizeof dir);
  assert_int_equal(mkdir(dir, 0755), 0);
}

/* "Unreadable": the tests run as root, for whom chmod 000 changes nothing, so a directory
 * stands where the file should be (test_unreadable_scale_file tries chmod 000 as another
 * user). */
/* root/ckpt with the manifest and no scale file. */
static void manifest_only(ovf_pack* p, const overlay_case* c) {
  (void)c;
  char scale[OVF_PATH + 64];
  ckpt_with_manifest(p, scale, sizeof scale);
}

static void scale_file_a_directory(ovf_pack* p, const overlay_case* c) {
  (void)c;
  char scale[OVF_PATH + 64];
  ckpt_with_manifest(p, scale, sizeof scale);
  assert_int_equal(mkdir(scale, 0755), 0);
}

static void scale_file_a_fifo(ovf_pack* p, const overlay_case* c) {
  (void)c;
  char scale[OVF_PATH + 64];
  ckpt_with_manifest(p, scale, sizeof scale);
  assert_int_equal(mkfifo(scale, 0644), 0);
}

static void scale_file_a_symlink_loop(ovf_pack* p, const overlay_case* c) {
  (void)c;
  char scale[OVF_PATH + 64], loop[OVF_PATH + 64];
  ckpt_with_manifest(p, scale, sizeof scale);
  snprintf(loop, sizeof loop, "%s/ckpt/loop", p->root);
  assert_int_equal(symlink(loop, scale), 0); /* scale file -> loop -> scale file */
  assert_int_equal(symlink(scale, loop), 0);
}

static void dir_a_symlink_to_itself(ovf_pack* p, const overlay_case* c) {
  (void)c;
  char dir[OVF_PATH + 8];
  ckpt_dir(p, dir, sizeof dir);
  assert_int_equal(symlink(dir, dir), 0);
}

/* root/ckpt: the pack's files and an index naming every pack tensor in the scale file,
 * with the entry c->from spliced in first and the name c->to left out. */
static void ckpt_with_index(ovf_pack* p, const overlay_case* c) {
  char scale[OVF_PATH + 64];
  ckpt_with_manifest(p, scale, sizeof scale);
  assert_int_equal(symlink(p->scale, scale), 0);
  const char* extra = c->from ? c->from : "";
  char index[1 << 14];
  snprintf(index, sizeof index, "{\"weight_map\": {%s", extra);
  for (int i = 0; i < p->n; ++i) {
    if (c->to && !strcmp(p->t[i].name, c->to)) continue;
    const size_t used = strlen(index);
    snprintf(index + used, sizeof index - used, "%s\"%s\": \"model-kvscales.safetensors\"",
             (i || *extra) ? ", " : "", p->t[i].name);
  }
  strncat(index, "}}", sizeof index - strlen(index) - 1);
  char path[OVF_PATH + 64];
  snprintf(path, sizeof path, "%s/ckpt/model.safetensors.index.json", p->root);
  ovf_write_text(path, index);
}

/* root/ckpt: the pack's files and the index text c->from. */
static void ckpt_with_index_text(ovf_pack* p, const overlay_case* c) {
  char scale[OVF_PATH + 64];
  ckpt_with_manifest(p, scale, sizeof scale);
  assert_int_equal(symlink(p->scale, scale), 0);
  char path[OVF_PATH + 64];
  snprintf(path, sizeof path, "%s/ckpt/model.safetensors.index.json", p->root);
  ovf_write_text(path, c->from);
}

/* Opens root/ckpt and validates it at TP1 against the base (ovf_load_validate_path). */
static qsakv_status open_ckpt_dir(ovf_pack* p) {
  char dir[OVF_PATH + 8];
  ckpt_dir(p, dir, sizeof dir);
  return ovf_load_validate_path(p, dir);
}

/* ---- the table ------------------------------------------------------------------------------ */

#define DAMAGE(fn) .damage = (fn)
#define HEADER_EDIT(f, t) .damage = header_edited, .from = (f), .to = (t)
#define MANIFEST_EDIT(f, t) .damage = manifest_edited, .from = (f), .to = (t)
#define SCALE(l, k, v) .damage = scale_is, .layer = (l), .kind = (k), .value = (v)
#define IN_CKPT_DIR .open = open_ckpt_dir
#define EXPECT(status) .expected = (status)
#define SAYS(...) .message = {__VA_ARGS__}
#define OK .expected = QSAKV_SUCCESS

static const overlay_case kCases[] = {
    /* the container */
    {"the fixture is valid", DAMAGE(well_formed), OK},
    {"empty file", DAMAGE(empty_file), EXPECT(QSAKV_ERROR_FORMAT), SAYS("is truncated: 0 bytes")},
    {"truncated inside the length", DAMAGE(cut_inside_length), EXPECT(QSAKV_ERROR_FORMAT),
     SAYS("5 bytes, less than the 8-byte header length")},
    {"truncated inside the header", DAMAGE(cut_inside_header), EXPECT(QSAKV_ERROR_FORMAT),
     SAYS("runs past the end")},
    {"truncated data", DAMAGE(cut_last_data_byte), EXPECT(QSAKV_ERROR_FORMAT),
     SAYS("ends at byte 96, past the 95-byte data section")},
    {"header length larger than the file", DAMAGE(header_length_file_size),
     EXPECT(QSAKV_ERROR_FORMAT), SAYS("runs past the end of the")},
    {"header length zero", DAMAGE(header_length_zero), EXPECT(QSAKV_ERROR_FORMAT),
     SAYS("header length is 0; a header is at least")},
    {"header length over the limit (a terabyte)", DAMAGE(header_length_terabyte),
     EXPECT(QSAKV_ERROR_FORMAT), SAYS("header length 1099511627776 is over the")},
    {"header not JSON", DAMAGE(header_is), .from = "{this is not json}", EXPECT(QSAKV_ERROR_FORMAT),
     SAYS("header is not valid JSON")},
    {"header a JSON array", DAMAGE(header_is),
     .from = "[{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}]",
     EXPECT(QSAKV_ERROR_FORMAT), SAYS("the header does not start with '{'")},
    {"header JSON then garbage", DAMAGE(header_appended), .to = " {}", EXPECT(QSAKV_ERROR_FORMAT),
     SAYS("header is not valid JSON", "expected end of input")},
    /* the reference writer pads to 8 bytes this way */
    {"header padded with spaces is fine", DAMAGE(header_appended), .to = "       ", OK},
    {"header not UTF-8",
     HEADER_EDIT("model.layers.3.self_attn.k_scale", "model.layers.3.self_attn.k_scale\xff"),
     EXPECT(QSAKV_ERROR_FORMAT), SAYS("header is not valid JSON", "ill-formed UTF-8")},
    {"trailing bytes", DAMAGE(trailing_bytes), EXPECT(QSAKV_ERROR_FORMAT),
     SAYS("4 bytes after the last tensor belong to no tensor")},
    /* the last tensor grown to 8 bytes (F32 x [2]), past the data: the tensors still tile
     * [0, 100) with no gap, so only the data section's end is broken */
    {"offsets past the end",
     HEADER_EDIT("\"shape\":[],\"data_offsets\":[92,96]",
                 "\"shape\":[2],\"data_offsets\":[92,100]"),
     EXPECT(QSAKV_ERROR_FORMAT), SAYS("ends at byte 100, past the 96-byte data section")},
    /* tensor 0 grown to 8 bytes (F64), over tensor 1's bytes 4..8: no gap, no size mismatch */
    {"overlapping offsets",
     HEADER_EDIT("\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]",
                 "\"dtype\":\"F64\",\"shape\":[],\"data_offsets\":[0,8]"),
     EXPECT(QSAKV_ERROR_FORMAT), SAYS("at bytes [4, 8) overlaps the tensor before it")},
    {"gap in the data", DAMAGE(gap_in_data), EXPECT(QSAKV_ERROR_FORMAT),
     SAYS("data bytes [4, 8) belong to no tensor")},
    {"offsets do not match the size", DAMAGE(sizes_disagree_with_offsets),
     EXPECT(QSAKV_ERROR_FORMAT), SAYS("data_offsets [0, 8] span 8 bytes; F32 x shape needs 4")},
    /* a negative offset lies outside the data whatever else holds: the message pins the rule */
    {"negative offset", HEADER_EDIT("[0,4]", "[-4,0]"), EXPECT(QSAKV_ERROR_FORMAT),
     SAYS("data_offsets holds -4, not a non-negative integer")},
    {"fractional offset", HEADER_EDIT("[0,4]", "[0.0,4]"), EXPECT(QSAKV_ERROR_FORMAT),
     SAYS("data_offsets holds 0.0, not a non-negative integer")},
    {"unknown dtype", HEADER_EDIT("\"F32\"", "\"F33\""), EXPECT(QSAKV_ERROR_FORMAT),
     SAYS("unknown dtype \"F33\"")},
    {"unknown entry field", HEADER_EDIT("\"dtype\":\"F32\"", "\"dtype\":\"F32\",\"scale\":2"),
     EXPECT(QSAKV_ERROR_FORMAT), SAYS("has an unknown field \"scale\"")},
    {"entry field twice", HEADER_EDIT("\"dtype\":\"F32\"", "\"dtype\":\"F16\",\"dtype\":\"F32\""),
     EXPECT(QSAKV_ERROR_FORMAT), SAYS("field \"dtype\" appears twice in")},
    {"metadata values not strings", DAMAGE(metadata_is),
     .from = "{\"qsakv.scale_contract\": \"e4m3fn(x/scale), max_abs/448\", \"n\": 3}",
     EXPECT(QSAKV_ERROR_FORMAT), SAYS("__metadata__ \"n\" is a JSON number, not a string")},
    {"metadata names another scale contract", DAMAGE(metadata_is),
     .from = "{\"qsakv.scale_contract\": \"e4m3fn(x*scale)\"}", EXPECT(QSAKV_ERROR_FORMAT),
     SAYS("metadata qsakv.scale_contract is \"e4m3fn(x*scale)\"")},
    /* the manifest says false */
    {"metadata unit flag contradicts the manifest", DAMAGE(metadata_is),
     .from = "{\"qsakv.unit_scale_control\": \"1\"}", EXPECT(QSAKV_ERROR_FORMAT),
     SAYS("qsakv.unit_scale_control is 1 but the manifest says false")},
    /* tensor 1 takes tensor 0's name: nlohmann would silently keep the last */
    {"tensor key twice",
     HEADER_EDIT("model.layers.3.self_attn.v_scale", "model.layers.3.self_attn.k_scale"),
     EXPECT(QSAKV_ERROR_OVERLAY_DUPLICATE), SAYS("appears twice")},

    /* the tensors */
    {"dtype F16", DAMAGE(layer_7_k_is_f16), EXPECT(QSAKV_ERROR_OVERLAY_BAD_TENSOR),
     SAYS("layer 7 k_scale")},
    {"dtype F64", DAMAGE(layer_7_v_is_f64), EXPECT(QSAKV_ERROR_OVERLAY_BAD_TENSOR),
     SAYS("layer 7 v_scale", "is F64 of shape [], not an FP32 scalar")},
    {"dtype BF16 packed in F32's bytes", DAMAGE(two_bf16_in_f32_bytes),
     EXPECT(QSAKV_ERROR_OVERLAY_BAD_TENSOR), SAYS("is BF16 of shape [2], not an FP32 scalar")},
    {"shape [1]", DAMAGE(shape_one), EXPECT(QSAKV_ERROR_OVERLAY_BAD_TENSOR),
     SAYS("not an FP32 scalar")},
    {"shape [2]", DAMAGE(shape_two), EXPECT(QSAKV_ERROR_OVERLAY_BAD_TENSOR),
     SAYS("is F32 of shape [2], not an FP32 scalar")},
    {"scale NaN", SCALE(11, 'k', NAN), EXPECT(QSAKV_ERROR_OVERLAY_BAD_SCALE),
     SAYS("layer 11 k_scale is nan")},
    {"scale +inf", SCALE(23, 'v', INFINITY), EXPECT(QSAKV_ERROR_OVERLAY_BAD_SCALE),
     SAYS("layer 23 v_scale is inf")},
    {"scale -inf", SCALE(3, 'k', -INFINITY), EXPECT(QSAKV_ERROR_OVERLAY_BAD_SCALE),
     SAYS("layer 3 k_scale is -inf")},
    {"scale zero", SCALE(47, 'v', 0.0f), EXPECT(QSAKV_ERROR_OVERLAY_BAD_SCALE),
     SAYS("layer 47 v_scale is 0")},
    {"scale -0", SCALE(47, 'k', -0.0f), EXPECT(QSAKV_ERROR_OVERLAY_BAD_SCALE),
     SAYS("layer 47 k_scale is -0")},
    {"scale negative", SCALE(19, 'k', -0.5f), EXPECT(QSAKV_ERROR_OVERLAY_BAD_SCALE), SAYS("-0.5")},
    {"scale negative subnormal", SCALE(19, 'v', -1e-45f), EXPECT(QSAKV_ERROR_OVERLAY_BAD_SCALE),
     SAYS("layer 19 v_scale is -1.4")},
    /* Subnormals: every stored value would saturate to 448, and the K scale folded into
     * the softmax factor underflows to 0. A scale is a normal positive float. */
    {"scale smallest positive subnormal", SCALE(19, 'v', 1e-45f),
     EXPECT(QSAKV_ERROR_OVERLAY_BAD_SCALE),
     SAYS("layer 19 v_scale is 1.40129846e-45", "a scale must be a normal positive float")},
    {"scale largest subnormal", SCALE(7, 'k', 1.17549421e-38f),
     EXPECT(QSAKV_ERROR_OVERLAY_BAD_SCALE),
     SAYS("layer 7 k_scale is 1.17549421e-38", "finite and >= FLT_MIN (1.17549435e-38)")},
    /* the smallest normal float is the smallest valid scale */
    {"scale FLT_MIN is valid", SCALE(19, 'v', 1.17549435e-38f), OK},
    {"23 of 24 scales", DAMAGE(scale_left_out), .layer = 47, .kind = 'v',
     EXPECT(QSAKV_ERROR_OVERLAY_INCOMPLETE), SAYS("loaded 23/24", "missing: layer 47 v_scale")},
    {"22 of 24 scales: both named", DAMAGE(layer_3_k_and_27_v_left_out),
     EXPECT(QSAKV_ERROR_OVERLAY_INCOMPLETE),
     SAYS("loaded 22/24 K/V scales; missing: layer 3 k_scale, layer 27 v_scale")},
    {"no tensors", DAMAGE(no_tensors), EXPECT(QSAKV_ERROR_OVERLAY_INCOMPLETE), SAYS("loaded 0/24")},
    {"extra unknown tensor", DAMAGE(tensor_added), .from = "model.layers.3.mlp.gate_proj.weight",
     EXPECT(QSAKV_ERROR_OVERLAY_UNKNOWN_TENSOR), SAYS("model.layers.3.mlp.gate_proj.weight")},
    {"scale of a non-QSA layer", DAMAGE(tensor_added), .from = "model.layers.4.self_attn.k_scale",
     EXPECT(QSAKV_ERROR_OVERLAY_UNKNOWN_TENSOR), SAYS("layer 4, which is not a QSA layer")},
    {"scale of a layer past the model", DAMAGE(tensor_added),
     .from = "model.layers.51.self_attn.v_scale", EXPECT(QSAKV_ERROR_OVERLAY_UNKNOWN_TENSOR),
     SAYS("layer 51, which is not a QSA layer")},
    {"one scale under two spellings", DAMAGE(tensor_added),
     .from = "model.layers.11.self_attn.attn.k_scale", EXPECT(QSAKV_ERROR_OVERLAY_DUPLICATE),
     SAYS("layer 11 k_scale is given twice")},
    {"mixed layer prefixes", DAMAGE(scale_renamed), .layer = 15, .kind = 'k',
     .from = "model.language_model.layers.15.self_attn.k_scale",
     EXPECT(QSAKV_ERROR_OVERLAY_UNKNOWN_TENSOR), SAYS("layer prefix")},

    /* hashes and the manifest */
    {"scale file changed after the manifest", DAMAGE(scale_changed_after_manifest),
     EXPECT(QSAKV_ERROR_HASH_MISMATCH), SAYS("SHA-256")},
    {"manifest missing", DAMAGE(manifest_deleted), EXPECT(QSAKV_ERROR_OVERLAY_MISSING),
     SAYS("overlay manifest not found")},
    {"manifest not JSON", DAMAGE(manifest_is), .from = "schema_version = 1\n",
     EXPECT(QSAKV_ERROR_FORMAT), SAYS("qsakv-overlay.json is not valid JSON")},
    {"manifest key twice", DAMAGE(manifest_key_twice), EXPECT(QSAKV_ERROR_FORMAT),
     SAYS("appears twice")},
    {"manifest field missing", MANIFEST_EDIT("\"unit_scale_control\": false,", ""),
     EXPECT(QSAKV_ERROR_FORMAT), SAYS("unit_scale_control")},
    {"manifest unit_scale_control not a boolean",
     MANIFEST_EDIT("\"unit_scale_control\": false", "\"unit_scale_control\": 0"),
     EXPECT(QSAKV_ERROR_FORMAT), SAYS("unit_scale_control is 0; expected true or false")},
    {"manifest unit_scale_control a string",
     MANIFEST_EDIT("\"unit_scale_control\": false", "\"unit_scale_control\": \"false\""),
     EXPECT(QSAKV_ERROR_FORMAT), SAYS("unit_scale_control is \"false\"; expected true or false")},
    {"manifest field unknown",
     MANIFEST_EDIT("\"kind\": \"qsakv-overlay\",",
                   "\"kind\": \"qsakv-overlay\", \"fallback_scale\": 1.0,"),
     EXPECT(QSAKV_ERROR_FORMAT), SAYS("unknown field \"fallback_scale\"")},
    {"manifest schema newer", MANIFEST_EDIT("\"schema_version\": 1", "\"schema_version\": 2"),
     EXPECT(QSAKV_ERROR_FORMAT), SAYS("schema_version")},
    {"manifest names another scale contract", MANIFEST_EDIT("max_abs/448", "p99.9/448"),
     EXPECT(QSAKV_ERROR_FORMAT), SAYS("scale_contract is \"e4m3fn(x/scale), p99.9/448\"")},
    {"manifest contract value unknown", DAMAGE(contract_is),
     .from = "{\"tp_size\": 4, \"speculative_tokens\": 0, \"activation_dtype\": \"fp8\", "
             "\"min_sm\": 70}",
     EXPECT(QSAKV_ERROR_FORMAT), SAYS("contract.activation_dtype is \"fp8\"")},
    /* the manifest's names and the file's, each way (a renamed entry would break both) */
    {"manifest lacks a name of the file",
     MANIFEST_EDIT(", \"model.layers.47.self_attn.v_scale\"", ""), EXPECT(QSAKV_ERROR_FORMAT),
     SAYS("has tensor \"model.layers.47.self_attn.v_scale\" that the manifest")},
    {"manifest lists a name the file lacks",
     MANIFEST_EDIT("\"tensor_names\": [",
                   "\"tensor_names\": [\"model.layers.47.self_attn.attn.v_scale\", "),
     EXPECT(QSAKV_ERROR_FORMAT), SAYS("lists \"model.layers.47.self_attn.attn.v_scale\" that")},
    {"manifest lists a name twice",
     MANIFEST_EDIT("\"tensor_names\": [",
                   "\"tensor_names\": [\"model.layers.3.self_attn.k_scale\", "),
     EXPECT(QSAKV_ERROR_OVERLAY_DUPLICATE),
     SAYS("tensor name \"model.layers.3.self_attn.k_scale\" is listed twice")},

    /* files and directories */
    {"path missing", DAMAGE(nothing_there), IN_CKPT_DIR, EXPECT(QSAKV_ERROR_OVERLAY_MISSING),
     SAYS("ckpt does not exist")},
    {"directory without a manifest", DAMAGE(empty_dir), IN_CKPT_DIR,
     EXPECT(QSAKV_ERROR_OVERLAY_MISSING), SAYS("overlay manifest not found")},
    {"directory without a scale file", DAMAGE(manifest_only), IN_CKPT_DIR,
     EXPECT(QSAKV_ERROR_OVERLAY_MISSING), SAYS("overlay scale file not found")},
    {"scale file a directory", DAMAGE(scale_file_a_directory), IN_CKPT_DIR, EXPECT(QSAKV_ERROR_IO),
     SAYS("model-kvscales.safetensors is not a regular file")},
    /* must neither block nor read it as an empty file (that would be HASH_MISMATCH) */
    {"scale file a FIFO", DAMAGE(scale_file_a_fifo), IN_CKPT_DIR, EXPECT(QSAKV_ERROR_IO),
     SAYS("not a regular file")},
    {"scale file a symlink loop", DAMAGE(scale_file_a_symlink_loop), IN_CKPT_DIR,
     EXPECT(QSAKV_ERROR_IO), SAYS("cannot open overlay scale file")},
    {"directory a symlink to itself", DAMAGE(dir_a_symlink_to_itself), IN_CKPT_DIR,
     EXPECT(QSAKV_ERROR_IO), SAYS("cannot stat overlay path")},

    /* the merged index of a checkpoint directory */
    {"checkpoint directory is valid", DAMAGE(ckpt_with_index), IN_CKPT_DIR,
     .from = "\"model.embed_tokens.weight\": \"model-00001.safetensors\"", OK},
    /* the base had its own layer 7 k_scale in a shard: the merged index still points there */
    {"name already in the base", DAMAGE(ckpt_with_index), IN_CKPT_DIR,
     .from = "\"model.layers.7.self_attn.k_scale\": \"model-00002.safetensors\"",
     .to = "model.layers.7.self_attn.k_scale", EXPECT(QSAKV_ERROR_OVERLAY_DUPLICATE),
     SAYS("already in the base checkpoint")},
    {"index lists a name twice", DAMAGE(ckpt_with_index), IN_CKPT_DIR,
     .from = "\"model.layers.7.self_attn.k_scale\": \"model-00002.safetensors\"",
     EXPECT(QSAKV_ERROR_OVERLAY_DUPLICATE), SAYS("twice")},
    {"index lacks a scale", DAMAGE(ckpt_with_index), IN_CKPT_DIR,
     .to = "model.layers.31.self_attn.v_scale", EXPECT(QSAKV_ERROR_OVERLAY_INCOMPLETE),
     SAYS("layer 31 v_scale")},
    {"index promises a tensor the file lacks", DAMAGE(ckpt_with_index), IN_CKPT_DIR,
     .from = "\"model.layers.51.self_attn.k_scale\": \"model-kvscales.safetensors\"",
     EXPECT(QSAKV_ERROR_FORMAT),
     SAYS("maps \"model.layers.51.self_attn.k_scale\" to model-kvscales.safetensors, which holds")},
    {"index not JSON", DAMAGE(ckpt_with_index_text), IN_CKPT_DIR, .from = "{\"weight_map\": ",
     EXPECT(QSAKV_ERROR_FORMAT), SAYS("model.safetensors.index.json is not valid JSON")},
};

enum { kNumCases = sizeof kCases / sizeof kCases[0] };

/* ---- running a row ----------------------------------------------------------------------- */

typedef struct case_state {
  const overlay_case* c;
  ovf_pack pack;
} case_state;

static int setup_case(void** state) {
  case_state* s = malloc(sizeof *s);
  if (!s) return -1;
  s->c = *state; /* the row, from the test's initial state */
  ovf_init(&s->pack);
  *state = s;
  return 0;
}

static int teardown_case(void** state) {
  case_state* s = *state;
  ovf_cleanup(&s->pack);
  free(s);
  return 0;
}

static void run_case(void** state) {
  case_state* s = *state;
  const overlay_case* c = s->c;
  /* A refusal's status alone may come from another rule than the row's: every row that
   * expects one names its message too. */
  if (c->expected != QSAKV_SUCCESS && !c->message[0])
    fail_msg("%s: the row expects %s but checks no message (SAYS)", c->name,
             qsakv_status_string(c->expected));
  c->damage(&s->pack, c);
  const qsakv_status got = c->open ? c->open(&s->pack) : ovf_load_validate(&s->pack);
  if (got != c->expected)
    fail_msg("%s: got %s (%s), expected %s", c->name, qsakv_status_string(got), qsakv_last_error(),
             qsakv_status_string(c->expected));
  for (int i = 0; i < 2; ++i)
    if (c->message[i]) OVF_MESSAGE_HAS(c->message[i]);
}

/* ---- what is not a damaged file: the runtime, the revision, the validated flag -------------- */

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
  snprintf(want, sizeof want,
           "expected_base_revision (the base checkpoint's index SHA-256) is %s; the overlay was "
           "made for %s",
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

static const char kTp4Contract[] =
    "{\"tp_size\": 4, \"speculative_tokens\": 0, \"activation_dtype\": \"fp16\", "
    "\"min_sm\": 70}";

static void test_contract_tp(void** state) {
  ovf_pack* p = *state;
  p->contract = kTp4Contract;
  ovf_write_pack(p);
  OVF_OK(validate_with(p, 4, 0, QSAKV_DTYPE_FP16));
  OVF_EXPECT(validate_with(p, 2, 0, QSAKV_DTYPE_FP16), QSAKV_ERROR_CONTRACT);
  OVF_MESSAGE_HAS("tp_size must be 4");
  OVF_MESSAGE_HAS("the config has 2");
}

static void test_contract_speculative_tokens(void** state) {
  ovf_pack* p = *state;
  p->contract = kTp4Contract;
  ovf_write_pack(p);
  OVF_EXPECT(validate_with(p, 4, 3, QSAKV_DTYPE_FP16), QSAKV_ERROR_CONTRACT);
  OVF_MESSAGE_HAS("speculative_tokens must be 0");
}

static void test_contract_activation_dtype(void** state) {
  ovf_pack* p = *state;
  p->contract = kTp4Contract;
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

static void test_unreadable_scale_file(void** state) {
  ovf_pack* p = *state;
  if (geteuid() == 0) {
    print_message(
        "[ SKIP ] running as root, whom chmod 000 does not stop (the table's \"scale "
        "file a directory\" stands in)\n");
    skip();
  }
  ovf_write_pack(p);
  assert_int_equal(chmod(p->scale, 0), 0);
  qsakv_overlay* o = NULL;
  OVF_EXPECT(qsakv_overlay_load(&o, p->scale, NULL), QSAKV_ERROR_IO);
  assert_int_equal(chmod(p->scale, 0644), 0);
}

/* The validated flag follows the last validation: a failure of any kind clears it. */
static qsakv_overlay* validated_overlay(ovf_pack* p, qsakv_model_config* c) {
  ovf_write_pack(p);
  qsakv_overlay* o = NULL;
  OVF_OK(ovf_load(p, &o));
  ovf_config(c, 1);
  OVF_OK(qsakv_overlay_validate(o, c, p->base_sha));
  return o;
}

static int validated(const qsakv_overlay* o) { return tu_overlay_info(o).validated; }

static void test_validated_after_success(void** state) {
  qsakv_model_config c;
  qsakv_overlay* o = validated_overlay(*state, &c);
  assert_int_equal(validated(o), 1);
  qsakv_overlay_destroy(o);
}

static void test_failed_validation_clears_validated(void** state) {
  ovf_pack* p = *state;
  qsakv_model_config c;
  qsakv_overlay* o = validated_overlay(p, &c);
  c.num_qsa_layers = 11; /* layer 47 is no longer QSA: its scales are unknown */
  OVF_EXPECT(qsakv_overlay_validate(o, &c, p->base_sha), QSAKV_ERROR_OVERLAY_UNKNOWN_TENSOR);
  assert_int_equal(validated(o), 0);
  qsakv_overlay_destroy(o);
}

static void test_refused_argument_clears_validated(void** state) {
  ovf_pack* p = *state;
  qsakv_model_config c;
  qsakv_overlay* o = validated_overlay(p, &c);
  OVF_EXPECT(qsakv_overlay_validate(o, &c, NULL), QSAKV_ERROR_INVALID_ARGUMENT);
  assert_int_equal(validated(o), 0);
  qsakv_overlay_destroy(o);
}

static void test_invalid_config_clears_validated(void** state) {
  ovf_pack* p = *state;
  qsakv_model_config c;
  qsakv_overlay* o = validated_overlay(p, &c);
  c.head_dim = 100; /* an invalid config is refused as such */
  OVF_EXPECT(qsakv_overlay_validate(o, &c, p->base_sha), QSAKV_ERROR_INVALID_CONFIG);
  assert_int_equal(validated(o), 0);
  qsakv_overlay_destroy(o);
}

#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)

static const struct CMUnitTest kBehaviour[] = {
    T(test_wrong_base_revision),
    T(test_revision_not_a_hash),
    T(test_contract_tp),
    T(test_contract_speculative_tokens),
    T(test_contract_activation_dtype),
    T(test_unconstrained_contract_accepts_any_runtime),
    T(test_unreadable_scale_file),
    T(test_validated_after_success),
    T(test_failed_validation_clears_validated),
    T(test_refused_argument_clears_validated),
    T(test_invalid_config_clears_validated),
};

enum { kNumBehaviour = sizeof kBehaviour / sizeof kBehaviour[0] };

int main(void) {
  struct CMUnitTest tests[kNumCases + kNumBehaviour];
  for (int i = 0; i < kNumCases; ++i)
    tests[i] =
        (struct CMUnitTest){kCases[i].name, run_case, setup_case, teardown_case, (void*)&kCases[i]};
  for (int i = 0; i < kNumBehaviour; ++i) tests[kNumCases + i] = kBehaviour[i];
  return cmocka_run_group_tests_name("overlay_adversarial", tests, NULL, NULL);
}
