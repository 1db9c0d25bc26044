// SPDX-License-Identifier: Apache-2.0
// include/qsakv.hpp: the C++ RAII wrappers. The pipeline (context, config, cache, store,
// plan, select, sparse and dense attention) on the CPU backend against an FP64
// reference, errors as exceptions carrying status and message, move-only handles.
#include "qsakv.hpp"

#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include <sys/stat.h>

#include "testutil.h"

static_assert(!std::is_copy_constructible<qsakv::Context>::value, "handles are move-only");
static_assert(std::is_nothrow_move_constructible<qsakv::Context>::value, "movable");
static_assert(std::is_base_of<std::runtime_error, qsakv::Error>::value, "std exception");
// Children keep their context's C object: a temporary Context does not compile (it left a
// cache pointing at a destroyed context), a named one does.
static_assert(!std::is_constructible<qsakv::Cache, qsakv::Context&&, const qsakv_model_config&,
                                     const qsakv::Overlay*, const qsakv_cache_options&>::value,
              "no cache of a temporary context");
static_assert(std::is_constructible<qsakv::Cache, qsakv::Context&, const qsakv_model_config&,
                                    const qsakv::Overlay*, const qsakv_cache_options&>::value,
              "a cache of a named context");
static_assert(!std::is_constructible<qsakv::DeviceBuffer, qsakv::Context&&, size_t>::value,
              "no buffer of a temporary context");
static_assert(std::is_constructible<qsakv::DeviceBuffer, const qsakv::Context&, size_t>::value,
              "a buffer of a named context");
static_assert(
    !std::is_constructible<qsakv::Calib, qsakv::Context&&, const qsakv_model_config&>::value,
    "no calibration of a temporary context");
static_assert(!std::is_constructible<qsakv::Cache, qsakv::Context&&, const qsakv_model_config&,
                                     const qsakv::Overlay*, const qsakv_cache_options&,
                                     const qsakv_cache_memory&>::value,
              "no cache over caller memory of a temporary context");

static uint16_t to_half(float x) {  // exact for the values used here (normal or zero)
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) == 0) return (uint16_t)(u >> 16);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const int exp = (int)((u >> 23) & 0xff) - 127 + 15;
  return (uint16_t)(sign | ((uint32_t)exp << 10) | ((u >> 13) & 0x3ffu));
}
static double from_half(uint16_t h) {
  const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  const double v = e == 0 ? std::ldexp((double)m, -24) : std::ldexp(1024.0 + m, e - 25);
  return (h & 0x8000) ? -v : v;
}

static void test_pipeline_matches_fp64(void** state) {
  (void)state;
  qsakv::Context ctx(QSAKV_BACKEND_CPU);
  assert_int_equal(ctx.info().backend, QSAKV_BACKEND_CPU);
  assert_true(qsakv::library_matches_header());

  auto cfg = qsakv::ModelConfig::preset("qwen4_exp");
  cfg.tp_size = 4;
  cfg.kv_dtype = QSAKV_DTYPE_FP16;
  cfg.max_batched_tokens = 8;
  cfg.max_requests = 2;
  cfg.max_model_len = 256;
  const auto g = qsakv::ModelConfig::rank_geometry(cfg);
  const int D = cfg.head_dim, H = g.q_heads, L = 37, hot = 5, block = 1;
  assert_int_equal(g.kv_heads, 1);

  auto co = qsakv::Cache::default_options();
  co.num_blocks = 2;
  qsakv::Cache cache(ctx, cfg, nullptr, co);
  auto po = qsakv::Plan::default_options();
  po.max_rows = 1;
  po.max_requests = 1;
  qsakv::Plan plan(cache, po);
  const int layer = cfg.qsa_layers[0];

  // K is zero except at token `hot`; q = 1/16 everywhere: score 1 at `hot`, 0 elsewhere.
  std::vector<uint16_t> k((size_t)L * D, 0), v((size_t)L * D), q((size_t)H * D, to_half(0.0625f));
  std::vector<int64_t> slots(L);
  std::vector<int64_t> cslots;
  for (int t = 0; t < L; ++t) {
    slots[t] = (int64_t)block * cfg.block_size + t;
    for (int d = 0; d < D; ++d) {
      v[(size_t)t * D + d] = to_half(0.25f * ((t + d) % 8));
      if (t == hot) k[(size_t)t * D + d] = to_half(1.0f);
    }
    if (t % cfg.compress_ratio == cfg.compress_ratio - 1) cslots.push_back(slots[t]);
  }
  const int groups = (int)cslots.size();
  std::vector<uint16_t> ck((size_t)groups * cfg.index_head_dim, to_half(0.5f));
  std::vector<uint16_t> iq((size_t)cfg.index_num_heads * cfg.index_head_dim, to_half(0.25f));
  int32_t bt[2] = {block, -1};

  auto up = [&](const void* src, size_t bytes) {
    qsakv::DeviceBuffer b(ctx, bytes);
    b.upload(src, bytes);
    return b;
  };
  auto dk = up(k.data(), k.size() * 2), dv = up(v.data(), v.size() * 2);
  auto ds = up(slots.data(), slots.size() * 8), dcs = up(cslots.data(), cslots.size() * 8);
  auto dck = up(ck.data(), ck.size() * 2), diq = up(iq.data(), iq.size() * 2);
  auto dq = up(q.data(), q.size() * 2), dbt = up(bt, sizeof bt);
  qsakv::DeviceBuffer dout(ctx, q.size() * 2);

  cache.store_kv(layer, dk.get(), dv.get(), ds.as<int64_t>(), L);
  cache.store_compressed_keys(layer, dck.get(), dcs.as<int64_t>(), groups);
  int32_t qs[2] = {0, 1}, lens[1] = {L};
  qsakv_batch batch;
  std::memset(&batch, 0, sizeof batch);
  batch.struct_size = sizeof batch;
  batch.version = QSAKV_BATCH_VERSION;
  batch.num_requests = 1;
  batch.query_start = qs;
  batch.seq_lens = lens;
  batch.block_table = dbt.as<int32_t>();
  batch.block_table_stride = 2;
  plan.update(batch);
  assert_int_equal(plan.info().num_rows, 1);
  plan.select_topk(layer, diq.get());

  const double e = std::exp(1.0);
  for (auto mode : {QSAKV_ATTENTION_SPARSE, QSAKV_ATTENTION_DENSE}) {
    plan.attention(layer, mode, dq.get(), dout.get());
    ctx.synchronize();
    std::vector<uint16_t> out(q.size());
    dout.download(out.data(), out.size() * 2);
    double worst = 0;
    for (int h = 0; h < H; ++h)
      for (int d = 0; d < D; ++d) {
        double num = 0;
        for (int t = 0; t < L; ++t) num += (t == hot ? e : 1.0) * 0.25 * ((t + d) % 8);
        const double want = num / (e + L - 1);
        worst = std::fmax(worst, std::fabs(from_half(out[(size_t)h * D + d]) - want));
      }
    print_message("mode %d: max |out - fp64| = %.3g\n", (int)mode, worst);
    assert_true(worst < 4e-3);  // fp16 output of values below 2: ulp 2^-10
  }
}

// Cache::store_step stores what store_kv, store_index_keys and store_compressed_keys do.
static void test_store_step_equals_the_three_stores(void** state) {
  (void)state;
  qsakv::Context ctx(QSAKV_BACKEND_CPU);
  auto cfg = qsakv::ModelConfig::preset("qwen4_exp");
  cfg.tp_size = 4;
  cfg.max_batched_tokens = 8;
  cfg.max_requests = 2;
  cfg.max_model_len = 256;
  cfg.kv_dtype = QSAKV_DTYPE_FP16;
  const auto g = qsakv::ModelConfig::rank_geometry(cfg);
  const int n = 8, layer = cfg.qsa_layers[0];
  std::vector<uint16_t> kv((size_t)n * g.kv_heads * cfg.head_dim),
      keys((size_t)n * cfg.index_head_dim);
  for (size_t i = 0; i < kv.size(); ++i) kv[i] = to_half(0.125f * (float)(i % 13));
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = to_half(0.25f * (float)(i % 7));
  std::vector<int64_t> slots(n), pos(n);
  std::vector<int32_t> req(n);
  for (int t = 0; t < n; ++t) {
    slots[t] = 3 * t + 1;
    pos[t] = t;
    req[t] = t % 2;
  }
  auto up = [&](const void* src, size_t bytes) {
    qsakv::DeviceBuffer b(ctx, bytes);
    b.upload(src, bytes);
    return b;
  };
  std::vector<uint16_t> v(kv.size()), ckeys(keys.size());  // distinct from k, ring keys
  for (size_t i = 0; i < v.size(); ++i) v[i] = to_half(-0.5f * (float)(i % 5));
  for (size_t i = 0; i < ckeys.size(); ++i) ckeys[i] = to_half(0.75f * (float)(i % 3));
  auto dkv = up(kv.data(), kv.size() * 2), dkeys = up(keys.data(), keys.size() * 2);
  auto dv = up(v.data(), v.size() * 2), dck = up(ckeys.data(), ckeys.size() * 2);
  auto ds = up(slots.data(), slots.size() * 8), dp = up(pos.data(), pos.size() * 8);
  auto dr = up(req.data(), req.size() * 4);
  auto co = qsakv::Cache::default_options();
  co.num_blocks = 4;
  qsakv::Cache calls(ctx, cfg, nullptr, co), step(ctx, cfg, nullptr, co);
  calls.store_kv(layer, dkv.get(), dv.get(), ds.as<int64_t>(), n);
  calls.store_index_keys(layer, dkeys.get(), dr.as<int32_t>(), dp.as<int64_t>(), n);
  calls.store_compressed_keys(layer, dck.get(), ds.as<int64_t>(), n);
  auto st = qsakv::Cache::step_stores();
  st.k = dkv.get();
  st.v = dv.get();
  st.kv_slot_mapping = ds.as<int64_t>();
  st.num_tokens = n;
  st.index_keys = dkeys.get();
  st.index_request_slots = dr.as<int32_t>();
  st.index_positions = dp.as<int64_t>();
  st.num_index_keys = n;
  st.compressed_keys = dck.get();
  st.compressed_slot_mapping = ds.as<int64_t>();
  st.num_compressed_keys = n;
  step.store_step(layer, st);
  const auto L = calls.layout();
  qsakv_layer_buffers a, b;
  a.struct_size = b.struct_size = sizeof a;
  assert_int_equal(qsakv_cache_get_layer_buffers(calls.get(), layer, &a), QSAKV_SUCCESS);
  assert_int_equal(qsakv_cache_get_layer_buffers(step.get(), layer, &b), QSAKV_SUCCESS);
  assert_memory_equal(a.kv, b.kv, L.kv_bytes_per_layer);  // host memory on the CPU backend
  assert_memory_equal(a.ring_keys, b.ring_keys, L.ring_bytes_per_layer);
  assert_memory_equal(a.compressed_keys, b.compressed_keys, L.compressed_bytes_per_layer);
  st.index_positions = nullptr;  // a bad part: refused, naming the field
  try {
    step.store_step(layer, st);
    fail_msg("store_step with a NULL index_positions did not throw");
  } catch (const qsakv::Error& e) {
    assert_int_equal(e.status(), QSAKV_ERROR_INVALID_ARGUMENT);
    assert_non_null(std::strstr(e.what(), "stores.index_positions"));
  }
}

static void test_errors_carry_status_and_message(void** state) {
  (void)state;
  try {
    qsakv::ModelConfig::preset("no_such_preset");
    fail_msg("no exception");
  } catch (const qsakv::Error& err) {
    assert_int_equal(err.status(), QSAKV_ERROR_INVALID_ARGUMENT);
    assert_non_null(std::strstr(err.message().c_str(), "no_such_preset"));
    assert_non_null(std::strstr(err.what(), "QSAKV_ERROR_INVALID_ARGUMENT"));
  }
  // The message was copied and cleared in this thread.
  assert_string_equal(qsakv_last_error(), "");

  auto cfg = qsakv::ModelConfig::preset("qwen4_exp");
  cfg.head_dim = 100;
  try {
    qsakv::ModelConfig::validate(cfg);
    fail_msg("no exception");
  } catch (const qsakv::Error& err) {
    assert_int_equal(err.status(), QSAKV_ERROR_INVALID_CONFIG);
    assert_non_null(std::strstr(err.message().c_str(), "head_dim"));
  }
  try {
    qsakv::Overlay ov("/nonexistent/qsakv-overlay-dir");
    fail_msg("no exception");
  } catch (const qsakv::Error& err) {
    assert_true(err.status() != QSAKV_SUCCESS);
    assert_false(err.message().empty());
  }
}

/* The wrappers of consensus and of a checkpoint's config: the CPU backend refuses the
 * collective by status; a config.json gives the preset's geometry. */
static void test_tp_consensus_and_checkpoint_config(void** state) {
  (void)state;
  qsakv::Context ctx(QSAKV_BACKEND_CPU);
  const auto preset = qsakv::ModelConfig::preset("qwen4_exp");
  try {
    qsakv::tp_consensus(ctx, preset, nullptr, reinterpret_cast<void*>(0x1234));
    fail_msg("no exception");
  } catch (const qsakv::Error& err) {
    assert_int_equal(err.status(), QSAKV_ERROR_UNSUPPORTED);
  }
  char dir[] = "/tmp/qsakv-cpp-ckpt-XXXXXX";
  assert_non_null(mkdtemp(dir));
  const std::string json = std::string(dir) + "/config.json";
  FILE* f = std::fopen(json.c_str(), "w");
  assert_non_null(f);
  std::fputs(
      "{\"num_hidden_layers\": 48, \"num_attention_heads\": 24, \"num_key_value_heads\": 2,"
      " \"head_dim\": 256, \"full_attention_interval\": 4, \"index_n_heads\": 4,"
      " \"index_head_dim\": 128, \"index_compress_ratio\": 4, \"index_topk\": 2048}",
      f);
  std::fclose(f);
  const auto c = qsakv::ModelConfig::from_checkpoint(dir);
  assert_memory_equal(&c, &preset, sizeof c);
  std::remove(json.c_str());
  std::remove(dir);
  try {
    qsakv::ModelConfig::from_checkpoint(json);  // gone now
    fail_msg("no exception");
  } catch (const qsakv::Error& err) {
    assert_int_equal(err.status(), QSAKV_ERROR_IO);
  }
}

static void test_handles_move_and_free(void** state) {
  (void)state;
  qsakv::Context a(QSAKV_BACKEND_CPU);
  qsakv_context* raw = a.get();
  qsakv::Context b(std::move(a));
  assert_ptr_equal(b.get(), raw);
  assert_null(a.get());  // NOLINT(bugprone-use-after-move): moved-from is empty
  qsakv::DeviceBuffer buf(b, 64);
  assert_non_null(buf.get());
  qsakv::DeviceBuffer moved = std::move(buf);
  assert_null(buf.get());  // NOLINT
  assert_int_equal(moved.size(), 64);
  unsigned char big[128] = {0};
  try {
    moved.upload(big, sizeof big);
    fail_msg("no exception");
  } catch (const qsakv::Error& err) {
    assert_int_equal(err.status(), QSAKV_ERROR_INVALID_ARGUMENT);
  }
}

// index_key_dtype through the C++ header: the default (initializer and preset), E4M3's
// page in the layout and its capacity, another dtype refused naming the field.
static void test_index_key_dtype(void** state) {
  (void)state;
  const qsakv_model_config init = QSAKV_MODEL_CONFIG_INIT;
  assert_int_equal(init.index_key_dtype, QSAKV_DTYPE_FP16);
  auto cfg = qsakv::ModelConfig::preset("qwen4_exp");
  assert_int_equal(cfg.index_key_dtype, QSAKV_DTYPE_FP16);
  cfg.tp_size = 4;
  cfg.index_key_dtype = QSAKV_DTYPE_E4M3;
  qsakv::ModelConfig::validate(cfg);
  const qsakv_capacity cap = qsakv::capacity_plan(cfg, 40ull << 30);
  assert_int_equal(cap.bytes_per_token, 6540);
  assert_int_equal(cap.fp16_bytes_per_token, 13056);
  assert_true(cap.ideal_ratio >= 1.99 && cap.capacity_ratio >= 1.99);

  cfg.kv_dtype = QSAKV_DTYPE_FP16;
  cfg.max_batched_tokens = 8;
  cfg.max_requests = 2;
  cfg.max_model_len = 256;
  qsakv::Context ctx(QSAKV_BACKEND_CPU);
  auto co = qsakv::Cache::default_options();
  co.num_blocks = 4;
  qsakv::Cache cache(ctx, cfg, nullptr, co);
  const qsakv_cache_layout l = cache.layout();
  assert_int_equal(l.index_key_dtype, QSAKV_DTYPE_E4M3);
  assert_int_equal(l.index_head_dim, 128);
  assert_int_equal(l.compressed_keys_per_block, 16);
  assert_int_equal(l.compressed_stride_block, 2112);
  assert_int_equal(l.compressed_scales_offset, 2048);
  assert_int_equal(l.compressed_bytes_per_layer, 4 * 2112);

  cfg.index_key_dtype = QSAKV_DTYPE_BF16;
  try {
    qsakv::ModelConfig::validate(cfg);
    fail_msg("no exception");
  } catch (const qsakv::Error& err) {
    assert_int_equal(err.status(), QSAKV_ERROR_INVALID_CONFIG);
    assert_non_null(std::strstr(err.message().c_str(), "index_key_dtype"));
  }
}

// Calibration through the C++ header: observe every QSA layer on the CPU backend, a host
// snapshot's statistics and summary, an envelope of two runs (counts add, maxima stay),
// and the scale pack written from it, which loads with the summary's scales.
static void test_calibration_to_scale_pack(void** state) {
  (void)state;
  qsakv::Context ctx(QSAKV_BACKEND_CPU);
  auto cfg = qsakv::ModelConfig::preset("qwen4_exp");
  cfg.tp_size = 1;
  cfg.kv_dtype = QSAKV_DTYPE_FP16;
  const auto g = qsakv::ModelConfig::rank_geometry(cfg);
  const int64_t n = 16;
  const size_t row = (size_t)g.kv_heads * (size_t)cfg.head_dim;
  std::vector<uint16_t> k(n * row), v(n * row);
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = to_half((float)(i % 7) * 0.5f);    // max |k| 3
    v[i] = to_half(-(float)(i % 5) * 0.25f);  // max |v| 1
  }
  qsakv::Calib live(ctx, cfg);
  live.start();
  for (int32_t l = 0; l < cfg.num_qsa_layers; ++l)
    live.observe(cfg.qsa_layers[l], k.data(), v.data(), n);
  live.stop();
  const qsakv::Calib run = live.snapshot();
  assert_int_equal(run.info().live, 0);
  assert_int_equal(run.info().complete, 1);
  const int32_t layer = cfg.qsa_layers[0];
  std::vector<uint64_t> hist(QSAKV_CALIB_BINS);
  const auto ks = run.stats(layer, QSAKV_CALIB_K, hist.data());
  assert_int_equal(ks.count, (uint64_t)(n * (int64_t)row));
  assert_true(ks.max_abs == 3.0f);
  uint64_t total = 0;
  for (uint64_t c : hist) total += c;
  assert_int_equal(total, ks.nonzero_count);
  const auto su = run.summarize(layer, QSAKV_CALIB_K);
  float want_scale = 0;
  assert_int_equal(qsakv_calib_scale_from_max(3.0f, &want_scale), QSAKV_SUCCESS);
  assert_true(su.scale == want_scale);

  const qsakv::Calib* runs[2] = {&run, &run};
  const qsakv::Calib both = qsakv::Calib::merge(runs, 2, QSAKV_CALIB_MERGE_ENVELOPE);
  assert_int_equal(both.info().num_runs, 2);
  const auto bs = both.stats(layer, QSAKV_CALIB_V);
  assert_int_equal(bs.count, 2 * (uint64_t)(n * (int64_t)row));
  assert_true(bs.max_abs == 1.0f);

  char dir[] = "/tmp/qsakv-cpp-calib-XXXXXX";
  assert_non_null(mkdtemp(dir));
  const std::string index = std::string(dir) + "/model.safetensors.index.json";
  FILE* f = std::fopen(index.c_str(), "w");
  assert_non_null(f);
  std::fputs("{\"weight_map\": {\"lm_head.weight\": \"a.safetensors\"}}", f);
  std::fclose(f);
  qsakv_overlay_write_options o = QSAKV_OVERLAY_WRITE_OPTIONS_INIT;
  o.base_index_path = index.c_str();
  const std::string pack = std::string(dir) + "/pack";
  both.write_overlay(pack, o);
  const qsakv::Overlay ov(pack + "/model-kvscales.safetensors");
  assert_int_equal(ov.info().num_scales, 2 * cfg.num_qsa_layers);  // K and V
  assert_true(ov.scales(layer).first == want_scale);
  try {
    both.write_overlay(pack, o);  // exists: refused, left as is
    fail_msg("no exception");
  } catch (const qsakv::Error& err) {
    assert_int_equal(err.status(), QSAKV_ERROR_INVALID_ARGUMENT);
  }
  const std::string cmd = std::string("rm -rf ") + dir;
  assert_int_equal(std::system(cmd.c_str()), 0);
}

static void write_file(const std::string& path, const char* body) {
  FILE* f = std::fopen(path.c_str(), "w");
  assert_non_null(f);
  std::fputs(body, f);
  std::fclose(f);
}
static std::string read_file(const std::string& path) {
  std::string s;
  FILE* f = std::fopen(path.c_str(), "r");
  if (!f) return s;
  char buf[256];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
  std::fclose(f);
  return s;
}
static uint32_t bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

// Overlay::write, read_scale_file and materialize: a scale pack of distinct K and V scales
// per layer reads back bit for bit (with the hash the loaded overlay reports), rewrites
// from read_scale_file's entries into the same file, materialises over a base checkpoint
// (its weights linked, its revision kept) into an overlay that validates and backs an
// E4M3 cache whose per-layer scales are the written ones. Refusals throw with the status.
static void test_overlay_write_read_materialize(void** state) {
  (void)state;
  auto cfg = qsakv::ModelConfig::preset("qwen4_exp");
  cfg.tp_size = 4;
  cfg.max_batched_tokens = 8;
  cfg.max_requests = 2;
  cfg.max_model_len = 256;
  assert_int_equal(cfg.kv_dtype, QSAKV_DTYPE_E4M3);
  const int32_t n = cfg.num_qsa_layers;
  std::vector<int32_t> layers(cfg.qsa_layers, cfg.qsa_layers + n);
  std::vector<float> ks((size_t)n), vs((size_t)n);
  for (int32_t i = 0; i < n; ++i) {
    ks[(size_t)i] = 0.01f * (float)(i + 1);  // K and V differ, and differ per layer
    vs[(size_t)i] = 0.5f + 0.03125f * (float)i;
  }
  char dir[] = "/tmp/qsakv-cpp-overlay-XXXXXX";
  assert_non_null(mkdtemp(dir));
  const std::string root = dir, base = root + "/base";
  assert_int_equal(mkdir(base.c_str(), 0755), 0);
  write_file(base + "/model.safetensors.index.json",
             "{\"metadata\": {\"total_size\": 7}, \"weight_map\": {\"w\": \"a.safetensors\"}}");
  write_file(base + "/a.safetensors", "weights");
  write_file(base + "/config.json", "{}");

  auto o = qsakv::Overlay::default_write_options();
  assert_int_equal(o.contract_speculative_tokens, -1);  // QSAKV_OVERLAY_WRITE_OPTIONS_INIT
  const std::string index = base + "/model.safetensors.index.json";
  o.base_index_path = index.c_str();
  const std::string pack = root + "/pack";
  qsakv::Overlay::write(pack, layers.data(), ks.data(), vs.data(), n, o);

  const auto file = qsakv::Overlay::read_scale_file(pack + "/model-kvscales.safetensors");
  assert_int_equal(file.layers.size(), (size_t)n);
  for (int32_t i = 0; i < n; ++i) {
    const auto& e = file.layers[(size_t)i];
    assert_int_equal(e.layer, layers[(size_t)i]);
    assert_int_equal(bits(e.k_scale), bits(ks[(size_t)i]));
    assert_int_equal(bits(e.v_scale), bits(vs[(size_t)i]));
  }
  assert_int_equal(file.sha256.size(), 64);
  {
    const qsakv::Overlay bare(pack + "/model-kvscales.safetensors");
    assert_string_equal(bare.info().scale_file_sha256, file.sha256.c_str());
  }
  // The entries written again: the same scale file (the same hash).
  const std::string again = root + "/again";
  qsakv::Overlay::write(again, file.layers, o);
  assert_string_equal(
      qsakv::Overlay::read_scale_file(again + "/model-kvscales.safetensors").sha256.c_str(),
      file.sha256.c_str());

  const std::string ckpt = root + "/calibrated";
  qsakv::Overlay::materialize(ckpt, base, pack);
  assert_true(read_file(ckpt + "/a.safetensors") == "weights");
  const std::string rev = qsakv::checkpoint_revision(ckpt);
  assert_string_equal(rev.c_str(), qsakv::checkpoint_revision(base).c_str());
  qsakv::Overlay ov(ckpt);
  assert_int_equal(ov.info().validated, 0);
  ov.validate(cfg, rev);
  assert_int_equal(ov.info().validated, 1);
  qsakv::Context ctx(QSAKV_BACKEND_CPU);
  auto co = qsakv::Cache::default_options();
  co.num_blocks = 2;
  const qsakv::Cache cache(ctx, cfg, &ov, co);
  for (int32_t i = 0; i < n; ++i) {
    const float* sc = cache.layer_buffers(layers[(size_t)i]).scales;  // host on the CPU
    assert_int_equal(bits(sc[0]), bits(ks[(size_t)i]));
    assert_int_equal(bits(sc[1]), bits(vs[(size_t)i]));
  }

  try {
    qsakv::Overlay::write(pack, layers.data(), ks.data(), vs.data(), n, o);
    fail_msg("writing over an existing pack did not throw");
  } catch (const qsakv::Error& err) {
    assert_int_equal(err.status(), QSAKV_ERROR_INVALID_ARGUMENT);
  }
  try {
    qsakv::Overlay::materialize(ckpt, base, pack);
    fail_msg("materialising into an existing directory did not throw");
  } catch (const qsakv::Error& err) {
    assert_int_equal(err.status(), QSAKV_ERROR_INVALID_ARGUMENT);
  }
  try {
    qsakv::Overlay::read_scale_file(root + "/no-such.safetensors");
    fail_msg("reading a missing scale file did not throw");
  } catch (const qsakv::Error& err) {
    assert_int_equal(err.status(), QSAKV_ERROR_IO);
  }
  try {
    ks[0] = 0;  // a bad scale: refused, nothing written
    qsakv::Overlay::write(root + "/bad", layers.data(), ks.data(), vs.data(), n, o);
    fail_msg("a zero scale did not throw");
  } catch (const qsakv::Error& err) {
    assert_int_equal(err.status(), QSAKV_ERROR_OVERLAY_BAD_SCALE);
  }
  const std::string cmd = "rm -rf " + root;
  assert_int_equal(std::system(cmd.c_str()), 0);
}

// A cache over caller-owned host memory (CPU backend): layout_for is the layout a cache
// of the same options has; the stores land in the caller's buffers at the offsets the
// layout gives, and every other byte keeps the caller's poison (the memory is not
// zeroed); layer_buffers equals the C call and names the caller's buffers;
// note_external_codes takes a QSA layer; undersized memory is refused naming the buffer.
static void test_cache_over_caller_memory(void** state) {
  (void)state;
  qsakv::Context ctx(QSAKV_BACKEND_CPU);
  auto cfg = qsakv::ModelConfig::preset("qwen4_exp");
  cfg.tp_size = 4;
  cfg.max_batched_tokens = 8;
  cfg.max_requests = 2;
  cfg.max_model_len = 256;
  cfg.kv_dtype = QSAKV_DTYPE_FP16;
  const auto g = qsakv::ModelConfig::rank_geometry(cfg);
  auto co = qsakv::Cache::default_options();
  co.num_blocks = 4;
  const qsakv_cache_layout L = qsakv::Cache::layout_for(cfg, co);
  const qsakv::Cache owned(ctx, cfg, nullptr, co);
  const qsakv_cache_layout lo = owned.layout();
  assert_int_equal(L.num_blocks, 4);
  assert_int_equal(L.kv_bytes_per_layer, lo.kv_bytes_per_layer);
  assert_int_equal(L.compressed_bytes_per_layer, lo.compressed_bytes_per_layer);
  assert_int_equal(L.ring_bytes_per_layer, lo.ring_bytes_per_layer);
  assert_int_equal(L.kv_stride_block, lo.kv_stride_block);
  assert_int_equal(L.kv_stride_kv, lo.kv_stride_kv);
  assert_int_equal(L.kv_stride_token, lo.kv_stride_token);
  assert_int_equal(L.kv_stride_head, lo.kv_stride_head);
  assert_int_equal(L.ring_length, lo.ring_length);
  assert_int_equal(L.compressed_stride_block, lo.compressed_stride_block);

  // Caller buffers, 16-byte aligned, poisoned.
  const int32_t nl = cfg.num_qsa_layers;
  const unsigned char poison = 0x55;
  auto alloc = [&](uint64_t bytes) {
    void* p = std::aligned_alloc(16, (size_t)((bytes + 15) / 16 * 16));
    assert_non_null(p);
    std::memset(p, poison, (size_t)bytes);
    return std::unique_ptr<void, void (*)(void*)>(p, std::free);
  };
  std::vector<std::unique_ptr<void, void (*)(void*)>> owned_by_test;
  std::vector<qsakv_layer_memory> lm((size_t)nl);
  for (auto& m : lm) {
    owned_by_test.push_back(alloc(L.kv_bytes_per_layer));
    m.kv = owned_by_test.back().get();
    m.kv_bytes = L.kv_bytes_per_layer;
    owned_by_test.push_back(alloc(L.compressed_bytes_per_layer));
    m.compressed_keys = owned_by_test.back().get();
    m.compressed_bytes = L.compressed_bytes_per_layer;
    owned_by_test.push_back(alloc(L.ring_bytes_per_layer));
    m.ring_keys = owned_by_test.back().get();
    m.ring_bytes = L.ring_bytes_per_layer;
  }
  auto mem = qsakv::Cache::cache_memory();
  assert_int_equal(mem.struct_size, sizeof mem);
  mem.num_layers = nl;
  mem.layers = lm.data();
  qsakv::Cache cache(ctx, cfg, nullptr, co, mem);
  assert_true(cache.layout().total_bytes < lo.total_bytes);  // the caller's memory not counted

  const int li = 2, layer = cfg.qsa_layers[li];
  const int n = 8, D = cfg.head_dim, KH = g.kv_heads, ID = cfg.index_head_dim;
  std::vector<uint16_t> k((size_t)n * KH * D), v(k.size()), rk((size_t)n * ID), ck(rk.size());
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = to_half(0.125f * (float)(i % 13 + 1));
    v[i] = to_half(-0.25f * (float)(i % 5 + 1));
  }
  for (size_t i = 0; i < rk.size(); ++i) {
    rk[i] = to_half(0.5f * (float)(i % 7 + 1));
    ck[i] = to_half(0.75f * (float)(i % 3 + 1));
  }
  std::vector<int64_t> slots(n), pos(n), cslots(n);
  std::vector<int32_t> req(n);
  for (int t = 0; t < n; ++t) {
    slots[t] = 30 * t + 3;  // blocks 0..3 of 64 tokens
    pos[t] = t / 2;         // ring entries 0..3 of each request: none written twice
    req[t] = t % 2;
    cslots[t] = (int64_t)cfg.compress_ratio * (8 * t + 1);  // compressed entries 8t + 1, pages 0..3
  }
  cache.store_kv(layer, k.data(), v.data(), slots.data(), n);  // host memory on the CPU
  cache.store_index_keys(layer, rk.data(), req.data(), pos.data(), n);
  cache.store_compressed_keys(layer, ck.data(), cslots.data(), n);

  // What the caller's buffers must hold: the poison, and each stored element where the
  // layout puts it.
  std::vector<unsigned char> want_kv((size_t)L.kv_bytes_per_layer, poison),
      want_ring((size_t)L.ring_bytes_per_layer, poison),
      want_ck((size_t)L.compressed_bytes_per_layer, poison);
  auto put = [](std::vector<unsigned char>& buf, uint64_t byte, uint16_t h) {
    assert_true(byte + 2 <= buf.size());
    std::memcpy(&buf[(size_t)byte], &h, 2);
  };
  for (int t = 0; t < n; ++t) {
    const int64_t b = slots[t] / cfg.block_size, o = slots[t] % cfg.block_size;
    for (int h = 0; h < KH; ++h)
      for (int d = 0; d < D; ++d) {
        const int64_t e = b * L.kv_stride_block + o * L.kv_stride_token + h * L.kv_stride_head + d;
        const size_t src = ((size_t)t * KH + h) * D + d;
        put(want_kv, 2 * (uint64_t)e, k[src]);
        put(want_kv, 2 * (uint64_t)(e + L.kv_stride_kv), v[src]);
      }
    const int64_t entry = (int64_t)req[t] * L.ring_length + pos[t] % L.ring_length;
    const int64_t centry = cslots[t] / cfg.compress_ratio;
    const int64_t page = centry / L.compressed_keys_per_block,
                  j = centry % L.compressed_keys_per_block;
    for (int d = 0; d < ID; ++d) {
      put(want_ring, 2 * (uint64_t)(entry * ID + d), rk[(size_t)t * ID + d]);
      put(want_ck, (uint64_t)(page * L.compressed_stride_block + 2 * (j * ID + d)),
          ck[(size_t)t * ID + d]);
    }
  }
  assert_memory_equal(lm[li].kv, want_kv.data(), want_kv.size());
  assert_memory_equal(lm[li].ring_keys, want_ring.data(), want_ring.size());
  assert_memory_equal(lm[li].compressed_keys, want_ck.data(), want_ck.size());
  // Another layer's buffers were not touched.
  assert_memory_equal(lm[0].kv, std::vector<unsigned char>(want_kv.size(), poison).data(),
                      want_kv.size());

  // layer_buffers: what the C call returns, the caller's buffers, unit scales (FP16).
  for (const qsakv::Cache* c : {(const qsakv::Cache*)&cache, &owned}) {
    for (int32_t i = 0; i < nl; ++i) {
      qsakv_layer_buffers raw;
      std::memset(&raw, 0, sizeof raw);
      raw.struct_size = sizeof raw;
      assert_int_equal(qsakv_cache_get_layer_buffers(c->get(), cfg.qsa_layers[i], &raw),
                       QSAKV_SUCCESS);
      const qsakv_layer_buffers b = c->layer_buffers(cfg.qsa_layers[i]);
      assert_int_equal(b.struct_size, sizeof b);
      assert_int_equal(b.version, QSAKV_LAYER_BUFFERS_VERSION);
      assert_ptr_equal(b.kv, raw.kv);
      assert_ptr_equal(b.compressed_keys, raw.compressed_keys);
      assert_ptr_equal(b.ring_keys, raw.ring_keys);
      assert_ptr_equal(b.topk, raw.topk);
      assert_ptr_equal(b.scales, raw.scales);
      assert_true(b.scales[0] == 1.0f && b.scales[1] == 1.0f);
      if (c == &cache) {
        assert_ptr_equal(b.kv, lm[(size_t)i].kv);
        assert_ptr_equal(b.compressed_keys, lm[(size_t)i].compressed_keys);
        assert_ptr_equal(b.ring_keys, lm[(size_t)i].ring_keys);
      }
    }
  }
  assert_true(cache.layer_buffers(cfg.qsa_layers[0]).kv !=
              cache.layer_buffers(cfg.qsa_layers[1]).kv);
  try {
    cache.layer_buffers(0);  // layer 0 is not a QSA layer
    fail_msg("layer_buffers of a non-QSA layer did not throw");
  } catch (const qsakv::Error& err) {
    assert_int_equal(err.status(), QSAKV_ERROR_INVALID_ARGUMENT);
  }

  cache.note_external_codes(layer);
  try {
    cache.note_external_codes(0);
    fail_msg("note_external_codes of a non-QSA layer did not throw");
  } catch (const qsakv::Error& err) {
    assert_int_equal(err.status(), QSAKV_ERROR_INVALID_ARGUMENT);
  }

  lm[1].kv_bytes = L.kv_bytes_per_layer - 16;  // too small: refused, naming the buffer
  try {
    qsakv::Cache bad(ctx, cfg, nullptr, co, mem);
    fail_msg("an undersized kv buffer did not throw");
  } catch (const qsakv::Error& err) {
    assert_int_equal(err.status(), QSAKV_ERROR_INVALID_ARGUMENT);
    assert_non_null(std::strstr(err.message().c_str(), "memory.layers[1].kv"));
  }
  co.num_blocks = 0;
  co.memory_budget_bytes = 1 << 30;
  try {
    qsakv::Cache::layout_for(cfg, co);
    fail_msg("layout_for without num_blocks did not throw");
  } catch (const qsakv::Error& err) {
    assert_int_equal(err.status(), QSAKV_ERROR_INVALID_ARGUMENT);
    assert_non_null(std::strstr(err.message().c_str(), "num_blocks"));
  }
}

// Calib::config is the config the handle was made for (live, a snapshot, a saved and
// loaded file); Calib::scale_from_max is the smallest FP32 s with 448 s >= max.
static void test_calib_config_and_scale_from_max(void** state) {
  (void)state;
  qsakv::Context ctx(QSAKV_BACKEND_CPU);
  auto cfg = qsakv::ModelConfig::preset("qwen4_exp");
  cfg.tp_size = 2;
  cfg.tp_rank = 1;
  cfg.speculative_tokens = 1;
  cfg.max_requests = 3;
  cfg.max_model_len = 4096;
  cfg.index_key_dtype = QSAKV_DTYPE_E4M3;
  qsakv::Calib live(ctx, cfg);
  const qsakv_model_config c = live.config();
  assert_memory_equal(&c, &cfg, sizeof c);
  const qsakv::Calib snap = live.snapshot();
  const qsakv_model_config cs = snap.config();
  assert_memory_equal(&cs, &cfg, sizeof cfg);
  char dir[] = "/tmp/qsakv-cpp-calibcfg-XXXXXX";
  assert_non_null(mkdtemp(dir));
  const std::string path = std::string(dir) + "/stats.safetensors";
  snap.save(path);
  const qsakv::Calib back = qsakv::Calib::load(path);
  const qsakv_model_config cb = back.config();
  // Every field round-trips through the file, the E4M3 index keys included.
  assert_memory_equal(&cb, &cfg, sizeof cfg);
  std::remove(path.c_str());
  std::remove(dir);

  assert_true(qsakv::Calib::scale_from_max(448.0f) == 1.0f);
  assert_true(qsakv::Calib::scale_from_max(3.5f) == 0.0078125f);  // 3.5 / 448 = 2^-7
  for (float m : {3.0f, 1.0f, 1e-3f, 65504.0f, 0.1f}) {
    const float s = qsakv::Calib::scale_from_max(m);
    float want = 0;
    assert_int_equal(qsakv_calib_scale_from_max(m, &want), QSAKV_SUCCESS);
    assert_int_equal(bits(s), bits(want));
    assert_true(448.0 * (double)s >= (double)m);  // no calibration value saturates
    assert_true(448.0 * (double)std::nextafter(s, 0.0f) < (double)m);  // and the smallest
  }
  for (float m : {0.0f, -1.0f, NAN, INFINITY}) {
    try {
      qsakv::Calib::scale_from_max(m);
      fail_msg("scale_from_max(%g) did not throw", (double)m);
    } catch (const qsakv::Error& err) {
      assert_int_equal(err.status(), QSAKV_ERROR_OVERLAY_BAD_SCALE);
    }
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_pipeline_matches_fp64),
      cmocka_unit_test(test_store_step_equals_the_three_stores),
      cmocka_unit_test(test_errors_carry_status_and_message),
      cmocka_unit_test(test_handles_move_and_free),
      cmocka_unit_test(test_tp_consensus_and_checkpoint_config),
      cmocka_unit_test(test_index_key_dtype),
      cmocka_unit_test(test_calibration_to_scale_pack),
      cmocka_unit_test(test_overlay_write_read_materialize),
      cmocka_unit_test(test_cache_over_caller_memory),
      cmocka_unit_test(test_calib_config_and_scale_from_max),
  };
  return cmocka_run_group_tests_name("cpp_raii", tests, NULL, NULL);
}
