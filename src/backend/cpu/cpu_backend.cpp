// SPDX-License-Identifier: Apache-2.0
// The CPU reference backend: host memory, synchronous, the oracle for GPU tests.
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>

#include "backend/cpu/cpu_kernels.hpp"
#include "core/backend.hpp"
#include "core/error.hpp"

namespace qsakv {
namespace {

// The machine's physical memory (SIZE_MAX where the system does not say).
size_t physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return SIZE_MAX;
  const auto p = static_cast<size_t>(pages), z = static_cast<size_t>(page);
  return p > SIZE_MAX / z ? SIZE_MAX : p * z;
}

class CpuBackend final : public Backend {
 public:
  CpuBackend() {
    info_.kind = QSAKV_BACKEND_CPU;
    info_.decoder = QSAKV_DECODER_SOFTWARE;
    info_.tier = QSAKV_KERNEL_TIER_NONE;
    info_.device = -1;
    info_.sm_version = 0;
    info_.multiprocessor_count = 0;
    info_.has_fp8_conversion = false;
    info_.device_memory_bytes = 0;
    info_.device_name = "CPU (reference backend)";
  }
  const BackendInfo& info() const override { return info_; }

  void* alloc(size_t bytes) override {
    // With memory overcommit, calloc "succeeds" far beyond the machine's memory and the
    // process dies later, on first touch. A request larger than physical memory is
    // refused here, the same way on every machine.
    const size_t physical = physical_memory_bytes();
    if (bytes > physical)
      fail(QSAKV_ERROR_OUT_OF_MEMORY,
           "host allocation of %zu bytes exceeds this machine's %zu bytes of memory", bytes,
           physical);
    void* p = std::calloc(1, bytes);
    if (!p) fail(QSAKV_ERROR_OUT_OF_MEMORY, "host allocation of %zu bytes failed", bytes);
    return p;
  }
  void release(void* ptr) noexcept override { std::free(ptr); }
  void* alloc_host(size_t bytes) override { return alloc(bytes); }
  void release_host(void* ptr) noexcept override { std::free(ptr); }
  void copy(void* dst, const void* src, size_t bytes, qsakv_copy_kind, qsakv_stream_t) override {
    std::memmove(dst, src, bytes);
  }
  void synchronize(qsakv_stream_t) override {}
  void* create_fence() override { return nullptr; }
  void destroy_fence(void*) noexcept override {}
  void record_fence(void*, qsakv_stream_t) override {}
  void wait_fence(void*) override {}

  int choose_splits(int, int) const override { return 1; }
  size_t select_workspace_bytes(int, int64_t max_blocks) const override {
    // One row at a time: a score and an order entry per compressed block.
    return static_cast<size_t>(max_blocks) * (sizeof(float) + sizeof(int32_t));
  }

  void store_kv(const StoreKvParams& p, qsakv_stream_t) override { cpu::store_kv(p); }
  void store_ring(const StoreRowsParams& p, qsakv_stream_t) override { cpu::store_ring(p); }
  void store_compressed(const StoreCompressedParams& p, qsakv_stream_t) override {
    cpu::store_compressed(p);
  }
  void select_topk(const SelectParams& p, qsakv_stream_t) override { cpu::select_topk(p); }
  void attention(const AttentionParams& p, qsakv_stream_t) override { cpu::attention(p); }
  void calib_observe(const CalibObserveParams& p, qsakv_stream_t) override {
    cpu::calib_observe(p);
  }

 private:
  BackendInfo info_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace qsakv
