/* SPDX-License-Identifier: Apache-2.0 */
/* The kernels' timeline of one graph replay, through CUPTI's activity records: each
 * kernel's start, end and gap to the one before it (negative: they overlapped, e.g. under
 * programmatic dependent launch). Nsight Systems is not on every GPU machine the bench
 * runs on; CUPTI ships with the CUDA toolkit. Built without CUPTI, the calls say so. */
#ifndef QSAKV_BENCH_KERNEL_TRACE_H
#define QSAKV_BENCH_KERNEL_TRACE_H

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 1 where the bench was built with CUPTI. */
int kernel_trace_available(void);
/* Starts recording the kernels of this process (call after a device synchronisation). */
void kernel_trace_begin(void);
/* Stops (after synchronising the device), then prints the kernels recorded since
 * kernel_trace_begin in start order under `label`: name, grid, block, start and end from
 * the first kernel's start, duration, and gap from the latest end among the kernels
 * before it (negative: it started before they all ended). */
void kernel_trace_end(FILE* out, const char* label);

#ifdef __cplusplus
}
#endif

#endif
