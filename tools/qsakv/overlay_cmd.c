// SPDX-License-Identifier: Apache-2.0
/* qsakv overlay inspect | verify (make and materialize: calib_cmd.c) */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "commands.h"

const char kOverlayUsage[] =
    "usage: qsakv overlay inspect DIR|FILE [--manifest M] [--json]\n"
    "       qsakv overlay verify DIR|FILE [--revision SHA] [--manifest M]\n"
    "             [--preset qwen4_exp | --checkpoint CKPT] [--tp N] [--rank R] [--spec N]\n"
    "             [--act fp16|bf16] [--json]\n"
    "       qsakv overlay make --stats STATS... --base-index PATH OUT_DIR\n"
    "             [--tp N] [--spec N] [--act fp16|bf16] [--min-sm N] [--prefix P]\n"
    "       qsakv overlay materialize BASE_DIR SCALE_PACK OUT_DIR\n"
    "\n"
    "DIR is a materialised checkpoint directory (model.safetensors.index.json,\n"
    "model-kvscales.safetensors, qsakv-overlay.json) or a scale pack written by\n"
    "qsakv_overlay_write; FILE is a bare scale file (its manifest: --manifest, else\n"
    "qsakv-overlay.json beside it).\n"
    "inspect: the scales, revision hashes and contract. Every layer the scale file holds\n"
    "  is shown; the half of a K/V pair it lacks shows as nan (null in JSON); a tensor\n"
    "  that is not an F32 K/V scale is refused. A scale file that no manifest binds is\n"
    "  shown as found, with a note that nothing binds it (inspecting is not validating;\n"
    "  verify refuses it).\n"
    "verify: validates against a model config and the base revision SHA (the SHA-256 of\n"
    "  the base checkpoint's model.safetensors.index.json). The config: the preset\n"
    "  (default qwen4_exp) or --checkpoint CKPT (a checkpoint directory or its\n"
    "  config.json, read as by qsakv_model_config_from_checkpoint), with E4M3 KV and the\n"
    "  given runtime (--tp 1..65536, default 1; --rank 0..N-1, default 0; --spec 0..64,\n"
    "  default 0; --act fp16 by default). When CKPT's directory has an index, the\n"
    "  revision is CKPT's own (qsakv_checkpoint_revision: a materialised checkpoint's is\n"
    "  its base's, hashed now) and --revision, if given, must equal it\n"
    "  (QSAKV_ERROR_REVISION_MISMATCH); otherwise --revision is required. A unit-scale\n"
    "  negative control is valid and said so (\"unit_scale_control\").\n"
    "make: summarises the statistics (merged as by `calib summarize`; every refusal of\n"
    "  qsakv_calib_summarize applies) and writes the scale pack OUT_DIR\n"
    "  (model-kvscales.safetensors + qsakv-overlay.json) bound to the base checkpoint's\n"
    "  index PATH. Contract: --tp 0..65536 (default: the statistics' TP size; 0 = any),\n"
    "  --spec -1..64 (default -1, any), --act (default: the statistics' activation\n"
    "  dtype), --min-sm 0..10000 (default 0, any; 70 = SM 7.0); --prefix is the\n"
    "  checkpoint's layer prefix, a dotted name (default model.layers). Every value is\n"
    "  checked before a file is read.\n"
    "materialize: builds the calibrated checkpoint OUT_DIR from BASE_DIR and the pack;\n"
    "  the base index's SHA-256 must be the manifest's (checked before anything is\n"
    "  written; QSAKV_ERROR_REVISION_MISMATCH otherwise).\n"
    "After `--` the arguments are paths (make: they continue what came before it: the\n"
    "  --stats list, else OUT_DIR).\n"
    "--json prints one JSON object on stdout (verify: its \"revision\" in lower-case hex,\n"
    "  as the library compares it, however --revision was typed; also when the library\n"
    "  refuses, {\"valid\": false, \"status\": ..., \"message\": ...}).\n"
    "\n" QSAKV_EXIT_CODES_TEXT;

/* Options of both verbs; which verb takes which is checked in parse_args. */
struct overlay_args {
  const char* path;
  const char* manifest;
  const char* revision;
  const char* preset;
  const char* checkpoint;
  const char* act;
  char revision_lower[65]; /* --revision in lower case, as the library compares it */
  int json;
  int tp, rank, spec;
};

/* Returns -1 on success, else an exit code. */
static int parse_args(int argc, char** argv, struct overlay_args* a) {
  const int verify = !strcmp(argv[1], "verify");
  memset(a, 0, sizeof *a);
  a->tp = 1;
  int options_done = 0; /* after "--": paths only */
  for (int i = 2; i < argc; ++i) {
    const char* o = argv[i];
    if (!options_done && !strcmp(o, "--")) {
      options_done = 1;
      continue;
    }
    if (options_done || o[0] != '-') {
      if (a->path) return tool_usage_error("overlay %s: unexpected argument %s", argv[1], o);
      a->path = o;
      continue;
    }
    if (!strcmp(o, "--json")) {
      a->json = 1;
      continue;
    }
    const int known = !strcmp(o, "--manifest") || !strcmp(o, "--revision") ||
                      !strcmp(o, "--preset") || !strcmp(o, "--checkpoint") || !strcmp(o, "--act") ||
                      !strcmp(o, "--tp") || !strcmp(o, "--rank") || !strcmp(o, "--spec");
    if (!known) return tool_usage_error("overlay %s: unknown option %s", argv[1], o);
    if (!verify && strcmp(o, "--manifest"))
      return tool_usage_error("overlay %s does not take %s (overlay verify does)", argv[1], o);
    if (i + 1 >= argc) return tool_usage_error("overlay %s: %s needs a value", argv[1], o);
    const char* v = argv[++i];
    if (!strcmp(o, "--manifest"))
      a->manifest = v;
    else if (!strcmp(o, "--revision"))
      a->revision = v;
    else if (!strcmp(o, "--preset"))
      a->preset = v;
    else if (!strcmp(o, "--checkpoint"))
      a->checkpoint = v;
    else if (!strcmp(o, "--act"))
      a->act = v;
    else {
      int* dst = !strcmp(o, "--tp") ? &a->tp : !strcmp(o, "--rank") ? &a->rank : &a->spec;
      if (tool_parse_int(v, dst)) return tool_usage_error("%s: not an integer: %s", o, v);
    }
  }
  if (!a->path) return tool_usage_error("overlay %s: DIR or FILE missing", argv[1]);
  /* Values no run can have are the command line's fault (exit 2), not the library's. */
  if (a->tp < 1 || a->tp > QSAKV_TOOL_MAX_TP)
    return tool_usage_error("--tp: a TP size, 1 to %d, not %d", QSAKV_TOOL_MAX_TP, a->tp);
  if (a->rank < 0 || a->rank >= a->tp)
    return tool_usage_error("--rank: 0 to %d for --tp %d, not %d", a->tp - 1, a->tp, a->rank);
  if (a->spec < 0 || a->spec > QSAKV_TOOL_MAX_SPEC)
    return tool_usage_error("--spec: 0 to %d speculative tokens, not %d", QSAKV_TOOL_MAX_SPEC,
                            a->spec);
  if (a->preset && a->checkpoint)
    return tool_usage_error("overlay verify: --preset and --checkpoint exclude each other");
  if (a->act && strcmp(a->act, "fp16") && strcmp(a->act, "bf16"))
    return tool_usage_error("--act must be fp16 or bf16, not %s", a->act);
  int rc = a->revision ? tool_check_revision(a->revision) : -1;
  if (rc < 0 && a->revision) { /* printed and compared lower-case from here on */
    for (int i = 0; i < 65; ++i)
      a->revision_lower[i] = (char)tolower((unsigned char)a->revision[i]);
    a->revision = a->revision_lower;
  }
  if (rc < 0 && a->preset) rc = tool_check_preset(a->preset);
  return rc;
}

/* "null" when unconstrained (the text table turns it into "any"). */
static const char* contract_int(int v, int unset, char* buf, size_t n) {
  if (v == unset) return "null";
  snprintf(buf, n, "%d", v);
  return buf;
}

static const char* any(const char* s) { return strcmp(s, "null") ? s : "any"; }

static void print_scale_rows(const int32_t* layers, const float* k, const float* v, int n) {
  printf("%6s  %-14s  %-14s\n", "layer", "k_scale", "v_scale");
  for (int i = 0; i < n; ++i)
    printf("%6d  %-14.9g  %-14.9g\n", layers[i], (double)k[i], (double)v[i]);
}

/* The scales of a K/V pair as a table: a half the file lacks shows as nan. */
struct scale_table {
  int32_t n;
  int32_t* layers;
  float *k, *v;
  char sha256[65];
};

static void free_table(struct scale_table* t) {
  free(t->layers), free(t->k), free(t->v);
  memset(t, 0, sizeof *t);
}

/* Reads every layer of the scale file (qsakv_overlay_read_scale_file: each layer the file
 * holds, with the half of a pair it lacks as NaN). Returns -1, or an exit code. */
static int read_table(const char* scale, struct scale_table* t) {
  memset(t, 0, sizeof *t);
  qsakv_status s = qsakv_overlay_read_scale_file(scale, 0, NULL, NULL, NULL, &t->n, t->sha256);
  if (s != QSAKV_SUCCESS) return tool_refused(s);
  const int32_t capacity = t->n;
  t->layers = calloc((size_t)capacity + 1, sizeof *t->layers);
  t->k = calloc((size_t)capacity + 1, sizeof *t->k);
  t->v = calloc((size_t)capacity + 1, sizeof *t->v);
  if (!t->layers || !t->k || !t->v) {
    free_table(t);
    return tool_usage_error("out of memory");
  }
  s = qsakv_overlay_read_scale_file(scale, capacity, t->layers, t->k, t->v, &t->n, t->sha256);
  if (s == QSAKV_SUCCESS && t->n > capacity) { /* the file grew between the two reads */
    free_table(t);
    fprintf(stderr, "qsakv: %s changed while it was read; try again\n", scale);
    return QSAKV_EXIT_REFUSED;
  }
  if (s != QSAKV_SUCCESS) {
    free_table(t);
    return tool_refused(s);
  }
  return -1;
}

static void print_text(const qsakv_overlay_info* in, const struct scale_table* t) {
  char b1[16], b2[16], b3[16];
  printf("layer prefix:       %s\n", in->layer_prefix);
  printf("base index sha256:  %s\n", in->base_index_sha256);
  printf("scale file sha256:  %s\n", in->scale_file_sha256);
  printf("unit-scale control: %s\n", in->unit_scale_control ? "yes" : "no");
  printf("contract:           tp_size %s, speculative_tokens %s, activation %s, min SM %s\n",
         any(contract_int(in->contract_tp_size, 0, b1, sizeof b1)),
         any(contract_int(in->contract_speculative_tokens, -1, b2, sizeof b2)),
         in->contract_activation_dtype == QSAKV_DTYPE_INVALID
             ? "any"
             : qsakv_dtype_name(in->contract_activation_dtype),
         any(contract_int(in->contract_min_sm, 0, b3, sizeof b3)));
  printf("scales:             %d (a K or V the file lacks shows as nan)\n\n", in->num_scales);
  print_scale_rows(t->layers, t->k, t->v, t->n);
}

/* JSON by hand is safe for the bound view: every string printed is a hex digest, a dtype
 * name or a layer prefix the library checked to be [A-Za-z0-9_.-]; paths and messages
 * go through tool_json_string. */
static void print_json_number(float x) {
  if (isfinite(x))
    printf("%.9g", (double)x);
  else
    printf("null");
}

static void print_json_layer(int first, int layer, float k, float v) {
  printf("%s\n  {\"layer\": %d, \"k_scale\": ", first ? "" : ",", layer);
  print_json_number(k);
  printf(", \"v_scale\": ");
  print_json_number(v);
  printf("}");
}

static void print_json(const qsakv_overlay_info* in, const struct scale_table* t) {
  printf(
      "{\"bound\": true, \"layer_prefix\": \"%s\", \"base_index_sha256\": \"%s\", "
      "\"scale_file_sha256\": \"%s\", \"unit_scale_control\": %s, \"num_scales\": %d,\n",
      in->layer_prefix, in->base_index_sha256, in->scale_file_sha256,
      in->unit_scale_control ? "true" : "false", in->num_scales);
  /* As in the manifest: null = not constrained. */
  char tp[16], spec[16], sm[16], act[16];
  snprintf(act, sizeof act, "\"%s\"", qsakv_dtype_name(in->contract_activation_dtype));
  printf(
      " \"contract\": {\"tp_size\": %s, \"speculative_tokens\": %s, "
      "\"activation_dtype\": %s, \"min_sm\": %s},\n \"layers\": [",
      contract_int(in->contract_tp_size, 0, tp, sizeof tp),
      contract_int(in->contract_speculative_tokens, -1, spec, sizeof spec),
      in->contract_activation_dtype == QSAKV_DTYPE_INVALID ? "null" : act,
      contract_int(in->contract_min_sm, 0, sm, sizeof sm));
  for (int i = 0; i < t->n; ++i) print_json_layer(i == 0, t->layers[i], t->k[i], t->v[i]);
  printf("\n ]}\n");
}

static int is_kind(const char* path, mode_t kind) {
  struct stat st;
  return stat(path, &st) == 0 && (st.st_mode & S_IFMT) == kind;
}

/* The scale file and default manifest of DIR|FILE, as qsakv_overlay_load looks for them. */
static void overlay_paths(const char* path, char* scale, char* manifest, size_t n) {
  if (is_kind(path, S_IFDIR)) {
    snprintf(scale, n, "%s/model-kvscales.safetensors", path);
    snprintf(manifest, n, "%s/qsakv-overlay.json", path);
    return;
  }
  snprintf(scale, n, "%s", path);
  const char* slash = strrchr(path, '/');
  if (slash)
    snprintf(manifest, n, "%.*s/qsakv-overlay.json", (int)(slash - path), path);
  else
    snprintf(manifest, n, "qsakv-overlay.json");
}

/* A scale file that no manifest binds: its scales as found, and that nothing binds them. */
static int inspect_unbound(const struct overlay_args* a, const char* scale, const char* manifest) {
  struct scale_table t;
  const int rc = read_table(scale, &t);
  if (rc >= 0) return rc;
  int num_scales = 0;
  for (int i = 0; i < t.n; ++i) num_scales += !isnan(t.k[i]) + !isnan(t.v[i]);
  if (a->json) {
    printf("{\"bound\": false, \"scale_file\": ");
    tool_json_string(stdout, scale);
    printf(", \"missing_manifest\": ");
    tool_json_string(stdout, manifest);
    printf(", \"scale_file_sha256\": \"%s\", \"num_scales\": %d,\n \"layers\": [", t.sha256,
           num_scales);
    for (int i = 0; i < t.n; ++i) print_json_layer(i == 0, t.layers[i], t.k[i], t.v[i]);
    printf("\n ]}\n");
  } else {
    printf("scale file:         %s\n", scale);
    printf("scale file sha256:  %s\n", t.sha256);
    printf(
        "manifest:           none: no manifest binds this file (%s does not exist),\n"
        "                    so no checkpoint revision and no contract; the scales are\n"
        "                    shown as found, not validated (overlay verify refuses it)\n",
        manifest);
    printf("scales:             %d (a K or V the file lacks shows as nan)\n\n", num_scales);
    print_scale_rows(t.layers, t.k, t.v, t.n);
  }
  free_table(&t);
  return QSAKV_EXIT_OK;
}

/* A bound overlay: the manifest's binding and contract (the loaded handle) and every layer
 * the scale file holds (read as the unbound view reads it, so that a layer with one half
 * of its pair shows, the other half as nan; qsakv_overlay_get_scales answers only for
 * whole pairs). The file read must be the one the handle hashed. */
static int inspect(const struct overlay_args* a) {
  char scale[4096], manifest[4096];
  overlay_paths(a->path, scale, manifest, sizeof scale);
  qsakv_overlay* o = NULL;
  qsakv_status s = qsakv_overlay_load(&o, a->path, a->manifest);
  if (s == QSAKV_ERROR_OVERLAY_MISSING && !a->manifest && is_kind(scale, S_IFREG) &&
      !is_kind(manifest, S_IFREG))
    return inspect_unbound(a, scale, manifest);
  if (s != QSAKV_SUCCESS) return tool_refused(s);
  qsakv_overlay_info info;
  memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  info.version = QSAKV_OVERLAY_INFO_VERSION;
  s = qsakv_overlay_get_info(o, &info);
  qsakv_overlay_destroy(o);
  if (s != QSAKV_SUCCESS) return tool_refused(s);
  struct scale_table t;
  const int rc = read_table(scale, &t);
  if (rc >= 0) return rc;
  if (strcmp(t.sha256, info.scale_file_sha256)) {
    fprintf(stderr,
            "qsakv: %s changed while it was read (SHA-256 %s, the manifest records %s); try "
            "again\n",
            scale, t.sha256, info.scale_file_sha256);
    free_table(&t);
    return QSAKV_EXIT_REFUSED;
  }
  if (a->json)
    print_json(&info, &t);
  else
    print_text(&info, &t);
  free_table(&t);
  return QSAKV_EXIT_OK;
}

static qsakv_status make_config(const struct overlay_args* a, qsakv_model_config* c) {
  const qsakv_status s = a->checkpoint
                             ? qsakv_model_config_from_checkpoint(c, a->checkpoint)
                             : qsakv_model_config_preset(c, a->preset ? a->preset : "qwen4_exp");
  if (s != QSAKV_SUCCESS) return s;
  c->kv_dtype = QSAKV_DTYPE_E4M3;
  c->tp_size = a->tp;
  c->tp_rank = a->rank;
  c->speculative_tokens = a->spec;
  return QSAKV_SUCCESS;
}

/* verify's refusal: "STATUS: message" on stderr, and with --json a verdict on stdout. */
static int verify_refused_with(const struct overlay_args* a, qsakv_status s, const char* message) {
  if (a->json) {
    printf("{\"valid\": false, \"path\": ");
    tool_json_string(stdout, a->path);
    printf(", \"status\": \"%s\", \"message\": ", qsakv_status_string(s));
    tool_json_string(stdout, message);
    printf("}\n");
  }
  fprintf(stderr, "%s: %s\n", qsakv_status_string(s), message);
  return QSAKV_EXIT_REFUSED;
}

static int verify_refused(const struct overlay_args* a, qsakv_status s) {
  return verify_refused_with(a, s, qsakv_last_error());
}

/* The checkpoint directory of --checkpoint (a directory, or its config.json). */
static void checkpoint_dir(const char* checkpoint, char* dir, size_t n) {
  snprintf(dir, n, "%s", checkpoint);
  if (is_kind(checkpoint, S_IFDIR)) return;
  char* slash = strrchr(dir, '/');
  if (!slash)
    snprintf(dir, n, ".");
  else if (slash == dir)
    dir[1] = '\0';
  else
    *slash = '\0';
}

/* Where verify's revision came from (the --json verdict's "revision_from"). */
static const char* const kRevisionFrom[] = {"argument", "checkpoint", "both"};

/* The revision to validate against: --checkpoint's own when it is a checkpoint with an
 * index (a materialised one answers with its base's), which --revision, when given, must
 * equal; else --revision. Returns -1 and fills rev and *from (an index of kRevisionFrom),
 * or an exit code. */
static int verify_revision(const struct overlay_args* a, char rev[65], int* from) {
  *from = 0;
  if (a->checkpoint) {
    char dir[4096], index[4200];
    checkpoint_dir(a->checkpoint, dir, sizeof dir);
    snprintf(index, sizeof index, "%s/model.safetensors.index.json", dir);
    if (is_kind(index, S_IFREG)) {
      const qsakv_status s = qsakv_checkpoint_revision(dir, rev);
      if (s != QSAKV_SUCCESS) return verify_refused(a, s);
      if (a->revision && strcmp(a->revision, rev)) {
        char message[512];
        snprintf(message, sizeof message,
                 "--revision is %.80s, but the checkpoint %.200s has revision %s (the SHA-256 "
                 "of its base's model.safetensors.index.json)",
                 a->revision, dir, rev);
        return verify_refused_with(a, QSAKV_ERROR_REVISION_MISMATCH, message);
      }
      *from = a->revision ? 2 : 1;
      return -1;
    }
  }
  if (!a->revision)
    return tool_usage_error(
        "overlay verify: --revision SHA is required (or --checkpoint, a checkpoint directory "
        "with a model.safetensors.index.json, to take it from)");
  snprintf(rev, 65, "%s", a->revision);
  return -1;
}

static int verify(const struct overlay_args* a) {
  const qsakv_dtype act = a->act && !strcmp(a->act, "bf16") ? QSAKV_DTYPE_BF16 : QSAKV_DTYPE_FP16;
  char rev[65];
  int rev_from = 0;
  const int rc = verify_revision(a, rev, &rev_from);
  if (rc >= 0) return rc;
  qsakv_model_config c;
  qsakv_status s = make_config(a, &c);
  if (s != QSAKV_SUCCESS) return verify_refused(a, s);
  c.activation_dtype = act;
  qsakv_overlay* o = NULL;
  s = qsakv_overlay_load(&o, a->path, a->manifest);
  if (s != QSAKV_SUCCESS) return verify_refused(a, s);
  s = qsakv_overlay_validate(o, &c, rev);
  qsakv_overlay_info info;
  memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  info.version = QSAKV_OVERLAY_INFO_VERSION;
  if (s == QSAKV_SUCCESS) s = qsakv_overlay_get_info(o, &info);
  qsakv_overlay_destroy(o);
  if (s != QSAKV_SUCCESS) return verify_refused(a, s);
  if (a->json) {
    printf("{\"valid\": true, \"path\": ");
    tool_json_string(stdout, a->path);
    printf(", \"revision\": ");
    tool_json_string(stdout, rev);
    printf(", \"revision_from\": \"%s\", \"unit_scale_control\": %s", kRevisionFrom[rev_from],
           info.unit_scale_control ? "true" : "false");
    printf(", \"config\": {\"source\": ");
    tool_json_string(stdout, a->checkpoint ? a->checkpoint : a->preset ? a->preset : "qwen4_exp");
    printf(
        ", \"source_kind\": \"%s\", \"tp_size\": %d, \"tp_rank\": %d, "
        "\"speculative_tokens\": %d, \"activation_dtype\": \"%s\", \"kv_dtype\": \"%s\", "
        "\"num_layers\": %d, \"qsa_layers\": [",
        a->checkpoint ? "checkpoint" : "preset", c.tp_size, c.tp_rank, c.speculative_tokens,
        qsakv_dtype_name(c.activation_dtype), qsakv_dtype_name(c.kv_dtype), c.num_layers);
    for (int i = 0; i < c.num_qsa_layers; ++i) printf("%s%d", i ? ", " : "", c.qsa_layers[i]);
    printf("]}}\n");
    return QSAKV_EXIT_OK;
  }
  if (a->checkpoint)
    printf("OK: %s is valid for checkpoint config %s", a->path, a->checkpoint);
  else
    printf("OK: %s is valid for preset %s", a->path, a->preset ? a->preset : "qwen4_exp");
  printf(", TP%d rank %d, %d speculative tokens, %s activations, base revision %s%s\n", c.tp_size,
         c.tp_rank, c.speculative_tokens, qsakv_dtype_name(c.activation_dtype), rev,
         rev_from ? " (the checkpoint's)" : "");
  if (info.unit_scale_control)
    printf(
        "note: a unit-scale negative control (its manifest says unit_scale_control): valid, "
        "but its scales are not calibrated\n");
  return QSAKV_EXIT_OK;
}

int cmd_overlay(int argc, char** argv) {
  if (argc < 2) {
    fputs(kOverlayUsage, stderr);
    return QSAKV_EXIT_USAGE;
  }
  if (!strcmp(argv[1], "make") || !strcmp(argv[1], "materialize"))
    return cmd_overlay_build(argc, argv);
  if (strcmp(argv[1], "inspect") && strcmp(argv[1], "verify"))
    return tool_usage_error(
        "unknown verb \"overlay %s\" (verbs: inspect, verify, make, "
        "materialize)",
        argv[1]);
  struct overlay_args a;
  const int rc = parse_args(argc, argv, &a);
  if (rc >= 0) return rc;
  return !strcmp(argv[1], "inspect") ? inspect(&a) : verify(&a);
}
