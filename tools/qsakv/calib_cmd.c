// SPDX-License-Identifier: Apache-2.0
/* qsakv calib summarize | merge | envelope, and qsakv overlay make | materialize:
 * from statistics files to a revision-bound overlay. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"

const char kCalibUsage[] =
    "usage: qsakv calib summarize STATS... [--json [--histograms]]\n"
    "       qsakv calib merge OUT STATS...\n"
    "       qsakv calib envelope OUT STATS...\n"
    "\n"
    "STATS are statistics files written by qsakv_calib_save (one per TP rank, or merged).\n"
    "summarize: per QSA layer and K/V: count, max |x|, scale (max/448 rounded up),\n"
    "  p99.9, p99.99, saturating and underflowing fractions. Several files are merged\n"
    "  first: as ranks of one run, or, when each is complete, as an envelope of runs.\n"
    "  --json prints one JSON object; --histograms (with --json) adds the nonzero\n"
    "  histogram bins ([bin, count] pairs; bin b spans\n"
    "  [2^(-24 + 40b/4096), 2^(-24 + 40(b+1)/4096))).\n"
    "merge: the TP ranks of one run into OUT (each rank exactly once).\n"
    "envelope: complete statistics of several runs into OUT (max of maxima).\n"
    "With several files, each must have observed every QSA layer's K and V (at TP > 1\n"
    "  each rank holds other KV heads): QSAKV_ERROR_OVERLAY_INCOMPLETE otherwise, naming\n"
    "  the input; the files are then listed by input index.\n"
    "OUT must not exist. merge and envelope take no options.\n"
    "\n" QSAKV_EXIT_CODES_TEXT;

static void free_all(qsakv_calib** h, int n) {
  for (int i = 0; i < n; ++i) qsakv_calib_destroy(h[i]);
  free(h);
}

/* A refused merge of `n` files: the library's message names inputs by index, so each
 * index's file follows it (when there are several). Returns the exit code. */
static int merge_refused(qsakv_status s, char** paths, int n) {
  const int rc = tool_refused(s);
  if (n > 1)
    for (int i = 0; i < n; ++i) fprintf(stderr, "  input %d: %s\n", i, paths[i]);
  return rc;
}

/* Loads and merges `n` files: one file as is; several as an envelope when every one
 * is complete, else as ranks of one run. Returns an exit code; *out on success. */
static int load_merged(char** paths, int n, qsakv_calib** out) {
  const int repeated = tool_refuse_repeated_files(paths, n, "STATS");
  if (repeated >= 0) return repeated;
  qsakv_calib** in = calloc((size_t)n, sizeof *in);
  if (!in) return tool_usage_error("out of memory");
  int all_complete = 1;
  for (int i = 0; i < n; ++i) {
    qsakv_status s = qsakv_calib_load(&in[i], paths[i]);
    if (s != QSAKV_SUCCESS) {
      free_all(in, i);
      return tool_refused(s);
    }
    qsakv_calib_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    info.version = QSAKV_CALIB_INFO_VERSION;
    qsakv_calib_get_info(in[i], &info);
    all_complete &= info.complete;
  }
  qsakv_status s = qsakv_calib_merge(
      out, (const qsakv_calib* const*)in, n,
      n > 1 && all_complete ? QSAKV_CALIB_MERGE_ENVELOPE : QSAKV_CALIB_MERGE_RANKS);
  free_all(in, n);
  return s == QSAKV_SUCCESS ? -1 : merge_refused(s, paths, n);
}

static int merge_to(char** paths, int n, const char* out_path, qsakv_calib_merge_mode mode) {
  const int repeated = tool_refuse_repeated_files(paths, n, "STATS");
  if (repeated >= 0) return repeated;
  qsakv_calib** in = calloc((size_t)n, sizeof *in);
  if (!in) return tool_usage_error("out of memory");
  for (int i = 0; i < n; ++i) {
    qsakv_status s = qsakv_calib_load(&in[i], paths[i]);
    if (s != QSAKV_SUCCESS) {
      free_all(in, i);
      return tool_refused(s);
    }
  }
  qsakv_calib* m = NULL;
  qsakv_status s = qsakv_calib_merge(&m, (const qsakv_calib* const*)in, n, mode);
  free_all(in, n);
  if (s != QSAKV_SUCCESS) return merge_refused(s, paths, n);
  s = qsakv_calib_save(m, out_path);
  qsakv_calib_destroy(m);
  if (s != QSAKV_SUCCESS) return tool_refused(s);
  printf("wrote %s (%s of %d file%s)\n", out_path,
         mode == QSAKV_CALIB_MERGE_RANKS ? "ranks" : "envelope", n, n == 1 ? "" : "s");
  return QSAKV_EXIT_OK;
}

static void print_hist_json(const uint64_t* hist) {
  printf(", \"histogram\": [");
  int first = 1;
  for (int b = 0; b < QSAKV_CALIB_BINS; ++b)
    if (hist[b]) {
      printf("%s[%d, %llu]", first ? "" : ", ", b, (unsigned long long)hist[b]);
      first = 0;
    }
  printf("]");
}

static int summarize(char** paths, int n, int json, int histograms) {
  qsakv_calib* c = NULL;
  int rc = load_merged(paths, n, &c);
  if (rc >= 0) return rc;
  qsakv_calib_info info;
  memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  info.version = QSAKV_CALIB_INFO_VERSION;
  qsakv_calib_get_info(c, &info);
  /* Every refusal first (a summary of the first layer checks the whole handle), so a
   * refused report prints nothing on stdout. */
  qsakv_calib_summary sum;
  memset(&sum, 0, sizeof sum);
  sum.struct_size = sizeof sum;
  sum.version = QSAKV_CALIB_SUMMARY_VERSION;
  qsakv_status s = qsakv_calib_summarize(c, info.qsa_layers[0], QSAKV_CALIB_K, &sum);
  if (s != QSAKV_SUCCESS) {
    qsakv_calib_destroy(c);
    return tool_refused(s);
  }
  static uint64_t hist[QSAKV_CALIB_BINS];
  if (json)
    printf(
        "{\"config_fingerprint\": \"%s\", \"tp_size\": %d, \"ranks_covered\": %d, "
        "\"num_runs\": %d, \"activation_dtype\": \"%s\", \"e4m3_max\": 448, "
        "\"hist_bins\": %d, \"hist_log2_min\": %d, \"hist_log2_max\": %d,\n \"layers\": [",
        info.config_fingerprint, info.tp_size, info.ranks_covered, info.num_runs,
        qsakv_dtype_name(info.activation_dtype), QSAKV_CALIB_BINS, QSAKV_CALIB_LOG2_MIN,
        QSAKV_CALIB_LOG2_MAX);
  else
    printf(
        "fingerprint %s, TP%d (%d rank(s) covered), %d run(s), %s activations\n\n"
        "%5s %2s %12s %13s %15s %13s %13s %10s %10s\n",
        info.config_fingerprint, info.tp_size, info.ranks_covered, info.num_runs,
        qsakv_dtype_name(info.activation_dtype), "layer", "", "count", "max_abs", "scale", "p99.9",
        "p99.99", "saturate", "underflow");
  for (int i = 0; i < info.num_qsa_layers; ++i)
    for (int kind = 0; kind < 2; ++kind) {
      const int layer = info.qsa_layers[i];
      qsakv_calib_stats st;
      memset(&st, 0, sizeof st);
      st.struct_size = sizeof st;
      st.version = QSAKV_CALIB_STATS_VERSION;
      s = qsakv_calib_summarize(c, layer, (qsakv_calib_kind)kind, &sum);
      if (s == QSAKV_SUCCESS)
        s = qsakv_calib_get_stats(c, layer, (qsakv_calib_kind)kind, &st, hist);
      if (s != QSAKV_SUCCESS) {
        qsakv_calib_destroy(c);
        return tool_refused(s);
      }
      if (json) {
        printf(
            "%s\n  {\"layer\": %d, \"kind\": \"%s\", \"count\": %llu, \"finite_count\": %llu, "
            "\"nonzero_count\": %llu, \"max_abs\": %.9g, \"scale\": %.9g, \"p99_9\": %.9g, "
            "\"p99_99\": %.9g, \"saturate_fraction\": %.17g, \"underflow_fraction\": %.17g",
            i || kind ? "," : "", layer, kind ? "v" : "k", (unsigned long long)sum.count,
            (unsigned long long)sum.finite_count, (unsigned long long)sum.nonzero_count,
            (double)sum.max_abs, (double)sum.scale, (double)sum.p99_9, (double)sum.p99_99,
            sum.saturate_fraction, sum.underflow_fraction);
        if (histograms) print_hist_json(hist);
        printf("}");
      } else {
        printf("%5d %2s %12llu %13.7g %15.9g %13.7g %13.7g %10.3g %10.3g\n", layer,
               kind ? "V" : "K", (unsigned long long)sum.count, (double)sum.max_abs,
               (double)sum.scale, (double)sum.p99_9, (double)sum.p99_99, sum.saturate_fraction,
               sum.underflow_fraction);
      }
    }
  if (json) printf("\n ]}\n");
  qsakv_calib_destroy(c);
  return QSAKV_EXIT_OK;
}

int cmd_calib(int argc, char** argv) {
  if (argc < 2) {
    fputs(kCalibUsage, stderr);
    return QSAKV_EXIT_USAGE;
  }
  int json = 0, histograms = 0, n = 0;
  char** files = calloc((size_t)argc, sizeof *files);
  if (!files) return tool_usage_error("out of memory");
  int options_done = 0; /* after "--": files only */
  for (int i = 2; i < argc; ++i) {
    if (!options_done && !strcmp(argv[i], "--"))
      options_done = 1;
    else if (options_done)
      files[n++] = argv[i];
    else if (!strcmp(argv[i], "--json"))
      json = 1;
    else if (!strcmp(argv[i], "--histograms"))
      histograms = 1;
    else if (argv[i][0] == '-') {
      free(files);
      return tool_usage_error("calib %s: unknown option %s", argv[1], argv[i]);
    } else
      files[n++] = argv[i];
  }
  int rc;
  if (!strcmp(argv[1], "summarize")) {
    rc = n < 1                 ? tool_usage_error("calib summarize: STATS missing")
         : histograms && !json ? tool_usage_error("calib summarize: --histograms needs --json")
                               : summarize(files, n, json, histograms);
  } else if (!strcmp(argv[1], "merge") || !strcmp(argv[1], "envelope")) {
    const int ranks = !strcmp(argv[1], "merge");
    if (json || histograms)
      rc = tool_usage_error("calib %s does not take %s (calib summarize does)", argv[1],
                            json ? "--json" : "--histograms");
    else if (n < 2)
      rc = tool_usage_error("calib %s: OUT and at least one STATS needed", argv[1]);
    else
      rc = merge_to(files + 1, n - 1, files[0],
                    ranks ? QSAKV_CALIB_MERGE_RANKS : QSAKV_CALIB_MERGE_ENVELOPE);
  } else {
    rc = tool_usage_error("unknown verb \"calib %s\" (verbs: summarize, merge, envelope)", argv[1]);
  }
  free(files);
  return rc;
}

static int overlay_make(int argc, char** argv) {
  char** stats = calloc((size_t)argc, sizeof *stats);
  if (!stats) return tool_usage_error("out of memory");
  int n = 0, in_stats = 0, tp = -1, spec = -1, min_sm = 0, rc = -1; /* tp -1: the stats' */
  const char *base_index = NULL, *out_dir = NULL, *act = NULL, *prefix = NULL;
  int options_done = 0; /* after "--": OUT_DIR and statistics files only */
  for (int i = 2; i < argc && rc < 0; ++i) {
    const char* o = argv[i];
    const int has_value = i + 1 < argc;
    if (!options_done && !strcmp(o, "--")) {
      options_done = 1;
      continue;
    }
    if (!options_done && !strcmp(o, "--stats")) {
      in_stats = 1;
      continue;
    }
    if (!options_done && o[0] == '-') {
      in_stats = 0;
      const int known = !strcmp(o, "--base-index") || !strcmp(o, "--act") ||
                        !strcmp(o, "--prefix") || !strcmp(o, "--tp") || !strcmp(o, "--spec") ||
                        !strcmp(o, "--min-sm");
      if (!known)
        rc = tool_usage_error("overlay make: unknown option %s", o);
      else if (!has_value)
        rc = tool_usage_error("overlay make: %s needs a value", o);
      else if (!strcmp(o, "--base-index"))
        base_index = argv[++i];
      else if (!strcmp(o, "--act"))
        act = argv[++i];
      else if (!strcmp(o, "--prefix"))
        prefix = argv[++i];
      else if (!strcmp(o, "--tp") || !strcmp(o, "--spec") || !strcmp(o, "--min-sm")) {
        int* dst = !strcmp(o, "--tp") ? &tp : !strcmp(o, "--spec") ? &spec : &min_sm;
        if (tool_parse_int(argv[++i], dst))
          rc = tool_usage_error("%s: not an integer: %s", o, argv[i]);
        else if (dst == &tp && (tp < 0 || tp > QSAKV_TOOL_MAX_TP))
          rc = tool_usage_error("--tp: 0 (any) or a TP size, 1 to %d, not %d", QSAKV_TOOL_MAX_TP,
                                tp);
      }
    } else if (in_stats) {
      stats[n++] = argv[i];
    } else if (!out_dir) {
      out_dir = o;
    } else {
      rc = tool_usage_error("unexpected argument %s", o);
    }
  }
  /* Usage errors before any file is read, so that a bad load never hides one. */
  qsakv_dtype act_dtype = QSAKV_DTYPE_INVALID;
  if (rc < 0 && (spec < -1 || spec > QSAKV_TOOL_MAX_SPEC))
    rc = tool_usage_error("--spec: -1 (any) or 0 to %d speculative tokens, not %d",
                          QSAKV_TOOL_MAX_SPEC, spec);
  if (rc < 0 && (min_sm < 0 || min_sm > QSAKV_TOOL_MAX_MIN_SM))
    rc = tool_usage_error("--min-sm: 0 (any) or an SM, 1 to %d (70: SM 7.0), not %d",
                          QSAKV_TOOL_MAX_MIN_SM, min_sm);
  if (rc < 0 && act &&
      tool_parse_dtype(act, TOOL_DTYPE_BIT(QSAKV_DTYPE_FP16) | TOOL_DTYPE_BIT(QSAKV_DTYPE_BF16),
                       &act_dtype))
    rc = tool_usage_error("--act must be fp16 or bf16, not %s", act);
  if (rc < 0 && prefix) rc = tool_check_layer_prefix(prefix);
  if (rc < 0 && n == 0) rc = tool_usage_error("overlay make: --stats STATS... is required");
  if (rc < 0 && !base_index) rc = tool_usage_error("overlay make: --base-index PATH is required");
  if (rc < 0 && !out_dir) rc = tool_usage_error("overlay make: OUT_DIR missing");
  qsakv_calib* c = NULL;
  if (rc < 0) rc = load_merged(stats, n, &c);
  free(stats);
  if (rc >= 0) return rc;
  /* Unset (0, INVALID), the TP size and activation dtype are the statistics'
   * (qsakv_calib_write_overlay); the library's "no TP constraint" is -1. */
  qsakv_overlay_write_options wo;
  qsakv_overlay_write_options_init(&wo);
  wo.base_index_path = base_index;
  wo.layer_prefix = prefix;
  wo.contract_tp_size = tp < 0 ? 0 : tp == 0 ? -1 : tp;
  wo.contract_speculative_tokens = spec;
  wo.contract_min_sm = min_sm;
  if (act) wo.contract_activation_dtype = act_dtype;
  qsakv_status s = qsakv_calib_write_overlay(c, out_dir, &wo);
  qsakv_calib_destroy(c);
  if (s != QSAKV_SUCCESS) return tool_refused(s);
  /* The revision the pack was bound to, from the pack itself: hashing the base index
   * again could print another one (or fail) if the index changed meanwhile. */
  qsakv_overlay* o = NULL;
  qsakv_overlay_info info;
  memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  info.version = QSAKV_OVERLAY_INFO_VERSION;
  s = qsakv_overlay_load(&o, out_dir, NULL);
  if (s == QSAKV_SUCCESS) s = qsakv_overlay_get_info(o, &info);
  qsakv_overlay_destroy(o);
  if (s != QSAKV_SUCCESS) return tool_refused(s);
  printf("wrote scale pack %s for base revision %s\n", out_dir, info.base_index_sha256);
  return QSAKV_EXIT_OK;
}

static int overlay_materialize(int argc, char** argv) {
  /* The three paths, in order; from a "--" on (one, anywhere) whatever they start with. */
  const char* paths[3];
  int n = 0, options_done = 0;
  for (int i = 2; i < argc; ++i) {
    if (!options_done && !strcmp(argv[i], "--")) {
      options_done = 1;
      continue;
    }
    if (!options_done && argv[i][0] == '-')
      return tool_usage_error("overlay materialize takes no options (got %s)", argv[i]);
    if (n == 3) return tool_usage_error("overlay materialize: unexpected argument %s", argv[i]);
    paths[n++] = argv[i];
  }
  if (n != 3)
    return tool_usage_error(
        "overlay materialize: BASE_DIR SCALE_PACK OUT_DIR expected, got %d argument(s)", n);
  const char *base_dir = paths[0], *pack = paths[1], *out_dir = paths[2];
  /* qsakv_overlay_materialize compares the base index hash with the manifest before it
   * creates anything. */
  qsakv_status s = qsakv_overlay_materialize(out_dir, base_dir, pack);
  if (s != QSAKV_SUCCESS) return tool_refused(s);
  /* The revision the new checkpoint holds (its provenance's base, hashed now). */
  char rev[65];
  s = qsakv_checkpoint_revision(out_dir, rev);
  if (s != QSAKV_SUCCESS) return tool_refused(s);
  printf("materialised %s from %s (base revision %s) and %s\n", out_dir, base_dir, rev, pack);
  return QSAKV_EXIT_OK;
}

int cmd_overlay_build(int argc, char** argv) {
  if (!strcmp(argv[1], "make")) return overlay_make(argc, argv);
  return overlay_materialize(argc, argv);
}
