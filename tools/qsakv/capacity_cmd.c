// SPDX-License-Identifier: Apache-2.0
/* qsakv capacity: the capacity table of a config and a memory budget. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"

const char kCapacityUsage[] =
    "usage: qsakv capacity [--preset qwen4_exp | --checkpoint CKPT] [--tp N]\n"
    "                      [--kv e4m3|fp16|bf16] [--act fp16|bf16] [--index-keys fp16|e4m3]\n"
    "                      [--budget-gib X] [--json]\n"
    "\n"
    "Bytes per token per rank (all QSA layers), fixed costs (index-key rings, the\n"
    "shared top-k workspace and what one buffer per layer would cost), and the blocks\n"
    "and tokens that fit in X GiB (default 64) per rank, against a 16-bit cache with\n"
    "FP16 index keys.\n"
    "--tp: the TP size, 1..65536 (default 1).\n"
    "--kv: the main K/V cache (default e4m3). --act: the activation dtype (Q, K, V);\n"
    "  default: --kv's when --kv is fp16 or bf16 (a 16-bit cache stores the activation\n"
    "  type, so --kv bf16 alone means bf16 activations), else fp16; a 16-bit --kv with\n"
    "  the other --act is refused (exit 2).\n"
    "--index-keys: the compressed index keys (index_key_dtype; default fp16; e4m3: E4M3\n"
    "  codes with one FP32 scale per key).\n"
    "The model: the preset (default qwen4_exp) or --checkpoint CKPT (a checkpoint\n"
    "directory or its config.json, read as by qsakv_model_config_from_checkpoint).\n"
    "--json prints one JSON object.\n"
    "\n" QSAKV_EXIT_CODES_TEXT;

static void print_json(const char* model, const qsakv_model_config* c, const qsakv_capacity* k,
                       double gib) {
  printf("{\"model\": ");
  tool_json_string(stdout, model);
  printf(
      ", \"num_qsa_layers\": %d, \"tp_size\": %d, \"kv_dtype\": \"%s\", "
      "\"activation_dtype\": \"%s\", \"index_key_dtype\": \"%s\", \"budget_gib\": %.17g, "
      "\"budget_bytes\": %llu, "
      "\"block_size\": %d,\n \"main_bytes_per_token\": %llu, "
      "\"compressed_bytes_per_token\": %llu, \"bytes_per_token\": %llu, "
      "\"fp16_bytes_per_token\": %llu,\n \"ring_bytes\": %llu, "
      "\"ring_bytes_per_request\": %llu, \"topk_bytes\": %llu, \"topk_bytes_unshared\": %llu,\n"
      " \"num_blocks\": %lld, \"num_tokens\": %lld, \"fp16_num_tokens\": %lld, "
      "\"bytes_per_block\": %llu, \"capacity_ratio\": %.17g, \"ideal_ratio\": %.17g}\n",
      c->num_qsa_layers, c->tp_size, qsakv_dtype_name(c->kv_dtype),
      qsakv_dtype_name(c->activation_dtype), qsakv_dtype_name(c->index_key_dtype), gib,
      (unsigned long long)k->budget_bytes, c->block_size,
      (unsigned long long)k->main_bytes_per_token,
      (unsigned long long)k->compressed_bytes_per_token, (unsigned long long)k->bytes_per_token,
      (unsigned long long)k->fp16_bytes_per_token, (unsigned long long)k->ring_bytes,
      (unsigned long long)k->ring_bytes_per_request, (unsigned long long)k->topk_bytes,
      (unsigned long long)k->topk_bytes_unshared, (long long)k->num_blocks,
      (long long)k->num_tokens, (long long)k->fp16_num_tokens,
      (unsigned long long)k->bytes_per_block, k->capacity_ratio, k->ideal_ratio);
}

static double mib(uint64_t b) { return (double)b / (1024.0 * 1024.0); }

static void print_text(const char* preset, const qsakv_model_config* c, const qsakv_capacity* k,
                       double gib) {
  printf(
      "%s, TP%d, %s KV, %s activations, %s index keys, block size %d, budget %.3g GiB per "
      "rank\n\n",
      preset, c->tp_size, qsakv_dtype_name(c->kv_dtype), qsakv_dtype_name(c->activation_dtype),
      qsakv_dtype_name(c->index_key_dtype), c->block_size, gib);
  printf("per token, per rank, all %d QSA layers\n", c->num_qsa_layers);
  printf("  main K/V                 %10llu B\n", (unsigned long long)k->main_bytes_per_token);
  printf("  compressed index keys    %10llu B\n",
         (unsigned long long)k->compressed_bytes_per_token);
  printf("  total                    %10llu B   (16-bit cache, FP16 keys: %llu B)\n",
         (unsigned long long)k->bytes_per_token, (unsigned long long)k->fp16_bytes_per_token);
  printf("fixed costs\n");
  printf("  index-key rings          %10.1f MiB (%llu B per request)\n", mib(k->ring_bytes),
         (unsigned long long)k->ring_bytes_per_request);
  printf("  top-k workspace, shared  %10.1f MiB (one per layer: %.1f MiB)\n", mib(k->topk_bytes),
         mib(k->topk_bytes_unshared));
  printf("capacity\n");
  printf("  blocks                   %10lld (%llu B each)\n", (long long)k->num_blocks,
         (unsigned long long)k->bytes_per_block);
  printf("  tokens                   %10lld (16-bit cache: %lld)\n", (long long)k->num_tokens,
         (long long)k->fp16_num_tokens);
  printf("  ratio                    %10.4f (ideal %.4f)\n", k->capacity_ratio, k->ideal_ratio);
}

int cmd_capacity(int argc, char** argv) {
  const char* preset = NULL;
  const char* checkpoint = NULL;
  const char* kv = "e4m3";
  const char* act = NULL; /* NULL: --kv's when 16-bit, else fp16 */
  const char* index_keys = "fp16";
  int tp = 1, json = 0;
  double gib = 64.0;
  for (int i = 1; i < argc; ++i) {
    const char* o = argv[i];
    if (!strcmp(o, "--json")) {
      json = 1;
      continue;
    }
    if (o[0] != '-') return tool_usage_error("capacity: unexpected argument %s", o);
    if (strcmp(o, "--preset") && strcmp(o, "--checkpoint") && strcmp(o, "--kv") &&
        strcmp(o, "--act") && strcmp(o, "--index-keys") && strcmp(o, "--tp") &&
        strcmp(o, "--budget-gib"))
      return tool_usage_error("capacity: unknown option %s", o);
    if (i + 1 >= argc) return tool_usage_error("capacity: %s needs a value", o);
    const char* v = argv[++i];
    if (!strcmp(o, "--preset"))
      preset = v;
    else if (!strcmp(o, "--checkpoint"))
      checkpoint = v;
    else if (!strcmp(o, "--kv"))
      kv = v;
    else if (!strcmp(o, "--act"))
      act = v;
    else if (!strcmp(o, "--index-keys"))
      index_keys = v;
    else if (!strcmp(o, "--tp")) {
      if (tool_parse_int(v, &tp)) return tool_usage_error("--tp: not an integer: %s", v);
      if (tp < 1 || tp > QSAKV_TOOL_MAX_TP)
        return tool_usage_error("--tp: a TP size, 1 to %d, not %d", QSAKV_TOOL_MAX_TP, tp);
    } else if (!strcmp(o, "--budget-gib")) {
      char* end = NULL;
      gib = strtod(v, &end);
      if (!*v || *end || !(gib > 0) || gib > 1e9)
        return tool_usage_error("--budget-gib: a positive number of GiB, not %s", v);
    } else {
      return tool_usage_error("unknown option %s", o);
    }
  }
  if (preset && checkpoint)
    return tool_usage_error("capacity: --preset and --checkpoint exclude each other");
  const int bad_preset = preset ? tool_check_preset(preset) : -1;
  if (bad_preset >= 0) return bad_preset;
  /* Every value checked before the model is read: a usage error is never hidden. */
  qsakv_dtype kv_dtype, act_dtype, index_key_dtype;
  const unsigned sixteen_bit = TOOL_DTYPE_BIT(QSAKV_DTYPE_FP16) | TOOL_DTYPE_BIT(QSAKV_DTYPE_BF16);
  if (tool_parse_dtype(kv, sixteen_bit | TOOL_DTYPE_BIT(QSAKV_DTYPE_E4M3), &kv_dtype))
    return tool_usage_error("--kv must be e4m3, fp16 or bf16, not %s", kv);
  if (!act)
    act_dtype = kv_dtype == QSAKV_DTYPE_E4M3 ? QSAKV_DTYPE_FP16 : kv_dtype;
  else if (tool_parse_dtype(act, sixteen_bit, &act_dtype))
    return tool_usage_error("--act must be fp16 or bf16, not %s", act);
  if (kv_dtype != QSAKV_DTYPE_E4M3 && kv_dtype != act_dtype)
    return tool_usage_error(
        "--kv %s with --act %s: a 16-bit cache stores the activation type (give the same "
        "dtype to both, or leave --act out)",
        kv, act);
  if (tool_parse_dtype(index_keys,
                       TOOL_DTYPE_BIT(QSAKV_DTYPE_FP16) | TOOL_DTYPE_BIT(QSAKV_DTYPE_E4M3),
                       &index_key_dtype))
    return tool_usage_error("--index-keys must be fp16 or e4m3, not %s", index_keys);
  const char* model = checkpoint ? checkpoint : preset ? preset : "qwen4_exp";
  qsakv_model_config c;
  qsakv_status s = checkpoint ? qsakv_model_config_from_checkpoint(&c, checkpoint)
                              : qsakv_model_config_preset(&c, model);
  if (s != QSAKV_SUCCESS) return tool_refused(s);
  c.tp_size = tp;
  c.kv_dtype = kv_dtype;
  c.activation_dtype = act_dtype;
  c.index_key_dtype = index_key_dtype;
  qsakv_capacity k;
  memset(&k, 0, sizeof k);
  k.struct_size = sizeof k;
  k.version = QSAKV_CAPACITY_VERSION;
  s = qsakv_capacity_plan(&c, (uint64_t)(gib * 1073741824.0), &k);
  if (s != QSAKV_SUCCESS) return tool_refused(s);
  if (json)
    print_json(model, &c, &k, gib);
  else
    print_text(model, &c, &k, gib);
  return QSAKV_EXIT_OK;
}
