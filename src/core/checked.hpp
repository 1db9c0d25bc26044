// SPDX-License-Identifier: Apache-2.0
// Integer discipline for values that come from callers and files: enums read as the
// int32 the header promises, and 64-bit arithmetic that refuses instead of wrapping.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/error.hpp"

namespace qsakv {

// No device or host buffer holds more bytes than this; every size and byte offset the
// library computes from caller values is kept below it, so that it stays far from
// int64/size_t overflow (and from allocation sizes that sanitizers treat as bugs).
constexpr uint64_t kMaxBufferBytes = uint64_t{1} << 48;

// The header promises that any int32 is a valid value of a public enum type, but in C++
// loading an enum object whose value lies outside the enumerators' range is undefined.
// So every enum that comes from a caller (a parameter or a struct field) is read through
// this: a byte copy into an int32, range-checked by the caller before any conversion.
template <class E>
int32_t enum_value(const E& e) {
  static_assert(std::is_enum<E>::value && sizeof(E) == sizeof(int32_t), "public enums are 32-bit");
  int32_t v;
  std::memcpy(&v, &e, sizeof v);
  return v;
}

// a + b, or false when the sum does not fit in 64 bits.
inline bool add_u64(uint64_t a, uint64_t b, uint64_t* out) {
  return !__builtin_add_overflow(a, b, out);
}

// a * b, or false when the product does not fit in 64 bits.
inline bool mul_u64(uint64_t a, uint64_t b, uint64_t* out) {
  return !__builtin_mul_overflow(a, b, out);
}

// count * per (both >= 0) as bytes, refusing (INVALID_ARGUMENT, naming `what`) a product
// beyond kMaxBufferBytes. Returns the product.
inline uint64_t require_bytes(const char* what, int64_t count, uint64_t per) {
  uint64_t r = 0;
  if (count < 0 || !mul_u64(static_cast<uint64_t>(count), per, &r) || r > kMaxBufferBytes)
    fail(QSAKV_ERROR_INVALID_ARGUMENT,
         "%s is %lld; at %llu bytes each that is more than any "
         "buffer holds (at most %llu)",
         what, static_cast<long long>(count), static_cast<unsigned long long>(per),
         static_cast<unsigned long long>(per ? kMaxBufferBytes / per : 0));
  return r;
}

}  // namespace qsakv
