// SPDX-License-Identifier: Apache-2.0
// SHA-256 through OpenSSL's EVP interface (no hand-written digest).
#pragma once

#include <cstddef>
#include <string>

namespace qsakv {

// Lower-case hex digest of `size` bytes.
std::string sha256_hex(const void* data, size_t size);
inline std::string sha256_hex(const std::string& bytes) {
  return sha256_hex(bytes.data(), bytes.size());
}

// True for 64 lower-case hex digits, the only spelling manifests use.
bool is_sha256_hex(const std::string& s);

}  // namespace qsakv
