// SPDX-License-Identifier: Apache-2.0
// Resolving a model-layer id to its QSA slot, with the error every entry point gives.
#pragma once

#include "api/handles.hpp"
#include "core/config.hpp"
#include "core/error.hpp"

namespace qsakv {

inline int require_qsa_layer(const qsakv_cache* cache, int32_t layer) {
  const int i = qsa_index(cache->config, layer);
  if (i < 0)
    fail(QSAKV_ERROR_INVALID_ARGUMENT,
         "layer %d is not a QSA layer of this config "
         "(%d QSA layers, first %d, last %d)",
         layer, cache->config.num_qsa_layers, cache->config.qsa_layers[0],
         cache->config.qsa_layers[cache->config.num_qsa_layers - 1]);
  return i;
}

}  // namespace qsakv
