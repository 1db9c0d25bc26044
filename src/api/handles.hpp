// SPDX-License-Identifier: Apache-2.0
// The opaque handles behind the public types, in one place (the overlay's lives with its
// parser in core/overlay/overlay.hpp: the overlay logic works on it directly).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/backend.hpp"
#include "core/calib/stats.hpp"
#include "core/device_buffer.hpp"
#include "core/plan_meta.hpp"
#include "qsakv.h"

struct qsakv_context {
  std::unique_ptr<qsakv::Backend> backend;
  std::string fallback_reason;
};

struct qsakv_cache {
  qsakv_context* context = nullptr;
  qsakv_model_config config{};
  qsakv_rank_geometry geometry{};
  qsakv_cache_layout layout{};
  // Library-allocated caches: one allocation per kind, sliced per layer (fewer, larger
  // allocations); empty when the caller owns the memory.
  qsakv::DeviceBuffer kv;
  qsakv::DeviceBuffer compressed;
  qsakv::DeviceBuffer ring;
  // Each QSA layer's buffers, in the owned allocations or the caller's memory.
  std::vector<char*> kv_layers, compressed_layers, ring_layers;
  qsakv::DeviceBuffer topk;       // owned top-k buffer(s); empty when external
  qsakv::DeviceBuffer scales;     // float[2 * num_qsa_layers]: k, v per layer
  qsakv::DeviceBuffer nan_flags;  // int32[num_qsa_layers]: an E4M3 NaN code was stored
  int32_t* topk_base = nullptr;   // owned or external
  qsakv::KvCacheView kv_view(int qsa_index) const;
  qsakv::CompressedKeysView compressed_view(int qsa_index) const;
  int32_t* topk_for(int qsa_index) const;
};

struct qsakv_plan {
  qsakv_cache* cache = nullptr;
  qsakv_plan_options options{};
  int32_t num_rows = -1;  // -1: no update yet
  int32_t num_requests = 0;
  int32_t max_request_rows = 0;  // most query rows of one request in the last update
  int32_t min_request_rows = 0;  // fewest (of a request with any) in the last update
  int64_t max_context = 0;
  qsakv::PlanMetaShape shape{};     // metadata array sizes
  qsakv::GroupingRule grouping{};   // which requests take the grouped route
  int32_t num_groups = 0;           // of the last update
  int32_t grouped_rows = 0;         // of the last update
  qsakv::GroupedView grouped{};     // the route's workspace (zero: none)
  qsakv::DeviceBuffer meta;         // PlanMetaHeader + arrays
  qsakv::HostBuffer staging;        // pinned mirror of meta
  qsakv::DeviceBuffer partial_out;  // split-K partial outputs
  qsakv::DeviceBuffer partial_lse;
  qsakv::DeviceBuffer split_counters;
  qsakv::DeviceBuffer select_ws;
  qsakv::DeviceBuffer union_count;  // grouped route: token unions, split-K partials
  qsakv::DeviceBuffer union_off;
  qsakv::DeviceBuffer union_mask;
  qsakv::DeviceBuffer grouped_partial_out;
  qsakv::DeviceBuffer grouped_partial_lse;
  qsakv::DeviceBuffer grouped_counters;
  qsakv::DeviceBuffer own_lists;  // grouped route: the rows' own entries
  qsakv::DeviceBuffer row_split;
  qsakv::DeviceBuffer shared_out;  // grouped route: rows' shared parts
  qsakv::DeviceBuffer shared_lse;
  void* fence = nullptr;
  bool fence_pending = false;
  size_t meta_bytes = 0;
  qsakv::PlanMetaView meta_view() const;
  ~qsakv_plan();
};

// Live handles keep their statistics in device memory (words, maxima) and use `host`
// for what is recorded beside them (config, ranks); host handles keep them in `host`.
struct qsakv_calib {
  qsakv_context* context = nullptr;  // live handles only
  bool live = false;
  bool started = false;
  qsakv::calib::HostStats host;
  qsakv::DeviceBuffer words;   // uint64 [entries * kEntryWords]
  qsakv::DeviceBuffer maxima;  // float [entries]
  qsakv::DeviceBuffer table;   // uint16 [65536]
};
