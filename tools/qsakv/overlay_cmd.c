/* qsakv overlay inspect | verify */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "commands.h"

static const char kOverlayUsage[] =
    "usage: qsakv overlay inspect DIR|FILE [--manifest M] [--json]\n"
    "       qsakv overlay verify DIR|FILE --revision SHA [--manifest M]\n"
    "             [--preset qwen4_exp] [--tp N] [--rank R] [--spec N] [--act fp16|bf16]\n"
    "\n"
    "DIR is a materialised checkpoint directory (model.safetensors.index.json,\n"
    "model-kvscales.safetensors, qsakv-overlay.json) or a scale pack written by\n"
    "qsakv_overlay_write; FILE is a bare scale file (its manifest: --manifest, else\n"
    "qsakv-overlay.json beside it).\n"
    "verify: SHA is the SHA-256 of the base checkpoint's model.safetensors.index.json.\n"
    "The config is the preset (default qwen4_exp) with E4M3 KV and the given runtime.\n";

/* Options of both verbs. */
struct overlay_args {
  const char* path;
  const char* manifest;
  const char* revision;
  const char* preset;
  const char* act;
  int json;
  int tp, rank, spec;
};

/* Returns -1 on success, else an exit code. */
static int parse_args(int argc, char** argv, struct overlay_args* a) {
  memset(a, 0, sizeof *a);
  a->preset = "qwen4_exp";
  a->tp = 1;
  for (int i = 2; i < argc; ++i) {
    const char* o = argv[i];
    const int has_value = i + 1 < argc;
    if (!strcmp(o, "--json")) {
      a->json = 1;
    } else if (o[0] == '-' && o[1] == '-' && !has_value) {
      return tool_usage_error("%s needs a value", o);
    } else if (!strcmp(o, "--manifest")) {
      a->manifest = argv[++i];
    } else if (!strcmp(o, "--revision")) {
      a->revision = argv[++i];
    } else if (!strcmp(o, "--preset")) {
      a->preset = argv[++i];
    } else if (!strcmp(o, "--act")) {
      a->act = argv[++i];
    } else if (!strcmp(o, "--tp") || !strcmp(o, "--rank") || !strcmp(o, "--spec")) {
      int* dst = !strcmp(o, "--tp") ? &a->tp : !strcmp(o, "--rank") ? &a->rank : &a->spec;
      if (tool_parse_int(argv[++i], dst)) return tool_usage_error("%s: not an integer", o);
    } else if (o[0] == '-') {
      return tool_usage_error("unknown option %s", o);
    } else if (!a->path) {
      a->path = o;
    } else {
      return tool_usage_error("unexpected argument %s", o);
    }
  }
  if (!a->path) return tool_usage_error("overlay %s: DIR or FILE missing", argv[1]);
  return -1;
}

/* "null" when unconstrained (the text table turns it into "any"). */
static const char* contract_int(int v, int unset, char* buf, size_t n) {
  if (v == unset) return "null";
  snprintf(buf, n, "%d", v);
  return buf;
}

static const char* any(const char* s) { return strcmp(s, "null") ? s : "any"; }

static void print_text(const qsakv_overlay* o, const qsakv_overlay_info* in) {
  char b1[16], b2[16], b3[16];
  printf("layer prefix:       %s\n", in->layer_prefix);
  printf("base index sha256:  %s\n", in->base_index_sha256);
  printf("scale file sha256:  %s\n", in->scale_file_sha256);
  printf("unit-scale control: %s\n", in->unit_scale_control ? "yes" : "no");
  printf("contract:           tp_size %s, speculative_tokens %s, activation %s, min SM %s\n",
         any(contract_int(in->contract_tp_size, 0, b1, sizeof b1)),
         any(contract_int(in->contract_speculative_tokens, -1, b2, sizeof b2)),
         in->contract_activation_dtype == QSAKV_DTYPE_INVALID
             ? "any" : qsakv_dtype_name(in->contract_activation_dtype),
         any(contract_int(in->contract_min_sm, 0, b3, sizeof b3)));
  printf("scales:             %d\n\n%6s  %-14s  %-14s\n", in->num_scales, "layer", "k_scale",
         "v_scale");
  for (int layer = 0; layer < QSAKV_MAX_LAYERS; ++layer) {
    float k, v;
    if (qsakv_overlay_get_scales(o, layer, &k, &v) == QSAKV_SUCCESS)
      printf("%6d  %-14.9g  %-14.9g\n", layer, (double)k, (double)v);
  }
}

/* JSON by hand is safe here: every string printed is a hex digest, a dtype name or a
 * layer prefix the library checked to be [A-Za-z0-9_.-]. */
static void print_json_number(float x) {
  if (isfinite(x))
    printf("%.9g", (double)x);
  else
    printf("null");
}

static void print_json(const qsakv_overlay* o, const qsakv_overlay_info* in) {
  printf("{\"layer_prefix\": \"%s\", \"base_index_sha256\": \"%s\", "
         "\"scale_file_sha256\": \"%s\", \"unit_scale_control\": %s, \"num_scales\": %d,\n",
         in->layer_prefix, in->base_index_sha256, in->scale_file_sha256,
         in->unit_scale_control ? "true" : "false", in->num_scales);
  /* As in the manifest: null = not constrained. */
  char tp[16], spec[16], sm[16], act[16];
  snprintf(act, sizeof act, "\"%s\"", qsakv_dtype_name(in->contract_activation_dtype));
  printf(" \"contract\": {\"tp_size\": %s, \"speculative_tokens\": %s, "
         "\"activation_dtype\": %s, \"min_sm\": %s},\n \"layers\": [",
         contract_int(in->contract_tp_size, 0, tp, sizeof tp),
         contract_int(in->contract_speculative_tokens, -1, spec, sizeof spec),
         in->contract_activation_dtype == QSAKV_DTYPE_INVALID ? "null" : act,
         contract_int(in->contract_min_sm, 0, sm, sizeof sm));
  int first = 1;
  for (int layer = 0; layer < QSAKV_MAX_LAYERS; ++layer) {
    float k, v;
    if (qsakv_overlay_get_scales(o, layer, &k, &v) != QSAKV_SUCCESS) continue;
    printf("%s\n  {\"layer\": %d, \"k_scale\": ", first ? "" : ",", layer);
    print_json_number(k);
    printf(", \"v_scale\": ");
    print_json_number(v);
    printf("}");
    first = 0;
  }
  printf("\n ]}\n");
}

static int inspect(const struct overlay_args* a) {
  qsakv_overlay* o = NULL;
  qsakv_status s = qsakv_overlay_load(&o, a->path, a->manifest);
  if (s != QSAKV_SUCCESS) return tool_refused(s);
  qsakv_overlay_info info;
  memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  info.version = QSAKV_OVERLAY_INFO_VERSION;
  s = qsakv_overlay_get_info(o, &info);
  if (s == QSAKV_SUCCESS) {
    if (a->json)
      print_json(o, &info);
    else
      print_text(o, &info);
  }
  qsakv_overlay_destroy(o);
  return s == QSAKV_SUCCESS ? QSAKV_EXIT_OK : tool_refused(s);
}

static int make_config(const struct overlay_args* a, qsakv_model_config* c) {
  qsakv_status s = qsakv_model_config_preset(c, a->preset);
  if (s != QSAKV_SUCCESS) return tool_refused(s);
  c->kv_dtype = QSAKV_DTYPE_E4M3;
  c->tp_size = a->tp;
  c->tp_rank = a->rank;
  c->speculative_tokens = a->spec;
  if (a->act && !strcmp(a->act, "fp16"))
    c->activation_dtype = QSAKV_DTYPE_FP16;
  else if (a->act && !strcmp(a->act, "bf16"))
    c->activation_dtype = QSAKV_DTYPE_BF16;
  else if (a->act)
    return tool_usage_error("--act must be fp16 or bf16, not %s", a->act);
  return -1;
}

static int verify(const struct overlay_args* a) {
  if (!a->revision) return tool_usage_error("overlay verify: --revision SHA is required");
  qsakv_model_config c;
  int rc = make_config(a, &c);
  if (rc >= 0) return rc;
  qsakv_overlay* o = NULL;
  qsakv_status s = qsakv_overlay_load(&o, a->path, a->manifest);
  if (s != QSAKV_SUCCESS) return tool_refused(s);
  s = qsakv_overlay_validate(o, &c, a->revision);
  qsakv_overlay_destroy(o);
  if (s != QSAKV_SUCCESS) return tool_refused(s);
  printf("OK: %s is valid for preset %s, TP%d rank %d, %d speculative tokens, %s "
         "activations, base revision %s\n", a->path, a->preset, c.tp_size, c.tp_rank,
         c.speculative_tokens, qsakv_dtype_name(c.activation_dtype), a->revision);
  return QSAKV_EXIT_OK;
}

int cmd_overlay(int argc, char** argv) {
  if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
    fputs(kOverlayUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? QSAKV_EXIT_USAGE : QSAKV_EXIT_OK;
  }
  struct overlay_args a;
  const int rc = parse_args(argc, argv, &a);
  if (rc >= 0) return rc;
  if (!strcmp(argv[1], "inspect")) return inspect(&a);
  if (!strcmp(argv[1], "verify")) return verify(&a);
  return tool_usage_error("unknown verb \"overlay %s\"", argv[1]);
}
