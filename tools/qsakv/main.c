// SPDX-License-Identifier: Apache-2.0
/* qsakv: command-line tool for libqsakv. `qsakv <area> <verb> ...`. */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "commands.h"

static const char kUsage[] =
    "usage: qsakv <area> <verb> [options]\n"
    "       qsakv --help | --version\n"
    "\n"
    "areas:\n"
    "  overlay inspect DIR|FILE [--manifest M] [--json]\n"
    "        show an overlay's scales, revision hashes and contract (a bare scale file\n"
    "        without a manifest: its scales, and that nothing binds it)\n"
    "  overlay verify DIR|FILE [--revision SHA] [--manifest M]\n"
    "        [--preset qwen4_exp | --checkpoint CKPT] [--tp N] [--rank R] [--spec N]\n"
    "        [--act fp16|bf16] [--json]\n"
    "        validate an overlay against a model config and base revision\n"
    "  overlay make --stats STATS... --base-index PATH OUT_DIR [--tp N ...]\n"
    "        write a scale pack from calibration statistics\n"
    "  overlay materialize BASE_DIR SCALE_PACK OUT_DIR\n"
    "        build a calibrated checkpoint directory (checks the base revision first)\n"
    "  calib summarize STATS... [--json [--histograms]] | merge OUT STATS...\n"
    "        | envelope OUT STATS...\n"
    "        report, merge (TP ranks) or envelope (runs) calibration statistics\n"
    "  capacity [--preset qwen4_exp | --checkpoint CKPT] [--tp N] [--kv e4m3|fp16|bf16]\n"
    "        [--act fp16|bf16] [--index-keys fp16|e4m3] [--budget-gib X] [--json]\n"
    "        the capacity table\n"
    "\n"
    "`qsakv <area> --help` and `qsakv <area> <verb> --help` describe an area and its\n"
    "verbs. An option a verb does not take is refused. --json prints one JSON object.\n"
    "After `--` every argument is a path (one that starts with '-', say).\n"
    "\n"
    "exit codes:\n"
    "  0  success (verify: the overlay is valid for the config and revision)\n"
    "  1  the library refused: the status name (e.g. QSAKV_ERROR_OVERLAY_INCOMPLETE)\n"
    "     and the library's message are printed on stderr; or a file changed while it\n"
    "     was read; or the output could not be written (a full disk, a closed pipe)\n"
    "  2  bad command line: an unknown option, a missing or extra argument, or a value\n"
    "     that no run can have whatever the files and the model: --tp outside 1..65536\n"
    "     (overlay make: 0..65536, 0 = any), --rank outside 0..N-1, --spec outside 0..64\n"
    "     (overlay make: -1..64, -1 = any), --min-sm outside 0..10000, a --revision that\n"
    "     is not 64 hex digits, an unknown --preset or dtype, a --prefix that is not a\n"
    "     dotted name, a non-positive --budget-gib. A value in range that this model or\n"
    "     these files refuse (a --tp that does not divide the model's heads, a --spec\n"
    "     outside the overlay's contract) is the library's refusal: 1.\n";

int tool_refused(qsakv_status status) {
  fprintf(stderr, "%s: %s\n", qsakv_status_string(status), qsakv_last_error());
  return QSAKV_EXIT_REFUSED;
}

int tool_usage_error(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("qsakv: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputs("\n(see qsakv --help)\n", stderr);
  va_end(ap);
  return QSAKV_EXIT_USAGE;
}

/* The length of the well-formed UTF-8 sequence at p (RFC 3629: no overlong forms, no
 * surrogates, nothing above U+10FFFF), or 0 when the byte at p does not start one. */
static int utf8_sequence_length(const unsigned char* p) {
  const unsigned c = p[0];
  if (c < 0x80) return 1;
  int n;
  unsigned lo = 0x80, hi = 0xBF; /* the second byte's range */
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (p[1] < lo || p[1] > hi) return 0;
  for (int i = 2; i < n; ++i)
    if (p[i] < 0x80 || p[i] > 0xBF) return 0;
  return n;
}

void tool_json_string(FILE* f, const char* s) {
  fputc('"', f);
  for (const unsigned char* p = (const unsigned char*)s; *p;) {
    const int n = utf8_sequence_length(p);
    if (n == 0) { /* JSON text is UTF-8: a byte that is not stands as U+FFFD */
      fputs("\\ufffd", f);
      ++p;
    } else if (*p == '"' || *p == '\\') {
      fprintf(f, "\\%c", *p++);
    } else if (*p < 0x20 || *p == 0x7F) {
      fprintf(f, "\\u%04x", *p++);
    } else {
      fwrite(p, 1, (size_t)n, f);
      p += n;
    }
  }
  fputc('"', f);
}

int tool_parse_int(const char* s, int* out) {
  /* Digits with an optional '-': strtol alone would also take leading spaces and '+'. */
  const char* digits = s[0] == '-' ? s + 1 : s;
  if (*digits < '0' || *digits > '9') return -1;
  char* end = NULL;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || *end || v < INT_MIN || v > INT_MAX) return -1;
  *out = (int)v;
  return 0;
}

int tool_check_revision(const char* revision) {
  size_t n = 0;
  while (n < 64 && isxdigit((unsigned char)revision[n])) ++n;
  if (n == 64 && revision[64] == '\0') return -1;
  return tool_usage_error(
      "--revision: a SHA-256, 64 hex digits (of the base checkpoint's "
      "model.safetensors.index.json), not %.100s",
      revision);
}

int tool_parse_dtype(const char* s, unsigned allowed, qsakv_dtype* out) {
  /* The library's own names (qsakv_dtype_name), so that the tool and the header agree. */
  static const qsakv_dtype kNamed[] = {QSAKV_DTYPE_E4M3, QSAKV_DTYPE_FP16, QSAKV_DTYPE_BF16};
  for (size_t i = 0; i < sizeof kNamed / sizeof kNamed[0]; ++i)
    if ((allowed & TOOL_DTYPE_BIT(kNamed[i])) && !strcmp(s, qsakv_dtype_name(kNamed[i]))) {
      *out = kNamed[i];
      return 0;
    }
  return -1;
}

int tool_check_preset(const char* preset) {
  qsakv_model_config c;
  const qsakv_status s = qsakv_model_config_preset(&c, preset);
  if (s == QSAKV_SUCCESS) return -1;
  if (s == QSAKV_ERROR_INVALID_ARGUMENT)
    return tool_usage_error("--preset: %s", qsakv_last_error());
  return tool_refused(s);
}

int tool_check_layer_prefix(const char* prefix) {
  const size_t n = strlen(prefix);
  int ok = n > 0 && n <= 127 && prefix[0] != '.' && prefix[n - 1] != '.';
  for (size_t i = 0; ok && i < n; ++i) {
    const char c = prefix[i];
    ok = isalnum((unsigned char)c) || c == '_' || c == '-' || (c == '.' && prefix[i + 1] != '.');
  }
  if (ok) return -1;
  return tool_usage_error(
      "--prefix: a dotted name (up to 127 of A-Z a-z 0-9 _ - ., no '.' at either end or "
      "twice in a row; e.g. model.layers), not \"%s\"",
      prefix);
}

int tool_refuse_repeated_files(char** paths, int n, const char* what) {
  for (int i = 0; i < n; ++i) {
    struct stat a;
    if (stat(paths[i], &a) != 0) continue; /* the library names a missing file itself */
    for (int j = 0; j < i; ++j) {
      struct stat b;
      if (stat(paths[j], &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino)
        return tool_usage_error("%s: %s and %s are the same file (each file counts once)", what,
                                paths[j], paths[i]);
    }
  }
  return -1;
}

/* What reached stdout: a write that failed (a full disk, a closed pipe) makes the exit
 * code 1, so that a script never takes a truncated report for a complete one. */
static int finish(int rc) {
  if (fflush(stdout) != 0 || ferror(stdout)) {
    fprintf(stderr, "qsakv: cannot write the output: %s\n", strerror(errno));
    return QSAKV_EXIT_REFUSED;
  }
  return rc;
}

struct area {
  const char* name;
  int (*run)(int argc, char** argv);
  const char* usage;
};

/* New areas (capacity, bench, ...) add a line here and a cmd_<area> in their own file. */
static const struct area kAreas[] = {
    {"overlay", cmd_overlay, kOverlayUsage},
    {"calib", cmd_calib, kCalibUsage},
    {"capacity", cmd_capacity, kCapacityUsage},
};

int main(int argc, char** argv) {
  if (argc < 2) {
    fputs(kUsage, stderr);
    return QSAKV_EXIT_USAGE;
  }
  if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
    fputs(kUsage, stdout);
    return finish(QSAKV_EXIT_OK);
  }
  if (!strcmp(argv[1], "--version")) {
    printf("qsakv %s (ABI %d, %s)\n", qsakv_version_string(), qsakv_abi_version(),
           qsakv_built_with_cuda() ? "CUDA" : "CPU only");
    return finish(QSAKV_EXIT_OK);
  }
  for (size_t i = 0; i < sizeof kAreas / sizeof kAreas[0]; ++i) {
    if (strcmp(argv[1], kAreas[i].name)) continue;
    /* --help anywhere after the area (before a "--", after which every argument is a
     * path or a value), for every area and verb alike: the area's usage on stdout, exit
     * 0, nothing else done. */
    for (int j = 2; j < argc && strcmp(argv[j], "--"); ++j)
      if (!strcmp(argv[j], "--help") || !strcmp(argv[j], "-h")) {
        fputs(kAreas[i].usage, stdout);
        return finish(QSAKV_EXIT_OK);
      }
    return finish(kAreas[i].run(argc - 1, argv + 1));
  }
  return tool_usage_error("unknown area \"%s\" (areas: overlay, calib, capacity)", argv[1]);
}
