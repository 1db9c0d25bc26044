// SPDX-License-Identifier: Apache-2.0
// Tensor-parallel consensus: what each rank contributes (a fixed-size record of its
// config, overlay and numbering) and the comparison every rank runs on all records, so
// that every rank reaches the same verdict with the same message.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "qsakv.h"

namespace qsakv {

// Plain bytes (all-gathered as uint8): no pointers, no padding surprises.
struct RankRecord {
  static constexpr uint32_t kMagic = 0x43505451u;  // "QTPC"
  static constexpr int kConfigFields = 18;
  // 2: index_key_dtype compared (version 1 records, from an older library, are refused).
  static constexpr uint32_t kVersion = 2;
  uint32_t magic;
  uint32_t version;
  int32_t comm_rank;
  int32_t comm_size;
  int32_t tp_rank;
  int32_t tp_size;
  // Every config field but tp_rank/tp_size/qsa_layers: a field appended to
  // qsakv_model_config goes here too (kConfigFields, kFieldNames, kVersion bumped), or
  // ranks that differ in it pass consensus (index_key_dtype was missing until version 2).
  int32_t config[kConfigFields];
  char qsa_layers_sha256[65];  // of the QSA layer id list
  char scale_file_sha256[65];  // "" without an overlay
  char layer_prefix[128];
  int32_t has_overlay;
  int32_t overlay_validated;
};

// The names of RankRecord::config, in order.
const char* rank_record_field_name(int i);

RankRecord make_rank_record(const qsakv_model_config& config, const qsakv_overlay* overlay,
                            int comm_rank, int comm_size);

// "" when all records agree; else every difference, naming the field and the ranks.
std::string compare_rank_records(const std::vector<RankRecord>& records);

}  // namespace qsakv
