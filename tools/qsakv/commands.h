/* The qsakv command-line tool: one function per area, each in its own file
 * (overlay_cmd.c, ...), dispatched by main.c. A client of include/qsakv.h only. */
#ifndef QSAKV_TOOL_COMMANDS_H
#define QSAKV_TOOL_COMMANDS_H

#include <stdio.h>

#include "qsakv.h"

/* Exit codes (documented in `qsakv --help`). */
#define QSAKV_EXIT_OK 0      /* success; for verify: the overlay is valid */
#define QSAKV_EXIT_REFUSED 1 /* the library refused: status name and message on stderr */
#define QSAKV_EXIT_USAGE 2   /* bad command line */

/* The closing paragraph of every usage text. */
#define QSAKV_EXIT_CODES_TEXT                                                             \
  "exit codes: 0 success; 1 the library refused (status name and message on stderr), a\n" \
  "file changed while it was read, or the output could not be written; 2 bad command\n"   \
  "line, including a value that no run can have whatever the files and the model (a\n"    \
  "number outside its range, a --revision that is not 64 hex digits, an unknown name);\n" \
  "a value in range that this model or these files refuse is the library's refusal, 1.\n"

/* The largest values any run can have: the header's limits (qsakv_overlay_write_options:
 * a contract's tp_size 1..65536, speculative_tokens 0..64, min_sm 1..10000; a model
 * config's speculative_tokens 0..64). */
#define QSAKV_TOOL_MAX_TP 65536
#define QSAKV_TOOL_MAX_SPEC 64
#define QSAKV_TOOL_MAX_MIN_SM 10000

/* Each area's usage (all its verbs): printed by `qsakv <area> [<verb> ...] --help`. */
extern const char kOverlayUsage[];
extern const char kCalibUsage[];
extern const char kCapacityUsage[];

/* Each area: argv[0] is the area name; returns an exit code. --help never reaches it
 * (main.c answers it for every area and verb). */
int cmd_overlay(int argc, char** argv);
int cmd_calib(int argc, char** argv);
int cmd_capacity(int argc, char** argv);
/* `overlay make` and `overlay materialize` (calib_cmd.c), called by cmd_overlay:
 * argv[0] is "overlay". */
int cmd_overlay_build(int argc, char** argv);

/* Shared helpers (main.c). */
/* Prints "STATUS_NAME: message" on stderr and returns QSAKV_EXIT_REFUSED. */
int tool_refused(qsakv_status status);
/* Prints "qsakv: message" on stderr and returns QSAKV_EXIT_USAGE. */
int tool_usage_error(const char* fmt, ...);
/* Writes s as a JSON string literal (quoted, escaped; a byte that is not part of
 * well-formed UTF-8 is written as U+FFFD, so the output stays valid JSON). */
void tool_json_string(FILE* f, const char* s);
/* Parses a decimal int: digits with an optional leading '-', nothing else; 0 on success. */
int tool_parse_int(const char* s, int* out);
/* The dtype that qsakv_dtype_name calls s, if it is e4m3, fp16 or bf16 and in `allowed`
 * (a mask of TOOL_DTYPE_BIT(QSAKV_DTYPE_*)); 0 on success, -1 for any other name. */
int tool_parse_dtype(const char* s, unsigned allowed, qsakv_dtype* out);
#define TOOL_DTYPE_BIT(d) (1u << (unsigned)(d))
/* Usage checks of values that no run can have (each returns -1 when the value is good,
 * else QSAKV_EXIT_USAGE after saying why): */
/* --revision: a SHA-256, 64 hex digits of either case. */
int tool_check_revision(const char* revision);
/* --preset: a name the library knows (asked of qsakv_model_config_preset). */
int tool_check_preset(const char* preset);
/* --prefix: a dotted name, as the library takes it (1..127 of [A-Za-z0-9_.-], no '.' at
 * either end, no two in a row). */
int tool_check_layer_prefix(const char* prefix);
/* Refuses (exit 2) a file given twice in paths[0..n) (the same file by device and inode,
 * whatever the spelling): merging a file with itself counts its runs twice. Returns -1
 * when each file is given once, else the exit code. */
int tool_refuse_repeated_files(char** paths, int n, const char* what);

#endif
