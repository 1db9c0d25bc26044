// SPDX-License-Identifier: Apache-2.0
// The public header's versioned structs (struct_size and version first) as the library
// makes the ones it fills: zeroed, padding included, with both header fields set.
#pragma once

#include <cstdint>
#include <cstring>

namespace qsakv {

template <class T>
T blank_versioned(uint32_t version) {
  T s;
  std::memset(static_cast<void*>(&s), 0, sizeof s);
  s.struct_size = sizeof s;
  s.version = version;
  return s;
}

}  // namespace qsakv
