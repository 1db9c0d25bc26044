// SPDX-License-Identifier: Apache-2.0
// extern "C" entry points: calibration handles, statistics, merging, scales, overlays.
#include <cstring>
#include <memory>
#include <vector>

#include "api/guard.hpp"
#include "api/handles.hpp"
#include "core/calib/histogram.hpp"
#include "core/calib/stats.hpp"
#include "core/calib/stats_file.hpp"
#include "core/calib/summary.hpp"
#include "core/config.hpp"
#include "core/dtype.hpp"
#include "core/overlay/manifest.hpp"
#include "core/overlay/write.hpp"
#include "core/versioned.hpp"

using namespace qsakv;

namespace {

void require_calib(const qsakv_calib* c) {
  if (!c) fail(QSAKV_ERROR_INVALID_ARGUMENT, "calib is NULL");
}

void require_live(const qsakv_calib* c, const char* what) {
  require_calib(c);
  if (!c->live)
    fail(QSAKV_ERROR_STATE,
         "%s needs a live handle (qsakv_calib_create); this one is a host "
         "copy (snapshot, load or merge)",
         what);
}

void require_host(const qsakv_calib* c, const char* what) {
  require_calib(c);
  if (c->live)
    fail(QSAKV_ERROR_STATE,
         "%s reads host statistics; this handle's are in device memory: "
         "take a host copy with qsakv_calib_snapshot first",
         what);
}

int require_layer(const qsakv_calib* c, int32_t layer) {
  const int i = qsa_index(c->host.config, layer);
  if (i < 0)
    fail(QSAKV_ERROR_INVALID_ARGUMENT,
         "layer %d is not a QSA layer of the calibration config "
         "(%d QSA layers, first %d, last %d)",
         layer, c->host.config.num_qsa_layers, c->host.config.qsa_layers[0],
         c->host.config.qsa_layers[c->host.config.num_qsa_layers - 1]);
  return i;
}

// The caller's kind as an index (0: K, 1: V). Takes the raw int32 (enum_value at the
// entry point: even passing the enum on by value would load it).
int require_kind(int32_t k) {
  if (k != QSAKV_CALIB_K && k != QSAKV_CALIB_V)
    fail(QSAKV_ERROR_INVALID_ARGUMENT, "kind is %d; QSAKV_CALIB_K (0) or QSAKV_CALIB_V (1)", k);
  return k;
}

std::unique_ptr<qsakv_calib> host_handle(calib::HostStats s) {
  auto h = std::make_unique<qsakv_calib>();
  h->host = std::move(s);
  return h;
}

// The contract of a scale pack written from statistics (qsakv_calib_write_overlay): a TP
// size or activation dtype left at its unset value (0, INVALID) is the statistics', so that
// the pack stays bound to what was calibrated unless the caller says otherwise;
// contract_tp_size -1 asks for no TP constraint (qsakv_overlay_write's 0). The speculative
// tokens and the minimum SM are as given (the statistics do not tell them: the config's
// speculative_tokens is no part of the fingerprint, and merges do not compare it).
qsakv_overlay_write_options bind_to_statistics(qsakv_overlay_write_options o,
                                               const calib::HostStats& s) {
  if (o.contract_tp_size < -1 || o.contract_tp_size > kMaxContractTpSize)
    fail(QSAKV_ERROR_INVALID_ARGUMENT,
         "options.contract_tp_size is %d; 0 (the statistics' TP size, %d), -1 (not "
         "constrained) or 1..%d",
         o.contract_tp_size, s.config.tp_size, kMaxContractTpSize);
  o.contract_tp_size = o.contract_tp_size == 0    ? s.config.tp_size
                       : o.contract_tp_size == -1 ? 0
                                                  : o.contract_tp_size;
  if (enum_value(o.contract_activation_dtype) == QSAKV_DTYPE_INVALID)
    o.contract_activation_dtype = s.config.activation_dtype;
  return o;
}

// Start and observe refuse a handle whose counts are already global.
void require_not_reduced(const qsakv_calib* c) {
  if (c->host.reduced)
    fail(QSAKV_ERROR_STATE,
         "the statistics were all-reduced over the TP group; observing "
         "more would mix global and per-rank counts (create a new handle)");
}
}  // namespace

extern "C" {

qsakv_status qsakv_calib_create(qsakv_calib** out, qsakv_context* context,
                                const qsakv_model_config* config) {
  return guarded([&] {
    require_out(out, "out");
    if (!context) fail(QSAKV_ERROR_INVALID_ARGUMENT, "context is NULL");
    const qsakv_model_config c = read_versioned(config, default_model_config(), "config");
    validate_config(c);
    if (c.activation_dtype != QSAKV_DTYPE_FP16 && c.activation_dtype != QSAKV_DTYPE_BF16)
      fail(QSAKV_ERROR_INVALID_ARGUMENT,
           "config.activation_dtype is %s; calibration observes "
           "FP16 or BF16 activations",
           qsakv_dtype_name(c.activation_dtype));
    auto h = std::make_unique<qsakv_calib>();
    h->context = context;
    h->live = true;
    h->host = calib::empty_stats(c);
    Backend* b = context->backend.get();
    // Only the recorded metadata lives on the host; the numbers live on the device.
    h->words = DeviceBuffer(b, h->host.words.size() * sizeof(uint64_t));
    h->maxima = DeviceBuffer(b, h->host.max_abs.size() * sizeof(float));
    h->host.words = {};
    h->host.max_abs = {};
    const std::vector<uint16_t> t = calib::make_bin_table(c.activation_dtype);
    h->table = DeviceBuffer(b, t.size() * sizeof(uint16_t));
    b->copy(h->table.get(), t.data(), t.size() * sizeof(uint16_t), QSAKV_COPY_HOST_TO_DEVICE,
            nullptr);
    b->synchronize(nullptr);  // `t` dies at return; the copy must be done with it
    *out = h.release();
  });
}

void qsakv_calib_destroy(qsakv_calib* calib) { delete calib; }

qsakv_status qsakv_calib_start(qsakv_calib* calib) {
  return guarded([&] {
    require_live(calib, "qsakv_calib_start");
    require_not_reduced(calib);
    calib->started = true;
  });
}

qsakv_status qsakv_calib_stop(qsakv_calib* calib) {
  return guarded([&] {
    require_live(calib, "qsakv_calib_stop");
    calib->started = false;
  });
}

qsakv_status qsakv_calib_observe(qsakv_calib* calib, int32_t layer, const void* k, const void* v,
                                 int64_t num_tokens, qsakv_stream_t stream) {
  return guarded([&] {
    require_live(calib, "qsakv_calib_observe");
    require_not_reduced(calib);
    const int i = require_layer(calib, layer);
    if (num_tokens < 0)
      fail(QSAKV_ERROR_INVALID_ARGUMENT, "num_tokens is %lld; must be >= 0",
           static_cast<long long>(num_tokens));
    // Arguments are checked even while stopped, so warm-up passes catch wiring bugs: only
    // the data is not read then.
    if (num_tokens == 0) return;
    if (!k) fail(QSAKV_ERROR_INVALID_ARGUMENT, "k is NULL");
    if (!v) fail(QSAKV_ERROR_INVALID_ARGUMENT, "v is NULL");
    const qsakv_rank_geometry g = rank_geometry(calib->host.config);
    const int64_t row = static_cast<int64_t>(g.kv_heads) * calib->host.config.head_dim;
    require_bytes("num_tokens", num_tokens,
                  static_cast<uint64_t>(row) * dtype_size(calib->host.config.activation_dtype));
    // The CUDA kernels load 16 bytes at a time (checked here, so also while stopped).
    Backend* be = calib->context->backend.get();
    if (be->info().kind == QSAKV_BACKEND_CUDA) {
      for (const void* x : {k, v})
        if (reinterpret_cast<uintptr_t>(x) % 16 != 0)
          fail(QSAKV_ERROR_INVALID_ARGUMENT, "%s is %p; must be 16-byte aligned on CUDA",
               x == k ? "k" : "v", x);
    }
    if (!calib->started) return;
    CalibObserveParams p;
    p.k = k;
    p.v = v;
    p.num_elems = num_tokens * row;
    p.act_dtype = calib->host.config.activation_dtype;
    p.bin_table = calib->table.as<const uint16_t>();
    p.words_k = calib->words.as<uint64_t>() + static_cast<size_t>(2 * i) * calib::kEntryWords;
    p.words_v = p.words_k + calib::kEntryWords;
    p.max_k = calib->maxima.as<float>() + 2 * i;
    p.max_v = p.max_k + 1;
    calib->context->backend->calib_observe(p, stream);
  });
}

qsakv_status qsakv_calib_allreduce(qsakv_calib* calib, void* nccl_comm, qsakv_stream_t stream) {
  return guarded([&] {
    require_live(calib, "qsakv_calib_allreduce");
    if (!nccl_comm) fail(QSAKV_ERROR_INVALID_ARGUMENT, "nccl_comm is NULL");
    if (calib->host.reduced)
      fail(QSAKV_ERROR_STATE,
           "the statistics were already all-reduced; a second reduction "
           "would count every rank tp_size times");
    const qsakv_model_config& c = calib->host.config;
    calib->context->backend->calib_allreduce(
        calib->words.as<uint64_t>(), calib->words.bytes() / sizeof(uint64_t),
        calib->maxima.as<float>(), calib->maxima.bytes() / sizeof(float), nccl_comm, c.tp_size,
        c.tp_rank, stream);
    calib->host.reduced = true;
    calib->host.rank = c.tp_size > 1 ? -1 : c.tp_rank;
    calib->host.ranks.assign(c.tp_size, 1);
  });
}

qsakv_status qsakv_calib_snapshot(qsakv_calib** out, const qsakv_calib* calib,
                                  qsakv_stream_t stream) {
  return guarded([&] {
    require_out(out, "out");
    require_calib(calib);
    calib::HostStats s = calib->host;
    if (calib->live) {
      Backend* b = calib->context->backend.get();
      s.words.resize(calib->words.bytes() / sizeof(uint64_t));
      s.max_abs.resize(calib->maxima.bytes() / sizeof(float));
      b->copy(s.words.data(), calib->words.get(), calib->words.bytes(), QSAKV_COPY_DEVICE_TO_HOST,
              stream);
      b->copy(s.max_abs.data(), calib->maxima.get(), calib->maxima.bytes(),
              QSAKV_COPY_DEVICE_TO_HOST, stream);
      b->synchronize(stream);
    }
    *out = host_handle(std::move(s)).release();
  });
}

qsakv_status qsakv_calib_get_info(const qsakv_calib* calib, qsakv_calib_info* info) {
  return guarded([&] {
    require_calib(calib);
    const calib::HostStats& s = calib->host;
    auto i = blank_versioned<qsakv_calib_info>(QSAKV_CALIB_INFO_VERSION);
    i.live = calib->live;
    i.started = calib->started;
    i.reduced = s.reduced;
    i.tp_size = s.config.tp_size;
    i.rank = s.rank;
    i.ranks_covered = s.ranks_covered();
    i.complete = s.complete();
    i.num_runs = s.num_runs;
    i.activation_dtype = s.config.activation_dtype;
    i.num_qsa_layers = s.config.num_qsa_layers;
    std::memcpy(i.qsa_layers, s.config.qsa_layers, sizeof i.qsa_layers);
    std::memcpy(i.config_fingerprint, s.fingerprint.c_str(),
                std::min(s.fingerprint.size(), sizeof i.config_fingerprint - 1));
    write_versioned(info, i, "info");
  });
}

qsakv_status qsakv_calib_get_config(const qsakv_calib* calib, qsakv_model_config* config) {
  return guarded([&] {
    require_calib(calib);
    write_versioned(config, calib->host.config, "config");
  });
}

qsakv_status qsakv_calib_get_stats(const qsakv_calib* calib, int32_t layer, qsakv_calib_kind kind,
                                   qsakv_calib_stats* stats, uint64_t* histogram) {
  return guarded([&] {
    require_host(calib, "qsakv_calib_get_stats");
    const int i = require_layer(calib, layer);
    const int k = require_kind(enum_value(kind));
    const uint64_t* e = calib->host.entry(i, k);
    auto r = blank_versioned<qsakv_calib_stats>(QSAKV_CALIB_STATS_VERSION);
    r.count = e[calib::kWordCount];
    r.finite_count = e[calib::kWordFinite];
    r.nonzero_count = e[calib::kWordNonzero];
    r.max_abs = calib->host.max_of(i, k);
    write_versioned(stats, r, "stats");
    if (histogram) std::memcpy(histogram, e + calib::kWordHist, sizeof(uint64_t) * calib::kBins);
  });
}

qsakv_status qsakv_calib_save(const qsakv_calib* calib, const char* path) {
  return guarded([&] {
    require_host(calib, "qsakv_calib_save");
    if (!path) fail(QSAKV_ERROR_INVALID_ARGUMENT, "path is NULL");
    if (!*path) fail(QSAKV_ERROR_INVALID_ARGUMENT, "path is empty");
    calib::save_stats(calib->host, path);
  });
}

qsakv_status qsakv_calib_load(qsakv_calib** out, const char* path) {
  return guarded([&] {
    require_out(out, "out");
    if (!path) fail(QSAKV_ERROR_INVALID_ARGUMENT, "path is NULL");
    if (!*path) fail(QSAKV_ERROR_INVALID_ARGUMENT, "path is empty");
    *out = host_handle(calib::load_stats(path)).release();
  });
}

qsakv_status qsakv_calib_merge(qsakv_calib** out, const qsakv_calib* const* inputs,
                               int32_t num_inputs, qsakv_calib_merge_mode mode) {
  return guarded([&] {
    require_out(out, "out");
    const int32_t m = enum_value(mode);
    if (m != QSAKV_CALIB_MERGE_RANKS && m != QSAKV_CALIB_MERGE_ENVELOPE)
      fail(QSAKV_ERROR_INVALID_ARGUMENT,
           "mode is %d; QSAKV_CALIB_MERGE_RANKS (0) or "
           "QSAKV_CALIB_MERGE_ENVELOPE (1)",
           m);
    if (!inputs || num_inputs < 1)
      fail(QSAKV_ERROR_INVALID_ARGUMENT, "inputs is NULL or num_inputs (%d) < 1", num_inputs);
    std::vector<const calib::HostStats*> in;
    for (int32_t i = 0; i < num_inputs; ++i) {
      if (!inputs[i]) fail(QSAKV_ERROR_INVALID_ARGUMENT, "inputs[%d] is NULL", i);
      require_host(inputs[i], "qsakv_calib_merge");
      in.push_back(&inputs[i]->host);
    }
    *out = host_handle(calib::merge(in, static_cast<qsakv_calib_merge_mode>(m))).release();
  });
}

qsakv_status qsakv_calib_scale_from_max(float max_abs, float* scale) {
  return guarded([&] {
    if (!scale) fail(QSAKV_ERROR_INVALID_ARGUMENT, "scale is NULL");
    *scale = calib::scale_from_max(max_abs);
  });
}

qsakv_status qsakv_calib_summarize(const qsakv_calib* calib, int32_t layer, qsakv_calib_kind kind,
                                   qsakv_calib_summary* summary) {
  return guarded([&] {
    require_host(calib, "qsakv_calib_summarize");
    const int i = require_layer(calib, layer);
    const int k = require_kind(enum_value(kind));
    if (!summary) fail(QSAKV_ERROR_INVALID_ARGUMENT, "summary is NULL");
    calib::check_summarizable(calib->host);
    write_versioned(summary, calib::summarize_entry(calib->host, i, k), "summary");
  });
}

qsakv_status qsakv_calib_write_overlay(const qsakv_calib* calib, const char* out_dir,
                                       const qsakv_overlay_write_options* options) {
  return guarded([&] {
    require_host(calib, "qsakv_calib_write_overlay");
    if (!out_dir) fail(QSAKV_ERROR_INVALID_ARGUMENT, "out_dir is NULL");
    if (!*out_dir) fail(QSAKV_ERROR_INVALID_ARGUMENT, "out_dir is empty");
    const calib::HostStats& s = calib->host;
    const auto opt =
        bind_to_statistics(read_versioned(options, default_write_options(), "options"), s);
    calib::check_summarizable(s);
    const int n = s.config.num_qsa_layers;
    std::vector<float> k(n), v(n);
    for (int i = 0; i < n; ++i) {
      k[i] = calib::scale_from_max(s.max_of(i, 0));
      v[i] = calib::scale_from_max(s.max_of(i, 1));
    }
    overlay_write(out_dir, s.config.qsa_layers, k.data(), v.data(), n, opt);
  });
}

}  // extern "C"
