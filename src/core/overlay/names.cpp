// SPDX-License-Identifier: Apache-2.0
#include "core/overlay/names.hpp"

namespace qsakv {

namespace {

struct Suffix {
  const char* text;
  ScaleKind kind;
};

// Longest first is not needed for correctness (the component before the suffix must be
// the layer id, which no suffix ends with), but it keeps the match obvious.
// (A table of data: its rows look alike to the duplicates tool, and nothing repeats.)
const Suffix kSuffixes[] = {
    {"self_attn.attn.k_scale", ScaleKind::k},
    {"self_attn.attn.v_scale", ScaleKind::v},
    {"self_attn.k_scale", ScaleKind::k},
    {"self_attn.v_scale", ScaleKind::v},
    {"k_proj.output_scale", ScaleKind::k},
    {"v_proj.output_scale", ScaleKind::v},
    {"k_proj.k_scale", ScaleKind::k},
    {"v_proj.v_scale", ScaleKind::v},
    {"attn.k_scale", ScaleKind::k},
    {"attn.v_scale", ScaleKind::v},
    {"k_scale", ScaleKind::k},
    {"v_scale", ScaleKind::v},
};

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// Decimal layer id without sign or leading zeros, fitting int32.
bool parse_layer(const std::string& s, int32_t* out) {
  if (s.empty() || s.size() > 10 || (s.size() > 1 && s[0] == '0')) return false;
  int64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  if (v > INT32_MAX) return false;
  *out = static_cast<int32_t>(v);
  return true;
}

}  // namespace

bool parse_scale_name(const std::string& name, ScaleName* out) {
  for (const Suffix& s : kSuffixes) {
    const std::string tail = std::string(".") + s.text;
    if (!ends_with(name, tail)) continue;
    const std::string head = name.substr(0, name.size() - tail.size());  // <prefix>.<L>
    const size_t dot = head.find_last_of('.');
    if (dot == std::string::npos || dot == 0) continue;
    int32_t layer;
    if (!parse_layer(head.substr(dot + 1), &layer)) continue;
    out->prefix = head.substr(0, dot);
    out->layer = layer;
    out->kind = s.kind;
    return true;
  }
  return false;
}

std::string canonical_scale_name(const std::string& prefix, int32_t layer, ScaleKind kind) {
  return prefix + "." + std::to_string(layer) + ".self_attn." + kind_name(kind);
}

const char* kind_name(ScaleKind kind) { return kind == ScaleKind::k ? "k_scale" : "v_scale"; }

bool valid_layer_prefix(const std::string& p) {
  if (p.empty() || p.size() > 127 || p.front() == '.' || p.back() == '.') return false;
  char prev = 0;
  for (char c : p) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '-' || c == '.';
    if (!ok || (c == '.' && prev == '.')) return false;
    prev = c;
  }
  return true;
}

}  // namespace qsakv
