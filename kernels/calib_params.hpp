// SPDX-License-Identifier: Apache-2.0
// Calibration statistics: the memory layout shared by both backends, the host copy and
// the statistics file, and the parameters of the observe kernels.
//
// Per QSA layer and kind (K, V) one "entry": kEntryWords uint64 words
//   [count, finite, nonzero, hist[0], ..., hist[kBins - 1]]
// in one array ordered (qsa index, kind), and one float max |x| per entry in a second
// array. Two arrays because NCCL reduces them with different operations (sum / max),
// one call each.
#pragma once

#include <stdint.h>

#include "qsakv.h"

namespace qsakv {
namespace calib {

constexpr int kBins = QSAKV_CALIB_BINS;
constexpr int kLog2Min = QSAKV_CALIB_LOG2_MIN;
constexpr int kLog2Max = QSAKV_CALIB_LOG2_MAX;
constexpr int kWordCount = 0, kWordFinite = 1, kWordNonzero = 2, kWordHist = 3;
constexpr int kEntryWords = kWordHist + kBins;
// Bin-table codes beyond the bins: the class of a bit pattern that is not binned.
constexpr uint16_t kCodeZero = 0xFFFE;
constexpr uint16_t kCodeNonFinite = 0xFFFF;

}  // namespace calib

// One observe call: K and V of one layer, each num_elems values.
struct CalibObserveParams {
  const void* k;  // activation dtype, num_elems values
  const void* v;
  int64_t num_elems;          // per K and per V: num_tokens * kv_heads * head_dim
  qsakv_dtype act_dtype;      // FP16 or BF16
  const uint16_t* bin_table;  // device [65536]: bin or kCode* of each bit pattern
  uint64_t* words_k;          // device: this layer's K entry (kEntryWords)
  uint64_t* words_v;
  float* max_k;  // device: this layer's K max |x|
  float* max_v;
};

}  // namespace qsakv
