// SPDX-License-Identifier: Apache-2.0
#include "core/format/safetensors.hpp"

#include <algorithm>
#include <cstring>

#include "core/error.hpp"
#include "core/format/json_strict.hpp"

namespace qsakv {

namespace {

uint64_t load_le64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

void store_le32(char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

// The header's JSON text, after the bounds checks on its length.
std::string header_text(const std::string& file, const std::string& what) {
  if (file.size() < 8)
    fail(QSAKV_ERROR_FORMAT, "%s is truncated: %zu bytes, less than the 8-byte header length",
         what.c_str(), file.size());
  const uint64_t n = load_le64(file.data());
  if (n < 2)
    fail(QSAKV_ERROR_FORMAT, "%s: header length is %llu; a header is at least \"{}\"", what.c_str(),
         static_cast<unsigned long long>(n));
  if (n > kMaxHeaderBytes)
    fail(QSAKV_ERROR_FORMAT, "%s: header length %llu is over the %llu-byte limit", what.c_str(),
         static_cast<unsigned long long>(n), static_cast<unsigned long long>(kMaxHeaderBytes));
  if (n > file.size() - 8)
    fail(QSAKV_ERROR_FORMAT, "%s: header length %llu runs past the end of the %zu-byte file",
         what.c_str(), static_cast<unsigned long long>(n), file.size());
  if (file[8] != '{')
    fail(QSAKV_ERROR_FORMAT, "%s: the header does not start with '{'", what.c_str());
  return file.substr(8, n);
}

uint64_t as_u64(const json& j, const std::string& what, const std::string& name,
                const char* field) {
  if (!j.is_number_unsigned())
    fail(QSAKV_ERROR_FORMAT, "%s: tensor \"%s\": %s holds %s, not a non-negative integer",
         what.c_str(), name.c_str(), field, json_excerpt(j).c_str());
  return j.get<uint64_t>();
}

SafetensorsTensor parse_entry(const std::string& name, const json& e, const std::string& what) {
  if (!e.is_object())
    fail(QSAKV_ERROR_FORMAT, "%s: tensor \"%s\" is a JSON %s, not an object", what.c_str(),
         name.c_str(), json_kind(e));
  for (const auto& kv : e.items())
    if (kv.key() != "dtype" && kv.key() != "shape" && kv.key() != "data_offsets")
      fail(QSAKV_ERROR_FORMAT, "%s: tensor \"%s\" has an unknown field \"%s\"", what.c_str(),
           name.c_str(), kv.key().c_str());
  if (!e.contains("dtype") || !e.contains("shape") || !e.contains("data_offsets"))
    fail(QSAKV_ERROR_FORMAT, "%s: tensor \"%s\" lacks dtype, shape or data_offsets", what.c_str(),
         name.c_str());
  SafetensorsTensor t;
  t.name = name;
  if (!e["dtype"].is_string())
    fail(QSAKV_ERROR_FORMAT, "%s: tensor \"%s\": dtype is not a string", what.c_str(),
         name.c_str());
  t.dtype = e["dtype"].get<std::string>();
  const uint64_t elem = safetensors_dtype_size(t.dtype);
  if (elem == 0)
    fail(QSAKV_ERROR_FORMAT, "%s: tensor \"%s\": unknown dtype \"%s\"", what.c_str(), name.c_str(),
         t.dtype.c_str());
  const json& shape = e["shape"];
  if (!shape.is_array())
    fail(QSAKV_ERROR_FORMAT, "%s: tensor \"%s\": shape is not an array", what.c_str(),
         name.c_str());
  uint64_t bytes = elem;
  for (const json& d : shape) {
    const uint64_t dim = as_u64(d, what, name, "shape");
    // Overflow of the byte count would let a huge shape pass the size check.
    if (dim != 0 && bytes > UINT64_MAX / dim)
      fail(QSAKV_ERROR_FORMAT, "%s: tensor \"%s\": shape overflows", what.c_str(), name.c_str());
    bytes *= dim;
    t.shape.push_back(dim);
  }
  const json& off = e["data_offsets"];
  if (!off.is_array() || off.size() != 2)
    fail(QSAKV_ERROR_FORMAT, "%s: tensor \"%s\": data_offsets is not [begin, end]", what.c_str(),
         name.c_str());
  t.begin = as_u64(off[0], what, name, "data_offsets");
  t.end = as_u64(off[1], what, name, "data_offsets");
  if (t.end < t.begin || t.end - t.begin != bytes)
    fail(QSAKV_ERROR_FORMAT,
         "%s: tensor \"%s\": data_offsets [%llu, %llu] span %lld bytes; %s x shape needs %llu",
         what.c_str(), name.c_str(), static_cast<unsigned long long>(t.begin),
         static_cast<unsigned long long>(t.end),
         static_cast<long long>(t.end) - static_cast<long long>(t.begin), t.dtype.c_str(),
         static_cast<unsigned long long>(bytes));
  return t;
}

std::vector<std::pair<std::string, std::string>> parse_metadata(const json& m,
                                                                const std::string& what) {
  if (!m.is_object())
    fail(QSAKV_ERROR_FORMAT, "%s: __metadata__ is a JSON %s, not an object", what.c_str(),
         json_kind(m));
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& kv : m.items()) {
    if (!kv.value().is_string())
      fail(QSAKV_ERROR_FORMAT, "%s: __metadata__ \"%s\" is a JSON %s, not a string", what.c_str(),
           kv.key().c_str(), json_kind(kv.value()));
    out.emplace_back(kv.key(), kv.value().get<std::string>());
  }
  return out;
}

// Sorted by offset, the tensors must tile [0, data_size) exactly.
void check_tiling(std::vector<SafetensorsTensor> ts, uint64_t data_size, const std::string& what) {
  std::stable_sort(ts.begin(), ts.end(),
                   [](const SafetensorsTensor& a, const SafetensorsTensor& b) {
                     return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
                   });
  uint64_t at = 0;
  for (const auto& t : ts) {
    if (t.begin < at)
      fail(QSAKV_ERROR_FORMAT,
           "%s: tensor \"%s\" at bytes [%llu, %llu) overlaps the tensor "
           "before it",
           what.c_str(), t.name.c_str(), static_cast<unsigned long long>(t.begin),
           static_cast<unsigned long long>(t.end));
    if (t.end > data_size)
      fail(QSAKV_ERROR_FORMAT,
           "%s: tensor \"%s\" ends at byte %llu, past the %llu-byte data "
           "section",
           what.c_str(), t.name.c_str(), static_cast<unsigned long long>(t.end),
           static_cast<unsigned long long>(data_size));
    if (t.begin > at)
      fail(QSAKV_ERROR_FORMAT, "%s: data bytes [%llu, %llu) belong to no tensor", what.c_str(),
           static_cast<unsigned long long>(at), static_cast<unsigned long long>(t.begin));
    at = t.end;
  }
  if (at != data_size)
    fail(QSAKV_ERROR_FORMAT, "%s: %llu bytes after the last tensor belong to no tensor",
         what.c_str(), static_cast<unsigned long long>(data_size - at));
}

}  // namespace

const std::string* Safetensors::meta(const std::string& key) const {
  for (const auto& kv : metadata)
    if (kv.first == key) return &kv.second;
  return nullptr;
}

uint64_t safetensors_dtype_size(const std::string& d) {
  static const std::pair<const char*, uint64_t> table[] = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
      {"U32", 4},  {"F32", 4}, {"I64", 8}, {"U64", 8},     {"F64", 8}};
  for (const auto& e : table)
    if (d == e.first) return e.second;
  return 0;
}

Safetensors parse_safetensors(const std::string& file, const std::string& what) {
  const std::string text = header_text(file, what);
  JsonDuplicate dup;
  const json header = parse_json_strict(text, what + " header", &dup);
  if (!header.is_object())
    fail(QSAKV_ERROR_FORMAT, "%s: the header is a JSON %s, not an object", what.c_str(),
         json_kind(header));
  if (dup.found && dup.depth == 1)
    fail(QSAKV_ERROR_OVERLAY_DUPLICATE, "%s: tensor \"%s\" appears twice in the header",
         what.c_str(), dup.key.c_str());
  if (dup.found)
    fail(QSAKV_ERROR_FORMAT, "%s: field \"%s\" appears twice in \"%s\"", what.c_str(),
         dup.key.c_str(), dup.parent.c_str());
  Safetensors st;
  for (const auto& kv : header.items()) {
    if (kv.key() == "__metadata__")
      st.metadata = parse_metadata(kv.value(), what);
    else
      st.tensors.push_back(parse_entry(kv.key(), kv.value(), what));
  }
  const uint64_t data_start = 8 + text.size();
  check_tiling(st.tensors, file.size() - data_start, what);
  st.data = file.substr(data_start);
  return st;
}

bool is_f32_scalar(const SafetensorsTensor& t) { return t.dtype == "F32" && t.shape.empty(); }

float read_f32(const Safetensors& st, const SafetensorsTensor& t) {
  if (!is_f32_scalar(t))
    fail(QSAKV_ERROR_INTERNAL, "read_f32 on tensor \"%s\" of dtype %s", t.name.c_str(),
         t.dtype.c_str());
  const unsigned char* p = reinterpret_cast<const unsigned char*>(st.bytes(t));
  const uint32_t bits = static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
                        static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
  float v;
  std::memcpy(&v, &bits, 4);
  return v;
}

std::string write_safetensors_f32_scalars(
    const std::vector<F32Scalar>& tensors,
    const std::vector<std::pair<std::string, std::string>>& metadata) {
  json header = json::object();
  if (!metadata.empty()) {
    json m = json::object();
    for (const auto& kv : metadata) m[kv.first] = kv.second;
    header["__metadata__"] = m;
  }
  std::string data(4 * tensors.size(), '\0');
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (header.contains(tensors[i].name))
      fail(QSAKV_ERROR_OVERLAY_DUPLICATE, "tensor \"%s\" given twice", tensors[i].name.c_str());
    header[tensors[i].name] = {
        {"dtype", "F32"}, {"shape", json::array()}, {"data_offsets", {4 * i, 4 * i + 4}}};
    uint32_t bits;
    std::memcpy(&bits, &tensors[i].value, 4);
    store_le32(&data[4 * i], bits);
  }
  std::string text = header.dump();
  // Pad with spaces so the data section starts 8-byte aligned, as the reference writer does.
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + text + data;
}

}  // namespace qsakv
