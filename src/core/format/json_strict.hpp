// SPDX-License-Identifier: Apache-2.0
// Strict JSON parsing for overlay files: nlohmann's parser silently keeps the last of
// two equal keys, which would let a crafted file say two things at once. This wrapper
// watches every key through the parser callback and reports the first duplicate.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace qsakv {

// Insertion order kept: merged indexes and manifests are written back in their order.
using json = nlohmann::ordered_json;

struct JsonDuplicate {
  bool found = false;
  int depth = 0;       // 1: a key of the root object, 2: of an object inside it, ...
  std::string parent;  // key of the enclosing object in its parent ("" at the root)
  std::string key;
};

// What a parsed document may cost: nesting deeper than kJsonMaxDepth, or more than
// kJsonMaxValues values (objects, arrays, keys and scalars), is QSAKV_ERROR_FORMAT, found
// while parsing, before the tree grows further. Each value costs some tens of bytes in
// the tree, so a document costs at most a few hundred MiB plus its strings, whatever its
// size (measured: 2 Mi empty strings, the costliest values per byte of JSON, take about
// 170 MiB); the largest real documents (merged indexes of ~150k tensors, ~300k values;
// safetensors headers of a few thousand tensors) stay well inside it at a depth of 3 or 4.
// Parsing is linear in the text.
constexpr int kJsonMaxDepth = 64;
constexpr uint64_t kJsonMaxValues = uint64_t{1} << 21;

// Parses `text`; a syntax error is QSAKV_ERROR_FORMAT naming `what` and the byte.
// With dup == nullptr a duplicated key is QSAKV_ERROR_FORMAT too; otherwise the first
// duplicate is reported through *dup and the caller picks the status.
json parse_json_strict(const std::string& text, const std::string& what,
                       JsonDuplicate* dup = nullptr);

// "object", "array", "string", ... for messages.
const char* json_kind(const json& j);

// A value's JSON text for a message, cut to about 80 characters ("..." marks the cut):
// a hostile file must not make a message as large as itself.
std::string json_excerpt(const json& j);

// Whether `s` is well-formed UTF-8 (RFC 3629: no overlong forms, no surrogates, nothing
// above U+10FFFF), as JSON text must be. On false, *bad_offset is the first bad byte's.
bool utf8_valid(const std::string& s, size_t* bad_offset);

// `s` with every byte that is not part of well-formed UTF-8 written as \xNN (for
// messages: they stay UTF-8 text).
std::string utf8_escaped(const std::string& s);

}  // namespace qsakv
