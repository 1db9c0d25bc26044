/* SPDX-License-Identifier: Apache-2.0 */
/* kernel_trace.h on CUPTI's activity API (QSAKV_BENCH_CUPTI), or the stubs. */
#include "kernel_trace.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#ifdef QSAKV_BENCH_CUPTI
#include <cupti.h>

enum { kMaxKernels = 8192, kBufferBytes = 8 << 20 };
typedef struct {
  uint64_t start, end;
  int grid[3], block[3];
  char name[96];
} traced_kernel;
static traced_kernel g_kernels[kMaxKernels];
static int g_count = 0, g_dropped = 0;

#define CUPTI_CHECK(call)                                                           \
  do {                                                                              \
    CUptiResult r_ = (call);                                                        \
    if (r_ != CUPTI_SUCCESS) {                                                      \
      const char* m_ = NULL;                                                        \
      cuptiGetResultString(r_, &m_);                                                \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, m_ ? m_ : "?"); \
      exit(1);                                                                      \
    }                                                                               \
  } while (0)

/* "_ZN5qsakv4cuda30select_score_rows_wgmma_kernelILb1EEEv..." -> the name after the
 * namespaces, with its template arguments' mangling dropped ("...<>" marks that it had
 * some); other names as they are, cut to fit. */
static void short_name(const char* mangled, char* out, size_t cap) {
  const char* p = mangled ? strstr(mangled, "4cuda") : NULL;
  if (p) {
    p += 5;
    char* end = NULL;
    const long n = strtol(p, &end, 10);
    if (n > 0 && end && (size_t)n < cap - 3) {
      memcpy(out, end, (size_t)n);
      out[n] = '\0';
      if (end[n] == 'I') strcat(out, "<>");
      return;
    }
  }
  snprintf(out, cap, "%s", mangled ? mangled : "?");
}

static void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = malloc(kBufferBytes); /* 16-byte aligned: CUPTI needs 8 */
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t* buffer, size_t size,
                                      size_t valid) {
  (void)ctx, (void)stream, (void)size;
  CUpti_Activity* rec = NULL;
  while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
    const CUpti_ActivityKernel10* k = (const CUpti_ActivityKernel10*)rec;
    if (g_count == kMaxKernels) {
      ++g_dropped;
      continue;
    }
    traced_kernel* t = &g_kernels[g_count++];
    t->start = k->start;
    t->end = k->end;
    t->grid[0] = k->gridX, t->grid[1] = k->gridY, t->grid[2] = k->gridZ;
    t->block[0] = k->blockX, t->block[1] = k->blockY, t->block[2] = k->blockZ;
    short_name(k->name, t->name, sizeof t->name);
  }
  free(buffer);
}

int kernel_trace_available(void) { return 1; }

void kernel_trace_begin(void) {
  static int registered = 0;
  if (!registered) {
    CUPTI_CHECK(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed));
    registered = 1;
  }
  g_count = g_dropped = 0;
  CUPTI_CHECK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
}

static int by_start(const void* a, const void* b) {
  const uint64_t x = ((const traced_kernel*)a)->start, y = ((const traced_kernel*)b)->start;
  return (x > y) - (x < y);
}

void kernel_trace_end(FILE* out, const char* label) {
  if (cudaDeviceSynchronize() != cudaSuccess) {
    fprintf(stderr, "kernel_trace_end: cudaDeviceSynchronize failed\n");
    exit(1);
  }
  CUPTI_CHECK(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED));
  CUPTI_CHECK(cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
  qsort(g_kernels, (size_t)g_count, sizeof g_kernels[0], by_start);
  fprintf(out, "\nkernel trace: %s (%d kernels%s)\n", label, g_count,
          g_dropped ? ", some dropped" : "");
  fprintf(out, "  %-40s %16s %9s %10s %10s %9s %9s\n", "kernel", "grid", "block", "start us",
          "end us", "dur us", "gap us");
  const uint64_t t0 = g_count ? g_kernels[0].start : 0;
  uint64_t prev_end = t0;
  for (int i = 0; i < g_count; ++i) {
    const traced_kernel* k = &g_kernels[i];
    char grid[32], block[16];
    snprintf(grid, sizeof grid, "%dx%dx%d", k->grid[0], k->grid[1], k->grid[2]);
    snprintf(block, sizeof block, "%d", k->block[0] * k->block[1] * k->block[2]);
    fprintf(out, "  %-40s %16s %9s %10.2f %10.2f %9.2f %9.2f\n", k->name, grid, block,
            (double)(k->start - t0) * 1e-3, (double)(k->end - t0) * 1e-3,
            (double)(k->end - k->start) * 1e-3,
            i ? ((double)k->start - (double)prev_end) * 1e-3 : 0.0);
    if (k->end > prev_end) prev_end = k->end;
  }
}

#else /* built without CUPTI */

int kernel_trace_available(void) { return 0; }
void kernel_trace_begin(void) {}
void kernel_trace_end(FILE* out, const char* label) {
  fprintf(out, "\nkernel trace: %s: this bench was built without CUPTI\n", label);
}

#endif
