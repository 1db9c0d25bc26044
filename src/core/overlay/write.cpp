// SPDX-License-Identifier: Apache-2.0
#include "core/overlay/write.hpp"

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <set>

#include <dirent.h>
#include <unistd.h>

#include "core/checked.hpp"
#include "core/error.hpp"
#include "core/format/file_io.hpp"
#include "core/overlay/index.hpp"
#include "core/overlay/overlay.hpp"
#include "core/overlay/provenance.hpp"
#include "core/format/safetensors.hpp"
#include "core/format/sha256.hpp"

namespace qsakv {

namespace {

constexpr uint64_t kMaxIndexBytes = 256u << 20;
constexpr uint64_t kMaxPackFileBytes = 256u << 20;

struct Base {
  std::string index_path;
  std::string index_sha256;
  CheckpointIndex index;
};

Base read_base_index(const std::string& path) {
  Base b;
  b.index_path = path;
  const std::string text = read_file(path, kMaxIndexBytes, "base checkpoint index", QSAKV_ERROR_IO);
  b.index_sha256 = sha256_hex(text);
  b.index = parse_index(text, path);
  return b;
}

void refuse_base_names(const Base& b, const std::vector<std::string>& names) {
  for (const std::string& n : names) {
    const auto it = b.index.weight_map.find(n);
    if (it != b.index.weight_map.end())
      fail(QSAKV_ERROR_OVERLAY_DUPLICATE,
           "\"%s\" is already in the base checkpoint (%s maps it to %s)", n.c_str(),
           b.index_path.c_str(), it->second.c_str());
  }
}

void check_write_options(const qsakv_overlay_write_options& o) {
  if (!o.base_index_path)
    fail(QSAKV_ERROR_INVALID_ARGUMENT,
         "options.base_index_path is NULL; the manifest binds "
         "the overlay to the base checkpoint's model.safetensors.index.json");
  if (!*o.base_index_path) fail(QSAKV_ERROR_INVALID_ARGUMENT, "options.base_index_path is empty");
  if (o.contract_tp_size < 0 || o.contract_tp_size > kMaxContractTpSize)
    fail(QSAKV_ERROR_INVALID_ARGUMENT,
         "options.contract_tp_size is %d; 0 (not constrained) or 1..%d", o.contract_tp_size,
         kMaxContractTpSize);
  if (o.contract_speculative_tokens < -1 ||
      o.contract_speculative_tokens > kMaxContractSpeculativeTokens)
    fail(QSAKV_ERROR_INVALID_ARGUMENT,
         "options.contract_speculative_tokens is %d; -1 (not constrained) or 0..%d",
         o.contract_speculative_tokens, kMaxContractSpeculativeTokens);
  const int32_t act = enum_value(o.contract_activation_dtype);
  if (act != QSAKV_DTYPE_INVALID && act != QSAKV_DTYPE_FP16 && act != QSAKV_DTYPE_BF16)
    fail(QSAKV_ERROR_INVALID_ARGUMENT,
         "options.contract_activation_dtype is %d; INVALID "
         "(unconstrained), FP16 or BF16",
         act);
  if (o.contract_min_sm < 0 || o.contract_min_sm > kMaxContractMinSm)
    fail(QSAKV_ERROR_INVALID_ARGUMENT,
         "options.contract_min_sm is %d; 0 (not constrained) or 1..%d", o.contract_min_sm,
         kMaxContractMinSm);
  if (o.unit_scale_control != 0 && o.unit_scale_control != 1)
    fail(QSAKV_ERROR_INVALID_ARGUMENT, "options.unit_scale_control is %d; 0 or 1",
         o.unit_scale_control);
}

void check_scale(int32_t layer, const char* kind, float v) {
  if (!valid_scale(v))
    fail(QSAKV_ERROR_OVERLAY_BAD_SCALE, "layer %d %s is %s; %s", layer, kind, scale_text(v).c_str(),
         kScaleRule);
}

struct Entry {
  int32_t layer;
  float k, v;
};

std::vector<Entry> collect(const int32_t* layers, const float* k, const float* v, int32_t n) {
  std::vector<Entry> e;
  std::set<int32_t> seen;
  for (int32_t i = 0; i < n; ++i) {
    if (layers[i] < 0)
      fail(QSAKV_ERROR_INVALID_ARGUMENT, "layers[%d] is %d; layer ids are >= 0", i, layers[i]);
    if (!seen.insert(layers[i]).second)
      fail(QSAKV_ERROR_OVERLAY_DUPLICATE, "layer %d is given twice", layers[i]);
    check_scale(layers[i], "k_scale", k[i]);
    check_scale(layers[i], "v_scale", v[i]);
    e.push_back({layers[i], k[i], v[i]});
  }
  std::sort(e.begin(), e.end(), [](const Entry& a, const Entry& b) { return a.layer < b.layer; });
  return e;
}

std::string real_path(const std::string& p) {
  std::unique_ptr<char, decltype(&std::free)> r(::realpath(p.c_str(), nullptr), &std::free);
  if (!r) fail(QSAKV_ERROR_IO, "cannot resolve %s: %s", p.c_str(), std::strerror(errno));
  return r.get();
}

std::vector<std::string> list_dir(const std::string& dir) {
  struct Closer {
    void operator()(DIR* d) const { ::closedir(d); }
  };
  std::unique_ptr<DIR, Closer> d(::opendir(dir.c_str()));
  if (!d) fail(QSAKV_ERROR_IO, "cannot list %s: %s", dir.c_str(), std::strerror(errno));
  std::vector<std::string> names;
  while (const dirent* e = ::readdir(d.get())) {
    const std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(n);
  }
  std::sort(names.begin(), names.end());
  return names;
}

// The base's index with the scale names added and the scale file's size counted.
std::string merged_index(const Base& b, const qsakv_overlay& o, uint64_t scale_bytes) {
  json doc = b.index.document;
  for (const OverlayTensor& t : o.tensors) doc["weight_map"][t.name] = kScaleFileName;
  if (doc.contains("metadata") && doc["metadata"].is_object() &&
      doc["metadata"].contains("total_size")) {
    json& total = doc["metadata"]["total_size"];
    if (!total.is_number_unsigned())
      fail(QSAKV_ERROR_FORMAT, "%s: metadata.total_size is %s, not a byte count",
           b.index_path.c_str(), json_excerpt(total).c_str());
    uint64_t grown = 0;
    if (!add_u64(total.get<uint64_t>(), scale_bytes, &grown))
      fail(QSAKV_ERROR_FORMAT,
           "%s: metadata.total_size %llu plus the scale file's %llu bytes "
           "does not fit in 64 bits",
           b.index_path.c_str(), static_cast<unsigned long long>(total.get<uint64_t>()),
           static_cast<unsigned long long>(scale_bytes));
    total = grown;
  }
  return doc.dump(2) + "\n";
}

// Links every base file except the index, which the merged one replaces.
void link_base_files(const std::string& base_real, const std::string& staging) {
  for (const std::string& n : list_dir(base_real)) {
    if (n == kScaleFileName || n == kManifestFileName || n == kProvenanceFileName)
      fail(QSAKV_ERROR_OVERLAY_DUPLICATE, "the base checkpoint %s already has %s",
           base_real.c_str(), n.c_str());
    if (n == kIndexFileName) continue;
    const std::string target = join_path(base_real, n);
    if (::symlink(target.c_str(), join_path(staging, n).c_str()) != 0)
      fail(QSAKV_ERROR_IO, "cannot link %s: %s", target.c_str(), std::strerror(errno));
  }
}

}  // namespace

qsakv_overlay_write_options default_write_options() {
  qsakv_overlay_write_options o =
      QSAKV_OVERLAY_WRITE_OPTIONS_INIT;  // the header's defaults, one definition
  return o;
}

void overlay_write(const std::string& out_dir, const int32_t* layers, const float* k_scales,
                   const float* v_scales, int32_t num_layers,
                   const qsakv_overlay_write_options& opt) {
  if (num_layers <= 0 || num_layers > QSAKV_MAX_LAYERS)
    fail(QSAKV_ERROR_INVALID_ARGUMENT, "num_layers is %d; 1..%d", num_layers, QSAKV_MAX_LAYERS);
  check_write_options(opt);
  const std::string prefix = opt.layer_prefix ? opt.layer_prefix : "model.layers";
  if (!valid_layer_prefix(prefix))
    fail(QSAKV_ERROR_INVALID_ARGUMENT, "options.layer_prefix \"%s\" is not a dotted name",
         prefix.c_str());
  const std::vector<Entry> entries = collect(layers, k_scales, v_scales, num_layers);
  std::vector<F32Scalar> tensors;
  Manifest m;
  for (const Entry& e : entries)
    for (ScaleKind kind : {ScaleKind::k, ScaleKind::v}) {
      const std::string name = canonical_scale_name(prefix, e.layer, kind);
      tensors.push_back({name, kind == ScaleKind::k ? e.k : e.v});
      m.tensor_names.push_back(name);
    }
  const Base base = read_base_index(opt.base_index_path);
  refuse_base_names(base, m.tensor_names);
  require_absent(out_dir, "overlay output directory");
  const std::string scale_file = write_safetensors_f32_scalars(
      tensors, {{"format", "pt"},
                {kMetaScaleContract, kScaleContract},
                {kMetaUnitScaleControl, opt.unit_scale_control ? "1" : "0"}});
  m.base_index_sha256 = base.index_sha256;
  m.scale_file_sha256 = sha256_hex(scale_file);
  m.layer_prefix = prefix;
  m.unit_scale_control = opt.unit_scale_control != 0;
  m.contract = {opt.contract_tp_size, opt.contract_speculative_tokens,
                opt.contract_activation_dtype, opt.contract_min_sm};
  StagingDir staging(out_dir);
  write_file(join_path(staging.path(), kScaleFileName), scale_file);
  write_file(join_path(staging.path(), kManifestFileName), write_manifest(m));
  staging.commit();
}

void overlay_materialize(const std::string& out_dir, const std::string& base_dir,
                         const std::string& pack_dir) {
  const Base base = read_base_index(join_path(base_dir, kIndexFileName));
  std::unique_ptr<qsakv_overlay> o(overlay_load(pack_dir, nullptr));
  if (o->manifest.base_index_sha256 != base.index_sha256)
    fail(QSAKV_ERROR_REVISION_MISMATCH,
         "base checkpoint index SHA-256 is %s, the overlay was made for %s",
         base.index_sha256.c_str(), o->manifest.base_index_sha256.c_str());
  refuse_base_names(base, o->manifest.tensor_names);
  require_absent(out_dir, "checkpoint output directory");
  // Copy from the bytes re-read and re-hashed now, not from what load saw earlier.
  const std::string scale = read_file(o->scale_file, kMaxPackFileBytes, "overlay scale file",
                                      QSAKV_ERROR_OVERLAY_MISSING);
  const std::string manifest_path = join_path(pack_dir, kManifestFileName);
  const std::string manifest =
      read_file(manifest_path, kMaxPackFileBytes, "overlay manifest", QSAKV_ERROR_OVERLAY_MISSING);
  // Both must be the bytes the load checked: a manifest edited so that it still lists the
  // scale file's hash (a contract widened) has changed as much as a scale file.
  const std::string scale_sha = sha256_hex(scale);
  const std::string manifest_sha = sha256_hex(manifest);
  if (scale_sha != o->scale_file_sha256)
    fail(QSAKV_ERROR_HASH_MISMATCH,
         "scale file %s changed while the checkpoint was built: its SHA-256 was %s when the "
         "pack was loaded and checked, %s when it was read again to be copied",
         o->scale_file.c_str(), o->scale_file_sha256.c_str(), scale_sha.c_str());
  if (manifest_sha != o->manifest_sha256)
    fail(QSAKV_ERROR_HASH_MISMATCH,
         "manifest %s changed while the checkpoint was built: its SHA-256 was %s when the "
         "pack was loaded and checked, %s when it was read again to be copied",
         manifest_path.c_str(), o->manifest_sha256.c_str(), manifest_sha.c_str());
  const std::string index = merged_index(base, *o, scale.size());
  const std::string base_real = real_path(base_dir);
  // The provenance file records the base's path in JSON, which holds UTF-8 only: a path
  // that is not UTF-8 is refused up front, naming the byte, rather than written mangled.
  size_t bad = 0;
  if (!utf8_valid(base_real, &bad))
    fail(QSAKV_ERROR_INVALID_ARGUMENT,
         "base_checkpoint_dir resolves to a path that is not "
         "valid UTF-8 (byte 0x%02x at offset %zu of \"%s\"); qsakv-provenance.json records "
         "that path as JSON text, so rename the directory (or link it under a UTF-8 name)",
         static_cast<unsigned char>(base_real[bad]), bad, utf8_escaped(base_real).c_str());
  const Provenance prov{base_real, base.index_sha256, sha256_hex(index),
                        scale_sha, manifest_sha,      qsakv_version_string()};
  StagingDir staging(out_dir);
  link_base_files(base_real, staging.path());
  write_file(join_path(staging.path(), kScaleFileName), scale);
  write_file(join_path(staging.path(), kManifestFileName), manifest);
  write_file(join_path(staging.path(), kIndexFileName), index);
  write_file(join_path(staging.path(), kProvenanceFileName), write_provenance(prov));
  staging.commit();
}

}  // namespace qsakv
