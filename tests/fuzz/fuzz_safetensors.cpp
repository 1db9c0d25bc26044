// SPDX-License-Identifier: Apache-2.0
// libFuzzer target for the file parsers: the safetensors reader (strict header,
// offsets, duplicates) and, by first byte, 'M' the manifest parser, 'P' the provenance
// record parser, 'I' the checkpoint index parser, 'C' the calibration statistics reader
// (its checked count consistency).
// JSON bombs are bounded by the strict parser's depth and value limits, so the run's
// -rss_limit_mb catches a parser whose memory grows with its input's nesting.
// Properties checked beyond "no crash, no sanitizer report": a refusal is always a
// qsakv::Error (any other exception aborts), and an accepted file whose tensors are all
// FP32 scalars survives a write/read round trip bit for bit.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/calib/stats_file.hpp"
#include "core/error.hpp"
#include "core/overlay/index.hpp"
#include "core/overlay/manifest.hpp"
#include "core/overlay/provenance.hpp"
#include "core/format/safetensors.hpp"

namespace {

void round_trip(const qsakv::Safetensors& st) {
  std::vector<qsakv::F32Scalar> scalars;
  for (const auto& t : st.tensors) {
    if (!qsakv::is_f32_scalar(t)) return;
    scalars.push_back({t.name, qsakv::read_f32(st, t)});
  }
  const std::string again = qsakv::write_safetensors_f32_scalars(scalars, st.metadata);
  const qsakv::Safetensors back = qsakv::parse_safetensors(again, "round trip");
  if (back.tensors.size() != scalars.size() || back.metadata != st.metadata) std::abort();
  for (size_t i = 0; i < scalars.size(); ++i) {
    const float v = qsakv::read_f32(back, back.tensors[i]);
    if (back.tensors[i].name != scalars[i].name ||
        std::memcmp(&v, &scalars[i].value, sizeof v) != 0)
      std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  try {
    if (size > 0 && data[0] == 'M') {
      qsakv::parse_manifest(input.substr(1), "fuzz manifest");
    } else if (size > 0 && data[0] == 'P') {
      qsakv::parse_provenance(input.substr(1), "fuzz provenance");
    } else if (size > 0 && data[0] == 'I') {
      qsakv::parse_index(input.substr(1), "fuzz index");
    } else if (size > 0 && data[0] == 'C') {
      qsakv::calib::parse_stats(input.substr(1), "fuzz statistics");
    } else {
      round_trip(qsakv::parse_safetensors(input, "fuzz input"));
    }
  } catch (const qsakv::Error&) {
    // A refusal with a status: the expected outcome for most inputs.
  }
  return 0;
}
