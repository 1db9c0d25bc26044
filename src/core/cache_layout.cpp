// SPDX-License-Identifier: Apache-2.0
#include "core/cache_layout.hpp"

#include <algorithm>
#include <climits>
#include <cstring>

#include "core/capacity.hpp"
#include "core/checked.hpp"
#include "core/dtype.hpp"
#include "core/error.hpp"
#include "core/versioned.hpp"

namespace qsakv {

namespace {

// a * b, refusing a product beyond what any allocation can be (it would wrap).
uint64_t checked_mul(uint64_t a, uint64_t b, const char* what) {
  uint64_t r;
  if (__builtin_mul_overflow(a, b, &r) || r > (uint64_t{1} << 56))
    fail(QSAKV_ERROR_INVALID_ARGUMENT,
         "the %s would need %llu x %llu bytes: more than any "
         "device holds (options.num_blocks too large?)",
         what, static_cast<unsigned long long>(a), static_cast<unsigned long long>(b));
  return r;
}

void check_external_topk(const qsakv_cache_options& o, const qsakv_model_config& c,
                         const qsakv_rank_geometry& g) {
  if (!o.share_topk)
    fail(QSAKV_ERROR_INVALID_ARGUMENT,
         "options.external_topk is set with share_topk = 0; an "
         "external buffer is the shared model-level buffer");
  const int32_t dtype = enum_value(o.external_topk_dtype);
  if (dtype != QSAKV_DTYPE_INT32)
    fail(QSAKV_ERROR_INVALID_ARGUMENT,
         "options.external_topk_dtype is %s (%d); the top-k "
         "buffer must be int32",
         dtype_name(dtype), dtype);
  if (o.external_topk_rows < c.max_batched_tokens)
    fail(QSAKV_ERROR_INVALID_ARGUMENT,
         "options.external_topk_rows is %lld; needs at least "
         "max_batched_tokens = %d rows",
         static_cast<long long>(o.external_topk_rows), c.max_batched_tokens);
  if (o.external_topk_cols != g.topk_width)
    fail(QSAKV_ERROR_INVALID_ARGUMENT,
         "options.external_topk_cols is %lld; must be the "
         "top-k width %d",
         static_cast<long long>(o.external_topk_cols), g.topk_width);
  // The layout reports rows x cols: a product no buffer can have would wrap.
  require_bytes("options.external_topk_rows", o.external_topk_rows,
                static_cast<uint64_t>(g.topk_width) * sizeof(int32_t));
}

}  // namespace

CompressedPage compressed_page(const qsakv_model_config& c) {
  CompressedPage p;
  p.keys = c.block_size / c.compress_ratio;
  const int64_t codes = static_cast<int64_t>(p.keys) * c.index_head_dim;
  if (enum_value(c.index_key_dtype) == QSAKV_DTYPE_E4M3) {
    // Codes then one FP32 scale per key, padded so every page starts 16-byte aligned
    // (the kernels read codes and scales with 16-byte loads). A page is self-contained:
    // copying a block's pages copies its keys whole.
    p.scales_offset = codes;
    p.stride_bytes = (codes + 4 * p.keys + 15) / 16 * 16;
  } else {
    p.scales_offset = -1;
    p.stride_bytes = 2 * codes;
  }
  return p;
}

int64_t resolve_num_blocks(const qsakv_model_config& c, const qsakv_cache_options& o) {
  int64_t num_blocks = o.num_blocks;
  if (num_blocks < 0)
    fail(QSAKV_ERROR_INVALID_ARGUMENT, "options.num_blocks is %lld; must be >= 0",
         static_cast<long long>(num_blocks));
  if (num_blocks > INT32_MAX)
    fail(QSAKV_ERROR_INVALID_ARGUMENT,
         "options.num_blocks is %lld; block tables are int32, "
         "so at most %d",
         static_cast<long long>(num_blocks), INT32_MAX);
  if (num_blocks == 0) {
    if (o.memory_budget_bytes == 0)
      fail(QSAKV_ERROR_INVALID_ARGUMENT,
           "options.num_blocks and "
           "options.memory_budget_bytes are both 0; give one");
    const TopkBuffer topk = o.external_topk ? TopkBuffer::kExternal
                            : o.share_topk  ? TopkBuffer::kShared
                                            : TopkBuffer::kPerLayer;
    const qsakv_capacity cap = plan_capacity(c, o.memory_budget_bytes, topk);
    const uint64_t topk_cost = topk == TopkBuffer::kShared     ? cap.topk_bytes
                               : topk == TopkBuffer::kPerLayer ? cap.topk_bytes_unshared
                                                               : 0;
    const uint64_t fixed = cap.ring_bytes + topk_cost;  // both bounded by the config limits
    if (cap.num_blocks <= 0)
      fail(QSAKV_ERROR_INVALID_ARGUMENT,
           "options.memory_budget_bytes %llu holds no block: "
           "fixed costs are %llu bytes (rings %llu, top-k %llu), one block is %llu bytes",
           static_cast<unsigned long long>(o.memory_budget_bytes),
           static_cast<unsigned long long>(fixed), static_cast<unsigned long long>(cap.ring_bytes),
           static_cast<unsigned long long>(topk_cost),
           static_cast<unsigned long long>(cap.bytes_per_block));
    num_blocks = std::min<int64_t>(cap.num_blocks, INT32_MAX);
  }
  return num_blocks;
}

qsakv_cache_layout build_layout(const qsakv_model_config& c, const qsakv_rank_geometry& g,
                                const qsakv_cache_options& o, int64_t num_blocks) {
  if (o.external_topk) check_external_topk(o, c, g);
  if (o.share_topk != 0 && o.share_topk != 1)
    fail(QSAKV_ERROR_INVALID_ARGUMENT, "options.share_topk is %d; must be 0 or 1", o.share_topk);
  auto L = blank_versioned<qsakv_cache_layout>(QSAKV_CACHE_LAYOUT_VERSION);
  L.kv_dtype = c.kv_dtype;
  L.num_blocks = num_blocks;
  L.block_size = c.block_size;
  L.kv_heads = g.kv_heads;
  L.head_dim = c.head_dim;
  L.num_qsa_layers = c.num_qsa_layers;
  L.kv_stride_head = c.head_dim;
  L.kv_stride_token = static_cast<int64_t>(g.kv_heads) * c.head_dim;
  L.kv_stride_kv = L.kv_stride_token * c.block_size;
  L.kv_stride_block = 2 * L.kv_stride_kv;
  const uint64_t nb = static_cast<uint64_t>(num_blocks);
  L.kv_bytes_per_layer = checked_mul(
      nb, static_cast<uint64_t>(L.kv_stride_block) * dtype_size(c.kv_dtype), "K/V cache");
  const CompressedPage page = compressed_page(c);
  L.index_key_dtype = c.index_key_dtype;
  L.index_head_dim = c.index_head_dim;
  L.compressed_keys_per_block = page.keys;
  L.compressed_stride_block = page.stride_bytes;
  L.compressed_scales_offset = page.scales_offset;
  L.compressed_bytes_per_layer =
      checked_mul(nb, static_cast<uint64_t>(page.stride_bytes), "compressed index-key cache");
  L.ring_length = g.ring_length;
  L.ring_bytes_per_layer =
      static_cast<uint64_t>(c.max_requests) * g.ring_length * c.index_head_dim * 2;
  checked_mul(L.kv_bytes_per_layer + L.compressed_bytes_per_layer + L.ring_bytes_per_layer,
              static_cast<uint64_t>(c.num_qsa_layers), "all layers' caches");
  L.topk_rows = o.external_topk ? o.external_topk_rows : c.max_batched_tokens;
  L.topk_cols = g.topk_width;
  L.topk_shared = o.share_topk;
  L.topk_external = o.external_topk ? 1 : 0;
  return L;
}

}  // namespace qsakv
