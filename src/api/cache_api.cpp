// SPDX-License-Identifier: Apache-2.0
// extern "C" entry points: capacity planning and cache creation.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "api/guard.hpp"
#include "api/handles.hpp"
#include "api/layer.hpp"
#include "core/cache_layout.hpp"
#include "core/capacity.hpp"
#include "core/config.hpp"
#include "core/dtype.hpp"
#include "core/kernel_tier.hpp"
#include "core/overlay/overlay.hpp"
#include "core/versioned.hpp"

using namespace qsakv;

namespace {

qsakv_cache_options default_cache_options() {
  qsakv_cache_options o = QSAKV_CACHE_OPTIONS_INIT;  // the header's defaults, one definition
  return o;
}

// E4M3 needs an overlay validated for this very config, with calibrated scales (unit
// scales only where the caller asked for a negative control); 16-bit caches take none.
std::vector<float> layer_scales(const qsakv_model_config& c, const qsakv_overlay* overlay,
                                const BackendInfo& backend, int32_t allow_unit_scales) {
  if (allow_unit_scales != 0 && allow_unit_scales != 1)
    fail(QSAKV_ERROR_INVALID_ARGUMENT, "options.allow_unit_scales is %d; must be 0 or 1",
         allow_unit_scales);
  std::vector<float> scales(2 * static_cast<size_t>(c.num_qsa_layers), 1.0f);
  if (c.kv_dtype != QSAKV_DTYPE_E4M3) {
    if (overlay)
      fail(QSAKV_ERROR_INVALID_ARGUMENT,
           "an overlay was given for a %s cache; only E4M3 "
           "caches take scales (pass NULL)",
           dtype_name(c.kv_dtype));
    return scales;
  }
  if (!overlay)
    fail(QSAKV_ERROR_OVERLAY_MISSING,
         "kv_dtype is e4m3 but no overlay was given: E4M3 mode "
         "needs calibrated per-layer K/V scales for this checkpoint (no unit-scale fallback)");
  overlay_require_validated(overlay, c);
  const int min_sm = overlay_contract_min_sm(overlay);
  if (backend.kind == QSAKV_BACKEND_CUDA && min_sm > 0 && backend.sm_version < min_sm)
    fail(QSAKV_ERROR_CONTRACT, "overlay contract min_sm is %d; this GPU is SM %d", min_sm,
         backend.sm_version);
  for (int i = 0; i < c.num_qsa_layers; ++i)
    overlay_scales(overlay, c.qsa_layers[i], &scales[2 * i], &scales[2 * i + 1]);
  // A single scale of 1.0 is a calibrated value like any other; a whole overlay of them,
  // or one marked as a negative control, is the uncalibrated run E4M3 mode exists to avoid.
  const bool marked = overlay->unit_scale_control;
  const bool all_one = std::all_of(scales.begin(), scales.end(), [](float s) { return s == 1.0f; });
  if ((marked || all_one) && !allow_unit_scales)
    fail(QSAKV_ERROR_OVERLAY_UNIT_SCALES,
         "the overlay holds unit scales (%s): E4M3 mode does not run uncalibrated; "
         "options.allow_unit_scales is %d, set it to 1 to run a negative control",
         marked ? "its manifest marks it unit_scale_control: true"
                : "every one of its scales is 1.0",
         allow_unit_scales);
  return scales;
}

// What the backend's kernels cannot attend over is refused before anything is allocated.
void require_backend_takes(const qsakv_model_config& c, const BackendInfo& backend) {
  if (backend.kind == QSAKV_BACKEND_CUDA)
    require_cuda_cache_dtype(backend.tier, backend.sm_version, c.kv_dtype);
}

// Options that fix the cache's size: a layout to allocate for, or caller-owned memory.
qsakv_cache_options sized_options(const qsakv_cache_options* options) {
  if (!options)
    fail(QSAKV_ERROR_INVALID_ARGUMENT, "options is NULL; options.num_blocks sets the size");
  const auto o = read_versioned(options, default_cache_options(), "options");
  if (o.num_blocks <= 0)
    fail(QSAKV_ERROR_INVALID_ARGUMENT,
         "options.num_blocks is %lld; give the number of blocks "
         "per layer (> 0): it sets the size of the buffers",
         static_cast<long long>(o.num_blocks));
  return o;
}

// The bytes of the caller's top-k buffer (rows x cols int32; build_layout bounds the
// product).
uint64_t external_topk_bytes(const qsakv_cache_options& o) {
  return static_cast<uint64_t>(o.external_topk_rows) * static_cast<uint64_t>(o.external_topk_cols) *
         sizeof(int32_t);
}

// A cache handle of layout L with its scales, NaN flags and top-k buffer; the K/V, ring
// and compressed buffers are the caller's to attach.
std::unique_ptr<qsakv_cache> new_cache(qsakv_context* context, const qsakv_model_config& c,
                                       const qsakv_rank_geometry& g,
                                       const std::vector<float>& scales,
                                       const qsakv_cache_options& o,
                                       const qsakv_cache_layout& layout) {
  Backend* be = context->backend.get();
  auto cache = std::make_unique<qsakv_cache>();
  cache->context = context;
  cache->config = c;
  cache->geometry = g;
  cache->layout = layout;
  const qsakv_cache_layout& L = cache->layout;
  const size_t nl = static_cast<size_t>(c.num_qsa_layers);
  cache->kv_layers.assign(nl, nullptr);
  cache->compressed_layers.assign(nl, nullptr);
  cache->ring_layers.assign(nl, nullptr);
  if (o.external_topk) {
    // The caller's top-k buffer, checked like its other buffers (build_layout has checked
    // its type and shape): int32 entries, memory of the context's device.
    if (reinterpret_cast<uintptr_t>(o.external_topk) % sizeof(int32_t) != 0)
      fail(QSAKV_ERROR_INVALID_ARGUMENT, "options.external_topk (%p) must be 4-byte aligned",
           o.external_topk);
    be->check_caller_memory(o.external_topk, external_topk_bytes(o), "options.external_topk");
    cache->topk_base = static_cast<int32_t*>(o.external_topk);
  } else {
    const size_t buffers = o.share_topk ? 1 : nl;
    cache->topk = DeviceBuffer(be, buffers * L.topk_rows * L.topk_cols * sizeof(int32_t));
    cache->topk_base = cache->topk.as<int32_t>();
  }
  cache->scales = DeviceBuffer(be, scales.size() * sizeof(float));
  cache->nan_flags = DeviceBuffer(be, nl * sizeof(int32_t));
  be->copy(cache->scales.get(), scales.data(), scales.size() * sizeof(float),
           QSAKV_COPY_HOST_TO_DEVICE, nullptr);
  be->synchronize(nullptr);
  cache->layout.total_bytes =
      cache->topk.bytes() + cache->scales.bytes() + cache->nan_flags.bytes();
  return cache;
}

}  // namespace

// A field-by-field copy into a kernel's parameter struct, like select's in plan_api.cpp:
// the same shape to the duplicates tool, no shared logic (other structs, other fields).
qsakv::KvCacheView qsakv_cache::kv_view(int i) const {
  KvCacheView v;
  v.data = kv_layers[static_cast<size_t>(i)];
  v.num_blocks = layout.num_blocks;
  v.block_size = layout.block_size;
  v.kv_heads = layout.kv_heads;
  v.head_dim = layout.head_dim;
  v.stride_block = layout.kv_stride_block;
  v.stride_kv = layout.kv_stride_kv;
  v.stride_token = layout.kv_stride_token;
  v.stride_head = layout.kv_stride_head;
  v.dtype = layout.kv_dtype;
  v.scales = scales.as<float>() + 2 * i;
  v.nan_flag = nan_flags.as<int32_t>() + i;
  return v;
}

qsakv::CompressedKeysView qsakv_cache::compressed_view(int i) const {
  CompressedKeysView v;
  v.data = compressed_layers[static_cast<size_t>(i)];
  v.num_blocks = layout.num_blocks;
  v.keys_per_block = layout.compressed_keys_per_block;
  v.keys_per_block_log2 = -1;
  for (int s = 0; s < 31; ++s)
    if ((1 << s) == v.keys_per_block) v.keys_per_block_log2 = s;
  v.dim = layout.index_head_dim;
  v.stride_block = layout.compressed_stride_block;
  v.scales_offset = layout.compressed_scales_offset;
  v.dtype = layout.index_key_dtype;
  return v;
}

int32_t* qsakv_cache::topk_for(int i) const {
  if (layout.topk_shared) return topk_base;
  return topk_base + static_cast<size_t>(i) * layout.topk_rows * layout.topk_cols;
}

extern "C" {

qsakv_status qsakv_capacity_plan(const qsakv_model_config* config, uint64_t budget,
                                 qsakv_capacity* out) {
  return guarded([&] {
    const auto c = read_versioned(config, default_model_config(), "config");
    write_versioned(out, plan_capacity(c, budget), "out");
  });
}

qsakv_status qsakv_cache_options_init(qsakv_cache_options* options) {
  return guarded([&] {
    if (!options) fail(QSAKV_ERROR_INVALID_ARGUMENT, "options is NULL");
    *options = default_cache_options();
  });
}

qsakv_status qsakv_cache_create(qsakv_cache** out, qsakv_context* context,
                                const qsakv_model_config* config, const qsakv_overlay* overlay,
                                const qsakv_cache_options* options) {
  return guarded([&] {
    require_out(out, "out");
    if (!context) fail(QSAKV_ERROR_INVALID_ARGUMENT, "context is NULL");
    const auto c = read_versioned(config, default_model_config(), "config");
    const auto o = options ? read_versioned(options, default_cache_options(), "options")
                           : default_cache_options();
    Backend* be = context->backend.get();
    // The config first (INVALID_CONFIG), then the overlay: E4M3 without valid scales is
    // refused before any size question.
    const qsakv_rank_geometry g = rank_geometry(c);
    const std::vector<float> scales = layer_scales(c, overlay, be->info(), o.allow_unit_scales);
    require_backend_takes(c, be->info());
    auto cache =
        new_cache(context, c, g, scales, o, build_layout(c, g, o, resolve_num_blocks(c, o)));
    const qsakv_cache_layout& L = cache->layout;
    const size_t nl = static_cast<size_t>(c.num_qsa_layers);
    try {
      cache->kv = DeviceBuffer(be, L.kv_bytes_per_layer * nl);
      cache->compressed = DeviceBuffer(be, L.compressed_bytes_per_layer * nl);
      cache->ring = DeviceBuffer(be, L.ring_bytes_per_layer * nl);
    } catch (const Error& e) {
      // Say which argument asked for that much.
      if (e.status() != QSAKV_ERROR_OUT_OF_MEMORY) throw;
      fail(QSAKV_ERROR_OUT_OF_MEMORY, "the caches of %lld blocks per layer (%s) do not fit: %s",
           static_cast<long long>(L.num_blocks),
           o.num_blocks ? "options.num_blocks" : "from options.memory_budget_bytes", e.what());
    }
    for (size_t i = 0; i < nl; ++i) {
      cache->kv_layers[i] = static_cast<char*>(cache->kv.get()) + L.kv_bytes_per_layer * i;
      cache->compressed_layers[i] =
          static_cast<char*>(cache->compressed.get()) + L.compressed_bytes_per_layer * i;
      cache->ring_layers[i] = static_cast<char*>(cache->ring.get()) + L.ring_bytes_per_layer * i;
    }
    cache->layout.total_bytes +=
        cache->kv.bytes() + cache->compressed.bytes() + cache->ring.bytes();
    *out = cache.release();
  });
}

qsakv_status qsakv_cache_layout_for(const qsakv_model_config* config,
                                    const qsakv_cache_options* options, qsakv_cache_layout* out) {
  return guarded([&] {
    const auto c = read_versioned(config, default_model_config(), "config");
    const qsakv_rank_geometry g = rank_geometry(c);
    const auto o = sized_options(options);
    write_versioned(out, build_layout(c, g, o, resolve_num_blocks(c, o)), "out");
  });
}

qsakv_status qsakv_cache_create_with_memory(qsakv_cache** out, qsakv_context* context,
                                            const qsakv_model_config* config,
                                            const qsakv_overlay* overlay,
                                            const qsakv_cache_options* options,
                                            const qsakv_cache_memory* memory) {
  return guarded([&] {
    require_out(out, "out");
    if (!context) fail(QSAKV_ERROR_INVALID_ARGUMENT, "context is NULL");
    const auto c = read_versioned(config, default_model_config(), "config");
    const qsakv_rank_geometry g = rank_geometry(c);  // validates the config first
    // The options' unit-scale choice is needed before their size is checked: the overlay
    // is refused before any size question, as in qsakv_cache_create.
    const int32_t allow_unit =
        options ? read_versioned(options, default_cache_options(), "options").allow_unit_scales : 0;
    const std::vector<float> scales =
        layer_scales(c, overlay, context->backend->info(), allow_unit);
    require_backend_takes(c, context->backend->info());
    const auto o = sized_options(options);
    if (!memory) fail(QSAKV_ERROR_INVALID_ARGUMENT, "memory is NULL");
    auto m = blank_versioned<qsakv_cache_memory>(QSAKV_CACHE_MEMORY_VERSION);
    m = read_versioned(memory, m, "memory");
    if (m.num_layers != c.num_qsa_layers)
      fail(QSAKV_ERROR_INVALID_ARGUMENT, "memory.num_layers is %d; the config has %d QSA layers",
           m.num_layers, c.num_qsa_layers);
    if (!m.layers) fail(QSAKV_ERROR_INVALID_ARGUMENT, "memory.layers is NULL");
    const qsakv_cache_layout L = build_layout(c, g, o, resolve_num_blocks(c, o));
    Backend* be = context->backend.get();
    struct Range {
      uintptr_t begin, end;
      std::string name;
    };
    std::vector<Range> ranges;
    auto check = [&](int i, const char* field, void* p, uint64_t given, uint64_t needed) {
      char name[96];
      std::snprintf(name, sizeof name, "memory.layers[%d].%s (layer %d)", i, field,
                    c.qsa_layers[i]);
      if (needed == 0) return;
      if (!p) fail(QSAKV_ERROR_INVALID_ARGUMENT, "%s is NULL", name);
      if (given < needed)
        fail(QSAKV_ERROR_INVALID_ARGUMENT, "%s is %llu bytes; needs %llu", name,
             static_cast<unsigned long long>(given), static_cast<unsigned long long>(needed));
      if (reinterpret_cast<uintptr_t>(p) % 16 != 0)
        fail(QSAKV_ERROR_INVALID_ARGUMENT, "%s (%p) must be 16-byte aligned", name, p);
      be->check_caller_memory(p, needed, name);
      const uintptr_t b = reinterpret_cast<uintptr_t>(p);
      for (const Range& r : ranges)
        if (b < r.end && r.begin < b + needed)
          fail(QSAKV_ERROR_INVALID_ARGUMENT, "%s overlaps %s", name, r.name.c_str());
      ranges.push_back({b, b + needed, name});
    };
    for (int i = 0; i < c.num_qsa_layers; ++i) {
      const qsakv_layer_memory& lm = m.layers[i];
      check(i, "kv", lm.kv, lm.kv_bytes, L.kv_bytes_per_layer);
      check(i, "compressed_keys", lm.compressed_keys, lm.compressed_bytes,
            L.compressed_bytes_per_layer);
      check(i, "ring_keys", lm.ring_keys, lm.ring_bytes, L.ring_bytes_per_layer);
    }
    if (o.external_topk) {  // selection would write into the caller's other buffers
      const uintptr_t b = reinterpret_cast<uintptr_t>(o.external_topk);
      for (const Range& r : ranges)
        if (b < r.end && r.begin < b + external_topk_bytes(o))
          fail(QSAKV_ERROR_INVALID_ARGUMENT, "options.external_topk overlaps %s", r.name.c_str());
    }
    auto cache = new_cache(context, c, g, scales, o, L);
    for (int i = 0; i < c.num_qsa_layers; ++i) {
      cache->kv_layers[i] = static_cast<char*>(m.layers[i].kv);
      cache->compressed_layers[i] = static_cast<char*>(m.layers[i].compressed_keys);
      cache->ring_layers[i] = static_cast<char*>(m.layers[i].ring_keys);
    }
    // The caller's bytes may hold NaN codes (E4M3: the software decoder checks every
    // layer) or non-finite values (the grouped route checks V tiles).
    {
      const std::vector<int32_t> ones(static_cast<size_t>(c.num_qsa_layers), 1);
      be->copy(cache->nan_flags.get(), ones.data(), ones.size() * sizeof(int32_t),
               QSAKV_COPY_HOST_TO_DEVICE, nullptr);
      be->synchronize(nullptr);
    }
    *out = cache.release();
  });
}

void qsakv_cache_destroy(qsakv_cache* cache) { delete cache; }

qsakv_status qsakv_cache_note_external_codes(qsakv_cache* cache, int32_t layer,
                                             qsakv_stream_t stream) {
  return guarded([&] {
    if (!cache) fail(QSAKV_ERROR_INVALID_ARGUMENT, "cache is NULL");
    const int i = require_qsa_layer(cache, layer);
    static const int32_t kOne = 1;  // static storage: the async copy may read it later
    cache->context->backend->copy(cache->nan_flags.as<int32_t>() + i, &kOne, sizeof kOne,
                                  QSAKV_COPY_HOST_TO_DEVICE, stream);
  });
}

qsakv_status qsakv_cache_get_layout(const qsakv_cache* cache, qsakv_cache_layout* out) {
  return guarded([&] {
    if (!cache) fail(QSAKV_ERROR_INVALID_ARGUMENT, "cache is NULL");
    write_versioned(out, cache->layout, "out");
  });
}

qsakv_status qsakv_cache_get_layer_buffers(const qsakv_cache* cache, int32_t layer,
                                           qsakv_layer_buffers* out) {
  return guarded([&] {
    if (!cache) fail(QSAKV_ERROR_INVALID_ARGUMENT, "cache is NULL");
    if (!out) fail(QSAKV_ERROR_INVALID_ARGUMENT, "out is NULL");
    const int i = require_qsa_layer(cache, layer);
    auto b = blank_versioned<qsakv_layer_buffers>(QSAKV_LAYER_BUFFERS_VERSION);
    b.kv = cache->kv_layers[static_cast<size_t>(i)];
    b.compressed_keys = cache->compressed_layers[static_cast<size_t>(i)];
    b.ring_keys = cache->ring_layers[static_cast<size_t>(i)];
    b.topk = cache->topk_for(i);
    b.scales = cache->scales.as<float>() + 2 * i;
    write_versioned(out, b, "out");
  });
}

}  // extern "C"
