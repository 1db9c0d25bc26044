// SPDX-License-Identifier: Apache-2.0
// extern "C" entry points: stores into the main cache and the indexer caches.
#include "api/guard.hpp"
#include "api/layer.hpp"
#include "core/dtype.hpp"
#include "core/versioned.hpp"

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
// A caller's array: present, and aligned to its elements of `elem` bytes (`type`).
void require_array(const void* p, size_t elem, const char* type, const char* what) {
  require_ptr(p, what);
  require_element_aligned(p, elem, type, what);
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
  require_array(keys, sizeof(uint16_t), "FP16 values", "keys");
  require_bytes(what, n, static_cast<uint64_t>(cache->config.index_head_dim) * sizeof(uint16_t));
  return i;
}

// Each store's checks and params: the call's own, and qsakv_store_step's parts (every part
// checked before any is launched, so a bad part leaves the caches as they were).
StoreKvParams kv_params(qsakv_cache* cache, int i, const void* k, const void* v,
                        const int64_t* slot_mapping, int64_t num_tokens,
                        const char* count_name = "num_tokens") {
  const size_t act = dtype_size(cache->config.activation_dtype);
  require_array(k, act, "16-bit values", "k");
  require_array(v, act, "16-bit values", "v");
  require_array(slot_mapping, sizeof(int64_t), "int64_t", "slot_mapping");
  // k and v are [num_tokens, kv_heads, head_dim]: a count no buffer can hold would make
  // the element offsets wrap.
  require_bytes(count_name, num_tokens,
                static_cast<uint64_t>(cache->geometry.kv_heads) * cache->config.head_dim *
                    dtype_size(cache->config.activation_dtype));
  StoreKvParams p;
  p.cache = cache->kv_view(i);
  p.k = k;
  p.v = v;
  p.slot_mapping = slot_mapping;
  p.num_tokens = num_tokens;
  p.act_dtype = cache->config.activation_dtype;
  return p;
}

StoreRowsParams ring_params(qsakv_cache* cache, int i, const void* keys,
                            const int32_t* request_slots, const int64_t* positions,
                            int64_t num_tokens) {
  require_array(request_slots, sizeof(int32_t), "int32_t", "request_slots");
  require_array(positions, sizeof(int64_t), "int64_t", "positions");
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
  return p;
}

StoreCompressedParams compressed_params(qsakv_cache* cache, int i, const void* keys,
                                        const int64_t* slot_mapping, int64_t num_keys) {
  require_array(slot_mapping, sizeof(int64_t), "int64_t", "slot_mapping");
  StoreCompressedParams p{};
  p.cache = cache->compressed_view(i);
  p.src = static_cast<const uint16_t*>(keys);
  p.num_keys = num_keys;
  p.slot_mapping = slot_mapping;
  p.compress_ratio = cache->config.compress_ratio;
  return p;
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
    cache->context->backend->store_kv(kv_params(cache, i, k, v, slot_mapping, num_tokens), stream);
  });
}

qsakv_status qsakv_store_index_keys(qsakv_cache* cache, int32_t layer, const void* keys,
                                    const int32_t* request_slots, const int64_t* positions,
                                    int64_t num_tokens, qsakv_stream_t stream) {
  return guarded([&] {
    const int i = require_index_key_rows(cache, layer, keys, num_tokens, "num_tokens");
    if (i < 0) return;
    cache->context->backend->store_ring(
        ring_params(cache, i, keys, request_slots, positions, num_tokens), stream);
  });
}

qsakv_status qsakv_store_compressed_keys(qsakv_cache* cache, int32_t layer, const void* keys,
                                         const int64_t* slot_mapping, int64_t num_keys,
                                         qsakv_stream_t stream) {
  return guarded([&] {
    const int i = require_index_key_rows(cache, layer, keys, num_keys, "num_keys");
    if (i < 0) return;
    cache->context->backend->store_compressed(
        compressed_params(cache, i, keys, slot_mapping, num_keys), stream);
  });
}

qsakv_status qsakv_store_step(qsakv_cache* cache, int32_t layer, const qsakv_step_stores* stores,
                              qsakv_stream_t stream) {
  return guarded([&] {
    require_cache(cache);
    const int i = require_qsa_layer(cache, layer);
    const qsakv_step_stores s = read_versioned(
        stores, blank_versioned<qsakv_step_stores>(QSAKV_STEP_STORES_VERSION), "stores");
    require_count(s.num_tokens, "stores.num_tokens");
    require_count(s.num_index_keys, "stores.num_index_keys");
    require_count(s.num_compressed_keys, "stores.num_compressed_keys");
    StoreStepParams p{};
    p.has_kv = s.num_tokens > 0;
    p.has_ring = s.num_index_keys > 0;
    p.has_compressed = s.num_compressed_keys > 0;
    // The fields by their names in the struct first (the helpers' messages name the
    // single calls' arguments).
    if (p.has_kv) {
      const size_t act = dtype_size(cache->config.activation_dtype);
      require_array(s.k, act, "16-bit values", "stores.k");
      require_array(s.v, act, "16-bit values", "stores.v");
      require_array(s.kv_slot_mapping, sizeof(int64_t), "int64_t", "stores.kv_slot_mapping");
      p.kv = kv_params(cache, i, s.k, s.v, s.kv_slot_mapping, s.num_tokens, "stores.num_tokens");
    }
    if (p.has_ring) {
      require_array(s.index_keys, sizeof(uint16_t), "FP16 values", "stores.index_keys");
      require_array(s.index_request_slots, sizeof(int32_t), "int32_t",
                    "stores.index_request_slots");
      require_array(s.index_positions, sizeof(int64_t), "int64_t", "stores.index_positions");
      require_index_key_rows(cache, layer, s.index_keys, s.num_index_keys, "stores.num_index_keys");
      p.ring = ring_params(cache, i, s.index_keys, s.index_request_slots, s.index_positions,
                           s.num_index_keys);
    }
    if (p.has_compressed) {
      require_array(s.compressed_keys, sizeof(uint16_t), "FP16 values", "stores.compressed_keys");
      require_array(s.compressed_slot_mapping, sizeof(int64_t), "int64_t",
                    "stores.compressed_slot_mapping");
      require_index_key_rows(cache, layer, s.compressed_keys, s.num_compressed_keys,
                             "stores.num_compressed_keys");
      p.compressed = compressed_params(cache, i, s.compressed_keys, s.compressed_slot_mapping,
                                       s.num_compressed_keys);
    }
    if (p.has_kv || p.has_ring || p.has_compressed) cache->context->backend->store_step(p, stream);
  });
}

}  // extern "C"
