// SPDX-License-Identifier: Apache-2.0
// qsakv_overlay_load: finding, reading and cross-checking the overlay files.
#include <memory>
#include <set>

#include "core/error.hpp"
#include "core/format/file_io.hpp"
#include "core/overlay/index.hpp"
#include "core/overlay/overlay.hpp"
#include "core/overlay/provenance.hpp"
#include "core/format/safetensors.hpp"
#include "core/format/sha256.hpp"

namespace qsakv {

namespace {

// Bounds on what is read into memory. A scale file holds a few dozen scalars; the
// bound is the header limit plus room for data, so only a hostile file reaches it.
constexpr uint64_t kMaxScaleFileBytes = kMaxHeaderBytes + (64u << 20);
constexpr uint64_t kMaxManifestBytes = 16u << 20;
constexpr uint64_t kMaxIndexBytes = 256u << 20;

struct Paths {
  std::string scale;
  std::string manifest;
  std::string index;  // "" when there is none
  std::string dir;    // the directory holding the scale file
};

Paths locate(const std::string& path, const char* manifest_path) {
  Paths p;
  switch (path_kind(path, "overlay path")) {
    case PathKind::missing:
      fail(QSAKV_ERROR_OVERLAY_MISSING, "overlay not found: %s does not exist", path.c_str());
    case PathKind::directory: {
      p.dir = path;
      p.scale = join_path(path, kScaleFileName);
      p.manifest = join_path(path, kManifestFileName);
      const std::string index = join_path(path, kIndexFileName);
      if (path_kind(index, "checkpoint index") != PathKind::missing) p.index = index;
      break;
    }
    case PathKind::file:
      p.dir = dir_name(path);
      p.scale = path;
      p.manifest = join_path(p.dir, kManifestFileName);
      break;
    case PathKind::other:
      fail(QSAKV_ERROR_IO, "overlay path %s is neither a file nor a directory", path.c_str());
  }
  if (manifest_path) p.manifest = manifest_path;
  return p;
}

// The file's own metadata must not contradict the manifest.
void check_metadata(const Safetensors& st, const qsakv_overlay& o) {
  if (const std::string* c = st.meta(kMetaScaleContract))
    if (*c != kScaleContract)
      fail(QSAKV_ERROR_FORMAT, "%s: metadata %s is \"%s\"; this library implements \"%s\"",
           o.scale_file.c_str(), kMetaScaleContract, c->c_str(), kScaleContract);
  if (const std::string* u = st.meta(kMetaUnitScaleControl)) {
    if (*u != "0" && *u != "1")
      fail(QSAKV_ERROR_FORMAT, "%s: metadata %s is \"%s\", not \"0\" or \"1\"",
           o.scale_file.c_str(), kMetaUnitScaleControl, u->c_str());
    if ((*u == "1") != o.manifest.unit_scale_control)
      fail(QSAKV_ERROR_FORMAT, "%s: metadata %s is %s but the manifest says %s",
           o.scale_file.c_str(), kMetaUnitScaleControl, u->c_str(),
           o.manifest.unit_scale_control ? "true" : "false");
  }
}

std::vector<OverlayTensor> describe(const Safetensors& st) {
  std::vector<OverlayTensor> out;
  for (const SafetensorsTensor& t : st.tensors) {
    OverlayTensor o;
    o.name = t.name;
    o.dtype = t.dtype;
    o.shape = t.shape;
    o.f32_scalar = is_f32_scalar(t);
    if (o.f32_scalar) o.value = read_f32(st, t);
    o.is_scale_name = parse_scale_name(t.name, &o.scale);
    out.push_back(std::move(o));
  }
  return out;
}

// The manifest lists exactly the scale file's tensors.
void check_names(const qsakv_overlay& o, const std::string& manifest_path) {
  std::set<std::string> listed(o.manifest.tensor_names.begin(), o.manifest.tensor_names.end());
  std::set<std::string> present;
  for (const OverlayTensor& t : o.tensors) {
    present.insert(t.name);
    if (!listed.count(t.name))
      fail(QSAKV_ERROR_FORMAT, "%s has tensor \"%s\" that the manifest %s does not list",
           o.scale_file.c_str(), t.name.c_str(), manifest_path.c_str());
  }
  for (const std::string& n : o.manifest.tensor_names)
    if (!present.count(n))
      fail(QSAKV_ERROR_FORMAT, "the manifest %s lists \"%s\" that %s does not hold",
           manifest_path.c_str(), n.c_str(), o.scale_file.c_str());
}

// A materialised checkpoint's record, when the scale file's directory holds one.
struct Record {
  bool present = false;
  Provenance p;
  std::string path;
};

// Records where the merged index sends each scale name; refuses an index that promises
// tensors the scale file does not hold, or that a materialised checkpoint's record does
// not list.
void attach_index(qsakv_overlay& o, const std::string& index_path, const Record& rec) {
  const std::string text =
      read_file(index_path, kMaxIndexBytes, "checkpoint index", QSAKV_ERROR_IO);
  if (rec.present)
    require_recorded("merged index", index_path, sha256_hex(text), rec.p.merged_index_sha256,
                     rec.path);
  const CheckpointIndex idx = parse_index(text, index_path);
  std::set<std::string> held;
  for (OverlayTensor& t : o.tensors) {
    held.insert(t.name);
    const auto it = idx.weight_map.find(t.name);
    t.index_target = it == idx.weight_map.end() ? "" : it->second;
  }
  for (const auto& kv : idx.weight_map)
    if (kv.second == kScaleFileName && !held.count(kv.first))
      fail(QSAKV_ERROR_FORMAT, "%s maps \"%s\" to %s, which holds no such tensor",
           index_path.c_str(), kv.first.c_str(), kScaleFileName);
  o.has_index = true;
}

}  // namespace

qsakv_overlay* overlay_load(const std::string& path, const char* manifest_path) {
  const Paths p = locate(path, manifest_path);
  auto o = std::make_unique<qsakv_overlay>();
  o->source = path;
  o->scale_file = p.scale;
  // A materialised checkpoint (its directory holds qsakv-provenance.json) vouches for
  // its files by the record: another pack's scale file and manifest, which agree with
  // each other, or a manifest edited in place, differ from what was materialised. Each
  // file is hashed before it is parsed, from the bytes that are then parsed.
  Record rec;
  rec.present = read_provenance(p.dir, &rec.p, &rec.path);
  const std::string manifest_text =
      read_file(p.manifest, kMaxManifestBytes, "overlay manifest", QSAKV_ERROR_OVERLAY_MISSING);
  o->manifest_sha256 = sha256_hex(manifest_text);
  if (rec.present)
    require_recorded("manifest", p.manifest, o->manifest_sha256, rec.p.manifest_sha256, rec.path);
  o->manifest = parse_manifest(manifest_text, p.manifest);
  const std::string bytes =
      read_file(p.scale, kMaxScaleFileBytes, "overlay scale file", QSAKV_ERROR_OVERLAY_MISSING);
  // Hash before parsing: a file the manifest does not vouch for is not looked into.
  o->scale_file_sha256 = sha256_hex(bytes);
  if (rec.present)
    require_recorded("scale file", p.scale, o->scale_file_sha256, rec.p.scale_file_sha256,
                     rec.path);
  if (o->scale_file_sha256 != o->manifest.scale_file_sha256)
    fail(QSAKV_ERROR_HASH_MISMATCH, "scale file %s has SHA-256 %s; the manifest %s records %s",
         p.scale.c_str(), o->scale_file_sha256.c_str(), p.manifest.c_str(),
         o->manifest.scale_file_sha256.c_str());
  const Safetensors st = parse_safetensors(bytes, p.scale);
  check_metadata(st, *o);
  o->unit_scale_control = o->manifest.unit_scale_control;
  o->tensors = describe(st);
  check_names(*o, p.manifest);
  if (!p.index.empty()) attach_index(*o, p.index, rec);
  return o.release();
}

int32_t overlay_num_scales(const qsakv_overlay* o) {
  int32_t n = 0;
  for (const OverlayTensor& t : o->tensors) n += t.is_scale_name && t.f32_scalar;
  return n;
}

int overlay_contract_min_sm(const qsakv_overlay* o) { return o ? o->manifest.contract.min_sm : 0; }

}  // namespace qsakv
