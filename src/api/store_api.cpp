// SPDX-License-Identifier: Apache-2.0
// extern "C" entry points: stores into the main cache and the indexer caches.
#include "api/guard.hpp"
#include "api/layer.hpp"
#include "core/dtype.hpp"

using namespace qsakv;

namespace {
void require_cache(const qsakv_cache* cache) {
  if (!cache) fail(QSAKV_ERROR_INVALID_ARGUMENT, "cache is NULL");
}
void require_count(int64_t n, const char* what) {
  if (n < 0)
    fail(QSAKV_ERROR_INVALID_ARGUMENT, "%s is %lld; must be >= 0", what, static_cast<long long>(n));
}
void require_ptr(const void* p, const char* what) {
  if (!p) fail(QSAKV_ERROR_INVALID_ARGUMENT, "%s is NULL", what);
}

// The checks both index-key stores make: the cache, the layer, `n` rows (named `what`) of
// index_head_dim FP16 values that some buffer can hold, and the keys. Returns the layer's
// QSA index, or -1 when there is nothing to store (n == 0: nothing else is read).
int require_index_key_rows(const qsakv_cache* cache, int32_t layer, const void* keys, int64_t n,
                           const char* what) {
  require_cache(cache);
  const int i = require_qsa_layer(cache, layer);
  require_count(n, what);
  if (n == 0) return -1;
  require_ptr(keys, "keys");
  require_bytes(what, n, static_cast<uint64_t>(cache->config.index_head_dim) * sizeof(uint16_t));
  return i;
}

}  // namespace

extern "C" {

qsakv_status qsakv_store_kv(qsakv_cache* cache, int32_t layer, const void* k, const void* v,
                            const int64_t* slot_mapping, int64_t num_tokens,
                            qsakv_stream_t stream) {
  return guarded([&] {
    require_cache(cache);
    const int i = require_qsa_layer(cache, layer);
    require_count(num_tokens, "num_tokens");
    if (num_tokens == 0) return;
    require_ptr(k, "k");
    require_ptr(v, "v");
    require_ptr(slot_mapping, "slot_mapping");
    // k and v are [num_tokens, kv_heads, head_dim]: a count no buffer can hold would make
    // the element offsets wrap.
    require_bytes("num_tokens", num_tokens,
                  static_cast<uint64_t>(cache->geometry.kv_heads) * cache->config.head_dim *
                      dtype_size(cache->config.activation_dtype));
    StoreKvParams p;
    p.cache = cache->kv_view(i);
    p.k = k;
    p.v = v;
    p.slot_mapping = slot_mapping;
    p.num_tokens = num_tokens;
    p.act_dtype = cache->config.activation_dtype;
    cache->context->backend->store_kv(p, stream);
  });
}

qsakv_status qsakv_store_index_keys(qsakv_cache* cache, int32_t layer, const void* keys,
                                    const int32_t* request_slots, const int64_t* positions,
                                    int64_t num_tokens, qsakv_stream_t stream) {
  return guarded([&] {
    const int i = require_index_key_rows(cache, layer, keys, num_tokens, "num_tokens");
    if (i < 0) return;
    require_ptr(request_slots, "request_slots");
    require_ptr(positions, "positions");
    StoreRowsParams p{};
    p.dst = cache->ring_layers[static_cast<size_t>(i)];
    p.src = static_cast<const uint16_t*>(keys);
    p.row_elems = cache->config.index_head_dim;
    p.num_rows = num_tokens;
    p.max_requests = cache->config.max_requests;
    p.ring_length = cache->layout.ring_length;
    p.dst_rows = static_cast<int64_t>(p.max_requests) * p.ring_length;
    p.request_slots = request_slots;
    p.positions = positions;
    cache->context->backend->store_ring(p, stream);
  });
}

qsakv_status qsakv_store_compressed_keys(qsakv_cache* cache, int32_t layer, const void* keys,
                                         const int64_t* slot_mapping, int64_t num_keys,
                                         qsakv_stream_t stream) {
  return guarded([&] {
    const int i = require_index_key_rows(cache, layer, keys, num_keys, "num_keys");
    if (i < 0) return;
    require_ptr(slot_mapping, "slot_mapping");
    StoreCompressedParams p{};
    p.cache = cache->compressed_view(i);
    p.src = static_cast<const uint16_t*>(keys);
    p.num_keys = num_keys;
    p.slot_mapping = slot_mapping;
    p.compress_ratio = cache->config.compress_ratio;
    cache->context->backend->store_compressed(p, stream);
  });
}

}  // extern "C"
