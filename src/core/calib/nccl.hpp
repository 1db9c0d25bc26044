// NCCL, loaded at call time: libqsakv never links libnccl, so it loads (and every other
// feature works) where NCCL is absent. Only the all-reduce of calibration statistics
// needs it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "qsakv.h"

namespace qsakv {
namespace calib {

// In-place all-reduce over `comm` (an ncclComm_t) on `stream` (a cudaStream_t): sum of
// `num_words` uint64 words, then max of `num_maxima` floats. Checks first that the
// communicator has `expected_size` ranks and that this one is `expected_rank`
// (INVALID_ARGUMENT otherwise). A missing library or symbol, or any NCCL failure, is
// QSAKV_ERROR_NCCL with NCCL's own message.
void nccl_allreduce_stats(uint64_t* words, size_t num_words, float* maxima, size_t num_maxima,
                          void* comm, int expected_size, int expected_rank,
                          qsakv_stream_t stream);

}  // namespace calib
}  // namespace qsakv
