// SPDX-License-Identifier: Apache-2.0
// Built instead of the CUDA backend when the library is configured without CUDA.
#include "core/backend.hpp"

namespace qsakv {
std::unique_ptr<Backend> make_cuda_backend(int, qsakv_decoder, const KernelHooks&,
                                           std::string* why) {
  *why = "this libqsakv was built without the CUDA backend (QSAKV_WITH_CUDA=OFF)";
  return nullptr;
}
}  // namespace qsakv
