// SPDX-License-Identifier: Apache-2.0
#include "core/format/sha256.hpp"

#include <openssl/evp.h>

#include "core/error.hpp"

namespace qsakv {

std::string sha256_hex(const void* data, size_t size) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_Digest(data, size, md, &len, EVP_sha256(), nullptr) != 1 || len != 32)
    fail(QSAKV_ERROR_INTERNAL, "OpenSSL EVP_Digest(SHA-256) failed");
  static const char hex[] = "0123456789abcdef";
  std::string out(64, '0');
  for (unsigned i = 0; i < 32; ++i) {
    out[2 * i] = hex[md[i] >> 4];
    out[2 * i + 1] = hex[md[i] & 15];
  }
  return out;
}

bool is_sha256_hex(const std::string& s) {
  if (s.size() != 64) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

}  // namespace qsakv
