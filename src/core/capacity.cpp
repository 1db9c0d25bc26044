// SPDX-License-Identifier: Apache-2.0
#include "core/capacity.hpp"

#include <cstring>

#include "core/cache_layout.hpp"
#include "core/config.hpp"
#include "core/dtype.hpp"
#include "core/versioned.hpp"

namespace qsakv {

qsakv_capacity plan_capacity(const qsakv_model_config& c, uint64_t budget, TopkBuffer topk) {
  const qsakv_rank_geometry g = rank_geometry(c);
  const uint64_t layers = static_cast<uint64_t>(c.num_qsa_layers);
  const uint64_t kv_elems_per_token = 2ull * g.kv_heads * c.head_dim;  // K and V
  // Compressed index keys: one per `ratio` tokens, in pages of one cache block each
  // (cache_layout.cpp); the FP16 baseline has FP16 keys.
  const uint64_t bs = static_cast<uint64_t>(c.block_size);
  qsakv_model_config fp16_keys = c;
  fp16_keys.index_key_dtype = QSAKV_DTYPE_FP16;
  const uint64_t compressed_page_bytes = static_cast<uint64_t>(compressed_page(c).stride_bytes);
  const uint64_t fp16_page_bytes = static_cast<uint64_t>(compressed_page(fp16_keys).stride_bytes);
  const uint64_t compressed_per_token = compressed_page_bytes / bs;
  const uint64_t fp16_compressed_per_token = fp16_page_bytes / bs;

  auto r = blank_versioned<qsakv_capacity>(QSAKV_CAPACITY_VERSION);
  r.main_bytes_per_token = layers * kv_elems_per_token * dtype_size(c.kv_dtype);
  r.compressed_bytes_per_token = layers * compressed_per_token;
  r.bytes_per_token = r.main_bytes_per_token + r.compressed_bytes_per_token;
  r.fp16_bytes_per_token = layers * (kv_elems_per_token * 2 + fp16_compressed_per_token);
  r.ring_bytes_per_request = layers * static_cast<uint64_t>(g.ring_length) * c.index_head_dim * 2;
  r.ring_bytes = r.ring_bytes_per_request * static_cast<uint64_t>(c.max_requests);
  r.topk_bytes = static_cast<uint64_t>(c.max_batched_tokens) * g.topk_width * 4;
  r.topk_bytes_unshared = r.topk_bytes * layers;
  r.budget_bytes = budget;
  // Per block, exactly what the cache allocates: the cache's own layout of one block.
  auto one = blank_versioned<qsakv_cache_options>(QSAKV_CACHE_OPTIONS_VERSION);
  one.share_topk = 1;
  const qsakv_cache_layout block = build_layout(c, g, one, 1);
  const uint64_t compressed_per_block = layers * block.compressed_bytes_per_layer;
  r.bytes_per_block = layers * block.kv_bytes_per_layer + compressed_per_block;
  const uint64_t topk_cost = topk == TopkBuffer::kShared     ? r.topk_bytes
                             : topk == TopkBuffer::kPerLayer ? r.topk_bytes_unshared
                                                             : 0;
  const uint64_t fixed = r.ring_bytes + topk_cost;
  const uint64_t left = budget > fixed ? budget - fixed : 0;
  r.num_blocks = static_cast<int64_t>(left / r.bytes_per_block);
  r.num_tokens = r.num_blocks * c.block_size;
  const uint64_t fp16_per_block = layers * (kv_elems_per_token * 2 * bs + fp16_page_bytes);
  r.fp16_num_tokens = static_cast<int64_t>(left / fp16_per_block) * c.block_size;
  r.capacity_ratio =
      r.fp16_num_tokens > 0 ? static_cast<double>(r.num_tokens) / r.fp16_num_tokens : 0.0;
  r.ideal_ratio = static_cast<double>(r.fp16_bytes_per_token) / r.bytes_per_token;
  return r;
}

}  // namespace qsakv
