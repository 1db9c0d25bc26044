// SPDX-License-Identifier: Apache-2.0
// The overlay manifest, qsakv-overlay.json: what binds a scale file to one base
// checkpoint revision and to the runtime contract it was calibrated and validated for.
//
// Schema version 1 (every field required, no other field allowed):
// {
//   "schema_version": 1,
//   "kind": "qsakv-overlay",
//   "base_index_sha256": "<64 hex>",      // of the base model.safetensors.index.json
//   "scale_file_sha256": "<64 hex>",      // of model-kvscales.safetensors
//   "layer_prefix": "model.layers",
//   "tensor_names": ["model.layers.3.self_attn.k_scale", ...],
//   "scale_contract": "e4m3fn(x/scale), max_abs/448",
//   "unit_scale_control": false,
//   "contract": {"tp_size": 4 | null, "speculative_tokens": 0 | null,
//                "activation_dtype": "fp16" | "bf16" | null, "min_sm": 70 | null}
// }
// null in "contract" means "not constrained".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "qsakv.h"

namespace qsakv {

constexpr int kManifestSchemaVersion = 1;
constexpr const char* kManifestKind = "qsakv-overlay";
constexpr const char* kManifestFileName = "qsakv-overlay.json";
constexpr const char* kScaleFileName = "model-kvscales.safetensors";
constexpr const char* kIndexFileName = "model.safetensors.index.json";
constexpr const char* kProvenanceFileName = "qsakv-provenance.json";
// What a stored scale means; the only contract this library implements.
constexpr const char* kScaleContract = "e4m3fn(x/scale), max_abs/448";
// Safetensors metadata keys of the scale file.
constexpr const char* kMetaScaleContract = "qsakv.scale_contract";
constexpr const char* kMetaUnitScaleControl = "qsakv.unit_scale_control";

// The largest values a manifest's contract may hold (the writer refuses more, so that it
// never writes a manifest the reader would refuse).
constexpr int32_t kMaxContractTpSize = 1 << 16;
constexpr int32_t kMaxContractSpeculativeTokens = 64;
constexpr int32_t kMaxContractMinSm = 10000;

struct Contract {
  int32_t tp_size = 0;                                 // 0: not constrained
  int32_t speculative_tokens = -1;                     // -1: not constrained
  qsakv_dtype activation_dtype = QSAKV_DTYPE_INVALID;  // INVALID: not constrained
  int32_t min_sm = 0;                                  // 0: not constrained
};

struct Manifest {
  std::string base_index_sha256;
  std::string scale_file_sha256;
  std::string layer_prefix;
  std::vector<std::string> tensor_names;
  bool unit_scale_control = false;
  Contract contract;
};

// Parses and checks a manifest (QSAKV_ERROR_FORMAT naming the field; a tensor name
// listed twice is QSAKV_ERROR_OVERLAY_DUPLICATE). `what` names the file.
Manifest parse_manifest(const std::string& text, const std::string& what);

// The JSON text of a manifest (2-space indented, trailing newline).
std::string write_manifest(const Manifest& m);

}  // namespace qsakv
