// SPDX-License-Identifier: Apache-2.0
#include "core/overlay/manifest.hpp"

#include <set>

#include "core/error.hpp"
#include "core/format/json_strict.hpp"
#include "core/overlay/json_fields.hpp"
#include "core/overlay/names.hpp"
#include "core/format/sha256.hpp"

namespace qsakv {

namespace {

const char* const kFields[] = {
    "schema_version", "kind",           "base_index_sha256",  "scale_file_sha256", "layer_prefix",
    "tensor_names",   "scale_contract", "unit_scale_control", "contract"};
const char* const kContractFields[] = {"tp_size", "speculative_tokens", "activation_dtype",
                                       "min_sm"};

// null -> `unset`; otherwise an integer in [lo, hi].
int32_t get_bound(const json& c, const char* field, int32_t unset, int32_t lo, int32_t hi,
                  const std::string& what) {
  const json& v = c[field];
  if (v.is_null()) return unset;
  if (!v.is_number_integer() || v.get<int64_t>() < lo || v.get<int64_t>() > hi)
    fail(QSAKV_ERROR_FORMAT, "%s: contract.%s is %s; expected null or an integer in %d..%d",
         what.c_str(), field, json_excerpt(v).c_str(), lo, hi);
  return static_cast<int32_t>(v.get<int64_t>());
}

Contract parse_contract(const json& c, const std::string& what) {
  if (!c.is_object())
    fail(QSAKV_ERROR_FORMAT, "%s: \"contract\" is a JSON %s, not an object", what.c_str(),
         json_kind(c));
  require_fields(c, kContractFields, what, "\"contract\"");
  Contract out;
  out.tp_size = get_bound(c, "tp_size", 0, 1, kMaxContractTpSize, what);
  out.speculative_tokens =
      get_bound(c, "speculative_tokens", -1, 0, kMaxContractSpeculativeTokens, what);
  out.min_sm = get_bound(c, "min_sm", 0, 1, kMaxContractMinSm, what);
  const json& d = c["activation_dtype"];
  if (d.is_null()) return out;
  if (d == "fp16")
    out.activation_dtype = QSAKV_DTYPE_FP16;
  else if (d == "bf16")
    out.activation_dtype = QSAKV_DTYPE_BF16;
  else
    fail(QSAKV_ERROR_FORMAT,
         "%s: contract.activation_dtype is %s; expected \"fp16\", "
         "\"bf16\" or null",
         what.c_str(), json_excerpt(d).c_str());
  return out;
}

std::vector<std::string> parse_names(const json& a, const std::string& what) {
  if (!a.is_array())
    fail(QSAKV_ERROR_FORMAT, "%s: \"tensor_names\" is a JSON %s, not an array", what.c_str(),
         json_kind(a));
  std::vector<std::string> names;
  std::set<std::string> seen;
  for (const json& n : a) {
    if (!n.is_string())
      fail(QSAKV_ERROR_FORMAT, "%s: \"tensor_names\" holds a JSON %s, not a string", what.c_str(),
           json_kind(n));
    if (!seen.insert(n.get<std::string>()).second)
      fail(QSAKV_ERROR_OVERLAY_DUPLICATE, "%s: tensor name \"%s\" is listed twice", what.c_str(),
           n.get<std::string>().c_str());
    names.push_back(n.get<std::string>());
  }
  return names;
}

json dtype_json(qsakv_dtype d) {
  if (d == QSAKV_DTYPE_FP16) return "fp16";
  if (d == QSAKV_DTYPE_BF16) return "bf16";
  return nullptr;
}

json bound_json(int32_t v, int32_t unset) { return v == unset ? json(nullptr) : json(v); }

}  // namespace

Manifest parse_manifest(const std::string& text, const std::string& what) {
  const json j = parse_json_strict(text, what);
  require_schema(j, kManifestSchemaVersion, kManifestKind, what);
  require_fields(j, kFields, what, "the manifest");
  Manifest m;
  m.base_index_sha256 = get_sha(j, "base_index_sha256", what);
  m.scale_file_sha256 = get_sha(j, "scale_file_sha256", what);
  m.layer_prefix = get_string(j, "layer_prefix", what);
  if (!valid_layer_prefix(m.layer_prefix))
    fail(QSAKV_ERROR_FORMAT, "%s: layer_prefix \"%s\" is not a dotted name", what.c_str(),
         m.layer_prefix.c_str());
  m.tensor_names = parse_names(j["tensor_names"], what);
  const std::string contract = get_string(j, "scale_contract", what);
  if (contract != kScaleContract)
    fail(QSAKV_ERROR_FORMAT, "%s: scale_contract is \"%s\"; this library implements \"%s\"",
         what.c_str(), contract.c_str(), kScaleContract);
  if (!j["unit_scale_control"].is_boolean())
    fail(QSAKV_ERROR_FORMAT, "%s: unit_scale_control is %s; expected true or false", what.c_str(),
         json_excerpt(j["unit_scale_control"]).c_str());
  m.unit_scale_control = j["unit_scale_control"].get<bool>();
  m.contract = parse_contract(j["contract"], what);
  return m;
}

std::string write_manifest(const Manifest& m) {
  json j = json::object();
  j["schema_version"] = kManifestSchemaVersion;
  j["kind"] = kManifestKind;
  j["base_index_sha256"] = m.base_index_sha256;
  j["scale_file_sha256"] = m.scale_file_sha256;
  j["layer_prefix"] = m.layer_prefix;
  j["tensor_names"] = m.tensor_names;
  j["scale_contract"] = kScaleContract;
  j["unit_scale_control"] = m.unit_scale_control;
  j["contract"] = {{"tp_size", bound_json(m.contract.tp_size, 0)},
                   {"speculative_tokens", bound_json(m.contract.speculative_tokens, -1)},
                   {"activation_dtype", dtype_json(m.contract.activation_dtype)},
                   {"min_sm", bound_json(m.contract.min_sm, 0)}};
  return j.dump(2) + "\n";
}

}  // namespace qsakv
