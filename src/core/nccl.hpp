// SPDX-License-Identifier: Apache-2.0
// NCCL, loaded at call time: libqsakv never links libnccl, so it loads (and every other
// feature works) where NCCL is absent. Two features use it: the all-reduce of
// calibration statistics and the tensor-parallel consensus check.
#pragma once

#include <cstddef>
#include <cstdint>

#include "qsakv.h"

namespace qsakv {

// In-place all-reduce over `comm` (an ncclComm_t) on `stream` (a cudaStream_t): sum of
// `num_words` uint64 words, then max of `num_maxima` floats. Checks first that the
// communicator has `expected_size` ranks and that this one is `expected_rank`
// (INVALID_ARGUMENT otherwise). A missing library or symbol, or any NCCL failure, is
// QSAKV_ERROR_NCCL with NCCL's own message.
void nccl_allreduce_stats(uint64_t* words, size_t num_words, float* maxima, size_t num_maxima,
                          void* comm, int expected_size, int expected_rank, qsakv_stream_t stream);

// Size of `comm` and this process's rank in it.
void nccl_comm_shape(void* comm, int* size, int* rank);

// All-gather of `bytes` per rank over `comm` on `stream`: recv (device) receives
// size * bytes, rank r's send (device) at offset r * bytes.
void nccl_allgather(const void* send, void* recv, size_t bytes, void* comm, qsakv_stream_t stream);

}  // namespace qsakv
