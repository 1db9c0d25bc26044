// SPDX-License-Identifier: Apache-2.0
// extern "C" entry point: the scales of a bare scale file, for inspection (no manifest,
// no checkpoint, no config: nothing is validated and nothing is bound).
#include <cmath>
#include <cstring>
#include <map>
#include <utility>

#include "api/guard.hpp"
#include "core/format/file_io.hpp"
#include "core/format/safetensors.hpp"
#include "core/format/sha256.hpp"
#include "core/overlay/names.hpp"

using namespace qsakv;

extern "C" {

qsakv_status qsakv_overlay_read_scale_file(const char* scale_file, int32_t capacity,
                                           int32_t* layers, float* k_scales, float* v_scales,
                                           int32_t* num_layers, char sha256_hex_out[65]) {
  return guarded([&] {
    if (!scale_file) fail(QSAKV_ERROR_INVALID_ARGUMENT, "scale_file is NULL");
    if (!*scale_file) fail(QSAKV_ERROR_INVALID_ARGUMENT, "scale_file is empty");
    if (!num_layers) fail(QSAKV_ERROR_INVALID_ARGUMENT, "num_layers is NULL");
    if (capacity < 0) fail(QSAKV_ERROR_INVALID_ARGUMENT, "capacity is %d; must be >= 0", capacity);
    if (capacity > 0) {  // each output array named when absent
      if (!layers)
        fail(QSAKV_ERROR_INVALID_ARGUMENT, "capacity is %d but layers is NULL", capacity);
      if (!k_scales)
        fail(QSAKV_ERROR_INVALID_ARGUMENT, "capacity is %d but k_scales is NULL", capacity);
      if (!v_scales)
        fail(QSAKV_ERROR_INVALID_ARGUMENT, "capacity is %d but v_scales is NULL", capacity);
    }
    const std::string bytes =
        read_file(scale_file, kMaxHeaderBytes + (64u << 20), "scale file", QSAKV_ERROR_IO);
    const Safetensors st = parse_safetensors(bytes, scale_file);
    // layer -> (k, v), NaN = absent from the file; whether each was seen is kept apart, since
    // a file may hold a NaN scale (shown as found) and then the same scale again.
    std::map<int32_t, std::pair<float, float>> found;
    std::map<int32_t, std::pair<bool, bool>> seen;
    for (const SafetensorsTensor& t : st.tensors) {
      ScaleName n;
      if (!parse_scale_name(t.name, &n))
        fail(QSAKV_ERROR_OVERLAY_UNKNOWN_TENSOR, "%s: tensor \"%s\" is not a K/V scale", scale_file,
             t.name.c_str());
      if (!is_f32_scalar(t))
        fail(QSAKV_ERROR_OVERLAY_BAD_TENSOR,
             "%s: tensor \"%s\" is %s of %zu dimension(s); "
             "a scale is an F32 scalar",
             scale_file, t.name.c_str(), t.dtype.c_str(), t.shape.size());
      auto it = found.emplace(n.layer, std::make_pair(NAN, NAN)).first;
      float& slot = n.kind == ScaleKind::k ? it->second.first : it->second.second;
      auto& was = seen[n.layer];
      bool& seen_before = n.kind == ScaleKind::k ? was.first : was.second;
      if (seen_before)
        fail(QSAKV_ERROR_OVERLAY_DUPLICATE,
             "%s: layer %d has two %s tensors (\"%s\" is the "
             "second)",
             scale_file, n.layer, kind_name(n.kind), t.name.c_str());
      seen_before = true;
      slot = read_f32(st, t);
      // A NaN scale read from the file stays NaN: inspection shows it as found.
    }
    int32_t i = 0;
    for (const auto& kv : found) {
      if (i < capacity) {
        layers[i] = kv.first;
        k_scales[i] = kv.second.first;
        v_scales[i] = kv.second.second;
      }
      ++i;
    }
    *num_layers = i;
    if (sha256_hex_out) {
      const std::string h = sha256_hex(bytes);
      std::memcpy(sha256_hex_out, h.c_str(), 65);
    }
  });
}

}  // extern "C"
