// SPDX-License-Identifier: Apache-2.0
#include "core/calib/stats_file.hpp"

#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/checked.hpp"
#include "core/config.hpp"
#include "core/dtype.hpp"
#include "core/error.hpp"
#include "core/format/file_io.hpp"
#include "core/format/json_strict.hpp"
#include "core/format/safetensors.hpp"

namespace qsakv {
namespace calib {

namespace {

// The largest valid statistics file: 512 QSA layers x 2 x (3 + 4096) uint64 words
// (33.6 MB), their maxima and a few KiB of header. 64 MiB leaves room and bounds what a
// hostile file costs before it is refused (a 1 GiB bound let one cost a gigabyte).
constexpr uint64_t kMaxStatsBytes = 64ull << 20;
static_assert(uint64_t{QSAKV_MAX_LAYERS} * 2 * kEntryWords * 8 + (1u << 20) < kMaxStatsBytes,
              "the stats file bound must hold the largest valid file");

json config_json(const qsakv_model_config& c) {
  json j = json::object();
  j["num_layers"] = c.num_layers;
  json q = json::array();
  for (int i = 0; i < c.num_qsa_layers; ++i) q.push_back(c.qsa_layers[i]);
  j["qsa_layers"] = q;
  j["num_q_heads"] = c.num_q_heads;
  j["num_kv_heads"] = c.num_kv_heads;
  j["head_dim"] = c.head_dim;
  j["softmax_scale"] = c.softmax_scale;
  j["index_num_heads"] = c.index_num_heads;
  j["index_head_dim"] = c.index_head_dim;
  j["compress_ratio"] = c.compress_ratio;
  j["topk_tokens"] = c.topk_tokens;
  j["tp_size"] = c.tp_size;
  j["tp_rank"] = c.tp_rank;
  j["speculative_tokens"] = c.speculative_tokens;
  j["activation_dtype"] = dtype_name(c.activation_dtype);
  j["kv_dtype"] = dtype_name(c.kv_dtype);
  j["block_size"] = c.block_size;
  j["max_requests"] = c.max_requests;
  j["max_batched_tokens"] = c.max_batched_tokens;
  j["max_model_len"] = c.max_model_len;
  j["index_key_dtype"] = dtype_name(c.index_key_dtype);
  return j;
}

qsakv_dtype dtype_of(const std::string& n) {
  for (qsakv_dtype d : {QSAKV_DTYPE_FP16, QSAKV_DTYPE_BF16, QSAKV_DTYPE_E4M3, QSAKV_DTYPE_FP32})
    if (n == dtype_name(d)) return d;
  return QSAKV_DTYPE_INVALID;
}

int32_t get_int(const json& j, const char* key, const std::string& what) {
  if (!j.contains(key) || !j[key].is_number_integer())
    fail(QSAKV_ERROR_FORMAT, "%s: config.%s is missing or not an integer", what.c_str(), key);
  const int64_t v = j[key].get<int64_t>();
  if (v < INT32_MIN || v > INT32_MAX)
    fail(QSAKV_ERROR_FORMAT, "%s: config.%s is out of range", what.c_str(), key);
  return static_cast<int32_t>(v);
}

qsakv_model_config parse_config(const std::string& text, const std::string& what) {
  const json j = parse_json_strict(text, what + " metadata \"config\"");
  if (!j.is_object()) fail(QSAKV_ERROR_FORMAT, "%s: config is not a JSON object", what.c_str());
  static const char* const kKeys[] = {
      "num_layers",         "qsa_layers",         "num_q_heads",     "num_kv_heads",
      "head_dim",           "softmax_scale",      "index_num_heads", "index_head_dim",
      "compress_ratio",     "topk_tokens",        "tp_size",         "tp_rank",
      "speculative_tokens", "activation_dtype",   "kv_dtype",        "block_size",
      "max_requests",       "max_batched_tokens", "max_model_len",   "index_key_dtype"};
  for (const auto& kv : j.items()) {
    bool known = false;
    for (const char* k : kKeys) known |= kv.key() == k;
    if (!known)
      fail(QSAKV_ERROR_FORMAT, "%s: config has an unknown field \"%s\"", what.c_str(),
           kv.key().c_str());
  }
  qsakv_model_config c = default_model_config();
  c.num_layers = get_int(j, "num_layers", what);
  if (!j.contains("qsa_layers") || !j["qsa_layers"].is_array() ||
      j["qsa_layers"].size() > QSAKV_MAX_LAYERS)
    fail(QSAKV_ERROR_FORMAT, "%s: config.qsa_layers is missing or not an array of at most %d",
         what.c_str(), QSAKV_MAX_LAYERS);
  for (const json& q : j["qsa_layers"]) {
    if (!q.is_number_integer() || q.get<int64_t>() < 0 || q.get<int64_t>() > INT32_MAX)
      fail(QSAKV_ERROR_FORMAT, "%s: config.qsa_layers holds %s", what.c_str(),
           json_excerpt(q).c_str());
    c.qsa_layers[c.num_qsa_layers++] = static_cast<int32_t>(q.get<int64_t>());
  }
  c.num_q_heads = get_int(j, "num_q_heads", what);
  c.num_kv_heads = get_int(j, "num_kv_heads", what);
  c.head_dim = get_int(j, "head_dim", what);
  if (!j.contains("softmax_scale") || !j["softmax_scale"].is_number())
    fail(QSAKV_ERROR_FORMAT, "%s: config.softmax_scale is missing or not a number", what.c_str());
  c.softmax_scale = j["softmax_scale"].get<float>();
  c.index_num_heads = get_int(j, "index_num_heads", what);
  c.index_head_dim = get_int(j, "index_head_dim", what);
  c.compress_ratio = get_int(j, "compress_ratio", what);
  c.topk_tokens = get_int(j, "topk_tokens", what);
  c.tp_size = get_int(j, "tp_size", what);
  c.tp_rank = get_int(j, "tp_rank", what);
  c.speculative_tokens = get_int(j, "speculative_tokens", what);
  for (const char* k : {"activation_dtype", "kv_dtype"})
    if (!j.contains(k) || !j[k].is_string() ||
        dtype_of(j[k].get<std::string>()) == QSAKV_DTYPE_INVALID)
      fail(QSAKV_ERROR_FORMAT, "%s: config.%s is missing or not a dtype name", what.c_str(), k);
  c.activation_dtype = dtype_of(j["activation_dtype"].get<std::string>());
  c.kv_dtype = dtype_of(j["kv_dtype"].get<std::string>());
  c.block_size = get_int(j, "block_size", what);
  c.max_requests = get_int(j, "max_requests", what);
  c.max_batched_tokens = get_int(j, "max_batched_tokens", what);
  c.max_model_len = get_int(j, "max_model_len", what);
  // Files written before the field existed hold FP16 index keys (the default then).
  if (j.contains("index_key_dtype")) {
    const json& d = j["index_key_dtype"];
    if (!d.is_string() || dtype_of(d.get<std::string>()) == QSAKV_DTYPE_INVALID)
      fail(QSAKV_ERROR_FORMAT, "%s: config.index_key_dtype is not a dtype name", what.c_str());
    c.index_key_dtype = dtype_of(d.get<std::string>());
  }
  try {
    validate_config(c);
  } catch (const Error& e) {
    fail(QSAKV_ERROR_FORMAT, "%s: the recorded config is invalid: %s", what.c_str(), e.what());
  }
  return c;
}

const std::string& need_meta(const Safetensors& st, const char* key, const std::string& what) {
  const std::string* v = st.meta(key);
  if (!v) fail(QSAKV_ERROR_FORMAT, "%s: metadata \"%s\" is missing", what.c_str(), key);
  return *v;
}

int64_t meta_int(const Safetensors& st, const char* key, const std::string& what) {
  const std::string& v = need_meta(st, key, what);
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || errno || *end)
    fail(QSAKV_ERROR_FORMAT, "%s: metadata \"%s\" is \"%s\", not an integer", what.c_str(), key,
         v.c_str());
  return x;
}

const SafetensorsTensor& need_tensor(const Safetensors& st, const char* name, const char* dtype,
                                     const std::vector<uint64_t>& shape, const std::string& what) {
  for (const SafetensorsTensor& t : st.tensors) {
    if (t.name != name) continue;
    if (t.dtype != dtype || t.shape != shape) {
      std::string want, got;
      for (uint64_t d : shape)
        want += format(want.empty() ? "%llu" : ", %llu", (unsigned long long)d);
      for (uint64_t d : t.shape)
        got += format(got.empty() ? "%llu" : ", %llu", (unsigned long long)d);
      fail(QSAKV_ERROR_FORMAT, "%s: tensor \"%s\" is %s [%s]; expected %s [%s]", what.c_str(), name,
           t.dtype.c_str(), got.c_str(), dtype, want.c_str());
    }
    return t;
  }
  fail(QSAKV_ERROR_FORMAT, "%s: tensor \"%s\" is missing", what.c_str(), name);
}

void append_tensor(json& header, std::string& data, const char* name, const char* dtype,
                   const std::vector<uint64_t>& shape, const void* bytes, size_t n) {
  json e = json::object();
  e["dtype"] = dtype;
  e["shape"] = shape;
  e["data_offsets"] = {data.size(), data.size() + n};
  header[name] = e;
  data.append(static_cast<const char*>(bytes), n);  // little-endian hosts only (x86, ARM)
}

}  // namespace

std::string write_stats(const HostStats& s) {
  const qsakv_model_config& c = s.config;
  json header = json::object();
  json meta = json::object();
  meta["format"] = kStatsFormat;
  meta["schema_version"] = std::to_string(kStatsSchemaVersion);
  meta["config_fingerprint"] = s.fingerprint;
  meta["config"] = config_json(c).dump();
  meta["tp_size"] = std::to_string(c.tp_size);
  meta["rank"] = std::to_string(s.rank);
  meta["num_runs"] = std::to_string(s.num_runs);
  meta["reduced"] = s.reduced ? "1" : "0";
  meta["hist_bins"] = std::to_string(kBins);
  meta["hist_log2_min"] = std::to_string(kLog2Min);
  meta["hist_log2_max"] = std::to_string(kLog2Max);
  header["__metadata__"] = meta;
  std::string data;
  const uint64_t nq = static_cast<uint64_t>(c.num_qsa_layers);
  // U64 first so every tensor stays naturally aligned in the data section.
  append_tensor(header, data, "words", "U64", {nq, 2, kEntryWords}, s.words.data(),
                s.words.size() * sizeof(uint64_t));
  append_tensor(header, data, "max_abs", "F32", {nq, 2}, s.max_abs.data(),
                s.max_abs.size() * sizeof(float));
  append_tensor(header, data, "ranks", "U8", {static_cast<uint64_t>(c.tp_size)}, s.ranks.data(),
                s.ranks.size());
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // data section 8-byte aligned
  std::string file(8, '\0');
  for (int i = 0; i < 8; ++i)
    file[i] = static_cast<char>((uint64_t(text.size()) >> (8 * i)) & 0xff);
  return file + text + data;
}

HostStats parse_stats(const std::string& file, const std::string& what) {
  const Safetensors st = parse_safetensors(file, what);
  if (need_meta(st, "format", what) != kStatsFormat)
    fail(QSAKV_ERROR_FORMAT,
         "%s: metadata format is \"%s\", not \"%s\" (not a calibration "
         "statistics file)",
         what.c_str(), need_meta(st, "format", what).c_str(), kStatsFormat);
  if (meta_int(st, "schema_version", what) != kStatsSchemaVersion)
    fail(QSAKV_ERROR_FORMAT, "%s: schema_version is %s; this library reads version %d",
         what.c_str(), need_meta(st, "schema_version", what).c_str(), kStatsSchemaVersion);
  if (meta_int(st, "hist_bins", what) != kBins || meta_int(st, "hist_log2_min", what) != kLog2Min ||
      meta_int(st, "hist_log2_max", what) != kLog2Max)
    fail(QSAKV_ERROR_FORMAT,
         "%s: histogram is %s bins over [2^%s, 2^%s]; this library uses %d "
         "over [2^%d, 2^%d]",
         what.c_str(), need_meta(st, "hist_bins", what).c_str(),
         need_meta(st, "hist_log2_min", what).c_str(), need_meta(st, "hist_log2_max", what).c_str(),
         kBins, kLog2Min, kLog2Max);
  HostStats s;
  s.config = parse_config(need_meta(st, "config", what), what);
  s.fingerprint = config_fingerprint(s.config);
  if (need_meta(st, "config_fingerprint", what) != s.fingerprint)
    fail(QSAKV_ERROR_FORMAT,
         "%s: config_fingerprint %s does not match the recorded config "
         "(whose fingerprint is %s)",
         what.c_str(), need_meta(st, "config_fingerprint", what).c_str(), s.fingerprint.c_str());
  const int64_t tp = meta_int(st, "tp_size", what);
  if (tp != s.config.tp_size)
    fail(QSAKV_ERROR_FORMAT, "%s: tp_size is %lld, the config says %d", what.c_str(),
         static_cast<long long>(tp), s.config.tp_size);
  const int64_t rank = meta_int(st, "rank", what);
  if (rank < -1 || rank >= tp)
    fail(QSAKV_ERROR_FORMAT, "%s: rank is %lld; -1 (merged) or 0..%lld", what.c_str(),
         static_cast<long long>(rank), static_cast<long long>(tp - 1));
  s.rank = static_cast<int32_t>(rank);
  const int64_t runs = meta_int(st, "num_runs", what);
  if (runs < 1 || runs > INT32_MAX)
    fail(QSAKV_ERROR_FORMAT, "%s: num_runs is %lld; 1 or more", what.c_str(),
         static_cast<long long>(runs));
  s.num_runs = static_cast<int32_t>(runs);
  const std::string& reduced = need_meta(st, "reduced", what);
  if (reduced != "0" && reduced != "1")
    fail(QSAKV_ERROR_FORMAT, "%s: reduced is \"%s\"; \"0\" or \"1\"", what.c_str(),
         reduced.c_str());
  s.reduced = reduced == "1";
  if (st.tensors.size() != 3)
    fail(QSAKV_ERROR_FORMAT,
         "%s: %zu tensors; a statistics file holds exactly words, max_abs "
         "and ranks",
         what.c_str(), st.tensors.size());
  const uint64_t nq = static_cast<uint64_t>(s.config.num_qsa_layers);
  const SafetensorsTensor& w = need_tensor(st, "words", "U64", {nq, 2, kEntryWords}, what);
  const SafetensorsTensor& m = need_tensor(st, "max_abs", "F32", {nq, 2}, what);
  const SafetensorsTensor& r = need_tensor(st, "ranks", "U8", {static_cast<uint64_t>(tp)}, what);
  s.words.resize(nq * 2 * kEntryWords);
  std::memcpy(s.words.data(), st.bytes(w), s.words.size() * sizeof(uint64_t));
  s.max_abs.resize(nq * 2);
  std::memcpy(s.max_abs.data(), st.bytes(m), s.max_abs.size() * sizeof(float));
  s.ranks.assign(st.bytes(r), st.bytes(r) + tp);
  for (int64_t i = 0; i < tp; ++i)
    if (s.ranks[i] > 1)
      fail(QSAKV_ERROR_FORMAT, "%s: ranks[%lld] is %d; 0 or 1", what.c_str(),
           static_cast<long long>(i), s.ranks[i]);
  if (s.ranks_covered() == 0)
    fail(QSAKV_ERROR_FORMAT, "%s: the statistics cover no TP rank", what.c_str());
  if (rank >= 0 && (s.ranks_covered() != 1 || !s.ranks[rank]))
    fail(QSAKV_ERROR_FORMAT, "%s: rank is %lld but ranks marks %d rank(s)", what.c_str(),
         static_cast<long long>(rank), s.ranks_covered());
  // The counts must tell one consistent story, or a summary built on them means nothing.
  check_consistent(s, QSAKV_ERROR_FORMAT, what);
  return s;
}

void save_stats(const HostStats& s, const std::string& path) {
  if (path_kind(path, "statistics file") != PathKind::missing)
    fail(QSAKV_ERROR_INVALID_ARGUMENT,
         "statistics file %s already exists; refusing to "
         "overwrite it",
         path.c_str());
  const std::string bytes = write_stats(s);
  // A temporary beside the target, then a rename that never replaces: readers see the
  // whole file or none.
  std::string tmp = path + ".tmp-XXXXXX";
  const int fd = ::mkstemp(&tmp[0]);
  if (fd < 0) fail(QSAKV_ERROR_IO, "cannot create %s: %s", tmp.c_str(), std::strerror(errno));
  // mkstemp made it 0600; the published file is readable like write_file's.
  const int mode_rc = ::fchmod(fd, static_cast<mode_t>(published_file_mode()));
  const int mode_err = errno;
  ::close(fd);
  if (mode_rc != 0) {
    ::unlink(tmp.c_str());
    fail(QSAKV_ERROR_IO, "cannot set the mode of %s: %s", tmp.c_str(), std::strerror(mode_err));
  }
  try {
    write_file(tmp, bytes);
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  int rc = ::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, path.c_str(), RENAME_NOREPLACE);
  // File systems without the flag: link(2) never replaces either.
  if (rc != 0 && (errno == EINVAL || errno == ENOSYS)) {
    rc = ::link(tmp.c_str(), path.c_str());
    if (rc == 0) ::unlink(tmp.c_str());
  }
  if (rc != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    fail(err == EEXIST ? QSAKV_ERROR_INVALID_ARGUMENT : QSAKV_ERROR_IO,
         "cannot publish statistics file %s: %s", path.c_str(), std::strerror(err));
  }
}

HostStats load_stats(const std::string& path) {
  return parse_stats(read_file(path, kMaxStatsBytes, "statistics file", QSAKV_ERROR_IO), path);
}

}  // namespace calib
}  // namespace qsakv
