// SPDX-License-Identifier: Apache-2.0
/* An out-of-tree C consumer of an installed libqsakv (tests/packaging/check_install.cmake
 * builds it with pkg-config flags): the installed header's version equals the loaded
 * library's, and a CPU context and a capacity plan work. Prints "consumer ok". */
#include <stdio.h>
#include <string.h>

#include <qsakv.h>

int main(void) {
  if (qsakv_version() != QSAKV_VERSION_NUMBER || qsakv_abi_version() != QSAKV_ABI_VERSION) {
    fprintf(stderr, "header %d/%d, library %d/%d\n", QSAKV_VERSION_NUMBER, QSAKV_ABI_VERSION,
            qsakv_version(), qsakv_abi_version());
    return 1;
  }
  qsakv_context_options o;
  qsakv_context* ctx = NULL;
  qsakv_model_config cfg;
  qsakv_capacity cap;
  if (qsakv_context_options_init(&o) != QSAKV_SUCCESS) return 2;
  o.backend = QSAKV_BACKEND_CPU;
  if (qsakv_context_create(&ctx, &o) != QSAKV_SUCCESS) {
    fprintf(stderr, "context: %s\n", qsakv_last_error());
    return 3;
  }
  if (qsakv_model_config_preset(&cfg, "qwen4_exp") != QSAKV_SUCCESS) return 4;
  cfg.tp_size = 4;
  memset(&cap, 0, sizeof cap);
  cap.struct_size = sizeof cap;
  cap.version = QSAKV_CAPACITY_VERSION;
  if (qsakv_capacity_plan(&cfg, 40ull << 30, &cap) != QSAKV_SUCCESS || cap.num_tokens <= 0) {
    fprintf(stderr, "capacity: %s\n", qsakv_last_error());
    return 5;
  }
  qsakv_context_destroy(ctx);
  printf("consumer ok: libqsakv %s, %lld tokens in 40 GiB at TP4\n", qsakv_version_string(),
         (long long)cap.num_tokens);
  return 0;
}
