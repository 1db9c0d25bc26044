// SPDX-License-Identifier: Apache-2.0
// extern "C" entry point: tensor-parallel consensus over the caller's NCCL communicator.
#include <vector>

#include "api/guard.hpp"
#include "api/handles.hpp"
#include "core/config.hpp"
#include "core/nccl.hpp"
#include "core/tp_consensus.hpp"

using namespace qsakv;

extern "C" qsakv_status qsakv_tp_consensus(qsakv_context* context, const qsakv_model_config* config,
                                           const qsakv_overlay* overlay, void* nccl_comm,
                                           qsakv_stream_t stream) {
  return guarded([&] {
    if (!context) fail(QSAKV_ERROR_INVALID_ARGUMENT, "context is NULL");
    if (!nccl_comm) fail(QSAKV_ERROR_INVALID_ARGUMENT, "nccl_comm is NULL");
    const auto c = read_versioned(config, default_model_config(), "config");
    validate_config(c);
    Backend* be = context->backend.get();
    if (be->info().kind != QSAKV_BACKEND_CUDA)
      fail(QSAKV_ERROR_UNSUPPORTED,
           "qsakv_tp_consensus needs the CUDA backend (NCCL "
           "communicates between GPUs); this context uses the CPU backend");
    int size = 0, rank = -1;
    nccl_comm_shape(nccl_comm, &size, &rank);
    const RankRecord mine = make_rank_record(c, overlay, rank, size);
    DeviceBuffer send(be, sizeof(RankRecord));
    DeviceBuffer recv(be, sizeof(RankRecord) * static_cast<size_t>(size));
    std::vector<RankRecord> all(static_cast<size_t>(size));
    be->copy(send.get(), &mine, sizeof mine, QSAKV_COPY_HOST_TO_DEVICE, stream);
    nccl_allgather(send.get(), recv.get(), sizeof(RankRecord), nccl_comm, stream);
    be->copy(all.data(), recv.get(), recv.bytes(), QSAKV_COPY_DEVICE_TO_HOST, stream);
    be->synchronize(stream);
    const std::string differences = compare_rank_records(all);
    if (!differences.empty())
      fail(QSAKV_ERROR_TP_MISMATCH, "tensor-parallel consensus refused on rank %d of %d: %s", rank,
           size, differences.c_str());
  });
}
