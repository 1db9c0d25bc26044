/* The qsakv command-line tool: one function per area, each in its own file
 * (overlay_cmd.c, ...), dispatched by main.c. A client of include/qsakv.h only. */
#ifndef QSAKV_TOOL_COMMANDS_H
#define QSAKV_TOOL_COMMANDS_H

#include "qsakv.h"

/* Exit codes (documented in `qsakv --help`). */
#define QSAKV_EXIT_OK 0      /* success; for verify: the overlay is valid */
#define QSAKV_EXIT_REFUSED 1 /* the library refused: status name and message on stderr */
#define QSAKV_EXIT_USAGE 2   /* bad command line */

/* Each area: argv[0] is the area name; returns an exit code. */
int cmd_overlay(int argc, char** argv);
int cmd_calib(int argc, char** argv);
int cmd_capacity(int argc, char** argv);
/* `overlay make` and `overlay materialize` (calib_cmd.c): argv[0] is "overlay". */
int cmd_overlay_build(int argc, char** argv);

/* Shared helpers (main.c). */
/* Prints "STATUS_NAME: message" on stderr and returns QSAKV_EXIT_REFUSED. */
int tool_refused(qsakv_status status);
/* Prints "qsakv: message" on stderr and returns QSAKV_EXIT_USAGE. */
int tool_usage_error(const char* fmt, ...);
/* Parses a decimal int; 0 on success. */
int tool_parse_int(const char* s, int* out);

#endif
