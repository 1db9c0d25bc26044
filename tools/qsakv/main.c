// SPDX-License-Identifier: Apache-2.0
/* qsakv: command-line tool for libqsakv. `qsakv <area> <verb> ...`. */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"

static const char kUsage[] =
    "usage: qsakv <area> <verb> [options]\n"
    "       qsakv --help | --version\n"
    "\n"
    "areas:\n"
    "  overlay inspect DIR|FILE [--manifest M] [--json]\n"
    "        show an overlay's scales, revision hashes and contract (a bare scale file\n"
    "        without a manifest: its scales, and that nothing binds it)\n"
    "  overlay verify DIR|FILE --revision SHA [--manifest M]\n"
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
    "        [--index-keys fp16|e4m3] [--budget-gib X] [--json]   the capacity table\n"
    "\n"
    "`qsakv <area> --help` and `qsakv <area> <verb> --help` describe an area and its\n"
    "verbs. An option a verb does not take is refused. --json prints one JSON object.\n"
    "\n"
    "exit codes:\n"
    "  0  success (verify: the overlay is valid for the config and revision)\n"
    "  1  the library refused: the status name (e.g. QSAKV_ERROR_OVERLAY_INCOMPLETE)\n"
    "     and the library's message are printed on stderr\n"
    "  2  bad command line\n";

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

void tool_json_string(FILE* f, const char* s) {
  fputc('"', f);
  for (const unsigned char* p = (const unsigned char*)s; *p; ++p) {
    if (*p == '"' || *p == '\\')
      fprintf(f, "\\%c", *p);
    else if (*p < 0x20)
      fprintf(f, "\\u%04x", *p);
    else
      fputc(*p, f);
  }
  fputc('"', f);
}

int tool_parse_int(const char* s, int* out) {
  char* end = NULL;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || !*s || *end || v < INT_MIN || v > INT_MAX) return -1;
  *out = (int)v;
  return 0;
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
    return QSAKV_EXIT_OK;
  }
  if (!strcmp(argv[1], "--version")) {
    printf("qsakv %s (ABI %d, %s)\n", qsakv_version_string(), qsakv_abi_version(),
           qsakv_built_with_cuda() ? "CUDA" : "CPU only");
    return QSAKV_EXIT_OK;
  }
  for (size_t i = 0; i < sizeof kAreas / sizeof kAreas[0]; ++i) {
    if (strcmp(argv[1], kAreas[i].name)) continue;
    /* --help anywhere after the area, for every area and verb alike: the area's usage
     * on stdout, exit 0, nothing else done. */
    for (int j = 2; j < argc; ++j)
      if (!strcmp(argv[j], "--help") || !strcmp(argv[j], "-h")) {
        fputs(kAreas[i].usage, stdout);
        return QSAKV_EXIT_OK;
      }
    return kAreas[i].run(argc - 1, argv + 1);
  }
  return tool_usage_error("unknown area \"%s\" (areas: overlay, calib, capacity)", argv[1]);
}
