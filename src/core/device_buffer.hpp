// SPDX-License-Identifier: Apache-2.0
// RAII owners of backend memory: a handle is either fully built or owns nothing.
#pragma once

#include <cstddef>
#include <utility>

#include "core/backend.hpp"

namespace qsakv {

// kHost: pinned host staging memory (alloc_host/release_host); else device memory.
template <bool kHost>
class BackendBuffer {
 public:
  BackendBuffer() = default;
  BackendBuffer(Backend* backend, size_t bytes) : backend_(backend), bytes_(bytes) {
    if (bytes) ptr_ = kHost ? backend->alloc_host(bytes) : backend->alloc(bytes);
  }
  BackendBuffer(BackendBuffer&& o) noexcept { swap(o); }
  BackendBuffer& operator=(BackendBuffer&& o) noexcept {
    BackendBuffer(std::move(o)).swap(*this);
    return *this;
  }
  BackendBuffer(const BackendBuffer&) = delete;
  BackendBuffer& operator=(const BackendBuffer&) = delete;
  ~BackendBuffer() {
    if (!ptr_) return;
    if (kHost)
      backend_->release_host(ptr_);
    else
      backend_->release(ptr_);
  }
  void* get() const { return ptr_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void swap(BackendBuffer& o) noexcept {
    std::swap(backend_, o.backend_);
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
  }
  Backend* backend_ = nullptr;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

using DeviceBuffer = BackendBuffer<false>;
using HostBuffer = BackendBuffer<true>;

}  // namespace qsakv
