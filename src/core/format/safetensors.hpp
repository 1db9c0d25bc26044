// SPDX-License-Identifier: Apache-2.0
// Safetensors: a strict reader and a writer.
//
// Layout: 8-byte little-endian header length N, N bytes of JSON (an object mapping each
// tensor name to {dtype, shape, data_offsets}, plus an optional "__metadata__" object of
// strings), then the data section. Offsets are relative to the data section.
//
// The reader accepts only what it can vouch for: the header fits in the file and under
// kMaxHeaderBytes, starts with '{', parses as JSON without duplicate keys, every entry has
// exactly the three fields with the right types, every dtype is known and each tensor's
// byte size matches dtype x shape; the tensors tile the data section exactly: sorted by
// offset they start at 0, each begins where the previous ended (no overlap, no gap) and
// the last ends at the end of the file (no trailing bytes). Padding of the header with
// spaces (as the reference writer does for alignment) is fine: JSON ignores it.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace qsakv {

// A header larger than this is refused before any parsing (the reference implementation
// uses the same bound).
constexpr uint64_t kMaxHeaderBytes = 100000000;

struct SafetensorsTensor {
  std::string name;
  std::string dtype;  // as written: "F32", "F16", ...
  std::vector<uint64_t> shape;
  uint64_t begin = 0;  // data_offsets, relative to the data section
  uint64_t end = 0;
};

struct Safetensors {
  std::vector<SafetensorsTensor> tensors;  // in header order
  std::vector<std::pair<std::string, std::string>> metadata;
  std::string data;  // the data section

  // The tensor's bytes; valid while *this lives.
  const char* bytes(const SafetensorsTensor& t) const { return data.data() + t.begin; }
  // nullptr when absent.
  const std::string* meta(const std::string& key) const;
};

// Parses a whole file image. Malformed structure is QSAKV_ERROR_FORMAT; a tensor name
// that appears twice is QSAKV_ERROR_OVERLAY_DUPLICATE. `what` names the file in messages.
Safetensors parse_safetensors(const std::string& file, const std::string& what);

// Bytes per element of a safetensors dtype name; 0 if unknown.
uint64_t safetensors_dtype_size(const std::string& dtype);

// True for an FP32 scalar (dtype F32, shape []).
bool is_f32_scalar(const SafetensorsTensor& t);
// Reads an FP32 scalar (little-endian).
float read_f32(const Safetensors& st, const SafetensorsTensor& t);

struct F32Scalar {
  std::string name;
  float value;
};

// A file image of FP32 scalars, in the given order, with string metadata.
std::string write_safetensors_f32_scalars(
    const std::vector<F32Scalar>& tensors,
    const std::vector<std::pair<std::string, std::string>>& metadata);

}  // namespace qsakv
