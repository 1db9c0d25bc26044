// SPDX-License-Identifier: Apache-2.0
#include "core/config.hpp"

#include <cmath>
#include <cstring>

#include "core/checked.hpp"
#include "core/dtype.hpp"
#include "core/error.hpp"
#include "core/versioned.hpp"

namespace qsakv {

qsakv_model_config default_model_config() {
  qsakv_model_config o = QSAKV_MODEL_CONFIG_INIT;  // the header's defaults, one definition
  return o;
}

void apply_preset(qsakv_model_config& c, const std::string& name) {
  if (name != "qwen4_exp")
    fail(QSAKV_ERROR_INVALID_ARGUMENT, "unknown preset \"%s\" (known: \"qwen4_exp\")",
         name.c_str());
  c = default_model_config();
  c.num_layers = 48;
  c.num_qsa_layers = 0;
  for (int i = 0; i < c.num_layers; ++i)
    if (i % 4 == 3) c.qsa_layers[c.num_qsa_layers++] = i;
  c.num_q_heads = 24;
  c.num_kv_heads = 2;
  c.head_dim = 256;
  c.softmax_scale = 0.0f;  // 1/sqrt(256) = 1/16
  c.index_num_heads = 4;
  c.index_head_dim = 128;
  c.compress_ratio = 4;
  c.topk_tokens = 2048;
  c.tp_size = 1;
  c.tp_rank = 0;
  c.speculative_tokens = 0;
  c.activation_dtype = QSAKV_DTYPE_FP16;
  c.kv_dtype = QSAKV_DTYPE_E4M3;
  c.block_size = 64;
  c.max_requests = 256;
  c.max_batched_tokens = 8192;
  c.max_model_len = 131072;
}

namespace {
[[noreturn]] void bad(const char* field, const std::string& why) {
  fail(QSAKV_ERROR_INVALID_CONFIG, "model config: %s %s", field, why.c_str());
}
void positive(const char* field, int64_t v) {
  if (v <= 0) bad(field, format("must be > 0, got %lld", static_cast<long long>(v)));
}
// Upper bounds keep every derived size (pages, top-k widths, grids) inside int32.
void at_most(const char* field, int64_t v, int64_t limit) {
  if (v > limit)
    bad(field,
        format("is %lld; at most %lld", static_cast<long long>(v), static_cast<long long>(limit)));
}
}  // namespace

void validate_config(const qsakv_model_config& c) {
  if (c.struct_size < sizeof(size_t) + sizeof(uint32_t))
    bad("struct_size", format("is %zu; call qsakv_model_config_init first", c.struct_size));
  if (c.version == 0 || c.version > QSAKV_MODEL_CONFIG_VERSION)
    bad("version",
        format("is %u; this library knows versions 1..%u", c.version, QSAKV_MODEL_CONFIG_VERSION));
  positive("num_layers", c.num_layers);
  if (c.num_layers > QSAKV_MAX_LAYERS)
    bad("num_layers", format("is %d; at most %d", c.num_layers, QSAKV_MAX_LAYERS));
  positive("num_qsa_layers", c.num_qsa_layers);
  if (c.num_qsa_layers > c.num_layers)
    bad("num_qsa_layers", format("is %d, more than num_layers %d", c.num_qsa_layers, c.num_layers));
  for (int i = 0; i < c.num_qsa_layers; ++i) {
    const int l = c.qsa_layers[i];
    if (l < 0 || l >= c.num_layers)
      bad("qsa_layers", format("[%d] is layer %d, outside 0..%d", i, l, c.num_layers - 1));
    if (i > 0 && l <= c.qsa_layers[i - 1])
      bad("qsa_layers", format("[%d] is layer %d after layer %d; ids must be ascending and "
                               "distinct",
                               i, l, c.qsa_layers[i - 1]));
  }
  positive("num_q_heads", c.num_q_heads);
  positive("num_kv_heads", c.num_kv_heads);
  at_most("num_q_heads", c.num_q_heads, 4096);
  at_most("num_kv_heads", c.num_kv_heads, 4096);
  if (c.num_q_heads % c.num_kv_heads != 0)
    bad("num_q_heads",
        format("%d is not a multiple of num_kv_heads %d", c.num_q_heads, c.num_kv_heads));
  if (c.head_dim != 64 && c.head_dim != 128 && c.head_dim != 256)
    bad("head_dim", format("is %d; supported: 64, 128, 256", c.head_dim));
  if (!(c.softmax_scale >= 0.0f) || std::isinf(c.softmax_scale))
    bad("softmax_scale", format("is %g; must be finite and >= 0 (0 = 1/sqrt(head_dim))",
                                static_cast<double>(c.softmax_scale)));
  positive("index_num_heads", c.index_num_heads);
  at_most("index_num_heads", c.index_num_heads, 64);
  positive("index_head_dim", c.index_head_dim);
  if (c.index_head_dim % 8 != 0 || c.index_head_dim > 1024)
    bad("index_head_dim", format("is %d; must be a multiple of 8 up to 1024", c.index_head_dim));
  positive("compress_ratio", c.compress_ratio);
  at_most("compress_ratio", c.compress_ratio, 1024);
  positive("topk_tokens", c.topk_tokens);
  at_most("topk_tokens", c.topk_tokens, 1 << 20);
  if (c.topk_tokens % c.compress_ratio != 0)
    bad("topk_tokens",
        format("%d is not a multiple of compress_ratio %d", c.topk_tokens, c.compress_ratio));
  positive("tp_size", c.tp_size);
  if (c.tp_rank < 0 || c.tp_rank >= c.tp_size)
    bad("tp_rank",
        format("is %d; must be in 0..%d for tp_size %d", c.tp_rank, c.tp_size - 1, c.tp_size));
  if (c.num_q_heads % c.tp_size != 0)
    bad("tp_size", format("%d does not divide num_q_heads %d", c.tp_size, c.num_q_heads));
  if (c.tp_size <= c.num_kv_heads ? c.num_kv_heads % c.tp_size != 0
                                  : c.tp_size % c.num_kv_heads != 0)
    bad("tp_size",
        format("%d and num_kv_heads %d: one must divide the other", c.tp_size, c.num_kv_heads));
  if (c.speculative_tokens < 0 || c.speculative_tokens > 64)
    bad("speculative_tokens", format("is %d; must be in 0..64", c.speculative_tokens));
  // The caller's enums, read as int32 (any value may arrive; see core/checked.hpp).
  const int32_t act = enum_value(c.activation_dtype), kv = enum_value(c.kv_dtype);
  if (act != QSAKV_DTYPE_FP16 && act != QSAKV_DTYPE_BF16)
    bad("activation_dtype", format("is %s (%d); must be fp16 or bf16", dtype_name(act), act));
  if (kv != QSAKV_DTYPE_E4M3 && kv != QSAKV_DTYPE_FP16 && kv != QSAKV_DTYPE_BF16)
    bad("kv_dtype", format("is %s (%d); must be e4m3, fp16 or bf16", dtype_name(kv), kv));
  if (kv != QSAKV_DTYPE_E4M3 && kv != act)
    bad("kv_dtype", format("is %s but activation_dtype is %s; a 16-bit cache stores the "
                           "activation type",
                           dtype_name(kv), dtype_name(act)));
  positive("block_size", c.block_size);
  if (c.block_size % c.compress_ratio != 0)
    bad("block_size",
        format("%d is not a multiple of compress_ratio %d", c.block_size, c.compress_ratio));
  if (c.block_size > 1024) bad("block_size", format("is %d; at most 1024", c.block_size));
  positive("max_requests", c.max_requests);
  positive("max_batched_tokens", c.max_batched_tokens);
  positive("max_model_len", c.max_model_len);
  at_most("max_requests", c.max_requests, 1 << 20);
  at_most("max_batched_tokens", c.max_batched_tokens, 1 << 20);
  at_most("max_model_len", c.max_model_len, 1 << 30);
  const int32_t ik = enum_value(c.index_key_dtype);
  if (ik != QSAKV_DTYPE_FP16 && ik != QSAKV_DTYPE_E4M3)
    bad("index_key_dtype", format("is %s (%d); must be fp16 or e4m3", dtype_name(ik), ik));
}

qsakv_rank_geometry rank_geometry(const qsakv_model_config& c) {
  validate_config(c);
  auto g = blank_versioned<qsakv_rank_geometry>(QSAKV_RANK_GEOMETRY_VERSION);
  g.q_heads = c.num_q_heads / c.tp_size;
  // KV heads are split across ranks while there are enough, replicated beyond that.
  g.kv_heads = c.tp_size <= c.num_kv_heads ? c.num_kv_heads / c.tp_size : 1;
  g.group_size = g.q_heads / g.kv_heads;
  g.first_q_head = c.tp_rank * g.q_heads;
  g.first_kv_head = c.tp_size <= c.num_kv_heads ? c.tp_rank * g.kv_heads
                                                : c.tp_rank / (c.tp_size / c.num_kv_heads);
  g.topk_blocks = c.topk_tokens / c.compress_ratio;
  g.topk_width = c.topk_tokens + c.compress_ratio - 1;
  const int r = c.compress_ratio;
  g.ring_length = r * ((r + c.speculative_tokens + r - 1) / r);
  g.softmax_scale =
      c.softmax_scale > 0.0f ? c.softmax_scale : 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  return g;
}

int qsa_index(const qsakv_model_config& c, int32_t layer) {
  for (int i = 0; i < c.num_qsa_layers; ++i)
    if (c.qsa_layers[i] == layer) return i;
  return -1;
}

ConfigDifference config_difference(const qsakv_model_config& a, const qsakv_model_config& b) {
  // Field by field (the struct has padding; memcmp would read it), in struct order; the
  // first difference is kept.
  ConfigDifference d;
  const auto note = [&d](const std::string& field, const std::string& x, const std::string& y) {
    if (d.field.empty() && x != y) d = {field, x, y};
  };
  const auto num = [&note](const char* field, int32_t x, int32_t y) {
    note(field, std::to_string(x), std::to_string(y));
  };
  const auto dtype = [&note](const char* field, qsakv_dtype x, qsakv_dtype y) {
    const auto text = [](qsakv_dtype t) {
      const int32_t v = enum_value(t);
      const std::string name = dtype_name(v);
      return name == "invalid" ? format("%d", static_cast<int>(v)) : name;
    };
    note(field, text(x), text(y));
  };
  num("num_layers", a.num_layers, b.num_layers);
  num("num_qsa_layers", a.num_qsa_layers, b.num_qsa_layers);
  for (int i = 0; i < a.num_qsa_layers && i < QSAKV_MAX_LAYERS; ++i)
    num(format("qsa_layers[%d]", i).c_str(), a.qsa_layers[i], b.qsa_layers[i]);
  num("num_q_heads", a.num_q_heads, b.num_q_heads);
  num("num_kv_heads", a.num_kv_heads, b.num_kv_heads);
  num("head_dim", a.head_dim, b.head_dim);
  if (a.softmax_scale != b.softmax_scale)  // float ==: 0 and -0 are one value, as before
    note("softmax_scale", format("%.9g", static_cast<double>(a.softmax_scale)),
         format("%.9g", static_cast<double>(b.softmax_scale)));
  num("index_num_heads", a.index_num_heads, b.index_num_heads);
  num("index_head_dim", a.index_head_dim, b.index_head_dim);
  num("compress_ratio", a.compress_ratio, b.compress_ratio);
  num("topk_tokens", a.topk_tokens, b.topk_tokens);
  num("tp_size", a.tp_size, b.tp_size);
  num("tp_rank", a.tp_rank, b.tp_rank);
  num("speculative_tokens", a.speculative_tokens, b.speculative_tokens);
  dtype("activation_dtype", a.activation_dtype, b.activation_dtype);
  dtype("kv_dtype", a.kv_dtype, b.kv_dtype);
  num("block_size", a.block_size, b.block_size);
  num("max_requests", a.max_requests, b.max_requests);
  num("max_batched_tokens", a.max_batched_tokens, b.max_batched_tokens);
  num("max_model_len", a.max_model_len, b.max_model_len);
  dtype("index_key_dtype", a.index_key_dtype, b.index_key_dtype);
  return d;
}

}  // namespace qsakv
