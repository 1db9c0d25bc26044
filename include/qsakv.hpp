// SPDX-License-Identifier: Apache-2.0
/*
 * qsakv.hpp -- C++17 RAII wrappers over the C API of libqsakv (include/qsakv.h).
 *
 * Header-only; links against the same libqsakv (no C++ symbols are exported, so no C++
 * ABI is involved). Every failing call throws qsakv::Error carrying the qsakv_status and
 * the library's thread-local message (copied and cleared in the failing thread).
 * Handles are move-only and free their C object in the destructor; get() gives the raw
 * pointer for C calls this header does not wrap. Parents must outlive their children,
 * as in C: a Cache its Context (and the caller's memory it was made over), a Plan its
 * Cache (an Overlay may go once its caches exist: they copy its scales).
 *
 *   qsakv::Context ctx(QSAKV_BACKEND_CPU);
 *   auto cfg = qsakv::ModelConfig::preset("qwen4_exp");
 *   qsakv::Cache cache(ctx, cfg, nullptr, options);
 *   qsakv::Plan plan(cache, plan_options);
 *   plan.update(batch); plan.select_topk(layer, index_q); plan.attention(layer,
 * QSAKV_ATTENTION_SPARSE, q, out);
 */
#ifndef QSAKV_HPP
#define QSAKV_HPP

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "qsakv.h"

namespace qsakv {

/* A failed call: status() is the qsakv_status, message() the library's message. */
class Error : public std::runtime_error {
 public:
  Error(qsakv_status status, const std::string& message)
      : std::runtime_error(std::string(qsakv_status_string(status)) + ": " + message),
        status_(status),
        message_(message) {}
  qsakv_status status() const noexcept { return status_; }
  const std::string& message() const noexcept { return message_; }

 private:
  qsakv_status status_;
  std::string message_;
};

/* Throws Error for a failing status (copying and clearing the thread's message). */
inline void check(qsakv_status status) {
  if (status == QSAKV_SUCCESS) return;
  const char* m = qsakv_last_error();
  std::string message = m ? m : "";
  qsakv_clear_error();
  throw Error(status, message);
}

/* Version of the loaded library, and whether it matches this header. */
inline int version() noexcept { return qsakv_version(); }
inline std::string version_string() { return qsakv_version_string(); }
inline bool library_matches_header() noexcept {
  return qsakv_version() == QSAKV_VERSION_NUMBER && qsakv_abi_version() == QSAKV_ABI_VERSION;
}

namespace detail {
template <class T, void (*Destroy)(T*)>
struct Deleter {
  void operator()(T* p) const noexcept { Destroy(p); }
};
template <class T, void (*Destroy)(T*)>
using Unique = std::unique_ptr<T, Deleter<T, Destroy>>;

/* A zeroed versioned struct with struct_size and version set. */
template <class S>
S versioned(uint32_t version) {
  S s;
  std::memset(&s, 0, sizeof s);
  s.struct_size = sizeof s;
  s.version = version;
  return s;
}
// A model config the library writes whole (a preset, a checkpoint's config): it writes
// the struct as *its* header declares it, which a newer library's larger struct would
// overrun, so it writes into a 4 KiB scratch of which this header's struct is kept, with
// this header's struct_size and version (what QSAKV_MODEL_CONFIG_INIT would compile in).
template <class Fill>
inline qsakv_model_config filled_model_config(Fill fill) {
  union Scratch {
    qsakv_model_config config;
    unsigned char bytes[4096];
  };
  static_assert(sizeof(qsakv_model_config) <= 4096, "the scratch holds the config");
  Scratch scratch;
  std::memset(&scratch, 0, sizeof scratch);
  check(fill(&scratch.config));
  qsakv_model_config c;
  std::memcpy(&c, &scratch, sizeof c);
  c.struct_size = sizeof c;
  c.version = QSAKV_MODEL_CONFIG_VERSION;
  return c;
}
}  // namespace detail

/* Model config: a plain C struct with helpers. */
struct ModelConfig {
  static qsakv_model_config preset(const char* name) {
    return detail::filled_model_config(
        [&](qsakv_model_config* c) { return qsakv_model_config_preset(c, name); });
  }
  /* The geometry of a Hugging Face checkpoint (its directory or its config.json); the
   * runtime fields are the qwen4_exp preset's, for the caller to set. */
  static qsakv_model_config from_checkpoint(const std::string& dir_or_config_json) {
    return detail::filled_model_config([&](qsakv_model_config* c) {
      return qsakv_model_config_from_checkpoint(c, dir_or_config_json.c_str());
    });
  }
  static void validate(const qsakv_model_config& c) { check(qsakv_model_config_validate(&c)); }
  static qsakv_rank_geometry rank_geometry(const qsakv_model_config& c) {
    auto g = detail::versioned<qsakv_rank_geometry>(QSAKV_RANK_GEOMETRY_VERSION);
    check(qsakv_model_config_rank_geometry(&c, &g));
    return g;
  }
};

inline qsakv_capacity capacity_plan(const qsakv_model_config& c, uint64_t budget_bytes) {
  auto cap = detail::versioned<qsakv_capacity>(QSAKV_CAPACITY_VERSION);
  check(qsakv_capacity_plan(&c, budget_bytes, &cap));
  return cap;
}

// qsakv_checkpoint_revision (a materialised checkpoint answers with its base's revision).
inline std::string checkpoint_revision(const std::string& path) {
  char hex[65] = {0};
  check(qsakv_checkpoint_revision(path.c_str(), hex));
  return hex;
}

class Context {
 public:
  explicit Context(qsakv_backend backend = QSAKV_BACKEND_AUTO, int32_t device = 0) {
    qsakv_context_options o = QSAKV_CONTEXT_OPTIONS_INIT;
    o.backend = backend;
    o.device = device;
    create(&o);
  }
  explicit Context(const qsakv_context_options& options) { create(&options); }
  qsakv_context* get() const noexcept { return h_.get(); }
  qsakv_context_info info() const {
    auto i = detail::versioned<qsakv_context_info>(QSAKV_CONTEXT_INFO_VERSION);
    check(qsakv_context_get_info(h_.get(), &i));
    return i;
  }
  void synchronize(qsakv_stream_t stream = nullptr) const {
    check(qsakv_stream_synchronize(h_.get(), stream));
  }

 private:
  void create(const qsakv_context_options* o) {
    qsakv_context* c = nullptr;
    check(qsakv_context_create(&c, o));
    h_.reset(c);
  }
  detail::Unique<qsakv_context, qsakv_context_destroy> h_;
};

/* Device memory of a context's backend (host memory on the CPU backend). */
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const Context& ctx, size_t bytes) : ctx_(ctx.get()), bytes_(bytes) {
    check(qsakv_malloc(ctx_, &ptr_, bytes));
  }
  /* The buffer keeps using its context: a temporary one would be gone before it. */
  DeviceBuffer(Context&&, size_t) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      std::swap(ctx_, o.ctx_);
      std::swap(ptr_, o.ptr_);
      std::swap(bytes_, o.bytes_);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { reset(); }
  void reset() noexcept {
    if (ptr_) qsakv_free(ctx_, ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }
  void* get() const noexcept { return ptr_; }
  template <class T>
  T* as() const noexcept {
    return static_cast<T*>(ptr_);
  }
  size_t size() const noexcept { return bytes_; }
  /* Copies `bytes` (at most the buffer's size) from host memory; async on `stream`. */
  void upload(const void* src, size_t bytes, qsakv_stream_t stream = nullptr) {
    if (bytes > bytes_) throw Error(QSAKV_ERROR_INVALID_ARGUMENT, "upload larger than the buffer");
    check(qsakv_memcpy(ctx_, ptr_, src, bytes, QSAKV_COPY_HOST_TO_DEVICE, stream));
  }
  void download(void* dst, size_t bytes, qsakv_stream_t stream = nullptr) const {
    if (bytes > bytes_)
      throw Error(QSAKV_ERROR_INVALID_ARGUMENT, "download larger than the buffer");
    check(qsakv_memcpy(ctx_, dst, ptr_, bytes, QSAKV_COPY_DEVICE_TO_HOST, stream));
  }

 private:
  qsakv_context* ctx_ = nullptr;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

class Overlay {
 public:
  /* A checkpoint directory, or a scale file with its manifest (empty: the default). */
  explicit Overlay(const std::string& path, const std::string& manifest = std::string()) {
    qsakv_overlay* o = nullptr;
    check(qsakv_overlay_load(&o, path.c_str(), manifest.empty() ? nullptr : manifest.c_str()));
    h_.reset(o);
  }
  qsakv_overlay* get() const noexcept { return h_.get(); }
  void validate(const qsakv_model_config& c, const std::string& expected_revision) {
    check(qsakv_overlay_validate(h_.get(), &c, expected_revision.c_str()));
  }
  qsakv_overlay_info info() const {
    auto i = detail::versioned<qsakv_overlay_info>(QSAKV_OVERLAY_INFO_VERSION);
    check(qsakv_overlay_get_info(h_.get(), &i));
    return i;
  }
  std::pair<float, float> scales(int32_t layer) const {
    float k = 0, v = 0;
    check(qsakv_overlay_get_scales(h_.get(), layer, &k, &v));
    return {k, v};
  }

  /* One layer of a scale file: the half of a K/V pair the file lacks is NaN. */
  struct LayerScales {
    int32_t layer;
    float k_scale;
    float v_scale;
  };
  /* A scale file's scales in ascending layer order and its SHA-256 (hex). */
  struct ScaleFile {
    std::vector<LayerScales> layers;
    std::string sha256;
  };
  /* The scales a scale file (model-kvscales.safetensors) holds, as they are, for
   * inspection (qsakv_overlay_read_scale_file): nothing validated, bound to nothing. */
  static ScaleFile read_scale_file(const std::string& scale_file) {
    int32_t n = 0;  // the count first, then the file again with room for all
    check(qsakv_overlay_read_scale_file(scale_file.c_str(), 0, nullptr, nullptr, nullptr, &n,
                                        nullptr));
    for (;;) {
      const int32_t capacity = n;
      std::vector<int32_t> layers(static_cast<size_t>(capacity));
      std::vector<float> k(static_cast<size_t>(capacity)), v(static_cast<size_t>(capacity));
      char hex[65] = {0};
      check(qsakv_overlay_read_scale_file(scale_file.c_str(), capacity, layers.data(), k.data(),
                                          v.data(), &n, hex));
      if (n > capacity) continue;  // the file grew in between: read it again, sized
      ScaleFile out;
      out.sha256 = hex;
      const size_t count = static_cast<size_t>(n);
      out.layers.reserve(count);
      for (size_t i = 0; i < count; ++i) out.layers.push_back({layers[i], k[i], v[i]});
      return out;
    }
  }
  /* Defaults of the manifest's contract (unconstrained, default prefix, no base index). */
  static qsakv_overlay_write_options default_write_options() {
    return QSAKV_OVERLAY_WRITE_OPTIONS_INIT;
  }
  /* A scale pack (scale file and manifest) in `out_dir`, a new directory
   * (qsakv_overlay_write): the scales of `num_layers` QSA layers, arrays of num_layers. */
  static void write(const std::string& out_dir, const int32_t* layers, const float* k_scales,
                    const float* v_scales, int32_t num_layers,
                    const qsakv_overlay_write_options& options) {
    check(qsakv_overlay_write(out_dir.c_str(), layers, k_scales, v_scales, num_layers, &options));
  }
  /* The same from read_scale_file's entries. */
  static void write(const std::string& out_dir, const std::vector<LayerScales>& scales,
                    const qsakv_overlay_write_options& options) {
    if (scales.size() > static_cast<size_t>(INT32_MAX))
      throw Error(QSAKV_ERROR_INVALID_ARGUMENT, "more scales than an int32 counts");
    std::vector<int32_t> layers;
    std::vector<float> k, v;
    for (const LayerScales& s : scales) {
      layers.push_back(s.layer);
      k.push_back(s.k_scale);
      v.push_back(s.v_scale);
    }
    write(out_dir, layers.data(), k.data(), v.data(), static_cast<int32_t>(scales.size()), options);
  }
  /* A calibrated checkpoint directory `out_dir` (new) from a base checkpoint directory and
   * a scale pack of write() (qsakv_overlay_materialize). */
  static void materialize(const std::string& out_dir, const std::string& base_checkpoint_dir,
                          const std::string& scale_pack_dir) {
    check(qsakv_overlay_materialize(out_dir.c_str(), base_checkpoint_dir.c_str(),
                                    scale_pack_dir.c_str()));
  }

 private:
  detail::Unique<qsakv_overlay, qsakv_overlay_destroy> h_;
};

/* Tensor-parallel consensus, a collective over the TP group's NCCL communicator (an
 * ncclComm_t): every rank, before an E4M3 cache is used, with its own config and overlay
 * (nullptr for 16-bit caches). Throws Error(QSAKV_ERROR_TP_MISMATCH) on every rank, with
 * the same message, when the ranks differ; CUDA backend only. */
inline void tp_consensus(const Context& ctx, const qsakv_model_config& c, const Overlay* overlay,
                         void* nccl_comm, qsakv_stream_t stream = nullptr) {
  check(qsakv_tp_consensus(ctx.get(), &c, overlay ? overlay->get() : nullptr, nccl_comm, stream));
}

class Cache {
 public:
  static qsakv_cache_options default_options() { return QSAKV_CACHE_OPTIONS_INIT; }
  /* overlay: nullptr for 16-bit caches. */
  Cache(const Context& ctx, const qsakv_model_config& c, const Overlay* overlay,
        const qsakv_cache_options& options) {
    qsakv_cache* p = nullptr;
    check(qsakv_cache_create(&p, ctx.get(), &c, overlay ? overlay->get() : nullptr, &options));
    h_.reset(p);
  }
  /* Over the caller's memory (qsakv_cache_create_with_memory; options.num_blocks > 0):
   * one qsakv_layer_memory per QSA layer, each buffer at least what layout_for() reports.
   * The buffers are used as they are (not zeroed) and never freed by the cache: they must
   * outlive it. */
  Cache(const Context& ctx, const qsakv_model_config& c, const Overlay* overlay,
        const qsakv_cache_options& options, const qsakv_cache_memory& memory) {
    qsakv_cache* p = nullptr;
    check(qsakv_cache_create_with_memory(&p, ctx.get(), &c, overlay ? overlay->get() : nullptr,
                                         &options, &memory));
    h_.reset(p);
  }
  /* The context must outlive the cache (the C object keeps it): no temporary. */
  Cache(Context&&, const qsakv_model_config&, const Overlay*, const qsakv_cache_options&) = delete;
  Cache(Context&&, const qsakv_model_config&, const Overlay*, const qsakv_cache_options&,
        const qsakv_cache_memory&) = delete;
  /* The caller's memory for the constructor above: fill num_layers and layers. */
  static qsakv_cache_memory cache_memory() { return QSAKV_CACHE_MEMORY_INIT; }
  /* The layout a cache of this config and options would have (options.num_blocks > 0),
   * without creating one: what to allocate for a cache over the caller's memory. */
  static qsakv_cache_layout layout_for(const qsakv_model_config& c,
                                       const qsakv_cache_options& options) {
    auto l = detail::versioned<qsakv_cache_layout>(QSAKV_CACHE_LAYOUT_VERSION);
    check(qsakv_cache_layout_for(&c, &options, &l));
    return l;
  }
  qsakv_cache* get() const noexcept { return h_.get(); }
  qsakv_cache_layout layout() const {
    auto l = detail::versioned<qsakv_cache_layout>(QSAKV_CACHE_LAYOUT_VERSION);
    check(qsakv_cache_get_layout(h_.get(), &l));
    return l;
  }
  /* The device pointers of a QSA layer (model-layer id), valid while the cache lives. */
  qsakv_layer_buffers layer_buffers(int32_t layer) const {
    auto b = detail::versioned<qsakv_layer_buffers>(QSAKV_LAYER_BUFFERS_VERSION);
    check(qsakv_cache_get_layer_buffers(h_.get(), layer, &b));
    return b;
  }
  /* After writing a layer's cache bytes yourself (through layer_buffers()): the kernels
   * check that layer for NaN codes and non-finite V values from now on. */
  void note_external_codes(int32_t layer, qsakv_stream_t stream = nullptr) {
    check(qsakv_cache_note_external_codes(h_.get(), layer, stream));
  }
  void store_kv(int32_t layer, const void* k, const void* v, const int64_t* slot_mapping,
                int64_t num_tokens, qsakv_stream_t stream = nullptr) {
    check(qsakv_store_kv(h_.get(), layer, k, v, slot_mapping, num_tokens, stream));
  }
  void store_compressed_keys(int32_t layer, const void* keys, const int64_t* slot_mapping,
                             int64_t num_keys, qsakv_stream_t stream = nullptr) {
    check(qsakv_store_compressed_keys(h_.get(), layer, keys, slot_mapping, num_keys, stream));
  }
  void store_index_keys(int32_t layer, const void* keys, const int32_t* request_slots,
                        const int64_t* positions, int64_t num_tokens,
                        qsakv_stream_t stream = nullptr) {
    check(qsakv_store_index_keys(h_.get(), layer, keys, request_slots, positions, num_tokens,
                                 stream));
  }
  /* A step's stores together (qsakv_store_step); fill the parts of step_stores(). */
  static qsakv_step_stores step_stores() { return QSAKV_STEP_STORES_INIT; }
  void store_step(int32_t layer, const qsakv_step_stores& stores, qsakv_stream_t stream = nullptr) {
    check(qsakv_store_step(h_.get(), layer, &stores, stream));
  }

 private:
  detail::Unique<qsakv_cache, qsakv_cache_destroy> h_;
};

class Plan {
 public:
  static qsakv_plan_options default_options() { return QSAKV_PLAN_OPTIONS_INIT; }
  Plan(Cache& cache, const qsakv_plan_options& options) {
    qsakv_plan* p = nullptr;
    check(qsakv_plan_create(&p, cache.get(), &options));
    h_.reset(p);
  }
  qsakv_plan* get() const noexcept { return h_.get(); }
  void update(const qsakv_batch& batch, qsakv_stream_t stream = nullptr) {
    check(qsakv_plan_update(h_.get(), &batch, stream));
  }
  qsakv_plan_info info() const {
    auto i = detail::versioned<qsakv_plan_info>(QSAKV_PLAN_INFO_VERSION);
    check(qsakv_plan_get_info(h_.get(), &i));
    return i;
  }
  /* topk nullptr: the layer's shared top-k buffer. */
  void select_topk(int32_t layer, const void* index_q, int32_t* topk = nullptr,
                   int64_t topk_stride = 0, qsakv_stream_t stream = nullptr) {
    check(qsakv_select_topk(h_.get(), layer, index_q, topk, topk_stride, stream));
  }
  void attention(int32_t layer, qsakv_attention_mode mode, const void* q, void* out,
                 const int32_t* topk = nullptr, int64_t topk_stride = 0,
                 qsakv_stream_t stream = nullptr) {
    check(qsakv_attention_run(h_.get(), layer, mode, q, topk, topk_stride, out, stream));
  }

 private:
  detail::Unique<qsakv_plan, qsakv_plan_destroy> h_;
};

class Calib {
 public:
  /* A live handle on `ctx` (starts stopped). */
  Calib(const Context& ctx, const qsakv_model_config& c) {
    qsakv_calib* p = nullptr;
    check(qsakv_calib_create(&p, ctx.get(), &c));
    h_.reset(p);
  }
  /* A live handle keeps using its context: no temporary. */
  Calib(Context&&, const qsakv_model_config&) = delete;
  /* A host handle loaded from a file written by save(). */
  static Calib load(const std::string& path) {
    qsakv_calib* p = nullptr;
    check(qsakv_calib_load(&p, path.c_str()));
    return Calib(p);
  }
  /* A host copy (waits for `stream`). */
  Calib snapshot(qsakv_stream_t stream = nullptr) const {
    qsakv_calib* p = nullptr;
    check(qsakv_calib_snapshot(&p, h_.get(), stream));
    return Calib(p);
  }
  qsakv_calib* get() const noexcept { return h_.get(); }
  void start() { check(qsakv_calib_start(h_.get())); }
  void stop() { check(qsakv_calib_stop(h_.get())); }
  void observe(int32_t layer, const void* k, const void* v, int64_t num_tokens,
               qsakv_stream_t stream = nullptr) {
    check(qsakv_calib_observe(h_.get(), layer, k, v, num_tokens, stream));
  }
  void save(const std::string& path) const { check(qsakv_calib_save(h_.get(), path.c_str())); }
  /* NCCL all-reduce of a live handle's statistics over `nccl_comm` (an ncclComm_t);
   * once per handle. */
  void allreduce(void* nccl_comm, qsakv_stream_t stream = nullptr) {
    check(qsakv_calib_allreduce(h_.get(), nccl_comm, stream));
  }
  qsakv_calib_info info() const {
    auto i = detail::versioned<qsakv_calib_info>(QSAKV_CALIB_INFO_VERSION);
    check(qsakv_calib_get_info(h_.get(), &i));
    return i;
  }
  /* The model config the statistics were gathered for, with this header's struct_size and
   * version (it holds this header's fields). */
  qsakv_model_config config() const {
    auto c = detail::versioned<qsakv_model_config>(QSAKV_MODEL_CONFIG_VERSION);
    check(qsakv_calib_get_config(h_.get(), &c));
    c.struct_size = sizeof c;
    c.version = QSAKV_MODEL_CONFIG_VERSION;
    return c;
  }
  /* The smallest FP32 scale s with 448 s >= max_abs (qsakv_calib_scale_from_max);
   * Error(QSAKV_ERROR_OVERLAY_BAD_SCALE) for max_abs not finite and > 0. */
  static float scale_from_max(float max_abs) {
    float s = 0;
    check(qsakv_calib_scale_from_max(max_abs, &s));
    return s;
  }
  /* One QSA layer's K or V statistics of a host handle; `histogram`: nullptr or
   * QSAKV_CALIB_BINS counts. */
  qsakv_calib_stats stats(int32_t layer, qsakv_calib_kind kind,
                          uint64_t* histogram = nullptr) const {
    auto st = detail::versioned<qsakv_calib_stats>(QSAKV_CALIB_STATS_VERSION);
    check(qsakv_calib_get_stats(h_.get(), layer, kind, &st, histogram));
    return st;
  }
  /* One QSA layer's K or V summary (scale, quantiles, saturation) of a host handle,
   * after every fail-closed check of the whole handle. */
  qsakv_calib_summary summarize(int32_t layer, qsakv_calib_kind kind) const {
    auto su = detail::versioned<qsakv_calib_summary>(QSAKV_CALIB_SUMMARY_VERSION);
    check(qsakv_calib_summarize(h_.get(), layer, kind, &su));
    return su;
  }
  /* Host handles merged into a new one (RANKS: one run's ranks; ENVELOPE: complete runs). */
  static Calib merge(const Calib* const* inputs, int32_t n, qsakv_calib_merge_mode mode) {
    std::unique_ptr<const qsakv_calib*[]> raw(new const qsakv_calib*[n > 0 ? n : 1]);
    for (int32_t i = 0; i < n; ++i) raw[i] = inputs[i]->get();
    qsakv_calib* p = nullptr;
    check(qsakv_calib_merge(&p, raw.get(), n, mode));
    return Calib(p);
  }
  /* The scale pack of every QSA layer into `out_dir` (a new directory); `options`:
   * base index, contract and layer prefix (QSAKV_OVERLAY_WRITE_OPTIONS_INIT first: the
   * contract's TP size and activation dtype left unset are the statistics'). */
  void write_overlay(const std::string& out_dir, const qsakv_overlay_write_options& options) const {
    check(qsakv_calib_write_overlay(h_.get(), out_dir.c_str(), &options));
  }

 private:
  explicit Calib(qsakv_calib* p) : h_(p) {}
  detail::Unique<qsakv_calib, qsakv_calib_destroy> h_;
};

}  // namespace qsakv

#endif /* QSAKV_HPP */
